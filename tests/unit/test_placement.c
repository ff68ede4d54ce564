/* The primary's placement function (bigbrother/cluster/placement.c): spread, stability, eligible
 * machines (live, not draining, labels), capacity and max_per_machine, rolling restarts
 * bounded by max_unavailable, stopped services and a stopped cluster, bad input; and the
 * pool sizing (bb_pool_count): buffer as a number and a share, min/max, the delay of a
 * decrease, the allocated-slot floor, scale to zero and back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "cluster/bb_cluster.h"

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

/* ---------------------------------------------------------------- pools */

#define NOW 1764212400000LL /* a wall clock in ms */

static json_t *jparse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j)
        fail_msg("bad test JSON: %s", e.text);
    return j;
}

/* bb_pool_count with the pool and statistics given as JSON text. */
static int pool_count(const char *pool, int allocated, int max_slot, int64_t demand_ms,
                      int current, int64_t now, bb_pool_window_t *w)
{
    json_t *p = jparse(pool);
    json_t *stats = json_pack("{s:i, s:i, s:i, s:I}", "allocated", allocated, "ready_free",
                              0, "max_allocated_slot", max_slot, "last_demand_ms",
                              (json_int_t)demand_ms);
    int n = bb_pool_count(p, stats, current, now, w);
    json_decref(p);
    json_decref(stats);
    return n;
}

static void pool_buffer_number_and_bounds(void **unused)
{
    (void)unused;
    bb_pool_window_t w = {0};
    const char *pool = "{\"buffer\": 4}";
    /* demand a second ago, nothing running: the buffer, at once */
    assert_int_equal(pool_count(pool, 0, -1, NOW - 1000, 0, NOW, &w), 4);
    assert_int_equal(pool_count(pool, 3, 2, NOW - 1000, 4, NOW, &w), 7);
    assert_int_equal(pool_count(pool, 100000, 99999, NOW, 100000, NOW, &w), 100000);
    /* clamped to [min, max] */
    pool = "{\"buffer\": 4, \"min\": 10, \"max\": 12}";
    assert_int_equal(pool_count(pool, 1, 0, NOW, 0, NOW, &w), 10);
    assert_int_equal(pool_count(pool, 7, 6, NOW, 10, NOW, &w), 11);
    assert_int_equal(pool_count(pool, 30, 29, NOW, 11, NOW, &w), 12);
    /* buffer 0: exactly what is allocated */
    assert_int_equal(pool_count("{\"buffer\": 0}", 5, 4, NOW, 0, NOW, &w), 5);
    /* no statistics at all (a ServerDir without pools): nothing allocated, no demand */
    json_t *p = jparse("{\"buffer\": 4, \"min\": 2}");
    assert_int_equal(bb_pool_count(p, NULL, 0, NOW, &w), 2);
    json_decref(p);
}

/* The smallest N > allocated with N - allocated >= pct% of N, by search. */
static int share_by_search(int allocated, int pct)
{
    for (int n = allocated + 1;; n++)
        if ((n - allocated) * 100 >= pct * n)
            return n;
}

static void pool_buffer_share(void **unused)
{
    (void)unused;
    bb_pool_window_t w = {0};
    assert_int_equal(pool_count("{\"buffer\": \"25%\"}", 3, 2, NOW, 0, NOW, &w), 4);
    assert_int_equal(pool_count("{\"buffer\": \"25%\"}", 6, 5, NOW, 0, NOW, &w), 8);
    assert_int_equal(pool_count("{\"buffer\": \"25%\"}", 7, 6, NOW, 0, NOW, &w), 10);
    assert_int_equal(pool_count("{\"buffer\": \"99%\"}", 1, 0, NOW, 0, NOW, &w), 100);
    /* nothing allocated but a recent request: one instance (a share of 0 would leave the
     * pool empty for good) */
    assert_int_equal(pool_count("{\"buffer\": \"10%\"}", 0, -1, NOW - 5, 0, NOW, &w), 1);
    /* capped by max (default 100000) */
    assert_int_equal(pool_count("{\"buffer\": \"99%\"}", 5000, 4999, NOW, 0, NOW, &w),
                     100000);
    static const int pcts[] = {1, 10, 25, 33, 50, 75, 99};
    char pool[64];
    for (size_t k = 0; k < sizeof(pcts) / sizeof(pcts[0]); k++) {
        snprintf(pool, sizeof(pool), "{\"buffer\": \"%d%%\"}", pcts[k]);
        for (int a = 1; a <= 300; a++) {
            int want = share_by_search(a, pcts[k]);
            assert_int_equal(pool_count(pool, a, a - 1, NOW, want, NOW, &w), want);
        }
    }
}

