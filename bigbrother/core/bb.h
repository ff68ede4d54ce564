/* bigbrother internals: the config, the process table, the event loop's watches and
 * timers, and the functions each file exports to the others. Everything here runs on
 * the ONE supervision thread; only report.h's reporter runs on a thread of its own. */
#ifndef BB_H
#define BB_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "report.h"
#include "sdproto.h"
#include "sdutil.h"
#include "sdversion.h"

#define BB_SOCK_PATH_MAX 108   /* sizeof(sun_path) */
#define BB_PROBE_BYTES_MAX 512 /* udp query / expect, http request */
#define BB_HTTP_PATH_MAX 400   /* http probe path: the request still fits the query buffer */
#define BB_MAX_RLIMITS 8
#define BB_WINDOW_MAX 64       /* max_restarts cap: restart times kept per instance */
#define BB_ALLOCS_MAX 16       /* open allocations tracked per instance (alloc.c) */

#define container_of(p, type, member) ((type *)(void *)((char *)(p) - offsetof(type, member)))

/* ---------------------------------------------------------------- config (config.c) */

enum bb_health { BB_H_AGENT, BB_H_NOTIFY, BB_H_TCP, BB_H_UDP, BB_H_EXEC, BB_H_NONE, BB_H_HTTP };
enum bb_policy { BB_P_ALWAYS, BB_P_ON_FAILURE, BB_P_NEVER };

typedef struct {
    int resource;
    struct rlimit lim;
} bb_rlimit_t;

typedef struct {
    const char *name;
    const char *command;
    char **argv;  /* argv[0] is command; NULL-terminated; strings borrowed from the JSON */
    char **env;   /* "KEY=VALUE" strings (owned), NULL-terminated */
    int count;
    const char *user; /* NULL: run as bigbrother's user */
    uid_t uid;
    gid_t gid;
    const char *cwd;
    bb_rlimit_t rlimits[BB_MAX_RLIMITS];
    int nrlimits;
    struct {
        enum bb_health type;
        int start_timeout_ms, liveness_timeout_ms; /* agent, notify */
        int period_ms, failure_threshold, timeout_ms; /* tcp, udp, http, exec */
        int port;
        /* udp: the query datagram; http: the whole GET request, built from "path" */
        unsigned char query[BB_PROBE_BYTES_MAX], expect[BB_PROBE_BYTES_MAX];
        size_t query_len, expect_len;
        const char *command; /* exec: run with /bin/sh -c */
    } health;
    struct {
        enum bb_policy policy;
        int backoff_min_ms, backoff_max_ms, max_restarts, window_s, healthy_reset_ms;
    } restart;
    struct {
        int signal, grace_ms, hang_signal;
    } stop;
    /* on_release "restart": the instance is restarted when its session ends (a release
     * by the game, or an allocation ended from outside); 0: "recycle", kept as it is.
     * The spec's pool and confirm_timeout_ms are ServerDir's and the primary's. */
    int restart_on_release;
    int metrics_slot; /* metrics.c's row for this service name, plus one (0: not yet) */
} bb_service_t;

typedef struct {
    json_t *root;  /* the parsed file; the strings below point into it */
    const char *path;
    const char *machine, *cluster, *state_dir;
    char *urls;    /* comma-separated ServerDir URLs (owned) or NULL: standalone */
    const char *token, *address;
    json_t *labels;
    int capacity, lease_ttl_ms;
    int cluster_mode;          /* "mode": "cluster": services also come from ServerDir */
    int primary_ttl_ms;        /* primary lease TTL (cluster mode) */
    int placement_interval_ms; /* how often the primary re-reads the state and places */
    int assignment_wait_ms;    /* long-poll wait of the assignments request */
    char agent_socket[BB_SOCK_PATH_MAX], notify_socket[BB_SOCK_PATH_MAX],
        control_socket[BB_SOCK_PATH_MAX];
    int64_t log_max_bytes;
    int log_keep;              /* rotations kept of an instance log (.1 ... .N) */
    int log_runs;              /* instance logs kept per slot (the newest) */
    char metrics_host[64];  /* metrics_listen: "" when /metrics is not served */
    int metrics_port;
    char logs_host[64];     /* logs_listen: "" when logs are not served (logsrv.c) */
    int logs_port;
    bb_service_t *services;
    int nservices;
} bb_config_t;

