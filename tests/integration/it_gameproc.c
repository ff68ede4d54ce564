/* gameproc, the real binary, without bigbrother: it runs alone, crashes and hangs on
 * request, stops gracefully on SIGTERM and on an agent SHUTDOWN, ignores them with
 * --ignore-term, answers Quake III and Valve queries on its UDP port, and speaks
 * sd_notify to a NOTIFY_SOCKET and the agent protocol to a BB_SOCKET that this test
 * binds, playing the supervisor, allocations included (and leaves it alone with
 * --no-agent). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bbproto.h"
#include "harness_gameproc.h"

static const char *dir;

typedef struct {
    pid_t pid;
    char log[300];
} gp_run_t;

/* Starts gameproc with the NULL-terminated extra args and env ("K=V" strings). */
static void gp_start(gp_run_t *g, const char *tag, const char *const *args,
                     const char *const *env)
{
    const char *argv[32] = { GAMEPROC };
    int n = 1;
    for (const char *const *a = args; a && *a && n < 31; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    snprintf(g->log, sizeof g->log, "%s/%s.log", dir, tag);
    g->pid = h_spawn(argv, g->log, env);
    assert_true(g->pid > 0);
}

static int log_has_(const char *path, const char *needle)
{
    char buf[65536];
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

typedef struct {
    const char *path;
    const char *needle;
} log_wait_t;

static int log_cond(void *arg)
{
    const log_wait_t *w = arg;
    return log_has_(w->path, w->needle);
}

static int log_wait(const gp_run_t *g, const char *needle, int ms)
{
    log_wait_t w = { g->log, needle };
    return h_wait_until(log_cond, &w, ms) == 0 || log_has_(g->log, needle);
}

static void gp_kill(gp_run_t *g)
{
    kill(g->pid, SIGKILL);
    waitpid(g->pid, NULL, 0);
}

/* ---- a supervisor end for the agent protocol --------------------------------------- */

static int wait_readable(int fd, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, ms) == 1;
}

/* Next message within ms into buf (NUL-terminated); its length, 0 on EOF, -1 timeout. */
static int next_msg(int fd, char *buf, size_t cap, int ms)
{
    if (!wait_readable(fd, ms))
        return -1;
    ssize_t n = recv(fd, buf, cap - 1, MSG_DONTWAIT);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return (int)n;
}

/* Reads messages for up to ms until one holds key; returns 1 when found. Heartbeats
 * seen on the way are counted in *beats (may be NULL). */
static int wait_key(int fd, const char *key, int ms, char *out, size_t cap, int *beats)
{
    int64_t end = h_now_ms() + ms;
    char buf[BBPROTO_MAX_MSG + 1];
    while (h_now_ms() < end) {
        int n = next_msg(fd, buf, sizeof buf, (int)(end - h_now_ms()));
        if (n <= 0)
            return 0;
        bbproto_field_t f[BBPROTO_MAX_FIELDS];
        int nf = bbproto_parse(buf, (size_t)n, f, BBPROTO_MAX_FIELDS);
        assert_true(nf > 0);
        if (beats && bbproto_get(f, nf, "HEARTBEAT", NULL))
            (*beats)++;
        if (bbproto_get(f, nf, key, NULL)) {
            if (out)
                snprintf(out, cap, "%s", buf);
            return 1;
        }
    }
    return 0;
}

/* ---- tests ------------------------------------------------------------------------- */

static void runs_alone_and_stops_on_sigterm(void **state)
{
    gp_run_t g;
    const char *args[] = { "--tick-hz", "50", "--players", "3", "--name", "alone", NULL };
    gp_start(&g, "alone", args, NULL);
    assert_true(log_wait(&g, "msg=ready", 3000));
    assert_true(log_has_(g.log, "supervisor=none"));
    h_sleep_ms(300); /* a span in which it must not exit */
    int st;
    assert_int_equal(h_exited(g.pid, &st), 0);

    int64_t t0 = h_now_ms();
    kill(g.pid, SIGTERM);
    st = h_wait_exit(g.pid, 3000);
    assert_true(st != -1);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(h_now_ms() - t0 < 1000);
    assert_true(log_has_(g.log, "msg=\"saving players\" players=3 reason=SIGTERM"));
    assert_true(log_has_(g.log, "msg=stopped reason=shutdown code=0"));
}

static void crash_with_exit_code(void **state)
{
    gp_run_t g;
    const char *args[] = { "--crash-after", "1", "--exit-code", "7", NULL };
    int64_t t0 = h_now_ms();
    gp_start(&g, "crash7", args, NULL);
    int st = h_wait_exit(g.pid, 5000);
    int64_t took = h_now_ms() - t0;
    assert_true(st != -1);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 7);
    assert_in_range(took, 900, 3000);
    assert_true(log_has_(g.log, "msg=crashing how=exit code=7"));
}

