/* The lock table (docs/locks.md): acquire one key or several all or nothing, release,
 * renew, inspect, list by holder, forced unlock. Every change is one Lua script in
 * locks/lua/lock_*.lua; this file validates input, turns script replies into HTTP
 * answers, and runs the bounded wait: a refused acquire with wait_ms is parked (its
 * worker thread goes on serving) and a waiter thread with its own Redis connection
 * blocks on the key's release notifications until it can answer.
 *
 * Redis keys (prefix configurable, no cluster hash tag: locks are global):
 *   <prefix>lock:<key>      hash   holder, seq (the lock_seq), since, expires, ttl,
 *                                  delay_until, released, stolen_from, steal_reason
 *   <prefix>lock:<key>#q    list   release notifications that wake one waiter (BLPOP)
 *   <prefix>lock:<holder>#h set    the keys a holder holds (for GET /v1/locks?holder=)
 * '#' is not allowed in names, so these can never collide. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "locks.h"
#include "sd.h"

SD_ROUTE(PUT, "/v1/locks/{key}", SD_R_GAME, 0, h_lock_put);
SD_ROUTE(POST, "/v1/locks/acquire", SD_R_GAME, 0, h_lock_acquire_many);
SD_ROUTE(POST, "/v1/locks/release", SD_R_GAME, 0, h_lock_release_many);
SD_ROUTE(POST, "/v1/locks/{key}/renew", SD_R_GAME, 0, h_lock_renew);
SD_ROUTE(GET, "/v1/locks/{key}", SD_R_GAME | SD_R_VIEWER, 0, h_lock_get);
SD_ROUTE(GET, "/v1/locks", SD_R_GAME | SD_R_VIEWER, 0, h_lock_list);
SD_ROUTE(DELETE, "/v1/locks/{key}", SD_R_GAME, 0, h_lock_delete);

#define LIST_MAX 1000
/* One BLPOP never blocks longer than this (below the store's 3 s command timeout). */
#define WAIT_SLICE_MS 2000

sd_locks_cfg_t sd_locks_cfg = {
    .lock_delay_ms = 0,
    .wait_replicas = 0,
    .wait_timeout_ms = 500,
    .max_wait_ms = SD_LOCKS_WAIT_CAP_MS,
    .max_waiters = 256,
    .retain_s = 7 * 24 * 3600,
};

static atomic_int waiters;

/* ---------- configuration and shared checks ---------- */

int sd_locks_cfg_parse(const json_t *section, sd_locks_cfg_t *cfg, char *err, size_t errcap)
{
    static const char *const known[] = {"lock_delay_ms", "wait_replicas", "wait_timeout_ms",
                                        "max_wait_ms", "max_waiters", "retain_s", NULL};
    if (!section)
        return 0;
    if (!json_is_object(section)) {
        snprintf(err, errcap, "section 'locks' must be an object");
        return -1;
    }
    if (sd_json_only_keys(section, known, err, errcap) ||
        sd_json_int(section, "lock_delay_ms", 0, 0, 600000, &cfg->lock_delay_ms, err, errcap) < 0 ||
        sd_json_int(section, "wait_replicas", 0, 0, 16, &cfg->wait_replicas, err, errcap) < 0 ||
        sd_json_int(section, "wait_timeout_ms", 0, 1, 2500, &cfg->wait_timeout_ms, err, errcap) < 0 ||
        sd_json_int(section, "max_wait_ms", 0, 0, SD_LOCKS_WAIT_CAP_MS, &cfg->max_wait_ms, err,
                    errcap) < 0 ||
        sd_json_int(section, "max_waiters", 0, 1, 4096, &cfg->max_waiters, err, errcap) < 0 ||
        sd_json_int(section, "retain_s", 0, 60, 365LL * 24 * 3600, &cfg->retain_s, err, errcap) < 0)
        return -1;
    return 0;
}

