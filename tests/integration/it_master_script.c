/* The master list's Redis scripts, run directly on a real redis-server with batches no
 * load could make on purpose (docs/master.md, "Redis layout"):
 *   - master_heartbeat.lua decides the items of one batch in order, each seeing the ones
 *     before it (a replayed challenge, a renewal, a group's quota and the list's cap
 *     filled inside the batch), writes the records and the group counts once, and names
 *     the accepted addresses in one change-stream entry carrying the writing copy's id;
 *   - master_sweep.lua walks the whole list for expiry in shares (no index per server):
 *     5,000 expired records among 10 live ones are all removed within a bounded number of
 *     calls, each reading a bounded share, their group counts with them; and the walk is
 *     done once per period whichever copy calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define LUA_DIR SD_BIN_DIR "/../serverdir/lua/"
#define P "sd:master:"

static h_redis_t redis;
static char hb_sha[48], sweep_sha[48];

static int load(const char *name, char *sha, size_t cap)
{
    char path[512];
    snprintf(path, sizeof path, LUA_DIR "%s", name);
    char *src = h_slurp(path);
    if (!src)
        return -1;
    redisReply *r = h_redis(&redis, "SCRIPT LOAD %s", src);
    free(src);
    int ok = r && r->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(sha, cap, "%s", r->str);
    freeReplyObject(r);
    return ok ? 0 : -1;
}

static int setup(void **state)
{
    (void)state;
    if (h_redis_start(&redis))
        return -1;
    return load("master_heartbeat.lua", hb_sha, sizeof hb_sha) ||
           load("master_sweep.lua", sweep_sha, sizeof sweep_sha);
}

static int teardown(void **state)
{
    (void)state;
    h_redis_stop(&redis);
    return 0;
}

static int fresh(void **state)
{
    (void)state;
    freeReplyObject(h_redis(&redis, "FLUSHALL"));
    return 0;
}

/* One heartbeat item: address, group, instance, challenge, expiry. */
struct item {
    const char *addr, *group, *inst, *chal;
};

static long long now_ms(void) /* wall clock ms, as serverdir passes to the scripts */
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A record as serverdir writes it (sd_master_record): challenge, group, instance,
 * expiry, time, source, then the server's fields. */
static int record(char *out, size_t cap, const struct item *it, long long exp, long long now)
{
    return snprintf(out, cap,
                    "%s\x1f%s\x1f%s\x1f%lld\x1f%lld\x1fq3\x1fGame\x1fmap\x1fname\x1f\x1f\x1f\x1f"
                    "1\x1f" "8\x1f" "0\x1f" "0\x1f" "1\x1f" "0\x1f\x1f" "3\x1f" "0",
                    it->chal, it->group, it->inst, exp, now);
}

/* Runs master_heartbeat on the items as one batch; the reply (caller frees). */
static redisReply *heartbeat(const struct item *items, int n, long long per_group, long long max_servers,
                             const char *copy)
{
    long long now = now_ms(), ttl = 600000;
    int argc = 4 + 7 + 4 * n; /* EVALSHA sha 1 P, 7 arguments, 4 per item */
    const char **argv = calloc((size_t)argc, sizeof *argv);
    size_t *len = calloc((size_t)argc, sizeof *len);
    char (*num)[32] = calloc(5, sizeof *num);
    char (*rec)[512] = calloc((size_t)n, sizeof *rec);
    assert_non_null(argv);
    int k = 0;
    argv[k++] = "EVALSHA";
    argv[k++] = hb_sha;
    argv[k++] = "1";
    argv[k++] = P;
    snprintf(num[0], sizeof num[0], "%lld", now);
    snprintf(num[1], sizeof num[1], "%lld", ttl);
    snprintf(num[2], sizeof num[2], "%lld", per_group);
    snprintf(num[3], sizeof num[3], "%lld", max_servers);
    snprintf(num[4], sizeof num[4], "%d", n);
    argv[k++] = num[0];
    argv[k++] = num[1];
    argv[k++] = num[2];
    argv[k++] = num[3];
    argv[k++] = "2000";
    argv[k++] = copy;
    argv[k++] = num[4];
    for (int i = 0; i < n; i++) {
        record(rec[i], sizeof rec[i], &items[i], now + ttl, now);
        argv[k++] = items[i].addr;
        argv[k++] = items[i].group;
        argv[k++] = items[i].inst;
        argv[k++] = rec[i];
    }
    for (int i = 0; i < k; i++)
        len[i] = strlen(argv[i]);
    redisReply *r = redisCommandArgv(redis.ctl, k, argv, len);
    free(argv);
    free(len);
    free(num);
    free(rec);
    assert_non_null(r);
    return r;
}

