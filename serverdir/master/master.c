/* The master list core shared by the REST handlers and the UDP front: configuration,
 * canonical addresses, the per-address rate limiter, and the calls of the master_*.lua
 * scripts. See master.h for the Redis layout. */
#include "master.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd.h"
#include "sdvalid.h"

/* A challenge hash outlives its validity by this much, so reuse and expiry get their own
 * error codes instead of "unknown". */
#define CHALLENGE_KEEP_MS 60000

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
        "ipv4_group_bits", "getinfo_timeout_ms", "trusted_proxies", "udp", NULL};
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
        sd_jv_int(&v, sec, "ipv4_group_bits", 0, 24, 32, &c->ipv4_group_bits) < 0)
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
 * flood of many addresses. Each serverdir copy limits on its own. */

#define RATE_SLOTS 16384
#define RATE_LOCKS 64

static struct rate_slot {
    char ip[SD_MASTER_GROUP_MAX];
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

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
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
    uint32_t h = fnv1a(ip) % RATE_SLOTS;
    pthread_mutex_t *mu = &rate_mu[h % RATE_LOCKS];
    struct rate_slot *s = &rate_slots[which][h];
    int64_t now = sd_mono_us();
    int wait = 0;
    pthread_mutex_lock(mu);
    if (strcmp(s->ip, ip) != 0) {
        sd_strlcpy(s->ip, ip, sizeof s->ip);
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
    sd_argv_addf(a, "%smaster:", sd_store_prefix());
    sd_argv_addf(a, "%lld", (long long)now);
}

/* The serverdir_master_servers gauge: servers whose listing has not expired (one ZCOUNT
 * on the expiry index), cached for a second so frequent scrapes cost Redis nothing. */
static int master_servers_gauge(double *value)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int64_t at_ms;
    static double cached;
    int64_t now = sd_mono_ms();
    int rc = 0;
    pthread_mutex_lock(&mu);
    if (!at_ms || now - at_ms >= 1000) {
        char key[128];
        snprintf(key, sizeof key, "%smaster:exp", sd_store_prefix());
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "ZCOUNT");
        sd_argv_add(&av, key);
        sd_argv_addf(&av, "(%lld", (long long)sd_wall_ms());
        sd_argv_add(&av, "+inf");
        redisReply *r;
        rc = sd_store_command(&av, &r) == SD_STORE_OK ? 0 : -1;
        sd_argv_free(&av);
        if (rc == 0) {
            rc = r->type == REDIS_REPLY_INTEGER ? 0 : -1;
            if (rc == 0) {
                cached = (double)r->integer;
                at_ms = now;
            }
            freeReplyObject(r);
        }
    }
    *value = cached;
    pthread_mutex_unlock(&mu);
    return rc;
}

void sd_master_metrics_init(void)
{
    sd_metric_gauge("serverdir_master_servers",
                    "Servers listed on the master list now (read at most once a second)",
                    master_servers_gauge);
}

/* Turns a script reply into 0 / SD_MASTER_REFUSED (typed error "code [n]") / store error.
 * Frees nothing: the caller owns r. */
