/* Issue 28 finding 5: a flood of idle and half-sent connections without a token must not
 * silence serverdir. One REAL serverdir, under a notify socket this test binds as systemd
 * would (see it_sdnotify.c), with the connection limits set low so that hundreds of
 * connections show what thousands would:
 *
 *   max_connections 200, max_connections_per_source 40, header and body deadlines 1.5 s,
 *   master.trusted_proxies ["127.0.0.13"] (exempt from the per-source limit).
 *
 * The flood comes from 127.0.0.2-11 (10 sources, 40 each: 400 > 200, so the total limit
 * evicts) and 127.0.0.12 (60: 20 over its limit), refilled for 3 s as the server closes
 * them; half send nothing, half a partial request head. Meanwhile /healthz and an
 * authenticated request from 127.0.0.1 answer within a bound, and the watchdog is fed
 * without a gap (the old self-check sent GET /healthz to its own listener, which the full
 * connection table refused). Then a slowloris (a header byte every 200 ms) is closed by
 * the header deadline while it still sends, and a request whose declared body never
 * comes by the body deadline; with all 200 connections receiving such bodies, a newcomer
 * evicts the oldest (the old code kept both for conn_timeout_s, 30 s, from the
 * last byte). The metrics show each refusal and close. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define WATCHDOG_USEC 1000000 /* a ping every 500 ms; systemd acts after 1 s without */
#define HEADER_MS 1500
#define FLOOD_MAX 600         /* flood sockets held at once by this test */

static h_redis_t redis;
static pid_t sd_pid;
static int sd_port;
static char sd_url[64];
static int nfd = -1; /* the notify socket */
static char nsock_path[300];

/* ---------- the notify socket (as it_sdnotify.c) ---------- */

static void nsock_open(void)
{
    snprintf(nsock_path, sizeof nsock_path, "%s/conn-notify.sock", h_tmpdir());
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(nsock_path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, nsock_path, strlen(nsock_path) + 1);
    nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(nfd >= 0);
    assert_int_equal(bind(nfd, (struct sockaddr *)&sa, sizeof sa), 0);
    int one = 1; /* each message's arrival time, so gaps do not depend on when it is read */
    assert_int_equal(setsockopt(nfd, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one), 0);
}

/* Watchdog pings seen: how many, the arrival of the last (wall ms), the longest gap. */
typedef struct {
    int n;
    int64_t last, max_gap;
} pings_t;

/* Reads every queued notify message: counts WATCHDOG=1 into p (when not NULL) by arrival
 * time, and sets *ready when one holds READY=1. */
static void nsock_drain(pings_t *p, int *ready)
{
    char buf[1200];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(struct timeval))];
    } ctl;
    for (;;) {
        struct iovec iov = {buf, sizeof buf - 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl,
                            .msg_controllen = sizeof ctl};
        ssize_t n = recvmsg(nfd, &mh, 0);
        if (n <= 0)
            return;
        buf[n] = '\0';
        if (ready && strstr(buf, "READY=1"))
            *ready = 1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        if (!p || !strstr(buf, "WATCHDOG=1") || !c || c->cmsg_type != SCM_TIMESTAMP)
            continue;
        struct timeval tv;
        memcpy(&tv, CMSG_DATA(c), sizeof tv);
        int64_t at = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
        if (p->n++ && at - p->last > p->max_gap)
            p->max_gap = at - p->last;
        p->last = at;
    }
}

static int64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* ---------- setup ---------- */

static int setup(void **state)
{
    (void)state;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 2048 && rl.rlim_max >= 2048) {
        rl.rlim_cur = 2048;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (h_redis_start(&redis)) {
        print_error("redis-server did not start\n");
        return -1;
    }
    nsock_open();
    sd_port = h_free_port();
    char listen[64], env_sock[400], env_wd[64], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", sd_port);
    snprintf(sd_url, sizeof sd_url, "http://127.0.0.1:%d", sd_port);
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", nsock_path);
    snprintf(env_wd, sizeof env_wd, "WATCHDOG_USEC=%d", WATCHDOG_USEC);
    snprintf(log, sizeof log, "%s/serverdir-conn.log", h_tmpdir());
    const char *cfg = h_write_file(
        h_tmpdir(), "conn.json",
        "{\"max_connections\": 200, \"max_connections_per_source\": 40,"
        " \"header_timeout_ms\": 1500, \"body_timeout_ms\": 1500, \"threads\": 2,"
        " \"directory\": {\"series_interval_ms\": 0},"
        " \"master\": {\"trusted_proxies\": [\"127.0.0.13\"]}}",
        0600);
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis.url,
                          "--tokens", h_tokens_file(), "--config", cfg, NULL};
    const char *env[] = {env_sock, env_wd, NULL};
    sd_pid = h_spawn(argv, log, env);
    if (sd_pid <= 0)
        return -1;
    int ready = 0;
    for (int64_t end = h_now_ms() + h_ms(10000); !ready && h_now_ms() < end;) {
        nsock_drain(NULL, &ready);
        h_sleep_ms(20);
    }
    if (!ready)
        print_error("serverdir sent no READY=1 (log: %s)\n", log);
    return ready ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    h_stop(sd_pid, 10000);
    if (nfd >= 0)
        close(nfd);
    h_redis_stop(&redis);
    return 0;
}

