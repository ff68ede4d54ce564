/* Allocations (docs/allocation.md): a ready instance handed to a match or a realm in one
 * script (alloc_create.lua), read, listed and ended; the open ones reach the game through
 * its machine's assignment document. A request with wait_ms that finds nothing is parked
 * (http/park.h) and tried again when its pool changes ("waiting for an instance"), until
 * it gets one or the wait ends. The sweep of confirm deadlines runs with the lost-machine
 * sweep (directory.c calls sd_alloc_sweep). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "directory.h"
#include "group.h"
#include "park.h"
#include "quota.h"
#include "sdvalid.h"

SD_ROUTE(POST, "/v1/clusters/{c}/allocations", SD_R_OPS | SD_R_GAME, SD_GROUPED, h_alloc_create);
SD_ROUTE(GET, "/v1/clusters/{c}/allocations", SD_R_READERS, 0, h_alloc_list);
SD_ROUTE(GET, "/v1/clusters/{c}/allocations/{id}", SD_R_READERS, 0, h_alloc_get);
SD_ROUTE(DELETE, "/v1/clusters/{c}/allocations/{id}", SD_R_OPS | SD_R_GAME, 0, h_alloc_delete);
SD_ROUTE(GET, "/v1/clusters/{c}/pool-demand", SD_R_READERS, 0, h_pool_demand);

#define CONFIRM_DEFAULT_MS 10000
#define KEY_TTL_MS (24LL * 3600 * 1000)
#define DEMAND_RETRY_MS 20
#define DEMAND_WAITERS_MAX 10000
#define LIST_LIMIT_DEFAULT 100
#define LIST_LIMIT_MAX 1000
#define SWEEP_BATCH 200

/* A validated allocation request: the script's arguments. */
typedef struct {
    char cluster[SD_NAME_MAX + 1];
    char service[SD_NAME_MAX + 1];
    char mode[8], strategy[16], key[SD_NAME_MAX + 1];
    int64_t players, wait_ms, start_ms;
    char *labels, *meta, *payload, *canon; /* malloc'd texts ("" none) */
    char owner[sizeof ((sd_auth_t *)0)->principal];  /* the caller's principal */
    char viewer[sizeof ((sd_auth_t *)0)->principal]; /* whose replays it may see ("" all) */
} alloc_req_t;

/* Allocations belong to their creator (docs/allocation.md, "Ownership"): a game caller
 * (token or instance credential) sees only the allocations its principal created, and
 * those of before owners were recorded; ops, viewers and Big Brothers see all. Returns the
 * principal the scripts filter by, "" for all. */
static const char *alloc_viewer(const sd_req_t *req)
{
    return req->role == SD_R_GAME ? req->auth.principal : "";
}

static void req_free(alloc_req_t *a)
{
    free(a->labels);
    free(a->meta);
    free(a->payload);
    free(a->canon);
}

/* selector.<key>: absent, or an object of at most SD_ALLOC_SELECTOR_MAX name: string
 * entries (the value a name too for labels, any text without spaces for metadata), into
 * *out as canonical JSON or "". */
static int selector_map(sd_jv_t *v, const json_t *sel, const char *key, char **out)
{
    json_t *o = NULL;
    int rc = sel ? sd_jv_object(v, sel, key, SD_JV_OPTIONAL, &o) : 1;
    if (rc < 0)
        return -1;
    if (!o || json_object_size(o) == 0) {
        *out = strdup("");
        return *out ? 0 : sd_jv_fail(v, key, "out of memory");
    }
    if (json_object_size(o) > SD_ALLOC_SELECTOR_MAX)
        return sd_jv_fail(v, key, "must have at most %d entries", SD_ALLOC_SELECTOR_MAX);
    const char *k;
    json_t *x;
    json_object_foreach(o, k, x) {
        const char *s = json_string_value(x);
        if (!sd_name_valid(k, SD_NAME_MAX) || strchr(k, '='))
            return sd_jv_fail(v, key, "has a bad key '%.64s' (a name without '=')", k);
        if (!s || strlen(s) > 256 || strpbrk(s, " \t\r\n"))
            return sd_jv_fail(v, key, "['%.64s'] must be a string of at most 256 bytes without "
                              "spaces", k);
    }
    *out = sd_json_canonical(o);
    return *out ? 0 : sd_jv_fail(v, key, "out of memory");
}

