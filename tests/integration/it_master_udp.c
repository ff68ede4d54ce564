/* The UDP master front of a real serverdir (--master-udp 127.0.0.1:PORT) against a real
 * redis-server, driven by fake game servers and server browsers written from the
 * protocol specifications:
 *   - DarkPlaces/Q3: heartbeat -> getinfo -> infoResponse lists a server; getservers and
 *     getserversExt answers over 1100 servers split in datagrams of <= 1400 bytes, EOT
 *     only at the end; a wrong or foreign challenge lists nothing;
 *   - GoldSrc heartbeat (q -> s challenge -> 0\n info) lists servers, b\n removes one;
 *     a Valve browser walks the seed chain over 1100 servers to 0.0.0.0:0;
 *   - the same data over REST, both ways;
 *   - malformed datagrams are dropped without an answer and counted in /metrics;
 *   - the reply-byte budget caps what a spoofable getservers can make the master send;
 *   - a spoofed b\n or DarkPlaces heartbeat removes only what that protocol listed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "harness_stack.h"
#include "sdclient.h"

#define N_SERVERS 1100
#define BATCH 32 /* fake servers in flight at once (the master's socket buffer is finite) */

static h_redis_t redis;
static h_serverdir_t sd, tight, whole, qs, spoof;
static struct sockaddr_in master, tight_master, whole_master, qs_master, spoof_master;
static struct sockaddr_in6 master6; /* the same copy's second listener, on ::1 */
static int q3_listed, gs_listed; /* how many fake servers got listed */

/* Starts s with a UDP master listener on 127.0.0.1 (addr) and, when addr6 is given, a
 * second one on [::1]. */
/* The addresses of s's UDP master listeners: 127.0.0.1 into addr and, when addr6 is
 * given, [::1] into addr6. */
static void udp_addrs(const h_serverdir_t *s, struct sockaddr_in *addr, struct sockaddr_in6 *addr6)
{
    if (addr6) {
        memset(addr6, 0, sizeof *addr6);
        addr6->sin6_family = AF_INET6;
        addr6->sin6_port = htons((uint16_t)s->udp6_port);
        addr6->sin6_addr = in6addr_loopback;
    }
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)s->udp_port);
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

/* cmocka group setup: redis-server; serverdir sd with UDP master listeners on 127.0.0.1
 * and [::1]; on 127.0.0.1, each with its own key prefix: tight (a small UDP reply budget
 * per network), whole (a small total budget), qs (for qstat) and spoof (a short
 * getinfo_timeout_ms). */
static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd,
                      &(h_sd_opts_t){.master_udp = 1, .master_udp6 = 1,
                                     .config = "{\"master\": {\"servers_per_address\": 10000,"
                                               " \"challenges_per_address\": 10000,"
                                               " \"rate_per_s\": 1000000,"
                                               " \"udp_reply_bytes_per_s\": 100000000}}"}) ||
        h_sd_start(&tight, &redis,
                   &(h_sd_opts_t){.master_udp = 1,
                                  .config = "{\"key_prefix\": \"sdt:\", \"master\":"
                                            " {\"servers_per_address\": 10000,"
                                            " \"challenges_per_address\": 10000,"
                                            " \"rate_per_s\": 1000000,"
                                            " \"udp_reply_bytes_per_s\": 1400}}"}) ||
        h_sd_start(&whole, &redis,
                   &(h_sd_opts_t){.master_udp = 1,
                                  .config = "{\"key_prefix\": \"sdt:\", \"master\":"
                                            " {\"rate_per_s\": 1000000,"
                                            " \"udp_reply_bytes_per_s\": 100000000,"
                                            " \"udp_reply_bytes_total_per_s\": 1400}}"}) ||
        h_sd_start(&qs, &redis,
                   &(h_sd_opts_t){.master_udp = 1,
                                  .config = "{\"key_prefix\": \"sdq:\", \"master\":"
                                            " {\"servers_per_address\": 10000,"
                                            " \"challenges_per_address\": 10000,"
                                            " \"rate_per_s\": 1000000,"
                                            " \"udp_reply_bytes_per_s\": 100000000}}"}) ||
        h_sd_start(&spoof, &redis,
                   &(h_sd_opts_t){.master_udp = 1,
                                  .config = "{\"key_prefix\": \"sds:\", \"master\":"
                                            " {\"rate_per_s\": 1000000,"
                                            " \"getinfo_timeout_ms\": 300}}"}))
        return -1;
    udp_addrs(&sd, &master, &master6);
    udp_addrs(&tight, &tight_master, NULL);
    udp_addrs(&whole, &whole_master, NULL);
    udp_addrs(&qs, &qs_master, NULL);
    udp_addrs(&spoof, &spoof_master, NULL);
    return 0;
}

/* cmocka group teardown: the extra copies, then sd and redis-server. */
static int teardown(void **state)
{
    h_serverdir_stop(&spoof);
    h_serverdir_stop(&whole);
    h_serverdir_stop(&qs);
    h_serverdir_stop(&tight);
    return h_stack_teardown(state);
}

/* A UDP socket on 127.0.0.1:port (0: any port); -1 when the port is taken. */
/* A UDP socket bound to ip (any address of 127.0.0.0/8 is this host) and port. */
static int udp_socket_at(const char *ip, int port)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int udp_socket(int port) { return udp_socket_at("127.0.0.1", port); }

static void send_to(int fd, const struct sockaddr_in *to, const void *p, size_t n)
{
    assert_int_equal(sendto(fd, p, n, 0, (const struct sockaddr *)to, sizeof *to), (ssize_t)n);
}

#define SEND_LIT(fd, to, lit) send_to(fd, to, lit, sizeof(lit) - 1)

/* One datagram within timeout_ms, or -1. */
static ssize_t recv_within(int fd, uint8_t *buf, size_t cap, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return -1;
    return recv(fd, buf, cap, 0);
}

