/* The master list over REST: challenge, heartbeat, termination and the filtered, batched
 * query. See docs/master.md.
 *
 * Who may call: everything here is public (no token). Game servers run by players have
 * no token, so a token cannot be what authenticates a heartbeat; the challenge does: it
 * is handed to the caller's address and accepted only from that address, once, within
 * a few seconds, which proves the address is real and reachable (as the UDP master
 * protocols do). The caller's address is the TCP peer, or, only when the peer is a
 * configured trusted proxy, the right-most X-Forwarded-For entry that is not a trusted
 * proxy. It is never taken from the body.
 *
 * Linking an entry to a supervised instance (the heartbeat's "cluster" and "instance")
 * is the one act that needs a credential: the link lets the directory delist the entry
 * when that instance stops, so a stranger naming someone else's instance would attach
 * its entry to it. Only that instance's own credential (or an ops token) links; any other
 * caller is listed as if it had named no instance ("linked": false), and no key is
 * written for the instance it named (docs/master.md "Supervised servers"). */
#include <arpa/inet.h>
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cred.h"
#include "master.h"
#include "sd.h"
#include "sdvalid.h"

SD_ROUTE(POST, "/v1/master/challenge", SD_PUBLIC, 0, h_master_challenge);
SD_ROUTE(POST, "/v1/master/heartbeat", SD_PUBLIC, 0, h_master_heartbeat);
SD_ROUTE(DELETE, "/v1/master/servers/{addr}", SD_PUBLIC, 0, h_master_delete);
SD_ROUTE(GET, "/v1/master/servers/{addr}", SD_PUBLIC, 0, h_master_get);
SD_ROUTE(GET, "/v1/master/servers", SD_PUBLIC, 0, h_master_list);

#define XFF_MAX 1024

static int is_trusted(const char *ip)
{
    for (int i = 0; i < sd_master_cfg.ntrusted; i++)
        if (strcmp(sd_master_cfg.trusted[i], ip) == 0)
            return 1;
    return 0;
}

/* The caller's canonical IP into ip (see the file comment). On a bad X-Forwarded-For
 * from a trusted proxy sets 400 and returns -1. */
static int caller_ip(const sd_req_t *req, sd_resp_t *resp, char *ip, size_t cap)
{
    if (sd_master_addr_key(req->peer_ip, 1, NULL, 0, ip, cap, NULL)) {
        sd_resp_error(resp, 400, "bad_address", "the connection has no IP address");
        return -1;
    }
    if (!is_trusted(ip))
        return 0;
    const char *xff = sd_req_header(req, "X-Forwarded-For");
    if (!xff)
        return 0;
    size_t n = strlen(xff);
    if (n > XFF_MAX) {
        sd_resp_error(resp, 400, "bad_forwarded_for", "X-Forwarded-For is longer than %d bytes", XFF_MAX);
        return -1;
    }
    char buf[XFF_MAX + 1];
    memcpy(buf, xff, n + 1);
    /* Walk from the right: each hop appended the address it saw. */
    for (;;) {
        char *comma = strrchr(buf, ',');
        char *ent = comma ? comma + 1 : buf;
        while (*ent == ' ' || *ent == '\t')
            ent++;
        size_t el = strlen(ent);
        while (el && (ent[el - 1] == ' ' || ent[el - 1] == '\t'))
            ent[--el] = '\0';
        char canon[48];
        if (sd_master_addr_key(ent, 1, NULL, 0, canon, sizeof canon, NULL)) {
            sd_resp_error(resp, 400, "bad_forwarded_for",
                          "X-Forwarded-For must be a comma-separated list of IP addresses");
            return -1;
        }
        sd_strlcpy(ip, canon, cap);
        if (!is_trusted(canon) || !comma)
            return 0;
        *comma = '\0';
    }
}

/* 429 with Retry-After when ip is over its request rate; returns 1 when refused. */
static int rate_refused(const char *ip, sd_resp_t *resp)
{
    int wait = sd_master_rate_take(SD_RATE_REQ, ip, 1);
    if (!wait)
        return 0;
    char ra[16];
    snprintf(ra, sizeof ra, "%d", wait);
    sd_resp_header(resp, "Retry-After", ra);
    SD_COUNT("serverdir_master_rate_limited_total", "master-list requests refused by the per-address rate", 1);
    sd_resp_error(resp, 429, "rate_limited", "too many requests from %s; retry in %d s", ip, wait);
    return 1;
}

