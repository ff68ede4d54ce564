/* The master list core shared by the REST handlers and the UDP front: configuration,
 * canonical addresses, the per-address rate limiter, and the calls of the master_*.lua
 * scripts. See master.h for the Redis layout. */
#include "master.h"

#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd.h"
#include "sdvalid.h"

sd_master_cfg_t sd_master_cfg = {
    .heartbeat_interval_s = 300,
    .challenge_ttl_ms = 5000,
    .servers_per_address = 32,
    .challenges_per_address = 8,
    .rate_per_s = 20,
    .max_servers = 200000,
    .max_batch = 1000,
    .default_batch = 100,
    .scan_budget = 5000,
    .udp_reply_bytes_per_s = 65536,
    .getinfo_timeout_ms = 5000,
    .udp_reply_bytes_total_per_s = 16 << 20,
    .ipv4_group_bits = 32,
    .challenge_key_rotate_s = 3600,
    .udp_workers = 0,
};

/* ---------- config ---------- */

int sd_master_config_load(const json_t *sec, char *err, size_t errcap)
{
    if (!sec)
        return 0;
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (!json_is_object(sec))
        return sd_jv_fail(&v, "master", "must be an object");
    static const char *const known[] = {
        "heartbeat_interval_s", "challenge_ttl_ms", "servers_per_address",
        "challenges_per_address", "rate_per_s", "max_servers", "max_batch", "default_batch",
        "scan_budget", "udp_reply_bytes_per_s", "udp_reply_bytes_total_per_s",
        "ipv4_group_bits", "getinfo_timeout_ms", "trusted_proxies", "udp",
        "challenge_key_rotate_s", "udp_workers", NULL};
    if (sd_jv_only_keys(&v, sec, known))
        return -1;
    sd_master_cfg_t cfg = sd_master_cfg, *c = &cfg; /* all or nothing */
    if (sd_jv_int(&v, sec, "heartbeat_interval_s", 0, 1, 86400, &c->heartbeat_interval_s) < 0 ||
        sd_jv_int(&v, sec, "challenge_ttl_ms", 0, 100, 600000, &c->challenge_ttl_ms) < 0 ||
        sd_jv_int(&v, sec, "servers_per_address", 0, 1, 1000000, &c->servers_per_address) < 0 ||
        sd_jv_int(&v, sec, "challenges_per_address", 0, 1, 100000,
                  &c->challenges_per_address) < 0 ||
        sd_jv_int(&v, sec, "rate_per_s", 0, 1, 10000000, &c->rate_per_s) < 0 ||
        sd_jv_int(&v, sec, "max_servers", 0, 1, 10000000, &c->max_servers) < 0 ||
        sd_jv_int(&v, sec, "max_batch", 0, 1, 10000, &c->max_batch) < 0 ||
        sd_jv_int(&v, sec, "default_batch", 0, 1, 10000, &c->default_batch) < 0 ||
        sd_jv_int(&v, sec, "scan_budget", 0, 100, 1000000, &c->scan_budget) < 0 ||
        sd_jv_int(&v, sec, "udp_reply_bytes_per_s", 0, 1400, 1 << 30,
                  &c->udp_reply_bytes_per_s) < 0 ||
        sd_jv_int(&v, sec, "getinfo_timeout_ms", 0, 0, 600000, &c->getinfo_timeout_ms) < 0 ||
        sd_jv_int(&v, sec, "udp_reply_bytes_total_per_s", 0, 1400, INT64_C(1) << 34,
                  &c->udp_reply_bytes_total_per_s) < 0 ||
        sd_jv_int(&v, sec, "ipv4_group_bits", 0, 24, 32, &c->ipv4_group_bits) < 0 ||
        sd_jv_int(&v, sec, "challenge_key_rotate_s", 0, 60, 86400 * 30,
                  &c->challenge_key_rotate_s) < 0 ||
        sd_jv_int(&v, sec, "udp_workers", 0, 0, 64, &c->udp_workers) < 0)
        return -1;
    if (c->ipv4_group_bits != 24 && c->ipv4_group_bits != 32)
        return sd_jv_fail(&v, "master.ipv4_group_bits", "must be 24 or 32");
    if (c->default_batch > c->max_batch)
        c->default_batch = c->max_batch;

    json_t *tp = NULL, *udp = NULL;
    if (sd_jv_array(&v, sec, "trusted_proxies", SD_JV_NONNULL, SD_ARRAY_LEN(c->trusted), &tp) < 0 ||
        sd_jv_array(&v, sec, "udp", SD_JV_NONNULL, SD_MASTER_MAX_UDP, &udp) < 0)
        return -1;
    if (tp) {
        size_t i;
        json_t *j;
        json_array_foreach(tp, i, j) {
            if (!json_is_string(j) ||
                sd_master_addr_key(json_string_value(j), 1, NULL, 0, c->trusted[i],
                                   sizeof c->trusted[i], NULL)) {
                sd_jv_key(&v, "trusted_proxies");
                sd_jv_index(&v, i);
                return sd_jv_fail(&v, NULL, "must be an IP address");
            }
        }
        c->ntrusted = (int)json_array_size(tp);
    }
    if (udp) {
        size_t i;
        json_t *j;
        json_array_foreach(udp, i, j) {
            char host[128];
            int port;
            if (!json_is_string(j) || json_string_length(j) >= sizeof c->udp[0] ||
                sd_parse_hostport(json_string_value(j), host, sizeof host, &port)) {
                sd_jv_key(&v, "udp");
                sd_jv_index(&v, i);
                return sd_jv_fail(&v, NULL, "must be HOST:PORT");
            }
            sd_strlcpy(c->udp[i], json_string_value(j), sizeof c->udp[0]);
        }
        c->nudp = (int)json_array_size(udp);
    }
    sd_master_cfg = cfg;
    return 0;
}