static int local_port(int fd)
{
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    return ntohs(a.sin_port);
}

/* JSON of GET path on s. */
static json_t *get_json(const h_serverdir_t *s, const char *path)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", s->url, NULL, NULL, &r, "%s", path), 0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    h_resp_free(&r);
    return j;
}

static int count_listed(const char *game)
{
    char filter[80];
    snprintf(filter, sizeof filter, "game=%s&", game);
    long long n = h_master_listed(sd.url, filter);
    assert_true(n >= 0);
    return (int)n;
}

/* ---------- DarkPlaces / Q3 ---------- */

/* Heartbeats from BATCH sockets at once (bound to src, ports from first_port) to the
 * master at m, then answers each getinfo with an infoResponse of game (gamename) and
 * protocol; clients = i % 3 so a third are empty. Returns how many were answered. */
static int q3_register_at(const char *src, const struct sockaddr_in *m, int first_port, int n,
                          const char *game, int protocol)
{
    int done = 0;
    for (int base = 0; base < n; base += BATCH) {
        int fds[BATCH], idx[BATCH], nf = 0;
        for (int i = base; i < n && i < base + BATCH; i++) {
            int fd = udp_socket_at(src, first_port + i);
            if (fd < 0)
                continue;
            fds[nf] = fd;
            idx[nf++] = i;
            SEND_LIT(fd, m, "\xff\xff\xff\xffheartbeat DarkPlaces\n");
        }
        for (int k = 0; k < nf; k++) {
            uint8_t buf[256];
            ssize_t got = recv_within(fds[k], buf, sizeof buf - 1, 3000);
            assert_true(got > 12);
            assert_memory_equal(buf, "\xff\xff\xff\xffgetinfo ", 12);
            buf[got] = '\0';
            char resp[512];
            int len = snprintf(resp, sizeof resp,
                               "\xff\xff\xff\xffinfoResponse\n\\sv_maxclients\\8\\clients\\%d"
                               "\\challenge\\%s\\protocol\\%d\\gamename\\%s\\mapname\\stormkeep"
                               "\\gametype\\%d\\hostname\\fake %d",
                               idx[k] % 3, (char *)buf + 12, protocol, game, idx[k] % 2, idx[k]);
            send_to(fds[k], m, resp, (size_t)len);
            close(fds[k]);
            done++;
        }
    }
    return done;
}

static int q3_register(int first_port, int n)
{
    return q3_register_at("127.0.0.1", &master, first_port, n, "Xonotic", 3);
}

static int xonotic_count_is(void *want) { return count_listed("xonotic") == *(int *)want; }

/* What listed_is waits for: exactly want servers of game listed. */
typedef struct {
    const char *game;
    int want;
} listed_t;

/* h_wait_until condition: see listed_t. */
static int listed_is(void *arg)
{
    const listed_t *l = arg;
    return count_listed(l->game) == l->want;
}

/* h_wait_until condition: sd's /metrics holds every string of arg (NULL-terminated). */
static int metrics_have(void *arg)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/metrics"), 0);
    int all = 1;
    for (const char *const *n = arg; *n && all; n++)
        all = strstr(r.body, *n) != NULL;
    h_resp_free(&r);
    return all;
}

