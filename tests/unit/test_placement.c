/* The primary's placement function (bigbrother/placement.c): spread, stability, eligible
 * machines (live, not draining, labels), capacity and max_per_machine, rolling restarts
 * bounded by max_unavailable, stopped services and a stopped cluster, bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "placement.h"

/* A state with `machines` (JSON array text) and one service "zone" of `count` slots;
 * extra: JSON members of the service entry, placement: the spec's placement object. */
static json_t *mkstate(const char *machines, int count, const char *placement,
                       const char *extra)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"version\":1, \"cluster_stopped\":false, \"machines\":%s,"
             " \"services\":[{\"service\":\"zone\", \"version\":3, \"stopped\":false,"
             " \"restart_token\":0 %s, \"spec\":{\"command\":\"/bin/true\", \"count\":%d,"
             " \"placement\":%s, \"health\":{\"type\":\"none\"}}}],"
             " \"assignments\":{}}",
             machines, extra ? extra : "", count, placement ? placement : "{}");
    json_error_t e;
    json_t *s = json_loads(text, 0, &e);
    if (!s)
        fail_msg("bad test state: %s", e.text);
    return s;
}

static const char *THREE =
    "[{\"machine\":\"m1\",\"state\":\"live\",\"labels\":{\"zone\":\"eu\"},\"capacity\":100},"
    " {\"machine\":\"m2\",\"state\":\"live\",\"labels\":{\"zone\":\"eu\"},\"capacity\":100},"
    " {\"machine\":\"m3\",\"state\":\"live\",\"labels\":{\"zone\":\"us\"},\"capacity\":100}]";

/* Runs bb_place and writes the changed lists back into state.assignments, as ServerDir
 * would after the PUT. Returns how many machines changed. */
static int place(json_t *state, const json_t *ready, json_t *inflight, bb_place_stats_t *st)
{
    json_t *out = NULL;
    assert_int_equal(bb_place(state, ready, inflight, &out, st), 0);
    assert_non_null(out);
    int n = (int)json_object_size(out);
    const char *m;
    json_t *list;
    json_t *as = json_object_get(state, "assignments");
    json_object_foreach(out, m, list)
        json_object_set_new(as, m, json_pack("{s:s, s:O}", "machine", m, "slots", list));
    json_decref(out);
    return n;
}

static int nslots(const json_t *state, const char *m)
{
    return (int)json_array_size(
        json_object_get(json_object_get(json_object_get(state, "assignments"), m), "slots"));
}

/* The machine holding slot `slot` of zone, or NULL. */
static const char *where(const json_t *state, int slot)
{
    const char *m;
    json_t *doc;
    json_object_foreach(json_object_get(state, "assignments"), m, doc) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(doc, "slots"), i, e)
            if (json_integer_value(json_object_get(e, "slot")) == slot)
                return m;
    }
    return NULL;
}

static void set_count(json_t *state, int count)
{
    json_t *svc = json_array_get(json_object_get(state, "services"), 0);
    json_object_set_new(json_object_get(svc, "spec"), "count", json_integer(count));
    json_object_set_new(svc, "version",
                        json_integer(json_integer_value(json_object_get(svc, "version")) + 1));
}

