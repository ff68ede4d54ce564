/* http/cred.c without Redis: the "credentials" config section (bounds, unknown fields,
 * all or nothing), which bearer values count as credentials, and the refusals decided
 * before any key is needed (alg none, HMAC, garbage). The signed paths run against a
 * real Redis in it.credential. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cred.h"

static int load(const char *text, char *err, size_t cap)
{
    json_t *v = json_loads(text, 0, NULL);
    assert_non_null(v);
    int rc = sd_cred_config_load(v, err, cap);
    json_decref(v);
    return rc;
}

static void config_section(void **state)
{
    (void)state;
    char err[256];
    sd_cred_cfg_t d = sd_cred_cfg;
    assert_int_equal(d.ttl_s, 3600);
    assert_int_equal(d.rotate_s, 86400);
    assert_int_equal(sd_cred_config_load(NULL, err, sizeof err), 0);
    assert_int_equal(load("{\"ttl_s\": 600, \"rotate_s\": 3600}", err, sizeof err), 0);
    assert_int_equal(sd_cred_cfg.ttl_s, 600);
    assert_int_equal(sd_cred_cfg.rotate_s, 3600);
    static const char *const bad[] = {
        "{\"ttl_s\": 59}", "{\"ttl_s\": 604801}", "{\"rotate_s\": 1}", "{\"ttl\": 60}",
        "{\"ttl_s\": \"60\"}", "[]", "{\"ttl_s\": 120, \"rotate_s\": 0}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(load(bad[i], err, sizeof err), -1);
        assert_true(err[0] != '\0');
        /* all or nothing: the last good values stay */
        assert_int_equal(sd_cred_cfg.ttl_s, 600);
        assert_int_equal(sd_cred_cfg.rotate_s, 3600);
    }
    sd_cred_cfg = d;
}

static void jwt_shape(void **state)
{
    (void)state;
    static const char *const yes[] = {"a.b.c", "eyJh.eyJz.", "aGk.aGk.c2ln-_"};
    static const char *const no[] = {"game-token-0123456789", "a.b", "a.b.c.d", ".b.c",
                                     "a.b.c=", "a b.c.d", ""};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        assert_true(sd_cred_shaped(yes[i], strlen(yes[i])));
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_false(sd_cred_shaped(no[i], strlen(no[i])));
    char big[SD_CRED_MAX + 8];
    memset(big, 'a', sizeof big);
    big[10] = big[20] = '.';
    assert_false(sd_cred_shaped(big, sizeof big));
}

/* Refused before any key is looked up: the header must say ES256. */
static void refused_without_a_key(void **state)
{
    (void)state;
    sd_auth_t a;
    const char *why;
    /* {"alg":"none"}.{"sub":"x"}. and {"alg":"HS256","kid":"0123456789abcdef"} */
    static const char *const toks[] = {
        "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
        "eyJhbGciOiJIUzI1NiIsImtpZCI6IjAxMjM0NTY3ODlhYmNkZWYifQ.eyJzdWIiOiJ4In0.c2ln",
        "bm90LWpzb24.eyJzdWIiOiJ4In0.c2ln",
    };
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        memset(&a, 0x55, sizeof a);
        assert_int_equal(sd_cred_verify(toks[i], strlen(toks[i]), &a, &why), 0);
        assert_non_null(why);
        assert_non_null(strstr(why, "ES256"));
        assert_int_equal(a.role, 0);
        assert_int_equal(a.cred, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_section),
        cmocka_unit_test(jwt_shape),
        cmocka_unit_test(refused_without_a_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
