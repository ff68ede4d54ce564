/* Chaos soak: redis-server with persistence (appendonly, appendfsync always), two
 * serverdir copies behind the shipped haproxy config, three bigbrothers in cluster mode
 * running a service of a dozen gameprocs that simulate players (locks and fenced saves
 * every 500 ms). For SD_CHAOS_SECONDS (default 40; valgrind: 30) a PRNG seeded from
 * SD_CHAOS_SEED (default: the clock; printed) injects faults: SIGKILL and SIGSTOP (+SIGCONT)
 * of gameprocs, kill -9 and restart of a bigbrother (same config and state dir; one time
 * in three it stays down past its machine lease, so its machine is declared lost), restart of
 * redis (SIGTERM, then again on the same port and dir), kill -9 and restart of a serverdir
 * copy, and the faults of hostile and buggy peers: a bigbrother killed with its state.json
 * deleted, truncated or overwritten before its restart (it must find its instances by
 * their identity, not start doubles), 200 agent-socket connections that never say HELLO
 * held on a bigbrother while one of its instances restarts, and stale lock holders
 * retrying their saves (the test's own, with every number it can read, and the gameprocs
 * whose players a thief takes over), and partitions: a bigbrother cut off from serverdir
 * (SIGSTOP) while its games run on and the other faults go on, half the time past its
 * machine lease (its machine is declared lost and its slots move), one time in two with
 * one of its games killed during the cut (its bigbrother learns of it on its return).
 * Then everything settles (bounded) and the
 * invariants are checked and printed:
 *   desired    every desired instance is running and ready (directory and real processes)
 *   directory  every live record's pid runs and belongs to its bigbrother; every running
 *              instance is in the directory
 *   outbox     every event of every outbox is in the history exactly once (a status
 *              event, which has no history entry: its idempotency record exists)
 *   locks      no two holders were granted a key with the same lock_seq (gameproc logs)
 *   blobs      no player blob's Blob-Seq, nor the lock_seq of its last accepted save, ever
 *              went down (sampled in Redis during the run)
 *   stops      every stopped event is explained by an injected fault: killed (signal 9)
 *              or gone at re-adoption for an instance the test killed, hung for one it
 *              froze, machine_lost / replaced / orphaned on a machine whose bigbrother
 *              it killed or cut off
 *   processes  every gameproc carrying one of the bigbrothers' identities (BB_SUPERVISOR
 *              in /proc/PID/environ) is an instance its bigbrother lists: no doubles, no
 *              orphans left running unsupervised
 *   stale      no save, renew or release by a stale holder was accepted, and the new
 *              holder's data was intact after every stale retry
 *   partition  (harness_partition.h, sampled with the blobs) no lock was granted to a
 *              holder the directory had recorded stopped, no save was accepted from a
 *              process that was no longer the key's holder, no player lock is held by a
 *              stopped holder once the lock delay has passed after the settle, and no
 *              machine back from a cut restarted a slot that ran elsewhere before it
 *              read its assignment (its restarts in the 1.5 s after the heal)
 *   allocations  meanwhile the test allocates instances of the service (and ends some
 *              with DELETE); no instance was ever held by two open allocations at once
 *              (the intervals [created, ended) of each instance's allocations, read back
 *              from the list, never overlap)
 * The test fails unless violations == 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness_api.h"
#include "harness_cluster.h"
#include "harness_partition.h"

#ifndef SD_SOURCE_DIR
#define SD_SOURCE_DIR SD_BIN_DIR "/../.."
#endif
#define HAPROXY_CFG SD_SOURCE_DIR "/packaging/haproxy/haproxy.cfg"
#define SVC "zone"
#define NBB 3
#define NCOPIES 2
#define NKEYS 30
#define MAXFROZEN 64

static cl_t C;               /* C.sd.url is the haproxy front; C.bb[] the bigbrothers */
static char redis_dir[256];
static int redis_runs;
static struct {
    pid_t pid;
    int port, runs;
} copies[NCOPIES];
static pid_t haproxy_pid;
static uint64_t rng;
static int nprocs;

/* Fault bookkeeping: instances the test killed or froze; bigbrothers it killed or cut off. */
static json_t *hit;          /* instance id -> "kill" | "stop" */
static int bb_kills[NBB], bb_cuts[NBB];
static struct {
    pid_t pid;
    int64_t cont_at;
} frozen[MAXFROZEN];
static int nfrozen;
#define NKINDS 9
static int faults, faults_by[NKINDS];
static const char *const fault_names[NKINDS] = {
    "gameproc_kill", "gameproc_stop", "bigbrother_kill", "redis_restart",
    "serverdir_kill", "state_damage", "agent_flood",     "stale_holder", "partition"};
/* Weights of the kinds after the first NKINDS faults (they add up to 100). */
static const int fault_weights[NKINDS] = {20, 13, 9, 10, 12, 9, 7, 10, 10};

/* agent_flood: connections to one bigbrother's agent socket that never say HELLO, held
 * until the next fault. */
#define FLOOD 200
static int flood_fds[FLOOD], nflood, flood_refused;

/* stale_holder figures. */
static int stale_stories, stale_refused, stale_accepted, stale_incomplete, stale_thefts,
    stale_overwritten;

/* Blob samples: the highest Blob-Seq and save lock_seq seen per key, how many times one
 * went down (lock_seq grows per key, so a save accepted under an older grant after one
 * under a newer grant would show as a lock_seq going down). */
static long long blob_max[NKEYS + 1], blob_lock_max[NKEYS + 1];
static long long blob_samples, blob_backwards, blob_lock_backwards;

/* Locks and saves of the player keys against the directory (harness_partition.h), and
 * the partition fault's figures. */
static hp_locks_t locks;
static int cuts_long, cut_kills, returning_restarts;

/* Allocations made during the chaos (docs/allocation.md). */
#define MAXALLOCS 2000
static char alloc_ids[MAXALLOCS][24];
static int nallocs, alloc_tries, alloc_none, alloc_errors, alloc_deleted;

static uint64_t rnd(void);
static int rnd_in(int lo, int hi);

/* One allocation try of the service through the front (half the time), and now and then
 * the end of an open one. Errors while a fault is on (503, transport) are counted. */
static void allocate_some(void)
{
    if (rnd_in(0, 1))
        return;
    json_t *o = NULL;
    char code[64];
    alloc_tries++;
    long st = ct_call(C.sd.url, H_TOK_GAME_OF_C1, "POST",
                      "{\"service\":\"" SVC "\",\"payload\":{\"chaos\":true},"
                      "\"strategy\":\"distributed\"}", &o, code, CL_BASE "/allocations");
    if (st == 201 && nallocs < MAXALLOCS)
        snprintf(alloc_ids[nallocs++], sizeof alloc_ids[0], "%s", ct_str(o, "allocation"));
    else if (st == 409 && !strcmp(code, "no_capacity"))
        alloc_none++;
    else
        alloc_errors++;
    json_decref(o);
    if (nallocs > 0 && rnd_in(0, 2) == 0) {
        const char *id = alloc_ids[rnd_in(0, nallocs - 1)];
        if (ct_call(C.sd.url, H_TOK_GAME_OF_C1, "DELETE", NULL, NULL, NULL,
                    CL_BASE "/allocations/%s", id) == 200)
            alloc_deleted++;
    }
}

