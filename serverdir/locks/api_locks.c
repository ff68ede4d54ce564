/* The lock table's HTTP handlers (docs/locks.md): acquire one key or several all or
 * nothing, release, renew, inspect, list, forced unlock. Each handler parses its request
 * with locks.c, runs one script call there and turns the reply into the HTTP answer; a
 * refused acquire with wait_ms is handed to locks.c's bounded wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cred.h"
#include "locks.h"
#include "quota.h"
#include "sdvalid.h"
#include "sd.h"

SD_ROUTE(PUT, "/v1/locks/{key}", SD_R_GAME, SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_lock_put);
SD_ROUTE(POST, "/v1/locks/acquire", SD_R_GAME, SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_lock_acquire_many);
SD_ROUTE(POST, "/v1/locks/release", SD_R_GAME, SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_lock_release_many);
SD_ROUTE(POST, "/v1/locks/{key}/renew", SD_R_GAME, SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_lock_renew);
SD_ROUTE(GET, "/v1/locks/{key}", SD_R_GAME | SD_R_VIEWER, 0, h_lock_get);
SD_ROUTE(GET, "/v1/locks", SD_R_GAME | SD_R_VIEWER, 0, h_lock_list);
SD_ROUTE(DELETE, "/v1/locks/{key}", SD_R_GAME, SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_lock_delete);

#define LIST_MAX 1000

/* ---------- acquire ---------- */

/* Answers a refused acquire (lock_held or lock_delayed). */
static void acquire_refused(sd_resp_t *resp, const redisReply *r, int64_t waited_ms)
{
    const char *name = sd_reply_str(r, 1);
    if (strcmp(sd_reply_str(r, 0), "lock_delayed") == 0) {
        int64_t after = sd_reply_num(r, 2);
        char ra[24];
        snprintf(ra, sizeof ra, "%lld", (long long)(after + 999) / 1000);
        sd_resp_header(resp, "Retry-After", ra);
        SD_COUNT("serverdir_lock_conflicts_total{reason=\"lock_delayed\"}", "Refused acquires", 1);
        sd_resp_error_extra(resp, 409, "lock_delayed",
                            json_pack("{s:s, s:I, s:I}", "key", name, "retry_after_ms",
                                      (json_int_t)after, "waited_ms", (json_int_t)waited_ms),
                            "lock '%s' was force-unlocked or expired; it can be acquired "
                            "again in %lld ms",
                            name, (long long)after);
        return;
    }
    int64_t since = sd_reply_num(r, 3), expires = sd_reply_num(r, 4), now = sd_reply_num(r, 5);
    json_t *extra = json_pack("{s:s, s:s, s:I, s:I, s:I}", "key", name, "holder", sd_reply_str(r, 2),
                              "since_ms", (json_int_t)since, "held_for_ms",
                              (json_int_t)(now - since), "waited_ms", (json_int_t)waited_ms);
    json_object_set_new(extra, "expires_in_ms",
                        expires > 0 ? json_integer(expires - now) : json_null());
    SD_COUNT("serverdir_lock_conflicts_total{reason=\"lock_held\"}", "Refused acquires", 1);
    if (strcmp(sd_reply_str(r, 6), "1") == 0) /* the caller's holder, without its grant */
        sd_resp_error_extra(resp, 409, "lock_held", extra,
                            "lock '%s' is held by '%s' since %lld under a grant this request "
                            "did not present: acquire again with its lock_token, or wait for "
                            "its release or expiry",
                            name, sd_reply_str(r, 2), (long long)since);
    else
        sd_resp_error_extra(resp, 409, "lock_held", extra,
                            "lock '%s' is held by '%s' since %lld (for %lld ms)", name,
                            sd_reply_str(r, 2), (long long)since, (long long)(now - since));
}

/* One granted key of an ok reply (status, now, then SD_LOCK_GRANT_FIELDS per key): its
 * members, into the object w has open. The lock_token goes to the holder here and
 * nowhere else. Written straight into the answer (sd_resp_jw_begin): the grant is the
 * answer every login waits for. */
