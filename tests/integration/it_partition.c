/* Partitions (issue 30): a machine cut off from serverdir while its games run on. Two
 * bigbrothers in cluster mode (m1, m2; leases of 3 s), a service `zone` of 4 gameprocs
 * whose players lock player:1..16 and save every 300 ms (a session of about 4 s, so players
 * keep leaving and joining during a cut). The games present the shared game token
 * (--credential off): an instance credential stops working when the directory records
 * the instance stopped, but the lock table must refuse a stopped holder by itself, for
 * the games that run without one. Two cuts of CUT_MS each, then the heal:
 *   1. m2 (not the primary): its bigbrother SIGSTOPped; its games still reach serverdir;
 *   2. the primary: its machine's network namespace loses its link to serverdir (the veth
 *      taken down) when the suite may create namespaces (root, `ip netns`), else its
 *      bigbrother SIGSTOPped; the method that ran is printed.
 * During each cut one of the cut machine's games is killed: the first one granted a lock
 * after the directory recorded it stopped, as soon as it is seen, else any at KILL_AT_MS.
 * Its bigbrother learns of the death only after the heal (a stop report the directory
 * takes as stale: the locks of that grant must still be freed).
 *
 * Invariants, sampled every 100 ms from /proc and Redis (harness_partition.h) and checked
 * at the end of each cut:
 *   slot_doubles       a slot run by two processes outside the declared overlap: with
 *                      today's defaults (disconnect.reconcile keep_replacement) the cut
 *                      machine's copies may run beside their replacements from the cut
 *                      until OVERLAP_MS after the heal (its bigbrother reads its assignment
 *                      and stops them within their stop grace of 3 s), no longer
 *   returning_restarts a process the cut machine started after the heal for a slot that
 *                      runs elsewhere (it must read its assignment first)
 *   stale_saves        a save accepted from a process that was no longer the key's holder
 *   stopped_grants     a lock granted to a holder the directory had recorded stopped
 *   lost_events        an event of a bigbrother's outbox missing from the history
 *   stuck_locks        a lock still held by a stopped holder LOCK_DELAY_MS after the heal
 * and the convergence time (heal to 4 ready, 4 running, nothing more) is printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness_cluster.h"
#include "harness_partition.h"

#define SVC "zone"
#define NPROCS 4
#define NKEYS 16
#define CUT_MS 12000
#define KILL_AT_MS 10000
#define OVERLAP_MS 4000
#define LOCK_DELAY_MS 5000 /* locks.stop_lock_delay_ms's default */
#define MAXP 512

static cl_t C;
static hp_locks_t L;
static char ident[2][40];
static char bb_url[128]; /* serverdir as the machines reach it */

/* Network namespaces: a hub (redis, serverdir, this test) and one per machine, each
 * machine's veth on the hub's bridge; the addresses exist only inside them. */
static int use_netns;
static char ns_name[3][48]; /* hub, m1, m2 */
static int ns_fd[3] = {-1, -1, -1};

/* Every game process sampled: when it was first seen, and whether a violation counted it. */
typedef struct {
    pid_t pid;
    int64_t first_seen;
    int counted;
} seen_t;
static seen_t seen[MAXP];
static int nseen;

/* The current cut: victim machine, when it began and healed (0: not yet). */
static struct {
    int victim;
    int64_t cut, heal;
    int slot_doubles, returning_restarts;
} cut;

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

static void netns_delete(void)
{
    for (int i = 0; i < 3; i++)
        if (ns_name[i][0])
            run("ip netns delete %s 2>/dev/null", ns_name[i]);
}

/* Namespaces a killed earlier run left behind (its pid is gone). */
static void netns_delete_stale(void)
{
    FILE *p = popen("ip netns list 2>/dev/null", "r");
    char line[256];
    while (p && fgets(line, sizeof line, p)) {
        int pid = 0;
        char name[64];
        if (sscanf(line, "%63s", name) == 1 && sscanf(name, "sdpart-%d-", &pid) == 1 &&
            pid > 0 && kill(pid, 0) < 0 && errno == ESRCH)
            run("ip netns delete %s 2>/dev/null", name);
    }
    if (p)
        pclose(p);
}

