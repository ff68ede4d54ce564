/* Redis access: one synchronous hiredis connection per worker thread (thread-local),
 * created lazily and dropped on any I/O error so the next call reconnects. While Redis
 * is unreachable, calls fail fast with SD_STORE_DOWN (the handler answers 503) and a
 * reconnect is tried at most every RECONNECT_MS per thread.
 *
 * With sentinel:// the address comes from sentinel.c: every new connection is checked
 * with ROLE, an I/O error or a READONLY reply sends the workers back to the sentinels,
 * and a worker whose connection belongs to an older primary generation reconnects. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "command.h"
#include "rcluster.h"
#include "sd.h"
#include "sentinel.h"

#define CONNECT_TIMEOUT_MS 500
#define COMMAND_TIMEOUT_MS 3000
#define RECONNECT_MS 200

static struct {
    int unix_sock;
    int sentinel;
    int cluster; /* cluster://: commands routed by rcluster.c */
    char host[256];
    int port;
    char path[256];
    int db;
    char password[128];
    char prefix[64];
    char master_base[80];
} target;

static _Thread_local redisContext *tl_ctx;
static _Thread_local uint64_t tl_gen; /* sentinel generation tl_ctx was made under */
/* Which of this thread's connections tl_ctx is (one more per connection opened), and the
 * one that made the last script's write: sd_store_wait confirms a write on the very
 * connection that made it. */
static _Thread_local uint64_t tl_serial, tl_write_serial;
/* The same context under a pthread key, whose destructor closes it when a worker
 * thread exits (thread-local storage alone would leak it). */
static pthread_key_t ctx_key;
static pthread_once_t ctx_key_once = PTHREAD_ONCE_INIT;

static void ctx_destroy(void *p) { redisFree(p); }
static void ctx_key_init(void) { pthread_key_create(&ctx_key, ctx_destroy); }
static _Thread_local int64_t tl_last_fail_ms;
static atomic_int down_logged;
/* When any worker last connected: a worker in its reconnect back-off retries at once if
 * another one got through since its own failure (Redis is back). */
static _Atomic int64_t last_connect_ok_ms;

/* SHA1 of each embedded script, filled by SCRIPT LOAD on first use. */
static char (*script_sha)[41];
static pthread_mutex_t sha_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---------- argv builder ---------- */

void sd_argv_init(sd_argv_t *a)
{
    /* not the arrays nor the arena: only [0, argc), [0, nowned), [0, arena_used) are read */
    a->argv = a->inline_argv;
    a->argl = a->inline_argl;
    a->argc = a->nowned = a->overflow = 0;
    a->arena_used = 0;
    a->cap = SD_ARGV_INLINE;
}

/* Doubles a's room, moving its entries into allocated arrays. 0, or -1 when a is at
 * SD_STORE_ARGV_MAX or out of memory (a unchanged). */
static int argv_grow(sd_argv_t *a)
{
    if (a->cap >= SD_STORE_ARGV_MAX)
        return -1;
    int ncap = a->cap * 2 < SD_STORE_ARGV_MAX ? a->cap * 2 : SD_STORE_ARGV_MAX;
    const char **v = malloc((size_t)ncap * sizeof *v);
    size_t *l = malloc((size_t)ncap * sizeof *l);
    if (!v || !l) {
        free(v);
        free(l);
        return -1;
    }
    memcpy(v, a->argv, (size_t)a->argc * sizeof *v);
    memcpy(l, a->argl, (size_t)a->argc * sizeof *l);
    if (a->argv != a->inline_argv) {
        free((void *)a->argv);
        free(a->argl);
    }
    a->argv = v;
    a->argl = l;
    a->cap = ncap;
    return 0;
}

void sd_argv_addn(sd_argv_t *a, const char *p, size_t n)
{
    if (a->argc == a->cap && argv_grow(a)) {
        a->overflow = 1;
        return;
    }
    a->argv[a->argc] = p;
    a->argl[a->argc] = n;
    a->argc++;
}

void sd_argv_add(sd_argv_t *a, const char *s) { sd_argv_addn(a, s, strlen(s)); }

/* Room for n bytes and a NUL in a's arena, or NULL. */
static char *arena_take(sd_argv_t *a, size_t n)
{
    if (n >= sizeof a->arena - a->arena_used)
        return NULL;
    char *p = a->arena + a->arena_used;
    a->arena_used += n + 1;
    return p;
}

