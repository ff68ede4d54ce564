/* The lock table against a real redis-server and serverdir: grants, idempotent
 * re-acquire, all-or-nothing many-key acquire and release, holder-only release and renew,
 * leases, bounded wait, steal, lock-delay, the WAIT durability knob, inspect/list, sdctl,
 * bad input (specific errors, nothing changed), and lock_seq never repeating when Redis
 * loses the lock records (DEL, FLUSHALL, restart without persistence, failover to a
 * replica that missed writes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "harness_stack.h"
#include "sdclient.h"

static h_redis_t redis;
static int on_cluster; /* H_REDIS=cluster: a multi-key acquire's names carry one tag */
static h_serverdir_t sd;       /* defaults: no lock-delay, no WAIT */
static h_serverdir_t sd_delay; /* locks.lock_delay_ms = 400 */
static h_serverdir_t sd_wait;  /* locks.wait_replicas = 1, directory.wait_replicas = 1 */

/* cmocka group setup: redis-server and the three serverdirs on it. */
static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd, NULL) ||
        h_sd_start(&sd_delay, &redis, &(h_sd_opts_t){.config = "{\"locks\": {\"lock_delay_ms\": 400}}"}) ||
        h_sd_start(&sd_wait, &redis,
                   &(h_sd_opts_t){.config = "{\"locks\": {\"wait_replicas\": 1,"
                                            " \"wait_timeout_ms\": 200},"
                                            " \"directory\": {\"wait_replicas\": 1,"
                                            " \"wait_timeout_ms\": 200}}"}))
        return -1;
    return 0;
}

/* cmocka group teardown: the serverdirs setup started, then redis-server. */
static int teardown(void **state)
{
    h_serverdir_stop(&sd_wait);
    h_serverdir_stop(&sd_delay);
    return h_stack_teardown(state);
}

/* ---- small helpers ---- */

/* "Lock-Token: <token>" that call() sends with every request while it is set: the test
 * plays the holder, which keeps the lock_token of its grant (use_grant). */
static char lock_tok_hdr[96];

static long call(const h_serverdir_t *s, const char *method, const char *token, const char *body,
                 h_resp_t *r, const char *path)
{
    char url[1024];
    snprintf(url, sizeof url, "%s%s", s->url, path);
    const char *hdrs[] = {lock_tok_hdr[0] ? lock_tok_hdr : NULL, NULL};
    assert_int_equal(h_http(method, url, token, NULL, body, body ? strlen(body) : 0, hdrs, r), 0);
    return r->status;
}

/* The lock_token of key's current grant, read from Redis (the test stands in for the
 * holder that received it), into buf and into call()'s Lock-Token header. */
static const char *use_grant(const char *key, char *buf, size_t cap)
{
    redisReply *rr = h_redis(&redis, "HGET %s token", h_lock_key(key));
    snprintf(buf, cap, "%s", rr && rr->type == REDIS_REPLY_STRING ? rr->str : "");
    freeReplyObject(rr);
    assert_int_equal(strlen(buf), 32);
    snprintf(lock_tok_hdr, sizeof lock_tok_hdr, "Lock-Token: %s", buf);
    return buf;
}

/* The same, retrying a 503 store_unavailable (bounded): after a Redis restart each
 * worker's first command finds its old connection dead and answers 503, retry later. */
static long call_retry(const h_serverdir_t *s, const char *method, const char *token,
                       const char *body, h_resp_t *r, const char *path)
{
    for (int i = 0; i < 50; i++) {
        if (call(s, method, token, body, r, path) != 503 ||
            strcmp(h_err_code(r), "store_unavailable") != 0)
            break;
        h_resp_free(r);
        h_sleep_ms(50);
    }
    return r->status;
}

static json_int_t jget(const h_resp_t *r, const char *field)
{
    json_t *j = h_resp_json(r);
    json_t *v = json_object_get(j, field);
    json_t *e = json_object_get(json_object_get(j, "error"), field);
    json_int_t out = json_is_integer(v) ? json_integer_value(v)
                     : json_is_integer(e) ? json_integer_value(e) : -1;
    json_decref(j);
    return out;
}

static const char *jstr(const h_resp_t *r, const char *field, char *buf, size_t cap)
{
    json_t *j = h_resp_json(r);
    json_t *v = json_object_get(j, field);
    if (!v)
        v = json_object_get(json_object_get(j, "error"), field);
    snprintf(buf, cap, "%s", json_is_string(v) ? json_string_value(v) : json_is_null(v) ? "null" : "");
    json_decref(j);
    return buf;
}

/* The grants acquire() received: the lock_token of each (key, lock_seq), as a holder
 * keeps it. */
static struct {
    char key[64];
    json_int_t seq;
    char token[33];
} book[256];
static int nbook;

/* The lock_token acquire() received with (key, seq); 32 zeros when none. */
static const char *book_token(const char *key, json_int_t seq)
{
    for (int i = nbook - 1; i >= 0; i--)
        if (book[i].seq == seq && !strcmp(book[i].key, key))
            return book[i].token;
    return "00000000000000000000000000000000";
}

/* Acquires key for holder through s and returns the lock_seq (fails the test on refusal). */
static json_int_t acquire(const h_serverdir_t *s, const char *key, const char *holder,
                          const char *opts)
{
    char body[256], path[200];
    snprintf(body, sizeof body, "{\"holder\":\"%s\"%s%s}", holder, opts ? "," : "", opts ? opts : "");
    snprintf(path, sizeof path, "/v1/locks/%s", key);
    h_resp_t r;
    if (call_retry(s, "PUT", H_TOK_GAME, body, &r, path) != 200)
        fprintf(stderr, "PUT %s -> %ld %s\n", path, r.status, r.body ? r.body : "");
    assert_int_equal(r.status, 200);
    json_int_t seq = jget(&r, "lock_seq");
    assert_true(seq > 0);
    if (nbook < (int)(sizeof book / sizeof book[0])) {
        snprintf(book[nbook].key, sizeof book[nbook].key, "%s", key);
        book[nbook].seq = seq;
        char tok[64];
        snprintf(book[nbook].token, sizeof book[nbook].token, "%s",
                 jstr(&r, "lock_token", tok, sizeof tok));
        assert_int_equal(strlen(book[nbook].token), 32);
        nbook++;
    }
    h_resp_free(&r);
    return seq;
}

static void release(const char *key, const char *holder, json_int_t seq)
{
    char path[256], tok[64];
    snprintf(path, sizeof path, "/v1/locks/%s?holder=%s&lock_seq=%lld", key, holder, (long long)seq);
    use_grant(key, tok, sizeof tok);
    h_resp_t r;
    assert_int_equal(call_retry(&sd, "DELETE", H_TOK_GAME, NULL, &r, path), 200);
    h_resp_free(&r);
    lock_tok_hdr[0] = '\0';
}

/* Sends a request that must be refused with status/code and change nothing in Redis. */
static void refused(const h_serverdir_t *s, const char *method, const char *token,
                    const char *body, const char *path, long status, const char *code)
{
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    h_resp_t r;
    long got = call(s, method, token, body, &r, path);
    if (got != status || strcmp(h_err_code(&r), code) != 0)
        fprintf(stderr, "%s %s -> %ld %s\n", method, path, got, r.body ? r.body : "");
    assert_int_equal(got, status);
    assert_string_equal(h_err_code(&r), code);
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);
}

/* ---- tests ---- */

