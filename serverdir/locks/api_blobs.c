/* The fenced blob store (docs/locks.md): sequence-numbered player data saved only by the
 * current lock holder. Each operation is one Lua script (lua/blob_get.lua,
 * lua/blob_save.lua) that checks the lock record and the blob record together.
 *
 * Redis key: <prefix>blob:<key>  hash  data, seq (Blob-Seq), lock_seq (of the save),
 *                                      saved_ms, read_lock_seq, read_ms
 * The blob of key K is fenced by the lock of the same key K: a save presents the grant
 * (Lock-Seq and the secret Lock-Token) and the script checks both against the lock
 * record.
 *
 * Quota (docs/operations.md, "Quotas"): the bytes stored per scope (the saver's cluster
 * binding, else its principal) are counted in <prefix>quota:blob:<scope> (a string), and
 * a save that would take its scope past quotas.blob_bytes is refused (507). On standalone
 * Redis and Sentinel the save script reads and moves the counter; on a Redis Cluster the
 * counter lives in another slot, so serverdir reads it before the save and moves it after
 * (concurrent saves of one scope may pass the limit by what they add together, and a
 * copy that dies between the two leaves the counter short by that save). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cred.h"
#include "locks.h"
#include "quota.h"
#include "sd.h"

SD_ROUTE(GET, "/v1/blobs/{key}", SD_R_GAME | SD_R_VIEWER, SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_blob_get);
SD_ROUTE(PUT, "/v1/blobs/{key}", SD_R_GAME, SD_RAW_BODY | SD_CRED_LIVE_IN_SCRIPT | SD_GROUPED, h_blob_put);
SD_ROUTE(DELETE, "/v1/blobs/{key}", 0, 0, h_blob_delete);

/* Reads an optional sequence header. Returns 1 when absent, 0 when valid, -1 after
 * answering 400 `bad_<what>`. */
static int seq_header(const sd_req_t *req, sd_resp_t *resp, const char *header,
                      const char *code, int64_t *out)
{
    const char *v = sd_req_header(req, header);
    if (!v)
        return 1;
    if (sd_seq_parse(v, out)) {
        sd_resp_error(resp, 400, code, "header %s must be a decimal number 1-2^53",
                      header);
        return -1;
    }
    return 0;
}

/* Starts av with the KEYS of a blob script on name: its blob record, then its lock
 * record (bkey, lkey: the caller's buffers for them). */
static void blob_keys(sd_argv_t *av, const char *name, char *bkey, char *lkey, size_t cap)
{
    sd_argv_init(av);
    sd_argv_add(av, sd_blob_key(bkey, cap, name));
    sd_argv_add(av, sd_lock_key(lkey, cap, name));
}

/* "<prefix>quota:blob:" and the scope's counter key, into buf. */
static const char *quota_ns(char *buf, size_t cap)
{
    snprintf(buf, cap, "%squota:blob:", sd_store_prefix());
    return buf;
}

static const char *quota_key(char *buf, size_t cap, const char *scope)
{
    char ns[96];
    snprintf(buf, cap, "%s%s", quota_ns(ns, sizeof ns), scope);
    return buf;
}

/* One INCRBY (by delta) of scope's counter, outside the scripts (a Redis Cluster). */
static void quota_move(const char *scope, long long delta)
{
    char key[SD_NAME_MAX + 160];
    if (!*scope || delta == 0)
        return;
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "INCRBY");
    sd_argv_add(&av, quota_key(key, sizeof key, scope));
    sd_argv_addf(&av, "%lld", delta);
    redisReply *r = NULL;
    if (sd_store_command(&av, &r) != SD_STORE_OK || r->type != REDIS_REPLY_INTEGER)
        log_warn("blob quota counter not moved", "scope=%s delta=%lld", scope, delta);
    if (r)
        freeReplyObject(r);
    sd_argv_free(&av);
}

/* The scope's counted bytes as text into buf (a Redis Cluster: read before the save).
 * SD_STORE_OK or a SD_STORE_* error. */
