/* The NOTIFY_SOCKET: systemd's sd_notify datagram protocol, so a program that already
 * speaks it (READY=1, WATCHDOG=1, STATUS=, STOPPING=1) is supervised unmodified. The
 * sender is identified by the SCM_CREDENTIALS pid the kernel attaches (SO_PASSCRED),
 * which must be an instance's process or in its process group; anything else is dropped. */
#include "agent/bb_agent.h"
#include "bbproto.h"
#include "sdlog.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define DGRAMS_PER_WAKEUP 64
#define MAX_PASSED_FDS 16

static bb_watch_t notify_w = {-1, NULL};
static bb_ratelimit_t drop_log;

/* Dropped datagrams are logged at most BB_LOG_BURST a second (a flood must not flood the
 * log). */
static int drop_log_ok(void) { return bb__log_ok(&drop_log); }
/* The sender's credentials, and the descriptors it passed along (FDSTORE=1, or the pipe of
 * systemd-notify's BARRIER=1, whose sender waits until it is closed) into fds, their
 * number into *nfds. */
static const struct ucred *scan_cmsgs(struct msghdr *mh, int *fds, size_t *nfds)
{
    const struct ucred *cred = NULL;
    *nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET)
            continue;
        if (cm->cmsg_type == SCM_CREDENTIALS && cm->cmsg_len == CMSG_LEN(sizeof(struct ucred)))
            cred = (const struct ucred *)(void *)CMSG_DATA(cm);
        if (cm->cmsg_type == SCM_RIGHTS) {
            size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < n && *nfds < MAX_PASSED_FDS; i++)
                memcpy(&fds[(*nfds)++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        }
    }
    return cred;
}

/* One datagram from pid, whose instance `in` was looked up while the sender could not
 * have exited yet (NULL: not a supervised process or one of its group). */
static void notify_message(bb_inst_t *in, pid_t pid, const char *buf, size_t len)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    int n = bbproto_parse(buf, len, f, BBPROTO_MAX_FIELDS);
    if (!in) {
        if (drop_log_ok())
            log_warn("notify message dropped", "pid=%d why=%s dropped_since_last_log=%lld",
                     (int)pid, "sender is not a supervised process", (long long)drop_log.held);
        drop_log.held = 0;
        return;
    }
    if (n < 0) {
        if (drop_log_ok())
            log_warn("notify message dropped", "pid=%d instance=%s why=%s", (int)pid, in->id,
                     strerror(-n));
        return;
    }
    size_t vlen;
    const char *v;
    if ((v = bbproto_get(f, n, "STATUS", &vlen))) {
        char status[sizeof(in->status)];
        bb__copy_printable(status, sizeof(status), v, vlen);
        if (strcmp(status, in->status)) {
            memcpy(in->status, status, sizeof(status));
            bb_status_changed(in);
        }
    }
    if (bbproto_get(f, n, "STOPPING", NULL))
        log_info("instance stopping on its own", "instance=%s", in->id);
    /* readiness and liveness come from the configured health type only: a program that
     * speaks sd_notify but is checked by a probe is ready when the probe says so */
    if (in->svc->health.type != BB_H_NOTIFY)
        return;
    if ((v = bbproto_get(f, n, "READY", &vlen)) && vlen == 1 && v[0] == '1')
        bb_inst_event(in, EV_READY);
    else if ((v = bbproto_get(f, n, "WATCHDOG", &vlen)) && vlen == 1 && v[0] == '1')
        bb_inst_event(in, EV_ALIVE);
}

static void on_notify(bb_watch_t *w, uint32_t events)
{
    char buf[BBPROTO_MAX_MSG + 1];
    union {
        char b[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(MAX_PASSED_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    for (int i = 0; i < DGRAMS_PER_WAKEUP; i++) {
        struct iovec iov = {buf, sizeof(buf)};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                            .msg_controllen = sizeof(ctl.b)};
        ssize_t n = recvmsg(w->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | MSG_TRUNC);
        if (n < 0)
            return;
        int fds[MAX_PASSED_FDS];
        size_t nfds;
        const struct ucred *cred = scan_cmsgs(&mh, fds, &nfds);
        /* The sender is looked up (its pid, or its process group for a helper such as
         * systemd-notify) before the descriptors it passed are closed: a sender waiting on
         * them (BARRIER=1) is still there. One that did not wait (--no-block) may be gone:
         * then only a datagram from the instance's own pid is attributed. */
        bb_inst_t *in = cred && cred->pid > 0 ? bb_inst_by_pid(cred->pid) : NULL;
        for (size_t k = 0; k < nfds; k++)
            close(fds[k]);
        if (!cred || cred->pid <= 0) {
            if (drop_log_ok())
                log_warn("notify message dropped", "why=%s", "no sender credentials");
            continue;
        }
        if (n > BBPROTO_MAX_MSG || (mh.msg_flags & MSG_TRUNC)) {
            if (drop_log_ok())
                log_warn("notify message dropped", "pid=%d why=%s", (int)cred->pid,
                         "over 4096 bytes");
            continue;
        }
        notify_message(in, cred->pid, buf, (size_t)n);
    }
}

int bb_notify_init(void)
{
    int fd = bb__unix_listen(bb.cfg.notify_socket, SOCK_DGRAM, 0666);
    if (fd < 0)
        return fd;
    int on = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on))) {
        int err = errno;
        close(fd);
        return -err;
    }
    notify_w.fd = fd;
    notify_w.fn = on_notify;
    return bb_watch_add(&notify_w, EPOLLIN);
}

void bb_notify_close(void)
{
    bb_watch_close(&notify_w);
}