/* Checks the body into *a. 0, or -1 with the message in err. */
static int req_parse(const json_t *body, const char *idem_header, alloc_req_t *a, char *err,
                     size_t errcap)
{
    static const char *const keys[] = {"service", "mode", "strategy", "selector", "players",
                                       "payload", "idempotency_key", "wait_ms", NULL};
    static const char *const skeys[] = {"machine_labels", "metadata", NULL};
    sd_jv_t v;
    const char *svc, *mode = "ready", *strategy = "packed", *key = NULL;
    json_t *sel = NULL;
    sd_jv_init(&v, "", err, errcap);
    if (sd_jv_only_keys(&v, body, keys) || sd_jv_name(&v, body, "service", 1, &svc) < 0 ||
        sd_jv_str(&v, body, "mode", 0, 8, &mode) < 0 ||
        sd_jv_str(&v, body, "strategy", 0, 16, &strategy) < 0 ||
        sd_jv_int(&v, body, "wait_ms", 0, 0, SD_ALLOC_WAIT_MAX_MS, &a->wait_ms) < 0 ||
        sd_jv_name(&v, body, "idempotency_key", 0, &key) < 0 ||
        sd_jv_object(&v, body, "selector", 0, &sel) < 0)
        return -1;
    if (strcmp(mode, "ready") && strcmp(mode, "join"))
        return sd_jv_fail(&v, "mode", "must be ready or join");
    if (strcmp(strategy, "packed") && strcmp(strategy, "distributed"))
        return sd_jv_fail(&v, "strategy", "must be packed or distributed");
    a->players = strcmp(mode, "join") == 0;
    if (sd_jv_int(&v, body, "players", 0, 0, SD_PLAYERS_MAX, &a->players) < 0)
        return -1;
    if (idem_header) {
        if (!sd_name_valid(idem_header, SD_NAME_MAX))
            return sd_jv_fail(&v, "idempotency_key", "(the Idempotency-Key header) must be a "
                              "name: 1-%d characters of " SD_NAME_CHARSET_TEXT, SD_NAME_MAX);
        if (key && strcmp(key, idem_header))
            return sd_jv_fail(&v, "idempotency_key", "differs from the Idempotency-Key header");
        key = idem_header;
    }
    if (sel) {
        size_t mark = sd_jv_key(&v, "selector");
        if (sd_jv_only_keys(&v, sel, skeys))
            return -1;
        sd_jv_pop(&v, mark);
    }
    size_t mark = sd_jv_key(&v, "selector");
    if (selector_map(&v, sel, "machine_labels", &a->labels) ||
        selector_map(&v, sel, "metadata", &a->meta))
        return -1;
    sd_jv_pop(&v, mark);
    const json_t *pl = json_object_get(body, "payload");
    a->payload = pl ? json_dumps(pl, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("null");
    if (!a->payload)
        return sd_jv_fail(&v, "payload", "could not be encoded");
    if (strlen(a->payload) > SD_ALLOC_PAYLOAD_MAX)
        return sd_jv_fail(&v, "payload", "must be at most %d bytes as compact JSON (is %zu)",
                          SD_ALLOC_PAYLOAD_MAX, strlen(a->payload));
    sd_strlcpy(a->service, svc, sizeof a->service);
    sd_strlcpy(a->mode, mode, sizeof a->mode);
    sd_strlcpy(a->strategy, strategy, sizeof a->strategy);
    sd_strlcpy(a->key, key ? key : "", sizeof a->key);
    /* What a replay under the same key must repeat: everything but the wait (only with
     * a key: the common request needs no copy). */
    if (!key) {
        a->canon = strdup("");
        return a->canon ? 0 : sd_jv_fail(&v, NULL, "out of memory");
    }
    json_t *c = json_deep_copy(body);
    json_object_del(c, "wait_ms");
    json_object_del(c, "idempotency_key");
    a->canon = c ? sd_json_canonical(c) : NULL;
    json_decref(c);
    return a->canon ? 0 : sd_jv_fail(&v, NULL, "out of memory");
}

/* An allocation record (flat field, value, ... from element `from` of r) as API JSON. */
static json_t *alloc_json(const redisReply *r, size_t from)
{
    static const char *const ints[] = {"players", "created_at_ms", "confirm_by_ms",
                                       "confirmed_at_ms", "ended_at_ms", "slot", NULL};
    json_t *o = json_object();
    for (size_t i = from; i + 1 < r->elements; i += 2) {
        const char *k = sd_reply_str(r, i), *val = sd_reply_str(r, i + 1);
        int is_int = 0;
        for (int n = 0; ints[n]; n++)
            is_int |= !strcmp(k, ints[n]);
        if (is_int) {
            if (*val)
                json_object_set_new(o, k, json_integer(strtoll(val, NULL, 10)));
        } else if (!strcmp(k, "payload") || !strcmp(k, "ports")) {
            json_t *j = *val ? json_loads(val, JSON_DECODE_ANY, NULL) : NULL;
            json_object_set_new(o, k, j ? j : json_null());
        } else if (!strcmp(k, "address")) {
            json_object_set_new(o, k, *val ? json_string(val) : json_null());
        } else if (!strcmp(k, "key")) {
            json_object_set_new(o, "idempotency_key", json_string(val));
        } else if (strcmp(k, "req")) { /* the request a replay must repeat: not shown */
            json_object_set_new(o, k, json_string(val));
        }
    }
    if (!json_object_get(o, "reason"))
        json_object_set_new(o, "reason", json_null());
    return o;
}

static void no_capacity(sd_resp_t *resp, const alloc_req_t *a, int64_t looked)
{
    json_t *sel = json_object();
    json_t *l = *a->labels ? json_loads(a->labels, 0, NULL) : NULL;
    json_t *m = *a->meta ? json_loads(a->meta, 0, NULL) : NULL;
    json_object_set_new(sel, "machine_labels", l ? l : json_object());
    json_object_set_new(sel, "metadata", m ? m : json_object());
    SD_COUNT("serverdir_allocations_total{result=\"no_capacity\"}",
             "allocation requests by result", 1);
    sd_resp_error_extra(resp, 409, "no_capacity",
                        json_pack("{s:s, s:s, s:I, s:o, s:I}", "service", a->service, "mode",
                                  a->mode, "players", (json_int_t)a->players, "selector", sel,
                                  "looked_at", (json_int_t)looked),
                        "no %s instance of service '%s' matches (machine_labels %s, metadata "
                        "%s, %lld free player slots)",
                        strcmp(a->mode, "join") ? "ready unallocated" : "running", a->service,
                        *a->labels ? a->labels : "{}", *a->meta ? a->meta : "{}",
                        (long long)a->players);
}

/* ---------- group commit ----------
 * Every allocation runs alloc_create.lua, whose cost on Redis is mostly per call (the
 * round trip, the script's start, the clock, the service and machine reads, the demand
 * counter and the assignment documents), not per request. So allocations share calls
 * (http/group.h): each request is parked and queued (none waits on Redis on its HTTP
 * thread), and the next of ALLOC_CALLS calls in flight takes everything queued for one
 * cluster (at most GROUP_MAX, in arrival order) and answers each request from its part
 * of the reply. Concurrent allocators never get the same instance either way: the
 * script takes its instances one request after another. A request that found nothing
 * and may wait (wait_ms) goes on to the park thread, which tries it again, alone, when
 * its pool changes. */
#define GROUP_MAX 32
#define ALLOC_CALLS 2

struct waiter;

typedef struct alloc_job {
    sd_group_job_t g;  /* first: the group's link and request (NULL: the park thread's) */
    alloc_req_t *a;    /* the job's (malloc'd, with its texts) */
    struct waiter *w;  /* with wait_ms: its place among the waiters, taken on arrival */
    sd_resp_t *resp;
    redisReply *r;     /* its reply, once called */
    int rc;
} alloc_job_t;

#define JOB(p) ((alloc_job_t *)(p)) /* its sd_group_job_t is its first member */

/* One call for the jobs jobs[0..n) (one cluster): each gets its reply or the store's
 * code. */
static void group_call(sd_group_job_t **jobs, int n)
{
    char base[256], chan[128];
    const char *cluster = JOB(jobs[0])->a->cluster;
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_add(&av, sd_assign_channel(chan, sizeof chan));
    sd_argv_add(&av, cluster);
    sd_argv_addf(&av, "%d", CONFIRM_DEFAULT_MS);
    sd_argv_addf(&av, "%lld", KEY_TTL_MS);
    for (int i = 0; i < n; i++) {
        const alloc_req_t *a = JOB(jobs[i])->a;
        sd_argv_add(&av, a->service);
        sd_argv_add(&av, a->mode);
        sd_argv_add(&av, a->strategy);
        sd_argv_addf(&av, "%lld", (long long)a->players);
        sd_argv_add(&av, a->labels);
        sd_argv_add(&av, a->meta);
        sd_argv_add(&av, a->payload);
        sd_argv_add(&av, a->key);
        sd_argv_add(&av, a->canon);
        sd_argv_add(&av, a->owner);
        sd_argv_add(&av, a->viewer);
    }
    redisReply *r = NULL;
    int rc = sd_store_run("alloc_create", 1, &av, &r);
    SD_COUNT("serverdir_allocation_calls_total",
             "alloc_create.lua calls (each carries one or more allocation requests)", 1);
    SD_COUNT("serverdir_allocation_call_requests_total",
             "allocation requests carried by alloc_create.lua calls", n);
    if (!rc && (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)n)) {
        log_error("bad script reply", "script=alloc_create type=%d elements=%zu requests=%d",
                  r->type, r->type == REDIS_REPLY_ARRAY ? r->elements : 0, n);
        rc = SD_STORE_ERROR;
    }
    for (int i = 0; i < n; i++) {
        alloc_job_t *j = JOB(jobs[i]);
        j->rc = rc;
        j->r = NULL;
        if (!rc) {
            j->r = r->element[i];
            r->element[i] = NULL; /* the job's now; freeReplyObject skips NULL elements */
        }
    }
    freeReplyObject(r);
}

