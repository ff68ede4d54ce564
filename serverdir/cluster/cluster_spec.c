/* Service specs: the envelope check serverdir does before storing one (bigbrother checks
 * the process parts when it applies it), the canonical text they are stored and compared
 * as, and the human-readable diff shown by PUT (and its dry run). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"

#define ARGS_MAX 256
#define ENV_MAX 256
#define STR_MAX 4096
#define DIFF_VALUE_MAX 120 /* characters of a value quoted in a diff line */
#define DIFF_LINES_MAX 200

char *sd_json_canonical(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
}

/* An object of name -> string (env, placement.labels). */
static int string_map(const char *path, const json_t *o, int names,
                      size_t max, char *err, size_t errcap)
{
    if (!json_is_object(o) || json_object_size(o) > max) {
        snprintf(err, errcap, "field '%s' must be an object of at most %zu strings", path,
                 max);
        return -1;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        if (names ? !sd_name_valid(k, SD_NAME_MAX) : (!*k || strlen(k) > 256 || strchr(k, '='))) {
            snprintf(err, errcap, "%s: '%.64s' is not a valid key", path, k);
            return -1;
        }
        if (!json_is_string(v) || strlen(json_string_value(v)) > STR_MAX) {
            snprintf(err, errcap, "%s['%.64s'] must be a string of at most %d bytes",
                     path, k, STR_MAX);
            return -1;
        }
    }
    return 0;
}

int sd_spec_validate(const json_t *spec, char *err, size_t errcap)
{
    static const char *const keys[] = {"command", "args", "env", "count", "placement", "health",
                                       "restart", "stop", "user", "cwd", "rlimits", NULL};
    static const char *const pkeys[] = {"labels", "max_per_machine", NULL};
    static const char *const objects[] = {"health", "restart", "stop", "rlimits"};
    const char *s;
    int64_t n;
    if (!json_is_object(spec)) {
        snprintf(err, errcap, "the service spec must be a JSON object");
        return -1;
    }
    if (sd_json_only_keys(spec, keys, err, errcap) ||
        sd_json_str(spec, "command", 1, STR_MAX, &s, err, errcap) < 0 ||
        sd_json_int(spec, "count", 1, 0, SD_COUNT_MAX, &n, err, errcap) < 0 ||
        sd_json_str(spec, "user", 0, 64, &s, err, errcap) < 0 ||
        sd_json_str(spec, "cwd", 0, STR_MAX, &s, err, errcap) < 0)
        return -1;
    if (!*json_string_value(json_object_get(spec, "command"))) {
        snprintf(err, errcap, "field 'command' must not be empty");
        return -1;
    }
    const json_t *args = json_object_get(spec, "args");
    if (args) {
        if (!json_is_array(args) || json_array_size(args) > ARGS_MAX) {
            snprintf(err, errcap, "field 'args' must be an array of at most %d strings",
                     ARGS_MAX);
            return -1;
        }
        size_t i;
        const json_t *a;
        json_array_foreach(args, i, a) {
            if (!json_is_string(a) || strlen(json_string_value(a)) > STR_MAX) {
                snprintf(err, errcap, "args[%zu] must be a string of at most %d bytes", i,
                         STR_MAX);
                return -1;
            }
        }
    }
    const json_t *env = json_object_get(spec, "env");
    if (env && string_map("env", env, 0, ENV_MAX, err, errcap))
        return -1;
    const json_t *pl = json_object_get(spec, "placement");
    if (pl) {
        if (!json_is_object(pl)) {
            snprintf(err, errcap, "field 'placement' must be an object");
            return -1;
        }
        char e2[SD_ERRMSG_MAX];
        if (sd_json_only_keys(pl, pkeys, e2, sizeof e2) ||
            sd_json_int(pl, "max_per_machine", 0, 1, SD_COUNT_MAX, &n, e2, sizeof e2) < 0) {
            snprintf(err, errcap, "placement: %s", e2);
            return -1;
        }
        const json_t *labels = json_object_get(pl, "labels");
        if (labels && string_map("placement.labels", labels, 1, 32, err, errcap))
            return -1;
    }
    for (size_t i = 0; i < SD_ARRAY_LEN(objects); i++) {
        const json_t *o = json_object_get(spec, objects[i]);
        if (o && !json_is_object(o)) {
            snprintf(err, errcap, "field '%s' must be an object", objects[i]);
            return -1;
        }
    }
    char *text = sd_json_canonical(spec);
    size_t len = text ? strlen(text) : SIZE_MAX;
    free(text);
    if (len > SD_SPEC_MAX_BYTES) {
        snprintf(err, errcap, "the service spec is larger than %d bytes",
                 SD_SPEC_MAX_BYTES);
        return -1;
    }
    return 0;
}

