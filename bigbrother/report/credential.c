/* Instance credentials: for each instance whose `started` event ServerDir accepted, one
 * credential thread obtains a signed credential (POST .../machines/{m}/instances/{i}/
 * credential, libsdclient's sdc_instance_credential, with the machine's own token),
 * renews it when credential_renew_percent of its life is left, and retries a failure with
 * backoff. It never touches an instance: it keeps a table of what it holds and signals an
 * eventfd, and the supervision thread takes the new ones (bb_cred_take) and hands them to
 * the game (agent/handover.c). Network time is spent on this thread only.
 *
 * An entry's life:
 *   want (started accepted, or a re-adopted run) -> due now
 *   due -> request -> 200: held, `fresh` for the supervision thread; due again when the
 *                          renewal point of its life is reached
 *                  -> 409 instance_stopped / generation_mismatch: dropped (a stopped run
 *                          or a newer generation, which brings its own started event)
 *                  -> anything else: due again after backoff (1 s .. 30 s, jitter), and
 *                          never later than a quarter of what the held one has left
 *   forget (the run ended, or its `stopped` event was accepted) -> dropped
 *
 * Locking: one mutex over the table; a request runs without it and its answer is applied
 * only when the entry is still there with the same generation. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "report/bb_report.h"
#include "sdclient.h"
#include "sdlog.h"
#include "sdproto.h"
#include "sdtime.h"
#include "sdutil.h"

#define RETRY_MIN_MS 1000
#define RETRY_MAX_MS 30000
#define ENTRIES_MAX 65536 /* far above any machine's instances: a bound, not a tunable */
#define LOG_BURST 5       /* lines a second, the next saying how many were held back */

typedef struct {
    char id[SD_NAME_MAX + 1];
    int64_t generation;
    char *jwt;          /* the one held (malloc'd), NULL before the first */
    int64_t expires;    /* mono ms when the held one expires */
    int64_t due;        /* mono ms of the next request */
    int attempt;        /* consecutive failures */
    int fresh;          /* obtained, not taken by the supervision thread yet */
} entry_t;

struct bb_cred {
    char cluster[SD_NAME_MAX + 1], machine[SD_NAME_MAX + 1];
    int renew_percent;
    sdc_t *client; /* credential thread only */
    int efd;       /* eventfd: readable when an entry is fresh */
    uint64_t rng;
    pthread_t thread;
    int has_thread;
    int64_t log_window, log_burst, log_held; /* credential thread only */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    entry_t *e;
    int n, cap;

    _Atomic int64_t obtained, renewed, failed;
};

/* The entry of instance id, or NULL (mu held). */
static entry_t *entry_find(bb_cred_t *c, const char *id)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].id, id))
            return &c->e[i];
    return NULL;
}

static void entry_drop(bb_cred_t *c, entry_t *e)
{
    free(e->jwt);
    *e = c->e[--c->n];
}

/* Whether this log line may be written (LOG_BURST a second); *held gets the count held
 * back since the last one written. Credential thread only. */
static int log_ok(bb_cred_t *c, int64_t *held)
{
    int64_t now = sd_mono_ms();
    if (now - c->log_window >= 1000) {
        c->log_window = now;
        c->log_burst = 0;
    }
    if (c->log_burst >= LOG_BURST) {
        c->log_held++;
        return 0;
    }
    c->log_burst++;
    *held = c->log_held;
    c->log_held = 0;
    return 1;
}

static void kick(bb_cred_t *c)
{
    pthread_cond_signal(&c->cv);
}

void bb_cred_want(bb_cred_t *c, const char *instance, int64_t generation)
{
    if (!c || !sd_name_valid(instance, SD_NAME_MAX))
        return;
    pthread_mutex_lock(&c->mu);
    entry_t *e = entry_find(c, instance);
    if (e && e->generation == generation) {
        pthread_mutex_unlock(&c->mu);
        return; /* held or under way already (a resent started event) */
    }
    if (!e && c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        entry_t *ne = cap <= ENTRIES_MAX ? realloc(c->e, (size_t)cap * sizeof *ne) : NULL;
        if (!ne) {
            pthread_mutex_unlock(&c->mu);
            log_error("credential not requested: table full", "instance=%s entries=%d", instance,
                      c->n);
            return;
        }
        c->e = ne;
        c->cap = cap;
    }
    if (e)
        free(e->jwt); /* a new run of the same instance id: start over */
    else
        e = &c->e[c->n++];
    *e = (entry_t){.generation = generation};
    sd_strlcpy(e->id, instance, sizeof e->id);
    kick(c);
    pthread_mutex_unlock(&c->mu);
}

