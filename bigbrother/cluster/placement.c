/* Placement (see bb_cluster.h): services x machines -> per-machine slot lists.
 *
 *   1. keep every assigned slot whose machine is still eligible for it (stable), or
 *      lost but held by the service's disconnect settings; give a keep_original slot
 *      back to the machine that came back with its original process ready
 *   2. give each missing slot the eligible machine with the fewest slots of its service,
 *      then the fewest slots, then the smallest name (spread)
 *   3. advance restart tokens / specs, at most max_unavailable slots of a service down
 *   4. answer the machines whose list changed
 *
 * and the count of a service with a pool (bb_pool_count), which the caller writes into
 * the spec before placing.
 */
#include "cluster/bb_cluster.h"
#include "sdproto.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    const json_t *labels;
    int capacity; /* 0: unlimited */
    int total;
    int lost;            /* lease expired: gets nothing new, keeps the slots it holds */
    int returned;        /* came back after it was declared lost: may get originals back */
    int64_t lost_for_ms; /* since the primary declared it lost (0: not yet) */
} mach_t;

typedef struct {
    const char *name;
    const json_t *spec, *labels;
    const json_t *slot_tokens; /* "slot" -> restart token of that one slot */
    json_t *proc;
    int count, max_per_machine, max_unavailable;
    json_int_t version, token;
    int *where;      /* slot -> machine index, -1 unplaced */
    json_t **entry;  /* slot -> the entry to write (owned) */
} svc_t;

typedef struct {
    mach_t *m;
    int nm;
    svc_t *s;
    int ns;
    int *per;        /* per[s * nm + m]: slots of service s on machine m */
} plan_t;

json_t *bb_spec_process_part(const json_t *spec)
{
    json_t *p = json_is_object(spec) ? json_deep_copy(spec) : json_object();
    json_object_del(p, "count");
    json_object_del(p, "placement");
    json_object_del(p, "pool");               /* sizes the service, not the process */
    json_object_del(p, "confirm_timeout_ms"); /* ServerDir's, for allocations */
    json_object_del(p, "disconnect");         /* what a cut-off machine's games become */
    return p;
}

void bb_disconnect_of(const json_t *spec, bb_disconnect_t *d)
{
    const json_t *o = json_object_get(spec, "disconnect");
    const json_t *lost = json_object_get(o, "lost_after_ms");
    const char *rec = json_string_value(json_object_get(o, "reconcile"));
    d->lost_after_ms = json_is_integer(lost) && json_integer_value(lost) > 0
                           ? (int64_t)json_integer_value(lost)
                           : 0;
    d->replace = !json_is_false(json_object_get(o, "replace"));
    d->keep_original = rec && !strcmp(rec, "keep_original");
    const json_t *stop = json_object_get(o, "stop_after_ms");
    json_int_t ms = json_is_integer(stop) ? json_integer_value(stop) : 0;
    d->stop_after_ms = ms > 0 && ms <= SD_DISCONNECT_MAX_MS ? (int)ms : 0;
}

int bb_disconnect_holds(const json_t *spec, int64_t lost_for_ms)
{
    bb_disconnect_t d;
    bb_disconnect_of(spec, &d);
    return !d.replace || lost_for_ms < d.lost_after_ms;
}

/* An integer member of obj within [lo, hi], def when absent; -1 when out of range. */
static int pool_int(const json_t *obj, const char *key, int lo, int hi, int def, int *out)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *out = (int)json_integer_value(v);
    return 0;
}

