/* Quotas (docs/operations.md, "Quotas"), with small limits in the test config: the bytes
 * of blobs a scope (here a token's principal) stores, the locks one holder holds, the
 * allocation requests that wait per cluster, per token and in all. Each refusal answers
 * quota_exceeded naming the quota, its limit and the use (507 for storage, 429 for
 * counts), moves serverdir_quota_refusals_total{quota=...} and changes nothing. */
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

#define BLOB_QUOTA 1000
#define LOCK_QUOTA 3

static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd,
                         &(h_sd_opts_t){.config = "{\"quotas\":{\"blob_bytes\":1000,"
                                                  "\"locks_per_holder\":3,"
                                                  "\"allocations_waiting\":6,"
                                                  "\"allocations_waiting_per_cluster\":2,"
                                                  "\"allocations_waiting_per_token\":3}}"});
}

/* The refusal r of quota q: status, code, the quota, its limit and the use. */
static void expect_quota(const h_resp_t *r, long status, const char *q, long long limit,
                         long long used)
{
    json_t *o = h_resp_json(r);
    json_t *e = json_object_get(o, "error");
    if (r->status != status || strcmp(ct_str(e, "code"), "quota_exceeded") != 0)
        fail_msg("want %ld quota_exceeded (%s), got %ld %s", status, q, r->status, r->body);
    assert_string_equal(ct_str(e, "quota"), q);
    assert_int_equal(ct_int(e, "limit"), limit);
    assert_int_equal(ct_int(e, "used"), used);
    json_decref(o);
}

static long long refusals(const char *q)
{
    char series[128];
    snprintf(series, sizeof series, "serverdir_quota_refusals_total{quota=\"%s\"}", q);
    return h_metric(sd.url, series);
}

/* ---------- blob bytes ---------- */

typedef struct {
    long long seq;
    char token[80];
} grant_t;

/* Holder h acquires lock key with token tok. */
static grant_t acquire(const char *tok, const char *key, const char *h)
{
    char body[128];
    json_t *o = NULL;
    snprintf(body, sizeof body, "{\"holder\":\"%s\"}", h);
    assert_int_equal(ct_call(sd.url, tok, "PUT", body, &o, NULL, "/v1/locks/%s", key), 200);
    grant_t g = {.seq = ct_int(o, "lock_seq")};
    snprintf(g.token, sizeof g.token, "%s", ct_str(o, "lock_token"));
    json_decref(o);
    return g;
}

/* PUT n bytes as blob key under grant g, Blob-Seq bseq, with token tok. */
static void save(const char *tok, const char *key, const grant_t *g, int bseq, size_t n,
                 h_resp_t *r)
{
    char url[256], h1[64], h2[128], h3[64];
    char *data = malloc(n + 1);
    memset(data, 'x', n);
    snprintf(url, sizeof url, "%s/v1/blobs/%s", sd.url, key);
    snprintf(h1, sizeof h1, "Lock-Seq: %lld", g->seq);
    snprintf(h2, sizeof h2, "Lock-Token: %s", g->token);
    snprintf(h3, sizeof h3, "Blob-Seq: %d", bseq);
    const char *hdrs[] = {h1, h2, h3, NULL};
    assert_int_equal(h_http("PUT", url, tok, "application/octet-stream", data, n, hdrs, r), 0);
    free(data);
}

/* A token's saves count for its principal: 600 bytes fit, 600 more do not (507, nothing
 * stored); a smaller save of the first frees room, then they fit; another token has a
 * scope of its own; an operator's delete gives the bytes back. */
