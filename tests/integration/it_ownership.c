/* Who owns what (issue 28, findings 2, 7, 8 and 11) against a real serverdir and
 * redis-server, with process events posted as Big Brothers would:
 *   - a machine-bound bigbrother token cannot report an instance the directory records
 *     on another machine (403 forbidden naming it; record and locks unchanged);
 *   - legal names never share a Redis key: a machine named "version" gets assignments,
 *     services "match" and "match:p1" (and "zz", "zz:p1") on machine "p1" keep separate
 *     pools, and an event batch that touched both is applied whole;
 *   - live processes per machine stop at the machine's declared capacity (plus
 *     directory.live_processes_above_capacity), or at directory.live_processes_per_machine
 *     (429 quota_exceeded; nothing written);
 *   - an allocation belongs to the principal that created it: another game token gets
 *     404 on get, delete and a replay of its idempotency key, and does not list it; ops
 *     sees it. */
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

#define LIVE_MAX 20 /* directory.live_processes_per_machine of this test's serverdir */

static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd,
                         &(h_sd_opts_t){.config = "{\"directory\": {\"series_interval_ms\": 0, "
                                                  "\"live_processes_per_machine\": 20, "
                                                  "\"live_processes_above_capacity\": 1}}"});
}

/* POSTs {"events": batch} to cluster c with token tok; returns the status, code the
 * error code (>= 64 bytes) and *out the body when asked. */
static long events(const char *tok, const char *c, const char *batch, char *code, json_t **out)
{
    char *body = malloc(strlen(batch) + 16);
    sprintf(body, "{\"events\":%s}", batch);
    long st = ct_call(sd.url, tok, "POST", body, out, code, "/v1/clusters/%s/events", c);
    free(body);
    return st;
}

/* One started + ready pair of instance inst (service svc) on machine m, generation gen. */
static void run_ready(const char *c, const char *inst, const char *svc, const char *m, int gen)
{
    char b[1024];
    snprintf(b, sizeof b,
             "[{\"id\":\"s.%s.%d\",\"type\":\"started\",\"instance\":\"%s\",\"machine\":\"%s\","
             "\"service\":\"%s\",\"pid\":100,\"slot\":0,\"generation\":%d},"
             "{\"id\":\"r.%s.%d\",\"type\":\"ready\",\"instance\":\"%s\",\"machine\":\"%s\","
             "\"service\":\"%s\",\"generation\":%d}]",
             inst, gen, inst, m, svc, gen, inst, gen, inst, m, svc, gen);
    assert_int_equal(events(H_TOK_BB, c, b, NULL, NULL), 200);
}

static void service_put(const char *c, const char *svc)
{
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/true\",\"count\":1}",
                             NULL, NULL, "/v1/clusters/%s/services/%s", c, svc), 200);
}

static void machine_put(const char *c, const char *m, const char *body)
{
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body ? body : "{\"address\":\"10.0.0.1\"}",
                             NULL, NULL, "/v1/clusters/%s/machines/%s", c, m), 200);
}

/* The process record of inst as JSON (caller decrefs). */
static json_t *proc(const char *c, const char *inst)
{
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/processes/%s", c, inst), 200);
    return o;
}

/* ---------- finding 2: the directory records who owns what ---------- */

/* The attack: the m1 token (cluster authz1) posts `stopped` for an instance of
 * m2, then `started` with a higher generation. Both are refused 403 forbidden naming m2;
 * the record, its lock and every key of the cluster are as before. */
