/* bigbrother's own life: kill -9 of bigbrother and a restart re-adopt the same running
 * pids (still supervised: one is restarted afterwards); SIGHUP re-executes it the same
 * way; the lock file stops a second bigbrother on the same state dir; config errors name
 * file and field and exit 100; bbctl status / restart / stop / start; an agent claiming
 * another process's instance id is rejected. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness_bigbrother.h"

static void two_gameprocs(bbt_t *b)
{
    char svc[1024];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"zone\", \"command\": \"%s\", \"count\": 2,"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 3000,"
             " \"liveness_timeout_ms\": 1000},"
             " \"restart\": {\"backoff_min_ms\": 50, \"backoff_max_ms\": 200},"
             " \"stop\": {\"grace_ms\": 1000}, \"cwd\": \"%s\", \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, h_tmpdir());
    bbt_config(b, svc, NULL);
}

/* Waits until both slots are ready; fills their pids. */
static void both_ready(const bbt_t *b, pid_t pids[2], int min_gen)
{
    for (int s = 0; s < 2; s++) {
        json_t *in = bbt_wait(b, "zone", s, "ready", min_gen, 8000);
        assert_non_null(in);
        pids[s] = (pid_t)bbt_int(in, "pid");
        json_decref(in);
    }
}

/* h_wait_until condition: both slots of the bigbrother arg (a bbt_t) have their agent
 * connected. */
static int agents_connected(void *arg)
{
    int agents = 0;
    for (int s = 0; s < 2; s++) {
        json_t *in = bbt_inst(arg, "zone", s);
        agents += json_is_true(json_object_get(in, "agent"));
        json_decref(in);
    }
    return agents == 2;
}

static void survives_kill9_of_bigbrother(void **state)
{
    bbt_t b = {0};
    pid_t before[2], after[2];
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, before, 1);
    json_t *in = bbt_inst(&b, "zone", 0);
    char id0[160];
    snprintf(id0, sizeof(id0), "%s", bbt_str(in, "instance"));
    json_decref(in);

    kill(b.pid, SIGKILL);
    h_wait_exit(b.pid, 2000);
    /* The time is what is tested: longer than the liveness deadline, nobody watches
     * meanwhile. */
    h_sleep_ms(1500);
    assert_true(bbt_alive(before[0]) && bbt_alive(before[1]));

    assert_true(bbt_start(&b) > 0);
    /* the same processes, same instance ids, same generation, agents reconnected */
    for (int s = 0; s < 2; s++) {
        in = bbt_wait(&b, "zone", s, "ready", 1, 3000);
        assert_non_null(in);
        after[s] = (pid_t)bbt_int(in, "pid");
        assert_int_equal(after[s], before[s]);
        assert_int_equal(bbt_int(in, "generation"), 1);
        json_decref(in);
    }
    assert_true(h_wait_until(agents_connected, &b, 3000));
    in = bbt_inst(&b, "zone", 0);
    assert_string_equal(bbt_str(in, "instance"), id0);
    json_decref(in);
    assert_true(bbt_file_has(b.log, "msg=\"instance re-adopted\""));
    /* Well past two liveness deadlines (the time is what is tested): still the same
     * healthy processes. */
    h_sleep_ms(2200);
    both_ready(&b, after, 1);
    assert_int_equal(after[0], before[0]);
    assert_int_equal(after[1], before[1]);

    /* supervised for real: a restart replaces slot 0 and leaves slot 1 alone */
    json_t *ans = bbt_ctl(&b, "restart zone-m1-dummy");
    assert_non_null(json_object_get(ans, "error"));
    json_decref(ans);
    char req[200];
    snprintf(req, sizeof(req), "restart %s", id0);
    ans = bbt_ctl(&b, req);
    assert_int_equal(bbt_int(ans, "matched"), 1);
    json_decref(ans);
    in = bbt_wait(&b, "zone", 0, "ready", 2, 5000);
    assert_non_null(in);
    assert_int_not_equal(bbt_int(in, "pid"), before[0]);
    assert_string_equal(bbt_str(in, "reason"), "stopped_by_operator");
    json_decref(in);
    assert_false(bbt_alive(before[0]));
    /* and a hang of the re-adopted slot 1 is still caught */
    kill(before[1], SIGSTOP);
    in = bbt_wait(&b, "zone", 1, "ready", 2, 1000 + 1000 + 2000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "hung");
    json_decref(in);
    h_stop(b.pid, 3000);
}