static void crash_by_abort(void **state)
{
    gp_run_t g;
    const char *args[] = { "--crash-after", "1", NULL };
    gp_start(&g, "abort", args, NULL);
    int st = h_wait_exit(g.pid, 5000);
    assert_true(st != -1);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
    assert_true(log_has_(g.log, "msg=crashing how=abort"));
}

static void ignore_term_keeps_running(void **state)
{
    gp_run_t g;
    const char *args[] = { "--ignore-term", NULL };
    gp_start(&g, "ignterm", args, NULL);
    assert_true(log_wait(&g, "msg=ready", 3000));
    kill(g.pid, SIGTERM);
    assert_true(log_wait(&g, "msg=\"ignoring stop signal\" signal=SIGTERM", 2000));
    h_sleep_ms(500); /* a span in which it must not exit */
    int st;
    assert_int_equal(h_exited(g.pid, &st), 0);
    assert_false(log_has_(g.log, "saving players"));
    gp_kill(&g);
}

static void bad_options_are_usage_errors(void **state)
{
    static const char *const cases[][3] = {
        { "--tick-hz", "0", NULL },          { "--crash-after", "soon", NULL },
        { "--exit-code", "7", NULL },        { "--players", "20", NULL },
        { "--name", "a\\b", NULL },          { "--udp-port", "example.com:1", NULL },
        { "--release-after-ms", "-1", NULL }, { "--meta", "", NULL },
        { "--no-such-flag", NULL, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gp_run_t g;
        char tag[32];
        snprintf(tag, sizeof tag, "usage%zu", i);
        gp_start(&g, tag, cases[i], NULL);
        int st = h_wait_exit(g.pid, 3000);
        if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 100)
            fail_msg("case %zu (%s): want exit 100", i, cases[i][0]);
    }
}

/* ---- UDP queries ------------------------------------------------------------------- */

/* Sends req to host:port until a reply arrives (the server may still be starting);
 * returns the reply length or -1. */
static int udp_ask(int family, int port, const void *req, size_t len, unsigned char *out,
                   size_t cap, int ms)
{
    int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_storage ss = { 0 };
    socklen_t sl;
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, "127.0.0.1", &a->sin_addr);
        sl = sizeof *a;
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, "::1", &a->sin6_addr);
        sl = sizeof *a;
    }
    assert_int_equal(connect(fd, (struct sockaddr *)&ss, sl), 0);
    int64_t end = h_now_ms() + ms;
    int n = -1;
    while (n < 0 && h_now_ms() < end) {
        send(fd, req, len, 0);
        if (wait_readable(fd, 100))
            n = (int)recv(fd, out, cap, 0);
    }
    close(fd);
    return n;
}

static const char *cstr(const unsigned char *p, int len, int *off)
{
    const char *s = (const char *)p + *off;
    size_t n = strnlen(s, (size_t)(len - *off));
    assert_true(*off + (int)n < len);
    *off += (int)n + 1;
    return s;
}

