/* The instances: the table of supervised processes (table.c), the state machine that
 * drives each one (supervisor.c), how they are spawned and their logs kept (spawn.c),
 * watched (pidfd.c, probe.c, health.c), found again after a restart (procscan.c) and
 * stopped when no slot takes them (orphan.c). Runs on the supervision thread.
 *
 * The state machine calls no other subsystem by name: what it does that others react to
 * goes out through bb_inst_hooks, which the reacting subsystem fills in at its init. */
#ifndef BB_INSTANCE_H
#define BB_INSTANCE_H

#include "core/bb.h"
#include "report/bb_report.h"

#define BB_NO_REASON SD_STOP_COUNT /* bb_inst_t.reason of an instance that never stopped */
#define BB_ALLOCS_MAX 16       /* open allocations tracked per instance (agent/alloc.c) */

/* ---------------------------------------------------------------- instances (supervisor.c) */

/* See the state table in supervisor.c. */
enum bb_state { ST_BACKOFF, ST_STARTING, ST_READY, ST_STOPPING, ST_EXITED, ST_FAILED,
                ST_STOPPED, ST__COUNT };
enum bb_event { EV_START, EV_READY, EV_ALIVE, EV_DEADLINE, EV_EXIT, EV_STOP, EV_RESTART,
                EV_ADOPT, EV__COUNT };
/* Why a process is being stopped by bigbrother (decides the reported reason). */
enum bb_why { WHY_NONE, WHY_HUNG, WHY_START_TIMEOUT, WHY_OPERATOR, WHY_RESTART, WHY_REPLACED,
              WHY_DRAINED, WHY_DISCONNECTED, WHY_LOST };

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
    int generation;             /* how many times this slot was started (every spawn) */
    int restarts;               /* restarts by the restart policy after the process ended
                                   on its own or was killed (not planned ones): the one
                                   "restarts" figure (docs/design.md, "Figures"), sent on
                                   every event and shown by bbctl, sdctl, the dashboard */
    int64_t spawned_mono, ready_mono, alive_mono, spawned_wall;
    int64_t reported_mono;      /* when this bigbrother appended the run's started event
                                   (0: an earlier one did, for a re-adopted process) */
    bb_timer_t deadline;        /* start / liveness / stop grace / backoff, per state */
    int stop_phase;             /* 0 SHUTDOWN sent, 1 stop signal sent, 2 SIGKILL sent */
    enum bb_why why;
    int64_t why_silent_ms;
    char why_detail[160];
    int loaded;                 /* state restored from the persisted table */
    /* the last exit, shown by bbctl status */
    sd_stop_reason_t reason;    /* BB_NO_REASON before the first exit */
    int code, sig;              /* -1 when not applicable */
    int dumped;                 /* the kernel reported a core dump (CLD_DUMPED) */
    char detail[200];
    int fail_streak;
    int64_t restart_mono[BB_WINDOW_MAX];
    int nrestart_mono;
    struct bb_conn *conn;       /* agent connection, NULL when none */
    int cred_owed;              /* a CREDENTIAL frame the agent's full socket refused:
                                   sent again with its next message (agent/credential.c) */
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
    int stop_after_ms;           /* the spec's disconnect.stop_after_ms, 0: never */
    int keep_original;           /* the spec's disconnect.reconcile is keep_original */
    int64_t kept_since;          /* keep_original: unlisted but kept running since (mono
                                    ms), 0: not */
    int64_t kept_reported;       /* ... and last reported alive then (mono ms) */
} bb_inst_t;

typedef struct {
    bb_config_t cfg;
    bb_inst_t *inst;
    int ninst;
    int inst_cap;         /* entries allocated: the table never moves (pointers into it) */
    bb_report_t *report;
    bb_cred_t *cred;      /* instance credentials (report/credential.c); NULL: off */
    char run_id[8];       /* 6 hex chars, new each start: part of instance ids */
    uint64_t counter;     /* instance id counter, persisted */
    char ident[33];       /* BB_SUPERVISOR of every process spawned (procscan.c) */
    int state_dirty;
} bb_daemon_t;

extern bb_daemon_t bb; /* the daemon's one global (table.c) */

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
/* Watches the reporter's read of the directory after a new registration of the lease
 * (bb_report_take_live): a process running here whose record the directory no longer
 * holds live (marked stopped, machine_lost, while the lease had run out) is restarted
 * as a new run, since a stopped run never comes back (its locks were freed). 0 or
 * -errno. */
int bb_relive_init(void);
/* Applies an operator command to TARGET (instance id, service name or "all").
 * Returns how many instances it touched. */
int bb_operator(const char *cmd, const char *target);
/* EV_RESTART because the directory marked the run stopped (machine_lost) while the
 * machine's lease had run out: the stop is reported with reason machine_lost, then the
 * slot starts a new run (a planned restart, like an operator's). */
