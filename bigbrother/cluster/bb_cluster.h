/* Cluster mode: the assignments and primary threads (cluster.c), the supervision
 * thread's side that makes the table match an assignment (converge.c), and the primary's
 * placement (placement.c). */
#ifndef BB_CLUSTER_H
#define BB_CLUSTER_H

#include <jansson.h>
#include <stdint.h>

struct bb_inst; /* instance/bb_instance.h: this header stays free of it, so placement.c
                 * builds alone (the fuzzer) */

/* cluster.c: starts the assignments and primary threads (cluster mode only) and the
 * eventfd through which a new assignment reaches the supervision thread. 0 or -errno. */
int bb_cluster_start(void);
/* Stops both threads (releases the primary lease if held). */
void bb_cluster_stop(void);
/* on: the assignments thread reads at once (no long-poll) and wakes the supervision
 * thread after every read, until called with 0 (converge.c, after a gap). Any thread. */
void bb_cluster_want_fresh(int on);
/* converge.c: makes the cluster slots of the table match the assignment document `doc`
 * (borrowed); draining says why removed slots stop (drained or replaced). Runs on the
 * supervision thread; never blocks. The first call (or bb_converge_restore) hooks
 * converge into the state machine's spawn: a restart for a new spec switches the
 * instance to it. */
void bb_converge_apply(const json_t *doc, int draining);
/* converge.c's watch over its own freshness (see converge.c, "After a gap"): arms its
 * timer; cluster mode, supervision thread, once. */
void bb_converge_start(void);
/* The newest successful read of the assignment was sent at read_mono (monotonic ms, 0:
 * none yet); its document, if it had a new version, was applied just before. A read sent
 * after the last gap ends the wait of the held slots. */
void bb_converge_read(int64_t read_mono);
/* For state.c: the process spec of a cluster slot (borrowed; NULL for a static one), and
 * re-creating a cluster slot's entry from the persisted table (not started; NULL when
 * the spec is refused or the table is full). */
const json_t *bb_converge_spec(const struct bb_inst *in);
struct bb_inst *bb_converge_restore(const char *service, int slot, const json_t *spec,
                                    int64_t restart_token, int assigned);
/* Frees every cluster spec (at exit). */
void bb_converge_free(void);

/* ---------------------------------------------------------------- placement.c
 * The primary's pure function from the desired state to per-machine slot lists. No I/O,
 * no clock: the same inputs always give the same answer (unit-tested in
 * tests/unit/test_placement.c). */

typedef struct {
    int kept;      /* slots that stay where they are */
    int placed;    /* slots given a machine (new, or moved off an ineligible one) */
    int removed;   /* slot entries dropped from a machine */
    int rolled;    /* slots whose restart token or spec was advanced (rolling restart) */
    int unplaced;  /* slots with no eligible machine (labels, capacity, max_per_machine) */
    int given_back; /* keep_original slots moved back to their returning original */
} bb_place_stats_t;

#define BB_PLACE_NAME_MAX 256 /* longest service or machine name in a ready key */

