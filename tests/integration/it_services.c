/* Desired services against a real serverdir and redis-server: create/replace/delete with
 * versions (a PUT that changes nothing keeps the version), dry-run diffs that write
 * nothing, bad specs refused with specific codes and no change, roles, scale, stop/start,
 * rolling restart and restart of one instance, drain shown in the machines list, and
 * GET /state holding it all. */
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

#define ZONE "{\"command\":\"/usr/bin/gameproc\",\"args\":[\"--tick-hz\",\"20\"],\"count\":3," \
             "\"placement\":{\"labels\":{\"zone\":\"eu\"},\"max_per_machine\":2}," \
             "\"health\":{\"type\":\"agent\"},\"stop\":{\"signal\":\"TERM\",\"grace_ms\":5000}}"

/* The changes array of an answer as one "a|b|c" string. */
static const char *changes_text(const json_t *o, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(o, "changes"), i, c) {
        int k = snprintf(buf + n, cap - n, "%s%s", n ? "|" : "", json_string_value(c));
        if (k < 0 || (size_t)k >= cap - n)
            break;
        n += (size_t)k;
    }
    return buf;
}

static void crud_and_versions(void **state)
{
    (void)state;
    json_t *o;
    char ch[1024];
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, &o, NULL,
                             "/v1/clusters/s1/services/zone"), 200);
    assert_true(json_is_true(json_object_get(o, "changed")));
    assert_string_equal(changes_text(o, ch, sizeof ch), "created");
    long long v1 = ct_int(o, "version");
    assert_true(v1 >= 1);
    json_decref(o);
    /* The same spec again (keys in another order): no change, same version. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"count\":3,\"stop\":{\"grace_ms\":5000,\"signal\":\"TERM\"},"
                             "\"health\":{\"type\":\"agent\"},\"command\":\"/usr/bin/gameproc\","
                             "\"args\":[\"--tick-hz\",\"20\"],\"placement\":{\"max_per_machine\""
                             ":2,\"labels\":{\"zone\":\"eu\"}}}",
                             &o, NULL, "/v1/clusters/s1/services/zone"), 200);
    assert_false(json_is_true(json_object_get(o, "changed")));
    assert_int_equal(ct_int(o, "version"), v1);
    assert_int_equal(json_array_size(json_object_get(o, "changes")), 0);
    json_decref(o);
    /* A second service gets a later version (one counter per cluster). */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/lobby\",\"count\":1}",
                             &o, NULL, "/v1/clusters/s1/services/lobby"), 200);
    assert_true(ct_int(o, "version") > v1);
    json_decref(o);
    /* Read back: one and all (sorted by name). */
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/s1/services/zone"), 200);
    assert_string_equal(ct_str(o, "service"), "zone");
    assert_int_equal(ct_int(o, "version"), v1);
    assert_false(json_is_true(json_object_get(o, "stopped")));
    assert_int_equal(ct_int(o, "restart_token"), 0);
    assert_int_equal(ct_int(json_object_get(o, "spec"), "count"), 3);
    assert_string_equal(ct_str(json_object_get(json_object_get(json_object_get(o, "spec"),
                                                               "placement"), "labels"), "zone"),
                        "eu");
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/s1/services"), 200);
    const json_t *list = json_object_get(o, "services");
    assert_int_equal(json_array_size(list), 2);
    assert_string_equal(ct_str(json_array_get(list, 0), "service"), "lobby");
    assert_string_equal(ct_str(json_array_get(list, 1), "service"), "zone");
    json_decref(o);
    /* A real change lists what changed. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"command\":\"/bin/lobby\",\"count\":2,\"env\":{\"A\":\"1\"}}", &o,
                             NULL, "/v1/clusters/s1/services/lobby"), 200);
    assert_string_equal(changes_text(o, ch, sizeof ch), "count: 1 -> 2|env: (none) -> {\"A\":\"1\"}");
    json_decref(o);
    /* Delete, then it is gone. */
    char code[64];
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "DELETE", NULL, NULL, NULL,
                             "/v1/clusters/s1/services/lobby"), 204);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, NULL, code,
                             "/v1/clusters/s1/services/lobby"), 404);
    assert_string_equal(code, "unknown_service");
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "DELETE", NULL, NULL, code,
                             "/v1/clusters/s1/services/lobby"), 404);
}

