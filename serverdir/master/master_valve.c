/* Valve master query protocol and GoldSrc/Source heartbeat (see master_valve.h). */
#include "master_valve.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "master_q3.h"
#include "sdutil.h"

static const char *const region_names[] = {
    "us-east", "us-west", "south-america", "europe", "asia", "australia", "middle-east", "africa",
};

const char *sd_valve_region_name(int region)
{
    if (region >= 0 && region < (int)SD_ARRAY_LEN(region_names))
        return region_names[region];
    return "";
}

static void lower_copy(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++)
        dst[i] = (char)tolower((unsigned char)src[i]);
    dst[i] = '\0';
}

/* One filter condition "\key\value" as terms; returns NULL or a reason. */
static const char *filter_term(const char *key, const char *val, sd_master_filter_t *f)
{
    char v[65];
    if (!strcmp(key, "nor") || !strcmp(key, "nand")) {
        int64_t n;
        if (sd_parse_i64(val, 0, SD_MASTER_MAX_TERMS, &n))
            return "bad_filter";
        sd_master_filter_add(f, key, val, "");
    } else if (!strcmp(key, "gamedir") || !strcmp(key, "map")) {
        if (strlen(val) > 64)
            return "bad_filter";
        lower_copy(v, sizeof v, val);
        sd_master_filter_add(f, "eq", key[0] == 'g' ? "g" : "m", v);
    } else if (!strcmp(key, "empty")) {
        sd_master_filter_add(f, !strcmp(val, "1") ? "notempty" : "true", "", "");
    } else if (!strcmp(key, "full")) {
        sd_master_filter_add(f, !strcmp(val, "1") ? "notfull" : "true", "", "");
    } else if (!strcmp(key, "noplayers")) {
        if (!strcmp(val, "1"))
            sd_master_filter_add(f, "eq", "p", "0");
        else
            sd_master_filter_add(f, "true", "", "");
    } else if (!strcmp(key, "dedicated") || !strcmp(key, "secure")) {
        if (!strcmp(val, "1"))
            sd_master_filter_add(f, "eq", key[0] == 'd' ? "d" : "s", "1");
        else
            sd_master_filter_add(f, "true", "", "");
    } else if (!strcmp(key, "linux")) {
        if (!strcmp(val, "1"))
            sd_master_filter_add(f, "eq", "os", "l");
        else
            sd_master_filter_add(f, "true", "", "");
    } else if (!strcmp(key, "password")) {
        if (strcmp(val, "0") && strcmp(val, "1"))
            return "bad_filter";
        sd_master_filter_add(f, "eq", "pw", val);
    } else if (!strcmp(key, "gametype")) {
        /* Comma-separated server tags, all required. */
        if (strlen(val) > 64)
            return "bad_filter";
        lower_copy(v, sizeof v, val);
        sd_master_filter_add(f, "tags", "", v);
    } else if (!strcmp(key, "type")) {
        /* HLDS spelling (qstat sends it): d dedicated, l listen, p proxy (SourceTV: no
         * server of this list is one, so the condition holds for none). */
        if (strcmp(val, "d") && strcmp(val, "l") && strcmp(val, "p"))
            return "bad_filter";
        sd_master_filter_add(f, "eq", "d", val[0] == 'd' ? "1" : val[0] == 'l' ? "0" : "proxy");
    } else if (!strcmp(key, "gameaddr")) {
        /* "ip" or "ip:port": servers at that IP (the port is not checked). */
        char ip[SD_MASTER_ADDR_MAX];
        size_t il = strcspn(val, ":");
        if (il == 0 || il >= sizeof ip)
            return "bad_filter";
        memcpy(ip, val, il);
        ip[il] = '\0';
        unsigned char bin[4];
        if (inet_pton(AF_INET, ip, bin) != 1)
            return "bad_filter";
        sd_master_filter_add(f, "eq", "ip", ip);
    } else {
        /* appid, napp, white, gamedata, gamedataor, name_match, version_match,
         * collapse_addr_hash...: not kept by this master; the condition holds for every
         * server (docs/master.md lists which keys are honoured). */
        sd_master_filter_add(f, "true", "", "");
    }
    return NULL;
}

