/* sdctl's cluster commands against a live serverdir: apply -f (dry run, apply, unchanged,
 * array form, a bad spec stores nothing), services, scale, delete, stop/start, restart
 * of a service and of an instance, drain/undrain, primary, cluster stop/start, status,
 * --help and the exit codes; an operation on a static service (a bigbrother config's)
 * refused in words, naming its machine, changing nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness_api.h"
#include "harness_bigbrother.h"
#include "harness_stack.h"
#include "harness_sdctl.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with the test tokens. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, NULL);
}

/* Runs sdctl (args NULL-terminated) in cluster `cl` with token; returns its exit code and
 * what it printed (stdout then stderr) in out. */
static int sdctl(const char *cl, const char *token, char *out, size_t cap, ...)
{
    char env_url[256], env_tok[128], env_cl[160];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    snprintf(env_tok, sizeof env_tok, "SERVERDIR_TOKEN=%s", token);
    snprintf(env_cl, sizeof env_cl, "SERVERDIR_CLUSTER=%s", cl);
    const char *env[] = {env_url, env_tok, env_cl, "NO_COLOR=1", NULL};
    va_list ap;
    va_start(ap, cap);
    int rc = h_sdctl_vrun(env, 20000, out, cap, ap);
    va_end(ap);
    return rc;
}

static size_t services_stored(const char *cl)
{
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/%s/services", cl), 200);
    size_t n = json_array_size(json_object_get(o, "services"));
    json_decref(o);
    return n;
}

static void apply_dry_run_apply_unchanged(void **state)
{
    (void)state;
    char out[8192], line[512];
    const char *dir = h_tmpdir();
    const char *file = h_write_file(
        dir, "services.json",
        "{\"services\": {\"zone\": {\"command\": \"/usr/bin/gameproc\", \"count\": 3},"
        " \"lobby\": {\"command\": \"/usr/bin/lobby\", \"count\": 1}}}", 0644);
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", file, "--dry-run",
                           NULL), 0);
    assert_non_null(strstr(out, "zone: 1 change"));
    assert_non_null(strstr(out, "  created"));
    assert_non_null(strstr(out, "nothing stored"));
    assert_int_equal(services_stored("k1"), 0);
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", file, NULL), 0);
    assert_non_null(strstr(out, "applied 2 service(s), 0 unchanged"));
    assert_int_equal(services_stored("k1"), 2);
    /* Again: nothing changes. */
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", file, NULL), 0);
    assert_non_null(h_line_with(out, "zone:", line, sizeof line));
    assert_non_null(strstr(line, "unchanged"));
    assert_non_null(strstr(out, "applied 0 service(s), 2 unchanged"));
    /* The array form, with a change shown field by field. */
    const char *arr = h_write_file(
        dir, "arr.json", "[{\"name\": \"zone\", \"command\": \"/usr/bin/gameproc\", \"count\": 5}]",
        0644);
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", arr, NULL), 0);
    assert_non_null(strstr(out, "count: 3 -> 5"));
    /* One bad spec: refused, nothing of the file stored. */
    const char *bad = h_write_file(
        dir, "bad.json",
        "{\"services\": {\"aaa\": {\"command\": \"/bin/a\", \"count\": 1},"
        " \"zzz\": {\"command\": \"/bin/z\", \"count\": -4}}}", 0644);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("k1"), NULL);
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", bad, NULL), 1);
    assert_non_null(strstr(out, "bad_spec"));
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("k1"), NULL);
    h_keys_same(&before, &after, __func__);
    /* Usage errors. */
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", NULL), 2);
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", "/nonexistent/x",
                           NULL), 2);
    const char *garbage = h_write_file(dir, "garbage.json", "{\"services\": [1", 0644);
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "apply", "-f", garbage, NULL), 2);
    /* -o json */
    assert_int_equal(sdctl("k1", H_TOK_OPS, out, sizeof out, "-o", "json", "apply", "-f", file,
                           "--dry-run", NULL), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_true(json_object_get(json_object_get(o, "zone"), "changed")));
    json_decref(o);
}

