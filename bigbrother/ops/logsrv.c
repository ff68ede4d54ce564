/* The logs port (config logs_listen, HOST:PORT; registered with the machine lease as
 * logs_port): the output and the health of the instances this bigbrother runs, for
 * sdctl logs / describe and the dashboard on any machine, without SSH.
 *
 *   GET /v1/logs/{instance}[?tail=N|all][&follow=1][&since_ms=MS][&timestamps=1]
 *                                                   Authorization: Bearer TOKEN
 *   GET /v1/health                                  (every instance here)
 *   GET /v1/health/{instance}                       (the current run of a slot)
 *
 * /v1/logs answers text/plain: the last N lines (default 100, at most 10,000; 0 none, as
 * kubectl's --tail 0; all: every line, up to 10,000) of that run's output, read from its
 * log (STATE_DIR/logs/<service>-<slot>/<instance>.log, less its header line; the lines of
 * its .1 first for all or when the file holds no more than N lines, as after a
 * rotation); with follow=1 and a live instance, then what it writes (from the file's new
 * start after a rotation truncated it), until the run ends.
 *
 * The process writes straight into its log (it outlives bigbrother's restarts), so no
 * line carries the time it was written. timestamps=1 prefixes each line with a UTC ISO
 * 8601 time in ms and a space ("2026-11-28T07:20:01.250Z "): for a line that arrives
 * while following, the time this port read it (woken by inotify at the write); for the
 * lines already in the log, the file's last write, the latest they can have been
 * written. since_ms=MS (1 to 30 days) leaves out those earlier lines when the file was
 * last written more than MS ago (they are all older), and otherwise keeps them (which
 * are older cannot be told).
 * /v1/health answers the health view's JSON (health.c: heartbeat age, probe failures).
 *
 * The caller's token is checked by ServerDir: an instance's request is served when GET
 * /v1/clusters/{cluster}/processes/{instance} answers 200 with that token (a viewer, ops
 * or bigbrother token of the cluster), the machine's when GET .../machines/{machine}
 * does, so the logs port needs no secret of its own; without a serverdir section it
 * serves nothing (503). Answers allow any origin (CORS, with the preflight): the
 * dashboard reads them from the browser with the operator's token.
 *
 * Its own libmicrohttpd daemon, one thread per connection (at most 16): a follower
 * waits in its thread between reads, in poll() on an inotify watch of the log (woken by
 * a write), the stop eventfd (woken when bigbrother stops) and a timeout (the next
 * liveness check, and at most FOLLOW_POLL_MS in case a change went unseen); there is no
 * idle timeout once an answer streams (a quiet game's follower would be cut), and every
 * other answer closes its connection, so that no browser keeps an
 * idle one holding a thread. It touches no supervisor state: the files, the health
 * snapshot and ServerDir.
 *
 * 16 threads are few, so the connections that have not got a request in cannot keep
 * them (issue 28): the connection guard below follows each connection through
 *
 *     HEAD (accepted, no complete request head) --> BODY (head in, before the answer)
 *          --> ANSWER (an answer queued: a short one, or a log, streaming while it follows)
 *
 * and closes (shutdown(2); libmicrohttpd closes it on its thread) a HEAD connection
 * LOGS_HEADER_MS after it opened or after its previous answer, however slowly it keeps
 * sending (libmicrohttpd's inactivity timeout restarts at each byte), and a BODY one
 * LOGS_BODY_MS after its head. A request that declares a body is answered 413 at once:
 * none is expected. A source (an IPv4 address or an IPv6 /64) holds at most
 * LOGS_PER_SOURCE connections; when all 16 are taken a new one evicts the oldest HEAD
 * one, else the oldest BODY one, and is refused when every connection has an answer
 * (follows stream as long as their run lives and are never evicted). */
