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

/* A machine lease registration or renewal. Unset fields (NULL, capacity < 0,
 * ttl_ms 0) are left out: ServerDir keeps what it stored (ttl_ms defaults to 15000). */
typedef struct {
    const char *address;   /* host name or IP the machine is reached at */
    const json_t *labels;  /* object of name -> string, or NULL */
    int capacity;          /* >= 0, or -1 for unset */
    const char *version;
    int ttl_ms;            /* 1000..300000, or 0 for the default */
} sdc_machine_lease_t;

/* PUT /v1/clusters/{cluster}/machines/{machine}. lease may be NULL (a bare renewal).
 * On success *expires_in_ms (if given) is the lease time left. */
int sdc_machine_put(sdc_t *c, const char *cluster, const char *machine,
                    const sdc_machine_lease_t *lease, int64_t *expires_in_ms, sdc_err_t *err);
/* GET .../machines: *out is {"machines":[...]} (caller decrefs). */
int sdc_machines_list(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err);
/* GET .../machines/{machine}: *out is the machine object. 404 -> SDC_E_HTTP. */
int sdc_machine_get(sdc_t *c, const char *cluster, const char *machine, json_t **out,
                    sdc_err_t *err);
/* DELETE .../machines/{machine} (ops). */
int sdc_machine_delete(sdc_t *c, const char *cluster, const char *machine, sdc_err_t *err);

/* POST .../events with `events`, a JSON array of 1..1000 event objects (not stolen; see
 * the events contract). accepted/duplicates may be NULL. Safe to retry: ServerDir
 * counts an already applied event id as a duplicate. */
int sdc_events_post(sdc_t *c, const char *cluster, const json_t *events, int *accepted,
                    int *duplicates, sdc_err_t *err);

/* Filters of sdc_processes_list; NULL means any. state NULL: starting and ready. */
typedef struct {
    const char *machine;
    const char *service;
    const char *state;     /* "starting", "ready" or "stopped" */
} sdc_proc_filter_t;

/* GET .../processes: *out is {"processes":[...],"total":N,"truncated":bool}. */
int sdc_processes_list(sdc_t *c, const char *cluster, const sdc_proc_filter_t *filter,
                       json_t **out, sdc_err_t *err);
/* GET .../processes/{instance}: *out is the process record. */
int sdc_process_get(sdc_t *c, const char *cluster, const char *instance, json_t **out,
                    sdc_err_t *err);
/* GET .../events: history entries after `since` (NULL: the newest), at most limit
 * (0: the server default of 100), newest last. *out is {"events":[...],"last":seq}. */
int sdc_events_list(sdc_t *c, const char *cluster, const char *since, int limit,
                    json_t **out, sdc_err_t *err);

/* ---- locks and blobs ---- */

/* ---- master list ---- */

/* ---- clusters, services, assignments, primary ---- */

#ifdef __cplusplus
}
#endif

#endif
