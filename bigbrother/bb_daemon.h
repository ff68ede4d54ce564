/* The daemon itself (main.c): what wires the subsystems together at start and takes
 * them down at exit, with the two parts that need all of them: the persisted instance
 * table (state.c: it re-creates cluster slots and stops orphans) and the systemd
 * notifications (systemd.c). */
#ifndef BB_DAEMON_H
#define BB_DAEMON_H

#include "agent/bb_agent.h"
#include "cluster/bb_cluster.h"
#include "instance/bb_instance.h"
#include "ops/bb_ops.h"
#include "report/bb_report.h"

/* ---------------------------------------------------------------- state.c */

/* Takes the lock file, then sets bb.ident (bigbrother.id, created at the first start);
 * exits with a clear error when another bigbrother holds the lock. */
void bb_state_lock(void);
/* Re-adopts the instances of the persisted table whose processes still run, and those
 * found running by their environment; stops the orphans (see state.c). */
void bb_state_load(void);
/* Reads state_dir/state.json: the parsed table (caller decrefs), or NULL when it is
 * missing or damaged; a damaged one is renamed aside and logged. */
json_t *bb__state_read(const char *state_dir);
/* Writes the table atomically if it changed (a before-sleep hook of the loop, and once
 * more when the loop ends). */
void bb_state_save(void);

/* ---------------------------------------------------------------- systemd.c */

/* Arms the loop timer that tells systemd READY=1 from inside the running loop (after
 * re-adoption) and then WATCHDOG=1 every half WATCHDOG_USEC, so a stuck loop starves
 * the watchdog. A no-op without NOTIFY_SOCKET. */
void bb_systemd_start(void);
/* STOPPING=1 (SIGTERM/SIGINT) or RELOADING=1 (SIGHUP re-exec) with a STATUS= line. */
void bb_systemd_stopping(int sig, int running);

#endif
