/* Allocations against serverdir (docs/allocation.md), with the instances' lives told by
 * process events as a Big Brother would post them: one script picks, concurrent
 * allocators never share an instance, idempotency keys, selectors and strategies, join
 * capacity, wait_ms, the ends of an allocation (release, expiry, crash, clean exit,
 * machine lost) and what each does to the pool, bad requests that change nothing, paged
 * lists, and that an allocation or event batch waiting in Redis never holds its HTTP
 * thread. it.alloc_game runs the same with real bigbrothers and gameprocs. */
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
#include "harness_api.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

static int setup(void **state) { return h_stack_setup(state, &redis, &sd, NULL); }

/* POST one event batch (JSON array text) to cluster c as its Big Brother. */
static void events(const char *c, const char *batch)
{
    char *body = malloc(strlen(batch) + 32);
    sprintf(body, "{\"events\":%s}", batch);
    char code[64];
    long st = ct_call(sd.url, H_TOK_BB, "POST", body, NULL, code, "/v1/clusters/%s/events", c);
    if (st != 200)
        fprintf(stderr, "events: %ld %s\n", st, code);
    assert_int_equal(st, 200);
    free(body);
}

/* Service svc of cluster c (spec extra fields in `extra`), machines m0..m<nm-1> with
 * labels zone=eu (even) / us (odd), and per machine `per` ready instances
 * <svc>-m<k>-<i> on slots k*per+i, generation gen. */
static void fleet(const char *c, const char *svc, const char *extra, int nm, int per, int gen)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"command\":\"/bin/true\",\"count\":%d%s%s}", nm * per,
             extra ? "," : "", extra ? extra : "");
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", body, NULL, NULL,
                             "/v1/clusters/%s/services/%s", c, svc), 200);
    size_t cap = (size_t)(nm * per) * 400 + 16, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b + len, cap - len, "[");
    for (int k = 0; k < nm; k++) {
        snprintf(body, sizeof body, "{\"address\":\"10.0.0.%d\",\"labels\":{\"zone\":\"%s\"}}",
                 k + 1, k % 2 ? "us" : "eu");
        assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, NULL,
                                 "/v1/clusters/%s/machines/m%d", c, k), 200);
        for (int i = 0; i < per; i++) {
            int slot = k * per + i;
            len += (size_t)snprintf(
                b + len, cap - len,
                "%s{\"id\":\"s.%s.%d.%d\",\"type\":\"started\",\"instance\":\"%s-m%d-%d\","
                "\"machine\":\"m%d\",\"service\":\"%s\",\"pid\":%d,\"slot\":%d,\"generation\":%d,"
                "\"ports\":{\"game\":%d}},"
                "{\"id\":\"r.%s.%d.%d\",\"type\":\"ready\",\"instance\":\"%s-m%d-%d\","
                "\"machine\":\"m%d\",\"service\":\"%s\",\"generation\":%d}",
                len > 1 ? "," : "", svc, slot, gen, svc, k, i, k, svc, 100 + slot, slot, gen,
                27000 + slot, svc, slot, gen, svc, k, i, k, svc, gen);
        }
    }
    snprintf(b + len, cap - len, "]");
    events(c, b);
    free(b);
}

/* POST an allocation request; returns the status, *out the body. */
static long alloc(const char *c, const char *body, json_t **out, char *code)
{
    return ct_call(sd.url, H_TOK_GAME, "POST", body, out, code, "/v1/clusters/%s/allocations", c);
}

/* The pool figures of service svc: allocated and ready_free. */
static void pool_of(const char *c, const char *svc, long long *allocated, long long *free_)
{
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/services/%s", c, svc), 200);
    json_t *p = json_object_get(o, "pool");
    assert_non_null(p);
    *allocated = ct_int(p, "allocated");
    *free_ = ct_int(p, "ready_free");
    json_decref(o);
}

static json_t *get_alloc(const char *c, const char *id)
{
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/allocations/%s", c, id), 200);
    return o;
}

/* ---------- concurrency ---------- */

#define ALLOCATORS 16
#define POOL 120

typedef struct {
    int ok, none, other;
    char got[POOL][64];
} worker_t;

static void *allocator(void *arg)
{
    worker_t *w = arg;
    for (int i = 0; i < 40; i++) {
        json_t *o = NULL;
        /* the error code from the body: h_err_code's buffer is shared between threads */
        long st = alloc("cc", "{\"service\":\"zone\",\"strategy\":\"distributed\"}", &o, NULL);
        const char *code = ct_str(json_object_get(o, "error"), "code");
        if (st == 201 && w->ok < POOL)
            snprintf(w->got[w->ok++], 64, "%s", ct_str(o, "instance"));
        else if (st == 409 && !strcmp(code, "no_capacity"))
            w->none++;
        else {
            w->other++;
            fprintf(stderr, "allocator: unexpected %ld %s\n", st, code);
        }
        json_decref(o);
    }
    return NULL;
}

/* 16 allocators x 40 requests against 120 ready instances: exactly 120 succeed, each
 * instance once; the rest are no_capacity; the pool shows 120 allocated, 0 free. */
static void concurrent_allocators_never_share(void **state)
{
    (void)state;
    fleet("cc", "zone", NULL, 6, POOL / 6, 0);
    static worker_t w[ALLOCATORS];
    pthread_t t[ALLOCATORS];
    for (int i = 0; i < ALLOCATORS; i++)
        pthread_create(&t[i], NULL, allocator, &w[i]);
    for (int i = 0; i < ALLOCATORS; i++)
        pthread_join(t[i], NULL);
    int ok = 0, none = 0, other = 0;
    static char seen[POOL * 2][64];
    int nseen = 0;
    for (int i = 0; i < ALLOCATORS; i++) {
        ok += w[i].ok;
        none += w[i].none;
        other += w[i].other;
        for (int k = 0; k < w[i].ok; k++) {
            for (int j = 0; j < nseen; j++)
                assert_string_not_equal(seen[j], w[i].got[k]);
            snprintf(seen[nseen++], 64, "%s", w[i].got[k]);
        }
    }
    assert_int_equal(other, 0);
    assert_int_equal(ok, POOL);
    assert_int_equal(none, ALLOCATORS * 40 - POOL);
    long long a, f;
    pool_of("cc", "zone", &a, &f);
    assert_int_equal(a, POOL);
    assert_int_equal(f, 0);
}

/* ---------- idempotency, answers, bad requests ---------- */

