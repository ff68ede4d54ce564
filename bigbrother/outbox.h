/* The outbox: an append-only, crash-safe queue of records on disk (internal to bigbrother).
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
#ifndef BB_OUTBOX_H
#define BB_OUTBOX_H

#include <stddef.h>
#include <stdint.h>

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
