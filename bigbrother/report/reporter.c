/* The reporter: bb_report_event() appends events to the outbox on the supervision thread;
 * one reporter thread sends them to ServerDir in order and renews the machine lease.
 *
 * The reporter thread interleaves two jobs with deadlines rather than blocking one on the
 * other: each has its own libsdclient handle (its own connection), and every request is
 * bounded by a timeout of ttl / (6 × number of URLs), at most 2 s. So a stuck event POST
 * delays a lease renewal that is due by at most ttl/6 (it still lands before ttl/2), and
 * a failing lease never holds events back longer than that either. When one job's
 * request gets through after ServerDir was down, the other's backoff is cut short (once),
 * so a lease that lapsed in the outage is renewed with the first batch sent after it.
 *
 * Sending, per batch (up to 500 events, about 512 KiB), with libsdclient's
 * sdc_events_post (the lease: sdc_machine_put):
 *   read from the outbox head -> fdatasync -> POST -> 2xx: ack (drop from the outbox)
 *                                              -> 400/413: bisect the batch; a single
 *                                                 rejected event goes to the dead-letter
 *                                                 file and is acked (never wedges)
 *                                              -> anything else: retry after backoff
 *                                                 (100 ms .. 30 s, jitter); after a
 *                                                 timeout, with half as many events
 * Events are never dropped unacknowledged; ServerDir dedupes resends by event id.
 *
 * After a new registration (the lease had run out, or this is the first one: its
 * registered_at_ms changed) the machine may have been declared lost meanwhile, by the
 * primary or serverdir's sweep, and the records of processes still running here marked
 * stopped. Once the outbox is empty (every event written before is in the directory),
 * the thread reads the machine's live records (GET .../processes?machine=, every page)
 * and hands them to the supervision thread (bb_report_take_live), which restarts as new
 * runs the processes the directory no longer holds live (instance/table.c). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "report/bb_report.h"
#include "sdclient.h"
#include "sdlog.h"
#include "sdtime.h"
#include "sdproto.h"
#include "sdutil.h"

#define BATCH_MAX 500
#define BATCH_BYTES (512u << 10)
_Static_assert(BATCH_MAX <= SD_EVENTS_MAX && BATCH_BYTES <= SD_BODY_MAX_DEFAULT,
               "a batch must fit what ServerDir takes in one POST");
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 30000
#define DEADLETTER_MAX (16u << 20)
#define BATCH_MIN_ON_TIMEOUT 25
#define ID_MACHINE_MAX 88 /* machine part of an event id, so the id stays <= 128 bytes */

typedef struct {
    const char *name;   /* "events" or "machine_lease", for the logs */
    int64_t down_since; /* mono ms when it stopped getting answers, 0 while it gets them */
    char refusal[64];   /* error code last logged as a refusal, to log each once */
} channel_t;

struct bb_report {
    outbox_t *ob;
    char cluster[SD_NAME_MAX + 1];
    char machine[SD_NAME_MAX + 1];
    char runid[17];
    char deadletter[PATH_MAX];

    /* producer (supervision thread) only */
    uint64_t seq;
    int full;
    int64_t dropped;

    /* reporter thread */
    void (*accepted)(void *ctx, const char *rec, size_t len);
    void *accepted_ctx;
    char *urls, *token;
    sdc_t *ev_client, *lease_client; /* one connection each: events, machine lease */
    sdc_machine_lease_t lease; /* points at address, version, labels below */
    char *address, *version;
    json_t *labels;
    int ttl_ms, timeout_ms;
    uint64_t rng;
    channel_t ev_ch, lease_ch;
    pthread_t thread;
    int has_thread;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int renew_now;     /* bb_report_renew_now: renew the lease before anything else */
    uint64_t kicks;

    _Atomic int64_t failures;
    _Atomic int64_t lease_ok_mono; /* when ServerDir last accepted the lease, 0: never */
    /* that accepted renewal: when it was sent and when its answer came (mono ms), under mu
     * (bb_report_lease_last) */
    int64_t lease_sent, lease_answered;

    /* the directory check after a new registration (reporter thread) */
    int64_t registered_at;  /* the registration last seen (ServerDir's ms), 0: none */
    int recheck;            /* a read of the machine's live records is due */
    int64_t recheck_at;     /* not before (mono ms): after a failed read */
    /* handed to the supervision thread, under mu */
    int efd;                /* eventfd: readable when a read is waiting */
    json_t *live;           /* {instance: generation} of the last read, or NULL */
    int64_t live_since;     /* every event written before then (mono ms) is in it */
};