static void idempotent_and_validated(void **state)
{
    (void)state;
    fleet("ci", "match", NULL, 2, 3, 0);
    json_t *a = NULL, *b = NULL;
    char code[64];
    const char *req = "{\"service\":\"match\",\"payload\":{\"match\":\"m-1\",\"players\":[\"ann\"]},"
                      "\"idempotency_key\":\"m-1\"}";
    assert_int_equal(alloc("ci", req, &a, code), 201);
    assert_string_equal(ct_str(a, "state"), "pending");
    assert_string_equal(ct_str(a, "service"), "match");
    assert_string_equal(ct_str(a, "address"), !strcmp(ct_str(a, "machine"), "m0") ? "10.0.0.1" : "10.0.0.2");
    assert_true(ct_int(json_object_get(a, "ports"), "game") >= 27000);
    assert_string_equal(ct_str(json_object_get(a, "payload"), "match"), "m-1");
    assert_true(ct_int(a, "confirm_by_ms") - ct_int(a, "created_at_ms") == 10000);
    /* the same request again: the same allocation, marked replayed; the header works too */
    assert_int_equal(alloc("ci", req, &b, code), 200);
    assert_string_equal(ct_str(b, "allocation"), ct_str(a, "allocation"));
    assert_string_equal(ct_str(b, "instance"), ct_str(a, "instance"));
    assert_true(json_is_true(json_object_get(b, "replayed")));
    json_decref(b);
    /* the same key with another body: refused, naming the allocation */
    assert_int_equal(alloc("ci", "{\"service\":\"match\",\"idempotency_key\":\"m-1\"}", &b, code), 409);
    assert_string_equal(code, "idempotency_conflict");
    json_decref(b);
    long long al, fr;
    pool_of("ci", "match", &al, &fr);
    assert_int_equal(al, 1);
    assert_int_equal(fr, 5);

    /* bad requests: a specific error each, nothing written */
    static const struct {
        const char *body, *code, *says;
    } bad[] = {
        {"{\"service\":\"match\",\"mode\":\"any\"}", "bad_field", "mode"},
        {"{\"service\":\"match\",\"strategy\":\"spread\"}", "bad_field", "strategy"},
        {"{\"service\":\"match\",\"players\":-1}", "bad_field", "players"},
        {"{\"service\":\"match\",\"wait_ms\":60001}", "bad_field", "wait_ms"},
        {"{\"service\":\"match\",\"selector\":{\"labels\":{}}}", "bad_field", "labels"},
        {"{\"service\":\"match\",\"selector\":{\"metadata\":{\"map\":\"a b\"}}}", "bad_field", "metadata"},
        {"{\"service\":\"match\",\"idempotency_key\":\"has space\"}", "bad_field", "idempotency_key"},
        {"{\"service\":\"ma tch\"}", "bad_field", "service"},
        {"{\"mode\":\"ready\"}", "bad_field", "service"},
        {"{\"service\":\"match\",\"extra\":1}", "bad_field", "extra"},
        {"{\"service\":\"nosuch\"}", "unknown_service", "nosuch"},
    };
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("ci"), NULL);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *o = NULL;
        long st = alloc("ci", bad[i].body, &o, code);
        assert_int_equal(st, strcmp(bad[i].code, "unknown_service") ? 400 : 404);
        assert_string_equal(code, bad[i].code);
        const char *msg = ct_str(json_object_get(o, "error"), "message");
        if (!strstr(msg, bad[i].says))
            fail_msg("%s: message '%s' does not name %s", bad[i].body, msg, bad[i].says);
        json_decref(o);
    }
    /* a payload over 1024 bytes */
    char big[1400];
    snprintf(big, sizeof big, "{\"service\":\"match\",\"payload\":\"%01100d\"}", 7);
    assert_int_equal(alloc("ci", big, NULL, code), 400);
    assert_string_equal(code, "bad_field");
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("ci"), NULL);
    h_keys_same(&before, &after, __func__);

    json_t *g = get_alloc("ci", ct_str(a, "allocation"));
    assert_string_equal(ct_str(g, "instance"), ct_str(a, "instance"));
    json_decref(g);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "GET", NULL, NULL, code,
                             "/v1/clusters/ci/allocations/a999"), 404);
    assert_string_equal(code, "no_such_allocation");
    /* a viewer reads but cannot allocate */
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "POST", "{\"service\":\"match\"}", NULL, code,
                             "/v1/clusters/ci/allocations"), 403);
    json_decref(a);
}

/* ---------- selectors and strategies ---------- */

static void selectors_and_strategies(void **state)
{
    (void)state;
    fleet("cs", "zone", NULL, 4, 3, 0); /* m0, m2: eu; m1, m3: us */
    events("cs", "[{\"id\":\"st1\",\"type\":\"status\",\"instance\":\"zone-m3-2\",\"machine\":\"m3\","
                 "\"service\":\"zone\",\"players\":3,\"max_players\":16,"
                 "\"status\":\"map=q3dm17 mode=ctf\"}]");
    json_t *o = NULL;
    char code[64];
    assert_int_equal(alloc("cs", "{\"service\":\"zone\",\"selector\":{\"metadata\":{\"map\":\"q3dm17\","
                                 "\"mode\":\"ctf\"}}}", &o, code), 201);
    assert_string_equal(ct_str(o, "instance"), "zone-m3-2");
    json_decref(o);
    assert_int_equal(alloc("cs", "{\"service\":\"zone\",\"selector\":{\"metadata\":{\"map\":\"q3dm17\"}}}",
                           &o, code), 409);
    assert_string_equal(code, "no_capacity");
    const json_t *err = json_object_get(o, "error");
    assert_string_equal(ct_str(json_object_get(json_object_get(err, "selector"), "metadata"), "map"),
                        "q3dm17");
    assert_non_null(strstr(ct_str(err, "message"), "zone"));
    json_decref(o);

    /* packed fills m3 (it has one allocated) before the others */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(alloc("cs", "{\"service\":\"zone\"}", &o, code), 201);
        assert_string_equal(ct_str(o, "machine"), "m3");
        json_decref(o);
    }
    /* machine labels: only eu machines */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(alloc("cs", "{\"service\":\"zone\",\"selector\":{\"machine_labels\":"
                                     "{\"zone\":\"eu\"}}}", &o, code), 201);
        const char *m = ct_str(o, "machine");
        assert_true(!strcmp(m, "m0") || !strcmp(m, "m2"));
        json_decref(o);
    }
    /* packed put all three on one eu machine (m2: ties go to the last name); distributed
     * now takes the machines with the fewest allocated first: m0 and m1 (0 each), one
     * each, before either gets a second */
    char first[8];
    assert_int_equal(alloc("cs", "{\"service\":\"zone\",\"strategy\":\"distributed\"}", &o, code), 201);
    snprintf(first, sizeof first, "%s", ct_str(o, "machine"));
    assert_true(!strcmp(first, "m0") || !strcmp(first, "m1"));
    json_decref(o);
    assert_int_equal(alloc("cs", "{\"service\":\"zone\",\"strategy\":\"distributed\"}", &o, code), 201);
    assert_string_equal(ct_str(o, "machine"), strcmp(first, "m0") ? "m0" : "m1");
    json_decref(o);
    /* an expired machine lease: its instances are not handed out */
    assert_int_equal(h_redis_route(&redis, "sd:{cs}:machine:m1"), 0);
    redisReply *r = h_redis(&redis, "HSET sd:{cs}:machine:m1 expires_at_ms 1");
    if (r)
        freeReplyObject(r);
    for (int i = 0; i < 3; i++) {
        if (alloc("cs", "{\"service\":\"zone\",\"strategy\":\"distributed\"}", &o, code) == 201)
            assert_string_not_equal(ct_str(o, "machine"), "m1");
        json_decref(o);
    }
}