static void bound_token_cannot_report_another_machines_instance(void **state)
{
    (void)state;
    const char *c = "authz1";
    run_ready(c, "web-m2-1", "web", "m2", 1);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "PUT", "{\"holder\":\"web-m2-1\"}", NULL, NULL,
                             "/v1/locks/own-player-1"), 200);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("authz1"), H_KEYS_LOCKS, NULL);
    char code[64];
    json_t *o = NULL;
    long st = events(H_TOK_BB_M1, c,
                     "[{\"id\":\"atk.1\",\"type\":\"stopped\",\"instance\":\"web-m2-1\","
                     "\"machine\":\"m1\",\"service\":\"web\",\"reason\":\"exited\",\"code\":0}]",
                     code, &o);
    assert_int_equal(st, 403);
    assert_string_equal(code, "forbidden");
    json_t *e = json_object_get(o, "error");
    assert_string_equal(ct_str(e, "recorded_machine"), "m2");
    assert_string_equal(ct_str(e, "instance"), "web-m2-1");
    json_decref(o);
    st = events(H_TOK_BB_M1, c,
                "[{\"id\":\"atk.2\",\"type\":\"started\",\"instance\":\"web-m2-1\","
                "\"machine\":\"m1\",\"service\":\"web\",\"pid\":7,\"generation\":9}]",
                code, NULL);
    assert_int_equal(st, 403);
    assert_string_equal(code, "forbidden");
    st = events(H_TOK_BB_M1, c,
                "[{\"id\":\"atk.3\",\"type\":\"released\",\"instance\":\"web-m2-1\","
                "\"machine\":\"m1\",\"service\":\"web\"}]",
                code, NULL);
    assert_int_equal(st, 403);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("authz1"), H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, "events of m1 about m2's instance");
    o = proc(c, "web-m2-1");
    assert_string_equal(ct_str(o, "machine"), "m2");
    assert_string_equal(ct_str(o, "state"), "ready");
    assert_int_equal(ct_int(o, "generation"), 1);
    json_decref(o);
    /* its own machine's instances, and new ones, m1 reports as before */
    assert_int_equal(events(H_TOK_BB_M1, c,
                            "[{\"id\":\"own.1\",\"type\":\"started\",\"instance\":\"web-m1-1\","
                            "\"machine\":\"m1\",\"service\":\"web\",\"pid\":8,\"generation\":1}]",
                            NULL, NULL), 200);
    /* an unbound token (an operator) may still move a record between machines */
    assert_int_equal(events(H_TOK_BB, c,
                            "[{\"id\":\"mv.1\",\"type\":\"started\",\"instance\":\"web-m2-1\","
                            "\"machine\":\"m1\",\"service\":\"web\",\"pid\":9,\"generation\":2}]",
                            NULL, NULL), 200);
    assert_true(h_metric(sd.url, "serverdir_events_refused_total{reason=\"instance_of_another_machine\"}") >= 2);
}

/* Senders posting at once share events_apply.lua calls (group commit): a refused batch in
 * a shared call fails its own request only. One thread posts m1's forbidden batches,
 * the others their own machines' events; every legit batch is applied, every forbidden
 * one refused, whatever calls they shared. */
#define SENDERS 6
#define POSTS 15 /* under LIVE_MAX: each sender starts POSTS processes on its machine */

typedef struct {
    int k, ok, refused, other;
} sender_t;

static void *sender(void *arg)
{
    sender_t *s = arg;
    for (int i = 0; i < POSTS; i++) {
        char b[512];
        long st;
        if (s->k == 0) {
            snprintf(b, sizeof b,
                     "[{\"id\":\"g.atk.%d\",\"type\":\"stopped\",\"instance\":\"web-m2-2\","
                     "\"machine\":\"m1\",\"service\":\"web\",\"reason\":\"killed\"}]", i);
            st = events(H_TOK_BB_M1, "authz1", b, NULL, NULL);
            s->refused += st == 403;
            s->other += st != 403;
            if (st != 403)
                fprintf(stderr, "attacker: %ld\n", st);
        } else {
            snprintf(b, sizeof b,
                     "[{\"id\":\"g.%d.%d\",\"type\":\"started\",\"instance\":\"g-%d-%d\","
                     "\"machine\":\"gm%d\",\"service\":\"web\",\"pid\":%d,\"generation\":1}]",
                     s->k, i, s->k, i, s->k, 100 + i);
            st = events(H_TOK_BB, "authz1", b, NULL, NULL);
            s->ok += st == 200;
            s->other += st != 200;
            if (st != 200)
                fprintf(stderr, "sender %d: %ld\n", s->k, st);
        }
    }
    return NULL;
}

