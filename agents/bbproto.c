#include "bbproto.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

static int key_ok(const char *k, size_t n)
{
    if (n == 0 || n > BBPROTO_MAX_KEY)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = k[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

int bbproto_parse(const char *buf, size_t len, bbproto_field_t *out, int max)
{
    if (len > BBPROTO_MAX_MSG)
        return -E2BIG;
    if (len == 0)
        return 0;
    if (memchr(buf, '\0', len))
        return -EINVAL;
    int n = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *line = buf + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - line) : len - pos;
        pos += ll + (nl ? 1 : 0);
        if (ll == 0) {
            if (pos >= len)
                break; /* a trailing empty line is tolerated */
            return -EINVAL;
        }
        const char *eq = memchr(line, '=', ll);
        if (!eq)
            return -EINVAL;
        size_t kl = (size_t)(eq - line);
        if (!key_ok(line, kl))
            return -EINVAL;
        size_t vl = ll - kl - 1;
        if (vl > BBPROTO_MAX_VALUE)
            return -E2BIG;
        if (n >= max || n >= BBPROTO_MAX_FIELDS)
            return -E2BIG;
        out[n].key = line;
        out[n].klen = kl;
        out[n].val = eq + 1;
        out[n].vlen = vl;
        n++;
    }
    return n;
}

const char *bbproto_get(const bbproto_field_t *f, int n, const char *key, size_t *vlen)
{
    size_t kl = strlen(key);
    const char *v = NULL;
    for (int i = 0; i < n; i++) {
        if (f[i].klen == kl && memcmp(f[i].key, key, kl) == 0) {
            v = f[i].val;
            if (vlen)
                *vlen = f[i].vlen;
        }
    }
    return v;
}

int bbproto_get_int(const bbproto_field_t *f, int n, const char *key, long long min,
                    long long max, long long *out)
{
    size_t vl = 0;
    const char *v = bbproto_get(f, n, key, &vl);
    if (!v)
        return -ENOENT;
    if (vl == 0 || vl > 20)
        return -EINVAL;
    size_t i = 0;
    int neg = 0;
    if (v[0] == '-') {
        neg = 1;
        i = 1;
        if (vl == 1)
            return -EINVAL;
    }
    /* Accumulated as a negative number: its range includes LLONG_MIN, and an overflow
     * is caught before it happens instead of being undefined behaviour. */
    long long x = 0;
    for (; i < vl; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -EINVAL;
        int d = v[i] - '0';
        if (x < (LLONG_MIN + d) / 10)
            return -EINVAL;
        x = x * 10 - d;
    }
    if (!neg) {
        if (x == LLONG_MIN)
            return -EINVAL;
        x = -x;
    }
    if (x < min || x > max)
        return -EINVAL;
    *out = x;
    return 0;
}

int bbproto_put(char *buf, size_t cap, size_t len, const char *key, const char *val)
{
    size_t kl = strlen(key), vl = strlen(val);
    if (!key_ok(key, kl) || memchr(val, '\n', vl))
        return -EINVAL;
    if (vl > BBPROTO_MAX_VALUE)
        return -E2BIG;
    if (len > cap || kl + vl + 2 > cap - len)
        return -E2BIG;
    memcpy(buf + len, key, kl);
    buf[len + kl] = '=';
    memcpy(buf + len + kl + 1, val, vl);
    buf[len + kl + 1 + vl] = '\n';
    return (int)(len + kl + vl + 2);
}

#define CRED_PREFIX "CREDENTIAL="
#define CRED_PREFIX_LEN (sizeof CRED_PREFIX - 1)

/* A JWS in compact form: three non-empty base64url parts joined by two dots. */
static int jws_ok(const char *s, size_t n)
{
    if (n == 0 || n > BBPROTO_CREDENTIAL_MAX)
        return 0;
    int dots = 0;
    size_t part = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '.') {
            if (part == 0)
                return 0;
            dots++;
            part = 0;
        } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_') {
            part++;
        } else {
            return 0;
        }
    }
    return dots == 2 && part > 0;
}

int bbproto_credential_parse(const char *buf, size_t len, const char **jwt, size_t *jlen)
{
    if (len < CRED_PREFIX_LEN || memcmp(buf, CRED_PREFIX, CRED_PREFIX_LEN) != 0)
        return -ENOENT;
    if (len > BBPROTO_MAX_FRAME)
        return -E2BIG;
    size_t n = len - CRED_PREFIX_LEN;
    if (n > 0 && buf[len - 1] == '\n')
        n--;
    if (n > BBPROTO_CREDENTIAL_MAX)
        return -E2BIG;
    if (!jws_ok(buf + CRED_PREFIX_LEN, n))
        return -EINVAL;
    *jwt = buf + CRED_PREFIX_LEN;
    *jlen = n;
    return 0;
}

int bbproto_credential_put(char *buf, size_t cap, const char *jwt, size_t jlen)
{
    if (!jws_ok(jwt, jlen))
        return -EINVAL;
    if (CRED_PREFIX_LEN + jlen + 1 > cap)
        return -E2BIG;
    memcpy(buf, CRED_PREFIX, CRED_PREFIX_LEN);
    memcpy(buf + CRED_PREFIX_LEN, jwt, jlen);
    buf[CRED_PREFIX_LEN + jlen] = '\n';
    return (int)(CRED_PREFIX_LEN + jlen + 1);
}
