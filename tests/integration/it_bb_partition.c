/* Cluster mode, a bigbrother cut off from serverdir (issue 30): two bigbrothers (m1, m2)
 * against one serverdir, each test with a service of its own.
 *   - disconnect.stop_after_ms: serverdir paused (SIGSTOP), every bigbrother stops that
 *     service's games itself with reason `disconnected` after about stop_after_ms and not
 *     before, starts none while cut off, and after the heal the directory has the stops
 *     and the slots run again;
 *   - a returning bigbrother: paused past its lease while its slot's process was killed
 *     (restart backoff 0, so the old code restarts it in the turn that sees the exit),
 *     its slots moved; on SIGCONT it starts no process of that service (it holds the
 *     restart until a fresh read, which no longer holds the slot);
 *   - a returning bigbrother whose lease renewal fails while its reads pass: it starts
 *     nothing until ServerDir accepts its lease again;
 *   - reconcile keep_original: the same return with a process still running: it keeps
 *     running (not stopped as replaced at once) and is stopped as replaced after the
 *     bound (a placement interval and a lease) unless the primary gave the slot back;
 *   - both bigbrothers paused past their leases: serverdir's sweep marks their games
 *     stopped; back, each restarts those still running as new runs. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "harness_cluster.h"

#define LEASE_MS 3000     /* harness_cluster.c's lease_ttl_ms (times cl_ms) */
#define PLACEMENT_MS 300  /* and its placement_interval_ms */
#define STOP_AFTER_MS 2000

static cl_t C;

static int has_primary(cl_t *c, void *arg)
{
    (void)arg;
    return cl_primary(c, NULL)[0] != 0;
}

/* Lines of the file at path holding both a and b. */
static int lines_with2(const char *path, const char *a, const char *b)
{
    FILE *f = fopen(path, "r");
    char line[8192];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return n;
}

/* The pids of service's processes that bigbrother i runs, into pids (at most cap). */
static int pids_of(int i, const char *service, pid_t *pids, int cap)
{
    json_t *st = bbt_ctl(&C.bb[i], "status");
    int n = 0;
    size_t k;
    json_t *in;
    json_array_foreach(json_object_get(st, "instances"), k, in)
        if (!strcmp(bbt_str(in, "service"), service) && bbt_int(in, "pid") > 0 && n < cap)
            pids[n++] = (pid_t)bbt_int(in, "pid");
    json_decref(st);
    return n;
}

static int alive_count(const pid_t *pids, int n)
{
    int a = 0;
    for (int i = 0; i < n; i++)
        a += bbt_alive(pids[i]);
    return a;
}

/* Stopped records of service in the directory with reason. */
static int stopped_with(const char *service, const char *reason)
{
    char path[256];
    snprintf(path, sizeof(path), "/processes?service=%s&state=stopped", service);
    json_t *j = cl_get(&C, path);
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        n += !strcmp(bbt_str(p, "reason"), reason);
    json_decref(j);
    return n;
}

static int two_disconnected(cl_t *c, void *arg)
{
    (void)c;
    return stopped_with(arg, "disconnected") >= 2;
}

/* The non-primary machine, with the service converged on both. */
static int victim_of(const char *service, int n)
{
    cl_conv_t w = {service, n, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(40000)));
    int v = cl_index(&C, cl_primary(&C, NULL)) == 0 ? 1 : 0;
    pid_t p[4];
    assert_int_equal(pids_of(v, service, p, 4), 1);
    return v;
}

/* Waits until the service runs its 2 processes, one per machine, and puts their pids
 * into pids (4 at most). */
static int converged_pids(const char *service, pid_t *pids)
{
    cl_conv_t w = {service, 2, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(40000)));
    int n = pids_of(0, service, pids, 4);
    n += pids_of(1, service, pids + n, 4 - n);
    assert_int_equal(n, 2);
    return n;
}

/* Scales the service to 0 and waits until none of its processes runs. */
static void service_gone(const char *service)
{
    assert_int_equal(cl_scale(&C, service, 0), 200);
    cl_conv_t w = {service, 0, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(20000)));
}

