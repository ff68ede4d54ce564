/* Assignment long-polls: GET .../machines/{m}/assignments?version=V&wait=MS parks the
 * request when the machine's document is still at version V. One waiter thread holds
 * every parked long-poll (hundreds of machines, no thread or worker each): it subscribes
 * to the assignments channel with a Redis connection of its own, and on a message naming
 * a machine (or "*" for the whole cluster) re-reads that machine's document with its
 * command connection and answers when the version moved. Deadlines are kept in the same
 * list; the poll timeout is the nearest one (capped so shutdown is noticed quickly).
 *
 * Missed messages: a waiter's document is read once when the thread takes it over (the
 * subscription is live by then, so a change after that read is always published to us),
 * and every waiter is re-read after the subscriber (re)connects. While Redis is
 * unreachable every waiter is re-read each RESUBSCRIBE_MS until it reconnects. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cluster.h"

#define POLL_CAP_MS 250      /* longest sleep: how fast a shutdown is noticed */
#define RESUBSCRIBE_MS 500   /* reconnect attempts of the subscriber */

typedef struct waiter {
    struct waiter *next;
    sd_req_t *req;
    sd_resp_t *resp;
    int64_t version, deadline_ms;
    int check; /* re-read the document on the next pass */
    char cluster[SD_NAME_MAX + 1], machine[SD_NAME_MAX + 1];
} waiter_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static waiter_t *incoming; /* handed over by workers, taken by the thread (under mu) */
static int wake_fd = -1;
static int started;        /* under mu */
static atomic_int nwaiting;

/* Owned by the waiter thread. */
static waiter_t *list;
static redisContext *sub;

/* Subscribes a fresh connection to the assignments channel; NULL on failure. */
static redisContext *subscribe(void)
{
    redisContext *c = sd_store_connect();
    if (!c)
        return NULL;
    char chan[96];
    redisReply *r = redisCommand(c, "SUBSCRIBE %s", sd_assign_channel(chan, sizeof chan));
    int ok = r && r->type == REDIS_REPLY_ARRAY;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Marks the waiters a published message names: "<cluster> <machine>..." or "<cluster> *". */
static void mark_message(const char *payload)
{
    char buf[8192];
    sd_strlcpy(buf, payload, sizeof buf);
    char *save = NULL;
    const char *cluster = strtok_r(buf, " ", &save);
    if (!cluster)
        return;
    const char *names[1024];
    size_t n = 0;
    for (char *t = strtok_r(NULL, " ", &save); t && n < SD_ARRAY_LEN(names);
         t = strtok_r(NULL, " ", &save))
        names[n++] = t;
    /* A message cut by the buffer or the name cap: re-read every waiter of the cluster. */
    int all = n == SD_ARRAY_LEN(names) || strlen(payload) >= sizeof buf;
    for (waiter_t *w = list; w; w = w->next) {
        if (strcmp(w->cluster, cluster) != 0)
            continue;
        for (size_t i = 0; i < n && !w->check; i++)
            w->check = strcmp(names[i], "*") == 0 || strcmp(names[i], w->machine) == 0;
        w->check |= all;
    }
}

/* Reads what the subscriber has; drops it on a connection error. */
static void sub_read(void)
{
    if (redisBufferRead(sub) != REDIS_OK) {
        log_warn("assignments subscriber lost", "err=%s", sub->errstr);
        redisFree(sub);
        sub = NULL;
        return;
    }
    void *rv = NULL;
    while (redisGetReplyFromReader(sub, &rv) == REDIS_OK && rv) {
        redisReply *r = rv;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            r->element[0]->type == REDIS_REPLY_STRING &&
            strcmp(r->element[0]->str, "message") == 0 &&
            r->element[2]->type == REDIS_REPLY_STRING)
            mark_message(r->element[2]->str);
        freeReplyObject(r);
        rv = NULL;
    }
}

/* Answers w if its document moved, its deadline passed or serverdir stops. Returns 1
 * when answered (the caller unlinks and frees it). */
static int waiter_try(waiter_t *w, int64_t now, int stopping)
{
    int due = now >= w->deadline_ms || stopping;
    if (!w->check && !due)
        return 0;
    json_t *doc = NULL;
    int64_t v = 0;
    int rc = sd_assign_read(w->cluster, w->machine, &doc, &v);
    if (rc != SD_STORE_OK) {
        if (!due)
            return 0; /* w->check stays set: read again on the next pass */
        sd_resp_store_error(w->resp, rc);
    } else if (v == w->version && !due) {
        json_decref(doc);
        w->check = 0;
        return 0;
    } else {
        sd_assign_answer(w->resp, doc, v, NULL);
    }
    sd_req_resume(w->req);
    return 1;
}

