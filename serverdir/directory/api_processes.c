/* The process directory: event batches from the Big Brothers (started, ready, stopped),
 * the live directory with filters, one process record, and the bounded event history.
 * Every batch is applied by one script (lua/events_apply.lua); see directory.h for the
 * Redis layout. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "group.h"
#include "sd.h"
#include "sdutil.h"

SD_ROUTE(POST, "/v1/clusters/{c}/events", SD_R_BB, SD_GROUPED, h_events_post);
SD_ROUTE(GET, "/v1/clusters/{c}/events", SD_R_BB | SD_R_VIEWER, 0, h_events_list);
SD_ROUTE(GET, "/v1/clusters/{c}/processes", SD_R_BB | SD_R_VIEWER, 0, h_processes_list);
SD_ROUTE(GET, "/v1/clusters/{c}/processes/{instance}", SD_R_BB | SD_R_VIEWER, 0, h_process_get);

#define PROCS_LIMIT_DEFAULT 500
#define PROCS_LIMIT_MAX 5000
#define PROCS_CALL_MAX 50      /* records per proc_list call: each call stays well under 1 ms */
#define PROCS_BUDGET 500       /* index entries one call looks at */
#define PROCS_CALLS_MAX 120    /* calls per request (a page of 5000: 100) */
#define EVENTS_LIMIT_DEFAULT 100

/* ---------- group commit ----------
 * Every batch runs events_apply.lua, part of whose cost is per call (the round trip, the
 * script's start, the clock, the pool counters, the assignment documents, the unlock
 * list): batches that arrive while EVENTS_CALLS calls are in flight share the next call
 * (http/group.h), at most EVENTS_GROUP_MAX batches and SD_EVENTS_MAX events, so no call
 * holds Redis longer than one full batch does. */
#define EVENTS_CALLS 2
#define EVENTS_GROUP_MAX 32

typedef struct {
    sd_group_job_t g; /* first */
    char cluster[SD_NAME_MAX + 1];
    char bound[SD_NAME_MAX + 1]; /* the machine the sender's token is bound to, or "" */
    char *batch; /* normalized (malloc'd) */
    long nevents;
    sd_resp_t *resp;
    long long counts[4];
    int rc;
    sd_dir_refusal_t why; /* with rc SD_DIR_REFUSED */
} events_job_t;

#define EJOB(p) ((events_job_t *)(p)) /* its sd_group_job_t is its first member */

static const char *events_key(const sd_group_job_t *j) { return EJOB(j)->cluster; }

static long events_weight(const sd_group_job_t *j)
{
    return EJOB(j)->nevents > 0 ? EJOB(j)->nevents : 1;
}

static void events_call(sd_group_job_t **jobs, int n)
{
    sd_dir_batch_t batches[EVENTS_GROUP_MAX];
    long long counts[EVENTS_GROUP_MAX][4];
    sd_dir_refusal_t why;
    for (int i = 0; i < n; i++)
        batches[i] = (sd_dir_batch_t){.events = EJOB(jobs[i])->batch, .bound = EJOB(jobs[i])->bound};
    int rc = sd_dir_events_apply_many(EJOB(jobs[0])->cluster, batches, n, counts, &why);
    SD_COUNT("serverdir_events_calls_total",
             "events_apply.lua calls (each carries one or more event batches)", 1);
    SD_COUNT("serverdir_events_call_batches_total",
             "event batches carried by events_apply.lua calls", n);
    if ((rc == SD_STORE_ERROR || rc == SD_DIR_REFUSED) && n > 1) {
        /* Redis refused the call (a batch the script's own check refused, before any
         * write): each batch again alone, so only its own request fails */
        for (int i = 0; i < n; i++)
            events_call(&jobs[i], 1);
        return;
    }
    for (int i = 0; i < n; i++) {
        events_job_t *j = EJOB(jobs[i]);
        j->rc = rc;
        if (!rc)
            memcpy(j->counts, counts[i], sizeof j->counts);
        if (rc == SD_DIR_REFUSED)
            j->why = why;
    }
}

/* Answers the refusal of j's batch: 403 when it named an instance the directory records on
 * another machine than the token's, 429 when it would pass a machine's live-process quota.
 * Logged at most once a second: the sender is a peer with a valid token. */
