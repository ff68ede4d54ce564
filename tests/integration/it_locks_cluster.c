/* The lock table and blob store on a real Redis Cluster (3 primaries, a replica each)
 * through two serverdir copies: hash-tagged keys ({player42}:bank) in one call, 400
 * cross_slot for keys of different slots, a lock and its blob in one slot, the holder
 * index kept outside the scripts (listing, release, force, steal), a stopped instance's
 * locks released through the directory's hand-off, the walk over every lock visiting
 * every primary, a parked acquire woken by polling, a redis-cli --cluster reshard under
 * traffic (nothing fails but retried 503s), and a kill -9 of a primary while grants,
 * fenced saves and directory events flow (locks and directory wait_replicas 1; the
 * killed node is restarted and rejoins as a replica): no acknowledged grant or save is
 * lost, lock_seq never repeats, serverdir follows the promoted replica, and the
 * directory equals what the acknowledged events say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_rcluster.h"
#include "harness_stack.h"
#include "rcluster.h"

static h_rcluster_t rc;
static h_redis_t redis; /* rc behind h_redis: url and a ctl that follows MOVED */
static h_serverdir_t sd, sd2;

static int setup(void **state)
{
    (void)state;
    if (h_rcluster_start(&rc, 3, 1))
        return -1;
    memset(&redis, 0, sizeof redis);
    redis.cluster = &rc;
    redis.port = rc.port[0];
    snprintf(redis.url, sizeof redis.url, "%.250s", rc.url);
    const h_sd_opts_t o = {.config = "{\"locks\": {\"wait_replicas\": 1, \"wait_timeout_ms\": 1000},"
                                     " \"directory\": {\"wait_replicas\": 1, \"wait_timeout_ms\": 1000}}"};
    if (h_sd_start(&sd, &redis, &o) || h_sd_start(&sd2, &redis, &o))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    h_serverdir_stop(&sd2);
    h_serverdir_stop(&sd);
    if (redis.ctl)
        redisFree(redis.ctl);
    redis.ctl = NULL;
    h_rcluster_stop(&rc);
    return 0;
}

static long req(const h_serverdir_t *s, const char *method, const char *token,
                const char *body, h_resp_t *r, const char *path)
{
    assert_int_equal(h_http_json(method, s->url, token, body, r, "%s", path), 0);
    return r->status;
}

static json_t *ok_json(const h_serverdir_t *s, const char *method, const char *token,
                       const char *body, const char *path, long want)
{
    h_resp_t r;
    long st = req(s, method, token, body, &r, path);
    if (st != want)
        fprintf(stderr, "%s %s -> %ld %s\n", method, path, st, r.body ? r.body : "");
    assert_int_equal(st, want);
    json_t *j = h_resp_json(&r);
    h_resp_free(&r);
    return j;
}

