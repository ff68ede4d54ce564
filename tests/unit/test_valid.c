/* Unit tests of the JSON validator (common/sdvalid.h): field paths, each getter's
 * message, absent vs null vs wrong type, and the caps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "sdvalid.h"

static json_t *parse(const char *s)
{
    json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL);
    assert_non_null(j);
    return j;
}

/* Nested pushes build "services[2].health", pops restore it, and a top-level key is
 * quoted in a plain context. */
static void paths_nest_and_pop(void **state)
{
    (void)state;
    char err[256];
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    size_t m0 = sd_jv_key(&v, "services");
    size_t m1 = sd_jv_index(&v, 2);
    size_t m2 = sd_jv_key(&v, "health");
    assert_string_equal(v.path, "services[2].health");
    assert_int_equal(sd_jv_fail(&v, "type", "must be %s", "agent"), -1);
    assert_string_equal(err, "services[2].health.type must be agent");
    assert_string_equal(v.path, "services[2].health");
    sd_jv_pop(&v, m2);
    assert_string_equal(v.path, "services[2]");
    sd_jv_pop(&v, m1);
    sd_jv_pop(&v, m0);
    assert_string_equal(v.path, "");
    sd_jv_fail(&v, "count", "is bad");
    assert_string_equal(err, "field 'count' is bad");
    sd_jv_fail(&v, NULL, "must be an object");
    assert_string_equal(err, "(top level) must be an object");

    sd_jv_init(&v, "master", err, sizeof err);
    sd_jv_fail(&v, "udp", "is bad");
    assert_string_equal(err, "master.udp is bad");
}

/* A file context reads "FILE: PATH: why", and unknown keys name their path. */
static void file_context(void **state)
{
    (void)state;
    char err[256];
    sd_jv_t v;
    json_t *j = parse("{\"health\": {\"type\": \"grpc\", \"bogus\": 1}}");
    static const char *const keys[] = {"type", NULL};
    static const char *const types[] = {"agent", "tcp", "none", NULL};
    static const char *const modes[] = {"standalone", "cluster", NULL};
    int t = -1;
    sd_jv_init_file(&v, "t.json", err, sizeof err);
    sd_jv_fail(&v, NULL, "must be a JSON object");
    assert_string_equal(err, "t.json: (top level): must be a JSON object");
    size_t m = sd_jv_key(&v, "health");
    assert_int_equal(sd_jv_only_keys(&v, json_object_get(j, "health"), keys), -1);
    assert_string_equal(err, "t.json: health.bogus: unknown field");
    assert_int_equal(sd_jv_enum(&v, json_object_get(j, "health"), "type", 1, types, &t), -1);
    assert_string_equal(err, "t.json: health.type: 'grpc' must be one of agent, tcp, none");
    assert_int_equal(sd_jv_enum(&v, json_object_get(j, "health"), "type", 1, modes, &t), -1);
    assert_string_equal(err, "t.json: health.type: 'grpc' must be standalone or cluster");
    assert_int_equal(t, -1);
    sd_jv_pop(&v, m);
    json_decref(j);
}

/* Absent and null are the same: 1 when optional (out untouched), "is required" when
 * required; a wrong type is an error either way. */
static void absent_null_and_wrong_type(void **state)
{
    (void)state;
    char err[256];
    sd_jv_t v;
    json_t *j = parse("{\"n\": null, \"s\": 5, \"o\": {\"x\": []}}");
    sd_jv_init(&v, "", err, sizeof err);
    const char *s = "default";
    assert_int_equal(sd_jv_str(&v, j, "missing", 0, 10, &s), 1);
    assert_int_equal(sd_jv_str(&v, j, "n", 0, 10, &s), 1);
    assert_string_equal(s, "default");
    assert_int_equal(sd_jv_str(&v, j, "n", 1, 10, &s), -1);
    assert_string_equal(err, "field 'n' is required");
    assert_int_equal(sd_jv_str(&v, j, "s", 0, 10, &s), -1);
    assert_string_equal(err, "field 's' must be a string");
    /* a non-object holder: every field is absent */
    assert_int_equal(sd_jv_str(&v, NULL, "s", 0, 10, &s), 1);

    json_t *o = NULL;
    assert_int_equal(sd_jv_object(&v, j, "o", 1, &o), 0);
    size_t m = sd_jv_key(&v, "o");
    int b = 7;
    assert_int_equal(sd_jv_bool(&v, o, "x", 0, &b), -1);
    assert_string_equal(err, "o.x must be true or false");
    assert_int_equal(b, 7);
    assert_int_equal(sd_jv_object(&v, o, "x", 0, &o), -1);
    assert_string_equal(err, "o.x must be an object");
    sd_jv_pop(&v, m);
    assert_int_equal(sd_jv_array(&v, j, "o", 0, 5, &o), -1);
    assert_string_equal(err, "field 'o' must be an array");
    json_decref(j);
}