static void udp_quake3_queries(void **state)
{
    int port = h_free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    gp_run_t g;
    const char *args[] = { "--udp-port", ps, "--players", "2", "--max-players", "8",
                           "--name", "it srv", "--map", "q3dm17", NULL };
    gp_start(&g, "q3", args, NULL);

    unsigned char r[2048];
    int n = udp_ask(AF_INET, port, "\xff\xff\xff\xffgetstatus", 13, r, sizeof r - 1, 3000);
    assert_true(n > 0);
    r[n] = '\0';
    const char *s = (const char *)r;
    assert_memory_equal(s, "\xff\xff\xff\xffstatusResponse\n\\", 20);
    assert_non_null(strstr(s, "\\sv_hostname\\it srv\\"));
    assert_non_null(strstr(s, "\\mapname\\q3dm17\\"));
    assert_non_null(strstr(s, "\\sv_maxclients\\8\\"));
    assert_null(strstr(s, "\\challenge\\"));
    /* The info line, then one line per player: score ping "name". */
    const char *lines = strchr(s + 20, '\n');
    assert_non_null(lines);
    int players = 0, score, ping;
    char name[32];
    for (const char *l = lines + 1; *l; l = strchr(l, '\n') + 1) {
        assert_int_equal(sscanf(l, "%d %d \"%31[^\"]\"", &score, &ping, name), 3);
        players++;
        assert_non_null(strchr(l, '\n'));
    }
    assert_int_equal(players, 2);

    n = udp_ask(AF_INET, port, "\xff\xff\xff\xffgetinfo xyz", 15, r, sizeof r - 1, 3000);
    assert_true(n > 0);
    r[n] = '\0';
    assert_memory_equal(s, "\xff\xff\xff\xffinfoResponse\n\\", 18);
    assert_non_null(strstr(s, "\\challenge\\xyz\\"));
    assert_non_null(strstr(s, "\\clients\\2\\"));
    assert_non_null(strstr(s, "\\hostname\\it srv\\"));
    assert_null(strchr(s + 18, '\n'));

    /* Garbage, a truncated query and an oversized datagram get no answer. */
    static unsigned char big[2000];
    memset(big, 0xff, sizeof big);
    assert_int_equal(udp_ask(AF_INET, port, "getstatus", 9, r, sizeof r, 300), -1);
    assert_int_equal(udp_ask(AF_INET, port, "\xff\xff\xff\xffgetstat", 11, r, sizeof r, 300), -1);
    assert_int_equal(udp_ask(AF_INET, port, big, sizeof big, r, sizeof r, 300), -1);
    /* ...and the server still answers afterwards. */
    assert_true(udp_ask(AF_INET, port, "\xff\xff\xff\xffgetinfo", 11, r, sizeof r, 1000) > 0);
    h_stop(g.pid, 2000);
}

static void check_a2s_info(const unsigned char *r, int n, int port)
{
    assert_true(n > 6);
    assert_memory_equal(r, "\xff\xff\xff\xffI", 5);
    int off = 5;
    assert_int_equal(r[off++], 17);
    assert_string_equal(cstr(r, n, &off), "a2s srv");
    assert_string_equal(cstr(r, n, &off), "gp_arena");
    assert_string_equal(cstr(r, n, &off), "gameproc");
    assert_true(strlen(cstr(r, n, &off)) > 0);
    assert_true(off + 9 <= n);
    off += 2;                      /* app id */
    assert_int_equal(r[off++], 5); /* players */
    assert_int_equal(r[off++], 12);
    assert_int_equal(r[off++], 0);   /* bots */
    assert_int_equal(r[off++], 'd');
    assert_int_equal(r[off++], 'l');
    off += 2; /* visibility, VAC */
    assert_true(strlen(cstr(r, n, &off)) > 0);
    assert_true(off + 3 <= n);
    assert_int_equal(r[off++], 0x80);
    assert_int_equal(r[off] | r[off + 1] << 8, port);
    assert_int_equal(off + 2, n);
}

static void udp_valve_a2s_info(void **state)
{
    static const char req[] = "\xff\xff\xff\xffTSource Engine Query";
    int port = h_free_port();
    char ps[32];
    snprintf(ps, sizeof ps, "%d", port);
    gp_run_t g;
    const char *args[] = { "--udp-port", ps, "--players", "5", "--max-players", "12",
                           "--name", "a2s srv", NULL };
    gp_start(&g, "a2s", args, NULL);
    unsigned char r[1500];
    int n = udp_ask(AF_INET, port, req, sizeof req, r, sizeof r, 3000);
    check_a2s_info(r, n, port);
    h_stop(g.pid, 2000);

    /* On ::1 with the challenge round trip required. */
    port = h_free_port();
    snprintf(ps, sizeof ps, "[::1]:%d", port);
    const char *args6[] = { "--udp-port", ps, "--players", "5", "--max-players", "12",
                            "--name", "a2s srv", "--a2s-challenge", NULL };
    gp_start(&g, "a2s6", args6, NULL);
    n = udp_ask(AF_INET6, port, req, sizeof req, r, sizeof r, 3000);
    assert_int_equal(n, 9);
    assert_memory_equal(r, "\xff\xff\xff\xff" "A", 5);
    unsigned char req2[sizeof req + 4];
    memcpy(req2, req, sizeof req);
    memcpy(req2 + sizeof req, r + 5, 4);
    unsigned char r2[1500];
    n = udp_ask(AF_INET6, port, req2, sizeof req2, r2, sizeof r2, 3000);
    check_a2s_info(r2, n, port);
    /* A wrong challenge gets a new challenge, not the info. */
    req2[sizeof req] ^= 0x5a;
    n = udp_ask(AF_INET6, port, req2, sizeof req2, r2, sizeof r2, 3000);
    assert_int_equal(n, 9);
    assert_memory_equal(r2, r, 9);
    h_stop(g.pid, 2000);
}

