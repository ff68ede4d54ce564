/* Unit tests of the shared helpers and the serverdir router. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "router.h"
#include "sd.h"
#include "sdjson.h"
#include "sdvalid.h"
#include "sdlog.h"
#include "sdutil.h"

static void h_dummy(sd_req_t *req, sd_resp_t *resp) {}

static const sd_route_t table[] = {
    {"GET", "/healthz", SD_PUBLIC, 0, h_dummy},
    {"PUT", "/v1/locks/{key}", SD_R_GAME, 0, h_dummy},
    {"POST", "/v1/locks/acquire", SD_R_GAME, 0, h_dummy},
    {"POST", "/v1/locks/{key}", SD_R_GAME, 0, h_dummy},
    {"GET", "/v1/clusters/{c}/machines/{m}", SD_R_READERS, 0, h_dummy},
    {"GET", "/v1/clusters/{c}/machines/{m}/assignments", SD_R_READERS, 0, h_dummy},
    {"DELETE", "/v1/clusters/{c}/machines/{m}", SD_R_OPS, 0, h_dummy},
    {"GET", "/", SD_PUBLIC, 0, h_dummy},
};

static int match(const char *m, const char *p, const char **params, int *np, char *allow)
{
    static char scratch[SD_PATH_MAX];
    return sd_route_match(table, SD_ARRAY_LEN(table), m, p, scratch, sizeof scratch, params,
                          np, allow, 64);
}

static void router_matches_params(void **state)
{
    const char *params[SD_MAX_PARAMS];
    int np = 0;
    char allow[64];
    assert_int_equal(match("GET", "/v1/clusters/c1/machines/m-7", params, &np, allow), 4);
    assert_int_equal(np, 2);
    assert_string_equal(params[0], "c1");
    assert_string_equal(params[1], "m-7");
    assert_int_equal(match("GET", "/v1/clusters/c1/machines/m-7/assignments", params, &np, allow), 5);
    assert_int_equal(match("HEAD", "/healthz", params, &np, allow), 0);
    assert_int_equal(match("PUT", "/v1/locks/player:42", params, &np, allow), 1);
    assert_string_equal(params[0], "player:42");
    /* The root (the dashboard) matches "/" and nothing else. */
    assert_int_equal(match("GET", "/", params, &np, allow), 7);
    assert_int_equal(np, 0);
    assert_int_equal(match("POST", "/", params, &np, allow), SD_ROUTE_BAD_METHOD);
    assert_int_equal(match("GET", "/v1", params, &np, allow), SD_ROUTE_NOT_FOUND);
    assert_int_equal(match("GET", "/x", params, &np, allow), SD_ROUTE_NOT_FOUND);
}

static void router_prefers_literal_segments(void **state)
{
    const char *params[SD_MAX_PARAMS];
    int np = -1;
    char allow[64];
    assert_int_equal(match("POST", "/v1/locks/acquire", params, &np, allow), 2);
    assert_int_equal(np, 0);
    assert_int_equal(match("POST", "/v1/locks/other", params, &np, allow), 3);
    /* a literal matches whole segments only, not a prefix of one nor one it prefixes */
    assert_int_equal(match("POST", "/v1/locks/acquir", params, &np, allow), 3);
    assert_string_equal(params[0], "acquir");
    assert_int_equal(match("POST", "/v1/locks/acquiree", params, &np, allow), 3);
    assert_int_equal(match("GET", "/healthzz", params, &np, allow), SD_ROUTE_NOT_FOUND);
    assert_int_equal(match("GET", "/health", params, &np, allow), SD_ROUTE_NOT_FOUND);
}

static void router_not_found_and_bad_method(void **state)
{
    const char *params[SD_MAX_PARAMS];
    int np;
    char allow[64];
    assert_int_equal(match("GET", "/nope", params, &np, allow), SD_ROUTE_NOT_FOUND);
    assert_int_equal(match("GET", "/healthz/", params, &np, allow), SD_ROUTE_NOT_FOUND);
    assert_int_equal(match("GET", "/v1/clusters//machines/m", params, &np, allow), SD_ROUTE_NOT_FOUND);
    assert_int_equal(match("GET", "", params, &np, allow), SD_ROUTE_NOT_FOUND);
    assert_int_equal(match("POST", "/healthz", params, &np, allow), SD_ROUTE_BAD_METHOD);
    assert_string_equal(allow, "GET");
    assert_int_equal(match("PATCH", "/v1/clusters/c/machines/m", params, &np, allow), SD_ROUTE_BAD_METHOD);
    assert_string_equal(allow, "GET, DELETE");
}

