/* Instance credentials (docs/operations.md, "Workload identity"; issue 28): who may obtain
 * one and for what, the JWT checked against /.well-known/jwks.json with OpenSSL here
 * (independently of serverdir's code), what a credential may do, which ones are refused
 * (expired, forged, "none", HMAC keyed with the public key, unknown key), revocation the
 * moment the directory records the instance stopped or restarted, the keyring's rotation
 * and two serverdir copies on one Redis accepting each other's credentials. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <pthread.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include "harness.h"
#include "harness_stack.h"

#define C "authz1"
#define J "application/json"

static h_redis_t redis;
static h_serverdir_t sd;

static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, NULL);
}

/* ---------- helpers ---------- */

static long ask(const h_serverdir_t *s, const char *method, const char *path, const char *token,
                const char *body, const char *const *hdrs, char *msg, size_t cap)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", s->url, path);
    h_resp_t r;
    int raw = hdrs != NULL;
    if (h_http(method, url, token, raw ? "application/octet-stream" : NULL, body,
               body ? strlen(body) : 0, hdrs, &r))
        return 0;
    if (msg)
        snprintf(msg, cap, "%s", r.body ? r.body : "");
    long st = r.status;
    h_resp_free(&r);
    return st;
}

/* A started (or stopped) event of instance i on machine m, generation g. */
static void event(const char *id, const char *type, const char *i, const char *m, int g)
{
    char body[512], msg[512];
    snprintf(body, sizeof body,
             "{\"events\":[{\"id\":\"%s\",\"type\":\"%s\",\"instance\":\"%s\",\"machine\":\"%s\","
             "\"service\":\"zone\",\"generation\":%d%s}]}",
             id, type, i, m, g,
             strcmp(type, "stopped") ? ",\"pid\":100" : ",\"reason\":\"exited\",\"code\":0");
    assert_int_equal(ask(&sd, "POST", "/v1/clusters/" C "/events", H_TOK_BB, body, NULL, msg,
                         sizeof msg),
                     200);
}

/* POST .../credential as token on s; the status, and the answer in *out (caller decrefs). */
static long issue_on(const h_serverdir_t *s, const char *token, const char *m, const char *i,
                     const char *body, json_t **out)
{
    char path[256], msg[8192];
    snprintf(path, sizeof path, "/v1/clusters/" C "/machines/%s/instances/%s/credential", m, i);
    long st = ask(s, "POST", path, token, body, NULL, msg, sizeof msg);
    *out = json_loads(msg, 0, NULL);
    return st;
}

/* A credential of instance i on m (must be issued): a malloc'd JWT. */
static char *credential(const h_serverdir_t *s, const char *m, const char *i)
{
    json_t *o;
    assert_int_equal(issue_on(s, H_TOK_BB_M1, m, i, NULL, &o), 200);
    char *jwt = strdup(json_string_value(json_object_get(o, "credential")));
    json_decref(o);
    return jwt;
}

static const char *err_code(const char *msg)
{
    static char code[64];
    json_t *o = json_loads(msg, 0, NULL);
    snprintf(code, sizeof code, "%s",
             json_string_value(json_object_get(json_object_get(o, "error"), "code")) ?: "");
    json_decref(o);
    return code;
}

static const char b64u[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static size_t b64u_decode(const char *s, size_t n, unsigned char *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(b64u, s[i]);
        assert_non_null(p);
        acc = acc << 6 | (uint32_t)(p - b64u);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            assert_true(o < cap);
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return o;
}

static void b64u_encode(const unsigned char *p, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        out[o++] = b64u[v >> 18 & 63];
        out[o++] = b64u[v >> 12 & 63];
        if (i + 1 < n)
            out[o++] = b64u[v >> 6 & 63];
        if (i + 2 < n)
            out[o++] = b64u[v & 63];
    }
    out[o] = '\0';
}

/* Part k (0 header, 1 claims) of jwt as JSON. */
static json_t *jwt_part(const char *jwt, int k)
{
    const char *p = jwt;
    for (int i = 0; i < k; i++)
        p = strchr(p, '.') + 1;
    const char *e = strchr(p, '.');
    unsigned char buf[4096];
    size_t n = b64u_decode(p, (size_t)(e - p), buf, sizeof buf);
    json_t *o = json_loadb((const char *)buf, n, 0, NULL);
    assert_non_null(o);
    return o;
}

