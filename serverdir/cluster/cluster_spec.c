/* Service specs: the envelope check serverdir does before storing one (bigbrother checks
 * the process parts when it applies it), the canonical text they are stored and compared
 * as, and the human-readable diff shown by PUT (and its dry run). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "sdvalid.h"

#define ARGS_MAX 256
#define ENV_MAX 256
#define STR_MAX 4096
#define DIFF_VALUE_MAX 120 /* characters of a value quoted in a diff line */
#define DIFF_LINES_MAX 200

char *sd_json_canonical(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
}

/* Checks obj[key], if present, as a map of at most max entries, key -> string; keys are
 * names (names) or environment variable names. */
static int string_map(sd_jv_t *v, const json_t *obj, const char *key, int names, size_t max)
{
    json_t *o = NULL;
    int rc = sd_jv_object(v, obj, key, SD_JV_NONNULL, &o);
    if (rc)
        return rc < 0 ? -1 : 0;
    if (json_object_size(o) > max)
        return sd_jv_fail(v, key, "must be an object of at most %zu strings", max);
    size_t mark = sd_jv_key(v, key);
    const char *k;
    const json_t *j;
    json_object_foreach(o, k, j) {
        if (names ? !sd_name_valid(k, SD_NAME_MAX) : (!*k || strlen(k) > 256 || strchr(k, '=')))
            return sd_jv_fail(v, NULL, "has an invalid key '%.64s'", k);
        if (!json_is_string(j) || strlen(json_string_value(j)) > STR_MAX) {
            sd_jv_member(v, k);
            return sd_jv_fail(v, NULL, "must be a string of at most %d bytes", STR_MAX);
        }
    }
    sd_jv_pop(v, mark);
    return 0;
}

/* spec.pool (docs/allocation.md, "Pools"): buffer an integer or "P%", min <= max. */
static int pool_check(sd_jv_t *v, const json_t *pool)
{
    static const char *const keys[] = {"buffer", "min", "max", "scale_down_delay_s", NULL};
    int64_t mn = 0, mx = SD_COUNT_MAX, n;
    size_t mark = sd_jv_key(v, "pool");
    if (sd_jv_only_keys(v, pool, keys) || sd_jv_int(v, pool, "min", 0, 0, SD_COUNT_MAX, &mn) < 0 ||
        sd_jv_int(v, pool, "max", 0, 0, SD_COUNT_MAX, &mx) < 0 ||
        sd_jv_int(v, pool, "scale_down_delay_s", 0, 0, 86400, &n) < 0)
        return -1;
    if (!json_object_get(pool, "min"))
        mn = 0;
    if (!json_object_get(pool, "max"))
        mx = SD_COUNT_MAX;
    if (mn > mx)
        return sd_jv_fail(v, "min", "must not be larger than max (%lld)", (long long)mx);
    const json_t *b = json_object_get(pool, "buffer");
    if (!b)
        return sd_jv_fail(v, "buffer", "is required");
    if (json_is_string(b)) {
        const char *t = json_string_value(b);
        char *end;
        long pc = strtol(t, &end, 10);
        if (end == t || strcmp(end, "%") || *t == '+' || *t == '-' || pc < 1 || pc > 99)
            return sd_jv_fail(v, "buffer", "must be an integer 0-%d or a percentage \"1%%\"-\"99%%\"",
                              SD_COUNT_MAX);
    } else if (sd_jv_int(v, pool, "buffer", 1, 0, SD_COUNT_MAX, &n) < 0) {
        return -1;
    }
    sd_jv_pop(v, mark);
    return 0;
}

/* The spec's "disconnect" object (docs/cluster.md, "Partitions"): lost_after_ms and
 * stop_after_ms 0-86400000, replace a boolean, reconcile keep_replacement or
 * keep_original. 0, or -1 with the path in v's error. */
static int disconnect_check(sd_jv_t *v, const json_t *d)
{
    static const char *const keys[] = {"lost_after_ms", "replace", "stop_after_ms",
                                       "reconcile", NULL};
    size_t mark = sd_jv_key(v, "disconnect");
    int64_t n;
    int b;
    const char *rec;
    if (sd_jv_only_keys(v, d, keys) || sd_jv_int(v, d, "lost_after_ms", 0, 0, 86400000, &n) < 0 ||
        sd_jv_int(v, d, "stop_after_ms", 0, 0, 86400000, &n) < 0 ||
        sd_jv_bool(v, d, "replace", 0, &b) < 0 || sd_jv_str(v, d, "reconcile", 0, 32, &rec) < 0)
        return -1;
    rec = json_string_value(json_object_get(d, "reconcile"));
    if (rec && strcmp(rec, "keep_replacement") && strcmp(rec, "keep_original"))
        return sd_jv_fail(v, "reconcile", "must be keep_replacement or keep_original");
    sd_jv_pop(v, mark);
    return 0;
}