static void refused_batch_in_a_shared_call_fails_alone(void **state)
{
    (void)state;
    run_ready("authz1", "web-m2-2", "web", "m2", 1);
    pthread_t t[SENDERS];
    sender_t s[SENDERS];
    for (int k = 0; k < SENDERS; k++) {
        s[k] = (sender_t){.k = k};
        assert_int_equal(pthread_create(&t[k], NULL, sender, &s[k]), 0);
    }
    for (int k = 0; k < SENDERS; k++)
        pthread_join(t[k], NULL);
    assert_int_equal(s[0].refused, POSTS);
    for (int k = 0; k < SENDERS; k++) {
        assert_int_equal(s[k].other, 0);
        if (k)
            assert_int_equal(s[k].ok, POSTS);
    }
    json_t *o = proc("authz1", "web-m2-2");
    assert_string_equal(ct_str(o, "machine"), "m2");
    assert_string_equal(ct_str(o, "state"), "ready");
    json_decref(o);
}

/* ---------- finding 7: no two legal names share a key ---------- */

/* A machine named "version" gets an assignment document (its key once was the
 * assignments counter's). */
static void machine_named_version_gets_assignments(void **state)
{
    (void)state;
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", "{\"machine\":\"m1\",\"ttl_ms\":60000}",
                             &o, NULL, "/v1/clusters/kv1/primary"), 200);
    long long e = ct_int(o, "epoch");
    json_decref(o);
    char body[256];
    snprintf(body, sizeof body,
             "{\"epoch\":%lld,\"machines\":{\"version\":[{\"service\":\"s\",\"slot\":0}],"
             "\"machines\":[{\"service\":\"s\",\"slot\":1}]}}", e);
    char code[64];
    long st = ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, code, "/v1/clusters/kv1/assignments");
    assert_int_equal(st, 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/kv1/machines/version/assignments"), 200);
    assert_int_equal(json_array_size(json_object_get(o, "slots")), 1);
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/kv1/machines/machines/assignments"), 200);
    assert_int_equal(ct_int(json_array_get(json_object_get(o, "slots"), 0), "slot"), 1);
    json_decref(o);
}

/* Allocates from service svc of c with the game token; returns the status, *inst the
 * instance (>= 64 bytes) when 201. */
static long alloc_from(const char *c, const char *svc, char *inst)
{
    char body[256], code[64];
    snprintf(body, sizeof body, "{\"service\":\"%s\"}", svc);
    json_t *o = NULL;
    long st = ct_call(sd.url, H_TOK_GAME, "POST", body, &o, code, "/v1/clusters/%s/allocations", c);
    if (st == 201)
        snprintf(inst, 64, "%s", ct_str(o, "instance"));
    else
        fprintf(stderr, "alloc %s: %ld %s\n", svc, st, code);
    json_decref(o);
    return st;
}

/* Services "match" and "match:p1" with an instance each on machine p1 (and "zz:p1"'s on
 * p1, "zz"'s on p1): one batch makes all four ready. The batch is applied whole (before,
 * the second instance's pool key was the first service's and the batch stopped part way,
 * its first writes left behind) and each service allocates its own instance. */
static void services_whose_names_extend_each_other_keep_their_pools(void **state)
{
    (void)state;
    const char *c = "kv2";
    const char *svcs[] = {"match:p1", "match", "zz:p1", "zz"};
    machine_put(c, "p1", NULL);
    for (int i = 0; i < 4; i++)
        service_put(c, svcs[i]);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("kv2"), NULL);
    char b[2048];
    size_t len = (size_t)snprintf(b, sizeof b, "[");
    for (int i = 0; i < 4; i++)
        len += (size_t)snprintf(b + len, sizeof b - len,
                                "%s{\"id\":\"r.kv2.%d\",\"type\":\"ready\",\"instance\":\"i%d\","
                                "\"machine\":\"p1\",\"service\":\"%s\",\"generation\":1}",
                                i ? "," : "", i, i, svcs[i]);
    snprintf(b + len, sizeof b - len, "]");
    char code[64];
    long st = events(H_TOK_BB, c, b, code, NULL);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("kv2"), NULL);
    if (st != 200) /* a refused batch must leave nothing behind */
        h_keys_same(&before, &after, "a refused event batch");
    else {
        h_keys_free(&before);
        h_keys_free(&after);
    }
    assert_int_equal(st, 200);
    for (int i = 0; i < 4; i++) {
        char inst[64], want[16];
        snprintf(want, sizeof want, "i%d", i);
        assert_int_equal(alloc_from(c, svcs[i], inst), 201);
        assert_string_equal(inst, want);
    }
}

