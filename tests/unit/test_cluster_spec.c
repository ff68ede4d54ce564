/* Unit tests of service specs (serverdir/cluster/cluster_spec.c): the envelope check with the
 * field named in each refusal, the canonical form equal specs share, and the
 * human-readable diff. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "cluster.h"

/* serverdir's main.c owns the config; the handlers linked in with the module refer to it. */
sd_config_t sd_cfg;

static json_t *parse(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

/* Validates text; returns 0 or -1 with the message in err. */
static int check(const char *text, char *err, size_t cap)
{
    json_t *j = parse(text);
    err[0] = '\0';
    int rc = sd_spec_validate(j, err, cap);
    json_decref(j);
    return rc;
}

static void valid_specs(void **state)
{
    (void)state;
    char err[SD_ERRMSG_MAX];
    assert_int_equal(check("{\"command\":\"/bin/g\",\"count\":0}", err, sizeof err), 0);
    assert_int_equal(check("{\"command\":\"/bin/g\",\"args\":[\"-x\"],\"env\":{\"A\":\"1\"},"
                           "\"count\":100000,\"placement\":{\"labels\":{\"zone\":\"eu\"},"
                           "\"max_per_machine\":10},\"health\":{\"type\":\"agent\"},"
                           "\"restart\":{\"policy\":\"always\"},\"stop\":{\"signal\":\"TERM\"},"
                           "\"user\":\"game\",\"cwd\":\"/srv\",\"rlimits\":{}}",
                           err, sizeof err), 0);
    assert_int_equal(check("{\"command\":\"/bin/g\",\"count\":1,\"disconnect\":{\"lost_after_ms\":"
                           "5000,\"replace\":false,\"stop_after_ms\":2000,\"reconcile\":"
                           "\"keep_original\"}}", err, sizeof err), 0);
}

static void invalid_specs_name_the_field(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"[]", "JSON object"},
        {"{\"count\":1}", "command"},
        {"{\"command\":\"\",\"count\":1}", "command"},
        {"{\"command\":\"x\"}", "count"},
        {"{\"command\":\"x\",\"count\":100001}", "count"},
        {"{\"command\":\"x\",\"count\":1.5}", "count"},
        {"{\"command\":\"x\",\"count\":1,\"nope\":1}", "nope"},
        {"{\"command\":\"x\",\"count\":1,\"args\":\"-x\"}", "args"},
        {"{\"command\":\"x\",\"count\":1,\"args\":[\"a\",2]}", "args[1]"},
        {"{\"command\":\"x\",\"count\":1,\"env\":{\"A=B\":\"1\"}}", "env"},
        {"{\"command\":\"x\",\"count\":1,\"env\":{\"A\":null}}", "env['A']"},
        {"{\"command\":\"x\",\"count\":1,\"placement\":[]}", "placement"},
        {"{\"command\":\"x\",\"count\":1,\"placement\":{\"max_per_machine\":0}}",
         "max_per_machine"},
        {"{\"command\":\"x\",\"count\":1,\"placement\":{\"labels\":{\"a b\":\"x\"}}}",
         "placement.labels"},
        {"{\"command\":\"x\",\"count\":1,\"stop\":5}", "stop"},
        {"{\"command\":\"x\",\"count\":1,\"user\":7}", "user"},
        {"{\"command\":\"x\",\"count\":1,\"disconnect\":[]}", "disconnect"},
        {"{\"command\":\"x\",\"count\":1,\"disconnect\":{\"stop_after_ms\":-1}}",
         "disconnect.stop_after_ms"},
        {"{\"command\":\"x\",\"count\":1,\"disconnect\":{\"replace\":1}}",
         "disconnect.replace"},
        {"{\"command\":\"x\",\"count\":1,\"disconnect\":{\"reconcile\":\"newest\"}}",
         "disconnect.reconcile"},
        {"{\"command\":\"x\",\"count\":1,\"disconnect\":{\"after\":1}}", "disconnect.after"},
    };
    char err[SD_ERRMSG_MAX];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(check(bad[i].spec, err, sizeof err), -1);
        if (!strstr(err, bad[i].needle))
            fail_msg("spec %s: message '%s' does not name '%s'", bad[i].spec, err,
                     bad[i].needle);
    }
}

static void canonical_form_is_order_free(void **state)
{
    (void)state;
    json_t *a = parse("{\"count\":1,\"command\":\"x\",\"env\":{\"B\":\"2\",\"A\":\"1\"}}");
    json_t *b = parse("{\"env\":{\"A\":\"1\",\"B\":\"2\"},\"command\":\"x\",\"count\":1}");
    char *ta = sd_json_canonical(a), *tb = sd_json_canonical(b);
    assert_string_equal(ta, tb);
    assert_string_equal(ta, "{\"command\":\"x\",\"count\":1,\"env\":{\"A\":\"1\",\"B\":\"2\"}}");
    free(ta);
    free(tb);
    json_decref(a);
    json_decref(b);
}