/* Each getter's own checks and messages. */
static void getters(void **state)
{
    (void)state;
    char err[256];
    sd_jv_t v;
    json_t *j = parse("{\"s\": \"abcdef\", \"z\": \"a\\u0000b\", \"bad\": \"-x\", \"ok\": \"m-1\","
                      " \"i\": 42, \"f\": 1.5, \"t\": true, \"a\": [1, 2, 3], \"e\": \"tcp\","
                      " \"more\": 1}");
    sd_jv_init(&v, "", err, sizeof err);
    const char *s = NULL;
    assert_int_equal(sd_jv_str(&v, j, "s", 1, 6, &s), 0);
    assert_string_equal(s, "abcdef");
    assert_int_equal(sd_jv_str(&v, j, "s", 1, 5, &s), -1);
    assert_string_equal(err, "field 's' is longer than 5 bytes");
    assert_int_equal(sd_jv_str(&v, j, "z", 1, 5, &s), -1);
    assert_string_equal(err, "field 'z' contains a NUL character");

    assert_int_equal(sd_jv_name(&v, j, "ok", 1, &s), 0);
    assert_string_equal(s, "m-1");
    assert_int_equal(sd_jv_name(&v, j, "bad", 1, &s), -1);
    assert_non_null(strstr(err, "field 'bad' must be 1-128 characters of A-Z"));

    int64_t n = 0;
    int i = 0;
    assert_int_equal(sd_jv_int(&v, j, "i", 1, 0, 42, &n), 0);
    assert_int_equal(n, 42);
    assert_int_equal(sd_jv_int(&v, j, "i", 1, 0, 41, &n), -1);
    assert_string_equal(err, "field 'i' must be between 0 and 41");
    assert_int_equal(sd_jv_i32(&v, j, "i", 1, 43, 50, &i), -1);
    assert_string_equal(err, "field 'i' must be between 43 and 50");
    assert_int_equal(sd_jv_i32(&v, j, "f", 1, 0, 5, &i), -1);
    assert_string_equal(err, "field 'f' must be an integer");
    assert_int_equal(sd_jv_i32(&v, j, "i", 1, 0, 100, &i), 0);
    assert_int_equal(i, 42);

    assert_int_equal(sd_jv_bool(&v, j, "t", 1, &i), 0);
    assert_int_equal(i, 1);

    json_t *a = NULL;
    assert_int_equal(sd_jv_array(&v, j, "a", 1, 3, &a), 0);
    assert_int_equal(json_array_size(a), 3);
    assert_int_equal(sd_jv_array(&v, j, "a", 1, 2, &a), -1);
    assert_string_equal(err, "field 'a' has more than 2 entries");

    static const char *const types[] = {"agent", "tcp", "udp", NULL};
    static const char *const other[] = {"on", "off", NULL};
    assert_int_equal(sd_jv_enum(&v, j, "e", 1, types, &i), 0);
    assert_int_equal(i, 1);
    assert_int_equal(sd_jv_enum(&v, j, "e", 1, other, &i), -1);
    assert_string_equal(err, "field 'e' must be on or off");
    assert_int_equal(sd_jv_enum(&v, j, "i", 1, other, &i), -1);
    assert_string_equal(err, "field 'i' must be a string");

    static const char *const keys[] = {"s", "z", "bad", "ok", "i", "f", "t", "a", "e", NULL};
    assert_int_equal(sd_jv_only_keys(&v, j, keys), -1);
    assert_string_equal(err, "unknown field 'more'");
    size_t m = sd_jv_key(&v, "events");
    sd_jv_index(&v, 0);
    assert_int_equal(sd_jv_only_keys(&v, j, keys), -1);
    assert_string_equal(err, "unknown field 'events[0].more'");
    sd_jv_pop(&v, m);
    json_decref(j);
}

/* A path longer than the buffer ends in "..." and pops back exactly. */
static void long_paths_are_capped(void **state)
{
    (void)state;
    char err[64];
    sd_jv_t v;
    char key[300];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    sd_jv_init(&v, "root", err, sizeof err);
    size_t m = sd_jv_key(&v, key);
    assert_int_equal(strlen(v.path), sizeof v.path - 1);
    assert_string_equal(v.path + sizeof v.path - 4, "...");
    sd_jv_fail(&v, NULL, "is bad");
    assert_int_equal(strlen(err), sizeof err - 1); /* the message is cut to the buffer */
    sd_jv_pop(&v, m);
    assert_string_equal(v.path, "root");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(paths_nest_and_pop),
        cmocka_unit_test(file_context),
        cmocka_unit_test(absent_null_and_wrong_type),
        cmocka_unit_test(getters),
        cmocka_unit_test(long_paths_are_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
