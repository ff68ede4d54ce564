/* Race: 16 client threads (each its own libsdclient connection and holder name) fight
 * over 4 keys for 3 seconds through two serverdir copies on one Redis (half of them wait
 * up to 100 ms for a release, half do not), taking a lock, reading the blob and saving
 * it twice, then releasing; an operator thread force-unlocks random keys meanwhile
 * so that some holders lose their lock while they work. Every client logs what it saw
 * with monotonic timestamps, and a checker proves over the logs:
 *   - no lock_seq was ever granted twice for a key (so never two holders with one seq);
 *   - grants are ordered: a grant that completed before another started has a smaller
 *     lock_seq;
 *   - exclusion: no grant of a higher lock_seq completed while a holder that later
 *     released cleanly still held the key;
 *   - saves: accepted Blob-Seqs per key are unique and grow in real time, their lock_seqs
 *     never go down, and the final blob is the last accepted save. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "harness_stack.h"
#include "sdclient.h"

#define NCLIENTS 16
#define NKEYS 4
#define RUN_MS 3000
#define RUN_MS_MAX 40000 /* a slow host (valgrind under load) runs on until every key has grants */
#define MIN_GRANTS 11
#define MAX_EV 20000

static const char *keys[NKEYS] = {"race-0", "race-1", "race-2", "race-3"};

enum ev_kind { EV_GRANT, EV_SAVE, EV_RELEASE };

typedef struct {
    enum ev_kind kind;
    int key;
    int ok;            /* release: it succeeded */
    int64_t lock_seq;
    int64_t blob_seq;  /* saves */
    int64_t t0, t1;    /* request sent, answer received (monotonic us) */
} ev_t;

typedef struct {
    int id;
    const char *url;
    ev_t *ev;
    int nev;
    int refused_saves, conflicts, errors;
} client_t;

static h_redis_t redis;
static h_serverdir_t sd, sd2; /* two stateless copies on one Redis */
static volatile int stop_ops;
static int key_grants[NKEYS]; /* grants so far per key, all clients (atomic) */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Whether every key has had enough grants for the ordering checks to mean something. */
static int enough_grants(void)
{
    for (int k = 0; k < NKEYS; k++)
        if (__atomic_load_n(&key_grants[k], __ATOMIC_RELAXED) < MIN_GRANTS)
            return 0;
    return 1;
}

static void add(client_t *c, ev_t e)
{
    if (c->nev < MAX_EV)
        c->ev[c->nev++] = e;
}

