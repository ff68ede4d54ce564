/* The reporter (bigbrother/report/: reporter.c + outbox.c) against a ServerDir stand-in that this
 * test serves itself with libmicrohttpd: it applies event batches all-or-nothing and
 * dedupes them by id like ServerDir does, and can be made unreachable, answer 503, drop
 * connections after applying a batch, answer slowly, or reject a bad event with 400.
 *
 * Covered: an outage (refused, 503, dropped answers) then recovery delivers every event
 * once and in order with one log line each way; a producer killed with -9 mid-send and a
 * new one on the same state dir lose and duplicate nothing from ServerDir's view; a bad
 * event is bisected out to the dead-letter file without wedging the outbox; the machine
 * lease is renewed every ttl/3 and neither job blocks the other; batches too slow for the
 * request timeout shrink until they get through. Then against the real serverdir (and
 * redis-server): the directory matches what happened across a serverdir outage, and a
 * producer killed with -9 loses and duplicates nothing there either; and the real
 * bigbrother, with processes killed and bigbrother itself killed with -9 during a
 * serverdir outage, ends with a directory that is exactly what it supervises.
 *
 * The producer is this same binary re-executed as `it_outbox producer ...`, a stand-in for
 * bigbrother (one supervision thread calling bb_report_event, the reporter thread). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_bigbrother.h"
#include "harness_stack.h"
#include "harness.h"
#include "report/bb_report.h"
#include "sdlog.h"
#include "sdutil.h"

/* ---- the ServerDir stand-in ---- */

enum mode { M_OK, M_503, M_DROP_AFTER_APPLY };

#define MAX_EVENTS 200000
#define MAX_PUTS 256

typedef struct {
    char id[64];
    char instance[64];
} rec_t;

static struct fake {
    struct MHD_Daemon *d;
    int port;
    char url[64];
    pthread_mutex_t mu;
    enum mode events_mode, lease_mode;
    int delay_ms;           /* before answering an events POST */
    int slow_over, slow_ms; /* before answering a batch of more than slow_over events */
    rec_t *events;          /* unique events in the order first applied */
    int nevents;
    long duplicates, posts, rejected, max_batch;
    int64_t put_ms[MAX_PUTS];
    int nputs;
    long lease_tries;       /* lease PUTs, refused ones too */
    json_t *last_put;
    int bad_auth;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct upload {
    char *p;
    size_t len;
};

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *body)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static int seen_id(const char *id)
{
    for (int i = fk.nevents - 1; i >= 0; i--)
        if (strcmp(fk.events[i].id, id) == 0)
            return 1;
    return 0;
}

/* Applies a batch like ServerDir: validates all first (a bad one rejects the whole batch
 * and applies nothing), then records each event once by id. */
static enum MHD_Result events_post(struct MHD_Connection *c, const struct upload *u, size_t *nbatch)
{
    char msg[256];
    json_t *body = json_loadb(u->p ? u->p : "", u->len, 0, NULL);
    json_t *evs = json_object_get(body, "events");
    size_t n = json_array_size(evs);
    *nbatch = n;
    fk.posts++;
    if ((long)n > fk.max_batch)
        fk.max_batch = (long)n;
    if (n == 0 || n > 1000) {
        json_decref(body);
        return answer(c, 400, "{\"error\":{\"code\":\"bad_field\",\"message\":\"events must hold 1 to 1000 events\"}}");
    }
    for (size_t i = 0; i < n; i++) {
        const char *inst = json_string_value(json_object_get(json_array_get(evs, i), "instance"));
        const char *id = json_string_value(json_object_get(json_array_get(evs, i), "id"));
        if (!inst || !id || strncmp(inst, "poison", 6) == 0) {
            fk.rejected++;
            snprintf(msg, sizeof msg,
                     "{\"error\":{\"code\":\"bad_field\",\"message\":\"events[%zu].instance is poisoned\"}}", i);
            json_decref(body);
            return answer(c, 400, msg);
        }
    }
    long acc = 0, dup = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(evs, i);
        const char *id = json_string_value(json_object_get(e, "id"));
        if (seen_id(id) || fk.nevents == MAX_EVENTS) {
            dup++;
            continue;
        }
        snprintf(fk.events[fk.nevents].id, sizeof fk.events[0].id, "%s", id);
        snprintf(fk.events[fk.nevents].instance, sizeof fk.events[0].instance, "%s",
                 json_string_value(json_object_get(e, "instance")));
        fk.nevents++;
        acc++;
    }
    fk.duplicates += dup;
    json_decref(body);
    snprintf(msg, sizeof msg, "{\"accepted\":%ld,\"duplicates\":%ld}", acc, dup);
    return answer(c, 200, msg);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *data,
                               size_t *size, void **ctx)
{
    struct upload *u = *ctx;
    if (!u) {
        *ctx = calloc(1, sizeof *u);
        return *ctx ? MHD_YES : MHD_NO;
    }
    if (*size) {
        if (u->len + *size > (2u << 20))
            return MHD_NO;
        char *np = realloc(u->p, u->len + *size);
        if (!np)
            return MHD_NO;
        memcpy(np + u->len, data, *size);
        u->p = np;
        u->len += *size;
        *size = 0;
        return MHD_YES;
    }
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    int is_events = strcmp(method, "POST") == 0 && strcmp(url, "/v1/clusters/c1/events") == 0;
    int is_lease = strcmp(method, "PUT") == 0 && strcmp(url, "/v1/clusters/c1/machines/m1") == 0;
    pthread_mutex_lock(&fk.mu);
    if (!auth || strcmp(auth, "Bearer " H_TOK_BB) != 0)
        fk.bad_auth++;
    enum mode m = is_events ? fk.events_mode : fk.lease_mode;
    int delay = fk.delay_ms;
    size_t nbatch = 0;
    enum MHD_Result ret;
    if (!is_events && !is_lease) {
        ret = answer(c, 404, "{\"error\":{\"code\":\"not_found\",\"message\":\"no route\"}}");
    } else if (m == M_503) {
        if (is_events)
            fk.posts++;
        else
            fk.lease_tries++;
        ret = answer(c, 503, "{\"error\":{\"code\":\"store_unavailable\",\"message\":\"redis down\"}}");
    } else if (is_lease) {
        if (fk.nputs < MAX_PUTS)
            fk.put_ms[fk.nputs++] = h_now_ms();
        json_decref(fk.last_put);
        fk.last_put = json_loadb(u->p ? u->p : "", u->len, 0, NULL);
        ret = answer(c, 200, "{\"cluster\":\"c1\",\"machine\":\"m1\",\"expires_in_ms\":1500}");
    } else {
        ret = events_post(c, u, &nbatch);
        if (fk.slow_ms && nbatch > (size_t)fk.slow_over)
            delay = fk.slow_ms;
        if (m == M_DROP_AFTER_APPLY)
            ret = MHD_NO; /* applied, but the answer never arrives */
    }
    pthread_mutex_unlock(&fk.mu);
    if (is_events && delay)
        h_sleep_ms(delay);
    return ret;
}

