/* The UDP master front: one thread per `--master-udp HOST:PORT` listener speaking the
 * DarkPlaces/Quake III master protocol and Valve's master query protocol plus the
 * GoldSrc heartbeat, over the same Redis data as the REST master list (master.c).
 *
 * Each thread polls its socket and an eventfd that stop() signals; Redis is reached
 * through the thread's own store connection. A datagram that fails any check is dropped
 * and counted in serverdir_master_dropped_total{proto,reason}.
 *
 * Amplification: every datagram first takes one request from its source address's
 * rate bucket, and every reply datagram takes its size from the address's reply-byte
 * bucket (master.udp_reply_bytes_per_s, burst twice that). A getservers answer stops
 * when the bucket runs dry, so a spoofed query can never make the master send more
 * than that budget to one address. Unauthenticated requests get at most one small
 * datagram (getinfo, the GoldSrc challenge), never listed data. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "master.h"
#include "master_q3.h"
#include "master_valve.h"
#include "sd.h"

#define RECV_MAX 2048
#define QUERY_BATCH 1000
#define MAX_QUERY_CALLS 1000 /* script calls per getservers answer (bounds the walk) */

struct listener {
    int fd;
    pthread_t thread;
    char addr[128];
};

static struct listener listeners[SD_MASTER_MAX_UDP];
static int nlisteners;
static int stop_fd = -1;

/* ---------- sending ---------- */

/* Sends one reply datagram if the destination's reply-byte budget allows; 0 or -1. */
static int send_reply(int fd, const struct sockaddr *to, socklen_t tolen, const char *ip,
                      const char *proto, const void *p, size_t n)
{
    if (sd_master_rate_take(SD_RATE_UDP_BYTES, ip, (int64_t)n)) {
        sd_master_count_drop(proto, "reply_budget");
        return -1;
    }
    if (sd_master_rate_take(SD_RATE_UDP_TOTAL, "", (int64_t)n)) {
        sd_master_count_drop(proto, "reply_budget_total");
        return -1;
    }
    if (sendto(fd, p, n, 0, to, tolen) < 0) {
        SD_COUNT("serverdir_master_udp_send_errors_total", "UDP master replies that could not be sent", 1);
        return -1;
    }
    SD_COUNT("serverdir_master_udp_replies_total", "UDP master reply datagrams sent", 1);
    return 0;
}

/* ---------- DarkPlaces / Quake III ---------- */

static void q3_heartbeat(int fd, const uint8_t *p, size_t n, const struct sockaddr *from,
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
    int rc = sd_master_challenge(key, ip, chal, sizeof chal, sd_master_cfg.getinfo_timeout_ms,
                                 &refused);
    if (rc) {
        sd_master_count_drop("q3", rc == SD_MASTER_REFUSED ? refused.code : "store");
        return;
    }
    uint8_t out[128];
    size_t len = sd_q3_encode_getinfo(chal, out, sizeof out);
    send_reply(fd, from, fromlen, ip, "q3", out, len);
}

/* Lists a server whose infoResponse / GoldSrc info carried a valid challenge. */
static void accept_server(const char *proto, const char *key, const char *ip, int family,
                          int port, sd_master_server_t *s, const char *chal)
{
    sd_strlcpy(s->addr, key, sizeof s->addr);
    sd_strlcpy(s->ip, ip, sizeof s->ip);
    s->port = port;
    s->family = family;
    int is_new = 0;
    int64_t exp;
    sd_master_refusal_t refused;
    int rc = sd_master_accept(key, chal, s, &is_new, &exp, &refused);
    if (rc) {
        sd_master_count_drop(proto, rc == SD_MASTER_REFUSED ? refused.code : "store");
        return;
    }
    SD_COUNT("serverdir_master_heartbeats_total", "master-list heartbeats accepted", 1);
    if (is_new) {
        SD_COUNT("serverdir_master_servers_new_total", "servers that joined the master list", 1);
        /* One line per server would flood the log at 100,000 servers: debug level. */
        log_debug("master server listed", "addr=%s game=%s source=%s", key, s->game, proto);
    }
}

static void q3_inforesponse(const uint8_t *p, size_t n, const char *key, const char *ip,
                            int family, int port)
{
    sd_master_server_t s;
    char chal[SD_MASTER_CHAL_MAX];
    const char *why = sd_q3_parse_inforesponse(p, n, &s, chal, sizeof chal);
    if (why) {
        sd_master_count_drop("q3", why);
        return;
    }
    accept_server("q3", key, ip, family, port, &s, chal);
}

