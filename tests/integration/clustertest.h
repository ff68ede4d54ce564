/* Helpers shared by the cluster-orchestration tests (it_services, it_primary,
 * it_assignments, it_sdctl_cluster): the redis-server and serverdir of the test file,
 * and one JSON call against a serverdir with a token, returning the status and the
 * parsed body. */
#ifndef SD_CLUSTERTEST_H
#define SD_CLUSTERTEST_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

/* The redis-server and serverdir the test file runs against (ct_start). */
static h_redis_t redis;
static h_serverdir_t sd;

/* Starts redis-server, then serverdir on it with the test tokens and the extra flags
 * (NULL-terminated, or NULL). Returns 0, or -1 when either does not start. */
static inline int ct_start(const char *const *extra)
{
    if (h_redis_start(&redis) || h_serverdir_start(&sd, redis.url, h_tokens_file(), extra))
        return -1;
    return 0;
}

/* cmocka group setup: ct_start without extra flags. */
static inline int ct_setup(void **state)
{
    (void)state;
    return ct_start(NULL);
}

/* cmocka group teardown: stops serverdir, then redis-server. */
static inline int ct_teardown(void **state)
{
    (void)state;
    h_serverdir_stop(&sd);
    h_redis_stop(&redis);
    return 0;
}

/* METHOD base+path (printf) with token and an optional JSON body. Returns the HTTP
 * status (-1 on a transport error); *out (when given) is the parsed body or NULL, and
 * code (when given, >= 64 bytes) gets error.code or "". */
static inline long ct_call(const char *base, const char *token, const char *method,
                           const char *body, json_t **out, char *code, const char *pathfmt, ...)
    __attribute__((format(printf, 7, 8)));
static inline long ct_call(const char *base, const char *token, const char *method,
                           const char *body, json_t **out, char *code, const char *pathfmt, ...)
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

/* Integer field of a JSON object (-1 when absent). */
static inline long long ct_int(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* String field of a JSON object ("" when absent). */
static inline const char *ct_str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

#endif
