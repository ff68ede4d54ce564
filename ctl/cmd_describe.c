/* sdctl describe: one instance, service or machine with what is known about it, on one
 * screen (kubectl describe): the record, its timeline, the stop reason, the locks an
 * instance holds, its master-list entry; a service's or machine's instances. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "sdproto.h"
#include "sdtime.h"
#include "sdutil.h"

SDCTL_CMD("describe", cmd_describe, "one instance, service or machine: record, timeline, locks");

static const char usage_text[] =
    "usage: sdctl describe [instance|service|machine] NAME\n"
    "  Shows everything ServerDir knows about one object of the cluster. Without a kind,\n"
    "  NAME is looked up as an instance, then a service, then a machine.\n"
    "  instance: its record (state, machine, pid, ports, restarts and generation), its\n"
    "    timeline (started, ready, stopped with the reason and, after a crash, a hang or\n"
    "    a kill, the crash report: its last lines of output and where a core dump went),\n"
    "    the locks it holds and its master-list entry (when its heartbeats name it).\n"
    "  service:  its desired spec and its instances, live and recently stopped.\n"
    "  machine:  its lease, address, labels and the instances it runs.\n"
    "  -o json prints {kind, ...} with the raw answers. Exit code 4 when nothing has that\n"
    "  name.\n";

enum { K_ANY, K_INSTANCE, K_SERVICE, K_MACHINE };

/* "2026-11-27T00:19:14.123Z (5m ago)" for an epoch-ms timestamp, or NULL. */
static const char *when(const json_t *v, int64_t now, char *buf, size_t cap)
{
    if (!json_is_integer(v))
        return NULL;
    long long ms = json_integer_value(v);
    char ago[32], date[SD_TIME_ISO_LEN];
    snprintf(buf, cap, "%s (%s ago)", sd_time_iso(ms, date, sizeof date),
             ctl_fmt_ms(now - ms, ago, sizeof ago));
    return buf;
}

static void line(const char *label, const char *value)
{
    printf("%-14s%s\n", label, value && *value ? value : "-");
}

