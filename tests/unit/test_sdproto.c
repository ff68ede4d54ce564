/* The wire contract (common/sdproto.c): the event type and stop reason tables, names,
 * the event check and the one text form of a stop reason. */
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
    assert_int_equal(SD_EV_COUNT, 6);
    assert_string_equal(sd_event_type_name(SD_EV_STOPPED), "stopped");
    assert_null(sd_event_type_name(SD_EV_COUNT));
    assert_int_equal(sd_event_type_parse("ready"), SD_EV_READY);
    assert_int_equal(sd_event_type_parse("Ready"), -1);
    assert_int_equal(sd_event_type_parse(NULL), -1);
    assert_int_equal(SD_STOP_COUNT, 11);
    for (int r = 0; r < SD_STOP_COUNT; r++)
        assert_int_equal(sd_stop_reason_parse(sd_stop_reason_name((sd_stop_reason_t)r)), r);
    assert_string_equal(sd_stop_reason_name(SD_STOP_BY_OPERATOR), "stopped_by_operator");
    assert_int_equal(sd_stop_reason_parse("oom"), -1);
    /* the flags every list of reasons is read from */
    assert_true(sd_stop_reason_flags(SD_STOP_HUNG) & SD_STOP_F_SILENT);
    assert_true(sd_stop_reason_flags(SD_STOP_START_TIMEOUT) & SD_STOP_F_SILENT);
    assert_false(sd_stop_reason_flags(SD_STOP_KILLED) & SD_STOP_F_SILENT);
    assert_true(sd_stop_reason_flags(SD_STOP_MACHINE_LOST) & SD_STOP_F_FAILURE);
    assert_false(sd_stop_reason_flags(SD_STOP_MACHINE_LOST) & SD_STOP_F_COUNTED);
    assert_true(sd_stop_reason_flags(SD_STOP_DISCONNECTED) & SD_STOP_F_FAILURE);
    assert_false(sd_stop_reason_flags(SD_STOP_CRASH_LOOP) & SD_STOP_F_CRASH);
    assert_int_equal(sd_stop_reason_flags(SD_STOP_DRAINED), 0);
    assert_int_equal(sd_stop_reason_flags(SD_STOP_COUNT), 0);
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

/* sd_event_check on the JSON text ev as element i; returns the message ("" when valid). */
static const char *check(const char *ev, int i, char *err, size_t cap)
{
    json_t *e = json_loads(ev, 0, NULL);
    assert_non_null(e);
    err[0] = 0;
    sd_jv_t v;
    sd_jv_init(&v, "events", err, cap);
    sd_jv_index(&v, (size_t)i);
    int rc = sd_event_check(&v, e);
    json_decref(e);
    assert_int_equal(rc, err[0] ? -1 : 0);
    return err;
}

static void event_contract(void **state)
{
    (void)state;
    char e[256];
#define EV(extra)                                                                          \
    "{\"id\":\"e1\",\"instance\":\"z-1\",\"machine\":\"m1\",\"service\":\"z\"," extra "}"
    assert_string_equal(
        check(EV("\"type\":\"started\",\"pid\":7,\"ports\":{\"game\":27960}"), 0, e, sizeof e), "");
    assert_string_equal(check(EV("\"type\":\"ready\",\"reason\":null"), 0, e, sizeof e), "");
    assert_string_equal(check(EV("\"type\":\"stopped\",\"reason\":\"hung\",\"silent_ms\":3012,"
                                 "\"signal\":6,\"code\":null"), 0, e, sizeof e), "");
    assert_string_equal(check("[]", 2, e, sizeof e), "events[2] must be an object");
    assert_string_equal(check(EV("\"type\":\"ready\",\"color\":1"), 0, e, sizeof e),
                        "events[0] has an unknown field 'color'");
    assert_string_equal(check(EV("\"type\":\"exploded\""), 1, e, sizeof e),
                        "events[1].type must be started, ready, stopped, status, confirmed or released");
    assert_string_equal(check(EV("\"type\":\"started\""), 0, e, sizeof e),
                        "events[0].pid is required");
    assert_string_equal(check(EV("\"type\":\"stopped\",\"reason\":\"oom\""), 3, e, sizeof e),
                        "events[3].reason must be one of exited, killed, hung, start_timeout, "
                        "crash_loop, stopped_by_operator, machine_lost, drained, replaced, orphaned, "
                        "disconnected");
    assert_string_equal(check(EV("\"type\":\"ready\",\"signal\":9"), 0, e, sizeof e),
                        "events[0].signal is only allowed in a stopped event");
    assert_string_equal(check(EV("\"type\":\"ready\",\"ports\":{\"a/b\":1}"), 0, e, sizeof e),
                        "events[0].ports has a bad port name (1-64 characters of A-Z a-z 0-9 _ . "
                        ": @ -)");
    assert_string_equal(check(EV("\"type\":\"ready\",\"ports\":{\"game\":0}"), 0, e, sizeof e),
                        "events[0].ports.game must be between 1 and 65535");
    /* the crash report: stopped only, log_tail at most 4 KiB, core at most 256 bytes */
    assert_string_equal(check(EV("\"type\":\"stopped\",\"reason\":\"killed\",\"signal\":6,"
                                 "\"log_tail\":\"line 1\\nline 2\",\"core\":\"/srv/core.7\""),
                              0, e, sizeof e), "");
    assert_string_equal(check(EV("\"type\":\"ready\",\"log_tail\":\"x\""), 0, e, sizeof e),
                        "events[0].log_tail is only allowed in a stopped event");
    {
        char big[4200 + 200];
        int n = snprintf(big, sizeof big, "%s", EV("\"type\":\"stopped\",\"reason\":\"hung\","
                                                   "\"log_tail\":\""));
        n -= 1; /* over the closing brace */
        memset(big + n, 'x', 4097);
        snprintf(big + n + 4097, sizeof big - (size_t)n - 4097, "\"}");
        assert_string_equal(check(big, 0, e, sizeof e),
                            "events[0].log_tail is longer than 4096 bytes");
    }
    assert_string_equal(check("{\"id\":\"e 1\",\"type\":\"ready\"}", 0, e, sizeof e),
                        "events[0].id must be 1-128 characters of A-Z a-z 0-9 _ . : @ - (not "
                        "starting with '.' or '-', no '..')");
#undef EV
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reason_wording), cmocka_unit_test(reason_truncates),
        cmocka_unit_test(reason_from_json), cmocka_unit_test(tables), cmocka_unit_test(names),
        cmocka_unit_test(event_contract),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