/* The P-256 public key of a JWK's x and y. */
static EVP_PKEY *jwk_key(const char *x, const char *y)
{
    unsigned char pt[65];
    pt[0] = 4; /* uncompressed point */
    assert_int_equal(b64u_decode(x, strlen(x), pt + 1, 32), 32);
    assert_int_equal(b64u_decode(y, strlen(y), pt + 33, 32), 32);
    OSSL_PARAM_BLD *b = OSSL_PARAM_BLD_new();
    OSSL_PARAM_BLD_push_utf8_string(b, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0);
    OSSL_PARAM_BLD_push_octet_string(b, OSSL_PKEY_PARAM_PUB_KEY, pt, sizeof pt);
    OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(b);
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    EVP_PKEY *pk = NULL;
    assert_int_equal(EVP_PKEY_fromdata_init(ctx), 1);
    assert_int_equal(EVP_PKEY_fromdata(ctx, &pk, EVP_PKEY_PUBLIC_KEY, params), 1);
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(b);
    return pk;
}

/* Whether jwt's ES256 signature (JOSE: r || s, 32 bytes each) verifies with pk over
 * "header.claims". */
static int es256_ok(const char *jwt, EVP_PKEY *pk)
{
    const char *dot2 = strrchr(jwt, '.');
    unsigned char rs[64], *der = NULL;
    if (b64u_decode(dot2 + 1, strlen(dot2 + 1), rs, sizeof rs) != 64)
        return 0;
    ECDSA_SIG *sig = ECDSA_SIG_new();
    ECDSA_SIG_set0(sig, BN_bin2bn(rs, 32, NULL), BN_bin2bn(rs + 32, 32, NULL));
    int derlen = i2d_ECDSA_SIG(sig, &der);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, pk) == 1 &&
             EVP_DigestVerify(md, der, (size_t)derlen, (const unsigned char *)jwt,
                              (size_t)(dot2 - jwt)) == 1;
    EVP_MD_CTX_free(md);
    OPENSSL_free(der);
    ECDSA_SIG_free(sig);
    return ok;
}

/* The private key of kid from the keyring in Redis (the test reads what serverdir
 * stores, to forge what only a key holder could). */
static EVP_PKEY *keyring_key(const char *kid)
{
    h_redis_route(&redis, "sd:keyring");
    redisReply *r = h_redis(&redis, "HGET sd:keyring %s", kid);
    assert_true(r && r->type == REDIS_REPLY_STRING);
    const char *pem = strchr(r->str, '\n') + 1;
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *pk = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    assert_non_null(pk);
    BIO_free(b);
    freeReplyObject(r);
    return pk;
}

/* A JWT of header and claims (JSON text) signed ES256 with pk, into out (cap bytes). */
static void es256_sign(const char *header, const char *claims, EVP_PKEY *pk, char *out, size_t cap)
{
    char h[1024], c[2048], sigs[100];
    b64u_encode((const unsigned char *)header, strlen(header), h);
    b64u_encode((const unsigned char *)claims, strlen(claims), c);
    int n = snprintf(out, cap, "%s.%s", h, c);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char der[128], rs[64] = {0};
    size_t dlen = sizeof der;
    assert_int_equal(EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, pk), 1);
    assert_int_equal(EVP_DigestSign(md, der, &dlen, (const unsigned char *)out, (size_t)n), 1);
    const unsigned char *p = der;
    ECDSA_SIG *sig = d2i_ECDSA_SIG(NULL, &p, (long)dlen);
    BN_bn2binpad(ECDSA_SIG_get0_r(sig), rs, 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(sig), rs + 32, 32);
    b64u_encode(rs, 64, sigs);
    snprintf(out + n, cap - (size_t)n, ".%s", sigs);
    ECDSA_SIG_free(sig);
    EVP_MD_CTX_free(md);
}

/* ---------- tests ---------- */

