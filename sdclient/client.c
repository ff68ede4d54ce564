/* Transport of libsdclient: URL list, failover, request/response plumbing. */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "sdc_internal.h"
#include "sdproto.h"
#include "sdutil.h"

#define MAX_URLS 16
#define MAX_RESPONSE (64u << 20)

struct sdc {
    char *urls[MAX_URLS];
    int nurls;
    int cur;
    char *auth_header;
    int timeout_ms;
    CURL *curl;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

sdc_t *sdc_new(const char *urls, const char *token, int timeout_ms)
{
    if (!urls || !*urls)
        return NULL;
    pthread_once(&curl_once, curl_init_once);
    sdc_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    char *copy = strdup(urls), *save = NULL;
    for (char *u = strtok_r(copy, ", ", &save); u; u = strtok_r(NULL, ", ", &save)) {
        size_t n = strlen(u);
        while (n && u[n - 1] == '/')
            u[--n] = '\0';
        if (c->nurls == MAX_URLS || (strncmp(u, "http://", 7) && strncmp(u, "https://", 8))) {
            free(copy);
            sdc_free(c);
            return NULL;
        }
        c->urls[c->nurls++] = strdup(u);
    }
    free(copy);
    if (!c->nurls) {
        sdc_free(c);
        return NULL;
    }
    /* Shuffle so that many clients spread over the servers (Fisher-Yates). */
    for (int i = c->nurls - 1; i > 0; i--) {
        unsigned r = 0;
        if (getrandom(&r, sizeof r, 0) != sizeof r)
            r = (unsigned)i;
        int j = (int)(r % (unsigned)(i + 1));
        char *t = c->urls[i];
        c->urls[i] = c->urls[j];
        c->urls[j] = t;
    }
    if (token && *token && asprintf(&c->auth_header, "Authorization: Bearer %s", token) < 0)
        c->auth_header = NULL;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
    c->curl = curl_easy_init();
    if (!c->curl) {
        sdc_free(c);
        return NULL;
    }
    return c;
}

int sdc_set_token(sdc_t *c, const char *token)
{
    char *h = NULL;
    if (token && *token && asprintf(&h, "Authorization: Bearer %s", token) < 0)
        return SDC_E_NOMEM;
    free(c->auth_header);
    c->auth_header = h;
    return SDC_OK;
}

void sdc_free(sdc_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nurls; i++)
        free(c->urls[i]);
    free(c->auth_header);
    if (c->curl)
        curl_easy_cleanup(c->curl);
    free(c);
}

const char *sdc_current_url(const sdc_t *c) { return c->urls[c->cur]; }

void sdc_err_clear(sdc_err_t *err)
{
    if (!err)
        return;
    json_decref(err->body);
    memset(err, 0, sizeof *err);
}

int sdc__inval(sdc_err_t *err, const char *what)
{
    if (err) {
        memset(err, 0, sizeof *err);
        snprintf(err->message, sizeof err->message, "%s", what);
    }
    return SDC_E_INVAL;
}

int sdc__proto(sdc_err_t *err, const char *what)
{
    if (err)
        snprintf(err->message, sizeof err->message, "%s", what);
    return SDC_E_PROTO;
}

int sdc__names(sdc_err_t *err, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *what = va_arg(ap, const char *);
        const char *s = va_arg(ap, const char *);
        if (!s || !sd_name_valid(s, SD_NAME_MAX)) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s is not a valid name", what);
            rc = sdc__inval(err, msg);
        }
    }
    va_end(ap);
    return rc;
}

/* "/v1/clusters/<cluster>" and the suffix formatted from fmt and ap, into path. */
static const char *cpath_v(char *path, size_t cap, const char *cluster, const char *fmt,
                           va_list ap) __attribute__((format(printf, 4, 0)));
static const char *cpath_v(char *path, size_t cap, const char *cluster, const char *fmt,
                           va_list ap)
{
    int n = snprintf(path, cap, "/v1/clusters/%s", cluster);
    if (n > 0 && (size_t)n < cap)
        vsnprintf(path + n, cap - (size_t)n, fmt, ap);
    return path;
}

const char *sdc__cpath(char *path, size_t cap, const char *cluster, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cpath_v(path, cap, cluster, fmt, ap);
    va_end(ap);
    return path;
}