static void grant_reacquire_conflict_release(void **state)
{
    json_int_t s1 = acquire(&sd, "p-basic", "A", NULL);
    h_resp_t r;
    char buf[64];

    /* Naming the holder is not holding the grant: the same holder name without the
     * grant's lock_token, or with another, is refused like anyone else (the answer
     * carries no token; the lease is not extended). */
    char gtok[64], body[160];
    use_grant("p-basic", gtok, sizeof gtok);
    lock_tok_hdr[0] = '\0';
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\"}", "/v1/locks/p-basic", 409, "lock_held");
    assert_int_equal(call(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\"}", &r, "/v1/locks/p-basic"), 409);
    assert_null(strstr(r.body, gtok));
    assert_non_null(strstr(r.body, "did not present"));
    h_resp_free(&r);
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"lock_token\":\"%032d\"}", 5);
    refused(&sd, "PUT", H_TOK_GAME, body, "/v1/locks/p-basic", 409, "lock_held");
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"keys\":[\"p-basic\"]}");
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/acquire", 409, "lock_held");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\",\"lock_token\":\"xyz\"}", "/v1/locks/p-basic",
            400, "bad_lock_token");
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"keys\":[\"p-basic\"],"
                                "\"lock_tokens\":{\"p-other\":\"%s\"}}", gtok);
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/acquire", 400, "bad_lock_token");

    /* With the grant's lock_token: the same grant (lock_seq), reacquired true. */
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"lock_token\":\"%s\"}", gtok);
    assert_int_equal(call(&sd, "PUT", H_TOK_GAME, body, &r, "/v1/locks/p-basic"), 200);
    assert_int_equal(jget(&r, "lock_seq"), s1);
    assert_non_null(strstr(r.body, "\"reacquired\":true"));
    h_resp_free(&r);
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"keys\":[\"p-basic\"],"
                                "\"lock_tokens\":{\"p-basic\":\"%s\"}}", gtok);
    assert_int_equal(call(&sd, "POST", H_TOK_GAME, body, &r, "/v1/locks/acquire"), 200);
    assert_non_null(strstr(r.body, "\"reacquired\":true"));
    h_resp_free(&r);

    /* Another holder: 409 lock_held naming the holder and since when; nothing changes. */
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"B\"}", "/v1/locks/p-basic", 409, "lock_held");
    assert_int_equal(call(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"B\"}", &r, "/v1/locks/p-basic"), 409);
    assert_string_equal(jstr(&r, "holder", buf, sizeof buf), "A");
    assert_true(jget(&r, "since_ms") > 0);
    assert_true(jget(&r, "held_for_ms") >= 0);
    h_resp_free(&r);

    /* Release by a non-holder, with a stale lock_seq: distinct errors, nothing changed. */
    char path[128], tok[64];
    use_grant("p-basic", tok, sizeof tok);
    snprintf(path, sizeof path, "/v1/locks/p-basic?holder=B&lock_seq=%lld", (long long)s1);
    refused(&sd, "DELETE", H_TOK_GAME, NULL, path, 409, "not_holder");
    snprintf(path, sizeof path, "/v1/locks/p-basic?holder=A&lock_seq=%lld", (long long)s1 - 1);
    refused(&sd, "DELETE", H_TOK_GAME, NULL, path, 409, "stale_lock_seq");

    /* Without the grant's lock_token: 400; with another: 409 fenced. */
    lock_tok_hdr[0] = '\0';
    snprintf(path, sizeof path, "/v1/locks/p-basic?holder=A&lock_seq=%lld", (long long)s1);
    refused(&sd, "DELETE", H_TOK_GAME, NULL, path, 400, "missing_lock_token");
    snprintf(lock_tok_hdr, sizeof lock_tok_hdr, "Lock-Token: %032d", 7);
    refused(&sd, "DELETE", H_TOK_GAME, NULL, path, 409, "fenced");

    release("p-basic", "A", s1);
    /* Released: a second release is not_holder, and B gets a higher lock_seq. */
    snprintf(lock_tok_hdr, sizeof lock_tok_hdr, "Lock-Token: %s", tok);
    refused(&sd, "DELETE", H_TOK_GAME, NULL, path, 409, "not_holder");
    lock_tok_hdr[0] = '\0';
    json_int_t s2 = acquire(&sd, "p-basic", "B", NULL);
    assert_true(s2 > s1);
    release("p-basic", "B", s2);
}

static void lock_seq_grows_across_release_force_expiry(void **state)
{
    json_int_t last = 0;
    h_resp_t r;
    for (int round = 0; round < 3; round++) {
        json_int_t s = acquire(&sd, "p-grow", "A", NULL);
        assert_true(s > last);
        last = s;
        release("p-grow", "A", s);

        s = acquire(&sd, "p-grow", "B", NULL);
        assert_true(s > last);
        last = s;
        assert_int_equal(call(&sd, "DELETE", H_TOK_OPS, NULL, &r, "/v1/locks/p-grow?force=true"), 200);
        assert_int_equal(jget(&r, "lock_seq"), s);
        h_resp_free(&r);

        s = acquire(&sd, "p-grow", "C", "\"ttl_ms\":50");
        assert_true(s > last);
        last = s;
        h_sleep_ms(80); /* the lease's TTL running out is what is tested */
    }
    /* The expired lease of C is free for D, with a higher lock_seq still. */
    json_int_t s = acquire(&sd, "p-grow", "D", NULL);
    assert_true(s > last);
    release("p-grow", "D", s);
}

static void many_keys_all_or_nothing(void **state)
{
    /* one acquire's keys share a slot on a cluster: there they carry one hash tag */
    const char *k1 = on_cluster ? "{m}1" : "m1", *k2 = on_cluster ? "{m}2" : "m2",
               *k3 = on_cluster ? "{m}3" : "m3";
    json_int_t sb = acquire(&sd, k2, "B", NULL);
    char body[128], path[64];
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"keys\":[\"%s\",\"%s\",\"%s\"]}", k1, k2, k3);
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/acquire", 409, "lock_held");
    h_resp_t r;
    char buf[64];
    assert_int_equal(call(&sd, "POST", H_TOK_GAME, body, &r, "/v1/locks/acquire"), 409);
    assert_string_equal(jstr(&r, "key", buf, sizeof buf), k2);
    assert_string_equal(jstr(&r, "holder", buf, sizeof buf), "B");
    h_resp_free(&r);
    snprintf(path, sizeof path, "/v1/locks/%s", k1);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, path), 200);
    assert_non_null(strstr(r.body, "\"state\":\"free\""));
    h_resp_free(&r);
    release(k2, "B", sb);

    /* Through libsdclient: all three granted, then released together. */
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    const char *keys[] = {k1, k2, k3};
    sdc_lock_t got[3];
    sdc_err_t err;
    assert_int_equal(sdc_lock_acquire_many(c, keys, 3, "A", NULL, got, &err), SDC_OK);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(got[i].key, keys[i]);
        assert_true(got[i].lock_seq > 0);
        assert_int_equal(got[i].expires_in_ms, -1);
    }
    assert_true(got[1].lock_seq > sb);
    /* Releasing with one stale lock_seq releases none of them. */
    sdc_lock_t bad[3];
    memcpy(bad, got, sizeof bad);
    bad[2].lock_seq--;
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    assert_int_equal(sdc_lock_release_many(c, bad, 3, "A", &err), SDC_E_HTTP);
    assert_string_equal(err.code, "stale_lock_seq");
    sdc_err_clear(&err);
    /* ... and so does one whose lock_token is not the grant's. */
    memcpy(bad, got, sizeof bad);
    bad[1].lock_token[0] = bad[1].lock_token[0] == 'a' ? 'b' : 'a';
    assert_int_equal(sdc_lock_release_many(c, bad, 3, "A", &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);
    assert_int_equal(sdc_lock_release_many(c, got, 3, "A", &err), SDC_OK);
    sdc_lock_info_t li;
    assert_int_equal(sdc_lock_get(c, k3, &li, NULL, &err), SDC_OK);
    assert_false(li.held);
    assert_int_equal(li.lock_seq, got[2].lock_seq);
    sdc_free(c);
}