static uint64_t rng_next(bb_report_t *r)
{
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    return r->rng;
}

/* The jittered delay before retry number `attempt` of a request, at most cap_ms. */
static int64_t retry_in_ms(bb_report_t *r, int attempt, int64_t cap_ms)
{
    return sd_backoff_ms(BACKOFF_MIN_MS, cap_ms, attempt, (uint32_t)rng_next(r));
}

/* ServerDir answered this channel's request: log once if it had been unreachable. */
static void mark_reachable(bb_report_t *r, channel_t *ch)
{
    if (ch->down_since) {
        log_info("serverdir reachable again", "request=%s down_ms=%" PRId64 " pending=%" PRId64,
                 ch->name, sd_mono_ms() - ch->down_since, outbox_pending(r->ob));
        ch->down_since = 0;
    }
}

/* A request failed. Transport errors, 5xx and 429 mean "ServerDir unavailable" and are
 * logged once per outage; other answers (401, 403, 404...) once per distinct code, until
 * a request succeeds. Events and the lease keep separate states so that one working
 * while the other fails does not flap the log. */
static void mark_failure(bb_report_t *r, channel_t *ch, int rc, const sdc_err_t *err)
{
    char msg[400];
    sdc_strerror(rc, err, msg, sizeof msg);
    int unavailable = rc != SDC_E_HTTP || err->status >= 500 || err->status == 429;
    if (unavailable) {
        if (!ch->down_since) {
            log_warn("serverdir unreachable, events stay in the outbox", "request=%s error=%s pending=%" PRId64,
                     ch->name, msg, outbox_pending(r->ob));
            ch->down_since = sd_mono_ms();
        }
        return;
    }
    mark_reachable(r, ch);
    if (strcmp(ch->refusal, err->code) != 0) {
        log_error("serverdir refuses requests, retrying", "request=%s error=%s", ch->name, msg);
        sd_strlcpy(ch->refusal, err->code, sizeof ch->refusal);
    }
}

/* Appends a rejected event to the dead-letter file with ServerDir's answer, synced, so
 * that it can be inspected and replayed by hand. The file is rotated to .1 at 16 MiB. */
