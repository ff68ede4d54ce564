/* The authorization matrix: every route serverdir serves (read from the generated route
 * table, so a new route is covered without editing this file) x {no token, bad token, ops,
 * bigbrother, game, viewer}. Each answer is classified as 401, 403 or "got past auth" and
 * compared with the table below, written from docs/design.md ("Roles") and
 * docs/openapi.yaml on the least-privilege principle:
 *   ops: everything; bigbrother: machines, processes/events, services read, assignments,
 *   primary; game: locks, blobs (master heartbeat is public: the address proves it);
 *   viewer: GET only. Public: health, metrics, dashboard, the master list REST front. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_stack.h"
#include "sd.h"

#define BB SD_R_BB
#define GAME SD_R_GAME
#define VIEWER SD_R_VIEWER
#define PUB SD_PUBLIC
#define OPS_ONLY 0u

typedef struct {
    const char *method;
    const char *pattern;
    unsigned allowed; /* roles besides ops (always allowed), or PUB */
} expect_t;

static const expect_t expected[] = {
    {"GET", "/", PUB},
    {"GET", "/healthz", PUB},
    {"GET", "/readyz", PUB},
    {"GET", "/metrics", PUB},
    {"POST", "/v1/master/challenge", PUB},
    {"POST", "/v1/master/heartbeat", PUB},
    {"DELETE", "/v1/master/servers/{addr}", PUB},
    {"GET", "/v1/master/servers", PUB},

    {"PUT", "/v1/clusters/{c}/machines/{m}", BB},
    {"GET", "/v1/clusters/{c}/machines", BB | VIEWER},
    {"GET", "/v1/clusters/{c}/machines/{m}", BB | VIEWER},
    {"DELETE", "/v1/clusters/{c}/machines/{m}", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/events", BB},
    {"GET", "/v1/clusters/{c}/events", BB | VIEWER},
    {"GET", "/v1/clusters/{c}/processes", BB | VIEWER},
    {"GET", "/v1/clusters/{c}/processes/{instance}", BB | VIEWER},

    {"PUT", "/v1/clusters/{c}/services/{s}", OPS_ONLY},
    {"GET", "/v1/clusters/{c}/services", BB | VIEWER},
    {"GET", "/v1/clusters/{c}/services/{s}", BB | VIEWER},
    {"DELETE", "/v1/clusters/{c}/services/{s}", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/services/{s}/scale", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/services/{s}/stop", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/services/{s}/start", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/services/{s}/restart", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/restart-instance", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/stop", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/start", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/machines/{m}/drain", OPS_ONLY},
    {"POST", "/v1/clusters/{c}/machines/{m}/undrain", OPS_ONLY},

    {"POST", "/v1/clusters/{c}/primary", BB},
    {"GET", "/v1/clusters/{c}/primary", BB | VIEWER},
    {"DELETE", "/v1/clusters/{c}/primary", BB},
    {"GET", "/v1/clusters/{c}/state", BB | VIEWER},
    {"PUT", "/v1/clusters/{c}/assignments", BB},
    {"GET", "/v1/clusters/{c}/machines/{m}/assignments", BB | VIEWER},
    {"POST", "/v1/clusters/{c}/machines/{m}/lost", BB},

    {"PUT", "/v1/locks/{key}", GAME},
    {"POST", "/v1/locks/acquire", GAME},
    {"POST", "/v1/locks/release", GAME},
    {"POST", "/v1/locks/{key}/renew", GAME},
    {"GET", "/v1/locks/{key}", GAME | VIEWER},
    {"GET", "/v1/locks", GAME | VIEWER},
    {"DELETE", "/v1/locks/{key}", GAME},
    {"GET", "/v1/blobs/{key}", GAME | VIEWER},
    {"PUT", "/v1/blobs/{key}", GAME},
    {"DELETE", "/v1/blobs/{key}", OPS_ONLY},
};
#define NEXPECTED (sizeof expected / sizeof expected[0])

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka test setup: redis-server, and serverdir on it with the test tokens. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, NULL);
}

/* The pattern with every {param} replaced by a valid name. */
static void fill_path(const char *pattern, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = pattern; *p && n + 1 < cap;) {
        if (*p != '{') {
            out[n++] = *p++;
            out[n] = '\0';
            continue;
        }
        const char *end = strchr(p, '}');
        assert_non_null(end);
        const char *value = !strncmp(p, "{addr}", 6) ? "127.0.0.1:27960" : "authz1";
        n += (size_t)snprintf(out + n, cap - n, "%s", value);
        assert_true(n < cap);
        p = end + 1;
    }
}