static void bad_input_is_refused_specifically(void **state)
{
    json_int_t s = acquire(&sd, "p-bad", "A", NULL);
    char path[128];

    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\"}", "/v1/locks/bad%20key", 400, "bad_name");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\"}", "/v1/locks/..x", 400, "bad_name");
    refused(&sd, "PUT", H_TOK_GAME, "{}", "/v1/locks/p-x", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"a b\"}", "/v1/locks/p-x", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\",\"colour\":1}", "/v1/locks/p-x", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\",\"wait_ms\":30001}", "/v1/locks/p-x", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\",\"ttl_ms\":0}", "/v1/locks/p-x", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"A\",\"ttl_ms\":\"5\"}", "/v1/locks/p-x", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "[1]", "/v1/locks/p-x", 400, "bad_json");
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":", "/v1/locks/p-x", 400, "bad_json");
    refused(&sd, "POST", H_TOK_GAME, "{\"holder\":\"A\",\"keys\":[]}", "/v1/locks/acquire", 400, "bad_field");
    refused(&sd, "POST", H_TOK_GAME, "{\"holder\":\"A\",\"keys\":[\"a\",\"a\"]}", "/v1/locks/acquire", 400, "bad_field");
    refused(&sd, "POST", H_TOK_GAME, "{\"holder\":\"A\",\"keys\":[\"a\",7]}", "/v1/locks/acquire", 400, "bad_name");
    refused(&sd, "POST", H_TOK_GAME,
            "{\"holder\":\"A\",\"keys\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\","
            "\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
            "/v1/locks/acquire", 400, "bad_field");
    refused(&sd, "POST", H_TOK_GAME, "{\"holder\":\"A\",\"keys\":[\"p-bad\"]}", "/v1/locks/release", 400, "bad_field");
    refused(&sd, "POST", H_TOK_GAME, "{\"holder\":\"A\",\"keys\":[\"p-bad\"],\"lock_seqs\":{\"p-bad\":\"1\"}}",
            "/v1/locks/release", 400, "bad_field");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad", 400, "missing_holder");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad?holder=A", 400, "missing_lock_seq");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad?holder=A&lock_seq=12x", 400, "bad_lock_seq");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad?holder=A&lock_seq=-5", 400, "bad_lock_seq");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad?holder=A&lock_seq=99999999999999999999", 400, "bad_lock_seq");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad?holder=a%20b&lock_seq=1", 400, "bad_holder");
    refused(&sd, "DELETE", H_TOK_OPS, NULL, "/v1/locks/p-bad?force=yes", 400, "bad_query");
    refused(&sd, "DELETE", H_TOK_GAME, NULL, "/v1/locks/p-bad?force=true", 403, "forbidden");
    refused(&sd, "PUT", H_TOK_VIEWER, "{\"holder\":\"A\"}", "/v1/locks/p-bad", 403, "forbidden");
    refused(&sd, "PUT", NULL, "{\"holder\":\"A\"}", "/v1/locks/p-bad", 401, "unauthorized");
    refused(&sd, "GET", H_TOK_VIEWER, NULL, "/v1/locks?cursor=x", 400, "bad_cursor");
    refused(&sd, "GET", H_TOK_VIEWER, NULL, "/v1/locks?limit=0", 400, "bad_query");
    snprintf(path, sizeof path, "/v1/locks/p-bad/renew");
    refused(&sd, "POST", H_TOK_GAME, "{\"holder\":\"A\"}", path, 400, "bad_field");
    release("p-bad", "A", s);
}

static void renew_extends_lease_holder_only(void **state)
{
    json_int_t s = acquire(&sd, "p-renew", "A", "\"ttl_ms\":400");
    char body[192], tok[64];
    use_grant("p-renew", tok, sizeof tok);
    lock_tok_hdr[0] = '\0';
    h_resp_t r;
    for (int i = 0; i < 3; i++) {
        h_sleep_ms(250); /* renewals paced inside the TTL: the time is what is tested */
        snprintf(body, sizeof body, "{\"holder\":\"A\",\"lock_seq\":%lld,\"lock_token\":\"%s\"}",
                 (long long)s, tok);
        assert_int_equal(call(&sd, "POST", H_TOK_GAME, body, &r, "/v1/locks/p-renew/renew"), 200);
        assert_true(jget(&r, "expires_in_ms") > 300);
        h_resp_free(&r);
    }
    /* 750 ms after a 400 ms grant, still A's thanks to the renewals. */
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/p-renew"), 200);
    assert_non_null(strstr(r.body, "\"holder\":\"A\""));
    h_resp_free(&r);

    snprintf(body, sizeof body, "{\"holder\":\"B\",\"lock_seq\":%lld,\"lock_token\":\"%s\"}",
             (long long)s, tok);
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/p-renew/renew", 409, "not_holder");
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"lock_seq\":%lld,\"lock_token\":\"%s\"}",
             (long long)s + 1, tok);
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/p-renew/renew", 409, "stale_lock_seq");
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"lock_seq\":%lld}", (long long)s);
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/p-renew/renew", 400, "missing_lock_token");
    snprintf(body, sizeof body, "{\"holder\":\"A\",\"lock_seq\":%lld,\"lock_token\":\"%032d\"}",
             (long long)s, 9);
    refused(&sd, "POST", H_TOK_GAME, body, "/v1/locks/p-renew/renew", 409, "fenced");

    /* A longer lease by renew, through libsdclient; then it runs out. */
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_err_t err;
    int64_t exp = 0;
    sdc_lock_t g = {.key = "p-renew", .lock_seq = s};
    memcpy(g.lock_token, tok, sizeof g.lock_token - 1);
    assert_int_equal(sdc_lock_renew(c, &g, "A", 150, &exp, &err), SDC_OK);
    assert_true(exp > 100 && exp <= 150);
    h_sleep_ms(250); /* past the renewed TTL: the expiry is what is tested */
    assert_int_equal(sdc_lock_renew(c, &g, "A", 0, &exp, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "not_holder");
    sdc_err_clear(&err);
    sdc_free(c);
}

struct waiter {
    const char *url;
    const char *key;
    int64_t wait_ms;
    int rc;
    char code[64];
    int64_t lock_seq;
    int64_t elapsed_ms;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    sdc_t *c = sdc_new(w->url, H_TOK_GAME, h_ms(10000));
    sdc_lock_opts_t o = {.wait_ms = w->wait_ms};
    sdc_lock_t l;
    sdc_err_t err;
    int64_t t0 = h_now_ms();
    w->rc = sdc_lock_acquire(c, w->key, "W", &o, &l, &err);
    w->elapsed_ms = h_now_ms() - t0;
    w->lock_seq = w->rc == SDC_OK ? l.lock_seq : 0;
    snprintf(w->code, sizeof w->code, "%s", w->rc == SDC_E_HTTP ? err.code : "");
    sdc_err_clear(&err);
    sdc_free(c);
    return NULL;
}

/* Whether lock key's release-notification list <record>#q exists. */
static int wake_list_exists(const char *key)
{
    redisReply *rr = h_redis(&redis, "EXISTS %s#q", h_lock_key(key));
    assert_non_null(rr);
    assert_int_equal(rr->type, REDIS_REPLY_INTEGER);
    int e = rr->integer == 1;
    freeReplyObject(rr);
    return e;
}

static void wait_is_woken_by_release_and_bounded(void **state)
{
    /* A release nobody waits for writes no notification list (the old scripts pushed a
     * token on every release); one an acquire waits for wakes it, below. */
    json_int_t q = acquire(&sd, "p-quiet", "A", NULL);
    release("p-quiet", "A", q);
    assert_false(wake_list_exists("p-quiet"));
    json_int_t s = acquire(&sd, "p-wait", "A", NULL);
    struct waiter w = {sd.url, "p-wait", 5000, 0, "", 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &w);
    h_sleep_ms(300); /* the waiter's elapsed time is checked against this */
    release("p-wait", "A", s);
    pthread_join(th, NULL);
    if (w.rc != SDC_OK)
        fprintf(stderr, "waiter: rc=%d code=%s after %lld ms\n", w.rc, w.code, (long long)w.elapsed_ms);
    assert_int_equal(w.rc, SDC_OK);
    assert_true(w.lock_seq > s);
    /* Woken by the release (about 300 ms), not by a 2 s slice or the 5 s bound. */
    assert_true(w.elapsed_ms >= 250 && w.elapsed_ms < 1500);

    /* Nobody releases: refused after wait_ms with lock_held. */
    release("p-wait", "W", w.lock_seq);
    json_int_t sa = acquire(&sd, "p-wait", "A", NULL);
    struct waiter w2 = {sd.url, "p-wait", 600, 0, "", 0, 0};
    pthread_create(&th, NULL, waiter_main, &w2);
    pthread_join(th, NULL);
    assert_int_equal(w2.rc, SDC_E_HTTP);
    assert_string_equal(w2.code, "lock_held");
    assert_true(w2.elapsed_ms >= 590 && w2.elapsed_ms < 2000);

    /* A lease running out ends the wait too (no release notification). */
    release("p-wait", "A", sa);
    acquire(&sd, "p-wait", "A", "\"ttl_ms\":300");
    struct waiter w3 = {sd.url, "p-wait", 3000, 0, "", 0, 0};
    pthread_create(&th, NULL, waiter_main, &w3);
    pthread_join(th, NULL);
    assert_int_equal(w3.rc, SDC_OK);
    assert_true(w3.elapsed_ms < 1000);
    release("p-wait", "W", w3.lock_seq);
}