/* Answers a from its reply r (freed here) or the store's code rc. Returns 1 when answered
 * (resp filled), 0 on no_capacity with *looked set (resp untouched). */
static int alloc_answer(const alloc_req_t *a, int rc, redisReply *r, sd_resp_t *resp,
                        int64_t *looked)
{
    if (rc) {
        sd_resp_store_error(resp, rc);
        return 1;
    }
    int answered = 1;
    if (sd_reply_status_is(r, "created") || sd_reply_status_is(r, "replayed")) {
        int replay = sd_reply_status_is(r, "replayed");
        json_t *o = alloc_json(r, 1);
        if (replay)
            json_object_set_new(o, "replayed", json_true());
        if (!replay)
            log_info("allocated", "cluster=%s allocation=%s service=%s instance=%s machine=%s "
                     "mode=%s", a->cluster, json_string_value(json_object_get(o, "allocation")),
                     a->service, json_string_value(json_object_get(o, "instance")),
                     json_string_value(json_object_get(o, "machine")), a->mode);
        SD_COUNT(replay ? "serverdir_allocations_total{result=\"replayed\"}"
                        : "serverdir_allocations_total{result=\"allocated\"}",
                 "allocation requests by result", 1);
        sd_resp_json(resp, replay ? 200 : 201, o);
    } else if (sd_reply_status_is(r, "no_capacity") && r->elements == 2) {
        *looked = sd_reply_num(r, 1);
        answered = 0;
    } else if (sd_reply_status_is(r, "idempotency_conflict") && r->elements == 2) {
        sd_resp_error_extra(resp, 409, "idempotency_conflict",
                            json_pack("{s:s}", "allocation", sd_reply_str(r, 1)),
                            "idempotency key '%s' was used for allocation %s with a different "
                            "request", a->key, sd_reply_str(r, 1));
    } else if (sd_reply_status_is(r, "not_yours")) {
        SD_COUNT("serverdir_allocation_refusals_total{reason=\"not_owner\"}",
                 "allocation requests refused because another principal owns the allocation", 1);
        sd_resp_error(resp, 404, "no_such_allocation",
                      "no allocation of yours has idempotency key '%s'", a->key);
    } else if (sd_reply_status_is(r, "no_such_service")) {
        sd_resp_error_extra(resp, 404, "unknown_service", json_pack("{s:s}", "service", a->service),
                            "service '%s' does not exist", a->service);
    } else {
        sd_resp_bad_reply(resp, "alloc_create", r);
    }
    freeReplyObject(r);
    return answered;
}

