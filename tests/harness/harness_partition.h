/* Harness addition for the partition tests (it_partition, it_chaos's partition fault):
 * what a cut-off machine's games did to the players' locks and saves, read straight from
 * Redis (no effect on the system), and which processes run each slot, read from /proc.
 *
 * Lock and blob samples (hp_locks_sample, every 50-100 ms) count, per player key
 * player:1..nkeys of cluster c1's directory:
 *   grants          new lock_seq values seen
 *   stale_saves     a save accepted (the blob's seq went up) under a lock_seq older than a
 *                   grant seen before it, or the blob's lock_seq going down: a process that
 *                   was no longer the key's holder saved
 *   stopped_grants  a grant made to a holder the directory recorded stopped before the
 *                   grant (its record's updated_at_ms <= the lock's since)
 *   stopped_saves   saves accepted under such a grant */
#ifndef SD_HARNESS_PARTITION_H
#define SD_HARNESS_PARTITION_H

#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define HP_MAXKEYS 64

typedef struct {
    h_redis_t *redis;
    int nkeys;
    long long lock_seq[HP_MAXKEYS + 1], blob_seq[HP_MAXKEYS + 1], blob_lock[HP_MAXKEYS + 1];
    long long stopped_seq[HP_MAXKEYS + 1]; /* lock_seq of the last grant to a stopped holder */
    long long samples, grants, saves, stale_saves, stopped_grants, stopped_saves;
    char stopped_holder[64]; /* the holder of the latest grant to a stopped holder */
} hp_locks_t;

void hp_locks_init(hp_locks_t *l, h_redis_t *redis, int nkeys);
/* One sample of every key's lock and blob; prints a VIOLATION line per finding. */
void hp_locks_sample(hp_locks_t *l);
/* Player locks held by a holder the directory records stopped (each printed); -1 when
 * Redis does not answer. */
int hp_locks_stuck(hp_locks_t *l);

/* The processes of service svc whose BB_SUPERVISOR is one of ident[0..n-1] (from
 * /proc/PID/environ; zombies, and tasks that do not lead their process group as every
 * game bigbrother spawns does, left out): pid, slot, generation (above 1: a restart of
 * the slot), instance id and the index of its supervisor.
 * Returns how many were found (at most cap). */
typedef struct {
    pid_t pid;
    int slot, generation, bb;
    char instance[64];
} hp_proc_t;
int hp_procs(const char *svc, char ident[][40], int n, hp_proc_t *out, int cap);
/* The identity a bigbrother with state dir `state` gives its processes (state/bigbrother.id)
 * into out (40 bytes); 0, or -1 when it cannot be read. */
int hp_ident(const char *state, char *out);

#endif
