/* DarkPlaces / Quake III master protocol: parsers and encoders (see master_q3.h). */
#include "master_q3.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "sdutil.h"

#define HDR "\xff\xff\xff\xff"
#define HDR_LEN 4

static int has_prefix(const uint8_t *p, size_t n, const char *word)
{
    size_t wl = strlen(word);
    return n >= HDR_LEN + wl && memcmp(p, HDR, HDR_LEN) == 0 && memcmp(p + HDR_LEN, word, wl) == 0;
}

sd_q3_kind_t sd_q3_kind(const uint8_t *p, size_t n)
{
    /* The longer word first: "getserversExt" starts with "getservers". */
    if (has_prefix(p, n, "getserversExt") &&
        (n == HDR_LEN + 13 || p[HDR_LEN + 13] == ' '))
        return SD_Q3_GETSERVERSEXT;
    if (has_prefix(p, n, "getservers") && (n == HDR_LEN + 10 || p[HDR_LEN + 10] == ' '))
        return SD_Q3_GETSERVERS;
    if (has_prefix(p, n, "heartbeat"))
        return SD_Q3_HEARTBEAT;
    if (has_prefix(p, n, "infoResponse"))
        return SD_Q3_INFORESPONSE;
    return SD_Q3_NONE;
}

void sd_info_copy(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = (c >= 0x20 && c < 0x7f && c != '\\') ? (char)c : '?';
    }
    dst[i] = '\0';
}

const char *sd_q3_parse_heartbeat(const uint8_t *p, size_t n, char *tag, size_t tagcap)
{
    if (n > SD_Q3_DGRAM_MAX)
        return "too_long";
    if (!has_prefix(p, n, "heartbeat "))
        return "bad_heartbeat";
    size_t i = HDR_LEN + 10, t = 0;
    for (; i < n && p[i] != '\n' && p[i] != '\0'; i++) {
        if (p[i] <= 0x20 || p[i] >= 0x7f || t + 1 >= tagcap || t >= 63)
            return "bad_heartbeat";
        tag[t++] = (char)p[i];
    }
    /* Nothing may follow the closing line feed but a NUL some engines add. */
    if (i < n && p[i] == '\n')
        i++;
    if (i < n && p[i] == '\0')
        i++;
    if (i != n || t == 0)
        return "bad_heartbeat";
    tag[t] = '\0';
    return NULL;
}

static int challenge_char_ok(unsigned char c)
{
    return c >= 33 && c <= 126 && c != '\\' && c != '/' && c != ';' && c != '"' && c != '%';
}

size_t sd_q3_encode_getinfo(const char *challenge, uint8_t *out, size_t cap)
{
    size_t cl = strlen(challenge);
    size_t n = HDR_LEN + 8 + cl;
    if (cl == 0 || n > cap)
        return 0;
    for (size_t i = 0; i < cl; i++)
        if (!challenge_char_ok((unsigned char)challenge[i]))
            return 0;
    memcpy(out, HDR "getinfo ", HDR_LEN + 8);
    memcpy(out + HDR_LEN + 8, challenge, cl);
    return n;
}

int sd_infostring_next(const uint8_t *p, size_t n, size_t *pos, char *key, size_t kcap,
                       char *val, size_t vcap)
{
    size_t i = *pos;
    /* A trailing line feed or NUL ends the string. */
    if (i >= n || p[i] == '\n' || p[i] == '\0')
        return 0;
    if (p[i] != '\\')
        return -1;
    i++;
    size_t k = 0;
    for (; i < n && p[i] != '\\'; i++) {
        if (p[i] < 0x20 || p[i] == 0x7f || k + 1 >= kcap)
            return -1;
        key[k++] = (char)p[i];
    }
    if (i >= n || k == 0)
        return -1;
    key[k] = '\0';
    i++;
    size_t v = 0;
    for (; i < n && p[i] != '\\' && p[i] != '\n' && p[i] != '\0'; i++) {
        if (p[i] < 0x20 || p[i] == 0x7f || v + 1 >= vcap)
            return -1;
        val[v++] = (char)p[i];
    }
    val[v] = '\0';
    *pos = i;
    return 1;
}

int sd_info_num(const char *s, int64_t min, int64_t max, int *out)
{
    int64_t v;
    if (sd_parse_i64(s, min, max, &v))
        return -1;
    *out = (int)v;
    return 0;
}

