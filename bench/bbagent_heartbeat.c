/* bench_bbagent_heartbeat: what one bbagent_heartbeat() call costs the game loop.
 *
 * Calls are timed in batches (clock_gettime around a batch of calls, so the timer's own cost
 * is spread over the batch) for a fixed time per case; the figures are the median, p99
 * and worst of the per-call average over all batches, for:
 *   (a) no Big Brother: no BB_SOCKET (the shim is off), and BB_SOCKET set with nobody
 *       listening (the shim retries the connection every 500 ms from inside the calls);
 *   (b) connected to a SOCK_SEQPACKET listener this program creates, with the rate limit
 *       in place (one packet per 66 ms; the listener is drained between batches, outside
 *       the timed part);
 *   (c) connected, one call per 20 Hz game tick for 2.5x the time (about 100 calls with
 *       the defaults), each call timed alone: the cost a real game loop sees (caches
 *       cold after 50 ms of sleep), where about every other call sends a packet; calls
 *       with and without a packet are reported apart.
 * Anchors, measured in the same run: a naive shim that send()s a heartbeat packet on every
 * call (batches of 50, drained in between so no send finds the socket full), and the
 * trivial bbagent_fd() timed alone once per 20 Hz tick (the floor of case (c): what
 * calling into cold library code costs at all on this machine). Each median is printed
 * with its ratio to the 1 us target.
 *
 * usage: bench_bbagent_heartbeat [seconds_per_case] [calls_per_batch]   (default 2 1000) */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bbagent.h"

#define TARGET_NS 1000.0

static double seconds = 2.0;
static int per_batch = 1000;
static int drain_fd = -1;
static long drained; /* packets the listener side received */

#define MAX_BATCHES 4000000

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Reads everything the listener side received, so the shim's socket never fills. */
static void drain(void)
{
    char buf[4096];
    if (drain_fd < 0)
        return;
    while (recv(drain_fd, buf, sizeof buf, MSG_DONTWAIT) > 0)
        drained++;
}

typedef void (*call_fn)(void *arg);

static void call_heartbeat(void *arg)
{
    bbagent_heartbeat(arg);
}

static void call_send(void *arg)
{
    send(*(int *)arg, "HEARTBEAT=1\n", 12, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void print_line(const char *label, double *v, size_t n, const char *extra)
{
    qsort(v, n, sizeof *v, cmp_double);
    double med = v[n / 2];
    double p99 = v[(size_t)((double)(n - 1) * 0.99)];
    printf("%-38s %10.1f %10.1f %10.1f %11.4f  %s\n", label, med, p99, v[n - 1],
           med / TARGET_NS, extra);
}

/* Runs batches of `batch` calls for `secs` seconds and prints one result line. */
static void run(const char *label, call_fn fn, void *arg, int batch, double secs)
{
    double *per_call = malloc(sizeof *per_call * MAX_BATCHES);
    if (!per_call) {
        perror("malloc");
        exit(1);
    }
    drain();
    long before = drained;
    size_t n = 0;
    int64_t end = now_ns() + (int64_t)(secs * 1e9);
    int64_t t1 = 0;
    while (n < MAX_BATCHES && t1 < end) {
        int64_t t0 = now_ns();
        for (int i = 0; i < batch; i++)
            fn(arg);
        t1 = now_ns();
        per_call[n++] = (double)(t1 - t0) / batch;
        drain();
    }
    char extra[96];
    snprintf(extra, sizeof extra, "%zu batches, %ld packets received", n, drained - before);
    print_line(label, per_call, n, extra);
    free(per_call);
}

/* One call per game tick at 20 Hz for secs seconds, each call timed alone; the calls
 * that sent a packet and those that did not are reported apart. With `trivial` set it
 * times bbagent_fd() instead, a two-line function in the same library: the anchor for
 * what the first call into cold library code costs after 50 ms of sleep. */
static void run_ticks(const char *label, bbagent_t *a, int trivial, double secs)
{
    size_t max = (size_t)(secs * 20) + 1, n = 0, ns = 0, nq = 0;
    double *sent = malloc(sizeof *sent * max), *quiet = malloc(sizeof *quiet * max);
    if (!sent || !quiet) {
        perror("malloc");
        exit(1);
    }
    drain();
    struct timespec tick = { 0, 50000000 };
    for (; n < max; n++) {
        long before = drained;
        int64_t t0 = now_ns();
        if (trivial)
            bbagent_fd(a);
        else
            bbagent_heartbeat(a);
        double t = (double)(now_ns() - t0);
        drain();
        if (drained > before)
            sent[ns++] = t;
        else
            quiet[nq++] = t;
        nanosleep(&tick, NULL);
    }
    char l[64], extra[96];
    if (nq) {
        snprintf(l, sizeof l, "%s%s", label, trivial ? "" : ", no packet");
        snprintf(extra, sizeof extra, "%zu calls", nq);
        print_line(l, quiet, nq, extra);
    }
    if (ns) {
        snprintf(l, sizeof l, "%s, packet sent", label);
        snprintf(extra, sizeof extra, "%zu calls", ns);
        print_line(l, sent, ns, extra);
    }
    free(sent);
    free(quiet);
}

static int listen_at(const char *path)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4) < 0) {
        perror("listen");
        exit(1);
    }
    return fd;
}