/* The diff lines of old -> new joined with '|'. */
static void diff(const char *old_text, const char *new_text, const char *want)
{
    json_t *o = old_text ? parse(old_text) : NULL, *n = new_text ? parse(new_text) : NULL;
    json_t *changes = json_array();
    sd_spec_diff(o, n, changes);
    char got[2048] = "";
    size_t i;
    json_t *c;
    json_array_foreach(changes, i, c) {
        if (i)
            strcat(got, "|");
        strcat(got, json_string_value(c));
    }
    assert_string_equal(got, want);
    json_decref(changes);
    json_decref(o);
    json_decref(n);
}

static void diffs_read_like_a_person_would_write_them(void **state)
{
    (void)state;
    diff(NULL, "{\"command\":\"x\",\"count\":1}", "created");
    diff("{\"command\":\"x\",\"count\":1}", NULL, "deleted");
    diff("{\"command\":\"x\",\"count\":1}", "{\"command\":\"x\",\"count\":1}", "");
    diff("{\"command\":\"x\",\"count\":3}", "{\"command\":\"y\",\"count\":5}",
         "command: \"x\" -> \"y\"|count: 3 -> 5");
    diff("{\"count\":1,\"placement\":{\"labels\":{\"zone\":\"eu\"}}}",
         "{\"count\":1,\"placement\":{\"labels\":{\"zone\":\"us\",\"rack\":\"2\"},"
         "\"max_per_machine\":4}}",
         "placement.labels.rack: (none) -> \"2\"|placement.labels.zone: \"eu\" -> \"us\"|"
         "placement.max_per_machine: (none) -> 4");
    diff("{\"args\":[\"a\"],\"env\":{\"A\":\"1\"}}", "{\"args\":[\"a\",\"b\"]}",
         "args: [\"a\"] -> [\"a\",\"b\"]|env: {\"A\":\"1\"} -> (none)");
    /* Long values are cut. */
    char big[600];
    memset(big, 'z', 300);
    big[300] = '\0';
    char spec[700];
    snprintf(spec, sizeof spec, "{\"command\":\"%s\"}", big);
    json_t *o = parse("{\"command\":\"x\"}"), *n = parse(spec), *changes = json_array();
    sd_spec_diff(o, n, changes);
    const char *line = json_string_value(json_array_get(changes, 0));
    assert_non_null(strstr(line, "..."));
    assert_true(strlen(line) < 200);
    json_decref(o);
    json_decref(n);
    json_decref(changes);
}

/* spec.disconnect: every member checked, each refusal names disconnect.<member>. */
static void disconnect_is_checked(void **state)
{
    (void)state;
    char err[SD_ERRMSG_MAX];
    assert_int_equal(check("{\"command\":\"x\",\"count\":1,\"disconnect\":{}}", err, sizeof err), 0);
    assert_int_equal(check("{\"command\":\"x\",\"count\":1,\"disconnect\":{\"lost_after_ms\":"
                           "30000,\"replace\":false,\"stop_after_ms\":10000,\"reconcile\":"
                           "\"keep_original\"}}", err, sizeof err), 0);
    static const struct {
        const char *d, *needle;
    } bad[] = {
        {"[]", "disconnect' must be"},
        {"{\"lost_after\":1}", "disconnect.lost_after"},
        {"{\"lost_after_ms\":-1}", "disconnect.lost_after_ms"},
        {"{\"lost_after_ms\":86400001}", "disconnect.lost_after_ms"},
        {"{\"lost_after_ms\":\"30s\"}", "disconnect.lost_after_ms"},
        {"{\"replace\":1}", "disconnect.replace"},
        {"{\"stop_after_ms\":500}", "disconnect.stop_after_ms"},
        {"{\"stop_after_ms\":1.5}", "disconnect.stop_after_ms"},
        {"{\"reconcile\":\"best_score\"}", "disconnect.reconcile"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "{\"command\":\"x\",\"count\":1,\"disconnect\":%s}",
                 bad[i].d);
        assert_int_equal(check(spec, err, sizeof err), -1);
        if (!strstr(err, bad[i].needle))
            fail_msg("spec %s: message '%s' does not name '%s'", spec, err, bad[i].needle);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_specs),
        cmocka_unit_test(invalid_specs_name_the_field),
        cmocka_unit_test(canonical_form_is_order_free),
        cmocka_unit_test(diffs_read_like_a_person_would_write_them),
        cmocka_unit_test(disconnect_is_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