static const char *str_of(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The "Locks denied:" line of a stopped instance: how many lock acquires, renewals and
 * blob saves serverdir refused it since the directory recorded it stopped
 * (holder_stopped), and when the last was; a process still asking is one its machine did
 * not stop. */
static void refusals_line(const json_t *p, int64_t now)
{
    const json_t *n = json_object_get(p, "lock_refusals");
    char buf[128], at[96];
    if (!json_is_integer(n) || json_integer_value(n) == 0) {
        line("Locks denied:", "0");
        return;
    }
    const char *w = when(json_object_get(p, "lock_refused_at_ms"), now, at, sizeof at);
    snprintf(buf, sizeof buf, "%lld since the stop, the last %s",
             (long long)json_integer_value(n), w ? w : "-");
    line("Locks denied:", buf);
}

/* The instances of a filter (one page of at most 500) as a table. */
static void instances_table(const ctl_t *ctl, const json_t *live, const json_t *stopped,
                            int64_t now)
{
    ctl_table_t *t = ctl_table_new(7, "INSTANCE", "SERVICE", "MACHINE", "STATE", "RESTARTS",
                                   "AGE", "REASON");
    const json_t *lists[2] = {live, stopped};
    for (int k = 0; k < 2; k++) {
        size_t i;
        const json_t *p;
        json_array_foreach(json_object_get(lists[k], "processes"), i, p) {
            char restarts[24], age[32], reason[SD_REASON_TEXT_MAX];
            ctl_restarts(p, restarts, sizeof restarts);
            const char *st = str_of(p, "state");
            const json_t *since = json_object_get(p, !strcmp(st, "stopped") ? "stopped_at_ms"
                                                                            : "started_at_ms");
            sd_reason_format_json(reason, sizeof reason, p);
            ctl_table_row(t, str_of(p, "instance"), str_of(p, "service"), str_of(p, "machine"),
                          st, restarts,
                          json_is_integer(since)
                              ? ctl_fmt_ms(now - json_integer_value(since), age, sizeof age)
                              : NULL,
                          reason[0] ? reason : NULL);
        }
    }
    ctl_table_print(t, stdout, ctl->color);
}

static size_t to_buf(const char *data, size_t len, void *arg)
{
    sd_buf_t *b = arg;
    return sd_buf_append(b, data, len) ? 0 : len;
}

/* The live instance's health as its machine's bigbrother sees it (GET /v1/health/ID on
 * the logs port): the object, or NULL with why in why (no logs port, unreachable, ...). */
static json_t *instance_health(ctl_t *ctl, const json_t *p, char *why, size_t cap)
{
    char path[200], url[512];
    sdc_err_t err;
    snprintf(path, sizeof path, "/v1/health/%s", str_of(p, "instance"));
    int rc = ctl_bb_url(ctl, str_of(p, "machine"), path, url, sizeof url, &err);
    if (rc == 1) {
        snprintf(why, cap, "unknown (the machine serves no logs port)");
        return NULL;
    }
    sd_buf_t b;
    sd_buf_init(&b, 1 << 20);
    if (rc == SDC_OK)
        rc = sdc_stream(ctl->client, url, 3000, to_buf, &b, &err);
    json_t *h = NULL;
    if (rc == SDC_OK) {
        h = json_loadb(b.data ? b.data : "", b.len, 0, NULL);
        if (!h)
            snprintf(why, cap, "unknown (the machine's bigbrother answered no JSON)");
    } else {
        snprintf(why, cap, "unknown (the machine's bigbrother: %s)",
                 err.message[0] ? err.message : "no answer");
        sdc_err_clear(&err);
    }
    sd_buf_free(&b);
    return h;
}

/* "agent heartbeat 0.4s ago (deadline 8.0s), connected" / "http probe ok 1.2s ago,
 * failing 1/3 (4 this run; last: connection refused)". */
static const char *health_text(const json_t *h, char *buf, size_t cap)
{
    char age[32], lim[32];
    const char *check = str_of(h, "check");
    const json_t *a = json_object_get(h, "heartbeat_age_ms");
    const char *ago = json_is_integer(a) ? ctl_fmt_ms(json_integer_value(a), age, sizeof age)
                                         : NULL;
    if (!strcmp(check, "none")) {
        snprintf(buf, cap, "no check (health type none)");
    } else if (json_object_get(h, "liveness_timeout_ms")) {
        const json_t *c = json_object_get(h, "agent_connected");
        snprintf(buf, cap, "%s heartbeat %s%s (deadline %s)%s", check, ago ? ago : "-",
                 ago ? " ago" : "",
                 ctl_fmt_ms(json_integer_value(json_object_get(h, "liveness_timeout_ms")), lim,
                            sizeof lim),
                 !c ? "" : json_is_true(c) ? ", agent connected" : ", agent NOT connected");
    } else {
        const char *last = str_of(h, "last_probe_error");
        snprintf(buf, cap, "%s probe ok %s%s, failing %lld/%lld (%lld this run%s%s)", check,
                 ago ? ago : "-", ago ? " ago" : "",
                 (long long)json_integer_value(json_object_get(h, "probe_failures")),
                 (long long)json_integer_value(json_object_get(h, "failure_threshold")),
                 (long long)json_integer_value(json_object_get(h, "probe_failures_total")),
                 *last ? "; last: " : "", last);
    }
    return buf;
}

static int describe_instance(ctl_t *ctl, json_t *p)
{
    const char *inst = str_of(p, "instance");
    sdc_err_t err;
    json_t *locks = NULL, *master = NULL;
    int rc = sdc_lock_list_by_holder(ctl->client, inst, &locks, &err);
    if (rc != SDC_OK) {
        json_decref(p);
        return ctl_fail_clear(rc, &err);
    }
    const char *addr = json_string_value(json_object_get(p, "master_address"));
    if (addr) {
        char path[256], esc[200];
        snprintf(path, sizeof path, "/v1/master/servers/%s", sdc_escape(addr, esc, sizeof esc));
        rc = sdc_request(ctl->client, "GET", path, NULL, &master, &err);
        if (rc != SDC_OK) /* expired between the two reads: no entry */
            sdc_err_clear(&err);
    }
    char hwhy[300] = "";
    json_t *health = strcmp(str_of(p, "state"), "stopped") != 0
                         ? instance_health(ctl, p, hwhy, sizeof hwhy)
                         : NULL;
    if (ctl->json) {
        json_t *o = json_pack("{s:s, s:O, s:O, s:O, s:O}", "kind", "instance", "process", p,
                              "locks", json_object_get(locks, "locks"), "master",
                              master ? master : json_null(), "health",
                              health ? health : json_null());
        ctl_print_json(o);
        json_decref(o);
        json_decref(p);
        json_decref(locks);
        json_decref(master);
        json_decref(health);
        return CTL_EXIT_OK;
    }
    int64_t now = sd_wall_ms();
    char buf[512], t1[96];
    const char *st = str_of(p, "state");
    line("Instance:", inst);
    line("Cluster:", str_of(p, "cluster"));
    snprintf(buf, sizeof buf, "%s (slot %s)", str_of(p, "service"),
             ctl_jstr(json_object_get(p, "slot"), t1, sizeof t1));
    line("Service:", buf);
    line("Machine:", str_of(p, "machine"));
    const json_t *since = json_object_get(p, !strcmp(st, "stopped") ? "stopped_at_ms"
                                             : !strcmp(st, "ready") ? "ready_at_ms"
                                                                     : "started_at_ms");
    char age[32];
    snprintf(buf, sizeof buf, "%s%s%s%s", st, json_is_integer(since) ? " (for " : "",
             json_is_integer(since) ? ctl_fmt_ms(now - json_integer_value(since), age, sizeof age)
                                    : "",
             json_is_integer(since) ? ")" : "");
    line("State:", buf);
    line("PID:", ctl_jstr(json_object_get(p, "pid"), buf, sizeof buf));
    line("Ports:", ctl_kv_text(json_object_get(p, "ports"), buf, sizeof buf));
    line("Restarts:", ctl_restarts(p, buf, sizeof buf));
    line("Generation:", ctl_jstr(json_object_get(p, "generation"), buf, sizeof buf));
    if (health || hwhy[0])
        line("Health:", health ? health_text(health, buf, sizeof buf) : hwhy);
    if (health && json_is_integer(json_object_get(health, "max_players")))
        snprintf(buf, sizeof buf, "%lld / %lld",
                 (long long)json_integer_value(json_object_get(health, "players")),
                 (long long)json_integer_value(json_object_get(health, "max_players")));
    if (health && json_is_integer(json_object_get(health, "max_players")))
        line("Players:", buf);
    /* the game's STATUS= line: bigbrother's live view, else the last one it reported */
    const char *status = json_string_value(json_object_get(health, "status"));
    if (!status || !*status)
        status = json_string_value(json_object_get(p, "status"));
    if (status && *status)
        line("Status:", status);
    json_decref(health);
    printf("Timeline:\n");
    static const char *const steps[][2] = {{"started", "started_at_ms"},
                                           {"ready", "ready_at_ms"},
                                           {"stopped", "stopped_at_ms"}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const char *w = when(json_object_get(p, steps[i][1]), now, buf, sizeof buf);
        printf("  %-12s%s\n", steps[i][0], w ? w : "-");
    }
    if (!strcmp(st, "stopped")) {
        char reason[SD_REASON_TEXT_MAX];
        sd_reason_format_json(reason, sizeof reason, p);
        line("Reason:", reason);
        const char *detail = str_of(p, "detail");
        if (*detail)
            line("Detail:", detail);
        line("Locks freed:", ctl_jstr(json_object_get(p, "locks_released"), buf, sizeof buf));
        refusals_line(p, now);
        const char *core = str_of(p, "core"), *tail = str_of(p, "log_tail");
        if (*core)
            line("Core dump:", core);
        if (*tail) { /* the crash report: the run's last output, as bigbrother read it */
            printf("Last output:\n");
            for (const char *l = tail; *l;) {
                size_t n = strcspn(l, "\n");
                printf("  | %.*s\n", (int)n, l);
                l += n + (l[n] == '\n');
            }
        }
    }
    const json_t *ll = json_object_get(locks, "locks");
    printf("Locks held:   %zu\n", json_array_size(ll));
    if (json_array_size(ll)) {
        ctl_table_t *t = ctl_table_new(4, "  KEY", "LOCK_SEQ", "HELD_FOR", "EXPIRES_IN");
        size_t i;
        const json_t *l;
        json_array_foreach(ll, i, l) {
            char key[160], seq[24], held[32], exp[32];
            const json_t *sm = json_object_get(l, "since_ms"), *ex = json_object_get(l, "expires_in_ms");
            snprintf(key, sizeof key, "  %s", str_of(l, "key"));
            ctl_table_row(t, key, ctl_jstr(json_object_get(l, "lock_seq"), seq, sizeof seq),
                          json_is_integer(sm) ? ctl_fmt_ms(now - json_integer_value(sm), held, sizeof held)
                                              : NULL,
                          json_is_integer(ex) && json_integer_value(ex) >= 0
                              ? ctl_fmt_ms(json_integer_value(ex), exp, sizeof exp)
                              : "never");
        }
        ctl_table_print(t, stdout, ctl->color);
    }
    if (master) {
        char hb[32];
        const json_t *last = json_object_get(master, "last_heartbeat_ms");
        snprintf(buf, sizeof buf, "%s \"%s\" %s %lld/%lld players, heartbeat %s ago",
                 str_of(master, "address"), str_of(master, "name"), str_of(master, "map"),
                 (long long)json_integer_value(json_object_get(master, "players")),
                 (long long)json_integer_value(json_object_get(master, "max_players")),
                 json_is_integer(last) ? ctl_fmt_ms(now - json_integer_value(last), hb, sizeof hb)
                                       : "?");
        line("Master list:", buf);
    } else {
        line("Master list:", "not listed");
    }
    json_decref(p);
    json_decref(locks);
    json_decref(master);
    return CTL_EXIT_OK;
}

/* The live and the recently stopped instances of f (first page of each). */
static int instances_of(ctl_t *ctl, sdc_proc_filter_t f, json_t **live, json_t **stopped,
                        sdc_err_t *err)
{
    *live = *stopped = NULL;
    int rc = sdc_processes_page(ctl->client, ctl->cluster, &f, NULL, 500, live, err);
    if (rc != SDC_OK)
        return rc;
    ctl_sort_natural(json_object_get(*live, "processes"), "instance");
    f.state = "stopped";
    return sdc_processes_page(ctl->client, ctl->cluster, &f, NULL, 100, stopped, err);
}

static int describe_set(ctl_t *ctl, const char *kind, const char *name, json_t *rec)
{
    sdc_proc_filter_t f = {0};
    if (!strcmp(kind, "service"))
        f.service = name;
    else
        f.machine = name;
    json_t *live, *stopped;
    sdc_err_t err;
    int rc = instances_of(ctl, f, &live, &stopped, &err);
    if (rc != SDC_OK) {
        json_decref(rec);
        json_decref(live);
        return ctl_fail_clear(rc, &err);
    }
    if (ctl->json) {
        json_t *o = json_pack("{s:s, s:O, s:O, s:O}", "kind", kind, kind, rec, "instances",
                              json_object_get(live, "processes"), "stopped",
                              json_object_get(stopped, "processes"));
        ctl_print_json(o);
        json_decref(o);
    } else {
        int64_t now = sd_wall_ms();
        char buf[512];
        if (!strcmp(kind, "service") && json_is_true(json_object_get(rec, "static"))) {
            line("Service:", name);
            line("Cluster:", ctl->cluster);
            line("Desired:", "none: a static service (from its machines' bigbrother config)");
        } else if (!strcmp(kind, "service")) {
            line("Service:", name);
            line("Cluster:", ctl->cluster);
            json_t *spec = json_object_get(rec, "spec");
            if (!spec)
                spec = rec;
            char pool[64];
            if (ctl_pool_text(rec, pool, sizeof pool)) { /* the primary sizes a warm pool */
                char b[3][24];
                const json_t *p = json_object_get(spec, "pool");
                line("Count:", "pool (the primary sizes it)");
                snprintf(buf, sizeof buf, "%s (buffer %s, min %s, max %s)", pool,
                         ctl_jstr(json_object_get(p, "buffer"), b[0], sizeof b[0]),
                         json_object_get(p, "min")
                             ? ctl_jstr(json_object_get(p, "min"), b[1], sizeof b[1]) : "0",
                         json_object_get(p, "max")
                             ? ctl_jstr(json_object_get(p, "max"), b[2], sizeof b[2]) : "100000");
                line("Pool:", buf);
            } else {
                line("Count:", ctl_jstr(json_object_get(spec, "count"), buf, sizeof buf));
            }
            line("Version:", ctl_jstr(json_object_get(rec, "version"), buf, sizeof buf));
            line("Stopped:", json_is_true(json_object_get(rec, "stopped")) ? "yes" : "no");
            char *text = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS);
            line("Spec:", text);
            free(text);
        } else {
            line("Machine:", name);
            line("Cluster:", ctl->cluster);
            line("State:", str_of(rec, "state"));
            line("Address:", str_of(rec, "address"));
            line("Labels:", ctl_kv_text(json_object_get(rec, "labels"), buf, sizeof buf));
            const char *w = when(json_object_get(rec, "registered_at_ms"), now, buf, sizeof buf);
            line("Registered:", w);
            w = when(json_object_get(rec, "renewed_at_ms"), now, buf, sizeof buf);
            line("Renewed:", w);
            line("Draining:", json_is_true(json_object_get(rec, "draining")) ? "yes" : "no");
        }
        printf("Instances:    %zu live, %zu recently stopped\n",
               json_array_size(json_object_get(live, "processes")),
               json_array_size(json_object_get(stopped, "processes")));
        instances_table(ctl, live, stopped, now);
    }
    json_decref(rec);
    json_decref(live);
    json_decref(stopped);
    return CTL_EXIT_OK;
}

