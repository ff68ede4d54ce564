/* The UDP master front: for each `--master-udp HOST:PORT` listener, several worker threads
 * (master.udp_workers, default one per CPU), each with its own socket bound to the same
 * address with SO_REUSEPORT (the kernel spreads the sources over them), speaking the
 * DarkPlaces/Quake III master protocol and Valve's master query protocol plus the
 * GoldSrc heartbeat.
 *
 * A worker never waits on Redis: queries are answered from the copy's in-memory index
 * (master_index.c), challenges are stateless (master_chal.c), and an accepted
 * registration or a termination is queued for the writer thread, which batches them into
 * Redis. A datagram that fails any check is dropped and counted in
 * serverdir_master_dropped_total{proto,reason}.
 *
 * Amplification: every datagram first takes one request from its source's rate bucket,
 * and every reply datagram takes its size from the destination network's reply-byte
 * bucket and from the copy's total (docs/master.md, "Amplification"). Unauthenticated
 * requests get at most one small datagram (getinfo, the GoldSrc challenge). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "master.h"
#include "master_q3.h"
#include "master_valve.h"
#include "sd.h"

#define RECV_MAX 2048
#define OUT_MAX 64 /* reply datagrams sent with one sendmmsg */
#define RECV_BATCH 32 /* datagrams read with one recvmmsg */
#define MAX_WORKERS 16

struct listener;

struct worker {
    int fd;
    pthread_t thread;
    const char *addr;
    struct listener *l;
    /* reply datagrams waiting for sendmmsg, each with its destination: a worker sends
     * what one recvmmsg batch made with one call (a getinfo per heartbeat of the batch) */
    int nout;
    struct mmsghdr msg[OUT_MAX];
    struct sockaddr_storage to[OUT_MAX];
    socklen_t tolen[OUT_MAX];
    struct iovec iov[OUT_MAX];
    uint8_t out[OUT_MAX][SD_Q3_DGRAM_MAX];
    uint8_t in[RECV_BATCH][RECV_MAX];
};

/* A getservers to answer: the one query whose answer is the whole list, handed from the
 * receiving worker to the query threads so a worker is always free for heartbeats
 * ("heartbeats are never delayed by queries"). */
struct qjob {
    uint8_t p[SD_Q3_DGRAM_MAX];
    size_t n;
    struct sockaddr_storage from;
    socklen_t fromlen;
    char ip[48];
};
#define QJOBS_MAX 1024

