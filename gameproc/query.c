/* The UDP query port, so an unmodified-game-style probe can check gameproc:
 *
 *   Quake III  "\xff\xff\xff\xffgetstatus [challenge]" -> "statusResponse\n\\k\\v...\n"
 *                                                         + one line per player
 *              "\xff\xff\xff\xffgetinfo [challenge]"   -> "infoResponse\n\\k\\v..."
 *   Valve      "\xff\xff\xff\xffTSource Engine Query\0" [4-byte challenge]
 *                                                      -> A2S_INFO ('I') reply, or an
 *                                                         S2C_CHALLENGE ('A') when the
 *                                                         challenge is missing
 *                                                         (--a2s-challenge) or wrong
 *
 * A datagram is read into a fixed buffer; anything longer than GP_QUERY_MAX, shorter
 * than the 4-byte header or not one of these queries is dropped without a reply, and so
 * is everything before the server is ready (still loading). At most QUERY_BUDGET
 * datagrams are served per wake-up so a flood cannot starve the tick. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gameproc.h"
#include "sdlog.h"
#include "sdutil.h"

#define GP_QUERY_MAX 1400
#define QUERY_BUDGET 64
#define STATUS_PLAYERS_MAX 64   /* player lines in a statusResponse */
#define CHALLENGE_MAX 64

static const char HDR[4] = { '\xff', '\xff', '\xff', '\xff' };
static const char A2S_INFO_REQ[] = "TSource Engine Query"; /* followed by its NUL */
static uint32_t a2s_secret;

typedef struct {
    char *p;
    size_t len, cap;
    int overflow;
} out_t;

