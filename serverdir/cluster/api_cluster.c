/* The primary lease, the cluster state read, and the per-machine assignments
 * (docs/cluster.md). The primary lease hands out an epoch that never repeats; every
 * primary-only write (PUT /assignments, POST /machines/{m}/lost) carries it and is
 * checked inside the script that makes the change, against the Redis clock, so a
 * primary that was paused past its lease has its writes refused (409 stale_epoch).
 * Assignment reads are conditional (ETag, If-None-Match) and long-poll (assign_wait.c).
 * See cluster.h for the Redis layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "directory.h"
#include "sdvalid.h"

SD_ROUTE(POST, "/v1/clusters/{c}/primary", SD_R_BB, 0, h_primary_acquire);
SD_ROUTE(GET, "/v1/clusters/{c}/primary", SD_R_BB | SD_R_VIEWER, 0, h_primary_get);
SD_ROUTE(DELETE, "/v1/clusters/{c}/primary", SD_R_BB, 0, h_primary_release);
SD_ROUTE(GET, "/v1/clusters/{c}/state", SD_R_BB | SD_R_VIEWER, 0, h_state_get);
SD_ROUTE(PUT, "/v1/clusters/{c}/assignments", SD_R_BB, 0, h_assignments_put);
SD_ROUTE(GET, "/v1/clusters/{c}/machines/{m}/assignments", SD_R_BB | SD_R_VIEWER, 0, h_assignments_get);
SD_ROUTE(POST, "/v1/clusters/{c}/machines/{m}/lost", SD_R_BB, 0, h_machine_lost);

#define PRIMARY_TTL_MIN_MS 1000
#define PRIMARY_TTL_MAX_MS 300000
#define SLOTS_PER_MACHINE_MAX 10000
#define MACHINES_PER_PUT_MAX 10000

/* ---------- reply helpers ---------- */

/* Element i of an array reply as text ("" when absent); an integer element is printed
 * into the caller's buffer num. */
static const char *rs(const redisReply *r, size_t i, char *num, size_t cap)
{
    if (r && r->type == REDIS_REPLY_ARRAY && i < r->elements &&
        r->element[i]->type == REDIS_REPLY_INTEGER) {
        snprintf(num, cap, "%lld", r->element[i]->integer);
        return num;
    }
    return sd_reply_str(r, i);
}

/* Answers 409 stale_epoch from a {'stale_epoch', epoch, holder} reply. */
static void stale_epoch(sd_resp_t *resp, const redisReply *r, int64_t epoch)
{
    char num[32];
    const char *holder = rs(r, 2, num, sizeof num);
    SD_COUNT("serverdir_primary_stale_epoch_total",
             "primary-only writes refused for a stale epoch or an expired lease", 1);
    json_t *extra = json_pack("{s:I, s:I}", "epoch", (json_int_t)epoch, "current_epoch",
                              (json_int_t)sd_reply_num(r, 1));
    json_object_set_new(extra, "holder", *holder ? json_string(holder) : json_null());
    sd_resp_error_extra(resp, 409, "stale_epoch", extra,
                        "epoch %lld is not the current primary's (current %lld, %s%s%s)",
                        (long long)epoch, (long long)sd_reply_num(r, 1),
                        *holder ? "held by '" : "no live holder", holder,
                        *holder ? "'" : "");
}

/* ---------- primary lease ---------- */

static json_t *primary_json(const char *holder, int64_t epoch, int64_t left)
{
    json_t *o = json_pack("{s:I, s:I}", "epoch", (json_int_t)epoch, "expires_in_ms",
                          (json_int_t)left);
    json_object_set_new(o, "holder", *holder ? json_string(holder) : json_null());
    return o;
}

/* POST /primary {machine, ttl_ms} -> 200 {holder, epoch, expires_in_ms} (acquired or
 * renewed), 409 primary_held with the same fields for the current holder. */
