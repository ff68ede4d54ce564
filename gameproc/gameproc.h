/* gameproc, the sample game server: one thread, one poll loop, a fixed-rate tick.
 *
 * main.c owns the loop, the options, signals and the fault injection; the modules below
 * plug into it through a per-tick hook list (gp_hooks[] in main.c) and fd watches, so
 * player simulation or master-list heartbeats are one more file and one more line in
 * that list. Everything runs on the loop thread; no module blocks it. */
#ifndef GAMEPROC_H
#define GAMEPROC_H

#include <stdint.h>
#include <sys/socket.h>

#include "bbagent.h"

#define GP_VERSION "0.1.0"
#define GP_NAME_MAX 63
#define GP_STATUS_MAX 160

typedef struct gp gp_t;

/* A module plugged into the loop. Every member may be NULL.
 * start: after the options are parsed, before the first tick; < 0 ends start-up.
 * tick:  once per tick, in list order, with the tick's monotonic time.
 * stop:  once on the way out, after "saving players", before the process exits. */
typedef struct {
    const char *name;
    int (*start)(gp_t *gp);
    void (*tick)(gp_t *gp, int64_t now_ms);
    void (*stop)(gp_t *gp);
} gp_hook_t;

typedef void (*gp_fd_cb)(gp_t *gp, void *arg);

/* sd_notify client state (notify.c). */
typedef struct {
    int fd;                        /* -1 when NOTIFY_SOCKET is not usable */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int64_t watchdog_every_ms;     /* at most one WATCHDOG=1 per this period */
    int64_t last_watchdog_ms;
    int warned;                    /* a send failure was logged once */
    char last_status[GP_STATUS_MAX]; /* STATUS= is sent when it changes */
} gp_notify_t;

struct gp {
    /* options */
    char name[GP_NAME_MAX + 1];
    const char *map;
    int tick_hz;
    int players, max_players;
    int64_t hang_after_ms;         /* -1: never */
    int64_t crash_after_ms;        /* -1: never */
    int exit_code;                 /* crash by exit(exit_code); -1: abort() */
    int64_t slow_start_ms;
    int64_t save_ms;               /* how long "saving players" takes */
    int ignore_term;
    int no_agent;
    int use_notify;
    const char *udp_listen;        /* NULL: no query port */
    int a2s_challenge;             /* A2S_INFO only after the challenge round trip */

    /* state */
    int64_t started_ms;
    uint64_t ticks;
    int ready;
    int draining;
    int stopping;
    int64_t stop_at_ms;            /* stopping: exit at this time */
    bbagent_t *agent;              /* NULL with --no-agent or --notify */
    gp_notify_t notify;
    int udp_fd;
    int udp_port;                  /* the bound port (for A2S EDF) */
};

/* Registers fd for POLLIN in the main loop (at most GP_MAX_WATCH). 0 or -ENOSPC. */
#define GP_MAX_WATCH 8
int gp_watch(gp_t *gp, int fd, gp_fd_cb cb, void *arg);

/* Starts the graceful stop ("saving players", then exit 0 after save_ms capped by half
 * the grace; grace_ms < 0: none given). Ignored with --ignore-term. */
void gp_begin_stop(gp_t *gp, const char *why, int grace_ms);

/* supervisor.c: what the process tells its supervisor, over libbbagent, sd_notify or
 * nothing (--no-agent), chosen by the options. */
int gp_sup_open(gp_t *gp);
/* "agent", "notify" or "none": what the process is talking to, for the start log. */
const char *gp_sup_kind(const gp_t *gp);
void gp_sup_ready(gp_t *gp);
void gp_sup_tick(gp_t *gp, int64_t now_ms);
int gp_sup_fd(gp_t *gp);
void gp_sup_events(gp_t *gp);
void gp_sup_stopping(gp_t *gp);
void gp_sup_close(gp_t *gp, const char *reason);

/* notify.c: the sd_notify datagram protocol, written out (no libsystemd). */
int gp_notify_open(gp_notify_t *n);
int gp_notify_send(gp_notify_t *n, const char *msg);
void gp_notify_watchdog(gp_notify_t *n, int64_t now_ms);
void gp_notify_close(gp_notify_t *n);

/* query.c: the UDP query port (Quake III getstatus/getinfo, Valve A2S_INFO). */
int gp_query_start(gp_t *gp);
void gp_query_stop(gp_t *gp);

#endif