static void events_refuse(sd_resp_t *resp, const events_job_t *j)
{
    const sd_dir_refusal_t *w = &j->why;
    static _Atomic int64_t last_log;
    int64_t now = sd_mono_ms(), prev = atomic_load(&last_log);
    int log = now - prev >= 1000 && atomic_compare_exchange_strong(&last_log, &prev, now);
    if (w->quota) {
        SD_COUNT("serverdir_quota_refusals_total{quota=\"live_processes_per_machine\"}",
                 "requests refused by a quota (docs/operations.md)", 1);
        if (log)
            log_warn("events refused: quota", "cluster=%s machine=%s quota=%s limit=%lld",
                     j->cluster, w->machine, "live_processes_per_machine", w->limit);
        sd_resp_error_extra(resp, 429, "quota_exceeded",
                            json_pack("{s:s, s:s, s:I}", "quota", "live_processes_per_machine",
                                      "machine", w->machine, "limit", (json_int_t)w->limit),
                            "machine '%s' is at its limit of %lld live processes "
                            "(live_processes_per_machine, or its declared capacity plus "
                            "live_processes_above_capacity when lower): "
                            "the batch changed nothing", w->machine, w->limit);
        return;
    }
    SD_COUNT("serverdir_events_refused_total{reason=\"instance_of_another_machine\"}",
             "Event batches refused: a machine-bound token named an instance the directory "
             "records on another machine", 1);
    if (log)
        log_warn("events refused: instance of another machine",
                 "cluster=%s token_machine=%s instance=%s recorded_machine=%s", j->cluster,
                 j->bound, w->instance, w->machine);
    sd_resp_error_extra(resp, 403, "forbidden",
                        json_pack("{s:i, s:s, s:s}", "event", w->event, "instance", w->instance,
                                  "recorded_machine", w->machine),
                        "events[%d]: instance '%s' is recorded on machine '%s'; a token bound "
                        "to machine '%s' reports its own machine's instances only (a move "
                        "between machines is an operator's act): the batch changed nothing",
                        w->event, w->instance, w->machine, j->bound);
}

/* Answers j's request from its counts, resumes it when parked, frees j. */
static void events_finish(sd_group_job_t *g, int parked)
{
    events_job_t *j = EJOB(g);
    sd_resp_t *resp = j->resp;
    long long *counts = j->counts;
    if (j->rc == SD_DIR_REFUSED) {
        events_refuse(resp, j);
        goto done;
    }
    if (j->rc) {
        sd_resp_store_error(resp, j->rc);
        goto done;
    }
    long long accepted = counts[0], dups = counts[1], stale = counts[2];
    SD_COUNT("serverdir_events_accepted_total", "process events applied (new ids)", accepted);
    SD_COUNT("serverdir_events_duplicate_total", "process events ignored as already applied", dups);
    SD_COUNT("serverdir_events_stale_total", "process events older than the record they name", stale);
    if (counts[3] >= 0 && counts[3] < sd_dir_cfg.wait_replicas) {
        /* applied on the primary, not yet on enough replicas: a failover now could lose
         * it, so the sender keeps the batch and resends it (its ids make that a no-op) */
        SD_COUNT("serverdir_event_replication_timeouts_total",
                 "Event batches answered 503 because too few replicas confirmed them", 1);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error_extra(resp, 503, "replication_timeout",
                            json_pack("{s:I, s:I}", "replicas", (json_int_t)counts[3], "wanted",
                                      (json_int_t)sd_dir_cfg.wait_replicas),
                            "the batch reached %lld of %lld replicas within %lld ms; resend it "
                            "(event ids make that a no-op)",
                            counts[3], (long long)sd_dir_cfg.wait_replicas,
                            (long long)sd_dir_cfg.wait_timeout_ms);
        goto done;
    }
    sd_resp_json(resp, 200, json_pack("{s:I, s:I, s:I}", "accepted", accepted,
                                      "duplicates", dups, "stale", stale));
done:
    if (parked)
        sd_req_resume(j->g.req);
    free(j->batch);
    free(j);
}

static sd_group_t events_group = {.name = "events",
                                  .calls = EVENTS_CALLS,
                                  .jobs_max = EVENTS_GROUP_MAX,
                                  .weight_max = SD_EVENTS_MAX,
                                  .key = events_key,
                                  .weight = events_weight,
                                  .call = events_call,
                                  .finish = events_finish,
                                  SD_GROUP_STATE};

/* Validates the batch, then applies it with events_apply.lua, in a call of its own or one
 * it shares with other batches (the group commit above). Answers
 * {"accepted": N, "duplicates": D, "stale": S}: stale events were new but older than the
 * record (ordering safety) and only went to the history. */
