/* Instance credentials: the shared keyring, signing, the JWKS, verification with its
 * cache, and the liveness check (the model is in cred.h). */
#include "cred.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jwt.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>

#include "sdvalid.h"

#define ISSUER "serverdir"
#define AUDIENCE "serverdir"
#define KEYS_MAX 16               /* keys held at once: the signer and the retired ones */
#define KID_LEN 16                /* hex characters of a key id */
#define PEM_MAX 1024
#define RELOAD_MIN_MS 100         /* an unknown kid reloads at most this often */
#define CACHE_SLOTS 4096          /* verified credentials cached (about 600 B each) */
#define CACHE_STRIPES 64

sd_cred_cfg_t sd_cred_cfg = {.ttl_s = 3600, .rotate_s = 86400};

int sd_cred_config_load(const json_t *section, char *err, size_t errcap)
{
    static const char *const known[] = {"ttl_s", "rotate_s", NULL};
    if (!section)
        return 0;
    if (!json_is_object(section)) {
        snprintf(err, errcap, "section 'credentials' must be an object");
        return -1;
    }
    sd_cred_cfg_t c = sd_cred_cfg;
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, errcap);
    if (sd_jv_only_keys(&jv, section, known) ||
        sd_jv_int(&jv, section, "ttl_s", 0, 60, 7 * 86400, &c.ttl_s) < 0 ||
        sd_jv_int(&jv, section, "rotate_s", 0, 60, 365LL * 86400, &c.rotate_s) < 0)
        return -1;
    sd_cred_cfg = c;
    return 0;
}

/* ---------- base64url ---------- */

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* n bytes of p as unpadded base64url into out (cap >= 4n/3+2). */
static void b64url_encode(const unsigned char *p, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        out[o++] = b64url[v >> 18 & 63];
        out[o++] = b64url[v >> 12 & 63];
        if (i + 1 < n)
            out[o++] = b64url[v >> 6 & 63];
        if (i + 2 < n)
            out[o++] = b64url[v & 63];
    }
    out[o] = '\0';
}

static int b64url_val(char c)
{
    const char *p = c ? strchr(b64url, c) : NULL;
    return p ? (int)(p - b64url) : -1;
}

/* Decodes n characters of unpadded base64url into out (cap bytes): the length, or -1. */
static long b64url_decode(const char *s, size_t n, unsigned char *out, size_t cap)
{
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    if (n % 4 == 1)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int v = b64url_val(s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == cap)
                return -1;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return (long)o;
}

/* ---------- the keyring ---------- */

struct ckey {
    char kid[KID_LEN + 1];
    char priv[PEM_MAX];  /* PEM of the private key (signing) */
    EVP_PKEY *pk;        /* the key, parsed once, for verification (the ring owns it; a
                            verifier holds a reference of its own) */
    char x[48], y[48];   /* the point, base64url (JWKS) */
    int64_t created_ms, retired_ms, drop_ms;
};

static pthread_rwlock_t ring_mu = PTHREAD_RWLOCK_INITIALIZER;
static struct ckey ring[KEYS_MAX];
static int nring;
static int64_t ring_loaded_ms = -1;  /* sd_mono_ms of the last load; -1: never */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
/* OpenSSL 3's PEM decoding leaks a few bytes when two threads decode at once (a race in
 * its decoder setup, seen by valgrind in a busy it.outbox run): key loads and signatures,
 * which parse the PEM each time, decode one at a time. */
static pthread_mutex_t pem_mu = PTHREAD_MUTEX_INITIALIZER;

/* Parses k's private PEM into k->pk and its JWKS point. 0, or -1 (k->pk NULL) for a
 * PEM that is not a P-256 key. */