struct listener {
    char addr[128];
    int nworkers, nquery;
    struct worker *w[MAX_WORKERS];
    struct worker *q[MAX_WORKERS];  /* query threads (their fd is worker 0's) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct qjob *jobs[QJOBS_MAX];
    int jhead, jlen, stopping;
};

static struct listener listeners[SD_MASTER_MAX_UDP];
static int nlisteners;
static int stop_fd = -1;

/* ---------- sending ---------- */

/* Takes n bytes from the destination network's and the copy's reply budgets; 0 or -1
 * (counted). */
static int budget(const char *ip, const char *proto, size_t n)
{
    if (sd_master_rate_take(SD_RATE_UDP_BYTES, ip, (int64_t)n)) {
        sd_master_count_drop(proto, "reply_budget");
        return -1;
    }
    if (sd_master_rate_take(SD_RATE_UDP_TOTAL, "", (int64_t)n)) {
        sd_master_count_drop(proto, "reply_budget_total");
        return -1;
    }
    return 0;
}

/* Sends the queued reply datagrams of w (one sendmmsg, retried for the rest). */
static void flush(struct worker *w)
{
    int at = 0;
    while (at < w->nout) {
        for (int i = at; i < w->nout; i++) {
            w->msg[i].msg_hdr.msg_name = &w->to[i];
            w->msg[i].msg_hdr.msg_namelen = w->tolen[i];
            w->msg[i].msg_hdr.msg_iov = &w->iov[i];
            w->msg[i].msg_hdr.msg_iovlen = 1;
        }
        int sent = sendmmsg(w->fd, w->msg + at, (unsigned)(w->nout - at), 0);
        if (sent <= 0) {
            SD_COUNT("serverdir_master_udp_send_errors_total", "UDP master replies that could not be sent",
                     w->nout - at);
            break;
        }
        SD_COUNT("serverdir_master_udp_replies_total", "UDP master reply datagrams sent", sent);
        at += sent;
    }
    w->nout = 0;
}

/* Queues one reply datagram to `to` if the budgets allow (flushing when the queue is
 * full); 0 or -1. */
static int queue_reply(struct worker *w, const struct sockaddr *to, socklen_t tolen,
                       const char *ip, const char *proto, const void *p, size_t n)
{
    if (budget(ip, proto, n))
        return -1;
    if (w->nout == OUT_MAX)
        flush(w);
    if (tolen > sizeof w->to[0])
        tolen = sizeof w->to[0];
    memcpy(&w->to[w->nout], to, tolen);
    w->tolen[w->nout] = tolen;
    memcpy(w->out[w->nout], p, n);
    w->iov[w->nout].iov_base = w->out[w->nout];
    w->iov[w->nout].iov_len = n;
    w->nout++;
    return 0;
}

/* One reply datagram, sent with the others the same receive batch made (the worker
 * flushes after each batch). */
static void send_one(struct worker *w, const struct sockaddr *to, socklen_t tolen,
                     const char *ip, const char *proto, const void *p, size_t n)
{
    queue_reply(w, to, tolen, ip, proto, p, n);
}

/* Fills s's address from the datagram's source. */
static void set_source(sd_master_server_t *s, const char *key, const char *ip, int family, int port,
                       const char *proto)
{
    sd_strlcpy(s->addr, key, sizeof s->addr);
    sd_strlcpy(s->ip, ip, sizeof s->ip);
    s->port = port;
    s->family = family;
    s->source = proto;
    s->instance[0] = '\0';
}

/* Queues a registration whose challenge checked out: the writer lists it. A challenge
 * this copy's index already has on the server's entry (the index keeps its 32-bit hash:
 * one legitimate heartbeat in 4 billion may be taken for a replay and wait for the
 * next) is a replay: dropped here, and master_heartbeat.lua refuses it anyway. */
static void accept_server(const char *proto, const char *key, const char *ip, int family,
                          int port, sd_master_server_t *s, const char *chal)
{
    uint32_t last;
    int64_t exp;
    if (sd_master_index_lookup(key, &last, &exp) && exp > sd_wall_ms() &&
        last == sd_master_chal_hash(chal, sd_master_chal_stamp_len(chal))) {
        sd_master_count_drop(proto, "challenge_used");
        return;
    }
    set_source(s, key, ip, family, port, proto);
    int64_t now = sd_wall_ms();
    char group[SD_MASTER_GROUP_MAX], rec[2048];
    sd_master_addr_group(ip, (int)sd_master_cfg.ipv4_group_bits, group, sizeof group);
    size_t len = sd_master_record(s, chal, group, now, now + sd_master_cfg.heartbeat_interval_s * 3000,
                                  rec, sizeof rec);
    if (!len) {
        sd_master_count_drop(proto, "too_long");
        return;
    }
    sd_master_write_heartbeat(proto, key, group, "", rec, len);
}

/* ---------- DarkPlaces / Quake III ---------- */

static void q3_heartbeat(struct worker *w, const uint8_t *p, size_t n, const struct sockaddr *from,
                         socklen_t fromlen, const char *key, const char *ip)
{
    char tag[64];
    const char *why = sd_q3_parse_heartbeat(p, n, tag, sizeof tag);
    if (why) {
        sd_master_count_drop("q3", why);
        return;
    }
    char chal[SD_MASTER_CHAL_MAX] = "";
    sd_master_refusal_t refused;
    if (sd_master_challenge('q', key, chal, sizeof chal, sd_master_cfg.getinfo_timeout_ms,
                            &refused)) {
        sd_master_count_drop("q3", refused.code);
        return;
    }
    uint8_t out[128];
    size_t len = sd_q3_encode_getinfo(chal, out, sizeof out);
    send_one(w, from, fromlen, ip, "q3", out, len);
}

static void q3_inforesponse(const uint8_t *p, size_t n, const char *key, const char *ip,
                            int family, int port)
{
    sd_master_server_t s;
    char chal[SD_MASTER_CHAL_MAX];
    const char *why = sd_q3_parse_inforesponse(p, n, &s, chal, sizeof chal);
    if (!why)
        why = sd_master_chal_check('q', key, chal);
    if (why) {
        sd_master_count_drop("q3", why);
        return;
    }
    accept_server("q3", key, ip, family, port, &s, chal);
}

/* Answers getservers / getserversExt with the whole matching list, as the protocol
 * wants, split over datagrams; stops early when a reply budget runs out. */
static void q3_getservers(struct worker *w, const uint8_t *p, size_t n, const struct sockaddr *from,
                          socklen_t fromlen, const char *ip)
{
    sd_q3_query_t q;
    const char *why = sd_q3_parse_getservers(p, n, &q);
    if (why) {
        sd_master_count_drop("q3", why);
        return;
    }
    sd_master_filter_t f;
    memset(&f, 0, sizeof f);
    sd_q3_query_filter(&q, &f);
    sd_master_cfilter_t cf;
    sd_master_snap_t *snap = sd_master_snap_get();
    if (!snap || sd_master_filter_compile(&f, &cf)) {
        sd_master_snap_put(snap);
        sd_master_count_drop("q3", "bad_filter");
        return;
    }
    int64_t now = sd_wall_ms();
    sd_q3_writer_t wr;
    sd_q3_resp_begin(&wr, q.ext);
    int ok = 1;
    for (size_t i = 0; i < snap->n && ok; i++) {
        const sd_msrv_t *s = snap->v[i];
        if (i + 16 < snap->n)
            __builtin_prefetch(snap->v[i + 16]);
        if (s->exp <= now || !sd_master_match(&cf, s))
            continue;
        if (sd_q3_resp_add(&wr, s->fam, s->ip, s->port) == 0)
            continue;
        sd_q3_resp_cut(&wr);
        if (queue_reply(w, from, fromlen, ip, "q3", wr.buf, wr.len)) {
            ok = 0;
            break;
        }
        sd_q3_resp_begin(&wr, q.ext);
        sd_q3_resp_add(&wr, s->fam, s->ip, s->port);
    }
    sd_master_snap_put(snap);
    if (ok) {
        sd_q3_resp_end(&wr);
        queue_reply(w, from, fromlen, ip, "q3", wr.buf, wr.len);
    }
    flush(w);
    SD_COUNT("serverdir_master_udp_queries_total{proto=\"q3\"}", "UDP master list queries answered", 1);
}

/* ---------- Valve ---------- */

/* One batch (at most SD_VALVE_BATCH servers) after the seed; the terminator when the
 * walk reached the end of the list. */
static void valve_query(struct worker *w, const uint8_t *p, size_t n, const struct sockaddr *from,
                        socklen_t fromlen, const char *ip)
{
    sd_valve_query_t q;
    const char *why = sd_valve_parse_query(p, n, &q);
    if (why) {
        sd_master_count_drop("valve", why);
        return;
    }
    if (q.seed_garbage)
        SD_COUNT("serverdir_master_udp_tolerated_total{what=\"seed_garbage\"}",
                 "Valve queries answered although bytes after the seed address were ignored", 1);
    sd_master_cfilter_t cf;
    sd_master_snap_t *snap = sd_master_snap_get();
    if (!snap || sd_master_filter_compile(&q.filter, &cf)) {
        sd_master_snap_put(snap);
        sd_master_count_drop("valve", "bad_filter");
        return;
    }
    uint8_t ips[SD_VALVE_BATCH][4];
    uint16_t ports[SD_VALVE_BATCH];
    int count = 0;
    int64_t now = sd_wall_ms();
    size_t i = strcmp(q.seed, "0.0.0.0:0") == 0 ? 0 : sd_master_snap_after(snap, q.seed);
    for (; i < snap->n && count < SD_VALVE_BATCH; i++) {
        const sd_msrv_t *s = snap->v[i];
        if (s->fam != 4 || s->exp <= now || !sd_master_match(&cf, s))
            continue;
        memcpy(ips[count], s->ip, 4);
        ports[count++] = s->port;
    }
    /* The end when no matching server follows. */
    int last = 1;
    for (size_t j = i; j < snap->n; j++) {
        const sd_msrv_t *s = snap->v[j];
        if (s->fam == 4 && s->exp > now && sd_master_match(&cf, s)) {
            last = 0;
            break;
        }
    }
    sd_master_snap_put(snap);
    uint8_t out[SD_VALVE_DGRAM_MAX];
    size_t len = sd_valve_encode_reply((const uint8_t(*)[4])ips, ports, count, last, out);
    send_one(w, from, fromlen, ip, "valve", out, len);
    SD_COUNT("serverdir_master_udp_queries_total{proto=\"valve\"}", "UDP master list queries answered", 1);
}

static void gs_challenge(struct worker *w, const struct sockaddr *from, socklen_t fromlen,
                         const char *key, const char *ip)
{
    uint32_t c;
    if (sd_master_chal_make_u32(key, &c)) {
        sd_master_count_drop("goldsrc", "no_key");
        return;
    }
    uint8_t out[16];
    size_t len = sd_gs_encode_challenge(c, out);
    send_one(w, from, fromlen, ip, "goldsrc", out, len);
}

static void gs_info(const uint8_t *p, size_t n, const char *key, const char *ip, int family,
                    int port)
{
    sd_master_server_t s;
    uint32_t c = 0;
    const char *why = sd_gs_parse_info(p, n, &s, &c);
    if (!why)
        why = sd_master_chal_check_u32(key, c);
    if (why) {
        sd_master_count_drop("goldsrc", why);
        return;
    }
    char chal[SD_MASTER_CHAL_MAX];
    snprintf(chal, sizeof chal, "%u", c);
    accept_server("goldsrc", key, ip, family, port, &s, chal);
}

/* b\n carries no challenge: anyone can send it from any address, so it removes only an
 * entry GoldSrc listed (master_terminate.lua checks again, atomically), never one REST
 * or DarkPlaces listed. */
static void gs_quit(const char *key)
{
    if (!sd_master_index_lookup(key, NULL, NULL)) {
        sd_master_count_drop("goldsrc", "not_listed");
        return;
    }
    if (!sd_master_index_listed_by(key, "goldsrc")) {
        sd_master_count_drop("goldsrc", "other_protocol");
        return;
    }
    sd_master_write_terminate("goldsrc", key);
}

/* ---------- the worker threads ---------- */

/* Hands a getservers to the listener's query threads; dropped ("overload") when they are
 * QJOBS_MAX behind. A small list is answered at once (tens of microseconds: the hand-off
 * would cost more than the answer, and no heartbeat waits noticeably behind it). */
#define QUERY_INLINE_MAX 4096

static void query_later(struct worker *w, const uint8_t *p, size_t n, const struct sockaddr *from,
                        socklen_t fromlen, const char *ip)
{
    struct listener *l = w->l;
    if (!l || l->nquery == 0 || sd_master_index_count() <= QUERY_INLINE_MAX) {
        q3_getservers(w, p, n, from, fromlen, ip);
        return;
    }
    struct qjob *j = malloc(sizeof *j);
    if (!j) {
        sd_master_count_drop("q3", "overload");
        return;
    }
    memcpy(j->p, p, n);
    j->n = n;
    memcpy(&j->from, from, fromlen);
    j->fromlen = fromlen;
    sd_strlcpy(j->ip, ip, sizeof j->ip);
    pthread_mutex_lock(&l->mu);
    if (l->jlen == QJOBS_MAX) {
        pthread_mutex_unlock(&l->mu);
        free(j);
        sd_master_count_drop("q3", "overload");
        return;
    }
    l->jobs[(l->jhead + l->jlen++) % QJOBS_MAX] = j;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void *query_main(void *arg)
{
    struct worker *w = arg;
    struct listener *l = w->l;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        while (l->jlen == 0 && !l->stopping)
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->jlen == 0) {
            pthread_mutex_unlock(&l->mu);
            break;
        }
        struct qjob *j = l->jobs[l->jhead];
        l->jhead = (l->jhead + 1) % QJOBS_MAX;
        l->jlen--;
        pthread_mutex_unlock(&l->mu);
        q3_getservers(w, j->p, j->n, (struct sockaddr *)&j->from, j->fromlen, j->ip);
        free(j);
    }
    return NULL;
}

