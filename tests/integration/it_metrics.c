/* Prometheus metrics of serverdir (/metrics) and bigbrother (metrics_listen), scraped
 * from the real daemons and parsed with a strict text-exposition parser: every line is a
 * comment, blank, or `name{labels} value`; HELP/TYPE come before a family's samples;
 * names and label names are valid; counters end in _total; histogram buckets are
 * cumulative and +Inf equals _count; no series twice. Then the values must move as the
 * test causes events: a lock grant, a conflict, a fenced save, a master-list heartbeat
 * (and the list-size gauge), a gameproc killed with SIGKILL (a restart by reason killed)
 * and a hung one (a hang kill). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness_bigbrother.h"
#include "harness.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;
static bbt_t bbt;
static int bb_metrics_port;

/* ---- a small parser of the text exposition format (0.0.4) ---- */

#define MAX_SAMPLES 4096
#define MAX_FAMILIES 512

typedef struct {
    char series[512]; /* name{labels} exactly as written, or name */
    char name[128];
    char labels[384]; /* inside the braces, "" when none */
    double value;
} sample_t;

typedef struct {
    sample_t s[MAX_SAMPLES];
    int n;
    struct {
        char name[128];
        char type[16];
        int help, sampled;
    } fam[MAX_FAMILIES];
    int nfam;
    char error[256];
} expo_t;

static int name_ok(const char *s, size_t n, int colon)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || (colon && s[0] == ':')))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || (colon && s[i] == ':')))
            return 0;
    return 1;
}

static int fam_find(expo_t *e, const char *name)
{
    for (int i = 0; i < e->nfam; i++)
        if (!strcmp(e->fam[i].name, name))
            return i;
    return -1;
}

/* The family a sample belongs to: histogram series drop _bucket/_sum/_count. */
static int fam_of_sample(expo_t *e, const char *name)
{
    int f = fam_find(e, name);
    if (f >= 0)
        return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && !strcmp(name + n - k, suffixes[i])) {
            char base[128];
            snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
            f = fam_find(e, base);
            if (f >= 0 && !strcmp(e->fam[f].type, "histogram"))
                return f;
        }
    }
    return -1;
}

/* Validates label text `k="v",k2="v2"`; 0 if well formed. */
static int labels_ok(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = i;
        while (i < n && p[i] != '=')
            i++;
        if (i >= n || !name_ok(p + k, i - k, 0) || i + 1 >= n || p[i + 1] != '"')
            return -1;
        i += 2;
        while (i < n && p[i] != '"') {
            if (p[i] == '\\') {
                if (i + 1 >= n || !strchr("\\\"n", p[i + 1]))
                    return -1;
                i++;
            }
            i++;
        }
        if (i >= n)
            return -1;
        i++;
        if (i < n && p[i++] != ',')
            return -1;
    }
    return 0;
}

static int expo_fail(expo_t *e, int line, const char *why)
{
    snprintf(e->error, sizeof e->error, "line %d: %s", line, why);
    return -1;
}

