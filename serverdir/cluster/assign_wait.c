/* Assignment long-polls: GET .../machines/{m}/assignments?version=V&wait=MS parks the
 * request (http/park.h) when the machine's document is still at version V. The wake-up
 * source is one subscriber to the assignments channel, a Redis connection of its own on
 * the park thread: a message naming a machine (or "*" for the whole cluster) wakes that
 * machine's long-polls, which re-read the document with the park thread's command
 * connection and answer when the version moved.
 *
 * Missed messages: a long-poll's document is read once when the park thread takes it over
 * (after the subscription is live, so a change after that read is always published to
 * us), and every long-poll is re-read after the subscriber (re)connects. While the
 * subscriber is down every long-poll is re-read each REREAD_MS and a reconnect is tried
 * each RESUBSCRIBE_MS. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "park.h"

#define RESUBSCRIBE_MS 500 /* reconnect attempts of the subscriber */
#define REREAD_MS 250      /* a document that could not be read is read again after this */

/* One parked long-poll. */
typedef struct {
    int64_t version;
    char cluster[SD_NAME_MAX + 1], machine[SD_NAME_MAX + 1];
} longpoll_t;

static atomic_int nwaiting;

/* Owned by the park thread. */
static redisContext *sub;
static int64_t next_subscribe_ms;

redisContext *sd__subscribe(const char *chan)
{
    redisContext *c = sd_store_connect();
    if (!c)
        return NULL;
    redisReply *r = redisCommand(c, "SUBSCRIBE %s", chan);
    int ok = r && r->type == REDIS_REPLY_ARRAY;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* A published message, split: the cluster and the machine names ("*": all). */
typedef struct {
    const char *cluster;
    const char *names[1024];
    size_t n;
    int all; /* the message was cut by the buffer or the name cap: wake the whole cluster */
} message_t;

static int message_names(void *ctx, void *arg)
{
    const longpoll_t *w = ctx;
    const message_t *m = arg;
    if (strcmp(w->cluster, m->cluster) != 0)
        return 0;
    if (m->all)
        return 1;
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->names[i], "*") == 0 || strcmp(m->names[i], w->machine) == 0)
            return 1;
    return 0;
}

static const sd_park_kind_t longpoll_kind;

/* Wakes the long-polls a published message names: "<cluster> <machine>..." or
 * "<cluster> *". */
static void wake_message(const char *payload)
{
    char buf[8192];
    sd_strlcpy(buf, payload, sizeof buf);
    char *save = NULL;
    message_t m = {.cluster = strtok_r(buf, " ", &save)};
    if (!m.cluster)
        return;
    for (char *t = strtok_r(NULL, " ", &save); t && m.n < SD_ARRAY_LEN(m.names);
         t = strtok_r(NULL, " ", &save))
        m.names[m.n++] = t;
    m.all = m.n == SD_ARRAY_LEN(m.names) || strlen(payload) >= sizeof buf;
    sd_park_wake(&longpoll_kind, message_names, &m);
}

/* Source: keeps the subscriber connected; once it is, every long-poll is re-read
 * (messages may have been missed meanwhile). */
static void sub_prepare(int64_t now)
{
    if (sub || now < next_subscribe_ms)
        return;
    next_subscribe_ms = now + RESUBSCRIBE_MS;
    char chan[96];
    if ((sub = sd__subscribe(sd_assign_channel(chan, sizeof chan))) != NULL) {
        sd_log_msg(SD_LOG_INFO, "assignments subscriber connected");
        sd_park_wake(&longpoll_kind, NULL, NULL);
    }
}

static int sub_fd(void) { return sub ? sub->fd : -1; }

/* Source: reads what the subscriber has; drops it on a connection error (every
 * long-poll is re-read then, and from then on each REREAD_MS until it is back). */
static void sub_read(void)
{
    if (redisBufferRead(sub) != REDIS_OK) {
        log_warn("assignments subscriber lost", "err=%s", sub->errstr);
        redisFree(sub);
        sub = NULL;
        sd_park_wake(&longpoll_kind, NULL, NULL);
        return;
    }
    void *rv = NULL;
    while (redisGetReplyFromReader(sub, &rv) == REDIS_OK && rv) {
        redisReply *r = rv;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            strcmp(sd_reply_str(r, 0), "message") == 0 &&
            r->element[2]->type == REDIS_REPLY_STRING)
            wake_message(r->element[2]->str);
        freeReplyObject(r);
        rv = NULL;
    }
}

/* Answers the long-poll if its document moved or it is due; a store error is answered
 * only when due. Without a subscriber (or after a store error) the document is read
 * again after REREAD_MS, as no message can wake it. */
static int longpoll_try(void *ctx, sd_resp_t *resp, int due, int64_t *retry_at_ms)
{
    longpoll_t *w = ctx;
    json_t *doc = NULL;
    int64_t v = 0;
    int rc = sd_assign_read(w->cluster, w->machine, &doc, &v);
    if (rc != SD_STORE_OK) {
        if (!due) {
            *retry_at_ms = sd_mono_ms() + REREAD_MS;
            return 0;
        }
        sd_resp_store_error(resp, rc);
    } else if (v == w->version && !due) {
        json_decref(doc);
        if (!sub)
            *retry_at_ms = sd_mono_ms() + REREAD_MS;
        return 0;
    } else {
        sd_assign_answer(resp, doc, v, NULL);
    }
    SD_COUNT("serverdir_assign_longpolls_answered_total", "parked assignment long-polls answered",
             1);
    return 1;
}

static void longpoll_release(void *ctx)
{
    free(ctx);
    atomic_fetch_sub(&nwaiting, 1);
}

static const sd_park_kind_t longpoll_kind = {
    .try_answer = longpoll_try,
    .release = longpoll_release,
    .source_prepare = sub_prepare,
    .source_fd = sub_fd,
    .source_ready = sub_read,
};

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
    longpoll_t *w = calloc(1, sizeof *w);
    if (!w) {
        atomic_fetch_sub(&nwaiting, 1);
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    w->version = version;
    sd_strlcpy(w->cluster, cluster, sizeof w->cluster);
    sd_strlcpy(w->machine, machine, sizeof w->machine);
    if (sd_park(&longpoll_kind, req, resp, w, sd_mono_ms() + wait_ms)) {
        free(w);
        atomic_fetch_sub(&nwaiting, 1);
        sd_resp_error(resp, 503, "too_many_waiters", "cannot start the assignments waiter");
        return;
    }
    SD_COUNT("serverdir_assign_longpolls_parked_total", "assignment long-polls parked", 1);
}
