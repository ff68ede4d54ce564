/* master/: the master list of public game servers, over REST and the UDP protocols. */
/* The master list of public game servers: configuration, the server record, the filter
 * program, per-address rate limiting and the Redis operations shared by the REST
 * handlers (api_master.c) and the UDP master front (master_udp.c).
 *
 * Redis layout, all under <prefix>master: (P below):
 *   P list          zset, every listed server's address key with score 0 (ZRANGEBYLEX
 *                   gives the stable cursor order "ip:port" / "[v6]:port")
 *   P exp           zset, address key -> expiry (ms); swept lazily by the scripts
 *   P jlist         zset, score 0, one member per server "addr \1 expiry \1 JSON" (the
 *                   j column): the unfiltered JSON walk is one ZRANGEBYLEX, no script
 *   P c:<column>    hash per column, address key -> value: ip, g game, m map (both
 *                   lowercased), r region, t ",tags,", os, p players, x max players,
 *                   pw password, d dedicated, s secure, pr protocol, gt gametype, f family,
 *                   j "addr \1 expiry \1 JSON" rendered at heartbeat time. Column-wise
 *                   so a batch reads each column it filters on with one HMGET per
 *                   chunk of servers.
 *   P g:<game>      zset, the listed servers of one game (lowercased), score 0: the
 *                   index a query for one game walks instead of the whole list
 *   P ip:<ip>       zset, address keys listed from one IP -> expiry (servers per address)
 *   P ch:<c>        hash, one challenge {b: bound address, i: ip, e: expiry, u: used}
 *   P chn:<ip>      zset, outstanding challenges of one IP -> expiry
 * Every change is one Lua script (master/lua/master_*.lua). Typed script errors are
 * "code n" (always with a space: Redis 7 prefixes a lone word with ERR). */
#ifndef SD_MASTER_H
#define SD_MASTER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "sdutil.h"

#define SD_MASTER_ADDR_MAX 64   /* "[v6]:port" */
#define SD_MASTER_CHAL_MAX 40
#define SD_MASTER_MAX_TERMS 16  /* filter program length */
#define SD_MASTER_MAX_UDP 8     /* --master-udp listeners */

typedef struct {
    int64_t heartbeat_interval_s; /* servers are listed for 3 x this */
    int64_t challenge_ttl_ms;
    int64_t servers_per_address;
    int64_t challenges_per_address;
    int64_t rate_per_s;           /* requests per second per address (REST and UDP) */
    int64_t max_servers;          /* the whole list */
    int64_t max_batch;            /* cap of `limit` */
    int64_t default_batch;
    int64_t scan_budget;          /* entries a query looks at per batch */
    int64_t udp_reply_bytes_per_s; /* UDP reply budget per source address */
    int64_t getinfo_timeout_ms;   /* a listed Q3/DP server that heartbeats and leaves the
                                     getinfo unanswered this long is removed; 0: never */
    int64_t udp_reply_bytes_total_per_s; /* UDP reply budget of all destinations together */
    int64_t ipv4_group_bits;      /* 32: quotas per IPv4 address; 24: per /24 (IPv6: /64) */
    int64_t challenge_key_rotate_s; /* the challenge secret is replaced this often */
    int64_t udp_workers;          /* threads (SO_REUSEPORT sockets) per UDP listener; 0: one per CPU */
    char trusted[16][64];         /* trusted proxies (exact IPs, canonical form) */
    int ntrusted;
    char udp[SD_MASTER_MAX_UDP][128]; /* "host:port" listeners from master.udp */
    int nudp;
} sd_master_cfg_t;
extern sd_master_cfg_t sd_master_cfg;

/* Loads the "master" section of the --config file (NULL: keep the defaults) into
 * sd_master_cfg, all or nothing. Returns 0, or -1 with a message naming the field in err
 * and sd_master_cfg unchanged. Called by sd_config_apply. */
int sd_master_config_load(const json_t *section, char *err, size_t errcap);
/* Registers the master list's gauges (serverdir_master_servers) with metrics.c. */
void sd_master_metrics_init(void);

/* One server as a heartbeat describes it. Strings are NUL-terminated and validated by
 * the caller's parser (printable, no backslash). */
