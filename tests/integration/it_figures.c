/* One figure, one meaning (docs/design.md, "Figures"): the same instance's restarts read
 * from every place that shows them agree with the known count; a planned stop (replaced,
 * drained, an operator's) is no failure in sdctl status nor in the dashboard's data; a
 * static service is never "over" its desired count.
 *
 * The stack: Redis, serverdir (a series sample every second), one bigbrother running the
 * static service zone (one gameproc) with its logs port, reporting to serverdir. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_bigbrother.h"
#include "harness_sdctl.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;
static bbt_t bbt;
static int logs_port;

static int setup(void **state)
{
    h_sd_opts_t o = {.config = "{\"directory\":{\"series_interval_ms\":1000}}"};
    if (h_stack_setup(state, &redis, &sd, &o))
        return -1;
    char svc[2048], extra[512];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"zone\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"20\"],"
             " \"count\": 1, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000,"
             " \"liveness_timeout_ms\": 3000},"
             " \"restart\": {\"policy\": \"always\", \"backoff_min_ms\": 20,"
             " \"backoff_max_ms\": 100, \"max_restarts\": 10, \"window_s\": 60},"
             " \"stop\": {\"signal\": \"TERM\", \"grace_ms\": 1000}, \"cwd\": \"%s\","
             " \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, h_tmpdir());
    logs_port = h_free_port();
    snprintf(extra, sizeof extra,
             ", \"address\": \"127.0.0.1\", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"},"
             " \"logs_listen\": \"127.0.0.1:%d\"",
             sd.url, H_TOK_BB, logs_port);
    bbt_config(&bbt, svc, extra);
    return bbt_start(&bbt) > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    bbt_stop(&bbt, 5000);
    return h_stack_teardown(state);
}

/* sdctl on cluster (viewer token); its exit code, its output in out. */
static int sdctl(const char *cluster, char *out, size_t cap, ...)
{
    char env_url[256], env_cl[200];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    snprintf(env_cl, sizeof env_cl, "SERVERDIR_CLUSTER=%s", cluster);
    const char *env[] = {env_url, "SERVERDIR_TOKEN=" H_TOK_VIEWER, env_cl, "NO_COLOR=1", NULL};
    va_list ap;
    va_start(ap, cap);
    int rc = h_sdctl_vrun(env, 15000, out, cap, ap);
    va_end(ap);
    return rc;
}

/* GET url (a whole URL) as the viewer: the parsed 200 body (asserted). */
static json_t *get_url(const char *url)
{
    h_resp_t r;
    assert_int_equal(h_http("GET", url, H_TOK_VIEWER, NULL, NULL, 0, NULL, &r), 0);
    if (r.status != 200)
        fprintf(stderr, "GET %s: %ld %.*s\n", url, (long)r.status, (int)r.len, r.body ? r.body : "");
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    assert_non_null(j);
    h_resp_free(&r);
    return j;
}

static json_t *api(const char *path)
{
    char url[600];
    snprintf(url, sizeof url, "%s%s", sd.url, path);
    return get_url(url);
}

/* The slot's current run is ready in bigbrother at generation gen (asserted); its
 * instance id into id. */
static void ready_at(int gen, char *id, size_t cap)
{
    json_t *in = bbt_wait(&bbt, "zone", 0, "ready", gen, h_valgrind() ? 60000 : 15000);
    assert_non_null(in);
    assert_int_equal(bbt_int(in, "generation"), gen);
    snprintf(id, cap, "%s", bbt_str(in, "instance"));
    json_decref(in);
}

static void kill9(void)
{
    json_t *in = bbt_inst(&bbt, "zone", 0);
    assert_non_null(in);
    assert_int_equal(kill((pid_t)bbt_int(in, "pid"), SIGKILL), 0);
    json_decref(in);
}

