/* Security checks against the real daemons (README, "Security checks"). The authorization
 * matrix is it_authz.c; spoofed master heartbeats (unknown/reused/foreign challenges,
 * address in the body, X-Forwarded-For from an untrusted peer) are it_master_rest.c
 * (spoofed_heartbeats_rejected, forwarded_for_only_from_trusted); an agent speaking for
 * another process's instance is it_bbctl.c (agent_with_another_instance_id_is_rejected).
 * Here:
 *   - oversized requests: a huge Content-Length is answered 413 (401 without a token)
 *     at once, without the body ever being sent;
 *   - slowloris: connections dribbling headers are closed after conn_timeout_s while
 *     other clients are served promptly;
 *   - path traversal and bad names in lock/blob keys, cluster, machine and service
 *     names (.., %2e%2e, encoded '/', NUL, very long) are refused with 400 and change
 *     nothing in Redis;
 *   - token and config files readable by others are warned about at start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness_bigbrother.h"
#include "harness.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* Slow margins under valgrind; the box is shared and loaded. */
static int slack(int ms) { return h_valgrind() ? ms * 5 : ms; }

/* cmocka group setup: redis-server, and serverdir on it closing idle connections
 * after 2 s. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, &(h_sd_opts_t){.config = "{\"conn_timeout_s\": 2}"});
}

/* A raw connection to the test's serverdir. */
static int raw_connect(void)
{
    int fd = h_tcp_connect(sd.port);
    assert_true(fd >= 0);
    return fd;
}

static void send_all(int fd, const char *s, size_t n) { assert_int_equal(h_send_all(fd, s, n), 0); }

/* Sends only the head of a request declaring a huge body and returns the status line's
 * code and how long the answer and close took; the body is never sent. */
static int huge_declared(const char *method, const char *path, const char *token,
                         const char *ctype, const char *length, int64_t *took_ms, char *body,
                         size_t cap)
{
    int fd = raw_connect();
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%sContent-Type: %s\r\n"
                     "Lock-Seq: 1\r\nBlob-Seq: 1\r\nContent-Length: %s\r\n\r\n",
                     method, path, token ? "Authorization: Bearer " : "", token ? token : "",
                     token ? "\r\n" : "", ctype, length);
    int64_t t0 = h_now_ms();
    send_all(fd, head, (size_t)n);
    char buf[8192];
    int closed;
    h_read_until_close(fd, buf, sizeof buf, slack(3000), &closed);
    *took_ms = h_now_ms() - t0;
    close(fd);
    int code = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        code = -1;
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
    return code;
}

