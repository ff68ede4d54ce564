/* The ready vs desired series (GET /v1/clusters/{c}/series) against a
 * real redis-server and serverdir sampling every 200 ms (directory.series_interval_ms):
 * the values of a sample (ready and starting from the directory, desired from the
 * services: counts, a stopped service, warm pools sized as the primary does, a stopped
 * cluster), the cap of 120 samples, at most one sample per interval with two serverdir
 * copies on the same Redis, no write at all while nothing changes, the errors, and the
 * sample's Redis time with 20,000 live processes (SLOWLOG: it counts the per-state
 * indexes and never reads the processes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "harness.h"
#include "harness_api.h"
#include "harness_stack.h"

#define INTERVAL_MS 200
#define CONFIG "{\"directory\":{\"series_interval_ms\":200}}"
#define SERIES_SCRIPT SD_BIN_DIR "/../serverdir/lua/series_sample.lua"

static h_redis_t redis;
static h_serverdir_t sd;

static int setup(void **state)
{
    h_sd_opts_t o = {.config = CONFIG};
    return h_stack_setup(state, &redis, &sd, &o);
}

/* Waits allow for a serverdir under valgrind. */
static int wait_ms(int ms) { return h_valgrind() ? ms * 6 : ms; }

/* METHOD path with token and body, asserting the status; the answer is dropped. */
static void call(const char *token, const char *method, const char *path, const char *body,
                 long want)
{
    json_t *o = NULL;
    char code[64];
    long st = ct_call(sd.url, token, method, body, &o, code, "%s", path);
    if (st != want)
        fail_msg("%s %s -> %ld %s: %s (want %ld)", method, path, st, code,
                 ct_str(json_object_get(o, "error"), "message"), want);
    json_decref(o);
}

/* The cluster's series as the viewer reads it from the serverdir at base (asserted 200,
 * its shape checked: the interval, samples oldest first with the five integers). */
static json_t *series_at(const char *base, const char *cluster)
{
    json_t *o = NULL;
    long st = ct_call(base, H_TOK_VIEWER, "GET", NULL, &o, NULL, "/v1/clusters/%s/series",
                      cluster);
    assert_int_equal(st, 200);
    assert_int_equal(ct_int(o, "interval_ms"), INTERVAL_MS);
    json_t *samples = json_object_get(o, "samples");
    assert_true(json_is_array(samples));
    long long prev = 0;
    size_t i;
    json_t *s;
    json_array_foreach(samples, i, s) {
        assert_int_equal(json_object_size(s), 5);
        assert_true(ct_int(s, "ts_ms") > prev);
        assert_true(ct_int(s, "ready") >= 0 && ct_int(s, "starting") >= 0 &&
                    ct_int(s, "desired") >= 0 && ct_int(s, "static") >= 0);
        prev = ct_int(s, "ts_ms");
    }
    return o;
}

static json_t *series(const char *cluster) { return series_at(sd.url, cluster); }