static const char *js(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static json_int_t ji(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* One key acquired by holder through s: its lock_seq and lock_token (into tok). */
static json_int_t grab(const h_serverdir_t *s, const char *key, const char *holder, char *tok,
                       size_t cap)
{
    char body[256], path[300];
    snprintf(body, sizeof body, "{\"holder\":\"%s\"}", holder);
    snprintf(path, sizeof path, "/v1/locks/%s", key);
    json_t *j = ok_json(s, "PUT", H_TOK_GAME, body, path, 200);
    json_int_t seq = ji(j, "lock_seq");
    snprintf(tok, cap, "%s", js(j, "lock_token"));
    json_decref(j);
    return seq;
}

static long save(const h_serverdir_t *s, const char *key, json_int_t lock_seq, const char *tok,
                 json_int_t blob_seq, const char *data)
{
    char url[300], h1[64], h2[64], h3[64];
    snprintf(url, sizeof url, "%s/v1/blobs/%s", s->url, key);
    snprintf(h1, sizeof h1, "Lock-Seq: %lld", (long long)lock_seq);
    snprintf(h2, sizeof h2, "Blob-Seq: %lld", (long long)blob_seq);
    snprintf(h3, sizeof h3, "Lock-Token: %s", tok);
    const char *hdrs[] = {h1, h2, h3, NULL};
    h_resp_t r;
    if (h_http("PUT", url, H_TOK_GAME, "application/octet-stream", data, strlen(data), hdrs, &r))
        return -1;
    long st = r.status;
    h_resp_free(&r);
    return st;
}

static void tagged_keys_and_cross_slot(void **state)
{
    (void)state;
    json_t *j = ok_json(&sd, "POST", H_TOK_GAME,
                        "{\"holder\":\"zone-1\",\"keys\":[\"{player42}:bank\",\"{player42}:inv\"]}",
                        "/v1/locks/acquire", 200);
    json_t *locks = json_object_get(j, "locks");
    assert_int_equal(json_array_size(locks), 2);
    json_int_t seq = ji(json_array_get(locks, 0), "lock_seq");
    char tok[64];
    snprintf(tok, sizeof tok, "%s", js(json_array_get(locks, 0), "lock_token"));
    const char *k0 = js(json_array_get(locks, 0), "key");
    char key0[64];
    snprintf(key0, sizeof key0, "%s", k0);
    json_decref(j);
    /* the blob of a tagged key, fenced, through the other copy */
    char path[128];
    snprintf(path, sizeof path, "%%7Bplayer42%%7D:%s", strchr(key0, ':') + 1);
    assert_int_equal(save(&sd2, path, seq, tok, 1, "gold=5"), 200);
    assert_int_equal(save(&sd2, path, seq, "00000000000000000000000000000000", 2, "x"), 409);
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd2.url, H_TOK_GAME, NULL, &r, "/v1/blobs/%s", path), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 6);
    assert_memory_equal(r.body, "gold=5", 6);
    h_resp_free(&r);

    /* keys of different slots in one call: refused, nothing taken */
    assert_int_equal(req(&sd, "POST", H_TOK_GAME,
                         "{\"holder\":\"zone-1\",\"keys\":[\"alpha\",\"beta\"]}", &r,
                         "/v1/locks/acquire"),
                     400);
    assert_string_equal(h_err_code(&r), "cross_slot");
    h_resp_free(&r);
    j = ok_json(&sd, "GET", H_TOK_VIEWER, NULL, "/v1/locks/alpha", 200);
    assert_string_equal(js(j, "state"), "free");
    json_decref(j);
    assert_int_equal(req(&sd, "POST", H_TOK_GAME,
                         "{\"holder\":\"zone-1\",\"keys\":[\"a{x\",\"b\"]}", &r,
                         "/v1/locks/acquire"),
                     400);
    assert_string_equal(h_err_code(&r), "bad_name");
    h_resp_free(&r);

    /* an untagged key: its record and its blob in one slot (wrapped {=name}) */
    json_int_t s2 = grab(&sd, "alpha", "zone-1", tok, sizeof tok);
    assert_int_equal(save(&sd2, "alpha", s2, tok, 1, "a"), 200);
    redisReply *x = h_redis(&redis, "CLUSTER KEYSLOT sd:lock:{=alpha}");
    redisReply *y = h_redis(&redis, "CLUSTER KEYSLOT sd:blob:{=alpha}");
    assert_int_equal(x->integer, y->integer);
    freeReplyObject(x);
    freeReplyObject(y);
    x = h_redis(&redis, "HGET sd:lock:{=alpha} holder");
    assert_int_equal(x->type, REDIS_REPLY_STRING);
    assert_string_equal(x->str, "zone-1");
    freeReplyObject(x);
}

/* Every key of zone-1 through its holder index, then gone from it once released or
 * forced. */
static void holder_index_outside_the_scripts(void **state)
{
    (void)state;
    char tok[64];
    json_int_t seqs[60];
    char toks[60][40];
    for (int i = 0; i < 60; i++) {
        char key[32];
        snprintf(key, sizeof key, "hk-%02d", i);
        seqs[i] = grab(i % 2 ? &sd : &sd2, key, "zone-7", toks[i], sizeof toks[i]);
    }
    (void)tok;
    int seen = 0;
    char cursor[128] = "";
    for (int page = 0; page < 100; page++) {
        char path[256];
        snprintf(path, sizeof path, "/v1/locks?holder=zone-7&limit=7%s%s",
                 cursor[0] ? "&cursor=" : "", cursor);
        json_t *j = ok_json(&sd, "GET", H_TOK_VIEWER, NULL, path, 200);
        assert_true(json_array_size(json_object_get(j, "locks")) <= 7);
        seen += (int)json_array_size(json_object_get(j, "locks"));
        const char *next = json_string_value(json_object_get(j, "cursor"));
        if (next)
            snprintf(cursor, sizeof cursor, "%s", next);
        json_decref(j);
        if (!next)
            break;
    }
    assert_int_equal(seen, 60);
    /* release one (one of the copies), force another */
    char body[256];
    snprintf(body, sizeof body,
             "{\"holder\":\"zone-7\",\"keys\":[\"hk-00\"],\"lock_seqs\":{\"hk-00\":%lld},"
             "\"lock_tokens\":{\"hk-00\":\"%s\"}}",
             (long long)seqs[0], toks[0]);
    json_decref(ok_json(&sd2, "POST", H_TOK_GAME, body, "/v1/locks/release", 200));
    json_decref(ok_json(&sd, "DELETE", H_TOK_OPS, NULL, "/v1/locks/hk-01?force=true", 200));
    json_t *j = ok_json(&sd, "GET", H_TOK_VIEWER, NULL, "/v1/locks?holder=zone-7", 200);
    assert_int_equal(json_array_size(json_object_get(j, "locks")), 58);
    json_decref(j);
    redisReply *x = h_redis(&redis, "SCARD sd:lock:zone-7#h");
    assert_int_equal(x->integer, 58);
    freeReplyObject(x);
}