/* Creates the namespaces and links; 1 when they are usable, 0 when the suite may not
 * create them (not root, no `ip netns`): the cuts are then made with SIGSTOP. */
static int netns_setup(void)
{
    if (geteuid() != 0 || run("ip netns list >/dev/null 2>&1"))
        return 0;
    netns_delete_stale();
    static const char *const role[3] = {"hub", "m1", "m2"};
    for (int i = 0; i < 3; i++) {
        snprintf(ns_name[i], sizeof ns_name[i], "sdpart-%d-%s", (int)getpid(), role[i]);
        if (run("ip netns add %s 2>/dev/null", ns_name[i])) {
            ns_name[i][0] = '\0';
            netns_delete();
            return 0;
        }
    }
    atexit(netns_delete);
    int bad = run("ip -n %s link set lo up && ip -n %s link add br0 type bridge && "
                  "ip -n %s addr add 10.213.0.1/24 dev br0 && ip -n %s link set br0 up",
                  ns_name[0], ns_name[0], ns_name[0], ns_name[0]);
    for (int i = 1; i < 3 && !bad; i++)
        bad = run("ip -n %s link add v%d type veth peer name eth0 netns %s && "
                  "ip -n %s link set v%d master br0 up && ip -n %s link set lo up && "
                  "ip -n %s addr add 10.213.0.1%d/24 dev eth0 && ip -n %s link set eth0 up",
                  ns_name[0], i, ns_name[i], ns_name[0], i, ns_name[i], ns_name[i], i,
                  ns_name[i]);
    for (int i = 0; i < 3 && !bad; i++) {
        char path[160];
        snprintf(path, sizeof path, "/run/netns/%s", ns_name[i]);
        ns_fd[i] = open(path, O_RDONLY | O_CLOEXEC);
        bad = ns_fd[i] < 0;
    }
    if (bad) {
        print_message("partition: network namespaces could not be set up\n");
        netns_delete();
        memset(ns_name, 0, sizeof ns_name);
        return 0;
    }
    return 1;
}

/* This thread (the test's only one) moves to namespace i: what it spawns next runs there. */
static void enter_ns(int i)
{
    if (setns(ns_fd[i], CLONE_NEWNET))
        fail_msg("setns %s: %s", ns_name[i], strerror(errno));
}

/* redis and serverdir; in the hub namespace, serverdir serves the bridge too. */
static void stack_start(void)
{
    if (h_redis_start(&C.redis))
        fail_msg("redis did not start");
    if (!use_netns) {
        if (h_serverdir_start(&C.sd, C.redis.url, h_tokens_file(), NULL))
            fail_msg("serverdir did not start");
        snprintf(bb_url, sizeof bb_url, "%s", C.sd.url);
        return;
    }
    h_serverdir_t *s = &C.sd;
    snprintf(s->dir, sizeof s->dir, "%s", h_tmpdir());
    snprintf(s->log, sizeof s->log, "%s/serverdir.log", s->dir);
    s->port = h_free_port();
    char listen[64], health[160];
    snprintf(listen, sizeof listen, "0.0.0.0:%d", s->port);
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", C.redis.url,
                          "--threads", "4", "--tokens", h_tokens_file(), "--config",
                          h_sd_default_config(), NULL};
    s->pid = h_spawn(argv, s->log, NULL);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
    snprintf(bb_url, sizeof bb_url, "http://10.213.0.1:%d", s->port);
    snprintf(health, sizeof health, "%s/healthz", s->url);
    if (!h_wait_until(h_http_ok, health, cl_ms(8000)))
        fail_msg("serverdir did not start (log %s)", s->log);
}