static int key_derive(struct ckey *k)
{
    int rc = -1;
    BIO *in = BIO_new_mem_buf(k->priv, -1);
    pthread_mutex_lock(&pem_mu);
    EVP_PKEY *pk = in ? PEM_read_bio_PrivateKey(in, NULL, NULL, NULL) : NULL;
    pthread_mutex_unlock(&pem_mu);
    BIGNUM *bx = NULL, *by = NULL;
    char curve[32];
    unsigned char bin[32];
    if (!pk || !EVP_PKEY_get_utf8_string_param(pk, OSSL_PKEY_PARAM_GROUP_NAME, curve,
                                               sizeof curve, NULL) ||
        strcmp(curve, "prime256v1") || !EVP_PKEY_get_bn_param(pk, OSSL_PKEY_PARAM_EC_PUB_X, &bx) ||
        !EVP_PKEY_get_bn_param(pk, OSSL_PKEY_PARAM_EC_PUB_Y, &by) ||
        BN_bn2binpad(bx, bin, 32) != 32)
        goto out;
    b64url_encode(bin, 32, k->x);
    if (BN_bn2binpad(by, bin, 32) != 32)
        goto out;
    b64url_encode(bin, 32, k->y);
    k->pk = pk;
    pk = NULL;
    rc = 0;
out:
    BN_free(bx);
    BN_free(by);
    EVP_PKEY_free(pk);
    BIO_free(in);
    return rc;
}

/* A fresh P-256 private key as PEM into pem (cap bytes). 0 or -1. */
static int key_generate(char *pem, size_t cap)
{
    int rc = -1;
    EVP_PKEY *pk = EVP_EC_gen("P-256");
    BIO *out = BIO_new(BIO_s_mem());
    char *p;
    long n;
    if (pk && out && PEM_write_bio_PrivateKey(out, pk, NULL, NULL, 0, NULL, NULL) &&
        (n = BIO_get_mem_data(out, &p)) > 0 && (size_t)n < cap) {
        memcpy(pem, p, (size_t)n);
        pem[n] = '\0';
        rc = 0;
    }
    EVP_PKEY_free(pk);
    BIO_free(out);
    return rc;
}

/* One keyring field (kid, "created retired drop\n<PEM>") into k. 0, or -1 when garbled. */
static int key_parse(const char *kid, const char *rec, struct ckey *k)
{
    long long c, r, d;
    int used = 0;
    memset(k, 0, sizeof *k);
    if (strlen(kid) != KID_LEN || sscanf(rec, "%lld %lld %lld\n%n", &c, &r, &d, &used) != 3 ||
        used == 0 || strlen(rec + used) >= sizeof k->priv)
        return -1;
    memcpy(k->kid, kid, KID_LEN + 1);
    strcpy(k->priv, rec + used);
    k->created_ms = c;
    k->retired_ms = r;
    k->drop_ms = d;
    return key_derive(k);
}

/* The keyring in a flat HGETALL reply into ring (under ring_mu). Keys that do not parse
 * are skipped, logged. Returns how many keys were taken. */
static int ring_take(const redisReply *r)
{
    struct ckey *fresh = calloc(KEYS_MAX, sizeof *fresh);
    int n = 0;
    if (!fresh)
        return -1;
    for (size_t i = 0; i + 1 < r->elements && n < KEYS_MAX; i += 2) {
        if (key_parse(sd_reply_str(r, i), sd_reply_str(r, i + 1), &fresh[n]) == 0)
            n++;
        else
            log_warn("keyring entry skipped", "kid=%s err=%s", sd_reply_str(r, i),
                     "not a P-256 key record");
    }
    pthread_rwlock_wrlock(&ring_mu);
    for (int i = 0; i < nring; i++)
        EVP_PKEY_free(ring[i].pk);
    memcpy(ring, fresh, sizeof ring);
    nring = n;
    ring_loaded_ms = sd_mono_ms();
    pthread_rwlock_unlock(&ring_mu);
    free(fresh);
    return n;
}

/* Whether key k is past its drop time (every credential it signed has expired): it
 * leaves the JWKS and verification at once, the keyring at the next rotation. */
static int key_dropped(const struct ckey *k, int64_t now_ms)
{
    return k->drop_ms > 0 && k->drop_ms <= now_ms;
}

/* Whether the ring (read under ring_mu) needs a new signing key by this copy's clock. */
static int rotation_due(void)
{
    int64_t newest = -1, now = sd_wall_ms();
    pthread_rwlock_rdlock(&ring_mu);
    for (int i = 0; i < nring; i++)
        if (!ring[i].retired_ms && ring[i].created_ms > newest)
            newest = ring[i].created_ms;
    pthread_rwlock_unlock(&ring_mu);
    return newest < 0 || newest + sd_cred_cfg.rotate_s * 1000 <= now;
}

