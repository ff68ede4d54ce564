/* locks/: the lock table and the fenced blob store, with the bounded lock wait. */
/* The lock table and the fenced blob store (docs/locks.md explains the model): locks.c
 * holds the configuration, key names, request parsers, script calls and the bounded
 * wait; api_locks.c and api_blobs.c are the HTTP handlers. */
#ifndef SD_LOCKS_H
#define SD_LOCKS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "group.h"
#include "sd.h"

/* Largest lock_seq / Blob-Seq accepted: 2^53, exact in Redis's Lua numbers. */
#define SD_SEQ_MAX ((int64_t)1 << 53)
/* Keys per all-or-nothing acquire or release. */
#define SD_LOCKS_MAX_KEYS 16
/* Cap of wait_ms. A waiting acquire is parked (its worker thread goes on serving) on the
 * park thread, bounded by max_waiters. */
#define SD_LOCKS_WAIT_CAP_MS 30000

/* Longest lease (ttl_ms). */
#define SD_LOCKS_TTL_MAX_MS (24LL * 3600 * 1000)

/* An acquire request: the names and strings point into the request's JSON body. */
typedef struct {
    const char *holder;
    const char *names[SD_LOCKS_MAX_KEYS];
    int n;
    int64_t ttl_ms, wait_ms, steal_older_ms; /* 0: not given */
    const char *steal_cluster;               /* "": not given */
    /* A steal (either kind) takes only from a holder that is a process of this cluster's
     * directory: the caller's cluster unless it is ops (acquire_allowed); "": anywhere. */
    const char *steal_within;
    const sd_auth_t *auth; /* the caller (its credential's liveness rides in the script);
                              NULL: none. The request outlives a parked wait. */
    /* per key, the lock_token the caller presents (NULL: none): its grant's, to acquire
     * again, or one of its own for a new grant, so that a retry is recognised */
    const char *tokens[SD_LOCKS_MAX_KEYS];
} sd_lock_req_t;

/* Validates an acquire body: PUT /v1/locks/{key} (many = 0; the key comes from the path
 * and is not filled in) or POST /v1/locks/acquire (many = 1; "keys" required, 1 to
 * SD_LOCKS_MAX_KEYS distinct names). Returns 0, or -1 with the error code ("bad_field"
 * or "bad_name") in *code and a message naming the field in err. */
int sd_lock_req_parse(const json_t *body, int many, sd_lock_req_t *a, const char **code,
                      char *err, size_t errcap);
/* A release: the holder and, per key, the grant it presents (lock_seq and lock_token). The
 * strings point into the request. */
typedef struct {
    const char *holder;
    const char *names[SD_LOCKS_MAX_KEYS];
    int64_t seqs[SD_LOCKS_MAX_KEYS];
    const char *tokens[SD_LOCKS_MAX_KEYS];
    int n;
    const sd_auth_t *auth; /* the caller (its credential's liveness rides in the script) */
} sd_lock_rel_t;

/* Validates a POST /v1/locks/release body {holder, keys, lock_seqs:{key: n},
 * lock_tokens:{key: token}} into rel. Same error convention. */
int sd_lock_release_parse(const json_t *body, sd_lock_rel_t *rel, const char **code, char *err,
                          size_t errcap);

/* The "locks" section of serverdir's --config. */
typedef struct {
    int64_t lock_delay_ms;   /* after a forced unlock or an expiry; never after a release */
    int64_t wait_replicas;   /* WAIT for this many replicas after a grant (0: do not) */
    int64_t wait_timeout_ms; /* ... for at most this long, else 503 */
    int64_t max_wait_ms;     /* cap of a request's wait_ms (<= SD_LOCKS_WAIT_CAP_MS) */
    int64_t max_waiters;     /* acquires waiting at once (parked) */
    int64_t retain_s;        /* how long a released lock's record (and lock_seq) is kept */
    int release_on_stop;     /* free the locks of an instance the directory records stopped */
    int64_t stop_lock_delay_ms; /* ... with this lock-delay (0: none) */
} sd_locks_cfg_t;

extern sd_locks_cfg_t sd_locks_cfg;

