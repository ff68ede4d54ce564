/* libsdclient: the C client of the ServerDir REST API (libcurl + jansson).
 *
 * A client holds several base URLs, shuffled once at creation; a request goes to the
 * last URL that worked and fails over to the next one on a connection error or a 5xx
 * answer. A client object is not thread-safe: use one per thread (it keeps its
 * connections alive between requests).
 *
 * Every function returns SDC_OK (0) or a negative SDC_E_* value; on SDC_E_HTTP the
 * sdc_err_t says the HTTP status and ServerDir's error code and message. */
#ifndef SDCLIENT_H
#define SDCLIENT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sdproto.h" /* SD_NAME_MAX, SD_LOCK_TOKEN_LEN */

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SDC_OK = 0,
    SDC_E_TRANSPORT = -1, /* no base URL answered (connect error, timeout) */
    SDC_E_HTTP = -2,      /* ServerDir answered with an error status: see sdc_err_t */
    SDC_E_PROTO = -3,     /* the answer was not the JSON expected */
    SDC_E_INVAL = -4,     /* bad argument (name, URL list) */
    SDC_E_NOMEM = -5,
};

typedef struct sdc sdc_t;

typedef struct {
    long status;          /* HTTP status, 0 when no answer */
    char code[64];        /* error.code from ServerDir, e.g. "lock_held" */
    char message[256];    /* error.message, or a transport error text */
    json_t *body;         /* the whole error body (owned by the sdc_err_t; sdc_err_clear) */
} sdc_err_t;

/* urls: comma-separated base URLs ("http://a:7700,http://b:7700"); token may be NULL.
 * timeout_ms bounds each attempt. Returns NULL on a bad URL list or no memory. */
sdc_t *sdc_new(const char *urls, const char *token, int timeout_ms);
void sdc_free(sdc_t *c);
/* Replaces the bearer token of the next requests (NULL or "": none), e.g. with a renewed
 * instance credential. SDC_OK, or SDC_E_NOMEM (the old token stays). */
int sdc_set_token(sdc_t *c, const char *token);
/* The base URL the next request goes to first. */
const char *sdc_current_url(const sdc_t *c);
void sdc_err_clear(sdc_err_t *err);
/* A one-line description of a failed call ("409 lock_held: ..." or the transport error). */
const char *sdc_strerror(int rc, const sdc_err_t *err, char *buf, size_t cap);

/* Generic JSON request: path is URL-relative ("/v1/..."); body may be NULL (not stolen).
 * On 2xx sets *out to the parsed body (NULL for an empty body; caller decrefs). */
int sdc_request(sdc_t *c, const char *method, const char *path, const json_t *body,
                json_t **out, sdc_err_t *err);

/* Raw request for byte bodies (blobs): extra request headers "Name: value" (NULL-
 * terminated), response bytes in *out (malloc'd, caller frees) and, when hdr_name is
 * given, that response header's value copied into hdr_value. */
int sdc_request_raw(sdc_t *c, const char *method, const char *path,
                    const char *const *headers, const void *body, size_t len, void **out,
                    size_t *outlen, const char *hdr_name, char *hdr_value, size_t hdr_cap,
                    sdc_err_t *err);

/* GETs an absolute url (not below the ServerDir base URLs: a bigbrother's logs port) with
 * the client's bearer token, handing the body to out(data, len, arg) as it arrives (out
 * returns len to go on, anything else to stop: then SDC_OK). timeout_ms 0: none (a
 * follow). SDC_OK after a 2xx; SDC_E_HTTP with err->status and the answer's text as
 * err->message; SDC_E_TRANSPORT. */
int sdc_stream(sdc_t *c, const char *url, int timeout_ms,
               size_t (*out)(const char *, size_t, void *), void *arg, sdc_err_t *err);

/* Percent-escapes s for use as one URL path segment or query value into buf. */
const char *sdc_escape(const char *s, char *buf, size_t cap);

/* ---- machines, processes and events ---- */

/* A machine lease registration or renewal. Unset fields (NULL, capacity < 0,
 * ttl_ms 0) are left out: ServerDir keeps what it stored (ttl_ms defaults to 15000). */
