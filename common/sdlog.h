/* Logging in logfmt: one line per event, `ts=... level=... msg="..." key=value ...`.
 *
 * The key/value part is a printf format, but every %s value is quoted and escaped as
 * logfmt requires when it holds spaces, quotes, '=' or control characters, so values
 * that come from outside can be logged as they are. Supported conversions: %s %c %d %i
 * %u %x %f %g %p %% with the length modifiers l, ll, z and the precision form %.*s.
 * Each line is written with one write(2), so lines from several threads never mix. */
#ifndef SD_LOG_H
#define SD_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum sd_log_level { SD_LOG_DEBUG, SD_LOG_INFO, SD_LOG_WARN, SD_LOG_ERROR };

void sd_log_set_level(enum sd_log_level lvl);
/* Parses "debug", "info", "warn" or "error"; returns -1 if it is none of them. */
int sd_log_parse_level(const char *s);
/* Sends lines to fd instead of stderr (tests). */
void sd_log_set_fd(int fd);

void sd_log(enum sd_log_level lvl, const char *msg, const char *kvfmt, ...)
    __attribute__((format(printf, 3, 4)));
void sd_vlog(enum sd_log_level lvl, const char *msg, const char *kvfmt, va_list ap);

/* Formats kvfmt into out (NUL-terminated, truncated to cap) with logfmt quoting of %s
 * values; returns the length written. Exposed for unit tests. */
size_t sd_logfmt_format(char *out, size_t cap, const char *kvfmt, va_list ap);

/* A line with no key/value part. */
void sd_log_msg(enum sd_log_level lvl, const char *msg);

#define log_debug(msg, ...) sd_log(SD_LOG_DEBUG, msg, __VA_ARGS__)
#define log_info(msg, ...) sd_log(SD_LOG_INFO, msg, __VA_ARGS__)
#define log_warn(msg, ...) sd_log(SD_LOG_WARN, msg, __VA_ARGS__)
#define log_error(msg, ...) sd_log(SD_LOG_ERROR, msg, __VA_ARGS__)

/* Logs the message at error level and exits with code. Daemons leave through here:
 * 100 usage/config error, 111 system error (s6 conventions). */
void sd_die(int code, const char *msg, const char *kvfmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#define SD_EXIT_USAGE 100
#define SD_EXIT_SYSTEM 111

/* Exit codes of the command-line tools, sdctl and bbctl (documented in their --help and
 * docs/operations.md). "The service" is ServerDir for sdctl, the local bigbrother for
 * bbctl. */
enum {
    CTL_EXIT_OK = 0,
    CTL_EXIT_FAILED = 1,      /* the service refused the request (4xx other than below) */
    CTL_EXIT_USAGE = 2,       /* bad command line */
    CTL_EXIT_UNAVAILABLE = 3, /* the service is unreachable, or 5xx */
    CTL_EXIT_NOT_FOUND = 4,   /* 404, no such instance */
    CTL_EXIT_CONFLICT = 5,    /* 409: held, fenced, stale, no capacity to allocate */
    CTL_EXIT_AUTH = 6,        /* 401/403 */
};

#endif
