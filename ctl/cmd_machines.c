/* sdctl machines: the machines of the cluster and their leases. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "sdutil.h"

SDCTL_CMD("machines", cmd_machines, "list machines and their leases (live or lost)");

static const char usage_text[] =
    "usage: sdctl machines [MACHINE]\n"
    "  Lists the machines of the cluster with their lease: STATE is live while the\n"
    "  machine's Big Brother renews its lease, lost (\"lost 3m ago\": since the lease ran\n"
    "  out) after it ran out. With MACHINE, only\n"
    "  that machine (exit code 4 when it is unknown). -o json prints the API answer.\n";

static void machine_row(ctl_table_t *t, const json_t *m, int64_t now)
{
    char name[160], state[48], addr[300], capa[24], ver[80], exp[32], age[32], lab[512];
    const json_t *reg = json_object_get(m, "registered_at_ms");
    const json_t *left = json_object_get(m, "expires_in_ms");
    const json_t *renewed = json_object_get(m, "renewed_at_ms"), *ttl = json_object_get(m, "ttl_ms");
    ctl_jstr(json_object_get(m, "state"), state, sizeof state);
    if (!strcmp(state, "lost") && json_is_integer(renewed) && json_is_integer(ttl)) {
        /* "lost 3m ago": since the lease ran out */
        char ago[32];
        snprintf(state, sizeof state, "lost %s ago",
                 ctl_fmt_ms(now - json_integer_value(renewed) - json_integer_value(ttl), ago,
                            sizeof ago));
    }
    ctl_table_row(t, ctl_jstr(json_object_get(m, "machine"), name, sizeof name), state,
                  ctl_jstr(json_object_get(m, "address"), addr, sizeof addr),
                  ctl_jstr(json_object_get(m, "capacity"), capa, sizeof capa),
                  ctl_jstr(json_object_get(m, "version"), ver, sizeof ver),
                  json_is_integer(left) ? ctl_fmt_ms(json_integer_value(left), exp, sizeof exp) : NULL,
                  json_is_integer(reg) ? ctl_fmt_ms(now - json_integer_value(reg), age, sizeof age) : NULL,
                  ctl_kv_text(json_object_get(m, "labels"), lab, sizeof lab));
}

int cmd_machines(ctl_t *ctl, int argc, char **argv)
{
    const char *one = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return CTL_EXIT_OK;
        }
        if (argv[i][0] == '-' || one)
            return ctl_usage("machines", "unexpected argument '%s'", argv[i]);
        one = argv[i];
    }
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = one ? sdc_machine_get(ctl->client, ctl->cluster, one, &ans, &err)
                 : sdc_machines_list(ctl->client, ctl->cluster, &ans, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    if (!one && !json_array_size(json_object_get(ans, "machines")) && ctl_cluster_unknown(ctl)) {
        json_decref(ans);
        return CTL_EXIT_NOT_FOUND;
    }
    if (ctl->json) {
        ctl_print_json(ans);
    } else {
        int64_t now = sd_wall_ms();
        ctl_table_t *t = ctl_table_new(8, "MACHINE", "STATE", "ADDRESS", "CAPACITY", "VERSION",
                                       "EXPIRES_IN", "AGE", "LABELS");
        if (one) {
            machine_row(t, ans, now);
        } else {
            size_t i;
            const json_t *m;
            json_array_foreach(json_object_get(ans, "machines"), i, m)
                machine_row(t, m, now);
        }
        ctl_table_print(t, stdout, ctl->color);
    }
    json_decref(ans);
    return CTL_EXIT_OK;
}