static int parse_line(expo_t *e, int ln, const char *l)
{
    if (!*l)
        return 0;
    if (l[0] == '#') {
        char kind[8], name[128];
        if (sscanf(l, "# %7s %127s", kind, name) != 2 || (strcmp(kind, "HELP") && strcmp(kind, "TYPE")))
            return 0; /* a plain comment */
        if (!name_ok(name, strlen(name), 1))
            return expo_fail(e, ln, "bad family name");
        int f = fam_find(e, name);
        if (f < 0) {
            if (e->nfam >= MAX_FAMILIES)
                return expo_fail(e, ln, "too many families");
            f = e->nfam++;
            snprintf(e->fam[f].name, sizeof e->fam[f].name, "%s", name);
        }
        if (e->fam[f].sampled)
            return expo_fail(e, ln, "HELP/TYPE after the family's samples");
        if (!strcmp(kind, "HELP")) {
            if (e->fam[f].help++)
                return expo_fail(e, ln, "HELP twice");
            return 0;
        }
        if (e->fam[f].type[0])
            return expo_fail(e, ln, "TYPE twice");
        const char *t = l + strlen("# TYPE ") + strlen(name);
        while (*t == ' ')
            t++;
        if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram") &&
            strcmp(t, "summary") && strcmp(t, "untyped"))
            return expo_fail(e, ln, "unknown TYPE");
        snprintf(e->fam[f].type, sizeof e->fam[f].type, "%s", t);
        if (!strcmp(t, "counter") &&
            (strlen(name) < 6 || strcmp(name + strlen(name) - 6, "_total")))
            return expo_fail(e, ln, "counter name does not end in _total");
        return 0;
    }
    if (e->n >= MAX_SAMPLES)
        return expo_fail(e, ln, "too many samples");
    sample_t *s = &e->s[e->n];
    size_t nl = strcspn(l, "{ ");
    if (!name_ok(l, nl, 1) || nl >= sizeof s->name)
        return expo_fail(e, ln, "bad metric name");
    memcpy(s->name, l, nl);
    s->name[nl] = 0;
    const char *p = l + nl;
    s->labels[0] = 0;
    if (*p == '{') {
        const char *end = strstr(p, "} ");
        if (!end || (size_t)(end - p - 1) >= sizeof s->labels || labels_ok(p + 1, (size_t)(end - p - 1)))
            return expo_fail(e, ln, "bad labels");
        memcpy(s->labels, p + 1, (size_t)(end - p - 1));
        s->labels[end - p - 1] = 0;
        p = end + 1;
    }
    if (*p != ' ')
        return expo_fail(e, ln, "no value");
    p++;
    snprintf(s->series, sizeof s->series, "%.*s", (int)(p - 1 - l), l);
    char *vend;
    if (!strcmp(p, "+Inf"))
        s->value = INFINITY;
    else if (!strcmp(p, "-Inf"))
        s->value = -INFINITY;
    else {
        s->value = strtod(p, &vend);
        if (vend == p || (*vend && *vend != ' '))
            return expo_fail(e, ln, "bad value");
    }
    int f = fam_of_sample(e, s->name);
    if (f < 0 || !e->fam[f].type[0])
        return expo_fail(e, ln, "sample without a TYPE before it");
    e->fam[f].sampled = 1;
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].series, s->series))
            return expo_fail(e, ln, "series twice");
    e->n++;
    return 0;
}

/* Checks every histogram: per label set (le removed) buckets grow and +Inf == _count. */
static int check_histograms(expo_t *e)
{
    for (int i = 0; i < e->n; i++) {
        const sample_t *c = &e->s[i];
        size_t nl = strlen(c->name);
        if (nl < 7 || strcmp(c->name + nl - 6, "_count"))
            continue;
        int f = fam_of_sample(e, c->name);
        if (f < 0 || strcmp(e->fam[f].type, "histogram"))
            continue;
        char bucket[140];
        snprintf(bucket, sizeof bucket, "%.*s_bucket", (int)(nl - 6), c->name);
        double prev = 0, inf = -1;
        int nb = 0;
        for (int k = 0; k < e->n; k++) {
            const sample_t *b = &e->s[k];
            const char *le = strstr(b->labels, ",le=\"");
            if (strcmp(b->name, bucket) || !le || (size_t)(le - b->labels) != strlen(c->labels) ||
                strncmp(b->labels, c->labels, strlen(c->labels)))
                continue;
            if (b->value < prev) {
                snprintf(e->error, sizeof e->error, "%s: buckets not cumulative", b->series);
                return -1;
            }
            prev = b->value;
            nb++;
            if (!strcmp(le, ",le=\"+Inf\""))
                inf = b->value;
        }
        if (nb < 2 || inf != c->value) {
            snprintf(e->error, sizeof e->error, "%s: +Inf bucket %g != count %g (%d buckets)",
                     c->series, inf, c->value, nb);
            return -1;
        }
    }
    return 0;
}

static int expo_parse(expo_t *e, const char *text)
{
    memset(e, 0, sizeof *e);
    int ln = 0;
    const char *p = text;
    while (*p) {
        ln++;
        size_t n = strcspn(p, "\n");
        char line[1024];
        if (n >= sizeof line)
            return expo_fail(e, ln, "line too long");
        memcpy(line, p, n);
        line[n] = 0;
        if (parse_line(e, ln, line))
            return -1;
        p += n;
        if (*p == '\n')
            p++;
    }
    return check_histograms(e);
}