static int quota_read(const char *scope, char *buf, size_t cap)
{
    char key[SD_NAME_MAX + 160];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "GET");
    sd_argv_add(&av, quota_key(key, sizeof key, scope));
    redisReply *r = NULL;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK)
        return rc;
    snprintf(buf, cap, "%s", r->type == REDIS_REPLY_STRING ? r->str : "0");
    freeReplyObject(r);
    return SD_STORE_OK;
}

/* Runs blob script `script` on av (freed) and returns its reply, an array whose first
 * element is the status word, for the caller to free; NULL after answering resp (Redis
 * unreachable or failing, or a reply of another shape). */
static redisReply *blob_run(sd_resp_t *resp, const char *script, int nkeys, sd_argv_t *av)
{
    redisReply *r;
    int rc = sd_store_run(script, nkeys, av, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return NULL;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        sd_resp_bad_reply(resp, script, r);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* A read in the group commit (locks.h): its strings are the request's (path, headers),
 * which outlive the job. */
typedef struct {
    sd_lock_call_t c; /* first */
    sd_resp_t *resp;
    const char *name;
    char bkey[SD_NAME_MAX + 96], lkey[SD_NAME_MAX + 96]; /* KEYS (av points at them) */
} get_job_t;

/* Answers a read from its blob_get.lua reply r (freed here). */
static void get_reply(sd_resp_t *resp, const char *name, redisReply *r)
{
    const char *st = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 ? sd_reply_str(r, 0) : "";
    if (!*st) {
        sd_resp_bad_reply(resp, "blob_get", r);
    } else if (sd_cred_revoked_reply(r, resp)) {
    } else if (strcmp(st, "fenced") == 0) {
        sd_lock_fenced(resp, "read", name);
    } else if (strcmp(st, "no_blob") == 0) {
        sd_resp_error_extra(resp, 404, "no_blob", json_pack("{s:s}", "key", name),
                            "no blob is stored under '%s'", name);
        sd_resp_header(resp, "Lock-Seq", sd_reply_str(r, 1));
    } else if (strcmp(st, "ok") == 0 && r->elements == 4 &&
               r->element[1]->type == REDIS_REPLY_STRING) {
        sd_resp_bytes(resp, 200, "application/octet-stream", r->element[1]->str,
                      r->element[1]->len);
        sd_resp_header(resp, "Blob-Seq", sd_reply_str(r, 2));
        sd_resp_header(resp, "Lock-Seq", sd_reply_str(r, 3));
    } else {
        sd_resp_bad_reply(resp, "blob_get", r);
    }
    freeReplyObject(r);
}

static void get_call(sd_group_job_t **jobs, int n) { sd_lock_calls_run("blob_get", jobs, n); }

static void get_job_finish(sd_group_job_t *g, int parked)
{
    get_job_t *j = (get_job_t *)g;
    if (j->c.rc != SD_STORE_OK)
        sd_resp_store_error(j->resp, j->c.rc);
    else
        get_reply(j->resp, j->name, j->c.r);
    if (parked)
        sd_req_resume(j->c.g.req);
    free(j);
}

static sd_group_t get_group =
    SD_LOCK_GROUP("blob_get", NULL, get_call, get_job_finish);

/* GET /v1/blobs/{key} [Lock-Seq: N, Lock-Token: T] -> 200 raw bytes, headers Blob-Seq and
 * Lock-Seq (the key's current lock_seq, 0 when free). With Lock-Seq (and then Lock-Token)
 * the reader proves it holds the lock (else 409 fenced) and that lock_seq is stamped on
 * the blob. 404 no_blob. Runs blob_get.lua in a call of its own or one it shares (the
 * group commit). */
void h_blob_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *name, *token = "";
    int64_t lock_seq = 0;
    if (sd_req_lock_name(req, resp, "blob key", &name))
        return;
    int has = seq_header(req, resp, "Lock-Seq", "bad_lock_seq", &lock_seq);
    if (has < 0 || (has == 0 && sd_lock_token_header(req, resp, &token)))
        return;
    get_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    j->resp = resp;
    j->name = name;
    sd_argv_t *av = &j->c.av;
    blob_keys(av, name, j->bkey, j->lkey, sizeof j->bkey);
    if (has == 0)
        sd_argv_addf(av, "%lld", (long long)lock_seq);
    else
        sd_argv_add(av, "");
    sd_argv_add(av, token);
    sd_cred_live_args(&req->auth, av);
    j->c.nkeys = 2;
    j->c.g.req = req;
    sd_lock_call_ready(&j->c, 1);
    sd_group_submit(&get_group, &j->c.g);
}

/* A save in the group commit (locks.h): its strings are the request's (path, headers,
 * body), which outlives the job. */
typedef struct {
    sd_lock_call_t c; /* first */
    sd_req_t *req;
    sd_resp_t *resp;
    const char *name;
    int64_t lock_seq, blob_seq;
    int cluster;
    char scope[SD_NAME_MAX + 48];
    /* KEYS and ARGV the call reads (av points at them): the blob, lock and quota keys,
     * the process hash prefix of the caller's cluster, the scope's bytes */
    char bkey[SD_NAME_MAX + 96], lkey[SD_NAME_MAX + 96], qkey[SD_NAME_MAX + 160];
    char pkey[SD_NAME_MAX + 96], used[32];
} save_job_t;

/* Answers a save from its blob_save.lua reply r (freed here). */
static void save_reply(const save_job_t *j, redisReply *r)
{
    sd_req_t *req = j->req;
    sd_resp_t *resp = j->resp;
    const char *name = j->name, *scope = j->scope;
    long long blob_seq = (long long)j->blob_seq;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        sd_resp_bad_reply(resp, "blob_save", r);
        freeReplyObject(r);
        return;
    }
    const char *st = sd_reply_str(r, 0);
    if (strcmp(st, "ok") == 0 && j->cluster && r->elements == 5) {
        quota_move(scope, sd_reply_num(r, 2));
        quota_move(sd_reply_str(r, 3), -sd_reply_num(r, 4));
    }
    if (sd_cred_revoked_reply(r, resp)) {
    } else if (sd_lock_holder_stopped_reply(r, sd_reply_str(r, 3), resp)) {
    } else if (strcmp(st, "quota_exceeded") == 0 && r->elements == 2) {
        sd_quota_refuse(resp, SD_QUOTA_BLOB_BYTES, sd_reply_num(r, 1), scope);
    } else if (strcmp(st, "fenced") == 0) {
        sd_lock_fenced(resp, "save", name);
    } else if (strcmp(st, "not_yours") == 0) {
        if (req->auth.cred)
            sd_resp_error_extra(resp, 403, "forbidden", json_pack("{s:s}", "key", name),
                                "this credential names instance '%s'; lock '%s' is held by "
                                "another",
                                req->auth.instance, name);
        else
            sd_resp_error_extra(resp, 403, "forbidden", json_pack("{s:s}", "key", name),
                                "this token is bound to holders starting with '%s'; lock '%s' "
                                "is held by another",
                                sd_req_holder_prefix(req), name);
    } else if (strcmp(st, "seq_jump") == 0 && r->elements == 2) {
        SD_COUNT("serverdir_blob_stale_total", "Blob saves refused for a stale Blob-Seq", 1);
        sd_resp_error_extra(resp, 400, "blob_seq_jump",
                            json_pack("{s:s, s:I, s:I}", "key", name, "blob_seq",
                                      (json_int_t)strtoll(sd_reply_str(r, 1), NULL, 10),
                                      "max_step", (json_int_t)SD_BLOB_SEQ_STEP_MAX),
                            "Blob-Seq %lld exceeds the stored %s by more than %lld (2^32)",
                            blob_seq, sd_reply_str(r, 1), (long long)SD_BLOB_SEQ_STEP_MAX);
    } else if (strcmp(st, "stale_seq") == 0 && r->elements == 2) {
        SD_COUNT("serverdir_blob_stale_total", "Blob saves refused for a stale Blob-Seq", 1);
        sd_resp_error_extra(resp, 409, "stale_seq",
                            json_pack("{s:s, s:I}", "key", name, "blob_seq",
                                      (json_int_t)strtoll(sd_reply_str(r, 1), NULL, 10)),
                            "Blob-Seq %lld is not greater than the stored %s", blob_seq,
                            sd_reply_str(r, 1));
    } else if (strcmp(st, "ok") == 0 && sd_locks_wait_acked(resp) == 0) {
        SD_COUNT("serverdir_blob_saves_total", "Blob saves accepted", 1);
        sd_jw_t w; /* the writer: a save is on every player's join (common/sdjson.h) */
        sd_resp_jw_begin(resp, &w);
        sd_jw_obj(&w, NULL);
        sd_jw_str(&w, "key", name);
        sd_jw_int(&w, "blob_seq", blob_seq);
        sd_jw_int(&w, "lock_seq", j->lock_seq);
        sd_jw_int(&w, "bytes", (int64_t)req->body.len);
        sd_jw_end(&w);
        sd_resp_jw_end(resp, 200, &w);
    } else if (strcmp(st, "ok") != 0) {
        sd_resp_bad_reply(resp, "blob_save", r);
    } /* else the WAIT's 503 is in resp */
    freeReplyObject(r);
}

