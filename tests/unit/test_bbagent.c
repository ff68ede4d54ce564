/* libbbagent against a SOCK_SEQPACKET listener created here, playing Big Brother:
 * the no-op mode, HELLO/READY/STATUS content, heartbeat rate limits, SHUTDOWN and DRAIN,
 * lazy reconnection paced at 500 ms, no call ever blocking (not even on a full backlog
 * or a full socket: counted as voluntary context switches), state resent after a
 * reconnect, allocations (ALLOCATED returned once and acknowledged, DEALLOCATED,
 * malformed ones ignored, the 1024-byte payload cap, acknowledgements and a release
 * owed across a reconnect), names checked by the directory's own rule, and no
 * allocation per call (counted by a malloc hook built into this test executable only). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bbagent.h"
#include "bbproto.h"
#include "sdproto.h"

/* ---- allocation counter ---------------------------------------------------------- */


/* The details of the allocation event bbagent_poll last returned (bbagent_allocation). */
static bbagent_allocation_t al_get(const bbagent_t *a)
{
    bbagent_allocation_t al;
    bbagent_allocation(a, &al);
    return al;
}
#define AL(h) al_get(h)

static volatile long alloc_count;

#if defined(__SANITIZE_ADDRESS__)
/* ASan owns malloc; it calls these hooks on every allocation. */
int __sanitizer_install_malloc_and_free_hooks(void (*m)(const volatile void *, size_t),
                                              void (*f)(const volatile void *));
static void on_malloc(const volatile void *p, size_t n)
{
    alloc_count++;
}
static void on_free(const volatile void *p)
{
}
static void alloc_hook_install(void)
{
    __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}
#else
/* glibc: these definitions in the executable take the place of libc's for the whole
 * process and forward to the real allocator. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
void *malloc(size_t n)
{
    alloc_count++;
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size)
{
    alloc_count++;
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n)
{
    alloc_count++;
    return __libc_realloc(p, n);
}
void free(void *p)
{
    __libc_free(p);
}
static void alloc_hook_install(void)
{
}
#endif

/* ---- a tiny Big Brother ------------------------------------------------------------ */

static char sock_path[108];

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int listen_at(const char *path)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    socklen_t len;
    if (path[0] == '@') {
        memcpy(a.sun_path + 1, path + 1, strlen(path) - 1);
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    } else {
        unlink(path);
        strcpy(a.sun_path, path);
        len = sizeof a;
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, len), 0);
    assert_int_equal(listen(fd, 8), 0);
    return fd;
}

static int accept_within(int lfd, int ms)
{
    struct pollfd p = { .fd = lfd, .events = POLLIN };
    if (poll(&p, 1, ms) != 1)
        return -1;
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* One packet within ms: its length, 0 on EOF, -1 on timeout. */
static int recv_within(int fd, char *buf, size_t cap, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (poll(&p, 1, ms) != 1)
        return -1;
    ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT);
    return n < 0 ? -1 : (int)n;
}

/* Receives one message and checks that key has value want in it. */
static void expect_kv(int fd, const char *key, const char *want)
{
    char buf[BBPROTO_MAX_MSG];
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    int n = recv_within(fd, buf, sizeof buf, 1000);
    if (n <= 0)
        fail_msg("no message with %s=%s (recv %d)", key, want, n);
    int nf = bbproto_parse(buf, (size_t)n, f, BBPROTO_MAX_FIELDS);
    assert_true(nf > 0);
    size_t vl;
    const char *v = bbproto_get(f, nf, key, &vl);
    if (!v || vl != strlen(want) || memcmp(v, want, vl) != 0)
        fail_msg("message '%.*s' lacks %s=%s", n, buf, key, want);
}

static void expect_silence(int fd, int ms)
{
    char buf[BBPROTO_MAX_MSG];
    int n = recv_within(fd, buf, sizeof buf, ms);
    if (n > 0)
        fail_msg("unexpected message '%.*s'", n, buf);
}

/* Counts HEARTBEAT packets waiting on fd (and fails on anything else but heartbeats). */
static int count_heartbeats(int fd)
{
    char buf[BBPROTO_MAX_MSG];
    int n = 0, len;
    while ((len = recv_within(fd, buf, sizeof buf, 0)) > 0) {
        assert_int_equal(len, 12);
        assert_memory_equal(buf, "HEARTBEAT=1\n", 12);
        n++;
    }
    return n;
}

/* Voluntary context switches of this thread so far: a call that blocks (sleeps in the
 * kernel) adds one, being preempted on a busy machine does not. */
static long blocked_count(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_nvcsw;
}

/* Calls bbagent_heartbeat as fast as it can for ms; returns the slowest call (us).
 * *blocks (may be NULL) gets the number of times a call blocked. */
