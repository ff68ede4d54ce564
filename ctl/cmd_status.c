/* sdctl status: one screen on the cluster: the primary, the machines (lease, draining,
 * which one is primary, instances), the services (desired vs running vs ready) and the
 * recent failures from the event history. Four reads, all through libsdclient. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "sdproto.h"
#include "sdutil.h"

SDCTL_CMD("status", cmd_status, "one screen: primary, machines, services desired/running/ready, failures");

#define FAILURES_SHOWN 10
#define HISTORY_READ 500

static const char usage_text[] =
    "usage: sdctl status\n"
    "  The primary Big Brother and its epoch; whether the realm is stopped; each machine\n"
    "  with its lease, DRAINING flag, a * for the primary and its live instances; each\n"
    "  service with the DESIRED count (0 while stopped), RUNNING (starting or ready) and\n"
    "  READY instances from the directory (a static service, run by the machines'\n"
    "  bigbrother configs, shows DESIRED - and STATE static); the recent failures: how\n"
    "  many of the newest 500 events of the history are stops serverdir marks `failure`\n"
    "  (exits, kills, hangs, start timeouts, crash loops, lost machines; not operator\n"
    "  stops, drains, replacements, orphans), the newest 10 listed. A service with a warm\n"
    "  pool shows DESIRED pool (the primary sizes it; STATE ok when every instance is\n"
    "  ready) and a POOL column its ready unallocated and allocated instances.\n"
    "  -o json prints the same as one object.\n";

/* Counts of live processes by `key` ("service" or "machine"): {name: {running, ready}}. */
static json_t *count_by(const json_t *procs, const char *key)
{
    json_t *out = json_object();
    size_t i;
    const json_t *p;
    json_array_foreach(procs, i, p) {
        const char *k = json_string_value(json_object_get(p, key));
        if (!k)
            continue;
        json_t *c = json_object_get(out, k);
        if (!c) {
            c = json_pack("{s:i, s:i}", "running", 0, "ready", 0);
            json_object_set_new(out, k, c);
        }
        json_object_set_new(c, "running",
                            json_integer(json_integer_value(json_object_get(c, "running")) + 1));
        const char *st = json_string_value(json_object_get(p, "state"));
        if (st && !strcmp(st, "ready"))
            json_object_set_new(c, "ready",
                                json_integer(json_integer_value(json_object_get(c, "ready")) + 1));
    }
    return out;
}

static long long cnt(const json_t *counts, const char *name, const char *field)
{
    return (long long)json_integer_value(json_object_get(json_object_get(counts, name), field));
}

