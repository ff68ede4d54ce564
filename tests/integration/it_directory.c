/* The process directory and machine leases against a real redis-server and serverdir:
 * leases (register, renew, expiry, delete), event batches (idempotency, ordering
 * safety), filters, the bounded history, every bad input (docs/design.md, "Error
 * conventions": a specific error, no Redis change), auth and token reload, a Redis
 * outage, and libsdclient failover. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <pthread.h>
#include <time.h>

#include "harness.h"
#include "harness_stack.h"
#include "sdclient.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with the test tokens. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, NULL);
}

/* A request against sd; returns the status. The caller frees r. */
static long req(const char *method, const char *token, const char *body, h_resp_t *r,
                const char *path)
{
    assert_int_equal(h_http_json(method, sd.url, token, body, r, "%s", path), 0);
    return r->status;
}

/* The JSON body of r (asserted to parse); frees r. */
static json_t *body_of(h_resp_t *r)
{
    json_t *j = h_resp_json(r);
    assert_non_null(j);
    h_resp_free(r);
    return j;
}

static json_t *get_json(const char *token, const char *path, long want)
{
    h_resp_t r;
    long st = req("GET", token, NULL, &r, path);
    if (st != want)
        fprintf(stderr, "GET %s -> %ld %.300s\n", path, st, r.body ? r.body : "");
    assert_int_equal(st, want);
    return body_of(&r);
}

static json_t *post_events(const char *cluster, const char *events_json)
{
    char path[128], *body = NULL;
    snprintf(path, sizeof path, "/v1/clusters/%s/events", cluster);
    assert_true(asprintf(&body, "{\"events\":%s}", events_json) > 0);
    h_resp_t r;
    long st = req("POST", H_TOK_BB, body, &r, path);
    free(body);
    if (st != 200)
        fprintf(stderr, "POST events -> %ld %s\n", st, r.body ? r.body : "");
    assert_int_equal(st, 200);
    return body_of(&r);
}

static long jint(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_true(json_is_integer(v));
    return (long)json_integer_value(v);
}

static const char *jstr(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    assert_non_null(s);
    return s;
}

/* h_wait_until condition: machine m2 of cluster cm shows as lost (its lease ran out). */
static int m2_lost(void *arg)
{
    (void)arg;
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/cm/machines/m2", 200);
    int lost = !strcmp(jstr(j, "state"), "lost");
    json_decref(j);
    return lost;
}

/* ---------------------------------------------------------------- machines */

static void machine_lease_register_renew_expire_delete(void **state)
{
    h_resp_t r;
    assert_int_equal(req("PUT", H_TOK_BB,
                         "{\"address\":\"10.0.0.5\",\"labels\":{\"zone\":\"eu\"},"
                         "\"capacity\":400,\"version\":\"0.1.0\",\"ttl_ms\":15000}",
                         &r, "/v1/clusters/cm/machines/m1"),
                     200);
    json_t *j = body_of(&r);
    assert_string_equal(jstr(j, "cluster"), "cm");
    assert_string_equal(jstr(j, "machine"), "m1");
    assert_int_equal(jint(j, "expires_in_ms"), 15000);
    long registered = jint(j, "registered_at_ms");
    json_decref(j);

    /* A second machine, and a bare renewal of m1 that keeps its fields. */
    assert_int_equal(req("PUT", H_TOK_BB, "{\"ttl_ms\":60000,\"address\":\"m2.example\"}", &r,
                         "/v1/clusters/cm/machines/m2"),
                     200);
    h_resp_free(&r);
    assert_int_equal(req("PUT", H_TOK_OPS, NULL, &r, "/v1/clusters/cm/machines/m1"), 200);
    j = body_of(&r);
    assert_int_equal(jint(j, "registered_at_ms"), registered);
    json_decref(j);

    j = get_json(H_TOK_VIEWER, "/v1/clusters/cm/machines", 200);
    json_t *ms = json_object_get(j, "machines");
    assert_int_equal(json_array_size(ms), 2);
    json_t *m1 = json_array_get(ms, 0);
    assert_string_equal(jstr(m1, "machine"), "m1");
    assert_string_equal(jstr(m1, "address"), "10.0.0.5");
    assert_string_equal(jstr(json_object_get(m1, "labels"), "zone"), "eu");
    assert_int_equal(jint(m1, "capacity"), 400);
    assert_string_equal(jstr(m1, "version"), "0.1.0");
    assert_string_equal(jstr(m1, "state"), "live");
    assert_true(jint(m1, "expires_in_ms") > 0 && jint(m1, "expires_in_ms") <= 15000);
    assert_true(jint(m1, "renewed_at_ms") >= registered);
    assert_string_equal(jstr(json_array_get(ms, 1), "state"), "live");
    json_decref(j);

    /* m2 renews with a short lease that then runs out: lost, still listed; a renewal
     * brings it back. */
    assert_int_equal(req("PUT", H_TOK_BB, "{\"ttl_ms\":1000}", &r, "/v1/clusters/cm/machines/m2"), 200);
    h_resp_free(&r);
    assert_true(h_wait_until(m2_lost, NULL, h_valgrind() ? 20000 : 5000));
    j = get_json(H_TOK_VIEWER, "/v1/clusters/cm/machines/m2", 200);
    assert_string_equal(jstr(j, "state"), "lost");
    assert_int_equal(jint(j, "expires_in_ms"), 0);
    assert_string_equal(jstr(j, "address"), "m2.example");
    json_decref(j);
    assert_int_equal(req("PUT", H_TOK_BB, "{\"ttl_ms\":5000}", &r, "/v1/clusters/cm/machines/m2"), 200);
    h_resp_free(&r);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/cm/machines/m2", 200);
    assert_string_equal(jstr(j, "state"), "live");
    json_decref(j);

    /* Delete: ops only; then 404. */
    assert_int_equal(req("DELETE", H_TOK_BB, NULL, &r, "/v1/clusters/cm/machines/m2"), 403);
    h_resp_free(&r);
    assert_int_equal(req("DELETE", H_TOK_OPS, NULL, &r, "/v1/clusters/cm/machines/m2"), 204);
    h_resp_free(&r);
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/cm/machines/m2"), 404);
    assert_string_equal(h_err_code(&r), "not_found");
    h_resp_free(&r);
    assert_int_equal(req("DELETE", H_TOK_OPS, NULL, &r, "/v1/clusters/cm/machines/m2"), 404);
    h_resp_free(&r);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/cm/machines", 200);
    assert_int_equal(json_array_size(json_object_get(j, "machines")), 1);
    json_decref(j);
}

/* ---------------------------------------------------------------- events */

#define CONTRACT_BATCH                                                                     \
    "[{\"id\":\"m1-7f3a9c-000042\",\"type\":\"started\",\"instance\":\"zone-m1-7f3a9c-3\","   \
    "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":12345,\"ts_ms\":1795000000000,"         \
    "\"slot\":3,\"generation\":2,\"ports\":{\"game\":27960}},"                               \
    "{\"id\":\"m1-7f3a9c-000043\",\"type\":\"ready\",\"instance\":\"zone-m1-7f3a9c-3\","      \
    "\"machine\":\"m1\",\"service\":\"zone\",\"ts_ms\":1795000000100},"                      \
    "{\"id\":\"m1-7f3a9c-000044\",\"type\":\"stopped\",\"instance\":\"zone-m1-7f3a9c-3\","    \
    "\"machine\":\"m1\",\"service\":\"zone\",\"ts_ms\":1795000009000,\"reason\":\"hung\","    \
    "\"silent_ms\":3012,\"detail\":\"liveness deadline 3000 ms missed\",\"code\":null,"       \
    "\"signal\":6}]"

static void event_batch_applied_then_retried_as_duplicates(void **state)
{
    /* started + ready: live and ready. */
    json_t *j = post_events("ce", "[{\"id\":\"e1\",\"type\":\"started\",\"instance\":\"zone-1\","
                                  "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":100,"
                                  "\"ts_ms\":1000,\"slot\":0,\"ports\":{\"game\":27960}},"
                                  "{\"id\":\"e2\",\"type\":\"ready\",\"instance\":\"zone-1\","
                                  "\"machine\":\"m1\",\"service\":\"zone\",\"ts_ms\":1500}]");
    assert_int_equal(jint(j, "accepted"), 2);
    assert_int_equal(jint(j, "duplicates"), 0);
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/ce/processes/zone-1", 200);
    assert_string_equal(jstr(j, "state"), "ready");
    assert_string_equal(jstr(j, "cluster"), "ce");
    assert_int_equal(jint(j, "pid"), 100);
    assert_int_equal(jint(j, "started_at_ms"), 1000);
    assert_int_equal(jint(j, "ready_at_ms"), 1500);
    assert_int_equal(jint(json_object_get(j, "ports"), "game"), 27960);
    assert_true(json_is_null(json_object_get(j, "reason_text")));
    json_decref(j);

    /* The contract's example batch, then the same batch again: all duplicates, and
     * Redis is byte-for-byte unchanged. */
    j = post_events("ce", CONTRACT_BATCH);
    assert_int_equal(jint(j, "accepted"), 3);
    assert_int_equal(jint(j, "duplicates"), 0);
    json_decref(j);
    h_keys_t before, after;
    assert_true(h_keys_take(&redis, &before, "sd:{ce}:*", "sd:clusters", NULL) > 0);
    j = post_events("ce", CONTRACT_BATCH);
    assert_int_equal(jint(j, "accepted"), 0);
    assert_int_equal(jint(j, "duplicates"), 3);
    json_decref(j);
    h_keys_take(&redis, &after, "sd:{ce}:*", "sd:clusters", NULL);
    h_keys_same(&before, &after, "the batch again");

    j = get_json(H_TOK_VIEWER, "/v1/clusters/ce/processes/zone-m1-7f3a9c-3", 200);
    assert_string_equal(jstr(j, "state"), "stopped");
    assert_string_equal(jstr(j, "reason"), "hung");
    assert_int_equal(jint(j, "signal"), 6);
    assert_true(json_is_null(json_object_get(j, "code")));
    assert_int_equal(jint(j, "silent_ms"), 3012);
    assert_int_equal(jint(j, "generation"), 2);
    assert_int_equal(jint(j, "slot"), 3);
    assert_int_equal(jint(j, "stopped_at_ms"), 1795000009000L);
    assert_string_equal(jstr(j, "detail"), "liveness deadline 3000 ms missed");
    assert_string_equal(jstr(j, "reason_text"), "hung(silent 3012ms)");
    json_decref(j);

    /* The live directory holds zone-1 only; the stopped list holds the other. */
    j = get_json(H_TOK_VIEWER, "/v1/clusters/ce/processes", 200);
    json_t *ps = json_object_get(j, "processes");
    assert_int_equal(json_array_size(ps), 1);
    assert_string_equal(jstr(json_array_get(ps, 0), "instance"), "zone-1");
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/ce/processes?state=stopped", 200);
    ps = json_object_get(j, "processes");
    assert_int_equal(json_array_size(ps), 1);
    assert_string_equal(jstr(json_array_get(ps, 0), "instance"), "zone-m1-7f3a9c-3");
    json_decref(j);

    h_resp_t r;
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ce/processes/nope"), 404);
    assert_string_equal(h_err_code(&r), "not_found");
    h_resp_free(&r);

    /* The counters saw it. */
    assert_int_equal(req("GET", NULL, NULL, &r, "/metrics"), 200);
    assert_non_null(strstr(r.body, "serverdir_events_accepted_total 5"));
    assert_non_null(strstr(r.body, "serverdir_events_duplicate_total 3"));
    h_resp_free(&r);
}