static void q3_heartbeat_dance(void **state)
{
    int fd = udp_socket(0);
    SEND_LIT(fd, &master, "\xff\xff\xff\xffheartbeat DarkPlaces\n");
    uint8_t buf[256];
    ssize_t got = recv_within(fd, buf, sizeof buf - 1, 3000);
    assert_true(got > 12);
    assert_memory_equal(buf, "\xff\xff\xff\xffgetinfo ", 12);
    buf[got] = '\0';
    char chal[64];
    assert_true(got - 12 < (ssize_t)sizeof chal);
    memcpy(chal, buf + 12, (size_t)got - 11);

    /* A wrong challenge, then the right one from another port: neither lists anything. */
    char resp[512];
    int len = snprintf(resp, sizeof resp, "\xff\xff\xff\xffinfoResponse\n\\challenge\\wrong1\\protocol\\3"
                                          "\\sv_maxclients\\8\\clients\\1\\gamename\\DanceGame");
    send_to(fd, &master, resp, (size_t)len);
    int other = udp_socket(0);
    len = snprintf(resp, sizeof resp, "\xff\xff\xff\xffinfoResponse\n\\challenge\\%s\\protocol\\3"
                                      "\\sv_maxclients\\8\\clients\\1\\gamename\\DanceGame", chal);
    send_to(other, &master, resp, (size_t)len);
    /* Both are unknown: a stateless challenge bound to another address does not check
     * out, like a forged one. */
    static const char *const refused[] = {"{proto=\"q3\",reason=\"unknown_challenge\"} 2", NULL};
    assert_true(h_wait_until(metrics_have, (void *)refused, 3000)); /* both were handled */
    assert_int_equal(count_listed("dancegame"), 0);

    /* The right challenge from the right address: listed, as REST shows it. */
    send_to(fd, &master, resp, (size_t)len);
    h_wait_until(listed_is, &(listed_t){"dancegame", 1}, 3000);
    assert_int_equal(count_listed("dancegame"), 1);
    json_t *j = get_json(&sd, "/v1/master/servers?game=dancegame");
    json_t *s = json_array_get(json_object_get(j, "servers"), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", local_port(fd));
    assert_string_equal(json_string_value(json_object_get(s, "address")), addr);
    assert_string_equal(json_string_value(json_object_get(s, "source")), "q3");
    assert_int_equal(json_integer_value(json_object_get(s, "protocol")), 3);
    assert_int_equal(json_integer_value(json_object_get(s, "max_players")), 8);
    json_decref(j);

    /* The challenge is single use: replaying the infoResponse is refused and counted. */
    send_to(fd, &master, resp, (size_t)len);
    close(fd);
    close(other);
    static const char *const dropped[] = {
        "serverdir_master_dropped_total{proto=\"q3\",reason=\"challenge_used\"} 1",
        "reason=\"unknown_challenge\"", NULL};
    assert_true(h_wait_until(metrics_have, (void *)dropped, 3000));
}

/* Reads a getservers(Ext) answer: datagrams until the EOT; checks sizes and that only
 * the last carries the EOT; counts entries into *n. Returns the number of datagrams. */
static int read_getservers(int fd, int ext, int *n, int *ports_seen_twice)
{
    const char *word = ext ? "\xff\xff\xff\xffgetserversExtResponse" : "\xff\xff\xff\xffgetserversResponse";
    size_t wl = strlen(word);
    static unsigned char seen[65536];
    memset(seen, 0, sizeof seen);
    int dgrams = 0;
    *n = 0;
    *ports_seen_twice = 0;
    for (int k = 0; k < 100; k++) {
        uint8_t buf[2048];
        ssize_t got = recv_within(fd, buf, sizeof buf, 3000);
        assert_true(got > 0);
        assert_true(got <= 1400);
        assert_memory_equal(buf, word, wl);
        dgrams++;
        size_t o = wl;
        int eot = 0;
        while (o < (size_t)got) {
            if (buf[o] == '\\' && o + 7 <= (size_t)got && !memcmp(buf + o, "\\EOT\0\0\0", 7)) {
                assert_int_equal(o + 7, (size_t)got); /* EOT ends the datagram */
                eot = 1;
                break;
            }
            if (buf[o] == '\\' && o + 1 == (size_t)got)
                break; /* a datagram that is not the last ends with its last separator */
            assert_true(buf[o] == '\\' || (ext && buf[o] == '/'));
            size_t alen = buf[o] == '\\' ? 4 : 16;
            assert_true(o + 1 + alen + 2 <= (size_t)got);
            if (alen == 4)
                assert_memory_equal(buf + o + 1, "\x7f\x00\x00\x01", 4);
            int port = buf[o + 1 + alen] << 8 | buf[o + 2 + alen];
            if (seen[port]++)
                (*ports_seen_twice)++;
            (*n)++;
            o += 1 + alen + 2;
        }
        if (eot)
            return dgrams;
    }
    fail_msg("no EOT");
    return -1;
}

static void q3_getservers_over_1100(void **state)
{
    q3_listed = q3_register(42000, N_SERVERS);
    assert_true(q3_listed >= 1000);
    assert_true(h_wait_until(xonotic_count_is, &q3_listed, 5000));

    int fd = udp_socket(0);
    int n, dup;
    SEND_LIT(fd, &master, "\xff\xff\xff\xffgetservers Xonotic 3 empty full");
    int dgrams = read_getservers(fd, 0, &n, &dup);
    assert_int_equal(n, q3_listed);
    assert_int_equal(dup, 0);
    assert_true(dgrams >= (q3_listed + 194) / 195);

    SEND_LIT(fd, &master, "\xff\xff\xff\xffgetserversExt Xonotic 3 empty full ipv4 ipv6");
    read_getservers(fd, 1, &n, &dup);
    assert_int_equal(n, q3_listed);
    assert_int_equal(dup, 0);

    /* Without `empty`, the empty third (clients 0) is left out; gametype=1 keeps odd ones. */
    /* Only the ports that could be bound registered: REST says how many are not empty. */
    int nonempty = 0, odd_nonempty = 0;
    json_t *j = get_json(&sd, "/v1/master/servers?game=xonotic&not_empty=1&limit=1000");
    char next[64];
    nonempty = (int)json_array_size(json_object_get(j, "servers"));
    snprintf(next, sizeof next, "%s", json_string_value(json_object_get(j, "next")) ?: "");
    json_decref(j);
    if (next[0]) {
        char p[128];
        snprintf(p, sizeof p, "/v1/master/servers?game=xonotic&not_empty=1&limit=1000&after=%s", next);
        j = get_json(&sd, p);
        nonempty += (int)json_array_size(json_object_get(j, "servers"));
        json_decref(j);
    }
    SEND_LIT(fd, &master, "\xff\xff\xff\xffgetservers Xonotic 3 full");
    read_getservers(fd, 0, &n, &dup);
    assert_int_equal(n, nonempty);
    assert_true(n < q3_listed);

    SEND_LIT(fd, &master, "\xff\xff\xff\xffgetservers Xonotic 3 full empty gametype=1");
    read_getservers(fd, 0, &odd_nonempty, &dup);
    assert_true(odd_nonempty > 0 && odd_nonempty < q3_listed);

    /* Another protocol number or game: just the EOT. */
    SEND_LIT(fd, &master, "\xff\xff\xff\xffgetservers Xonotic 4 empty full");
    assert_int_equal(read_getservers(fd, 0, &n, &dup), 1);
    assert_int_equal(n, 0);
    close(fd);
}

/* An IPv6 server on ::1 does the dance over the [::1] listener: REST shows "[::1]:port";
 * getserversExt lists it behind '/' with its 16-byte address; getservers (IPv4) and an
 * Ext query for ipv4 only leave it out. */
static void q3_ipv6_server_in_getserversext(void **state)
{
    int fd = socket(AF_INET6, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in6 me = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    assert_int_equal(bind(fd, (struct sockaddr *)&me, sizeof me), 0);
    socklen_t ml = sizeof me;
    getsockname(fd, (struct sockaddr *)&me, &ml);
    int port = ntohs(me.sin6_port);
    static const char hb[] = "\xff\xff\xff\xffheartbeat DarkPlaces\n";
    assert_int_equal(sendto(fd, hb, sizeof hb - 1, 0, (struct sockaddr *)&master6, sizeof master6), (ssize_t)(sizeof hb - 1));
    uint8_t buf[2048];
    ssize_t got = recv_within(fd, buf, sizeof buf - 1, 3000);
    assert_true(got > 12);
    buf[got] = '\0';
    char resp[512];
    int len = snprintf(resp, sizeof resp, "\xff\xff\xff\xffinfoResponse\n\\challenge\\%s\\protocol\\5"
                                          "\\sv_maxclients\\4\\clients\\1\\gamename\\SixGame", (char *)buf + 12);
    assert_int_equal(sendto(fd, resp, (size_t)len, 0, (struct sockaddr *)&master6, sizeof master6), len);
    h_wait_until(listed_is, &(listed_t){"sixgame", 1}, 3000);
    json_t *j = get_json(&sd, "/v1/master/servers?game=sixgame");
    char want[64];
    snprintf(want, sizeof want, "[::1]:%d", port);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "servers"), 0), "address")), want);
    json_decref(j);

    static const char ext[] = "\xff\xff\xff\xffgetserversExt SixGame 5";
    assert_int_equal(sendto(fd, ext, sizeof ext - 1, 0, (struct sockaddr *)&master6, sizeof master6), (ssize_t)(sizeof ext - 1));
    got = recv_within(fd, buf, sizeof buf, 3000);
    static const char head[] = "\xff\xff\xff\xffgetserversExtResponse";
    assert_int_equal(got, (ssize_t)(sizeof head - 1 + 19 + 7));
    assert_memory_equal(buf, head, sizeof head - 1);
    const uint8_t *e = buf + sizeof head - 1;
    assert_int_equal(e[0], '/');
    assert_memory_equal(e + 1, &in6addr_loopback, 16);
    assert_int_equal(e[17] << 8 | e[18], port);
    assert_memory_equal(e + 19, "\\EOT\0\0\0", 7);

    static const char v4only[] = "\xff\xff\xff\xffgetserversExt SixGame 5 ipv4";
    sendto(fd, v4only, sizeof v4only - 1, 0, (struct sockaddr *)&master6, sizeof master6);
    got = recv_within(fd, buf, sizeof buf, 3000);
    assert_int_equal(got, (ssize_t)(sizeof head - 1 + 7));
    close(fd);
    int n, dup;
    int fd4 = udp_socket(0);
    SEND_LIT(fd4, &master, "\xff\xff\xff\xffgetservers SixGame 5");
    read_getservers(fd4, 0, &n, &dup);
    assert_int_equal(n, 0);
    close(fd4);
}

