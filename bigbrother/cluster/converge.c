/* Converging on an assignment (cluster mode), on the supervision thread.
 *
 * The assignment document lists the slots (service, slot) this machine must run, each
 * with its spec and restart token. Applying it:
 *   - a listed slot with no running entry gets one (a free entry of the table, the same
 *     (service, slot) first so its log file continues) and is started;
 *   - a listed slot whose restart_token grew, or whose process spec changed, is restarted
 *     (the new spec takes effect at the respawn, see respawn below);
 *   - a running slot no longer listed gets SHUTDOWN, then the stop signal, then SIGKILL,
 *     and is reported stopped with reason `drained` (this machine is draining) or
 *     `replaced` (the slot moved, e.g. after this machine was declared lost);
 *   - cluster_stopped: every cluster slot is stopped that way, reason stopped_by_operator;
 *   - the open allocations of this machine's instances ("allocations") go to their games
 *     (alloc.c), after the slots, so a slot stopped by this document is not restarted
 *     for an allocation it loses.
 *
 * Specs are parsed with the config parser (bb_config_parse), one bb_cspec_t per service
 * and spec version, shared by the entries that use it and freed when none does. A spec
 * the parser refuses is reported as a `stopped` event with reason `exited` and detail
 * `bad spec: ...`, once per service and version; nothing is started for it.
 *
 * After a gap (see "After a gap" below) the assignment may be stale: the primary may have
 * moved a slot while this machine could not hear it. Then no cluster slot is spawned
 * (started or restarted) until ServerDir accepted the machine lease again and a read of
 * the assignment sent after that is applied; a slot that the newest document does not
 * hold is never spawned. The spec's
 * `disconnect` (docs/cluster.md, "A Big Brother cut off from ServerDir") says what a slot does when cut off
 * (stop_after_ms) and when it comes back moved (reconcile). */
#include "agent/bb_agent.h"
#include "cluster/bb_cluster.h"
#include "instance/bb_instance.h"
#include "sdlog.h"
#include "sdtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The freshness watch's period. The loop runs it every TICK_MS; a turn that comes more
 * than GAP_MS after the last one means the whole process was paused (SIGSTOP, a frozen
 * VM, a suspended laptop): nothing here blocks that long. */
#define TICK_MS 500
#define GAP_MS (2 * TICK_MS)

typedef struct bb_cspec {
    struct bb_cspec *next;
    char service[SD_NAME_MAX + 1];
    json_int_t version;
    json_t *proc;      /* bb_spec_process_part of the spec: what the process runs */
    bb_config_t cfg;   /* cfg.services[0] is the service; NULL cfg.root: a refused spec */
    int refs;
    int listed;        /* the document being applied names it (keeps a refused spec) */
} bb_cspec_t;

static bb_cspec_t *specs;

/* The assignment's freshness (supervision thread). */
static struct {
    bb_timer_t tick;
    int64_t last_turn;   /* when the watch last ran (tick or a spawn's check) */
    int64_t stale_since; /* a gap was seen then: spawns wait for a read sent after it; 0 */
    int64_t lease_from;  /* and for an accepted lease renewal sent at or after this */
    int lease_waited;    /* a read came before the lease was back (logged once) */
    int64_t awake_since; /* since when this process has run without a pause */
    int lease_gap;       /* the lease has not been renewed for lease_ttl_ms / 2 */
} fr;

static bb_cspec_t *spec_get(const char *service, json_int_t version, const json_t *spec)
{
    json_t *proc = bb_spec_process_part(spec);
    for (bb_cspec_t *c = specs; c; c = c->next)
        if (!strcmp(c->service, service) && json_equal(c->proc, proc)) {
            json_decref(proc);
            return c;
        }
    bb_cspec_t *c = calloc(1, sizeof(*c));
    if (!c) {
        json_decref(proc);
        return NULL;
    }
    sd_strlcpy(c->service, service, sizeof(c->service));
    c->version = version;
    c->proc = proc;
    /* the spec as a one-service config, so bigbrother's own parser validates it */
    json_t *svc = json_deep_copy(proc);
    json_object_set_new(svc, "name", json_string(service));
    json_object_set_new(svc, "count", json_integer(1));
    json_t *conf = json_pack("{s:s, s:s, s:s, s:[o]}", "machine", bb.cfg.machine, "cluster",
                             bb.cfg.cluster, "state_dir", bb.cfg.state_dir, "services", svc);
    char *text = conf ? json_dumps(conf, JSON_COMPACT) : NULL;
    char err[512] = "out of memory";
    json_decref(conf);
    if (!text || bb_config_parse(text, "spec", &c->cfg, err, sizeof(err))) {
        log_error("assigned spec refused", "service=%s spec_version=%lld error=%s", service,
                  (long long)version, err);
        char id[SD_NAME_MAX + 1];
        snprintf(id, sizeof(id), "%.60s-%.50s-spec%lld", service, bb.cfg.machine,
                 (long long)version);
        char detail[SD_DETAIL_MAX + 1];
        snprintf(detail, sizeof(detail), "bad spec: %s", err);
        json_t *ev = json_pack("{s:s, s:s, s:s, s:s, s:s}", "type",
                               sd_event_type_name(SD_EV_STOPPED), "instance", id, "service",
                               service, "reason", sd_stop_reason_name(SD_STOP_EXITED),
                               "detail", detail);
        if (ev && bb.report)
            bb_report_event(bb.report, ev);
        json_decref(ev);
    }
    free(text);
    c->next = specs;
    specs = c;
    return c;
}