int sdc__call_object(sdc_t *c, const char *method, const char *path, const json_t *body,
                     json_t **out, sdc_err_t *err)
{
    json_t *res = NULL;
    int rc = sdc_request(c, method, path, body, &res, err);
    if (rc)
        return rc;
    if (!json_is_object(res)) {
        json_decref(res);
        return sdc__proto(err, "the answer is not a JSON object");
    }
    if (out)
        *out = res;
    else
        json_decref(res);
    return SDC_OK;
}

int sdc__walk(sdc_t *c, const char *path, const char *list, const char *in_cursor,
              const char *out_cursor, size_t max, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    json_t *first = NULL, *all = json_array();
    char cursor[512] = "", page[SDC__PATH_MAX + 600], esc[3 * sizeof cursor];
    int truncated = 0, rc = SDC_OK;
    for (;;) {
        if (cursor[0])
            snprintf(page, sizeof page, "%s%c%s=%s", path, strchr(path, '?') ? '&' : '?',
                     in_cursor, sdc_escape(cursor, esc, sizeof esc));
        else
            snprintf(page, sizeof page, "%s", path);
        json_t *ans = NULL;
        if ((rc = sdc__call_object(c, "GET", page, NULL, &ans, err)))
            break;
        json_t *items = json_object_get(ans, list);
        if (!json_is_array(items)) {
            json_decref(ans);
            rc = sdc__proto(err, "a page has no list");
            break;
        }
        json_array_extend(all, items);
        const char *next = json_string_value(json_object_get(ans, out_cursor));
        int more = next && *next && strlen(next) < sizeof cursor;
        if (more)
            snprintf(cursor, sizeof cursor, "%s", next);
        if (!first)
            first = ans;
        else
            json_decref(ans);
        if (!more)
            break;
        if (json_array_size(all) >= max) {
            truncated = 1;
            break;
        }
    }
    if (rc) {
        json_decref(first);
        json_decref(all);
        return rc;
    }
    json_object_set_new(first, list, all);
    json_object_set_new(first, out_cursor, json_null());
    if (truncated)
        json_object_set_new(first, "truncated", json_true());
    *out = first;
    return SDC_OK;
}

int sdc__cluster_walk(sdc_t *c, const char *cluster, const char *suffix, const char *list,
                      size_t max, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    int rc = sdc__names(err, 1, "cluster", cluster);
    if (rc)
        return rc;
    char path[SDC__PATH_MAX];
    sdc__cpath(path, sizeof path, cluster, "%s", suffix);
    return sdc__walk(c, path, list, "after", "next", max, out, err);
}

