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

#define REREAD_MS 250      /* a document that could not be read is read again after this */

/* One parked long-poll. */
typedef struct {
    int64_t version;
    char cluster[SD_NAME_MAX + 1], machine[SD_NAME_MAX + 1];
} longpoll_t;

static atomic_int nwaiting;

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

static sd_park_sub_t sub = {.kind = &longpoll_kind, .what = "assignments",
                             .channel = sd_assign_channel, .on_message = wake_message};

static void sub_prepare(int64_t now) { sd_park_sub_prepare(&sub, now); }
static int sub_fd(void) { return sd_park_sub_fd(&sub); }
static void sub_read(void) { sd_park_sub_read(&sub); }

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
        if (!sd_park_sub_up(&sub))
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
    longpoll_t *w = calloc(1, sizeof *w);
    if (!w) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    w->version = version;
    sd_strlcpy(w->cluster, cluster, sizeof w->cluster);
    sd_strlcpy(w->machine, machine, sizeof w->machine);
    if (sd_park_capped(&longpoll_kind, req, resp, w, sd_mono_ms() + wait_ms, &nwaiting,
                       SD_ASSIGN_WAITERS_MAX, "assignment long-polls") == 0)
        SD_COUNT("serverdir_assign_longpolls_parked_total", "assignment long-polls parked", 1);
}
