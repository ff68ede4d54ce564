/* The sweeper thread: the periodic work of serverdir that no request drives, on one walk
 * of the known clusters (sd_dir_clusters_step). Every lost_sweep_ms the allocation
 * deadlines (cluster/: sd_alloc_sweep) and the lost-machine sweep (directory/: machines
 * whose lease ran out in a cluster without a primary get their processes marked
 * stopped, one serverdir copy at a time under a Redis lease); every series_interval_ms a
 * ready-vs-desired sample of each cluster. It lives beside main.c, above both parts it
 * calls, so the directory does not call into the cluster part. */
#include "cluster.h"
#include "directory.h"
#include "sd.h"
#include "sdtime.h"
#include "sdvalid.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Whether the sorted set `name` of cluster has a member scored at most max_ms (one
 * ZRANGEBYSCORE ... LIMIT 0 1); 0 too when Redis does not answer. */
static int zset_due(const char *cluster, const char *name, int64_t max_ms)
{
    char key[300], max[24];
    snprintf(max, sizeof max, "%lld", (long long)max_ms);
    const char *argv[] = {"ZRANGEBYSCORE", sd_key(key, sizeof key, cluster, "%s", name), "-inf",
                          max, "LIMIT", "0", "1"};
    sd_argv_t a;
    sd_argv_init(&a);
    for (size_t i = 0; i < SD_ARRAY_LEN(argv); i++)
        sd_argv_add(&a, argv[i]);
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return 0;
    int due = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    freeReplyObject(r);
    return due;
}

/* Whether cluster has, by this copy's clock, a machine whose lease ran out and no live
 * primary: two reads, so an idle sweep writes nothing. */
static int sweep_due(const char *cluster)
{
    char key[300];
    if (!zset_due(cluster, "leases", sd_wall_ms()))
        return 0;
    sd_argv_t a;
    redisReply *r;
    int rc;
    sd_argv_init(&a);
    sd_argv_add(&a, "HMGET");
    sd_argv_add(&a, sd_key(key, sizeof key, cluster, "primary"));
    sd_argv_add(&a, "holder");
    sd_argv_add(&a, "expires_at_ms");
    rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return 0;
    int primary = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                  r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len > 0 &&
                  r->element[1]->type == REDIS_REPLY_STRING &&
                  strtoll(r->element[1]->str, NULL, 10) > sd_wall_ms();
    freeReplyObject(r);
    return !primary;
}

/* One cluster: every machine whose lease ran out (at most 64 a round) has its live
 * processes marked stopped (machine_lost), once this copy has run without a gap for a
 * whole lease of the machine (awake_ms; machine_lost_sweep.lua). */
static void sweep_cluster(const char *cluster, int64_t awake_ms)
{
    if (sd_dir_ensure_index(cluster))
        return;
    char base[256];
    sd_key(base, sizeof base, cluster, "%s", "");
    for (int k = 0; k < 64; k++) {
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, base);
        sd_argv_addf(&a, "%lld", (long long)awake_ms);
        redisReply *r;
        if (sd_store_run("machine_lost_sweep", 1, &a, &r))
            return;
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
            freeReplyObject(r);
            return;
        }
        const char *machine = r->element[0]->str;
        size_t n = (r->elements - 2) / 2;
        const char **insts = calloc(n ? n : 1, sizeof *insts);
        const char **svcs = calloc(n ? n : 1, sizeof *svcs);
        if (!insts || !svcs) {
            free(insts);
            free(svcs);
            freeReplyObject(r);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            insts[i] = r->element[2 + 2 * i]->str;
            svcs[i] = r->element[3 + 2 * i]->str;
        }
        char idpfx[64];
        snprintf(idpfx, sizeof idpfx, "lostsweep.%s", r->element[1]->str);
        long long applied = n ? sd_dir_mark_lost(cluster, machine, idpfx,
                                                 "the machine's lease expired; no primary: "
                                                 "marked by serverdir's sweep",
                                                 insts, svcs, n)
                              : 0;
        log_warn("machine lost", "cluster=%s machine=%s processes=%zu stopped=%lld by=%s", cluster,
                 machine, n, applied, "sweep");
        SD_COUNT("serverdir_machines_lost_by_sweep_total",
                 "machines whose lease ran out in a cluster without a primary", 1);
        free(insts);
        free(svcs);
        freeReplyObject(r);
    }
}