static int deadletter_write(bb_report_t *r, const char *rec, size_t len, const sdc_err_t *err)
{
    struct stat st;
    if (stat(r->deadletter, &st) == 0 && st.st_size > DEADLETTER_MAX) {
        char old[PATH_MAX + 2];
        snprintf(old, sizeof old, "%s.1", r->deadletter);
        if (rename(r->deadletter, old) < 0)
            log_error("dead-letter file rotation failed", "path=%s errno=%d", r->deadletter, errno);
    }
    json_t *ev = json_loadb(rec, len, 0, NULL);
    json_t *line = json_pack("{s:I, s:I, s:s, s:s, s:o}", "ts_ms", (json_int_t)sd_wall_ms(),
                             "status", (json_int_t)err->status, "code", err->code,
                             "message", err->message,
                             "event", ev ? ev : json_stringn(rec, len));
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    if (!text)
        return -ENOMEM;
    size_t n = strlen(text);
    text[n++] = '\n'; /* replaces the NUL: written with its length */
    int fd = open(r->deadletter, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    int rc = 0;
    if (fd < 0 || write(fd, text, n) != (ssize_t)n || fdatasync(fd) < 0)
        rc = errno ? -errno : -EIO;
    if (fd >= 0)
        close(fd);
    free(text);
    return rc;
}

enum { SEND_IDLE, SEND_PROGRESS, SEND_RETRY };

typedef struct {
    outbox_batch_t b;
    int batch_max;   /* halves while a rejected batch is bisected */
    int bisect_left; /* records of the rejected batch not yet accepted or dead-lettered */
    int size_cap;    /* halves after a failed try (a batch too slow for the timeout must
                        not fail forever), doubles back after each success */
} sender_t;

/* Sends one batch from the outbox head. Returns SEND_IDLE when nothing is pending,
 * SEND_PROGRESS when the head moved or the next try should come at once (bisecting),
 * SEND_RETRY when the same batch must be retried after backoff. */
static int send_batch(bb_report_t *r, sdc_t *c, sender_t *s)
{
    int rc = outbox_read(r->ob, s->batch_max < s->size_cap ? s->batch_max : s->size_cap,
                         BATCH_BYTES, &s->b);
    if (!rc && s->b.n == 0)
        return SEND_IDLE;
    if (!rc)
        rc = outbox_sync(r->ob, &s->b);
    if (rc) {
        log_error("outbox read failed", "errno=%d", -rc);
        return SEND_RETRY;
    }
    json_t *events = json_array();
    for (int i = 0; i < s->b.n; i++) {
        json_t *ev = json_loadb(s->b.rec[i], s->b.len[i], 0, NULL);
        json_array_append_new(events, ev ? ev : json_stringn(s->b.rec[i], s->b.len[i]));
    }
    sdc_err_t err = {0};
    int accepted = 0, duplicates = 0;
    rc = sdc_events_post(c, r->cluster, events, &accepted, &duplicates, &err);
    json_decref(events);
    int n = s->b.n, ret = SEND_PROGRESS;
    if (rc == SDC_E_PROTO && err.status >= 200 && err.status < 300) {
        /* ServerDir applied the batch (2xx) but its answer was not the expected shape:
         * resending would not change that, so the batch counts as delivered. */
        log_warn("serverdir answered events with an unexpected body", "error=%s", err.message);
        rc = SDC_OK;
    }
    if (rc == SDC_OK) {
        log_debug("events delivered", "events=%d accepted=%d duplicates=%d", n, accepted, duplicates);
        mark_reachable(r, &r->ev_ch);
        r->ev_ch.refusal[0] = '\0';
        s->size_cap = s->size_cap * 2 > BATCH_MAX ? BATCH_MAX : s->size_cap * 2;
        if (outbox_ack(r->ob, &s->b, n)) {
            log_error("outbox ack failed, the batch will be sent again", "events=%d", n);
            ret = SEND_RETRY;
        } else if (r->accepted) {
            for (int i = 0; i < n; i++)
                r->accepted(r->accepted_ctx, s->b.rec[i], s->b.len[i]);
        }
        if (ret == SEND_PROGRESS && s->bisect_left && (s->bisect_left -= n) <= 0) {
            s->bisect_left = 0;
            s->batch_max = BATCH_MAX;
        }
    } else if (rc == SDC_E_HTTP && (err.status == 400 || err.status == 413)) {
        mark_reachable(r, &r->ev_ch);
        if (n > 1) {
            if (!s->bisect_left) {
                log_warn("serverdir rejected a batch, bisecting it to find the bad event",
                         "events=%d status=%ld code=%s message=%s", n, err.status, err.code, err.message);
                s->bisect_left = n;
            }
            s->batch_max = n / 2;
        } else {
            json_t *ev = json_loadb(s->b.rec[0], s->b.len[0], 0, NULL);
            log_error("serverdir rejected an event, moved to the dead-letter file",
                      "status=%ld code=%s message=%s id=%s instance=%s type=%s file=%s", err.status,
                      err.code, err.message, json_string_value(json_object_get(ev, "id")),
                      json_string_value(json_object_get(ev, "instance")),
                      json_string_value(json_object_get(ev, "type")), r->deadletter);
            json_decref(ev);
            if (deadletter_write(r, s->b.rec[0], s->b.len[0], &err) || outbox_ack(r->ob, &s->b, 1)) {
                log_error("cannot move the rejected event aside, retrying", "file=%s", r->deadletter);
                ret = SEND_RETRY;
            } else {
                s->bisect_left = 0;
                s->batch_max = BATCH_MAX;
            }
        }
    } else {
        atomic_fetch_add(&r->failures, 1);
        mark_failure(r, &r->ev_ch, rc, &err);
        if (rc == SDC_E_TRANSPORT)
            s->size_cap = s->size_cap / 2 < BATCH_MIN_ON_TIMEOUT ? BATCH_MIN_ON_TIMEOUT : s->size_cap / 2;
        ret = SEND_RETRY;
    }
    sdc_err_clear(&err);
    return ret;
}

/* Registers or renews the machine lease. Returns 0 when ServerDir accepted it; *took_ms
 * gets how long the call took. */
static int lease_renew(bb_report_t *r, sdc_t *c, int64_t *took_ms)
{
    sdc_err_t err;
    int64_t reg = 0, sent = sd_mono_ms();
    int rc = sdc_machine_put(c, r->cluster, r->machine, &r->lease, NULL, &reg, &err);
    int64_t answered = sd_mono_ms();
    *took_ms = answered - sent;
    if (rc == SDC_OK) {
        atomic_store(&r->lease_ok_mono, answered);
        pthread_mutex_lock(&r->mu);
        r->lease_sent = sent;
        r->lease_answered = answered;
        pthread_mutex_unlock(&r->mu);
        if (reg != r->registered_at) {
            if (r->registered_at)
                log_warn("machine lease registered anew: it had run out",
                         "registered_at_ms=%" PRId64, reg);
            r->registered_at = reg;
            r->recheck = 1;
            r->recheck_at = 0;
        }
        mark_reachable(r, &r->lease_ch);
        r->lease_ch.refusal[0] = '\0';
    } else {
        mark_failure(r, &r->lease_ch, rc, &err);
    }
    sdc_err_clear(&err);
    return rc;
}

/* The read after a new registration: the machine's live records, handed to the
 * supervision thread with the time before the read (the outbox was empty then). */
static void recheck_live(bb_report_t *r, sdc_t *c)
{
    int64_t t = sd_mono_ms();
    sdc_proc_filter_t f = {.machine = r->machine};
    json_t *list = NULL, *live = json_object();
    sdc_err_t err = {0};
    int rc = live ? sdc_processes_list(c, r->cluster, &f, &list, &err) : SDC_E_NOMEM;
    if (rc != SDC_OK) {
        char why[320];
        log_warn("directory check after registration failed: retried",
                 "error=%s", sdc_strerror(rc, &err, why, sizeof why));
        sdc_err_clear(&err);
        json_decref(live);
        r->recheck_at = sd_deadline_ms(sd_mono_ms(), r->ttl_ms / 3);
        return;
    }
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(list, "processes"), i, p) {
        const char *id = json_string_value(json_object_get(p, "instance"));
        if (id)
            json_object_set(live, id, json_object_get(p, "generation"));
    }
    json_decref(list);
    sdc_err_clear(&err);
    r->recheck = 0;
    pthread_mutex_lock(&r->mu);
    json_decref(r->live);
    r->live = live;
    r->live_since = t;
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    if (write(r->efd, &one, sizeof one) < 0)
        log_warn("reporter eventfd write failed", "error=%s", strerror(errno));
}

