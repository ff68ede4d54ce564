/* The shipped load-balancer config (packaging/haproxy/haproxy.cfg, run unchanged by the
 * REAL Debian haproxy, addresses given through its environment variables) in front of
 * three serverdir copies on one Redis. A client sends bounded traffic through haproxy
 * (reads, event batches with fixed ids, machine lease renewals, lock acquires by the same
 * holder) while the copies are SIGKILLed one after the other and restarted on the same
 * port. What the client sees: every request answered 2xx, with no transport error, and
 * the directory afterwards holds exactly the processes the acknowledged batches created.
 * The haproxy stats (retries, redispatches, per-server status) show that the kills
 * really hit traffic and were covered by retries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#ifndef SD_SOURCE_DIR
#define SD_SOURCE_DIR SD_BIN_DIR "/../.."
#endif
#define HAPROXY_CFG SD_SOURCE_DIR "/packaging/haproxy/haproxy.cfg"
#define NCOPIES 3

typedef struct {
    pid_t pid;
    int port, runs;
    char log[400];
} copy_t;

static h_redis_t redis;
static copy_t copies[NCOPIES];
static pid_t haproxy_pid;
static char front[128], stats_url[128];

/* Starts (or restarts) copy i on its fixed port and waits for /healthz. */
static void copy_start(int i)
{
    copy_t *c = &copies[i];
    char listen[64], url[128];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", c->port);
    snprintf(c->log, sizeof c->log, "%s/serverdir-%d-%d.log", h_tmpdir(), i, ++c->runs);
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis.url,
                          "--tokens", h_tokens_file(), "--threads", "4", NULL};
    c->pid = h_spawn(argv, c->log, NULL);
    assert_true(c->pid > 0);
    snprintf(url, sizeof url, "http://%s/healthz", listen);
    assert_true(h_wait_until(h_http_ok, url, h_valgrind() ? 60000 : 10000));
}

static void copy_kill(int i)
{
    kill(copies[i].pid, SIGKILL);
    h_wait_exit(copies[i].pid, 1000);
    copies[i].pid = 0;
}

/* The haproxy stats CSV: value of column `col` on the row backend/server `sv`. */
static long long stat_of(const char *sv, const char *col)
{
    h_resp_t r;
    long long v = -1;
    if (h_http("GET", stats_url, NULL, NULL, NULL, 0, NULL, &r) || r.status != 200 || !r.body) {
        h_resp_free(&r);
        return -1;
    }
    /* header: "# pxname,svname,qcur,..." */
    char *hdr = r.body + 2, *eol = strchr(hdr, '\n');
    int idx = -1, n = 0;
    for (char *p = hdr; p && p < eol; n++) {
        size_t l = strcspn(p, ",\n");
        if (strlen(col) == l && !strncmp(p, col, l))
            idx = n;
        p = p[l] == ',' ? p + l + 1 : NULL;
    }
    char want[64];
    snprintf(want, sizeof want, "\nserverdir,%s,", sv);
    char *row = strstr(eol, want);
    if (row && idx >= 0) {
        char *p = row + 1;
        for (int k = 0; k < idx && p; k++)
            p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
        if (p)
            v = !strncmp(p, "UP", 2) ? 1 : !strncmp(p, "DOWN", 4) ? 0 : strtoll(p, NULL, 10);
    }
    h_resp_free(&r);
    return v;
}

typedef struct {
    const char *sv;
    long long want;
} up_t;

static int status_is(void *arg)
{
    up_t *u = arg;
    return stat_of(u->sv, "status") == u->want;
}

static int all_up(void *arg)
{
    for (int i = 0; i < NCOPIES; i++) {
        char sv[8];
        snprintf(sv, sizeof sv, "sd%d", i + 1);
        if (stat_of(sv, "status") != 1)
            return 0;
    }
    return 1;
}

typedef struct {
    int sent, non2xx, transport, batches;
    int64_t t0;
    char last_fail[300];
} tally_t;