/* Adds a copy of p[0..n): in the arena, or owned. */
static void argv_addcopy(sd_argv_t *a, const char *p, size_t n)
{
    char *s = arena_take(a, n);
    if (!s) {
        if (a->nowned >= (int)SD_ARRAY_LEN(a->owned) || !(s = malloc(n + 1))) {
            a->overflow = 1;
            return;
        }
        a->owned[a->nowned++] = s;
    }
    memcpy(s, p, n);
    s[n] = '\0';
    sd_argv_addn(a, s, n);
}

/* v in decimal, as printf's %lld writes it. */
static void argv_addll(sd_argv_t *a, long long v)
{
    char buf[SD_I64_DIGITS], *p = sd_fmt_i64(buf, (int64_t)v);
    argv_addcopy(a, p, (size_t)(buf + sizeof buf - p));
}

void sd_argv_addf(sd_argv_t *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    /* the formats nearly every caller uses, without printf */
    if (!strcmp(fmt, "%s")) {
        const char *s = va_arg(ap, const char *);
        argv_addcopy(a, s, strlen(s));
        va_end(ap);
        return;
    }
    if (!strcmp(fmt, "%lld") || !strcmp(fmt, "%d")) {
        long long v = fmt[1] == 'd' ? va_arg(ap, int) : va_arg(ap, long long);
        argv_addll(a, v);
        va_end(ap);
        return;
    }
    size_t room = sizeof a->arena - a->arena_used;
    int n = vsnprintf(a->arena + a->arena_used, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
        a->overflow = 1;
        return;
    }
    if ((size_t)n < room) {
        char *s = arena_take(a, (size_t)n);
        sd_argv_addn(a, s, (size_t)n);
        return;
    }
    if (a->nowned >= (int)SD_ARRAY_LEN(a->owned)) {
        a->overflow = 1;
        return;
    }
    char *s = NULL;
    va_start(ap, fmt);
    n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        a->overflow = 1;
        return;
    }
    a->owned[a->nowned++] = s;
    sd_argv_addn(a, s, (size_t)n);
}

void sd_argv_free(sd_argv_t *a)
{
    for (int i = 0; i < a->nowned; i++)
        free(a->owned[i]);
    if (a->argv != a->inline_argv) {
        free((void *)a->argv);
        free(a->argl);
        a->argv = a->inline_argv;
        a->argl = a->inline_argl;
        a->cap = SD_ARGV_INLINE;
    }
    a->nowned = a->argc = 0;
    a->arena_used = 0;
}

/* ---------- connection ---------- */

/* Parses "?db=N" (or nothing) into target.db. */
static int parse_db_query(const char *q)
{
    int64_t db;
    if (!q || !*q)
        return 0;
    if (strncmp(q, "?db=", 4) || sd_parse_i64(q + 4, 0, 1000, &db))
        return -EINVAL;
    target.db = (int)db;
    return 0;
}

/* Takes an optional "[:]password@" off the front of *p into target.password. */
static int parse_password(const char **p)
{
    const char *at = strchr(*p, '@');
    if (!at)
        return 0;
    const char *pw = *p;
    if (*pw == ':')
        pw++;
    size_t n = (size_t)(at - pw);
    if (n >= sizeof target.password)
        return -EINVAL;
    memcpy(target.password, pw, n);
    *p = at + 1;
    return 0;
}

/* Parses sentinel://[:password@]h1:p1,h2:p2/mastername[?db=N]. */
static int parse_sentinel_url(const char *p)
{
    if (parse_password(&p))
        return -EINVAL;
    const char *q = strchr(p, '?');
    char spec[1024];
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (n >= sizeof spec || parse_db_query(q))
        return -EINVAL;
    memcpy(spec, p, n);
    spec[n] = '\0';
    target.sentinel = 1;
    return sd__sentinel_init(spec, target.password);
}