static void request_done(void *cls, struct MHD_Connection *c, void **ctx,
                         enum MHD_RequestTerminationCode toe)
{
    struct upload *u = *ctx;
    if (u)
        free(u->p);
    free(u);
    *ctx = NULL;
}

static void fake_listen(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fk.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fk.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION,
                            (uint16_t)fk.port, NULL, NULL, handler, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                            MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL, MHD_OPTION_END);
    assert_non_null(fk.d);
}

static void fake_down(void)
{
    MHD_stop_daemon(fk.d);
    fk.d = NULL;
}

static int setup(void **state)
{
    fk.events = calloc(MAX_EVENTS, sizeof *fk.events);
    fk.port = h_free_port();
    snprintf(fk.url, sizeof fk.url, "http://127.0.0.1:%d", fk.port);
    return fk.events ? 0 : -1;
}

static int teardown(void **state)
{
    if (fk.d)
        fake_down();
    free(fk.events);
    json_decref(fk.last_put);
    return 0;
}

/* Each test starts from a clean stand-in, listening and answering 200. */
static void fake_reset(void)
{
    if (!fk.d)
        fake_listen();
    pthread_mutex_lock(&fk.mu);
    fk.events_mode = fk.lease_mode = M_OK;
    fk.delay_ms = fk.slow_ms = fk.slow_over = 0;
    fk.nevents = 0;
    fk.duplicates = fk.posts = fk.rejected = fk.max_batch = 0;
    fk.nputs = 0;
    fk.lease_tries = 0;
    fk.bad_auth = 0;
    pthread_mutex_unlock(&fk.mu);
}

static void fake_mode(enum mode events, enum mode lease, int delay_ms)
{
    pthread_mutex_lock(&fk.mu);
    fk.events_mode = events;
    fk.lease_mode = lease;
    fk.delay_ms = delay_ms;
    pthread_mutex_unlock(&fk.mu);
}

static long fake_posts(void)
{
    pthread_mutex_lock(&fk.mu);
    long n = fk.posts;
    pthread_mutex_unlock(&fk.mu);
    return n;
}

/* ---- helpers ---- */

static bb_report_t *reporter_start(const char *sdir, int ttl_ms)
{
    json_t *labels = json_pack("{s:s}", "zone", "eu");
    bb_report_opts_t o = {.state_dir = sdir, .cluster = "c1", .machine = "m1", .urls = fk.url,
                          .token = H_TOK_BB, .address = "127.0.0.1", .labels = labels,
                          .capacity = 400, .version = "0.1.0-test", .lease_ttl_ms = ttl_ms};
    bb_report_t *r = NULL;
    assert_int_equal(bb_report_start(&o, &r), 0);
    json_decref(labels);
    return r;
}

static void event(bb_report_t *r, const char *tag, int i)
{
    char inst[64];
    snprintf(inst, sizeof inst, "%s-%d", tag, i);
    json_t *e = json_pack("{s:s, s:s, s:s, s:i, s:i}", "type", "started", "instance", inst,
                          "service", "zone", "pid", 1000 + i % 100000, "slot", i);
    assert_int_equal(bb_report_event(r, e), 0);
    json_decref(e);
}

static int drained(void *r) { return bb_report_pending(r) == 0; }

/* h_wait_until condition: the stand-in got at least *arg (a long) POSTs. */
static int posts_reach(void *arg)
{
    return fake_posts() >= *(const long *)arg;
}