/* ---------- GoldSrc heartbeat and the Valve query ---------- */

static int gs_register(int first_port, int n, const char *gamedir)
{
    int done = 0;
    for (int base = 0; base < n; base += BATCH) {
        int fds[BATCH], idx[BATCH], nf = 0;
        for (int i = base; i < n && i < base + BATCH; i++) {
            int fd = udp_socket(first_port + i);
            if (fd < 0)
                continue;
            fds[nf] = fd;
            idx[nf++] = i;
            SEND_LIT(fd, &master, "q");
        }
        for (int k = 0; k < nf; k++) {
            uint8_t buf[64];
            ssize_t got = recv_within(fds[k], buf, sizeof buf, 3000);
            assert_int_equal(got, 10);
            assert_memory_equal(buf, "\xff\xff\xff\xff\x73\x0a", 6);
            uint32_t c = (uint32_t)buf[6] | (uint32_t)buf[7] << 8 | (uint32_t)buf[8] << 16 |
                         (uint32_t)buf[9] << 24;
            char info[512];
            int len = snprintf(info, sizeof info,
                               "0\n\\protocol\\48\\challenge\\%u\\players\\%d\\max\\16\\bots\\0"
                               "\\gamedir\\%s\\map\\de_dust2\\password\\0\\os\\l\\lan\\0\\region\\3"
                               "\\type\\d\\secure\\%d\\version\\1.1.2.7\\product\\%s\n",
                               c, idx[k] % 4, gamedir, idx[k] % 2, gamedir);
            send_to(fds[k], &master, info, (size_t)len);
            close(fds[k]);
            done++;
        }
    }
    return done;
}

static int valve_count_is(void *want) { return count_listed("valvetest") == *(int *)want; }

/* Walks the Valve seed chain with filter; returns the servers seen (each once). */
static int valve_walk(const char *filter, size_t flen, int *batches)
{
    static unsigned char seen[65536];
    memset(seen, 0, sizeof seen);
    int fd = udp_socket(0);
    char seed[32] = "0.0.0.0:0";
    int total = 0;
    *batches = 0;
    for (int k = 0; k < 100; k++) {
        uint8_t q[256];
        size_t sl = strlen(seed) + 1;
        q[0] = 0x31;
        q[1] = 0xff;
        memcpy(q + 2, seed, sl);
        memcpy(q + 2 + sl, filter, flen);
        send_to(fd, &master, q, 2 + sl + flen);
        uint8_t buf[2048];
        ssize_t got = recv_within(fd, buf, sizeof buf, 3000);
        assert_true(got >= 6 && got <= 1400);
        assert_int_equal((got - 6) % 6, 0);
        assert_memory_equal(buf, "\xff\xff\xff\xff\x66\x0a", 6);
        (*batches)++;
        int end = 0;
        for (ssize_t o = 6; o < got; o += 6) {
            if (!memcmp(buf + o, "\0\0\0\0\0\0", 6)) {
                assert_int_equal(o + 6, got); /* the terminator is last */
                end = 1;
                break;
            }
            assert_memory_equal(buf + o, "\x7f\x00\x00\x01", 4);
            int port = buf[o + 4] << 8 | buf[o + 5];
            assert_int_equal(seen[port], 0);
            seen[port] = 1;
            total++;
            snprintf(seed, sizeof seed, "127.0.0.1:%d", port);
        }
        if (end) {
            close(fd);
            return total;
        }
    }
    fail_msg("the walk did not end");
    return -1;
}