/* rcluster.c's events as counters. */
static void cluster_event(const char *what)
{
    if (!strcmp(what, "moved"))
        SD_COUNT("serverdir_redis_cluster_redirects_total{kind=\"moved\"}",
                 "Redis Cluster redirections followed", 1);
    else if (!strcmp(what, "ask"))
        SD_COUNT("serverdir_redis_cluster_redirects_total{kind=\"ask\"}",
                 "Redis Cluster redirections followed", 1);
    else if (!strcmp(what, "tryagain"))
        SD_COUNT("serverdir_redis_cluster_redirects_total{kind=\"tryagain\"}",
                 "Redis Cluster redirections followed", 1);
    else if (!strcmp(what, "refresh"))
        SD_COUNT("serverdir_redis_cluster_slot_map_loads_total",
                 "Redis Cluster slot maps loaded (CLUSTER SLOTS)", 1);
}

/* Parses cluster://[:password@]h1:p1,h2:p2[?password=PW]: the seed nodes of a Redis
 * Cluster (any of them will do; the rest are learnt from CLUSTER SLOTS). */
static int parse_cluster_url(const char *p)
{
    if (parse_password(&p))
        return -EINVAL;
    const char *q = strchr(p, '?');
    char spec[1024];
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (n == 0 || n >= sizeof spec)
        return -EINVAL;
    memcpy(spec, p, n);
    spec[n] = '\0';
    if (q) {
        if (strncmp(q, "?password=", 10) || strlen(q + 10) >= sizeof target.password)
            return -EINVAL;
        sd_strlcpy(target.password, q + 10, sizeof target.password);
    }
    target.cluster = 1;
    sd__rc_event = cluster_event;
    return sd__rc_init(spec, target.password);
}

/* Parses redis://[:password@]host:port[/db], unix:///path[?db=N], sentinel://... or
 * cluster://... */
static int parse_url(const char *url)
{
    memset(&target, 0, sizeof target);
    if (strncmp(url, "sentinel://", 11) == 0)
        return parse_sentinel_url(url + 11);
    if (strncmp(url, "cluster://", 10) == 0)
        return parse_cluster_url(url + 10);
    if (strncmp(url, "unix://", 7) == 0) {
        const char *p = url + 7;
        const char *q = strchr(p, '?');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 0 || n >= sizeof target.path || p[0] != '/')
            return -EINVAL;
        memcpy(target.path, p, n);
        target.unix_sock = 1;
        return parse_db_query(q);
    }
    if (strncmp(url, "redis://", 8) != 0)
        return -EINVAL;
    const char *p = url + 8;
    if (parse_password(&p))
        return -EINVAL;
    char hp[300];
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || n >= sizeof hp)
        return -EINVAL;
    memcpy(hp, p, n);
    hp[n] = '\0';
    if (!strchr(hp, ':') || hp[n - 1] == ']') {
        /* a host without a port: "name", "1.2.3.4" or "[v6]" (not "[", "[]" or "[x") */
        target.port = 6379;
        if (hp[0] == '[') {
            if (n < 3 || hp[n - 1] != ']' || n - 2 >= sizeof target.host)
                return -EINVAL;
            memcpy(target.host, hp + 1, n - 2);
            target.host[n - 2] = '\0';
        } else if (sd_strlcpy(target.host, hp, sizeof target.host) >= sizeof target.host) {
            return -EINVAL;
        }
    } else if (sd_parse_hostport(hp, target.host, sizeof target.host, &target.port)) {
        return -EINVAL;
    }
    if (slash && slash[1]) {
        int64_t db;
        if (sd_parse_i64(slash + 1, 0, 1000, &db))
            return -EINVAL;
        target.db = (int)db;
    }
    return 0;
}

static void close_ctx(void)
{
    if (tl_ctx) {
        redisFree(tl_ctx);
        tl_ctx = NULL;
        pthread_setspecific(ctx_key, NULL);
    }
}

/* Closes this thread's connection after a failure; with Sentinel, also reports the
 * primary as failing (lost: it is known not to be the primary any more). */
static void drop_ctx_failed(int lost)
{
    if (tl_ctx && target.sentinel)
        sd__sentinel_failed(tl_gen, lost);
    close_ctx();
    tl_last_fail_ms = sd_mono_ms();
}

static void drop_ctx(void) { drop_ctx_failed(0); }

