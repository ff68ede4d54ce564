/* Cluster mode: the network side, on two threads of its own (the supervision thread
 * never waits on ServerDir).
 *
 * The assignments thread long-polls GET .../machines/{me}/assignments?version=V&wait=W.
 * A document with a new version is handed to the supervision thread: it replaces the
 * pending one under a mutex and the thread writes to an eventfd that the supervision
 * loop watches; the loop then applies it (converge.c). Only the latest document counts.
 *
 * The primary thread competes for the primary lease (POST .../primary every ttl/3).
 * While it holds it, every placement_interval_ms (sooner after an allocation: between
 * rounds it long-polls GET .../pool-demand) it reads GET .../state and the live
 * directory, declares lost the machines whose lease expired that still have slots or
 * live processes (POST .../machines/{m}/lost, with its epoch; each service's
 * spec.disconnect says whether its slots and processes there wait, and for how long;
 * docs/cluster.md, "A machine cut off"), computes the placement
 * (placement.c; first the count of every service with a pool, bb_pool_count) and PUTs the
 * lists that changed with its epoch. Any 409 stale_epoch or primary_held, or a lease that
 * ran out without a renewal, makes it step down at once.
 * One log line per role change, per placement change and per pool size change. */
#include "cluster/bb_cluster.h"
#include "instance/bb_instance.h"
#include "sdclient.h"
#include "sdlog.h"
#include "sdtime.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define RETRY_MS 1000
#define FRESH_RETRY_MS 200
/* rounds woken by allocations: a quarter of the placement interval apart, within these */
#define ROUND_GAP_MIN_MS 50
#define ROUND_GAP_MAX_MS 250
/* how long after a lost machine came back (its new registration) its keep_original
 * originals may get their slots back: this many machine leases */
#define RETURN_WINDOW_LEASES 2

static struct {
    pthread_t poll_thr, prim_thr;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int stopping;
    json_t *pending;       /* the newest document not yet applied */
    int pending_draining;
    int64_t read_mono;     /* when the newest successful read was sent (monotonic ms) */
    int want_fresh;        /* the supervision thread waits for a read sent after a gap */
    bb_watch_t evw;        /* eventfd: a document is pending */
    sdc_t *poll_client, *prim_client;
    int prim_wait_max;     /* the longest pool-demand long-poll within prim_client's timeout */
} cl = {.mu = PTHREAD_MUTEX_INITIALIZER, .evw = {-1, NULL}};

/* Waits up to ms or until bb_cluster_stop; returns 1 when stopping. */
static int pause_ms(int ms)
{
    struct timespec ts = sd_timespec_after_ms(CLOCK_MONOTONIC, ms);
    pthread_mutex_lock(&cl.mu);
    while (!cl.stopping && pthread_cond_timedwait(&cl.cond, &cl.mu, &ts) != ETIMEDOUT)
        ;
    int s = cl.stopping;
    pthread_mutex_unlock(&cl.mu);
    return s;
}

static int stopping(void)
{
    pthread_mutex_lock(&cl.mu);
    int s = cl.stopping;
    pthread_mutex_unlock(&cl.mu);
    return s;
}

/* ---------------------------------------------------------------- assignments */

static int machine_draining(sdc_t *c)
{
    json_t *m = NULL;
    sdc_err_t err = {0};
    int draining = 0;
    if (sdc_machine_get(c, bb.cfg.cluster, bb.cfg.machine, &m, &err) == SDC_OK)
        draining = json_is_true(json_object_get(m, "draining"));
    json_decref(m);
    sdc_err_clear(&err);
    return draining;
}

