/* The master list over REST against real redis-server and serverdir processes:
 * challenge -> heartbeat -> listed; spoofed heartbeats (unknown, reused, foreign,
 * expired challenge) rejected with their own codes and no change in Redis; expiry;
 * termination only from the server's address; every filter; the cursor walk over 1200
 * servers; flood limits; X-Forwarded-For only from a trusted proxy.
 *
 * Three serverdir copies share one Redis:
 *   A  open peer (no trusted proxy), roomy limits: listing, filters, the walk;
 *   B  trusts 127.0.0.1 as a proxy (so tests speak for many addresses through
 *      X-Forwarded-For), tight limits: floods, termination;
 *   C  its own key prefix, heartbeat interval 1 s and 300 ms challenges: expiry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "harness_stack.h"
#include "harness_sdctl.h"
#include "sdclient.h"

static h_redis_t redis;
static h_serverdir_t A, B, C;

/* cmocka group setup: redis-server and the three serverdirs A, B, C on it. */
static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &A,
                      &(h_sd_opts_t){.config = "{\"master\": {\"servers_per_address\": 5000,"
                                               " \"challenges_per_address\": 50,"
                                               " \"rate_per_s\": 100000, \"max_batch\": 1000}}"}) ||
        h_sd_start(&B, &redis,
                   &(h_sd_opts_t){.config = "{\"master\": {\"trusted_proxies\": [\"127.0.0.1\"],"
                                            " \"servers_per_address\": 3, \"ipv4_group_bits\": 24,"
                                            " \"challenges_per_address\": 4, \"rate_per_s\": 10}}"}) ||
        h_sd_start(&C, &redis,
                   &(h_sd_opts_t){.config = "{\"key_prefix\": \"sdx:\", \"master\":"
                                            " {\"heartbeat_interval_s\": 1,"
                                            " \"challenge_ttl_ms\": 300, \"rate_per_s\": 1000}}"}))
        return -1;
    return 0;
}

/* cmocka group teardown: B and C, then A and redis-server. */
static int teardown(void **state)
{
    h_serverdir_stop(&B);
    h_serverdir_stop(&C);
    return h_stack_teardown(state);
}

/* One request with an optional X-Forwarded-For and an optional bearer token (public
 * routes: most calls send none). */
static long req_tok(const h_serverdir_t *s, const char *token, const char *method,
                    const char *path, const char *body, const char *xff, h_resp_t *r)
{
    char url[512], hdr[256];
    snprintf(url, sizeof url, "%s%s", s->url, path);
    snprintf(hdr, sizeof hdr, "X-Forwarded-For: %s", xff ? xff : "");
    const char *headers[] = {hdr, NULL};
    assert_int_equal(h_http(method, url, token, NULL, body, body ? strlen(body) : 0,
                            xff ? headers : NULL, r),
                     0);
    return r->status;
}

static long req(const h_serverdir_t *s, const char *method, const char *path, const char *body,
                const char *xff, h_resp_t *r)
{
    return req_tok(s, NULL, method, path, body, xff, r);
}

/* A challenge for the caller (through s, speaking for xff) into chal. */
static void challenge(const h_serverdir_t *s, const char *xff, char *chal, size_t cap)
{
    h_resp_t r;
    assert_int_equal(req(s, "POST", "/v1/master/challenge", NULL, xff, &r), 200);
    json_t *j = h_resp_json(&r);
    assert_non_null(j);
    const char *c = json_string_value(json_object_get(j, "challenge"));
    assert_non_null(c);
    assert_true(json_integer_value(json_object_get(j, "expires_in_ms")) > 0);
    snprintf(chal, cap, "%s", c);
    json_decref(j);
    h_resp_free(&r);
}

/* Challenge + heartbeat with the given body fields (a JSON object text without braces,
 * e.g. "\"game\":\"x\",...") and bearer token (or NULL); returns the heartbeat status,
 * error code in code, and *linked from the answer (when linked is not NULL). */
static long announce_tok(const h_serverdir_t *s, const char *token, int port,
                         const char *fields, char *code, size_t codecap, int *linked)
{
    char chal[64], body[1024];
    challenge(s, NULL, chal, sizeof chal);
    snprintf(body, sizeof body, "{\"challenge\":\"%s\",\"port\":%d,%s}", chal, port, fields);
    h_resp_t r;
    long st = req_tok(s, token, "POST", "/v1/master/heartbeat", body, NULL, &r);
    if (code)
        snprintf(code, codecap, "%s", h_err_code(&r));
    if (linked) {
        json_t *j = h_resp_json(&r);
        *linked = json_is_true(json_object_get(j, "linked"));
        json_decref(j);
    }
    h_resp_free(&r);
    return st;
}

/* Challenge + heartbeat without a token, speaking for xff (or NULL). */
static long announce(const h_serverdir_t *s, const char *xff, int port, const char *fields,
                     char *code, size_t codecap)
{
    char chal[64], body[1024];
    challenge(s, xff, chal, sizeof chal);
    snprintf(body, sizeof body, "{\"challenge\":\"%s\",\"port\":%d,%s}", chal, port, fields);
    h_resp_t r;
    long st = req(s, "POST", "/v1/master/heartbeat", body, xff, &r);
    if (code)
        snprintf(code, codecap, "%s", h_err_code(&r));
    h_resp_free(&r);
    return st;
}