static void dry_run_shows_changes_and_writes_nothing(void **state)
{
    (void)state;
    json_t *o;
    char ch[1024];
    h_keys_t before, after;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, NULL, NULL,
                             "/v1/clusters/s2/services/zone"), 200);
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("s2"), NULL);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT",
                             "{\"command\":\"/usr/bin/gameproc\",\"args\":[\"--tick-hz\",\"30\"],"
                             "\"count\":5,\"placement\":{\"labels\":{\"zone\":\"us\"},"
                             "\"max_per_machine\":2},\"stop\":{\"signal\":\"TERM\","
                             "\"grace_ms\":5000}}",
                             &o, NULL, "/v1/clusters/s2/services/zone?dry_run=1"), 200);
    assert_true(json_is_true(json_object_get(o, "dry_run")));
    assert_true(json_is_true(json_object_get(o, "changed")));
    assert_string_equal(changes_text(o, ch, sizeof ch),
                        "args: [\"--tick-hz\",\"20\"] -> [\"--tick-hz\",\"30\"]|count: 3 -> 5|"
                        "health: {\"type\":\"agent\"} -> (none)|"
                        "placement.labels.zone: \"eu\" -> \"us\"");
    json_decref(o);
    /* Dry runs of a new service and of a scale. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"x\",\"count\":1}", &o, NULL,
                             "/v1/clusters/s2/services/newone?dry_run=1"), 200);
    assert_string_equal(changes_text(o, ch, sizeof ch), "created");
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"count\":9}", &o, NULL,
                             "/v1/clusters/s2/services/zone/scale?dry_run=true"), 200);
    assert_string_equal(changes_text(o, ch, sizeof ch), "count: 3 -> 9");
    json_decref(o);
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("s2"), NULL);
    h_keys_same(&before, &after, __func__);
}

static void bad_specs_are_refused_and_change_nothing(void **state)
{
    (void)state;
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, NULL, NULL,
                             "/v1/clusters/s3/services/zone"), 200);
    static const struct {
        const char *body, *code;
    } bad[] = {
        {"{\"count\":3}", "bad_spec"},
        {"{\"command\":\"\",\"count\":3}", "bad_spec"},
        {"{\"command\":\"x\"}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":-1}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":100001}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"colour\":\"red\"}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"args\":[1]}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"env\":{\"A\":1}}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"placement\":{\"labels\":{\"bad key\":\"x\"}}}",
         "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"placement\":{\"max_per_machine\":0}}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"placement\":{\"spread\":true}}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1,\"health\":\"agent\"}", "bad_spec"},
        {"{\"command\":\"x\",\"count\":1", "bad_json"},
    };
    h_keys_t before, after;
    char code[64];
    h_keys_take(&redis, &before, H_KEYS_CLUSTER("s3"), NULL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", bad[i].body, NULL, code,
                                 "/v1/clusters/s3/services/zone"), 400);
        assert_string_equal(code, bad[i].code);
    }
    /* A spec over 64 KiB (20 variables of 4000 bytes). */
    json_t *env = json_object(), *spec = json_pack("{s:s, s:i}", "command", "x", "count", 1);
    char val[4001], key[8];
    memset(val, 'a', 4000);
    val[4000] = '\0';
    for (int k = 0; k < 20; k++) {
        snprintf(key, sizeof key, "K%d", k);
        json_object_set_new(env, key, json_string(val));
    }
    json_object_set_new(spec, "env", env);
    char *body = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", body, NULL, code,
                             "/v1/clusters/s3/services/zone"), 400);
    assert_string_equal(code, "bad_spec");
    free(body);
    /* Bad names and bodies of the other actions. */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, NULL, code,
                             "/v1/clusters/s3/services/bad%%20name"), 400);
    assert_string_equal(code, "bad_name");
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"count\":-2}", NULL, code,
                             "/v1/clusters/s3/services/zone/scale"), 400);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"max_unavailable\":0}", NULL, code,
                             "/v1/clusters/s3/services/zone/restart"), 400);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{}", NULL, code,
                             "/v1/clusters/s3/restart-instance"), 400);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, NULL, code,
                             "/v1/clusters/s3/services/zone?dry_run=maybe"), 400);
    assert_string_equal(code, "bad_query");
    h_keys_take(&redis, &after, H_KEYS_CLUSTER("s3"), NULL);
    h_keys_same(&before, &after, __func__);
}