static void wake_supervision(void)
{
    uint64_t one = 1;
    if (write(cl.evw.fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        log_error("cannot wake the supervision loop", "error=%s", strerror(errno));
}

/* Reads the assignment: a long-poll, except the first read, the read after an answer
 * that came long after its wait (a pause), and while the supervision thread waits for a
 * fresh one (bb_cluster_want_fresh): those answer at once. Each successful read stamps
 * cl.read_mono with when it was sent. */
static void *poll_main(void *arg)
{
    (void)arg;
    json_int_t version = -1;
    int failing = 0, late = 0;
    while (!stopping()) {
        json_t *doc = NULL;
        sdc_err_t err = {0};
        pthread_mutex_lock(&cl.mu);
        int quick = version < 0 || cl.want_fresh || late;
        pthread_mutex_unlock(&cl.mu);
        int wait = quick ? 0 : bb.cfg.assignment_wait_ms;
        int64_t t0 = sd_mono_ms();
        int rc = sdc_assignments_get(cl.poll_client, bb.cfg.cluster, bb.cfg.machine, version,
                                     wait, &doc, &err);
        /* an answer long after its wait: this process was paused, and the supervision
         * thread will want a fresh read (it may not have noticed yet) */
        late = sd_mono_ms() - t0 > wait + RETRY_MS;
        if (rc != SDC_OK || !json_is_object(doc)) {
            char why[320];
            if (!failing++)
                log_warn("assignments not readable: keeping what runs", "error=%s",
                         rc != SDC_OK ? sdc_strerror(rc, &err, why, sizeof(why))
                                      : "not a JSON object");
            sdc_err_clear(&err);
            json_decref(doc);
            pause_ms(RETRY_MS);
            continue;
        }
        if (failing)
            log_info("assignments readable again", "failed_attempts=%d", failing);
        failing = 0;
        json_int_t v = json_integer_value(json_object_get(doc, "version"));
        if (v == version) {
            json_decref(doc);
            pthread_mutex_lock(&cl.mu);
            cl.read_mono = t0;
            int fresh = cl.want_fresh, wake = fresh || quick;
            pthread_mutex_unlock(&cl.mu);
            if (wake)
                wake_supervision();
            /* the wait was not honoured: do not spin; while the supervision thread waits
             * for a fresh read (which also needs the lease renewed first), read again
             * sooner */
            if (sd_mono_ms() - t0 < 100)
                pause_ms(fresh ? FRESH_RETRY_MS : RETRY_MS);
            continue;
        }
        version = v;
        int draining = machine_draining(cl.poll_client);
        pthread_mutex_lock(&cl.mu);
        json_decref(cl.pending);
        cl.pending = doc;
        cl.pending_draining = draining;
        cl.read_mono = t0;
        pthread_mutex_unlock(&cl.mu);
        wake_supervision();
    }
    return NULL;
}

void bb_cluster_want_fresh(int on)
{
    pthread_mutex_lock(&cl.mu);
    cl.want_fresh = on;
    pthread_mutex_unlock(&cl.mu);
}

/* Supervision thread: apply the newest pending document, then tell converge how recent
 * the newest read is. */
static void on_assignment(bb_watch_t *w, uint32_t events)
{
    (void)events;
    uint64_t n;
    if (read(w->fd, &n, sizeof(n)) < 0)
        return;
    pthread_mutex_lock(&cl.mu);
    json_t *doc = cl.pending;
    int draining = cl.pending_draining;
    int64_t read_mono = cl.read_mono;
    cl.pending = NULL;
    pthread_mutex_unlock(&cl.mu);
    if (doc)
        bb_converge_apply(doc, draining);
    json_decref(doc);
    bb_converge_read(read_mono);
}

/* ---------------------------------------------------------------- primary */

typedef struct {
    int is_primary;
    json_int_t epoch;
    int64_t lease_until;   /* monotonic ms: the lease surely holds until then */
    int64_t ok_since;      /* monotonic ms since ServerDir answered every call; 0 after a failure */
    json_t *inflight;      /* rolling restarts under way (bb_cluster.h) */
    json_t *pools;         /* service -> {count, since, peak, bad}: how this primary sized
                              each pool (bb_pool_count's window), forgotten on step-down */
    int64_t demand;        /* the pool-demand counter last seen, -1 none yet */
    int no_demand;         /* ServerDir has no pool-demand route (older): passes on time only */
    int64_t round_mono;    /* when the last placement round started */
    json_t *lost;          /* machine -> Redis ms this primary declared it lost; kept
                              while it is lost and for RETURN_WINDOW after it came back
                              (reconcile keep_original), forgotten on step-down */
} prim_t;

/* Whether a call reached ServerDir and Redis (any answer but a transport error or a 5xx):
 * a failure means the other machines may not have reached them either, so their leases
 * may have run out through no fault of theirs. */
static void reached(prim_t *p, int rc, const sdc_err_t *err)
{
    int ok = rc == SDC_OK || (rc == SDC_E_HTTP && err->status < 500);
    if (!ok)
        p->ok_since = 0;
    else if (!p->ok_since)
        p->ok_since = sd_mono_ms();
}

static void step_down(prim_t *p, const char *reason)
{
    if (!p->is_primary)
        return;
    log_warn("primary role lost", "machine=%s epoch=%lld reason=%s", bb.cfg.machine,
             (long long)p->epoch, reason);
    p->is_primary = 0;
    json_object_clear(p->inflight);
    json_object_clear(p->pools);
    json_object_clear(p->lost);
}

/* A 409 that says another primary exists: step down and answer 1. */
static int fenced(prim_t *p, int rc, const sdc_err_t *err)
{
    if (rc == SDC_E_HTTP && err->status == 409 &&
        (!strcmp(err->code, "stale_epoch") || !strcmp(err->code, "primary_held"))) {
        step_down(p, err->code);
        return 1;
    }
    return 0;
}

static void renew(prim_t *p)
{
    sdc_primary_t out;
    memset(&out, 0, sizeof(out));
    sdc_err_t err = {0};
    int64_t t0 = sd_mono_ms();
    int rc = sdc_primary_acquire(cl.prim_client, bb.cfg.cluster, bb.cfg.machine,
                                 bb.cfg.primary_ttl_ms, &out, &err);
    reached(p, rc, &err);
    if (rc == SDC_OK && !strcmp(out.holder, bb.cfg.machine)) {
        if (!p->is_primary || out.epoch != p->epoch)
            log_info("primary role acquired", "machine=%s epoch=%lld ttl_ms=%d",
                     bb.cfg.machine, (long long)out.epoch, bb.cfg.primary_ttl_ms);
        p->is_primary = 1;
        p->epoch = out.epoch;
        p->lease_until = t0 + out.expires_in_ms;
    } else if (rc == SDC_OK) {
        step_down(p, "held_by_other");
    } else if (!fenced(p, rc, &err) && p->is_primary && sd_mono_ms() >= p->lease_until) {
        step_down(p, "lease_expired");
    }
    sdc_err_clear(&err);
}

/* The machine entry of state named m, or NULL. */
static json_t *state_machine(const json_t *state, const char *m)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(state, "machines"), i, e) {
        const char *name = json_string_value(json_object_get(e, "machine"));
        if (name && !strcmp(name, m))
            return e;
    }
    return NULL;
}