/* The directory records zone-9 stopped: its locks are released through the hand-off;
 * a stopped holder's lock is stolen with steal_if_holder_stopped. */
static void stop_releases_and_steal(void **state)
{
    (void)state;
    json_decref(ok_json(&sd, "POST", H_TOK_BB,
                        "{\"events\":[{\"id\":\"s1\",\"type\":\"started\",\"instance\":\"zone-9\","
                        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":10,\"slot\":0},"
                        "{\"id\":\"s2\",\"type\":\"started\",\"instance\":\"zone-8\","
                        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":11,\"slot\":1}]}",
                        "/v1/clusters/cc/events", 200));
    char tok[64];
    for (int i = 0; i < 12; i++) {
        char key[32];
        snprintf(key, sizeof key, "sr-%02d", i);
        grab(&sd, key, "zone-9", tok, sizeof tok);
    }
    grab(&sd, "steal-me", "zone-8", tok, sizeof tok);
    json_decref(ok_json(&sd2, "POST", H_TOK_BB,
                        "{\"events\":[{\"id\":\"s3\",\"type\":\"stopped\",\"instance\":\"zone-9\","
                        "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"killed\"},"
                        "{\"id\":\"s4\",\"type\":\"stopped\",\"instance\":\"zone-8\","
                        "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"killed\"}]}",
                        "/v1/clusters/cc/events", 200));
    for (int i = 0; i < 12; i++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/locks/sr-%02d", i);
        json_t *j = ok_json(&sd, "GET", H_TOK_VIEWER, NULL, path, 200);
        assert_string_equal(js(j, "state"), "free");
        json_decref(j);
    }
    json_t *j = ok_json(&sd, "GET", H_TOK_VIEWER, NULL, "/v1/clusters/cc/processes/zone-9", 200);
    assert_int_equal(ji(j, "locks_released"), 12);
    json_decref(j);
    /* zone-8's lock was released too (it held one); take a fresh one for a steal test */
    json_decref(ok_json(&sd, "POST", H_TOK_BB,
                        "{\"events\":[{\"id\":\"s5\",\"type\":\"started\",\"instance\":\"zone-6\","
                        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":12,\"slot\":2}]}",
                        "/v1/clusters/cc/events", 200));
    grab(&sd, "steal-2", "zone-6", tok, sizeof tok);
    /* zone-6 stops, but this event batch carries no locks hand-off yet when the thief
     * arrives first: the steal reads the directory itself */
    redisReply *x = h_redis(&redis, "HSET sd:{cc}:proc:zone-6 state stopped");
    freeReplyObject(x);
    j = ok_json(&sd2, "PUT", H_TOK_GAME,
                "{\"holder\":\"zone-5\",\"steal_if_holder_stopped\":\"cc\"}", "/v1/locks/steal-2",
                200);
    assert_string_equal(js(j, "stolen_from"), "zone-6");
    json_decref(j);
    x = h_redis(&redis, "SISMEMBER sd:lock:zone-6#h steal-2");
    assert_int_equal(x->integer, 0);
    freeReplyObject(x);
}