#define BASIC "\"game\":\"Quake3\",\"map\":\"q3dm17\",\"players\":3,\"max_players\":16"

/* The servers of GET path (JSON) as a compact list "addr addr ..." and the next cursor. */
static void list(const h_serverdir_t *s, const char *path, char *out, size_t cap, char *next,
                 size_t nextcap)
{
    h_resp_t r;
    assert_int_equal(req(s, "GET", path, NULL, NULL, &r), 200);
    json_t *j = h_resp_json(&r);
    assert_non_null(j);
    json_t *arr = json_object_get(j, "servers");
    assert_true(json_is_array(arr));
    out[0] = '\0';
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s%s", n ? " " : "", json_string_value(json_object_get(v, "address")));
    }
    json_t *nx = json_object_get(j, "next");
    if (next)
        snprintf(next, nextcap, "%s", json_is_string(nx) ? json_string_value(nx) : "");
    else
        assert_true(json_is_null(nx));
    json_decref(j);
    h_resp_free(&r);
}

static void challenge_heartbeat_listing(void **state)
{
    char chal[64], body[512];
    challenge(&A, NULL, chal, sizeof chal);
    snprintf(body, sizeof body,
             "{\"challenge\":\"%s\",\"port\":27960,\"game\":\"ListGame\",\"map\":\"dm4\",\"name\":\"Héllo\","
             "\"players\":2,\"max_players\":8,\"bots\":1,\"password\":false,\"region\":\"eu\","
             "\"version\":\"1.2\",\"tags\":[\"ctf\",\"Instagib\"],\"protocol\":68,\"gametype\":4}",
             chal);
    h_resp_t r;
    assert_int_equal(req(&A, "POST", "/v1/master/heartbeat", body, NULL, &r), 200);
    json_t *j = h_resp_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "address")), "127.0.0.1:27960");
    assert_true(json_is_true(json_object_get(j, "new")));
    assert_true(json_integer_value(json_object_get(j, "expires_in_ms")) > 890000);
    json_decref(j);
    h_resp_free(&r);

    assert_int_equal(req(&A, "GET", "/v1/master/servers?game=listgame", NULL, NULL, &r), 200);
    j = h_resp_json(&r);
    json_t *s = json_array_get(json_object_get(j, "servers"), 0);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "address")), "127.0.0.1:27960");
    assert_string_equal(json_string_value(json_object_get(s, "game")), "ListGame");
    assert_string_equal(json_string_value(json_object_get(s, "name")), "Héllo");
    assert_int_equal(json_integer_value(json_object_get(s, "players")), 2);
    assert_int_equal(json_integer_value(json_object_get(s, "max_players")), 8);
    assert_int_equal(json_integer_value(json_object_get(s, "protocol")), 68);
    assert_string_equal(json_string_value(json_array_get(json_object_get(s, "tags"), 1)), "Instagib");
    assert_string_equal(json_string_value(json_object_get(s, "source")), "rest");
    assert_true(json_is_null(json_object_get(j, "next")));
    json_decref(j);
    h_resp_free(&r);

    /* A keepalive is the same message: listed again, not new. */
    challenge(&A, NULL, chal, sizeof chal);
    snprintf(body, sizeof body, "{\"challenge\":\"%s\",\"port\":27960,\"game\":\"ListGame\",\"players\":3,\"max_players\":8}", chal);
    assert_int_equal(req(&A, "POST", "/v1/master/heartbeat", body, NULL, &r), 200);
    j = h_resp_json(&r);
    assert_true(json_is_false(json_object_get(j, "new")));
    json_decref(j);
    h_resp_free(&r);

    /* sdclient's announce does both steps. */
    sdc_t *c = sdc_new(A.url, NULL, h_ms(5000));
    sdc_master_server_t srv = {.port = 27961, .game = "ListGame", .players = 1, .max_players = 4,
                               .protocol = -1, .gametype = -1};
    sdc_err_t err = {0};
    int64_t exp = 0;
    assert_int_equal(sdc_master_announce(c, &srv, &exp, &err), SDC_OK);
    assert_true(exp > 0);
    json_t *servers = NULL;
    char next[64];
    sdc_master_filter_t f = {.game = "listgame"};
    assert_int_equal(sdc_master_query(c, &f, NULL, 10, &servers, next, sizeof next, &err), SDC_OK);
    assert_int_equal(json_array_size(servers), 2);
    assert_string_equal(next, "");
    json_decref(servers);
    assert_int_equal(sdc_master_terminate(c, "127.0.0.1:27961", &err), SDC_OK);
    assert_int_equal(sdc_master_terminate(c, "127.0.0.1:27961", &err), SDC_E_HTTP);
    assert_int_equal(err.status, 404);
    assert_string_equal(err.code, "not_listed");
    sdc_err_clear(&err);
    sdc_free(c);
}

