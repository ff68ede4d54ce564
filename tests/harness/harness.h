/* Integration-test harness: starts REAL redis-server, serverdir (and later bigbrother,
 * gameproc) processes on free loopback ports with generated configs, talks HTTP to
 * them, and tears everything down even when a test fails or times out.
 *
 * Cleanup: the test process is a child subreaper, every child gets PDEATHSIG=SIGKILL,
 * and at exit (normal, failed assertion, SIGALRM watchdog, SIGTERM from ctest) every
 * descendant still alive is killed and reaped, and temp dirs are removed. */
#ifndef SD_HARNESS_H
#define SD_HARNESS_H

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef SD_BIN_DIR
#error "SD_BIN_DIR must be defined by the build"
#endif

/* The built binaries the tests start. */
#define GAMEPROC SD_BIN_DIR "/gameproc"
#define BIGBROTHER SD_BIN_DIR "/bigbrother"
#define BBCTL SD_BIN_DIR "/bbctl"

/* Call first in main(): installs cleanup and a watchdog that fails the test after
 * timeout_s seconds; under valgrind after H_VALGRIND_TIMEOUT_S at least. */
#define H_VALGRIND_TIMEOUT_S 290 /* just under ctest's 300 s per test */
void h_init(int timeout_s);

/* A fresh temp dir removed at exit; returns a static-lifetime path. */
const char *h_tmpdir(void);
/* A port on 127.0.0.1, free for TCP and UDP a moment ago, below the ephemeral range. */
int h_free_port(void);
/* Writes text to dir/name and returns the path (malloc'd, freed at exit). */
const char *h_write_file(const char *dir, const char *name, const char *text, int mode);

/* Nonzero when H_VALGRIND is set: h_spawn runs serverdir and bigbrother under valgrind
 * memcheck, and tests should allow them more time to start. */
int h_valgrind(void);
/* Nonzero in the sanitizer build (ASan+UBSan: the daemons the tests start are that
 * build's too, several times slower at bulk work). */
int h_sanitized(void);
/* A bound on how long a daemon may take to answer, for timeouts given to clients (libsdclient,
 * sdctl): ms on the plain build, 3 times it under the sanitizers, 10 times under valgrind,
 * and times H_TIME_SCALE (a whole number, default 1) on a machine known to be slow. A
 * bound, not a pace: a test never waits it out unless the daemon is stuck. */
int h_ms(int ms);

/* Spawns argv[0] (a path) in its own process group with stdout+stderr to logpath. */
pid_t h_spawn(const char *const *argv, const char *logpath, const char *const *envp_extra);
/* SIGTERM (then SIGKILL after grace_ms) and reap. Returns the wait status or -1. */
int h_stop(pid_t pid, int grace_ms);
/* Non-blocking: 1 if pid has exited (and reaps it), 0 if it runs. */
int h_exited(pid_t pid, int *status);
/* /proc/PID/FILE (cmdline, environ, stat) into buf as text, its NULs as spaces: its
 * length, -1 when it cannot be read (the process is gone). */
int h_proc_text(int pid, const char *file, char *buf, size_t cap);
/* The processes a whole local cluster left behind (scripts/cluster.sh's, which the test
 * stopped): those, zombies apart, whose environment names SERVERDIR_URL=url, whose
 * environment or command line names dir, or whose command line names 127.0.0.1:PORT for
 * one of ports (a daemon's address, redis-server's title). Each is printed. */
int h_leftovers(const char *url, const char *dir, const int *ports, int nports);
/* In a child just forked, before exec: its own process group, killed with the test,
 * signals as a fresh program finds them (h_spawn does it). */
void h_child_init(void);
/* Waits up to timeout_ms for pid to exit (and reaps it); returns its wait status, or -1
 * when it still runs (or was reaped before). */
int h_wait_exit(pid_t pid, int timeout_ms);

typedef struct {
    pid_t pid;
    int port;
    char dir[256];
    char url[256];   /* redis://127.0.0.1:PORT/0, or cluster://... */
    char log[300];
    redisContext *ctl; /* a direct connection for tests to inspect and mutate state */
    void *cluster;     /* with H_REDIS=cluster: the h_rcluster_t behind url (cluster://),
                          ctl then reaches its first node only */
    pid_t sentinel_pid; /* with H_REDIS=sentinel: the sentinel behind url (sentinel://) */
    int sentinel_port;
} h_redis_t;

/* A redis-server; with H_REDIS=cluster in the environment, a Redis Cluster of 3
 * primaries instead (the suite's second backend, harness_rcluster.h). */
int h_redis_start(h_redis_t *r);
void h_redis_stop(h_redis_t *r);
/* The backend H_REDIS selects: "standalone" (default), "cluster" (3 primaries) or
 * "sentinel" (the standalone server found through one sentinel, url sentinel://). */
const char *h_redis_mode(void);
/* An outage: every Redis node of r stops (the sentinel keeps running); h_redis_up starts
 * them again on the same ports, empty (a cluster with its slots). 0 or -1. */
