/* The daemons under a Type=notify systemd unit, played by this test: it binds the
 * NOTIFY_SOCKET datagram socket itself (with SO_PASSCRED, so each message carries the
 * sender's pid, as systemd's NotifyAccess=main checks), starts the REAL serverdir and
 * bigbrother with NOTIFY_SOCKET and WATCHDOG_USEC set, and checks what systemd would see:
 * READY=1 only once the daemon is usable, WATCHDOG=1 at about half WATCHDOG_USEC and
 * never a gap that would trip the watchdog, STOPPING=1 on SIGTERM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_bigbrother.h"

#define WATCHDOG_USEC 1000000 /* the daemons ping every 500 ms */

typedef struct {
    int fd;
    char path[300];
} nsock_t;

static void nsock_open(nsock_t *n, const char *name)
{
    snprintf(n->path, sizeof n->path, "%s/%s", h_tmpdir(), name);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(n->path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, n->path, strlen(n->path) + 1);
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(n->fd >= 0);
    assert_int_equal(bind(n->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    int one = 1;
    assert_int_equal(setsockopt(n->fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one), 0);
}

/* Receives one message within timeout_ms into buf (NUL-terminated); *pid is the sender's
 * pid from SCM_CREDENTIALS. Returns the length, or -1 on timeout. */
static int nsock_recv(nsock_t *n, char *buf, size_t cap, pid_t *pid, int timeout_ms)
{
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(n->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(struct ucred))];
    } ctl;
    struct iovec iov = {buf, cap - 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl,
                        .msg_controllen = sizeof ctl};
    ssize_t len = recvmsg(n->fd, &mh, 0);
    if (len < 0)
        return -1;
    buf[len] = '\0';
    *pid = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
            struct ucred uc;
            memcpy(&uc, CMSG_DATA(c), sizeof uc);
            *pid = uc.pid;
        }
    return (int)len;
}

/* 1 if the message has the assignment line `kv` (e.g. "READY=1"). */
static int has_line(const char *msg, const char *kv)
{
    size_t l = strlen(kv);
    for (const char *p = msg; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, kv, l) && (p[l] == '\n' || p[l] == '\0'))
            return 1;
    return 0;
}

/* Waits up to timeout_ms for a message from pid with line kv; copies it to out. */
static int wait_for(nsock_t *n, pid_t pid, const char *kv, int timeout_ms, char *out, size_t cap)
{
    int64_t end = h_now_ms() + timeout_ms;
    char buf[1200];
    pid_t from;
    while (h_now_ms() < end) {
        int left = (int)(end - h_now_ms());
        if (nsock_recv(n, buf, sizeof buf, &from, left > 0 ? left : 1) < 0)
            continue;
        if (from == pid && has_line(buf, kv)) {
            if (out)
                snprintf(out, cap, "%s", buf);
            return 1;
        }
    }
    return 0;
}

/* Collects WATCHDOG=1 from pid for window_ms; checks the count and the gaps. */
static void check_watchdog(nsock_t *n, pid_t pid, int window_ms)
{
    int64_t end = h_now_ms() + window_ms, last = 0, max_gap = 0, min_gap = INT64_MAX;
    int count = 0, others = 0;
    char buf[1200];
    pid_t from;
    while (h_now_ms() < end) {
        int left = (int)(end - h_now_ms());
        if (nsock_recv(n, buf, sizeof buf, &from, left > 0 ? left : 1) < 0)
            continue;
        if (from != pid || !has_line(buf, "WATCHDOG=1")) {
            others++;
            continue;
        }
        int64_t now = h_now_ms();
        if (last) {
            max_gap = now - last > max_gap ? now - last : max_gap;
            min_gap = now - last < min_gap ? now - last : min_gap;
        }
        last = now;
        count++;
    }
    int expect = window_ms / (WATCHDOG_USEC / 2000);
    print_message("watchdog: %d pings in %d ms (expected ~%d), gaps %lld..%lld ms, %d other\n",
                  count, window_ms, expect, (long long)min_gap, (long long)max_gap, others);
    /* about the right period: half WATCHDOG_USEC, give or take a loaded machine */
    assert_in_range(count, expect - 2, expect + 1);
    /* what matters to systemd: never silent for a whole WATCHDOG_USEC */
    assert_true(max_gap < WATCHDOG_USEC / 1000);
    /* and no spamming */
    assert_true(min_gap >= WATCHDOG_USEC / 4000);
}