static void names_are_validated(void **state)
{
    assert_true(sd_name_valid("zone-1", SD_NAME_MAX));
    assert_true(sd_name_valid("player:42@eu.west_1", SD_NAME_MAX));
    assert_false(sd_name_valid("", SD_NAME_MAX));
    assert_false(sd_name_valid("../etc", SD_NAME_MAX));
    assert_false(sd_name_valid("a..b", SD_NAME_MAX));
    assert_false(sd_name_valid(".hidden", SD_NAME_MAX));
    assert_false(sd_name_valid("-flag", SD_NAME_MAX));
    assert_false(sd_name_valid("a/b", SD_NAME_MAX));
    assert_false(sd_name_valid("a b", SD_NAME_MAX));
    assert_false(sd_name_valid("a{b}", SD_NAME_MAX));
    assert_false(sd_name_valid("abc", 2));
}

static void hostport_parsing(void **state)
{
    char host[64];
    int port;
    assert_int_equal(sd_parse_hostport("127.0.0.1:7700", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 7700);
    assert_int_equal(sd_parse_hostport("[::1]:80", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(sd_parse_hostport(":9", host, sizeof host, &port), 0);
    assert_string_equal(host, "");
    assert_int_equal(sd_parse_hostport("::1:80", host, sizeof host, &port), -EINVAL);
    assert_int_equal(sd_parse_hostport("h:0", host, sizeof host, &port), -EINVAL);
    assert_int_equal(sd_parse_hostport("h:65536", host, sizeof host, &port), -EINVAL);
    assert_int_equal(sd_parse_hostport("h:12x", host, sizeof host, &port), -EINVAL);
}

static void buf_cap_is_enforced(void **state)
{
    sd_buf_t b;
    sd_buf_init(&b, 8);
    assert_int_equal(sd_buf_append(&b, "12345", 5), 0);
    assert_int_equal(sd_buf_append(&b, "6789", 4), -E2BIG);
    assert_int_equal(b.len, 5);
    assert_string_equal(b.data, "12345");
    assert_int_equal(sd_buf_printf(&b, "%d", 678), 0);
    assert_string_equal(b.data, "12345678");
    assert_int_equal(sd_buf_printf(&b, "x"), -E2BIG);
    sd_buf_free(&b);
}

/* A buffer started in the caller's memory (sd_buf_use) writes there, keeps its cap, and
 * moves its contents to memory of its own when it outgrows it; freeing it never frees
 * the caller's memory (under ASan and valgrind, a free of the stack array would fail). */
static void buf_in_callers_memory(void **state)
{
    (void)state;
    char mem[8];
    sd_buf_t b;
    sd_buf_use(&b, mem, sizeof mem, 20);
    assert_int_equal(sd_buf_append(&b, "1234567", 7), 0);
    assert_ptr_equal(b.data, mem);
    assert_string_equal(mem, "1234567");
    sd_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_int_equal(sd_buf_append(&b, "abc", 3), 0);
    assert_int_equal(sd_buf_printf(&b, "%s", "defghij"), 0); /* 10 bytes + NUL: moved */
    assert_ptr_not_equal(b.data, mem);
    assert_int_equal(b.borrowed, 0);
    assert_string_equal(b.data, "abcdefghij");
    assert_int_equal(sd_buf_append(&b, "0123456789x", 11), -E2BIG); /* max still 20 */
    assert_int_equal(sd_buf_append(&b, "0123456789", 10), 0);
    assert_string_equal(b.data, "abcdefghij0123456789");
    sd_buf_free(&b);
    sd_buf_use(&b, mem, sizeof mem, 20);
    assert_int_equal(sd_buf_append(&b, "x", 1), 0);
    sd_buf_free(&b); /* not mem's to free */
    assert_null(b.data);
    assert_string_equal(mem, "x");
}

/* sd_read_fd reads a pipe to its end into one NUL-terminated buffer, and refuses one
 * longer than the cap (-E2BIG) without handing back a buffer. */
static void read_fd_to_the_end_with_a_cap(void **state)
{
    int p[2];
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], "{\"services\":{}}", 15), 15);
    close(p[1]);
    assert_int_equal(sd_read_fd(p[0], 15, &text, &len), 0);
    close(p[0]);
    assert_int_equal(len, 15);
    assert_string_equal(text, "{\"services\":{}}");
    free(text);

    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], "0123456789", 10), 10);
    close(p[1]);
    text = NULL;
    assert_int_equal(sd_read_fd(p[0], 9, &text, &len), -E2BIG);
    assert_null(text);
    close(p[0]);
}

