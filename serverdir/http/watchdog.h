/* serverdir's side of the systemd watchdog: WATCHDOG=1 is only sent when the HTTP worker
 * pool answered a real request, so a wedged pool (every worker stuck) makes systemd
 * restart the copy instead of leaving a listening socket that never answers. */
#ifndef SD_WATCHDOG_H
#define SD_WATCHDOG_H

/* Sends GET /healthz to this process's own listener (listen "HOST:PORT"; a wildcard host
 * is reached over loopback) and, if 200 came back within timeout_ms, WATCHDOG=1.
 * Logs one line when the check starts failing and one when it recovers. */
void sd_watchdog_tick(const char *listen, int timeout_ms);

#endif