void bb_inst_restart_lost(bb_inst_t *in);
/* EV_STOP with its reason (WHY_OPERATOR, WHY_REPLACED, WHY_DRAINED, WHY_DISCONNECTED): SHUTDOWN, stop
 * signal, SIGKILL as for an operator stop; it ends in ST_STOPPED and is not restarted,
 * also when a stop was already under way. */
void bb_inst_stop(bb_inst_t *in, enum bb_why why);

/* ---------------------------------------------------------------- hooks (supervisor.c)
 * The actions out of the state machine. Each member belongs to one subsystem, which sets
 * it before it is needed (at its init; converge with its first cluster slot); a NULL
 * member is skipped. Called on the supervision thread, in the
 * order the state machine runs them. */
typedef struct {
    /* before each spawn: why it must wait (the instance is then held in backoff with no
     * deadline until its subsystem starts it again), NULL to go ahead (cluster/) */
    const char *(*hold)(bb_inst_t *in);
    /* before each spawn: a cluster slot switches to its next spec (cluster/) */
    void (*respawn)(bb_inst_t *in);
    /* the process is gone or about to be replaced: forget its allocations (agent/) */
    void (*reset)(bb_inst_t *in);
    /* just before the ready event: send a held-back status change (agent/) */
    void (*ready)(bb_inst_t *in);
    /* the stop's first step over an agent connection (in->conn set) (agent/) */
    void (*shutdown)(bb_inst_t *in, int grace_ms);
    /* the process exited: close its agent connection (agent/) */
    void (*detach)(bb_inst_t *in);
    /* the run is over (its process exited): drop its credential and file (agent/) */
    void (*gone)(bb_inst_t *in);
    /* counters (ops/): a spawn; a hang kill (start = 1: the start deadline); an exit
     * with in->reason set, restarting when a restart follows */
    void (*spawned)(const bb_inst_t *in);
    void (*hung)(const bb_inst_t *in, int start);
    void (*exited)(const bb_inst_t *in, int restarting);
    /* a spawn held back by the hold hook (ops/) */
    void (*held)(const bb_inst_t *in);
} bb_inst_hooks_t;

extern bb_inst_hooks_t bb_inst_hooks;

/* ---------------------------------------------------------------- events (table.c) */

/* A new process event of `type` about in (type, instance, service, ts_ms, slot,
 * generation, restarts), for the caller to complete and pass to bb_event_emit; NULL on ENOMEM. */
json_t *bb_event_new(const bb_inst_t *in, sd_event_type_t type);
/* Appends ev to the outbox (a failure is logged) and drops the caller's reference. */
void bb_event_emit(const bb_inst_t *in, json_t *ev);

/* Writes the last exit of in as text into buf, in sd_reason_format's wording
 * ("killed(signal 9)", "hung(silent 3012ms)"); returns the length it needed. */
size_t bb_inst_reason_text(const bb_inst_t *in, char *buf, size_t cap);
/* The wire name of in's last stop reason, "" before the first exit. */
const char *bb_inst_reason(const bb_inst_t *in);

/* ---------------------------------------------------------------- spawn.c */

/* Forks and execs the service's command for `in` with a fresh instance id, its own
 * process group, logs and environment. Fills pid, pidfd, id. Returns 0 or -errno. */
int bb_spawn(bb_inst_t *in);
/* STATE_DIR/credentials/<id>.jwt: where the credential of instance id is handed over
 * (agent/credential.c), named to the process by SERVERDIR_CREDENTIAL_FILE when
 * credentials are on. */
void bb_credential_path(const char *id, char *out, size_t cap);
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
 * system call is missing). Returns the fd or -errno. */
int bb_pidfd_open(pid_t pid);
/* waitid(WEXITED | WNOHANG) for the process of a bb_pidfd_open fd; si->si_pid is 0 while
 * it runs. Returns 0 or -errno (-ECHILD: not our child). */
int bb_pidfd_wait(int fd, siginfo_t *si);
/* Closes a watch whose fd came from bb_pidfd_open (or any other fd). */
void bb_pidfd_close(bb_watch_t *w);

/* ---------------------------------------------------------------- probe.c */

void bb_probe_start(bb_inst_t *in);  /* begins periodic probing of a new process */
void bb_probe_stop(bb_inst_t *in);
void bb_probe_free(void);             /* at exit: the killed exec probes not reaped yet */

/* ---------------------------------------------------------------- health.c
 * The health view: a snapshot of every instance's liveness, rebuilt by the loop every
 * second, read by the logs port's threads. bb_health_dump answers the whole machine (id
 * NULL) or the current run named id as compact JSON (malloc'd; NULL when there is no
 * such run or no snapshot). */
void bb_health_start(void);
void bb_health_stop(void);
char *bb_health_dump(const char *id);

#endif