static size_t fmt(char *out, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    size_t n = sd_logfmt_format(out, cap, f, ap);
    va_end(ap);
    return n;
}

static void logfmt_quotes_values(void **state)
{
    char out[256];
    fmt(out, sizeof out, "a=%s b=%d c=%zu d=%lld", "plain", -3, (size_t)7, 1LL << 40);
    assert_string_equal(out, "a=plain b=-3 c=7 d=1099511627776");
    fmt(out, sizeof out, "mode=%o h=%x", 0644u, 255u);
    assert_string_equal(out, "mode=644 h=ff");
    fmt(out, sizeof out, "v=%s", "two words \"q\"\nx=1");
    assert_string_equal(out, "v=\"two words \\\"q\\\"\\nx=1\"");
    fmt(out, sizeof out, "e=%s n=%.*s", "", 3, "abcdef");
    assert_string_equal(out, "e=\"\" n=abc");
    char raw[3] = {'x', 'y', 'z'}; /* not NUL-terminated: %.*s must not read past it */
    fmt(out, sizeof out, "r=%.*s", 3, raw);
    assert_string_equal(out, "r=xyz");
    fmt(out, 8, "k=%s", "0123456789");
    assert_int_equal(strlen(out), 7);
}

static void json_getters_name_the_field(void **state)
{
    char err[256];
    json_t *o = sd_json_parse("{\"a\":\"x\",\"n\":5,\"b\":true,\"bad\":\"a/b\"}", 36, 8, err, sizeof err);
    assert_non_null(o);
    const char *s = NULL;
    int64_t i = 0;
    int b = 0;
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    assert_int_equal(sd_jv_str(&v, o, "a", 1, 10, &s), 0);
    assert_string_equal(s, "x");
    assert_int_equal(sd_jv_str(&v, o, "zz", 0, 10, &s), 1);
    assert_int_equal(sd_jv_str(&v, o, "zz", 1, 10, &s), -1);
    assert_string_equal(err, "field 'zz' is required");
    assert_int_equal(sd_jv_int(&v, o, "n", 1, 0, 4, &i), -1);
    assert_string_equal(err, "field 'n' must be between 0 and 4");
    assert_int_equal(sd_jv_int(&v, o, "a", 1, 0, 4, &i), -1);
    assert_string_equal(err, "field 'a' must be an integer");
    assert_int_equal(sd_jv_bool(&v, o, "b", 1, &b), 0);
    assert_true(b);
    assert_int_equal(sd_jv_name(&v, o, "bad", 1, &s), -1);
    static const char *const allowed[] = {"a", "n", "b", NULL};
    assert_int_equal(sd_jv_only_keys(&v, o, allowed), -1);
    assert_string_equal(err, "unknown field 'bad'");
    json_decref(o);

    assert_null(sd_json_parse("[[[[1]]]]", 9, 3, err, sizeof err));
    assert_string_equal(err, "JSON nested deeper than 3 levels");
    assert_null(sd_json_parse("{\"a\":1,\"a\":2}", 13, 8, err, sizeof err));
    assert_null(sd_json_parse("{", 1, 8, err, sizeof err));
}

/* sd_fmt_i64 writes what printf's %lld writes, at both ends of the range too. */
static void i64_digits_match_printf(void **state)
{
    const int64_t vs[] = {0, 1, -1, 9, 10, -10, 1234567890123LL, INT64_MAX, INT64_MIN,
                          INT64_MIN + 1};
    for (size_t i = 0; i < SD_ARRAY_LEN(vs); i++) {
        char buf[SD_I64_DIGITS], want[32];
        char *p = sd_fmt_i64(buf, vs[i]);
        snprintf(want, sizeof want, "%lld", (long long)vs[i]);
        assert_int_equal((size_t)(buf + sizeof buf - p), strlen(want));
        assert_memory_equal(p, want, strlen(want));
    }
}