static int64_t hammer(bbagent_t *a, int ms, long *calls, long *blocks)
{
    int64_t end = mono_us() + ms * 1000, worst = 0;
    long n = 0, b0 = blocked_count();
    for (; n < 100000000; n++) {
        int64_t t0 = mono_us();
        bbagent_heartbeat(a);
        int64_t t1 = mono_us();
        if (t1 - t0 > worst)
            worst = t1 - t0;
        if (t1 >= end)
            break;
    }
    if (blocks)
        *blocks = blocked_count() - b0;
    if (calls)
        *calls = n;
    return worst;
}

static bbagent_t *open_at(const char *path, const char *instance)
{
    bbagent_opts_t o = { .socket_path = path, .instance = instance };
    bbagent_t *a = bbagent_open(&o);
    assert_non_null(a);
    return a;
}

static int setup(void **state)
{
    snprintf(sock_path, sizeof sock_path, "/tmp/test_bbagent.%d.sock", (int)getpid());
    unsetenv("BB_SOCKET");
    unsetenv("BB_INSTANCE");
    return 0;
}

static int teardown(void **state)
{
    unlink(sock_path);
    return 0;
}

/* ---- tests ------------------------------------------------------------------------- */

static void no_bigbrother_is_a_noop(void **state)
{
    bbagent_t *a = bbagent_open(NULL);
    assert_non_null(a);
    assert_int_equal(bbagent_ready(a), 0);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(bbagent_heartbeat(a), 0);
    assert_int_equal(bbagent_status(a, 3, 16, "map=q3dm17"), 0);
    assert_int_equal(bbagent_fd(a), -ENOTCONN);
    bbagent_event_t ev = { .type = BBAGENT_EVENT_DRAIN };
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    bbagent_close(a, "done");

    /* An explicit empty path turns the shim off even with $BB_SOCKET set. */
    setenv("BB_SOCKET", sock_path, 1);
    int lfd = listen_at(sock_path);
    a = open_at("", NULL);
    assert_int_equal(bbagent_heartbeat(a), 0);
    assert_int_equal(accept_within(lfd, 100), -1);
    bbagent_close(a, NULL);
    close(lfd);
    unsetenv("BB_SOCKET");
}

static void bad_arguments(void **state)
{
    char longpath[200];
    memset(longpath, 'p', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = '\0';
    bbagent_opts_t o = { .socket_path = longpath };
    errno = 0;
    assert_null(bbagent_open(&o));
    assert_int_equal(errno, EINVAL);
    o = (bbagent_opts_t){ .socket_path = sock_path, .instance = "two\nlines" };
    assert_null(bbagent_open(&o));
    assert_int_equal(errno, EINVAL);

    assert_int_equal(bbagent_heartbeat(NULL), -EINVAL);
    assert_int_equal(bbagent_ready(NULL), -EINVAL);
    assert_int_equal(bbagent_fd(NULL), -EINVAL);
    bbagent_t *a = open_at("", NULL);
    assert_int_equal(bbagent_poll(a, NULL), -EINVAL);
    assert_int_equal(bbagent_status(a, 1, 2, "two\nlines"), -EINVAL);
    char big[1100];
    memset(big, 's', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(bbagent_status(a, 1, 2, big), -EINVAL);
    bbagent_close(a, NULL);
    bbagent_close(NULL, NULL);
}

static void hello_ready_status_bye(void **state)
{
    int lfd = listen_at(sock_path);
    setenv("BB_SOCKET", sock_path, 1);
    setenv("BB_INSTANCE", "zone-m1-7f3a9c-3", 1);
    bbagent_t *a = bbagent_open(NULL);
    unsetenv("BB_SOCKET");
    unsetenv("BB_INSTANCE");
    assert_non_null(a);
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);

    /* Big Brother learns who is calling from the socket, not from the message. */
    struct ucred cred;
    socklen_t cl = sizeof cred;
    assert_int_equal(getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl), 0);
    assert_int_equal(cred.pid, getpid());

    char buf[BBPROTO_MAX_MSG];
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    int n = recv_within(c, buf, sizeof buf, 1000);
    assert_true(n > 0);
    assert_int_equal(n, (int)strlen("HELLO=1\nINSTANCE=zone-m1-7f3a9c-3\nPROTO=1\n"));
    assert_memory_equal(buf, "HELLO=1\nINSTANCE=zone-m1-7f3a9c-3\nPROTO=1\n", (size_t)n);
    assert_int_equal(bbproto_parse(buf, (size_t)n, f, BBPROTO_MAX_FIELDS), 3);
    assert_int_equal(bbagent_fd(a) >= 0, 1);

    assert_int_equal(bbagent_ready(a), 0);
    expect_kv(c, "READY", "1");

    assert_int_equal(bbagent_status(a, 3, 16, "map=q3dm17"), 0);
    n = recv_within(c, buf, sizeof buf, 1000);
    assert_true(n > 0);
    assert_memory_equal(buf, "PLAYERS=3\nMAX_PLAYERS=16\nSTATUS=map=q3dm17\n", (size_t)n);

    /* The same status again is not sent again; a change is. */
    assert_int_equal(bbagent_status(a, 3, 16, "map=q3dm17"), 0);
    expect_silence(c, 50);
    assert_int_equal(bbagent_status(a, 4, -1, NULL), 0);
    n = recv_within(c, buf, sizeof buf, 1000);
    assert_true(n > 0);
    assert_memory_equal(buf, "PLAYERS=4\nSTATUS=\n", (size_t)n);

    bbagent_close(a, "shutdown");
    expect_kv(c, "BYE", "shutdown");
    assert_int_equal(recv_within(c, buf, sizeof buf, 1000), 0); /* EOF */
    close(c);
    close(lfd);
}