int sd_info_field(const sd_info_key_t *keys, size_t n, const char *key, const char *val,
                  sd_master_server_t *s, unsigned *have, const char **bad)
{
    size_t i = 0;
    while (i < n && strcmp(keys[i].key, key) != 0)
        i++;
    if (i == n)
        return 0;
    int rc = 0;
    switch (keys[i].field) {
    case SD_INFO_PROTOCOL: rc = sd_info_num(val, 0, 1 << 30, &s->protocol); break;
    case SD_INFO_PLAYERS: rc = sd_info_num(val, 0, 65535, &s->players); break;
    case SD_INFO_MAX: rc = sd_info_num(val, 1, 65535, &s->max_players); break;
    case SD_INFO_BOTS: rc = sd_info_num(val, 0, 65535, &s->bots); break;
    case SD_INFO_GAME:
        rc = !*val || strlen(val) > 64 || strpbrk(val, " \t") ? -1 : 0;
        if (!rc)
            sd_info_copy(s->game, sizeof s->game, val);
        break;
    case SD_INFO_MAP: sd_info_copy(s->map, sizeof s->map, val); break;
    }
    if (rc) {
        *bad = keys[i].bad;
        return -1;
    }
    *have |= 1u << keys[i].field;
    return 1;
}

const char *sd_q3_parse_inforesponse(const uint8_t *p, size_t n, sd_master_server_t *s,
                                     char *challenge, size_t chalcap)
{
    if (n > SD_Q3_DGRAM_MAX)
        return "too_long";
    if (!has_prefix(p, n, "infoResponse\n"))
        return "bad_inforesponse";
    memset(s, 0, sizeof *s);
    s->protocol = s->gametype = -1;
    s->dedicated = 1;
    s->source = "q3";
    challenge[0] = '\0';
    static const sd_info_key_t keys[] = {
        {"protocol", SD_INFO_PROTOCOL, "bad_protocol"},
        {"sv_maxclients", SD_INFO_MAX, "bad_maxclients"},
        {"clients", SD_INFO_PLAYERS, "bad_clients"},
        {"bots", SD_INFO_BOTS, "bad_bots"},
        {"gamename", SD_INFO_GAME, "bad_gamename"},
        {"mapname", SD_INFO_MAP, NULL},
    };
    unsigned have = 0;
    const char *bad = NULL;
    size_t pos = HDR_LEN + 13;
    char key[65], val[257];
    int rc;
    while ((rc = sd_infostring_next(p, n, &pos, key, sizeof key, val, sizeof val)) == 1) {
        int f = sd_info_field(keys, SD_ARRAY_LEN(keys), key, val, s, &have, &bad);
        if (f < 0)
            return bad;
        if (f > 0)
            continue;
        if (!strcmp(key, "challenge")) {
            size_t cl = strlen(val);
            if (cl == 0 || cl >= chalcap)
                return "bad_challenge";
            for (size_t i = 0; i < cl; i++)
                if (!challenge_char_ok((unsigned char)val[i]))
                    return "bad_challenge";
            memcpy(challenge, val, cl + 1);
        } else if (!strcmp(key, "gametype")) {
            if (sd_info_num(val, 0, 1 << 30, &s->gametype))
                return "bad_gametype";
        } else if (!strcmp(key, "hostname")) {
            sd_info_copy(s->name, sizeof s->name, val);
        } else if (!strcmp(key, "g_needpass") || !strcmp(key, "needpass")) {
            s->password = strcmp(val, "0") != 0 && *val;
        }
    }
    if (rc < 0)
        return "bad_infostring";
    if (!challenge[0])
        return "no_challenge";
    unsigned needed = 1u << SD_INFO_PROTOCOL | 1u << SD_INFO_MAX | 1u << SD_INFO_PLAYERS;
    if ((have & needed) != needed)
        return "missing_field";
    if (s->players > s->max_players || s->bots > s->players)
        return "bad_clients";
    if (!s->game[0])
        sd_strlcpy(s->game, "Quake3Arena", sizeof s->game);
    return NULL;
}

