/* The per-instance state machine. Every instance (one slot of a service) is driven by
 * this table and nothing else: actions[state][event]. Events come in through
 * bb_inst_event() and its siblings, carrying what they know (the reason of a stop, the
 * status of an exit, the state a re-adopted process was in); only the actions below
 * change an instance's state.
 *
 *  state \ event | START  READY  ALIVE  DEADLINE         EXIT  STOP      RESTART  ADOPT
 *  --------------+-----------------------------------------------------------------------
 *  backoff       | spawn  -      -      spawn            -     stopped   fresh    -
 *  starting      | -      ready  alive  hang (start)     exit  stop      restart  -
 *  ready         | -      alive  alive  hang (liveness)  exit  stop      restart  -
 *  stopping      | -      -      -      escalate         exit  retarget  again    -
 *  exited        | fresh  -      -      -                -     stopped   fresh    -
 *  failed        | fresh  -      -      -                -     stopped   fresh    -
 *  stopped       | fresh  -      -      -                -     -         fresh    adopt
 *
 *  spawn     a cluster slot that must wait (the hold hook: its assignment may be stale,
 *            or no longer holds it) stays in backoff with no deadline, and its subsystem
 *            starts it again; else switch a cluster slot to its next spec if it has one; fork+exec with a new
 *            instance id -> starting (health none: -> ready at once); arms the start
 *            deadline. A failed fork -> backoff, deadline 1 s
 *  fresh     an operator's start: forget the crash-loop history, then spawn
 *  ready     report "ready"; arms the liveness deadline (agent / notify heartbeats)
 *  alive     a heartbeat: moves the liveness deadline
 *  hang      hang_signal (default ABRT, leaves a core) to the process group -> stopping;
 *            the reason will be hung (liveness) or start_timeout, with how long it was silent
 *  stop      SHUTDOWN over the agent connection, then the stop signal, then SIGKILL, each
 *            after stop.grace_ms -> stopping; the reason is the event's (operator,
 *            replaced, drained, disconnected), stopped_by_operator for a bare operator stop
 *  restart   the same sequence for an operator or assignment restart, or a run the
 *            directory marked stopped while the lease had run out (machine_lost)
 *  escalate  the next step of that sequence
 *  retarget  a stop with a reason of its own (the assignment's operator / replaced /
 *            drained, converge's disconnected) makes the stop under way end in stopped with that reason; a bare
 *            operator stop leaves it as it is
 *  again     operator restart during a stop: spawn as soon as the process is gone
 *  exit      classify the event's status (exited(code), killed(signal), hung,
 *            start_timeout, stopped_by_operator, replaced, drained, disconnected,
 *            machine_lost), report "stopped", then a planned restart (operator, lost
 *            record) -> backoff at once, else by the restart policy: backoff
 *            (exponential + jitter; the deadline,
 *            through spawn, is the restart), exited (no restart), failed (crash loop:
 *            max_restarts within window_s), stopped (operator, replaced, drained,
 *            disconnected)
 *  stopped   held stopped, not restarted
 *  adopt     the previous bigbrother's table entry: exited / failed / stopped are kept;
 *            a starting / ready process that still runs is watched again (its deadline
 *            and probes armed); one that died meanwhile is an exit of unknown status
 */
#include "instance/bb_instance.h"
#include "sdlog.h"
#include "sdtime.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* One event and what it carries. */
typedef struct {
    enum bb_event type;
    enum bb_why why;   /* STOP: its reason, WHY_NONE for a bare operator stop */
    int code, sig;     /* EXIT, ADOPT of a dead process: the status, -1 when unknown */
    enum bb_state was; /* ADOPT: the state the previous run recorded */
    int alive;         /* ADOPT: the process still runs and its pidfd is watched */
} bb_ev_t;

typedef void (*action_fn)(bb_inst_t *in, const bb_ev_t *ev);

static int uses_heartbeats(const bb_inst_t *in)
{
    return in->svc->health.type == BB_H_AGENT || in->svc->health.type == BB_H_NOTIFY;
}

static void set_state(bb_inst_t *in, enum bb_state s)
{
    in->state = s;
    bb.state_dirty = 1;
}