/* ---------- rate limiter ----------
 * A token bucket per address in a fixed table of slots (hash of the address); when two
 * addresses share a slot the newer one takes it over, so memory stays fixed under a
 * flood of many addresses. A slot names its address by a 64-bit hash, not its text (24
 * bytes a slot: 1.2 MB for the three tables, was 3.9 MB, which a list of 10,000 servers
 * mostly touched). Each serverdir copy limits on its own. */

#define RATE_SLOTS 16384
#define RATE_LOCKS 64

static struct rate_slot {
    uint64_t id; /* fnv1a64 of the address (group); 0: unused */
    double tokens;
    int64_t at_us;
} rate_slots[3][RATE_SLOTS];
static pthread_mutex_t rate_mu[RATE_LOCKS];
static pthread_once_t rate_once = PTHREAD_ONCE_INIT;

static void rate_init(void)
{
    for (int i = 0; i < RATE_LOCKS; i++)
        pthread_mutex_init(&rate_mu[i], NULL);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

int sd_master_rate_take(int which, const char *addr, int64_t cost)
{
    pthread_once(&rate_once, rate_init);
    /* Requests count per quota group (an IPv4 address or its /24, an IPv6 /64); reply
     * bytes per /24 or /64 always (a spoofer spreads over a network's addresses), and all
     * reply bytes together in one bucket. */
    char ip[SD_MASTER_GROUP_MAX];
    if (which == SD_RATE_REQ)
        sd_master_addr_group(addr, (int)sd_master_cfg.ipv4_group_bits, ip, sizeof ip);
    else if (which == SD_RATE_UDP_BYTES)
        sd_master_addr_group(addr, 24, ip, sizeof ip);
    else
        sd_strlcpy(ip, "*", sizeof ip);
    double rate = (double)(which == SD_RATE_REQ         ? sd_master_cfg.rate_per_s
                           : which == SD_RATE_UDP_BYTES ? sd_master_cfg.udp_reply_bytes_per_s
                                                        : sd_master_cfg.udp_reply_bytes_total_per_s);
    double burst = rate * 2;
    uint64_t id = fnv1a64(ip) | 1;
    uint32_t h = (uint32_t)(id >> 32) % RATE_SLOTS;
    pthread_mutex_t *mu = &rate_mu[h % RATE_LOCKS];
    struct rate_slot *s = &rate_slots[which][h];
    int64_t now = sd_mono_us();
    int wait = 0;
    pthread_mutex_lock(mu);
    if (s->id != id) {
        s->id = id;
        s->tokens = burst;
        s->at_us = now;
    }
    s->tokens += (double)(now - s->at_us) / 1e6 * rate;
    if (s->tokens > burst)
        s->tokens = burst;
    s->at_us = now;
    if (s->tokens >= (double)cost) {
        s->tokens -= (double)cost;
    } else {
        wait = (int)(((double)cost - s->tokens) / rate) + 1;
    }
    pthread_mutex_unlock(mu);
    return wait;
}

/* ---------- store calls ---------- */

/* Starts the argv of a master script: the key base "<prefix>master:" as its one key,
 * then now (wall ms) as its first argument. The caller frees a with sd_argv_free. */
static void master_argv_init(sd_argv_t *a, int64_t now)
{
    sd_argv_init(a);
    sd_argv_add(a, sd_master_base());
    sd_argv_addf(a, "%lld", (long long)now);
}

/* The serverdir_master_servers gauge: servers in this copy's index. */
static int master_servers_gauge(double *value)
{
    *value = (double)sd_master_index_count();
    return 0;
}

static int master_index_bytes_gauge(double *value)
{
    *value = (double)sd_master_index_bytes();
    return 0;
}

void sd_master_metrics_init(void)
{
    sd_metric_gauge("serverdir_master_servers",
                    "Servers listed on the master list now (this copy's index)",
                    master_servers_gauge);
    sd_metric_gauge("serverdir_master_index_bytes",
                    "Bytes of this copy's master-list index: records, hash table, snapshot vectors",
                    master_index_bytes_gauge);
}

/* Turns a script reply into 0 / SD_MASTER_REFUSED (typed error "code [n]") / store error.
 * Frees nothing: the caller owns r. */
static int script_refusal(redisReply *r, sd_master_refusal_t *why)
{
    if (r->type != REDIS_REPLY_ERROR && r->type != REDIS_REPLY_STRING)
        return 0;
    memset(why, 0, sizeof *why);
    const char *sp = strchr(r->str, ' ');
    size_t n = sp ? (size_t)(sp - r->str) : strlen(r->str);
    if (n >= sizeof why->code)
        n = sizeof why->code - 1;
    memcpy(why->code, r->str, n);
    why->code[n] = '\0';
    if (sp)
        why->n = strtoll(sp + 1, NULL, 10);
    return SD_MASTER_REFUSED;
}

int sd_master_forget_instances(const char *cluster, int n, const char *const *instances,
                               int *removed)
{
    if (n > SD_MASTER_FORGET_MAX)
        return SD_STORE_ERROR;
    for (int i = 0; i < n; i++)
        removed[i] = -1;
    if (n <= 0)
        return SD_STORE_OK;
    /* every item's one key is the master list's prefix: one slot, one call */
    int64_t now = sd_wall_ms();
    sd_argv_t *avs = malloc((size_t)n * sizeof *avs), *items[SD_MASTER_FORGET_MAX]; /* 3.6 KB each */
    if (!avs)
        return SD_STORE_ERROR;
    int nkeys[SD_MASTER_FORGET_MAX], rcs[SD_MASTER_FORGET_MAX];
    redisReply *outs[SD_MASTER_FORGET_MAX];
    for (int i = 0; i < n; i++) {
        master_argv_init(&avs[i], now);
        sd_argv_addf(&avs[i], "%s/%s", cluster, instances[i]);
        sd_argv_addf(&avs[i], "%d", SD_MASTER_LOG_MAXLEN);
        items[i] = &avs[i];
        nkeys[i] = 1;
    }
    int rc = sd_store_run_many("master_forget_instance", n, items, nkeys, rcs, outs);
    for (int i = 0; i < n; i++) {
        sd_argv_free(&avs[i]);
        if (rc != SD_STORE_OK || rcs[i] != SD_STORE_OK)
            continue;
        removed[i] = outs[i]->type == REDIS_REPLY_STRING;
        if (outs[i]->type == REDIS_REPLY_ERROR) {
            log_error("master entry removal failed", "cluster=%s instance=%s error=\"%s\"",
                      cluster, instances[i], outs[i]->str);
            removed[i] = -1;
        } else if (removed[i]) {
            sd_master_apply_lock();
            sd_master_index_del(outs[i]->str);
            sd_master_apply_unlock();
        }
        freeReplyObject(outs[i]);
    }
    free(avs);
    return rc;
}

int sd_master_challenge(char kind, const char *bind, char *chal, size_t chalcap,
                        int64_t probe_ms, sd_master_refusal_t *why)
{
    memset(why, 0, sizeof *why);
    if (sd_master_chal_make(kind, bind, chal, chalcap)) {
        sd_strlcpy(why->code, "no_key", sizeof why->code);
        return SD_MASTER_REFUSED;
    }
    /* A heartbeat from a listed Q3/DP server: unless the getinfo is answered within
     * probe_ms, the server is shutting down (docs/master.md, "Shutdown"). A REST or
     * GoldSrc server never answers a getinfo: a heartbeat spoofed from its address must
     * not start a probe of it. */
    if (probe_ms > 0 && sd_master_index_listed_by(bind, "q3"))
        sd_master_write_probe(bind, sd_wall_ms() + probe_ms);
    return 0;
}

/* Lowercases src into dst (filters compare game and map without case). */
static void lower(char *dst, const char *src, size_t cap)
{
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++)
        dst[i] = (char)tolower((unsigned char)src[i]);
    dst[i] = '\0';
}

