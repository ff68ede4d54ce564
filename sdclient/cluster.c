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

#define PATH_MAX_LEN 1024

static int names_ok(const char *cluster, const char *name)
{
    return cluster && sd_name_valid(cluster, SD_NAME_MAX) &&
           (!name || sd_name_valid(name, SD_NAME_MAX));
}

/* "/v1/clusters/<cluster><suffix>" with the suffix printf-formatted into path. Names
 * passed here are valid names, which need no escaping. */
static const char *cpath(char *path, size_t cap, const char *cluster, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static const char *cpath(char *path, size_t cap, const char *cluster, const char *fmt, ...)
{
    int n = snprintf(path, cap, "/v1/clusters/%s", cluster);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < cap)
        vsnprintf(path + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
    return path;
}

/* A request whose answer must be a JSON object (stored in *out when out is given). */
static int call(sdc_t *c, const char *method, const char *path, const json_t *body, json_t **out,
                sdc_err_t *err)
{
    json_t *res = NULL;
    int rc = sdc_request(c, method, path, body, &res, err);
    if (rc)
        return rc;
    if (!json_is_object(res)) {
        json_decref(res);
        return sdc__proto(err, "the answer is not a JSON object");
    }
    if (out)
        *out = res;
    else
        json_decref(res);
    return SDC_OK;
}

/* ---------- services ---------- */

int sdc_service_put(sdc_t *c, const char *cluster, const char *svc, const json_t *spec,
                    int dry_run, json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, svc) || !json_is_object(spec))
        return sdc__inval(err, "bad cluster or service name, or the spec is not an object");
    char path[PATH_MAX_LEN];
    cpath(path, sizeof path, cluster, "/services/%s%s", svc, dry_run ? "?dry_run=1" : "");
    return call(c, "PUT", path, spec, out, err);
}

int sdc_services_list(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, NULL))
        return sdc__inval(err, "bad cluster name");
    char path[PATH_MAX_LEN];
    return call(c, "GET", cpath(path, sizeof path, cluster, "/services"), NULL, out, err);
}

int sdc_service_get(sdc_t *c, const char *cluster, const char *svc, json_t **out,
                    sdc_err_t *err)
{
    if (!names_ok(cluster, svc))
        return sdc__inval(err, "bad cluster or service name");
    char path[PATH_MAX_LEN];
    return call(c, "GET", cpath(path, sizeof path, cluster, "/services/%s", svc), NULL, out,
                err);
}

int sdc_service_delete(sdc_t *c, const char *cluster, const char *svc, sdc_err_t *err)
{
    if (!names_ok(cluster, svc))
        return sdc__inval(err, "bad cluster or service name");
    char path[PATH_MAX_LEN];
    json_t *res = NULL;
    int rc = sdc_request(c, "DELETE", cpath(path, sizeof path, cluster, "/services/%s", svc),
                         NULL, &res, err);
    json_decref(res);
    return rc;
}

int sdc_service_scale(sdc_t *c, const char *cluster, const char *svc, int64_t count,
                      int dry_run, json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, svc) || count < 0)
        return sdc__inval(err, "bad cluster or service name, or a negative count");
    char path[PATH_MAX_LEN];
    cpath(path, sizeof path, cluster, "/services/%s/scale%s", svc, dry_run ? "?dry_run=1" : "");
    json_t *body = json_pack("{s:I}", "count", (json_int_t)count);
    int rc = call(c, "POST", path, body, out, err);
    json_decref(body);
    return rc;
}

int sdc_service_stop(sdc_t *c, const char *cluster, const char *svc, int stop, json_t **out,
                     sdc_err_t *err)
{
    if (!names_ok(cluster, svc))
        return sdc__inval(err, "bad cluster or service name");
    char path[PATH_MAX_LEN];
    cpath(path, sizeof path, cluster, "/services/%s/%s", svc, stop ? "stop" : "start");
    return call(c, "POST", path, NULL, out, err);
}

int sdc_service_restart(sdc_t *c, const char *cluster, const char *svc, int64_t max_unavailable,
                        json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, svc))
        return sdc__inval(err, "bad cluster or service name");
    char path[PATH_MAX_LEN];
    json_t *body = json_object();
    if (max_unavailable > 0)
        json_object_set_new(body, "max_unavailable", json_integer(max_unavailable));
    int rc = call(c, "POST", cpath(path, sizeof path, cluster, "/services/%s/restart", svc),
                  body, out, err);
    json_decref(body);
    return rc;
}

int sdc_instance_restart(sdc_t *c, const char *cluster, const char *instance, json_t **out,
                         sdc_err_t *err)
{
    if (!names_ok(cluster, instance))
        return sdc__inval(err, "bad cluster or instance name");
    char path[PATH_MAX_LEN];
    json_t *body = json_pack("{s:s}", "instance", instance);
    int rc = call(c, "POST", cpath(path, sizeof path, cluster, "/restart-instance"), body, out,
                  err);
    json_decref(body);
    return rc;
}

