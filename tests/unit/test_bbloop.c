/* bigbrother's loop: the timer heap fires every armed deadline once, in time order,
 * never a cancelled one, and re-arming moves a deadline; the loop sleeps in epoll until
 * the earliest deadline (no busy wait). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "core/bb.h"

#define N 300

static bb_timer_t timers[N];
static int64_t fired_at[N];
static int order[N], nfired;
static bb_timer_t last;

static void on_fire(bb_timer_t *t)
{
    int i = (int)(t - timers);
    fired_at[i] = t->at;
    order[nfired++] = i;
}

static void on_last(bb_timer_t *t)
{
    bb_loop_quit(SIGTERM);
}

static void heap_fires_in_order(void **state)
{
    assert_int_equal(bb_loop_init(), 0);
    srand(42);
    int64_t now = sd_mono_ms();
    int cancelled[N] = {0};
    for (int i = 0; i < N; i++) {
        timers[i].fn = on_fire;
        bb_timer_set(&timers[i], now + 20 + rand() % 200);
    }
    for (int i = 0; i < N; i += 7) { /* cancel some */
        bb_timer_cancel(&timers[i]);
        cancelled[i] = 1;
    }
    for (int i = 3; i < N; i += 11) { /* move some, earlier or later */
        if (cancelled[i])
            continue;
        bb_timer_set(&timers[i], now + 20 + rand() % 200);
    }
    bb_timer_cancel(&timers[0]); /* cancelling twice is harmless */
    last.fn = on_last;
    bb_timer_set(&last, now + 300);

    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    assert_int_equal(bb_loop_run(), SIGTERM);
    getrusage(RUSAGE_SELF, &ru1);
    int64_t took = sd_mono_ms() - now;
    assert_true(took >= 300);

    int expect = 0;
    for (int i = 0; i < N; i++)
        expect += !cancelled[i];
    assert_int_equal(nfired, expect);
    for (int k = 0; k < nfired; k++) {
        assert_false(cancelled[order[k]]);
        assert_int_equal(timers[order[k]].idx, 0);
        if (k)
            assert_true(fired_at[order[k - 1]] <= fired_at[order[k]]);
    }
    /* 300 ms of waiting cost far less than 300 ms of CPU: the loop slept */
    long cpu_us = (ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) * 1000000L +
                  (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) +
                  (ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) * 1000000L +
                  (ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec);
    assert_true(cpu_us < 100000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(heap_fires_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