typedef enum { GOT_401, GOT_403, PAST_AUTH, NO_ANSWER } verdict_t;

static const char *verdict_name(verdict_t v)
{
    return v == GOT_401 ? "401" : v == GOT_403 ? "403" : v == PAST_AUTH ? "past-auth" : "no-answer";
}

static verdict_t send_as(const sd_route_t *r, const char *token, long *status)
{
    char path[256], url[400];
    fill_path(r->pattern, path, sizeof path);
    snprintf(url, sizeof url, "%s%s", sd.url, path);
    int raw = (r->flags & SD_RAW_BODY) != 0;
    int has_body = strcmp(r->method, "GET") != 0 && strcmp(r->method, "DELETE") != 0;
    const char *body = has_body ? (raw ? "x" : "{}") : NULL;
    h_resp_t resp;
    if (h_http(r->method, url, token, raw ? "application/octet-stream" : NULL, body,
               body ? strlen(body) : 0, NULL, &resp))
        return NO_ANSWER;
    *status = resp.status;
    verdict_t v = resp.status == 401 ? GOT_401 : resp.status == 403 ? GOT_403 : PAST_AUTH;
    h_resp_free(&resp);
    return v;
}

static const expect_t *find_expected(const sd_route_t *r)
{
    for (size_t i = 0; i < NEXPECTED; i++)
        if (!strcmp(expected[i].method, r->method) && !strcmp(expected[i].pattern, r->pattern))
            return &expected[i];
    return NULL;
}

static void every_route_allows_exactly_its_roles(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        const char *token;
        unsigned role; /* 0: no valid token */
    } callers[] = {
        {"no-token", NULL, 0},
        {"bad-token", "not-a-valid-token-0123456789", 0},
        {"ops", H_TOK_OPS, SD_R_OPS},
        {"bigbrother", H_TOK_BB, SD_R_BB},
        {"game", H_TOK_GAME, SD_R_GAME},
        {"viewer", H_TOK_VIEWER, SD_R_VIEWER},
    };
    int failures = 0, checked = 0;
    for (size_t i = 0; i < sd_nroutes; i++) {
        const sd_route_t *r = &sd_routes[i];
        const expect_t *e = find_expected(r);
        if (!e) {
            printf("MISSING expectation: %s %s is served but not in this test's table\n",
                   r->method, r->pattern);
            failures++;
            continue;
        }
        for (size_t c = 0; c < sizeof callers / sizeof callers[0]; c++) {
            verdict_t want;
            if (e->allowed & PUB)
                want = PAST_AUTH;
            else if (!callers[c].role)
                want = GOT_401;
            else if (callers[c].role == SD_R_OPS || (e->allowed & callers[c].role))
                want = PAST_AUTH;
            else
                want = GOT_403;
            long status = 0;
            verdict_t got = send_as(r, callers[c].token, &status);
            checked++;
            if (got != want) {
                printf("MISMATCH %s %s as %s: want %s, got %s (status %ld)\n", r->method,
                       r->pattern, callers[c].name, verdict_name(want), verdict_name(got), status);
                failures++;
            }
        }
    }
    /* The other way round: every expectation names a served route. */
    for (size_t i = 0; i < NEXPECTED; i++) {
        int served = 0;
        for (size_t j = 0; j < sd_nroutes && !served; j++)
            served = !strcmp(sd_routes[j].method, expected[i].method) &&
                     !strcmp(sd_routes[j].pattern, expected[i].pattern);
        if (!served) {
            printf("STALE expectation: %s %s is not served\n", expected[i].method,
                   expected[i].pattern);
            failures++;
        }
    }
    printf("authz matrix: routes=%zu requests=%d mismatches=%d\n", sd_nroutes, checked, failures);
    assert_true(checked >= (int)NEXPECTED * 6);
    assert_int_equal(failures, 0);
}

/* The route table itself agrees with the expectations (no request needed): catches a
 * role change on a route whose handler would mask it. */
static void route_table_roles_match(void **state)
{
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < sd_nroutes; i++) {
        const expect_t *e = find_expected(&sd_routes[i]);
        if (!e)
            continue; /* reported by the matrix test */
        unsigned got = sd_routes[i].roles & (PUB | BB | GAME | VIEWER);
        if (got != e->allowed) {
            printf("ROLES %s %s: table 0x%x, expected 0x%x\n", sd_routes[i].method,
                   sd_routes[i].pattern, got, e->allowed);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(route_table_roles_match),
        cmocka_unit_test_setup_teardown(every_route_allows_exactly_its_roles, setup,
                                        h_stack_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
