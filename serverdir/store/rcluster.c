/* Redis Cluster routing (rcluster.h).
 *
 * The slot map (slot -> node index) is shared by every thread and read under a rwlock;
 * it is loaded with CLUSTER SLOTS from any node that answers, again when a connection
 * fails or a MOVED arrives (at most every REFRESH_MIN_MS unless forced by a first load).
 * The node table only grows (indices stay valid for the per-thread connection arrays):
 * an entry is written whole before the count that publishes it.
 *
 * Each thread keeps one connection per node it has talked to, created on first use and
 * closed on an I/O error or at thread exit (a pthread key destructor). */
#include "command.h"
#include "rcluster.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CONNECT_TIMEOUT_MS 500
#define COMMAND_TIMEOUT_MS 3000
#define REFRESH_MIN_MS 100
#define MAX_HOPS 8
#define TRYAGAIN_MS 200

typedef struct {
    char host[128];
    int port;
} rc_node_t;

static rc_node_t nodes[SD_RC_NODES_MAX];
static atomic_int nnodes;
static int16_t slot_map[SD_RC_SLOTS]; /* -1: no primary known */
static unsigned char is_primary[SD_RC_NODES_MAX];
static atomic_int map_loaded;
static pthread_rwlock_t map_lock = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t refresh_mu = PTHREAD_MUTEX_INITIALIZER; /* also guards node appends */
static _Atomic int64_t last_refresh_ms;
static char password[128];
static _Atomic uint64_t st_refreshes, st_moved, st_asked, st_tryagain;
void (*sd__rc_event)(const char *what);

static void event(const char *what)
{
    if (sd__rc_event)
        sd__rc_event(what);
}

typedef struct {
    redisContext *c[SD_RC_NODES_MAX];
    uint64_t serial[SD_RC_NODES_MAX]; /* which of this thread's connections c[i] is */
    uint64_t opened;                  /* connections opened by this thread */
    int last;   /* node of this thread's last command, -1 none */
    int wnode;  /* node of the last write sd__rc_mark_write marked, -1 none */
    uint64_t wserial; /* and the connection that made it */
} rc_tls_t;

static _Thread_local rc_tls_t *tls;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------- slots ---------- */

/* CRC16-CCITT (XMODEM), the Redis Cluster key hash (cluster spec, appendix A). */
static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned sd__rc_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) & (SD_RC_SLOTS - 1);
    }
    return crc16(key, len) & (SD_RC_SLOTS - 1);
}

/* ---------- nodes and the map ---------- */

/* The index of host:port, added when new (caller holds refresh_mu). -1 when full. */
static int node_add_locked(const char *host, int port)
{
    int n = atomic_load(&nnodes);
    for (int i = 0; i < n; i++)
        if (nodes[i].port == port && strcmp(nodes[i].host, host) == 0)
            return i;
    if (n >= SD_RC_NODES_MAX || strlen(host) >= sizeof nodes[0].host)
        return -1;
    snprintf(nodes[n].host, sizeof nodes[n].host, "%s", host);
    nodes[n].port = port;
    atomic_store(&nnodes, n + 1);
    return n;
}

static int node_add(const char *host, int port)
{
    pthread_mutex_lock(&refresh_mu);
    int i = node_add_locked(host, port);
    pthread_mutex_unlock(&refresh_mu);
    return i;
}