void sd_locks_init(void)
{
    char err[SD_ERRMSG_MAX];
    const json_t *section = sd_cfg.file ? json_object_get(sd_cfg.file, "locks") : NULL;
    if (sd_locks_cfg_parse(section, &sd_locks_cfg, err, sizeof err))
        sd_die(SD_EXIT_USAGE, "bad config", "section=locks err=%s", err);
    log_info("lock table configured",
             "lock_delay_ms=%lld wait_replicas=%lld max_wait_ms=%lld max_waiters=%lld retain_s=%lld",
             (long long)sd_locks_cfg.lock_delay_ms, (long long)sd_locks_cfg.wait_replicas,
             (long long)sd_locks_cfg.max_wait_ms, (long long)sd_locks_cfg.max_waiters,
             (long long)sd_locks_cfg.retain_s);
}

int sd_seq_parse(const char *s, int64_t *out)
{
    if (!s || !*s || strlen(s) > 16)
        return -1;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    if (s[0] == '0')
        return -1;
    return sd_parse_i64(s, 1, SD_SEQ_MAX, out) ? -1 : 0;
}

const char *sd_lock_key(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%slock:%s", sd_store_prefix(), name);
    return buf;
}

const char *sd_blob_key(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%sblob:%s", sd_store_prefix(), name);
    return buf;
}

static const char *holder_key(char *buf, size_t cap, const char *holder)
{
    snprintf(buf, cap, "%slock:%s#h", sd_store_prefix(), holder);
    return buf;
}

/* ---------- acquire ---------- */

/* Reads body.keys: 1..SD_LOCKS_MAX_KEYS distinct names into names/n. */
static int keys_parse(const json_t *body, const char **names, int *n, const char **code,
                      char *err, size_t errcap)
{
    const json_t *keys = json_object_get(body, "keys");
    *code = "bad_field";
    if (!json_is_array(keys) || json_array_size(keys) < 1 ||
        json_array_size(keys) > SD_LOCKS_MAX_KEYS) {
        snprintf(err, errcap, "field 'keys' must be an array of 1 to %d lock keys",
                 SD_LOCKS_MAX_KEYS);
        return -1;
    }
    *n = 0;
    size_t i;
    const json_t *k;
    json_array_foreach(keys, i, k) {
        const char *s = json_string_value(k);
        if (!s || !sd_name_valid(s, SD_NAME_MAX)) {
            *code = "bad_name";
            snprintf(err, errcap,
                     "keys[%zu] must be a lock key name (1-%d characters of A-Z a-z 0-9 "
                     "_ . : @ -)",
                     i, SD_NAME_MAX);
            return -1;
        }
        for (int j = 0; j < *n; j++)
            if (strcmp(names[j], s) == 0) {
                snprintf(err, errcap, "keys[%zu] repeats '%s'", i, s);
                return -1;
            }
        names[(*n)++] = s;
    }
    return 0;
}

int sd_lock_req_parse(const json_t *body, int many, sd_lock_req_t *a, const char **code,
                      char *err, size_t errcap)
{
    static const char *const one[] = {"holder", "ttl_ms", "wait_ms", "steal_if_holder_stopped",
                                      "steal_if_older_than_ms", NULL};
    static const char *const several[] = {"keys", "holder", "ttl_ms", "wait_ms",
                                          "steal_if_holder_stopped", "steal_if_older_than_ms",
                                          NULL};
    *code = "bad_field";
    a->steal_cluster = "";
    a->ttl_ms = a->wait_ms = a->steal_older_ms = 0;
    if (sd_json_only_keys(body, many ? several : one, err, errcap))
        return -1;
    if (many && keys_parse(body, a->names, &a->n, code, err, errcap))
        return -1;
    if (sd_json_name(body, "holder", 1, &a->holder, err, errcap) < 0 ||
        sd_json_int(body, "ttl_ms", 0, 1, SD_LOCKS_TTL_MAX_MS, &a->ttl_ms, err, errcap) < 0 ||
        sd_json_int(body, "wait_ms", 0, 0, sd_locks_cfg.max_wait_ms, &a->wait_ms, err, errcap) < 0 ||
        sd_json_name(body, "steal_if_holder_stopped", 0, &a->steal_cluster, err, errcap) < 0 ||
        sd_json_int(body, "steal_if_older_than_ms", 0, 1, SD_LOCKS_TTL_MAX_MS * 365,
                    &a->steal_older_ms, err, errcap) < 0)
        return -1;
    return 0;
}