static void goldsrc_heartbeat_and_valve_walk(void **state)
{
    gs_listed = gs_register(47000, N_SERVERS, "valvetest");
    assert_true(gs_listed >= 1000);
    assert_true(h_wait_until(valve_count_is, &gs_listed, 5000));

    /* The REST view of a GoldSrc server. */
    json_t *j = get_json(&sd, "/v1/master/servers?game=valvetest&limit=1");
    json_t *s = json_array_get(json_object_get(j, "servers"), 0);
    assert_string_equal(json_string_value(json_object_get(s, "source")), "goldsrc");
    assert_string_equal(json_string_value(json_object_get(s, "region")), "europe");
    assert_string_equal(json_string_value(json_object_get(s, "os")), "l");
    json_decref(j);

    /* A server listed over REST shows up in the Valve walk too. */
    sdc_t *c = sdc_new(sd.url, NULL, h_ms(5000));
    sdc_master_server_t srv = {.port = 65000, .game = "valvetest", .map = "de_dust2", .players = 1,
                               .max_players = 16, .region = "europe", .protocol = -1, .gametype = -1};
    sdc_err_t err = {0};
    assert_int_equal(sdc_master_announce(c, &srv, NULL, &err), SDC_OK);
    sdc_free(c);

    static const char filter[] = "\\gamedir\\valvetest\0";
    int batches;
    int total = valve_walk(filter, sizeof filter - 1, &batches);
    assert_int_equal(total, gs_listed + 1);
    assert_true(batches >= (total + 230) / 231);

    /* Filters: secure servers only (odd ones; the REST one is not secure), and a nor. */
    static const char secure[] = "\\gamedir\\valvetest\\secure\\1\0";
    int nsecure = valve_walk(secure, sizeof secure - 1, &batches);
    assert_true(nsecure > 0 && nsecure < gs_listed);
    static const char nor[] = "\\gamedir\\valvetest\\nor\\1\\secure\\1\0";
    int nnor = valve_walk(nor, sizeof nor - 1, &batches);
    assert_int_equal(nnor + nsecure, total);
    /* HLDS spellings: \type\d (every one is dedicated: the GoldSrc servers said type d,
     * a REST announce is dedicated unless it says otherwise), \type\l (none is a listen
     * server), \type\p (no proxies), and keys this master ignores. */
    static const char typed[] = "\\gamedir\\valvetest\\type\\d\0";
    assert_int_equal(valve_walk(typed, sizeof typed - 1, &batches), total);
    static const char typel[] = "\\gamedir\\valvetest\\type\\l\0";
    assert_int_equal(valve_walk(typel, sizeof typel - 1, &batches), 0);
    static const char typep[] = "\\gamedir\\valvetest\\type\\p\0";
    assert_int_equal(valve_walk(typep, sizeof typep - 1, &batches), 0);
    static const char ignored[] = "\\gamedir\\valvetest\\name_match\\x*\\gamedata\\a\0";
    assert_int_equal(valve_walk(ignored, sizeof ignored - 1, &batches), total);
    static const char other[] = "\\gamedir\\nosuchgame\0";
    assert_int_equal(valve_walk(other, sizeof other - 1, &batches), 0);
    assert_int_equal(batches, 1);

    /* b\n from a listed server's address removes it. */
    int fd = udp_socket(47000);
    if (fd >= 0) {
        int before = count_listed("valvetest");
        SEND_LIT(fd, &master, "b\n");
        h_wait_until(listed_is, &(listed_t){"valvetest", before - 1}, 3000);
        assert_int_equal(count_listed("valvetest"), before - 1);
        close(fd);
    }
}

/* qstat 2.17 writes each Valve paging seed over the previous one, so a seed shorter than
 * the one before keeps a stray last digit: the captured "127.0.2.3:279010" (seed
 * 127.0.2.3:27901) is answered, and "127.0.0.1:470000" pages on after 127.0.0.1:47000,
 * where REST's cursor does. */
static void valve_seed_with_leftover_digit_answered(void **state)
{
    int fd = udp_socket(0);
    uint8_t buf[2048];
    static const char captured[] = "1\xff" "127.0.2.3:279010";
    send_to(fd, &master, captured, sizeof captured); /* with its NUL */
    ssize_t got = recv_within(fd, buf, sizeof buf, 3000);
    assert_true(got >= 12);
    assert_memory_equal(buf, "\xff\xff\xff\xff\x66\x0a", 6);

    static const char leftover[] = "1\xff" "127.0.0.1:470000";
    send_to(fd, &master, leftover, sizeof leftover);
    got = recv_within(fd, buf, sizeof buf, 3000);
    assert_true(got >= 12);
    assert_memory_equal(buf, "\xff\xff\xff\xff\x66\x0a", 6);
    char first[64];
    snprintf(first, sizeof first, "%d.%d.%d.%d:%d\n", buf[6], buf[7], buf[8], buf[9],
             buf[10] << 8 | buf[11]);
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r,
                                 "/v1/master/servers?after=127.0.0.1:47000&limit=1&format=text"), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, first);
    h_resp_free(&r);
    close(fd);
}

/* ---------- spoofed shutdowns ---------- */

/* Lists the server at fd's address on the master at m over GoldSrc (q, challenge, info). */
static void gs_list_one(int fd, const struct sockaddr_in *m, const char *gamedir)
{
    SEND_LIT(fd, m, "q");
    uint8_t buf[64];
    assert_int_equal(recv_within(fd, buf, sizeof buf, 3000), 10);
    uint32_t c = (uint32_t)buf[6] | (uint32_t)buf[7] << 8 | (uint32_t)buf[8] << 16 |
                 (uint32_t)buf[9] << 24;
    char info[512];
    int len = snprintf(info, sizeof info,
                       "0\n\\protocol\\48\\challenge\\%u\\players\\1\\max\\16\\bots\\0"
                       "\\gamedir\\%s\\map\\de_dust2\\password\\0\\os\\l\\lan\\0\\region\\3"
                       "\\type\\d\\secure\\0\\version\\1.1.2.7\n", c, gamedir);
    send_to(fd, m, info, (size_t)len);
}

