/* gameproc's UDP query protocol (gameproc_core, gp_query_answer), byte for byte: the
 * Quake III challenge echo that master servers check, the cases that get no reply, and
 * the Valve A2S challenge round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "gpquery.h"

static struct sockaddr_storage from;
static uint8_t out[GP_REPLY_MAX];
static gp_query_info_t info = {
    .name = "unit", .map = "q3dm17", .game = "gameproc", .players = 3, .max_players = 8,
    .port = 27960, .a2s_secret = 99,
};

static size_t ask(const char *q, size_t n)
{
    memset(out, 0, sizeof out);
    return gp_query_answer(&info, (const uint8_t *)q, n, &from, out, sizeof out);
}
#define ASK(lit) ask(lit, sizeof(lit) - 1)

static void getinfo_echoes_challenge_first(void **state)
{
    (void)state;
    static const char want[] = "\xff\xff\xff\xffinfoResponse\n\\challenge\\abc-123\\sv_hostname\\unit";
    size_t n = ASK("\xff\xff\xff\xffgetinfo abc-123");
    assert_true(n > sizeof want - 1);
    assert_memory_equal(out, want, sizeof want - 1);
    out[n] = '\0';
    assert_non_null(strstr((char *)out, "\\clients\\3\\sv_maxclients\\8\\"));
    assert_non_null(strstr((char *)out, "\\gamename\\gameproc\\protocol\\68\\gametype\\0\\"));
    /* Padding after the challenge, as engines send it. */
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo abc-123\n"), n);
    assert_memory_equal(out, want, sizeof want - 1);
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo  abc-123 \0"), n);
    /* No challenge: an answer without one. */
    n = ASK("\xff\xff\xff\xffgetinfo");
    static const char bare[] = "\xff\xff\xff\xffinfoResponse\n\\sv_hostname\\unit";
    assert_true(n > sizeof bare - 1);
    assert_memory_equal(out, bare, sizeof bare - 1);
}

static void no_reply_cases(void **state)
{
    (void)state;
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo a\\b"), 0);      /* breaks the info string */
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo a%b"), 0);
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo a b"), 0);       /* two arguments */
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfoX"), 0);          /* another command */
    assert_int_equal(ASK("\xff\xff\xffgetinfo"), 0);               /* short header */
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo "
                         "01234567890123456789012345678901234567890123456789012345678901234"),
                     0);                                             /* 65 bytes */
    info.no_info = 1;                                                /* stopping */
    assert_int_equal(ASK("\xff\xff\xff\xffgetinfo abc"), 0);
    assert_true(ASK("\xff\xff\xff\xffgetstatus abc") > 0);          /* probes still work */
    info.no_info = 0;
}

static void getstatus_lists_players(void **state)
{
    (void)state;
    size_t n = ASK("\xff\xff\xff\xffgetstatus 77");
    static const char want[] = "\xff\xff\xff\xffstatusResponse\n\\challenge\\77\\";
    assert_true(n > sizeof want - 1);
    assert_memory_equal(out, want, sizeof want - 1);
    out[n] = '\0';
    assert_non_null(strstr((char *)out, "\n0 20 \"player1\"\n7 21 \"player2\"\n14 22 \"player3\"\n"));
}

static void a2s_challenge_round_trip(void **state)
{
    (void)state;
    static const char q[] = "\xff\xff\xff\xffTSource Engine Query";
    info.a2s_challenge = 1;
    assert_int_equal(ask(q, sizeof q), 9); /* with its NUL: S2C_CHALLENGE */
    assert_memory_equal(out, "\xff\xff\xff\xff" "A", 5);
    uint32_t c = gp_a2s_challenge(99, &from);
    const uint8_t le[4] = { (uint8_t)c, (uint8_t)(c >> 8), (uint8_t)(c >> 16), (uint8_t)(c >> 24) };
    assert_memory_equal(out + 5, le, 4);
    char q2[sizeof q + 4];
    memcpy(q2, q, sizeof q);
    memcpy(q2 + sizeof q, out + 5, 4);
    size_t n = ask(q2, sizeof q2);
    assert_true(n > 6);
    assert_memory_equal(out, "\xff\xff\xff\xff" "I\x11" "unit", 10);
    info.a2s_challenge = 0;
}

int main(void)
{
    struct sockaddr_in *v4 = (struct sockaddr_in *)&from;
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(getinfo_echoes_challenge_first),
        cmocka_unit_test(no_reply_cases),
        cmocka_unit_test(getstatus_lists_players),
        cmocka_unit_test(a2s_challenge_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
