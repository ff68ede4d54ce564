/* What the bench load generators share: their raw-Redis side and their HTTP answers. */
#ifndef SD_BENCH_REDIS_H
#define SD_BENCH_REDIS_H

#include <stddef.h>

/* Loads luadir/name.lua (the build's copy, with its prelude) into Redis at host:port with
 * SCRIPT LOAD and writes its SHA1 into sha. Returns 0, or -1 with a message on stderr
 * naming prog. */
int bench_script_load(const char *prog, const char *host, int port, const char *luadir,
                      const char *name, char sha[41]);

/* The answer of one HTTP request, as a curl write callback collects it: at most
 * sizeof buf - 1 bytes kept, NUL-terminated. */
typedef struct {
    size_t len;
    char buf[1 << 17];
} bench_body_t;

/* CURLOPT_WRITEFUNCTION for a bench_body_t (CURLOPT_WRITEDATA): appends what fits. */
size_t bench_body_sink(char *p, size_t size, size_t nmemb, void *ud);

#endif