static void stopped_unknown_recorded_and_never_revived(void **state)
{
    json_t *j = post_events("co", "[{\"id\":\"s1\",\"type\":\"stopped\",\"instance\":\"ghost\","
                                  "\"machine\":\"m9\",\"service\":\"zone\",\"reason\":\"exited\","
                                  "\"code\":3}]");
    assert_int_equal(jint(j, "accepted"), 1);
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/co/processes/ghost", 200);
    assert_string_equal(jstr(j, "state"), "stopped");
    assert_string_equal(jstr(j, "reason"), "exited");
    assert_int_equal(jint(j, "code"), 3);
    assert_string_equal(jstr(j, "reason_text"), "exited(code 3)");
    assert_true(json_is_integer(json_object_get(j, "stopped_at_ms"))); /* server time */
    json_decref(j);

    /* A late started/ready of the same run is recorded in the history but does not
     * bring the instance back. */
    j = post_events("co", "[{\"id\":\"s0\",\"type\":\"started\",\"instance\":\"ghost\","
                          "\"machine\":\"m9\",\"service\":\"zone\",\"pid\":77},"
                          "{\"id\":\"s0r\",\"type\":\"ready\",\"instance\":\"ghost\","
                          "\"machine\":\"m9\",\"service\":\"zone\"}]");
    assert_int_equal(jint(j, "accepted"), 2);
    assert_int_equal(jint(j, "stale"), 2);
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/co/processes/ghost", 200);
    assert_string_equal(jstr(j, "state"), "stopped");
    assert_true(json_is_null(json_object_get(j, "pid")));
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/co/processes?machine=m9", 200);
    assert_int_equal(json_array_size(json_object_get(j, "processes")), 0);
    json_decref(j);

    /* A newer generation of the slot is a new run and does come back. */
    j = post_events("co", "[{\"id\":\"s2\",\"type\":\"started\",\"instance\":\"ghost\","
                          "\"machine\":\"m9\",\"service\":\"zone\",\"pid\":78,\"generation\":1}]");
    assert_int_equal(jint(j, "stale"), 0);
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/co/processes/ghost", 200);
    assert_string_equal(jstr(j, "state"), "starting");
    assert_int_equal(jint(j, "pid"), 78);
    assert_true(json_is_null(json_object_get(j, "reason")));
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/co/processes?state=stopped", 200);
    assert_int_equal(json_array_size(json_object_get(j, "processes")), 0);
    json_decref(j);
}

/* Walks every page of path (limit 3, so most lists take several pages): the number of
 * records, each seen once, pages in instance order (live lists). total is the size of
 * the index walked: at least the records found (exact with one filter or none). */
static int count_procs(const char *path)
{
    static char seen[2048][48];
    char url[512];
    const char *after = "";
    char cursor[128] = "";
    int n = 0, pages = 0;
    int live = strstr(path, "state=stopped") == NULL;
    for (;;) {
        snprintf(url, sizeof url, "%s%slimit=%d%s%s", path, strchr(path, '?') ? "&" : "?",
                 strstr(path, "cbig") || strstr(path, "cmig") ? 97 : 3, *after ? "&after=" : "", after);
        json_t *j = get_json(H_TOK_VIEWER, url, 200);
        json_t *procs = json_object_get(j, "processes");
        size_t i;
        json_t *p;
        json_array_foreach(procs, i, p) {
            const char *inst = jstr(p, "instance");
            for (int k = 0; k < n; k++)
                assert_string_not_equal(seen[k], inst);
            if (live && n > 0)
                assert_true(strcmp(seen[n - 1], inst) < 0);
            assert_true(n < 2048);
            snprintf(seen[n++], sizeof seen[0], "%s", inst);
        }
        assert_true(jint(j, "total") >= n);
        json_t *next = json_object_get(j, "next");
        assert_int_equal(json_is_true(json_object_get(j, "truncated")), json_is_string(next));
        pages++;
        assert_true(pages < 50);
        if (!json_is_string(next)) {
            json_decref(j);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        after = cursor;
        json_decref(j);
    }
    return n;
}

static void directory_filters(void **state)
{
    /* m1: zone x2 (one ready), lobby x1; m2: zone x1; plus one stopped zone on m2. */
    json_t *j = post_events(
        "cf",
        "[{\"id\":\"f1\",\"type\":\"started\",\"instance\":\"z1\",\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1},"
        "{\"id\":\"f2\",\"type\":\"started\",\"instance\":\"z2\",\"machine\":\"m1\",\"service\":\"zone\",\"pid\":2},"
        "{\"id\":\"f3\",\"type\":\"ready\",\"instance\":\"z2\",\"machine\":\"m1\",\"service\":\"zone\"},"
        "{\"id\":\"f4\",\"type\":\"started\",\"instance\":\"l1\",\"machine\":\"m1\",\"service\":\"lobby\",\"pid\":3},"
        "{\"id\":\"f5\",\"type\":\"started\",\"instance\":\"z3\",\"machine\":\"m2\",\"service\":\"zone\",\"pid\":4},"
        "{\"id\":\"f6\",\"type\":\"started\",\"instance\":\"z4\",\"machine\":\"m2\",\"service\":\"zone\",\"pid\":5},"
        "{\"id\":\"f7\",\"type\":\"stopped\",\"instance\":\"z4\",\"machine\":\"m2\",\"service\":\"zone\",\"reason\":\"killed\",\"signal\":9}]");
    assert_int_equal(jint(j, "accepted"), 7);
    json_decref(j);
    assert_int_equal(count_procs("/v1/clusters/cf/processes"), 4);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?machine=m1"), 3);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?service=zone"), 3);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?machine=m1&service=zone"), 2);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?state=ready"), 1);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?state=starting&machine=m1"), 2);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?state=stopped"), 1);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?state=stopped&machine=m1"), 0);
    assert_int_equal(count_procs("/v1/clusters/cf/processes?machine=m3"), 0);

    j = get_json(H_TOK_VIEWER, "/v1/clusters/cf/processes?limit=2", 200);
    assert_int_equal(json_array_size(json_object_get(j, "processes")), 2);
    assert_int_equal(jint(j, "total"), 4);
    assert_true(json_is_true(json_object_get(j, "truncated")));
    json_decref(j);

    h_resp_t r;
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/cf/processes?state=gone"), 400);
    assert_string_equal(h_err_code(&r), "bad_query");
    h_resp_free(&r);
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/cf/processes?machine=a%2Fb"), 400);
    assert_string_equal(h_err_code(&r), "bad_query");
    h_resp_free(&r);
}

static void history_since_and_limit(void **state)
{
    char batch[4096];
    int n = snprintf(batch, sizeof batch, "[");
    for (int i = 0; i < 10; i++)
        n += snprintf(batch + n, sizeof batch - (size_t)n,
                      "%s{\"id\":\"h%d\",\"type\":\"started\",\"instance\":\"i%d\","
                      "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":%d}",
                      i ? "," : "", i, i, 100 + i);
    snprintf(batch + n, sizeof batch - (size_t)n, "]");
    json_decref(post_events("ch", batch));

    /* Without since: the newest `limit`, newest last. */
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/ch/events?limit=3", 200);
    json_t *evs = json_object_get(j, "events");
    assert_int_equal(json_array_size(evs), 3);
    assert_string_equal(jstr(json_array_get(evs, 0), "id"), "h7");
    assert_string_equal(jstr(json_array_get(evs, 2), "id"), "h9");
    assert_int_equal(jint(json_array_get(evs, 2), "pid"), 109);
    json_decref(j);

    /* From the start with a cursor: pages of 4 cover all 10 in order. */
    j = get_json(H_TOK_VIEWER, "/v1/clusters/ch/events?since=0&limit=4", 200);
    evs = json_object_get(j, "events");
    assert_int_equal(json_array_size(evs), 4);
    assert_string_equal(jstr(json_array_get(evs, 0), "id"), "h0");
    char path[160];
    snprintf(path, sizeof path, "/v1/clusters/ch/events?since=%s&limit=4", jstr(j, "last"));
    json_decref(j);
    j = get_json(H_TOK_VIEWER, path, 200);
    evs = json_object_get(j, "events");
    assert_int_equal(json_array_size(evs), 4);
    assert_string_equal(jstr(json_array_get(evs, 0), "id"), "h4");
    assert_string_equal(jstr(json_array_get(evs, 3), "id"), "h7");
    snprintf(path, sizeof path, "/v1/clusters/ch/events?since=%s", jstr(j, "last"));
    json_decref(j);
    j = get_json(H_TOK_VIEWER, path, 200);
    assert_int_equal(json_array_size(json_object_get(j, "events")), 2);
    snprintf(path, sizeof path, "/v1/clusters/ch/events?since=%s", jstr(j, "last"));
    json_decref(j);
    /* Nothing after the last one; the cursor stays. */
    j = get_json(H_TOK_VIEWER, path, 200);
    assert_int_equal(json_array_size(json_object_get(j, "events")), 0);
    json_decref(j);

    j = get_json(H_TOK_VIEWER, "/v1/clusters/empty/events", 200);
    assert_int_equal(json_array_size(json_object_get(j, "events")), 0);
    assert_true(json_is_null(json_object_get(j, "last")));
    json_decref(j);

    h_resp_t r;
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ch/events?since=abc"), 400);
    assert_string_equal(h_err_code(&r), "bad_query");
    h_resp_free(&r);
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ch/events?limit=5000"), 400);
    assert_string_equal(h_err_code(&r), "bad_query");
    h_resp_free(&r);
}

