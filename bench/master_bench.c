/* Master-list benchmark: starts a real redis-server and serverdir (with a UDP master
 * listener) on free loopback ports, lists 100,000 servers and measures
 *   1. heartbeats accepted per second (each = POST challenge + POST heartbeat, from
 *      100,000 distinct addresses given through X-Forwarded-For by a trusted proxy),
 *   2. the whole list walked over REST in batches of 1000 (JSON and format=text),
 *   3. a filtered batch (game = one of 10 games, not_full, limit 100, random cursor):
 *      p50 / p99 latency,
 *   4. UDP Valve master queries answered per second (filter \gamedir\, 231-server
 *      replies, 32 queries in flight).
 * Targets (bench/README.md, "master list"): 20,000 heartbeats/s, full walk < 200 ms,
 * filtered batch p99 < 2 ms.
 * Every run starts from an empty Redis. Usage: bench_master [--servers N] [--runs R]
 * [--threads T]. ctest runs it at 1000 servers, one run (bench.master_smoke). */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TARGET_HB_PER_S 20000.0
#define TARGET_WALK_MS 200.0
#define TARGET_P99_MS 2.0
#define NGAMES 10

static int nservers = 100000;
static int nthreads = 8;
static h_serverdir_t sd;
static struct sockaddr_in udp_master;

struct sink {
    char buf[1 << 20];
    size_t len;
};

static size_t sink_write(char *p, size_t size, size_t n, void *ud)
{
    struct sink *s = ud;
    size_t k = size * n;
    if (s->len + k < sizeof s->buf) {
        memcpy(s->buf + s->len, p, k);
        s->len += k;
        s->buf[s->len] = '\0';
    }
    return k;
}