static void *reporter_main(void *arg)
{
    bb_report_t *r = arg;
    sdc_t *events = r->ev_client, *lease = r->lease_client;
    sender_t s = {.batch_max = BATCH_MAX, .size_cap = BATCH_MAX};
    int64_t lease_due = 0, retry_at = 0;
    int lease_fails = 0, fails = 0; /* consecutive failures: the backoff attempt */
    int lease_hurried = 0; /* the failing lease was retried early once, see below */
    int lease_again = 0;   /* the last renewal was sent at once after a slow answer */
    uint64_t seen_kicks = 0;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int stop = r->stop, renew_now = r->renew_now;
        r->renew_now = 0;
        pthread_mutex_unlock(&r->mu);
        if (stop)
            break;
        if (renew_now)
            lease_due = 0;
        int64_t now = sd_mono_ms();
        if (now >= lease_due) {
            int64_t took = 0;
            if (lease_renew(r, lease, &took) == SDC_OK) {
                /* ServerDir is back: events waiting out a backoff go now, not seconds
                 * later (the backoff grows while it is down). */
                if (lease_fails > 0 && fails > 0)
                    retry_at = 0;
                lease_fails = 0;
                lease_hurried = 0;
                /* An answer that took a sixth of the lease may come from before a pause
                 * of this process (the lease may have run out since ServerDir wrote it,
                 * and converge waits for a renewal sent after the pause): renew again at
                 * once rather than a third of a lease later (once: a ServerDir that is
                 * just slow is not asked back to back). */
                int again = took > r->ttl_ms / 6 && !lease_again;
                lease_again = again;
                lease_due = again ? 0 : sd_deadline_ms(sd_mono_ms(), r->ttl_ms / 3);
            } else {
                lease_due = sd_deadline_ms(sd_mono_ms(),
                                           retry_in_ms(r, lease_fails++, r->ttl_ms / 3));
            }
            continue;
        }
        if (r->recheck && now >= r->recheck_at && outbox_pending(r->ob) == 0) {
            recheck_live(r, lease);
            continue;
        }
        if (outbox_pending(r->ob) > 0 && now >= retry_at) {
            int st = send_batch(r, events, &s);
            if (st == SEND_PROGRESS) {
                fails = 0;
                retry_at = 0;
                /* ServerDir answered while the lease is failing: after an outage the
                 * lease may have lapsed (the machine shows lost), so renew it now
                 * rather than at the end of its backoff. Once per lease outage, so a
                 * lease refused while events pass does not follow every batch. */
                if (lease_fails > 0 && !lease_hurried) {
                    lease_hurried = 1;
                    lease_due = 0;
                }
                continue;
            }
            if (st == SEND_RETRY)
                retry_at = sd_deadline_ms(sd_mono_ms(), retry_in_ms(r, fails++, BACKOFF_MAX_MS));
        }
        int64_t deadline = lease_due;
        if (outbox_pending(r->ob) > 0 && retry_at < deadline)
            deadline = retry_at;
        if (r->recheck && outbox_pending(r->ob) == 0 && r->recheck_at < deadline)
            deadline = r->recheck_at;
        struct timespec ts =
            sd_timespec_after_ms(CLOCK_MONOTONIC, sd_ms_left(deadline, sd_mono_ms()));
        pthread_mutex_lock(&r->mu);
        while (!r->stop && r->kicks == seen_kicks &&
               pthread_cond_timedwait(&r->cv, &r->mu, &ts) != ETIMEDOUT)
            ;
        seen_kicks = r->kicks;
        pthread_mutex_unlock(&r->mu);
    }
    outbox_batch_free(&s.b);
    return NULL;
}

