/* Warm pools and allocations end to end (docs/allocation.md) with real bigbrothers in
 * cluster mode and real gameprocs: the primary fills a pool to its buffer, an allocation
 * reaches the game through its shim and answers the port the game reported (gameproc logs the match and its shim acknowledges:
 * the allocation becomes active), the pool refills behind it, the game releases it and
 * the instance is free again, an allocated instance that is killed reports
 * allocation_lost (and the slot is restarted empty), a DELETE reaches the game as
 * DEALLOCATED, a join puts players into a running instance with room, and a surplus
 * shrinks after scale_down_delay_s. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_cluster.h"

static cl_t C;

/* The pool figures of service svc from the services list. */
static int pool_of(const char *svc, long long *allocated, long long *free_)
{
    char path[128];
    snprintf(path, sizeof path, "/services/%s", svc);
    json_t *o = cl_get(&C, path);
    if (!o)
        return -1;
    json_t *p = json_object_get(o, "pool");
    *allocated = json_integer_value(json_object_get(p, "allocated"));
    *free_ = json_integer_value(json_object_get(p, "ready_free"));
    json_decref(o);
    return 0;
}

typedef struct {
    const char *svc;
    long long allocated, free_;
} pool_want_t;

static int pool_is(cl_t *c, void *arg)
{
    (void)c;
    pool_want_t *w = arg;
    long long a, f;
    return pool_of(w->svc, &a, &f) == 0 && a == w->allocated && f == w->free_;
}

/* The allocation's state, into a static buffer ("" when unreadable). */
static const char *state_of(const char *id, char *reason, size_t cap)
{
    static char st[32];
    char path[128];
    snprintf(path, sizeof path, "/allocations/%s", id);
    json_t *o = cl_get(&C, path);
    snprintf(st, sizeof st, "%s", o ? json_string_value(json_object_get(o, "state")) : "");
    if (reason) {
        const char *r = o ? json_string_value(json_object_get(o, "reason")) : NULL;
        snprintf(reason, cap, "%s", r ? r : "");
    }
    json_decref(o);
    return st;
}

typedef struct {
    const char *id, *want;
} alloc_want_t;

static int alloc_is(cl_t *c, void *arg)
{
    (void)c;
    alloc_want_t *w = arg;
    return !strcmp(state_of(w->id, NULL, 0), w->want);
}

typedef struct {
    char id[32], instance[128], machine[16];
    int slot, port;
} got_t;

/* Allocates from svc with body extra fields; fails the test unless 201. */
static void allocate(const char *svc, const char *extra, got_t *g)
{
    char body[512];
    snprintf(body, sizeof body, "{\"service\":\"%s\"%s%s}", svc, extra ? "," : "", extra ? extra : "");
    long st;
    char url[256];
    snprintf(url, sizeof url, "%s" CL_BASE "/allocations", C.sd.url);
    json_t *o = cl_api("POST", url, body, &st);
    if (st != 201) {
        char *t = o ? json_dumps(o, 0) : NULL;
        fail_msg("allocate %s: %ld %s", body, st, t ? t : "");
    }
    snprintf(g->id, sizeof g->id, "%s", json_string_value(json_object_get(o, "allocation")));
    snprintf(g->instance, sizeof g->instance, "%s",
             json_string_value(json_object_get(o, "instance")));
    snprintf(g->machine, sizeof g->machine, "%s", json_string_value(json_object_get(o, "machine")));
    g->slot = (int)json_integer_value(json_object_get(o, "slot"));
    g->port = (int)json_integer_value(json_object_get(json_object_get(o, "ports"), "game"));
    json_decref(o);
}

/* The slot log of g's instance on its bigbrother. */
static const char *log_of(const got_t *g, const char *svc)
{
    static char path[512];
    int i = cl_index(&C, g->machine);
    assert_true(i >= 0);
    snprintf(path, sizeof path, "%s/logs/%s-%d.log", C.bb[i].state, svc, g->slot);
    return path;
}