/* The record builder: appends to out without a format string (every registration
 * builds one); at stays past cap once anything did not fit. */
struct rec_out {
    char *out;
    size_t cap, at;
};

static void rec_str(struct rec_out *r, const char *s, int sep)
{
    size_t n = strlen(s);
    if (r->at + n + 1 < r->cap)
        memcpy(r->out + r->at, s, n);
    r->at += n;
    if (sep) {
        if (r->at + 1 < r->cap)
            r->out[r->at] = '\x1f';
        r->at++;
    }
}

static void rec_int(struct rec_out *r, long long v, int sep)
{
    char t[24];
    size_t n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        t[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        t[n++] = '-';
    char d[24];
    for (size_t i = 0; i < n; i++)
        d[i] = t[n - 1 - i];
    d[n] = '\0';
    rec_str(r, d, sep);
}

size_t sd_master_record(const sd_master_server_t *s, const char *chal, const char *group,
                        int64_t now, int64_t exp, char *out, size_t cap)
{
    struct rec_out r = {out, cap, 0};
    if (!cap)
        return 0;
    char stamp[SD_MASTER_CHAL_MAX];
    size_t sl = sd_master_chal_stamp_len(chal);
    if (sl >= sizeof stamp)
        return 0;
    memcpy(stamp, chal, sl);
    stamp[sl] = '\0';
    rec_str(&r, stamp, 1);
    rec_str(&r, group, 1);
    rec_str(&r, s->instance, 1);
    rec_int(&r, exp, 1);
    rec_int(&r, now, 1);
    rec_str(&r, s->source ? s->source : "(null)", 1);
    rec_str(&r, s->game, 1);
    rec_str(&r, s->map, 1);
    rec_str(&r, s->name, 1);
    rec_str(&r, s->version, 1);
    rec_str(&r, s->region, 1);
    for (int i = 0; i < s->ntags; i++) {
        if (i)
            rec_str(&r, ",", 0);
        rec_str(&r, s->tags[i], 0);
    }
    rec_str(&r, "", 1);
    rec_int(&r, s->players, 1);
    rec_int(&r, s->max_players, 1);
    rec_int(&r, s->bots, 1);
    rec_int(&r, s->password, 1);
    rec_int(&r, s->dedicated, 1);
    rec_int(&r, s->secure, 1);
    rec_str(&r, s->os, 1);
    rec_int(&r, s->protocol, 1);
    rec_int(&r, s->gametype, 0);
    if (r.at >= cap)
        return 0;
    out[r.at] = '\0';
    return r.at;
}

int sd_master_accept(const char *bind, const char *challenge, const sd_master_server_t *s,
                     int *is_new, int64_t *expires_at_ms, sd_master_refusal_t *why)
{
    memset(why, 0, sizeof *why);
    const char *bad = sd_master_chal_check('r', bind, challenge);
    if (bad) {
        sd_strlcpy(why->code, bad, sizeof why->code);
        return SD_MASTER_REFUSED;
    }
    int64_t now = sd_wall_ms();
    int64_t ttl = sd_master_cfg.heartbeat_interval_s * 3000;
    char group[SD_MASTER_GROUP_MAX], rec[2048];
    sd_master_addr_group(s->ip, (int)sd_master_cfg.ipv4_group_bits, group, sizeof group);
    size_t reclen = sd_master_record(s, challenge, group, now, now + ttl, rec, sizeof rec);
    if (!reclen)
        return SD_STORE_ERROR;
    sd_argv_t a;
    master_argv_init(&a, now);
    sd_argv_addf(&a, "%lld", (long long)ttl);
    sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.servers_per_address);
    sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.max_servers);
    sd_argv_addf(&a, "%d", SD_MASTER_LOG_MAXLEN);
    sd_argv_add(&a, sd_master_copy_id()); /* applied to the index below */
    sd_argv_add(&a, "1");
    sd_argv_add(&a, s->addr);
    sd_argv_add(&a, group);
    sd_argv_add(&a, s->instance);
    sd_argv_addn(&a, rec, reclen);
    redisReply *r;
    int rc = sd_store_run("master_heartbeat", 1, &a, &r);
    if (rc) {
        sd_master_index_request_load(); /* Redis may have stored it: see the copy id */
        return rc;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 1) {
        sd_master_index_request_load();
        rc = SD_STORE_ERROR;
    } else {
        redisReply *e = r->element[0];
        rc = script_refusal(e, why);
        if (rc == 0) {
            *is_new = (int)e->integer;
            *expires_at_ms = now + ttl;
            sd_master_apply_lock();
            sd_master_index_put(s->addr, rec, reclen);
            sd_master_apply_unlock();
        }
    }
    freeReplyObject(r);
    return rc;
}