static void blob_bytes_per_scope(void **state)
{
    (void)state;
    h_resp_t r;
    grant_t a = acquire(H_TOK_GAME, "qb-a", "qb-holder");
    grant_t b = acquire(H_TOK_GAME, "qb-b", "qb-holder");
    save(H_TOK_GAME, "qb-a", &a, 1, 600, &r);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    long long before = refusals("blob_bytes");
    h_keys_t k0, k1;
    h_keys_take(&redis, &k0, "sd:blob:*", "sd:quota:*", NULL);
    save(H_TOK_GAME, "qb-b", &b, 1, 600, &r);
    expect_quota(&r, 507, "blob_bytes", BLOB_QUOTA, 600);
    h_resp_free(&r);
    h_keys_take(&redis, &k1, "sd:blob:*", "sd:quota:*", NULL);
    h_keys_same(&k0, &k1, "a save past the blob_bytes quota");
    assert_int_equal(refusals("blob_bytes"), before + 1);

    /* a re-save counts only what it adds: 600 -> 300 makes room for 600 more */
    save(H_TOK_GAME, "qb-a", &a, 2, 300, &r);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    save(H_TOK_GAME, "qb-b", &b, 1, 600, &r);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    save(H_TOK_GAME, "qb-b", &b, 2, 800, &r); /* 300 + 800 */
    expect_quota(&r, 507, "blob_bytes", BLOB_QUOTA, 900);
    h_resp_free(&r);

    /* another token: its own scope */
    grant_t c = acquire(H_TOK_GAME2, "qb-c", "qb-other");
    save(H_TOK_GAME2, "qb-c", &c, 1, 900, &r);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    /* an operator's delete gives qb-a's 300 bytes back */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "DELETE", NULL, NULL, NULL, "/v1/blobs/qb-a"), 200);
    save(H_TOK_GAME, "qb-b", &b, 2, 1000, &r);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
}

/* ---------- locks per holder ---------- */

/* A holder with 3 locks is refused a 4th (429, nothing written) and two more at once; it
 * may still renew what it holds by acquiring again with the grant; after a release one
 * fits again. */
static void locks_per_holder(void **state)
{
    (void)state;
    grant_t g[LOCK_QUOTA];
    char key[32], body[256];
    for (int i = 0; i < LOCK_QUOTA; i++) {
        snprintf(key, sizeof key, "ql-%d", i);
        g[i] = acquire(H_TOK_GAME, key, "ql-holder");
    }
    long long before = refusals("locks_per_holder");
    h_keys_t k0, k1;
    h_keys_take(&redis, &k0, "sd:lock:*", "sd:blob:*", NULL);
    h_resp_t r;
    char url[256];
    snprintf(url, sizeof url, "%s/v1/locks/ql-3", sd.url);
    snprintf(body, sizeof body, "{\"holder\":\"ql-holder\"}");
    assert_int_equal(h_http("PUT", url, H_TOK_GAME, NULL, body, strlen(body), NULL, &r), 0);
    expect_quota(&r, 429, "locks_per_holder", LOCK_QUOTA, LOCK_QUOTA);
    h_resp_free(&r);
    snprintf(url, sizeof url, "%s/v1/locks/acquire", sd.url);
    snprintf(body, sizeof body, "{\"holder\":\"ql-holder\",\"keys\":[\"{ql}4\",\"{ql}5\"]}");
    assert_int_equal(h_http("POST", url, H_TOK_GAME, NULL, body, strlen(body), NULL, &r), 0);
    expect_quota(&r, 429, "locks_per_holder", LOCK_QUOTA, LOCK_QUOTA);
    h_resp_free(&r);
    h_keys_take(&redis, &k1, "sd:lock:*", "sd:blob:*", NULL);
    h_keys_same(&k0, &k1, "an acquire past the locks_per_holder quota");
    assert_int_equal(refusals("locks_per_holder"), before + 2);

    /* acquiring a held lock again with its grant adds nothing: allowed */
    snprintf(body, sizeof body, "{\"holder\":\"ql-holder\",\"lock_token\":\"%s\"}", g[0].token);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "PUT", body, NULL, NULL, "/v1/locks/ql-0"), 200);
    /* another holder has its own quota */
    acquire(H_TOK_GAME, "ql-3", "ql-other");
    /* a release makes room */
    snprintf(body, sizeof body,
             "{\"holder\":\"ql-holder\",\"keys\":[\"ql-1\"],\"lock_seqs\":{\"ql-1\":%lld},"
             "\"lock_tokens\":{\"ql-1\":\"%s\"}}",
             g[1].seq, g[1].token);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "POST", body, NULL, NULL, "/v1/locks/release"),
                     200);
    acquire(H_TOK_GAME, "ql-6", "ql-holder");
}

/* ---------- allocations waiting ---------- */

typedef struct {
    const char *cluster, *token;
    long status;
} waiter_t;

static void *wait_one(void *arg)
{
    waiter_t *w = arg;
    w->status = ct_call(sd.url, w->token, "POST", "{\"service\":\"match\",\"wait_ms\":3000}", NULL,
                        NULL, "/v1/clusters/%s/allocations", w->cluster);
    return NULL;
}

