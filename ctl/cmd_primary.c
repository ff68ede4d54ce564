/* sdctl primary: which Big Brother holds the cluster's primary lease. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

SDCTL_CMD("primary", cmd_primary, "show the primary Big Brother (holder, epoch, lease left)");

static const char usage_text[] =
    "usage: sdctl primary\n"
    "  Shows the machine whose Big Brother holds the primary lease (it places services),\n"
    "  its EPOCH (grows with every change of holder; writes with an older one are refused)\n"
    "  and how long the lease has left. HOLDER is - when no Big Brother holds it.\n";

int cmd_primary(ctl_t *ctl, int argc, char **argv)
{
    int early = ctl_no_args(argc, argv, "primary", usage_text);
    if (early >= 0)
        return early;
    sdc_primary_t p;
    sdc_err_t err;
    int rc = sdc_primary_get(ctl->client, ctl->cluster, &p, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    if (ctl->json) {
        json_t *o = json_pack("{s:I, s:I}", "epoch", (json_int_t)p.epoch, "expires_in_ms",
                              (json_int_t)p.expires_in_ms);
        json_object_set_new(o, "holder", p.holder[0] ? json_string(p.holder) : json_null());
        ctl_print_json(o);
        json_decref(o);
        return CTL_EXIT_OK;
    }
    char epoch[24], left[32];
    snprintf(epoch, sizeof epoch, "%lld", (long long)p.epoch);
    ctl_table_t *t = ctl_table_new(3, "HOLDER", "EPOCH", "EXPIRES_IN");
    ctl_table_row(t, p.holder[0] ? p.holder : NULL, epoch,
                  p.holder[0] ? ctl_fmt_ms(p.expires_in_ms, left, sizeof left) : NULL);
    ctl_table_print(t, stdout, ctl->color);
    return CTL_EXIT_OK;
}
