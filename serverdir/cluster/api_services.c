/* Desired state (docs/cluster.md): service specs and the operator actions on them
 * (scale, stop/start, rolling restart, restart of one instance), the realm stop flag and
 * machine draining. serverdir only records what is wanted; the primary Big Brother reads
 * it (GET /state) and turns it into assignments. Every change is one script; a change
 * that changes nothing keeps the versions. See cluster.h for the Redis layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "sdvalid.h"

SD_ROUTE(PUT, "/v1/clusters/{c}/services/{s}", SD_R_OPS, 0, h_service_put);
SD_ROUTE(GET, "/v1/clusters/{c}/services", SD_R_BB | SD_R_VIEWER, 0, h_services_list);
SD_ROUTE(GET, "/v1/clusters/{c}/services/{s}", SD_R_BB | SD_R_VIEWER, 0, h_service_get);
SD_ROUTE(DELETE, "/v1/clusters/{c}/services/{s}", SD_R_OPS, 0, h_service_delete);
SD_ROUTE(POST, "/v1/clusters/{c}/services/{s}/scale", SD_R_OPS, 0, h_service_scale);
SD_ROUTE(POST, "/v1/clusters/{c}/services/{s}/stop", SD_R_OPS, 0, h_service_stop);
SD_ROUTE(POST, "/v1/clusters/{c}/services/{s}/start", SD_R_OPS, 0, h_service_start);
SD_ROUTE(POST, "/v1/clusters/{c}/services/{s}/restart", SD_R_OPS, 0, h_service_restart);
SD_ROUTE(POST, "/v1/clusters/{c}/restart-instance", SD_R_OPS, 0, h_instance_restart);
SD_ROUTE(POST, "/v1/clusters/{c}/stop", SD_R_OPS, 0, h_cluster_stop);
SD_ROUTE(POST, "/v1/clusters/{c}/start", SD_R_OPS, 0, h_cluster_start);
SD_ROUTE(POST, "/v1/clusters/{c}/machines/{m}/drain", SD_R_OPS, 0, h_machine_drain);
SD_ROUTE(POST, "/v1/clusters/{c}/machines/{m}/undrain", SD_R_OPS, 0, h_machine_undrain);

#define SERVICES_LIMIT_DEFAULT 100
#define SERVICES_LIMIT_MAX 500 /* a service carries its slots' restart tokens */
#define CAS_TRIES 3 /* scale: read-modify-write attempts against concurrent changes */

/* ---------- helpers ---------- */

static void unknown_service(sd_resp_t *resp, const char *svc)
{
    sd_resp_error_extra(resp, 404, "unknown_service", json_pack("{s:s}", "service", svc),
                        "service '%s' does not exist", svc);
}

/* 409 static_service: svc is run by machine's bigbrother config, not by the primary, so
 * an operation on the desired service (or on one instance's slot) cannot apply to it. */
static void static_service(sd_resp_t *resp, const char *svc, const char *machine,
                           const char *inst)
{
    SD_COUNT("serverdir_static_service_refused_total",
             "operations on a desired service refused: a bigbrother config runs it", 1);
    json_t *extra = json_pack("{s:s, s:s}", "service", svc, "machine", machine);
    if (inst)
        json_object_set_new(extra, "instance", json_string(inst));
    sd_resp_error_extra(resp, 409, "static_service", extra,
                        "%s is a static service of machine %s: use bbctl on that machine", svc,
                        machine);
}

/* The answer to an operation on svc when it is no desired service: static_service when a
 * bigbrother config runs it (a live process of that name), else unknown_service. */
static void not_desired(sd_resp_t *resp, const char *cluster, const char *svc)
{
    redisReply *r = NULL;
    if (sd__cluster_run("service_static", cluster, &r, svc, NULL) == 0 &&
        sd_reply_status_is(r, "static") && r->elements == 3)
        static_service(resp, svc, sd_reply_str(r, 1), NULL);
    else
        unknown_service(resp, svc);
    freeReplyObject(r);
}

/* Reads one service as API JSON into *out (NULL when it does not exist). Returns 0, or
 * -1 with resp set. */
