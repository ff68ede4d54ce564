/* sdctl's output helpers: natural order of instance names, restarts from a record,
 * durations of --wait, a service's pool figures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "ctl.h"

static void natural_order(void **state)
{
    (void)state;
    assert_true(ctl_natural_cmp("zone-m1-2", "zone-m1-10") < 0);
    assert_true(ctl_natural_cmp("zone-m1-10", "zone-m1-2") > 0);
    assert_true(ctl_natural_cmp("zone-m2-1", "zone-m10-1") < 0);
    assert_int_equal(ctl_natural_cmp("zone-7", "zone-7"), 0);
    assert_int_equal(ctl_natural_cmp("zone-007", "zone-7"), 0);
    assert_true(ctl_natural_cmp("zone-7", "zone-7a") < 0);
    assert_true(ctl_natural_cmp("a", "b") < 0);
    assert_true(ctl_natural_cmp("", "a") < 0);
    assert_true(ctl_natural_cmp("x99999999999999999999", "x100000000000000000000") < 0);

    json_t *a = json_pack("[{s:s},{s:s},{s:s},{s:s}]", "instance", "zone-10", "instance",
                          "zone-2", "instance", "lobby-1", "instance", "zone-1");
    ctl_sort_natural(a, "instance");
    const char *want[] = {"lobby-1", "zone-1", "zone-2", "zone-10"};
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(a, i), "instance")),
                            want[i]);
    json_decref(a);
}

/* RESTARTS is the record's own `restarts` (bigbrother's count), never derived from the
 * generation, which also counts planned starts. */
static void restarts_from_the_record(void **state)
{
    (void)state;
    char buf[24];
    json_t *p = json_pack("{s:i, s:i}", "generation", 5, "restarts", 2);
    assert_string_equal(ctl_restarts(p, buf, sizeof buf), "2");
    json_object_del(p, "restarts");
    assert_string_equal(ctl_restarts(p, buf, sizeof buf), "-");
    json_decref(p);
}

/* --wait DURATION: milliseconds bare or with ms, s, m; within the bound; nothing else. */
static void durations(void **state)
{
    (void)state;
    int64_t ms = -1;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {{"0", 0}, {"500", 500}, {"500ms", 500}, {"2s", 2000}, {"1m", 60000},
                {"60000", 60000}, {"60s", 60000}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(ctl_parse_ms(good[i].text, 60000, &ms), 0);
        assert_int_equal(ms, good[i].ms);
    }
    static const char *const bad[] = {"", "-1", "2h", "61s", "60001", "1.5s", "s", "5 s",
                                      "99999999999999999999", "2m", "+5", NULL};
    for (const char *const *b = bad; *b; b++)
        assert_int_equal(ctl_parse_ms(*b, 60000, &ms), -1);
    /* hours, for logs --since */
    assert_int_equal(ctl_parse_ms("1h", 720LL * 3600000, &ms), 0);
    assert_int_equal(ms, 3600000);
    assert_int_equal(ctl_parse_ms("720h", 720LL * 3600000, &ms), 0);
    assert_int_equal(ctl_parse_ms("721h", 720LL * 3600000, &ms), -1);
    assert_int_equal(ctl_parse_ms("1d", 720LL * 3600000, &ms), -1);
}

/* Edit distances (a swap of neighbours counts one), and the suggestion: the closest name within a third of the
 * word (1 to 3 edits), none for a word unlike any. */
static void edit_distance_and_suggestion(void **state)
{
    (void)state;
    assert_int_equal(ctl_edit_distance("pss", "ps"), 1);
    assert_int_equal(ctl_edit_distance("ps", "ps"), 0);
    assert_int_equal(ctl_edit_distance("", "abc"), 3);
    assert_int_equal(ctl_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(ctl_edit_distance("machnes", "machines"), 1);
    assert_int_equal(ctl_edit_distance("--servce", "--service"), 1);
    char longw[CTL_SUGGEST_MAX + 2];
    memset(longw, 'a', sizeof longw - 1);
    longw[sizeof longw - 1] = '\0';
    assert_int_equal(ctl_edit_distance(longw, "a"), (size_t)-1);

    static const char *const cmds[] = {"ps", "logs", "locks", "machines", "status", "services",
                                       "start", "stop"};
    size_t n = sizeof cmds / sizeof cmds[0];
    assert_string_equal(ctl_suggest("pss", cmds, n), "ps");
    assert_string_equal(ctl_suggest("machnes", cmds, n), "machines");
    assert_int_equal(ctl_edit_distance("lgos", "logs"), 1); /* a swap is one edit */
    assert_string_equal(ctl_suggest("lgos", cmds, n), "logs");
    assert_string_equal(ctl_suggest("stauts", cmds, n), "status");
    assert_null(ctl_suggest("x", cmds, n));
    assert_null(ctl_suggest("deploy", cmds, n));
    assert_string_equal(ctl_suggest("stp", cmds, n), "stop"); /* the first of the closest */
}

/* ps --state stopped: the largest time first, records without one last. */
static void newest_first(void **state)
{
    (void)state;
    json_t *a = json_pack("[{s:s,s:i},{s:s},{s:s,s:i},{s:s,s:i}]", "instance", "a",
                          "stopped_at_ms", 100, "instance", "none", "instance", "b",
                          "stopped_at_ms", 300, "instance", "c", "stopped_at_ms", 200);
    ctl_sort_newest(a, "stopped_at_ms");
    const char *want[] = {"b", "c", "a", "none"};
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(a, i), "instance")),
                            want[i]);
    json_decref(a);
}

/* The pool figures show for a service whose spec has a pool, not for another. */
static void pool_text(void **state)
{
    (void)state;
    char buf[64];
    json_t *s = json_pack("{s:{s:s, s:{s:i}}, s:{s:i, s:i, s:i, s:i}}", "spec", "command", "/g",
                          "pool", "buffer", 4, "pool", "allocated", 2, "ready_free", 4,
                          "max_allocated_slot", 5, "last_demand_ms", 0);
    assert_string_equal(ctl_pool_text(s, buf, sizeof buf), "4 free / 2 alloc");
    json_object_del(json_object_get(s, "spec"), "pool");
    assert_null(ctl_pool_text(s, buf, sizeof buf));
    json_decref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(natural_order),
        cmocka_unit_test(restarts_from_the_record),
        cmocka_unit_test(durations),
        cmocka_unit_test(pool_text),
        cmocka_unit_test(edit_distance_and_suggestion),
        cmocka_unit_test(newest_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
