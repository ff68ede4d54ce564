/* Connection admission and deadlines for the HTTP front (docs/operations.md, "Connection
 * limits"): per-source and total connection limits, eviction of the connections that
 * have not got a request in when the total is reached, a header and a body deadline, and
 * the liveness of the worker pool that the systemd watchdog check reads (watchdog.h).
 *
 * libmicrohttpd has one inactivity timeout per connection, which a byte a second keeps
 * alive, and refuses new connections at its limit whatever the old ones are doing. This
 * module follows every connection through its states and closes the ones that overstay:
 *
 *     accepted --> HEAD --(request head complete)--> BODY --(body complete)--> BUSY
 *                   ^                                                           |
 *                   +-----------------(answer sent, keep-alive)-----------------+
 *
 *   HEAD  no complete request yet (a new connection, or a kept-alive one between
 *         requests): closed header_timeout_ms after it entered HEAD, and the first
 *         evicted when the total limit is reached (oldest first).
 *   BODY  the head is in, the body is arriving: closed body_timeout_ms after the head;
 *         evicted after every HEAD one, and only when its request carries no valid token.
 *   BUSY  a handler runs, the request is parked, or the answer is being sent: never
 *         evicted or timed out here (conn_timeout_s, libmicrohttpd's own inactivity
 *         timeout, still bounds a peer that stops reading its answer).
 *
 * Closing is shutdown(2) of the connection's socket: libmicrohttpd then sees the end of
 * the stream on its own thread and closes and frees the connection as usual. The socket
 * stays open until libmicrohttpd's "closed" notification has taken the connection out of
 * this module's table, so the descriptor shut down is always that connection's. */
#ifndef SD_HTTP_CONN_H
#define SD_HTTP_CONN_H

#include <microhttpd.h>
#include <stdint.h>
#include <sys/socket.h>

#define SD_CONN_MAX_EXEMPT 16

typedef struct {
    int max_total;          /* open connections at once (max_connections) */
    int max_per_source;     /* per source: an IPv4 address or an IPv6 /64; 0: no limit */
    int header_timeout_ms;  /* accept (or the previous answer) to a complete request head */
    int body_timeout_ms;    /* complete head to complete body */
    /* Sources the per-source limit does not apply to (trusted proxies: every client
     * behind a load balancer comes from its address), as exact addresses. */
    struct sockaddr_storage exempt[SD_CONN_MAX_EXEMPT];
    int nexempt;
} sd_conn_limits_t;

/* Starts the deadline thread with these limits (copied). 0 or negative errno. */
int sd_conn_start(const sd_conn_limits_t *lim);
/* Stops the deadline thread (after libmicrohttpd has stopped). */
void sd_conn_stop(void);

/* libmicrohttpd's accept policy callback: refuses a source over its limit; at the total
 * limit evicts the oldest connection without a request in, or refuses when there is
 * none. */
enum MHD_Result sd_conn_admit(void *cls, const struct sockaddr *addr, socklen_t len);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback: enters and leaves the table. */
void sd_conn_notify(void *cls, struct MHD_Connection *mc, void **socket_ctx,
                    enum MHD_ConnectionNotificationCode toe);

/* The request's head is complete (HEAD -> BODY); authed: it carries a valid token. */
void sd_conn_head_done(struct MHD_Connection *mc, int authed);
/* The body is complete or the answer is decided early (BODY -> BUSY). */
void sd_conn_body_done(struct MHD_Connection *mc);
/* The answer is sent; the connection waits for its next request (BUSY -> HEAD). */
void sd_conn_answer_done(struct MHD_Connection *mc);

/* ---- worker liveness (for the watchdog) ----
 * Each libmicrohttpd worker stamps when it enters and leaves a request callback, and each
 * handler thread (http.c) when it enters and leaves a handler. */
void sd_conn_worker_enter(void);
void sd_conn_worker_leave(void);
void sd_conn_handler_enter(void);
void sd_conn_handler_leave(void);
/* How many handler threads there are (those that never ran a handler are idle). */
void sd_conn_handlers_expected(int n);
/* NULL when serverdir can take work: the deadline thread ran within stuck_ms, and of each
 * kind of thread (HTTP workers, handler threads) some thread is outside a callback, or
 * inside one for less than stuck_ms right after a callback shorter than stuck_ms.
 * Otherwise a short reason (static text). */
const char *sd_conn_pool_stuck(int64_t stuck_ms);

#endif