static void roles(void **state)
{
    (void)state;
    char code[64];
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, NULL, NULL,
                             "/v1/clusters/s4/services/zone"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, NULL, NULL,
                             "/v1/clusters/s4/services"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, NULL, NULL, "/v1/clusters/s4/state"),
                     200);
    static const char *const writes[][2] = {
        {"PUT", "/v1/clusters/s4/services/zone"},
        {"DELETE", "/v1/clusters/s4/services/zone"},
        {"POST", "/v1/clusters/s4/services/zone/scale"},
        {"POST", "/v1/clusters/s4/services/zone/stop"},
        {"POST", "/v1/clusters/s4/services/zone/restart"},
        {"POST", "/v1/clusters/s4/stop"},
        {"POST", "/v1/clusters/s4/machines/m1/drain"},
    };
    const char *const toks[] = {H_TOK_VIEWER, H_TOK_BB, H_TOK_GAME};
    for (size_t i = 0; i < sizeof writes / sizeof writes[0]; i++)
        for (size_t t = 0; t < 3; t++) {
            assert_int_equal(ct_call(sd.url, toks[t], writes[i][0], "{\"count\":1}", NULL, code,
                                     "%s", writes[i][1]), 403);
            assert_string_equal(code, "forbidden");
        }
    assert_int_equal(ct_call(sd.url, NULL, "GET", NULL, NULL, code, "/v1/clusters/s4/services"),
                     401);
}

static void operator_actions(void **state)
{
    (void)state;
    json_t *o;
    char code[64];
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", ZONE, NULL, NULL,
                             "/v1/clusters/s5/services/zone"), 200);
    /* scale */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"count\":30}", &o, NULL,
                             "/v1/clusters/s5/services/zone/scale"), 200);
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"count\":30}", &o, NULL,
                             "/v1/clusters/s5/services/zone/scale"), 200);
    assert_false(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"count\":3}", NULL, code,
                             "/v1/clusters/s5/services/nosuch/scale"), 404);
    assert_string_equal(code, "unknown_service");
    /* stop / start */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, &o, NULL,
                             "/v1/clusters/s5/services/zone/stop"), 200);
    assert_true(json_is_true(json_object_get(o, "stopped")));
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/s5/services/zone"), 200);
    assert_true(json_is_true(json_object_get(o, "stopped")));
    assert_int_equal(ct_int(json_object_get(o, "spec"), "count"), 30); /* keeps its count */
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, NULL, NULL,
                             "/v1/clusters/s5/services/zone/start"), 200);
    /* rolling restart */
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"max_unavailable\":3}", &o, NULL,
                             "/v1/clusters/s5/services/zone/restart"), 200);
    assert_int_equal(ct_int(o, "restart_token"), 1);
    assert_int_equal(ct_int(o, "max_unavailable"), 3);
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, &o, NULL,
                             "/v1/clusters/s5/services/zone/restart"), 200);
    assert_int_equal(ct_int(o, "restart_token"), 2);
    assert_int_equal(ct_int(o, "max_unavailable"), 1);
    json_decref(o);
    /* restart of one instance: its slot's token */
    const char *ev = "{\"events\":[{\"id\":\"x1\",\"type\":\"started\",\"instance\":\"zone-m1-a\","
                     "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":7,\"slot\":4},"
                     "{\"id\":\"x2\",\"type\":\"started\",\"instance\":\"loose-1\",\"machine\":"
                     "\"m1\",\"service\":\"zone\",\"pid\":8}]}";
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", ev, NULL, NULL, "/v1/clusters/s5/events"),
                     200);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"instance\":\"zone-m1-a\"}", &o, NULL,
                             "/v1/clusters/s5/restart-instance"), 200);
    assert_string_equal(ct_str(o, "service"), "zone");
    assert_int_equal(ct_int(o, "slot"), 4);
    assert_int_equal(ct_int(o, "restart_token"), 1);
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"instance\":\"nobody\"}", NULL, code,
                             "/v1/clusters/s5/restart-instance"), 404);
    assert_string_equal(code, "unknown_instance");
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", "{\"instance\":\"loose-1\"}", NULL, code,
                             "/v1/clusters/s5/restart-instance"), 409);
    assert_string_equal(code, "no_slot");
    /* GET /state carries it all for the primary. */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL, "/v1/clusters/s5/state"),
                     200);
    const json_t *svc = json_array_get(json_object_get(o, "services"), 0);
    assert_string_equal(ct_str(svc, "service"), "zone");
    assert_int_equal(ct_int(svc, "restart_token"), 2);
    assert_int_equal(ct_int(json_object_get(svc, "slot_restart_tokens"), "4"), 1);
    assert_false(json_is_true(json_object_get(svc, "stopped")));
    assert_true(ct_int(o, "version") >= ct_int(svc, "version"));
    json_decref(o);
}