/* Copies the machine's lease details (the reporter owns the copies). Returns 0 or -ENOMEM. */
static int lease_init(bb_report_t *r, const bb_report_opts_t *o)
{
    r->lease.capacity = o->capacity > 0 ? o->capacity : -1;
    r->lease.ttl_ms = r->ttl_ms;
    r->lease.logs_port = o->logs_port;
    if (o->address && *o->address && !(r->address = strdup(o->address)))
        return -ENOMEM;
    if (o->version && *o->version && !(r->version = strdup(o->version)))
        return -ENOMEM;
    if (o->labels && !(r->labels = json_deep_copy(o->labels)))
        return -ENOMEM;
    r->lease.address = r->address;
    r->lease.version = r->version;
    r->lease.labels = r->labels;
    return 0;
}

int bb_report_start(const bb_report_opts_t *opts, bb_report_t **out)
{
    *out = NULL;
    if (!opts->state_dir || !sd_name_valid(opts->cluster, SD_NAME_MAX) ||
        !sd_name_valid(opts->machine, SD_NAME_MAX) || (opts->labels && !json_is_object(opts->labels)) ||
        (opts->lease_ttl_ms && (opts->lease_ttl_ms < 1000 || opts->lease_ttl_ms > 300000)))
        return -EINVAL;
    bb_report_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    pthread_mutex_init(&r->mu, NULL);
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->efd < 0) {
        int e = errno;
        pthread_mutex_destroy(&r->mu);
        free(r);
        return -e;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    sd_strlcpy(r->cluster, opts->cluster, sizeof r->cluster);
    sd_strlcpy(r->machine, opts->machine, sizeof r->machine);
    char dir[PATH_MAX];
    int rc = -ENAMETOOLONG;
    if (snprintf(dir, sizeof dir, "%s/outbox", opts->state_dir) >= (int)sizeof dir ||
        snprintf(r->deadletter, sizeof r->deadletter, "%s/dead-letter.jsonl", opts->state_dir) >=
            (int)sizeof r->deadletter)
        goto fail;
    /* A fresh run id per start: ids stay unique without trusting a counter on disk, and
     * every id is written into its record, so a resend after a restart reuses it. */
    if ((rc = sd_random_hex(r->runid, 8)))
        goto fail;
    if ((rc = outbox_open(dir, NULL, &r->ob)))
        goto fail;
    if (!opts->urls || !*opts->urls) {
        log_info("reporter standalone: events are kept in the outbox only", "dir=%s pending=%" PRId64,
                 dir, outbox_pending(r->ob));
        *out = r;
        return 0;
    }
    int nurls = 1;
    for (const char *p = opts->urls; *p; p++)
        nurls += *p == ',';
    r->ttl_ms = opts->lease_ttl_ms > 0 ? opts->lease_ttl_ms : 15000;
    r->timeout_ms = r->ttl_ms / (6 * nurls);
    r->timeout_ms = r->timeout_ms < 250 ? 250 : r->timeout_ms > 2000 ? 2000 : r->timeout_ms;
    r->accepted = opts->accepted;
    r->accepted_ctx = opts->accepted_ctx;
    r->ev_ch.name = "events";
    r->lease_ch.name = "machine_lease";
    r->urls = strdup(opts->urls);
    r->token = opts->token ? strdup(opts->token) : NULL;
    if (getrandom(&r->rng, sizeof r->rng, 0) != sizeof r->rng || !r->rng)
        r->rng = (uint64_t)sd_mono_us() | 1;
    rc = -ENOMEM;
    if (!r->urls || (opts->token && !r->token) || lease_init(r, opts))
        goto fail;
    rc = -EINVAL; /* sdc_new fails on a bad URL list (or no memory) */
    r->ev_client = sdc_new(r->urls, r->token, r->timeout_ms);
    r->lease_client = sdc_new(r->urls, r->token, r->timeout_ms);
    if (!r->ev_client || !r->lease_client)
        goto fail;
    if ((rc = -pthread_create(&r->thread, NULL, reporter_main, r)))
        goto fail;
    r->has_thread = 1;
    log_info("reporter started", "cluster=%s machine=%s pending=%" PRId64 " lease_ttl_ms=%d",
             r->cluster, r->machine, outbox_pending(r->ob), r->ttl_ms);
    *out = r;
    return 0;
fail:
    bb_report_stop(r);
    return rc;
}

