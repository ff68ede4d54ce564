/* Redis Sentinel: finds the current primary for store.c and follows failovers (see
 * sentinel.h for the sharing model). A failover shows up to the workers as I/O errors on
 * the old primary (it died) or READONLY replies (it was demoted); both report here, and
 * the next discovery moves every worker to the address the sentinels agree on. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "sd.h"
#include "sdtime.h"
#include "sentinel.h"

#define SENTINEL_MAX 8
#define PROBE_CONNECT_MS 300
#define PROBE_COMMAND_MS 500

static struct {
    int n;
    char host[SENTINEL_MAX][256];
    int port[SENTINEL_MAX];
    char name[128];
    char password[128];
} cfg;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char host[256];
    int port;
    int known;      /* a verified primary is known */
    int stale;      /* it was reported failing: rediscover before trusting it again */
    int busy;       /* a discovery is running (without the mutex held) */
    int64_t last_try_ms;
} cur;
static _Atomic uint64_t generation = 1;

/* The +switch-master subscriber thread. */
static pthread_t sub_thread;
static int sub_running;
static pthread_mutex_t sub_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sub_cond = PTHREAD_COND_INITIALIZER;
static int sub_stop; /* under sub_mu */

int sd__sentinel_init(const char *spec, const char *password)
{
    memset(&cfg, 0, sizeof cfg);
    const char *slash = strchr(spec, '/');
    if (!slash || !slash[1] || strlen(slash + 1) >= sizeof cfg.name ||
        strlen(password) >= sizeof cfg.password)
        return -EINVAL;
    if (!sd_name_valid(slash + 1, sizeof cfg.name - 1))
        return -EINVAL;
    sd_strlcpy(cfg.name, slash + 1, sizeof cfg.name);
    sd_strlcpy(cfg.password, password, sizeof cfg.password);
    if (slash == spec || slash[-1] == ',') /* no sentinel, or an empty last one */
        return -EINVAL;
    const char *p = spec;
    while (p < slash) {
        const char *comma = memchr(p, ',', (size_t)(slash - p));
        const char *end = comma ? comma : slash;
        char hp[300];
        size_t n = (size_t)(end - p);
        if (n == 0 || n >= sizeof hp || cfg.n >= SENTINEL_MAX)
            return -EINVAL;
        memcpy(hp, p, n);
        hp[n] = '\0';
        if (sd_parse_hostport(hp, cfg.host[cfg.n], sizeof cfg.host[0], &cfg.port[cfg.n]))
            return -EINVAL;
        cfg.n++;
        p = end + 1;
    }
    return cfg.n > 0 ? 0 : -EINVAL;
}

static redisContext *probe_connect(const char *host, int port)
{
    struct timeval ct = {0, PROBE_CONNECT_MS * 1000};
    redisContext *c = redisConnectWithTimeout(host, port, ct);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    struct timeval tv = {0, PROBE_COMMAND_MS * 1000};
    redisSetTimeout(c, tv);
    return c;
}

/* Asks one sentinel for the primary's address. 0 and host/port on an answer. */
static int ask_sentinel(int i, char *host, size_t cap, int *port)
{
    redisContext *c = probe_connect(cfg.host[i], cfg.port[i]);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", cfg.name);
    int rc = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[0]->len < cap) {
        int64_t p;
        if (sd_parse_i64(r->element[1]->str, 1, 65535, &p) == 0) {
            sd_strlcpy(host, r->element[0]->str, cap);
            *port = (int)p;
            rc = 0;
        }
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return rc;
}

