/* The wire contract (common/sdproto.c): the event type and stop reason tables, names,
 * and the one text form of a stop reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "sdproto.h"

/* sd_reason_format into a local buffer, checking the returned length. */
static const char *fmt(char *buf, size_t cap, const char *reason, int64_t code, int64_t sig,
                       int64_t silent)
{
    size_t n = sd_reason_format(buf, cap, reason, code, sig, silent);
    assert_int_equal(n, strlen(buf));
    return buf;
}

static void reason_wording(void **state)
{
    (void)state;
    char b[SD_REASON_TEXT_MAX];
    const int64_t N = SD_REASON_NONE;
    assert_string_equal(fmt(b, sizeof b, "exited", 3, N, N), "exited(code 3)");
    assert_string_equal(fmt(b, sizeof b, "exited", 0, N, N), "exited(code 0)");
    assert_string_equal(fmt(b, sizeof b, "exited", -1, N, N), "exited(code -1)");
    assert_string_equal(fmt(b, sizeof b, "exited", N, N, N), "exited");
    assert_string_equal(fmt(b, sizeof b, "killed", N, 9, N), "killed(signal 9)");
    assert_string_equal(fmt(b, sizeof b, "killed", N, N, N), "killed");
    assert_string_equal(fmt(b, sizeof b, "hung", N, 6, 3012), "hung(silent 3012ms)");
    assert_string_equal(fmt(b, sizeof b, "start_timeout", N, 9, 10000),
                        "start_timeout(silent 10000ms)");
    assert_string_equal(fmt(b, sizeof b, "hung", N, 6, N), "hung");
    /* The other reasons carry no value worth showing. */
    assert_string_equal(fmt(b, sizeof b, "stopped_by_operator", 0, 15, N), "stopped_by_operator");
    assert_string_equal(fmt(b, sizeof b, "crash_loop", 1, N, N), "crash_loop");
    assert_string_equal(fmt(b, sizeof b, "machine_lost", N, N, N), "machine_lost");
    assert_string_equal(fmt(b, sizeof b, "drained", N, 15, N), "drained");
    assert_string_equal(fmt(b, sizeof b, "replaced", N, N, N), "replaced");
    assert_string_equal(fmt(b, sizeof b, "later_reason", 1, 2, 3), "later_reason");
    assert_string_equal(fmt(b, sizeof b, NULL, 1, 2, 3), "-");
    assert_string_equal(fmt(b, sizeof b, "", N, N, N), "-");
    /* The longest value of the longest reason fits SD_REASON_TEXT_MAX. */
    assert_string_equal(fmt(b, sizeof b, "start_timeout", N, N, INT64_MAX),
                        "start_timeout(silent 9223372036854775807ms)");
}

static void reason_truncates(void **state)
{
    (void)state;
    char b[8];
    assert_int_equal(sd_reason_format(b, sizeof b, "killed", SD_REASON_NONE, 9, SD_REASON_NONE),
                     strlen("killed(signal 9)"));
    assert_string_equal(b, "killed(");
}

static void reason_from_json(void **state)
{
    (void)state;
    char b[SD_REASON_TEXT_MAX];
    json_t *rec = json_pack("{s:s, s:i, s:n, s:i}", "reason", "killed", "code", 0, "signal",
                            "silent_ms", 0);
    sd_reason_format_json(b, sizeof b, rec);
    assert_string_equal(b, "killed"); /* signal null: no value */
    json_object_set_new(rec, "signal", json_integer(9));
    sd_reason_format_json(b, sizeof b, rec);
    assert_string_equal(b, "killed(signal 9)");
    json_object_set_new(rec, "reason", json_string("hung"));
    json_object_set_new(rec, "silent_ms", json_integer(4000));
    sd_reason_format_json(b, sizeof b, rec);
    assert_string_equal(b, "hung(silent 4000ms)");
    json_object_del(rec, "reason");
    sd_reason_format_json(b, sizeof b, rec);
    assert_string_equal(b, "-");
    json_decref(rec);
}

static void tables(void **state)
{
    (void)state;
    assert_int_equal(SD_EV_COUNT, 3);
    assert_string_equal(sd_event_type_name(SD_EV_STOPPED), "stopped");
    assert_null(sd_event_type_name(SD_EV_COUNT));
    assert_int_equal(sd_event_type_parse("ready"), SD_EV_READY);
    assert_int_equal(sd_event_type_parse("Ready"), -1);
    assert_int_equal(sd_event_type_parse(NULL), -1);
    assert_int_equal(SD_STOP_COUNT, 9);
    for (int r = 0; r < SD_STOP_COUNT; r++)
        assert_int_equal(sd_stop_reason_parse(sd_stop_reason_name((sd_stop_reason_t)r)), r);
    assert_string_equal(sd_stop_reason_name(SD_STOP_BY_OPERATOR), "stopped_by_operator");
    assert_int_equal(sd_stop_reason_parse("oom"), -1);
}

static void names(void **state)
{
    (void)state;
    char longest[SD_NAME_MAX + 2];
    memset(longest, 'a', SD_NAME_MAX + 1);
    longest[SD_NAME_MAX + 1] = 0;
    assert_false(sd_name_valid(longest, SD_NAME_MAX));
    longest[SD_NAME_MAX] = 0;
    assert_true(sd_name_valid(longest, SD_NAME_MAX));
    assert_true(sd_name_valid("zone-m1_2.x:y@z", SD_NAME_MAX));
    assert_false(sd_name_valid("", SD_NAME_MAX));
    assert_false(sd_name_valid(NULL, SD_NAME_MAX));
    assert_false(sd_name_valid(".a", SD_NAME_MAX));
    assert_false(sd_name_valid("-a", SD_NAME_MAX));
    assert_false(sd_name_valid("a..b", SD_NAME_MAX));
    assert_false(sd_name_valid("a/b", SD_NAME_MAX));
    assert_false(sd_name_valid("a b", SD_NAME_MAX));
    assert_string_equal(SD_STR(SD_EVENTS_MAX), "1000");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reason_wording), cmocka_unit_test(reason_truncates),
        cmocka_unit_test(reason_from_json), cmocka_unit_test(tables), cmocka_unit_test(names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
