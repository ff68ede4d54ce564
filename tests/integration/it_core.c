/* serverdir core against a real redis-server: health, readiness through a Redis outage,
 * Redis over a unix socket, routing errors, config validation and clean shutdown. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with the test tokens. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, NULL);
}

static long get(const char *path, h_resp_t *r)
{
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, r, "%s", path), 0);
    return r->status;
}

static void health_and_ready(void **state)
{
    h_resp_t r;
    assert_int_equal(get("/healthz", &r), 200);
    h_resp_free(&r);
    assert_int_equal(get("/readyz", &r), 200);
    assert_non_null(strstr(r.body, "\"ready\""));
    h_resp_free(&r);
}

static void routing_errors_are_specific(void **state)
{
    h_resp_t r;
    assert_int_equal(get("/no/such/thing", &r), 404);
    assert_string_equal(h_err_code(&r), "not_found");
    h_resp_free(&r);

    assert_int_equal(h_http_json("DELETE", sd.url, NULL, NULL, &r, "/healthz"), 0);
    assert_int_equal(r.status, 405);
    assert_string_equal(h_err_code(&r), "method_not_allowed");
    char allow[32];
    assert_int_equal(h_resp_header(&r, "Allow", allow, sizeof allow), 0);
    assert_string_equal(allow, "GET");
    h_resp_free(&r);
}

static int ready_is(void *want)
{
    h_resp_t r;
    if (h_http_json("GET", sd.url, NULL, NULL, &r, "/readyz"))
        return 0;
    int ok = r.status == (long)(intptr_t)want;
    h_resp_free(&r);
    return ok;
}

/* Redis goes away: readiness answers 503 with Retry-After, serverdir stays up; Redis
 * comes back on the same port: ready again without restarting serverdir. */
static void redis_outage_and_recovery(void **state)
{
    h_redis_down(&redis);

    h_resp_t r;
    assert_int_equal(get("/readyz", &r), 503);
    assert_string_equal(h_err_code(&r), "store_unavailable");
    char ra[16];
    assert_int_equal(h_resp_header(&r, "Retry-After", ra, sizeof ra), 0);
    assert_string_equal(ra, "1");
    h_resp_free(&r);
    assert_int_equal(get("/healthz", &r), 200);
    h_resp_free(&r);
    assert_false(h_exited(sd.pid, NULL));

    assert_int_equal(h_redis_up(&redis), 0);
    assert_true(h_wait_until(ready_is, (void *)(intptr_t)200, 5000));

    /* The metrics saw the failures. */
    assert_int_equal(get("/metrics", &r), 200);
    assert_non_null(strstr(r.body, "serverdir_http_requests_total{method=\"GET\",route=\"/readyz\",code=\"503\"}"));
    h_resp_free(&r);
}

typedef struct {
    const char *url, *method, *path, *body;
    long status;
    atomic_int done;
} held_t;

static void *held_call(void *p)
{
    held_t *h = p;
    h_resp_t r = {0};
    h->status = h_http_json(h->method, h->url, H_TOK_GAME, h->body, &r, "%s", h->path) == 0
                    ? r.status
                    : -1;
    h_resp_free(&r);
    atomic_store(&h->done, 1);
    return NULL;
}

/* A serverdir with one HTTP thread and two handler threads: a read, and a lock acquire
 * that may wait (which defers its first call to a handler thread), each wait on a paused
 * Redis (CLIENT PAUSE ALL on the node of the lock) on a handler thread while the HTTP
 * thread answers /healthz. Before the handler threads, such a request made its Redis
 * call on its HTTP thread, and every other connection of that thread waited out the
 * call (here the pause, 2 s). */
static void http_thread_never_waits_on_redis(void **state)
{
    (void)state;
    static const char *const extra[] = {"--http-threads", "1", "--threads", "2", NULL};
    h_sd_opts_t o = {.extra = extra};
    h_serverdir_t one;
    assert_int_equal(h_sd_start(&one, &redis, &o), 0);
    h_resp_t r;
    /* the handler threads connected, the scripts loaded */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(h_http_json("GET", one.url, H_TOK_GAME, NULL, &r, "/v1/locks/nw"), 0);
        assert_int_equal(r.status, 200);
        h_resp_free(&r);
    }
    held_t reqs[2] = {
        {.url = one.url, .method = "GET", .path = "/v1/locks/nw"},
        {.url = one.url, .method = "PUT", .path = "/v1/locks/nw",
         .body = "{\"holder\":\"game-nw\",\"ttl_ms\":5000,\"wait_ms\":4000}"},
    };
    assert_int_equal(h_redis_route(&redis, h_lock_key("nw")), 0);
    redisReply *p = h_redis(&redis, "CLIENT PAUSE 2000 ALL");
    assert_non_null(p);
    assert_int_equal(p->type, REDIS_REPLY_STATUS);
    freeReplyObject(p);
    int64_t t0 = h_now_ms();
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, held_call, &reqs[i]), 0);
    h_sleep_ms(300); /* both on their way to the paused Redis */
    char healthz[160];
    snprintf(healthz, sizeof healthz, "%s/healthz", one.url);
    h_resp_t hr = {0};
    int64_t t1 = h_now_ms();
    int got = h_http("GET", healthz, NULL, NULL, NULL, 0, NULL, &hr);
    int waiting = !atomic_load(&reqs[0].done) && !atomic_load(&reqs[1].done);
    int64_t t2 = h_now_ms();
    fprintf(stderr, "healthz answered in %lld ms, %s the read and the acquire\n",
            (long long)(t2 - t1), waiting ? "before" : "not before");
    assert_int_equal(got, 0);
    assert_int_equal(hr.status, 200);
    h_resp_free(&hr);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_true(waiting);
    /* within the pause, with room for a slow machine */
    assert_true(t2 - t0 < 1900);
    /* each answered after the pause */
    assert_int_equal(reqs[0].status, 200);
    assert_int_equal(reqs[1].status, 200);
    h_serverdir_stop(&one);
}