/* Loads and validates the config file. On error returns -1 with a message naming the
 * file, the field (services[0].restart.policy) and why. cfg is freed by bb_config_free. */
int bb_config_load(const char *path, bb_config_t *cfg, char *err, size_t errcap);
/* The same from a JSON text (unit tests); `name` stands for the file in messages. */
int bb_config_parse(const char *text, const char *name, bb_config_t *cfg, char *err,
                    size_t errcap);
void bb_config_free(bb_config_t *cfg);
/* "TERM", "SIGTERM" or "15" -> 15; -1 if unknown. */
int bb_signal_parse(const char *s);
/* Decodes C-style escapes (\xHH \n \r \t \0 \\) of s into out; returns the length or -1. */
int bb_unescape(const char *s, unsigned char *out, size_t cap);

/* ---------------------------------------------------------------- event loop (loop.c) */

/* An fd in the epoll set; fn runs on readiness with the epoll event mask. */
typedef struct bb_watch {
    int fd;
    void (*fn)(struct bb_watch *w, uint32_t events);
} bb_watch_t;

/* A deadline in the single timer heap; fn runs once when it passes. */
typedef struct bb_timer {
    int64_t at;   /* CLOCK_MONOTONIC ms */
    int idx;      /* heap position + 1, 0 when not armed */
    void (*fn)(struct bb_timer *t);
} bb_timer_t;

int bb_watch_add(bb_watch_t *w, uint32_t events);
int bb_watch_mod(bb_watch_t *w, uint32_t events);
/* Removes w from epoll and closes its fd (fd becomes -1). */
void bb_watch_close(bb_watch_t *w);
/* Frees p after the current batch of epoll events (a handler may close a watch whose
 * event is still pending in the batch). */
void bb_defer_free(void *p);
/* Frees what bb_defer_free collected (the loop does it after each batch). */
void bb_loop_free_deferred(void);
void bb_timer_set(bb_timer_t *t, int64_t at_ms);
void bb_timer_cancel(bb_timer_t *t);

/* Sets up epoll, the signalfd and the timerfd. Returns 0 or -errno. */
int bb_loop_init(void);
/* Registers fn to run before each sleep in epoll_wait (after the fd handlers and timers
 * of the previous turn), after the hooks registered before it. Returns 0, or -ENOSPC
 * when the loop's few hook slots are taken. */
int bb_loop_before_sleep(void (*fn)(void));
/* Runs until a stop signal; returns the signal that ended it (SIGTERM, SIGINT, SIGHUP). */
int bb_loop_run(void);
/* Asks the loop to return after the current iteration with `sig` (bbctl, tests). */
void bb_loop_quit(int sig);

/* ---------------------------------------------------------------- instances (supervisor.c) */

/* See the state table in supervisor.c. */
enum bb_state { ST_BACKOFF, ST_STARTING, ST_READY, ST_STOPPING, ST_EXITED, ST_FAILED,
                ST_STOPPED, ST__COUNT };
enum bb_event { EV_START, EV_READY, EV_ALIVE, EV_DEADLINE, EV_EXIT, EV_STOP, EV_RESTART,
                EV_ADOPT, EV__COUNT };
/* Why a process is being stopped by bigbrother (decides the reported reason). */
enum bb_why { WHY_NONE, WHY_HUNG, WHY_START_TIMEOUT, WHY_OPERATOR, WHY_RESTART, WHY_REPLACED,
              WHY_DRAINED };

struct bb_conn;
struct bb_cspec;

