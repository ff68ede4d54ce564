/* bigbrother finds its own processes without its state file: after a kill -9 of
 * bigbrother and a state.json that is deleted, cut in half or garbage, the restarted
 * bigbrother supervises the same pids (ready, same instance ids), never starts a second
 * process for a slot, keeps the damaged file aside (logged once), and really supervises
 * them (a kill -9 of one is restarted). A process whose slot left the config is stopped
 * with reason `orphaned`, with or without the state file. Two bigbrothers of one machine
 * (same machine, service and slot names) never adopt each other's processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "harness.h"
#include "harness_bigbrother.h"

#define NSLOTS 3

enum damage { LOST, TRUNCATED, GARBAGE, INTACT };

/* The config: `count` agent-checked gameprocs of service zone. */
static void zone_config(bbt_t *b, int count)
{
    char svc[1024];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"zone\", \"command\": \"%s\", \"count\": %d,"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 3000,"
             " \"liveness_timeout_ms\": 1000},"
             " \"restart\": {\"backoff_min_ms\": 50, \"backoff_max_ms\": 200},"
             " \"stop\": {\"grace_ms\": 1000}, \"cwd\": \"%s\", \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, count, h_tmpdir());
    bbt_config(b, svc, NULL);
}

/* Waits until slots 0..n-1 are ready with at least min_gen; fills pids and ids. */
static void all_ready(const bbt_t *b, int n, pid_t *pids, char ids[][160], int min_gen)
{
    for (int s = 0; s < n; s++) {
        json_t *in = bbt_wait(b, "zone", s, "ready", min_gen, h_valgrind() ? 20000 : 8000);
        assert_non_null(in);
        pids[s] = (pid_t)bbt_int(in, "pid");
        if (ids)
            snprintf(ids[s], 160, "%s", bbt_str(in, "instance"));
        json_decref(in);
    }
}

/* How many running processes were spawned for slot `slot` by the bigbrother whose agent
 * socket is b->agent (their environ holds BB_SOCKET=<it> and BB_SLOT=<slot>). */
static int procs_of_slot(const bbt_t *b, int slot)
{
    char want_sock[400], want_slot[32];
    snprintf(want_sock, sizeof(want_sock), "BB_SOCKET=%s", b->agent);
    snprintf(want_slot, sizeof(want_slot), "BB_SLOT=%d", slot);
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    static char env[1 << 16];
    while (d && (e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        char path[300];
        if (pid <= 0 || !bbt_alive(pid))
            continue;
        snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, env, sizeof(env) - 1);
        close(fd);
        int sock = 0, sl = 0;
        env[len > 0 ? len : 0] = 0;
        for (ssize_t i = 0; i < len; i += (ssize_t)strlen(env + i) + 1) {
            sock |= !strcmp(env + i, want_sock);
            sl |= !strcmp(env + i, want_slot);
        }
        n += sock && sl;
    }
    if (d)
        closedir(d);
    return n;
}

/* Kills bigbrother with SIGKILL and reaps it; its processes keep running. */
static void kill9(bbt_t *b)
{
    int st;
    kill(b->pid, SIGKILL);
    for (int i = 0; i < 500 && !h_exited(b->pid, &st); i++)
        h_sleep_ms(10);
}

/* Damages b's state.json as `how` says. */
static void damage(const bbt_t *b, enum damage how)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/state.json", b->state);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    if (how == LOST)
        assert_int_equal(unlink(path), 0);
    else if (how == TRUNCATED)
        assert_int_equal(truncate(path, st.st_size / 2), 0);
    else if (how == GARBAGE)
        h_write_file(b->state, "state.json", "\x01garbage {{{ not json", 0600);
}

/* How many times the log of the current run says needle. */
static int log_count(const bbt_t *b, const char *needle)
{
    FILE *f = fopen(b->log, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

/* 1 if b's state dir has a state.json.damaged-* file. */
static int damaged_kept(const bbt_t *b)
{
    DIR *d = opendir(b->state);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d)))
        found |= !strncmp(e->d_name, "state.json.damaged-", 19);
    if (d)
        closedir(d);
    return found;
}

