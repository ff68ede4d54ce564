/* bigbrother supervising real gameproc processes: hangs (SIGSTOP) are killed and
 * restarted within liveness + grace + 1 s with reason hung; kill -9 gives
 * killed(signal 9); a process that never gets ready gives start_timeout; a crash loop
 * ends in failed and stays there until an operator starts it; --ignore-term is
 * SIGKILLed after the grace; an sd_notify program and probe-checked programs (udp
 * query, http, exec) are supervised without the shim. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness_bigbrother.h"

/* Starts bigbrother with one service "g" running gameproc with `args` (JSON array
 * items), the given health / restart / stop objects and count. */
static void start_one(bbt_t *b, const char *args, const char *health, const char *restart,
                      const char *stop, int count)
{
    char svc[2048];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"g\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\"%s%s],"
             " \"count\": %d, \"health\": %s, \"restart\": %s, \"stop\": %s,"
             " \"cwd\": \"%s\", \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, args[0] ? ", " : "", args, count, health, restart, stop, h_tmpdir());
    bbt_config(b, svc, NULL);
    assert_true(bbt_start(b) > 0);
}

#define AGENT_HEALTH "{\"type\": \"agent\", \"start_timeout_ms\": 3000, \"liveness_timeout_ms\": 1000}"
#define FAST_RESTART "{\"policy\": \"always\", \"backoff_min_ms\": 50, \"backoff_max_ms\": 200, \"max_restarts\": 10, \"window_s\": 60}"
#define STOP_1S "{\"signal\": \"TERM\", \"grace_ms\": 1000}"

static void hang_is_killed_and_restarted(void **state)
{
    bbt_t b = {0};
    start_one(&b, "", AGENT_HEALTH, FAST_RESTART, STOP_1S, 2);
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, 5000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    char id[160];
    snprintf(id, sizeof(id), "%s", bbt_str(in, "instance"));
    json_decref(in);
    json_t *other = bbt_wait(&b, "g", 1, "ready", 1, 5000);
    assert_non_null(other);
    pid_t other_pid = (pid_t)bbt_int(other, "pid");
    json_decref(other);

    int64_t t0 = h_now_ms();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    in = bbt_wait(&b, "g", 0, "ready", 2, 1000 + 1000 + 1000 + 2000);
    assert_non_null(in);
    int64_t took = h_now_ms() - t0;
    /* restarted: a new pid, the old one is gone, the reason says hung and how long */
    assert_int_not_equal(bbt_int(in, "pid"), pid);
    assert_true(took <= 1000 + 1000 + 1000);
    assert_string_equal(bbt_str(in, "reason"), "hung");
    assert_non_null(strstr(bbt_str(in, "detail"), "liveness deadline 1000 ms missed"));
    assert_int_equal(bbt_int(in, "restarts"), 1);
    json_decref(in);
    assert_false(bbt_alive(pid));
    assert_true(bbt_file_has(b.log, "msg=\"instance hung\""));
    /* the other instance was not touched */
    other = bbt_inst(&b, "g", 1);
    assert_int_equal(bbt_int(other, "pid"), other_pid);
    assert_int_equal(bbt_int(other, "generation"), 1);
    json_decref(other);

    /* what went to the outbox for ServerDir: started, ready, stopped(hung) */
    json_t *evs = bbt_events_of(&b, id);
    assert_int_equal(json_array_size(evs), 3);
    json_t *ev = json_array_get(evs, 0);
    assert_string_equal(bbt_str(ev, "type"), "started");
    assert_string_equal(bbt_str(ev, "service"), "g");
    assert_string_equal(bbt_str(ev, "machine"), "m1");
    assert_int_equal(bbt_int(ev, "pid"), pid);
    assert_int_equal(bbt_int(ev, "slot"), 0);
    assert_int_equal(bbt_int(ev, "generation"), 1);
    assert_true(bbt_int(ev, "ts_ms") > 0);
    assert_true(bbt_str(ev, "id")[0] != 0);
    assert_string_equal(bbt_str(json_array_get(evs, 1), "type"), "ready");
    ev = json_array_get(evs, 2);
    assert_string_equal(bbt_str(ev, "type"), "stopped");
    assert_string_equal(bbt_str(ev, "reason"), "hung");
    assert_int_equal(bbt_int(ev, "signal"), 6); /* the hang signal did it */
    assert_true(json_is_null(json_object_get(ev, "code")));
    assert_true(bbt_int(ev, "silent_ms") >= 1000 - 50);
    assert_true(bbt_int(ev, "silent_ms") <= 1000 + 1000);
    assert_string_equal(bbt_str(ev, "detail"), "liveness deadline 1000 ms missed");
    json_decref(evs);
    h_stop(b.pid, 3000);
}

