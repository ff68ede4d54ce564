/* The health view: what the supervisor knows of each instance's liveness, as Consul shows
 * a check (the age of the last heartbeat or successful probe, the deadline it is held to,
 * consecutive and total probe failures and why the last one failed, the agent's
 * connection, players), served on the logs port to the dashboard and sdctl:
 *
 *   GET /v1/health               every instance of this machine
 *   GET /v1/health/{instance}    one (the current run of a slot)
 *
 * The loop thread rebuilds a snapshot every second (and at start); the logs port's
 * threads copy from it under a mutex and never touch the instance table. An answer is
 * at most HEALTH_EVERY_MS old: as_of_ms says when it was taken. */
#include "instance/bb_instance.h"
#include "sdlog.h"

#include <pthread.h>
#include <string.h>

#define HEALTH_EVERY_MS 1000

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static json_t *snapshot; /* {"machine", "as_of_ms", "instances": [...]}, guarded by mu */
static bb_timer_t timer;

static const char *health_type(enum bb_health t)
{
    switch (t) {
    case BB_H_AGENT: return "agent";
    case BB_H_NOTIFY: return "notify";
    case BB_H_TCP: return "tcp";
    case BB_H_UDP: return "udp";
    case BB_H_HTTP: return "http";
    case BB_H_EXEC: return "exec";
    case BB_H_NONE: break;
    }
    return "none";
}

/* One instance's view. Ages are null where they do not apply (nothing runs; a check of
 * type none). */
static json_t *inst_json(const bb_inst_t *in, int64_t now_mono)
{
    const bb_service_t *s = in->svc;
    int running = in->pid > 0;
    int beats = s->health.type == BB_H_AGENT || s->health.type == BB_H_NOTIFY;
    int probes = !beats && s->health.type != BB_H_NONE;
    json_t *age = running && s->health.type != BB_H_NONE && in->alive_mono
                      ? json_integer(now_mono - in->alive_mono)
                      : json_null();
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:i, s:s, s:o, s:I}", "instance",
                          in->id, "service", s->name, "slot", in->slot, "state",
                          bb_state_name(in->state), "pid", running ? (int)in->pid : 0,
                          "generation", in->generation, "restarts", in->restarts, "check",
                          health_type(s->health.type), "heartbeat_age_ms", age, "uptime_ms",
                          (json_int_t)(running && in->spawned_mono ? now_mono - in->spawned_mono
                                                                   : 0));
    if (!o)
        return NULL;
    if (beats)
        json_object_set_new(o, "liveness_timeout_ms",
                            json_integer(s->health.liveness_timeout_ms));
    if (probes) {
        json_object_set_new(o, "period_ms", json_integer(s->health.period_ms));
        json_object_set_new(o, "failure_threshold", json_integer(s->health.failure_threshold));
        json_object_set_new(o, "probe_failures", json_integer(in->probe_failures));
        json_object_set_new(o, "probe_failures_total", json_integer(in->probe_failures_total));
        json_object_set_new(o, "last_probe_error",
                            in->probe_error[0] ? json_string(in->probe_error) : json_null());
    }
    if (s->health.type == BB_H_AGENT)
        json_object_set_new(o, "agent_connected", json_boolean(in->conn != NULL));
    if (in->max_players > 0 || in->players > 0) {
        json_object_set_new(o, "players", json_integer(in->players));
        json_object_set_new(o, "max_players", json_integer(in->max_players));
    }
    if (in->status[0])
        json_object_set_new(o, "status", json_string(in->status));
    return o;
}

static void rebuild(void)
{
    int64_t now = sd_mono_ms();
    json_t *arr = json_array();
    for (int i = 0; arr && i < bb.ninst; i++) {
        json_t *o = inst_json(&bb.inst[i], now);
        if (o)
            json_array_append_new(arr, o);
    }
    json_t *snap = arr ? json_pack("{s:s, s:I, s:o}", "machine", bb.cfg.machine, "as_of_ms",
                                   (json_int_t)sd_wall_ms(), "instances", arr)
                       : NULL;
    if (!snap)
        return; /* out of memory: the previous snapshot stays */
    pthread_mutex_lock(&mu);
    json_t *old = snapshot;
    snapshot = snap;
    pthread_mutex_unlock(&mu);
    json_decref(old);
}

static void on_timer(bb_timer_t *t)
{
    rebuild();
    bb_timer_set(t, sd_mono_ms() + HEALTH_EVERY_MS);
}

void bb_health_start(void)
{
    rebuild();
    timer.fn = on_timer;
    bb_timer_set(&timer, sd_mono_ms() + HEALTH_EVERY_MS);
}

void bb_health_stop(void)
{
    bb_timer_cancel(&timer);
    pthread_mutex_lock(&mu);
    json_t *old = snapshot;
    snapshot = NULL;
    pthread_mutex_unlock(&mu);
    json_decref(old);
}

char *bb_health_dump(const char *id)
{
    char *out = NULL;
    pthread_mutex_lock(&mu);
    if (snapshot && !id) {
        out = json_dumps(snapshot, JSON_COMPACT);
    } else if (snapshot) {
        json_t *arr = json_object_get(snapshot, "instances"), *o;
        size_t i;
        json_array_foreach(arr, i, o)
        {
            if (strcmp(json_string_value(json_object_get(o, "instance")), id) != 0)
                continue;
            json_t *one = json_deep_copy(o);
            /* new values, no reference shared with the snapshot (freed by the loop) */
            json_object_set_new(one, "machine", json_string(bb.cfg.machine));
            json_object_set_new(
                one, "as_of_ms",
                json_integer(json_integer_value(json_object_get(snapshot, "as_of_ms"))));
            out = json_dumps(one, JSON_COMPACT);
            json_decref(one);
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return out;
}
