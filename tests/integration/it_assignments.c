/* Per-machine assignments against a real serverdir and redis-server: versions (a PUT
 * that changes nothing keeps them), per-machine documents, ETag / If-None-Match 304,
 * the long-poll (wakes on a change, returns at its wait otherwise), 500 parked long-polls
 * on a serverdir with 2 handler threads that keeps serving other requests, the realm
 * stop flag, bad bodies rejected without a change, and a machine declared lost: its
 * processes stopped with reason machine_lost in the directory and the history, except
 * those of the services the call keeps (spec.disconnect). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_api.h"
#include "harness_stack.h"

#define WAITERS 500

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with two handler threads. */
static int setup(void **state)
{
    static const char *const extra[] = {"--threads", "2", NULL};
    /* the 500 long-polls below stand for 500 machines, here all from 127.0.0.1: no
     * per-source connection limit (docs/operations.md, "Connection limits") */
    return h_stack_setup(state, &redis, &sd,
                         &(h_sd_opts_t){.extra = extra,
                                        .config = "{\"max_connections_per_source\": 0}"});
}

/* Takes the primary lease of cluster c for m1; returns the epoch. */
static long long primary(const char *c)
{
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", "{\"machine\":\"m1\",\"ttl_ms\":60000}", &o,
                             NULL, "/v1/clusters/%s/primary", c), 200);
    long long e = ct_int(o, "epoch");
    json_decref(o);
    return e;
}

/* PUT /assignments with epoch and the machines object text; returns the version. */
static long long put_assign(const char *c, long long epoch, const char *machines, int *changed)
{
    char body[4096];
    snprintf(body, sizeof body, "{\"epoch\":%lld,\"machines\":%s}", epoch, machines);
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, &o, NULL,
                             "/v1/clusters/%s/assignments", c), 200);
    long long v = ct_int(o, "version");
    if (changed)
        *changed = json_is_true(json_object_get(o, "changed"));
    json_decref(o);
    return v;
}

/* GET one machine's document; returns its version. */
static long long doc(const char *c, const char *m, json_t **out)
{
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/machines/%s/assignments", c, m), 200);
    long long v = ct_int(o, "version");
    if (out)
        *out = o;
    else
        json_decref(o);
    return v;
}

/* How many slots machine m's document in cluster c holds. */
static size_t slots_of(const char *c, const char *m)
{
    json_t *o;
    doc(c, m, &o);
    size_t n = json_array_size(json_object_get(o, "slots"));
    json_decref(o);
    return n;
}

/* Checks that process inst of cluster c has field == want. */
static void proc_is(const char *c, const char *inst, const char *field, const char *want)
{
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/processes/%s", c, inst), 200);
    assert_string_equal(ct_str(o, field), want);
    json_decref(o);
}

#define SLOT(svc, n) "{\"service\":\"" svc "\",\"slot\":" #n ",\"spec_version\":1,\"restart_token\":0,\"spec\":{\"command\":\"/bin/true\"}}"