static const char *ring_key(char *buf, size_t cap)
{
    snprintf(buf, cap, "%skeyring", sd_store_prefix());
    return buf;
}

/* keyring_rotate.lua with a fresh key: adds it when the keyring still needs it. */
static int ring_rotate(void)
{
    char kid[KID_LEN + 1], pem[PEM_MAX], key[128];
    if (sd_random_hex(kid, KID_LEN / 2) || key_generate(pem, sizeof pem)) {
        log_error("cannot make a signing key", "err=%s", "key generation failed");
        return SD_STORE_ERROR;
    }
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, ring_key(key, sizeof key));
    sd_argv_add(&a, kid);
    sd_argv_add(&a, pem);
    sd_argv_addf(&a, "%lld", (long long)sd_cred_cfg.rotate_s * 1000);
    /* a key retired now may have signed until this copy's next reload at the latest */
    sd_argv_addf(&a, "%lld", (long long)(sd_cred_cfg.ttl_s * 1000 + 2 * SD_CRED_RELOAD_MS));
    redisReply *r;
    int rc = sd_store_run("keyring_rotate", 1, &a, &r);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY) {
        log_error("keyring rotation failed", "err=%s", r->type == REDIS_REPLY_ERROR ? r->str : "odd reply");
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    ring_take(r);
    int taken = 0;
    for (size_t i = 0; i + 1 < r->elements && !taken; i += 2)
        taken = !strcmp(sd_reply_str(r, i), kid);
    freeReplyObject(r);
    if (taken) /* else another copy rotated first, or Redis's clock says not yet */
        log_info("keyring rotated: a new key signs", "kid=%s rotate_s=%lld", kid,
                 (long long)sd_cred_cfg.rotate_s);
    return SD_STORE_OK;
}

/* Reads the keyring from Redis, rotating when due. A SD_STORE_* code. */
static int ring_load(void)
{
    char key[128];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "HGETALL");
    sd_argv_add(&a, ring_key(key, sizeof key));
    redisReply *r;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ARRAY)
        ring_take(r);
    freeReplyObject(r);
    return rotation_due() ? ring_rotate() : SD_STORE_OK;
}

/* Makes the in-memory keyring fresh: loads it when never loaded, older than
 * SD_CRED_RELOAD_MS, or (force) older than RELOAD_MIN_MS. One thread loads; the others
 * go on with what is there (or wait, the first time). A SD_STORE_* code. */
static int ring_fresh(int force)
{
    pthread_rwlock_rdlock(&ring_mu);
    int64_t age = ring_loaded_ms < 0 ? INT64_MAX : sd_mono_ms() - ring_loaded_ms;
    int have = nring > 0;
    pthread_rwlock_unlock(&ring_mu);
    int due = age >= SD_CRED_RELOAD_MS ||
              (age >= RELOAD_MIN_MS && (force || rotation_due()));
    if (!due)
        return SD_STORE_OK;
    if (have && pthread_mutex_trylock(&load_mu))
        return SD_STORE_OK; /* another thread is loading it */
    if (!have)
        pthread_mutex_lock(&load_mu);
    int rc = ring_load();
    pthread_mutex_unlock(&load_mu);
    if (rc && have) {
        log_warn("keyring reload failed, the loaded one stays", "err=%d", rc);
        return SD_STORE_OK;
    }
    return rc;
}

/* ---------- issuance and the JWKS ---------- */

