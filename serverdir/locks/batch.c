/* The group commit of the lock path (locks.h, "the group commit"): one call of a lock
 * script for one or several prepared requests. Alone, a request runs the script itself,
 * exactly as before the group commit; together, the requests run the script's batch form
 * <name>_many.lua (store/lua_prelude.lua, batch_run), each as an item with its own KEYS,
 * ARGV and reply. The groups themselves (http/group.h) live with their handlers:
 * api_locks.c (acquire, renew, release) and api_blobs.c (save, read). */
#include <stdio.h>
#include <string.h>

#include "locks.h"
#include "rcluster.h"

void sd_lock_call_ready(sd_lock_call_t *c, long weight)
{
    c->weight = weight > 0 ? weight : 1;
    c->slot[0] = '\0';
    if (sd_store_is_cluster() && c->av.argc > 0)
        snprintf(c->slot, sizeof c->slot, "%u", sd__rc_slot(c->av.argv[0], c->av.argl[0]));
}

int sd_lock_script_calls(void) { return sd_store_is_cluster() ? SD_LOCK_CALLS : 1; }

const char *sd_lock_call_key(const sd_group_job_t *j) { return ((const sd_lock_call_t *)j)->slot; }

long sd_lock_call_weight(const sd_group_job_t *j) { return ((const sd_lock_call_t *)j)->weight; }

/* Counts one call of script carrying n items. */
static void count_call(const char *script, int n)
{
#define CALLS_HELP "Lock-path script calls (EVALSHA), each carrying one or more requests"
#define ITEMS_HELP "Requests carried by lock-path script calls"
    if (!strcmp(script, "lock_acquire")) {
        SD_COUNT("serverdir_lock_script_calls_total{script=\"lock_acquire\"}", CALLS_HELP, 1);
        SD_COUNT("serverdir_lock_script_items_total{script=\"lock_acquire\"}", ITEMS_HELP, n);
    } else if (!strcmp(script, "lock_release")) {
        SD_COUNT("serverdir_lock_script_calls_total{script=\"lock_release\"}", CALLS_HELP, 1);
        SD_COUNT("serverdir_lock_script_items_total{script=\"lock_release\"}", ITEMS_HELP, n);
    } else if (!strcmp(script, "lock_renew")) {
        SD_COUNT("serverdir_lock_script_calls_total{script=\"lock_renew\"}", CALLS_HELP, 1);
        SD_COUNT("serverdir_lock_script_items_total{script=\"lock_renew\"}", ITEMS_HELP, n);
    } else if (!strcmp(script, "blob_get")) {
        SD_COUNT("serverdir_lock_script_calls_total{script=\"blob_get\"}", CALLS_HELP, 1);
        SD_COUNT("serverdir_lock_script_items_total{script=\"blob_get\"}", ITEMS_HELP, n);
    } else {
        SD_COUNT("serverdir_lock_script_calls_total{script=\"blob_save\"}", CALLS_HELP, 1);
        SD_COUNT("serverdir_lock_script_items_total{script=\"blob_save\"}", ITEMS_HELP, n);
    }
#undef CALLS_HELP
#undef ITEMS_HELP
}

/* Runs c alone with the script itself (frees its av). */
static void call_alone(const char *script, sd_lock_call_t *c)
{
    c->r = NULL;
    c->rc = sd_store_run(script, c->nkeys, &c->av, &c->r);
    count_call(script, 1);
}

void sd_lock_calls_run(const char *script, sd_group_job_t **jobs, int n)
{
    if (n == 1) {
        call_alone(script, (sd_lock_call_t *)jobs[0]);
        return;
    }
    sd_argv_t *items[SD_GROUP_JOBS_MAX] = {0};
    int nkeys[SD_GROUP_JOBS_MAX] = {0}, rcs[SD_GROUP_JOBS_MAX];
    redisReply *outs[SD_GROUP_JOBS_MAX];
    for (int i = 0; i < n; i++) {
        sd_lock_call_t *c = (sd_lock_call_t *)jobs[i];
        items[i] = &c->av;
        nkeys[i] = c->nkeys;
    }
    int rc = sd_store_run_many(script, n, items, nkeys, rcs, outs);
    if (rc == SD_STORE_ERROR) {
        /* refused as a whole (busy, out of memory, too many arguments): each request
         * again alone, so it gets the answer it would have had alone */
        for (int i = 0; i < n; i++)
            call_alone(script, (sd_lock_call_t *)jobs[i]);
        return;
    }
    count_call(script, n);
    for (int i = 0; i < n; i++) {
        sd_lock_call_t *c = (sd_lock_call_t *)jobs[i];
        sd_argv_free(&c->av);
        c->rc = rc == SD_STORE_OK ? rcs[i] : rc;
        c->r = rc == SD_STORE_OK ? outs[i] : NULL;
    }
}