int sd_master_remove(const char *addr, const char *source, int *removed,
                     sd_master_refusal_t *why)
{
    sd_argv_t a;
    master_argv_init(&a, sd_wall_ms());
    sd_argv_add(&a, addr);
    sd_argv_addf(&a, "%d", SD_MASTER_LOG_MAXLEN);
    if (source)
        sd_argv_add(&a, source);
    redisReply *r;
    int rc = sd_store_run("master_terminate", 1, &a, &r);
    if (rc == 0) {
        rc = script_refusal(r, why);
        *removed = rc == 0;
        if (rc == 0) {
            sd_master_apply_lock();
            sd_master_index_del(addr);
            sd_master_apply_unlock();
        }
        freeReplyObject(r);
    }
    return rc;
}

int sd_master_terminate(const char *addr, const char *ip, sd_master_refusal_t *why)
{
    char key[SD_MASTER_ADDR_MAX], sip[48];
    int port, fam;
    memset(why, 0, sizeof *why);
    if (sd_master_parse_addr(addr, key, sizeof key, sip, sizeof sip, &port, &fam)) {
        sd_strlcpy(why->code, "not_listed", sizeof why->code);
        return SD_MASTER_REFUSED;
    }
    /* Only the server's own address may remove it; the address key holds its IP. */
    if (strcmp(sip, ip) != 0) {
        sd_strlcpy(why->code, sd_master_index_lookup(key, NULL, NULL) ? "address_mismatch"
                                                                           : "not_listed",
                   sizeof why->code);
        return SD_MASTER_REFUSED;
    }
    int removed;
    return sd_master_remove(key, NULL, &removed, why);
}