const char *sd_valve_parse_query(const uint8_t *p, size_t n, sd_valve_query_t *q)
{
    memset(q, 0, sizeof *q);
    if (n > 512)
        return "too_long";
    if (n < 3 || p[0] != 0x31)
        return "bad_query";
    q->region = p[1];
    /* The seed: "a.b.c.d:port" up to a NUL. Liberal, as real clients need: the seed is
     * the leading IPv4 address, colon and port of its field, and bytes after it up to the
     * NUL are ignored (qstat 2.17 pages with "<seed>r" and no filter); a datagram that
     * ends without the NUL ends the seed there (docs/master.md).
     * A port has at most five digits, and qstat 2.17 writes each seed over the previous
     * one in place: a seed shorter than the one before keeps that one's last digit
     * ("127.0.2.3:279010" for 127.0.2.3:27901). So with more than five digits the rest
     * are left over: the port is the first five, or the first four when those five are
     * more than 65535 (then the fifth is left over too). Five digits or fewer are the port
     * as they stand (a leftover among them cannot be told from the port). */
    const uint8_t *seed = p + 2;
    const uint8_t *nul = memchr(seed, '\0', n - 2);
    size_t field = nul ? (size_t)(nul - seed) : n - 2;
    size_t il = 0;
    while (il < field && ((seed[il] >= '0' && seed[il] <= '9') || seed[il] == '.'))
        il++;
    if (il == 0 || il >= 16 || il == field || seed[il] != ':')
        return "bad_seed";
    char ip[16];
    memcpy(ip, seed, il);
    ip[il] = '\0';
    const uint8_t *digits = seed + il + 1;
    size_t nd = 0;
    while (il + 1 + nd < field && digits[nd] >= '0' && digits[nd] <= '9')
        nd++;
    size_t used = nd > 5 ? 5 : nd;
    long port = 0;
    for (size_t k = 0; k < used; k++)
        port = port * 10 + (digits[k] - '0');
    if (nd > 5 && port > 65535) {
        port /= 10;
        used = 4;
    }
    if (used == 0 || port > 65535)
        return "bad_seed";
    if (strcmp(ip, "0.0.0.0") != 0 || port != 0) {
        int fam;
        if (sd_master_addr_key(ip, (int)port, q->seed, sizeof q->seed, NULL, 0, &fam) || fam != 4)
            return "bad_seed";
    }
    q->seed_garbage = il + 1 + used != field;
    if (!nul)
        nul = p + n - 1; /* no filter follows */
    /* The filter: "\key\value..." up to a NUL (tolerated missing at the very end). */
    size_t fpos = (size_t)(nul - p) + 1;
    size_t fend = n;
    const uint8_t *fnul = fpos < n ? memchr(p + fpos, '\0', n - fpos) : NULL;
    if (fnul) {
        fend = (size_t)(fnul - p);
        if (fend + 1 != n)
            return "bad_filter"; /* bytes after the filter's NUL */
    }
    size_t pos = fpos;
    char key[33], val[129];
    int rc;
    while ((rc = sd_infostring_next(p, fend, &pos, key, sizeof key, val, sizeof val)) == 1) {
        const char *why = filter_term(key, val, &q->filter);
        if (why)
            return why;
    }
    if (rc < 0 || q->filter.overflow)
        return "bad_filter";
    sd_master_filter_add(&q->filter, "eq", "f", "4");
    if (q->region != 255) {
        const char *r = sd_valve_region_name(q->region);
        if (!*r)
            return "bad_region";
        sd_master_filter_add(&q->filter, "eq", "r", r);
    }
    if (q->filter.overflow)
        return "bad_filter";
    return NULL;
}

size_t sd_valve_encode_reply(const uint8_t (*ips)[4], const uint16_t *ports, int n, int last,
                             uint8_t *out)
{
    static const uint8_t hdr[SD_VALVE_HDR_LEN] = {0xff, 0xff, 0xff, 0xff, 0x66, 0x0a};
    memcpy(out, hdr, sizeof hdr);
    size_t len = sizeof hdr;
    for (int i = 0; i < n && i < SD_VALVE_BATCH; i++) {
        memcpy(out + len, ips[i], 4);
        out[len + 4] = (uint8_t)(ports[i] >> 8);
        out[len + 5] = (uint8_t)(ports[i] & 0xff);
        len += 6;
    }
    if (last) {
        memset(out + len, 0, 6);
        len += 6;
    }
    return len;
}