void h_primary_acquire(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"machine", "ttl_ms", NULL};
    const char *cluster, *machine;
    int64_t ttl = 10000;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX], ttls[24], num[32];
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    if (sd_jv_only_keys(&v, body, allowed) || sd_jv_name(&v, body, "machine", 1, &machine) < 0 ||
        sd_jv_int(&v, body, "ttl_ms", 0, PRIMARY_TTL_MIN_MS, PRIMARY_TTL_MAX_MS, &ttl) < 0) {
        json_decref(body);
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    if (sd_req_may_machine(req, resp, cluster, machine)) {
        json_decref(body);
        return;
    }
    snprintf(ttls, sizeof ttls, "%lld", (long long)ttl);
    redisReply *r = NULL;
    int rc = sd__cluster_run("primary_acquire", cluster, &r, machine, ttls, NULL);
    if (rc) {
        json_decref(body);
        sd_resp_store_error(resp, rc);
        return;
    }
    if (sd_reply_status_is(r, "ok") && r->elements == 5) {
        int fresh = strcmp(rs(r, 4, num, sizeof num), "acquired") == 0;
        if (fresh) {
            log_info("primary acquired", "cluster=%s machine=%s epoch=%lld ttl_ms=%lld", cluster,
                     machine, (long long)sd_reply_num(r, 2), (long long)ttl);
            SD_COUNT("serverdir_primary_changes_total", "primary lease changes of holder", 1);
        }
        sd_resp_json(resp, 200, primary_json(machine, sd_reply_num(r, 2), sd_reply_num(r, 3)));
    } else if (sd_reply_status_is(r, "primary_held") && r->elements == 4) {
        const char *holder = rs(r, 1, num, sizeof num);
        sd_resp_error_extra(resp, 409, "primary_held",
                            primary_json(holder, sd_reply_num(r, 2), sd_reply_num(r, 3)),
                            "the primary lease is held by '%s' (epoch %lld) for %lld ms more",
                            holder, (long long)sd_reply_num(r, 2), (long long)sd_reply_num(r, 3));
    } else {
        sd_resp_bad_reply(resp, "primary_acquire", r);
    }
    freeReplyObject(r);
    json_decref(body);
}

/* GET /primary -> {holder (null when none), epoch, expires_in_ms}. */
void h_primary_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    redisReply *r = NULL;
    int rc = sd__cluster_run("primary_get", cluster, &r, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    char num[32];
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3)
        sd_resp_json(resp, 200,
                     primary_json(rs(r, 0, num, sizeof num), sd_reply_num(r, 1), sd_reply_num(r, 2)));
    else
        sd_resp_bad_reply(resp, "primary_get", r);
    freeReplyObject(r);
}