/* "host:port" (host may be an IPv6 address, with or without brackets) into its parts. */
static int split_hostport(const char *s, size_t len, char *host, size_t cap, int *port)
{
    const char *colon = NULL;
    for (size_t i = len; i-- > 0;)
        if (s[i] == ':') {
            colon = s + i;
            break;
        }
    if (!colon || colon == s)
        return -1;
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (hl == 0 || hl >= cap || p < 1 || p > 65535 || end != s + len)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

static redisContext *open_node(const char *host, int port, int connect_ms)
{
    struct timeval ct = {connect_ms / 1000, (connect_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(host, port, ct);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    struct timeval tv = {COMMAND_TIMEOUT_MS / 1000, (COMMAND_TIMEOUT_MS % 1000) * 1000};
    redisSetTimeout(c, tv);
    redisEnableKeepAlive(c);
    if (password[0]) {
        redisReply *r = redisCommand(c, "AUTH %s", password);
        int ok = r && r->type != REDIS_REPLY_ERROR;
        if (r)
            freeReplyObject(r);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

/* Builds a map from one CLUSTER SLOTS reply of the node at host (whose empty host
 * fields mean "the address you used"). 0, or -1 when the reply is not a slot table. */
static int map_from_reply(const redisReply *r, const char *asked_host, int16_t *map,
                          unsigned char *prim)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return -1;
    for (int s = 0; s < SD_RC_SLOTS; s++)
        map[s] = -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            return -1;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        const char *host = e->element[2]->element[0]->str;
        if (!host[0] || strcmp(host, "?") == 0)
            host = asked_host;
        int idx = node_add_locked(host, (int)e->element[2]->element[1]->integer);
        if (lo < 0 || hi >= SD_RC_SLOTS || lo > hi || idx < 0)
            return -1;
        prim[idx] = 1;
        for (long long s = lo; s <= hi; s++)
            map[s] = (int16_t)idx;
    }
    return 0;
}

/* Reloads the slot map from the first node that answers CLUSTER SLOTS. Unless force,
 * does nothing within REFRESH_MIN_MS of the last load. 0 when a map was loaded. */
static int refresh(int force)
{
    pthread_mutex_lock(&refresh_mu);
    int64_t now = mono_ms();
    if (!force && map_loaded && now - atomic_load(&last_refresh_ms) < REFRESH_MIN_MS) {
        pthread_mutex_unlock(&refresh_mu);
        return 0;
    }
    atomic_store(&last_refresh_ms, now);
    static int16_t map[SD_RC_SLOTS]; /* under refresh_mu */
    unsigned char prim[SD_RC_NODES_MAX];
    int ok = -1, n = atomic_load(&nnodes);
    for (int i = 0; i < n && ok; i++) {
        redisContext *c = open_node(nodes[i].host, nodes[i].port, 300);
        if (!c)
            continue;
        redisReply *r = redisCommand(c, "CLUSTER SLOTS");
        memset(prim, 0, sizeof prim);
        if (r && map_from_reply(r, nodes[i].host, map, prim) == 0)
            ok = 0;
        if (r)
            freeReplyObject(r);
        redisFree(c);
    }
    if (ok == 0) {
        pthread_rwlock_wrlock(&map_lock);
        memcpy(slot_map, map, sizeof slot_map);
        memcpy(is_primary, prim, sizeof is_primary);
        map_loaded = 1;
        pthread_rwlock_unlock(&map_lock);
        atomic_fetch_add(&st_refreshes, 1);
        event("refresh");
    }
    pthread_mutex_unlock(&refresh_mu);
    return ok;
}

static int map_get(int slot)
{
    pthread_rwlock_rdlock(&map_lock);
    int n = map_loaded ? slot_map[slot] : -1;
    pthread_rwlock_unlock(&map_lock);
    return n;
}

static void map_set(int slot, int node)
{
    pthread_rwlock_wrlock(&map_lock);
    slot_map[slot] = (int16_t)node;
    is_primary[node] = 1;
    pthread_rwlock_unlock(&map_lock);
}

/* The i-th primary in node order, -1 when there are fewer. */
static int primary_at(int i)
{
    int n = atomic_load(&nnodes), found = -1;
    pthread_rwlock_rdlock(&map_lock);
    for (int k = 0; k < n && found < 0; k++)
        if (is_primary[k] && i-- == 0)
            found = k;
    pthread_rwlock_unlock(&map_lock);
    return found;
}

int sd__rc_primaries(void)
{
    if (!map_loaded)
        refresh(1);
    int n = atomic_load(&nnodes), count = 0;
    pthread_rwlock_rdlock(&map_lock);
    for (int k = 0; k < n; k++)
        count += is_primary[k];
    pthread_rwlock_unlock(&map_lock);
    return count;
}

int sd__rc_init(const char *seeds, const char *pw)
{
    sd__rc_fini();
    if (strlen(pw) >= sizeof password)
        return -EINVAL;
    snprintf(password, sizeof password, "%s", pw);
    const char *p = seeds;
    int added = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char host[128];
        int port;
        if (split_hostport(p, len, host, sizeof host, &port) || node_add(host, port) < 0)
            return -EINVAL;
        added++;
        p += len + (comma ? 1 : 0);
        if (comma && !*p)
            return -EINVAL;
    }
    return added ? 0 : -EINVAL;
}

void sd__rc_fini(void)
{
    pthread_mutex_lock(&refresh_mu);
    pthread_rwlock_wrlock(&map_lock);
    atomic_store(&nnodes, 0);
    memset(is_primary, 0, sizeof is_primary);
    map_loaded = 0;
    pthread_rwlock_unlock(&map_lock);
    pthread_mutex_unlock(&refresh_mu);
}

/* ---------- per-thread connections ---------- */

static void tls_destroy(void *p)
{
    rc_tls_t *t = p;
    for (int i = 0; i < SD_RC_NODES_MAX; i++)
        if (t->c[i])
            redisFree(t->c[i]);
    free(t);
}

static void tls_key_init(void) { pthread_key_create(&tls_key, tls_destroy); }

static rc_tls_t *thread_state(void)
{
    if (tls)
        return tls;
    pthread_once(&tls_once, tls_key_init);
    tls = calloc(1, sizeof *tls);
    if (!tls)
        return NULL;
    tls->last = -1;
    tls->wnode = -1;
    pthread_setspecific(tls_key, tls);
    return tls;
}

void sd__rc_thread_close(void)
{
    if (!tls)
        return;
    pthread_setspecific(tls_key, NULL);
    tls_destroy(tls);
    tls = NULL;
}

static void drop_conn(rc_tls_t *t, int node)
{
    if (t->c[node]) {
        redisFree(t->c[node]);
        t->c[node] = NULL;
    }
}

static redisContext *conn(rc_tls_t *t, int node)
{
    if (!t->c[node]) {
        t->c[node] = open_node(nodes[node].host, nodes[node].port, CONNECT_TIMEOUT_MS);
        if (t->c[node])
            t->serial[node] = ++t->opened;
    }
    return t->c[node];
}

redisContext *sd__rc_connect(int slot)
{
    if (!map_loaded)
        refresh(1);
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            refresh(0); /* the node is gone: maybe a failover moved its slots */
        if (slot >= 0) {
            int node = map_get(slot);
            redisContext *c = node >= 0 ? open_node(nodes[node].host, nodes[node].port,
                                                    CONNECT_TIMEOUT_MS)
                                        : NULL;
            if (c)
                return c;
            continue;
        }
        /* any primary: the first that answers */
        for (int i = 0, node; (node = primary_at(i)) >= 0; i++) {
            redisContext *c = open_node(nodes[node].host, nodes[node].port, CONNECT_TIMEOUT_MS);
            if (c)
                return c;
        }
    }
    return NULL;
}

/* ---------- commands ---------- */

/* The target of a MOVED or ASK error "<KIND> <slot> <host>:<port>": its node index (added
 * when new) and slot. -1 when the error is not of that shape. */
static int redirect_target(const char *err, int *slot)
{
    const char *sp = strchr(err, ' ');
    if (!sp)
        return -1;
    char *end;
    long s = strtol(sp + 1, &end, 10);
    if (end == sp + 1 || *end != ' ' || s < 0 || s >= SD_RC_SLOTS)
        return -1;
    char host[128];
    int port;
    if (split_hostport(end + 1, strlen(end + 1), host, sizeof host, &port))
        return -1;
    *slot = (int)s;
    return node_add(host, port);
}

static int peer_closed(const redisContext *c, int saved_errno)
{
    return c->err == REDIS_ERR_EOF ||
           (c->err == REDIS_ERR_IO && (saved_errno == ECONNRESET || saved_errno == EPIPE));
}

/* The node a command for slot goes to now (loading the map first if needed). */
static int route(rc_tls_t *t, int slot)
{
    if (!map_loaded)
        refresh(1);
    if (slot >= 0)
        return map_get(slot);
    if (t->last >= 0)
        return t->last;
    return primary_at(0);
}

static redisReply *command_at(int slot, int node, int argc, const char **argv,
                              const size_t *argl, enum sd_rc_fail *why)
{
    rc_tls_t *t = thread_state();
    *why = SD_RC_NO_NODE;
    if (!t)
        return NULL;
    int asking = 0, resent = 0;
    int64_t tryagain_until = 0;
    for (int hop = 0; hop < MAX_HOPS; hop++) {
        if (node < 0 && (node = route(t, slot)) < 0) {
            refresh(0);
            if ((node = route(t, slot)) < 0)
                return NULL; /* the slot has no primary (yet) */
        }
        redisContext *c = conn(t, node);
        if (!c) {
            /* the node is gone: maybe a failover moved its slots */
            refresh(0);
            int again = slot >= 0 ? map_get(slot) : primary_at(0);
            if (again < 0 || again == node)
                return NULL;
            node = again;
            continue;
        }
        if (asking) {
            redisReply *a = redisCommand(c, "ASKING");
            if (a)
                freeReplyObject(a);
        }
        errno = 0;
        redisReply *r = sd__command_argv(c, argc, argv, argl);
        if (!r) {
            int closed = peer_closed(c, errno);
            drop_conn(t, node);
            if (closed && !resent) { /* a stale connection: the command never ran */
                resent = 1;
                continue;
            }
            refresh(0);
            *why = closed ? SD_RC_NO_NODE : SD_RC_IO;
            return NULL;
        }
        t->last = node;
        if (r->type == REDIS_REPLY_ERROR) {
            int moved = strncmp(r->str, "MOVED ", 6) == 0, ask = strncmp(r->str, "ASK ", 4) == 0;
            if (moved || ask) {
                int s, target = redirect_target(r->str, &s);
                freeReplyObject(r);
                if (target < 0)
                    return NULL;
                if (moved) {
                    atomic_fetch_add(&st_moved, 1);
                    event("moved");
                    map_set(s, target);
                    refresh(0); /* the rest of the map probably moved too */
                } else {
                    atomic_fetch_add(&st_asked, 1);
                    event("ask");
                }
                asking = ask;
                node = target;
                continue;
            }
            if (strncmp(r->str, "TRYAGAIN", 8) == 0) {
                /* a multi-key command during a slot migration */
                freeReplyObject(r);
                atomic_fetch_add(&st_tryagain, 1);
                event("tryagain");
                int64_t now = mono_ms();
                if (!tryagain_until)
                    tryagain_until = now + TRYAGAIN_MS;
                if (now >= tryagain_until)
                    return NULL;
                struct timespec ts = {0, 20 * 1000000};
                nanosleep(&ts, NULL);
                asking = 0;
                node = -1;
                continue;
            }
            if (strncmp(r->str, "CLUSTERDOWN", 11) == 0) {
                freeReplyObject(r);
                refresh(0);
                return NULL;
            }
        }
        *why = SD_RC_OK;
        return r;
    }
    return NULL;
}

redisReply *sd__rc_command(int slot, int argc, const char **argv, const size_t *argl,
                           enum sd_rc_fail *why)
{
    return command_at(slot, -1, argc, argv, argl, why);
}

redisReply *sd__rc_command_primary(int i, int argc, const char **argv, const size_t *argl,
                                   enum sd_rc_fail *why)
{
    if (!map_loaded)
        refresh(1);
    int node = primary_at(i);
    if (node < 0) {
        *why = SD_RC_NO_NODE;
        return NULL;
    }
    /* a node-wide command (SCAN, INFO): no redirection applies */
    rc_tls_t *t = thread_state();
    redisContext *c = t ? conn(t, node) : NULL;
    if (!c) {
        refresh(0);
        *why = SD_RC_NO_NODE;
        return NULL;
    }
    errno = 0;
    redisReply *r = sd__command_argv(c, argc, argv, argl);
    if (!r) {
        *why = peer_closed(c, errno) ? SD_RC_NO_NODE : SD_RC_IO;
        drop_conn(t, node);
        return NULL;
    }
    t->last = node;
    *why = SD_RC_OK;
    return r;
}

void sd__rc_mark_write(void)
{
    rc_tls_t *t = thread_state();
    if (!t)
        return;
    t->wnode = t->last;
    t->wserial = t->last >= 0 ? t->serial[t->last] : 0;
}

redisReply *sd__rc_command_on_write(int argc, const char **argv, const size_t *argl,
                                    enum sd_rc_fail *why)
{
    rc_tls_t *t = thread_state();
    *why = SD_RC_NO_NODE;
    /* the very connection that made the write, or nothing: a new connection to the same
     * address may reach a restarted node, and another node's replicas never saw it */
    if (!t || t->wnode < 0 || !t->c[t->wnode] || t->serial[t->wnode] != t->wserial)
        return NULL;
    int node = t->wnode;
    errno = 0;
    redisReply *r = sd__command_argv(t->c[node], argc, argv, argl);
    if (!r) {
        *why = peer_closed(t->c[node], errno) ? SD_RC_NO_NODE : SD_RC_IO;
        drop_conn(t, node);
        refresh(0); /* the node may be gone: the next command finds the slot's new owner */
        return NULL;
    }
    t->last = node;
    *why = SD_RC_OK;
    return r;
}

void sd__rc_stats(sd_rc_stats_t *out)
{
    out->refreshes = atomic_load(&st_refreshes);
    out->moved = atomic_load(&st_moved);
    out->asked = atomic_load(&st_asked);
    out->tryagain = atomic_load(&st_tryagain);
}