static void versions_documents_and_etags(void **state)
{
    (void)state;
    long long e = primary("a1");
    int changed;
    long long v1 = put_assign("a1", e, "{\"m1\":[" SLOT("zone", 1) "," SLOT("zone", 0) "],"
                                       "\"m2\":[" SLOT("zone", 2) "]}", &changed);
    assert_true(changed);
    /* The same lists again (in another order): nothing changes, same version. */
    long long v2 = put_assign("a1", e, "{\"m2\":[" SLOT("zone", 2) "],"
                                       "\"m1\":[" SLOT("zone", 0) "," SLOT("zone", 1) "]}",
                              &changed);
    assert_false(changed);
    assert_int_equal(v2, v1);
    json_t *o;
    assert_int_equal(doc("a1", "m1", &o), v1);
    assert_string_equal(ct_str(o, "machine"), "m1");
    assert_int_equal(ct_int(o, "epoch"), e);
    assert_false(json_is_true(json_object_get(o, "cluster_stopped")));
    const json_t *slots = json_object_get(o, "slots");
    assert_int_equal(json_array_size(slots), 2);
    assert_int_equal(ct_int(json_array_get(slots, 0), "slot"), 0);
    assert_string_equal(ct_str(json_object_get(json_array_get(slots, 1), "spec"), "command"),
                        "/bin/true");
    json_decref(o);
    /* Only m2 changes: m1's document keeps its version. */
    long long v3 = put_assign("a1", e, "{\"m2\":[]}", &changed);
    assert_true(changed);
    assert_true(v3 > v1);
    assert_int_equal(doc("a1", "m1", NULL), v1);
    assert_int_equal(doc("a1", "m2", NULL), v3);
    /* A machine without a document: version 0, no slots. */
    assert_int_equal(doc("a1", "m9", &o), 0);
    assert_int_equal(json_array_size(json_object_get(o, "slots")), 0);
    json_decref(o);
    /* ETag and If-None-Match. */
    char url[256], etag[32], inm[64];
    snprintf(url, sizeof url, "%s/v1/clusters/a1/machines/m1/assignments", sd.url);
    const char *auth = "Authorization: Bearer " H_TOK_BB;
    const char *h1[] = {auth, NULL};
    h_resp_t r;
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, h1, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(h_resp_header(&r, "ETag", etag, sizeof etag), 0);
    h_resp_free(&r);
    char want[32];
    snprintf(want, sizeof want, "\"%lld\"", v1);
    assert_string_equal(etag, want);
    snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
    const char *h2[] = {auth, inm, NULL};
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, h2, &r), 0);
    assert_int_equal(r.status, 304);
    h_resp_free(&r);
    const char *h3[] = {auth, "If-None-Match: \"999999\"", NULL};
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, h3, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
}

typedef struct {
    const char *cluster, *machine;
    long long version;
    int wait_ms;
    long status;
    long long got_version;
    int64_t answered_ms;
} poll_t;

static void *poll_main(void *arg)
{
    poll_t *p = arg;
    json_t *o;
    p->status = ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                        "/v1/clusters/%s/machines/%s/assignments?version=%lld&wait=%d",
                        p->cluster, p->machine, p->version, p->wait_ms);
    p->answered_ms = h_now_ms();
    p->got_version = ct_int(o, "version");
    json_decref(o);
    return NULL;
}

static void long_poll_wakes_on_change_and_times_out(void **state)
{
    (void)state;
    long long e = primary("a2");
    long long v = put_assign("a2", e, "{\"m1\":[" SLOT("zone", 0) "]}", NULL);
    /* A version that is not current answers at once. */
    int64_t t0 = h_now_ms();
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL,
                             "/v1/clusters/a2/machines/m1/assignments?version=%lld&wait=20000",
                             v - 1), 200);
    assert_int_equal(ct_int(o, "version"), v);
    json_decref(o);
    assert_true(h_now_ms() - t0 < 2000);
    /* The current version: parked until the change. */
    poll_t p = {"a2", "m1", v, 20000, 0, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, poll_main, &p), 0);
    h_sleep_ms(400);
    assert_int_equal(p.status, 0); /* still waiting */
    /* A change of another machine does not answer it. */
    put_assign("a2", e, "{\"m2\":[" SLOT("zone", 1) "]}", NULL);
    h_sleep_ms(200);
    assert_int_equal(p.status, 0);
    int64_t changed_at = h_now_ms();
    long long v2 = put_assign("a2", e, "{\"m1\":[]}", NULL);
    pthread_join(th, NULL);
    assert_int_equal(p.status, 200);
    assert_int_equal(p.got_version, v2);
    /* Woken by the change, not by the wait (100 ms on an idle box; generous bound for a
     * loaded 2-core machine). */
    print_message("long-poll answered %lld ms after the change\n",
                  (long long)(p.answered_ms - changed_at));
    assert_true(p.answered_ms - changed_at < 1500);
    /* No change: the long-poll returns 200 with the same document when the wait ends. */
    poll_t q = {"a2", "m1", v2, 700, 0, 0, 0};
    t0 = h_now_ms();
    poll_main(&q);
    assert_int_equal(q.status, 200);
    assert_int_equal(q.got_version, v2);
    assert_true(q.answered_ms - t0 >= 650);
    assert_true(q.answered_ms - t0 < 5000);
    /* Bad query values are refused. */
    char code[64];
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, NULL, code,
                             "/v1/clusters/a2/machines/m1/assignments?version=1&wait=600001"),
                     400);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, NULL, code,
                             "/v1/clusters/a2/machines/m1/assignments?version=x"),
                     400);
}

