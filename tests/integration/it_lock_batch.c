/* The lock path's group commit (docs/locks.md, "Group commit") against a real
 * redis-server and serverdir. Each burst pauses Redis (CLIENT PAUSE; on a Redis Cluster
 * the node of the one slot of its keys) and then lets many
 * client threads send at once, so the requests queue behind the calls in flight and
 * are carried, many to a call, by the scripts' batch forms (<name>_many.lua); the
 * serverdir counters of calls and requests per script prove it. Every request must still
 * get its own answer:
 *   - on distinct locks: every acquire, save, read, renewal and release granted, each with
 *     its own key, lock_seq and data (a read of a key with no blob its own 404);
 *   - on one lock: one grant per burst, every other acquire refused 409 lock_held naming
 *     the winner, lock_seqs strictly increasing from burst to burst, stale holders' saves
 *     refused 409 fenced in the same calls as the current holder's accepted save;
 *   - an item that fails (a lock record of the wrong type) fails alone, with the answer
 *     it gets alone; the others in its call are granted.
 * And a save by a token bound to a cluster counts its bytes in its scope's counter on
 * standalone Redis (it used to count them under the cluster's process-hash prefix); and
 * an acquire waiting in Redis never holds its HTTP thread (a serverdir with one answers
 * /healthz meanwhile). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_rcluster.h"
#include "harness_stack.h"
#include "sdclient.h"

#define NT 40        /* client threads per burst */
/* Every key of the bursts carries one hash tag: on a Redis Cluster (it.rc.lock_batch)
 * requests share calls only within one slot, and the pause reaches that slot's node
 * (tag_pick chooses it). */
static char tag[16] = "{bt}:";
static char shared[32], bad[32]; /* "<tag>bs-shared", "<tag>bw-bad" */
/* How long Redis is paused before each burst is let through: long enough for every
 * request of the burst to reach serverdir and queue (under valgrind serverdir takes
 * seconds to read 40 new connections: with 300 ms a fresh-clone run saw the first burst
 * carried one request a call). */
#define PAUSE_MS (h_valgrind() ? 1500 : 1200) /* (under serverdir's 3 s Redis timeout) */

static h_redis_t redis;
static h_serverdir_t sd;

/* The holders of the bursts ("hd-", "hs-", "hw-" and the thread's number). On a Redis
 * Cluster an acquire first updates its holder's index, a key of the holder's own slot,
 * on the HTTP thread: names whose index lives on the paused node would hold those
 * threads before the group commit sees their requests, so there each name gets a
 * suffix that puts its index on another node. */
static char holders[3][NT][32];

static void holders_pick(void)
{
    static const char *const kinds[3] = {"hd", "hs", "hw"};
    int cluster = strcmp(h_redis_mode(), "cluster") == 0;
    char x[32];
    snprintf(x, sizeof x, "%sx", tag);
    assert_int_equal(h_redis_route(&redis, h_lock_key(x)), 0);
    int paused = redis.port;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < NT; i++)
            for (int n = 0;; n++) {
                char idx[64];
                snprintf(holders[k][i], sizeof holders[k][i], "%s-%d-%d", kinds[k], i, n);
                if (!cluster)
                    break;
                snprintf(idx, sizeof idx, "sd:lock:%s#h", holders[k][i]);
                assert_int_equal(h_redis_route(&redis, idx), 0);
                if (redis.port != paused)
                    break;
            }
}

/* On a Redis Cluster a blob save first reads its scope's byte counter, on the HTTP
 * thread: the tag is one whose node is not that counter's (found after a first save),
 * so the pause holds the calls and not the threads. */