/* ---------- waiting for an instance ----------
 * A parked request is tried again only when its pool (cluster, service) may have
 * changed: the scripts that free an instance or move a ready one's capacity or status
 * publish "<cluster> <service> ..." on the pool channel (pool_publish in
 * store/lua_prelude.lua), and a subscriber on the park thread wakes the oldest waiter of
 * each pool named. A woken waiter passes the wake on to the next one of its pool that
 * this chain of wakes has not tried yet: any kind after it got an instance (there may be
 * more), only waiters with a selector after it found nothing (a plain waiter that finds
 * nothing proves the free set empty; what a selector could not use, another may). So
 * idle waiters cost Redis nothing, a freed instance two tries. A lost message (the
 * subscriber reconnecting, a change no script publishes: a machine's lease coming back)
 * is made up by a re-check that wakes the oldest waiter of every pool each RECHECK_MS
 * (RECHECK_DOWN_MS while the subscriber is down).
 *
 * How many may wait: sd_quota_limit's allocations_waiting (this copy), ..._per_cluster
 * and ..._per_token (the caller's principal), counted here in memory (per copy), from a
 * request's arrival (before its first try) to its answer. */
#define RECHECK_MS 1000
#define RECHECK_DOWN_MS 250

/* One request with wait_ms: its place among the waiters, then its parked wait. */
typedef struct waiter {
    alloc_req_t *a;
    char principal[sizeof(((sd_auth_t *)0)->principal)];
    int selector;     /* machine labels, metadata, players or join mode */
    uint64_t chain;   /* the chain of wakes that woke it last (0: none) */
    int in_chain;     /* woken by a chain: pass the wake on after the try */
    int skip_plain;   /* ... to waiters with a selector only */
} waiter_t;

static _Atomic int waiters;
static sd_quota_tally_t waiters_by_cluster = SD_QUOTA_TALLY_INIT;
static sd_quota_tally_t waiters_by_token = SD_QUOTA_TALLY_INIT;

/* Owned by the park thread. */
static int64_t next_recheck_ms;
static uint64_t chains;

static const sd_park_kind_t wait_kind;

/* The pool channel: the assignments channel's name with ":pool" (lua_prelude.lua). */
static const char *pool_channel(char *buf, size_t cap)
{
    char chan[96];
    snprintf(buf, cap, "%s:pool", sd_assign_channel(chan, sizeof chan));
    return buf;
}

/* A wake for one pool: the first waiter (oldest first) of cluster/service that chain has
 * not woken, is not `self` and, with skip_plain, has a selector. */
typedef struct {
    const char *cluster, *service;
    const waiter_t *self;
    uint64_t chain;
    int skip_plain, done;
} wake_t;

static int wake_match(void *ctx, void *arg)
{
    waiter_t *w = ctx;
    wake_t *k = arg;
    if (k->done || w == k->self || w->chain == k->chain || (k->skip_plain && !w->selector) ||
        strcmp(w->a->service, k->service) || strcmp(w->a->cluster, k->cluster))
        return 0;
    k->done = 1;
    w->chain = k->chain;
    w->in_chain = 1;
    w->skip_plain = k->skip_plain;
    return 1;
}

