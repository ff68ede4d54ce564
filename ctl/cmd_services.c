/* sdctl services, scale, delete, restart: the desired services of the
 * cluster and the operator actions on them (docs/cluster.md). ServerDir records what is
 * wanted; the primary Big Brother makes it so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "sdutil.h"

SDCTL_CMD("services", cmd_services, "list the services, desired (count, version, stopped) and static");
SDCTL_CMD("scale", cmd_scale, "set the instance count of a service");
SDCTL_CMD("delete", cmd_delete, "delete a service (its instances are stopped)");
SDCTL_CMD("restart", cmd_restart, "rolling restart of a service, or restart one instance");

/* ---------- services ---------- */

static const char services_usage[] =
    "usage: sdctl services [SERVICE]\n"
    "  Lists the desired services: COUNT instances wanted, the spec VERSION, whether the\n"
    "  service is STOPPED, its RESTART token (grows with each sdctl restart), PLACEMENT\n"
    "  labels and the COMMAND; then the static services, which run instances without being\n"
    "  desired ones (a machine's bigbrother config starts them), with how many run. With\n"
    "  SERVICE, that service's whole spec as JSON (exit code 4 when it does not exist).\n"
    "  When a service has a warm pool (docs/allocation.md), COUNT says pool (the primary\n"
    "  sizes it) and a POOL column its ready unallocated and its allocated instances\n"
    "  (\"4 free / 2 alloc\"); -o wide adds the pool's BUFFER, MIN, MAX, ON_RELEASE and\n"
    "  LAST_DEMAND (since the last allocation request).\n"
    "  -o json prints the API answer with \"static_services\": [{service, running}].\n";

/* The columns of the services table: the pool's only when a service has one. */
static const char *const cols_base[] = {"SERVICE", "COUNT", "VERSION", "STOPPED", "RESTART",
                                        "PLACEMENT", "COMMAND"};
static const char *const cols_pool[] = {"SERVICE", "COUNT", "POOL", "VERSION", "STOPPED",
                                        "RESTART", "PLACEMENT", "COMMAND", "BUFFER", "MIN",
                                        "MAX", "ON_RELEASE", "LAST_DEMAND"};
#define NCOLS_POOL 8      /* cols_pool without -o wide */
#define NCOLS_POOL_WIDE 13

/* Room for the text of one row's cells. */
struct row_text {
    char name[160], count[24], pool[64], ver[24], tok[24], lab[300], cmd[300];
    char buffer[24], min[24], max[24], on_release[24], demand[32];
};

/* The cells of service s (cols_pool's order, NULL prints "-") into c; their text lives
 * in b. */
static void service_cells(const json_t *s, struct row_text *b, const char **c, int64_t now)
{
    const json_t *spec = json_object_get(s, "spec"), *pool = json_object_get(spec, "pool");
    const json_t *demand = json_object_get(json_object_get(s, "pool"), "last_demand_ms");
    ctl_kv_text(json_object_get(json_object_get(spec, "placement"), "labels"), b->lab,
                sizeof b->lab);
    c[0] = ctl_jstr(json_object_get(s, "service"), b->name, sizeof b->name);
    c[1] = pool ? "pool" : ctl_jstr(json_object_get(spec, "count"), b->count, sizeof b->count);
    c[2] = ctl_pool_text(s, b->pool, sizeof b->pool);
    c[3] = ctl_jstr(json_object_get(s, "version"), b->ver, sizeof b->ver);
    c[4] = json_is_true(json_object_get(s, "stopped")) ? "yes" : "no";
    c[5] = ctl_jstr(json_object_get(s, "restart_token"), b->tok, sizeof b->tok);
    c[6] = b->lab;
    c[7] = ctl_jstr(json_object_get(spec, "command"), b->cmd, sizeof b->cmd);
    c[8] = pool ? ctl_jstr(json_object_get(pool, "buffer"), b->buffer, sizeof b->buffer) : NULL;
    c[9] = pool ? (json_object_get(pool, "min") ? ctl_jstr(json_object_get(pool, "min"), b->min,
                                                            sizeof b->min) : "0") : NULL;
    c[10] = pool ? (json_object_get(pool, "max") ? ctl_jstr(json_object_get(pool, "max"), b->max,
                                                             sizeof b->max) : "100000") : NULL;
    c[11] = pool ? (json_object_get(spec, "on_release")
                        ? ctl_jstr(json_object_get(spec, "on_release"), b->on_release,
                                   sizeof b->on_release)
                        : "recycle")
                 : NULL;
    c[12] = pool && json_integer_value(demand) > 0
                ? ctl_fmt_ms(now - json_integer_value(demand), b->demand, sizeof b->demand)
                : NULL;
}