#define SPEC(args, extra)                                                                    \
    "{\"command\": \"" GAMEPROC "\", \"args\": " args ", \"health\": {\"type\": \"agent\","   \
    " \"start_timeout_ms\": 15000, \"liveness_timeout_ms\": 8000},"                          \
    " \"stop\": {\"signal\": \"TERM\", \"grace_ms\": 3000}" extra "}"

static void pool_allocate_release_crash(void **state)
{
    (void)state;
    cl_start(&C, 2);
    /* a pool of 2 free; the game releases each session 4 s after it got it */
    char spec[1024];
    snprintf(spec, sizeof spec,
             SPEC("[\"--tick-hz\", \"20\", \"--udp-port\", \"0\", \"--meta\", \"mode=ctf region=eu\","
                  " \"--release-after-ms\", \"%d\"]",
                  ", \"pool\": {\"buffer\": 2, \"min\": 2, \"scale_down_delay_s\": 2},"
                  " \"confirm_timeout_ms\": 20000"),
             cl_ms(4000));
    assert_int_equal(cl_op(&C, "PUT", "/services/match", spec), 200);
    pool_want_t two_free = {"match", 0, 2};
    int64_t tp = h_now_ms();
    assert_true(cl_wait(&C, pool_is, &two_free, cl_ms(30000)));
    print_message("pool filled to 2 free after %lld ms\n", (long long)(h_now_ms() - tp));

    /* allocate: the game logs its match, its shim acknowledges (active); the pool refills
     * behind it (1 allocated, 2 free) */
    got_t g;
    int64_t t0 = h_now_ms();
    allocate("match", "\"selector\":{\"metadata\":{\"mode\":\"ctf\"}},\"payload\":{\"match\":\"m-1\"},"
                      "\"idempotency_key\":\"m-1\"", &g);
    /* the answer names the port the game reported through its shim (bbagent_port), the
     * one it logged when it bound it */
    assert_true(g.port > 0);
    char line[128];
    snprintf(line, sizeof line, "udp_port=%d", g.port);
    assert_true(bbt_file_has(log_of(&g, "match"), line));
    snprintf(line, sizeof line, "msg=allocated allocation=%s mode=ready", g.id);
    assert_true(bbt_wait_file_has(log_of(&g, "match"), line, cl_ms(5000)));
    assert_true(bbt_file_has(log_of(&g, "match"), "m-1"));
    alloc_want_t active = {g.id, "active"};
    assert_true(cl_wait(&C, alloc_is, &active, cl_ms(5000)));
    print_message("allocation %s active after %lld ms\n", g.id, (long long)(h_now_ms() - t0));
    pool_want_t refilled = {"match", 1, 2};
    assert_true(cl_wait(&C, pool_is, &refilled, cl_ms(20000)));
    print_message("pool refilled to 2 free after %lld ms\n", (long long)(h_now_ms() - t0));

    /* the game releases it (--release-after-ms): released by the game, free again; the
     * surplus (3 free) shrinks back to 2 after the 2 s delay */
    alloc_want_t released = {g.id, "released"};
    assert_true(cl_wait(&C, alloc_is, &released, cl_ms(10000)));
    char reason[64];
    state_of(g.id, reason, sizeof reason);
    assert_string_equal(reason, "game");
    assert_true(cl_wait(&C, pool_is, &two_free, cl_ms(20000)));
    cl_conv_t w = {"match", 2, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(20000)));

    /* killed while allocated: allocation_lost with the kill, never handed on; the slot is
     * restarted empty and free again */
    got_t k;
    allocate("match", NULL, &k);
    alloc_want_t kact = {k.id, "active"};
    assert_true(cl_wait(&C, alloc_is, &kact, cl_ms(3000)));
    int i = cl_index(&C, k.machine);
    json_t *in = bbt_inst(&C.bb[i], "match", k.slot);
    assert_non_null(in);
    long long pid = bbt_int(in, "pid");
    json_decref(in);
    assert_true(pid > 1);
    kill((pid_t)pid, SIGKILL);
    alloc_want_t lost = {k.id, "allocation_lost"};
    assert_true(cl_wait(&C, alloc_is, &lost, cl_ms(10000)));
    state_of(k.id, reason, sizeof reason);
    assert_string_equal(reason, "killed(signal 9)");
    assert_true(cl_wait(&C, pool_is, &two_free, cl_ms(30000)));

    /* DELETE from outside: the game is told (DEALLOCATED), the instance free again */
    got_t d;
    allocate("match", NULL, &d);
    alloc_want_t dact = {d.id, "active"};
    assert_true(cl_wait(&C, alloc_is, &dact, cl_ms(3000)));
    char path[128];
    snprintf(path, sizeof path, "/allocations/%s", d.id);
    assert_int_equal(cl_op(&C, "DELETE", path, NULL), 200);
    snprintf(line, sizeof line, "msg=deallocated allocation=%s", d.id);
    assert_true(bbt_wait_file_has(log_of(&d, "match"), line, cl_ms(5000)));
    assert_true(cl_wait(&C, pool_is, &two_free, cl_ms(20000)));

    /* join: players into a running instance with room (gameproc reports 0/16): the game
     * logs a join for 3 players, and the instance is allocated (no longer free) */
    got_t j;
    allocate("match", "\"mode\":\"join\",\"players\":3", &j);
    snprintf(line, sizeof line, "msg=allocated allocation=%s mode=join players=3", j.id);
    assert_true(bbt_wait_file_has(log_of(&j, "match"), line, cl_ms(5000)));
    alloc_want_t jact = {j.id, "active"};
    assert_true(cl_wait(&C, alloc_is, &jact, cl_ms(3000)));

    /* the idempotency key still answers the first allocation, ended as it is */
    long st;
    char url[256];
    snprintf(url, sizeof url, "%s" CL_BASE "/allocations", C.sd.url);
    json_t *o = cl_api("POST", url,
                       "{\"service\":\"match\",\"selector\":{\"metadata\":{\"mode\":\"ctf\"}},"
                       "\"payload\":{\"match\":\"m-1\"},\"idempotency_key\":\"m-1\"}", &st);
    assert_int_equal(st, 200);
    assert_string_equal(json_string_value(json_object_get(o, "allocation")), g.id);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "released");
    json_decref(o);
    cl_stop(&C);
}