/* Reads back every allocation and counts the instances held by two open allocations at
 * once: per instance, the [created, ended) intervals must not overlap. */
static int double_allocations(int *listed, int *by_state_lost)
{
    json_t *all = json_array();
    char after[64] = "";
    for (int page = 0; page < 100; page++) {
        json_t *o = NULL;
        if (ct_call(C.sd.url, H_TOK_OPS, "GET", NULL, &o, NULL,
                    CL_BASE "/allocations?limit=1000&after=%s", after) != 200) {
            json_decref(o);
            break;
        }
        json_array_extend(all, json_object_get(o, "allocations"));
        const char *next = json_string_value(json_object_get(o, "next"));
        snprintf(after, sizeof after, "%s", next ? next : "");
        json_decref(o);
        if (!next)
            break;
    }
    *listed = (int)json_array_size(all);
    *by_state_lost = 0;
    int doubles = 0;
    size_t i, j;
    json_t *a, *b;
    json_array_foreach(all, i, a) {
        *by_state_lost += !strcmp(ct_str(a, "state"), "allocation_lost");
        long long a0 = ct_int(a, "created_at_ms"), a1 = ct_int(a, "ended_at_ms");
        json_array_foreach(all, j, b) {
            if (j <= i || strcmp(ct_str(a, "instance"), ct_str(b, "instance")))
                continue;
            long long b0 = ct_int(b, "created_at_ms"), b1 = ct_int(b, "ended_at_ms");
            if ((a1 < 0 || b0 < a1) && (b1 < 0 || a0 < b1)) {
                print_message("chaos: instance %s held by %s and %s at once\n",
                              ct_str(a, "instance"), ct_str(a, "allocation"),
                              ct_str(b, "allocation"));
                doubles++;
            }
        }
    }
    json_decref(all);
    return doubles;
}

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int rnd_in(int lo, int hi)
{
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

static int slow(int ms)
{
    return h_valgrind() ? ms * 4 : ms;
}

static void thaw_due(int64_t now);
static void partition_step(int64_t now);
static void sample_blobs(void);

/* A gameproc whose bigbrother was killed is re-parented to this test (the harness is a
 * subreaper); when it dies later it stays a zombie until reaped, holding its pid. Reaps
 * those (gameprocs only: the daemons this test started are waited for by h_stop). */
static void reap_orphans(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)getpid(), (int)getpid());
    FILE *f = fopen(path, "r");
    int pid;
    while (f && fscanf(f, "%d", &pid) == 1) {
        char stat[128], line[256];
        snprintf(stat, sizeof stat, "/proc/%d/stat", pid);
        FILE *g = fopen(stat, "r");
        if (g && fgets(line, sizeof line, g) && strstr(line, "(gameproc) Z"))
            waitpid(pid, NULL, WNOHANG);
        if (g)
            fclose(g);
    }
    if (f)
        fclose(f);
}

/* Waits ms while keeping the frozen processes' schedule and the blob samples going. */
static void pause_ms(int ms)
{
    int64_t end = h_now_ms() + ms;
    for (int k = 0; k < 10000 && h_now_ms() < end; k++) {
        thaw_due(h_now_ms());
        partition_step(h_now_ms());
        sample_blobs();
        hp_locks_sample(&locks);
        reap_orphans();
        int64_t left = end - h_now_ms();
        h_sleep_ms(left > 100 ? 100 : left > 0 ? (int)left : 0);
    }
}

/* ---------- redis with persistence ---------- */

static int redis_pings(void *arg)
{
    (void)arg;
    redisReply *r = h_redis(&C.redis, "PING");
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    return ok;
}

static void redis_start(void)
{
    char port[16], log[400];
    snprintf(port, sizeof port, "%d", C.redis.port);
    snprintf(log, sizeof log, "%s/redis-%d.log", redis_dir, ++redis_runs);
    const char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "yes", "--appendfsync", "always", "--dir", redis_dir,
                          "--daemonize", "no", NULL};
    C.redis.pid = h_spawn(argv, log, NULL);
    assert_true(C.redis.pid > 0);
    assert_true(h_wait_until(redis_pings, NULL, 10000));
}

static void redis_restart(void)
{
    h_stop(C.redis.pid, 10000);
    if (C.redis.ctl) {
        redisFree(C.redis.ctl);
        C.redis.ctl = NULL;
    }
    pause_ms(rnd_in(100, 1000));
    redis_start();
}

/* ---------- serverdir copies and haproxy ---------- */

static void copy_start(int i)
{
    char listen[64], url[128], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", copies[i].port);
    snprintf(log, sizeof log, "%s/serverdir-%d-%d.log", redis_dir, i, ++copies[i].runs);
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", C.redis.url,
                          "--tokens", h_tokens_file(), "--threads", "4", NULL};
    copies[i].pid = h_spawn(argv, log, NULL);
    assert_true(copies[i].pid > 0);
    snprintf(url, sizeof url, "http://%s/healthz", listen);
    assert_true(h_wait_until(h_http_ok, url, slow(15000)));
}

static void haproxy_start(void)
{
    int fport = h_free_port(), sport = h_free_port();
    char env_front[80], env_stats[80], env_sd[3][80], log[400], url[160];
    snprintf(C.sd.url, sizeof C.sd.url, "http://127.0.0.1:%d", fport);
    snprintf(env_front, sizeof env_front, "SERVERDIR_FRONT=127.0.0.1:%d", fport);
    snprintf(env_stats, sizeof env_stats, "HAPROXY_STATS=127.0.0.1:%d", sport);
    /* the shipped config names three servers: the third is copy 1 again */
    for (int i = 0; i < 3; i++)
        snprintf(env_sd[i], sizeof env_sd[i], "SERVERDIR_%d=127.0.0.1:%d", i + 1,
                 copies[i % NCOPIES].port);
    const char *env[] = {env_front, env_stats, env_sd[0], env_sd[1], env_sd[2], NULL};
    snprintf(log, sizeof log, "%s/haproxy.log", redis_dir);
    const char *argv[] = {"haproxy", "-db", "-f", HAPROXY_CFG, NULL};
    haproxy_pid = h_spawn(argv, log, env);
    assert_true(haproxy_pid > 0);
    snprintf(url, sizeof url, "%s/readyz", C.sd.url);
    assert_true(h_wait_until(h_http_ok, url, 15000));
}

/* ---------- bigbrothers ---------- */

/* Each bigbrother's token is bound to its machine, the gameprocs' to the cluster: the
 * soak runs with the bindings a production fleet should use. */
static const char *const bb_tokens[NBB] = {H_TOK_BB_C1(1), H_TOK_BB_C1(2), H_TOK_BB_C1(3)};