void h_events_post(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    /* A token bound to a machine reports that machine's events only: one event for
     * another refuses the whole batch (and so does one about an instance the directory
     * records on another machine: events_apply.lua checks that, events_refuse answers). */
    const json_t *ev;
    size_t i;
    json_array_foreach(json_object_get(body, "events"), i, ev) {
        const char *m = json_string_value(json_object_get(ev, "machine"));
        if (m && sd_req_may_machine(req, resp, cluster, m)) {
            json_decref(body);
            return;
        }
    }
    char err[SD_ERRMSG_MAX];
    char *batch = NULL;
    size_t n = 0;
    int rc = sd_dir_events_normalize(body, &batch, &n, err, sizeof err);
    json_decref(body);
    if (rc) {
        SD_COUNT("serverdir_events_rejected_total", "event batches rejected as invalid", 1);
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }

    events_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        free(batch);
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    sd_strlcpy(j->cluster, cluster, sizeof j->cluster);
    sd_strlcpy(j->bound, req->auth.machine, sizeof j->bound);
    j->batch = batch;
    j->nevents = (long)n;
    j->g.req = req;
    j->resp = resp;
    sd_group_submit(&events_group, &j->g);
}

/* GET .../events?since=ID&limit=N: history entries after `since` (oldest first), or
 * without since the newest `limit` entries; newest last either way. `last` is the seq
 * to pass as `since` next time (null when the history is empty). */
int sd_dir_events_read(const char *cluster, const char *since, int64_t limit, json_t **out)
{
    char key[256];
    sd_argv_t a;
    sd_argv_init(&a);
    if (since) {
        sd_argv_add(&a, "XRANGE");
        sd_argv_add(&a, sd_key(key, sizeof key, cluster, "events"));
        sd_argv_addf(&a, "(%s", since);
        sd_argv_add(&a, "+");
    } else {
        sd_argv_add(&a, "XREVRANGE");
        sd_argv_add(&a, sd_key(key, sizeof key, cluster, "events"));
        sd_argv_add(&a, "+");
        sd_argv_add(&a, "-");
    }
    sd_argv_add(&a, "COUNT");
    sd_argv_addf(&a, "%lld", (long long)limit);
    redisReply *r = NULL;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        /* "(ID" past the largest possible id is refused by Redis: nothing comes after. */
        freeReplyObject(r);
        *out = json_pack("{s:[], s:s?}", "events", "last", since);
        return SD_STORE_OK;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    json_t *list = json_array();
    for (size_t i = 0; i < r->elements; i++) {
        size_t idx = since ? i : r->elements - 1 - i;
        json_t *e = sd_dir_event_json(r->element[idx]);
        if (e)
            json_array_append_new(list, e);
    }
    freeReplyObject(r);
    size_t n = json_array_size(list);
    json_t *last = n ? json_incref(json_object_get(json_array_get(list, n - 1), "seq"))
                     : (since ? json_string(since) : json_null());
    *out = json_pack("{s:o, s:o}", "events", list, "last", last);
    return SD_STORE_OK;
}

/* GET .../events?since=SEQ&limit=N[&wait=MS]: the events after since (oldest first), or
 * without since the newest limit (newest last). With since and wait > 0, a request that
 * finds nothing new is parked until the cluster's history grows or the wait ends
 * (events_wait.c): a follower (sdctl events -f, --watch) sees a change at once and costs
 * nothing while the cluster is quiet. */
void h_events_list(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    int64_t limit, wait;
    if (sd_req_name(req, resp, 0, "cluster", &cluster) ||
        sd_req_query_int(req, resp, "limit", 1, SD_HISTORY_LIMIT_MAX, EVENTS_LIMIT_DEFAULT, &limit) ||
        sd_req_query_int(req, resp, "wait", 0, SD_EVENTS_WAIT_MAX_MS, 0, &wait))
        return;
    const char *since = sd_req_query(req, "since");
    if (since && sd_dir_stream_id_valid(since)) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'since' must be an event seq such as 1795000000000-0");
        return;
    }
    if (wait > 0 && !since) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'wait' needs 'since' (the seq to wait past)");
        return;
    }
    json_t *body = NULL;
    int rc = sd_dir_events_read(cluster, since, limit, &body);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (wait > 0 && json_array_size(json_object_get(body, "events")) == 0 &&
        !sd_http_stopping()) {
        json_decref(body);
        sd_events_park(req, resp, cluster, since, limit, wait);
        return;
    }
    sd_resp_json(resp, 200, body);
}

