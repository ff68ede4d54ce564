/* spec.disconnect on the primary's side (docs/cluster.md, "A machine cut off"): two
 * bigbrothers in cluster mode (m1, m2), the one that is not the primary paused with
 * SIGSTOP (its games keep running, its lease runs out, it is declared lost), three
 * services of 2 slots (one on each machine):
 *   - match, no disconnect (today): replaced at once once declared lost;
 *   - zone, lost_after_ms 4000: replaced about 4 s after match, its cut-off process not
 *     marked stopped meanwhile;
 *   - realm, replace false: never replaced; on SIGCONT its original keeps running;
 *   - duel, reconcile keep_original (the primary's side, with a machine whose reports the
 *     test makes): the slot goes back to the returned original.
 * And a bad disconnect is refused 400 bad_spec naming the member, with nothing written. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "harness_cluster.h"

#define LOST_AFTER_MS 4000

static cl_t C;

static int has_primary(cl_t *c, void *arg)
{
    (void)arg;
    return cl_primary(c, NULL)[0] != 0;
}

static void bad_disconnect_is_refused(void **state)
{
    (void)state;
    static const struct {
        const char *d, *names;
    } bad[] = {
        {"{\"lost_after_ms\": -1}", "disconnect.lost_after_ms"},
        {"{\"lost_after_ms\": \"4s\"}", "disconnect.lost_after_ms"},
        {"{\"replace\": \"no\"}", "disconnect.replace"},
        {"{\"stop_after_ms\": 10}", "disconnect.stop_after_ms"},
        {"{\"reconcile\": \"newest\"}", "disconnect.reconcile"},
        {"{\"lost_after\": 4000}", "disconnect.lost_after"},
        {"7", "disconnect"},
    };
    char url[256];
    snprintf(url, sizeof(url), "%s%s/services/bad", C.sd.url, CL_BASE);
    h_keys_t before, after;
    h_keys_take(&C.redis, &before, "sd:{c1}:svc*", "sd:{c1}:six*", "sd:{c1}:services",
                "sd:{c1}:desired:*", NULL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char body[256];
        snprintf(body, sizeof(body), "{\"command\": \"/bin/true\", \"count\": 1,"
                 " \"disconnect\": %s}", bad[i].d);
        long st = 0;
        json_t *j = cl_api("PUT", url, body, &st);
        assert_int_equal(st, 400);
        json_t *e = json_object_get(j, "error");
        assert_string_equal(bbt_str(e, "code"), "bad_spec"); /* every refused spec */
        if (!strstr(bbt_str(e, "message"), bad[i].names))
            fail_msg("%s: message '%s' does not name %s", bad[i].d, bbt_str(e, "message"),
                     bad[i].names);
        json_decref(j);
    }
    h_keys_take(&C.redis, &after, "sd:{c1}:svc*", "sd:{c1}:six*", "sd:{c1}:services",
                "sd:{c1}:desired:*", NULL);
    h_keys_same(&before, &after, __func__);
}

/* The pid bigbrother i runs for service, 0 when none. */
static long pid_of(int i, const char *service)
{
    json_t *st = bbt_ctl(&C.bb[i], "status");
    long pid = 0;
    size_t k;
    json_t *in;
    json_array_foreach(json_object_get(st, "instances"), k, in)
        if (!strcmp(bbt_str(in, "service"), service) && bbt_int(in, "pid") > 0)
            pid = (long)bbt_int(in, "pid");
    json_decref(st);
    return pid;
}

/* Directory records of service on machine stopped with reason machine_lost. */
static int lost_records(const char *service, const char *machine)
{
    char path[256];
    snprintf(path, sizeof(path), "/processes?service=%s&machine=%s&state=stopped", service,
             machine);
    json_t *j = cl_get(&C, path);
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        n += !strcmp(bbt_str(p, "reason"), "machine_lost");
    json_decref(j);
    return n;
}

