/* What the bench load generators share: their raw-Redis side and their HTTP answers
 * (bench_redis.h). */
#include "bench_redis.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_script_load(const char *prog, const char *host, int port, const char *luadir,
                      const char *name, char sha[41])
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.lua", luadir, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot read %s\n", prog, path);
        return -1;
    }
    static char src[1 << 17];
    size_t n = fread(src, 1, sizeof src - 1, f);
    src[n] = '\0';
    fclose(f);
    redisContext *r = redisConnect(host, port);
    redisReply *rep = r && !r->err ? redisCommand(r, "SCRIPT LOAD %s", src) : NULL;
    int ok = rep && rep->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(sha, 41, "%s", rep->str);
    else
        fprintf(stderr, "%s: SCRIPT LOAD %s failed\n", prog, name);
    if (rep)
        freeReplyObject(rep);
    if (r)
        redisFree(r);
    return ok ? 0 : -1;
}

size_t bench_body_sink(char *p, size_t size, size_t nmemb, void *ud)
{
    bench_body_t *b = ud;
    size_t n = size * nmemb;
    if (b->len + n < sizeof b->buf) {
        memcpy(b->buf + b->len, p, n);
        b->len += n;
        b->buf[b->len] = '\0';
    }
    return n;
}
