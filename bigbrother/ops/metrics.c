/* bigbrother's Prometheus metrics, served at /metrics on the optional local port
 * `metrics_listen` by a libmicrohttpd thread of its own.
 *
 * The supervision thread is the only writer: it bumps relaxed atomic counters when an
 * instance exits, restarts, hangs or spawns, and republishes the gauges (processes by
 * state, agent connections) before each sleep. The HTTP thread only reads atomics, the
 * service names and the reporter's thread-safe counters, so a slow or stuck scraper can
 * never delay supervision.
 *
 * Rows are per service NAME, static or assigned in cluster mode (those come and go): a
 * fixed table that only the supervision thread appends to; it writes the row, then
 * publishes the new count with release order, and the HTTP thread reads the count with
 * acquire order, so it never sees a half-written row and nothing is ever moved. */
#include "ops/bb_ops.h"
#include "sdjson.h"
#include "sdlog.h"
#include "sdutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RENDER_CAP (4 << 20)

/* The exit and restart counters are kept per stop reason (sdproto.h's table) and shown
 * for the reasons flagged SD_STOP_F_COUNTED; an exit of another reason counts as exited. */
static int counted(size_t r)
{
    return (sd_stop_reason_flags((sd_stop_reason_t)r) & SD_STOP_F_COUNTED) != 0;
}

#define MAX_SERVICES 512 /* rows; the services past it are not broken down */

typedef struct {
    char name[128];
    _Atomic int64_t exits[SD_STOP_COUNT];
    _Atomic int64_t restarts[SD_STOP_COUNT];
    _Atomic int64_t hangs[2]; /* [0] liveness, [1] start */
    _Atomic int64_t spawns;
    _Atomic int64_t held; /* spawns held for a stale assignment (cluster slots) */
    _Atomic int64_t state[ST__COUNT];
} svc_metrics_t;

static svc_metrics_t *svcm; /* MAX_SERVICES rows */
static atomic_int nsvc;     /* rows published */
static int64_t *counts;     /* bb_metrics_publish's scratch: MAX_SERVICES x ST__COUNT */
static _Atomic int64_t agent_conns;
static struct MHD_Daemon *httpd;

/* The row of service `name` (supervision thread only): found, else appended. NULL when
 * the table is full. */
static svc_metrics_t *row_named(const char *name)
{
    int n = atomic_load_explicit(&nsvc, memory_order_relaxed);
    for (int i = 0; i < n; i++)
        if (!strcmp(svcm[i].name, name))
            return &svcm[i];
    if (n == MAX_SERVICES)
        return NULL;
    sd_strlcpy(svcm[n].name, name, sizeof(svcm[n].name));
    atomic_store_explicit(&nsvc, n + 1, memory_order_release);
    return &svcm[n];
}

/* The row of in's service (supervision thread only), cached in the service. NULL when the
 * table is full. */
static svc_metrics_t *of(const bb_inst_t *in)
{
    if (!svcm || !in->svc)
        return NULL;
    bb_service_t *svc = in->svc;
    int n = atomic_load_explicit(&nsvc, memory_order_relaxed);
    if (svc->metrics_slot > 0 && svc->metrics_slot <= n &&
        !strcmp(svcm[svc->metrics_slot - 1].name, svc->name))
        return &svcm[svc->metrics_slot - 1];
    svc_metrics_t *m = row_named(svc->name);
    if (m)
        svc->metrics_slot = (int)(m - svcm) + 1;
    return m;
}

static size_t reason_index(sd_stop_reason_t r)
{
    return counted(r) ? r : SD_STOP_EXITED;
}

/* The state machine's hooks: an exit with in->reason (restarting: a restart follows),
 * a hang kill (start: of the start deadline), a spawn. */
static void on_exit_hook(const bb_inst_t *in, int restarting)
{
    svc_metrics_t *m = of(in);
    if (!m)
        return;
    size_t r = reason_index(in->reason);
    atomic_fetch_add_explicit(&m->exits[r], 1, memory_order_relaxed);
    if (restarting)
        atomic_fetch_add_explicit(&m->restarts[r], 1, memory_order_relaxed);
}

static void on_hang(const bb_inst_t *in, int start)
{
    svc_metrics_t *m = of(in);
    if (m)
        atomic_fetch_add_explicit(&m->hangs[start ? 1 : 0], 1, memory_order_relaxed);
}

