/* The README's main command, scripts/cluster.sh, run twice on its own ports and state dir
 * with this build's binaries (SD_BIN: no package check, no build). Each run shows the
 * product as it is meant to run, in its banner and through the API: two machines whose
 * bigbrothers run in cluster mode, a primary, the desired service zone at 3 ready, the
 * match pool at its buffer (3 ready, 1 allocated) and the allocation made at start, which
 * its game server logs. The first run then does what the banner offers: scale zone to 5,
 * drain local-2 (its instances move to local-1) and undrain it, a rolling restart of zone
 * that completes, local-2 lost (kill -9 of its bigbrother: the script keeps running and
 * the primary declares it lost). A Ctrl-C (SIGINT to the script) stops every process it
 * started (the realm stop, then the daemons), and the second run comes back from the
 * first one's state, where the realm was left stopped, with both machines live. */
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
    logs_env[32], logs2_env[32];
static const char *mode_env = "SD_REDIS=";
static int port, rport, nredis = 1; /* the Redis ports: rport .. rport + nredis - 1 */
static pid_t script; /* the running cluster.sh, 0 when none */

/* Processes whose environment names this cluster's serverdir (the zone servers get
 * SERVERDIR_URL) or whose command line names its state dir or ports (serverdir's, and
 * each redis-server's in its title). */