static pthread_t sweeper;
static int sweeper_on;
static pthread_mutex_t sweep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sweep_cv = PTHREAD_COND_INITIALIZER;
static int sweep_stop;

/* Takes the sweep's Redis lease (one copy sweeps at a time): 1 when this copy has it. */
static int sweep_lease(const char *me)
{
    char key[128], px[24];
    snprintf(key, sizeof key, "%slostsweep", sd_store_prefix());
    snprintf(px, sizeof px, "%lld", (long long)sd_dir_cfg.lost_sweep_ms * 2);
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "SET");
    sd_argv_add(&a, key);
    sd_argv_add(&a, me);
    sd_argv_add(&a, "NX");
    sd_argv_add(&a, "PX");
    sd_argv_add(&a, px);
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return 0;
    int got = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (got)
        return 1;
    /* held: by this copy (renew it) or another */
    sd_argv_init(&a);
    sd_argv_add(&a, "GET");
    sd_argv_add(&a, key);
    if (sd_store_command(&a, &r)) {
        sd_argv_free(&a);
        return 0;
    }
    sd_argv_free(&a);
    got = r->type == REDIS_REPLY_STRING && strcmp(r->str, me) == 0;
    freeReplyObject(r);
    if (got) {
        sd_argv_init(&a);
        sd_argv_add(&a, "PEXPIRE");
        sd_argv_add(&a, key);
        sd_argv_add(&a, px);
        if (sd_store_command(&a, &r) == 0)
            freeReplyObject(r);
        sd_argv_free(&a);
    }
    return got;
}

/* Whether cluster has an allocation past its confirm deadline, or an ended one older than
 * an hour: two reads, so an idle sweep writes nothing. */
static int alloc_sweep_due(const char *cluster)
{
    int64_t now = sd_wall_ms();
    return zset_due(cluster, "alloc:pending", now) || zset_due(cluster, "alloc:ended", now - 3600000);
}

/* One ready-vs-desired sample of cluster (series_sample.lua), written when the cluster's
 * last one is series_interval_ms old by the Redis clock and a figure changed (the script
 * decides, so copies that all call it write at most one a period, and an idle cluster
 * nothing). Returns the ms until the cluster's next sample is due (the interval after a
 * check or a Redis error). */