/* Whether a ready report on machine m may be believed: not when m came back from a loss
 * this primary declared and the report is older than its return (its processes were
 * not known to run then). */
static int report_fresh(const prim_t *p, const json_t *state, const char *m, const json_t *proc)
{
    if (!json_object_get(p->lost, m))
        return 1;
    json_int_t back = json_integer_value(
        json_object_get(state_machine(state, m), "registered_at_ms"));
    return json_integer_value(json_object_get(proc, "updated_at_ms")) >= back;
}

/* "machine|service|slot" -> instance of every ready process; live[machine] and
 * live["machine|service"] = counts. */
static void read_directory(const prim_t *p, const json_t *state, const json_t *procs,
                           json_t *ready, json_t *live)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(procs, "processes"), i, e) {
        const char *m = json_string_value(json_object_get(e, "machine"));
        const char *s = json_string_value(json_object_get(e, "service"));
        const char *st = json_string_value(json_object_get(e, "state"));
        const char *id = json_string_value(json_object_get(e, "instance"));
        json_t *slot = json_object_get(e, "slot");
        if (!m || !s || !st || !id)
            continue;
        char key[420];
        snprintf(key, sizeof(key), "%s|%s", m, s);
        json_object_set_new(live, m,
                            json_integer(json_integer_value(json_object_get(live, m)) + 1));
        json_object_set_new(live, key,
                            json_integer(json_integer_value(json_object_get(live, key)) + 1));
        if (strcmp(st, "ready") || !json_is_integer(slot) || !report_fresh(p, state, m, e))
            continue;
        snprintf(key, sizeof(key), "%s|%s|%lld", m, s, (long long)json_integer_value(slot));
        json_object_set_new(ready, key, json_string(id));
    }
}