static void tag_pick(void)
{
    if (strcmp(h_redis_mode(), "cluster") == 0) {
        sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
        sdc_lock_t l;
        sdc_err_t err = {0};
        assert_int_equal(sdc_lock_acquire(c, "bt-warm", "bt-warm", NULL, &l, &err), SDC_OK);
        assert_int_equal(sdc_blob_put(c, &l, 1, "w", 1, &err), SDC_OK);
        assert_int_equal(sdc_lock_release(c, &l, "bt-warm", &err), SDC_OK);
        sdc_free(c);
        char counter[128] = "";
        for (int i = 0; i < 3 && !counter[0]; i++) {
            redisReply *r = h_rc_node(redis.cluster, i, "SCAN 0 MATCH sd:quota:blob:* COUNT 10000");
            if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->elements)
                snprintf(counter, sizeof counter, "%s", r->element[1]->element[0]->str);
            if (r)
                freeReplyObject(r);
        }
        assert_true(counter[0]);
        assert_int_equal(h_redis_route(&redis, counter), 0);
        int busy = redis.port;
        for (int n = 0;; n++) {
            char x[32];
            snprintf(tag, sizeof tag, "{bt%d}:", n);
            snprintf(x, sizeof x, "%sx", tag);
            assert_int_equal(h_redis_route(&redis, h_lock_key(x)), 0);
            if (redis.port != busy)
                break;
        }
    }
    snprintf(shared, sizeof shared, "%sbs-shared", tag);
    snprintf(bad, sizeof bad, "%sbw-bad", tag);
}

static int setup(void **state)
{
    /* one HTTP worker per client thread and more: while Redis is paused every request
     * of a burst is read and waits in its group (with the suite's 4 workers, some
     * blocked in the calls in flight, few requests could queue, and a starved machine
     * often let none) */
    static const char *const extra[] = {"--threads", "48", NULL};
    h_sd_opts_t o = {.extra = extra};
    int rc = h_stack_setup(state, &redis, &sd, &o);
    if (rc == 0) {
        tag_pick();
        holders_pick();
    }
    return rc;
}

/* ---------- bursts ---------- */

typedef struct burst burst_t;
typedef void (*op_fn)(burst_t *b, int i);

struct burst {
    op_fn op;
    int n;
    pthread_barrier_t go;
    sdc_t *cl[NT];
    /* per thread: the outcome and what the test keeps between bursts */
    int rc[NT];
    sdc_err_t err[NT];
    sdc_lock_t lock[NT];
    long status[NT];
    char body[NT][256];
};

typedef struct {
    burst_t *b;
    int i;
} arg_t;

static void *burst_thread(void *p)
{
    arg_t *a = p;
    pthread_barrier_wait(&a->b->go);
    a->b->op(a->b, a->i);
    return NULL;
}

/* Runs op for threads 0..n-1 at once, while Redis is paused for PAUSE_MS: every request
 * reaches serverdir before any call completes. */
static void burst(burst_t *b, op_fn op, int n)
{
    pthread_t th[NT];
    arg_t args[NT];
    b->op = op;
    b->n = n;
    pthread_barrier_init(&b->go, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        args[i] = (arg_t){b, i};
        sdc_err_clear(&b->err[i]);
        b->rc[i] = -100;
        assert_int_equal(pthread_create(&th[i], NULL, burst_thread, &args[i]), 0);
    }
    char x[32];
    snprintf(x, sizeof x, "%sx", tag);
    assert_int_equal(h_redis_route(&redis, h_lock_key(x)), 0);
    redisReply *r = h_redis(&redis, "CLIENT PAUSE %d WRITE", PAUSE_MS);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    pthread_barrier_wait(&b->go);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&b->go);
}

static burst_t *burst_new(void)
{
    burst_t *b = calloc(1, sizeof *b);
    assert_non_null(b);
    for (int i = 0; i < NT; i++) {
        b->cl[i] = sdc_new(sd.url, H_TOK_GAME, h_ms(10000));
        /* each client connected before its first burst (a burst's requests then only
         * have to be read, not their connections accepted: under valgrind 40 new
         * connections took longer than the pause) */
        char warm[32];
        snprintf(warm, sizeof warm, "%swarm", tag);
        sdc_lock_info_t info;
        sdc_err_t err = {0};
        sdc_lock_get(b->cl[i], warm, &info, NULL, &err);
        sdc_err_clear(&err);
    }
    return b;
}

static void burst_free(burst_t *b)
{
    for (int i = 0; i < NT; i++) {
        sdc_err_clear(&b->err[i]);
        sdc_free(b->cl[i]);
    }
    free(b);
}

/* The calls and requests (items) of script so far (serverdir's counters). */
static void script_counts(const char *script, long long *calls, long long *items)
{
    char s[128];
    snprintf(s, sizeof s, "serverdir_lock_script_calls_total{script=\"%s\"}", script);
    *calls = h_metric(sd.url, s);
    snprintf(s, sizeof s, "serverdir_lock_script_items_total{script=\"%s\"}", script);
    *items = h_metric(sd.url, s);
    assert_true(*calls >= 0 && *items >= 0);
}