/* join: a running instance with N free player slots; the slots are reserved at once. */
static void join_reserves_player_slots(void **state)
{
    (void)state;
    fleet("cj", "realm", NULL, 1, 2, 0);
    events("cj", "[{\"id\":\"j1\",\"type\":\"status\",\"instance\":\"realm-m0-0\",\"machine\":\"m0\","
                 "\"service\":\"realm\",\"players\":10,\"max_players\":20},"
                 "{\"id\":\"j2\",\"type\":\"status\",\"instance\":\"realm-m0-1\",\"machine\":\"m0\","
                 "\"service\":\"realm\",\"players\":2,\"max_players\":20}]");
    json_t *o = NULL;
    char code[64];
    /* packed: the fullest instance that still has room */
    assert_int_equal(alloc("cj", "{\"service\":\"realm\",\"mode\":\"join\",\"players\":6}", &o, code), 201);
    assert_string_equal(ct_str(o, "instance"), "realm-m0-0");
    assert_int_equal(ct_int(o, "players"), 6);
    json_decref(o);
    /* realm-m0-0 has 4 left: 6 more go to realm-m0-1, then 12 fit nowhere */
    assert_int_equal(alloc("cj", "{\"service\":\"realm\",\"mode\":\"join\",\"players\":6}", &o, code), 201);
    assert_string_equal(ct_str(o, "instance"), "realm-m0-1");
    json_decref(o);
    assert_int_equal(alloc("cj", "{\"service\":\"realm\",\"mode\":\"join\",\"players\":13}", &o, code), 409);
    assert_string_equal(code, "no_capacity");
    json_decref(o);
    /* both joined instances are allocated: no ready-mode allocation is left */
    assert_int_equal(alloc("cj", "{\"service\":\"realm\"}", &o, code), 409);
    json_decref(o);
}

/* ---------- how allocations end ---------- */

static const char *open_alloc(const char *c, const char *svc, char *id, char *inst)
{
    json_t *o = NULL;
    char body[128];
    snprintf(body, sizeof body, "{\"service\":\"%s\"}", svc);
    assert_int_equal(alloc(c, body, &o, NULL), 201);
    strcpy(id, ct_str(o, "allocation"));
    strcpy(inst, ct_str(o, "instance"));
    json_decref(o);
    return id;
}

/* Posts one event `type` of instance inst (service match, its machine read from the name
 * match-<m>-<i>) about allocation id: event id "<type>.<id>", more fields in extra
 * (",\"k\":v..." or ""). */
static void match_event(const char *c, const char *type, const char *id, const char *inst,
                        const char *extra)
{
    char m[8], ev[512];
    assert_int_equal(sscanf(inst, "match-%7[^-]", m), 1);
    snprintf(ev, sizeof ev, "[{\"id\":\"%s.%s\",\"type\":\"%s\",\"instance\":\"%s\","
             "\"machine\":\"%s\",\"service\":\"match\"%s}]", type, id, type, inst, m, extra);
    events(c, ev);
}

/* Allocation id of cluster c is in state st, with reason (NULL: not checked). */
static void expect_alloc(const char *c, const char *id, const char *st, const char *reason)
{
    json_t *g = get_alloc(c, id);
    assert_string_equal(ct_str(g, "state"), st);
    if (reason)
        assert_string_equal(ct_str(g, "reason"), reason);
    json_decref(g);
}

static void allocation_ends(void **state)
{
    (void)state;
    fleet("ce", "match", "\"confirm_timeout_ms\":600", 2, 2, 0);
    char id[64], inst[64];
    long long al, fr;
    json_t *g;

    /* confirmed by the game, then released by it: active, then released, instance free */
    open_alloc("ce", "match", id, inst);
    char extra[128];
    snprintf(extra, sizeof extra, ",\"allocation\":\"%s\"", id);
    match_event("ce", "confirmed", id, inst, extra);
    expect_alloc("ce", id, "active", NULL);
    h_sleep_ms(1500); /* past the 600 ms confirm deadline: a confirmed one does not expire */
    expect_alloc("ce", id, "active", NULL);
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(al, 1);
    assert_int_equal(fr, 3);
    /* a released event of another instance naming this allocation ends nothing */
    char other[64];
    snprintf(other, sizeof other, "%s", inst);
    other[strlen(other) - 1] = other[strlen(other) - 1] == '0' ? '1' : '0';
    match_event("ce", "released", "other", other, extra);
    expect_alloc("ce", id, "active", NULL);
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(al, 1);
    assert_int_equal(fr, 3);
    match_event("ce", "released", id, inst, "");
    expect_alloc("ce", id, "released", "game");
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(al, 0);
    assert_int_equal(fr, 4);

    /* never confirmed: expired by the sweep, the instance free again */
    open_alloc("ce", "match", id, inst);
    int64_t t0 = h_now_ms();
    for (;;) {
        g = get_alloc("ce", id);
        int done = !strcmp(ct_str(g, "state"), "expired");
        json_decref(g);
        if (done)
            break;
        assert_true(h_now_ms() - t0 < 4000);
        h_sleep_ms(50);
    }
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(fr, 4);

    /* DELETE: released (api), free again; a second DELETE changes nothing */
    open_alloc("ce", "match", id, inst);
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "DELETE", NULL, &o, NULL,
                             "/v1/clusters/ce/allocations/%s", id), 200);
    assert_string_equal(ct_str(o, "state"), "released");
    assert_string_equal(ct_str(o, "reason"), "api");
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "DELETE", NULL, &o, NULL,
                             "/v1/clusters/ce/allocations/%s", id), 200);
    assert_true(json_is_false(json_object_get(o, "changed")));
    json_decref(o);
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(fr, 4);

    /* a crash: allocation_lost with the stop's reason; the instance leaves the pool */
    open_alloc("ce", "match", id, inst);
    match_event("ce", "stopped", id, inst, ",\"reason\":\"killed\",\"signal\":9");
    expect_alloc("ce", id, "allocation_lost", "killed(signal 9)");
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(al, 0);
    assert_int_equal(fr, 3);

    /* a clean exit (code 0) while allocated ends the session: released */
    open_alloc("ce", "match", id, inst);
    match_event("ce", "stopped", id, inst, ",\"reason\":\"exited\",\"code\":0");
    expect_alloc("ce", id, "released", "exited(code 0)");

    /* machine lost: allocation_lost, machine_lost */
    open_alloc("ce", "match", id, inst);
    match_event("ce", "stopped", id, inst, ",\"reason\":\"machine_lost\"");
    expect_alloc("ce", id, "allocation_lost", "machine_lost");
    pool_of("ce", "match", &al, &fr);
    assert_int_equal(al, 0);
    assert_int_equal(fr, 1);

    /* the list pages through all six, oldest first */
    char after[64] = "";
    int n = 0;
    for (int page = 0; page < 10; page++) {
        assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                                 "/v1/clusters/ce/allocations?limit=2&after=%s", after), 200);
        json_t *list = json_object_get(o, "allocations");
        assert_true(json_array_size(list) <= 2);
        n += (int)json_array_size(list);
        const json_t *next = json_object_get(o, "next");
        if (json_is_null(next)) {
            json_decref(o);
            break;
        }
        snprintf(after, sizeof after, "%s", json_string_value(next));
        json_decref(o);
    }
    assert_int_equal(n, 6);
}

