/* Parked allocation waits wake on change (docs/allocation.md, "Waiting"): while nothing
 * changes, N parked requests cost Redis almost nothing (they used to re-run
 * alloc_create.lua every 20 ms each: N x 100 calls in 2 s); a freed instance goes to a
 * waiter at once, a burst of freed instances to as many waiters, a waiter with a
 * selector does not hold up the plain one behind it, and a join waiter wakes when an
 * instance's free player slots grow. The instances' lives are told by
 * process events as a Big Brother would post them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_api.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

static int setup(void **state) { return h_stack_setup(state, &redis, &sd, NULL); }

/* POST one event batch (JSON array text) to cluster c as its Big Brother. */
static void events(const char *c, const char *batch)
{
    size_t cap = strlen(batch) + 32;
    char *body = malloc(cap);
    snprintf(body, cap, "{\"events\":%s}", batch);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, NULL, NULL,
                             "/v1/clusters/%s/events", c), 200);
    free(body);
}

/* Instances <svc>-<from>..<svc>-<to - 1> of service svc start and become ready on
 * machine m of cluster c, in one batch. */
static void ready(const char *c, const char *m, const char *svc, int from, int to)
{
    size_t cap = (size_t)(to - from) * 400 + 16, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b, cap, "[");
    for (int i = from; i < to; i++)
        len += (size_t)snprintf(
            b + len, cap - len,
            "%s{\"id\":\"s.%s.%s.%d\",\"type\":\"started\",\"instance\":\"%s-%d\","
            "\"machine\":\"%s\",\"service\":\"%s\",\"pid\":%d,\"slot\":%d},"
            "{\"id\":\"r.%s.%s.%d\",\"type\":\"ready\",\"instance\":\"%s-%d\","
            "\"machine\":\"%s\",\"service\":\"%s\"}",
            i > from ? "," : "", m, svc, i, svc, i, m, svc, 1000 + i, i, m, svc, i, svc, i, m,
            svc);
    snprintf(b + len, cap - len, "]");
    events(c, b);
    free(b);
}

/* Service svc of cluster c and machines m0 (zone eu) and m1 (zone us), no instance. */
static void pool(const char *c, const char *svc)
{
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"command\":\"/bin/true\",\"count\":1000}", NULL, NULL,
                             "/v1/clusters/%s/services/%s", c, svc), 200);
    for (int k = 0; k < 2; k++) {
        char body[128];
        snprintf(body, sizeof body, "{\"address\":\"10.0.0.%d\",\"labels\":{\"zone\":\"%s\"}}",
                 k + 1, k ? "us" : "eu");
        assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, NULL,
                                 "/v1/clusters/%s/machines/m%d", c, k), 200);
    }
}

/* Script calls Redis ran so far (INFO commandstats: EVAL and EVALSHA) on the node of the
 * cluster's slot. */
static long long script_calls(const char *c)
{
    char key[128];
    snprintf(key, sizeof key, "sd:{%s}:services", c);
    assert_int_equal(h_redis_route(&redis, key), 0);
    long long calls = h_redis_script_calls(&redis, NULL);
    assert_true(calls >= 0);
    return calls;
}

typedef struct {
    const char *cluster, *body;
    long status;
    char instance[64];
    int64_t done_ms;
} waiter_t;

static void *wait_one(void *arg)
{
    waiter_t *w = arg;
    json_t *o = NULL;
    w->status = ct_call(sd.url, H_TOK_GAME, "POST", w->body, &o, NULL,
                        "/v1/clusters/%s/allocations", w->cluster);
    w->done_ms = h_now_ms();
    snprintf(w->instance, sizeof w->instance, "%s", ct_str(o, "instance"));
    json_decref(o);
    return NULL;
}

static int parked(void *want)
{
    return h_metric(sd.url, "serverdir_allocations_waiting") >= (long long)(intptr_t)want;
}

#define N 100

/* N waiters parked on an empty pool: over 2 s of nothing changing Redis runs fewer than
 * N x 2 scripts (the old 20 ms poll: about N x 100); one instance made ready goes to one
 * waiter within a fraction of a second; N - 1 more in one batch go to the others. */