/* Each spoofed or bad heartbeat is refused with its own code and changes nothing. */
static void spoofed_heartbeats_rejected(void **state)
{
    char used[64], foreign[64], body[512], code[64];
    assert_int_equal(announce(&A, NULL, 28000, BASIC, code, sizeof code), 200);
    /* A challenge that was used: take one and use it. */
    challenge(&A, NULL, used, sizeof used);
    snprintf(body, sizeof body, "{\"challenge\":\"%s\",\"port\":28001," BASIC "}", used);
    h_resp_t r;
    assert_int_equal(req(&A, "POST", "/v1/master/heartbeat", body, NULL, &r), 200);
    h_resp_free(&r);
    /* A challenge issued to another address (10.9.9.9, through the proxy copy). */
    challenge(&B, "10.9.9.9", foreign, sizeof foreign);

    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_MASTER, NULL);
    static const struct {
        const char *chal_kind;
        const char *fields;
        long status;
        const char *code;
    } cases[] = {
        {"random", BASIC, 403, "unknown_challenge"},
        {"used", BASIC, 403, "challenge_used"}, /* again for 28001, the entry that used it */
        /* issued to another address: the HMAC does not match this one (stateless
         * challenges cannot tell it from a forged one) */
        {"foreign", BASIC, 403, "unknown_challenge"},
        {"used", "\"game\":\"Quake3\",\"players\":3,\"max_players\":2", 400, "bad_field"},
        {"used", BASIC ",\"ip\":\"1.2.3.4\"", 400, "bad_field"},
        {"used", "\"game\":\"has space\",\"players\":1,\"max_players\":2", 400, "bad_field"},
        {"used", "\"game\":\"g\",\"players\":1,\"max_players\":2,\"tags\":[\"a b\"]", 400, "bad_field"},
        {"used", "\"players\":1,\"max_players\":2", 400, "bad_field"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *c = !strcmp(cases[i].chal_kind, "random") ? "0123456789abcdef0123456789abcdef"
                        : !strcmp(cases[i].chal_kind, "used") ? used
                                                              : foreign;
        snprintf(body, sizeof body, "{\"challenge\":\"%s\",\"port\":%d,%s}", c, i == 1 ? 28001 : 28002,
                 cases[i].fields);
        assert_int_equal(req(&A, "POST", "/v1/master/heartbeat", body, NULL, &r), cases[i].status);
        assert_string_equal(h_err_code(&r), cases[i].code);
        h_resp_free(&r);
    }
    assert_int_equal(req(&A, "POST", "/v1/master/heartbeat", "{\"challenge\":", NULL, &r), 400);
    assert_string_equal(h_err_code(&r), "bad_json");
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_MASTER, NULL);
    h_keys_same(&before, &after, __func__);

    /* An expired challenge (copy C: 300 ms challenges). */
    char chal[64];
    challenge(&C, NULL, chal, sizeof chal);
    h_sleep_ms(450); /* past the 300 ms challenge TTL: the expiry is what is tested */
    h_keys_take(&redis, &before, H_KEYS_MASTER, NULL);
    snprintf(body, sizeof body, "{\"challenge\":\"%s\",\"port\":28003," BASIC "}", chal);
    assert_int_equal(req(&C, "POST", "/v1/master/heartbeat", body, NULL, &r), 403);
    assert_string_equal(h_err_code(&r), "challenge_expired");
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_MASTER, NULL);
    h_keys_same(&before, &after, __func__);

    char got[256];
    list(&A, "/v1/master/servers?game=quake3&limit=1000", got, sizeof got, NULL, 0);
    assert_null(strstr(got, "127.0.0.1:28002"));
    assert_non_null(strstr(got, "127.0.0.1:28000"));
}

static int listed_on_c(void *addr)
{
    char got[256];
    list(&C, "/v1/master/servers", got, sizeof got, NULL, 0);
    return strstr(got, (const char *)addr) != NULL;
}

static int gone_from_c(void *addr) { return !listed_on_c(addr); }

static int listed_on_a(void *addr)
{
    char got[256];
    list(&A, "/v1/master/servers?limit=5&after=10.1.1.0:1", got, sizeof got, NULL, 0);
    return strstr(got, (const char *)addr) != NULL;
}

static int swept_29000(void *arg)
{
    (void)arg;
    /* The key names of this mode (a cluster tags them {master}), on the node that has
     * them: an error reply (no such key on a wrong node) is not "gone". */
    assert_int_equal(h_redis_route(&redis, h_master_key("sdx:", "s")), 0);
    redisReply *a = h_redis(&redis, "HEXISTS %s 127.0.0.1:29000", h_master_key("sdx:", "s"));
    redisReply *c = h_redis(&redis, "HGET %s 127.0.0.1", h_master_key("sdx:", "n"));
    assert_true(a && c && a->type == REDIS_REPLY_INTEGER);
    int gone = a->integer == 0 && c->type == REDIS_REPLY_NIL;
    freeReplyObject(a);
    freeReplyObject(c);
    return gone;
}

/* Interval 1 s: listed for 3 s after the last heartbeat, then gone. */
static void entries_expire(void **state)
{
    char code[64];
    assert_int_equal(announce(&C, NULL, 29000, BASIC, code, sizeof code), 200);
    int64_t t0 = h_now_ms();
    assert_true(listed_on_c("127.0.0.1:29000"));
    h_sleep_ms(1500); /* the entry's lifetime is what is tested: still listed meanwhile */
    assert_true(listed_on_c("127.0.0.1:29000"));
    assert_true(h_wait_until(gone_from_c, "127.0.0.1:29000", 4000));
    int64_t took = h_now_ms() - t0;
    assert_true(took >= 2800);
    char got[256];
    list(&C, "/v1/master/servers?game=quake3", got, sizeof got, NULL, 0);
    assert_string_equal(got, "");
    /* Swept from Redis too, by a copy's sweep (every second): record, expiry and the
     * address group's count. */
    assert_true(h_wait_until(swept_29000, NULL, 3000));
}