static int service_read(sd_resp_t *resp, const char *cluster, const char *svc, json_t **out)
{
    redisReply *r = NULL;
    *out = NULL;
    int rc = sd__cluster_run("service_list", cluster, &r, svc, "", "1", NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return -1;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
        sd_resp_bad_reply(resp, "service_list", r);
        freeReplyObject(r);
        return -1;
    }
    if (r->elements == 3 && !(*out = sd_service_json(r->element[2]))) {
        sd_resp_bad_reply(resp, "service_list", r);
        freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    return 0;
}

/* Stores spec (validated) for svc based on version `expect` ("" any) and fills the PUT
 * answer {service, version, changed, changes}. Returns 1 when the script reported a
 * version conflict (resp untouched), else 0. */
static int spec_store(sd_resp_t *resp, const char *cluster, const char *svc, const json_t *spec,
                      const char *expect)
{
    char *text = sd_json_canonical(spec);
    if (!text) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return 0;
    }
    redisReply *r = NULL;
    int rc = sd__cluster_run("service_put", cluster, &r, svc, text, expect, NULL);
    free(text);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return 0;
    }
    if (sd_reply_status_is(r, "conflict")) {
        freeReplyObject(r);
        return 1;
    }
    json_t *changes = json_array();
    int changed = sd_reply_status_is(r, "changed") && r->elements == 3;
    if (!changed && !(sd_reply_status_is(r, "unchanged") && r->elements == 2)) {
        json_decref(changes);
        sd_resp_bad_reply(resp, "service_put", r);
        freeReplyObject(r);
        return 0;
    }
    if (changed) {
        json_t *old = *sd_reply_str(r, 2) ? json_loads(sd_reply_str(r, 2), 0, NULL) : NULL;
        sd_spec_diff(old, spec, changes);
        json_decref(old);
        log_info("service changed", "cluster=%s service=%s version=%lld changes=%zu", cluster, svc,
                 (long long)sd_reply_num(r, 1), json_array_size(changes));
        SD_COUNT("serverdir_service_changes_total", "service specs created or changed", 1);
    }
    sd_resp_json(resp, 200, json_pack("{s:s, s:I, s:b, s:o}", "service", svc, "version",
                                      (json_int_t)sd_reply_num(r, 1), "changed", changed, "changes",
                                      changes));
    freeReplyObject(r);
    return 0;
}

/* Answers a dry run: what storing spec would change, without writing. */
static void spec_dry_run(sd_resp_t *resp, const char *cluster, const char *svc,
                         const json_t *spec)
{
    json_t *cur;
    if (service_read(resp, cluster, svc, &cur))
        return;
    json_t *changes = json_array();
    sd_spec_diff(cur ? json_object_get(cur, "spec") : NULL, spec, changes);
    int64_t version = cur ? json_integer_value(json_object_get(cur, "version")) : 0;
    json_decref(cur);
    sd_resp_json(resp, 200, json_pack("{s:s, s:I, s:b, s:o, s:b}", "service", svc,
                                      "version", (json_int_t)version, "changed",
                                      json_array_size(changes) > 0, "changes", changes,
                                      "dry_run", 1));
}

/* ?dry_run=1|true|0|false -> 1/0; -1 with 400 on anything else. */
static int dry_run_flag(const sd_req_t *req, sd_resp_t *resp)
{
    const char *d = sd_req_query(req, "dry_run");
    if (!d || !strcmp(d, "0") || !strcmp(d, "false"))
        return 0;
    if (!strcmp(d, "1") || !strcmp(d, "true"))
        return 1;
    sd_resp_error(resp, 400, "bad_query", "query parameter 'dry_run' must be 1, true, 0 or false");
    return -1;
}

/* ---------- specs ---------- */

json_t *sd_service_json(const redisReply *e)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 7 || e->elements > 8 ||
        e->element[6]->type != REDIS_REPLY_ARRAY)
        return NULL;
    json_t *spec = json_loads(sd_reply_str(e, 1), 0, NULL);
    json_t *o = json_pack("{s:s, s:I, s:o, s:b, s:I, s:I}", "service", sd_reply_str(e, 0),
                          "version", (json_int_t)sd_reply_num(e, 2),
                          "spec", spec ? spec : json_object(),
                          "stopped", sd_reply_num(e, 3) == 1,
                          "restart_token", (json_int_t)sd_reply_num(e, 4),
                          "max_unavailable", (json_int_t)sd_reply_num(e, 5));
    json_t *slots = json_object();
    const redisReply *st = e->element[6];
    for (size_t i = 0; i + 1 < st->elements; i += 2)
        json_object_set_new(slots, sd_reply_str(st, i), json_integer(sd_reply_num(st, i + 1)));
    json_object_set_new(o, "slot_restart_tokens", slots);
    const redisReply *p = e->elements == 8 ? e->element[7] : NULL;
    if (p && p->type == REDIS_REPLY_ARRAY && p->elements == 4) /* pool_stats (lua_prelude) */
        json_object_set_new(o, "pool",
                            json_pack("{s:I, s:I, s:I, s:I}", "allocated",
                                      (json_int_t)sd_reply_num(p, 0), "ready_free",
                                      (json_int_t)sd_reply_num(p, 1), "max_allocated_slot",
                                      (json_int_t)sd_reply_num(p, 2), "last_demand_ms",
                                      (json_int_t)sd_reply_num(p, 3)));
    return o;
}


