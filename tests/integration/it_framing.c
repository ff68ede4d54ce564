/* HTTP framing against a real serverdir, with requests sent raw over a socket:
 *   - ambiguous or unsupported framing (Content-Length with Transfer-Encoding, two
 *     different Content-Lengths, a transfer coding other than chunked, whitespace between
 *     a header name and its colon) is answered 400 bad_framing, the connection is
 *     closed, and Redis is unchanged;
 *   - a chunked body with a non-JSON content type gets 415 like a Content-Length one,
 *     and a well-formed chunked JSON request gets its normal answer.
 * What slow readers may hold is it.security's slow_readers_bounded_by_max_connections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "harness_stack.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static h_redis_t redis;
static h_serverdir_t sd;

/* Slow margins under valgrind; the box is shared and loaded. */
static int slack(int ms) { return h_valgrind() ? ms * 5 : ms; }

/* cmocka group setup: redis-server, and serverdir on it with max_connections set in its
 * config (the key is read and the limit leaves room for every test connection). */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, &(h_sd_opts_t){.config = "{\"max_connections\": 1024}"});
}

/* A raw connection to the test's serverdir. */
static int raw_connect(void)
{
    int fd = h_tcp_connect(sd.port);
    assert_true(fd >= 0);
    return fd;
}

static void send_all(int fd, const char *s, size_t n) { assert_int_equal(h_send_all(fd, s, n), 0); }

typedef struct {
    int status;       /* of the first response, -1 when none came */
    char code[64];    /* its error.code, "" when none */
    int closed;       /* the server closed the connection */
    int responses;    /* status lines received: more than one means a request was smuggled */
} answer_t;

/* Sends req (a whole request, head and body, without "Connection: close" so that the
 * close is the server's decision) on a fresh connection and reads the answer until the
 * server closes or timeout_ms passes. */
static answer_t exchange(const char *req, int timeout_ms)
{
    answer_t a = {.status = -1};
    int fd = raw_connect();
    send_all(fd, req, strlen(req));
    char buf[16384];
    h_read_until_close(fd, buf, sizeof buf, timeout_ms, &a.closed);
    close(fd);
    for (const char *p = buf; (p = strstr(p, "HTTP/1.1 ")); p++)
        a.responses++;
    if (sscanf(buf, "HTTP/1.%*d %d", &a.status) != 1)
        a.status = -1;
    const char *body = strstr(buf, "\r\n\r\n");
    json_error_t err;
    json_t *j = body ? json_loads(body + 4, JSON_DISABLE_EOF_CHECK, &err) : NULL;
    const char *code = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    snprintf(a.code, sizeof a.code, "%s", code ? code : "");
    json_decref(j);
    return a;
}

#define HEAD(method, path) \
    method " " path " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " H_TOK_BB "\r\n"
#define MACHINE "/v1/clusters/c1/machines/m1"
#define MACHINE_BODY "{\"address\": \"10.0.0.5\", \"ttl_ms\": 60000}"
/* MACHINE_BODY as one chunk (0x28 = 40 bytes) and the last chunk. */
#define MACHINE_CHUNKED "28\r\n" MACHINE_BODY "\r\n0\r\n\r\n"

/* Every ambiguous or unsupported framing is refused with 400 bad_framing and a close,
 * before the body is read, and nothing reaches Redis. */
