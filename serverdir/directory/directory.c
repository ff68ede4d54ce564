/* Validation and conversion for the process directory and machine leases: what the
 * handlers check before any script runs, and how stored strings become typed JSON again.
 * See directory.h for the Redis layout. */
#include "directory.h"
#include "locks.h"
#include "master.h"
#include "sdvalid.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

sd_dir_config_t sd_dir_cfg = {
    .history_max = 10000,
    .stopped_keep = 10000,
    .stopped_ttl_ms = 24LL * 3600 * 1000,
    .event_id_ttl_ms = 24LL * 3600 * 1000,
    .machine_keep_ms = 24LL * 3600 * 1000,
    .lost_sweep_ms = 1000,
    .series_interval_ms = 60000,
    .wait_replicas = 0,
    .wait_timeout_ms = 500,
    .live_max = 10000,
    .live_above = 100,
};

int sd_dir_config_load(const json_t *section, char *err, size_t errcap)
{
    if (!section)
        return 0;
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (!json_is_object(section))
        return sd_jv_fail(&v, "directory", "must be an object");
    static const char *const keys[] = {"history_max", "stopped_keep", "stopped_ttl_s",
                                       "event_id_ttl_s", "machine_keep_s", "lost_sweep_ms",
                                       "series_interval_ms", "wait_replicas",
                                       "wait_timeout_ms", "live_processes_per_machine",
                                       "live_processes_above_capacity", NULL};
    if (sd_jv_only_keys(&v, section, keys))
        return -1;
    int64_t hist = sd_dir_cfg.history_max, keep = sd_dir_cfg.stopped_keep;
    int64_t sttl = sd_dir_cfg.stopped_ttl_ms / 1000, idttl = sd_dir_cfg.event_id_ttl_ms / 1000;
    int64_t mkeep = sd_dir_cfg.machine_keep_ms / 1000, sweep = sd_dir_cfg.lost_sweep_ms;
    int64_t series = sd_dir_cfg.series_interval_ms;
    int64_t wrep = sd_dir_cfg.wait_replicas, wms = sd_dir_cfg.wait_timeout_ms;
    int64_t live = sd_dir_cfg.live_max, above = sd_dir_cfg.live_above;
    if (sd_jv_int(&v, section, "history_max", 0, 10, 10000000, &hist) < 0 ||
        sd_jv_int(&v, section, "stopped_keep", 0, 10, 10000000, &keep) < 0 ||
        sd_jv_int(&v, section, "stopped_ttl_s", 0, 1, 30LL * 86400, &sttl) < 0 ||
        sd_jv_int(&v, section, "event_id_ttl_s", 0, 86400, 30LL * 86400, &idttl) < 0 ||
        sd_jv_int(&v, section, "machine_keep_s", 0, 1, 30LL * 86400, &mkeep) < 0 ||
        sd_jv_int(&v, section, "lost_sweep_ms", 0, 0, 3600000, &sweep) < 0 ||
        sd_jv_int(&v, section, "series_interval_ms", 0, 0, 3600000, &series) < 0 ||
        sd_jv_int(&v, section, "wait_replicas", 0, 0, 16, &wrep) < 0 ||
        sd_jv_int(&v, section, "wait_timeout_ms", 0, 1, 2500, &wms) < 0 ||
        sd_jv_int(&v, section, "live_processes_per_machine", 0, 1, 10000000, &live) < 0 ||
        sd_jv_int(&v, section, "live_processes_above_capacity", 0, 0, 10000000, &above) < 0)
        return -1;
    if (sweep > 0 && sweep < 100)
        return sd_jv_fail(&v, "directory.lost_sweep_ms", "must be 0 (off) or at least 100");
    if (series > 0 && series < 100)
        return sd_jv_fail(&v, "directory.series_interval_ms", "must be 0 (off) or at least 100");
    sd_dir_cfg.history_max = hist;
    sd_dir_cfg.stopped_keep = keep;
    sd_dir_cfg.stopped_ttl_ms = sttl * 1000;
    sd_dir_cfg.event_id_ttl_ms = idttl * 1000;
    sd_dir_cfg.machine_keep_ms = mkeep * 1000;
    sd_dir_cfg.lost_sweep_ms = sweep;
    sd_dir_cfg.series_interval_ms = series;
    sd_dir_cfg.wait_replicas = wrep;
    sd_dir_cfg.wait_timeout_ms = wms;
    sd_dir_cfg.live_max = live;
    sd_dir_cfg.live_above = above;
    return 0;
}