/* Keeps p->lost in step with the machines' leases and marks them in state for bb_place:
 * a lost machine gets "lost_for_ms" (since this primary declared it; 0 before), a
 * machine back from a declared loss "returned" during RETURN_WINDOW_LEASES leases of its
 * new registration. */
static void mark_lost(prim_t *p, json_t *state, int64_t now)
{
    size_t i;
    json_t *m;
    const char *k;
    void *tmp;
    json_object_foreach_safe(p->lost, tmp, k, m)
        if (!state_machine(state, k)) /* its record is gone */
            json_object_del(p->lost, k);
    json_array_foreach(json_object_get(state, "machines"), i, m) {
        const char *name = json_string_value(json_object_get(m, "machine"));
        const char *st = json_string_value(json_object_get(m, "state"));
        json_t *at = name ? json_object_get(p->lost, name) : NULL;
        if (!at || !st)
            continue;
        json_int_t reg = json_integer_value(json_object_get(m, "registered_at_ms"));
        if (strcmp(st, "live")) {
            if (reg > json_integer_value(at)) /* came back and is lost again: a new loss */
                json_object_del(p->lost, name);
            else
                json_object_set_new(m, "lost_for_ms", json_integer(now - json_integer_value(at)));
        } else if (now - reg < (int64_t)RETURN_WINDOW_LEASES * bb.cfg.lease_ttl_ms) {
            json_object_set_new(m, "returned", json_true());
        } else {
            json_object_del(p->lost, name);
        }
    }
}

/* What declaring machine m lost (lost_for ms ago) does to each service on it (with
 * slots in its document or live processes there), by the service's spec.disconnect: a
 * held service keeps its slots and processes; a keep_original one loses its slots but
 * its processes stay as they are (the original may win on return); the others lose both.
 * Appends the services whose processes stay to keep; *moved: slots that leave m,
 * *marked: processes to be marked stopped. */
static void lost_plan(const json_t *state, const char *m, int64_t lost_for, const json_t *live,
                      json_t *keep, size_t *moved, long long *marked)
{
    const json_t *slots = json_object_get(
        json_object_get(json_object_get(state, "assignments"), m), "slots");
    json_t *per = json_object(); /* service -> its slots on m */
    long long kept_live = 0;
    size_t held = 0, i;
    json_t *svc, *e;
    json_array_foreach(slots, i, e) {
        const char *sn = json_string_value(json_object_get(e, "service"));
        if (sn)
            json_object_set_new(per, sn,
                                json_integer(json_integer_value(json_object_get(per, sn)) + 1));
    }
    json_array_foreach(json_object_get(state, "services"), i, svc) {
        const char *name = json_string_value(json_object_get(svc, "service"));
        const json_t *spec = json_object_get(svc, "spec");
        if (!name)
            continue;
        char key[420];
        snprintf(key, sizeof(key), "%s|%s", m, name);
        long long nlive = json_integer_value(json_object_get(live, key));
        size_t nslots = (size_t)json_integer_value(json_object_get(per, name));
        if (!nslots && !nlive)
            continue;
        bb_disconnect_t d;
        bb_disconnect_of(spec, &d);
        int hold = bb_disconnect_holds(spec, lost_for);
        if (hold)
            held += nslots;
        if (hold || d.keep_original) {
            json_array_append_new(keep, json_string(name));
            kept_live += nlive;
        }
    }
    json_decref(per);
    *moved = json_array_size(slots) - held; /* a deleted service's slots leave too */
    *marked = json_integer_value(json_object_get(live, m)) - kept_live;
}