typedef struct {
    const char *address;   /* host name or IP the machine is reached at */
    const json_t *labels;  /* object of name -> string, or NULL */
    int capacity;          /* >= 0, or -1 for unset */
    const char *version;
    int ttl_ms;            /* 1000..300000, or 0 for the default */
    int logs_port;         /* where bigbrother serves its instances' logs, or 0 for unset */
} sdc_machine_lease_t;

/* PUT /v1/clusters/{cluster}/machines/{machine}. lease may be NULL (a bare renewal).
 * On success *expires_in_ms (if given) is the lease time left and *registered_at_ms (if
 * given) when this registration began (ServerDir's clock, 0 when the answer has none): it
 * changes when the lease had run out, so the machine may have been declared lost
 * meanwhile. */
int sdc_machine_put(sdc_t *c, const char *cluster, const char *machine,
                    const sdc_machine_lease_t *lease, int64_t *expires_in_ms,
                    int64_t *registered_at_ms, sdc_err_t *err);
/* GET .../machines, every page: *out is {"machines":[...]} in name order (caller
 * decrefs). */
int sdc_machines_list(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err);
/* GET .../machines/{machine}: *out is the machine object. 404 -> SDC_E_HTTP. */
int sdc_machine_get(sdc_t *c, const char *cluster, const char *machine, json_t **out,
                    sdc_err_t *err);
/* DELETE .../machines/{machine} (ops). */
int sdc_machine_delete(sdc_t *c, const char *cluster, const char *machine, sdc_err_t *err);

/* POST .../events with `events`, a JSON array of 1..SD_EVENTS_MAX (sdproto.h: 1000)
 * event objects (not stolen; see the events contract). accepted/duplicates may be NULL.
 * Safe to retry: ServerDir counts an already applied event id as a duplicate. */
int sdc_events_post(sdc_t *c, const char *cluster, const json_t *events, int *accepted,
                    int *duplicates, sdc_err_t *err);

/* Filters of sdc_processes_list; NULL means any. state NULL: starting and ready. */
typedef struct {
    const char *machine;
    const char *service;
    const char *state;     /* "starting", "ready" or "stopped" */
} sdc_proc_filter_t;

/* GET .../processes, one page: *out is {"processes":[...],"total":N,"truncated":bool,
 * "next":cursor|null}; after: the previous page's next (NULL or "" for the first), limit
 * 1..5000 (0: the server's default, 500). */
int sdc_processes_page(sdc_t *c, const char *cluster, const sdc_proc_filter_t *filter,
                       const char *after, int limit, json_t **out, sdc_err_t *err);
/* Every page of GET .../processes (at most 1,000,000 records): *out is
 * {"processes":[...],"total":N,"truncated":bool}. */
int sdc_processes_list(sdc_t *c, const char *cluster, const sdc_proc_filter_t *filter,
                       json_t **out, sdc_err_t *err);
/* GET .../processes/{instance}: *out is the process record. */
int sdc_process_get(sdc_t *c, const char *cluster, const char *instance, json_t **out,
                    sdc_err_t *err);
/* POST .../machines/{machine}/instances/{instance}/credential (bigbrother, ops): a signed
 * credential (a JWT of at most SDC_CREDENTIAL_MAX bytes) naming the instance, for the game
 * process to present as its bearer token (docs/operations.md, "Security"). generation < 0
 * is not sent; otherwise ServerDir refuses with 409 generation_mismatch when the directory
 * records another one. *jwt (malloc'd, caller frees; NULL on failure) and *expires_in_ms
 * (may be NULL), the time it stays valid. 404 no_such_instance, 403 forbidden (another
 * machine's instance), 409 instance_stopped come back as SDC_E_HTTP. */
#define SDC_CREDENTIAL_MAX 4096
int sdc_instance_credential(sdc_t *c, const char *cluster, const char *machine,
                            const char *instance, int64_t generation, char **jwt,
                            int64_t *expires_in_ms, sdc_err_t *err);
/* GET .../events: history entries after `since` (NULL: the newest), at most limit
 * (0: the server default of 100), newest last. *out is {"events":[...],"last":seq}. */
int sdc_events_list(sdc_t *c, const char *cluster, const char *since, int limit,
                    json_t **out, sdc_err_t *err);
/* The same after since (required), waiting up to wait_ms (1..30000) for an event when
 * there is none yet (serverdir's long-poll): *out may hold no event when the wait ended.
 * The client's timeout must be longer than wait_ms. */