static void pool_refuses_bad_shapes(void **unused)
{
    (void)unused;
    static const char *const bad[] = {
        "{\"buffer\": \"0%\"}",   "{\"buffer\": \"100%\"}", "{\"buffer\": \"x%\"}",
        "{\"buffer\": \"5\"}",    "{\"buffer\": \"-5%\"}",  "{\"buffer\": \"5 %\"}",
        "{\"buffer\": -1}",       "{\"buffer\": 100001}",   "{\"buffer\": 1.5}",
        "{\"buffer\": 1, \"min\": 5, \"max\": 4}", "{\"buffer\": 1, \"max\": -1}",
        "{\"buffer\": 1, \"scale_down_delay_s\": 86401}", "[1]", "7"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        bb_pool_window_t w = {.surplus_since_ms = 5, .surplus_peak = 6};
        assert_int_equal(pool_count(bad[k], 0, -1, NOW, 3, NOW, &w), -1);
        assert_int_equal(w.surplus_since_ms, 5);
        assert_int_equal(w.surplus_peak, 6);
    }
    /* the defaults: min 0, max 100000, scale_down_delay_s 30, buffer 0 */
    bb_pool_window_t w = {0};
    assert_int_equal(pool_count("{}", 2, 1, NOW, 9, NOW, &w), 9);
    assert_int_equal(pool_count("{}", 2, 1, NOW, 9, NOW + 29999, &w), 9);
    assert_int_equal(pool_count("{}", 2, 1, NOW, 9, NOW + 30000, &w), 2);
}

static void pool_decrease_waits_for_the_delay(void **unused)
{
    (void)unused;
    bb_pool_window_t w = {0};
    const char *pool = "{\"buffer\": 4, \"scale_down_delay_s\": 30}";
    /* 3 allocated: 7. Two released: 5 is wanted, 7 stays for 30 s */
    assert_int_equal(pool_count(pool, 3, 6, NOW, 0, NOW, &w), 7);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 7, NOW + 1000, &w), 7);
    assert_int_equal(w.surplus_since_ms, NOW + 1000);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 7, NOW + 30999, &w), 7);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 7, NOW + 31000, &w), 5);
    assert_int_equal(w.surplus_since_ms, 0);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 5, NOW + 32000, &w), 5);
    /* a rise in between applies at once and ends the window: the delay starts again */
    assert_int_equal(pool_count(pool, 0, -1, NOW + 40000, 5, NOW + 40000, &w), 5);
    assert_int_equal(w.surplus_since_ms, NOW + 40000);
    assert_int_equal(pool_count(pool, 0, -1, NOW + 50000, 5, NOW + 50000, &w), 5);
    assert_int_equal(pool_count(pool, 3, 2, NOW + 55000, 5, NOW + 55000, &w), 7);
    assert_int_equal(w.surplus_since_ms, 0);
    assert_int_equal(pool_count(pool, 0, -1, NOW + 60000, 7, NOW + 60000, &w), 7);
    assert_int_equal(pool_count(pool, 0, -1, NOW + 89999, 7, NOW + 89999, &w), 7);
    assert_int_equal(pool_count(pool, 0, -1, NOW + 90000, 7, NOW + 90000, &w), 4);
    /* the decrease goes to the highest count wanted during the delay, then further
     * only after another delay */
    w = (bb_pool_window_t){0};
    assert_int_equal(pool_count(pool, 2, 9, NOW, 10, NOW, &w), 10);        /* wants 6 */
    assert_int_equal(pool_count(pool, 4, 9, NOW, 10, NOW + 10000, &w), 10); /* wants 8 */
    assert_int_equal(pool_count(pool, 1, 9, NOW, 10, NOW + 20000, &w), 10); /* wants 5 */
    assert_int_equal(pool_count(pool, 1, 0, NOW, 10, NOW + 30000, &w), 8);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 8, NOW + 31000, &w), 8);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 8, NOW + 60999, &w), 8);
    assert_int_equal(pool_count(pool, 1, 0, NOW, 8, NOW + 61000, &w), 5);
    /* scale_down_delay_s 0: at once */
    w = (bb_pool_window_t){0};
    assert_int_equal(pool_count("{\"buffer\": 1, \"scale_down_delay_s\": 0}", 1, 0, NOW,
                                9, NOW, &w), 2);
    /* max lowered below the count: a decrease like any other */
    w = (bb_pool_window_t){0};
    pool = "{\"buffer\": 4, \"max\": 3}";
    assert_int_equal(pool_count(pool, 0, -1, NOW, 6, NOW, &w), 6);
    assert_int_equal(pool_count(pool, 0, -1, NOW, 6, NOW + 30000, &w), 3);
}