int sdc__cluster_call(sdc_t *c, const char *method, const char *cluster, const char *what,
                      const char *name, const json_t *body, json_t **out, sdc_err_t *err,
                      const char *fmt, ...)
{
    if (out)
        *out = NULL;
    int rc = what ? sdc__names(err, 2, "cluster", cluster, what, name)
                  : sdc__names(err, 1, "cluster", cluster);
    if (rc)
        return rc;
    char path[SDC__PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    cpath_v(path, sizeof path, cluster, fmt, ap);
    va_end(ap);
    if (out)
        return sdc__call_object(c, method, path, body, out, err);
    json_t *res = NULL; /* an answer nobody asked for, or none (204) */
    rc = sdc_request(c, method, path, body, &res, err);
    json_decref(res);
    return rc;
}

const char *sdc_strerror(int rc, const sdc_err_t *err, char *buf, size_t cap)
{
    switch (rc) {
    case SDC_OK: snprintf(buf, cap, "ok"); break;
    case SDC_E_HTTP:
        snprintf(buf, cap, "%ld %s: %s", err ? err->status : 0, err && err->code[0] ? err->code : "error",
                 err ? err->message : "");
        break;
    case SDC_E_TRANSPORT:
        snprintf(buf, cap, "cannot reach serverdir: %s", err && err->message[0] ? err->message : "no answer");
        break;
    case SDC_E_PROTO: snprintf(buf, cap, "unexpected answer from serverdir: %s", err ? err->message : ""); break;
    case SDC_E_INVAL: snprintf(buf, cap, "invalid argument: %s", err ? err->message : ""); break;
    default: snprintf(buf, cap, "out of memory"); break;
    }
    return buf;
}

const char *sdc_escape(const char *s, char *buf, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s && o + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        int safe = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' ||
                   ch == '~' || ch == ':' || ch == '@';
        if (safe) {
            buf[o++] = (char)ch;
        } else {
            buf[o++] = '%';
            buf[o++] = hex[ch >> 4];
            buf[o++] = hex[ch & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}

/* A response body, capped at MAX_RESPONSE; overflow says the cap stopped the transfer. */
struct sink {
    sd_buf_t body;
    int overflow;
};

static size_t sink_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct sink *s = ud;
    size_t n = size * nmemb;
    int rc = sd_buf_append(&s->body, ptr, n);
    if (rc == -E2BIG)
        s->overflow = 1;
    return rc ? 0 : n;
}

struct hdr_capture {
    const char *name;
    char *value;
    size_t cap;
};

static size_t header_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct hdr_capture *h = ud;
    size_t n = size * nmemb;
    if (h->name) {
        size_t nl = strlen(h->name);
        if (n > nl + 1 && strncasecmp(ptr, h->name, nl) == 0 && ptr[nl] == ':') {
            const char *v = ptr + nl + 1;
            size_t vl = n - nl - 1;
            while (vl && (*v == ' ' || *v == '\t')) {
                v++;
                vl--;
            }
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
                vl--;
            snprintf(h->value, h->cap, "%.*s", (int)vl, v);
        }
    }
    return n;
}

struct stream_ctx {
    size_t (*out)(const char *, size_t, void *);
    void *arg;
    long status;
    CURL *h;
    sd_buf_t errbody; /* an error answer, kept for err instead of passed on */
};

static size_t stream_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    struct stream_ctx *s = userdata;
    size_t n = size * nmemb;
    if (!s->status)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status >= 300) {
        sd_buf_append(&s->errbody, ptr, n); /* capped: the rest is dropped */
        return n;
    }
    return s->out(ptr, n, s->arg);
}

int sdc_stream(sdc_t *c, const char *url, int timeout_ms,
               size_t (*out)(const char *, size_t, void *), void *arg, sdc_err_t *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return sdc__inval(err, "the URL must be http:// or https://");
    struct curl_slist *hl = NULL;
    if (c->auth_header)
        hl = curl_slist_append(hl, c->auth_header);
    char ebuf[CURL_ERROR_SIZE] = "";
    struct stream_ctx s = {out, arg, 0, c->curl, {0}};
    sd_buf_init(&s.errbody, 64 << 10);
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 0));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    CURLcode cc = curl_easy_perform(h);
    curl_slist_free_all(hl);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    int rc = SDC_OK;
    if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && status && status < 300)) {
        if (err)
            snprintf(err->message, sizeof err->message, "%s: %s", url,
                     ebuf[0] ? ebuf : curl_easy_strerror(cc));
        rc = SDC_E_TRANSPORT;
    } else if (status >= 300) {
        if (err) {
            err->status = status;
            snprintf(err->code, sizeof err->code, "http_error");
            /* a plain text answer (a bigbrother's logs port) is the message */
            snprintf(err->message, sizeof err->message, "%.*s",
                     (int)(s.errbody.len && s.errbody.data[s.errbody.len - 1] == '\n'
                               ? s.errbody.len - 1 : s.errbody.len),
                     s.errbody.data ? s.errbody.data : "");
        }
        rc = SDC_E_HTTP;
    }
    sd_buf_free(&s.errbody);
    return rc;
}

/* Fills err from an HTTP error answer (ServerDir's {"error":{code,message}} shape). */
static void http_error(sdc_err_t *err, long status, const char *body, size_t len)
{
    if (!err)
        return;
    err->status = status;
    json_t *j = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    snprintf(err->code, sizeof err->code, "%s", code ? code : "http_error");
    snprintf(err->message, sizeof err->message, "%s", msg ? msg : "");
    err->body = j;
}