static void every_lock_walk_visits_every_primary(void **state)
{
    (void)state;
    char tok[64];
    for (int i = 0; i < 90; i++) {
        char key[32];
        snprintf(key, sizeof key, "walk-%02d", i);
        grab(&sd, key, "walker", tok, sizeof tok);
    }
    static unsigned char seen[90];
    char cursor[160] = "";
    for (int page = 0; page < 2000; page++) {
        char path[256];
        snprintf(path, sizeof path, "/v1/locks?limit=5%s%s", cursor[0] ? "&cursor=" : "",
                 cursor);
        json_t *j = ok_json(&sd2, "GET", H_TOK_VIEWER, NULL, path, 200);
        size_t i;
        json_t *l;
        assert_true(json_array_size(json_object_get(j, "locks")) <= 5);
        json_array_foreach(json_object_get(j, "locks"), i, l) {
            const char *k = js(l, "key");
            if (!strncmp(k, "walk-", 5)) {
                int n = atoi(k + 5);
                assert_false(seen[n]);
                seen[n] = 1;
                assert_string_equal(js(l, "holder"), "walker");
            }
        }
        const char *next = json_string_value(json_object_get(j, "cursor"));
        if (next)
            snprintf(cursor, sizeof cursor, "%s", next);
        json_decref(j);
        if (!next)
            break;
    }
    for (int i = 0; i < 90; i++)
        assert_true(seen[i]);
}

typedef struct {
    long status;
    int64_t ms;
} waited_t;

static void *waiter_main(void *arg)
{
    waited_t *w = arg;
    int64_t t0 = h_now_ms();
    h_resp_t r;
    if (h_http_json("PUT", sd2.url, H_TOK_GAME, "{\"holder\":\"late\",\"wait_ms\":5000}", &r,
                    "%s", "/v1/locks/parked") == 0)
        w->status = r.status;
    w->ms = h_now_ms() - t0;
    h_resp_free(&r);
    return NULL;
}