/* The whole scenario for one kind of damage. */
static void readopts_after(enum damage how)
{
    bbt_t b = {0};
    pid_t before[NSLOTS], after[NSLOTS];
    char ids[NSLOTS][160];
    zone_config(&b, NSLOTS);
    assert_true(bbt_start(&b) > 0);
    all_ready(&b, NSLOTS, before, ids, 1);
    kill9(&b);
    damage(&b, how);

    assert_true(bbt_start(&b) > 0);
    all_ready(&b, NSLOTS, after, NULL, 1);
    for (int s = 0; s < NSLOTS; s++) {
        assert_int_equal(after[s], before[s]);
        json_t *in = bbt_inst(&b, "zone", s);
        assert_string_equal(bbt_str(in, "instance"), ids[s]);
        assert_int_equal(bbt_int(in, "generation"), 1);
        json_decref(in);
    }
    /* past two liveness deadlines: nothing else was started, the same pids are healthy */
    h_sleep_ms(2500);
    all_ready(&b, NSLOTS, after, NULL, 1);
    for (int s = 0; s < NSLOTS; s++) {
        assert_int_equal(after[s], before[s]);
        assert_int_equal(procs_of_slot(&b, s), 1);
    }
    if (how == TRUNCATED || how == GARBAGE) {
        assert_true(damaged_kept(&b));
        assert_int_equal(log_count(&b, "state file damaged"), 1);
    }
    /* supervised for real: a kill -9 of an adopted process is noticed and restarted */
    kill(before[1], SIGKILL);
    json_t *in = bbt_wait(&b, "zone", 1, "ready", 2, h_valgrind() ? 20000 : 5000);
    assert_non_null(in);
    assert_int_not_equal(bbt_int(in, "pid"), before[1]);
    json_decref(in);
    assert_int_equal(procs_of_slot(&b, 1), 1);
    bbt_stop(&b, 5000);
}

static void state_deleted(void **state)
{
    (void)state;
    readopts_after(LOST);
}

static void state_truncated(void **state)
{
    (void)state;
    readopts_after(TRUNCATED);
}

static void state_garbage(void **state)
{
    (void)state;
    readopts_after(GARBAGE);
}

/* A run adopted across the upgrade to one log file per instance: it goes on writing to
 * the slot log of the layout before (a regular STATE_DIR/logs/zone-0.log holding earlier
 * runs too). Its log is found there (the control socket's logs request), its crash
 * report is its own output after its header, and the slot's next spawn moves that file
 * aside as before-upgrade.log. Simulated with this bigbrother: killed with its game
 * running, the run's file put back where the old layout kept it, an earlier run's lines
 * in front of it. */
