/* Simulated players with their progress in ServerDir (docs/locks.md: locks and fenced blobs).
 *
 * Each of the --players slots runs this cycle; the loop thread owns every slot and the
 * network calls run on this module's worker thread (worker.c), one job per slot at a
 * time, so the tick never waits on ServerDir:
 *
 *   state     event                                  next
 *   AWAY      arrival time (not stopping)            JOIN job: lock key (holder = the
 *                                                    instance id), GET blob with lock_seq
 *   (JOIN)    ok                                     PLAYING, progress loaded
 *             lock held elsewhere / ServerDir down   AWAY, retry later (backoff), next key
 *   PLAYING   every tick                             progress grows
 *             save time                              SAVE job: PUT blob, Lock-Seq, Blob-Seq+1
 *   (SAVE)    ok                                     PLAYING
 *             409 fenced / stale_seq                 AWAY: taken over, dropped unsaved
 *             ServerDir down                         PLAYING, next save retries
 *   PLAYING   session over, or stopping              LEAVE job: PUT blob, then release
 *   (LEAVE)   done (whatever the outcome)            AWAY (on a stop: counted done)
 *
 * A Blob-Seq is never reused: each save attempt takes the next one, so a save that was
 * applied although its answer was lost is still older than the next attempt. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gameproc.h"
#include "sdclient.h"
#include "sdlog.h"
#include "sdtime.h"
#include "sdutil.h"

#define KEY_CAP 48
#define BLOB_CAP 256
#define SD_TIMEOUT_MS 3000
#define JOIN_BACKOFF_MIN_MS 500
#define JOIN_BACKOFF_MAX_MS 10000
#define REJOIN_MS 1000

typedef enum { P_AWAY, P_JOINING, P_PLAYING } pstate_t;
typedef enum { JOB_JOIN, JOB_SAVE, JOB_LEAVE } job_kind_t;

typedef struct {
    gp_job_t job;              /* first: the job is the player */
    /* loop thread */
    pstate_t state;
    int busy;                  /* a job is in flight */
    int leaving;               /* leave as soon as no job is in flight */
    int stop_counted;          /* counted in gp->stop_pending */
    int fails;                 /* consecutive failed joins */
    int save_failing;          /* a failed save was logged; the next success says so */
    char key[KEY_CAP];
    int64_t lock_seq, blob_seq, seq_tried, progress;
    sdc_lock_t grant; /* the held lock (lock_seq above is grant.lock_seq) */
    int64_t next_at_ms;        /* AWAY: arrival; PLAYING: next save */
    int64_t leave_at_ms;       /* 0: stays */
    /* the job: set by the loop before submit, results set by the worker */
    job_kind_t kind;
    char data[BLOB_CAP];
    size_t len;
    int64_t put_seq;
    int rc, saved, released;
    long status;
    char code[64];
    char msg[200];
    int64_t got_lock_seq, got_blob_seq, got_progress;
    sdc_lock_t got_grant;
} player_t;

static player_t *players;
static int nplayers;
static gp_worker_t *worker;
static sdc_t *client;          /* used by the worker thread only */
static char holder[GP_NAME_MAX + 1];
static uint64_t token_seen;    /* worker thread: the credential.c token version in client */
static int64_t key_first, key_span;
static int64_t next_key;       /* the key the next arrival tries (0-based in the range) */
static int stop_seen;
static uint32_t rng = 2463534242u; /* xorshift32 state, seeded at start */

/* A pseudo-random number in [0, n) (n > 0): session lengths and key offsets only. */
static uint32_t rnd_below(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng % n;
}

/* ---- the blob format: "progress=N holder=H\n" ------------------------------------ */