/* DELETE /primary?machine=M -> 204 when M held it; 409 not_primary otherwise. */
void h_primary_release(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    const char *machine = sd_req_query(req, "machine");
    if (!machine) {
        sd_resp_error(resp, 400, "missing_machine", "query parameter 'machine' is required");
        return;
    }
    if (!sd_name_valid(machine, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_machine", "query parameter 'machine' must be a name");
        return;
    }
    if (sd_req_may_machine(req, resp, cluster, machine))
        return;
    redisReply *r = NULL;
    int rc = sd__cluster_run("primary_release", cluster, &r, machine, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    char num[32];
    if (sd_reply_status_is(r, "ok")) {
        log_info("primary released", "cluster=%s machine=%s epoch=%lld", cluster, machine,
                 (long long)sd_reply_num(r, 1));
        SD_COUNT("serverdir_primary_changes_total", "primary lease changes of holder", 1);
        sd_resp_empty(resp, 204);
    } else if (sd_reply_status_is(r, "not_primary")) {
        const char *holder = rs(r, 1, num, sizeof num);
        json_t *extra = json_object();
        json_object_set_new(extra, "holder", *holder ? json_string(holder) : json_null());
        sd_resp_error_extra(resp, 409, "not_primary", extra, "'%s' does not hold the primary lease",
                            machine);
    } else {
        sd_resp_bad_reply(resp, "primary_release", r);
    }
    freeReplyObject(r);
}

/* ---------- the state read ---------- */

static json_t *doc_json(const char *machine, int64_t version, int64_t epoch, int stopped,
                        const char *slots_text)
{
    json_t *slots = stopped ? NULL : json_loads(slots_text, 0, NULL);
    return json_pack("{s:s, s:I, s:I, s:b, s:o}", "machine", machine, "version",
                     (json_int_t)version, "epoch", (json_int_t)epoch, "cluster_stopped", stopped,
                     "slots", json_is_array(slots) ? slots : (json_decref(slots), json_array()));
}

/* GET /state[?limit=N&after=NEXT] -> {now_ms, version, cluster_stopped, services,
 * machines, assignments_version, assignments: {m: doc}, next}. Paged along the service,
 * machine and assignment name indexes: a page holds at most limit records and about
 * STATE_PAGE_BYTES of their text, and next is what to pass as after for the following
 * one (absent on the last). Without limit and after, the whole state in one answer, for
 * a cluster of at most STATE_WHOLE_MAX records (400 page_required beyond). A page is
 * built from state_get.lua calls of at most STATE_CALL_MAX records and STATE_CALL_BYTES
 * (the header from the first), so no call's Redis work grows with the cluster. */
#define STATE_LIMIT_DEFAULT 500
#define STATE_LIMIT_MAX 5000
#define STATE_WHOLE_MAX 5000
#define STATE_PAGE_BYTES (1 << 20)
#define STATE_CALL_MAX 100
#define STATE_CALL_BYTES (256 << 10)

/* A state cursor: "" or "<s|m|a>:<name>" (the name may be empty). */
static int state_cursor_valid(const char *c)
{
    return !*c || (strchr("sma", c[0]) && c[1] == ':' &&
                   (!c[2] || sd_name_valid(c + 2, SD_NAME_MAX)));
}

/* Adds one state_get reply's records to the page out (made from the first reply's
 * header); returns the records added, or -1 when the reply is not the script's. */
static int state_add(json_t **out, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 9 ||
        r->element[4]->type != REDIS_REPLY_ARRAY || r->element[5]->type != REDIS_REPLY_ARRAY ||
        r->element[6]->type != REDIS_REPLY_ARRAY)
        return -1;
    int64_t now = sd_reply_num(r, 0);
    int stopped = sd_reply_num(r, 2) == 1;
    if (!*out)
        *out = json_pack("{s:I, s:I, s:b, s:[], s:[], s:I, s:{}}", "now_ms", (json_int_t)now,
                         "version", (json_int_t)sd_reply_num(r, 1), "cluster_stopped", stopped,
                         "services", "machines", "assignments_version",
                         (json_int_t)sd_reply_num(r, 3), "assignments");
    json_t *services = json_object_get(*out, "services"), *machines = json_object_get(*out, "machines");
    json_t *assignments = json_object_get(*out, "assignments");
    char num[32];
    for (size_t i = 0; i < r->element[4]->elements; i++) {
        json_t *s = sd_service_json(r->element[4]->element[i]);
        if (s)
            json_array_append_new(services, s);
    }
    for (size_t i = 0; i < r->element[5]->elements; i++) {
        const redisReply *h = r->element[5]->element[i];
        if (h->type != REDIS_REPLY_ARRAY || h->elements < 1 ||
            h->element[0]->type != REDIS_REPLY_STRING)
            continue;
        /* The flat field list starts after the name; sd_dir_machine_json scans pairs. */
        redisReply flat = *h;
        flat.element = h->element + 1;
        flat.elements = h->elements - 1;
        json_array_append_new(machines, sd_dir_machine_json(h->element[0]->str, &flat, now));
    }
    for (size_t i = 0; i < r->element[6]->elements; i++) {
        const redisReply *a = r->element[6]->element[i];
        if (a->type != REDIS_REPLY_ARRAY || a->elements != 4)
            continue;
        const char *m = rs(a, 0, num, sizeof num);
        json_object_set_new(assignments, m,
                            doc_json(m, sd_reply_num(a, 1), sd_reply_num(a, 2), stopped,
                                     rs(a, 3, num, sizeof num)));
    }
    return (int)(r->element[4]->elements + r->element[5]->elements + r->element[6]->elements);
}

void h_state_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *after;
    int64_t limit;
    int whole = !sd_req_query(req, "limit") && !sd_req_query(req, "after");
    if (sd_req_name(req, resp, 0, "cluster", &cluster) ||
        sd_req_query_int(req, resp, "limit", 1, STATE_LIMIT_MAX, STATE_LIMIT_DEFAULT, &limit))
        return;
    after = sd_req_query(req, "after");
    if (!after)
        after = "";
    if (!state_cursor_valid(after)) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'after' must be the 'next' of a previous page");
        return;
    }
    char cursor[SD_NAME_MAX + 3];
    sd_strlcpy(cursor, after[0] ? after : "s:", sizeof cursor);
    json_t *out = NULL;
    int64_t records = 0, bytes = 0;
    /* the whole state: the first call checks the size; at most STATE_WHOLE_MAX records
     * (and the few stale index names dropped on the way) follow */
    if (whole)
        limit = 2 * STATE_WHOLE_MAX + 16;
    while (cursor[0] && records < limit && (whole || bytes < STATE_PAGE_BYTES)) {
        int64_t want = limit - records, budget = whole ? STATE_CALL_BYTES : STATE_PAGE_BYTES - bytes;
        char part[2] = {cursor[0], '\0'}, n[24], b[24], wmax[24];
        snprintf(n, sizeof n, "%lld", (long long)(want < STATE_CALL_MAX ? want : STATE_CALL_MAX));
        snprintf(b, sizeof b, "%lld",
                 (long long)(budget < STATE_CALL_BYTES ? budget : STATE_CALL_BYTES));
        snprintf(wmax, sizeof wmax, "%d", STATE_WHOLE_MAX);
        redisReply *r = NULL;
        int rc = sd__cluster_run("state_get", cluster, &r, whole && !out ? "w" : part,
                                 cursor + 2, n, b, wmax, NULL);
        if (rc) {
            json_decref(out);
            sd_resp_store_error(resp, rc);
            return;
        }
        if (sd_reply_status_is(r, "too_large")) {
            sd_resp_error(resp, 400, "page_required",
                          "cluster '%s' holds %lld services, machines and assignment documents, "
                          "more than %d in one answer: page it with ?limit= and after=<next>",
                          cluster, (long long)sd_reply_num(r, 1), STATE_WHOLE_MAX);
            freeReplyObject(r);
            return;
        }
        int got = state_add(&out, r);
        if (got < 0) {
            json_decref(out);
            sd_resp_bad_reply(resp, "state_get", r);
            freeReplyObject(r);
            return;
        }
        records += got;
        bytes += sd_reply_num(r, 8);
        sd_strlcpy(cursor, sd_reply_str(r, 7), sizeof cursor);
        freeReplyObject(r);
    }
    if (cursor[0])
        json_object_set_new(out, "next", json_string(cursor));
    sd_resp_json(resp, 200, out);
}