/* With one worker thread, a parked waiting acquire must not stall other requests; a
 * SIGTERM while it waits answers it and exits cleanly. */
static void waiting_acquire_does_not_hold_a_worker(void **state)
{
    h_serverdir_t one;
    const char *extra[] = {"--threads", "1", NULL};
    assert_int_equal(h_serverdir_start(&one, redis.url, h_tokens_file(), extra), 0);
    json_int_t s = acquire(&one, "p-park", "A", NULL);
    struct waiter w = {one.url, "p-park", 20000, 0, "", 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &w);
    h_sleep_ms(200); /* lets it park: a parked waiter shows nowhere to wait on */
    for (int i = 0; i < 5; i++) {
        int64_t t0 = h_now_ms();
        h_resp_t r;
        assert_int_equal(call(&one, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/p-park"), 200);
        assert_non_null(strstr(r.body, "\"holder\":\"A\""));
        h_resp_free(&r);
        assert_true(h_now_ms() - t0 < 500);
    }
    /* Shutdown answers the parked request (still held: lock_held) well before 20 s. */
    int64_t t0 = h_now_ms();
    kill(one.pid, SIGTERM);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, SDC_E_HTTP);
    assert_string_equal(w.code, "lock_held");
    assert_true(h_now_ms() - t0 < 5000);
    int st = h_wait_exit(one.pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    release("p-park", "A", s);
}

static void steal_from_stopped_or_old_holder(void **state)
{
    h_resp_t r;
    char buf[64];
    json_int_t s = acquire(&sd, "p-steal", "zone-m1-1", NULL);
    redisReply *rr = h_redis(&redis, "HSET sd:{c1}:proc:zone-m1-1 state ready");
    freeReplyObject(rr);
    const char *steal = "{\"holder\":\"zone-m2-1\",\"steal_if_holder_stopped\":\"c1\"}";
    refused(&sd, "PUT", H_TOK_GAME, steal, "/v1/locks/p-steal", 409, "lock_held");

    rr = h_redis(&redis, "HSET sd:{c1}:proc:zone-m1-1 state stopped");
    freeReplyObject(rr);
    assert_int_equal(call(&sd, "PUT", H_TOK_GAME, steal, &r, "/v1/locks/p-steal"), 200);
    assert_string_equal(jstr(&r, "stolen_from", buf, sizeof buf), "zone-m1-1");
    json_int_t s2 = jget(&r, "lock_seq");
    assert_true(s2 > s);
    h_resp_free(&r);
    /* The old holder lost it: its list is empty, its release refused. */
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks?holder=zone-m1-1"), 200);
    assert_non_null(strstr(r.body, "\"locks\":[]"));
    h_resp_free(&r);
    char path[128];
    snprintf(path, sizeof path, "/v1/locks/p-steal?holder=zone-m1-1&lock_seq=%lld", (long long)s);
    snprintf(lock_tok_hdr, sizeof lock_tok_hdr, "Lock-Token: %032d", 1);
    refused(&sd, "DELETE", H_TOK_GAME, NULL, path, 409, "not_holder");
    lock_tok_hdr[0] = '\0';

    /* Age-based: not old enough yet, then old enough. */
    const char *young = "{\"holder\":\"X\",\"steal_if_older_than_ms\":60000}";
    refused(&sd, "PUT", H_TOK_GAME, young, "/v1/locks/p-steal", 409, "lock_held");
    h_sleep_ms(150); /* the lock's age is what is tested */
    assert_int_equal(call(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"X\",\"steal_if_older_than_ms\":100}",
                          &r, "/v1/locks/p-steal"), 200);
    assert_string_equal(jstr(&r, "stolen_from", buf, sizeof buf), "zone-m2-1");
    json_int_t s3 = jget(&r, "lock_seq");
    assert_true(s3 > s2);
    h_resp_free(&r);
    release("p-steal", "X", s3);
}

static void lock_delay_after_force_and_expiry_not_release(void **state)
{
    h_resp_t r;
    json_int_t s = acquire(&sd_delay, "p-delay", "A", NULL);
    /* A clean release: no delay. */
    release("p-delay", "A", s);
    s = acquire(&sd_delay, "p-delay", "B", NULL);

    /* A forced unlock: 409 lock_delayed with Retry-After, then free after 400 ms. */
    assert_int_equal(call(&sd_delay, "DELETE", H_TOK_OPS, NULL, &r, "/v1/locks/p-delay?force=true"), 200);
    assert_int_equal(jget(&r, "lock_delay_ms"), 400);
    h_resp_free(&r);
    refused(&sd_delay, "PUT", H_TOK_GAME, "{\"holder\":\"C\"}", "/v1/locks/p-delay", 409, "lock_delayed");
    assert_int_equal(call(&sd_delay, "PUT", H_TOK_GAME, "{\"holder\":\"C\"}", &r, "/v1/locks/p-delay"), 409);
    assert_true(jget(&r, "retry_after_ms") > 0 && jget(&r, "retry_after_ms") <= 400);
    char ra[16];
    assert_int_equal(h_resp_header(&r, "Retry-After", ra, sizeof ra), 0);
    h_resp_free(&r);
    assert_int_equal(call(&sd_delay, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/p-delay"), 200);
    assert_true(jget(&r, "lock_delay_ms") > 0);
    h_resp_free(&r);
    /* A waiting acquire waits through the delay. */
    struct waiter w = {sd_delay.url, "p-delay", 3000, 0, "", 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &w);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, SDC_OK);
    assert_true(w.lock_seq > s);
    assert_true(w.elapsed_ms < 1500);
    release("p-delay", "W", w.lock_seq);

    /* An expired lease: delay counted from the expiry. */
    acquire(&sd_delay, "p-delay", "D", "\"ttl_ms\":100");
    h_sleep_ms(150); /* expired, but inside the 400 ms delay: the timing is what is tested */
    refused(&sd_delay, "PUT", H_TOK_GAME, "{\"holder\":\"E\"}", "/v1/locks/p-delay", 409, "lock_delayed");
    h_sleep_ms(400);
    json_int_t se = acquire(&sd_delay, "p-delay", "E", NULL);
    assert_true(se > w.lock_seq);
    release("p-delay", "E", se);
}

/* A's acquire of p-dur presents a lock_token of its own, so that its retries after a 503
 * are recognised as the same grant. */
#define DUR_BODY "{\"holder\":\"A\",\"lock_token\":\"d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0\"}"

/* h_wait_every condition: the re-acquire of p-dur by A on sd_wait is confirmed by a
 * replica (200); *arg (a json_int_t) gets its lock_seq. */
static int regrant_confirmed(void *arg)
{
    h_resp_t r;
    if (call(&sd_wait, "PUT", H_TOK_GAME, DUR_BODY, &r, "/v1/locks/p-dur") == 200)
        *(json_int_t *)arg = jget(&r, "lock_seq");
    h_resp_free(&r);
    return *(json_int_t *)arg > 0;
}

static void wait_replicas_knob(void **state)
{
    /* No replica: the grant is answered 503 replication_timeout (retry is idempotent). */
    h_resp_t r;
    assert_int_equal(call(&sd_wait, "PUT", H_TOK_GAME, DUR_BODY, &r, "/v1/locks/p-dur"), 503);
    assert_string_equal(h_err_code(&r), "replication_timeout");
    h_resp_free(&r);
    /* A blob save is held to the same bar: stored on the primary, answered 503. */
    {
        assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/p-dur"), 200);
        json_int_t seq = jget(&r, "lock_seq");
        h_resp_free(&r);
        char tok[64], url[256], h1[64], h3[96];
        use_grant("p-dur", tok, sizeof tok);
        snprintf(url, sizeof url, "%s/v1/blobs/p-dur", sd_wait.url);
        snprintf(h1, sizeof h1, "Lock-Seq: %lld", (long long)seq);
        snprintf(h3, sizeof h3, "Lock-Token: %s", tok);
        const char *hdrs[] = {h1, "Blob-Seq: 1", h3, NULL};
        assert_int_equal(h_http("PUT", url, H_TOK_GAME, "application/octet-stream", "x", 1, hdrs, &r), 0);
        assert_int_equal(r.status, 503);
        assert_string_equal(h_err_code(&r), "replication_timeout");
        h_resp_free(&r);
        lock_tok_hdr[0] = '\0';
    }
    /* So is an event batch (directory.wait_replicas): applied on the primary, answered
     * 503, so its sender keeps it and resends it. */
    static const char batch[] =
        "{\"events\":[{\"id\":\"dur-1\",\"type\":\"started\",\"instance\":\"dur-i\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":42}]}";
    assert_int_equal(call(&sd_wait, "POST", H_TOK_BB, batch, &r, "/v1/clusters/cdur/events"), 503);
    assert_string_equal(h_err_code(&r), "replication_timeout");
    h_resp_free(&r);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/cdur/processes/dur-i"), 200);
    h_resp_free(&r);

    /* With a replica attached the same re-acquire answers 200 with the same lock_seq. */
    h_redis_t replica;
    assert_int_equal(h_redis_start(&replica), 0);
    redisReply *rr = h_redis(&replica, "REPLICAOF 127.0.0.1 %d", redis.port);
    freeReplyObject(rr);
    json_int_t s = 0;
    h_wait_every(regrant_confirmed, &s, 20000, 50); /* a full sync under load takes seconds */
    assert_true(s > 0);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/p-dur"), 200);
    assert_int_equal(jget(&r, "lock_seq"), s);
    h_resp_free(&r);
    /* and the resent batch answers 200: a duplicate, now confirmed */
    assert_int_equal(call(&sd_wait, "POST", H_TOK_BB, batch, &r, "/v1/clusters/cdur/events"), 200);
    assert_int_equal(jget(&r, "duplicates"), 1);
    h_resp_free(&r);
    release("p-dur", "A", s);

    /* A WAIT that Redis answers with an error confirms nothing. A serverdir on a
     * writable replica (a primary demoted under it) writes there, and its WAIT gets
     * "WAIT cannot be used with replica instances": the old code answered the batch 200. */
    rr = h_redis(&replica, "CONFIG SET replica-read-only no");
    freeReplyObject(rr);
    h_serverdir_t on_replica;
    assert_int_equal(h_sd_start(&on_replica, &replica,
                                &(h_sd_opts_t){.config = "{\"directory\": {\"wait_replicas\": 1,"
                                                         " \"wait_timeout_ms\": 200}}"}),
                     0);
    static const char batch2[] =
        "{\"events\":[{\"id\":\"dur-2\",\"type\":\"started\",\"instance\":\"dur-j\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":43}]}";
    assert_int_equal(call(&on_replica, "POST", H_TOK_BB, batch2, &r, "/v1/clusters/cdur2/events"),
                     503);
    assert_string_equal(h_err_code(&r), "replication_timeout");
    h_resp_free(&r);
    h_serverdir_stop(&on_replica);
    h_redis_stop(&replica);
}

