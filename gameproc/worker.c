/* An off-tick worker: one thread that runs blocking jobs (ServerDir calls) in the order
 * they were submitted, so the tick loop never waits on the network.
 *
 * The loop thread submits a job and later reaps it: gp_worker_reap calls each finished
 * job's done callback on the loop thread. Jobs are owned by the submitter (usually
 * embedded in a module's own state): the worker never allocates or frees one, and a job
 * is the worker's from submit until its done callback returns. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gameproc.h"
#include "sdlog.h"
#include "sdtime.h"

struct gp_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gp_job_t *todo_head, *todo_tail;  /* submitted, not started */
    gp_job_t *done_head, *done_tail;  /* run, waiting for the loop to reap them */
    gp_job_t *running;
    int quit;
    int exited;
};

static void push(gp_job_t **head, gp_job_t **tail, gp_job_t *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static gp_job_t *pop(gp_job_t **head, gp_job_t **tail)
{
    gp_job_t *j = *head;
    if (j) {
        *head = j->next;
        if (!*head)
            *tail = NULL;
        j->next = NULL;
    }
    return j;
}

static void *worker_main(void *arg)
{
    gp_worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->quit && !w->todo_head)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit)
            break;
        gp_job_t *j = pop(&w->todo_head, &w->todo_tail);
        w->running = j;
        pthread_mutex_unlock(&w->mu);
        j->run(j);
        pthread_mutex_lock(&w->mu);
        w->running = NULL;
        push(&w->done_head, &w->done_tail, j);
        pthread_cond_broadcast(&w->cv);
    }
    w->exited = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

gp_worker_t *gp_worker_new(void)
{
    gp_worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* The stop signals stay with the loop's signalfd: they are blocked in the loop
     * thread already, and the new thread inherits that mask. */
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
}

void gp_worker_submit(gp_worker_t *w, gp_job_t *j)
{
    pthread_mutex_lock(&w->mu);
    push(&w->todo_head, &w->todo_tail, j);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int gp_worker_reap(gp_worker_t *w, gp_t *gp)
{
    pthread_mutex_lock(&w->mu);
    gp_job_t *list = w->done_head;
    w->done_head = w->done_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    int n = 0;
    while (list) {
        gp_job_t *j = list;
        list = j->next;
        j->next = NULL;
        j->done(gp, j);
        n++;
    }
    return n;
}

int gp_worker_free(gp_worker_t *w, int64_t wait_ms)
{
    if (!w)
        return 0;
    struct timespec until = sd_timespec_after_ms(CLOCK_MONOTONIC, wait_ms);
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    int r = 0;
    while (!w->exited && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&w->cv, &w->mu, &until);
    int exited = w->exited;
    pthread_mutex_unlock(&w->mu);
    if (!exited) {
        /* A request is still in the air (ServerDir slow or down): the process is about
         * to exit, so leave the thread to die with it rather than wait. */
        log_warn("worker still busy at exit", "wait_ms=%lld", (long long)wait_ms);
        pthread_detach(w->thread);
        return -EBUSY;
    }
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
    return 0;
}