int sd_lock_release_parse(const json_t *body, const char **holder, const char **names,
                          int64_t *seqs, int *n, const char **code, char *err, size_t errcap)
{
    static const char *const allowed[] = {"keys", "holder", "lock_seqs", NULL};
    *code = "bad_field";
    if (sd_json_only_keys(body, allowed, err, errcap) ||
        sd_json_name(body, "holder", 1, holder, err, errcap) < 0 ||
        keys_parse(body, names, n, code, err, errcap))
        return -1;
    const json_t *ls = json_object_get(body, "lock_seqs");
    if (!json_is_object(ls) || json_object_size(ls) != (size_t)*n) {
        snprintf(err, errcap,
                 "field 'lock_seqs' must be an object with the lock_seq of each key");
        return -1;
    }
    for (int i = 0; i < *n; i++) {
        const json_t *v = json_object_get(ls, names[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > SD_SEQ_MAX) {
            snprintf(err, errcap, "lock_seqs['%s'] must be a lock_seq (1-2^53)", names[i]);
            return -1;
        }
        seqs[i] = json_integer_value(v);
    }
    return 0;
}

/* Runs lock_acquire.lua once. Store errors come back as the SD_STORE_* code. */
static int acquire_once(const sd_lock_req_t *a, redisReply **out)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    for (int i = 0; i < a->n; i++)
        sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, a->names[i]));
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, a->holder));
    sd_argv_add(&av, a->holder);
    sd_argv_addf(&av, "%lld", (long long)a->ttl_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_add(&av, a->steal_cluster);
    sd_argv_addf(&av, "%lld", (long long)a->steal_older_ms);
    sd_argv_add(&av, sd_store_prefix());
    int rc = sd_store_script("lock_acquire", a->n + 1, &av, out);
    sd_argv_free(&av);
    return rc;
}

/* Blocks up to ms on the key's release-notification list (one BLPOP, no polling). */
static int wait_release(const char *name, int64_t ms)
{
    char key[SD_NAME_MAX + 96];
    sd_lock_key(key, sizeof key, name);
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "BLPOP");
    sd_argv_addf(&av, "%s#q", key);
    sd_argv_addf(&av, "%.3f", (double)(ms < 1 ? 1 : ms) / 1000.0);
    redisReply *r;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc == SD_STORE_OK)
        freeReplyObject(r);
    return rc;
}

/* How long to block before the next attempt, given a refusal: until the lease or the
 * lock-delay runs out, a release wakes us, the wait ends, or one slice passes. */
static int64_t wait_slice(const redisReply *r, int64_t left)
{
    int64_t ms = left < WAIT_SLICE_MS ? left : WAIT_SLICE_MS;
    int64_t hint = -1;
    if (strcmp(sd_reply_str(r, 0), "lock_delayed") == 0)
        hint = sd_reply_num(r, 2);
    else if (sd_reply_num(r, 4) > 0)
        hint = sd_reply_num(r, 4) - sd_reply_num(r, 5) + 1;
    if (hint >= 0 && hint < ms)
        ms = hint;
    return ms;
}

/* Durability knob: WAIT for the configured replicas after a grant. 0 when reached. */
static int grant_wait_replicas(sd_resp_t *resp)
{
    if (sd_locks_cfg.wait_replicas <= 0)
        return 0;
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "WAIT");
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.wait_replicas);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.wait_timeout_ms);
    redisReply *r;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return -1;
    }
    long long got = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    if (got < sd_locks_cfg.wait_replicas) {
        SD_COUNT("serverdir_lock_replication_timeouts_total",
                 "Grants answered 503 because too few replicas confirmed them", 1);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error_extra(resp, 503, "replication_timeout",
                            json_pack("{s:I, s:I}", "replicas", (json_int_t)got, "wanted",
                                      (json_int_t)sd_locks_cfg.wait_replicas),
                            "the grant reached %lld of %lld replicas within %lld ms; retry "
                            "(re-acquire is idempotent)",
                            got, (long long)sd_locks_cfg.wait_replicas,
                            (long long)sd_locks_cfg.wait_timeout_ms);
        return -1;
    }
    return 0;
}

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
    sd_resp_error_extra(resp, 409, "lock_held", extra,
                        "lock '%s' is held by '%s' since %lld (for %lld ms)", name,
                        sd_reply_str(r, 2), (long long)since, (long long)(now - since));
}

