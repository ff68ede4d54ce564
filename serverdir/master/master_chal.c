/* Stateless master-list challenges (docs/master.md, "Challenges").
 *
 * A challenge costs no state anywhere until a server answers it: it is an HMAC-SHA256,
 * under a secret every serverdir copy shares, of what it is bound to (the REST caller's
 * IP, or the UDP server's "ip:port") and when it was issued. Any copy can check an answer
 * by computing it again; a spoofed source never sees the challenge, and a forged one
 * needs the secret. The secret lives in Redis (P key, master_key.lua), drawn by the first
 * copy that finds none and rotated every master.challenge_key_rotate_s; the previous one
 * still verifies, so a rotation never fails an outstanding challenge.
 *
 * Forms:
 *   'r' REST, 'q' Quake III / DarkPlaces: 32 hex digits: the issue time in 16 ms units
 *       (8 digits, wrapping every 2.2 years), a 32-bit nonce (so two challenges for one
 *       address are never the same, which single use needs), then 64 bits of the MAC
 *       over both. The time makes expiry exact and tells an expired challenge from a
 *       forged one.
 *   GoldSrc: the protocol has 32 bits, all of them MAC, over the time bucket
 *       now / challenge_ttl_ms; the current and the previous bucket are accepted.
 * Single use is the listed entry's: its record keeps the last challenge it answered
 * (master_heartbeat.lua refuses it a second time).
 *
 * The MAC is HMAC-SHA256 built on OpenSSL's digest with the key's inner and outer pads
 * hashed once per key and copied per call (0.15 us instead of 1 us for HMAC()). */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "master.h"
#include "sd.h"

#define KEY_LEN 32

static pthread_mutex_t key_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t key_cur[KEY_LEN], key_prev[KEY_LEN];
static int key_loaded;
static uint64_t key_gen;

/* Each thread's pads, hashed from the keys of generation tl->gen. */
struct tl_mac {
    uint64_t gen;
    EVP_MD_CTX *in[2], *out[2], *work;
};
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256;

static void tl_free(void *p)
{
    struct tl_mac *t = p;
    for (int i = 0; i < 2; i++) {
        EVP_MD_CTX_free(t->in[i]);
        EVP_MD_CTX_free(t->out[i]);
    }
    EVP_MD_CTX_free(t->work);
    free(t);
}

static void tl_init(void)
{
    pthread_key_create(&tl_key, tl_free);
    sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static void pad_ctx(EVP_MD_CTX *c, const uint8_t *key, uint8_t x)
{
    uint8_t pad[64];
    for (int i = 0; i < 64; i++)
        pad[i] = (uint8_t)((i < KEY_LEN ? key[i] : 0) ^ x);
    EVP_DigestInit_ex(c, sha256, NULL);
    EVP_DigestUpdate(c, pad, sizeof pad);
}

/* The calling thread's MAC state for the current keys; NULL before a key is loaded. */
static struct tl_mac *tl_get(void)
{
    pthread_once(&tl_once, tl_init);
    if (!sha256)
        return NULL;
    struct tl_mac *t = pthread_getspecific(tl_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t)
            return NULL;
        for (int i = 0; i < 2; i++) {
            t->in[i] = EVP_MD_CTX_new();
            t->out[i] = EVP_MD_CTX_new();
        }
        t->work = EVP_MD_CTX_new();
        if (!t->in[0] || !t->in[1] || !t->out[0] || !t->out[1] || !t->work) {
            tl_free(t);
            return NULL;
        }
        pthread_setspecific(tl_key, t);
    }
    pthread_mutex_lock(&key_mu);
    int ok = key_loaded;
    if (ok && t->gen != key_gen) {
        pad_ctx(t->in[0], key_cur, 0x36);
        pad_ctx(t->out[0], key_cur, 0x5c);
        pad_ctx(t->in[1], key_prev, 0x36);
        pad_ctx(t->out[1], key_prev, 0x5c);
        t->gen = key_gen;
    }
    pthread_mutex_unlock(&key_mu);
    return ok ? t : NULL;
}

/* HMAC-SHA256 with key `which` (0 current, 1 previous) of kind, bind and t. */
static void mac(struct tl_mac *t, int which, char kind, const char *bind, uint64_t tv,
                uint8_t out[32])
{
    uint8_t msg[8];
    for (int i = 0; i < 8; i++)
        msg[i] = (uint8_t)(tv >> (56 - 8 * i));
    unsigned int len;
    EVP_MD_CTX_copy_ex(t->work, t->in[which]);
    EVP_DigestUpdate(t->work, &kind, 1);
    EVP_DigestUpdate(t->work, bind, strlen(bind) + 1);
    EVP_DigestUpdate(t->work, msg, sizeof msg);
    EVP_DigestFinal_ex(t->work, out, &len);
    EVP_MD_CTX_copy_ex(t->work, t->out[which]);
    EVP_DigestUpdate(t->work, out, 32);
    EVP_DigestFinal_ex(t->work, out, &len);
}