static void serverdir_notifies(void **state)
{
    h_redis_t redis;
    assert_int_equal(h_redis_start(&redis), 0);
    nsock_t n;
    nsock_open(&n, "sd-notify.sock");
    int port = h_free_port();
    char listen[64], url[96], env_sock[400], env_wd[64], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", port);
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", n.path);
    snprintf(env_wd, sizeof env_wd, "WATCHDOG_USEC=%d", WATCHDOG_USEC);
    snprintf(log, sizeof log, "%s/serverdir.log", h_tmpdir());
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis.url,
                          "--tokens", h_tokens_file(), NULL};
    const char *env[] = {env_sock, env_wd, NULL};
    pid_t pid = h_spawn(argv, log, env);
    assert_true(pid > 0);

    char msg[1200];
    assert_true(wait_for(&n, pid, "READY=1", h_valgrind() ? 30000 : 10000, msg, sizeof msg));
    assert_non_null(strstr(msg, "STATUS=serving on 127.0.0.1:"));
    /* READY=1 means listening: /healthz answers at once */
    h_resp_t r;
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    check_watchdog(&n, pid, 3000);

    /* SIGHUP (token reload) is RELOADING=1 then READY=1 again */
    kill(pid, SIGHUP);
    assert_true(wait_for(&n, pid, "RELOADING=1", 5000, NULL, 0));
    assert_true(wait_for(&n, pid, "READY=1", 5000, NULL, 0));

    kill(pid, SIGTERM);
    assert_true(wait_for(&n, pid, "STOPPING=1", 5000, msg, sizeof msg));
    assert_non_null(strstr(msg, "STATUS=stopping on SIGTERM"));
    int st = h_wait_exit(pid, 30000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(n.fd);
    h_redis_stop(&redis);
}

/* WATCHDOG_PID naming another process (an inherited environment) means: no watchdog. */
static void serverdir_ignores_foreign_watchdog_pid(void **state)
{
    h_redis_t redis;
    assert_int_equal(h_redis_start(&redis), 0);
    nsock_t n;
    nsock_open(&n, "sd-notify2.sock");
    char listen[64], env_sock[400], env_wd[64], env_pid[64], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", h_free_port());
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", n.path);
    snprintf(env_wd, sizeof env_wd, "WATCHDOG_USEC=%d", WATCHDOG_USEC);
    snprintf(env_pid, sizeof env_pid, "WATCHDOG_PID=%d", (int)getpid());
    snprintf(log, sizeof log, "%s/serverdir2.log", h_tmpdir());
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis.url, NULL};
    const char *env[] = {env_sock, env_wd, env_pid, NULL};
    pid_t pid = h_spawn(argv, log, env);
    assert_true(pid > 0);
    assert_true(wait_for(&n, pid, "READY=1", h_valgrind() ? 30000 : 10000, NULL, 0));
    assert_false(wait_for(&n, pid, "WATCHDOG=1", 1500, NULL, 0));
    kill(pid, SIGTERM);
    assert_true(wait_for(&n, pid, "STOPPING=1", 5000, NULL, 0));
    h_wait_exit(pid, 30000);
    close(n.fd);
    h_redis_stop(&redis);
}

/* Opens a connection to 127.0.0.1:port and sends a request that needs Redis, without
 * reading the answer. Returns the socket. */
static int send_redis_request(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static const char req[] = "GET /v1/clusters/c1/machines HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)(sizeof req - 1));
    return fd;
}

/* The point of the self-check: with its only worker stuck in a Redis call (Redis is
 * SIGSTOPped, each call blocks up to the 3 s command timeout), serverdir stops feeding
 * the watchdog, long enough for systemd to act, logs it once, and resumes after. */