sd_gs_kind_t sd_gs_kind(const uint8_t *p, size_t n)
{
    if (n >= 1 && p[0] == 'q' && (n == 1 || (n == 2 && (p[1] == '\n' || p[1] == '\0'))))
        return SD_GS_CHALLENGE_REQ;
    if (n >= 2 && p[0] == '0' && p[1] == '\n')
        return SD_GS_INFO;
    if (n >= 2 && p[0] == 'b' && p[1] == '\n' && (n == 2 || (n == 3 && p[2] == '\0')))
        return SD_GS_QUIT;
    return SD_GS_NONE;
}

size_t sd_gs_encode_challenge(uint32_t challenge, uint8_t *out)
{
    static const uint8_t hdr[6] = {0xff, 0xff, 0xff, 0xff, 's', '\n'};
    memcpy(out, hdr, 6);
    out[6] = (uint8_t)(challenge & 0xff);
    out[7] = (uint8_t)((challenge >> 8) & 0xff);
    out[8] = (uint8_t)((challenge >> 16) & 0xff);
    out[9] = (uint8_t)(challenge >> 24);
    return 10;
}

const char *sd_gs_parse_info(const uint8_t *p, size_t n, sd_master_server_t *s,
                             uint32_t *challenge)
{
    if (n > SD_VALVE_DGRAM_MAX)
        return "too_long";
    if (sd_gs_kind(p, n) != SD_GS_INFO)
        return "bad_info";
    memset(s, 0, sizeof *s);
    s->protocol = s->gametype = -1;
    s->source = "goldsrc";
    static const sd_info_key_t keys[] = {
        {"protocol", SD_INFO_PROTOCOL, "bad_protocol"},
        {"players", SD_INFO_PLAYERS, "bad_players"},
        {"max", SD_INFO_MAX, "bad_max"},
        {"bots", SD_INFO_BOTS, "bad_bots"},
        {"gamedir", SD_INFO_GAME, "bad_gamedir"},
        {"map", SD_INFO_MAP, NULL},
    };
    unsigned have = 0;
    const char *bad = NULL;
    int have_ch = 0, lan = 0;
    size_t pos = 2;
    char key[65], val[257];
    int rc;
    while ((rc = sd_infostring_next(p, n, &pos, key, sizeof key, val, sizeof val)) == 1) {
        int f = sd_info_field(keys, SD_ARRAY_LEN(keys), key, val, s, &have, &bad);
        if (f < 0)
            return bad;
        if (f > 0)
            continue;
        if (!strcmp(key, "challenge")) {
            int64_t v;
            if (sd_parse_i64(val, 0, UINT32_MAX, &v))
                return "bad_challenge";
            *challenge = (uint32_t)v;
            have_ch = 1;
        } else if (!strcmp(key, "password")) {
            s->password = !strcmp(val, "1");
        } else if (!strcmp(key, "os")) {
            if (!strcmp(val, "l") || !strcmp(val, "w") || !strcmp(val, "m"))
                sd_strlcpy(s->os, val, sizeof s->os);
        } else if (!strcmp(key, "lan")) {
            lan = !strcmp(val, "1");
        } else if (!strcmp(key, "region")) {
            int r;
            if (sd_info_num(val, 0, 255, &r))
                return "bad_region";
            sd_strlcpy(s->region, sd_valve_region_name(r), sizeof s->region);
        } else if (!strcmp(key, "type")) {
            s->dedicated = !strcmp(val, "d");
        } else if (!strcmp(key, "secure")) {
            s->secure = !strcmp(val, "1");
        } else if (!strcmp(key, "version")) {
            sd_info_copy(s->version, sizeof s->version, val);
        } else if (!strcmp(key, "gametype")) {
            /* Source servers send their tags here, comma-separated. */
            char tags[257];
            sd_strlcpy(tags, val, sizeof tags);
            char *save = NULL;
            for (char *t = strtok_r(tags, ",", &save); t && s->ntags < 16;
                 t = strtok_r(NULL, ",", &save))
                if (strlen(t) <= 32)
                    sd_info_copy(s->tags[s->ntags++], sizeof s->tags[0], t);
        }
    }
    if (rc < 0)
        return "bad_infostring";
    if (!have_ch)
        return "no_challenge";
    unsigned needed = 1u << SD_INFO_PROTOCOL | 1u << SD_INFO_MAX | 1u << SD_INFO_PLAYERS;
    if ((have & needed) != needed || !s->game[0])
        return "missing_field";
    if (s->players > s->max_players || s->bots > s->players)
        return "bad_players";
    if (lan)
        return "lan_server";
    return NULL;
}
