/* Cluster mode, operator actions on machines and instances: three bigbrothers (m1..m3).
 *   - drain m2: its instances get SHUTDOWN and stop with reason drained, their slots run
 *     on m1 and m3, and m2 stays empty; after undrain a scale-up fills m2 first;
 *   - restart one instance: only that slot gets a new instance (same machine, higher
 *     generation), every other instance keeps running;
 *   - a spec bigbrother refuses (command not executable) is reported as a stopped event
 *     with reason exited and detail "bad spec: ..." and starts nothing; bigbrother lives;
 *   - a bigbrother restarted (SIGTERM, start again on the same state dir) re-adopts its
 *     cluster slots: same processes, same instance ids, nothing restarted. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "harness_cluster.h"

static cl_t C;

static int has_primary(cl_t *c, void *arg)
{
    (void)arg;
    return cl_primary(c, NULL)[0] != 0;
}

/* m2 (index 1) runs nothing of zone and the others run all 6. */
static int drained(cl_t *c, void *arg)
{
    (void)arg;
    cl_conv_t w = {"zone", 6, 0};
    return cl_dir_count(c, "zone", NULL, "m2") == 0 && cl_running(c, 1, "zone") == 0 &&
           cl_converged(c, &w);
}

static void drain_moves_instances_off(void **state)
{
    (void)state;
    assert_true(cl_wait(&C, has_primary, NULL, cl_ms(15000)));
    assert_int_equal(cl_service(&C, "zone", 6, NULL, NULL), 200);
    cl_conv_t w = {"zone", 6, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(40000)));
    assert_int_equal(cl_dir_count(&C, "zone", "ready", "m2"), 2);
    assert_int_equal(cl_op(&C, "POST", "/machines/m2/drain", NULL), 200);
    assert_true(cl_wait(&C, drained, NULL, cl_ms(30000)));
    json_t *j = cl_get(&C, "/processes?machine=m2&state=stopped");
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        n += !strcmp(bbt_str(p, "reason"), "drained") && bbt_int(p, "code") == 0;
    json_decref(j);
    assert_int_equal(n, 2);
    assert_true(bbt_file_has(C.bb[1].log, "draining=1"));
    h_sleep_ms(1500); /* it stays empty */
    assert_true(drained(&C, NULL));
    assert_int_equal(cl_op(&C, "POST", "/machines/m2/undrain", NULL), 200);
    assert_int_equal(cl_scale(&C, "zone", 9), 200);
    w.want = 9;
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
    assert_int_equal(cl_dir_count(&C, "zone", "ready", "m2"), 3);
}

/* The ready record of zone's slot `slot` (new reference) or NULL. */
static json_t *slot_record(int slot)
{
    json_t *j = cl_get(&C, "/processes?service=zone&state=ready"), *found = NULL, *p;
    size_t i;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        if (bbt_int(p, "slot") == slot)
            found = json_incref(p);
    json_decref(j);
    return found;
}

/* What slot4_replaced waits for: slot 4 ready under another instance id than id; now
 * gets that record (new reference). */
typedef struct {
    const char *id;
    json_t *now;
} replaced_t;

/* cl_wait condition: see replaced_t. */
static int slot4_replaced(cl_t *c, void *arg)
{
    (void)c;
    replaced_t *w = arg;
    json_t *now = slot_record(4);
    if (now && strcmp(bbt_str(now, "instance"), w->id)) {
        w->now = now;
        return 1;
    }
    json_decref(now);
    return 0;
}