static int script_refusal(redisReply *r, sd_master_refusal_t *why)
{
    if (r->type != REDIS_REPLY_ERROR)
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

int sd_master_forget_instance(const char *cluster, const char *instance, int *removed)
{
    sd_argv_t a;
    master_argv_init(&a, sd_wall_ms());
    sd_argv_addf(&a, "%s/%s", cluster, instance);
    redisReply *r;
    int rc = sd_store_run("master_forget_instance", 1, &a, &r);
    if (rc == SD_STORE_OK) {
        *removed = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
    }
    return rc;
}

int sd_master_sweep(void)
{
    sd_argv_t a;
    master_argv_init(&a, sd_wall_ms());
    sd_argv_add(&a, "64");
    redisReply *r;
    int rc = sd_store_run("master_sweep", 1, &a, &r);
    if (rc == SD_STORE_OK)
        freeReplyObject(r);
    return rc;
}

int sd_master_challenge(const char *bind, const char *ip, char *chal, size_t chalcap,
                        int64_t probe_ms, sd_master_refusal_t *why)
{
    int preset = chal[0] != '\0';
    for (int attempt = 0; attempt < 3; attempt++) {
        if (!preset) {
            char hex[33];
            if (sd_random_hex(hex, 12))
                return SD_STORE_ERROR;
            sd_strlcpy(chal, hex, chalcap);
        }
        char group[SD_MASTER_GROUP_MAX];
        sd_argv_t a;
        master_argv_init(&a, sd_wall_ms());
        sd_argv_add(&a, bind);
        sd_argv_add(&a, sd_master_addr_group(ip, (int)sd_master_cfg.ipv4_group_bits, group,
                                             sizeof group));
        sd_argv_add(&a, chal);
        sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.challenge_ttl_ms);
        sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.challenges_per_address);
        sd_argv_addf(&a, "%d", CHALLENGE_KEEP_MS);
        sd_argv_addf(&a, "%lld", (long long)probe_ms);
        redisReply *r;
        int rc = sd_store_run("master_challenge", 1, &a, &r);
        if (rc)
            return rc;
        rc = script_refusal(r, why);
        freeReplyObject(r);
        if (rc == SD_MASTER_REFUSED && strcmp(why->code, "challenge_collision") == 0 && !preset)
            continue;
        return rc;
    }
    return SD_STORE_ERROR;
}

static void add_int_field(sd_argv_t *a, const char *name, int v)
{
    sd_argv_add(a, name);
    sd_argv_addf(a, "%d", v);
}

/* Lowercases src into dst (filters compare game and map without case). */
static void lower(char *dst, const char *src, size_t cap)
{
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++)
        dst[i] = (char)tolower((unsigned char)src[i]);
    dst[i] = '\0';
}

/* The server's JSON as the REST query returns it; rendered once per heartbeat so that a
 * query only concatenates stored texts. Caller frees. */
static char *server_json(const sd_master_server_t *s, int64_t now, int64_t exp)
{
    json_t *tags = json_array();
    for (int i = 0; i < s->ntags; i++)
        json_array_append_new(tags, json_string(s->tags[i]));
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:s, s:i, s:i, s:i, s:b, s:s, s:s, s:o,"
                          " s:b, s:b, s:s, s:I, s:I}",
                          "address", s->addr, "ip", s->ip, "port", s->port, "game", s->game,
                          "map", s->map, "name", s->name, "players", s->players,
                          "max_players", s->max_players, "bots", s->bots, "password",
                          s->password, "region", s->region, "version", s->version, "tags", tags,
                          "dedicated", s->dedicated, "secure", s->secure, "source", s->source,
                          "last_heartbeat_ms", (json_int_t)now, "expires_at_ms", (json_int_t)exp);
    if (!o)
        return NULL;
    json_object_set_new(o, "os", s->os[0] ? json_string(s->os) : json_null());
    json_object_set_new(o, "protocol", s->protocol >= 0 ? json_integer(s->protocol) : json_null());
    json_object_set_new(o, "gametype", s->gametype >= 0 ? json_integer(s->gametype) : json_null());
    char *txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return txt;
}