static void count(tally_t *t, int rc, const h_resp_t *r, const char *what)
{
    t->sent++;
    if (rc) {
        t->transport++;
        snprintf(t->last_fail, sizeof t->last_fail, "%s: transport error", what);
    } else if (r->status < 200 || r->status > 299) {
        t->non2xx++;
        snprintf(t->last_fail, sizeof t->last_fail, "%s: %ld %.200s", what, r->status,
                 r->body ? r->body : "");
    } else {
        return;
    }
    if (t->non2xx + t->transport <= 10)
        print_message("client saw a failure at +%lld ms: %s\n", (long long)(h_now_ms() - t->t0),
                      t->last_fail);
}

/* Prints haproxy's log lines of requests that did not end with 2xx (for a failure). */
static void print_haproxy_failures(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    int shown = 0;
    while (f && fgets(line, sizeof line, f) && shown < 20)
        if (strstr(line, "\"") && !strstr(line, " 200 ") && !strstr(line, "stats/<STATS>")) {
            print_message("haproxy: %s", line);
            shown++;
        }
    if (f)
        fclose(f);
}

/* One round of client traffic: a batch of two events for a new instance (fixed ids, so a
 * retried batch is applied once), a lease renewal, a lock acquire by its holder, reads. */
static void round_trip(tally_t *t, int n)
{
    h_resp_t r;
    char body[700];
    snprintf(body, sizeof body,
             "{\"events\":[{\"id\":\"ev-%d-s\",\"type\":\"started\",\"instance\":\"zone-%d\","
             "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":%d,\"ts_ms\":%d},"
             "{\"id\":\"ev-%d-r\",\"type\":\"ready\",\"instance\":\"zone-%d\","
             "\"machine\":\"m1\",\"service\":\"zone\",\"ts_ms\":%d}]}",
             n, n, 1000 + n, 1000 + n, n, n, 1001 + n);
    int rc = h_http_json("POST", front, H_TOK_BB, body, &r, "/v1/clusters/c1/events");
    count(t, rc, &r, "POST events");
    t->batches += !rc && r.status == 200;
    h_resp_free(&r);

    /* every round starts one more instance on m1 and none stops: the machine declares
     * room for all of them (live processes are bounded by capacity + 100) */
    rc = h_http_json("PUT", front, H_TOK_BB,
                     "{\"address\":\"127.0.0.1\",\"capacity\":9000,\"version\":\"0.1.0\","
                     "\"ttl_ms\":15000}",
                     &r, "/v1/clusters/c1/machines/m1");
    count(t, rc, &r, "PUT machine");
    h_resp_free(&r);

    /* zone-1 acquires its players again and again: it presents its grants' token */
    rc = h_http_json("PUT", front, H_TOK_GAME,
                     "{\"holder\":\"zone-1\",\"lock_token\":\"2011a2011a2011a2011a2011a2011a20\"}",
                     &r, "/v1/locks/player-%d", n % 7);
    count(t, rc, &r, "PUT lock");
    h_resp_free(&r);

    rc = h_http_json("GET", front, H_TOK_VIEWER, NULL, &r, "/v1/clusters/c1/processes/zone-%d", n);
    count(t, rc, &r, "GET process");
    h_resp_free(&r);

    rc = h_http_json("GET", front, H_TOK_VIEWER, NULL, &r, "/v1/clusters/c1/machines");
    count(t, rc, &r, "GET machines");
    h_resp_free(&r);
}

/* Sends rounds for ms milliseconds, at most one round (5 requests) per 10 ms so the
 * shared machine is not flooded. */
static void traffic(tally_t *t, int *n, int ms)
{
    int64_t end = h_now_ms() + ms;
    for (int k = 0; k < 2000 && h_now_ms() < end; k++) {
        int64_t next = h_now_ms() + 10;
        round_trip(t, (*n)++);
        if (h_now_ms() < next)
            h_sleep_ms((int)(next - h_now_ms()));
    }
}

