/* libsdclient internals shared by its source files; not part of the public API. */
#ifndef SDC_INTERNAL_H
#define SDC_INTERNAL_H

#include "sdclient.h"

/* Fills err (when given; cleared first) with the message `what` and returns
 * SDC_E_INVAL: a bad argument, caught before any request is sent. */
int sdc__inval(sdc_err_t *err, const char *what);

/* Sets err's message (when err is given) to `what` and returns SDC_E_PROTO: the answer
 * does not have the shape the API documents. */
int sdc__proto(sdc_err_t *err, const char *what);

/* Checks that each of the n (what, name) pairs is a valid name (sd_name_valid); returns
 * 0, or SDC_E_INVAL with err naming the first bad one ("machine is not a valid name"). */
int sdc__names(sdc_err_t *err, int n, ...);

/* Room for a request path: "/v1/clusters/<name>" and a suffix of names and query. */
#define SDC__PATH_MAX 1024

/* "/v1/clusters/<cluster><suffix>" with the suffix printf-formatted into path; returns
 * path. The names in it must have passed sdc__names (valid names need no escaping). */
const char *sdc__cpath(char *path, size_t cap, const char *cluster, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* sdc_request for an answer that must be a JSON object, stored in *out when out is
 * given (the caller frees it) and dropped otherwise; SDC_E_PROTO for any other shape. */
int sdc__call_object(sdc_t *c, const char *method, const char *path, const json_t *body,
                     json_t **out, sdc_err_t *err);

/* GETs path (which may carry a query) page after page: each page's array `list` is
 * appended, and its string `out_cursor` ("next" or "cursor") is sent back as the query
 * parameter `in_cursor` ("after" or "cursor") until it is null, at most `max` entries.
 * *out is the first page's object with the whole array, out_cursor null and
 * "truncated": true when max stopped the walk. */
int sdc__walk(sdc_t *c, const char *path, const char *list, const char *in_cursor,
              const char *out_cursor, size_t max, json_t **out, sdc_err_t *err);
/* sdc__walk of a cluster's list: checks the cluster's name, then walks
 * "/v1/clusters/<cluster>" plus suffix (the path and query of the first page) with the
 * after / next cursor. */
int sdc__cluster_walk(sdc_t *c, const char *cluster, const char *suffix, const char *list,
                      size_t max, json_t **out, sdc_err_t *err);
/* The shape of most calls: checks cluster and, when `what` is given, the name `name`
 * (SDC_E_INVAL naming the bad one), then sends method to "/v1/clusters/<cluster>" plus the
 * printf-formatted suffix with body (or none). With out, the answer must be a JSON object
 * (sdc__call_object; *out is NULL on failure); without, any answer or none (204) will do. */
int sdc__cluster_call(sdc_t *c, const char *method, const char *cluster, const char *what,
                      const char *name, const json_t *body, json_t **out, sdc_err_t *err,
                      const char *fmt, ...) __attribute__((format(printf, 9, 10)));

#endif