/* Builds the status object from the four answers. */
static json_t *status_build(ctl_t *ctl, const json_t *state, const sdc_primary_t *p,
                            const json_t *procs, const json_t *history)
{
    json_t *by_svc = count_by(procs, "service"), *by_m = count_by(procs, "machine");
    json_t *machines = json_array(), *services = json_array(), *failures = json_array();
    size_t i;
    const json_t *x;
    json_array_foreach(json_object_get(state, "machines"), i, x) {
        const char *m = json_string_value(json_object_get(x, "machine"));
        json_array_append_new(
            machines,
            json_pack("{s:s, s:O, s:b, s:b, s:O, s:I}", "machine", m ? m : "?", "state",
                      json_object_get(x, "state"), "draining",
                      json_is_true(json_object_get(x, "draining")), "primary",
                      m && !strcmp(m, p->holder), "expires_in_ms",
                      json_object_get(x, "expires_in_ms"), "instances",
                      (json_int_t)cnt(by_m, m ? m : "", "running")));
    }
    int stopped_realm = json_is_true(json_object_get(state, "cluster_stopped"));
    json_array_foreach(json_object_get(state, "services"), i, x) {
        const char *s = json_string_value(json_object_get(x, "service"));
        int stopped = json_is_true(json_object_get(x, "stopped"));
        json_int_t want = json_integer_value(json_object_get(json_object_get(x, "spec"), "count"));
        json_t *svc = json_pack("{s:s, s:I, s:I, s:I, s:I, s:b}", "service", s ? s : "?",
                                "count", want, "desired",
                                (json_int_t)(stopped || stopped_realm ? 0 : want), "running",
                                (json_int_t)cnt(by_svc, s ? s : "", "running"), "ready",
                                (json_int_t)cnt(by_svc, s ? s : "", "ready"), "stopped",
                                stopped);
        /* a warm pool: the primary sizes it (no count of its own), so no desired figure */
        const json_t *pool = json_object_get(x, "pool");
        if (json_is_object(json_object_get(json_object_get(x, "spec"), "pool"))) {
            json_object_set_new(svc, "count", json_null());
            if (!stopped && !stopped_realm)
                json_object_set_new(svc, "desired", json_null());
            json_object_set_new(svc, "pool",
                                json_pack("{s:I, s:I}", "ready_free",
                                          json_integer_value(json_object_get(pool, "ready_free")),
                                          "allocated",
                                          json_integer_value(json_object_get(pool, "allocated"))));
        }
        json_array_append_new(services, svc);
    }
    /* static services (from the machines' bigbrother configs): no desired count, only
     * what runs */
    const char *name;
    const json_t *counts;
    json_object_foreach((json_t *)by_svc, name, counts) {
        int desired = 0;
        json_array_foreach(json_object_get(state, "services"), i, x)
            desired |= !strcmp(json_string_value(json_object_get(x, "service")) ?: "", name);
        if (!desired)
            json_array_append_new(
                services, json_pack("{s:s, s:n, s:n, s:I, s:I, s:b, s:b}", "service", name,
                                    "count", "desired", "running",
                                    (json_int_t)cnt(by_svc, name, "running"), "ready",
                                    (json_int_t)cnt(by_svc, name, "ready"), "stopped", 0,
                                    "static", 1));
    }
    /* recent failures: the stops serverdir marks `failure` (the event's field, the
     * classification the dashboard shows too) among the newest HISTORY_READ events, the
     * newest FAILURES_SHOWN of them listed */
    const json_t *events = json_object_get(history, "events");
    json_int_t nfail = 0;
    for (size_t n = json_array_size(events); n > 0; n--) {
        const json_t *e = json_array_get(events, n - 1);
        if (!json_is_true(json_object_get(e, "failure")))
            continue;
        if (nfail++ < FAILURES_SHOWN)
            json_array_insert(failures, 0, (json_t *)e);
    }
    json_t *prim = json_pack("{s:I, s:I}", "epoch", (json_int_t)p->epoch, "expires_in_ms",
                             (json_int_t)p->expires_in_ms);
    json_object_set_new(prim, "holder", p->holder[0] ? json_string(p->holder) : json_null());
    json_decref(by_svc);
    json_decref(by_m);
    return json_pack("{s:s, s:o, s:b, s:o, s:o, s:I, s:o}", "cluster", ctl->cluster, "primary",
                     prim, "cluster_stopped", stopped_realm, "machines", machines, "services",
                     services, "recent_failures", nfail, "failures", failures);
}