static void *waiter_main(void *arg)
{
    (void)arg;
    int64_t next_subscribe = 0;
    for (;;) {
        int64_t now = sd_mono_ms();
        if (!sub && now >= next_subscribe) {
            next_subscribe = now + RESUBSCRIBE_MS;
            if ((sub = subscribe()) != NULL)
                sd_log_msg(SD_LOG_INFO, "assignments subscriber connected");
            for (waiter_t *w = list; w; w = w->next)
                w->check = 1; /* messages may have been missed */
        }
        pthread_mutex_lock(&mu);
        while (incoming) {
            waiter_t *w = incoming;
            incoming = w->next;
            w->check = 1;
            w->next = list;
            list = w;
        }
        pthread_mutex_unlock(&mu);

        int stopping = sd_http_stopping();
        int64_t timeout = POLL_CAP_MS;
        for (waiter_t **pp = &list; *pp;) {
            waiter_t *w = *pp;
            if (waiter_try(w, now, stopping)) {
                SD_COUNT("serverdir_assign_longpolls_answered_total",
                         "parked assignment long-polls answered", 1);
                *pp = w->next;
                free(w);
                atomic_fetch_sub(&nwaiting, 1);
                continue;
            }
            if (w->deadline_ms - now < timeout)
                timeout = w->deadline_ms - now;
            pp = &w->next;
        }
        if (timeout < 1)
            timeout = 1;

        struct pollfd fds[2] = {{.fd = wake_fd, .events = POLLIN},
                                {.fd = sub ? sub->fd : -1, .events = POLLIN}};
        int n = poll(fds, 2, (int)timeout);
        if (n < 0 && errno != EINTR) {
            log_error("assignments waiter poll failed", "errno=%d", errno);
            continue;
        }
        if (fds[0].revents & POLLIN) {
            uint64_t x;
            if (read(wake_fd, &x, sizeof x) < 0 && errno != EAGAIN)
                log_error("assignments waiter wake read failed", "errno=%d", errno);
        }
        if (sub && (fds[1].revents & (POLLIN | POLLERR | POLLHUP)))
            sub_read();
        if (!sub) {
            for (waiter_t *w = list; w; w = w->next)
                w->check = 1; /* no messages: read every document each pass */
        }
    }
    return NULL;
}

/* Starts the waiter thread on first use. 0, or -1 when it cannot be started. */
static int waiter_start_locked(void)
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
    int rc = pthread_create(&th, &attr, waiter_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(wake_fd);
        wake_fd = -1;
        return -1;
    }
    started = 1;
    return 0;
}

void sd_assign_park(sd_req_t *req, sd_resp_t *resp, const char *cluster, const char *machine,
                    int64_t version, int64_t wait_ms)
{
    if (atomic_fetch_add(&nwaiting, 1) >= SD_ASSIGN_WAITERS_MAX) {
        atomic_fetch_sub(&nwaiting, 1);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error(resp, 429, "too_many_waiters",
                      "%d assignment long-polls are waiting already; retry", SD_ASSIGN_WAITERS_MAX);
        return;
    }
    waiter_t *w = calloc(1, sizeof *w);
    if (!w) {
        atomic_fetch_sub(&nwaiting, 1);
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    w->req = req;
    w->resp = resp;
    w->version = version;
    w->deadline_ms = sd_mono_ms() + wait_ms;
    sd_strlcpy(w->cluster, cluster, sizeof w->cluster);
    sd_strlcpy(w->machine, machine, sizeof w->machine);
    pthread_mutex_lock(&mu);
    if (waiter_start_locked()) {
        pthread_mutex_unlock(&mu);
        free(w);
        atomic_fetch_sub(&nwaiting, 1);
        sd_resp_error(resp, 503, "too_many_waiters", "cannot start the assignments waiter");
        return;
    }
    sd_req_park(req);
    SD_COUNT("serverdir_assign_longpolls_parked_total", "assignment long-polls parked", 1);
    w->next = incoming;
    incoming = w;
    pthread_mutex_unlock(&mu);
    uint64_t one = 1;
    if (write(wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_error("assignments waiter wake failed", "errno=%d", errno);
}
