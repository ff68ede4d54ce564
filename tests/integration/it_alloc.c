/* Allocations against serverdir (docs/allocation.md), with the instances' lives told by
 * process events as a Big Brother would post them: one script picks, concurrent
 * allocators never share an instance, idempotency keys, selectors and strategies, join
 * capacity, wait_ms, the ends of an allocation (release, expiry, crash, clean exit,
 * machine lost) and what each does to the pool, bad requests that change nothing, paged
 * lists. it.alloc_game runs the same with real bigbrothers and gameprocs. */
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
    char before[64], after[64];
    h_redis_digest(&redis, before);
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
    h_redis_digest(&redis, after);
    assert_string_equal(before, after);

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
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