static int waiting(void *want)
{
    return h_metric(sd.url, "serverdir_allocations_waiting") >= (long long)(intptr_t)want;
}

static int none_waiting(void *unused)
{
    (void)unused;
    return h_metric(sd.url, "serverdir_allocations_waiting") == 0;
}

/* One refused wait: its quota, limit and use; nothing of cluster c written. With waiters
 * on c (others: 1), its pool:demand counter is left out: each of their re-checks (one a
 * second, alloc_create.lua finding nothing) moves it, and on a slow machine one lands
 * between the two snapshots (seen under valgrind). The refusals on clusters nobody waits
 * on still check that counter: a request tried before it is refused moves it. */
static void refused_wait(const char *c, int others, const char *token, const char *q,
                         long long limit, long long used)
{
    char url[256], pat[64], demand[64];
    h_resp_t r;
    h_keys_t k0, k1;
    long long before = refusals(q);
    snprintf(pat, sizeof pat, "sd:{%s}:*", c);
    snprintf(demand, sizeof demand, "sd:{%s}:pool:demand", c);
    h_keys_take(&redis, &k0, pat, NULL);
    snprintf(url, sizeof url, "%s/v1/clusters/%s/allocations", sd.url, c);
    const char *body = "{\"service\":\"match\",\"wait_ms\":3000}";
    assert_int_equal(h_http("POST", url, token, NULL, body, strlen(body), NULL, &r), 0);
    expect_quota(&r, 429, q, limit, used);
    h_resp_free(&r);
    h_keys_take(&redis, &k1, pat, NULL);
    if (others) {
        h_keys_drop(&k0, demand);
        h_keys_drop(&k1, demand);
    }
    h_keys_same(&k0, &k1, q);
    assert_int_equal(refusals(q), before + 1);
}

/* Waits with no capacity: 2 per cluster, 3 per token, 6 in all; each cap refuses the next
 * one at once, and the waits it let in still wait. */
static void allocations_waiting(void **state)
{
    (void)state;
    static const char *const clusters[] = {"qw1", "qw2", "qw3", "qw4", "qw5", "qw6"};
    for (size_t i = 0; i < sizeof clusters / sizeof clusters[0]; i++)
        assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/true\",\"count\":1}",
                                 NULL, NULL, "/v1/clusters/%s/services/match", clusters[i]),
                         200);
    /* game token: 2 on qw1, 1 on qw2; game2: 1 on qw3, 1 on qw4 (then 1 on qw5) */
    static waiter_t w[] = {{"qw1", H_TOK_GAME, 0}, {"qw1", H_TOK_GAME, 0}, {"qw2", H_TOK_GAME, 0},
                           {"qw3", H_TOK_GAME2, 0}, {"qw4", H_TOK_GAME2, 0},
                           {"qw5", H_TOK_GAME2, 0}};
    pthread_t t[6];
    for (int i = 0; i < 5; i++) {
        assert_int_equal(pthread_create(&t[i], NULL, wait_one, &w[i]), 0);
        assert_true(h_wait_until(waiting, (void *)(intptr_t)(i + 1), h_ms(3000)));
    }
    refused_wait("qw1", 1, H_TOK_GAME2, "allocations_waiting_per_cluster", 2, 2);
    refused_wait("qw5", 0, H_TOK_GAME, "allocations_waiting_per_token", 3, 3);
    assert_int_equal(pthread_create(&t[5], NULL, wait_one, &w[5]), 0);
    assert_true(h_wait_until(waiting, (void *)(intptr_t)6, h_ms(3000)));
    refused_wait("qw6", 0, H_TOK_GAME2, "allocations_waiting", 6, 6); /* nobody waits there */
    for (int i = 0; i < 6; i++)
        assert_int_equal(w[i].status, 0); /* still waiting */
    for (int i = 0; i < 6; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].status, 409); /* no_capacity when their wait ended */
    }
    /* their places are given back: when the answer has been sent, so a moment after the
     * client has it (seen 1 still counted right after the joins on a busy machine) */
    assert_true(h_wait_until(none_waiting, NULL, h_ms(2000)));
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blob_bytes_per_scope),
        cmocka_unit_test(locks_per_holder),
        cmocka_unit_test(allocations_waiting),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
