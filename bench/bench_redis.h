/* What the bench load generators share for their raw-Redis side. */
#ifndef SD_BENCH_REDIS_H
#define SD_BENCH_REDIS_H

/* Loads luadir/name.lua (the build's copy, with its prelude) into Redis at host:port with
 * SCRIPT LOAD and writes its SHA1 into sha. Returns 0, or -1 with a message on stderr
 * naming prog. */
int bench_script_load(const char *prog, const char *host, int port, const char *luadir,
                      const char *name, char sha[41]);

#endif