static void services_scale_stop_restart_delete(void **state)
{
    (void)state;
    char out[8192], line[512];
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"command\":\"/usr/bin/gameproc\",\"count\":3,\"placement\":"
                             "{\"labels\":{\"zone\":\"eu\"}}}",
                             NULL, NULL, "/v1/clusters/k2/services/zone"), 200);
    assert_int_equal(sdctl("k2", H_TOK_VIEWER, out, sizeof out, "services", NULL), 0);
    assert_non_null(strstr(out, "SERVICE"));
    assert_non_null(h_line_with(out, "zone ", line, sizeof line));
    assert_non_null(strstr(line, " 3 "));
    assert_non_null(strstr(line, "zone=eu"));
    assert_non_null(strstr(line, "/usr/bin/gameproc"));
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "scale", "zone", "7", NULL), 0);
    assert_non_null(strstr(out, "count: 3 -> 7"));
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "scale", "zone", "7", NULL), 0);
    assert_non_null(strstr(out, "already at 7"));
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "scale", "zone", "-1", NULL), 2);
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "scale", "nosuch", "3", NULL), 4);
    assert_int_equal(sdctl("k2", H_TOK_VIEWER, out, sizeof out, "scale", "zone", "3", NULL), 6);
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "stop", "zone", NULL), 0);
    assert_non_null(strstr(out, "zone: stopped"));
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "-o", "json", "services", "zone",
                           NULL), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_true(json_is_true(json_object_get(o, "stopped")));
    assert_int_equal(ct_int(json_object_get(o, "spec"), "count"), 7);
    json_decref(o);
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "start", "zone", NULL), 0);
    assert_non_null(strstr(out, "zone: started"));
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "restart", "zone",
                           "--max-unavailable", "2", NULL), 0);
    assert_non_null(strstr(out, "restart token 1, at most 2 at a time"));
    /* An instance name restarts that instance's slot. */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST",
                             "{\"events\":[{\"id\":\"i1\",\"type\":\"started\",\"instance\":"
                             "\"zone-m1-x\",\"machine\":\"m1\",\"service\":\"zone\",\"pid\":9,"
                             "\"slot\":2}]}",
                             NULL, NULL, "/v1/clusters/k2/events"), 200);
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "restart", "zone-m1-x", NULL), 0);
    assert_non_null(strstr(out, "service zone, slot 2"));
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "restart", "nobody", NULL), 4);
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "delete", "zone", NULL), 0);
    /* its Big Brother stops the deleted service's instance (while it still runs, the
     * name is taken for a static service: static_service_said_in_words) */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST",
                             "{\"events\":[{\"id\":\"i2\",\"type\":\"stopped\",\"instance\":"
                             "\"zone-m1-x\",\"machine\":\"m1\",\"service\":\"zone\",\"slot\":2,"
                             "\"reason\":\"replaced\"}]}",
                             NULL, NULL, "/v1/clusters/k2/events"), 200);
    assert_int_equal(sdctl("k2", H_TOK_OPS, out, sizeof out, "delete", "zone", NULL), 4);
}