/* One keep-alive HTTP request on handle h; returns the status (0 on transport error). */
static long http(CURL *h, struct sink *s, const char *method, const char *url,
                 const char *body, struct curl_slist *hdrs)
{
    s->len = 0;
    s->buf[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, body ? (long)strlen(body) : 0L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    if (curl_easy_perform(h) != CURLE_OK)
        return 0;
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    return st;
}

/* ---------- 1. heartbeats ---------- */

static atomic_int next_server;
static atomic_int hb_ok, hb_fail;

static void *hb_worker(void *arg)
{
    CURL *h = curl_easy_init();
    struct sink *s = malloc(sizeof *s);
    char url_ch[160], url_hb[160];
    snprintf(url_ch, sizeof url_ch, "%s/v1/master/challenge", sd.url);
    snprintf(url_hb, sizeof url_hb, "%s/v1/master/heartbeat", sd.url);
    for (;;) {
        int i = atomic_fetch_add(&next_server, 1);
        if (i >= nservers)
            break;
        char xff[64];
        snprintf(xff, sizeof xff, "X-Forwarded-For: 10.%d.%d.%d", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        struct curl_slist *hdrs = curl_slist_append(NULL, xff);
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        long st = http(h, s, "POST", url_ch, NULL, hdrs);
        const char *c = st == 200 ? strstr(s->buf, "\"challenge\":\"") : NULL;
        if (c) {
            char chal[64], body[512];
            snprintf(chal, sizeof chal, "%.32s", c + 13);
            snprintf(body, sizeof body,
                     "{\"challenge\":\"%s\",\"port\":27015,\"game\":\"benchgame%d\",\"map\":\"map%d\","
                     "\"players\":%d,\"max_players\":16,\"region\":\"eu\",\"tags\":[\"t%d\"]}",
                     chal, i % NGAMES, i % 7, i % 17, i % 5);
            st = http(h, s, "POST", url_hb, body, hdrs);
        }
        atomic_fetch_add(st == 200 ? &hb_ok : &hb_fail, 1);
        curl_slist_free_all(hdrs);
    }
    free(s);
    curl_easy_cleanup(h);
    return NULL;
}

static double bench_heartbeats(void)
{
    atomic_store(&next_server, 0);
    atomic_store(&hb_ok, 0);
    atomic_store(&hb_fail, 0);
    pthread_t th[64];
    int64_t t0 = h_now_ms();
    for (int i = 0; i < nthreads; i++)
        pthread_create(&th[i], NULL, hb_worker, NULL);
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    double secs = (double)(h_now_ms() - t0) / 1000.0;
    if (atomic_load(&hb_fail))
        fprintf(stderr, "bench: %d heartbeats failed\n", atomic_load(&hb_fail));
    return atomic_load(&hb_ok) / secs;
}

/* The anchor measured in the same run: GET /healthz (no Redis) with the same threads and
 * keep-alive handles, i.e. what serverdir's HTTP layer does on this machine right now.
 * A heartbeat is two requests, so anchor / 2 bounds the heartbeat rate. */
static atomic_int anchor_stop;
static atomic_long anchor_count;

static void *anchor_worker(void *arg)
{
    CURL *h = curl_easy_init();
    struct sink *s = malloc(sizeof *s);
    char url[160];
    snprintf(url, sizeof url, "%s/healthz", sd.url);
    while (!atomic_load(&anchor_stop))
        if (http(h, s, "GET", url, NULL, NULL) == 200)
            atomic_fetch_add(&anchor_count, 1);
    free(s);
    curl_easy_cleanup(h);
    return NULL;
}

static double bench_anchor(int ms)
{
    atomic_store(&anchor_stop, 0);
    atomic_store(&anchor_count, 0);
    pthread_t th[64];
    int64_t t0 = h_now_ms();
    for (int i = 0; i < nthreads; i++)
        pthread_create(&th[i], NULL, anchor_worker, NULL);
    h_sleep_ms(ms);
    atomic_store(&anchor_stop, 1);
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    return (double)atomic_load(&anchor_count) * 1000.0 / (double)(h_now_ms() - t0);
}

/* ---------- 2. the full walk ---------- */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The cursor of a batch: "next" of the JSON body, or the Master-Next header (text). */
static size_t hdr_next(char *p, size_t size, size_t n, void *ud)
{
    size_t k = size * n;
    if (k > 13 && strncasecmp(p, "Master-Next: ", 13) == 0) {
        char *out = ud;
        size_t l = k - 13;
        while (l && (p[13 + l - 1] == '\r' || p[13 + l - 1] == '\n'))
            l--;
        if (l < 64) {
            memcpy(out, p + 13, l);
            out[l] = '\0';
        }
    }
    return k;
}

/* Walks the whole list in batches of 1000; returns the ms taken, servers in *count. */
static double bench_walk(int text, int *count)
{
    CURL *h = curl_easy_init();
    struct sink *s = malloc(sizeof *s);
    char after[64] = "", next[64], url[256];
    *count = 0;
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, hdr_next);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, next);
    int64_t t0 = now_us();
    for (int b = 0; b < 10000; b++) {
        snprintf(url, sizeof url, "%s/v1/master/servers?limit=1000%s%s%s", sd.url,
                 text ? "&format=text" : "", after[0] ? "&after=" : "", after);
        next[0] = '\0';
        if (http(h, s, "GET", url, NULL, NULL) != 200) {
            fprintf(stderr, "bench: walk batch failed\n");
            break;
        }
        if (text) {
            for (size_t i = 0; i < s->len; i++)
                *count += s->buf[i] == '\n';
        } else {
            for (char *p = strstr(s->buf, "\"address\":"); p; p = strstr(p + 10, "\"address\":"))
                (*count)++;
            char *nx = strstr(s->buf, "],\"next\":\"");
            if (nx)
                sscanf(nx + 10, "%63[^\"]", next);
        }
        if (!next[0])
            break;
        snprintf(after, sizeof after, "%s", next);
    }
    double ms = (double)(now_us() - t0) / 1000.0;
    free(s);
    curl_easy_cleanup(h);
    return ms;
}

/* ---------- 3. filtered batches ---------- */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* n filtered batches from random cursors; p50 and p99 in ms. */
static void bench_filtered(int n, double *p50, double *p99)
{
    CURL *h = curl_easy_init();
    struct sink *s = malloc(sizeof *s);
    int64_t *lat = calloc((size_t)n, sizeof *lat);
    unsigned seed = 7;
    for (int k = 0; k < n; k++) {
        int i = (int)(rand_r(&seed) % (unsigned)nservers);
        char url[256];
        snprintf(url, sizeof url,
                 "%s/v1/master/servers?game=benchgame%d&not_full=1&limit=100&after=10.%d.%d.%d:27015",
                 sd.url, k % NGAMES, (i >> 16) & 255, (i >> 8) & 255, i & 255);
        int64_t t0 = now_us();
        if (http(h, s, "GET", url, NULL, NULL) != 200)
            fprintf(stderr, "bench: filtered batch failed\n");
        lat[k] = now_us() - t0;
    }
    qsort(lat, (size_t)n, sizeof *lat, cmp_i64);
    *p50 = (double)lat[n / 2] / 1000.0;
    *p99 = (double)lat[n * 99 / 100] / 1000.0;
    free(lat);
    free(s);
    curl_easy_cleanup(h);
}