static void parked_acquire_polls(void **state)
{
    (void)state;
    char tok[64];
    json_int_t seq = grab(&sd, "parked", "early", tok, sizeof tok);
    waited_t w = {0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    h_sleep_ms(300);
    char body[256];
    snprintf(body, sizeof body,
             "{\"holder\":\"early\",\"keys\":[\"parked\"],\"lock_seqs\":{\"parked\":%lld},"
             "\"lock_tokens\":{\"parked\":\"%s\"}}",
             (long long)seq, tok);
    json_decref(ok_json(&sd, "POST", H_TOK_GAME, body, "/v1/locks/release", 200));
    pthread_join(th, NULL);
    assert_int_equal(w.status, 200);
    fprintf(stderr, "parked acquire answered after %lld ms (released at ~300 ms)\n",
            (long long)w.ms);
    assert_true(w.ms < 300 + 1500); /* woken well before its 5 s wait ran out */
}

/* ---------- a primary killed under load ---------- */

#define FO_KEYS 24

typedef struct {
    const h_serverdir_t *s;
    int first;             /* keys first .. first+FO_KEYS/2-1 */
    volatile int stop;
    int grants, saves, refused;
    json_int_t last_seq[FO_KEYS]; /* the lock_seq of the last acknowledged grant */
    json_int_t last_blob[FO_KEYS];
    char last_data[FO_KEYS][32];
    int dup_seq;           /* a lock_seq handed out twice */
} flow_t;

/* Grants and saves over its keys until told to stop; remembers what was acknowledged. */
static void *flow_main(void *arg)
{
    flow_t *f = arg;
    char tok[64];
    for (int round = 0; !f->stop && round < 100000; round++) {
        int k = f->first + round % (FO_KEYS / 2);
        char key[32], body[128], path[64];
        snprintf(key, sizeof key, "{fo%d}:p", k);
        snprintf(body, sizeof body, "{\"holder\":\"fo-%d\"}", round % 3);
        snprintf(path, sizeof path, "/v1/locks/%%7Bfo%d%%7D:p", k);
        h_resp_t r;
        if (h_http_json("PUT", f->s->url, H_TOK_GAME, body, &r, "%s", path) || r.status != 200) {
            /* another holder holds it (release below failed) or a 503 under failover:
             * force it free and go on */
            f->refused++;
            h_resp_free(&r);
            h_http_json("DELETE", f->s->url, H_TOK_OPS, NULL, &r, "%s?force=true", path);
            h_resp_free(&r);
            h_sleep_ms(20);
            continue;
        }
        json_t *j = h_resp_json(&r);
        h_resp_free(&r);
        json_int_t seq = ji(j, "lock_seq");
        snprintf(tok, sizeof tok, "%s", js(j, "lock_token"));
        /* a holder whose release failed (a 503 in the failover) acquires again: the grant
         * it holds, by design, which may be one answered 503 replication_timeout (never
         * acknowledged, so above the last acknowledged one); any new grant must be above
         * every earlier acknowledged one */
        int again = json_is_true(json_object_get(j, "reacquired"));
        json_decref(j);
        if (again ? seq < f->last_seq[k] : seq <= f->last_seq[k]) {
            fprintf(stderr, "lock_seq repeated: %s %s seq %lld after %lld\n", key,
                    again ? "reacquired" : "granted", (long long)seq, (long long)f->last_seq[k]);
            f->dup_seq++;
        }
        f->last_seq[k] = seq;
        f->grants++;
        char data[32];
        snprintf(data, sizeof data, "d%d-%d", k, round);
        char spath[80];
        snprintf(spath, sizeof spath, "%%7Bfo%d%%7D:p", k);
        json_int_t bseq = round + 1; /* always above any earlier attempt's */
        long st = save(f->s, spath, seq, tok, bseq, data);
        if (st == 200) {
            f->last_blob[k] = bseq;
            snprintf(f->last_data[k], sizeof f->last_data[k], "%s", data);
            f->saves++;
        }
        char rel[300];
        snprintf(rel, sizeof rel,
                 "{\"holder\":\"fo-%d\",\"keys\":[\"{fo%d}:p\"],\"lock_seqs\":{\"{fo%d}:p\":%lld},"
                 "\"lock_tokens\":{\"{fo%d}:p\":\"%s\"}}",
                 round % 3, k, k, (long long)seq, k, tok);
        if (h_http_json("POST", f->s->url, H_TOK_GAME, rel, &r, "%s", "/v1/locks/release") == 0)
            h_resp_free(&r);
    }
    return NULL;
}

/* Directory events into one cluster, each batch retried on 503 until acknowledged (as
 * bigbrother's outbox does): instance e<i> started, e<i-10> stopped. */
#define EV_MAX 20000
typedef struct {
    const h_serverdir_t *s;
    char cluster[32];
    volatile int stop;
    int n, retried, bad;
    unsigned char live[EV_MAX];
} ev_flow_t;

static void *ev_main(void *arg)
{
    ev_flow_t *f = arg;
    for (int i = 0; !f->stop && i < EV_MAX; i++) {
        char body[600], path[96];
        int n = snprintf(body, sizeof body,
                         "{\"events\":[{\"id\":\"s%d\",\"type\":\"started\",\"instance\":\"e%d\","
                         "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":%d}",
                         i, i, 100 + i);
        if (i >= 10)
            n += snprintf(body + n, sizeof body - (size_t)n,
                          ",{\"id\":\"x%d\",\"type\":\"stopped\",\"instance\":\"e%d\","
                          "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"exited\"}",
                          i - 10, i - 10);
        snprintf(body + n, sizeof body - (size_t)n, "]}");
        snprintf(path, sizeof path, "/v1/clusters/%s/events", f->cluster);
        /* a 503 is resent, as bigbrother's outbox does, for up to 30 s: while no primary
         * serves the slot, and (directory.wait_replicas 1) until the promoted primary
         * has a replica again */
        long st = 0;
        for (int64_t until = h_now_ms() + 30000; h_now_ms() < until;) {
            h_resp_t r;
            st = 0;
            if (h_http_json("POST", f->s->url, H_TOK_BB, body, &r, "%s", path) == 0)
                st = r.status;
            h_resp_free(&r);
            if (st != 503 && st != 0)
                break;
            f->retried++;
            h_sleep_ms(50);
        }
        if (st != 200) {
            f->bad++;
            break;
        }
        f->live[i] = 1;
        if (i >= 10)
            f->live[i - 10] = 0;
        f->n = i + 1;
    }
    return NULL;
}

static int victim_slot, victim_node;

/* The killed primary's slot has a new primary and the cluster is ok again. */
static int failed_over(void *unused)
{
    (void)unused;
    int p = h_rc_primary_of(&rc, victim_slot);
    return p >= 0 && p != victim_node && h_rc_wait_ok(&rc, 1) == 0;
}