static void cut_off_machine_under_each_setting(void **state)
{
    (void)state;
    assert_true(cl_wait(&C, has_primary, NULL, cl_ms(15000)));
    char extra[160];
    assert_int_equal(cl_service(&C, "match", 2, NULL, NULL), 200);
    snprintf(extra, sizeof(extra), ", \"disconnect\": {\"lost_after_ms\": %d}", LOST_AFTER_MS);
    assert_int_equal(cl_service(&C, "zone", 2, NULL, extra), 200);
    /* realm's games must outlive the cut and the resume: a liveness timeout longer than
     * the whole cut (the paused Big Brother reads their heartbeats only on SIGCONT) */
    char realm[512];
    snprintf(realm, sizeof(realm),
             "{\"command\": \"%s\", \"args\": [\"--tick-hz\", \"10\"], \"count\": 2,"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": %d,"
             " \"liveness_timeout_ms\": 60000}, \"stop\": {\"signal\": \"TERM\","
             " \"grace_ms\": 3000}, \"disconnect\": {\"replace\": false}}",
             GAMEPROC, cl_ms(15000));
    assert_int_equal(cl_op(&C, "PUT", "/services/realm", realm), 200);
    const char *svcs[] = {"match", "zone", "realm"};
    for (int s = 0; s < 3; s++) {
        cl_conv_t w = {svcs[s], 2, 0};
        assert_true(cl_wait(&C, cl_converged, &w, cl_ms(40000)));
    }
    int prim = cl_index(&C, cl_primary(&C, NULL)), cut = !prim;
    long realm_pid = pid_of(cut, "realm");
    assert_true(realm_pid > 0);
    assert_int_equal(cl_running(&C, cut, "zone"), 1);

    int64_t t0 = h_now_ms();
    kill(C.bb[cut].pid, SIGSTOP);
    cl_conv_t match = {"match", 2, 1u << cut}, zone = {"zone", 2, 1u << cut};
    assert_true(cl_wait(&C, cl_converged, &match, cl_ms(20000)));
    int64_t t_match = h_now_ms() - t0;
    /* declared lost: match's cut-off process is marked stopped, zone's is not (yet) */
    assert_int_equal(lost_records("match", C.name[cut]), 1);
    assert_int_equal(lost_records("zone", C.name[cut]), 0);
    assert_int_equal(cl_running(&C, prim, "zone"), 1);
    assert_true(cl_wait(&C, cl_converged, &zone, cl_ms(20000 + LOST_AFTER_MS)));
    int64_t t_zone = h_now_ms() - t0;
    print_message("cut at 0: match (no disconnect) replaced after %lld ms, zone "
                  "(lost_after_ms %d) after %lld ms: %lld ms later\n",
                  (long long)t_match, LOST_AFTER_MS, (long long)t_zone,
                  (long long)(t_zone - t_match));
    assert_true(t_zone - t_match >= LOST_AFTER_MS - 1000);
    assert_true(t_zone - t_match <= cl_ms(LOST_AFTER_MS + 3000));
    assert_int_equal(lost_records("zone", C.name[cut]), 1);

    /* realm (replace false): still one slot only, on the primary's machine, a while on */
    int64_t until = h_now_ms() + cl_ms(3000);
    while (h_now_ms() < until) {
        assert_int_equal(cl_running(&C, prim, "realm"), 1);
        h_sleep_ms(200);
    }
    assert_int_equal(lost_records("realm", C.name[cut]), 0);
    char path[128];
    snprintf(path, sizeof(path), "/machines/%s/assignments", C.name[cut]);
    json_t *doc = cl_get(&C, path);
    json_t *slots = json_object_get(doc, "slots");
    assert_int_equal(json_array_size(slots), 1);
    assert_string_equal(bbt_str(json_array_get(slots, 0), "service"), "realm");
    json_decref(doc);

    /* back: realm's original runs on, the others are the replacements' */
    kill(C.bb[cut].pid, SIGCONT);
    for (int s = 0; s < 3; s++) {
        cl_conv_t w = {svcs[s], 2, 0};
        assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
    }
    if (pid_of(cut, "realm") != realm_pid) {
        json_t *j = cl_get(&C, "/processes?service=realm&state=stopped");
        char *t = json_dumps(j, JSON_COMPACT);
        fail_msg("realm's original was not kept: %s (log %s)", t, C.bb[cut].log);
    }
    assert_int_equal(cl_running(&C, cut, "zone"), 0);
    assert_int_equal(cl_running(&C, cut, "match"), 0);
}

/* A request as a Big Brother (its token) on CL_BASE + path; the HTTP status. */
static long as_bb(const char *method, const char *path, const char *body)
{
    h_resp_t r = {0};
    long st = h_http_json(method, C.sd.url, H_TOK_BB, body, &r, "%s%s", CL_BASE, path) == 0
                  ? r.status
                  : -1;
    h_resp_free(&r);
    return st;
}