/* Maps a script refusal to its HTTP answer. */
static void refusal(sd_resp_t *resp, const sd_master_refusal_t *why)
{
    static const struct {
        const char *code;
        int status;
        const char *msg;
    } map[] = {
        {"unknown_challenge", 403, "the challenge is not one this master issued to this address"},
        {"challenge_used", 403, "the challenge was already used; ask for a new one"},
        {"challenge_expired", 403, "the challenge expired; ask for a new one"},
        {"no_key", 503, "the challenge secret is not readable from Redis yet"},
        {"too_many_servers", 429, "this address lists as many servers as it may"},
        {"list_full", 503, "the master list is full"},
        {"not_listed", 404, "no such server is listed"},
        {"address_mismatch", 403, "a server can only be removed from its own address"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(map); i++) {
        if (strcmp(map[i].code, why->code) != 0)
            continue;
        if (map[i].status == 429 || map[i].status == 503) {
            char ra[24];
            int64_t s = map[i].status == 503 ? 60 : (why->n + 999) / 1000;
            snprintf(ra, sizeof ra, "%lld", (long long)(s > 0 ? s : 1));
            sd_resp_header(resp, "Retry-After", ra);
        }
        sd_resp_error(resp, map[i].status, map[i].code, "%s", map[i].msg);
        return;
    }
    sd_resp_store_error(resp, SD_STORE_ERROR);
}

void h_master_challenge(sd_req_t *req, sd_resp_t *resp)
{
    char ip[48];
    if (caller_ip(req, resp, ip, sizeof ip) || rate_refused(ip, resp))
        return;
    char chal[SD_MASTER_CHAL_MAX] = "";
    sd_master_refusal_t why;
    int rc = sd_master_challenge('r', ip, chal, sizeof chal, 0, &why);
    if (rc == SD_MASTER_REFUSED) {
        refusal(resp, &why);
        return;
    }
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    sd_resp_json(resp, 200, json_pack("{s:s, s:I, s:s}", "challenge", chal, "expires_in_ms",
                                      (json_int_t)sd_master_cfg.challenge_ttl_ms,
                                      "address", ip));
}

/* Text a game server announces: 0x20..0x7e and UTF-8 bytes, no backslash (it separates
 * infostring fields in the UDP protocols) and no control bytes. `word`: no spaces. */
static int text_ok(const char *s, int word)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f || *p == '\\' || (word && *p == ' '))
            return 0;
    return 1;
}

static int tag_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 32)
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.')
            return 0;
    return 1;
}

/* The text fields of a heartbeat: where each goes in sd_master_server_t and how it is
 * checked (word: no spaces). */
static const struct {
    const char *key;
    int required;
    size_t max;
    int word;
    size_t off, cap;
} text_fields[] = {
#define TEXT_FIELD(key, required, word) \
    {#key, required, sizeof(((sd_master_server_t *)0)->key) - 1, word, \
     offsetof(sd_master_server_t, key), sizeof(((sd_master_server_t *)0)->key)}
    TEXT_FIELD(game, 1, 1),
    TEXT_FIELD(map, 0, 1),
    TEXT_FIELD(name, 0, 0),
    TEXT_FIELD(version, 0, 1),
    TEXT_FIELD(region, 0, 1),
#undef TEXT_FIELD
};