/* Data of key layout 1 (assign:<m>, free:<s>:<m>), as a serverdir of before left it, is
 * moved by the first script that reads it: the machine's assignments and the service's
 * free instance stay. */
static void layout_1_keys_are_moved(void **state)
{
    (void)state;
    machine_put("kv3", "m1", NULL);
    service_put("kv3", "old");
    redisReply *r[] = {
        h_redis(&redis, "HSET sd:{kv3}:assign:m1 slots %s version 7 epoch 1",
                "[{\"service\":\"old\",\"slot\":0}]"),
        h_redis(&redis, "SADD sd:{kv3}:assign:machines m1"),
        h_redis(&redis, "SET sd:{kv3}:assign:version 7"),
        h_redis(&redis, "HSET sd:{kv3}:proc:old-1 instance old-1 machine m1 service old "
                        "state ready generation 1"),
        h_redis(&redis, "ZADD sd:{kv3}:ix:m:m1 0 old-1"),
        h_redis(&redis, "SADD sd:{kv3}:free:old:m1 old-1"),
        h_redis(&redis, "ZADD sd:{kv3}:free:old 0 m1"),
        h_redis(&redis, "DEL sd:{kv3}:keyv")};
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        assert_non_null(r[i]);
        assert_int_not_equal(r[i]->type, REDIS_REPLY_ERROR);
        freeReplyObject(r[i]);
    }
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/kv3/machines/m1/assignments"), 200);
    assert_int_equal(ct_int(json_array_get(json_object_get(o, "slots"), 0), "slot"), 0);
    json_decref(o);
    char inst[64];
    assert_int_equal(alloc_from("kv3", "old", inst), 201);
    assert_string_equal(inst, "old-1");
    redisReply *x = h_redis(&redis, "EXISTS sd:{kv3}:assign:m1 sd:{kv3}:free:old:m1");
    assert_int_equal(x->integer, 0);
    freeReplyObject(x);
}

/* ---------- finding 8: live processes per machine ---------- */

/* A batch of n started events, instances <pfx>0.. on machine m. */
static long start_many(const char *tok, const char *c, const char *m, const char *pfx, int from,
                       int n, char *code)
{
    char *b = malloc((size_t)n * 256 + 8);
    size_t len = (size_t)sprintf(b, "[");
    for (int i = from; i < from + n; i++)
        len += (size_t)sprintf(b + len,
                               "%s{\"id\":\"q.%s.%d\",\"type\":\"started\",\"instance\":\"%s%d\","
                               "\"machine\":\"%s\",\"service\":\"q\",\"pid\":%d,\"generation\":1}",
                               i > from ? "," : "", pfx, i, pfx, i, m, 1000 + i);
    sprintf(b + len, "]");
    long st = events(tok, c, b, code, NULL);
    free(b);
    return st;
}

/* Machine q1 declared capacity 3, and the config allows 1 above it: its fifth live
 * process is refused 429 quota_exceeded naming live_processes_per_machine, and nothing of that batch is written; once one
 * stops, another may start. Machine q2 declared none: the config's 20 bound it. */
