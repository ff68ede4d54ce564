/* Unit tests of the token file (serverdir/http/auth.c): `ROLE TOKEN` lines with their
 * optional bindings (cluster=, machine=, holder_prefix=), the errors of each bad line,
 * the lookup (exact match only: no prefix, no longer token), and the binding checks the
 * handlers call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sd.h"

sd_config_t sd_cfg;

static long parse(const char *text, int *line, const char **why)
{
    char *t = strdup(text);
    long n = sd_auth_parse(t, line, why);
    free(t);
    return n;
}

static void good_files(void **state)
{
    int line = 0;
    const char *why = NULL;
    assert_int_equal(parse("# tokens\n"
                           "ops ops-token-0123456789\n"
                           "bigbrother bb-token-m1-0123456789 cluster=c1 machine=m1\n"
                           "\n"
                           "game game-token-0123456789\tcluster=c1\n"
                           "game game-token-zone-0123456 holder_prefix=zone-\r\n"
                           "game game-token-both-0123456 cluster=c1 holder_prefix=z\n"
                           "viewer viewer-token-c1-0123456 cluster=c1\n",
                           &line, &why),
                     6);
}

static void bad_lines(void **state)
{
    static const struct {
        const char *text;
        int line;
        const char *why;
    } bad[] = {
        {"ops short", 1, "shorter"},
        {"root root-token-0123456789", 1, "unknown role"},
        {"ops", 1, "expected"},
        {"ops ops-token-0123456789 machine=m1", 1, "bigbrother tokens only"},
        {"game game-token-0123456789 machine=m1", 1, "bigbrother tokens only"},
        {"bigbrother bb-token-0123456789 holder_prefix=x", 1, "game tokens only"},
        {"ops ops-token-0123456789 cluster=c1", 1, "cluster= binds"},
        {"bigbrother bb-token-0123456789 machine=m1", 1, "needs cluster="},
        {"bigbrother bb-token-0123456789 cluster=c1 cluster=c2", 1, "twice"},
        {"game game-token-0123456789 cluster=", 1, "must be a name"},
        {"game game-token-0123456789 cluster=a/b", 1, "must be a name"},
        {"game game-token-0123456789 region=eu", 1, "unknown binding"},
        {"game game-token-0123456789 extra", 1, "unknown binding"},
        {"# c\n\nops ops-token-0123456789\n\ngame g", 5, "shorter"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int line = 0;
        const char *why = NULL;
        assert_int_equal(parse(bad[i].text, &line, &why), -1);
        assert_int_equal(line, bad[i].line);
        assert_non_null(why);
        if (!strstr(why, bad[i].why))
            fail_msg("'%s': '%s' does not say '%s'", bad[i].text, why, bad[i].why);
    }
}

static void lookup_and_bindings(void **state)
{
    const char *path = h_write_file(h_tmpdir(), "tokens",
                                    "bigbrother bb-token-m1-0123456789 cluster=c1 machine=m1\n"
                                    "game game-token-zone-0123456 holder_prefix=zone-\n"
                                    "game game-token-c1-012345678 cluster=c1\n"
                                    "ops ops-token-0123456789\n",
                                    0600);
    assert_int_equal(sd_auth_load(path), 0);
    sd_req_t req;
    memset(&req, 0, sizeof req);
    const char *t = "bb-token-m1-0123456789";
    assert_int_equal(sd_auth_lookup(t, strlen(t), &req.auth), SD_R_BB);
    assert_string_equal(req.auth.cluster, "c1");
    assert_string_equal(req.auth.machine, "m1");
    /* Only the whole token: not a prefix of it, not a longer one, not with a NUL inside. */
    sd_auth_t a;
    assert_int_equal(sd_auth_lookup(t, strlen(t) - 1, &a), 0);
    assert_int_equal(sd_auth_lookup("bb-token-m1-01234567890", 23, &a), 0);
    assert_int_equal(sd_auth_lookup("bb-token-m1-0123456789\0x", 24, &a), 0);
    char big[400];
    memset(big, 'a', sizeof big);
    assert_int_equal(sd_auth_lookup(big, sizeof big, &a), 0);

    sd_resp_t resp;
    memset(&resp, 0, sizeof resp);
    assert_int_equal(sd_req_may_machine(&req, &resp, "c1", "m1"), 0);
    assert_int_equal(sd_req_may_machine(&req, &resp, "c1", "m2"), -1);
    assert_int_equal(resp.status, 403);
    assert_non_null(strstr(resp.body.data, "bound to machine 'm1' of cluster 'c1'"));
    sd_buf_free(&resp.body);
    memset(&resp, 0, sizeof resp);
    assert_int_equal(sd_req_may_cluster(&req, &resp, "c2"), -1);
    sd_buf_free(&resp.body);
    memset(&resp, 0, sizeof resp);
    assert_int_equal(sd_req_may_hold(&req, &resp, "anyone"), 0); /* no prefix binding */

    t = "game-token-zone-0123456";
    assert_int_equal(sd_auth_lookup(t, strlen(t), &req.auth), SD_R_GAME);
    assert_string_equal(sd_req_holder_prefix(&req), "zone-");
    assert_int_equal(sd_req_may_hold(&req, &resp, "zone-7"), 0);
    assert_int_equal(sd_req_may_hold(&req, &resp, "lobby-1"), -1);
    assert_non_null(strstr(resp.body.data, "bound to holders starting with 'zone-'"));
    sd_buf_free(&resp.body);
    memset(&resp, 0, sizeof resp);
    assert_int_equal(sd_req_may_cluster(&req, &resp, "any"), 0); /* no cluster binding */

    t = "ops-token-0123456789";
    assert_int_equal(sd_auth_lookup(t, strlen(t), &req.auth), SD_R_OPS);
    assert_int_equal(sd_req_may_machine(&req, &resp, "c9", "m9"), 0);
    assert_int_equal(sd_req_may_hold(&req, &resp, "x"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_files),
        cmocka_unit_test(bad_lines),
        cmocka_unit_test(lookup_and_bindings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