typedef struct bb_inst {
    bb_service_t *svc;
    int slot;
    char id[SD_NAME_MAX + 1];   /* current instance id; a new one per spawn */
    enum bb_state state;
    pid_t pid;
    int64_t start_ticks;        /* /proc/<pid>/stat field 22, for re-adoption */
    int is_child;               /* 0 for re-adopted processes: no exit status available */
    bb_watch_t pidw;            /* the pidfd */
    int generation;             /* how many times this slot was (re)started */
    int restarts;               /* restarts done by bigbrother (shown by bbctl) */
    int64_t spawned_mono, ready_mono, alive_mono, spawned_wall;
    bb_timer_t deadline;        /* start / liveness / stop grace / backoff, per state */
    int stop_phase;             /* 0 SHUTDOWN sent, 1 stop signal sent, 2 SIGKILL sent */
    enum bb_why why;
    int64_t why_silent_ms;
    char why_detail[160];
    int loaded;                 /* state restored from the persisted table */
    /* the last exit, shown by bbctl status */
    char reason[24];
    int code, sig;              /* -1 when not applicable */
    int dumped;                 /* the kernel reported a core dump (CLD_DUMPED) */
    char detail[200];
    int fail_streak;
    int64_t restart_mono[BB_WINDOW_MAX];
    int nrestart_mono;
    struct bb_conn *conn;       /* agent connection, NULL when none */
    char status[SD_STATUS_MAX + 1];
    int players, max_players;
    char ports[SD_STATUS_MAX + 1]; /* PORTS the agent reported, as compact JSON ("" none) */
    /* allocations and status events (alloc.c) */
    struct bb_alloc {
        char id[SD_NAME_MAX + 1];
        int sent;               /* ALLOCATED went out on the current agent connection */
        int acked;              /* ALLOCATION_ACK came back: confirmed was reported */
        int released;           /* the game released it (RELEASE=1) */
        int listed;             /* the document being applied lists it */
    } allocs[BB_ALLOCS_MAX];
    int nallocs;
    bb_timer_t status_timer;    /* the next status event may go out then */
    int64_t status_sent_mono;   /* when the last status event went out */
    int status_dirty;           /* players / max_players / status changed since */
    /* probes (probe.c) */
    bb_watch_t probew;
    bb_timer_t probe_timer;
    int probe_busy;
    pid_t probe_pid;
    int probe_failures;      /* consecutive, reset by a success */
    int probe_failures_total; /* this run's, for the health view (health.c) */
    char probe_error[96];    /* why the last probe failed ("" none yet) */
    int probe_sent;          /* http: the request is written, the status line is awaited */
    char probe_head[16];     /* http: the first bytes of the reply, "HTTP/1.1 200 " */
    int probe_head_len;
    int64_t probe_ok_mono, probe_started_mono;
    /* cluster mode (converge.c): a slot given by the assignment, not by the config */
    struct bb_cspec *cspec;      /* the spec svc points into; NULL for a static service */
    struct bb_cspec *next_cspec; /* the spec of the next spawn (a restart for a new spec) */
    int assigned;                /* the current assignment has this slot */
    int64_t restart_token;       /* the slot's restart token last acted on */
} bb_inst_t;

typedef struct {
    bb_config_t cfg;
    bb_inst_t *inst;
    int ninst;
    int inst_cap;         /* entries allocated: the table never moves (pointers into it) */
    bb_report_t *report;
    char run_id[8];       /* 6 hex chars, new each start: part of instance ids */
    uint64_t counter;     /* instance id counter, persisted */
    char ident[33];       /* BB_SUPERVISOR of every process spawned (procscan.c) */
    int state_dirty;
} bb_daemon_t;

extern bb_daemon_t bb;

const char *bb_state_name(enum bb_state s);
/* Creates the instance table from the config (state ST_STOPPED, no process). */
int bb_supervisor_init(void);
/* Sets up a zeroed table entry: stopped, no process, deadline handler. */
void bb_inst_init_entry(bb_inst_t *in);
/* Starts every instance that is not adopted, failed or stopped by an operator. */
void bb_supervisor_start_all(void);
/* Feeds one event that carries nothing more to the instance's state machine (EV_STOP
 * this way is a bare operator stop). */
void bb_inst_event(bb_inst_t *in, enum bb_event ev);
/* EV_EXIT: the pidfd reported the exit; code / sig are -1 when unknown (re-adopted
 * process). */