/* ---------- events ---------- */

/* Checks the event at v's path (sd_event_check: the contract lives in common/sdproto.c)
 * and appends its flat string form [key, value, ...] to out, fields in a fixed order,
 * absent and null ones left out, numbers as decimal text, ports as sorted compact JSON. */
static int event_normalize(sd_jv_t *v, const json_t *ev, json_t *out)
{
    static const char *const order[] = {"id", "type", "instance", "machine", "service",
                                        "pid", "ts_ms", "slot", "generation", "restarts",
                                        "ports", "reason", "code", "signal", "silent_ms",
                                        "detail", "core", "log_tail", "players", "max_players",
                                        "status", "allocation"};
    if (sd_event_check(v, ev))
        return -1;
    json_t *flat = json_array();
    for (size_t n = 0; n < SD_ARRAY_LEN(order); n++) {
        json_t *f = json_object_get(ev, order[n]);
        char num[24], *dump = NULL;
        const char *text = NULL;
        if (json_is_string(f)) {
            text = json_string_value(f);
        } else if (json_is_integer(f)) {
            snprintf(num, sizeof num, "%lld", (long long)json_integer_value(f));
            text = num;
        } else if (json_is_object(f)) {
            text = dump = json_dumps(f, JSON_COMPACT | JSON_SORT_KEYS);
            if (!dump) {
                snprintf(v->err, v->errcap, "out of memory");
                json_decref(flat);
                return -1;
            }
        } else {
            continue;
        }
        json_array_append_new(flat, json_string(order[n]));
        json_array_append_new(flat, json_string(text));
        free(dump);
    }
    json_array_append_new(out, flat);
    return 0;
}

int sd_dir_events_normalize(const json_t *body, char **out, size_t *nevents, char *err,
                            size_t errcap)
{
    *out = NULL;
    static const char *const top[] = {"events", NULL};
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, errcap);
    if (sd_jv_only_keys(&jv, body, top))
        return -1;
    json_t *evs = json_object_get(body, "events");
    if (!evs) {
        snprintf(err, errcap, "field 'events' is required");
        return -1;
    }
    if (!json_is_array(evs) || json_array_size(evs) == 0 ||
        json_array_size(evs) > SD_EVENTS_MAX) {
        snprintf(err, errcap, "field 'events' must be an array of 1 to %d events", SD_EVENTS_MAX);
        return -1;
    }
    json_t *norm = json_array();
    sd_jv_t v;
    sd_jv_init(&v, "events", err, errcap);
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        size_t mark = sd_jv_index(&v, i);
        int rc = event_normalize(&v, ev, norm);
        sd_jv_pop(&v, mark);
        if (rc) {
            json_decref(norm);
            return -1;
        }
    }
    *out = json_dumps(norm, JSON_COMPACT);
    *nevents = json_array_size(norm);
    json_decref(norm);
    if (!*out) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    return 0;
}

/* ---------- machines ---------- */

/* An address: a host name or IP literal, [A-Za-z0-9.:-] and brackets, 1..255 bytes. */
static int address_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 255)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == ':' || c == '-' || c == '[' || c == ']' || c == '_'))
            return 0;
    }
    return 1;
}

