/* directory/: the process directory, machine leases and the process event history. */
/* The process directory and machine leases (api_machines.c, api_processes.c): the
 * "directory" config section, validation of request bodies, and the conversion of stored
 * Redis hashes and stream entries back to API JSON.
 *
 * Redis layout, all under the cluster's key base "<prefix>{<cluster>}:" (one hash slot):
 *   machine:<m>      hash   lease: address, labels (JSON), capacity, version, ttl_ms,
 *                           registered_at_ms, renewed_at_ms, expires_at_ms (Redis TIME);
 *                           expires machine_keep_ms after the lease ran out
 *   machines         set    machine names
 *   draining         set    machines being drained (cluster.h; shown as "draining")
 *   proc:<instance>  hash   the process record (field `state`: starting|ready|stopped)
 *   live             set    instances starting or ready
 *   live:m:<m>       set    ... on machine m
 *   live:s:<s>       set    ... of service s
 *   stopped          zset   stopped instances by stop time; trimmed to stopped_keep and
 *                           stopped_ttl_ms, the records of trimmed ones are deleted
 *   evid:<id>        string an applied event id, expires after event_id_ttl_ms
 *   events           stream the event history, MAXLEN history_max
 *   series           list   "<ts_ms> <ready> <starting> <desired> <static>" samples
 *                           (the release before wrote the first four), oldest first:
 *                           at most one per series_interval_ms, written when a figure
 *                           changed (each holds until the next); the newest SD_SERIES_MAX
 *                           kept (series_sample.lua)
 * Every change is one Lua script in directory/lua/ (machine_put, machine_delete,
 * events_apply, series_sample); reads use read scripts or single commands. */
#ifndef SD_DIRECTORY_H
#define SD_DIRECTORY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sd.h"

typedef struct {
    int64_t history_max;     /* entries kept in the per-cluster event stream */
    int64_t stopped_keep;    /* stopped process records kept per cluster */
    int64_t stopped_ttl_ms;  /* ... and for at most this long */
    int64_t event_id_ttl_ms; /* how long an applied event id is remembered (>= 24 h) */
    int64_t machine_keep_ms; /* how long a lost machine stays listed */
    int64_t lost_sweep_ms;   /* period of the lost-machine sweep of clusters without a
                                primary; 0: off */
    int64_t series_interval_ms; /* one ready-vs-desired sample per cluster this often; 0: off */
    int64_t wait_replicas;   /* WAIT for this many replicas after a batch that wrote; 0: no */
    int64_t wait_timeout_ms; /* ... for at most this long */
    int64_t live_max;        /* live processes per machine at most (a machine's declared
                                capacity plus live_above, when lower, bounds it):
                                live_processes_per_machine */
    int64_t live_above;      /* live_processes_above_capacity */
} sd_dir_config_t;

#define SD_SERIES_MAX 120 /* samples kept per cluster (two hours of changes at the default
                             interval, one each minute; longer when fewer change) */

extern sd_dir_config_t sd_dir_cfg;

/* Loads the "directory" section of the --config file (NULL: keep the defaults) into
 * sd_dir_cfg, all or nothing. Returns 0, or -1 with a message naming the field in err
 * and sd_dir_cfg unchanged. Called by sd_config_apply. */
int sd_dir_config_load(const json_t *section, char *err, size_t errcap);

/* Validates the body of POST /v1/clusters/{c}/events and builds the input of
 * events_apply.lua: a compact JSON array holding, per event, a flat array of strings
 * [key, value, key, value, ...] (numbers as decimal text; null code/signal left out).
 * Returns 0 with *out (malloc'd, caller frees) and *nevents, or -1 with a message that
 * names the field ("events[3].type must be ..."). */
int sd_dir_events_normalize(const json_t *body, char **out, size_t *nevents, char *err,
                            size_t errcap);

/* Applies a normalized batch (sd_dir_events_normalize) with events_apply.lua: the one
 * path by which process records change (POST .../events, and the primary's
 * POST .../machines/{m}/lost). Returns SD_STORE_OK with counts {accepted, duplicates,
 * stale, replicas}, or a SD_STORE_* error. replicas: with directory.wait_replicas set,
 * how many replicas confirmed the batch (WAIT on the node that ran it, before anything
 * else is sent; a resent batch of duplicates waits too), else -1. */
int sd_dir_events_apply(const char *cluster, const char *batch, long long counts[4]);
/* One batch of sd_dir_events_apply_many: the normalized events, and the machine the
 * sender's token is bound to ("" when none: it may also move an instance between machines). */
