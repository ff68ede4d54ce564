/* One command on a blocking hiredis connection, formatted and sent without the per
 * argument allocations of redisCommandArgv (command.h). Every store call goes through it:
 * formatting and the arguments' copies were about an eighth of serverdir's user CPU on
 * lock pairs (bench/README.md, "serverdir's own CPU per pair"). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <hiredis/sds.h>

#include "command.h"

static size_t digits(size_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static char *put_count(char *p, char kind, size_t v)
{
    char tmp[24], *e = tmp + sizeof tmp, *q = e;
    do
        *--q = (char)('0' + v % 10);
    while (v /= 10);
    *p++ = kind;
    memcpy(p, q, (size_t)(e - q));
    p += e - q;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* "*argc\r\n", then "$len\r\n<arg>\r\n" per argument */
size_t sd__command_len(int argc, const size_t *argl)
{
    size_t len = 1 + digits((size_t)argc) + 2;
    for (int i = 0; i < argc; i++)
        len += 1 + digits(argl[i]) + 2 + argl[i] + 2;
    return len;
}

void sd__command_format(char *buf, int argc, const char **argv, const size_t *argl)
{
    char *p = put_count(buf, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        p = put_count(p, '$', argl[i]);
        memcpy(p, argv[i], argl[i]);
        p += argl[i];
        *p++ = '\r';
        *p++ = '\n';
    }
}

redisReply *sd__command_argv(redisContext *c, int argc, const char **argv,
                             const size_t *argl)
{
    size_t len = sd__command_len(argc, argl);
    char stackbuf[4096];
    char *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
    if (!buf) {
        errno = ENOMEM;
        return NULL;
    }
    sd__command_format(buf, argc, argv, argl);
    const char *out = buf;
    size_t left = len;
    if (!c->err && c->obuf && sdslen(c->obuf) == 0) {
        /* nothing queued ahead of it: straight to the socket (a short or failed write
         * leaves the rest to hiredis, which reports the failure as it always does) */
        ssize_t n;
        do
            n = send(c->fd, out, left, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n > 0) {
            out += n;
            left -= (size_t)n;
        }
    }
    int rc = left ? redisAppendFormattedCommand(c, out, left) : REDIS_OK;
    if (buf != stackbuf)
        free(buf);
    void *reply = NULL;
    if (rc != REDIS_OK || redisGetReply(c, &reply) != REDIS_OK)
        return NULL;
    return reply;
}