static void abstract_socket(void **state)
{
    char path[64];
    snprintf(path, sizeof path, "@test_bbagent.%d", (int)getpid());
    int lfd = listen_at(path);
    bbagent_t *a = open_at(path, "x1");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "INSTANCE", "x1");
    bbagent_close(a, NULL);
    expect_kv(c, "BYE", "exit");
    close(c);
    close(lfd);
}

static void heartbeat_rate_limit(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "hb");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");

    /* Default HEARTBEAT_MS 250: one packet per 62 ms at most, the first one at once. */
    long calls;
    hammer(a, 500, &calls, NULL);
    int beats = count_heartbeats(c);
    print_message("default: %ld calls, %d heartbeats in 500 ms\n", calls, beats);
    assert_true(calls > 10000);
    assert_in_range(beats, 4, 10);

    /* WELCOME HEARTBEAT_MS=1000: one per 250 ms. */
    bbagent_event_t ev;
    assert_int_equal(send(c, "WELCOME=1\nHEARTBEAT_MS=1000\n", 28, 0), 28);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(bbagent_poll(a, &ev), 0);
        assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
        usleep(1000);
    }
    count_heartbeats(c);
    hammer(a, 600, NULL, NULL);
    beats = count_heartbeats(c);
    print_message("HEARTBEAT_MS=1000: %d heartbeats in 600 ms\n", beats);
    assert_in_range(beats, 1, 3);

    /* WELCOME HEARTBEAT_MS=20: the 50 ms floor holds. */
    assert_int_equal(send(c, "WELCOME=1\nHEARTBEAT_MS=20\n", 26, 0), 26);
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    count_heartbeats(c);
    hammer(a, 500, NULL, NULL);
    beats = count_heartbeats(c);
    print_message("HEARTBEAT_MS=20: %d heartbeats in 500 ms\n", beats);
    assert_in_range(beats, 5, 11);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

static void shutdown_and_drain(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "sd");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    bbagent_event_t ev;

    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);

    /* Garbage and oversized packets are ignored and keep the connection. */
    char big[BBPROTO_MAX_MSG + 100];
    memset(big, 'A', sizeof big);
    big[1] = '=';
    assert_true(send(c, big, sizeof big, 0) > 0);
    assert_true(send(c, "not a message", 13, 0) > 0);
    assert_true(send(c, "SHUTDOWN=yes\n", 13, 0) > 0);
    assert_true(send(c, "DRAIN=1\n", 8, 0) > 0);
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_DRAIN);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    assert_true(bbagent_fd(a) >= 0);

    /* SHUTDOWN with its grace. */
    assert_true(send(c, "SHUTDOWN=1\nGRACE_MS=5000\n", 25, 0) > 0);
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_SHUTDOWN);
    assert_int_equal(ev.grace_ms, 5000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);

    /* Both at once: SHUTDOWN first. Without GRACE_MS the grace is -1. A SHUTDOWN sent
     * right before Big Brother closes the connection is still delivered. */
    assert_true(send(c, "DRAIN=1\n", 8, 0) > 0);
    assert_true(send(c, "SHUTDOWN=1\n", 11, 0) > 0);
    close(c);
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_SHUTDOWN);
    assert_int_equal(ev.grace_ms, -1);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_DRAIN);
    assert_int_equal(bbagent_fd(a), -ENOTCONN); /* the EOF was noticed */
    bbagent_close(a, NULL);
    close(lfd);
}

static void reconnect_without_blocking(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "rc");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    bbagent_ready(a);
    expect_kv(c, "READY", "1");
    bbagent_status(a, 5, 10, "map=dm1");
    expect_kv(c, "PLAYERS", "5");

    /* Big Brother goes away: connection and listening socket gone. No call blocks
     * (a slow call on this shared machine is preemption, not blocking). */
    close(c);
    close(lfd);
    unlink(sock_path);
    long blocks;
    int64_t worst = hammer(a, 700, NULL, &blocks);
    print_message("slowest call while Big Brother is away: %lld us\n", (long long)worst);
    assert_int_equal(blocks, 0);
    assert_int_equal(bbagent_heartbeat(a), -ENOTCONN);
    assert_int_equal(bbagent_fd(a), -ENOTCONN);
    /* Calls made meanwhile are remembered. */
    assert_int_equal(bbagent_status(a, 6, 10, "map=dm2"), 0);

    /* It comes back at the same path: a later call reconnects by itself (within the
     * 500 ms pacing) and says everything again, HELLO first. */
    lfd = listen_at(sock_path);
    int64_t t0 = mono_us();
    worst = 0;
    long total_blocks = 0;
    while ((c = accept_within(lfd, 0)) < 0 && mono_us() - t0 < 2000000) {
        int64_t w = hammer(a, 5, NULL, &blocks);
        worst = w > worst ? w : worst;
        total_blocks += blocks;
    }
    assert_true(c >= 0);
    print_message("reconnected after %lld ms, slowest call %lld us\n",
                  (long long)(mono_us() - t0) / 1000, (long long)worst);
    assert_true(mono_us() - t0 < 1000000);
    assert_int_equal(total_blocks, 0);
    expect_kv(c, "HELLO", "1");
    expect_kv(c, "READY", "1");
    expect_kv(c, "PLAYERS", "6");
    expect_kv(c, "HEARTBEAT", "1");
    assert_true(bbagent_fd(a) >= 0);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