static size_t discard(char *p, size_t n, size_t m, void *u)
{
    (void)p;
    (void)u;
    return n * m;
}

/* The value of a metric series line "name value" in a /metrics page (0 if absent). */
static long metric(const char *page, const char *series)
{
    char line[160];
    snprintf(line, sizeof line, "\n%s", series);
    const char *m = strstr(page, line);
    return m ? strtol(m + strlen(line), NULL, 10) : 0;
}

/* WAITERS long-polls parked on a serverdir with 2 handler threads: other requests are
 * still answered at once, and one realm stop answers every waiter. */
static void many_parked_long_polls_do_not_exhaust_workers(void **state)
{
    (void)state;
    long long e = primary("a3");
    char machines[64];
    snprintf(machines, sizeof machines, "{\"m0\":[" "]}");
    put_assign("a3", e, machines, NULL);
    CURLM *multi = curl_multi_init();
    CURL *easy[WAITERS];
    struct curl_slist *hl = curl_slist_append(NULL, "Authorization: Bearer " H_TOK_BB);
    for (int i = 0; i < WAITERS; i++) {
        char url[256];
        snprintf(url, sizeof url,
                 "%s/v1/clusters/a3/machines/w%d/assignments?version=0&wait=30000", sd.url, i);
        easy[i] = curl_easy_init();
        curl_easy_setopt(easy[i], CURLOPT_URL, url);
        curl_easy_setopt(easy[i], CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(easy[i], CURLOPT_WRITEFUNCTION, discard);
        curl_easy_setopt(easy[i], CURLOPT_TIMEOUT_MS, 60000L);
        curl_multi_add_handle(multi, easy[i]);
    }
    /* Drive the transfers until every request was sent and parked. */
    h_resp_t r0;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r0, "/metrics"), 0);
    long parked0 = metric(r0.body, "serverdir_assign_longpolls_parked_total ") -
                   metric(r0.body, "serverdir_assign_longpolls_answered_total ");
    h_resp_free(&r0);
    int running = WAITERS;
    int64_t until = h_now_ms() + 30000;
    json_t *o;
    for (;;) {
        curl_multi_perform(multi, &running);
        curl_multi_poll(multi, NULL, 0, 50, NULL);
        h_resp_t r;
        assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/metrics"), 0);
        long parked = metric(r.body, "serverdir_assign_longpolls_parked_total ") -
                      metric(r.body, "serverdir_assign_longpolls_answered_total ");
        h_resp_free(&r);
        if (parked == parked0 + WAITERS)
            break;
        if (h_now_ms() >= until)
            print_message("parked %ld of %d (running %d)\n", parked - parked0, WAITERS, running);
        assert_true(h_now_ms() < until);
    }
    assert_int_equal(running, WAITERS);
    /* Both workers are free: other requests are answered promptly. */
    for (int i = 0; i < 20; i++) {
        int64_t t0 = h_now_ms();
        assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                                 "/v1/clusters/a3/primary"), 200);
        json_decref(o);
        assert_true(h_now_ms() - t0 < 2000);
    }
    /* The realm stop changes every machine's document: all waiters answer. */
    int64_t t0 = h_now_ms();
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, NULL, NULL, "/v1/clusters/a3/stop"),
                     200);
    until = h_now_ms() + 30000;
    while (running > 0 && h_now_ms() < until) {
        curl_multi_perform(multi, &running);
        curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    assert_int_equal(running, 0);
    print_message("%d parked long-polls answered %lld ms after the stop\n", WAITERS,
                  (long long)(h_now_ms() - t0));
    int ok = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(multi, &left))) {
        long st = 0;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &st);
        ok += msg->msg == CURLMSG_DONE && msg->data.result == CURLE_OK && st == 200;
    }
    assert_int_equal(ok, WAITERS);
    for (int i = 0; i < WAITERS; i++) {
        curl_multi_remove_handle(multi, easy[i]);
        curl_easy_cleanup(easy[i]);
    }
    curl_slist_free_all(hl);
    curl_multi_cleanup(multi);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, NULL, NULL, "/v1/clusters/a3/start"),
                     200);
}

