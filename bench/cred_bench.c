/* What checking an instance credential costs serverdir per request, in CPU time of the
 * calling thread (bench/README.md, "credentials"; goal: under 5 us):
 *   1. cached: sd_cred_verify of a credential verified before (SHA-256 of the token and
 *      a cache lookup), the path of every request after a credential's first;
 *   2. uncached: sd_cred_verify of a credential never seen (header, key lookup, libjwt's
 *      ES256 verification, claims), once per credential;
 *   3. liveness: sd_cred_live, the HMGET of the process record that routes without a
 *      script of their own run (CPU of the call; the wait for Redis is not CPU);
 *   4. the anchor on the same thread: sd_auth_lookup of a token-file token among 10.
 * It links serverdir's own cred.c and auth.c against a real redis-server it starts (the
 * keyring lives there). bench/cred_bench.sh runs it beside `openssl speed ecdsap256`.
 * Usage: bench_cred [rounds=3] [cached_calls=200000] [fresh_credentials=2000]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cred.h"
#include "harness.h"
#include "sd.h"

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

/* A credential of instance i (generation 1, machine m1 of cluster bench): malloc'd. */
static char *issue(const char *i)
{
    sd_cred_id_t id = {.generation = 1};
    snprintf(id.cluster, sizeof id.cluster, "bench");
    snprintf(id.machine, sizeof id.machine, "m1");
    snprintf(id.service, sizeof id.service, "zone");
    snprintf(id.instance, sizeof id.instance, "%s", i);
    char *jwt, kid[32];
    int64_t exp;
    if (sd_cred_issue(&id, &jwt, kid, sizeof kid, &exp)) {
        fprintf(stderr, "bench: cannot issue a credential\n");
        exit(1);
    }
    return jwt;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    long cached_n = argc > 2 ? atol(argv[2]) : 200000;
    int fresh_n = argc > 3 ? atoi(argv[3]) : 2000;
    if (rounds < 1 || rounds > 9 || cached_n < 100 || fresh_n < 10) {
        fprintf(stderr, "usage: bench_cred [rounds 1-9] [cached_calls>=100] [fresh>=10]\n");
        return 2;
    }
    h_init(3600);
    sd_metrics_init(sd_nroutes);
    h_redis_t redis;
    if (h_redis_start(&redis) || sd_store_init(redis.url, "sd:")) {
        fprintf(stderr, "bench: no redis\n");
        return 1;
    }
    char tokens[1024] = "";
    for (int i = 0; i < 10; i++)
        snprintf(tokens + strlen(tokens), sizeof tokens - strlen(tokens),
                 "game bench-game-token-%02d-0123456789\n", i);
    if (sd_auth_load(h_write_file(h_tmpdir(), "tokens", tokens, 0600)))
        return 1;
    redisReply *r = h_redis(&redis, "HSET sd:{bench}:proc:b-live state ready machine m1 "
                                    "generation 1");
    freeReplyObject(r);

    char *live = issue("b-live");
    char **fresh = calloc((size_t)fresh_n * (size_t)rounds, sizeof *fresh);
    for (int i = 0; i < fresh_n * rounds; i++) {
        char name[32];
        snprintf(name, sizeof name, "b-%d", i);
        fresh[i] = issue(name);
    }
    size_t livelen = strlen(live);
    const char *tok = "bench-game-token-09-0123456789";
    double c[9], u[9], l[9], t[9];
    printf("credential check benchmark: %d rounds, %ld cached calls, %d fresh credentials a "
           "round, %zu-byte credential (CPU time of the calling thread)\n",
           rounds, cached_n, fresh_n, livelen);
    for (int k = 0; k < rounds; k++) {
        sd_auth_t a;
        const char *why;
        if (!sd_cred_verify(live, livelen, &a, &why)) {
            fprintf(stderr, "bench: credential refused: %s\n", why);
            return 1;
        }
        double t0 = cpu_us();
        for (long i = 0; i < cached_n; i++)
            sd_cred_verify(live, livelen, &a, &why);
        c[k] = (cpu_us() - t0) / (double)cached_n;

        t0 = cpu_us();
        for (int i = 0; i < fresh_n; i++) {
            const char *f = fresh[k * fresh_n + i];
            if (!sd_cred_verify(f, strlen(f), &a, &why)) {
                fprintf(stderr, "bench: fresh credential refused: %s\n", why);
                return 1;
            }
        }
        u[k] = (cpu_us() - t0) / fresh_n;

        sd_req_t req = {0};
        sd_resp_t resp = {0};
        sd_cred_verify(live, livelen, &req.auth, &why);
        long ln = cached_n / 20;
        t0 = cpu_us();
        for (long i = 0; i < ln; i++)
            if (sd_cred_live(&req, &resp)) {
                fprintf(stderr, "bench: liveness refused\n");
                return 1;
            }
        l[k] = (cpu_us() - t0) / (double)ln;

        t0 = cpu_us();
        for (long i = 0; i < cached_n; i++)
            sd_auth_lookup(tok, strlen(tok), &a);
        t[k] = (cpu_us() - t0) / (double)cached_n;
        printf("round %d: cached %.3f us, uncached %.1f us, liveness HMGET %.2f us, "
               "token-file lookup %.3f us\n",
               k + 1, c[k], u[k], l[k], t[k]);
    }
    double mc = median(c, rounds), mu = median(u, rounds), ml = median(l, rounds),
           mt = median(t, rounds);
    size_t used, cap;
    sd_cred_cache_stats(&used, &cap);
    printf("cred_cached_us=%.3f\ncred_uncached_us=%.1f\ncred_live_hmget_us=%.2f\n"
           "token_lookup_us=%.3f\ncache_used=%zu cache_cap=%zu\n",
           mc, mu, ml, mt, used, cap);
    printf("per request with a credential (cached verify + liveness HMGET): %.2f us CPU, "
           "goal under 5 us; on a route whose script checks liveness: %.3f us\n",
           mc + ml, mc);
    for (int i = 0; i < fresh_n * rounds; i++)
        free(fresh[i]);
    free(fresh);
    free(live);
    sd_store_thread_close();
    h_redis_stop(&redis);
    return 0;
}
