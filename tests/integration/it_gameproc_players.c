/* gameproc's player simulation against a real serverdir + redis (README, "gameproc with
 * ServerDir"): the fencing story end to end (a SIGSTOPped server's save is refused after an
 * operator handed its player to another server, whose data stays intact), a graceful stop
 * that saves then releases, and a ServerDir outage that the game loop does not notice (the
 * heartbeats to a fake Big Brother keep flowing, saves resume afterwards). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bbproto.h"
#include "harness_gameproc.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;
static const char *dir;

typedef struct {
    pid_t pid;
    char log[300];
} gp_run_t;

/* Starts gameproc named `name` simulating players on keys player:<keys> against sd,
 * with the NULL-terminated extra args and env. */
static void gp_start(gp_run_t *g, const char *name, const char *keys, int players,
                     const char *const *extra, const char *const *env)
{
    char np[16];
    snprintf(np, sizeof np, "%d", players);
    const char *argv[40] = { GAMEPROC, "--name", name, "--serverdir", sd.url, "--token",
                             H_TOK_GAME, "--players", np, "--player-keys", keys };
    int n = 11;
    for (const char *const *a = extra; a && *a && n < 38; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    snprintf(g->log, sizeof g->log, "%s/%s.log", dir, name);
    g->pid = h_spawn(argv, g->log, env);
    assert_true(g->pid > 0);
}

/* Occurrences of needle in the log file. */
static int log_count(const char *path, const char *needle)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    int c = 0;
    for (const char *p = buf; (p = strstr(p, needle)); p += strlen(needle))
        c++;
    return c;
}

typedef struct {
    const char *path, *needle;
    int count;
} log_wait_t;

static int log_cond(void *arg)
{
    const log_wait_t *w = arg;
    return log_count(w->path, w->needle) >= w->count;
}

static int log_wait_n(const gp_run_t *g, const char *needle, int count, int ms)
{
    log_wait_t w = { g->log, needle, count };
    return h_wait_until(log_cond, &w, ms);
}

/* GET /v1/locks/{key}: holder ("" when free) and lock_seq. */
static void lock_info(const char *key, char *holder, size_t cap, long long *seq)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/locks/%s", key), 0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    assert_non_null(j);
    const char *h = json_string_value(json_object_get(j, "holder"));
    snprintf(holder, cap, "%s", h ? h : "");
    *seq = json_integer_value(json_object_get(j, "lock_seq"));
    json_decref(j);
    h_resp_free(&r);
}

typedef struct {
    long status;
    long long blob_seq, lock_seq;
    char data[256];
} blob_t;

static void blob_get(const char *key, blob_t *b)
{
    h_resp_t r;
    memset(b, 0, sizeof *b);
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_GAME, NULL, &r, "/v1/blobs/%s", key), 0);
    b->status = r.status;
    char v[32];
    if (h_resp_header(&r, "Blob-Seq", v, sizeof v) == 0)
        b->blob_seq = atoll(v);
    if (h_resp_header(&r, "Lock-Seq", v, sizeof v) == 0)
        b->lock_seq = atoll(v);
    if (r.status == 200)
        snprintf(b->data, sizeof b->data, "%.*s", (int)r.len, r.body);
    h_resp_free(&r);
}

typedef struct {
    const char *key, *text;
    long long min_seq;
} blob_wait_t;

static int blob_cond(void *arg)
{
    const blob_wait_t *w = arg;
    blob_t b;
    blob_get(w->key, &b);
    return b.status == 200 && strstr(b.data, w->text) && b.blob_seq >= w->min_seq;
}

/* Waits until the blob holds text with a Blob-Seq of at least min_seq. */
static int blob_wait(const char *key, const char *text, long long min_seq, int ms)
{
    blob_wait_t w = { key, text, min_seq };
    return h_wait_until(blob_cond, &w, ms);
}

static long long progress_of(const blob_t *b)
{
    const char *p = strstr(b->data, "progress=");
    return p ? atoll(p + 9) : -1;
}

/* cmocka group setup: the test's temp dir, redis-server, and serverdir on it. */
static int setup(void **state)
{
    dir = h_tmpdir();
    return h_stack_setup(state, &redis, &sd, NULL);
}