int sd_master_heartbeat_parse(json_t *body, sd_master_server_t *s, const char **chal, char *err,
                              size_t errcap)
{
    static const char *const keys[] = {
        "challenge", "port", "game", "map", "name", "players", "max_players", "bots",
        "password", "region", "version", "tags", "protocol", "gametype", "dedicated",
        "secure", "os", "cluster", "instance", NULL};
    static const char *const oses[] = {"l", "w", "m", NULL};
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (sd_jv_only_keys(&v, body, keys))
        return -1;
    int64_t port, players, maxp, bots = 0, proto = -1, gt = -1;
    int pw = 0, ded = 1, sec = 0, os = -1;
    if (sd_jv_str(&v, body, "challenge", 1, SD_MASTER_CHAL_MAX - 1, chal) < 0 ||
        sd_jv_int(&v, body, "port", 1, 1, 65535, &port) < 0)
        return -1;
    for (size_t i = 0; i < SD_ARRAY_LEN(text_fields); i++) {
        const char *t = NULL;
        int rc = sd_jv_str(&v, body, text_fields[i].key, text_fields[i].required,
                           text_fields[i].max, &t);
        if (rc < 0)
            return -1;
        if (rc == 1)
            continue;
        if ((text_fields[i].required && !*t) || !text_ok(t, text_fields[i].word))
            return sd_jv_fail(&v, text_fields[i].key, "must be %sprintable text without '\\'%s",
                              text_fields[i].required ? "non-empty " : "",
                              text_fields[i].word ? " or spaces" : "");
        sd_strlcpy((char *)s + text_fields[i].off, t, text_fields[i].cap);
    }
    if (sd_jv_int(&v, body, "players", 1, 0, 65535, &players) < 0 ||
        sd_jv_int(&v, body, "max_players", 1, 1, 65535, &maxp) < 0 ||
        sd_jv_int(&v, body, "bots", 0, 0, 65535, &bots) < 0 ||
        sd_jv_int(&v, body, "protocol", 0, 0, 1 << 30, &proto) < 0 ||
        sd_jv_int(&v, body, "gametype", 0, 0, 1 << 30, &gt) < 0 ||
        sd_jv_bool(&v, body, "password", 0, &pw) < 0 ||
        sd_jv_bool(&v, body, "dedicated", 0, &ded) < 0 ||
        sd_jv_bool(&v, body, "secure", 0, &sec) < 0)
        return -1;
    if (players > maxp)
        return sd_jv_fail(&v, "players", "must not exceed 'max_players'");
    if (bots > players)
        return sd_jv_fail(&v, "bots", "must not exceed 'players'");
    if (sd_jv_enum(&v, body, "os", 0, oses, &os) < 0)
        return -1;
    if (os >= 0)
        sd_strlcpy(s->os, oses[os], sizeof s->os);
    json_t *tags = NULL;
    if (sd_jv_array(&v, body, "tags", SD_JV_NONNULL, SD_ARRAY_LEN(s->tags), &tags) < 0)
        return -1;
    if (tags) {
        size_t i;
        json_t *t;
        sd_jv_key(&v, "tags");
        json_array_foreach(tags, i, t) {
            if (!json_is_string(t) || !tag_ok(json_string_value(t))) {
                sd_jv_index(&v, i);
                return sd_jv_fail(&v, NULL, "must be 1-32 characters of A-Z a-z 0-9 _ - .");
            }
            sd_strlcpy(s->tags[s->ntags++], json_string_value(t), sizeof s->tags[0]);
        }
    }
    /* A supervised server names its cluster and instance (gameproc: $BB_CLUSTER,
     * $BB_INSTANCE): the directory recording that instance stopped removes the entry. */
    const char *cl = NULL, *inst = NULL;
    if (sd_jv_name(&v, body, "cluster", 0, &cl) < 0 || sd_jv_name(&v, body, "instance", 0, &inst) < 0)
        return -1;
    if (!cl != !inst)
        return sd_jv_fail(&v, cl ? "instance" : "cluster", "is needed with '%s'",
                          cl ? "cluster" : "instance");
    if (cl)
        snprintf(s->instance, sizeof s->instance, "%s/%s", cl, inst);
    s->port = (int)port;
    s->players = (int)players;
    s->max_players = (int)maxp;
    s->bots = (int)bots;
    s->protocol = (int)proto;
    s->gametype = (int)gt;
    s->password = pw;
    s->dedicated = ded;
    s->secure = sec;
    s->source = "rest";
    return 0;
}

/* Whether the caller may link an entry to s->instance ("cluster/instance"): an ops token,
 * or the credential of exactly that instance. */
static int may_link(const sd_req_t *req, const sd_master_server_t *s)
{
    if (req->role == SD_R_OPS)
        return 1;
    if (!req->auth.cred)
        return 0;
    char own[sizeof s->instance];
    snprintf(own, sizeof own, "%s/%s", req->auth.cluster, req->auth.instance);
    return !strcmp(own, s->instance);
}