static int64_t series_sample(const char *cluster)
{
    int64_t every = sd_dir_cfg.series_interval_ms;
    if (sd_dir_ensure_index(cluster)) /* ready and starting are counted on its indexes */
        return every;
    char base[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_addf(&a, "%lld", (long long)every);
    sd_argv_addf(&a, "%d", SD_SERIES_MAX);
    redisReply *r;
    if (sd_store_run("series_sample", 1, &a, &r))
        return every;
    int64_t due = r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? sd_reply_num(r, 1) : every;
    freeReplyObject(r);
    return due > 0 && due <= every ? due : every;
}

/* Waits ms, or until sd_sweeper_stop; 1 when the thread is to stop. */
static int sweeper_wait(int64_t ms)
{
    pthread_mutex_lock(&sweep_mu);
    if (!sweep_stop && ms > 0) {
        struct timespec ts = sd_timespec_after_ms(CLOCK_REALTIME, ms);
        pthread_cond_timedwait(&sweep_cv, &sweep_mu, &ts);
    }
    int stop = sweep_stop;
    pthread_mutex_unlock(&sweep_mu);
    return stop;
}

/* The sweeper: two timers on one walk of the known clusters. Every lost_sweep_ms the
 * allocation deadlines (every copy may run that sweep: one script, a no-op when another
 * copy did it first) and the lost-machine sweep (under the lease; not of a machine before
 * this copy has run for a whole lease of it since it started or last woke late: a pause
 * of serverdir, or an outage of every copy, let every lease run out); every
 * series_interval_ms a ready-vs-desired sample. The series timer wakes when the first
 * cluster's sample is due (the scripts say when), at least interval/20 after the last
 * walk, so a copy runs each cluster's script about once a period. */
static void *sweeper_main(void *arg)
{
    (void)arg;
    char me[33];
    if (sd_random_hex(me, 16))
        snprintf(me, sizeof me, "%lld", (long long)sd_mono_us());
    const int64_t lost_every = sd_dir_cfg.lost_sweep_ms;
    const int64_t series_every = sd_dir_cfg.series_interval_ms;
    int64_t next_lost = sd_mono_ms() + lost_every, next_series = sd_mono_ms();
    int64_t awake_since = sd_mono_ms();
    for (;;) {
        int64_t wake = lost_every > 0 ? next_lost : INT64_MAX;
        if (series_every > 0 && next_series < wake)
            wake = next_series;
        if (sweeper_wait(wake - sd_mono_ms()))
            break;
        int64_t now = sd_mono_ms();
        int lost = lost_every > 0 && now >= next_lost;
        int series = series_every > 0 && now >= next_series;
        if (!lost && !series)
            continue;
        if (lost) {
            /* woke a second (and a period) late: this copy was paused or starved */
            int64_t late = now - next_lost;
            if (late > (lost_every > 1000 ? lost_every : 1000)) {
                log_warn("lost-machine sweep held: serverdir did not run", "late_ms=%lld",
                         (long long)late);
                awake_since = now;
            }
            next_lost = now + lost_every;
        }
        int64_t series_in = series_every;
        char cursor[32] = "0";
        int rounds = 0, leased = 0, swept_elsewhere = 0;
        do {
            redisReply *r;
            if (sd_dir_clusters_step(cursor, sizeof cursor, 100, &r))
                break;
            for (size_t i = 0; i < r->element[1]->elements; i++) {
                const char *c = r->element[1]->element[i]->str;
                if (!sd_name_valid(c, SD_NAME_MAX))
                    continue;
                if (lost && alloc_sweep_due(c))
                    sd_alloc_sweep(c);
                if (lost && !swept_elsewhere && sweep_due(c)) {
                    if (leased || (leased = sweep_lease(me)))
                        sweep_cluster(c, now - awake_since);
                    else
                        swept_elsewhere = 1; /* another copy sweeps this round */
                }
                if (series) {
                    int64_t due = series_sample(c);
                    series_in = due < series_in ? due : series_in;
                }
            }
            freeReplyObject(r);
        } while (strcmp(cursor, "0") != 0 && ++rounds < 1000);
        if (series) {
            int64_t least = series_every / 20; /* clusters out of phase: no walk sooner */
            next_series = sd_mono_ms() + (series_in > least ? series_in : least);
        }
    }
    sd_store_thread_close();
    return NULL;
}

int sd_sweeper_start(void)
{
    if ((sd_dir_cfg.lost_sweep_ms <= 0 && sd_dir_cfg.series_interval_ms <= 0) || sweeper_on)
        return 0;
    int rc = pthread_create(&sweeper, NULL, sweeper_main, NULL);
    if (rc)
        return -rc;
    sweeper_on = 1;
    return 0;
}

void sd_sweeper_stop(void)
{
    if (!sweeper_on)
        return;
    pthread_mutex_lock(&sweep_mu);
    sweep_stop = 1;
    pthread_cond_signal(&sweep_cv);
    pthread_mutex_unlock(&sweep_mu);
    pthread_join(sweeper, NULL);
    sweeper_on = 0;
}