static int machine_draining(const char *m)
{
    json_t *o;
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/s6/machines"), 200);
    int d = -1;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(o, "machines"), i, x) if (!strcmp(ct_str(x, "machine"), m))
        d = json_is_true(json_object_get(x, "draining"));
    json_decref(o);
    return d;
}

static void drain_shows_in_machines_list(void **state)
{
    (void)state;
    json_t *o;
    char code[64];
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"capacity\":10}", NULL, NULL,
                             "/v1/clusters/s6/machines/m1"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", "{\"capacity\":10}", NULL, NULL,
                             "/v1/clusters/s6/machines/m2"), 200);
    assert_int_equal(machine_draining("m1"), 0);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, &o, NULL,
                             "/v1/clusters/s6/machines/m1/drain"), 200);
    assert_true(json_is_true(json_object_get(o, "changed")));
    json_decref(o);
    assert_int_equal(machine_draining("m1"), 1);
    assert_int_equal(machine_draining("m2"), 0);
    /* The one-machine read and the state show it too; a renewal keeps it. */
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "PUT", NULL, NULL, NULL,
                             "/v1/clusters/s6/machines/m1"), 200);
    assert_int_equal(ct_call(sd.url, H_TOK_VIEWER, "GET", NULL, &o, NULL,
                             "/v1/clusters/s6/machines/m1"), 200);
    assert_true(json_is_true(json_object_get(o, "draining")));
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "GET", NULL, &o, NULL, "/v1/clusters/s6/state"), 200);
    assert_true(json_is_true(json_object_get(json_array_get(json_object_get(o, "machines"), 0),
                                             "draining")));
    json_decref(o);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, NULL, NULL,
                             "/v1/clusters/s6/machines/m1/undrain"), 200);
    assert_int_equal(machine_draining("m1"), 0);
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "POST", NULL, NULL, code,
                             "/v1/clusters/s6/machines/nosuch/drain"), 404);
    assert_string_equal(code, "unknown_machine");
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crud_and_versions),
        cmocka_unit_test(dry_run_shows_changes_and_writes_nothing),
        cmocka_unit_test(bad_specs_are_refused_and_change_nothing),
        cmocka_unit_test(roles),
        cmocka_unit_test(operator_actions),
        cmocka_unit_test(drain_shows_in_machines_list),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