static void expect_int(redisReply *r, size_t i, long long v)
{
    assert_true(i < r->elements);
    if (r->element[i]->type != REDIS_REPLY_INTEGER || r->element[i]->integer != v)
        fail_msg("item %zu: %s, want %lld", i,
                 r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str : "(not text)", v);
}

static void expect_refusal(redisReply *r, size_t i, const char *code)
{
    assert_true(i < r->elements);
    if (r->element[i]->type != REDIS_REPLY_STRING || strncmp(r->element[i]->str, code, strlen(code)))
        fail_msg("item %zu: want refusal %s", i, code);
}

static long long redis_int(const char *fmt, const char *arg)
{
    redisReply *r = h_redis(&redis, fmt, arg);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer
                  : r->type == REDIS_REPLY_STRING ? atoll(r->str)
                                                  : -1;
    freeReplyObject(r);
    return v;
}

/* Each item sees the ones before it in the same batch. */
static void batch_items_see_each_other(void **state)
{
    (void)state;
    const struct item it[] = {
        {"10.0.0.1:1", "10.0.0.1", "", "c1"}, /* new */
        {"10.0.0.1:1", "10.0.0.1", "", "c1"}, /* the same challenge again: a replay */
        {"10.0.0.1:1", "10.0.0.1", "", "c2"}, /* a fresh challenge: renewed */
        {"10.0.0.1:2", "10.0.0.1", "", "c3"}, /* the group's second: its quota is 2 */
        {"10.0.0.1:3", "10.0.0.1", "", "c4"}, /* the third: refused */
        {"10.0.0.2:1", "10.0.0.2", "cl/i1", "c5"}, /* another group, supervised: new */
        {"10.0.0.3:1", "10.0.0.3", "", "c6"}, /* the list's cap (3) reached: refused */
    };
    redisReply *r = heartbeat(it, 7, 2, 3, "copyA");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 7);
    expect_int(r, 0, 1);
    expect_refusal(r, 1, "challenge_used");
    expect_int(r, 2, 0);
    expect_int(r, 3, 1);
    expect_refusal(r, 4, "too_many_servers");
    expect_int(r, 5, 1);
    expect_refusal(r, 6, "list_full");
    freeReplyObject(r);

    /* stored once each, with the last accepted record; the counts as accepted */
    assert_int_equal(redis_int("HLEN %s", P "s"), 3);
    redisReply *rec = h_redis(&redis, "HGET " P "s 10.0.0.1:1");
    assert_true(rec && rec->type == REDIS_REPLY_STRING && strncmp(rec->str, "c2\x1f", 3) == 0);
    freeReplyObject(rec);
    assert_int_equal(redis_int("HGET " P "n %s", "10.0.0.1"), 2);
    assert_int_equal(redis_int("HGET " P "n %s", "10.0.0.2"), 1);
    assert_int_equal(redis_int("EXISTS " P "n:%s", "10.0.0.3"), 0);
    redisReply *g = h_redis(&redis, "HEXISTS " P "n 10.0.0.3");
    assert_int_equal(g->integer, 0);
    freeReplyObject(g);
    redisReply *link = h_redis(&redis, "GET " P "inst:cl/i1");
    assert_true(link && link->type == REDIS_REPLY_STRING && !strcmp(link->str, "10.0.0.2:1"));
    freeReplyObject(link);
    /* no index of expiry per server */
    assert_int_equal(redis_int("EXISTS %s", P "exp"), 0);

    /* one stream entry: the accepted items in order, the copy that wrote them */
    redisReply *x = h_redis(&redis, "XRANGE " P "log - +");
    assert_true(x && x->type == REDIS_REPLY_ARRAY && x->elements == 1);
    redisReply *fv = x->element[0]->element[1];
    const char *a = NULL, *c = NULL;
    for (size_t i = 0; i + 1 < fv->elements; i += 2) {
        if (!strcmp(fv->element[i]->str, "a"))
            a = fv->element[i + 1]->str;
        if (!strcmp(fv->element[i]->str, "c"))
            c = fv->element[i + 1]->str;
    }
    assert_non_null(a);
    assert_string_equal(a, "10.0.0.1:1\n10.0.0.1:1\n10.0.0.1:2\n10.0.0.2:1");
    assert_non_null(c);
    assert_string_equal(c, "copyA");
    freeReplyObject(x);

    /* a later batch: the replay of the stored challenge is refused, a new one renews */
    const struct item again[] = {{"10.0.0.1:1", "10.0.0.1", "", "c2"},
                                 {"10.0.0.1:2", "10.0.0.1", "", "c7"}};
    r = heartbeat(again, 2, 2, 3, "copyB");
    expect_refusal(r, 0, "challenge_used");
    expect_int(r, 1, 0);
    freeReplyObject(r);
    assert_int_equal(redis_int("HGET " P "n %s", "10.0.0.1"), 2);
}