static void live_processes_stop_at_the_machines_capacity(void **state)
{
    (void)state;
    const char *c = "q";
    machine_put(c, "q1", "{\"address\":\"10.0.0.1\",\"capacity\":3}");
    char code[64];
    assert_int_equal(start_many(H_TOK_BB, c, "q1", "a", 0, 4, code), 200);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("q"), NULL);
    json_t *o = NULL;
    char b[512];
    snprintf(b, sizeof b,
             "[{\"id\":\"q.b.0\",\"type\":\"started\",\"instance\":\"b0\",\"machine\":\"q1\","
             "\"service\":\"q\",\"pid\":5,\"generation\":1}]");
    assert_int_equal(events(H_TOK_BB, c, b, code, &o), 429);
    assert_string_equal(code, "quota_exceeded");
    json_t *e = json_object_get(o, "error");
    assert_string_equal(ct_str(e, "quota"), "live_processes_per_machine");
    assert_string_equal(ct_str(e, "machine"), "q1");
    assert_int_equal(ct_int(e, "limit"), 4);
    json_decref(o);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("q"), NULL);
    h_keys_same(&before, &after, "a start past the machine's capacity");
    /* a stop and a start in one batch: within the capacity */
    assert_int_equal(events(H_TOK_BB, c,
                            "[{\"id\":\"q.a0.stop\",\"type\":\"stopped\",\"instance\":\"a0\","
                            "\"machine\":\"q1\",\"service\":\"q\",\"reason\":\"exited\",\"code\":0},"
                            "{\"id\":\"q.b.0\",\"type\":\"started\",\"instance\":\"b0\","
                            "\"machine\":\"q1\",\"service\":\"q\",\"pid\":5,\"generation\":1}]",
                            code, NULL), 200);
    /* no capacity declared: the config's bound */
    machine_put(c, "q2", NULL);
    assert_int_equal(start_many(H_TOK_BB, c, "q2", "c", 0, LIVE_MAX, code), 200);
    assert_int_equal(start_many(H_TOK_BB, c, "q2", "c", LIVE_MAX, 1, code), 429);
    assert_string_equal(code, "quota_exceeded");
    /* a resent start of a live one adds nothing */
    assert_int_equal(start_many(H_TOK_BB, c, "q2", "c", 0, 1, code), 200);
    assert_true(h_metric(sd.url, "serverdir_quota_refusals_total{quota=\"live_processes_per_machine\"}") >= 2);
}

/* ---------- finding 11: allocations belong to their creator ---------- */

static void allocations_belong_to_their_creator(void **state)
{
    (void)state;
    const char *c = "own";
    machine_put(c, "o1", NULL);
    service_put(c, "arena");
    run_ready(c, "arena-1", "arena", "o1", 1);
    const char *body = "{\"service\":\"arena\",\"idempotency_key\":\"k-own-1\","
                       "\"payload\":{\"secret\":\"s3\"}}";
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "POST", body, &o, NULL,
                             "/v1/clusters/%s/allocations", c), 201);
    char id[64];
    snprintf(id, sizeof id, "%s", ct_str(o, "allocation"));
    json_decref(o);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("own"), NULL);
    char code[64];
    /* another game token: get, replay, delete 404; not in the list */
    assert_int_equal(ct_call(sd.url, H_TOK_GAME2, "GET", NULL, NULL, code,
                             "/v1/clusters/%s/allocations/%s", c, id), 404);
    assert_string_equal(code, "no_such_allocation");
    o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_GAME2, "POST", body, &o, code,
                             "/v1/clusters/%s/allocations", c), 404);
    char *text = o ? json_dumps(o, 0) : NULL;
    assert_null(text ? strstr(text, "s3") : NULL);
    free(text);
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME2, "DELETE", NULL, NULL, code,
                             "/v1/clusters/%s/allocations/%s", c, id), 404);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME2, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/allocations", c), 200);
    assert_int_equal(json_array_size(json_object_get(o, "allocations")), 0);
    json_decref(o);
    /* a key of the cluster that is not an allocation is not read as one */
    assert_int_equal(ct_call(sd.url, H_TOK_GAME2, "GET", NULL, NULL, code,
                             "/v1/clusters/%s/allocations/m:o1", c), 404);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("own"), NULL);
    h_keys_same(&before, &after, "another principal's requests for an allocation");
    /* the creator and ops see it; the creator's replay answers it */
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "GET", NULL, NULL, NULL,
                             "/v1/clusters/%s/allocations/%s", c, id), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/allocations", c), 200);
    assert_int_equal(json_array_size(json_object_get(o, "allocations")), 1);
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "POST", body, NULL, NULL,
                             "/v1/clusters/%s/allocations", c), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "DELETE", NULL, NULL, NULL,
                             "/v1/clusters/%s/allocations/%s", c, id), 200);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bound_token_cannot_report_another_machines_instance),
        cmocka_unit_test(refused_batch_in_a_shared_call_fails_alone),
        cmocka_unit_test(machine_named_version_gets_assignments),
        cmocka_unit_test(services_whose_names_extend_each_other_keep_their_pools),
        cmocka_unit_test(layout_1_keys_are_moved),
        cmocka_unit_test(live_processes_stop_at_the_machines_capacity),
        cmocka_unit_test(allocations_belong_to_their_creator),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