int cmd_describe(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, usage_text))
        return CTL_EXIT_OK;
    int kind = K_ANY;
    const char *name = NULL;
    if (argc == 3) {
        kind = !strcmp(argv[1], "instance") ? K_INSTANCE
             : !strcmp(argv[1], "service") ? K_SERVICE
             : !strcmp(argv[1], "machine") ? K_MACHINE : -1;
        if (kind < 0)
            return ctl_usage("describe", "unknown kind '%s' (instance, service or machine)",
                             argv[1]);
        name = argv[2];
    } else if (argc == 2 && argv[1][0] != '-') {
        name = argv[1];
    } else {
        return ctl_usage("describe", "expected [instance|service|machine] NAME");
    }
    if (!sd_name_valid(name, SD_NAME_MAX))
        return ctl_usage("describe", "'%s' is not a valid name", name);
    json_t *rec = NULL;
    sdc_err_t err;
    int rc = SDC_E_HTTP;
    if (kind == K_ANY || kind == K_INSTANCE) {
        rc = sdc_process_get(ctl->client, ctl->cluster, name, &rec, &err);
        if (rc == SDC_OK)
            return describe_instance(ctl, rec);
        if (rc != SDC_E_HTTP || err.status != 404 || kind == K_INSTANCE)
            return ctl_fail_clear(rc, &err);
        sdc_err_clear(&err);
    }
    if (kind == K_ANY || kind == K_SERVICE) {
        rc = sdc_service_get(ctl->client, ctl->cluster, name, &rec, &err);
        if (rc == SDC_OK)
            return describe_set(ctl, "service", name, rec);
        if (rc != SDC_E_HTTP || err.status != 404)
            return ctl_fail_clear(rc, &err);
        /* not a desired service: a static one when instances run under that name */
        sdc_err_t err2;
        sdc_proc_filter_t f = {.service = name};
        json_t *page = NULL;
        int rc2 = sdc_processes_page(ctl->client, ctl->cluster, &f, NULL, 1, &page, &err2);
        int found = rc2 == SDC_OK && json_array_size(json_object_get(page, "processes")) > 0;
        json_decref(page);
        if (rc2 != SDC_OK)
            sdc_err_clear(&err2);
        if (found) {
            sdc_err_clear(&err);
            return describe_set(ctl, "service", name, json_pack("{s:b}", "static", 1));
        }
        if (kind == K_SERVICE)
            return ctl_fail_clear(rc, &err);
        sdc_err_clear(&err);
    }
    rc = sdc_machine_get(ctl->client, ctl->cluster, name, &rec, &err);
    if (rc == SDC_OK)
        return describe_set(ctl, "machine", name, rec);
    if (rc == SDC_E_HTTP && err.status == 404 && kind == K_ANY) {
        sdc_err_clear(&err);
        fprintf(stderr, "sdctl: no instance, service or machine '%s' in cluster '%s'\n", name,
                ctl->cluster);
        return CTL_EXIT_NOT_FOUND;
    }
    return ctl_fail_clear(rc, &err);
}
