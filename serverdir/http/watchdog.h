/* serverdir's side of the systemd watchdog: WATCHDOG=1 is only sent while the HTTP worker
 * pool can take work, so a wedged pool (every worker stuck) makes systemd restart the
 * copy instead of leaving a listening socket that never answers.
 *
 * The check reads the workers' liveness stamps (conn.h, sd_conn_pool_stuck) and the
 * connection deadline thread's; it sends no request. An earlier version sent GET /healthz
 * to its own listener, which queued behind whatever held the pool's connections: a flood
 * of idle connections silenced it and systemd restarted a healthy copy again and again
 * (issue 28). A connection flood now neither delays nor fails the check, and what it
 * detects is what a restart cures: workers that stay inside requests. */
#ifndef SD_WATCHDOG_H
#define SD_WATCHDOG_H

#include <stdint.h>

/* Sends WATCHDOG=1 unless the pool is stuck (a worker in one request for stuck_ms or
 * more, for every worker, or the deadline thread silent that long). Logs one line when
 * the check starts failing and one when it recovers. */
void sd_watchdog_tick(int64_t stuck_ms);

#endif
