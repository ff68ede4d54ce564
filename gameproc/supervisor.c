/* What gameproc tells its supervisor: through libbbagent (the default), through the
 * sd_notify datagram protocol (--notify), or nothing (--no-agent). The rest of gameproc
 * calls these functions and does not care which one is in use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gameproc.h"
#include "sdlog.h"
#include "sdnotify.h"
#include "sdutil.h"

/* WATCHDOG=1 goes out every quarter of WATCHDOG_USEC (every quarter of this without it),
 * and never more often than WATCHDOG_MIN_MS. */
#define WATCHDOG_MIN_MS 50
#define WATCHDOG_DEFAULT_MS 250

/* The status line both protocols carry; it changes only when the load or mode does, so
 * the supervisor hears it only then. --meta's pairs come last. */
static void status_text(const gp_t *gp, char *out, size_t cap)
{
    snprintf(out, cap, "map=%s players=%d/%d%s%s%s", gp->map, gp->players, gp->max_players,
             gp->draining ? " draining" : "", gp->meta ? " " : "", gp->meta ? gp->meta : "");
}

/* Sends one sd_notify message; a failure is logged once (the supervisor may be
 * restarting) and otherwise ignored, like sd_notify does. */
static void notify_send(gp_t *gp, const char *msg)
{
    int r = sd_notify_send("%s", msg);
    if (!r) {
        gp->notify.warned = 0;
        return;
    }
    if (!gp->notify.warned)
        log_warn("notify send failed", "err=%s", strerror(-r));
    gp->notify.warned = 1;
}

/* Opens the sd_notify link (common/sdnotify.c) and picks the WATCHDOG=1 period. */
static void notify_open(gp_t *gp)
{
    int r = sd_notify_init();
    if (r < 0) {
        log_warn("NOTIFY_SOCKET unusable, running unsupervised", "err=%s", strerror(-r));
        return;
    }
    if (!sd_notify_enabled()) {
        sd_log_msg(SD_LOG_WARN, "no NOTIFY_SOCKET, running unsupervised");
        return;
    }
    /* sd_notify_watchdog_ms() is half of WATCHDOG_USEC: half of it is the quarter */
    int64_t every = sd_notify_watchdog_ms() ? sd_notify_watchdog_ms() / 2
                                            : WATCHDOG_DEFAULT_MS / 4;
    gp->notify.watchdog_every_ms = every > WATCHDOG_MIN_MS ? every : WATCHDOG_MIN_MS;
    gp->notify.last_watchdog_ms = INT64_MIN / 2;
    gp->notify.on = 1;
}

const char *gp_sup_kind(const gp_t *gp)
{
    if (gp->use_notify)
        return gp->notify.on ? "notify" : "none";
    const char *bb = getenv("BB_SOCKET");
    return gp->agent && bb && *bb ? "agent" : "none";
}

int gp_sup_open(gp_t *gp)
{
    if (gp->no_agent)
        return 0;
    if (gp->use_notify) {
        notify_open(gp);
        return 0;
    }
    gp->agent = bbagent_open(NULL);
    return gp->agent ? 0 : -1;
}

void gp_sup_ready(gp_t *gp)
{
    /* the status line and the port before READY: the instance is listed (and can be
     * allocated by its metadata) with both as soon as it is ready */
    if (gp->agent) {
        char st[GP_STATUS_MAX];
        status_text(gp, st, sizeof st);
        bbagent_status(gp->agent, gp->players, gp->max_players, st);
    }
    if (gp->agent && gp->udp_port > 0)
        bbagent_port(gp->agent, "game", gp->udp_port);
    if (gp->agent)
        bbagent_ready(gp->agent);
    else if (gp->notify.on)
        notify_send(gp, "READY=1");
}

void gp_sup_tick(gp_t *gp, int64_t now_ms)
{
    char st[GP_STATUS_MAX];
    status_text(gp, st, sizeof st);
    if (gp->agent) {
        bbagent_heartbeat(gp->agent);
        bbagent_status(gp->agent, gp->players, gp->max_players, st);
        if (gp->release_at_ms >= 0 && now_ms >= gp->release_at_ms) {
            gp->release_at_ms = -1;
            log_info("releasing", "after_ms=%lld", (long long)gp->release_after_ms);
            bbagent_release(gp->agent);
        }
    } else if (gp->notify.on) {
        if (now_ms - gp->notify.last_watchdog_ms >= gp->notify.watchdog_every_ms) {
            gp->notify.last_watchdog_ms = now_ms;
            notify_send(gp, "WATCHDOG=1");
        }
        if (strcmp(st, gp->notify.last_status) != 0) {
            char msg[sizeof st + 8];
            snprintf(msg, sizeof msg, "STATUS=%s", st);
            notify_send(gp, msg);
            memcpy(gp->notify.last_status, st, sizeof st);
        }
    }
}

int gp_sup_fd(gp_t *gp)
{
    return gp->agent ? bbagent_fd(gp->agent) : -1;
}

/* Requests from Big Brother: SHUTDOWN starts the graceful stop, DRAIN stops taking
 * players, an allocation is logged (and, with --release-after-ms, released later).
 * sd_notify has no way back, so there is nothing to read in that mode. */
void gp_sup_events(gp_t *gp)
{
    if (!gp->agent)
        return;
    bbagent_event_t ev;
    for (int i = 0; i < 8 && bbagent_poll(gp->agent, &ev) == 0; i++) {
        if (ev.type == BBAGENT_EVENT_SHUTDOWN) {
            log_info("shutdown requested", "grace_ms=%d", ev.grace_ms);
            gp_begin_stop(gp, "SHUTDOWN", ev.grace_ms);
        } else if (ev.type == BBAGENT_EVENT_DRAIN) {
            if (!gp->draining)
                log_info("draining", "players=%d", gp->players);
            gp->draining = 1;
        } else if (ev.type == BBAGENT_EVENT_ALLOCATED) {
            bbagent_allocation_t al;
            bbagent_allocation(gp->agent, &al);
            log_info("allocated", "allocation=%s mode=%s players=%d payload=%s", al.allocation,
                     al.join ? "join" : "ready", al.players, al.payload);
            if (gp->release_after_ms >= 0)
                gp->release_at_ms = sd_mono_ms() + gp->release_after_ms;
        } else if (ev.type == BBAGENT_EVENT_DEALLOCATED) {
            bbagent_allocation_t al;
            bbagent_allocation(gp->agent, &al);
            log_info("deallocated", "allocation=%s", al.allocation);
            gp->release_at_ms = -1;
        } else {
            break;
        }
    }
}

void gp_sup_stopping(gp_t *gp)
{
    if (gp->notify.on)
        notify_send(gp, "STOPPING=1");
}

void gp_sup_close(gp_t *gp, const char *reason)
{
    if (gp->agent) {
        bbagent_close(gp->agent, reason);
        gp->agent = NULL;
    }
    gp->notify.on = 0; /* the socket itself stays open until exit, in sdnotify.c */
}
