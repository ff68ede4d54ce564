/* Group commit (group.c): requests whose work is one Redis script call each, where most
 * of a call's cost is per call (the round trip, the script's start, its shared reads and
 * writes), share calls when they arrive faster than the calls run.
 *
 * Every request is parked (sd_req_park) and queued; `calls` worker threads each take,
 * as soon as a call is free, the oldest job and every later one that may share its call
 * (same key, within the weight budget), make one call for them and finish each. Nothing
 * waits on a timer: a group is only what queued up while the calls in flight ran, and a
 * request alone makes a call alone.
 *
 * An HTTP thread never makes the call itself. It used to, for a request that found
 * nothing queued and a call free (the cheapest path below saturation), but that call
 * held the thread's other connections until Redis answered: libmicrohttpd spreads
 * connections unevenly over its threads, and the threads that held most of them took
 * turns calling one request at a time while their other requests waited unread, with
 * nothing queued to batch (bench/README.md, "HTTP threads that never wait for a lock
 * call").
 *
 * A module describes its kind of group once, in a static sd_group_t, and embeds an
 * sd_group_job_t first in its own job struct. */
#ifndef SD_GROUP_H
#define SD_GROUP_H

#include <pthread.h>

#include "sd.h"

#define SD_GROUP_JOBS_MAX 64

typedef struct sd_group_job {
    struct sd_group_job *next;
    sd_req_t *req; /* its request (parked while queued) */
} sd_group_job_t;

typedef struct sd_group {
    const char *name; /* for logs: "allocations" */
    int calls;        /* calls in flight at most, and worker threads */
    /* When set, replaces calls at first use (when the store's mode is known). */
    int (*calls_at_start)(void);
    int jobs_max;     /* jobs in one call at most (up to SD_GROUP_JOBS_MAX) */
    long weight_max;  /* sum of the jobs' weights in one call at most (the first job always goes) */
    /* The key jobs must share to share a call (the cluster). */
    const char *(*key)(const sd_group_job_t *j);
    /* Its weight (>= 1): a job of weight_max has a call of its own. */
    long (*weight)(const sd_group_job_t *j);
    /* One call for jobs[0..n) (one key); each job keeps its own result. */
    void (*call)(sd_group_job_t **jobs, int n);
    /* Answers j from its result, resumes its request when parked (queued), frees j. */
    void (*finish)(sd_group_job_t *j, int parked);

    /* state, zero-initialized (SD_GROUP_STATE) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sd_group_job_t *head, **tail;
    int busy;       /* calls in flight */
    int started;    /* 1: workers started, -1: none could start */
} sd_group_t;

#define SD_GROUP_STATE                                                                 \
    .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .head = NULL,     \
    .tail = NULL, .busy = 0, .started = 0

/* Parks j's request and queues j for a worker (finished there, parked 1); only when no
 * worker could start, runs the call at once on this thread (finished here, parked 0).
 * j->req must be set; j belongs to g's callbacks from here on. */
void sd_group_submit(sd_group_t *g, sd_group_job_t *j);

#endif
