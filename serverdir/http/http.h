/* http/: the HTTP front, auth, routing, metrics, the dashboard and parked requests. */
/* The HTTP front (libmicrohttpd, thread pool): parses requests, authenticates, enforces
 * body caps and content types, dispatches to route handlers and records metrics. */
#ifndef SD_HTTP_H
#define SD_HTTP_H

#include "conn.h"

/* Binds listen ("host:port") and starts the worker pool under the connection limits and
 * deadlines of conn.h (at most lim->max_total open connections, lowered to what the
 * open-file limit holds; each has a memory pool of SD_HTTP_CONN_MEMORY bytes, and at most
 * one answer it has not read: a connection's next pipelined request is read only after
 * that answer is sent). conn_timeout_s: libmicrohttpd's inactivity timeout, which still
 * bounds a peer that stops reading its answer. Returns 0 or negative errno. */
#define SD_HTTP_CONN_MEMORY (16u << 10)
int sd_http_start(const char *listen, int threads, int conn_timeout_s,
                  const sd_conn_limits_t *lim);
/* The port actually bound (useful with port 0). */
int sd_http_port(void);
/* Stops accepting, waits up to grace_ms for in-flight requests, then stops the pool. */
void sd_http_stop(int grace_ms);

#endif
