/* Processes of this bigbrother that no slot of the table takes: found running at start
 * (procscan.c, or the state file) for a slot the config no longer has, for a cluster
 * slot whose spec was lost with the state file, or for a slot that another process of
 * ours already holds. They are not instances of the table (no service to run again, no
 * state machine); each is stopped once, here: the stop signal to its process group,
 * SIGKILL to the group after the grace, and when its pidfd reports it gone, one
 * `stopped` event with reason `orphaned` and the detail of why. Never restarted. An
 * orphan still running when bigbrother exits is found again by the next run. */
#include "instance/bb_instance.h"
#include "sdlog.h"
#include "sdtime.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define ORPHAN_GRACE_MS 5000 /* the config's default stop.grace_ms */

typedef struct orphan {
    bb_watch_t pidw;
    bb_timer_t kill_timer;
    bb_found_t f;
    int is_child;
    char detail[200];
    struct orphan *next;
} orphan_t;

static orphan_t *orphans;

/* Reports the orphan stopped (code / sig -1 when unknown) and frees it; it must already
 * be out of the list or never in it. */
static void orphan_gone(orphan_t *o, int code, int sig)
{
    log_info("orphaned instance stopped", "instance=%s pid=%d code=%d signal=%d", o->f.id,
             (int)o->f.pid, code, sig);
    json_t *ev = json_pack("{s:s, s:s, s:s, s:I, s:i, s:i, s:s, s:o, s:o, s:s}", "type",
                           sd_event_type_name(SD_EV_STOPPED), "instance", o->f.id, "service", o->f.service, "ts_ms",
                           (json_int_t)sd_wall_ms(), "slot", o->f.slot, "generation",
                           o->f.generation, "reason", sd_stop_reason_name(SD_STOP_ORPHANED), "code",
                           code >= 0 ? json_integer(code) : json_null(), "signal",
                           sig > 0 ? json_integer(sig) : json_null(), "detail", o->detail);
    if (!ev || (bb.report && bb_report_event(bb.report, ev)))
        log_error("event not recorded", "instance=%s type=%s", o->f.id,
                  sd_event_type_name(SD_EV_STOPPED));
    json_decref(ev);
    bb_timer_cancel(&o->kill_timer);
    if (o->pidw.fd >= 0)
        bb_pidfd_close(&o->pidw);
    bb_defer_free(o);
}

/* The pidfd of an orphan became readable: it is gone (reaped when it is our child). */
static void on_orphan_exit(bb_watch_t *w, uint32_t events)
{
    (void)events;
    orphan_t *o = container_of(w, orphan_t, pidw);
    int code = -1, sig = -1;
    if (o->is_child) {
        siginfo_t si;
        if (bb_pidfd_wait(w->fd, &si) == 0 && si.si_pid == 0)
            return; /* a stale wake-up: still running */
        if (si.si_pid && si.si_code == CLD_EXITED)
            code = si.si_status;
        else if (si.si_pid)
            sig = si.si_status;
    }
    for (orphan_t **p = &orphans; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            break;
        }
    orphan_gone(o, code, sig);
}

/* The grace passed and the orphan still runs: SIGKILL to its group. */
static void on_orphan_grace(bb_timer_t *t)
{
    orphan_t *o = container_of(t, orphan_t, kill_timer);
    log_warn("orphaned instance killed after the grace", "instance=%s pid=%d", o->f.id,
             (int)o->f.pid);
    if (kill(-o->f.pid, SIGKILL) && errno == ESRCH)
        kill(o->f.pid, SIGKILL);
}

void bb_orphan_stop(const bb_found_t *f, const bb_service_t *svc, const char *detail)
{
    int sig = svc ? svc->stop.signal : SIGTERM;
    int grace = svc ? svc->stop.grace_ms : ORPHAN_GRACE_MS;
    orphan_t *o = calloc(1, sizeof(*o));
    if (!o) {
        log_error("orphaned instance not stopped", "instance=%s pid=%d error=%s", f->id,
                  (int)f->pid, strerror(ENOMEM));
        return;
    }
    o->f = *f;
    o->is_child = f->ppid == getpid();
    sd_strlcpy(o->detail, detail, sizeof(o->detail));
    o->kill_timer.fn = on_orphan_grace;
    o->pidw.fn = on_orphan_exit;
    log_warn("orphaned instance: stopping it", "instance=%s service=%s slot=%d pid=%d detail=%s",
             f->id, f->service, f->slot, (int)f->pid, detail);
    int fd = bb_pidfd_open(f->pid);
    o->pidw.fd = fd < 0 ? -1 : fd;
    if (fd < 0 || bb_watch_add(&o->pidw, EPOLLIN)) {
        kill(-f->pid, SIGKILL); /* gone already, or no way to watch it: no grace */
        orphan_gone(o, -1, -1);
        return;
    }
    o->next = orphans;
    orphans = o;
    if (kill(-f->pid, sig) && errno == ESRCH)
        kill(f->pid, sig);
    kill(-f->pid, SIGCONT); /* a stopped process takes the signal now */
    bb_timer_set(&o->kill_timer, sd_deadline_ms(sd_mono_ms(), grace));
}