/* Machine i's bigbrother: cluster mode, leases of 3 s, in its namespace when there are. */
static void machine_start(int i)
{
    bbt_t *b = &C.bb[i];
    snprintf(C.name[i], sizeof C.name[i], "m%d", i + 1);
    bbt_dirs(b);
    char *text = NULL;
    if (asprintf(&text,
                 "{\"machine\": \"%s\", \"cluster\": \"c1\", \"state_dir\": \"%s\","
                 " \"mode\": \"cluster\", \"capacity\": 100,"
                 " \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"},"
                 " \"lease_ttl_ms\": %d, \"primary_ttl_ms\": %d,"
                 " \"placement_interval_ms\": 300, \"assignment_wait_ms\": 2000,"
                 " \"services\": []}",
                 C.name[i], b->state, bb_url, H_TOK_BB, cl_ms(3000), cl_ms(3000)) < 0)
        abort();
    snprintf(b->cfg, sizeof b->cfg, "%s", h_write_file(b->dir, "bb.json", text, 0644));
    free(text);
    if (use_netns)
        enter_ns(i + 1);
    pid_t pid = bbt_start(b);
    if (use_netns)
        enter_ns(0);
    if (pid <= 0)
        fail_msg("bigbrother m%d did not start (log %s)", i + 1, b->log);
    if (hp_ident(b->state, ident[i]))
        fail_msg("m%d has no bigbrother.id", i + 1);
}

/* ---------- the samples ---------- */

/* pid's entry, made (first seen now) when it has none. */
static seen_t *seen_get(pid_t pid, int64_t now)
{
    for (int i = 0; i < nseen; i++)
        if (seen[i].pid == pid)
            return &seen[i];
    seen_t *e = &seen[nseen < MAXP ? nseen++ : MAXP - 1];
    *e = (seen_t){pid, now, 0};
    return e;
}

/* One sample of the slots: a slot with more processes than the declared overlap allows
 * counts its newest extra process once (a restart by the returning machine separately). */
static void sample_slots(int64_t now)
{
    hp_proc_t p[64];
    int n = hp_procs(SVC, ident, 2, p, 64);
    int in_overlap = cut.cut && now >= cut.cut && (!cut.heal || now <= cut.heal + OVERLAP_MS);
    for (int slot = 0; slot < 64; slot++) {
        int count = 0, allowed = 1, late = -1, newest = -1;
        int64_t newest_t = -1;
        for (int i = 0; i < n; i++) {
            if (p[i].slot != slot)
                continue;
            int64_t t = seen_get(p[i].pid, now)->first_seen;
            count++;
            int victims = p[i].bb == cut.victim;
            if (victims && cut.heal && t > cut.heal)
                late = i;
            else if (victims && in_overlap)
                allowed++;
            if (t > newest_t)
                newest_t = t, newest = i;
        }
        if (count <= allowed)
            continue;
        int who = late >= 0 ? late : newest;
        seen_t *e = seen_get(p[who].pid, now);
        if (e->counted)
            continue;
        e->counted = 1;
        if (late >= 0)
            cut.returning_restarts++;
        else
            cut.slot_doubles++;
        print_message("VIOLATION slot %d run by %d processes at +%lld ms (pid %d of m%d%s)\n",
                      slot, count, (long long)(now - cut.cut), (int)p[who].pid, p[who].bb + 1,
                      late >= 0 ? ", started by the returning machine" : "");
    }
}

/* Samples every 100 ms for ms. */
static void watch_ms(int ms)
{
    int64_t end = h_now_ms() + ms;
    for (int k = 0; k < 10000 && h_now_ms() < end; k++) {
        sample_slots(h_now_ms());
        hp_locks_sample(&L);
        int64_t left = end - h_now_ms();
        h_sleep_ms(left > 100 ? 100 : left > 0 ? (int)left : 0);
    }
}

/* cl_wait's condition, sampling as it polls. */
static int converged_watching(cl_t *c, void *arg)
{
    sample_slots(h_now_ms());
    hp_locks_sample(&L);
    return cl_converged(c, arg);
}

/* ---------- what the directory shows ---------- */