/* 1 when host:port answers ROLE as a master (after AUTH when a password is set). */
static int is_master(const char *host, int port)
{
    redisContext *c = probe_connect(host, port);
    if (!c)
        return 0;
    int ok = 1;
    if (cfg.password[0]) {
        redisReply *a = redisCommand(c, "AUTH %s", cfg.password);
        ok = a && a->type != REDIS_REPLY_ERROR;
        if (a)
            freeReplyObject(a);
    }
    redisReply *r = ok ? redisCommand(c, "ROLE") : NULL;
    ok = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
         r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* One discovery round: the first sentinel that answers names the primary, which must
 * then confirm its role. 0: found; -1: no sentinel answered; -2: the named address is
 * not (or not yet) a primary, as while a failover is running. */
static int discover(char *host, size_t cap, int *port)
{
    for (int i = 0; i < cfg.n; i++) {
        if (ask_sentinel(i, host, cap, port))
            continue;
        return is_master(host, *port) ? 0 : -2;
    }
    return -1;
}

/* Runs a discovery if one is due and applies its outcome to `cur`. */
static void maybe_discover(void)
{
    pthread_mutex_lock(&mu);
    int64_t now = sd_mono_ms();
    int run = (cur.stale || !cur.known) && !cur.busy && now - cur.last_try_ms >= SD_SENTINEL_RETRY_MS;
    if (run) {
        cur.busy = 1;
        cur.last_try_ms = now;
    }
    pthread_mutex_unlock(&mu);
    if (!run)
        return;

    char host[256];
    int port = 0;
    int rc = discover(host, sizeof host, &port);

    pthread_mutex_lock(&mu);
    cur.busy = 0;
    if (rc == 0) {
        if (!cur.known || strcmp(cur.host, host) != 0 || cur.port != port) {
            sd_strlcpy(cur.host, host, sizeof cur.host);
            cur.port = port;
            atomic_fetch_add(&generation, 1);
            SD_COUNT("serverdir_redis_primary_changes_total",
                     "Times Sentinel discovery moved serverdir to a new Redis primary", 1);
            log_info("redis primary found", "master=%s addr=%s port=%d", cfg.name, host, port);
        }
        cur.known = 1;
        cur.stale = 0;
    } else if (rc == -2 && cur.known) {
        cur.known = 0;
        atomic_fetch_add(&generation, 1);
        log_warn("redis primary lost", "master=%s addr=%s port=%d", cfg.name, host, port);
    } else if (rc == -1 && !cur.known) {
        static int64_t logged_ms;
        if (!logged_ms || now - logged_ms > 10000) {
            logged_ms = now;
            log_error("no sentinel answered", "master=%s sentinels=%d", cfg.name, cfg.n);
        }
    }
    pthread_mutex_unlock(&mu);
}

int sd__sentinel_master(char *host, size_t cap, int *port, uint64_t *gen)
{
    maybe_discover();
    pthread_mutex_lock(&mu);
    int known = cur.known;
    if (known) {
        sd_strlcpy(host, cur.host, cap);
        *port = cur.port;
        *gen = atomic_load(&generation);
    }
    pthread_mutex_unlock(&mu);
    return known ? 0 : -1;
}

uint64_t sd__sentinel_gen(void) { return atomic_load(&generation); }

void sd__sentinel_failed(uint64_t gen, int lost)
{
    pthread_mutex_lock(&mu);
    if (gen == atomic_load(&generation) && cur.known) {
        cur.stale = 1;
        if (lost) {
            cur.known = 0;
            atomic_fetch_add(&generation, 1);
        }
    }
    pthread_mutex_unlock(&mu);
}

/* ---- the +switch-master subscriber ---- */

/* A sentinel announced that `name` moved: forget the primary so the next command of
 * every worker asks the sentinels (at once, not after the retry interval). */
static void switch_announced(const char *msg)
{
    size_t n = strlen(cfg.name);
    if (strncmp(msg, cfg.name, n) != 0 || msg[n] != ' ')
        return;
    pthread_mutex_lock(&mu);
    if (cur.known) {
        cur.known = 0;
        atomic_fetch_add(&generation, 1);
    }
    cur.stale = 1;
    cur.last_try_ms = 0;
    pthread_mutex_unlock(&mu);
    log_info("sentinel announced a failover", "switch=%s", msg);
}

/* Waits up to ms for sd__sentinel_stop; 1 when stopping. */
static int sub_wait(int ms)
{
    struct timespec ts = sd_timespec_after_ms(CLOCK_REALTIME, ms);
    pthread_mutex_lock(&sub_mu);
    while (!sub_stop && pthread_cond_timedwait(&sub_cond, &sub_mu, &ts) == 0)
        ;
    int stop = sub_stop;
    pthread_mutex_unlock(&sub_mu);
    return stop;
}

/* Reads +switch-master messages from one sentinel until the connection fails or a stop
 * is asked (checked every SUB_POLL_MS). */
#define SUB_POLL_MS 250
static void sub_listen(redisContext *c)
{
    redisReply *r = redisCommand(c, "SUBSCRIBE +switch-master");
    int ok = r && r->type == REDIS_REPLY_ARRAY;
    if (r)
        freeReplyObject(r);
    while (ok && !sub_wait(0)) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int n = poll(&p, 1, SUB_POLL_MS);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (redisBufferRead(c) != REDIS_OK)
            break;
        void *reply = NULL;
        while (redisGetReplyFromReader(c, &reply) == REDIS_OK && reply) {
            redisReply *m = reply;
            if (m->type == REDIS_REPLY_ARRAY && m->elements == 3 &&
                m->element[2]->type == REDIS_REPLY_STRING)
                switch_announced(m->element[2]->str);
            freeReplyObject(m);
            reply = NULL;
        }
        if (c->err)
            break;
    }
}

/* The subscriber: one sentinel at a time, the next one after a failure. */
static void *subscriber(void *arg)
{
    (void)arg;
    for (int i = 0; !sub_wait(0); i = (i + 1) % cfg.n) {
        redisContext *c = probe_connect(cfg.host[i], cfg.port[i]);
        if (c) {
            sub_listen(c);
            redisFree(c);
        }
        if (sub_wait(SD_SENTINEL_RETRY_MS * 5))
            break;
    }
    return NULL;
}

int sd__sentinel_start(void)
{
    sub_stop = 0;
    int rc = pthread_create(&sub_thread, NULL, subscriber, NULL);
    if (rc)
        return -rc;
    sub_running = 1;
    return 0;
}

void sd__sentinel_stop(void)
{
    if (!sub_running)
        return;
    pthread_mutex_lock(&sub_mu);
    sub_stop = 1;
    pthread_cond_broadcast(&sub_cond);
    pthread_mutex_unlock(&sub_mu);
    pthread_join(sub_thread, NULL);
    sub_running = 0;
}