/* The primary wakes on allocations (GET .../pool-demand long-poll): with placement
 * passes a minute apart and the primary lease renewed every 30 s, an empty pool (min 0)
 * is filled by the first request's demand and refilled behind the allocation in well
 * under a pass. Before, both waited for the next pass: the parked request ran out. */
static void allocation_wakes_the_primary(void **state)
{
    (void)state;
    cl_placement_interval_ms = 60000;
    cl_primary_ttl_ms = 90000;
    cl_start(&C, 1);
    cl_placement_interval_ms = cl_primary_ttl_ms = 0;
    for (int i = 0; !cl_primary(&C, NULL)[0]; i++) { /* the lease taken: its first pass ran */
        assert_true(i < cl_ms(10000) / 50);
        h_sleep_ms(50);
    }
    char spec[1024];
    snprintf(spec, sizeof spec,
             SPEC("[\"--tick-hz\", \"20\"]", ", \"pool\": {\"buffer\": 1, \"min\": 0}"));
    assert_int_equal(cl_op(&C, "PUT", "/services/warm", spec), 200);

    /* nothing ready (min 0, no demand yet): the request waits, its demand wakes the
     * primary, which starts an instance, and the request gets it */
    got_t g;
    char extra[64];
    snprintf(extra, sizeof extra, "\"wait_ms\":%d", cl_ms(15000));
    int64_t t0 = h_now_ms();
    allocate("warm", extra, &g);
    print_message("an empty pool served a waiting request after %lld ms\n",
                  (long long)(h_now_ms() - t0));
    /* and refilled behind it: 1 allocated, 1 free */
    t0 = h_now_ms();
    pool_want_t refilled = {"warm", 1, 1};
    assert_true(cl_wait(&C, pool_is, &refilled, cl_ms(10000)));
    print_message("pool refilled to 1 free after %lld ms\n", (long long)(h_now_ms() - t0));
    cl_stop(&C);
}

int main(void)
{
    h_init(h_valgrind() ? 400 : 200);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pool_allocate_release_crash),
        cmocka_unit_test(allocation_wakes_the_primary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