void bb_inst_exited(bb_inst_t *in, int code, int sig);
/* EV_ADOPT: state.c restored the entry of the previous run, which was in state `was`;
 * alive: its process still runs and in->pid is watched (0: it died meanwhile, or the
 * state holds no process). */
void bb_inst_adopt(bb_inst_t *in, enum bb_state was, int alive);
bb_inst_t *bb_inst_by_id(const char *id);
/* The instance whose process is pid or whose process group contains pid. */
bb_inst_t *bb_inst_by_pid(pid_t pid);
/* Applies an operator command to TARGET (instance id, service name or "all").
 * Returns how many instances it touched. */
int bb_operator(const char *cmd, const char *target);
/* EV_STOP with its reason (WHY_OPERATOR, WHY_REPLACED, WHY_DRAINED): SHUTDOWN, stop
 * signal, SIGKILL as for an operator stop; it ends in ST_STOPPED and is not restarted,
 * also when a stop was already under way. */
void bb_inst_stop(bb_inst_t *in, enum bb_why why);

/* ---------------------------------------------------------------- cluster mode */

/* cluster.c: starts the assignments and primary threads (cluster mode only) and the
 * eventfd through which a new assignment reaches the supervision thread. 0 or -errno. */
int bb_cluster_start(void);
/* Stops both threads (releases the primary lease if held). */
void bb_cluster_stop(void);
/* converge.c: makes the cluster slots of the table match the assignment document `doc`
 * (borrowed); draining says why removed slots stop (drained or replaced). Runs on the
 * supervision thread; never blocks. */
void bb_converge_apply(const json_t *doc, int draining);
/* supervisor.c calls it before each spawn: a restart for a new spec switches the
 * instance to it (a no-op when no new spec waits). */
void bb_converge_respawn(bb_inst_t *in);
/* For state.c: the process spec of a cluster slot (borrowed; NULL for a static one), and
 * re-creating a cluster slot's entry from the persisted table (not started; NULL when
 * the spec is refused or the table is full). */
const json_t *bb_converge_spec(const bb_inst_t *in);
bb_inst_t *bb_converge_restore(const char *service, int slot, const json_t *spec,
                               int64_t restart_token, int assigned);
/* Frees every cluster spec (at exit). */
void bb_converge_free(void);

/* ---------------------------------------------------------------- spawn.c */

/* Forks and execs the service's command for `in` with a fresh instance id, its own
 * process group, logs and environment. Fills pid, pidfd, id. Returns 0 or -errno. */
int bb_spawn(bb_inst_t *in);
/* Signals the instance's process group (falls back to the pid). */
void bb_signal_group(bb_inst_t *in, int sig);
/* Arms the loop timer that rotates, every 2 s, the instance logs that grew past
 * log_max_bytes (copy + truncate). */
void bb_logs_start(void);
/* A failed stop's crash report into the stopped event ev: log_tail, the last lines of the
 * run's output (its log less the header line, with the end of its .1 before it when the
 * log was rotated a moment ago; SD_LOG_TAIL_LINES lines, at most SD_LOG_TAIL_MAX bytes,
 * control bytes and broken UTF-8 as '?'), and core, where a core dump went, when the
 * kernel reported one. Nothing for a clean exit or an operator's stop. */
void bb_crash_report(const bb_inst_t *in, json_t *ev);
/* STATE_DIR/logs/<service>-<slot>/<instance>.log: the log of in's run, one file per
 * instance, made at its spawn with a header line "=== bigbrother <time>: starting
 * instance <id> (generation <n>)", rotated past log_max_bytes into .1 ... .<log_keep>.
 * STATE_DIR/logs/<service>-<slot>.log is a symlink to the slot's current one; a slot
 * keeps its newest log_runs instance logs. */
void bb_log_path(const bb_inst_t *in, char *out, size_t cap);
/* The file in's run writes to: bb_log_path's, or for a run adopted across the upgrade to
 * one file per instance (it has none), the slot log of the layout before, a regular file
 * STATE_DIR/logs/<service>-<slot>.log, until the slot's next spawn moves it aside. */