/* ---------- wait_ms and the machine's document ---------- */

typedef struct {
    long status;
    char instance[64];
    int64_t took;
} waited_t;

static void *wait_one(void *arg)
{
    waited_t *w = arg;
    json_t *o = NULL;
    int64_t t0 = h_now_ms();
    w->status = alloc("cw", "{\"service\":\"match\",\"wait_ms\":5000}", &o, NULL);
    w->took = h_now_ms() - t0;
    snprintf(w->instance, sizeof w->instance, "%s", ct_str(o, "instance"));
    json_decref(o);
    return NULL;
}

static void wait_for_capacity_and_document(void **state)
{
    (void)state;
    fleet("cw", "match", NULL, 1, 1, 0);
    json_t *o = NULL;
    char code[64];
    assert_int_equal(alloc("cw", "{\"service\":\"match\",\"payload\":{\"match\":\"w1\"}}", &o, code), 201);
    char id[64];
    snprintf(id, sizeof id, "%s", ct_str(o, "allocation"));
    json_decref(o);
    /* the machine's document lists the open allocation with its payload */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/cw/machines/m0/assignments"), 200);
    json_t *al = json_object_get(o, "allocations");
    assert_int_equal(json_array_size(al), 1);
    assert_string_equal(ct_str(json_array_get(al, 0), "allocation"), id);
    assert_string_equal(ct_str(json_array_get(al, 0), "instance"), "match-m0-0");
    assert_string_equal(ct_str(json_object_get(json_array_get(al, 0), "payload"), "match"), "w1");
    long long v1 = ct_int(o, "version");
    json_decref(o);

    /* no capacity: wait_ms parks; a new instance ready 300 ms later answers it */
    waited_t w = {0};
    pthread_t t;
    pthread_create(&t, NULL, wait_one, &w);
    h_sleep_ms(300);
    events("cw", "[{\"id\":\"s.new\",\"type\":\"started\",\"instance\":\"match-m0-9\",\"machine\":\"m0\","
                 "\"service\":\"match\",\"pid\":999,\"slot\":9},"
                 "{\"id\":\"r.new\",\"type\":\"ready\",\"instance\":\"match-m0-9\",\"machine\":\"m0\","
                 "\"service\":\"match\"}]");
    pthread_join(t, NULL);
    assert_int_equal(w.status, 201);
    assert_string_equal(w.instance, "match-m0-9");
    assert_true(w.took >= 250 && w.took < 3000);
    /* and without capacity the wait ends in no_capacity */
    int64_t t0 = h_now_ms();
    assert_int_equal(alloc("cw", "{\"service\":\"match\",\"wait_ms\":400}", &o, code), 409);
    assert_string_equal(code, "no_capacity");
    assert_true(h_now_ms() - t0 >= 380);
    json_decref(o);

    /* ending the first one changes the document's version and empties its entry */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "DELETE", NULL, NULL, NULL,
                             "/v1/clusters/cw/allocations/%s", id), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/cw/machines/m0/assignments"), 200);
    assert_true(ct_int(o, "version") > v1);
    al = json_object_get(o, "allocations");
    assert_int_equal(json_array_size(al), 1); /* match-m0-9's */
    assert_string_equal(ct_str(json_array_get(al, 0), "instance"), "match-m0-9");
    json_decref(o);
}

/* GET .../pool-demand: the counter every allocation and every miss moves, long-polled by
 * the primary; a parked request answers when an allocation happens, or when its wait
 * ends unchanged. */
typedef struct {
    long long since;
    int wait;
    long status;
    long long version;
    int64_t took;
} demand_t;

static void *demand_poll(void *arg)
{
    demand_t *d = arg;
    json_t *o = NULL;
    int64_t t0 = h_now_ms();
    d->status = ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                        "/v1/clusters/cd/pool-demand?version=%lld&wait=%d", d->since, d->wait);
    d->took = h_now_ms() - t0;
    d->version = o ? ct_int(o, "version") : -1;
    json_decref(o);
    return NULL;
}

static void pool_demand_long_poll(void **state)
{
    (void)state;
    fleet("cd", "match", NULL, 1, 2, 0);
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/cd/pool-demand"), 200);
    long long v0 = ct_int(o, "version");
    json_decref(o);
    assert_int_equal(v0, 0);
    /* parked at v0: an allocation 300 ms later answers it with the next value */
    demand_t d = {.since = v0, .wait = 5000};
    pthread_t t;
    pthread_create(&t, NULL, demand_poll, &d);
    h_sleep_ms(300);
    char code[64];
    assert_int_equal(alloc("cd", "{\"service\":\"match\"}", &o, code), 201);
    json_decref(o);
    pthread_join(t, NULL);
    assert_int_equal(d.status, 200);
    assert_int_equal(d.version, v0 + 1);
    assert_true(d.took >= 250 && d.took < 3000);
    /* a miss moves it too (demand for a pool with nothing free) */
    assert_int_equal(alloc("cd", "{\"service\":\"match\",\"selector\":{\"metadata\":{\"map\":\"none\"}}}",
                           &o, code), 409);
    json_decref(o);
    /* an older version answers at once; the current one waits out its wait */
    d = (demand_t){.since = v0, .wait = 5000};
    demand_poll(&d);
    assert_int_equal(d.version, v0 + 2);
    assert_true(d.took < 1000);
    d = (demand_t){.since = v0 + 2, .wait = 400};
    demand_poll(&d);
    assert_int_equal(d.status, 200);
    assert_int_equal(d.version, v0 + 2);
    assert_true(d.took >= 380);
    /* bad arguments */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, NULL, code,
                             "/v1/clusters/cd/pool-demand?wait=61000&version=1"), 400);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, NULL, code,
                             "/v1/clusters/cd/pool-demand?version=x"), 400);
}