static void cluster_stop_empties_documents(void **state)
{
    (void)state;
    long long e = primary("a4");
    long long v = put_assign("a4", e, "{\"m1\":[" SLOT("zone", 0) "]}", NULL);
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, &o, NULL, "/v1/clusters/a4/stop"),
                     200);
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    long long vs = doc("a4", "m1", &o);
    assert_true(vs > v);
    assert_true(json_is_true(json_object_get(o, "cluster_stopped")));
    assert_int_equal(json_array_size(json_object_get(o, "slots")), 0);
    json_decref(o);
    /* Stopping again changes nothing. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, &o, NULL, "/v1/clusters/a4/stop"),
                     200);
    assert_false(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    assert_int_equal(doc("a4", "m1", NULL), vs);
    /* Start: the slots are back under a newer version. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, NULL, NULL, "/v1/clusters/a4/start"),
                     200);
    assert_true(doc("a4", "m1", &o) > vs);
    assert_false(json_is_true(json_object_get(o, "cluster_stopped")));
    assert_int_equal(json_array_size(json_object_get(o, "slots")), 1);
    json_decref(o);
    /* GET /state shows it all at once. */
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL, "/v1/clusters/a4/state"),
                     200);
    assert_false(json_is_true(json_object_get(o, "cluster_stopped")));
    assert_true(ct_int(o, "assignments_version") >= vs);
    assert_int_equal(json_array_size(json_object_get(
                         json_object_get(json_object_get(o, "assignments"), "m1"), "slots")),
                     1);
    json_decref(o);
}

static void bad_assignments_change_nothing(void **state)
{
    (void)state;
    long long e = primary("a5");
    put_assign("a5", e, "{\"m1\":[" SLOT("zone", 0) "]}", NULL);
    static const char *const bad[] = {
        "{\"m1\":[{\"service\":\"zone\",\"slot\":-1}]}",
        "{\"m1\":[{\"service\":\"zone\"}]}",
        "{\"m1\":[{\"service\":\"bad name\",\"slot\":1}]}",
        "{\"m1\":[{\"service\":\"zone\",\"slot\":1,\"extra\":true}]}",
        "{\"m1\":[{\"service\":\"zone\",\"slot\":1,\"spec\":\"x\"}]}",
        "{\"m1\":[" SLOT("zone", 3) "],\"m2\":[" SLOT("zone", 3) "]}",
        "{\"m1\":{}}",
        "{\"bad name\":[]}",
        "[]",
    };
    h_keys_t before, after;
    char body[1024], code[64];
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("a5"), NULL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"epoch\":%lld,\"machines\":%s}", e, bad[i]);
        assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", body, NULL, code,
                                 "/v1/clusters/a5/assignments"), 400);
        assert_true(!strcmp(code, "bad_field") || !strcmp(code, "bad_name"));
    }
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"machines\":{}}", NULL, code,
                             "/v1/clusters/a5/assignments"), 400);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", "{\"epoch\":\"1\"}", NULL, code,
                             "/v1/clusters/a5/machines/m1/lost"), 400);
    static const char *const bad_keep[] = {"\"zone\"", "[\"bad name\"]", "[7]", "{}"};
    for (size_t i = 0; i < sizeof bad_keep / sizeof bad_keep[0]; i++) {
        snprintf(body, sizeof body, "{\"epoch\":%lld,\"keep\":%s}", e, bad_keep[i]);
        assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, NULL, code,
                                 "/v1/clusters/a5/machines/m1/lost"), 400);
        assert_string_equal(code, "bad_field");
    }
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("a5"), NULL);
    h_keys_same(&before, &after, __func__);
}