static void cut_off_games_stop_as_disconnected(void **state)
{
    (void)state;
    assert_true(cl_wait(&C, has_primary, NULL, cl_ms(15000)));
    char extra[128];
    snprintf(extra, sizeof(extra), ", \"disconnect\": {\"stop_after_ms\": %d}",
             cl_ms(STOP_AFTER_MS));
    assert_int_equal(cl_service(&C, "realm", 2, NULL, extra), 200);
    cl_conv_t w = {"realm", 2, 0};
    pid_t pids[4];
    int n = converged_pids("realm", pids);
    int64_t t0 = h_now_ms();
    kill(C.sd.pid, SIGSTOP);
    /* not before stop_after_ms (less a tick of the watch and the lease renewal's period) */
    h_sleep_ms(cl_ms(STOP_AFTER_MS) - cl_ms(LEASE_MS) / 3 - 500);
    assert_int_equal(alive_count(pids, n), 2);
    int64_t deadline = t0 + cl_ms(STOP_AFTER_MS + 4000);
    while (alive_count(pids, n) && h_now_ms() < deadline)
        h_sleep_ms(50);
    int64_t took = h_now_ms() - t0;
    print_message("games cut off from serverdir stopped after %lld ms (stop_after_ms %d)\n",
                  (long long)took, cl_ms(STOP_AFTER_MS));
    assert_int_equal(alive_count(pids, n), 0);
    assert_true(took >= cl_ms(STOP_AFTER_MS) - cl_ms(LEASE_MS) / 3);
    /* nothing is started while cut off */
    h_sleep_ms(cl_ms(1500));
    assert_int_equal(cl_running(&C, 0, "realm") + cl_running(&C, 1, "realm"), 0);
    assert_true(bbt_file_has(C.bb[0].log, "cut off from serverdir") ||
                bbt_file_has(C.bb[1].log, "cut off from serverdir"));
    kill(C.sd.pid, SIGCONT);
    /* the stops reach the directory after the heal, and the slots run again */
    assert_true(cl_wait(&C, two_disconnected, "realm", cl_ms(20000)));
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
    service_gone("realm");
}

/* Puts service on both machines (restart backoff 0, so the old code restarted an exit in
 * the turn that saw it), then pauses the non-primary's bigbrother and kills its process
 * of the service. Returns that bigbrother's index; *started gets its "instance started"
 * lines of the service before. */
static int pause_victim_killing_its_game(const char *service, int *started)
{
    assert_int_equal(cl_service(&C, service, 2, NULL,
                                ", \"restart\": {\"backoff_min_ms\": 0, \"backoff_max_ms\": 0}"),
                     200);
    int v = victim_of(service, 2);
    pid_t pid;
    assert_int_equal(pids_of(v, service, &pid, 1), 1);
    char svc[64];
    snprintf(svc, sizeof(svc), "service=%s", service);
    *started = lines_with2(C.bb[v].log, "instance started", svc);
    kill(C.bb[v].pid, SIGSTOP);
    kill(pid, SIGKILL);
    return v;
}

static void returning_bigbrother_restarts_no_moved_slot(void **state)
{
    (void)state;
    int started, v = pause_victim_killing_its_game("zone", &started);
    /* its machine is declared lost and the slot runs on the other one */
    cl_conv_t w = {"zone", 2, 1u << v};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(3000 + 20000)));
    assert_string_equal(cl_machine_state(&C, v), "lost");
    int applied = bbt_lines_with(C.bb[v].log, "assignment applied");
    kill(C.bb[v].pid, SIGCONT);
    /* it reads the assignment that moved the slot, then has time to act on anything */
    int64_t deadline = h_now_ms() + cl_ms(10000);
    while (bbt_lines_with(C.bb[v].log, "assignment applied") == applied &&
           h_now_ms() < deadline)
        h_sleep_ms(50);
    h_sleep_ms(cl_ms(2000));
    int again = lines_with2(C.bb[v].log, "instance started", "service=zone") - started;
    print_message("processes of the moved slot started on the returning machine: %d\n", again);
    assert_int_equal(again, 0);
    assert_int_equal(cl_running(&C, v, "zone"), 0);
    /* held, unless the document that moved the slot was applied before the exit was seen */
    print_message("restart held for a stale assignment: %d time(s)\n",
                  lines_with2(C.bb[v].log, "restart held", "reason=assignment_stale"));
    w.skip = 0;
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(10000)));
    service_gone("zone");
}