/* The lock_seq of key in the listing of every held lock (GET /v1/locks without holder,
 * followed through its cursor, a few locks per page), or 0 when it is not listed as held
 * by holder. */
static json_int_t all_locks_seq(const char *key, const char *holder)
{
    char cursor[32] = "";
    json_int_t seq = 0;
    for (int page = 0; page < 1000; page++) {
        h_resp_t r;
        char path[96];
        snprintf(path, sizeof path, "/v1/locks?limit=2%s%s", cursor[0] ? "&cursor=" : "", cursor);
        assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, path), 200);
        json_t *j = h_resp_json(&r);
        size_t i;
        json_t *l;
        assert_true(json_array_size(json_object_get(j, "locks")) <= 2);
        json_array_foreach(json_object_get(j, "locks"), i, l)
            if (!strcmp(json_string_value(json_object_get(l, "key")), key) &&
                !strcmp(json_string_value(json_object_get(l, "holder")), holder))
                seq = json_integer_value(json_object_get(l, "lock_seq"));
        json_t *next = json_object_get(j, "cursor");
        int done = !json_is_string(next);
        if (!done)
            snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        json_decref(j);
        h_resp_free(&r);
        if (done)
            return seq;
    }
    fail_msg("the lock listing did not end");
    return 0;
}

static void inspect_list_and_sdctl(void **state)
{
    json_int_t s1 = acquire(&sd, "inv-b", "H1", "\"ttl_ms\":60000");
    json_int_t s2 = acquire(&sd, "inv-a", "H1", NULL);
    h_resp_t r;
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks?holder=H1"), 200);
    json_t *j = h_resp_json(&r);
    json_t *locks = json_object_get(j, "locks");
    assert_int_equal(json_array_size(locks), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(locks, 0), "key")), "inv-a");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(locks, 1), "lock_seq")), s1);
    assert_true(json_integer_value(json_object_get(json_array_get(locks, 1), "expires_in_ms")) > 50000);
    json_decref(j);
    h_resp_free(&r);
    /* Every held lock, for dashboards: both are listed with their holder and lock_seq. */
    assert_int_equal(all_locks_seq("inv-a", "H1"), s2);
    assert_int_equal(all_locks_seq("inv-b", "H1"), s1);

    /* sdctl, through libsdclient, as an operator. */
    const char *dir = h_tmpdir();
    char log[300];
    snprintf(log, sizeof log, "%s/sdctl.out", dir);
    const char *get[] = {SD_BIN_DIR "/sdctl", "--url", sd.url, "--token", H_TOK_OPS, "-o", "json",
                         "locks", "get", "inv-a", NULL};
    pid_t pid = h_spawn(get, log, NULL);
    int st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *out = NULL;
    size_t len = 0;
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    assert_true(getdelim(&out, &len, '\0', f) > 0);
    fclose(f);
    char want[64];
    snprintf(want, sizeof want, "\"lock_seq\": %lld", (long long)s2);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"holder\": \"H1\""));
    free(out);

    const char *force[] = {SD_BIN_DIR "/sdctl", "--url", sd.url, "--token", H_TOK_OPS,
                           "locks", "force-unlock", "inv-a", NULL};
    pid = h_spawn(force, log, NULL);
    st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* Again: nothing held any more -> exit code 4 (not found). */
    pid = h_spawn(force, log, NULL);
    st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 4);
    /* The game role may not force-unlock: exit code 6. */
    const char *force_game[] = {SD_BIN_DIR "/sdctl", "--url", sd.url, "--token", H_TOK_GAME,
                                "locks", "force-unlock", "inv-b", NULL};
    pid = h_spawn(force_game, log, NULL);
    st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 6);

    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks?holder=H1"), 200);
    assert_non_null(strstr(r.body, "inv-b"));
    assert_null(strstr(r.body, "inv-a"));
    h_resp_free(&r);
    assert_int_equal(all_locks_seq("inv-a", "H1"), 0);
    release("inv-b", "H1", s1);
    assert_int_equal(all_locks_seq("inv-b", "H1"), 0);
}

static int save(const char *key, json_int_t lock_seq, json_int_t blob_seq, const char *data,
                h_resp_t *r)
{
    char url[256], h1[64], h2[64], h3[64];
    snprintf(url, sizeof url, "%s/v1/blobs/%s", sd.url, key);
    snprintf(h1, sizeof h1, "Lock-Seq: %lld", (long long)lock_seq);
    snprintf(h2, sizeof h2, "Blob-Seq: %lld", (long long)blob_seq);
    snprintf(h3, sizeof h3, "Lock-Token: %s", book_token(key, lock_seq));
    const char *hdrs[] = {h1, h2, h3, NULL};
    /* After a Redis restart each worker's first command may find its connection dead and
     * answer 503 (retry later): retry those, bounded. */
    for (int i = 0; i < 50; i++) {
        assert_int_equal(h_http("PUT", url, H_TOK_GAME, "application/octet-stream", data,
                                strlen(data), hdrs, r), 0);
        if (r->status != 503)
            break;
        h_resp_free(r);
        h_sleep_ms(50);
    }
    return (int)r->status;
}