/* A GET .../events long-poll on its own thread: its answer and how long it took. */
typedef struct {
    char path[200];
    long status;
    json_t *body;
    int64_t took_ms;
} follower_t;

static void *follower_main(void *arg)
{
    follower_t *f = arg;
    int64_t t0 = h_now_ms();
    h_resp_t r;
    if (h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "%s", f->path) == 0) {
        f->status = r.status;
        f->body = h_resp_json(&r);
        h_resp_free(&r);
    }
    f->took_ms = h_now_ms() - t0;
    return NULL;
}

/* GET .../events?since=&wait=: a follower that finds nothing new waits for the next
 * event and gets it as it is recorded (not after its wait, not by polling); with
 * nothing recorded it gets an empty list when its wait ends; wait needs since. */
static void history_long_poll(void **state)
{
    (void)state;
    json_decref(post_events("lp", "[{\"id\":\"lp0\",\"type\":\"started\",\"instance\":\"i0\","
                                  "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":100}]"));
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/lp/events?limit=1", 200);
    char last[64];
    snprintf(last, sizeof last, "%s", jstr(j, "last"));
    json_decref(j);

    follower_t f = {.status = 0};
    int wait = h_ms(10000) < 30000 ? h_ms(10000) : 30000; /* the route's limit: 30 s */
    snprintf(f.path, sizeof f.path, "/v1/clusters/lp/events?since=%s&wait=%d", last, wait);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, follower_main, &f), 0);
    h_sleep_ms(300); /* parked by now (and had it answered at once, took_ms shows it) */
    int64_t posted = h_now_ms();
    json_decref(post_events("lp", "[{\"id\":\"lp1\",\"type\":\"ready\",\"instance\":\"i0\","
                                  "\"machine\":\"m1\",\"service\":\"zone\"}]"));
    pthread_join(th, NULL);
    int64_t after_post = h_now_ms() - posted;
    assert_int_equal(f.status, 200);
    assert_non_null(f.body);
    json_t *evs = json_object_get(f.body, "events");
    assert_int_equal(json_array_size(evs), 1);
    assert_string_equal(jstr(json_array_get(evs, 0), "id"), "lp1");
    assert_true(f.took_ms >= 250);           /* it waited for the event... */
    assert_true(after_post < h_ms(2000));    /* ...and was answered as it came */
    print_message("events long-poll answered %lld ms after the event was posted\n",
                  (long long)after_post);
    snprintf(last, sizeof last, "%s", jstr(f.body, "last"));
    json_decref(f.body);

    /* Nothing comes: an empty answer when the wait ends, the cursor kept. */
    follower_t g = {.status = 0};
    snprintf(g.path, sizeof g.path, "/v1/clusters/lp/events?since=%s&wait=400", last);
    follower_main(&g);
    assert_int_equal(g.status, 200);
    assert_int_equal(json_array_size(json_object_get(g.body, "events")), 0);
    assert_string_equal(jstr(g.body, "last"), last);
    assert_true(g.took_ms >= 350);
    json_decref(g.body);

    h_resp_t r;
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/lp/events?wait=100"), 400);
    assert_string_equal(h_err_code(&r), "bad_query");
    h_resp_free(&r);
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/lp/events?since=0&wait=30001"),
                     400);
    assert_string_equal(h_err_code(&r), "bad_query");
    h_resp_free(&r);
}

/* A serverdir configured with small bounds: the history stream and the stopped records
 * stay at their caps however many events arrive. */
static void history_and_stopped_bounded(void **state)
{
    const char *cfg = h_write_file(h_tmpdir(), "small.json",
                                   "{\"directory\":{\"history_max\":20,\"stopped_keep\":10}}",
                                   0644);
    const char *extra[] = {"--config", cfg, NULL};
    h_serverdir_t s2;
    assert_int_equal(h_serverdir_start(&s2, redis.url, h_tokens_file(), extra), 0);
    for (int round = 0; round < 3; round++) {
        char batch[8192];
        int n = snprintf(batch, sizeof batch, "{\"events\":[");
        for (int i = 0; i < 15; i++)
            n += snprintf(batch + n, sizeof batch - (size_t)n,
                          "%s{\"id\":\"b%d-%d\",\"type\":\"stopped\",\"instance\":\"x%d-%d\","
                          "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"drained\"}",
                          i ? "," : "", round, i, round, i);
        snprintf(batch + n, sizeof batch - (size_t)n, "]}");
        h_resp_t r;
        assert_int_equal(h_http_json("POST", s2.url, H_TOK_BB, batch, &r, "/v1/clusters/cb/events"), 0);
        assert_int_equal(r.status, 200);
        h_resp_free(&r);
    }
    redisReply *x = h_redis(&redis, "XLEN sd:{cb}:events");
    assert_int_equal(x->integer, 20);
    freeReplyObject(x);
    x = h_redis(&redis, "ZCARD sd:{cb}:stopped");
    assert_int_equal(x->integer, 10);
    freeReplyObject(x);
    x = h_redis(&redis, "EVAL %s 0", "return #redis.call('KEYS', 'sd:{cb}:proc:*')");
    assert_int_equal(x->integer, 10);
    freeReplyObject(x);
    /* The newest stopped survive; event ids expire (remembered >= 24 h). */
    x = h_redis(&redis, "EXISTS sd:{cb}:proc:x2-14");
    assert_int_equal(x->integer, 1);
    freeReplyObject(x);
    x = h_redis(&redis, "PTTL sd:{cb}:evid:b0-0");
    assert_true(x->integer > 86000LL * 1000 && x->integer <= 86400LL * 1000);
    freeReplyObject(x);
    h_serverdir_stop(&s2);

    /* Event ids must be remembered at least 24 h: a shorter setting does not start. */
    const char *dir = h_tmpdir();
    const char *bad = h_write_file(dir, "bad.json", "{\"directory\":{\"event_id_ttl_s\":60}}", 0644);
    char logpath[300];
    snprintf(logpath, sizeof logpath, "%s/bad.log", dir);
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--config", bad, "--listen", "127.0.0.1:0", NULL};
    pid_t pid = h_spawn(argv, logpath, NULL);
    int st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 100);
    char log[2048] = "";
    FILE *f = fopen(logpath, "r");
    assert_non_null(f);
    log[fread(log, 1, sizeof log - 1, f)] = '\0';
    fclose(f);
    assert_non_null(strstr(log, "field 'event_id_ttl_s' must be between 86400"));
}

/* The largest batch, 1000 events, is applied whole. */
static void batch_of_1000_accepted(void **state)
{
    size_t cap = 200000;
    char *batch = malloc(cap);
    int n = snprintf(batch, cap, "[");
    for (int i = 0; i < 1000; i++)
        n += snprintf(batch + n, cap - (size_t)n,
                      "%s{\"id\":\"big-%d\",\"type\":\"started\",\"instance\":\"big-%d\","
                      "\"machine\":\"m%d\",\"service\":\"zone\",\"pid\":%d}",
                      i ? "," : "", i, i, i % 10, 1 + i);
    snprintf(batch + n, cap - (size_t)n, "]");
    json_t *j = post_events("cbig", batch);
    free(batch);
    assert_int_equal(jint(j, "accepted"), 1000);
    json_decref(j);
    assert_int_equal(count_procs("/v1/clusters/cbig/processes"), 1000);
    assert_int_equal(count_procs("/v1/clusters/cbig/processes?machine=m3"), 100);
}

/* ---------------------------------------------------------------- bad input */

struct bad_case {
    const char *method, *path, *ctype, *body;
    long status;
    const char *code, *msg;
};

static void bad_input_is_rejected_and_changes_nothing(void **state)
{
    /* Something stored first, so "unchanged" is about a real keyspace. */
    json_decref(post_events("cx", "[{\"id\":\"ok1\",\"type\":\"started\",\"instance\":\"i1\","
                                  "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1}]"));
    char *many = malloc(200000), *huge = malloc((1 << 20) + 100);
    int n = snprintf(many, 200000, "{\"events\":[");
    for (int i = 0; i < 1001; i++)
        n += snprintf(many + n, 200000 - (size_t)n,
                      "%s{\"id\":\"k%d\",\"type\":\"ready\",\"instance\":\"i1\","
                      "\"machine\":\"m1\",\"service\":\"zone\"}", i ? "," : "", i);
    snprintf(many + n, 200000 - (size_t)n, "]}");
    memset(huge, ' ', (1 << 20) + 99);
    memcpy(huge, "{\"events\":[", 11);
    huge[(1 << 20) + 99] = '\0';

#define EV(fields) "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"instance\":\"i9\"," \
                   "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":9" fields "}]}"