static void drain_primary_cluster_and_status(void **state)
{
    (void)state;
    char out[16384], line[512];
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"capacity\":8}", NULL, NULL,
                             "/v1/clusters/k3/machines/m1"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"capacity\":8}", NULL, NULL,
                             "/v1/clusters/k3/machines/m2"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/g\",\"count\":2}",
                             NULL, NULL, "/v1/clusters/k3/services/zone"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST",
                             "{\"events\":["
                             "{\"id\":\"a\",\"type\":\"started\",\"instance\":\"zone-0\","
                             "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":10,\"slot\":0},"
                             "{\"id\":\"b\",\"type\":\"ready\",\"instance\":\"zone-0\","
                             "\"machine\":\"m1\",\"service\":\"zone\"},"
                             "{\"id\":\"c\",\"type\":\"started\",\"instance\":\"zone-1\","
                             "\"machine\":\"m2\",\"service\":\"zone\",\"pid\":11,\"slot\":1},"
                             "{\"id\":\"d\",\"type\":\"stopped\",\"instance\":\"zone-9\","
                             "\"machine\":\"m2\",\"service\":\"zone\",\"reason\":\"crash_loop\","
                             "\"detail\":\"5 restarts in 60 s\"}]}",
                             NULL, NULL, "/v1/clusters/k3/events"), 200);
    /* primary: none, then m1 */
    assert_int_equal(sdctl("k3", H_TOK_VIEWER, out, sizeof out, "primary", NULL), 0);
    assert_non_null(strstr(out, "HOLDER"));
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", "{\"machine\":\"m1\",\"ttl_ms\":60000}",
                             NULL, NULL, "/v1/clusters/k3/primary"), 200);
    assert_int_equal(sdctl("k3", H_TOK_VIEWER, out, sizeof out, "primary", NULL), 0);
    assert_non_null(h_line_with(out, "m1", line, sizeof line));
    assert_non_null(strstr(line, " 1 "));
    /* drain */
    assert_int_equal(sdctl("k3", H_TOK_OPS, out, sizeof out, "drain", "m2", NULL), 0);
    assert_non_null(strstr(out, "m2: draining"));
    assert_int_equal(sdctl("k3", H_TOK_OPS, out, sizeof out, "drain", "m9", NULL), 4);
    /* status: one screen */
    assert_int_equal(sdctl("k3", H_TOK_VIEWER, out, sizeof out, "status", NULL), 0);
    assert_non_null(strstr(out, "primary m1 (epoch 1"));
    assert_non_null(strstr(out, "realm running"));
    assert_non_null(h_line_with(out, "\nm1 ", line, sizeof line));
    assert_non_null(strstr(line, "*"));
    assert_non_null(h_line_with(out, "\nm2 ", line, sizeof line));
    assert_non_null(strstr(line, "yes"));
    assert_non_null(h_line_with(out, "\nzone ", line, sizeof line));
    assert_non_null(strstr(line, "converging"));
    assert_non_null(h_line_with(out, "crash_loop", line, sizeof line));
    assert_non_null(strstr(line, "zone-9"));
    assert_int_equal(sdctl("k3", H_TOK_VIEWER, out, sizeof out, "-o", "json", "status", NULL), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    const json_t *svc = json_array_get(json_object_get(o, "services"), 0);
    assert_int_equal(ct_int(svc, "desired"), 2);
    assert_int_equal(ct_int(svc, "running"), 2);
    assert_int_equal(ct_int(svc, "ready"), 1);
    assert_int_equal(json_array_size(json_object_get(o, "failures")), 1);
    json_decref(o);
    assert_int_equal(sdctl("k3", H_TOK_OPS, out, sizeof out, "undrain", "m2", NULL), 0);
    /* the realm switch */
    assert_int_equal(sdctl("k3", H_TOK_OPS, out, sizeof out, "cluster", "stop", NULL), 0);
    assert_non_null(strstr(out, "stopping"));
    assert_int_equal(sdctl("k3", H_TOK_VIEWER, out, sizeof out, "status", NULL), 0);
    assert_non_null(strstr(out, "realm STOPPED"));
    assert_int_equal(sdctl("k3", H_TOK_OPS, out, sizeof out, "cluster", "start", NULL), 0);
    assert_int_equal(sdctl("k3", H_TOK_OPS, out, sizeof out, "cluster", "pause", NULL), 2);
    assert_int_equal(sdctl("k3", H_TOK_VIEWER, out, sizeof out, "cluster", "stop", NULL), 6);
}