static void udp_silent_until_ready(void **state)
{
    int port = h_free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    gp_run_t g;
    const char *args[] = { "--udp-port", ps, "--slow-start", "30", NULL };
    gp_start(&g, "slowudp", args, NULL);
    assert_true(log_wait(&g, "msg=started", 3000));
    unsigned char r[1500];
    assert_int_equal(udp_ask(AF_INET, port, "\xff\xff\xff\xffgetinfo", 11, r, sizeof r, 500), -1);
    assert_false(log_has_(g.log, "msg=ready"));
    gp_kill(&g);
}

/* ---- sd_notify --------------------------------------------------------------------- */

static void notify_ready_watchdog_stopping(void **state)
{
    char path[100];
    snprintf(path, sizeof path, "%s/notify.sock", dir);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    int one = 1;
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one), 0);

    char env_sock[320], env_wd[] = "WATCHDOG_USEC=400000";
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", path);
    const char *env[] = { env_sock, env_wd, NULL };
    const char *args[] = { "--notify", "--players", "4", "--tick-hz", "50", NULL };
    gp_run_t g;
    gp_start(&g, "notify", args, env);

    /* Collect one second of datagrams with the sender's credentials. */
    int64_t t0 = h_now_ms();
    int got = 0, ready_at = -1, watchdogs = 0, status = 0;
    while (h_now_ms() - t0 < 1200 && got < 200) {
        if (!wait_readable(fd, 200))
            continue;
        char buf[512];
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(struct ucred))];
        } cm;
        struct iovec iov = { buf, sizeof buf - 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &cm,
                             .msg_controllen = sizeof cm };
        ssize_t n = recvmsg(fd, &mh, 0);
        assert_true(n > 0);
        buf[n] = '\0';
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        assert_non_null(c);
        assert_int_equal(c->cmsg_type, SCM_CREDENTIALS);
        struct ucred cred;
        memcpy(&cred, CMSG_DATA(c), sizeof cred);
        assert_int_equal(cred.pid, g.pid);
        if (strcmp(buf, "READY=1") == 0 && ready_at < 0)
            ready_at = got;
        else if (strcmp(buf, "WATCHDOG=1") == 0)
            watchdogs++;
        else if (strncmp(buf, "STATUS=", 7) == 0 && strstr(buf, "players=4/16"))
            status++;
        else
            fail_msg("unexpected notify message '%s'", buf);
        got++;
    }
    print_message("%d datagrams, %d WATCHDOG=1 in 1.2 s\n", got, watchdogs);
    assert_int_equal(ready_at, 0); /* READY=1 came first */
    assert_int_equal(status, 1);   /* STATUS only when it changes */
    /* WATCHDOG_USEC 400 ms: one per 100 ms, though the loop ticks every 20 ms. */
    assert_in_range(watchdogs, 6, 14);

    kill(g.pid, SIGTERM);
    char buf[512];
    int stopping = 0;
    for (int i = 0; i < 50 && !stopping && wait_readable(fd, 2000); i++) {
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        assert_true(n > 0);
        buf[n] = '\0';
        stopping = strcmp(buf, "STOPPING=1") == 0;
    }
    assert_true(stopping);
    int st = h_wait_exit(g.pid, 3000);
    assert_true(st != -1 && WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(fd);
}

/* ---- the agent protocol (this test plays Big Brother) ------------------------------ */

