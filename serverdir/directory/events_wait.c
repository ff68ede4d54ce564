/* Events long-polls: GET .../events?since=SEQ&wait=MS parks the request (http/park.h)
 * when the cluster's history has nothing after SEQ. The wake-up source is one subscriber
 * to the events channel ("<prefix>assign:events"), a Redis connection of its own on the
 * park thread: events_apply.lua publishes the cluster's name there once per call that
 * added to the history, and the message makes that cluster's long-polls read again.
 *
 * Missed messages: an entry is read once when the park thread takes it over (after the
 * subscription is live, so a later change is always published to us), every entry is
 * read again after the subscriber (re)connects, and while it is down every REREAD_MS. */
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "park.h"

#define REREAD_MS 250 /* without a subscriber (or after a store error), read again */

typedef struct {
    char cluster[SD_NAME_MAX + 1];
    char since[48]; /* a stream id: at most 20 + 1 + 20 digits, checked by the handler */
    int64_t limit;
} follower_t;

static atomic_int nwaiting;

static int names_cluster(void *ctx, void *arg)
{
    return strcmp(((const follower_t *)ctx)->cluster, arg) == 0;
}

static const sd_park_kind_t follower_kind;

static const char *events_channel(char *buf, size_t cap)
{
    char chan[96];
    snprintf(buf, cap, "%s:events", sd_assign_channel(chan, sizeof chan));
    return buf;
}

/* A message names one cluster: its followers read again. */
static void on_message(const char *payload)
{
    sd_park_wake(&follower_kind, names_cluster, (void *)payload);
}

static sd_park_sub_t sub = {
    .kind = &follower_kind, .what = "events", .channel = events_channel, .on_message = on_message};

static void sub_prepare(int64_t now) { sd_park_sub_prepare(&sub, now); }
static int sub_fd(void) { return sd_park_sub_fd(&sub); }
static void sub_read(void) { sd_park_sub_read(&sub); }

/* Answers when the history has something after since, or when due (an empty list then;
 * a store error only when due). */
static int follower_try(void *ctx, sd_resp_t *resp, int due, int64_t *retry_at_ms)
{
    follower_t *w = ctx;
    json_t *body = NULL;
    int rc = sd_dir_events_read(w->cluster, w->since, w->limit, &body);
    if (rc != SD_STORE_OK) {
        if (!due) {
            *retry_at_ms = sd_mono_ms() + REREAD_MS;
            return 0;
        }
        sd_resp_store_error(resp, rc);
        return 1;
    }
    if (json_array_size(json_object_get(body, "events")) == 0 && !due) {
        json_decref(body);
        if (!sd_park_sub_up(&sub))
            *retry_at_ms = sd_mono_ms() + REREAD_MS;
        return 0;
    }
    sd_resp_json(resp, 200, body);
    return 1;
}

static void follower_release(void *ctx)
{
    free(ctx);
    atomic_fetch_sub(&nwaiting, 1);
}

static const sd_park_kind_t follower_kind = {
    .try_answer = follower_try,
    .release = follower_release,
    .source_prepare = sub_prepare,
    .source_fd = sub_fd,
    .source_ready = sub_read,
};

void sd_events_park(sd_req_t *req, sd_resp_t *resp, const char *cluster, const char *since,
                    int64_t limit, int64_t wait_ms)
{
    follower_t *w = calloc(1, sizeof *w);
    if (!w) {
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    sd_strlcpy(w->cluster, cluster, sizeof w->cluster);
    sd_strlcpy(w->since, since, sizeof w->since);
    w->limit = limit;
    if (sd_park_capped(&follower_kind, req, resp, w, sd_mono_ms() + wait_ms, &nwaiting,
                       SD_EVENTS_WAITERS_MAX, "events long-polls") == 0)
        SD_COUNT("serverdir_events_longpolls_parked_total", "events long-polls parked", 1);
}