/* ---------- assignments ---------- */

static int slot_cmp(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    int c = strcmp(json_string_value(json_object_get(x, "service")),
                   json_string_value(json_object_get(y, "service")));
    if (c)
        return c;
    json_int_t i = json_integer_value(json_object_get(x, "slot"));
    json_int_t j = json_integer_value(json_object_get(y, "slot"));
    return (i > j) - (i < j);
}

/* Validates one machine's slot list and returns its canonical text (slots sorted by
 * service and slot, keys sorted), malloc'd; NULL with err. seen collects
 * "service#slot" across the whole request so a slot is on one machine only. */
static char *slots_canonical(const char *machine, const json_t *slots, json_t *seen, char *err,
                             size_t errcap)
{
    static const char *const allowed[] = {"service", "slot", "spec_version", "restart_token",
                                          "spec", NULL};
    sd_jv_t jv;
    sd_jv_init(&jv, "machines", err, errcap);
    sd_jv_member(&jv, machine);
    if (!json_is_array(slots) || json_array_size(slots) > SLOTS_PER_MACHINE_MAX) {
        sd_jv_fail(&jv, NULL, "must be an array of at most %d slots", SLOTS_PER_MACHINE_MAX);
        return NULL;
    }
    size_t n = json_array_size(slots);
    json_t **v = calloc(n ? n : 1, sizeof *v);
    if (!v) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    char *out = NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(slots, i), *spec;
        const char *svc;
        int64_t x;
        size_t mark = sd_jv_index(&jv, i);
        if (!json_is_object(s)) {
            sd_jv_fail(&jv, NULL, "must be an object");
            goto out;
        }
        if (sd_jv_only_keys(&jv, s, allowed) || sd_jv_name(&jv, s, "service", 1, &svc) < 0 ||
            sd_jv_int(&jv, s, "slot", 1, 0, SD_COUNT_MAX - 1, &x) < 0 ||
            sd_jv_int(&jv, s, "spec_version", 0, 0, INT64_C(1) << 53, &x) < 0 ||
            sd_jv_int(&jv, s, "restart_token", 0, 0, INT64_C(1) << 53, &x) < 0 ||
            sd_jv_object(&jv, s, "spec", SD_JV_NONNULL, &spec) < 0)
            goto out;
        char id[SD_NAME_MAX + 24];
        snprintf(id, sizeof id, "%s#%lld", svc,
                 (long long)json_integer_value(json_object_get(s, "slot")));
        if (json_object_get(seen, id)) {
            sd_jv_fail(&jv, NULL, "assigns slot %s a second time", id);
            goto out;
        }
        sd_jv_pop(&jv, mark);
        json_object_set_new(seen, id, json_true());
        v[i] = s;
    }
    qsort(v, n, sizeof *v, slot_cmp);
    json_t *sorted = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append(sorted, v[i]);
    out = sd_json_canonical(sorted);
    json_decref(sorted);
    if (!out)
        snprintf(err, errcap, "out of memory");