/* Sends one started / ready / stopped event about in to the reporter: a stopped one with
 * the reason, the exit status and the crash report. */
static void report(bb_inst_t *in, sd_event_type_t type)
{
    json_t *ev = bb_event_new(in, type);
    if (!ev)
        return;
    if (type == SD_EV_STARTED)
        json_object_set_new(ev, "pid", json_integer(in->pid));
    json_t *ports = in->ports[0] ? json_loads(in->ports, 0, NULL) : NULL;
    if (ports && type != SD_EV_STOPPED)
        json_object_set_new(ev, "ports", ports);
    else
        json_decref(ports);
    if (type == SD_EV_STOPPED) {
        json_object_set_new(ev, "reason", json_string(bb_inst_reason(in)));
        json_object_set_new(ev, "code", in->code >= 0 ? json_integer(in->code) : json_null());
        json_object_set_new(ev, "signal", in->sig > 0 ? json_integer(in->sig) : json_null());
        if (sd_stop_reason_flags(in->reason) & SD_STOP_F_SILENT)
            json_object_set_new(ev, "silent_ms", json_integer(in->why_silent_ms));
        if (in->detail[0])
            json_object_set_new(ev, "detail", json_string(in->detail));
        bb_crash_report(in, ev);
    }
    bb_event_emit(in, ev);
}

/* ---- actions */

static void a_none(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)in;
    (void)ev;
}

static void arm_deadline(bb_inst_t *in, int64_t in_ms)
{
    bb_timer_set(&in->deadline, sd_deadline_ms(sd_mono_ms(), in_ms));
}

/* The process proved it started: arms the liveness deadline and reports "ready". */
static void become_ready(bb_inst_t *in)
{
    int64_t now = sd_mono_ms();
    in->ready_mono = in->alive_mono = now;
    set_state(in, ST_READY);
    bb_timer_cancel(&in->deadline);
    if (uses_heartbeats(in))
        arm_deadline(in, in->svc->health.liveness_timeout_ms);
    log_info("instance ready", "instance=%s pid=%d start_ms=%lld", in->id, (int)in->pid,
             (long long)(now - in->spawned_mono));
    if (bb_inst_hooks.ready)
        bb_inst_hooks.ready(in);
    report(in, SD_EV_READY);
}

static void a_ready(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    become_ready(in);
}

/* Forks and execs the slot's process (with its next spec, for a cluster slot whose spec
 * changed); on success the instance is starting, or ready at once without health check. */
static void spawn(bb_inst_t *in)
{
    bb_timer_cancel(&in->deadline);
    const char *wait = bb_inst_hooks.hold ? bb_inst_hooks.hold(in) : NULL;
    if (wait) {
        log_info("restart held", "reason=%s instance=%s service=%s slot=%d", wait, in->id,
                 in->svc->name, in->slot);
        if (bb_inst_hooks.held)
            bb_inst_hooks.held(in);
        set_state(in, ST_BACKOFF);
        return;
    }
    if (bb_inst_hooks.respawn)
        bb_inst_hooks.respawn(in);
    in->why = WHY_NONE;
    in->status[0] = 0;
    in->ports[0] = 0;
    if (bb_inst_hooks.reset)
        bb_inst_hooks.reset(in);
    int rc = bb_spawn(in);
    if (rc) {
        /* fork failed: the machine is short of something; retry after the backoff */
        log_error("spawn failed", "service=%s slot=%d error=%s", in->svc->name, in->slot,
                  strerror(-rc));
        set_state(in, ST_BACKOFF);
        arm_deadline(in, 1000);
        return;
    }
    in->generation++;
    in->spawned_mono = in->alive_mono = sd_mono_ms();
    in->spawned_wall = sd_wall_ms();
    in->ready_mono = 0;
    set_state(in, ST_STARTING);
    if (bb_inst_hooks.spawned)
        bb_inst_hooks.spawned(in);
    log_info("instance started", "instance=%s service=%s slot=%d pid=%d generation=%d", in->id,
             in->svc->name, in->slot, (int)in->pid, in->generation);
    report(in, SD_EV_STARTED);
    in->reported_mono = sd_mono_ms();
    if (in->svc->health.type == BB_H_NONE) {
        become_ready(in);
        return;
    }
    arm_deadline(in, in->svc->health.start_timeout_ms);
    bb_probe_start(in);
}