/* The progress recorded in a blob; 0 when the blob has none (a new player). */
static int64_t blob_progress(const char *data, size_t len)
{
    const char *tag = "progress=";
    size_t tl = strlen(tag);
    for (size_t i = 0; i + tl < len; i++) {
        if ((i == 0 || data[i - 1] == ' ' || data[i - 1] == '\n') &&
            memcmp(data + i, tag, tl) == 0) {
            char num[24];
            size_t j = 0;
            for (i += tl; i < len && j + 1 < sizeof num && data[i] >= '0' && data[i] <= '9';)
                num[j++] = data[i++];
            num[j] = '\0';
            int64_t v;
            return sd_parse_i64(num, 0, INT64_MAX / 2, &v) ? 0 : v;
        }
    }
    return 0;
}

/* ---- the worker side ------------------------------------------------------------- */

static void result_err(player_t *p, int rc, const sdc_err_t *err)
{
    p->rc = rc;
    p->status = err->status;
    snprintf(p->code, sizeof p->code, "%s", err->code);
    sdc_strerror(rc, err, p->msg, sizeof p->msg);
}

static int refused(const player_t *p)
{
    return p->rc == SDC_E_HTTP && p->status == 409 &&
           (!strcmp(p->code, "fenced") || !strcmp(p->code, "stale_seq"));
}

static void job_run(gp_job_t *j)
{
    player_t *p = (player_t *)j;
    sdc_err_t err = { 0 };
    p->rc = SDC_OK;
    p->status = 0;
    p->code[0] = p->msg[0] = '\0';
    p->saved = p->released = 0;
    gp_cred_apply(client, &token_seen);
    int rc;
    if (p->kind == JOB_JOIN) {
        sdc_lock_t lk;
        rc = sdc_lock_acquire(client, p->key, holder, NULL, &lk, &err);
        if (rc) {
            result_err(p, rc, &err);
            goto out;
        }
        p->got_lock_seq = lk.lock_seq;
        p->got_grant = lk;
        void *data = NULL;
        size_t len = 0;
        int64_t bseq = 0;
        sdc_err_clear(&err);
        rc = sdc_blob_get(client, p->key, &lk, &data, &len, &bseq, &err);
        if (rc == SDC_E_HTTP && err.status == 404 && !strcmp(err.code, "no_blob")) {
            p->got_blob_seq = 0;
            p->got_progress = 0;
        } else if (rc) {
            result_err(p, rc, &err);
        } else {
            p->got_blob_seq = bseq;
            p->got_progress = blob_progress(data, len);
        }
        free(data);
        goto out;
    }
    rc = sdc_blob_put(client, &p->grant, p->put_seq, p->data, p->len, &err);
    if (rc) {
        result_err(p, rc, &err);
        if (p->kind == JOB_SAVE || refused(p))
            goto out;
    } else {
        p->saved = 1;
    }
    if (p->kind == JOB_LEAVE) {
        sdc_err_clear(&err);
        rc = sdc_lock_release(client, &p->grant, holder, &err);
        if (rc && p->saved)
            result_err(p, rc, &err);
        p->released = rc == SDC_OK;
    }
out:
    sdc_err_clear(&err);
}

/* ---- the loop side --------------------------------------------------------------- */

/* The next key of the range that no other slot of this process is using. */
static void pick_key(player_t *p)
{
    for (int64_t tries = 0; tries < key_span; tries++) {
        char key[KEY_CAP];
        snprintf(key, sizeof key, "player:%" PRId64, key_first + next_key % key_span);
        next_key++;
        int used = 0;
        for (int i = 0; i < nplayers && !used; i++)
            used = &players[i] != p && players[i].state != P_AWAY &&
                   !strcmp(players[i].key, key);
        if (!used) {
            memcpy(p->key, key, sizeof key);
            return;
        }
    }
}