typedef struct {
    char addr[SD_MASTER_ADDR_MAX]; /* address key: "1.2.3.4:27960" or "[::1]:27960" */
    char ip[48];
    int port;
    int family;                    /* 4 or 6 */
    char game[65];
    char map[65];
    char name[129];
    char version[33];
    char region[33];
    char tags[16][33];
    int ntags;
    int players, max_players, bots;
    int password, dedicated, secure;
    char os[2];                    /* "l", "w", "m" or "" */
    int protocol;                  /* -1 when unknown */
    int gametype;                  /* -1 when unknown */
    const char *source;            /* "rest", "q3" or "goldsrc" */
    char instance[258]; /* "cluster/instance" of a supervised server (2 names), or "" */
} sd_master_server_t;

/* Fills s from a POST /v1/master/heartbeat body (the address is not in it: the caller
 * sets it from the connection) and points *chal into the body. Returns 0, or -1 with a
 * message naming the field. */
int sd_master_heartbeat_parse(json_t *body, sd_master_server_t *s, const char **chal, char *err,
                              size_t errcap);

/* A filter program: terms ANDed at top level; "nor N"/"nand N" combine the next N terms.
 * Ops: eq FIELD VALUE (string equality on a stored field), notempty, notfull,
 * tags "" "T1,T2" (every tag present), true, nor N, nand N. Fields: g game, m map (both lowercased), r region, pw password, d
 * dedicated, s secure, os, pr protocol, gt gametype, f family, p players. */
typedef struct {
    char op[10];
    char a[8];
    char b[65];
} sd_master_term_t;

typedef struct {
    sd_master_term_t t[SD_MASTER_MAX_TERMS];
    int n;
    int overflow;
} sd_master_filter_t;

void sd_master_filter_add(sd_master_filter_t *f, const char *op, const char *a, const char *b);

/* ---- addresses ---- */
/* Canonical address key for ip + port; returns 0 or -1 when ip is not an IP. Fills the
 * canonical ip text and family too (any of the out pointers may be NULL). */
int sd_master_addr_key(const char *ip, int port, char *key, size_t keycap, char *ipout,
                       size_t ipcap, int *family);
int sd_master_addr_from_sockaddr(const struct sockaddr *sa, char *key, size_t keycap,
                                 char *ip, size_t ipcap, int *port);
/* Parses "ip:port" / "[v6]:port" into the canonical key; 0 or -1. */
int sd_master_parse_addr(const char *s, char *key, size_t keycap, char *ip, size_t ipcap,
                         int *port, int *family);

/* ---- per-address request rate (in-process token bucket per serverdir copy) ---- */
enum { SD_RATE_REQ = 0, SD_RATE_UDP_BYTES = 1, SD_RATE_UDP_TOTAL = 2 };
/* Takes cost units from a token bucket (burst twice the rate); returns 0, or the seconds
 * to wait (>= 1) when the bucket is short. SD_RATE_REQ: requests of ip's quota group
 * (rate_per_s); SD_RATE_UDP_BYTES: reply bytes to ip's /24 or /64
 * (udp_reply_bytes_per_s); SD_RATE_UDP_TOTAL: reply bytes to every destination together
 * (udp_reply_bytes_total_per_s; ip is ignored). */
int sd_master_rate_take(int which, const char *ip, int64_t cost);

/* ---- store operations; each returns 0, a negative SD_STORE_* value, or SD_MASTER_REFUSED
 * with the script's error code (e.g. "challenge_used") and detail in code/detail ---- */
#define SD_MASTER_REFUSED 1

typedef struct {
    char code[48];
    int64_t n; /* retry-after ms for limits, 0 otherwise */
} sd_master_refusal_t;

/* The group an address is counted in (docs/master.md, "Limits"): an IPv6 address's /64
 * ("2001:db8:0:1::/64"), an IPv4 address's /24 when v4bits is 24 ("192.0.2.0/24"), else
 * the address itself. Returns out. */
const char *sd_master_addr_group(const char *ip, int v4bits, char *out, size_t cap);
#define SD_MASTER_GROUP_MAX 64

/* Issues a stateless challenge of kind ('r' REST, bound to an IP; 'q' Q3/DP, bound to
 * "ip:port") into chal. probe_ms > 0 (the Q3/DP getinfo): when `bind` is listed by the
 * Q3/DP protocol, it is removed unless a heartbeat answering a challenge of it comes
 * within probe_ms (a server that shuts down heartbeats once more and leaves the getinfo
 * unanswered); an entry REST or GoldSrc listed is not probed (anyone can send a
 * heartbeat from its address, and it would never answer). 0, or
 * SD_MASTER_REFUSED "no_key" while no secret could be read from Redis yet. */