/* The value as a short compact text for a diff line ("(none)" when absent). */
static void value_text(const json_t *v, char *buf, size_t cap)
{
    if (!v) {
        snprintf(buf, cap, "(none)");
        return;
    }
    char *t = sd_json_canonical(v);
    if (!t) {
        snprintf(buf, cap, "?");
        return;
    }
    if (strlen(t) > DIFF_VALUE_MAX)
        snprintf(buf, cap, "%.*s...", DIFF_VALUE_MAX, t);
    else
        snprintf(buf, cap, "%s", t);
    free(t);
}

static void diff_line(json_t *changes, const char *path, const json_t *a, const json_t *b)
{
    if (json_array_size(changes) >= DIFF_LINES_MAX)
        return;
    char x[DIFF_VALUE_MAX + 8], y[DIFF_VALUE_MAX + 8], line[2 * DIFF_VALUE_MAX + 300];
    value_text(a, x, sizeof x);
    value_text(b, y, sizeof y);
    snprintf(line, sizeof line, "%s: %s -> %s", path, x, y);
    json_array_append_new(changes, json_string(line));
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Objects are compared key by key (sorted, so the lines come out in a stable order);
 * anything else as a whole. */
static void diff_value(const char *path, const json_t *a, const json_t *b, json_t *changes)
{
    if (a && b && json_equal(a, b))
        return;
    if (!json_is_object(a) || !json_is_object(b)) {
        diff_line(changes, path, a, b);
        return;
    }
    json_t *keys = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a, k, v) json_object_set(keys, k, json_true());
    json_object_foreach((json_t *)b, k, v) json_object_set(keys, k, json_true());
    size_t n = json_object_size(keys), i = 0;
    const char **names = calloc(n ? n : 1, sizeof *names);
    if (names) {
        json_object_foreach(keys, k, v) names[i++] = k;
        qsort(names, n, sizeof *names, name_cmp);
        for (i = 0; i < n; i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", names[i]);
            diff_value(sub, json_object_get(a, names[i]), json_object_get(b, names[i]), changes);
        }
        free(names);
    }
    json_decref(keys);
}

void sd_spec_diff(const json_t *old_spec, const json_t *new_spec, json_t *changes)
{
    if (!old_spec && !new_spec)
        return;
    if (!old_spec) {
        json_array_append_new(changes, json_string("created"));
        return;
    }
    if (!new_spec) {
        json_array_append_new(changes, json_string("deleted"));
        return;
    }
    diff_value("", old_spec, new_spec, changes);
}

/* ---------- running cluster scripts ---------- */

int sd__cluster_run(const char *script, const char *cluster, redisReply **out, ...)
{
    char base[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    va_list ap;
    va_start(ap, out);
    for (const char *arg = va_arg(ap, const char *); arg; arg = va_arg(ap, const char *))
        sd_argv_add(&a, arg);
    va_end(ap);
    int rc = sd_store_script(script, 1, &a, out);
    sd_argv_free(&a);
    return rc;
}