/* h_wait_until condition: the stand-in refused at least *arg (a long) lease PUTs. */
static int lease_tries_reach(void *arg)
{
    pthread_mutex_lock(&fk.mu);
    long n = fk.lease_tries;
    pthread_mutex_unlock(&fk.mu);
    return n >= *(const long *)arg;
}

/* h_wait_until condition: the stand-in applied an event (arg unused). */
static int events_applied(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&fk.mu);
    int applied = fk.nevents;
    pthread_mutex_unlock(&fk.mu);
    return applied > 0;
}

/* h_wait_until condition: the stand-in got a lease PUT (arg unused). */
static int lease_put(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&fk.mu);
    int puts = fk.nputs;
    pthread_mutex_unlock(&fk.mu);
    return puts > 0;
}

/* What progress_above waits for: the producer's progress file at path shows more than n
 * events appended. */
typedef struct {
    const char *path;
    long n;
} progress_t;

/* h_wait_until condition: see progress_t. */
static int progress_above(void *arg)
{
    const progress_t *p = arg;
    long confirmed = 0;
    FILE *f = fopen(p->path, "r");
    if (f && fscanf(f, "%ld", &confirmed) != 1)
        confirmed = 0;
    if (f)
        fclose(f);
    return confirmed > p->n;
}

/* Checks that the stand-in holds exactly tag-0 .. tag-(n-1), once each, in this order,
 * starting at its index *at; advances *at. */
static void expect_run(const char *tag, int n, int *at)
{
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s-%d", tag, i);
        assert_true(*at + i < fk.nevents);
        assert_string_equal(fk.events[*at + i].instance, want);
    }
    *at += n;
    pthread_mutex_unlock(&fk.mu);
}

/* How many lines of the log file hold `needle`. */
static int log_count(const char *path, const char *needle)
{
    char *text = NULL;
    size_t len = 0;
    if (sd_read_file(path, 16 << 20, &text, &len))
        return -1;
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    free(text);
    return n;
}

static const char *log_to_file(const char *dir)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/reporter.log", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    sd_log_set_fd(fd);
    return path;
}

/* ---- tests ---- */

/* ServerDir unreachable (nothing listening), then answering 503, then applying batches
 * but dropping the answers, then healthy: every event arrives once, in order; resends
 * are recognised as duplicates by id; the outage is logged once each way. */
static void outage_then_recovery_delivers_everything_once(void **state)
{
    fake_reset();
    const char *dir = h_tmpdir();
    const char *log = log_to_file(dir);
    fake_down();
    bb_report_t *r = reporter_start(dir, 15000);
    for (int i = 0; i < 300; i++) {
        event(r, "o", i);
        if (i % 50 == 0)
            h_sleep_ms(100);
    }
    assert_int_equal(bb_report_pending(r), 300);
    assert_true(bb_report_send_failures(r) >= 2);

    fake_listen();
    fake_mode(M_503, M_503, 0);
    long posts = fake_posts() + 2;
    for (int i = 300; i < 600; i++)
        event(r, "o", i);
    assert_true(h_wait_until(posts_reach, &posts, 8000));
    assert_int_equal(bb_report_pending(r), 600);

    /* The first batch applied with its answer lost is sent again later: a duplicate. */
    fake_mode(M_DROP_AFTER_APPLY, M_503, 0);
    h_wait_until(events_applied, NULL, 15000);
    assert_int_equal(bb_report_pending(r), 600); /* nothing acknowledged, nothing dropped */

    fake_mode(M_OK, M_OK, 0);
    for (int i = 600; i < 700; i++)
        event(r, "o", i);
    assert_true(h_wait_until(drained, r, 40000));
    int at = 0;
    expect_run("o", 700, &at);
    pthread_mutex_lock(&fk.mu);
    assert_int_equal(fk.nevents, 700);
    assert_true(fk.duplicates > 0);
    assert_true(fk.max_batch <= 500);
    assert_int_equal(fk.bad_auth, 0);
    pthread_mutex_unlock(&fk.mu);
    /* the lease retries on its own backoff (at most ttl/3) */
    h_wait_until(lease_put, NULL, 10000);
    int64_t failures = bb_report_send_failures(r);
    assert_true(failures >= 4);
    bb_report_stop(r);
    sd_log_set_fd(2);
    /* One line each way per request kind (events, machine lease), not one per retry. */
    assert_int_equal(log_count(log, "serverdir unreachable"), 2);
    assert_int_equal(log_count(log, "serverdir reachable again"), 2);
    assert_int_equal(log_count(log, "request=events"), 2);
}

/* A producer process is killed with -9 while batches are in flight (the stand-in answers
 * slowly); a new one on the same state dir sends what is left and then its own events.
 * ServerDir ends with every event confirmed by the first producer and all of the second's,
 * each once, in order, and no instance with two ids. */