static void on_spawn(const bb_inst_t *in)
{
    svc_metrics_t *m = of(in);
    if (m)
        atomic_fetch_add_explicit(&m->spawns, 1, memory_order_relaxed);
}

static void on_held(const bb_inst_t *in)
{
    svc_metrics_t *m = of(in);
    if (m)
        atomic_fetch_add_explicit(&m->held, 1, memory_order_relaxed);
}

/* One pass over the instances (this runs before every sleep of the loop), counting into
 * `counts` (nservices x ST__COUNT, supervision thread only), then one store per gauge. */
void bb_metrics_publish(void)
{
    if (!svcm)
        return;
    int64_t conns = 0;
    for (int i = 0; i < bb.ninst; i++) /* rows first: a new service adds one */
        if (bb.inst[i].svc)
            of(&bb.inst[i]);
    int n = atomic_load_explicit(&nsvc, memory_order_relaxed);
    memset(counts, 0, (size_t)n * ST__COUNT * sizeof(*counts));
    for (int i = 0; i < bb.ninst; i++) {
        const bb_inst_t *in = &bb.inst[i];
        svc_metrics_t *m = in->svc ? of(in) : NULL;
        if (m && (unsigned)in->state < ST__COUNT)
            counts[(m - svcm) * ST__COUNT + in->state]++;
        conns += in->conn != NULL;
    }
    for (int s = 0; s < n; s++)
        for (int k = 0; k < ST__COUNT; k++)
            atomic_store_explicit(&svcm[s].state[k], counts[s * ST__COUNT + k],
                                  memory_order_relaxed);
    atomic_store_explicit(&agent_conns, conns, memory_order_relaxed);
}

/* ---- rendering (HTTP thread) */

static int64_t ld(_Atomic int64_t *p) { return atomic_load_explicit(p, memory_order_relaxed); }

