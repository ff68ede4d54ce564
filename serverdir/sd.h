/* serverdir internals: the request/response model every api_*.c handler uses, the
 * route declaration macro, roles, Redis access (store.c) and metrics (metrics.c).
 *
 * A handler is declared next to its body with one line at file scope:
 *
 *     SD_ROUTE(PUT, "/v1/locks/{key}", SD_R_GAME, 0, h_lock_acquire);
 *
 * The build scans serverdir/<part>/api_*.c for these lines and generates the route table
 * (routes_gen.c), so adding a route is one line beside its handler. Lua scripts in
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
#include "sdutil.h"

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

#define SD_MAX_PARAMS 4
#define SD_ERRMSG_MAX 256

typedef struct sd_req {
    struct MHD_Connection *conn;
    const char *method;
    const char *path;
    const char *params[SD_MAX_PARAMS]; /* path parameters, in pattern order */
    int nparams;
    sd_buf_t body;
    unsigned role;                     /* one SD_R_* bit (SD_R_OPS in open mode) */
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

typedef int (*sd_handler_fn)(sd_req_t *req, sd_resp_t *resp);

typedef struct sd_route {
    const char *method;
    const char *pattern;
    unsigned roles;
    unsigned flags;
    sd_handler_fn fn;
} sd_route_t;

#define SD_ROUTE(method, pattern, roles, flags, fn) int fn(sd_req_t *req, sd_resp_t *resp)

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
/* Validates a path parameter as an sd_name; on failure sets 400 `bad_name`, returns -1. */
int sd_req_name(const sd_req_t *req, sd_resp_t *resp, int idx, const char *what,
                const char **out);

/* ---- parking a request (http.c): long waits without holding a worker thread ----
 * A handler that has to wait (a lock wait, a long-poll) calls sd_req_park(req) and
 * returns without answering; its worker thread goes on serving other connections. Later
 * another thread fills the handler's resp (req and resp stay valid while parked) and
 * calls sd_req_resume(req) exactly once; the answer is sent then. A parked request
 * counts as in flight: shutdown waits for it within its grace, and parked work should
 * finish early once sd_http_stopping() is true. */
void sd_req_park(sd_req_t *req);
void sd_req_resume(sd_req_t *req);
int sd_http_stopping(void);

/* ---- response helpers (http.c). Each returns 0 so handlers can `return sd_resp_...` ---- */
int sd_resp_json(sd_resp_t *resp, int status, json_t *v); /* steals v */
int sd_resp_error(sd_resp_t *resp, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Like sd_resp_error, adding the fields of `extra` (stolen) to the error object. */
int sd_resp_error_extra(sd_resp_t *resp, int status, const char *code, json_t *extra,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
int sd_resp_bytes(sd_resp_t *resp, int status, const char *ctype, const void *p, size_t n);
int sd_resp_empty(sd_resp_t *resp, int status);
void sd_resp_header(sd_resp_t *resp, const char *name, const char *value);
/* Maps a store error (SD_STORE_*) to 503 with Retry-After, or 500. */
int sd_resp_store_error(sd_resp_t *resp, int err);

/* ---- store.c: Redis, one connection per worker thread ---- */
enum {
    SD_STORE_OK = 0,
    SD_STORE_DOWN = -1,   /* cannot reach Redis: 503 + Retry-After */
    SD_STORE_ERROR = -2,  /* Redis answered with an unexpected error */
};

typedef struct {
    const char *argv[64];
    size_t argl[64];
    char *owned[64];
    int argc, nowned, overflow;
} sd_argv_t;

void sd_argv_init(sd_argv_t *a);
void sd_argv_add(sd_argv_t *a, const char *s);
void sd_argv_addn(sd_argv_t *a, const char *p, size_t n);
void sd_argv_addf(sd_argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sd_argv_free(sd_argv_t *a);

int sd_store_init(const char *url, const char *key_prefix);
/* Starts the store's background thread (Sentinel mode: the failover subscriber) after
 * sd_store_init, with the signals blocked; sd_store_stop joins it. 0 or -errno. */
int sd_store_start(void);
void sd_store_stop(void);
void sd_store_thread_close(void);
/* Runs the embedded script `name` with the first nkeys entries of a as KEYS and the rest
 * as ARGV (EVALSHA, loading it after NOSCRIPT). On success *out is a reply the caller
 * frees with freeReplyObject; a Lua error_reply comes back as *out of type
 * REDIS_REPLY_ERROR with SD_STORE_OK, so scripts can return typed errors. */
int sd_store_script(const char *name, int nkeys, sd_argv_t *a, redisReply **out);
/* Runs one plain command (argv form). Same reply ownership as sd_store_script. */
int sd_store_command(sd_argv_t *a, redisReply **out);
/* Opens a connection of the caller's own to the current primary (under Sentinel, the one
 * the sentinels name; AUTH and SELECT done), for a subscriber that cannot share the
 * thread's command connection. NULL when Redis is unreachable; the caller frees it with
 * redisFree. */
redisContext *sd_store_connect(void);
/* PING with the thread's connection; 0 if Redis answers. */
int sd_store_ping(void);
/* "sd:{cluster}:" + formatted suffix into buf; returns buf. */
const char *sd_key(char *buf, size_t cap, const char *cluster, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *sd_store_prefix(void);

typedef struct {
    const char *name;
    const char *body;
} sd_script_src_t;
extern const sd_script_src_t sd_script_srcs[];
extern const size_t sd_nscripts;
/* Static web files (serverdir/http/www/NAME.html), embedded the same way. */
extern const sd_script_src_t sd_www_srcs[];
extern const size_t sd_nwww;

/* ---- auth.c ---- */
int sd_auth_load(const char *path); /* NULL: open mode. 0 or negative errno */
int sd_auth_reload(void);
int sd_auth_open_mode(void);
/* The token file parser alone (text is modified): the number of `ROLE TOKEN` lines, or
 * -1 with the 1-based line and the reason. For tests and fuzzing; loads nothing. */
long sd_auth_parse(char *text, int *bad_line, const char **why);
/* Returns the role bit of a bearer token, or 0 when unknown. */
unsigned sd_auth_role(const char *token);
const char *sd_role_name(unsigned role);

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
    int threads;
    size_t body_max;       /* JSON bodies */
    size_t blob_max;       /* raw bodies (blobs) */
    int conn_timeout_s;
    json_t *file;          /* the whole --config file (sections for modules), or NULL */
} sd_config_t;
extern sd_config_t sd_cfg;

/* Applies the top level of a parsed --config file to cfg (config.c): the known keys
 * only, each within its bounds, the "directory" section loaded; cfg->file = root
 * (borrowed). *log_level: the level named by "log_level", or -1. All or nothing:
 * returns 0, or -1 with err naming the field and cfg unchanged. */
int sd_config_apply(json_t *root, sd_config_t *cfg, int *log_level, char *err, size_t errcap);

#endif