static void sigterm_leaves_processes_running(void **state)
{
    bbt_t b = {0};
    pid_t before[2], after[2];
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, before, 1);
    int st = h_stop(b.pid, 5000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(bbt_file_has(b.log, "processes_left_running=2"));
    assert_true(bbt_alive(before[0]) && bbt_alive(before[1]));
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, after, 1);
    assert_int_equal(after[0], before[0]);
    assert_int_equal(after[1], before[1]);
    h_stop(b.pid, 3000);
}

static void sighup_reexecs_and_keeps_processes(void **state)
{
    bbt_t b = {0};
    pid_t before[2], after[2];
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, before, 1);
    kill(b.pid, SIGHUP);
    /* the re-executed bigbrother takes its processes back */
    assert_true(bbt_wait_file_has(b.log, "msg=\"instance re-adopted\"",
                                  h_valgrind() ? 30000 : 5000));
    both_ready(&b, after, 1);
    assert_int_equal(after[0], before[0]);
    assert_int_equal(after[1], before[1]);
    assert_true(bbt_alive(b.pid));
    /* still its children: a kill -9 is reported with the signal */
    kill(before[0], SIGKILL);
    json_t *in = bbt_wait(&b, "zone", 0, "ready", 2, 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "killed");
    assert_int_equal(bbt_int(in, "signal"), 9);
    json_decref(in);
    h_stop(b.pid, 3000);
}

static void lock_file_stops_a_second_bigbrother(void **state)
{
    bbt_t b = {0};
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    char log2[300];
    snprintf(log2, sizeof(log2), "%s/second.log", b.dir);
    const char *argv[] = {BIGBROTHER, "--config", b.cfg, NULL};
    assert_int_equal(bbt_run(argv, log2), 111);
    assert_true(bbt_file_has(log2, "another bigbrother already runs on this state dir"));
    assert_true(bbt_file_has(log2, "bigbrother.lock"));
    assert_true(bbt_alive(b.pid));
    json_t *st = bbt_ctl(&b, "status");
    assert_non_null(st);
    json_decref(st);
    h_stop(b.pid, 3000);
}