static void kill9_producer_loses_and_duplicates_nothing(void **state)
{
    fake_reset();
    fake_mode(M_OK, M_OK, 100);
    const char *dir = h_tmpdir();
    char self[512], progress[600], logpath[600];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(l > 0);
    self[l] = '\0';
    snprintf(progress, sizeof progress, "%s/progress", dir);
    snprintf(logpath, sizeof logpath, "%s/producer.log", dir);

    const char *argv_a[] = {self, "producer", dir, fk.url, "a", "1000000", "300", progress, NULL};
    pid_t a = h_spawn(argv_a, logpath, NULL);
    h_wait_until(progress_above, &(progress_t){progress, 100}, 15000); /* mid-stream */
    assert_int_equal(kill(a, SIGKILL), 0);
    int st = h_wait_exit(a, 5000);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    long confirmed = 0;
    FILE *f = fopen(progress, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%ld", &confirmed), 1);
    fclose(f);
    assert_true(confirmed > 100);
    pthread_mutex_lock(&fk.mu);
    int before = fk.nevents;
    pthread_mutex_unlock(&fk.mu);
    assert_true(before < confirmed); /* the kill left a backlog for the next run */

    fake_mode(M_OK, M_OK, 5);
    const char *argv_b[] = {self, "producer", dir, fk.url, "b", "200", "1000", progress, NULL};
    pid_t b = h_spawn(argv_b, logpath, NULL);
    st = h_wait_exit(b, 60000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);

    /* Every "a" event up to the last one the producer saw appended (and maybe a few it
     * appended but died before counting), then every "b" event. */
    pthread_mutex_lock(&fk.mu);
    int na = 0;
    while (na < fk.nevents && fk.events[na].instance[0] == 'a')
        na++;
    int total = fk.nevents;
    pthread_mutex_unlock(&fk.mu);
    assert_true(na >= confirmed && na <= confirmed + 1);
    int at = 0;
    expect_run("a", na, &at);
    expect_run("b", 200, &at);
    assert_int_equal(total, na + 200);
}

/* A batch holding an event ServerDir rejects (400) is bisected; the bad event goes to the
 * dead-letter file with ServerDir's message, and everything else is delivered in order. */
static void rejected_event_goes_to_dead_letter(void **state)
{
    fake_reset();
    const char *dir = h_tmpdir();
    fake_mode(M_503, M_OK, 0);
    bb_report_t *r = reporter_start(dir, 15000);
    for (int i = 0; i < 120; i++) {
        if (i == 77) {
            json_t *e = json_pack("{s:s, s:s, s:s}", "type", "ready", "instance", "poison-1", "service", "zone");
            assert_int_equal(bb_report_event(r, e), 0);
            json_decref(e);
        }
        event(r, "p", i);
    }
    /* Once a try was refused with 503, the next one takes the whole backlog as one batch. */
    long one = 1;
    h_wait_until(posts_reach, &one, 5000);
    fake_mode(M_OK, M_OK, 0);
    assert_true(h_wait_until(drained, r, 20000));
    bb_report_stop(r);
    int at = 0;
    expect_run("p", 120, &at);
    pthread_mutex_lock(&fk.mu);
    assert_int_equal(fk.nevents, 120);
    assert_true(fk.rejected >= 2 && fk.rejected <= 10); /* a bisection, not one try per event */
    assert_true(fk.max_batch == 121);
    pthread_mutex_unlock(&fk.mu);

    char path[600], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/dead-letter.jsonl", dir);
    assert_int_equal(sd_read_file(path, 1 << 20, &text, &len), 0);
    json_t *dl = json_loadb(text, len, 0, NULL);
    free(text);
    assert_non_null(dl);
    assert_int_equal(json_integer_value(json_object_get(dl, "status")), 400);
    assert_string_equal(json_string_value(json_object_get(dl, "code")), "bad_field");
    assert_string_equal(json_string_value(json_object_get(dl, "message")), "events[0].instance is poisoned");
    assert_string_equal(json_string_value(json_object_get(json_object_get(dl, "event"), "instance")), "poison-1");
    json_decref(dl);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The lease is registered at start and renewed every ttl/3 with the machine's details;
 * events failing do not slow it, and a failing lease does not hold events back. */
static void lease_cadence_independent_of_events(void **state)
{
    fake_reset();
    fake_mode(M_503, M_OK, 0);
    const char *dir = h_tmpdir();
    bb_report_t *r = reporter_start(dir, 1500);
    for (int i = 0; i < 50; i++)
        event(r, "l", i);
    h_sleep_ms(2300); /* the lease's cadence over this span is what is tested */
    pthread_mutex_lock(&fk.mu);
    int nputs = fk.nputs;
    int64_t t[MAX_PUTS];
    memcpy(t, fk.put_ms, sizeof t);
    json_t *body = json_incref(fk.last_put);
    pthread_mutex_unlock(&fk.mu);
    /* Every ttl/3 = 500 ms: the median gap says the cadence, and no gap comes near the
     * ttl (the lease never lapsed) even on a loaded machine. */
    assert_true(nputs >= 4 && nputs <= 6);
    int64_t gaps[MAX_PUTS];
    for (int i = 1; i < nputs; i++) {
        gaps[i - 1] = t[i] - t[i - 1];
        assert_true(gaps[i - 1] >= 450 && gaps[i - 1] < 1000);
    }
    qsort(gaps, (size_t)(nputs - 1), sizeof gaps[0], cmp_i64);
    int64_t median = gaps[(nputs - 1) / 2];
    assert_true(median >= 480 && median <= 650);
    assert_string_equal(json_string_value(json_object_get(body, "address")), "127.0.0.1");
    assert_string_equal(json_string_value(json_object_get(json_object_get(body, "labels"), "zone")), "eu");
    assert_int_equal(json_integer_value(json_object_get(body, "capacity")), 400);
    assert_string_equal(json_string_value(json_object_get(body, "version")), "0.1.0-test");
    assert_int_equal(json_integer_value(json_object_get(body, "ttl_ms")), 1500);
    json_decref(body);
    assert_int_equal(bb_report_pending(r), 50);

    fake_mode(M_OK, M_503, 0);
    assert_true(h_wait_until(drained, r, 10000));
    int at = 0;
    expect_run("l", 50, &at);
    bb_report_stop(r);
}

/* Batches too big to be answered within the request timeout (ttl 1500 ms: 250 ms) are
 * applied but time out; the reporter sends smaller ones until they fit, and every event
 * still arrives once and in order. */
static void slow_batches_shrink_until_they_fit(void **state)
{
    fake_reset();
    pthread_mutex_lock(&fk.mu);
    fk.slow_over = 60;
    fk.slow_ms = 600;
    fk.events_mode = M_503;
    pthread_mutex_unlock(&fk.mu);
    const char *dir = h_tmpdir();
    bb_report_t *r = reporter_start(dir, 1500);
    for (int i = 0; i < 400; i++)
        event(r, "s", i);
    fake_mode(M_OK, M_OK, 0);
    assert_true(h_wait_until(drained, r, 30000));
    bb_report_stop(r);
    int at = 0;
    expect_run("s", 400, &at);
    pthread_mutex_lock(&fk.mu);
    assert_int_equal(fk.nevents, 400);
    fk.slow_ms = 0;
    pthread_mutex_unlock(&fk.mu);
}

/* ServerDir comes back while the lease is deep in its backoff (long ttl: the backoff
 * grows to 10 s). The first events POST it answers brings the lease renewal forward, so
 * a lease that lapsed in the outage (the machine shows lost) is back at once, not after
 * the rest of the backoff (here at least 800 ms more: the fifth refusal's). */
static void lease_renewed_when_events_get_through(void **state)
{
    fake_reset();
    fake_mode(M_OK, M_503, 0);
    const char *dir = h_tmpdir();
    bb_report_t *r = reporter_start(dir, 30000);
    long tries = 5; /* refused at about 0, 75, 225, 525, 1125 ms: the next in 800-1600 ms */
    assert_true(h_wait_until(lease_tries_reach, &tries, 6000));
    fake_mode(M_OK, M_OK, 0);
    int64_t t0 = h_now_ms();
    event(r, "h", 0);
    assert_true(h_wait_until(drained, r, 5000));
    assert_true(h_wait_until(lease_put, NULL, 5000));
    pthread_mutex_lock(&fk.mu);
    int64_t renewed = fk.put_ms[0] - t0;
    pthread_mutex_unlock(&fk.mu);
    assert_in_range(renewed, 0, 400);
    bb_report_stop(r);
}

/* The other way round: events deep in their backoff (it grows to 30 s) go as soon as the
 * lease, retried every ttl/3 at most, finds ServerDir back; not after the rest of the
 * events' backoff (here at least 1.6 s more: the sixth failure's). */
static void events_resent_when_lease_gets_through(void **state)
{
    fake_reset();
    fake_mode(M_503, M_503, 0);
    const char *dir = h_tmpdir();
    bb_report_t *r = reporter_start(dir, 1500); /* the lease: retried within 500 ms */
    for (int i = 0; i < 20; i++)
        event(r, "e", i);
    long posts = 6; /* refused at about 0, 75, 225, 525, 1125, 2325 ms */
    assert_true(h_wait_until(posts_reach, &posts, 8000));
    fake_mode(M_OK, M_OK, 0);
    int64_t t0 = h_now_ms();
    assert_true(h_wait_until(drained, r, 10000));
    assert_in_range(h_now_ms() - t0, 0, 1100);
    int at = 0;
    expect_run("e", 20, &at);
    bb_report_stop(r);
}

/* ---- against a real serverdir and redis-server ---- */

static h_redis_t redis;
static h_serverdir_t sd;


/* GET path (viewer token) as JSON; asserts 200. Caller decrefs. */
static json_t *sd_get(const char *path)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "%s", path), 0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    h_resp_free(&r);
    assert_non_null(j);
    return j;
}