static void out_bytes(out_t *o, const void *b, size_t n)
{
    if (o->overflow || n > o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    memcpy(o->p + o->len, b, n);
    o->len += n;
}

static void out_str(out_t *o, const char *s)
{
    out_bytes(o, s, strlen(s));
}

static void out_u8(out_t *o, unsigned v)
{
    unsigned char b = (unsigned char)v;
    out_bytes(o, &b, 1);
}

static void out_le16(out_t *o, unsigned v)
{
    unsigned char b[2] = { (unsigned char)(v & 0xff), (unsigned char)(v >> 8) };
    out_bytes(o, b, 2);
}

static void out_le32(out_t *o, uint32_t v)
{
    unsigned char b[4] = { (unsigned char)v, (unsigned char)(v >> 8),
                           (unsigned char)(v >> 16), (unsigned char)(v >> 24) };
    out_bytes(o, b, 4);
}

/* Appends "\key\value" with the value formatted. */
static void out_kv(out_t *o, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void out_kv(out_t *o, const char *key, const char *fmt, ...)
{
    char v[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    out_str(o, "\\");
    out_str(o, key);
    out_str(o, "\\");
    out_str(o, v);
}

/* The challenge a Quake III client appended ("getstatus 1234"), if it is a plain token
 * we can echo back inside an info string; "" otherwise. */
static void q3_challenge(const char *arg, size_t n, char *out)
{
    out[0] = '\0';
    if (n == 0 || arg[0] != ' ')
        return;
    arg++;
    n--;
    if (n == 0 || n > CHALLENGE_MAX)
        return;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)arg[i];
        if (c <= 0x20 || c > 0x7e || c == '\\' || c == '"' || c == ';')
            return;
    }
    memcpy(out, arg, n);
    out[n] = '\0';
}

static void q3_serverinfo(const gp_t *gp, out_t *o, const char *challenge)
{
    if (*challenge)
        out_kv(o, "challenge", "%s", challenge);
    out_kv(o, "sv_hostname", "%s", gp->name);
    out_kv(o, "hostname", "%s", gp->name);
    out_kv(o, "mapname", "%s", gp->map);
    out_kv(o, "clients", "%d", gp->players);
    out_kv(o, "sv_maxclients", "%d", gp->max_players);
    out_kv(o, "gamename", "%s", "gameproc");
    out_kv(o, "protocol", "%d", 68);
    out_kv(o, "g_gametype", "%d", 0);
    out_kv(o, "version", "%s", "gameproc " GP_VERSION);
    out_kv(o, "draining", "%d", gp->draining);
}

static void q3_status(const gp_t *gp, out_t *o, const char *challenge)
{
    out_bytes(o, HDR, 4);
    out_str(o, "statusResponse\n");
    q3_serverinfo(gp, o, challenge);
    out_str(o, "\n");
    int n = gp->players < STATUS_PLAYERS_MAX ? gp->players : STATUS_PLAYERS_MAX;
    for (int i = 0; i < n; i++) {
        char line[64];
        snprintf(line, sizeof line, "%d %d \"player%d\"\n", (i * 7) % 31, 20 + i % 40, i + 1);
        out_str(o, line);
    }
}

static void q3_info(const gp_t *gp, out_t *o, const char *challenge)
{
    out_bytes(o, HDR, 4);
    out_str(o, "infoResponse\n");
    q3_serverinfo(gp, o, challenge);
}

/* The A2S challenge for one client IP address: a keyed FNV-1a hash of the address, so
 * a spoofing sender cannot guess it and it needs no per-client state. Never 0 or
 * 0xffffffff (the values clients send to ask for one). */
static uint32_t a2s_challenge_for(const struct sockaddr_storage *from)
{
    const unsigned char *b;
    size_t len;
    if (from->ss_family == AF_INET6) {
        b = ((const struct sockaddr_in6 *)from)->sin6_addr.s6_addr;
        len = 16;
    } else {
        b = (const unsigned char *)&((const struct sockaddr_in *)from)->sin_addr;
        len = 4;
    }
    uint32_t h = 2166136261u ^ a2s_secret;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 16777619u;
    return h == 0 || h == 0xffffffffu ? 1 : h;
}

static void a2s_info(const gp_t *gp, out_t *o)
{
    out_bytes(o, HDR, 4);
    out_u8(o, 'I');
    out_u8(o, 17); /* protocol */
    out_str(o, gp->name);
    out_u8(o, 0);
    out_str(o, gp->map);
    out_u8(o, 0);
    out_str(o, "gameproc"); /* folder */
    out_u8(o, 0);
    out_str(o, "ServerDir sample game");
    out_u8(o, 0);
    out_le16(o, 0); /* Steam app id: none */
    out_u8(o, gp->players > 255 ? 255 : (unsigned)gp->players);
    out_u8(o, gp->max_players > 255 ? 255 : (unsigned)gp->max_players);
    out_u8(o, 0);   /* bots */
    out_u8(o, 'd'); /* dedicated */
    out_u8(o, 'l'); /* linux */
    out_u8(o, 0);   /* public */
    out_u8(o, 0);   /* no VAC */
    out_str(o, GP_VERSION);
    out_u8(o, 0);
    out_u8(o, 0x80); /* extra data: the game port follows */
    out_le16(o, (unsigned)gp->udp_port);
}

/* Builds the reply to one datagram into o; o->len stays 0 when there is none. */
static void answer(const gp_t *gp, const char *in, size_t n,
                   const struct sockaddr_storage *from, out_t *o)
{
    if (n < 4 || memcmp(in, HDR, 4) != 0)
        return;
    in += 4;
    n -= 4;
    char challenge[CHALLENGE_MAX + 1];
    if (n >= 9 && memcmp(in, "getstatus", 9) == 0) {
        q3_challenge(in + 9, n - 9, challenge);
        if (n == 9 || in[9] == ' ')
            q3_status(gp, o, challenge);
    } else if (n >= 7 && memcmp(in, "getinfo", 7) == 0) {
        q3_challenge(in + 7, n - 7, challenge);
        if (n == 7 || in[7] == ' ')
            q3_info(gp, o, challenge);
    } else if (n >= sizeof A2S_INFO_REQ &&
               memcmp(in, A2S_INFO_REQ, sizeof A2S_INFO_REQ) == 0) {
        size_t extra = n - sizeof A2S_INFO_REQ;
        uint32_t want = a2s_challenge_for(from);
        if (extra != 0 && extra != 4)
            return;
        int ok = extra == 0 ? !gp->a2s_challenge : 0;
        if (extra == 4) {
            const unsigned char *c = (const unsigned char *)in + sizeof A2S_INFO_REQ;
            uint32_t got = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 |
                           (uint32_t)c[3] << 24;
            ok = got == want;
        }
        if (ok) {
            a2s_info(gp, o);
        } else {
            out_bytes(o, HDR, 4);
            out_u8(o, 'A');
            out_le32(o, want);
        }
    }
}

static void query_readable(gp_t *gp, void *arg)
{
    char in[GP_QUERY_MAX + 1];
    char buf[GP_QUERY_MAX + 200];
    for (int i = 0; i < QUERY_BUDGET; i++) {
        struct sockaddr_storage from;
        socklen_t fromlen = sizeof from;
        ssize_t n = recvfrom(gp->udp_fd, in, sizeof in, MSG_DONTWAIT | MSG_TRUNC,
                             (struct sockaddr *)&from, &fromlen);
        if (n < 0)
            return;
        if (n > GP_QUERY_MAX || !gp->ready)
            continue;
        out_t o = { .p = buf, .cap = sizeof buf };
        answer(gp, in, (size_t)n, &from, &o);
        if (o.len == 0 || o.overflow)
            continue;
        sendto(gp->udp_fd, buf, o.len, MSG_DONTWAIT, (struct sockaddr *)&from, fromlen);
    }
}

/* "--udp-port P" binds 127.0.0.1:P; "HOST:P" and "[v6]:P" bind that numeric address. */
static int parse_listen(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[64];
    int port;
    int64_t p;
    if (sd_parse_i64(s, 0, 65535, &p) == 0) {
        sd_strlcpy(host, "127.0.0.1", sizeof host);
        port = (int)p;
    } else if (sd_parse_hostport(s, host, sizeof host, &port) < 0 || port < 0 ||
               port > 65535) {
        return -EINVAL;
    }
    if (!*host)
        sd_strlcpy(host, "127.0.0.1", sizeof host);
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
    } else {
        return -EINVAL;
    }
    return 0;
}

int gp_query_start(gp_t *gp)
{
    if (!gp->udp_listen)
        return 0;
    struct sockaddr_storage ss;
    socklen_t len;
    if (parse_listen(gp->udp_listen, &ss, &len) < 0)
        sd_die(SD_EXIT_USAGE, "bad option", "option=udp-port value=%s want=%s", gp->udp_listen,
               "PORT, HOST:PORT or [V6]:PORT with a numeric host");
    char rnd[9];
    if (sd_random_hex(rnd, 4) == 0)
        a2s_secret = (uint32_t)strtoul(rnd, NULL, 16);
    int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    if (ss.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
        int e = errno;
        log_error("udp bind failed", "listen=%s err=%s", gp->udp_listen, strerror(e));
        close(fd);
        return -e;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &blen);
    gp->udp_port = ntohs(bound.ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&bound)->sin6_port
                             : ((struct sockaddr_in *)&bound)->sin_port);
    gp->udp_fd = fd;
    return gp_watch(gp, fd, query_readable, NULL);
}

void gp_query_stop(gp_t *gp)
{
    if (gp->udp_fd >= 0)
        close(gp->udp_fd);
    gp->udp_fd = -1;
}