void h_redis_down(h_redis_t *r);
int h_redis_up(h_redis_t *r);
/* On a cluster, points r->ctl (and r->port) at the primary of key's slot, so that
 * pipelined commands on keys of that slot (redisAppendCommand) reach it; a no-op
 * otherwise. 0 or -1. */
int h_redis_route(h_redis_t *r, const char *key);
/* The Redis key of lock name's record in this mode (sd:lock:{=name} on a cluster when
 * the name has no tag); a per-thread buffer. */
const char *h_lock_key(const char *name);
/* The Redis key `name` of the master list under key prefix `prefix` in this mode
 * ("sd:{master}:s" on a cluster, "sd:master:s" otherwise); a per-thread buffer. */
const char *h_master_key(const char *prefix, const char *name);
/* Redis's blocked clients (INFO clients: blocking commands, and the commands a CLIENT
 * PAUSE holds) on r's node (on a cluster: the one h_redis_route chose), or -1. */
long long h_redis_blocked(h_redis_t *r);
/* Script calls (EVAL and EVALSHA, INFO commandstats) Redis has run on r's node (on a
 * cluster: the one h_redis_route chose) since it started or CONFIG RESETSTAT; with usec,
 * also the microseconds it spent in them. -1 when Redis did not answer. */
long long h_redis_script_calls(h_redis_t *r, long long *usec);
/* Waits up to timeout_ms for at least n of them: 0, or -1. */
int h_redis_wait_blocked(h_redis_t *r, long long n, int timeout_ms);
/* Runs a command on r->ctl (reconnecting if needed); caller frees the reply. */
redisReply *h_redis(h_redis_t *r, const char *fmt, ...);
/* "Changed nothing" checks compare the keys a request could have written, never the whole
 * keyspace at two instants: timers in serverdir (the lost-machine sweep and its lease,
 * the allocation sweep) and keys expiring from earlier tests write on their own, and on a
 * slow machine (valgrind, a busy CI) they land between any two snapshots.
 *
 * h_keys_take records every key that matches one of the NULL-terminated glob patterns
 * (SCAN MATCH; on a cluster, on every node), each with the digest of its value (DEBUG
 * DIGEST-VALUE: type and content, not the expiry), sorted by name. A pattern names what
 * the request's route and body may touch, e.g. "sd:{cx}:*" for cluster cx, or one lock's
 * record. Keys only serverdir's timers write (the lost-machine sweep's lease) are left
 * out. Returns the number of keys recorded. */
typedef struct {
    size_t n, cap;
    char **key;
    char (*sum)[41];
    long long *pttl;      /* each key's time to live when taken, -1 for none */
    int64_t t0, t1;       /* h_now_ms() when the snapshot began, and ended */
} h_keys_t;
size_t h_keys_take(h_redis_t *r, h_keys_t *k, ...) __attribute__((sentinel));
/* NULL when a and b hold the same keys with the same values; otherwise what differs
 * ("changed K; added K; removed K", the first few), in a per-thread buffer. A key of a
 * that b lacks is not a difference when its time to live had run out by the end of b
 * (Redis expired it: no request could have written that). */
const char *h_keys_diff(const h_keys_t *a, const h_keys_t *b);
/* The same, on key names only: no key added or removed (expiry aside), whatever their
 * values. For claims such as "a refused name creates no key": background timers may
 * still change the values of keys that exist. */
const char *h_keys_names_diff(const h_keys_t *a, const h_keys_t *b);
/* Leaves key name out of snapshot k (a key that others write beside the request checked,
 * such as a counter moved by other callers' timers): both snapshots, before comparing. */
void h_keys_drop(h_keys_t *k, const char *name);
void h_keys_free(h_keys_t *k);
/* Fails the test (cmocka's fail_msg) naming what differs, and frees both. what: the
 * request or case, for the message. */
void h_keys_same(h_keys_t *before, h_keys_t *after, const char *what);
void h_keys_same_names(h_keys_t *before, h_keys_t *after, const char *what);
/* Patterns for h_keys_take: a cluster's keys (with the list of clusters), and every lock's
 * and blob's keys (records, #q lists, holder sets). */
#define H_KEYS_CLUSTER(c) "sd:{" c "}:*", "sd:clusters"
#define H_KEYS_LOCKS "sd:lock:*", "sd:blob:*"
#define H_KEYS_MASTER "sd:master:*", "sd:{master}:*"

typedef struct {
    pid_t pid;
    int port;
    char url[128];   /* http://127.0.0.1:PORT */
    char log[300];
    char dir[256];
    char tokens[300]; /* path of the token file, or "" for open mode */
    int udp_port;     /* UDP master listener on 127.0.0.1 (h_sd_start), or 0 */
    int udp6_port;    /* UDP master listener on [::1] (h_sd_start), or 0 */
} h_serverdir_t;

/* Starts serverdir on a free port against redis_url and waits for /healthz.
 * tokens may be NULL (open mode). extra: NULL-terminated extra flags, or NULL; without a
 * --config among them serverdir gets h_sd_default_config(). */