static void grant_write(sd_jw_t *w, const redisReply *r, int i, int64_t now_ms)
{
    size_t b = 2 + (size_t)i * SD_LOCK_GRANT_FIELDS;
    int64_t expires = sd_reply_num(r, b + 5);
    sd_jw_str(w, "key", sd_reply_str(r, b));
    sd_jw_int(w, "lock_seq", sd_reply_num(r, b + 1));
    sd_jw_str(w, "lock_token", sd_reply_str(r, b + 6));
    sd_jw_int(w, "since_ms", sd_reply_num(r, b + 4));
    sd_jw_bool(w, "reacquired", strcmp(sd_reply_str(r, b + 2), "1") == 0);
    if (expires > 0)
        sd_jw_int(w, "expires_in_ms", expires - now_ms);
    else
        sd_jw_null(w, "expires_in_ms");
    const char *stolen = sd_reply_str(r, b + 3);
    if (*stolen) {
        sd_jw_str(w, "stolen_from", stolen);
        log_info("lock stolen", "key=%s from=%s", sd_reply_str(r, b), stolen);
        SD_COUNT("serverdir_lock_steals_total", "Locks taken over from a stopped or old holder", 1);
    }
}

/* Answers an acquire from its last script reply (stolen: freed here): the grant (single:
 * one object, many: {holder, locks}) after the optional WAIT, or the refusal. Runs on the
 * thread whose Redis connection made the grant, so WAIT covers it. */
static void acquire_finish(const sd_lock_req_t *a, int many, redisReply *r, int64_t waited,
                           sd_resp_t *resp)
{
    if (!sd_reply_has_status(r)) {
        sd_resp_bad_reply(resp, "lock_acquire", r);
    } else if (sd_cred_revoked_reply(r, resp)) {
    } else if (sd_lock_holder_stopped_reply(r, a->holder, resp)) {
    } else if (strcmp(sd_reply_str(r, 0), "quota_exceeded") == 0) {
        sd_quota_refuse(resp, SD_QUOTA_LOCKS_PER_HOLDER, sd_reply_num(r, 1), a->holder);
    } else if (strcmp(sd_reply_str(r, 0), "ok") != 0) {
        acquire_refused(resp, r, waited);
    } else if (r->elements != 2 + (size_t)a->n * SD_LOCK_GRANT_FIELDS) {
        sd_resp_bad_reply(resp, "lock_acquire", r);
    } else if (sd_locks_wait_acked(resp) == 0) {
        SD_COUNT("serverdir_lock_grants_total", "Locks granted (keys)", a->n);
        /* Times are Redis time; expires_in_ms is relative to the grant itself. */
        int64_t now_ms = sd_reply_num(r, 1);
        sd_jw_t w;
        sd_resp_jw_begin(resp, &w);
        sd_jw_obj(&w, NULL);
        if (!many) {
            grant_write(&w, r, 0, now_ms);
            sd_jw_str(&w, "holder", a->holder);
        } else {
            sd_jw_str(&w, "holder", a->holder);
            sd_jw_arr(&w, "locks");
            for (int i = 0; i < a->n; i++) {
                sd_jw_obj(&w, NULL);
                grant_write(&w, r, i, now_ms);
                sd_jw_end(&w);
            }
            sd_jw_end(&w);
        }
        sd_jw_end(&w);
        sd_resp_jw_end(resp, 200, &w);
    }
    freeReplyObject(r);
}
/* The token's bindings on an acquire: a holder prefix; a cluster, whose game servers lock
 * as the processes its directory knows (and steal only within it). 0, or -1 after
 * answering 403 (or a store error). */
static int acquire_allowed(sd_req_t *req, sd_resp_t *resp, const sd_lock_req_t *a)
{
    if (sd_req_may_hold(req, resp, a->holder))
        return -1;
    const char *cluster = req->auth.cluster;
    if (!cluster[0] || req->auth.role != SD_R_GAME)
        return 0;
    if (a->steal_cluster[0] && sd_req_may_cluster(req, resp, a->steal_cluster))
        return -1;
    if (req->auth.cred) /* its own instance (above), whose record the script checks */
        return 0;
    if (sd_req_defer(req)) /* the check below waits on Redis */
        return -1;
    char key[2 * SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "EXISTS");
    sd_argv_add(&av, sd_key(key, sizeof key, cluster, "proc:%s", a->holder));
    redisReply *r;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return -1;
    }
    int known = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (known)
        return 0;
    char what[SD_NAME_MAX + 64];
    snprintf(what, sizeof what, "lock as '%s', not a process of its cluster", a->holder);
    return sd_req_forbid(req, resp, what);
}