int sd_spec_validate(const json_t *spec, char *err, size_t errcap)
{
    static const char *const keys[] = {"command", "args", "env", "count", "placement", "health",
                                       "restart", "stop", "user", "cwd", "rlimits", "pool",
                                       "on_release", "confirm_timeout_ms", "disconnect", NULL};
    static const char *const pkeys[] = {"labels", "max_per_machine", NULL};
    static const char *const objects[] = {"health", "restart", "stop", "rlimits"};
    const char *s;
    int64_t n;
    json_t *args = NULL, *pl = NULL, *o;
    sd_jv_t v;
    if (!json_is_object(spec)) {
        snprintf(err, errcap, "the service spec must be a JSON object");
        return -1;
    }
    sd_jv_init(&v, "", err, errcap);
    json_t *pool = NULL;
    if (sd_jv_only_keys(&v, spec, keys) || sd_jv_str(&v, spec, "command", 1, STR_MAX, &s) < 0 ||
        sd_jv_object(&v, spec, "pool", SD_JV_NONNULL, &pool) < 0 ||
        /* a pool's count is the primary's to compute: optional there */
        sd_jv_int(&v, spec, "count", pool ? 0 : 1, 0, SD_COUNT_MAX, &n) < 0 ||
        (pool && pool_check(&v, pool)) ||
        sd_jv_int(&v, spec, "confirm_timeout_ms", 0, 100, 600000, &n) < 0 ||
        sd_jv_str(&v, spec, "on_release", 0, 16, &s) < 0 ||
        sd_jv_str(&v, spec, "user", 0, 64, &s) < 0 ||
        sd_jv_str(&v, spec, "cwd", 0, STR_MAX, &s) < 0)
        return -1;
    if (!*json_string_value(json_object_get(spec, "command")))
        return sd_jv_fail(&v, "command", "must not be empty");
    const char *rel = json_string_value(json_object_get(spec, "on_release"));
    if (rel && strcmp(rel, "recycle") && strcmp(rel, "restart"))
        return sd_jv_fail(&v, "on_release", "must be recycle or restart");
    if (sd_jv_array(&v, spec, "args", SD_JV_NONNULL, ARGS_MAX, &args) < 0)
        return -1;
    size_t i;
    const json_t *a;
    json_array_foreach(args, i, a) {
        if (!json_is_string(a) || strlen(json_string_value(a)) > STR_MAX) {
            sd_jv_key(&v, "args");
            sd_jv_index(&v, i);
            return sd_jv_fail(&v, NULL, "must be a string of at most %d bytes", STR_MAX);
        }
    }
    if (string_map(&v, spec, "env", 0, ENV_MAX) ||
        sd_jv_object(&v, spec, "placement", SD_JV_NONNULL, &pl) < 0)
        return -1;
    if (pl) {
        size_t mark = sd_jv_key(&v, "placement");
        if (sd_jv_only_keys(&v, pl, pkeys) ||
            sd_jv_int(&v, pl, "max_per_machine", 0, 1, SD_COUNT_MAX, &n) < 0 ||
            string_map(&v, pl, "labels", 1, 32))
            return -1;
        sd_jv_pop(&v, mark);
    }
    for (size_t k = 0; k < SD_ARRAY_LEN(objects); k++)
        if (sd_jv_object(&v, spec, objects[k], SD_JV_NONNULL, &o) < 0)
            return -1;
    json_t *dis = NULL;
    if (sd_jv_object(&v, spec, "disconnect", SD_JV_NONNULL, &dis) < 0 ||
        (dis && disconnect_check(&v, dis)))
        return -1;
    char *text = sd_json_canonical(spec);
    size_t len = text ? strlen(text) : SIZE_MAX;
    free(text);
    if (len > SD_SPEC_MAX_BYTES) {
        snprintf(err, errcap, "the service spec is larger than %d bytes", SD_SPEC_MAX_BYTES);
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
    return sd_store_run(script, 1, &a, out);
}
