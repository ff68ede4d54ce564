/* serverdir internals: the request/response model every api_*.c handler uses, the
 * route declaration macro, roles, auth and metrics; Redis access is store/store.h.
 *
 * A handler is declared next to its body with one line at file scope:
 *
 *     SD_ROUTE(PUT, "/v1/locks/{key}", SD_R_GAME, 0, h_lock_acquire);
 *
 * The build scans serverdir/<part>/api_*.c for these lines and generates the route
 * table (routes_gen.c), so adding a route is one line beside its handler. Lua scripts in
 * serverdir/<part>/lua/NAME.lua are embedded by the build and called by NAME. */
#ifndef SD_SD_H
#define SD_SD_H

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "sdjson.h"
#include "sdlog.h"
#include "sdproto.h"
#include "sdutil.h"
#include "store.h"

struct MHD_Connection;

/* ---- roles (docs/design.md, "Roles") ---- */
#define SD_R_OPS 0x1u
#define SD_R_BB 0x2u
#define SD_R_GAME 0x4u
#define SD_R_VIEWER 0x8u
#define SD_R_READERS (SD_R_OPS | SD_R_BB | SD_R_GAME | SD_R_VIEWER)
#define SD_PUBLIC 0x100u /* no token needed */

/* ---- route flags ---- */
#define SD_RAW_BODY 0x1u /* body is raw bytes (blobs): any content type, blob size cap */
/* The handler's script checks an instance credential's liveness itself (cred.h,
 * sd_cred_live_args) on standalone Redis and Sentinel; elsewhere, and on every other
 * route, the HTTP front checks it with one HMGET before the handler runs. */
#define SD_CRED_LIVE_IN_SCRIPT 0x2u
/* Where a route's handler runs (http.c, "handler threads"). By default on a handler
 * thread, so that an HTTP thread never waits on Redis. SD_HTTP_THREAD: the handler makes
 * no Redis call, it runs on the HTTP thread. SD_GROUPED: on standalone Redis and Sentinel
 * the handler hands its Redis call to a group commit (group.h) and runs on the HTTP
 * thread, deferring (sd_req_defer) what would wait; on a cluster, where it may read first,
 * and when the front must check a credential's liveness, it runs on a handler thread. */
#define SD_HTTP_THREAD 0x4u
#define SD_GROUPED 0x8u

#define SD_MAX_PARAMS 4
#define SD_ERRMSG_MAX 256

/* What a bearer token may speak for (docs/operations.md, "Tokens"): its role and, when the
 * token file binds it, a cluster, a machine of that cluster (bigbrother tokens) and a
 * holder prefix (game tokens). An empty string is unbound. */
typedef struct {
    unsigned role;
    char cluster[SD_NAME_MAX + 1];
    char machine[SD_NAME_MAX + 1];
    char holder_prefix[SD_NAME_MAX + 1];
    /* An instance credential (a signed JWT bigbrother obtained for one instance it runs,
     * docs/operations.md "Security"): role SD_R_GAME, cluster and machine set as above,
     * and these name the one instance it speaks for. cred is 0 for token-file tokens. */
    int cred;
    char service[SD_NAME_MAX + 1];
    char instance[SD_NAME_MAX + 1];
    int64_t generation;
    /* Who is asking, as a stable id that owned records (allocations) store:
     * "token:<12 hex of SHA-256 of the token>", "instance:<cluster>/<instance>" for a
     * credential, "open" in open mode. */
    char principal[SD_NAME_MAX + 32];
} sd_auth_t;

typedef struct sd_req {
    struct MHD_Connection *conn;
    const char *method;
    const char *path;
    const char *params[SD_MAX_PARAMS]; /* path parameters, in pattern order */
    int nparams;
    sd_buf_t body;
    unsigned role;                     /* one SD_R_* bit (SD_R_OPS in open mode) */
    sd_auth_t auth;                    /* role and bindings of the caller's token */
    const struct sd_route *route;
    struct sockaddr_storage peer;      /* the TCP peer (not X-Forwarded-For) */
    char peer_ip[64];
    int peer_port;
    int64_t start_us;
    int body_too_big;
} sd_req_t;

#define SD_RESP_MAX_HEADERS 8
typedef struct sd_resp {
    int status;
    const char *content_type;
    sd_buf_t body;
    char *hname[SD_RESP_MAX_HEADERS];
    char *hvalue[SD_RESP_MAX_HEADERS];
    int nheaders;
} sd_resp_t;

typedef void (*sd_handler_fn)(sd_req_t *req, sd_resp_t *resp);

typedef struct sd_route {
    const char *method;
    const char *pattern;
    unsigned roles;
    unsigned flags;
    sd_handler_fn fn;
} sd_route_t;