void bb_log_path_current(const bb_inst_t *in, char *out, size_t cap);
/* The log of instance id, current or earlier: STATE_DIR/logs/<dir>/<id>.log for a slot
 * directory <dir> of the id's service (a stat per slot directory, no file read), else
 * the slot log of the layout before that holds its header (a run adopted across the
 * upgrade: the regular .log files of STATE_DIR/logs are read). 0 with
 * the path in out, -1 when there is none (or id is not a name). Reads only the state
 * dir, not the supervisor's state: any thread may call it. */
int bb_log_find(const char *id, char *out, size_t cap);
/* What a log line is: 1 the spawn header of instance id's run, 2 the spawn header of
 * another run (the end of id's; not expected in a log of one instance), 0 output. */
int bb_log_header(const char *line, const char *id);
#define BB_LOG_LINES_MAX 10000 /* lines a log reader keeps for a tail */
/* Reads instance id's run from its log f (opened at path, read from f's position): the
 * whole file is the run, less its header line. Appends to out its last `tail` lines (0:
 * all), at most BB_LOG_LINES_MAX and the newest that fit in out's cap; when f holds no
 * more than `tail` lines (it was just rotated), or tail is 0, the lines of path.1 (the
 * run's output before the rotation) come before f's. Leaves f after what it read.
 * Returns 1 when another run's header ended the run, else 0. */
int bb_log_read_run(FILE *f, const char *path, const char *id, long tail, sd_buf_t *out);
/* Watches the pidfd of a re-adopted instance (in->pid set). Returns 0 or -errno. */
int bb_adopt_pid(bb_inst_t *in, pid_t ppid);
/* ---------------------------------------------------------------- procscan.c */

/* What /proc/<pid>/stat says about a process. */
typedef struct {
    pid_t ppid, pgrp;
    int64_t start_ticks; /* field 22: clock ticks since boot */
} bb_pstat_t;

/* One of this bigbrother's instances, found running by its environment. */
typedef struct {
    pid_t pid, ppid;
    uid_t uid;
    int64_t start_ticks, start_ms; /* since boot */
    int slot, generation;
    char id[SD_NAME_MAX + 1], service[SD_NAME_MAX + 1];
    int claimed;                   /* state.c: given to a slot or stopped */
} bb_found_t;

/* Reads starttime (field 22) and the parent pid of /proc/<pid>/stat. Returns 0, or -1
 * when the process is gone or a zombie. */
int bb_proc_stat(pid_t pid, int64_t *start_ticks, pid_t *ppid);
/* The same for proc_root/<pid>/stat with the process group too (unit tests pass a fake
 * proc root). */
int bb__proc_stat_at(const char *proc_root, pid_t pid, bb_pstat_t *st);
/* Scans proc_root for the running instances whose BB_SUPERVISOR is ident, checked by
 * process group and start time (see procscan.c). *out (malloc'd, freed by the caller,
 * also when 0 are found) gets them newest first, one per instance id. Returns how many,
 * or -errno (then *out is NULL). */
int bb__proc_scan(const char *proc_root, const char *ident, bb_found_t **out);

/* ---------------------------------------------------------------- orphan.c */

/* Stops a process of this bigbrother that no slot takes any more (its slot left the
 * config, or another process holds it): the stop signal to its group (svc's when known,
 * else SIGTERM), SIGKILL after the grace, then a `stopped` event with reason `orphaned`
 * and detail. The process is tracked outside the instance table until it is gone. */
void bb_orphan_stop(const bb_found_t *f, const bb_service_t *svc, const char *detail);

/* ---------------------------------------------------------------- pidfd.c */

/* An fd that becomes readable when pid exits (pidfd_open, or its emulation where the
 * system call is missing). Returns the fd or -1 with errno. */
int bb_pidfd_open(pid_t pid);
/* waitid(WEXITED | WNOHANG) for the process of a bb_pidfd_open fd; si->si_pid is 0 while
 * it runs. Returns 0 or -1 with errno (ECHILD: not our child). */
