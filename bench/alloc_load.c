/* alloc_load: the load generator of bench/alloc_bench.sh (docs/allocation.md). N
 * allocators, each with its own keep-alive connection, allocate instances of one service
 * for D seconds and record every allocation's latency; at the end one line:
 *
 *     mode=sd engine=loop release=machine clients=64 secs=5.00 allocs=51234 rate=10246
 *     p50_ms=2.41 p99_ms=6.80 rel_p50_ms=1.90 rel_p99_ms=5.20 double=0 no_capacity=0
 *     errors=0 machines=2 batches=4218 p90_ms=1.20 p999_ms=9.10 max_ms=12.40
 *
 * Modes (the first argument after the options):
 *
 *   sd URL CLUSTER SERVICE       POST URL/v1/clusters/CLUSTER/allocations
 *                                {"service":SERVICE,"payload":{"match":"m<thread>-<n>"}}
 *   redis HOST PORT LUADIR PREFIX CLUSTER SERVICE
 *                                the same alloc_create.lua (LUADIR: the build's copy with its
 *                                prelude) by EVALSHA with exactly the KEYS and ARGV serverdir
 *                                passes for that body (a call of one request, or with -g
 *                                the calls serverdir groups)
 *   refill URL CLUSTER SERVICE BUFFER SAMPLES
 *                                the pool refill time: SAMPLES times, wait until the service
 *                                shows BUFFER ready_free instances, pause 0.2-1.2 s (a random
 *                                phase against the primary's passes), allocate one, and time
 *                                from the 201 until ready_free is BUFFER again (polled every
 *                                10 ms); prints every sample and the median
 *
 * -p PERIOD_US paces each allocator to one allocation (cycle) per period, for latency
 * below saturation (a saturated closed loop's latency is only CLIENTS / rate).
 * -s HOST:PORT adds Redis's own figures over the phase: redis_us (EVALSHA time per
 * allocation, its release included unless -r none; the caller resets the statistics
 * first) and redis_cpu (% of one core).
 *
 * -r RELEASE says what follows each allocation in sd and redis modes:
 *   event   (default) the game's release as its Big Brother reports it: a "released" event
 *           for that instance and allocation, POSTed to /v1/clusters/C/events (sd), or the
 *           same events_apply.lua by EVALSHA with the batch normalized as serverdir passes
 *           it (redis); its latency is recorded apart from the allocation's. The instance is
 *           back in the pool when the release is answered, so the pool keeps its size.
 *   delete  DELETE /v1/clusters/C/allocations/{id} (sd and -e threads only).
 *   machine the release as the instance's machine's Big Brother reports it: queued on one
 *           connection per machine, which sends everything waiting (at most 500) in one
 *           batch whenever nothing is in flight on it; rel_* is the time from the
 *           allocation's answer to its release being applied. Allocators do not wait.
 *   none    no release: allocate until D seconds passed or the pool is empty (the first
 *           409 no_capacity ends the phase for every thread); afterwards, untimed, every
 *           allocation is released with events in batches of 1000, so the pool is whole
 *           again for the next phase.
 *
 * -g (redis, loop engine): the allocations go the way serverdir sends them (api_alloc.c,
 * group commit): queued, and each of 2 connections (serverdir's 2 allocator threads)
 * carries one alloc_create.lua call at a time with everything queued (at most 32); a
 * lone allocation goes at once. The releases (-r event, -r machine) go the same way
 * (api_processes.c): each of 2 more connections carries one events_apply.lua call at a
 * time with every batch queued (at most 32 batches and 1000 events). Without -g each
 * allocator or machine makes its own call of one request, as a client of the scripts
 * without serverdir would. Prints script_calls and per_call (allocation requests per
 * call), event_calls and batches_per_call.
 *
 * -e ENGINE: loop (default) drives every connection from one thread and one epoll (a
 * request is one send, its answer a recv or two: the generator's own CPU, taken from the
 * same cores as serverdir and Redis, stays small); threads runs one thread per allocator
 * with libcurl (sd) or hiredis (redis), as the first version did (not with -r machine).
 *
 * Double allocations: every 201's instance is looked up in a table instance -> open
 * allocation. An instance handed out while another allocation holds it and that
 * allocation's release was not yet sent is a double allocation (counted, the first few
 * printed on stderr). Once a release was sent the instance may come back at any time (the
 * script frees it before the answer reaches us).
 *
 * Built by bench/CMakeLists.txt (target alloc_load). */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/read.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_redis.h"
#include "sdutil.h"

#define MAX_CLIENTS 512
#define REPORTERS_MAX 256 /* -r machine: machines */
#define MAX_SAMPLES (1 << 18)
#define NAME_MAX_LEN 128
#define TABLE_BITS 18 /* instance table: up to 2^18 / 2 instances */
#define RELEASE_BATCH 1000
#define PAYLOAD_CAP 160 /* alloc_args: {"match":"<match>"} */
#define CANON_CAP 320 /* alloc_args: the canonical body around it */
#define EVENT_ID_TTL_MS "86400000" /* serverdir's defaults for events_apply.lua */
#define HISTORY_MAX "10000"
#define STOPPED_KEEP "10000"
#define STOPPED_TTL_MS "86400000"
#define CONFIRM_DEFAULT_MS "10000" /* api_alloc.c */
#define KEY_TTL_MS "86400000"
#define ALLOC_HEAD 4 /* alloc_create.lua's arguments: the call's, then ALLOC_PER per request */
#define ALLOC_PER 11
#define GROUP_MAX 32 /* api_alloc.c */
#define ARGS_MAX (ALLOC_HEAD + GROUP_MAX * ALLOC_PER)

enum mode { M_SD, M_REDIS, M_REFILL };
enum release { R_EVENT, R_DELETE, R_NONE, R_MACHINE };

static struct {
    enum mode mode;
    enum release release;
    const char *name;
    int clients;
    double secs;
    const char *url, *host, *luadir, *prefix, *cluster, *service;
    int port, buffer, samples;
    int threads; /* -e threads: one thread and libcurl/hiredis handle per allocator */
    int group;   /* -g: raw allocations grouped as serverdir groups them */
    int64_t period_us; /* -p: each allocator starts a cycle every period (0: at once) */
    char base[256], chan[256];
    char sha_alloc[41], sha_events[41];
} cfg;

static atomic_int stop_all; /* release none: the pool ran empty */
static atomic_int complaints; /* error messages printed (the first few only) */
static atomic_long run_nonce;

/* ---------- instance -> open allocation ---------- */

typedef struct {
    char instance[NAME_MAX_LEN + 1];
    char allocation[32];
    int state; /* 0 free, 1 held, 2 release sent */
} slot_t;

static slot_t *table;
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long doubles;

static slot_t *table_slot(const char *inst)
{
    uint32_t h = 2166136261u;
    for (const char *p = inst; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    size_t mask = ((size_t)1 << TABLE_BITS) - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        if (!table[i].instance[0])
            snprintf(table[i].instance, sizeof table[i].instance, "%s", inst);
        if (!strcmp(table[i].instance, inst))
            return &table[i];
    }
}

/* A 201 handed out inst under allocation id: a double allocation when another allocation
 * holds it and was not released. */
static void table_take(const char *inst, const char *id)
{
    pthread_mutex_lock(&table_mu);
    slot_t *s = table_slot(inst);
    if (s->state == 1) {
        if (atomic_fetch_add(&doubles, 1) < 5)
            fprintf(stderr, "alloc_load: DOUBLE ALLOCATION of %s: %s while %s is open\n", inst,
                    id, s->allocation);
    }
    s->state = 1;
    snprintf(s->allocation, sizeof s->allocation, "%s", id);
    pthread_mutex_unlock(&table_mu);
}