static void a_spawn(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    spawn(in);
}

/* An operator start: forget the crash-loop history first. */
static void a_fresh(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    in->fail_streak = 0;
    in->nrestart_mono = 0;
    spawn(in);
}

static void a_alive(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    in->alive_mono = sd_mono_ms();
    if (in->state == ST_READY && uses_heartbeats(in))
        arm_deadline(in, in->svc->health.liveness_timeout_ms);
}

static void a_hang(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    int64_t now = sd_mono_ms();
    const bb_service_t *s = in->svc;
    in->why_silent_ms = now - in->alive_mono;
    if (in->state == ST_STARTING) {
        in->why = WHY_START_TIMEOUT;
        snprintf(in->why_detail, sizeof(in->why_detail), "start deadline %d ms missed",
                 s->health.start_timeout_ms);
    } else {
        in->why = WHY_HUNG;
        if (uses_heartbeats(in))
            snprintf(in->why_detail, sizeof(in->why_detail),
                     "liveness deadline %d ms missed", s->health.liveness_timeout_ms);
        else
            snprintf(in->why_detail, sizeof(in->why_detail),
                     "%d consecutive probe failures (period %d ms)", in->probe_failures,
                     s->health.period_ms);
    }
    log_warn("instance hung", "instance=%s pid=%d state=%s silent_ms=%lld detail=%s signal=%d",
             in->id, (int)in->pid, bb_state_name(in->state), (long long)in->why_silent_ms,
             in->why_detail, s->stop.hang_signal);
    if (bb_inst_hooks.hung)
        bb_inst_hooks.hung(in, in->state == ST_STARTING);
    bb_probe_stop(in);
    bb_signal_group(in, s->stop.hang_signal);
    bb_signal_group(in, SIGCONT); /* a stopped process takes the signal now */
    in->stop_phase = 1;
    set_state(in, ST_STOPPING);
    arm_deadline(in, s->stop.grace_ms);
}

static void begin_stop(bb_inst_t *in, enum bb_why why)
{
    in->why = why;
    in->why_detail[0] = 0;
    bb_probe_stop(in);
    set_state(in, ST_STOPPING);
    if (in->conn && bb_inst_hooks.shutdown) {
        bb_inst_hooks.shutdown(in, in->svc->stop.grace_ms);
        in->stop_phase = 0;
    } else {
        bb_signal_group(in, in->svc->stop.signal);
        in->stop_phase = 1;
    }
    log_info("instance stopping", "instance=%s pid=%d via=%s grace_ms=%d", in->id,
             (int)in->pid, in->stop_phase == 0 ? "shutdown" : "signal", in->svc->stop.grace_ms);
    arm_deadline(in, in->svc->stop.grace_ms);
}

static void a_stop(bb_inst_t *in, const bb_ev_t *ev)
{
    begin_stop(in, ev->why != WHY_NONE ? ev->why : WHY_OPERATOR);
}

static void a_restart(bb_inst_t *in, const bb_ev_t *ev)
{
    begin_stop(in, ev->why == WHY_LOST ? WHY_LOST : WHY_RESTART);
}

static void a_retarget(bb_inst_t *in, const bb_ev_t *ev)
{
    if (ev->why != WHY_NONE)
        in->why = ev->why;
}

static void a_again(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    if (in->why == WHY_OPERATOR || in->why == WHY_REPLACED || in->why == WHY_DRAINED ||
        in->why == WHY_DISCONNECTED)
        in->why = WHY_RESTART;
}

static void a_escalate(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    if (in->stop_phase == 0) {
        bb_signal_group(in, in->svc->stop.signal);
        in->stop_phase = 1;
        arm_deadline(in, in->svc->stop.grace_ms);
        return;
    }
    if (in->stop_phase == 1)
        log_warn("instance killed after the grace", "instance=%s pid=%d grace_ms=%d", in->id,
                 (int)in->pid, in->svc->stop.grace_ms);
    else
        log_error("instance survives SIGKILL", "instance=%s pid=%d", in->id, (int)in->pid);
    bb_signal_group(in, SIGKILL);
    in->stop_phase = 2;
    arm_deadline(in, 5000);
}

