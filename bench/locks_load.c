/* locks_load: a closed-loop load generator for bench/locks_bench.sh. N clients, each with
 * its own keep-alive connection, repeat one operation for D seconds and record every
 * operation's latency; at the end it prints one line, with its own CPU per operation:
 *
 *     mode=sd-lock clients=64 secs=5.00 ops=123456 rate=24691 p50_ms=2.41 p99_ms=6.80 errors=0
 *     gen_cpu_us_per_op=12.1
 *
 * The HTTP modes run their clients on T threads (-t, default 2) through epoll and a plain
 * HTTP/1.1 client of their own (below: why not libcurl); the raw-Redis modes run a thread
 * per client, each with a blocking hiredis connection.
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
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
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
    int threads; /* -t: the HTTP modes' threads (default 2) */
    char sha_acquire[41], sha_release[41], sha_save[41];
} cfg;

typedef struct {
    int id;
    uint32_t *lat_us;
    size_t n;
    long errors;
    bench_body_t out; /* the last answer */
} client_t;

static client_t *clients;

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
    const char *a[32];
    size_t l[32];
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
     * caller (no holder liveness check) that will not wait */
    const char *argv[] = {lk, bk, hk, holder, "0", "0", "604800000", "", "0", cfg.prefix, "1",
                          fresh, "0", "", "", "", "", "10000", "", "", "", "0"};
    redisReply *rep = evalsha(r, cfg.sha_acquire, 3, 22, argv, NULL);
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

/* The HTTP modes' client: plain HTTP/1.1 over one keep-alive TCP connection per client,
 * written here rather than run through libcurl because the generator shares this
 * machine's cores with the server it drives: libcurl spent about 22 us of CPU per request
 * (its options set again for each request, a poll per transfer), as much as serverdir
 * spends answering it, and capped the rate it measured (bench/README.md, "## locks").
 * A client sends one request and reads its answer (by its Content-Length, as serverdir
 * and etcd send them; a chunked answer counts as an error) before the next; T threads
 * each drive their clients through one epoll set. */
#define HTTP_IN_CAP (1 << 18) /* an answer's head and body at most */
#define HTTP_LATE_US 10000000 /* how long after the end an unanswered operation waits */

/* Per-client state of the HTTP modes: its connection and where its operation is. */
typedef struct {
    client_t *c;
    int fd;
    int step;    /* 0: the operation's first request; 1: its second (release, unlock) */
    int sending; /* the request is not all written yet (waiting for EPOLLOUT) */
    unsigned i;  /* operations begun */
    int64_t t0;  /* the operation's start (under -R its scheduled start) */
    int64_t due; /* -R: when the next operation is due (0: compute; -1: in flight or done) */
    long long blob_lock_seq, blob_seq;
    char holder[64], key[96], path[512], body[512], lease[32], lockkey[512];
    char blob_tok[SD_LOCK_TOKEN_LEN + 1], extra[256];
    char *blob;
    char *req; /* the request: head and body */
    size_t req_len, req_cap, req_sent;
    char *in; /* what was read of the answer */
    size_t in_len;
} hclient_t;

static struct sockaddr_storage http_addr;
static socklen_t http_addrlen;
static char http_host[256]; /* "host:port", the Host header */
static char http_auth[300]; /* "Authorization: Bearer ...\r\n" or "" */

/* Resolves cfg.url ("http://HOST:PORT") once. Exits when it cannot. */
static void http_target(void)
{
    const char *p = cfg.url;
    if (strncmp(p, "http://", 7) || strlen(p + 7) >= sizeof http_host) {
        fprintf(stderr, "locks_load: URL must be http://HOST:PORT: %s\n", cfg.url);
        exit(2);
    }
    snprintf(http_host, sizeof http_host, "%s", p + 7);
    char *slash = strchr(http_host, '/');
    if (slash)
        *slash = '\0';
    char host[256], *colon = strrchr(http_host, ':');
    if (!colon) {
        fprintf(stderr, "locks_load: URL has no port: %s\n", cfg.url);
        exit(2);
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - http_host), http_host);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, colon + 1, &hints, &ai)) {
        fprintf(stderr, "locks_load: cannot resolve %s\n", http_host);
        exit(2);
    }
    memcpy(&http_addr, ai->ai_addr, ai->ai_addrlen);
    http_addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
    /* etcd has no token here: it refuses any Authorization header it did not issue. */
    if (cfg.token)
        snprintf(http_auth, sizeof http_auth, "Authorization: Bearer %s\r\n", cfg.token);
}