#define EVP "/v1/clusters/cx/events"
    const struct bad_case cases[] = {
        {"POST", EVP, NULL, "{\"events\":[{\"id\":", 400, "bad_json", "invalid JSON"},
        {"POST", EVP, NULL, "[1,2]", 400, "bad_json", "must be a JSON object"},
        {"POST", EVP, NULL, "", 400, "bad_json", "body is required"},
        {"POST", EVP, NULL, "{}", 400, "bad_field", "field 'events' is required"},
        {"POST", EVP, NULL, "{\"events\":{}}", 400, "bad_field", "array of 1 to 1000"},
        {"POST", EVP, NULL, "{\"events\":[]}", 400, "bad_field", "array of 1 to 1000"},
        {"POST", EVP, NULL, "{\"events\":[1]}", 400, "bad_field", "events[0] must be an object"},
        {"POST", EVP, NULL, "{\"events\":[],\"x\":1}", 400, "bad_field", "unknown field 'x'"},
        {"POST", EVP, NULL, many, 400, "bad_field", "array of 1 to 1000"},
        {"POST", EVP, NULL, EV(",\"pid2\":1"), 400, "bad_field", "events[0] has an unknown field 'pid2'"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"machine\":\"m1\","
                            "\"service\":\"zone\",\"pid\":9}]}", 400, "bad_field",
         "events[0].instance is required"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\"}]}", 400, "bad_field",
         "events[0].pid is required"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":\"9\"}]}", 400,
         "bad_field", "events[0].pid must be an integer"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":99999999}]}", 400,
         "bad_field", "events[0].pid must be between 1 and 4194304"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"begun\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\"}]}", 400, "bad_field",
         "events[0].type must be started, ready, stopped, status, confirmed or released"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":7,\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\"}]}", 400, "bad_field",
         "events[0].type must be a string"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"instance\":\"a/b\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":9}]}", 400,
         "bad_field", "events[0].instance must be 1-128 characters"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x 1\",\"type\":\"started\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":9}]}", 400,
         "bad_field", "events[0].id must be"},
        {"POST", EVP, NULL, EV(",\"ports\":{\"game\":70000}"), 400, "bad_field",
         "events[0].ports.game must be between 1 and 65535"},
        {"POST", EVP, NULL, EV(",\"ports\":[1]"), 400, "bad_field", "events[0].ports must be an object"},
        {"POST", EVP, NULL, EV(",\"slot\":-1"), 400, "bad_field", "events[0].slot must be"},
        {"POST", EVP, NULL, EV(",\"reason\":\"hung\""), 400, "bad_field",
         "events[0].reason is only allowed in a stopped event"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"stopped\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\"}]}", 400, "bad_field",
         "events[0].reason is required"},
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"x1\",\"type\":\"stopped\",\"instance\":\"i9\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"bored\"}]}",
         400, "bad_field", "events[0].reason must be one of"},
        /* One good event and one bad: nothing of the batch is applied. */
        {"POST", EVP, NULL, "{\"events\":[{\"id\":\"g1\",\"type\":\"started\",\"instance\":\"i7\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":7},"
                            "{\"id\":\"g2\",\"type\":\"ready\",\"instance\":\"i7\","
                            "\"machine\":\"m1\",\"service\":\"zone\",\"signal\":9}]}", 400,
         "bad_field", "events[1].signal is only allowed in a stopped event"},
        {"POST", "/v1/clusters/bad%20name/events", NULL, EV(""), 400, "bad_name",
         "cluster name must be"},
        {"POST", "/v1/clusters/..x/events", NULL, EV(""), 400, "bad_name", "cluster name"},
        {"POST", EVP, "text/plain", EV(""), 415, "unsupported_media_type", "application/json"},
        {"POST", EVP, NULL, huge, 413, "too_large", "byte limit"},
        {"PUT", "/v1/clusters/cx/machines/m%2A1", NULL, "{}", 400, "bad_name", "machine name"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"ttl_ms\":10}", 400, "bad_field",
         "field 'ttl_ms' must be between 1000 and 300000"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"ttl_ms\":\"15000\"}", 400, "bad_field",
         "field 'ttl_ms' must be an integer"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"labels\":[\"eu\"]}", 400, "bad_field",
         "field 'labels' must be an object"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"labels\":{\"zone\":5}}", 400,
         "bad_field", "field 'labels.zone' must be a string"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"address\":\"a b\"}", 400, "bad_field",
         "field 'address' must be a host name"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"adress\":\"a\"}", 400, "bad_field",
         "unknown field 'adress'"},
        {"PUT", "/v1/clusters/cx/machines/m1", NULL, "{\"ttl_ms\":", 400, "bad_json", "invalid JSON"},
        {"PUT", "/v1/clusters/cx/machines/m1", "application/xml", "{}", 415,
         "unsupported_media_type", "application/json"},
        {"DELETE", "/v1/clusters/cx/machines/-m", NULL, NULL, 400, "bad_name", "machine name"},
        {"GET", "/v1/clusters/cx/processes/a..b", NULL, NULL, 400, "bad_name", "instance name"},
    };
    /* what these routes could write: cluster cx's keys, the cluster list, and a cluster
     * named by a bad path */
#define CX_SCOPE "sd:{cx}:*", "sd:clusters", "sd:{bad*", "sd:{..x}*"
    h_keys_t before, after;
    assert_true(h_keys_take(&redis, &before, CX_SCOPE, NULL) > 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct bad_case *c = &cases[i];
        char url[256];
        snprintf(url, sizeof url, "%s%s", sd.url, c->path);
        h_resp_t r;
        assert_int_equal(h_http(c->method, url, H_TOK_OPS, c->ctype, c->body,
                                c->body ? strlen(c->body) : 0, NULL, &r),
                         0);
        json_t *j = h_resp_json(&r);
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        if (r.status != c->status || strcmp(h_err_code(&r), c->code) || !msg ||
            !strstr(msg, c->msg))
            fail_msg("case %zu (%s %s): got %ld %s, want %ld %s '%s'", i, c->method, c->path,
                     r.status, r.body ? r.body : "", c->status, c->code, c->msg);
        json_decref(j);
        h_resp_free(&r);
        h_keys_take(&redis, &after, CX_SCOPE, NULL);
        const char *d = h_keys_diff(&before, &after);
        if (d)
            fail_msg("case %zu (%s %s) changed Redis: %s", i, c->method, c->path, d);
        h_keys_free(&after);
    }
    h_keys_free(&before);
#undef CX_SCOPE
    free(many);
    free(huge);
}

/* The "changed nothing" check itself: it sees a write inside its scope (a changed value,
 * an added key, a deleted one), not one outside it, and not a key that Redis expired. */
static void keys_check_sees_writes_and_allows_expiry(void **state)
{
    (void)state;
    h_keys_t a, b;
    freeReplyObject(h_redis(&redis, "HSET sd:{ck}:proc:i1 state ready"));
    freeReplyObject(h_redis(&redis, "SET sd:{ck}:evid:soon 1 PX 50"));
    assert_int_equal(h_keys_take(&redis, &a, "sd:{ck}:*", NULL), 2);
    freeReplyObject(h_redis(&redis, "SET sd:{other}:x 1"));
    h_sleep_ms(120);
    h_keys_take(&redis, &b, "sd:{ck}:*", NULL);
    assert_null(h_keys_diff(&a, &b));
    h_keys_free(&b);
    freeReplyObject(h_redis(&redis, "HSET sd:{ck}:proc:i1 state stopped"));
    freeReplyObject(h_redis(&redis, "SET sd:{ck}:new 1"));
    h_keys_take(&redis, &b, "sd:{ck}:*", NULL);
    const char *d = h_keys_diff(&a, &b);
    assert_non_null(d);
    assert_non_null(strstr(d, "changed sd:{ck}:proc:i1"));
    assert_non_null(strstr(d, "added sd:{ck}:new"));
    const char *nd = h_keys_names_diff(&a, &b); /* the same buffer as d: d is read */
    assert_non_null(nd);
    assert_null(strstr(nd, "proc:i1"));
    h_keys_free(&b);
    freeReplyObject(h_redis(&redis, "DEL sd:{ck}:proc:i1 sd:{ck}:new"));
    freeReplyObject(h_redis(&redis, "DEL sd:{other}:x"));
    h_keys_take(&redis, &b, "sd:{ck}:*", NULL);
    assert_non_null(strstr(h_keys_diff(&a, &b), "removed sd:{ck}:proc:i1"));
    h_keys_free(&a);
    h_keys_free(&b);
}

/* ---------------------------------------------------------------- auth */