/* A returning bigbrother whose lease renewal fails while its assignment reads succeed:
 * it restarts no cluster slot until ServerDir accepts its lease again, then does (the slot
 * is still its own). A read alone may come before the primary acts on a lease that ran
 * out meanwhile, and the slot then moves a moment after it was restarted: it.chaos saw a
 * slot run on two machines that way, a serverdir copy failing the renewal while another
 * answered the read. Here the renewal fails because the machine's lease record is made
 * unwritable in Redis for a moment (a string where machine_put.lua reads a hash). The
 * old code restarted the killed slot on the first read after the pause. */
static struct {
    char key[64], held[80]; /* the machine's lease record, and where the test keeps it */
} sabotaged;

/* Puts the lease record back (when the test moved it); 0, or -1 when Redis refused. */
static int restore_lease_record(void)
{
    if (!sabotaged.key[0])
        return 0;
    redisReply *r = h_redis(&C.redis, "EXISTS %s", sabotaged.held);
    int moved = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!moved) { /* the test failed before it moved the record */
        sabotaged.key[0] = '\0';
        return 0;
    }
    r = h_redis(&C.redis, "DEL %s", sabotaged.key);
    freeReplyObject(r);
    r = h_redis(&C.redis, "RENAME %s %s", sabotaged.held, sabotaged.key);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    sabotaged.key[0] = '\0';
    return ok ? 0 : -1;
}

static int resume_all(void **state);

/* A failed test leaves no lease record moved for the next one. */
static int resume_and_restore(void **state)
{
    restore_lease_record();
    return resume_all(state);
}

static void returning_bigbrother_waits_for_its_lease(void **state)
{
    (void)state;
    int started, v = pause_victim_killing_its_game("shard", &started);
    char *key = sabotaged.key, *held = sabotaged.held;
    snprintf(key, sizeof(sabotaged.key), "sd:{c1}:machine:%s", C.name[v]);
    snprintf(held, sizeof(sabotaged.held), "%s.held-by-test", key);
    h_sleep_ms(cl_ms(1500)); /* a pause (over 1 s), shorter than the lease */
    redisReply *r = h_redis(&C.redis, "RENAME %s %s", key, held);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = h_redis(&C.redis, "SET %s unwritable", key);
    assert_non_null(r);
    freeReplyObject(r);
    kill(C.bb[v].pid, SIGCONT);
    /* it sees the exit (the restart is held: it was paused), reads the assignment (which
     * still holds the slot) and cannot renew its lease */
    int64_t deadline = h_now_ms() + cl_ms(10000);
    while (!lines_with2(C.bb[v].log, "restart held", "service=shard") && h_now_ms() < deadline)
        h_sleep_ms(50);
    h_sleep_ms(cl_ms(2500));
    int again = lines_with2(C.bb[v].log, "instance started", "service=shard") - started;
    print_message("slots started while the lease was refused: %d\n", again);
    assert_int_equal(again, 0);
    assert_true(lines_with2(C.bb[v].log, "restart held", "service=shard") >= 1);
    assert_true(bbt_file_has(C.bb[v].log, "assignment read before the machine lease was "
                             "accepted again"));
    assert_int_equal(restore_lease_record(), 0);
    /* the lease is accepted again: the slot runs (here or, had the primary declared the
     * machine lost meanwhile, elsewhere) */
    cl_conv_t w = {"shard", 2, 0};
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(20000)));
    service_gone("shard");
}

/* The slot moved: the machines other than w->skip's run w->want of the service (the
 * original's record stays as it was: keep_original marks nothing stopped). */
static int moved(cl_t *c, void *arg)
{
    cl_conv_t *w = arg;
    int n = 0;
    for (int i = 0; i < c->n; i++)
        if (!(w->skip & (1u << i)))
            n += cl_running(c, i, w->service);
    return n == w->want;
}

/* reconcile keep_original, both sides: the machine cut off past its lease comes back
 * still running its original, keeps it and reports it, the primary gives the slot back
 * and the replacement is stopped; the original runs on (same pid). Had the primary not
 * given it back, the bound (a placement interval and a lease) would have stopped it. */