/* The directory records instance arg (a char *) ready. */
static int recorded_ready(void *arg)
{
    h_resp_t r;
    int ok = h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/clusters/c1/processes/%s",
                         (const char *)arg) == 0 &&
             r.status == 200;
    json_t *j = ok ? h_resp_json(&r) : NULL;
    const char *st = json_string_value(json_object_get(j, "state"));
    ok = st && !strcmp(st, "ready");
    json_decref(j);
    h_resp_free(&r);
    return ok;
}

/* GET url (a char *: the health view of one instance) answers 200 to the viewer. */
static int health_known(void *url)
{
    h_resp_t r;
    int ok = h_http("GET", url, H_TOK_VIEWER, NULL, NULL, 0, NULL, &r) == 0 && r.status == 200;
    h_resp_free(&r);
    return ok;
}

/* The integer in column col (0-based, blank-separated) of the line of text holding id. */
static long long column_of(const char *text, const char *id, int col)
{
    char line[1024];
    assert_non_null(h_line_with(text, id, line, sizeof line));
    char *save = NULL, *tok = strtok_r(line, " \t", &save);
    for (int i = 0; tok && i < col; i++)
        tok = strtok_r(NULL, " \t", &save);
    assert_non_null(tok);
    return strtoll(tok, NULL, 10);
}

/* The process of id in a {"processes": [...]} answer (borrowed), asserted present. */
static json_t *proc_in(json_t *list, const char *id)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(list, "processes"), i, p)
        if (!strcmp(json_string_value(json_object_get(p, "instance")) ?: "", id))
            return p;
    fail_msg("%s is not in the list", id);
    return NULL;
}

/* Two kill -9s (restarts by the policy: counted), then an operator's restart and an
 * operator's stop and start (planned: not counted, but each a new generation). Every
 * reader shows restarts 2 for the slot's current run, generation 5. */
static void restarts_agree_everywhere(void **state)
{
    (void)state;
    char id[160], out[16384], line[1024];
    ready_at(1, id, sizeof id);
    kill9();
    ready_at(2, id, sizeof id);
    kill9();
    ready_at(3, id, sizeof id);
    json_decref(bbt_ctl(&bbt, "restart zone"));
    ready_at(4, id, sizeof id);
    json_decref(bbt_ctl(&bbt, "stop zone"));
    json_decref(bbt_wait(&bbt, "zone", 0, "stopped", 0, 10000));
    json_decref(bbt_ctl(&bbt, "start zone"));
    ready_at(5, id, sizeof id);
    assert_true(h_wait_until(recorded_ready, id, h_valgrind() ? 30000 : 10000));

    /* bigbrother: bbctl status (its table's RESTARTS, the 5th column) and the socket's
     * JSON */
    json_t *in = bbt_inst(&bbt, "zone", 0);
    assert_int_equal(bbt_int(in, "restarts"), 2);
    json_decref(in);
    char path[600];
    snprintf(path, sizeof path, "%s/bbctl.out", bbt.dir);
    const char *status[] = {BBCTL, "--socket", bbt.sock, "status", NULL};
    assert_int_equal(bbt_run(status, path), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    fclose(f);
    out[n] = 0;
    assert_int_equal(column_of(out, id, 4), 2);

    /* the health view on bigbrother's logs port (its snapshot is at most 1 s old) */
    char url[600];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/health/%s", logs_port, id);
    assert_true(h_wait_every(health_known, url, 5000, 100));
    json_t *h = get_url(url);
    assert_int_equal(json_integer_value(json_object_get(h, "restarts")), 2);
    json_decref(h);

    /* the directory: the record and the list the dashboard reads; its services card sums
     * the live instances' restarts (one here) */
    char p[300];
    snprintf(p, sizeof p, "/v1/clusters/c1/processes/%s", id);
    json_t *rec = api(p);
    assert_int_equal(json_integer_value(json_object_get(rec, "restarts")), 2);
    assert_int_equal(json_integer_value(json_object_get(rec, "generation")), 5);
    json_decref(rec);
    json_t *list = api("/v1/clusters/c1/processes");
    assert_int_equal(json_integer_value(json_object_get(proc_in(list, id), "restarts")), 2);
    json_decref(list);

    /* sdctl ps, its table and -o json */
    assert_int_equal(sdctl("c1", out, sizeof out, "ps", NULL), 0);
    assert_non_null(strstr(out, "RESTARTS"));
    assert_int_equal(column_of(out, id, 5), 2);
    assert_int_equal(sdctl("c1", out, sizeof out, "-o", "json", "ps", NULL), 0);
    list = json_loads(out, 0, NULL);
    assert_non_null(list);
    assert_int_equal(json_integer_value(json_object_get(proc_in(list, id), "restarts")), 2);
    json_decref(list);

    /* sdctl describe, its text and -o json (the record and bigbrother's health) */
    assert_int_equal(sdctl("c1", out, sizeof out, "describe", id, NULL), 0);
    assert_non_null(h_line_with(out, "\nRestarts:", line, sizeof line));
    assert_string_equal(line, "Restarts:     2");
    assert_non_null(h_line_with(out, "\nGeneration:", line, sizeof line));
    assert_string_equal(line, "Generation:   5");
    assert_int_equal(sdctl("c1", out, sizeof out, "-o", "json", "describe", id, NULL), 0);
    json_t *d = json_loads(out, 0, NULL);
    assert_non_null(d);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(d, "process"), "restarts")),
                     2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(d, "health"), "restarts")),
                     2);
    json_decref(d);

    /* the stop events of the planned stops say no failure, the kills' say failure */
    json_t *ev = api("/v1/clusters/c1/events?limit=500");
    size_t i;
    json_t *e;
    int kills = 0, planned = 0;
    json_array_foreach(json_object_get(ev, "events"), i, e) {
        const char *reason = json_string_value(json_object_get(e, "reason"));
        if (!reason)
            continue;
        int is_kill = !strcmp(reason, "killed");
        kills += is_kill;
        planned += !strcmp(reason, "stopped_by_operator");
        assert_true(json_is_boolean(json_object_get(e, "failure")));
        assert_int_equal(json_is_true(json_object_get(e, "failure")), is_kill);
    }
    assert_int_equal(kills, 2);
    assert_int_equal(planned, 2);
    json_decref(ev);
}

