/* login_storm: the load generator of bench/login_storm_bench.sh, what a realm restart
 * looks like to the lock table. PLAYERS players (20,000) join over WINDOW seconds (10)
 * through ZONES zone servers (50); each player's arrival time is fixed in advance, evenly
 * spread over the window (an open loop: a slow answer does not slow the arrivals down).
 * A join is three steps on the player's own key:
 *
 *   acquire   the player's lock for its zone server (holder zone-<z>)
 *   load      the player's blob, read under that grant (Lock-Seq and Lock-Token)
 *   save      the blob once, under the grant (Blob-Seq one above the loaded one)
 *
 * and STAY seconds (5) after its arrival the player leaves: its lock is released. Each
 * zone server works with WORKERS connections (2), which take the zone's next arrival or
 * leave as it falls due. The join's time runs from the arrival as scheduled (time spent
 * waiting for a free connection of the zone counts: the player waits), each step's from
 * its own request. Before the storm every player has a blob of BLOB bytes (written here
 * straight into Redis, Blob-Seq 1). At the end it prints one line:
 *
 *   mode=sd players=20000 zones=50 window_s=10 joins=20000 join_rate=1999 late_ms=3
 *   acquire_p50_ms=.. acquire_p99_ms=.. load_p50_ms=.. ... join_p50_ms=.. join_p99_ms=..
 *   leave_p50_ms=.. leave_p99_ms=.. errors=0
 *
 * (late_ms: how far behind its schedule the last arrival started). Modes:
 *
 *   sd URL TOKEN                   through serverdir: PUT /v1/locks/P, GET and PUT
 *                                  /v1/blobs/P, DELETE /v1/locks/P?holder&lock_seq
 *   redis LUADIR                   the same scripts (lock_acquire, blob_get, blob_save,
 *                                  lock_release) by EVALSHA, with the KEYS and ARGV
 *                                  serverdir passes for an unbound game token
 *
 * Options: -r HOST:PORT the Redis (required: both modes write the blobs first), -p
 * PLAYERS, -z ZONES, -w WINDOW_S, -s STAY_S, -W WORKERS, -b BLOB. Built by
 * bench/CMakeLists.txt (target login_storm). */
#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_redis.h"
#include "sdproto.h"
#include "sdutil.h"

#define MAX_PLAYERS 200000
#define MAX_ZONES 500
#define MAX_WORKERS 16

enum step { S_ACQUIRE, S_LOAD, S_SAVE, S_JOIN, S_LEAVE, S_N };
static const char *const step_names[S_N] = {"acquire", "load", "save", "join", "leave"};

static struct {
    int sd; /* 1: through serverdir, 0: raw Redis */
    const char *url, *token, *luadir;
    char rhost[256];
    int rport;
    int players, zones, workers;
    double window_s, stay_s;
    size_t blob;
    char sha_acquire[41], sha_get[41], sha_save[41], sha_release[41];
} cfg = {.players = 20000, .zones = 50, .workers = 2, .window_s = 10, .stay_s = 5, .blob = 2048};

/* A player: its arrival (us after the start) and, once joined, its grant. */
typedef struct {
    int64_t arrive_us;
    int64_t lock_seq;
    char token[SD_LOCK_TOKEN_LEN + 1];
    int joined;
} player_t;

/* A zone server: its players (every zones-th one from its index), the next arrival and
 * leave to take. */
typedef struct {
    int id;
    pthread_mutex_t mu;
    int next_join, next_leave; /* indexes into its players, in arrival order */
    int nplayers;
} zone_t;

static player_t *players;
static zone_t *zones;
static int64_t t0_us;
static _Atomic int64_t late_us;
static atomic_long errors;

/* Latencies per step, every sample (us), appended under lat_mu. */
static pthread_mutex_t lat_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *lat[S_N];
static size_t nlat[S_N];

static void record(enum step s, int64_t us)
{
    pthread_mutex_lock(&lat_mu);
    if (nlat[s] < MAX_PLAYERS)
        lat[s][nlat[s]++] = (uint32_t)(us > 0 ? us : 0);
    pthread_mutex_unlock(&lat_mu);
}

/* The zone's i-th player's global index. */
static int zone_player(const zone_t *z, int i) { return z->id + i * cfg.zones; }

static void player_key(int p, char *buf, size_t cap) { snprintf(buf, cap, "storm-p%d", p); }

/* ---------- a worker's connection ---------- */

typedef struct {
    CURL *h;
    char auth[300]; /* "Authorization: Bearer <token>" */
    struct curl_slist *json;
    redisContext *r;
    bench_body_t out; /* the last answer */
    char data[1 << 16]; /* the blob it saves */
} conn_t;

