/* libFuzzer target: the agent wire-protocol parser (every agent packet and sd_notify
 * datagram bigbrother reads goes through it). Checks the parser's promises on any input:
 * fields point inside the input, keys and values respect the limits, and what
 * bbproto_put writes back from the fields parses to the same fields. The CREDENTIAL frame
 * parser (libbbagent reads it from bigbrother) too: a JWT it accepts lies inside the
 * input, is at most BBPROTO_CREDENTIAL_MAX bytes of base64url and dots, and is written
 * back by bbproto_credential_put to a frame that parses to the same JWT. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bbproto.h"

static int key_ok(const char *k, size_t n)
{
    if (n == 0 || n > BBPROTO_MAX_KEY)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '_'))
            return 0;
    return 1;
}

static void credential_check(const char *buf, size_t size)
{
    const char *jwt;
    size_t jlen;
    int rc = bbproto_credential_parse(buf, size, &jwt, &jlen);
    if (rc == -ENOENT || rc == -EINVAL || rc == -E2BIG)
        return;
    if (rc != 0 || jwt < buf || jwt + jlen > buf + size || jlen == 0 ||
        jlen > BBPROTO_CREDENTIAL_MAX)
        __builtin_trap();
    for (size_t i = 0; i < jlen; i++) {
        char c = jwt[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            __builtin_trap();
    }
    static char frame[BBPROTO_MAX_FRAME];
    int n = bbproto_credential_put(frame, sizeof frame, jwt, jlen);
    const char *j2;
    size_t l2;
    if (n < 0 || bbproto_credential_parse(frame, (size_t)n, &j2, &l2) != 0 || l2 != jlen ||
        memcmp(j2, jwt, jlen))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    credential_check(buf, size);
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    int n = bbproto_parse(buf, size, f, BBPROTO_MAX_FIELDS);
    if (n < 0)
        return 0;
    if (n > BBPROTO_MAX_FIELDS || size > BBPROTO_MAX_MSG)
        __builtin_trap();

    static char out[BBPROTO_MAX_MSG * 2];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (f[i].key < buf || f[i].val + f[i].vlen > buf + size || !key_ok(f[i].key, f[i].klen) ||
            f[i].vlen > BBPROTO_MAX_VALUE || memchr(f[i].val, '\n', f[i].vlen))
            __builtin_trap();
        char key[BBPROTO_MAX_KEY + 1], val[BBPROTO_MAX_VALUE + 1];
        memcpy(key, f[i].key, f[i].klen);
        key[f[i].klen] = '\0';
        memcpy(val, f[i].val, f[i].vlen);
        val[f[i].vlen] = '\0';
        long long v;
        int r = bbproto_get_int(f, n, key, -1000000, 1000000, &v);
        if (r != 0 && r != -EINVAL)
            __builtin_trap();
        if (!bbproto_get(f, n, key, NULL))
            __builtin_trap();
        int w = bbproto_put(out, sizeof out, len, key, val);
        if (w < 0)
            __builtin_trap();
        len = (size_t)w;
    }

    /* The re-written message is the canonical form: it parses to the same fields. */
    bbproto_field_t g[BBPROTO_MAX_FIELDS];
    if (len > BBPROTO_MAX_MSG)
        return 0; /* a "\n"-less input can grow by the trailing newlines */
    if (bbproto_parse(out, len, g, BBPROTO_MAX_FIELDS) != n)
        __builtin_trap();
    for (int i = 0; i < n; i++)
        if (g[i].klen != f[i].klen || g[i].vlen != f[i].vlen ||
            memcmp(g[i].key, f[i].key, f[i].klen) || memcmp(g[i].val, f[i].val, f[i].vlen))
            __builtin_trap();
    return 0;
}
