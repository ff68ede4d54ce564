/* Unit tests of the group commit (serverdir/http/group.c) without HTTP: sd_req_park is
 * this file's own, so a job's request is only a name. Every job is parked and called by
 * the group's worker, never on its submitter's thread; what arrives while the calls are
 * busy is taken, oldest first, in calls of one key within the job and weight budgets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "group.h"

/* The requests parked by the group (a job's req points at its name). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char parked_log[256], calls_log[256], finish_log[256];
static atomic_int finished;

void sd_req_park(sd_req_t *req)
{
    pthread_mutex_lock(&mu);
    strcat(parked_log, (const char *)req);
    strcat(parked_log, " ");
    pthread_mutex_unlock(&mu);
}

typedef struct {
    sd_group_job_t g; /* first */
    char name[8]; /* its key: "y" for y..., else "x"; X... weighs the whole budget */
} job_t;

static const char *key_of(const sd_group_job_t *j)
{
    return ((const job_t *)j)->name[0] == 'y' ? "y" : "x";
}

static long weight_of(const sd_group_job_t *j) { return ((const job_t *)j)->name[0] == 'X' ? 10 : 1; }

/* The first call blocks until the gate opens, so that the others queue behind it. */
static atomic_int gate_open, first_call_in;

static void call(sd_group_job_t **jobs, int n)
{
    if (!atomic_exchange(&first_call_in, 1))
        while (!atomic_load(&gate_open))
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    pthread_mutex_lock(&mu);
    strcat(calls_log, "[");
    for (int i = 0; i < n; i++) {
        strcat(calls_log, ((job_t *)jobs[i])->name);
        if (i + 1 < n)
            strcat(calls_log, " ");
    }
    strcat(calls_log, "]");
    pthread_mutex_unlock(&mu);
}

static void finish(sd_group_job_t *j, int parked)
{
    pthread_mutex_lock(&mu);
    char one[32];
    snprintf(one, sizeof one, "%s:%d ", ((job_t *)j)->name, parked);
    strcat(finish_log, one);
    pthread_mutex_unlock(&mu);
    atomic_fetch_add(&finished, 1);
}

static sd_group_t group = {.name = "test",
                           .calls = 1,
                           .jobs_max = 3,
                           .weight_max = 10,
                           .key = key_of,
                           .weight = weight_of,
                           .call = call,
                           .finish = finish,
                           SD_GROUP_STATE};

static job_t jobs[] = {{.name = "a0"}, {.name = "x1"}, {.name = "y1"}, {.name = "X2"},
                       {.name = "x3"}, {.name = "x4"}, {.name = "x5"}};

/* Waits up to 5 s for n jobs finished. */
static void wait_finished(int n)
{
    for (int i = 0; i < 5000 && atomic_load(&finished) < n; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_int_equal(atomic_load(&finished), n);
}

static void groups_in_order_by_key_and_budget(void **state)
{
    (void)state;
    /* a0, alone, is parked and called by the worker: its submit returns while the call
     * is still held at the gate (the submitter, an HTTP thread, never waits on Redis) */
    jobs[0].g.req = (sd_req_t *)jobs[0].name;
    sd_group_submit(&group, &jobs[0].g);
    while (!atomic_load(&first_call_in)) /* a0 holds the only call */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    for (size_t i = 1; i < sizeof jobs / sizeof *jobs; i++) {
        jobs[i].g.req = (sd_req_t *)jobs[i].name;
        sd_group_submit(&group, &jobs[i].g); /* queued: returns at once */
    }
    assert_string_equal(parked_log, "a0 x1 y1 X2 x3 x4 x5 ");
    assert_int_equal(atomic_load(&finished), 0);
    atomic_store(&gate_open, 1);
    wait_finished(7);
    /* a0 alone; then, oldest first: x1 with the x jobs that fit (three at most, X2 over
     * the weight budget), y1, X2 alone, the x job left */
    assert_string_equal(calls_log, "[a0][x1 x3 x4][y1][X2][x5]");
    /* every job finished once, in call order, each parked */
    assert_string_equal(finish_log, "a0:1 x1:1 x3:1 x4:1 y1:1 X2:1 x5:1 ");

    /* idle again: the next job is parked and called by the worker too */
    job_t late = {.name = "x6"};
    late.g.req = (sd_req_t *)late.name;
    sd_group_submit(&group, &late.g);
    assert_string_equal(parked_log, "a0 x1 y1 X2 x3 x4 x5 x6 ");
    wait_finished(8);
    assert_string_equal(calls_log, "[a0][x1 x3 x4][y1][X2][x5][x6]");
    assert_string_equal(finish_log, "a0:1 x1:1 x3:1 x4:1 y1:1 X2:1 x5:1 x6:1 ");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(groups_in_order_by_key_and_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
