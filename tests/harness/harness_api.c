/* One JSON call against a serverdir, and the fields of its answer. */
#include "harness_api.h"

#include <stdarg.h>
#include <stdio.h>

#include "harness.h"

long ct_call(const char *base, const char *token, const char *method, const char *body,
             json_t **out, char *code, const char *pathfmt, ...)
{
    char path[1024];
    va_list ap;
    va_start(ap, pathfmt);
    vsnprintf(path, sizeof path, pathfmt, ap);
    va_end(ap);
    h_resp_t r;
    if (out)
        *out = NULL;
    if (code)
        code[0] = '\0';
    if (h_http_json(method, base, token, body, &r, "%s", path))
        return -1;
    long st = r.status;
    if (out)
        *out = h_resp_json(&r);
    if (code)
        snprintf(code, 64, "%s", h_err_code(&r));
    h_resp_free(&r);
    return st;
}

long long ct_int(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

const char *ct_str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}