/* One granted key of an ok reply (status, now, then 6 fields per key) as JSON. */
static json_t *grant_json(const redisReply *r, int i, int64_t now_ms)
{
    size_t b = 2 + (size_t)i * 6;
    int64_t expires = sd_reply_num(r, b + 5);
    json_t *o = json_pack("{s:s, s:I, s:I, s:b}", "key", sd_reply_str(r, b), "lock_seq",
                          (json_int_t)sd_reply_num(r, b + 1), "since_ms", (json_int_t)sd_reply_num(r, b + 4),
                          "reacquired", strcmp(sd_reply_str(r, b + 2), "1") == 0);
    json_object_set_new(o, "expires_in_ms",
                        expires > 0 ? json_integer(expires - now_ms) : json_null());
    const char *stolen = sd_reply_str(r, b + 3);
    if (*stolen) {
        json_object_set_new(o, "stolen_from", json_string(stolen));
        log_info("lock stolen", "key=%s from=%s", sd_reply_str(r, b), stolen);
        SD_COUNT("serverdir_lock_steals_total", "Locks taken over from a stopped or old holder", 1);
    }
    return o;
}

/* Answers an acquire from its last script reply (stolen: freed here): the grant (single:
 * one object, many: {holder, locks}) after the optional WAIT, or the refusal. Runs on the
 * thread whose Redis connection made the grant, so WAIT covers it. */
static void acquire_finish(const sd_lock_req_t *a, int many, redisReply *r, int64_t waited,
                           sd_resp_t *resp)
{
    if (!sd_reply_has_status(r)) {
        sd_resp_bad_reply(resp, "lock_acquire", r);
    } else if (strcmp(sd_reply_str(r, 0), "ok") != 0) {
        acquire_refused(resp, r, waited);
    } else if (r->elements != 2 + (size_t)a->n * 6) {
        sd_resp_bad_reply(resp, "lock_acquire", r);
    } else if (grant_wait_replicas(resp) == 0) {
        SD_COUNT("serverdir_lock_grants_total", "Locks granted (keys)", a->n);
        /* Times are Redis time; expires_in_ms is relative to the grant itself. */
        int64_t now_ms = sd_reply_num(r, 1);
        json_t *out;
        if (!many) {
            out = grant_json(r, 0, now_ms);
            json_object_set_new(out, "holder", json_string(a->holder));
        } else {
            json_t *locks = json_array();
            for (int i = 0; i < a->n; i++)
                json_array_append_new(locks, grant_json(r, i, now_ms));
            out = json_pack("{s:s, s:o}", "holder", a->holder, "locks", locks);
        }
        sd_resp_json(resp, 200, out);
    }
    freeReplyObject(r);
}

/* A parked acquire: its own copies of the request's strings (the JSON body is gone). */
typedef struct {
    sd_lock_req_t a;
    int many;
    sd_req_t *req;
    sd_resp_t *resp;
    int64_t start_ms;
    char name[SD_NAME_MAX + 1]; /* the key the last refusal named */
    int64_t first_slice_ms;
    char holder[SD_NAME_MAX + 1], cluster[SD_NAME_MAX + 1];
    char names[SD_LOCKS_MAX_KEYS][SD_NAME_MAX + 1];
} waiter_t;

/* The waiter thread: blocks on the refused key's release-notification list (BLPOP on
 * this thread's own Redis connection, never polling), retries after each wake-up, the
 * end of a lease or lock-delay, or a slice, until granted, refused for another reason,
 * wait_ms has passed or serverdir stops; then answers and resumes the parked request. */