/* An acquire in the group commit (locks.h): its request's copy of the parsed body, whose
 * strings stay valid while it holds the body. */
typedef struct {
    sd_lock_call_t c; /* first */
    sd_lock_req_t a;
    int many;
    json_t *body; /* a reference: a's strings point into it */
    sd_resp_t *resp;
    unsigned char added[SD_LOCKS_MAX_KEYS];
} acquire_job_t;

static void acquire_call(sd_group_job_t **jobs, int n) { sd_lock_calls_run("lock_acquire", jobs, n); }

/* Answers an acquire from its call, resumes its request when parked, frees the job. */
static void acquire_job_finish(sd_group_job_t *g, int parked)
{
    acquire_job_t *j = (acquire_job_t *)g;
    sd_lock_acquire_after(&j->a, j->c.rc, j->c.r, j->added);
    if (j->c.rc != SD_STORE_OK)
        sd_resp_store_error(j->resp, j->c.rc);
    else
        acquire_finish(&j->a, j->many, j->c.r, 0, j->resp);
    if (parked)
        sd_req_resume(j->c.g.req);
    json_decref(j->body);
    free(j);
}

static sd_group_t acquire_group =
    SD_LOCK_GROUP("lock_acquire", sd_lock_script_calls, acquire_call, acquire_job_finish);

/* Acquires without waiting: one script call of its own or one it shares with other
 * requests (the group commit), answered from its own item. */
static void acquire_grouped(const sd_lock_req_t *a, int many, json_t *body, sd_req_t *req,
                            sd_resp_t *resp)
{
    acquire_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    j->a = *a;
    j->many = many;
    j->resp = resp;
    int rc = sd_lock_acquire_prepare(&j->a, &j->c.av, &j->c.nkeys, j->added);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        free(j);
        return;
    }
    j->body = json_incref(body);
    j->c.g.req = req;
    sd_lock_call_ready(&j->c, a->n);
    sd_group_submit(&acquire_group, &j->c.g);
}

/* Acquires: without wait_ms through the group commit; with wait_ms once on this worker
 * thread, where a refusal parks the request (sd_lock_park: the worker goes on serving)
 * and everything else is answered at once. */