static void lost_machine_processes_stop_as_machine_lost(void **state)
{
    (void)state;
    long long e = primary("a6");
    put_assign("a6", e, "{\"m1\":[" SLOT("zone", 0) "," SLOT("zone", 1) "],\"m2\":[" SLOT("zone", 2) "]}",
               NULL);
    const char *events =
        "{\"events\":["
        "{\"id\":\"e1\",\"type\":\"started\",\"instance\":\"zone-m1-0\",\"machine\":\"m1\","
        "\"service\":\"zone\",\"pid\":100,\"slot\":0},"
        "{\"id\":\"e2\",\"type\":\"started\",\"instance\":\"zone-m1-1\",\"machine\":\"m1\","
        "\"service\":\"zone\",\"pid\":101,\"slot\":1},"
        "{\"id\":\"e3\",\"type\":\"ready\",\"instance\":\"zone-m1-1\",\"machine\":\"m1\","
        "\"service\":\"zone\"},"
        "{\"id\":\"e4\",\"type\":\"started\",\"instance\":\"zone-m2-2\",\"machine\":\"m2\","
        "\"service\":\"zone\",\"pid\":102,\"slot\":2}]}";
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", events, NULL, NULL, "/v1/clusters/a6/events"),
                     200);
    char body[64];
    snprintf(body, sizeof body, "{\"epoch\":%lld}", e);
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, &o, NULL,
                             "/v1/clusters/a6/machines/m1/lost"), 200);
    assert_int_equal(ct_int(o, "stopped"), 2);
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    /* m1's slots are gone; m2 is untouched. */
    assert_int_equal(doc("a6", "m1", &o) > 0, 1);
    assert_int_equal(json_array_size(json_object_get(o, "slots")), 0);
    json_decref(o);
    doc("a6", "m2", &o);
    assert_int_equal(json_array_size(json_object_get(o, "slots")), 1);
    json_decref(o);
    /* The directory: m1's processes stopped with machine_lost, m2's still live. */
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/a6/processes/zone-m1-1"), 200);
    assert_string_equal(ct_str(o, "state"), "stopped");
    assert_string_equal(ct_str(o, "reason"), "machine_lost");
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/a6/processes"), 200);
    const json_t *procs = json_object_get(o, "processes");
    assert_int_equal(json_array_size(procs), 1);
    assert_string_equal(ct_str(json_array_get(procs, 0), "instance"), "zone-m2-2");
    json_decref(o);
    /* The history shows both stops. */
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/a6/events?limit=100"), 200);
    int lost = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(o, "events"), i, ev) lost +=
        !strcmp(ct_str(ev, "type"), "stopped") && !strcmp(ct_str(ev, "reason"), "machine_lost");
    assert_int_equal(lost, 2);
    json_decref(o);
    /* Declaring it lost again marks nothing more. */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, &o, NULL,
                             "/v1/clusters/a6/machines/m1/lost"), 200);
    assert_int_equal(ct_int(o, "stopped"), 0);
    assert_false(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
}

/* keep (spec.disconnect): the kept services' processes stay as they are and the slots
 * are left for the primary's PUT; the others' processes are marked as without keep. */
static void lost_machine_keeps_the_kept_services(void **state)
{
    (void)state;
    long long e = primary("a7");
    put_assign("a7", e, "{\"m1\":[" SLOT("zone", 0) "," SLOT("realm", 0) "]}", NULL);
    const char *events =
        "{\"events\":["
        "{\"id\":\"e1\",\"type\":\"started\",\"instance\":\"zone-0\",\"machine\":\"m1\","
        "\"service\":\"zone\",\"pid\":100,\"slot\":0},"
        "{\"id\":\"e2\",\"type\":\"started\",\"instance\":\"realm-0\",\"machine\":\"m1\","
        "\"service\":\"realm\",\"pid\":101,\"slot\":0}]}";
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", events, NULL, NULL, "/v1/clusters/a7/events"),
                     200);
    char body[96];
    snprintf(body, sizeof body, "{\"epoch\":%lld,\"keep\":[\"realm\"]}", e);
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, &o, NULL,
                             "/v1/clusters/a7/machines/m1/lost"), 200);
    assert_int_equal(ct_int(o, "stopped"), 1);
    assert_false(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    assert_int_equal(slots_of("a7", "m1"), 2);
    proc_is("a7", "zone-0", "reason", "machine_lost");
    proc_is("a7", "realm-0", "state", "starting");
    /* realm's hold ends: declared again without keep, its process is marked and the
     * slots emptied */
    snprintf(body, sizeof body, "{\"epoch\":%lld}", e);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, &o, NULL,
                             "/v1/clusters/a7/machines/m1/lost"), 200);
    assert_int_equal(ct_int(o, "stopped"), 1);
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
}

