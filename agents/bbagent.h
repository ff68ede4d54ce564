/* libbbagent: the shim a game process links to talk to its Big Brother (the per-machine
 * supervisor). The whole public face of the library is this header.
 *
 * The game calls bbagent_heartbeat() from its own main loop every tick: the heartbeats
 * prove that the loop runs, so a stuck loop stops them and Big Brother restarts the
 * process. The shim starts no thread, installs no signal handler, allocates only in
 * bbagent_open() and never blocks the caller: every socket call is non-blocking.
 *
 * With no Big Brother around (no $BB_SOCKET, the process was started by hand) every call
 * is a cheap no-op returning 0. If Big Brother goes away and comes back (it restarted),
 * later calls reconnect by themselves, at most one attempt every 500 ms, and resend what
 * the game already said (READY, the last status) and what it still owes (allocation
 * acknowledgements, a release).
 *
 * A handle is not thread-safe: use it from one thread (the game loop).
 * Every int-returning function returns 0 or a negative errno (bbagent_fd returns an fd).
 * The wire protocol is described in docs/agent-protocol.md.
 *
 *   bbagent_t *a = bbagent_open(NULL);
 *   ... load the map ...
 *   bbagent_ready(a);
 *   for (;;) {
 *       struct pollfd p = { .fd = bbagent_fd(a), .events = POLLIN };  // fd < 0 is skipped
 *       poll(&p, 1, ms_until_next_tick);
 *       bbagent_event_t ev;
 *       while (bbagent_poll(a, &ev) == 0 && ev.type != BBAGENT_EVENT_NONE)
 *           handle(ev);                    // SHUTDOWN: save players, exit within grace
 *                                          // ALLOCATED: a match starts
 *                                          // (bbagent_allocation: id, payload)
 *       run_tick();
 *       bbagent_heartbeat(a);
 *       if (match_over)
 *           bbagent_release(a);            // back to the pool (docs/allocation.md)
 *   }
 */
#ifndef BBAGENT_H
#define BBAGENT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bbagent bbagent_t;

/* Options for bbagent_open(); zero-initialize, then set what you need. */
typedef struct {
    /* Path of Big Brother's agent socket ("@name" for the abstract namespace).
     * NULL: $BB_SOCKET. "" : no Big Brother, every call is a no-op. */
    const char *socket_path;
    /* This process's instance id as Big Brother named it. NULL: $BB_INSTANCE. */
    const char *instance;
} bbagent_opts_t;

typedef enum {
    BBAGENT_EVENT_NONE = 0,       /* nothing pending */
    BBAGENT_EVENT_SHUTDOWN = 1,   /* save players and exit within grace_ms */
    BBAGENT_EVENT_DRAIN = 2,      /* take no new players; keep running */
    BBAGENT_EVENT_ALLOCATED = 3,  /* a session is handed to this process (allocation...) */
    BBAGENT_EVENT_DEALLOCATED = 4 /* an allocation was ended from outside (DELETE, expired) */
} bbagent_event_type_t;

typedef struct {
    bbagent_event_type_t type;
    /* SHUTDOWN: the grace Big Brother gave, in ms from when it sent the request, before
     * it sends the stop signal; -1 if it named none. Other events: -1. */
    int grace_ms;
} bbagent_event_t;

/* The details of an ALLOCATED or DEALLOCATED event (bbagent_allocation()). Kept out of
 * bbagent_event_t so that programs built against the older, smaller event still run
 * with this library. The strings point into the handle and stay valid until the next
 * bbagent_poll() (or bbagent_close()) on it: copy what must live longer. */
typedef struct {
    /* The allocation id, a ServerDir name (1-128 characters of A-Z a-z 0-9 _ . : @ -,
     * not starting with . or -, no ".."), e.g. "a000000000017". */
    const char *allocation;
    /* ALLOCATED: the allocator's payload as compact JSON text, at most 1024 bytes ("null"
     * when it gave none). DEALLOCATED: NULL. */
    const char *payload;
    /* ALLOCATED: the player slots the allocator asked for (0 when it named none).
     * DEALLOCATED: -1. */
    int players;
    /* ALLOCATED: 1 for a "join" allocation (players join a running session), 0 for
     * "ready" (a fresh session). DEALLOCATED: 0. */
    int join;
} bbagent_allocation_t;

/* Creates a handle (the only allocation the library makes) and tries once to connect.
 * No Big Brother reachable is not an error: the handle reconnects later by itself.
 * Returns NULL with errno set only for ENOMEM or EINVAL (a socket path longer than
 * sun_path, or an instance id that is not a ServerDir name: 1-128 of A-Z a-z 0-9 _ . : @ -,
 * not starting with '.' or '-', no ".."; an empty or unset one is allowed). opts may be
 * NULL. */
