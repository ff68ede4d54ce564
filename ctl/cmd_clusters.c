/* sdctl clusters: the clusters ServerDir knows (those that have had a machine lease). */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

SDCTL_CMD("clusters", cmd_clusters, "list the clusters ServerDir knows (with a machine lease)");

static const char usage_text[] =
    "usage: sdctl clusters\n"
    "  Lists the clusters that have had a machine lease, by name (a token bound to one\n"
    "  cluster sees that one). The current one (--cluster, SERVERDIR_CLUSTER) is marked *.\n";

static void clusters_print(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    (void)arg;
    ctl_table_t *t = ctl_table_new(2, "CLUSTER", "CURRENT");
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(ans, "clusters"), i, c)
        ctl_table_row(t, json_string_value(c),
                      !strcmp(json_string_value(c), ctl->cluster) ? "*" : "");
    ctl_table_print(t, stdout, ctl->color);
}

int cmd_clusters(ctl_t *ctl, int argc, char **argv)
{
    int early = ctl_no_args(argc, argv, "clusters", usage_text);
    if (early >= 0)
        return early;
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_request(ctl->client, "GET", "/v1/clusters", NULL, &ans, &err);
    return ctl_answer(ctl, rc, &err, ans, clusters_print, NULL);
}

int ctl_cluster_unknown(const ctl_t *ctl)
{
    json_t *ans = NULL;
    sdc_err_t err;
    if (sdc_request(ctl->client, "GET", "/v1/clusters", NULL, &ans, &err) != SDC_OK) {
        sdc_err_clear(&err);
        return 0; /* cannot tell: say nothing */
    }
    const json_t *list = json_object_get(ans, "clusters");
    size_t i;
    const json_t *c;
    int known = 0;
    json_array_foreach(list, i, c)
        known |= !strcmp(json_string_value(c), ctl->cluster);
    if (!known) {
        fprintf(stderr, "sdctl: cluster '%s' is unknown to ServerDir (no machine ever leased in it)",
                ctl->cluster);
        if (json_array_size(list)) {
            fprintf(stderr, "; known:");
            json_array_foreach(list, i, c) {
                if (i == 10) {
                    fprintf(stderr, " ... (sdctl clusters)");
                    break;
                }
                fprintf(stderr, " %s", json_string_value(c));
            }
        }
        fprintf(stderr, "\n");
    }
    json_decref(ans);
    return !known;
}