static void bb_config(int i)
{
    bbt_t *b = &C.bb[i];
    snprintf(C.name[i], sizeof C.name[i], "m%d", i + 1);
    snprintf(b->dir, sizeof b->dir, "%s", h_tmpdir());
    snprintf(b->state, sizeof b->state, "%s/st", b->dir);
    snprintf(b->sock, sizeof b->sock, "%s/control.sock", b->state);
    snprintf(b->agent, sizeof b->agent, "%s/agent.sock", b->state);
    char *text = NULL;
    if (asprintf(&text,
                 "{\"machine\": \"%s\", \"cluster\": \"c1\", \"state_dir\": \"%s\","
                 " \"mode\": \"cluster\", \"capacity\": 100, \"labels\": {\"zone\": \"eu\"},"
                 " \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"},"
                 " \"lease_ttl_ms\": %d, \"primary_ttl_ms\": %d, \"log_keep\": 100,"
                 " \"log_runs\": 1000, \"placement_interval_ms\": 300,"
                 " \"assignment_wait_ms\": 2000, \"services\": []}",
                 C.name[i], b->state, C.sd.url, bb_tokens[i], slow(3000), slow(3000)) < 0)
        abort();
    snprintf(b->cfg, sizeof b->cfg, "%s", h_write_file(b->dir, "bb.json", text, 0644));
    free(text);
}

/* Not inlined: GCC's -Wrestrict misreads bbt_start's snprintf of one member of C.bb[i]
 * into another once the index is a random number. */
static __attribute__((noinline)) void bb_start(bbt_t *b)
{
    if (bbt_start(b) <= 0)
        fail_msg("bigbrother did not start (log %s)", b->log);
}

/* ---------- faults ---------- */

/* The partition in progress (bb -1: none). A cut runs beside the other faults, as a
 * frozen gameproc does: the main loop and pause_ms step it (partition_step). Until heal_at
 * (0 once healed) bigbrother bb is SIGSTOPped; at kill_at (0: none) one of its games is
 * killed; until watch_until its restarts are watched. */
static struct {
    int bb;
    int64_t kill_at, heal_at, watch_until;
    char id[NBB][40];
    hp_proc_t had[128]; /* its processes when it resumed */
    int nhad;
    pid_t counted[16];  /* its restarts already counted */
    int ncounted;
} cut = {.bb = -1};

/* Bigbrother i, or the next one when i is cut off: the faults that talk to a bigbrother
 * (its control or agent socket) leave the stopped one alone. */
static int reachable_bb(int i)
{
    return i == cut.bb ? (i + 1) % NBB : i;
}

/* What bigbrother i logged about its assignment, lease and spawns since it last resumed
 * from a pause (at most 60 lines), for the report of a violation on its return: CI keeps
 * only what the test prints. */
static void print_return_log(int i)
{
    static const char *const topics[] = {"assignment", "lease", "restart held", "held slot",
                                         "instance started", "instance stopp", "no live record",
                                         "resumed after a pause"};
    FILE *f = fopen(C.bb[i].log, "r");
    if (!f)
        return;
    char line[1024];
    long from = 0;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "supervision resumed after a pause"))
            from = ftell(f) - (long)strlen(line);
    fseek(f, from, SEEK_SET);
    print_message("m%d's log since it resumed (assignment, lease and spawn lines):\n", i + 1);
    for (int n = 0; n < 60 && fgets(line, sizeof(line), f);)
        for (size_t t = 0; t < sizeof(topics) / sizeof(topics[0]); t++)
            if (strstr(line, topics[t])) {
                print_message("  %s", line);
                n++;
                break;
            }
    fclose(f);
}

/* Restarts (generation above 1) the returning bigbrother made of a slot another machine
 * runs at the same time: it restarted a slot its assignment no longer holds, before
 * reading it. Each counted once. */
static void watch_return(void)
{
    hp_proc_t p[128];
    int n = hp_procs(SVC, cut.id, NBB, p, 128);
    for (int a = 0; a < n; a++) {
        int old = p[a].bb != cut.bb || p[a].generation < 2;
        for (int h = 0; h < cut.nhad && !old; h++)
            old = cut.had[h].pid == p[a].pid;
        for (int c = 0; c < cut.ncounted && !old; c++)
            old = cut.counted[c] == p[a].pid;
        for (int b = 0; b < n && !old; b++)
            if (p[b].bb != cut.bb && p[b].slot == p[a].slot && cut.ncounted < 16) {
                cut.counted[cut.ncounted++] = p[a].pid;
                returning_restarts++;
                print_message("VIOLATION m%d restarted %s (slot %d, generation %d, pid %d; "
                              "%d processes when it resumed) on its return while m%d runs "
                              "that slot\n", cut.bb + 1, p[a].instance, p[a].slot,
                              p[a].generation, (int)p[a].pid, cut.nhad, p[b].bb + 1);
                print_return_log(cut.bb);
                break;
            }
    }
}

/* SIGKILL of one of the cut-off bigbrother's games, at random (marked killed). */
static void partition_kill_game(void)
{
    hp_proc_t p[128];
    int n = hp_procs(SVC, cut.id, NBB, p, 128), mine = 0;
    for (int a = 0; a < n; a++)
        mine += p[a].bb == cut.bb;
    for (int a = 0, pick = mine ? rnd_in(1, mine) : 0; a < n && pick; a++)
        if (p[a].bb == cut.bb && --pick == 0) {
            json_object_set_new(hit, p[a].instance, json_string("kill"));
            kill(p[a].pid, SIGKILL);
            cut_kills++;
        }
}

/* partition: bigbrother i stopped (SIGSTOP) while its games run on: half the time for
 * less than its machine lease, else past it (its machine is declared lost, its slots
 * move); one time in two one of its games is killed during the cut. */
static void partition_start(int i, int64_t now)
{
    for (int b = 0; b < NBB; b++)
        if (hp_ident(C.bb[b].state, cut.id[b]))
            print_message("chaos: m%d has no bigbrother.id\n", b + 1);
    /* rnd_in(0, 99) < 50, not rnd_in(0, 1): xorshift's low bit, drawn every third number,
     * came out 0 five times in five in a run */
    int longer = rnd_in(0, 99) < 50,
        ms = longer ? slow(3000) + rnd_in(1000, 9000) : rnd_in(500, 2500);
    kill(C.bb[i].pid, SIGSTOP);
    cut.bb = i;
    cut.heal_at = now + ms;
    cut.kill_at = rnd_in(0, 99) < 50 ? now + rnd_in(0, ms) : 0;
    cut.nhad = cut.ncounted = 0;
    bb_cuts[i]++;
    cuts_long += longer;
}

/* The partition's schedule at now: the kill, the heal (SIGCONT), then 1.5 s of watching
 * the returning bigbrother's restarts. */
static void partition_step(int64_t now)
{
    if (cut.bb < 0)
        return;
    if (cut.kill_at && now >= cut.kill_at) {
        partition_kill_game();
        cut.kill_at = 0;
    }
    if (cut.heal_at && now >= cut.heal_at) {
        hp_proc_t p[128];
        int n = hp_procs(SVC, cut.id, NBB, p, 128);
        for (int a = 0; a < n; a++)
            if (p[a].bb == cut.bb)
                cut.had[cut.nhad++] = p[a];
        kill(C.bb[cut.bb].pid, SIGCONT);
        cut.heal_at = cut.kill_at = 0;
        cut.watch_until = now + 1500;
    }
    if (!cut.heal_at && now < cut.watch_until)
        watch_return();
    else if (!cut.heal_at)
        cut.bb = -1;
}


/* A random live gameproc of the service (pid > 0 and running) on bigbrother i (-1: a
 * random one); 0 if none. */