static int redis_up(void *arg)
{
    redisReply *rr = h_redis(arg, "PING");
    int ok = rr && rr->type == REDIS_REPLY_STATUS;
    if (rr)
        freeReplyObject(rr);
    return ok;
}

/* Restarts redis-server on the same port without persistence: everything is lost. */
static void redis_restart_empty(void)
{
    int port = redis.port;
    kill(redis.pid, SIGKILL);
    int st;
    waitpid(redis.pid, &st, 0);
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    const char *argv[] = {"redis-server", "--port", portstr, "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--dir", redis.dir, NULL};
    redis.pid = h_spawn(argv, redis.log, NULL);
    assert_true(h_wait_until(redis_up, &redis, 5000));
}

static void lock_seq_survives_loss_of_the_lock_table(void **state)
{
    h_resp_t r;
    json_int_t s1 = acquire(&sd, "p-loss", "A", NULL);
    assert_int_equal(save("p-loss", s1, 1, "A1", &r), 200);
    h_resp_free(&r);

    /* 1. The lock records are deleted behind serverdir's back (blob records stay). */
    redisReply *rr = h_redis(&redis, "DEL sd:lock:p-loss sd:lock:A#h");
    freeReplyObject(rr);
    assert_int_equal(save("p-loss", s1, 2, "A2", &r), 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    json_int_t s2 = acquire(&sd, "p-loss", "B", NULL);
    assert_true(s2 > s1);

    /* 2. The whole lock table and blobs are flushed. */
    rr = h_redis(&redis, "FLUSHALL");
    freeReplyObject(rr);
    assert_int_equal(save("p-loss", s2, 5, "B5", &r), 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    json_int_t s3 = acquire(&sd, "p-loss", "C", NULL);
    assert_true(s3 > s2);
    assert_int_equal(save("p-loss", s3, 1, "C1", &r), 200);
    h_resp_free(&r);

    /* 3. Redis restarts without persistence: serverdir reconnects, the next grant is
     * higher than every earlier one, the old holder's save is refused. */
    redis_restart_empty();
    json_int_t s4 = acquire(&sd, "p-loss", "D", NULL);
    assert_true(s4 > s3);
    assert_int_equal(save("p-loss", s3, 9, "C9", &r), 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    assert_int_equal(save("p-loss", s4, 1, "D1", &r), 200);
    h_resp_free(&r);
    release("p-loss", "D", s4);
}

static int replica_has(void *arg)
{
    h_redis_t *rep = arg;
    redisReply *rr = h_redis(rep, "HGET sd:lock:p-failover seq");
    int ok = rr && rr->type == REDIS_REPLY_STRING;
    if (rr)
        freeReplyObject(rr);
    return ok;
}

/* Failover to a replica that missed the last grants: the promoted replica only knows an
 * old lock_seq, yet its next grant is higher than every grant of the old primary, and a
 * holder of the lost grants is fenced there. */
static void lock_seq_survives_failover_to_a_stale_replica(void **state)
{
    h_redis_t replica;
    h_serverdir_t sd2;
    assert_int_equal(h_redis_start(&replica), 0);
    redisReply *rr = h_redis(&replica, "REPLICAOF 127.0.0.1 %d", redis.port);
    freeReplyObject(rr);
    json_int_t s1 = acquire(&sd, "p-failover", "A", NULL);
    assert_true(h_wait_until(replica_has, &replica, 10000));

    /* The replica is cut off, then the primary grants on without it. */
    rr = h_redis(&replica, "REPLICAOF NO ONE");
    freeReplyObject(rr);
    release("p-failover", "A", s1);
    json_int_t s2 = acquire(&sd, "p-failover", "B", NULL);
    h_resp_t r;
    assert_int_equal(save("p-failover", s2, 1, "B1", &r), 200);
    h_resp_free(&r);

    /* Clients fail over to the promoted replica (a serverdir pointed at it). */
    assert_int_equal(h_serverdir_start(&sd2, replica.url, h_tokens_file(), NULL), 0);
    h_keys_t before, after;
    h_keys_take(&replica, &before, H_KEYS_LOCKS, NULL);
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/p-failover", sd2.url);
    char h1[64], h3[64];
    snprintf(h1, sizeof h1, "Lock-Seq: %lld", (long long)s2);
    snprintf(h3, sizeof h3, "Lock-Token: %s", book_token("p-failover", s2));
    const char *hdrs[] = {h1, "Blob-Seq: 2", h3, NULL};
    assert_int_equal(h_http("PUT", url, H_TOK_GAME, "application/octet-stream", "B2", 2, hdrs, &r), 0);
    assert_int_equal(r.status, 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    h_keys_take(&replica, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);
    /* There A still holds it (its release was lost too): the operator frees it, and the
     * next grant is above every grant the old primary made. */
    assert_int_equal(call(&sd2, "DELETE", H_TOK_OPS, NULL, &r, "/v1/locks/p-failover?force=true"), 200);
    assert_int_equal(jget(&r, "lock_seq"), s1);
    h_resp_free(&r);
    json_int_t s3 = acquire(&sd2, "p-failover", "C", NULL);
    assert_true(s3 > s2 && s2 > s1);
    h_serverdir_stop(&sd2);
    h_redis_stop(&replica);
    release("p-failover", "B", s2);
}

/* Locks die with their holder: when the directory records an instance stopped, the locks
 * it was granted before the stop are freed with the stop lock-delay (5 s by default),
 * counted on the stop's record and in the metrics; a lock whose holder is no instance is
 * untouched, and the stopped holder's grant is fenced from then on. */
static void locks_die_with_their_holder(void **state)
{
    (void)state;
    h_resp_t r;
    static const char started[] =
        "{\"events\":[{\"id\":\"ld1\",\"type\":\"started\",\"instance\":\"zone-m1-0\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":100,\"slot\":0}]}";
    static const char stopped[] =
        "{\"events\":[{\"id\":\"ld2\",\"type\":\"stopped\",\"instance\":\"zone-m1-0\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"killed\",\"signal\":9}]}";
    assert_int_equal(call(&sd, "POST", H_TOK_BB, started, &r, "/v1/clusters/ld/events"), 200);
    h_resp_free(&r);
    json_int_t s1 = acquire(&sd, "ld-k1", "zone-m1-0", NULL);
    json_int_t s2 = acquire(&sd, "ld-k2", "lobby-x", NULL);
    assert_int_equal(save("ld-k1", s1, 1, "before", &r), 200);
    h_resp_free(&r);

    assert_int_equal(call(&sd, "POST", H_TOK_BB, stopped, &r, "/v1/clusters/ld/events"), 200);
    h_resp_free(&r);
    char buf[64];
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/ld-k1"), 200);
    assert_string_equal(jstr(&r, "state", buf, sizeof buf), "free");
    json_int_t delay = jget(&r, "lock_delay_ms");
    assert_true(delay > 3000 && delay <= 5000);
    h_resp_free(&r);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/ld-k2"), 200);
    assert_string_equal(jstr(&r, "holder", buf, sizeof buf), "lobby-x");
    h_resp_free(&r);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ld/processes/zone-m1-0"),
                     200);
    assert_int_equal(jget(&r, "locks_released"), 1);
    h_resp_free(&r);

    /* The stopped holder's grant is fenced; another holder waits out the lock-delay. */
    assert_int_equal(save("ld-k1", s1, 2, "late", &r), 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    refused(&sd, "PUT", H_TOK_GAME, "{\"holder\":\"zone-m2-0\"}", "/v1/locks/ld-k1", 409,
            "lock_delayed");
    /* A second delivery of the same stop (a retried batch) releases nothing more. */
    assert_int_equal(call(&sd, "POST", H_TOK_BB, stopped, &r, "/v1/clusters/ld/events"), 200);
    h_resp_free(&r);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ld/processes/zone-m1-0"),
                     200);
    assert_int_equal(jget(&r, "locks_released"), 1);
    h_resp_free(&r);
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/metrics"), 0);
    assert_non_null(strstr(r.body, "serverdir_locks_released_on_stop_total 1"));
    h_resp_free(&r);
    release("ld-k2", "lobby-x", s2);
}

/* A batch of many stops frees every stopped holder's locks before it is answered, and on
 * one Redis in a few script calls whatever the number of stops (directory.c,
 * drain_unlocks: a drain round's holders in one lock_release_holder_many call, their
 * master-list entries in one master_forget_instance_many, the entries removed in one
 * unlock_done): not two scripts and an LREM a stop, which held the events path to a
 * few thousand events a second (100 stops, two rounds: 7 script calls, 201 before). */
static void many_stops_drained_in_few_calls(void **state)
{
    (void)state;
    enum { N = 100 };
    char body[N * 160 + 64], key[64], inst[32];
    h_resp_t r;
    for (int pass = 0; pass < 2; pass++) {
        size_t o = (size_t)snprintf(body, sizeof body, "{\"events\":[");
        for (int i = 0; i < N; i++)
            o += (size_t)snprintf(body + o, sizeof body - o,
                                  pass ? "%s{\"id\":\"mx%d\",\"type\":\"stopped\",\"instance\":"
                                         "\"zone-mx-%d\",\"machine\":\"m1\",\"service\":\"zone\","
                                         "\"reason\":\"exited\",\"code\":0}"
                                       : "%s{\"id\":\"ms%d\",\"type\":\"started\",\"instance\":"
                                         "\"zone-mx-%d\",\"machine\":\"m1\",\"service\":\"zone\","
                                         "\"pid\":100}",
                                  i ? "," : "", i, i);
        snprintf(body + o, sizeof body - o, "]}");
        if (pass == 0) {
            assert_int_equal(call(&sd, "POST", H_TOK_BB, body, &r, "/v1/clusters/mx/events"), 200);
            h_resp_free(&r);
            for (int i = 0; i < N; i++) {
                snprintf(key, sizeof key, "mx-k%d", i);
                snprintf(inst, sizeof inst, "zone-mx-%d", i);
                acquire(&sd, key, inst, NULL);
            }
            continue;
        }
        char slot_key[64];
        snprintf(slot_key, sizeof slot_key, "sd:{mx}:unlock");
        assert_int_equal(h_redis_route(&redis, slot_key), 0);
        long long before = h_redis_script_calls(&redis, NULL);
        assert_int_equal(call(&sd, "POST", H_TOK_BB, body, &r, "/v1/clusters/mx/events"), 200);
        h_resp_free(&r);
        long long calls = h_redis_script_calls(&redis, NULL) - before;
        print_message("a batch of %d stops: %lld script calls\n", N, calls);
        /* 7 (13 under valgrind), and the sweeps the three copies on this Redis made
         * meanwhile (a few a second each): fewer than one a stop, where two scripts a
         * stop made 2N + 1 */
        if (!on_cluster)
            assert_true(calls < N);
    }
    char buf[64];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "/v1/locks/mx-k%d", i);
        assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, key), 200);
        assert_string_equal(jstr(&r, "state", buf, sizeof buf), "free");
        h_resp_free(&r);
    }
    for (int i = 0; i < N; i += 33) {
        snprintf(key, sizeof key, "/v1/clusters/mx/processes/zone-mx-%d", i);
        assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, key), 200);
        assert_int_equal(jget(&r, "locks_released"), 1);
        h_resp_free(&r);
    }
    redisReply *left = h_redis(&redis, "LLEN sd:{mx}:unlock");
    assert_int_equal(left->integer, 0);
    freeReplyObject(left);
}

