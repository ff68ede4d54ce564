/* cluster/: desired services, the primary lease, assignments and their long-polls. */
/* Cluster orchestration (docs/cluster.md): desired services, the primary lease,
 * per-machine assignments and their long-poll. api_services.c and api_cluster.c are the
 * handlers, cluster_spec.c validates and compares service specs and runs the cluster
 * scripts, assign_wait.c parks assignment long-polls (http/park.h) and wakes them from
 * the assignments channel.
 *
 * Redis layout, all under the cluster's key base "<prefix>{<cluster>}:" (one hash slot):
 *   services           set    service names
 *   svc:<s>            hash   spec (canonical JSON), version, stopped (0|1), restart_token,
 *                             max_unavailable, created_at_ms, updated_at_ms
 *   svc:<s>#slots      hash   slot -> restart token of that one slot (restart-instance)
 *   desired:version    string the desired-state version: grows on every real change
 *   cluster            hash   stopped (0|1), stopped_version (assignments version when the
 *                             flag last changed)
 *   draining           set    machines being drained
 *   primary            hash   holder ("" when released), epoch, expires_at_ms, acquired_at_ms
 *   primary:epoch      string the last epoch handed out; never deleted, so an epoch never
 *                             repeats
 *   assign/<m>         hash   slots (canonical JSON array), version, epoch ('/' is in no
 *                             name: a machine "version" keeps its own key; key layout 2)
 *   assign:machines    set    machines with an assignment document
 *   aix                zset   the same names, score 0: GET /state pages along it (and along
 *                             six and mix, the service and machine name indexes)
 *   assign:version     string the assignments version: grows on every change of any
 *                             machine's document (slots or the cluster stop flag)
 * A change of assignments is published on the channel "<prefix>assign" as
 * "<cluster> <machine> <machine> ..." or "<cluster> *" (every machine of the cluster);
 * assign_wait.c subscribes to it. A change of a pool that may serve a parked allocation
 * is published on "<prefix>assign:pool" as "<cluster> <service> ..." (pool_publish,
 * store/lua_prelude.lua); api_alloc.c subscribes to it. '#' and '/' are not allowed in
 * names, so no key can collide: a name follows '/' where a fixed key shares its word
 * (assign/<m>). */
#ifndef SD_CLUSTER_H
#define SD_CLUSTER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sd.h"

#define SD_SPEC_MAX_BYTES (64 << 10) /* a service spec, compact JSON */
#define SD_COUNT_MAX 100000          /* instances of one service */
#define SD_ASSIGN_WAIT_MAX_MS 60000  /* cap of ?wait= on assignments */
#define SD_ASSIGN_WAITERS_MAX 20000  /* parked assignment long-polls at once */

/* Validates a service spec (the envelope: known keys, command, count 0..SD_COUNT_MAX,
 * placement, the types of args/env/health/restart/stop, size <= SD_SPEC_MAX_BYTES); the
 * process parts are checked by bigbrother when it applies the spec. Returns 0, or -1 with
 * a message naming the field in err. */
int sd_spec_validate(const json_t *spec, char *err, size_t errcap);

/* Appends to changes (a JSON array of strings) one human-readable line per difference
 * between the old spec (NULL: none) and the new one (NULL: deleted), e.g.
 * "count: 3 -> 5", "placement.labels.zone: (none) -> \"eu\"", "created". */
void sd_spec_diff(const json_t *old_spec, const json_t *new_spec, json_t *changes);

/* Canonical text of a JSON value (compact, sorted keys), malloc'd; the form stored in
 * Redis so that equal specs compare equal as strings. NULL when out of memory. */
char *sd_json_canonical(const json_t *v);

/* One service entry of the service_list / state_get scripts ({name, spec, version,
 * stopped, restart_token, max_unavailable, {slot, token, ...}}) as API JSON:
 * {service, version, spec, stopped, restart_token, max_unavailable,
 *  slot_restart_tokens: {"3": 1}}. NULL when malformed. */
json_t *sd_service_json(const redisReply *entry);


/* Reads machine m's assignment document with this thread's Redis connection.
 * Returns SD_STORE_OK with *doc (new reference) and *version, or a SD_STORE_* error. */
int sd_assign_read(const char *cluster, const char *machine, json_t **doc, int64_t *version);

/* Parks req until machine m's document version differs from `version`, or wait_ms pass,
 * or serverdir stops; then answers 200 with the document (ETag set) from the park
 * thread. Answers 429 when SD_ASSIGN_WAITERS_MAX requests wait already. */
void sd_assign_park(sd_req_t *req, sd_resp_t *resp, const char *cluster, const char *machine,
                    int64_t version, int64_t wait_ms);

/* Fills resp with an assignment document answer: 200 + ETag "<version>", or 304 when
 * if_none_match names the current version. Steals doc. */
void sd_assign_answer(sd_resp_t *resp, json_t *doc, int64_t version, const char *if_none_match);

/* Ends the allocations of cluster whose confirm deadline passed and forgets ended ones
 * older than an hour (api_alloc.c; run by the lost-machine sweeper, one copy at a time). */
void sd_alloc_sweep(const char *cluster);
/* Registers the allocation gauges (serverdir_allocations_waiting); once, at start. */
void sd_alloc_metrics_init(void);

/* ---------- running cluster scripts (cluster_spec.c) ---------- */

/* sd_store_run for a cluster script: the cluster's key base as its one key, then the
 * string args that follow, up to a terminating NULL. Returns a SD_STORE_* code, *out as
 * sd_store_run. */
int sd__cluster_run(const char *script, const char *cluster, redisReply **out, ...)
    __attribute__((sentinel));

#endif