static pid_t pick_gameproc(int i, char *instance, size_t cap)
{
    if (i < 0)
        i = reachable_bb(rnd_in(0, NBB - 1));
    json_t *st = bbt_ctl(&C.bb[i], "status"), *in;
    size_t k, n = 0;
    pid_t pids[64];
    const char *ids[64];
    json_array_foreach(json_object_get(st, "instances"), k, in)
        if (n < 64 && !strcmp(bbt_str(in, "service"), SVC) && bbt_int(in, "pid") > 0 &&
            bbt_alive((pid_t)bbt_int(in, "pid"))) {
            pids[n] = (pid_t)bbt_int(in, "pid");
            ids[n++] = bbt_str(in, "instance");
        }
    pid_t pid = 0;
    if (n) {
        size_t pick = (size_t)(rnd() % n);
        pid = pids[pick];
        snprintf(instance, cap, "%s", ids[pick]);
    }
    json_decref(st);
    return pid;
}

static void thaw_due(int64_t now)
{
    for (int i = 0; i < nfrozen;) {
        if (frozen[i].cont_at <= now) {
            kill(frozen[i].pid, SIGCONT);
            frozen[i] = frozen[--nfrozen];
        } else {
            i++;
        }
    }
}

/* Kills bigbrother i and counts it. */
static void bb_kill(int i)
{
    kill(C.bb[i].pid, SIGKILL);
    h_stop(C.bb[i].pid, 2000);
    bb_kills[i]++;
}

/* state_damage: bigbrother i dies, its state.json is deleted, cut in half or overwritten
 * in the middle, and it restarts soon after. */
static void state_damage(int i)
{
    bb_kill(i);
    char path[400];
    snprintf(path, sizeof path, "%s/state.json", C.bb[i].state);
    int how = rnd_in(0, 2);
    int fd = open(path, O_RDWR);
    off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : 0;
    if (how == 0 || fd < 0) {
        unlink(path);
    } else if (how == 1) {
        if (ftruncate(fd, size / 2))
            print_message("chaos: cannot truncate %s\n", path);
    } else {
        static const char junk[] = "\x01{]\"\xff#";
        if (pwrite(fd, junk, sizeof junk - 1, size / 2) < 0)
            print_message("chaos: cannot damage %s\n", path);
    }
    if (fd >= 0)
        close(fd);
    pause_ms(rnd_in(50, 800));
    bb_start(&C.bb[i]);
}

static void flood_release(void)
{
    for (int k = 0; k < nflood; k++)
        close(flood_fds[k]);
    nflood = 0;
}

/* agent_flood: FLOOD idle connections on bigbrother i's agent socket (SOCK_SEQPACKET),
 * then one of its instances killed: its restart must register and become ready through
 * the flood. */
static void agent_flood(int i)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", C.bb[i].agent);
    for (int k = 0; k < FLOOD; k++) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            break;
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            if (!flood_refused)
                print_message("chaos: agent_flood: connect %s: %s\n", sa.sun_path,
                              strerror(errno));
            flood_refused++;
            close(fd);
            continue;
        }
        flood_fds[nflood++] = fd;
    }
    char inst[128];
    pid_t pid = pick_gameproc(i, inst, sizeof inst);
    if (pid) {
        json_object_set_new(hit, inst, json_string("kill"));
        kill(pid, SIGKILL);
    }
}

/* One request as `token` with up to two extra headers to the haproxy front; the status
 * (0 when it could not be sent), the JSON answer in *out when out is not NULL. */
static long stale_call(const char *method, const char *path, const char *token,
                       const char *h1, const char *h2, const char *body, size_t len,
                       json_t **out)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", C.sd.url, path);
    const char *hdrs[] = {h1, h2, NULL};
    h_resp_t r = {0};
    long st = h_http(method, url, token, h1 && !strncmp(h1, "Lock-Seq", 8)
                                              ? "application/octet-stream" : NULL,
                     body, len, hdrs, &r) == 0 ? r.status : 0;
    if (out)
        *out = st ? h_resp_json(&r) : NULL;
    h_resp_free(&r);
    return st;
}

/* A grant of key for holder (steal: a steal_if_older_than_ms of 1); 0 and *seq, tok on
 * success. */
static int stale_grant(const char *key, const char *holder, int steal, long long *seq,
                       char *tok, size_t cap)
{
    char path[128], body[160];
    snprintf(path, sizeof path, "/v1/locks/%s", key);
    snprintf(body, sizeof body, "{\"holder\": \"%s\", \"wait_ms\": 2000%s}", holder,
             steal ? ", \"steal_if_older_than_ms\": 1" : "");
    json_t *j = NULL;
    long st = stale_call("PUT", path, H_TOK_GAME, NULL, NULL, body, strlen(body), &j);
    int ok = st == 200 && json_is_string(json_object_get(j, "lock_token"));
    if (ok) {
        *seq = json_integer_value(json_object_get(j, "lock_seq"));
        snprintf(tok, cap, "%s", json_string_value(json_object_get(j, "lock_token")));
    }
    json_decref(j);
    return ok ? 0 : -1;
}

/* A save of key under (seq, tok) with Blob-Seq bs; the status. */
static long stale_save(const char *key, long long seq, const char *tok, long long bs,
                       const char *data)
{
    char path[128], h1[64], h2[96];
    snprintf(path, sizeof path, "/v1/blobs/%s", key);
    snprintf(h1, sizeof h1, "Lock-Seq: %lld", seq);
    snprintf(h2, sizeof h2, "Blob-Seq: %lld", bs);
    char h3[96];
    snprintf(h3, sizeof h3, "Lock-Token: %s", tok);
    char url[512];
    snprintf(url, sizeof url, "%s%s", C.sd.url, path);
    const char *hdrs[] = {h1, h2, tok ? h3 : NULL, NULL};
    h_resp_t r = {0};
    long st = h_http("PUT", url, H_TOK_GAME, "application/octet-stream", data, strlen(data),
                     hdrs, &r) == 0 ? r.status : 0;
    h_resp_free(&r);
    return st;
}

/* A stale holder's attempt answered `st`: refused (4xx), accepted (a violation) or lost
 * in the chaos (5xx, no answer). */
static void stale_attempt(long st, const char *what, const char *key)
{
    if (st >= 200 && st < 300) {
        stale_accepted++;
        print_message("VIOLATION stale holder's %s of %s accepted (%ld)\n", what, key, st);
    } else if (st >= 400 && st < 500) {
        stale_refused++;
    }
}

/* stale_holder: (1) the test holds stale:K as A, is force-unlocked, B takes it and saves;
 * A retries its save with its own grant, with the public lock_seq (read from the lock)
 * and its token, without a token, and tries to renew and release as B; none may pass, and
 * B's data must be intact. (2) A thief steals a random player key from the gameproc that
 * holds it (steal_if_older_than_ms), saves the same progress and releases: the gameproc
 * goes on as a stale holder retrying its saves (the blobs invariant checks they fail). */