/* Sends a DarkPlaces heartbeat from fd to m and returns the getinfo's challenge (a
 * static buffer). */
static const char *q3_heartbeat_from(int fd, const struct sockaddr_in *m)
{
    static char chal[64];
    SEND_LIT(fd, m, "\xff\xff\xff\xffheartbeat DarkPlaces\n");
    uint8_t buf[256];
    ssize_t got = recv_within(fd, buf, sizeof buf - 1, 3000);
    assert_true(got > 12 && got - 12 < (ssize_t)sizeof chal);
    assert_memory_equal(buf, "\xff\xff\xff\xffgetinfo ", 12);
    memcpy(chal, buf + 12, (size_t)got - 12);
    chal[got - 12] = '\0';
    return chal;
}

/* Lists the server at fd's address on the master at m over DarkPlaces. */
static void q3_list_one(int fd, const struct sockaddr_in *m, const char *game)
{
    const char *chal = q3_heartbeat_from(fd, m);
    char resp[512];
    int len = snprintf(resp, sizeof resp,
                       "\xff\xff\xff\xffinfoResponse\n\\challenge\\%s\\protocol\\3"
                       "\\sv_maxclients\\8\\clients\\1\\gamename\\%s", chal, game);
    send_to(fd, m, resp, (size_t)len);
}

/* Whether the spoof copy lists 127.0.0.1:<port of fd> (its own index, GET by address). */
static int spoof_lists(int fd)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", spoof.url, NULL, NULL, &r, "/v1/master/servers/127.0.0.1:%d",
                                 local_port(fd)), 0);
    long st = r.status;
    h_resp_free(&r);
    assert_true(st == 200 || st == 404);
    return st == 200;
}

static int spoof_lists_cond(void *fd) { return spoof_lists(*(int *)fd); }
static int spoof_gone_cond(void *fd) { return !spoof_lists(*(int *)fd); }

/* h_wait_until condition: the spoof copy counted at least want GoldSrc shutdowns it
 * ignored because another protocol listed the address. */
static int spoof_ignored_quits(void *want)
{
    return h_metric(spoof.url, "serverdir_master_dropped_total{proto=\"goldsrc\",reason=\"other_protocol\"}") >=
           *(int *)want;
}

/* h_wait_until condition: the spoof copy's probe list no longer holds address arg. */
static int probe_gone(void *addr)
{
    redisReply *r = h_redis(&redis, "ZSCORE %s %s", h_master_key("sds:", "probe"), (const char *)addr);
    int gone = r && r->type == REDIS_REPLY_NIL;
    freeReplyObject(r);
    return gone;
}

/* Anyone can send a datagram from any address, so what the UDP protocols let go without a
 * challenge (GoldSrc's b\n, an unanswered getinfo) removes only what that protocol
 * listed: a server listed over REST survives a spoofed b\n and a spoofed DarkPlaces
 * heartbeat left unanswered, a DarkPlaces one survives a b\n, a GoldSrc one an unanswered
 * getinfo; a GoldSrc server still leaves on b\n and a DarkPlaces one when its getinfo
 * goes unanswered (the spoof copy's getinfo_timeout_ms is 300), a late probe of a REST
 * server is dropped by the sweep, and a record naming no source goes on b\n as before. The test's sockets are
 * the servers' addresses, as a spoofer would forge them. */
