/* Unit tests of the directory's validation and conversions (serverdir/directory/directory.c):
 * event batches, machine lease bodies, the config section, stream cursors, and stored
 * strings back to typed JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "directory.h"

/* serverdir's main.c owns the config; the handlers linked in with directory.c refer to it. */
sd_config_t sd_cfg;

static json_t *parse(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

/* Normalizes body; on success returns the script input parsed back, else NULL with the
 * message in err. */
static json_t *normalize(const char *body, char *err, size_t cap)
{
    json_t *b = parse(body);
    char *out = NULL;
    size_t n = 0;
    int rc = sd_dir_events_normalize(b, &out, &n, err, cap);
    json_decref(b);
    if (rc)
        return NULL;
    json_t *j = parse(out);
    assert_int_equal(json_array_size(j), n);
    free(out);
    return j;
}

/* Value of key in a flat [k, v, ...] array, or NULL. */
static const char *flat(const json_t *a, const char *key)
{
    for (size_t i = 0; i + 1 < json_array_size(a); i += 2)
        if (!strcmp(json_string_value(json_array_get(a, i)), key))
            return json_string_value(json_array_get(a, i + 1));
    return NULL;
}

static void events_normalized_to_strings(void **state)
{
    char err[SD_ERRMSG_MAX];
    json_t *j = normalize(
        "{\"events\":[{\"id\":\"m1-000042\",\"type\":\"started\",\"instance\":\"zone-3\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":12345,\"ts_ms\":1795000000000,"
        "\"slot\":3,\"generation\":2,\"ports\":{\"query\":27961,\"game\":27960}},"
        "{\"id\":\"m1-000044\",\"type\":\"stopped\",\"instance\":\"zone-3\",\"machine\":\"m1\","
        "\"service\":\"zone\",\"reason\":\"hung\",\"silent_ms\":3012,\"detail\":\"late\","
        "\"code\":null,\"signal\":6}]}",
        err, sizeof err);
    assert_non_null(j);
    json_t *s = json_array_get(j, 0), *p = json_array_get(j, 1);
    assert_string_equal(flat(s, "type"), "started");
    assert_string_equal(flat(s, "pid"), "12345");
    assert_string_equal(flat(s, "ts_ms"), "1795000000000");
    assert_string_equal(flat(s, "generation"), "2");
    assert_string_equal(flat(s, "ports"), "{\"game\":27960,\"query\":27961}");
    assert_null(flat(s, "reason"));
    assert_string_equal(flat(p, "reason"), "hung");
    assert_string_equal(flat(p, "signal"), "6");
    assert_string_equal(flat(p, "silent_ms"), "3012");
    assert_string_equal(flat(p, "detail"), "late");
    assert_null(flat(p, "code")); /* null is left out */
    assert_null(flat(p, "ts_ms")); /* the script stamps Redis time */
    json_decref(j);
}

static void events_errors_name_the_field(void **state)
{
    static const struct {
        const char *body, *msg;
    } cases[] = {
        {"{}", "field 'events' is required"},
        {"{\"events\":[]}", "array of 1 to 1000 events"},
        {"{\"events\":\"x\"}", "array of 1 to 1000 events"},
        {"{\"events\":[],\"more\":1}", "unknown field 'more'"},
        {"{\"events\":[null]}", "events[0] must be an object"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\"},{\"id\":\"b\",\"type\":\"gone\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\"}]}",
         "events[1].type must be started, ready, stopped, status, confirmed or released"},
        {"{\"events\":[{\"type\":\"ready\",\"instance\":\"i\",\"machine\":\"m\",\"service\":\"s\"}]}",
         "events[0].id is required"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i/j\",\"machine\":\"m\","
         "\"service\":\"s\"}]}",
         "events[0].instance must be 1-128 characters"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i\",\"machine\":1,"
         "\"service\":\"s\"}]}",
         "events[0].machine must be a string"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"started\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\"}]}",
         "events[0].pid is required"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"started\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"pid\":0}]}",
         "events[0].pid must be between 1 and 4194304"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"ts_ms\":1.5}]}",
         "events[0].ts_ms must be an integer"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"ports\":{\"a b\":1}}]}",
         "events[0].ports has a bad port name"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"ports\":{\"game\":0}}]}",
         "events[0].ports.game must be between 1 and 65535"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"ready\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"detail\":\"x\"}]}",
         "events[0].detail is only allowed in a stopped event"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"stopped\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"reason\":\"exited\",\"code\":\"1\"}]}",
         "events[0].code must be an integer"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"stopped\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"reason\":\"killed\",\"signal\":65}]}",
         "events[0].signal must be between 1 and 64"},
        {"{\"events\":[{\"id\":\"a\",\"type\":\"stopped\",\"instance\":\"i\",\"machine\":\"m\","
         "\"service\":\"s\",\"reason\":\"lost\"}]}",
         "events[0].reason must be one of"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[SD_ERRMSG_MAX] = "";
        json_t *j = normalize(cases[i].body, err, sizeof err);
        if (j || !strstr(err, cases[i].msg))
            fail_msg("case %zu: got '%s', want '%s'", i, j ? "accepted" : err, cases[i].msg);
    }

    /* A detail over 256 bytes and 1001 events. */
    char *big = malloc(600);
    snprintf(big, 600, "{\"events\":[{\"id\":\"a\",\"type\":\"stopped\",\"instance\":\"i\","
                       "\"machine\":\"m\",\"service\":\"s\",\"reason\":\"hung\",\"detail\":\"%0300d\"}]}",
             0);
    char err[SD_ERRMSG_MAX];
    assert_null(normalize(big, err, sizeof err));
    assert_non_null(strstr(err, "events[0].detail is longer than 256 bytes"));
    free(big);
    json_t *evs = json_array();
    for (int i = 0; i < 1001; i++)
        json_array_append_new(evs, json_pack("{s:s, s:s, s:s, s:s, s:s}", "id", "a", "type",
                                             "ready", "instance", "i", "machine", "m",
                                             "service", "s"));
    json_t *body = json_pack("{s:o}", "events", evs);
    char *out = NULL;
    size_t n;
    assert_int_equal(sd_dir_events_normalize(body, &out, &n, err, sizeof err), -1);
    assert_null(out);
    json_array_remove(evs, 0);
    assert_int_equal(sd_dir_events_normalize(body, &out, &n, err, sizeof err), 0);
    assert_int_equal(n, 1000);
    free(out);
    json_decref(body);
}

static void machine_body_checked(void **state)
{
    char err[SD_ERRMSG_MAX];
    sd_argv_t a;
    sd_argv_init(&a);
    json_t *b = parse("{\"address\":\"[::1]\",\"labels\":{\"zone\":\"eu\"},\"capacity\":4,"
                      "\"version\":\"1.2\",\"ttl_ms\":2000}");
    assert_int_equal(sd_dir_machine_args(b, &a, err, sizeof err), 0);
    assert_int_equal(a.argc, 9);
    assert_string_equal(a.argv[0], "2000");
    assert_string_equal(a.argv[1], "address");
    assert_string_equal(a.argv[2], "[::1]");
    assert_string_equal(a.argv[8], "{\"zone\":\"eu\"}");
    sd_argv_free(&a);
    json_decref(b);

    sd_argv_init(&a);
    assert_int_equal(sd_dir_machine_args(NULL, &a, err, sizeof err), 0);
    assert_int_equal(a.argc, 1);
    assert_string_equal(a.argv[0], "15000");
    sd_argv_free(&a);

    static const struct {
        const char *body, *msg;
    } cases[] = {
        {"{\"ttl_ms\":999}", "field 'ttl_ms' must be between 1000 and 300000"},
        {"{\"ttl_ms\":300001}", "field 'ttl_ms' must be between 1000 and 300000"},
        {"{\"capacity\":-1}", "field 'capacity' must be between"},
        {"{\"address\":\"a;b\"}", "field 'address' must be a host name"},
        {"{\"address\":7}", "field 'address' must be a string"},
        {"{\"version\":\"" "0123456789012345678901234567890123456789012345678901234567890123456789\"}",
         "field 'version' is longer than 64 bytes"},
        {"{\"labels\":{\"\":\"x\"}}", "field 'labels' has a bad key"},
        {"{\"labels\":{\"a\":null}}", "field 'labels.a' must be a string"},
        {"{\"name\":\"m1\"}", "unknown field 'name'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sd_argv_init(&a);
        b = parse(cases[i].body);
        err[0] = '\0';
        int rc = sd_dir_machine_args(b, &a, err, sizeof err);
        if (rc == 0 || !strstr(err, cases[i].msg))
            fail_msg("case %zu: got '%s', want '%s'", i, rc ? err : "accepted", cases[i].msg);
        sd_argv_free(&a);
        json_decref(b);
    }
}

static void config_section(void **state)
{
    char err[SD_ERRMSG_MAX];
    sd_dir_config_t saved = sd_dir_cfg;
    assert_int_equal(sd_dir_config_load(NULL, err, sizeof err), 0);
    assert_int_equal(sd_dir_cfg.history_max, 10000);
    assert_true(sd_dir_cfg.event_id_ttl_ms >= 24LL * 3600 * 1000);
    json_t *c = parse("{\"history_max\":50,\"stopped_keep\":20,\"stopped_ttl_s\":60,"
                      "\"event_id_ttl_s\":172800,\"machine_keep_s\":30}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), 0);
    assert_int_equal(sd_dir_cfg.history_max, 50);
    assert_int_equal(sd_dir_cfg.stopped_keep, 20);
    assert_int_equal(sd_dir_cfg.stopped_ttl_ms, 60000);
    assert_int_equal(sd_dir_cfg.event_id_ttl_ms, 172800000);
    assert_int_equal(sd_dir_cfg.machine_keep_ms, 30000);
    json_decref(c);
    c = parse("{\"event_id_ttl_s\":3600}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), -1);
    assert_non_null(strstr(err, "event_id_ttl_s"));
    json_decref(c);
    /* the ready-vs-desired series: 0 (off) or at least 100 ms */
    assert_int_equal(sd_dir_cfg.series_interval_ms, 60000);
    c = parse("{\"series_interval_ms\":50}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), -1);
    assert_non_null(strstr(err, "series_interval_ms"));
    assert_non_null(strstr(err, "must be 0 (off) or at least 100"));
    assert_int_equal(sd_dir_cfg.series_interval_ms, 60000);
    json_decref(c);
    c = parse("{\"series_interval_ms\":3600001}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), -1);
    json_decref(c);
    c = parse("{\"series_interval_ms\":0}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), 0);
    assert_int_equal(sd_dir_cfg.series_interval_ms, 0);
    json_decref(c);
    c = parse("{\"series_interval_ms\":100}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), 0);
    assert_int_equal(sd_dir_cfg.series_interval_ms, 100);
    json_decref(c);
    c = parse("{\"history\":5}");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown field 'history'"));
    json_decref(c);
    c = parse("[1]");
    assert_int_equal(sd_dir_config_load(c, err, sizeof err), -1);
    json_decref(c);
    sd_dir_cfg = saved;
}

static void stream_ids(void **state)
{
    assert_int_equal(sd_dir_stream_id_valid("0"), 0);
    assert_int_equal(sd_dir_stream_id_valid("1795000000000-12"), 0);
    assert_int_equal(sd_dir_stream_id_valid(""), -1);
    assert_int_equal(sd_dir_stream_id_valid("-1"), -1);
    assert_int_equal(sd_dir_stream_id_valid("12-"), -1);
    assert_int_equal(sd_dir_stream_id_valid("12-3-4"), -1);
    assert_int_equal(sd_dir_stream_id_valid("abc"), -1);
    assert_int_equal(sd_dir_stream_id_valid("123456789012345678901"), -1);
}

/* ---- stored -> JSON, from hand-built hiredis replies ---- */

static redisReply *str_reply(const char *s)
{
    redisReply *r = calloc(1, sizeof *r);
    r->type = REDIS_REPLY_STRING;
    r->str = (char *)s;
    r->len = strlen(s);
    return r;
}

/* An array reply of n strings (NULL-terminated varargs). */
static redisReply *arr_reply(const char *first, ...)
{
    redisReply *r = calloc(1, sizeof *r);
    r->type = REDIS_REPLY_ARRAY;
    r->element = calloc(32, sizeof(redisReply *));
    va_list ap;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *))
        r->element[r->elements++] = str_reply(s);
    va_end(ap);
    return r;
}

static void free_reply(redisReply *r)
{
    for (size_t i = 0; i < r->elements; i++)
        free_reply(r->element[i]);
    free(r->element);
    free(r);
}

static void stored_records_become_typed_json(void **state)
{
    redisReply *h = arr_reply("instance", "z1", "machine", "m1", "service", "zone", "state",
                              "stopped", "pid", "77", "generation", "2", "ports",
                              "{\"game\":27960}", "reason", "killed", "signal", "9",
                              "stopped_at_ms", "1795000009000", NULL);
    json_t *p = sd_dir_proc_json(h, "c1");
    assert_string_equal(json_string_value(json_object_get(p, "cluster")), "c1");
    assert_int_equal(json_integer_value(json_object_get(p, "pid")), 77);
    assert_int_equal(json_integer_value(json_object_get(p, "stopped_at_ms")), 1795000009000LL);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(p, "ports"), "game")), 27960);
    assert_true(json_is_null(json_object_get(p, "code")));
    assert_true(json_is_null(json_object_get(p, "ready_at_ms")));
    assert_true(json_is_null(json_object_get(p, "detail")));
    json_decref(p);
    free_reply(h);

    h = arr_reply("address", "10.0.0.5", "labels", "{\"zone\":\"eu\"}", "capacity", "400",
                  "expires_at_ms", "10000", "registered_at_ms", "5000", NULL);
    json_t *m = sd_dir_machine_json("m1", h, 9000);
    assert_string_equal(json_string_value(json_object_get(m, "state")), "live");
    assert_int_equal(json_integer_value(json_object_get(m, "expires_in_ms")), 1000);
    assert_int_equal(json_integer_value(json_object_get(m, "capacity")), 400);
    json_decref(m);
    m = sd_dir_machine_json("m1", h, 10000);
    assert_string_equal(json_string_value(json_object_get(m, "state")), "lost");
    assert_int_equal(json_integer_value(json_object_get(m, "expires_in_ms")), 0);
    json_decref(m);
    free_reply(h);

    redisReply *entry = calloc(1, sizeof *entry);
    entry->type = REDIS_REPLY_ARRAY;
    entry->element = calloc(2, sizeof(redisReply *));
    entry->elements = 2;
    entry->element[0] = str_reply("1795000000000-3");
    entry->element[1] = arr_reply("id", "e1", "type", "started", "pid", "12", "ts_ms", "5",
                                  "ports", "{\"game\":1}", NULL);
    json_t *e = sd_dir_event_json(entry);
    assert_string_equal(json_string_value(json_object_get(e, "seq")), "1795000000000-3");
    assert_int_equal(json_integer_value(json_object_get(e, "pid")), 12);
    assert_int_equal(json_integer_value(json_object_get(e, "ts_ms")), 5);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "started");
    assert_true(json_is_object(json_object_get(e, "ports")));
    json_decref(e);
    free_reply(entry);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(events_normalized_to_strings),
        cmocka_unit_test(events_errors_name_the_field),
        cmocka_unit_test(machine_body_checked),
        cmocka_unit_test(config_section),
        cmocka_unit_test(stream_ids),
        cmocka_unit_test(stored_records_become_typed_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