/* Receives one message and checks that it is exactly `want`. */
static void expect_msg(int fd, const char *want)
{
    char buf[BBPROTO_MAX_MSG];
    int n = recv_within(fd, buf, sizeof buf, 1000);
    if (n != (int)strlen(want) || memcmp(buf, want, (size_t)n) != 0)
        fail_msg("got '%.*s' (%d), want '%s'", n > 0 ? n : 0, buf, n, want);
}

static void send_str(int fd, const char *msg)
{
    assert_int_equal(send(fd, msg, strlen(msg), 0), (ssize_t)strlen(msg));
}

/* ALLOCATED is returned once with its fields and acknowledged; DEALLOCATED follows;
 * malformed ones are ignored; the payload may be 1024 bytes, not more; a resent
 * allocation (a reconnect before the acknowledgement arrived) is acknowledged again but
 * not returned twice; the strings stay valid until the next poll. */
static void allocated_and_deallocated(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "al");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    bbagent_event_t ev;

    send_str(c, "ALLOCATED=a000000000001\nMODE=ready\nPLAYERS=8\nPAYLOAD={\"match\":\"m1\"}\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED);
    assert_string_equal(AL(a).allocation, "a000000000001");
    assert_string_equal(AL(a).payload, "{\"match\":\"m1\"}");
    assert_int_equal(AL(a).players, 8);
    assert_int_equal(AL(a).join, 0);
    assert_int_equal(ev.grace_ms, -1);
    expect_msg(c, "ALLOCATION_ACK=a000000000001\n");
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    assert_null(AL(a).allocation);
    assert_null(AL(a).payload);
    assert_int_equal(AL(a).players, -1);

    /* Sent again (Big Brother did not see the acknowledgement yet): acknowledged again,
     * not returned again. */
    send_str(c, "ALLOCATED=a000000000001\nMODE=ready\nPLAYERS=8\nPAYLOAD={}\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    expect_msg(c, "ALLOCATION_ACK=a000000000001\n");

    /* Malformed: no id, a bad id, a bad mode, bad players, and an oversized payload
     * (1025 bytes) are ignored; a join allocation without PAYLOAD / PLAYERS defaults. */
    char big[1200];
    int n = snprintf(big, sizeof big, "ALLOCATED=a2\nPAYLOAD=");
    memset(big + n, 'p', 1025);
    big[n + 1025] = '\n';
    assert_true(send(c, big, (size_t)(n + 1026), 0) > 0);
    send_str(c, "ALLOCATED=\nMODE=ready\n");
    send_str(c, "ALLOCATED=a b\n");
    send_str(c, "ALLOCATED=a3\nMODE=solo\n");
    send_str(c, "ALLOCATED=a4\nPLAYERS=-1\n");
    send_str(c, "DEALLOCATED=a\\b\n");
    send_str(c, "ALLOCATED=a5\nMODE=join\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED);
    assert_string_equal(AL(a).allocation, "a5");
    assert_string_equal(AL(a).payload, "null");
    assert_int_equal(AL(a).players, 0);
    assert_int_equal(AL(a).join, 1);
    expect_msg(c, "ALLOCATION_ACK=a5\n");

    /* Exactly 1024 bytes of payload (the value cap) arrive whole. Two allocation
     * messages in a row: one per poll, each valid until the next poll. */
    n = snprintf(big, sizeof big, "ALLOCATED=a6\nPAYLOAD=\"");
    memset(big + n, 'q', 1022);
    memcpy(big + n + 1022, "\"\n", 2);
    assert_true(send(c, big, (size_t)(n + 1024), 0) > 0);
    send_str(c, "DEALLOCATED=a5\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED);
    assert_string_equal(AL(a).allocation, "a6");
    assert_int_equal(strlen(AL(a).payload), 1024);
    assert_int_equal(AL(a).payload[0], '"');
    expect_msg(c, "ALLOCATION_ACK=a6\n");
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_DEALLOCATED);
    assert_string_equal(AL(a).allocation, "a5");
    assert_null(AL(a).payload);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    expect_silence(c, 50);

    /* SHUTDOWN goes before an allocation read in the same poll. */
    send_str(c, "ALLOCATED=a7\n");
    send_str(c, "SHUTDOWN=1\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED); /* read first: the slot held it */
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_SHUTDOWN);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

/* An acknowledgement and a release that cannot be sent (Big Brother away) are owed and
 * sent after the reconnect, after HELLO / READY / status, acknowledgement first; a
 * release is sent once. bbagent_set_players keeps the status text. */
static void release_and_ack_owed_across_reconnect(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "rl");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    bbagent_status(a, 1, 8, "map=dm1 mode=ctf");
    expect_kv(c, "STATUS", "map=dm1 mode=ctf");
    assert_int_equal(bbagent_set_players(a, 3, 8), 0);
    expect_msg(c, "PLAYERS=3\nMAX_PLAYERS=8\nSTATUS=map=dm1 mode=ctf\n");
    assert_int_equal(bbagent_set_players(a, 3, 8), 0); /* unchanged: nothing sent */
    expect_silence(c, 30);

    send_str(c, "ALLOCATED=a100\nMODE=ready\nPAYLOAD=[1,2]\n");
    close(c);
    close(lfd);
    unlink(sock_path);
    usleep(10000);
    bbagent_event_t ev;
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED); /* read before the EOF */
    assert_string_equal(AL(a).payload, "[1,2]");
    assert_int_equal(bbagent_fd(a), -ENOTCONN);
    assert_int_equal(bbagent_release(a), 0);
    assert_int_equal(bbagent_release(a), 0); /* still one owed release */

    lfd = listen_at(sock_path);
    int64_t t0 = mono_us();
    while ((c = accept_within(lfd, 0)) < 0 && mono_us() - t0 < 2000000) {
        bbagent_heartbeat(a);
        usleep(5000);
    }
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    expect_kv(c, "PLAYERS", "3");
    expect_msg(c, "ALLOCATION_ACK=a100\n");
    expect_msg(c, "RELEASE=1\n");
    expect_kv(c, "HEARTBEAT", "1"); /* the call that reconnected */
    /* Big Brother sends the unacknowledged allocation again on the new connection: it
     * is acknowledged, not returned. */
    send_str(c, "ALLOCATED=a100\nMODE=ready\nPAYLOAD=[1,2]\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    expect_msg(c, "ALLOCATION_ACK=a100\n");
    expect_silence(c, 50);

    /* A release with the link up goes out at once, and a release said just before
     * bbagent_close that found no room is still sent by the close. */
    assert_int_equal(bbagent_release(a), 0);
    expect_msg(c, "RELEASE=1\n");
    assert_int_equal(bbagent_set_players(NULL, 1, 2), -EINVAL);
    assert_int_equal(bbagent_release(NULL), -EINVAL);
    bbagent_close(a, "done");
    expect_msg(c, "BYE=done\n");
    close(c);
    close(lfd);
}

/* Where a blocking socket would wait, the shim does not: connecting to a listener whose
 * backlog is full, and sending to a Big Brother that stopped reading. */
static void never_blocks_when_bigbrother_is_stuck(void **state)
{
    /* Backlog full: fill the listener's queue (never accepted) with other connections. */
    int lfd = listen_at(sock_path);
    assert_int_equal(listen(lfd, 0), 0);
    int fillers[16], nfill = 0;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    strcpy(sa.sun_path, sock_path);
    while (nfill < 16) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            assert_int_equal(errno, EAGAIN);
            close(fd);
            break;
        }
        fillers[nfill++] = fd;
    }
    assert_true(nfill < 16);
    long b0 = blocked_count();
    bbagent_t *a = open_at(sock_path, "stuck");
    long blocks;
    hammer(a, 1100, NULL, &blocks); /* three connection attempts, all refused at once */
    assert_int_equal(blocked_count() - b0, 0);
    assert_int_equal(blocks, 0);
    assert_int_equal(bbagent_fd(a), -ENOTCONN);
    bbagent_close(a, NULL);
    for (int i = 0; i < nfill; i++)
        close(fillers[i]);
    close(lfd);

    /* Big Brother accepted but reads nothing: fill its socket with status changes. */
    lfd = listen_at(sock_path);
    a = open_at(sock_path, "stuck");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    b0 = blocked_count();
    char text[64];
    for (int i = 0; i < 20000; i++) {
        snprintf(text, sizeof text, "change %d", i);
        assert_int_equal(bbagent_status(a, i, 100000, text), 0);
    }
    int r = bbagent_heartbeat(a);
    assert_int_equal(blocked_count() - b0, 0);
    assert_int_equal(r, -EAGAIN); /* full: a blocking send would be waiting now */
    assert_true(bbagent_fd(a) >= 0);  /* and the connection is kept */

    /* Once Big Brother reads again, the latest status (still owed) goes out. */
    char buf[BBPROTO_MAX_MSG];
    while (recv_within(c, buf, sizeof buf, 0) > 0)
        ;
    assert_int_equal(bbagent_heartbeat(a), 0);
    int n, last = -1;
    while ((n = recv_within(c, buf, sizeof buf - 1, 100)) > 0) {
        buf[n] = '\0';
        if (strstr(buf, "STATUS="))
            last = strstr(buf, "STATUS=change 19999\n") != NULL;
    }
    assert_int_equal(last, 1);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

/* A Big Brother that accepts and hangs up at once: the shim sees EPIPE and tries again,
 * but never more often than once per 500 ms however often it is called. */
static void reconnect_is_paced(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "pace");
    int accepted = 0;
    int64_t end = mono_us() + 1300000;
    while (mono_us() < end) {
        int c = accept_within(lfd, 0);
        if (c >= 0) {
            accepted++;
            close(c);
        }
        hammer(a, 2, NULL, NULL);
    }
    print_message("%d connections in 1.3 s\n", accepted);
    assert_in_range(accepted, 2, 3);
    bbagent_close(a, NULL);
    close(lfd);
}