static void keep_original_is_given_back(void **state)
{
    (void)state;
    assert_int_equal(cl_service(&C, "match", 2, NULL,
                                ", \"disconnect\": {\"reconcile\": \"keep_original\"}"),
                     200);
    int v = victim_of("match", 2);
    pid_t pid;
    assert_int_equal(pids_of(v, "match", &pid, 1), 1);
    kill(C.bb[v].pid, SIGSTOP);
    cl_conv_t w = {"match", 2, 1u << v};
    assert_true(cl_wait(&C, moved, &w, cl_ms(3000 + 20000)));
    kill(C.bb[v].pid, SIGCONT);
    int64_t t0 = h_now_ms();
    assert_true(bbt_wait_file_has(C.bb[v].log, "original kept running", cl_ms(10000)));
    int bound = PLACEMENT_MS + cl_ms(LEASE_MS);
    int back = bbt_wait_file_has(C.bb[v].log, "kept slot given back", bound + cl_ms(5000));
    print_message("kept original: %s after %lld ms (bound %d ms)\n",
                  back ? "given back" : "not given back", (long long)(h_now_ms() - t0), bound);
    assert_true(back);
    w.skip = 0;
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(20000)));
    assert_true(bbt_alive(pid)); /* the original, never restarted */
    assert_false(bbt_file_has(C.bb[v].log, "kept slot not given back"));
    service_gone("match");
}

static int arena_swept(cl_t *c, void *arg)
{
    (void)c;
    (void)arg;
    return stopped_with("arena", "machine_lost") >= 2;
}

/* Both bigbrothers paused past their leases (the primary's too) while serverdir runs: its
 * sweep marks their processes stopped (machine_lost). When they run again, the games
 * that still run have no live record: each bigbrother reads the directory after its new
 * registration and restarts them as new runs (the old code kept them running under
 * stopped records: the directory never had them live again). */
static void swept_machine_restarts_its_games(void **state)
{
    (void)state;
    assert_true(cl_wait(&C, has_primary, NULL, cl_ms(15000)));
    assert_int_equal(cl_service(&C, "arena", 2, NULL, NULL), 200);
    cl_conv_t w = {"arena", 2, 0};
    pid_t pids[4];
    int n = converged_pids("arena", pids);
    int declared = bbt_lines_with(C.bb[0].log, "declared lost") +
                   bbt_lines_with(C.bb[1].log, "declared lost");
    kill(C.bb[0].pid, SIGSTOP);
    kill(C.bb[1].pid, SIGSTOP);
    assert_true(cl_wait(&C, arena_swept, NULL, cl_ms(LEASE_MS) * 2 + cl_ms(10000)));
    assert_int_equal(alive_count(pids, n), 2); /* paused: nobody stopped the games */
    kill(C.bb[0].pid, SIGCONT);
    kill(C.bb[1].pid, SIGCONT);
    assert_true(cl_wait(&C, cl_converged, &w, cl_ms(30000)));
    assert_int_equal(alive_count(pids, n), 0); /* restarted as new runs */
    /* by the check after the new registration; or, when the primary that took over read
     * the machines lost before they renewed, by a document that moved the slots
     * (replaced), the check then finding them already stopping */
    int relived = bbt_file_has(C.bb[0].log, "process has no live record") ||
                  bbt_file_has(C.bb[1].log, "process has no live record");
    print_message("games restarted by the check after the new registration: %s\n",
                  relived ? "yes" : "no, a document replaced them");
    assert_true(relived || bbt_lines_with(C.bb[0].log, "declared lost") +
                                  bbt_lines_with(C.bb[1].log, "declared lost") > declared);
    service_gone("arena");
}

/* A failed test leaves nothing paused for the next one. */
static int resume_all(void **state)
{
    (void)state;
    kill(C.sd.pid, SIGCONT);
    for (int i = 0; i < C.n; i++)
        if (C.bb[i].pid > 0)
            kill(C.bb[i].pid, SIGCONT);
    return 0;
}

int main(void)
{
    h_init(h_valgrind() ? 480 : 240);
    cl_start(&C, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(cut_off_games_stop_as_disconnected, resume_all),
        cmocka_unit_test_teardown(returning_bigbrother_restarts_no_moved_slot, resume_all),
        cmocka_unit_test_teardown(returning_bigbrother_waits_for_its_lease, resume_and_restore),
        cmocka_unit_test_teardown(keep_original_is_given_back, resume_all),
        cmocka_unit_test_teardown(swept_machine_restarts_its_games, resume_all),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cl_stop(&C);
    return rc;
}