static void oversized_requests_refused_before_the_body(void **state)
{
    (void)state;
    char body[4096];
    h_keys_t before, after;
#define OVERSIZED_SCOPE H_KEYS_LOCKS, H_KEYS_CLUSTER("c1"), H_KEYS_MASTER
    h_keys_take(&redis, &before, OVERSIZED_SCOPE, NULL);
    static const struct {
        const char *method, *path, *token, *ctype, *length;
        int want;
        const char *code;
    } cases[] = {
        {"PUT", "/v1/blobs/player1", H_TOK_GAME, "application/octet-stream", "10000000000", 413,
         "too_large"},
        {"PUT", "/v1/locks/player1", H_TOK_GAME, "application/json", "1073741824", 413,
         "too_large"},
        {"POST", "/v1/clusters/c1/events", H_TOK_BB, "application/json", "999999999999", 413,
         "too_large"},
        {"PUT", "/v1/clusters/c1/services/zone", H_TOK_OPS, "application/json", "50000000", 413,
         "too_large"},
        {"POST", "/v1/master/heartbeat", NULL, "application/json", "1073741824", 413,
         "too_large"},
        /* no token: refused by auth before the length even matters */
        {"PUT", "/v1/blobs/player1", NULL, "application/octet-stream", "10000000000", 401,
         "unauthorized"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t took;
        int code = huge_declared(cases[i].method, cases[i].path, cases[i].token, cases[i].ctype,
                                 cases[i].length, &took, body, sizeof body);
        printf("%s %s length=%s -> %d in %lld ms\n", cases[i].method, cases[i].path,
               cases[i].length, code, (long long)took);
        assert_int_equal(code, cases[i].want);
        assert_non_null(strstr(body, cases[i].code));
        assert_true(took < slack(2000));
    }
    h_keys_take(&redis, &after, OVERSIZED_SCOPE, NULL);
#undef OVERSIZED_SCOPE
    h_keys_same(&before, &after, __func__);
}

static int healthz_ms(void)
{
    h_resp_t r;
    int64_t t0 = h_now_ms();
    if (h_http_json("GET", sd.url, NULL, NULL, &r, "/healthz"))
        return -1;
    int ok = r.status == 200;
    h_resp_free(&r);
    return ok ? (int)(h_now_ms() - t0) : -1;
}

#define NSLOW 48

/* Slowloris: NSLOW connections send an incomplete header block and dribble a byte now and
 * then, then go quiet. Other clients are served promptly the whole time, and every slow
 * connection is closed by serverdir about conn_timeout_s (2 s) after its last byte. */
static void slowloris_times_out_others_served(void **state)
{
    (void)state;
    int fds[NSLOW];
    for (int i = 0; i < NSLOW; i++) {
        fds[i] = raw_connect();
        static const char part[] = "GET /v1/clusters/c1/processes HTTP/1.1\r\nHost: x\r\nX-Slow: ";
        send_all(fds[i], part, sizeof part - 1);
    }
    int worst = 0;
    for (int round = 0; round < 4; round++) {
        h_sleep_ms(400); /* the trickle's pace is what is tested */
        for (int i = 0; i < NSLOW; i++)
            send_all(fds[i], "a", 1);
        int ms = healthz_ms();
        assert_true(ms >= 0);
        if (ms > worst)
            worst = ms;
    }
    int64_t last_byte = h_now_ms();
    /* other clients, including authenticated API reads, are served while they wait */
    for (int i = 0; i < 5; i++) {
        int ms = healthz_ms();
        assert_true(ms >= 0);
        if (ms > worst)
            worst = ms;
        h_resp_t r;
        assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                                     "/v1/clusters/c1/processes"), 0);
        assert_int_equal(r.status, 200);
        h_resp_free(&r);
    }
    printf("slowloris: %d slow connections, worst healthz while they dribble %d ms\n", NSLOW,
           worst);
    assert_true(worst < slack(1000));

    int closed_all = 1;
    int64_t first_close = -1, last_close = 0;
    for (int i = 0; i < NSLOW; i++) {
        char buf[2048];
        int closed;
        int64_t left = last_byte + slack(12000) - h_now_ms();
        h_read_until_close(fds[i], buf, sizeof buf, left > 0 ? (int)left : 0, &closed);
        if (!closed)
            closed_all = 0;
        int64_t at = h_now_ms() - last_byte;
        if (first_close < 0)
            first_close = at;
        last_close = at;
        close(fds[i]);
    }
    printf("slowloris: all closed=%d, first after %lld ms, last after %lld ms\n", closed_all,
           (long long)first_close, (long long)last_close);
    assert_true(closed_all);
    /* closed by the idle timeout, not at once */
    assert_true(first_close >= 1000);
    assert_true(healthz_ms() >= 0);
}

/* One raw request (the path is sent exactly as given: no client-side normalization of
 * dot segments or escapes). Returns the status code. */
static int raw_request(const char *method, const char *path, const char *token,
                       const char *extra_headers, const char *body)
{
    int fd = raw_connect();
    char *req = NULL;
    int n = asprintf(&req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Authorization: Bearer %s\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, token, extra_headers ? extra_headers : "",
                     extra_headers ? "application/octet-stream" : "application/json",
                     body ? strlen(body) : 0, body ? body : "");
    assert_true(n > 0);
    send_all(fd, req, (size_t)n);
    free(req);
    char buf[8192];
    int closed;
    h_read_until_close(fd, buf, sizeof buf, slack(5000), &closed);
    close(fd);
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        code = -1;
    return code;
}

/* Every bad name in every name position is refused, and Redis is byte-for-byte the same
 * afterwards. */
