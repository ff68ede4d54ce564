/* bigbrother under a Type=notify systemd unit (packaging/systemd/bigbrother.service).
 *
 * READY=1 is sent from a loop timer rather than from main(): when it arrives, the
 * persisted table has been re-adopted and the supervision loop is turning. WATCHDOG=1
 * comes from the same timer, so a loop that stops turning (a handler stuck in a system
 * call, a livelock) stops feeding the watchdog and systemd restarts bigbrother; with
 * KillMode=process that restart kills only bigbrother, and the next one re-adopts the
 * game processes. */
#include "bb_daemon.h"
#include "sdlog.h"
#include "sdnotify.h"

#include <signal.h>
#include <string.h>

static bb_timer_t sd_timer;
static int sd_ready_sent;

/* Counts instances with a live process and those reported ready. */
static void count(int *running, int *ready)
{
    *running = *ready = 0;
    for (int i = 0; i < bb.ninst; i++) {
        *running += bb.inst[i].pid > 0;
        *ready += bb.inst[i].state == ST_READY;
    }
}

static void on_sd_timer(bb_timer_t *t)
{
    int running, ready;
    count(&running, &ready);
    if (!sd_ready_sent) {
        sd_notify_send("READY=1\nSTATUS=supervising %d instances (%d running, %d ready)",
                       bb.ninst, running, ready);
        sd_ready_sent = 1;
    } else {
        sd_notify_send("WATCHDOG=1\nSTATUS=supervising %d instances (%d running, %d ready)",
                       bb.ninst, running, ready);
    }
    int64_t every = sd_notify_watchdog_ms();
    if (every)
        bb_timer_set(t, sd_mono_ms() + every);
}

void bb_systemd_start(void)
{
    int rc = sd_notify_init();
    if (rc) {
        log_warn("cannot talk to the service manager", "error=%s", strerror(-rc));
        return;
    }
    if (!sd_notify_enabled())
        return;
    sd_timer.fn = on_sd_timer;
    bb_timer_set(&sd_timer, sd_mono_ms());
}

void bb_systemd_stopping(int sig, int running)
{
    if (sig == SIGHUP)
        sd_notify_send("RELOADING=1\nSTATUS=re-executing to reload the config; %d processes "
                       "left running",
                       running);
    else
        sd_notify_send("STOPPING=1\nSTATUS=stopping; %d processes left running for the next "
                       "bigbrother",
                       running);
}