/* ---------- 4. UDP Valve queries ---------- */

/* Keeps `window` Valve queries in flight for ms milliseconds; returns replies/s. */
/* One Valve query for every server (no filter, first batch), as a spoofer would send it:
 * the bytes asked and the bytes answered. */
static void amplification(long *asked, long *answered)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    static const uint8_t q[] = "\x31\xff" "0.0.0.0:0\0"; /* + the array's NUL: no filter */
    sendto(fd, q, sizeof q, 0, (struct sockaddr *)&udp_master, sizeof udp_master);
    *asked = (long)sizeof q;
    *answered = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint8_t buf[2048];
    ssize_t n;
    while (poll(&p, 1, 300) == 1 && (n = recv(fd, buf, sizeof buf, 0)) > 0)
        *answered += (long)n;
    close(fd);
}

static double bench_udp(int ms, int window)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&me, sizeof me);
    uint8_t q[64];
    int qn = 0;
    q[qn++] = 0x31;
    q[qn++] = 0xff;
    memcpy(q + qn, "0.0.0.0:0", 10);
    qn += 10;
    static const char filter[] = "\\gamedir\\benchgame3";
    memcpy(q + qn, filter, sizeof filter);
    qn += (int)sizeof filter;
    int inflight = 0;
    long replies = 0;
    int64_t t0 = now_us(), end = t0 + (int64_t)ms * 1000;
    while (now_us() < end) {
        while (inflight < window) {
            sendto(fd, q, (size_t)qn, 0, (struct sockaddr *)&udp_master, sizeof udp_master);
            inflight++;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 200) != 1) {
            inflight = 0; /* lost ones: send again */
            continue;
        }
        uint8_t buf[2048];
        while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
            replies++;
            inflight--;
        }
    }
    double secs = (double)(now_us() - t0) / 1e6;
    close(fd);
    return (double)replies / secs;
}

/* ---------- driver ---------- */

/* Mean Redis time per call of cmd ("evalsha", "zrangebylex") since the last CONFIG
 * RESETSTAT (µs), from INFO commandstats; resets the stats. */