static void auth_roles(void **state)
{
    const char *ev = "{\"events\":[{\"id\":\"a1\",\"type\":\"started\",\"instance\":\"i1\","
                     "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1}]}";
    h_keys_t before, after;
    h_keys_take(&redis, &before, "sd:{ca}:*", "sd:clusters", NULL);
    h_resp_t r;
    assert_int_equal(req("POST", NULL, ev, &r, "/v1/clusters/ca/events"), 401);
    assert_string_equal(h_err_code(&r), "unauthorized");
    h_resp_free(&r);
    assert_int_equal(req("POST", "not-a-token-at-all", ev, &r, "/v1/clusters/ca/events"), 401);
    assert_string_equal(h_err_code(&r), "unauthorized");
    h_resp_free(&r);
    assert_int_equal(req("GET", NULL, NULL, &r, "/v1/clusters/ca/processes"), 401);
    h_resp_free(&r);
    assert_int_equal(req("POST", H_TOK_VIEWER, ev, &r, "/v1/clusters/ca/events"), 403);
    assert_string_equal(h_err_code(&r), "forbidden");
    h_resp_free(&r);
    assert_int_equal(req("POST", H_TOK_GAME, ev, &r, "/v1/clusters/ca/events"), 403);
    h_resp_free(&r);
    assert_int_equal(req("PUT", H_TOK_VIEWER, "{}", &r, "/v1/clusters/ca/machines/m1"), 403);
    h_resp_free(&r);
    assert_int_equal(req("DELETE", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ca/machines/m1"), 403);
    h_resp_free(&r);
    h_keys_take(&redis, &after, "sd:{ca}:*", "sd:clusters", NULL);
    h_keys_same(&before, &after, "refused requests");

    assert_int_equal(req("POST", H_TOK_BB, ev, &r, "/v1/clusters/ca/events"), 200);
    h_resp_free(&r);
    assert_int_equal(req("POST", H_TOK_OPS, ev, &r, "/v1/clusters/ca/events"), 200);
    h_resp_free(&r);
    assert_int_equal(req("GET", H_TOK_VIEWER, NULL, &r, "/v1/clusters/ca/processes"), 200);
    h_resp_free(&r);
    assert_int_equal(req("GET", H_TOK_BB, NULL, &r, "/v1/clusters/ca/machines"), 200);
    h_resp_free(&r);
}

static long status_with(const char *url, const char *token)
{
    h_resp_t r;
    if (h_http_json("GET", url, token, NULL, &r, "/v1/clusters/ct/processes"))
        return -1;
    long st = r.status;
    h_resp_free(&r);
    return st;
}

struct tok_wait {
    const char *url, *token;
    long want;
};

static int token_status_is(void *arg)
{
    struct tok_wait *w = arg;
    return status_with(w->url, w->token) == w->want;
}

static void token_file_reloaded_on_sighup(void **state)
{
    const char *dir = h_tmpdir();
    const char *path = h_write_file(dir, "tokens", "viewer old-viewer-token-0001\n", 0600);
    h_serverdir_t s2;
    assert_int_equal(h_serverdir_start(&s2, redis.url, path, NULL), 0);
    assert_int_equal(status_with(s2.url, "old-viewer-token-0001"), 200);
    assert_int_equal(status_with(s2.url, "new-viewer-token-0002"), 401);

    h_write_file(dir, "tokens", "viewer new-viewer-token-0002\n", 0600);
    kill(s2.pid, SIGHUP);
    struct tok_wait w = {s2.url, "new-viewer-token-0002", 200};
    assert_true(h_wait_until(token_status_is, &w, 5000));
    assert_int_equal(status_with(s2.url, "old-viewer-token-0001"), 401);
    h_serverdir_stop(&s2);
}

/* ---------------------------------------------------------------- Redis outage */

#define OUTAGE_EVENT                                                                       \
    "{\"events\":[{\"id\":\"r1\",\"type\":\"started\",\"instance\":\"i1\","           \
    "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1}]}"

/* Each worker thread reconnects on its own (at most every 200 ms), so a client retries
 * after a 503 as Retry-After says: wait until the write goes through. */
static int post_succeeds(void *unused)
{
    h_resp_t r;
    if (h_http_json("POST", sd.url, H_TOK_BB, OUTAGE_EVENT, &r, "/v1/clusters/cr/events"))
        return 0;
    int ok = r.status == 200;
    h_resp_free(&r);
    return ok;
}

static int reads_succeed(void *unused)
{
    int ok = 1;
    for (int i = 0; i < 8; i++) {
        h_resp_t r;
        if (h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/clusters/cr/processes/i1"))
            return 0;
        ok &= r.status == 200;
        h_resp_free(&r);
    }
    return ok;
}

static void redis_outage_gives_503_then_recovers(void **state)
{
    const char *ev = OUTAGE_EVENT;
    h_redis_down(&redis);

    struct {
        const char *method, *path, *body;
    } calls[] = {
        {"POST", "/v1/clusters/cr/events", ev},
        {"GET", "/v1/clusters/cr/processes", NULL},
        {"GET", "/v1/clusters/cr/processes/i1", NULL},
        {"GET", "/v1/clusters/cr/events", NULL},
        {"PUT", "/v1/clusters/cr/machines/m1", "{}"},
        {"GET", "/v1/clusters/cr/machines", NULL},
        {"DELETE", "/v1/clusters/cr/machines/m1", NULL},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        h_resp_t r;
        assert_int_equal(req(calls[i].method, H_TOK_OPS, calls[i].body, &r, calls[i].path), 503);
        assert_string_equal(h_err_code(&r), "store_unavailable");
        char ra[16];
        assert_int_equal(h_resp_header(&r, "Retry-After", ra, sizeof ra), 0);
        h_resp_free(&r);
    }
    assert_false(h_exited(sd.pid, NULL));

    assert_int_equal(h_redis_up(&redis), 0);
    assert_true(h_wait_until(post_succeeds, NULL, 5000));
    /* A worker that held a connection through the outage finds it broken on its next
     * request (one 503) and reconnects: soon a run of reads all succeed. */
    assert_true(h_wait_until(reads_succeed, NULL, 5000));
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/cr/processes/i1", 200);
    assert_string_equal(jstr(j, "state"), "starting");
    json_decref(j);
}

/* ---------------------------------------------------------------- libsdclient */

static void sdclient_typed_calls_and_failover(void **state)
{
    char urls[300];
    snprintf(urls, sizeof urls, "http://127.0.0.1:%d,%s", h_free_port(), sd.url);
    /* The URL list is shuffled per client: several clients cover both orders. */
    for (int round = 0; round < 6; round++) {
        sdc_t *c = sdc_new(urls, H_TOK_OPS, h_ms(3000));
        assert_non_null(c);
        sdc_err_t err = {0};
        json_t *labels = json_pack("{s:s}", "zone", "eu");
        sdc_machine_lease_t lease = {.address = "10.0.0.9", .labels = labels, .capacity = 10,
                                     .version = "0.1.0", .ttl_ms = 20000};
        int64_t left = 0, reg = 0, reg2 = 0;
        assert_int_equal(sdc_machine_put(c, "cs", "m1", &lease, &left, &reg, &err), SDC_OK);
        json_decref(labels);
        assert_int_equal(left, 20000);
        assert_true(reg > 0);
        assert_int_equal(sdc_machine_put(c, "cs", "m1", NULL, NULL, &reg2, &err), SDC_OK);
        assert_int_equal(reg2, reg); /* a renewal: the same registration */
        json_t *out = NULL;
        assert_int_equal(sdc_machine_get(c, "cs", "m1", &out, &err), SDC_OK);
        assert_string_equal(jstr(out, "address"), "10.0.0.9");
        json_decref(out);
        assert_int_equal(sdc_machines_list(c, "cs", &out, &err), SDC_OK);
        assert_int_equal(json_array_size(json_object_get(out, "machines")), 1);
        json_decref(out);

        char ev[512];
        snprintf(ev, sizeof ev,
                 "[{\"id\":\"sc-%d\",\"type\":\"started\",\"instance\":\"s%d\",\"machine\":\"m1\","
                 "\"service\":\"zone\",\"pid\":%d}]", round, round, 10 + round);
        json_t *evs = json_loads(ev, 0, NULL);
        int acc = -1, dup = -1;
        assert_int_equal(sdc_events_post(c, "cs", evs, &acc, &dup, &err), SDC_OK);
        assert_int_equal(acc, 1);
        assert_int_equal(sdc_events_post(c, "cs", evs, &acc, &dup, &err), SDC_OK);
        assert_int_equal(dup, 1);
        json_decref(evs);

        sdc_proc_filter_t f = {.machine = "m1", .service = "zone"};
        assert_int_equal(sdc_processes_list(c, "cs", &f, &out, &err), SDC_OK);
        assert_int_equal(json_array_size(json_object_get(out, "processes")), round + 1);
        json_decref(out);
        char inst[16];
        snprintf(inst, sizeof inst, "s%d", round);
        assert_int_equal(sdc_process_get(c, "cs", inst, &out, &err), SDC_OK);
        assert_int_equal(jint(out, "pid"), 10 + round);
        json_decref(out);
        assert_int_equal(sdc_events_list(c, "cs", NULL, 1, &out, &err), SDC_OK);
        assert_int_equal(json_array_size(json_object_get(out, "events")), 1);
        json_decref(out);

        assert_int_equal(sdc_process_get(c, "cs", "nope", &out, &err), SDC_E_HTTP);
        assert_int_equal(err.status, 404);
        assert_string_equal(err.code, "not_found");
        sdc_err_clear(&err);
        assert_int_equal(sdc_process_get(c, "cs", "a/b", &out, &err), SDC_E_INVAL);
        assert_int_equal(sdc_machine_delete(c, "cs", "m1", &err), SDC_OK);
        sdc_free(c);
    }
}

/* No request walks a whole set: 100,000 live processes; every page of the largest size
 * (5000) and the filtered lists a whole-set read would answer (state=...) are walked,
 * and no Redis command takes 5 ms or more (slowlog_check; a script reading the whole set
 * takes 40 ms for ?limit=10, 450 ms for ?state=starting). A
 * process stopped in the middle of a walk is not seen twice and none is missed. */
typedef struct {
    volatile int stop;
    int n;
    int64_t us[4096];
} getter_t;

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* GETs one process over and over until told to stop, timing each. */
static void *getter_main(void *arg)
{
    getter_t *g = arg;
    while (!g->stop && g->n < (int)(sizeof g->us / sizeof g->us[0])) {
        h_resp_t r;
        int64_t t0 = mono_us();
        int rc = h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "%s",
                             "/v1/clusters/c100k/processes/p000123");
        int64_t dt = mono_us() - t0;
        if (rc == 0 && r.status == 200)
            g->us[g->n++] = dt;
        h_resp_free(&r);
    }
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Starts counting Redis's script time on the node that holds key's slot (and logs the
 * commands over 5 ms, for the reader): see slowlog_check. */
static void slowlog_begin(const char *key)
{
    assert_int_equal(h_redis_route(&redis, key), 0);
    freeReplyObject(h_redis(&redis, "CONFIG SET slowlog-log-slower-than 5000"));
    freeReplyObject(h_redis(&redis, "CONFIG SET slowlog-max-len 1024"));
    freeReplyObject(h_redis(&redis, "SLOWLOG RESET"));
    freeReplyObject(h_redis(&redis, "CONFIG RESETSTAT"));
}

/* No script call grows with the total: the mean time Redis spent in one (INFO
 * commandstats, every script run since slowlog_begin) stays under a bound that a call
 * walking the whole cluster (40-450 ms at these sizes) is far above. The mean, not the
 * slowest call: on a busy machine any command can be preempted for tens of milliseconds
 * (the SLOWLOG shows them, for the reader). */
static void slowlog_check(void)
{
    long long usec = 0, calls = h_redis_script_calls(&redis, &usec);
    redisReply *r = h_redis(&redis, "SLOWLOG GET 1024");
    for (size_t i = 0; i < r->elements && i < 5; i++) {
        redisReply *e = r->element[i];
        fprintf(stderr, "slow: %lld us:", e->element[2]->integer);
        for (size_t k = 0; k < e->element[3]->elements && k < 10; k++)
            fprintf(stderr, " %.40s", e->element[3]->element[k]->str);
        fprintf(stderr, "\n");
    }
    long long mean = calls ? usec / calls : 0;
    fprintf(stderr, "scripts: %lld calls, %lld us in Redis, %lld us a call; %zu commands over 5 ms\n",
            calls, usec, mean, r->elements);
    freeReplyObject(r);
    assert_true(calls > 0);
    assert_true(mean < 8000);
    freeReplyObject(h_redis(&redis, "CONFIG SET slowlog-log-slower-than 10000"));
}

static void lists_at_100k_stay_cheap(void **state)
{
    /* under the sanitizers 20,000, under valgrind 12,000 (three pages of the largest size:
     * the last instance, stopped after the second, is on the third):
     * the writes through an ASan or valgrind'd serverdir are what takes the time there
     * (40 s and two minutes for 100,000), and the pages and filters are the same code;
     * the plain stage checks the cost at 100,000 */
    const int N = h_valgrind() ? 12000 : h_sanitized() ? 20000 : 100000;
    size_t cap = 200000;
    char *batch = malloc(cap);
    for (int b = 0; b < N / 1000; b++) {
        int n = snprintf(batch, cap, "[");
        for (int i = 0; i < 1000; i++) {
            int k = b * 1000 + i;
            n += snprintf(batch + n, cap - (size_t)n,
                          "%s{\"id\":\"h-%d\",\"type\":\"%s\",\"instance\":\"p%06d\","
                          "\"machine\":\"m%d\",\"service\":\"s%d\",\"pid\":%d}",
                          i ? "," : "", k, k % 3 ? "started" : "ready", k, k % 100, k % 7, 1 + k);
        }
        snprintf(batch + n, cap - (size_t)n, "]");
        json_t *j = post_events("c100k", batch);
        assert_int_equal(jint(j, "accepted"), 1000);
        json_decref(j);
    }
    free(batch);
    slowlog_begin("sd:{c100k}:live");

    /* single-process GETs answered while pages of the largest size are being built, against
     * the same GETs just before with nothing else running: a page script that blocked Redis
     * for the whole set (40-450 ms) would hold every GET behind it, while on a busy machine
     * both medians move together */
    static getter_t g0, g;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, getter_main, &g0), 0);
    h_sleep_ms(300);
    g0.stop = 1;
    pthread_join(th, NULL);
    assert_true(g0.n >= 5);
    qsort(g0.us, (size_t)g0.n, sizeof g0.us[0], cmp_i64);
    assert_int_equal(pthread_create(&th, NULL, getter_main, &g), 0);
    for (int i = 0; i < 4; i++) {
        json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/c100k/processes?limit=5000", 200);
        assert_int_equal(json_array_size(json_object_get(j, "processes")), 5000);
        json_decref(j);
    }
    g.stop = 1;
    pthread_join(th, NULL);
    assert_true(g.n >= 5);
    qsort(g.us, (size_t)g.n, sizeof g.us[0], cmp_i64);
    fprintf(stderr, "GET during 5000-record pages: %d calls, median %lld us, max %lld us; "
            "alone: median %lld us\n", g.n, (long long)g.us[g.n / 2], (long long)g.us[g.n - 1],
            (long long)g0.us[g0.n / 2]);
    /* under valgrind serverdir's own work dominates a GET: the bar is Redis not blocking */
    assert_true(g.us[g.n / 2] < 4 * g0.us[g0.n / 2] + (h_valgrind() ? 50000 : 5000));

    /* the whole directory in pages of 5000, a process stopped meanwhile */
    static unsigned char seen[100000];
    memset(seen, 0, sizeof seen);
    char url[256], after[64] = "";
    int pages = 0, total = 0;
    for (;;) {
        snprintf(url, sizeof url, "/v1/clusters/c100k/processes?limit=5000%s%s",
                 after[0] ? "&after=" : "", after);
        json_t *j = get_json(H_TOK_VIEWER, url, 200);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(j, "processes"), i, p) {
            int k = atoi(jstr(p, "instance") + 1);
            assert_false(seen[k]);
            seen[k] = 1;
            total++;
        }
        if (pages == 1) { /* the last instance's page is still to come */
            char stop[256];
            snprintf(stop, sizeof stop,
                     "[{\"id\":\"stop-last\",\"type\":\"stopped\",\"instance\":\"p%06d\","
                     "\"machine\":\"m%d\",\"service\":\"s%d\",\"reason\":\"killed\"}]",
                     N - 1, (N - 1) % 100, (N - 1) % 7);
            json_decref(post_events("c100k", stop));
        }
        pages++;
        json_t *next = json_object_get(j, "next");
        if (!json_is_string(next)) {
            json_decref(j);
            break;
        }
        snprintf(after, sizeof after, "%s", json_string_value(next));
        json_decref(j);
        assert_true(pages <= 20);
    }
    assert_int_equal(total, N - 1); /* all but the one stopped before its page came */
    assert_false(seen[N - 1]);

    /* the filters a whole-set read would answer */
    static const char *const paths[] = {
        "/v1/clusters/c100k/processes?state=starting&limit=10",
        "/v1/clusters/c100k/processes?state=ready&limit=5000",
        "/v1/clusters/c100k/processes?machine=m7&service=s3&limit=5000",
        "/v1/clusters/c100k/processes?service=s2&state=ready&limit=5000",
        "/v1/clusters/c100k/processes?limit=10",
        NULL};
    for (const char *const *pp = paths; *pp; pp++) {
        json_t *j = get_json(H_TOK_VIEWER, *pp, 200);
        assert_true(json_array_size(json_object_get(j, "processes")) > 0);
        json_decref(j);
    }
    slowlog_check();
}