static void kill9_is_reported_and_restarted(void **state)
{
    bbt_t b = {0};
    start_one(&b, "", AGENT_HEALTH, FAST_RESTART, STOP_1S, 1);
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, 5000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    kill(pid, SIGKILL);
    in = bbt_wait(&b, "g", 0, "ready", 2, 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "killed");
    assert_int_equal(bbt_int(in, "signal"), 9);
    assert_string_equal(bbt_str(in, "reason_text"), "killed(signal 9)");
    assert_int_not_equal(bbt_int(in, "pid"), pid);
    json_decref(in);
    h_stop(b.pid, 3000);
}

static void never_ready_is_start_timeout(void **state)
{
    bbt_t b = {0};
    start_one(&b, "\"--slow-start\", \"60\"",
              "{\"type\": \"agent\", \"start_timeout_ms\": 800, \"liveness_timeout_ms\": 1000}",
              FAST_RESTART, "{\"grace_ms\": 500}", 1);
    json_t *in = bbt_wait(&b, "g", 0, "starting", 1, 3000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    in = bbt_wait(&b, "g", 0, "starting", 2, 800 + 500 + 2000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "start_timeout");
    assert_non_null(strstr(bbt_str(in, "detail"), "start deadline 800 ms missed"));
    assert_int_not_equal(bbt_int(in, "pid"), pid);
    json_decref(in);
    assert_false(bbt_alive(pid));
    h_stop(b.pid, 3000);
}

static void crash_loop_fails_until_operator_start(void **state)
{
    bbt_t b = {0};
    start_one(&b, "\"--crash-after\", \"0.05\", \"--exit-code\", \"3\"", AGENT_HEALTH,
              "{\"policy\": \"on-failure\", \"backoff_min_ms\": 10, \"backoff_max_ms\": 50,"
              " \"max_restarts\": 3, \"window_s\": 60}",
              STOP_1S, 1);
    json_t *in = bbt_wait(&b, "g", 0, "failed", 1, 8000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "crash_loop");
    assert_int_equal(bbt_int(in, "code"), 3);
    assert_int_equal(bbt_int(in, "generation"), 4); /* the first run + 3 restarts */
    assert_non_null(strstr(bbt_str(in, "detail"), "3 restarts in 60 s; last: exited(code 3)"));
    assert_int_equal(bbt_int(in, "pid"), 0);
    json_decref(in);
    /* kept failed: no more spawns */
    h_sleep_ms(500);
    in = bbt_inst(&b, "g", 0);
    assert_string_equal(bbt_str(in, "state"), "failed");
    assert_int_equal(bbt_int(in, "generation"), 4);
    json_decref(in);
    assert_true(bbt_file_has(b.log, "instance failed: crash loop"));
    /* an operator start gives it a fresh window */
    json_t *ans = bbt_ctl(&b, "start g");
    assert_int_equal(bbt_int(ans, "matched"), 1);
    json_decref(ans);
    in = bbt_wait(&b, "g", 0, "failed", 5, 8000);
    assert_non_null(in);
    assert_int_equal(bbt_int(in, "generation"), 8);
    json_decref(in);
    h_stop(b.pid, 3000);
}

static void ignore_term_is_killed_after_the_grace(void **state)
{
    bbt_t b = {0};
    start_one(&b, "\"--ignore-term\"", AGENT_HEALTH, FAST_RESTART,
              "{\"signal\": \"TERM\", \"grace_ms\": 700}", 1);
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, 5000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    int64_t t0 = h_now_ms();
    json_t *ans = bbt_ctl(&b, "stop g");
    assert_int_equal(bbt_int(ans, "matched"), 1);
    json_decref(ans);
    /* SHUTDOWN ignored for one grace, SIGTERM ignored for another, then SIGKILL */
    in = bbt_wait(&b, "g", 0, "stopped", 1, 700 * 2 + 2000);
    assert_non_null(in);
    int64_t took = h_now_ms() - t0;
    assert_true(took >= 2 * 700 - 50);
    assert_true(took <= 2 * 700 + 1000);
    assert_string_equal(bbt_str(in, "reason"), "stopped_by_operator");
    assert_int_equal(bbt_int(in, "signal"), 9);
    json_decref(in);
    assert_false(bbt_alive(pid));
    assert_true(bbt_file_has(b.log, "instance killed after the grace"));
    /* held stopped: not restarted */
    h_sleep_ms(300);
    in = bbt_inst(&b, "g", 0);
    assert_string_equal(bbt_str(in, "state"), "stopped");
    json_decref(in);
    h_stop(b.pid, 3000);
}

static void sd_notify_program_is_supervised(void **state)
{
    bbt_t b = {0};
    start_one(&b, "\"--notify\"",
              "{\"type\": \"notify\", \"start_timeout_ms\": 3000, \"liveness_timeout_ms\": 1000}",
              FAST_RESTART, STOP_1S, 1);
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, 5000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    assert_false(json_is_true(json_object_get(in, "agent"))); /* no shim connection */
    json_decref(in);
    /* stays ready on WATCHDOG=1 alone, well past the liveness deadline */
    h_sleep_ms(1500);
    in = bbt_inst(&b, "g", 0);
    assert_string_equal(bbt_str(in, "state"), "ready");
    assert_int_equal(bbt_int(in, "pid"), pid);
    json_decref(in);
    /* and a stopped watchdog is a hang */
    kill(pid, SIGSTOP);
    in = bbt_wait(&b, "g", 0, "ready", 2, 1000 + 1000 + 2000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "hung");
    json_decref(in);
    h_stop(b.pid, 3000);
}

static void udp_query_probe(void **state)
{
    bbt_t b = {0};
    int port = h_free_port();
    char args[128], health[512];
    snprintf(args, sizeof(args), "\"--no-agent\", \"--udp-port\", \"127.0.0.1:%d\"", port);
    snprintf(health, sizeof(health),
             "{\"type\": \"udp\", \"port\": %d, \"query\": \"\\\\xff\\\\xff\\\\xff\\\\xffgetstatus\","
             " \"expect\": \"\\\\xff\\\\xff\\\\xff\\\\xffstatusResponse\", \"period_ms\": 200,"
             " \"failure_threshold\": 2, \"timeout_ms\": 200, \"start_timeout_ms\": 3000}",
             port);
    start_one(&b, args, health, FAST_RESTART, STOP_1S, 1);
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, 5000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    kill(pid, SIGSTOP); /* the query port stops answering */
    in = bbt_wait(&b, "g", 0, "ready", 2, 200 * 3 + 200 + 1000 + 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "hung");
    assert_non_null(strstr(bbt_str(in, "detail"), "consecutive probe failures"));
    json_decref(in);
    h_stop(b.pid, 3000);
}

/* The http probe against a real HTTP program: serverdir with no Redis answers /healthz
 * 200 (alive) and /readyz 503 (Redis unreachable). */
static void start_http(bbt_t *b, int port, const char *path)
{
    char svc[2048];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"g\", \"command\": \"%s/serverdir\", \"args\": [\"--listen\","
             " \"127.0.0.1:%d\", \"--redis\", \"redis://127.0.0.1:%d\", \"--threads\", \"1\"],"
             " \"health\": {\"type\": \"http\", \"port\": %d, \"path\": \"%s\", \"period_ms\": 100,"
             " \"failure_threshold\": 2, \"timeout_ms\": 300, \"start_timeout_ms\": 1500},"
             " \"restart\": %s, \"stop\": %s, \"cwd\": \"%s\", \"rlimits\": {\"core\": 0}}]",
             SD_BIN_DIR, port, h_free_port(), port, path, FAST_RESTART, STOP_1S, h_tmpdir());
    bbt_config(b, svc, NULL);
    assert_true(bbt_start(b) > 0);
}