/* One request with failover. On success fills the sink and returns the status. */
static int perform(sdc_t *c, const char *method, const char *path, struct curl_slist *hl,
                   const void *body, size_t len, struct sink *out, struct hdr_capture *hc,
                   long *status, sdc_err_t *err)
{
    char ebuf[CURL_ERROR_SIZE];
    for (int attempt = 0; attempt < c->nurls; attempt++) {
        int idx = (c->cur + attempt) % c->nurls;
        char url[2048];
        snprintf(url, sizeof url, "%s%s", c->urls[idx], path);
        CURL *h = c->curl;
        curl_easy_reset(h);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(c->timeout_ms < 2000 ? c->timeout_ms : 2000));
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, hc);
        if (strcmp(method, "HEAD") == 0)
            curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        if (body) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        }
        ebuf[0] = '\0';
        sd_buf_reset(&out->body);
        CURLcode rc = curl_easy_perform(h);
        if (rc == CURLE_OK) {
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
            if (*status >= 500 && attempt + 1 < c->nurls)
                continue; /* that copy is unhealthy: try the next one */
            c->cur = idx;
            return SDC_OK;
        }
        if (out->overflow) {
            if (err)
                snprintf(err->message, sizeof err->message, "response larger than %u bytes", MAX_RESPONSE);
            return SDC_E_PROTO;
        }
        if (err)
            snprintf(err->message, sizeof err->message, "%s: %s", c->urls[idx],
                     ebuf[0] ? ebuf : curl_easy_strerror(rc));
    }
    c->cur = (c->cur + 1) % c->nurls;
    return SDC_E_TRANSPORT;
}

int sdc_request(sdc_t *c, const char *method, const char *path, const json_t *body,
                json_t **out, sdc_err_t *err)
{
    if (out)
        *out = NULL;
    if (err)
        memset(err, 0, sizeof *err);
    char *payload = NULL;
    if (body) {
        payload = json_dumps(body, JSON_COMPACT);
        if (!payload)
            return SDC_E_NOMEM;
    }
    struct curl_slist *hl = NULL;
    if (c->auth_header)
        hl = curl_slist_append(hl, c->auth_header);
    if (payload)
        hl = curl_slist_append(hl, "Content-Type: application/json");
    hl = curl_slist_append(hl, "Accept: application/json");
    hl = curl_slist_append(hl, "Expect:");
    struct sink s = {0};
    sd_buf_init(&s.body, MAX_RESPONSE);
    struct hdr_capture hc = {0};
    long status = 0;
    int rc = perform(c, method, path, hl, payload, payload ? strlen(payload) : 0, &s, &hc,
                     &status, err);
    curl_slist_free_all(hl);
    free(payload);
    if (rc == SDC_OK) {
        if (status < 200 || status >= 300) {
            http_error(err, status, s.body.data, s.body.len);
            rc = SDC_E_HTTP;
        } else if (out && s.body.len) {
            json_error_t je;
            *out = json_loadb(s.body.data, s.body.len, 0, &je);
            if (!*out) {
                if (err)
                    snprintf(err->message, sizeof err->message, "bad JSON: %s", je.text);
                rc = SDC_E_PROTO;
            }
        }
        if (err)
            err->status = status;
    }
    sd_buf_free(&s.body);
    return rc;
}

int sdc_request_raw(sdc_t *c, const char *method, const char *path,
                    const char *const *headers, const void *body, size_t len, void **out,
                    size_t *outlen, const char *hdr_name, char *hdr_value, size_t hdr_cap,
                    sdc_err_t *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (out)
        *out = NULL;
    if (outlen)
        *outlen = 0;
    if (hdr_value && hdr_cap)
        hdr_value[0] = '\0';
    struct curl_slist *hl = NULL;
    if (c->auth_header)
        hl = curl_slist_append(hl, c->auth_header);
    if (body)
        hl = curl_slist_append(hl, "Content-Type: application/octet-stream");
    hl = curl_slist_append(hl, "Expect:");
    for (const char *const *h = headers; h && *h; h++)
        hl = curl_slist_append(hl, *h);
    struct sink s = {0};
    sd_buf_init(&s.body, MAX_RESPONSE);
    struct hdr_capture hc = {hdr_name, hdr_value, hdr_cap};
    long status = 0;
    int rc = perform(c, method, path, hl, body ? body : NULL, len, &s, &hc, &status, err);
    curl_slist_free_all(hl);
    if (rc == SDC_OK) {
        if (status < 200 || status >= 300) {
            http_error(err, status, s.body.data, s.body.len);
            rc = SDC_E_HTTP;
        } else if (out) {
            *out = s.body.data ? s.body.data : calloc(1, 1);
            if (outlen)
                *outlen = s.body.len;
            s.body.data = NULL;
        }
        if (err)
            err->status = status;
    }
    sd_buf_free(&s.body);
    return rc;
}