static void *waiter_main(void *arg)
{
    waiter_t *w = arg;
    redisReply *r = NULL;
    int64_t ms = w->first_slice_ms;
    int rc = SD_STORE_OK;
    for (;;) {
        rc = wait_release(w->name, ms);
        if (rc != SD_STORE_OK)
            break;
        rc = acquire_once(&w->a, &r);
        if (rc != SD_STORE_OK || !sd_reply_has_status(r))
            break;
        const char *st = sd_reply_str(r, 0);
        int64_t left = w->start_ms + w->a.wait_ms - sd_mono_ms();
        if ((strcmp(st, "lock_held") && strcmp(st, "lock_delayed")) || left <= 0 ||
            sd_http_stopping())
            break;
        ms = wait_slice(r, left);
        sd_strlcpy(w->name, sd_reply_str(r, 1), sizeof w->name);
        freeReplyObject(r);
        r = NULL;
    }
    if (rc != SD_STORE_OK) {
        if (r)
            freeReplyObject(r);
        sd_resp_store_error(w->resp, rc);
    } else {
        acquire_finish(&w->a, w->many, r, sd_mono_ms() - w->start_ms, w->resp);
    }
    sd_req_resume(w->req);
    sd_store_thread_close();
    free(w);
    atomic_fetch_sub(&waiters, 1);
    return NULL;
}

/* Parks the request and hands the wait to a new waiter thread. The caller's reply r (a
 * refusal) is freed here. Answers 429 when max_waiters are waiting already. */