void bb_cred_forget(bb_cred_t *c, const char *instance)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    entry_t *e = entry_find(c, instance);
    if (e)
        entry_drop(c, e);
    pthread_mutex_unlock(&c->mu);
}

void bb_cred_on_accepted(void *ctx, const char *rec, size_t len)
{
    bb_cred_t *c = ctx;
    json_t *ev = json_loadb(rec, len, 0, NULL);
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *id = json_string_value(json_object_get(ev, "instance"));
    json_t *gen = json_object_get(ev, "generation");
    if (type && id && !strcmp(type, sd_event_type_name(SD_EV_STARTED)) && json_is_integer(gen))
        bb_cred_want(c, id, json_integer_value(gen));
    else if (type && id && !strcmp(type, sd_event_type_name(SD_EV_STOPPED)))
        bb_cred_forget(c, id);
    json_decref(ev);
}

int bb_cred_fd(const bb_cred_t *c) { return c ? c->efd : -1; }

int bb_cred_take(bb_cred_t *c, char *instance, int64_t *generation, char *jwt, size_t cap)
{
    uint64_t drained;
    if (read(c->efd, &drained, sizeof drained) < 0 && errno != EAGAIN)
        log_warn("credential eventfd read failed", "error=%s", strerror(errno));
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n && !found; i++) {
        entry_t *e = &c->e[i];
        if (!e->fresh)
            continue;
        e->fresh = 0;
        if (strlen(e->jwt) >= cap)
            continue; /* sdc_instance_credential caps it at SDC_CREDENTIAL_MAX */
        sd_strlcpy(instance, e->id, SD_NAME_MAX + 1);
        strcpy(jwt, e->jwt);
        *generation = e->generation;
        found = 1;
    }
    int more = 0;
    for (int i = 0; i < c->n && !more; i++)
        more = c->e[i].fresh;
    pthread_mutex_unlock(&c->mu);
    if (more) {
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof one) < 0)
            log_warn("credential eventfd write failed", "error=%s", strerror(errno));
    }
    return found;
}

int bb_cred_get(bb_cred_t *c, const char *instance, int64_t generation, char *jwt, size_t cap)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    entry_t *e = entry_find(c, instance);
    int n = 0;
    if (e && e->jwt && e->generation == generation && strlen(e->jwt) < cap) {
        n = (int)strlen(e->jwt);
        memcpy(jwt, e->jwt, (size_t)n + 1);
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

void bb_cred_counts(const bb_cred_t *c, int64_t *obtained, int64_t *renewed, int64_t *failed)
{
    *obtained = c ? atomic_load(&c->obtained) : 0;
    *renewed = c ? atomic_load(&c->renewed) : 0;
    *failed = c ? atomic_load(&c->failed) : 0;
}

/* The answer is a refusal that no retry changes: the run is over, or another one holds
 * the instance. */
static int refusal_is_final(int rc, const sdc_err_t *err)
{
    return rc == SDC_E_HTTP && err->status == 409 &&
           (!strcmp(err->code, "instance_stopped") || !strcmp(err->code, "generation_mismatch"));
}

/* Applies the answer to the request for (id, gen) sent at `sent` (mu held). */
static void apply(bb_cred_t *c, const char *id, int64_t gen, int64_t sent, int rc,
                  const sdc_err_t *err, char *jwt, int64_t left_ms)
{
    entry_t *e = entry_find(c, id);
    int64_t now = sd_mono_ms(), held = 0;
    if (!e || e->generation != gen) {
        free(jwt); /* forgotten (or re-wanted for a newer run) meanwhile */
        return;
    }
    if (rc == SDC_OK) {
        int renewal = e->jwt != NULL;
        free(e->jwt);
        e->jwt = jwt;
        e->expires = sent + left_ms;
        e->due = sent + left_ms - left_ms * c->renew_percent / 100;
        e->attempt = 0;
        e->fresh = 1;
        atomic_fetch_add(renewal ? &c->renewed : &c->obtained, 1);
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof one) < 0)
            log_warn("credential eventfd write failed", "error=%s", strerror(errno));
        if (log_ok(c, &held))
            log_info(renewal ? "credential renewed" : "credential obtained",
                     "instance=%s generation=%" PRId64 " expires_in_ms=%" PRId64
                     " renew_in_ms=%" PRId64 " held_back=%" PRId64,
                     id, gen, left_ms, e->due - now, held);
        return;
    }
    atomic_fetch_add(&c->failed, 1);
    char msg[400];
    sdc_strerror(rc, err, msg, sizeof msg);
    if (refusal_is_final(rc, err)) {
        if (log_ok(c, &held))
            log_warn("credential refused, not retried", "instance=%s generation=%" PRId64
                     " error=%s held_back=%" PRId64, id, gen, msg, held);
        entry_drop(c, e);
        return;
    }
    c->rng = c->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    int64_t wait = sd_backoff_ms(RETRY_MIN_MS, RETRY_MAX_MS, e->attempt++, (uint32_t)(c->rng >> 33));
    if (e->jwt && e->expires > now && wait > (e->expires - now) / 4)
        wait = (e->expires - now) / 4 > RETRY_MIN_MS / 4 ? (e->expires - now) / 4 : RETRY_MIN_MS / 4;
    e->due = now + wait;
    if (log_ok(c, &held))
        log_warn("credential request failed", "instance=%s generation=%" PRId64 " error=%s"
                 " attempt=%d retry_in_ms=%" PRId64 " held_valid_ms=%" PRId64 " held_back=%" PRId64,
                 id, gen, msg, e->attempt, wait, e->jwt ? e->expires - now : 0, held);
}