out:
    free(v);
    return out;
}

/* A primary-only write at `epoch` by a token bound to a machine: allowed only when that
 * machine holds the primary lease at that epoch (the write itself is fenced by the epoch,
 * so the lease cannot change hands in between without the write being refused). 0, or
 * -1 after answering (403 forbidden, or a store error). Unbound tokens pass. */
static int primary_is_caller(const sd_req_t *req, sd_resp_t *resp, const char *cluster,
                             int64_t epoch)
{
    if (!req->auth.machine[0])
        return 0;
    redisReply *r = NULL;
    int rc = sd__cluster_run("primary_get", cluster, &r, NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return -1;
    }
    char num[24];
    int mine = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
               !strcmp(rs(r, 0, num, sizeof num), req->auth.machine) &&
               sd_reply_num(r, 1) == epoch;
    freeReplyObject(r);
    if (mine)
        return 0;
    char what[64];
    snprintf(what, sizeof what, "write as the primary of epoch %lld", (long long)epoch);
    return sd_req_forbid(req, resp, what);
}

/* PUT /assignments {epoch, machines: {m: [slots]}} (primary only) -> 200 {version,
 * changed}; 409 stale_epoch. All named machines are replaced by one script. */
void h_assignments_put(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"epoch", "machines", NULL};
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX];
    int64_t epoch;
    json_t *pairs = json_array(), *seen = json_object();
    const json_t *machines = json_object_get(body, "machines");
    sd_jv_t v;
    sd_jv_init(&v, "", err, sizeof err);
    if (sd_jv_only_keys(&v, body, allowed) ||
        sd_jv_int(&v, body, "epoch", 1, 1, INT64_C(1) << 53, &epoch) < 0) {
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        goto out;
    }
    if (!json_is_object(machines) || json_object_size(machines) > MACHINES_PER_PUT_MAX) {
        sd_resp_error(resp, 400, "bad_field",
                      "field 'machines' must be an object of at most %d machine -> slot lists",
                      MACHINES_PER_PUT_MAX);
        goto out;
    }
    const char *m;
    json_t *slots;
    json_object_foreach((json_t *)machines, m, slots) {
        if (!sd_name_valid(m, SD_NAME_MAX)) {
            sd_resp_error(resp, 400, "bad_name", "machines: '%.64s' is not a machine name", m);
            goto out;
        }
        char *text = slots_canonical(m, slots, seen, err, sizeof err);
        if (!text) {
            sd_resp_error(resp, 400, "bad_field", "%s", err);
            goto out;
        }
        json_array_append_new(pairs, json_string(m));
        json_array_append_new(pairs, json_string(text));
        free(text);
    }
    if (primary_is_caller(req, resp, cluster, epoch))
        goto out;
    char *pairs_text = sd_json_canonical(pairs), chan[96], epochs[24];
    snprintf(epochs, sizeof epochs, "%lld", (long long)epoch);
    redisReply *r = NULL;
    int rc = pairs_text ? sd__cluster_run("assign_put", cluster, &r, epochs,
                                          sd_assign_channel(chan, sizeof chan), cluster,
                                          pairs_text, NULL)
                        : SD_STORE_ERROR;
    free(pairs_text);
    if (rc) {
        sd_resp_store_error(resp, rc);
        goto out;
    }
    if (sd_reply_status_is(r, "stale_epoch") && r->elements == 3) {
        log_info("assignments refused", "cluster=%s epoch=%lld current=%lld", cluster,
                 (long long)epoch, (long long)sd_reply_num(r, 1));
        stale_epoch(resp, r, epoch);
    } else if (sd_reply_status_is(r, "ok") && r->elements == 3) {
        int changed = sd_reply_num(r, 2) == 1;
        if (changed)
            SD_COUNT("serverdir_assignment_writes_total",
                     "assignment PUTs that changed some machine's document", 1);
        sd_resp_json(resp, 200, json_pack("{s:I, s:b}", "version", (json_int_t)sd_reply_num(r, 1),
                                          "changed", changed));
    } else {
        sd_resp_bad_reply(resp, "assign_put", r);
    }
    freeReplyObject(r);