static int accept_one(int lfd)
{
    struct pollfd p = { .fd = lfd, .events = POLLIN };
    if (poll(&p, 1, 2000) != 1) {
        fprintf(stderr, "the shim did not connect\n");
        exit(1);
    }
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        seconds = atof(argv[1]);
    if (argc > 2)
        per_batch = atoi(argv[2]);
    if (!(seconds >= 0.1 && seconds <= 600) || per_batch < 1) {
        fprintf(stderr, "usage: %s [seconds_per_case 0.1..600] [calls_per_batch >= 1]\n",
                argv[0]);
        return 2;
    }
    char path[108];
    snprintf(path, sizeof path, "/tmp/bench_bbagent.%d.sock", (int)getpid());

    printf("bbagent_heartbeat: %.1f s per case, ns per call: (a), (b) and the send() "
           "anchor as the per-call average of a batch of %d (50 for send()), (c) and the "
           "bbagent_fd() anchor as single calls\n", seconds, per_batch);
    printf("%-38s %10s %10s %10s %11s\n", "case", "median", "p99", "max", "median/1us");

    /* (a) no Big Brother. */
    bbagent_opts_t off = { .socket_path = "" };
    bbagent_t *a = bbagent_open(&off);
    run("(a) no BB_SOCKET", call_heartbeat, a, per_batch, seconds);
    bbagent_close(a, NULL);

    unlink(path);
    bbagent_opts_t on = { .socket_path = path, .instance = "bench" };
    a = bbagent_open(&on);
    run("(a) BB_SOCKET set, nobody listening", call_heartbeat, a, per_batch, seconds);
    bbagent_close(a, NULL);

    /* (b) and (c): connected, rate-limited. */
    int lfd = listen_at(path);
    a = bbagent_open(&on);
    drain_fd = accept_one(lfd);
    bbagent_ready(a);
    run("(b) connected, rate-limited", call_heartbeat, a, per_batch, seconds);
    run_ticks("(c) 1 call per 20 Hz tick", a, 0, seconds * 2.5);
    run_ticks("anchor: bbagent_fd() per 20 Hz tick", a, 1, seconds * 2.5);
    bbagent_close(a, NULL);
    close(drain_fd);
    close(lfd);
    unlink(path);

    /* Anchor: a send() per call, what the rate limit saves. */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        perror("socketpair");
        return 1;
    }
    drain_fd = sv[1];
    run("anchor: send() on every call", call_send, &sv[0], 50, seconds / 4);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
