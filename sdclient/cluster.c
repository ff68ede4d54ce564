/* libsdclient: desired services, operator actions, the primary lease and assignments
 * (docs/cluster.md). Thin typed wrappers over sdc_request; every function checks its
 * names first so a bad argument never reaches the network. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdc_internal.h"
#include "sdproto.h"
#include "sdutil.h"


/* ---------- services ---------- */

int sdc_service_put(sdc_t *c, const char *cluster, const char *svc, const json_t *spec,
                    int dry_run, json_t **out, sdc_err_t *err)
{
    if (!json_is_object(spec))
        return sdc__inval(err, "the spec is not an object");
    return sdc__cluster_call(c, "PUT", cluster, "service", svc, spec, out, err, "/services/%s%s",
                             svc, dry_run ? "?dry_run=1" : "");
}

int sdc_services_list(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err)
{
    return sdc__cluster_walk(c, cluster, "/services?limit=500", "services", 100000, out, err);
}

int sdc_service_get(sdc_t *c, const char *cluster, const char *svc, json_t **out,
                    sdc_err_t *err)
{
    return sdc__cluster_call(c, "GET", cluster, "service", svc, NULL, out, err, "/services/%s",
                             svc);
}

int sdc_service_scale(sdc_t *c, const char *cluster, const char *svc, int64_t count,
                      int dry_run, json_t **out, sdc_err_t *err)
{
    if (count < 0)
        return sdc__inval(err, "the count is negative");
    json_t *body = json_pack("{s:I}", "count", (json_int_t)count);
    int rc = sdc__cluster_call(c, "POST", cluster, "service", svc, body, out, err,
                               "/services/%s/scale%s", svc, dry_run ? "?dry_run=1" : "");
    json_decref(body);
    return rc;
}

int sdc_service_stop(sdc_t *c, const char *cluster, const char *svc, int stop, json_t **out,
                     sdc_err_t *err)
{
    return sdc__cluster_call(c, "POST", cluster, "service", svc, NULL, out, err, "/services/%s/%s",
                             svc, stop ? "stop" : "start");
}

int sdc_service_restart(sdc_t *c, const char *cluster, const char *svc, int64_t max_unavailable,
                        json_t **out, sdc_err_t *err)
{
    json_t *body = json_object();
    if (max_unavailable > 0)
        json_object_set_new(body, "max_unavailable", json_integer(max_unavailable));
    int rc = sdc__cluster_call(c, "POST", cluster, "service", svc, body, out, err,
                               "/services/%s/restart", svc);
    json_decref(body);
    return rc;
}

int sdc_instance_restart(sdc_t *c, const char *cluster, const char *instance, json_t **out,
                         sdc_err_t *err)
{
    json_t *body = json_pack("{s:s?}", "instance", instance);
    int rc = sdc__cluster_call(c, "POST", cluster, "instance", instance, body, out, err,
                               "/restart-instance");
    json_decref(body);
    return rc;
}

int sdc_service_delete(sdc_t *c, const char *cluster, const char *svc, sdc_err_t *err)
{
    return sdc__cluster_call(c, "DELETE", cluster, "service", svc, NULL, NULL, err,
                             "/services/%s", svc);
}

int sdc_cluster_stop(sdc_t *c, const char *cluster, int stop, json_t **out, sdc_err_t *err)
{
    return sdc__cluster_call(c, "POST", cluster, NULL, NULL, NULL, out, err, "/%s",
                             stop ? "stop" : "start");
}

int sdc_machine_drain(sdc_t *c, const char *cluster, const char *machine, int drain,
                      json_t **out, sdc_err_t *err)
{
    return sdc__cluster_call(c, "POST", cluster, "machine", machine, NULL, out, err,
                             "/machines/%s/%s", machine, drain ? "drain" : "undrain");
}

/* ---------- primary lease ---------- */