/* Asserts that the requests of script since (calls0, items0) shared calls: n more
 * requests were carried by fewer than n calls. */
static void assert_batched(const char *script, long long calls0, long long items0, int n)
{
    long long calls, items;
    script_counts(script, &calls, &items);
    fprintf(stderr, "%s: %lld requests in %lld calls\n", script, items - items0, calls - calls0);
    assert_int_equal(items - items0, n);
    assert_true(calls - calls0 < items - items0);
}

/* ---------- distinct locks ---------- */

static void own_key(int i, char *buf, size_t cap) { snprintf(buf, cap, "%sbd-%d", tag, i); }
static void own_holder(int i, char *buf, size_t cap) { snprintf(buf, cap, "%s", holders[0][i]); }

static void op_acquire_own(burst_t *b, int i)
{
    char key[32], holder[32];
    own_key(i, key, sizeof key);
    own_holder(i, holder, sizeof holder);
    b->rc[i] = sdc_lock_acquire(b->cl[i], key, holder, NULL, &b->lock[i], &b->err[i]);
}

static void op_save_own(burst_t *b, int i)
{
    int n = snprintf(b->body[i], sizeof b->body[i], "data of %d under %lld", i,
                     (long long)b->lock[i].lock_seq);
    b->rc[i] = sdc_blob_put(b->cl[i], &b->lock[i], 1, b->body[i], (size_t)n, &b->err[i]);
}

/* Even threads read their own blob under their grant; odd ones a key with no blob. */
static void op_read_own(burst_t *b, int i)
{
    char key[32];
    if (i % 2)
        snprintf(key, sizeof key, "%sbn-%d", tag, i);
    else
        own_key(i, key, sizeof key);
    void *data = NULL;
    size_t len = 0;
    int64_t seq = 0;
    b->rc[i] = sdc_blob_get(b->cl[i], key, i % 2 ? NULL : &b->lock[i], &data, &len, &seq,
                            &b->err[i]);
    b->status[i] = (long)seq;
    snprintf(b->body[i] + 128, 128, "%.*s", (int)(len < 127 ? len : 127), data ? (char *)data : "");
    free(data);
}

static void op_renew_own(burst_t *b, int i)
{
    char holder[32];
    own_holder(i, holder, sizeof holder);
    int64_t left = 0;
    b->rc[i] = sdc_lock_renew(b->cl[i], &b->lock[i], holder, 60000, &left, &b->err[i]);
    b->status[i] = (long)left;
}

static void op_release_own(burst_t *b, int i)
{
    char holder[32];
    own_holder(i, holder, sizeof holder);
    b->rc[i] = sdc_lock_release(b->cl[i], &b->lock[i], holder, &b->err[i]);
}