static void pool_never_removes_an_allocated_slot(void **unused)
{
    (void)unused;
    bb_pool_window_t w = {0};
    const char *pool = "{\"buffer\": 2}";
    /* 10 slots, 3 allocated, the highest being slot 8: 5 wanted, 9 kept */
    assert_int_equal(pool_count(pool, 3, 8, NOW, 10, NOW, &w), 10);
    assert_int_equal(pool_count(pool, 3, 8, NOW, 10, NOW + 30000, &w), 9);
    /* slot 8's match ends, slot 6 is the highest: down to 7 at once (the surplus lasted) */
    assert_int_equal(pool_count(pool, 3, 6, NOW, 9, NOW + 31000, &w), 7);
    assert_int_equal(pool_count(pool, 3, 2, NOW, 7, NOW + 32000, &w), 5);
    assert_int_equal(w.surplus_since_ms, 0);
    /* a floor above the count removes nothing and adds nothing */
    w = (bb_pool_window_t){0};
    assert_int_equal(pool_count(pool, 1, 20, NOW, 10, NOW, &w), 10);
    assert_int_equal(pool_count(pool, 1, 20, NOW, 10, NOW + 60000, &w), 10);
}

static void pool_scales_to_zero_and_back(void **unused)
{
    (void)unused;
    bb_pool_window_t w = {0};
    const char *pool = "{\"buffer\": 4, \"scale_down_delay_s\": 30}";
    /* a fresh pool nobody asked for (last_demand_ms 0): nothing */
    assert_int_equal(pool_count(pool, 0, -1, 0, 0, NOW, &w), 0);
    /* a request (answered no_capacity) is demand: the buffer at once */
    assert_int_equal(pool_count(pool, 0, -1, NOW, 0, NOW, &w), 4);
    /* the last request 29 s ago still holds the pool */
    assert_int_equal(pool_count(pool, 0, -1, NOW, 4, NOW + 29000, &w), 4);
    assert_int_equal(w.surplus_since_ms, 0);
    /* no request for 30 s and nothing allocated: 0 is wanted, and applies 30 s later */
    assert_int_equal(pool_count(pool, 0, -1, NOW, 4, NOW + 30000, &w), 4);
    assert_int_equal(pool_count(pool, 0, -1, NOW, 4, NOW + 59999, &w), 4);
    assert_int_equal(pool_count(pool, 0, -1, NOW, 4, NOW + 60000, &w), 0);
    assert_int_equal(pool_count(pool, 0, -1, NOW, 0, NOW + 90000, &w), 0);
    /* the next request brings it back at once */
    assert_int_equal(pool_count(pool, 0, -1, NOW + 95000, 0, NOW + 95000, &w), 4);
    /* an allocated instance keeps the pool up however old the last request */
    w = (bb_pool_window_t){0};
    assert_int_equal(pool_count(pool, 1, 3, NOW, 5, NOW + 3600000, &w), 5);
    /* min > 0: never below it */
    w = (bb_pool_window_t){0};
    pool = "{\"buffer\": 4, \"min\": 2, \"scale_down_delay_s\": 0}";
    assert_int_equal(pool_count(pool, 0, -1, 0, 4, NOW, &w), 2);
}

/* A pool service sized by bb_pool_count, then placed: a change of the pool, or of
 * confirm_timeout_ms, resizes without restarting; a change of on_release restarts. */
