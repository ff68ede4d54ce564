/* Prometheus metrics: per-route request counts by status and a latency histogram
 * (lock-free atomics on the request path), named counters that modules create on first
 * use with SD_COUNT, and gauges read at scrape time through a callback. Rendered as text
 * exposition format 0.0.4. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sd.h"

static const int codes[] = {200, 201, 204, 304, 400, 401, 403, 404, 405,
                            409, 413, 415, 429, 500, 503};
#define NCODES (SD_ARRAY_LEN(codes) + 1) /* last slot: any other status */
static const double buckets_ms[] = {0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000, 5000};
#define NBUCKETS SD_ARRAY_LEN(buckets_ms)

struct route_metrics {
    _Atomic int64_t count[NCODES];
    _Atomic int64_t bucket[NBUCKETS + 1]; /* +Inf last; cumulative at render time */
    _Atomic int64_t sum_us;
};

static struct route_metrics *routes;
static struct route_metrics unrouted; /* 404/405 and anything before routing */
static size_t nroutes_;

#define MAX_COUNTERS 256
static struct counter {
    char *series;
    char *help;
    _Atomic int64_t value;
} counters[MAX_COUNTERS];
static size_t ncounters;
static pthread_mutex_t counters_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int64_t overflow_sink;

#define MAX_GAUGES 16
static struct gauge {
    const char *series;
    const char *help;
    sd_gauge_fn fn;
} gauges[MAX_GAUGES];
static size_t ngauges;

void sd_metrics_init(size_t nroutes)
{
    routes = calloc(nroutes ? nroutes : 1, sizeof *routes);
    nroutes_ = nroutes;
}

void sd_metrics_observe(int route_idx, const char *method, int status, int64_t micros)
{
    struct route_metrics *m = (route_idx >= 0 && (size_t)route_idx < nroutes_ && routes)
                                  ? &routes[route_idx] : &unrouted;
    size_t ci = NCODES - 1;
    for (size_t i = 0; i < SD_ARRAY_LEN(codes); i++)
        if (codes[i] == status)
            ci = i;
    atomic_fetch_add(&m->count[ci], 1);
    size_t b = NBUCKETS;
    for (size_t i = 0; i < NBUCKETS; i++)
        if ((double)micros <= buckets_ms[i] * 1000.0) {
            b = i;
            break;
        }
    atomic_fetch_add(&m->bucket[b], 1);
    atomic_fetch_add(&m->sum_us, micros);
}

_Atomic int64_t *sd_metric_counter(const char *series, const char *help)
{
    pthread_mutex_lock(&counters_mu);
    for (size_t i = 0; i < ncounters; i++) {
        if (strcmp(counters[i].series, series) == 0) {
            pthread_mutex_unlock(&counters_mu);
            return &counters[i].value;
        }
    }
    _Atomic int64_t *p = &overflow_sink;
    if (ncounters < MAX_COUNTERS) {
        counters[ncounters].series = strdup(series);
        counters[ncounters].help = strdup(help ? help : "");
        p = &counters[ncounters].value;
        ncounters++;
    }
    pthread_mutex_unlock(&counters_mu);
    return p;
}

int sd_metric_gauge(const char *series, const char *help, sd_gauge_fn fn)
{
    pthread_mutex_lock(&counters_mu);
    int rc = -1;
    if (ngauges < MAX_GAUGES) {
        gauges[ngauges++] = (struct gauge){series, help, fn};
        rc = 0;
    }
    pthread_mutex_unlock(&counters_mu);
    return rc;
}

static void render_route(sd_buf_t *out, const char *method, const char *pattern,
                         struct route_metrics *m, int *typed)
{
    for (size_t i = 0; i < NCODES; i++) {
        int64_t c = atomic_load(&m->count[i]);
        if (!c)
            continue;
        if (!typed[0]++)
            sd_buf_printf(out, "# HELP serverdir_http_requests_total HTTP requests by route and status.\n"
                               "# TYPE serverdir_http_requests_total counter\n");
        char code[8];
        if (i < SD_ARRAY_LEN(codes))
            snprintf(code, sizeof code, "%d", codes[i]);
        else
            strcpy(code, "other");
        sd_buf_printf(out, "serverdir_http_requests_total{method=\"%s\",route=\"%s\",code=\"%s\"} %lld\n",
                      method, pattern, code, (long long)c);
    }
}