int sd_master_challenge(char kind, const char *bind, char *chal, size_t chalcap,
                        int64_t probe_ms, sd_master_refusal_t *why);
#define SD_MASTER_FORGET_MAX 64 /* instances per call of master_forget_instance_many.lua */
/* Removes the entries heartbeats linked to n instances of cluster (their stops were
 * recorded; at most SD_MASTER_FORGET_MAX, else SD_STORE_ERROR and nothing done), in one
 * call of master_forget_instance_many.lua:
 * removed[i] is 1 when instance i had an entry, 0 when not, -1 when its removal failed
 * (logged). A SD_STORE_* code: not SD_STORE_OK when a call as a whole failed (then the
 * removed[i] it was for are -1). */
int sd_master_forget_instances(const char *cluster, int n, const char *const *instances,
                               int *removed);
/* Accepts a heartbeat: checks the challenge (bound to `bind`), the per-address and list
 * limits, and lists the server until now + 3 x interval. *is_new says it was not listed. */
int sd_master_accept(const char *bind, const char *challenge, const sd_master_server_t *s,
                     int *is_new, int64_t *expires_at_ms, sd_master_refusal_t *why);
/* Removes addr if it was listed from ip. */
int sd_master_terminate(const char *addr, const char *ip, sd_master_refusal_t *why);

/* One batch of the list in cursor order after `after` ("" for the start). want_json: the
 * items are the servers' JSON texts, else their address keys. *next is the cursor to
 * continue from, "" when the list is done. The caller frees each item and the array. */
typedef struct {
    char **items;
    size_t *lens;
    int n;
    char next[SD_MASTER_ADDR_MAX];
} sd_master_batch_t;
/* One listed server (addr as sd_master_parse_addr normalizes it) as its JSON object,
 * from this copy's index, into json: 0, SD_MASTER_NOT_LISTED, or a store error. */
#define SD_MASTER_NOT_LISTED 404
int sd_master_get(const char *addr, sd_buf_t *json);
int sd_master_query(const sd_master_filter_t *f, const char *after, int limit,
                    int want_json, sd_master_batch_t *out);
void sd_master_batch_free(sd_master_batch_t *b);

/* Counts a dropped datagram or request by reason in /metrics. */
void sd_master_count_drop(const char *proto, const char *reason);

/* ---- stateless challenges (master_chal.c) ----
 * kind 'r' (REST, bound to the IP) or 'q' (Q3/DP, bound to "ip:port"): 24 hex digits. */
int sd_master_chal_make(char kind, const char *bind, char *out, size_t cap);
/* NULL when chal is a live challenge of kind for bind, else "unknown_challenge",
 * "challenge_expired" or "no_key" (no secret loaded yet). */
const char *sd_master_chal_check(char kind, const char *bind, const char *chal);
/* GoldSrc's 32-bit challenge for "ip:port". */
int sd_master_chal_make_u32(const char *bind, uint32_t *out);
const char *sd_master_chal_check_u32(const char *bind, uint32_t c);
/* Sets the shared secrets (64 hex digits each); 0 or -1. */
int sd_master_key_set(const char *cur_hex, const char *prev_hex);
int sd_master_key_ready(void);
/* Reads (drawing or rotating when due) the secret from Redis: a SD_STORE_* code. */
int sd_master_key_refresh(void);

/* ---- the in-memory index (master_index.c) ---- */
/* The fields of a record as P s stores it, separated by \x1f. */
enum {
    SD_MREC_CHAL, SD_MREC_GROUP, SD_MREC_INST, SD_MREC_EXP, SD_MREC_LAST, SD_MREC_SOURCE,
    SD_MREC_GAME, SD_MREC_MAP, SD_MREC_NAME, SD_MREC_VERSION, SD_MREC_REGION, SD_MREC_TAGS,
    SD_MREC_PLAYERS, SD_MREC_MAX, SD_MREC_BOTS, SD_MREC_PW, SD_MREC_D, SD_MREC_S, SD_MREC_OS,
    SD_MREC_PROTO, SD_MREC_GT, SD_MREC_N
};
/* The fields the filters read beyond the record's: game and map lowercased (compared
 * with sd_master_lower_eq on the record's text, not kept), ",tags," lowercased (kept
 * after the fields, SD_MX(s, SD_MX_TAGS)), and the IP text (the key's, sd_master_ip_of). */
