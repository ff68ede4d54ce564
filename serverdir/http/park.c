/* Parked requests: one thread for every request that waits for a change (park.h).
 *
 * Why one multiplexed thread: a parked request costs a list entry here, not a thread
 * (and a Redis connection) of its own, so thousands of lock waits and long-polls cost
 * what a few do; the wake-up sources are shared too (one subscriber for every long-poll,
 * one blocking pop over every waited lock key). Workers hand new entries over through a
 * mutex-guarded list and an eventfd; everything else is owned by the thread.
 *
 * Each pass: take over new entries (marked to be tried), try every entry that was woken,
 * whose retry time came or whose deadline passed (all of them once serverdir stops:
 * they are answered then, which is how shutdown drains them), let each source prepare,
 * then poll the eventfd and the sources' fds until the nearest retry time or deadline,
 * at most POLL_CAP_MS (how fast a shutdown is noticed). */
#include "park.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define POLL_CAP_MS 250
#define KINDS_MAX 8

typedef struct entry {
    struct entry *next;
    const sd_park_kind_t *kind;
    sd_req_t *req;
    sd_resp_t *resp;
    void *ctx;
    int64_t deadline_ms, retry_at_ms; /* retry_at_ms 0: none */
    int woken;
} entry_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry_t *incoming;                   /* handed over by workers (under mu) */
static const sd_park_kind_t *kinds[KINDS_MAX]; /* the kinds seen so far (under mu) */
static int nkinds;
static int wake_fd = -1;
static int started; /* under mu */

static entry_t *list; /* owned by the park thread, oldest first */

void sd_park_wake(const sd_park_kind_t *kind, int (*match)(void *ctx, void *arg), void *arg)
{
    for (entry_t *e = list; e; e = e->next)
        if (e->kind == kind && !e->woken && (!match || match(e->ctx, arg)))
            e->woken = 1;
}

void sd_park_each(const sd_park_kind_t *kind, void (*fn)(void *ctx, void *arg), void *arg)
{
    for (entry_t *e = list; e; e = e->next)
        if (e->kind == kind)
            fn(e->ctx, arg);
}

/* Tries every entry that is woken, due for a retry or past its deadline; answers and
 * frees those that are done. Returns the poll timeout: ms to the nearest retry time or
 * deadline, capped by POLL_CAP_MS. */
static int64_t try_entries(int64_t now, int stopping)
{
    int64_t timeout = POLL_CAP_MS;
    for (entry_t **pp = &list; *pp;) {
        entry_t *e = *pp;
        int due = now >= e->deadline_ms || stopping;
        if (e->woken || due || (e->retry_at_ms && now >= e->retry_at_ms)) {
            e->woken = 0;
            e->retry_at_ms = 0;
            if (e->kind->try_answer(e->ctx, e->resp, due, &e->retry_at_ms)) {
                /* released first: what ctx holds (a quota's place) is given back
                 * before the caller can see the answer and ask again */
                e->kind->release(e->ctx);
                sd_req_resume(e->req);
                *pp = e->next;
                free(e);
                continue;
            }
        }
        if (e->deadline_ms - now < timeout)
            timeout = e->deadline_ms - now;
        if (e->retry_at_ms && e->retry_at_ms - now < timeout)
            timeout = e->retry_at_ms - now;
        pp = &e->next;
    }
    return timeout;
}

/* Moves the entries workers handed over (under mu) to the end of the list, marked to be
 * tried, in the order they came: the list is oldest first, so a kind that wakes only
 * some of its entries (api_alloc.c: one waiter per change of a pool) serves the oldest
 * first. */
static void take_incoming(void)
{
    entry_t *fifo = NULL;
    while (incoming) { /* incoming is newest first */
        entry_t *e = incoming;
        incoming = e->next;
        e->woken = 1;
        e->next = fifo;
        fifo = e;
    }
    entry_t **tail = &list;
    while (*tail)
        tail = &(*tail)->next;
    *tail = fifo;
}