static void adopted_across_log_layout_upgrade(void **state)
{
    (void)state;
    bbt_t b = {0};
    pid_t pid[1];
    char ids[1][160];
    zone_config(&b, 1);
    assert_true(bbt_start(&b) > 0);
    all_ready(&b, 1, pid, ids, 1);
    kill9(&b);
    char own[700], slotlog[400], text[1 << 16];
    snprintf(own, sizeof own, "%s/logs/zone-0/%s.log", b.state, ids[0]);
    snprintf(slotlog, sizeof slotlog, "%s/logs/zone-0.log", b.state);
    assert_int_equal(unlink(slotlog), 0); /* the symlink */
    assert_int_equal(rename(own, slotlog), 0);
    /* an earlier run in front, in the same file (the game appends to the same inode) */
    int fd = open(slotlog, O_RDWR);
    assert_true(fd >= 0);
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    assert_true(n > 0);
    static const char earlier[] = "=== bigbrother 2026-11-26T00:00:00Z: starting instance "
                                  "zone-m1-old-1 (generation 1)\nearlier run's output\n";
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(pwrite(fd, earlier, sizeof earlier - 1, 0), (ssize_t)(sizeof earlier - 1));
    assert_int_equal(pwrite(fd, text, (size_t)n, sizeof earlier - 1), n);
    close(fd);

    assert_true(bbt_start(&b) > 0);
    pid_t after[1];
    all_ready(&b, 1, after, NULL, 1);
    assert_int_equal(after[0], pid[0]); /* adopted */
    char req[200];
    snprintf(req, sizeof req, "logs %s", ids[0]);
    json_t *l = bbt_ctl(&b, req);
    assert_non_null(l);
    assert_string_equal(bbt_str(l, "path"), slotlog);
    json_decref(l);
    /* a crash: the report is the run's own output */
    kill(pid[0], SIGKILL);
    json_t *in = bbt_wait(&b, "zone", 0, "ready", 2, h_valgrind() ? 20000 : 5000);
    assert_non_null(in);
    json_decref(in);
    json_t *evs = bbt_events_of(&b, ids[0]);
    const char *tail = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) if (!strcmp(bbt_str(e, "type"), "stopped")) tail =
        json_string_value(json_object_get(e, "log_tail"));
    assert_non_null(tail);
    assert_non_null(strstr(tail, "msg=ready"));
    assert_null(strstr(tail, "earlier run"));
    json_decref(evs);
    /* the new run moved the old slot log aside and links its own */
    char moved[420];
    snprintf(moved, sizeof moved, "%s/logs/zone-0/before-upgrade.log", b.state);
    assert_true(bbt_file_has(moved, "earlier run's output"));
    struct stat st;
    assert_int_equal(lstat(slotlog, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    bbt_stop(&b, 5000);
}

/* The config loses slot 2 while bigbrother is down: its process is stopped with reason
 * orphaned (stopped event in the outbox), the others are re-adopted. */
static void removed_slot_is_orphaned(enum damage how)
{
    bbt_t b = {0};
    pid_t before[NSLOTS], after[NSLOTS];
    char ids[NSLOTS][160];
    zone_config(&b, NSLOTS);
    assert_true(bbt_start(&b) > 0);
    all_ready(&b, NSLOTS, before, ids, 1);
    kill9(&b);
    if (how != INTACT)
        damage(&b, how);
    zone_config(&b, 2);
    assert_true(bbt_start(&b) > 0);
    all_ready(&b, 2, after, NULL, 1);
    assert_int_equal(after[0], before[0]);
    assert_int_equal(after[1], before[1]);
    /* the orphan gets its stop signal, and SIGKILL after a grace of up to 5 s */
    int64_t end = h_now_ms() + (h_valgrind() ? 30000 : 15000);
    json_t *stopped = NULL;
    while (h_now_ms() < end && !stopped) {
        json_t *evs = bbt_events_of(&b, ids[2]), *ev;
        size_t i;
        json_array_foreach(evs, i, ev)
            if (!strcmp(bbt_str(ev, "type"), "stopped"))
                stopped = json_incref(ev);
        json_decref(evs);
        h_sleep_ms(50);
    }
    assert_non_null(stopped);
    assert_string_equal(bbt_str(stopped, "reason"), "orphaned");
    assert_string_equal(bbt_str(stopped, "detail"), "slot no longer in the config");
    assert_int_equal(bbt_int(stopped, "slot"), 2);
    json_decref(stopped);
    assert_false(bbt_alive(before[2]));
    assert_int_equal(procs_of_slot(&b, 2), 0);
    assert_true(bbt_alive(before[0]) && bbt_alive(before[1]));
    bbt_stop(&b, 5000);
}

static void removed_slot_state_deleted(void **state)
{
    (void)state;
    removed_slot_is_orphaned(LOST);
}

static void removed_slot_state_intact(void **state)
{
    (void)state;
    removed_slot_is_orphaned(INTACT);
}

/* Two bigbrothers on one machine, same machine / service / slot names, both lose their
 * state: each re-adopts its own processes only. */
static void two_bigbrothers_keep_their_own(void **state)
{
    (void)state;
    bbt_t a = {0}, b = {0};
    pid_t pa[2], pb[2], now[2];
    zone_config(&a, 2);
    zone_config(&b, 2);
    assert_true(bbt_start(&a) > 0);
    assert_true(bbt_start(&b) > 0);
    all_ready(&a, 2, pa, NULL, 1);
    all_ready(&b, 2, pb, NULL, 1);
    kill9(&a);
    kill9(&b);
    damage(&a, LOST);
    damage(&b, LOST);
    assert_true(bbt_start(&a) > 0);
    all_ready(&a, 2, now, NULL, 1);
    assert_int_equal(now[0], pa[0]);
    assert_int_equal(now[1], pa[1]);
    h_sleep_ms(500);
    assert_true(bbt_alive(pb[0]) && bbt_alive(pb[1])); /* not a's to stop */
    assert_true(bbt_start(&b) > 0);
    all_ready(&b, 2, now, NULL, 1);
    assert_int_equal(now[0], pb[0]);
    assert_int_equal(now[1], pb[1]);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(procs_of_slot(&a, s), 1);
        assert_int_equal(procs_of_slot(&b, s), 1);
    }
    bbt_stop(&a, 5000);
    bbt_stop(&b, 5000);
}

int main(void)
{
    h_init(280);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(state_deleted),
        cmocka_unit_test(state_truncated),
        cmocka_unit_test(state_garbage),
        cmocka_unit_test(removed_slot_state_deleted),
        cmocka_unit_test(removed_slot_state_intact),
        cmocka_unit_test(two_bigbrothers_keep_their_own),
        cmocka_unit_test(adopted_across_log_layout_upgrade),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
