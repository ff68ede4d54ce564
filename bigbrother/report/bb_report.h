/* Reporting to ServerDir: a durable on-disk outbox (outbox.c) and a reporter thread
 * (reporter.c).
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
#include <stddef.h>
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
    /* Called on the reporter thread with each event ServerDir acknowledged (the record's
     * JSON text, len bytes), in outbox order; NULL: none. credential.c learns from it that
     * the directory has an instance's `started` event. */
    void (*accepted)(void *ctx, const char *rec, size_t len);
    void *accepted_ctx;
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
/* When ServerDir last accepted the machine lease (monotonic ms), 0 never or r NULL: how
 * long this machine has been cut off (cluster/converge.c). Any thread. */
int64_t bb_report_lease_ok_ms(const bb_report_t *r);
/* The last renewal of the machine lease that ServerDir accepted: when it was sent and when
 * its answer came (monotonic ms; both 0: none yet, or r NULL). A read sent after *answered
 * sees whatever the primary did before that renewal (cluster/converge.c). Any thread. */
void bb_report_lease_last(bb_report_t *r, int64_t *sent, int64_t *answered);
/* Asks the reporter thread to renew the machine lease now rather than when it is due
 * (converge, after a gap: its slots wait for a renewal sent after it). Any thread. */
void bb_report_renew_now(bb_report_t *r);

/* An eventfd that is readable when the reporter read the machine's live records after a
 * new registration of its lease (-1 for NULL). */
int bb_report_fd(const bb_report_t *r);
/* Takes that read: {instance: generation} of the records the directory holds live on
 * this machine (caller decrefs), or NULL when none waits; *since: a monotonic time
 * before the read at which every event appended earlier was in the directory (the
 * outbox was empty), so a process started before then and not in it was marked stopped
 * there. Supervision thread. */
json_t *bb_report_take_live(bb_report_t *r, int64_t *since);

/* Stops the reporter thread and closes the outbox. A request in flight is not cut: each
 * is bounded by the request timeout (lease_ttl_ms / (6 x URLs), 250 ms .. 2 s, per URL
 * tried). Unsent events stay on disk for the next start. */
void bb_report_stop(bb_report_t *r);

/* ---------------------------------------------------------------- credential.c
 * Instance credentials (docs/operations.md, "Credential delivery"): a thread of their own
 * obtains, renews and retries them; the supervision thread hands them to the games. */

typedef struct bb_cred bb_cred_t;

typedef struct {
    const char *urls;     /* comma-separated ServerDir base URLs (required) */
    const char *token;    /* the machine's bigbrother token */
    const char *cluster, *machine;
    int timeout_ms;       /* per request; 0: 2000 */
    int renew_percent;    /* renew when this share of the life is left (1..99) */
} bb_cred_opts_t;

/* Starts the credential thread. 0 or -errno (-EINVAL: no URL, a bad name or percent). */
int bb_cred_start(const bb_cred_opts_t *opts, bb_cred_t **out);
void bb_cred_stop(bb_cred_t *c);
/* Asks for the credential of run `generation` of instance (the directory has its
 * `started`); a held one of another generation is dropped. Any thread; c may be NULL. */
void bb_cred_want(bb_cred_t *c, const char *instance, int64_t generation);
/* Drops instance's entry and what it holds. Any thread; c may be NULL. */
void bb_cred_forget(bb_cred_t *c, const char *instance);
/* bb_report_opts_t.accepted: `started` -> bb_cred_want, `stopped` -> bb_cred_forget. */
void bb_cred_on_accepted(void *ctx, const char *rec, size_t len);
/* An eventfd that is readable when a credential was obtained or renewed (-1 for NULL). */
int bb_cred_fd(const bb_cred_t *c);
/* Takes one new credential: copies its instance (SD_NAME_MAX + 1 bytes), generation and
 * JWT (cap > SDC_CREDENTIAL_MAX) and returns 1, or 0 when none is left (the eventfd is
 * drained, and set again while more are left). Supervision thread. */
int bb_cred_take(bb_cred_t *c, char *instance, int64_t *generation, char *jwt, size_t cap);
/* The credential held for (instance, generation) into jwt: its length, 0 when none. */
int bb_cred_get(bb_cred_t *c, const char *instance, int64_t generation, char *jwt, size_t cap);
/* Credentials obtained (first of a run), renewed, and requests failed, since start. */
void bb_cred_counts(const bb_cred_t *c, int64_t *obtained, int64_t *renewed, int64_t *failed);