static void a_stopped(bb_inst_t *in, const bb_ev_t *ev)
{
    (void)ev;
    bb_timer_cancel(&in->deadline);
    set_state(in, ST_STOPPED);
    log_info("instance held stopped", "service=%s slot=%d", in->svc->name, in->slot);
}

/* Fills reason / code / sig / detail of the exit that just happened. */
static void classify_exit(bb_inst_t *in, int code, int sig)
{
    in->code = code;
    in->sig = sig;
    in->detail[0] = 0;
    switch (in->why) {
    case WHY_HUNG:
        in->reason = SD_STOP_HUNG;
        snprintf(in->detail, sizeof(in->detail), "%s", in->why_detail);
        break;
    case WHY_START_TIMEOUT:
        in->reason = SD_STOP_START_TIMEOUT;
        snprintf(in->detail, sizeof(in->detail), "%s", in->why_detail);
        break;
    case WHY_OPERATOR:
    case WHY_RESTART:
        in->reason = SD_STOP_BY_OPERATOR;
        break;
    case WHY_REPLACED:
        in->reason = SD_STOP_REPLACED;
        break;
    case WHY_DRAINED:
        in->reason = SD_STOP_DRAINED;
        break;
    case WHY_DISCONNECTED:
        in->reason = SD_STOP_DISCONNECTED;
        break;
    case WHY_LOST:
        in->reason = SD_STOP_MACHINE_LOST;
        snprintf(in->detail, sizeof(in->detail), "%s",
                 "the directory marked the run stopped while the machine's lease had run "
                 "out: restarted as a new run");
        break;
    case WHY_NONE:
        if (sig > 0) {
            in->reason = SD_STOP_KILLED;
        } else {
            in->reason = SD_STOP_EXITED;
            if (code < 0)
                sd_strlcpy(in->detail, "exit status unknown (re-adopted process)",
                           sizeof(in->detail));
        }
        break;
    }
}

/* Counts restarts inside the window and records this one; 1 if it is a crash loop. */
static int crash_loop(bb_inst_t *in, int64_t now)
{
    const bb_service_t *s = in->svc;
    int n = 0;
    for (int i = 0; i < in->nrestart_mono; i++)
        if (now - in->restart_mono[i] < (int64_t)s->restart.window_s * 1000)
            in->restart_mono[n++] = in->restart_mono[i];
    in->nrestart_mono = n;
    if (n >= s->restart.max_restarts)
        return 1;
    in->restart_mono[in->nrestart_mono++] = now;
    return 0;
}

/* The process is gone (ev->code / ev->sig, -1 when unknown): classifies and reports the
 * exit, then holds the instance or schedules its restart by the policy. The restart
 * itself is the backoff state's DEADLINE event. */