static void report(bb_report_t *r, const char *type, int i, const char *reason)
{
    char inst[64];
    snprintf(inst, sizeof inst, "zone-m1-%d", i);
    json_t *e = json_pack("{s:s, s:s, s:s, s:i, s:i}", "type", type, "instance", inst,
                          "service", "zone", "slot", i % 10, "generation", i / 10);
    if (strcmp(type, "started") == 0)
        json_object_set_new(e, "pid", json_integer(2000 + i));
    if (reason) {
        json_object_set_new(e, "reason", json_string(reason));
        if (strcmp(reason, "killed") == 0)
            json_object_set_new(e, "signal", json_integer(9));
        else
            json_object_set_new(e, "code", json_integer(0));
    }
    assert_int_equal(bb_report_event(r, e), 0);
    json_decref(e);
}

/* h_wait_until condition: machine m1 shows live (arg unused). */
static int machine_live(void *arg)
{
    (void)arg;
    json_t *m = sd_get("/v1/clusters/c1/machines/m1");
    const char *st = json_string_value(json_object_get(m, "state"));
    int live = st && strcmp(st, "live") == 0;
    json_decref(m);
    return live;
}

/* Processes churn while serverdir is stopped; once it is back, the directory matches what
 * happened: the live instances ready, the stopped ones stopped with their reasons, the
 * history holds every event once and in order, and the machine is live. */