static void acquire_answer(const sd_lock_req_t *req_a, int many, json_t *body, sd_req_t *req,
                           sd_resp_t *resp)
{
    sd_lock_req_t scoped = *req_a, *a = &scoped;
    if (acquire_allowed(req, resp, a))
        return;
    /* a steal stays inside the caller's cluster, unless the caller is ops */
    if (req->auth.role != SD_R_OPS)
        a->steal_within = req->auth.cluster;
    a->auth = &req->auth;
    if (a->wait_ms == 0) {
        acquire_grouped(a, many, body, req, resp);
        return;
    }
    if (sd_req_defer(req)) /* an acquire that may wait makes its first call itself */
        return;
    int64_t start = sd_mono_ms();
    redisReply *r = NULL;
    int rc = sd_lock_acquire(a, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (sd_reply_has_status(r) &&
        (!strcmp(sd_reply_str(r, 0), "lock_held") || !strcmp(sd_reply_str(r, 0), "lock_delayed")) &&
        !sd_http_stopping()) {
        freeReplyObject(r);
        sd_lock_park(a, many, start, req, resp, acquire_finish);
        return;
    }
    acquire_finish(a, many, r, 0, resp);
}

/* PUT /v1/locks/{key} {holder, ttl_ms?, wait_ms?, steal_if_holder_stopped?,
 * steal_if_older_than_ms?} -> 200 {key, holder, lock_seq, since_ms, expires_in_ms,
 * reacquired, stolen_from?}; 409 lock_held / lock_delayed / holder_stopped. */
void h_lock_put(sd_req_t *req, sd_resp_t *resp)
{
    sd_lock_req_t a = {0};
    const char *name, *code;
    char err[SD_ERRMSG_MAX];
    if (sd_req_lock_name(req, resp, "lock key", &name))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    if (sd_lock_req_parse(body, 0, &a, &code, err, sizeof err)) {
        sd_resp_error(resp, 400, code, "%s", err);
    } else {
        a.names[0] = name;
        a.n = 1;
        acquire_answer(&a, 0, body, req, resp);
    }
    json_decref(body);
}

/* POST /v1/locks/acquire {keys:[...], holder, ...same options} -> 200 {holder, locks:[...]};
 * all or nothing: one refused key refuses the whole request and changes nothing. */
void h_lock_acquire_many(sd_req_t *req, sd_resp_t *resp)
{
    sd_lock_req_t a = {0};
    const char *code;
    char err[SD_ERRMSG_MAX];
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    if (sd_lock_req_parse(body, 1, &a, &code, err, sizeof err))
        sd_resp_error(resp, 400, code, "%s", err);
    else
        acquire_answer(&a, 1, body, req, resp);
    json_decref(body);
}

/* ---------- release ---------- */

/* Answers a release from its lock_release.lua reply r (freed here). */
static void release_reply(const sd_lock_rel_t *rel, int many, redisReply *r, sd_resp_t *resp)
{
    const char *holder = rel->holder;
    int n = rel->n;
    const char *st = sd_reply_str(r, 0);
    if (!sd_reply_has_status(r)) {
        sd_resp_bad_reply(resp, "lock_release", r);
    } else if (sd_cred_revoked_reply(r, resp)) {
    } else if (strcmp(st, "not_holder") == 0) {
        const char *cur = sd_reply_str(r, 2);
        json_t *extra = json_pack("{s:s}", "key", sd_reply_str(r, 1));
        json_object_set_new(extra, "holder", *cur ? json_string(cur) : json_null());
        sd_resp_error_extra(resp, 409, "not_holder", extra, "lock '%s' is %s%s%s", sd_reply_str(r, 1),
                            *cur ? "held by '" : "not held", cur, *cur ? "'" : "");
    } else if (strcmp(st, "stale_lock_seq") == 0) {
        sd_resp_error_extra(resp, 409, "stale_lock_seq", json_pack("{s:s}", "key", sd_reply_str(r, 1)),
                            "lock '%s' was granted to this holder again with another lock_seq",
                            sd_reply_str(r, 1));
    } else if (strcmp(st, "fenced") == 0) {
        sd_lock_fenced(resp, "release", sd_reply_str(r, 1));
    } else if (strcmp(st, "ok") == 0 && r->elements == 1 + (size_t)n * 2) {
        SD_COUNT("serverdir_lock_releases_total", "Locks released by their holder (keys)", n);
        sd_jw_t w;
        sd_resp_jw_begin(resp, &w);
        sd_jw_obj(&w, NULL);
        if (!many) {
            sd_jw_str(&w, "key", sd_reply_str(r, 1));
            sd_jw_str(&w, "holder", holder);
            sd_jw_int(&w, "lock_seq", sd_reply_num(r, 2));
        } else {
            sd_jw_str(&w, "holder", holder);
            sd_jw_arr(&w, "locks");
            for (int i = 0; i < n; i++) {
                sd_jw_obj(&w, NULL);
                sd_jw_str(&w, "key", sd_reply_str(r, 1 + i * 2));
                sd_jw_int(&w, "lock_seq", sd_reply_num(r, 2 + i * 2));
                sd_jw_end(&w);
            }
            sd_jw_end(&w);
        }
        sd_jw_bool(&w, "released", 1);
        sd_jw_end(&w);
        sd_resp_jw_end(resp, 200, &w);
    } else {
        sd_resp_bad_reply(resp, "lock_release", r);
    }
    freeReplyObject(r);
}

/* A release in the group commit: its request's copy of the parsed release, whose strings
 * point into the body (held) or the request. */
typedef struct {
    sd_lock_call_t c; /* first */
    sd_lock_rel_t rel;
    int many;
    json_t *body; /* a reference, or NULL (DELETE: the strings are the request's) */
    sd_resp_t *resp;
} release_job_t;

static void release_call(sd_group_job_t **jobs, int n) { sd_lock_calls_run("lock_release", jobs, n); }

static void release_job_finish(sd_group_job_t *g, int parked)
{
    release_job_t *j = (release_job_t *)g;
    sd_lock_release_after(&j->rel, j->c.rc, j->c.r);
    if (j->c.rc != SD_STORE_OK)
        sd_resp_store_error(j->resp, j->c.rc);
    else
        release_reply(&j->rel, j->many, j->c.r, j->resp);
    if (parked)
        sd_req_resume(j->c.g.req);
    if (j->body)
        json_decref(j->body);
    free(j);
}

static sd_group_t release_group =
    SD_LOCK_GROUP("lock_release", sd_lock_script_calls, release_call, release_job_finish);

/* Runs lock_release.lua for rel, in a call of its own or one it shares (the group
 * commit), and answers. body (may be NULL) holds rel's strings. */
static void release_answer(const sd_lock_rel_t *rel, int many, json_t *body, sd_req_t *req,
                           sd_resp_t *resp)
{
    release_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    j->rel = *rel;
    j->many = many;
    j->resp = resp;
    j->body = body ? json_incref(body) : NULL;
    j->c.g.req = req;
    sd_lock_release_prepare(&j->rel, &j->c.av, &j->c.nkeys);
    sd_lock_call_ready(&j->c, rel->n);
    sd_group_submit(&release_group, &j->c.g);
}

/* POST /v1/locks/release {holder, keys:[...], lock_seqs:{key: n}, lock_tokens:{key: t}}
 * -> 200; all or nothing. */
void h_lock_release_many(sd_req_t *req, sd_resp_t *resp)
{
    sd_lock_rel_t rel = {0};
    const char *code;
    char err[SD_ERRMSG_MAX];
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    if (sd_lock_release_parse(body, &rel, &code, err, sizeof err))
        sd_resp_error(resp, 400, code, "%s", err);
    else if (sd_req_may_hold(req, resp, rel.holder) == 0) {
        rel.auth = &req->auth;
        release_answer(&rel, 1, body, req, resp);
    }
    json_decref(body);
}

/* DELETE /v1/locks/{key}?holder=H&lock_seq=N with header Lock-Token: release by the holder.
 * DELETE /v1/locks/{key}?force=true: forced unlock, ops only; starts the lock-delay. */
void h_lock_delete(sd_req_t *req, sd_resp_t *resp)
{
    const char *name;
    if (sd_req_lock_name(req, resp, "lock key", &name))
        return;
    const char *force = sd_req_query(req, "force");
    const char *holder = sd_req_query(req, "holder");
    const char *seq_s = sd_req_query(req, "lock_seq");
    if (force) {
        if (strcmp(force, "true") != 0 || holder || seq_s) {
            sd_resp_error(resp, 400, "bad_query",
                          "use either ?force=true (ops) or ?holder=H&lock_seq=N");
            return;
        }
        if (req->role != SD_R_OPS) {
            sd_resp_error(resp, 403, "forbidden", "only the ops role may force-unlock");
            return;
        }
        if (sd_req_defer(req)) /* a forced unlock makes its call itself */
            return;
        redisReply *r;
        int rc = sd_lock_force(name, &r);
        if (rc != SD_STORE_OK) {
            sd_resp_store_error(resp, rc);
            return;
        }
        if (sd_reply_has_status(r) && strcmp(sd_reply_str(r, 0), "not_held") == 0) {
            sd_resp_error_extra(resp, 404, "not_held", json_pack("{s:s}", "key", name),
                                "lock '%s' is not held", name);
        } else if (sd_reply_has_status(r) && strcmp(sd_reply_str(r, 0), "ok") == 0 && r->elements == 4) {
            log_info("lock force-unlocked", "key=%s holder=%s lock_seq=%s peer=%s", name,
                     sd_reply_str(r, 1), sd_reply_str(r, 2), req->peer_ip);
            SD_COUNT("serverdir_lock_forced_total", "Locks force-unlocked by ops", 1);
            sd_resp_json(resp, 200,
                         json_pack("{s:s, s:s, s:I, s:b, s:I}", "key", name, "previous_holder",
                                   sd_reply_str(r, 1), "lock_seq", (json_int_t)sd_reply_num(r, 2), "forced", 1,
                                   "lock_delay_ms", (json_int_t)sd_locks_cfg.lock_delay_ms));
        } else {
            sd_resp_bad_reply(resp, "lock_force", r);
        }
        freeReplyObject(r);
        return;
    }
    if (!holder) {
        sd_resp_error(resp, 400, "missing_holder", "query parameter 'holder' is required");
        return;
    }
    if (!sd_name_valid(holder, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_holder", "query parameter 'holder' must be a name");
        return;
    }
    if (!seq_s) {
        sd_resp_error(resp, 400, "missing_lock_seq",
                      "query parameter 'lock_seq' (the granted lock_seq) is required");
        return;
    }
    sd_lock_rel_t rel = {.holder = holder, .names = {name}, .n = 1, .auth = &req->auth};
    if (sd_seq_parse(seq_s, &rel.seqs[0])) {
        sd_resp_error(resp, 400, "bad_lock_seq",
                      "query parameter 'lock_seq' must be a decimal number 1-2^53");
        return;
    }
    if (sd_lock_token_header(req, resp, &rel.tokens[0]) || sd_req_may_hold(req, resp, holder))
        return;
    release_answer(&rel, 0, NULL, req, resp);
}

/* ---------- renew ---------- */

/* Answers a renewal of name by holder from its lock_renew.lua reply r (freed here). */
static void renew_reply(const char *name, const char *holder, redisReply *r, sd_resp_t *resp)
{
    const char *st = sd_reply_str(r, 0);
    if (sd_cred_revoked_reply(r, resp)) {
    } else if (sd_lock_holder_stopped_reply(r, holder, resp)) {
    } else if (sd_reply_has_status(r) && strcmp(st, "not_holder") == 0) {
        const char *cur = sd_reply_str(r, 1);
        json_t *extra = json_pack("{s:s}", "key", name);
        json_object_set_new(extra, "holder", *cur ? json_string(cur) : json_null());
        sd_resp_error_extra(resp, 409, "not_holder", extra, "lock '%s' is %s%s%s", name,
                            *cur ? "held by '" : "not held (or its lease ran out)", cur,
                            *cur ? "'" : "");
    } else if (sd_reply_has_status(r) && strcmp(st, "stale_lock_seq") == 0) {
        sd_resp_error_extra(resp, 409, "stale_lock_seq", json_pack("{s:s}", "key", name),
                            "lock '%s' was granted to this holder again with another lock_seq",
                            name);
    } else if (sd_reply_has_status(r) && strcmp(st, "fenced") == 0) {
        sd_lock_fenced(resp, "renew", name);
    } else if (sd_reply_has_status(r) && strcmp(st, "ok") == 0 && r->elements == 4) {
        int64_t expires = sd_reply_num(r, 2), now = sd_reply_num(r, 3);
        sd_jw_t w;
        sd_resp_jw_begin(resp, &w);
        sd_jw_obj(&w, NULL);
        sd_jw_str(&w, "key", name);
        sd_jw_str(&w, "holder", holder);
        sd_jw_int(&w, "lock_seq", sd_reply_num(r, 1));
        if (expires > 0)
            sd_jw_int(&w, "expires_in_ms", expires - now);
        else
            sd_jw_null(&w, "expires_in_ms");
        sd_jw_end(&w);
        sd_resp_jw_end(resp, 200, &w);
    } else {
        sd_resp_bad_reply(resp, "lock_renew", r);
    }
    freeReplyObject(r);
}

/* A renewal in the group commit: name is the request's, holder points into the body. */
typedef struct {
    sd_lock_call_t c; /* first */
    const char *name, *holder;
    json_t *body; /* a reference: holder points into it */
    sd_resp_t *resp;
} renew_job_t;

static void renew_call(sd_group_job_t **jobs, int n) { sd_lock_calls_run("lock_renew", jobs, n); }

static void renew_job_finish(sd_group_job_t *g, int parked)
{
    renew_job_t *j = (renew_job_t *)g;
    if (j->c.rc != SD_STORE_OK)
        sd_resp_store_error(j->resp, j->c.rc);
    else
        renew_reply(j->name, j->holder, j->c.r, j->resp);
    if (parked)
        sd_req_resume(j->c.g.req);
    json_decref(j->body);
    free(j);
}

static sd_group_t renew_group =
    SD_LOCK_GROUP("lock_renew", sd_lock_script_calls, renew_call, renew_job_finish);

/* POST /v1/locks/{key}/renew {holder, lock_seq, lock_token, ttl_ms?} -> 200 {key, holder,
 * lock_seq, expires_in_ms}. Without ttl_ms the lease granted last is renewed for the same
 * length. 409 holder_stopped when the caller's cluster records the holder stopped. One
 * script call of its own or one shared with other renewals (the group commit). */
void h_lock_renew(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"holder", "lock_seq", "lock_token", "ttl_ms", NULL};
    const char *name, *holder, *token = NULL;
    int64_t seq = 0, ttl = 0;
    if (sd_req_lock_name(req, resp, "lock key", &name))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX];
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, sizeof err);
    if (sd_jv_only_keys(&jv, body, allowed) ||
        sd_jv_name(&jv, body, "holder", 1, &holder) < 0 ||
        sd_jv_int(&jv, body, "lock_seq", 1, 1, SD_SEQ_MAX, &seq) < 0 ||
        sd_jv_int(&jv, body, "ttl_ms", 0, 1, SD_LOCKS_TTL_MAX_MS, &ttl) < 0) {
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        goto out;
    }
    if (sd_req_may_hold(req, resp, holder))
        goto out;
    token = json_string_value(json_object_get(body, "lock_token"));
    if (!sd_lock_token_valid(token)) {
        sd_resp_error(resp, 400, token ? "bad_lock_token" : "missing_lock_token",
                      "field 'lock_token' must be the lock_token of the grant (%d hex "
                      "characters)",
                      SD_LOCK_TOKEN_LEN);
        goto out;
    }
    renew_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        goto out;
    }
    int rc = sd_lock_renew_prepare(name, holder, seq, token, ttl, &req->auth, &j->c.av);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        free(j);
        goto out;
    }
    j->name = name;
    j->holder = holder;
    j->resp = resp;
    j->body = json_incref(body);
    j->c.g.req = req;
    j->c.nkeys = 1;
    sd_lock_call_ready(&j->c, 1);
    sd_group_submit(&renew_group, &j->c.g);