static void pool_changes_do_not_restart(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 0, NULL, NULL), *ready = json_object(), *inf = json_object();
    json_t *svc = json_array_get(json_object_get(st, "services"), 0);
    json_t *spec = json_object_get(svc, "spec");
    json_object_set_new(spec, "pool", jparse("{\"buffer\": 3}"));
    json_object_set_new(spec, "on_release", json_string("recycle"));
    json_object_set_new(spec, "confirm_timeout_ms", json_integer(10000));
    bb_pool_window_t w = {0};
    json_t *stats = jparse("{\"allocated\": 0, \"last_demand_ms\": 1764212400000}");
    int n = bb_pool_count(json_object_get(spec, "pool"), stats, 0, NOW, &w);
    assert_int_equal(n, 3);
    set_count(st, n);
    bb_place_stats_t s;
    assert_int_equal(place(st, ready, inf, &s), 3);
    assert_int_equal(s.placed, 3);
    all_ready(st, ready, 0);
    /* the buffer grows: 2 more slots, the 3 running ones stay as they are (a new spec
     * object: the assigned entries may share the old one) */
    spec = json_deep_copy(spec);
    json_object_set_new(svc, "spec", spec);
    json_object_set_new(spec, "pool", jparse("{\"buffer\": 5}"));
    json_object_set_new(spec, "confirm_timeout_ms", json_integer(20000));
    n = bb_pool_count(json_object_get(spec, "pool"), stats, n, NOW, &w);
    assert_int_equal(n, 5);
    set_count(st, n);
    place(st, ready, inf, &s);
    assert_int_equal(s.kept, 3);
    assert_int_equal(s.placed, 2);
    assert_int_equal(s.rolled, 0);
    all_ready(st, ready, 0);
    /* on_release is the process's: the slots roll, one at a time */
    spec = json_deep_copy(spec);
    json_object_set_new(svc, "spec", spec);
    json_object_set_new(spec, "on_release", json_string("restart"));
    set_count(st, n);
    place(st, ready, inf, &s);
    assert_int_equal(s.rolled, 1);
    json_t *proc = bb_spec_process_part(spec);
    assert_null(json_object_get(proc, "pool"));
    assert_null(json_object_get(proc, "confirm_timeout_ms"));
    assert_null(json_object_get(proc, "count"));
    assert_string_equal(json_string_value(json_object_get(proc, "on_release")), "restart");
    json_decref(proc);
    json_decref(stats);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

/* ---------------------------------------------------------------- disconnect */

/* Sets the zone service's spec.disconnect to the JSON text d. */
static void set_disconnect(json_t *state, const char *d)
{
    json_t *svc = json_array_get(json_object_get(state, "services"), 0);
    json_object_set_new(json_object_get(svc, "spec"), "disconnect", json_loads(d, 0, NULL));
}

/* Machine i of state: state (live, lost) and how long ago it was declared lost. */
static void set_machine(json_t *state, int i, const char *st, json_int_t lost_for_ms)
{
    json_t *m = json_array_get(json_object_get(state, "machines"), (size_t)i);
    json_object_set_new(m, "state", json_string(st));
    json_object_set_new(m, "lost_for_ms", json_integer(lost_for_ms));
}

/* The zone slots on machine m, as a bit set. */
static unsigned slots_on(const json_t *state, const char *m, int count)
{
    unsigned bits = 0;
    for (int i = 0; i < count; i++)
        if (where(state, i) && !strcmp(where(state, i), m))
            bits |= 1u << i;
    return bits;
}