static void real_serverdir_directory_matches_after_outage(void **state)
{
    assert_int_equal(h_stack_start(&redis, &sd, NULL), 0);
    const char *dir = h_tmpdir();
    bb_report_opts_t o = {.state_dir = dir, .cluster = "c1", .machine = "m1", .urls = sd.url,
                          .token = H_TOK_BB, .address = "127.0.0.1", .capacity = 400,
                          .version = "0.1.0-test", .lease_ttl_ms = 3000};
    bb_report_t *r = NULL;
    assert_int_equal(bb_report_start(&o, &r), 0);
    for (int i = 0; i < 10; i++) {
        report(r, "started", i, NULL);
        report(r, "ready", i, NULL);
    }
    assert_true(h_wait_until(drained, r, 10000));

    h_serverdir_stop(&sd);
    for (int i = 0; i < 5; i++) {
        report(r, "stopped", i, "killed");
        report(r, "started", 10 + i, NULL);
        report(r, "ready", 10 + i, NULL);
    }
    report(r, "started", 15, NULL);
    report(r, "stopped", 15, "exited");
    h_sleep_ms(1000); /* serverdir is down: nothing may be acknowledged meanwhile */
    assert_int_equal(bb_report_pending(r), 17);
    assert_int_equal(h_serverdir_restart(&sd, redis.url), 0); /* the same port and URL */
    assert_true(h_wait_until(drained, r, 20000));
    /* The outage outlasted the lease's ttl: the machine is back to live with the renewal
     * that follows the first batch ServerDir takes (see lease_renewed_when_events_...). */
    assert_true(h_wait_until(machine_live, NULL, 2000));
    bb_report_stop(r);

    json_t *live = sd_get("/v1/clusters/c1/processes");
    json_t *procs = json_object_get(live, "processes");
    assert_int_equal(json_array_size(procs), 10);
    for (size_t k = 0; k < 10; k++) {
        json_t *p = json_array_get(procs, k);
        const char *inst = json_string_value(json_object_get(p, "instance"));
        int i = atoi(strrchr(inst, '-') + 1);
        assert_true(i >= 5 && i < 15);
        assert_string_equal(json_string_value(json_object_get(p, "state")), "ready");
        assert_string_equal(json_string_value(json_object_get(p, "machine")), "m1");
        assert_int_equal(json_integer_value(json_object_get(p, "pid")), 2000 + i);
    }
    json_decref(live);

    json_t *stopped = sd_get("/v1/clusters/c1/processes?state=stopped");
    procs = json_object_get(stopped, "processes");
    assert_int_equal(json_array_size(procs), 6);
    for (size_t k = 0; k < 6; k++) {
        json_t *p = json_array_get(procs, k);
        const char *inst = json_string_value(json_object_get(p, "instance"));
        int i = atoi(strrchr(inst, '-') + 1);
        assert_string_equal(json_string_value(json_object_get(p, "state")), "stopped");
        assert_string_equal(json_string_value(json_object_get(p, "reason")), i == 15 ? "exited" : "killed");
        assert_true(i < 5 || i == 15);
    }
    json_decref(stopped);

    /* The history: every event once, in the order it happened. */
    json_t *hist = sd_get("/v1/clusters/c1/events?limit=1000");
    json_t *evs = json_object_get(hist, "events");
    assert_int_equal(json_array_size(evs), 37);
    int64_t seq_prev = 0;
    for (size_t k = 0; k < json_array_size(evs); k++) {
        const char *id = json_string_value(json_object_get(json_array_get(evs, k), "id"));
        assert_non_null(id);
        int64_t seq = strtoll(strrchr(id, '-') + 1, NULL, 10);
        assert_true(seq > seq_prev);
        seq_prev = seq;
    }
    json_decref(hist);

    json_t *m = sd_get("/v1/clusters/c1/machines/m1");
    assert_string_equal(json_string_value(json_object_get(m, "state")), "live");
    assert_string_equal(json_string_value(json_object_get(m, "address")), "127.0.0.1");
    assert_int_equal(json_integer_value(json_object_get(m, "capacity")), 400);
    json_decref(m);
    h_stack_stop(&redis, &sd);
}

/* A producer killed with -9 mid-stream and a second one on the same state dir, against
 * the real serverdir: the directory holds every event the producers appended, once. */