static void acquire_park(const sd_lock_req_t *a, int many, redisReply *r, int64_t start_ms,
                         sd_req_t *req, sd_resp_t *resp)
{
    if (atomic_fetch_add(&waiters, 1) >= sd_locks_cfg.max_waiters) {
        atomic_fetch_sub(&waiters, 1);
        freeReplyObject(r);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error(resp, 429, "too_many_waiters",
                      "%lld acquires are waiting already; retry, or acquire without wait_ms",
                      (long long)sd_locks_cfg.max_waiters);
        return;
    }
    waiter_t *w = calloc(1, sizeof *w);
    if (!w) {
        atomic_fetch_sub(&waiters, 1);
        freeReplyObject(r);
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    w->a = *a;
    w->many = many;
    w->req = req;
    w->resp = resp;
    w->start_ms = start_ms;
    w->first_slice_ms = wait_slice(r, start_ms + a->wait_ms - sd_mono_ms());
    sd_strlcpy(w->name, sd_reply_str(r, 1), sizeof w->name);
    freeReplyObject(r);
    sd_strlcpy(w->holder, a->holder, sizeof w->holder);
    sd_strlcpy(w->cluster, a->steal_cluster, sizeof w->cluster);
    w->a.holder = w->holder;
    w->a.steal_cluster = w->cluster;
    for (int i = 0; i < a->n; i++) {
        sd_strlcpy(w->names[i], a->names[i], sizeof w->names[i]);
        w->a.names[i] = w->names[i];
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    sd_req_park(req);
    pthread_t th;
    if (pthread_create(&th, &attr, waiter_main, w) != 0) {
        free(w);
        atomic_fetch_sub(&waiters, 1);
        sd_resp_error(resp, 503, "too_many_waiters", "cannot start a waiter thread");
        sd_req_resume(req);
    }
    pthread_attr_destroy(&attr);
}

/* Acquires once on this worker thread; a refusal with wait_ms parks the request for a
 * waiter thread (the worker goes on serving), everything else is answered at once. */
static void acquire_answer(const sd_lock_req_t *a, int many, sd_req_t *req, sd_resp_t *resp)
{
    int64_t start = sd_mono_ms();
    redisReply *r = NULL;
    int rc = acquire_once(a, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (a->wait_ms > 0 && sd_reply_has_status(r) &&
        (!strcmp(sd_reply_str(r, 0), "lock_held") || !strcmp(sd_reply_str(r, 0), "lock_delayed")) &&
        !sd_http_stopping()) {
        acquire_park(a, many, r, start, req, resp);
        return;
    }
    acquire_finish(a, many, r, 0, resp);
}

/* PUT /v1/locks/{key} {holder, ttl_ms?, wait_ms?, steal_if_holder_stopped?,
 * steal_if_older_than_ms?} -> 200 {key, holder, lock_seq, since_ms, expires_in_ms,
 * reacquired, stolen_from?}; 409 lock_held / lock_delayed. */
void h_lock_put(sd_req_t *req, sd_resp_t *resp)
{
    sd_lock_req_t a = {0};
    const char *name, *code;
    char err[SD_ERRMSG_MAX];
    if (sd_req_name(req, resp, 0, "lock key", &name))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    if (sd_lock_req_parse(body, 0, &a, &code, err, sizeof err)) {
        sd_resp_error(resp, 400, code, "%s", err);
    } else {
        a.names[0] = name;
        a.n = 1;
        acquire_answer(&a, 0, req, resp);
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
        acquire_answer(&a, 1, req, resp);
    json_decref(body);
}

/* ---------- release ---------- */

/* Runs lock_release.lua for names[i] with seqs[i] and answers. */
static void release_answer(const char *holder, const char **names, const int64_t *seqs, int n,
                           int many, sd_resp_t *resp)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    for (int i = 0; i < n; i++)
        sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, names[i]));
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, holder));
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    for (int i = 0; i < n; i++)
        sd_argv_addf(&av, "%lld", (long long)seqs[i]);
    redisReply *r;
    int rc = sd_store_script("lock_release", n + 1, &av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return;
    }
    const char *st = sd_reply_str(r, 0);
    if (!sd_reply_has_status(r)) {
        sd_resp_bad_reply(resp, "lock_release", r);
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
    } else if (strcmp(st, "ok") == 0 && r->elements == 1 + (size_t)n * 2) {
        SD_COUNT("serverdir_lock_releases_total", "Locks released by their holder (keys)", n);
        json_t *out;
        if (!many) {
            out = json_pack("{s:s, s:s, s:I, s:b}", "key", sd_reply_str(r, 1), "holder", holder,
                            "lock_seq", (json_int_t)sd_reply_num(r, 2), "released", 1);
        } else {
            json_t *locks = json_array();
            for (int i = 0; i < n; i++)
                json_array_append_new(locks, json_pack("{s:s, s:I}", "key", sd_reply_str(r, 1 + i * 2),
                                                       "lock_seq", (json_int_t)sd_reply_num(r, 2 + i * 2)));
            out = json_pack("{s:s, s:o, s:b}", "holder", holder, "locks", locks, "released", 1);
        }
        sd_resp_json(resp, 200, out);
    } else {
        sd_resp_bad_reply(resp, "lock_release", r);
    }
    freeReplyObject(r);
}

/* POST /v1/locks/release {holder, keys:[...], lock_seqs:{key: n}} -> 200; all or nothing. */
void h_lock_release_many(sd_req_t *req, sd_resp_t *resp)
{
    const char *names[SD_LOCKS_MAX_KEYS];
    int64_t seqs[SD_LOCKS_MAX_KEYS];
    int n = 0;
    const char *holder, *code;
    char err[SD_ERRMSG_MAX];
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    if (sd_lock_release_parse(body, &holder, names, seqs, &n, &code, err, sizeof err))
        sd_resp_error(resp, 400, code, "%s", err);
    else
        release_answer(holder, names, seqs, n, 1, resp);
    json_decref(body);
}

/* DELETE /v1/locks/{key}?holder=H&lock_seq=N: release by the holder.
 * DELETE /v1/locks/{key}?force=true: forced unlock, ops only; starts the lock-delay. */