/* Starts a chain on pool cluster/service: wakes its oldest waiter. */
static void wake_pool(const char *cluster, const char *service)
{
    wake_t k = {.cluster = cluster, .service = service, .chain = ++chains};
    sd_park_wake(&wait_kind, wake_match, &k);
}

/* The re-check: one chain per pool that has waiters. seen: the pools woken so far, an
 * open-addressed set of hashes of "cluster\0service" (a collision skips a pool for one
 * round). */
typedef struct {
    uint64_t *seen;
    size_t cap;
} recheck_t;

static int recheck_match(void *ctx, void *arg)
{
    waiter_t *w = ctx;
    recheck_t *rc = arg;
    uint64_t h = 14695981039346656037ULL;
    for (const char *p = w->a->cluster; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h *= 1099511628211ULL;
    for (const char *p = w->a->service; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h |= 1;
    size_t i = h & (rc->cap - 1);
    while (rc->seen[i] && rc->seen[i] != h)
        i = (i + 1) & (rc->cap - 1);
    if (rc->seen[i])
        return 0;
    rc->seen[i] = h;
    w->chain = ++chains;
    w->in_chain = 1;
    w->skip_plain = 0;
    return 1;
}

static void recheck(void)
{
    recheck_t rc = {.cap = 64};
    while (rc.cap < 2 * (size_t)atomic_load(&waiters))
        rc.cap *= 2;
    if (!(rc.seen = calloc(rc.cap, sizeof *rc.seen))) {
        sd_park_wake(&wait_kind, NULL, NULL); /* every waiter then */
        return;
    }
    sd_park_wake(&wait_kind, recheck_match, &rc);
    free(rc.seen);
}

/* Wakes a chain on each pool a message "<cluster> <service> ..." names. */
static void pool_message(const char *payload)
{
    if (atomic_load(&waiters) == 0)
        return;
    char buf[8192];
    if (strlen(payload) >= sizeof buf) { /* cut: the re-check covers what it named */
        next_recheck_ms = 0;
        return;
    }
    sd_strlcpy(buf, payload, sizeof buf);
    char *save = NULL, *cluster = strtok_r(buf, " ", &save);
    for (char *svc = cluster ? strtok_r(NULL, " ", &save) : NULL; svc;
         svc = strtok_r(NULL, " ", &save))
        wake_pool(cluster, svc);
}

/* The subscriber (re)connected or was lost: the re-check runs at once (messages may have
 * been missed), then at the pace of its state. */
static void pool_gap(void) { next_recheck_ms = 0; }

static sd_park_sub_t pool_sub = {.kind = &wait_kind, .what = "pool", .channel = pool_channel,
                                 .on_message = pool_message, .on_gap = pool_gap};

/* Source: keeps the pool subscriber connected and runs the re-check when it is due. */
static void pool_sub_prepare(int64_t now)
{
    sd_park_sub_prepare(&pool_sub, now);
    if (now >= next_recheck_ms) {
        next_recheck_ms = now + (sd_park_sub_up(&pool_sub) ? RECHECK_MS : RECHECK_DOWN_MS);
        recheck();
    }
}

static int pool_sub_fd(void) { return sd_park_sub_fd(&pool_sub); }
static void pool_sub_read(void) { sd_park_sub_read(&pool_sub); }

/* The park thread's tries: a call of its own, alone; a try that a chain woke passes the
 * wake on. */
static int wait_try(void *ctx, sd_resp_t *resp, int due, int64_t *retry_at_ms)
{
    waiter_t *w = ctx;
    alloc_req_t *a = w->a;
    int64_t looked = 0;
    alloc_job_t j = {.a = a};
    sd_group_job_t *g = &j.g;
    (void)retry_at_ms; /* no timer of its own: wakes and the re-check */
    group_call(&g, 1);
    SD_COUNT("serverdir_allocation_wait_tries_total", "tries of parked allocation requests", 1);
    int answered = alloc_answer(a, j.rc, j.r, resp, &looked);
    if (w->in_chain) {
        int got = answered && resp->status == 201;
        wake_t k = {.cluster = a->cluster, .service = a->service, .self = w, .chain = w->chain,
                    .skip_plain = !got && (w->skip_plain || !w->selector)};
        w->in_chain = 0;
        if (got || !answered)
            sd_park_wake(&wait_kind, wake_match, &k);
    }
    if (answered)
        return 1;
    if (due || sd_mono_ms() >= a->start_ms + a->wait_ms) {
        no_capacity(resp, a, looked);
        return 1;
    }
    return 0;
}

/* Gives back w's place among the waiters; frees w (not its request). */
static void wait_leave(waiter_t *w)
{
    sd_quota_give(&waiters_by_token, w->principal);
    sd_quota_give(&waiters_by_cluster, w->a->cluster);
    atomic_fetch_sub(&waiters, 1);
    free(w);
}

static int job_heavy(const alloc_req_t *a);

/* Takes a place among the waiters for request a (wait_ms) of req's caller: this copy's,
 * a's cluster's and the caller's principal's count, before anything runs, so that a
 * refusal changes nothing. Returns the place (the caller's; wait_leave gives it back) or
 * NULL with the refusal (429 quota_exceeded) in resp. */
static waiter_t *wait_admit(alloc_req_t *a, const sd_req_t *req, sd_resp_t *resp)
{
    waiter_t *w = calloc(1, sizeof *w);
    if (!w) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return NULL;
    }
    w->a = a;
    w->selector = job_heavy(a) || *a->labels;
    sd_strlcpy(w->principal, req->auth.principal[0] ? req->auth.principal : "open",
               sizeof w->principal);
    int64_t used, lim = sd_quota_limit[SD_QUOTA_ALLOC_WAITING];
    char scope[SD_NAME_MAX + 16];
    int n = atomic_fetch_add(&waiters, 1);
    if (lim && n >= lim) {
        atomic_fetch_sub(&waiters, 1);
        sd_quota_refuse(resp, SD_QUOTA_ALLOC_WAITING, n, "serverdir");
    } else if (sd_quota_take(&waiters_by_cluster, a->cluster,
                             sd_quota_limit[SD_QUOTA_ALLOC_WAITING_PER_CLUSTER], &used)) {
        atomic_fetch_sub(&waiters, 1);
        snprintf(scope, sizeof scope, "cluster:%s", a->cluster);
        sd_quota_refuse(resp, SD_QUOTA_ALLOC_WAITING_PER_CLUSTER, used, scope);
    } else if (sd_quota_take(&waiters_by_token, w->principal,
                             sd_quota_limit[SD_QUOTA_ALLOC_WAITING_PER_TOKEN], &used)) {
        sd_quota_give(&waiters_by_cluster, a->cluster);
        atomic_fetch_sub(&waiters, 1);
        sd_quota_refuse(resp, SD_QUOTA_ALLOC_WAITING_PER_TOKEN, used, w->principal);
    } else {
        return w;
    }
    free(w);
    return NULL;
}

/* Frees a parked request's place and request. */
static void wait_release(void *ctx)
{
    waiter_t *w = ctx;
    alloc_req_t *a = w->a;
    wait_leave(w);
    req_free(a);
    free(a);
}

static const sd_park_kind_t wait_kind = {.try_answer = wait_try,
                                         .release = wait_release,
                                         .source_prepare = pool_sub_prepare,
                                         .source_fd = pool_sub_fd,
                                         .source_ready = pool_sub_read};

/* Parks w (its first try found nothing) for req, answered in resp. 0 when the park
 * thread owns w and its request now; -1 with the error in resp, both still the
 * caller's. */
static int wait_park(waiter_t *w, sd_req_t *req, sd_resp_t *resp, int parked)
{
    int64_t until = w->a->start_ms + w->a->wait_ms;
    if (!(parked ? sd_park_suspended(&wait_kind, req, resp, w, until)
                 : sd_park(&wait_kind, req, resp, w, until)))
        return 0;
    sd_resp_error(resp, 503, "internal", "cannot start the allocation waiter");
    return -1;
}

/* The first try of job j is done: answers the request (and resumes it when parked), or
 * hands it to the park thread to wait. Frees j. */
static void job_finish(alloc_job_t *j, int parked)
{
    alloc_req_t *a = j->a;
    int64_t looked = 0;
    int answered = alloc_answer(a, j->rc, j->r, j->resp, &looked);
    if (!answered && !j->w) {
        no_capacity(j->resp, a, looked);
        answered = 1;
    }
    if (!answered && wait_park(j->w, j->g.req, j->resp, parked) == 0) {
        free(j); /* the park thread owns a now */
        return;
    }
    if (j->w)
        wait_leave(j->w);
    if (parked)
        sd_req_resume(j->g.req);
    req_free(a);
    free(a);
    free(j);
}

/* Whether a's search may read a record per candidate instance (metadata, free player
 * slots, join mode: up to 64 x 64 reads, milliseconds of Redis in the worst case). Such a
 * request gets a call of its own, so that no call holds Redis for more than one of them
 * or GROUP_MAX plain ones (about 50 us each). */
static int job_heavy(const alloc_req_t *a)
{
    return *a->meta || a->players > 0 || strcmp(a->mode, "ready");
}

static const char *job_key(const sd_group_job_t *j) { return JOB(j)->a->cluster; }

static long job_weight(const sd_group_job_t *j) { return job_heavy(JOB(j)->a) ? GROUP_MAX : 1; }

static void job_finish_g(sd_group_job_t *j, int parked) { job_finish(JOB(j), parked); }

static sd_group_t alloc_group = {.name = "allocations",
                                 .calls = ALLOC_CALLS,
                                 .jobs_max = GROUP_MAX,
                                 .weight_max = GROUP_MAX,
                                 .key = job_key,
                                 .weight = job_weight,
                                 .call = group_call,
                                 .finish = job_finish_g,
                                 SD_GROUP_STATE};

/* POST /allocations -> 201 allocation | 200 replayed | 409 no_capacity / conflict. */
void h_alloc_create(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    alloc_req_t *a = calloc(1, sizeof *a);
    alloc_job_t *j = calloc(1, sizeof *j);
    char err[SD_ERRMSG_MAX];
    if (!a || !j) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        goto fail;
    }
    if (req_parse(body, sd_req_header(req, "Idempotency-Key"), a, err, sizeof err)) {
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        goto fail;
    }
    if (sd_req_may_cluster(req, resp, cluster))
        goto fail;
    /* a copy's first request for a cluster records it, on a handler thread */
    if (!sd_dir_cluster_known(cluster) && sd_req_defer(req))
        goto fail;
    int rc = sd_dir_cluster_seen(cluster);
    if (rc) {
        sd_resp_store_error(resp, rc);
        goto fail;
    }
    sd_strlcpy(a->cluster, cluster, sizeof a->cluster);
    sd_strlcpy(a->owner, req->auth.principal, sizeof a->owner);
    sd_strlcpy(a->viewer, alloc_viewer(req), sizeof a->viewer);
    if (a->wait_ms > 0 && !(j->w = wait_admit(a, req, resp)))
        goto fail;
    a->start_ms = sd_mono_ms();
    j->a = a;
    j->g.req = req;
    j->resp = resp;
    sd_group_submit(&alloc_group, &j->g);
    json_decref(body);
    return;
fail:
    if (a)
        req_free(a);
    free(a);
    free(j);
    json_decref(body);
}