static void no_allocation_per_call(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "alloc");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    bbagent_event_t ev;

    long before = alloc_count;
    bbagent_ready(a);
    for (int i = 0; i < 10000; i++) {
        assert_true(bbagent_heartbeat(a) >= -EAGAIN);
        bbagent_status(a, i % 7, 16, (i & 1) ? "odd" : "even");
        bbagent_set_players(a, i % 5, 16);
        bbagent_poll(a, &ev);
        if (i % 1000 == 0) {
            char buf[BBPROTO_MAX_MSG];
            while (recv_within(c, buf, sizeof buf, 0) > 0)
                ;
            send(c, "SHUTDOWN=1\nGRACE_MS=10\n", 23, MSG_DONTWAIT);
            int n = snprintf(buf, sizeof buf, "ALLOCATED=a%d\nMODE=join\nPAYLOAD={}\n", i);
            send(c, buf, (size_t)n, MSG_DONTWAIT);
            send(c, "DEALLOCATED=a0\n", 15, MSG_DONTWAIT);
            bbagent_release(a);
        }
    }
    /* Through a disconnection and a reconnection too. */
    close(c);
    for (int i = 0; i < 10000; i++) {
        bbagent_heartbeat(a);
        bbagent_poll(a, &ev);
    }
    long during = alloc_count - before;
    c = accept_within(lfd, 1000);
    print_message("allocations during 20000 rounds of calls: %ld\n", during);
    assert_int_equal(during, 0);

    /* The counter does count (the hook is live): bbagent_open allocates once. */
    before = alloc_count;
    bbagent_t *b = open_at("", NULL);
    assert_true(alloc_count - before >= 1);
    bbagent_close(b, NULL);
    bbagent_close(a, NULL);
    if (c >= 0)
        close(c);
    close(lfd);
}