#define SD_ROUTE(method, pattern, roles, flags, fn) void fn(sd_req_t *req, sd_resp_t *resp)

extern const sd_route_t sd_routes[];
extern const size_t sd_nroutes;

/* ---- request helpers (http.c) ---- */
const char *sd_req_query(const sd_req_t *req, const char *name);
const char *sd_req_header(const sd_req_t *req, const char *name);
/* Parses the body as a JSON object. On failure sets a 400 error on resp and returns NULL.
 * The caller owns the returned reference. */
json_t *sd_req_json(sd_req_t *req, sd_resp_t *resp);
/* Reads an optional integer query parameter; on a bad value sets 400 and returns -1. */
int sd_req_query_int(const sd_req_t *req, sd_resp_t *resp, const char *name, int64_t min,
                     int64_t max, int64_t dflt, int64_t *out);
/* The paging query of a list by name: path parameter 0 (the cluster), `limit` (1..max,
 * default dflt) and `after` (absent, "" or a name: the `next` of a previous page, into
 * *after as "" when absent). 0, or -1 with the 400 set. */
int sd_req_page(const sd_req_t *req, sd_resp_t *resp, const char **cluster, int64_t max,
                int64_t dflt, int64_t *limit, const char **after);
/* Validates path parameters 0 (the cluster) and 1 (a name of kind `what`: "service",
 * "machine") as sd_req_name does; 0, or -1 with the 400 set. */
int sd_req_cluster_and(const sd_req_t *req, sd_resp_t *resp, const char **cluster,
                       const char *what, const char **name);
/* Validates a path parameter as an sd_name; on failure sets 400 `bad_name`, returns -1. */
int sd_req_name(const sd_req_t *req, sd_resp_t *resp, int idx, const char *what,
                const char **out);

/* ---- parking a request (http.c), the primitive under http/park.h ----
 * sd_req_park(req) suspends a request whose handler returns without answering: its
 * worker thread goes on serving other connections while req and resp stay valid. Another
 * thread later fills resp and calls sd_req_resume(req) exactly once; the answer is sent
 * then. A parked request counts as in flight: shutdown waits for it within its grace, and
 * parked work should finish early once sd_http_stopping() is true. Handlers park through
 * sd_park (park.h), which holds every parked request on one thread. */
void sd_req_park(sd_req_t *req);
void sd_req_resume(sd_req_t *req);
/* For a handler that runs on an HTTP thread (SD_GROUPED) and comes to a step that waits
 * on Redis: hands the request to a handler thread, which runs the handler again from the
 * start, and returns 1; the handler must then return at once, leaving resp untouched and
 * having freed what it allocated. Returns 0 on a handler thread: go on. */
int sd_req_defer(sd_req_t *req);
int sd_http_stopping(void);

/* ---- response helpers (http.c): a handler answers by filling resp with one of these,
 * the last call wins ---- */
void sd_resp_json(sd_resp_t *resp, int status, json_t *v); /* steals v */
/* The same answer written with the JSON writer (common/sdjson.h) straight into the body,
 * for the hottest answers: begin, write one value with w, end (a 500 when w failed). */