/* Declares lost the machines whose lease expired and that still have slots or processes,
 * honouring each service's spec.disconnect (lost_plan): the first time, and again
 * whenever a held service's delay ran out (slots to move, processes to mark). A
 * declaration without kept services empties the machine's document (removed from
 * `state` too); with some, the placement's PUT removes only the slots not held. 0, or
 * -1 when this primary was fenced or the state is stale (a machine renewed its lease
 * since it was read: 409 machine_live), and the round stops.
 * Nobody is declared lost until ServerDir has answered this bigbrother without a failure
 * for a whole machine lease: after an outage of ServerDir or Redis longer than the lease
 * every lease has run out, and the machines get that long to renew before their healthy
 * processes are replaced. */
static int declare_lost(prim_t *p, json_t *state, const json_t *live, int64_t now)
{
    size_t i;
    json_t *m;
    if (!p->ok_since || sd_mono_ms() - p->ok_since < bb.cfg.lease_ttl_ms)
        return 0;
    json_t *assignments = json_object_get(state, "assignments");
    json_array_foreach(json_object_get(state, "machines"), i, m) {
        const char *name = json_string_value(json_object_get(m, "machine"));
        const char *st = json_string_value(json_object_get(m, "state"));
        if (!name || !st || !strcmp(st, "live"))
            continue;
        const json_t *at = json_object_get(p->lost, name);
        int64_t lost_for = at ? now - json_integer_value(at) : 0;
        size_t moved;
        long long marked;
        json_t *keep = json_array();
        lost_plan(state, name, lost_for, live, keep, &moved, &marked);
        size_t nslots = json_array_size(
            json_object_get(json_object_get(assignments, name), "slots"));
        if ((at || (!nslots && !json_integer_value(json_object_get(live, name)))) &&
            !moved && marked <= 0) {
            json_decref(keep);
            continue;
        }
        sdc_err_t err = {0};
        int rc = sdc_machine_lost_keep(cl.prim_client, bb.cfg.cluster, name, p->epoch, keep,
                                       NULL, &err);
        if (fenced(p, rc, &err)) {
            sdc_err_clear(&err);
            json_decref(keep);
            return -1;
        }
        if (rc == SDC_E_HTTP && err.status == 409 && !strcmp(err.code, "machine_live")) {
            /* it renewed after this round read the state: the round is stale */
            log_info("machine not declared lost: it renewed its lease", "machine=%s", name);
            sdc_err_clear(&err);
            json_decref(keep);
            return -1;
        }
        if (rc == SDC_OK) {
            log_warn("machine declared lost",
                     "machine=%s slots_moved=%zu processes=%lld services_kept=%zu lost_for_ms=%lld",
                     name, moved, marked, json_array_size(keep), (long long)lost_for);
            if (!at)
                json_object_set_new(p->lost, name, json_integer(now));
            if (!json_array_size(keep))
                json_object_del(assignments, name);
        } else {
            char why[320];
            log_error("machine not declared lost", "machine=%s error=%s", name,
                      sdc_strerror(rc, &err, why, sizeof(why)));
        }
        sdc_err_clear(&err);
        json_decref(keep);
    }
    return 0;
}

/* The count a pool service has now: the last one this primary used, else one past the
 * highest slot assigned to it. */