/* Events of a pool's normal life in cluster c2: a run replaced, one drained, one
 * released by the operator, and one killed. Only the kill is a failure: in the events
 * and records the dashboard reads (`failure`), and in sdctl status (its count and list). */
static void planned_stops_are_not_failures(void **state)
{
    (void)state;
    static const char *const reasons[] = {"replaced", "drained", "stopped_by_operator",
                                          "killed"};
    char body[4096];
    size_t o = (size_t)snprintf(body, sizeof body, "{\"events\":[");
    for (int k = 0; k < 4; k++)
        o += (size_t)snprintf(
            body + o, sizeof body - o,
            "%s{\"id\":\"f%d-s\",\"type\":\"started\",\"instance\":\"match-m9-%d\","
            "\"machine\":\"m9\",\"service\":\"match\",\"pid\":%d,\"generation\":1},"
            "{\"id\":\"f%d-x\",\"type\":\"stopped\",\"instance\":\"match-m9-%d\","
            "\"machine\":\"m9\",\"service\":\"match\",\"generation\":1,\"reason\":\"%s\"%s}",
            k ? "," : "", k, k, 4000 + k, k, k, reasons[k],
            strcmp(reasons[k], "killed") ? "" : ",\"signal\":9");
    snprintf(body + o, sizeof body - o, "]}");
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_BB,
                                 "{\"address\":\"127.0.0.9\",\"ttl_ms\":300000}", &r,
                                 "/v1/clusters/c2/machines/m9"),
                     0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_int_equal(h_http_json("POST", sd.url, H_TOK_BB, body, &r, "/v1/clusters/c2/events"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    json_t *ev = api("/v1/clusters/c2/events?limit=500");
    json_t *stopped = api("/v1/clusters/c2/processes?state=stopped");
    json_t *lists[2] = {json_object_get(ev, "events"), json_object_get(stopped, "processes")};
    for (int l = 0; l < 2; l++) {
        size_t i, seen = 0;
        json_t *e;
        json_array_foreach(lists[l], i, e) {
            const char *reason = json_string_value(json_object_get(e, "reason"));
            if (!reason)
                continue;
            seen++;
            assert_true(json_is_boolean(json_object_get(e, "failure")));
            assert_int_equal(json_is_true(json_object_get(e, "failure")),
                             !strcmp(reason, "killed"));
        }
        assert_int_equal(seen, 4);
    }
    json_decref(ev);
    json_decref(stopped);

    char out[16384];
    assert_int_equal(sdctl("c2", out, sizeof out, "-o", "json", "status", NULL), 0);
    json_t *st = json_loads(out, 0, NULL);
    assert_non_null(st);
    assert_int_equal(json_integer_value(json_object_get(st, "recent_failures")), 1);
    json_t *fl = json_object_get(st, "failures");
    assert_int_equal(json_array_size(fl), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(fl, 0), "reason")),
                        "killed");
    json_decref(st);
    assert_int_equal(sdctl("c2", out, sizeof out, "status", NULL), 0);
    assert_non_null(strstr(out, "recent failures: 1 in the last 500 events"));
    assert_null(strstr(out, "replaced"));
    assert_null(strstr(out, "drained"));
}