/* Computes the assignments.
 *
 * state: the GET /state document: "services" [{service, version, spec, stopped,
 *   restart_token, max_unavailable?, slot_restart_tokens? {"3": n}}], "machines" [{machine, labels, capacity, state,
 *   draining}], "assignments" {machine: {slots: [...]}}, "cluster_stopped".
 * ready: object "machine|service|slot" -> instance id of the READY process the directory
 *   shows for that slot on that machine.
 * inflight: object "service|slot" -> the instance id that was ready when this primary
 *   advanced the slot's restart (""): owned by the caller, kept between calls, updated
 *   here. A slot counts as unavailable until a different instance is ready for it.
 *
 * A machine whose state is not "live" (its lease expired) and that is not draining keeps
 * the slots of a service whose spec.disconnect holds them (bb_disconnect_holds, with the
 * machine's "lost_for_ms": how long ago the primary declared it lost, absent: 0) and
 * loses the others. A slot of a service with reconcile keep_original that `ready` shows
 * ready on another machine that fits it is moved there (given back to the original
 * process) when that machine has "returned": true (it came back after it was declared
 * lost; the caller counts only ready reports made after its return).
 *
 * Rules: only machines with state "live" and not draining get slots, when the service's
 * placement.labels are a subset of their labels, within capacity (0: unlimited) and the
 * service's placement.max_per_machine (0: unlimited). A slot stays on its machine while
 * that machine is eligible (stable); missing slots go to the eligible machine with the
 * fewest slots of that service, then the fewest slots, then the smallest name. A slot's
 * restart token is the service's plus the slot's own. A slot whose restart token or
 * process spec differs from the desired one is advanced only while
 * fewer than max_unavailable (default 1) slots of the service are not ready. A stopped
 * service or a stopped cluster has no slots.
 *
 * *out: a new object machine -> slot array, holding only the machines whose list changed
 * (caller decrefs). Returns 0, or -1 when state is not shaped as above. */
int bb_place(const json_t *state, const json_t *ready, json_t *inflight, json_t **out,
             bb_place_stats_t *st);

/* The parts of a service spec that decide how a process runs (spec without count,
 * placement, pool, confirm_timeout_ms and disconnect; on_release stays, the Big Brother
 * acts on it): two specs run the same process when these are json_equal. New reference. */
json_t *bb_spec_process_part(const json_t *spec);

/* A service's spec.disconnect (docs/cluster.md, "A machine cut off"), defaults for what
 * is absent: lost_after_ms 0, replace true, stop_after_ms 0 (never), reconcile
 * keep_replacement. The primary reads the first two and reconcile, each bigbrother
 * stop_after_ms and reconcile (converge.c). */
typedef struct {
    int64_t lost_after_ms;
    int replace;
    int stop_after_ms;
    int keep_original;
} bb_disconnect_t;
void bb_disconnect_of(const json_t *spec, bb_disconnect_t *d);

/* Whether a slot of the service with this spec stays on its machine lost_for_ms after the
 * machine was declared lost: replace false, or lost_for_ms < lost_after_ms. */
int bb_disconnect_holds(const json_t *spec, int64_t lost_for_ms);

/* A pool's pending decrease, owned by the caller and kept between calls for one service
 * (zeroed: none pending). */
typedef struct {
    int64_t surplus_since_ms; /* when the count wanted fell below the current one; 0: not */
    int surplus_peak;         /* the highest count wanted since then */
} bb_pool_window_t;

/* The instance count of a service with a pool (docs/allocation.md, "Pools").
 *
 * pool: the spec's "pool" object {buffer: N | "P%", min, max, scale_down_delay_s}.
 * stats: the service's "pool" object of GET /state {allocated, max_allocated_slot,
 *   last_demand_ms}; NULL or a missing member counts as 0 (max_allocated_slot: -1).
 * current: the count in use now. now_ms: the wall clock (Redis's), > 0.
 *
 * Wanted: allocated + buffer; for "P%" the smallest N > allocated with
 * N - allocated >= P% of N (so at least one free instance). With nothing allocated and no
 * allocation request for scale_down_delay_s (last_demand_ms 0: never), 0. Then clamped
 * to [min, max]. A wanted count >= current applies at once. A lower one applies once
 * the wanted count has stayed below current for scale_down_delay_s, and then goes to the
 * highest count wanted during that time, never below max_allocated_slot + 1 (while that
 * floor holds the decrease back, the window stays open: the decrease follows the floor
 * down at once).
 *
 * Returns the count to use (*w updated), or -1 when pool is not shaped as above (*w
 * untouched). */
int bb_pool_count(const json_t *pool, const json_t *stats, int current, int64_t now_ms,
                  bb_pool_window_t *w);

#endif