int bb_pidfd_wait(int fd, siginfo_t *si);
/* Closes a watch whose fd came from bb_pidfd_open (or any other fd). */
void bb_pidfd_close(bb_watch_t *w);

/* ---------------------------------------------------------------- sockets */

/* Binds a non-blocking unix socket of `type` at path (replacing a stale file) with the
 * given mode; listens unless SOCK_DGRAM. Returns the fd or -errno. */
int bb__unix_listen(const char *path, int type, int mode);
/* Log lines an outsider can trigger (a local client, a datagram) are written at most
 * BB_LOG_BURST a second: bb__log_ok(&rl) says whether this one may be, and counts the ones
 * it holds back in rl.held (reported, then reset, by the next line written). */
#define BB_LOG_BURST 5
typedef struct {
    int64_t last_ms; /* start of the current one-second window */
    int burst;       /* lines written in it */
    int64_t held;
} bb_ratelimit_t;
int bb__log_ok(bb_ratelimit_t *rl);
/* bb__unix_listen, then watches the socket with w, calling fn when a client connects.
 * Returns 0 or a negative errno. */
int bb__unix_listen_watch(bb_watch_t *w, const char *path, int type, int mode,
                          void (*fn)(bb_watch_t *w, uint32_t events));
/* Copies len bytes of an outside text (STATUS=) into dst (cap >= 1, NUL-terminated,
 * truncated), each byte outside printable ASCII replaced by '?': what bbctl and the
 * JSON answers show is always valid text. */
void bb__copy_printable(char *dst, size_t cap, const char *src, size_t len);
int bb_agentsrv_init(void);
void bb_agentsrv_close(void);
void bb_agent_send(bb_inst_t *in, const char *key, const char *val, const char *key2,
                   const char *val2);
/* Sends one ready-made message (at most BBPROTO_MAX_MSG bytes) to the instance's agent:
 * 0, -ENOTCONN without a connection, or the send's -errno (-EAGAIN: its socket is full). */
int bb_agent_send_msg(bb_inst_t *in, const char *msg, size_t len);
void bb_agent_detach(bb_inst_t *in);
int bb_notify_init(void);
void bb_notify_close(void);
int bb_ctl_init(void);
void bb_ctl_close(void);

/* ---------------------------------------------------------------- probe.c */

void bb_probe_start(bb_inst_t *in);  /* begins periodic probing of a new process */
void bb_probe_stop(bb_inst_t *in);
void bb_probe_free(void);             /* at exit: the killed exec probes not reaped yet */

/* ---------------------------------------------------------------- state.c */

/* Takes the lock file, then sets bb.ident (bigbrother.id, created at the first start);
 * exits with a clear error when another bigbrother holds the lock. */
void bb_state_lock(void);
/* Re-adopts the instances of the persisted table whose processes still run, and those
 * found running by their environment; stops the orphans (see state.c). */
void bb_state_load(void);
/* Reads state_dir/state.json: the parsed table (caller decrefs), or NULL when it is
 * missing or damaged; a damaged one is renamed aside and logged. */
json_t *bb__state_read(const char *state_dir);
/* Writes the table atomically if it changed (a before-sleep hook of the loop, and once
 * more when the loop ends). */
void bb_state_save(void);

/* Sends one started/ready/stopped event to the reporter. */
void bb_report(bb_inst_t *in, const char *type);
/* A new process event of `type` about in (type, instance, service, ts_ms, slot,
 * generation), for the caller to complete and pass to bb_event_emit; NULL on ENOMEM. */
json_t *bb_event_new(const bb_inst_t *in, const char *type);
/* Appends ev to the outbox (a failure is logged) and drops the caller's reference. */
void bb_event_emit(const bb_inst_t *in, json_t *ev);

/* ---------------------------------------------------------------- alloc.c */

/* Applies the assignment document's "allocations" array (borrowed; NULL: none): sends
 * ALLOCATED to the instances with an agent connection that have not acknowledged it,
 * DEALLOCATED for the allocations that left the document (then restarts the instance
 * when its service says on_release "restart"). */
