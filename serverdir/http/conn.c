/* Connection admission and deadlines; see conn.h for the states and why. Everything here
 * is under one mutex: the callbacks are short (a list move, a counter) and run once or
 * twice per request, and the deadline thread holds it only to walk the expired heads of
 * two lists kept in deadline order. */
#include "conn.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "sd.h"
#include "sdtime.h"

enum { C_HEAD, C_BODY, C_BUSY };

/* A source: an IPv4 address, or the /64 an IPv6 address is in (one host is given a
 * whole /64, so a per-address count of IPv6 would be no limit). */
typedef struct {
    unsigned char len; /* 4 or 8 bytes of addr */
    unsigned char addr[8];
} srckey_t;

typedef struct source {
    struct source *next;
    srckey_t key;
    int n; /* open connections from it */
} source_t;

typedef struct conn {
    struct conn *prev, *next; /* in the list of its state, when HEAD or BODY */
    int fd;
    int state;
    int authed;      /* BODY: the request carries a valid token */
    int evicted;     /* shut down here; libmicrohttpd has yet to close it */
    int64_t since;   /* when it entered its state (sd_mono_ms) */
    source_t *src;
} conn_t;

typedef struct {
    conn_t *head, *tail; /* oldest first: each list is in deadline order */
} clist_t;

#define NBUCKETS 4096
#define MAX_WORKERS 1024
#define REAPER_PERIOD_MS 250

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static sd_conn_limits_t lim;
static clist_t waiting, receiving; /* HEAD and BODY connections */
static int open_count;             /* tracked connections, less the evicted ones */
static source_t *buckets[NBUCKETS];
static pthread_t reaper;
static int reaper_started, reaper_stop;
static _Atomic int64_t reaper_stamp; /* sd_mono_ms of the deadline thread's last round */

/* ---------- lists and sources ---------- */

static void list_push(clist_t *l, conn_t *c)
{
    c->next = NULL;
    c->prev = l->tail;
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
}

static void list_del(clist_t *l, conn_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    c->prev = c->next = NULL;
}

static clist_t *list_of(const conn_t *c)
{
    if (c->evicted)
        return NULL;
    return c->state == C_HEAD ? &waiting : c->state == C_BODY ? &receiving : NULL;
}

/* Takes c off the list its state keeps it on, if any (under mu). */
static void unlist(conn_t *c)
{
    clist_t *l = list_of(c);
    if (l)
        list_del(l, c);
}

/* The source key of addr (IPv4-mapped IPv6 counts as IPv4); 0, or -1 for another family. */
static int srckey(const struct sockaddr *sa, srckey_t *k)
{
    memset(k, 0, sizeof *k);
    if (sa->sa_family == AF_INET) {
        k->len = 4;
        memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family != AF_INET6)
        return -1;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
        k->len = 4;
        memcpy(k->addr, a->s6_addr + 12, 4);
    } else {
        k->len = 8;
        memcpy(k->addr, a->s6_addr, 8);
    }
    return 0;
}

static source_t **bucket(const srckey_t *k)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < k->len; i++)
        h = (h ^ k->addr[i]) * 16777619u;
    return &buckets[h % NBUCKETS];
}

static source_t *source_find(const srckey_t *k)
{
    for (source_t *s = *bucket(k); s; s = s->next)
        if (s->key.len == k->len && !memcmp(s->key.addr, k->addr, k->len))
            return s;
    return NULL;
}