void sd_master_batch_free(sd_master_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        free(b->items[i]);
    free(b->items);
    free(b->lens);
    memset(b, 0, sizeof *b);
}

/* ---------- filters ---------- */

enum { OP_EQ = SD_MOP_EQ, OP_NOTEMPTY = SD_MOP_NOTEMPTY, OP_NOTFULL = SD_MOP_NOTFULL,
       OP_TAGS = SD_MOP_TAGS, OP_TRUE = SD_MOP_TRUE, OP_NOR = SD_MOP_NOR, OP_NAND = SD_MOP_NAND,
       OP_FALSE = SD_MOP_FALSE, OP_EQ_GAME = SD_MOP_EQ_GAME };
/* eq fields: record fields, or extras with FX_ offset */
#define FX 100

static int field_of(const char *a)
{
    static const struct { const char *name; int f; } map[] = {
        {"g", FX + SD_MX_GAME}, {"m", FX + SD_MX_MAP}, {"ip", FX + SD_MX_IP},
        {"r", SD_MREC_REGION}, {"pw", SD_MREC_PW}, {"d", SD_MREC_D}, {"s", SD_MREC_S},
        {"os", SD_MREC_OS}, {"pr", SD_MREC_PROTO}, {"gt", SD_MREC_GT}, {"p", SD_MREC_PLAYERS},
        {"f", 255},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, a))
            return map[i].f;
    return -1;
}