void bb_alloc_apply(const json_t *allocs);
/* A new agent connection of in: every allocation it has not acknowledged is sent again. */
void bb_alloc_connected(bb_inst_t *in);
/* Sends what could not be sent before (the agent's socket was full); cheap when nothing
 * waits. Called on every message from the agent. */
void bb_alloc_retry(bb_inst_t *in);
/* ALLOCATION_ACK=<id> (len bytes) from the agent: reports `confirmed` once. */
void bb_alloc_ack(bb_inst_t *in, const char *id, size_t len);
/* RELEASE=1 from the agent: reports `released` and restarts by on_release. */
void bb_alloc_release(bb_inst_t *in);
/* The instance's process is gone or replaced: forgets its allocations and its pending
 * status event. */
void bb_alloc_reset(bb_inst_t *in);
/* Sends a status change still held back by the one-a-second limit now (before the ready
 * event, so the instance enters the pool with its status and ports). */
void bb_status_flush(bb_inst_t *in);
/* players, max_players or status changed: a `status` event, at most one per instance per
 * second (a timer sends the latest values), when events go to ServerDir. */
void bb_status_changed(bb_inst_t *in);
/* Frees the document kept for resends (at exit). */
void bb_alloc_free(void);
/* Writes the last exit of in as text into buf, in sd_reason_format's wording
 * ("killed(signal 9)", "hung(silent 3012ms)"); returns the length it needed. */
size_t bb_inst_reason_text(const bb_inst_t *in, char *buf, size_t cap);

/* ---------------------------------------------------------------- systemd.c */

/* Arms the loop timer that tells systemd READY=1 from inside the running loop (after
 * re-adoption) and then WATCHDOG=1 every half WATCHDOG_USEC, so a stuck loop starves
 * the watchdog. A no-op without NOTIFY_SOCKET. */
void bb_systemd_start(void);
/* STOPPING=1 (SIGTERM/SIGINT) or RELOADING=1 (SIGHUP re-exec) with a STATUS= line. */
void bb_systemd_stopping(int sig, int running);

/* ---------------------------------------------------------------- metrics.c
 * The counters are written by the supervision thread only, as relaxed atomics, and read
 * by the /metrics HTTP thread: supervision never takes a lock or waits for a scrape. */

/* Allocates the per-service counters (after bb_supervisor_init) and, when metrics_listen
 * is set, starts the HTTP thread serving /metrics there. Returns 0 or -errno. */
int bb_metrics_start(void);
void bb_metrics_stop(void);
/* A listening TCP socket on host:port (numeric IPv4 or IPv6): the fd or -errno. */
int bb_listen_tcp(const char *host, int port);
/* The health view (health.c): a snapshot of every instance's liveness, rebuilt by the
 * loop every second, read by the logs port's threads. bb_health_dump answers the whole
 * machine (id NULL) or the current run named id as compact JSON (malloc'd; NULL when
 * there is no such run or no snapshot). */
void bb_health_start(void);
void bb_health_stop(void);
char *bb_health_dump(const char *id);
/* The logs port (logsrv.c), when logs_listen is set: 0, or -errno when it cannot open. */
int bb_logsrv_start(void);
void bb_logsrv_stop(void);
/* The counters survive a SIGHUP re-exec: bb_metrics_save writes them to
 * state_dir/metrics.saved just before the exec, bb_metrics_restore (after
 * bb_metrics_start) reads them back and deletes the file. A damaged file is logged and
 * ignored: the counters start at 0, as after any other start. */
void bb_metrics_save(void);
void bb_metrics_restore(void);
/* An instance exited with in->reason; restarting: a restart follows (backoff). */
void bb_metrics_exit(const bb_inst_t *in, int restarting);
/* A hang kill: the instance missed its start (start = 1) or liveness deadline. */
void bb_metrics_hang(const bb_inst_t *in, int start);
void bb_metrics_spawn(const bb_inst_t *in);
/* Before-sleep hook of the loop: republishes the processes-by-state and agent gauges. */
void bb_metrics_publish(void);

#endif
