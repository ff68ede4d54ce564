/* Quotas (docs/operations.md, "Quotas"): what one scope (a cluster, a token's principal,
 * a lock holder) may hold, so that one caller cannot fill Redis or the park thread for
 * every other. The limits come from the `quotas` section of serverdir's --config; a
 * refusal is one answer, quota_exceeded, naming the quota, its limit and the use, and
 * moves serverdir_quota_refusals_total{quota=...}. The checks sit with what they count
 * (api_alloc.c, locks.c, api_blobs.c); this file holds the limits, the answer and the
 * in-memory tallies of what a serverdir copy holds open (parked waits). */
#ifndef SD_QUOTA_H
#define SD_QUOTA_H

#include <pthread.h>
#include <stdint.h>

#include "sd.h"

/* Every quota: enum name, config key (and metric label), status of a refusal (507 for
 * storage, 429 for counts). */
#define SD_QUOTAS(X)                                                                      \
    X(BLOB_BYTES, "blob_bytes", 507)                                                      \
    X(LOCKS_PER_HOLDER, "locks_per_holder", 429)                                          \
    X(ALLOC_WAITING, "allocations_waiting", 429)                                          \
    X(ALLOC_WAITING_PER_CLUSTER, "allocations_waiting_per_cluster", 429)                  \
    X(ALLOC_WAITING_PER_TOKEN, "allocations_waiting_per_token", 429)

typedef enum {
#define SD_QUOTA_ENUM(e, name, status) SD_QUOTA_##e,
    SD_QUOTAS(SD_QUOTA_ENUM)
#undef SD_QUOTA_ENUM
    SD_QUOTA_COUNT
} sd_quota_t;

/* The limits, by sd_quota_t (0: no limit). */
extern int64_t sd_quota_limit[SD_QUOTA_COUNT];

/* Loads the `quotas` section of the --config file (NULL: keep the defaults), all or
 * nothing: 0, or -1 with err naming the field. Called by sd_config_apply. */
int sd_quota_config_load(const json_t *section, char *err, size_t errcap);

/* Answers the refusal of quota q to scope (what the use is counted for: "cluster:c1",
 * "token:ab12...", a holder): the quota's status, error quota_exceeded with
 * {quota, limit, used, scope}; counts it and logs it (at most once a second per quota). */
void sd_quota_refuse(sd_resp_t *resp, sd_quota_t q, int64_t used, const char *scope);

/* The scope a caller's stored bytes count for: "cluster:<c>" for a cluster-bound token or
 * credential, else its principal. Into buf, which is returned. */
const char *sd_quota_scope(const sd_req_t *req, char *buf, size_t cap);

/* ---- tallies: in-memory counts per name of what this copy holds open ---- */
typedef struct sd_quota_ent sd_quota_ent_t;
#define SD_QUOTA_BUCKETS 256
typedef struct {
    pthread_mutex_t mu;
    sd_quota_ent_t *bucket[SD_QUOTA_BUCKETS];
} sd_quota_tally_t;
#define SD_QUOTA_TALLY_INIT {.mu = PTHREAD_MUTEX_INITIALIZER}

/* Counts one more for name unless that would pass limit (0: none): 0 when counted, else
 * -1 with *used the current count (also when out of memory: then *used is -1). */
int sd_quota_take(sd_quota_tally_t *t, const char *name, int64_t limit, int64_t *used);
/* Counts one less for name (one sd_quota_take succeeded for it). */
void sd_quota_give(sd_quota_tally_t *t, const char *name);

#endif