static void copies_killed_and_restarted_under_traffic(void **state)
{
    assert_int_equal(h_redis_start(&redis), 0);
    for (int i = 0; i < NCOPIES; i++) {
        copies[i].port = h_free_port();
        copy_start(i);
    }
    int fport = h_free_port(), sport = h_free_port();
    char env_front[80], env_stats[80], env_sd[NCOPIES][80], log[400];
    snprintf(front, sizeof front, "http://127.0.0.1:%d", fport);
    snprintf(stats_url, sizeof stats_url, "http://127.0.0.1:%d/stats;csv", sport);
    snprintf(env_front, sizeof env_front, "SERVERDIR_FRONT=127.0.0.1:%d", fport);
    snprintf(env_stats, sizeof env_stats, "HAPROXY_STATS=127.0.0.1:%d", sport);
    for (int i = 0; i < NCOPIES; i++)
        snprintf(env_sd[i], sizeof env_sd[i], "SERVERDIR_%d=127.0.0.1:%d", i + 1, copies[i].port);
    const char *env[] = {env_front, env_stats, env_sd[0], env_sd[1], env_sd[2], NULL};
    snprintf(log, sizeof log, "%s/haproxy.log", h_tmpdir());
    const char *argv[] = {"haproxy", "-db", "-f", HAPROXY_CFG, NULL};
    haproxy_pid = h_spawn(argv, log, env);
    assert_true(haproxy_pid > 0);
    assert_true(h_wait_until(all_up, NULL, 15000));

    tally_t t = {.t0 = h_now_ms()};
    int n = 0, slow = h_valgrind() ? 3 : 1;
    traffic(&t, &n, 1000);
    assert_int_equal(t.non2xx + t.transport, 0);
    for (int i = 0; i < NCOPIES; i++) {
        char sv[8];
        snprintf(sv, sizeof sv, "sd%d", i + 1);
        long long before = stat_of(sv, "stot");
        copy_kill(i);
        /* the kill is noticed by the health check; requests in between are retried */
        up_t down = {sv, 0};
        int64_t end = h_now_ms() + 10000;
        while (!status_is(&down) && h_now_ms() < end)
            traffic(&t, &n, 100);
        assert_true(status_is(&down));
        traffic(&t, &n, 300);
        copy_start(i);
        up_t up = {sv, 1};
        end = h_now_ms() + 10000 * slow;
        while (!status_is(&up) && h_now_ms() < end)
            traffic(&t, &n, 100);
        assert_true(status_is(&up));
        traffic(&t, &n, 1500);
        /* the restarted copy serves again */
        assert_true(stat_of(sv, "stot") > before);
        print_message("after killing %s: %d requests, %d non-2xx, %d transport errors%s%s\n",
                      sv, t.sent, t.non2xx, t.transport, t.last_fail[0] ? ", last: " : "",
                      t.last_fail);
    }
    long long retries = stat_of("BACKEND", "wretr"), redispatches = stat_of("BACKEND", "wredis");
    print_message("haproxy: %lld retries, %lld redispatches over %d requests\n", retries,
                  redispatches, t.sent);
    if (t.transport || t.non2xx)
        print_haproxy_failures(log);
    /* what the client saw: nothing but success */
    assert_int_equal(t.transport, 0);
    assert_int_equal(t.non2xx, 0);
    assert_true(t.sent >= 200);
    assert_int_equal(t.batches, n);

    /* every acknowledged batch is in the directory exactly once: zone-0 .. zone-(n-1),
     * all ready (a retried batch was applied once, not twice or half) */
    h_resp_t r;
    assert_int_equal(h_http_json("GET", front, H_TOK_VIEWER, NULL, &r, "/v1/clusters/c1/processes?limit=5000"),
                     0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r), *ps = json_object_get(j, "processes"), *p;
    size_t k;
    int ready = 0;
    json_array_foreach(ps, k, p) ready += !strcmp(json_string_value(json_object_get(p, "state")), "ready");
    print_message("directory: %zu processes, %d ready, %d batches acknowledged\n",
                  json_array_size(ps), ready, n);
    assert_int_equal((int)json_array_size(ps), n);
    assert_int_equal(ready, n);
    json_decref(j);
    h_resp_free(&r);
    h_stop(haproxy_pid, 2000);
    for (int i = 0; i < NCOPIES; i++)
        if (copies[i].pid > 0)
            h_stop(copies[i].pid, 5000);
    h_redis_stop(&redis);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(copies_killed_and_restarted_under_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
