/* Parked requests (park.c): one thread holds every request that waits for a change (lock
 * waits, assignment long-polls) and answers each when its change comes, its retry time or
 * deadline passes, or serverdir stops.
 *
 * A module describes its kind of wait once, in a static sd_park_kind_t: how to try an
 * entry (read the state, answer if it moved) and, optionally, a wake-up source: a file
 * descriptor the thread polls (a Redis subscriber, a blocking list pop) with the callbacks
 * that keep it connected and turn what it reads into sd_park_wake calls. Every callback
 * runs on the park thread, so a kind's source state and its entries' contexts need no
 * lock, and Redis calls there use the park thread's own connection. */
#ifndef SD_PARK_H
#define SD_PARK_H

#include <stdatomic.h>
#include <stdint.h>

#include "sd.h"

typedef struct sd_park_kind {
    /* Tries the entry: fills resp and returns 1 to answer, or returns 0 to go on waiting,
     * optionally setting *retry_at_ms (monotonic ms, 0: none) for an attempt without a
     * wake-up. due: the deadline passed or serverdir stops, so it must answer now. */
    int (*try_answer)(void *ctx, sd_resp_t *resp, int due, int64_t *retry_at_ms);
    /* Frees ctx once its request is answered. */
    void (*release)(void *ctx);
    /* The wake-up source, all optional (NULL: the kind only wakes on time). */
    void (*source_prepare)(int64_t now_ms); /* before each poll: (re)connect, (re)send */
    int (*source_fd)(void);                 /* the fd to poll for reading, -1 for none */
    void (*source_ready)(void);             /* that fd is readable (or hung up) */
} sd_park_kind_t;

/* Parks req (whose answer goes into resp) as an entry of kind with ctx until deadline_ms
 * (monotonic). The entry is tried once when the park thread takes it over, so a change
 * between the caller's own check and the park is never missed. Returns 0; or -1 when the
 * park thread cannot start, with resp untouched, req not parked and ctx still the
 * caller's. */
int sd_park(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
            int64_t deadline_ms);
/* sd_park for a request its handler parked already (sd_req_park) and another thread now
 * hands over (api_alloc.c: an allocation that found nothing and may wait). On -1 the
 * caller still owns ctx and must answer and resume req itself. */
int sd_park_suspended(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
                      int64_t deadline_ms);

/* Park thread only (kind callbacks): marks the entries of kind for which match(ctx, arg)
 * is true (every entry when match is NULL) to be tried before the next poll. match sees
 * only entries not marked yet, oldest first (so a match that counts wakes the oldest). */
void sd_park_wake(const sd_park_kind_t *kind, int (*match)(void *ctx, void *arg), void *arg);

/* Park thread only: calls fn(ctx, arg) for each waiting entry of kind. */
void sd_park_each(const sd_park_kind_t *kind, void (*fn)(void *ctx, void *arg), void *arg);

/* A Redis channel subscriber as a kind's wake-up source (assign_wait.c, events_wait.c):
 * kept connected (one attempt every 500 ms while it is down), each message's payload
 * handed to on_message, and on_gap called (by default: every entry of kind woken) when
 * it (re)connects or is lost, as messages may have been missed meanwhile. A static per kind; its functions run on
 * the park thread only (from the kind's source callbacks). */
typedef struct {
    const sd_park_kind_t *kind;
    const char *what;                              /* in its log lines: "events" */
    const char *(*channel)(char *buf, size_t cap); /* the channel's name */
    void (*on_message)(const char *payload);
    void (*on_gap)(void); /* on a (re)connect or loss; NULL: every entry of kind woken */
    redisContext *c;      /* NULL while down */
    int64_t next_try_ms;
} sd_park_sub_t;

void sd_park_sub_prepare(sd_park_sub_t *s, int64_t now_ms);
int sd_park_sub_fd(const sd_park_sub_t *s); /* -1 while down */
void sd_park_sub_read(sd_park_sub_t *s);
int sd_park_sub_up(const sd_park_sub_t *s);

/* sd_park for a kind whose waiters are capped: *n counts them (the kind's release must
 * decrement it). Past max it answers 429 too_many_waiters (Retry-After: 1) naming what,
 * and 503 when the park thread cannot start; ctx is freed then. 0 when parked. */
int sd_park_capped(const sd_park_kind_t *kind, sd_req_t *req, sd_resp_t *resp, void *ctx,
                   int64_t deadline_ms, atomic_int *n, int max, const char *what);

#endif