int sd_cred_issue(const sd_cred_id_t *id, char **jwt_out, char *kid, size_t kidcap,
                  int64_t *exp_ms)
{
    int rc = ring_fresh(0);
    if (rc)
        return rc;
    struct ckey k;
    int found = 0;
    pthread_rwlock_rdlock(&ring_mu);
    for (int i = 0; i < nring; i++)
        if (!ring[i].retired_ms && (!found || ring[i].created_ms > k.created_ms)) {
            k = ring[i];
            found = 1;
        }
    pthread_rwlock_unlock(&ring_mu);
    if (!found) {
        log_error("no signing key in the keyring", "key=%skeyring", sd_store_prefix());
        return SD_STORE_ERROR;
    }
    char sub[2 * SD_NAME_MAX + 2], jti[33];
    snprintf(sub, sizeof sub, "%s/%s", id->cluster, id->instance);
    if (sd_random_hex(jti, 16))
        return SD_STORE_ERROR;
    long now = (long)(sd_wall_ms() / 1000), exp = now + (long)sd_cred_cfg.ttl_s;
    jwt_t *j = NULL;
    char *out = NULL;
    int bad = jwt_new(&j) || jwt_add_header(j, "kid", k.kid) || jwt_add_grant(j, "iss", ISSUER) ||
        jwt_add_grant(j, "aud", AUDIENCE) || jwt_add_grant(j, "sub", sub) ||
        jwt_add_grant(j, "cluster", id->cluster) || jwt_add_grant(j, "machine", id->machine) ||
        jwt_add_grant(j, "service", id->service) || jwt_add_grant(j, "instance", id->instance) ||
        jwt_add_grant_int(j, "generation", (long)id->generation) ||
        jwt_add_grant_int(j, "iat", now) || jwt_add_grant_int(j, "exp", exp) ||
        jwt_add_grant(j, "jti", jti) ||
        jwt_set_alg(j, JWT_ALG_ES256, (const unsigned char *)k.priv, (int)strlen(k.priv));
    if (!bad) {
        pthread_mutex_lock(&pem_mu); /* jwt_encode_str decodes the PEM */
        out = jwt_encode_str(j);
        pthread_mutex_unlock(&pem_mu);
    }
    if (!out) {
        log_error("cannot sign a credential", "kid=%s err=%s", k.kid, strerror(errno));
        jwt_free(j);
        return SD_STORE_ERROR;
    }
    jwt_free(j);
    *jwt_out = out;
    snprintf(kid, kidcap, "%s", k.kid);
    *exp_ms = (int64_t)exp * 1000;
    return SD_STORE_OK;
}

int sd_cred_jwks(json_t **out)
{
    int rc = ring_fresh(0);
    if (rc)
        return rc;
    json_t *keys = json_array();
    int64_t now = sd_wall_ms();
    pthread_rwlock_rdlock(&ring_mu);
    for (int i = 0; i < nring; i++)
        if (!key_dropped(&ring[i], now))
            json_array_append_new(keys, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "kty",
                                                  "EC", "crv", "P-256", "x", ring[i].x, "y",
                                                  ring[i].y, "kid", ring[i].kid, "alg", "ES256",
                                                  "use", "sig"));
    pthread_rwlock_unlock(&ring_mu);
    *out = json_pack("{s:o}", "keys", keys);
    return SD_STORE_OK;
}

/* ---------- verification ---------- */

int sd_cred_shaped(const char *tok, size_t len)
{
    int dots = 0;
    if (len < 5 || len > SD_CRED_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (tok[i] == '.')
            dots++;
        else if (b64url_val(tok[i]) < 0)
            return 0;
    }
    return dots == 2 && tok[0] != '.';
}

struct centry {
    unsigned char sum[SHA256_DIGEST_LENGTH];
    int64_t exp_s; /* 0: empty */
    sd_cred_id_t id;
};

static struct centry cache[CACHE_SLOTS];
static pthread_mutex_t cache_mu[CACHE_STRIPES];
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_init(void)
{
    for (int i = 0; i < CACHE_STRIPES; i++)
        pthread_mutex_init(&cache_mu[i], NULL);
}

static size_t cache_slot(const unsigned char *sum)
{
    return ((size_t)sum[0] << 8 | sum[1]) % CACHE_SLOTS;
}

/* The cached claims of the credential whose SHA-256 is sum, when still valid at now_s. */
static int cache_get(const unsigned char *sum, int64_t now_s, sd_cred_id_t *id)
{
    size_t s = cache_slot(sum);
    int hit = 0;
    pthread_mutex_lock(&cache_mu[s % CACHE_STRIPES]);
    if (cache[s].exp_s > now_s && !memcmp(cache[s].sum, sum, sizeof cache[s].sum)) {
        *id = cache[s].id;
        hit = 1;
    }
    pthread_mutex_unlock(&cache_mu[s % CACHE_STRIPES]);
    return hit;
}

