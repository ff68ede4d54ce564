/* Issue 28 finding 6: bigbrother's logs port (logs_listen) had 16 connection threads and
 * no deadline, so 16 idle connections with partial headers blocked every operator for as
 * long as they stayed, and a request that declared a body and never sent it hung. A REAL
 * bigbrother (one gameproc instance, "steady") with its logs port and metrics port, on a
 * serverdir and redis-server:
 *
 *   - with a follow of the instance's log streaming, 10 half-open connections from one
 *     source (8 admitted: the per-source limit) and 20 from five others (4 each): an
 *     operator's GET /v1/health still answers 200 at once (the oldest half-open ones are
 *     evicted), the header deadline (5 s) closes the rest, and the follow still streams;
 *   - a request declaring a body it never sends is answered 413 at once.
 * The metrics count the refusals, evictions and deadline closes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness_bigbrother.h"
#include "harness_stack.h"

#define HEADER_MS 5000 /* logsrv.c LOGS_HEADER_MS */

static h_redis_t redis;
static h_serverdir_t sd;
static bbt_t bb;
static int logs_port, metrics_port;
static char inst[160];

/* h_wait_until condition: ServerDir records inst ready (bigbrother reported it). */
static int known_ready(void *arg)
{
    (void)arg;
    h_resp_t r;
    if (h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/clusters/c1/processes/%s", inst))
        return 0;
    int ok = r.status == 200 && strstr(r.body, "\"state\":\"ready\"") != NULL;
    h_resp_free(&r);
    return ok;
}

static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd, NULL))
        return -1;
    logs_port = h_free_port();
    metrics_port = h_free_port();
    char extra[512], svc[1024];
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"}, \"address\": "
             "\"127.0.0.1\", \"logs_listen\": \"127.0.0.1:%d\", \"metrics_listen\": "
             "\"127.0.0.1:%d\"",
             sd.url, H_TOK_BB, logs_port, metrics_port);
    snprintf(svc, sizeof svc,
             "[{\"name\": \"steady\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\"],"
             " \"count\": 1, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000},"
             " \"stop\": {\"grace_ms\": 2000}, \"cwd\": \"%s\"}]",
             GAMEPROC, h_tmpdir());
    bbt_config(&bb, svc, extra);
    if (bbt_start(&bb) <= 0)
        return -1;
    json_t *st = bbt_wait(&bb, "steady", 0, "ready", 1, h_ms(10000));
    if (!st)
        return -1;
    snprintf(inst, sizeof inst, "%s", bbt_str(st, "instance"));
    json_decref(st);
    /* the logs port asks ServerDir about the instance: wait until it knows it ready */
    return h_wait_until(known_ready, NULL, h_ms(10000)) ? 0 : -1;
}

static int teardown(void **state)
{
    bbt_stop(&bb, 3000);
    return h_stack_teardown(state);
}

/* A connection to the logs port from 127.0.0.<octet>; -1 when connect fails. */
static int connect_from(int octet)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in src = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(0x7f000000u | (unsigned)octet);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)logs_port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&src, sizeof src) || connect(fd, (struct sockaddr *)&dst, sizeof dst)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads what fd has without waiting: 1 when the peer closed it, 0 when it is open (what
 * was waiting is appended to buf, up to cap). */
static int drained_closed(int fd, char *buf, size_t cap)
{
    size_t len = strlen(buf);
    for (;;) {
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return 1;
        if (n < 0)
            return 0;
        size_t k = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
        memcpy(buf + len, tmp, k);
        len += k;
        buf[len] = '\0';
    }
}

/* One whole request on a new connection from 127.0.0.1; what came back within
 * timeout_ms (the answer closes the connection). */
static void request(const char *req, char *out, size_t cap, int timeout_ms)
{
    int fd = connect_from(1);
    assert_true(fd >= 0);
    assert_int_equal(h_send_all(fd, req, strlen(req)), 0);
    int closed = 0;
    h_read_until_close(fd, out, cap, timeout_ms, &closed);
    close(fd);
}

static void half_open_connections_do_not_block_operators(void **state)
{
    (void)state;
    char req[512], got[8192] = "";
    /* a follow of the instance's log: streaming, it must outlive everything below */
    int follow = connect_from(1);
    assert_true(follow >= 0);
    snprintf(req, sizeof req,
             "GET /v1/logs/%s?follow=1&tail=5 HTTP/1.1\r\nHost: x\r\n"
             "Authorization: Bearer " H_TOK_VIEWER "\r\n\r\n", inst);
    assert_int_equal(h_send_all(follow, req, strlen(req)), 0);
    for (int64_t end = h_now_ms() + h_ms(5000); !strstr(got, "\r\n\r\n") && h_now_ms() < end;) {
        assert_false(drained_closed(follow, got, sizeof got));
        h_sleep_ms(20);
    }
    assert_non_null(strstr(got, "HTTP/1.1 200"));

    /* 30 half-open connections: 10 from .7 (2 over its limit), then 4 from each of
     * .2-.6 (over the total: the oldest are evicted) */
    static const char partial[] = "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    static const int from[] = {7, 2, 3, 4, 5, 6};
    int fds[30], n = 0;
    for (size_t k = 0; k < sizeof from / sizeof from[0]; k++)
        for (int i = 0, o = from[k]; i < (o == 7 ? 10 : 4); i++) {
            int fd = connect_from(o);
            assert_true(fd >= 0);
            (void)send(fd, partial, sizeof partial - 1, MSG_NOSIGNAL);
            fds[n++] = fd;
        }
    h_sleep_ms(200);

    /* the operator gets in at once */
    char out[8192];
    int64_t t0 = h_now_ms();
    request("GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " H_TOK_VIEWER
            "\r\nConnection: close\r\n\r\n",
            out, sizeof out, h_ms(3000));
    int64_t took = h_now_ms() - t0;
    print_message("operator's /v1/health behind 30 half-open connections: %lld ms, %.12s\n",
                  (long long)took, out);
    assert_non_null(strstr(out, "HTTP/1.1 200"));

    /* past the header deadline every half-open connection is closed, the follow is not */
    h_sleep_ms(HEADER_MS + h_ms(1000));
    int still_open = 0;
    for (int i = 0; i < n; i++) {
        char junk[64] = "";
        still_open += !drained_closed(fds[i], junk, sizeof junk);
        close(fds[i]);
    }
    assert_int_equal(still_open, 0);
    assert_false(drained_closed(follow, got, sizeof got));
    close(follow);

    char murl[64];
    snprintf(murl, sizeof murl, "http://127.0.0.1:%d", metrics_port);
    assert_true(h_metric(murl, "bigbrother_logs_connections_refused_total{reason=\"per_source\"}") >= 2);
    assert_true(h_metric(murl, "bigbrother_logs_connections_closed_total{reason=\"evicted\"}") >= 1);
    assert_true(h_metric(murl, "bigbrother_logs_connections_closed_total{reason=\"header_timeout\"}") >= 1);
}

/* A request declaring a body is answered 413 at once (none is expected), even when the
 * body never comes. */
static void declared_body_never_sent_answered(void **state)
{
    (void)state;
    char out[4096];
    int64_t t0 = h_now_ms();
    request("GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " H_TOK_VIEWER
            "\r\nContent-Length: 10\r\n\r\n",
            out, sizeof out, h_ms(3000));
    print_message("declared body never sent: %lld ms, %.12s\n", (long long)(h_now_ms() - t0), out);
    assert_non_null(strstr(out, "HTTP/1.1 413"));
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(half_open_connections_do_not_block_operators),
        cmocka_unit_test(declared_body_never_sent_answered),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