static void *client_main(void *arg)
{
    client_t *c = arg;
    char holder[32];
    snprintf(holder, sizeof holder, "client-%d", c->id);
    sdc_t *cl = sdc_new(c->url, H_TOK_GAME, h_ms(5000));
    unsigned seed = (unsigned)c->id * 7919u + 1;
    int64_t start = now_us(), end = start + RUN_MS * 1000LL, hard_end = start + RUN_MS_MAX * 1000LL;
    for (;;) {
        int64_t now = now_us();
        if (c->nev + 8 >= MAX_EV || now >= hard_end || (now >= end && enough_grants()))
            break;
        int k = (int)(rand_r(&seed) % NKEYS);
        sdc_lock_opts_t o = {.wait_ms = c->id % 2 ? 100 : 0}; /* half wait, half do not */
        sdc_lock_t l;
        sdc_err_t err;
        ev_t g = {.kind = EV_GRANT, .key = k, .t0 = now_us()};
        int rc = sdc_lock_acquire(cl, keys[k], holder, &o, &l, &err);
        g.t1 = now_us();
        if (rc != SDC_OK) {
            if (rc == SDC_E_HTTP && err.status == 409) {
                c->conflicts++;
                h_sleep_ms(1 + (int)(rand_r(&seed) % 5)); /* back off a little */
            }
            else if (!(rc == SDC_E_HTTP && err.status == 429))
                c->errors++;
            sdc_err_clear(&err);
            continue;
        }
        g.lock_seq = l.lock_seq;
        add(c, g);
        __atomic_add_fetch(&key_grants[k], 1, __ATOMIC_RELAXED);
        for (int j = 0; j < 2; j++) {
            void *data;
            size_t len;
            int64_t bseq = 0;
            rc = sdc_blob_get(cl, keys[k], &l, &data, &len, &bseq, &err);
            if (rc == SDC_OK)
                free(data);
            else if (rc == SDC_E_HTTP && err.status == 404)
                sdc_err_clear(&err); /* nothing saved yet: Blob-Seq 0 */
            else {
                sdc_err_clear(&err);
                break; /* fenced: the operator took it away */
            }
            char body[96];
            int n = snprintf(body, sizeof body, "%s seq=%lld blob=%lld", holder,
                             (long long)l.lock_seq, (long long)bseq + 1);
            ev_t s = {.kind = EV_SAVE, .key = k, .lock_seq = l.lock_seq, .blob_seq = bseq + 1,
                      .t0 = now_us()};
            rc = sdc_blob_put(cl, &l, bseq + 1, body, (size_t)n, &err);
            s.t1 = now_us();
            if (rc == SDC_OK) {
                add(c, s);
            } else {
                if (rc == SDC_E_HTTP && err.status == 409)
                    c->refused_saves++;
                else
                    c->errors++;
                sdc_err_clear(&err);
            }
        }
        ev_t r = {.kind = EV_RELEASE, .key = k, .lock_seq = l.lock_seq, .t0 = now_us()};
        rc = sdc_lock_release(cl, &l, holder, &err);
        r.t1 = now_us();
        r.ok = rc == SDC_OK;
        if (rc != SDC_OK && !(rc == SDC_E_HTTP && err.status == 409))
            c->errors++;
        sdc_err_clear(&err);
        add(c, r);
    }
    sdc_free(cl);
    return NULL;
}

static void *ops_main(void *arg)
{
    int *forced = arg;
    sdc_t *cl = sdc_new(sd.url, H_TOK_OPS, h_ms(5000));
    unsigned seed = 4242;
    for (int i = 0; i < 100 && !stop_ops; i++) {
        h_sleep_ms(60);
        sdc_err_t err;
        if (sdc_lock_force_unlock(cl, keys[rand_r(&seed) % NKEYS], NULL, &err) == SDC_OK)
            (*forced)++;
        sdc_err_clear(&err);
    }
    sdc_free(cl);
    return NULL;
}

/* cmocka group setup: redis-server and two serverdirs on it, 8 worker threads each. */
static int setup(void **state)
{
    static const char *const extra[] = {"--threads", "8", NULL};
    const h_sd_opts_t o = {.extra = extra};
    if (h_stack_setup(state, &redis, &sd, &o) || h_sd_start(&sd2, &redis, &o))
        return -1;
    return 0;
}

/* cmocka group teardown: the second serverdir, then the first and redis-server. */
static int teardown(void **state)
{
    h_serverdir_stop(&sd2);
    return h_stack_teardown(state);
}

static int cmp_seq(const void *a, const void *b)
{
    const ev_t *x = *(const ev_t *const *)a, *y = *(const ev_t *const *)b;
    int64_t kx = x->kind == EV_SAVE ? x->blob_seq : x->lock_seq;
    int64_t ky = y->kind == EV_SAVE ? y->blob_seq : y->lock_seq;
    return kx < ky ? -1 : kx > ky;
}