bbagent_t *bbagent_open(const bbagent_opts_t *opts);

/* Start-up is done: the process serves players. Remembered and sent again after a
 * reconnect. Returns 0 (also when queued for the next connection). */
int bbagent_ready(bbagent_t *a);

/* Call every tick of the game loop. Sends at most one heartbeat packet per
 * max(50 ms, HEARTBEAT_MS/4), costs a clock read otherwise. Returns 0, -ENOTCONN while
 * Big Brother is configured but unreachable, -EAGAIN when its socket is full. */
int bbagent_heartbeat(bbagent_t *a);

/* Load figures and a free-text status line shown by sdctl (kv may be NULL; at most 1024
 * bytes, no newline). players / max_players < 0 leave them out. Sent when they change,
 * remembered across reconnects. Returns 0 or -EINVAL. */
int bbagent_status(bbagent_t *a, int players, int max_players, const char *kv);

/* bbagent_status() with the status text kept as it is: the load figures alone (what
 * "join" allocations look at: max_players - players free slots). Returns 0 or -EINVAL. */
int bbagent_set_players(bbagent_t *a, int players, int max_players);

/* A port the game serves on, by name ("game", "query": 1-32 characters of A-Z a-z 0-9
 * _ . @ -, not starting with . or -, no ".."), sent with the status (PORTS=game:27960 ...) and
 * remembered across reconnects: Big Brother reports it to ServerDir, and an allocation
 * answers it to the matchmaker. Call it before bbagent_ready() so that the instance is
 * listed with its ports as soon as it is ready. At most 8 names; the same name again
 * replaces its port. Returns 0, -EINVAL (bad name or port) or -ENOSPC (a 9th name). */
int bbagent_port(bbagent_t *a, const char *name, int port);

/* The session is over: sends RELEASE=1, and Big Brother ends every open allocation of
 * this process (the instance goes back to its pool, or is restarted when the service says
 * on_release "restart"). Sent once; when the connection is down or full, it is owed and
 * sent by a later call (also after a reconnect). Returns 0 (also when owed). */
int bbagent_release(bbagent_t *a);

/* The connection's fd, to wait for POLLIN in the game's own poll loop, or -ENOTCONN.
 * The fd changes across reconnects: read it again before every poll. */
int bbagent_fd(bbagent_t *a);

/* Non-blocking: stores the next request from Big Brother in *ev (type NONE if there is
 * none) and returns 0, or a negative errno. Call it when bbagent_fd() is readable or
 * once per tick, until it returns NONE; it also notices a closed connection. Returning
 * an ALLOCATED event acknowledges it to Big Brother (ALLOCATION_ACK, owed while the
 * connection is down or full); an allocation Big Brother sends again (after a
 * reconnect, before it saw the acknowledgement) is acknowledged again but not returned
 * twice. Events come in this order: SHUTDOWN, DRAIN, then allocation events as they
 * arrived. */
int bbagent_poll(bbagent_t *a, bbagent_event_t *ev);

/* After bbagent_poll() returned BBAGENT_EVENT_ALLOCATED or BBAGENT_EVENT_DEALLOCATED:
 * that event's details in *out, valid until the next bbagent_poll(). Returns 0, or
 * -ENOENT (and *out with NULL strings, players -1) when the last event bbagent_poll()
 * returned was another one; -EINVAL for NULL arguments. */
int bbagent_allocation(const bbagent_t *a, bbagent_allocation_t *out);

/* The newest credential Big Brother handed this process (a JWT naming its cluster,
 * machine, service, instance and generation; docs/game-server-guide.md): copied into buf
 * NUL-terminated. Present it as the bearer token of requests to ServerDir. Big Brother
 * sends it when the agent connects and again on every renewal, before the one held
 * expires: call this again before each use (it is a copy of a few hundred bytes), or when
 * its expiry nears. The credential arrives with what bbagent_poll() reads; this call
 * reads nothing. Returns its length, 0 when none has arrived (or no Big Brother), -1 when
 * cap is not larger than the length (at most 4096: a buffer of 4097 always fits) or a is
 * NULL. */
int bbagent_credential(bbagent_t *a, char *buf, size_t cap);

/* Sends BYE=<reason> (NULL: "exit"), closes the connection and frees the handle. */
void bbagent_close(bbagent_t *a, const char *reason);

#ifdef __cplusplus
}
#endif

#endif
