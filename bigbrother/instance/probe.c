/* Health probes for programs without the shim: tcp connect, udp query / expected reply
 * prefix (a game's status query such as Quake III getstatus or Valve A2S_INFO), http GET
 * (a status 200-399 within the timeout), and a command run with a timeout. All
 * non-blocking inside the loop: a probe is an fd in the epoll set (socket or pidfd) plus
 * the instance's probe timer, which is the probe's timeout while one runs and the next
 * probe time otherwise.
 *
 * While starting, the first success makes the instance ready (the start deadline covers
 * the failures); once ready, failure_threshold consecutive failures are a hang. */
#include "instance/bb_instance.h"
#include "sdlog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FIRST_PROBE_MS 50

extern char **environ;

static int probing(const bb_inst_t *in)
{
    enum bb_health t = in->svc->health.type;
    return t == BB_H_TCP || t == BB_H_UDP || t == BB_H_HTTP || t == BB_H_EXEC;
}

/* An exec probe given up while running: killed, and reaped when its pidfd says so. The
 * ones not reaped yet are listed, so that bigbrother's exit frees them (bb_probe_free). */
typedef struct reaper {
    bb_watch_t w;
    struct reaper *prev, *next;
} reaper_t;

static reaper_t *reapers;

static void reaper_unlink(reaper_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        reapers = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

static void on_reap(bb_watch_t *w, uint32_t events)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (bb_pidfd_wait(w->fd, &si) == 0 && si.si_pid == 0)
        return;
    bb_pidfd_close(w);
    reaper_t *r = container_of(w, reaper_t, w);
    reaper_unlink(r);
    bb_defer_free(r);
}

void bb_probe_free(void)
{
    while (reapers) {
        reaper_t *r = reapers;
        reaper_unlink(r);
        bb_pidfd_close(&r->w);
        free(r);
    }
}

/* Ends the running probe (if any): closes its fd; an exec probe still running is killed
 * and handed to a reaper. */
static void probe_end(bb_inst_t *in)
{
    if (!in->probe_busy)
        return;
    in->probe_busy = 0;
    if (in->svc->health.type == BB_H_EXEC && in->probe_pid > 0) {
        kill(-in->probe_pid, SIGKILL);
        reaper_t *r = calloc(1, sizeof(*r));
        if (r) {
            r->w.fd = in->probew.fd;
            r->w.fn = on_reap;
            if (bb_watch_mod(&r->w, EPOLLIN) == 0) {
                in->probew.fd = -1;
                in->probe_pid = 0;
                r->next = reapers;
                if (reapers)
                    reapers->prev = r;
                reapers = r;
                return;
            }
            free(r);
        }
        waitpid(in->probe_pid, NULL, 0); /* SIGKILLed: returns at once */
        in->probe_pid = 0;
    }
    bb_pidfd_close(&in->probew);
}

static void schedule_next(bb_inst_t *in)
{
    int64_t next = in->probe_started_mono + in->svc->health.period_ms, now = sd_mono_ms();
    bb_timer_set(&in->probe_timer, next > now ? next : now);
}

static void probe_result(bb_inst_t *in, int ok, const char *why)
{
    probe_end(in);
    schedule_next(in);
    if (ok) {
        in->probe_failures = 0;
        in->probe_ok_mono = sd_mono_ms();
        bb_inst_event(in, in->state == ST_STARTING ? EV_READY : EV_ALIVE);
        return;
    }
    if (in->state != ST_READY)
        return;
    in->probe_failures++;
    in->probe_failures_total++;
    sd_strlcpy(in->probe_error, why, sizeof in->probe_error);
    log_warn("probe failed", "instance=%s failures=%d threshold=%d why=%s", in->id,
             in->probe_failures, in->svc->health.failure_threshold, why);
    if (in->probe_failures >= in->svc->health.failure_threshold)
        bb_inst_event(in, EV_DEADLINE);
}

/* The outcome of a non-blocking connect once the socket is writable: 0 or an errno. */
static int connect_error(int fd)
{
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    return err;
}

/* http: connected -> write the request; then read until the status line's code is in.
 * Only "HTTP/1.x NNN" is looked at; the rest of the reply is not read. */
