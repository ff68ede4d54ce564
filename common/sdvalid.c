#include "sdvalid.h"

#include "sdproto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void sd_jv_init(sd_jv_t *v, const char *root, char *err, size_t errcap)
{
    v->err = err;
    v->errcap = errcap;
    v->file = NULL;
    v->pathlen = 0;
    v->path[0] = '\0';
    sd_jv_key(v, root);
}

void sd_jv_init_file(sd_jv_t *v, const char *file, char *err, size_t errcap)
{
    sd_jv_init(v, "", err, errcap);
    v->file = file;
}

/* Appends the formatted text to the path; a path that does not fit ends in "...". */
static size_t path_push(sd_jv_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static size_t path_push(sd_jv_t *v, const char *fmt, ...)
{
    size_t mark = v->pathlen, room = sizeof(v->path) - mark;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(v->path + mark, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
        v->path[mark] = '\0';
        return mark;
    }
    if ((size_t)n >= room) {
        memcpy(v->path + sizeof(v->path) - 4, "...", 4);
        v->pathlen = sizeof(v->path) - 1;
    } else {
        v->pathlen = mark + (size_t)n;
    }
    return mark;
}

size_t sd_jv_key(sd_jv_t *v, const char *key)
{
    if (!key[0])
        return v->pathlen;
    return path_push(v, "%s%s", v->pathlen ? "." : "", key);
}

size_t sd_jv_index(sd_jv_t *v, size_t i)
{
    return path_push(v, "[%zu]", i);
}

size_t sd_jv_member(sd_jv_t *v, const char *member)
{
    return path_push(v, "['%.64s']", member);
}

void sd_jv_pop(sd_jv_t *v, size_t mark)
{
    v->pathlen = mark;
    v->path[mark] = '\0';
}

/* Writes the message for the current path: `why`, or "unknown field" when unknown. */
static void report(sd_jv_t *v, int unknown, const char *why)
{
    const char *p = v->path;
    if (v->file)
        snprintf(v->err, v->errcap, "%s: %s: %s", v->file, v->pathlen ? p : "(top level)",
                 unknown ? "unknown field" : why);
    else if (unknown)
        snprintf(v->err, v->errcap, "unknown field '%s'", p);
    else if (v->pathlen && !strchr(p, '['))
        snprintf(v->err, v->errcap, "field '%s' %s", p, why);
    else
        snprintf(v->err, v->errcap, "%s %s", v->pathlen ? p : "(top level)", why);
}

int sd_jv_fail(sd_jv_t *v, const char *key, const char *fmt, ...)
{
    size_t mark = key ? sd_jv_key(v, key) : v->pathlen;
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    report(v, 0, why);
    sd_jv_pop(v, mark);
    return -1;
}

/* obj[key], or NULL when absent or null (unless SD_JV_NONNULL): then *rc is 1, or -1
 * with "is required". */
static json_t *field(sd_jv_t *v, const json_t *obj, const char *key, int required, int *rc)
{
    json_t *j = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    *rc = 0;
    if (j && (!json_is_null(j) || required == SD_JV_NONNULL))
        return j;
    *rc = required == SD_JV_REQUIRED ? sd_jv_fail(v, key, "is required") : 1;
    return NULL;
}

/* field() of one JSON type (JSON_TRUE stands for either boolean): the value, or NULL
 * with *rc as field() sets it, or -1 with "must be <what>" for a value of another type. */
static json_t *typed(sd_jv_t *v, const json_t *obj, const char *key, int required,
                     json_type type, const char *what, int *rc)
{
    json_t *j = field(v, obj, key, required, rc);
    if (j && !(json_typeof(j) == type || (type == JSON_TRUE && json_is_boolean(j)))) {
        *rc = sd_jv_fail(v, key, "must be %s", what);
        return NULL;
    }
    return j;
}

int sd_jv_str(sd_jv_t *v, const json_t *obj, const char *key, int required, size_t maxlen,
              const char **out)
{
    int rc;
    json_t *j = typed(v, obj, key, required, JSON_STRING, "a string", &rc);
    if (!j)
        return rc;
    size_t n = json_string_length(j);
    if (n > maxlen)
        return sd_jv_fail(v, key, "is longer than %zu bytes", maxlen);
    if (strlen(json_string_value(j)) != n)
        return sd_jv_fail(v, key, "contains a NUL character");
    *out = json_string_value(j);
    return 0;
}

int sd_jv_name(sd_jv_t *v, const json_t *obj, const char *key, int required,
               const char **out)
{
    const char *s = NULL;
    int rc = sd_jv_str(v, obj, key, required, SD_NAME_MAX, &s);
    if (rc)
        return rc;
    if (!sd_name_valid(s, SD_NAME_MAX))
        return sd_jv_fail(v, key,
                          "must be 1-%d characters of " SD_NAME_CHARSET_TEXT " "
                          "(not starting with '.' or '-', no '..')",
                          SD_NAME_MAX);
    *out = s;
    return 0;
}

int sd_jv_int(sd_jv_t *v, const json_t *obj, const char *key, int required, int64_t min,
              int64_t max, int64_t *out)
{
    int rc;
    json_t *j = typed(v, obj, key, required, JSON_INTEGER, "an integer", &rc);
    if (!j)
        return rc;
    json_int_t n = json_integer_value(j);
    if (n < min || n > max)
        return sd_jv_fail(v, key, "must be between %lld and %lld", (long long)min,
                          (long long)max);
    *out = n;
    return 0;
}

int sd_jv_i32(sd_jv_t *v, const json_t *obj, const char *key, int required, int min, int max,
              int *out)
{
    int64_t n;
    int rc = sd_jv_int(v, obj, key, required, min, max, &n);
    if (rc == 0)
        *out = (int)n;
    return rc;
}

int sd_jv_bool(sd_jv_t *v, const json_t *obj, const char *key, int required, int *out)
{
    int rc;
    json_t *j = typed(v, obj, key, required, JSON_TRUE, "true or false", &rc);
    if (j)
        *out = json_is_true(j);
    return j ? 0 : rc;
}

int sd_jv_object(sd_jv_t *v, const json_t *obj, const char *key, int required,
                 json_t **out)
{
    int rc;
    json_t *j = typed(v, obj, key, required, JSON_OBJECT, "an object", &rc);
    if (j)
        *out = j;
    return j ? 0 : rc;
}

int sd_jv_array(sd_jv_t *v, const json_t *obj, const char *key, int required,
                size_t maxitems, json_t **out)
{
    int rc;
    json_t *j = typed(v, obj, key, required, JSON_ARRAY, "an array", &rc);
    if (!j)
        return rc;
    if (json_array_size(j) > maxitems)
        return sd_jv_fail(v, key, "has more than %zu entries", maxitems);
    *out = j;
    return 0;
}

int sd_jv_enum(sd_jv_t *v, const json_t *obj, const char *key, int required,
               const char *const *names, int *out)
{
    const char *s = NULL;
    int rc = sd_jv_str(v, obj, key, required, 256, &s);
    if (rc)
        return rc;
    int n = 0;
    while (names[n] && strcmp(names[n], s))
        n++;
    if (names[n]) {
        *out = n;
        return 0;
    }
    char list[256] = "";
    size_t len = 0;
    for (int i = 0; names[i] && len < sizeof(list); i++) {
        const char *sep = i == 0 ? "" : n == 2 ? " or " : ", ";
        int w = snprintf(list + len, sizeof(list) - len, "%s%s", sep, names[i]);
        len += w > 0 ? (size_t)w : 0;
    }
    if (v->file)
        return sd_jv_fail(v, key, "'%.64s' must be %s%s", s, n == 2 ? "" : "one of ", list);
    return sd_jv_fail(v, key, "must be %s%s", n == 2 ? "" : "one of ", list);
}

int sd_jv_only_keys(sd_jv_t *v, const json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *j;
    json_object_foreach((json_t *)obj, key, j) {
        const char *const *a = allowed;
        while (*a && strcmp(*a, key))
            a++;
        if (!*a) {
            size_t mark = path_push(v, "%s%.64s", v->pathlen ? "." : "", key);
            report(v, 1, NULL);
            sd_jv_pop(v, mark);
            return -1;
        }
    }
    return 0;
}