static void termination_only_from_same_address(void **state)
{
    char code[64], got[256], next[64];
    assert_int_equal(announce(&B, "10.1.1.1", 27015, BASIC, code, sizeof code), 200);
    h_resp_t r;
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_MASTER, NULL);
    assert_int_equal(req(&B, "DELETE", "/v1/master/servers/10.1.1.1:27015", NULL, "10.1.1.2", &r), 403);
    assert_string_equal(h_err_code(&r), "address_mismatch");
    h_resp_free(&r);
    /* Nor from the untrusting copy, where the caller is 127.0.0.1 whatever the header says
     * (once the copy's index has the entry: before, it answers 404 not_listed). */
    assert_true(h_wait_until(listed_on_a, "10.1.1.1:27015", 3000));
    assert_int_equal(req(&A, "DELETE", "/v1/master/servers/10.1.1.1:27015", NULL, "10.1.1.1", &r), 403);
    h_resp_free(&r);
    assert_int_equal(req(&B, "DELETE", "/v1/master/servers/10.1.1.1:x", NULL, "10.1.1.1", &r), 400);
    assert_string_equal(h_err_code(&r), "bad_address");
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_MASTER, NULL);
    h_keys_same(&before, &after, __func__);
    list(&B, "/v1/master/servers?limit=5&after=10.1.1.0:1", got, sizeof got, next, sizeof next);
    assert_non_null(strstr(got, "10.1.1.1:27015"));

    assert_int_equal(req(&B, "DELETE", "/v1/master/servers/10.1.1.1:27015", NULL, "10.1.1.1", &r), 204);
    h_resp_free(&r);
    /* Copy A follows B's change through Redis's change stream: gone within a second. */
    int64_t t0 = h_now_ms();
    do {
        list(&A, "/v1/master/servers?limit=5&after=10.1.1.0:1", got, sizeof got, next, sizeof next);
    } while (strstr(got, "10.1.1.1:27015") && h_now_ms() - t0 < 1000 && (h_sleep_ms(5), 1));
    assert_null(strstr(got, "10.1.1.1:27015"));
    assert_int_equal(req(&B, "DELETE", "/v1/master/servers/10.1.1.1:27015", NULL, "10.1.1.1", &r), 404);
    assert_string_equal(h_err_code(&r), "not_listed");
    h_resp_free(&r);

    /* An IPv6 server (through the proxy): listed as [v6]:port, removed by that address
     * with the path escaped as a client library does. */
    assert_int_equal(announce(&B, "2001:db8::5", 27015, BASIC, code, sizeof code), 200);
    list(&B, "/v1/master/servers?limit=1&after=%5B2001:db8::4%5D:1", got, sizeof got, next, sizeof next);
    assert_string_equal(got, "[2001:db8::5]:27015");
    assert_int_equal(req(&B, "DELETE", "/v1/master/servers/%5B2001:db8::5%5D:27015", NULL, "2001:db8::6", &r), 403);
    h_resp_free(&r);
    assert_int_equal(req(&B, "DELETE", "/v1/master/servers/%5B2001:db8::5%5D:27015", NULL, "2001:db8::5", &r), 204);
    h_resp_free(&r);
}