/* Opens hc's connection (non-blocking once connected). Exits when it cannot. */
static void http_connect(hclient_t *hc)
{
    int fd = socket(http_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&http_addr, http_addrlen)) {
        fprintf(stderr, "locks_load: cannot connect to %s: %s\n", http_host, strerror(errno));
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    hc->fd = fd;
    hc->in_len = 0;
    hc->sending = 0;
}

/* Sets up hc's next request: method, hc->path, the extra headers ("Name: value\r\n"...)
 * and the body. */
static void http_prep(hclient_t *hc, const char *method, const char *extra, const char *body,
                      size_t len)
{
    size_t need = 1024 + strlen(extra) + len;
    if (hc->req_cap < need) {
        free(hc->req);
        hc->req = malloc(need);
        hc->req_cap = need;
    }
    int n = snprintf(hc->req, hc->req_cap,
                     "%s %s HTTP/1.1\r\nHost: %s\r\n%s%sContent-Length: %zu\r\n\r\n", method,
                     hc->path, http_host, http_auth, extra, len);
    memcpy(hc->req + n, body, len);
    hc->req_len = (size_t)n + len;
    hc->req_sent = 0;
    hc->c->out.len = 0;
    hc->c->out.buf[0] = '\0';
}

/* Writes what the socket takes of hc's request: 1 when all of it is written, 0 when the
 * rest waits for EPOLLOUT, -1 on error. */
static int http_write(hclient_t *hc)
{
    while (hc->req_sent < hc->req_len) {
        ssize_t w = send(hc->fd, hc->req + hc->req_sent, hc->req_len - hc->req_sent,
                         MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN)
            return 0;
        if (w <= 0)
            return -1;
        hc->req_sent += (size_t)w;
    }
    return 1;
}

/* The end of the line starting at p in [p, end): its "\r\n", or NULL. */
static char *line_end(char *p, char *end)
{
    for (; p + 1 < end; p++)
        if (p[0] == '\r' && p[1] == '\n')
            return p;
    return NULL;
}

/* Parses the answer read so far: 1 when it is whole (its status in *status, its body in
 * hc->c->out, its bytes taken off hc->in; *close set when the server closes after it),
 * 0 when more is needed, -1 when it is not HTTP as this client reads it (chunked
 * included). */
static int http_parse(hclient_t *hc, long *status, int *close_after)
{
    char *in = hc->in, *end = in + hc->in_len;
    char *he = memmem(in, hc->in_len, "\r\n\r\n", 4);
    if (!he)
        return hc->in_len >= HTTP_IN_CAP ? -1 : 0;
    if (hc->in_len < 12 || memcmp(in, "HTTP/1.", 7))
        return -1;
    *status = strtol(in + 9, NULL, 10);
    long long cl = -1;
    int chunked = 0;
    *close_after = 0;
    for (char *l = line_end(in, he + 2) + 2; l < he + 2;) {
        char *e = line_end(l, he + 2);
        if (!strncasecmp(l, "content-length:", 15))
            cl = strtoll(l + 15, NULL, 10);
        else if (!strncasecmp(l, "transfer-encoding:", 18) &&
                 memmem(l, (size_t)(e - l), "chunked", 7))
            chunked = 1;
        else if (!strncasecmp(l, "connection:", 11) && memmem(l, (size_t)(e - l), "close", 5))
            *close_after = 1;
        l = e + 2;
    }
    char *p = he + 4;
    if (chunked)
        return -1; /* serverdir and etcd send a Content-Length; this client reads no chunks */
    if (cl < 0)
        cl = 0; /* every answer here has a length; 204 has none */
    if (end - p < cl)
        return (size_t)(p - in) + (size_t)cl > HTTP_IN_CAP ? -1 : 0;
    bench_body_sink(p, 1, (size_t)cl, &hc->c->out);
    p += cl;
    hc->in_len = (size_t)(end - p);
    memmove(in, p, hc->in_len);
    return 1;
}