/* ---------- the pool demand long-poll ---------- */

/* One parked GET .../pool-demand: answered when the counter moved from version. */
typedef struct {
    char cluster[SD_NAME_MAX + 1];
    int64_t version;
} demand_wait_t;

static _Atomic int demand_waiters;

/* The cluster's pool demand counter: 0 and *v, or a SD_STORE_* error. */
static int demand_read(const char *cluster, int64_t *v)
{
    redisReply *r = NULL;
    int rc = sd__cluster_run("pool_demand", cluster, &r, NULL);
    if (rc)
        return rc;
    *v = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    return 0;
}

static void demand_answer(sd_resp_t *resp, int64_t v)
{
    sd_resp_json(resp, 200, json_pack("{s:I}", "version", (json_int_t)v));
}

/* No wake-up source: the counter is read again every DEMAND_RETRY_MS (one GET; one
 * primary per cluster waits). */
static int demand_try(void *ctx, sd_resp_t *resp, int due, int64_t *retry_at_ms)
{
    demand_wait_t *w = ctx;
    int64_t v = 0;
    int rc = demand_read(w->cluster, &v);
    if (rc && due) {
        sd_resp_store_error(resp, rc);
        return 1;
    }
    if (rc || (v == w->version && !due)) {
        *retry_at_ms = sd_mono_ms() + DEMAND_RETRY_MS;
        return 0;
    }
    demand_answer(resp, v);
    return 1;
}