/* Answers getservers / getserversExt with the whole matching list, as the protocol
 * wants, split over datagrams; stops early when the reply-byte budget runs out. */
static void q3_getservers(int fd, const uint8_t *p, size_t n, const struct sockaddr *from,
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
    sd_q3_writer_t w;
    sd_q3_resp_begin(&w, q.ext);
    char after[SD_MASTER_ADDR_MAX] = "";
    for (int call = 0; call < MAX_QUERY_CALLS; call++) {
        sd_master_batch_t b;
        int rc = sd_master_query(&f, after, QUERY_BATCH, 0, &b);
        if (rc) {
            sd_master_count_drop("q3", "store");
            return;
        }
        for (int i = 0; i < b.n; i++) {
            uint8_t addr[16];
            uint16_t port;
            int fam = sd_master_key_bytes(b.items[i], addr, &port);
            if (fam < 0)
                continue;
            if (sd_q3_resp_add(&w, fam, addr, port) == 0)
                continue;
            sd_q3_resp_cut(&w);
            if (send_reply(fd, from, fromlen, ip, "q3", w.buf, w.len)) {
                sd_master_batch_free(&b);
                return;
            }
            sd_q3_resp_begin(&w, q.ext);
            sd_q3_resp_add(&w, fam, addr, port);
        }
        sd_strlcpy(after, b.next, sizeof after);
        sd_master_batch_free(&b);
        if (!after[0])
            break;
    }
    sd_q3_resp_end(&w);
    send_reply(fd, from, fromlen, ip, "q3", w.buf, w.len);
    SD_COUNT("serverdir_master_udp_queries_total{proto=\"q3\"}", "UDP master list queries answered", 1);
}

/* ---------- Valve ---------- */

/* One batch (at most SD_VALVE_BATCH servers) after the seed; the terminator when the
 * walk reached the end of the list. */
static void valve_query(int fd, const uint8_t *p, size_t n, const struct sockaddr *from,
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
    uint8_t ips[SD_VALVE_BATCH][4];
    uint16_t ports[SD_VALVE_BATCH];
    int count = 0, last = 0;
    char after[SD_MASTER_ADDR_MAX];
    sd_strlcpy(after, q.seed, sizeof after);
    /* A batch may come back short while more remain (the scan budget): ask again. */
    for (int call = 0; call < MAX_QUERY_CALLS && count < SD_VALVE_BATCH; call++) {
        sd_master_batch_t b;
        if (sd_master_query(&q.filter, after, SD_VALVE_BATCH - count, 0, &b)) {
            sd_master_count_drop("valve", "store");
            return;
        }
        for (int i = 0; i < b.n && count < SD_VALVE_BATCH; i++) {
            uint8_t addr[16];
            uint16_t port;
            if (sd_master_key_bytes(b.items[i], addr, &port) != 4)
                continue;
            memcpy(ips[count], addr, 4);
            ports[count++] = port;
        }
        sd_strlcpy(after, b.next, sizeof after);
        sd_master_batch_free(&b);
        if (!after[0]) {
            last = 1;
            break;
        }
    }
    uint8_t out[SD_VALVE_DGRAM_MAX];
    size_t len = sd_valve_encode_reply((const uint8_t(*)[4])ips, ports, count, last, out);
    send_reply(fd, from, fromlen, ip, "valve", out, len);
    SD_COUNT("serverdir_master_udp_queries_total{proto=\"valve\"}", "UDP master list queries answered", 1);
}

static void gs_challenge(int fd, const struct sockaddr *from, socklen_t fromlen,
                         const char *key, const char *ip)
{
    uint32_t c = 0;
    while (c == 0) {
        char hex[9];
        if (sd_random_hex(hex, 4))
            return;
        c = (uint32_t)strtoul(hex, NULL, 16);
    }
    char chal[SD_MASTER_CHAL_MAX];
    snprintf(chal, sizeof chal, "%u", c);
    sd_master_refusal_t refused;
    int rc = sd_master_challenge(key, ip, chal, sizeof chal, 0, &refused);
    if (rc) {
        sd_master_count_drop("goldsrc", rc == SD_MASTER_REFUSED ? refused.code : "store");
        return;
    }
    uint8_t out[16];
    size_t len = sd_gs_encode_challenge(c, out);
    send_reply(fd, from, fromlen, ip, "goldsrc", out, len);
}

static void gs_info(const uint8_t *p, size_t n, const char *key, const char *ip, int family,
                    int port)
{
    sd_master_server_t s;
    uint32_t c = 0;
    const char *why = sd_gs_parse_info(p, n, &s, &c);
    if (why) {
        sd_master_count_drop("goldsrc", why);
        return;
    }
    char chal[SD_MASTER_CHAL_MAX];
    snprintf(chal, sizeof chal, "%u", c);
    accept_server("goldsrc", key, ip, family, port, &s, chal);
}