static void burst_on_distinct_locks_each_get_their_own_answer(void **state)
{
    (void)state;
    burst_t *b = burst_new();
    long long c0, i0;

    script_counts("lock_acquire", &c0, &i0);
    burst(b, op_acquire_own, NT);
    for (int i = 0; i < NT; i++) {
        char key[32];
        own_key(i, key, sizeof key);
        if (b->rc[i] != SDC_OK)
            fprintf(stderr, "acquire %d: %d %ld %s\n", i, b->rc[i], b->err[i].status, b->err[i].code);
        assert_int_equal(b->rc[i], SDC_OK);
        assert_string_equal(b->lock[i].key, key);
        assert_true(b->lock[i].lock_seq > 0);
        assert_int_equal(b->lock[i].reacquired, 0);
        for (int k = 0; k < i; k++) /* every grant its own secret */
            assert_string_not_equal(b->lock[i].lock_token, b->lock[k].lock_token);
    }
    assert_batched("lock_acquire", c0, i0, NT);

    script_counts("blob_save", &c0, &i0);
    burst(b, op_save_own, NT);
    for (int i = 0; i < NT; i++)
        assert_int_equal(b->rc[i], SDC_OK);
    assert_batched("blob_save", c0, i0, NT);

    /* reads share calls too, each answered its own blob, or its own 404 */
    script_counts("blob_get", &c0, &i0);
    burst(b, op_read_own, NT);
    for (int i = 0; i < NT; i++) {
        if (i % 2) {
            assert_int_equal(b->rc[i], SDC_E_HTTP);
            assert_int_equal(b->err[i].status, 404);
            assert_string_equal(b->err[i].code, "no_blob");
        } else {
            assert_int_equal(b->rc[i], SDC_OK);
            assert_int_equal(b->status[i], 1);
            assert_string_equal(b->body[i] + 128, b->body[i]);
        }
    }
    assert_batched("blob_get", c0, i0, NT);

    script_counts("lock_renew", &c0, &i0);
    burst(b, op_renew_own, NT);
    for (int i = 0; i < NT; i++) {
        assert_int_equal(b->rc[i], SDC_OK);
        assert_true(b->status[i] > 50000 && b->status[i] <= 60000); /* its own new lease */
    }
    assert_batched("lock_renew", c0, i0, NT);

    script_counts("lock_release", &c0, &i0);
    burst(b, op_release_own, NT);
    for (int i = 0; i < NT; i++)
        assert_int_equal(b->rc[i], SDC_OK);
    assert_batched("lock_release", c0, i0, NT);

    /* each blob holds its own saver's data; each lock is free, its lock_seq the grant's */
    for (int i = 0; i < NT; i++) {
        char key[32];
        own_key(i, key, sizeof key);
        void *data;
        size_t len;
        int64_t seq;
        sdc_err_t err = {0};
        assert_int_equal(sdc_blob_get(b->cl[0], key, NULL, &data, &len, &seq, &err), SDC_OK);
        assert_int_equal(seq, 1);
        assert_int_equal(len, strlen(b->body[i]));
        assert_memory_equal(data, b->body[i], len);
        free(data);
        sdc_lock_info_t info;
        assert_int_equal(sdc_lock_get(b->cl[0], key, &info, NULL, &err), SDC_OK);
        assert_int_equal(info.held, 0);
        assert_int_equal(info.lock_seq, b->lock[i].lock_seq);
    }
    burst_free(b);
}

/* ---------- one lock ---------- */


static void shared_holder(int i, char *buf, size_t cap) { snprintf(buf, cap, "%s", holders[1][i]); }

static void op_acquire_shared(burst_t *b, int i)
{
    char holder[32];
    shared_holder(i, holder, sizeof holder);
    b->rc[i] = sdc_lock_acquire(b->cl[i], shared, holder, NULL, &b->lock[i], &b->err[i]);
}

/* Every thread saves under the grant it kept (stale ones and the current one). */
static sdc_lock_t kept[NT];
static int nkept;

static void op_save_kept(burst_t *b, int i)
{
    int n = snprintf(b->body[i], sizeof b->body[i], "save by grant %lld",
                     (long long)kept[i].lock_seq);
    b->rc[i] = sdc_blob_put(b->cl[i], &kept[i], 100, b->body[i], (size_t)n, &b->err[i]);
}

