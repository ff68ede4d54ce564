/* The shared timing arithmetic (common/sdtime.c): exponential backoff, its jitter, and
 * deadlines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <cmocka.h>

#include "sdtime.h"

static void backoff_grows_with_jitter_and_caps(void **state)
{
    (void)state;
    /* zero minimum: restart at once (for measurements) */
    assert_int_equal(sd_backoff_ms(0, 30000, 5, 12345), 0);
    /* attempt n: delay in [d/2, d] where d = min * 2^n, capped at max */
    for (int attempt = 0; attempt < 12; attempt++) {
        int64_t d = 100LL << attempt;
        if (d > 30000)
            d = 30000;
        int64_t lo = INT64_MAX, hi = 0;
        for (uint32_t r = 0; r < 2000; r++) {
            int64_t v = sd_backoff_ms(100, 30000, attempt, r * 2654435761u);
            assert_true(v >= d / 2 && v <= d);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        assert_true(hi - lo >= d / 4); /* the jitter spreads restarts */
    }
    assert_int_equal(sd_backoff_ms(100, 30000, 1000, 0), 15000); /* no overflow */
    assert_int_equal(sd_backoff_ms(100, 100, 3, 7), 50 + 7 % 51);
}

static void backoff_step_doubles_up_to_the_cap(void **state)
{
    (void)state;
    assert_int_equal(sd_backoff_step_ms(500, 10000, 0), 500);
    assert_int_equal(sd_backoff_step_ms(500, 10000, 1), 1000);
    assert_int_equal(sd_backoff_step_ms(500, 10000, 4), 8000);
    assert_int_equal(sd_backoff_step_ms(500, 10000, 5), 10000);
    assert_int_equal(sd_backoff_step_ms(500, 10000, 1 << 30), 10000); /* no overflow */
    assert_int_equal(sd_backoff_step_ms(100, 30, 0), 30); /* a cap below the minimum wins */
    assert_int_equal(sd_backoff_step_ms(0, 30000, 7), 0);
    assert_int_equal(sd_backoff_step_ms(-5, 30000, 7), 0);
}

static void jitter_stays_in_the_upper_half(void **state)
{
    (void)state;
    assert_int_equal(sd_jitter_ms(0, 99), 0);
    assert_int_equal(sd_jitter_ms(1, 0), 0);
    assert_int_equal(sd_jitter_ms(1, 1), 1);
    assert_int_equal(sd_jitter_ms(101, 0), 50);
    assert_int_equal(sd_jitter_ms(101, 51), 101); /* the top of the range is reachable */
    assert_int_equal(sd_jitter_ms(101, 52), 50);
    for (uint32_t r = 0; r < 5000; r++) {
        int64_t v = sd_jitter_ms(1000, r * 2654435761u);
        assert_true(v >= 500 && v <= 1000);
    }
}

static void deadlines_and_time_left(void **state)
{
    (void)state;
    assert_int_equal(sd_deadline_ms(1000, 250), 1250);
    assert_int_equal(sd_deadline_ms(1000, 0), 1000);
    assert_int_equal(sd_deadline_ms(1000, -5), 1000);
    assert_int_equal(sd_ms_left(1250, 1000), 250);
    assert_int_equal(sd_ms_left(1000, 1000), 0);
    assert_int_equal(sd_ms_left(1000, 1250), 0); /* passed: clamped, never negative */
}

static void timespec_deadlines_carry_the_milliseconds(void **state)
{
    (void)state;
    struct timespec t = {.tv_sec = 10, .tv_nsec = 999000000L};
    struct timespec d = sd_timespec_add_ms(t, 1);
    assert_int_equal(d.tv_sec, 11);
    assert_int_equal(d.tv_nsec, 0);
    d = sd_timespec_add_ms(t, 2500);
    assert_int_equal(d.tv_sec, 13);
    assert_int_equal(d.tv_nsec, 499000000L);
    d = sd_timespec_add_ms(t, 0);
    assert_int_equal(d.tv_sec, 10);
    assert_int_equal(d.tv_nsec, 999000000L);
    d = sd_timespec_add_ms(t, -5); /* a negative wait is no wait */
    assert_int_equal(d.tv_sec, 10);
    assert_int_equal(d.tv_nsec, 999000000L);
    d = sd_timespec_add_ms((struct timespec){.tv_sec = 0, .tv_nsec = 0}, 86400000LL * 365);
    assert_int_equal(d.tv_sec, 86400LL * 365);
    assert_int_equal(d.tv_nsec, 0);
    /* now on the clock plus ms: between the clock read before and after, plus ms */
    struct timespec before, after;
    clock_gettime(CLOCK_MONOTONIC, &before);
    d = sd_timespec_after_ms(CLOCK_MONOTONIC, 1500);
    clock_gettime(CLOCK_MONOTONIC, &after);
    int64_t ns = (int64_t)d.tv_sec * 1000000000 + d.tv_nsec;
    assert_true(ns >= (int64_t)before.tv_sec * 1000000000 + before.tv_nsec + 1500000000LL);
    assert_true(ns <= (int64_t)after.tv_sec * 1000000000 + after.tv_nsec + 1500000000LL);
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
}

/* The one written form of a moment: UTC ISO 8601 with milliseconds, before 1970 too. */
static void moments_in_iso_with_milliseconds(void **state)
{
    (void)state;
    char buf[SD_TIME_ISO_LEN];
    assert_string_equal(sd_time_iso(1795850996548, buf, sizeof buf), "2026-11-28T07:29:56.548Z");
    assert_string_equal(sd_time_iso(0, buf, sizeof buf), "1970-01-01T00:00:00.000Z");
    assert_string_equal(sd_time_iso(-1, buf, sizeof buf), "1969-12-31T23:59:59.999Z");
    assert_string_equal(sd_time_iso(1000, buf, sizeof buf), "1970-01-01T00:00:01.000Z");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(backoff_grows_with_jitter_and_caps),
        cmocka_unit_test(backoff_step_doubles_up_to_the_cap),
        cmocka_unit_test(jitter_stays_in_the_upper_half),
        cmocka_unit_test(deadlines_and_time_left),
        cmocka_unit_test(timespec_deadlines_carry_the_milliseconds),
        cmocka_unit_test(moments_in_iso_with_milliseconds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
