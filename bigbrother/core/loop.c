/* The supervision loop: ONE thread, one epoll set over the signalfd, the timerfd, the
 * pidfds, the agent / notify / control sockets and probe fds. Deadlines live in one
 * min-heap; the timerfd is armed for the earliest. Read top to bottom:
 *
 *   for (;;) { before-sleep hooks (main registers: publish metrics, persist the table);
 *              arm timerfd; epoll_wait; run fd handlers; run expired timers; }
 *
 * The loop knows none of its users by name: they come in as watches, timers and hooks.
 * Nothing here sleeps or blocks on the network. */
#include "core/bb.h"
#include "sdlog.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define MAX_EVENTS 64
#define MAX_HOOKS 8

static int epfd = -1;
static bb_watch_t sigw = {-1, NULL}, timerw = {-1, NULL};
static bb_timer_t **heap;
static int heap_len, heap_cap;
static int quit_sig;
static int64_t timerfd_armed = -1; /* the deadline the timerfd holds, -1: none or fired */
static void (*before_sleep[MAX_HOOKS])(void);
static int nbefore_sleep;
static void **deferred;
static int ndeferred, capdeferred;

void bb_defer_free(void *p)
{
    if (ndeferred == capdeferred) {
        int cap = capdeferred ? capdeferred * 2 : 64;
        void **d = realloc(deferred, (size_t)cap * sizeof(*d));
        if (!d)
            sd_die(SD_EXIT_SYSTEM, "out of memory", "what=%s", "deferred free");
        deferred = d;
        capdeferred = cap;
    }
    deferred[ndeferred++] = p;
}

int bb_watch_add(bb_watch_t *w, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = w};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, w->fd, &ev) ? -errno : 0;
}

int bb_watch_mod(bb_watch_t *w, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = w};
    return epoll_ctl(epfd, EPOLL_CTL_MOD, w->fd, &ev) ? -errno : 0;
}

void bb_watch_close(bb_watch_t *w)
{
    if (w->fd < 0)
        return;
    epoll_ctl(epfd, EPOLL_CTL_DEL, w->fd, NULL);
    close(w->fd);
    w->fd = -1;
}

/* ---- the timer heap: heap[i]->idx == i + 1 for every armed timer */

static void heap_swap(int a, int b)
{
    bb_timer_t *t = heap[a];
    heap[a] = heap[b];
    heap[b] = t;
    heap[a]->idx = a + 1;
    heap[b]->idx = b + 1;
}

static void heap_up(int i)
{
    while (i > 0 && heap[(i - 1) / 2]->at > heap[i]->at) {
        heap_swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_len && heap[l]->at < heap[m]->at)
            m = l;
        if (r < heap_len && heap[r]->at < heap[m]->at)
            m = r;
        if (m == i)
            return;
        heap_swap(i, m);
        i = m;
    }
}

void bb_loop_free_deferred(void)
{
    while (ndeferred)
        free(deferred[--ndeferred]);
}

void bb_timer_cancel(bb_timer_t *t)
{
    if (!t->idx)
        return;
    int i = t->idx - 1;
    t->idx = 0;
    heap_len--;
    if (i == heap_len)
        return;
    heap[i] = heap[heap_len];
    heap[i]->idx = i + 1;
    heap_up(i);
    heap_down(heap[i]->idx - 1);
}

void bb_timer_set(bb_timer_t *t, int64_t at_ms)
{
    if (t->idx) {
        int i = t->idx - 1;
        t->at = at_ms;
        heap_up(i);
        heap_down(t->idx - 1);
        return;
    }
    if (heap_len == heap_cap) {
        int cap = heap_cap ? heap_cap * 2 : 256;
        bb_timer_t **h = realloc(heap, (size_t)cap * sizeof(*h));
        if (!h)
            sd_die(SD_EXIT_SYSTEM, "out of memory", "what=%s", "timer heap");
        heap = h;
        heap_cap = cap;
    }
    t->at = at_ms;
    heap[heap_len] = t;
    t->idx = ++heap_len;
    heap_up(heap_len - 1);
}

/* ---- signals */

static void on_signal(bb_watch_t *w, uint32_t events)
{
    struct signalfd_siginfo si;
    while (read(w->fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        log_info("signal received", "signal=%d pid=%u", (int)si.ssi_signo, si.ssi_pid);
        quit_sig = (int)si.ssi_signo;
    }
}

static void on_timerfd(bb_watch_t *w, uint32_t events)
{
    uint64_t n;
    while (read(w->fd, &n, sizeof(n)) == (ssize_t)sizeof(n))
        ;
    timerfd_armed = -1; /* expired: a new deadline equal to the old one must re-arm it */
}

void bb_loop_quit(int sig)
{
    quit_sig = sig;
}

int bb_loop_init(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, NULL))
        return -errno;
    /* A control client that hangs up mid-answer must not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    sigw.fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    timerw.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (epfd < 0 || sigw.fd < 0 || timerw.fd < 0)
        return -errno;
    sigw.fn = on_signal;
    timerw.fn = on_timerfd;
    int rc = bb_watch_add(&sigw, EPOLLIN);
    if (!rc)
        rc = bb_watch_add(&timerw, EPOLLIN);
    return rc;
}

int bb_loop_before_sleep(void (*fn)(void))
{
    if (nbefore_sleep == MAX_HOOKS)
        return -ENOSPC;
    before_sleep[nbefore_sleep++] = fn;
    return 0;
}

/* Arms the timerfd for the earliest deadline (absolute CLOCK_MONOTONIC), with a system
 * call only when that deadline changed (heartbeats move later deadlines, rarely the
 * earliest). */
static void arm_timerfd(void)
{
    int64_t at = heap_len ? (heap[0]->at < 1 ? 1 : heap[0]->at) : 0;
    if (at == timerfd_armed)
        return;
    struct itimerspec its = {0};
    its.it_value.tv_sec = at / 1000;
    its.it_value.tv_nsec = (at % 1000) * 1000000;
    timerfd_settime(timerw.fd, TFD_TIMER_ABSTIME, &its, NULL);
    timerfd_armed = at;
}

static void run_timers(void)
{
    int64_t now = sd_mono_ms();
    while (heap_len && heap[0]->at <= now) {
        bb_timer_t *t = heap[0];
        bb_timer_cancel(t);
        t->fn(t);
    }
}

int bb_loop_run(void)
{
    struct epoll_event evs[MAX_EVENTS];
    while (!quit_sig) {
        for (int i = 0; i < nbefore_sleep; i++)
            before_sleep[i]();
        arm_timerfd();
        int n = epoll_wait(epfd, evs, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            sd_die(SD_EXIT_SYSTEM, "epoll_wait failed", "error=%s", strerror(errno));
        }
        for (int i = 0; i < n; i++) {
            bb_watch_t *w = evs[i].data.ptr;
            if (w->fd >= 0)
                w->fn(w, evs[i].events);
        }
        bb_loop_free_deferred();
        run_timers();
    }
    return quit_sig;
}
