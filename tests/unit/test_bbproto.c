/* The agent wire-protocol parser and writer (agents/bbproto.c): valid messages, every
 * malformed case, the limits, integer values and bbproto_put. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "bbproto.h"

static int parse(const char *s, bbproto_field_t *f)
{
    return bbproto_parse(s, strlen(s), f, BBPROTO_MAX_FIELDS);
}

static void assert_field(const bbproto_field_t *f, const char *k, const char *v)
{
    assert_int_equal(f->klen, strlen(k));
    assert_memory_equal(f->key, k, f->klen);
    assert_int_equal(f->vlen, strlen(v));
    assert_memory_equal(f->val, v, f->vlen);
}

static void valid_messages(void **state)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    assert_int_equal(parse("HELLO=1\nINSTANCE=zone-m1-3\nPROTO=1", f), 3);
    assert_field(&f[0], "HELLO", "1");
    assert_field(&f[1], "INSTANCE", "zone-m1-3");
    assert_field(&f[2], "PROTO", "1");

    /* Empty values, '=' inside a value, spaces kept as they are. */
    assert_int_equal(parse("STATUS=\nX=a=b\nS=two words ", f), 3);
    assert_field(&f[0], "STATUS", "");
    assert_field(&f[1], "X", "a=b");
    assert_field(&f[2], "S", "two words ");

    /* CR is no line end: it stays in the value (sd_notify does the same). */
    assert_int_equal(parse("A=1\r\nB=2", f), 2);
    assert_field(&f[0], "A", "1\r");

    /* An empty message carries nothing. */
    assert_int_equal(bbproto_parse("", 0, f, BBPROTO_MAX_FIELDS), 0);
}

static void trailing_newline(void **state)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    assert_int_equal(parse("READY=1\n", f), 1);
    assert_field(&f[0], "READY", "1");
    assert_int_equal(parse("READY=1\nSTATUS=up\n", f), 2);
    assert_field(&f[1], "STATUS", "up");
    assert_int_equal(parse("\n", f), 0);
    /* One empty line at the end is the optional trailing newline of a "\n"-ended last
     * line; it is tolerated. */
    assert_int_equal(parse("READY=1\n\n", f), 1);
}

static void malformed(void **state)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    static const char *bad[] = {
        "READY",            /* no '=' */
        "=1",               /* empty key */
        "ready=1",          /* lowercase key */
        "RE-ADY=1",         /* '-' not allowed in a key */
        "RE ADY=1",         /* space in the key */
        " READY=1",         /* leading space */
        "READY=1\n\nX=1",   /* empty line in the middle */
        "\nREADY=1",        /* empty first line */
        "READY=1\nnokey",   /* second line bad */
        "READY=1\n\n\n",    /* more than one trailing newline */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int r = parse(bad[i], f);
        if (r != -EINVAL)
            fail_msg("case %zu (%s): got %d, want -EINVAL", i, bad[i], r);
    }
    /* A NUL byte anywhere. */
    static const char nul[] = "READY=1\nX=a\0b";
    assert_int_equal(bbproto_parse(nul, sizeof nul - 1, f, BBPROTO_MAX_FIELDS), -EINVAL);
    static const char nulkey[] = "RE\0DY=1";
    assert_int_equal(bbproto_parse(nulkey, sizeof nulkey - 1, f, BBPROTO_MAX_FIELDS), -EINVAL);
}

static void limits(void **state)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS + 1];
    char buf[BBPROTO_MAX_MSG + 64];

    /* Key: 32 characters fine, 33 not. */
    memset(buf, 'K', BBPROTO_MAX_KEY);
    strcpy(buf + BBPROTO_MAX_KEY, "=v");
    assert_int_equal(parse(buf, f), 1);
    memset(buf, 'K', BBPROTO_MAX_KEY + 1);
    strcpy(buf + BBPROTO_MAX_KEY + 1, "=v");
    assert_int_equal(parse(buf, f), -EINVAL);

    /* Value: 1024 bytes fine, 1025 too big. */
    strcpy(buf, "S=");
    memset(buf + 2, 'v', BBPROTO_MAX_VALUE);
    buf[2 + BBPROTO_MAX_VALUE] = '\0';
    assert_int_equal(parse(buf, f), 1);
    assert_int_equal(f[0].vlen, BBPROTO_MAX_VALUE);
    memset(buf + 2, 'v', BBPROTO_MAX_VALUE + 1);
    buf[3 + BBPROTO_MAX_VALUE] = '\0';
    assert_int_equal(parse(buf, f), -E2BIG);

    /* Field count: 32 fine, 33 too many; the caller's max is honoured too. */
    size_t len = 0;
    for (int i = 0; i < BBPROTO_MAX_FIELDS; i++)
        len += (size_t)sprintf(buf + len, "K%d=%d\n", i, i);
    assert_int_equal(bbproto_parse(buf, len, f, BBPROTO_MAX_FIELDS + 1), BBPROTO_MAX_FIELDS);
    assert_int_equal(bbproto_parse(buf, len, f, 3), -E2BIG);
    len += (size_t)sprintf(buf + len, "K99=1\n");
    assert_int_equal(bbproto_parse(buf, len, f, BBPROTO_MAX_FIELDS + 1), -E2BIG);

    /* Message: 4096 bytes fine (the size check comes first), 4097 too big. */
    memset(buf, 'v', sizeof buf);
    memcpy(buf, "A=", 2);
    for (size_t i = 1000; i < BBPROTO_MAX_MSG; i += 1000)
        memcpy(buf + i, "\nA=", 3);
    assert_int_equal(bbproto_parse(buf, BBPROTO_MAX_MSG, f, BBPROTO_MAX_FIELDS), 5);
    assert_int_equal(bbproto_parse(buf, BBPROTO_MAX_MSG + 1, f, BBPROTO_MAX_FIELDS), -E2BIG);
}