/* Starts serverdir with args and returns its exit status and log. */
static int run_serverdir(const char *const *args, char *log, size_t logcap)
{
    const char *dir = h_tmpdir();
    char logpath[300];
    snprintf(logpath, sizeof logpath, "%s/sd.log", dir);
    const char *argv[16] = {SD_BIN_DIR "/serverdir"};
    int n = 1;
    for (const char *const *a = args; *a; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    pid_t pid = h_spawn(argv, logpath, NULL);
    int st = h_wait_exit(pid, 5000);
    FILE *f = fopen(logpath, "r");
    size_t got = f ? fread(log, 1, logcap - 1, f) : 0;
    log[got] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void config_errors_name_file_and_field(void **state)
{
    char log[4096];
    const char *dir = h_tmpdir();
    const char *bad = h_write_file(dir, "bad.json", "{\"threads\": \"many\"}", 0644);
    const char *args1[] = {"--config", bad, NULL};
    assert_int_equal(run_serverdir(args1, log, sizeof log), 100);
    assert_non_null(strstr(log, "field 'threads' must be an integer"));
    assert_non_null(strstr(log, "bad.json"));

    const char *unknown = h_write_file(dir, "unknown.json", "{\"listn\": \"x\"}", 0644);
    const char *args2[] = {"--config", unknown, NULL};
    assert_int_equal(run_serverdir(args2, log, sizeof log), 100);
    assert_non_null(strstr(log, "unknown field 'listn'"));

    const char *args3[] = {"--redis", "http://nope", NULL};
    assert_int_equal(run_serverdir(args3, log, sizeof log), 100);
    assert_non_null(strstr(log, "bad redis url"));

    const char *tok = h_write_file(dir, "tokens", "admin abcdefabcdefabcdef\n", 0600);
    const char *args4[] = {"--tokens", tok, NULL};
    assert_int_equal(run_serverdir(args4, log, sizeof log), 100);
    assert_non_null(strstr(log, "line=1"));
    assert_non_null(strstr(log, "unknown role"));
}

/* A unix:///path Redis URL works: serverdir is ready and its writes land (a machine lease
 * registered over the socket is read back). */
static void redis_over_unix_socket(void **state)
{
    char sock[300];
    snprintf(sock, sizeof sock, "%s/redis-unix.sock", h_tmpdir());
    const char *argv[] = {"redis-server", "--port", "0", "--unixsocket", sock,
                          "--save", "", "--appendonly", "no", "--dir", h_tmpdir(), NULL};
    char log[320];
    snprintf(log, sizeof log, "%s/redis-unix.log", h_tmpdir());
    pid_t rpid = h_spawn(argv, log, NULL);
    int up = 0;
    for (int i = 0; i < 250 && !up; i++) {
        redisContext *c = redisConnectUnix(sock);
        redisReply *rep = c && !c->err ? redisCommand(c, "PING") : NULL;
        up = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep)
            freeReplyObject(rep);
        if (c)
            redisFree(c);
        if (!up)
            h_sleep_ms(20);
    }
    assert_true(up);
    char url[320];
    snprintf(url, sizeof url, "unix://%s", sock);
    h_serverdir_t us;
    assert_int_equal(h_serverdir_start(&us, url, h_tokens_file(), NULL), 0);
    h_resp_t r;
    assert_int_equal(h_http_json("GET", us.url, NULL, NULL, &r, "/readyz"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_int_equal(h_http_json("PUT", us.url, H_TOK_BB,
                                 "{\"address\":\"127.0.0.1\",\"ttl_ms\":60000}", &r,
                                 "/v1/clusters/ux/machines/m1"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_int_equal(h_http_json("GET", us.url, H_TOK_VIEWER, NULL, &r,
                                 "/v1/clusters/ux/machines/m1"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    h_serverdir_stop(&us);
    h_stop(rpid, 2000);
}

/* The start line names the allocator: jemalloc in the default build (SD_JEMALLOC, for its
 * CPU per request: bench/README.md, "jemalloc"), libc's under the sanitizers. Catches a
 * link that silently stopped taking it. */
static void start_line_names_the_allocator(void **state)
{
    FILE *f = fopen(sd.log, "r");
    assert_non_null(f);
    char line[1024];
    const char *found = NULL;
    while (!found && fgets(line, sizeof line, f))
        if (strstr(line, "msg=\"serverdir started\""))
            found = strstr(line, " allocator=");
    fclose(f);
    assert_non_null(found);
#ifdef H_JEMALLOC
    assert_non_null(strstr(found, " allocator=jemalloc-"));
#else
    assert_non_null(strstr(found, " allocator=libc"));
#endif
}

static void sigterm_exits_cleanly(void **state)
{
    h_serverdir_t s2;
    assert_int_equal(h_serverdir_start(&s2, redis.url, NULL, NULL), 0);
    kill(s2.pid, SIGTERM);
    int st = h_wait_exit(s2.pid, 5000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(health_and_ready),
        cmocka_unit_test(start_line_names_the_allocator),
        cmocka_unit_test(routing_errors_are_specific),
        cmocka_unit_test(redis_outage_and_recovery),
        cmocka_unit_test(redis_over_unix_socket),
        cmocka_unit_test(config_errors_name_file_and_field),
        cmocka_unit_test(sigterm_exits_cleanly),
        cmocka_unit_test(http_thread_never_waits_on_redis),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