enum { SD_MX_GAME, SD_MX_MAP, SD_MX_TAGS, SD_MX_IP, SD_MX_N };
#define SD_MASTER_LOG_MAXLEN 2000 /* entries the change stream P log keeps (~) */

/* A listed server as the index holds it: immutable once published. buf starts with the
 * address key, then the record's fields, then the extras (NUL-terminated each). */
typedef struct sd_msrv {
    /* what a query reads first, in one cache line */
    int64_t exp;
    uint32_t gid;          /* the lowercased game's id (sd_master_game_id), 0: none */
    int32_t protocol, gametype;
    int32_t players, max_players;
    uint16_t port;
    uint8_t fam;
    uint8_t ip[16];
    uint8_t gone;          /* taken out of the index's table (replaced or removed) */
    struct sd_msrv *hnext; /* the index's own (hash chain, retired list) */
    uint32_t hash;         /* of the key: a chain walk reads no other key */
    uint32_t mark;
    int64_t last_ms;
    uint32_t chal_hash;    /* of the last challenge (sd_master_chal_hash): its text is not kept */
    uint16_t roff[SD_MREC_N];
    uint16_t foff[SD_MX_N];    /* [SD_MX_TAGS] only */
    char buf[];
} sd_msrv_t;
#define SD_MREC(s, i) ((s)->buf + (s)->roff[i])
#define SD_MX(s, i) ((s)->buf + (s)->foff[i]) /* SD_MX_TAGS only */

/* Whether text lowercased (ASCII) equals low. */
static inline int sd_master_lower_eq(const char *text, const char *low)
{
    for (;; text++, low++) {
        char c = (*text >= 'A' && *text <= 'Z') ? (char)(*text + 32) : *text;
        if (c != *low)
            return 0;
        if (!c)
            return 1;
    }
}

/* The IP text of s's key ("1.2.3.4" of "1.2.3.4:27960", "::1" of "[::1]:27960") into out. */
const char *sd_master_ip_of(const sd_msrv_t *s, char *out, size_t cap);

/* A sorted (address key order) immutable view of the list; get/put count references. */
typedef struct sd_master_snap {
    int refs;
    size_t n;
    sd_msrv_t **v;
    size_t vbytes; /* the size v was allocated with (snap_vec_alloc) */
    sd_msrv_t *retired;
    struct sd_master_snap *newer;
} sd_master_snap_t;
sd_master_snap_t *sd_master_snap_get(void);
void sd_master_snap_put(sd_master_snap_t *s);
/* The position of the first server after key `after` ("" or NULL: 0). */
size_t sd_master_snap_after(const sd_master_snap_t *s, const char *after);

/* This copy's id in the change stream: a write that passes it to master_heartbeat must
 * apply what Redis accepted to the index itself (the stream entry is not read back). */
const char *sd_master_copy_id(void);
/* Asks the index thread to load the whole list again (a write under the copy id whose
 * answer was lost). */
void sd_master_index_request_load(void);
int sd_master_index_put(const char *key, const char *rec, size_t len);
void sd_master_index_del(const char *key);
void sd_master_index_publish(void);
size_t sd_master_index_count(void);
/* The index's memory: its records, hash table, snapshot vectors and pending keys. */
size_t sd_master_index_bytes(void);
/* 1 when key is in the index (the hash of its last challenge and its expiry copied
 * out), else 0. */
int sd_master_index_lookup(const char *key, uint32_t *chal_hash, int64_t *exp);
/* What a record keeps of a challenge: of the 32 hex digits of an HMAC challenge, the
 * first 16 (its issue time and nonce: unique per challenge issued, as the MAC that
 * follows is a function of them), which is all single use compares; other challenges
 * (GoldSrc's number) whole. Returns how many leading bytes. */
static inline size_t sd_master_chal_stamp_len(const char *chal)
{
    size_t n = strlen(chal);
    return n == 32 ? 16 : n;
}
/* The hash the index keeps of a challenge (the first n bytes of chal). */
uint32_t sd_master_chal_hash(const char *chal, size_t n);
/* 1 when key is in the index and the protocol `source` ("rest", "q3", "goldsrc") listed
 * it, or its record names no source (written before the field was checked), else 0. What
 * a UDP protocol may remove without a challenge (GoldSrc's b\n, an unanswered getinfo)
 * it removes only from its own entries (docs/master.md, "Who may remove an entry"). */