static void primary_killed_under_load(void **state)
{
    (void)state;
    /* the primary of the most keys' slots */
    int votes[H_RC_MAX] = {0}, victim = -1;
    for (int k = 0; k < FO_KEYS; k++) {
        char tag[16];
        snprintf(tag, sizeof tag, "fo%d", k);
        redisReply *x = h_redis(&redis, "CLUSTER KEYSLOT %s", tag);
        int p = h_rc_primary_of(&rc, (int)x->integer);
        if (p >= 0 && ++votes[p] > (victim >= 0 ? votes[victim] : 0)) {
            victim = p;
            victim_slot = (int)x->integer;
        }
        freeReplyObject(x);
    }
    victim_node = victim;
    /* a cluster whose directory lives on the victim too */
    static ev_flow_t ev;
    memset(&ev, 0, sizeof ev);
    ev.s = &sd2;
    for (int i = 0; i < 100000; i++) {
        char key[48];
        snprintf(ev.cluster, sizeof ev.cluster, "fo-c%d", i);
        snprintf(key, sizeof key, "sd:{%s}:", ev.cluster);
        if (h_rc_primary_of(&rc, (int)sd__rc_slot(key, strlen(key))) == victim)
            break;
    }
    flow_t a = {.s = &sd, .first = 0}, b = {.s = &sd2, .first = FO_KEYS / 2};
    pthread_t ta, tb, te;
    assert_int_equal(pthread_create(&ta, NULL, flow_main, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, flow_main, &b), 0);
    assert_int_equal(pthread_create(&te, NULL, ev_main, &ev), 0);
    h_sleep_ms(1500);
    int grants_before = a.grants + b.grants;
    kill(rc.pid[victim], SIGKILL);
    h_wait_exit(rc.pid[victim], 2000);
    rc.pid[victim] = 0;
    int64_t killed = h_now_ms();
    assert_true(h_wait_every(failed_over, NULL, 20000, 100));
    fprintf(stderr, "failover: the replica took over after %lld ms\n",
            (long long)(h_now_ms() - killed));
    /* as an operator would: the killed node comes back and rejoins as the promoted
     * primary's replica, so writes there are confirmed again (wait_replicas 1) */
    assert_int_equal(h_rc_restart(&rc, victim), 0);
    h_sleep_ms(1500); /* traffic through the promoted replica */
    a.stop = b.stop = ev.stop = 1;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_join(te, NULL);
    fprintf(stderr, "failover: %d grants (%d before the kill), %d saves, %d refused; "
            "%d event batches into %s, %d retried 503s\n",
            a.grants + b.grants, grants_before, a.saves + b.saves, a.refused + b.refused, ev.n,
            ev.cluster, ev.retried);
    /* the directory equals what the acknowledged events say: e<i> live exactly when its
     * start was acknowledged and its stop was not */
    assert_int_equal(ev.bad, 0);
    assert_true(ev.n > 20);
    static unsigned char listed[EV_MAX];
    memset(listed, 0, sizeof listed);
    char after[64] = "";
    int nlisted = 0;
    for (int page = 0; page < 100; page++) {
        char path[160];
        snprintf(path, sizeof path, "/v1/clusters/%s/processes?limit=5000%s%s", ev.cluster,
                 after[0] ? "&after=" : "", after);
        json_t *j = ok_json(&sd, "GET", H_TOK_VIEWER, NULL, path, 200);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(j, "processes"), i, p) {
            int k = atoi(js(p, "instance") + 1);
            assert_true(k >= 0 && k < EV_MAX);
            listed[k] = 1;
            nlisted++;
        }
        const char *next = json_string_value(json_object_get(j, "next"));
        if (next)
            snprintf(after, sizeof after, "%s", next);
        json_decref(j);
        if (!next)
            break;
    }
    for (int i = 0; i < ev.n; i++)
        if (listed[i] != ev.live[i])
            fail_msg("e%d: listed %d, expected %d", i, listed[i], ev.live[i]);
    assert_true(nlisted > 0);
    assert_int_equal(a.dup_seq + b.dup_seq, 0);
    assert_true(a.grants + b.grants > grants_before); /* serverdir followed the failover */
    /* every acknowledged save is there (WAIT 1 held it on the replica) */
    for (int k = 0; k < FO_KEYS; k++) {
        flow_t *f = k < FO_KEYS / 2 ? &a : &b;
        if (!f->last_blob[k])
            continue;
        h_resp_t r;
        assert_int_equal(h_http_json("GET", sd.url, H_TOK_GAME, NULL, &r, "/v1/blobs/%%7Bfo%d%%7D:p", k), 0);
        assert_int_equal(r.status, 200);
        char hdr[32];
        assert_int_equal(h_resp_header(&r, "Blob-Seq", hdr, sizeof hdr), 0);
        assert_true(atoll(hdr) >= f->last_blob[k]);
        if (atoll(hdr) == f->last_blob[k])
            assert_memory_equal(r.body, f->last_data[k], strlen(f->last_data[k]));
        h_resp_free(&r);
        /* and the lock record remembers a lock_seq at least as high as every acknowledged
         * grant (the next grant is above it) */
        redisReply *x = h_redis(&redis, "HGET sd:lock:{fo%d}:p seq", k);
        assert_non_null(x);
        assert_int_equal(x->type, REDIS_REPLY_STRING);
        assert_true(atoll(x->str) >= f->last_seq[k]);
        freeReplyObject(x);
    }
}