/* A stop whose own release fails (here its holder index is not a set, so the script
 * fails for it alone) is logged and its entry removed like the rest: kept, it would fail
 * on every drain, and a round's worth of such entries at the head of the list hid every
 * stop behind them, whose locks then stayed held. */
static void failed_release_does_not_block_the_drain(void **state)
{
    (void)state; /* (standalone only: on a cluster each holder's release is a call of its own) */
    enum { N = 64 };
    char body[(N + 1) * 160 + 64];
    h_resp_t r;
    for (int i = 0; i < N; i++)
        freeReplyObject(h_redis(&redis, "SET sd:lock:zone-px-%d#h not-a-set", i));
    static const char started[] =
        "{\"events\":[{\"id\":\"px-s\",\"type\":\"started\",\"instance\":\"zone-px-ok\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":100}]}";
    assert_int_equal(call(&sd, "POST", H_TOK_BB, started, &r, "/v1/clusters/px/events"), 200);
    h_resp_free(&r);
    acquire(&sd, "px-k", "zone-px-ok", NULL);
    size_t o = (size_t)snprintf(body, sizeof body, "{\"events\":[");
    for (int i = 0; i <= N; i++) {
        char inst[32];
        if (i < N)
            snprintf(inst, sizeof inst, "zone-px-%d", i);
        else
            snprintf(inst, sizeof inst, "zone-px-ok");
        o += (size_t)snprintf(body + o, sizeof body - o,
                              "%s{\"id\":\"px%d\",\"type\":\"stopped\",\"instance\":\"%s\","
                              "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"exited\","
                              "\"code\":0}",
                              i ? "," : "", i, inst);
    }
    snprintf(body + o, sizeof body - o, "]}");
    assert_int_equal(call(&sd, "POST", H_TOK_BB, body, &r, "/v1/clusters/px/events"), 200);
    h_resp_free(&r);
    char buf[64];
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/px-k"), 200);
    assert_string_equal(jstr(&r, "state", buf, sizeof buf), "free");
    h_resp_free(&r);
    redisReply *left = h_redis(&redis, "LLEN sd:{px}:unlock");
    assert_int_equal(left->integer, 0);
    freeReplyObject(left);
    for (int i = 0; i < N; i++)
        freeReplyObject(h_redis(&redis, "DEL sd:lock:zone-px-%d#h", i));
}

/* A cluster's settings override what a recorded stop does to its instances' locks: no
 * lock-delay (another holder takes the key at once), or no release at all; PUT {}
 * returns to the serverdir defaults; bad input and other roles are refused. */
static void stop_policy_per_cluster(void **state)
{
    (void)state;
    h_resp_t r;
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/sp/settings"), 200);
    json_t *j = h_resp_json(&r);
    json_t *lk = json_object_get(j, "locks");
    assert_true(json_is_true(json_object_get(lk, "release_on_stop")));
    assert_int_equal(json_integer_value(json_object_get(lk, "stop_lock_delay_ms")), 5000);
    assert_int_equal(json_object_size(json_object_get(json_object_get(j, "overrides"), "locks")), 0);
    json_decref(j);
    h_resp_free(&r);

    assert_int_equal(call(&sd, "PUT", H_TOK_OPS, "{\"locks\":{\"stop_lock_delay_ms\":0}}", &r,
                          "/v1/clusters/sp/settings"),
                     200);
    j = h_resp_json(&r);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(j, "overrides"), "locks"),
                                                        "stop_lock_delay_ms")),
                     0);
    json_decref(j);
    h_resp_free(&r);
    const char ev1[] = "{\"events\":[{\"id\":\"sp1\",\"type\":\"started\",\"instance\":\"sp-1\","
                       "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1}]}";
    const char ev2[] = "{\"events\":[{\"id\":\"sp2\",\"type\":\"stopped\",\"instance\":\"sp-1\","
                       "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"killed\"}]}";
    assert_int_equal(call(&sd, "POST", H_TOK_BB, ev1, &r, "/v1/clusters/sp/events"), 200);
    h_resp_free(&r);
    acquire(&sd, "sp-k1", "sp-1", NULL);
    assert_int_equal(call(&sd, "POST", H_TOK_BB, ev2, &r, "/v1/clusters/sp/events"), 200);
    h_resp_free(&r);
    json_int_t s = acquire(&sd, "sp-k1", "sp-9", NULL); /* at once: no lock-delay */
    release("sp-k1", "sp-9", s);

    /* no release at all */
    assert_int_equal(call(&sd, "PUT", H_TOK_OPS, "{\"locks\":{\"release_on_stop\":false}}", &r,
                          "/v1/clusters/sp/settings"),
                     200);
    h_resp_free(&r);
    const char ev3[] = "{\"events\":[{\"id\":\"sp3\",\"type\":\"started\",\"instance\":\"sp-2\","
                       "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":2}]}";
    const char ev4[] = "{\"events\":[{\"id\":\"sp4\",\"type\":\"stopped\",\"instance\":\"sp-2\","
                       "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"killed\"}]}";
    assert_int_equal(call(&sd, "POST", H_TOK_BB, ev3, &r, "/v1/clusters/sp/events"), 200);
    h_resp_free(&r);
    json_int_t s2 = acquire(&sd, "sp-k2", "sp-2", NULL);
    assert_int_equal(call(&sd, "POST", H_TOK_BB, ev4, &r, "/v1/clusters/sp/events"), 200);
    h_resp_free(&r);
    char buf[64];
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks/sp-k2"), 200);
    assert_string_equal(jstr(&r, "holder", buf, sizeof buf), "sp-2");
    h_resp_free(&r);
    release("sp-k2", "sp-2", s2);

    /* back to the defaults; bad input and other roles refused, nothing changed */
    assert_int_equal(call(&sd, "PUT", H_TOK_OPS, "{}", &r, "/v1/clusters/sp/settings"), 200);
    j = h_resp_json(&r);
    assert_true(json_is_true(json_object_get(json_object_get(j, "locks"), "release_on_stop")));
    assert_int_equal(json_object_size(json_object_get(json_object_get(j, "overrides"), "locks")), 0);
    json_decref(j);
    h_resp_free(&r);
    refused(&sd, "PUT", H_TOK_OPS, "{\"locks\":{\"stop_lock_delay_ms\":-1}}",
            "/v1/clusters/sp/settings", 400, "bad_field");
    refused(&sd, "PUT", H_TOK_OPS, "{\"locks\":{\"release\":true}}", "/v1/clusters/sp/settings",
            400, "bad_field");
    refused(&sd, "PUT", H_TOK_GAME, "{}", "/v1/clusters/sp/settings", 403, "forbidden");
}