/* The Redis clock (ms) of the node holding cluster's keys: what samples are stamped with. */
static long long redis_now(const char *cluster)
{
    char key[160];
    snprintf(key, sizeof key, "sd:{%s}:series", cluster);
    assert_int_equal(h_redis_route(&redis, key), 0);
    redisReply *r = h_redis(&redis, "TIME");
    assert_true(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    long long ms = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

typedef struct {
    const char *cluster;
    long long after;                    /* sample_after: stamped after this */
    long long ready, starting, desired; /* the newest sample (-1: none) */
} newest_t;

/* Reads the newest sample of n->cluster into n; its stamp, or 0 when there is none. */
static long long newest(newest_t *n)
{
    json_t *o = series(n->cluster);
    json_t *samples = json_object_get(o, "samples");
    json_t *last = json_array_get(samples, json_array_size(samples) - 1);
    long long ts = last ? ct_int(last, "ts_ms") : 0;
    n->ready = last ? ct_int(last, "ready") : -1;
    n->starting = last ? ct_int(last, "starting") : -1;
    n->desired = last ? ct_int(last, "desired") : -1;
    json_decref(o);
    return ts;
}

/* h_wait_until condition: the cluster has a sample stamped after n->after. */
static int sample_after(void *arg)
{
    newest_t *n = arg;
    return newest(n) > n->after;
}

/* h_wait_until condition: the cluster's newest sample is n's figures. */
static int sample_is(void *arg)
{
    newest_t *n = arg, now = {.cluster = n->cluster};
    newest(&now);
    return now.ready == n->ready && now.starting == n->starting && now.desired == n->desired;
}

/* The cluster's newest sample becomes {ready, starting, desired} (a sample is written when
 * a figure changed: every step of these tests changes one). */
static void expect_sample(const char *cluster, long long ready, long long starting,
                          long long desired)
{
    newest_t want = {.cluster = cluster, .ready = ready, .starting = starting, .desired = desired};
    if (!h_wait_until(sample_is, &want, wait_ms(5000))) {
        newest_t got = {.cluster = cluster};
        newest(&got);
        fail_msg("cluster %s: sampled ready=%lld starting=%lld desired=%lld, want %lld %lld %lld",
                 cluster, got.ready, got.starting, got.desired, ready, starting, desired);
    }
}

/* Posts a started event of a new instance of cluster every 40 ms for ms, through the
 * serverdir at base: a figure (starting) changes all the time, so every due sample is
 * written. */
static void churn(const char *base, const char *cluster, int ms)
{
    static int seq;
    int64_t end = h_now_ms() + ms;
    while (h_now_ms() < end) {
        char body[256];
        seq++;
        snprintf(body, sizeof body,
                 "{\"events\":[{\"id\":\"churn%d\",\"type\":\"started\",\"instance\":\"churn-%d\","
                 "\"machine\":\"m1\",\"service\":\"churn\",\"pid\":%d}]}",
                 seq, seq, seq);
        assert_int_equal(ct_call(base, H_TOK_BB, "POST", body, NULL, NULL,
                                 "/v1/clusters/%s/events", cluster), 200);
        h_sleep_ms(40);
    }
}

/* A machine lease makes the cluster known to the sweeper (<prefix>clusters). */
static void lease(const char *cluster)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/clusters/%s/machines/m1", cluster);
    call(H_TOK_BB, "PUT", path, "{\"address\":\"127.0.0.1\",\"ttl_ms\":300000}", 200);
}

#define EV(id, type, inst, svc, extra)                                                      \
    "{\"id\":\"" id "\",\"type\":\"" type "\",\"instance\":\"" inst "\",\"machine\":\"m1\"," \
    "\"service\":\"" svc "\"" extra "}"

/* ready and starting from the directory; desired from the services: zone 3 + lobby 2 +
 * idle 0 (stopped, count 4) + the pools match (buffer 2, min 1) and arena (buffer "50%"),
 * sized as the primary sizes them (idle: min; one allocated: 1 + 2 and the smallest N > 1
 * with 50% free, 2); a stopped cluster wants 0. A static service's process counts in
 * ready and in static (live instances of services not declared), never in desired. */
static void sample_counts_ready_starting_desired(void **state)
{
    (void)state;
    lease("cs1");
    call(H_TOK_OPS, "PUT", "/v1/clusters/cs1/services/zone",
         "{\"command\":\"/bin/true\",\"count\":3}", 200);
    call(H_TOK_OPS, "PUT", "/v1/clusters/cs1/services/lobby",
         "{\"command\":\"/bin/true\",\"count\":2}", 200);
    call(H_TOK_OPS, "PUT", "/v1/clusters/cs1/services/idle",
         "{\"command\":\"/bin/true\",\"count\":4}", 200);
    call(H_TOK_OPS, "POST", "/v1/clusters/cs1/services/idle/stop", NULL, 200);
    call(H_TOK_OPS, "PUT", "/v1/clusters/cs1/services/match",
         "{\"command\":\"/bin/true\",\"pool\":{\"buffer\":2,\"min\":1},"
         "\"confirm_timeout_ms\":600000}", 200);
    call(H_TOK_OPS, "PUT", "/v1/clusters/cs1/services/arena",
         "{\"command\":\"/bin/true\",\"pool\":{\"buffer\":\"50%\"},"
         "\"confirm_timeout_ms\":600000}", 200);
    call(H_TOK_BB, "POST", "/v1/clusters/cs1/events",
         "{\"events\":["
         EV("z0s", "started", "zone-0", "zone", ",\"pid\":100,\"slot\":0") ","
         EV("z1s", "started", "zone-1", "zone", ",\"pid\":101,\"slot\":1") ","
         EV("z2s", "started", "zone-2", "zone", ",\"pid\":102,\"slot\":2") ","
         EV("z0r", "ready", "zone-0", "zone", "") ","
         EV("z1r", "ready", "zone-1", "zone", "") ","
         EV("l0s", "started", "lobby-0", "lobby", ",\"pid\":100,\"slot\":0") ","
         EV("l0r", "ready", "lobby-0", "lobby", "") ","
         EV("l1s", "started", "lobby-1", "lobby", ",\"pid\":101,\"slot\":1") ","
         EV("l1x", "stopped", "lobby-1", "lobby", ",\"reason\":\"exited\",\"code\":1") ","
         EV("st0", "ready", "static-0", "static", "") ","
         EV("m0s", "started", "match-m1-0", "match", ",\"pid\":100,\"slot\":0") ","
         EV("m0r", "ready", "match-m1-0", "match", "") ","
         EV("a0s", "started", "arena-m1-0", "arena", ",\"pid\":100,\"slot\":0") ","
         EV("a0r", "ready", "arena-m1-0", "arena", "") "]}",
         200);
    expect_sample("cs1", 6, 1, 3 + 2 + 0 + 1 + 0);
    json_t *o = series("cs1");
    json_t *samples = json_object_get(o, "samples");
    assert_int_equal(ct_int(json_array_get(samples, json_array_size(samples) - 1), "static"), 1);
    json_decref(o);

    call(H_TOK_OPS, "POST", "/v1/clusters/cs1/allocations", "{\"service\":\"match\"}", 201);
    call(H_TOK_OPS, "POST", "/v1/clusters/cs1/allocations", "{\"service\":\"arena\"}", 201);
    expect_sample("cs1", 6, 1, 3 + 2 + 0 + 3 + 2);

    call(H_TOK_OPS, "POST", "/v1/clusters/cs1/stop", NULL, 200);
    expect_sample("cs1", 6, 1, 0);
    call(H_TOK_OPS, "POST", "/v1/clusters/cs1/start", NULL, 200);
    expect_sample("cs1", 6, 1, 10);

    /* a ready process stops, a starting one gets ready */
    call(H_TOK_BB, "POST", "/v1/clusters/cs1/events",
         "{\"events\":[" EV("z0x", "stopped", "zone-0", "zone", ",\"reason\":\"killed\"") ","
         EV("z2r", "ready", "zone-2", "zone", "") "]}", 200);
    expect_sample("cs1", 6, 0, 10);
}

/* Samples stamped in [from, to] and the smallest gap between neighbours (all samples), as
 * the serverdir at base answers. */
static void gaps(const char *base, const char *cluster, long long from, long long to, int *n,
                 long long *min_gap)
{
    json_t *o = series_at(base, cluster);
    json_t *samples = json_object_get(o, "samples");
    *n = 0;
    *min_gap = INT64_MAX;
    for (size_t i = 0; i < json_array_size(samples); i++) {
        long long ts = ct_int(json_array_get(samples, i), "ts_ms");
        if (ts >= from && ts <= to)
            (*n)++;
        if (i > 0) {
            long long gap = ts - ct_int(json_array_get(samples, i - 1), "ts_ms");
            *min_gap = gap < *min_gap ? gap : *min_gap;
        }
    }
    json_decref(o);
}

/* Two serverdir copies on one Redis, both sampling every 200 ms with no lease between
 * them, while a figure changes all the time: still at most one sample per 200 ms (no two
 * closer than the interval, no more than the window holds); with the first copy stopped
 * the second keeps the series going. */
static void two_copies_one_sample_per_interval(void **state)
{
    (void)state;
    lease("cs2");
    h_serverdir_t s2;
    h_sd_opts_t o = {.config = CONFIG};
    assert_int_equal(h_sd_start(&s2, &redis, &o), 0);
    long long t0 = redis_now("cs2");
    churn(sd.url, "cs2", 3000);
    long long t1 = redis_now("cs2");
    int n;
    long long min_gap;
    gaps(sd.url, "cs2", t0, t1, &n, &min_gap);
    printf("two copies: %d samples in %lld ms, closest two %lld ms apart\n", n, t1 - t0, min_gap);
    assert_true(min_gap >= INTERVAL_MS);
    assert_true(n <= (t1 - t0) / INTERVAL_MS + 1);
    assert_true(n >= (h_valgrind() ? 3 : 8)); /* and they do sample */

    /* the second copy alone */
    h_serverdir_stop(&sd);
    t0 = redis_now("cs2");
    churn(s2.url, "cs2", 1500);
    t1 = redis_now("cs2");
    gaps(s2.url, "cs2", t0, t1, &n, &min_gap);
    int alone = n;
    assert_int_equal(h_sd_start(&sd, &redis, &o), 0); /* the group's copy, on a new port */
    h_serverdir_stop(&s2);
    printf("the second copy alone: %d samples in %lld ms\n", alone, t1 - t0);
    assert_true(alone >= (h_valgrind() ? 1 : 4));
    assert_true(min_gap >= INTERVAL_MS);
}

/* An idle cluster's series writes nothing (as an idle sweep): its figures sampled once,
 * then the whole keyspace stays the same while serverdir samples every cluster every
 * 200 ms. */
static void idle_writes_nothing(void **state)
{
    (void)state;
    lease("cs4");
    call(H_TOK_BB, "POST", "/v1/clusters/cs4/events",
         "{\"events\":[" EV("i0s", "started", "calm-0", "calm", ",\"pid\":7") "]}", 200);
    expect_sample("cs4", 0, 1, 0);
    h_sleep_ms(3 * INTERVAL_MS); /* the last changes of the other clusters, sampled */
    /* one sample, or two when a pass came between the lease (which makes the cluster
     * known) and the event: 0 0 0, then 0 1 0 (seen once under valgrind) */
    json_t *o = series("cs4");
    size_t n0 = json_array_size(json_object_get(o, "samples"));
    json_decref(o);
    assert_in_range(n0, 1, 2);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("cs4"), NULL);
    h_sleep_ms(8 * INTERVAL_MS);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("cs4"), NULL);
    h_keys_same(&before, &after, __func__);
    o = series("cs4");
    assert_int_equal(json_array_size(json_object_get(o, "samples")), n0);
    json_decref(o);
}

