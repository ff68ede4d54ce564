/* store/: Redis access (standalone or Sentinel), scripts and reply accessors for all. */
/* Redis access for every serverdir module (one connection per worker thread), the
 * embedded Lua scripts, and the accessors that read script and command replies. */
#ifndef SD_STORE_H
#define SD_STORE_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

enum {
    SD_STORE_OK = 0,
    SD_STORE_DOWN = -1,   /* cannot reach Redis: 503 + Retry-After */
    SD_STORE_ERROR = -2,  /* Redis answered with an unexpected error */
};

/* A command's or script's arguments: the first SD_ARGV_INLINE in the struct itself,
 * more in arrays it allocates, up to SD_STORE_ARGV_MAX (past that, or out of memory, or
 * past SD_ARGV_INLINE allocated copies, overflow is set and the call fails). The
 * formatted copies of sd_argv_addf live in the struct's arena while it has room (a lock
 * call's keys, token and numbers do: no allocation), in allocations it owns past that;
 * both, and the grown arrays, are held until sd_argv_free. argv and argl point into the
 * struct: initialize it where it stays, with sd_argv_init, and do not copy it. */
#define SD_ARGV_INLINE 64
#define SD_ARGV_ARENA 2048
#define SD_STORE_ARGV_MAX 8192
typedef struct {
    const char **argv;
    size_t *argl;
    int argc, cap, nowned, overflow;
    size_t arena_used;
    char *owned[SD_ARGV_INLINE];
    const char *inline_argv[SD_ARGV_INLINE];
    size_t inline_argl[SD_ARGV_INLINE];
    char arena[SD_ARGV_ARENA];
} sd_argv_t;

void sd_argv_init(sd_argv_t *a);
void sd_argv_add(sd_argv_t *a, const char *s);
void sd_argv_addn(sd_argv_t *a, const char *p, size_t n);
void sd_argv_addf(sd_argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sd_argv_free(sd_argv_t *a);

int sd_store_init(const char *url, const char *key_prefix);
/* Starts the store's background thread (Sentinel mode: the failover subscriber) after
 * sd_store_init, with the signals blocked; sd_store_stop joins it. 0 or -errno. */
int sd_store_start(void);
void sd_store_stop(void);
void sd_store_thread_close(void);
/* 1 when the store is a Redis Cluster (cluster://). */
int sd_store_is_cluster(void);
/* For walks that visit every node (SCAN): how many primaries (1 without a cluster), and
 * one command sent to the i-th. */
int sd_store_primaries(void);
int sd_store_command_primary(int i, sd_argv_t *a, redisReply **out);
/* The one way to run a Lua script: the embedded script `name` with the first nkeys
 * entries of a as KEYS and the rest as ARGV (EVALSHA, loading it after NOSCRIPT; on a
 * Redis Cluster sent to the node of KEYS[1]), then frees a. On success *out is a reply
 * the caller frees with freeReplyObject; a Lua error_reply comes back as *out of type
 * REDIS_REPLY_ERROR with SD_STORE_OK, so scripts can return typed errors. */
int sd_store_run(const char *name, int nkeys, sd_argv_t *a, redisReply **out);
/* The batch form of script `name` (<name>_many.lua, store/lua_prelude.lua's batch_run):
 * n items, item i with the first nkeys[i] entries of items[i] as its KEYS and the rest
 * as its ARGV, in one EVALSHA (on a Redis Cluster every key must be in one slot). The
 * items' argvs are read, not freed. SD_STORE_OK when the call answered one reply per
 * item: then rcs[i] is item i's own code (SD_STORE_OK with outs[i] its reply, the caller
 * frees it, an error reply too, as sd_store_run's; SD_STORE_ERROR for a runtime error the
 * item raised, logged, outs[i] NULL). Else the
 * call's code (SD_STORE_DOWN: Redis unreachable; SD_STORE_ERROR: the call as a whole
 * was refused, say a busy or out-of-memory Redis or more arguments than
 * SD_STORE_ARGV_MAX) and no item has a reply. */
int sd_store_run_many(const char *name, int n, sd_argv_t *const *items, const int *nkeys,
                      int *rcs, redisReply **outs);
/* Runs one plain command (argv form). Same reply ownership as sd_store_run; a is kept
 * (the caller frees it). */
int sd_store_command(sd_argv_t *a, redisReply **out);
/* Opens a connection of the caller's own to the current primary (under Sentinel, the one
 * the sentinels name; AUTH and SELECT done), for a subscriber that cannot share the
 * thread's command connection. NULL when Redis is unreachable; the caller frees it with
 * redisFree. */
redisContext *sd_store_connect(void);
/* WAIT replicas timeout_ms on the connection that ran this thread's last script (the
 * write it must cover; commands in between do not move it). SD_STORE_DOWN when that
 * connection is gone: it is never sent on another (a reconnect to a restarted or
 * promoted primary, another node of a cluster), whose replicas never had the write.
 * *got: how many replicas confirmed (0 when the reply is not a count: WAIT on a
 * replica is an error). A SD_STORE_* code. */
int sd_store_wait(long long replicas, long long timeout_ms, long long *got);
/* PING with the thread's connection; 0 if Redis answers. */
int sd_store_ping(void);
/* "sd:{cluster}:" + formatted suffix into buf; returns buf. */
const char *sd_key(char *buf, size_t cap, const char *cluster, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The channel assignment changes are published on ("<prefix>assign"; not a key), into
 * buf: the directory's events and the cluster's writes publish there, assign_wait.c
 * subscribes. */
const char *sd_assign_channel(char *buf, size_t cap);
const char *sd_store_prefix(void);
/* The master list's key base: "<prefix>master:", or on a Redis Cluster "<prefix>{master}:"
 * so that every key of the list shares one slot (the list's scripts touch several). */
const char *sd_master_base(void);

typedef struct {
    const char *name;
    const char *body;
} sd_script_src_t;
extern const sd_script_src_t sd_script_srcs[];
extern const size_t sd_nscripts;
/* ---- reply.c: reading replies ----
 * Scripts answer with arrays of strings ({'ok', name, '12', ...}); these read one element
 * without the caller checking the reply's shape first. Returned strings point into r. */

/* Element i of an array reply as text: a string or status element, else "" (absent, r
 * NULL or not an array, or another type). */
const char *sd_reply_str(const redisReply *r, size_t i);
/* Element i of an array reply as a number: an integer element, or decimal text (0 when
 * absent or not a number). */
int64_t sd_reply_num(const redisReply *r, size_t i);
/* Whether r is an array reply whose first element is a string: a script's status reply. */
int sd_reply_has_status(const redisReply *r);
/* Whether r is an array reply whose first element (string or status) is the word st. */
int sd_reply_status_is(const redisReply *r, const char *st);

#endif