int sd_master_index_listed_by(const char *key, const char *source);
/* Held around a local "write to Redis, then apply to the index" (master_index.c). */
void sd_master_apply_lock(void);
void sd_master_apply_unlock(void);
/* Queued for the writer thread (batched into Redis); -1 when the queue is full. */
int sd_master_write_heartbeat(const char *proto, const char *addr, const char *group,
                              const char *inst, const char *rec, size_t reclen);
int sd_master_write_probe(const char *addr, int64_t deadline_ms);
/* Queues the removal of addr if the protocol proto listed it (sd_master_remove). */
int sd_master_write_terminate(const char *proto, const char *addr);
/* Starts the index thread (load, follow, sweep, key refresh) and the writer; 0 or -errno. */
int sd_master_start(void);
void sd_master_stop(void);

/* Builds the record of s (see SD_MREC_*) into out; its length, or 0 when it does not fit. */
size_t sd_master_record(const sd_master_server_t *s, const char *chal, const char *group,
                        int64_t now, int64_t exp, char *out, size_t cap);
/* Removes addr (any caller: the checks are the caller's); *removed is 1 when it was
 * listed. source: NULL removes whatever listed addr; a protocol ("goldsrc") removes it
 * only when that protocol listed it (checked in Redis, in the same script: a heartbeat of
 * another protocol cannot slip in between). SD_MASTER_REFUSED "not_listed" or
 * "other_protocol" otherwise. */
int sd_master_remove(const char *addr, const char *source, int *removed,
                     sd_master_refusal_t *why);

/* FNV-1a of a NUL-terminated text. */
uint32_t sd_master_hash(const char *s);
/* The id of a lowercased game name, interned on first sight (at most 65,536 names; past
 * that, 0: such servers are compared by text). lookup does not intern: 0 when unknown. */
uint32_t sd_master_game_id(const char *lower);
uint32_t sd_master_game_lookup(const char *lower);

/* A filter program compiled for the index: text comparisons become integer ones where
 * the field is a number (protocol, gametype, players) and a hash check first for the
 * game. */
typedef struct {
    struct {
        uint8_t op, field;
        short n;
        int32_t ival;
        uint32_t gid;
        const char *val;
        char tags[16][36];
        int ntags;
    } t[SD_MASTER_MAX_TERMS];
    int n;
} sd_master_cfilter_t;
int sd_master_filter_compile(const sd_master_filter_t *f, sd_master_cfilter_t *c);
enum {
    SD_MOP_EQ = 1, SD_MOP_NOTEMPTY, SD_MOP_NOTFULL, SD_MOP_TAGS, SD_MOP_TRUE, SD_MOP_NOR,
    SD_MOP_NAND, SD_MOP_FALSE, SD_MOP_EQ_GAME, SD_MOP_EQ_PROTO, SD_MOP_EQ_GT, SD_MOP_EQ_PLAYERS
};
/* Term i of c for s; *next: the term after it (a nor/nand takes its members). */
int sd_master_eval_term(const sd_master_cfilter_t *c, int i, const sd_msrv_t *s, int *next);

/* Whether s passes c: the common terms inline (a query runs this per listed server). */
static inline int sd_master_match(const sd_master_cfilter_t *c, const sd_msrv_t *s)
{
    int i = 0;
    while (i < c->n) {
        const typeof(c->t[0]) *t = &c->t[i];
        int ok;
        switch (t->op) {
        case SD_MOP_EQ_GAME:
            ok = s->gid ? s->gid == t->gid : sd_master_lower_eq(SD_MREC(s, SD_MREC_GAME), t->val);
            break;
        case SD_MOP_EQ_PROTO: ok = s->protocol == t->ival; break;
        case SD_MOP_EQ_GT: ok = s->gametype == t->ival; break;
        case SD_MOP_NOTEMPTY: ok = s->players > 0; break;
        case SD_MOP_NOTFULL: ok = s->players < s->max_players; break;
        case SD_MOP_TRUE: ok = 1; break;
        default:
            if (!sd_master_eval_term(c, i, s, &i))
                return 0;
            continue;
        }
        if (!ok)
            return 0;
        i++;
    }
    return 1;
}

/* ---- UDP master front (master_udp.c) ---- */
int sd_master_udp_start(const char *hostport);
void sd_master_udp_stop(void);

#endif