out:
    json_decref(body);
}

/* ---------- inspect ---------- */

/* GET /v1/locks/{key} -> {key, state: held|free, holder, lock_seq, since_ms, held_for_ms,
 * expires_in_ms, lock_delay_ms, stolen_from}; lock_seq is the last granted one (null when
 * the key has no record). */
void h_lock_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *name;
    if (sd_req_lock_name(req, resp, "lock key", &name))
        return;
    redisReply *r;
    int rc = sd_lock_get(name, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (!sd_reply_has_status(r)) {
        sd_resp_bad_reply(resp, "lock_get", r);
        freeReplyObject(r);
        return;
    }
    json_t *out = json_pack("{s:s}", "key", name);
    if (strcmp(sd_reply_str(r, 0), "unknown") == 0 || r->elements != 9) {
        json_object_set_new(out, "state", json_string("free"));
        json_object_set_new(out, "holder", json_null());
        json_object_set_new(out, "lock_seq", json_null());
    } else {
        int held = strcmp(sd_reply_str(r, 0), "held") == 0;
        int64_t since = sd_reply_num(r, 3), expires = sd_reply_num(r, 4), delay = sd_reply_num(r, 5), now = sd_reply_num(r, 6);
        json_object_set_new(out, "state", json_string(sd_reply_str(r, 0)));
        json_object_set_new(out, "holder", held ? json_string(sd_reply_str(r, 1)) : json_null());
        json_object_set_new(out, "lock_seq", json_integer(sd_reply_num(r, 2)));
        json_object_set_new(out, "since_ms", held ? json_integer(since) : json_null());
        json_object_set_new(out, "held_for_ms", held ? json_integer(now - since) : json_null());
        json_object_set_new(out, "expires_in_ms",
                            held && expires > 0 ? json_integer(expires - now) : json_null());
        json_object_set_new(out, "lock_delay_ms",
                            json_integer(!held && delay > now ? delay - now : 0));
        if (held && *sd_reply_str(r, 7))
            json_object_set_new(out, "stolen_from", json_string(sd_reply_str(r, 7)));
    }
    freeReplyObject(r);
    sd_resp_json(resp, 200, out);
}

