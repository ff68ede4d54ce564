/* spec.disconnect on the primary's side (docs/cluster.md, "A machine cut off"): two
 * bigbrothers in cluster mode (m1, m2), the one that is not the primary paused with
 * SIGSTOP (its games keep running, its lease runs out, it is declared lost), three
 * services of 2 slots (one on each machine):
 *   - match, no disconnect (today): replaced at once once declared lost;
 *   - zone, lost_after_ms 4000: replaced about 4 s after match, its cut-off process not
 *     marked stopped meanwhile;
 *   - realm, replace false: never replaced; on SIGCONT its original keeps running.
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
    assert_int_equal(cl_service(&C, "realm", 2, NULL, ", \"disconnect\": {\"replace\": false}"),
                     200);
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
    assert_int_equal(pid_of(cut, "realm"), realm_pid);
    assert_int_equal(cl_running(&C, cut, "zone"), 0);
    assert_int_equal(cl_running(&C, cut, "match"), 0);
}

int main(void)
{
    h_init(h_valgrind() ? 300 : 120);
    cl_start(&C, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_disconnect_is_refused),
        cmocka_unit_test(cut_off_machine_under_each_setting),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cl_stop(&C);
    return rc;
}