int sdc_events_wait(sdc_t *c, const char *cluster, const char *since, int limit, int wait_ms,
                    json_t **out, sdc_err_t *err);

/* ---- locks and blobs ---- */

/* The lock table and the fenced blob store (docs/locks.md). A holder is a lock id, usually
 * the game process's instance id. Every grant carries a lock_seq (the public fencing
 * number) and a lock_token (a secret only the holder learns): keep the sdc_lock_t and
 * pass it to release, renew and blob saves. A waiting acquire (wait_ms) is
 * answered after up to wait_ms, so create the client with timeout_ms above it. */

typedef struct {
    int64_t ttl_ms;                      /* lease; 0: no expiry */
    int64_t wait_ms;                     /* wait for a release up to this long; 0: do not */
    const char *steal_if_holder_stopped; /* cluster name: take over a holder the directory
                                            knows is stopped; NULL: never */
    int64_t steal_if_older_than_ms;      /* take over a lock held this long; 0: never */
    const char *lock_token;              /* the lock_token of the grant already held, to
                                            acquire again (extend it, learn its lock_seq);
                                            NULL: a new grant */
} sdc_lock_opts_t;

typedef struct {
    char key[SD_NAME_MAX + 1];
    int64_t lock_seq;
    char lock_token[SD_LOCK_TOKEN_LEN + 1]; /* the grant's secret: never log it */
    int64_t since_ms;       /* when the holder got it (Redis time, ms since the epoch) */
    int64_t expires_in_ms;  /* -1: no expiry */
    int reacquired;         /* the holder already held it: same lock_seq */
    char stolen_from[SD_NAME_MAX + 1]; /* "" unless taken over from another holder */
} sdc_lock_t;

typedef struct {
    char key[SD_NAME_MAX + 1];
    int held;               /* 0: free */
    char holder[SD_NAME_MAX + 1]; /* "" when free */
    int64_t lock_seq;       /* the last granted one; 0 when the key has no record */
    int64_t since_ms, held_for_ms;
    int64_t expires_in_ms;  /* -1: no expiry or free */
    int64_t lock_delay_ms;  /* free but blocked for this long after a forced unlock/expiry */
} sdc_lock_info_t;

/* Acquires key for holder (opts may be NULL). 409 lock_held / lock_delayed come back as
 * SDC_E_HTTP with err->code set (err->body names the holder). The grant is a capability:
 * a holder acquiring again presents its grant's lock_token (opts->lock_token), else it is
 * refused like anyone else (409 lock_held). For a new grant the library draws the token
 * itself and presents it, so a request retried after a lost answer gets its own grant
 * back (reacquired) rather than a refusal. */
int sdc_lock_acquire(sdc_t *c, const char *key, const char *holder, const sdc_lock_opts_t *opts,
                     sdc_lock_t *out, sdc_err_t *err);
/* Acquires n keys (1..16) all or nothing; out[i] is filled for keys[i]. */
int sdc_lock_acquire_many(sdc_t *c, const char *const *keys, int n, const char *holder,
                          const sdc_lock_opts_t *opts, sdc_lock_t *out, sdc_err_t *err);
/* Releases the lock of a grant (else 409 not_holder, stale_lock_seq or fenced). */
int sdc_lock_release(sdc_t *c, const sdc_lock_t *lock, const char *holder, sdc_err_t *err);
/* Releases the n locks (their key, lock_seq and lock_token) all or nothing. */
int sdc_lock_release_many(sdc_t *c, const sdc_lock_t *locks, int n, const char *holder,
                          sdc_err_t *err);
/* Renews the lease of a grant (ttl_ms 0: the length granted last); *expires_in_ms may be
 * NULL. */
int sdc_lock_renew(sdc_t *c, const sdc_lock_t *lock, const char *holder, int64_t ttl_ms,
                   int64_t *expires_in_ms, sdc_err_t *err);
/* Inspects one lock; *raw (may be NULL) gets the JSON answer (caller decrefs). */
int sdc_lock_get(sdc_t *c, const char *key, sdc_lock_info_t *out, json_t **raw,
                 sdc_err_t *err);
/* The locks holder holds (every page): *out is {holder, locks:[{key, lock_seq, since_ms,
 * expires_in_ms}]} in no particular order (caller decrefs). */