#include "ops/bb_ops.h"
#include "sdclient.h"
#include "sdlog.h"
#include "sdtime.h"
#include "sdutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TAIL_DEFAULT 100
#define TAIL_MAX BB_LOG_LINES_MAX
#define FOLLOW_CHECK_MS 2000 /* how often a follower asks ServerDir whether the run lives */
#define SINCE_MAX_MS (30LL * 86400 * 1000)
#define STAMP_LEN 25 /* "2026-11-28T07:20:01.250Z " */
#define FOLLOW_POLL_MS 200 /* the longest wait without a look at the file */
#define LOGS_CONNECTIONS 16
#define LOGS_SLACK 4        /* accepted beyond 16 while the ones they evicted close */
#define LOGS_PER_SOURCE 8
#define LOGS_HEADER_MS 5000 /* accept (or the previous answer) to a complete request head */
#define LOGS_BODY_MS 5000   /* complete head to the answer */

static struct MHD_Daemon *logsd;
static atomic_int stopping; /* followers end their wait when bigbrother stops */
static int stop_fd = -1;    /* eventfd, readable once bigbrother stops: wakes followers */

typedef struct {
    FILE *f;
    char id[SD_NAME_MAX + 1];
    char token[256];
    char cluster[SD_NAME_MAX + 1];
    sd_buf_t head;      /* the tail already read, sent first */
    size_t head_off;
    int follow, ended;
    int stamps;     /* timestamps=1: each line prefixed with its time */
    int line_start; /* the next byte sent starts a line (its stamp goes first) */
    int64_t checked_ms;
    int ino; /* inotify fd watching the log for writes (-1: none, the timeout only) */
} run_t;

/* A follower's wait for more of the log: until the file is written to, bigbrother stops,
 * or the timeout (the next liveness check, at most FOLLOW_POLL_MS) passes. */