static void stale_holder(void)
{
    static long long next_bs = 1;
    int n = faults;
    char key[32], a[48], b[48], tok_a[64], tok_b[64], path[160], body[256];
    long long seq_a, seq_b;
    snprintf(key, sizeof key, "stale:%d", rnd_in(1, 4));
    snprintf(a, sizeof a, "stale-a-%d", n);
    snprintf(b, sizeof b, "stale-b-%d", n);
    stale_stories++;
    if (stale_grant(key, a, 1, &seq_a, tok_a, sizeof tok_a) ||
        stale_save(key, seq_a, tok_a, next_bs++, "A") != 200) {
        stale_incomplete++;
        goto thief;
    }
    snprintf(path, sizeof path, "/v1/locks/%s?force=true", key);
    if (stale_call("DELETE", path, H_TOK_OPS, NULL, NULL, NULL, 0, NULL) != 200 ||
        stale_grant(key, b, 0, &seq_b, tok_b, sizeof tok_b)) {
        stale_incomplete++;
        goto thief;
    }
    char bdata[64];
    snprintf(bdata, sizeof bdata, "B-%d", n);
    long long bs_b = next_bs++;
    if (stale_save(key, seq_b, tok_b, bs_b, bdata) != 200) {
        stale_incomplete++;
        goto thief;
    }
    /* A's naive retries: its grant; the public lock_seq with its token; no token. */
    stale_attempt(stale_save(key, seq_a, tok_a, next_bs++, "A-late"), "save", key);
    json_t *j = NULL;
    snprintf(path, sizeof path, "/v1/locks/%s", key);
    long long pub = stale_call("GET", path, H_TOK_GAME, NULL, NULL, NULL, 0, &j) == 200
                        ? json_integer_value(json_object_get(j, "lock_seq")) : seq_b;
    json_decref(j);
    stale_attempt(stale_save(key, pub, tok_a, next_bs++, "A-forged"), "save", key);
    stale_attempt(stale_save(key, pub, NULL, next_bs++, "A-notoken"), "save", key);
    snprintf(path, sizeof path, "/v1/locks/%s/renew", key);
    snprintf(body, sizeof body, "{\"holder\": \"%s\", \"lock_seq\": %lld, \"lock_token\": \"%s\"}",
             b, pub, tok_a);
    stale_attempt(stale_call("POST", path, H_TOK_GAME, NULL, NULL, body, strlen(body), NULL),
                  "renew", key);
    char th[96];
    snprintf(th, sizeof th, "Lock-Token: %s", tok_a);
    snprintf(path, sizeof path, "/v1/locks/%s?holder=%s&lock_seq=%lld", key, b, pub);
    stale_attempt(stale_call("DELETE", path, H_TOK_GAME, th, NULL, NULL, 0, NULL), "release",
                  key);
    /* B's data stands (a 5xx read in the chaos proves nothing either way). */
    char url[512];
    snprintf(url, sizeof url, "%s/v1/blobs/%s", C.sd.url, key);
    h_resp_t r = {0};
    if (h_http("GET", url, H_TOK_GAME, NULL, NULL, 0, NULL, &r) == 0 && r.status == 200 &&
        (r.len != strlen(bdata) || memcmp(r.body, bdata, r.len))) {
        stale_overwritten++;
        print_message("VIOLATION %s holds '%.*s' after B saved '%s'\n", key, (int)r.len,
                      r.body ? r.body : "", bdata);
    }
    h_resp_free(&r);
    snprintf(th, sizeof th, "Lock-Token: %s", tok_b);
    snprintf(path, sizeof path, "/v1/locks/%s?holder=%s&lock_seq=%lld", key, b, seq_b);
    stale_call("DELETE", path, H_TOK_GAME, th, NULL, NULL, 0, NULL);

thief:;
    /* The thief reads the player's blob under its grant and saves it back unchanged, so
     * the game's progress is kept; the gameproc it took the key from is now stale. */
    char pkey[32], thief[48], tok[64];
    long long seq;
    snprintf(pkey, sizeof pkey, "player:%d", rnd_in(1, NKEYS));
    snprintf(thief, sizeof thief, "thief-%d", n);
    if (stale_grant(pkey, thief, 1, &seq, tok, sizeof tok))
        return;
    stale_thefts++;
    char url2[512], h1[64], h2[96], bsv[32] = "";
    snprintf(url2, sizeof url2, "%s/v1/blobs/%s", C.sd.url, pkey);
    snprintf(h1, sizeof h1, "Lock-Seq: %lld", seq);
    snprintf(h2, sizeof h2, "Lock-Token: %s", tok);
    const char *hdrs[] = {h1, h2, NULL};
    h_resp_t rr = {0};
    if (h_http("GET", url2, H_TOK_GAME, NULL, NULL, 0, hdrs, &rr) == 0 && rr.status == 200 &&
        h_resp_header(&rr, "Blob-Seq", bsv, sizeof bsv) == 0 && rr.body) {
        char *data = strndup(rr.body, rr.len);
        stale_save(pkey, seq, tok, strtoll(bsv, NULL, 10) + 1, data);
        free(data);
    }
    h_resp_free(&rr);
    snprintf(path, sizeof path, "/v1/locks/%s?holder=%s&lock_seq=%lld", pkey, thief, seq);
    stale_call("DELETE", path, H_TOK_GAME, h2, NULL, NULL, 0, NULL);
}

/* The first NKINDS faults are the kinds in a seeded order, so every run exercises each
 * kind; then kinds are drawn with fault_weights. */
static void inject(void)
{
    static int order[NKINDS], shuffled;
    if (!shuffled) {
        for (int k = 0; k < NKINDS; k++)
            order[k] = k;
        for (int k = NKINDS - 1; k > 0; k--) {
            int j = rnd_in(0, k), t = order[k];
            order[k] = order[j];
            order[j] = t;
        }
        shuffled = 1;
    }
    flood_release();
    int r = rnd_in(0, 99), kind = 0;
    for (int acc = fault_weights[0]; r >= acc && kind < NKINDS - 1;)
        acc += fault_weights[++kind];
    if (faults < NKINDS)
        kind = order[faults];
    char inst[128];
    pid_t pid;
    switch (kind) {
    case 0:
    case 1:
        pid = pick_gameproc(-1, inst, sizeof inst);
        if (!pid || (kind == 1 && nfrozen == MAXFROZEN))
            return;
        json_object_set_new(hit, inst, json_string(kind ? "stop" : "kill"));
        if (kind == 0) {
            kill(pid, SIGKILL);
        } else {
            kill(pid, SIGSTOP);
            frozen[nfrozen].pid = pid;
            frozen[nfrozen++].cont_at = h_now_ms() + rnd_in(300, 2500);
        }
        break;
    case 2: {
        int i = reachable_bb(rnd_in(0, NBB - 1));
        bb_kill(i);
        /* one time in three it stays down past its machine lease: the primary (another
         * one if it was the primary) declares the machine lost and moves its slots; on
         * its return it stops its old instances (replaced) */
        pause_ms(rnd_in(0, 2) ? rnd_in(50, 800) : slow(3000) + rnd_in(500, 2000));
        bb_start(&C.bb[i]);
        break;
    }
    case 3:
        redis_restart();
        break;
    case 4: {
        int i = rnd_in(0, NCOPIES - 1);
        kill(copies[i].pid, SIGKILL);
        h_stop(copies[i].pid, 2000);
        pause_ms(rnd_in(100, 1500));
        copy_start(i);
        break;
    }
    case 5:
        state_damage(reachable_bb(rnd_in(0, NBB - 1)));
        break;
    case 6:
        agent_flood(reachable_bb(rnd_in(0, NBB - 1)));
        break;
    case 7:
        stale_holder();
        break;
    default:
        if (cut.bb >= 0)
            return; /* one cut at a time */
        partition_start(rnd_in(0, NBB - 1), h_now_ms());
        break;
    }
    faults++;
    faults_by[kind]++;
}