static void submit(player_t *p, job_kind_t kind)
{
    p->kind = kind;
    p->busy = 1;
    if (kind != JOB_JOIN) {
        int n = snprintf(p->data, sizeof p->data, "progress=%" PRId64 " holder=%s\n",
                         p->progress, holder);
        p->len = n > 0 && (size_t)n < sizeof p->data ? (size_t)n : 0;
        p->put_seq = (p->seq_tried > p->blob_seq ? p->seq_tried : p->blob_seq) + 1;
        p->seq_tried = p->put_seq;
    }
    gp_worker_submit(worker, &p->job);
}

/* The slot is away again; on a stop, one less player to wait for. */
static void set_away(gp_t *gp, player_t *p, int64_t now, int64_t again_in_ms)
{
    if (p->state == P_PLAYING && gp->players > 0)
        gp->players--;
    p->state = P_AWAY;
    p->leaving = 0;
    p->next_at_ms = sd_deadline_ms(now, again_in_ms);
    if (p->stop_counted) {
        p->stop_counted = 0;
        gp->stop_pending--;
    }
}

static void join_done(gp_t *gp, player_t *p, int64_t now)
{
    if (p->rc) {
        int64_t backoff =
            sd_backoff_step_ms(JOIN_BACKOFF_MIN_MS, JOIN_BACKOFF_MAX_MS, p->fails);
        if (p->fails++ == 0)
            log_info("player cannot join", "key=%s err=%s retry_ms=%lld", p->key, p->msg,
                     (long long)backoff);
        set_away(gp, p, now, backoff);
        return;
    }
    p->fails = 0;
    p->state = P_PLAYING;
    p->lock_seq = p->got_lock_seq;
    p->grant = p->got_grant;
    p->blob_seq = p->seq_tried = p->got_blob_seq;
    p->progress = p->got_progress;
    p->next_at_ms = now + gp->save_every_ms;
    /* Sessions last half to one and a half --session-s, so players do not all leave at
     * once. */
    p->leave_at_ms = gp->session_ms > 0
                         ? now + gp->session_ms / 2 + rnd_below((uint32_t)gp->session_ms + 1)
                         : 0;
    p->save_failing = 0;
    gp->players++;
    log_info("player joined", "key=%s lock_seq=%" PRId64 " blob_seq=%" PRId64
             " progress=%" PRId64, p->key, p->lock_seq, p->blob_seq, p->progress);
}

static void save_done(gp_t *gp, player_t *p, int64_t now)
{
    if (refused(p)) {
        log_warn("player taken over, dropped without saving",
                 "key=%s lock_seq=%" PRId64 " blob_seq=%" PRId64 " code=%s", p->key,
                 p->lock_seq, p->put_seq, p->code);
        set_away(gp, p, now, REJOIN_MS);
        return;
    }
    if (p->rc) {
        if (!p->save_failing)
            log_warn("player save failed, retrying", "key=%s err=%s", p->key, p->msg);
        p->save_failing = 1;
        return;
    }
    p->blob_seq = p->put_seq;
    if (p->save_failing)
        log_info("player saves resumed", "key=%s blob_seq=%" PRId64 " progress=%" PRId64,
                 p->key, p->blob_seq, p->progress);
    p->save_failing = 0;
}

static void leave_done(gp_t *gp, player_t *p, int64_t now)
{
    if (refused(p))
        log_warn("player taken over, dropped without saving",
                 "key=%s lock_seq=%" PRId64 " blob_seq=%" PRId64 " code=%s", p->key,
                 p->lock_seq, p->put_seq, p->code);
    else
        log_info("player left", "key=%s progress=%" PRId64 " blob_seq=%" PRId64
                 " saved=%d released=%d err=%s", p->key, p->progress, p->put_seq, p->saved,
                 p->released, p->rc ? p->msg : "none");
    if (p->saved)
        p->blob_seq = p->put_seq;
    set_away(gp, p, now, REJOIN_MS);
}

static void job_done(gp_t *gp, gp_job_t *j)
{
    player_t *p = (player_t *)j;
    int64_t now = sd_mono_ms();
    p->busy = 0;
    switch (p->kind) {
    case JOB_JOIN: join_done(gp, p, now); break;
    case JOB_SAVE: save_done(gp, p, now); break;
    case JOB_LEAVE: leave_done(gp, p, now); break;
    }
}

