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
#include "gpquery.h"

#define GP_NAME_MAX 63
#define GP_META_MAX 256           /* --meta */
#define GP_STATUS_MAX (160 + GP_META_MAX)
#define GP_STOP_WAIT_MS 5000      /* longest wait for saves on a stop without a grace */

typedef struct gp gp_t;

/* A bad option found by a module's start: the option's name, the value given and what
 * it wants (all borrowed: static text or the command line). */
typedef struct {
    const char *option, *value, *want;
} gp_bad_option_t;

/* A module plugged into the loop. Every member may be NULL.
 * start: after the options are parsed, before the first tick. Returns 0 or a negative
 *        errno. When an option it reads is bad it fills *bad and returns -EINVAL (main
 *        exits with the usage code); on other failures *bad stays as main passed it,
 *        zeroed (start-up failed).
 * tick:  once per tick, in list order, with the tick's monotonic time.
 * stop:  once on the way out, after "saving players", before the process exits. */
typedef struct {
    const char *name;
    int (*start)(gp_t *gp, gp_bad_option_t *bad);
    void (*tick)(gp_t *gp, int64_t now_ms);
    void (*stop)(gp_t *gp);
} gp_hook_t;

typedef void (*gp_fd_cb)(gp_t *gp, void *arg);

/* What supervisor.c keeps of the sd_notify link (the sender is common/sdnotify.c). */
typedef struct {
    int on;                        /* NOTIFY_SOCKET is set and usable, and not closed */
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
    const char *sd_urls;           /* ServerDir base URLs (comma-separated); NULL: none */
    const char *sd_token;
    char instance[GP_NAME_MAX + 1]; /* lock holder: $BB_INSTANCE, else --name */
    int sim_players;               /* --players with --serverdir: simulated players */
    int64_t key_first, key_last;   /* player keys player:<first>..player:<last> */
    int64_t save_every_ms;         /* periodic save of every player's blob */
    int64_t session_ms;            /* a player leaves after this long; 0: stays */
    int master_rest;               /* announce to the REST master list */
    const char *master_udp;        /* DarkPlaces heartbeats to this HOST:PORT; NULL: none */
    int64_t master_every_ms;
    const char *region;
    const char *tags;              /* comma-separated */
    const char *meta;              /* appended to the status line; NULL: none */
    int64_t release_after_ms;      /* release each allocation after this; -1: never */
    int cred_mode;                 /* --credential: GP_CRED_* */
    int64_t cred_wait_ms;          /* --credential-wait-ms */

    /* state */
    int64_t started_ms;
    uint64_t ticks;
    int ready;
    int draining;
    int stopping;
    int64_t stop_at_ms;            /* stopping: exit at this time (when nothing is pending) */
    int64_t stop_deadline_ms;      /* stopping: exit now even with work pending */
    bbagent_t *agent;              /* NULL with --no-agent or --notify */
    gp_notify_t notify;
    int udp_fd;
    int udp_port;                  /* the bound port (for A2S EDF) */
    int stop_pending;              /* modules still finishing work before exit (saves) */
    int64_t release_at_ms;         /* --release-after-ms: release then; -1: not armed */
};

/* Off-tick work (worker.c): a job runs on a module's worker thread, then its done
 * callback runs on the loop thread from gp_worker_reap. */
typedef struct gp_job gp_job_t;
struct gp_job {
    void (*run)(gp_job_t *j);             /* worker thread: the blocking call */
    void (*done)(gp_t *gp, gp_job_t *j);  /* loop thread: act on the result */
    gp_job_t *next;                       /* the worker's queue link */
};
typedef struct gp_worker gp_worker_t;

/* Starts a worker thread (call after the stop signals are blocked). NULL on failure. */
gp_worker_t *gp_worker_new(void);
/* Queues j (owned by the caller, untouched until its done callback ran). */
void gp_worker_submit(gp_worker_t *w, gp_job_t *j);
/* Runs the done callbacks of the finished jobs; returns how many. Loop thread only. */
int gp_worker_reap(gp_worker_t *w, gp_t *gp);
/* Stops the worker: queued jobs are dropped, a running one gets up to wait_ms to end.
 * 0 when the worker is gone; -EBUSY when its job still runs and the thread was left to
 * die with the process (the caller must then leave the job and what it uses alone).
 * NULL is fine. */
int gp_worker_free(gp_worker_t *w, int64_t wait_ms);

/* Registers fd for POLLIN in the main loop (at most GP_MAX_WATCH). 0 or -ENOSPC. */
#define GP_MAX_WATCH 8
int gp_watch(gp_t *gp, int fd, gp_fd_cb cb, void *arg);

/* Starts the graceful stop ("saving players", then exit 0 after save_ms capped by half
 * the grace; grace_ms < 0: none given). The hooks keep ticking meanwhile; a module with
 * work to finish first (players.c's last saves) counts it in stop_pending, and the exit
 * waits for it up to half the grace (GP_STOP_WAIT_MS without one). Ignored with
 * --ignore-term. */
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

/* query.c: the UDP query port (Quake III getstatus/getinfo, Valve A2S_INFO). */
int gp_query_start(gp_t *gp, gp_bad_option_t *bad);
void gp_query_stop(gp_t *gp);
/* "PORT" (on default_host; NULL: a port alone is refused), "HOST:PORT", "[V6]:PORT" with
 * a numeric host, into ss. 0 or -EINVAL. */
int gp_parse_sockaddr(const char *s, const char *default_host, struct sockaddr_storage *ss,
                      socklen_t *len);

/* credential.c: the bearer token of the ServerDir calls, the instance credential when
 * there is one (--credential off|prefer|required). */
enum { GP_CRED_PREFER, GP_CRED_OFF, GP_CRED_REQUIRED };
int gp_cred_start(gp_t *gp, gp_bad_option_t *bad);
void gp_cred_tick(gp_t *gp, int64_t now_ms);
/* Whether ServerDir calls may go now: a credential is held, or the mode lets them go
 * with the shared token (prefer: after the wait, when one is due). Loop thread. */
int gp_cred_usable(const gp_t *gp);
struct sdc;
/* Worker thread, before each request: sets c's bearer token to the current one when it
 * changed since *seen (the caller's, 0 at first). SDC_OK or SDC_E_NOMEM. */
int gp_cred_apply(struct sdc *c, uint64_t *seen);

/* players.c: simulated players with locked, fenced saves in ServerDir (--players with
 * --serverdir). */
int gp_players_start(gp_t *gp, gp_bad_option_t *bad);
void gp_players_tick(gp_t *gp, int64_t now_ms);
void gp_players_stop(gp_t *gp);

/* master.c: master-list heartbeats over REST (--master-rest) and the DarkPlaces UDP
 * protocol (--master-udp). */
int gp_master_start(gp_t *gp, gp_bad_option_t *bad);
void gp_master_tick(gp_t *gp, int64_t now_ms);
void gp_master_stop(gp_t *gp);

#endif