int bb_report_event(bb_report_t *r, json_t *event)
{
    if (!json_is_object(event))
        return -EINVAL;
    json_t *e = json_copy(event);
    if (!e)
        return -ENOMEM;
    if (!json_object_get(e, "id")) {
        char id[SD_NAME_MAX + 1];
        snprintf(id, sizeof id, "%.*s-%s-%06" PRIu64, ID_MACHINE_MAX, r->machine, r->runid, ++r->seq);
        json_object_set_new(e, "id", json_string(id));
    }
    if (!json_object_get(e, "machine"))
        json_object_set_new(e, "machine", json_string(r->machine));
    if (!json_object_get(e, "ts_ms"))
        json_object_set_new(e, "ts_ms", json_integer(sd_wall_ms()));
    /* The contract ServerDir checks, here too: a bug in the caller fails loudly now
     * instead of poisoning the outbox. */
    char err[256];
    sd_jv_t v;
    sd_jv_init(&v, "event", err, sizeof err);
    if (sd_event_check(&v, e)) {
        log_error("event breaks the events contract, not reported", "error=%s", err);
        json_decref(e);
        return -EINVAL;
    }
    char *text = json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(e);
    if (!text)
        return -ENOMEM;
    int rc = outbox_append(r->ob, text, strlen(text));
    free(text);
    if (rc == -ENOSPC) {
        if (!r->full)
            log_error("outbox full, new events are dropped until serverdir takes the backlog",
                      "bytes=%" PRIu64 " pending=%" PRId64, outbox_bytes(r->ob), outbox_pending(r->ob));
        r->full = 1;
        r->dropped++;
        return rc;
    }
    if (rc)
        return rc;
    if (r->full) {
        log_warn("outbox accepts events again", "dropped=%" PRId64, r->dropped);
        r->full = 0;
        r->dropped = 0;
    }
    pthread_mutex_lock(&r->mu);
    r->kicks++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int64_t bb_report_pending(const bb_report_t *r) { return outbox_pending(r->ob); }

int bb_report_fd(const bb_report_t *r) { return r ? r->efd : -1; }

json_t *bb_report_take_live(bb_report_t *r, int64_t *since)
{
    uint64_t drained;
    if (read(r->efd, &drained, sizeof drained) < 0 && errno != EAGAIN)
        log_warn("reporter eventfd read failed", "error=%s", strerror(errno));
    pthread_mutex_lock(&r->mu);
    json_t *live = r->live;
    *since = r->live_since;
    r->live = NULL;
    pthread_mutex_unlock(&r->mu);
    return live;
}

int64_t bb_report_send_failures(const bb_report_t *r) { return atomic_load(&r->failures); }

int64_t bb_report_lease_ok_ms(const bb_report_t *r)
{
    return r ? atomic_load(&r->lease_ok_mono) : 0;
}

void bb_report_renew_now(bb_report_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->renew_now = 1;
    r->kicks++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void bb_report_lease_last(bb_report_t *r, int64_t *sent, int64_t *answered)
{
    *sent = *answered = 0;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    *sent = r->lease_sent;
    *answered = r->lease_answered;
    pthread_mutex_unlock(&r->mu);
}

void bb_report_stop(bb_report_t *r)
{
    if (!r)
        return;
    if (r->has_thread) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    outbox_close(r->ob);
    sdc_free(r->ev_client);
    sdc_free(r->lease_client);
    free(r->address);
    free(r->version);
    json_decref(r->labels);
    free(r->urls);
    free(r->token);
    json_decref(r->live);
    close(r->efd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
