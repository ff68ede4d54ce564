/* The agent side: the agent socket (agentsrv.c), one connection per game process using
 * libbbagent, whose messages are dispatched through a table of handlers; the sd_notify
 * socket (notify.c); and allocations and status events (alloc.c), which register their
 * handlers into the agent server's table. Runs on the supervision thread. */
#ifndef BB_AGENT_H
#define BB_AGENT_H

#include "instance/bb_instance.h"

/* ---------------------------------------------------------------- agentsrv.c */

/* Opens the agent socket and hooks the agent into the state machine (SHUTDOWN on stop,
 * the connection closed on exit). 0 or -errno. */
int bb_agentsrv_init(void);
void bb_agentsrv_close(void);

/* A handler of agent messages: runs for each message of an accepted connection that
 * carries the field `key` (val, len: its value), or for every message when key is NULL
 * (val NULL). Handlers run in the order they were registered, after the status fields
 * and before readiness and liveness are taken from the message. */
typedef struct {
    const char *key;
    void (*fn)(bb_inst_t *in, const char *val, size_t len);
} bb_agent_handler_t;
/* Adds h (static storage) to the table; again with the same h is a no-op. 0, or -ENOSPC
 * when the table is full. */
int bb_agent_handle(const bb_agent_handler_t *h);
/* What else an agent connection tells its listeners: the connection of an instance was
 * accepted (after WELCOME); its players, max_players, status or ports changed. */
enum bb_agent_event { BB_AGENT_CONNECTED, BB_AGENT_STATUS, BB_AGENT__COUNT };
/* Registers fn to run, after those registered before it, on each ev; again with the same
 * fn is a no-op. 0, or -ENOSPC. */
int bb_agent_on(enum bb_agent_event ev, void (*fn)(bb_inst_t *in));

void bb_agent_send(bb_inst_t *in, const char *key, const char *val, const char *key2,
                   const char *val2);
/* Sends one ready-made message (at most BBPROTO_MAX_MSG bytes) to the instance's agent:
 * 0, -ENOTCONN without a connection, or the send's -errno (-EAGAIN: its socket is full). */
int bb_agent_send_msg(bb_inst_t *in, const char *msg, size_t len);
void bb_agent_detach(bb_inst_t *in);

/* Log lines an outsider can trigger (a local client, a datagram) are written at most
 * BB_LOG_BURST a second: bb__log_ok(&rl) says whether this one may be, and counts the ones
 * it holds back in rl.held (reported, then reset, by the next line written). */
#define BB_LOG_BURST 5
typedef struct {
    int64_t last_ms; /* start of the current one-second window */
    int burst;       /* lines written in it */
    int64_t held;
} bb_ratelimit_t;
int bb__log_ok(bb_ratelimit_t *rl);
/* Copies len bytes of an outside text (STATUS=) into dst (cap >= 1, NUL-terminated,
 * truncated), each byte outside printable ASCII replaced by '?': what bbctl and the
 * JSON answers show is always valid text. */
void bb__copy_printable(char *dst, size_t cap, const char *src, size_t len);

/* ---------------------------------------------------------------- credential.c */

/* With credentials on (bb.cred): hands each new credential to its run's file and agent,
 * sends the held one to an agent that connects, and drops both when the run ends (hook
 * `gone`). 0 or -errno. */
int bb_handover_init(void);
/* After re-adoption: deletes the credential files of runs no longer running and asks for
 * the credentials of the running ones. */
void bb_handover_adopted(void);

/* ---------------------------------------------------------------- notify.c */

int bb_notify_init(void);
void bb_notify_close(void);

/* ---------------------------------------------------------------- alloc.c */

/* Registers the allocation handlers into the agent server's table (ALLOCATION_ACK,
 * RELEASE, the resend on every message and on connect, the status event on a change)
 * and hooks allocations into the
 * state machine (forgotten on respawn and exit, a held status flushed before ready).
 * Call once after bb_agentsrv_init; again is a no-op. 0 or -errno. */
int bb_alloc_init(void);
/* Applies the assignment document's "allocations" array (borrowed; NULL: none): sends
 * ALLOCATED to the instances with an agent connection that have not acknowledged it,
 * DEALLOCATED for the allocations that left the document (then restarts the instance
 * when its service says on_release "restart"). */
void bb_alloc_apply(const json_t *allocs);
/* The instance's process is gone or replaced: forgets its allocations and its pending
 * status event. */
void bb_alloc_reset(bb_inst_t *in);
/* Sends a status change still held back by the one-a-second limit now (before the ready
 * event, so the instance enters the pool with its status and ports). */
void bb_status_flush(bb_inst_t *in);
/* players, max_players or status changed: a `status` event, at most one per instance per
 * second (a timer sends the latest values), when events go to ServerDir. */
void bb_status_changed(bb_inst_t *in);
/* Frees the document kept for resends (at exit). */
void bb_alloc_free(void);

#endif
