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
#include <sys/socket.h>

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

/* Issues a challenge bound to `bind` (an IP for REST, "ip:port" for UDP) counted against
 * ip's outstanding challenges. chal may be preset (GoldSrc numeric challenge) or "" to
 * generate one; on success it holds the challenge. probe_ms > 0 (the Q3/DP getinfo): when
 * `bind` is listed, it is removed unless a heartbeat answering some challenge of it comes
 * within probe_ms (a server that shuts down heartbeats once more and leaves the getinfo
 * unanswered). */
int sd_master_challenge(const char *bind, const char *ip, char *chal, size_t chalcap,
                        int64_t probe_ms, sd_master_refusal_t *why);
/* Removes the entry a heartbeat linked to instance of cluster (its stop was recorded);
 * *removed is 1 when there was one. A SD_STORE_* code. */
int sd_master_forget_instance(const char *cluster, const char *instance, int *removed);
/* One bounded sweep of expired and unanswered-probe servers (master_sweep.lua). */
int sd_master_sweep(void);
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
int sd_master_query(const sd_master_filter_t *f, const char *after, int limit,
                    int want_json, sd_master_batch_t *out);
void sd_master_batch_free(sd_master_batch_t *b);

/* Counts a dropped datagram or request by reason in /metrics. */
void sd_master_count_drop(const char *proto, const char *reason);

/* ---- UDP master front (master_udp.c) ---- */
int sd_master_udp_start(const char *hostport);
void sd_master_udp_stop(void);

#endif
