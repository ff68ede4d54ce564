/* gameproc's UDP query protocol, the pure part (see gpquery.h). */
#include "gpquery.h"

#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const uint8_t HDR[4] = { 0xff, 0xff, 0xff, 0xff };
static const char A2S_INFO_REQ[] = "TSource Engine Query"; /* followed by its NUL */

typedef struct {
    uint8_t *p;
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
    uint8_t b = (uint8_t)v;
    out_bytes(o, &b, 1);
}

static void out_le16(out_t *o, unsigned v)
{
    uint8_t b[2] = { (uint8_t)(v & 0xff), (uint8_t)(v >> 8) };
    out_bytes(o, b, 2);
}

static void out_le32(out_t *o, uint32_t v)
{
    uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
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

static int challenge_char_ok(uint8_t c)
{
    return c > 0x20 && c < 0x7f && c != '\\' && c != '"' && c != ';' && c != '/' && c != '%';
}

/* The argument of a Quake III query after its command word (arg[0..n)): "" or blanks,
 * a line feed or NUL only -> no challenge (returns 0, out ""); " <word>" followed by
 * nothing but such padding -> the word in out (returns 0); anything else -> -1. */
static int q3_challenge(const uint8_t *arg, size_t n, char *out)
{
    out[0] = '\0';
    size_t i = 0;
    if (n > 0 && arg[0] != ' ')
        return -1;                       /* "getinfoX": another command */
    while (i < n && arg[i] == ' ')
        i++;
    size_t start = i;
    while (i < n && arg[i] != ' ' && arg[i] != '\n' && arg[i] != '\0') {
        if (!challenge_char_ok(arg[i]) || i - start >= GP_Q3_CHALLENGE_MAX)
            return -1;
        i++;
    }
    size_t len = i - start;
    for (; i < n; i++)
        if (arg[i] != ' ' && arg[i] != '\n' && arg[i] != '\0')
            return -1;                   /* a second argument: not a query we know */
    memcpy(out, arg + start, len);
    out[len] = '\0';
    return 0;
}

static void q3_serverinfo(const gp_query_info_t *in, out_t *o, const char *challenge)
{
    if (*challenge)
        out_kv(o, "challenge", "%s", challenge);
    out_kv(o, "sv_hostname", "%s", in->name);
    out_kv(o, "hostname", "%s", in->name);
    out_kv(o, "mapname", "%s", in->map);
    out_kv(o, "clients", "%d", in->players);
    out_kv(o, "sv_maxclients", "%d", in->max_players);
    out_kv(o, "bots", "%d", 0);
    out_kv(o, "gamename", "%s", in->game);
    out_kv(o, "protocol", "%d", 68);
    out_kv(o, "gametype", "%d", 0);
    out_kv(o, "g_gametype", "%d", 0);
    out_kv(o, "g_needpass", "%d", 0);
    out_kv(o, "version", "%s", "gameproc " SD_VERSION);
    out_kv(o, "draining", "%d", in->draining);
}

static void q3_status(const gp_query_info_t *in, out_t *o, const char *challenge)
{
    out_bytes(o, HDR, 4);
    out_str(o, "statusResponse\n");
    q3_serverinfo(in, o, challenge);
    out_str(o, "\n");
    int n = in->players < GP_STATUS_PLAYERS_MAX ? in->players : GP_STATUS_PLAYERS_MAX;
    for (int i = 0; i < n; i++) {
        char line[64];
        snprintf(line, sizeof line, "%d %d \"player%d\"\n", (i * 7) % 31, 20 + i % 40, i + 1);
        out_str(o, line);
    }
}

static void q3_info(const gp_query_info_t *in, out_t *o, const char *challenge)
{
    out_bytes(o, HDR, 4);
    out_str(o, "infoResponse\n");
    q3_serverinfo(in, o, challenge);
}

/* A keyed FNV-1a hash of the client's IP address, so a spoofing sender cannot guess it
 * and it needs no per-client state. */
uint32_t gp_a2s_challenge(uint32_t secret, const struct sockaddr_storage *from)
{
    const uint8_t *b;
    size_t len;
    if (from->ss_family == AF_INET6) {
        b = ((const struct sockaddr_in6 *)from)->sin6_addr.s6_addr;
        len = 16;
    } else {
        b = (const uint8_t *)&((const struct sockaddr_in *)from)->sin_addr;
        len = 4;
    }
    uint32_t h = 2166136261u ^ secret;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 16777619u;
    return h == 0 || h == 0xffffffffu ? 1 : h;
}

static void a2s_info(const gp_query_info_t *in, out_t *o)
{
    out_bytes(o, HDR, 4);
    out_u8(o, 'I');
    out_u8(o, 17); /* protocol */
    out_str(o, in->name);
    out_u8(o, 0);
    out_str(o, in->map);
    out_u8(o, 0);
    out_str(o, in->game); /* folder */
    out_u8(o, 0);
    out_str(o, "ServerDir sample game");
    out_u8(o, 0);
    out_le16(o, 0); /* Steam app id: none */
    out_u8(o, in->players > 255 ? 255 : (unsigned)in->players);
    out_u8(o, in->max_players > 255 ? 255 : (unsigned)in->max_players);
    out_u8(o, 0);   /* bots */
    out_u8(o, 'd'); /* dedicated */
    out_u8(o, 'l'); /* linux */
    out_u8(o, 0);   /* public */
    out_u8(o, 0);   /* no VAC */
    out_str(o, SD_VERSION);
    out_u8(o, 0);
    out_u8(o, 0x80); /* extra data: the game port follows */
    out_le16(o, (unsigned)in->port);
}

static int is_cmd(const uint8_t *in, size_t n, const char *word)
{
    size_t wl = strlen(word);
    return n >= wl && memcmp(in, word, wl) == 0;
}

size_t gp_query_answer(const gp_query_info_t *info, const uint8_t *in, size_t n,
                       const struct sockaddr_storage *from, uint8_t *outbuf, size_t cap)
{
    out_t o = { .p = outbuf, .cap = cap };
    if (n < 4 || n > GP_QUERY_MAX || memcmp(in, HDR, 4) != 0)
        return 0;
    in += 4;
    n -= 4;
    char challenge[GP_Q3_CHALLENGE_MAX + 1];
    if (is_cmd(in, n, "getstatus")) {
        if (q3_challenge(in + 9, n - 9, challenge) < 0)
            return 0;
        q3_status(info, &o, challenge);
    } else if (is_cmd(in, n, "getinfo")) {
        if (info->no_info || q3_challenge(in + 7, n - 7, challenge) < 0)
            return 0;
        q3_info(info, &o, challenge);
    } else if (n >= sizeof A2S_INFO_REQ &&
               memcmp(in, A2S_INFO_REQ, sizeof A2S_INFO_REQ) == 0) {
        size_t extra = n - sizeof A2S_INFO_REQ;
        uint32_t want = gp_a2s_challenge(info->a2s_secret, from);
        if (extra != 0 && extra != 4)
            return 0;
        int ok = extra == 0 ? !info->a2s_challenge : 0;
        if (extra == 4) {
            const uint8_t *c = in + sizeof A2S_INFO_REQ;
            uint32_t got = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 |
                           (uint32_t)c[3] << 24;
            ok = got == want;
        }
        if (ok) {
            a2s_info(info, &o);
        } else {
            out_bytes(&o, HDR, 4);
            out_u8(&o, 'A');
            out_le32(&o, want);
        }
    } else {
        return 0;
    }
    return o.overflow ? 0 : o.len;
}