static void race_checker(void **state)
{
    static client_t cs[NCLIENTS];
    pthread_t th[NCLIENTS], ops;
    int forced = 0;
    stop_ops = 0;
    for (int i = 0; i < NCLIENTS; i++) {
        cs[i] = (client_t){.id = i, .url = i % 2 ? sd2.url : sd.url,
                           .ev = calloc(MAX_EV, sizeof(ev_t))};
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    pthread_create(&ops, NULL, ops_main, &forced);
    for (int i = 0; i < NCLIENTS; i++)
        pthread_join(th[i], NULL);
    stop_ops = 1;
    pthread_join(ops, NULL);

    size_t total = 0;
    int refused = 0, conflicts = 0, errors = 0;
    int64_t slowest = 0;
    for (int i = 0; i < NCLIENTS; i++) {
        total += (size_t)cs[i].nev;
        for (int e = 0; e < cs[i].nev; e++)
            if (cs[i].ev[e].t1 - cs[i].ev[e].t0 > slowest)
                slowest = cs[i].ev[e].t1 - cs[i].ev[e].t0;
        refused += cs[i].refused_saves;
        conflicts += cs[i].conflicts;
        errors += cs[i].errors;
    }
    fprintf(stderr, "race: %zu events, %d conflicts, %d forced unlocks, %d saves refused, "
            "%d errors, slowest request %lld ms\n",
            total, conflicts, forced, refused, errors, (long long)slowest / 1000);
    ev_t **grants = calloc(total, sizeof *grants), **saves = calloc(total, sizeof *saves);
    ev_t **releases = calloc(total, sizeof *releases);
    size_t ngrants_all = 0;
    for (int k = 0; k < NKEYS; k++) {
        size_t ng = 0, ns = 0, nr = 0;
        for (int i = 0; i < NCLIENTS; i++)
            for (int e = 0; e < cs[i].nev; e++) {
                ev_t *x = &cs[i].ev[e];
                if (x->key != k)
                    continue;
                if (x->kind == EV_GRANT)
                    grants[ng++] = x;
                else if (x->kind == EV_SAVE)
                    saves[ns++] = x;
                else if (x->ok)
                    releases[nr++] = x;
            }
        ngrants_all += ng;
        assert_true(ng >= MIN_GRANTS);
        qsort(grants, ng, sizeof *grants, cmp_seq);
        qsort(saves, ns, sizeof *saves, cmp_seq);
        /* Unique lock_seq per key, and ordered in real time. */
        for (size_t i = 1; i < ng; i++)
            assert_true(grants[i]->lock_seq > grants[i - 1]->lock_seq);
        for (size_t i = 0; i < ng; i++)
            for (size_t j = 0; j < ng; j++)
                if (grants[i]->t1 < grants[j]->t0)
                    assert_true(grants[i]->lock_seq < grants[j]->lock_seq);
        /* Exclusion: while a holder that released cleanly held the key (grant .. release
         * sent), no higher lock_seq was granted. */
        for (size_t r = 0; r < nr; r++)
            for (size_t j = 0; j < ng; j++)
                if (grants[j]->lock_seq > releases[r]->lock_seq)
                    assert_true(grants[j]->t1 >= releases[r]->t0);
        /* Accepted saves: unique Blob-Seq, growing in real time, lock_seq never down. */
        for (size_t i = 1; i < ns; i++) {
            assert_true(saves[i]->blob_seq > saves[i - 1]->blob_seq);
            assert_true(saves[i]->lock_seq >= saves[i - 1]->lock_seq);
        }
        for (size_t i = 0; i < ns; i++)
            for (size_t j = 0; j < ns; j++)
                if (saves[i]->t1 < saves[j]->t0)
                    assert_true(saves[i]->blob_seq < saves[j]->blob_seq);
        /* The stored blob is the last accepted save. */
        assert_true(ns > 0);
        sdc_t *cl = sdc_new(sd.url, H_TOK_VIEWER, h_ms(5000));
        void *data;
        size_t len;
        int64_t bseq;
        sdc_err_t err;
        assert_int_equal(sdc_blob_get(cl, keys[k], NULL, &data, &len, &bseq, &err), SDC_OK);
        assert_int_equal(bseq, saves[ns - 1]->blob_seq);
        char want[64];
        snprintf(want, sizeof want, "seq=%lld blob=%lld", (long long)saves[ns - 1]->lock_seq,
                 (long long)bseq);
        assert_non_null(strstr(data, want));
        free(data);
        sdc_free(cl);
    }
    fprintf(stderr, "race: %zu grants checked over %d keys\n", ngrants_all, NKEYS);
    assert_int_equal(errors, 0);
    assert_true(forced > 0);
    free(grants);
    free(saves);
    free(releases);
    for (int i = 0; i < NCLIENTS; i++)
        free(cs[i].ev);
}

int main(void)
{
    h_init(60);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(race_checker),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