static void serverdir_watchdog_starves_when_workers_hang(void **state)
{
    h_redis_t redis;
    assert_int_equal(h_redis_start(&redis), 0);
    nsock_t n;
    nsock_open(&n, "sd-notify3.sock");
    int port = h_free_port();
    char listen[64], env_sock[400], env_wd[64], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", n.path);
    snprintf(env_wd, sizeof env_wd, "WATCHDOG_USEC=%d", WATCHDOG_USEC);
    snprintf(log, sizeof log, "%s/serverdir3.log", h_tmpdir());
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis.url,
                          "--threads", "1", NULL};
    const char *env[] = {env_sock, env_wd, NULL};
    pid_t pid = h_spawn(argv, log, env);
    assert_true(pid > 0);
    assert_true(wait_for(&n, pid, "READY=1", h_valgrind() ? 30000 : 10000, NULL, 0));
    assert_true(wait_for(&n, pid, "WATCHDOG=1", 3000, NULL, 0));

    kill(redis.pid, SIGSTOP);
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = send_redis_request(port);
    /* No ping for longer than WATCHDOG_USEC: systemd would now kill and restart it. A ping
     * on its way when the worker got stuck may still come, and so may one between two
     * requests (each call blocks for the 3 s command timeout, and a request that just
     * started is not stuck yet): what counts is that a gap systemd acts on comes, within
     * the 9 s the three requests keep the worker busy. */
    int starved = 0;
    for (int i = 0; i < 12 && !starved; i++)
        starved = !wait_for(&n, pid, "WATCHDOG=1", WATCHDOG_USEC / 1000 + 500, NULL, 0);
    assert_true(starved);
    assert_true(bbt_file_has(log, "watchdog self-check failed"));

    kill(redis.pid, SIGCONT);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    assert_true(wait_for(&n, pid, "WATCHDOG=1", 15000, NULL, 0));
    assert_true(bbt_file_has(log, "watchdog self-check recovered"));
    kill(pid, SIGTERM);
    assert_true(wait_for(&n, pid, "STOPPING=1", 5000, NULL, 0));
    h_wait_exit(pid, 30000);
    close(n.fd);
    h_redis_stop(&redis);
}

static pid_t bb_start_notified(bbt_t *b, nsock_t *n)
{
    char env_sock[400], env_wd[64];
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", n->path);
    snprintf(env_wd, sizeof env_wd, "WATCHDOG_USEC=%d", WATCHDOG_USEC);
    const char *argv[] = {BIGBROTHER, "--config", b->cfg, NULL};
    const char *env[] = {env_sock, env_wd, NULL};
    snprintf(b->log, sizeof b->log, "%s/bb-%d.log", b->dir, ++b->runs);
    b->pid = h_spawn(argv, b->log, env);
    return b->pid;
}

/* bigbrother: READY=1 comes from the running loop after re-adoption, so on READY=1 the
 * game process the previous bigbrother left running is already adopted (same pid). */