/* One HTTP request; the status (0 on a transport error), the answer in c->out.buf. */
static long http(conn_t *c, const char *method, const char *url, struct curl_slist *hdrs,
                 const char *body, size_t len)
{
    c->out.len = 0;
    c->out.buf[0] = '\0';
    curl_easy_reset(c->h);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, bench_body_sink);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, &c->out);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, 10000L);
    if (body) {
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE, (long)len);
    }
    long status = 0;
    if (curl_easy_perform(c->h) == CURLE_OK)
        curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

/* The value of "field":<int or "string"> in the last answer into out. */
static int json_field(const conn_t *c, const char *field, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", field);
    const char *p = strstr(c->out.buf, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    if (*p == '"')
        p++;
    size_t n = strcspn(p, "\",}");
    if (n == 0 || n >= cap)
        return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

/* A header list: the authorization, "Expect:" and the given headers (NULL-terminated);
 * the caller frees it. */
static struct curl_slist *headers(const conn_t *c, ...)
{
    struct curl_slist *l = curl_slist_append(NULL, c->auth);
    l = curl_slist_append(l, "Expect:");
    va_list ap;
    va_start(ap, c);
    for (const char *h; (h = va_arg(ap, const char *));)
        l = curl_slist_append(l, h);
    va_end(ap);
    return l;
}

static redisReply *evalsha(conn_t *c, const char *sha, int nkeys, int argc, const char **argv,
                           const size_t *argl)
{
    const char *a[32];
    size_t l[32];
    char nk[8];
    snprintf(nk, sizeof nk, "%d", nkeys);
    a[0] = "EVALSHA", l[0] = 7;
    a[1] = sha, l[1] = 40;
    a[2] = nk, l[2] = strlen(nk);
    for (int i = 0; i < argc; i++) {
        a[3 + i] = argv[i];
        l[3 + i] = argl ? argl[i] : strlen(argv[i]);
    }
    return redisCommandArgv(c->r, argc + 3, a, l);
}

static int reply_ok(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "ok") == 0;
}

/* ---------- the steps, per mode ---------- */

static int step_acquire(conn_t *c, int p, const char *holder, player_t *pl)
{
    char key[64];
    player_key(p, key, sizeof key);
    if (cfg.sd) {
        char url[512], body[128];
        snprintf(url, sizeof url, "%s/v1/locks/%s", cfg.url, key);
        int n = snprintf(body, sizeof body, "{\"holder\":\"%s\"}", holder);
        char seq[32];
        if (http(c, "PUT", url, c->json, body, (size_t)n) != 200 ||
            json_field(c, "lock_seq", seq, sizeof seq) ||
            json_field(c, "lock_token", pl->token, sizeof pl->token))
            return -1;
        pl->lock_seq = strtoll(seq, NULL, 10);
        return 0;
    }
    char lk[128], bk[128], hk[128], fresh[SD_LOCK_TOKEN_LEN + 1];
    snprintf(lk, sizeof lk, "sd:lock:%s", key);
    snprintf(bk, sizeof bk, "sd:blob:%s", key);
    snprintf(hk, sizeof hk, "sd:lock:%s#h", holder);
    if (sd_random_hex(fresh, SD_LOCK_TOKEN_BYTES))
        return -1;
    /* as serverdir's for an unbound game token presenting no token (bench/locks_load.c) */
    const char *argv[] = {lk, bk, hk, holder, "0", "0", "604800000", "", "0", "sd:", "1",
                          fresh, "0", "", "", "", "", "10000", "", "", "", "0"};
    redisReply *r = evalsha(c, cfg.sha_acquire, 3, 22, argv, NULL);
    int ok = reply_ok(r) && r->elements >= 9;
    if (ok) {
        pl->lock_seq = strtoll(r->element[3]->str, NULL, 10);
        snprintf(pl->token, sizeof pl->token, "%s", r->element[8]->str);
    }
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

static int step_load(conn_t *c, int p, const player_t *pl)
{
    char key[64], seq[32];
    player_key(p, key, sizeof key);
    snprintf(seq, sizeof seq, "%lld", (long long)pl->lock_seq);
    if (cfg.sd) {
        char url[512], h1[64], h2[80];
        snprintf(url, sizeof url, "%s/v1/blobs/%s", cfg.url, key);
        snprintf(h1, sizeof h1, "Lock-Seq: %s", seq);
        snprintf(h2, sizeof h2, "Lock-Token: %s", pl->token);
        struct curl_slist *hl = headers(c, h1, h2, (const char *)NULL);
        long st = http(c, "GET", url, hl, NULL, 0);
        curl_slist_free_all(hl);
        return st == 200 && c->out.len == cfg.blob ? 0 : -1;
    }
    char bk[128], lk[128];
    snprintf(bk, sizeof bk, "sd:blob:%s", key);
    snprintf(lk, sizeof lk, "sd:lock:%s", key);
    const char *argv[] = {bk, lk, seq, pl->token, "", "", ""};
    redisReply *r = evalsha(c, cfg.sha_get, 2, 7, argv, NULL);
    int ok = reply_ok(r) && r->elements == 4 && r->element[1]->len == cfg.blob;
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

static int step_save(conn_t *c, int p, const player_t *pl)
{
    char key[64], seq[32];
    player_key(p, key, sizeof key);
    snprintf(seq, sizeof seq, "%lld", (long long)pl->lock_seq);
    if (cfg.sd) {
        char url[512], h1[64], h2[80];
        snprintf(url, sizeof url, "%s/v1/blobs/%s", cfg.url, key);
        snprintf(h1, sizeof h1, "Lock-Seq: %s", seq);
        snprintf(h2, sizeof h2, "Lock-Token: %s", pl->token);
        struct curl_slist *hl = headers(c, h1, h2, "Blob-Seq: 2",
                                        "Content-Type: application/octet-stream",
                                        (const char *)NULL);
        long st = http(c, "PUT", url, hl, c->data, cfg.blob);
        curl_slist_free_all(hl);
        return st == 200 ? 0 : -1;
    }
    char bk[128], lk[128];
    snprintf(bk, sizeof bk, "sd:blob:%s", key);
    snprintf(lk, sizeof lk, "sd:lock:%s", key);
    /* as serverdir's on standalone Redis for an unbound game token (bench/locks_load.c) */
    const char *argv[] = {bk, lk, "sd:quota:blob:bench", seq, pl->token, "2", c->data, "", "",
                          "", "", "", "bench", "1073741824", "", ""};
    size_t argl[16];
    for (int i = 0; i < 16; i++)
        argl[i] = i == 6 ? cfg.blob : strlen(argv[i]);
    redisReply *r = evalsha(c, cfg.sha_save, 3, 16, argv, argl);
    int ok = reply_ok(r);
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

static int step_leave(conn_t *c, int p, const char *holder, const player_t *pl)
{
    char key[64], seq[32];
    player_key(p, key, sizeof key);
    snprintf(seq, sizeof seq, "%lld", (long long)pl->lock_seq);
    if (cfg.sd) {
        char url[512], h[80];
        snprintf(url, sizeof url, "%s/v1/locks/%s?holder=%s&lock_seq=%s", cfg.url, key, holder,
                 seq);
        snprintf(h, sizeof h, "Lock-Token: %s", pl->token);
        struct curl_slist *hl = headers(c, h, (const char *)NULL);
        long st = http(c, "DELETE", url, hl, NULL, 0);
        curl_slist_free_all(hl);
        return st == 200 ? 0 : -1;
    }
    char lk[128], qk[132], hk[128];
    snprintf(lk, sizeof lk, "sd:lock:%s", key);
    snprintf(qk, sizeof qk, "%s#q", lk);
    snprintf(hk, sizeof hk, "sd:lock:%s#h", holder);
    const char *argv[] = {lk, qk, hk, holder, "604800000", seq, pl->token, "sd:lock:", "", "", ""};
    redisReply *r = evalsha(c, cfg.sha_release, 3, 11, argv, NULL);
    int ok = reply_ok(r);
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

/* ---------- the zone workers ---------- */

static void sleep_until(int64_t at_us)
{
    int64_t d = at_us - sd_mono_us();
    if (d > 0)
        nanosleep(&(struct timespec){d / 1000000, (d % 1000000) * 1000}, NULL);
}

/* One player's join: the three steps, each timed, and the whole from its arrival. */
static void join(conn_t *c, zone_t *z, int p, const char *holder)
{
    player_t *pl = &players[p];
    int64_t t = sd_mono_us(), arrival = t0_us + pl->arrive_us;
    if (t - arrival > atomic_load(&late_us))
        atomic_store(&late_us, t - arrival);
    if (step_acquire(c, p, holder, pl)) {
        atomic_fetch_add(&errors, 1);
        return;
    }
    int64_t t1 = sd_mono_us();
    record(S_ACQUIRE, t1 - t);
    if (step_load(c, p, pl)) {
        atomic_fetch_add(&errors, 1);
        return;
    }
    int64_t t2 = sd_mono_us();
    record(S_LOAD, t2 - t1);
    if (step_save(c, p, pl)) {
        atomic_fetch_add(&errors, 1);
        return;
    }
    int64_t t3 = sd_mono_us();
    record(S_SAVE, t3 - t2);
    record(S_JOIN, t3 - arrival);
    pthread_mutex_lock(&z->mu);
    pl->joined = 1;
    pthread_mutex_unlock(&z->mu);
}

static void *worker_main(void *arg)
{
    zone_t *z = arg;
    conn_t *c = calloc(1, sizeof *c);
    char holder[32];
    snprintf(holder, sizeof holder, "zone-%d", z->id);
    memset(c->data, 'a' + z->id % 26, sizeof c->data);
    if (cfg.sd) {
        c->h = curl_easy_init();
        snprintf(c->auth, sizeof c->auth, "Authorization: Bearer %s", cfg.token);
        c->json = headers(c, "Content-Type: application/json", (const char *)NULL);
    } else if (!(c->r = redisConnect(cfg.rhost, cfg.rport)) || c->r->err) {
        fprintf(stderr, "login_storm: cannot connect to redis\n");
        exit(1);
    }
    int64_t stay = (int64_t)(cfg.stay_s * 1e6);
    for (;;) {
        /* the zone's next due event: a leave when it falls before the next arrival */
        pthread_mutex_lock(&z->mu);
        int jp = z->next_join < z->nplayers ? zone_player(z, z->next_join) : -1;
        int lp = z->next_leave < z->next_join ? zone_player(z, z->next_leave) : -1;
        int64_t jt = jp >= 0 ? players[jp].arrive_us : INT64_MAX;
        int64_t lt = lp >= 0 ? players[lp].arrive_us + stay : INT64_MAX;
        int leave = lp >= 0 && lt <= jt;
        if (jp < 0 && lp < 0) {
            pthread_mutex_unlock(&z->mu);
            break;
        }
        if (leave)
            z->next_leave++;
        else
            z->next_join++;
        pthread_mutex_unlock(&z->mu);
        sleep_until(t0_us + (leave ? lt : jt));
        if (!leave) {
            join(c, z, jp, holder);
            continue;
        }
        /* a player whose join is still under way on the other connection leaves after it */
        for (;;) {
            pthread_mutex_lock(&z->mu);
            int joined = players[lp].joined;
            pthread_mutex_unlock(&z->mu);
            if (joined || players[lp].lock_seq == 0)
                break;
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
        if (!players[lp].joined)
            continue; /* its join failed: counted there */
        int64_t t = sd_mono_us();
        if (step_leave(c, lp, holder, &players[lp]))
            atomic_fetch_add(&errors, 1);
        else
            record(S_LEAVE, sd_mono_us() - t);
    }
    if (c->h)
        curl_easy_cleanup(c->h);
    curl_slist_free_all(c->json);
    if (c->r)
        redisFree(c->r);
    free(c);
    return NULL;
}

/* ---------- set-up and figures ---------- */

/* Every player's blob of cfg.blob bytes, Blob-Seq 1, straight into Redis (pipelined). */
static void blobs_write(void)
{
    redisContext *r = redisConnect(cfg.rhost, cfg.rport);
    if (!r || r->err) {
        fprintf(stderr, "login_storm: cannot connect to redis\n");
        exit(1);
    }
    char *data = malloc(cfg.blob);
    memset(data, 'b', cfg.blob);
    for (int p = 0; p < cfg.players; p++) {
        char key[80];
        snprintf(key, sizeof key, "sd:blob:storm-p%d", p);
        redisAppendCommand(r, "HSET %s data %b seq 1 lock_seq 0 saved_ms 0 quota_scope bench", key,
                           data, cfg.blob);
        if (p % 500 == 499 || p == cfg.players - 1)
            for (int k = p - p % 500; k <= p; k++) {
                redisReply *rep;
                if (redisGetReply(r, (void **)&rep) != REDIS_OK) {
                    fprintf(stderr, "login_storm: writing the blobs failed\n");
                    exit(1);
                }
                freeReplyObject(rep);
            }
    }
    free(data);
    redisFree(r);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct_ms(enum step s, int pct)
{
    if (!nlat[s])
        return 0;
    size_t i = nlat[s] * (size_t)pct / 100;
    return lat[s][i < nlat[s] ? i : nlat[s] - 1] / 1000.0;
}

static void usage(void)
{
    fprintf(stderr, "usage: login_storm -r HOST:PORT [-p PLAYERS] [-z ZONES] [-w WINDOW_S] "
                    "[-s STAY_S] [-W WORKERS] [-b BLOB] sd URL TOKEN | redis LUADIR\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int i = 1;
    const char *raddr = NULL;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        const char *v = argv[i + 1];
        switch (argv[i][1]) {
        case 'r': raddr = v; break;
        case 'p': cfg.players = atoi(v); break;
        case 'z': cfg.zones = atoi(v); break;
        case 'w': cfg.window_s = atof(v); break;
        case 's': cfg.stay_s = atof(v); break;
        case 'W': cfg.workers = atoi(v); break;
        case 'b': cfg.blob = (size_t)atol(v); break;
        default: usage();
        }
    }
    if (!raddr || i >= argc || cfg.players < 1 || cfg.players > MAX_PLAYERS || cfg.zones < 1 ||
        cfg.zones > MAX_ZONES || cfg.zones > cfg.players || cfg.workers < 1 ||
        cfg.workers > MAX_WORKERS || cfg.window_s <= 0 || cfg.window_s > 600 ||
        cfg.stay_s < 0 || cfg.stay_s > 600 || cfg.blob < 1 || cfg.blob > (1 << 16))
        usage();
    const char *colon = strrchr(raddr, ':');
    if (!colon || (size_t)(colon - raddr) >= sizeof cfg.rhost)
        usage();
    memcpy(cfg.rhost, raddr, (size_t)(colon - raddr));
    cfg.rport = atoi(colon + 1);
    const char *mode = argv[i];
    if (!strcmp(mode, "sd") && argc - i == 3) {
        cfg.sd = 1, cfg.url = argv[i + 1], cfg.token = argv[i + 2];
    } else if (!strcmp(mode, "redis") && argc - i == 2) {
        cfg.luadir = argv[i + 1];
        if (bench_script_load("login_storm", cfg.rhost, cfg.rport, cfg.luadir, "lock_acquire",
                              cfg.sha_acquire) ||
            bench_script_load("login_storm", cfg.rhost, cfg.rport, cfg.luadir, "blob_get",
                              cfg.sha_get) ||
            bench_script_load("login_storm", cfg.rhost, cfg.rport, cfg.luadir, "blob_save",
                              cfg.sha_save) ||
            bench_script_load("login_storm", cfg.rhost, cfg.rport, cfg.luadir, "lock_release",
                              cfg.sha_release))
            return 1;
    } else {
        usage();
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    blobs_write();
    players = calloc((size_t)cfg.players, sizeof *players);
    zones = calloc((size_t)cfg.zones, sizeof *zones);
    for (int k = 0; k < S_N; k++)
        lat[k] = malloc((size_t)cfg.players * sizeof *lat[k]);
    /* arrivals evenly spread over the window, in player order (player p is zone p % zones) */
    for (int p = 0; p < cfg.players; p++)
        players[p].arrive_us = (int64_t)(cfg.window_s * 1e6 * p / cfg.players);
    for (int z = 0; z < cfg.zones; z++) {
        zones[z].id = z;
        pthread_mutex_init(&zones[z].mu, NULL);
        zones[z].nplayers = (cfg.players - z + cfg.zones - 1) / cfg.zones;
    }
    int nth = cfg.zones * cfg.workers;
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    t0_us = sd_mono_us() + 200000; /* every worker started before the first arrival */
    for (int k = 0; k < nth; k++)
        if (pthread_create(&th[k], NULL, worker_main, &zones[k / cfg.workers])) {
            fprintf(stderr, "login_storm: cannot start thread %d\n", k);
            return 1;
        }
    for (int k = 0; k < nth; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < S_N; k++)
        qsort(lat[k], nlat[k], sizeof *lat[k], cmp_u32);
    printf("mode=%s players=%d zones=%d workers=%d window_s=%.0f blob=%zu joins=%zu "
           "join_rate=%.0f late_ms=%.1f",
           cfg.sd ? "sd" : "redis", cfg.players, cfg.zones, cfg.workers, cfg.window_s, cfg.blob,
           nlat[S_JOIN], (double)nlat[S_JOIN] / cfg.window_s, atomic_load(&late_us) / 1000.0);
    for (int k = 0; k < S_N; k++)
        printf(" %s_p50_ms=%.2f %s_p99_ms=%.2f", step_names[k], pct_ms(k, 50), step_names[k],
               pct_ms(k, 99));
    printf(" errors=%ld\n", atomic_load(&errors));
    for (int k = 0; k < S_N; k++)
        free(lat[k]);
    free(players);
    free(zones);
    free(th);
    curl_global_cleanup();
    return atomic_load(&errors) && !nlat[S_JOIN] ? 1 : 0;
}
