/* The sender half of systemd's sd_notify protocol, without libsystemd: a daemon started
 * by a Type=notify unit tells the service manager READY=1, STATUS=..., WATCHDOG=1,
 * RELOADING=1 and STOPPING=1 by sending datagrams to $NOTIFY_SOCKET (a path, or an
 * abstract socket when it starts with '@').
 *
 * Without NOTIFY_SOCKET (run by hand, by a test, by another supervisor) every call is a
 * cheap no-op that returns 0. The environment is left as it is: a daemon that re-executes
 * itself keeps talking to the same manager, and children must be given a cleaned
 * environment by whoever spawns them (bigbrother's spawn.c strips these variables). */
#ifndef SD_NOTIFY_H
#define SD_NOTIFY_H

#include <stdint.h>

/* Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID once and opens the sending socket.
 * Returns 0, or a negative errno when NOTIFY_SOCKET is set but unusable (the caller logs
 * it; sending stays a no-op). Call once, before any thread is started. */
int sd_notify_init(void);

/* Sends one datagram; fmt builds newline-separated KEY=VALUE assignments, e.g.
 * sd_notify_send("READY=1\nSTATUS=listening on %s", addr). Capped at 1 KiB (longer text
 * is cut). Thread-safe. Returns 0 (also when there is no manager) or a negative errno. */
int sd_notify_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* How often to send WATCHDOG=1, in milliseconds: half of WATCHDOG_USEC, or 0 when the
 * unit asks for no watchdog (no WATCHDOG_USEC, or WATCHDOG_PID names another process). */
int64_t sd_notify_watchdog_ms(void);

/* Nonzero when NOTIFY_SOCKET was set and usable. */
int sd_notify_enabled(void);

#endif
