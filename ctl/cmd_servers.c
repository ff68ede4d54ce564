/* sdctl servers: the public master list, filtered, one batch or all of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

SDCTL_CMD("servers", cmd_servers, "list public game servers from the master list");

#define WALK_MAX_BATCHES 100000

static void help(void)
{
    printf("usage: sdctl servers [--game G] [--map M] [--not-empty] [--not-full] [--no-password]\n"
           "                     [--region R] [--tags t1,t2] [--limit N] [--all]\n\n"
           "Lists servers of the master list. Without --all prints one batch of at most N\n"
           "servers (default 100) and the cursor of the next one; with --all walks every batch.\n");
}

static void add_rows(ctl_table_t *t, json_t *servers)
{
    size_t i;
    json_t *s;
    json_array_foreach(servers, i, s) {
        char pl[32], b[5][128];
        snprintf(pl, sizeof pl, "%s/%s", ctl_jstr(json_object_get(s, "players"), b[0], sizeof b[0]),
                 ctl_jstr(json_object_get(s, "max_players"), b[1], sizeof b[1]));
        ctl_table_row(t, json_string_value(json_object_get(s, "address")),
                      ctl_jstr(json_object_get(s, "game"), b[2], sizeof b[2]),
                      ctl_jstr(json_object_get(s, "map"), b[3], sizeof b[3]), pl,
                      ctl_jstr(json_object_get(s, "region"), b[4], sizeof b[4]),
                      json_string_value(json_object_get(s, "name")),
                      json_string_value(json_object_get(s, "source")));
    }
}

int cmd_servers(ctl_t *ctl, int argc, char **argv)
{
    sdc_master_filter_t f = {0};
    int limit = 100, all = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            help();
            return CTL_EXIT_OK;
        } else if (!strcmp(a, "--not-empty")) {
            f.not_empty = 1;
        } else if (!strcmp(a, "--not-full")) {
            f.not_full = 1;
        } else if (!strcmp(a, "--no-password")) {
            f.no_password = 1;
        } else if (!strcmp(a, "--all")) {
            all = 1;
        } else if (v && !strcmp(a, "--game")) {
            f.game = argv[++i];
        } else if (v && !strcmp(a, "--map")) {
            f.map = argv[++i];
        } else if (v && !strcmp(a, "--region")) {
            f.region = argv[++i];
        } else if (v && !strcmp(a, "--tags")) {
            f.tags = argv[++i];
        } else if (v && !strcmp(a, "--limit")) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 10000)
                return ctl_usage("servers", "--limit must be 1-10000");
            limit = (int)n;
        } else {
            return ctl_usage("servers", "unknown argument '%s'", a);
        }
    }

    json_t *collected = json_array();
    char after[128] = "", next[128] = "";
    int rc = SDC_OK;
    sdc_err_t err = {0};
    for (int batch = 0; batch < WALK_MAX_BATCHES; batch++) {
        json_t *servers = NULL;
        rc = sdc_master_query(ctl->client, &f, after, limit, &servers, next, sizeof next, &err);
        if (rc)
            break;
        json_array_extend(collected, servers);
        json_decref(servers);
        if (!all || !next[0])
            break;
        snprintf(after, sizeof after, "%s", next);
    }
    if (rc) {
        json_decref(collected);
        return ctl_fail_clear(rc, &err);
    }
    if (ctl->json) {
        json_t *o = json_pack("{s:O, s:s?}", "servers", collected, "next", all || !next[0] ? NULL : next);
        ctl_print_json(o);
        json_decref(o);
    } else {
        ctl_table_t *t = ctl_table_new(7, "ADDRESS", "GAME", "MAP", "PLAYERS", "REGION", "NAME", "SOURCE");
        add_rows(t, collected);
        ctl_table_print(t, stdout, ctl->color);
        if (!all && next[0])
            printf("more: sdctl servers ... (next batch after %s; --all walks them all)\n", next);
    }
    json_decref(collected);
    return CTL_EXIT_OK;
}