static void gs_quit(const char *key, const char *ip)
{
    sd_master_refusal_t refused;
    int rc = sd_master_terminate(key, ip, &refused);
    if (rc) {
        sd_master_count_drop("goldsrc", rc == SD_MASTER_REFUSED ? refused.code : "store");
        return;
    }
    SD_COUNT("serverdir_master_servers_terminated_total", "servers removed by termination", 1);
    log_debug("master server removed", "addr=%s reason=%s", key, "goldsrc_quit");
}

/* ---------- the listener thread ---------- */

static void handle(int fd, const uint8_t *p, size_t n, const struct sockaddr *from,
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
    case SD_Q3_HEARTBEAT: q3_heartbeat(fd, p, n, from, fromlen, key, ip); return;
    case SD_Q3_INFORESPONSE: q3_inforesponse(p, n, key, ip, family, port); return;
    case SD_Q3_GETSERVERS:
    case SD_Q3_GETSERVERSEXT: q3_getservers(fd, p, n, from, fromlen, ip); return;
    case SD_Q3_NONE: break;
    }
    if (n >= 1 && p[0] == 0x31) {
        valve_query(fd, p, n, from, fromlen, ip);
        return;
    }
    switch (sd_gs_kind(p, n)) {
    case SD_GS_CHALLENGE_REQ: gs_challenge(fd, from, fromlen, key, ip); return;
    case SD_GS_INFO: gs_info(p, n, key, ip, family, port); return;
    case SD_GS_QUIT: gs_quit(key, ip); return;
    case SD_GS_NONE: break;
    }
    sd_master_count_drop("udp", "unknown");
}

#define SWEEP_EVERY_MS 1000

static void *listener_main(void *arg)
{
    struct listener *l = arg;
    uint8_t buf[RECV_MAX];
    struct pollfd pfd[2] = {{.fd = l->fd, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
    /* The first listener also sweeps, every second, the servers whose getinfo probe went
     * unanswered (and expired ones), so they leave even an idle list. */
    int sweeper = l == &listeners[0];
    int64_t next_sweep = sd_mono_ms() + SWEEP_EVERY_MS;
    for (;;) {
        if (sweeper && sd_mono_ms() >= next_sweep) {
            sd_master_sweep();
            next_sweep = sd_mono_ms() + SWEEP_EVERY_MS;
        }
        if (poll(pfd, 2, sweeper ? SWEEP_EVERY_MS : -1) < 0) {
            if (errno == EINTR)
                continue;
            log_error("master udp poll failed", "addr=%s err=%s", l->addr, strerror(errno));
            break;
        }
        if (pfd[1].revents)
            break;
        /* Drain what is queued, bounded so stop is noticed under a flood. */
        for (int i = 0; i < 256; i++) {
            struct sockaddr_storage from;
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(l->fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC,
                                 (struct sockaddr *)&from, &fl);
            if (n < 0)
                break;
            SD_COUNT("serverdir_master_udp_datagrams_total", "UDP master datagrams received", 1);
            if ((size_t)n > sizeof buf) {
                sd_master_count_drop("udp", "too_long");
                continue;
            }
            handle(l->fd, buf, (size_t)n, (struct sockaddr *)&from, fl);
        }
    }
    sd_store_thread_close();
    return NULL;
}

/* Bursts of heartbeats queue in the receive buffer while Redis answers; the kernel caps
 * its size at net.core.rmem_max. */
static void big_rcvbuf(int fd)
{
    int rcvbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
}

static int open_udp(const char *hostport)
{
    char host[128];
    int port;
    if (sd_parse_hostport(hostport, host, sizeof host, &port))
        return -EINVAL;
    return sd_socket_bind(host, port, SOCK_DGRAM, big_rcvbuf);
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
    int fd = open_udp(hostport);
    if (fd < 0)
        return fd;
    struct listener *l = &listeners[nlisteners];
    l->fd = fd;
    sd_strlcpy(l->addr, hostport, sizeof l->addr);
    int rc = pthread_create(&l->thread, NULL, listener_main, l);
    if (rc) {
        close(fd);
        return -rc;
    }
    nlisteners++;
    log_info("master udp listening", "addr=%s", hostport);
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
        pthread_join(listeners[i].thread, NULL);
        close(listeners[i].fd);
    }
    nlisteners = 0;
    close(stop_fd);
    stop_fd = -1;
}