static void a_exit(bb_inst_t *in, const bb_ev_t *ev)
{
    int64_t now = sd_mono_ms();
    const bb_service_t *s = in->svc;
    classify_exit(in, ev->code, ev->sig);
    bb_timer_cancel(&in->deadline);
    bb_probe_stop(in);
    if (bb_inst_hooks.detach)
        bb_inst_hooks.detach(in);
    if (bb_inst_hooks.gone)
        bb_inst_hooks.gone(in);
    if (in->pidw.fd >= 0) {
        bb_pidfd_close(&in->pidw);
        kill(-in->pid, SIGKILL); /* leftovers of the process group */
    }
    int64_t was_ready_ms = in->ready_mono ? now - in->ready_mono : 0;
    if (in->ready_mono && was_ready_ms >= s->restart.healthy_reset_ms)
        in->fail_streak = 0;

    enum bb_state next;
    int64_t delay = 0;
    /* a restart the operator, the primary or a released session asked for is planned:
     * only the restart policy's own restarts count in in->restarts (docs/design.md,
     * "Figures") */
    int planned = in->why == WHY_RESTART || in->why == WHY_LOST;
    if (in->why == WHY_OPERATOR || in->why == WHY_REPLACED || in->why == WHY_DRAINED ||
        in->why == WHY_DISCONNECTED) {
        next = ST_STOPPED;
    } else if (in->why == WHY_RESTART || in->why == WHY_LOST) {
        in->fail_streak = 0;
        next = ST_BACKOFF;
    } else if (s->restart.policy == BB_P_NEVER ||
               (s->restart.policy == BB_P_ON_FAILURE && in->code == 0 && in->sig <= 0)) {
        next = ST_EXITED;
    } else if (crash_loop(in, now)) {
        next = ST_FAILED;
    } else {
        uint32_t rnd = 0;
        if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
            rnd = (uint32_t)now;
        delay = sd_backoff_ms(s->restart.backoff_min_ms, s->restart.backoff_max_ms,
                              in->fail_streak, rnd);
        in->fail_streak++;
        next = ST_BACKOFF;
    }
    char text[SD_REASON_TEXT_MAX];
    if (next == ST_FAILED) {
        bb_inst_reason_text(in, text, sizeof text);
        snprintf(in->detail, sizeof(in->detail), "%d restarts in %d s; last: %s",
                 in->nrestart_mono, s->restart.window_s, text);
        in->reason = SD_STOP_CRASH_LOOP;
    }
    if (bb_inst_hooks.exited)
        bb_inst_hooks.exited(in, next == ST_BACKOFF);
    bb_inst_reason_text(in, text, sizeof text);
    log_info("instance stopped",
             "instance=%s pid=%d reason=%s reason_text=%s detail=%s next=%s restart_in_ms=%lld",
             in->id, (int)in->pid, bb_inst_reason(in), text, in->detail, bb_state_name(next),
             (long long)delay);
    report(in, SD_EV_STOPPED);
    if (bb_inst_hooks.reset)
        bb_inst_hooks.reset(in);
    if (next == ST_FAILED)
        log_error("instance failed: crash loop", "service=%s slot=%d detail=%s", s->name,
                  in->slot, in->detail);
    in->pid = 0;
    in->why = WHY_NONE;
    in->conn = NULL;
    set_state(in, next);
    if (next == ST_BACKOFF) {
        if (in->generation > 0 && !planned)
            in->restarts++;
        arm_deadline(in, delay);
    }
}

/* Takes over the entry the previous bigbrother persisted (state.c restored its fields and,
 * when ev->alive, watches in->pid): held states stay as they were, a running process is
 * supervised again from now, a dead one is an exit of unknown status. */
static void a_adopt(bb_inst_t *in, const bb_ev_t *ev)
{
    if (ev->was == ST_EXITED || ev->was == ST_FAILED || ev->was == ST_STOPPED) {
        set_state(in, ev->was);
        return;
    }
    if (!ev->alive) {
        in->why = WHY_NONE;
        a_exit(in, ev);
        return;
    }
    const bb_service_t *s = in->svc;
    int64_t now = sd_mono_ms();
    set_state(in, ev->was == ST_STARTING ? ST_STARTING : ST_READY);
    in->ready_mono = in->state == ST_READY ? now : 0;
    in->spawned_mono = now;
    log_info("instance re-adopted", "instance=%s pid=%d state=%s", in->id, (int)in->pid,
             bb_state_name(in->state));
    in->alive_mono = now;
    if (in->state == ST_STARTING && s->health.type != BB_H_NONE) {
        arm_deadline(in, s->health.start_timeout_ms);
    } else if (in->state == ST_READY && uses_heartbeats(in)) {
        /* the agent reconnects by itself on its next call: give it two periods */
        arm_deadline(in, 2 * (int64_t)s->health.liveness_timeout_ms);
    }
    bb_probe_start(in);
}

/* actions[state][event]: the whole state machine (see the table at the top). */
static const action_fn actions[ST__COUNT][EV__COUNT] = {
    /*               START    READY    ALIVE    DEADLINE    EXIT    STOP        RESTART    ADOPT */
    [ST_BACKOFF] =  {a_spawn, a_none,  a_none,  a_spawn,    a_none, a_stopped,  a_fresh,   a_none},
    [ST_STARTING] = {a_none,  a_ready, a_alive, a_hang,     a_exit, a_stop,     a_restart, a_none},
    [ST_READY] =    {a_none,  a_alive, a_alive, a_hang,     a_exit, a_stop,     a_restart, a_none},
    [ST_STOPPING] = {a_none,  a_none,  a_none,  a_escalate, a_exit, a_retarget, a_again,   a_none},
    [ST_EXITED] =   {a_fresh, a_none,  a_none,  a_none,     a_none, a_stopped,  a_fresh,   a_none},
    [ST_FAILED] =   {a_fresh, a_none,  a_none,  a_none,     a_none, a_stopped,  a_fresh,   a_none},
    [ST_STOPPED] =  {a_fresh, a_none,  a_none,  a_none,     a_none, a_none,     a_fresh,   a_adopt},
};