int sdc_cluster_stop(sdc_t *c, const char *cluster, int stop, json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, NULL))
        return sdc__inval(err, "bad cluster name");
    char path[PATH_MAX_LEN];
    return call(c, "POST", cpath(path, sizeof path, cluster, "/%s", stop ? "stop" : "start"),
                NULL, out, err);
}

int sdc_machine_drain(sdc_t *c, const char *cluster, const char *machine, int drain,
                      json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, machine))
        return sdc__inval(err, "bad cluster or machine name");
    char path[PATH_MAX_LEN];
    cpath(path, sizeof path, cluster, "/machines/%s/%s", machine, drain ? "drain" : "undrain");
    return call(c, "POST", path, NULL, out, err);
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
    if (!names_ok(cluster, machine) || ttl_ms < 0)
        return sdc__inval(err, "bad cluster or machine name, or a negative ttl");
    char path[PATH_MAX_LEN];
    json_t *body = json_pack("{s:s}", "machine", machine);
    if (ttl_ms > 0)
        json_object_set_new(body, "ttl_ms", json_integer(ttl_ms));
    json_t *res = NULL;
    int rc = call(c, "POST", cpath(path, sizeof path, cluster, "/primary"), body, &res, err);
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
    if (!names_ok(cluster, NULL) || !out)
        return sdc__inval(err, "bad cluster name");
    char path[PATH_MAX_LEN];
    json_t *res = NULL;
    int rc = call(c, "GET", cpath(path, sizeof path, cluster, "/primary"), NULL, &res, err);
    if (rc)
        return rc;
    rc = primary_fill(res, out) ? sdc__proto(err, "the primary answer lacks holder/epoch") : SDC_OK;
    json_decref(res);
    return rc;
}

int sdc_primary_release(sdc_t *c, const char *cluster, const char *machine, sdc_err_t *err)
{
    if (!names_ok(cluster, machine))
        return sdc__inval(err, "bad cluster or machine name");
    char path[PATH_MAX_LEN];
    json_t *res = NULL;
    int rc = sdc_request(c, "DELETE", cpath(path, sizeof path, cluster, "/primary?machine=%s",
                                            machine), NULL, &res, err);
    json_decref(res);
    return rc;
}

/* ---------- state and assignments ---------- */

int sdc_state_get(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err)
{
    if (!names_ok(cluster, NULL))
        return sdc__inval(err, "bad cluster name");
    char path[PATH_MAX_LEN];
    return call(c, "GET", cpath(path, sizeof path, cluster, "/state"), NULL, out, err);
}

int sdc_assignments_put(sdc_t *c, const char *cluster, int64_t epoch, const json_t *machines,
                        int64_t *version, int *changed, sdc_err_t *err)
{
    if (!names_ok(cluster, NULL) || epoch < 1 || !json_is_object(machines))
        return sdc__inval(err, "bad cluster name, epoch or machines object");
    char path[PATH_MAX_LEN];
    json_t *body = json_pack("{s:I, s:O}", "epoch", (json_int_t)epoch, "machines", machines);
    json_t *res = NULL;
    int rc = call(c, "PUT", cpath(path, sizeof path, cluster, "/assignments"), body, &res, err);
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
    if (!names_ok(cluster, machine) || wait_ms < 0)
        return sdc__inval(err, "bad cluster or machine name, or a negative wait");
    char path[PATH_MAX_LEN];
    if (version >= 0 && wait_ms > 0)
        cpath(path, sizeof path, cluster, "/machines/%s/assignments?version=%" PRId64 "&wait=%d",
              machine, version, wait_ms);
    else
        cpath(path, sizeof path, cluster, "/machines/%s/assignments", machine);
    return call(c, "GET", path, NULL, out, err);
}

int sdc_machine_lost(sdc_t *c, const char *cluster, const char *machine, int64_t epoch,
                     int *stopped, sdc_err_t *err)
{
    if (!names_ok(cluster, machine) || epoch < 1)
        return sdc__inval(err, "bad cluster or machine name, or epoch");
    char path[PATH_MAX_LEN];
    json_t *body = json_pack("{s:I}", "epoch", (json_int_t)epoch);
    json_t *res = NULL;
    int rc = call(c, "POST", cpath(path, sizeof path, cluster, "/machines/%s/lost", machine),
                  body, &res, err);
    json_decref(body);
    if (rc)
        return rc;
    if (stopped)
        *stopped = (int)json_integer_value(json_object_get(res, "stopped"));
    json_decref(res);
    return SDC_OK;
}
