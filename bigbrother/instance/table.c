/* The instance table: the daemon's one global (bb: the config, the table of instances,
 * the reporter), the hooks through which the state machine's actions reach the other
 * subsystems, lookups into the table, and the process events' constructor and emitter
 * (the state machine and alloc.c complete the events they send). */
#include "instance/bb_instance.h"
#include "sdlog.h"

#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

bb_daemon_t bb;
bb_inst_hooks_t bb_inst_hooks;

static const char *const state_names[ST__COUNT] = {
    "backoff", "starting", "ready", "stopping", "exited", "failed", "stopped"};

const char *bb_state_name(enum bb_state s)
{
    return (unsigned)s < ST__COUNT ? state_names[s] : "?";
}

void bb_event_emit(const bb_inst_t *in, json_t *ev)
{
    if (bb.report && bb_report_event(bb.report, ev))
        log_error("event not recorded", "instance=%s type=%s", in->id,
                  json_string_value(json_object_get(ev, "type")));
    json_decref(ev);
}

json_t *bb_event_new(const bb_inst_t *in, sd_event_type_t type)
{
    return json_pack("{s:s, s:s, s:s, s:I, s:i, s:i, s:i}", "type", sd_event_type_name(type),
                     "instance", in->id, "service", in->svc->name, "ts_ms",
                     (json_int_t)sd_wall_ms(), "slot", in->slot, "generation", in->generation,
                     "restarts", in->restarts);
}

const char *bb_inst_reason(const bb_inst_t *in)
{
    const char *name = sd_stop_reason_name(in->reason);
    return name ? name : "";
}

size_t bb_inst_reason_text(const bb_inst_t *in, char *buf, size_t cap)
{
    return sd_reason_format(buf, cap, bb_inst_reason(in), in->code >= 0 ? in->code : SD_REASON_NONE,
                            in->sig > 0 ? in->sig : SD_REASON_NONE, in->why_silent_ms);
}

/* The reporter read the directory's live records of this machine after a new
 * registration: every process running here since before the read (its started event
 * was in the directory) that is not among them was marked stopped meanwhile. */
static void on_live(bb_watch_t *w, uint32_t events)
{
    (void)w;
    (void)events;
    int64_t since;
    json_t *live = bb_report_take_live(bb.report, &since);
    if (!live)
        return;
    int restarted = 0;
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        if ((in->state != ST_STARTING && in->state != ST_READY) || in->pid <= 0 ||
            in->reported_mono >= since || json_object_get(live, in->id))
            continue;
        log_warn("process has no live record: restarted as a new run",
                 "instance=%s service=%s slot=%d generation=%d detail=\"the directory marked "
                 "it stopped while this machine's lease had run out\"", in->id, in->svc->name,
                 in->slot, in->generation);
        bb_inst_restart_lost(in);
        restarted++;
    }
    log_info("directory checked after registration", "live_records=%zu restarted=%d",
             json_object_size(live), restarted);
    json_decref(live);
}

int bb_relive_init(void)
{
    static bb_watch_t lw;
    if (!bb.report || bb_report_fd(bb.report) < 0)
        return 0;
    lw.fd = bb_report_fd(bb.report);
    lw.fn = on_live;
    return bb_watch_add(&lw, EPOLLIN);
}

bb_inst_t *bb_inst_by_id(const char *id)
{
    for (int i = 0; i < bb.ninst; i++)
        if (bb.inst[i].pid > 0 && !strcmp(bb.inst[i].id, id))
            return &bb.inst[i];
    return NULL;
}

bb_inst_t *bb_inst_by_pid(pid_t pid)
{
    pid_t pgid = getpgid(pid);
    for (int i = 0; i < bb.ninst; i++)
        if (bb.inst[i].pid > 0 && (bb.inst[i].pid == pid || bb.inst[i].pid == pgid))
            return &bb.inst[i];
    return NULL;
}

