/* Process exit as an fd for epoll: pidfd_open(2), or, where it is missing, an emulation.
 *
 * The kernels bigbrother runs on have pidfd_open (Linux >= 5.3), but valgrind 3.19
 * (Debian bookworm, used by the test suite's memcheck stage) does not know the system
 * call (nor does the waitid P_PIDFD that goes with it). Then each "pidfd" is an eventfd that a 100 ms timer makes readable once the
 * process is gone: waitid(WNOWAIT) for bigbrother's children, /proc/<pid>/stat (same
 * start time, not a zombie) for re-adopted ones. The timer runs only in that mode and
 * only while there are processes to watch. bb_pidfd_wait() reaps in both modes. */
#include "instance/bb_instance.h"
#include "sdlog.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* valgrind's client-request header, when installed: under memcheck the system call is
 * not even tried (valgrind would report it as unhandled). */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define ON_VALGRIND() RUNNING_ON_VALGRIND
#endif
#endif
#ifndef ON_VALGRIND
#define ON_VALGRIND() 0
#endif

#define EMU_POLL_MS 100

typedef struct {
    pid_t pid;
    int fd;
    int64_t start_ticks;
    int fired;
} emu_t;

static int emulate; /* 1 once pidfd_open said ENOSYS */
static emu_t *emus;
static int nemus, capemus;
static bb_timer_t emu_timer;

static emu_t *emu_find(int fd)
{
    for (int i = 0; i < nemus; i++)
        if (emus[i].fd == fd)
            return &emus[i];
    return NULL;
}

static void emu_poll(bb_timer_t *t)
{
    for (int i = 0; i < nemus; i++) {
        emu_t *e = &emus[i];
        if (e->fired)
            continue;
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        int gone;
        if (waitid(P_PID, (id_t)e->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0)
            gone = si.si_pid == e->pid;
        else {
            int64_t ticks;
            gone = bb_proc_stat(e->pid, &ticks, NULL) || ticks != e->start_ticks;
        }
        if (gone) {
            uint64_t one = 1;
            e->fired = write(e->fd, &one, sizeof(one)) == (ssize_t)sizeof(one);
        }
    }
    if (nemus)
        bb_timer_set(t, sd_mono_ms() + EMU_POLL_MS);
}

static int emu_open(pid_t pid)
{
    int64_t ticks = 0;
    if (bb_proc_stat(pid, &ticks, NULL) && kill(pid, 0)) /* a zombie is fine: it exited */
        return -errno;
    if (nemus == capemus) {
        int cap = capemus ? capemus * 2 : 64;
        emu_t *n = realloc(emus, (size_t)cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        emus = n;
        capemus = cap;
    }
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    emus[nemus++] = (emu_t){pid, fd, ticks, 0};
    emu_timer.fn = emu_poll;
    if (!emu_timer.idx)
        bb_timer_set(&emu_timer, sd_mono_ms() + EMU_POLL_MS);
    return fd;
}

int bb_pidfd_open(pid_t pid)
{
    if (!emulate) {
        int fd = ON_VALGRIND() ? -1 : (int)syscall(SYS_pidfd_open, pid, 0);
        if (fd >= 0)
            return fd;
        if (errno != ENOSYS && !ON_VALGRIND())
            return -errno;
        emulate = 1;
        log_warn("pidfd_open is not available: exits are polled every 100 ms", "pid=%d",
                 (int)pid);
    }
    return emu_open(pid);
}

int bb_pidfd_wait(int fd, siginfo_t *si)
{
    memset(si, 0, sizeof(*si));
    if (!emulate)
        return waitid((idtype_t)P_PIDFD, (id_t)fd, si, WEXITED | WNOHANG) ? -errno : 0;
    emu_t *e = emu_find(fd);
    if (!e)
        return -EBADF;
    return waitid(P_PID, (id_t)e->pid, si, WEXITED | WNOHANG) ? -errno : 0;
}

void bb_pidfd_close(bb_watch_t *w)
{
    emu_t *e = emulate && w->fd >= 0 ? emu_find(w->fd) : NULL;
    if (e) {
        *e = emus[--nemus];
        if (!nemus)
            bb_timer_cancel(&emu_timer);
    }
    bb_watch_close(w);
}