static void render_hist(sd_buf_t *out, const char *method, const char *pattern,
                        struct route_metrics *m, int *typed)
{
    int64_t cum = 0;
    int64_t all = 0;
    for (size_t i = 0; i <= NBUCKETS; i++)
        all += atomic_load(&m->bucket[i]);
    if (!all)
        return;
    if (!typed[1]++)
        sd_buf_printf(out, "# HELP serverdir_http_request_duration_seconds Time from request to response.\n"
                           "# TYPE serverdir_http_request_duration_seconds histogram\n");
    for (size_t i = 0; i < NBUCKETS; i++) {
        cum += atomic_load(&m->bucket[i]);
        sd_buf_printf(out, "serverdir_http_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"%g\"} %lld\n",
                      method, pattern, buckets_ms[i] / 1000.0, (long long)cum);
    }
    sd_buf_printf(out, "serverdir_http_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"+Inf\"} %lld\n",
                  method, pattern, (long long)all);
    sd_buf_printf(out, "serverdir_http_request_duration_seconds_sum{method=\"%s\",route=\"%s\"} %.6f\n",
                  method, pattern, (double)atomic_load(&m->sum_us) / 1e6);
    sd_buf_printf(out, "serverdir_http_request_duration_seconds_count{method=\"%s\",route=\"%s\"} %lld\n",
                  method, pattern, (long long)all);
}

/* Length of the metric family name (the part before '{'). */
static size_t family_len(const char *series)
{
    const char *b = strchr(series, '{');
    return b ? (size_t)(b - series) : strlen(series);
}

void sd_metrics_render(sd_buf_t *out)
{
    int typed[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        for (size_t r = 0; r < nroutes_; r++) {
            if (pass == 0)
                render_route(out, sd_routes[r].method, sd_routes[r].pattern, &routes[r], typed);
            else
                render_hist(out, sd_routes[r].method, sd_routes[r].pattern, &routes[r], typed);
        }
        if (pass == 0)
            render_route(out, "any", "unmatched", &unrouted, typed);
        else
            render_hist(out, "any", "unmatched", &unrouted, typed);
    }

    pthread_mutex_lock(&counters_mu);
    size_t n = ncounters, ng = ngauges;
    pthread_mutex_unlock(&counters_mu);
    for (size_t i = 0; i < ng; i++) {
        double v;
        size_t fl = family_len(gauges[i].series);
        sd_buf_printf(out, "# HELP %.*s %s\n# TYPE %.*s gauge\n", (int)fl, gauges[i].series,
                      gauges[i].help, (int)fl, gauges[i].series);
        if (gauges[i].fn(&v) == 0)
            sd_buf_printf(out, "%s %.17g\n", gauges[i].series, v);
    }
    /* Families are written together: for each family seen first at i, emit all its series. */
    for (size_t i = 0; i < n; i++) {
        size_t fl = family_len(counters[i].series);
        int first = 1;
        for (size_t j = 0; j < i; j++)
            if (family_len(counters[j].series) == fl &&
                strncmp(counters[j].series, counters[i].series, fl) == 0)
                first = 0;
        if (!first)
            continue;
        sd_buf_printf(out, "# HELP %.*s %s\n# TYPE %.*s counter\n", (int)fl, counters[i].series,
                      counters[i].help, (int)fl, counters[i].series);
        for (size_t j = i; j < n; j++)
            if (family_len(counters[j].series) == fl &&
                strncmp(counters[j].series, counters[i].series, fl) == 0)
                sd_buf_printf(out, "%s %lld\n", counters[j].series,
                              (long long)atomic_load(&counters[j].value));
    }
}