int sdc_lock_list_by_holder(sdc_t *c, const char *holder, json_t **out, sdc_err_t *err);
/* Every held lock, page after page, at least max of them when there are that many: *out is
 * {locks:[{key, holder, lock_seq, since_ms, expires_in_ms}], truncated?} (caller decrefs). */
int sdc_lock_list(sdc_t *c, size_t max, json_t **out, sdc_err_t *err);
/* Forced unlock (ops token). *out (may be NULL) gets {key, previous_holder, lock_seq, ...}. */
int sdc_lock_force_unlock(sdc_t *c, const char *key, json_t **out, sdc_err_t *err);

/* Reads the blob of key: *data (malloc'd, caller frees; NUL-terminated beyond len) and its
 * Blob-Seq. With lock (the grant of the same key) the reader proves it holds the lock
 * (409 fenced otherwise) and its lock_seq is stamped on the blob; NULL reads without it.
 * A missing blob is SDC_E_HTTP, code no_blob. */
int sdc_blob_get(sdc_t *c, const char *key, const sdc_lock_t *lock, void **data, size_t *len,
                 int64_t *blob_seq, sdc_err_t *err);
/* Saves the blob of lock->key under the grant lock with a blob_seq greater than the
 * stored one (by at most 2^32); refused with 409 fenced or stale_seq, 400 blob_seq_jump
 * (nothing changed), 413 when too large. */
int sdc_blob_put(sdc_t *c, const sdc_lock_t *lock, int64_t blob_seq, const void *data,
                 size_t len, sdc_err_t *err);
/* Deletes the blob of key (ops token): the repair of a damaged blob. *out (may be NULL)
 * gets {key, blob_seq, bytes, deleted}. */
int sdc_blob_delete(sdc_t *c, const char *key, json_t **out, sdc_err_t *err);

/* ---- master list ---- */

/* What a game server announces; NULL strings and a zero ntags are left out. */
typedef struct {
    int port;                   /* the game port (the IP is the caller's) */
    const char *game;           /* required */
    const char *map, *name, *region, *version;
    const char *const *tags;
    int ntags;
    int players, max_players, bots;
    int password;
    int protocol, gametype;     /* -1: not sent */
    const char *cluster, *instance; /* a supervised server's (both or neither): its stop,
                                       recorded by the directory, removes the entry */
} sdc_master_server_t;

/* Asks for a challenge bound to the caller's address (POST /v1/master/challenge); copies
 * it into chal (at least 40 bytes) and its lifetime into *expires_in_ms (may be NULL). */
int sdc_master_challenge(sdc_t *c, char *chal, size_t cap, int64_t *expires_in_ms,
                         sdc_err_t *err);
/* Lists or keeps listed the server with a challenge from sdc_master_challenge
 * (POST /v1/master/heartbeat). *expires_in_ms (may be NULL): how long it stays listed. */
int sdc_master_heartbeat(sdc_t *c, const char *challenge, const sdc_master_server_t *s,
                         int64_t *expires_in_ms, sdc_err_t *err);
/* Both steps: a fresh challenge, then the heartbeat (what a game server calls every
 * heartbeat interval). */
int sdc_master_announce(sdc_t *c, const sdc_master_server_t *s, int64_t *expires_in_ms,
                        sdc_err_t *err);
/* sdc_master_announce that also copies the address the master lists the server under
 * ("ip:port" as the master saw the connection, at most 64 bytes) into addr (addr may be
 * NULL): the address sdc_master_terminate takes. */
int sdc_master_announce_addr(sdc_t *c, const sdc_master_server_t *s, char *addr,
                             size_t addrcap, int64_t *expires_in_ms, sdc_err_t *err);
/* Removes the caller's server "ip:port" at once (DELETE /v1/master/servers/{addr}). */
int sdc_master_terminate(sdc_t *c, const char *addr, sdc_err_t *err);

typedef struct {
    const char *game, *map, *region;
    const char *tags;           /* comma-separated, all required */
    int not_empty, not_full, no_password;
} sdc_master_filter_t;

/* One batch of GET /v1/master/servers after `after` (NULL or "" for the first). On
 * success *servers is the JSON array of servers (caller decrefs) and next holds the cursor
 * of the following batch, "" when this was the last. */