static void spec_ref(bb_cspec_t *c, int d)
{
    if (c)
        c->refs += d;
}

/* Frees the specs no entry uses and the last document did not name (a refused spec
 * stays while it is assigned, so it is reported once). */
static void specs_gc(void)
{
    bb_cspec_t **pp = &specs;
    while (*pp) {
        bb_cspec_t *c = *pp;
        if (c->refs > 0 || c->listed) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        if (c->cfg.root)
            bb_config_free(&c->cfg);
        json_decref(c->proc);
        free(c);
    }
}

void bb_converge_free(void)
{
    for (bb_cspec_t *c = specs; c; c = c->next)
        c->refs = c->listed = 0;
    specs_gc();
}

static int running(const bb_inst_t *in)
{
    return in->state == ST_STARTING || in->state == ST_READY || in->state == ST_STOPPING ||
           in->state == ST_BACKOFF;
}

/* The state machine's respawn hook, before each spawn: a restart for a new spec switches
 * the instance to it (a no-op when no new spec waits). */
static void respawn(bb_inst_t *in)
{
    if (!in->next_cspec)
        return;
    spec_ref(in->cspec, -1);
    in->cspec = in->next_cspec;
    in->next_cspec = NULL;
    in->svc = &in->cspec->cfg.services[0];
}

/* ---------------------------------------------------------------- after a gap
 * A gap is a pause of this whole process (a turn of the loop more than GAP_MS after the
 * last), or the machine lease not renewed for lease_ttl_ms / 2 (a renewal missed: the
 * lease may lapse and the primary move the slots), or a slot stopped as disconnected, or
 * this process's start.
 * From then until ServerDir has accepted a renewal of the machine lease sent after the
 * gap and a read of the assignment sent after that renewal's answer is applied, every
 * spawn of a cluster slot is held (the slot waits in backoff with no deadline; "restart
 * held" is logged); those reads are asked for at once rather than by long-poll. The
 * newest document stops the slots it no longer holds; the held slots it still holds
 * start then. Static services never wait.
 *
 * Why the renewal: a read alone can come before the primary has acted on a lease that
 * ran out during the gap (it declares the machine lost at its next round) and then still
 * hold a slot that moves a moment later; a slot restarted on that read runs twice until
 * the next document (it.chaos saw it, with a serverdir copy failing the renewal while
 * another answered the read). Once a renewal is accepted the primary can no longer
 * declare this machine lost for the lapse (machine_lost.lua answers machine_live), so a
 * read after it shows every move there will be. */

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* How long ServerDir has not accepted this machine's lease, counting only time this
 * process ran (a pause is a gap of its own, not a disconnection). */
static int64_t unreached_ms(int64_t now)
{
    return now - max64(bb_report_lease_ok_ms(bb.report), fr.awake_since);
}

static int disconnected(const bb_inst_t *in, int64_t now)
{
    return in->stop_after_ms > 0 && unreached_ms(now) >= in->stop_after_ms;
}

/* A gap seen at now: spawns wait for a read sent after now and for an accepted lease
 * renewal sent at or after lease_from (0: any renewal, e.g. at the start, when none was
 * accepted before). */
static void mark_stale(int64_t now, const char *why, int64_t lease_from)
{
    if (!fr.stale_since)
        log_info("assignment may be stale: slots wait for a fresh read", "why=%s", why);
    fr.stale_since = now;
    fr.lease_from = max64(fr.lease_from, lease_from);
    if (lease_from)
        bb_report_renew_now(bb.report);
    bb_cluster_want_fresh(1);
}