/* A group whose rule changed (the same address now in another group) moves its count. */
static void group_change_moves_the_count(void **state)
{
    (void)state;
    const struct item a[] = {{"10.0.1.1:1", "10.0.1.1", "", "c1"}};
    redisReply *r = heartbeat(a, 1, 5, 100, "copyA");
    expect_int(r, 0, 1);
    freeReplyObject(r);
    const struct item b[] = {{"10.0.1.1:1", "10.0.1.0/24", "", "c2"}};
    r = heartbeat(b, 1, 5, 100, "copyA");
    expect_int(r, 0, 0);
    freeReplyObject(r);
    redisReply *g = h_redis(&redis, "HEXISTS " P "n 10.0.1.1");
    assert_int_equal(g->integer, 0);
    freeReplyObject(g);
    assert_int_equal(redis_int("HGET " P "n %s", "10.0.1.0/24"), 1);
}

static redisReply *sweep(long long now, int n, int period)
{
    char a[32], b[16], c[16];
    snprintf(a, sizeof a, "%lld", now);
    snprintf(b, sizeof b, "%d", n);
    snprintf(c, sizeof c, "%d", period);
    redisReply *r = h_redis(&redis, "EVALSHA %s 1 %s %s %s 2000 %s", sweep_sha, P, a, b, c);
    assert_true(r && r->type == REDIS_REPLY_ARRAY);
    return r;
}

/* 5,000 expired records among 10 live: all gone within a bounded number of calls, each
 * removing at most what it read (at most 5n), the live ones and their counts kept. */