/* PUT /services/{s}[?dry_run=1] body = spec -> 200 {service, version, changed, changes}. */
void h_service_put(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *svc;
    int dry;
    if (sd_req_cluster_and(req, resp, &cluster, "service", &svc) ||
        (dry = dry_run_flag(req, resp)) < 0)
        return;
    json_t *spec = sd_req_json(req, resp);
    if (!spec)
        return;
    char err[SD_ERRMSG_MAX];
    if (sd_spec_validate(spec, err, sizeof err)) {
        SD_COUNT("serverdir_service_rejected_total", "service specs rejected as invalid", 1);
        sd_resp_error(resp, 400, "bad_spec", "%s", err);
    } else if (dry) {
        spec_dry_run(resp, cluster, svc, spec);
    } else {
        spec_store(resp, cluster, svc, spec, "");
    }
    json_decref(spec);
}

/* GET /services[?after=NAME&limit=N] -> {version, services: [...], next}: one page in
 * name order; next is null on the last. */
void h_services_list(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    int64_t limit;
    const char *after;
    if (sd_req_page(req, resp, &cluster, SERVICES_LIMIT_MAX, SERVICES_LIMIT_DEFAULT, &limit,
                    &after))
        return;
    char lim[24];
    snprintf(lim, sizeof lim, "%lld", (long long)limit);
    redisReply *r = NULL;
    int rc = sd__cluster_run("service_list", cluster, &r, "", after, lim, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
        sd_resp_bad_reply(resp, "service_list", r);
        freeReplyObject(r);
        return;
    }
    json_t *list = json_array();
    for (size_t i = 2; i < r->elements; i++) {
        json_t *s = sd_service_json(r->element[i]);
        if (s)
            json_array_append_new(list, s);
    }
    const char *next = sd_reply_str(r, 1);
    json_t *out = json_pack("{s:I, s:o, s:o}", "version", (json_int_t)sd_reply_num(r, 0),
                            "services", list, "next", *next ? json_string(next) : json_null());
    freeReplyObject(r);
    sd_resp_json(resp, 200, out);
}

/* GET /services/{s} -> the service; 404 unknown_service. */
void h_service_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *svc;
    json_t *cur;
    if (sd_req_cluster_and(req, resp, &cluster, "service", &svc) ||
        service_read(resp, cluster, svc, &cur))
        return;
    if (cur)
        sd_resp_json(resp, 200, cur);
    else
        unknown_service(resp, svc);
}

/* DELETE /services/{s} -> 204; 404 unknown_service. */
void h_service_delete(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *svc;
    if (sd_req_cluster_and(req, resp, &cluster, "service", &svc))
        return;
    redisReply *r = NULL;
    int rc = sd__cluster_run("service_delete", cluster, &r, svc, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (sd_reply_status_is(r, "unknown_service")) {
        not_desired(resp, cluster, svc);
    } else if (sd_reply_status_is(r, "ok")) {
        log_info("service deleted", "cluster=%s service=%s", cluster, svc);
        SD_COUNT("serverdir_service_changes_total", "service specs created or changed", 1);
        sd_resp_empty(resp, 204);
    } else {
        sd_resp_bad_reply(resp, "service_delete", r);
    }
    freeReplyObject(r);
}

/* POST /services/{s}/scale[?dry_run=1] {count} -> like PUT. The spec is read, its count
 * replaced and stored only if nobody changed it in between (retried a few times). */
void h_service_scale(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"count", NULL};
    const char *cluster, *svc;
    int dry;
    if (sd_req_cluster_and(req, resp, &cluster, "service", &svc) ||
        (dry = dry_run_flag(req, resp)) < 0)
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX];
    int64_t count;
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    if (sd_jv_only_keys(&v, body, allowed) ||
        sd_jv_int(&v, body, "count", 1, 0, SD_COUNT_MAX, &count) < 0) {
        json_decref(body);
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    json_decref(body);
    for (int attempt = 0; attempt < CAS_TRIES; attempt++) {
        json_t *cur;
        if (service_read(resp, cluster, svc, &cur))
            return;
        if (!cur) {
            not_desired(resp, cluster, svc);
            return;
        }
        json_t *spec = json_deep_copy(json_object_get(cur, "spec"));
        json_object_set_new(spec, "count", json_integer(count));
        char expect[24];
        snprintf(expect, sizeof expect, "%lld",
                 (long long)json_integer_value(json_object_get(cur, "version")));
        json_decref(cur);
        int conflict = dry ? (spec_dry_run(resp, cluster, svc, spec), 0)
                           : spec_store(resp, cluster, svc, spec, expect);
        json_decref(spec);
        if (!conflict)
            return;
    }
    sd_resp_error(resp, 409, "conflict",
                  "service '%s' kept changing while it was being scaled; retry", svc);
}