static void *park_main(void *arg)
{
    (void)arg;
    for (;;) {
        const sd_park_kind_t *ks[KINDS_MAX];
        pthread_mutex_lock(&mu);
        take_incoming();
        int nk = nkinds;
        for (int i = 0; i < nk; i++)
            ks[i] = kinds[i];
        pthread_mutex_unlock(&mu);

        int64_t now = sd_mono_ms();
        int64_t timeout = try_entries(now, sd_http_stopping());
        for (int i = 0; i < nk; i++)
            if (ks[i]->source_prepare)
                ks[i]->source_prepare(now);
        for (entry_t *e = list; e; e = e->next)
            if (e->woken)
                timeout = 0; /* a source woke entries while preparing */

        struct pollfd fds[1 + KINDS_MAX];
        fds[0] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
        for (int i = 0; i < nk; i++)
            fds[1 + i] = (struct pollfd){
                .fd = ks[i]->source_fd ? ks[i]->source_fd() : -1, .events = POLLIN};
        int n = poll(fds, (nfds_t)(1 + nk), (int)(timeout < 0 ? 0 : timeout));
        if (n < 0 && errno != EINTR) {
            log_error("park poll failed", "errno=%d", errno);
            continue;
        }
        if (fds[0].revents & POLLIN) {
            uint64_t x;
            if (read(wake_fd, &x, sizeof x) < 0 && errno != EAGAIN)
                log_error("park wake read failed", "errno=%d", errno);
        }
        for (int i = 0; i < nk; i++)
            if (fds[1 + i].fd >= 0 && (fds[1 + i].revents & (POLLIN | POLLERR | POLLHUP)))
                ks[i]->source_ready();
    }
    return NULL;
}

/* Starts the park thread on first use (under mu). 0, or -1 when it cannot start. */
static int start_locked(void)
{
    if (started)
        return 0;
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0)
        return -1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rc = pthread_create(&th, &attr, park_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(wake_fd);
        wake_fd = -1;
        return -1;
    }
    started = 1;
    return 0;
}

static int park(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
                int64_t deadline_ms, int suspend)
{
    entry_t *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    e->kind = kind;
    e->req = req;
    e->resp = resp;
    e->ctx = ctx;
    e->deadline_ms = deadline_ms;
    pthread_mutex_lock(&mu);
    int known = 0;
    for (int i = 0; i < nkinds; i++)
        known |= kinds[i] == kind;
    if (start_locked() || (!known && nkinds == KINDS_MAX)) {
        pthread_mutex_unlock(&mu);
        free(e);
        return -1;
    }
    if (!known)
        kinds[nkinds++] = kind;
    if (suspend)
        sd_req_park(req);
    e->next = incoming;
    incoming = e;
    pthread_mutex_unlock(&mu);
    uint64_t one = 1;
    if (write(wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_error("park wake failed", "errno=%d", errno);
    return 0;
}

int sd_park(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
            int64_t deadline_ms)
{
    return park(kind, req, resp, ctx, deadline_ms, 1);
}

int sd_park_suspended(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
                      int64_t deadline_ms)
{
    return park(kind, req, resp, ctx, deadline_ms, 0);
}

/* ---------- channel subscribers and capped kinds ---------- */

#define RESUBSCRIBE_MS 500

static void sub_gap(const sd_park_sub_t *s)
{
    if (s->on_gap)
        s->on_gap();
    else
        sd_park_wake(s->kind, NULL, NULL);
}

void sd_park_sub_prepare(sd_park_sub_t *s, int64_t now_ms)
{
    if (s->c || now_ms < s->next_try_ms)
        return;
    s->next_try_ms = now_ms + RESUBSCRIBE_MS;
    char chan[128];
    redisContext *c = sd_store_connect();
    if (!c)
        return;
    redisReply *r = redisCommand(c, "SUBSCRIBE %s", s->channel(chan, sizeof chan));
    int ok = r && r->type == REDIS_REPLY_ARRAY;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return;
    }
    s->c = c;
    log_info("subscriber connected", "of=%s channel=%s", s->what, chan);
    sub_gap(s);
}

int sd_park_sub_fd(const sd_park_sub_t *s) { return s->c ? s->c->fd : -1; }

int sd_park_sub_up(const sd_park_sub_t *s) { return s->c != NULL; }

void sd_park_sub_read(sd_park_sub_t *s)
{
    if (redisBufferRead(s->c) != REDIS_OK) {
        log_warn("subscriber lost", "of=%s err=%s", s->what, s->c->errstr);
        redisFree(s->c);
        s->c = NULL;
        sub_gap(s);
        return;
    }
    void *rv = NULL;
    while (redisGetReplyFromReader(s->c, &rv) == REDIS_OK && rv) {
        redisReply *r = rv;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            strcmp(sd_reply_str(r, 0), "message") == 0 &&
            r->element[2]->type == REDIS_REPLY_STRING)
            s->on_message(r->element[2]->str);
        freeReplyObject(r);
        rv = NULL;
    }
}

int sd_park_capped(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
                   int64_t deadline_ms, atomic_int *n, int max, const char *what)
{
    if (atomic_fetch_add(n, 1) >= max) {
        atomic_fetch_sub(n, 1);
        free(ctx);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error(resp, 429, "too_many_waiters", "%d %s are waiting already; retry", max,
                      what);
        return -1;
    }
    if (sd_park(kind, req, resp, ctx, deadline_ms)) {
        atomic_fetch_sub(n, 1);
        free(ctx);
        sd_resp_error(resp, 503, "too_many_waiters", "cannot start the waiter of %s", what);
        return -1;
    }
    return 0;
}