/* Blob-Seq of every player key, straight from Redis (no effect on the system). */
static void sample_blobs(void)
{
    for (int k = 1; k <= NKEYS; k++) {
        redisReply *r = h_redis(&C.redis, "HMGET sd:blob:player:%d seq lock_seq", k);
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            r->element[0]->type == REDIS_REPLY_STRING &&
            r->element[1]->type == REDIS_REPLY_STRING) {
            long long seq = strtoll(r->element[0]->str, NULL, 10),
                      lseq = strtoll(r->element[1]->str, NULL, 10);
            blob_samples++;
            if (seq < blob_max[k]) {
                blob_backwards++;
                print_message("VIOLATION blob player:%d Blob-Seq %lld after %lld\n", k, seq,
                              blob_max[k]);
            }
            if (lseq < blob_lock_max[k]) {
                blob_lock_backwards++;
                print_message("VIOLATION blob player:%d saved under lock_seq %lld after a save "
                              "under %lld\n", k, lseq, blob_lock_max[k]);
            }
            if (seq > blob_max[k])
                blob_max[k] = seq;
            if (lseq > blob_lock_max[k])
                blob_lock_max[k] = lseq;
        }
        if (r)
            freeReplyObject(r);
        else
            break; /* redis restarting */
    }
}

/* ---------- what the system shows ---------- */

/* The whole history (oldest first), as a new array; NULL on failure. */
static json_t *history(void)
{
    json_t *all = json_array();
    char since[64] = "0-0";
    for (int page = 0; page < 200; page++) {
        char url[256];
        snprintf(url, sizeof url, "%s%s/events?limit=1000&since=%s", C.sd.url, CL_BASE, since);
        long st = 0;
        json_t *j = cl_api("GET", url, NULL, &st), *evs = json_object_get(j, "events"), *e;
        if (st != 200) {
            json_decref(j);
            json_decref(all);
            return NULL;
        }
        size_t i;
        json_array_foreach(evs, i, e) json_array_append(all, e);
        size_t n = json_array_size(evs);
        const char *last = json_string_value(json_object_get(j, "last"));
        if (last)
            snprintf(since, sizeof since, "%s", last);
        json_decref(j);
        if (n == 0)
            return all;
    }
    return all;
}

/* Outbox ids missing from the history and ids the history holds twice. */
typedef struct {
    int outbox, missing, dups, history, status;
} delivery_t;

static int delivery(delivery_t *d, int verbose)
{
    memset(d, 0, sizeof *d);
    json_t *h = history();
    if (!h)
        return -1;
    json_t *seen = json_object(), *e;
    size_t i;
    json_array_foreach(h, i, e) {
        const char *id = bbt_str(e, "id");
        if (!id[0])
            continue;
        d->history++;
        if (json_object_get(seen, id)) {
            d->dups++;
            if (verbose)
                print_message("VIOLATION event %s twice in the history\n", id);
        }
        json_object_set_new(seen, id, json_true());
    }
    for (int b = 0; b < NBB; b++) {
        json_t *evs = bbt_events(&C.bb[b]);
        json_array_foreach(evs, i, e) {
            d->outbox++;
            /* status events (the game's load figures) are applied without a history
             * entry: their id's idempotency record proves serverdir took them */
            int taken;
            if (!strcmp(bbt_str(e, "type"), "status")) {
                redisReply *r = h_redis(&C.redis, "EXISTS sd:{c1}:evid:%s", bbt_str(e, "id"));
                taken = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
                if (r)
                    freeReplyObject(r);
                d->status++;
            } else {
                taken = json_object_get(seen, bbt_str(e, "id")) != NULL;
            }
            if (!taken) {
                d->missing++;
                if (verbose)
                    print_message("VIOLATION outbox event %s of m%d (%s %s) not in the history\n",
                                  bbt_str(e, "id"), b + 1, bbt_str(e, "type"),
                                  bbt_str(e, "instance"));
            }
        }
        json_decref(evs);
    }
    json_decref(seen);
    json_decref(h);
    return 0;
}

static int settled(cl_t *c, void *arg)
{
    (void)arg;
    cl_conv_t w = {SVC, nprocs, 0};
    delivery_t d;
    return cl_converged(c, &w) && delivery(&d, 0) == 0 && d.missing == 0;
}

/* Directory vs real processes: violations counted and printed. */
static int directory_mismatches(int *live_records, int *running)
{
    int bad = 0;
    json_t *st[NBB];
    for (int b = 0; b < NBB; b++)
        st[b] = bbt_ctl(&C.bb[b], "status");
    json_t *dir = cl_get(&C, "/processes?service=" SVC), *p, *in;
    size_t i, k;
    json_t *live = json_object();
    *live_records = *running = 0;
    json_array_foreach(json_object_get(dir, "processes"), i, p) {
        const char *state = bbt_str(p, "state");
        if (strcmp(state, "ready") && strcmp(state, "starting"))
            continue;
        (*live_records)++;
        json_object_set_new(live, bbt_str(p, "instance"), json_true());
        pid_t pid = (pid_t)bbt_int(p, "pid");
        int b = cl_index(&C, bbt_str(p, "machine")), owned = 0;
        if (b >= 0)
            json_array_foreach(json_object_get(st[b], "instances"), k, in)
                owned |= !strcmp(bbt_str(in, "instance"), bbt_str(p, "instance")) &&
                         bbt_int(in, "pid") == pid;
        if (pid <= 0 || !bbt_alive(pid) || !owned) {
            bad++;
            print_message("VIOLATION directory record %s (%s, pid %d on %s): %s\n",
                          bbt_str(p, "instance"), state, (int)pid, bbt_str(p, "machine"),
                          owned ? "pid not running" : "not owned by that bigbrother");
        }
    }
    for (int b = 0; b < NBB; b++) {
        json_array_foreach(json_object_get(st[b], "instances"), k, in) {
            pid_t pid = (pid_t)bbt_int(in, "pid");
            if (strcmp(bbt_str(in, "service"), SVC) || pid <= 0 || !bbt_alive(pid))
                continue;
            (*running)++;
            if (!json_object_get(live, bbt_str(in, "instance"))) {
                bad++;
                print_message("VIOLATION m%d runs %s (pid %d) but the directory has no live "
                              "record of it\n", b + 1, bbt_str(in, "instance"), (int)pid);
            }
        }
        json_decref(st[b]);
    }
    json_decref(live);
    json_decref(dir);
    return bad;
}

/* Processes carrying one of the bigbrothers' identities (BB_SUPERVISOR in their
 * environment, as bigbrother spawns them) that their bigbrother does not list: doubles
 * started beside a lost instance, or orphans left running unsupervised. *found gets how
 * many carry an identity. */