int sd_master_accept(const char *bind, const char *challenge, const sd_master_server_t *s,
                     int *is_new, int64_t *expires_at_ms, sd_master_refusal_t *why)
{
    int64_t now = sd_wall_ms();
    int64_t ttl = sd_master_cfg.heartbeat_interval_s * 3000;
    char *json = server_json(s, now, now + ttl);
    if (!json)
        return SD_STORE_ERROR;
    char tags[16 * 34 + 2] = ",", g[65], m[65];
    for (int i = 0; i < s->ntags; i++) {
        char t[33];
        lower(t, s->tags[i], sizeof t);
        strcat(strcat(tags, t), ",");
    }
    lower(g, s->game, sizeof g);
    lower(m, s->map, sizeof m);

    char group[SD_MASTER_GROUP_MAX];
    sd_argv_t a;
    master_argv_init(&a, now);
    sd_argv_add(&a, bind);
    sd_argv_add(&a, challenge);
    sd_argv_add(&a, s->addr);
    sd_argv_add(&a, sd_master_addr_group(s->ip, (int)sd_master_cfg.ipv4_group_bits, group,
                                         sizeof group));
    sd_argv_addf(&a, "%lld", (long long)ttl);
    sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.servers_per_address);
    sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.max_servers);
    sd_argv_add(&a, g);
    sd_argv_add(&a, "m");
    sd_argv_add(&a, m);
    sd_argv_add(&a, "r");
    sd_argv_add(&a, s->region);
    sd_argv_add(&a, "t");
    sd_argv_add(&a, tags);
    sd_argv_add(&a, "os");
    sd_argv_add(&a, s->os);
    add_int_field(&a, "p", s->players);
    add_int_field(&a, "x", s->max_players);
    add_int_field(&a, "pw", s->password);
    add_int_field(&a, "d", s->dedicated);
    add_int_field(&a, "s", s->secure);
    add_int_field(&a, "pr", s->protocol);
    add_int_field(&a, "gt", s->gametype);
    add_int_field(&a, "f", s->family);
    sd_argv_add(&a, "ip");
    sd_argv_add(&a, s->ip);
    sd_argv_add(&a, "in");
    sd_argv_add(&a, s->instance);
    /* The j column and the P jlist member: "addr \1 expires_at_ms \1 JSON". */
    sd_argv_add(&a, "j");
    sd_argv_addf(&a, "%s\x01%lld\x01%s", s->addr, (long long)(now + ttl), json);
    redisReply *r;
    int rc = sd_store_run("master_heartbeat", 1, &a, &r);
    free(json);
    if (rc)
        return rc;
    rc = script_refusal(r, why);
    if (rc == 0) {
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            rc = SD_STORE_ERROR;
        } else {
            *is_new = (int)r->element[0]->integer;
            *expires_at_ms = r->element[1]->integer;
        }
    }
    freeReplyObject(r);
    return rc;
}

int sd_master_terminate(const char *addr, const char *ip, sd_master_refusal_t *why)
{
    sd_argv_t a;
    master_argv_init(&a, sd_wall_ms());
    sd_argv_add(&a, addr);
    sd_argv_add(&a, ip);
    redisReply *r;
    int rc = sd_store_run("master_terminate", 1, &a, &r);
    if (rc)
        return rc;
    rc = script_refusal(r, why);
    freeReplyObject(r);
    return rc;
}

void sd_master_batch_free(sd_master_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        free(b->items[i]);
    free(b->items);
    free(b->lens);
    memset(b, 0, sizeof *b);
}

/* The index a query walks: a game named by a top-level "eq g" term (one before any
 * nor/nand group) has its own sorted set, so a game's batch never scans other games.
 * Returns that term's position, or -1 for the whole list. */
