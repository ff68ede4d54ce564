/* Unit tests of the lock table's input checks: Lock-Seq / Blob-Seq header values and the
 * "locks" config section. */
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
    sd_locks_cfg_t cfg = {.lock_delay_ms = 0, .wait_timeout_ms = 500, .max_wait_ms = 30000,
                          .retain_s = 604800};
    assert_int_equal(sd_locks_cfg_parse(NULL, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.retain_s, 604800);

    json_t *ok = json_pack("{s:i, s:i, s:i, s:i}", "lock_delay_ms", 2000, "wait_replicas", 1,
                           "wait_timeout_ms", 300, "max_wait_ms", 5000);
    assert_int_equal(sd_locks_cfg_parse(ok, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.lock_delay_ms, 2000);
    assert_int_equal(cfg.wait_replicas, 1);
    assert_int_equal(cfg.wait_timeout_ms, 300);
    assert_int_equal(cfg.max_wait_ms, 5000);
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
        assert_int_equal(sd_locks_cfg_parse(j, &cfg, err, sizeof err), -1);
        assert_non_null(strstr(err, bad[i].field));
        json_decref(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seq_headers),
        cmocka_unit_test(config_section),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