/* GET .../processes?machine=&service=&state=&limit=&after=: one page of the live directory
 * (starting and ready) in instance order, or with state=stopped of the recently stopped,
 * newest first. `next` continues the walk (pass it as after=); null at the end. A page
 * is built from calls of at most PROCS_CALL_MAX records, each walking an index of the
 * filter (proc_list.lua): no call's work grows with the directory's size. A page may be
 * short while more follow (a filter the index does not answer): only next=null ends. */
void h_processes_list(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    int64_t limit;
    if (sd_req_name(req, resp, 0, "cluster", &cluster) ||
        sd_req_query_int(req, resp, "limit", 1, PROCS_LIMIT_MAX, PROCS_LIMIT_DEFAULT, &limit))
        return;
    const char *machine = sd_req_query(req, "machine");
    const char *service = sd_req_query(req, "service");
    const char *state = sd_req_query(req, "state");
    const char *after = sd_req_query(req, "after");
    if (machine && !sd_name_valid(machine, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_query", "query parameter 'machine' is not a valid name");
        return;
    }
    if (service && !sd_name_valid(service, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_query", "query parameter 'service' is not a valid name");
        return;
    }
    if (state && strcmp(state, "starting") && strcmp(state, "ready") && strcmp(state, "stopped")) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'state' must be starting, ready or stopped");
        return;
    }
    if (after && *after && !sd_name_valid(after, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'after' must be the 'next' of a previous page");
        return;
    }
    int rc = sd_dir_ensure_index(cluster);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    char base[256], cursor[SD_NAME_MAX + 1];
    sd_key(base, sizeof base, cluster, "%s", "");
    sd_strlcpy(cursor, after ? after : "", sizeof cursor);
    json_t *list = json_array();
    long long total = 0;
    for (int call = 0; call < PROCS_CALLS_MAX && (int64_t)json_array_size(list) < limit; call++) {
        int64_t want = limit - (int64_t)json_array_size(list);
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, base);
        sd_argv_add(&a, state ? state : "");
        sd_argv_add(&a, machine ? machine : "");
        sd_argv_add(&a, service ? service : "");
        sd_argv_add(&a, cursor);
        sd_argv_addf(&a, "%lld", (long long)(want < PROCS_CALL_MAX ? want : PROCS_CALL_MAX));
        sd_argv_addf(&a, "%d", PROCS_BUDGET);
        redisReply *r = NULL;
        rc = sd_store_run("proc_list", 1, &a, &r);
        if (rc) {
            json_decref(list);
            sd_resp_store_error(resp, rc);
            return;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_INTEGER) {
            freeReplyObject(r);
            json_decref(list);
            sd_resp_store_error(resp, SD_STORE_ERROR);
            return;
        }
        for (size_t i = 2; i < r->elements; i++)
            if (r->element[i]->type == REDIS_REPLY_ARRAY && r->element[i]->elements > 0)
                json_array_append_new(list, sd_dir_proc_json(r->element[i], cluster));
        total = r->element[1]->integer;
        sd_strlcpy(cursor, r->element[0]->str, sizeof cursor);
        freeReplyObject(r);
        if (!cursor[0])
            break;
    }
    sd_resp_json(resp, 200, json_pack("{s:o, s:I, s:b, s:o}", "processes", list, "total", total,
                                      "truncated", cursor[0] != '\0', "next",
                                      cursor[0] ? json_string(cursor) : json_null()));
}

void h_process_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *inst;
    if (sd_req_cluster_and(req, resp, &cluster, "instance", &inst))
        return;
    char key[512];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "HGETALL");
    sd_argv_add(&a, sd_key(key, sizeof key, cluster, "proc:%s", inst));
    redisReply *r = NULL;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        sd_resp_store_error(resp, SD_STORE_ERROR);
        return;
    }
    if (r->elements == 0) {
        freeReplyObject(r);
        sd_resp_error(resp, 404, "not_found", "no process '%s' in cluster '%s'", inst,
                      cluster);
        return;
    }
    json_t *p = sd_dir_proc_json(r, cluster);
    freeReplyObject(r);
    /* the master-list entry the instance's heartbeats linked (REST heartbeats that name
     * their cluster and instance), if it is listed */
    sd_argv_init(&a);
    sd_argv_add(&a, "GET");
    sd_argv_addf(&a, "%sinst:%s/%s", sd_master_base(), cluster, inst);
    rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc) {
        json_decref(p);
        sd_resp_store_error(resp, rc);
        return;
    }
    json_object_set_new(p, "master_address",
                        r->type == REDIS_REPLY_STRING ? json_stringn(r->str, r->len) : json_null());
    freeReplyObject(r);
    sd_resp_json(resp, 200, p);
}