static void handle(struct worker *w, const uint8_t *p, size_t n, const struct sockaddr *from,
                   socklen_t fromlen)
{
    char key[SD_MASTER_ADDR_MAX], ip[48];
    int port, family;
    if (sd_master_addr_from_sockaddr(from, key, sizeof key, ip, sizeof ip, &port)) {
        sd_master_count_drop("udp", "bad_source");
        return;
    }
    family = strchr(key, '[') ? 6 : 4;
    if (port == 0) {
        sd_master_count_drop("udp", "bad_source");
        return;
    }
    if (sd_master_rate_take(SD_RATE_REQ, ip, 1)) {
        sd_master_count_drop("udp", "rate_limited");
        return;
    }
    if (n > SD_Q3_DGRAM_MAX) {
        sd_master_count_drop("udp", "too_long");
        return;
    }
    switch (sd_q3_kind(p, n)) {
    case SD_Q3_HEARTBEAT: q3_heartbeat(w, p, n, from, fromlen, key, ip); return;
    case SD_Q3_INFORESPONSE: q3_inforesponse(p, n, key, ip, family, port); return;
    case SD_Q3_GETSERVERS:
    case SD_Q3_GETSERVERSEXT: query_later(w, p, n, from, fromlen, ip); return;
    case SD_Q3_NONE: break;
    }
    if (n >= 1 && p[0] == 0x31) {
        valve_query(w, p, n, from, fromlen, ip);
        return;
    }
    switch (sd_gs_kind(p, n)) {
    case SD_GS_CHALLENGE_REQ: gs_challenge(w, from, fromlen, key, ip); return;
    case SD_GS_INFO: gs_info(p, n, key, ip, family, port); return;
    case SD_GS_QUIT: gs_quit(key); return;
    case SD_GS_NONE: break;
    }
    sd_master_count_drop("udp", "unknown");
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint8_t (*bufs)[RECV_MAX] = w->in;
    struct sockaddr_storage from[RECV_BATCH];
    struct iovec iov[RECV_BATCH];
    struct mmsghdr msgs[RECV_BATCH];
    struct pollfd pfd[2] = {{.fd = w->fd, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
    for (;;) {
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            log_error("master udp poll failed", "addr=%s err=%s", w->addr, strerror(errno));
            break;
        }
        if (pfd[1].revents)
            break;
        /* Drain what is queued, bounded so stop is noticed under a flood. */
        for (int round = 0; round < 8; round++) {
            for (int i = 0; i < RECV_BATCH; i++) {
                iov[i].iov_base = bufs[i];
                iov[i].iov_len = RECV_MAX;
                memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
                msgs[i].msg_hdr.msg_name = &from[i];
                msgs[i].msg_hdr.msg_namelen = sizeof from[i];
                msgs[i].msg_hdr.msg_iov = &iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            int got = recvmmsg(w->fd, msgs, RECV_BATCH, MSG_DONTWAIT, NULL);
            if (got <= 0)
                break;
            SD_COUNT("serverdir_master_udp_datagrams_total", "UDP master datagrams received", got);
            for (int i = 0; i < got; i++) {
                if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
                    sd_master_count_drop("udp", "too_long");
                    continue;
                }
                handle(w, bufs[i], msgs[i].msg_len, (struct sockaddr *)&from[i],
                       msgs[i].msg_hdr.msg_namelen);
            }
            flush(w); /* the batch's replies in one sendmmsg */
            if (got < RECV_BATCH)
                break;
        }
    }
    return NULL;
}

/* Every worker's socket shares the address (SO_REUSEPORT: the kernel spreads sources
 * over them). Bursts queue in the receive buffer; the kernel caps it at
 * net.core.rmem_max. */
static void prepare_socket(int fd)
{
    int one = 1, rcvbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
}

/* Receiving workers: master.udp_workers, or one per two CPUs (at least one): a worker's
 * datagrams are cheap (the expensive getservers go to the query threads, one per CPU), and
 * on a small machine fewer runnable threads than cores keeps the tail latency down
 * (bench/master_dpmaster.sh on 2 cores: p99 of 8 queries in flight at 10,000 servers
 * 4.2 ms with 2 workers, 3.2 ms with 1). */
static int cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : (int)n;
}