/* A member of the GET /state pool statistics, def when absent or not an integer. */
static int64_t stat_int(const json_t *stats, const char *key, int64_t def)
{
    const json_t *v = json_object_get(stats, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

/* The buffer: *n instances, or *pct percent (the other one 0). */
static int pool_buffer(const json_t *pool, int *n, int *pct)
{
    const json_t *b = json_object_get(pool, "buffer");
    *n = *pct = 0;
    if (json_is_string(b)) {
        const char *t = json_string_value(b);
        char *end;
        long p = strtol(t, &end, 10);
        if (end == t || *t < '0' || *t > '9' || strcmp(end, "%") || p < 1 || p > 99)
            return -1;
        *pct = (int)p;
        return 0;
    }
    return pool_int(pool, "buffer", 0, 100000, 0, n);
}

int bb_pool_count(const json_t *pool, const json_t *stats, int current, int64_t now_ms,
                  bb_pool_window_t *w)
{
    int buffer, pct, min, max, delay_s;
    if (!json_is_object(pool) || pool_buffer(pool, &buffer, &pct) ||
        pool_int(pool, "min", 0, 100000, 0, &min) ||
        pool_int(pool, "max", 0, 100000, 100000, &max) ||
        pool_int(pool, "scale_down_delay_s", 0, 86400, 30, &delay_s) || min > max)
        return -1;
    int64_t allocated = stat_int(stats, "allocated", 0);
    int64_t floor = stat_int(stats, "max_allocated_slot", -1) + 1;
    int64_t demand = stat_int(stats, "last_demand_ms", 0);
    int64_t delay_ms = (int64_t)delay_s * 1000;
    allocated = allocated < 0 ? 0 : allocated;

    int64_t want;
    if (allocated == 0 && (demand <= 0 || now_ms - demand >= delay_ms))
        want = 0; /* idle: scale to zero (min permitting) */
    else if (pct) {
        /* smallest N > allocated with (100 - pct) * N >= 100 * allocated */
        want = (100 * allocated + (100 - pct) - 1) / (100 - pct);
        if (want <= allocated)
            want = allocated + 1;
    } else
        want = allocated + buffer;
    int target = want < min ? min : want > max ? max : (int)want;

    if (target >= current) {
        w->surplus_since_ms = 0;
        return target;
    }
    if (!w->surplus_since_ms) {
        w->surplus_since_ms = now_ms;
        w->surplus_peak = target;
    } else if (target > w->surplus_peak) {
        w->surplus_peak = target;
    }
    if (now_ms - w->surplus_since_ms < delay_ms)
        return current;
    if (floor <= w->surplus_peak) {
        w->surplus_since_ms = 0; /* done: a further decrease waits a new delay */
        return w->surplus_peak;
    }
    return floor < current ? (int)floor : current; /* an allocated slot holds it back */
}

static int cmp_mach(const void *a, const void *b)
{
    return strcmp(((const mach_t *)a)->name, ((const mach_t *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int labels_match(const json_t *want, const json_t *have)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)want, k, v) {
        json_t *h = json_object_get(have, k);
        if (!h || !json_equal(h, v))
            return 0;
    }
    return 1;
}

static int find_mach(const plan_t *p, const char *name)
{
    for (int i = 0; i < p->nm; i++)
        if (!strcmp(p->m[i].name, name))
            return i;
    return -1;
}

static int find_svc(const plan_t *p, const char *name)
{
    for (int i = 0; i < p->ns; i++)
        if (!strcmp(p->s[i].name, name))
            return i;
    return -1;
}

/* Can machine mi take one more slot of service si? */
static int fits(const plan_t *p, int si, int mi)
{
    const svc_t *s = &p->s[si];
    const mach_t *m = &p->m[mi];
    if (m->lost)
        return 0;
    if (m->capacity > 0 && m->total >= m->capacity)
        return 0;
    if (s->max_per_machine > 0 && p->per[si * p->nm + mi] >= s->max_per_machine)
        return 0;
    return labels_match(s->labels, m->labels);
}

static void put_slot(plan_t *p, int si, int slot, int mi, json_t *entry)
{
    p->s[si].where[slot] = mi;
    p->s[si].entry[slot] = entry;
    p->per[si * p->nm + mi]++;
    p->m[mi].total++;
}

/* The restart token a slot must run with: the service's (rolling restarts) plus the
 * slot's own (restart of one instance); both only grow. */
static json_int_t slot_token(const svc_t *s, int slot)
{
    char k[24];
    snprintf(k, sizeof(k), "%d", slot);
    return s->token + json_integer_value(json_object_get(s->slot_tokens, k));
}

static json_t *new_entry(const svc_t *s, int slot)
{
    return json_pack("{s:s, s:i, s:I, s:I, s:O}", "service", s->name, "slot", slot,
                     "spec_version", s->version, "restart_token", slot_token(s, slot), "spec",
                     s->spec);
}

static void free_plan(plan_t *p)
{
    for (int i = 0; i < p->ns; i++) {
        for (int k = 0; p->s[i].entry && k < p->s[i].count; k++)
            json_decref(p->s[i].entry[k]);
        free(p->s[i].entry);
        free(p->s[i].where);
        json_decref(p->s[i].proc);
    }
    free(p->s);
    free(p->m);
    free(p->per);
}

static int load_services(plan_t *p, const json_t *state)
{
    const json_t *svcs = json_object_get(state, "services");
    if (!json_is_array(svcs))
        return -1;
    int stopped_all = json_is_true(json_object_get(state, "cluster_stopped"));
    p->s = calloc(json_array_size(svcs) + 1, sizeof(svc_t));
    if (!p->s)
        return -1;
    size_t i;
    json_t *e;
    json_array_foreach(svcs, i, e) {
        const char *name = json_string_value(json_object_get(e, "service"));
        const json_t *spec = json_object_get(e, "spec");
        if (!name || !json_is_object(spec) || find_svc(p, name) >= 0)
            return -1; /* a service named twice: not a state ServerDir gives */
        const json_t *pl = json_object_get(spec, "placement");
        svc_t *s = &p->s[p->ns++];
        s->name = name;
        s->spec = spec;
        s->proc = bb_spec_process_part(spec);
        s->labels = json_object_get(pl, "labels");
        s->max_per_machine = (int)json_integer_value(json_object_get(pl, "max_per_machine"));
        json_int_t mu = json_integer_value(json_object_get(e, "max_unavailable"));
        s->max_unavailable = mu > 0 ? (int)mu : 1;
        s->version = json_integer_value(json_object_get(e, "version"));
        s->token = json_integer_value(json_object_get(e, "restart_token"));
        s->slot_tokens = json_object_get(e, "slot_restart_tokens");
        json_int_t count = json_integer_value(json_object_get(spec, "count"));
        if (count < 0 || count > 100000) /* ServerDir caps a service at 100000 */
            return -1;
        s->count = stopped_all || json_is_true(json_object_get(e, "stopped")) ? 0 : (int)count;
        s->where = malloc(((size_t)s->count + 1) * sizeof(int));
        s->entry = calloc((size_t)s->count + 1, sizeof(json_t *));
        if (!s->where || !s->entry)
            return -1;
        for (int k = 0; k < s->count; k++)
            s->where[k] = -1;
    }
    return 0;
}

static int load_machines(plan_t *p, const json_t *state)
{
    const json_t *ms = json_object_get(state, "machines");
    if (!json_is_array(ms))
        return -1;
    p->m = calloc(json_array_size(ms) + 1, sizeof(mach_t));
    if (!p->m)
        return -1;
    size_t i;
    json_t *e;
    json_array_foreach(ms, i, e) {
        const char *name = json_string_value(json_object_get(e, "machine"));
        const char *st = json_string_value(json_object_get(e, "state"));
        if (!name)
            return -1;
        /* a draining machine is left whatever its lease; a lost one may keep slots */
        if (!st || json_is_true(json_object_get(e, "draining")))
            continue;
        mach_t *m = &p->m[p->nm++];
        m->name = name;
        m->lost = strcmp(st, "live") != 0;
        json_int_t lost_for = json_integer_value(json_object_get(e, "lost_for_ms"));
        m->lost_for_ms = lost_for > 0 ? (int64_t)lost_for : 0;
        m->returned = !m->lost && json_is_true(json_object_get(e, "returned"));
        m->labels = json_object_get(e, "labels");
        json_int_t cap = json_integer_value(json_object_get(e, "capacity"));
        m->capacity = cap > 0 && cap < INT32_MAX ? (int)cap : 0;
    }
    qsort(p->m, (size_t)p->nm, sizeof(mach_t), cmp_mach);
    p->per = calloc((size_t)p->ns * (size_t)p->nm + 1, sizeof(int));
    return p->per ? 0 : -1;
}

/* Step 1: the current assignments, machine names in order; returns the entries dropped. */
static int keep_current(plan_t *p, const json_t *assignments, int *kept)
{
    size_t n = json_object_size(assignments), k = 0;
    const char **names = calloc(n + 1, sizeof(char *));
    const char *key;
    json_t *doc;
    int removed = 0;
    if (!names)
        return 0;
    json_object_foreach((json_t *)assignments, key, doc)
        names[k++] = key;
    qsort(names, n, sizeof(char *), cmp_str);
    for (k = 0; k < n; k++) {
        int mi = find_mach(p, names[k]);
        const json_t *slots = json_object_get(json_object_get(assignments, names[k]), "slots");
        size_t i;
        json_t *e;
        json_array_foreach(slots, i, e) {
            const char *sname = json_string_value(json_object_get(e, "service"));
            int si = sname ? find_svc(p, sname) : -1;
            json_t *jslot = json_object_get(e, "slot");
            json_int_t slot = json_is_integer(jslot) ? json_integer_value(jslot) : -1;
            if (mi < 0 || si < 0 || slot < 0 || slot >= p->s[si].count ||
                p->s[si].where[slot] >= 0 ||
                (p->m[mi].lost ? !bb_disconnect_holds(p->s[si].spec, p->m[mi].lost_for_ms)
                               : !fits(p, si, mi))) {
                removed++;
                continue;
            }
            svc_t *s = &p->s[si];
            json_t *copy = json_deep_copy(e);
            json_t *proc = bb_spec_process_part(json_object_get(e, "spec"));
            if (json_equal(proc, s->proc) &&
                json_integer_value(json_object_get(e, "spec_version")) != s->version) {
                /* count or placement changed only: the process stays as it is */
                json_object_set_new(copy, "spec_version", json_integer(s->version));
                json_object_set(copy, "spec", (json_t *)s->spec);
            }
            json_decref(proc);
            put_slot(p, si, (int)slot, mi, copy);
            (*kept)++;
        }
    }
    free(names);
    return removed;
}

/* Step 1b (reconcile keep_original): a slot of such a service whose original process is
 * ready again on a machine that came back ("returned") is given back to that machine (the
 * copy that replaced it is then stopped by its Big Brother as replaced). Only a returned
 * machine receives, so the replacement, still ready while it stops, never takes the slot
 * again. ready's keys are "machine|service|slot". */
static void give_back(plan_t *p, const json_t *ready, bb_place_stats_t *st)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)ready, key, v) {
        char mname[BB_PLACE_NAME_MAX + 1], sname[BB_PLACE_NAME_MAX + 1];
        int slot, end = 0;
        if (sscanf(key, "%256[^|]|%256[^|]|%d%n", mname, sname, &slot, &end) != 3 || key[end])
            continue;
        int mi = find_mach(p, mname), si = find_svc(p, sname);
        if (mi < 0 || si < 0 || slot < 0 || slot >= p->s[si].count)
            continue;
        svc_t *s = &p->s[si];
        bb_disconnect_t d;
        bb_disconnect_of(s->spec, &d);
        int from = s->where[slot];
        if (!d.keep_original || !p->m[mi].returned || from == mi || !fits(p, si, mi))
            continue;
        json_t *e = s->entry[slot];
        if (from >= 0) {
            p->per[si * p->nm + from]--;
            p->m[from].total--;
        } else {
            e = new_entry(s, slot);
        }
        put_slot(p, si, slot, mi, e);
        st->given_back++;
    }
}