/* GET /v1/locks without holder [?limit=N&cursor=C] -> {locks:[{key, holder, lock_seq,
 * since_ms, expires_in_ms}], cursor}: held locks found by a bounded walk (sd_lock_scan)
 * over the lock records, for dashboards and operators. cursor continues
 * the walk and is null when it is complete; a walk may return fewer than limit locks
 * (even none) with a cursor to go on, never more. Order is Redis's SCAN order, by name
 * within one SCAN step. */
/* The cursor query parameter of the lock lists into buf ("0" when absent): "<scan
 * cursor>" or "<scan cursor>-<last lock name>" (a page that ended inside one SCAN step),
 * the scan cursor led by "<node>n" on a Redis Cluster's walk over every lock.
 * Returns 0, or -1 with the 400 answer in resp. */
static int list_cursor(sd_req_t *req, sd_resp_t *resp, char *buf, size_t cap)
{
    const char *cur = sd_req_query(req, "cursor");
    if (!cur) {
        sd_strlcpy(buf, "0", cap);
        return 0;
    }
    const char *p = cur;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == 'n' && p > cur && p - cur <= 3) { /* "<node>n<scan>": a cluster's walk */
        const char *q = ++p;
        while (*p >= '0' && *p <= '9')
            p++;
        if (p == q)
            p = cur; /* refused below */
    }
    if (p == cur || p - cur > 24 || (*p && (*p != '-' || !sd_lock_name_valid(p + 1))) ||
        strlen(cur) >= cap) {
        sd_resp_error(resp, 400, "bad_cursor", "query parameter 'cursor' must be a "
                                               "cursor returned by this call");
        return -1;
    }
    sd_strlcpy(buf, cur, cap);
    return 0;
}