/* ---------- clients ---------- */

/* A connection to serverdir from 127.0.0.<octet>; -1 when connect fails. */
static int connect_from(int octet)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    /* a full accept queue makes connect wait for a SYN retry (1 s): bounded */
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in src = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(0x7f000000u | (unsigned)octet);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sd_port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&src, sizeof src) || connect(fd, (struct sockaddr *)&dst, sizeof dst)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 when the server has closed fd (EOF, reset, or hang-up), without waiting. */
static int closed_by_server(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    char c;
    return (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) || recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

typedef struct {
    int fd[FLOOD_MAX];
    int octet[FLOOD_MAX];
    int n;
    long opened, refused_now; /* connections opened; closed at once (refused at accept) */
} flood_t;

/* Closes the flood connections the server closed; returns how many. */
static int flood_reap(flood_t *f)
{
    int gone = 0;
    for (int i = 0; i < f->n;) {
        if (closed_by_server(f->fd[i])) {
            close(f->fd[i]);
            f->fd[i] = f->fd[--f->n];
            f->octet[i] = f->octet[f->n];
            gone++;
        } else {
            i++;
        }
    }
    return gone;
}

/* Opens up to `want` flood connections from octet (half of them send a partial head). */
static void flood_open(flood_t *f, int octet, int want)
{
    static const char partial[] = "GET /v1/clusters HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (int i = 0; i < want && f->n < FLOOD_MAX; i++) {
        int fd = connect_from(octet);
        if (fd < 0)
            continue;
        if ((f->opened++ & 1) && send(fd, partial, sizeof partial - 1, MSG_NOSIGNAL) < 0) {
            close(fd);
            continue;
        }
        f->octet[f->n] = octet;
        f->fd[f->n++] = fd;
    }
}

static int count_from(const flood_t *f, int octet)
{
    int n = 0;
    for (int i = 0; i < f->n; i++)
        n += f->octet[i] == octet;
    return n;
}

/* Tops every flood source up to its count (40 from .2-.11, 60 from .12). */
static void flood_fill(flood_t *f)
{
    for (int o = 2; o <= 12; o++) {
        int want = (o == 12 ? 60 : 40) - count_from(f, o);
        if (want > 0)
            flood_open(f, o, want);
    }
}

static void flood_close(flood_t *f)
{
    for (int i = 0; i < f->n; i++)
        close(f->fd[i]);
    f->n = 0;
}

/* GET path with token (or NULL); the status, and its time in *ms. */
static long timed_get(const char *path, const char *token, int64_t *ms)
{
    char url[160];
    snprintf(url, sizeof url, "%s%s", sd_url, path);
    h_resp_t r;
    int64_t t0 = h_now_ms();
    long st = h_http("GET", url, token, NULL, NULL, 0, NULL, &r) ? -1 : r.status;
    *ms = h_now_ms() - t0;
    if (st >= 0)
        h_resp_free(&r);
    return st;
}

/* ---------- tests ---------- */

/* The flood is held for 3 s (refilled every 100 ms as the server closes connections):
 * /healthz and an ops request answer, each within 1 s, and the watchdog gets its pings. */
static void flood_leaves_room_for_clients_and_watchdog(void **state)
{
    (void)state;
    static flood_t f;
    pings_t p = {0};
    nsock_drain(&p, NULL);
    p = (pings_t){.n = 1, .last = wall_ms()}; /* gaps count from the flood's start */
    int64_t start = h_now_ms(), worst_health = 0, worst_ops = 0;
    int rounds = 0, bad = 0;
    while (h_now_ms() - start < 3000 && rounds < 100) {
        flood_reap(&f);
        flood_fill(&f);
        int64_t ms;
        if (timed_get("/healthz", NULL, &ms) != 200)
            bad++;
        worst_health = ms > worst_health ? ms : worst_health;
        if (timed_get("/v1/clusters", H_TOK_OPS, &ms) != 200)
            bad++;
        worst_ops = ms > worst_ops ? ms : worst_ops;
        nsock_drain(&p, NULL);
        rounds++;
        h_sleep_ms(100);
    }
    nsock_drain(&p, NULL);
    if (wall_ms() - p.last > p.max_gap)
        p.max_gap = wall_ms() - p.last;
    print_message("flood: %d rounds, %ld connections opened, %d held at the end; failed "
                  "requests %d, slowest /healthz %lld ms, /v1/clusters %lld ms; %d watchdog "
                  "pings, longest gap %lld ms\n",
                  rounds, f.opened, f.n, bad, (long long)worst_health, (long long)worst_ops,
                  p.n - 1, (long long)p.max_gap);
    flood_close(&f);
    assert_int_equal(bad, 0);
    assert_true(worst_health < h_ms(1000));
    assert_true(worst_ops < h_ms(1000));
    assert_true(p.n - 1 >= 3);
    assert_true(p.max_gap < WATCHDOG_USEC / 1000);
    assert_true(h_metric(sd_url, "serverdir_http_connections_refused_total{reason=\"per_source\"}") > 0);
    assert_true(h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"evicted_idle\"}") > 0);
}