/* Who may obtain a credential, and for which instance. */
static void issuance_follows_the_directory(void **state)
{
    (void)state;
    json_t *o;
    event("i1", "started", "cr-a", "m1", 3);
    event("i2", "started", "cr-b", "m2", 1);
    event("i3", "started", "cr-c", "m1", 1);
    event("i4", "stopped", "cr-c", "m1", 1);

    assert_int_equal(issue_on(&sd, H_TOK_BB_M1, "m1", "cr-a", "{\"generation\":3}", &o), 200);
    const char *jwt = json_string_value(json_object_get(o, "credential"));
    assert_non_null(jwt);
    assert_int_equal(json_integer_value(json_object_get(o, "generation")), 3);
    assert_string_equal(json_string_value(json_object_get(o, "service")), "zone");
    long long in = json_integer_value(json_object_get(o, "expires_in_ms"));
    assert_true(in > 3590000 && in <= 3600000);
    assert_true(json_integer_value(json_object_get(o, "expires_at_ms")) >
                (long long)time(NULL) * 1000 + 3590000);
    json_t *h = jwt_part(jwt, 0), *c = jwt_part(jwt, 1);
    assert_string_equal(json_string_value(json_object_get(h, "alg")), "ES256");
    assert_string_equal(json_string_value(json_object_get(h, "kid")),
                        json_string_value(json_object_get(o, "kid")));
    assert_string_equal(json_string_value(json_object_get(c, "iss")), "serverdir");
    assert_string_equal(json_string_value(json_object_get(c, "aud")), "serverdir");
    assert_string_equal(json_string_value(json_object_get(c, "sub")), C "/cr-a");
    assert_string_equal(json_string_value(json_object_get(c, "cluster")), C);
    assert_string_equal(json_string_value(json_object_get(c, "machine")), "m1");
    assert_string_equal(json_string_value(json_object_get(c, "service")), "zone");
    assert_string_equal(json_string_value(json_object_get(c, "instance")), "cr-a");
    assert_true(json_is_integer(json_object_get(c, "generation")));
    assert_int_equal(json_integer_value(json_object_get(c, "generation")), 3);
    assert_int_equal(json_integer_value(json_object_get(c, "exp")) -
                         json_integer_value(json_object_get(c, "iat")),
                     3600);
    assert_true(strlen(json_string_value(json_object_get(c, "jti"))) >= 16);
    json_decref(h);
    json_decref(c);
    json_decref(o);

    /* the refusals, each changing nothing */
    static const struct {
        const char *token, *m, *i, *body;
        long status;
        const char *code;
    } no[] = {
        {H_TOK_BB_M1, "m2", "cr-b", NULL, 403, "forbidden"},       /* another machine's token */
        {H_TOK_BB_M1, "m1", "cr-b", NULL, 403, "forbidden"},       /* recorded on m2 */
        {H_TOK_BB_M1, "m1", "cr-none", NULL, 404, "no_such_instance"},
        {H_TOK_BB_M1, "m1", "cr-c", NULL, 409, "instance_stopped"},
        {H_TOK_BB_M1, "m1", "cr-a", "{\"generation\":2}", 409, "generation_mismatch"},
        {H_TOK_BB_M1, "m1", "cr-a", "{\"generation\":\"3\"}", 400, "bad_field"},
        {H_TOK_BB_M1, "m1", "cr-a", "{\"gen\":3}", 400, "bad_field"},
        {H_TOK_BB_M1, "m1", "bad..name", NULL, 400, "bad_name"},
        {H_TOK_GAME, "m1", "cr-a", NULL, 403, "forbidden"},
        {H_TOK_VIEWER, "m1", "cr-a", NULL, 403, "forbidden"},
        {NULL, "m1", "cr-a", NULL, 401, "unauthorized"},
    };
    for (size_t k = 0; k < sizeof no / sizeof no[0]; k++) {
        h_keys_t before, after;
        h_keys_take(&redis, &before, H_KEYS_CLUSTER(C), "sd:keyring", NULL);
        long st = issue_on(&sd, no[k].token, no[k].m, no[k].i, no[k].body, &o);
        h_keys_take(&redis, &after, H_KEYS_CLUSTER(C), "sd:keyring", NULL);
        const char *code = json_string_value(json_object_get(json_object_get(o, "error"), "code"));
        if (st != no[k].status || !code || strcmp(code, no[k].code))
            fail_msg("case %zu (%s %s): %ld %s", k, no[k].m, no[k].i, st, code ? code : "-");
        h_keys_same(&before, &after, "a refused credential request");
        json_decref(o);
    }
    /* ops may ask for any machine's instance; the unbound bigbrother token too */
    assert_int_equal(issue_on(&sd, H_TOK_OPS, "m2", "cr-b", NULL, &o), 200);
    json_decref(o);
    assert_int_equal(issue_on(&sd, H_TOK_BB, "m2", "cr-b", "{}", &o), 200);
    json_decref(o);
}

/* The JWKS verifies a credential with OpenSSL alone: x and y decoded here, the JOSE
 * signature turned into DER here; a changed claim does not verify. */