static void http_step(bb_inst_t *in, bb_watch_t *w)
{
    const bb_service_t *s = in->svc;
    if (!in->probe_sent) {
        int err = connect_error(w->fd);
        if (err) {
            probe_result(in, 0, strerror(err));
            return;
        }
        ssize_t n = send(w->fd, s->health.query, s->health.query_len,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n != (ssize_t)s->health.query_len) {
            probe_result(in, 0, n < 0 ? strerror(errno) : "short write of the request");
            return;
        }
        in->probe_sent = 1;
        if (bb_watch_mod(w, EPOLLIN))
            probe_result(in, 0, strerror(errno));
        return;
    }
    const int need = 12; /* "HTTP/1.1 200" */
    ssize_t n = recv(w->fd, in->probe_head + in->probe_head_len,
                     (size_t)(need - in->probe_head_len), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n < 0) {
        probe_result(in, 0, strerror(errno));
        return;
    }
    if (n == 0) {
        probe_result(in, 0, "connection closed before the status line");
        return;
    }
    in->probe_head_len += (int)n;
    if (in->probe_head_len < need)
        return;
    const char *h = in->probe_head;
    if (memcmp(h, "HTTP/1.", 7) || (h[7] != '0' && h[7] != '1') || h[8] != ' ' ||
        h[9] < '1' || h[9] > '5' || h[10] < '0' || h[10] > '9' || h[11] < '0' || h[11] > '9') {
        probe_result(in, 0, "reply is not an HTTP/1.x status line");
        return;
    }
    int code = (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
    char why[32];
    snprintf(why, sizeof(why), "status %d", code);
    probe_result(in, code >= 200 && code < 400, why);
}

static void on_probe_fd(bb_watch_t *w, uint32_t events)
{
    bb_inst_t *in = container_of(w, bb_inst_t, probew);
    const bb_service_t *s = in->svc;
    if (s->health.type == BB_H_HTTP) {
        http_step(in, w);
    } else if (s->health.type == BB_H_TCP) {
        int err = connect_error(w->fd);
        probe_result(in, err == 0, err ? strerror(err) : "");
    } else if (s->health.type == BB_H_UDP) {
        unsigned char buf[2048];
        ssize_t n = recv(w->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0)
            probe_result(in, 0, strerror(errno));
        else if ((size_t)n < s->health.expect_len ||
                 memcmp(buf, s->health.expect, s->health.expect_len))
            probe_result(in, 0, "reply does not start with the expected bytes");
        else
            probe_result(in, 1, "");
    } else {
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (bb_pidfd_wait(w->fd, &si) || si.si_pid == 0)
            return;
        in->probe_pid = 0;
        int ok = si.si_code == CLD_EXITED && si.si_status == 0;
        probe_result(in, ok, ok ? "" : "command failed");
    }
}

static int start_socket_probe(bb_inst_t *in)
{
    const bb_service_t *s = in->svc;
    int udp = s->health.type == BB_H_UDP;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->health.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, (udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    in->probew.fd = fd;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) && errno != EINPROGRESS)
        return -errno;
    if (udp && send(fd, s->health.query, s->health.query_len, MSG_DONTWAIT) < 0)
        return -errno;
    return bb_watch_add(&in->probew, udp ? EPOLLIN : EPOLLOUT);
}

static int start_exec_probe(bb_inst_t *in)
{
    char *argv[] = {"/bin/sh", "-c", (char *)in->svc->health.command, NULL};
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        setpgid(0, 0);
        int nul = open("/dev/null", O_RDWR);
        if (nul < 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || dup2(nul, 2) < 0)
            _exit(127);
        syscall(SYS_close_range, 3, ~0U, 0);
        execve(argv[0], argv, environ);
        _exit(127);
    }
    setpgid(pid, pid);
    in->probe_pid = pid;
    int fd = bb_pidfd_open(pid);
    in->probew.fd = fd < 0 ? -1 : fd;
    if (fd < 0)
        return fd;
    return bb_watch_add(&in->probew, EPOLLIN);
}

static void on_probe_timer(bb_timer_t *t)
{
    bb_inst_t *in = container_of(t, bb_inst_t, probe_timer);
    if (in->probe_busy) {
        probe_result(in, 0, "timeout");
        return;
    }
    in->probe_busy = 1;
    in->probe_sent = in->probe_head_len = 0;
    in->probe_started_mono = sd_mono_ms();
    in->probew.fn = on_probe_fd;
    int rc = in->svc->health.type == BB_H_EXEC ? start_exec_probe(in) : start_socket_probe(in);
    if (rc) {
        probe_result(in, 0, strerror(-rc));
        return;
    }
    bb_timer_set(&in->probe_timer, in->probe_started_mono + in->svc->health.timeout_ms);
}

void bb_probe_start(bb_inst_t *in)
{
    if (!probing(in))
        return;
    bb_probe_stop(in);
    in->probe_failures = in->probe_failures_total = 0;
    in->probe_error[0] = '\0';
    in->probe_ok_mono = sd_mono_ms();
    in->probe_timer.fn = on_probe_timer;
    bb_timer_set(&in->probe_timer, sd_mono_ms() + FIRST_PROBE_MS);
}

void bb_probe_stop(bb_inst_t *in)
{
    bb_timer_cancel(&in->probe_timer);
    probe_end(in);
}