/* A row of the table: every column of cols_pool when the table has the pool's, else the
 * base ones (c without POOL). */
static void service_row(ctl_table_t *t, const char **c, int pooled)
{
    if (pooled) {
        ctl_table_rowv(t, c);
    } else {
        const char *base[] = {c[0], c[1], c[3], c[4], c[5], c[6], c[7]};
        ctl_table_rowv(t, base);
    }
}

/* One service's whole spec is JSON for people too. */
static void services_json(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    ctl_print_json(ans);
}

static void services_table(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    int pooled = 0;
    size_t i;
    const json_t *s;
    json_array_foreach(json_object_get(ans, "services"), i, s)
        pooled |= json_is_object(json_object_get(json_object_get(s, "spec"), "pool"));
    ctl_table_t *t = pooled ? ctl_table_newv(ctl->wide ? NCOLS_POOL_WIDE : NCOLS_POOL, cols_pool)
                            : ctl_table_newv(7, cols_base);
    int64_t now = sd_wall_ms();
    json_array_foreach(json_object_get(ans, "services"), i, s) {
        struct row_text b;
        const char *c[NCOLS_POOL_WIDE];
        service_cells(s, &b, c, now);
        service_row(t, c, pooled);
    }
    json_array_foreach(json_object_get(ans, "static_services"), i, s) {
        char name[160], run[48];
        snprintf(run, sizeof run, "%lld running",
                 (long long)json_integer_value(json_object_get(s, "running")));
        const char *c[NCOLS_POOL_WIDE] = {ctl_jstr(json_object_get(s, "service"), name, sizeof name),
                                          [6] = "static (bigbrother config)", [7] = run};
        service_row(t, c, pooled);
    }
    ctl_table_print(t, stdout, ctl->color);
}

/* Adds to ans "static_services": [{service, running}] for the services that run instances
 * (the live directory, every page) without being desired ones: a machine's bigbrother
 * config runs them. */
static int add_static(ctl_t *ctl, json_t *ans, sdc_err_t *err)
{
    json_t *procs = NULL;
    int rc = sdc_processes_list(ctl->client, ctl->cluster, NULL, &procs, err);
    if (rc != SDC_OK)
        return rc;
    json_t *counts = json_object();
    size_t i;
    const json_t *p;
    json_array_foreach(json_object_get(procs, "processes"), i, p) {
        const char *svc = json_string_value(json_object_get(p, "service"));
        if (!svc)
            continue;
        int desired = 0;
        size_t k;
        const json_t *d;
        json_array_foreach(json_object_get(ans, "services"), k, d)
            desired |= !strcmp(json_string_value(json_object_get(d, "service")) ?: "", svc);
        if (!desired)
            json_object_set_new(counts, svc,
                                json_integer(json_integer_value(json_object_get(counts, svc)) + 1));
    }
    json_t *list = json_array();
    const char *name;
    json_t *n;
    json_object_foreach(counts, name, n)
        json_array_append_new(list, json_pack("{s:s, s:O}", "service", name, "running", n));
    ctl_sort_natural(list, "service");
    json_object_set_new(ans, "static_services", list);
    json_decref(counts);
    json_decref(procs);
    return SDC_OK;
}

int cmd_services(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, services_usage))
        return CTL_EXIT_OK;
    if (argc > 2 || (argc == 2 && argv[1][0] == '-'))
        return ctl_usage("services", "unexpected argument '%s'", argv[argc - 1]);
    json_t *ans = NULL;
    sdc_err_t err;
    if (argc == 2) {
        int rc = sdc_service_get(ctl->client, ctl->cluster, argv[1], &ans, &err);
        return ctl_answer(ctl, rc, &err, ans, services_json, NULL);
    }
    int rc = sdc_services_list(ctl->client, ctl->cluster, &ans, &err);
    if (rc == SDC_OK && (rc = add_static(ctl, ans, &err)) != SDC_OK) {
        json_decref(ans);
        ans = NULL;
    }
    if (rc == SDC_OK && !json_array_size(json_object_get(ans, "services")) &&
        !json_array_size(json_object_get(ans, "static_services")) && ctl_cluster_unknown(ctl)) {
        json_decref(ans);
        return CTL_EXIT_NOT_FOUND;
    }
    return ctl_answer(ctl, rc, &err, ans, services_table, NULL);
}

/* ---------- scale, delete ---------- */

static const char scale_usage[] =
    "usage: sdctl scale SERVICE COUNT [--dry-run]\n"
    "  Sets how many instances of SERVICE should run (0-100000) and prints the change.\n"
    "  The primary Big Brother places new instances or stops surplus ones.\n";