static void restart_one_instance(void **state)
{
    (void)state;
    json_t *old = slot_record(4);
    assert_non_null(old);
    char id[160], machine[64], body[256];
    snprintf(id, sizeof(id), "%s", bbt_str(old, "instance"));
    snprintf(machine, sizeof(machine), "%s", bbt_str(old, "machine"));
    long long gen = bbt_int(old, "generation");
    json_decref(old);
    snprintf(body, sizeof(body), "{\"instance\": \"%s\"}", id);
    json_t *before = cl_get(&C, "/processes?service=zone&state=ready");
    assert_int_equal(cl_op(&C, "POST", "/restart-instance", body), 200);
    replaced_t w = {id, NULL};
    cl_wait(&C, slot4_replaced, &w, cl_ms(20000));
    json_t *now = w.now;
    assert_non_null(now);
    assert_string_equal(bbt_str(now, "machine"), machine);
    assert_true(bbt_int(now, "generation") > gen);
    json_decref(now);
    /* every other instance is the one that ran before */
    json_t *after = cl_get(&C, "/processes?service=zone&state=ready");
    int same = 0;
    size_t i, k;
    json_t *a, *b;
    json_array_foreach(json_object_get(after, "processes"), i, a)
        json_array_foreach(json_object_get(before, "processes"), k, b)
            same += !strcmp(bbt_str(a, "instance"), bbt_str(b, "instance"));
    json_decref(before);
    json_decref(after);
    assert_int_equal(same, 8);
}

static int bad_spec_reported(cl_t *c, void *arg)
{
    (void)arg;
    json_t *j = cl_get(c, "/processes?service=broken&state=stopped");
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        n += !strcmp(bbt_str(p, "reason"), "exited") &&
             !strncmp(bbt_str(p, "detail"), "bad spec: ", 10);
    json_decref(j);
    return n == 1;
}

static void refused_spec_is_reported(void **state)
{
    (void)state;
    assert_int_equal(
        cl_op(&C, "PUT", "/services/broken",
              "{\"command\": \"/nonexistent/gameproc\", \"count\": 1,"
              " \"health\": {\"type\": \"none\"}}"),
        200);
    assert_true(cl_wait(&C, bad_spec_reported, NULL, cl_ms(15000)));
    assert_int_equal(cl_dir_count(&C, "broken", NULL, NULL), 0);
    /* a later assignment change does not report it again */
    assert_int_equal(cl_scale(&C, "zone", 8), 200);
    cl_conv_t w = {"zone", 8, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(20000)));
    assert_true(bad_spec_reported(&C, NULL));
    for (int i = 0; i < 3; i++)
        assert_true(bbt_alive(C.bb[i].pid));
}

static void restarted_bigbrother_readopts(void **state)
{
    (void)state;
    json_t *before = cl_get(&C, "/processes?service=zone&machine=m3");
    size_t n = json_array_size(json_object_get(before, "processes"));
    assert_true(n >= 2);
    assert_int_equal(h_stop(C.bb[2].pid, cl_ms(10000)) >= 0, 1);
    assert_true(bbt_start(&C.bb[2]) > 0);
    /* An assignment round trip and a few placement rounds, during which the processes
     * must not be replaced (checked below): the time span is what is tested. */
    h_sleep_ms(2000);
    cl_conv_t w = {"zone", 8, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(20000)));
    json_t *after = cl_get(&C, "/processes?service=zone&machine=m3");
    size_t i, k, same = 0;
    json_t *a, *b;
    json_array_foreach(json_object_get(after, "processes"), i, a)
        json_array_foreach(json_object_get(before, "processes"), k, b)
            same += !strcmp(bbt_str(a, "instance"), bbt_str(b, "instance")) &&
                    bbt_int(a, "pid") == bbt_int(b, "pid");
    json_decref(before);
    json_decref(after);
    assert_int_equal(same, n);
    assert_true(bbt_file_has(C.bb[2].log, "instance re-adopted"));
}

int main(void)
{
    h_init(h_valgrind() ? 400 : 150);
    cl_start(&C, 3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(drain_moves_instances_off),
        cmocka_unit_test(restart_one_instance),
        cmocka_unit_test(refused_spec_is_reported),
        cmocka_unit_test(restarted_bigbrother_readopts),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cl_stop(&C);
    return rc;
}