static void get_and_ints(void **state)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    const char *m = "SHUTDOWN=1\nGRACE_MS=5000\nGRACE_MS=7000\nNEG=-12\nBIG=9223372036854775807\n"
                    "OVER=9223372036854775808\nMIN=-9223372036854775808\nUNDER=-9223372036854775809\n"
                    "HUGE=123456789012345678901\nX=12a\nE=\nM=-\nP=+5\n";
    int n = parse(m, f);
    assert_int_equal(n, 13);
    size_t vl;
    const char *v = bbproto_get(f, n, "GRACE_MS", &vl);
    assert_non_null(v);
    assert_int_equal(vl, 4);
    assert_memory_equal(v, "7000", 4); /* the last one wins */
    assert_null(bbproto_get(f, n, "GRACE", NULL));
    assert_null(bbproto_get(f, n, "SHUTDOWNX", NULL));

    long long x = 42;
    assert_int_equal(bbproto_get_int(f, n, "GRACE_MS", 0, 100000, &x), 0);
    assert_int_equal(x, 7000);
    assert_int_equal(bbproto_get_int(f, n, "GRACE_MS", 0, 6999, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "NEG", -100, 100, &x), 0);
    assert_int_equal(x, -12);
    assert_int_equal(bbproto_get_int(f, n, "NEG", 0, 100, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "BIG", 0, LLONG_MAX, &x), 0);
    assert_true(x == LLONG_MAX);
    assert_int_equal(bbproto_get_int(f, n, "MIN", LLONG_MIN, 0, &x), 0);
    assert_true(x == LLONG_MIN);
    /* Out of range of long long: rejected, never wrapped around. */
    assert_int_equal(bbproto_get_int(f, n, "OVER", LLONG_MIN, LLONG_MAX, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "UNDER", LLONG_MIN, LLONG_MAX, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "HUGE", LLONG_MIN, LLONG_MAX, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "X", 0, 1000, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "E", 0, 1000, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "M", -10, 1000, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "P", 0, 1000, &x), -EINVAL);
    assert_int_equal(bbproto_get_int(f, n, "ABSENT", 0, 1000, &x), -ENOENT);
    assert_true(x == LLONG_MIN); /* failures leave *out alone */
}

static void put(void **state)
{
    char buf[64];
    int n = bbproto_put(buf, sizeof buf, 0, "HELLO", "1");
    assert_int_equal(n, 8);
    n = bbproto_put(buf, sizeof buf, (size_t)n, "INSTANCE", "zone-1");
    assert_int_equal(n, 24);
    assert_memory_equal(buf, "HELLO=1\nINSTANCE=zone-1\n", 24);

    /* What put writes, parse reads back. */
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    assert_int_equal(bbproto_parse(buf, (size_t)n, f, BBPROTO_MAX_FIELDS), 2);
    assert_field(&f[1], "INSTANCE", "zone-1");

    /* Exactly full, then one byte short: nothing written past cap. */
    char small[8];
    memset(small, 'x', sizeof small);
    assert_int_equal(bbproto_put(small, 8, 0, "AB", "cdef"), 8);
    assert_memory_equal(small, "AB=cdef\n", 8);
    assert_int_equal(bbproto_put(small, 7, 0, "AB", "cdef"), -E2BIG);
    assert_int_equal(bbproto_put(small, 8, 9, "A", ""), -E2BIG); /* len > cap */

    assert_int_equal(bbproto_put(buf, sizeof buf, 0, "bad", "1"), -EINVAL);
    assert_int_equal(bbproto_put(buf, sizeof buf, 0, "", "1"), -EINVAL);
    assert_int_equal(bbproto_put(buf, sizeof buf, 0, "K", "two\nlines"), -EINVAL);

    char big[BBPROTO_MAX_VALUE + 2];
    memset(big, 'v', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char out[BBPROTO_MAX_MSG];
    assert_int_equal(bbproto_put(out, sizeof out, 0, "S", big), -E2BIG);
    big[BBPROTO_MAX_VALUE] = '\0';
    assert_int_equal(bbproto_put(out, sizeof out, 0, "S", big), BBPROTO_MAX_VALUE + 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_messages), cmocka_unit_test(trailing_newline),
        cmocka_unit_test(malformed),      cmocka_unit_test(limits),
        cmocka_unit_test(get_and_ints),   cmocka_unit_test(put),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
