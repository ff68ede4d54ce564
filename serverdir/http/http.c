#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "cred.h"
#include "group.h"
#include "router.h"
#include "sd.h"
#include "sdtime.h"

static struct MHD_Daemon *daemon_;
static int listen_fd = -1;
static int bound_port;
static int inflight; /* requests between their first call and on_completed */
static atomic_int stopping; /* sd_http_stop has begun: parked requests should finish */
static pthread_mutex_t inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t inflight_cv = PTHREAD_COND_INITIALIZER;

static void inflight_add(int d)
{
    pthread_mutex_lock(&inflight_mu);
    inflight += d;
    if (inflight == 0)
        pthread_cond_broadcast(&inflight_cv);
    pthread_mutex_unlock(&inflight_mu);
}

/* Per-request state, allocated on the first call of the access handler and freed in
 * on_completed (MHD owns the timing). */
struct reqctx {
    sd_req_t req;
    sd_resp_t resp;
    int route_idx;
    int responded;   /* an early response (401/403/404/405/413/415) is ready */
    int parked;      /* the handler parked the request: the answer comes with resume */
    int live_check;  /* the instance credential's liveness is checked before the handler */
    sd_group_job_t job; /* on the handler threads' queue (handler_group) */
    char scratch[SD_PATH_MAX];
    /* last, not cleared for each request: where a small body and a small answer are
     * written (a lock acquire's, a release's), with no allocation, nor a free on the HTTP
     * thread of memory the worker thread that answered a parked request allocated (its
     * malloc arena's lock was a third of serverdir's futex waits) */
    char req_mem[1024];
    char resp_mem[1024];
};

/* ---------- response helpers ---------- */

static void resp_reset_body(sd_resp_t *resp)
{
    sd_buf_reset(&resp->body);
}

void sd_resp_bytes(sd_resp_t *resp, int status, const char *ctype, const void *p, size_t n)
{
    resp_reset_body(resp);
    resp->status = status;
    resp->content_type = ctype;
    resp->body.max = (size_t)-1 / 2;
    if (sd_buf_append(&resp->body, p, n)) {
        resp->status = 500;
        resp->content_type = "text/plain";
    }
}

static int dump_piece(const char *p, size_t n, void *body)
{
    return sd_buf_append(body, p, n) ? -1 : 0;
}