/* At most 120 samples are kept, the oldest dropped: 130 old ones written straight to
 * Redis, then serverdir's next sample trims the list to the newest 120. */
static void capped_at_120(void **state)
{
    (void)state;
    lease("cs3");
    assert_int_equal(h_redis_route(&redis, "sd:{cs3}:series"), 0);
    /* at once, so no sample of serverdir's lands among them */
    freeReplyObject(h_redis(&redis, "EVAL %s 1 sd:{cs3}:series",
                            "redis.call('DEL', KEYS[1]) for i = 0, 129 do "
                            "redis.call('RPUSH', KEYS[1], (1000 + i) .. ' 1 0 1') end"));
    newest_t n = {.cluster = "cs3", .after = 2000}; /* its figures, 0 0 0, are new */
    assert_true(h_wait_until(sample_after, &n, wait_ms(5000)));
    assert_int_equal(h_redis_route(&redis, "sd:{cs3}:series"), 0);
    redisReply *r = h_redis(&redis, "LLEN sd:{cs3}:series");
    assert_int_equal(r->integer, 120);
    freeReplyObject(r);
    json_t *o = series("cs3");
    json_t *samples = json_object_get(o, "samples");
    assert_int_equal(json_array_size(samples), 120);
    assert_int_equal(ct_int(json_array_get(samples, 0), "ts_ms"), 1011); /* 11 dropped */
    assert_int_equal(ct_int(json_array_get(samples, 118), "ts_ms"), 1129);
    assert_true(ct_int(json_array_get(samples, 119), "ts_ms") > 2000);
    json_decref(o);
}