/* The pool spec is validated: bad shapes are refused naming the field. */
static void pool_spec_validated(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *says;
    } bad[] = {
        {"{\"command\":\"/bin/true\",\"pool\":{}}", "pool.buffer"},
        {"{\"command\":\"/bin/true\",\"pool\":{\"buffer\":\"100%\"}}", "pool.buffer"},
        {"{\"command\":\"/bin/true\",\"pool\":{\"buffer\":\"5 %\"}}", "pool.buffer"},
        {"{\"command\":\"/bin/true\",\"pool\":{\"buffer\":-1}}", "pool.buffer"},
        {"{\"command\":\"/bin/true\",\"pool\":{\"buffer\":1,\"min\":5,\"max\":2}}", "pool.min"},
        {"{\"command\":\"/bin/true\",\"pool\":{\"buffer\":1,\"size\":2}}", "pool.size"},
        {"{\"command\":\"/bin/true\",\"count\":1,\"on_release\":\"keep\"}", "on_release"},
        {"{\"command\":\"/bin/true\",\"count\":1,\"confirm_timeout_ms\":5}", "confirm_timeout_ms"},
        {"{\"command\":\"/bin/true\"}", "count"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *o = NULL;
        char code[64];
        assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", bad[i].spec, &o, code,
                                 "/v1/clusters/cp/services/x"), 400);
        assert_string_equal(code, "bad_spec");
        const char *msg = ct_str(json_object_get(o, "error"), "message");
        if (!strstr(msg, bad[i].says))
            fail_msg("%s: '%s' does not name %s", bad[i].spec, msg, bad[i].says);
        json_decref(o);
    }
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"command\":\"/bin/true\",\"pool\":{\"buffer\":\"25%\",\"min\":1},"
                             "\"on_release\":\"restart\"}",
                             NULL, NULL, "/v1/clusters/cp/services/x"), 200);
}

/* ---------- group commit ---------- */

/* The value of series in sd's /metrics (0 when absent; the test fails when it cannot be
 * read). */
static long long metric_of(const char *series)
{
    long long v = h_metric(sd.url, series);
    assert_true(v >= 0);
    return v;
}

#define CALLS "serverdir_allocation_calls_total"
#define CALL_REQS "serverdir_allocation_call_requests_total"
#define GRP_CONFIRM "\"confirm_timeout_ms\":120000" /* nothing expires during the test */

/* One allocation request of a burst and its answer. Thread-safe: the error code and the
 * other fields are read from the body (h_err_code's buffer is shared). */
typedef struct {
    const char *cluster;
    char body[256];
    char key[64]; /* the Idempotency-Key header, "" for none */
    int kind, group, variant;
    long status;
    int replayed;
    char code[64], allocation[64], instance[64], err_alloc[64], err_service[64];
    int64_t took, end;
} greq_t;

static void grp_send(greq_t *q)
{
    char url[512], hdr[128];
    snprintf(url, sizeof url, "%s/v1/clusters/%s/allocations", sd.url, q->cluster);
    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", q->key);
    const char *const hl[] = {hdr, NULL};
    h_resp_t r;
    int64_t t0 = h_now_ms();
    int rc = h_http("POST", url, H_TOK_GAME, NULL, q->body, strlen(q->body), q->key[0] ? hl : NULL,
                    &r);
    q->end = h_now_ms();
    q->took = q->end - t0;
    q->status = rc ? -1 : r.status;
    json_t *o = h_resp_json(&r);
    const json_t *e = json_object_get(o, "error");
    snprintf(q->code, sizeof q->code, "%s", ct_str(e, "code"));
    snprintf(q->allocation, sizeof q->allocation, "%s", ct_str(o, "allocation"));
    snprintf(q->instance, sizeof q->instance, "%s", ct_str(o, "instance"));
    snprintf(q->err_alloc, sizeof q->err_alloc, "%s", ct_str(e, "allocation"));
    snprintf(q->err_service, sizeof q->err_service, "%s", ct_str(e, "service"));
    q->replayed = json_is_true(json_object_get(o, "replayed"));
    json_decref(o);
    h_resp_free(&r);
}

#define GRP_THREADS 64
#define GRP_PER 3

/* A burst: n threads released together by a barrier, each sending its `per` requests one
 * after another; finished is set when a thread's last answer is in. */
typedef struct {
    pthread_barrier_t *go;
    greq_t *q;
    int per;
    atomic_int finished;
} gthread_t;

typedef struct {
    pthread_barrier_t go;
    pthread_t th[GRP_THREADS];
    gthread_t t[GRP_THREADS];
    int n;
} burst_t;

static void *grp_thread(void *arg)
{
    gthread_t *t = arg;
    pthread_barrier_wait(t->go);
    for (int i = 0; i < t->per; i++)
        grp_send(&t->q[i]);
    atomic_store(&t->finished, 1);
    return NULL;
}

static void burst_start(burst_t *b, greq_t *q, int n, int per)
{
    assert_true(n > 0 && n <= GRP_THREADS);
    b->n = n;
    assert_int_equal(pthread_barrier_init(&b->go, NULL, (unsigned)n), 0);
    for (int i = 0; i < n; i++) {
        b->t[i].go = &b->go;
        b->t[i].q = q + i * per;
        b->t[i].per = per;
        atomic_init(&b->t[i].finished, 0);
        assert_int_equal(pthread_create(&b->th[i], NULL, grp_thread, &b->t[i]), 0);
    }
}

static void burst_join(burst_t *b)
{
    for (int i = 0; i < b->n; i++)
        pthread_join(b->th[i], NULL);
    pthread_barrier_destroy(&b->go);
}

static int strp_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The n strings of v (reordered) are all different. */
static void all_distinct(const char **v, int n, const char *what)
{
    qsort(v, (size_t)n, sizeof *v, strp_cmp);
    for (int i = 1; i < n; i++)
        if (!strcmp(v[i - 1], v[i]))
            fail_msg("%s '%s' handed twice", what, v[i]);
}

static void expect_answer(const greq_t *q, long status, const char *code)
{
    if (q->status != status || strcmp(q->code, code))
        fail_msg("%s (key '%s'): %ld '%s', expected %ld '%s'", q->body, q->key, q->status,
                 q->code, status, code);
}

enum { K_VALID, K_UNKNOWN, K_EMPTY, K_PAIR, K_REPLAY, K_CONFLICT, K_TRI, K_WAIT, K_SHORT };

#define MIX_ROUNDS 5
#define MIX_N 33 /* requests of a round: 12 valid, 4 unknown, 4 empty, 4 pairs (8), 1 replay,
                    1 conflict, 1 triple (3) */