int sd_dir_machine_args(const json_t *body, sd_argv_t *a, char *err, size_t errcap)
{
    static const char *const keys[] = {"address", "labels", "capacity", "version", "ttl_ms",
                                       "logs_port", NULL};
    int64_t ttl = 15000, capacity = 0, logs_port = 0;
    const char *address = NULL, *version = NULL;
    json_t *labels = NULL;
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (body && sd_jv_only_keys(&v, body, keys))
        return -1;
    if (sd_jv_int(&v, body, "ttl_ms", 0, 1000, 300000, &ttl) < 0)
        return -1;
    sd_argv_addf(a, "%lld", (long long)ttl);
    int rc = sd_jv_str(&v, body, "address", 0, 255, &address);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        if (!address_valid(address))
            return sd_jv_fail(&v, "address", "must be a host name or IP address");
        sd_argv_add(a, "address");
        sd_argv_add(a, address);
    }
    if ((rc = sd_jv_int(&v, body, "capacity", 0, 0, 1000000, &capacity)) < 0)
        return -1;
    if (rc == 0) {
        sd_argv_add(a, "capacity");
        sd_argv_addf(a, "%lld", (long long)capacity);
    }
    if ((rc = sd_jv_int(&v, body, "logs_port", 0, 1, 65535, &logs_port)) < 0)
        return -1;
    if (rc == 0) { /* where the machine's bigbrother serves its instances' logs */
        sd_argv_add(a, "logs_port");
        sd_argv_addf(a, "%lld", (long long)logs_port);
    }
    if ((rc = sd_jv_str(&v, body, "version", 0, 64, &version)) < 0)
        return -1;
    if (rc == 0) {
        sd_argv_add(a, "version");
        sd_argv_add(a, version);
    }
    if ((rc = sd_jv_object(&v, body, "labels", 0, &labels)) < 0)
        return -1;
    if (rc == 0) {
        if (json_object_size(labels) > SD_LABELS_MAX)
            return sd_jv_fail(&v, "labels", "must be an object of at most %d entries",
                              SD_LABELS_MAX);
        sd_jv_key(&v, "labels");
        const char *k;
        json_t *j;
        json_object_foreach(labels, k, j) {
            if (!sd_name_valid(k, 64))
                return sd_jv_fail(&v, NULL, "has a bad key (1-64 characters of "
                                            SD_NAME_CHARSET_TEXT ")");
            if (!json_is_string(j) || json_string_length(j) > 128 ||
                strlen(json_string_value(j)) != json_string_length(j))
                return sd_jv_fail(&v, k, "must be a string of at most 128 bytes");
        }
        char *s = json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS);
        if (!s) {
            snprintf(err, errcap, "out of memory");
            return -1;
        }
        sd_argv_add(a, "labels");
        sd_argv_addf(a, "%s", s);
        free(s);
    }
    return 0;
}

/* One command of three arguments, its reply dropped (best effort). */
static void store_cmd3(const char *cmd, const char *a1, const char *a2, const char *a3)
{
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, cmd);
    sd_argv_add(&a, a1);
    sd_argv_add(&a, a2);
    sd_argv_add(&a, a3);
    redisReply *r = NULL;
    if (sd_store_command(&a, &r) == SD_STORE_OK)
        freeReplyObject(r);
    sd_argv_free(&a);
}

/* One drain at a time in this process: the event batches of several workers would
 * otherwise read and release the same entries side by side. The next to drain finds
 * what the one before it left, its own stops included, so an answer still comes after
 * its stops' locks are released. */
static pthread_mutex_t drain_mu = PTHREAD_MUTEX_INITIALIZER;

/* One round of drain_unlocks: the first SD_LOCK_STOPS_MAX entries of list, their
 * holders' locks released, their master-list entries removed, then the entries removed
 * (unlock_done.lua). A few calls whatever the number of entries (on a Redis Cluster the
 * locks are holder after holder). *more: the list may hold more. -1 when Redis went
 * away (what is left stays for the next drain). */