static void sweep_walks_the_whole_list(void **state)
{
    (void)state;
    long long now = now_ms();
    enum { DEAD = 5000, LIVE = 10, N = 100 };
    for (int i = 0; i < DEAD + LIVE; i++) {
        char addr[32], group[32], rec[512];
        snprintf(addr, sizeof addr, "10.%d.%d.%d:27960", 2 + i / 65536, (i / 256) % 256, i % 256);
        snprintf(group, sizeof group, "g%d", i % 50);
        struct item it = {addr, group, "", "c"};
        int len = record(rec, sizeof rec, &it, i < DEAD ? now - 1000 : now + 600000, now - 2000);
        redisAppendCommand(redis.ctl, "HSET " P "s %s %b", addr, rec, (size_t)len);
        redisAppendCommand(redis.ctl, "HINCRBY " P "n %s 1", group);
    }
    for (int i = 0; i < 2 * (DEAD + LIVE); i++) {
        redisReply *r = NULL;
        assert_int_equal(redisGetReply(redis.ctl, (void **)&r), REDIS_OK);
        freeReplyObject(r);
    }
    int calls = 0;
    size_t removed = 0;
    while (redis_int("HLEN %s", P "s") > LIVE && calls < 200) {
        redisReply *r = sweep(now, N, 0);
        assert_true(r->elements <= 5 * N);
        removed += r->elements;
        freeReplyObject(r);
        calls++;
    }
    /* HSCAN reads about COUNT entries per call (more when a table is resized): 5,010
     * records at 100 per call is 51 calls and some */
    assert_true(calls <= 120);
    assert_int_equal(redis_int("HLEN %s", P "s"), LIVE);
    assert_true(removed >= DEAD);
    /* every group's count is its live servers (one each for g0..g9: the live ones are
     * 5000..5009) */
    redisReply *g = h_redis(&redis, "HGETALL " P "n");
    assert_int_equal(g->elements, 2 * LIVE);
    for (size_t i = 0; i + 1 < g->elements; i += 2)
        assert_string_equal(g->element[i + 1]->str, "1");
    freeReplyObject(g);
}

/* The walk is done once per period whichever copy calls: a second call inside the
 * period reads nothing (the cursor stays), one after it goes on. */
static void sweep_once_per_period(void **state)
{
    (void)state;
    long long now = now_ms();
    for (int i = 0; i < 3000; i++) {
        char addr[32], rec[512];
        snprintf(addr, sizeof addr, "10.9.%d.%d:1", i / 256, i % 256);
        struct item it = {addr, "g", "", "c"};
        int len = record(rec, sizeof rec, &it, now - 1000, now - 2000);
        redisAppendCommand(redis.ctl, "HSET " P "s %s %b", addr, rec, (size_t)len);
    }
    for (int i = 0; i < 3000; i++) {
        redisReply *r = NULL;
        assert_int_equal(redisGetReply(redis.ctl, (void **)&r), REDIS_OK);
        freeReplyObject(r);
    }
    redisReply *r = sweep(now, 100, 10000);
    size_t first = r->elements;
    freeReplyObject(r);
    assert_true(first > 0 && first <= 500);
    redisReply *c0 = h_redis(&redis, "HGET " P "sweep c");
    assert_true(c0 && c0->type == REDIS_REPLY_STRING);
    r = sweep(now + 5000, 100, 10000); /* inside the period */
    assert_int_equal(r->elements, 0);
    freeReplyObject(r);
    redisReply *c1 = h_redis(&redis, "HGET " P "sweep c");
    assert_string_equal(c0->str, c1->str);
    freeReplyObject(c0);
    freeReplyObject(c1);
    r = sweep(now + 10000, 100, 10000); /* the period over */
    assert_true(r->elements > 0);
    freeReplyObject(r);
}

/* An empty list is not written to: an idle Redis stays unwritten. */
static void sweep_writes_nothing_while_empty(void **state)
{
    (void)state;
    redisReply *r = sweep(now_ms(), 100, 0);
    assert_int_equal(r->elements, 0);
    freeReplyObject(r);
    assert_int_equal(redis_int("EXISTS %s", P "sweep"), 0);
    redisReply *d = h_redis(&redis, "DBSIZE");
    assert_int_equal(d->integer, 0);
    freeReplyObject(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(batch_items_see_each_other, fresh),
        cmocka_unit_test_setup(group_change_moves_the_count, fresh),
        cmocka_unit_test_setup(sweep_walks_the_whole_list, fresh),
        cmocka_unit_test_setup(sweep_once_per_period, fresh),
        cmocka_unit_test_setup(sweep_writes_nothing_while_empty, fresh),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
