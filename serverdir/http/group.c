/* Group commit: see group.h. */
#include <stdio.h>
#include <string.h>

#include "group.h"

/* A call ended: another may start for what queued up meanwhile. */
static void call_done(sd_group_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->busy--;
    int wake = g->head != NULL;
    pthread_mutex_unlock(&g->mu);
    if (wake) /* after the unlock: a woken worker does not block on the mutex at once */
        pthread_cond_signal(&g->cv);
}

/* Takes the oldest job and every later one that may share its call into jobs (under
 * g->mu). Returns how many. */
static int take(sd_group_t *g, sd_group_job_t **jobs)
{
    const char *key = g->key(g->head);
    long left = g->weight_max;
    int n = 0, max = g->jobs_max < SD_GROUP_JOBS_MAX ? g->jobs_max : SD_GROUP_JOBS_MAX;
    for (sd_group_job_t **p = &g->head; *p && n < max && left > 0;) {
        sd_group_job_t *j = *p;
        long w = g->weight(j);
        if (n == 0 || (w <= left && !strcmp(g->key(j), key))) {
            jobs[n++] = j;
            left -= w;
            *p = j->next;
            if (!j->next)
                g->tail = p;
        } else {
            p = &j->next;
        }
    }
    return n;
}

static void *worker_main(void *arg)
{
    sd_group_t *g = arg;
    sd_group_job_t *jobs[SD_GROUP_JOBS_MAX];
    /* named after its group for top -H and perf (it would keep its creator's name,
     * "MHD-worker"); a thread name holds 15 bytes */
    char name[16];
    snprintf(name, sizeof name, "%s", g->name);
    pthread_setname_np(pthread_self(), name);
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->head || g->busy >= g->calls)
            pthread_cond_wait(&g->cv, &g->mu);
        g->busy++;
        int n = take(g, jobs);
        pthread_mutex_unlock(&g->mu);
        g->call(jobs, n);
        call_done(g);
        for (int i = 0; i < n; i++)
            g->finish(jobs[i], 1);
    }
    return NULL;
}

/* Starts the workers on first use (under g->mu). 0, or -1 when none could start. */
static int workers_start(sd_group_t *g)
{
    if (g->started)
        return g->started > 0 ? 0 : -1;
    g->tail = &g->head;
    if (g->calls_at_start)
        g->calls = g->calls_at_start();
    int n = 0;
    for (; n < g->calls; n++) {
        pthread_attr_t attr;
        pthread_t th;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, worker_main, g);
        pthread_attr_destroy(&attr);
        if (rc) {
            log_error("cannot start a group-commit thread", "group=%s errno=%d started=%d",
                      g->name, rc, n);
            break;
        }
    }
    /* with none, every request calls on its own thread */
    g->started = n > 0 ? 1 : -1;
    return n > 0 ? 0 : -1;
}

void sd_group_submit(sd_group_t *g, sd_group_job_t *j)
{
    pthread_mutex_lock(&g->mu);
    if (workers_start(g) < 0) { /* without workers: every call on its own thread */
        pthread_mutex_unlock(&g->mu);
        g->call(&j, 1);
        g->finish(j, 0);
        return;
    }
    sd_req_park(j->req); /* before a worker can see it */
    j->next = NULL;
    *g->tail = j;
    g->tail = &j->next;
    int wake = g->busy < g->calls; /* else call_done signals */
    pthread_mutex_unlock(&g->mu);
    if (wake)
        pthread_cond_signal(&g->cv);
}