static void bad_names_refused_without_change(void **state)
{
    (void)state;
    static char longname[400];
    memset(longname, 'a', sizeof longname - 1);
    /* libmicrohttpd decodes the path before routing: an encoded '/' splits the segment,
     * so those match no route (404 not_found) and never reach a handler; an encoded NUL
     * is kept as "%00" (http.c) and, like everything else, fails the name check (400). */
    static const struct {
        const char *name;
        int want;
    } bad[] = {{"..", 400}, {"%2e%2e", 400}, {"%2E%2E", 400}, {".", 400}, {"a%5c..", 400},
               {"a%20b", 400}, {"a%09b", 400}, {"%c3%a9", 400}, {longname, 400},
               {"..%2f..%2fetc", 404}, {"a%2Fb", 404}, {"a%2fb", 404}, {"%2f", 404},
               {"%2e%2e%2f%2e%2e", 404}, {"a%00b", 400}, {"%00", 400}};
    const size_t nbad = sizeof bad / sizeof bad[0];
    const char *lock_body = "{\"holder\": \"h1\"}";
    const char *svc_body = "{\"command\": \"/bin/lobby\", \"count\": 1}";
    const char *machine_body = "{\"address\": \"10.0.0.5\", \"ttl_ms\": 60000}";
    const char *blob_hdrs = "Lock-Seq: 1\r\nBlob-Seq: 1\r\n";

    /* controls: the same requests with good names are accepted */
    assert_int_equal(raw_request("PUT", "/v1/locks/good", H_TOK_GAME, NULL, lock_body), 200);
    assert_int_equal(raw_request("PUT", "/v1/clusters/c1/services/good", H_TOK_OPS, NULL, svc_body),
                     200);
    assert_int_equal(raw_request("PUT", "/v1/clusters/c1/machines/good", H_TOK_BB, NULL,
                                 machine_body), 200);

    /* a bad name could create a key of any name, or write a lock's */
    h_keys_t before, after, locks0, locks1;
    h_keys_take(&redis, &before, "*", NULL);
    h_keys_take(&redis, &locks0, H_KEYS_LOCKS, NULL);
    int failures = 0;
    for (size_t i = 0; i < nbad; i++) {
        char path[600];
        struct {
            const char *method, *pre, *post, *token, *hdrs, *body;
        } reqs[] = {
            {"PUT", "/v1/locks/", "", H_TOK_GAME, NULL, lock_body},
            {"GET", "/v1/locks/", "", H_TOK_GAME, NULL, NULL},
            {"POST", "/v1/locks/", "/renew", H_TOK_GAME, NULL, lock_body},
            {"PUT", "/v1/blobs/", "", H_TOK_GAME, blob_hdrs, "data"},
            {"GET", "/v1/blobs/", "", H_TOK_GAME, NULL, NULL},
            {"PUT", "/v1/clusters/c1/services/", "", H_TOK_OPS, NULL, svc_body},
            {"GET", "/v1/clusters/c1/services/", "", H_TOK_OPS, NULL, NULL},
            {"PUT", "/v1/clusters/", "/services/good", H_TOK_OPS, NULL, svc_body},
            {"PUT", "/v1/clusters/c1/machines/", "", H_TOK_BB, NULL, machine_body},
            {"PUT", "/v1/clusters/", "/machines/good", H_TOK_BB, NULL, machine_body},
            {"GET", "/v1/clusters/", "/processes", H_TOK_VIEWER, NULL, NULL},
        };
        for (size_t j = 0; j < sizeof reqs / sizeof reqs[0]; j++) {
            snprintf(path, sizeof path, "%s%s%s", reqs[j].pre, bad[i].name, reqs[j].post);
            int code = raw_request(reqs[j].method, path, reqs[j].token, reqs[j].hdrs, reqs[j].body);
            if (code != bad[i].want) {
                printf("NOT REFUSED: %s %.80s -> %d, want %d\n", reqs[j].method, path, code,
                       bad[i].want);
                failures++;
            }
        }
    }
    /* a literal '/' or dot segment splits the path: no route matches it at all */
    assert_int_equal(raw_request("PUT", "/v1/locks/../blobs/x", H_TOK_GAME, NULL, lock_body), 404);
    assert_int_equal(raw_request("PUT", "/v1/locks/a/b", H_TOK_GAME, NULL, lock_body), 404);
    h_keys_take(&redis, &after, "*", NULL);
    h_keys_take(&redis, &locks1, H_KEYS_LOCKS, NULL);
    assert_int_equal(failures, 0);
    h_keys_same_names(&before, &after, "requests with bad names");
    h_keys_same(&locks0, &locks1, "requests with bad names");
}

static int file_has(const char *path, const char *needle) { return bbt_file_has(path, needle); }

/* serverdir warns once at start (and on reload) when its token file is readable by
 * others; 0600, and 0640 (readable by the service's own group, the packaged layout),
 * give no warning. */