static void spreads_and_stays(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 30, NULL, NULL), *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    assert_int_equal(place(st, ready, inf, &s), 3);
    assert_int_equal(s.placed, 30);
    assert_int_equal(nslots(st, "m1"), 10);
    assert_int_equal(nslots(st, "m2"), 10);
    assert_int_equal(nslots(st, "m3"), 10);
    /* the same input again changes nothing */
    assert_int_equal(place(st, ready, inf, &s), 0);
    assert_int_equal(s.kept, 30);
    /* scale down to 5: slots 0..4 stay where they were, nothing new is placed */
    const char *before[5];
    for (int i = 0; i < 5; i++)
        before[i] = strdup(where(st, i));
    set_count(st, 5);
    place(st, ready, inf, &s);
    assert_int_equal(s.kept, 5);
    assert_int_equal(s.placed, 0);
    assert_int_equal(s.removed, 25);
    assert_int_equal(nslots(st, "m1") + nslots(st, "m2") + nslots(st, "m3"), 5);
    for (int i = 0; i < 5; i++) {
        assert_string_equal(where(st, i), before[i]);
        free((void *)before[i]);
    }
    /* kept entries carry the new spec version (count only: no restart) */
    json_t *e = json_array_get(json_object_get(json_object_get(json_object_get(st,
                               "assignments"), where(st, 0)), "slots"), 0);
    assert_int_equal(json_integer_value(json_object_get(e, "spec_version")), 4);
    assert_int_equal(s.rolled, 0);
    /* scale up again: the new slots go to the machines with the fewest */
    set_count(st, 9);
    place(st, ready, inf, &s);
    assert_int_equal(s.kept, 5);
    assert_int_equal(s.placed, 4);
    assert_int_equal(nslots(st, "m1"), 3);
    assert_int_equal(nslots(st, "m2"), 3);
    assert_int_equal(nslots(st, "m3"), 3);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void ineligible_machines_lose_their_slots(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 9, NULL, NULL), *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    int n1 = 0;
    for (int i = 0; i < 9; i++)
        n1 += !strcmp(where(st, i), "m1");
    assert_int_equal(n1, 3);
    /* m2 drains, m3 is lost: everything goes to m1; m1's slots did not move */
    json_t *ms = json_object_get(st, "machines");
    json_object_set_new(json_array_get(ms, 1), "draining", json_true());
    json_object_set_new(json_array_get(ms, 2), "state", json_string("lost"));
    assert_int_equal(place(st, ready, inf, &s), 3);
    assert_int_equal(s.kept, 3);
    assert_int_equal(s.placed, 6);
    assert_int_equal(s.removed, 6);
    assert_int_equal(nslots(st, "m1"), 9);
    assert_int_equal(nslots(st, "m2"), 0);
    assert_int_equal(nslots(st, "m3"), 0);
    json_decref(st);
    /* labels: zone=eu only on m1 and m2 */
    st = mkstate(THREE, 4, "{\"labels\":{\"zone\":\"eu\"}}", NULL);
    place(st, ready, inf, &s);
    assert_int_equal(nslots(st, "m1"), 2);
    assert_int_equal(nslots(st, "m2"), 2);
    assert_int_equal(nslots(st, "m3"), 0);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void capacity_and_max_per_machine(void **unused)
{
    (void)unused;
    json_t *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    json_t *st = mkstate(THREE, 10, "{\"max_per_machine\":2}", NULL);
    place(st, ready, inf, &s);
    assert_int_equal(s.placed, 6);
    assert_int_equal(s.unplaced, 4);
    assert_int_equal(nslots(st, "m1"), 2);
    json_decref(st);
    st = mkstate("[{\"machine\":\"a\",\"state\":\"live\",\"capacity\":1},"
                 " {\"machine\":\"b\",\"state\":\"live\",\"capacity\":3}]",
                 5, NULL, NULL);
    place(st, ready, inf, &s);
    assert_int_equal(nslots(st, "a"), 1);
    assert_int_equal(nslots(st, "b"), 3);
    assert_int_equal(s.unplaced, 1);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

/* Marks every assigned slot ready with instance "<slot>-<gen>". */
static void all_ready(const json_t *st, json_t *ready, int gen)
{
    const char *m;
    json_t *doc;
    json_object_clear(ready);
    json_object_foreach(json_object_get(st, "assignments"), m, doc) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(doc, "slots"), i, e) {
            char key[300], id[64];
            int slot = (int)json_integer_value(json_object_get(e, "slot"));
            int tok = (int)json_integer_value(json_object_get(e, "restart_token"));
            snprintf(key, sizeof(key), "%s|zone|%d", m, slot);
            snprintf(id, sizeof(id), "%d-%d", slot, gen + tok);
            json_object_set_new(ready, key, json_string(id));
        }
    }
}

