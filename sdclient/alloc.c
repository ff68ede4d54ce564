/* libsdclient: allocations (docs/allocation.md): take a ready instance of a service for a
 * match or a realm, read them, list them, end one. Names and ranges are checked here so a
 * bad argument never reaches the network; the selector's contents are ServerDir's to
 * judge. */
#include <stdio.h>
#include <string.h>

#include "sdc_internal.h"
#include "sdproto.h"
#include "sdutil.h"

/* Pages of the largest size until next is null, at most SDC_ALLOCS_MAX allocations. */
#define SDC_ALLOCS_PAGE 1000
#define SDC_ALLOCS_MAX 1000000

/* The request body of r, or NULL with err filled (SDC_E_INVAL in *rc). */
static json_t *alloc_body(const sdc_alloc_req_t *r, int *rc, sdc_err_t *err)
{
    if ((*rc = sdc__names(err, 1, "service", r->service)))
        return NULL;
    if (r->idempotency_key && (*rc = sdc__names(err, 1, "idempotency key", r->idempotency_key)))
        return NULL;
    const char *bad = NULL;
    if (r->strategy && strcmp(r->strategy, "packed") && strcmp(r->strategy, "distributed"))
        bad = "the strategy is neither packed nor distributed";
    else if (r->players > SD_PLAYERS_MAX)
        bad = "players is above " SD_STR(SD_PLAYERS_MAX);
    else if (r->wait_ms < 0 || r->wait_ms > SD_ALLOC_WAIT_MAX_MS)
        bad = "wait_ms is not within 0.." SD_STR(SD_ALLOC_WAIT_MAX_MS);
    else if ((r->machine_labels && !json_is_object(r->machine_labels)) ||
             (r->metadata && !json_is_object(r->metadata)))
        bad = "a selector part is not an object";
    if (bad) {
        *rc = sdc__inval(err, bad);
        return NULL;
    }
    json_t *b = json_pack("{s:s, s:s}", "service", r->service, "mode", r->join ? "join" : "ready");
    if (!b) {
        *rc = SDC_E_NOMEM;
        return NULL;
    }
    if (r->strategy)
        json_object_set_new(b, "strategy", json_string(r->strategy));
    if (r->machine_labels || r->metadata) {
        json_t *sel = json_object();
        if (r->machine_labels)
            json_object_set(sel, "machine_labels", (json_t *)r->machine_labels);
        if (r->metadata)
            json_object_set(sel, "metadata", (json_t *)r->metadata);
        json_object_set_new(b, "selector", sel);
    }
    if (r->players >= 0)
        json_object_set_new(b, "players", json_integer(r->players));
    if (r->payload)
        json_object_set(b, "payload", (json_t *)r->payload);
    if (r->idempotency_key)
        json_object_set_new(b, "idempotency_key", json_string(r->idempotency_key));
    if (r->wait_ms > 0)
        json_object_set_new(b, "wait_ms", json_integer(r->wait_ms));
    return b;
}

int sdc_allocation_create(sdc_t *c, const char *cluster, const sdc_alloc_req_t *req,
                          json_t **out, sdc_err_t *err)
{
    if (out)
        *out = NULL;
    if (!req)
        return sdc__inval(err, "no request");
    int rc;
    json_t *body = alloc_body(req, &rc, err);
    if (!body)
        return rc;
    rc = sdc__cluster_call(c, "POST", cluster, NULL, NULL, body, out, err, "/allocations");
    json_decref(body);
    return rc;
}

int sdc_allocation_get(sdc_t *c, const char *cluster, const char *id, json_t **out,
                       sdc_err_t *err)
{
    return sdc__cluster_call(c, "GET", cluster, "allocation", id, NULL, out, err,
                             "/allocations/%s", id);
}

int sdc_allocation_release(sdc_t *c, const char *cluster, const char *id, json_t **out,
                           sdc_err_t *err)
{
    return sdc__cluster_call(c, "DELETE", cluster, "allocation", id, NULL, out, err,
                             "/allocations/%s", id);
}

/* "/v1/clusters/<cluster>/allocations" with the service filter and limit (0: none),
 * into path. */
static int list_path(char *path, size_t cap, const char *cluster, const char *service,
                     int limit, sdc_err_t *err)
{
    int rc = service ? sdc__names(err, 2, "cluster", cluster, "service", service)
                     : sdc__names(err, 1, "cluster", cluster);
    if (rc)
        return rc;
    if (limit < 0 || limit > SDC_ALLOCS_PAGE)
        return sdc__inval(err, "limit is not within 0.." SD_STR(SDC_ALLOCS_PAGE));
    sdc__cpath(path, cap, cluster, "/allocations");
    size_t n = strlen(path);
    if (service)
        n += (size_t)snprintf(path + n, cap - n, "?service=%s", service);
    if (limit > 0)
        snprintf(path + n, cap - n, "%climit=%d", service ? '&' : '?', limit);
    return SDC_OK;
}

int sdc_allocations_page(sdc_t *c, const char *cluster, const char *service,
                         const char *after, int limit, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    char path[SDC__PATH_MAX + 600], esc[3 * (SD_NAME_MAX + 1)];
    int rc = list_path(path, SDC__PATH_MAX, cluster, service, limit, err);
    if (rc)
        return rc;
    if (after && *after) {
        if (strlen(after) > SD_NAME_MAX)
            return sdc__inval(err, "after is too long");
        size_t n = strlen(path);
        snprintf(path + n, sizeof path - n, "%cafter=%s", strchr(path, '?') ? '&' : '?',
                 sdc_escape(after, esc, sizeof esc));
    }
    return sdc__call_object(c, "GET", path, NULL, out, err);
}

int sdc_allocations_list(sdc_t *c, const char *cluster, const char *service, json_t **out,
                         sdc_err_t *err)
{
    *out = NULL;
    char path[SDC__PATH_MAX];
    int rc = list_path(path, sizeof path, cluster, service, SDC_ALLOCS_PAGE, err);
    if (rc)
        return rc;
    return sdc__walk(c, path, "allocations", "after", "next", SDC_ALLOCS_MAX, out, err);
}

int sdc_pool_demand(sdc_t *c, const char *cluster, int64_t version, int wait_ms,
                    int64_t *out, sdc_err_t *err)
{
    if (sdc__names(err, 1, "cluster", cluster))
        return SDC_E_INVAL;
    if (wait_ms < 0)
        return sdc__inval(err, "the wait is negative");
    json_t *res = NULL;
    int rc = version >= 0 && wait_ms > 0
                 ? sdc__cluster_call(c, "GET", cluster, NULL, NULL, NULL, &res, err,
                                     "/pool-demand?version=%lld&wait=%d", (long long)version,
                                     wait_ms)
                 : sdc__cluster_call(c, "GET", cluster, NULL, NULL, NULL, &res, err,
                                     "/pool-demand");
    if (rc)
        return rc;
    const json_t *v = json_object_get(res, "version");
    if (!json_is_integer(v)) {
        json_decref(res);
        return sdc__proto(err, "pool-demand answer without a version");
    }
    *out = json_integer_value(v);
    json_decref(res);
    return SDC_OK;
}
