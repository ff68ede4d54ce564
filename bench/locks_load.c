/* locks_load: a closed-loop load generator for bench/locks_bench.sh. N client threads,
 * each with its own keep-alive connection, repeat one operation for D seconds and record
 * every operation's latency; at the end it prints one line:
 *
 *     mode=sd-lock clients=64 secs=5.00 ops=123456 rate=24691 p50_ms=2.41 p99_ms=6.80 errors=0
 *
 * An operation is a lock acquire + release pair (the *-lock modes) or one blob save
 * (the *-blob modes). Each client uses its own keys, so every pair is a real grant
 * (a fresh lock_seq) and a real release, without contention:
 *
 *   sd-lock URL TOKEN            PUT /v1/locks/K {holder} then DELETE /v1/locks/K?holder&lock_seq
 *   redis-lock HOST PORT LUADIR PREFIX
 *                                the same lock_acquire.lua / lock_release.lua by EVALSHA,
 *                                with exactly the KEYS and ARGV serverdir passes
 *   etcd-lock URL                etcd v3 JSON gateway: /v3/lock/lock {name, lease} then
 *                                /v3/lock/unlock {key} (one lease per client, granted first)
 *   sd-blob URL TOKEN SIZE       PUT /v1/blobs/K with Lock-Seq and a growing Blob-Seq
 *   redis-blob HOST PORT LUADIR PREFIX SIZE
 *                                blob_save.lua by EVALSHA with the same arguments
 *
 * -R RATE paces the clients to RATE operations per second in all (each client starts its
 * operations on a fixed schedule; a late answer does not move the next start), for the
 * latency below saturation; an operation's latency then counts from its scheduled start.
 *
 * Built by bench/CMakeLists.txt (target locks_load). */
#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_redis.h"
#include "sdproto.h"
#include "sdutil.h"

#define MAX_CLIENTS 512
#define MAX_SAMPLES (1 << 20)
#define KEYS_PER_CLIENT 8

enum mode { SD_LOCK, REDIS_LOCK, ETCD_LOCK, SD_BLOB, REDIS_BLOB };

static struct {
    enum mode mode;
    const char *name;
    int clients;
    double secs;
    const char *url, *token, *host, *luadir, *prefix;
    int port;
    size_t size;
    double rate; /* -R: operations per second over all clients (0: as fast as they go) */
    char sha_acquire[41], sha_release[41], sha_save[41];
} cfg;

typedef struct {
    int id;
    uint32_t *lat_us;
    size_t n;
    long errors;
    bench_body_t out; /* the last answer */
} client_t;

/* One HTTP request on the client's handle; returns the status (0 on transport error). */
static long http(CURL *h, client_t *c, const char *method, const char *url,
                 struct curl_slist *hdrs, const char *body, size_t len)
{
    c->out.len = 0;
    c->out.buf[0] = '\0';
    curl_easy_reset(h); /* keeps the connection; forgets the previous request's body */
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, bench_body_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &c->out);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)len);
    }
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

/* The integer after "field": in the client's last answer (0 when absent). */
static long long json_int(const client_t *c, const char *field)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", field);
    const char *p = strstr(c->out.buf, pat);
    if (!p)
        return 0;
    p += strlen(pat);
    if (*p == '"')
        p++;
    return strtoll(p, NULL, 10);
}

/* The string value of "field":"..." in the client's last answer into out. */
static int json_str(const client_t *c, const char *field, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", field);
    const char *p = strstr(c->out.buf, pat);
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

static void b64(const char *in, char *out)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned char)in[i] << 16;
        if (i + 1 < n)
            v |= (unsigned char)in[i + 1] << 8;
        if (i + 2 < n)
            v |= (unsigned char)in[i + 2];
        out[o++] = t[(v >> 18) & 63];
        out[o++] = t[(v >> 12) & 63];
        out[o++] = i + 1 < n ? t[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = '\0';
}

static void record(client_t *c, int64_t t0)
{
    if (c->n < MAX_SAMPLES)
        c->lat_us[c->n++] = (uint32_t)(sd_mono_us() - t0);
}