static void http_probe(void **state)
{
    bbt_t b = {0};
    int port = h_free_port();
    start_http(&b, port, "/healthz");
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, 5000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    kill(pid, SIGSTOP); /* accepts (the kernel does) but never answers: the timeouts count */
    in = bbt_wait(&b, "g", 0, "ready", 2, 100 * 2 + 300 * 2 + 1000 + 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "hung");
    assert_non_null(strstr(bbt_str(in, "detail"), "consecutive probe failures"));
    assert_int_not_equal(bbt_int(in, "pid"), pid);
    json_decref(in);
    bbt_stop(&b, 3000);
}

static void http_probe_wants_2xx_3xx(void **state)
{
    bbt_t b = {0};
    start_http(&b, h_free_port(), "/readyz"); /* 503 while Redis is unreachable */
    h_sleep_ms(700); /* several probe periods in which it must not become ready */
    json_t *in = bbt_inst(&b, "g", 0);
    assert_non_null(in);
    /* answered, but 503; and serverdir's own sd_notify READY=1 does not count either */
    assert_string_equal(bbt_str(in, "state"), "starting");
    json_decref(in);
    in = bbt_wait(&b, "g", 0, "starting", 2, 1500 + 1000 + 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "start_timeout");
    json_decref(in);
    bbt_stop(&b, 3000);
}