/* ServerDir accepted a lease renewal sent at or after fr.lease_from, and its answer came
 * before read_mono (no reporter: nothing to wait for). */
static int lease_back_before(int64_t read_mono)
{
    int64_t sent, answered;
    if (!bb.report)
        return 1;
    bb_report_lease_last(bb.report, &sent, &answered);
    return answered > 0 && sent >= fr.lease_from && answered <= read_mono;
}

/* Notices a pause of the process or a lapsing lease since the last turn. */
static void watch_gaps(int64_t now)
{
    if (fr.last_turn && now - fr.last_turn > GAP_MS) {
        log_warn("supervision resumed after a pause", "paused_ms=%lld",
                 (long long)(now - fr.last_turn));
        fr.awake_since = now;
        mark_stale(now, "paused", now);
    }
    fr.last_turn = now;
    if (unreached_ms(now) <= bb.cfg.lease_ttl_ms / 2) {
        fr.lease_gap = 0;
    } else if (!fr.lease_gap) {
        fr.lease_gap = 1;
        mark_stale(now, "lease_not_renewed", now);
    }
}

/* The state machine's hold hook, before each spawn: why a cluster slot must wait. */
static const char *hold(bb_inst_t *in)
{
    if (!in->cspec)
        return NULL;
    int64_t now = sd_mono_ms();
    watch_gaps(now);
    if (fr.stale_since)
        return "assignment_stale";
    if (!in->assigned)
        return "not_assigned";
    if (disconnected(in, now))
        return "disconnected";
    return NULL;
}

/* Starts the held slots that the fresh assignment holds, and those stopped as
 * disconnected once this machine reaches ServerDir again. */
static void release_held(int64_t now)
{
    if (fr.stale_since)
        return;
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        int held = in->state == ST_BACKOFF && !in->deadline.idx;
        int cut = in->state == ST_STOPPED && in->reason == SD_STOP_DISCONNECTED;
        if (!in->cspec || !in->assigned || !(held || cut) || disconnected(in, now))
            continue;
        log_info("held slot started", "instance=%s service=%s slot=%d", in->id,
                 in->svc->name, in->slot);
        bb_inst_event(in, EV_START);
    }
}

/* Stops the running slots whose disconnect.stop_after_ms has passed without a lease. */
static void stop_disconnected(int64_t now)
{
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        if (!in->cspec || (in->state != ST_STARTING && in->state != ST_READY) ||
            !disconnected(in, now))
            continue;
        log_warn("slot stopped: cut off from serverdir", "instance=%s stop_after_ms=%d "
                 "unreached_ms=%lld", in->id, in->stop_after_ms, (long long)unreached_ms(now));
        mark_stale(now, "disconnected", now);
        bb_inst_stop(in, WHY_DISCONNECTED);
    }
}

/* keep_original: the primary gives a slot back only on a report of its original written
 * after this machine registered again (docs/cluster.md, "A machine cut off"), so a kept
 * original reports itself (a status event) at once and every third of a lease. */
static void report_kept(bb_inst_t *in, int64_t now)
{
    if (in->kept_reported && now - in->kept_reported < bb.cfg.lease_ttl_ms / 3)
        return;
    in->kept_reported = now;
    in->status_dirty = 1;
    bb_status_flush(in);
}

/* keep_original: a slot kept running after it moved is stopped as replaced when no
 * document gave it back within a placement interval and a lease. */
static void expire_kept(int64_t now)
{
    int64_t bound = (int64_t)bb.cfg.placement_interval_ms + bb.cfg.lease_ttl_ms;
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        if (in->kept_since && now - in->kept_since < bound)
            report_kept(in, now);
        if (!in->kept_since || now - in->kept_since < bound)
            continue;
        log_warn("kept slot not given back: stopping it", "instance=%s kept_ms=%lld",
                 in->id, (long long)(now - in->kept_since));
        in->kept_since = 0;
        bb_inst_stop(in, WHY_REPLACED);
    }
}

static void on_tick(bb_timer_t *t)
{
    int64_t now = sd_mono_ms();
    watch_gaps(now);
    stop_disconnected(now);
    expire_kept(now);
    release_held(now);
    bb_timer_set(t, now + TICK_MS);
}

/* Hooks converge into the state machine; the first call also starts the watch, stale
 * (a bigbrother that just started has not read its assignment yet). */
static void hooks_set(void)
{
    if (bb_inst_hooks.hold)
        return;
    bb_inst_hooks.respawn = respawn;
    bb_inst_hooks.hold = hold;
    fr.awake_since = fr.stale_since = fr.last_turn = sd_mono_ms();
}