static void every_command_has_help(void **state)
{
    (void)state;
    static const char *const cmds[] = {"apply", "services", "scale", "delete", "stop", "start",
                                       "restart", "drain", "undrain", "primary", "cluster",
                                       "status"};
    char out[4096];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        assert_int_equal(sdctl("k4", H_TOK_VIEWER, out, sizeof out, cmds[i], "--help", NULL), 0);
        assert_non_null(strstr(out, "usage: sdctl"));
    }
}

/* h_wait_until condition: the directory of c1 lists a live process of service zone. */
static int static_zone_listed(void *arg)
{
    (void)arg;
    json_t *o = NULL;
    int st = ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                     "/v1/clusters/c1/processes?service=zone");
    int n = st == 200 ? (int)json_array_size(json_object_get(o, "processes")) : 0;
    json_decref(o);
    return n > 0;
}

/* A bigbrother (machine m1 of c1) runs zone from its own config: there is no desired
 * service zone, so restart/stop/start/scale/delete of it, and the restart of its
 * instance, cannot apply. Each says so in words (409 static_service, naming the machine
 * and bbctl) instead of 404 unknown_service / unknown_instance, and writes nothing. */
static void static_service_said_in_words(void **state)
{
    (void)state;
    bbt_t b = {0};
    bbt_dirs(&b);
    char extra[512], out[8192];
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\", \"credentials\": false}",
             sd.url, H_TOK_BB_C1(1));
    bbt_config(&b, "[{\"name\": \"zone\", \"command\": \"/bin/sleep\", \"args\": [\"100000\"],"
                   " \"health\": {\"type\": \"none\"}}]", extra);
    assert_true(bbt_start(&b) > 0);
    assert_true(h_wait_until(static_zone_listed, NULL, h_ms(15000)));
    json_t *in = bbt_inst(&b, "zone", 0);
    char inst[160];
    snprintf(inst, sizeof inst, "%s", bbt_str(in, "instance"));
    json_decref(in);
    const char *want = "zone is a static service of machine m1: use bbctl on that machine";
    h_keys_t before, after;
    h_keys_take(&redis, &before, "sd:{c1}:svc*", "sd:{c1}:services", "sd:{c1}:six",
                "sd:{c1}:desired:version", NULL);
    const char *cmds[][4] = {{"restart", "zone", NULL}, {"restart", inst, NULL},
                             {"stop", "zone", NULL},    {"start", "zone", NULL},
                             {"scale", "zone", "5"},    {"delete", "zone", NULL}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        int rc = sdctl("c1", H_TOK_OPS, out, sizeof out, cmds[i][0], cmds[i][1], cmds[i][2], NULL);
        if (rc != 5 || !strstr(out, want) || !strstr(out, "static_service"))
            fail_msg("sdctl %s %s -> %d:\n%s", cmds[i][0], cmds[i][1], rc, out);
    }
    json_t *o = NULL;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{}", &o, NULL,
                             "/v1/clusters/c1/services/zone/restart"), 409);
    json_t *e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "static_service");
    assert_string_equal(json_string_value(json_object_get(e, "machine")), "m1");
    assert_string_equal(json_string_value(json_object_get(e, "message")), want);
    json_decref(o);
    h_keys_take(&redis, &after, "sd:{c1}:svc*", "sd:{c1}:services", "sd:{c1}:six",
                "sd:{c1}:desired:version", NULL);
    h_keys_same(&before, &after, "operations on a static service");
    /* a name nothing runs is still unknown */
    assert_int_equal(sdctl("c1", H_TOK_OPS, out, sizeof out, "restart", "nosuch", NULL), 4);
    assert_int_equal(sdctl("c1", H_TOK_OPS, out, sizeof out, "stop", "nosuch", NULL), 4);
    bbt_stop(&b, 3000);
}

int main(void)
{
    h_init(180);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(apply_dry_run_apply_unchanged),
        cmocka_unit_test(services_scale_stop_restart_delete),
        cmocka_unit_test(drain_primary_cluster_and_status),
        cmocka_unit_test(every_command_has_help),
        cmocka_unit_test(static_service_said_in_words),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