/* Ids of every event in the history, as a JSON object (id -> true); NULL on failure. */
static json_t *history_ids(void)
{
    json_t *ids = json_object();
    char since[64] = "0-0";
    for (int page = 0; page < 100; page++) {
        char url[256];
        long st = 0;
        snprintf(url, sizeof url, "%s%s/events?limit=1000&since=%s", C.sd.url, CL_BASE, since);
        json_t *j = cl_api("GET", url, NULL, &st), *e;
        if (st != 200) {
            json_decref(j);
            json_decref(ids);
            return NULL;
        }
        size_t i, n = json_array_size(json_object_get(j, "events"));
        json_array_foreach(json_object_get(j, "events"), i, e)
            json_object_set_new(ids, bbt_str(e, "id"), json_true());
        const char *last = json_string_value(json_object_get(j, "last"));
        if (last)
            snprintf(since, sizeof since, "%s", last);
        json_decref(j);
        if (n == 0)
            break;
    }
    return ids;
}

/* Outbox events (not status: those have no history entry) missing from the history;
 * verbose prints each. -1 when the history cannot be read. */
static int lost_events(int verbose)
{
    json_t *ids = history_ids(), *e;
    if (!ids)
        return -1;
    int missing = 0;
    for (int b = 0; b < C.n; b++) {
        json_t *evs = bbt_events(&C.bb[b]);
        size_t i;
        json_array_foreach(evs, i, e) {
            if (!strcmp(bbt_str(e, "type"), "status") ||
                json_object_get(ids, bbt_str(e, "id")))
                continue;
            missing++;
            if (verbose)
                print_message("VIOLATION outbox event %s of m%d (%s %s) not in the history\n",
                              bbt_str(e, "id"), b + 1, bbt_str(e, "type"), bbt_str(e, "instance"));
        }
        json_decref(evs);
    }
    json_decref(ids);
    return missing;
}

static int delivered(cl_t *c, void *arg)
{
    (void)c;
    (void)arg;
    hp_locks_sample(&L);
    return lost_events(0) == 0;
}

/* ---------- the cuts ---------- */

typedef enum { CUT_SIGSTOP, CUT_NETNS } method_t;

static void cut_apply(int victim, method_t how, int on)
{
    if (how == CUT_SIGSTOP)
        kill(C.bb[victim].pid, on ? SIGSTOP : SIGCONT);
    else if (run("ip -n %s link set v%d %s", ns_name[0], victim + 1, on ? "down" : "up"))
        fail_msg("cannot take m%d's link %s", victim + 1, on ? "down" : "up");
}

/* SIGKILL of one of the victim's games: the one last granted a lock after the directory
 * recorded it stopped when there is one, else the first found. */
static void kill_one_game(int victim)
{
    hp_proc_t p[64];
    int n = hp_procs(SVC, ident, 2, p, 64), pick = -1;
    for (int i = 0; i < n; i++)
        if (p[i].bb == victim && (pick < 0 || !strcmp(p[i].instance, L.stopped_holder)))
            pick = i;
    if (pick < 0)
        return;
    kill(p[pick].pid, SIGKILL);
    print_message("partition: killed %s (pid %d) of m%d at +%lld ms\n", p[pick].instance,
                  (int)p[pick].pid, victim + 1, (long long)(h_now_ms() - cut.cut));
}