int sd_master_filter_compile(const sd_master_filter_t *f, sd_master_cfilter_t *c)
{
    memset(c, 0, sizeof *c);
    if (f->overflow)
        return -1;
    for (int i = 0; i < f->n; i++) {
        const sd_master_term_t *t = &f->t[i];
        typeof(c->t[0]) *o = &c->t[c->n++];
        if (!strcmp(t->op, "eq")) {
            int fld = field_of(t->a);
            o->op = fld < 0 ? OP_FALSE : OP_EQ;
            o->field = (uint8_t)(fld < 0 ? 0 : fld);
            o->val = t->b;
            char *end;
            long iv = strtol(t->b, &end, 10);
            if (fld == FX + SD_MX_GAME) {
                o->op = OP_EQ_GAME;
                o->gid = sd_master_game_lookup(t->b); /* 0: no interned server has it */
            } else if ((fld == SD_MREC_PROTO || fld == SD_MREC_GT || fld == SD_MREC_PLAYERS) &&
                       t->b[0] && !*end && iv >= INT32_MIN && iv <= INT32_MAX &&
                       (t->b[0] != '0' || !t->b[1]) && t->b[0] != '+' && t->b[0] != ' ') {
                /* the canonical text of a number: compare the numbers */
                o->op = fld == SD_MREC_PROTO ? SD_MOP_EQ_PROTO
                        : fld == SD_MREC_GT  ? SD_MOP_EQ_GT
                                             : SD_MOP_EQ_PLAYERS;
                o->ival = (int32_t)iv;
            }
        } else if (!strcmp(t->op, "notempty")) {
            o->op = OP_NOTEMPTY;
        } else if (!strcmp(t->op, "notfull")) {
            o->op = OP_NOTFULL;
        } else if (!strcmp(t->op, "true")) {
            o->op = OP_TRUE;
        } else if (!strcmp(t->op, "nor") || !strcmp(t->op, "nand")) {
            o->op = t->op[1] == 'o' ? OP_NOR : OP_NAND;
            o->n = (short)atoi(t->a);
        } else if (!strcmp(t->op, "tags")) {
            o->op = OP_TAGS;
            const char *p = t->b;
            while (*p && o->ntags < 16) {
                size_t len = strcspn(p, ",");
                if (len > 0 && len < 33) {
                    char low[34];
                    lower(low, p, len + 1 < sizeof low ? len + 1 : sizeof low);
                    snprintf(o->tags[o->ntags++], sizeof o->tags[0], ",%s,", low);
                }
                p += len;
                if (*p == ',')
                    p++;
            }
        } else {
            o->op = OP_FALSE;
        }
    }
    return 0;
}