static void cache_put(const unsigned char *sum, int64_t exp_s, const sd_cred_id_t *id)
{
    size_t s = cache_slot(sum);
    pthread_mutex_lock(&cache_mu[s % CACHE_STRIPES]);
    memcpy(cache[s].sum, sum, sizeof cache[s].sum);
    cache[s].exp_s = exp_s;
    cache[s].id = *id;
    pthread_mutex_unlock(&cache_mu[s % CACHE_STRIPES]);
}

void sd_cred_cache_stats(size_t *used, size_t *cap)
{
    int64_t now = sd_wall_ms() / 1000;
    size_t n = 0;
    pthread_once(&cache_once, cache_init);
    for (size_t s = 0; s < CACHE_SLOTS; s++) {
        pthread_mutex_lock(&cache_mu[s % CACHE_STRIPES]);
        n += cache[s].exp_s > now;
        pthread_mutex_unlock(&cache_mu[s % CACHE_STRIPES]);
    }
    *used = n;
    *cap = CACHE_SLOTS;
}

/* The base64url part [p, p+n) decoded and parsed as a JSON object, or NULL. */
static json_t *part_json(const char *p, size_t n)
{
    unsigned char buf[SD_CRED_MAX];
    long len = b64url_decode(p, n, buf, sizeof buf);
    json_t *v = len > 0 ? json_loadb((const char *)buf, (size_t)len, JSON_REJECT_DUPLICATES, NULL)
                        : NULL;
    if (v && !json_is_object(v)) {
        json_decref(v);
        v = NULL;
    }
    return v;
}

/* Key kid with a reference of the caller's (EVP_PKEY_free it), reloading the keyring
 * once when kid is unknown; NULL when there is no such key. */
static EVP_PKEY *key_get(const char *kid)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        EVP_PKEY *pk = NULL;
        pthread_rwlock_rdlock(&ring_mu);
        for (int i = 0; i < nring && !pk; i++)
            if (!strcmp(ring[i].kid, kid) && !key_dropped(&ring[i], sd_wall_ms()) &&
                EVP_PKEY_up_ref(ring[i].pk))
                pk = ring[i].pk;
        pthread_rwlock_unlock(&ring_mu);
        if (pk)
            return pk;
        if (attempt == 0 && ring_fresh(1))
            return NULL;
    }
    return NULL;
}

/* Whether the JOSE ES256 signature (base64url of r || s, 32 bytes each) sig of sn
 * characters verifies the signing input [in, in+n) with pk. Verified with OpenSSL and
 * the key parsed once (libjwt 1.10.2 takes a PEM and parses it on every call, which
 * cost 5 times the verification itself). */
static int es256_verify(EVP_PKEY *pk, const char *in, size_t n, const char *sig, size_t sn)
{
    unsigned char rs[64], *der = NULL;
    if (b64url_decode(sig, sn, rs, sizeof rs) != 64)
        return 0;
    ECDSA_SIG *s = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(rs, 32, NULL), *ss = BN_bin2bn(rs + 32, 32, NULL);
    int ok = 0, derlen;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (s && r && ss && ECDSA_SIG_set0(s, r, ss)) {
        r = ss = NULL; /* s owns them now */
        ok = (derlen = i2d_ECDSA_SIG(s, &der)) > 0 && md &&
             EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, pk) == 1 &&
             EVP_DigestVerify(md, der, (size_t)derlen, (const unsigned char *)in, n) == 1;
    }
    BN_free(r);
    BN_free(ss);
    ECDSA_SIG_free(s);
    OPENSSL_free(der);
    EVP_MD_CTX_free(md);
    return ok;
}

/* A claim that must be a name into dst; 0 or -1. */
static int claim_name(const json_t *c, const char *k, char *dst)
{
    const char *s = json_string_value(json_object_get(c, k));
    if (!s || !sd_name_valid(s, SD_NAME_MAX))
        return -1;
    snprintf(dst, SD_NAME_MAX + 1, "%s", s);
    return 0;
}