static int drain_round(const char *cluster, const char *list, int release_on_stop,
                       int64_t delay_ms, int *more)
{
    *more = 0;
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "LRANGE");
    sd_argv_add(&a, list);
    sd_argv_add(&a, "0");
    sd_argv_addf(&a, "%d", SD_LOCK_STOPS_MAX - 1);
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc != SD_STORE_OK)
        return -1;
    size_t n = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    if (n > SD_LOCK_STOPS_MAX)
        n = SD_LOCK_STOPS_MAX;
    /* "instance stopped_at_ms generation" (without the generation: pushed by an older
     * serverdir); anything else is not ours and only removed */
    char insts[SD_LOCK_STOPS_MAX][SD_NAME_MAX + 1];
    sd_lock_stop_t stops[SD_LOCK_STOPS_MAX];
    const char *names[SD_LOCK_STOPS_MAX];
    int ns = 0;
    for (size_t i = 0; i < n; i++) {
        const char *entry = r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str : "";
        long long stopped_ms = 0, gen = -1;
        if (sscanf(entry, "%128s %lld %lld", insts[ns], &stopped_ms, &gen) < 2)
            continue;
        stops[ns] = (sd_lock_stop_t){insts[ns], stopped_ms, gen};
        names[ns] = insts[ns];
        ns++;
    }
    long long released[SD_LOCK_STOPS_MAX];
    int removed[SD_LOCK_STOPS_MAX];
    if (release_on_stop &&
        sd_lock_release_holders(cluster, ns, stops, delay_ms, released) != SD_STORE_OK) {
        freeReplyObject(r);
        return -1; /* Redis went away: the entries stay for the next drain */
    }
    if (sd_master_forget_instances(cluster, ns, names, removed) != SD_STORE_OK) {
        freeReplyObject(r);
        return -1;
    }
    char proc[512];
    for (int k = 0; k < ns; k++) {
        long long got = release_on_stop ? released[k] : 0;
        if (got > 0) {
            log_info("locks released", "cluster=%s instance=%s count=%lld lock_delay_ms=%lld",
                     cluster, names[k], got, (long long)delay_ms);
            SD_COUNT("serverdir_locks_released_on_stop_total",
                     "Locks freed because the directory recorded their holder stopped", got);
            char num[24];
            snprintf(num, sizeof num, "%lld", got);
            store_cmd3("HINCRBY", sd_key(proc, sizeof proc, cluster, "proc:%s", names[k]),
                       "locks_released", num);
        }
        if (removed[k] > 0) {
            log_info("master entry removed", "cluster=%s instance=%s reason=stopped", cluster,
                     names[k]);
            SD_COUNT("serverdir_master_removed_on_stop_total",
                     "Master-list entries removed because their instance stopped", 1);
        }
    }
    /* Every entry goes, one whose own release or removal failed too (logged where it
     * failed): an entry kept for that would fail again on every drain, and 64 of them at
     * the head would hide the rest of the list. */
    sd_argv_init(&a);
    sd_argv_add(&a, list);
    for (size_t i = 0; i < n; i++)
        sd_argv_add(&a, r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str : "");
    *more = n == SD_LOCK_STOPS_MAX;
    redisReply *x = NULL;
    rc = n ? sd_store_run("unlock_done", 1, &a, &x) : SD_STORE_OK;
    if (!n)
        sd_argv_free(&a);
    if (x)
        freeReplyObject(x);
    freeReplyObject(r); /* after the call: a points into its entries */
    return rc == SD_STORE_OK ? 0 : -1;
}

/* Frees the locks of the instances this cluster's events recorded stopped (docs/locks.md,
 * "Locks die with their holder") and removes the master-list entries their heartbeats
 * linked to them (docs/master.md, "Supervised servers"). events_apply.lua pushes each stop on <base>unlock in
 * the same script as the stop, so the two cannot be separated; here each entry's locks are
 * released (idempotent) and then the entry removed, so a crash in between repeats a
 * release that finds nothing held. The next events of the cluster drain what is left. */