static void config_errors_name_file_and_field(void **state)
{
    static const struct {
        const char *services, *field, *why;
    } cases[] = {
        {"[{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
         " \"restart\": {\"policy\": \"sometimes\"}}]",
         "services[0].restart.policy", "must be one of always, on-failure, never"},
        {"[{\"name\": \"g\", \"health\": {\"type\": \"none\"}}]", "services[0].command",
         "is required"},
        {"[{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"tcp\"}}]",
         "services[0].health.port", "is required for type tcp"},
        {"[{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
         " \"stop\": {\"hang_signal\": \"NOPE\"}}]",
         "services[0].stop.hang_signal", "is not a signal"},
        {"[{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\","
         " \"bogus\": 1}}]",
         "services[0].health.bogus", "unknown field"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bbt_t b = {0};
        bbt_config(&b, cases[i].services, NULL);
        char log[300];
        snprintf(log, sizeof(log), "%s/cfg.log", b.dir);
        const char *argv[] = {BIGBROTHER, "--config", b.cfg, NULL};
        assert_int_equal(bbt_run(argv, log), 100);
        assert_true(bbt_file_has(log, b.cfg));
        assert_true(bbt_file_has(log, cases[i].field));
        assert_true(bbt_file_has(log, cases[i].why));
    }
    const char *usage[] = {BIGBROTHER, "--bogus", NULL};
    char log[300];
    snprintf(log, sizeof(log), "%s/usage.log", h_tmpdir());
    assert_int_equal(bbt_run(usage, log), 100);
}

/* bbctl logs: the output of the current run of a slot, of an earlier
 * run after a restart (its own log file, kept), --tail, -f until the run ends, 4 for an
 * instance with no log here. */
static void bbctl_logs_of_runs(void **state)
{
    bbt_t b = {0};
    pid_t pids[2];
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, pids, 1);
    json_t *in = bbt_inst(&b, "zone", 0);
    char first[160], out[300], fol[300];
    snprintf(first, sizeof first, "%s", bbt_str(in, "instance"));
    json_decref(in);
    snprintf(out, sizeof out, "%s/logs.out", b.dir);
    snprintf(fol, sizeof fol, "%s/follow.out", b.dir);

    const char *cur[] = {BBCTL, "--socket", b.sock, "logs", first, NULL};
    assert_int_equal(bbt_run(cur, out), 0);
    assert_true(bbt_file_has(out, "msg=ready"));
    assert_false(bbt_file_has(out, "=== bigbrother")); /* the run's own lines only */

    /* kill -9: the slot's next run; the first one's log is still there, and ends */
    assert_int_equal(kill(pids[0], SIGKILL), 0);
    in = bbt_wait(&b, "zone", 0, "ready", 2, h_valgrind() ? 30000 : 5000);
    assert_non_null(in);
    char second[160];
    snprintf(second, sizeof second, "%s", bbt_str(in, "instance"));
    json_decref(in);
    assert_string_not_equal(first, second);
    assert_int_equal(bbt_run(cur, out), 0);
    assert_true(bbt_file_has(out, "msg=ready"));
    char out1[300];
    snprintf(out1, sizeof out1, "%s/logs-tail.out", b.dir);
    const char *tail1[] = {BBCTL, "--socket", b.sock, "logs", first, "--tail", "1", NULL};
    assert_int_equal(bbt_run(tail1, out1), 0);
    assert_true(bbt_file_has(out1, "msg=ready"));
    assert_false(bbt_file_has(out1, "msg=started")); /* one line: the last (ready) */

    /* -f on the running one: its stop lines come, then bbctl ends by itself */
    const char *follow[] = {BBCTL, "--socket", b.sock, "logs", second, "-f", NULL};
    pid_t f = h_spawn(follow, fol, NULL);
    h_sleep_ms(500);
    json_decref(bbt_ctl(&b, "stop zone"));
    int st = h_wait_exit(f, h_valgrind() ? 60000 : 10000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(bbt_file_has(fol, "msg=ready"));
    assert_true(bbt_file_has(fol, "msg=stopped"));

    const char *none[] = {BBCTL, "--socket", b.sock, "logs", "zone-nowhere-1", NULL};
    assert_int_equal(bbt_run(none, out), 4);
    const char *bad[] = {BBCTL, "--socket", b.sock, "logs", NULL};
    assert_int_equal(bbt_run(bad, out), 2);
    h_stop(b.pid, 3000);
}

/* h_wait_until condition: bigbrother (arg, a bbt_t) logged two log rotations. */
static int rotated_twice(void *arg)
{
    return bbt_lines_with(((bbt_t *)arg)->log, "msg=\"log rotated\"") >= 2;
}

/* bbctl logs of a run whose log was rotated (copied to .1, truncated): with fewer lines
 * in the file than --tail, the end of .1 comes first (the header line never); -f goes on
 * from the file's new start when a rotation truncates it under the follower. */
static void bbctl_logs_across_rotations(void **state)
{
    bbt_t b = {0};
    bbt_dirs(&b);
    const char *script =
        "batch() { i=0; while [ $i -lt 100 ]; do\n"
        "  echo \"$1-$i ..................................................\"; i=$((i+1)); done; }\n"
        "wait_for() { while [ ! -e \"$D/$1\" ]; do sleep 0.05; done; }\n"
        "batch first\n"
        "wait_for go1; echo after-rotation\n"
        "wait_for go2; batch second\n"
        "wait_for go3; echo after-second-rotation\n"
        "exec sleep 100\n";
    char svc[1024], flag[300], out[300], fol[300], id[160];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"p\", \"command\": \"/bin/sh\", \"args\": [\"%s\"],"
             " \"env\": {\"D\": \"%s\"}, \"health\": {\"type\": \"none\"},"
             " \"stop\": {\"grace_ms\": 1000}}]",
             h_write_file(b.dir, "batches.sh", script, 0644), b.dir);
    bbt_config(&b, svc, ", \"log_max_bytes\": 4096, \"log_keep\": 2");
    assert_true(bbt_start(&b) > 0);
    json_t *in = bbt_wait(&b, "p", 0, "ready", 1, h_valgrind() ? 30000 : 5000);
    assert_non_null(in);
    snprintf(id, sizeof(id), "%s", bbt_str(in, "instance"));
    json_decref(in);
    snprintf(fol, sizeof(fol), "%s/follow.out", b.dir);

    /* the first batch (6 KB) rotated away: the file holds less than --tail 3 */
    assert_true(bbt_wait_file_has(b.log, "msg=\"log rotated\"", h_valgrind() ? 30000 : 8000));
    const char *tail3[] = {BBCTL, "--socket", b.sock, "logs", id, "--tail", "3", NULL};
    snprintf(out, sizeof(out), "%s/tail3.out", b.dir); /* (bbt_run appends) */
    assert_int_equal(bbt_run(tail3, out), 0);
    assert_int_equal(bbt_lines_with(out, "first-"), 3);
    assert_int_equal(bbt_lines_with(out, "first-99 "), 1);
    assert_int_equal(bbt_lines_with(out, "first-97 "), 1);

    /* one line in the file, --tail 2: the last of .1, then that line */
    snprintf(flag, sizeof(flag), "%s/go1", b.dir);
    fclose(fopen(flag, "w"));
    char link[400];
    snprintf(link, sizeof(link), "%s/logs/p-0.log", b.state);
    assert_true(bbt_wait_file_has(link, "after-rotation", h_valgrind() ? 30000 : 5000));
    const char *tail2[] = {BBCTL, "--socket", b.sock, "logs", id, "--tail", "2", NULL};
    snprintf(out, sizeof(out), "%s/tail2.out", b.dir);
    assert_int_equal(bbt_run(tail2, out), 0);
    assert_int_equal(bbt_lines_with(out, "first-"), 1);
    assert_int_equal(bbt_lines_with(out, "first-99 "), 1);
    assert_int_equal(bbt_lines_with(out, "after-rotation"), 1);
    const char *all[] = {BBCTL, "--socket", b.sock, "logs", id, "--tail", "-1", NULL};
    snprintf(out, sizeof(out), "%s/all.out", b.dir);
    assert_int_equal(bbt_run(all, out), 0);
    assert_int_equal(bbt_lines_with(out, "first-"), 100);
    assert_int_equal(bbt_lines_with(out, "=== bigbrother"), 0);
    /* --tail 0: none, as sdctl logs and kubectl */
    const char *none[] = {BBCTL, "--socket", b.sock, "logs", id, "--tail", "0", NULL};
    snprintf(out, sizeof(out), "%s/none.out", b.dir);
    assert_int_equal(bbt_run(none, out), 0);
    assert_int_equal(bbt_lines_with(out, ""), 0);

    /* a follower across the next rotation */
    const char *follow[] = {BBCTL, "--socket", b.sock, "logs", id, "-f", "--tail", "1", NULL};
    pid_t f = h_spawn(follow, fol, NULL);
    assert_true(bbt_wait_file_has(fol, "after-rotation", h_valgrind() ? 30000 : 5000));
    snprintf(flag, sizeof(flag), "%s/go2", b.dir);
    fclose(fopen(flag, "w"));
    assert_true(h_wait_until(rotated_twice, &b, h_valgrind() ? 30000 : 8000));
    snprintf(flag, sizeof(flag), "%s/go3", b.dir);
    fclose(fopen(flag, "w"));
    assert_true(bbt_wait_file_has(fol, "after-second-rotation", h_valgrind() ? 30000 : 5000));
    json_decref(bbt_ctl(&b, "stop p"));
    int st = h_wait_exit(f, h_valgrind() ? 60000 : 10000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    h_stop(b.pid, 3000);
}

static void bbctl_status_restart_stop_start(void **state)
{
    bbt_t b = {0};
    pid_t pids[2];
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, pids, 1);
    char out[300];
    snprintf(out, sizeof(out), "%s/bbctl.out", b.dir);

    const char *status[] = {BBCTL, "--socket", b.sock, "status", NULL};
    assert_int_equal(bbt_run(status, out), 0);
    assert_true(bbt_file_has(out, "INSTANCE"));
    assert_true(bbt_file_has(out, "RESTARTS"));
    assert_true(bbt_file_has(out, "LAST EXIT"));
    assert_true(bbt_file_has(out, "STATUS")); /* the game's STATUS= (gameproc: map=...) */
    assert_true(bbt_file_has(out, "map="));
    char pidtxt[32];
    snprintf(pidtxt, sizeof(pidtxt), " %d ", (int)pids[1]);
    assert_true(bbt_file_has(out, pidtxt));

    const char *restart[] = {BBCTL, "--socket", b.sock, "restart", "zone", NULL};
    assert_int_equal(bbt_run(restart, out), 0);
    assert_true(bbt_file_has(out, "restart zone: 2 instance(s)"));
    pid_t again[2];
    both_ready(&b, again, 2);
    assert_int_not_equal(again[0], pids[0]);
    assert_int_not_equal(again[1], pids[1]);

    const char *nosuch[] = {BBCTL, "--socket", b.sock, "stop", "nosuch", NULL};
    assert_int_equal(bbt_run(nosuch, out), 4); /* sdctl's table: 4 not found */
    assert_true(bbt_file_has(out, "no instance or service by that name"));

    /* Without --socket: the one bigbrother of the machine, found from its --config; when
     * other tests' bigbrothers run at the same time, the list to pick from names ours. */
    const char *found[] = {BBCTL, "status", NULL};
    int rc = bbt_run(found, out);
    if (rc == 0) {
        assert_true(bbt_file_has(out, "INSTANCE"));
        snprintf(pidtxt, sizeof(pidtxt), " %d ", (int)again[1]);
        assert_true(bbt_file_has(out, pidtxt));
    } else {
        assert_int_equal(rc, 2);
        assert_true(bbt_file_has(out, "bigbrothers run here; choose one with --socket PATH"));
        assert_true(bbt_file_has(out, b.sock));
    }
    const char *version[] = {BBCTL, "--version", NULL};
    assert_int_equal(bbt_run(version, out), 0);
    assert_true(bbt_file_has(out, "bbctl "));

    const char *stop[] = {BBCTL, "--socket", b.sock, "stop", "all", NULL};
    assert_int_equal(bbt_run(stop, out), 0);
    for (int s = 0; s < 2; s++) {
        json_t *in = bbt_wait(&b, "zone", s, "stopped", 1, 5000);
        assert_non_null(in);
        json_decref(in);
        assert_false(bbt_alive(again[s]));
    }
    /* stopped stays stopped across a bigbrother restart (nothing may happen meanwhile) */
    h_stop(b.pid, 3000);
    assert_true(bbt_start(&b) > 0);
    h_sleep_ms(300);
    json_t *in = bbt_inst(&b, "zone", 0);
    assert_string_equal(bbt_str(in, "state"), "stopped");
    json_decref(in);

    const char *start[] = {BBCTL, "--socket", b.sock, "start", "zone", NULL};
    assert_int_equal(bbt_run(start, out), 0);
    both_ready(&b, pids, 3);

    const char *bad[] = {BBCTL, "--socket", b.sock, "frobnicate", NULL};
    assert_int_equal(bbt_run(bad, out), 2);
    h_stop(b.pid, 3000);
    const char *down[] = {BBCTL, "--socket", b.sock, "status", NULL};
    assert_int_equal(bbt_run(down, out), 3);
}