static void real_serverdir_kill9_producer(void **state)
{
    assert_int_equal(h_stack_start(&redis, &sd, NULL), 0);
    const char *dir = h_tmpdir();
    char self[512], progress[600], logpath[600];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(l > 0);
    self[l] = '\0';
    snprintf(progress, sizeof progress, "%s/progress", dir);
    snprintf(logpath, sizeof logpath, "%s/producer.log", dir);
    const char *argv_a[] = {self, "producer", dir, sd.url, "a", "1000000", "1000", progress, NULL};
    pid_t a = h_spawn(argv_a, logpath, NULL);
    h_wait_until(progress_above, &(progress_t){progress, 50}, 15000); /* mid-stream */
    assert_int_equal(kill(a, SIGKILL), 0);
    int st = h_wait_exit(a, 5000);
    long confirmed = 0;
    FILE *f = fopen(progress, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%ld", &confirmed), 1);
    fclose(f);
    assert_true(confirmed > 50);

    const char *argv_b[] = {self, "producer", dir, sd.url, "b", "100", "1000", progress, NULL};
    pid_t b = h_spawn(argv_b, logpath, NULL);
    st = h_wait_exit(b, 60000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);

    json_t *live = sd_get("/v1/clusters/c1/processes?limit=5000");
    json_t *procs = json_object_get(live, "processes");
    long na = 0, nb = 0;
    for (size_t k = 0; k < json_array_size(procs); k++) {
        const char *inst = json_string_value(json_object_get(json_array_get(procs, k), "instance"));
        na += inst[0] == 'a';
        nb += inst[0] == 'b';
    }
    json_decref(live);
    assert_true(na >= confirmed && na <= confirmed + 1);
    assert_int_equal(nb, 100);
    /* ServerDir applied each event id once (resends counted as duplicates). */
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/metrics"), 0);
    char want[96];
    snprintf(want, sizeof want, "serverdir_events_accepted_total %ld\n", na + nb);
    assert_non_null(strstr(r.body, want));
    h_resp_free(&r);
    h_stack_stop(&redis, &sd);
}

/* 1 when bigbrother's control socket reports no pending event. */
static int bb_drained(void *b)
{
    json_t *status = bbt_ctl(b, "status");
    json_t *p = json_object_get(status, "pending_events");
    int done = json_is_integer(p) && json_integer_value(p) == 0;
    json_decref(status);
    return done;
}

/* End to end with the real bigbrother: serverdir is stopped while
 * supervised processes are killed and restarted and bigbrother itself is killed with -9
 * and started again; once serverdir is back, the live directory is exactly what bbctl
 * shows, the killed instances are stopped with reason killed(signal 9), and serverdir's history
 * holds exactly the events bigbrother recorded in its outbox, once each, in order. The
 * lease (30 s) outlasts the outage even on a loaded host: a lease that runs out meanwhile
 * is another story (the lost-machine sweep and the relive, it.bb_partition). */
static void real_bigbrother_churn_during_outage(void **state)
{
    assert_int_equal(h_stack_start(&redis, &sd, NULL), 0);
    bbt_t b = {0};
    char extra[512];
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"}, \"lease_ttl_ms\": 30000",
             sd.url, H_TOK_BB);
    bbt_config(&b, "[{\"name\": \"zone\", \"command\": \"/bin/sleep\", \"args\": [\"100000\"],"
                   " \"count\": 4, \"health\": {\"type\": \"none\"},"
                   " \"restart\": {\"backoff_min_ms\": 0, \"backoff_max_ms\": 0}}]",
               extra);
    assert_true(bbt_start(&b) > 0);
    for (int slot = 0; slot < 4; slot++)
        json_decref(bbt_wait(&b, "zone", slot, "ready", 0, 10000));
    assert_true(h_wait_until(bb_drained, &b, 10000));
    json_t *live = sd_get("/v1/clusters/c1/processes");
    assert_int_equal(json_array_size(json_object_get(live, "processes")), 4);
    json_decref(live);

    /* The outage: kills, restarts, and bigbrother itself killed with -9 and restarted. */
    h_serverdir_stop(&sd);
    const int kills[] = {0, 1, 0};
    for (size_t k = 0; k < sizeof kills / sizeof kills[0]; k++) {
        json_t *in = bbt_inst(&b, "zone", kills[k]);
        assert_non_null(in);
        long long gen = bbt_int(in, "generation");
        assert_int_equal(kill((pid_t)bbt_int(in, "pid"), SIGKILL), 0);
        json_decref(in);
        in = bbt_wait(&b, "zone", kills[k], "ready", (int)gen + 1, 10000);
        assert_non_null(in);
        json_decref(in);
    }
    assert_int_equal(kill(b.pid, SIGKILL), 0);
    h_wait_exit(b.pid, 5000);
    assert_true(bbt_start(&b) > 0);
    json_t *in = bbt_wait(&b, "zone", 2, "ready", 0, 10000);
    assert_non_null(in);
    long long gen2 = bbt_int(in, "generation");
    assert_int_equal(kill((pid_t)bbt_int(in, "pid"), SIGKILL), 0);
    json_decref(in);
    in = bbt_wait(&b, "zone", 2, "ready", (int)gen2 + 1, 10000);
    assert_non_null(in);
    json_decref(in);
    json_t *status = bbt_ctl(&b, "status");
    assert_int_equal(json_integer_value(json_object_get(status, "pending_events")), 12);
    json_decref(status);

    assert_int_equal(h_serverdir_restart(&sd, redis.url), 0); /* the same port and URL */
    assert_true(h_wait_until(bb_drained, &b, 30000));

    /* The live directory is what bigbrother supervises. */
    status = bbt_ctl(&b, "status");
    live = sd_get("/v1/clusters/c1/processes");
    json_t *procs = json_object_get(live, "processes");
    assert_int_equal(json_array_size(procs), 4);
    json_t *bi;
    size_t i;
    json_array_foreach(json_object_get(status, "instances"), i, bi) {
        int found = 0;
        for (size_t k = 0; k < json_array_size(procs); k++) {
            json_t *p = json_array_get(procs, k);
            if (strcmp(bbt_str(p, "instance"), bbt_str(bi, "instance")) == 0) {
                found = 1;
                assert_int_equal(bbt_int(p, "pid"), bbt_int(bi, "pid"));
                assert_string_equal(bbt_str(p, "state"), "ready");
            }
        }
        assert_true(found);
    }
    json_decref(live);
    json_decref(status);

    /* Four instances were killed: three by their own bigbrother, stopped killed(signal 9); one
     * re-adopted by the second bigbrother, which is not its parent and so cannot learn
     * the status: stopped exited (status unknown). */
    json_t *stopped = sd_get("/v1/clusters/c1/processes?state=stopped");
    procs = json_object_get(stopped, "processes");
    assert_int_equal(json_array_size(procs), 4);
    int killed = 0, exited = 0;
    for (size_t k = 0; k < 4; k++) {
        json_t *p = json_array_get(procs, k);
        killed += !strcmp(bbt_str(p, "reason"), "killed") && bbt_int(p, "signal") == 9;
        exited += !strcmp(bbt_str(p, "reason"), "exited");
    }
    assert_int_equal(killed, 3);
    assert_int_equal(exited, 1);
    json_decref(stopped);

    /* The history is the outbox: same ids, same order, none twice. */
    json_t *outbox = bbt_events(&b);
    json_t *hist = sd_get("/v1/clusters/c1/events?limit=1000");
    json_t *evs = json_object_get(hist, "events");
    assert_int_equal(json_array_size(evs), 20); /* 4 x (started, ready) + 4 x (stopped, started, ready) */
    assert_int_equal(json_array_size(evs), json_array_size(outbox));
    for (size_t k = 0; k < json_array_size(evs); k++)
        assert_string_equal(bbt_str(json_array_get(evs, k), "id"), bbt_str(json_array_get(outbox, k), "id"));
    json_decref(hist);
    json_decref(outbox);

    json_t *stop = bbt_ctl(&b, "stop all");
    assert_int_equal(json_integer_value(json_object_get(stop, "matched")), 4);
    json_decref(stop);
    h_stop(b.pid, 5000);
    h_stack_stop(&redis, &sd);
}

