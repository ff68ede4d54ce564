/* http/quota.c: the `quotas` config section (all or nothing), the tallies of parked waits
 * and the scope a caller's stored bytes count for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "quota.h"

static void config_section(void **state)
{
    (void)state;
    char err[256];
    int64_t defaults[SD_QUOTA_COUNT];
    memcpy(defaults, sd_quota_limit, sizeof defaults);
    assert_int_equal(sd_quota_limit[SD_QUOTA_BLOB_BYTES], 1LL << 30);
    assert_int_equal(sd_quota_limit[SD_QUOTA_LOCKS_PER_HOLDER], 10000);
    assert_int_equal(sd_quota_config_load(NULL, err, sizeof err), 0);

    json_t *c = json_loads("{\"blob_bytes\": 0, \"locks_per_holder\": 5}", 0, NULL);
    assert_int_equal(sd_quota_config_load(c, err, sizeof err), 0);
    assert_int_equal(sd_quota_limit[SD_QUOTA_BLOB_BYTES], 0); /* no limit */
    assert_int_equal(sd_quota_limit[SD_QUOTA_LOCKS_PER_HOLDER], 5);
    assert_int_equal(sd_quota_limit[SD_QUOTA_ALLOC_WAITING], 10000); /* kept */
    json_decref(c);

    /* refusals name the field and change nothing */
    static const char *const bad[] = {"{\"blob_bytes\": -1}", "{\"locks\": 1}",
                                      "{\"locks_per_holder\": 1, \"allocations_waiting\": \"x\"}",
                                      "[]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = json_loads(bad[i], 0, NULL);
        assert_int_equal(sd_quota_config_load(c, err, sizeof err), -1);
        assert_int_equal(sd_quota_limit[SD_QUOTA_LOCKS_PER_HOLDER], 5);
        assert_true(strlen(err) > 0);
        json_decref(c);
    }
    memcpy(sd_quota_limit, defaults, sizeof defaults);
}

static void tallies(void **state)
{
    (void)state;
    static sd_quota_tally_t t = SD_QUOTA_TALLY_INIT;
    int64_t used = -2;
    assert_int_equal(sd_quota_take(&t, "c1", 2, &used), 0);
    assert_int_equal(used, 0);
    assert_int_equal(sd_quota_take(&t, "c1", 2, &used), 0);
    assert_int_equal(sd_quota_take(&t, "c1", 2, &used), -1);
    assert_int_equal(used, 2);
    assert_int_equal(sd_quota_take(&t, "c2", 2, &used), 0); /* a name of its own */
    sd_quota_give(&t, "c1");
    assert_int_equal(sd_quota_take(&t, "c1", 2, &used), 0);
    assert_int_equal(used, 1);
    for (int i = 0; i < 100; i++)
        assert_int_equal(sd_quota_take(&t, "c3", 0, &used), 0); /* 0: no limit */
    for (int i = 0; i < 100; i++)
        sd_quota_give(&t, "c3");
    sd_quota_give(&t, "c1");
    sd_quota_give(&t, "c1");
    sd_quota_give(&t, "c2");
    for (int b = 0; b < SD_QUOTA_BUCKETS; b++)
        assert_null(t.bucket[b]); /* every entry freed at 0 */
}

static void scope_of_a_caller(void **state)
{
    (void)state;
    sd_req_t req;
    memset(&req, 0, sizeof req);
    char buf[128];
    strcpy(req.auth.principal, "token:0123456789ab");
    assert_string_equal(sd_quota_scope(&req, buf, sizeof buf), "token:0123456789ab");
    strcpy(req.auth.cluster, "c1");
    assert_string_equal(sd_quota_scope(&req, buf, sizeof buf), "cluster:c1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_section),
        cmocka_unit_test(tallies),
        cmocka_unit_test(scope_of_a_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