static void rolling_restart_keeps_max_unavailable(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 6, NULL, ", \"max_unavailable\":2");
    json_t *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    all_ready(st, ready, 0);
    json_t *svc = json_array_get(json_object_get(st, "services"), 0);
    json_object_set_new(svc, "restart_token", json_integer(1));
    int rounds = 0, total = 0;
    while (total < 6 && rounds++ < 20) {
        place(st, ready, inf, &s);
        assert_true(s.rolled <= 2);
        total += s.rolled;
        /* nothing else moves while the old instances still show ready */
        place(st, ready, inf, &s);
        assert_int_equal(s.rolled, 0);
        all_ready(st, ready, 100); /* the restarted ones come back with new ids */
    }
    assert_int_equal(total, 6);
    assert_int_equal(rounds, 3);
    place(st, ready, inf, &s); /* sees the last two ready: the restart is done */
    assert_int_equal(s.rolled, 0);
    assert_int_equal(json_object_size(inf), 0);
    /* a spec change rolls the same way; a slot already down is updated at once */
    json_object_set_new(json_object_get(svc, "spec"), "args", json_pack("[s]", "-x"));
    char key[64];
    snprintf(key, sizeof(key), "%s|zone|0", where(st, 0));
    json_object_del(ready, key);
    place(st, ready, inf, &s);
    assert_int_equal(s.rolled, 2); /* slot 0 (down) and one more */
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void instance_restart_bumps_one_slot(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 3, NULL, ", \"restart_token\":4"), *ready = json_object();
    json_t *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    all_ready(st, ready, 0);
    json_object_set_new(json_array_get(json_object_get(st, "services"), 0),
                        "slot_restart_tokens", json_pack("{s:i}", "2", 1));
    assert_int_equal(place(st, ready, inf, &s), 1);
    assert_int_equal(s.rolled, 1);
    json_t *slots = json_object_get(json_object_get(json_object_get(st, "assignments"),
                                                    where(st, 2)), "slots");
    json_t *e = json_array_get(slots, 0);
    assert_int_equal(json_integer_value(json_object_get(e, "slot")), 2);
    assert_int_equal(json_integer_value(json_object_get(e, "restart_token")), 5);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void stopped_service_and_cluster(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 6, NULL, NULL), *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    json_object_set_new(st, "cluster_stopped", json_true());
    assert_int_equal(place(st, ready, inf, &s), 3);
    assert_int_equal(nslots(st, "m1") + nslots(st, "m2") + nslots(st, "m3"), 0);
    json_object_set_new(st, "cluster_stopped", json_false());
    place(st, ready, inf, &s);
    assert_int_equal(s.placed, 6);
    json_object_set_new(json_array_get(json_object_get(st, "services"), 0), "stopped",
                        json_true());
    place(st, ready, inf, &s);
    assert_int_equal(s.removed, 6);
    assert_int_equal(nslots(st, "m1") + nslots(st, "m2") + nslots(st, "m3"), 0);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void bad_state_is_refused(void **unused)
{
    (void)unused;
    json_t *out = (json_t *)1, *inf = json_object(), *ready = json_object();
    bb_place_stats_t s;
    json_t *bad = json_pack("{s:s}", "services", "nope");
    assert_int_equal(bb_place(bad, ready, inf, &out, &s), -1);
    assert_null(out);
    json_decref(bad);
    bad = json_pack("{s:[{s:s}], s:[]}", "services", "service", "x", "machines");
    assert_int_equal(bb_place(bad, ready, inf, &out, &s), -1);
    json_decref(bad);
    /* a service named twice */
    bad = json_pack("{s:[{s:s, s:{s:i}}, {s:s, s:{s:i}}], s:[]}", "services", "service", "x",
                    "spec", "count", 1, "service", "x", "spec", "count", 2, "machines");
    assert_int_equal(bb_place(bad, ready, inf, &out, &s), -1);
    json_decref(bad);
    /* a current slot entry without a slot number is dropped, not taken for slot 0 */
    json_t *st = mkstate(THREE, 1, NULL, NULL);
    json_object_set_new(json_object_get(st, "assignments"), "m3",
                        json_pack("{s:[{s:s}]}", "slots", "service", "zone"));
    assert_int_equal(bb_place(st, ready, inf, &out, &s), 0);
    assert_int_equal(s.removed, 1);
    assert_int_equal(s.placed, 1);
    json_decref(out);
    json_decref(st);
    /* nor is one without a service name taken for a service named "" (found by
     * fuzz.placement; regression input in tests/fuzz/regressions/placement/) */
    st = mkstate(THREE, 1, NULL, NULL);
    json_object_set_new(json_array_get(json_object_get(st, "services"), 0), "service",
                        json_string(""));
    json_object_set_new(json_object_get(st, "assignments"), "m3",
                        json_pack("{s:[{s:i}]}", "slots", "slot", 0));
    assert_int_equal(bb_place(st, ready, inf, &out, &s), 0);
    assert_int_equal(s.removed, 1);
    assert_int_equal(s.placed, 1);
    json_decref(out);
    json_decref(st);
    json_decref(inf);
    json_decref(ready);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spreads_and_stays),
        cmocka_unit_test(ineligible_machines_lose_their_slots),
        cmocka_unit_test(capacity_and_max_per_machine),
        cmocka_unit_test(rolling_restart_keeps_max_unavailable),
        cmocka_unit_test(instance_restart_bumps_one_slot),
        cmocka_unit_test(stopped_service_and_cluster),
        cmocka_unit_test(bad_state_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