/* Starts the player simulation of --players. 0, -EINVAL filling *bad for a
 * bad --serverdir, or a negative errno. */
int gp_players_start(gp_t *gp, gp_bad_option_t *bad)
{
    if (gp->sim_players == 0)
        return 0;
    client = sdc_new(gp->sd_urls, gp->sd_token, SD_TIMEOUT_MS);
    if (!client) {
        *bad = (gp_bad_option_t){.option = "serverdir", .value = gp->sd_urls,
                                .want = "comma-separated http(s) base URLs"};
        return -EINVAL;
    }
    players = calloc((size_t)gp->sim_players, sizeof *players);
    worker = gp_worker_new();
    if (!players || !worker)
        return -ENOMEM;
    nplayers = gp->sim_players;
    sd_strlcpy(holder, gp->instance, sizeof holder);
    key_first = gp->key_first;
    key_span = gp->key_last - gp->key_first + 1;
    /* Servers sharing a key range start at different keys, so they rarely collide. */
    char seed[9];
    if (sd_random_hex(seed, 4) == 0 && strtoul(seed, NULL, 16) != 0)
        rng = (uint32_t)strtoul(seed, NULL, 16);
    next_key = rnd_below((uint32_t)key_span); /* --player-keys caps it below 10^9 */
    int64_t now = sd_mono_ms();
    for (int i = 0; i < nplayers; i++) {
        players[i].job.run = job_run;
        players[i].job.done = job_done;
        /* Arrivals spread over the first second, not all in one tick. */
        players[i].next_at_ms = now + (int64_t)i * 1000 / nplayers;
    }
    log_info("player simulation", "players=%d keys=player:%" PRId64 "-%" PRId64
             " holder=%s save_every_ms=%" PRId64 " serverdir=%s", nplayers, gp->key_first,
             gp->key_last, holder, gp->save_every_ms, gp->sd_urls);
    return 0;
}

/* On the first stopping tick every present player is asked to leave (save, release),
 * and the stop waits for them through gp->stop_pending. */
static void begin_leaving(gp_t *gp)
{
    stop_seen = 1;
    for (int i = 0; i < nplayers; i++) {
        player_t *p = &players[i];
        if (p->state == P_AWAY)
            continue;
        p->leaving = 1;
        p->stop_counted = 1;
        gp->stop_pending++;
    }
}

void gp_players_tick(gp_t *gp, int64_t now)
{
    if (!worker)
        return;
    gp_worker_reap(worker, gp);
    if (gp->stopping && !stop_seen)
        begin_leaving(gp);
    for (int i = 0; i < nplayers; i++) {
        player_t *p = &players[i];
        if (p->state == P_PLAYING)
            p->progress++;
        if (p->busy)
            continue;
        if (p->state == P_AWAY) {
            if (!gp->stopping && !gp->draining && now >= p->next_at_ms && gp_cred_usable(gp)) {
                pick_key(p);
                p->state = P_JOINING;
                submit(p, JOB_JOIN);
            }
        } else if (p->state == P_PLAYING) {
            if (p->leaving || (p->leave_at_ms && now >= p->leave_at_ms))
                submit(p, JOB_LEAVE);
            else if (now >= p->next_at_ms) {
                p->next_at_ms = now + gp->save_every_ms;
                submit(p, JOB_SAVE);
            }
        }
    }
}

void gp_players_stop(gp_t *gp)
{
    (void)gp;
    if (!worker)
        return;
    int busy = gp_worker_free(worker, SD_TIMEOUT_MS);
    worker = NULL;
    if (busy)
        return; /* the worker still uses the client and a slot; the process exits now */
    sdc_free(client);
    client = NULL;
    free(players);
    players = NULL;
}