int h_serverdir_start(h_serverdir_t *s, const char *redis_url, const char *tokens,
                      const char *const *extra);
void h_serverdir_stop(h_serverdir_t *s);
/* Starts serverdir s again (after h_serverdir_stop) on the port and with the token file it
 * had (and h_sd_default_config()), against redis_url, logging to the same log, and waits
 * for /healthz. 0, or -1 when it does not answer in time. */
int h_serverdir_restart(h_serverdir_t *s, const char *redis_url);
/* The config file of a serverdir started without one: the ready-vs-desired sampler off
 * (directory.series_interval_ms 0). It writes on a timer, into the keys of the clusters
 * the "nothing changed" checks look at (h_keys_take); h_sd_start turns it off in a test's
 * config too unless the config sets it (it.series, it.dashboard). */
const char *h_sd_default_config(void);

/* Raw TCP for tests that write requests byte by byte: a connection to 127.0.0.1:port
 * (-1 when it fails); all n bytes of s sent on fd (0, or -1 on a send error); and what
 * comes back until the peer closes or timeout_ms passes, into buf (NUL-terminated; the
 * byte count is returned, *closed set when the peer closed: EOF or reset). */
int h_tcp_connect(int port);
int h_send_all(int fd, const char *s, size_t n);
size_t h_read_until_close(int fd, char *buf, size_t cap, int timeout_ms, int *closed);

/* The test token file: each role's token is "<role>-token-0123456789". */
const char *h_tokens_file(void);
#define H_TOK_OPS "ops-token-0123456789"
#define H_TOK_BB "bigbrother-token-0123456789"
#define H_TOK_GAME "game-token-0123456789"
#define H_TOK_GAME2 "game-token-second-0123456789" /* another game server's token */
#define H_TOK_VIEWER "viewer-token-0123456789"
/* Bound tokens (docs/operations.md, "Tokens"): a bigbrother of machine m1 of cluster
 * authz1, a game server whose holders start with "zone-", a game server and a viewer of
 * cluster authz1. */
#define H_TOK_BB_M1 "bigbrother-m1-token-0123456789"
#define H_TOK_GAME_ZONE "game-zone-token-0123456789"
#define H_TOK_GAME_C1 "game-c1-token-0123456789"
#define H_TOK_VIEWER_C1 "viewer-c1-token-0123456789"
/* Bound tokens of cluster c1 (it.chaos, the cluster tests): bigbrother m1..m3 and its
 * game servers. H_TOK_BB_C1(n) is the token of machine m<n> (n = 1..3). */
#define H_TOK_BB_C1(n) "bigbrother-c1-m" #n "-token-0123456789"
#define H_TOK_GAME_OF_C1 "game-of-c1-token-0123456789"

typedef struct {
    long status;
    char *body;
    size_t len;
    char *headers; /* raw response header block */
} h_resp_t;

/* One HTTP request. body may be NULL. ctype NULL means application/json when a body is
 * given. extra_headers: NULL-terminated "Name: value" strings or NULL. Returns 0 when a
 * response arrived (any status), -1 on a transport error. */
int h_http(const char *method, const char *url, const char *token, const char *ctype,
           const void *body, size_t len, const char *const *extra_headers, h_resp_t *out);
/* The same with a printf-formatted path appended to base. */
int h_http_json(const char *method, const char *base, const char *token, const char *body,
                h_resp_t *out, const char *pathfmt, ...) __attribute__((format(printf, 6, 7)));
void h_resp_free(h_resp_t *r);
/* The value of series (its whole name, labels included) in GET base/metrics: 0 when
 * absent (a counter shows once it moved), -1 when /metrics cannot be read. */
long long h_metric(const char *base, const char *series);
/* Parses the body as JSON (NULL if it is not). Caller decrefs. */
json_t *h_resp_json(const h_resp_t *r);
/* Value of a response header (case-insensitive) into out; 0 if found. */
int h_resp_header(const h_resp_t *r, const char *name, char *out, size_t cap);
/* The master list's servers in GET base/v1/master/servers?<filter>limit=1000&format=text,
 * every page (Master-Next), at most 100 pages; filter "" or "game=x&". -1 when a page
 * cannot be read or is not 200. */
long long h_master_listed(const char *base, const char *filter);
/* error.code of a JSON error body into a static buffer ("" if none). */
const char *h_err_code(const h_resp_t *r);

/* Polls cond(arg) every 10 ms until it returns nonzero or timeout_ms passes. Returns 1
 * when it did. */
int h_wait_until(int (*cond)(void *), void *arg, int timeout_ms);
/* The same, polling every every_ms: for conditions that cost the server something (a
 * rate-limited route, a command with an effect). */
int h_wait_every(int (*cond)(void *), void *arg, int timeout_ms, int every_ms);
/* h_wait_until condition: GET url (a const char *) answers 200. */
int h_http_ok(void *url);
void h_sleep_ms(int ms);
int64_t h_now_ms(void);
/* The whole file at path, NUL-terminated (the caller frees it); NULL when it cannot be
 * read. */
char *h_slurp(const char *path);

#endif