/* With every connection receiving the body of an unauthenticated request (a public POST
 * whose declared body never comes), a newcomer evicts the oldest of them: /healthz still
 * answers. 200 of them from 127.0.0.14-18 (40 each), all within the body deadline. */
static void unauthenticated_bodies_evicted_at_the_limit(void **state)
{
    (void)state;
    static const char head[] = "POST /v1/master/heartbeat HTTP/1.1\r\nHost: x\r\n"
                               "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    long before = h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"evicted_unauthenticated\"}");
    static flood_t f;
    for (int o = 14; o <= 18; o++)
        for (int i = 0; i < 40; i++) {
            int fd = connect_from(o);
            if (fd < 0)
                continue;
            if (h_send_all(fd, head, sizeof head - 1)) {
                close(fd);
                continue;
            }
            f.fd[f.n++] = fd;
        }
    h_sleep_ms(200); /* every head read: no connection waits for one */
    int64_t ms;
    long st = timed_get("/healthz", NULL, &ms);
    long after = h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"evicted_unauthenticated\"}");
    print_message("%d unauthenticated bodies pending: /healthz %ld in %lld ms, %ld evicted\n", f.n,
                  st, (long long)ms, after - before);
    flood_close(&f);
    assert_int_equal(st, 200);
    assert_true(ms < h_ms(1000));
    assert_true(after > before);
}

/* A trusted proxy (master.trusted_proxies) may open more than the per-source limit. */
static void trusted_proxy_exempt_from_per_source(void **state)
{
    (void)state;
    long before = h_metric(sd_url, "serverdir_http_connections_refused_total{reason=\"per_source\"}");
    static flood_t f;
    flood_open(&f, 13, 60);
    h_sleep_ms(200);
    int gone = flood_reap(&f);
    flood_close(&f);
    assert_int_equal(gone, 0);
    assert_int_equal(h_metric(sd_url, "serverdir_http_connections_refused_total{reason=\"per_source\"}"),
                     before);
}

/* Waits up to limit_ms for the server to close fd, sending one byte of `drip` every
 * 200 ms meanwhile when drip is not NULL. The ms it took, or -1 when still open. */
static int64_t closed_within(int fd, const char *drip, int limit_ms)
{
    int64_t t0 = h_now_ms(), next = t0;
    for (int i = 0; h_now_ms() - t0 < limit_ms; i++) {
        if (drip && h_now_ms() >= next) {
            if (send(fd, drip + (i % strlen(drip)), 1, MSG_NOSIGNAL) < 0)
                return h_now_ms() - t0;
            next += 200;
        }
        if (closed_by_server(fd))
            return h_now_ms() - t0;
        h_sleep_ms(20);
    }
    return -1;
}

/* A request head sent a byte every 200 ms is closed by the header deadline (1.5 s after
 * the connection opened), however steadily it sends. */
static void slowloris_closed_by_header_timeout(void **state)
{
    (void)state;
    long before = h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"header_timeout\"}");
    int fd = connect_from(1);
    assert_true(fd >= 0);
    static const char head[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    assert_int_equal(h_send_all(fd, head, sizeof head - 1), 0);
    int64_t took = closed_within(fd, "X-Drip: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n", 5000);
    close(fd);
    print_message("slowloris closed after %lld ms\n", (long long)took);
    assert_true(took >= HEADER_MS - 300);
    assert_true(took >= 0 && took < HEADER_MS + h_ms(1000));
    assert_true(h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"header_timeout\"}") > before);
}

/* A public POST whose declared body never comes is closed by the body deadline. */
static void unsent_body_closed_by_body_timeout(void **state)
{
    (void)state;
    long before = h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"body_timeout\"}");
    int fd = connect_from(1);
    assert_true(fd >= 0);
    static const char req[] = "POST /v1/master/heartbeat HTTP/1.1\r\nHost: x\r\n"
                              "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    assert_int_equal(h_send_all(fd, req, sizeof req - 1), 0);
    int64_t took = closed_within(fd, NULL, 5000);
    close(fd);
    print_message("unsent body closed after %lld ms\n", (long long)took);
    assert_true(took >= 0 && took < HEADER_MS + h_ms(1000));
    assert_true(h_metric(sd_url, "serverdir_http_connections_closed_total{reason=\"body_timeout\"}") > before);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flood_leaves_room_for_clients_and_watchdog),
        cmocka_unit_test(unauthenticated_bodies_evicted_at_the_limit),
        cmocka_unit_test(trusted_proxy_exempt_from_per_source),
        cmocka_unit_test(slowloris_closed_by_header_timeout),
        cmocka_unit_test(unsent_body_closed_by_body_timeout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