void bb_converge_start(void)
{
    hooks_set();
    bb_cluster_want_fresh(1);
    fr.tick.fn = on_tick;
    bb_timer_set(&fr.tick, sd_mono_ms() + TICK_MS);
}

void bb_converge_read(int64_t read_mono)
{
    int64_t now = sd_mono_ms();
    if (fr.stale_since && read_mono >= fr.stale_since && !lease_back_before(read_mono)) {
        if (!fr.lease_waited++)
            log_info("assignment read before the machine lease was accepted again: slots "
                     "wait", "stale_ms=%lld", (long long)(now - fr.stale_since));
    } else if (fr.stale_since && read_mono >= fr.stale_since) {
        log_info("assignment fresh again", "stale_ms=%lld",
                 (long long)(now - fr.stale_since));
        fr.stale_since = fr.lease_from = 0;
        fr.lease_waited = 0;
        bb_cluster_want_fresh(0);
    }
    release_held(now);
}

/* The spec's disconnect settings, onto the slot's entry (defaults: never stop, keep the
 * replacement). */
static void disconnect_read(bb_inst_t *in, const json_t *e)
{
    bb_disconnect_t d;
    bb_disconnect_of(json_object_get(e, "spec"), &d);
    in->stop_after_ms = d.stop_after_ms;
    in->keep_original = d.keep_original;
}

/* The entry for a newly assigned slot: its old entry, any stopped cluster entry, or a
 * new one at the end of the table. NULL when the table is full. */
static bb_inst_t *entry_for(const char *service, int slot)
{
    bb_inst_t *free_in = NULL;
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        if (!in->cspec || in->assigned || running(in))
            continue;
        if (in->slot == slot && !strcmp(in->svc->name, service))
            return in;
        if (!free_in)
            free_in = in;
    }
    if (free_in)
        return free_in;
    if (bb.ninst >= bb.inst_cap)
        return NULL;
    return &bb.inst[bb.ninst++];
}

static void slot_start(const json_t *e, const char *service, int slot, bb_cspec_t *c)
{
    bb_inst_t *in = entry_for(service, slot);
    if (!in) {
        log_error("slot table full: assigned slot not started", "service=%s slot=%d capacity=%d",
                  service, slot, bb.cfg.capacity);
        return;
    }
    int same = in->cspec && in->slot == slot && !strcmp(in->svc->name, service);
    if (!in->cspec)
        bb_inst_init_entry(in); /* a new entry at the end of the table */
    if (!same) {
        in->generation = 0;
        in->restarts = 0;
        in->reason = BB_NO_REASON;
        in->detail[0] = 0;
    }
    spec_ref(in->cspec, -1);
    spec_ref(in->next_cspec, -1);
    in->next_cspec = NULL;
    in->cspec = c;
    spec_ref(c, 1);
    in->svc = &c->cfg.services[0];
    in->slot = slot;
    in->assigned = 1;
    in->kept_since = 0;
    disconnect_read(in, e);
    in->restart_token = json_integer_value(json_object_get(e, "restart_token"));
    bb_inst_event(in, EV_START);
}

static void slot_update(bb_inst_t *in, const json_t *e, bb_cspec_t *c)
{
    if (in->kept_since)
        log_info("kept slot given back", "instance=%s kept_ms=%lld", in->id,
                 (long long)(sd_mono_ms() - in->kept_since));
    in->kept_since = 0;
    disconnect_read(in, e);
    json_int_t token = json_integer_value(json_object_get(e, "restart_token"));
    int new_spec = c != in->cspec && c != in->next_cspec;
    if (token <= in->restart_token && !new_spec)
        return;
    in->restart_token = token > in->restart_token ? token : in->restart_token;
    if (new_spec) {
        spec_ref(in->next_cspec, -1);
        in->next_cspec = c;
        spec_ref(c, 1);
    }
    if (in->state == ST_STARTING || in->state == ST_READY || in->state == ST_STOPPING)
        log_info("slot restarting for its assignment", "instance=%s restart_token=%lld new_spec=%d",
                 in->id, (long long)token, new_spec);
    bb_inst_event(in, EV_RESTART);
}

const json_t *bb_converge_spec(const bb_inst_t *in)
{
    return in->cspec ? in->cspec->proc : NULL;
}