void sd_resp_jw_begin(sd_resp_t *resp, sd_jw_t *w);
void sd_resp_jw_end(sd_resp_t *resp, int status, sd_jw_t *w);
void sd_resp_error(sd_resp_t *resp, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Like sd_resp_error, adding the fields of `extra` (stolen) to the error object. */
void sd_resp_error_extra(sd_resp_t *resp, int status, const char *code, json_t *extra,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void sd_resp_bytes(sd_resp_t *resp, int status, const char *ctype, const void *p, size_t n);
void sd_resp_empty(sd_resp_t *resp, int status);
void sd_resp_header(sd_resp_t *resp, const char *name, const char *value);
/* Maps a store error (SD_STORE_*) to 503 with Retry-After, or 500. */
void sd_resp_store_error(sd_resp_t *resp, int err);
/* Logs a script reply the handler does not understand (a bug) and answers 500 internal.
 * r (may be NULL) stays the caller's. */
void sd_resp_bad_reply(sd_resp_t *resp, const char *script, const redisReply *r);

/* Static web files (serverdir/http/www/NAME.html), embedded like the Lua scripts. */
extern const sd_script_src_t sd_www_srcs[];
extern const size_t sd_nwww;

/* ---- auth.c ---- */
int sd_auth_load(const char *path); /* NULL: open mode. 0 or negative errno */
int sd_auth_reload(void);
int sd_auth_open_mode(void);
/* The token file parser alone (text is modified): the number of `ROLE TOKEN` lines, or
 * -1 with the 1-based line and the reason. For tests and fuzzing; loads nothing. */
long sd_auth_parse(char *text, int *bad_line, const char **why);
/* Looks a bearer token of len bytes up: fills *out (role 0 when unknown) and returns the
 * role. The comparison takes the same time whatever the token and wherever it differs. */
unsigned sd_auth_lookup(const char *token, size_t len, sd_auth_t *out);
const char *sd_role_name(unsigned role);

/* The bindings, checked by the handlers before any change. Each returns 0 when the
 * caller's token may act for the given cluster / machine of cluster / lock holder, else
 * answers 403 forbidden naming the binding and returns -1. Unbound tokens may. */
int sd_req_may_cluster(const sd_req_t *req, sd_resp_t *resp, const char *cluster);
int sd_req_may_machine(const sd_req_t *req, sd_resp_t *resp, const char *cluster,
                       const char *machine);
/* sd_req_may_hold refuses an instance credential that names another holder with 401 when
 * the credential is no longer live (a Redis read): on an HTTP thread it defers the
 * request for that (sd_req_defer), returning -1 with resp untouched. */
int sd_req_may_hold(sd_req_t *req, sd_resp_t *resp, const char *holder);
/* Answers 403 forbidden naming the caller's binding and that it may not `what`; -1. */
int sd_req_forbid(const sd_req_t *req, sd_resp_t *resp, const char *what);
/* The holder prefix the caller's token is bound to ("" when none). */
const char *sd_req_holder_prefix(const sd_req_t *req);

/* ---- metrics.c ---- */
void sd_metrics_init(size_t nroutes);
void sd_metrics_observe(int route_idx, const char *method, int status, int64_t micros);
/* A named counter ("family" or "family{label=\"v\"}") created on first use; the returned
 * pointer stays valid for the life of the process. */
_Atomic int64_t *sd_metric_counter(const char *series, const char *help);
#define SD_COUNT(series, help, n)                                                        \
    do {                                                                                 \
        static _Atomic(_Atomic int64_t *) c__;                                           \
        _Atomic int64_t *p__ = atomic_load(&c__);                                        \
        if (!p__) {                                                                      \
            p__ = sd_metric_counter(series, help);                                       \
            atomic_store(&c__, p__);                                                     \
        }                                                                                \
        atomic_fetch_add(p__, (n));                                                      \
    } while (0)
/* A gauge read at scrape time: fn runs on the worker thread serving /metrics (it may use
 * the store; keep it cheap or cached) and returns 0 with *value, or -1 to leave the
 * sample out of this scrape. series is one whole series (one gauge per family); series
 * and help must live for the life of the process.
 * Returns 0, or -1 when the gauge table is full. */
typedef int (*sd_gauge_fn)(double *value);
int sd_metric_gauge(const char *series, const char *help, sd_gauge_fn fn);
void sd_metrics_render(sd_buf_t *out);

/* ---- config (main.c) ---- */
typedef struct sd_config {
    char listen[128];
    char redis[512];
    char tokens[512];
    char key_prefix[64];
    int threads;           /* handler threads, one Redis connection each */
    int http_threads;      /* libmicrohttpd's threads (0: one per online CPU, at most 16) */
    size_t body_max;       /* JSON bodies */
    size_t blob_max;       /* raw bodies (blobs) */
    int conn_timeout_s;
    int max_connections;   /* open HTTP connections at once (each holds a 32 KiB pool) */
    /* Connection limits and deadlines (http/conn.h, docs/operations.md "Connection
     * limits"): per source address (IPv4, or IPv6 /64; 0 is no limit), time to a complete
     * request head, time to a complete body. */
    int max_connections_per_source;
    int header_timeout_ms;
    int body_timeout_ms;
    json_t *file;          /* the whole --config file (sections for modules), or NULL */
} sd_config_t;
extern sd_config_t sd_cfg;

/* Applies a parsed --config file to cfg (config.c): the known top-level keys only, each
 * within its bounds, then every module's section (directory, locks, master) through its
 * X_config_load; cfg->file = root (borrowed). *log_level: the level named by
 * "log_level", or -1. All or nothing: returns 0, or -1 with err naming the field and
 * neither cfg nor any module's settings changed. */
int sd_config_apply(json_t *root, sd_config_t *cfg, int *log_level, char *err, size_t errcap);

/* ---- the sweeper thread (sweeper.c) ---- */
/* The lost-machine sweep (every lost_sweep_ms, one serverdir copy at a time under a
 * Redis lease), the allocation deadlines, and a ready-vs-desired sample of each cluster
 * every series_interval_ms (series_sample.lua: several copies still write at most one a
 * period, and only a changed one). Runs when either period is on; start returns 0 or
 * -errno. */
int sd_sweeper_start(void);
void sd_sweeper_stop(void);

#endif