static int pool_current(const json_t *mem, const json_t *state, const char *service)
{
    const json_t *c = json_object_get(mem, "count");
    if (json_is_integer(c))
        return (int)json_integer_value(c);
    json_int_t n = 0;
    const char *m;
    json_t *doc;
    json_object_foreach(json_object_get(state, "assignments"), m, doc) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(doc, "slots"), i, e) {
            json_int_t slot = json_integer_value(json_object_get(e, "slot"));
            const char *s = json_string_value(json_object_get(e, "service"));
            if (s && !strcmp(s, service) && slot >= n && slot < 100000)
                n = slot + 1;
        }
    }
    return (int)n;
}

/* Sizes every pool (docs/allocation.md, "Pools"): answers a shallow copy of state in
 * which each service with a pool has a spec copy whose count is bb_pool_count's (the
 * caller decrefs; state is not changed). Updates p->pools and logs each size change. */
static json_t *size_pools(prim_t *p, const json_t *state)
{
    const json_t *svcs = json_object_get(state, "services");
    if (!json_is_array(svcs))
        return json_incref((json_t *)state); /* bb_place refuses it */
    const json_t *jnow = json_object_get(state, "now_ms");
    int64_t now = json_integer_value(jnow) > 0 ? json_integer_value(jnow) : sd_wall_ms();
    json_t *copy = json_copy((json_t *)state), *list = json_array(), *pools = json_object();
    size_t i;
    json_t *e;
    json_array_foreach(svcs, i, e) {
        const char *name = json_string_value(json_object_get(e, "service"));
        json_t *spec = json_object_get(e, "spec");
        json_t *pool = json_object_get(spec, "pool");
        if (!name || !pool) {
            json_array_append(list, e);
            continue;
        }
        json_t *mem = json_object_get(p->pools, name);
        mem = mem ? json_incref(mem) : json_object();
        int cur = pool_current(mem, state, name);
        bb_pool_window_t w = {
            .surplus_since_ms = json_integer_value(json_object_get(mem, "since")),
            .surplus_peak = (int)json_integer_value(json_object_get(mem, "peak"))};
        const json_t *stats = json_object_get(e, "pool");
        int n = bb_pool_count(pool, stats, cur, now, &w);
        if (n < 0) {
            if (!json_is_true(json_object_get(mem, "bad")))
                log_error("pool not understood: count kept", "service=%s count=%d", name, cur);
            json_object_set_new(mem, "bad", json_true());
            n = cur;
        } else {
            json_object_del(mem, "bad");
        }
        if (n != cur)
            log_info("pool resized", "service=%s from=%d to=%d allocated=%lld ready_free=%lld",
                     name, cur, n,
                     (long long)json_integer_value(json_object_get(stats, "allocated")),
                     (long long)json_integer_value(json_object_get(stats, "ready_free")));
        json_object_set_new(mem, "count", json_integer(n));
        json_object_set_new(mem, "since", json_integer(w.surplus_since_ms));
        json_object_set_new(mem, "peak", json_integer(w.surplus_peak));
        json_object_set_new(pools, name, mem);
        json_t *ce = json_copy(e), *cs = json_copy(spec);
        json_object_set_new(cs, "count", json_integer(n));
        json_object_set_new(ce, "spec", cs);
        json_array_append_new(list, ce);
    }
    json_object_set_new(copy, "services", list);
    json_decref(p->pools);
    p->pools = pools; /* services without a pool any more are forgotten */
    return copy;
}

