/* The primary lease against a real serverdir and redis-server: acquire, renew, expiry
 * and takeover with a growing epoch that never repeats, release, roles, bad input, and
 * fencing: a stale epoch (or an expired lease) is refused on every primary-only write
 * and changes nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_api.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with the test tokens. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, NULL);
}

/* POST /primary for machine m with ttl; returns the status, *epoch and holder. */
static long acquire(const char *cluster, const char *m, int ttl, long long *epoch, char *holder)
{
    char body[128], code[64];
    snprintf(body, sizeof body, "{\"machine\":\"%s\",\"ttl_ms\":%d}", m, ttl);
    json_t *o;
    long st = ct_call(sd.url, H_TOK_BB, "POST", body, &o, code, "/v1/clusters/%s/primary",
                      cluster);
    const json_t *src = st == 409 ? json_object_get(o, "error") : o;
    if (st == 409)
        assert_string_equal(code, "primary_held");
    if (epoch)
        *epoch = ct_int(src, "epoch");
    if (holder)
        strcpy(holder, ct_str(src, "holder"));
    json_decref(o);
    return st;
}

/* h_wait_until condition: cluster arg (a const char *) has no primary holder (its lease
 * ran out). */
static int no_holder(void *arg)
{
    json_t *o;
    long st = ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL, "/v1/clusters/%s/primary",
                      (const char *)arg);
    int none = st == 200 && json_is_null(json_object_get(o, "holder"));
    json_decref(o);
    return none;
}

static void acquire_renew_expire_takeover(void **state)
{
    (void)state;
    long long e1, e2, e;
    char holder[130];
    assert_int_equal(acquire("p1", "m1", 1500, &e1, holder), 200);
    assert_string_equal(holder, "m1");
    assert_true(e1 >= 1);
    /* Another machine is refused while the lease runs, and told who holds it. */
    assert_int_equal(acquire("p1", "m2", 1500, &e, holder), 409);
    assert_string_equal(holder, "m1");
    assert_int_equal(e, e1);
    /* Renewal keeps the epoch. */
    assert_int_equal(acquire("p1", "m1", 1500, &e, holder), 200);
    assert_int_equal(e, e1);
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/p1/primary"), 200);
    assert_string_equal(ct_str(o, "holder"), "m1");
    assert_true(ct_int(o, "expires_in_ms") > 0 && ct_int(o, "expires_in_ms") <= 1500);
    json_decref(o);
    /* m1 stops renewing (paused): after the lease ran out m2 takes over, epoch + 1. */
    assert_true(h_wait_until(no_holder, "p1", h_valgrind() ? 20000 : 5000));
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/p1/primary"), 200);
    assert_true(json_is_null(json_object_get(o, "holder")));
    assert_int_equal(ct_int(o, "epoch"), e1);
    json_decref(o);
    assert_int_equal(acquire("p1", "m2", 5000, &e2, holder), 200);
    assert_int_equal(e2, e1 + 1);
    /* The old holder comes back: refused, it must step down. */
    assert_int_equal(acquire("p1", "m1", 5000, &e, holder), 409);
    assert_string_equal(holder, "m2");
}

static void release_and_epoch_never_repeats(void **state)
{
    (void)state;
    long long e1, e2, e3;
    assert_int_equal(acquire("p2", "m1", 10000, &e1, NULL), 200);
    char code[64];
    /* Only the holder may release. */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "DELETE", NULL, NULL, code,
                             "/v1/clusters/p2/primary?machine=m2"), 409);
    assert_string_equal(code, "not_primary");
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "DELETE", NULL, NULL, NULL,
                             "/v1/clusters/p2/primary?machine=m1"), 204);
    /* Released: the next holder (even the same machine) gets a new epoch. */
    assert_int_equal(acquire("p2", "m1", 10000, &e2, NULL), 200);
    assert_int_equal(e2, e1 + 1);
    /* Losing the lease record itself does not reset the epoch. */
    freeReplyObject(h_redis(&redis, "DEL sd:{p2}:primary"));
    assert_int_equal(acquire("p2", "m3", 10000, &e3, NULL), 200);
    assert_int_equal(e3, e2 + 1);
    /* Clusters are independent. */
    long long other;
    assert_int_equal(acquire("p2other", "m1", 10000, &other, NULL), 200);
    assert_int_equal(other, 1);
}