out:
    json_decref(seen);
    json_decref(pairs);
    json_decref(body);
}

int sd_assign_read(const char *cluster, const char *machine, json_t **doc, int64_t *version)
{
    redisReply *r = NULL;
    int rc = sd__cluster_run("assign_get", cluster, &r, machine, NULL);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 5 ||
        r->element[4]->type != REDIS_REPLY_ARRAY) {
        log_error("unexpected script reply", "script=%s type=%d", "assign_get", r->type);
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    char num[32];
    *version = sd_reply_num(r, 0);
    *doc = doc_json(machine, *version, sd_reply_num(r, 1), sd_reply_num(r, 3) == 1,
                    rs(r, 2, num, sizeof num));
    /* The open allocations on the machine, in id order: "<entry JSON>\x1f<payload>". */
    json_t *allocs = json_array();
    const redisReply *al = r->element[4];
    for (size_t i = 0; i + 1 < al->elements; i += 2) {
        const char *v = sd_reply_str(al, i + 1), *us = strchr(v, '\x1f');
        json_t *e = us ? json_loadb(v, (size_t)(us - v), 0, NULL) : NULL;
        json_t *pl = us ? json_loads(us + 1, JSON_DECODE_ANY, NULL) : NULL;
        if (!json_is_object(e) || !pl) {
            json_decref(e);
            json_decref(pl);
            continue;
        }
        json_object_set_new(e, "payload", pl);
        json_array_append_new(allocs, e);
    }
    json_object_set_new(*doc, "allocations", allocs);
    freeReplyObject(r);
    return SD_STORE_OK;
}