static int leftovers(void)
{
    int ports[8] = {port};
    for (int i = 0; i < nredis && i + 1 < 8; i++)
        ports[i + 1] = rport + i;
    return h_leftovers(url, dir, ports, 1 + (nredis < 7 ? nredis : 7));
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

/* GET path (under the cluster) with the viewer token: the answer, NULL when not 200. */
static json_t *get_json(const char *path)
{
    char u[400], tok[300];
    snprintf(u, sizeof u, "%s/v1/clusters/local%s", url, path);
    h_resp_t r = {0};
    json_t *j = NULL;
    if (h_http("GET", u, script_token("viewer", tok, sizeof tok), NULL, NULL, 0, NULL, &r) == 0 &&
        r.status == 200)
        j = h_resp_json(&r);
    h_resp_free(&r);
    return j;
}

/* The ready processes of service svc ("" all) on machine m (NULL any); -1 without serverdir. */
static int ready_on(const char *svc, const char *m)
{
    char path[200];
    snprintf(path, sizeof path, "/processes?state=ready%s%s", *svc ? "&service=" : "", svc);
    json_t *j = get_json(path);
    if (!j)
        return -1;
    int n = 0;
    json_t *p;
    size_t i;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        n += !m || !strcmp(json_string_value(json_object_get(p, "machine")), m);
    json_decref(j);
    return n;
}

static int count_ready(const char *svc)
{
    return ready_on(svc, NULL);
}

/* The live processes (starting or ready) on machine m. */
static int live_on(const char *m)
{
    char path[200];
    snprintf(path, sizeof path, "/processes?machine=%s", m);
    json_t *j = get_json(path);
    int n = j ? (int)json_array_size(json_object_get(j, "processes")) : -1;
    json_decref(j);
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
    w->out = h_slurp(w->log);
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

/* sdctl with the ops token (the env file's SERVERDIR_TOKEN): its exit code, output in out. */
static int sdctl_ops(char *out, size_t cap, const char *const *args)
{
    char env_url[200], env_tok[400], tok[300];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", url);
    snprintf(env_tok, sizeof env_tok, "SERVERDIR_TOKEN=%s", script_token("ops", tok, sizeof tok));
    const char *senv[] = {env_url, env_tok, "SERVERDIR_CLUSTER=local", NULL};
    return h_sdctl_run(args, senv, 15000, out, cap);
}

static int zone_5_ready(void *arg)
{
    (void)arg;
    return count_ready("zone") == 5;
}

/* local-2 drained: nothing live on it, zone (5) and the match pool (2 free) on local-1 */
static int drained(void *arg)
{
    (void)arg;
    return live_on("local-2") == 0 && ready_on("zone", "local-1") == 5 &&
           ready_on("match", "local-1") >= 2;
}

static int undrained(void *arg)
{
    (void)arg;
    json_t *j = get_json("/machines/local-2");
    int ok = j && json_is_false(json_object_get(j, "draining"));
    json_decref(j);
    return ok;
}

/* The generation of each zone slot's ready process, into gen[slot] (-1: none ready). */
static void zone_generations(long gen[8])
{
    for (int i = 0; i < 8; i++)
        gen[i] = -1;
    json_t *j = get_json("/processes?service=zone&state=ready"), *p;
    size_t i;
    json_array_foreach(json_object_get(j, "processes"), i, p) {
        json_int_t slot = json_integer_value(json_object_get(p, "slot"));
        if (slot >= 0 && slot < 8)
            gen[slot] = (long)json_integer_value(json_object_get(p, "generation"));
    }
    json_decref(j);
}

/* h_wait_until condition: every zone slot 0..4 ready in a later generation than before. */
static int rolled(void *arg)
{
    const long *before = arg;
    long now[8];
    zone_generations(now);
    for (int i = 0; i < 5; i++)
        if (now[i] <= before[i])
            return 0;
    return 1;
}

/* The pid of the bigbrother whose command line names want, 0 when none. */
static pid_t pid_with(const char *want)
{
    pid_t found = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && !found && (e = readdir(d))) {
        char buf[4096];
        int pid = atoi(e->d_name);
        if (pid > 0 && h_proc_text(pid, "cmdline", buf, sizeof buf) >= 0 &&
            strstr(buf, "bigbrother") && strstr(buf, want))
            found = pid;
    }
    if (d)
        closedir(d);
    return found;
}

/* local-2 lost: listed as lost, zone's 5 ready on local-1 */
static int lost(void *arg)
{
    (void)arg;
    json_t *j = get_json("/machines/local-2");
    int is_lost = j && !strcmp(json_string_value(json_object_get(j, "state")), "lost");
    json_decref(j);
    return is_lost && ready_on("zone", "local-1") == 5;
}

/* What the banner offers, done: scale zone to 5, drain local-2 and undrain it, a rolling
 * restart of zone that completes; then local-2 lost (kill -9 of its bigbrother, its game
 * servers left running for the Ctrl-C to stop). */
static void operate(void)
{
    char out[8192];
    const char *scale[] = {"scale", "zone", "5", NULL};
    assert_int_equal(sdctl_ops(out, sizeof out, scale), 0);
    if (!h_wait_until(zone_5_ready, NULL, 30000))
        fail_msg("zone did not reach 5 ready in 30 s (%d)", count_ready("zone"));
    const char *drain[] = {"drain", "local-2", NULL};
    assert_int_equal(sdctl_ops(out, sizeof out, drain), 0);
    if (!h_wait_until(drained, NULL, 30000))
        fail_msg("local-2 not drained in 30 s: %d live on it, zone %d, match %d on local-1",
                 live_on("local-2"), ready_on("zone", "local-1"), ready_on("match", "local-1"));
    const char *undrain[] = {"undrain", "local-2", NULL};
    assert_int_equal(sdctl_ops(out, sizeof out, undrain), 0);
    assert_true(h_wait_until(undrained, NULL, 5000));
    long before[8];
    zone_generations(before);
    const char *restart[] = {"restart", "zone", NULL};
    assert_int_equal(sdctl_ops(out, sizeof out, restart), 0);
    if (!h_wait_until(rolled, before, 60000))
        fail_msg("the rolling restart of zone did not complete in 60 s");
    assert_int_equal(count_ready("zone"), 5);
    char want[500];
    snprintf(want, sizeof want, "%s/local-2/bigbrother.json", dir);
    pid_t bb2 = pid_with(want);
    assert_true(bb2 > 0);
    assert_int_equal(kill(bb2, SIGKILL), 0);
    if (!h_wait_until(lost, NULL, 30000))
        fail_msg("local-2 not lost with zone on local-1 in 30 s (zone %d there)",
                 ready_on("zone", "local-1"));
}

/* The banner's figures and the API agree: 2 machines, a primary, zone 3 of 3, the match
 * pool at its buffer with the start allocation, which its game server logs. */
static void check_cluster(int round, const char *out)
{
    if (!strstr(out, "machines:           2 live") ||
        !strstr(out, "zone:               3 ready of 3 desired") ||
        !strstr(out, "match:              pool of 3 ready, 1 allocated, buffer 2") ||
        !strstr(out, "sdctl scale zone 5") || !strstr(out, "ops dashboard:") ||
        !strstr(out, "master servers:     3") || strstr(out, "player locks held:  0 "))
        fail_msg("round %d: unexpected banner:\n%s", round, out);
    assert_int_equal(count_ready("zone"), 3);
    assert_int_equal(count_ready("match"), 3);
    json_t *j = get_json("/primary");
    assert_non_null(j);
    const char *holder = json_string_value(json_object_get(j, "holder"));
    assert_true(holder && (!strcmp(holder, "local-1") || !strcmp(holder, "local-2")));
    json_decref(j);
    j = get_json("/services/zone");
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "spec"), "count")), 3);
    json_decref(j);
    /* the allocation the banner names, active, on a match server that logged it */
    const char *a = strstr(out, "allocation:         ");
    char id[64] = "", inst[160] = "";
    assert_non_null(a);
    assert_int_equal(sscanf(a, "allocation: %63s (active) on %159[^,]", id, inst), 2);
    char path[200];
    snprintf(path, sizeof path, "/allocations/%s", id);
    j = get_json(path);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "active");
    assert_string_equal(json_string_value(json_object_get(j, "instance")), inst);
    json_decref(j);
    char logs[8192], want[120];
    const char *args[] = {"logs", inst, NULL};
    int lrc = sdctl_ops(logs, sizeof logs, args);
    snprintf(want, sizeof want, "msg=allocated allocation=%s", id);
    if (lrc != 0 || !strstr(logs, want) || !strstr(logs, "demo-1"))
        fail_msg("round %d: sdctl logs %s -> %d, no '%s':\n%s", round, inst, lrc, want, logs);
}