static void exec_probe(void **state)
{
    bbt_t b = {0};
    char health[512], flag[300];
    snprintf(flag, sizeof(flag), "%s/healthy", h_tmpdir());
    snprintf(health, sizeof(health),
             "{\"type\": \"exec\", \"command\": \"test -e %s\", \"period_ms\": 100,"
             " \"failure_threshold\": 3, \"timeout_ms\": 1000, \"start_timeout_ms\": 5000}",
             flag);
    start_one(&b, "\"--no-agent\"", health, FAST_RESTART, STOP_1S, 1);
    h_sleep_ms(500); /* several check periods in which it must not become ready */
    json_t *in = bbt_inst(&b, "g", 0);
    assert_string_equal(bbt_str(in, "state"), "starting"); /* the check fails: not ready */
    json_decref(in);
    FILE *f = fopen(flag, "w");
    assert_non_null(f);
    fclose(f);
    in = bbt_wait(&b, "g", 0, "ready", 1, 3000);
    assert_non_null(in);
    json_decref(in);
    unlink(flag);
    in = bbt_wait(&b, "g", 0, "starting", 2, 100 * 4 + 1000 + 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "hung");
    json_decref(in);
    h_stop(b.pid, 3000);
}

/* Environment, cwd, logs rotated by size while the process runs, and a clean exit under
 * on-failure is not restarted. */