/* Fills p from an object with holder, epoch, expires_in_ms. 0, or -1 if malformed. */
static int primary_fill(const json_t *o, sdc_primary_t *p)
{
    const json_t *h = json_object_get(o, "holder");
    const json_t *e = json_object_get(o, "epoch"), *x = json_object_get(o, "expires_in_ms");
    if (!json_is_integer(e) || !json_is_integer(x) || !(json_is_string(h) || json_is_null(h)))
        return -1;
    snprintf(p->holder, sizeof p->holder, "%s", h && json_is_string(h) ? json_string_value(h)
                                                                       : "");
    p->epoch = json_integer_value(e);
    p->expires_in_ms = json_integer_value(x);
    return 0;
}

int sdc_primary_acquire(sdc_t *c, const char *cluster, const char *machine, int ttl_ms,
                        sdc_primary_t *out, sdc_err_t *err)
{
    if (sdc__names(err, 2, "cluster", cluster, "machine", machine))
        return SDC_E_INVAL;
    if (ttl_ms < 0)
        return sdc__inval(err, "the ttl is negative");
    json_t *body = json_pack("{s:s}", "machine", machine);
    if (ttl_ms > 0)
        json_object_set_new(body, "ttl_ms", json_integer(ttl_ms));
    json_t *res = NULL;
    int rc = sdc__cluster_call(c, "POST", cluster, NULL, NULL, body, &res, err, "/primary");
    json_decref(body);
    if (rc == SDC_E_HTTP && err && err->body && out && strcmp(err->code, "primary_held") == 0)
        primary_fill(json_object_get(err->body, "error"), out);
    if (rc)
        return rc;
    rc = out && primary_fill(res, out) ? sdc__proto(err, "the primary answer lacks holder/epoch")
                                       : SDC_OK;
    json_decref(res);
    return rc;
}

int sdc_primary_get(sdc_t *c, const char *cluster, sdc_primary_t *out, sdc_err_t *err)
{
    if (sdc__names(err, 1, "cluster", cluster))
        return SDC_E_INVAL;
    if (!out)
        return sdc__inval(err, "no place for the answer");
    json_t *res = NULL;
    int rc = sdc__cluster_call(c, "GET", cluster, NULL, NULL, NULL, &res, err, "/primary");
    if (rc)
        return rc;
    rc = primary_fill(res, out) ? sdc__proto(err, "the primary answer lacks holder/epoch") : SDC_OK;
    json_decref(res);
    return rc;
}

int sdc_primary_release(sdc_t *c, const char *cluster, const char *machine, sdc_err_t *err)
{
    return sdc__cluster_call(c, "DELETE", cluster, "machine", machine, NULL, NULL, err,
                             "/primary?machine=%s", machine);
}

/* ---------- state and assignments ---------- */

/* One walk of GET .../state's pages into *out (the first page's header, every page's
 * services, machines and assignments). *changed: the desired-state version moved during
 * the walk (the services may come from two versions). */
static int state_walk(sdc_t *c, const char *cluster, json_t **out, int *changed, sdc_err_t *err)
{
    json_t *all = NULL;
    char after[600] = "", esc[3 * sizeof after];
    size_t records = 0;
    int rc;
    *changed = 0;
    for (;;) {
        json_t *page = NULL;
        rc = sdc__cluster_call(c, "GET", cluster, NULL, NULL, NULL, &page, err,
                               "/state?limit=%d%s%s", SDC_STATE_PAGE, after[0] ? "&after=" : "",
                               after[0] ? sdc_escape(after, esc, sizeof esc) : "");
        if (rc)
            break;
        json_t *svcs = json_object_get(page, "services"), *machs = json_object_get(page, "machines");
        json_t *docs = json_object_get(page, "assignments");
        if (!json_is_array(svcs) || !json_is_array(machs) || !json_is_object(docs)) {
            json_decref(page);
            rc = sdc__proto(err, "a state page lacks services, machines or assignments");
            break;
        }
        records += json_array_size(svcs) + json_array_size(machs) + json_object_size(docs);
        const char *next = json_string_value(json_object_get(page, "next"));
        int more = next && *next;
        if (more && strlen(next) >= sizeof after) {
            json_decref(page);
            rc = sdc__proto(err, "a state page's next is too long");
            break;
        }
        if (more)
            snprintf(after, sizeof after, "%s", next);
        if (!all) {
            all = page;
            json_object_del(all, "next");
        } else {
            json_array_extend(json_object_get(all, "services"), svcs);
            json_array_extend(json_object_get(all, "machines"), machs);
            json_object_update(json_object_get(all, "assignments"), docs);
            if (json_integer_value(json_object_get(page, "version")) !=
                json_integer_value(json_object_get(all, "version")))
                *changed = 1;
            json_decref(page);
        }
        if (!more)
            break;
        if (records > SDC_STATE_RECORDS_MAX) {
            rc = sdc__proto(err, "the state holds more than SDC_STATE_RECORDS_MAX records");
            break;
        }
    }
    if (rc) {
        json_decref(all);
        return rc;
    }
    *out = all;
    return SDC_OK;
}

