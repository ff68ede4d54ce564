#include "sdlog.h"
#include "sdtime.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum sd_log_level min_level = SD_LOG_INFO;
static int log_fd = 2;

void sd_log_set_level(enum sd_log_level lvl) { min_level = lvl; }
void sd_log_set_fd(int fd) { log_fd = fd; }

int sd_log_parse_level(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

struct out {
    char *p;
    size_t len, cap;
};

static void put(struct out *o, const char *s, size_t n)
{
    if (o->cap == 0)
        return;
    size_t room = o->cap - 1 - o->len;
    if (n > room)
        n = room;
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = '\0';
}

static int needs_quote(const char *s, size_t n)
{
    if (n == 0)
        return 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f)
            return 1;
    }
    return 0;
}

/* Appends s as a logfmt value: bare when safe, else quoted with \" \\ \n \t and \xNN
 * escapes, so one log line can never be split or forged by a value. */
static void put_value(struct out *o, const char *s, size_t n)
{
    if (!needs_quote(s, n)) {
        put(o, s, n);
        return;
    }
    put(o, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[5];
        switch (c) {
        case '"': put(o, "\\\"", 2); break;
        case '\\': put(o, "\\\\", 2); break;
        case '\n': put(o, "\\n", 2); break;
        case '\t': put(o, "\\t", 2); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                snprintf(esc, sizeof esc, "\\x%02x", c);
                put(o, esc, 4);
            } else {
                put(o, (const char *)&s[i], 1);
            }
        }
    }
    put(o, "\"", 1);
}

size_t sd_logfmt_format(char *buf, size_t cap, const char *f, va_list ap)
{
    struct out o = {buf, 0, cap};
    if (cap)
        buf[0] = '\0';
    while (*f) {
        const char *pct = strchr(f, '%');
        if (!pct) {
            put(&o, f, strlen(f));
            break;
        }
        put(&o, f, (size_t)(pct - f));
        f = pct + 1;
        int prec = -1, lng = 0, sz = 0;
        if (f[0] == '.' && f[1] == '*') {
            prec = va_arg(ap, int);
            f += 2;
        }
        while (*f == 'l') {
            lng++;
            f++;
        }
        if (*f == 'z') {
            sz = 1;
            f++;
        }
        char tmp[64];
        int n = 0;
        switch (*f) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s)
                s = "(null)";
            /* With a precision the argument need not be NUL-terminated. */
            size_t len = prec >= 0 ? strnlen(s, (size_t)prec) : strlen(s);
            put_value(&o, s, len);
            break;
        }
        case 'c': {
            char c = (char)va_arg(ap, int);
            put_value(&o, &c, 1);
            break;
        }
        case 'd':
        case 'i':
            if (sz)
                n = snprintf(tmp, sizeof tmp, "%zd", va_arg(ap, ssize_t));
            else if (lng >= 2)
                n = snprintf(tmp, sizeof tmp, "%lld", va_arg(ap, long long));
            else if (lng == 1)
                n = snprintf(tmp, sizeof tmp, "%ld", va_arg(ap, long));
            else
                n = snprintf(tmp, sizeof tmp, "%d", va_arg(ap, int));
            break;
        case 'u':
        case 'o':
        case 'x': {
            char conv = *f;
            unsigned long long v;
            if (sz)
                v = va_arg(ap, size_t);
            else if (lng >= 2)
                v = va_arg(ap, unsigned long long);
            else if (lng == 1)
                v = va_arg(ap, unsigned long);
            else
                v = va_arg(ap, unsigned int);
            if (conv == 'x')
                n = snprintf(tmp, sizeof tmp, "%llx", v);
            else if (conv == 'o')
                n = snprintf(tmp, sizeof tmp, "%llo", v);
            else
                n = snprintf(tmp, sizeof tmp, "%llu", v);
            break;
        }
        case 'f':
            n = snprintf(tmp, sizeof tmp, "%.3f", va_arg(ap, double));
            break;
        case 'g':
            n = snprintf(tmp, sizeof tmp, "%g", va_arg(ap, double));
            break;
        case 'p':
            n = snprintf(tmp, sizeof tmp, "%p", va_arg(ap, void *));
            break;
        case '%':
            put(&o, "%", 1);
            break;
        default: /* unknown conversion: print it literally, consume nothing */
            put(&o, "%", 1);
            if (*f)
                put(&o, f, 1);
            break;
        }
        if (n > 0)
            put(&o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
        if (*f)
            f++;
    }
    return o.len;
}

/* Writes one line; ap may be NULL when there is no key/value part. */
static void emit(enum sd_log_level lvl, const char *msg, const char *kvfmt, va_list *ap)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (lvl < min_level)
        return;
    int saved = errno;
    char line[2048];
    struct timespec ts;
    char when[SD_TIME_ISO_LEN];
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf(line, sizeof line, "ts=%s level=%s msg=",
                     sd_time_iso((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, when,
                                 sizeof when),
                     names[lvl]);
    struct out o = {line, (size_t)n, sizeof line - 1}; /* keep room for '\n' */
    put_value(&o, msg, strlen(msg));
    if (ap && kvfmt && *kvfmt) {
        put(&o, " ", 1);
        o.len += sd_logfmt_format(line + o.len, o.cap - o.len, kvfmt, *ap);
    }
    line[o.len++] = '\n';
    ssize_t w = write(log_fd, line, o.len);
    (void)w;
    errno = saved;
}

void sd_vlog(enum sd_log_level lvl, const char *msg, const char *kvfmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    emit(lvl, msg, kvfmt, &copy);
    va_end(copy);
}

void sd_log(enum sd_log_level lvl, const char *msg, const char *kvfmt, ...)
{
    va_list ap;
    va_start(ap, kvfmt);
    sd_vlog(lvl, msg, kvfmt, ap);
    va_end(ap);
}

void sd_log_msg(enum sd_log_level lvl, const char *msg)
{
    emit(lvl, msg, NULL, NULL);
}

void sd_die(int code, const char *msg, const char *kvfmt, ...)
{
    va_list ap;
    va_start(ap, kvfmt);
    sd_vlog(SD_LOG_ERROR, msg, kvfmt, ap);
    va_end(ap);
    exit(code);
}