static void unsafe_token_file_warned(void **state)
{
    (void)state;
    const char *dir = h_tmpdir();
    const char *text = "ops " H_TOK_OPS "\n";
    const char *open_file = h_write_file(dir, "tokens-0644", text, 0644);
    h_serverdir_t s1;
    assert_int_equal(h_serverdir_start(&s1, redis.url, open_file, NULL), 0);
    h_serverdir_stop(&s1);
    assert_true(file_has(s1.log, "token file is readable by others"));
    assert_true(file_has(s1.log, "mode=644"));

    const char *closed_file = h_write_file(dir, "tokens-0600", text, 0600);
    h_serverdir_t s2;
    assert_int_equal(h_serverdir_start(&s2, redis.url, closed_file, NULL), 0);
    h_serverdir_stop(&s2);
    assert_false(file_has(s2.log, "readable by others"));

    const char *group_file = h_write_file(dir, "tokens-0640", text, 0640);
    h_serverdir_t s3;
    assert_int_equal(h_serverdir_start(&s3, redis.url, group_file, NULL), 0);
    h_serverdir_stop(&s3);
    assert_false(file_has(s3.log, "readable by others"));
}

/* bigbrother warns when its config holds a serverdir token and others can read it. */
static void unsafe_bigbrother_config_warned(void **state)
{
    (void)state;
    bbt_t b = {0};
    bbt_config(&b, "[]",
               ", \"serverdir\": {\"urls\": [\"" "http://127.0.0.1:1" "\"], \"token\": \"" H_TOK_BB
               "\"}");
    assert_int_equal(chmod(b.cfg, 0644), 0);
    assert_true(bbt_start(&b) > 0);
    assert_int_equal(h_stop(b.pid, 10000), 0);
    assert_true(file_has(b.log, "config file holds a serverdir token and is readable by others"));

    assert_int_equal(chmod(b.cfg, 0600), 0);
    assert_true(bbt_start(&b) > 0);
    assert_int_equal(h_stop(b.pid, 10000), 0);
    assert_false(file_has(b.log, "readable by others"));

    /* no token in it: nothing secret, no warning */
    bbt_config(&b, "[]", "");
    assert_int_equal(chmod(b.cfg, 0644), 0);
    assert_true(bbt_start(&b) > 0);
    assert_int_equal(h_stop(b.pid, 10000), 0);
    assert_false(file_has(b.log, "readable by others"));
}

/* Resident memory of pid in KiB (VmRSS), or -1. */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* Open file descriptors of pid. */
static int count_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n - 2; /* . and .. */
}

/* Slow readers (connections that pipeline requests and never read an answer) hold at most
 * max_connections connections of memory: 400 of them against a serverdir allowing 64 grow
 * it by a few MiB, not by 400 connections' worth. */
static void slow_readers_bounded_by_max_connections(void **state)
{
    (void)state;
    h_serverdir_t s2;
    assert_int_equal(h_sd_start(&s2, &redis, &(h_sd_opts_t){.config = "{\"max_connections\": 64}"}), 0);
    long before = rss_kib(s2.pid);
    enum { N = 400 };
    static int fds[N];
    char reqs[50 * 80];
    size_t len = 0;
    for (int i = 0; i < 50; i++)
        len += (size_t)snprintf(reqs + len, sizeof reqs - len,
                                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(fds[i] >= 0);
        int small = 4096;
        setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s2.port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connect(fds[i], (struct sockaddr *)&sa, sizeof sa); /* in progress or refused: both fine */
        send(fds[i], reqs, len, MSG_NOSIGNAL);
    }
    h_sleep_ms(slack(1500)); /* the pipelined requests are read and answered meanwhile */
    long after = rss_kib(s2.pid);
    int open_fds = count_fds(s2.pid);
    print_message("serverdir RSS %ld KiB -> %ld KiB, %d descriptors with %d slow readers, "
                  "max_connections 64\n", before, after, open_fds, N);
    assert_true(open_fds < 64 + 40); /* the connections it holds, plus its own files */
#ifndef __SANITIZE_ADDRESS__
    if (!h_valgrind()) /* under valgrind or ASan, RSS is mostly the tool's own */
        assert_true(after - before < 8 * 1024);
#endif
    for (int i = 0; i < N; i++)
        close(fds[i]);
    h_serverdir_stop(&s2);
}

int main(void)
{
    h_init(180);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(oversized_requests_refused_before_the_body),
        cmocka_unit_test(slowloris_times_out_others_served),
        cmocka_unit_test(bad_names_refused_without_change),
        cmocka_unit_test(slow_readers_bounded_by_max_connections),
        cmocka_unit_test(unsafe_token_file_warned),
        cmocka_unit_test(unsafe_bigbrother_config_warned),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