static void stale_epoch_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    long long e1, e2;
    const char *slots = "\"m1\":[{\"service\":\"zone\",\"slot\":0,\"spec_version\":1,"
                        "\"restart_token\":0,\"spec\":{\"command\":\"/bin/true\"}}]";
    char body[512], code[64];
    h_keys_t before, after;
    assert_int_equal(acquire("p3", "m1", 1200, &e1, NULL), 200);
    snprintf(body, sizeof body, "{\"epoch\":%lld,\"machines\":{%s}}", e1, slots);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, NULL,
                             "/v1/clusters/p3/assignments"), 200);
    /* m1's lease runs out (paused past it): its writes are refused even with its epoch,
     * before anyone else took over. */
    assert_true(h_wait_until(no_holder, "p3", h_valgrind() ? 20000 : 5000));
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, code,
                             "/v1/clusters/p3/assignments"), 409);
    assert_string_equal(code, "stale_epoch");
    /* m2 takes over; m1's old epoch is refused on assignments and on lost. */
    assert_int_equal(acquire("p3", "m2", 10000, &e2, NULL), 200);
    assert_int_equal(e2, e1 + 1);
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("p3"), NULL);
    json_t *o;
    snprintf(body, sizeof body, "{\"epoch\":%lld,\"machines\":{\"m1\":[]}}", e1);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, &o, code,
                             "/v1/clusters/p3/assignments"), 409);
    assert_string_equal(code, "stale_epoch");
    const json_t *err = json_object_get(o, "error");
    assert_int_equal(ct_int(err, "current_epoch"), e2);
    assert_string_equal(ct_str(err, "holder"), "m2");
    json_decref(o);
    snprintf(body, sizeof body, "{\"epoch\":%lld}", e1);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, NULL, code,
                             "/v1/clusters/p3/machines/m1/lost"), 409);
    assert_string_equal(code, "stale_epoch");
    /* A future epoch is refused too. */
    snprintf(body, sizeof body, "{\"epoch\":%lld,\"machines\":{\"m1\":[]}}", e2 + 5);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, code,
                             "/v1/clusters/p3/assignments"), 409);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("p3"), NULL);
    h_keys_same(&before, &after, __func__);
    /* The current primary's write goes through. */
    snprintf(body, sizeof body, "{\"epoch\":%lld,\"machines\":{\"m1\":[]}}", e2);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, &o, NULL,
                             "/v1/clusters/p3/assignments"), 200);
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
}

static void roles_and_bad_input(void **state)
{
    (void)state;
    char code[64];
    h_keys_t before, after;
    const char *ok = "{\"machine\":\"m1\",\"ttl_ms\":5000}";
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "POST", ok, NULL, code,
                             "/v1/clusters/p4/primary"), 403);
    assert_int_equal(ct_call(sd.url, H_TOK_GAME, "POST", ok, NULL, code,
                             "/v1/clusters/p4/primary"), 403);
    assert_int_equal(ct_call(sd.url, NULL, "GET", NULL, NULL, code, "/v1/clusters/p4/primary"),
                     401);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "PUT", "{\"epoch\":1,\"machines\":{}}", NULL,
                             code, "/v1/clusters/p4/assignments"), 403);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "DELETE", NULL, NULL, code,
                             "/v1/clusters/p4/primary?machine=m1"), 403);
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("p4"), NULL);
    static const struct {
        const char *body, *code;
    } bad[] = {
        {"{\"machine\":\"m1\",\"ttl_ms\":5}", "bad_field"},
        {"{\"machine\":\"m1\",\"ttl_ms\":999999999}", "bad_field"},
        {"{\"machine\":\"bad name\"}", "bad_field"},
        {"{\"ttl_ms\":5000}", "bad_field"},
        {"{\"machine\":\"m1\",\"extra\":1}", "bad_field"},
        {"[1,2]", "bad_json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long st = ct_call(sd.url, H_TOK_BB, "POST", bad[i].body, NULL, code,
                          "/v1/clusters/p4/primary");
        assert_int_equal(st, 400);
        if (strcmp(bad[i].code, "bad_json") != 0)
            assert_string_equal(code, bad[i].code);
    }
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "DELETE", NULL, NULL, code,
                             "/v1/clusters/p4/primary"), 400);
    assert_string_equal(code, "missing_machine");
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("p4"), NULL);
    h_keys_same(&before, &after, __func__);
    /* ops may do everything. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", ok, NULL, code, "/v1/clusters/p4/primary"),
                     200);
}

/* The metrics count holder changes and refused stale writes. */
static void metrics_count_changes_and_refusals(void **state)
{
    (void)state;
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/metrics"), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "serverdir_primary_changes_total"));
    assert_non_null(strstr(r.body, "serverdir_primary_stale_epoch_total"));
    h_resp_free(&r);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(acquire_renew_expire_takeover),
        cmocka_unit_test(release_and_epoch_never_repeats),
        cmocka_unit_test(stale_epoch_is_refused_and_changes_nothing),
        cmocka_unit_test(roles_and_bad_input),
        cmocka_unit_test(metrics_count_changes_and_refusals),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