/* The claims c into id and *exp_s: NULL, or why they are refused. */
static const char *claims_check(const json_t *c, int64_t now_s, sd_cred_id_t *id, int64_t *exp_s)
{
    const json_t *exp = json_object_get(c, "exp"), *gen = json_object_get(c, "generation");
    const char *iss = json_string_value(json_object_get(c, "iss"));
    const char *aud = json_string_value(json_object_get(c, "aud"));
    const char *sub = json_string_value(json_object_get(c, "sub"));
    char want[2 * SD_NAME_MAX + 2];
    if (!iss || strcmp(iss, ISSUER))
        return "the credential's issuer is not serverdir";
    if (!aud || strcmp(aud, AUDIENCE))
        return "the credential's audience is not serverdir";
    if (!json_is_integer(exp))
        return "the credential has no expiry";
    if (json_integer_value(exp) <= now_s)
        return "the credential has expired";
    if (!json_is_integer(gen) || json_integer_value(gen) < 0 ||
        claim_name(c, "cluster", id->cluster) || claim_name(c, "machine", id->machine) ||
        claim_name(c, "service", id->service) || claim_name(c, "instance", id->instance))
        return "the credential's claims do not name an instance";
    snprintf(want, sizeof want, "%s/%s", id->cluster, id->instance);
    if (!sub || strcmp(sub, want))
        return "the credential's subject does not match its cluster and instance";
    id->generation = json_integer_value(gen);
    *exp_s = json_integer_value(exp);
    return NULL;
}

const char *sd_cred_parse(const char *tok, size_t len, int64_t now_s, char *kid, size_t kidcap,
                          sd_cred_id_t *id, int64_t *exp_s)
{
    if (!sd_cred_shaped(tok, len))
        return "the credential is not a JWT";
    const char *d1 = memchr(tok, '.', len);
    const char *d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - tok));
    json_t *h = part_json(tok, (size_t)(d1 - tok));
    const char *alg = json_string_value(json_object_get(h, "alg"));
    const char *k = json_string_value(json_object_get(h, "kid"));
    const char *why = NULL;
    /* Only ES256 with a kid: never "none", and never an HMAC keyed with the public key. */
    if (!h || !alg || strcmp(alg, "ES256"))
        why = "the credential is not an ES256 JWT";
    else if (!k || strlen(k) != KID_LEN || strlen(k) >= kidcap)
        why = "the credential's signing key is not in the keyring";
    else
        memcpy(kid, k, KID_LEN + 1);
    json_decref(h);
    if (why)
        return why;
    json_t *c = part_json(d1 + 1, (size_t)(d2 - d1 - 1));
    why = c ? claims_check(c, now_s, id, exp_s) : "the credential's claims are not JSON";
    json_decref(c);
    return why;
}

/* The full check of a credential not in the cache: its header and claims (before any
 * key is used: garbage costs no ECDSA), then its signature with the key its kid names.
 * NULL, or why it is refused. */
static const char *verify_full(const char *tok, size_t len, int64_t now_s, sd_cred_id_t *id,
                               int64_t *exp_s)
{
    char kid[KID_LEN + 1];
    const char *why = sd_cred_parse(tok, len, now_s, kid, sizeof kid, id, exp_s);
    if (why)
        return why;
    const char *d2 = memrchr(tok, '.', len);
    EVP_PKEY *pk = key_get(kid);
    if (!pk)
        why = "the credential's signing key is not in the keyring";
    else if (!es256_verify(pk, tok, (size_t)(d2 - tok), d2 + 1, len - (size_t)(d2 + 1 - tok)))
        why = "the credential's signature does not verify";
    EVP_PKEY_free(pk);
    return why;
}

/* "instance:<cluster>/<instance>" into p (cap bytes); when the names are too long for
 * it, "instance:#" and 32 hex of their SHA-256, so two instances never share one. */
static void cred_principal(const sd_cred_id_t *id, char *p, size_t cap)
{
    char full[2 * SD_NAME_MAX + 2];
    size_t n = (size_t)snprintf(full, sizeof full, "%s/%s", id->cluster, id->instance);
    if (n + sizeof "instance:" <= cap) {
        memcpy(p, "instance:", 9);
        memcpy(p + 9, full, n + 1);
        return;
    }
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)full, n, md);
    memcpy(p, "instance:#", 10);
    for (int i = 0; i < 16 && 10 + 2 * i + 2 < (int)cap; i++)
        snprintf(p + 10 + 2 * i, 3, "%02x", md[i]);
}