static void jwks_verifies_the_credential(void **state)
{
    (void)state;
    char msg[8192];
    char *jwt = credential(&sd, "m1", "cr-a");
    assert_int_equal(ask(&sd, "GET", "/.well-known/jwks.json", NULL, NULL, NULL, msg, sizeof msg),
                     200);
    json_t *jwks = json_loads(msg, 0, NULL), *h = jwt_part(jwt, 0), *k, *found = NULL;
    size_t i;
    json_array_foreach(json_object_get(jwks, "keys"), i, k)
        if (!strcmp(json_string_value(json_object_get(k, "kid")),
                    json_string_value(json_object_get(h, "kid"))))
            found = k;
    assert_non_null(found);
    assert_string_equal(json_string_value(json_object_get(found, "kty")), "EC");
    assert_string_equal(json_string_value(json_object_get(found, "crv")), "P-256");
    assert_string_equal(json_string_value(json_object_get(found, "alg")), "ES256");
    assert_string_equal(json_string_value(json_object_get(found, "use")), "sig");
    EVP_PKEY *pk = jwk_key(json_string_value(json_object_get(found, "x")),
                           json_string_value(json_object_get(found, "y")));
    assert_true(es256_ok(jwt, pk));
    char *bad = strdup(jwt);
    char *claims = strchr(bad, '.') + 1;
    claims[3] = claims[3] == 'A' ? 'B' : 'A';
    assert_false(es256_ok(bad, pk));
    free(bad);
    EVP_PKEY_free(pk);
    json_decref(h);
    json_decref(jwks);
    free(jwt);
}

/* A credential acts as its own instance: locks and blobs as that holder, nothing else;
 * its signature is checked once, not on each request. */
static void credential_acts_as_its_instance(void **state)
{
    (void)state;
    char msg[4096], seqh[64], tokh[96];
    char *jwt = credential(&sd, "m1", "cr-a");
    long long v0 = h_metric(sd.url, "serverdir_credentials_verified_total");
    assert_int_equal(ask(&sd, "PUT", "/v1/locks/cr-p1", jwt, "{\"holder\":\"cr-a\"}", NULL, msg,
                         sizeof msg),
                     200);
    json_t *g = json_loads(msg, 0, NULL);
    snprintf(seqh, sizeof seqh, "Lock-Seq: %lld",
             (long long)json_integer_value(json_object_get(g, "lock_seq")));
    snprintf(tokh, sizeof tokh, "Lock-Token: %s",
             json_string_value(json_object_get(g, "lock_token")));
    json_decref(g);
    const char *hs[] = {seqh, tokh, "Blob-Seq: 1", NULL};
    assert_int_equal(ask(&sd, "PUT", "/v1/blobs/cr-p1", jwt, "state", hs, msg, sizeof msg), 200);
    assert_int_equal(ask(&sd, "GET", "/v1/locks/cr-p1", jwt, NULL, NULL, msg, sizeof msg), 200);

    /* a lock another holds (by name, of no cluster it knows) and its grant, taken with a
     * shared game token */
    assert_int_equal(ask(&sd, "PUT", "/v1/locks/cr-p4", H_TOK_GAME, "{\"holder\":\"far-1\"}",
                         NULL, msg, sizeof msg),
                     200);
    g = json_loads(msg, 0, NULL);
    snprintf(seqh, sizeof seqh, "Lock-Seq: %lld",
             (long long)json_integer_value(json_object_get(g, "lock_seq")));
    snprintf(tokh, sizeof tokh, "Lock-Token: %s",
             json_string_value(json_object_get(g, "lock_token")));
    json_decref(g);
    h_sleep_ms(5);

    /* each refused, nothing written: another holder, even one of its own machine; a blob
     * of the other's lock with that grant in hand; a steal from a holder its cluster does
     * not know */
    static const struct {
        const char *method, *path, *body;
        int blob;
        long status;
        const char *code;
    } no[] = {
        {"PUT", "/v1/locks/cr-p2", "{\"holder\":\"cr-other\"}", 0, 403, "forbidden"},
        {"POST", "/v1/locks/acquire", "{\"holder\":\"cr-aa\",\"keys\":[\"cr-p3\"]}", 0, 403,
         "forbidden"},
        {"PUT", "/v1/blobs/cr-p4", "stolen", 1, 403, "forbidden"},
        {"PUT", "/v1/locks/cr-p4", "{\"holder\":\"cr-a\",\"steal_if_older_than_ms\":1}", 0, 409,
         "lock_held"},
    };
    for (size_t k = 0; k < sizeof no / sizeof no[0]; k++) {
        h_keys_t before, after;
        h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
        long st = ask(&sd, no[k].method, no[k].path, jwt, no[k].body, no[k].blob ? hs : NULL, msg,
                      sizeof msg);
        h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
        if (st != no[k].status || strcmp(err_code(msg), no[k].code))
            fail_msg("%s %s: %ld %s", no[k].method, no[k].path, st, msg);
        if (st == 403 && !strstr(msg, "this credential names instance 'cr-a'"))
            fail_msg("%s %s: %s", no[k].method, no[k].path, msg);
        h_keys_same(&before, &after, no[k].path);
    }
    /* a bigbrother route: the game role may not */
    assert_int_equal(ask(&sd, "GET", "/v1/clusters/" C "/processes", jwt, NULL, NULL, msg,
                         sizeof msg),
                     403);
    /* another cluster's routes: not its cluster */
    assert_int_equal(ask(&sd, "GET", "/v1/clusters/authz2/allocations", jwt, NULL, NULL, msg,
                         sizeof msg),
                     403);
    /* one signature check for all of the above (a cache hit after the first) */
    assert_int_equal(h_metric(sd.url, "serverdir_credentials_verified_total") - v0, 1);
    free(jwt);
}