struct scale_req {
    const char *service;
    int64_t count;
    int dry;
};

static void scale_print(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    const struct scale_req *r = arg;
    const json_t *changes = json_object_get(ans, "changes");
    if (json_array_size(changes) == 0)
        printf("%s: already at %lld\n", r->service, (long long)r->count);
    else
        printf("%s: %s%s (version %lld)\n", r->service,
               json_string_value(json_array_get(changes, 0)), r->dry ? " [dry run]" : "",
               (long long)json_integer_value(json_object_get(ans, "version")));
}

int cmd_scale(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, scale_usage))
        return CTL_EXIT_OK;
    int dry = argc == 4 && !strcmp(argv[3], "--dry-run");
    int64_t count;
    if (argc != 3 + dry)
        return ctl_usage("scale", "expected SERVICE COUNT");
    if (sd_parse_i64(argv[2], 0, 100000, &count))
        return ctl_usage("scale", "COUNT must be a number 0-100000, not '%s'", argv[2]);
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_service_scale(ctl->client, ctl->cluster, argv[1], count, dry, &ans, &err);
    struct scale_req r = {argv[1], count, dry};
    return ctl_answer(ctl, rc, &err, ans, scale_print, &r);
}

static const char delete_usage[] =
    "usage: sdctl delete SERVICE\n"
    "  Deletes the service; the primary removes its slots and the Big Brothers stop its\n"
    "  instances gracefully. Exit code 4 when it does not exist.\n";

int cmd_delete(ctl_t *ctl, int argc, char **argv)
{
    int early = ctl_one_arg(argc, argv, "delete", delete_usage, "SERVICE");
    if (early >= 0)
        return early;
    sdc_err_t err;
    int rc = sdc_service_delete(ctl->client, ctl->cluster, argv[1], &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    if (ctl->json) {
        json_t *o = json_pack("{s:s, s:b}", "service", argv[1], "deleted", 1);
        ctl_print_json(o);
        json_decref(o);
    } else {
        printf("%s: deleted\n", argv[1]);
    }
    return CTL_EXIT_OK;
}

/* ---------- restart ---------- */

static const char restart_usage[] =
    "usage: sdctl restart SERVICE [--max-unavailable N]\n"
    "       sdctl restart INSTANCE\n"
    "  SERVICE: a rolling restart; the primary restarts at most N instances at a time\n"
    "  (default 1), waiting for each to be ready. INSTANCE (a name from sdctl ps): that\n"
    "  one instance is restarted in its slot.\n";

static void restart_service_print(const ctl_t *ctl, const json_t *ans, const void *target)
{
    printf("%s: rolling restart requested (restart token %lld, at most %lld at a time)\n",
           (const char *)target,
           (long long)json_integer_value(json_object_get(ans, "restart_token")),
           (long long)json_integer_value(json_object_get(ans, "max_unavailable")));
}

static void restart_instance_print(const ctl_t *ctl, const json_t *ans, const void *target)
{
    printf("%s: restart requested (service %s, slot %lld)\n", (const char *)target,
           json_string_value(json_object_get(ans, "service")),
           (long long)json_integer_value(json_object_get(ans, "slot")));
}

int cmd_restart(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, restart_usage))
        return CTL_EXIT_OK;
    const char *target = NULL;
    int64_t max_unavailable = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-unavailable") && i + 1 < argc) {
            if (sd_parse_i64(argv[++i], 1, 100000, &max_unavailable))
                return ctl_usage("restart", "--max-unavailable must be 1-100000");
        } else if (argv[i][0] == '-' || target) {
            return ctl_usage("restart", "unexpected argument '%s'", argv[i]);
        } else {
            target = argv[i];
        }
    }
    if (!target)
        return ctl_usage("restart", "expected SERVICE or INSTANCE");
    json_t *ans = NULL;
    sdc_err_t err;
    /* A service name wins; anything ServerDir does not know as a service is taken as an
     * instance. A static service (a bigbrother config's) is refused in words
     * (409 static_service), so `sdctl restart zone` says whose it is. */
    int rc = sdc_service_restart(ctl->client, ctl->cluster, target, max_unavailable, &ans, &err);
    if (rc == SDC_OK || !(rc == SDC_E_HTTP && err.status == 404))
        return ctl_answer(ctl, rc, &err, ans, restart_service_print, target);
    sdc_err_clear(&err);
    if (max_unavailable > 0)
        return ctl_usage("restart", "'%s' is not a service; --max-unavailable is for services",
                         target);
    rc = sdc_instance_restart(ctl->client, ctl->cluster, target, &ans, &err);
    return ctl_answer(ctl, rc, &err, ans, restart_instance_print, target);
}