void h_lock_delete(sd_req_t *req, sd_resp_t *resp)
{
    const char *name;
    if (sd_req_name(req, resp, 0, "lock key", &name))
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
        char key[SD_NAME_MAX + 96];
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, name));
        sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
        sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
        sd_argv_addf(&av, "%slock:", sd_store_prefix());
        redisReply *r;
        int rc = sd_store_script("lock_force", 1, &av, &r);
        sd_argv_free(&av);
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
    int64_t seq;
    if (sd_seq_parse(seq_s, &seq)) {
        sd_resp_error(resp, 400, "bad_lock_seq",
                      "query parameter 'lock_seq' must be a decimal number 1-2^53");
        return;
    }
    release_answer(holder, &name, &seq, 1, 0, resp);
}

/* ---------- renew ---------- */

/* POST /v1/locks/{key}/renew {holder, lock_seq, ttl_ms?} -> 200 {key, holder, lock_seq,
 * expires_in_ms}. Without ttl_ms the lease granted last is renewed for the same length. */
void h_lock_renew(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const allowed[] = {"holder", "lock_seq", "ttl_ms", NULL};
    const char *name, *holder;
    int64_t seq = 0, ttl = 0;
    if (sd_req_name(req, resp, 0, "lock key", &name))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX];
    if (sd_json_only_keys(body, allowed, err, sizeof err) ||
        sd_json_name(body, "holder", 1, &holder, err, sizeof err) < 0 ||
        sd_json_int(body, "lock_seq", 1, 1, SD_SEQ_MAX, &seq, err, sizeof err) < 0 ||
        sd_json_int(body, "ttl_ms", 0, 1, SD_LOCKS_TTL_MAX_MS, &ttl, err, sizeof err) < 0) {
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        goto out;
    }
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, name));
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%lld", (long long)seq);
    sd_argv_addf(&av, "%lld", (long long)ttl);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    redisReply *r;
    int rc = sd_store_script("lock_renew", 1, &av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        goto out;
    }
    const char *st = sd_reply_str(r, 0);
    if (sd_reply_has_status(r) && strcmp(st, "not_holder") == 0) {
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
    } else if (sd_reply_has_status(r) && strcmp(st, "ok") == 0 && r->elements == 4) {
        int64_t expires = sd_reply_num(r, 2), now = sd_reply_num(r, 3);
        json_t *out = json_pack("{s:s, s:s, s:I}", "key", name, "holder", holder, "lock_seq",
                                (json_int_t)sd_reply_num(r, 1));
        json_object_set_new(out, "expires_in_ms",
                            expires > 0 ? json_integer(expires - now)
                                        : json_null());
        sd_resp_json(resp, 200, out);
    } else {
        sd_resp_bad_reply(resp, "lock_renew", r);
    }
    freeReplyObject(r);
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
    if (sd_req_name(req, resp, 0, "lock key", &name))
        return;
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, name));
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    redisReply *r;
    int rc = sd_store_script("lock_get", 1, &av, &r);
    sd_argv_free(&av);
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

/* The held locks of one SCAN step's keys (lock records only: index keys hold a '#')
 * appended to locks, at most `room`. Returns 0 or a store error. */
static int scan_collect(const redisReply *keys, size_t plen, int64_t now, json_t *locks,
                        size_t room)
{
    for (size_t i = 0; i < keys->elements && json_array_size(locks) < room; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= plen || memchr(k->str, '#', k->len))
            continue;
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "HMGET");
        sd_argv_addn(&av, k->str, k->len);
        sd_argv_add(&av, "holder");
        sd_argv_add(&av, "seq");
        sd_argv_add(&av, "since");
        sd_argv_add(&av, "expires");
        redisReply *h;
        int rc = sd_store_command(&av, &h);
        sd_argv_free(&av);
        if (rc != SD_STORE_OK)
            return rc;
        int64_t expires = sd_reply_num(h, 3);
        if (h->type == REDIS_REPLY_ARRAY && *sd_reply_str(h, 0) && (expires <= 0 || expires > now)) {
            json_t *o = json_pack("{s:s%, s:s, s:I, s:I}", "key", k->str + plen, k->len - plen,
                                  "holder", sd_reply_str(h, 0), "lock_seq", (json_int_t)sd_reply_num(h, 1),
                                  "since_ms", (json_int_t)sd_reply_num(h, 2));
            json_object_set_new(o, "expires_in_ms",
                                expires > 0 ? json_integer(expires - now) : json_null());
            json_array_append_new(locks, o);
        }
        freeReplyObject(h);
    }
    return SD_STORE_OK;
}

