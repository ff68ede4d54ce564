/* The README's main command, scripts/cluster.sh, run twice on its own ports and state dir
 * with this build's binaries (SD_BIN: no package check, no build): each run reports 1
 * machine, 3 ready zone servers, player locks and 3 master servers, the API agrees, and a
 * Ctrl-C (SIGINT to the script) stops every process it started. The second run starts
 * from the first one's state, where the Ctrl-C left the zone servers stopped by operator
 * (a second run once came up with no process). */
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
#include <sys/wait.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "harness_sdctl.h"

static char dir[400], url[64], sdport_env[32], rport_env[32], dir_env[450], bin_env[600],
    logs_env[32];
static const char *mode_env = "SD_REDIS=";
static int port, rport, nredis = 1; /* the Redis ports: rport .. rport + nredis - 1 */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    (void)n;
    fclose(f);
    return buf;
}

/* Processes whose environment names this cluster's serverdir (the zone servers get
 * SERVERDIR_URL) or whose command line names its state dir or ports. */
static int leftovers(void)
{
    char want_env[80], want_port[32];
    snprintf(want_env, sizeof want_env, "SERVERDIR_URL=%s", url);
    snprintf(want_port, sizeof want_port, "127.0.0.1:%d", port);
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == getpid())
            continue;
        char path[64], buf[8192];
        const char *files[] = {"environ", "cmdline"};
        for (int k = 0; k < 2; k++) {
            snprintf(path, sizeof path, "/proc/%d/%s", pid, files[k]);
            FILE *f = fopen(path, "r");
            if (!f)
                continue;
            size_t len = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            for (size_t i = 0; i < len; i++)
                if (!buf[i])
                    buf[i] = ' ';
            buf[len] = '\0';
            int dead = 0;
            snprintf(path, sizeof path, "/proc/%d/stat", pid);
            char *st = slurp(path);
            if (st && strstr(st, ") Z "))
                dead = 1; /* a zombie the subreaper (this test) has not reaped yet */
            free(st);
            int redis = 0;
            for (int i = 0; k == 1 && i < nredis; i++) {
                char rp[32];
                snprintf(rp, sizeof rp, "127.0.0.1:%d", rport + i);
                redis |= strstr(buf, rp) != NULL; /* redis-server's title */
            }
            if (!dead && (strstr(buf, want_env) || strstr(buf, dir) || redis ||
                          (k == 1 && strstr(buf, want_port)))) {
                print_message("left over: pid %d %s\n", pid, buf);
                n++;
                break;
            }
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* The token of `role` in the tokens file the script made, into tok; "" when absent. */
static const char *script_token(const char *role, char *tok, size_t cap)
{
    char path[500], line[512];
    snprintf(path, sizeof path, "%s/tokens", dir);
    tok[0] = '\0';
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        char r[32], t[300];
        if (sscanf(line, "%31s %299s", r, t) == 2 && !strcmp(r, role)) {
            snprintf(tok, cap, "%s", t);
            break;
        }
    }
    if (f)
        fclose(f);
    return tok;
}

static int count_ready(void)
{
    char u[128], tok[300];
    snprintf(u, sizeof u, "%s/v1/clusters/local/processes?state=ready", url);
    h_resp_t r = {0};
    if (h_http("GET", u, script_token("viewer", tok, sizeof tok), NULL, NULL, 0, NULL, &r) != 0 ||
        r.status != 200) {
        h_resp_free(&r);
        return -1;
    }
    json_t *j = h_resp_json(&r);
    int n = (int)json_array_size(json_object_get(j, "processes"));
    json_decref(j);
    h_resp_free(&r);
    return n;
}

/* What banner_or_exit watches: the script's pid and output file; out (malloc'd, the
 * caller frees) is the output last read, exited/status tell an early exit. */
typedef struct {
    pid_t pid;
    const char *log;
    char *out;
    int exited, status;
} banner_wait_t;

/* h_wait_until condition: the script's output shows the banner, or the script exited. */
static int banner_or_exit(void *arg)
{
    banner_wait_t *w = arg;
    free(w->out);
    w->out = slurp(w->log);
    if (w->out && strstr(w->out, "Press Ctrl-C to stop."))
        return 1;
    w->exited = h_exited(w->pid, &w->status);
    return w->exited;
}

/* h_wait_until condition: no process of the script is left. */
static int no_leftovers(void *arg)
{
    (void)arg;
    return leftovers() == 0;
}

/* One run: start, wait for the banner, check it and the API, Ctrl-C, check nothing is
 * left. */