static void family(sd_buf_t *b, const char *name, const char *type, const char *help)
{
    sd_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The whole exposition into b (text format 0.0.4). */
static void render(sd_buf_t *b)
{
    int n = atomic_load_explicit(&nsvc, memory_order_acquire);
    const char *mach = bb.cfg.machine;
    family(b, "bigbrother_build_info", "gauge", "Version of this bigbrother (always 1).");
    sd_buf_printf(b, "bigbrother_build_info{version=\"%s\",machine=\"%s\"} 1\n", SD_VERSION, mach);

    family(b, "bigbrother_processes", "gauge", "Supervised instances by service and state.");
    for (int s = 0; s < n; s++)
        for (int k = 0; k < ST__COUNT; k++)
            sd_buf_printf(b, "bigbrother_processes{service=\"%s\",state=\"%s\"} %lld\n",
                          svcm[s].name, bb_state_name((enum bb_state)k),
                          (long long)ld(&svcm[s].state[k]));

    family(b, "bigbrother_process_exits_total", "counter",
           "Instance exits by service and reason (exited, killed, hung, ...).");
    for (int s = 0; s < n; s++)
        for (size_t r = 0; r < SD_STOP_COUNT; r++)
            if (counted(r))
                sd_buf_printf(b,
                              "bigbrother_process_exits_total{service=\"%s\",reason=\"%s\"} %lld\n",
                              svcm[s].name, sd_stop_reason_name((sd_stop_reason_t)r),
                              (long long)ld(&svcm[s].exits[r]));

    family(b, "bigbrother_restarts_total", "counter",
           "Restarts scheduled by bigbrother, by service and the reason of the exit.");
    for (int s = 0; s < n; s++)
        for (size_t r = 0; r < SD_STOP_COUNT; r++)
            if (counted(r))
                sd_buf_printf(b, "bigbrother_restarts_total{service=\"%s\",reason=\"%s\"} %lld\n",
                              svcm[s].name, sd_stop_reason_name((sd_stop_reason_t)r),
                              (long long)ld(&svcm[s].restarts[r]));

    family(b, "bigbrother_hang_kills_total", "counter",
           "Instances signalled for missing their start or liveness deadline.");
    for (int s = 0; s < n; s++) {
        sd_buf_printf(b, "bigbrother_hang_kills_total{service=\"%s\",deadline=\"liveness\"} %lld\n",
                      svcm[s].name, (long long)ld(&svcm[s].hangs[0]));
        sd_buf_printf(b, "bigbrother_hang_kills_total{service=\"%s\",deadline=\"start\"} %lld\n",
                      svcm[s].name, (long long)ld(&svcm[s].hangs[1]));
    }

    family(b, "bigbrother_process_starts_total", "counter", "Instances spawned, by service.");
    for (int s = 0; s < n; s++)
        sd_buf_printf(b, "bigbrother_process_starts_total{service=\"%s\"} %lld\n",
                      svcm[s].name, (long long)ld(&svcm[s].spawns));

    family(b, "bigbrother_restarts_held_total", "counter",
           "Starts and restarts of cluster slots held until a fresh assignment (after a "
           "pause or a lapsing lease), or because the assignment no longer holds the slot.");
    for (int s = 0; s < n; s++)
        sd_buf_printf(b, "bigbrother_restarts_held_total{service=\"%s\"} %lld\n",
                      svcm[s].name, (long long)ld(&svcm[s].held));

    family(b, "bigbrother_agent_connections", "gauge",
           "Instances with a live libbbagent connection.");
    sd_buf_printf(b, "bigbrother_agent_connections %lld\n", (long long)ld(&agent_conns));

    family(b, "bigbrother_outbox_pending_events", "gauge",
           "Events in the outbox not yet acknowledged by ServerDir.");
    sd_buf_printf(b, "bigbrother_outbox_pending_events %lld\n",
                  (long long)(bb.report ? bb_report_pending(bb.report) : 0));
    family(b, "bigbrother_report_send_failures_total", "counter",
           "Attempts to send events or the machine lease to ServerDir that failed.");
    sd_buf_printf(b, "bigbrother_report_send_failures_total %lld\n",
                  (long long)(bb.report ? bb_report_send_failures(bb.report) : 0));
    bb_logsrv_metrics(b);

    /* instance credentials (report/credential.c): counters of the credential thread */
    int64_t obtained, renewed, failed;
    bb_cred_counts(bb.cred, &obtained, &renewed, &failed);
    family(b, "bigbrother_credentials_total", "counter",
           "Instance credential requests to ServerDir: obtained (a run's first), renewed, failed.");
    sd_buf_printf(b, "bigbrother_credentials_total{result=\"obtained\"} %lld\n"
                     "bigbrother_credentials_total{result=\"renewed\"} %lld\n"
                     "bigbrother_credentials_total{result=\"failed\"} %lld\n",
                  (long long)obtained, (long long)renewed, (long long)failed);
}

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned status, const char *ctype,
                              sd_buf_t *body)
{
    struct MHD_Response *r;
    if (body && body->data) {
        r = MHD_create_response_from_buffer(body->len, body->data, MHD_RESPMEM_MUST_FREE);
        body->data = NULL;
    } else {
        static const char msg[] = "not found: bigbrother serves /metrics only\n";
        r = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    }
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    (void)upload_data;
    if (*upload_size) { /* no request here has a body: discard it */
        *upload_size = 0;
        return MHD_YES;
    }
    if (!*con_cls) {
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (strcmp(method, "GET") || strcmp(url, "/metrics"))
        return answer(conn, MHD_HTTP_NOT_FOUND, "text/plain", NULL);
    sd_buf_t b;
    sd_buf_init(&b, RENDER_CAP);
    render(&b);
    enum MHD_Result ret = answer(conn, MHD_HTTP_OK, "text/plain; version=0.0.4", &b);
    sd_buf_free(&b);
    return ret;
}

int bb_listen_tcp(const char *host, int port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof(*v6);
    } else {
        return -EINVAL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 16)) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int bb_metrics_start(void)
{
    svcm = calloc(MAX_SERVICES, sizeof(*svcm));
    counts = calloc((size_t)MAX_SERVICES * ST__COUNT, sizeof(*counts));
    if (!svcm || !counts)
        return -ENOMEM;
    bb_inst_hooks.spawned = on_spawn;
    bb_inst_hooks.hung = on_hang;
    bb_inst_hooks.exited = on_exit_hook;
    bb_inst_hooks.held = on_held;
    if (!bb.cfg.metrics_host[0])
        return 0;
    int fd = bb_listen_tcp(bb.cfg.metrics_host, bb.cfg.metrics_port);
    if (fd < 0) {
        log_error("metrics port not opened", "listen=%s port=%d error=%s", bb.cfg.metrics_host,
                  bb.cfg.metrics_port, strerror(-fd));
        return fd;
    }
    httpd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                             on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!httpd) {
        close(fd);
        log_error("metrics server not started", "listen=%s port=%d", bb.cfg.metrics_host,
                  bb.cfg.metrics_port);
        return -EIO;
    }
    log_info("metrics served", "listen=%s port=%d path=%s", bb.cfg.metrics_host,
             bb.cfg.metrics_port, "/metrics");
    return 0;
}

