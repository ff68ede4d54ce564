/* Timing arithmetic shared by the daemons: jittered exponential backoff and deadlines on
 * the CLOCK_MONOTONIC millisecond clock of sdutil.h (sd_mono_ms), and the absolute
 * timespec deadlines pthread_cond_timedwait takes. Pure functions, the caller passes
 * `now` and the randomness; only sd_timespec_after_ms reads a clock. */
#ifndef SD_TIME_H
#define SD_TIME_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* The un-jittered delay before retry number `attempt` (0 = after the first failure):
 * min_ms * 2^attempt, capped at max_ms (also when min_ms > max_ms). min_ms <= 0 gives 0
 * (retry at once). Never overflows, however large attempt grows. */
int64_t sd_backoff_step_ms(int64_t min_ms, int64_t max_ms, int attempt);

/* "Equal jitter": half of ms fixed, the other half chosen by rnd, so the result lies in
 * [ms/2, ms]. Spreads retries of many clients that failed at the same moment. */
int64_t sd_jitter_ms(int64_t ms, uint32_t rnd);

/* The jittered backoff: sd_jitter_ms(sd_backoff_step_ms(min_ms, max_ms, attempt), rnd). */
int64_t sd_backoff_ms(int64_t min_ms, int64_t max_ms, int attempt, uint32_t rnd);

/* The deadline timeout_ms after now_ms (a negative timeout counts as 0). */
int64_t sd_deadline_ms(int64_t now_ms, int64_t timeout_ms);

/* Milliseconds from now_ms until deadline_ms, 0 once it has passed. */
int64_t sd_ms_left(int64_t deadline_ms, int64_t now_ms);

/* t plus ms (a negative ms counts as 0), tv_nsec kept below one second. */
struct timespec sd_timespec_add_ms(struct timespec t, int64_t ms);

/* Now on `clock` plus ms: the absolute deadline of a pthread_cond_timedwait whose
 * condition variable uses that clock (CLOCK_MONOTONIC when set with
 * pthread_condattr_setclock, else CLOCK_REALTIME). */
struct timespec sd_timespec_after_ms(clockid_t clock, int64_t ms);

/* The one way a moment is written for people (logs, sdctl, crash report headers; the
 * dashboard writes the same with Date.toISOString): UTC ISO 8601 with milliseconds,
 * "2026-11-28T07:19:46.123Z", for wall-clock epoch milliseconds ms, into buf (at least
 * SD_TIME_ISO_LEN bytes). Returns buf. */
#define SD_TIME_ISO_LEN 32
char *sd_time_iso(int64_t ms, char *buf, size_t cap);

#endif
