/* Reporting to ServerDir: a durable on-disk outbox and a reporter thread.
 *
 * The supervision thread calls bb_report_event() for every started / ready / stopped
 * event. The call appends the event to the outbox file in the state dir with one write(2)
 * (so a kill -9 of bigbrother right after it loses nothing) and wakes the reporter
 * thread; it never touches the network and never waits for ServerDir.
 *
 * The reporter thread sends pending events in order, in batches, to
 * POST /v1/clusters/{cluster}/events through libsdclient, retries with exponential
 * backoff and jitter while ServerDir is down or failing, and drops events from the
 * outbox only when ServerDir acknowledged them (2xx). Event ids make retries idempotent.
 * It also registers the machine and renews its lease (PUT /v1/clusters/{c}/machines/{m})
 * every lease_ttl_ms / 3. With no ServerDir URL configured, events are kept in the
 * outbox file only (standalone mode) and nothing is sent.
 */
#ifndef BB_REPORT_H
#define BB_REPORT_H

#include <jansson.h>
#include <stdint.h>

typedef struct bb_report bb_report_t;

typedef struct {
    const char *state_dir;   /* the outbox lives in state_dir/outbox/ */
    const char *cluster;
    const char *machine;
    const char *urls;        /* comma-separated ServerDir base URLs, or NULL (standalone) */
    const char *token;       /* bearer token of role bigbrother, or NULL */
    const char *address;     /* the machine's address, for the lease; may be NULL */
    json_t *labels;          /* object of string labels (borrowed), may be NULL */
    int capacity;            /* max instances this machine accepts, 0 = unset */
    const char *version;     /* bigbrother version string */
    int lease_ttl_ms;        /* default 15000 */
    int logs_port;           /* logs_listen's port, registered with the lease; 0 = none */
} bb_report_opts_t;

/* Opens (or recovers) the outbox, then starts the reporter thread which first sends
 * whatever an earlier run left unsent. Returns 0 or a negative errno. */
int bb_report_start(const bb_report_opts_t *opts, bb_report_t **out);

/* Appends one event and wakes the reporter. `event` is borrowed; it must hold "type"
 * ("started" | "ready" | "stopped"), "instance", "service", for started "pid" and for
 * stopped "reason", and pass sd_event_check() (sdproto.h; docs/design.md, "Wire
 * contract") once completed, else -EINVAL (logged) and nothing is written. The id
 * ("<machine>-<run id>-<seq>", unique across restarts), "machine" and "ts_ms" are added
 * when absent and written into the record, so every retry, even after a restart, carries
 * the same id. -ENOSPC when the outbox is at its cap (256 MiB; logged once per episode).
 * Safe to call from the supervision thread only (single producer). Returns 0 or -errno. */
int bb_report_event(bb_report_t *r, json_t *event);

/* Events appended but not yet acknowledged by ServerDir. Any thread. */
int64_t bb_report_pending(const bb_report_t *r);
/* Send attempts that failed since start (for status and metrics). Any thread. */
int64_t bb_report_send_failures(const bb_report_t *r);

/* Stops the reporter thread and closes the outbox. A request in flight is not cut: each
 * is bounded by the request timeout (lease_ttl_ms / (6 x URLs), 250 ms .. 2 s, per URL
 * tried). Unsent events stay on disk for the next start. */
void bb_report_stop(bb_report_t *r);

#endif