static void every_filter(void **state)
{
    char code[64];
    static const struct {
        int port;
        const char *fields;
    } servers[] = {
        {30001, "\"game\":\"FiltGame\",\"map\":\"Alpha\",\"players\":0,\"max_players\":8,\"region\":\"eu\",\"tags\":[\"ctf\",\"fast\"]"},
        {30002, "\"game\":\"FiltGame\",\"map\":\"alpha\",\"players\":8,\"max_players\":8,\"region\":\"us\",\"tags\":[\"ctf\"]"},
        {30003, "\"game\":\"FiltGame\",\"map\":\"beta\",\"players\":3,\"max_players\":8,\"region\":\"eu\",\"password\":true,\"tags\":[\"fast\"]"},
        {30004, "\"game\":\"FiltGame\",\"map\":\"beta\",\"players\":5,\"max_players\":8,\"region\":\"asia\""},
        {30005, "\"game\":\"OtherGame\",\"map\":\"alpha\",\"players\":5,\"max_players\":8,\"region\":\"eu\",\"tags\":[\"ctf\"]"},
    };
    for (size_t i = 0; i < sizeof servers / sizeof servers[0]; i++)
        assert_int_equal(announce(&A, NULL, servers[i].port, servers[i].fields, code, sizeof code), 200);

    static const struct {
        const char *query;
        const char *want;
    } cases[] = {
        {"game=filtgame", "127.0.0.1:30001 127.0.0.1:30002 127.0.0.1:30003 127.0.0.1:30004"},
        {"game=FILTGAME&map=ALPHA", "127.0.0.1:30001 127.0.0.1:30002"},
        {"game=filtgame&not_empty=1", "127.0.0.1:30002 127.0.0.1:30003 127.0.0.1:30004"},
        {"game=filtgame&not_full=true", "127.0.0.1:30001 127.0.0.1:30003 127.0.0.1:30004"},
        {"game=filtgame&not_empty=1&not_full=1", "127.0.0.1:30003 127.0.0.1:30004"},
        {"game=filtgame&region=eu", "127.0.0.1:30001 127.0.0.1:30003"},
        {"game=filtgame&tags=ctf", "127.0.0.1:30001 127.0.0.1:30002"},
        {"game=filtgame&tags=CTF,fast", "127.0.0.1:30001"},
        {"game=filtgame&no_password=1", "127.0.0.1:30001 127.0.0.1:30002 127.0.0.1:30004"},
        {"map=alpha&tags=ctf&region=eu&after=127.0.0.1:30000", "127.0.0.1:30001 127.0.0.1:30005"},
        {"game=nosuchgame", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256], got[512];
        snprintf(path, sizeof path, "/v1/master/servers?limit=1000&%s", cases[i].query);
        list(&A, path, got, sizeof got, NULL, 0);
        if (strcmp(got, cases[i].want))
            fail_msg("query %s: got '%s', want '%s'", cases[i].query, got, cases[i].want);
    }

    /* format=text: one ip:port a line. */
    h_resp_t r;
    assert_int_equal(req(&A, "GET", "/v1/master/servers?game=filtgame&region=eu&format=text", NULL, NULL, &r), 200);
    assert_string_equal(r.body, "127.0.0.1:30001\n127.0.0.1:30003\n");
    h_resp_free(&r);

    static const char *bad[] = {"not_empty=maybe", "limit=0", "after=nope", "format=xml",
                                "tags=a%20b", "game=a%20b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/master/servers?%s", bad[i]);
        assert_int_equal(req(&A, "GET", path, NULL, NULL, &r), 400);
        assert_string_equal(h_err_code(&r), "bad_query");
        h_resp_free(&r);
    }
}

/* 1200 servers walked in batches of 100 with `after`: each exactly once, in order, and
 * `next` null only on the last batch; a limit above the cap is capped. */
static void cursor_walk_1200(void **state)
{
    enum { N = 1200 };
    sdc_t *c = sdc_new(A.url, NULL, h_ms(5000));
    for (int i = 0; i < N; i++) {
        sdc_master_server_t s = {.port = 40000 + i, .game = "WalkGame", .players = i % 9,
                                 .max_players = 8 + i % 2, .protocol = -1, .gametype = -1};
        sdc_err_t err = {0};
        int rc = sdc_master_announce(c, &s, NULL, &err);
        if (rc)
            fail_msg("announce %d: %s %s", i, err.code, err.message);
    }
    static unsigned char seen[N];
    memset(seen, 0, sizeof seen);
    char after[64] = "", next[64];
    int batches = 0, total = 0;
    sdc_master_filter_t f = {.game = "walkgame"};
    for (; batches < 100; batches++) {
        json_t *servers = NULL;
        sdc_err_t err = {0};
        assert_int_equal(sdc_master_query(c, &f, after, 100, &servers, next, sizeof next, &err), SDC_OK);
        size_t i;
        json_t *s;
        json_array_foreach(servers, i, s) {
            int port = (int)json_integer_value(json_object_get(s, "port"));
            assert_true(port >= 40000 && port < 40000 + N);
            assert_int_equal(seen[port - 40000], 0);
            seen[port - 40000] = 1;
            total++;
        }
        json_decref(servers);
        if (!next[0])
            break;
        snprintf(after, sizeof after, "%s", next);
    }
    assert_int_equal(total, N);
    assert_true(batches >= 11 && batches <= 13);

    /* Filtered walk: not_empty (i % 9 != 0) and not_full. */
    int want = 0;
    for (int i = 0; i < N; i++)
        want += (i % 9) != 0 && (i % 9) < 8 + i % 2;
    f.not_empty = f.not_full = 1;
    after[0] = '\0';
    total = 0;
    for (batches = 0; batches < 100; batches++) {
        json_t *servers = NULL;
        sdc_err_t err = {0};
        assert_int_equal(sdc_master_query(c, &f, after, 250, &servers, next, sizeof next, &err), SDC_OK);
        total += (int)json_array_size(servers);
        json_decref(servers);
        if (!next[0])
            break;
        snprintf(after, sizeof after, "%s", next);
    }
    assert_int_equal(total, want);

    /* The unfiltered walk (a different read path): every server once, in address order. */
    memset(seen, 0, sizeof seen);
    after[0] = '\0';
    total = 0;
    char prev[64] = "";
    for (batches = 0; batches < 100; batches++) {
        json_t *servers = NULL;
        sdc_err_t err = {0};
        assert_int_equal(sdc_master_query(c, NULL, after, 300, &servers, next, sizeof next, &err), SDC_OK);
        size_t i;
        json_t *s;
        json_array_foreach(servers, i, s) {
            const char *addr = json_string_value(json_object_get(s, "address"));
            assert_true(strcmp(prev, addr) < 0);
            snprintf(prev, sizeof prev, "%s", addr);
            if (strcmp(json_string_value(json_object_get(s, "game")), "WalkGame"))
                continue;
            int port = (int)json_integer_value(json_object_get(s, "port"));
            assert_int_equal(seen[port - 40000], 0);
            seen[port - 40000] = 1;
            total++;
        }
        json_decref(servers);
        if (!next[0])
            break;
        snprintf(after, sizeof after, "%s", next);
    }
    assert_int_equal(total, N);

    h_resp_t r;
    assert_int_equal(req(&A, "GET", "/v1/master/servers?game=walkgame&limit=5000", NULL, NULL, &r), 200);
    json_t *j = h_resp_json(&r);
    assert_int_equal(json_array_size(json_object_get(j, "servers")), 1000);
    assert_true(json_is_string(json_object_get(j, "next")));
    json_decref(j);
    h_resp_free(&r);
    sdc_free(c);
}

