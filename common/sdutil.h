/* Small utilities shared by the daemons, sdctl and the tests (not by libbbagent,
 * which stays libc-only and allocation-free). */
#ifndef SD_UTIL_H
#define SD_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define SD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Milliseconds on CLOCK_MONOTONIC (for deadlines) and CLOCK_REALTIME (for timestamps). */
int64_t sd_mono_ms(void);
int64_t sd_mono_us(void);
int64_t sd_wall_ms(void);

/* A growable byte buffer with a hard cap: appends past `max` fail with -E2BIG and leave
 * the buffer unchanged. The buffer is always NUL-terminated (not counted in len). */
typedef struct {
    char *data;
    size_t len, cap, max;
    int borrowed; /* data is the caller's memory (sd_buf_use): never freed nor resized */
} sd_buf_t;

void sd_buf_init(sd_buf_t *b, size_t max);
/* Starts b empty in the caller's mem[0..cap) (cap >= 1), which must outlive b; growing
 * past it moves the contents to memory b allocates and owns. */
void sd_buf_use(sd_buf_t *b, char *mem, size_t cap, size_t max);
int sd_buf_append(sd_buf_t *b, const void *p, size_t n);
int sd_buf_printf(sd_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sd_buf_reset(sd_buf_t *b);
void sd_buf_free(sd_buf_t *b);

/* Fills out with 2*nbytes lowercase hex characters of getrandom() randomness + NUL. */
int sd_random_hex(char *out, size_t nbytes);
/* Writes raw[0..n) as 2*n lowercase hex characters + NUL into out. */
void sd_hex_encode(char *out, const unsigned char *raw, size_t n);

/* Parses "host:port", "[v6]:port" or ":port" (host becomes ""). Returns 0 or -EINVAL. */
int sd_parse_hostport(const char *s, char *host, size_t hostcap, int *port);

/* Resolves host (a name or a v4/v6 address; "" for every address) and port, and binds a
 * socket of type (SOCK_STREAM, SOCK_DGRAM; SOCK_CLOEXEC is added) to the first address
 * that takes it, calling prepare(fd) (may be NULL) on each socket before its bind for
 * options such as SO_REUSEADDR or SO_RCVBUF. Returns the fd, or a negative errno
 * (-EADDRNOTAVAIL when host does not resolve). */
int sd_socket_bind(const char *host, int port, int type, void (*prepare)(int fd));

/* Parses a whole decimal integer in [min,max]; returns 0 or -EINVAL/-ERANGE. */
int sd_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);

/* Reads a whole file of at most max bytes into a NUL-terminated malloc'd buffer that the
 * caller frees. Returns 0, -E2BIG when larger, or a negative errno. */
int sd_read_file(const char *path, size_t max, char **out, size_t *len);
/* The same from an open descriptor (a pipe, stdin), read to its end; fd stays open. */
int sd_read_fd(int fd, size_t max, char **out, size_t *len);

/* Writes v in decimal at the end of buf[0..SD_I64_DIGITS) without printf, and returns
 * where its digits start (not NUL-terminated: they run to buf + SD_I64_DIGITS). */
#define SD_I64_DIGITS 24
char *sd_fmt_i64(char buf[SD_I64_DIGITS], int64_t v);

/* strlcpy: copies at most cap-1 bytes, always NUL-terminates, returns strlen(src). */
size_t sd_strlcpy(char *dst, const char *src, size_t cap);

#endif