static void demand_release(void *ctx)
{
    free(ctx);
    atomic_fetch_sub(&demand_waiters, 1);
}

static const sd_park_kind_t demand_kind = {.try_answer = demand_try,
                                           .release = demand_release};

/* GET /pool-demand[?version=V&wait=MS] -> {version}: the counter alloc_create moves on
 * every take and every miss. With version equal to the current one and wait > 0 the
 * request is parked until it moves or the wait ends (200 either way): bigbrother's
 * primary waits here between placement passes, so a pool refills at once. */
void h_pool_demand(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    int64_t version, wait, cur = 0;
    if (sd_req_name(req, resp, 0, "cluster", &cluster) ||
        sd_req_may_cluster(req, resp, cluster) ||
        sd_req_query_int(req, resp, "version", 0, INT64_MAX, -1, &version) ||
        sd_req_query_int(req, resp, "wait", 0, SD_ASSIGN_WAIT_MAX_MS, 0, &wait))
        return;
    int rc = demand_read(cluster, &cur);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (wait == 0 || version != cur || sd_http_stopping()) {
        demand_answer(resp, cur);
        return;
    }
    if (atomic_fetch_add(&demand_waiters, 1) >= DEMAND_WAITERS_MAX) {
        atomic_fetch_sub(&demand_waiters, 1);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error(resp, 429, "too_many_waiters",
                      "%d pool-demand long-polls are waiting already; retry",
                      DEMAND_WAITERS_MAX);
        return;
    }
    demand_wait_t *w = calloc(1, sizeof *w);
    if (!w) {
        atomic_fetch_sub(&demand_waiters, 1);
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    sd_strlcpy(w->cluster, cluster, sizeof w->cluster);
    w->version = version;
    if (sd_park(&demand_kind, req, resp, w, sd_mono_ms() + wait)) {
        demand_release(w);
        sd_resp_error(resp, 503, "internal", "cannot start the pool-demand waiter");
    }
}

/* Whether id has the form of the ids alloc_create.lua hands out ("a" and 12 or more
 * digits). Any other name would read another key of the cluster as an allocation record
 * (alloc:m:<machine>, alloc:pending, ...): answered 404 without a look. */
static int alloc_id_valid(const char *id)
{
    size_t n = strlen(id);
    return id[0] == 'a' && n >= 13 && strspn(id + 1, "0123456789") == n - 1;
}

static void no_such_allocation(sd_resp_t *resp, const char *id)
{
    sd_resp_error_extra(resp, 404, "no_such_allocation", json_pack("{s:s}", "allocation", id),
                        "allocation '%s' does not exist (ended ones are kept an hour)", id);
}

/* GET /allocations/{id} */
void h_alloc_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *id;
    if (sd_req_cluster_and(req, resp, &cluster, "allocation", &id))
        return;
    if (!alloc_id_valid(id)) {
        no_such_allocation(resp, id);
        return;
    }
    redisReply *r = NULL;
    int rc = sd__cluster_run("alloc_get", cluster, &r, id, alloc_viewer(req), NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY)
        sd_resp_bad_reply(resp, "alloc_get", r);
    else if (r->elements == 0)
        no_such_allocation(resp, id);
    else
        sd_resp_json(resp, 200, alloc_json(r, 0));
    freeReplyObject(r);
}