/* The version an If-None-Match value names ("\"42\"", "42" or W/"42"), or -1. */
static int64_t etag_version(const char *v)
{
    if (!v)
        return -1;
    if (strncmp(v, "W/", 2) == 0)
        v += 2;
    char buf[32];
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, v, n);
    buf[n] = '\0';
    int64_t out;
    return sd_parse_i64(buf, 0, INT64_MAX, &out) ? -1 : out;
}

void sd_assign_answer(sd_resp_t *resp, json_t *doc, int64_t version, const char *if_none_match)
{
    char etag[32];
    snprintf(etag, sizeof etag, "\"%lld\"", (long long)version);
    sd_resp_header(resp, "ETag", etag);
    if (etag_version(if_none_match) == version) {
        json_decref(doc);
        sd_resp_empty(resp, 304);
        return;
    }
    sd_resp_json(resp, 200, doc);
}

/* GET /machines/{m}/assignments[?version=V&wait=MS] -> the machine's document. With
 * version equal to the current one and wait > 0 the request is parked until the
 * document changes or the wait ends (200 either way). If-None-Match -> 304. */
void h_assignments_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *machine;
    int64_t version, wait;
    if (sd_req_cluster_and(req, resp, &cluster, "machine", &machine) ||
        sd_req_may_machine(req, resp, cluster, machine) ||
        sd_req_query_int(req, resp, "version", 0, INT64_MAX, -1, &version) ||
        sd_req_query_int(req, resp, "wait", 0, SD_ASSIGN_WAIT_MAX_MS, 0, &wait))
        return;
    json_t *doc = NULL;
    int64_t cur = 0;
    int rc = sd_assign_read(cluster, machine, &doc, &cur);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (wait > 0 && version == cur && !sd_http_stopping()) {
        json_decref(doc);
        sd_assign_park(req, resp, cluster, machine, version, wait);
        return;
    }
    sd_assign_answer(resp, doc, cur, sd_req_header(req, "If-None-Match"));
}

/* Marks the instance/service pairs of a machine_lost reply from index `from` stopped
 * (machine_lost) through sd_dir_mark_lost; the number applied or a SD_STORE_* error. */
static long long lost_events(const char *cluster, const char *machine, int64_t epoch,
                             const redisReply *r, size_t from)
{
    size_t n = r->elements > from ? (r->elements - from) / 2 : 0;
    const char **insts = calloc(n ? n : 1, sizeof *insts);
    const char **svcs = calloc(n ? n : 1, sizeof *svcs);
    char (*bufs)[2][SD_NAME_MAX + 1] = calloc(n ? n : 1, sizeof *bufs);
    long long rc = SD_STORE_ERROR;
    if (insts && svcs && bufs) {
        char num[32];
        for (size_t k = 0; k < n; k++) {
            sd_strlcpy(bufs[k][0], rs(r, from + 2 * k, num, sizeof num), sizeof bufs[k][0]);
            sd_strlcpy(bufs[k][1], rs(r, from + 2 * k + 1, num, sizeof num), sizeof bufs[k][1]);
            insts[k] = bufs[k][0];
            svcs[k] = bufs[k][1];
        }
        char idpfx[48];
        snprintf(idpfx, sizeof idpfx, "lost.%lld", (long long)epoch);
        rc = sd_dir_mark_lost(cluster, machine, idpfx,
                              "the machine's lease expired; declared lost by the primary", insts,
                              svcs, n);
    }
    free(insts);
    free(svcs);
    free(bufs);
    return rc;
}

/* The body's "keep": at most KEEP_MAX service names, each added to a; 0, or -1 with err. */
#define KEEP_MAX 1000
static int keep_args(sd_jv_t *v, const json_t *body, sd_argv_t *a)
{
    json_t *keep = NULL;
    if (sd_jv_array(v, body, "keep", SD_JV_NONNULL, KEEP_MAX, &keep) < 0)
        return -1;
    size_t i;
    const json_t *n;
    json_array_foreach(keep, i, n) {
        if (!json_is_string(n) || !sd_name_valid(json_string_value(n), SD_NAME_MAX)) {
            sd_jv_key(v, "keep");
            sd_jv_index(v, i);
            return sd_jv_fail(v, NULL, "must be a service name");
        }
        sd_argv_add(a, json_string_value(n));
    }
    return 0;
}