/* Copy B: 10 requests/s (burst 20), 3 servers and 4 open challenges per address. */
/* Runs sdctl with args against copy A; returns its exit status, output in out. */
static int run_sdctl(const char *const *args, char *out, size_t cap)
{
    const char *argv[23] = {"--url", A.url};
    int n = 2;
    for (const char *const *a = args; *a && n < 22; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    return h_sdctl_run(argv, NULL, 10000, out, cap);
}

/* sdctl servers walks every batch with --all and applies the filters. */
static void sdctl_servers(void **state)
{
    static char out[1 << 20];
    const char *all[] = {"-o", "json", "servers", "--game", "WALKGAME", "--not-empty", "--limit", "100", "--all", NULL};
    assert_int_equal(run_sdctl(all, out, sizeof out), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    size_t want = 0;
    for (int i = 0; i < 1200; i++)
        want += i % 9 != 0;
    assert_int_equal(json_array_size(json_object_get(j, "servers")), want);
    assert_true(json_is_null(json_object_get(j, "next")));
    json_decref(j);

    const char *table[] = {"servers", "--game", "filtgame", "--region", "eu", "--tags", "fast", NULL};
    assert_int_equal(run_sdctl(table, out, sizeof out), 0);
    assert_non_null(strstr(out, "ADDRESS"));
    assert_non_null(strstr(out, "127.0.0.1:30001"));
    assert_non_null(strstr(out, "127.0.0.1:30003"));
    assert_null(strstr(out, "127.0.0.1:30002"));

    const char *bad[] = {"servers", "--limit", "0", NULL};
    assert_int_equal(run_sdctl(bad, out, sizeof out), 2);
}

static void flood_limits(void **state)
{
    char code[64], got[4096];
    assert_int_equal(announce(&B, "10.5.5.5", 27015, BASIC, code, sizeof code), 200);

    /* Request rate. */
    int limited = 0;
    h_resp_t r;
    for (int i = 0; i < 300 && !limited; i++) {
        long st = req(&B, "GET", "/v1/master/servers?limit=1", NULL, "10.2.2.2", &r);
        if (st == 429) {
            assert_string_equal(h_err_code(&r), "rate_limited");
            char ra[16];
            assert_int_equal(h_resp_header(&r, "Retry-After", ra, sizeof ra), 0);
            assert_true(atoi(ra) >= 1);
            limited = 1;
        } else {
            assert_int_equal(st, 200);
        }
        h_resp_free(&r);
    }
    assert_true(limited);

    /* Servers per address. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(announce(&B, "10.3.3.3", 27000 + i, BASIC, code, sizeof code), 200);
    assert_int_equal(announce(&B, "10.3.3.3", 27003, BASIC, code, sizeof code), 429);
    assert_string_equal(code, "too_many_servers");
    /* Keepalives of the listed ones still pass. */
    assert_int_equal(announce(&B, "10.3.3.3", 27001, BASIC, code, sizeof code), 200);

    /* The quota counts an IPv6 /64 as one address (one host has all of it), and here
     * (ipv4_group_bits 24) an IPv4 /24: other addresses of it do not get more room. */
    static const char *const v6[] = {"2001:db8:7:7::1", "2001:db8:7:7::2", "2001:db8:7:7:ffff::3"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(announce(&B, v6[i], 27000, BASIC, code, sizeof code), 200);
    assert_int_equal(announce(&B, "2001:db8:7:7:1234::9", 27000, BASIC, code, sizeof code), 429);
    assert_string_equal(code, "too_many_servers");
    assert_int_equal(announce(&B, "2001:db8:7:8::1", 27000, BASIC, code, sizeof code), 200);
    for (int i = 1; i <= 3; i++) {
        char ip[32];
        snprintf(ip, sizeof ip, "10.9.9.%d", i);
        assert_int_equal(announce(&B, ip, 27000, BASIC, code, sizeof code), 200);
    }
    assert_int_equal(announce(&B, "10.9.9.200", 27000, BASIC, code, sizeof code), 429);
    assert_string_equal(code, "too_many_servers");
    assert_int_equal(announce(&B, "10.9.8.1", 27000, BASIC, code, sizeof code), 200);

    /* Challenges cost no Redis state: 200 challenges from 200
     * addresses leave Redis as it was; each address is held to its request rate. */
    char chal[64];
    h_keys_t before, after;
    h_keys_take(&redis, &before, "*", NULL);
    for (int i = 0; i < 200; i++) {
        char ip[32];
        snprintf(ip, sizeof ip, "10.%d.%d.1", 44 + i / 200, i % 200);
        challenge(&B, ip, chal, sizeof chal);
    }
    h_keys_take(&redis, &after, "*", NULL);
    h_keys_same_names(&before, &after, "200 challenges");

    /* Other addresses are unaffected: the earlier server is listed and can renew. */
    char next[64];
    list(&B, "/v1/master/servers?limit=8&after=10.3.3.2:1", got, sizeof got, next, sizeof next);
    assert_non_null(strstr(got, "10.5.5.5:27015"));
    assert_non_null(strstr(got, "10.3.3.3:27000"));
    assert_null(strstr(got, "10.3.3.3:27003"));
    assert_int_equal(announce(&B, "10.5.5.5", 27015, BASIC, code, sizeof code), 200);
    assert_int_equal(announce(&B, "10.6.6.6", 27015, BASIC, code, sizeof code), 200);
}

static const char *caller_of(const h_serverdir_t *s, const char *xff, long *status)
{
    static char addr[64];
    h_resp_t r;
    *status = req(s, "POST", "/v1/master/challenge", NULL, xff, &r);
    json_t *j = h_resp_json(&r);
    snprintf(addr, sizeof addr, "%s",
             *status == 200 ? json_string_value(json_object_get(j, "address")) : h_err_code(&r));
    json_decref(j);
    h_resp_free(&r);
    return addr;
}

static void forwarded_for_only_from_trusted(void **state)
{
    long st;
    assert_string_equal(caller_of(&A, "10.7.7.7", &st), "127.0.0.1");
    assert_string_equal(caller_of(&B, "10.7.7.7", &st), "10.7.7.7");
    /* The right-most entry not a trusted proxy: the client cannot choose by prepending. */
    assert_string_equal(caller_of(&B, "1.1.1.1, 10.7.7.8, 127.0.0.1", &st), "10.7.7.8");
    assert_string_equal(caller_of(&B, "::ffff:10.7.7.9", &st), "10.7.7.9");
    assert_string_equal(caller_of(&B, "10.7.7.7, garbage", &st), "bad_forwarded_for");
    assert_int_equal(st, 400);
    /* A heartbeat through the proxy lists the forwarded address, never 127.0.0.1. */
    char code[64], got[256];
    assert_int_equal(announce(&B, "10.8.8.8", 26000, BASIC, code, sizeof code), 200);
    char next[64];
    list(&B, "/v1/master/servers?limit=5&after=10.8.8.7:1", got, sizeof got, next, sizeof next);
    assert_true(strncmp(got, "10.8.8.8:26000", 14) == 0);
}

/* Whether addr is in the listing of game through A. */
static int listed_addr(const char *game, const char *addr)
{
    char path[160], got[8192], next[64];
    snprintf(path, sizeof path, "/v1/master/servers?game=%s&limit=100", game);
    list(&A, path, got, sizeof got, next, sizeof next);
    return strstr(got, addr) != NULL;
}

/* A supervised server names its cluster and instance in its heartbeat: when the
 * directory records that instance stopped, its entry leaves the list at once (not when the
 * listing runs out); an entry without an instance is untouched. Linking takes the
 * instance's credential or an ops token (the credential case comes with the credentials). */
static void instance_stop_removes_its_entry(void **state)
{
    (void)state;
    char code[64];
    int linked = 0;
    assert_int_equal(announce_tok(&A, H_TOK_OPS, 28001, "\"game\":\"Supervised\",\"players\":1,"
                                  "\"max_players\":8,\"cluster\":\"mc\",\"instance\":\"zone-m1-7\"",
                                  code, sizeof code, &linked),
                     200);
    assert_true(linked);
    assert_int_equal(announce(&A, NULL, 28002, "\"game\":\"Supervised\",\"players\":1,"
                              "\"max_players\":8", code, sizeof code),
                     200);
    assert_int_equal(announce(&A, NULL, 28003, "\"game\":\"Supervised\",\"players\":1,"
                              "\"max_players\":8,\"instance\":\"zone-m1-8\"", code, sizeof code),
                     400);
    assert_true(listed_addr("supervised", "127.0.0.1:28001"));
    h_resp_t r;
    char url[256];
    snprintf(url, sizeof url, "%s/v1/clusters/mc/events", A.url);
    static const char stop[] =
        "{\"events\":[{\"id\":\"mc1\",\"type\":\"stopped\",\"instance\":\"zone-m1-7\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"hung\",\"silent_ms\":3000}]}";
    assert_int_equal(h_http("POST", url, H_TOK_BB, NULL, stop, sizeof stop - 1, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_false(listed_addr("supervised", "127.0.0.1:28001"));
    assert_true(listed_addr("supervised", "127.0.0.1:28002"));
    assert_int_equal(h_http_json("GET", A.url, NULL, NULL, &r, "/metrics"), 0);
    assert_non_null(strstr(r.body, "serverdir_master_removed_on_stop_total 1"));
    h_resp_free(&r);
}

/* Issue 28 finding 10: a heartbeat without the instance's credential names a cluster and
 * instance. It is listed (listing needs no token) but not linked: no key is written for
 * the instance, known or not, and the instance stopping does not remove it. A game token
 * that is not that instance's credential links no more than no token. */
static void unauthenticated_link_refused(void **state)
{
    (void)state;
    static const char fields[] = "\"game\":\"Unlinked\",\"players\":1,\"max_players\":8,"
                                 "\"cluster\":\"ml\",\"instance\":\"zone-m1-9\"";
    h_keys_t before, after;
    h_keys_take(&redis, &before, "sd:master:inst:*", "sd:{master}:inst:*", NULL);
    char code[64];
    int linked = 1;
    assert_int_equal(announce_tok(&A, NULL, 28101, fields, code, sizeof code, &linked), 200);
    assert_false(linked);
    linked = 1;
    assert_int_equal(announce_tok(&A, H_TOK_GAME, 28102, fields, code, sizeof code, &linked), 200);
    assert_false(linked);
    h_keys_take(&redis, &after, "sd:master:inst:*", "sd:{master}:inst:*", NULL);
    h_keys_same_names(&before, &after, "heartbeats naming ml/zone-m1-9 without its credential");
    assert_true(listed_addr("unlinked", "127.0.0.1:28101"));

    h_resp_t r;
    char url[256];
    snprintf(url, sizeof url, "%s/v1/clusters/ml/events", A.url);
    static const char stop[] =
        "{\"events\":[{\"id\":\"ml1\",\"type\":\"stopped\",\"instance\":\"zone-m1-9\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"hung\",\"silent_ms\":3000}]}";
    assert_int_equal(h_http("POST", url, H_TOK_BB, NULL, stop, sizeof stop - 1, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_true(listed_addr("unlinked", "127.0.0.1:28101"));
    assert_int_equal(h_http_json("GET", A.url, NULL, NULL, &r, "/metrics"), 0);
    assert_non_null(strstr(r.body, "serverdir_master_links_refused_total 2"));
    h_resp_free(&r);
}

/* With the instance's own credential a heartbeat links (issue 28: "master heartbeats may
 * link an instance only with that instance's credential"): the link is made, naming
 * another instance with it links nothing, and once the directory records the instance
 * stopped its entry leaves the list and the same credential is refused 401. */
static void credential_links_its_own_instance(void **state)
{
    (void)state;
    h_resp_t r;
    char url[256];
    snprintf(url, sizeof url, "%s/v1/clusters/mk/events", A.url);
    static const char start[] =
        "{\"events\":[{\"id\":\"mk0\",\"type\":\"started\",\"instance\":\"zone-m1-5\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"pid\":4242,\"generation\":1}]}";
    assert_int_equal(h_http("POST", url, H_TOK_BB, NULL, start, sizeof start - 1, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    snprintf(url, sizeof url, "%s/v1/clusters/mk/machines/m1/instances/zone-m1-5/credential",
             A.url);
    assert_int_equal(h_http("POST", url, H_TOK_BB, NULL, "{}", 2, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    char cred[4200];
    snprintf(cred, sizeof cred, "%s", json_string_value(json_object_get(j, "credential")));
    json_decref(j);
    h_resp_free(&r);

    char code[64];
    int linked = 0;
    assert_int_equal(announce_tok(&A, cred, 28201, "\"game\":\"Credentialed\",\"players\":1,"
                                  "\"max_players\":8,\"cluster\":\"mk\",\"instance\":\"zone-m1-5\"",
                                  code, sizeof code, &linked),
                     200);
    assert_true(linked);
    linked = 1;
    assert_int_equal(announce_tok(&A, cred, 28202, "\"game\":\"Credentialed\",\"players\":1,"
                                  "\"max_players\":8,\"cluster\":\"mk\",\"instance\":\"zone-m1-6\"",
                                  code, sizeof code, &linked),
                     200);
    assert_false(linked);
    assert_true(listed_addr("credentialed", "127.0.0.1:28201"));

    snprintf(url, sizeof url, "%s/v1/clusters/mk/events", A.url);
    static const char stop[] =
        "{\"events\":[{\"id\":\"mk1\",\"type\":\"stopped\",\"instance\":\"zone-m1-5\","
        "\"machine\":\"m1\",\"service\":\"zone\",\"reason\":\"hung\",\"silent_ms\":3000}]}";
    assert_int_equal(h_http("POST", url, H_TOK_BB, NULL, stop, sizeof stop - 1, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_false(listed_addr("credentialed", "127.0.0.1:28201"));
    assert_true(listed_addr("credentialed", "127.0.0.1:28202"));
    assert_int_equal(announce_tok(&A, cred, 28201, "\"game\":\"Credentialed\",\"players\":1,"
                                  "\"max_players\":8,\"cluster\":\"mk\",\"instance\":\"zone-m1-5\"",
                                  code, sizeof code, NULL),
                     401);
    assert_string_equal(code, "credential_revoked");
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(challenge_heartbeat_listing),
        cmocka_unit_test(spoofed_heartbeats_rejected),
        cmocka_unit_test(entries_expire),
        cmocka_unit_test(termination_only_from_same_address),
        cmocka_unit_test(every_filter),
        cmocka_unit_test(cursor_walk_1200),
        cmocka_unit_test(sdctl_servers),
        cmocka_unit_test(flood_limits),
        cmocka_unit_test(forwarded_for_only_from_trusted),
        cmocka_unit_test(instance_stop_removes_its_entry),
        cmocka_unit_test(unauthenticated_link_refused),
        cmocka_unit_test(credential_links_its_own_instance),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