/* ---------- resharding under traffic ---------- */

typedef struct {
    const h_serverdir_t *s;
    const char (*tags)[16];
    int ntags;
    volatile int stop;
    int ops, retried, bad;
    char last_bad[300];
} rs_flow_t;

/* One request, retried while it answers 503 (at most 50 times, 20 ms apart); its final
 * status. */
static long with_retry(rs_flow_t *f, const char *method, const char *path, const char *body,
                       const char *const *hdrs, const char *data, h_resp_t *r)
{
    char url[300];
    snprintf(url, sizeof url, "%s%s", f->s->url, path);
    for (int i = 0; i < 50; i++) {
        if (data ? h_http(method, url, H_TOK_GAME, "application/octet-stream", data, strlen(data),
                          hdrs, r)
                 : h_http(method, url, strcmp(method, "DELETE") ? H_TOK_GAME : H_TOK_OPS,
                          NULL, body, body ? strlen(body) : 0, NULL, r))
            return -1;
        if (r->status != 503)
            return r->status;
        f->retried++;
        h_resp_free(r);
        h_sleep_ms(20);
    }
    return 503;
}

static void rs_bad(rs_flow_t *f, const char *what, const h_resp_t *r)
{
    f->bad++;
    snprintf(f->last_bad, sizeof f->last_bad, "%s -> %ld %.200s", what, r->status,
             r->body ? r->body : "");
}

/* Grant, fenced save, release over its tags' keys until told to stop. */
static void *rs_main(void *arg)
{
    rs_flow_t *f = arg;
    for (int round = 0; !f->stop && round < 100000; round++) {
        const char *tag = f->tags[round % f->ntags];
        char path[96], body[160], tok[64], spath[96];
        snprintf(path, sizeof path, "/v1/locks/%%7B%s%%7D:k", tag);
        snprintf(body, sizeof body, "{\"holder\":\"rs-%s\"}", tag);
        h_resp_t r;
        if (with_retry(f, "PUT", path, body, NULL, NULL, &r) != 200) {
            rs_bad(f, "acquire", &r);
            h_resp_free(&r);
            continue;
        }
        json_t *j = h_resp_json(&r);
        h_resp_free(&r);
        json_int_t seq = ji(j, "lock_seq");
        snprintf(tok, sizeof tok, "%s", js(j, "lock_token"));
        json_decref(j);
        char h1[64], h2[64], h3[96];
        snprintf(h1, sizeof h1, "Lock-Seq: %lld", (long long)seq);
        snprintf(h2, sizeof h2, "Blob-Seq: %d", round + 1);
        snprintf(h3, sizeof h3, "Lock-Token: %s", tok);
        const char *hdrs[] = {h1, h2, h3, NULL};
        snprintf(spath, sizeof spath, "/v1/blobs/%%7B%s%%7D:k", tag);
        if (with_retry(f, "PUT", spath, NULL, hdrs, "state", &r) != 200)
            rs_bad(f, "save", &r);
        h_resp_free(&r);
        char rel[400];
        snprintf(rel, sizeof rel,
                 "{\"holder\":\"rs-%s\",\"keys\":[\"{%s}:k\"],\"lock_seqs\":{\"{%s}:k\":%lld},"
                 "\"lock_tokens\":{\"{%s}:k\":\"%s\"}}",
                 tag, tag, tag, (long long)seq, tag, tok);
        long st = with_retry(f, "POST", "/v1/locks/release", rel, NULL, NULL, &r);
        if (st != 200)
            rs_bad(f, "release", &r);
        h_resp_free(&r);
        f->ops++;
    }
    return NULL;
}

/* redis-cli --cluster reshard moves 100 slots (8,000 keys, one by one) from one primary
 * to another while two serverdir copies grant, save and release keys in those slots: every
 * request succeeds, some after a retried 503, and serverdir finds the keys on their new
 * node. */
