/* sdctl ps: the process directory of the cluster. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "sdproto.h"
#include "sdutil.h"

SDCTL_CMD("ps", cmd_ps, "list processes (the live directory, or --state stopped)");

static const char usage_text[] =
    "usage: sdctl ps [--machine M] [--service S] [--state starting|ready|stopped] [INSTANCE]\n"
    "  Lists the processes of the cluster: by default the live directory (starting and\n"
    "  ready); --state stopped lists the recently stopped ones with their exit reason.\n"
    "  With INSTANCE, that one process record (exit code 4 when it is unknown).\n"
    "  AGE is the time since the process started (stopped: since it stopped); RESTARTS\n"
    "  how many times bigbrother restarted its slot after the process ended on its own\n"
    "  or was killed (not an operator's, the primary's or a session's planned restart;\n"
    "  the count bbctl status shows). Rows come in instance order, numbers by value\n"
    "  (zone-2 before zone-10); with --state stopped by the time they stopped, the\n"
    "  latest first. -o wide adds SLOT, GEN (the slot's run number: every start\n"
    "  counts), TO_READY (start to ready), the stop's DETAIL and the crash report's\n"
    "  LAST_OUTPUT line.\n";

/* One process as a row; with wide (-o wide) also SLOT, GEN, TO_READY (start to ready),
 * the stop's DETAIL and the crash report's last line. */
static void proc_row(ctl_table_t *t, const json_t *p, int64_t now, int wide)
{
    char inst[160], svc[160], mach[160], state[16], pid[24], restarts[24], ports[256], age[32];
    char reason[SD_REASON_TEXT_MAX], slot[24], gen[24], toready[32], last[300];
    const char *st = json_string_value(json_object_get(p, "state"));
    sd_reason_format_json(reason, sizeof reason, p);
    const json_t *since = json_object_get(p, st && !strcmp(st, "stopped") ? "stopped_at_ms"
                                                                           : "started_at_ms");
    const char *cells[14] = {
        ctl_jstr(json_object_get(p, "instance"), inst, sizeof inst),
        ctl_jstr(json_object_get(p, "service"), svc, sizeof svc),
        ctl_jstr(json_object_get(p, "machine"), mach, sizeof mach),
        ctl_jstr(json_object_get(p, "state"), state, sizeof state),
        ctl_jstr(json_object_get(p, "pid"), pid, sizeof pid),
        ctl_restarts(p, restarts, sizeof restarts),
        ctl_kv_text(json_object_get(p, "ports"), ports, sizeof ports),
        json_is_integer(since) ? ctl_fmt_ms(now - json_integer_value(since), age, sizeof age)
                               : NULL,
        reason};
    if (!wide) {
        ctl_table_row(t, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6],
                      cells[7], cells[8]);
        return;
    }
    const json_t *s0 = json_object_get(p, "started_at_ms"), *r0 = json_object_get(p, "ready_at_ms");
    const char *tail = json_string_value(json_object_get(p, "log_tail"));
    const char *nl = tail ? strrchr(tail, '\n') : NULL;
    snprintf(last, sizeof last, "%s", nl ? nl + 1 : tail ? tail : "");
    cells[9] = ctl_jstr(json_object_get(p, "slot"), slot, sizeof slot);
    cells[10] = ctl_jstr(json_object_get(p, "generation"), gen, sizeof gen);
    cells[11] = json_is_integer(s0) && json_is_integer(r0)
                    ? ctl_fmt_ms(json_integer_value(r0) - json_integer_value(s0), toready,
                                 sizeof toready)
                    : NULL;
    cells[12] = json_string_value(json_object_get(p, "detail"));
    cells[13] = last[0] ? last : NULL;
    ctl_table_row(t, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6],
                  cells[7], cells[8], cells[9], cells[10], cells[11], cells[12], cells[13]);
}

int cmd_ps(ctl_t *ctl, int argc, char **argv)
{
    sdc_proc_filter_t f = {0};
    const char *one = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--machine") ? &f.machine
                         : !strcmp(a, "--service") ? &f.service
                         : !strcmp(a, "--state") ? &f.state : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return CTL_EXIT_OK;
        } else if (dst) {
            if (i + 1 >= argc)
                return ctl_usage("ps", "%s needs a value", a);
            *dst = argv[++i];
        } else if (a[0] == '-' || one) {
            return ctl_usage("ps", "unexpected argument '%s'", a);
        } else {
            one = a;
        }
    }
    if (f.state && strcmp(f.state, "starting") && strcmp(f.state, "ready") &&
        strcmp(f.state, "stopped"))
        return ctl_usage("ps", "--state takes starting, ready or stopped");
    if (one && (f.machine || f.service || f.state))
        return ctl_usage("ps", "INSTANCE does not combine with filters");

    json_t *ans = NULL;
    sdc_err_t err;
    int rc = one ? sdc_process_get(ctl->client, ctl->cluster, one, &ans, &err)
                 : sdc_processes_list(ctl->client, ctl->cluster, &f, &ans, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    if (!one && !json_array_size(json_object_get(ans, "processes")) && ctl_cluster_unknown(ctl)) {
        json_decref(ans);
        return CTL_EXIT_NOT_FOUND;
    }
    if (!one && f.state && !strcmp(f.state, "stopped")) /* the latest stop first */
        ctl_sort_newest(json_object_get(ans, "processes"), "stopped_at_ms");
    else if (!one) /* zone-m1-2 before zone-m1-10 */
        ctl_sort_natural(json_object_get(ans, "processes"), "instance");
    if (ctl->json) {
        ctl_print_json(ans);
    } else {
        int64_t now = sd_wall_ms();
        ctl_table_t *t = ctl->wide
                             ? ctl_table_new(14, "INSTANCE", "SERVICE", "MACHINE", "STATE", "PID",
                                             "RESTARTS", "PORTS", "AGE", "REASON", "SLOT", "GEN",
                                             "TO_READY", "DETAIL", "LAST_OUTPUT")
                             : ctl_table_new(9, "INSTANCE", "SERVICE", "MACHINE", "STATE", "PID",
                                             "RESTARTS", "PORTS", "AGE", "REASON");
        if (one) {
            proc_row(t, ans, now, ctl->wide);
        } else {
            size_t i;
            const json_t *p;
            json_array_foreach(json_object_get(ans, "processes"), i, p)
                proc_row(t, p, now, ctl->wide);
        }
        ctl_table_print(t, stdout, ctl->color);
        if (json_is_true(json_object_get(ans, "truncated")))
            fprintf(stderr, "sdctl: showing %zu of %lld processes\n",
                    json_array_size(json_object_get(ans, "processes")),
                    (long long)json_integer_value(json_object_get(ans, "total")));
    }
    json_decref(ans);
    return CTL_EXIT_OK;
}
