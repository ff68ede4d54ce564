/* What gameproc tells its supervisor: through libbbagent (the default), through the
 * sd_notify datagram protocol (--notify), or nothing (--no-agent). The rest of gameproc
 * calls these functions and does not care which one is in use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gameproc.h"
#include "sdlog.h"

/* The status line both protocols carry; it changes only when the load or mode does, so
 * the supervisor hears it only then. */
static void status_text(const gp_t *gp, char *out, size_t cap)
{
    snprintf(out, cap, "map=%s players=%d/%d%s", gp->map, gp->players, gp->max_players,
             gp->draining ? " draining" : "");
}

const char *gp_sup_kind(const gp_t *gp)
{
    if (gp->use_notify)
        return gp->notify.fd >= 0 ? "notify" : "none";
    const char *bb = getenv("BB_SOCKET");
    return gp->agent && bb && *bb ? "agent" : "none";
}

int gp_sup_open(gp_t *gp)
{
    gp->notify.fd = -1;
    if (gp->no_agent)
        return 0;
    if (gp->use_notify) {
        int r = gp_notify_open(&gp->notify);
        if (r == -ENOENT)
            sd_log_msg(SD_LOG_WARN, "no NOTIFY_SOCKET, running unsupervised");
        else if (r < 0)
            log_warn("NOTIFY_SOCKET unusable, running unsupervised", "err=%s", strerror(-r));
        return 0;
    }
    gp->agent = bbagent_open(NULL);
    return gp->agent ? 0 : -1;
}

void gp_sup_ready(gp_t *gp)
{
    if (gp->agent)
        bbagent_ready(gp->agent);
    else if (gp->notify.fd >= 0)
        gp_notify_send(&gp->notify, "READY=1");
}

void gp_sup_tick(gp_t *gp, int64_t now_ms)
{
    char st[GP_STATUS_MAX];
    status_text(gp, st, sizeof st);
    if (gp->agent) {
        bbagent_heartbeat(gp->agent);
        bbagent_status(gp->agent, gp->players, gp->max_players, st);
    } else if (gp->notify.fd >= 0) {
        gp_notify_watchdog(&gp->notify, now_ms);
        if (strcmp(st, gp->notify.last_status) != 0) {
            char msg[sizeof st + 8];
            snprintf(msg, sizeof msg, "STATUS=%s", st);
            gp_notify_send(&gp->notify, msg);
            memcpy(gp->notify.last_status, st, sizeof st);
        }
    }
}

int gp_sup_fd(gp_t *gp)
{
    return gp->agent ? bbagent_fd(gp->agent) : -1;
}

/* Requests from Big Brother: SHUTDOWN starts the graceful stop, DRAIN stops taking
 * players. sd_notify has no way back, so there is nothing to read in that mode. */
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
        } else {
            break;
        }
    }
}

void gp_sup_stopping(gp_t *gp)
{
    if (gp->notify.fd >= 0)
        gp_notify_send(&gp->notify, "STOPPING=1");
}

void gp_sup_close(gp_t *gp, const char *reason)
{
    if (gp->agent) {
        bbagent_close(gp->agent, reason);
        gp->agent = NULL;
    }
    gp_notify_close(&gp->notify);
}