void bb_metrics_stop(void)
{
    if (httpd) {
        MHD_stop_daemon(httpd);
        httpd = NULL;
    }
    free(svcm);
    svcm = NULL;
    atomic_store(&nsvc, 0);
    free(counts);
    counts = NULL;
}

/* ---- counters across a SIGHUP re-exec */

#define SAVED_MAX (1u << 20)

static void saved_path(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/metrics.saved", bb.cfg.state_dir);
}

/* {"services": {NAME: {"exits": {REASON: n}, "restarts": {REASON: n}, "hangs": [l, s],
 *  "spawns": n}}} */
void bb_metrics_save(void)
{
    if (!svcm)
        return;
    json_t *svcs = json_object();
    int n = atomic_load_explicit(&nsvc, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        json_t *ex = json_object(), *re = json_object();
        for (size_t r = 0; r < SD_STOP_COUNT; r++) {
            const char *rn = sd_stop_reason_name((sd_stop_reason_t)r);
            if (!counted(r))
                continue;
            json_object_set_new(ex, rn, json_integer(ld(&svcm[i].exits[r])));
            json_object_set_new(re, rn, json_integer(ld(&svcm[i].restarts[r])));
        }
        json_object_set_new(svcs, svcm[i].name,
                            json_pack("{s:o, s:o, s:[I,I], s:I}", "exits", ex, "restarts", re,
                                      "hangs", (json_int_t)ld(&svcm[i].hangs[0]),
                                      (json_int_t)ld(&svcm[i].hangs[1]), "spawns",
                                      (json_int_t)ld(&svcm[i].spawns)));
    }
    json_t *root = json_pack("{s:o}", "services", svcs);
    char path[PATH_MAX];
    saved_path(path, sizeof path);
    if (json_dump_file(root, path, JSON_COMPACT) < 0)
        log_warn("metrics counters not saved for the re-exec", "file=%s", path);
    json_decref(root);
}

/* Adds the non-negative integer o[key] (absent: 0) to *c. */
static void add_saved(_Atomic int64_t *c, const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        atomic_fetch_add_explicit(c, json_integer_value(v), memory_order_relaxed);
}

void bb_metrics_restore(void)
{
    char path[PATH_MAX];
    saved_path(path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    int rc = sd_read_file(path, SAVED_MAX, &text, &len);
    if (rc == -ENOENT)
        return;
    unlink(path);
    char err[256] = "";
    json_t *root = rc ? NULL : sd_json_parse(text, len, 8, err, sizeof err);
    free(text);
    json_t *svcs = json_object_get(root, "services");
    if (!svcm || !json_is_object(svcs)) {
        log_warn("metrics counters of the last image not restored", "file=%s error=%s", path,
                 rc ? strerror(-rc) : err[0] ? err : "no services object");
        json_decref(root);
        return;
    }
    const char *name;
    json_t *o;
    json_object_foreach(svcs, name, o) {
        svc_metrics_t *m = sd_name_valid(name, SD_NAME_MAX) ? row_named(name) : NULL;
        if (!m || !json_is_object(o))
            continue;
        for (size_t r = 0; r < SD_STOP_COUNT; r++) {
            const char *rn = sd_stop_reason_name((sd_stop_reason_t)r);
            if (!counted(r))
                continue;
            add_saved(&m->exits[r], json_object_get(o, "exits"), rn);
            add_saved(&m->restarts[r], json_object_get(o, "restarts"), rn);
        }
        json_t *h = json_object_get(o, "hangs");
        for (size_t k = 0; k < 2; k++) {
            json_t *v = json_array_get(h, k);
            if (json_is_integer(v) && json_integer_value(v) >= 0)
                atomic_fetch_add_explicit(&m->hangs[k], json_integer_value(v),
                                          memory_order_relaxed);
        }
        add_saved(&m->spawns, o, "spawns");
    }
    json_decref(root);
}