static void agent_with_another_instance_id_is_rejected(void **state)
{
    bbt_t b = {0};
    pid_t pids[2];
    two_gameprocs(&b);
    assert_true(bbt_start(&b) > 0);
    both_ready(&b, pids, 1);
    json_t *in = bbt_inst(&b, "zone", 0);
    char hello[300];
    snprintf(hello, sizeof(hello), "HELLO=1\nINSTANCE=%s\nPROTO=1\n", bbt_str(in, "instance"));
    json_decref(in);

    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, b.agent, strlen(b.agent) + 1);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(send(fd, hello, strlen(hello), 0), (ssize_t)strlen(hello));
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[256];
    assert_int_equal(recv(fd, buf, sizeof(buf), 0), 0); /* closed, no WELCOME */
    close(fd);
    assert_true(bbt_file_has(b.log, "msg=\"agent rejected\""));
    assert_true(bbt_file_has(b.log, "peer is not the instance's process or in its group"));

    /* a first message that is not HELLO, and a malformed one, are rejected too */
    static const char *const bad[] = {"READY=1\n", "HELLO=1\nbad line\n"};
    for (int i = 0; i < 2; i++) {
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        assert_int_equal(send(fd, bad[i], strlen(bad[i]), 0), (ssize_t)strlen(bad[i]));
        assert_int_equal(recv(fd, buf, sizeof(buf), 0), 0);
        close(fd);
    }
    assert_true(bbt_file_has(b.log, "first message must be HELLO=1 with INSTANCE=<id>"));
    assert_true(bbt_file_has(b.log, "msg=\"bad agent message\""));

    /* an sd_notify datagram from a process bigbrother does not supervise is dropped */
    struct sockaddr_un na = {.sun_family = AF_UNIX};
    char npath[400];
    snprintf(npath, sizeof(npath), "%s/notify.sock", b.state);
    assert_true(strlen(npath) < sizeof(na.sun_path));
    memcpy(na.sun_path, npath, strlen(npath) + 1);
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_int_equal(sendto(fd, "STOPPING=1\n", 11, 0, (struct sockaddr *)&na, sizeof(na)), 11);
    close(fd);
    assert_true(bbt_wait_file_has(b.log, "sender is not a supervised process", 3000));
    /* the real process keeps its connection and its state */
    in = bbt_inst(&b, "zone", 0);
    assert_string_equal(bbt_str(in, "state"), "ready");
    assert_int_equal(bbt_int(in, "pid"), pids[0]);
    assert_true(json_is_true(json_object_get(in, "agent")));
    json_decref(in);
    h_stop(b.pid, 3000);
}

