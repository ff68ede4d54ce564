/* Unit tests of the lock table's input checks: Lock-Seq / Blob-Seq header values, the
 * acquire and release bodies, and the "locks" config section. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "locks.h"
#include "sd.h"

/* serverdir's main.c owns the config; the handlers linked here refer to it. */
sd_config_t sd_cfg;

static void seq_headers(void **state)
{
    int64_t v = -1;
    assert_int_equal(sd_seq_parse("1", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(sd_seq_parse("1795296034773223", &v), 0);
    assert_int_equal(v, 1795296034773223LL);
    assert_int_equal(sd_seq_parse("9007199254740992", &v), 0);
    assert_int_equal(v, SD_SEQ_MAX);

    const char *bad[] = {"", "0", "-1", "+1", " 1", "1 ", "01", "1e3", "0x10", "12a", "1.0",
                         "9007199254740993", "99999999999999999999", "18446744073709551617"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 42;
        assert_int_equal(sd_seq_parse(bad[i], &v), -1);
    }
    assert_int_equal(sd_seq_parse(NULL, &v), -1);
}

static void config_section(void **state)
{
    char err[256];
    assert_int_equal(sd_locks_config_load(NULL, err, sizeof err), 0);
    assert_int_equal(sd_locks_cfg.retain_s, 604800);

    json_t *ok = json_pack("{s:i, s:i, s:i, s:i}", "lock_delay_ms", 2000, "wait_replicas", 1,
                           "wait_timeout_ms", 300, "max_wait_ms", 5000);
    assert_int_equal(sd_locks_config_load(ok, err, sizeof err), 0);
    assert_int_equal(sd_locks_cfg.lock_delay_ms, 2000);
    assert_int_equal(sd_locks_cfg.wait_replicas, 1);
    assert_int_equal(sd_locks_cfg.wait_timeout_ms, 300);
    assert_int_equal(sd_locks_cfg.max_wait_ms, 5000);
    json_decref(ok);

    struct {
        const char *json;
        const char *field;
    } bad[] = {
        {"{\"lock_delay\": 5}", "lock_delay"},
        {"{\"lock_delay_ms\": -1}", "lock_delay_ms"},
        {"{\"wait_replicas\": 17}", "wait_replicas"},
        {"{\"wait_timeout_ms\": 3000}", "wait_timeout_ms"},
        {"{\"max_wait_ms\": 30001}", "max_wait_ms"},
        {"{\"retain_s\": 10}", "retain_s"},
        {"{\"max_waiters\": \"many\"}", "max_waiters"},
        {"[]", "locks"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = json_loads(bad[i].json, 0, NULL);
        assert_non_null(j);
        err[0] = '\0';
        assert_int_equal(sd_locks_config_load(j, err, sizeof err), -1);
        assert_non_null(strstr(err, bad[i].field));
        json_decref(j);
    }
}

/* Parses text as an acquire body; returns the error code ("" when valid). */
static const char *acquire_code(const char *text, int many, sd_lock_req_t *a, char *err)
{
    json_t *j = json_loads(text, 0, NULL);
    assert_non_null(j);
    const char *code = "";
    int rc = sd_lock_req_parse(j, many, a, &code, err, 256);
    json_decref(j);
    return rc ? code : "";
}

static void acquire_bodies(void **state)
{
    sd_locks_cfg.max_wait_ms = 30000;
    sd_lock_req_t a;
    char err[256];
    json_t *j = json_loads("{\"holder\":\"zone-m1-3\",\"ttl_ms\":5000,\"wait_ms\":100,"
                           "\"steal_if_holder_stopped\":\"c1\",\"steal_if_older_than_ms\":60000}",
                           0, NULL);
    const char *code;
    assert_int_equal(sd_lock_req_parse(j, 0, &a, &code, err, sizeof err), 0);
    assert_string_equal(a.holder, "zone-m1-3");
    assert_int_equal(a.ttl_ms, 5000);
    assert_int_equal(a.wait_ms, 100);
    assert_string_equal(a.steal_cluster, "c1");
    assert_int_equal(a.steal_older_ms, 60000);
    json_decref(j);

    j = json_loads("{\"holder\":\"h\",\"keys\":[\"a\",\"b:1\",\"c@2\"]}", 0, NULL);
    assert_int_equal(sd_lock_req_parse(j, 1, &a, &code, err, sizeof err), 0);
    assert_int_equal(a.n, 3);
    assert_string_equal(a.names[2], "c@2");
    assert_int_equal(a.ttl_ms, 0);
    assert_string_equal(a.steal_cluster, "");
    json_decref(j);

    struct {
        const char *body;
        int many;
        const char *code, *names;
    } bad[] = {
        {"{}", 0, "bad_field", "holder"},
        {"{\"holder\":\"a b\"}", 0, "bad_field", "holder"},
        {"{\"holder\":7}", 0, "bad_field", "holder"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"]}", 0, "bad_field", "keys"},
        {"{\"holder\":\"h\",\"ttl\":5}", 0, "bad_field", "ttl"},
        {"{\"holder\":\"h\",\"ttl_ms\":0}", 0, "bad_field", "ttl_ms"},
        {"{\"holder\":\"h\",\"ttl_ms\":86400001}", 0, "bad_field", "ttl_ms"},
        {"{\"holder\":\"h\",\"ttl_ms\":1.5}", 0, "bad_field", "ttl_ms"},
        {"{\"holder\":\"h\",\"wait_ms\":-1}", 0, "bad_field", "wait_ms"},
        {"{\"holder\":\"h\",\"wait_ms\":30001}", 0, "bad_field", "wait_ms"},
        {"{\"holder\":\"h\",\"steal_if_holder_stopped\":\"\"}", 0, "bad_field", "steal_if_holder_stopped"},
        {"{\"holder\":\"h\",\"steal_if_holder_stopped\":\"{c}\"}", 0, "bad_field", "steal_if_holder_stopped"},
        {"{\"holder\":\"h\",\"steal_if_older_than_ms\":0}", 0, "bad_field", "steal_if_older_than_ms"},
        {"{\"holder\":\"h\"}", 1, "bad_field", "keys"},
        {"{\"holder\":\"h\",\"keys\":\"a\"}", 1, "bad_field", "keys"},
        {"{\"holder\":\"h\",\"keys\":[]}", 1, "bad_field", "keys"},
        {"{\"holder\":\"h\",\"keys\":[\"a\",\"a\"]}", 1, "bad_field", "repeats"},
        {"{\"holder\":\"h\",\"keys\":[\"a\",null]}", 1, "bad_name", "keys[1]"},
        {"{\"holder\":\"h\",\"keys\":[\"..\"]}", 1, "bad_name", "keys[0]"},
        {"{\"holder\":\"h\",\"keys\":[\"a#q\"]}", 1, "bad_name", "keys[0]"},
        {"{\"holder\":\"h\",\"keys\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
         "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 1, "bad_field", "keys"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_string_equal(acquire_code(bad[i].body, bad[i].many, &a, err), bad[i].code);
        assert_non_null(strstr(err, bad[i].names));
    }
}

#define TOK_A "\"0123456789abcdef0123456789abcdef\""
#define TOK_B "\"fedcba9876543210fedcba9876543210\""

static void release_bodies(void **state)
{
    sd_lock_rel_t rel;
    const char *code;
    char err[256];
    json_t *j = json_loads("{\"holder\":\"h\",\"keys\":[\"a\",\"b\"],"
                           "\"lock_seqs\":{\"b\":9007199254740992,\"a\":17},"
                           "\"lock_tokens\":{\"b\":" TOK_B ",\"a\":" TOK_A "}}",
                           0, NULL);
    assert_int_equal(sd_lock_release_parse(j, &rel, &code, err, sizeof err), 0);
    assert_int_equal(rel.n, 2);
    assert_string_equal(rel.holder, "h");
    assert_int_equal(rel.seqs[0], 17);
    assert_int_equal(rel.seqs[1], SD_SEQ_MAX);
    assert_string_equal(rel.tokens[0], "0123456789abcdef0123456789abcdef");
    assert_string_equal(rel.tokens[1], "fedcba9876543210fedcba9876543210");
    json_decref(j);

    static const struct {
        const char *body, *code;
    } bad[] = {
        {"{\"holder\":\"h\",\"keys\":[\"a\"]}", "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":[1]}", "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"b\":1}}", "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1,\"b\":2}}", "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":0},\"lock_tokens\":{\"a\":" TOK_A
         "}}", "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":\"1\"},\"lock_tokens\":{\"a\":" TOK_A
         "}}", "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":9007199254740993},"
         "\"lock_tokens\":{\"a\":" TOK_A "}}", "bad_field"},
        {"{\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1},\"lock_tokens\":{\"a\":" TOK_A "}}",
         "bad_field"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1},\"force\":true}", "bad_field"},
        /* the grant's secret is required, whole and well formed */
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1}}", "missing_lock_token"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1},\"lock_tokens\":{\"b\":" TOK_A
         "}}", "bad_lock_token"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1},\"lock_tokens\":{\"a\":"
         "\"0123456789ABCDEF0123456789abcdef\"}}", "bad_lock_token"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1},\"lock_tokens\":{\"a\":"
         "\"0123456789abcdef0123456789abcde\"}}", "bad_lock_token"},
        {"{\"holder\":\"h\",\"keys\":[\"a\"],\"lock_seqs\":{\"a\":1},\"lock_tokens\":{\"a\":17}}",
         "bad_lock_token"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = json_loads(bad[i].body, 0, NULL);
        assert_non_null(j);
        err[0] = '\0';
        assert_int_equal(sd_lock_release_parse(j, &rel, &code, err, sizeof err), -1);
        assert_string_equal(code, bad[i].code);
        assert_true(err[0] != '\0');
        json_decref(j);
    }
}