static void drain_unlocks(const char *cluster)
{
    char list[256];
    sd_key(list, sizeof list, cluster, "unlock");
    int release_on_stop;
    int64_t delay_ms;
    if (sd_cluster_stop_locks(cluster, &release_on_stop, &delay_ms))
        return; /* Redis went away: the entries stay for the next drain */
    pthread_mutex_lock(&drain_mu);
    int more = 1;
    for (int round = 0; round < 16 && more; round++)
        if (drain_round(cluster, list, release_on_stop, delay_ms, &more))
            break;
    pthread_mutex_unlock(&drain_mu);
}

/* Reads the script's refusal ("forbidden <batch> <event> <instance> <machine>" or
 * "quota_exceeded <batch> <machine> <limit>", batch 1-based) into why; 0, or -1 when r
 * says something else. */
static int refusal_parse(const redisReply *r, sd_dir_refusal_t *why)
{
    memset(why, 0, sizeof *why);
    if (r->type != REDIS_REPLY_ERROR)
        return -1;
    if (sscanf(r->str, "forbidden %d %d %128s %128s", &why->batch, &why->event, why->instance,
               why->machine) == 4) {
        why->batch--;
        return 0;
    }
    if (sscanf(r->str, "quota_exceeded %d %128s %lld", &why->batch, why->machine,
               &why->limit) == 3) {
        why->batch--;
        why->quota = 1;
        return 0;
    }
    return -1;
}

int sd_dir_events_apply_many(const char *cluster, const sd_dir_batch_t *batches, int n,
                             long long (*counts)[4], sd_dir_refusal_t *why)
{
    char base[256], chan[128];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.event_id_ttl_ms);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.history_max);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.stopped_keep);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.stopped_ttl_ms);
    sd_argv_add(&a, sd_assign_channel(chan, sizeof chan));
    sd_argv_add(&a, cluster);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.live_max);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.live_above);
    for (int i = 0; i < n; i++) {
        sd_argv_add(&a, batches[i].bound);
        sd_argv_add(&a, batches[i].events);
    }
    redisReply *r = NULL;
    int rc = sd_store_run("events_apply", 1, &a, &r);
    if (rc)
        return rc;
    if (!refusal_parse(r, why) && why->batch >= 0 && why->batch < n) {
        freeReplyObject(r);
        return SD_DIR_REFUSED;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 6 + 3 * (size_t)(n - 1)) {
        log_error("unexpected script reply", "script=%s type=%d batches=%d", "events_apply",
                  r->type, n);
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            counts[i][k] = r->element[i ? 6 + 3 * (i - 1) + k : k]->integer;
    if (r->element[3]->integer > 0)
        SD_COUNT("serverdir_allocations_ended_total{state=\"allocation_lost\"}",
                 "allocations ended, by final state", r->element[3]->integer);
    if (r->element[4]->integer > 0)
        SD_COUNT("serverdir_allocations_ended_total{state=\"released\"}",
                 "allocations ended, by final state", r->element[4]->integer);
    int unlock_waiting = r->element[5]->integer > 0;
    freeReplyObject(r);
    long long replicas = -1;
    /* on the connection that ran the batches' script (sd_store_wait). Every call,
     * duplicates too: the resend of a batch answered 503 below waits again */
    if (sd_dir_cfg.wait_replicas > 0 &&
        (rc = sd_store_wait(sd_dir_cfg.wait_replicas, sd_dir_cfg.wait_timeout_ms,
                            &replicas)) != SD_STORE_OK)
        return rc;
    for (int i = 0; i < n; i++)
        counts[i][3] = replicas;
    if (unlock_waiting) /* two round trips saved on every call without a stop */
        drain_unlocks(cluster);
    return SD_STORE_OK;
}

