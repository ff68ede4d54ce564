/* Allocations on this machine (docs/allocation.md), on the supervision thread: the game
 * side of ServerDir's allocation API, and the game's load figures going back.
 *
 * The assignment document lists the open allocations of this machine's instances
 * ("allocations": [{allocation, instance, mode, players, payload}]). Each instance keeps
 * the ids of its allocations (at most BB_ALLOCS_MAX; more are logged and ignored) with
 * their progress, one row per allocation:
 *
 *   event \ allocation         new (not tracked)      tracked
 *   listed by a document       track; send            -
 *   agent connects (HELLO)     -                      send again unless acked
 *   any agent message          -                      send if not sent on this connection
 *   ALLOCATION_ACK=<id>        logged, ignored        first one: report `confirmed`
 *   RELEASE=1 (all of them)    report `released`      mark released; report `released`;
 *                              (no allocation field)  restart if on_release "restart"
 *   left the document          -                      unless released: DEALLOCATED=<id>
 *                                                     and restart if on_release "restart";
 *                                                     forget it
 *   process gone / respawned   -                      forget them all (a new instance id)
 *
 * "send" is ALLOCATED=<id> MODE=<mode> PLAYERS=<n> PAYLOAD=<compact JSON>, read from the
 * last document (kept for the resends). A restart for a session's end is a graceful one,
 * as an operator's restart: SHUTDOWN, stop signal, SIGKILL, a new generation, no crash
 * counted; only an instance that is starting or ready is restarted (one already stopping
 * keeps its reason).
 *
 * Status events: the players, max_players, status text and ports the game reports go to
 * ServerDir as `status` events (what `join` allocations, metadata selectors and the
 * allocation's answer read), at most one per instance per second; a timer sends the
 * latest values when changes come faster, and a change still held back goes out at once
 * before the ready event (bb_status_flush), so an instance enters the pool with them. Only when events go to ServerDir at all (a ServerDir URL is configured): a
 * standalone outbox is not filled with them. */
#include "agent/bb_agent.h"
#include "bbproto.h"
#include "sdlog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define STATUS_EVERY_MS 1000

static json_t *doc_allocs; /* the last document's "allocations" (a reference), for resends */
static bb_ratelimit_t alloc_log;

static struct bb_alloc *alloc_find(bb_inst_t *in, const char *id)
{
    for (int i = 0; i < in->nallocs; i++)
        if (!strcmp(in->allocs[i].id, id))
            return &in->allocs[i];
    return NULL;
}

/* The document's entry of allocation id for instance inst, or NULL. */
static const json_t *entry_find(const char *id, const char *inst)
{
    size_t k;
    json_t *e;
    json_array_foreach(doc_allocs, k, e) {
        const char *a = json_string_value(json_object_get(e, "allocation"));
        const char *i = json_string_value(json_object_get(e, "instance"));
        if (a && i && !strcmp(a, id) && !strcmp(i, inst))
            return e;
    }
    return NULL;
}

/* Builds ALLOCATED=<id> MODE= PLAYERS= PAYLOAD= for entry e into buf; its length, or -1
 * when the entry cannot be said (its payload over 1024 bytes compact, a bad mode). */