/* One placement round of the primary. */
static void place_round(prim_t *p)
{
    char why[320];
    json_t *state = NULL, *procs = NULL, *lists = NULL, *sized = NULL;
    json_t *ready = json_object(), *live = json_object();
    sdc_err_t err = {0};
    int rc = sdc_state_get(cl.prim_client, bb.cfg.cluster, &state, &err);
    if (rc == SDC_OK) {
        /* the whole live directory, page by page */
        sdc_err_clear(&err);
        rc = sdc_processes_list(cl.prim_client, bb.cfg.cluster, NULL, &procs, &err);
    }
    reached(p, rc, &err);
    if (rc != SDC_OK) {
        log_warn("placement skipped: state not readable", "error=%s",
                 sdc_strerror(rc, &err, why, sizeof(why)));
        goto out;
    }
    const json_t *jnow = json_object_get(state, "now_ms");
    int64_t now = json_integer_value(jnow) > 0 ? json_integer_value(jnow) : sd_wall_ms();
    mark_lost(p, state, now);
    read_directory(p, state, procs, ready, live);
    if (declare_lost(p, state, live, now))
        goto out;
    mark_lost(p, state, now); /* the machines declared just now: lost_for_ms 0 */
    sized = size_pools(p, state);
    bb_place_stats_t st;
    if (bb_place(sized, ready, p->inflight, &lists, &st)) {
        log_error("placement skipped: state not understood", "cluster=%s", bb.cfg.cluster);
        goto out;
    }
    if (!json_object_size(lists))
        goto out;
    int64_t version = 0;
    sdc_err_clear(&err);
    rc = sdc_assignments_put(cl.prim_client, bb.cfg.cluster, p->epoch, lists, &version, NULL,
                             &err);
    if (fenced(p, rc, &err))
        goto out;
    if (rc != SDC_OK) {
        log_error("assignments not written", "error=%s",
                  sdc_strerror(rc, &err, why, sizeof(why)));
        goto out;
    }
    log_info("placement changed",
             "epoch=%lld version=%lld machines=%zu kept=%d placed=%d removed=%d rolled=%d "
             "unplaced=%d given_back=%d",
             (long long)p->epoch, (long long)version, json_object_size(lists), st.kept,
             st.placed, st.removed, st.rolled, st.unplaced, st.given_back);
out:
    sdc_err_clear(&err);
    json_decref(state);
    json_decref(sized);
    json_decref(procs);
    json_decref(lists);
    json_decref(ready);
    json_decref(live);
}

/* Waits ms for the next placement round, or less: as primary, the wait is a long-poll
 * of the cluster's pool-demand counter, which every allocation (and every allocation
 * that found no instance) moves, so a pool below its buffer is refilled at once instead
 * of at the next pass. Rounds woken that way are a quarter of the interval apart (50 to
 * 250 ms: each reads the state and the live directory). Returns 1 when stopping. */
static int wait_round(prim_t *p, int ms)
{
    int64_t now = sd_mono_ms(), until = now + ms;
    if (!p->is_primary || p->no_demand)
        return pause_ms(ms);
    int gap = bb.cfg.placement_interval_ms / 4;
    gap = gap < ROUND_GAP_MIN_MS ? ROUND_GAP_MIN_MS : gap > ROUND_GAP_MAX_MS ? ROUND_GAP_MAX_MS : gap;
    while ((now = sd_mono_ms()) < until && !stopping()) {
        int64_t v = -1;
        int left = (int)(until - now);
        int wait = p->demand < 0 ? 0 : left < cl.prim_wait_max ? left : cl.prim_wait_max;
        sdc_err_t err = {0};
        int rc = sdc_pool_demand(cl.prim_client, bb.cfg.cluster, p->demand, wait, &v, &err);
        if (rc == SDC_E_HTTP && (err.status == 404 || err.status == 405)) {
            log_warn("pool demand not followed", "why=%s then=%s", err.message,
                     "pools are sized at each placement pass");
            p->no_demand = 1;
        }
        sdc_err_clear(&err);
        if (rc != SDC_OK)
            return pause_ms((int)(until - sd_mono_ms() > 0 ? until - sd_mono_ms() : 0));
        if (p->demand >= 0 && v != p->demand) { /* an allocation: a round soon */
            p->demand = v;
            int64_t at = p->round_mono + gap;
            now = sd_mono_ms();
            return at > now ? pause_ms((int)(at - now)) : stopping();
        }
        p->demand = v;
    }
    return stopping();
}