static void env_cwd_logs_and_on_failure(void **state)
{
    bbt_t b = {0};
    const char *cwd = h_tmpdir();
    char svc[2048];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"sh\", \"command\": \"/bin/sh\", \"cwd\": \"%s\","
             " \"env\": {\"MAP\": \"q3dm17\"}, \"rlimits\": {\"fsize\": 10485760},"
             " \"args\": [\"-c\", \"env; echo cwd=$(pwd); echo fsize=$(ulimit -f); sleep 0.3;"
             " head -c 20000 /dev/zero | tr '\\\\0' x; echo; exec sleep 100\"],"
             " \"health\": {\"type\": \"none\"}},"
             " {\"name\": \"once\", \"command\": \"/bin/sh\", \"args\": [\"-c\", \"exit 0\"],"
             " \"health\": {\"type\": \"none\"}, \"restart\": {\"policy\": \"on-failure\"}}]",
             cwd);
    bbt_config(&b, svc, ", \"log_max_bytes\": 4096, \"log_keep\": 2");
    assert_true(bbt_start(&b) > 0);
    json_t *in = bbt_wait(&b, "sh", 0, "ready", 1, 3000);
    assert_non_null(in);
    char inst[160], id[180];
    snprintf(inst, sizeof(inst), "%s", bbt_str(in, "instance"));
    snprintf(id, sizeof(id), "BB_INSTANCE=%s", inst);
    json_decref(in);
    in = bbt_wait(&b, "once", 0, "exited", 1, 3000);
    assert_non_null(in);
    assert_string_equal(bbt_str(in, "reason"), "exited");
    assert_int_equal(bbt_int(in, "code"), 0);
    json_decref(in);

    /* the instance's own log, and the slot's link to it */
    char log[600], rotated[610], want[400], link[400], target[300];
    snprintf(log, sizeof(log), "%s/logs/sh-0/%s.log", b.state, inst);
    snprintf(rotated, sizeof(rotated), "%s.1", log);
    snprintf(link, sizeof(link), "%s/logs/sh-0.log", b.state);
    ssize_t tn = readlink(link, target, sizeof(target) - 1);
    assert_true(tn > 0);
    target[tn] = 0;
    snprintf(want, sizeof(want), "sh-0/%s.log", inst);
    assert_string_equal(target, want);
    bbt_wait_file_has(rotated, "xxxx", 6000);
    assert_true(bbt_file_has(rotated, id));
    assert_true(bbt_file_has(rotated, "BB_MACHINE=m1"));
    assert_true(bbt_file_has(rotated, "BB_CLUSTER=c1"));
    assert_true(bbt_file_has(rotated, "MAP=q3dm17"));
    snprintf(want, sizeof(want), "BB_SOCKET=%s", b.agent);
    assert_true(bbt_file_has(rotated, want));
    snprintf(want, sizeof(want), "NOTIFY_SOCKET=%s/notify.sock", b.state);
    assert_true(bbt_file_has(rotated, want));
    snprintf(want, sizeof(want), "cwd=%s", cwd);
    assert_true(bbt_file_has(rotated, want));
    assert_true(bbt_file_has(rotated, "fsize=20480"));
    /* bigbrother logs the rotation after the copy and the truncation (under valgrind a
     * moment after the copy shows up) */
    bbt_wait_file_has(b.log, "msg=\"log rotated\"", 6000);
    assert_true(bbt_file_has(b.log, "msg=\"log rotated\""));
    struct stat st, lst;
    assert_int_equal(stat(log, &st), 0);
    assert_true(st.st_size < 4096); /* truncated after the copy */
    assert_int_equal(stat(link, &lst), 0); /* tail -F logs/sh-0.log reads the same file */
    assert_int_equal(lst.st_ino, st.st_ino);
    /* the clean exit stays exited */
    in = bbt_inst(&b, "once", 0);
    assert_string_equal(bbt_str(in, "state"), "exited");
    assert_int_equal(bbt_int(in, "generation"), 1);
    json_decref(in);
    h_stop(b.pid, 3000);
}

/* The run logs of slot dir (STATE_DIR/logs/sh-0): names of its *.log files into names
 * (at most max), how many; *rotations counts the other files (.log.N). */
static int run_logs(const char *dir, char names[][200], int max, int *rotations)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    *rotations = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.')
            continue;
        if (len > 4 && !strcmp(e->d_name + len - 4, ".log") && n < max)
            snprintf(names[n++], 200, "%s", e->d_name);
        else
            (*rotations)++;
    }
    closedir(d);
    return n;
}

/* One log file per instance: a slot restarted 4 times under log_runs 2
 * keeps the logs of its last 2 instances, each holding its own run only (its header
 * first, its own output), logs/sh-0.log links to the current one, and the slot log of
 * the old layout found at the first start is kept as before-upgrade.log until pruned. */