/* Loads the "locks" section of the --config file (NULL: keep the defaults) into
 * sd_locks_cfg, all or nothing. Returns 0, or -1 with a message naming the field in err
 * and sd_locks_cfg unchanged. Called by sd_config_apply. */
int sd_locks_config_load(const json_t *section, char *err, size_t errcap);
/* Logs the lock table's settings (once, at start). */
void sd_locks_log_config(void);

/* ---- script calls: each returns a SD_STORE_* code and on success *out, a reply the
 * caller frees with freeReplyObject (the reply shapes are in each script's header) ---- */

/* lock_acquire.lua once for a's keys, with the lock_token presented for each key or else
 * a fresh one drawn: sd_lock_acquire_prepare, the call, sd_lock_acquire_after. */
int sd_lock_acquire(const sd_lock_req_t *a, redisReply **out);
/* The arguments of lock_acquire.lua for a into av (initialized here; its first *nkeys
 * entries are the KEYS), drawing a fresh lock_token for each key a presents none for. On
 * a Redis Cluster it first adds a's names to the holder's index (added[i] = 1 for those it
 * added: SD_LOCKS_MAX_KEYS bytes) and reads what the script cannot. A SD_STORE_* code; on
 * failure av is freed and the index entries it added are gone again. */
int sd_lock_acquire_prepare(const sd_lock_req_t *a, sd_argv_t *av, int *nkeys,
                            unsigned char *added);
/* After the call of an acquire prepared with added (rc, and its reply r when rc is
 * SD_STORE_OK; r stays the caller's): on a Redis Cluster the index entries added for a
 * refusal go again, and a stolen key leaves its previous holder's index. */
void sd_lock_acquire_after(const sd_lock_req_t *a, int rc, const redisReply *r,
                           const unsigned char *added);
/* The arguments of lock_release.lua (release each key of rel with the grant presented
 * for it) into av (initialized here; its first *nkeys entries are the KEYS). */
void sd_lock_release_prepare(const sd_lock_rel_t *rel, sd_argv_t *av, int *nkeys);
/* After the call of a release (rc, r as sd_lock_acquire_after): on a Redis Cluster the
 * released names leave the holder's index. */
void sd_lock_release_after(const sd_lock_rel_t *rel, int rc, const redisReply *r);
/* The arguments of lock_renew.lua into av (initialized here; one KEY, the lock record):
 * renew name for holder with the grant (seq, token), for ttl_ms (0: the last lease's
 * length). A SD_STORE_* code (reading a stopped holder on a Redis Cluster); on failure av
 * is freed. */
int sd_lock_renew_prepare(const char *name, const char *holder, int64_t seq,
                          const char *token, int64_t ttl_ms, const sd_auth_t *auth,
                          sd_argv_t *av);
/* lock_get.lua: the record of name. */
int sd_lock_get(const char *name, redisReply **out);
/* lock_force.lua: forced unlock of name, starting the lock-delay. */
int sd_lock_force(const char *name, redisReply **out);
/* lock_list.lua: a page of about max locks held by holder, from cursor ("0": the start);
 * the reply's first element is the next cursor ("0": complete). */
int sd_lock_list(const char *holder, int max, const char *cursor, redisReply **out);
/* sd_lock_list on a Redis Cluster (the index and the records live in different slots):
 * appends the page to locks as {key, lock_seq, since_ms, expires_in_ms} and leaves the
 * next cursor in cursor ("0": complete). A SD_STORE_* code. */
int sd_lock_list_cluster(const char *holder, int max, char *cursor, size_t cap, json_t *locks);
/* What a recorded stop does to an instance's locks in cluster: release them (*release)
 * with this lock-delay (*delay_ms): the cluster's settings (PUT .../settings) over the
 * serverdir-wide `locks` configuration. A SD_STORE_* code (the defaults are set even
 * then). */