/* Reads what the socket has: 1 when an answer is whole (status, close as http_parse), 0
 * when more is to come, -1 on error or when the server closed. */
static int http_read(hclient_t *hc, long *status, int *close_after)
{
    for (;;) {
        int r = http_parse(hc, status, close_after);
        if (r)
            return r;
        ssize_t n = recv(hc->fd, hc->in + hc->in_len, HTTP_IN_CAP - hc->in_len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        if (n <= 0)
            return -1;
        hc->in_len += (size_t)n;
    }
}

/* Runs hc's request to its answer, waiting on the socket (the setup, before the timed
 * part); returns the status, 0 on any failure. */
static long http_run(hclient_t *hc)
{
    long status = 0;
    int close_after, r;
    while ((r = http_write(hc)) == 0)
        poll(&(struct pollfd){.fd = hc->fd, .events = POLLOUT}, 1, 10000);
    if (r < 0)
        return 0;
    while ((r = http_read(hc, &status, &close_after)) == 0)
        if (poll(&(struct pollfd){.fd = hc->fd, .events = POLLIN}, 1, 10000) <= 0)
            return 0;
    if (r < 0)
        return 0;
    if (close_after) {
        close(hc->fd);
        http_connect(hc);
    }
    return status;
}

/* A client's connection and, before the timed part, what its operations need: an etcd
 * lease, or the blob's lock. Exits when that fails. */
static void hclient_setup(hclient_t *hc)
{
    client_t *c = hc->c;
    hc->in = malloc(HTTP_IN_CAP);
    http_connect(hc);
    snprintf(hc->holder, sizeof hc->holder, "bench-h%d", c->id);
    strcpy(hc->lease, "0");
    if (cfg.mode == SD_BLOB) {
        hc->blob = malloc(cfg.size);
        for (size_t i = 0; i < cfg.size; i++)
            hc->blob[i] = (char)('a' + (i + (size_t)c->id) % 26);
    }
    if (cfg.mode == ETCD_LOCK) {
        snprintf(hc->path, sizeof hc->path, "/v3/lease/grant");
        http_prep(hc, "POST", "Content-Type: application/json\r\n", "{\"TTL\":600}", 11);
        if (http_run(hc) != 200 || json_str(c, "ID", hc->lease, sizeof hc->lease)) {
            fprintf(stderr, "locks_load: etcd lease grant failed: %s\n", c->out.buf);
            exit(1);
        }
    } else if (cfg.mode == SD_BLOB) {
        snprintf(hc->path, sizeof hc->path, "/v1/locks/bench-k%d", c->id);
        int n = snprintf(hc->body, sizeof hc->body, "{\"holder\":\"%s\"}", hc->holder);
        http_prep(hc, "PUT", "Content-Type: application/json\r\n", hc->body, (size_t)n);
        if (http_run(hc) != 200) {
            fprintf(stderr, "locks_load: acquire for blobs failed: %s\n", c->out.buf);
            exit(1);
        }
        hc->blob_lock_seq = json_int(c, "lock_seq");
        json_str(c, "lock_token", hc->blob_tok, sizeof hc->blob_tok);
    }
}

static void hclient_free(hclient_t *hc)
{
    close(hc->fd);
    free(hc->req);
    free(hc->in);
    free(hc->blob);
}

/* Sets up the request of hc's current step. */
static void op_request(hclient_t *hc)
{
    int n;
    switch (cfg.mode) {
    case SD_LOCK:
        if (hc->step == 0) {
            snprintf(hc->key, sizeof hc->key, "bench-k%d-%u", hc->c->id, hc->i % KEYS_PER_CLIENT);
            snprintf(hc->path, sizeof hc->path, "/v1/locks/%s", hc->key);
            n = snprintf(hc->body, sizeof hc->body, "{\"holder\":\"%s\"}", hc->holder);
            http_prep(hc, "PUT", "Content-Type: application/json\r\n", hc->body, (size_t)n);
        } else { /* the path and the token were set from the acquire's answer */
            http_prep(hc, "DELETE", hc->extra, NULL, 0);
        }
        break;
    case ETCD_LOCK:
        if (hc->step == 0) {
            char name[128];
            snprintf(hc->key, sizeof hc->key, "bench-k%d-%u", hc->c->id, hc->i % KEYS_PER_CLIENT);
            b64(hc->key, name);
            snprintf(hc->path, sizeof hc->path, "/v3/lock/lock");
            n = snprintf(hc->body, sizeof hc->body, "{\"name\":\"%s\",\"lease\":\"%s\"}", name,
                         hc->lease);
        } else {
            snprintf(hc->path, sizeof hc->path, "/v3/lock/unlock");
            n = snprintf(hc->body, sizeof hc->body, "{\"key\":\"%s\"}", hc->lockkey);
        }
        http_prep(hc, "POST", "Content-Type: application/json\r\n", hc->body, (size_t)n);
        break;
    case SD_BLOB:
        snprintf(hc->path, sizeof hc->path, "/v1/blobs/bench-k%d", hc->c->id);
        snprintf(hc->extra, sizeof hc->extra,
                 "Content-Type: application/octet-stream\r\nLock-Seq: %lld\r\nBlob-Seq: %lld\r\n"
                 "Lock-Token: %s\r\n",
                 hc->blob_lock_seq, ++hc->blob_seq, hc->blob_tok);
        http_prep(hc, "PUT", hc->extra, hc->blob, cfg.size);
        break;
    default:
        break;
    }
}

/* Takes the answer of hc's current step: 1 when the operation goes on (the next step's
 * request is set up), 0 when it is done, -1 when it failed. */
static int op_answer(hclient_t *hc, long status)
{
    client_t *c = hc->c;
    if (status != 200)
        return -1;
    if (hc->step == 1 || cfg.mode == SD_BLOB)
        return 0;
    if (cfg.mode == SD_LOCK) {
        long long seq = json_int(c, "lock_seq");
        char tok[SD_LOCK_TOKEN_LEN + 1] = "";
        json_str(c, "lock_token", tok, sizeof tok);
        snprintf(hc->extra, sizeof hc->extra, "Lock-Token: %s\r\n", tok);
        snprintf(hc->path, sizeof hc->path, "/v1/locks/%s?holder=%s&lock_seq=%lld", hc->key,
                 hc->holder, seq);
    } else if (json_str(c, "key", hc->lockkey, sizeof hc->lockkey)) {
        return -1;
    }
    hc->step = 1;
    op_request(hc);
    return 1;
}

/* Starts writing hc's request; 0, or -1 when the connection failed. */
static int op_send(int ep, hclient_t *hc)
{
    int w = http_write(hc);
    if (w < 0)
        return -1;
    if (w == 0 && !hc->sending) { /* the rest when the socket has room */
        hc->sending = 1;
        epoll_ctl(ep, EPOLL_CTL_MOD, hc->fd,
                  &(struct epoll_event){.events = EPOLLIN | EPOLLOUT, .data.ptr = hc});
    }
    return 0;
}

/* An operation of hc ended (ok or not): its latency or an error counted. */
static void op_end(hclient_t *hc, int ok)
{
    if (ok)
        record(hc->c, hc->t0);
    else
        hc->c->errors++;
    hc->i++;
    hc->due = 0; /* begins its next operation at once, or when due under -R */
}

/* hc's connection failed: a new one in the same epoll set, the operation counted failed. */
static void op_reconnect(int ep, hclient_t *hc)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, hc->fd, NULL);
    close(hc->fd);
    http_connect(hc);
    epoll_ctl(ep, EPOLL_CTL_ADD, hc->fd, &(struct epoll_event){.events = EPOLLIN, .data.ptr = hc});
}