static void source_put(source_t *s)
{
    if (--s->n > 0)
        return;
    for (source_t **p = bucket(&s->key); *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    free(s);
}

/* An exempt source is one of lim.exempt exactly (the whole address, not its /64). */
static int exempt(const struct sockaddr *sa)
{
    srckey_t k;
    for (int i = 0; i < lim.nexempt; i++) {
        const struct sockaddr *e = (const struct sockaddr *)&lim.exempt[i];
        if (e->sa_family == AF_INET && srckey(sa, &k) == 0 && k.len == 4 &&
            !memcmp(k.addr, &((const struct sockaddr_in *)e)->sin_addr, 4))
            return 1;
        if (e->sa_family == AF_INET6 && sa->sa_family == AF_INET6 &&
            !memcmp(&((const struct sockaddr_in6 *)e)->sin6_addr,
                    &((const struct sockaddr_in6 *)sa)->sin6_addr, 16))
            return 1;
    }
    return 0;
}

/* ---------- closing ---------- */

/* Counts a refusal or a close by reason; one log line per reason at most every 10 s
 * (outsiders trigger these). open: the open connections then. */
enum { R_PER_SOURCE, R_FULL, R_EVICT_IDLE, R_EVICT_UNAUTH, R_HEADER_TIMEOUT, R_BODY_TIMEOUT, R_N };

static void note(int reason, int open)
{
    static _Atomic int64_t last_log[R_N];
    switch (reason) {
    case R_PER_SOURCE:
        SD_COUNT("serverdir_http_connections_refused_total{reason=\"per_source\"}",
                 "connections refused at accept, by reason", 1);
        break;
    case R_FULL:
        SD_COUNT("serverdir_http_connections_refused_total{reason=\"total\"}",
                 "connections refused at accept, by reason", 1);
        break;
    case R_EVICT_IDLE:
        SD_COUNT("serverdir_http_connections_closed_total{reason=\"evicted_idle\"}",
                 "connections closed by the connection limits and deadlines, by reason", 1);
        break;
    case R_EVICT_UNAUTH:
        SD_COUNT("serverdir_http_connections_closed_total{reason=\"evicted_unauthenticated\"}",
                 "connections closed by the connection limits and deadlines, by reason", 1);
        break;
    case R_HEADER_TIMEOUT:
        SD_COUNT("serverdir_http_connections_closed_total{reason=\"header_timeout\"}",
                 "connections closed by the connection limits and deadlines, by reason", 1);
        break;
    default:
        SD_COUNT("serverdir_http_connections_closed_total{reason=\"body_timeout\"}",
                 "connections closed by the connection limits and deadlines, by reason", 1);
        break;
    }
    static const char *const names[R_N] = {"per_source", "total", "evicted_idle",
                                           "evicted_unauthenticated", "header_timeout",
                                           "body_timeout"};
    int64_t now = sd_mono_ms(), last = atomic_load(&last_log[reason]);
    if (now - last >= 10000 && atomic_compare_exchange_strong(&last_log[reason], &last, now))
        log_warn("http connection refused or closed by the connection limits",
                 "reason=%s open=%d max=%d detail=%s", names[reason], open,
                 lim.max_total, "one line per reason per 10 s; see the metrics for counts");
}

/* Closes c (under mu): its socket is shut down, libmicrohttpd closes it on its thread.
 * Counted first: a peer that sees the close and then reads the metrics finds it counted
 * (it.conn_flood read the counter unmoved once, between the shutdown and the count). */
static void conn_close(conn_t *c, int reason)
{
    unlist(c);
    c->evicted = 1;
    open_count--;
    note(reason, open_count);
    shutdown(c->fd, SHUT_RDWR);
}

/* At the total limit: closes the oldest connection without a request in, else the oldest
 * one receiving the body of a request without a valid token. 0, or -1 when every open
 * connection is busy with a request or carries a token. */
static int evict_one(void)
{
    if (waiting.head) {
        conn_close(waiting.head, R_EVICT_IDLE);
        return 0;
    }
    for (conn_t *c = receiving.head; c; c = c->next)
        if (!c->authed) {
            conn_close(c, R_EVICT_UNAUTH);
            return 0;
        }
    return -1;
}

/* ---------- libmicrohttpd callbacks ---------- */

enum MHD_Result sd_conn_admit(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)cls;
    (void)len;
    srckey_t k;
    int reason = -1, open;
    pthread_mutex_lock(&mu);
    if (lim.max_per_source && srckey(addr, &k) == 0 && !exempt(addr)) {
        source_t *s = source_find(&k);
        if (s && s->n >= lim.max_per_source)
            reason = R_PER_SOURCE;
    }
    if (reason < 0 && open_count >= lim.max_total && evict_one())
        reason = R_FULL;
    open = open_count;
    pthread_mutex_unlock(&mu);
    if (reason < 0)
        return MHD_YES;
    note(reason, open);
    return MHD_NO;
}

/* A new connection enters HEAD; its source counts it. */
static conn_t *conn_open(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    srckey_t k;
    if (!fd || !ad || !ad->client_addr || srckey(ad->client_addr, &k))
        return NULL;
    conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd->connect_fd;
    c->state = C_HEAD;
    c->since = sd_mono_ms();
    pthread_mutex_lock(&mu);
    source_t *s = source_find(&k);
    if (!s && (s = calloc(1, sizeof *s))) {
        s->key = k;
        s->next = *bucket(&k);
        *bucket(&k) = s;
    }
    if (!s) {
        pthread_mutex_unlock(&mu);
        free(c);
        return NULL;
    }
    s->n++;
    c->src = s;
    open_count++;
    list_push(&waiting, c);
    pthread_mutex_unlock(&mu);
    return c;
}

void sd_conn_notify(void *cls, struct MHD_Connection *mc, void **socket_ctx,
                    enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_ctx = conn_open(mc); /* NULL (untracked) only when out of memory */
        return;
    }
    conn_t *c = *socket_ctx;
    if (!c)
        return;
    pthread_mutex_lock(&mu);
    unlist(c);
    if (!c->evicted)
        open_count--;
    source_put(c->src);
    pthread_mutex_unlock(&mu);
    free(c);
    *socket_ctx = NULL;
}

static conn_t *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Moves c to state (under mu), restarting its clock. An evicted connection stays out. */
static void conn_move(struct MHD_Connection *mc, int state, int authed)
{
    conn_t *c = conn_of(mc);
    if (!c)
        return;
    pthread_mutex_lock(&mu);
    unlist(c);
    c->state = state;
    c->authed = authed;
    c->since = sd_mono_ms();
    clist_t *l = list_of(c);
    if (l)
        list_push(l, c);
    pthread_mutex_unlock(&mu);
}