/* The value of a series (exact text), or 0 when absent (a counter not yet created). */
static double val(const expo_t *e, const char *series)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].series, series))
            return e->s[i].value;
    return 0;
}

static int has(const expo_t *e, const char *series)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].series, series))
            return 1;
    return 0;
}

static const char *type_of(const expo_t *e, const char *family)
{
    for (int i = 0; i < e->nfam; i++)
        if (!strcmp(e->fam[i].name, family))
            return e->fam[i].type;
    return "";
}

/* Scrapes url and parses it into e (asserting it is valid). */
static void scrape(const char *url, expo_t *e)
{
    h_resp_t r;
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    char ctype[128];
    assert_int_equal(h_resp_header(&r, "Content-Type", ctype, sizeof ctype), 0);
    assert_non_null(strstr(ctype, "text/plain"));
    int rc = expo_parse(e, r.body ? r.body : "");
    if (rc)
        fprintf(stderr, "bad exposition from %s: %s\n", url, e->error);
    assert_int_equal(rc, 0);
    h_resp_free(&r);
}

static expo_t before, after; /* big: static */

static void sd_scrape(expo_t *e)
{
    char url[256];
    snprintf(url, sizeof url, "%s/metrics", sd.url);
    scrape(url, e);
}

static void bb_scrape(expo_t *e)
{
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", bb_metrics_port);
    scrape(url, e);
}

/* h_wait_every condition: serverdir's scrape (into after) shows one master server. */
static int sd_one_server(void *arg)
{
    (void)arg;
    sd_scrape(&after);
    return val(&after, "serverdir_master_servers") == 1;
}

/* h_wait_every condition: bigbrother's scrape (into after) shows an empty outbox. */
static int bb_outbox_empty(void *arg)
{
    (void)arg;
    bb_scrape(&after);
    return val(&after, "bigbrother_outbox_pending_events") == 0;
}

/* ---- set-up ---- */

static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd, NULL))
        return -1;
    bb_metrics_port = h_free_port();
    char svc[2048], extra[512];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"g\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\"],"
             " \"count\": 1, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 3000,"
             " \"liveness_timeout_ms\": 1000},"
             " \"restart\": {\"policy\": \"always\", \"backoff_min_ms\": 50,"
             " \"backoff_max_ms\": 200, \"max_restarts\": 10, \"window_s\": 60},"
             " \"stop\": {\"signal\": \"TERM\", \"grace_ms\": 500}, \"cwd\": \"%s\","
             " \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, h_tmpdir());
    snprintf(extra, sizeof extra,
             ", \"metrics_listen\": \"127.0.0.1:%d\","
             " \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"}",
             bb_metrics_port, sd.url, H_TOK_BB);
    bbt_config(&bbt, svc, extra);
    return bbt_start(&bbt) > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    bbt_stop(&bbt, 5000);
    return h_stack_teardown(state);
}

/* ---- the parser itself rejects what it must ---- */

static void parser_rejects_bad_expositions(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "x_total 1\n",                                               /* no TYPE */
        "# TYPE x counter\nx 1\n",                                   /* counter without _total */
        "# TYPE x_total counter\nx_total{a=\"b} 1\n",                /* unterminated label */
        "# TYPE x_total counter\nx_total{1a=\"b\"} 1\n",             /* bad label name */
        "# TYPE 9x gauge\n",                                         /* bad family name */
        "# TYPE x gauge\nx one\n",                                   /* bad value */
        "# TYPE x gauge\nx 1\nx 2\n",                                /* series twice */
        "# TYPE x gauge\nx 1\n# TYPE x gauge\n",                     /* TYPE after samples */
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 3\nh_sum 1\n",
    };
    static expo_t e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_not_equal(expo_parse(&e, bad[i]), 0);
    assert_int_equal(expo_parse(&e, "# HELP h t\n# TYPE h histogram\nh_bucket{r=\"a\",le=\"1\"} 1\n"
                                    "h_bucket{r=\"a\",le=\"+Inf\"} 2\nh_sum{r=\"a\"} 1\n"
                                    "h_count{r=\"a\"} 2\n\n# a comment\n"),
                     0);
}