static void save_call(sd_group_job_t **jobs, int n) { sd_lock_calls_run("blob_save", jobs, n); }

static void save_job_finish(sd_group_job_t *g, int parked)
{
    save_job_t *j = (save_job_t *)g;
    if (j->c.rc != SD_STORE_OK)
        sd_resp_store_error(j->resp, j->c.rc);
    else
        save_reply(j, j->c.r);
    if (parked)
        sd_req_resume(j->c.g.req);
    free(j);
}

/* Bytes of blob data per weight unit of a save in the group commit: a call carries at
 * most SD_LOCK_GROUP_KEYS units (256 KB of data), a larger blob has a call of its own. */
#define SAVE_WEIGHT_BYTES 4096

static sd_group_t save_group =
    SD_LOCK_GROUP("blob_save", NULL, save_call, save_job_finish);

/* PUT /v1/blobs/{key} with Lock-Seq, Lock-Token and Blob-Seq headers, raw body -> 200 {key,
 * blob_seq, lock_seq, bytes}. Saved only if Lock-Seq and Lock-Token are the key's current
 * grant (else 409 fenced) and Blob-Seq is greater than the stored one (else 409
 * stale_seq) by at most 2^32 (else 400 blob_seq_jump) and the saver's scope stays within
 * its blob_bytes quota (else 507 quota_exceeded); nothing changes on a refusal. One
 * script call of its own or one shared with other saves (the group commit). */