int sd_dir_events_apply(const char *cluster, const char *batch, long long counts[4])
{
    sd_dir_batch_t b = {.events = batch, .bound = ""};
    sd_dir_refusal_t why;
    int rc = sd_dir_events_apply_many(cluster, &b, 1, (long long (*)[4])counts, &why);
    if (rc == SD_DIR_REFUSED) { /* an unbound batch of stops: only a quota past, and stops
                                   never add a live process */
        log_error("events refused", "cluster=%s machine=%s quota=%d", cluster, why.machine,
                  why.quota);
        return SD_STORE_ERROR;
    }
    return rc;
}

/* ---------- stored -> API JSON ---------- */

static const char *flat_get(const redisReply *flat, const char *key)
{
    for (size_t i = 0; i + 1 < flat->elements; i += 2)
        if (flat->element[i]->type == REDIS_REPLY_STRING &&
            strcmp(flat->element[i]->str, key) == 0 &&
            flat->element[i + 1]->type == REDIS_REPLY_STRING)
            return flat->element[i + 1]->str;
    return NULL;
}

static json_t *int_or_null(const char *s)
{
    int64_t v;
    if (!s || sd_parse_i64(s, INT64_MIN, INT64_MAX, &v))
        return json_null();
    return json_integer(v);
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *obj_or_null(const char *s)
{
    json_t *v = s ? json_loads(s, 0, NULL) : NULL;
    return v ? v : json_null();
}

/* Sets o's "reason_text" to its stop reason in the one wording ("killed(signal 9)"), or
 * to null when o has no reason, and "failure" to whether that stop is a failure: the one
 * classification (sdproto.h, SD_STOP_F_FAILURE) that sdctl status and the dashboard show
 * instead of judging reasons themselves. */
static void add_stop_figures(json_t *o)
{
    char text[SD_REASON_TEXT_MAX];
    const char *reason = json_string_value(json_object_get(o, "reason"));
    int r = reason ? sd_stop_reason_parse(reason) : -1;
    if (reason)
        sd_reason_format_json(text, sizeof text, o);
    json_object_set_new(o, "reason_text", reason ? json_string(text) : json_null());
    json_object_set_new(o, "failure",
                        json_boolean(r >= 0 && (sd_stop_reason_flags((sd_stop_reason_t)r) &
                                                SD_STOP_F_FAILURE)));
}

json_t *sd_dir_proc_json(const redisReply *flat, const char *cluster)
{
    static const char *const ints[] = {"pid", "started_at_ms", "ready_at_ms", "stopped_at_ms",
                                       "generation", "restarts", "slot", "code", "signal",
                                       "silent_ms", "updated_at_ms", "locks_released",
                                       "lock_refusals", "lock_refused_at_ms"};
    static const char *const strs[] = {"instance", "machine", "service", "state", "reason",
                                       "detail", "log_tail", "core"};
    json_t *o = json_object();
    for (size_t i = 0; i < SD_ARRAY_LEN(strs); i++)
        json_object_set_new(o, strs[i], str_or_null(flat_get(flat, strs[i])));
    json_object_set_new(o, "cluster", json_string(cluster));
    for (size_t i = 0; i < SD_ARRAY_LEN(ints); i++)
        json_object_set_new(o, ints[i], int_or_null(flat_get(flat, ints[i])));
    json_object_set_new(o, "ports", obj_or_null(flat_get(flat, "ports")));
    add_stop_figures(o);
    return o;
}

json_t *sd_dir_machine_json(const char *name, const redisReply *flat, int64_t now_ms)
{
    int64_t expires = 0;
    const char *e = flat_get(flat, "expires_at_ms");
    if (e)
        sd_parse_i64(e, 0, INT64_MAX, &expires);
    int64_t left = expires - now_ms;
    json_t *o = json_object();
    json_object_set_new(o, "machine", json_string(name));
    json_object_set_new(o, "address", str_or_null(flat_get(flat, "address")));
    json_t *labels = obj_or_null(flat_get(flat, "labels"));
    json_object_set_new(o, "labels", json_is_null(labels) ? (json_decref(labels), json_object()) : labels);
    json_object_set_new(o, "capacity", int_or_null(flat_get(flat, "capacity")));
    json_object_set_new(o, "logs_port", int_or_null(flat_get(flat, "logs_port")));
    json_object_set_new(o, "version", str_or_null(flat_get(flat, "version")));
    json_object_set_new(o, "state", json_string(left > 0 ? "live" : "lost"));
    json_object_set_new(o, "draining", json_boolean(flat_get(flat, "draining") != NULL));
    json_object_set_new(o, "expires_in_ms", json_integer(left > 0 ? left : 0));
    json_object_set_new(o, "ttl_ms", int_or_null(flat_get(flat, "ttl_ms")));
    json_object_set_new(o, "registered_at_ms", int_or_null(flat_get(flat, "registered_at_ms")));
    json_object_set_new(o, "renewed_at_ms", int_or_null(flat_get(flat, "renewed_at_ms")));
    return o;
}

json_t *sd_dir_event_json(const redisReply *entry)
{
    static const char *const ints[] = {"pid", "ts_ms", "slot", "generation", "restarts",
                                       "code", "signal", "silent_ms"};
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING ||
        entry->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL;
    const redisReply *flat = entry->element[1];
    json_t *o = json_object();
    json_object_set_new(o, "seq", json_string(entry->element[0]->str));
    for (size_t i = 0; i + 1 < flat->elements; i += 2) {
        const redisReply *k = flat->element[i], *v = flat->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        int is_int = 0;
        for (size_t n = 0; n < SD_ARRAY_LEN(ints); n++)
            is_int |= strcmp(k->str, ints[n]) == 0;
        if (is_int)
            json_object_set_new(o, k->str, int_or_null(v->str));
        else if (strcmp(k->str, "ports") == 0)
            json_object_set_new(o, k->str, obj_or_null(v->str));
        else
            json_object_set_new(o, k->str, json_string(v->str));
    }
    if (json_object_get(o, "reason"))
        add_stop_figures(o);
    return o;
}

int sd_dir_stream_id_valid(const char *s)
{
    const char *dash = strchr(s, '-');
    size_t n1 = dash ? (size_t)(dash - s) : strlen(s);
    if (n1 == 0 || n1 > 20 || strspn(s, "0123456789") != n1)
        return -1;
    if (!dash)
        return 0;
    size_t n2 = strlen(dash + 1);
    return n2 > 0 && n2 <= 20 && strspn(dash + 1, "0123456789") == n2 ? 0 : -1;
}

/* ---------- the live indexes of before the paged lists ---------- */

#define MIGRATED_MAX 1024

int sd_dir_ensure_index(const char *cluster)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char *done[MIGRATED_MAX];
    static int ndone;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ndone; i++) {
        if (strcmp(done[i], cluster) == 0) {
            pthread_mutex_unlock(&mu);
            return SD_STORE_OK;
        }
    }
    pthread_mutex_unlock(&mu);
    char base[256], cursor[32] = "0";
    sd_key(base, sizeof base, cluster, "%s", "");
    int chunks = 0;
    do {
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, base);
        sd_argv_add(&a, cursor);
        sd_argv_add(&a, "500");
        redisReply *r;
        int rc = sd_store_run("dir_migrate", 1, &a, &r);
        if (rc)
            return rc;
        if (r->type != REDIS_REPLY_STRING) {
            freeReplyObject(r);
            return SD_STORE_ERROR;
        }
        sd_strlcpy(cursor, r->str, sizeof cursor);
        freeReplyObject(r);
        chunks++;
    } while (strcmp(cursor, "0") != 0);
    if (chunks > 1)
        log_info("directory indexes migrated", "cluster=%s chunks=%d", cluster, chunks);
    pthread_mutex_lock(&mu);
    if (ndone < MIGRATED_MAX) {
        char *c = strdup(cluster);
        if (c)
            done[ndone++] = c;
    }
    pthread_mutex_unlock(&mu);
    return SD_STORE_OK;
}