static double redis_us_per_call(h_redis_t *redis, const char *cmd)
{
    redisReply *rr = h_redis(redis, "INFO commandstats");
    double us = 0;
    char name[64];
    snprintf(name, sizeof name, "cmdstat_%s:", cmd);
    const char *p = rr && rr->str ? strstr(rr->str, name) : NULL;
    const char *u = p ? strstr(p, "usec_per_call=") : NULL;
    if (u)
        us = atof(u + 14);
    freeReplyObject(rr);
    rr = h_redis(redis, "CONFIG RESETSTAT");
    freeReplyObject(rr);
    return us;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    int runs = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--servers"))
            nservers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            nthreads = atoi(argv[i + 1]);
    }
    if (nservers < 1000 || runs < 1 || runs > 9 || nthreads < 1 || nthreads > 64) {
        fprintf(stderr, "usage: bench_master [--servers N>=1000] [--runs 1-9] [--threads 1-64]\n");
        return 2;
    }
    h_init(3600);
    h_redis_t redis;
    if (h_redis_start(&redis))
        return 1;
    int uport = h_free_port();
    char uflag[64], cfg[512];
    snprintf(uflag, sizeof uflag, "127.0.0.1:%d", uport);
    snprintf(cfg, sizeof cfg,
             "{\"log_level\": \"warn\", \"master\": {\"trusted_proxies\": [\"127.0.0.1\"],"
             " \"servers_per_address\": 1000, \"challenges_per_address\": 1000,"
             " \"rate_per_s\": 10000000, \"max_batch\": 1000, \"max_servers\": %d,"
             " \"udp_reply_bytes_per_s\": 1000000000,"
             " \"udp_reply_bytes_total_per_s\": 10000000000}}",
             nservers * 2);
    const char *path = h_write_file(h_tmpdir(), "bench.json", cfg, 0644);
    const char *extra[] = {"--config", path, "--master-udp", uflag, "--threads", "8", NULL};
    if (h_serverdir_start(&sd, redis.url, NULL, extra))
        return 1;
    udp_master.sin_family = AF_INET;
    udp_master.sin_port = htons((uint16_t)uport);
    udp_master.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    double hb[9], walk[9], walkt[9], p50[9], p99[9], udp[9], anchor[9];
    printf("master list benchmark: %d servers, %d client threads, %d runs (shared, noisy machine)\n",
           nservers, nthreads, runs);
    for (int r = 0; r < runs; r++) {
        redisReply *rr = h_redis(&redis, "FLUSHALL");
        freeReplyObject(rr);
        anchor[r] = bench_anchor(2000);
        redis_us_per_call(&redis, "evalsha");
        hb[r] = bench_heartbeats();
        double us_hb = redis_us_per_call(&redis, "evalsha");
        int n1, n2;
        walk[r] = bench_walk(0, &n1);
        double us_walk = redis_us_per_call(&redis, "zrangebylex");
        walkt[r] = bench_walk(1, &n2);
        double us_walkt = redis_us_per_call(&redis, "zrangebylex");
        printf("run %d: redis time per call: heartbeat phase %.1f us a script, json walk %.1f us"
               " a ZRANGEBYLEX, text walk %.1f us\n", r + 1, us_hb, us_walk, us_walkt);
        if (n1 != nservers || n2 != nservers)
            fprintf(stderr, "bench: the walk saw %d (json) / %d (text) of %d servers\n", n1, n2, nservers);
        bench_filtered(2000, &p50[r], &p99[r]);
        udp[r] = bench_udp(3000, 32);
        printf("run %d: anchor GET /healthz %.0f/s; heartbeats %.0f/s (%.2f of anchor/2)  walk json %.1f ms  walk text %.1f ms  filtered p50 %.3f ms"
               " p99 %.3f ms  udp valve queries %.0f/s\n",
               r + 1, anchor[r], hb[r], hb[r] / (anchor[r] / 2), walk[r], walkt[r], p50[r], p99[r], udp[r]);
    }
    double mhb = median(hb, runs), mw = median(walk, runs), mwt = median(walkt, runs);
    double m50 = median(p50, runs), m99 = median(p99, runs), mudp = median(udp, runs);
    double manchor = median(anchor, runs);
    printf("\nmedian of %d runs                  value      target   ratio (value/target; >1 is better for rates, <1 for times)\n", runs);
    printf("anchor: GET /healthz/s         %10.0f  (same threads; a heartbeat is 2 requests)\n", manchor);
    printf("heartbeats accepted/s          %10.0f  %10.0f   %.2f   (%.2f of anchor/2)\n", mhb,
           TARGET_HB_PER_S, mhb / TARGET_HB_PER_S, mhb / (manchor / 2));
    printf("full walk, batches of 1000 (ms)%10.1f  %10.0f   %.2f\n", mw, TARGET_WALK_MS, mw / TARGET_WALK_MS);
    printf("full walk, format=text (ms)    %10.1f  %10.0f   %.2f\n", mwt, TARGET_WALK_MS, mwt / TARGET_WALK_MS);
    printf("filtered batch p50 (ms)        %10.3f  %10s\n", m50, "-");
    printf("filtered batch p99 (ms)        %10.3f  %10.1f   %.2f\n", m99, TARGET_P99_MS, m99 / TARGET_P99_MS);
    printf("udp valve queries answered/s   %10.0f  %10s\n", mudp, "-");
    long asked, answered;
    amplification(&asked, &answered);
    printf("amplification: a %ld-byte Valve query is answered with %ld bytes (%.0fx); the most\n"
           "  an attacker draws with spoofed queries, per master copy, at the defaults: %d bytes/s\n"
           "  to one victim /24 or /64 (udp_reply_bytes_per_s, burst 2x), %d bytes/s to all\n"
           "  victims together (udp_reply_bytes_total_per_s, burst 2x); this bench raises both\n",
           asked, answered, (double)answered / (double)asked, 65536, 16 << 20);
    h_serverdir_stop(&sd);
    h_redis_stop(&redis);
    return 0;
}