/* A directory written before the paged lists (its live instances in the sets live,
 * live:m:<m>, live:s:<s>) is moved to the sorted-set indexes the first time a list is
 * asked for, then listed as before; a stopped one left in the old sets is not. */
static void old_live_sets_are_migrated(void **state)
{
    for (int i = 0; i < 1200; i++) {
        const char *st = i == 7 ? "stopped" : i % 2 ? "ready" : "starting";
        freeReplyObject(h_redis(&redis, "HSET sd:{cmig}:proc:o%04d instance o%04d machine m%d service zone state %s generation 1",
                                i, i, i % 3, st));
        freeReplyObject(h_redis(&redis, "SADD sd:{cmig}:live o%04d", i));
        freeReplyObject(h_redis(&redis, "SADD sd:{cmig}:live:m:m%d o%04d", i % 3, i));
        freeReplyObject(h_redis(&redis, "SADD sd:{cmig}:live:s:zone o%04d", i));
    }
    assert_int_equal(count_procs("/v1/clusters/cmig/processes?machine=m1"), 399); /* o0007 stopped */
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/cmig/processes?limit=5000", 200);
    assert_int_equal(json_array_size(json_object_get(j, "processes")), 1199);
    json_decref(j);
    redisReply *r = h_redis(&redis, "EXISTS sd:{cmig}:live sd:{cmig}:live:m:m1 sd:{cmig}:live:s:zone");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    r = h_redis(&redis, "GET sd:{cmig}:ixv");
    assert_string_equal(r->str, "1");
    freeReplyObject(r);
}

static int nolead_stopped(void *arg)
{
    (void)arg;
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/nolead/processes?machine=m1", 200);
    int n = (int)json_array_size(json_object_get(j, "processes"));
    json_decref(j);
    return n == 0;
}

/* A cluster without a primary (static services), its machine's lease
 * runs out: a serverdir copy's sweep marks the machine's live processes stopped with
 * reason machine_lost (once; the other machine's are untouched), as a primary would. */
static void machine_lost_without_primary(void **state)
{
    h_resp_t r;
    assert_int_equal(req("PUT", H_TOK_BB, "{\"ttl_ms\":1000}", &r, "/v1/clusters/nolead/machines/m1"), 200);
    h_resp_free(&r);
    assert_int_equal(req("PUT", H_TOK_BB, "{\"ttl_ms\":60000}", &r, "/v1/clusters/nolead/machines/m2"), 200);
    h_resp_free(&r);
    json_t *j = post_events(
        "nolead",
        "[{\"id\":\"n1\",\"type\":\"started\",\"instance\":\"zone-1\",\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1},"
        "{\"id\":\"n2\",\"type\":\"ready\",\"instance\":\"zone-1\",\"machine\":\"m1\",\"service\":\"zone\"},"
        "{\"id\":\"n3\",\"type\":\"started\",\"instance\":\"zone-2\",\"machine\":\"m1\",\"service\":\"zone\",\"pid\":2},"
        "{\"id\":\"n4\",\"type\":\"started\",\"instance\":\"zone-3\",\"machine\":\"m2\",\"service\":\"zone\",\"pid\":3}]");
    assert_int_equal(jint(j, "accepted"), 4);
    json_decref(j);
    assert_true(h_wait_until(nolead_stopped, NULL, h_valgrind() ? 20000 : 6000));
    j = get_json(H_TOK_VIEWER, "/v1/clusters/nolead/processes/zone-1", 200);
    assert_string_equal(jstr(j, "state"), "stopped");
    assert_string_equal(jstr(j, "reason"), "machine_lost");
    assert_non_null(strstr(jstr(j, "detail"), "no primary"));
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/nolead/processes/zone-3", 200);
    assert_string_equal(jstr(j, "state"), "starting");
    json_decref(j);
    /* once: the history has two machine_lost stops, not more, a while later */
    h_sleep_ms(1500); /* the sweep runs every second: two more rounds must add nothing */
    j = get_json(H_TOK_VIEWER, "/v1/clusters/nolead/events?limit=100", 200);
    int lost = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(j, "events"), i, e) {
        const char *reason = json_string_value(json_object_get(e, "reason"));
        lost += reason && !strcmp(reason, "machine_lost");
    }
    json_decref(j);
    assert_int_equal(lost, 2);
}

static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* serverdir paused past a machine's lease (the primary's lease ran out too): when it
 * runs again it sweeps no machine before a whole lease of it has passed, so a machine
 * that renews in that time keeps its processes (the old sweep marked them machine_lost
 * in its first round after the pause, before the machine could renew). */
static void paused_serverdir_sweeps_no_machine_at_once(void **state)
{
    (void)state;
    int ttl = h_valgrind() ? 12000 : 3000;
    h_resp_t r;
    char body[64];
    snprintf(body, sizeof body, "{\"ttl_ms\":%d}", ttl);
    assert_int_equal(req("PUT", H_TOK_BB, body, &r, "/v1/clusters/napped/machines/m1"), 200);
    h_resp_free(&r);
    json_t *j = post_events(
        "napped",
        "[{\"id\":\"p1\",\"type\":\"started\",\"instance\":\"zone-1\",\"machine\":\"m1\",\"service\":\"zone\",\"pid\":1}]");
    assert_int_equal(jint(j, "accepted"), 1);
    json_decref(j);
    kill(sd.pid, SIGSTOP);
    h_sleep_ms(ttl + 1500);
    kill(sd.pid, SIGCONT);
    h_sleep_ms(h_valgrind() ? 4000 : 1500); /* a sweep round, or more, after the pause */
    j = get_json(H_TOK_VIEWER, "/v1/clusters/napped/processes/zone-1", 200);
    assert_string_equal(jstr(j, "state"), "starting");
    json_decref(j);
    assert_int_equal(req("PUT", H_TOK_BB, body, &r, "/v1/clusters/napped/machines/m1"), 200);
    h_resp_free(&r);
    assert_true(file_has(sd.log, "lost-machine sweep held"));
    h_sleep_ms(ttl / 2 + 1500); /* past the hold: the machine renewed, nothing is swept */
    j = get_json(H_TOK_VIEWER, "/v1/clusters/napped/processes/zone-1", 200);
    assert_string_equal(jstr(j, "state"), "starting");
    json_decref(j);
}

/* Walks the pages of `path` (a list of `list` objects named by `key`) of `limit`: each
 * page at most limit long, names in order and never repeated, at most max_pages pages.
 * Returns the names seen; *pages and prev (the last name, 64 bytes) are set. */