int sd_cluster_stop_locks(const char *cluster, int *release, int64_t *delay_ms);
/* One recorded stop of the directory's hand-off list (directory.c, drain_unlocks). */
typedef struct {
    const char *holder;  /* the instance */
    int64_t stopped_ms;  /* when it stopped */
    int64_t generation;  /* the stopped run (-1: not said) */
} sd_lock_stop_t;
#define SD_LOCK_STOPS_MAX 64 /* stops per call of lock_release_holder_many.lua */
/* lock_release_holder.lua for n stops (at most SD_LOCK_STOPS_MAX, else SD_STORE_ERROR and
 * nothing done) of cluster's instances: frees the locks of each stop's holder with the
 * lock-delay delay_ms (0: none, a waiter is woken at once): every lock it holds while the
 * directory records no newer run, else those granted at or before stopped_ms. On one
 * Redis one call of lock_release_holder_many.lua; on a Redis Cluster holder after holder
 * (their keys are in slots of their own). released[i]: the locks stop i's holder had freed, or -1 when its
 * own release failed (logged). A SD_STORE_* code: not SD_STORE_OK when Redis went away
 * or refused the call (then the stops from the first unanswered one on are -1, and the
 * drain keeps their entries for the next one). */
int sd_lock_release_holders(const char *cluster, int n, const sd_lock_stop_t *stops,
                            int64_t delay_ms, long long *released);
/* After a grant or a save: WAIT for sd_locks_cfg.wait_replicas replicas (nothing when 0).
 * 0 when reached, else -1 with the 503 replication_timeout (or store error) in resp. */
int sd_locks_wait_acked(sd_resp_t *resp);
/* One bounded walk over the lock records from cursor ("" or "0": the start; else one
 * this call left there): appends to locks up to limit held locks as {key, holder,
 * lock_seq, since_ms, expires_in_ms} and leaves in cursor (cap bytes) where to go on
 * ("": the walk is complete). A SD_STORE_* code. */
int sd_lock_scan(char *cursor, size_t cap, size_t limit, json_t *locks);

/* ---- the group commit of the lock path (batch.c) ----
 * Acquires, renewals, releases and blob saves are one script call each, most of whose
 * cost is per call (the round trip, EVALSHA's start, the script's closures): requests
 * that arrive while SD_LOCK_CALLS calls of their script are in flight share the next call
 * (http/group.h), through the script's batch form <name>_many.lua, in which each request
 * is an item with its own KEYS, ARGV and reply. Every request is handed to its script's
 * workers, so no HTTP thread waits on Redis for the lock path. A job carries one
 * prepared script call; calls share only within one Redis Cluster slot and within the
 * group's budgets. */
#define SD_LOCK_CALLS 2       /* calls in flight per script: saves; the lock scripts on a cluster */
#define SD_LOCK_GROUP_MAX 32  /* requests per call at most */
#define SD_LOCK_GROUP_KEYS 64 /* weight per call at most: lock keys, or blob data in 4 KiB */

/* Calls in flight per lock script (acquire, release, renew): SD_LOCK_CALLS on a Redis
 * Cluster, whose nodes run calls side by side; 1 on one Redis, where the acquire and the
 * release of a login already keep two calls in flight and a third or fourth only makes
 * the batches smaller (bench/README.md, "serverdir's own CPU per pair, and one lock call
 * in flight"). */
int sd_lock_script_calls(void);

typedef struct {
    sd_group_job_t g;  /* first: the group's link and request */
    char slot[8];      /* the Redis Cluster slot of its keys ("" elsewhere) */
    long weight;       /* >= 1 */
    int nkeys;         /* the script's KEYS: the first nkeys entries of av */
    sd_argv_t av;      /* prepared by the caller; freed by the call */
    int rc;            /* after the call: a SD_STORE_* code */
    redisReply *r;     /* ... and with SD_STORE_OK the item's own reply (the finish frees it) */
} sd_lock_call_t;

/* A lock-path group (http/group.h) named after its script: SD_LOCK_CALLS calls in flight
 * (calls_at_start, when not NULL, decides at first use), at most SD_LOCK_GROUP_MAX
 * requests and SD_LOCK_GROUP_KEYS of weight a call, requests keyed by their slot. */