static void follow_wait(run_t *r)
{
    int64_t ms = FOLLOW_CHECK_MS - (sd_mono_ms() - r->checked_ms);
    if (ms > FOLLOW_POLL_MS)
        ms = FOLLOW_POLL_MS;
    struct pollfd p[2] = {{.fd = r->ino, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
    if (poll(p, 2, ms > 0 ? (int)ms : 0) > 0 && (p[0].revents & POLLIN)) {
        char ev[4096]; /* the events say only "written": drop them */
        while (read(r->ino, ev, sizeof ev) > 0)
            ;
    }
}

/* ServerDir's word on the caller's token and the instance id (NULL: this machine as a
 * whole, GET .../machines/{machine}): the HTTP status to answer (200 when allowed) and,
 * on 200 for an instance, whether its record says it is live. */
static int check_caller(const char *token, const char *id, int *live)
{
    sdc_t *c = sdc_new(bb.cfg.urls, token, 5000);
    if (!c)
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    json_t *p = NULL;
    sdc_err_t err;
    int rc = id ? sdc_process_get(c, bb.cfg.cluster, id, &p, &err)
                : sdc_machine_get(c, bb.cfg.cluster, bb.cfg.machine, &p, &err);
    int status = MHD_HTTP_OK;
    if (rc == SDC_OK && id) {
        const char *st = json_string_value(json_object_get(p, "state"));
        const char *m = json_string_value(json_object_get(p, "machine"));
        *live = st && strcmp(st, "stopped") != 0;
        if (!m || strcmp(m, bb.cfg.machine) != 0) /* another machine's instance */
            status = MHD_HTTP_NOT_FOUND;
    } else if (rc == SDC_E_HTTP && (err.status == 401 || err.status == 403 || err.status == 404)) {
        status = (int)err.status;
    } else if (rc != SDC_OK) {
        status = MHD_HTTP_SERVICE_UNAVAILABLE;
    }
    if (rc != SDC_OK)
        sdc_err_clear(&err);
    json_decref(p);
    sdc_free(c);
    return status;
}

/* "2026-11-28T07:20:01.250Z " for the wall-clock time ms into out (STAMP_LEN + 1): the
 * project's one time format (sd_time_iso) and a space. */
static void stamp_format(int64_t ms, char *out)
{
    char iso[SD_TIME_ISO_LEN];
    snprintf(out, STAMP_LEN + 1, "%-24.24s ", sd_time_iso(ms, iso, sizeof iso));
}

/* Rewrites the lines of b with the stamp of ms before each (timestamps=1 on the lines
 * already in the log); lines that would pass b's cap are dropped from the front. */
static void stamp_lines(sd_buf_t *b, int64_t ms)
{
    char stamp[STAMP_LEN + 1];
    stamp_format(ms, stamp);
    sd_buf_t out;
    sd_buf_init(&out, b->max);
    size_t lines = 0;
    for (size_t i = 0; i < b->len; i++)
        lines += b->data[i] == '\n';
    lines += b->len && b->data[b->len - 1] != '\n'; /* a last line still being written */
    size_t from = 0;
    while (b->len - from + lines * STAMP_LEN > b->max && from < b->len) { /* oldest out */
        const char *nl = memchr(b->data + from, '\n', b->len - from);
        from = nl ? (size_t)(nl - b->data) + 1 : b->len;
        lines--;
    }
    for (size_t at = from; at < b->len;) {
        const char *nl = memchr(b->data + at, '\n', b->len - at);
        size_t end = nl ? (size_t)(nl - b->data) + 1 : b->len;
        sd_buf_append(&out, stamp, STAMP_LEN);
        sd_buf_append(&out, b->data + at, end - at);
        at = end;
    }
    sd_buf_free(b);
    *b = out;
}

/* A followed line (or the next piece of a long one) into buf: its stamp first when it
 * starts a line and r stamps. Returns the bytes written (max > STAMP_LEN). */
static size_t follow_emit(run_t *r, char *buf, size_t max, const char *line, size_t n)
{
    size_t o = 0;
    if (r->stamps && r->line_start) {
        char stamp[STAMP_LEN + 1];
        stamp_format(sd_wall_ms(), stamp);
        memcpy(buf, stamp, STAMP_LEN);
        o = STAMP_LEN;
    }
    n = n < max - o ? n : max - o;
    memcpy(buf + o, line, n);
    r->line_start = n > 0 && line[n - 1] == '\n';
    return o + n;
}

static ssize_t run_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    run_t *r = cls;
    if (r->head_off < r->head.len) {
        size_t n = r->head.len - r->head_off < max ? r->head.len - r->head_off : max;
        memcpy(buf, r->head.data + r->head_off, n);
        r->head_off += n;
        return (ssize_t)n;
    }
    if (!r->follow || r->ended)
        return MHD_CONTENT_READER_END_OF_STREAM;
    for (;;) { /* this connection's own thread: wait for more */
        char line[4096];
        struct stat st;
        clearerr(r->f);
        long at = ftell(r->f);
        if (fstat(fileno(r->f), &st) == 0 && st.st_size < at) { /* rotated: truncated */
            fseek(r->f, 0, SEEK_SET);
            at = 0;
        }
        if (fgets(line, sizeof line, r->f)) {
            size_t n = strlen(line);
            if (line[n - 1] != '\n' && !feof(r->f)) {
                /* a long line: send what fits */
            } else if (line[n - 1] != '\n') { /* a line still being written */
                fseek(r->f, at, SEEK_SET);
                goto wait;
            }
            if (bb_log_header(line, r->id) == 2) {
                r->ended = 1;
                return MHD_CONTENT_READER_END_OF_STREAM;
            }
            size_t stamp = r->stamps && r->line_start ? STAMP_LEN : 0;
            size_t sent = follow_emit(r, buf, max, line, n) - stamp;
            if (sent < n)
                fseek(r->f, at + (long)sent, SEEK_SET);
            return (ssize_t)(sent + stamp);
        }
    wait:
        if (atomic_load(&stopping))
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (sd_mono_ms() - r->checked_ms >= FOLLOW_CHECK_MS) {
            int live = 0;
            r->checked_ms = sd_mono_ms();
            if (check_caller(r->token, r->id, &live) != MHD_HTTP_OK || !live) {
                r->follow = 0; /* what is left, then the end */
                clearerr(r->f);
                if (fgets(line, sizeof line, r->f) && bb_log_header(line, r->id) != 2) {
                    r->follow = 1;
                    return (ssize_t)follow_emit(r, buf, max, line, strlen(line));
                }
                return MHD_CONTENT_READER_END_OF_STREAM;
            }
        }
        follow_wait(r);
    }
}

static void run_free(void *cls)
{
    run_t *r = cls;
    if (r->f)
        fclose(r->f);
    if (r->ino >= 0)
        close(r->ino);
    sd_buf_free(&r->head);
    free(r);
}

/* Every answer may be read by a page of another origin (the dashboard, served by
 * ServerDir): the token travels in the Authorization header, never in a cookie, so a
 * page without the token can read nothing. */
static void cors(struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
}

/* The headers of every answer but a log: CORS, and the connection closed after it. */
static void short_answer(struct MHD_Response *resp)
{
    cors(resp);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

static enum MHD_Result text(struct MHD_Connection *conn, unsigned status, const char *msg)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(msg), (void *)msg, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    short_answer(resp);
    MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* A browser's CORS preflight for a GET with an Authorization header. */
static enum MHD_Result preflight(struct MHD_Connection *conn)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    short_answer(resp);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* GET /v1/health[/{id}]: the health view (health.c) of every instance here, or of the
 * current run named id, once ServerDir accepts the caller's token for it. */
static enum MHD_Result health_answer(struct MHD_Connection *conn, const char *token,
                                     const char *id)
{
    int live = 0;
    int status = check_caller(token, id, &live);
    if (status != MHD_HTTP_OK)
        return text(conn, (unsigned)status,
                    status == MHD_HTTP_NOT_FOUND ? (id ? "no such instance on this machine\n"
                                                       : "this machine is not registered\n")
                    : status == MHD_HTTP_SERVICE_UNAVAILABLE ? "ServerDir cannot be reached\n"
                                                             : "not allowed\n");
    char *body = bb_health_dump(id);
    if (!body)
        return text(conn, MHD_HTTP_NOT_FOUND,
                    id ? "that instance is not the current run of a slot here\n"
                       : "no health snapshot yet\n");
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    short_answer(resp);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}


/* ---------------------------------------------------------------- connection guard */

enum { G_HEAD, G_BODY, G_ANSWER };
enum { GR_PER_SOURCE, GR_FULL, GR_EVICTED, GR_HEADER_TIMEOUT, GR_BODY_TIMEOUT, GR_N };
static const char *const guard_reasons[GR_N] = {"per_source", "total", "evicted",
                                                "header_timeout", "body_timeout"};

typedef struct {
    int used, evicted; /* evicted: shut down here, libmicrohttpd has yet to close it */
    int fd, state;
    int64_t since;     /* when it entered its state (sd_mono_ms) */
    unsigned char src[9]; /* length (4 or 8), then the IPv4 address or IPv6 /64 */
} gconn_t;

static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t guard_cv = PTHREAD_COND_INITIALIZER;
static gconn_t gconns[LOGS_CONNECTIONS + LOGS_SLACK]; /* libmicrohttpd's limit: one each */
static pthread_t guard_thread;
static int guard_running, guard_stop;
static _Atomic int64_t guard_counts[GR_N];

/* The source of addr into src; -1 for a family without one. */
static int guard_src(const struct sockaddr *sa, unsigned char src[9])
{
    memset(src, 0, 9);
    if (sa->sa_family == AF_INET) {
        src[0] = 4;
        memcpy(src + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family != AF_INET6)
        return -1;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    src[0] = IN6_IS_ADDR_V4MAPPED(a) ? 4 : 8;
    memcpy(src + 1, a->s6_addr + (src[0] == 4 ? 12 : 0), src[0]);
    return 0;
}

/* Counts reason; a log line per reason at most every 10 s (outsiders trigger these). */
static void guard_note(int reason)
{
    static _Atomic int64_t last[GR_N];
    atomic_fetch_add(&guard_counts[reason], 1);
    int64_t now = sd_mono_ms(), prev = atomic_load(&last[reason]);
    if (now - prev >= 10000 && atomic_compare_exchange_strong(&last[reason], &prev, now))
        log_warn("logs port connection refused or closed", "reason=%s limit=%d detail=%s",
                 guard_reasons[reason], LOGS_CONNECTIONS,
                 "one line per reason per 10 s; see bigbrother_logs_connections_*_total");
}

/* Closes g (under guard_mu). */
static void guard_close(gconn_t *g, int reason)
{
    g->evicted = 1;
    shutdown(g->fd, SHUT_RDWR);
    guard_note(reason);
}

/* The oldest open connection in state (under guard_mu), or NULL. */
static gconn_t *guard_oldest(int state)
{
    gconn_t *o = NULL;
    for (size_t i = 0; i < SD_ARRAY_LEN(gconns); i++) {
        gconn_t *g = &gconns[i];
        if (g->used && !g->evicted && g->state == state && (!o || g->since < o->since))
            o = g;
    }
    return o;
}

/* Accept policy: a source over LOGS_PER_SOURCE is refused; at LOGS_CONNECTIONS the
 * oldest HEAD connection, else the oldest BODY one, is evicted to make room. */
static enum MHD_Result guard_admit(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)cls;
    (void)len;
    unsigned char src[9];
    if (guard_src(addr, src))
        return MHD_YES;
    int from = 0, open = 0, reason = -1;
    pthread_mutex_lock(&guard_mu);
    for (size_t i = 0; i < SD_ARRAY_LEN(gconns); i++) {
        if (!gconns[i].used || gconns[i].evicted)
            continue;
        open++;
        from += !memcmp(gconns[i].src, src, sizeof src);
    }
    if (from >= LOGS_PER_SOURCE) {
        reason = GR_PER_SOURCE;
    } else if (open >= LOGS_CONNECTIONS) {
        gconn_t *v = guard_oldest(G_HEAD);
        if (!v)
            v = guard_oldest(G_BODY);
        if (v)
            guard_close(v, GR_EVICTED);
        else
            reason = GR_FULL;
    }
    pthread_mutex_unlock(&guard_mu);
    if (reason < 0)
        return MHD_YES;
    guard_note(reason);
    return MHD_NO;
}

/* Connection start and end (MHD_OPTION_NOTIFY_CONNECTION): a slot of gconns, whose
 * socket stays open until this "closed" call has freed the slot. */
static void guard_notify(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                         enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    gconn_t *g = *socket_ctx;
    pthread_mutex_lock(&guard_mu);
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (g)
            g->used = 0;
        *socket_ctx = NULL;
        pthread_mutex_unlock(&guard_mu);
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    unsigned char src[9];
    if (!fd || !ad || !ad->client_addr || guard_src(ad->client_addr, src)) {
        pthread_mutex_unlock(&guard_mu);
        return;
    }
    for (size_t i = 0; i < SD_ARRAY_LEN(gconns); i++) {
        g = &gconns[i];
        if (g->used)
            continue;
        *g = (gconn_t){.used = 1, .fd = fd->connect_fd, .state = G_HEAD, .since = sd_mono_ms()};
        memcpy(g->src, src, sizeof src);
        *socket_ctx = g;
        break;
    }
    pthread_mutex_unlock(&guard_mu);
}

/* Moves conn's connection to state, restarting its clock. */
static void guard_move(struct MHD_Connection *conn, int state)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gconn_t *g = ci ? ci->socket_context : NULL;
    if (!g)
        return;
    pthread_mutex_lock(&guard_mu);
    g->state = state;
    g->since = sd_mono_ms();
    pthread_mutex_unlock(&guard_mu);
}

/* The answer is sent (MHD_OPTION_NOTIFY_COMPLETED): a kept-alive connection waits for
 * its next head. */
static void guard_completed(void *cls, struct MHD_Connection *conn, void **ctx,
                            enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)ctx;
    (void)toe;
    guard_move(conn, G_HEAD);
}