static void agent_ready_heartbeat_shutdown(void **state)
{
    char path[100], env_sock[120];
    snprintf(path, sizeof path, "%s/agent.sock", dir);
    snprintf(env_sock, sizeof env_sock, "BB_SOCKET=%s", path);
    int lfd = gp_agent_listen(path);
    const char *env[] = { env_sock, "BB_INSTANCE=zone-it-1", NULL };
    const char *args[] = { "--players", "6", "--slow-start", "0.5", "--save-ms", "300", NULL };
    gp_run_t g;
    gp_start(&g, "agent", args, env);
    assert_true(wait_readable(lfd, 3000));
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(c >= 0);

    char msg[BBPROTO_MAX_MSG + 1];
    assert_true(wait_key(c, "HELLO", 2000, msg, sizeof msg, NULL));
    assert_non_null(strstr(msg, "INSTANCE=zone-it-1\n"));
    int64_t hello_at = h_now_ms();
    send(c, "WELCOME=1\nHEARTBEAT_MS=400\n", 27, 0);

    /* Heartbeats and the status flow during the slow start; READY comes after it. */
    int beats = 0;
    assert_true(wait_key(c, "PLAYERS", 2000, msg, sizeof msg, &beats));
    assert_non_null(strstr(msg, "PLAYERS=6\nMAX_PLAYERS=16\n"));
    assert_true(wait_key(c, "READY", 3000, NULL, 0, &beats));
    int64_t ready_after = h_now_ms() - hello_at;
    print_message("READY %lld ms after HELLO, %d heartbeats before\n", (long long)ready_after,
                  beats);
    assert_true(ready_after >= 400);
    assert_true(beats >= 2);

    /* One heartbeat per 100 ms (HEARTBEAT_MS/4) while the loop ticks at 20 Hz. */
    beats = 0;
    wait_key(c, "NO_SUCH_KEY", 1000, NULL, 0, &beats);
    print_message("%d heartbeats in 1 s\n", beats);
    assert_in_range(beats, 5, 12);

    send(c, "DRAIN=1\n", 8, 0);
    assert_true(log_wait(&g, "msg=draining", 2000));
    assert_true(wait_key(c, "STATUS", 2000, msg, sizeof msg, NULL));
    assert_non_null(strstr(msg, "draining"));

    int64_t t0 = h_now_ms();
    send(c, "SHUTDOWN=1\nGRACE_MS=2000\n", 25, 0);
    assert_true(wait_key(c, "BYE", 3000, msg, sizeof msg, NULL));
    assert_non_null(strstr(msg, "BYE=shutdown"));
    int st = h_wait_exit(g.pid, 3000);
    int64_t took = h_now_ms() - t0;
    assert_true(st != -1 && WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_in_range(took, 250, 2500); /* the 300 ms save, inside the grace */
    assert_true(log_has_(g.log, "msg=\"saving players\" players=6 reason=SHUTDOWN grace_ms=2000"));
    close(c);
    close(lfd);
}

/* Allocations through the agent protocol: an ALLOCATED is logged with its id, mode,
 * players and payload and acknowledged; --release-after-ms releases the session that
 * long after; DEALLOCATED is logged; --meta is appended to the status line. */
static void agent_allocation_release_meta(void **state)
{
    char path[100], env_sock[120];
    snprintf(path, sizeof path, "%s/agent-alloc.sock", dir);
    snprintf(env_sock, sizeof env_sock, "BB_SOCKET=%s", path);
    int lfd = gp_agent_listen(path);
    const char *env[] = { env_sock, "BB_INSTANCE=match-it-1", NULL };
    const char *args[] = { "--tick-hz", "50", "--meta", "mode=ctf tier=2",
                           "--release-after-ms", "300", NULL };
    gp_run_t g;
    gp_start(&g, "agent-alloc", args, env);
    assert_true(wait_readable(lfd, 3000));
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(c >= 0);
    char msg[BBPROTO_MAX_MSG + 1];
    assert_true(wait_key(c, "HELLO", 2000, msg, sizeof msg, NULL));
    send(c, "WELCOME=1\nHEARTBEAT_MS=1000\n", 28, 0);
    /* the status line (with --meta) and the port come before READY, so the instance is
     * listed with both as soon as it is ready */
    assert_true(wait_key(c, "STATUS", 2000, msg, sizeof msg, NULL));
    assert_non_null(strstr(msg, "STATUS=map=gp_arena players=0/16 mode=ctf tier=2\n"));
    assert_true(wait_key(c, "READY", 2000, NULL, 0, NULL));

    static const char alloc[] =
        "ALLOCATED=a000000000001\nMODE=join\nPLAYERS=8\nPAYLOAD={\"match\":\"m1\"}\n";
    int64_t t0 = h_now_ms();
    send(c, alloc, sizeof alloc - 1, 0);
    assert_true(wait_key(c, "ALLOCATION_ACK", 2000, msg, sizeof msg, NULL));
    assert_string_equal(msg, "ALLOCATION_ACK=a000000000001\n");
    assert_true(log_wait(&g, "msg=allocated allocation=a000000000001 mode=join players=8 "
                             "payload=\"{\\\"match\\\":\\\"m1\\\"}\"", 2000));
    assert_true(wait_key(c, "RELEASE", 2000, msg, sizeof msg, NULL));
    int64_t took = h_now_ms() - t0;
    print_message("released %lld ms after the allocation\n", (long long)took);
    assert_in_range(took, 280, 1500);

    send(c, "DEALLOCATED=a000000000001\n", 26, 0);
    assert_true(log_wait(&g, "msg=deallocated allocation=a000000000001", 2000));
    send(c, "SHUTDOWN=1\nGRACE_MS=1000\n", 25, 0);
    assert_true(wait_key(c, "BYE", 3000, NULL, 0, NULL));
    int st = h_wait_exit(g.pid, 3000);
    assert_true(st != -1 && WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(c);
    close(lfd);
}

static void hang_stops_heartbeats(void **state)
{
    char path[100], env_sock[120];
    snprintf(path, sizeof path, "%s/hang.sock", dir);
    snprintf(env_sock, sizeof env_sock, "BB_SOCKET=%s", path);
    int lfd = gp_agent_listen(path);
    const char *env[] = { env_sock, NULL };
    const char *args[] = { "--hang-after", "0.7", NULL };
    gp_run_t g;
    gp_start(&g, "hang", args, env);
    assert_true(wait_readable(lfd, 3000));
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(c >= 0);
    int beats = 0;
    assert_true(wait_key(c, "READY", 2000, NULL, 0, &beats));
    assert_true(log_wait(&g, "msg=hanging", 3000));
    /* Drain what was sent before the hang, then: silence, but alive. */
    wait_key(c, "NO_SUCH_KEY", 200, NULL, 0, NULL);
    char buf[BBPROTO_MAX_MSG + 1];
    assert_int_equal(next_msg(c, buf, sizeof buf, 800), -1);
    int st;
    assert_int_equal(h_exited(g.pid, &st), 0);
    /* SIGTERM is not acted on by a hung loop; SIGABRT (bigbrother's hang signal) ends it. */
    kill(g.pid, SIGTERM);
    h_sleep_ms(300); /* a span in which it must not exit */
    assert_int_equal(h_exited(g.pid, &st), 0);
    kill(g.pid, SIGABRT);
    st = h_wait_exit(g.pid, 3000);
    assert_true(st != -1 && WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
    close(c);
    close(lfd);
}

static void no_agent_never_connects(void **state)
{
    char path[100], env_sock[120];
    snprintf(path, sizeof path, "%s/noagent.sock", dir);
    snprintf(env_sock, sizeof env_sock, "BB_SOCKET=%s", path);
    int lfd = gp_agent_listen(path);
    const char *env[] = { env_sock, NULL };
    const char *args[] = { "--no-agent", NULL };
    gp_run_t g;
    gp_start(&g, "noagent", args, env);
    assert_true(log_wait(&g, "msg=ready", 3000));
    assert_true(log_has_(g.log, "supervisor=none"));
    assert_false(wait_readable(lfd, 500)); /* nobody connected */
    int st = h_stop(g.pid, 2000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(lfd);
}

int main(void)
{
    h_init(120);
    /* SIGABRT deaths are expected here: no core files. */
    struct rlimit nocore = { 0, 0 };
    setrlimit(RLIMIT_CORE, &nocore);
    unsetenv("BB_SOCKET");
    unsetenv("NOTIFY_SOCKET");
    dir = h_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(runs_alone_and_stops_on_sigterm),
        cmocka_unit_test(crash_with_exit_code),
        cmocka_unit_test(crash_by_abort),
        cmocka_unit_test(ignore_term_keeps_running),
        cmocka_unit_test(bad_options_are_usage_errors),
        cmocka_unit_test(udp_quake3_queries),
        cmocka_unit_test(udp_valve_a2s_info),
        cmocka_unit_test(udp_silent_until_ready),
        cmocka_unit_test(notify_ready_watchdog_stopping),
        cmocka_unit_test(agent_ready_heartbeat_shutdown),
        cmocka_unit_test(agent_allocation_release_meta),
        cmocka_unit_test(hang_stops_heartbeats),
        cmocka_unit_test(no_agent_never_connects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