static int unsupervised(int *found)
{
    char want[NBB][80];
    json_t *st[NBB];
    for (int b = 0; b < NBB; b++) {
        char path[400], id[64] = "";
        snprintf(path, sizeof path, "%s/bigbrother.id", C.bb[b].state);
        FILE *f = fopen(path, "r");
        if (f && fgets(id, sizeof id, f))
            id[strcspn(id, "\r\n")] = '\0';
        if (f)
            fclose(f);
        assert_int_equal(strlen(id), 32);
        snprintf(want[b], sizeof want[b], "BB_SUPERVISOR=%s", id);
        st[b] = bbt_ctl(&C.bb[b], "status");
    }
    int bad = 0;
    *found = 0;
    DIR *d = opendir("/proc");
    assert_non_null(d);
    static char env[1 << 16];
    for (struct dirent *de; (de = readdir(d));) {
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid <= 0)
            continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, env, sizeof env - 1);
        close(fd);
        if (n <= 0)
            continue;
        env[n] = '\0';
        for (int b = 0; b < NBB; b++) {
            int has = 0;
            for (ssize_t off = 0; off < n && !has; off += (ssize_t)strlen(env + off) + 1)
                has = !strcmp(env + off, want[b]);
            if (!has || !bbt_alive(pid))
                continue;
            (*found)++;
            int listed = 0;
            size_t k;
            json_t *in;
            json_array_foreach(json_object_get(st[b], "instances"), k, in)
                listed |= bbt_int(in, "pid") == pid;
            if (!listed) {
                bad++;
                print_message("VIOLATION pid %d carries m%d's identity but m%d does not "
                              "supervise it\n", (int)pid, b + 1, b + 1);
            }
        }
    }
    closedir(d);
    for (int b = 0; b < NBB; b++)
        json_decref(st[b]);
    return bad;
}

/* Value of `key=` in a logfmt line into out (quotes stripped); 0 if found. */
static int logfmt_get(const char *line, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    int quoted = *p == '"';
    p += quoted;
    size_t n = quoted ? strcspn(p, "\"") : strcspn(p, " \n");
    if (n >= cap)
        return -1;
    memcpy(out, p, n);
    out[n] = 0;
    return 0;
}

/* Lock grants ("player joined key=K lock_seq=S") from every gameproc log: every instance's
 * log file and its rotations (logs/<SVC>-<slot>/<instance>.log[.N]), attributed to the
 * instance the file belongs to; a (key, lock_seq) granted to two instances is a
 * violation, and so is a file holding the spawn header of another instance. */
static int lock_violations(int *grants)
{
    json_t *holder = json_object();
    int bad = 0;
    *grants = 0;
    for (int b = 0; b < NBB; b++) {
        char pattern[420];
        snprintf(pattern, sizeof pattern, "%s/logs/%s-*/*.log*", C.bb[b].state, SVC);
        glob_t g;
        if (glob(pattern, 0, NULL, &g))
            continue;
        for (size_t k = 0; k < g.gl_pathc; k++) {
            const char *name = strrchr(g.gl_pathv[k], '/') + 1;
            char cur[200];
            snprintf(cur, sizeof cur, "%.*s", (int)(strstr(name, ".log") - name), name);
            FILE *f = fopen(g.gl_pathv[k], "r");
            char line[4096], head[220];
            snprintf(head, sizeof head, "starting instance %s ", cur);
            while (f && fgets(line, sizeof line, f)) {
                const char *s = strstr(line, "starting instance ");
                if (!strncmp(line, "=== bigbrother", 14) && s) {
                    if (strncmp(s, head, strlen(head))) {
                        bad++;
                        print_message("VIOLATION %s holds another run: %s", g.gl_pathv[k], line);
                    }
                    continue;
                }
                char key[128], seq[32], k2[200];
                if (!strstr(line, "player joined") || logfmt_get(line, "key", key, sizeof key) ||
                    logfmt_get(line, "lock_seq", seq, sizeof seq))
                    continue;
                (*grants)++;
                snprintf(k2, sizeof k2, "%s#%s", key, seq);
                const char *prev = json_string_value(json_object_get(holder, k2));
                if (prev && strcmp(prev, cur)) {
                    bad++;
                    print_message("VIOLATION %s lock_seq %s granted to %s and to %s\n", key,
                                  seq, prev, cur);
                } else if (!prev) {
                    json_object_set_new(holder, k2, json_string(cur));
                }
            }
            if (f)
                fclose(f);
        }
        globfree(&g);
    }
    json_decref(holder);
    return bad;
}

/* Stopped events in the history not explained by an injected fault. */
static int unexplained_stops(int *stops)
{
    json_t *h = history(), *e;
    assert_non_null(h);
    int bad = 0;
    size_t i;
    *stops = 0;
    json_array_foreach(h, i, e) {
        if (strcmp(bbt_str(e, "type"), "stopped"))
            continue;
        (*stops)++;
        const char *inst = bbt_str(e, "instance"), *reason = bbt_str(e, "reason");
        int b = cl_index(&C, bbt_str(e, "machine"));
        /* killed: SIGKILL seen by its bigbrother (killed, signal 9), or its death seen at
         * re-adoption after a bigbrother restart (exited, status unknown); frozen: hung if
         * a slow fault step kept it frozen past the liveness timeout; any instance of a
         * machine whose bigbrother was killed or cut off: machine_lost, or replaced on its
         * return. */
        const char *how = json_string_value(json_object_get(hit, inst));
        int ok = (how && !strcmp(how, "kill") &&
                  ((!strcmp(reason, "killed") && bbt_int(e, "signal") == SIGKILL) ||
                   (!strcmp(reason, "exited") && strstr(bbt_str(e, "detail"), "re-adopted")))) ||
                 (how && !strcmp(how, "stop") && !strcmp(reason, "hung")) ||
                 ((!strcmp(reason, "machine_lost") || !strcmp(reason, "replaced") ||
                   !strcmp(reason, "orphaned")) &&
                  b >= 0 && (bb_kills[b] > 0 || bb_cuts[b] > 0));
        if (!ok) {
            bad++;
            print_message("VIOLATION %s stopped (reason %s, signal %lld, code %lld, detail %s) "
                          "with no fault to explain it\n",
                          inst, reason, bbt_int(e, "signal"), bbt_int(e, "code"),
                          bbt_str(e, "detail"));
        }
    }
    json_decref(h);
    return bad;
}

/* ---------- the soak ---------- */