/* epoll_wait with a timeout in microseconds (the pacing of -R): epoll_pwait2 where the
 * kernel has it (Linux 5.11), else epoll_wait with the timeout rounded up to a
 * millisecond. */
static int epoll_wait_us(int ep, struct epoll_event *evs, int max, int64_t us)
{
    static _Atomic int no_pwait2;
    if (!no_pwait2) {
        struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
        int n = epoll_pwait2(ep, evs, max, &ts, NULL);
        if (n >= 0 || errno != ENOSYS)
            return n;
        no_pwait2 = 1;
    }
    return epoll_wait(ep, evs, max, (int)((us + 999) / 1000));
}

/* The HTTP modes: the clients k, k + T, k + 2T... of one of T threads, all driven through
 * one epoll set, so a client costs no thread of its own. */
static void *http_thread_main(void *arg)
{
    int k0 = (int)(intptr_t)arg;
    int nc = 0;
    hclient_t *hcs = calloc((size_t)(cfg.clients / cfg.threads + 1), sizeof *hcs);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    for (int k = k0; k < cfg.clients; k += cfg.threads) {
        hcs[nc].c = &clients[k];
        hclient_setup(&hcs[nc]);
        epoll_ctl(ep, EPOLL_CTL_ADD, hcs[nc].fd,
                  &(struct epoll_event){.events = EPOLLIN, .data.ptr = &hcs[nc]});
        nc++;
    }
    int64_t start = sd_mono_us(), end = start + (int64_t)(cfg.secs * 1e6);
    /* -R: each client's operations start on a fixed schedule, spread over the clients */
    double period_us = cfg.rate > 0 ? 1e6 * cfg.clients / cfg.rate : 0;
    int active = 0, waiting = nc; /* clients with an operation in flight / between two */
    struct epoll_event evs[64];
    for (;;) {
        int64_t now = sd_mono_us(), next = INT64_MAX;
        for (int j = 0; waiting > 0 && j < nc; j++) {
            hclient_t *hc = &hcs[j];
            if (hc->due < 0)
                continue; /* in flight, or finished */
            if (period_us > 0 && hc->due == 0)
                hc->due = start + (int64_t)(period_us * (hc->i + (double)hc->c->id / cfg.clients));
            if (now >= end || (period_us > 0 && hc->due >= end)) {
                hc->due = -1; /* finished */
                waiting--;
                continue;
            }
            if (hc->due > now) {
                next = hc->due < next ? hc->due : next;
                continue;
            }
            hc->t0 = period_us > 0 ? hc->due : now;
            hc->due = -1;
            waiting--;
            active++;
            hc->step = 0;
            op_request(hc);
            if (op_send(ep, hc)) {
                op_reconnect(ep, hc);
                op_end(hc, 0);
                active--;
                waiting++;
            }
        }
        if (!active && !waiting)
            break;
        if (!waiting && now >= end + HTTP_LATE_US) {
            /* what is still in flight 10 s after the end (a server that stopped
             * answering) counts as failed, as libcurl's timeout did */
            hcs[0].c->errors += active;
            fprintf(stderr, "locks_load: %d operations unanswered 10 s after the end\n", active);
            break;
        }
        int64_t wait_us = next == INT64_MAX ? 100000 : next - sd_mono_us();
        if (wait_us < 0)
            wait_us = 0;
        int ne = epoll_wait_us(ep, evs, 64, wait_us);
        for (int e = 0; e < ne; e++) {
            hclient_t *hc = evs[e].data.ptr;
            if (hc->due != -1 || hc->req_len == 0)
                continue; /* not in flight (a late event of a reconnected socket) */
            int r = 0, close_after = 0;
            long status = 0;
            if (hc->sending && (evs[e].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
                r = http_write(hc);
                if (r == 1) {
                    hc->sending = 0;
                    epoll_ctl(ep, EPOLL_CTL_MOD, hc->fd,
                              &(struct epoll_event){.events = EPOLLIN, .data.ptr = hc});
                }
                r = r < 0 ? -1 : 0;
            }
            if (r == 0 && (evs[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
                r = http_read(hc, &status, &close_after);
            if (r == 0)
                continue;
            int more = r == 1 ? op_answer(hc, status) : -1;
            if (r < 0 || close_after)
                op_reconnect(ep, hc);
            if (more == 1 && op_send(ep, hc) == 0)
                continue;
            if (more == 1) {
                op_reconnect(ep, hc);
                more = -1;
            }
            op_end(hc, more == 0);
            active--;
            waiting++;
        }
    }
    close(ep);
    for (int j = 0; j < nc; j++)
        hclient_free(&hcs[j]);
    free(hcs);
    return NULL;
}

/* The raw-Redis modes: one thread per client, each with its own blocking connection. */
static void *client_main(void *arg)
{
    client_t *c = arg;
    char holder[64], key[96];
    snprintf(holder, sizeof holder, "bench-h%d", c->id);
    redisContext *r = redisConnect(cfg.host, cfg.port);
    if (!r || r->err) {
        fprintf(stderr, "locks_load: cannot connect to redis\n");
        exit(1);
    }
    char *blob = NULL;
    long long blob_lock_seq = 0;
    char blob_tok[SD_LOCK_TOKEN_LEN + 1] = "";
    if (cfg.mode == REDIS_BLOB) {
        blob = malloc(cfg.size);
        for (size_t i = 0; i < cfg.size; i++)
            blob[i] = (char)('a' + (i + (size_t)c->id) % 26);
        snprintf(key, sizeof key, "bench-k%d", c->id);
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
        if (cfg.mode == REDIS_LOCK) {
            char tok[SD_LOCK_TOKEN_LEN + 1];
            long long seq = redis_acquire(r, key, holder, tok);
            ok = seq > 0 && redis_release(r, key, holder, seq, tok) == 0;
        } else {
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
        }
        if (ok)
            record(c, t0);
        else
            c->errors++;
    }
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
            "usage: locks_load -c CLIENTS -d SECONDS [-R RATE] [-t THREADS] MODE ARGS...\n"
            "  sd-lock URL TOKEN | redis-lock HOST PORT LUADIR PREFIX | etcd-lock URL |\n"
            "  sd-blob URL TOKEN SIZE | redis-blob HOST PORT LUADIR PREFIX SIZE\n");
    exit(2);
}

int main(int argc, char **argv)
{
    cfg.clients = 64;
    cfg.secs = 5;
    cfg.threads = 2;
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        if (!strcmp(argv[i], "-c"))
            cfg.clients = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-d"))
            cfg.secs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-R"))
            cfg.rate = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-t"))
            cfg.threads = atoi(argv[i + 1]);
        else
            usage();
    }
    if (i >= argc || cfg.clients < 1 || cfg.clients > MAX_CLIENTS || cfg.secs <= 0 ||
        cfg.secs > 600 || cfg.rate < 0 || cfg.rate > 1e7 || cfg.threads < 1 || cfg.threads > 64)
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

    client_t *cs = clients = calloc((size_t)cfg.clients, sizeof *cs);
    int http = cfg.mode == SD_LOCK || cfg.mode == ETCD_LOCK || cfg.mode == SD_BLOB;
    int nth = http ? (cfg.threads < cfg.clients ? cfg.threads : cfg.clients) : cfg.clients;
    if (http) {
        cfg.threads = nth;
        http_target();
    }
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    for (int k = 0; k < cfg.clients; k++) {
        cs[k].id = k;
        cs[k].lat_us = malloc(MAX_SAMPLES * sizeof(uint32_t));
    }
    int64_t t0 = sd_mono_us();
    for (int k = 0; k < nth; k++)
        pthread_create(&th[k], NULL, http ? http_thread_main : client_main,
                       http ? (void *)(intptr_t)k : (void *)&cs[k]);
    for (int k = 0; k < nth; k++)
        pthread_join(th[k], NULL);
    size_t total = 0;
    long errors = 0;
    for (int k = 0; k < cfg.clients; k++) {
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
    /* the generator's own CPU per operation: what it takes from the cores it shares */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu_us = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
                    (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    printf("mode=%s clients=%d secs=%.2f ops=%zu rate=%.0f p50_ms=%.2f p99_ms=%.2f errors=%ld "
           "gen_cpu_us_per_op=%.1f\n",
           cfg.name, cfg.clients, secs, total, (double)total / secs, p50, p99, errors,
           total ? cpu_us / (double)total : 0);
    free(all);
    free(cs);
    free(th);
    return errors && !total ? 1 : 0;
}