/* Allocation id of inst is being released (next = 2) or its release was answered
 * (next = 0); changes nothing when another allocation holds inst by now. */
static void table_mark(const char *inst, const char *id, int next)
{
    pthread_mutex_lock(&table_mu);
    slot_t *s = table_slot(inst);
    if (!strcmp(s->allocation, id))
        s->state = next;
    pthread_mutex_unlock(&table_mu);
}

/* ---------- one allocator ---------- */

typedef struct {
    char instance[NAME_MAX_LEN + 1], machine[NAME_MAX_LEN + 1], allocation[32];
} held_t;

typedef struct {
    int id;
    uint32_t *lat_us, *rel_us;
    size_t n, nrel;
    long errors, no_capacity;
    bench_body_t out; /* the last answer */
    CURL *h;
    redisContext *r;
    held_t *held; /* release none: what to release afterwards */
    size_t nheld, capheld;
} client_t;

static struct curl_slist *json_hdrs; /* made once in main */

/* One HTTP request on the client's keep-alive handle; the status (0: transport error). */
static long http(client_t *c, const char *method, const char *url, const char *body)
{
    c->out.len = 0;
    c->out.buf[0] = '\0';
    curl_easy_reset(c->h); /* keeps the connection */
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, json_hdrs);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, bench_body_sink);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, &c->out);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, 10000L);
    if (body) {
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    long status = 0;
    if (curl_easy_perform(c->h) == CURLE_OK)
        curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

/* The string value of "field":"..." in text into out (0), or -1. */
static int json_str(const char *text, const char *field, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", field);
    const char *p = strstr(text, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    const char *q = strchr(p, '"');
    if (!q || (size_t)(q - p) >= cap)
        return -1;
    memcpy(out, p, (size_t)(q - p));
    out[q - p] = '\0';
    return 0;
}

/* The integer after "field": in text, or -1 when absent. */
static long long json_int(const char *text, const char *field)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", field);
    const char *p = strstr(text, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* EVALSHA sha 1 <key base> argv... as RESP, malloc'd (redisFreeCommand); its length. */
static long long evalsha_format(char **cmd, const char *sha, int argc, const char **argv)
{
    const char *a[4 + ARGS_MAX];
    size_t l[4 + ARGS_MAX];
    a[0] = "EVALSHA", a[1] = sha, a[2] = "1", a[3] = cfg.base;
    for (int i = 0; i < argc; i++)
        a[4 + i] = argv[i];
    for (int i = 0; i < argc + 4; i++)
        l[i] = strlen(a[i]);
    return redisFormatCommandArgv(cmd, argc + 4, a, l);
}

static redisReply *evalsha(redisContext *r, const char *sha, int argc, const char **argv)
{
    char *cmd;
    long long n = evalsha_format(&cmd, sha, argc, argv);
    redisReply *rep = NULL;
    if (n > 0 && redisAppendFormattedCommand(r, cmd, (size_t)n) == REDIS_OK)
        redisGetReply(r, (void **)&rep);
    redisFreeCommand(cmd);
    return rep;
}

/* The value of field name in a flat {status, field, value, ...} script reply into out. */
static int reply_field(const redisReply *rep, const char *name, char *out, size_t cap)
{
    for (size_t i = 1; i + 1 < rep->elements; i += 2) {
        if (rep->element[i]->type == REDIS_REPLY_STRING && !strcmp(rep->element[i]->str, name) &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING) {
            snprintf(out, cap, "%s", rep->element[i + 1]->str);
            return 0;
        }
    }
    return -1;
}

/* The body serverdir gets for one allocation of payload {"match":"<match>"}. */
static void alloc_body(const char *match, char *body, size_t cap)
{
    snprintf(body, cap, "{\"service\":\"%s\",\"payload\":{\"match\":\"%s\"}}", cfg.service, match);
}

/* What serverdir passes to alloc_create.lua (api_alloc.c group_call): first the call's
 * 4 arguments (the channel, the cluster, the defaults) into argv[0..4), then per request
 * alloc_args's 11 for that body: mode ready, strategy packed, 0 players, no selector, the
 * compact payload, no idempotency key, the body's canonical text (sorted keys, compact),
 * pointing into payload and canon, the owner and the viewer of serverdir in open mode
 * (principal "open", role ops: sees all). */
static void alloc_head(const char *argv[ALLOC_HEAD])
{
    const char *a[] = {cfg.chan, cfg.cluster, CONFIRM_DEFAULT_MS, KEY_TTL_MS};
    memcpy(argv, a, sizeof a);
}

static void alloc_args(const char *match, char payload[PAYLOAD_CAP], char canon[CANON_CAP],
                       const char *argv[ALLOC_PER])
{
    int n = snprintf(payload, PAYLOAD_CAP, "{\"match\":\"%s\"}", match);
    int m = snprintf(canon, CANON_CAP, "{\"payload\":%s,\"service\":\"%s\"}", payload, cfg.service);
    if (n < 0 || n >= PAYLOAD_CAP || m < 0 || m >= CANON_CAP) {
        fprintf(stderr, "alloc_load: match or service name too long\n");
        exit(2);
    }
    const char *a[] = {cfg.service, "ready", "packed", "0", "", "", payload, "", canon, "open", ""};
    memcpy(argv, a, sizeof a);
}

/* serverdir's answer to an allocation: 1 allocated (into *out), 0 no_capacity, -1 error. */
static int alloc_http_answer(long st, const char *body, held_t *out)
{
    if (st == 409 && strstr(body, "no_capacity"))
        return 0;
    if (st != 201 || json_str(body, "allocation", out->allocation, sizeof out->allocation) ||
        json_str(body, "instance", out->instance, sizeof out->instance) ||
        json_str(body, "machine", out->machine, sizeof out->machine)) {
        if (atomic_fetch_add(&complaints, 1) < 5)
            fprintf(stderr, "alloc_load: allocation answered %ld: %.300s\n", st, body);
        return -1;
    }
    return 1;
}

/* alloc_create.lua's reply (NULL: transport error, errstr says why), the same way. */
static int alloc_redis_answer(const redisReply *rep, const char *errstr, held_t *out)
{
    int rc = -1;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
        rep->element[0]->type == REDIS_REPLY_ARRAY) /* a call of one request */
        rep = rep->element[0];
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
        rep->element[0]->type == REDIS_REPLY_STRING) {
        if (!strcmp(rep->element[0]->str, "no_capacity"))
            rc = 0;
        else if (!strcmp(rep->element[0]->str, "created") &&
                 !reply_field(rep, "allocation", out->allocation, sizeof out->allocation) &&
                 !reply_field(rep, "instance", out->instance, sizeof out->instance) &&
                 !reply_field(rep, "machine", out->machine, sizeof out->machine))
            rc = 1;
    }
    if (rc < 0 && atomic_fetch_add(&complaints, 1) < 5)
        fprintf(stderr, "alloc_load: alloc_create answered %s\n",
                !rep ? errstr : rep->type == REDIS_REPLY_ERROR ? rep->str : "an odd reply");
    return rc;
}

/* One allocation on the client's own blocking connection (threads and refill). */
static int allocate(client_t *c, const char *match, held_t *out)
{
    if (cfg.mode != M_REDIS) {
        char url[512], body[512];
        snprintf(url, sizeof url, "%s/v1/clusters/%s/allocations", cfg.url, cfg.cluster);
        alloc_body(match, body, sizeof body);
        return alloc_http_answer(http(c, "POST", url, body), c->out.buf, out);
    }
    char payload[PAYLOAD_CAP], canon[CANON_CAP];
    const char *argv[ALLOC_HEAD + ALLOC_PER];
    alloc_head(argv);
    alloc_args(match, payload, canon, argv + ALLOC_HEAD);
    redisReply *rep = evalsha(c->r, cfg.sha_alloc, ALLOC_HEAD + ALLOC_PER, argv);
    int rc = alloc_redis_answer(rep, c->r->errstr, out);
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* The batch releasing n allocations with "released" events: serverdir's events body
 * (sd) or events_apply.lua's normalized batch (redis); malloc'd. */
static char *release_body(const client_t *c, const held_t *hs, size_t n, long seq)
{
    size_t cap = n * 512 + 64;
    char *b = malloc(cap);
    size_t o = 0;
    int sd = cfg.mode == M_SD;
    o += (size_t)snprintf(b + o, cap - o, sd ? "{\"events\":[" : "[");
    for (size_t i = 0; i < n; i++) {
        const held_t *h = &hs[i];
        char id[96];
        snprintf(id, sizeof id, "rel-%lx-%d-%ld-%zu", (long)atomic_load(&run_nonce), c->id, seq, i);
        if (sd)
            o += (size_t)snprintf(b + o, cap - o,
                                  "%s{\"id\":\"%s\",\"type\":\"released\",\"instance\":\"%s\","
                                  "\"machine\":\"%s\",\"service\":\"%s\",\"allocation\":\"%s\"}",
                                  i ? "," : "", id, h->instance, h->machine, cfg.service,
                                  h->allocation);
        else /* normalized: fields in serverdir's order (directory.c event_normalize) */
            o += (size_t)snprintf(b + o, cap - o,
                                  "%s[\"id\",\"%s\",\"type\",\"released\",\"instance\",\"%s\","
                                  "\"machine\",\"%s\",\"service\",\"%s\",\"allocation\",\"%s\"]",
                                  i ? "," : "", id, h->instance, h->machine, cfg.service,
                                  h->allocation);
    }
    snprintf(b + o, cap - o, sd ? "]}" : "]");
    return b;
}

/* The 10 arguments of events_apply.lua for one normalized batch: the call's 8 (serverdir's
 * defaults, live processes per machine 10000 and 100 above capacity), then the batch's
 * bound machine (none) and the batch. More batches add two each. */
#define EV_HEAD 8
static void release_args(const char *batch, const char *argv[EV_HEAD + 2])
{
    const char *a[] = {EVENT_ID_TTL_MS, HISTORY_MAX, STOPPED_KEEP, STOPPED_TTL_MS,
                       cfg.chan, cfg.cluster, "10000", "100", "", batch};
    memcpy(argv, a, sizeof a);
}

/* Whether a release of n answered "all applied": serverdir's answer, or events_apply's. */
static int release_http_ok(long st, const char *body, size_t n)
{
    int ok = st == 200 && json_int(body, "accepted") == (long long)n && json_int(body, "stale") == 0;
    if (!ok && atomic_fetch_add(&complaints, 1) < 5)
        fprintf(stderr, "alloc_load: release answered %ld: %.300s\n", st, body);
    return ok;
}

/* rep: events_apply's answer; idx: the batch's place in its call (0: the first). */
static int release_redis_ok(const redisReply *rep, int idx, size_t n)
{
    size_t at = idx ? 6 + 3 * (size_t)(idx - 1) : 0; /* its accepted, duplicates, stale */
    int ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= at + 3 &&
             rep->element[at]->integer == (long long)n && rep->element[at + 2]->integer == 0;
    if (!ok && atomic_fetch_add(&complaints, 1) < 5)
        fprintf(stderr, "alloc_load: events_apply answered %s\n",
                rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "an odd reply");
    return ok;
}

/* Releases n allocations in one batch on the client's blocking connection. 0 when all
 * were applied. */
static int release_events(client_t *c, const held_t *hs, size_t n, long seq)
{
    char *b = release_body(c, hs, n, seq);
    int ok;
    if (cfg.mode == M_SD) {
        char url[512];
        snprintf(url, sizeof url, "%s/v1/clusters/%s/events", cfg.url, cfg.cluster);
        long st = http(c, "POST", url, b);
        ok = release_http_ok(st, c->out.buf, n);
    } else {
        const char *argv[EV_HEAD + 2];
        release_args(b, argv);
        redisReply *rep = evalsha(c->r, cfg.sha_events, EV_HEAD + 2, argv);
        ok = release_redis_ok(rep, 0, n);
        if (rep)
            freeReplyObject(rep);
    }
    free(b);
    return ok ? 0 : -1;
}

/* DELETE of one allocation (sd only); 0 when it ended. */
static int release_delete(client_t *c, const held_t *h)
{
    char url[512];
    snprintf(url, sizeof url, "%s/v1/clusters/%s/allocations/%s", cfg.url, cfg.cluster,
             h->allocation);
    return http(c, "DELETE", url, NULL) == 200 && strstr(c->out.buf, "\"changed\":true") ? 0 : -1;
}

static void keep_held(client_t *c, const held_t *h)
{
    if (c->nheld == c->capheld) {
        c->capheld = c->capheld ? 2 * c->capheld : 1024;
        c->held = realloc(c->held, c->capheld * sizeof *c->held);
    }
    c->held[c->nheld++] = *h;
}

static void record(uint32_t *v, size_t *n, int64_t us)
{
    if (*n < MAX_SAMPLES)
        v[(*n)++] = (uint32_t)us;
}

/* Accounts for one allocation's outcome rc (allocate's) after lat_us: errors, no
 * capacity (which ends a release-none phase), the latency and the double-allocation
 * table. Returns 1 when the allocation must now be released by the caller. */
static int alloc_account(client_t *c, int rc, int64_t lat_us, const held_t *h)
{
    if (rc < 0) {
        c->errors++;
        return 0;
    }
    if (rc == 0) {
        c->no_capacity++;
        if (cfg.release == R_NONE)
            atomic_store(&stop_all, 1);
        return 0;
    }
    record(c->lat_us, &c->n, lat_us);
    table_take(h->instance, h->allocation);
    if (cfg.release == R_NONE) {
        keep_held(c, h);
        return 0;
    }
    return 1;
}

/* -s HOST:PORT: Redis's own figures over the phase (INFO cpu and commandstats; the
 * caller resets the command statistics before the phase). */
typedef struct {
    double cpu_s;        /* used_cpu_sys + used_cpu_user */
    long long evalsha_us; /* time spent in EVALSHA since the reset */
    int64_t at_us;
} stats_t;

static const char *stats_addr;
static stats_t stats_begin, stats_end;

static void stats_read(stats_t *st)
{
    st->at_us = sd_mono_us();
    if (!stats_addr)
        return;
    char host[256];
    snprintf(host, sizeof host, "%s", stats_addr);
    char *colon = strrchr(host, ':');
    if (!colon)
        return;
    *colon = '\0';
    redisContext *r = redisConnect(host, atoi(colon + 1));
    redisReply *rep = r && !r->err ? redisCommand(r, "INFO all") : NULL;
    if (rep && rep->type == REDIS_REPLY_STRING) { /* RESP2: a bulk string */
        const char *p;
        if ((p = strstr(rep->str, "used_cpu_sys:")))
            st->cpu_s = atof(p + 13);
        if ((p = strstr(rep->str, "used_cpu_user:")))
            st->cpu_s += atof(p + 14);
        if ((p = strstr(rep->str, "cmdstat_evalsha:calls=")) && (p = strstr(p, "usec=")))
            st->evalsha_us = atoll(p + 5);
    }
    if (rep)
        freeReplyObject(rep);
    if (r)
        redisFree(r);
}

static int64_t t_end_us; /* when the measured phase ends */
static pthread_barrier_t done; /* every allocator stopped (release none, stats) */
static _Atomic int64_t t_last_us; /* release none: when the last thread stopped allocating */

static void *client_main(void *arg)
{
    client_t *c = arg;
    if (cfg.mode == M_SD) {
        c->h = curl_easy_init();
    } else {
        c->r = redisConnect(cfg.host, cfg.port);
        if (!c->r || c->r->err) {
            fprintf(stderr, "alloc_load: cannot connect to redis\n");
            exit(1);
        }
    }
    long seq = 0;
    /* -p: one cycle per period, the allocators' starts spread over the first one */
    int64_t next = sd_mono_us() + cfg.period_us * c->id / cfg.clients;
    while (sd_mono_us() < t_end_us && !atomic_load(&stop_all)) {
        if (cfg.period_us) {
            int64_t wait = next - sd_mono_us();
            if (wait > 0) {
                struct timespec ts = {(time_t)(wait / 1000000), (long)(wait % 1000000) * 1000};
                nanosleep(&ts, NULL);
            }
            next += cfg.period_us;
        }
        char match[48];
        snprintf(match, sizeof match, "m%d-%ld", c->id, seq++);
        held_t h;
        int64_t t0 = sd_mono_us();
        int rc = allocate(c, match, &h);
        if (!alloc_account(c, rc, sd_mono_us() - t0, &h))
            continue;
        table_mark(h.instance, h.allocation, 2);
        int64_t t1 = sd_mono_us();
        rc = cfg.release == R_EVENT ? release_events(c, &h, 1, seq) : release_delete(c, &h);
        if (rc) {
            c->errors++;
            continue;
        }
        if (c->nrel < MAX_SAMPLES)
            c->rel_us[c->nrel++] = (uint32_t)(sd_mono_us() - t1);
        table_mark(h.instance, h.allocation, 0);
    }
    int64_t now = sd_mono_us(), last = atomic_load(&t_last_us);
    while (now > last && !atomic_compare_exchange_weak(&t_last_us, &last, now))
        ;
    /* Nothing is released below before every thread stopped allocating (one could be
     * handed an instance released here), and Redis's figures are read in between. */
    pthread_barrier_wait(&done);
    if (c->id == 0)
        stats_read(&stats_end);
    pthread_barrier_wait(&done);
    /* release none: give everything back, untimed, in batches */
    for (size_t i = 0; i < c->nheld; i++)
        table_mark(c->held[i].instance, c->held[i].allocation, 0);
    for (size_t i = 0; i < c->nheld; i += RELEASE_BATCH) {
        size_t n = c->nheld - i < RELEASE_BATCH ? c->nheld - i : RELEASE_BATCH;
        if (release_events(c, c->held + i, n, -(long)(i + 1)))
            c->errors++;
    }
    if (c->h)
        curl_easy_cleanup(c->h);
    if (c->r)
        redisFree(c->r);
    free(c->held);
    return NULL;
}

/* ---------- the loop engine (default): one thread, every connection on one epoll ----------
 *
 * The threaded engine (-e threads) costs more CPU than serverdir itself: 64 threads each
 * blocking in libcurl (poll, send, recv and a handle reset per request). On a 2-core machine the
 * generator's cost is taken from serverdir and Redis, so the loop engine drives every
 * allocator from one thread: a request is one send, its answer one or two recvs, and one
 * epoll_wait serves all connections. HTTP/1.1 keep-alive with Content-Length answers
 * (serverdir's), RESP by hiredis's reader: the same client for both sides. */

enum { CS_IDLE, CS_ALLOC, CS_RELEASE, CS_QUEUED, CS_RQUEUED };

typedef struct {
    client_t *c;
    int fd;
    int st;              /* CS_*: what is in flight */
    int64_t sent_us;     /* when the request in flight was sent */
    int64_t next_us;     /* -p: when the next cycle may start */
    long seq;
    held_t h;
    int reporter;        /* -r machine: this connection is a machine's Big Brother */
    char machine[NAME_MAX_LEN + 1];
    held_t *queue, *batch; /* reporter: releases waiting, and the batch in flight */
    size_t nqueue, capqueue, nbatch;
    int64_t *queued_us, *batch_us; /* when each release was queued */
    char *in;            /* the answer so far (HTTP) */
    size_t ilen;
    redisReader *rd;     /* the answer so far (RESP) */
    char match[48];      /* -g: the queued allocation's match */
    int group;           /* -g: this is group connection group - 1 (0: not one) */
    int egroup;          /* -g: this is events group connection egroup - 1 (0: not one) */
    char *ebatch;        /* -g: the queued release batch (normalized), and its size */
    size_t enevents;
    int eidx;            /* -g: its batch's place in the events call's reply */
} conn_t;

/* -g (raw): serverdir's group commit (api_alloc.c) done by the generator, so that the raw
 * side runs the very calls serverdir makes: an allocator's allocation queues (CS_QUEUED);
 * each of GROUP_CONNS connections (serverdir's ALLOC_THREADS) carries one alloc_create.lua
 * call at a time with everything queued (at most GROUP_MAX, in arrival order); a lone
 * allocation goes at once, alone. */
#define GROUP_CONNS 2
static conn_t *grp[GROUP_CONNS], *gq[MAX_CLIENTS], *gin[GROUP_CONNS][GROUP_MAX];
static int ngq, ngin[GROUP_CONNS];
static long group_calls, group_requests;

/* -g: the releases as serverdir groups them (api_processes.c): a release batch queues
 * (CS_RQUEUED); each of EGROUP_CONNS connections carries one events_apply.lua call at a
 * time with the queued batches (at most EGROUP_MAX batches and EGROUP_EVENTS events, the
 * first always). */
#define EGROUP_CONNS 2
#define EGROUP_MAX 32
#define EGROUP_EVENTS 1000
static conn_t *egrp[EGROUP_CONNS], *eq[MAX_CLIENTS + REPORTERS_MAX];
static conn_t *ein[EGROUP_CONNS][EGROUP_MAX];
static int neq, nein[EGROUP_CONNS];
static long egroup_calls, egroup_batches;

#define IN_CAP (64 << 10)

static char sd_host[256];
static int sd_port;

static int conn_open(const char *host, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai)) {
        fprintf(stderr, "alloc_load: cannot resolve %s\n", host);
        exit(1);
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        fprintf(stderr, "alloc_load: cannot connect to %s:%d: %s\n", host, port, strerror(errno));
        exit(1);
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Sends the whole request. An allocation (a few hundred bytes on a connection with
 * nothing in flight) goes in one send; a large release batch may wait for the socket
 * buffer (poll), holding up the loop for that long. Exits on an error. */
static void conn_send(conn_t *k, const char *p, size_t n)
{
    k->sent_us = sd_mono_us();
    k->ilen = 0;
    for (size_t off = 0; off < n;) {
        ssize_t w = send(k->fd, p + off, n - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd pf = {.fd = k->fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
        } else {
            fprintf(stderr, "alloc_load: send: %s\n", w < 0 ? strerror(errno) : "nothing sent");
            exit(1);
        }
    }
}

static void http_send(conn_t *k, const char *path, const char *body)
{
    size_t bl = strlen(body), cap = bl + 1024;
    char *req = malloc(cap);
    int n = snprintf(req, cap,
                     "POST /v1/clusters/%s/%s HTTP/1.1\r\nHost: %s:%d\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     cfg.cluster, path, sd_host, sd_port, bl);
    if (n < 0 || (size_t)n + bl >= cap) {
        fprintf(stderr, "alloc_load: request too large\n");
        exit(1);
    }
    memcpy(req + n, body, bl);
    conn_send(k, req, (size_t)n + bl);
    free(req);
}

static void resp_send(conn_t *k, const char *sha, int argc, const char **argv)
{
    char *cmd;
    long long n = evalsha_format(&cmd, sha, argc, argv);
    conn_send(k, cmd, (size_t)n);
    redisFreeCommand(cmd);
}

/* Starts the connection's next cycle: an allocation. */
static void cycle_start(conn_t *k)
{
    char match[48];
    snprintf(match, sizeof match, "m%d-%ld", k->c->id, k->seq++);
    if (cfg.mode == M_SD) {
        char body[512];
        alloc_body(match, body, sizeof body);
        http_send(k, "allocations", body);
    } else if (cfg.group) {
        snprintf(k->match, sizeof k->match, "%s", match);
        k->sent_us = sd_mono_us();
        gq[ngq++] = k;
        k->st = CS_QUEUED;
        return;
    } else {
        char payload[PAYLOAD_CAP], canon[CANON_CAP];
        const char *argv[ALLOC_HEAD + ALLOC_PER];
        alloc_head(argv);
        alloc_args(match, payload, canon, argv + ALLOC_HEAD);
        resp_send(k, cfg.sha_alloc, ALLOC_HEAD + ALLOC_PER, argv);
    }
    k->st = CS_ALLOC;
}

/* -g: one call with the queued allocations on group connection g (idle). */
static void group_send(int g)
{
    static char payload[GROUP_MAX][PAYLOAD_CAP], canon[GROUP_MAX][CANON_CAP];
    const char *argv[ARGS_MAX];
    int n = ngq < GROUP_MAX ? ngq : GROUP_MAX;
    alloc_head(argv);
    for (int i = 0; i < n; i++) {
        gin[g][i] = gq[i];
        alloc_args(gq[i]->match, payload[i], canon[i],
                   argv + ALLOC_HEAD + i * ALLOC_PER);
    }
    memmove(gq, gq + n, (size_t)(ngq - n) * sizeof *gq);
    ngq -= n;
    ngin[g] = n;
    resp_send(grp[g], cfg.sha_alloc, ALLOC_HEAD + n * ALLOC_PER, argv);
    grp[g]->st = CS_ALLOC;
    group_calls++;
    group_requests += n;
}

/* -g: one events_apply.lua call with the queued batches on events connection g (idle). */
static void egroup_send(int g)
{
    const char *argv[EV_HEAD + 2 * EGROUP_MAX];
    int n = 0;
    size_t events = 0;
    while (n < neq && n < EGROUP_MAX && (n == 0 || events + eq[n]->enevents <= EGROUP_EVENTS)) {
        ein[g][n] = eq[n];
        eq[n]->eidx = n;
        events += eq[n]->enevents;
        n++;
    }
    release_args(ein[g][0]->ebatch, argv);
    for (int i = 1; i < n; i++) {
        argv[EV_HEAD + 2 * i] = "";
        argv[EV_HEAD + 2 * i + 1] = ein[g][i]->ebatch;
    }
    memmove(eq, eq + n, (size_t)(neq - n) * sizeof *eq);
    neq -= n;
    nein[g] = n;
    resp_send(egrp[g], cfg.sha_events, EV_HEAD + 2 * n, argv);
    for (int i = 0; i < n; i++) {
        free(ein[g][i]->ebatch);
        ein[g][i]->ebatch = NULL;
    }
    egrp[g]->st = CS_RELEASE;
    egroup_calls++;
    egroup_batches += n;
}

/* Sends n releases in one batch (POST .../events, or events_apply.lua). */
static void releases_send(conn_t *k, const held_t *hs, size_t n, long seq)
{
    char *b = release_body(k->c, hs, n, seq);
    if (cfg.mode == M_SD) {
        http_send(k, "events", b);
    } else if (cfg.group) {
        k->ebatch = b; /* the call's now */
        k->enevents = n;
        k->sent_us = sd_mono_us();
        eq[neq++] = k;
        k->st = CS_RQUEUED;
        return;
    } else {
        const char *argv[EV_HEAD + 2];
        release_args(b, argv);
        resp_send(k, cfg.sha_events, EV_HEAD + 2, argv);
    }
    free(b);
    k->st = CS_RELEASE;
}

static void release_start(conn_t *k) { releases_send(k, &k->h, 1, k->seq); }

/* A whole HTTP answer in k->in: its status, with *body pointing at its (NUL-ended) body;
 * 0 when more is needed; -1 when it cannot be read. */
static long http_answer(conn_t *k, char **body)
{
    k->in[k->ilen] = '\0';
    char *end = strstr(k->in, "\r\n\r\n");
    if (!end)
        return k->ilen >= IN_CAP - 1 ? -1 : 0;
    *end = '\0';
    const char *cl = strcasestr(k->in, "\r\ncontent-length:");
    long st = strncmp(k->in, "HTTP/1.1 ", 9) ? -1 : strtol(k->in + 9, NULL, 10);
    *end = '\r';
    if (!cl || st < 100)
        return -1;
    size_t want = (size_t)(end + 4 - k->in) + (size_t)strtoul(cl + 17, NULL, 10);
    if (want >= IN_CAP)
        return -1;
    if (k->ilen < want)
        return 0;
    if (k->ilen > want) /* nothing else was asked for */
        return -1;
    *body = end + 4;
    return st;
}

/* -r machine: one connection per machine seen, created on its first allocation, that
 * reports the releases of the machine's instances the way a Big Brother's reporter does
 * (bigbrother/report/reporter.c): whenever nothing is in flight, everything waiting (at most
 * REPORT_MAX) goes in one POST .../events (events_apply.lua with the whole batch, raw). */
#define REPORT_MAX 500

static conn_t *reporters[REPORTERS_MAX];
static int nreporters;
static client_t reporter_clients[REPORTERS_MAX];
static conn_t *reporter_new(const char *machine); /* in loop_run's scope below */

static void reporter_queue(const held_t *h, int64_t now)
{
    conn_t *r = NULL;
    for (int i = 0; i < nreporters && !r; i++)
        if (!strcmp(reporters[i]->machine, h->machine))
            r = reporters[i];
    if (!r)
        r = reporter_new(h->machine);
    if (r->nqueue == r->capqueue) {
        r->capqueue = r->capqueue ? 2 * r->capqueue : 256;
        r->queue = realloc(r->queue, r->capqueue * sizeof *r->queue);
        r->queued_us = realloc(r->queued_us, r->capqueue * sizeof *r->queued_us);
    }
    r->queue[r->nqueue] = *h;
    r->queued_us[r->nqueue++] = now;
}

static void reporter_send(conn_t *r)
{
    size_t n = r->nqueue < REPORT_MAX ? r->nqueue : REPORT_MAX;
    r->batch = realloc(r->batch, REPORT_MAX * sizeof *r->batch);
    r->batch_us = realloc(r->batch_us, REPORT_MAX * sizeof *r->batch_us);
    memcpy(r->batch, r->queue, n * sizeof *r->batch);
    memcpy(r->batch_us, r->queued_us, n * sizeof *r->batch_us);
    memmove(r->queue, r->queue + n, (r->nqueue - n) * sizeof *r->queue);
    memmove(r->queued_us, r->queued_us + n, (r->nqueue - n) * sizeof *r->queued_us);
    r->nqueue -= n;
    r->nbatch = n;
    for (size_t i = 0; i < n; i++)
        table_mark(r->batch[i].instance, r->batch[i].allocation, 2);
    releases_send(r, r->batch, n, r->seq++);
}

/* The answer in flight is whole: account for it and send what comes next (or go idle). */
static void conn_answered(conn_t *k, long st, const char *body, redisReply *rep)
{
    client_t *c = k->c;
    int64_t now = sd_mono_us();
    if (k->group) {
        int g = k->group - 1;
        int whole = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == (size_t)ngin[g];
        k->st = CS_IDLE;
        for (int i = 0; i < ngin[g]; i++)
            conn_answered(gin[g][i], 0, NULL, whole ? rep->element[i] : NULL);
        ngin[g] = 0;
        return;
    }
    if (k->egroup) {
        int g = k->egroup - 1;
        k->st = CS_IDLE;
        for (int i = 0; i < nein[g]; i++) {
            ein[g][i]->st = CS_RELEASE;
            conn_answered(ein[g][i], 0, NULL, rep);
        }
        nein[g] = 0;
        return;
    }
    if (k->st == CS_ALLOC || k->st == CS_QUEUED) {
        int rc = cfg.mode == M_SD ? alloc_http_answer(st, body, &k->h)
                                  : alloc_redis_answer(rep, "no reply", &k->h);
        k->st = CS_IDLE;
        if (!alloc_account(c, rc, now - k->sent_us, &k->h))
            return;
        if (cfg.release == R_MACHINE) {
            reporter_queue(&k->h, now);
            return;
        }
        table_mark(k->h.instance, k->h.allocation, 2);
        release_start(k);
        return;
    }
    if (k->reporter) {
        int ok = cfg.mode == M_SD ? release_http_ok(st, body, k->nbatch)
                                  : release_redis_ok(rep, k->eidx, k->nbatch);
        k->st = CS_IDLE;
        if (!ok)
            c->errors++;
        for (size_t i = 0; i < k->nbatch; i++) {
            if (ok)
                record(c->rel_us, &c->nrel, now - k->batch_us[i]);
            table_mark(k->batch[i].instance, k->batch[i].allocation, 0);
        }
        c->n++; /* batches */
        k->nbatch = 0;
        return;
    }
    int ok = cfg.mode == M_SD ? release_http_ok(st, body, 1) : release_redis_ok(rep, k->eidx, 1);
    k->st = CS_IDLE;
    if (!ok) {
        c->errors++;
        return;
    }
    record(c->rel_us, &c->nrel, now - k->sent_us);
    table_mark(k->h.instance, k->h.allocation, 0);
}

/* Reads what the connection has; returns when the socket is drained. */
static void conn_readable(conn_t *k)
{
    for (;;) {
        char buf[16384];
        ssize_t r;
        if (cfg.mode == M_SD)
            r = recv(k->fd, k->in + k->ilen, IN_CAP - 1 - k->ilen, 0);
        else
            r = recv(k->fd, buf, sizeof buf, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (r <= 0) {
            fprintf(stderr, "alloc_load: connection %d: %s\n", k->c->id,
                    r ? strerror(errno) : "closed by the peer");
            exit(1);
        }
        int whole;
        if (cfg.mode == M_SD) {
            k->ilen += (size_t)r;
            char *body = NULL;
            long st = http_answer(k, &body);
            if (st < 0) {
                fprintf(stderr, "alloc_load: connection %d: an answer that cannot be read\n",
                        k->c->id);
                exit(1);
            }
            if ((whole = st > 0))
                conn_answered(k, st, body, NULL);
        } else {
            redisReaderFeed(k->rd, buf, (size_t)r);
            void *rep = NULL;
            if (redisReaderGetReply(k->rd, &rep) != REDIS_OK) {
                fprintf(stderr, "alloc_load: connection %d: bad RESP\n", k->c->id);
                exit(1);
            }
            if ((whole = rep != NULL)) {
                conn_answered(k, 0, NULL, rep);
                freeReplyObject(rep);
            }
        }
        if (whole) /* nothing else comes before the next request */
            return;
    }
}

static int loop_ep = -1;

static void conn_setup(conn_t *k)
{
    k->fd = cfg.mode == M_SD ? conn_open(sd_host, sd_port) : conn_open(cfg.host, cfg.port);
    if (cfg.mode == M_SD)
        k->in = malloc(IN_CAP);
    else
        k->rd = redisReaderCreate();
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = k};
    epoll_ctl(loop_ep, EPOLL_CTL_ADD, k->fd, &ev);
}

static void conn_close(conn_t *k)
{
    close(k->fd);
    free(k->in);
    if (k->rd)
        redisReaderFree(k->rd);
}

static conn_t *reporter_new(const char *machine)
{
    if (nreporters == REPORTERS_MAX) {
        fprintf(stderr, "alloc_load: more than %d machines\n", REPORTERS_MAX);
        exit(1);
    }
    conn_t *r = calloc(1, sizeof *r);
    client_t *c = &reporter_clients[nreporters];
    c->id = 100000 + nreporters; /* event ids apart from the allocators' */
    c->rel_us = malloc(MAX_SAMPLES * sizeof(uint32_t));
    r->c = c;
    r->reporter = 1;
    snprintf(r->machine, sizeof r->machine, "%s", machine);
    conn_setup(r);
    reporters[nreporters++] = r;
    return r;
}

/* Runs every allocator on one epoll until the phase ends; fills t_last_us. */
static void loop_run(client_t *cs)
{
    if (cfg.mode == M_SD) {
        const char *u = cfg.url;
        if (!strncmp(u, "http://", 7))
            u += 7;
        snprintf(sd_host, sizeof sd_host, "%s", u);
        char *colon = strrchr(sd_host, ':');
        char *slash = strchr(sd_host, '/');
        if (slash)
            *slash = '\0';
        if (!colon) {
            fprintf(stderr, "alloc_load: the loop engine wants http://HOST:PORT\n");
            exit(1);
        }
        *colon = '\0';
        sd_port = atoi(colon + 1);
    }
    loop_ep = epoll_create1(EPOLL_CLOEXEC);
    conn_t *ks = calloc((size_t)cfg.clients, sizeof *ks);
    int64_t start = sd_mono_us();
    for (int i = 0; i < cfg.clients; i++) {
        conn_t *k = &ks[i];
        k->c = &cs[i];
        conn_setup(k);
        /* -p: the allocators' starts spread over the first period */
        k->next_us = start + cfg.period_us * i / cfg.clients;
    }
    for (int g = 0; cfg.group && g < GROUP_CONNS; g++) {
        static client_t gc = {.id = -1};
        grp[g] = calloc(1, sizeof *grp[g]);
        grp[g]->c = &gc;
        grp[g]->group = g + 1;
        conn_setup(grp[g]);
    }
    for (int g = 0; cfg.group && cfg.release != R_NONE && g < EGROUP_CONNS; g++) {
        static client_t ec = {.id = -2};
        egrp[g] = calloc(1, sizeof *egrp[g]);
        egrp[g]->c = &ec;
        egrp[g]->egroup = g + 1;
        conn_setup(egrp[g]);
    }
    int64_t alloc_end_us = 0;
    for (;;) {
        int64_t now = sd_mono_us(), wake = INT64_MAX;
        int open = now < t_end_us && !atomic_load(&stop_all), busy = 0;
        for (int i = 0; i < cfg.clients; i++) {
            conn_t *k = &ks[i];
            if (k->st == CS_IDLE && open) {
                if (k->next_us <= now) {
                    if (cfg.period_us)
                        k->next_us += cfg.period_us;
                    cycle_start(k);
                } else if (k->next_us < wake) {
                    wake = k->next_us;
                }
            }
            busy += k->st != CS_IDLE;
        }
        if (!busy && !open && !alloc_end_us)
            alloc_end_us = sd_mono_us(); /* the allocators' part ends here */
        for (int g = 0; g < GROUP_CONNS && grp[g]; g++) {
            if (grp[g]->st == CS_IDLE && ngq)
                group_send(g);
            busy += grp[g]->st != CS_IDLE;
        }
        for (int i = 0; i < nreporters; i++) {
            conn_t *r = reporters[i];
            if (r->st == CS_IDLE && r->nqueue)
                reporter_send(r);
            busy += r->st != CS_IDLE;
        }
        for (int g = 0; g < EGROUP_CONNS && egrp[g]; g++) {
            if (egrp[g]->st == CS_IDLE && neq)
                egroup_send(g);
            busy += egrp[g]->st != CS_IDLE;
        }
        if (!busy && !open)
            break;
        int timeout = 100;
        if (wake != INT64_MAX)
            timeout = (int)((wake - now + 999) / 1000);
        if (timeout > 100)
            timeout = 100;
        struct epoll_event evs[MAX_CLIENTS];
        int n = epoll_wait(loop_ep, evs, MAX_CLIENTS, timeout);
        for (int i = 0; i < n; i++)
            conn_readable(evs[i].data.ptr);
    }
    atomic_store(&t_last_us, alloc_end_us);
    for (int i = 0; i < cfg.clients; i++)
        conn_close(&ks[i]);
    for (int i = 0; i < nreporters; i++) {
        conn_t *r = reporters[i];
        conn_close(r);
        free(r->queue);
        free(r->queued_us);
        free(r->batch);
        free(r->batch_us);
        free(r);
    }
    free(ks);
    close(loop_ep);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile (0..100) of n sorted samples, in ms. */
static double pct_ms(const uint32_t *v, size_t n, int p)
{
    return n ? v[n * (size_t)p / 100 < n ? n * (size_t)p / 100 : n - 1] / 1000.0 : 0;
}

/* Loads LUADIR/name.lua with SCRIPT LOAD into sha (exits when it cannot). */
static void load_script(const char *name, char sha[41])
{
    if (bench_script_load("alloc_load", cfg.host, cfg.port, cfg.luadir, name, sha))
        exit(1);
}

/* ---------- refill: pool below buffer -> a new instance ready ---------- */

/* The service's pool.ready_free (-1 when it cannot be read). */
static long long ready_free(client_t *c)
{
    char url[512];
    snprintf(url, sizeof url, "%s/v1/clusters/%s/services/%s", cfg.url, cfg.cluster, cfg.service);
    if (http(c, "GET", url, NULL) != 200)
        return -1;
    return json_int(c->out.buf, "ready_free");
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls every 10 ms until ready_free >= want; the time it took in ms, or -1 after 60 s. */
static double wait_ready_free(client_t *c, long long want)
{
    int64_t t0 = sd_mono_us();
    while (ready_free(c) < want) {
        if (sd_mono_us() - t0 > 60 * 1000000LL)
            return -1;
        sleep_ms(10);
    }
    return (double)(sd_mono_us() - t0) / 1000.0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int refill_main(void)
{
    client_t *c = calloc(1, sizeof *c);
    c->h = curl_easy_init();
    double *ms = calloc((size_t)cfg.samples, sizeof *ms);
    if (wait_ready_free(c, cfg.buffer) < 0) {
        fprintf(stderr, "alloc_load: the pool never reached %d ready_free\n", cfg.buffer);
        return 1;
    }
    for (int k = 0; k < cfg.samples; k++) {
        /* a random phase against the primary's placement passes */
        sleep_ms(200 + rand() % 1000);
        if (wait_ready_free(c, cfg.buffer) < 0) {
            fprintf(stderr, "alloc_load: the pool did not come back to %d\n", cfg.buffer);
            return 1;
        }
        char match[32];
        snprintf(match, sizeof match, "refill-%d", k);
        held_t h;
        if (allocate(c, match, &h) != 1) {
            fprintf(stderr, "alloc_load: refill allocation %d failed\n", k);
            return 1;
        }
        ms[k] = wait_ready_free(c, cfg.buffer);
        if (ms[k] < 0) {
            fprintf(stderr, "alloc_load: no refill within 60 s\n");
            return 1;
        }
        printf("refill sample=%d instance=%s ms=%.1f\n", k + 1, h.instance, ms[k]);
        fflush(stdout);
    }
    qsort(ms, (size_t)cfg.samples, sizeof *ms, cmp_double);
    printf("mode=refill samples=%d median_ms=%.1f min_ms=%.1f max_ms=%.1f\n", cfg.samples,
           ms[(cfg.samples - 1) / 2], ms[0], ms[cfg.samples - 1]);
    curl_easy_cleanup(c->h);
    free(c);
    free(ms);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: alloc_load [-c CLIENTS] [-d SECONDS] [-r event|machine|delete|none]\n"
            "                  [-s HOST:PORT]"
             " [-p PERIOD_US] [-e loop|threads] [-g] MODE ARGS...\n"
            "  sd URL CLUSTER SERVICE | redis HOST PORT LUADIR PREFIX CLUSTER SERVICE |\n"
            "  refill URL CLUSTER SERVICE BUFFER SAMPLES\n");
    exit(2);
}

int main(int argc, char **argv)
{
    cfg.clients = 64;
    cfg.secs = 5;
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        if (!strcmp(argv[i], "-c"))
            cfg.clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-d"))
            cfg.secs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-p"))
            cfg.period_us = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-e") && !strcmp(argv[i + 1], "threads"))
            cfg.threads = 1;
        else if (!strcmp(argv[i], "-e") && !strcmp(argv[i + 1], "loop"))
            cfg.threads = 0;
        else if (!strcmp(argv[i], "-s"))
            stats_addr = argv[i + 1];
        else if (!strcmp(argv[i], "-r") && !strcmp(argv[i + 1], "event"))
            cfg.release = R_EVENT;
        else if (!strcmp(argv[i], "-r") && !strcmp(argv[i + 1], "delete"))
            cfg.release = R_DELETE;
        else if (!strcmp(argv[i], "-r") && !strcmp(argv[i + 1], "none"))
            cfg.release = R_NONE;
        else if (!strcmp(argv[i], "-r") && !strcmp(argv[i + 1], "machine"))
            cfg.release = R_MACHINE;
        else if (!strcmp(argv[i], "-g"))
            cfg.group = 1, i--; /* no value */
        else
            usage();
    }
    if (i >= argc || cfg.clients < 1 || cfg.clients > MAX_CLIENTS || cfg.secs <= 0 ||
        cfg.secs > 600 || (cfg.threads && cfg.release == R_MACHINE) ||
        (!cfg.threads && cfg.release == R_DELETE) || (cfg.group && cfg.threads))
        usage();
    cfg.name = argv[i];
    int rest = argc - i - 1;
    char **a = argv + i + 1;
    if (!strcmp(cfg.name, "sd") && rest == 3) {
        cfg.mode = M_SD, cfg.url = a[0], cfg.cluster = a[1], cfg.service = a[2];
    } else if (!strcmp(cfg.name, "redis") && rest == 6 && cfg.release != R_DELETE) {
        cfg.mode = M_REDIS, cfg.host = a[0], cfg.port = atoi(a[1]), cfg.luadir = a[2],
        cfg.prefix = a[3], cfg.cluster = a[4], cfg.service = a[5];
    } else if (cfg.group) {
        usage(); /* -g: redis mode only */
    } else if (!strcmp(cfg.name, "refill") && rest == 5) {
        cfg.mode = M_REFILL, cfg.url = a[0], cfg.cluster = a[1], cfg.service = a[2],
        cfg.buffer = atoi(a[3]), cfg.samples = atoi(a[4]);
        if (cfg.buffer < 1 || cfg.samples < 1)
            usage();
    } else {
        usage();
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    json_hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    json_hdrs = curl_slist_append(json_hdrs, "Expect:");
    if (cfg.mode == M_REFILL)
        return refill_main();
    if (cfg.mode == M_REDIS) {
        /* the key base and channel serverdir uses (sd_key, sd_assign_channel) */
        snprintf(cfg.base, sizeof cfg.base, "%s{%s}:", cfg.prefix, cfg.cluster);
        snprintf(cfg.chan, sizeof cfg.chan, "%sassign", cfg.prefix);
        load_script("alloc_create", cfg.sha_alloc);
        load_script("events_apply", cfg.sha_events);
    }
    atomic_store(&run_nonce, (long)time(NULL) * 1000 + getpid() % 1000);
    table = calloc((size_t)1 << TABLE_BITS, sizeof *table);

    client_t *cs = calloc((size_t)cfg.clients, sizeof *cs);
    pthread_t *th = calloc((size_t)cfg.clients, sizeof *th);
    pthread_barrier_init(&done, NULL, (unsigned)cfg.clients);
    stats_read(&stats_begin);
    int64_t t0 = sd_mono_us();
    t_end_us = t0 + (int64_t)(cfg.secs * 1e6);
    for (int k = 0; k < cfg.clients; k++) {
        cs[k].id = k;
        cs[k].lat_us = malloc(MAX_SAMPLES * sizeof(uint32_t));
        cs[k].rel_us = malloc(MAX_SAMPLES * sizeof(uint32_t));
        if (cfg.threads)
            pthread_create(&th[k], NULL, client_main, &cs[k]);
    }
    if (!cfg.threads) {
        loop_run(cs);
        stats_read(&stats_end);
        /* release none: give everything back, untimed, in batches, on one blocking
         * connection (the allocators' connections are closed) */
        client_t *rc = calloc(1, sizeof *rc);
        if (cfg.mode == M_SD) {
            rc->h = curl_easy_init();
        } else if (!(rc->r = redisConnect(cfg.host, cfg.port)) || rc->r->err) {
            fprintf(stderr, "alloc_load: cannot connect to redis\n");
            exit(1);
        }
        for (int k = 0; k < cfg.clients; k++) {
            client_t *c = &cs[k];
            for (size_t j = 0; j < c->nheld; j++)
                table_mark(c->held[j].instance, c->held[j].allocation, 0);
            for (size_t j = 0; j < c->nheld; j += RELEASE_BATCH) {
                size_t n = c->nheld - j < RELEASE_BATCH ? c->nheld - j : RELEASE_BATCH;
                rc->id = c->id;
                if (release_events(rc, c->held + j, n, -(long)(j + 1)))
                    c->errors++;
            }
            free(c->held);
        }
        if (rc->h)
            curl_easy_cleanup(rc->h);
        if (rc->r)
            redisFree(rc->r);
        free(rc);
    }
    size_t total = 0, nrel = 0;
    long errors = 0, nocap = 0;
    for (int k = 0; k < cfg.clients; k++) {
        if (cfg.threads)
            pthread_join(th[k], NULL);
        total += cs[k].n;
        nrel += cs[k].nrel;
        errors += cs[k].errors;
        nocap += cs[k].no_capacity;
    }
    size_t batches = 0;
    for (int k = 0; k < nreporters; k++) {
        nrel += reporter_clients[k].nrel;
        errors += reporter_clients[k].errors;
        batches += reporter_clients[k].n;
    }
    double secs = (double)(atomic_load(&t_last_us) - t0) / 1e6;
    uint32_t *all = malloc((total + nrel + 1) * sizeof *all), *rel = all + total;
    size_t o = 0, orel = 0;
    for (int k = 0; k < cfg.clients; k++) {
        memcpy(all + o, cs[k].lat_us, cs[k].n * sizeof *all);
        o += cs[k].n;
        memcpy(rel + orel, cs[k].rel_us, cs[k].nrel * sizeof *all);
        orel += cs[k].nrel;
        free(cs[k].lat_us);
        free(cs[k].rel_us);
    }
    for (int k = 0; k < nreporters; k++) {
        memcpy(rel + orel, reporter_clients[k].rel_us, reporter_clients[k].nrel * sizeof *all);
        orel += reporter_clients[k].nrel;
        free(reporter_clients[k].rel_us);
    }
    qsort(all, total, sizeof *all, cmp_u32);
    qsort(rel, nrel, sizeof *rel, cmp_u32);
    static const char *const rnames[] = {"event", "delete", "none", "machine"};
    printf("mode=%s engine=%s release=%s clients=%d secs=%.2f allocs=%zu rate=%.0f p50_ms=%.2f "
           "p99_ms=%.2f rel_p50_ms=%.2f rel_p99_ms=%.2f double=%ld no_capacity=%ld errors=%ld",
           cfg.name, cfg.threads ? "threads" : "loop", rnames[cfg.release], cfg.clients, secs,
           total, (double)total / secs,
           pct_ms(all, total, 50), pct_ms(all, total, 99), pct_ms(rel, nrel, 50),
           pct_ms(rel, nrel, 99), atomic_load(&doubles), nocap, errors);
    if (cfg.release == R_MACHINE)
        printf(" machines=%d batches=%zu", nreporters, batches);
    if (cfg.group) /* -g: alloc_create.lua calls and requests per call */
        printf(" script_calls=%ld per_call=%.2f event_calls=%ld batches_per_call=%.2f",
               group_calls, (double)group_requests / (double)(group_calls ? group_calls : 1),
               egroup_calls, (double)egroup_batches / (double)(egroup_calls ? egroup_calls : 1));
    if (stats_addr) /* script time per allocation (with its release in the cycles) */
        printf(" redis_us=%.0f redis_cpu=%.0f",
               (double)stats_end.evalsha_us / (double)(total ? total : 1),
               (stats_end.cpu_s - stats_begin.cpu_s) * 1e8 /
                   (double)(stats_end.at_us - stats_begin.at_us));
    /* the allocations' tail: p90, p99.9, max */
    printf(" p90_ms=%.2f p999_ms=%.2f max_ms=%.2f", pct_ms(all, total, 90),
           total ? all[total * 999 / 1000 < total ? total * 999 / 1000 : total - 1] / 1000.0 : 0,
           total ? all[total - 1] / 1000.0 : 0);
    printf("\n");
    free(all);
    free(cs);
    free(th);
    free(table);
    pthread_barrier_destroy(&done);
    curl_slist_free_all(json_hdrs);
    curl_global_cleanup();
    return errors || atomic_load(&doubles) ? 1 : 0;
}
