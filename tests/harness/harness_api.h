/* Harness addition for the tests of the cluster-orchestration API (it_services,
 * it_primary, it_assignments, it_sdctl_cluster): one JSON call against a serverdir with
 * a token, returning the status and the parsed body, and fields of that body. */
#ifndef SD_HARNESS_API_H
#define SD_HARNESS_API_H

#include <jansson.h>

/* METHOD base+path (printf) with token and an optional JSON body. Returns the HTTP
 * status (-1 on a transport error); *out (when given) is the parsed body or NULL (caller
 * decrefs), and code (when given, >= 64 bytes) gets error.code or "". */
long ct_call(const char *base, const char *token, const char *method, const char *body,
             json_t **out, char *code, const char *pathfmt, ...)
    __attribute__((format(printf, 7, 8)));

/* Integer field of a JSON object (-1 when absent). */
long long ct_int(const json_t *o, const char *k);

/* String field of a JSON object ("" when absent). */
const char *ct_str(const json_t *o, const char *k);

#endif