int sd_master_eval_term(const sd_master_cfilter_t *c, int i, const sd_msrv_t *s, int *next)
{
    const typeof(c->t[0]) *t = &c->t[i];
    switch (t->op) {
    case OP_NOR:
    case OP_NAND: {
        int j = i + 1, any = 0, all = 1;
        for (int k = 0; k < t->n && j < c->n; k++) {
            int res = sd_master_eval_term(c, j, s, &j);
            any |= res;
            all &= res;
        }
        *next = j;
        return t->op == OP_NOR ? !any : !all;
    }
    case OP_EQ_GAME:
        *next = i + 1;
        return s->gid ? s->gid == t->gid : sd_master_lower_eq(SD_MREC(s, SD_MREC_GAME), t->val);
    case SD_MOP_EQ_PROTO:
        *next = i + 1;
        return s->protocol == t->ival;
    case SD_MOP_EQ_GT:
        *next = i + 1;
        return s->gametype == t->ival;
    case SD_MOP_EQ_PLAYERS:
        *next = i + 1;
        return s->players == t->ival;
    case OP_EQ:
        *next = i + 1;
        if (t->field == 255)
            return t->val[0] == (s->fam == 6 ? '6' : '4') && t->val[1] == '\0';
        if (t->field == FX + SD_MX_MAP)
            return sd_master_lower_eq(SD_MREC(s, SD_MREC_MAP), t->val);
        if (t->field == FX + SD_MX_IP) {
            char ip[48];
            return strcmp(sd_master_ip_of(s, ip, sizeof ip), t->val) == 0;
        }
        if (t->field >= FX) /* the game (a name with no id) */
            return sd_master_lower_eq(SD_MREC(s, SD_MREC_GAME), t->val);
        return strcmp(SD_MREC(s, t->field), t->val) == 0;
    case OP_NOTEMPTY:
        *next = i + 1;
        return s->players > 0;
    case OP_NOTFULL:
        *next = i + 1;
        return s->players < s->max_players;
    case OP_TAGS:
        *next = i + 1;
        for (int k = 0; k < t->ntags; k++)
            if (!strstr(SD_MX(s, SD_MX_TAGS), t->tags[k]))
                return 0;
        return 1;
    case OP_TRUE:
        *next = i + 1;
        return 1;
    default:
        *next = i + 1;
        return 0;
    }
}

/* ---------- queries ---------- */

static void sd_buf_putc(sd_buf_t *b, char c)
{
    sd_buf_append(b, &c, 1);
}

static void sd_buf_puts(sd_buf_t *b, const char *s)
{
    sd_buf_append(b, s, strlen(s));
}

/* Appends text as a JSON string. */
static void js_str(sd_buf_t *b, const char *s)
{
    sd_buf_putc(b, '"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            sd_buf_putc(b, '\\');
            sd_buf_putc(b, (char)ch);
        } else if (ch < 0x20) {
            sd_buf_printf(b, "\\u%04x", ch);
        } else {
            sd_buf_putc(b, (char)ch);
        }
    }
    sd_buf_putc(b, '"');
}

static void js_bool(sd_buf_t *b, const char *name, const char *v)
{
    sd_buf_printf(b, ",\"%s\":%s", name, strcmp(v, "0") && v[0] ? "true" : "false");
}

/* The server's JSON as the REST query returns it. */
static void server_json(sd_buf_t *b, const sd_msrv_t *s)
{
    sd_buf_puts(b, "{\"address\":");
    js_str(b, s->buf);
    sd_buf_puts(b, ",\"ip\":");
    char ip[48];
    js_str(b, sd_master_ip_of(s, ip, sizeof ip));
    sd_buf_printf(b, ",\"port\":%u,\"game\":", (unsigned)s->port);
    js_str(b, SD_MREC(s, SD_MREC_GAME));
    sd_buf_puts(b, ",\"map\":");
    js_str(b, SD_MREC(s, SD_MREC_MAP));
    sd_buf_puts(b, ",\"name\":");
    js_str(b, SD_MREC(s, SD_MREC_NAME));
    sd_buf_printf(b, ",\"players\":%d,\"max_players\":%d,\"bots\":%d", s->players,
                  s->max_players, atoi(SD_MREC(s, SD_MREC_BOTS)));
    js_bool(b, "password", SD_MREC(s, SD_MREC_PW));
    sd_buf_puts(b, ",\"region\":");
    js_str(b, SD_MREC(s, SD_MREC_REGION));
    sd_buf_puts(b, ",\"version\":");
    js_str(b, SD_MREC(s, SD_MREC_VERSION));
    sd_buf_puts(b, ",\"tags\":[");
    const char *t = SD_MREC(s, SD_MREC_TAGS);
    int first = 1;
    while (*t) {
        size_t len = strcspn(t, ",");
        char tag[40];
        if (len > 0 && len < sizeof tag) {
            memcpy(tag, t, len);
            tag[len] = '\0';
            if (!first)
                sd_buf_putc(b, ',');
            js_str(b, tag);
            first = 0;
        }
        t += len;
        if (*t == ',')
            t++;
    }
    sd_buf_putc(b, ']');
    js_bool(b, "dedicated", SD_MREC(s, SD_MREC_D));
    js_bool(b, "secure", SD_MREC(s, SD_MREC_S));
    sd_buf_puts(b, ",\"source\":");
    js_str(b, SD_MREC(s, SD_MREC_SOURCE));
    sd_buf_printf(b, ",\"last_heartbeat_ms\":%lld,\"expires_at_ms\":%lld", (long long)s->last_ms,
                  (long long)s->exp);
    const char *os = SD_MREC(s, SD_MREC_OS);
    sd_buf_puts(b, ",\"os\":");
    if (os[0])
        js_str(b, os);
    else
        sd_buf_puts(b, "null");
    int pr = atoi(SD_MREC(s, SD_MREC_PROTO)), gt = atoi(SD_MREC(s, SD_MREC_GT));
    if (pr >= 0)
        sd_buf_printf(b, ",\"protocol\":%d", pr);
    else
        sd_buf_puts(b, ",\"protocol\":null");
    if (gt >= 0)
        sd_buf_printf(b, ",\"gametype\":%d}", gt);
    else
        sd_buf_puts(b, ",\"gametype\":null}");
}