/* A bad cluster name is 400 bad_name; an unknown cluster has no samples; readers only. */
static void errors_and_roles(void **state)
{
    (void)state;
    char code[64];
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, code,
                             "/v1/clusters/bad..name/series"), 400);
    assert_string_equal(code, "bad_name");
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, code,
                             "/v1/clusters/.hidden/series"), 400);
    assert_string_equal(code, "bad_name");
    json_decref(o);
    o = series("nosuchcluster");
    assert_int_equal(json_array_size(json_object_get(o, "samples")), 0);
    json_decref(o);
    assert_int_equal(ct_call(sd.url, NULL, "GET", NULL, NULL, code, "/v1/clusters/cs1/series"),
                     401);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "GET", NULL, NULL, code,
                             "/v1/clusters/cs1/series"), 403);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, NULL, code,
                             "/v1/clusters/cs1/series"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{}", NULL, code,
                             "/v1/clusters/cs1/series"), 405);
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* 20,000 live processes (15,000 ready, 5,000 starting): the samples count them exactly,
 * and every sample call serverdir makes takes Redis well under a millisecond (SLOWLOG at
 * 0 us records each call's time), while a process starts every 40 ms so that samples are
 * written: a sample that read the processes, or walked one of their indexes, would cost
 * about as much as one ZRANGE of the live index, which is timed alongside for
 * comparison. */
static void sample_cheap_at_20000_processes(void **state)
{
    (void)state;
    /* 5,000 under valgrind and the sanitizers: the writes through their serverdir are
     * what takes the time there, and the Redis figures compared are the same code */
    const int N = h_valgrind() || h_sanitized() ? 5000 : 20000;
    enum { BATCH = 1000 };
    lease("c20k");
    char spec[64];
    snprintf(spec, sizeof spec, "{\"command\":\"/bin/true\",\"count\":%d}", N);
    call(H_TOK_OPS, "PUT", "/v1/clusters/c20k/services/big", spec, 200);
    size_t cap = 200000;
    char *batch = malloc(cap);
    assert_non_null(batch);
    for (int b = 0; b < N / BATCH; b++) {
        int n = snprintf(batch, cap, "{\"events\":[");
        for (int i = 0; i < BATCH; i++) {
            int k = b * BATCH + i;
            n += snprintf(batch + n, cap - (size_t)n,
                          "%s{\"id\":\"e%d\",\"type\":\"%s\",\"instance\":\"p%05d\","
                          "\"machine\":\"m%d\",\"service\":\"big\",\"pid\":%d,\"slot\":%d}",
                          i ? "," : "", k, k % 4 ? "ready" : "started", k, k % 50, 1 + k, k);
        }
        snprintf(batch + n, cap - (size_t)n, "]}");
        call(H_TOK_BB, "POST", "/v1/clusters/c20k/events", batch, 200);
    }
    free(batch);
    expect_sample("c20k", N / 4 * 3, N / 4, N);

    /* every command on the cluster's node recorded with its time, for a few samples */
    assert_int_equal(h_redis_route(&redis, "sd:{c20k}:series"), 0);
    char *src = h_slurp(SERIES_SCRIPT);
    assert_non_null(src);
    redisReply *r = h_redis(&redis, "SCRIPT LOAD %s", src);
    free(src);
    assert_true(r && r->type == REDIS_REPLY_STRING);
    char sha[48];
    snprintf(sha, sizeof sha, "%s", r->str);
    freeReplyObject(r);
    freeReplyObject(h_redis(&redis, "CONFIG SET slowlog-max-len 8192"));
    freeReplyObject(h_redis(&redis, "CONFIG SET slowlog-log-slower-than 0"));
    freeReplyObject(h_redis(&redis, "SLOWLOG RESET"));
    long long t0 = redis_now("c20k");
    churn(sd.url, "c20k", 2000);
    long long t1 = redis_now("c20k");
    assert_int_equal(h_redis_route(&redis, "sd:{c20k}:series"), 0);
    freeReplyObject(h_redis(&redis, "ZRANGE sd:{c20k}:ix 0 -1")); /* the comparison */
    r = h_redis(&redis, "SLOWLOG GET 8192");
    freeReplyObject(h_redis(&redis, "CONFIG SET slowlog-log-slower-than 10000"));
    assert_true(r && r->type == REDIS_REPLY_ARRAY);
    long long us[8192], zrange_us = -1;
    int n = 0;
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i], *args = e->element[3];
        if (args->elements >= 4 && !strcasecmp(args->element[0]->str, "EVALSHA") &&
            !strcmp(args->element[1]->str, sha) && !strcmp(args->element[3]->str, "sd:{c20k}:"))
            us[n++] = e->element[2]->integer;
        else if (args->elements == 4 && !strcasecmp(args->element[0]->str, "ZRANGE") &&
                 !strcmp(args->element[1]->str, "sd:{c20k}:ix"))
            zrange_us = e->element[2]->integer;
    }
    freeReplyObject(r);
    int sampled;
    long long min_gap;
    gaps(sd.url, "c20k", t0, t1, &sampled, &min_gap);
    qsort(us, (size_t)n, sizeof us[0], cmp_ll);
    printf("series sample at %d processes: %d calls (%d samples written) in %lld ms, "
           "median %lld us, worst %lld us; one ZRANGE of the live index: %lld us\n",
           N, n, sampled, t1 - t0, n ? us[n / 2] : -1, n ? us[n - 1] : -1, zrange_us);
    assert_true(sampled >= (h_valgrind() ? 2 : 5));
    assert_true(n >= sampled);
    assert_true(us[n / 2] < 1000);
    /* nothing above 5 ms but one sample, which may have lost its core to the machine
     * (a suite run on a busy 2-core host saw one of 5.3 ms with the median at 87 us), and
     * that one under 25 ms */
    assert_true(n < 2 || us[n - 2] < (h_valgrind() ? 25000 : 5000));
    assert_true(us[n - 1] < 25000);
    assert_true(zrange_us > 0);
    assert_true(us[n / 2] * 4 < zrange_us);
}

int main(void)
{
    h_init(240);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sample_counts_ready_starting_desired),
        cmocka_unit_test(errors_and_roles),
        cmocka_unit_test(capped_at_120),
        cmocka_unit_test(two_copies_one_sample_per_interval),
        cmocka_unit_test(idle_writes_nothing),
        cmocka_unit_test(sample_cheap_at_20000_processes),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