void sd_resp_json(sd_resp_t *resp, int status, json_t *v)
{
    /* straight into the body: no string of its own to allocate and copy */
    resp_reset_body(resp);
    resp->body.max = (size_t)-1 / 2;
    int rc = v ? json_dump_callback(v, dump_piece, &resp->body, JSON_COMPACT | JSON_ENCODE_ANY)
               : -1;
    json_decref(v);
    if (rc || sd_buf_append(&resp->body, "\n", 1)) {
        sd_resp_bytes(resp, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    resp->status = status;
    resp->content_type = "application/json";
}

void sd_resp_jw_begin(sd_resp_t *resp, sd_jw_t *w)
{
    resp_reset_body(resp);
    resp->body.max = (size_t)-1 / 2;
    sd_jw_init(w, &resp->body);
}

void sd_resp_jw_end(sd_resp_t *resp, int status, sd_jw_t *w)
{
    if (sd_jw_done(w) || sd_buf_append(&resp->body, "\n", 1)) {
        sd_resp_bytes(resp, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    resp->status = status;
    resp->content_type = "application/json";
}

__attribute__((format(printf, 5, 0)))
static void resp_verror(sd_resp_t *resp, int status, const char *code, json_t *extra,
                        const char *fmt, va_list ap)
{
    char msg[SD_ERRMSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    json_t *err = json_pack("{s:s, s:s}", "code", code, "message", msg);
    if (extra) {
        json_object_update(err, extra);
        json_decref(extra);
    }
    sd_resp_json(resp, status, json_pack("{s:o}", "error", err));
}

void sd_resp_error(sd_resp_t *resp, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    resp_verror(resp, status, code, NULL, fmt, ap);
    va_end(ap);
}

void sd_resp_error_extra(sd_resp_t *resp, int status, const char *code, json_t *extra,
                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    resp_verror(resp, status, code, extra, fmt, ap);
    va_end(ap);
}

void sd_resp_empty(sd_resp_t *resp, int status)
{
    resp_reset_body(resp);
    resp->status = status;
    resp->content_type = NULL;
}

void sd_resp_header(sd_resp_t *resp, const char *name, const char *value)
{
    for (int i = 0; i < resp->nheaders; i++) {
        if (strcasecmp(resp->hname[i], name) == 0) {
            free(resp->hvalue[i]);
            resp->hvalue[i] = strdup(value);
            return;
        }
    }
    if (resp->nheaders == SD_RESP_MAX_HEADERS)
        return;
    resp->hname[resp->nheaders] = strdup(name);
    resp->hvalue[resp->nheaders] = strdup(value);
    resp->nheaders++;
}

void sd_resp_store_error(sd_resp_t *resp, int err)
{
    if (err == SD_STORE_DOWN) {
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error(resp, 503, "store_unavailable",
                      "the Redis store is unreachable; retry shortly");
        return;
    }
    sd_resp_error(resp, 500, "store_error", "unexpected reply from the Redis store");
}

void sd_resp_bad_reply(sd_resp_t *resp, const char *script, const redisReply *r)
{
    log_error("unexpected script reply", "script=%s type=%d err=%s", script, r ? r->type : -1,
              r && r->type == REDIS_REPLY_ERROR ? r->str : "");
    sd_resp_error(resp, 500, "internal", "unexpected reply from the store");
}

/* ---------- request helpers ---------- */

const char *sd_req_query(const sd_req_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *sd_req_header(const sd_req_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

json_t *sd_req_json(sd_req_t *req, sd_resp_t *resp)
{
    char err[SD_ERRMSG_MAX];
    if (req->body.len == 0) {
        sd_resp_error(resp, 400, "bad_json", "a JSON object body is required");
        return NULL;
    }
    json_t *v = sd_json_parse(req->body.data, req->body.len, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!v) {
        sd_resp_error(resp, 400, "bad_json", "%s", err);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        sd_resp_error(resp, 400, "bad_json", "the body must be a JSON object");
        return NULL;
    }
    return v;
}

int sd_req_page(const sd_req_t *req, sd_resp_t *resp, const char **cluster, int64_t max,
                int64_t dflt, int64_t *limit, const char **after)
{
    if (sd_req_name(req, resp, 0, "cluster", cluster) ||
        sd_req_query_int(req, resp, "limit", 1, max, dflt, limit))
        return -1;
    *after = sd_req_query(req, "after");
    if (*after && **after && !sd_name_valid(*after, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_query",
                      "query parameter 'after' must be the 'next' of a previous page");
        return -1;
    }
    if (!*after)
        *after = "";
    return 0;
}

int sd_req_query_int(const sd_req_t *req, sd_resp_t *resp, const char *name, int64_t min,
                     int64_t max, int64_t dflt, int64_t *out)
{
    const char *s = sd_req_query(req, name);
    if (!s) {
        *out = dflt;
        return 0;
    }
    if (sd_parse_i64(s, min, max, out)) {
        sd_resp_error(resp, 400, "bad_query", "query parameter '%s' must be an integer from %lld to %lld",
                      name, (long long)min, (long long)max);
        return -1;
    }
    return 0;
}

int sd_req_cluster_and(const sd_req_t *req, sd_resp_t *resp, const char **cluster,
                       const char *what, const char **name)
{
    return sd_req_name(req, resp, 0, "cluster", cluster) || sd_req_name(req, resp, 1, what, name)
               ? -1
               : 0;
}

int sd_req_name(const sd_req_t *req, sd_resp_t *resp, int idx, const char *what,
                const char **out)
{
    const char *s = idx < req->nparams ? req->params[idx] : NULL;
    if (!s || !sd_name_valid(s, SD_NAME_MAX)) {
        sd_resp_error(resp, 400, "bad_name",
                      "%s name must be 1-%d characters of A-Z a-z 0-9 _ . : @ - "
                      "(not starting with '.' or '-', no '..')",
                      what, SD_NAME_MAX);
        return -1;
    }
    *out = s;
    return 0;
}

/* ---------- parking ---------- */

/* The request is the first member of its reqctx. */
static struct reqctx *ctx_of(sd_req_t *req) { return (struct reqctx *)(void *)req; }

/* On a handler thread: the request it runs, which its HTTP thread parked already, and
 * whether the handler parked it again (handed it to a group or the park thread, which
 * resume it), read once the handler returns. */
static _Thread_local sd_req_t *running;
static _Thread_local int reparked;

void sd_req_park(sd_req_t *req)
{
    if (req == running) { /* suspended already: only who resumes it changes */
        reparked = 1;
        return;
    }
    ctx_of(req)->parked = 1;
    MHD_suspend_connection(req->conn);
}

void sd_req_resume(sd_req_t *req) { MHD_resume_connection(req->conn); }

/* ---------- handler threads ----------
 * A request whose handler may wait on Redis is parked by its HTTP thread and run on one of
 * sd_cfg.threads handler threads (a group of one request a call, group.h), which answer
 * it and resume it. An HTTP thread so never waits on Redis: its other connections are
 * read and answered meanwhile, so as many HTTP threads as cores serve every route, and
 * their wake-ups no longer crowd Redis off the cores (bench/README.md, "HTTP threads
 * that never wait on Redis"). Routes that hand their calls to a group commit, and those
 * that touch no Redis, run on the HTTP thread (SD_GROUPED, SD_HTTP_THREAD in sd.h). */

static _Thread_local int handling; /* this thread runs a handler through handler_call */

static int handler_threads(void) { return sd_cfg.threads; }
static const char *handler_key(const sd_group_job_t *j) { (void)j; return ""; }
static long handler_weight(const sd_group_job_t *j) { (void)j; return 1; }

static struct reqctx *ctx_of_job(sd_group_job_t *j)
{
    return (struct reqctx *)(void *)((char *)j - offsetof(struct reqctx, job));
}

static int authorize(sd_req_t *req, sd_resp_t *resp);

/* The credential's liveness and the checks after it (authorize) when the front left them
 * to this stage, then the handler. */
static void handler_run(struct reqctx *rc)
{
    if (rc->live_check && (sd_cred_live(&rc->req, &rc->resp) || authorize(&rc->req, &rc->resp)))
        return;
    sd_routes[rc->route_idx].fn(&rc->req, &rc->resp);
}

static void handler_call(sd_group_job_t **jobs, int n)
{
    (void)n; /* jobs_max 1 */
    struct reqctx *rc = ctx_of_job(jobs[0]);
    handling = 1;
    if (!rc->parked) { /* no handler thread could start: run here, as a handler would */
        handler_run(rc);
        handling = 0;
        return;
    }
    running = &rc->req;
    reparked = 0;
    sd_conn_handler_enter();
    handler_run(rc);
    sd_conn_handler_leave();
    running = NULL;
    handling = 0;
}

/* Resumes the request unless its handler handed it on (then rc may be gone already). */
static void handler_finish(sd_group_job_t *j, int parked)
{
    if (parked && !reparked)
        sd_req_resume(j->req);
}

static sd_group_t handler_group = {.name = "handler",
                                   .calls = 1,
                                   .calls_at_start = handler_threads,
                                   .jobs_max = 1,
                                   .weight_max = 1,
                                   .key = handler_key,
                                   .weight = handler_weight,
                                   .call = handler_call,
                                   .finish = handler_finish,
                                   SD_GROUP_STATE};

static void handler_submit(struct reqctx *rc)
{
    rc->job.req = &rc->req;
    sd_group_submit(&handler_group, &rc->job);
}

int sd_req_defer(sd_req_t *req)
{
    if (handling)
        return 0;
    handler_submit(ctx_of(req));
    return 1;
}

/* Whether the route's handler runs on the HTTP thread (see above). */
static int on_http_thread(const struct reqctx *rc, const sd_route_t *r)
{
    if (rc->live_check)
        return 0;
    return (r->flags & SD_HTTP_THREAD) || ((r->flags & SD_GROUPED) && !sd_store_is_cluster());
}

int sd_http_stopping(void) { return atomic_load(&stopping); }

/* ---------- dispatch ---------- */

static int is_json_ctype(const char *ct)
{
    if (!ct)
        return 0;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

static void peer_address(struct reqctx *rc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rc->req.conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        memcpy(&rc->req.peer, in, sizeof *in);
        inet_ntop(AF_INET, &in->sin_addr, rc->req.peer_ip, sizeof rc->req.peer_ip);
        rc->req.peer_port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        memcpy(&rc->req.peer, in6, sizeof *in6);
        inet_ntop(AF_INET6, &in6->sin6_addr, rc->req.peer_ip, sizeof rc->req.peer_ip);
        rc->req.peer_port = ntohs(in6->sin6_port);
    }
}

/* Decides, before any body byte is read, whether the request can go on: route, auth,
 * declared length and content type. Fills rc->resp and sets responded when not. An
 * instance credential whose liveness needs a Redis read (live_check) has that read, and
 * the role and cluster checks after it (authorize), on its handler thread instead. */
/* What the request's framing headers say: every Content-Length and Transfer-Encoding
 * header is seen, not only the first one MHD would hand out. */
struct framing {
    int ncl;              /* Content-Length headers */
    int cl_differ;        /* two of them disagree */
    const char *cl;       /* the first one */
    int nte;              /* Transfer-Encoding headers */
    int te_chunked_only;  /* every Transfer-Encoding is exactly "chunked" */
    int ws_name;          /* a name holds whitespace ("Transfer-Encoding : chunked") */
};

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    struct framing *f = cls;
    /* libmicrohttpd 0.9.75 keeps whitespace before the colon in the name (its own check
     * of it hangs on MHD_OPTION_STRICT_FOR_CLIENT -1, the "tolerant" setting, and answers
     * without a JSON body), so "Transfer-Encoding : chunked" would not count as one. */
    if (strpbrk(key, " \t"))
        f->ws_name = 1;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->ncl++ && strcmp(f->cl, value ? value : ""))
            f->cl_differ = 1;
        else if (f->ncl == 1)
            f->cl = value ? value : "";
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->te_chunked_only = (f->nte++ == 0 || f->te_chunked_only) && value &&
                             !strcasecmp(value, "chunked");
    }
    return MHD_YES;
}

/* Refuses framing that a proxy and serverdir could read differently (the way requests are
 * smuggled past a load balancer): both Content-Length and Transfer-Encoding, Content-Lengths
 * that disagree, a transfer coding other than chunked alone, or whitespace between a header
 * name and its colon (RFC 9112 5.1: a proxy that trims it reads another framing than one
 * that keeps it). Returns the reason, or NULL for sound framing; *chunked is set for a
 * chunked body. */
static const char *framing_error(struct MHD_Connection *conn, int *chunked)
{
    struct framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, &f);
    *chunked = f.nte > 0;
    if (f.ws_name)
        return "a header name may not hold whitespace (none is allowed before its colon)";
    if (f.ncl && f.nte)
        return "a request may not carry both Content-Length and Transfer-Encoding";
    if (f.cl_differ)
        return "the request carries Content-Length headers that disagree";
    if (f.nte && !f.te_chunked_only)
        return "the only transfer coding accepted is chunked";
    return NULL;
}

/* A bearer value: an instance credential when it has a JWT's shape (*why then says why
 * one is refused), else (or when a token-file token happens to have that shape) a
 * token-file token. Fills *out; returns the role, 0 when refused. */
static unsigned bearer_auth(const char *tok, size_t len, sd_auth_t *out, const char **why)
{
    if (sd_cred_shaped(tok, len)) {
        unsigned role = sd_cred_verify(tok, len, out, why);
        if (role || sd_auth_lookup(tok, len, out))
            return out->role;
        SD_COUNT("serverdir_credentials_refused_total{reason=\"invalid\"}",
                 "credentials refused: bad signature, expired, unknown key or claims", 1);
        return 0;
    }
    return sd_auth_lookup(tok, len, out);
}

/* The role's right to the route, and a cluster-bound token's to the cluster it names;
 * -1 with the 403 (or 400) set when not. */
static int authorize(sd_req_t *req, sd_resp_t *resp)
{
    const sd_route_t *r = req->route;
    if (!(r->roles & req->role) && req->role != SD_R_OPS) {
        sd_resp_error(resp, 403, "forbidden", "role '%s' may not %s %s",
                      sd_role_name(req->role), req->method, r->pattern);
        return -1;
    }
    /* A token bound to a cluster acts for that cluster only. */
    const char *cluster;
    if (req->auth.cluster[0] && !strncmp(r->pattern, "/v1/clusters/{c}", 16) &&
        (sd_req_name(req, resp, 0, "cluster", &cluster) ||
         sd_req_may_cluster(req, resp, cluster)))
        return -1;
    return 0;
}

static void precheck(struct reqctx *rc, const char *method, const char *url)
{
    sd_req_t *req = &rc->req;
    sd_resp_t *resp = &rc->resp;
    char allow[64];
    int chunked;
    const char *bad = framing_error(req->conn, &chunked);
    if (bad) {
        sd_resp_header(resp, "Connection", "close"); /* what follows cannot be trusted */
        sd_resp_error(resp, 400, "bad_framing", "%s", bad);
        SD_COUNT("serverdir_http_bad_framing_total", "requests refused for their framing", 1);
        rc->responded = 1;
        return;
    }
    rc->route_idx = sd_route_match(sd_routes, sd_nroutes, method, url, rc->scratch,
                                   sizeof rc->scratch, req->params, &req->nparams, allow,
                                   sizeof allow);
    if (rc->route_idx == SD_ROUTE_NOT_FOUND) {
        sd_resp_error(resp, 404, "not_found", "no such resource");
        rc->responded = 1;
        return;
    }
    if (rc->route_idx == SD_ROUTE_BAD_METHOD) {
        sd_resp_header(resp, "Allow", allow);
        sd_resp_error(resp, 405, "method_not_allowed", "method %s is not allowed here", method);
        rc->responded = 1;
        return;
    }
    const sd_route_t *r = &sd_routes[rc->route_idx];
    req->route = r;

    if (sd_auth_open_mode()) {
        req->role = req->auth.role = SD_R_OPS;
        snprintf(req->auth.principal, sizeof req->auth.principal, "open");
    } else {
        const char *auth = NULL;
        size_t alen = 0;
        unsigned role = 0;
        int garbled = 0;
        const char *cred_why = NULL;
        if (MHD_lookup_connection_value_n(req->conn, MHD_HEADER_KIND, "Authorization",
                                          strlen("Authorization"), &auth, &alen) == MHD_YES &&
            auth) {
            /* A NUL or control byte is refused whole, never matched up to it. */
            for (size_t i = 0; i < alen && !garbled; i++)
                garbled = (unsigned char)auth[i] < 0x20 || (unsigned char)auth[i] == 0x7f;
            if (!garbled && alen > 7 && strncasecmp(auth, "Bearer ", 7) == 0)
                role = bearer_auth(auth + 7, alen - 7, &req->auth, &cred_why);
        }
        req->role = role;
        if (!(r->roles & SD_PUBLIC)) {
            if (!role) {
                sd_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"serverdir\"");
                sd_resp_error(resp, 401, "unauthorized", "%s",
                              garbled    ? "the Authorization header holds a control character"
                              : cred_why ? cred_why
                              : auth     ? "the bearer token is not valid"
                                         : "a bearer token is required");
                rc->responded = 1;
                return;
            }
            /* An instance credential works while the directory says its instance runs:
             * checked on the handler thread before the handler (an HTTP thread never
             * waits on Redis), unless the handler's script does it (SD_CRED_LIVE_IN_SCRIPT). */
            rc->live_check = req->auth.cred &&
                             (!(r->flags & SD_CRED_LIVE_IN_SCRIPT) || sd_store_is_cluster());
            /* after the liveness check when there is one: a revoked credential is told
             * so (401) whatever it asked */
            if (!rc->live_check && authorize(req, resp)) {
                rc->responded = 1;
                return;
            }
        }
    }

    size_t cap = (r->flags & SD_RAW_BODY) ? sd_cfg.blob_max : sd_cfg.body_max;
    req->body.max = cap;
    const char *cl = sd_req_header(req, "Content-Length");
    int64_t declared = 0;
    if (cl && sd_parse_i64(cl, 0, INT64_MAX, &declared) == 0 && (uint64_t)declared > cap) {
        sd_resp_error(resp, 413, "too_large", "the body is larger than the %zu byte limit", cap);
        rc->responded = 1;
        return;
    }
    if (!(r->flags & SD_RAW_BODY) && (declared > 0 || chunked) &&
        !is_json_ctype(sd_req_header(req, "Content-Type"))) {
        sd_resp_error(resp, 415, "unsupported_media_type",
                      "the body must be sent as Content-Type: application/json");
        rc->responded = 1;
    }
}

static enum MHD_Result send_response(struct reqctx *rc)
{
    sd_resp_t *resp = &rc->resp;
    struct MHD_Response *mr;
    if (resp->body.len && resp->body.borrowed) {
        mr = MHD_create_response_from_buffer(resp->body.len, resp->body.data, MHD_RESPMEM_MUST_COPY);
    } else if (resp->body.len) {
        mr = MHD_create_response_from_buffer(resp->body.len, resp->body.data, MHD_RESPMEM_MUST_FREE);
        resp->body.data = NULL; /* MHD frees it */
        resp->body.len = resp->body.cap = 0;
    } else {
        mr = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (!mr)
        return MHD_NO;
    if (resp->content_type)
        MHD_add_response_header(mr, "Content-Type", resp->content_type);
    for (int i = 0; i < resp->nheaders; i++)
        MHD_add_response_header(mr, resp->hname[i], resp->hvalue[i]);
    MHD_add_response_header(mr, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(rc->req.conn, (unsigned)resp->status, mr);
    MHD_destroy_response(mr);
    int64_t took = sd_mono_us() - rc->req.start_us;
    sd_metrics_observe(rc->route_idx, rc->req.method, resp->status, took);
    return ret;
}

/* One spare request context per HTTP thread. A context (about 4.5 KiB with its body and
 * answer memory) is past malloc's small sizes, and allocating one per request made glibc
 * consolidate its free lists every time (3% of serverdir's user CPU on lock pairs). The
 * key's destructor frees a thread's spare when the thread exits. */
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static int spare_ok;

static void spare_key_init(void) { spare_ok = pthread_key_create(&spare_key, free) == 0; }

static struct reqctx *reqctx_new(void)
{
    pthread_once(&spare_once, spare_key_init);
    struct reqctx *rc = spare_ok ? pthread_getspecific(spare_key) : NULL;
    if (!rc)
        return calloc(1, sizeof *rc);
    pthread_setspecific(spare_key, NULL);
    memset(rc, 0, offsetof(struct reqctx, req_mem));
    return rc;
}

static void reqctx_free(struct reqctx *rc)
{
    if (spare_ok && !pthread_getspecific(spare_key) && pthread_setspecific(spare_key, rc) == 0)
        return;
    free(rc);
}

static enum MHD_Result request_step(struct MHD_Connection *conn, const char *url,
                                    const char *method, const char *upload_data,
                                    size_t *upload_data_size, void **con_cls)
{
    struct reqctx *rc = *con_cls;
    if (rc && rc->parked) /* called again after sd_req_resume: the answer is ready */
        return send_response(rc);
    if (!rc) {
        rc = reqctx_new();
        if (!rc)
            return MHD_NO;
        inflight_add(1);
        *con_cls = rc;
        rc->req.conn = conn;
        rc->req.method = method;
        rc->req.path = url;
        rc->req.start_us = sd_mono_us();
        rc->resp.status = 500;
        sd_buf_use(&rc->req.body, rc->req_mem, sizeof rc->req_mem, 0);
        sd_buf_use(&rc->resp.body, rc->resp_mem, sizeof rc->resp_mem, 0);
        peer_address(rc);
        precheck(rc, method, url);
        sd_conn_head_done(conn, rc->req.role != 0);
        if (rc->responded) {
            sd_conn_body_done(conn);
            return send_response(rc);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rc->req.body_too_big &&
            sd_buf_append(&rc->req.body, upload_data, *upload_data_size) == -E2BIG)
            rc->req.body_too_big = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }
    sd_conn_body_done(conn);
    if (rc->req.body_too_big) {
        sd_buf_free(&rc->req.body);
        sd_resp_error(&rc->resp, 413, "too_large", "the body is larger than the %zu byte limit",
                      rc->req.body.max);
        return send_response(rc);
    }
    const sd_route_t *r = &sd_routes[rc->route_idx];
    if (on_http_thread(rc, r))
        r->fn(&rc->req, &rc->resp);
    else
        handler_submit(rc);
    if (rc->parked)
        return MHD_YES;
    return send_response(rc);
}

/* libmicrohttpd's access handler: one step of a request (request_step), stamped for the
 * watchdog's check that the worker pool is not stuck (conn.h). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)cls;
    (void)version;
    sd_conn_worker_enter();
    enum MHD_Result r = request_step(conn, url, method, upload_data, upload_data_size, con_cls);
    sd_conn_worker_leave();
    return r;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    sd_conn_answer_done(conn);
    struct reqctx *rc = *con_cls;
    if (!rc)
        return;
    sd_buf_free(&rc->req.body);
    sd_buf_free(&rc->resp.body);
    for (int i = 0; i < rc->resp.nheaders; i++) {
        free(rc->resp.hname[i]);
        free(rc->resp.hvalue[i]);
    }
    reqctx_free(rc);
    *con_cls = NULL;
    inflight_add(-1);
}

/* libmicrohttpd's messages, at most one a second: a flood of connections that are closed
 * (by their peer, or by the limits of conn.h) would otherwise write one line each. */
__attribute__((format(printf, 2, 0)))
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    static _Atomic int64_t last;
    int64_t now = sd_mono_ms(), prev = atomic_load(&last);
    if (now - prev < 1000 || !atomic_compare_exchange_strong(&last, &prev, now))
        return;
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    log_warn("http server", "detail=%s", msg);
}

static void reuse_addr(int fd)
{
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
}

/* Creates the listening socket ourselves so "host:port" can be any v4/v6 address or name,
 * port 0 works, and the bound port is known. */
static int open_listener(const char *listen_addr)
{
    char host[256];
    int port;
    if (sd_parse_hostport(listen_addr, host, sizeof host, &port) < 0) {
        int64_t p;
        if (listen_addr[0] == ':' && sd_parse_i64(listen_addr + 1, 0, 65535, &p) == 0) {
            host[0] = '\0';
            port = (int)p;
        } else if (strcmp(listen_addr + strlen(listen_addr) - 2, ":0") == 0) {
            size_t hl = strlen(listen_addr) - 2;
            if (hl >= sizeof host)
                return -EINVAL;
            memcpy(host, listen_addr, hl);
            host[hl] = '\0';
            port = 0;
        } else {
            return -EINVAL;
        }
    }
    int fd = sd_socket_bind(host, port, SOCK_STREAM, reuse_addr);
    if (fd < 0)
        return fd;
    if (listen(fd, 1024) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decoding of the path and query values, as libmicrohttpd's own, except that
 * "%00" is kept as the three characters: a decoded NUL would silently cut a name short
 * ("/v1/locks/a%00b" would lock "a"); kept, the '%' fails the name check with 400. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *val)
{
    (void)cls;
    (void)c;
    char *w = val;
    for (const char *r = val; *r;) {
        int hi = r[0] == '%' ? hexval(r[1]) : -1, lo = hi >= 0 ? hexval(r[2]) : -1;
        if (lo >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - val);
}

/* Room above the total limit for connections accepted while the ones they evicted are
 * still closing; libmicrohttpd's own hard limit is the total plus this. */
static int evict_slack(int max_total) { return max_total / 8 > 64 ? max_total / 8 : 64; }

/* Lowers lim->max_total when the open-file limit (raised to its hard limit first) could
 * not hold it with its slack and the descriptors serverdir needs besides: at the
 * file limit accept() fails and no eviction can make room. */
static void fit_fd_limit(sd_conn_limits_t *lim, int threads)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    long reserve = 256 + 4L * threads; /* Redis connections, UDP, logs, the epoll sets */
    long room = (long)(rl.rlim_cur == RLIM_INFINITY ? 1L << 20 : rl.rlim_cur) - reserve;
    long need = lim->max_total + evict_slack(lim->max_total);
    if (need <= room)
        return;
    int fit = (int)(room * 8 / 9);
    log_warn("max_connections lowered to fit the open-file limit",
             "max_connections=%d nofile=%ld now=%d", lim->max_total, (long)rl.rlim_cur,
             fit > 16 ? fit : 16);
    lim->max_total = fit > 16 ? fit : 16;
}

int sd_http_start(const char *listen_addr, int threads, int conn_timeout_s,
                  const sd_conn_limits_t *limits)
{
    sd_conn_limits_t lim = *limits;
    fit_fd_limit(&lim, threads + sd_cfg.threads);
    sd_conn_handlers_expected(sd_cfg.threads);
    listen_fd = open_listener(listen_addr);
    if (listen_fd < 0)
        return listen_fd;
    int rc = sd_conn_start(&lim);
    if (rc) {
        close(listen_fd);
        listen_fd = -1;
        return rc;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    daemon_ = MHD_start_daemon(flags, 0, sd_conn_admit, NULL, on_request, NULL,
                               MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                               MHD_OPTION_LISTEN_SOCKET, listen_fd,
                               MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads,
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)conn_timeout_s,
                               MHD_OPTION_CONNECTION_LIMIT,
                               (unsigned)(lim.max_total + evict_slack(lim.max_total)),
                               MHD_OPTION_NOTIFY_CONNECTION, sd_conn_notify, NULL,
                               MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SD_HTTP_CONN_MEMORY,
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                               MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
                               MHD_OPTION_END);
    if (!daemon_) {
        sd_conn_stop();
        close(listen_fd);
        listen_fd = -1;
        return -EIO;
    }
    return 0;
}

int sd_http_port(void) { return bound_port; }

void sd_http_stop(int grace_ms)
{
    if (!daemon_)
        return;
    atomic_store(&stopping, 1);
    MHD_socket fd = MHD_quiesce_daemon(daemon_);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    struct timespec until = sd_timespec_after_ms(CLOCK_REALTIME, grace_ms);
    pthread_mutex_lock(&inflight_mu);
    while (inflight > 0 &&
           pthread_cond_timedwait(&inflight_cv, &inflight_mu, &until) == 0)
        ;
    pthread_mutex_unlock(&inflight_mu);
    MHD_stop_daemon(daemon_);
    daemon_ = NULL;
    sd_conn_stop();
}