static void reshard_under_traffic(void **state)
{
    (void)state;
    /* the source: the primary of slot 0's range; the keys: tags whose slot is among the
     * first 100 slots it moves */
    int src = h_rc_primary_of(&rc, 0), dst = -1;
    for (int s = 0; s < 16384 && dst < 0; s += 500) {
        int p = h_rc_primary_of(&rc, s);
        if (p >= 0 && p != src)
            dst = p;
    }
    assert_true(src >= 0 && dst >= 0);
    static char tags[8][16];
    int ntags = 0;
    for (int i = 0; i < 200000 && ntags < 8; i++) {
        char t[16];
        snprintf(t, sizeof t, "rs%d", i);
        if (sd__rc_slot(t, strlen(t)) < 100)
            memcpy(tags[ntags++], t, sizeof t);
    }
    assert_int_equal(ntags, 8);
    /* 8,000 other keys in those slots, so the migration (one key per MIGRATE) lasts */
    redisContext *c = redisConnect("127.0.0.1", rc.port[src]);
    assert_true(c && !c->err);
    int filled = 0;
    for (int i = 0; i < 400000 && filled < 8000; i++) {
        char t[16];
        snprintf(t, sizeof t, "fill%d", i);
        if (sd__rc_slot(t, strlen(t)) >= 100)
            continue;
        for (int j = 0; j < 200; j++)
            redisAppendCommand(c, "SET {%s}:%d x", t, j);
        filled += 200;
    }
    for (int i = 0; i < filled; i++) {
        redisReply *y = NULL;
        assert_int_equal(redisGetReply(c, (void **)&y), REDIS_OK);
        assert_int_equal(y->type, REDIS_REPLY_STATUS);
        freeReplyObject(y);
    }
    redisFree(c);
    rs_flow_t a = {.s = &sd, .tags = (const char (*)[16])tags, .ntags = 4};
    rs_flow_t b = {.s = &sd2, .tags = (const char (*)[16])tags + 4, .ntags = 4};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, rs_main, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, rs_main, &b), 0);
    h_sleep_ms(500);
    char src_id[64], dst_id[64], cmd[600];
    redisReply *x = h_rc_node(&rc, src, "CLUSTER MYID");
    snprintf(src_id, sizeof src_id, "%s", x->str);
    freeReplyObject(x);
    x = h_rc_node(&rc, dst, "CLUSTER MYID");
    snprintf(dst_id, sizeof dst_id, "%s", x->str);
    freeReplyObject(x);
    snprintf(cmd, sizeof cmd,
             "redis-cli --cluster reshard 127.0.0.1:%d --cluster-from %s --cluster-to %s "
             "--cluster-slots 100 --cluster-pipeline 1 --cluster-yes > %s/reshard.log 2>&1",
             rc.port[src], src_id, dst_id, rc.dir);
    int64_t t0 = h_now_ms();
    assert_int_equal(system(cmd), 0);
    int64_t took = h_now_ms() - t0;
    h_sleep_ms(500); /* and some traffic after it */
    a.stop = b.stop = 1;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    fprintf(stderr, "reshard of 100 slots in %lld ms: %d operations, %d retried 503s, %d failed%s%s\n",
            (long long)took, a.ops + b.ops, a.retried + b.retried, a.bad + b.bad,
            a.bad ? ": " : "", a.bad ? a.last_bad : b.last_bad);
    assert_int_equal(a.bad + b.bad, 0);
    assert_true(a.ops > 0 && b.ops > 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(h_rc_primary_of(&rc, (int)sd__rc_slot(tags[i], strlen(tags[i]))), dst);
    /* the redirections serverdir followed are counted */
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "%s", "/metrics"), 0);
    assert_non_null(strstr(r.body, "serverdir_redis_cluster_redirects_total{kind=\"moved\"}"));
    assert_non_null(strstr(r.body, "serverdir_redis_cluster_slot_map_loads_total"));
    h_resp_free(&r);
    assert_int_equal(h_rc_wait_ok(&rc, 5000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tagged_keys_and_cross_slot),
        cmocka_unit_test(holder_index_outside_the_scripts),
        cmocka_unit_test(stop_releases_and_steal),
        cmocka_unit_test(every_lock_walk_visits_every_primary),
        cmocka_unit_test(parked_acquire_polls),
        cmocka_unit_test(reshard_under_traffic),
        cmocka_unit_test(primary_killed_under_load),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