void h_blob_put(sd_req_t *req, sd_resp_t *resp)
{
    const char *name, *token;
    int64_t lock_seq, blob_seq;
    if (sd_req_lock_name(req, resp, "blob key", &name))
        return;
    if (req->body_too_big) {
        sd_resp_error(resp, 413, "too_large", "the blob is larger than the %zu byte limit",
                      sd_cfg.blob_max);
        return;
    }
    int rc = seq_header(req, resp, "Lock-Seq", "bad_lock_seq", &lock_seq);
    if (rc < 0)
        return;
    if (rc == 1) {
        sd_resp_error(resp, 400, "missing_lock_seq",
                      "header Lock-Seq (the lock_seq of your lock on '%s') is required", name);
        return;
    }
    if (sd_lock_token_header(req, resp, &token))
        return;
    rc = seq_header(req, resp, "Blob-Seq", "bad_blob_seq", &blob_seq);
    if (rc < 0)
        return;
    if (rc == 1) {
        sd_resp_error(resp, 400, "missing_blob_seq",
                      "header Blob-Seq (greater than the stored one) is required");
        return;
    }
    save_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    j->req = req;
    j->resp = resp;
    j->name = name;
    j->lock_seq = lock_seq;
    j->blob_seq = blob_seq;
    j->cluster = sd_store_is_cluster();
    sd_quota_scope(req, j->scope, sizeof j->scope);
    if (j->cluster && (rc = quota_read(j->scope, j->used, sizeof j->used)) != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        free(j);
        return;
    }
    sd_argv_t *av = &j->c.av;
    blob_keys(av, name, j->bkey, j->lkey, sizeof j->bkey);
    if (!j->cluster)
        sd_argv_add(av, quota_key(j->qkey, sizeof j->qkey, j->scope));
    j->c.nkeys = av->argc;
    sd_argv_addf(av, "%lld", (long long)lock_seq);
    sd_argv_add(av, token);
    sd_argv_addf(av, "%lld", (long long)blob_seq);
    sd_argv_addn(av, req->body.data ? req->body.data : "", req->body.len);
    sd_argv_add(av, sd_req_holder_prefix(req));
    sd_argv_add(av, req->auth.cred ? req->auth.instance : "");
    sd_cred_live_args(&req->auth, av);
    sd_argv_add(av, j->scope);
    sd_argv_addf(av, "%lld", (long long)sd_quota_limit[SD_QUOTA_BLOB_BYTES]);
    sd_argv_add(av, j->used);
    if (!j->cluster && req->auth.cluster[0]) /* a stopped holder saves nothing (locks.md) */
        sd_argv_add(av, sd_key(j->pkey, sizeof j->pkey, req->auth.cluster, "proc:"));
    else
        sd_argv_add(av, "");
    j->c.g.req = req;
    sd_lock_call_ready(&j->c, 1 + (long)(req->body.len / SAVE_WEIGHT_BYTES));
    sd_group_submit(&save_group, &j->c.g);
}