unsigned sd_cred_verify(const char *tok, size_t len, sd_auth_t *out, const char **why)
{
    unsigned char sum[SHA256_DIGEST_LENGTH];
    int64_t now_s = sd_wall_ms() / 1000, exp_s = 0;
    sd_cred_id_t id;
    memset(out, 0, sizeof *out);
    *why = NULL;
    pthread_once(&cache_once, cache_init);
    SHA256((const unsigned char *)tok, len, sum);
    if (!cache_get(sum, now_s, &id)) {
        /* an expired one is refused before its signature costs anything */
        *why = verify_full(tok, len, now_s, &id, &exp_s);
        if (*why)
            return 0;
        SD_COUNT("serverdir_credentials_verified_total",
                 "credentials whose signature was checked (not found in the cache)", 1);
        cache_put(sum, exp_s, &id);
    }
    out->role = SD_R_GAME;
    out->cred = 1;
    memcpy(out->cluster, id.cluster, sizeof out->cluster);
    memcpy(out->machine, id.machine, sizeof out->machine);
    memcpy(out->service, id.service, sizeof out->service);
    memcpy(out->instance, id.instance, sizeof out->instance);
    out->generation = id.generation;
    cred_principal(&id, out->principal, sizeof out->principal);
    return SD_R_GAME;
}

/* ---------- liveness ---------- */

void sd_cred_revoked(sd_resp_t *resp, const char *why)
{
    SD_COUNT("serverdir_credentials_revoked_total",
             "requests refused: the credential's instance stopped, moved or restarted", 1);
    sd_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"serverdir\", error=\"invalid_token\"");
    sd_resp_error(resp, 401, "credential_revoked", "the credential is revoked: %s", why);
}

void sd_cred_live_args(const sd_auth_t *a, sd_argv_t *av)
{
    char key[2 * SD_NAME_MAX + 96];
    if (!a || !a->cred || sd_store_is_cluster()) {
        sd_argv_add(av, "");
        sd_argv_add(av, "");
        sd_argv_add(av, "");
        return;
    }
    sd_argv_addf(av, "%s", sd_key(key, sizeof key, a->cluster, "proc:%s", a->instance));
    sd_argv_add(av, a->machine);
    sd_argv_addf(av, "%lld", (long long)a->generation);
}

int sd_cred_revoked_reply(const redisReply *r, sd_resp_t *resp)
{
    if (!sd_reply_status_is(r, "credential_revoked"))
        return 0;
    sd_cred_revoked(resp, sd_reply_str(r, 1));
    return 1;
}

int sd_cred_record_read(const char *c, const char *i, sd_cred_id_t *id, char *state,
                        size_t cap)
{
    char key[2 * SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "HMGET");
    sd_argv_add(&av, sd_key(key, sizeof key, c, "proc:%s", i));
    sd_argv_add(&av, "state");
    sd_argv_add(&av, "machine");
    sd_argv_add(&av, "service");
    sd_argv_add(&av, "generation");
    redisReply *r;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc)
        return rc;
    sd_strlcpy(state, sd_reply_str(r, 0), cap);
    sd_strlcpy(id->machine, sd_reply_str(r, 1), sizeof id->machine);
    sd_strlcpy(id->service, sd_reply_str(r, 2), sizeof id->service);
    id->generation = sd_reply_num(r, 3);
    freeReplyObject(r);
    return SD_STORE_OK;
}

int sd_cred_check(const sd_auth_t *a, const char **why)
{
    *why = NULL;
    if (!a || !a->cred)
        return SD_STORE_OK;
    sd_cred_id_t rec = {0};
    char st[16];
    int rc = sd_cred_record_read(a->cluster, a->instance, &rec, st, sizeof st);
    if (rc)
        return rc;
    *why = !*st                               ? "the directory has no such instance"
           : !strcmp(st, "stopped")           ? "the instance stopped"
           : strcmp(rec.machine, a->machine)  ? "the instance is on another machine"
           : rec.generation != a->generation  ? "the instance runs another generation"
                                              : NULL;
    return SD_STORE_OK;
}

int sd_cred_live(const sd_req_t *req, sd_resp_t *resp)
{
    const char *why;
    int rc = sd_cred_check(&req->auth, &why);
    if (rc)
        sd_resp_store_error(resp, rc);
    else if (why)
        sd_cred_revoked(resp, why);
    return rc || why ? -1 : 0;
}