/* The machine holding slot 0 of service, "" when none (a static buffer). */
static const char *slot0_on(const char *service)
{
    static char on[16];
    on[0] = '\0';
    json_t *st = cl_get(&C, "/state");
    const char *m;
    json_t *doc;
    json_object_foreach(json_object_get(st, "assignments"), m, doc) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(doc, "slots"), i, e)
            if (!strcmp(bbt_str(e, "service"), service))
                snprintf(on, sizeof(on), "%s", m);
    }
    json_decref(st);
    return on;
}

static int repl; /* the real machine running duel's replacement */

static int duel_replaced(cl_t *c, void *arg)
{
    (void)arg;
    repl = cl_index(c, slot0_on("duel"));
    return repl >= 0 && repl < c->n && cl_running(c, repl, "duel") == 1;
}

static int duel_back_on_m9(cl_t *c, void *arg)
{
    (void)arg;
    return !strcmp(slot0_on("duel"), "m9") && cl_running(c, repl, "duel") == 0;
}

/* reconcile keep_original, the primary's side: the original runs on m9, a machine with
 * no Big Brother whose reports the test makes by hand. m9's lease runs out; the slot is
 * replaced on m1 or m2 once its labels are dropped, without the original being marked
 * stopped; m9 registers again and reports the original (a status event after its new
 * registration): the slot goes back to m9 and the replacement's Big Brother stops it as
 * replaced. */
static void keep_original_gets_its_slot_back(void **state)
{
    (void)state;
    assert_int_equal(as_bb("PUT", "/machines/m9",
                           "{\"ttl_ms\": 2000, \"labels\": {\"fake\": \"1\"}, \"capacity\": 10}"),
                     200);
    const char *dc = ", \"disconnect\": {\"reconcile\": \"keep_original\"}";
    char extra[256];
    snprintf(extra, sizeof(extra), "%s, \"placement\": {\"labels\": {\"fake\": \"1\"}}", dc);
    assert_int_equal(cl_service(&C, "duel", 1, NULL, extra), 200);
    const char *ev =
        "{\"events\": [{\"id\": \"d1\", \"type\": \"started\", \"instance\": \"duel-orig\","
        " \"machine\": \"m9\", \"service\": \"duel\", \"pid\": 4000000, \"slot\": 0},"
        " {\"id\": \"d2\", \"type\": \"ready\", \"instance\": \"duel-orig\", \"machine\": \"m9\","
        " \"service\": \"duel\"}]}";
    assert_int_equal(as_bb("POST", "/events", ev), 200);
    int64_t until = h_now_ms() + cl_ms(5000);
    while (strcmp(slot0_on("duel"), "m9") && h_now_ms() < until)
        h_sleep_ms(100);
    assert_string_equal(slot0_on("duel"), "m9");
    /* m9 is not renewed: once declared lost the slot may go to m1 (labels dropped) */
    assert_int_equal(cl_service(&C, "duel", 1, NULL, dc), 200);
    assert_true(cl_wait(&C, duel_replaced, NULL, cl_ms(20000)));
    json_t *o = cl_get(&C, "/processes/duel-orig");
    assert_string_equal(bbt_str(o, "state"), "ready"); /* not marked machine_lost */
    json_decref(o);
    /* m9 is back and reports its original */
    assert_int_equal(as_bb("PUT", "/machines/m9", "{\"ttl_ms\": 60000}"), 200);
    h_sleep_ms(5); /* a report after the new registration, by the Redis clock */
    assert_int_equal(as_bb("POST", "/events",
                           "{\"events\": [{\"id\": \"d3\", \"type\": \"status\","
                           " \"instance\": \"duel-orig\", \"machine\": \"m9\","
                           " \"service\": \"duel\", \"players\": 1}]}"),
                     200);
    int64_t t0 = h_now_ms();
    assert_true(cl_wait(&C, duel_back_on_m9, NULL, cl_ms(10000)));
    print_message("keep_original: slot given back to the returned machine %lld ms after "
                  "its report\n", (long long)(h_now_ms() - t0));
    assert_true(bbt_wait_file_has(C.bb[repl].log, "service=duel", cl_ms(10000)));
    assert_true(bbt_wait_file_has(C.bb[repl].log, "reason=replaced", cl_ms(10000)));
    assert_int_equal(cl_op(&C, "DELETE", "/services/duel", NULL) / 100, 2);
}

int main(void)
{
    h_init(h_valgrind() ? 300 : 120);
    cl_start(&C, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_disconnect_is_refused),
        cmocka_unit_test(cut_off_machine_under_each_setting),
        cmocka_unit_test(keep_original_gets_its_slot_back),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cl_stop(&C);
    return rc;
}