static void spoofed_shutdowns_remove_only_their_protocols_servers(void **state)
{
    int rest = udp_socket(0), gs = udp_socket(0), gs2 = udp_socket(0), dp = udp_socket(0);
    sdc_t *c = sdc_new(spoof.url, NULL, h_ms(5000));
    sdc_master_server_t srv = {.port = local_port(rest), .game = "spooftest", .map = "m",
                               .players = 1, .max_players = 8, .protocol = 3, .gametype = -1};
    sdc_err_t err = {0};
    assert_int_equal(sdc_master_announce(c, &srv, NULL, &err), SDC_OK);
    sdc_free(c);
    gs_list_one(gs, &spoof_master, "spooftest");
    gs_list_one(gs2, &spoof_master, "spooftest");
    q3_list_one(dp, &spoof_master, "spooftest");
    int fds[] = {rest, gs, gs2, dp};
    for (int i = 0; i < 4; i++)
        assert_true(h_wait_until(spoof_lists_cond, &fds[i], 3000));

    /* b\n from the REST and the DarkPlaces server's addresses: ignored, and counted. */
    SEND_LIT(rest, &spoof_master, "b\n");
    SEND_LIT(dp, &spoof_master, "b\n");
    int two = 2;
    int counted = h_wait_until(spoof_ignored_quits, &two, 3000);
    assert_true(spoof_lists(rest));
    assert_true(spoof_lists(dp));
    assert_true(counted);
    /* b\n from the GoldSrc server's address: it leaves. */
    SEND_LIT(gs, &spoof_master, "b\n");
    assert_true(h_wait_until(spoof_gone_cond, &gs, 3000));

    /* A DarkPlaces heartbeat from the REST and the other GoldSrc server's addresses, then
     * from the DarkPlaces server's (its deadline is the last), none answered: only the
     * DarkPlaces server leaves. */
    q3_heartbeat_from(rest, &spoof_master);
    q3_heartbeat_from(gs2, &spoof_master);
    q3_heartbeat_from(dp, &spoof_master);
    assert_true(h_wait_until(spoof_gone_cond, &dp, 5000));
    assert_true(spoof_lists(rest));
    assert_true(spoof_lists(gs2));

    /* A probe of the REST server past its deadline (as a copy that probed it, or a
     * heartbeat racing its REST renewal, could leave): the sweep drops the probe and
     * keeps the server. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", local_port(rest));
    const char *probe = h_master_key("sds:", "probe");
    redisReply *r = h_redis(&redis, "ZADD %s 1 %s", probe, addr);
    freeReplyObject(r);
    assert_true(h_wait_until(probe_gone, (void *)addr, 5000));
    assert_true(spoof_lists(rest));

    /* A record that names no source (none is written so; a hand-made one, written here
     * as the scripts would) is removed by b\n as before sources were checked. */
    int old = udp_socket(0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    char rec[256];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", local_port(old));
    int len = snprintf(rec, sizeof rec,
                       "c\x1f" "127.0.0.1\x1f\x1f%lld\x1f%lld\x1f\x1f" "spooftest\x1fm\x1fn\x1fv\x1f\x1f"
                       "\x1f" "1\x1f" "8\x1f" "0\x1f" "0\x1f" "1\x1f" "0\x1f\x1f" "3\x1f-1",
                       now + 600000, now);
    r = h_redis(&redis, "HSET %s %s %b", h_master_key("sds:", "s"), addr, rec, (size_t)len);
    freeReplyObject(r);
    r = h_redis(&redis, "HINCRBY %s 127.0.0.1 1", h_master_key("sds:", "n"));
    freeReplyObject(r);
    r = h_redis(&redis, "XADD %s * a %s", h_master_key("sds:", "log"), addr);
    freeReplyObject(r);
    assert_true(h_wait_until(spoof_lists_cond, &old, 3000));
    SEND_LIT(old, &spoof_master, "b\n");
    assert_true(h_wait_until(spoof_gone_cond, &old, 3000));
    close(old);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
}

/* ---------- malformed datagrams and the reply budget ---------- */

static void malformed_dropped_and_counted(void **state)
{
#define S(lit) lit, sizeof(lit) - 1
    static const struct {
        const char *bytes;
        size_t len;
        const char *series;
    } cases[] = {
        {S("\xff\xff\xff\xffgetservers"), "{proto=\"q3\",reason=\"no_protocol\"}"},
        {S("\xff\xff\xff\xffgetservers Xonotic x"), "{proto=\"q3\",reason=\"bad_protocol\"}"},
        {S("\xff\xff\xff\xffheartbeat a b\n"), "{proto=\"q3\",reason=\"bad_heartbeat\"}"},
        {S("\xff\xff\xff\xffinfoResponse\n\\protocol\\3"), "{proto=\"q3\",reason=\"no_challenge\"}"},
        {S("\x31\xff" "x0.0.0.0:0"), "{proto=\"valve\",reason=\"bad_seed\"}"},
        {S("\x31\xff" "0.0.0.0:0\0\\gamedir"), "{proto=\"valve\",reason=\"bad_filter\"}"},
        {S("0\n\\players\\1"), "{proto=\"goldsrc\",reason=\"no_challenge\"}"},
        {S("hello"), "{proto=\"udp\",reason=\"unknown\"}"},
    };
    int fd = udp_socket(0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        send_to(fd, &master, cases[i].bytes, cases[i].len);
    static uint8_t big[1500];
    memcpy(big, "\xff\xff\xff\xffgetservers 68 ", 18);
    memset(big + 18, 'a', sizeof big - 18);
    send_to(fd, &master, big, sizeof big);
    /* No answer to any of them. */
    uint8_t buf[2048];
    assert_int_equal(recv_within(fd, buf, sizeof buf, 300), -1);
    close(fd);

    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/metrics"), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char want[160];
        snprintf(want, sizeof want, "serverdir_master_dropped_total%s", cases[i].series);
        if (!strstr(r.body, want))
            fail_msg("missing %s", want);
    }
    assert_non_null(strstr(r.body, "serverdir_master_dropped_total{proto=\"udp\",reason=\"too_long\"} 1"));
    h_resp_free(&r);
    assert_false(h_exited(sd.pid, NULL));
}

/* The tight copy allows 1400 reply bytes a second (burst 2800) per address: a getservers
 * over 1000+ servers gets at most that much back, without the EOT, and it is counted. */
/* The bytes of the answer to one getservers sent from ip to the master at m; *eot set
 * when the answer ended with the EOT mark. */
static size_t reply_bytes(const char *ip, const struct sockaddr_in *m, int *eot)
{
    int fd = udp_socket_at(ip, 0);
    assert_true(fd >= 0);
    SEND_LIT(fd, m, "\xff\xff\xff\xffgetservers Xonotic 3 empty full");
    size_t bytes = 0;
    uint8_t buf[2048];
    ssize_t got;
    *eot = 0;
    while ((got = recv_within(fd, buf, sizeof buf, 500)) > 0) {
        bytes += (size_t)got;
        if (got >= 7 && !memcmp(buf + got - 7, "\\EOT\0\0\0", 7))
            *eot = 1;
    }
    close(fd);
    return bytes;
}

static void reply_budget_caps_amplification(void **state)
{
    /* Its own key prefix; listed over REST, since the getinfo replies of UDP heartbeats
     * would draw on the same small budget. */
    sdc_t *c = sdc_new(tight.url, NULL, h_ms(5000));
    for (int i = 0; i < 600; i++) {
        sdc_master_server_t s = {.port = 52000 + i, .game = "Xonotic", .players = 1,
                                 .max_players = 8, .protocol = 3, .gametype = -1};
        sdc_err_t err = {0};
        assert_int_equal(sdc_master_announce(c, &s, NULL, &err), SDC_OK);
    }
    sdc_free(c);

    int eot = 0;
    size_t got_bytes = reply_bytes("127.0.0.1", &tight_master, &eot);
    assert_true(got_bytes > 0);
    assert_true(got_bytes <= 2 * 1400 + 1400);
    assert_false(eot);
    /* Another address of the same /24 draws on the same budget: nothing more. */
    assert_int_equal(reply_bytes("127.0.0.9", &tight_master, &eot), 0);
    h_resp_t r;
    assert_int_equal(h_http_json("GET", tight.url, NULL, NULL, &r, "/metrics"), 0);
    assert_non_null(strstr(r.body, "serverdir_master_dropped_total{proto=\"q3\",reason=\"reply_budget\"}"));
    h_resp_free(&r);

    /* The budget of all destinations together (1400 bytes/s, burst 2x, on a copy over the
     * same list): one /24 drains it, a query from another /24 gets nothing either. */
    got_bytes = reply_bytes("127.0.0.1", &whole_master, &eot);
    assert_true(got_bytes > 0 && got_bytes <= 3 * 1400);
    assert_int_equal(reply_bytes("127.0.1.1", &whole_master, &eot), 0);
    assert_int_equal(h_http_json("GET", whole.url, NULL, NULL, &r, "/metrics"), 0);
    assert_non_null(strstr(r.body, "serverdir_master_dropped_total{proto=\"q3\",reason=\"reply_budget_total\"}"));
    h_resp_free(&r);
}

/* ---------- real clients: qstat (Debian's quakestat 2.17) ---------- */

/* Runs quakestat -<type> against the qs master and returns the count on its master line
 * ("Q3M 127.0.0.1:port   600 servers ..."). qstat then probes every listed server: they
 * are fakes on 127.77.0.1, an address no other test uses, and gone, so it is told not to
 * wait for them. */
static int qstat_count(const char *type)
{
    char addr[64], log[400], line[512], want[80];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(qs_master.sin_port));
    snprintf(log, sizeof log, "%s/qstat-%s.out", h_tmpdir(), type + 1);
    const char *argv[] = {"quakestat", type, addr, "-retry", "1", "-interval", "0.1",
                          "-maxsim", "1000", "-sendinterval", "0", "-timeout", "20", NULL};
    pid_t pid = h_spawn(argv, log, NULL);
    assert_true(pid > 0);
    int st = h_wait_exit(pid, 30000);
    assert_true(WIFEXITED(st));
    snprintf(want, sizeof want, "%s %s ", type[1] == 'q' ? "Q3M" : "STM", addr);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, want, strlen(want)))
            n = atoi(line + strlen(want));
    fclose(f);
    if (n < 0)
        fail_msg("no master line for %s in %s", addr, log);
    return n;
}