/* Step 2: every missing slot to the least loaded eligible machine. */
static void place_missing(plan_t *p, bb_place_stats_t *st)
{
    for (int si = 0; si < p->ns; si++)
        for (int slot = 0; slot < p->s[si].count; slot++) {
            if (p->s[si].where[slot] >= 0)
                continue;
            int best = -1;
            for (int mi = 0; mi < p->nm; mi++) {
                if (!fits(p, si, mi))
                    continue;
                if (best < 0 || p->per[si * p->nm + mi] < p->per[si * p->nm + best] ||
                    (p->per[si * p->nm + mi] == p->per[si * p->nm + best] &&
                     p->m[mi].total < p->m[best].total))
                    best = mi;
            }
            if (best < 0) {
                st->unplaced++;
                continue;
            }
            put_slot(p, si, slot, best, new_entry(&p->s[si], slot));
            st->placed++;
        }
}

static const char *ready_id(const plan_t *p, const json_t *ready, int si, int slot)
{
    char key[420];
    snprintf(key, sizeof(key), "%s|%s|%d", p->m[p->s[si].where[slot]].name, p->s[si].name,
             slot);
    return json_string_value(json_object_get(ready, key));
}

/* Step 3: rolling restarts and spec changes. */
static void roll(plan_t *p, const json_t *ready, json_t *inflight, bb_place_stats_t *st)
{
    for (int si = 0; si < p->ns; si++) {
        svc_t *s = &p->s[si];
        int down = 0;
        char key[300];
        char *down_flag = calloc((size_t)s->count + 1, 1);
        if (!down_flag)
            return;
        for (int slot = 0; slot < s->count; slot++) {
            if (s->where[slot] < 0)
                continue;
            const char *rid = ready_id(p, ready, si, slot);
            snprintf(key, sizeof(key), "%s|%d", s->name, slot);
            const char *was = json_string_value(json_object_get(inflight, key));
            if (was && rid && strcmp(was, rid))
                json_object_del(inflight, key); /* a new instance is ready: done */
            else if (was)
                rid = NULL;
            down_flag[slot] = !rid;
            down += !rid;
        }
        int budget = s->max_unavailable - down;
        for (int slot = 0; slot < s->count; slot++) {
            json_t *e = s->entry[slot];
            if (!e)
                continue;
            json_t *proc = bb_spec_process_part(json_object_get(e, "spec"));
            json_int_t token = slot_token(s, slot);
            int needs = json_integer_value(json_object_get(e, "restart_token")) != token ||
                        !json_equal(proc, s->proc);
            json_decref(proc);
            if (!needs || (!down_flag[slot] && budget <= 0))
                continue;
            if (!down_flag[slot])
                budget--; /* a slot already down costs nothing more */
            const char *rid = ready_id(p, ready, si, slot);
            snprintf(key, sizeof(key), "%s|%d", s->name, slot);
            json_object_set_new(inflight, key, json_string(rid ? rid : ""));
            json_object_set_new(e, "restart_token", json_integer(token));
            json_object_set_new(e, "spec_version", json_integer(s->version));
            json_object_set(e, "spec", (json_t *)s->spec);
            st->rolled++;
        }
        free(down_flag);
    }
    /* forget slots that no longer exist */
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(inflight, tmp, k, v) {
        const char *bar = strrchr(k, '|');
        char name[260];
        int si = -1;
        if (bar && (size_t)(bar - k) < sizeof(name)) {
            memcpy(name, k, (size_t)(bar - k));
            name[bar - k] = 0;
            si = find_svc(p, name);
        }
        if (si < 0 || atoi(bar + 1) >= p->s[si].count || p->s[si].where[atoi(bar + 1)] < 0)
            json_object_del(inflight, k);
    }
}