static int check_setup_reply(redisReply *r)
{
    int ok = r && r->type != REDIS_REPLY_ERROR;
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

/* 1 when the server c is connected to says it is a master (ROLE). */
static int role_is_master(redisContext *c)
{
    redisReply *r = redisCommand(c, "ROLE");
    int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
             r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
    if (r)
        freeReplyObject(r);
    return ok;
}

/* Why open_conn failed, for the caller's one log line and metric. */
enum conn_fail { CONN_OK, CONN_NO_PRIMARY, CONN_CONNECT, CONN_SETUP, CONN_NOT_MASTER };

/* Opens a connection to the current primary (the configured server, or the one the
 * sentinels name) with the timeouts, AUTH and SELECT every connection gets, and, under
 * Sentinel, checks with ROLE that it is still the master. Returns NULL with *why set
 * (and errstr filled for CONN_CONNECT); *gen gets the Sentinel generation used. */
static redisContext *open_conn(uint64_t *gen, enum conn_fail *why, char *errstr, size_t cap)
{
    struct timeval ct = {0, CONNECT_TIMEOUT_MS * 1000};
    redisContext *c;
    *gen = 0;
    if (target.sentinel) {
        char host[256];
        int port;
        if (sd__sentinel_master(host, sizeof host, &port, gen)) {
            *why = CONN_NO_PRIMARY;
            return NULL;
        }
        c = redisConnectWithTimeout(host, port, ct);
    } else {
        c = target.unix_sock ? redisConnectUnixWithTimeout(target.path, ct)
                             : redisConnectWithTimeout(target.host, target.port, ct);
    }
    if (!c || c->err) {
        snprintf(errstr, cap, "%s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        if (target.sentinel)
            sd__sentinel_failed(*gen, 0);
        *why = CONN_CONNECT;
        return NULL;
    }
    struct timeval tv = {COMMAND_TIMEOUT_MS / 1000, (COMMAND_TIMEOUT_MS % 1000) * 1000};
    redisSetTimeout(c, tv);
    if (c->connection_type == REDIS_CONN_TCP) /* hiredis fails the context on a unix socket */
        redisEnableKeepAlive(c);
    if ((target.password[0] && check_setup_reply(redisCommand(c, "AUTH %s", target.password))) ||
        (target.db && check_setup_reply(redisCommand(c, "SELECT %d", target.db)))) {
        redisFree(c);
        *why = CONN_SETUP;
        return NULL;
    }
    if (target.sentinel && !role_is_master(c)) {
        sd__sentinel_failed(*gen, 1);
        redisFree(c);
        *why = CONN_NOT_MASTER;
        return NULL;
    }
    *why = CONN_OK;
    return c;
}

/* A stand-in context for the callers that only check that Redis can be tried: in
 * cluster mode every command finds its node itself (rcluster.c). */
static redisContext cluster_ready;

static redisContext *get_ctx(void)
{
    if (target.cluster)
        return &cluster_ready;
    if (tl_ctx && target.sentinel && tl_gen != sd__sentinel_gen()) {
        /* The primary changed under this connection: move to the new one now. */
        close_ctx();
        tl_last_fail_ms = 0;
    }
    if (tl_ctx)
        return tl_ctx;
    if (tl_last_fail_ms && sd_mono_ms() - tl_last_fail_ms < RECONNECT_MS &&
        atomic_load(&last_connect_ok_ms) <= tl_last_fail_ms)
        return NULL;
    uint64_t gen;
    enum conn_fail why;
    char errstr[128];
    redisContext *c = open_conn(&gen, &why, errstr, sizeof errstr);
    switch (why) {
    case CONN_OK:
        break;
    case CONN_NO_PRIMARY:
        SD_COUNT("serverdir_redis_errors_total{kind=\"no_primary\"}", "Redis calls that failed", 1);
        if (!atomic_exchange(&down_logged, 1))
            log_error("redis unreachable", "err=%s", "no primary known to the sentinels");
        tl_last_fail_ms = sd_mono_ms();
        return NULL;
    case CONN_CONNECT:
        SD_COUNT("serverdir_redis_errors_total{kind=\"connect\"}", "Redis calls that failed", 1);
        if (!atomic_exchange(&down_logged, 1))
            log_error("redis unreachable", "err=%s", errstr);
        tl_last_fail_ms = sd_mono_ms();
        return NULL;
    case CONN_SETUP:
        log_error("redis setup failed", "err=%s", "AUTH or SELECT refused");
        tl_last_fail_ms = sd_mono_ms();
        return NULL;
    case CONN_NOT_MASTER: {
        static _Atomic uint64_t logged_gen;
        if (atomic_exchange(&logged_gen, gen) != gen) /* once per primary, not per worker */
            log_warn("redis primary demoted", "err=%s", "ROLE is not master; asking the sentinels");
        tl_last_fail_ms = 0;
        return NULL;
    }
    }
    if (atomic_exchange(&down_logged, 0))
        sd_log_msg(SD_LOG_INFO, "redis reachable again");
    pthread_once(&ctx_key_once, ctx_key_init);
    pthread_setspecific(ctx_key, c);
    tl_ctx = c;
    tl_gen = gen;
    tl_serial++;
    atomic_store(&last_connect_ok_ms, sd_mono_ms());
    return c;
}

/* True when the connection failed because the peer had closed it (Redis restarted or
 * dropped us): the command never ran on a live server, so sending it again is safe. A
 * timeout is not such a failure: the command may have run. */
static int peer_closed(const redisContext *c, int saved_errno)
{
    return c->err == REDIS_ERR_EOF ||
           (c->err == REDIS_ERR_IO && (saved_errno == ECONNRESET || saved_errno == EPIPE));
}

int sd_store_wait(long long replicas, long long timeout_ms, long long *got)
{
    char n[24], ms[24];
    snprintf(n, sizeof n, "%lld", replicas);
    snprintf(ms, sizeof ms, "%lld", timeout_ms);
    const char *argv[3] = {"WAIT", n, ms};
    size_t argl[3] = {4, strlen(n), strlen(ms)};
    redisReply *r = NULL;
    *got = 0;
    /* On the connection that made the write, never on another: after a reconnect (a
     * restarted or failed-over primary) WAIT would count replicas that never had it. */
    if (target.cluster) {
        enum sd_rc_fail why;
        r = sd__rc_command_on_write(3, argv, argl, &why);
    } else if (tl_ctx && tl_serial == tl_write_serial) {
        errno = 0;
        r = sd__command_argv(tl_ctx, 3, argv, argl);
        if (!r) {
            int closed = peer_closed(tl_ctx, errno);
            drop_ctx();
            if (closed) /* not an outage: the next command reconnects at once */
                tl_last_fail_ms = 0;
        }
    }
    if (!r) {
        SD_COUNT("serverdir_redis_errors_total{kind=\"wait\"}", "Redis calls that failed", 1);
        return SD_STORE_DOWN;
    }
    /* an error reply (WAIT on a replica: a primary demoted under us) confirms nothing */
    *got = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    return SD_STORE_OK;
}

redisContext *sd_store_connect(void)
{
    if (target.cluster)
        return sd__rc_connect(-1);
    uint64_t gen;
    enum conn_fail why;
    char errstr[128];
    return open_conn(&gen, &why, errstr, sizeof errstr);
}

int sd_store_init(const char *url, const char *key_prefix)
{
    if (parse_url(url))
        return -EINVAL;
    sd_strlcpy(target.prefix, key_prefix, sizeof target.prefix);
    snprintf(target.master_base, sizeof target.master_base,
             target.cluster ? "%s{master}:" : "%smaster:", target.prefix);
    free(script_sha);
    script_sha = calloc(sd_nscripts ? sd_nscripts : 1, sizeof *script_sha);
    return script_sha ? 0 : -ENOMEM;
}

void sd_store_thread_close(void)
{
    close_ctx();
    if (target.cluster)
        sd__rc_thread_close();
}

int sd_store_is_cluster(void) { return target.cluster; }

int sd_store_start(void) { return target.sentinel ? sd__sentinel_start() : 0; }

void sd_store_stop(void)
{
    if (target.sentinel)
        sd__sentinel_stop();
}

const char *sd_store_prefix(void) { return target.prefix; }

const char *sd_master_base(void) { return target.master_base; }

const char *sd_key(char *buf, size_t cap, const char *cluster, const char *fmt, ...)
{
    int n = snprintf(buf, cap, "%s{%s}:", target.prefix, cluster);
    if (n < 0 || (size_t)n >= cap)
        return buf;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
    return buf;
}

const char *sd_assign_channel(char *buf, size_t cap)
{
    snprintf(buf, cap, "%sassign", target.prefix);
    return buf;
}


/* Sends argv and returns the reply. If the connection turns out to have been closed by
 * the peer, reconnects once and resends; on any other I/O failure drops the connection
 * and returns NULL. */
/* The slot a command is routed by in cluster mode: its first key's, or -1 for a command
 * without one (sent to the node this thread used last: WAIT and SCRIPT LOAD must reach
 * the node of the command before them). */
static int command_slot(int argc, const char **argv, const size_t *argl)
{
    static const char *const keyless[] = {"PING", "SCRIPT", "WAIT", "INFO", "SCAN", "CONFIG",
                                          "SLOWLOG", "TIME", "ROLE", "DBSIZE", "CLUSTER",
                                          "PUBLISH", "CLIENT", "DEBUG", "FLUSHALL", NULL};
    if (argc < 2)
        return -1;
    const char *c = argv[0];
    if (!strcasecmp(c, "EVALSHA") || !strcasecmp(c, "EVAL") || !strcasecmp(c, "EVALSHA_RO")) {
        if (argc >= 4 && atoi(argv[2]) > 0)
            return (int)sd__rc_slot(argv[3], argl[3]);
        return -1;
    }
    if (!strcasecmp(c, "XREAD") || !strcasecmp(c, "XREADGROUP")) {
        for (int i = 1; i + 1 < argc; i++)
            if (!strcasecmp(argv[i], "STREAMS"))
                return (int)sd__rc_slot(argv[i + 1], argl[i + 1]);
        return -1;
    }
    for (const char *const *k = keyless; *k; k++)
        if (!strcasecmp(c, *k))
            return -1;
    return (int)sd__rc_slot(argv[1], argl[1]);
}

/* roundtrip() for cluster mode. */
static redisReply *cluster_roundtrip(int argc, const char **argv, const size_t *argl)
{
    enum sd_rc_fail why;
    redisReply *r = sd__rc_command(command_slot(argc, argv, argl), argc, argv, argl, &why);
    if (!r) {
        SD_COUNT("serverdir_redis_errors_total{kind=\"cluster\"}", "Redis calls that failed", 1);
        if (!atomic_exchange(&down_logged, 1))
            log_error("redis unreachable", "err=%s",
                      why == SD_RC_IO ? "command timed out" : "no primary serves the slot");
        return NULL;
    }
    if (atomic_exchange(&down_logged, 0))
        sd_log_msg(SD_LOG_INFO, "redis reachable again");
    return r;
}

static redisReply *roundtrip(int argc, const char **argv, const size_t *argl)
{
    if (target.cluster)
        return cluster_roundtrip(argc, argv, argl);
    redisContext *c = get_ctx();
    if (!c)
        return NULL;
    errno = 0;
    redisReply *r = sd__command_argv(c, argc, argv, argl);
    if (!r && peer_closed(c, errno)) {
        drop_ctx();
        tl_last_fail_ms = 0; /* a stale connection is not an outage: reconnect now */
        c = get_ctx();
        if (!c)
            return NULL;
        r = sd__command_argv(c, argc, argv, argl);
    }
    if (!r) {
        log_warn("redis command failed", "err=%s", c->errstr);
        drop_ctx();
    } else if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "READONLY")) {
        /* A replica (a demoted primary after a failover): no write can succeed here. */
        log_warn("redis refused a write", "err=%s", "READONLY: the server is a replica");
        SD_COUNT("serverdir_redis_errors_total{kind=\"readonly\"}", "Redis calls that failed", 1);
        freeReplyObject(r);
        r = NULL;
        drop_ctx_failed(1);
        tl_last_fail_ms = 0;
    }
    return r;
}