static void lost_after_holds_the_slots_then_moves_them(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 9, NULL, NULL), *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    unsigned on3 = slots_on(st, "m3", 9);
    assert_int_not_equal(on3, 0);
    set_disconnect(st, "{\"lost_after_ms\":30000}");
    /* declared lost 0 ms and 29999 ms ago: m3 keeps its slots, nothing is placed */
    set_machine(st, 2, "lost", 0);
    assert_int_equal(place(st, ready, inf, &s), 0);
    assert_int_equal(s.placed, 0);
    assert_int_equal(slots_on(st, "m3", 9), on3);
    set_machine(st, 2, "lost", 29999);
    assert_int_equal(place(st, ready, inf, &s), 0);
    assert_int_equal(slots_on(st, "m3", 9), on3);
    /* the delay has passed: they go to m1 and m2 */
    set_machine(st, 2, "lost", 30000);
    assert_int_equal(place(st, ready, inf, &s), 3);
    assert_int_equal(s.placed, __builtin_popcount(on3));
    assert_int_equal(slots_on(st, "m3", 9), 0);
    assert_int_equal(nslots(st, "m1") + nslots(st, "m2"), 9);
    json_decref(st);
    /* without disconnect (today): moved at once */
    st = mkstate(THREE, 9, NULL, NULL);
    place(st, ready, inf, &s);
    set_machine(st, 2, "lost", 0);
    place(st, ready, inf, &s);
    assert_int_equal(slots_on(st, "m3", 9), 0);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void replace_false_never_moves_but_drain_does(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 9, NULL, NULL), *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    unsigned on3 = slots_on(st, "m3", 9);
    set_disconnect(st, "{\"replace\":false,\"lost_after_ms\":1000}");
    set_machine(st, 2, "lost", 7LL * 86400000);
    assert_int_equal(place(st, ready, inf, &s), 0);
    assert_int_equal(slots_on(st, "m3", 9), on3);
    assert_int_equal(s.kept, 9);
    /* nothing new goes to a lost machine: scaling up places on m1 and m2 only */
    set_count(st, 12);
    place(st, ready, inf, &s);
    assert_int_equal(slots_on(st, "m3", 12), on3);
    assert_int_equal(s.placed, 3);
    /* an operator's drain moves them even so */
    json_object_set_new(json_array_get(json_object_get(st, "machines"), 2), "draining",
                        json_true());
    place(st, ready, inf, &s);
    assert_int_equal(slots_on(st, "m3", 12), 0);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
}

static void keep_original_gives_the_slot_back(void **unused)
{
    (void)unused;
    json_t *st = mkstate(THREE, 9, NULL, NULL), *ready = json_object(), *inf = json_object();
    bb_place_stats_t s;
    place(st, ready, inf, &s);
    unsigned on3 = slots_on(st, "m3", 9);
    int x = __builtin_ctz(on3);
    set_disconnect(st, "{\"reconcile\":\"keep_original\"}");
    set_machine(st, 2, "lost", 0);
    place(st, ready, inf, &s);
    assert_int_equal(slots_on(st, "m3", 9), 0);
    const char *repl = strdup(where(st, x));
    /* m3 is back with slot x's original ready (and the replacement ready too) */
    set_machine(st, 2, "live", 0);
    char key[64];
    snprintf(key, sizeof key, "m3|zone|%d", x);
    json_object_set_new(ready, key, json_string("orig"));
    snprintf(key, sizeof key, "%s|zone|%d", repl, x);
    json_object_set_new(ready, key, json_string("repl"));
    /* not marked returned by the primary: nothing moves */
    assert_int_equal(place(st, ready, inf, &s), 0);
    json_object_set_new(json_array_get(json_object_get(st, "machines"), 2), "returned",
                        json_true());
    place(st, ready, inf, &s);
    assert_int_equal(s.given_back, 1);
    assert_int_equal(slots_on(st, "m3", 9), 1u << x);
    assert_int_equal(s.placed, 0);
    /* stable: the next pass changes nothing */
    assert_int_equal(place(st, ready, inf, &s), 0);
    json_decref(st);
    /* keep_replacement (the default): the same return leaves every slot where it went */
    st = mkstate(THREE, 9, NULL, NULL);
    place(st, ready, inf, &s);
    set_machine(st, 2, "lost", 0);
    place(st, ready, inf, &s);
    set_machine(st, 2, "live", 0);
    json_object_set_new(json_array_get(json_object_get(st, "machines"), 2), "returned",
                        json_true());
    assert_int_equal(place(st, ready, inf, &s), 0);
    assert_int_equal(s.given_back, 0);
    assert_int_equal(slots_on(st, "m3", 9), 0);
    free((void *)repl);
    json_decref(st);
    json_decref(ready);
    json_decref(inf);
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
        cmocka_unit_test(pool_buffer_number_and_bounds),
        cmocka_unit_test(pool_buffer_share),
        cmocka_unit_test(pool_refuses_bad_shapes),
        cmocka_unit_test(pool_decrease_waits_for_the_delay),
        cmocka_unit_test(pool_never_removes_an_allocated_slot),
        cmocka_unit_test(pool_scales_to_zero_and_back),
        cmocka_unit_test(pool_changes_do_not_restart),
        cmocka_unit_test(lost_after_holds_the_slots_then_moves_them),
        cmocka_unit_test(replace_false_never_moves_but_drain_does),
        cmocka_unit_test(keep_original_gives_the_slot_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