static void idle_waiters_cost_nothing_and_wake_on_change(void **state)
{
    (void)state;
    static waiter_t w[N];
    pthread_t t[N];
    pool("pw", "match");
    for (int i = 0; i < N; i++) {
        w[i] = (waiter_t){.cluster = "pw", .body = "{\"service\":\"match\",\"wait_ms\":30000}"};
        assert_int_equal(pthread_create(&t[i], NULL, wait_one, &w[i]), 0);
    }
    assert_true(h_wait_until(parked, (void *)(intptr_t)N, h_ms(10000)));
    h_sleep_ms(200); /* each one's first try on the park thread is done */

    long long c0 = script_calls("pw");
    h_sleep_ms(2000);
    long long idle = script_calls("pw") - c0;
    fprintf(stderr, "%d parked waiters: %lld script calls in 2 s of no change\n", N, idle);
    if (idle >= 2 * N)
        fail_msg("%d parked waiters made Redis run %lld scripts in 2 s without a change", N,
                 idle);

    int64_t t0 = h_now_ms();
    ready("pw", "m0", "match", 0, 1);
    int got = -1;
    for (int k = 0; k < 300 && got < 0; k++) {
        for (int i = 0; i < N; i++)
            if (w[i].status != 0)
                got = i;
        if (got < 0)
            h_sleep_ms(10);
    }
    assert_true(got >= 0);
    assert_int_equal(w[got].status, 201);
    assert_string_equal(w[got].instance, "match-0");
    fprintf(stderr, "a freed instance answered a waiter in %lld ms\n",
            (long long)(w[got].done_ms - t0));
    assert_true(w[got].done_ms - t0 < h_ms(500));

    /* a burst: N - 1 instances in one batch, one message; every waiter gets one */
    t0 = h_now_ms();
    ready("pw", "m0", "match", 1, N);
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    char seen[N] = {0};
    for (int i = 0; i < N; i++) {
        assert_int_equal(w[i].status, 201);
        int k = atoi(w[i].instance + strlen("match-"));
        assert_true(k >= 0 && k < N && !seen[k]);
        seen[k] = 1;
        assert_true(w[i].done_ms - t0 < h_ms(3000));
    }
}

/* The oldest waiter wants zone us; an instance on m0 (zone eu) is not for it, but the
 * plain waiter parked after it gets the instance at once (the wake is passed on), and
 * the us one when an instance on m1 comes. */
static void a_selector_waiter_passes_the_wake_on(void **state)
{
    (void)state;
    pool("ps", "match");
    waiter_t us = {.cluster = "ps",
                   .body = "{\"service\":\"match\",\"wait_ms\":10000,"
                           "\"selector\":{\"machine_labels\":{\"zone\":\"us\"}}}"};
    waiter_t plain = {.cluster = "ps", .body = "{\"service\":\"match\",\"wait_ms\":10000}"};
    pthread_t tu, tp;
    long long w0 = h_metric(sd.url, "serverdir_allocations_waiting");
    assert_int_equal(pthread_create(&tu, NULL, wait_one, &us), 0);
    assert_true(h_wait_until(parked, (void *)(intptr_t)(w0 + 1), h_ms(5000)));
    assert_int_equal(pthread_create(&tp, NULL, wait_one, &plain), 0);
    assert_true(h_wait_until(parked, (void *)(intptr_t)(w0 + 2), h_ms(5000)));
    h_sleep_ms(100);

    int64_t t0 = h_now_ms();
    ready("ps", "m0", "match", 0, 1);
    pthread_join(tp, NULL);
    assert_int_equal(plain.status, 201);
    assert_string_equal(plain.instance, "match-0");
    /* well under the 1 s re-check: the wake was passed on */
    assert_true(plain.done_ms - t0 < h_ms(500));
    assert_int_equal(us.status, 0);

    t0 = h_now_ms();
    ready("ps", "m1", "match", 1, 2);
    pthread_join(tu, NULL);
    assert_int_equal(us.status, 201);
    assert_string_equal(us.instance, "match-1");
    assert_true(us.done_ms - t0 < h_ms(500));
}

/* A join waiter wants 2 free player slots; the only instance is full. Its status event
 * (players 4 -> 1 of 4) wakes the waiter, which joins it. */
static void a_status_event_wakes_a_join_waiter(void **state)
{
    (void)state;
    pool("pj", "realm");
    ready("pj", "m0", "realm", 0, 1);
    const char *full = "[{\"id\":\"st.1\",\"type\":\"status\",\"instance\":\"realm-0\","
                       "\"machine\":\"m0\",\"service\":\"realm\",\"players\":4,"
                       "\"max_players\":4}]";
    events("pj", full);
    waiter_t j = {.cluster = "pj",
                  .body = "{\"service\":\"realm\",\"mode\":\"join\",\"players\":2,"
                          "\"wait_ms\":10000}"};
    pthread_t t;
    long long w0 = h_metric(sd.url, "serverdir_allocations_waiting");
    assert_int_equal(pthread_create(&t, NULL, wait_one, &j), 0);
    assert_true(h_wait_until(parked, (void *)(intptr_t)(w0 + 1), h_ms(5000)));
    h_sleep_ms(100);
    assert_int_equal(j.status, 0);

    int64_t t0 = h_now_ms();
    events("pj", "[{\"id\":\"st.2\",\"type\":\"status\",\"instance\":\"realm-0\","
                 "\"machine\":\"m0\",\"service\":\"realm\",\"players\":1}]");
    pthread_join(t, NULL);
    assert_int_equal(j.status, 201);
    assert_string_equal(j.instance, "realm-0");
    assert_true(j.done_ms - t0 < h_ms(500));
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(idle_waiters_cost_nothing_and_wake_on_change),
        cmocka_unit_test(a_selector_waiter_passes_the_wake_on),
        cmocka_unit_test(a_status_event_wakes_a_join_waiter),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