/* Fresh ports for serverdir and the bigbrothers' logs, and (one redis-server, whose state
 * does not name its port) for Redis. A Redis Cluster's nodes.conf names its ports: those
 * stay. */
static void pick_ports(void)
{
    port = h_free_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    snprintf(sdport_env, sizeof sdport_env, "SD_PORT=%d", port);
    if (nredis == 1) {
        rport = h_free_port();
        snprintf(rport_env, sizeof rport_env, "SD_REDIS_PORT=%d", rport);
    }
    snprintf(logs_env, sizeof logs_env, "SD_LOGS_PORT=%d", h_free_port());
    snprintf(logs2_env, sizeof logs2_env, "SD_LOGS_PORT2=%d", h_free_port());
}

/* One run: start, wait for the banner, check it and the API (round 1: operate), Ctrl-C,
 * check nothing is left. A port is free when picked, and another test on this machine can
 * take it before the script's daemon binds it (or, in round 2, after round 1 let it go):
 * a run that ends at start with a port in use (the script prints the daemon's last log
 * lines) is run again on fresh ports, at most 3 times. */
static void one_run(int round)
{
    char log[500];
    const char *argv[] = {"/bin/bash", SD_SOURCE_DIR "/scripts/cluster.sh", NULL};
    const char *env[] = {sdport_env, rport_env, dir_env, bin_env, mode_env, logs_env, logs2_env,
                         NULL};
    banner_wait_t w = {0};
    pid_t pid;
    for (int attempt = 1;; attempt++) {
        snprintf(log, sizeof log, "%s/script-%d.%d.out", h_tmpdir(), round, attempt);
        pid = h_spawn(argv, log, env);
        assert_true(pid > 0);
        script = pid;
        w = (banner_wait_t){pid, log, NULL, 0, 0};
        h_wait_until(banner_or_exit, &w, 90000);
        if (!w.exited || attempt == 3 || !w.out || !strstr(w.out, "Address already in use"))
            break;
        script = 0;
        fprintf(stderr, "round %d: a port was taken (attempt %d), again on fresh ports:\n%s",
                round, attempt, w.out);
        free(w.out);
        pick_ports();
    }
    char *out = w.out;
    if (w.exited)
        fail_msg("cluster.sh exited early (status %d):\n%s", w.status, out ? out : "");
    if (!out || !strstr(out, "Press Ctrl-C to stop."))
        fail_msg("no banner within 90 s:\n%s", out ? out : "");
    check_cluster(round, out);
    free(out);
    /* The script's bindings hold: local-1's bigbrother token speaks for local-1 only, and
     * without a token nothing is shown. The game servers have no token at all: the player
     * locks the banner counted were taken with their instance credentials. */
    char tok[300], u[160], game[300], line[512], path[500];
    assert_string_equal(script_token("game", game, sizeof game), "");
    snprintf(path, sizeof path, "%s/tokens", dir);
    FILE *f = fopen(path, "r");
    tok[0] = '\0';
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "machine=local-1") && sscanf(line, "bigbrother %299s", tok) == 1)
            break;
    if (f)
        fclose(f);
    assert_true(strlen(tok) >= 16);
    snprintf(u, sizeof u, "%s/v1/clusters/local/machines/local-2", url);
    h_resp_t r = {0};
    assert_int_equal(h_http("PUT", u, tok, NULL, "{}", 2, NULL, &r), 0);
    assert_int_equal(r.status, 403);
    h_resp_free(&r);
    snprintf(u, sizeof u, "%s/v1/clusters/local/processes", url);
    assert_int_equal(h_http("GET", u, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    h_resp_free(&r);
    if (round == 1)
        operate();

    kill(-pid, SIGINT); /* what a Ctrl-C delivers: SIGINT to the script's process group,
                           so a command it runs in the foreground gets it too (bash acts
                           on a SIGINT its foreground child survived only after the child
                           ends); its daemons run in their own sessions */
    int status = h_wait_exit(pid, 45000); /* at most 15 s for the realm stop, 5 + 10 s for
                                             the daemons */
    script = 0;
    if (!WIFEXITED(status)) {
        char *tail = h_slurp(log);
        fail_msg("round %d: cluster.sh did not end within 45 s of its Ctrl-C:\n%s", round,
                 tail ? tail : "");
    }
    assert_int_equal(WEXITSTATUS(status), 130);
    assert_int_equal(count_ready(""), -1); /* serverdir is gone */
    assert_true(h_wait_until(no_leftovers, NULL, 2000));
}

/* Teardown: a run a failed check left going gets its Ctrl-C, so that its cluster does
 * not run on (doubling the machine's load) beside the next test's. */
static int stop_script(void **state)
{
    (void)state;
    if (script > 0) {
        kill(-script, SIGINT);
        if (h_wait_exit(script, 45000) == -1)
            kill(-script, SIGKILL); /* its daemons go at the harness's exit */
        script = 0;
    }
    return 0;
}

static void twice(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/cluster", h_tmpdir());
    pick_ports();
    snprintf(dir_env, sizeof dir_env, "SD_CLUSTER_DIR=%s", dir);
    snprintf(bin_env, sizeof bin_env, "SD_BIN=%s", SD_BIN_DIR);
    one_run(1);
    one_run(2); /* from the first run's state: the realm stopped by its Ctrl-C, zone at 5 */
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
    snprintf(dir, sizeof dir, "%s/rcluster", h_tmpdir());
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
    pick_ports();
    one_run(1);
    one_run(2);
}

int main(void)
{
    h_init(280);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(twice, stop_script),
        cmocka_unit_test_teardown(on_a_redis_cluster, stop_script),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