/* One cut of victim for CUT_MS by `how`, the heal, and every invariant. */
static void partition(int victim, method_t how)
{
    cl_conv_t w = {SVC, NPROCS, 0};
    assert_true(cl_wait(&C, converged_watching, &w, cl_ms(30000)));
    hp_locks_t before = L;
    memset(&cut, 0, sizeof cut);
    cut.victim = victim;
    cut.cut = h_now_ms();
    cut_apply(victim, how, 1);
    int64_t lost_at = -1;
    int killed = 0;
    for (int k = 0; k < 1000 && h_now_ms() < cut.cut + CUT_MS; k++) {
        watch_ms(100);
        int64_t t = h_now_ms() - cut.cut;
        if (lost_at < 0 && k % 3 == 0 && !strcmp(cl_machine_state(&C, victim), "lost"))
            lost_at = t;
        if (!killed && (t >= KILL_AT_MS || L.stopped_grants > before.stopped_grants)) {
            kill_one_game(victim);
            killed = 1;
        }
    }
    cut.heal = h_now_ms();
    cut_apply(victim, how, 0);
    int conv = cl_wait(&C, converged_watching, &w, cl_ms(20000));
    int64_t conv_ms = h_now_ms() - cut.heal;
    int64_t left = cut.heal + LOCK_DELAY_MS + 1000 - h_now_ms();
    watch_ms(left > 0 ? (int)left : 0);
    int stuck = hp_locks_stuck(&L);
    cl_wait(&C, delivered, NULL, cl_ms(10000));
    int lost = lost_events(1);
    print_message("partition: cut=m%d method=%s cut_ms=%d machine_lost_at_ms=%lld "
                  "converged=%s after_heal_ms=%lld\n",
                  victim + 1, how == CUT_NETNS ? "netns" : "sigstop", CUT_MS, (long long)lost_at,
                  conv ? "yes" : "NO", (long long)conv_ms);
    print_message("partition: samples=%lld grants=%lld saves=%lld slot_doubles=%d "
                  "returning_restarts=%d stale_saves=%lld stopped_grants=%lld "
                  "stopped_saves=%lld lost_events=%d stuck_locks=%d\n",
                  L.samples - before.samples, L.grants - before.grants, L.saves - before.saves,
                  cut.slot_doubles, cut.returning_restarts, L.stale_saves - before.stale_saves,
                  L.stopped_grants - before.stopped_grants,
                  L.stopped_saves - before.stopped_saves, lost, stuck);
    assert_true(conv);
    assert_true(lost_at >= 0);
    assert_true(L.saves > before.saves);
    assert_true(stuck >= 0 && lost >= 0);
    long long bad = cut.slot_doubles + cut.returning_restarts +
                    (L.stale_saves - before.stale_saves) +
                    (L.stopped_grants - before.stopped_grants) + lost + stuck;
    if (bad)
        fail_msg("%lld invariant violations (the figures above)", bad);
}

static void cut_m2_by_sigstop(void **state)
{
    (void)state;
    int ip = cl_index(&C, cl_primary(&C, NULL));
    assert_true(ip >= 0);
    print_message("partition: the machine that is not the primary, its bigbrother stopped\n");
    partition(ip == 0 ? 1 : 0, CUT_SIGSTOP);
}

static void cut_primary(void **state)
{
    (void)state;
    int ip = cl_index(&C, cl_primary(&C, NULL));
    assert_true(ip >= 0);
    print_message("partition: the primary, %s\n",
                  use_netns ? "its network namespace's link to serverdir down"
                            : "its bigbrother stopped (no network namespaces here)");
    partition(ip, use_netns ? CUT_NETNS : CUT_SIGSTOP);
}

static int has_primary(cl_t *c, void *arg)
{
    (void)arg;
    return cl_primary(c, NULL)[0] != 0;
}

static int setup(void **state)
{
    (void)state;
    use_netns = netns_setup();
    if (use_netns)
        enter_ns(0);
    print_message("partition: cut method %s\n",
                  use_netns ? "network namespaces (the primary's cut) and SIGSTOP"
                            : "SIGSTOP only (cannot create network namespaces here)");
    stack_start();
    C.n = 2;
    for (int i = 0; i < 2; i++)
        machine_start(i);
    hp_locks_init(&L, &C.redis, NKEYS);
    if (!cl_wait(&C, has_primary, NULL, cl_ms(15000)))
        return -1;
    char args[512];
    snprintf(args, sizeof args,
             "[\"--tick-hz\", \"10\", \"--serverdir\", \"%s\", \"--token\", \"%s\","
             " \"--players\", \"2\", \"--player-keys\", \"1-%d\", \"--save-every-ms\", \"300\","
             " \"--session-s\", \"4\", \"--credential\", \"off\"]",
             bb_url, H_TOK_GAME_OF_C1, NKEYS);
    return cl_service(&C, SVC, NPROCS, args, NULL) == 200 ? 0 : -1;
}

int main(void)
{
    h_init(h_valgrind() ? 400 : 150);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cut_m2_by_sigstop),
        cmocka_unit_test(cut_primary),
    };
    int rc = cmocka_run_group_tests(tests, setup, NULL);
    for (int i = 0; i < C.n; i++)
        bbt_stop(&C.bb[i], 5000);
    return rc;
}
