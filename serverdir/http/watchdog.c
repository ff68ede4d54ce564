/* The watchdog self-check; see watchdog.h. Runs on the main thread (which otherwise only
 * waits for signals) and reads atomics only: it never waits on the HTTP pool. */
#include "watchdog.h"
#include "conn.h"
#include "sdlog.h"
#include "sdnotify.h"

static int failing;

void sd_watchdog_tick(int64_t stuck_ms)
{
    const char *why = sd_conn_pool_stuck(stuck_ms);
    if (!why) {
        if (failing)
            log_info("watchdog self-check recovered", "stuck_ms=%lld", (long long)stuck_ms);
        failing = 0;
        sd_notify_send("WATCHDOG=1");
        return;
    }
    if (!failing)
        log_warn("watchdog self-check failed, not feeding the systemd watchdog",
                 "stuck_ms=%lld reason=%s", (long long)stuck_ms, why);
    failing = 1;
}