static int walk_named_pages(const char *path, const char *list, const char *key, int limit,
                            int max_pages, int *pages, char *prev)
{
    char url[256], after[64] = "";
    int total = 0;
    prev[0] = '\0';
    *pages = 0;
    for (;;) {
        snprintf(url, sizeof url, "%s?limit=%d%s%s", path, limit, after[0] ? "&after=" : "",
                 after);
        json_t *j = get_json(H_TOK_VIEWER, url, 200);
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(j, list), i, o) {
            assert_true(strcmp(jstr(o, key), prev) > 0); /* name order, no repeat */
            snprintf(prev, 64, "%s", jstr(o, key));
            if (json_object_get(o, "state"))
                assert_string_equal(jstr(o, "state"), "live");
            total++;
        }
        assert_true(json_array_size(json_object_get(j, list)) <= (size_t)limit);
        (*pages)++;
        json_t *next = json_object_get(j, "next");
        if (!json_is_string(next)) {
            json_decref(j);
            return total;
        }
        snprintf(after, sizeof after, "%s", json_string_value(next));
        json_decref(j);
        assert_true(*pages <= max_pages);
    }
}

/* GET /machines and /services are paged along their name indexes (mix, six): 20,000
 * machines (written before the index existed, then indexed once) come in pages of 1000
 * in name order with no call over the SLOWLOG bar; libsdclient walks every page; 120
 * services in pages of 50; bad cursors and sizes are refused. */
static void machines_and_services_are_paged(void **state)
{
    (void)state;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    assert_int_equal(h_redis_route(&redis, "sd:{cpg}:machines"), 0); /* pipelined below */
    for (int i = 0; i < 20000; i++)
        redisAppendCommand(redis.ctl, "HSET sd:{cpg}:machine:m%05d registered_at_ms %lld "
                                      "renewed_at_ms %lld expires_at_ms %lld ttl_ms 600000 "
                                      "address 10.1.%d.%d",
                           i, now, now, now + 600000, i / 250, i % 250);
    for (int i = 0; i < 20000; i++)
        redisAppendCommand(redis.ctl, "SADD sd:{cpg}:machines m%05d", i);
    for (int i = 0; i < 40000; i++) {
        redisReply *x = NULL;
        assert_int_equal(redisGetReply(redis.ctl, (void **)&x), REDIS_OK);
        freeReplyObject(x);
    }
    h_resp_t r;
    for (int i = 0; i < 3; i++) { /* registered through the API: in the index at once */
        assert_int_equal(req("PUT", H_TOK_BB, "{\"ttl_ms\":300000}", &r,
                             i == 0 ? "/v1/clusters/cpg/machines/a-first"
                             : i == 1 ? "/v1/clusters/cpg/machines/m10000x"
                                      : "/v1/clusters/cpg/machines/z-last"),
                         200);
        h_resp_free(&r);
    }
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/cpg/machines?limit=1", 200); /* indexes */
    assert_string_equal(jstr(json_array_get(json_object_get(j, "machines"), 0), "machine"),
                        "a-first");
    json_decref(j);

    slowlog_begin("sd:{cpg}:machines");
    char prev[64];
    int pages, total = walk_named_pages("/v1/clusters/cpg/machines", "machines", "machine", 1000,
                                        30, &pages, prev);
    assert_int_equal(total, 20003);
    assert_string_equal(prev, "z-last");
    slowlog_check();

    sdc_t *c = sdc_new(sd.url, H_TOK_VIEWER, h_ms(3000));
    sdc_err_t err;
    json_t *out = NULL;
    assert_int_equal(sdc_machines_list(c, "cpg", &out, &err), SDC_OK);
    assert_int_equal(json_array_size(json_object_get(out, "machines")), 20003);
    json_decref(out);

    /* a deleted machine leaves the index */
    assert_int_equal(req("DELETE", H_TOK_OPS, NULL, &r, "/v1/clusters/cpg/machines/a-first"), 204);
    h_resp_free(&r);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/cpg/machines?limit=1", 200);
    assert_string_equal(jstr(json_array_get(json_object_get(j, "machines"), 0), "machine"),
                        "m00000");
    json_decref(j);

    /* services */
    for (int i = 0; i < 120; i++) {
        char path[96];
        snprintf(path, sizeof path, "/v1/clusters/cpg/services/svc%03d", i);
        assert_int_equal(req("PUT", H_TOK_OPS,
                             "{\"command\":\"/usr/bin/gameproc\",\"count\":1}", &r, path),
                         200);
        h_resp_free(&r);
    }
    total = walk_named_pages("/v1/clusters/cpg/services", "services", "service", 50, 5, &pages,
                             prev);
    assert_int_equal(total, 120);
    assert_int_equal(pages, 3);
    assert_int_equal(sdc_services_list(c, "cpg", &out, &err), SDC_OK);
    assert_int_equal(json_array_size(json_object_get(out, "services")), 120);
    json_decref(out);
    sdc_free(c);

    j = get_json(H_TOK_VIEWER, "/v1/clusters/cpg/machines?after=%2Fbad", 400);
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/cpg/machines?limit=1001", 400);
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/cpg/services?limit=501", 400);
    json_decref(j);
}

/* One walk of GET .../state in pages of `limit`: counts the services, machines and
 * assignment documents seen (each once) and the pages, and the most big documents (those
 * whose name starts with "big") one page held. */
typedef struct {
    int services, machines, assignments, pages, big_per_page;
} state_walk_t;

/* Records name of part (s, m, a) in seen, asserting it was not there; returns 1. */
static int seen_once(json_t *seen, char part, const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "%c:%s", part, name);
    assert_null(json_object_get(seen, key));
    json_object_set_new(seen, key, json_true());
    return 1;
}

static void walk_state(const char *cluster, int limit, state_walk_t *w)
{
    memset(w, 0, sizeof *w);
    char url[256], after[128] = "";
    json_t *seen = json_object();
    for (;;) {
        snprintf(url, sizeof url, "/v1/clusters/%s/state?limit=%d%s%s", cluster, limit,
                 after[0] ? "&after=" : "", after);
        json_t *j = get_json(H_TOK_VIEWER, url, 200);
        json_t *svcs = json_object_get(j, "services"), *machs = json_object_get(j, "machines");
        json_t *docs = json_object_get(j, "assignments");
        assert_true(json_array_size(svcs) + json_array_size(machs) + json_object_size(docs) <=
                    (size_t)limit);
        size_t i;
        json_t *o;
        const char *k;
        json_array_foreach(svcs, i, o)
            w->services += seen_once(seen, 's', jstr(o, "service"));
        json_array_foreach(machs, i, o)
            w->machines += seen_once(seen, 'm', jstr(o, "machine"));
        int big = 0;
        json_object_foreach(docs, k, o) {
            w->assignments += seen_once(seen, 'a', k);
            big += strncmp(k, "big", 3) == 0;
        }
        if (big > w->big_per_page)
            w->big_per_page = big;
        w->pages++;
        json_t *next = json_object_get(j, "next");
        if (!json_is_string(next)) {
            json_decref(j);
            break;
        }
        assert_true(strlen(json_string_value(next)) < sizeof after);
        snprintf(after, sizeof after, "%s", json_string_value(next));
        json_decref(j);
        assert_true(w->pages <= 100);
    }
    json_decref(seen);
}

/* GET .../state, what the primary reads every round, is paged too (no script reads
 * every service, machine and assignment document at once). 20,000 machines (2600
 * under valgrind and the sanitizers) with
 * a lease and an assignment document (written before the index aix existed), 4 documents
 * of 10,000 slots (about 480 KB each) and 30 services: walked in pages of at most 5000
 * records and about 1 MiB, no Redis command over the SLOWLOG bar; libsdclient merges the
 * pages; without limit or after, a cluster this large is refused (400 page_required)
 * rather than read in one script; bad cursors are refused. */
static void state_is_paged(void **state)
{
    (void)state;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    /* under valgrind and the sanitizers 2600 (still more than one answer may hold): the
     * pages are the same code, and the plain stage checks the cost at 20,000 */
    const int N = h_valgrind() || h_sanitized() ? 2600 : 20000;
    assert_int_equal(h_redis_route(&redis, "sd:{cst}:machines"), 0); /* pipelined below */
    for (int i = 0; i < N; i++) {
        redisAppendCommand(redis.ctl, "HSET sd:{cst}:machine:m%05d registered_at_ms %lld "
                                      "renewed_at_ms %lld expires_at_ms %lld ttl_ms 600000 "
                                      "address 10.2.%d.%d",
                           i, now, now, now + 600000, i / 250, i % 250);
        redisAppendCommand(redis.ctl, "SADD sd:{cst}:machines m%05d", i);
        redisAppendCommand(redis.ctl, "HSET sd:{cst}:assign:m%05d slots %s version 1 epoch 1", i,
                           "[{\"service\":\"zone\",\"slot\":1,\"spec_version\":1}]");
        redisAppendCommand(redis.ctl, "SADD sd:{cst}:assign:machines m%05d", i);
    }
    size_t bigcap = 10000 * 64 + 16;
    char *big = malloc(bigcap);
    size_t n = (size_t)snprintf(big, bigcap, "[");
    for (int k = 0; k < 10000; k++)
        n += (size_t)snprintf(big + n, bigcap - n, "%s{\"service\":\"zone\",\"slot\":%d,\"spec_version\":1}",
                              k ? "," : "", k);
    snprintf(big + n, bigcap - n, "]");
    for (int i = 0; i < 4; i++) {
        redisAppendCommand(redis.ctl, "HSET sd:{cst}:assign:big%d slots %s version 1 epoch 1", i, big);
        redisAppendCommand(redis.ctl, "SADD sd:{cst}:assign:machines big%d", i);
    }
    free(big);
    for (int i = 0; i < 4 * N + 8; i++) {
        redisReply *x = NULL;
        assert_int_equal(redisGetReply(redis.ctl, (void **)&x), REDIS_OK);
        freeReplyObject(x);
    }
    h_resp_t r;
    for (int i = 0; i < 30; i++) {
        char path[96];
        snprintf(path, sizeof path, "/v1/clusters/cst/services/svc%03d", i);
        assert_int_equal(req("PUT", H_TOK_OPS, "{\"command\":\"/usr/bin/gameproc\",\"count\":1}",
                             &r, path),
                         200);
        h_resp_free(&r);
    }

    /* too large for one answer */
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/cst/state", 400);
    assert_string_equal(jstr(json_object_get(j, "error"), "code"), "page_required");
    json_decref(j);

    state_walk_t w;
    walk_state("cst", 5000, &w); /* the first walk builds the indexes (once) */
    slowlog_begin("sd:{cst}:machines");
    walk_state("cst", 5000, &w);
    slowlog_check();
    assert_int_equal(w.services, 30);
    assert_int_equal(w.machines, N);
    assert_int_equal(w.assignments, N + 4);
    assert_true(w.pages >= (2 * N + 34 + 4999) / 5000); /* pages of at most 5000 records */
    /* 480 KB each: a page ends after the one that crosses 1 MiB (the second or the third,
     * as the machines before them on the page weigh) */
    assert_in_range(w.big_per_page, 2, 3);
    walk_state("cst", 997, &w);        /* pages that end inside a part and cross into the next */
    assert_int_equal(w.services + w.machines + w.assignments, 30 + 2 * N + 4);

    sdc_t *c = sdc_new(sd.url, H_TOK_VIEWER, h_ms(5000));
    sdc_err_t err;
    json_t *out = NULL;
    assert_int_equal(sdc_state_get(c, "cst", &out, &err), SDC_OK);
    assert_int_equal(json_array_size(json_object_get(out, "services")), 30);
    assert_int_equal(json_array_size(json_object_get(out, "machines")), N);
    assert_int_equal(json_object_size(json_object_get(out, "assignments")), N + 4);
    json_t *doc = json_object_get(json_object_get(out, "assignments"), "big3");
    assert_int_equal(json_array_size(json_object_get(doc, "slots")), 10000);
    assert_null(json_object_get(out, "next"));
    json_decref(out);
    sdc_free(c);

    static const char *const bad[] = {"/v1/clusters/cst/state?after=x:m00001",
                                      "/v1/clusters/cst/state?after=m",
                                      "/v1/clusters/cst/state?after=m:%2Fbad",
                                      "/v1/clusters/cst/state?limit=0",
                                      "/v1/clusters/cst/state?limit=5001", NULL};
    for (const char *const *p = bad; *p; p++) {
        j = get_json(H_TOK_VIEWER, *p, 400);
        assert_string_equal(jstr(json_object_get(j, "error"), "code"), "bad_query");
        json_decref(j);
    }
}