int sd_master_key_set(const char *cur_hex, const char *prev_hex)
{
    uint8_t k[KEY_LEN], p[KEY_LEN];
    if (strlen(cur_hex) != 2 * KEY_LEN || strlen(prev_hex) != 2 * KEY_LEN)
        return -1;
    for (int i = 0; i < KEY_LEN; i++) {
        unsigned a, b;
        if (sscanf(cur_hex + 2 * i, "%2x", &a) != 1 || sscanf(prev_hex + 2 * i, "%2x", &b) != 1)
            return -1;
        k[i] = (uint8_t)a;
        p[i] = (uint8_t)b;
    }
    pthread_mutex_lock(&key_mu);
    if (!key_loaded || memcmp(k, key_cur, KEY_LEN) || memcmp(p, key_prev, KEY_LEN)) {
        memcpy(key_cur, k, KEY_LEN);
        memcpy(key_prev, p, KEY_LEN);
        key_gen++;
        key_loaded = 1;
    }
    pthread_mutex_unlock(&key_mu);
    return 0;
}

int sd_master_key_ready(void)
{
    pthread_mutex_lock(&key_mu);
    int ok = key_loaded;
    pthread_mutex_unlock(&key_mu);
    return ok;
}

static const char hexd[] = "0123456789abcdef";

/* A per-thread xorshift nonce, seeded from getrandom: unique enough (the MAC, not the
 * nonce, is what cannot be guessed). */
static uint32_t nonce(void)
{
    static _Thread_local uint64_t x;
    while (!x) {
        char hex[17];
        if (sd_random_hex(hex, 8))
            x = (uint64_t)sd_mono_us() | 1;
        else
            x = strtoull(hex, NULL, 16);
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return (uint32_t)(x >> 16);
}

int sd_master_chal_make(char kind, const char *bind, char *out, size_t cap)
{
    struct tl_mac *t = tl_get();
    if (!t || cap < 33)
        return -1;
    uint64_t tv = (uint64_t)(uint32_t)((uint64_t)sd_wall_ms() >> 4) << 32 | nonce();
    uint8_t m[32];
    mac(t, 0, kind, bind, tv, m);
    for (int i = 0; i < 8; i++) {
        uint8_t b = (uint8_t)(tv >> (56 - 8 * i));
        out[2 * i] = hexd[b >> 4];
        out[2 * i + 1] = hexd[b & 15];
    }
    for (int i = 0; i < 8; i++) {
        out[16 + 2 * i] = hexd[m[i] >> 4];
        out[16 + 2 * i + 1] = hexd[m[i] & 15];
    }
    out[32] = '\0';
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Constant-time comparison of the 8 MAC bytes. */
static int mac_eq(const uint8_t *m, const uint8_t *want)
{
    uint8_t d = 0;
    for (int i = 0; i < 8; i++)
        d |= (uint8_t)(m[i] ^ want[i]);
    return d == 0;
}

const char *sd_master_chal_check(char kind, const char *bind, const char *chal)
{
    if (strlen(chal) != 32)
        return "unknown_challenge";
    uint8_t raw[16];
    for (int i = 0; i < 16; i++) {
        int hi = hexval(chal[2 * i]), lo = hexval(chal[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return "unknown_challenge";
        raw[i] = (uint8_t)(hi << 4 | lo);
    }
    struct tl_mac *t = tl_get();
    if (!t)
        return "no_key";
    uint64_t tv = 0;
    for (int i = 0; i < 8; i++)
        tv = tv << 8 | raw[i];
    int ok = 0;
    for (int which = 0; which < 2 && !ok; which++) {
        uint8_t m[32];
        mac(t, which, kind, bind, tv, m);
        ok = mac_eq(m, raw + 8);
    }
    if (!ok)
        return "unknown_challenge";
    /* Age in 16 ms units, signed: a copy whose clock is a little behind the issuer's sees
     * a challenge from the near future (up to 2 s is allowed). */
    int32_t age = (int32_t)((uint32_t)((uint64_t)sd_wall_ms() >> 4) - (uint32_t)(tv >> 32));
    if (age < -125 || (int64_t)age * 16 > sd_master_cfg.challenge_ttl_ms)
        return "challenge_expired";
    return NULL;
}

static uint32_t chal_u32(struct tl_mac *t, int which, const char *bind, int64_t bucket)
{
    uint8_t m[32];
    mac(t, which, 'g', bind, (uint64_t)bucket, m);
    uint32_t c = (uint32_t)m[0] | (uint32_t)m[1] << 8 | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 24;
    return c ? c : 1;
}

int sd_master_chal_make_u32(const char *bind, uint32_t *out)
{
    struct tl_mac *t = tl_get();
    if (!t)
        return -1;
    *out = chal_u32(t, 0, bind, sd_wall_ms() / sd_master_cfg.challenge_ttl_ms);
    return 0;
}

const char *sd_master_chal_check_u32(const char *bind, uint32_t c)
{
    struct tl_mac *t = tl_get();
    if (!t)
        return "no_key";
    int64_t bucket = sd_wall_ms() / sd_master_cfg.challenge_ttl_ms;
    uint32_t d = 1;
    for (int which = 0; which < 2; which++)
        for (int64_t b = bucket; b >= bucket - 1; b--)
            d &= (chal_u32(t, which, bind, b) != c);
    return d ? "unknown_challenge" : NULL;
}