bb_inst_t *bb_converge_restore(const char *service, int slot, const json_t *spec,
                               int64_t restart_token, int assigned)
{
    if (!bb.cfg.cluster_mode || bb.ninst >= bb.inst_cap)
        return NULL;
    hooks_set();
    bb_cspec_t *c = spec_get(service, 0, spec);
    if (!c || !c->cfg.root) {
        specs_gc();
        return NULL;
    }
    bb_inst_t *in = &bb.inst[bb.ninst++];
    bb_inst_init_entry(in);
    in->cspec = c;
    spec_ref(c, 1);
    in->svc = &c->cfg.services[0];
    in->slot = slot;
    in->assigned = assigned != 0; /* until the first assignment says otherwise */
    in->restart_token = restart_token;
    return in;
}

/* keep_original: a running slot that moved off this machine while it was cut off (the
 * document is the first one read after a gap) keeps running (the primary may give it
 * back and stop the replacement) until expire_kept's bound. Not for a planned stop
 * (cluster stopped, draining), a slot removed while this machine was in touch (a scale
 * down, a rebalance) or a stop already under way. */
static int keep(bb_inst_t *in, int planned, int64_t now)
{
    if (!in->keep_original || planned)
        return 0;
    if (!in->kept_since && (!fr.stale_since || (in->state != ST_STARTING &&
                                                in->state != ST_READY)))
        return 0;
    if (!in->kept_since) {
        in->kept_since = now;
        in->kept_reported = 0;
        log_info("slot moved: original kept running", "instance=%s keep_ms=%d", in->id,
                 bb.cfg.placement_interval_ms + bb.cfg.lease_ttl_ms);
        report_kept(in, now);
    }
    return 1;
}

void bb_converge_apply(const json_t *doc, int draining)
{
    hooks_set();
    const json_t *slots = json_object_get(doc, "slots");
    int stopped_all = json_is_true(json_object_get(doc, "cluster_stopped"));
    int started = 0, stopped = 0, kept = 0;
    int64_t now = sd_mono_ms();
    /* a pause ending in this turn is seen before the document, whose handler may run
     * before the tick's: keep_original keeps what moved while this machine was away */
    watch_gaps(now);
    for (int i = 0; i < bb.ninst; i++)
        if (bb.inst[i].cspec) /* 1 -> -1: not yet seen; a kept original counts as assigned */
            bb.inst[i].assigned = bb.inst[i].kept_since ? -1 : -bb.inst[i].assigned;
    for (bb_cspec_t *c = specs; c; c = c->next)
        c->listed = 0;
    size_t k;
    json_t *e;
    json_array_foreach(stopped_all ? NULL : slots, k, e) {
        const char *service = json_string_value(json_object_get(e, "service"));
        json_int_t slot = json_integer_value(json_object_get(e, "slot"));
        if (!service || !sd_name_valid(service, SD_NAME_MAX) || slot < 0 || slot > 1000000)
            continue;
        bb_cspec_t *c = spec_get(service, json_integer_value(json_object_get(e, "spec_version")),
                                 json_object_get(e, "spec"));
        if (!c)
            continue;
        c->listed = 1;
        if (!c->cfg.root)
            continue;
        bb_inst_t *in = NULL;
        for (int i = 0; i < bb.ninst && !in; i++)
            if (bb.inst[i].cspec && bb.inst[i].assigned < 0 && bb.inst[i].slot == slot &&
                !strcmp(bb.inst[i].svc->name, service))
                in = &bb.inst[i];
        if (in) {
            in->assigned = 1;
            slot_update(in, e, c);
        } else {
            slot_start(e, service, (int)slot, c);
            started++;
        }
    }
    for (int i = 0; i < bb.ninst; i++) {
        bb_inst_t *in = &bb.inst[i];
        if (!in->cspec || in->assigned >= 0)
            continue;
        in->assigned = 0;
        if (keep(in, stopped_all || draining, now)) {
            kept++;
            continue;
        }
        in->kept_since = 0;
        if (running(in))
            stopped++;
        bb_inst_stop(in, stopped_all ? WHY_OPERATOR : draining ? WHY_DRAINED : WHY_REPLACED);
    }
    specs_gc();
    bb_alloc_apply(json_object_get(doc, "allocations"));
    log_info("assignment applied",
             "version=%lld epoch=%lld slots=%d started=%d stopping=%d kept=%d "
             "cluster_stopped=%d draining=%d",
             (long long)json_integer_value(json_object_get(doc, "version")),
             (long long)json_integer_value(json_object_get(doc, "epoch")),
             stopped_all ? 0 : (int)json_array_size(slots), started, stopped, kept,
             stopped_all, draining);
}