int sdc_master_query(sdc_t *c, const sdc_master_filter_t *f, const char *after, int limit,
                     json_t **servers, char *next, size_t nextcap, sdc_err_t *err);

/* ---- clusters, services, assignments, primary ---- */

/* Desired state (docs/cluster.md). Every function takes the cluster name and validates
 * the names it is given before any request. *out (where there is one) is the parsed
 * answer, owned by the caller (json_decref); see docs/openapi.yaml for its shape. */

/* PUT .../services/{svc} with spec (not stolen); dry_run: compute the changes without
 * writing. *out: {service, version, changed, changes:[...], dry_run?}. */
int sdc_service_put(sdc_t *c, const char *cluster, const char *svc, const json_t *spec,
                    int dry_run, json_t **out, sdc_err_t *err);
/* GET .../services, every page: *out is {version, services:[...]} in name order. */
int sdc_services_list(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err);
/* GET .../services/{svc}: *out is {service, version, spec, stopped, restart_token, ...}. */
int sdc_service_get(sdc_t *c, const char *cluster, const char *svc, json_t **out,
                    sdc_err_t *err);
/* DELETE .../services/{svc}. */
int sdc_service_delete(sdc_t *c, const char *cluster, const char *svc, sdc_err_t *err);
/* POST .../services/{svc}/scale {count}; *out like sdc_service_put. */
int sdc_service_scale(sdc_t *c, const char *cluster, const char *svc, int64_t count,
                      int dry_run, json_t **out, sdc_err_t *err);
/* POST .../services/{svc}/stop (stop != 0) or /start; *out {service, stopped, changed}. */
int sdc_service_stop(sdc_t *c, const char *cluster, const char *svc, int stop, json_t **out,
                     sdc_err_t *err);
/* POST .../services/{svc}/restart {max_unavailable} (<= 0: the server default, 1);
 * *out {service, restart_token, max_unavailable, version}. */
int sdc_service_restart(sdc_t *c, const char *cluster, const char *svc, int64_t max_unavailable,
                        json_t **out, sdc_err_t *err);
/* POST .../restart-instance {instance}; *out {instance, service, slot, restart_token}. */
int sdc_instance_restart(sdc_t *c, const char *cluster, const char *instance, json_t **out,
                         sdc_err_t *err);
/* POST .../stop (stop != 0) or .../start: the realm stop flag; *out {cluster_stopped,
 * changed, version}. */
int sdc_cluster_stop(sdc_t *c, const char *cluster, int stop, json_t **out, sdc_err_t *err);
/* POST .../machines/{machine}/drain (drain != 0) or /undrain; *out {machine, draining,
 * changed}. */
int sdc_machine_drain(sdc_t *c, const char *cluster, const char *machine, int drain,
                      json_t **out, sdc_err_t *err);

/* The primary lease as ServerDir reports it. holder is "" when nobody holds it. */
typedef struct {
    char holder[SD_NAME_MAX + 1];
    int64_t epoch;
    int64_t expires_in_ms;
} sdc_primary_t;

/* POST .../primary {machine, ttl_ms}: acquire or renew. On 409 primary_held the call
 * returns SDC_E_HTTP and still fills *out with the current holder. */
int sdc_primary_acquire(sdc_t *c, const char *cluster, const char *machine, int ttl_ms,
                        sdc_primary_t *out, sdc_err_t *err);
/* GET .../primary. */
int sdc_primary_get(sdc_t *c, const char *cluster, sdc_primary_t *out, sdc_err_t *err);
/* DELETE .../primary?machine=M (only the holder; 409 not_primary otherwise). */
int sdc_primary_release(sdc_t *c, const char *cluster, const char *machine, sdc_err_t *err);

/* GET .../state, every page (SDC_STATE_PAGE records each): *out {now_ms, version,
 * cluster_stopped, services, machines, assignments_version, assignments}, the header of
 * the first page. The pages are read at different instants; a walk during which the
 * desired-state version moved is walked again (twice at most). SDC_E_PROTO beyond
 * SDC_STATE_RECORDS_MAX records. */
#define SDC_STATE_PAGE 1000
#define SDC_STATE_RECORDS_MAX 1000000
int sdc_state_get(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err);
/* PUT .../assignments {epoch, machines} (machines: object of machine -> slot array, not
 * stolen). version/changed may be NULL. 409 stale_epoch: no longer primary. */