const char *sd_q3_parse_getservers(const uint8_t *p, size_t n, sd_q3_query_t *q)
{
    if (n > 512)
        return "too_long";
    memset(q, 0, sizeof *q);
    q->gametype = -1;
    sd_q3_kind_t k = sd_q3_kind(p, n);
    if (k != SD_Q3_GETSERVERS && k != SD_Q3_GETSERVERSEXT)
        return "bad_getservers";
    q->ext = k == SD_Q3_GETSERVERSEXT;
    size_t i = HDR_LEN + (q->ext ? 13 : 10);
    /* A trailing line feed or NUL is tolerated; nothing else outside printable ASCII. */
    size_t end = n;
    while (end > i && (p[end - 1] == '\n' || p[end - 1] == '\0'))
        end--;
    char text[512];
    size_t tl = end - i;
    for (size_t j = i; j < end; j++)
        if (p[j] < 0x20 || p[j] >= 0x7f)
            return "bad_getservers";
    memcpy(text, p + i, tl);
    text[tl] = '\0';

    char *save = NULL;
    char *tok = strtok_r(text, " ", &save);
    if (!tok)
        return "no_protocol";
    if (!q->ext && isdigit((unsigned char)tok[0])) {
        sd_strlcpy(q->game, "Quake3Arena", sizeof q->game); /* Q3A: no game name */
    } else {
        if (strlen(tok) > 64)
            return "bad_gamename";
        sd_strlcpy(q->game, tok, sizeof q->game);
        tok = strtok_r(NULL, " ", &save);
        if (!tok)
            return "no_protocol";
    }
    if (sd_info_num(tok, 0, 1 << 30, &q->protocol))
        return "bad_protocol";
    static const struct {
        const char *word;
        int gametype;
    } shortcuts[] = {{"ffa", 0}, {"tourney", 1}, {"team", 3}, {"ctf", 4}};
    while ((tok = strtok_r(NULL, " ", &save))) {
        if (!strcmp(tok, "empty")) {
            q->empty = 1;
        } else if (!strcmp(tok, "full")) {
            q->full = 1;
        } else if (!strcmp(tok, "ipv4")) {
            q->ipv4 = 1;
        } else if (!strcmp(tok, "ipv6")) {
            q->ipv6 = 1;
        } else if (!strncmp(tok, "gametype=", 9)) {
            if (sd_info_num(tok + 9, 0, 1 << 30, &q->gametype))
                return "bad_gametype";
        } else {
            for (size_t s = 0; s < SD_ARRAY_LEN(shortcuts); s++)
                if (!strcmp(tok, shortcuts[s].word))
                    q->gametype = shortcuts[s].gametype;
            /* Other options are ignored, as Q3A clients may send their own. */
        }
    }
    return NULL;
}

void sd_q3_query_filter(const sd_q3_query_t *q, sd_master_filter_t *f)
{
    char g[65], num_[16];
    size_t i = 0;
    for (; q->game[i] && i + 1 < sizeof g; i++)
        g[i] = (char)tolower((unsigned char)q->game[i]);
    g[i] = '\0';
    sd_master_filter_add(f, "eq", "g", g);
    snprintf(num_, sizeof num_, "%d", q->protocol);
    sd_master_filter_add(f, "eq", "pr", num_);
    if (!q->empty)
        sd_master_filter_add(f, "notempty", "", "");
    if (!q->full)
        sd_master_filter_add(f, "notfull", "", "");
    if (q->gametype >= 0) {
        snprintf(num_, sizeof num_, "%d", q->gametype);
        sd_master_filter_add(f, "eq", "gt", num_);
    }
    if (!q->ext || (q->ipv4 && !q->ipv6))
        sd_master_filter_add(f, "eq", "f", "4");
    else if (q->ipv6 && !q->ipv4)
        sd_master_filter_add(f, "eq", "f", "6");
}

void sd_q3_resp_begin(sd_q3_writer_t *w, int ext)
{
    const char *word = ext ? HDR "getserversExtResponse" : HDR "getserversResponse";
    w->ext = ext;
    w->count = 0;
    w->len = strlen(word);
    memcpy(w->buf, word, w->len);
}

int sd_q3_resp_add(sd_q3_writer_t *w, int family, const uint8_t *ip, uint16_t port)
{
    size_t need = family == 4 ? 7 : 19;
    if ((family == 6 && !w->ext) || (family != 4 && family != 6))
        return -1;
    if (w->len + need + SD_Q3_EOT_LEN > SD_Q3_DGRAM_MAX)
        return -1;
    w->buf[w->len++] = family == 4 ? '\\' : '/';
    memcpy(w->buf + w->len, ip, family == 4 ? 4 : 16);
    w->len += family == 4 ? 4 : 16;
    w->buf[w->len++] = (uint8_t)(port >> 8);
    w->buf[w->len++] = (uint8_t)(port & 0xff);
    w->count++;
    return 0;
}

void sd_q3_resp_cut(sd_q3_writer_t *w)
{
    w->buf[w->len++] = '\\'; /* room kept by sd_q3_resp_add (the EOT mark's) */
}

void sd_q3_resp_end(sd_q3_writer_t *w)
{
    memcpy(w->buf + w->len, SD_Q3_EOT, SD_Q3_EOT_LEN);
    w->len += SD_Q3_EOT_LEN;
}

int sd_master_key_bytes(const char *key, uint8_t ip[16], uint16_t *port)
{
    char host[64];
    int p;
    if (sd_parse_hostport(key, host, sizeof host, &p))
        return -1;
    *port = (uint16_t)p;
    if (inet_pton(AF_INET, host, ip) == 1)
        return 4;
    if (inet_pton(AF_INET6, host, ip) == 1)
        return 6;
    return -1;
}
