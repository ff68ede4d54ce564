/* Operations: what operators and monitoring see of this machine. The control socket
 * bbctl talks to (ctlsock.c), the Prometheus /metrics endpoint (metrics.c) and the logs
 * port (logsrv.c). */
#ifndef BB_OPS_H
#define BB_OPS_H

#include "instance/bb_instance.h"

/* ---------------------------------------------------------------- ctlsock.c */

int bb_ctl_init(void);
void bb_ctl_close(void);

/* ---------------------------------------------------------------- metrics.c
 * The counters are written by the supervision thread only, as relaxed atomics, and read
 * by the /metrics HTTP thread: supervision never takes a lock or waits for a scrape. */

/* Allocates the per-service counters (after bb_supervisor_init), hooks them into the
 * state machine and, when metrics_listen is set, starts the HTTP thread serving /metrics
 * there. Returns 0 or -errno. */
int bb_metrics_start(void);
void bb_metrics_stop(void);
/* A listening TCP socket on host:port (numeric IPv4 or IPv6): the fd or -errno. */
int bb_listen_tcp(const char *host, int port);
/* The counters survive a SIGHUP re-exec: bb_metrics_save writes them to
 * state_dir/metrics.saved just before the exec, bb_metrics_restore (after
 * bb_metrics_start) reads them back and deletes the file. A damaged file is logged and
 * ignored: the counters start at 0, as after any other start. */
void bb_metrics_save(void);
void bb_metrics_restore(void);
/* Before-sleep hook of the loop: republishes the processes-by-state and agent gauges. */
void bb_metrics_publish(void);

/* ---------------------------------------------------------------- logsrv.c */

/* The logs port, when logs_listen is set: 0, or -errno when it cannot open. */
int bb_logsrv_start(void);
void bb_logsrv_stop(void);
/* The logs port's connection refusals and closes (its connection guard), as Prometheus
 * counter families, appended to b (the /metrics rendering of metrics.c). */
void bb_logsrv_metrics(sd_buf_t *b);

#endif