void sd_conn_head_done(struct MHD_Connection *mc, int authed) { conn_move(mc, C_BODY, authed); }
void sd_conn_body_done(struct MHD_Connection *mc) { conn_move(mc, C_BUSY, 1); }
void sd_conn_answer_done(struct MHD_Connection *mc) { conn_move(mc, C_HEAD, 0); }

/* ---------- the deadline thread ---------- */

/* Closes the expired heads of l (under mu); returns when its next one expires. */
static int64_t expire(clist_t *l, int64_t timeout, int reason, int64_t now)
{
    while (l->head && l->head->since + timeout <= now)
        conn_close(l->head, reason);
    return l->head ? l->head->since + timeout : INT64_MAX;
}

/* Wakes at the nearest deadline, at least every REAPER_PERIOD_MS (its stamp is part of
 * the watchdog check). */
static void *reaper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!reaper_stop) {
        int64_t now = sd_mono_ms();
        atomic_store(&reaper_stamp, now);
        int64_t next = expire(&waiting, lim.header_timeout_ms, R_HEADER_TIMEOUT, now);
        int64_t nb = expire(&receiving, lim.body_timeout_ms, R_BODY_TIMEOUT, now);
        if (nb < next)
            next = nb;
        int64_t wait = next - now < REAPER_PERIOD_MS ? next - now : REAPER_PERIOD_MS;
        struct timespec until = sd_timespec_after_ms(CLOCK_REALTIME, wait > 0 ? wait : 1);
        pthread_cond_timedwait(&cv, &mu, &until);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

int sd_conn_start(const sd_conn_limits_t *l)
{
    lim = *l;
    atomic_store(&reaper_stamp, sd_mono_ms());
    int rc = pthread_create(&reaper, NULL, reaper_main, NULL);
    if (rc)
        return -rc;
    reaper_started = 1;
    return 0;
}

void sd_conn_stop(void)
{
    if (!reaper_started)
        return;
    pthread_mutex_lock(&mu);
    reaper_stop = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(reaper, NULL);
    reaper_started = 0;
}

/* ---------- worker liveness ---------- */

/* The stamps of one kind of thread: libmicrohttpd's workers or the handler threads. */
typedef struct {
    _Atomic int n;                      /* threads that took a slot */
    _Atomic int expected;               /* threads of the kind, 0: as many as took slots */
    _Atomic int64_t entered[MAX_WORKERS]; /* sd_mono_ms of the callback it is in, or 0 */
    _Atomic int64_t took[MAX_WORKERS];    /* how long its previous callback took */
} stamps_t;

static stamps_t http_stamps, handler_stamps;
static _Thread_local int slot = -1; /* a thread is of one kind only */

static void stamp_enter(stamps_t *st)
{
    if (slot < 0) {
        int s = atomic_fetch_add(&st->n, 1);
        slot = s < MAX_WORKERS ? s : MAX_WORKERS - 1;
    }
    atomic_store(&st->entered[slot], sd_mono_ms());
}

static void stamp_leave(stamps_t *st)
{
    int64_t t0 = atomic_load(&st->entered[slot]);
    atomic_store(&st->took[slot], sd_mono_ms() - t0);
    atomic_store(&st->entered[slot], 0);
}

void sd_conn_worker_enter(void) { stamp_enter(&http_stamps); }
void sd_conn_worker_leave(void) { stamp_leave(&http_stamps); }
void sd_conn_handler_enter(void) { stamp_enter(&handler_stamps); }
void sd_conn_handler_leave(void) { stamp_leave(&handler_stamps); }
void sd_conn_handlers_expected(int n) { atomic_store(&handler_stamps.expected, n); }

/* 1 when every thread of st is stuck: inside a callback that began stuck_ms ago or more,
 * or inside one that follows a callback that took that long (a thread whose Redis calls
 * each time out goes from one to the next, and is no more able to answer in between). A
 * thread that never took a slot is idle. */
static int all_stuck(stamps_t *st, int64_t now, int64_t stuck_ms)
{
    int n = atomic_load(&st->n), expected = atomic_load(&st->expected);
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    if (!n || (expected && n < expected))
        return 0;
    for (int i = 0; i < n; i++) {
        int64_t e = atomic_load(&st->entered[i]);
        if (!e || (now - e < stuck_ms && atomic_load(&st->took[i]) < stuck_ms))
            return 0;
    }
    return 1;
}

/* The deadline thread is stuck when it missed its period by stuck_ms. */
const char *sd_conn_pool_stuck(int64_t stuck_ms)
{
    int64_t now = sd_mono_ms();
    if (now - atomic_load(&reaper_stamp) >= stuck_ms + REAPER_PERIOD_MS)
        return "the connection deadline thread is not running";
    if (all_stuck(&http_stamps, now, stuck_ms))
        return "every HTTP worker is stuck inside a request";
    if (all_stuck(&handler_stamps, now, stuck_ms))
        return "every handler thread is stuck inside a request";
    return NULL;
}