/* Refused credentials: 401 unauthorized saying why, nothing written. */
static void forged_and_expired_credentials_are_refused(void **state)
{
    (void)state;
    char msg[4096], jwt2[4096], claims[1024], header[256];
    char *jwt = credential(&sd, "m1", "cr-a");
    json_t *h = jwt_part(jwt, 0);
    const char *kid = json_string_value(json_object_get(h, "kid"));
    EVP_PKEY *pk = keyring_key(kid);
    long long now = (long long)time(NULL);
    snprintf(header, sizeof header, "{\"alg\":\"ES256\",\"kid\":\"%s\",\"typ\":\"JWT\"}", kid);
#define CLAIMS(exp, iss)                                                                     \
    snprintf(claims, sizeof claims,                                                          \
             "{\"iss\":\"%s\",\"aud\":\"serverdir\",\"sub\":\"" C "/cr-a\",\"cluster\":\"" C  \
             "\",\"machine\":\"m1\",\"service\":\"zone\",\"instance\":\"cr-a\","             \
             "\"generation\":3,\"iat\":%lld,\"exp\":%lld,\"jti\":\"x\"}",                   \
             iss, now - 100, (long long)(exp))

    struct {
        const char *what, *why;
        char jwt[4096];
    } cases[7];
    int n = 0;
    /* the control: a credential signed here with the keyring's key is accepted */
    CLAIMS(now + 600, "serverdir");
    es256_sign(header, claims, pk, jwt2, sizeof jwt2);
    if (ask(&sd, "GET", "/v1/locks/cr-p1", jwt2, NULL, NULL, msg, sizeof msg) != 200)
        fail_msg("a credential signed with the keyring's key: %s", msg);

    CLAIMS(now - 1, "serverdir");
    es256_sign(header, claims, pk, cases[n].jwt, sizeof cases[n].jwt);
    cases[n].what = "expired";
    cases[n++].why = "expired";
    CLAIMS(now + 600, "someone");
    es256_sign(header, claims, pk, cases[n].jwt, sizeof cases[n].jwt);
    cases[n].what = "another issuer";
    cases[n++].why = "issuer";
    /* a changed claim under the old signature */
    snprintf(cases[n].jwt, sizeof cases[n].jwt, "%s", jwt);
    char *c = strchr(cases[n].jwt, '.') + 1;
    c[5] = c[5] == 'A' ? 'B' : 'A';
    cases[n].what = "tampered";
    cases[n++].why = "signature";
    /* alg none, no signature */
    {
        char hb[256], cb[2048];
        const char *none = "{\"alg\":\"none\",\"typ\":\"JWT\"}";
        CLAIMS(now + 600, "serverdir");
        b64u_encode((const unsigned char *)none, strlen(none), hb);
        b64u_encode((const unsigned char *)claims, strlen(claims), cb);
        snprintf(cases[n].jwt, sizeof cases[n].jwt, "%s.%s.", hb, cb);
        cases[n].what = "alg none";
        cases[n++].why = "ES256";
    }
    /* HS256 keyed with the public key's PEM (the algorithm confusion attack) */
    {
        char hb[256], cb[2048], sb[64];
        char hs[256];
        snprintf(hs, sizeof hs, "{\"alg\":\"HS256\",\"kid\":\"%s\",\"typ\":\"JWT\"}", kid);
        BIO *b = BIO_new(BIO_s_mem());
        PEM_write_bio_PUBKEY(b, pk);
        char *pem;
        long pl = BIO_get_mem_data(b, &pem);
        b64u_encode((const unsigned char *)hs, strlen(hs), hb);
        b64u_encode((const unsigned char *)claims, strlen(claims), cb);
        int m = snprintf(cases[n].jwt, sizeof cases[n].jwt, "%s.%s", hb, cb);
        unsigned char mac[32];
        unsigned int ml = 0;
        HMAC(EVP_sha256(), pem, (int)pl, (const unsigned char *)cases[n].jwt, (size_t)m, mac, &ml);
        b64u_encode(mac, ml, sb);
        snprintf(cases[n].jwt + m, sizeof cases[n].jwt - (size_t)m, ".%s", sb);
        BIO_free(b);
        cases[n].what = "HS256 with the public key";
        cases[n++].why = "ES256";
    }
    /* a key the keyring does not hold */
    {
        EVP_PKEY *other = EVP_EC_gen("P-256");
        char hx[256];
        snprintf(hx, sizeof hx, "{\"alg\":\"ES256\",\"kid\":\"00000000deadbeef\",\"typ\":\"JWT\"}");
        es256_sign(hx, claims, other, cases[n].jwt, sizeof cases[n].jwt);
        EVP_PKEY_free(other);
        cases[n].what = "unknown kid";
        cases[n++].why = "not in the keyring";
    }
    /* the keyring's kid, signed by another key */
    {
        EVP_PKEY *other = EVP_EC_gen("P-256");
        es256_sign(header, claims, other, cases[n].jwt, sizeof cases[n].jwt);
        EVP_PKEY_free(other);
        cases[n].what = "another key under the kid";
        cases[n++].why = "signature";
    }
    for (int k = 0; k < n; k++) {
        h_keys_t before, after;
        h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
        long st = ask(&sd, "PUT", "/v1/locks/cr-f", cases[k].jwt, "{\"holder\":\"cr-a\"}", NULL,
                      msg, sizeof msg);
        h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
        if (st != 401 || strcmp(err_code(msg), "unauthorized") || !strstr(msg, cases[k].why))
            fail_msg("%s: %ld %s", cases[k].what, st, msg);
        h_keys_same(&before, &after, cases[k].what);
    }
    /* a token-file token still works beside them */
    assert_int_equal(ask(&sd, "GET", "/v1/locks/cr-p1", H_TOK_GAME, NULL, NULL, msg, sizeof msg),
                     200);
    EVP_PKEY_free(pk);
    json_decref(h);
    free(jwt);
}