/* DELETE /v1/blobs/{key} (ops only) -> 200 {key, blob_seq, bytes, deleted}: repairs a blob
 * (say, one whose Blob-Seq a buggy client drove up): the data and its Blob-Seq go, the next
 * save may start again from 1. The lock_seq floors stay. 404 no_blob. */
void h_blob_delete(sd_req_t *req, sd_resp_t *resp)
{
    const char *name;
    if (sd_req_lock_name(req, resp, "blob key", &name))
        return;
    char bkey[SD_NAME_MAX + 96], ns[96];
    int cluster = sd_store_is_cluster();
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, sd_blob_key(bkey, sizeof bkey, name));
    sd_argv_add(&av, cluster ? "" : quota_ns(ns, sizeof ns));
    redisReply *r = blob_run(resp, "blob_delete", 1, &av);
    if (!r)
        return;
    const char *st = sd_reply_str(r, 0);
    if (strcmp(st, "no_blob") == 0) {
        sd_resp_error_extra(resp, 404, "no_blob", json_pack("{s:s}", "key", name),
                            "no blob is stored under '%s'", name);
    } else if (strcmp(st, "ok") == 0 && r->elements == 4) {
        if (cluster)
            quota_move(sd_reply_str(r, 3), -sd_reply_num(r, 2));
        log_warn("blob deleted", "key=%s blob_seq=%s bytes=%s peer=%s", name, sd_reply_str(r, 1),
                 sd_reply_str(r, 2), req->peer_ip);
        SD_COUNT("serverdir_blob_deletes_total", "Blobs deleted by ops", 1);
        sd_resp_json(resp, 200, json_pack("{s:s, s:I, s:I, s:b}", "key", name, "blob_seq",
                                          (json_int_t)sd_reply_num(r, 1), "bytes",
                                          (json_int_t)sd_reply_num(r, 2), "deleted", 1));
    } else {
        sd_resp_bad_reply(resp, "blob_delete", r);
    }
    freeReplyObject(r);
}