/* The one way into the state machine. */
static void dispatch(bb_inst_t *in, const bb_ev_t *ev)
{
    actions[in->state][ev->type](in, ev);
}

void bb_inst_event(bb_inst_t *in, enum bb_event type)
{
    dispatch(in, &(bb_ev_t){.type = type, .code = -1, .sig = -1});
}

void bb_inst_restart_lost(bb_inst_t *in)
{
    dispatch(in, &(bb_ev_t){.type = EV_RESTART, .why = WHY_LOST, .code = -1, .sig = -1});
}

void bb_inst_stop(bb_inst_t *in, enum bb_why why)
{
    dispatch(in, &(bb_ev_t){.type = EV_STOP, .why = why, .code = -1, .sig = -1});
}

void bb_inst_exited(bb_inst_t *in, int code, int sig)
{
    dispatch(in, &(bb_ev_t){.type = EV_EXIT, .code = code, .sig = sig});
}

void bb_inst_adopt(bb_inst_t *in, enum bb_state was, int alive)
{
    dispatch(in, &(bb_ev_t){.type = EV_ADOPT, .code = -1, .sig = -1, .was = was,
                            .alive = alive});
}

static void on_deadline(bb_timer_t *t)
{
    bb_inst_event(container_of(t, bb_inst_t, deadline), EV_DEADLINE);
}

void bb_inst_init_entry(bb_inst_t *in)
{
    *in = (bb_inst_t){.state = ST_STOPPED, .pidw.fd = -1, .probew.fd = -1,
                      .reason = BB_NO_REASON, .code = -1, .sig = -1,
                      .deadline.fn = on_deadline};
}

int bb_supervisor_init(void)
{
    int n = 0;
    for (int i = 0; i < bb.cfg.nservices; i++)
        n += bb.cfg.services[i].count;
    /* cluster slots get entries after the static ones, up to the capacity */
    bb.inst_cap = n + (bb.cfg.cluster_mode ? bb.cfg.capacity : 0);
    bb.inst = calloc(bb.inst_cap ? (size_t)bb.inst_cap : 1, sizeof(bb_inst_t));
    if (!bb.inst)
        return -ENOMEM;
    bb.ninst = n;
    n = 0;
    for (int i = 0; i < bb.cfg.nservices; i++)
        for (int k = 0; k < bb.cfg.services[i].count; k++) {
            bb_inst_t *in = &bb.inst[n++];
            bb_inst_init_entry(in);
            in->svc = &bb.cfg.services[i];
            in->slot = k;
            snprintf(in->id, sizeof(in->id), "%s-%s-slot%d", in->svc->name, bb.cfg.machine, k);
        }
    return 0;
}

void bb_supervisor_start_all(void)
{
    for (int i = 0; i < bb.ninst; i++)
        if (!bb.inst[i].loaded && (!bb.inst[i].cspec || bb.inst[i].assigned))
            bb_inst_event(&bb.inst[i], EV_START);
}

int bb_operator(const char *cmd, const char *target)
{
    enum bb_event ev;
    if (!strcmp(cmd, "start"))
        ev = EV_START;
    else if (!strcmp(cmd, "stop"))
        ev = EV_STOP;
    else if (!strcmp(cmd, "restart"))
        ev = EV_RESTART;
    else
        return -EINVAL;
    int n = 0;
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        if (strcmp(target, "all") && strcmp(target, in->svc->name) && strcmp(target, in->id))
            continue;
        log_info("operator command", "cmd=%s instance=%s state=%s", cmd, in->id,
                 bb_state_name(in->state));
        bb_inst_event(in, ev);
        n++;
    }
    return n;
}