#define MIX_ALLOCS 18 /* allocations a round makes: 12 valid, 4 pairs, the first use of
                         its key, the triple's */

/* Names handed out, copied (a burst's requests are filled again the next round). */
#define SEEN_MAX (GRP_THREADS * GRP_PER + MIX_ROUNDS * MIX_ALLOCS)
static char seen_buf[SEEN_MAX][64];
static const char *seen[SEEN_MAX];

static void note_seen(int *n, const char *name)
{
    assert_true(*n < SEEN_MAX);
    snprintf(seen_buf[*n], sizeof seen_buf[*n], "%s", name);
    seen[*n] = seen_buf[*n];
    (*n)++;
}

/* Requests of many kinds queued together are carried by shared alloc_create.lua calls
 * (group commit, serverdir/cluster/api_alloc.c) and each is answered from its own part:
 * a burst of allocations gets distinct instances in fewer calls than requests; a mixed
 * burst (valid, unknown service, no capacity, the same key twice, a key reused with
 * another body) answers each request what it would alone; a request with wait_ms in a
 * burst waits alone and gets the instance that becomes ready. */
static void grouped_requests_answered_each_their_own(void **state)
{
    (void)state;
    static greq_t q1[GRP_THREADS * GRP_PER];
    static burst_t b;
    int nseen = 0;
    long long al, fr;

    /* 1. 64 threads x 3 allocations released together against 200 instances: each gets
     * its own instance; the script calls carried all 192, in fewer calls. */
    fleet("grp", "burst", GRP_CONFIRM, 8, 25, 0);
    long long calls0 = metric_of(CALLS), reqs0 = metric_of(CALL_REQS);
    for (int i = 0; i < GRP_THREADS * GRP_PER; i++) {
        q1[i] = (greq_t){.cluster = "grp"};
        snprintf(q1[i].body, sizeof q1[i].body, "{\"service\":\"burst\",\"strategy\":\"%s\"}",
                 i % 2 ? "distributed" : "packed");
    }
    burst_start(&b, q1, GRP_THREADS, GRP_PER);
    burst_join(&b);
    const char *ids[GRP_THREADS * GRP_PER];
    for (int i = 0; i < GRP_THREADS * GRP_PER; i++) {
        expect_answer(&q1[i], 201, "");
        assert_false(q1[i].replayed);
        assert_true(q1[i].instance[0] && q1[i].allocation[0]);
        note_seen(&nseen, q1[i].instance);
        ids[i] = q1[i].allocation;
    }
    all_distinct(seen, nseen, "instance");
    all_distinct(ids, GRP_THREADS * GRP_PER, "allocation");
    long long calls = metric_of(CALLS) - calls0, reqs = metric_of(CALL_REQS) - reqs0;
    assert_int_equal(reqs, GRP_THREADS * GRP_PER);
    if (calls < 1 || calls >= reqs)
        fail_msg("%lld script calls carried %lld requests: none were grouped", calls, reqs);
    pool_of("grp", "burst", &al, &fr);
    assert_int_equal(al, GRP_THREADS * GRP_PER);
    assert_int_equal(fr, 8 * 25 - GRP_THREADS * GRP_PER);

    /* 2. Mixed bursts, several rounds: every request gets its own answer. */
    fleet("grp-mix", "mix", GRP_CONFIRM, 4, 30, 0);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/true\",\"count\":1}",
                             NULL, NULL, "/v1/clusters/grp-mix/services/empty"), 200);
    reqs0 = metric_of(CALL_REQS);
    static greq_t q2[MIX_N];
    nseen = 0;
    for (int r = 0; r < MIX_ROUNDS; r++) {
        /* the first use of key pre-<r>, before the burst */
        char pre_body[128], pre_id[64];
        json_t *o = NULL;
        snprintf(pre_body, sizeof pre_body,
                 "{\"service\":\"mix\",\"payload\":{\"pre\":%d},\"idempotency_key\":\"pre-%d\"}",
                 r, r);
        assert_int_equal(alloc("grp-mix", pre_body, &o, NULL), 201);
        snprintf(pre_id, sizeof pre_id, "%s", ct_str(o, "allocation"));
        json_decref(o);

        int n = 0;
        for (int k = 0; k < 12; k++) {
            q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_VALID};
            snprintf(q2[n++].body, sizeof q2[0].body,
                     "{\"service\":\"mix\",\"payload\":{\"v\":%d}}", k);
            if (k < 4) {
                q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_UNKNOWN};
                snprintf(q2[n++].body, sizeof q2[0].body, "{\"service\":\"nosuch%d%d\"}", r, k);
                q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_EMPTY};
                snprintf(q2[n++].body, sizeof q2[0].body, "{\"service\":\"empty\"}");
                for (int two = 0; two < 2; two++) { /* the same key and body twice */
                    q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_PAIR, .group = k};
                    snprintf(q2[n].key, sizeof q2[0].key, "pair-%d-%d", r, k);
                    snprintf(q2[n++].body, sizeof q2[0].body,
                             "{\"service\":\"mix\",\"payload\":{\"pair\":%d}}", k);
                }
            }
        }
        /* pre-<r> again: the same request (by the header) is replayed, another refused */
        q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_REPLAY};
        snprintf(q2[n].key, sizeof q2[0].key, "pre-%d", r);
        snprintf(q2[n++].body, sizeof q2[0].body,
                 "{\"service\":\"mix\",\"payload\":{\"pre\":%d}}", r);
        q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_CONFLICT};
        snprintf(q2[n].key, sizeof q2[0].key, "pre-%d", r);
        snprintf(q2[n++].body, sizeof q2[0].body, "{\"service\":\"mix\",\"payload\":{\"pre\":-1}}");
        /* a fresh key three times in the burst, twice with body a and once with b: which
         * comes first is timing; the others answer after it */
        for (int i = 0; i < 3; i++) {
            q2[n] = (greq_t){.cluster = "grp-mix", .kind = K_TRI, .variant = i == 1};
            snprintf(q2[n++].body, sizeof q2[0].body,
                     "{\"service\":\"mix\",\"payload\":{\"tri\":\"%s\"},"
                     "\"idempotency_key\":\"tri-%d\"}",
                     i == 1 ? "b" : "a", r);
        }
        assert_int_equal(n, MIX_N);
        burst_start(&b, q2, MIX_N, 1);
        burst_join(&b);

        const greq_t *pair[4][2] = {{0}}, *tri_first = NULL;
        char want[64];
        for (int i = 0; i < MIX_N; i++) {
            const greq_t *q = &q2[i];
            switch (q->kind) {
            case K_VALID:
                expect_answer(q, 201, "");
                assert_false(q->replayed);
                note_seen(&nseen, q->instance);
                break;
            case K_UNKNOWN:
                expect_answer(q, 404, "unknown_service");
                assert_int_equal(sscanf(q->body, "{\"service\":\"%63[^\"]", want), 1);
                assert_string_equal(q->err_service, want);
                break;
            case K_EMPTY:
                expect_answer(q, 409, "no_capacity");
                assert_string_equal(q->err_service, "empty");
                break;
            case K_PAIR:
                pair[q->group][pair[q->group][0] ? 1 : 0] = q;
                break;
            case K_REPLAY:
                expect_answer(q, 200, "");
                assert_true(q->replayed);
                assert_string_equal(q->allocation, pre_id);
                break;
            case K_CONFLICT:
                expect_answer(q, 409, "idempotency_conflict");
                assert_string_equal(q->err_alloc, pre_id);
                break;
            case K_TRI:
                if (q->status == 201) {
                    assert_null(tri_first);
                    tri_first = q;
                }
                break;
            }
        }
        for (int k = 0; k < 4; k++) {
            const greq_t *c = pair[k][0]->status == 201 ? pair[k][0] : pair[k][1];
            const greq_t *p = c == pair[k][0] ? pair[k][1] : pair[k][0];
            expect_answer(c, 201, "");
            assert_false(c->replayed);
            expect_answer(p, 200, "");
            assert_true(p->replayed);
            assert_string_equal(p->allocation, c->allocation);
            assert_string_equal(p->instance, c->instance);
            note_seen(&nseen, c->instance);
        }
        if (!tri_first)
            fail_msg("round %d: no request of key tri-%d was created", r, r);
        assert_false(tri_first->replayed);
        note_seen(&nseen, tri_first->instance);
        for (int i = 0; i < MIX_N; i++) {
            const greq_t *q = &q2[i];
            if (q->kind != K_TRI || q == tri_first)
                continue;
            if (q->variant == tri_first->variant) {
                expect_answer(q, 200, "");
                assert_true(q->replayed);
                assert_string_equal(q->allocation, tri_first->allocation);
            } else {
                expect_answer(q, 409, "idempotency_conflict");
                assert_string_equal(q->err_alloc, tri_first->allocation);
            }
        }
        /* the first use of pre-<r> is listed here too, all of them distinct */
        json_t *g = get_alloc("grp-mix", pre_id);
        note_seen(&nseen, ct_str(g, "instance"));
        json_decref(g);
    }
    assert_int_equal(nseen, MIX_ROUNDS * MIX_ALLOCS);
    all_distinct(seen, nseen, "instance");
    /* every request (the bursts' and the first uses of pre-<r>) rode exactly one call;
     * the pools hold exactly what was answered */
    assert_int_equal(metric_of(CALL_REQS) - reqs0, MIX_ROUNDS * (MIX_N + 1));
    pool_of("grp-mix", "mix", &al, &fr);
    assert_int_equal(al, MIX_ROUNDS * MIX_ALLOCS);
    assert_int_equal(fr, 4 * 30 - MIX_ROUNDS * MIX_ALLOCS);
    pool_of("grp-mix", "empty", &al, &fr);
    assert_int_equal(al, 0);
    assert_int_equal(fr, 0);

    /* 3. A request with wait_ms in a burst: the others answered, it waits alone; the
     * instance made ready then is its own. */
    fleet("grp-wait", "now", GRP_CONFIRM, 1, 8, 0);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/true\",\"count\":1}",
                             NULL, NULL, "/v1/clusters/grp-wait/services/late"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/true\",\"count\":1}",
                             NULL, NULL, "/v1/clusters/grp-wait/services/empty"), 200);
    int wait_ms = h_valgrind() || h_sanitized() ? 10000 : 3000; /* an upper bound only */
    long long waiting0 = metric_of("serverdir_allocations_waiting");
    static greq_t q3[10];
    q3[0] = (greq_t){.cluster = "grp-wait", .kind = K_WAIT};
    snprintf(q3[0].body, sizeof q3[0].body, "{\"service\":\"late\",\"wait_ms\":%d}", wait_ms);
    q3[1] = (greq_t){.cluster = "grp-wait", .kind = K_SHORT};
    snprintf(q3[1].body, sizeof q3[1].body, "{\"service\":\"empty\",\"wait_ms\":300}");
    for (int i = 2; i < 10; i++) {
        q3[i] = (greq_t){.cluster = "grp-wait", .kind = i < 8 ? K_VALID : K_EMPTY};
        snprintf(q3[i].body, sizeof q3[i].body, "{\"service\":\"%s\"}", i < 8 ? "now" : "late");
    }
    burst_start(&b, q3, 10, 1);
    /* bounded: every other request answered (the no-wait ones on late found nothing) and
     * the waiter parked */
    int64_t until = h_now_ms() + 10000;
    for (;;) {
        int others = 1;
        for (int i = 1; i < 10; i++)
            others &= atomic_load(&b.t[i].finished);
        if (others && metric_of("serverdir_allocations_waiting") > waiting0)
            break;
        if (atomic_load(&b.t[0].finished))
            fail_msg("the waiter was answered before an instance was ready: %ld '%s'",
                     q3[0].status, q3[0].code);
        assert_true(h_now_ms() < until);
        h_sleep_ms(10);
    }
    int64_t ready_at = h_now_ms();
    events("grp-wait", "[{\"id\":\"s.late\",\"type\":\"started\",\"instance\":\"late-m0-0\","
                       "\"machine\":\"m0\",\"service\":\"late\",\"pid\":777,\"slot\":50},"
                       "{\"id\":\"r.late\",\"type\":\"ready\",\"instance\":\"late-m0-0\","
                       "\"machine\":\"m0\",\"service\":\"late\"}]");
    burst_join(&b);
    expect_answer(&q3[0], 201, "");
    assert_string_equal(q3[0].instance, "late-m0-0");
    assert_true(q3[0].end >= ready_at);
    assert_true(q3[0].took < wait_ms);
    expect_answer(&q3[1], 409, "no_capacity");
    assert_true(q3[1].took >= 280);
    nseen = 0;
    for (int i = 2; i < 10; i++) {
        if (q3[i].kind == K_VALID) {
            expect_answer(&q3[i], 201, "");
            note_seen(&nseen, q3[i].instance);
        } else {
            expect_answer(&q3[i], 409, "no_capacity");
            assert_string_equal(q3[i].err_service, "late");
        }
    }
    all_distinct(seen, nseen, "instance");
    expect_alloc("grp-wait", q3[0].allocation, "pending", NULL);
    pool_of("grp-wait", "late", &al, &fr);
    assert_int_equal(al, 1);
    assert_int_equal(fr, 0);
    pool_of("grp-wait", "now", &al, &fr);
    assert_int_equal(al, 6);
    assert_int_equal(fr, 2);
}