/* A bigbrother of machine `machine` with no service (its own config, the harness's names
 * machine m1). */
static void start_machine(bbt_t *b, const char *machine)
{
    bbt_dirs(b);
    char text[600];
    snprintf(text, sizeof text,
             "{\"machine\": \"%s\", \"cluster\": \"c1\", \"state_dir\": \"%s\", "
             "\"services\": []}", machine, b->state);
    snprintf(b->cfg, sizeof b->cfg, "%s", h_write_file(b->dir, "bb.json", text, 0644));
    assert_true(bbt_start(b) > 0);
}

/* Two bigbrothers on the machine (the suite may run more): bbctl without --socket lists
 * them with their machine names and exits 2 (usage: which one is the caller's to say);
 * --machine NAME or BBCTL_SOCKET picks one; a --machine nobody runs is exit 3. */
static void bbctl_chooses_among_several(void **state)
{
    bbt_t b1 = {0}, b2 = {0};
    char m1[64], m2[64], out[300];
    snprintf(m1, sizeof m1, "bbctl-a-%d", (int)getpid());
    snprintf(m2, sizeof m2, "bbctl-b-%d", (int)getpid());
    start_machine(&b1, m1);
    start_machine(&b2, m2);
    snprintf(out, sizeof out, "%s/bbctl.out", b1.dir);

    const char *any[] = {BBCTL, "status", NULL};
    assert_int_equal(bbt_run(any, out), 2);
    char line[800];
    snprintf(line, sizeof line, "machine %s (pid %d): --socket %s", m1, (int)b1.pid, b1.sock);
    assert_true(bbt_file_has(out, line));
    snprintf(line, sizeof line, "machine %s (pid %d): --socket %s", m2, (int)b2.pid, b2.sock);
    assert_true(bbt_file_has(out, line));
    assert_true(bbt_file_has(out, "--machine NAME"));

    snprintf(out, sizeof out, "%s/bbctl-machine.out", b1.dir); /* bbt_run appends */
    const char *by_machine[] = {BBCTL, "--machine", m2, "-o", "json", "status", NULL};
    assert_int_equal(bbt_run(by_machine, out), 0);
    assert_true(bbt_file_has(out, m2));
    assert_false(bbt_file_has(out, m1));

    setenv("BBCTL_SOCKET", b1.sock, 1);
    snprintf(out, sizeof out, "%s/bbctl-env.out", b1.dir);
    const char *by_env[] = {BBCTL, "-o", "json", "status", NULL};
    assert_int_equal(bbt_run(by_env, out), 0);
    assert_true(bbt_file_has(out, m1));
    unsetenv("BBCTL_SOCKET");

    const char *nobody[] = {BBCTL, "--machine", "no-such-machine", "status", NULL};
    assert_int_equal(bbt_run(nobody, out), 3);
    assert_true(bbt_file_has(out, "no bigbrother of machine 'no-such-machine'"));
    h_stop(b1.pid, 3000);
    h_stop(b2.pid, 3000);
}

int main(void)
{
    h_init(70);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(survives_kill9_of_bigbrother),
        cmocka_unit_test(sigterm_leaves_processes_running),
        cmocka_unit_test(sighup_reexecs_and_keeps_processes),
        cmocka_unit_test(lock_file_stops_a_second_bigbrother),
        cmocka_unit_test(config_errors_name_file_and_field),
        cmocka_unit_test(bbctl_status_restart_stop_start),
        cmocka_unit_test(bbctl_chooses_among_several),
        cmocka_unit_test(bbctl_logs_of_runs),
        cmocka_unit_test(bbctl_logs_across_rotations),
        cmocka_unit_test(agent_with_another_instance_id_is_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