static void *cred_main(void *arg)
{
    bb_cred_t *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        int64_t now = sd_mono_ms(), next = INT64_MAX;
        entry_t *due = NULL;
        for (int i = 0; i < c->n; i++) {
            if (c->e[i].due <= now && (!due || c->e[i].due < due->due))
                due = &c->e[i];
            if (c->e[i].due < next)
                next = c->e[i].due;
        }
        if (!due) {
            if (next == INT64_MAX) {
                pthread_cond_wait(&c->cv, &c->mu);
            } else {
                struct timespec ts = sd_timespec_after_ms(CLOCK_MONOTONIC, next - now);
                pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            }
            continue;
        }
        char id[SD_NAME_MAX + 1];
        sd_strlcpy(id, due->id, sizeof id);
        int64_t gen = due->generation;
        due->due = INT64_MAX; /* in flight: a want() of a new generation resets it */
        pthread_mutex_unlock(&c->mu);
        char *jwt = NULL;
        int64_t left = 0;
        sdc_err_t err = {0};
        int64_t sent = sd_mono_ms();
        int rc = sdc_instance_credential(c->client, c->cluster, c->machine, id, gen, &jwt, &left,
                                         &err);
        if (rc == SDC_OK && left <= 0) {
            free(jwt);
            jwt = NULL;
            rc = SDC_E_PROTO;
            snprintf(err.message, sizeof err.message, "the credential expires at once");
        }
        pthread_mutex_lock(&c->mu);
        apply(c, id, gen, sent, rc, &err, jwt, left);
        sdc_err_clear(&err);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int bb_cred_start(const bb_cred_opts_t *o, bb_cred_t **out)
{
    *out = NULL;
    if (!o->urls || !*o->urls || !sd_name_valid(o->cluster, SD_NAME_MAX) ||
        !sd_name_valid(o->machine, SD_NAME_MAX) || o->renew_percent < 1 || o->renew_percent > 99)
        return -EINVAL;
    bb_cred_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->efd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    sd_strlcpy(c->cluster, o->cluster, sizeof c->cluster);
    sd_strlcpy(c->machine, o->machine, sizeof c->machine);
    c->renew_percent = o->renew_percent;
    if (getrandom(&c->rng, sizeof c->rng, 0) != sizeof c->rng)
        c->rng = (uint64_t)sd_mono_us();
    int rc = -EINVAL;
    if (!(c->client = sdc_new(o->urls, o->token, o->timeout_ms > 0 ? o->timeout_ms : 2000)))
        goto fail;
    if ((c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = -errno;
        goto fail;
    }
    if ((rc = -pthread_create(&c->thread, NULL, cred_main, c)))
        goto fail;
    c->has_thread = 1;
    log_info("instance credentials on", "renew_percent=%d", c->renew_percent);
    *out = c;
    return 0;
fail:
    bb_cred_stop(c);
    return rc;
}

void bb_cred_stop(bb_cred_t *c)
{
    if (!c)
        return;
    if (c->has_thread) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        kick(c);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    for (int i = 0; i < c->n; i++)
        free(c->e[i].jwt);
    free(c->e);
    sdc_free(c->client);
    if (c->efd >= 0)
        close(c->efd);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