void h_master_heartbeat(sd_req_t *req, sd_resp_t *resp)
{
    char ip[48];
    if (caller_ip(req, resp, ip, sizeof ip) || rate_refused(ip, resp))
        return;
    /* The front checks no token on a public route: a credential shown here is checked
     * against the directory like anywhere else (401 credential_revoked once stopped). */
    if (req->auth.cred && sd_cred_live(req, resp))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    sd_master_server_t s;
    memset(&s, 0, sizeof s);
    const char *chal = NULL;
    char err[SD_ERRMSG_MAX];
    if (sd_master_heartbeat_parse(body, &s, &chal, err, sizeof err)) {
        json_decref(body);
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    int linked = s.instance[0] && may_link(req, &s);
    if (s.instance[0] && !linked) {
        SD_COUNT("serverdir_master_links_refused_total",
                 "master-list heartbeats that named an instance without its credential", 1);
        s.instance[0] = '\0';
    }
    sd_master_addr_key(ip, s.port, s.addr, sizeof s.addr, s.ip, sizeof s.ip, &s.family);
    int is_new = 0;
    int64_t exp = 0;
    sd_master_refusal_t why;
    int rc = sd_master_accept(ip, chal, &s, &is_new, &exp, &why);
    json_decref(body);
    if (rc == SD_MASTER_REFUSED) {
        SD_COUNT("serverdir_master_heartbeats_refused_total", "master-list heartbeats refused", 1);
        refusal(resp, &why);
        return;
    }
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    SD_COUNT("serverdir_master_heartbeats_total", "master-list heartbeats accepted", 1);
    if (is_new) {
        SD_COUNT("serverdir_master_servers_new_total", "servers that joined the master list", 1);
        /* One line per server would flood the log at 100,000 servers: debug level. */
        log_debug("master server listed", "addr=%s game=%s source=%s", s.addr, s.game, "rest");
    }
    sd_resp_json(resp, 200,
                 json_pack("{s:s, s:b, s:b, s:I, s:I}", "address", s.addr, "new", is_new,
                           "linked", linked, "expires_in_ms", (json_int_t)(exp - sd_wall_ms()),
                           "heartbeat_interval_s",
                           (json_int_t)sd_master_cfg.heartbeat_interval_s));
}

/* GET one server of the master list (what a listing shows of it), from the index. */
/* The caller's IP (rate-limited) and the path's server address, normalized: 0, or -1
 * after answering (429, 400 bad_address). */
static int addr_request(sd_req_t *req, sd_resp_t *resp, char *ip, size_t ipcap, char *addr)
{
    if (caller_ip(req, resp, ip, ipcap) || rate_refused(ip, resp))
        return -1;
    if (sd_master_parse_addr(req->params[0], addr, SD_MASTER_ADDR_MAX, NULL, 0, NULL, NULL)) {
        sd_resp_error(resp, 400, "bad_address",
                      "the server must be given as IP:PORT or [IPv6]:PORT");
        return -1;
    }
    return 0;
}

void h_master_get(sd_req_t *req, sd_resp_t *resp)
{
    char ip[48], addr[SD_MASTER_ADDR_MAX];
    if (addr_request(req, resp, ip, sizeof ip, addr))
        return;
    sd_buf_t js;
    sd_buf_init(&js, 1 << 16);
    int rc = sd_master_get(addr, &js);
    if (rc == SD_MASTER_NOT_LISTED)
        sd_resp_error(resp, 404, "not_listed", "%s is not on the master list", addr);
    else if (rc)
        sd_resp_store_error(resp, rc);
    else
        sd_resp_bytes(resp, 200, "application/json", js.data, js.len);
    sd_buf_free(&js);
}

void h_master_delete(sd_req_t *req, sd_resp_t *resp)
{
    char ip[48], addr[SD_MASTER_ADDR_MAX];
    if (addr_request(req, resp, ip, sizeof ip, addr))
        return;
    sd_master_refusal_t why;
    int rc = sd_master_terminate(addr, ip, &why);
    if (rc == SD_MASTER_REFUSED) {
        refusal(resp, &why);
        return;
    }
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    SD_COUNT("serverdir_master_servers_terminated_total", "servers removed by termination", 1);
    log_debug("master server removed", "addr=%s reason=%s", addr, "terminated");
    sd_resp_empty(resp, 204);
}

/* Reads a boolean query flag ("1"/"true"/"0"/"false"); -1 with 400 on anything else. */
static int query_flag(const sd_req_t *req, sd_resp_t *resp, const char *name, int *out)
{
    const char *v = sd_req_query(req, name);
    *out = 0;
    if (!v)
        return 0;
    if (!strcmp(v, "1") || !strcmp(v, "true")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(v, "0") || !strcmp(v, "false") || !*v)
        return 0;
    sd_resp_error(resp, 400, "bad_query", "query parameter '%s' must be 1, true, 0 or false", name);
    return -1;
}

/* Adds an eq term for a text query parameter (lowercased when `fold`); -1 with 400. */
static int query_eq(const sd_req_t *req, sd_resp_t *resp, const char *name, const char *field,
                    int fold, sd_master_filter_t *f)
{
    const char *v = sd_req_query(req, name);
    if (!v)
        return 0;
    if (strlen(v) > 64 || !text_ok(v, 1)) {
        sd_resp_error(resp, 400, "bad_query", "query parameter '%s' must be at most 64 printable characters", name);
        return -1;
    }
    char val[65];
    sd_strlcpy(val, v, sizeof val);
    if (fold)
        for (char *p = val; *p; p++)
            *p = (char)tolower((unsigned char)*p);
    sd_master_filter_add(f, "eq", field, val);
    return 0;
}

static int query_filter(const sd_req_t *req, sd_resp_t *resp, sd_master_filter_t *f)
{
    int ne, nf, np;
    if (query_eq(req, resp, "game", "g", 1, f) || query_eq(req, resp, "map", "m", 1, f) ||
        query_eq(req, resp, "region", "r", 0, f) || query_flag(req, resp, "not_empty", &ne) ||
        query_flag(req, resp, "not_full", &nf) || query_flag(req, resp, "no_password", &np))
        return -1;
    if (ne)
        sd_master_filter_add(f, "notempty", "", "");
    if (nf)
        sd_master_filter_add(f, "notfull", "", "");
    if (np)
        sd_master_filter_add(f, "eq", "pw", "0");
    const char *tags = sd_req_query(req, "tags");
    if (tags && *tags) {
        char buf[16 * 34];
        if (strlen(tags) >= sizeof buf) {
            sd_resp_error(resp, 400, "bad_query", "query parameter 'tags' is too long");
            return -1;
        }
        sd_strlcpy(buf, tags, sizeof buf);
        int n = 0;
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (!tag_ok(t) || ++n > 8) {
                sd_resp_error(resp, 400, "bad_query",
                              "query parameter 'tags' must be 1-8 comma-separated tags of A-Z a-z 0-9 _ - .");
                return -1;
            }
            for (char *p = t; *p; p++)
                *p = (char)tolower((unsigned char)*p);
            sd_master_filter_add(f, "tags", "", t);
        }
    }
    return 0;
}