/* GET /v1/locks without holder [?limit=N&cursor=C] -> {locks:[{key, holder, lock_seq,
 * since_ms, expires_in_ms}], cursor}: held locks found by a bounded walk (SCAN_ROUNDS
 * SCAN steps) over the lock records, for dashboards and operators. cursor continues
 * the walk and is null when it is complete; a walk may return fewer than limit locks
 * (even none) with a cursor to go on. Order is Redis's SCAN order. */
#define SCAN_ROUNDS 8
#define SCAN_COUNT 500
static void lock_list_all(sd_req_t *req, sd_resp_t *resp)
{
    int64_t limit;
    if (sd_req_query_int(req, resp, "limit", 1, LIST_MAX, 100, &limit))
        return;
    const char *cur = sd_req_query(req, "cursor");
    int64_t cursor = 0;
    if (cur && sd_parse_i64(cur, 0, INT64_MAX, &cursor)) {
        sd_resp_error(resp, 400, "bad_cursor", "query parameter 'cursor' must be a "
                                               "cursor returned by this call");
        return;
    }
    char prefix[128];
    sd_lock_key(prefix, sizeof prefix, "");
    size_t plen = strlen(prefix);
    int64_t now = sd_wall_ms();
    json_t *locks = json_array();
    int rc = SD_STORE_OK;
    for (int round = 0; round < SCAN_ROUNDS && json_array_size(locks) < (size_t)limit; round++) {
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "SCAN");
        sd_argv_addf(&av, "%lld", (long long)cursor);
        sd_argv_add(&av, "MATCH");
        sd_argv_addf(&av, "%s*", prefix);
        sd_argv_add(&av, "COUNT");
        sd_argv_addf(&av, "%d", SCAN_COUNT);
        sd_argv_add(&av, "TYPE");
        sd_argv_add(&av, "hash");
        redisReply *r;
        rc = sd_store_command(&av, &r);
        sd_argv_free(&av);
        if (rc != SD_STORE_OK)
            break;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            rc = SD_STORE_ERROR;
            break;
        }
        cursor = strtoll(sd_reply_str(r, 0), NULL, 10);
        rc = scan_collect(r->element[1], plen, now, locks, (size_t)limit);
        freeReplyObject(r);
        if (rc != SD_STORE_OK || cursor == 0)
            break;
    }
    if (rc != SD_STORE_OK) {
        json_decref(locks);
        sd_resp_store_error(resp, rc);
        return;
    }
    json_t *out = json_pack("{s:o}", "locks", locks);
    json_object_set_new(out, "cursor", cursor ? json_sprintf("%lld", (long long)cursor) : json_null());
    sd_resp_json(resp, 200, out);
}

/* GET /v1/locks?holder=H -> {holder, locks:[{key, lock_seq, since_ms, expires_in_ms}]};
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
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, holder));
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%d", LIST_MAX);
    redisReply *r;
    int rc = sd_store_script("lock_list", 1, &av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 4) {
        sd_resp_bad_reply(resp, "lock_list", r);
        freeReplyObject(r);
        return;
    }
    int64_t now = sd_wall_ms();
    json_t *locks = json_array();
    for (size_t i = 0; i < r->elements; i += 4) {
        int64_t expires = sd_reply_num(r, i + 3);
        json_t *o = json_pack("{s:s, s:I, s:I}", "key", sd_reply_str(r, i), "lock_seq",
                              (json_int_t)sd_reply_num(r, i + 1), "since_ms", (json_int_t)sd_reply_num(r, i + 2));
        json_object_set_new(o, "expires_in_ms",
                            expires > 0 ? json_integer(expires > now ? expires - now : 0)
                                        : json_null());
        json_array_append_new(locks, o);
    }
    freeReplyObject(r);
    sd_resp_json(resp, 200, json_pack("{s:s, s:o}", "holder", holder, "locks", locks));
}