/* A request whose search reads a record per candidate (metadata, free player slots, join
 * mode) gets a call of its own (api_alloc.c, job_heavy): 32 of those at up to 64 x 64
 * reads each would hold Redis for a long time in one call. Sent together with plain ones,
 * the calls carry the plain ones in groups and each heavy one alone. */
static void heavy_requests_get_a_call_each(void **state)
{
    (void)state;
    enum { HEAVY = 24, PLAIN = 40 };
    static greq_t q[HEAVY + PLAIN];
    static burst_t b;
    fleet("grp-heavy", "h", GRP_CONFIRM, 4, 20, 0);
    long long calls0 = metric_of(CALLS), reqs0 = metric_of(CALL_REQS);
    for (int i = 0; i < HEAVY + PLAIN; i++) {
        q[i] = (greq_t){.cluster = "grp-heavy"};
        if (i % 8 < 3) /* heavy, in three kinds, spread among the plain ones */
            snprintf(q[i].body, sizeof q[i].body, "%s",
                     i % 8 == 0 ? "{\"service\":\"h\",\"selector\":{\"metadata\":{\"map\":\"nowhere\"}}}"
                     : i % 8 == 1 ? "{\"service\":\"h\",\"players\":4}"
                                  : "{\"service\":\"h\",\"mode\":\"join\",\"players\":2}");
        else
            snprintf(q[i].body, sizeof q[i].body, "{\"service\":\"h\"}");
    }
    burst_start(&b, q, HEAVY + PLAIN, 1);
    burst_join(&b);
    int heavy = 0;
    for (int i = 0; i < HEAVY + PLAIN; i++) {
        if (i % 8 < 3) {
            heavy++;
            expect_answer(&q[i], 409, "no_capacity"); /* no instance reports those */
        } else {
            expect_answer(&q[i], 201, "");
        }
    }
    assert_int_equal(heavy, HEAVY);
    long long calls = metric_of(CALLS) - calls0, reqs = metric_of(CALL_REQS) - reqs0;
    assert_int_equal(reqs, HEAVY + PLAIN);
    /* every heavy request alone, the plain ones in at least one more call */
    if (calls < HEAVY + 1)
        fail_msg("%lld script calls carried %d heavy and %d plain requests: heavy ones were "
                 "grouped", calls, HEAVY, PLAIN);
}