int sdc_state_get(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    int rc = sdc__names(err, 1, "cluster", cluster);
    for (int walk = 0; !rc; walk++) {
        int changed;
        json_t *st = NULL;
        if ((rc = state_walk(c, cluster, &st, &changed, err)))
            break;
        /* a desired-state change mid-walk: walk again, twice at most (then the mix;
         * the next read has it whole) */
        if (!changed || walk == 2) {
            *out = st;
            break;
        }
        json_decref(st);
    }
    return rc;
}

int sdc_assignments_put(sdc_t *c, const char *cluster, int64_t epoch, const json_t *machines,
                        int64_t *version, int *changed, sdc_err_t *err)
{
    if (sdc__names(err, 1, "cluster", cluster))
        return SDC_E_INVAL;
    if (epoch < 1 || !json_is_object(machines))
        return sdc__inval(err, "bad epoch or machines object");
    json_t *body = json_pack("{s:I, s:O}", "epoch", (json_int_t)epoch, "machines", machines);
    json_t *res = NULL;
    int rc = sdc__cluster_call(c, "PUT", cluster, NULL, NULL, body, &res, err, "/assignments");
    json_decref(body);
    if (rc)
        return rc;
    if (version)
        *version = json_integer_value(json_object_get(res, "version"));
    if (changed)
        *changed = json_is_true(json_object_get(res, "changed"));
    json_decref(res);
    return SDC_OK;
}

int sdc_assignments_get(sdc_t *c, const char *cluster, const char *machine, int64_t version,
                        int wait_ms, json_t **out, sdc_err_t *err)
{
    if (sdc__names(err, 2, "cluster", cluster, "machine", machine))
        return SDC_E_INVAL;
    if (wait_ms < 0)
        return sdc__inval(err, "the wait is negative");
    if (version >= 0 && wait_ms > 0)
        return sdc__cluster_call(c, "GET", cluster, "machine", machine, NULL, out, err,
                                 "/machines/%s/assignments?version=%" PRId64 "&wait=%d", machine,
                                 version, wait_ms);
    return sdc__cluster_call(c, "GET", cluster, "machine", machine, NULL, out, err,
                             "/machines/%s/assignments", machine);
}

int sdc_machine_lost(sdc_t *c, const char *cluster, const char *machine, int64_t epoch,
                     int *stopped, sdc_err_t *err)
{
    return sdc_machine_lost_keep(c, cluster, machine, epoch, NULL, stopped, err);
}

int sdc_machine_lost_keep(sdc_t *c, const char *cluster, const char *machine, int64_t epoch,
                          const json_t *keep, int *stopped, sdc_err_t *err)
{
    if (sdc__names(err, 2, "cluster", cluster, "machine", machine))
        return SDC_E_INVAL;
    if (epoch < 1)
        return sdc__inval(err, "bad epoch");
    if (keep && !json_is_array(keep))
        return sdc__inval(err, "keep must be an array of service names");
    json_t *body = json_pack("{s:I}", "epoch", (json_int_t)epoch);
    if (json_array_size(keep))
        json_object_set(body, "keep", (json_t *)keep);
    json_t *res = NULL;
    int rc = sdc__cluster_call(c, "POST", cluster, "machine", machine, body, &res, err,
                               "/machines/%s/lost", machine);
    json_decref(body);
    if (rc)
        return rc;
    if (stopped)
        *stopped = (int)json_integer_value(json_object_get(res, "stopped"));
    json_decref(res);
    return SDC_OK;
}