static void *prim_main(void *arg)
{
    (void)arg;
    prim_t p = {.inflight = json_object(), .pools = json_object(), .lost = json_object(),
                .demand = -1};
    int64_t next_renew = 0;
    int renew_every = bb.cfg.primary_ttl_ms / 3, wait;
    do {
        int64_t now = sd_mono_ms();
        if (now >= next_renew) {
            renew(&p);
            next_renew = now + renew_every;
        }
        if (p.is_primary && sd_mono_ms() < p.lease_until) {
            p.round_mono = sd_mono_ms();
            place_round(&p);
        } else if (p.is_primary) {
            next_renew = 0; /* the lease ran out between renewals: renew before acting */
        }
        wait = bb.cfg.placement_interval_ms < renew_every ? bb.cfg.placement_interval_ms
                                                          : renew_every;
        if (next_renew - sd_mono_ms() < wait) /* never past a renewal */
            wait = (int)(next_renew - sd_mono_ms() > 0 ? next_renew - sd_mono_ms() : 0);
    } while (!wait_round(&p, wait));
    if (p.is_primary) {
        sdc_err_t err = {0};
        if (sdc_primary_release(cl.prim_client, bb.cfg.cluster, bb.cfg.machine, &err) ==
            SDC_OK)
            log_info("primary role released", "machine=%s epoch=%lld", bb.cfg.machine,
                     (long long)p.epoch);
        sdc_err_clear(&err);
    }
    json_decref(p.inflight);
    json_decref(p.pools);
    json_decref(p.lost);
    return NULL;
}

/* ---------------------------------------------------------------- start / stop */

int bb_cluster_start(void)
{
    if (!bb.cfg.cluster_mode)
        return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cl.cond, &ca);
    pthread_condattr_destroy(&ca);
    int timeout = bb.cfg.primary_ttl_ms / 2;
    timeout = timeout < 1000 ? 1000 : timeout > 5000 ? 5000 : timeout;
    cl.poll_client = sdc_new(bb.cfg.urls, bb.cfg.token, bb.cfg.assignment_wait_ms + 5000);
    cl.prim_client = sdc_new(bb.cfg.urls, bb.cfg.token, timeout);
    cl.prim_wait_max = timeout - 500;
    if (!cl.poll_client || !cl.prim_client)
        return -EINVAL;
    cl.evw.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (cl.evw.fd < 0)
        return -errno;
    cl.evw.fn = on_assignment;
    int rc = bb_watch_add(&cl.evw, EPOLLIN);
    if (rc)
        return rc;
    bb_converge_start();
    if ((rc = -pthread_create(&cl.poll_thr, NULL, poll_main, NULL)))
        return rc;
    cl.started = 1;
    if ((rc = -pthread_create(&cl.prim_thr, NULL, prim_main, NULL))) {
        bb_cluster_stop();
        return rc;
    }
    cl.started = 2;
    log_info("cluster mode on", "machine=%s primary_ttl_ms=%d placement_interval_ms=%d "
             "capacity=%d", bb.cfg.machine, bb.cfg.primary_ttl_ms,
             bb.cfg.placement_interval_ms, bb.cfg.capacity);
    return 0;
}

void bb_cluster_stop(void)
{
    if (!bb.cfg.cluster_mode)
        return;
    pthread_mutex_lock(&cl.mu);
    cl.stopping = 1;
    pthread_cond_broadcast(&cl.cond);
    pthread_mutex_unlock(&cl.mu);
    if (cl.started >= 1)
        pthread_join(cl.poll_thr, NULL);
    if (cl.started == 2)
        pthread_join(cl.prim_thr, NULL);
    bb_watch_close(&cl.evw);
    json_decref(cl.pending);
    cl.pending = NULL;
    sdc_free(cl.poll_client);
    sdc_free(cl.prim_client);
    cl.poll_client = cl.prim_client = NULL;
}