/* The newest series sample of c1 has ready == want (asserted by the caller). */
static int sample_ready(void *arg)
{
    long long *want = arg;
    h_resp_t r;
    int ok = h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/clusters/c1/series") == 0 &&
             r.status == 200;
    json_t *j = ok ? h_resp_json(&r) : NULL;
    json_t *s = json_array_get(json_object_get(j, "samples"),
                               json_array_size(json_object_get(j, "samples")) - 1);
    ok = s && json_integer_value(json_object_get(s, "ready")) == want[0] &&
         json_integer_value(json_object_get(s, "desired")) == want[1];
    if (ok)
        want[2] = json_integer_value(json_object_get(s, "static"));
    json_decref(j);
    h_resp_free(&r);
    return ok;
}

/* zone, static, runs one ready instance: the series counts it as static (desired 0 +
 * static 1 == ready 1: not "1 over"), also once a declared service wants 2 (desired 2,
 * static 1); sdctl status shows zone as static with no desired count. */
static void static_service_is_not_over(void **state)
{
    (void)state;
    char id[160], out[16384];
    json_t *in = bbt_inst(&bbt, "zone", 0);
    ready_at((int)bbt_int(in, "generation"), id, sizeof id);
    json_decref(in);
    long long want[3] = {1, 0, -1};
    assert_true(h_wait_every(sample_ready, want, 10000, 200));
    assert_int_equal(want[2], 1);

    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_OPS,
                                 "{\"command\": \"/bin/true\", \"count\": 2}", &r,
                                 "/v1/clusters/c1/services/lobby"),
                     0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    long long want2[3] = {1, 2, -1};
    assert_true(h_wait_every(sample_ready, want2, 10000, 200));
    assert_int_equal(want2[2], 1);

    assert_int_equal(sdctl("c1", out, sizeof out, "-o", "json", "status", NULL), 0);
    json_t *st = json_loads(out, 0, NULL);
    assert_non_null(st);
    size_t i;
    json_t *s;
    int found = 0;
    json_array_foreach(json_object_get(st, "services"), i, s) {
        if (strcmp(json_string_value(json_object_get(s, "service")) ?: "", "zone"))
            continue;
        found = 1;
        assert_true(json_is_true(json_object_get(s, "static")));
        assert_true(json_is_null(json_object_get(s, "desired")));
    }
    assert_true(found);
    json_decref(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(restarts_agree_everywhere),
        cmocka_unit_test(planned_stops_are_not_failures),
        cmocka_unit_test(static_service_is_not_over),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
