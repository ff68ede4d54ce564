/* Cluster mode, placement and convergence: three bigbrothers (m1..m3) against one
 * serverdir. A service scaled 0 -> 30 -> 5 through the API is spread evenly and converges
 * (the directory shows the right count ready, the processes really run); a rolling
 * restart with max_unavailable 2 never has more than 2 instances down and replaces every
 * instance; a cluster stop sends SHUTDOWN to every game process and stops them all, and a
 * cluster start brings the service back. */
#include <glob.h>
#include <setjmp.h>
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

/* How many times "reason=SHUTDOWN" (gameproc: a graceful stop asked by bigbrother)
 * appears in the instance logs of every machine (logs/<service>-<slot>/<instance>.log and
 * their rotations). */
static int shutdowns(const cl_t *c)
{
    int n = 0;
    for (int i = 0; i < c->n; i++) {
        char pattern[400];
        snprintf(pattern, sizeof(pattern), "%s/logs/*/*.log*", c->bb[i].state);
        glob_t g;
        if (glob(pattern, 0, NULL, &g))
            continue;
        for (size_t k = 0; k < g.gl_pathc; k++) {
            char line[4096];
            FILE *f = fopen(g.gl_pathv[k], "r");
            while (f && fgets(line, sizeof(line), f))
                n += strstr(line, "reason=SHUTDOWN") != NULL;
            if (f)
                fclose(f);
        }
        globfree(&g);
    }
    return n;
}

static void scale_0_30_5(void **state)
{
    (void)state;
    assert_true(cl_wait(&C, has_primary, NULL, cl_ms(15000)));
    /* READY after 0.5 s: a rolling restart's unavailable instances are visible */
    assert_int_equal(
        cl_service(&C, "zone", 0, "[\"--tick-hz\", \"10\", \"--slow-start\", \"0.5\"]",
                   NULL),
        200);
    assert_int_equal(cl_scale(&C, "zone", 30), 200);
    cl_conv_t w = {"zone", 30, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(60000)));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cl_dir_count(&C, "zone", "ready", C.name[i]), 10);
        assert_int_equal(cl_running(&C, i, "zone"), 10);
    }
    assert_int_equal(cl_scale(&C, "zone", 5), 200);
    w.want = 5;
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
    for (int i = 0; i < 3; i++) {
        int n = cl_dir_count(&C, "zone", "ready", C.name[i]);
        assert_true(n >= 1 && n <= 2);
    }
    /* the 25 removed instances were stopped as replaced, through SHUTDOWN */
    json_t *stopped = cl_get(&C, "/processes?service=zone&state=stopped&limit=1000");
    int replaced = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(stopped, "processes"), i, p)
        replaced += !strcmp(bbt_str(p, "reason"), "replaced") && bbt_int(p, "code") == 0;
    json_decref(stopped);
    assert_int_equal(replaced, 25);
    /* one placement summary line per change, not one per slot */
    int i_primary = cl_index(&C, cl_primary(&C, NULL));
    assert_true(i_primary >= 0);
    assert_true(bbt_file_has(C.bb[i_primary].log, "placement changed"));
    assert_true(bbt_file_has(C.bb[i_primary].log, "primary role acquired"));
}

/* The ready instance ids of zone in the directory. */
static json_t *ready_ids(void)
{
    json_t *j = cl_get(&C, "/processes?service=zone&state=ready"), *ids = json_object();
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        json_object_set_new(ids, bbt_str(p, "instance"), json_true());
    json_decref(j);
    return ids;
}

static void rolling_restart_bounded(void **state)
{
    (void)state;
    json_t *before = ready_ids();
    assert_int_equal(json_object_size(before), 5);
    assert_int_equal(cl_op(&C, "POST", "/services/zone/restart", "{\"max_unavailable\": 2}"),
                     200);
    int min_ready = 5, done = 0;
    int64_t end = h_now_ms() + cl_ms(60000);
    while (!done && h_now_ms() < end) {
        json_t *now = ready_ids();
        int n = (int)json_object_size(now), fresh = 0;
        const char *k;
        json_t *v;
        json_object_foreach(now, k, v)
            fresh += json_object_get(before, k) == NULL;
        json_decref(now);
        if (n < min_ready)
            min_ready = n;
        done = fresh == 5 && n == 5;
        h_sleep_ms(50);
    }
    json_decref(before);
    assert_true(done);
    assert_true(min_ready >= 3);
    assert_true(min_ready <= 4); /* it did restart them, a few at a time */
    cl_conv_t w = {"zone", 5, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(10000)));
}

static void cluster_stop_and_start(void **state)
{
    (void)state;
    int before = shutdowns(&C);
    assert_int_equal(cl_op(&C, "POST", "/stop", NULL), 200);
    cl_conv_t w = {"zone", 0, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
    assert_int_equal(shutdowns(&C) - before, 5);
    h_sleep_ms(1000); /* and it stays stopped */
    assert_true(cl_converged(&C, &w));
    assert_int_equal(cl_op(&C, "POST", "/start", NULL), 200);
    w.want = 5;
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
}

int main(void)
{
    h_init(h_valgrind() ? 400 : 150);
    cl_start(&C, 3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scale_0_30_5),
        cmocka_unit_test(rolling_restart_bounded),
        cmocka_unit_test(cluster_stop_and_start),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cl_stop(&C);
    return rc;
}