static void burst_on_one_lock_one_grant_refusals_and_fencing(void **state)
{
    (void)state;
    burst_t *b = burst_new();
    int64_t last_seq = 0;
    long long c0, i0;
    script_counts("lock_acquire", &c0, &i0);
    for (int round = 0; round < 4; round++) {
        burst(b, op_acquire_shared, NT);
        int winner = -1;
        for (int i = 0; i < NT; i++) {
            if (b->rc[i] == SDC_OK) {
                assert_int_equal(winner, -1); /* one grant per burst */
                winner = i;
            }
        }
        assert_true(winner >= 0);
        char wh[32];
        shared_holder(winner, wh, sizeof wh);
        for (int i = 0; i < NT; i++) {
            if (i == winner)
                continue;
            assert_int_equal(b->rc[i], SDC_E_HTTP);
            assert_int_equal(b->err[i].status, 409);
            assert_string_equal(b->err[i].code, "lock_held");
            json_t *extra = json_object_get(b->err[i].body, "error");
            assert_string_equal(json_string_value(json_object_get(extra, "holder")), wh);
        }
        /* fencing: each burst's grant is newer than every earlier one */
        assert_true(b->lock[winner].lock_seq > last_seq);
        last_seq = b->lock[winner].lock_seq;
        kept[nkept++] = b->lock[winner];
        sdc_err_t err = {0};
        if (round < 3) /* the last winner keeps its lock */
            assert_int_equal(sdc_lock_release(b->cl[winner], &b->lock[winner], wh, &err), SDC_OK);
    }
    assert_batched("lock_acquire", c0, i0, 4 * NT);

    /* the three released grants and copies of them save beside the current holder, in
     * the same calls: only the current grant's save is accepted */
    int cur = nkept - 1;
    kept[NT - 1] = kept[cur];
    for (int i = nkept; i < NT - 1; i++)
        kept[i] = kept[i % cur];
    kept[cur] = kept[0];
    script_counts("blob_save", &c0, &i0);
    burst(b, op_save_kept, NT);
    for (int i = 0; i < NT - 1; i++) {
        assert_int_equal(b->rc[i], SDC_E_HTTP);
        assert_int_equal(b->err[i].status, 409);
        assert_string_equal(b->err[i].code, "fenced");
    }
    assert_int_equal(b->rc[NT - 1], SDC_OK);
    assert_batched("blob_save", c0, i0, NT);
    void *data;
    size_t len;
    int64_t seq;
    sdc_err_t err = {0};
    assert_int_equal(sdc_blob_get(b->cl[0], shared, NULL, &data, &len, &seq, &err), SDC_OK);
    assert_int_equal(seq, 100);
    assert_int_equal(len, strlen(b->body[NT - 1]));
    assert_memory_equal(data, b->body[NT - 1], len);
    free(data);
    burst_free(b);
}

/* ---------- an item's error ---------- */


static void op_acquire_some_bad(burst_t *b, int i)
{
    char key[32], holder[32];
    if (i == NT / 2)
        snprintf(key, sizeof key, "%s", bad);
    else
        snprintf(key, sizeof key, "%sbw-%d", tag, i);
    snprintf(holder, sizeof holder, "%s", holders[2][i]);
    b->rc[i] = sdc_lock_acquire(b->cl[i], key, holder, NULL, &b->lock[i], &b->err[i]);
}

static void failing_item_fails_alone(void **state)
{
    (void)state;
    /* the lock record of BAD is a string: the script's HMGET on it fails */
    redisReply *r = h_redis(&redis, "SET %s x", h_lock_key(bad));
    freeReplyObject(r);
    /* alone, the answer the batched item must also get */
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_lock_t l;
    sdc_err_t alone = {0};
    assert_int_equal(sdc_lock_acquire(c, bad, "hw-alone", NULL, &l, &alone), SDC_E_HTTP);
    assert_int_equal(alone.status, 500);
    sdc_free(c);

    burst_t *b = burst_new();
    long long c0, i0;
    script_counts("lock_acquire", &c0, &i0);
    burst(b, op_acquire_some_bad, NT);
    for (int i = 0; i < NT; i++) {
        if (i == NT / 2) {
            assert_int_equal(b->rc[i], SDC_E_HTTP);
            assert_int_equal(b->err[i].status, alone.status);
            assert_string_equal(b->err[i].code, alone.code);
        } else {
            assert_int_equal(b->rc[i], SDC_OK);
            assert_true(b->lock[i].lock_seq > 0);
        }
    }
    assert_batched("lock_acquire", c0, i0, NT);
    sdc_err_clear(&alone);
    burst_free(b);
    r = h_redis(&redis, "DEL %s", h_lock_key(bad));
    freeReplyObject(r);
}

/* ---------- the blob quota counter of a cluster-bound token ---------- */

static void bound_token_save_counts_its_scope(void **state)
{
    (void)state;
    /* a game token bound to cluster authz1 locks as a process of that cluster */
    redisReply *r = h_redis(&redis, "HSET sd:{authz1}:proc:zq1 state ready machine m1");
    freeReplyObject(r);
    r = h_redis(&redis, "DEL sd:quota:blob:cluster:authz1");
    freeReplyObject(r);
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME_C1, h_ms(5000));
    sdc_lock_t l;
    sdc_err_t err = {0};
    assert_int_equal(sdc_lock_acquire(c, "bq-1", "zq1", NULL, &l, &err), SDC_OK);
    char data[300];
    memset(data, 'q', sizeof data);
    assert_int_equal(sdc_blob_put(c, &l, 1, data, sizeof data, &err), SDC_OK);
    r = h_redis(&redis, "GET sd:quota:blob:cluster:authz1");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_string_equal(r->str, "300");
    freeReplyObject(r);
    /* and nothing was counted under the process-hash prefix */
    r = h_redis(&redis, "EXISTS sd:{authz1}:proc:");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    assert_int_equal(sdc_lock_release(c, &l, "zq1", &err), SDC_OK);
    sdc_free(c);
}