/* ---------- group commit ---------- */

#define GB_THREADS 48
#define GB_ROUNDS 3

/* One sender of the burst: its batches, one after another, and their answers. */
typedef struct {
    pthread_barrier_t *go;
    int t;
    char *body[GB_ROUNDS];
    long status[GB_ROUNDS];
    long long got[GB_ROUNDS][3]; /* accepted, duplicates, stale */
} gb_t;

static void *gb_sender(void *arg)
{
    gb_t *g = arg;
    char url[256];
    snprintf(url, sizeof url, "%s/v1/clusters/gb/events", sd.url);
    pthread_barrier_wait(g->go);
    for (int r = 0; r < GB_ROUNDS; r++) {
        h_resp_t resp;
        int rc = h_http("POST", url, H_TOK_BB, NULL, g->body[r], strlen(g->body[r]), NULL, &resp);
        g->status[r] = rc ? -1 : resp.status;
        json_t *o = h_resp_json(&resp);
        const char *k[3] = {"accepted", "duplicates", "stale"};
        for (int i = 0; i < 3; i++)
            g->got[r][i] = json_integer_value(json_object_get(o, k[i]));
        json_decref(o);
        h_resp_free(&resp);
    }
    return NULL;
}

/* A "started" event of instance inst (machine gm<t>), id id. */
static void gb_started(char **b, const char *id, const char *inst, int t)
{
    char *o = *b;
    assert_true(asprintf(b, "%s%s{\"id\":\"%s\",\"type\":\"started\",\"instance\":\"%s\","
                            "\"machine\":\"gm%d\",\"service\":\"zone\",\"pid\":%d,\"slot\":0}",
                         o, o[strlen(o) - 1] == '[' ? "" : ",", id, inst, t, 100 + t) > 0);
    free(o);
}

/* Batches of many senders at once share events_apply.lua calls (group commit,
 * serverdir/directory/api_processes.c) and each is answered with its own counts: sender
 * t's batch of round r holds t % 4 + 1 new events, t % 3 events sent before the burst
 * (duplicates) and t % 2 events for an instance that stopped before it (stale), so a
 * batch answered with another's counts, or applied twice or not at all, shows. */
static void concurrent_batches_answered_each_their_own(void **state)
{
    (void)state;
    /* before the burst: the events the duplicates repeat, and the stopped instances */
    for (int t = 0; t < GB_THREADS; t++) {
        char *b = strdup("[");
        for (int r = 0; r < GB_ROUNDS; r++) {
            for (int k = 0; k < t % 3; k++) {
                char id[64], inst[64];
                snprintf(id, sizeof id, "gb-pre-%d-%d-%d", t, r, k);
                snprintf(inst, sizeof inst, "gb-pre-%d-%d-%d", t, r, k);
                gb_started(&b, id, inst, t);
            }
            char *o = b;
            assert_true(asprintf(&b, "%s%s{\"id\":\"gb-stop-%d-%d\",\"type\":\"stopped\","
                                     "\"instance\":\"gb-dead-%d-%d\",\"machine\":\"gm%d\","
                                     "\"service\":\"zone\",\"reason\":\"exited\",\"code\":0}",
                                 o, o[strlen(o) - 1] == '[' ? "" : ",", t, r, t, r, t) > 0);
            free(o);
        }
        char *batch = NULL;
        assert_true(asprintf(&batch, "%s]", b) > 0);
        json_decref(post_events("gb", batch));
        free(batch);
        free(b);
    }

    long long calls0 = h_metric(sd.url, "serverdir_events_calls_total");
    long long batches0 = h_metric(sd.url, "serverdir_events_call_batches_total");
    assert_true(calls0 >= 0 && batches0 >= 0);
    pthread_barrier_t go;
    assert_int_equal(pthread_barrier_init(&go, NULL, GB_THREADS), 0);
    static gb_t g[GB_THREADS];
    pthread_t th[GB_THREADS];
    for (int t = 0; t < GB_THREADS; t++) {
        g[t].go = &go;
        g[t].t = t;
        for (int r = 0; r < GB_ROUNDS; r++) {
            char *b = strdup("[");
            for (int k = 0; k < t % 4 + 1; k++) {
                char id[64];
                snprintf(id, sizeof id, "gb-new-%d-%d-%d", t, r, k);
                gb_started(&b, id, id, t);
            }
            for (int k = 0; k < t % 3; k++) {
                char id[64];
                snprintf(id, sizeof id, "gb-pre-%d-%d-%d", t, r, k);
                gb_started(&b, id, id, t);
            }
            if (t % 2) {
                char id[64], inst[64];
                snprintf(id, sizeof id, "gb-late-%d-%d", t, r);
                snprintf(inst, sizeof inst, "gb-dead-%d-%d", t, r);
                gb_started(&b, id, inst, t);
            }
            assert_true(asprintf(&g[t].body[r], "{\"events\":%s]}", b) > 0);
            free(b);
        }
        assert_int_equal(pthread_create(&th[t], NULL, gb_sender, &g[t]), 0);
    }
    for (int t = 0; t < GB_THREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&go);

    for (int t = 0; t < GB_THREADS; t++)
        for (int r = 0; r < GB_ROUNDS; r++) {
            long long want[3] = {t % 4 + 1 + t % 2, t % 3, t % 2};
            if (g[t].status[r] != 200 || memcmp(g[t].got[r], want, sizeof want))
                fail_msg("sender %d round %d: %ld {%lld, %lld, %lld}, expected 200 {%lld, "
                         "%lld, %lld}",
                         t, r, g[t].status[r], g[t].got[r][0], g[t].got[r][1], g[t].got[r][2],
                         want[0], want[1], want[2]);
            free(g[t].body[r]);
        }
    /* every new instance recorded once, on its own machine; the stopped ones stay so */
    json_t *j = get_json(H_TOK_VIEWER, "/v1/clusters/gb/processes/gb-new-47-2-3", 200);
    assert_string_equal(jstr(j, "state"), "starting");
    assert_string_equal(jstr(j, "machine"), "gm47");
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/gb/processes/gb-dead-47-2", 200);
    assert_string_equal(jstr(j, "state"), "stopped");
    json_decref(j);
    j = get_json(H_TOK_VIEWER, "/v1/clusters/gb/processes?limit=1000", 200);
    long live = 0;
    for (int t = 0; t < GB_THREADS; t++)
        live += GB_ROUNDS * (t % 4 + 1 + t % 3);
    assert_int_equal((long)json_array_size(json_object_get(j, "processes")), live);
    json_decref(j);

    /* the burst's batches went in fewer calls than batches */
    long long calls = h_metric(sd.url, "serverdir_events_calls_total") - calls0;
    long long batches = h_metric(sd.url, "serverdir_events_call_batches_total") - batches0;
    fprintf(stderr, "# %d batches in %lld calls\n", GB_THREADS * GB_ROUNDS, calls);
    assert_int_equal(batches, GB_THREADS * GB_ROUNDS);
    assert_true(calls > 0 && calls < batches);
}

int main(void)
{
    h_init(120); /* 100,000 processes written through serverdir */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(machine_lease_register_renew_expire_delete),
        cmocka_unit_test(event_batch_applied_then_retried_as_duplicates),
        cmocka_unit_test(stopped_unknown_recorded_and_never_revived),
        cmocka_unit_test(directory_filters),
        cmocka_unit_test(history_since_and_limit),
        cmocka_unit_test(history_long_poll),
        cmocka_unit_test(history_and_stopped_bounded),
        cmocka_unit_test(batch_of_1000_accepted),
        cmocka_unit_test(concurrent_batches_answered_each_their_own),
        cmocka_unit_test(bad_input_is_rejected_and_changes_nothing),
        cmocka_unit_test(keys_check_sees_writes_and_allows_expiry),
        cmocka_unit_test(auth_roles),
        cmocka_unit_test(token_file_reloaded_on_sighup),
        cmocka_unit_test(sdclient_typed_calls_and_failover),
        cmocka_unit_test(redis_outage_gives_503_then_recovers),
        cmocka_unit_test(lists_at_100k_stay_cheap),
        cmocka_unit_test(old_live_sets_are_migrated),
        cmocka_unit_test(machine_lost_without_primary),
        cmocka_unit_test(paused_serverdir_sweeps_no_machine_at_once),
        cmocka_unit_test(machines_and_services_are_paged),
        cmocka_unit_test(state_is_paged),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