/* ---- serverdir ---- */

static long call(const char *method, const char *token, const char *body, const char *path)
{
    h_resp_t r;
    assert_int_equal(h_http_json(method, sd.url, token, body, &r, "%s", path), 0);
    long st = r.status;
    h_resp_free(&r);
    return st;
}

static void heartbeat(void)
{
    char url[256], body[512];
    h_resp_t r;
    snprintf(url, sizeof url, "%s/v1/master/challenge", sd.url);
    assert_int_equal(h_http("POST", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    snprintf(body, sizeof body,
             "{\"challenge\":\"%s\",\"port\":27960,\"game\":\"MetricsGame\",\"map\":\"dm1\","
             "\"players\":1,\"max_players\":8}",
             json_string_value(json_object_get(j, "challenge")));
    json_decref(j);
    h_resp_free(&r);
    snprintf(url, sizeof url, "%s/v1/master/heartbeat", sd.url);
    assert_int_equal(h_http("POST", url, NULL, NULL, body, strlen(body), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
}

static void fenced_save(void)
{
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/metrics-key", sd.url);
    const char *hdrs[] = {"Lock-Seq: 999999", "Lock-Token: 0123456789abcdef0123456789abcdef",
                          "Blob-Seq: 1", NULL};
    h_resp_t r;
    assert_int_equal(h_http("PUT", url, H_TOK_GAME, "application/octet-stream", "data", 4, hdrs, &r), 0);
    assert_int_equal(r.status, 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
}

static void serverdir_metrics_move(void **state)
{
    (void)state;
    sd_scrape(&before);
    assert_string_equal(type_of(&before, "serverdir_http_requests_total"), "counter");
    assert_string_equal(type_of(&before, "serverdir_http_request_duration_seconds"), "histogram");
    assert_string_equal(type_of(&before, "serverdir_master_servers"), "gauge");
    assert_true(has(&before, "serverdir_master_servers"));
    assert_true(val(&before, "serverdir_master_servers") == 0);

    assert_int_equal(call("PUT", H_TOK_GAME, "{\"holder\": \"a\"}", "/v1/locks/metrics-key"), 200);
    assert_int_equal(call("PUT", H_TOK_GAME, "{\"holder\": \"b\"}", "/v1/locks/metrics-key"), 409);
    fenced_save();
    heartbeat();

    sd_scrape(&after);
    assert_true(val(&after, "serverdir_lock_grants_total") == val(&before, "serverdir_lock_grants_total") + 1);
    assert_true(val(&after, "serverdir_lock_conflicts_total{reason=\"lock_held\"}") ==
                val(&before, "serverdir_lock_conflicts_total{reason=\"lock_held\"}") + 1);
    assert_true(val(&after, "serverdir_blob_fenced_total{op=\"save\"}") ==
                val(&before, "serverdir_blob_fenced_total{op=\"save\"}") + 1);
    assert_true(val(&after, "serverdir_master_heartbeats_total") ==
                val(&before, "serverdir_master_heartbeats_total") + 1);
    const char *route = "{method=\"PUT\",route=\"/v1/locks/{key}\",code=\"200\"}";
    char series[256];
    snprintf(series, sizeof series, "serverdir_http_requests_total%s", route);
    assert_true(val(&after, series) == val(&before, series) + 1);
    assert_true(val(&after, "serverdir_http_request_duration_seconds_count{method=\"PUT\",route=\"/v1/locks/{key}\"}") ==
                val(&before, "serverdir_http_request_duration_seconds_count{method=\"PUT\",route=\"/v1/locks/{key}\"}") + 2);

    /* The list-size gauge is cached for a second: it shows the new server within ~1 s. */
    assert_true(h_wait_every(sd_one_server, NULL, 5000, 250));
}

/* Redis errors: Redis stops, a store call fails with 503, the counter moves. Runs last:
 * the Redis started again for the teardown listens on another port. */
static void serverdir_redis_errors_counted(void **state)
{
    (void)state;
    sd_scrape(&before);
    h_redis_stop(&redis);
    assert_int_equal(call("GET", H_TOK_VIEWER, NULL, "/v1/locks/metrics-key"), 503);
    sd_scrape(&after);
    assert_true(val(&after, "serverdir_redis_errors_total{kind=\"io\"}") +
                    val(&after, "serverdir_redis_errors_total{kind=\"connect\"}") >
                val(&before, "serverdir_redis_errors_total{kind=\"io\"}") +
                    val(&before, "serverdir_redis_errors_total{kind=\"connect\"}"));
    assert_true(val(&after, "serverdir_http_requests_total{method=\"GET\",route=\"/v1/locks/{key}\",code=\"503\"}") ==
                val(&before, "serverdir_http_requests_total{method=\"GET\",route=\"/v1/locks/{key}\",code=\"503\"}") + 1);
    assert_int_equal(h_redis_start(&redis), 0);
}

/* ---- bigbrother ---- */

static int bb_ready_gauge(void *arg)
{
    (void)arg;
    bb_scrape(&after);
    return val(&after, "bigbrother_processes{service=\"g\",state=\"ready\"}") == 1 &&
           val(&after, "bigbrother_agent_connections") == 1;
}

static void bigbrother_metrics_move(void **state)
{
    (void)state;
    json_t *in = bbt_wait(&bbt, "g", 0, "ready", 1, 10000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    assert_true(h_wait_until(bb_ready_gauge, NULL, 5000));
    bb_scrape(&before);
    assert_string_equal(type_of(&before, "bigbrother_restarts_total"), "counter");
    assert_string_equal(type_of(&before, "bigbrother_processes"), "gauge");
    assert_string_equal(type_of(&before, "bigbrother_outbox_pending_events"), "gauge");
    assert_string_equal(type_of(&before, "bigbrother_report_send_failures_total"), "counter");
    assert_true(has(&before, "bigbrother_outbox_pending_events"));
    assert_true(val(&before, "bigbrother_processes{service=\"g\",state=\"starting\"}") == 0);
    assert_true(val(&before, "bigbrother_process_starts_total{service=\"g\"}") == 1);

    /* kill -9: a restart by reason killed. */
    assert_int_equal(kill(pid, SIGKILL), 0);
    in = bbt_wait(&bbt, "g", 0, "ready", 2, 10000);
    assert_non_null(in);
    pid_t pid2 = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    assert_true(h_wait_until(bb_ready_gauge, NULL, 5000));
    assert_true(val(&after, "bigbrother_restarts_total{service=\"g\",reason=\"killed\"}") ==
                val(&before, "bigbrother_restarts_total{service=\"g\",reason=\"killed\"}") + 1);
    assert_true(val(&after, "bigbrother_process_exits_total{service=\"g\",reason=\"killed\"}") ==
                val(&before, "bigbrother_process_exits_total{service=\"g\",reason=\"killed\"}") + 1);
    assert_true(val(&after, "bigbrother_process_starts_total{service=\"g\"}") == 2);

    /* A hang (SIGSTOP): killed for its missed liveness deadline, restarted as hung. */
    assert_int_equal(kill(pid2, SIGSTOP), 0);
    in = bbt_wait(&bbt, "g", 0, "ready", 3, 10000);
    assert_non_null(in);
    json_decref(in);
    assert_true(h_wait_until(bb_ready_gauge, NULL, 5000));
    assert_true(val(&after, "bigbrother_hang_kills_total{service=\"g\",deadline=\"liveness\"}") ==
                val(&before, "bigbrother_hang_kills_total{service=\"g\",deadline=\"liveness\"}") + 1);
    assert_true(val(&after, "bigbrother_restarts_total{service=\"g\",reason=\"hung\"}") ==
                val(&before, "bigbrother_restarts_total{service=\"g\",reason=\"hung\"}") + 1);

    /* Events reach serverdir: the outbox drains to 0 pending. */
    assert_true(h_wait_every(bb_outbox_empty, NULL, 10000, 100));

    /* Anything but GET /metrics is a 404. */
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/other", bb_metrics_port);
    h_resp_t r;
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 404);
    h_resp_free(&r);
}

/* 1 when bigbrother's /metrics answers with the restart counter it had before the
 * re-exec (*(double *)arg). */
static int bb_restarts_back(void *arg)
{
    static expo_t e;
    memset(&e, 0, sizeof e);
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", bb_metrics_port);
    h_resp_t r;
    int ok = h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r) == 0 && r.status == 200 &&
             expo_parse(&e, r.body) == 0 &&
             val(&e, "bigbrother_restarts_total{service=\"g\",reason=\"killed\"}") ==
                 *(double *)arg;
    h_resp_free(&r);
    return ok;
}

/* The counters survive bigbrother's SIGHUP re-exec: the restart counted before is still
 * counted after, and /metrics is served by the new image. */
static void bigbrother_counters_survive_reexec(void **state)
{
    (void)state;
    bb_scrape(&before);
    double killed = val(&before, "bigbrother_restarts_total{service=\"g\",reason=\"killed\"}");
    assert_true(killed >= 1); /* bigbrother_metrics_move killed g once */
    assert_int_equal(kill(bbt.pid, SIGHUP), 0);
    assert_true(bbt_wait_file_has(bbt.log, "msg=\"instance re-adopted\"",
                                  h_valgrind() ? 30000 : 5000));
    assert_true(h_wait_every(bb_restarts_back, &killed, h_valgrind() ? 30000 : 5000, 100));
    assert_true(bbt_alive(bbt.pid));
}

/* 1 when bigbrother's /metrics answers 200 (transport errors allowed while waiting). */
static int bb_metrics_answer(void *arg)
{
    (void)arg;
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", bb_metrics_port);
    h_resp_t r;
    int ok = h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r) == 0 && r.status == 200;
    h_resp_free(&r);
    return ok;
}

/* Stuck scrapers (connections that send half a request and never finish, more than the
 * metrics server's connection limit) do not delay supervision: a killed gameproc is
 * restarted as fast as ever, and /metrics answers again once they go away. */
static void stuck_scrapers_do_not_block_supervision(void **state)
{
    (void)state;
    enum { NSTUCK = 24 };
    int fds[NSTUCK];
    for (int i = 0; i < NSTUCK; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fds[i] >= 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)bb_metrics_port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof sa), 0);
        static const char half[] = "GET /metr";
        assert_int_equal(send(fds[i], half, sizeof half - 1, MSG_NOSIGNAL), (ssize_t)(sizeof half - 1));
    }
    json_t *in = bbt_wait(&bbt, "g", 0, "ready", 1, 10000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    long long gen = bbt_int(in, "generation");
    json_decref(in);
    int64_t t0 = h_now_ms();
    assert_int_equal(kill(pid, SIGKILL), 0);
    in = bbt_wait(&bbt, "g", 0, "ready", (int)gen + 1, 10000);
    assert_non_null(in);
    json_decref(in);
    int64_t took = h_now_ms() - t0;
    printf("metrics: restart with %d stuck scrapers took %lld ms\n", NSTUCK, (long long)took);
    assert_true(took < (h_valgrind() ? 8000 : 3000));
    for (int i = 0; i < NSTUCK; i++)
        close(fds[i]);
    assert_true(h_wait_until(bb_metrics_answer, NULL, 5000));
    assert_true(h_wait_until(bb_ready_gauge, NULL, 5000));
}

/* A bad metrics_listen is a config error naming the field. */
static void bad_metrics_listen(void **state)
{
    (void)state;
    bbt_t b = {0};
    bbt_config(&b, "[]", ", \"metrics_listen\": \"no-port\"");
    char log[512];
    snprintf(log, sizeof log, "%s/badlisten.log", b.dir);
    const char *argv[] = {BIGBROTHER, "--config", b.cfg, NULL};
    assert_int_equal(bbt_run(argv, log), 100);
    assert_true(bbt_file_has(log, "metrics_listen"));
}

int main(void)
{
    h_init(90);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parser_rejects_bad_expositions),
        cmocka_unit_test(serverdir_metrics_move),
        cmocka_unit_test(bigbrother_metrics_move),
        cmocka_unit_test(bigbrother_counters_survive_reexec),
        cmocka_unit_test(stuck_scrapers_do_not_block_supervision),
        cmocka_unit_test(bad_metrics_listen),
        cmocka_unit_test(serverdir_redis_errors_counted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