static void status_print(ctl_t *ctl, const json_t *st)
{
    const json_t *prim = json_object_get(st, "primary");
    const char *holder = json_string_value(json_object_get(prim, "holder"));
    char left[32], a[32], b[32], c[32], d[32];
    if (holder)
        printf("cluster %s   primary %s (epoch %lld, lease %s left)   realm %s\n\n", ctl->cluster,
               holder, (long long)json_integer_value(json_object_get(prim, "epoch")),
               ctl_fmt_ms(json_integer_value(json_object_get(prim, "expires_in_ms")), left,
                          sizeof left),
               json_is_true(json_object_get(st, "cluster_stopped")) ? "STOPPED" : "running");
    else
        printf("cluster %s   primary: none   realm %s\n\n", ctl->cluster,
               json_is_true(json_object_get(st, "cluster_stopped")) ? "STOPPED" : "running");
    ctl_table_t *t = ctl_table_new(6, "MACHINE", "STATE", "DRAINING", "PRIMARY", "EXPIRES_IN",
                                   "INSTANCES");
    size_t i;
    const json_t *x;
    json_array_foreach(json_object_get(st, "machines"), i, x) {
        char name[160], state[16];
        ctl_table_row(t, ctl_jstr(json_object_get(x, "machine"), name, sizeof name),
                      ctl_jstr(json_object_get(x, "state"), state, sizeof state),
                      json_is_true(json_object_get(x, "draining")) ? "yes" : "no",
                      json_is_true(json_object_get(x, "primary")) ? "*" : "",
                      ctl_fmt_ms(json_integer_value(json_object_get(x, "expires_in_ms")), a,
                                 sizeof a),
                      ctl_jstr(json_object_get(x, "instances"), b, sizeof b));
    }
    ctl_table_print(t, stdout, ctl->color);
    printf("\n");
    /* a POOL column when a service has a warm pool */
    int pooled = 0;
    json_array_foreach(json_object_get(st, "services"), i, x)
        pooled |= json_object_get(x, "pool") != NULL;
    static const char *const cols[] = {"SERVICE", "DESIRED", "RUNNING", "READY", "STATE", "POOL"};
    t = ctl_table_newv(pooled ? 6 : 5, cols);
    json_array_foreach(json_object_get(st, "services"), i, x) {
        char name[160], pool[64] = "";
        const json_t *p = json_object_get(x, "pool");
        long long want = json_integer_value(json_object_get(x, "desired"));
        long long ready = json_integer_value(json_object_get(x, "ready"));
        long long running = json_integer_value(json_object_get(x, "running"));
        if (p)
            snprintf(pool, sizeof pool, "%lld free / %lld alloc",
                     (long long)json_integer_value(json_object_get(p, "ready_free")),
                     (long long)json_integer_value(json_object_get(p, "allocated")));
        const char *row[] = {
            ctl_jstr(json_object_get(x, "service"), name, sizeof name),
            p && json_is_null(json_object_get(x, "desired"))
                ? "pool" : ctl_jstr(json_object_get(x, "desired"), a, sizeof a),
            ctl_jstr(json_object_get(x, "running"), b, sizeof b),
            ctl_jstr(json_object_get(x, "ready"), c, sizeof c),
            json_is_true(json_object_get(x, "static"))    ? "static"
            : json_is_true(json_object_get(x, "stopped")) ? "stopped"
            : (p ? ready == running : ready == want)     ? "ok"
                                                         : "converging",
            pool};
        ctl_table_rowv(t, row);
    }
    ctl_table_print(t, stdout, ctl->color);
    const json_t *failures = json_object_get(st, "failures");
    long long nfail = (long long)json_integer_value(json_object_get(st, "recent_failures"));
    if (nfail)
        printf("\nrecent failures: %lld in the last %d events%s\n", nfail, HISTORY_READ,
               nfail > FAILURES_SHOWN ? ", the newest shown" : "");
    else
        printf("\nrecent failures: none\n");
    if (!json_array_size(failures))
        return;
    int64_t now = sd_wall_ms();
    t = ctl_table_new(5, "AGE", "INSTANCE", "MACHINE", "REASON", "DETAIL");
    json_array_foreach(failures, i, x) {
        char inst[160], m[160], reason[SD_REASON_TEXT_MAX], det[300];
        const json_t *ts = json_object_get(x, "ts_ms");
        sd_reason_format_json(reason, sizeof reason, x);
        ctl_table_row(t, json_is_integer(ts) ? ctl_fmt_ms(now - json_integer_value(ts), d, sizeof d)
                                             : NULL,
                      ctl_jstr(json_object_get(x, "instance"), inst, sizeof inst),
                      ctl_jstr(json_object_get(x, "machine"), m, sizeof m),
                      reason,
                      ctl_jstr(json_object_get(x, "detail"), det, sizeof det));
    }
    ctl_table_print(t, stdout, ctl->color);
}

int cmd_status(ctl_t *ctl, int argc, char **argv)
{
    int early = ctl_no_args(argc, argv, "status", usage_text);
    if (early >= 0)
        return early;
    json_t *state = NULL, *procs = NULL, *history = NULL;
    sdc_primary_t p;
    sdc_err_t err;
    int rc = sdc_state_get(ctl->client, ctl->cluster, &state, &err);
    if (rc == SDC_OK)
        rc = sdc_primary_get(ctl->client, ctl->cluster, &p, &err);
    if (rc == SDC_OK)
        rc = sdc_processes_list(ctl->client, ctl->cluster, NULL, &procs, &err);
    if (rc == SDC_OK)
        rc = sdc_events_list(ctl->client, ctl->cluster, NULL, HISTORY_READ, &history, &err);
    if (rc == SDC_OK && !json_array_size(json_object_get(procs, "processes")) &&
        !json_array_size(json_object_get(state, "machines")) &&
        !json_array_size(json_object_get(state, "services")) && ctl_cluster_unknown(ctl)) {
        json_decref(state);
        json_decref(procs);
        json_decref(history);
        return CTL_EXIT_NOT_FOUND;
    }
    if (rc == SDC_OK) {
        json_t *st = status_build(ctl, state, &p, json_object_get(procs, "processes"), history);
        if (ctl->json)
            ctl_print_json(st);
        else
            status_print(ctl, st);
        json_decref(st);
    } else {
        rc = ctl_fail_clear(rc, &err);
    }
    json_decref(state);
    json_decref(procs);
    json_decref(history);
    return rc;
}
