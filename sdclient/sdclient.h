/* libsdclient: the C client of the ServerDir REST API (libcurl + jansson).
 *
 * A client holds several base URLs, shuffled once at creation; a request goes to the
 * last URL that worked and fails over to the next one on a connection error or a 5xx
 * answer. A client object is not thread-safe: use one per thread (it keeps its
 * connections alive between requests).
 *
 * Every function returns SDC_OK (0) or a negative SDC_E_* value; on SDC_E_HTTP the
 * sdc_err_t says the HTTP status and ServerDir's error code and message. */
#ifndef SDCLIENT_H
#define SDCLIENT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SDC_OK = 0,
    SDC_E_TRANSPORT = -1, /* no base URL answered (connect error, timeout) */
    SDC_E_HTTP = -2,      /* ServerDir answered with an error status: see sdc_err_t */
    SDC_E_PROTO = -3,     /* the answer was not the JSON expected */
    SDC_E_INVAL = -4,     /* bad argument (name, URL list) */
    SDC_E_NOMEM = -5,
};

typedef struct sdc sdc_t;

typedef struct {
    long status;          /* HTTP status, 0 when no answer */
    char code[64];        /* error.code from ServerDir, e.g. "lock_held" */
    char message[256];    /* error.message, or a transport error text */
    json_t *body;         /* the whole error body (owned by the sdc_err_t; sdc_err_clear) */
} sdc_err_t;

/* urls: comma-separated base URLs ("http://a:7700,http://b:7700"); token may be NULL.
 * timeout_ms bounds each attempt. Returns NULL on a bad URL list or no memory. */
sdc_t *sdc_new(const char *urls, const char *token, int timeout_ms);
void sdc_free(sdc_t *c);
/* The base URL the next request goes to first. */
const char *sdc_current_url(const sdc_t *c);
void sdc_err_clear(sdc_err_t *err);
/* A one-line description of a failed call ("409 lock_held: ..." or the transport error). */
const char *sdc_strerror(int rc, const sdc_err_t *err, char *buf, size_t cap);

/* Generic JSON request: path is URL-relative ("/v1/..."); body may be NULL (not stolen).
 * On 2xx sets *out to the parsed body (NULL for an empty body; caller decrefs). */
int sdc_request(sdc_t *c, const char *method, const char *path, const json_t *body,
                json_t **out, sdc_err_t *err);

/* Raw request for byte bodies (blobs): extra request headers "Name: value" (NULL-
 * terminated), response bytes in *out (malloc'd, caller frees) and, when hdr_name is
 * given, that response header's value copied into hdr_value. */
int sdc_request_raw(sdc_t *c, const char *method, const char *path,
                    const char *const *headers, const void *body, size_t len, void **out,
                    size_t *outlen, const char *hdr_name, char *hdr_value, size_t hdr_cap,
                    sdc_err_t *err);

/* Percent-escapes s for use as one URL path segment or query value into buf. */
const char *sdc_escape(const char *s, char *buf, size_t cap);

/* ---- machines, processes and events ---- */

/* ---- locks and blobs ---- */

/* ---- master list ---- */

/* What a game server announces; NULL strings and a zero ntags are left out. */
typedef struct {
    int port;                   /* the game port (the IP is the caller's) */
    const char *game;           /* required */
    const char *map, *name, *region, *version;
    const char *const *tags;
    int ntags;
    int players, max_players, bots;
    int password;
    int protocol, gametype;     /* -1: not sent */
} sdc_master_server_t;

/* Asks for a challenge bound to the caller's address (POST /v1/master/challenge); copies
 * it into chal (at least 40 bytes) and its lifetime into *expires_in_ms (may be NULL). */
int sdc_master_challenge(sdc_t *c, char *chal, size_t cap, int64_t *expires_in_ms,
                         sdc_err_t *err);
/* Lists or keeps listed the server with a challenge from sdc_master_challenge
 * (POST /v1/master/heartbeat). *expires_in_ms (may be NULL): how long it stays listed. */
int sdc_master_heartbeat(sdc_t *c, const char *challenge, const sdc_master_server_t *s,
                         int64_t *expires_in_ms, sdc_err_t *err);
/* Both steps: a fresh challenge, then the heartbeat (what a game server calls every
 * heartbeat interval). */
int sdc_master_announce(sdc_t *c, const sdc_master_server_t *s, int64_t *expires_in_ms,
                        sdc_err_t *err);
/* Removes the caller's server "ip:port" at once (DELETE /v1/master/servers/{addr}). */
int sdc_master_terminate(sdc_t *c, const char *addr, sdc_err_t *err);

typedef struct {
    const char *game, *map, *region;
    const char *tags;           /* comma-separated, all required */
    int not_empty, not_full, no_password;
} sdc_master_filter_t;

/* One batch of GET /v1/master/servers after `after` (NULL or "" for the first). On
 * success *servers is the JSON array of servers (caller decrefs) and next holds the cursor
 * of the following batch, "" when this was the last. */
int sdc_master_query(sdc_t *c, const sdc_master_filter_t *f, const char *after, int limit,
                     json_t **servers, char *next, size_t nextcap, sdc_err_t *err);

/* ---- clusters, services, assignments, primary ---- */

#ifdef __cplusplus
}
#endif

#endif