/* ---------- an HTTP thread never waits on Redis for the lock path ---------- */

typedef struct {
    sdc_t *c;
    const char *key, *holder;
    int rc;
    sdc_lock_t l;
    sdc_err_t err;
    atomic_int done;
} slow_t;

static void *slow_acquire(void *p)
{
    slow_t *s = p;
    s->rc = sdc_lock_acquire(s->c, s->key, s->holder, NULL, &s->l, &s->err);
    atomic_store(&s->done, 1);
    return NULL;
}

/* A serverdir with one HTTP thread: an acquire whose script call waits (Redis paused) is
 * handed to its group's worker, and the thread answers another connection meanwhile. It
 * used to make a lone request's call itself (the group's fast path), and every other
 * connection of the thread waited out the call behind it (bench/README.md, "HTTP
 * threads that never wait for a lock call"). */
static void lock_call_never_holds_its_http_thread(void **state)
{
    (void)state;
    static const char *const extra[] = {"--threads", "1", NULL};
    h_sd_opts_t o = {.extra = extra};
    h_serverdir_t one;
    assert_int_equal(h_sd_start(&one, &redis, &o), 0);
    slow_t s = {.c = sdc_new(one.url, H_TOK_GAME, h_ms(10000)), .holder = holders[0][0]};
    char key[48];
    snprintf(key, sizeof key, "%sho-1", tag);
    s.key = key;
    /* the client's connection made before the pause: the acquire is only to be read */
    sdc_lock_info_t info;
    sdc_lock_get(s.c, key, &info, NULL, &s.err);
    sdc_err_clear(&s.err);

    assert_int_equal(h_redis_route(&redis, h_lock_key(key)), 0);
    long long blocked = h_redis_blocked(&redis);
    assert_true(blocked >= 0);
    redisReply *r = h_redis(&redis, "CLIENT PAUSE %d WRITE", PAUSE_MS);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    int64_t t0 = h_now_ms();
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_acquire, &s), 0);
    /* the acquire's script call reached Redis and waits there */
    assert_int_equal(h_redis_wait_blocked(&redis, blocked + 1, PAUSE_MS / 2), 0);
    if (atomic_load(&s.done))
        fail_msg("the acquire was answered during the pause: rc %d, %ld %s %s, after %lld ms",
                 s.rc, s.err.status, s.err.code, s.err.message, (long long)(h_now_ms() - t0));
    char healthz[160];
    snprintf(healthz, sizeof healthz, "%s/healthz", one.url);
    h_resp_t hr = {0};
    int64_t t1 = h_now_ms();
    assert_int_equal(h_http("GET", healthz, NULL, NULL, NULL, 0, NULL, &hr), 0);
    int waiting = !atomic_load(&s.done);
    int64_t t2 = h_now_ms();
    fprintf(stderr, "healthz answered in %lld ms, %lld ms after the acquire was sent, %s it\n",
            (long long)(t2 - t1), (long long)(t2 - t0), waiting ? "before" : "after");
    assert_int_equal(hr.status, 200);
    h_resp_free(&hr);
    /* answered while the acquire still waited for Redis, not when the pause ended */
    assert_true(waiting);
    assert_true(t2 - t1 < PAUSE_MS / 2);
    pthread_join(th, NULL);
    assert_int_equal(s.rc, SDC_OK);
    assert_int_equal(sdc_lock_release(s.c, &s.l, s.holder, &s.err), SDC_OK);
    sdc_free(s.c);
    h_serverdir_stop(&one);
}

int main(void)
{
    h_init(180);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(burst_on_distinct_locks_each_get_their_own_answer),
        cmocka_unit_test(burst_on_one_lock_one_grant_refusals_and_fencing),
        cmocka_unit_test(failing_item_fails_alone),
        cmocka_unit_test(bound_token_save_counts_its_scope),
        cmocka_unit_test(lock_call_never_holds_its_http_thread),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