/* libbbagent.so is built with hidden visibility: the API is there, the protocol code it
 * carries inside (bbproto_*) is not, so it cannot clash with a game's own symbols. */
/* Named ports go out with the status (PORTS=name:port ...), once per change; bad names
 * and ports are refused, and at most 8 names are kept. */
static void ports_sent_with_status(void **state)
{
    (void)state;
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "pt");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    assert_int_equal(bbagent_port(a, "game", 27960), 0);
    expect_msg(c, "STATUS=\nPORTS=game:27960\n");
    assert_int_equal(bbagent_port(a, "game", 27960), 0); /* unchanged: nothing sent */
    expect_silence(c, 50);
    assert_int_equal(bbagent_port(a, "query", 27961), 0);
    expect_msg(c, "STATUS=\nPORTS=game:27960 query:27961\n");
    assert_int_equal(bbagent_status(a, 2, 16, "map=q3dm17"), 0);
    expect_msg(c, "PLAYERS=2\nMAX_PLAYERS=16\nSTATUS=map=q3dm17\nPORTS=game:27960 query:27961\n");
    static const char *const bad_names[] = {"", "has space", "-x", ".x", "a:b", "a..b",
                                            "012345678901234567890123456789012"};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++)
        assert_int_equal(bbagent_port(a, bad_names[i], 1), -EINVAL);
    assert_int_equal(bbagent_port(a, "game", 0), -EINVAL);
    assert_int_equal(bbagent_port(a, "game", 65536), -EINVAL);
    assert_int_equal(bbagent_port(a, NULL, 1), -EINVAL);
    assert_int_equal(bbagent_port(NULL, "game", 1), -EINVAL);
    char name[8];
    for (int i = 2; i < 8; i++) {
        snprintf(name, sizeof name, "p%d", i);
        assert_int_equal(bbagent_port(a, name, 30000 + i), 0);
    }
    assert_int_equal(bbagent_port(a, "ninth", 1), -ENOSPC);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

/* The shim checks names with the rule serverdir and bigbrother use (sd_name_valid,
 * common/sdname.h): bbagent_open refuses an instance id the directory refuses, and an
 * ALLOCATED or DEALLOCATED carrying an id the directory refuses is ignored, while the
 * names it accepts go through. */
