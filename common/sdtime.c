/* Backoff and deadline arithmetic, and the written form of a moment; see sdtime.h. */
#include "sdtime.h"

#include <stdio.h>

int64_t sd_backoff_step_ms(int64_t min_ms, int64_t max_ms, int attempt)
{
    if (min_ms <= 0)
        return 0;
    int64_t d = min_ms;
    for (int i = 0; i < attempt && d < max_ms; i++)
        d *= 2;
    return d > max_ms ? max_ms : d;
}

int64_t sd_jitter_ms(int64_t ms, uint32_t rnd)
{
    if (ms <= 0)
        return 0;
    int64_t half = ms / 2;
    return half + (int64_t)((uint64_t)rnd % (uint64_t)(ms - half + 1));
}

int64_t sd_backoff_ms(int64_t min_ms, int64_t max_ms, int attempt, uint32_t rnd)
{
    return sd_jitter_ms(sd_backoff_step_ms(min_ms, max_ms, attempt), rnd);
}

int64_t sd_deadline_ms(int64_t now_ms, int64_t timeout_ms)
{
    return timeout_ms > 0 ? now_ms + timeout_ms : now_ms;
}

int64_t sd_ms_left(int64_t deadline_ms, int64_t now_ms)
{
    return deadline_ms > now_ms ? deadline_ms - now_ms : 0;
}

struct timespec sd_timespec_add_ms(struct timespec t, int64_t ms)
{
    if (ms < 0)
        ms = 0;
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

struct timespec sd_timespec_after_ms(clockid_t clock, int64_t ms)
{
    struct timespec now;
    clock_gettime(clock, &now);
    return sd_timespec_add_ms(now, ms);
}

char *sd_time_iso(int64_t ms, char *buf, size_t cap)
{
    time_t secs = (time_t)(ms / 1000);
    int milli = (int)(ms % 1000);
    if (milli < 0) { /* before 1970: the second below, plus the milliseconds after it */
        secs--;
        milli += 1000;
    }
    struct tm tm;
    if (!gmtime_r(&secs, &tm))
        snprintf(buf, cap, "%lld", (long long)ms);
    else
        snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, milli);
    return buf;
}