static void one_run(int round)
{
    char log[500];
    snprintf(log, sizeof log, "%s/script-%d.out", h_tmpdir(), round);
    const char *argv[] = {"/bin/bash", SD_SOURCE_DIR "/scripts/cluster.sh", NULL};
    const char *env[] = {sdport_env, rport_env, dir_env, bin_env, mode_env, logs_env, NULL};
    pid_t pid = h_spawn(argv, log, env);
    assert_true(pid > 0);
    banner_wait_t w = {pid, log, NULL, 0, 0};
    h_wait_until(banner_or_exit, &w, 60000);
    char *out = w.out;
    if (w.exited)
        fail_msg("cluster.sh exited early (status %d):\n%s", w.status, out ? out : "");
    if (!out || !strstr(out, "Press Ctrl-C to stop."))
        fail_msg("no banner within 60 s:\n%s", out ? out : "");
    if (!strstr(out, "machines:           1 ") || !strstr(out, "processes ready:    3 ") ||
        !strstr(out, "master servers:     3") || strstr(out, "player locks held:  0 "))
        fail_msg("round %d: unexpected banner:\n%s", round, out);
    free(out);
    assert_int_equal(count_ready(), 3);
    /* The script's bindings hold: its bigbrother token speaks for local-1 only, and
     * without a token nothing is shown. The zone servers have no token at all: the player
     * locks the banner counted were taken with their instance credentials. */
    char tok[300], u[160], game[300];
    assert_string_equal(script_token("game", game, sizeof game), "");
    assert_true(strlen(script_token("bigbrother", tok, sizeof tok)) >= 16);
    snprintf(u, sizeof u, "%s/v1/clusters/local/machines/local-2", url);
    h_resp_t r = {0};
    assert_int_equal(h_http("PUT", u, tok, NULL, "{}", 2, NULL, &r), 0);
    assert_int_equal(r.status, 403);
    h_resp_free(&r);
    snprintf(u, sizeof u, "%s/v1/clusters/local/processes", url);
    assert_int_equal(h_http("GET", u, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    h_resp_free(&r);

    /* sdctl logs, as the banner says: a zone server's output through its machine's
     * bigbrother (logs_listen), with the viewer token */
    snprintf(u, sizeof u, "%s/v1/clusters/local/processes?state=ready", url);
    assert_int_equal(h_http("GET", u, script_token("viewer", tok, sizeof tok), NULL, NULL, 0,
                            NULL, &r), 0);
    json_t *j = h_resp_json(&r);
    h_resp_free(&r);
    char inst[160];
    snprintf(inst, sizeof inst, "%s",
             json_string_value(json_object_get(json_array_get(json_object_get(j, "processes"), 0),
                                               "instance")));
    json_decref(j);
    char env_url[200], env_tok[400], logs[8192];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", url);
    snprintf(env_tok, sizeof env_tok, "SERVERDIR_TOKEN=%s", tok);
    const char *senv[] = {env_url, env_tok, "SERVERDIR_CLUSTER=local", NULL};
    const char *args[] = {"logs", inst, "--tail", "5", NULL};
    int lrc = h_sdctl_run(args, senv, 15000, logs, sizeof logs);
    if (lrc != 0 || !strstr(logs, "level=info msg="))
        fail_msg("round %d: sdctl logs %s -> %d:\n%s", round, inst, lrc, logs);

    kill(-pid, SIGINT); /* what a Ctrl-C delivers: SIGINT to the script's process group,
                           so a command it runs in the foreground gets it too (bash acts
                           on a SIGINT its foreground child survived only after the child
                           ends); its daemons run in their own sessions */
    int status = h_wait_exit(pid, 45000); /* at most 10 s for the games, 5 + 10 s for the daemons */
    if (!WIFEXITED(status)) {
        char *tail = slurp(log);
        fail_msg("round %d: cluster.sh did not end within 45 s of its Ctrl-C:\n%s", round,
                 tail ? tail : "");
    }
    assert_int_equal(WEXITSTATUS(status), 130);
    assert_int_equal(count_ready(), -1); /* serverdir is gone */
    assert_true(h_wait_until(no_leftovers, NULL, 2000));
}

static void twice(void **state)
{
    (void)state;
    port = h_free_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    snprintf(dir, sizeof dir, "%s/cluster", h_tmpdir());
    snprintf(sdport_env, sizeof sdport_env, "SD_PORT=%d", port);
    rport = h_free_port();
    snprintf(rport_env, sizeof rport_env, "SD_REDIS_PORT=%d", rport);
    snprintf(dir_env, sizeof dir_env, "SD_CLUSTER_DIR=%s", dir);
    snprintf(bin_env, sizeof bin_env, "SD_BIN=%s", SD_BIN_DIR);
    snprintf(logs_env, sizeof logs_env, "SD_LOGS_PORT=%d", h_free_port());
    one_run(1);
    one_run(2); /* from the first run's state: the zone servers stopped by its Ctrl-C */
}

/* 1 when nothing listens on loopback TCP port p (and it can be bound). */
static int tcp_free(int p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* SD_REDIS=cluster: the same run on a local Redis Cluster of 3 primaries and 3 replicas
 * (ports rport .. rport + 5, bus ports 10000 above), made on the first run and re-formed
 * from its nodes.conf files on the second. */
static void on_a_redis_cluster(void **state)
{
    (void)state;
    port = h_free_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    snprintf(dir, sizeof dir, "%s/rcluster", h_tmpdir());
    snprintf(sdport_env, sizeof sdport_env, "SD_PORT=%d", port);
    for (int tries = 0;; tries++) { /* 6 ports in a row, and their bus ports, free */
        assert_true(tries < 200);
        rport = 10000 + h_free_port() % 9000;
        int ok = 1;
        for (int i = 0; i < 6 && ok; i++)
            ok = tcp_free(rport + i) && tcp_free(rport + 10000 + i);
        if (ok)
            break;
    }
    nredis = 6;
    snprintf(rport_env, sizeof rport_env, "SD_REDIS_PORT=%d", rport);
    snprintf(dir_env, sizeof dir_env, "SD_CLUSTER_DIR=%s", dir);
    snprintf(bin_env, sizeof bin_env, "SD_BIN=%s", SD_BIN_DIR);
    mode_env = "SD_REDIS=cluster";
    snprintf(logs_env, sizeof logs_env, "SD_LOGS_PORT=%d", h_free_port());
    one_run(1);
    one_run(2);
}

int main(void)
{
    h_init(170);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(twice),
        cmocka_unit_test(on_a_redis_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