static void lock_list_all(sd_req_t *req, sd_resp_t *resp)
{
    int64_t limit;
    if (sd_req_query_int(req, resp, "limit", 1, LIST_MAX, 100, &limit))
        return;
    char cursor[SD_NAME_MAX + 32];
    if (list_cursor(req, resp, cursor, sizeof cursor))
        return;
    json_t *locks = json_array();
    int rc = sd_lock_scan(cursor, sizeof cursor, (size_t)limit, locks);
    if (rc != SD_STORE_OK) {
        json_decref(locks);
        sd_resp_store_error(resp, rc);
        return;
    }
    json_t *out = json_pack("{s:o}", "locks", locks);
    json_object_set_new(out, "cursor", cursor[0] ? json_string(cursor) : json_null());
    sd_resp_json(resp, 200, out);
}

/* GET /v1/locks?holder=H[&limit=N&cursor=C] -> {holder, locks:[{key, lock_seq, since_ms,
 * expires_in_ms}], cursor}: a page of the holder's locks (cursor null when complete);
 * without holder, every held lock (lock_list_all). */
void h_lock_list(sd_req_t *req, sd_resp_t *resp)
{
    const char *holder = sd_req_query(req, "holder");
    if (!holder) {
        lock_list_all(req, resp);
        return;
    }
    if (!sd_name_valid(holder, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_holder", "query parameter 'holder' must be a name");
        return;
    }
    int64_t limit;
    char curs[SD_NAME_MAX + 32];
    if (sd_req_query_int(req, resp, "limit", 1, LIST_MAX, LIST_MAX, &limit) ||
        list_cursor(req, resp, curs, sizeof curs))
        return;
    if (sd_store_is_cluster()) {
        json_t *locks = json_array();
        int rc = sd_lock_list_cluster(holder, (int)limit, curs, sizeof curs, locks);
        if (rc != SD_STORE_OK) {
            json_decref(locks);
            sd_resp_store_error(resp, rc);
            return;
        }
        json_t *out = json_pack("{s:s, s:o}", "holder", holder, "locks", locks);
        json_object_set_new(out, "cursor", strcmp(curs, "0") ? json_string(curs) : json_null());
        sd_resp_json(resp, 200, out);
        return;
    }
    redisReply *r;
    int rc = sd_lock_list(holder, (int)limit, curs, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 4 != 1) {
        sd_resp_bad_reply(resp, "lock_list", r);
        freeReplyObject(r);
        return;
    }
    int64_t now = sd_wall_ms();
    json_t *locks = json_array();
    for (size_t i = 1; i < r->elements; i += 4) {
        int64_t expires = sd_reply_num(r, i + 3);
        json_t *o = json_pack("{s:s, s:I, s:I}", "key", sd_reply_str(r, i), "lock_seq",
                              (json_int_t)sd_reply_num(r, i + 1), "since_ms", (json_int_t)sd_reply_num(r, i + 2));
        json_object_set_new(o, "expires_in_ms",
                            expires > 0 ? json_integer(expires > now ? expires - now : 0)
                                        : json_null());
        json_array_append_new(locks, o);
    }
    const char *next = sd_reply_str(r, 0);
    json_t *out = json_pack("{s:s, s:o}", "holder", holder, "locks", locks);
    json_object_set_new(out, "cursor", strcmp(next, "0") ? json_string(next) : json_null());
    freeReplyObject(r);
    sd_resp_json(resp, 200, out);
}