static void names_checked_as_the_directory_does(void **state)
{
    char longest[SD_NAME_MAX + 1], over[SD_NAME_MAX + 2];
    memset(longest, 'n', SD_NAME_MAX);
    longest[SD_NAME_MAX] = '\0';
    memset(over, 'n', SD_NAME_MAX + 1);
    over[SD_NAME_MAX + 1] = '\0';
    enum { NVALID = 4 };
    const char *const names[] = { "zone-m1-7f3a9c-3", "a.b:c@D_9-f", longest, "x",
                                  over, ".hidden", "-flag", "a..b", "a b", "a/b",
                                  "{tag}b", "a=b", "a\\b", "caf\xc3\xa9", "a#b" };
    const size_t count = sizeof names / sizeof names[0];

    for (size_t i = 0; i < count; i++) {
        int valid = sd_name_valid(names[i], SD_NAME_MAX);
        assert_int_equal(valid, i < NVALID); /* the directory's verdict */
        bbagent_opts_t o = { .socket_path = "", .instance = names[i] };
        errno = 0;
        bbagent_t *a = bbagent_open(&o);
        if (valid) {
            assert_non_null(a);
            bbagent_close(a, NULL);
        } else {
            if (a)
                fail_msg("instance '%s' accepted", names[i]);
            assert_int_equal(errno, EINVAL);
        }
    }

    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "names");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    bbagent_event_t ev;
    char msg[SD_NAME_MAX + 64];
    for (size_t i = 0; i < count; i++) {
        snprintf(msg, sizeof msg, "ALLOCATED=%s\nMODE=ready\n", names[i]);
        send_str(c, msg);
        usleep(10000);
        assert_int_equal(bbagent_poll(a, &ev), 0);
        if (i >= NVALID) {
            if (ev.type != BBAGENT_EVENT_NONE)
                fail_msg("allocation id '%s' accepted", names[i]);
            snprintf(msg, sizeof msg, "DEALLOCATED=%s\n", names[i]);
            send_str(c, msg);
            usleep(10000);
            assert_int_equal(bbagent_poll(a, &ev), 0);
            if (ev.type != BBAGENT_EVENT_NONE)
                fail_msg("deallocation id '%s' accepted", names[i]);
            continue;
        }
        assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED);
        assert_string_equal(AL(a).allocation, names[i]);
        snprintf(msg, sizeof msg, "ALLOCATION_ACK=%s\n", names[i]);
        expect_msg(c, msg);
        snprintf(msg, sizeof msg, "DEALLOCATED=%s\n", names[i]);
        send_str(c, msg);
        usleep(10000);
        assert_int_equal(bbagent_poll(a, &ev), 0);
        assert_int_equal(ev.type, BBAGENT_EVENT_DEALLOCATED);
        assert_string_equal(AL(a).allocation, names[i]);
    }
    expect_silence(c, 50);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

/* A CREDENTIAL frame of length n (a JWT of three base64url parts) into buf. */
static size_t cred_frame(char *buf, size_t n, char fill)
{
    memcpy(buf, "CREDENTIAL=", 11);
    memset(buf + 11, fill, n);
    buf[11 + 1] = '.';
    buf[11 + n - 2] = '.';
    buf[11 + n] = '\n';
    return 11 + n + 1;
}

/* CREDENTIAL frames: none before the first one (0), the newest one kept and copied
 * NUL-terminated, -1 for a buffer too small; the longest JWT (4096 bytes, a packet above
 * the 4096-byte message cap) is taken; malformed ones (a byte outside base64url, not three
 * parts, 4097 bytes, other fields beside it) are ignored and keep the one held; other
 * messages go on being read around them. No allocation for any of it. */