int sdc_assignments_put(sdc_t *c, const char *cluster, int64_t epoch, const json_t *machines,
                        int64_t *version, int *changed, sdc_err_t *err);
/* GET .../machines/{machine}/assignments; with version >= 0 and wait_ms > 0 a long-poll
 * that answers when the document's version differs from `version` or wait_ms passed
 * (the client's timeout must be longer than wait_ms). *out is the document. */
int sdc_assignments_get(sdc_t *c, const char *cluster, const char *machine, int64_t version,
                        int wait_ms, json_t **out, sdc_err_t *err);
/* POST .../machines/{machine}/lost {epoch}: its live processes are marked stopped
 * (machine_lost) and its slots removed. stopped (may be NULL): processes marked. */
int sdc_machine_lost(sdc_t *c, const char *cluster, const char *machine, int64_t epoch,
                     int *stopped, sdc_err_t *err);
/* The same with keep (NULL or an array of service names, not stolen): those services'
 * processes stay as they are, and with any named the machine's slots are left for the
 * caller's own PUT .../assignments (docs/cluster.md, "A machine cut off"). */
int sdc_machine_lost_keep(sdc_t *c, const char *cluster, const char *machine, int64_t epoch,
                          const json_t *keep, int *stopped, sdc_err_t *err);

/* ---- allocations (docs/allocation.md) ---- */

/* One allocation request. NULL / zero members are left out (the server's defaults). */
typedef struct {
    const char *service;           /* required */
    int join;                      /* mode join (a running instance with free player slots)
                                      instead of ready (an unallocated one) */
    const char *strategy;          /* "packed" or "distributed"; NULL: packed */
    const json_t *machine_labels;  /* object name -> string the machine must carry, or NULL */
    const json_t *metadata;        /* object name -> string the status line must carry */
    int64_t players;               /* free player slots required; < 0: the default (1 for
                                      join, 0 for ready) */
    const json_t *payload;         /* any JSON value handed to the game, or NULL */
    const char *idempotency_key;   /* a name, or NULL */
    int64_t wait_ms;               /* 0..60000: wait that long for a match (the client's
                                      timeout must be longer) */
} sdc_alloc_req_t;

/* POST .../allocations: *out is the allocation {allocation, state, service, instance,
 * machine, address, ports, ...; replayed: true when the idempotency key answered an
 * earlier one}. 409 no_capacity (err->body names the selector) and
 * idempotency_conflict, 404 unknown_service come back as SDC_E_HTTP. */
/* GET .../pool-demand: the counter every allocation (and every allocation that found no
 * instance) moves, in *out. With version >= 0 and wait_ms > 0 a long-poll that answers
 * when it differs from version or wait_ms passed (the client's timeout must be longer):
 * what bigbrother's primary waits on between placement passes. */
int sdc_pool_demand(sdc_t *c, const char *cluster, int64_t version, int wait_ms,
                    int64_t *out, sdc_err_t *err);
int sdc_allocation_create(sdc_t *c, const char *cluster, const sdc_alloc_req_t *req,
                          json_t **out, sdc_err_t *err);
/* GET .../allocations/{id}: *out is the allocation (404 no_such_allocation). */
int sdc_allocation_get(sdc_t *c, const char *cluster, const char *id, json_t **out,
                       sdc_err_t *err);
/* DELETE .../allocations/{id}: ends it (state released, reason api); *out is the
 * allocation with changed: false when it had ended already. */
int sdc_allocation_release(sdc_t *c, const char *cluster, const char *id, json_t **out,
                           sdc_err_t *err);
/* GET .../allocations, one page: *out is {allocations:[...], next: cursor|null}, oldest
 * first; service NULL: every service; after: the previous page's next (NULL or "" for
 * the first); limit 1..1000 (0: the server's default, 100). */
int sdc_allocations_page(sdc_t *c, const char *cluster, const char *service,
                         const char *after, int limit, json_t **out, sdc_err_t *err);
/* Every page of GET .../allocations (at most 1,000,000): *out is {allocations:[...],
 * next: null}, with "truncated": true when the cap stopped the walk. */
int sdc_allocations_list(sdc_t *c, const char *cluster, const char *service, json_t **out,
                         sdc_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