static int alloc_msg(const char *id, const json_t *e, char *buf, size_t cap)
{
    const char *mode = json_string_value(json_object_get(e, "mode"));
    if (!mode)
        mode = "ready";
    if (strcmp(mode, "ready") && strcmp(mode, "join"))
        return -1;
    json_int_t players = json_integer_value(json_object_get(e, "players"));
    if (players < 0 || players > SD_PLAYERS_MAX)
        return -1;
    const json_t *payload = json_object_get(e, "payload");
    char *text = payload ? json_dumps(payload, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char num[24];
    snprintf(num, sizeof(num), "%lld", (long long)players);
    int n = bbproto_put(buf, cap, 0, "ALLOCATED", id);
    if (n >= 0)
        n = bbproto_put(buf, cap, (size_t)n, "MODE", mode);
    if (n >= 0)
        n = bbproto_put(buf, cap, (size_t)n, "PLAYERS", num);
    if (n >= 0)
        n = bbproto_put(buf, cap, (size_t)n, "PAYLOAD", text ? text : "null");
    free(text);
    return n < 0 ? -1 : n;
}

/* Sends ALLOCATED for a once on the current connection. A full socket leaves it unsent
 * for the next agent message; an entry that cannot be said is logged and marked sent. */
static void alloc_send(bb_inst_t *in, struct bb_alloc *a)
{
    if (!in->conn || a->sent || a->acked || a->released)
        return;
    char msg[BBPROTO_MAX_MSG];
    int n = alloc_msg(a->id, entry_find(a->id, in->id), msg, sizeof(msg));
    if (n < 0) {
        log_error("allocation not sent", "instance=%s allocation=%s why=%s", in->id, a->id,
                  "bad entry: mode, players or a payload over 1024 bytes");
        a->sent = 1;
        return;
    }
    int rc = bb_agent_send_msg(in, msg, (size_t)n);
    if (rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -ENOBUFS)
        return;
    if (rc) {
        log_warn("agent message not sent", "instance=%s key=ALLOCATED error=%s", in->id,
                 strerror(-rc));
        return;
    }
    a->sent = 1;
    log_info("allocation sent", "instance=%s allocation=%s", in->id, a->id);
}

/* A session of in ended: restart it when its service wants a fresh process per session. */
static void restart_for_release(bb_inst_t *in, const char *why)
{
    if (!in->svc->restart_on_release || (in->state != ST_STARTING && in->state != ST_READY))
        return;
    log_info("instance restarting: its session ended", "instance=%s why=%s", in->id, why);
    bb_inst_event(in, EV_RESTART);
}

void bb_alloc_apply(const json_t *allocs)
{
    json_decref(doc_allocs);
    doc_allocs = json_is_array(allocs) ? json_incref((json_t *)allocs) : NULL;
    for (int i = 0; i < bb.ninst; i++)
        for (int k = 0; k < bb.inst[i].nallocs; k++)
            bb.inst[i].allocs[k].listed = 0;
    size_t k;
    json_t *e;
    json_array_foreach(doc_allocs, k, e) {
        const char *id = json_string_value(json_object_get(e, "allocation"));
        const char *inst = json_string_value(json_object_get(e, "instance"));
        if (!sd_name_valid(id, SD_NAME_MAX) || !inst)
            continue;
        bb_inst_t *in = bb_inst_by_id(inst);
        if (!in)
            continue; /* not (or no longer) running here: ServerDir learns it from events */
        struct bb_alloc *a = alloc_find(in, id);
        if (!a) {
            if (in->nallocs >= BB_ALLOCS_MAX) {
                if (bb__log_ok(&alloc_log)) {
                    log_warn("allocation ignored", "instance=%s allocation=%s why=%s "
                             "held_back=%lld", in->id, id, "too many open allocations",
                             (long long)alloc_log.held);
                    alloc_log.held = 0;
                }
                continue;
            }
            a = &in->allocs[in->nallocs++];
            *a = (struct bb_alloc){0};
            sd_strlcpy(a->id, id, sizeof(a->id));
        }
        a->listed = 1;
        alloc_send(in, a);
    }
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        int ended = 0;
        for (int n = 0; n < in->nallocs;) {
            struct bb_alloc *a = &in->allocs[n];
            if (a->listed) {
                n++;
                continue;
            }
            if (!a->released) {
                /* ended from outside (DELETE, expired): the game is told */
                ended = 1;
                log_info("allocation ended", "instance=%s allocation=%s", in->id, a->id);
                bb_agent_send(in, "DEALLOCATED", a->id, NULL, NULL);
            }
            *a = in->allocs[--in->nallocs];
        }
        if (ended)
            restart_for_release(in, "deallocated");
    }
}

/* A new agent connection of in: every allocation it has not acknowledged is sent again. */
static void alloc_connected(bb_inst_t *in)
{
    for (int i = 0; i < in->nallocs; i++) {
        in->allocs[i].sent = 0;
        alloc_send(in, &in->allocs[i]);
    }
}

/* Sends what could not be sent before (the agent's socket was full); cheap when nothing
 * waits. Runs on every message from the agent. */
static void alloc_retry(bb_inst_t *in, const char *val, size_t len)
{
    (void)val;
    (void)len;
    for (int i = 0; i < in->nallocs; i++)
        alloc_send(in, &in->allocs[i]);
}

