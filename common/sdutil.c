#include "sdutil.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t sd_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t sd_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t sd_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sd_buf_init(sd_buf_t *b, size_t max)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->max = max;
    b->borrowed = 0;
}

void sd_buf_use(sd_buf_t *b, char *mem, size_t cap, size_t max)
{
    b->data = mem;
    b->data[0] = '\0';
    b->len = 0;
    b->cap = cap;
    b->max = max;
    b->borrowed = 1;
}

static int buf_reserve(sd_buf_t *b, size_t extra)
{
    if (extra > b->max || b->len > b->max - extra)
        return -E2BIG;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < need)
        ncap *= 2;
    char *p = b->borrowed ? malloc(ncap) : realloc(b->data, ncap);
    if (!p)
        return -ENOMEM;
    if (b->borrowed)
        memcpy(p, b->data, b->len + 1);
    b->borrowed = 0;
    b->data = p;
    b->cap = ncap;
    return 0;
}

int sd_buf_append(sd_buf_t *b, const void *p, size_t n)
{
    int rc = buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int sd_buf_printf(sd_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    int rc = buf_reserve(b, (size_t)n);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void sd_buf_reset(sd_buf_t *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void sd_buf_free(sd_buf_t *b)
{
    if (!b->borrowed)
        free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->borrowed = 0;
}

void sd_hex_encode(char *out, const unsigned char *raw, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[2 * n] = '\0';
}

int sd_random_hex(char *out, size_t nbytes)
{
    unsigned char raw[64];
    if (nbytes > sizeof raw)
        return -EINVAL;
    size_t got = 0;
    while (got < nbytes) {
        ssize_t r = getrandom(raw + got, nbytes - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)r;
    }
    sd_hex_encode(out, raw, nbytes);
    return 0;
}

int sd_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (!s || !*s)
        return -EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || end == s)
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

int sd_parse_hostport(const char *s, char *host, size_t hostcap, int *port)
{
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':')
            return -EINVAL;
        h = s + 1;
        hlen = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return -EINVAL;
        hlen = (size_t)(colon - s);
        if (memchr(s, ':', hlen)) /* bare IPv6 without brackets */
            return -EINVAL;
    }
    if (hlen >= hostcap)
        return -EINVAL;
    int64_t p;
    if (sd_parse_i64(colon + 1, 1, 65535, &p))
        return -EINVAL;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return 0;
}

int sd_read_file(const char *path, size_t max, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = sd_read_fd(fd, max, out, len);
    close(fd);
    return rc;
}

int sd_read_fd(int fd, size_t max, char **out, size_t *len)
{
    sd_buf_t b;
    sd_buf_init(&b, max);
    int rc = sd_buf_append(&b, "", 0);
    char chunk[8192];
    while (rc == 0) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        if (r == 0)
            break;
        rc = sd_buf_append(&b, chunk, (size_t)r);
    }
    if (rc) {
        sd_buf_free(&b);
        return rc;
    }
    *out = b.data;
    if (len)
        *len = b.len;
    return 0;
}

size_t sd_strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = strlen(src);
    if (cap) {
        size_t c = n < cap - 1 ? n : cap - 1;
        memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return n;
}

int sd_socket_bind(const char *host, int port, int type, void (*prepare)(int fd))
{
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = type, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai;
    if (getaddrinfo(host[0] ? host : NULL, portstr, &hints, &ai) != 0)
        return -EADDRNOTAVAIL;
    int fd = -1, err = -EADDRNOTAVAIL;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (prepare)
            prepare(fd);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        err = -errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd < 0 ? err : fd;
}

char *sd_fmt_i64(char buf[SD_I64_DIGITS], int64_t v)
{
    char *p = buf + SD_I64_DIGITS;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do
        *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0)
        *--p = '-';
    return p;
}