/* Closes the HEAD and BODY connections past their deadline, every 100 ms. */
static void *guard_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&guard_mu);
    while (!guard_stop) {
        int64_t now = sd_mono_ms();
        for (size_t i = 0; i < SD_ARRAY_LEN(gconns); i++) {
            gconn_t *g = &gconns[i];
            if (!g->used || g->evicted)
                continue;
            if (g->state == G_HEAD && now - g->since >= LOGS_HEADER_MS)
                guard_close(g, GR_HEADER_TIMEOUT);
            else if (g->state == G_BODY && now - g->since >= LOGS_BODY_MS)
                guard_close(g, GR_BODY_TIMEOUT);
        }
        struct timespec until = sd_timespec_after_ms(CLOCK_REALTIME, 100);
        pthread_cond_timedwait(&guard_cv, &guard_mu, &until);
    }
    pthread_mutex_unlock(&guard_mu);
    return NULL;
}

void bb_logsrv_metrics(sd_buf_t *b)
{
    sd_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", "bigbrother_logs_connections_refused_total",
                  "Logs port connections refused at accept, by reason.",
                  "bigbrother_logs_connections_refused_total");
    for (int r = GR_PER_SOURCE; r <= GR_FULL; r++)
        sd_buf_printf(b, "bigbrother_logs_connections_refused_total{reason=\"%s\"} %lld\n",
                      guard_reasons[r], (long long)atomic_load(&guard_counts[r]));
    sd_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", "bigbrother_logs_connections_closed_total",
                  "Logs port connections closed by eviction or a deadline, by reason.",
                  "bigbrother_logs_connections_closed_total");
    for (int r = GR_EVICTED; r < GR_N; r++)
        sd_buf_printf(b, "bigbrother_logs_connections_closed_total{reason=\"%s\"} %lld\n",
                      guard_reasons[r], (long long)atomic_load(&guard_counts[r]));
}