/* Appends one item to a batch (copied); -1 when out of memory. */
static int batch_add(sd_master_batch_t *b, const char *p, size_t n, size_t cap)
{
    if (!b->items) {
        b->items = calloc(cap ? cap : 1, sizeof *b->items);
        b->lens = calloc(cap ? cap : 1, sizeof *b->lens);
        if (!b->items || !b->lens)
            return -1;
    }
    char *copy = malloc(n + 1);
    if (!copy)
        return -1;
    memcpy(copy, p, n);
    copy[n] = '\0';
    b->items[b->n] = copy;
    b->lens[b->n++] = n;
    return 0;
}

int sd_master_query(const sd_master_filter_t *f, const char *after, int limit,
                    int want_json, sd_master_batch_t *out)
{
    memset(out, 0, sizeof *out);
    sd_master_cfilter_t cf;
    if (sd_master_filter_compile(f, &cf) || limit < 1)
        return SD_STORE_ERROR;
    sd_master_snap_t *snap = sd_master_snap_get();
    if (!snap)
        return SD_STORE_DOWN;
    int64_t now = sd_wall_ms();
    size_t i = sd_master_snap_after(snap, after);
    int64_t seen = 0;
    int rc = 0;
    sd_buf_t js;
    sd_buf_init(&js, 1 << 16);
    for (; i < snap->n && out->n < limit && seen < sd_master_cfg.scan_budget; i++, seen++) {
        const sd_msrv_t *s = snap->v[i];
        if (s->exp <= now || !sd_master_match(&cf, s))
            continue;
        if (want_json) {
            sd_buf_reset(&js);
            server_json(&js, s);
            rc = js.data ? batch_add(out, js.data, js.len, (size_t)limit) : -1;
        } else {
            rc = batch_add(out, s->buf, strlen(s->buf), (size_t)limit);
        }
        if (rc)
            break;
    }
    if (!rc && i < snap->n && i > 0)
        sd_strlcpy(out->next, snap->v[i - 1]->buf, sizeof out->next);
    sd_buf_free(&js);
    sd_master_snap_put(snap);
    if (rc) {
        sd_master_batch_free(out);
        return SD_STORE_ERROR;
    }
    return 0;
}

int sd_master_get(const char *addr, sd_buf_t *json)
{
    sd_master_snap_t *snap = sd_master_snap_get();
    if (!snap)
        return SD_STORE_DOWN;
    /* the snapshot is in address order: the first entry after the one just below addr */
    size_t lo = 0, hi = snap->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(snap->v[mid]->buf, addr) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    int rc = SD_MASTER_NOT_LISTED;
    if (lo < snap->n && strcmp(snap->v[lo]->buf, addr) == 0 && snap->v[lo]->exp > sd_wall_ms()) {
        server_json(json, snap->v[lo]);
        rc = json->data ? 0 : SD_STORE_ERROR;
    }
    sd_master_snap_put(snap);
    return rc;
}

void sd_master_count_drop(const char *proto, const char *reason)
{
    char series[160];
    snprintf(series, sizeof series,
             "serverdir_master_dropped_total{proto=\"%s\",reason=\"%s\"}", proto, reason);
    atomic_fetch_add(sd_metric_counter(series, "master-list datagrams and requests dropped, by reason"), 1);
}