static redisReply *evalsha(redisContext *r, const char *sha, int nkeys, int argc,
                           const char **argv, const size_t *argl)
{
    const char *a[24];
    size_t l[24];
    char nk[8];
    snprintf(nk, sizeof nk, "%d", nkeys);
    a[0] = "EVALSHA";
    a[1] = sha;
    a[2] = nk;
    for (int i = 0; i < argc; i++) {
        a[3 + i] = argv[i];
        l[3 + i] = argl ? argl[i] : strlen(argv[i]);
    }
    l[0] = 7;
    l[1] = 40;
    l[2] = strlen(nk);
    return redisCommandArgv(r, argc + 3, a, l);
}

/* Acquires lock key for holder through lock_acquire.lua with a fresh random lock_token,
 * as serverdir does; returns the lock_seq (and the grant's token in tok) or 0. */
static long long redis_acquire(redisContext *r, const char *key, const char *holder,
                               char tok[SD_LOCK_TOKEN_LEN + 1])
{
    char lk[256], bk[256], hk[256], fresh[SD_LOCK_TOKEN_LEN + 1];
    snprintf(lk, sizeof lk, "%slock:%s", cfg.prefix, key);
    snprintf(bk, sizeof bk, "%sblob:%s", cfg.prefix, key);
    snprintf(hk, sizeof hk, "%slock:%s#h", cfg.prefix, holder);
    if (sd_random_hex(fresh, SD_LOCK_TOKEN_BYTES))
        return 0;
    /* KEYS: the lock record, its blob record, the holder's index (standalone layout) */
    /* ARGV as serverdir's for a caller that presents no token: the fresh one, flag 0,
     * no steal scope, no credential; the default quota of locks per holder; an unbound
     * caller (no holder liveness check) */
    const char *argv[] = {lk, bk, hk, holder, "0", "0", "604800000", "", "0", cfg.prefix, "1",
                          fresh, "0", "", "", "", "", "10000", "", "", ""};
    redisReply *rep = evalsha(r, cfg.sha_acquire, 3, 21, argv, NULL);
    long long seq = 0;
    /* ok, now, then name, lock_seq, reacquired, stolen_from, since, expires, lock_token */
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 9 &&
        strcmp(rep->element[0]->str, "ok") == 0) {
        seq = strtoll(rep->element[3]->str, NULL, 10);
        snprintf(tok, SD_LOCK_TOKEN_LEN + 1, "%s", rep->element[8]->str);
    }
    if (rep)
        freeReplyObject(rep);
    return seq;
}

static int redis_release(redisContext *r, const char *key, const char *holder, long long seq,
                         const char *tok)
{
    char lk[256], qk[260], hk[256], s[32], ns[128];
    snprintf(lk, sizeof lk, "%slock:%s", cfg.prefix, key);
    snprintf(qk, sizeof qk, "%s#q", lk);
    snprintf(hk, sizeof hk, "%slock:%s#h", cfg.prefix, holder);
    snprintf(s, sizeof s, "%lld", seq);
    snprintf(ns, sizeof ns, "%slock:", cfg.prefix);
    /* KEYS: the lock record, its release list, the holder's index (standalone layout) */
    const char *argv[] = {lk, qk, hk, holder, "604800000", s, tok, ns, "", "", ""};
    redisReply *rep = evalsha(r, cfg.sha_release, 3, 11, argv, NULL);
    int ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
             strcmp(rep->element[0]->str, "ok") == 0;
    if (rep)
        freeReplyObject(rep);
    return ok ? 0 : -1;
}