/* Walks /v1/locks pages (the holder's when holder is given, else every lock) of `limit`
 * and marks each pg-NNNN key seen; asserts no page exceeds limit. A key may come twice:
 * SCAN and SSCAN return an element again when Redis resizes the table during the walk
 * (under load, right after the 1,500 acquires, it did); each one held throughout comes
 * at least once, which the caller checks. Returns the number of pages. */
static int walk_lock_pages(const char *holder, int limit, unsigned char *seen)
{
    char cursor[128] = "";
    for (int page = 1; page < 5000; page++) {
        h_resp_t r;
        char path[256];
        snprintf(path, sizeof path, "/v1/locks?limit=%d%s%s%s%s", limit, holder ? "&holder=" : "",
                 holder ? holder : "", cursor[0] ? "&cursor=" : "", cursor);
        assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, path), 200);
        json_t *j = h_resp_json(&r);
        json_t *locks = json_object_get(j, "locks");
        assert_true(json_array_size(locks) <= (size_t)limit);
        size_t i;
        json_t *l;
        json_array_foreach(locks, i, l) {
            const char *k = json_string_value(json_object_get(l, "key"));
            const char *pg = strstr(k, "pg-");
            if (pg)
                seen[atoi(pg + 3)] = 1;
        }
        json_t *next = json_object_get(j, "cursor");
        int done = !json_is_string(next);
        if (!done)
            snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        json_decref(j);
        h_resp_free(&r);
        if (done)
            return page;
    }
    fail_msg("the lock listing did not end");
    return 0;
}

/* (Runs last: its 1500 locks stay held.) The lock lists are paged with cursors and lose
 * nothing: 1500 locks of one holder (more
 * than 1000, past any fixed cap of a holder list) in pages of 100 and through
 * libsdclient; every lock in pages of 7 (a page that fills inside one SCAN step resumes
 * there instead of skipping the step's rest). */
static void lock_lists_are_paged(void **state)
{
    (void)state;
    for (int b = 0; b < 1500; b += 15) {
        char body[1024], tag[16] = ""; /* on a cluster, one tag per acquire: {gB}pg-NNNN */
        if (on_cluster)
            snprintf(tag, sizeof tag, "{g%d}", b);
        int n = snprintf(body, sizeof body, "{\"holder\":\"HP\",\"keys\":[");
        for (int i = b; i < b + 15; i++)
            n += snprintf(body + n, sizeof body - (size_t)n, "%s\"%spg-%04d\"", i > b ? "," : "",
                          tag, i);
        snprintf(body + n, sizeof body - (size_t)n, "]}");
        h_resp_t r;
        assert_int_equal(call(&sd, "POST", H_TOK_GAME, body, &r, "/v1/locks/acquire"), 200);
        h_resp_free(&r);
    }
    static unsigned char seen[1500];
    memset(seen, 0, sizeof seen);
    int pages = walk_lock_pages("HP", 100, seen);
    assert_true(pages >= 15);
    for (int i = 0; i < 1500; i++)
        assert_true(seen[i]);
    memset(seen, 0, sizeof seen);
    walk_lock_pages(NULL, 7, seen);
    for (int i = 0; i < 1500; i++)
        assert_true(seen[i]);

    sdc_t *c = sdc_new(sd.url, H_TOK_VIEWER, h_ms(5000));
    sdc_err_t err;
    json_t *out = NULL;
    assert_int_equal(sdc_lock_list_by_holder(c, "HP", &out, &err), SDC_OK);
    assert_int_equal(json_array_size(json_object_get(out, "locks")), 1500);
    json_decref(out);
    sdc_free(c);

    h_resp_t r;
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks?holder=HP&cursor=x1"), 400);
    h_resp_free(&r);
    assert_int_equal(call(&sd, "GET", H_TOK_VIEWER, NULL, &r, "/v1/locks?cursor=12-%2Fx"), 400);
    h_resp_free(&r);
}

int main(void)
{
    h_init(150);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grant_reacquire_conflict_release),
        cmocka_unit_test(lock_seq_grows_across_release_force_expiry),
        cmocka_unit_test(many_keys_all_or_nothing),
        cmocka_unit_test(bad_input_is_refused_specifically),
        cmocka_unit_test(renew_extends_lease_holder_only),
        cmocka_unit_test(wait_is_woken_by_release_and_bounded),
        cmocka_unit_test(waiting_acquire_does_not_hold_a_worker),
        cmocka_unit_test(steal_from_stopped_or_old_holder),
        cmocka_unit_test(lock_delay_after_force_and_expiry_not_release),
        cmocka_unit_test(wait_replicas_knob),
        cmocka_unit_test(inspect_list_and_sdctl),
        cmocka_unit_test(lock_seq_survives_failover_to_a_stale_replica),
        cmocka_unit_test(locks_die_with_their_holder),
        cmocka_unit_test(many_stops_drained_in_few_calls),
        cmocka_unit_test(failed_release_does_not_block_the_drain),
        cmocka_unit_test(stop_policy_per_cluster),
        cmocka_unit_test(lock_seq_survives_loss_of_the_lock_table),
        cmocka_unit_test(lock_lists_are_paged),
    };
    on_cluster = strcmp(h_redis_mode(), "cluster") == 0;
    if (!on_cluster)
        return cmocka_run_group_tests(tests, setup, teardown);
    /* On a Redis Cluster (it.rc.locks) every test but the three that turn a standalone
     * server into a replica or kill it: their cluster counterparts (WAIT through a
     * primary's failover, lock_seq across it, resharding) are in it.locks_cluster. */
    const struct CMUnitTest on_a_cluster[] = {
        cmocka_unit_test(grant_reacquire_conflict_release),
        cmocka_unit_test(lock_seq_grows_across_release_force_expiry),
        cmocka_unit_test(many_keys_all_or_nothing),
        cmocka_unit_test(bad_input_is_refused_specifically),
        cmocka_unit_test(renew_extends_lease_holder_only),
        cmocka_unit_test(wait_is_woken_by_release_and_bounded),
        cmocka_unit_test(waiting_acquire_does_not_hold_a_worker),
        cmocka_unit_test(steal_from_stopped_or_old_holder),
        cmocka_unit_test(lock_delay_after_force_and_expiry_not_release),
        cmocka_unit_test(inspect_list_and_sdctl),
        cmocka_unit_test(locks_die_with_their_holder),
        cmocka_unit_test(many_stops_drained_in_few_calls),
        cmocka_unit_test(stop_policy_per_cluster),
        cmocka_unit_test(lock_lists_are_paged),
    };
    return cmocka_run_group_tests(on_a_cluster, setup, teardown);
}