/* The fencing story (docs/locks.md): A holds player:7 and saves; A is frozen; an operator
 * force-unlocks; B takes the player and saves; A wakes up and its next save is refused
 * (logged once, the player dropped); B's progress is what the blob holds. */
static void fencing_end_to_end(void **state)
{
    (void)state;
    const char *fast[] = { "--save-every-ms", "300", "--no-agent", NULL };
    gp_run_t a, b;
    gp_start(&a, "gp-a", "7-7", 1, fast, NULL);
    assert_true(log_wait_n(&a, "msg=\"player joined\" key=player:7", 1, 5000));
    assert_true(blob_wait("player:7", "holder=gp-a", 2, 5000));
    char holder[130];
    long long seq_a, seq_b;
    lock_info("player:7", holder, sizeof holder, &seq_a);
    assert_string_equal(holder, "gp-a");

    assert_int_equal(kill(a.pid, SIGSTOP), 0);
    blob_t frozen;
    blob_get("player:7", &frozen);

    h_resp_t r;
    assert_int_equal(h_http_json("DELETE", sd.url, H_TOK_OPS, NULL, &r,
                                 "/v1/locks/player:7?force=true"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    gp_start(&b, "gp-b", "7-7", 1, fast, NULL);
    assert_true(log_wait_n(&b, "msg=\"player joined\" key=player:7", 1, 5000));
    lock_info("player:7", holder, sizeof holder, &seq_b);
    assert_string_equal(holder, "gp-b");
    assert_true(seq_b > seq_a);
    /* B loaded A's last save and carries on from there. */
    assert_true(blob_wait("player:7", "holder=gp-b", frozen.blob_seq + 1, 5000));

    assert_int_equal(kill(a.pid, SIGCONT), 0);
    assert_true(log_wait_n(&a, "msg=\"player taken over, dropped without saving\" key=player:7",
                           1, 5000));
    /* A keeps running (the tick loop did not care) and does not try that save again. */
    h_sleep_ms(1000);
    assert_int_equal(log_count(a.log, "taken over"), 1);
    assert_int_equal(h_exited(a.pid, NULL), 0);

    blob_t now;
    blob_get("player:7", &now);
    assert_int_equal(now.status, 200);
    assert_non_null(strstr(now.data, "holder=gp-b"));
    assert_int_equal(now.lock_seq, seq_b);
    assert_true(now.blob_seq > frozen.blob_seq);
    assert_true(progress_of(&now) >= progress_of(&frozen));
    lock_info("player:7", holder, sizeof holder, &seq_b);
    assert_string_equal(holder, "gp-b");

    /* Stop A first (it would take the player back once B lets go), then B: its last
     * save goes in under its lock. */
    int st = h_stop(a.pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(kill(b.pid, SIGTERM), 0);
    st = h_wait_exit(b.pid, 8000);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(log_wait_n(&b, "msg=\"player left\" key=player:7", 1, 100));
    blob_get("player:7", &now);
    assert_non_null(strstr(now.data, "holder=gp-b"));
    lock_info("player:7", holder, sizeof holder, &seq_b);
    assert_string_equal(holder, "");
}

/* SIGTERM: every player is saved, then released, before the process exits 0. */
static void sigterm_saves_then_releases(void **state)
{
    (void)state;
    const char *slow[] = { "--save-every-ms", "600000", "--no-agent", NULL };
    gp_run_t c;
    gp_start(&c, "gp-c", "20-21", 2, slow, NULL);
    assert_true(log_wait_n(&c, "msg=\"player joined\"", 2, 5000));
    char holder[130];
    long long seq;
    lock_info("player:20", holder, sizeof holder, &seq);
    assert_string_equal(holder, "gp-c");
    lock_info("player:21", holder, sizeof holder, &seq);
    assert_string_equal(holder, "gp-c");
    blob_t b;
    blob_get("player:20", &b);
    assert_int_equal(b.status, 404); /* no periodic save yet */
    h_sleep_ms(500); /* a span in which no periodic save may happen either */

    assert_int_equal(kill(c.pid, SIGTERM), 0);
    int st = h_wait_exit(c.pid, 8000);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(log_count(c.log, "saved=1 released=1"), 2);
    const char *keys[] = { "player:20", "player:21" };
    for (int i = 0; i < 2; i++) {
        blob_get(keys[i], &b);
        assert_int_equal(b.status, 200);
        assert_int_equal(b.blob_seq, 1);
        assert_non_null(strstr(b.data, "holder=gp-c"));
        assert_true(progress_of(&b) > 0);
        lock_info(keys[i], holder, sizeof holder, &seq);
        assert_string_equal(holder, "");
    }
}

/* Posts events (a JSON array) to cluster kc as its Big Brother would. */
static void post_kc_events(const char *events)
{
    h_resp_t r;
    char body[2048];
    snprintf(body, sizeof body, "{\"events\":%s}", events);
    assert_int_equal(h_http_json("POST", sd.url, H_TOK_BB, body, &r, "/v1/clusters/kc/events"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
}

static int master_lists(const char *addr)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/v1/master/servers?limit=1000"), 0);
    int found = r.body && strstr(r.body, addr) != NULL;
    h_resp_free(&r);
    return found;
}

static int master_gone(void *addr) { return !master_lists(addr); }

typedef struct {
    const char *key;
} free_wait_t;

static int lock_free_or_other(void *arg)
{
    char holder[130];
    long long seq;
    lock_info(((free_wait_t *)arg)->key, holder, sizeof holder, &seq);
    return strcmp(holder, "kz-a") != 0;
}

/* End to end: a zone server holding two players is killed with SIGKILL
 * (no save, no release); when the directory records its stop, its locks are freed after
 * the lock-delay, another server picks the players up and saves them (a higher lock_seq:
 * the dead one's grants are fenced), and its master-list entry is gone at once. */
static void kill9_frees_players_for_another_server(void **state)
{
    (void)state;
    char port[16], addr[64];
    int up = h_free_port();
    snprintf(port, sizeof port, "%d", up);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", up);
    const char *extra_a[] = { "--no-agent", "--save-every-ms", "200", "--master-rest",
                              "--udp-port", port, NULL };
    const char *env_a[] = { "BB_CLUSTER=kc", "BB_INSTANCE=kz-a", NULL };
    post_kc_events("[{\"id\":\"kz1\",\"type\":\"started\",\"instance\":\"kz-a\",\"machine\":\"m1\","
                   "\"service\":\"zone\",\"pid\":1},{\"id\":\"kz2\",\"type\":\"ready\","
                   "\"instance\":\"kz-a\",\"machine\":\"m1\",\"service\":\"zone\"}]");
    gp_run_t a;
    gp_start(&a, "kz-a", "30-31", 2, extra_a, env_a);
    assert_true(log_wait_n(&a, "msg=\"player joined\"", 2, 5000));
    assert_true(blob_wait("player:30", "holder=kz-a", 1, 5000));
    assert_true(h_wait_until((int (*)(void *))master_lists, addr, 5000));
    char holder[130];
    long long seq_a;
    lock_info("player:30", holder, sizeof holder, &seq_a);
    assert_string_equal(holder, "kz-a");

    assert_int_equal(kill(a.pid, SIGKILL), 0);
    h_wait_exit(a.pid, 5000);
    int64_t t_stop = h_now_ms();
    post_kc_events("[{\"id\":\"kz3\",\"type\":\"stopped\",\"instance\":\"kz-a\",\"machine\":\"m1\","
                   "\"service\":\"zone\",\"reason\":\"killed\",\"signal\":9}]");
    /* the master entry: gone with the stop */
    assert_true(h_wait_until(master_gone, addr, 1000));
    /* the locks: free (lock-delay pending) right away, no longer kz-a's */
    free_wait_t fw = { "player:30" };
    assert_true(h_wait_until(lock_free_or_other, &fw, 2000));
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/clusters/kc/processes/kz-a"), 0);
    json_t *p = h_resp_json(&r);
    assert_int_equal(json_integer_value(json_object_get(p, "locks_released")), 2);
    json_decref(p);
    h_resp_free(&r);

    /* another server takes the players once the lock-delay (5 s) is over */
    const char *extra_b[] = { "--no-agent", "--save-every-ms", "200", NULL };
    gp_run_t b;
    gp_start(&b, "kz-b", "30-31", 2, extra_b, NULL);
    assert_true(log_wait_n(&b, "msg=\"player joined\"", 2, h_valgrind() ? 40000 : 15000));
    assert_true(h_now_ms() - t_stop >= 4500); /* not before the lock-delay */
    assert_true(blob_wait("player:30", "holder=kz-b", 1, 5000));
    long long seq_b;
    lock_info("player:30", holder, sizeof holder, &seq_b);
    assert_string_equal(holder, "kz-b");
    assert_true(seq_b > seq_a);
    blob_t bl;
    blob_get("player:30", &bl);
    assert_true(bl.lock_seq > seq_a); /* saved under the new grant */
    assert_int_equal(kill(b.pid, SIGTERM), 0);
    h_wait_exit(b.pid, 8000);
}

/* ---- a fake Big Brother at the agent socket --------------------------------------- */

/* Reads agent messages for ms; returns the number of heartbeats seen. */
static int count_heartbeats(int fd, int ms)
{
    int64_t end = h_now_ms() + ms;
    int beats = 0;
    char buf[BBPROTO_MAX_MSG + 1];
    while (h_now_ms() < end) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, (int)(end - h_now_ms())) != 1)
            continue;
        ssize_t n = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
        if (n <= 0)
            break;
        bbproto_field_t f[BBPROTO_MAX_FIELDS];
        int nf = bbproto_parse(buf, (size_t)n, f, BBPROTO_MAX_FIELDS);
        if (nf > 0 && bbproto_get(f, nf, "HEARTBEAT", NULL))
            beats++;
    }
    return beats;
}

/* ServerDir goes away for a few seconds: the loop keeps ticking and heartbeating at its
 * usual rate, the failed save is logged once, and saves resume when it is back. Then a
 * SHUTDOWN from the fake Big Brother saves and releases. */
static void serverdir_outage_does_not_stall_the_tick(void **state)
{
    (void)state;
    char path[100], env_sock[120];
    snprintf(path, sizeof path, "%s/agent.sock", dir);
    snprintf(env_sock, sizeof env_sock, "BB_SOCKET=%s", path);
    int lfd = gp_agent_listen(path);
    const char *env[] = { env_sock, "BB_INSTANCE=zone-d-1", NULL };
    const char *fast[] = { "--save-every-ms", "300", NULL };
    gp_run_t d;
    gp_start(&d, "gp-d", "30-30", 1, fast, env);
    struct pollfd p = { .fd = lfd, .events = POLLIN };
    assert_int_equal(poll(&p, 1, 5000), 1);
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(c >= 0);
    send(c, "WELCOME=1\nHEARTBEAT_MS=400\n", 27, 0);
    /* The holder is the instance id Big Brother gave, not the server name. */
    assert_true(blob_wait("player:30", "holder=zone-d-1", 2, 5000));
    count_heartbeats(c, 300); /* the backlog since WELCOME */
    int before = count_heartbeats(c, 2000);

    h_serverdir_stop(&sd);
    int during = count_heartbeats(c, 2000);
    print_message("heartbeats: %d in 2 s before, %d in 2 s of outage\n", before, during);
    assert_true(before >= 6);
    assert_true(during >= before * 3 / 4);
    assert_true(log_wait_n(&d, "msg=\"player save failed, retrying\" key=player:30", 1, 100));
    assert_int_equal(log_count(d.log, "player save failed"), 1);
    blob_t gap;
    assert_int_equal(h_serverdir_restart(&sd, redis.url), 0); /* on the port the game knows */
    assert_true(log_wait_n(&d, "msg=\"player saves resumed\" key=player:30", 1, 8000));
    blob_get("player:30", &gap);
    assert_int_equal(gap.status, 200);
    assert_true(blob_wait("player:30", "holder=zone-d-1", gap.blob_seq + 1, 5000));

    send(c, "SHUTDOWN=1\nGRACE_MS=4000\n", 25, 0);
    int st = h_wait_exit(d.pid, 6000);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(log_wait_n(&d, "msg=\"player left\" key=player:30", 1, 100));
    assert_true(log_count(d.log, "saved=1 released=1") == 1);
    char holder[130];
    long long seq;
    lock_info("player:30", holder, sizeof holder, &seq);
    assert_string_equal(holder, "");
    close(c);
    close(lfd);
}

int main(void)
{
    h_init(240);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fencing_end_to_end),
        cmocka_unit_test(sigterm_saves_then_releases),
        cmocka_unit_test(serverdir_outage_does_not_stall_the_tick),
        cmocka_unit_test(kill9_frees_players_for_another_server),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