/* DELETE /allocations/{id} -> 200 the ended allocation. */
void h_alloc_delete(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *id;
    if (sd_req_cluster_and(req, resp, &cluster, "allocation", &id) ||
        sd_req_may_cluster(req, resp, cluster))
        return;
    if (!alloc_id_valid(id)) {
        no_such_allocation(resp, id);
        return;
    }
    char chan[128];
    redisReply *r = NULL;
    int rc = sd__cluster_run("alloc_release", cluster, &r, id, sd_assign_channel(chan, sizeof chan),
                             cluster, alloc_viewer(req), NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (sd_reply_status_is(r, "no_such_allocation")) {
        no_such_allocation(resp, id);
    } else if (sd_reply_status_is(r, "ended") || sd_reply_status_is(r, "unchanged")) {
        json_t *o = alloc_json(r, 1);
        if (sd_reply_status_is(r, "ended")) {
            log_info("allocation released", "cluster=%s allocation=%s by=api", cluster, id);
            SD_COUNT("serverdir_allocations_ended_total{state=\"released\"}",
                     "allocations ended, by final state", 1);
        }
        json_object_set_new(o, "changed", json_boolean(sd_reply_status_is(r, "ended")));
        sd_resp_json(resp, 200, o);
    } else {
        sd_resp_bad_reply(resp, "alloc_release", r);
    }
    freeReplyObject(r);
}

/* GET /allocations[?service=S&after=ID&limit=N] -> {allocations: [...], next}. */
void h_alloc_list(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *after, *svc = sd_req_query(req, "service");
    int64_t limit;
    if (sd_req_page(req, resp, &cluster, LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT, &limit, &after))
        return;
    if (svc && !sd_name_valid(svc, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_query", "query parameter 'service' must be a name");
        return;
    }
    char lim[24];
    snprintf(lim, sizeof lim, "%lld", (long long)limit);
    redisReply *r = NULL;
    int rc = sd__cluster_run("alloc_list", cluster, &r, after, lim, svc ? svc : "",
                             alloc_viewer(req), NULL);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        sd_resp_bad_reply(resp, "alloc_list", r);
        freeReplyObject(r);
        return;
    }
    json_t *list = json_array();
    for (size_t i = 1; i < r->elements; i++)
        if (r->element[i]->type == REDIS_REPLY_ARRAY)
            json_array_append_new(list, alloc_json(r->element[i], 0));
    const char *next = sd_reply_str(r, 0);
    sd_resp_json(resp, 200, json_pack("{s:o, s:o}", "allocations", list, "next",
                                      *next ? json_string(next) : json_null()));
    freeReplyObject(r);
}

/* The serverdir_allocations_waiting gauge: requests with wait_ms, admitted and not answered. */
static int waiting_gauge(double *value)
{
    *value = (double)atomic_load(&waiters);
    return 0;
}

void sd_alloc_metrics_init(void)
{
    sd_metric_gauge("serverdir_allocations_waiting",
                    "allocation requests with wait_ms, from arrival to answer", waiting_gauge);
}

/* ---------- the sweep ---------- */

void sd_alloc_sweep(const char *cluster)
{
    char chan[128], n[16];
    snprintf(n, sizeof n, "%d", SWEEP_BATCH);
    redisReply *r = NULL;
    if (sd__cluster_run("alloc_sweep", cluster, &r, sd_assign_channel(chan, sizeof chan), cluster,
                        n, NULL))
        return;
    if (r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
        log_info("allocations expired", "cluster=%s count=%zu first=%s", cluster, r->elements,
                 sd_reply_str(r, 0));
        SD_COUNT("serverdir_allocations_ended_total{state=\"expired\"}",
                 "allocations ended, by final state", (int64_t)r->elements);
    }
    freeReplyObject(r);
}