static void lock_tokens(void **state)
{
    assert_true(sd_lock_token_valid("0123456789abcdef0123456789abcdef"));
    assert_false(sd_lock_token_valid(NULL));
    assert_false(sd_lock_token_valid(""));
    assert_false(sd_lock_token_valid("0123456789abcdef0123456789abcdef0"));
    assert_false(sd_lock_token_valid("0123456789abcdef0123456789abcdeg"));
    assert_false(sd_lock_token_valid("0123456789abcdef0123456789abcdeF"));
}

static void hash_tagged_names(void **state)
{
    (void)state;
    static const char *const good[] = {"player42", "{player42}:bank", "a{b}c", "{x}",
                                       "zone.1:{p-9}", NULL};
    static const char *const bad[] = {"{}", "{", "}", "a}b{", "{a}{b}", "{{a}}", "a{b", "{a",
                                      "{.}", ".{a}", "-{a}", "{a}..b", "{a b}", "", NULL};
    for (const char *const *p = good; *p; p++)
        if (!sd_lock_name_valid(*p))
            fail_msg("refused '%s'", *p);
    for (const char *const *p = bad; *p; p++)
        if (sd_lock_name_valid(*p))
            fail_msg("accepted '%s'", *p);
    assert_false(sd_lock_name_valid(NULL));
    char buf[64];
    /* a cluster's wrapping comes off; a tag that is part of the name stays */
    assert_string_equal(sd_lock_name_of(buf, sizeof buf, "sd:lock:{=player:1}", 8), "player:1");
    assert_string_equal(sd_lock_name_of(buf, sizeof buf, "sd:lock:{p42}:bank", 8), "{p42}:bank");
    assert_string_equal(sd_lock_name_of(buf, sizeof buf, "sd:lock:plain", 8), "plain");
    /* keys_parse: a tagged pair is one call's worth on any Redis */
    char err[256];
    const char *code;
    sd_lock_req_t a;
    json_t *body = json_pack("{s:s, s:[s, s]}", "holder", "zone-1", "keys", "{p}:a", "{p}:b");
    assert_int_equal(sd_lock_req_parse(body, 1, &a, &code, err, sizeof err), 0);
    assert_int_equal(a.n, 2);
    json_decref(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seq_headers),
        cmocka_unit_test(config_section),
        cmocka_unit_test(acquire_bodies),
        cmocka_unit_test(release_bodies),
        cmocka_unit_test(lock_tokens),
        cmocka_unit_test(hash_tagged_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