#define SD_LOCK_GROUP(script, at_start, call_fn, finish_fn)                                 \
    {.name = script, .calls = SD_LOCK_CALLS, .calls_at_start = at_start,                  \
     .jobs_max = SD_LOCK_GROUP_MAX, .weight_max = SD_LOCK_GROUP_KEYS,                     \
     .key = sd_lock_call_key, .weight = sd_lock_call_weight, .call = call_fn,             \
     .finish = finish_fn, SD_GROUP_STATE}

/* Completes c after its av is prepared: its slot (from KEYS[1]) and weight. */
void sd_lock_call_ready(sd_lock_call_t *c, long weight);
/* The group callbacks every lock-path group shares: the key (the slot), the weight. */
const char *sd_lock_call_key(const sd_group_job_t *j);
long sd_lock_call_weight(const sd_group_job_t *j);
/* One call of script for jobs[0..n) (each an sd_lock_call_t): alone with the script, or
 * together with its batch form; each job gets its own rc and reply. A call Redis refuses
 * as a whole is made again item by item, so one item never fails another. Counts the
 * calls and items (serverdir_lock_script_calls_total, ..._items_total). */
void sd_lock_calls_run(const char *script, sd_group_job_t **jobs, int n);

/* ---- the bounded wait of a refused acquire ---- */

/* Answers an acquire from its last script reply r (stolen), waited_ms after it began. */
typedef void (*sd_lock_finish_fn)(const sd_lock_req_t *a, int many, redisReply *r,
                                  int64_t waited_ms, sd_resp_t *resp);
/* Parks req after a refusal (lock_held or lock_delayed) of a, which began at start_ms
 * (http/park.h): retries as the refused key is released, its lease or lock-delay ends,
 * or a slice passes, until granted, refused otherwise, a->wait_ms has passed or
 * serverdir stops; then answers through finish (a store error directly) and resumes req.
 * Answers 429 at once when max_waiters acquires wait already. a's strings are copied. */
void sd_lock_park(const sd_lock_req_t *a, int many, int64_t start_ms, sd_req_t *req,
                  sd_resp_t *resp, sd_lock_finish_fn finish);

/* Fields per granted key in an ok reply of lock_acquire.lua (after status and now). */
#define SD_LOCK_GRANT_FIELDS 7

/* Parses a Lock-Seq or Blob-Seq header value: decimal digits only, 1..SD_SEQ_MAX.
 * Returns 0, or -1 when the value is garbled or out of range. */
int sd_seq_parse(const char *s, int64_t *out);

/* Answers 409 fenced for a grant of name that is no longer current (op: "save", "read",
 * "renew" or "release", the metric's label): it says nothing else, neither the current
 * lock_seq nor the holder. */
void sd_lock_fenced(sd_resp_t *resp, const char *op, const char *name);
/* Whether reply r is a script's {'holder_stopped', reason, stopped_at_ms} (the directory
 * records holder stopped: it may neither acquire, renew nor save): then answers 409
 * holder_stopped naming the instance, its stop reason and time, counts the refusal and
 * returns 1. */
int sd_lock_holder_stopped_reply(const redisReply *r, const char *holder, sd_resp_t *resp);
/* Reads the Lock-Token header into *token. Returns 0, or -1 after answering 400
 * missing_lock_token / bad_lock_token. */
int sd_lock_token_header(const sd_req_t *req, sd_resp_t *resp, const char **token);

/* Whether the records of names share one Redis Cluster slot (always on standalone Redis
 * and Sentinel): several keys in one call must, on a cluster (400 cross_slot). */
int sd_lock_names_one_slot(const char *const *names, int n);
/* The request's first path parameter as a lock or blob key name (sd_lock_name_valid);
 * -1 with a 400 bad_name in resp. */
int sd_req_lock_name(const sd_req_t *req, sd_resp_t *resp, const char *what, const char **out);
/* The name in a lock or blob record key (after its nslen-byte "<prefix>lock:"), without
 * the "{=...}" a cluster wraps an untagged name in. Returns buf. */
const char *sd_lock_name_of(char *buf, size_t cap, const char *key, size_t nslen);
/* "<prefix>lock:<name>" and "<prefix>blob:<name>" into buf. */
const char *sd_lock_key(char *buf, size_t cap, const char *name);
const char *sd_blob_key(char *buf, size_t cap, const char *name);

#endif