/* ---------- machines lost without a primary ---------- */

long long sd_dir_mark_lost(const char *cluster, const char *machine, const char *idpfx,
                           const char *detail, const char *const *insts,
                           const char *const *svcs, size_t n)
{
    long long applied = 0;
    for (size_t i = 0; i < n;) {
        json_t *events = json_array();
        for (; i < n && json_array_size(events) < SD_EVENTS_MAX; i++) {
            /* The id names the declaration and the instance, so a repeat is a duplicate;
             * names longer than an id allows are hashed. */
            char id[SD_NAME_MAX + 1];
            int len = snprintf(id, sizeof id, "%s.%s", idpfx, insts[i]);
            if (len < 0 || (size_t)len >= sizeof id) {
                uint64_t h = 1469598103934665603ULL;
                for (const char *p = insts[i]; *p; p++)
                    h = (h ^ (unsigned char)*p) * 1099511628211ULL;
                snprintf(id, sizeof id, "%.100s.%016llx", idpfx, (unsigned long long)h);
            }
            json_array_append_new(
                events, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type",
                                  "stopped", "instance", insts[i], "machine", machine,
                                  "service", svcs[i][0] ? svcs[i] : "unknown", "reason",
                                  "machine_lost", "detail", detail));
        }
        json_t *body = json_pack("{s:o}", "events", events);
        char *batch = NULL, err[SD_ERRMSG_MAX];
        size_t nev = 0;
        int rc = sd_dir_events_normalize(body, &batch, &nev, err, sizeof err);
        json_decref(body);
        if (rc) {
            log_error("machine_lost events invalid", "cluster=%s machine=%s err=%s", cluster,
                      machine, err);
            return SD_STORE_ERROR;
        }
        long long counts[4]; /* a short WAIT is not an error here: the primary asks again */
        rc = sd_dir_events_apply(cluster, batch, counts);
        free(batch);
        if (rc)
            return rc;
        applied += counts[0];
    }
    return applied;
}