/* ---- the producer process ---- */

/* it_outbox producer STATE_DIR URL TAG COUNT INTERVAL_US PROGRESS_FILE: appends COUNT
 * events TAG-0.. one every INTERVAL_US, writing how many were appended to PROGRESS_FILE
 * after each, then waits (up to 30 s) until ServerDir acknowledged all and exits 0. */
static int producer_main(char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    long count = strtol(argv[5], NULL, 10), interval = strtol(argv[6], NULL, 10);
    bb_report_opts_t o = {.state_dir = argv[2], .cluster = "c1", .machine = "m1",
                          .urls = argv[3], .token = H_TOK_BB, .lease_ttl_ms = 15000};
    bb_report_t *r = NULL;
    if (bb_report_start(&o, &r))
        return 2;
    int pf = open(argv[7], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (pf < 0)
        return 2;
    for (long i = 0; i < count; i++) {
        char inst[64], num[24];
        snprintf(inst, sizeof inst, "%s-%ld", argv[4], i);
        json_t *e = json_pack("{s:s, s:s, s:s, s:I}", "type", "started", "instance", inst,
                              "service", "zone", "pid", (json_int_t)(1 + i % 100000));
        int rc = bb_report_event(r, e);
        json_decref(e);
        if (rc)
            return 3;
        int n = snprintf(num, sizeof num, "%-20ld\n", i + 1);
        if (pwrite(pf, num, (size_t)n, 0) != n)
            return 2;
        usleep((useconds_t)interval);
    }
    int rc = h_wait_until(drained, r, 30000) ? 0 : 4;
    bb_report_stop(r);
    close(pf);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 8 && strcmp(argv[1], "producer") == 0)
        return producer_main(argv);
    h_init(180);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(outage_then_recovery_delivers_everything_once),
        cmocka_unit_test(kill9_producer_loses_and_duplicates_nothing),
        cmocka_unit_test(rejected_event_goes_to_dead_letter),
        cmocka_unit_test(lease_cadence_independent_of_events),
        cmocka_unit_test(slow_batches_shrink_until_they_fit),
        cmocka_unit_test(lease_renewed_when_events_get_through),
        cmocka_unit_test(events_resent_when_lease_gets_through),
        cmocka_unit_test(real_serverdir_directory_matches_after_outage),
        cmocka_unit_test(real_serverdir_kill9_producer),
        cmocka_unit_test(real_bigbrother_churn_during_outage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