static int game_index_term(const sd_master_filter_t *f)
{
    for (int i = 0; i < f->n; i++) {
        if (!strcmp(f->t[i].op, "nor") || !strcmp(f->t[i].op, "nand"))
            return -1;
        if (!strcmp(f->t[i].op, "eq") && !strcmp(f->t[i].a, "g"))
            return i;
    }
    return -1;
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

/* The unfiltered walk, the most common big read: one ZRANGEBYLEX on P jlist, whose
 * members carry "addr \1 expiry \1 JSON", so no script copies the JSON through Lua.
 * Items are the JSON texts (want_json) or the addresses. Expired members not yet swept
 * are skipped here. */
static int query_jlist(const char *after, int limit, int want_json, sd_master_batch_t *out)
{
    char key[96], min[SD_MASTER_ADDR_MAX + 2];
    snprintf(key, sizeof key, "%smaster:jlist", sd_store_prefix());
    if (after[0])
        snprintf(min, sizeof min, "[%s\x02", after); /* past every "after \1 ..." member */
    else
        sd_strlcpy(min, "-", sizeof min);
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "ZRANGEBYLEX");
    sd_argv_add(&a, key);
    sd_argv_add(&a, min);
    sd_argv_add(&a, "+");
    sd_argv_add(&a, "LIMIT");
    sd_argv_add(&a, "0");
    sd_argv_addf(&a, "%d", limit);
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    int64_t now = sd_wall_ms();
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        const char *s1 = e->type == REDIS_REPLY_STRING ? memchr(e->str, '\x01', e->len) : NULL;
        const char *s2 = s1 ? memchr(s1 + 1, '\x01', e->len - (size_t)(s1 + 1 - e->str)) : NULL;
        if (!s2 || (size_t)(s1 - e->str) >= sizeof out->next) {
            rc = SD_STORE_ERROR;
            break;
        }
        if (i + 1 == r->elements && (int)r->elements == limit) {
            memcpy(out->next, e->str, (size_t)(s1 - e->str));
            out->next[s1 - e->str] = '\0';
        }
        if (strtoll(s1 + 1, NULL, 10) <= now)
            continue;
        int bad = want_json ? batch_add(out, s2 + 1, e->len - (size_t)(s2 + 1 - e->str), r->elements)
                            : batch_add(out, e->str, (size_t)(s1 - e->str), r->elements);
        if (bad) {
            rc = SD_STORE_ERROR;
            break;
        }
    }
    freeReplyObject(r);
    if (rc)
        sd_master_batch_free(out);
    return rc;
}

int sd_master_query(const sd_master_filter_t *f, const char *after, int limit,
                    int want_json, sd_master_batch_t *out)
{
    memset(out, 0, sizeof *out);
    if (f->overflow)
        return SD_STORE_ERROR;
    if (f->n == 0)
        return query_jlist(after, limit, want_json, out);
    int gi = game_index_term(f);
    sd_argv_t a;
    master_argv_init(&a, sd_wall_ms());
    sd_argv_add(&a, after);
    sd_argv_addf(&a, "%d", limit);
    sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.scan_budget);
    sd_argv_add(&a, want_json ? "j" : "a");
    sd_argv_add(&a, gi >= 0 ? f->t[gi].b : "");
    sd_argv_addf(&a, "%d", f->n - (gi >= 0));
    for (int i = 0; i < f->n; i++) {
        if (i == gi)
            continue;
        sd_argv_add(&a, f->t[i].op);
        sd_argv_add(&a, f->t[i].a);
        sd_argv_add(&a, f->t[i].b);
    }
    redisReply *r;
    int rc = sd_store_run("master_query", 1, &a, &r);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    sd_strlcpy(out->next, r->element[0]->str, sizeof out->next);
    size_t n = r->elements - 1;
    out->items = calloc(n ? n : 1, sizeof *out->items);
    out->lens = calloc(n ? n : 1, sizeof *out->lens);
    if (!out->items || !out->lens) {
        freeReplyObject(r);
        sd_master_batch_free(out);
        return SD_STORE_ERROR;
    }
    for (size_t i = 0; i < n; i++) {
        redisReply *e = r->element[i + 1];
        if (e->type != REDIS_REPLY_STRING)
            continue;
        out->items[out->n] = malloc(e->len + 1);
        if (!out->items[out->n])
            break;
        memcpy(out->items[out->n], e->str, e->len + 1);
        out->lens[out->n] = e->len;
        out->n++;
    }
    freeReplyObject(r);
    return 0;
}

void sd_master_count_drop(const char *proto, const char *reason)
{
    char series[160];
    snprintf(series, sizeof series,
             "serverdir_master_dropped_total{proto=\"%s\",reason=\"%s\"}", proto, reason);
    atomic_fetch_add(sd_metric_counter(series, "master-list datagrams and requests dropped, by reason"), 1);
}