int sd_store_command(sd_argv_t *a, redisReply **out)
{
    *out = NULL;
    if (a->overflow)
        return SD_STORE_ERROR;
    if (!get_ctx())
        return SD_STORE_DOWN;
    redisReply *r = roundtrip(a->argc, a->argv, a->argl);
    if (!r) {
        SD_COUNT("serverdir_redis_errors_total{kind=\"io\"}", "Redis calls that failed", 1);
        return SD_STORE_DOWN;
    }
    *out = r;
    return SD_STORE_OK;
}

static int script_index(const char *name)
{
    for (size_t i = 0; i < sd_nscripts; i++)
        if (strcmp(sd_script_srcs[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int script_load(int idx)
{
    const char *argv[3] = {"SCRIPT", "LOAD", sd_script_srcs[idx].body};
    size_t argl[3] = {6, 4, strlen(sd_script_srcs[idx].body)};
    redisReply *r = roundtrip(3, argv, argl);
    if (!r)
        return SD_STORE_DOWN;
    int rc = SD_STORE_ERROR;
    if (r->type == REDIS_REPLY_STRING && r->len == 40) {
        pthread_mutex_lock(&sha_mu);
        memcpy(script_sha[idx], r->str, 40);
        script_sha[idx][40] = '\0';
        pthread_mutex_unlock(&sha_mu);
        rc = SD_STORE_OK;
    } else {
        log_error("redis refused a script", "script=%s err=%s", sd_script_srcs[idx].name,
                  r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    }
    freeReplyObject(r);
    return rc;
}

/* Runs script idx (name, for the logs) with args as EVALSHA's KEYS and ARGV. */
static int script_call(int idx, const char *name, int nkeys, const sd_argv_t *args,
                       redisReply **out)
{
    const char *sv[SD_ARGV_INLINE + 3];
    size_t sl[SD_ARGV_INLINE + 3];
    int fits = args->argc <= SD_ARGV_INLINE;
    const char **argv = fits ? sv : malloc((size_t)(args->argc + 3) * sizeof *argv);
    size_t *argl = fits ? sl : malloc((size_t)(args->argc + 3) * sizeof *argl);
    if (!argv || !argl) {
        if (!fits) {
            free(argv);
            free(argl);
        }
        return SD_STORE_ERROR;
    }
    int rc = SD_STORE_ERROR;
    /* a load, then NOSCRIPT on a node that had not seen it (a cluster, a restart), then
     * the call that works */
    for (int attempt = 0; attempt < 3; attempt++) {
        char sha[41];
        pthread_mutex_lock(&sha_mu);
        memcpy(sha, script_sha[idx], sizeof sha);
        pthread_mutex_unlock(&sha_mu);
        if (!sha[0]) {
            rc = script_load(idx);
            if (rc)
                break;
            rc = SD_STORE_ERROR;
            continue;
        }
        char nk[16];
        snprintf(nk, sizeof nk, "%d", nkeys);
        argv[0] = "EVALSHA";
        argl[0] = 7;
        argv[1] = sha;
        argl[1] = 40;
        argv[2] = nk;
        argl[2] = strlen(nk);
        memcpy(argv + 3, args->argv, (size_t)args->argc * sizeof *argv);
        memcpy(argl + 3, args->argl, (size_t)args->argc * sizeof *argl);
        redisReply *r = roundtrip(args->argc + 3, argv, argl);
        if (!r) {
            SD_COUNT("serverdir_redis_errors_total{kind=\"io\"}", "Redis calls that failed", 1);
            rc = SD_STORE_DOWN;
            break;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            rc = script_load(idx);
            if (rc)
                break;
            rc = SD_STORE_ERROR;
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "ERR ", 4) == 0) {
            /* A Lua runtime error, not a typed error_reply: a bug or a data problem. */
            log_error("script failed", "script=%s err=%s", name, r->str);
            SD_COUNT("serverdir_redis_errors_total{kind=\"script\"}", "Redis calls that failed", 1);
            freeReplyObject(r);
            rc = SD_STORE_ERROR;
            break;
        }
        *out = r;
        rc = SD_STORE_OK;
        /* the connection a WAIT for this script's writes must use */
        if (target.cluster)
            sd__rc_mark_write();
        else
            tl_write_serial = tl_serial;
        break;
    }
    if (!fits) {
        free(argv);
        free(argl);
    }
    return rc;
}

int sd_store_run(const char *name, int nkeys, sd_argv_t *a, redisReply **out)
{
    *out = NULL;
    int idx = script_index(name), rc;
    if (idx < 0 || a->overflow || a->argc > SD_STORE_ARGV_MAX - 3) {
        log_error("bad script call", "script=%s", name);
        rc = SD_STORE_ERROR;
    } else if (!get_ctx()) {
        rc = SD_STORE_DOWN;
    } else {
        rc = script_call(idx, name, nkeys, a, out);
    }
    sd_argv_free(a);
    return rc;
}

int sd_store_run_many(const char *name, int n, sd_argv_t *const *items, const int *nkeys,
                      int *rcs, redisReply **outs)
{
    char many[64];
    snprintf(many, sizeof many, "%s_many", name);
    int idx = script_index(many);
    int total = 1 + 2 * n;
    for (int i = 0; i < n; i++)
        total += items[i]->argc;
    if (idx < 0 || n < 1 || total > SD_STORE_ARGV_MAX - 3) {
        log_error("bad script call", "script=%s items=%d args=%d", many, n, total);
        return SD_STORE_ERROR;
    }
    /* KEYS of every item, then n and each item's counts, then every item's ARGV */
    char (*nums)[12] = malloc((size_t)(1 + 2 * n) * sizeof *nums);
    sd_argv_t a;
    sd_argv_init(&a);
    int nk = 0;
    for (int i = 0; nums && i < n; i++) {
        if (items[i]->overflow || nkeys[i] < 0 || nkeys[i] > items[i]->argc)
            a.overflow = 1;
        for (int j = 0; j < nkeys[i] && j < items[i]->argc; j++)
            sd_argv_addn(&a, items[i]->argv[j], items[i]->argl[j]);
        nk += nkeys[i];
    }
    if (nums) {
        snprintf(nums[0], sizeof nums[0], "%d", n);
        sd_argv_add(&a, nums[0]);
        for (int i = 0; i < n; i++) {
            snprintf(nums[1 + 2 * i], sizeof nums[0], "%d", nkeys[i]);
            snprintf(nums[2 + 2 * i], sizeof nums[0], "%d", items[i]->argc - nkeys[i]);
            sd_argv_add(&a, nums[1 + 2 * i]);
            sd_argv_add(&a, nums[2 + 2 * i]);
        }
        for (int i = 0; i < n; i++)
            for (int j = nkeys[i]; j < items[i]->argc; j++)
                sd_argv_addn(&a, items[i]->argv[j], items[i]->argl[j]);
    }
    redisReply *r = NULL;
    int rc;
    if (!nums || a.overflow)
        rc = SD_STORE_ERROR;
    else if (!get_ctx())
        rc = SD_STORE_DOWN;
    else
        rc = script_call(idx, many, nk, &a, &r);
    sd_argv_free(&a);
    free(nums);
    if (rc != SD_STORE_OK)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)n) {
        log_error("script failed", "script=%s items=%d reply_type=%d err=%s", many, n, r->type,
                  r->type == REDIS_REPLY_ERROR ? r->str : "");
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    for (int i = 0; i < n; i++) {
        redisReply *e = r->element[i];
        r->element[i] = NULL; /* the item's own now (freeReplyObject skips NULL) */
        if (e->type == REDIS_REPLY_ERROR && strncmp(e->str, "ERR ", 4) == 0) {
            /* as script_call: a runtime error; a typed error reply is the item's reply */
            log_error("script failed", "script=%s item=%d err=%s", many, i, e->str);
            SD_COUNT("serverdir_redis_errors_total{kind=\"script\"}", "Redis calls that failed", 1);
            freeReplyObject(e);
            rcs[i] = SD_STORE_ERROR;
            outs[i] = NULL;
        } else {
            rcs[i] = SD_STORE_OK;
            outs[i] = e;
        }
    }
    freeReplyObject(r);
    return SD_STORE_OK;
}

int sd_store_primaries(void) { return target.cluster ? sd__rc_primaries() : 1; }

int sd_store_command_primary(int i, sd_argv_t *a, redisReply **out)
{
    *out = NULL;
    if (!target.cluster)
        return i == 0 ? sd_store_command(a, out) : SD_STORE_ERROR;
    if (a->overflow)
        return SD_STORE_ERROR;
    enum sd_rc_fail why;
    redisReply *r = sd__rc_command_primary(i, a->argc, a->argv, a->argl, &why);
    if (!r) {
        SD_COUNT("serverdir_redis_errors_total{kind=\"cluster\"}", "Redis calls that failed", 1);
        return SD_STORE_DOWN;
    }
    *out = r;
    return SD_STORE_OK;
}

int sd_store_ping(void)
{
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "PING");
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    if (rc == SD_STORE_OK) {
        rc = r->type == REDIS_REPLY_STATUS ? 0 : SD_STORE_ERROR;
        freeReplyObject(r);
    }
    return rc;
}