/* A request that declares a body (none is expected here). */
static int declares_body(struct MHD_Connection *conn)
{
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    return (cl && strcmp(cl, "0") != 0) ||
           MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Transfer-Encoding");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **ctx)
{
    (void)cls;
    (void)version;
    (void)upload_data;
    if (!*ctx) { /* the headers: wait for the (empty) body */
        *ctx = conn;
        guard_move(conn, G_BODY);
        if (!declares_body(conn))
            return MHD_YES;
        guard_move(conn, G_ANSWER);
        return text(conn, 413, "no body expected\n");
    }
    guard_move(conn, G_ANSWER);
    if (*upload_size)
        return text(conn, 413, "no body expected\n");
    if (!strcmp(method, "OPTIONS"))
        return preflight(conn);
    if (strcmp(method, "GET") != 0)
        return text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
    int health = !strcmp(url, "/v1/health") || !strncmp(url, "/v1/health/", 11);
    const char *id = health ? (url[10] ? url + 11 : NULL) : url + 9;
    if (health ? id && !sd_name_valid(id, SD_NAME_MAX)
               : strncmp(url, "/v1/logs/", 9) != 0 || !sd_name_valid(id, SD_NAME_MAX))
        return text(conn, MHD_HTTP_NOT_FOUND,
                    "GET /v1/logs/{instance}, /v1/health or /v1/health/{instance}\n");
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!auth || strncmp(auth, "Bearer ", 7) != 0 || !auth[7] || strlen(auth + 7) >= 256)
        return text(conn, MHD_HTTP_UNAUTHORIZED, "a bearer token is needed\n");
    if (!bb.cfg.urls)
        return text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                    "no ServerDir configured to check tokens with\n");
    if (health)
        return health_answer(conn, auth + 7, id);
    const char *ts = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "tail");
    const char *fs = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "follow");
    const char *ss = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "since_ms");
    const char *tss = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "timestamps");
    int64_t tail = TAIL_DEFAULT, since = 0;
    int all = ts && !strcmp(ts, "all");
    if (ts && !all && sd_parse_i64(ts, 0, TAIL_MAX, &tail))
        return text(conn, MHD_HTTP_BAD_REQUEST, "tail must be 0 to 10000, or all\n");
    if (fs && strcmp(fs, "0") && strcmp(fs, "1"))
        return text(conn, MHD_HTTP_BAD_REQUEST, "follow must be 0 or 1\n");
    if (ss && sd_parse_i64(ss, 1, SINCE_MAX_MS, &since))
        return text(conn, MHD_HTTP_BAD_REQUEST, "since_ms must be 1 to 2592000000 (30 days)\n");
    if (tss && strcmp(tss, "0") && strcmp(tss, "1"))
        return text(conn, MHD_HTTP_BAD_REQUEST, "timestamps must be 0 or 1\n");
    int live = 0, status = check_caller(auth + 7, id, &live);
    if (status != MHD_HTTP_OK)
        return text(conn, (unsigned)status,
                    status == MHD_HTTP_NOT_FOUND        ? "no such instance on this machine\n"
                    : status == MHD_HTTP_SERVICE_UNAVAILABLE ? "ServerDir cannot be reached\n"
                                                             : "not allowed\n");
    char path[600];
    run_t *r = calloc(1, sizeof *r);
    if (!r)
        return MHD_NO;
    r->ino = -1;
    sd_buf_init(&r->head, (size_t)16 << 20);
    sd_strlcpy(r->id, id, sizeof r->id);
    sd_strlcpy(r->token, auth + 7, sizeof r->token);
    r->follow = fs && !strcmp(fs, "1") && live;
    r->stamps = tss && !strcmp(tss, "1");
    r->line_start = 1;
    r->checked_ms = sd_mono_ms();
    struct stat st;
    if (bb_log_find(id, path, sizeof path) || !(r->f = fopen(path, "r")) ||
        fstat(fileno(r->f), &st)) {
        run_free(r);
        return text(conn, MHD_HTTP_NOT_FOUND, "no log of that instance here\n");
    }
    /* read to the run's end either way (a follower goes on from there); what was read
     * is sent unless tail=0 or since_ms says it is all older */
    int64_t written_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
    r->ended = bb_log_read_run(r->f, path, id, all ? 0 : tail ? (long)tail : 1, &r->head);
    if ((!all && tail == 0) || (since && sd_wall_ms() - written_ms > since))
        r->head.len = 0;
    else if (r->stamps)
        stamp_lines(&r->head, written_ms);
    if (r->follow && !r->ended) { /* without inotify, the wait is the timeout alone */
        r->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (r->ino >= 0 && inotify_add_watch(r->ino, path, IN_MODIFY) < 0) {
            close(r->ino);
            r->ino = -1;
        }
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, run_reader, r, run_free);
    if (!resp) {
        run_free(r);
        return MHD_NO;
    }
    cors(resp);
    MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    log_info("logs served", "instance=%s tail=%s follow=%d since_ms=%lld timestamps=%d", id,
             ts ? ts : "100", r->follow, (long long)since, r->stamps);
    return ret;
}