static void log_file_per_instance_and_log_runs(void **state)
{
    bbt_t b = {0};
    char svc[1024], dir[400], link[400], path[700], want[400], target[300];
    snprintf(svc, sizeof(svc),
             "[{\"name\": \"sh\", \"command\": \"/bin/sh\", \"args\": [\"-c\","
             " \"echo hello from $BB_INSTANCE; exec sleep 100\"],"
             " \"health\": {\"type\": \"none\"}, \"restart\": %s, \"stop\": %s}]",
             FAST_RESTART, STOP_1S);
    bbt_config(&b, svc, ", \"log_runs\": 2");
    /* the old layout: one file per slot, every run in it, and its rotation */
    snprintf(dir, sizeof(dir), "%s/logs", b.state);
    assert_int_equal(mkdir(b.state, 0750), 0);
    assert_int_equal(mkdir(dir, 0750), 0);
    snprintf(link, sizeof(link), "%s/logs/sh-0.log", b.state);
    h_write_file(dir, "sh-0.log", "=== bigbrother old run\nold output\n", 0640);
    h_write_file(dir, "sh-0.log.1", "older output\n", 0640);
    snprintf(dir, sizeof(dir), "%s/logs/sh-0", b.state);
    assert_true(bbt_start(&b) > 0);

    char ids[5][160], names[16][200];
    int rotations;
    for (int g = 1; g <= 5; g++) {
        json_t *in = bbt_wait(&b, "sh", 0, "ready", g, h_valgrind() ? 30000 : 5000);
        assert_non_null(in);
        snprintf(ids[g - 1], sizeof(ids[g - 1]), "%s", bbt_str(in, "instance"));
        pid_t pid = (pid_t)bbt_int(in, "pid");
        json_decref(in);
        /* its output, through the slot link */
        snprintf(want, sizeof(want), "hello from %.159s", ids[g - 1]);
        assert_true(bbt_wait_file_has(link, want, h_valgrind() ? 30000 : 5000));
        if (g == 1) { /* the old slot log moved into the slot directory, a link in its place */
            snprintf(path, sizeof(path), "%s/before-upgrade.log", dir);
            assert_true(bbt_file_has(path, "old output"));
            snprintf(path, sizeof(path), "%s/before-upgrade.log.1", dir);
            assert_true(bbt_file_has(path, "older output"));
            assert_int_equal(run_logs(dir, names, 16, &rotations), 2);
            assert_int_equal(rotations, 1);
        }
        if (g < 5)
            assert_int_equal(kill(pid, SIGKILL), 0);
    }

    /* the last two instances' logs, no rotation left, nothing of the older runs */
    assert_int_equal(run_logs(dir, names, 16, &rotations), 2);
    assert_int_equal(rotations, 0);
    for (int k = 3; k < 5; k++) {
        snprintf(path, sizeof(path), "%s/%s.log", dir, ids[k]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        char first[512] = "";
        assert_non_null(fgets(first, sizeof(first), f));
        fclose(f);
        snprintf(want, sizeof(want), ": starting instance %s (generation %d)\n", ids[k], k + 1);
        assert_int_equal(strncmp(first, "=== bigbrother ", 15), 0);
        assert_non_null(strstr(first, want));
        assert_int_equal(bbt_lines_with(path, "=== bigbrother"), 1);
        assert_int_equal(bbt_lines_with(path, "hello from"), 1);
        snprintf(want, sizeof(want), "hello from %s", ids[k]);
        assert_int_equal(bbt_lines_with(path, want), 1);
    }
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof(path), "%s/%.159s.log", dir, ids[k]);
        assert_int_not_equal(access(path, F_OK), 0);
    }
    ssize_t tn = readlink(link, target, sizeof(target) - 1);
    assert_true(tn > 0);
    target[tn] = 0;
    snprintf(want, sizeof(want), "sh-0/%s.log", ids[4]);
    assert_string_equal(target, want);
    assert_true(bbt_file_has(b.log, "msg=\"old logs removed\" slot=sh-0 removed=1"));

    /* the control socket's logs request: a kept earlier run by its file, a pruned one
     * not found */
    snprintf(want, sizeof(want), "logs %s", ids[3]);
    json_t *ans = bbt_ctl(&b, want);
    snprintf(path, sizeof(path), "%s/%s.log", dir, ids[3]);
    assert_string_equal(bbt_str(ans, "path"), path);
    assert_false(json_is_true(json_object_get(ans, "running")));
    json_decref(ans);
    snprintf(want, sizeof(want), "logs %s", ids[0]);
    ans = bbt_ctl(&b, want);
    assert_string_equal(bbt_str(ans, "code"), "not_found");
    json_decref(ans);
    bbt_stop(&b, 3000);
}

int main(void)
{
    h_init(90);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hang_is_killed_and_restarted),
        cmocka_unit_test(kill9_is_reported_and_restarted),
        cmocka_unit_test(never_ready_is_start_timeout),
        cmocka_unit_test(crash_loop_fails_until_operator_start),
        cmocka_unit_test(ignore_term_is_killed_after_the_grace),
        cmocka_unit_test(sd_notify_program_is_supervised),
        cmocka_unit_test(udp_query_probe),
        cmocka_unit_test(http_probe),
        cmocka_unit_test(http_probe_wants_2xx_3xx),
        cmocka_unit_test(exec_probe),
        cmocka_unit_test(env_cwd_logs_and_on_failure),
        cmocka_unit_test(log_file_per_instance_and_log_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