static int workers_wanted(void)
{
    long n = sd_master_cfg.udp_workers;
    if (n <= 0)
        n = cpus() / 2 > 0 ? cpus() / 2 : 1;
    return n > MAX_WORKERS ? MAX_WORKERS : (int)n;
}

int sd_master_udp_start(const char *hostport)
{
    if (nlisteners >= SD_MASTER_MAX_UDP)
        return -ENOSPC;
    if (stop_fd < 0) {
        stop_fd = eventfd(0, EFD_CLOEXEC);
        if (stop_fd < 0)
            return -errno;
    }
    char host[128];
    int port;
    if (sd_parse_hostport(hostport, host, sizeof host, &port))
        return -EINVAL;
    struct listener *l = &listeners[nlisteners];
    memset(l, 0, sizeof *l);
    sd_strlcpy(l->addr, hostport, sizeof l->addr);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int want = workers_wanted();
    for (int i = 0; i < want; i++) {
        int fd = sd_socket_bind(host, port, SOCK_DGRAM, prepare_socket);
        if (fd < 0) {
            if (i == 0)
                return fd;
            break;
        }
        if (i == 0 && port == 0) { /* the others join the port the first one got */
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
                port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                      : ((struct sockaddr_in *)&ss)->sin_port);
        }
        struct worker *w = calloc(1, sizeof *w);
        if (!w) {
            close(fd);
            break;
        }
        w->fd = fd;
        w->addr = l->addr;
        w->l = l;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc) {
            close(fd);
            free(w);
            if (i == 0)
                return -rc;
            break;
        }
        l->w[l->nworkers++] = w;
    }
    /* one query thread per CPU, sending from worker 0's socket (same address) */
    for (int i = 0; i < cpus(); i++) {
        struct worker *q = calloc(1, sizeof *q);
        if (!q)
            break;
        q->fd = l->w[0]->fd;
        q->addr = l->addr;
        q->l = l;
        if (pthread_create(&q->thread, NULL, query_main, q)) {
            free(q);
            break;
        }
        l->q[l->nquery++] = q;
    }
    nlisteners++;
    log_info("master udp listening", "addr=%s workers=%d query_threads=%d", hostport, l->nworkers,
             l->nquery);
    return 0;
}

void sd_master_udp_stop(void)
{
    if (stop_fd < 0)
        return;
    uint64_t one = 1;
    if (write(stop_fd, &one, sizeof one) < 0)
        log_warn("master udp stop failed", "err=%s", strerror(errno));
    for (int i = 0; i < nlisteners; i++) {
        struct listener *l = &listeners[i];
        /* the workers first (nothing is queued after), then the query threads finish what
         * is queued, then the sockets close */
        for (int k = 0; k < l->nworkers; k++)
            pthread_join(l->w[k]->thread, NULL);
        pthread_mutex_lock(&l->mu);
        l->stopping = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        for (int k = 0; k < l->nquery; k++) {
            pthread_join(l->q[k]->thread, NULL);
            free(l->q[k]);
        }
        l->nquery = 0;
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        for (int k = 0; k < l->nworkers; k++) {
            close(l->w[k]->fd);
            free(l->w[k]);
        }
        l->nworkers = 0;
    }
    nlisteners = 0;
    close(stop_fd);
    stop_fd = -1;
}