/* ---------- operator actions ---------- */

/* A per-name on/off switch: a service's stopped flag, a machine's draining flag. Its
 * script takes (name, "1"|"0") and answers {ok, changed, version} or the status
 * unknown_<what>. */
typedef struct {
    const char *script;
    const char *what;    /* the path parameter's name, the answer's key, the 404's subject */
    const char *flag;    /* the answer's key for the flag */
    const char *missing; /* the 404 message after "<what> '<name>' " */
    const char *log_on, *log_off;
} name_switch_t;

static const name_switch_t service_switch = {"service_stop", "service", "stopped",
                                             "does not exist", "service stopped",
                                             "service started"};
static const name_switch_t machine_switch = {"machine_drain", "machine", "draining",
                                             "is not registered",
                                             "machine draining", "machine undrained"};

/* POST /services/{s}/stop|start and /machines/{m}/drain|undrain -> 200 {<what>, <flag>,
 * changed, version}; 404 unknown_<what>. */
static void name_switch_set(sd_req_t *req, sd_resp_t *resp, const name_switch_t *sw, int on)
{
    const char *cluster, *name;
    if (sd_req_name(req, resp, 0, "cluster", &cluster) ||
        sd_req_name(req, resp, 1, sw->what, &name))
        return;
    redisReply *r = NULL;
    int rc = sd__cluster_run(sw->script, cluster, &r, name, on ? "1" : "0", NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    char unknown[32];
    snprintf(unknown, sizeof unknown, "unknown_%s", sw->what);
    if (sd_reply_status_is(r, unknown) && sw == &service_switch) {
        not_desired(resp, cluster, name);
    } else if (sd_reply_status_is(r, unknown)) {
        sd_resp_error_extra(resp, 404, unknown, json_pack("{s:s}", sw->what, name), "%s '%s' %s",
                            sw->what, name, sw->missing);
    } else if (sd_reply_status_is(r, "ok") && r->elements == 3) {
        if (sd_reply_num(r, 1) == 1)
            log_info(on ? sw->log_on : sw->log_off, "cluster=%s %s=%s", cluster, sw->what, name);
        sd_resp_json(resp, 200, json_pack("{s:s, s:b, s:b, s:I}", sw->what, name, sw->flag, on,
                                          "changed", sd_reply_num(r, 1) == 1, "version",
                                          (json_int_t)sd_reply_num(r, 2)));
    } else {
        sd_resp_bad_reply(resp, sw->script, r);
    }
    freeReplyObject(r);
}

void h_service_stop(sd_req_t *req, sd_resp_t *resp)
{
    name_switch_set(req, resp, &service_switch, 1);
}
void h_service_start(sd_req_t *req, sd_resp_t *resp)
{
    name_switch_set(req, resp, &service_switch, 0);
}

/* An optional JSON body: absent or empty means {}. Returns NULL with resp set on error. */
static json_t *optional_body(sd_req_t *req, sd_resp_t *resp)
{
    return req->body.len ? sd_req_json(req, resp) : json_object();
}

/* POST /services/{s}/restart {max_unavailable?: N (default 1)} -> 200 {service,
 * restart_token, max_unavailable, version}. The primary rolls the restart. */
void h_service_restart(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"max_unavailable", NULL};
    const char *cluster, *svc;
    if (sd_req_cluster_and(req, resp, &cluster, "service", &svc))
        return;
    json_t *body = optional_body(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX], mu[24];
    int64_t max_unavailable = 1;
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    int bad = sd_jv_only_keys(&v, body, allowed) ||
              sd_jv_int(&v, body, "max_unavailable", 0, 1, SD_COUNT_MAX, &max_unavailable) < 0;
    json_decref(body);
    if (bad) {
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    snprintf(mu, sizeof mu, "%lld", (long long)max_unavailable);
    redisReply *r = NULL;
    int rc = sd__cluster_run("service_restart", cluster, &r, svc, mu, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (sd_reply_status_is(r, "unknown_service")) {
        not_desired(resp, cluster, svc);
    } else if (sd_reply_status_is(r, "ok") && r->elements == 3) {
        log_info("service restart requested", "cluster=%s service=%s restart_token=%lld "
                 "max_unavailable=%lld", cluster, svc, (long long)sd_reply_num(r, 1),
                 (long long)max_unavailable);
        SD_COUNT("serverdir_restarts_requested_total{kind=\"service\"}",
                 "restarts requested by operators", 1);
        sd_resp_json(resp, 200, json_pack("{s:s, s:I, s:I, s:I}", "service", svc,
                                          "restart_token", (json_int_t)sd_reply_num(r, 1),
                                          "max_unavailable", (json_int_t)max_unavailable,
                                          "version", (json_int_t)sd_reply_num(r, 2)));
    } else {
        sd_resp_bad_reply(resp, "service_restart", r);
    }
    freeReplyObject(r);
}

/* POST /restart-instance {instance} -> 200 {instance, service, slot, restart_token,
 * version}: bumps the restart token of the instance's slot. */
void h_instance_restart(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"instance", NULL};
    const char *cluster, *inst;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX];
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    if (sd_jv_only_keys(&v, body, allowed) || sd_jv_name(&v, body, "instance", 1, &inst) < 0) {
        json_decref(body);
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    redisReply *r = NULL;
    int rc = sd__cluster_run("instance_restart", cluster, &r, inst, NULL);
    if (rc) {
        json_decref(body);
        sd_resp_store_error(resp, rc);
        return;
    }
    if (sd_reply_status_is(r, "unknown_instance")) {
        sd_resp_error_extra(resp, 404, "unknown_instance", json_pack("{s:s}", "instance", inst),
                            "instance '%s' is not in the directory", inst);
    } else if (sd_reply_status_is(r, "static_service") && r->elements == 3) {
        static_service(resp, sd_reply_str(r, 1), sd_reply_str(r, 2), inst);
    } else if (sd_reply_status_is(r, "no_slot")) {
        sd_resp_error_extra(resp, 409, "no_slot", json_pack("{s:s}", "instance", inst),
                            "instance '%s' has no slot (not placed by the primary)", inst);
    } else if (sd_reply_status_is(r, "unknown_service")) {
        unknown_service(resp, sd_reply_str(r, 1));
    } else if (sd_reply_status_is(r, "ok") && r->elements == 5) {
        log_info("instance restart requested", "cluster=%s instance=%s service=%s slot=%s",
                 cluster, inst, sd_reply_str(r, 1), sd_reply_str(r, 2));
        SD_COUNT("serverdir_restarts_requested_total{kind=\"instance\"}",
                 "restarts requested by operators", 1);
        sd_resp_json(resp, 200,
                     json_pack("{s:s, s:s, s:I, s:I, s:I}", "instance", inst, "service",
                               sd_reply_str(r, 1), "slot", (json_int_t)sd_reply_num(r, 2),
                               "restart_token", (json_int_t)sd_reply_num(r, 3), "version",
                               (json_int_t)sd_reply_num(r, 4)));
    } else {
        sd_resp_bad_reply(resp, "instance_restart", r);
    }
    freeReplyObject(r);
    json_decref(body);
}

/* POST /stop and /start: the realm stop flag -> 200 {cluster_stopped, changed, version}. */
static void cluster_stop_set(sd_req_t *req, sd_resp_t *resp, int stop)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    char chan[96];
    redisReply *r = NULL;
    int rc = sd__cluster_run("cluster_stop", cluster, &r, stop ? "1" : "0",
                             sd_assign_channel(chan, sizeof chan), cluster, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
        if (sd_reply_num(r, 0) == 1) {
            log_info(stop ? "cluster stopped" : "cluster started", "cluster=%s peer=%s", cluster,
                     req->peer_ip);
            SD_COUNT("serverdir_cluster_stop_changes_total", "realm stop/start flag changes", 1);
        }
        sd_resp_json(resp, 200, json_pack("{s:b, s:b, s:I}", "cluster_stopped", stop, "changed",
                                          sd_reply_num(r, 0) == 1,
                                          "version", (json_int_t)sd_reply_num(r, 1)));
    } else {
        sd_resp_bad_reply(resp, "cluster_stop", r);
    }
    freeReplyObject(r);
}

void h_cluster_stop(sd_req_t *req, sd_resp_t *resp) { cluster_stop_set(req, resp, 1); }
void h_cluster_start(sd_req_t *req, sd_resp_t *resp) { cluster_stop_set(req, resp, 0); }

void h_machine_drain(sd_req_t *req, sd_resp_t *resp)
{
    name_switch_set(req, resp, &machine_switch, 1);
}
void h_machine_undrain(sd_req_t *req, sd_resp_t *resp)
{
    name_switch_set(req, resp, &machine_switch, 0);
}