static void credential_frames(void **state)
{
    int lfd = listen_at(sock_path);
    bbagent_t *a = open_at(sock_path, "cr");
    int c = accept_within(lfd, 1000);
    assert_true(c >= 0);
    expect_kv(c, "HELLO", "1");
    char out[BBPROTO_CREDENTIAL_MAX + 1];
    bbagent_event_t ev;
    assert_int_equal(bbagent_credential(a, out, sizeof out), 0);
    assert_int_equal(bbagent_credential(NULL, out, sizeof out), -1);

    send_str(c, "CREDENTIAL=eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJjMS9pMSJ9.c2ln\n");
    usleep(10000);
    long before = alloc_count;
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    const char *jwt1 = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJjMS9pMSJ9.c2ln";
    assert_int_equal(bbagent_credential(a, out, sizeof out), (int)strlen(jwt1));
    assert_string_equal(out, jwt1);
    assert_int_equal(bbagent_credential(a, out, strlen(jwt1)), -1); /* no room for the NUL */
    assert_int_equal(bbagent_credential(a, out, strlen(jwt1) + 1), (int)strlen(jwt1));

    /* Malformed frames are ignored; the credential held stays. */
    static char big[BBPROTO_MAX_FRAME + 16];
    send_str(c, "CREDENTIAL=a.b.c d\n");
    send_str(c, "CREDENTIAL=a.b\n");
    send_str(c, "CREDENTIAL=a..c\n");
    send_str(c, "CREDENTIAL=a.b.c/\n");
    send_str(c, "CREDENTIAL=\n");
    send_str(c, "CREDENTIAL=a.b.c\nDRAIN=1\n");
    size_t n = cred_frame(big, BBPROTO_CREDENTIAL_MAX + 1, 'x');
    assert_true(send(c, big, n, 0) == (ssize_t)n);
    n = cred_frame(big, 200, 'y');
    big[20] = '\x01';
    assert_true(send(c, big, n, 0) == (ssize_t)n);
    send_str(c, "DRAIN=1\n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(ev.type, BBAGENT_EVENT_DRAIN); /* the messages after them were read */
    assert_int_equal(bbagent_credential(a, out, sizeof out), (int)strlen(jwt1));
    assert_string_equal(out, jwt1);

    /* The longest one, then a renewal: the newest wins. */
    n = cred_frame(big, BBPROTO_CREDENTIAL_MAX, 'z');
    assert_int_equal(n, BBPROTO_MAX_FRAME);
    assert_true(send(c, big, n, 0) == (ssize_t)n);
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(bbagent_credential(a, out, sizeof out), BBPROTO_CREDENTIAL_MAX);
    assert_int_equal(memcmp(out, big + 11, BBPROTO_CREDENTIAL_MAX), 0);
    assert_int_equal(out[BBPROTO_CREDENTIAL_MAX], '\0');
    assert_int_equal(bbagent_credential(a, out, BBPROTO_CREDENTIAL_MAX), -1);
    send_str(c, "CREDENTIAL=r.e.n");
    usleep(10000);
    assert_int_equal(bbagent_poll(a, &ev), 0);
    assert_int_equal(bbagent_credential(a, out, sizeof out), 5);
    assert_string_equal(out, "r.e.n");
    assert_int_equal(alloc_count, before);

    /* The frame as bigbrother builds it parses back to the same JWT. */
    char frame[BBPROTO_MAX_FRAME];
    int fl = bbproto_credential_put(frame, sizeof frame, jwt1, strlen(jwt1));
    assert_int_equal(fl, 11 + (int)strlen(jwt1) + 1);
    const char *j;
    size_t jl;
    assert_int_equal(bbproto_credential_parse(frame, (size_t)fl, &j, &jl), 0);
    assert_int_equal(jl, strlen(jwt1));
    assert_int_equal(memcmp(j, jwt1, jl), 0);
    assert_int_equal(bbproto_credential_put(frame, sizeof frame, "a.b", 3), -EINVAL);
    assert_int_equal(bbproto_credential_put(frame, 10, jwt1, strlen(jwt1)), -E2BIG);
    assert_int_equal(bbproto_credential_parse("DRAIN=1\n", 8, &j, &jl), -ENOENT);
    bbagent_close(a, NULL);
    close(c);
    close(lfd);
}

static void shared_library_exports_only_the_api(void **state)
{
    void *so = dlopen(SD_BIN_DIR "/../lib/libbbagent.so", RTLD_NOW | RTLD_LOCAL);
    if (!so)
        fail_msg("dlopen: %s", dlerror());
    static const char *const api[] = { "bbagent_open", "bbagent_ready", "bbagent_heartbeat",
                                       "bbagent_status", "bbagent_fd", "bbagent_poll",
                                       "bbagent_close", "bbagent_set_players",
                                       "bbagent_release", "bbagent_allocation",
                                       "bbagent_port", "bbagent_credential" };
    for (size_t i = 0; i < sizeof api / sizeof api[0]; i++)
        if (!dlsym(so, api[i]))
            fail_msg("%s is not exported", api[i]);
    static const char *const internal[] = { "bbproto_parse", "bbproto_get", "bbproto_get_int",
                                            "bbproto_put", "link_send", "link_connect" };
    for (size_t i = 0; i < sizeof internal / sizeof internal[0]; i++)
        if (dlsym(so, internal[i]))
            fail_msg("%s is exported", internal[i]);
    dlclose(so);
}

int main(void)
{
    alloc_hook_install();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(no_bigbrother_is_a_noop, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(hello_ready_status_bye, setup, teardown),
        cmocka_unit_test_setup_teardown(abstract_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(heartbeat_rate_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(shutdown_and_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(reconnect_without_blocking, setup, teardown),
        cmocka_unit_test_setup_teardown(allocated_and_deallocated, setup, teardown),
        cmocka_unit_test_setup_teardown(release_and_ack_owed_across_reconnect, setup, teardown),
        cmocka_unit_test_setup_teardown(never_blocks_when_bigbrother_is_stuck, setup, teardown),
        cmocka_unit_test_setup_teardown(reconnect_is_paced, setup, teardown),
        cmocka_unit_test_setup_teardown(no_allocation_per_call, setup, teardown),
        cmocka_unit_test_setup_teardown(ports_sent_with_status, setup, teardown),
        cmocka_unit_test_setup_teardown(names_checked_as_the_directory_does, setup, teardown),
        cmocka_unit_test_setup_teardown(credential_frames, setup, teardown),
        cmocka_unit_test(shared_library_exports_only_the_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