/* Stops the guard's deadline thread (after the daemon). */
static void guard_end(void)
{
    if (!guard_running)
        return;
    pthread_mutex_lock(&guard_mu);
    guard_stop = 1;
    pthread_cond_signal(&guard_cv);
    pthread_mutex_unlock(&guard_mu);
    pthread_join(guard_thread, NULL);
    guard_running = 0;
}

int bb_logsrv_start(void)
{
    if (!bb.cfg.logs_host[0])
        return 0;
    atomic_store(&stopping, 0);
    stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd < 0)
        return -errno;
    int fd = bb_listen_tcp(bb.cfg.logs_host, bb.cfg.logs_port);
    guard_stop = 0;
    if (fd >= 0 && pthread_create(&guard_thread, NULL, guard_main, NULL) != 0) {
        close(fd);
        fd = -EAGAIN;
    }
    guard_running = fd >= 0;
    if (fd < 0) {
        close(stop_fd);
        stop_fd = -1;
        log_error("logs port not opened", "listen=%s port=%d error=%s", bb.cfg.logs_host,
                  bb.cfg.logs_port, strerror(-fd));
        return fd;
    }
    logsd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                 MHD_USE_ERROR_LOG,
                             0, guard_admit, NULL, on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)SD_ARRAY_LEN(gconns),
                             MHD_OPTION_NOTIFY_CONNECTION, guard_notify, NULL,
                             MHD_OPTION_NOTIFY_COMPLETED, guard_completed, NULL,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)0, MHD_OPTION_END);
    if (!logsd) {
        guard_end();
        close(fd);
        close(stop_fd);
        stop_fd = -1;
        log_error("logs server not started", "listen=%s port=%d", bb.cfg.logs_host,
                  bb.cfg.logs_port);
        return -EIO;
    }
    log_info("logs served", "listen=%s port=%d path=%s", bb.cfg.logs_host, bb.cfg.logs_port,
             "/v1/logs/{instance}");
    return 0;
}

void bb_logsrv_stop(void)
{
    if (logsd) {
        atomic_store(&stopping, 1);
        uint64_t one = 1;
        if (write(stop_fd, &one, sizeof one) != (ssize_t)sizeof one)
            log_warn("logs followers not woken", "error=%s", strerror(errno));
        MHD_stop_daemon(logsd);
        logsd = NULL;
        guard_end();
        close(stop_fd);
        stop_fd = -1;
    }
}