/* The directory says stop: the credential is refused on the next request, on every path
 * (a lock script, a renew, a blob save, a read); a new generation's credential works and
 * the old one stays refused. */
static void revoked_at_once_then_renewed(void **state)
{
    (void)state;
    char msg[4096], body[256];
    event("r1", "started", "cr-r", "m1", 1);
    char *jwt = credential(&sd, "m1", "cr-r");
    assert_int_equal(ask(&sd, "PUT", "/v1/locks/cr-r1", jwt, "{\"holder\":\"cr-r\",\"ttl_ms\":60000}",
                         NULL, msg, sizeof msg),
                     200);
    json_t *g = json_loads(msg, 0, NULL);
    long long seq = json_integer_value(json_object_get(g, "lock_seq"));
    char tok[64], seqh[64], tokh[96];
    snprintf(tok, sizeof tok, "%s", json_string_value(json_object_get(g, "lock_token")));
    json_decref(g);
    event("r2", "stopped", "cr-r", "m1", 1);

    snprintf(body, sizeof body, "{\"holder\":\"cr-r\",\"lock_seq\":%lld,\"lock_token\":\"%s\"}",
             seq, tok);
    snprintf(seqh, sizeof seqh, "Lock-Seq: %lld", seq);
    snprintf(tokh, sizeof tokh, "Lock-Token: %s", tok);
    const char *hs[] = {seqh, tokh, "Blob-Seq: 1", NULL};
    struct {
        const char *method, *path, *body;
        const char *const *hdrs;
    } reqs[] = {
        {"PUT", "/v1/locks/cr-r2", "{\"holder\":\"cr-r\"}", NULL},
        {"POST", "/v1/locks/cr-r1/renew", body, NULL},
        {"PUT", "/v1/blobs/cr-r1", "x", hs},
        {"GET", "/v1/locks/cr-r1", NULL, NULL},
        {"GET", "/v1/clusters/" C "/allocations", NULL, NULL},
    };
    for (size_t k = 0; k < sizeof reqs / sizeof reqs[0]; k++) {
        h_keys_t before, after;
        h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
        long st = ask(&sd, reqs[k].method, reqs[k].path, jwt, reqs[k].body, reqs[k].hdrs, msg,
                      sizeof msg);
        h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
        if (st != 401 || strcmp(err_code(msg), "credential_revoked") ||
            !strstr(msg, "the instance stopped"))
            fail_msg("%s %s after the stop: %ld %s", reqs[k].method, reqs[k].path, st, msg);
        h_keys_same(&before, &after, reqs[k].path);
    }
    /* restarted as generation 2: a new credential, and the old one still refused */
    event("r3", "started", "cr-r", "m1", 2);
    assert_int_equal(ask(&sd, "GET", "/v1/locks/cr-r1", jwt, NULL, NULL, msg, sizeof msg), 401);
    assert_non_null(strstr(msg, "another generation"));
    json_t *o;
    assert_int_equal(issue_on(&sd, H_TOK_BB_M1, "m1", "cr-r", "{\"generation\":1}", &o), 409);
    json_decref(o);
    char *fresh = credential(&sd, "m1", "cr-r");
    assert_int_equal(ask(&sd, "PUT", "/v1/locks/cr-r2", fresh, "{\"holder\":\"cr-r\"}", NULL, msg,
                         sizeof msg),
                     200);
    /* the record names another machine (as after a move): refused */
    h_redis_route(&redis, "sd:{" C "}:proc:cr-r");
    freeReplyObject(h_redis(&redis, "HSET sd:{" C "}:proc:cr-r machine m2"));
    assert_int_equal(ask(&sd, "GET", "/v1/locks/cr-r2", fresh, NULL, NULL, msg, sizeof msg), 401);
    assert_string_equal(err_code(msg), "credential_revoked");
    assert_non_null(strstr(msg, "another machine"));
    free(fresh);
    free(jwt);
}