typedef struct {
    const char *events;
    const char *bound;
} sd_dir_batch_t;

/* Why events_apply.lua refused a call before any write (SD_DIR_REFUSED): batch `batch`
 * (0-based) named, as its event `event`, an instance the directory records on machine
 * `machine`, not on the machine its token is bound to; or (quota set) it would make a
 * process live on `machine` past its limit of `limit` (live_processes_per_machine). */
typedef struct {
    int batch, event, quota;
    long long limit;
    char instance[SD_NAME_MAX + 1];
    char machine[SD_NAME_MAX + 1];
} sd_dir_refusal_t;
#define SD_DIR_REFUSED (-3) /* beside the SD_STORE_* codes */
#define SD_EVENTS_WAIT_MAX_MS 30000 /* an events long-poll's longest wait */
#define SD_EVENTS_WAITERS_MAX 5000  /* parked events long-polls at once, per copy */

/* sd_dir_events_apply for n batches (n >= 1) in one call, applied in order: counts[i] for
 * batches[i] (replicas the same for all). SD_DIR_REFUSED with *why filled when a batch
 * broke ownership or the quota (nothing written; the others may go again without it). On
 * another error nothing says which batch caused it (a malformed one stops the call before
 * any write). */
int sd_dir_events_apply_many(const char *cluster, const sd_dir_batch_t *batches, int n,
                             long long (*counts)[4], sd_dir_refusal_t *why);

/* Validates the body of PUT .../machines/{m} (NULL or {} allowed) and appends to a the
 * lease ttl_ms and the given fields as field/value pairs (labels as compact JSON).
 * Returns 0, or -1 with a message naming the field. */
int sd_dir_machine_args(const json_t *body, sd_argv_t *a, char *err, size_t errcap);

/* A process record from a flat HGETALL reply (field, value, ...) as API JSON. */
json_t *sd_dir_proc_json(const redisReply *flat, const char *cluster);
/* A machine from its HGETALL reply and the Redis time now_ms, as API JSON. */
json_t *sd_dir_machine_json(const char *name, const redisReply *flat, int64_t now_ms);
/* One stream entry (id + flat field list) of the event history as API JSON. */
json_t *sd_dir_event_json(const redisReply *entry);
/* The events answer {events, last} of cluster: after since (oldest first, at most limit),
 * or without since the newest limit (newest last); into *out (new reference). A
 * SD_STORE_* code. Any thread (its own Redis connection). */
int sd_dir_events_read(const char *cluster, const char *since, int64_t limit, json_t **out);
/* Parks req until cluster's history has an event after since or wait_ms pass (or
 * serverdir stops), then answers like sd_dir_events_read (events_wait.c). 429 when
 * SD_EVENTS_WAITERS_MAX requests wait already. */
void sd_events_park(sd_req_t *req, sd_resp_t *resp, const char *cluster, const char *since,
                    int64_t limit, int64_t wait_ms);

/* Parses a stream id "ms" or "ms-seq" (the `since` cursor). 0 if valid. */
int sd_dir_stream_id_valid(const char *s);
/* Makes sure cluster's live directory has the sorted-set indexes of the paged lists
 * (dir_migrate.lua, in chunks of 500, once per cluster and serverdir copy). A
 * SD_STORE_* code. */
int sd_dir_ensure_index(const char *cluster);
/* Marks the given live instances of machine stopped with reason machine_lost through
 * events_apply (batches of SD_EVENTS_MAX). Event ids are "<idpfx>.<instance>", so a
 * repeat is a duplicate. insts/svcs: n names each. Returns the number applied or a
 * SD_STORE_* error. */
long long sd_dir_mark_lost(const char *cluster, const char *machine, const char *idpfx,
                           const char *detail, const char *const *insts,
                           const char *const *svcs, size_t n);
/* Remembers cluster in <prefix>clusters (the sweep's list); a SD_STORE_* code. */
int sd_dir_cluster_seen(const char *cluster);
/* 1 when this copy recorded cluster already (sd_dir_cluster_seen makes no call then). */
int sd_dir_cluster_known(const char *cluster);

/* One SSCAN step of COUNT count over the set of clusters that have had a machine lease
 * (Pclusters), from cursor (updated in place; "0" when the walk is done). *out is the
 * reply, {cursor, [names]} (caller frees). A SD_STORE_* code. */
int sd_dir_clusters_step(char *cursor, size_t cap, int count, redisReply **out);

#endif