/* Step 4: the lists, in service then slot order, of every machine that changed. */
static json_t *changed_lists(const plan_t *p, const json_t *assignments)
{
    json_t *lists = json_object(), *out = json_object();
    for (int mi = 0; mi < p->nm; mi++)
        json_object_set_new(lists, p->m[mi].name, json_array());
    const char *key;
    json_t *doc;
    json_object_foreach((json_t *)assignments, key, doc)
        if (!json_object_get(lists, key))
            json_object_set_new(lists, key, json_array());
    for (int si = 0; si < p->ns; si++)
        for (int slot = 0; slot < p->s[si].count; slot++)
            if (p->s[si].where[slot] >= 0)
                json_array_append(json_object_get(lists, p->m[p->s[si].where[slot]].name),
                                  p->s[si].entry[slot]);
    json_t *list;
    json_object_foreach(lists, key, list) {
        json_t *cur = json_object_get(json_object_get(assignments, key), "slots");
        if (!(cur ? json_equal(cur, list) : json_array_size(list) == 0))
            json_object_set(out, key, list);
    }
    json_decref(lists);
    return out;
}

int bb_place(const json_t *state, const json_t *ready, json_t *inflight, json_t **out,
             bb_place_stats_t *st)
{
    plan_t p = {0};
    memset(st, 0, sizeof(*st));
    *out = NULL;
    const json_t *assignments = json_object_get(state, "assignments");
    if (!json_is_object(state) || (assignments && !json_is_object(assignments)) ||
        load_services(&p, state) || load_machines(&p, state)) {
        free_plan(&p);
        return -1;
    }
    json_t *none = assignments ? NULL : json_object();
    if (none)
        assignments = none;
    st->removed = keep_current(&p, assignments, &st->kept);
    give_back(&p, ready, st);
    place_missing(&p, st);
    roll(&p, ready, inflight, st);
    *out = changed_lists(&p, assignments);
    json_decref(none);
    free_plan(&p);
    return 0;
}