/* The keyring rotates; a credential signed before still verifies, on this copy and on a
 * second copy on the same Redis, and each copy accepts the other's. */
static void rotation_and_two_copies(void **state)
{
    (void)state;
    char msg[8192];
    event("k1", "started", "cr-k", "m1", 1);
    char *old = credential(&sd, "m1", "cr-k");
    json_t *h = jwt_part(old, 0);
    char kid1[64];
    snprintf(kid1, sizeof kid1, "%s", json_string_value(json_object_get(h, "kid")));
    json_decref(h);

    /* age the signing key past rotate_s (one day): the next copy to load it rotates */
    h_redis_route(&redis, "sd:keyring");
    redisReply *r = h_redis(&redis, "HGET sd:keyring %s", kid1);
    assert_true(r && r->type == REDIS_REPLY_STRING);
    long long created, retired, drop;
    int used = 0;
    assert_int_equal(sscanf(r->str, "%lld %lld %lld\n%n", &created, &retired, &drop, &used), 3);
    char *rec = NULL;
    assert_true(asprintf(&rec, "%lld 0 0\n%s", created - 86400LL * 1000 - 1000, r->str + used) > 0);
    freeReplyObject(r);
    r = h_redis(&redis, "HSET sd:keyring %s %s", kid1, rec);
    freeReplyObject(r);
    free(rec);

    h_serverdir_t sd2;
    assert_int_equal(h_sd_start(&sd2, &redis, NULL), 0);
    char *fresh = credential(&sd2, "m1", "cr-k");
    h = jwt_part(fresh, 0);
    assert_string_not_equal(json_string_value(json_object_get(h, "kid")), kid1);
    json_decref(h);
    h_redis_route(&redis, "sd:keyring");
    r = h_redis(&redis, "HLEN sd:keyring");
    assert_int_equal(r->integer, 2);
    freeReplyObject(r);
    r = h_redis(&redis, "HGET sd:keyring %s", kid1);
    assert_int_equal(sscanf(r->str, "%lld %lld %lld", &created, &retired, &drop), 3);
    assert_true(retired > 0 && drop >= retired + 3600LL * 1000);
    freeReplyObject(r);

    /* both credentials on both copies: the first copy learns the new kid on sight (an
     * unknown kid reloads the keyring at most every 100 ms: past that) */
    h_sleep_ms(150);
    const h_serverdir_t *copies[] = {&sd, &sd2};
    const char *creds[] = {old, fresh};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            if (ask(copies[i], "GET", "/v1/locks/cr-k", creds[k], NULL, NULL, msg, sizeof msg) != 200)
                fail_msg("copy %d, credential %d: %s", i, k, msg);
    /* the JWKS lists both keys; the newest signs on the first copy too once reloaded */
    assert_int_equal(ask(&sd2, "GET", "/.well-known/jwks.json", NULL, NULL, NULL, msg, sizeof msg),
                     200);
    json_t *jwks = json_loads(msg, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(jwks, "keys")), 2);
    json_decref(jwks);

    /* past its drop time (as when every credential it signed has expired) the retired key
     * leaves the JWKS and verification */
    h_redis_route(&redis, "sd:keyring");
    r = h_redis(&redis, "HGET sd:keyring %s", kid1);
    assert_int_equal(sscanf(r->str, "%lld %lld %lld\n%n", &created, &retired, &drop, &used), 3);
    assert_true(asprintf(&rec, "%lld %lld 1\n%s", created, retired, r->str + used) > 0);
    freeReplyObject(r);
    freeReplyObject(h_redis(&redis, "HSET sd:keyring %s %s", kid1, rec));
    free(rec);
    h_serverdir_stop(&sd2);
    assert_int_equal(h_sd_start(&sd2, &redis, NULL), 0);
    assert_int_equal(ask(&sd2, "GET", "/.well-known/jwks.json", NULL, NULL, NULL, msg, sizeof msg),
                     200);
    jwks = json_loads(msg, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(jwks, "keys")), 1);
    json_decref(jwks);
    assert_int_equal(ask(&sd2, "GET", "/v1/locks/cr-k", old, NULL, NULL, msg, sizeof msg), 401);
    assert_int_equal(ask(&sd2, "GET", "/v1/locks/cr-k", fresh, NULL, NULL, msg, sizeof msg), 200);
    h_serverdir_stop(&sd2);
    free(old);
    free(fresh);
}