static void chaos_soak(void **state)
{
    (void)state;
    const char *s = getenv("SD_CHAOS_SEED");
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    rng = s && *s ? strtoull(s, NULL, 0)
                  : ((uint64_t)wall.tv_nsec ^ (uint64_t)wall.tv_sec * 1000003u ^
                     (uint64_t)getpid() << 32) % 1000000000000u;
    if (!rng)
        rng = 1;
    uint64_t seed = rng;
    const char *secs = getenv("SD_CHAOS_SECONDS");
    int seconds = secs && *secs ? atoi(secs) : h_valgrind() ? 30 : 40;
    nprocs = h_valgrind() ? 6 : 12;
    /* Odd seeds: the games present the shared game token, so the lock table itself must
     * refuse a cut-off machine's games once the directory records them stopped; even
     * seeds: their instance credentials, which stop working then. */
    const char *cred = seed % 2 ? "off" : "prefer";
    print_message("chaos: seed=%llu seconds=%d gameprocs=%d credential=%s (SD_CHAOS_SEED=%llu "
                  "reproduces the fault sequence)\n",
                  (unsigned long long)seed, seconds, nprocs, cred, (unsigned long long)seed);
    hit = json_object();
    hp_locks_init(&locks, &C.redis, NKEYS);

    snprintf(redis_dir, sizeof redis_dir, "%s", h_tmpdir());
    C.redis.port = h_free_port();
    snprintf(C.redis.url, sizeof C.redis.url, "redis://127.0.0.1:%d/0", C.redis.port);
    redis_start();
    for (int i = 0; i < NCOPIES; i++) {
        copies[i].port = h_free_port();
        copy_start(i);
    }
    haproxy_start();
    C.n = NBB;
    for (int i = 0; i < NBB; i++) {
        bb_config(i);
        bb_start(&C.bb[i]);
    }
    char args[512];
    snprintf(args, sizeof args,
             "[\"--tick-hz\", \"10\", \"--serverdir\", \"%s\", \"--token\", \"%s\","
             " \"--players\", \"2\", \"--player-keys\", \"1-%d\", \"--save-every-ms\", \"500\","
             " \"--session-s\", \"4\", \"--credential\", \"%s\"]",
             C.sd.url, H_TOK_GAME_OF_C1, NKEYS, cred);
    assert_int_equal(cl_service(&C, SVC, nprocs, args, NULL), 200);
    cl_conv_t w = {SVC, nprocs, 0};
    assert_true(cl_wait(&C, cl_converged, &w, slow(40000)));

    /* chaos */
    int64_t t0 = h_now_ms(), end = t0 + seconds * 1000LL;
    int64_t next = t0 + rnd_in(300, 1200);
    int gap_lo = h_valgrind() ? 1500 : 600, gap_hi = h_valgrind() ? 3000 : 1600;
    for (int it = 0; it < 100000 && h_now_ms() < end; it++) {
        int64_t now = h_now_ms();
        thaw_due(now);
        partition_step(now);
        if (now >= next) {
            inject();
            next = h_now_ms() + rnd_in(gap_lo, gap_hi);
        }
        sample_blobs();
        hp_locks_sample(&locks);
        reap_orphans();
        allocate_some();
        h_sleep_ms(100);
    }
    thaw_due(INT64_MAX);
    if (cut.heal_at)
        cut.heal_at = h_now_ms();
    pause_ms(1600); /* the last cut heals and is watched */
    flood_release();
    print_message("chaos: %d faults in %lld ms:", faults, (long long)(h_now_ms() - t0));
    for (int k = 0; k < NKINDS; k++)
        print_message(" %s=%d", fault_names[k], faults_by[k]);
    print_message("\n");

    /* settle */
    int64_t t1 = h_now_ms();
    int ok = cl_wait(&C, settled, NULL, slow(45000));
    print_message("chaos: settled=%s after %lld ms\n", ok ? "yes" : "NO",
                  (long long)(h_now_ms() - t1));
    sample_blobs();
    /* the locks of the last stopped holders are freed after the lock delay (5 s) */
    pause_ms(6000);
    int stuck = hp_locks_stuck(&locks);

    /* invariants */
    int ready = cl_dir_count(&C, SVC, "ready", NULL), live = 0, running = 0, grants = 0,
        stops = 0;
    int mism = directory_mismatches(&live, &running);
    int v_desired = (ready != nprocs) + (live != nprocs) + (running != nprocs);
    delivery_t d;
    assert_int_equal(delivery(&d, 1), 0);
    int v_locks = lock_violations(&grants);
    int v_stops = unexplained_stops(&stops);
    int carrying = 0, v_procs = unsupervised(&carrying);
    long long saved_keys = 0;
    for (int k = 1; k <= NKEYS; k++)
        saved_keys += blob_max[k] > 0;
    int listed = 0, lost = 0, v_allocs = double_allocations(&listed, &lost);
    int violations = v_desired + mism + d.missing + d.dups + v_locks + (int)blob_backwards +
                     (int)blob_lock_backwards + v_stops + v_procs + stale_accepted +
                     stale_overwritten + v_allocs + (listed < nallocs) +
                     (int)locks.stopped_grants + (int)locks.stale_saves + (stuck > 0 ? stuck : 0) +
                     returning_restarts;
    print_message("faults=%d violations=%d seed=%llu\n", faults, violations,
                  (unsigned long long)seed);
    print_message("desired: want=%d ready_in_directory=%d live_records=%d running=%d "
                  "violations=%d\n", nprocs, ready, live, running, v_desired);
    print_message("directory: live_records=%d running=%d mismatches=%d\n", live, running, mism);
    print_message("outbox: events=%d (status %d) history=%d missing=%d duplicates=%d\n",
                  d.outbox, d.status, d.history, d.missing, d.dups);
    print_message("locks: grants=%d same_seq_two_holders=%d\n", grants, v_locks);
    print_message("blobs: samples=%lld keys_saved=%lld seq_went_down=%lld "
                  "lock_seq_went_down=%lld\n",
                  blob_samples, saved_keys, blob_backwards, blob_lock_backwards);
    print_message("stops: stopped_events=%d unexplained=%d\n", stops, v_stops);
    print_message("processes: carrying_identity=%d unsupervised=%d\n", carrying, v_procs);
    print_message("stale: stories=%d incomplete=%d refused=%d accepted=%d overwritten=%d "
                  "thefts=%d\n",
                  stale_stories, stale_incomplete, stale_refused, stale_accepted,
                  stale_overwritten, stale_thefts);
    print_message("agent_flood: connections_refused=%d\n", flood_refused);
    print_message("partition: cuts=%d past_lease=%d games_killed=%d lock_samples=%lld "
                  "grants=%lld saves=%lld stopped_grants=%lld stopped_saves=%lld "
                  "stale_saves=%lld stuck_locks=%d returning_restarts=%d\n",
                  faults_by[8], cuts_long, cut_kills, locks.samples, locks.grants, locks.saves,
                  locks.stopped_grants, locks.stopped_saves, locks.stale_saves, stuck,
                  returning_restarts);
    print_message("allocations: tries=%d allocated=%d no_capacity=%d errors=%d deleted=%d "
                  "listed=%d allocation_lost=%d held_twice=%d\n",
                  alloc_tries, nallocs, alloc_none, alloc_errors, alloc_deleted, listed, lost,
                  v_allocs);
    assert_true(d.history < 10000); /* the history (history_max 10000) was not trimmed */
    assert_true(grants > 0 && saved_keys > 0 && d.outbox > 0 && nallocs > 0);
    assert_int_equal(violations, 0);

    for (int i = 0; i < NBB; i++) {
        json_decref(bbt_ctl(&C.bb[i], "stop all"));
        h_stop(C.bb[i].pid, slow(10000));
    }
    h_stop(haproxy_pid, 2000);
    for (int i = 0; i < NCOPIES; i++)
        h_stop(copies[i].pid, slow(5000));
    h_stop(C.redis.pid, 5000);
    json_decref(hit);
}

int main(void)
{
    const char *secs = getenv("SD_CHAOS_SECONDS");
    int seconds = secs && *secs ? atoi(secs) : 40;
    h_init((h_valgrind() ? 280 : 150) + seconds);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chaos_soak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