void h_master_list(sd_req_t *req, sd_resp_t *resp)
{
    char ip[48];
    if (caller_ip(req, resp, ip, sizeof ip) || rate_refused(ip, resp))
        return;
    sd_master_filter_t f;
    memset(&f, 0, sizeof f);
    int64_t limit;
    if (query_filter(req, resp, &f) ||
        sd_req_query_int(req, resp, "limit", 1, 100000, sd_master_cfg.default_batch, &limit))
        return;
    if (limit > sd_master_cfg.max_batch)
        limit = sd_master_cfg.max_batch;
    const char *format = sd_req_query(req, "format");
    int text = 0;
    if (format && strcmp(format, "json") != 0) {
        if (strcmp(format, "text") != 0) {
            sd_resp_error(resp, 400, "bad_query", "query parameter 'format' must be json or text");
            return;
        }
        text = 1;
    }
    char after[SD_MASTER_ADDR_MAX] = "";
    const char *a = sd_req_query(req, "after");
    if (a && *a && sd_master_parse_addr(a, after, sizeof after, NULL, 0, NULL, NULL)) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'after' must be IP:PORT or [IPv6]:PORT");
        return;
    }

    sd_master_batch_t b;
    int rc = sd_master_query(&f, after, (int)limit, !text, &b);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }

    sd_buf_t out;
    sd_buf_init(&out, (size_t)-1 / 2);
    if (text) {
        for (int i = 0; i < b.n; i++) {
            sd_buf_append(&out, b.items[i], b.lens[i]);
            sd_buf_append(&out, "\n", 1);
        }
        if (b.next[0])
            sd_resp_header(resp, "Master-Next", b.next);
        sd_resp_bytes(resp, 200, "text/plain", out.data ? out.data : "", out.len);
    } else {
        sd_buf_append(&out, "{\"servers\":[", 12);
        for (int i = 0; i < b.n; i++) {
            if (i)
                sd_buf_append(&out, ",", 1);
            sd_buf_append(&out, b.items[i], b.lens[i]);
        }
        if (b.next[0])
            sd_buf_printf(&out, "],\"next\":\"%s\"}\n", b.next);
        else
            sd_buf_append(&out, "],\"next\":null}\n", 15);
        sd_resp_bytes(resp, 200, "application/json", out.data, out.len);
    }
    sd_buf_free(&out);
    sd_master_batch_free(&b);
}