struct race {
    const h_serverdir_t *s;
    char kid[64];
};

static void *race_issue(void *arg)
{
    struct race *r = arg;
    char msg[8192];
    if (ask(r->s, "POST", "/v1/clusters/" C "/machines/m1/instances/cr-k/credential", H_TOK_BB,
            NULL, NULL, msg, sizeof msg) == 200) {
        json_t *o = json_loads(msg, 0, NULL);
        snprintf(r->kid, sizeof r->kid, "%s", json_string_value(json_object_get(o, "kid")));
        json_decref(o);
    }
    return NULL;
}

/* Two copies that start on a Redis without a keyring and sign at the same moment agree
 * on one key (keyring_rotate.lua adds an offered key only while one is due). */
static void racing_copies_agree_on_the_first_key(void **state)
{
    (void)state;
    h_serverdir_t sd2;
    event("k9", "started", "cr-k", "m1", 5);
    h_redis_route(&redis, "sd:keyring");
    freeReplyObject(h_redis(&redis, "DEL sd:keyring"));
    assert_int_equal(h_sd_start(&sd2, &redis, NULL), 0);
    h_serverdir_stop(&sd); /* the first copy forgets its keyring: a fresh start */
    assert_int_equal(h_sd_start(&sd, &redis, NULL), 0);
    struct race r[2] = {{.s = &sd}, {.s = &sd2}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, race_issue, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_true(r[0].kid[0] && r[1].kid[0]);
    assert_string_equal(r[0].kid, r[1].kid);
    h_redis_route(&redis, "sd:keyring");
    redisReply *n = h_redis(&redis, "HLEN sd:keyring");
    assert_int_equal(n->integer, 1);
    freeReplyObject(n);
    h_serverdir_stop(&sd2);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(issuance_follows_the_directory),
        cmocka_unit_test(jwks_verifies_the_credential),
        cmocka_unit_test(credential_acts_as_its_instance),
        cmocka_unit_test(forged_and_expired_credentials_are_refused),
        cmocka_unit_test(revoked_at_once_then_renewed),
        cmocka_unit_test(rotation_and_two_copies),
        cmocka_unit_test(racing_copies_agree_on_the_first_key),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