/* ALLOCATION_ACK=<id> (len bytes) from the agent: reports `confirmed` once. */
static void alloc_ack(bb_inst_t *in, const char *id, size_t len)
{
    char aid[SD_NAME_MAX + 1];
    bb__copy_printable(aid, sizeof(aid), id, len);
    struct bb_alloc *a = len <= SD_NAME_MAX ? alloc_find(in, aid) : NULL;
    if (!a) {
        if (bb__log_ok(&alloc_log)) {
            log_warn("allocation ack ignored", "instance=%s allocation=%s why=%s held_back=%lld",
                     in->id, aid, "no such open allocation", (long long)alloc_log.held);
            alloc_log.held = 0;
        }
        return;
    }
    if (a->acked)
        return; /* acknowledged again after a reconnect */
    a->acked = 1;
    log_info("allocation confirmed", "instance=%s allocation=%s", in->id, a->id);
    json_t *ev = bb_event_new(in, SD_EV_CONFIRMED);
    if (!ev)
        return;
    json_object_set_new(ev, "allocation", json_string(a->id));
    bb_event_emit(in, ev);
}

/* RELEASE=1 from the agent: reports `released` and restarts by on_release. */
static void alloc_release(bb_inst_t *in, const char *val, size_t len)
{
    (void)val;
    (void)len;
    for (int i = 0; i < in->nallocs; i++)
        in->allocs[i].released = 1;
    log_info("instance released its session", "instance=%s allocations=%d", in->id,
             in->nallocs);
    json_t *ev = bb_event_new(in, SD_EV_RELEASED);
    if (ev)
        bb_event_emit(in, ev);
    restart_for_release(in, "released");
}

static void status_send(bb_inst_t *in)
{
    in->status_dirty = 0;
    in->status_sent_mono = sd_mono_ms();
    json_t *ev = bb_event_new(in, SD_EV_STATUS);
    if (!ev)
        return;
    json_object_set_new(ev, "players", json_integer(in->players));
    json_object_set_new(ev, "max_players", json_integer(in->max_players));
    json_object_set_new(ev, "status", json_string(in->status));
    json_t *ports = in->ports[0] ? json_loads(in->ports, 0, NULL) : NULL;
    if (ports)
        json_object_set_new(ev, "ports", ports);
    bb_event_emit(in, ev);
}

static void on_status_timer(bb_timer_t *t)
{
    bb_inst_t *in = container_of(t, bb_inst_t, status_timer);
    if (in->status_dirty && in->pid > 0)
        status_send(in);
}

void bb_status_flush(bb_inst_t *in)
{
    if (!in->status_dirty || !bb.cfg.urls || !bb.report)
        return;
    bb_timer_cancel(&in->status_timer);
    status_send(in);
}

void bb_status_changed(bb_inst_t *in)
{
    if (!bb.cfg.urls || !bb.report)
        return;
    in->status_dirty = 1;
    if (in->status_timer.idx)
        return; /* the timer sends the latest values */
    int64_t due = in->status_sent_mono + STATUS_EVERY_MS;
    if (!in->status_sent_mono || sd_mono_ms() >= due) {
        status_send(in);
        return;
    }
    in->status_timer.fn = on_status_timer;
    bb_timer_set(&in->status_timer, due);
}

void bb_alloc_reset(bb_inst_t *in)
{
    in->nallocs = 0;
    in->status_dirty = 0;
    bb_timer_cancel(&in->status_timer);
}

void bb_alloc_free(void)
{
    json_decref(doc_allocs);
    doc_allocs = NULL;
}

/* What alloc.c handles of the agent's messages, in this order. */
static const bb_agent_handler_t on_ack = {"ALLOCATION_ACK", alloc_ack};
static const bb_agent_handler_t on_release = {"RELEASE", alloc_release};
static const bb_agent_handler_t on_any = {NULL, alloc_retry};

int bb_alloc_init(void)
{
    int rc;
    if ((rc = bb_agent_handle(&on_ack)) || (rc = bb_agent_handle(&on_release)) ||
        (rc = bb_agent_handle(&on_any)) ||
        (rc = bb_agent_on(BB_AGENT_CONNECTED, alloc_connected)) ||
        (rc = bb_agent_on(BB_AGENT_STATUS, bb_status_changed)))
        return rc;
    bb_inst_hooks.reset = bb_alloc_reset;
    bb_inst_hooks.ready = bb_status_flush;
    return 0;
}