/* How many servers the qs master lists (its own key prefix: only this test's). */
static int qs_listed(void)
{
    json_t *j = get_json(&qs, "/v1/master/servers?limit=1000");
    int n = (int)json_array_size(json_object_get(j, "servers"));
    json_decref(j);
    return n;
}

static int qs_listed_is(void *want) { return qs_listed() == *(int *)want; }

/* qstat lists every server through both master types: with -q3m it reads a reply of 600
 * Quake III servers in 4 datagrams (no entry lost at a datagram boundary), and with -stm
 * it pages the Valve protocol with its follow-up seeds ("<seed>r", no filter) to the end. */
static void qstat_lists_every_server(void **state)
{
    int listed = q3_register_at("127.77.0.1", &qs_master, 52000, 600, "Quake3Arena", 68);
    assert_true(listed >= 590);
    assert_true(h_wait_until(qs_listed_is, &listed, 5000));
    assert_int_equal(qstat_count("-q3m"), listed);
    assert_int_equal(qstat_count("-stm"), listed);
}

/* Challenges cost no Redis state: 2,000 heartbeats from 2,000 source
 * addresses (spoofed ones would look the same to the master) each get their getinfo, and
 * Redis is exactly as it was (a master storing two keys per challenge for 65 s would
 * hold 60,000 keys and 12 MB for 30,000 spoofed heartbeats). */
static void challenge_flood_costs_no_redis_state(void **state)
{
    /* no key anywhere: a challenge could write any (the master's values may change by
     * themselves: an earlier test's servers expire) */
    h_keys_t before, after;
    h_keys_take(&redis, &before, "*", NULL);
    int answered = 0;
    for (int wave = 0; wave < 4; wave++) {
        int fds[500];
        for (int i = 0; i < 500; i++) {
            int k = wave * 500 + i;
            char ip[32];
            snprintf(ip, sizeof ip, "127.78.%d.%d", k / 200, k % 200 + 1);
            fds[i] = udp_socket_at(ip, 0);
            SEND_LIT(fds[i], &master, "\xff\xff\xff\xffheartbeat DarkPlaces\n");
        }
        for (int i = 0; i < 500; i++) {
            uint8_t buf[256];
            ssize_t got = recv_within(fds[i], buf, sizeof buf, 3000);
            if (got > 12 && !memcmp(buf, "\xff\xff\xff\xffgetinfo ", 12))
                answered++;
            close(fds[i]);
        }
    }
    assert_int_equal(answered, 2000);
    h_keys_take(&redis, &after, "*", NULL);
    h_keys_same_names(&before, &after, "2,000 challenges");
}

int main(void)
{
    h_init(150);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(q3_heartbeat_dance),
        cmocka_unit_test(q3_getservers_over_1100),
        cmocka_unit_test(q3_ipv6_server_in_getserversext),
        cmocka_unit_test(goldsrc_heartbeat_and_valve_walk),
        cmocka_unit_test(valve_seed_with_leftover_digit_answered),
        cmocka_unit_test(spoofed_shutdowns_remove_only_their_protocols_servers),
        cmocka_unit_test(malformed_dropped_and_counted),
        cmocka_unit_test(reply_budget_caps_amplification),
        cmocka_unit_test(qstat_lists_every_server),
        cmocka_unit_test(challenge_flood_costs_no_redis_state),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