/* ---------------------------------------------------------------- outbox.c
 * The outbox: an append-only, crash-safe queue of records on disk (used by reporter.c;
 * the unit tests and the fuzzer drive it directly).
 *
 * Layout of the directory (state_dir/outbox/):
 *   NNNNNNNNNNNNNNNN.seg   segment files, numbered in hex, appended to in order
 *   ack                    "outbox-ack 1 <segment> <offset>\n": everything before that
 *                          position was acknowledged; replaced atomically (temp + rename)
 *
 * Each record is one line: 8 hex digits of payload length, a space, 8 hex digits of the
 * CRC-32C of the payload, a space, the payload (which holds no '\n'), and '\n'. A record
 * is written with one write(2) on an O_APPEND descriptor, so a kill -9 of the process
 * never leaves half a record behind; a torn or garbled tail (power loss, full disk) fails
 * the length/CRC/newline check and is cut off when the outbox is opened, never misparsed.
 * Damage in the middle of a segment costs only the damaged records: reading resumes at the
 * next intact record, and recovery rewrites the segment without the damaged bytes.
 *
 * Durability: append does not fsync (the supervision thread must never wait on the disk).
 * The reader calls outbox_sync() before it hands records to the network, so a record that
 * left the machine is on stable storage. Kill -9 of bigbrother loses nothing (the page
 * cache survives the process); a power loss may lose the records appended since the last
 * outbox_sync(), which were never sent, so ServerDir never saw an event that then vanished.
 * The ack file is fdatasync'ed before its rename; if it is lost anyway, records are sent
 * again and ServerDir drops them as duplicates by event id.
 *
 * Threads: one producer (outbox_append) and one reader (outbox_read / outbox_sync /
 * outbox_ack) may run concurrently; outbox_pending and outbox_bytes from any thread. */

typedef struct outbox outbox_t;

typedef struct {
    uint64_t max_bytes;     /* cap on the segments on disk; 0 = 256 MiB */
    uint64_t segment_bytes; /* a segment is closed once it reaches this size; 0 = 8 MiB */
} outbox_opts_t;

#define OUTBOX_RECORD_MAX (64u << 10) /* largest payload accepted by outbox_append */

/* Opens dir (created if missing, parent included) and recovers it: reads the ack
 * position, deletes fully acknowledged segments, validates every record after the ack
 * position and truncates a torn tail (logged with the bytes dropped). The caller owns
 * *out and releases it with outbox_close(). Returns 0 or a negative errno. */
int outbox_open(const char *dir, const outbox_opts_t *opts, outbox_t **out);
void outbox_close(outbox_t *ob);

/* Appends one record (len bytes, no '\n' inside) with one write(2). Returns 0, -EINVAL
 * for an empty record or one holding '\n', -E2BIG above OUTBOX_RECORD_MAX, -ENOSPC when
 * the outbox holds max_bytes already (nothing is written), or the write's -errno.
 * Producer thread only. */
int outbox_append(outbox_t *ob, const char *rec, size_t len);

/* Records appended and not acknowledged yet, and bytes of segments on disk. */
int64_t outbox_pending(const outbox_t *ob);
uint64_t outbox_bytes(const outbox_t *ob);

/* A batch of records read from the head of the queue. rec[i] points into the batch's
 * own buffer (valid until the next outbox_read into it or outbox_batch_free). */
typedef struct {
    int n;
    const char **rec;
    size_t *len;
    uint64_t seg;    /* the segment every record of the batch is in */
    uint64_t *end;   /* end[i]: offset in seg just after record i */
    char *buf;
    size_t bufcap;
    int reccap;
} outbox_batch_t;

/* Reads up to max_records records (and about max_bytes of payload, at least one record)
 * from the head of the queue into b, never across a segment boundary. b->n == 0 when
 * nothing is pending. Passing the end of an older segment moves the head to the next one
 * and deletes the older file. Reader thread only. Returns 0 or a negative errno. */
int outbox_read(outbox_t *ob, int max_records, size_t max_bytes, outbox_batch_t *b);

/* Makes the records of b durable (fdatasync of their segment, and of the directory the
 * first time a segment is seen). Reader thread only. Returns 0 or a negative errno. */
int outbox_sync(outbox_t *ob, const outbox_batch_t *b);

/* Acknowledges the first k records of b (the head of the queue): writes the new ack
 * position atomically and drops them from pending. Reader thread only. Returns 0 or a
 * negative errno (the records then stay pending). */
int outbox_ack(outbox_t *ob, const outbox_batch_t *b, int k);

void outbox_batch_free(outbox_batch_t *b);

#endif