/* ---------- an HTTP thread never waits on Redis for a grouped request ---------- */

typedef struct {
    const char *url, *token, *path, *body;
    long status;
    atomic_int done;
} held_t;

static void *held_post(void *p)
{
    held_t *h = p;
    h->status = ct_call(h->url, h->token, "POST", h->body, NULL, NULL, "%s", h->path);
    atomic_store(&h->done, 1);
    return NULL;
}

/* A serverdir with one HTTP thread: an allocation and an event batch whose script calls
 * wait (Redis paused for writes) are each handed to their group's worker, and the thread
 * answers /healthz meanwhile. A lone request used to make its call on its HTTP thread,
 * and every other connection of the thread waited out the call behind it. */
static void grouped_calls_never_hold_their_http_thread(void **state)
{
    (void)state;
    fleet("ho", "zone", NULL, 1, 4, 0);
    static const char *const extra[] = {"--http-threads", "1", "--threads", "1", NULL};
    h_sd_opts_t o = {.extra = extra};
    h_serverdir_t one;
    assert_int_equal(h_sd_start(&one, &redis, &o), 0);
    held_t reqs[2] = {
        {.url = one.url, .token = H_TOK_GAME, .path = "/v1/clusters/ho/allocations",
         .body = "{\"service\":\"zone\"}"},
        {.url = one.url, .token = H_TOK_BB, .path = "/v1/clusters/ho/events",
         .body = "{\"events\":[{\"id\":\"x.ho.1\",\"type\":\"stopped\",\"instance\":\"zone-m0-3\","
                 "\"machine\":\"m0\",\"service\":\"zone\",\"reason\":\"exited\",\"code\":0}]}"},
    };
    /* each path once before the pause: a copy's first request for a cluster records the
     * cluster (a write of its own, on a handler thread) */
    assert_int_equal(ct_call(one.url, H_TOK_GAME, "POST", reqs[0].body, NULL, NULL, "%s",
                             reqs[0].path), 201);
    assert_int_equal(ct_call(one.url, H_TOK_BB, "POST",
                             "{\"events\":[{\"id\":\"x.ho.0\",\"type\":\"ready\","
                             "\"instance\":\"zone-m0-3\",\"machine\":\"m0\","
                             "\"service\":\"zone\",\"generation\":0}]}",
                             NULL, NULL, "%s", reqs[1].path), 200);
    /* on a Redis Cluster: the node of the cluster's keys */
    assert_int_equal(h_redis_route(&redis, "sd:{ho}:x"), 0);
    long long blocked = h_redis_blocked(&redis);
    assert_true(blocked >= 0);
    redisReply *r = h_redis(&redis, "CLIENT PAUSE 1500 WRITE");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, held_post, &reqs[i]), 0);
    /* both script calls reached Redis and wait there */
    assert_int_equal(h_redis_wait_blocked(&redis, blocked + 2, 750), 0);
    for (int i = 0; i < 2; i++)
        if (atomic_load(&reqs[i].done))
            fail_msg("%s answered %ld during the pause", reqs[i].path, reqs[i].status);
    char healthz[160];
    snprintf(healthz, sizeof healthz, "%s/healthz", one.url);
    h_resp_t hr = {0};
    int64_t t1 = h_now_ms();
    assert_int_equal(h_http("GET", healthz, NULL, NULL, NULL, 0, NULL, &hr), 0);
    int waiting = !atomic_load(&reqs[0].done) && !atomic_load(&reqs[1].done);
    int64_t t2 = h_now_ms();
    fprintf(stderr, "healthz answered in %lld ms, %s the allocation and the events\n",
            (long long)(t2 - t1), waiting ? "before" : "not before");
    assert_int_equal(hr.status, 200);
    h_resp_free(&hr);
    assert_true(waiting);
    assert_true(t2 - t1 < 750);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(reqs[0].status, 201);
    assert_int_equal(reqs[1].status, 200);
    h_serverdir_stop(&one);
}

int main(void)
{
    h_init(240);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(concurrent_allocators_never_share),
        cmocka_unit_test(idempotent_and_validated),
        cmocka_unit_test(selectors_and_strategies),
        cmocka_unit_test(join_reserves_player_slots),
        cmocka_unit_test(allocation_ends),
        cmocka_unit_test(wait_for_capacity_and_document),
        cmocka_unit_test(pool_demand_long_poll),
        cmocka_unit_test(pool_spec_validated),
        cmocka_unit_test(grouped_requests_answered_each_their_own),
        cmocka_unit_test(heavy_requests_get_a_call_each),
        cmocka_unit_test(grouped_calls_never_hold_their_http_thread),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