/* The writer writes what jansson's compact dump writes for the same values, escapes
 * included, and reports what it could not write. */
static void json_writer_matches_jansson(void **state)
{
    char tricky[40];
    int k = 0;
    for (int c = 1; c < 0x20; c++)
        tricky[k++] = (char)c;
    memcpy(tricky + k, "\"\\/\x7f\xc3\xa9", 6); /* quote, backslash, slash, DEL, e-acute */
    tricky[k + 6] = '\0';
    sd_buf_t b;
    sd_buf_init(&b, 4096);
    sd_jw_t w;
    sd_jw_init(&w, &b);
    sd_jw_obj(&w, NULL);
    sd_jw_str(&w, "holder", "zone-1@eu:7");
    sd_jw_str(&w, "tricky", tricky);
    sd_jw_str(&w, "", "");
    sd_jw_arr(&w, "locks");
    sd_jw_obj(&w, NULL);
    sd_jw_int(&w, "lock_seq", INT64_MAX);
    sd_jw_int(&w, "min", INT64_MIN);
    sd_jw_int(&w, "zero", 0);
    sd_jw_int(&w, "neg", -42);
    sd_jw_bool(&w, "reacquired", 0);
    sd_jw_bool(&w, "released", 1);
    sd_jw_null(&w, "expires_in_ms");
    sd_jw_str(&w, "none", NULL);
    sd_jw_end(&w);
    sd_jw_int(&w, NULL, 7);
    sd_jw_arr(&w, NULL);
    sd_jw_end(&w);
    sd_jw_end(&w);
    sd_jw_obj(&w, "empty");
    sd_jw_end(&w);
    sd_jw_end(&w);
    assert_int_equal(sd_jw_done(&w), 0);

    json_t *v = json_pack("{s:s, s:s, s:s, s:[{s:I, s:I, s:I, s:I, s:b, s:b, s:n, s:n}, i, []], s:{}}",
                          "holder", "zone-1@eu:7", "tricky", tricky, "", "", "locks",
                          "lock_seq", (json_int_t)INT64_MAX, "min", (json_int_t)INT64_MIN,
                          "zero", (json_int_t)0, "neg", (json_int_t)-42, "reacquired", 0,
                          "released", 1, "expires_in_ms", "none", 7, "empty");
    assert_non_null(v);
    char *want = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_string_equal(b.data, want);
    free(want);
    json_decref(v);
    sd_buf_free(&b);

    /* what it cannot write: a close too many, a level left open, too deep, past the cap */
    sd_buf_init(&b, 4096);
    sd_jw_init(&w, &b);
    sd_jw_end(&w);
    assert_int_equal(sd_jw_done(&w), -1);
    sd_jw_init(&w, &b);
    sd_jw_obj(&w, NULL);
    assert_int_equal(sd_jw_done(&w), -1);
    sd_jw_init(&w, &b);
    for (int i = 0; i < SD_JW_DEPTH; i++)
        sd_jw_arr(&w, NULL);
    assert_int_equal(sd_jw_done(&w), -1);
    sd_buf_free(&b);
    sd_buf_init(&b, 8);
    sd_jw_init(&w, &b);
    sd_jw_str(&w, NULL, "longer than eight bytes");
    assert_int_equal(sd_jw_done(&w), -1);
    sd_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(router_matches_params),
        cmocka_unit_test(router_prefers_literal_segments),
        cmocka_unit_test(router_not_found_and_bad_method),
        cmocka_unit_test(names_are_validated),
        cmocka_unit_test(hostport_parsing),
        cmocka_unit_test(read_fd_to_the_end_with_a_cap),
        cmocka_unit_test(buf_cap_is_enforced),
        cmocka_unit_test(buf_in_callers_memory),
        cmocka_unit_test(logfmt_quotes_values),
        cmocka_unit_test(json_getters_name_the_field),
        cmocka_unit_test(i64_digits_match_printf),
        cmocka_unit_test(json_writer_matches_jansson),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