static void bad_framing_refused_and_closed(void **state)
{
    (void)state;
    static const struct {
        const char *what, *req;
    } cases[] = {
        {"Content-Length and Transfer-Encoding",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nContent-Length: 40\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n" MACHINE_CHUNKED},
        {"Transfer-Encoding and Content-Length",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                              "Content-Length: 40\r\n\r\n" MACHINE_CHUNKED},
        {"two different Content-Lengths",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nContent-Length: 40\r\n"
                              "Content-Length: 41\r\n\r\n" MACHINE_BODY " "},
        {"chunked smuggling a second request",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nContent-Length: 5\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                              HEAD("DELETE", MACHINE) "\r\n"},
        {"Transfer-Encoding: gzip, chunked",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\n"
                              "Transfer-Encoding: gzip, chunked\r\n\r\n" MACHINE_CHUNKED},
        {"Transfer-Encoding: gzip",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\n"
                              "Transfer-Encoding: gzip\r\n\r\n" MACHINE_BODY},
        {"two Transfer-Encoding headers",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nTransfer-Encoding: gzip\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n" MACHINE_CHUNKED},
        {"Transfer-Encoding on a GET",
         HEAD("GET", "/v1/clusters/c1/processes") "Transfer-Encoding: identity\r\n\r\n"},
        /* RFC 9112 5.1: no whitespace between a field name and its colon. A proxy that
         * trims it frames this by the chunked coding, one that keeps it in the name by
         * Content-Length: the bytes after the 4 would be a second request. */
        {"space before the colon",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nContent-Length: 4\r\n"
                              "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n"
                              HEAD("DELETE", MACHINE) "\r\n"},
        {"tab before the colon",
         HEAD("PUT", MACHINE) "Content-Type: application/json\r\nContent-Length: 4\r\n"
                              "Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n"
                              HEAD("DELETE", MACHINE) "\r\n"},
        {"space before the colon of another field",
         HEAD("GET", "/v1/clusters/c1/processes") "X-Anything : 1\r\n\r\n"},
    };
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("c1"), NULL);
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        answer_t a = exchange(cases[i].req, slack(3000));
        int ok = a.status == 400 && strcmp(a.code, "bad_framing") == 0 && a.closed &&
                 a.responses == 1;
        printf("%-40s status %d code '%s' closed %d responses %d%s\n", cases[i].what, a.status,
               a.code, a.closed, a.responses, ok ? "" : "   <-- want 400 bad_framing and a close");
        failures += !ok;
    }
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("c1"), NULL);
    assert_int_equal(failures, 0);
    h_keys_same(&before, &after, __func__);
}

/* A chunked body is held to the same content-type rule as a Content-Length one (415 on
 * a JSON route), and a well-formed chunked JSON request gets its normal answer. */
static void chunked_bodies_checked_and_served(void **state)
{
    (void)state;
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("c1"), NULL);
    answer_t a = exchange(HEAD("PUT", MACHINE) "Content-Type: text/plain\r\n"
                                               "Transfer-Encoding: chunked\r\n\r\n" MACHINE_CHUNKED,
                          slack(3000));
    printf("chunked text/plain: status %d code '%s' closed %d\n", a.status, a.code, a.closed);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("c1"), NULL);
    assert_int_equal(a.status, 415);
    assert_string_equal(a.code, "unsupported_media_type");
    h_keys_same(&before, &after, __func__);

    /* two equal Content-Lengths are one length (RFC 9112 6.3) */
    a = exchange(HEAD("PUT", MACHINE) "Content-Type: application/json\r\nContent-Length: 40\r\n"
                                      "Content-Length: 40\r\nConnection: close\r\n\r\n" MACHINE_BODY,
                 slack(3000));
    printf("two equal Content-Lengths: status %d code '%s'\n", a.status, a.code);
    assert_int_equal(a.status, 200);

    a = exchange(HEAD("PUT", MACHINE) "Content-Type: application/json\r\n"
                                      "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                      "5\r\n{\"add\r\n23\r\nress\": \"10.0.0.6\", \"ttl_ms\": 60000}\r\n"
                                      "0\r\n\r\n",
                 slack(3000));
    printf("chunked json: status %d code '%s'\n", a.status, a.code);
    assert_int_equal(a.status, 200);
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_BB, NULL, &r, "%s", MACHINE), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "10.0.0.6"));
    h_resp_free(&r);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_framing_refused_and_closed),
        cmocka_unit_test(chunked_bodies_checked_and_served),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