static int a8_zone_stopped(void *arg)
{
    (void)arg;
    json_t *o = NULL;
    int stopped = ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                          "/v1/clusters/a8/processes/zone-1") == 200 &&
                  !strcmp(ct_str(o, "state"), "stopped");
    json_decref(o);
    return stopped;
}

/* A machine that renewed its lease after the primary read the state is not declared lost:
 * 409 machine_live, its document and processes untouched (the old script emptied the
 * document and listed the processes, which the caller marked stopped, though the
 * machine's bigbrother, back, had already checked its records). */
static void renewed_machine_is_not_lost(void **state)
{
    (void)state;
    long long e = primary("a9");
    put_assign("a9", e, "{\"m1\":[" SLOT("zone", 0) "]}", NULL);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"ttl_ms\":60000}", NULL, NULL,
                             "/v1/clusters/a9/machines/m1"), 200);
    const char *events =
        "{\"events\":[{\"id\":\"r1\",\"type\":\"started\",\"instance\":\"zone-m1-0\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":100,\"slot\":0}]}";
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", events, NULL, NULL, "/v1/clusters/a9/events"),
                     200);
    char body[64], code[64];
    snprintf(body, sizeof body, "{\"epoch\":%lld}", e);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", body, NULL, code,
                             "/v1/clusters/a9/machines/m1/lost"), 409);
    assert_string_equal(code, "machine_live");
    assert_int_equal(slots_of("a9", "m1"), 1);
    proc_is("a9", "zone-m1-0", "state", "starting");
}

/* Without a primary, serverdir's lost-machine sweep leaves the processes of a service
 * whose spec.disconnect keeps them (replace false) as they are. */
static void sweep_without_primary_honours_disconnect(void **state)
{
    (void)state;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"command\":\"/bin/g\",\"count\":1,"
                             "\"disconnect\":{\"replace\":false}}", NULL, NULL,
                             "/v1/clusters/a8/services/realm"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/g\",\"count\":1}",
                             NULL, NULL, "/v1/clusters/a8/services/zone"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"ttl_ms\":1000}", NULL, NULL,
                             "/v1/clusters/a8/machines/m1"), 200);
    const char *events =
        "{\"events\":["
        "{\"id\":\"e1\",\"type\":\"started\",\"instance\":\"zone-1\",\"machine\":\"m1\","
        "\"service\":\"zone\",\"pid\":100,\"slot\":0},"
        "{\"id\":\"e2\",\"type\":\"started\",\"instance\":\"realm-1\",\"machine\":\"m1\","
        "\"service\":\"realm\",\"pid\":101,\"slot\":0}]}";
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", events, NULL, NULL, "/v1/clusters/a8/events"),
                     200);
    assert_true(h_wait_until(a8_zone_stopped, NULL, h_valgrind() ? 20000 : 6000));
    h_sleep_ms(1500); /* the sweep runs every second: later rounds leave realm too */
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/a8/processes/realm-1"), 200);
    assert_string_equal(ct_str(o, "state"), "starting");
    json_decref(o);
}

int main(void)
{
    h_init(240);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(versions_documents_and_etags),
        cmocka_unit_test(long_poll_wakes_on_change_and_times_out),
        cmocka_unit_test(many_parked_long_polls_do_not_exhaust_workers),
        cmocka_unit_test(cluster_stop_empties_documents),
        cmocka_unit_test(bad_assignments_change_nothing),
        cmocka_unit_test(lost_machine_processes_stop_as_machine_lost),
        cmocka_unit_test(lost_machine_keeps_the_kept_services),
        cmocka_unit_test(sweep_without_primary_honours_disconnect),
        cmocka_unit_test(renewed_machine_is_not_lost),
    };
    int rc = cmocka_run_group_tests(tests, setup, h_stack_teardown);
    curl_global_cleanup();
    return rc;
}