/* POST /machines/{m}/lost {epoch, keep?} (primary only) -> 200 {machine, stopped,
 * version, changed}: m's slots are removed from the assignments (fenced by the epoch) and
 * its live processes are marked stopped with reason machine_lost through events_apply, so
 * the directory and the history show them. keep names services whose processes stay as
 * they are (spec.disconnect holds their slots, or keeps their originals); with any named,
 * the slots are left to the primary's PUT. 409 stale_epoch; 409 machine_live when m's lease
 * is live again (it renewed after the primary read the state), nothing written. */
void h_machine_lost(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"epoch", "keep", NULL};
    const char *cluster, *machine;
    if (sd_req_cluster_and(req, resp, &cluster, "machine", &machine))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX], chan[96], epochs[24], base[256];
    int64_t epoch = 0;
    int rc;
    redisReply *r = NULL;
    sd_jv_t v;
    sd_argv_t a; /* the script's key and args; the kept names point into body */
    sd_argv_init(&a);
    sd_jv_init(&v, "", err, sizeof err);
    if (sd_jv_only_keys(&v, body, allowed) ||
        sd_jv_int(&v, body, "epoch", 1, 1, INT64_C(1) << 53, &epoch) < 0)
        goto bad;
    snprintf(epochs, sizeof epochs, "%lld", (long long)epoch);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_add(&a, epochs);
    sd_argv_add(&a, machine);
    sd_argv_add(&a, sd_assign_channel(chan, sizeof chan));
    sd_argv_add(&a, cluster);
    if (keep_args(&v, body, &a))
        goto bad;
    if (primary_is_caller(req, resp, cluster, epoch))
        goto out;
    rc = sd_dir_ensure_index(cluster); /* machine_lost reads ix:m:<machine> */
    if (rc) {
        sd_resp_store_error(resp, rc);
        goto out;
    }
    rc = sd_store_run("machine_lost", 1, &a, &r);
    if (rc) {
        sd_resp_store_error(resp, rc);
        goto out_freed;
    }
    if (sd_reply_status_is(r, "stale_epoch") && r->elements == 3) {
        stale_epoch(resp, r, epoch);
    } else if (sd_reply_status_is(r, "machine_live") && r->elements == 2) {
        sd_resp_error_extra(resp, 409, "machine_live",
                            json_pack("{s:s, s:I}", "machine", machine, "expires_in_ms",
                                      (json_int_t)sd_reply_num(r, 1)),
                            "machine '%s' renewed its lease (%lld ms left): it is not lost",
                            machine, (long long)sd_reply_num(r, 1));
    } else if (sd_reply_status_is(r, "ok") && r->elements >= 3 && (r->elements - 3) % 2 == 0) {
        long long stopped = lost_events(cluster, machine, epoch, r, 3);
        if (stopped < 0) {
            sd_resp_store_error(resp, (int)stopped);
        } else {
            log_info("machine declared lost", "cluster=%s machine=%s epoch=%lld stopped=%lld",
                     cluster, machine, (long long)epoch, stopped);
            SD_COUNT("serverdir_machines_lost_total", "machines declared lost by the primary", 1);
            sd_resp_json(resp, 200, json_pack("{s:s, s:I, s:I, s:b}", "machine", machine,
                                              "stopped", (json_int_t)stopped, "version",
                                              (json_int_t)sd_reply_num(r, 1), "changed",
                                              sd_reply_num(r, 2) == 1));
        }
    } else {
        sd_resp_bad_reply(resp, "machine_lost", r);
    }
    freeReplyObject(r);
    goto out_freed;
bad:
    sd_resp_error(resp, 400, "bad_field", "%s", err);
out:
    sd_argv_free(&a);
out_freed:
    json_decref(body);
}