static void *client_main(void *arg)
{
    client_t *c = arg;
    char holder[64], key[96], url[512], auth[300], body[512];
    snprintf(holder, sizeof holder, "bench-h%d", c->id);
    CURL *h = NULL;
    redisContext *r = NULL;
    struct curl_slist *json_hdrs = NULL, *auth_hdrs = NULL;
    char *blob = NULL;
    if (cfg.mode == REDIS_LOCK || cfg.mode == REDIS_BLOB) {
        r = redisConnect(cfg.host, cfg.port);
        if (!r || r->err) {
            fprintf(stderr, "locks_load: cannot connect to redis\n");
            exit(1);
        }
    } else {
        h = curl_easy_init();
        /* etcd has no token here: it refuses any Authorization header it did not issue. */
        snprintf(auth, sizeof auth, "%s%s", cfg.token ? "Authorization: Bearer " : "X-No-Auth: 1",
                 cfg.token ? cfg.token : "");
        auth_hdrs = curl_slist_append(auth_hdrs, auth);
        auth_hdrs = curl_slist_append(auth_hdrs, "Expect:");
        json_hdrs = curl_slist_append(json_hdrs, auth);
        json_hdrs = curl_slist_append(json_hdrs, "Content-Type: application/json");
        json_hdrs = curl_slist_append(json_hdrs, "Expect:");
    }
    if (cfg.mode == SD_BLOB || cfg.mode == REDIS_BLOB) {
        blob = malloc(cfg.size);
        for (size_t i = 0; i < cfg.size; i++)
            blob[i] = (char)('a' + (i + (size_t)c->id) % 26);
    }

    /* Per-mode setup: an etcd lease, or the blob's lock. */
    char lease[32] = "0";
    long long blob_lock_seq = 0;
    char blob_tok[SD_LOCK_TOKEN_LEN + 1] = "";
    snprintf(key, sizeof key, "bench-k%d", c->id);
    if (cfg.mode == ETCD_LOCK) {
        snprintf(url, sizeof url, "%s/v3/lease/grant", cfg.url);
        if (http(h, c, "POST", url, json_hdrs, "{\"TTL\":600}", 11) != 200 ||
            json_str(c, "ID", lease, sizeof lease)) {
            fprintf(stderr, "locks_load: etcd lease grant failed: %s\n", c->out.buf);
            exit(1);
        }
    } else if (cfg.mode == SD_BLOB) {
        snprintf(url, sizeof url, "%s/v1/locks/%s", cfg.url, key);
        int n = snprintf(body, sizeof body, "{\"holder\":\"%s\"}", holder);
        if (http(h, c, "PUT", url, json_hdrs, body, (size_t)n) != 200) {
            fprintf(stderr, "locks_load: acquire for blobs failed: %s\n", c->out.buf);
            exit(1);
        }
        blob_lock_seq = json_int(c, "lock_seq");
        json_str(c, "lock_token", blob_tok, sizeof blob_tok);
    } else if (cfg.mode == REDIS_BLOB) {
        blob_lock_seq = redis_acquire(r, key, holder, blob_tok);
        if (!blob_lock_seq) {
            fprintf(stderr, "locks_load: acquire for blobs failed\n");
            exit(1);
        }
    }

    int64_t start = sd_mono_us(), end = start + (int64_t)(cfg.secs * 1e6);
    /* -R: this client's operations start on a fixed schedule, spread over the clients */
    double period_us = cfg.rate > 0 ? 1e6 * cfg.clients / cfg.rate : 0;
    long long blob_seq = 0;
    for (unsigned i = 0; sd_mono_us() < end; i++) {
        snprintf(key, sizeof key, "bench-k%d-%u", c->id, i % KEYS_PER_CLIENT);
        int64_t t0 = sd_mono_us();
        if (period_us > 0) { /* open loop: the latency counts from the scheduled start */
            int64_t due = start + (int64_t)(period_us * (i + (double)c->id / cfg.clients));
            if (due >= end)
                break;
            if (due > t0)
                nanosleep(&(struct timespec){(due - t0) / 1000000, ((due - t0) % 1000000) * 1000},
                          NULL);
            t0 = due;
        }
        int ok = 0;
        switch (cfg.mode) {
        case SD_LOCK: {
            snprintf(url, sizeof url, "%s/v1/locks/%s", cfg.url, key);
            int n = snprintf(body, sizeof body, "{\"holder\":\"%s\"}", holder);
            if (http(h, c, "PUT", url, json_hdrs, body, (size_t)n) != 200)
                break;
            long long seq = json_int(c, "lock_seq");
            char tok[80] = "Lock-Token: ";
            json_str(c, "lock_token", tok + 12, sizeof tok - 12);
            snprintf(url, sizeof url, "%s/v1/locks/%s?holder=%s&lock_seq=%lld", cfg.url, key,
                     holder, seq);
            struct curl_slist *hl = curl_slist_append(NULL, auth);
            hl = curl_slist_append(hl, tok);
            ok = http(h, c, "DELETE", url, hl, NULL, 0) == 200;
            curl_slist_free_all(hl);
            break;
        }
        case REDIS_LOCK: {
            char tok[SD_LOCK_TOKEN_LEN + 1];
            long long seq = redis_acquire(r, key, holder, tok);
            ok = seq > 0 && redis_release(r, key, holder, seq, tok) == 0;
            break;
        }
        case ETCD_LOCK: {
            char name[128], lockkey[512];
            b64(key, name);
            snprintf(url, sizeof url, "%s/v3/lock/lock", cfg.url);
            int n = snprintf(body, sizeof body, "{\"name\":\"%s\",\"lease\":\"%s\"}", name, lease);
            if (http(h, c, "POST", url, json_hdrs, body, (size_t)n) != 200 ||
                json_str(c, "key", lockkey, sizeof lockkey))
                break;
            snprintf(url, sizeof url, "%s/v3/lock/unlock", cfg.url);
            n = snprintf(body, sizeof body, "{\"key\":\"%s\"}", lockkey);
            ok = http(h, c, "POST", url, json_hdrs, body, (size_t)n) == 200;
            break;
        }
        case SD_BLOB: {
            char h1[64], h2[64], h3[80];
            snprintf(url, sizeof url, "%s/v1/blobs/bench-k%d", cfg.url, c->id);
            snprintf(h1, sizeof h1, "Lock-Seq: %lld", blob_lock_seq);
            snprintf(h2, sizeof h2, "Blob-Seq: %lld", ++blob_seq);
            snprintf(h3, sizeof h3, "Lock-Token: %s", blob_tok);
            struct curl_slist *hl = curl_slist_append(NULL, auth);
            hl = curl_slist_append(hl, "Content-Type: application/octet-stream");
            hl = curl_slist_append(hl, "Expect:");
            hl = curl_slist_append(hl, h1);
            hl = curl_slist_append(hl, h2);
            hl = curl_slist_append(hl, h3);
            ok = http(h, c, "PUT", url, hl, blob, cfg.size) == 200;
            curl_slist_free_all(hl);
            break;
        }
        case REDIS_BLOB: {
            char bk[256], lk[256], qk[256], ls[32], bs[32];
            snprintf(bk, sizeof bk, "%sblob:bench-k%d", cfg.prefix, c->id);
            snprintf(qk, sizeof qk, "%squota:blob:bench", cfg.prefix);
            snprintf(lk, sizeof lk, "%slock:bench-k%d", cfg.prefix, c->id);
            snprintf(ls, sizeof ls, "%lld", blob_lock_seq);
            snprintf(bs, sizeof bs, "%lld", ++blob_seq);
            /* as serverdir's on standalone Redis: no exact holder, no credential, the
             * scope's byte counter, the default quota, an unbound caller */
            const char *argv[] = {bk, lk, qk, ls, blob_tok, bs, blob, "", "", "", "", "",
                                  "bench", "1073741824", "", ""};
            size_t argl[] = {strlen(bk), strlen(lk), strlen(qk), strlen(ls), strlen(blob_tok),
                             strlen(bs), cfg.size, 0, 0, 0, 0, 0, 5, 10, 0, 0};
            redisReply *rep = evalsha(r, cfg.sha_save, 3, 16, argv, argl);
            ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
                 strcmp(rep->element[0]->str, "ok") == 0;
            if (rep)
                freeReplyObject(rep);
            break;
        }
        }
        if (ok)
            record(c, t0);
        else
            c->errors++;
    }
    if (h)
        curl_easy_cleanup(h);
    curl_slist_free_all(json_hdrs);
    curl_slist_free_all(auth_hdrs);
    if (r)
        redisFree(r);
    free(blob);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Loads LUADIR/name.lua with SCRIPT LOAD into sha (exits when it cannot). */
static void load_script(const char *name, char sha[41])
{
    if (bench_script_load("locks_load", cfg.host, cfg.port, cfg.luadir, name, sha))
        exit(1);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: locks_load -c CLIENTS -d SECONDS [-R RATE] MODE ARGS...\n"
            "  sd-lock URL TOKEN | redis-lock HOST PORT LUADIR PREFIX | etcd-lock URL |\n"
            "  sd-blob URL TOKEN SIZE | redis-blob HOST PORT LUADIR PREFIX SIZE\n");
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
        else if (!strcmp(argv[i], "-R"))
            cfg.rate = atof(argv[i + 1]);
        else
            usage();
    }
    if (i >= argc || cfg.clients < 1 || cfg.clients > MAX_CLIENTS || cfg.secs <= 0 ||
        cfg.secs > 600 || cfg.rate < 0 || cfg.rate > 1e7)
        usage();
    cfg.name = argv[i];
    int rest = argc - i - 1;
    char **a = argv + i + 1;
    if (!strcmp(cfg.name, "sd-lock") && rest == 2) {
        cfg.mode = SD_LOCK, cfg.url = a[0], cfg.token = a[1];
    } else if (!strcmp(cfg.name, "redis-lock") && rest == 4) {
        cfg.mode = REDIS_LOCK, cfg.host = a[0], cfg.port = atoi(a[1]), cfg.luadir = a[2],
        cfg.prefix = a[3];
    } else if (!strcmp(cfg.name, "etcd-lock") && rest == 1) {
        cfg.mode = ETCD_LOCK, cfg.url = a[0];
    } else if (!strcmp(cfg.name, "sd-blob") && rest == 3) {
        cfg.mode = SD_BLOB, cfg.url = a[0], cfg.token = a[1], cfg.size = (size_t)atol(a[2]);
    } else if (!strcmp(cfg.name, "redis-blob") && rest == 5) {
        cfg.mode = REDIS_BLOB, cfg.host = a[0], cfg.port = atoi(a[1]), cfg.luadir = a[2],
        cfg.prefix = a[3], cfg.size = (size_t)atol(a[4]);
    } else {
        usage();
    }
    if ((cfg.mode == SD_BLOB || cfg.mode == REDIS_BLOB) && (cfg.size < 1 || cfg.size > (1 << 24)))
        usage();
    if (cfg.mode == REDIS_LOCK || cfg.mode == REDIS_BLOB) {
        load_script("lock_acquire", cfg.sha_acquire);
        load_script("lock_release", cfg.sha_release);
        load_script("blob_save", cfg.sha_save);
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);

    client_t *cs = calloc((size_t)cfg.clients, sizeof *cs);
    pthread_t *th = calloc((size_t)cfg.clients, sizeof *th);
    int64_t t0 = sd_mono_us();
    for (int k = 0; k < cfg.clients; k++) {
        cs[k].id = k;
        cs[k].lat_us = malloc(MAX_SAMPLES * sizeof(uint32_t));
        pthread_create(&th[k], NULL, client_main, &cs[k]);
    }
    size_t total = 0;
    long errors = 0;
    for (int k = 0; k < cfg.clients; k++) {
        pthread_join(th[k], NULL);
        total += cs[k].n;
        errors += cs[k].errors;
    }
    double secs = (double)(sd_mono_us() - t0) / 1e6;
    uint32_t *all = malloc((total ? total : 1) * sizeof *all);
    size_t o = 0;
    for (int k = 0; k < cfg.clients; k++) {
        memcpy(all + o, cs[k].lat_us, cs[k].n * sizeof *all);
        o += cs[k].n;
        free(cs[k].lat_us);
    }
    qsort(all, total, sizeof *all, cmp_u32);
    double p50 = total ? all[total / 2] / 1000.0 : 0, p99 = total ? all[total * 99 / 100] / 1000.0 : 0;
    printf("mode=%s clients=%d secs=%.2f ops=%zu rate=%.0f p50_ms=%.2f p99_ms=%.2f errors=%ld\n",
           cfg.name, cfg.clients, secs, total, (double)total / secs, p50, p99, errors);
    free(all);
    free(cs);
    free(th);
    curl_global_cleanup();
    return errors && !total ? 1 : 0;
}