static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static char *seen[MIGRATED_MAX];
static int nseen;

static int known_locked(const char *cluster)
{
    for (int i = 0; i < nseen; i++)
        if (strcmp(seen[i], cluster) == 0)
            return 1;
    return 0;
}

int sd_dir_cluster_known(const char *cluster)
{
    pthread_mutex_lock(&seen_mu);
    int known = known_locked(cluster);
    pthread_mutex_unlock(&seen_mu);
    return known;
}

int sd_dir_cluster_seen(const char *cluster)
{
    if (sd_dir_cluster_known(cluster))
        return SD_STORE_OK;
    char key[128];
    snprintf(key, sizeof key, "%sclusters", sd_store_prefix());
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "SADD");
    sd_argv_add(&a, key);
    sd_argv_add(&a, cluster);
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return rc;
    freeReplyObject(r);
    pthread_mutex_lock(&seen_mu);
    if (nseen < MIGRATED_MAX && !known_locked(cluster)) {
        char *c = strdup(cluster);
        if (c)
            seen[nseen++] = c;
    }
    pthread_mutex_unlock(&seen_mu);
    return SD_STORE_OK;
}

int sd_dir_clusters_step(char *cursor, size_t cap, int count, redisReply **out)
{
    char key[128];
    snprintf(key, sizeof key, "%sclusters", sd_store_prefix());
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "SSCAN");
    sd_argv_add(&a, key);
    sd_argv_add(&a, cursor);
    sd_argv_add(&a, "COUNT");
    sd_argv_addf(&a, "%d", count);
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    sd_strlcpy(cursor, r->element[0]->str, cap);
    *out = r;
    return SD_STORE_OK;
}