static void bigbrother_notifies(void **state)
{
    bbt_t b = {0};
    char svc[1024];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"zone\", \"command\": \"%s\", \"count\": 1,"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000,"
             " \"liveness_timeout_ms\": 2000},"
             " \"stop\": {\"grace_ms\": 1000}, \"cwd\": \"%s\", \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, h_tmpdir());
    bbt_config(&b, svc, NULL);
    nsock_t n;
    nsock_open(&n, "bb-notify.sock");
    int slow = h_valgrind() ? 3 : 1;

    pid_t pid = bb_start_notified(&b, &n);
    assert_true(pid > 0);
    char msg[1200];
    assert_true(wait_for(&n, pid, "READY=1", 10000 * slow, msg, sizeof msg));
    assert_non_null(strstr(msg, "STATUS=supervising 1 instances"));
    json_t *in = bbt_wait(&b, "zone", 0, "ready", 1, 10000 * slow);
    assert_non_null(in);
    pid_t game = (pid_t)bbt_int(in, "pid");
    json_decref(in);

    check_watchdog(&n, pid, 3000);

    kill(pid, SIGTERM);
    assert_true(wait_for(&n, pid, "STOPPING=1", 5000 * slow, msg, sizeof msg));
    assert_non_null(strstr(msg, "1 processes left running"));
    int st = h_wait_exit(pid, 30000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(bbt_alive(game));

    pid = bb_start_notified(&b, &n);
    assert_true(pid > 0);
    assert_true(wait_for(&n, pid, "READY=1", 10000 * slow, msg, sizeof msg));
    in = bbt_inst(&b, "zone", 0);
    assert_non_null(in);
    assert_int_equal(bbt_int(in, "pid"), game);
    json_decref(in);
    assert_non_null(strstr(msg, "(1 running"));

    /* SIGHUP: RELOADING=1, re-exec in place (same pid), READY=1 again, game untouched */
    kill(pid, SIGHUP);
    assert_true(wait_for(&n, pid, "RELOADING=1", 5000 * slow, NULL, 0));
    assert_true(wait_for(&n, pid, "READY=1", 10000 * slow, NULL, 0));
    in = bbt_inst(&b, "zone", 0);
    assert_non_null(in);
    assert_int_equal(bbt_int(in, "pid"), game);
    json_decref(in);
    check_watchdog(&n, pid, 2000);

    json_decref(bbt_ctl(&b, "stop all"));
    kill(pid, SIGTERM);
    assert_true(wait_for(&n, pid, "STOPPING=1", 5000 * slow, NULL, 0));
    h_wait_exit(pid, 30000);
    close(n.fd);
}

/* A shell script supervised with health type notify that calls systemd-notify: READY=1
 * (sent with the script's credentials) makes it ready, and the BARRIER=1 that
 * systemd-notify then sends from its own pid (a child in the instance's process group,
 * waiting for the passed descriptor to close) is taken as the instance's, not dropped as
 * from "not a supervised process". */
static void systemd_notify_from_a_script(void **state)
{
    bbt_t b = {0};
    bbt_dirs(&b);
    char svc[1024];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"sh\", \"command\": \"/bin/sh\", \"args\": [\"-c\","
             " \"systemd-notify --ready --status=up; for i in $(seq 50); do systemd-notify"
             " --status=tick$i; done; exec sleep 100\"], \"count\": 1,"
             " \"health\": {\"type\": \"notify\", \"start_timeout_ms\": 5000},"
             " \"stop\": {\"grace_ms\": 1000}, \"cwd\": \"%s\"}]",
             h_tmpdir());
    bbt_config(&b, svc, NULL);
    assert_true(bbt_start(&b) > 0);
    json_t *in = bbt_wait(&b, "sh", 0, "ready", 1, h_valgrind() ? 20000 : 5000);
    assert_non_null(in);
    json_decref(in);
    /* 50 more STATUS= with their barriers: the last one arrives, none is dropped (each
     * systemd-notify is a process and a barrier round trip: 30 s for a loaded machine) */
    int64_t t0 = h_now_ms();
    for (int i = 0; i < (h_valgrind() ? 2400 : 600); i++) {
        in = bbt_inst(&b, "sh", 0);
        int done = in && !strcmp(bbt_str(in, "status"), "tick50");
        json_decref(in);
        if (done)
            break;
        h_sleep_ms(50);
    }
    in = bbt_inst(&b, "sh", 0);
    fprintf(stderr, "50 systemd-notify calls seen in %lld ms\n", (long long)(h_now_ms() - t0));
    assert_string_equal(bbt_str(in, "status"), "tick50");
    json_decref(in);
    assert_false(bbt_file_has(b.log, "not a supervised process"));
    bbt_stop(&b, 3000);
}

int main(void)
{
    h_init(90);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serverdir_notifies),
        cmocka_unit_test(serverdir_ignores_foreign_watchdog_pid),
        cmocka_unit_test(serverdir_watchdog_starves_when_workers_hang),
        cmocka_unit_test(bigbrother_notifies),
        cmocka_unit_test(systemd_notify_from_a_script),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
