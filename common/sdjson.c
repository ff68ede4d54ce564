#include "sdjson.h"

#include "sdproto.h"
#include "sdutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks nesting depth without parsing: counts [ and { outside strings. */
static int depth_ok(const char *p, size_t n, int maxdepth)
{
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > maxdepth)
                return 0;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return 1;
}

json_t *sd_json_parse(const char *buf, size_t len, int maxdepth, char *err, size_t errcap)
{
    if (!depth_ok(buf, len, maxdepth)) {
        snprintf(err, errcap, "JSON nested deeper than %d levels", maxdepth);
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!v)
        snprintf(err, errcap, "invalid JSON at line %d column %d: %s", je.line, je.column,
                 je.text);
    return v;
}

static json_t *field(const json_t *obj, const char *key, int required, char *err,
                     size_t errcap, int *rc)
{
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(err, errcap, "field '%s' is required", key);
            *rc = -1;
        } else {
            *rc = 1;
        }
        return NULL;
    }
    *rc = 0;
    return v;
}

int sd_json_str(const json_t *obj, const char *key, int required, size_t maxlen,
                const char **out, char *err, size_t errcap)
{
    int rc;
    json_t *v = field(obj, key, required, err, errcap, &rc);
    if (!v)
        return rc;
    if (!json_is_string(v)) {
        snprintf(err, errcap, "field '%s' must be a string", key);
        return -1;
    }
    size_t n = json_string_length(v);
    if (n > maxlen) {
        snprintf(err, errcap, "field '%s' is longer than %zu bytes", key, maxlen);
        return -1;
    }
    if (strlen(json_string_value(v)) != n) {
        snprintf(err, errcap, "field '%s' contains a NUL character", key);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

int sd_json_name(const json_t *obj, const char *key, int required, const char **out,
                 char *err, size_t errcap)
{
    const char *s = NULL;
    int rc = sd_json_str(obj, key, required, SD_NAME_MAX, &s, err, errcap);
    if (rc)
        return rc;
    if (!sd_name_valid(s, SD_NAME_MAX)) {
        snprintf(err, errcap,
                 "field '%s' must be 1-%d characters of A-Z a-z 0-9 _ . : @ - "
                 "(not starting with '.' or '-', no '..')",
                 key, SD_NAME_MAX);
        return -1;
    }
    *out = s;
    return 0;
}

int sd_json_int(const json_t *obj, const char *key, int required, int64_t min, int64_t max,
                int64_t *out, char *err, size_t errcap)
{
    int rc;
    json_t *v = field(obj, key, required, err, errcap, &rc);
    if (!v)
        return rc;
    if (!json_is_integer(v)) {
        snprintf(err, errcap, "field '%s' must be an integer", key);
        return -1;
    }
    json_int_t i = json_integer_value(v);
    if (i < min || i > max) {
        snprintf(err, errcap, "field '%s' must be between %lld and %lld", key, (long long)min,
                 (long long)max);
        return -1;
    }
    *out = i;
    return 0;
}

int sd_json_bool(const json_t *obj, const char *key, int required, int *out, char *err,
                 size_t errcap)
{
    int rc;
    json_t *v = field(obj, key, required, err, errcap, &rc);
    if (!v)
        return rc;
    if (!json_is_boolean(v)) {
        snprintf(err, errcap, "field '%s' must be true or false", key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

int sd_json_only_keys(const json_t *obj, const char *const *allowed, char *err, size_t errcap)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int found = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0)
                found = 1;
        if (!found) {
            snprintf(err, errcap, "unknown field '%.64s'", key);
            return -1;
        }
    }
    return 0;
}

char *sd_json_dump(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}
