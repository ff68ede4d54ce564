/* Byte-exact tests of the UDP master protocols as their specifications describe them:
 * dpmaster's techinfo (DarkPlaces / Quake III) and Valve's Master Server Query Protocol
 * with the GoldSrc heartbeat. Pure parsers and encoders, no sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "master.h"
#include "master_q3.h"
#include "master_valve.h"

#define B(s) (const uint8_t *)(s), sizeof(s) - 1

/* ---------- DarkPlaces / Quake III ---------- */

static void q3_kinds(void **state)
{
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff\xffheartbeat DarkPlaces\n")), SD_Q3_HEARTBEAT);
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff\xffinfoResponse\n\\a\\b")), SD_Q3_INFORESPONSE);
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff\xffgetservers 68")), SD_Q3_GETSERVERS);
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff\xffgetserversExt Xonotic 3")), SD_Q3_GETSERVERSEXT);
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff\xffgetserversExtra 3")), SD_Q3_NONE);
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff")), SD_Q3_NONE);
    assert_int_equal(sd_q3_kind(B("\xff\xff\xff\xfegetservers 68")), SD_Q3_NONE);
}

static void q3_heartbeat(void **state)
{
    char tag[64];
    assert_null(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat DarkPlaces\n"), tag, sizeof tag));
    assert_string_equal(tag, "DarkPlaces");
    assert_null(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat QuakeArena-1\n"), tag, sizeof tag));
    assert_string_equal(tag, "QuakeArena-1");
    /* Without the line feed (some engines), and with a NUL after it. */
    assert_null(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat DarkPlaces"), tag, sizeof tag));
    assert_null(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat DarkPlaces\n\0"), tag, sizeof tag));
    assert_string_equal(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat \n"), tag, sizeof tag), "bad_heartbeat");
    assert_string_equal(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat a b\n"), tag, sizeof tag), "bad_heartbeat");
    assert_string_equal(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat DP\nmore"), tag, sizeof tag), "bad_heartbeat");
    assert_string_equal(sd_q3_parse_heartbeat(B("\xff\xff\xff\xffheartbeat D\x01P\n"), tag, sizeof tag), "bad_heartbeat");
}

static void q3_getinfo(void **state)
{
    uint8_t out[64];
    size_t n = sd_q3_encode_getinfo("A_ch4Lleng3", out, sizeof out);
    static const char want[] = "\xff\xff\xff\xffgetinfo A_ch4Lleng3";
    assert_int_equal(n, sizeof want - 1);
    assert_memory_equal(out, want, n);
    /* The five characters the protocol forbids, and a buffer too small. */
    assert_int_equal(sd_q3_encode_getinfo("a\\b", out, sizeof out), 0);
    assert_int_equal(sd_q3_encode_getinfo("a/b", out, sizeof out), 0);
    assert_int_equal(sd_q3_encode_getinfo("a;b", out, sizeof out), 0);
    assert_int_equal(sd_q3_encode_getinfo("a\"b", out, sizeof out), 0);
    assert_int_equal(sd_q3_encode_getinfo("a%b", out, sizeof out), 0);
    assert_int_equal(sd_q3_encode_getinfo("abcdef", out, 10), 0);
}

static void q3_inforesponse(void **state)
{
    sd_master_server_t s;
    char chal[40];
    assert_null(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\sv_maxclients\\8\\clients\\2\\challenge\\A_ch4Lleng3"
          "\\protocol\\3\\gamename\\Nexuiz\\gametype\\1\\mapname\\dm1\\hostname\\My ^1server\\bots\\1"),
        &s, chal, sizeof chal));
    assert_string_equal(chal, "A_ch4Lleng3");
    assert_int_equal(s.max_players, 8);
    assert_int_equal(s.players, 2);
    assert_int_equal(s.bots, 1);
    assert_int_equal(s.protocol, 3);
    assert_int_equal(s.gametype, 1);
    assert_string_equal(s.game, "Nexuiz");
    assert_string_equal(s.map, "dm1");
    assert_string_equal(s.name, "My ^1server");
    assert_string_equal(s.source, "q3");

    /* Q3A servers send no gamename: dpmaster files them under Quake3Arena. */
    assert_null(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\challenge\\x1\\protocol\\68\\sv_maxclients\\16\\clients\\0"),
        &s, chal, sizeof chal));
    assert_string_equal(s.game, "Quake3Arena");
    assert_int_equal(s.gametype, -1);

    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\protocol\\68\\sv_maxclients\\16\\clients\\0"), &s, chal, sizeof chal),
        "no_challenge");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\challenge\\x\\protocol\\68\\clients\\0"), &s, chal, sizeof chal),
        "missing_field");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\challenge\\x\\protocol\\68\\sv_maxclients\\0\\clients\\0"), &s, chal, sizeof chal),
        "bad_maxclients");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\challenge\\x\\protocol\\68\\sv_maxclients\\4\\clients\\5"), &s, chal, sizeof chal),
        "bad_clients");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\challenge\\a;b\\protocol\\68\\sv_maxclients\\4\\clients\\1"), &s, chal, sizeof chal),
        "bad_challenge");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\challenge"), &s, chal, sizeof chal), "bad_infostring");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\nchallenge\\x"), &s, chal, sizeof chal), "bad_infostring");
    assert_string_equal(sd_q3_parse_inforesponse(
        B("\xff\xff\xff\xffinfoResponse\n\\gamename\\has space\\challenge\\x\\protocol\\1\\sv_maxclients\\4\\clients\\1"),
        &s, chal, sizeof chal), "bad_gamename");
    /* A key longer than 64 bytes. */
    char big[256];
    int n = snprintf(big, sizeof big, "\xff\xff\xff\xffinfoResponse\n\\%070d\\1", 0);
    assert_string_equal(sd_q3_parse_inforesponse((const uint8_t *)big, (size_t)n, &s, chal, sizeof chal),
                        "bad_infostring");
}

static void q3_getservers(void **state)
{
    sd_q3_query_t q;
    assert_null(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers 67 ffa empty full"), &q));
    assert_false(q.ext);
    assert_string_equal(q.game, "Quake3Arena");
    assert_int_equal(q.protocol, 67);
    assert_int_equal(q.gametype, 0);
    assert_true(q.empty && q.full);

    assert_null(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers Nexuiz 3"), &q));
    assert_string_equal(q.game, "Nexuiz");
    assert_int_equal(q.protocol, 3);
    assert_false(q.empty || q.full);
    assert_int_equal(q.gametype, -1);

    assert_null(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers qfusion 39 full gametype=7\n"), &q));
    assert_int_equal(q.gametype, 7);
    assert_true(q.full);

    assert_null(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetserversExt Quake3Arena 68 ipv4 empty ipv6"), &q));
    assert_true(q.ext && q.ipv4 && q.ipv6 && q.empty);
    assert_string_equal(q.game, "Quake3Arena");

    sd_master_filter_t f;
    memset(&f, 0, sizeof f);
    sd_q3_query_filter(&q, &f);
    /* game, protocol, not full (empty was asked for); both families: no family term. */
    assert_int_equal(f.n, 3);
    assert_string_equal(f.t[0].op, "eq");
    assert_string_equal(f.t[0].a, "g");
    assert_string_equal(f.t[0].b, "quake3arena");
    assert_string_equal(f.t[1].a, "pr");
    assert_string_equal(f.t[1].b, "68");
    assert_string_equal(f.t[2].op, "notfull");

    assert_string_equal(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers"), &q), "no_protocol");
    assert_string_equal(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers Nexuiz"), &q), "no_protocol");
    assert_string_equal(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers Nexuiz x3"), &q), "bad_protocol");
    assert_string_equal(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers 68 gametype=x"), &q), "bad_gametype");
    assert_string_equal(sd_q3_parse_getservers(B("\xff\xff\xff\xffgetservers 68\x01"), &q), "bad_getservers");
}

static void q3_response_one(void **state)
{
    sd_q3_writer_t w;
    sd_q3_resp_begin(&w, 0);
    const uint8_t ip[4] = {1, 2, 3, 4};
    assert_int_equal(sd_q3_resp_add(&w, 4, ip, 2048), 0);
    sd_q3_resp_end(&w);
    static const char want[] = "\xff\xff\xff\xffgetserversResponse\\\x01\x02\x03\x04\x08\x00\\EOT\0\0\0";
    assert_int_equal(w.len, sizeof want - 1);
    assert_memory_equal(w.buf, want, w.len);

    /* IPv6 only in the Ext reply, behind a '/'. */
    sd_q3_resp_begin(&w, 0);
    const uint8_t ip6[16] = {0x20, 0x01, 0x0d, 0xb8, [15] = 1};
    assert_int_equal(sd_q3_resp_add(&w, 6, ip6, 27960), -1);
    sd_q3_resp_begin(&w, 1);
    assert_int_equal(sd_q3_resp_add(&w, 4, ip, 2048), 0);
    assert_int_equal(sd_q3_resp_add(&w, 6, ip6, 27960), 0);
    sd_q3_resp_end(&w);
    static const char want6[] = "\xff\xff\xff\xffgetserversExtResponse\\\x01\x02\x03\x04\x08\x00"
                                "/\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01\x6d\x38\\EOT\0\0\0";
    assert_int_equal(w.len, sizeof want6 - 1);
    assert_memory_equal(w.buf, want6, w.len);

    /* An empty list is just the EOT mark. */
    sd_q3_resp_begin(&w, 0);
    sd_q3_resp_end(&w);
    assert_memory_equal(w.buf, "\xff\xff\xff\xffgetserversResponse\\EOT\0\0\0", w.len);
}

/* 1000 servers split over datagrams of at most 1400 bytes: every datagram but the last
 * carries no EOT, the last ends in it, and decoding them all gives each server once. */
static void q3_response_batches(void **state)
{
    enum { N = 1000 };
    uint8_t dgrams[16][SD_Q3_DGRAM_MAX];
    size_t lens[16];
    int nd = 0;
    sd_q3_writer_t w;
    sd_q3_resp_begin(&w, 0);
    for (int i = 0; i < N; i++) {
        uint8_t ip[4] = {10, 0, (uint8_t)(i >> 8), (uint8_t)i};
        if (sd_q3_resp_add(&w, 4, ip, (uint16_t)(27000 + i)) < 0) {
            sd_q3_resp_cut(&w);
            memcpy(dgrams[nd], w.buf, w.len);
            lens[nd++] = w.len;
            sd_q3_resp_begin(&w, 0);
            assert_int_equal(sd_q3_resp_add(&w, 4, ip, (uint16_t)(27000 + i)), 0);
        }
    }
    sd_q3_resp_end(&w);
    memcpy(dgrams[nd], w.buf, w.len);
    lens[nd++] = w.len;
    /* 22-byte header + 195 entries of 7 bytes (room for the EOT kept) = 1387 bytes. */
    assert_int_equal(nd, 6);
    int seen = 0;
    for (int d = 0; d < nd; d++) {
        assert_true(lens[d] <= SD_Q3_DGRAM_MAX);
        assert_memory_equal(dgrams[d], "\xff\xff\xff\xffgetserversResponse", 22);
        int last = d == nd - 1;
        size_t end = lens[d] - (last ? SD_Q3_EOT_LEN : 0);
        if (last) {
            assert_memory_equal(dgrams[d] + end, "\\EOT\0\0\0", SD_Q3_EOT_LEN);
        } else {
            /* the last entry keeps its separator after it */
            assert_int_equal(lens[d], 22 + 195 * 7 + 1);
            assert_int_equal(dgrams[d][lens[d] - 1], '\\');
            end--;
        }
        for (size_t o = 22; o < end; o += 7) {
            assert_int_equal(dgrams[d][o], '\\');
            int i = dgrams[d][o + 3] << 8 | dgrams[d][o + 4];
            assert_int_equal(i, seen);
            assert_int_equal(dgrams[d][o + 5] << 8 | dgrams[d][o + 6], 27000 + i);
            seen++;
        }
    }
    assert_int_equal(seen, N);
}

/* The entries a getserversResponse datagram yields to ioquake3's client
 * (CL_ServersResponsePacket, re-stated): an entry is '\\' + 4 address bytes + 2 port
 * bytes (or '/' + 16 + 2 in the Ext reply), and it counts only when a separator byte
 * ('\\' or '/') follows it in the same datagram; parsing stops at the first entry that
 * fails that. Appends the ports to ports[*n]. */
static void ioq3_parse(const uint8_t *p, size_t len, size_t hdr, int ext, int *ports, int *n)
{
    const uint8_t *b = p + hdr, *end = p + len;
    while (b + 1 < end) {
        size_t alen;
        if (*b == '\\')
            alen = 4;
        else if (ext && *b == '/')
            alen = 16;
        else
            break;
        b++;
        if ((size_t)(end - b) < alen + 2 + 1)
            break;
        b += alen;
        int port = b[0] << 8 | b[1];
        b += 2;
        if (*b != '\\' && *b != '/')
            break;
        ports[(*n)++] = port;
    }
}

/* A 3-datagram reply as the query path builds it (add until full, cut, send, begin again),
 * read the way ioquake3 and qstat read it: every server is seen, none lost at a boundary,
 * and the byte layout at each boundary is: last entry, '\\', end of datagram. */
static void q3_response_three_datagrams(void **state)
{
    enum { N = 2 * 195 + 7 };
    uint8_t dgrams[3][SD_Q3_DGRAM_MAX];
    size_t lens[3];
    int nd = 0;
    sd_q3_writer_t w;
    sd_q3_resp_begin(&w, 0);
    for (int i = 0; i < N; i++) {
        uint8_t ip[4] = {192, 0, (uint8_t)(i >> 8), (uint8_t)i};
        if (sd_q3_resp_add(&w, 4, ip, (uint16_t)(20000 + i)) < 0) {
            sd_q3_resp_cut(&w);
            assert_true(nd < 2);
            memcpy(dgrams[nd], w.buf, w.len);
            lens[nd++] = w.len;
            sd_q3_resp_begin(&w, 0);
            assert_int_equal(sd_q3_resp_add(&w, 4, ip, (uint16_t)(20000 + i)), 0);
        }
    }
    sd_q3_resp_end(&w);
    memcpy(dgrams[nd], w.buf, w.len);
    lens[nd++] = w.len;
    assert_int_equal(nd, 3);
    /* the boundary of the first datagram: server 194 (port 20194 = 0x4ee2), then '\\' */
    static const uint8_t tail0[] = {'\\', 192, 0, 0, 194, 0x4e, 0xe2, '\\'};
    assert_memory_equal(dgrams[0] + lens[0] - sizeof tail0, tail0, sizeof tail0);
    /* the second datagram starts with server 195 right after the header */
    static const uint8_t head1[] = {'\\', 192, 0, 0, 195, 0x4e, 0xe3};
    assert_memory_equal(dgrams[1] + 22, head1, sizeof head1);
    /* the last: server N-1 then the EOT mark */
    static const uint8_t tail2[] = {'\\', 192, 0, 1, 140, 0x4f, 0xac, '\\', 'E', 'O', 'T', 0, 0, 0};
    assert_memory_equal(dgrams[2] + lens[2] - sizeof tail2, tail2, sizeof tail2);
    int ports[N + 8], n = 0;
    for (int d = 0; d < 3; d++)
        ioq3_parse(dgrams[d], lens[d], 22, 0, ports, &n);
    assert_int_equal(n, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(ports[i], 20000 + i);
}

/* The quota and budget groups: an IPv6 /64, an IPv4 /24 on request, else the address. */
static void address_groups(void **state)
{
    char g[SD_MASTER_GROUP_MAX];
    assert_string_equal(sd_master_addr_group("2001:db8:1:2:3:4:5:6", 32, g, sizeof g),
                        "2001:db8:1:2::/64");
    assert_string_equal(sd_master_addr_group("2001:db8:1:2::", 24, g, sizeof g), "2001:db8:1:2::/64");
    assert_string_equal(sd_master_addr_group("::1", 32, g, sizeof g), "::/64");
    assert_string_equal(sd_master_addr_group("192.0.2.77", 32, g, sizeof g), "192.0.2.77");
    assert_string_equal(sd_master_addr_group("192.0.2.77", 24, g, sizeof g), "192.0.2.0/24");
    assert_string_equal(sd_master_addr_group("::ffff:192.0.2.77", 32, g, sizeof g),
                        "::ffff:192.0.2.77");
}

/* ---------- Valve ---------- */

static void valve_query(void **state)
{
    sd_valve_query_t q;
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\gamedir\\TF\\empty\\1\\full\\1\0"), &q));
    assert_int_equal(q.region, 255);
    assert_string_equal(q.seed, "");
    assert_int_equal(q.filter.n, 4);
    assert_string_equal(q.filter.t[0].op, "eq");
    assert_string_equal(q.filter.t[0].a, "g");
    assert_string_equal(q.filter.t[0].b, "tf");
    assert_string_equal(q.filter.t[1].op, "notempty");
    assert_string_equal(q.filter.t[2].op, "notfull");
    assert_string_equal(q.filter.t[3].a, "f"); /* IPv4 only: the reply has no room for v6 */

    assert_null(sd_valve_parse_query(
        B("\x31\x03" "1.2.3.4:27015\0"
          "\\map\\de_dust2\\dedicated\\1\\secure\\1\\linux\\1\\password\\0\\noplayers\\1"
          "\\nor\\2\\map\\cs_office\\gametype\\hardcore,fast\\nand\\1\\appid\\10\0"),
        &q));
    assert_int_equal(q.region, 3);
    assert_string_equal(q.seed, "1.2.3.4:27015");
    const char *want[][3] = {{"eq", "m", "de_dust2"}, {"eq", "d", "1"}, {"eq", "s", "1"},
                             {"eq", "os", "l"}, {"eq", "pw", "0"}, {"eq", "p", "0"},
                             {"nor", "2", ""}, {"eq", "m", "cs_office"},
                             {"tags", "", "hardcore,fast"}, {"nand", "1", ""}, {"true", "", ""},
                             {"eq", "f", "4"}, {"eq", "r", "europe"}};
    assert_int_equal(q.filter.n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < q.filter.n; i++) {
        assert_string_equal(q.filter.t[i].op, want[i][0]);
        assert_string_equal(q.filter.t[i].a, want[i][1]);
        assert_string_equal(q.filter.t[i].b, want[i][2]);
    }
    /* The filter's NUL may be missing at the very end; an empty filter is fine. */
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0"), &q));
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0\0"), &q));

    /* Liberal seeds: qstat 2.17's follow-up page "1 \xff <seed>r \0" (a stray byte after
     * the address, no filter) is answered from that seed; so is a seed the datagram ends
     * in without its NUL. */
    assert_null(sd_valve_parse_query(B("\x31\xff" "127.0.1.8:30001r\0"), &q));
    assert_string_equal(q.seed, "127.0.1.8:30001");
    assert_true(q.seed_garbage);
    assert_int_equal(q.filter.n, 1); /* only the IPv4 condition */
    assert_null(sd_valve_parse_query(B("\x31\xff" "127.0.1.8:30001"), &q));
    assert_string_equal(q.seed, "127.0.1.8:30001");
    assert_false(q.seed_garbage);
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0"), &q));
    assert_string_equal(q.seed, "");
    /* qstat 2.17 writes each seed over the previous one: a shorter seed keeps the
     * previous one's last digit. Captured from quakestat -stm paging 1,800 servers (region
     * 0xff, seed 127.0.2.3:27901, a leftover 0, no filter). */
    assert_null(sd_valve_parse_query(B("1\xff" "127.0.2.3:279010\0"), &q));
    assert_string_equal(q.seed, "127.0.2.3:27901");
    assert_true(q.seed_garbage);
    assert_int_equal(q.filter.n, 1);
    /* The longest seed with a leftover; five digits past 65535 leave four; the leftover
     * of a longer previous seed may hold dots and a colon too. */
    assert_null(sd_valve_parse_query(B("\x31\xff" "255.255.255.255:655350\0"), &q));
    assert_string_equal(q.seed, "255.255.255.255:65535");
    assert_null(sd_valve_parse_query(B("\x31\xff" "1.2.3.4:6553690\0"), &q));
    assert_string_equal(q.seed, "1.2.3.4:6553");
    assert_true(q.seed_garbage);
    assert_null(sd_valve_parse_query(B("\x31\xff" "1.2.3.4:500.200:27015\0"), &q));
    assert_string_equal(q.seed, "1.2.3.4:500");
    assert_true(q.seed_garbage);
    assert_null(sd_valve_parse_query(B("\x31\x03" "10.0.0.1:27015 \xff\0\\gamedir\\cstrike\0"), &q));
    assert_string_equal(q.seed, "10.0.0.1:27015");
    assert_string_equal(q.filter.t[0].b, "cstrike");

    /* The spellings real clients send (HLDS and Valve masters), honoured or ignored. */
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\type\\d\0"), &q));
    assert_string_equal(q.filter.t[0].op, "eq");
    assert_string_equal(q.filter.t[0].a, "d");
    assert_string_equal(q.filter.t[0].b, "1");
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\type\\l\0"), &q));
    assert_string_equal(q.filter.t[0].b, "0");
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\type\\p\0"), &q));
    assert_string_equal(q.filter.t[0].b, "proxy");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\type\\x\0"), &q),
                        "bad_filter");
    assert_null(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\gameaddr\\10.1.2.3:27015\0"), &q));
    assert_string_equal(q.filter.t[0].a, "ip");
    assert_string_equal(q.filter.t[0].b, "10.1.2.3");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0" "\\gameaddr\\nope\0"), &q),
                        "bad_filter");
    static const char *const ignored[] = {"\\gamedata\\a,b", "\\gamedataor\\a,b",
                                          "\\name_match\\fr*", "\\version_match\\1.*",
                                          "\\collapse_addr_hash\\1", "\\appid\\440",
                                          "\\napp\\500", "\\white\\1", NULL};
    for (const char *const *k = ignored; *k; k++) {
        uint8_t b[128];
        size_t n = 0;
        memcpy(b, "\x31\xff" "0.0.0.0:0", 11);
        n = 12; /* the seed's NUL */
        b[11] = 0;
        memcpy(b + n, *k, strlen(*k));
        n += strlen(*k);
        b[n++] = 0;
        assert_null(sd_valve_parse_query(b, n, &q));
        assert_string_equal(q.filter.t[0].op, "true");
    }

    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "r127.0.0.1:5\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "1.2.3:5\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "[::1]:5\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "1.2.3.4:70000\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "1.2.3.4:\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "1.2.3.4:0\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "1.2.3.4\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "1111.2222.3333.44:5\0\0"), &q), "bad_seed");
    assert_string_equal(sd_valve_parse_query(B("\x31\x09" "0.0.0.0:0\0\0"), &q), "bad_region");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0\\gamedir\0"), &q), "bad_filter");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0\\nor\\x\0"), &q), "bad_filter");
    assert_string_equal(sd_valve_parse_query(B("\x31\xff" "0.0.0.0:0\0\0junk"), &q), "bad_filter");
    assert_string_equal(sd_valve_parse_query(B("\x32\xff" "0.0.0.0:0\0\0"), &q), "bad_query");
    assert_string_equal(sd_valve_parse_query(B("\x31"), &q), "bad_query");
}

static void valve_reply(void **state)
{
    uint8_t out[SD_VALVE_DGRAM_MAX];
    const uint8_t ips[2][4] = {{1, 2, 3, 4}, {192, 168, 0, 1}};
    const uint16_t ports[2] = {27015, 2048};
    size_t n = sd_valve_encode_reply(ips, ports, 2, 0, out);
    static const char want[] = "\xff\xff\xff\xff\x66\x0a\x01\x02\x03\x04\x69\x87\xc0\xa8\x00\x01\x08\x00";
    assert_int_equal(n, sizeof want - 1);
    assert_memory_equal(out, want, n);
    n = sd_valve_encode_reply(ips, ports, 1, 1, out);
    static const char want_last[] = "\xff\xff\xff\xff\x66\x0a\x01\x02\x03\x04\x69\x87\0\0\0\0\0\0";
    assert_int_equal(n, sizeof want_last - 1);
    assert_memory_equal(out, want_last, n);
    /* A full batch with the terminator still fits one 1400-byte datagram. */
    static uint8_t many[SD_VALVE_BATCH][4];
    static uint16_t mports[SD_VALVE_BATCH];
    assert_int_equal(SD_VALVE_BATCH, 231);
    n = sd_valve_encode_reply((const uint8_t(*)[4])many, mports, SD_VALVE_BATCH, 1, out);
    assert_int_equal(n, 6 + 231 * 6 + 6);
    assert_true(n <= SD_VALVE_DGRAM_MAX);
}

static void goldsrc(void **state)
{
    assert_int_equal(sd_gs_kind(B("q")), SD_GS_CHALLENGE_REQ);
    assert_int_equal(sd_gs_kind(B("q\n")), SD_GS_CHALLENGE_REQ);
    assert_int_equal(sd_gs_kind(B("b\n")), SD_GS_QUIT);
    assert_int_equal(sd_gs_kind(B("0\n\\protocol\\48")), SD_GS_INFO);
    assert_int_equal(sd_gs_kind(B("qq")), SD_GS_NONE);
    assert_int_equal(sd_gs_kind(B("b\nx")), SD_GS_NONE);

    uint8_t out[16];
    assert_int_equal(sd_gs_encode_challenge(0x12345678u, out), 10);
    assert_memory_equal(out, "\xff\xff\xff\xff\x73\x0a\x78\x56\x34\x12", 10);

    sd_master_server_t s;
    uint32_t c = 0;
    assert_null(sd_gs_parse_info(
        B("0\n\\protocol\\48\\challenge\\305419896\\players\\5\\max\\24\\bots\\1\\gamedir\\cstrike"
          "\\map\\de_dust2\\password\\0\\os\\l\\lan\\0\\region\\3\\type\\d\\secure\\1"
          "\\version\\1.1.2.7\\product\\cstrike\n"),
        &s, &c));
    assert_int_equal(c, 305419896u);
    assert_int_equal(s.protocol, 48);
    assert_int_equal(s.players, 5);
    assert_int_equal(s.max_players, 24);
    assert_int_equal(s.bots, 1);
    assert_string_equal(s.game, "cstrike");
    assert_string_equal(s.map, "de_dust2");
    assert_string_equal(s.os, "l");
    assert_string_equal(s.region, "europe");
    assert_string_equal(s.version, "1.1.2.7");
    assert_true(s.dedicated && s.secure && !s.password);

    assert_string_equal(sd_gs_parse_info(B("0\n\\protocol\\48\\players\\5\\max\\24\\gamedir\\x"), &s, &c),
                        "no_challenge");
    assert_string_equal(sd_gs_parse_info(B("0\n\\challenge\\5000000000\\protocol\\48"), &s, &c),
                        "bad_challenge");
    assert_string_equal(sd_gs_parse_info(B("0\n\\challenge\\1\\protocol\\48\\players\\1\\max\\2"), &s, &c),
                        "missing_field");
    assert_string_equal(sd_gs_parse_info(
        B("0\n\\challenge\\1\\protocol\\48\\players\\1\\max\\2\\gamedir\\x\\lan\\1"), &s, &c), "lan_server");
    assert_string_equal(sd_gs_parse_info(B("0\n\\challenge\\1\\pro\x01tocol\\48"), &s, &c), "bad_infostring");
}

/* Stateless challenges: bound to what they were issued for, verified
 * under the current or the previous secret, expired by their own issue time, never the
 * same twice. */
static void stateless_challenges(void **state)
{
    (void)state;
    const char *k1 = "1111111111111111111111111111111111111111111111111111111111111111";
    const char *k2 = "2222222222222222222222222222222222222222222222222222222222222222";
    const char *k3 = "3333333333333333333333333333333333333333333333333333333333333333";
    char c1[40], c2[40];
    sd_master_cfg.challenge_ttl_ms = 5000;
    assert_int_equal(sd_master_key_set(k1, k1), 0);
    assert_int_equal(sd_master_chal_make('q', "127.0.0.1:27960", c1, sizeof c1), 0);
    assert_int_equal(strlen(c1), 32);
    assert_int_equal(sd_master_chal_make('q', "127.0.0.1:27960", c2, sizeof c2), 0);
    assert_string_not_equal(c1, c2); /* a nonce: never the same challenge twice */
    assert_null(sd_master_chal_check('q', "127.0.0.1:27960", c1));
    /* bound to the address, the port and the protocol */
    assert_string_equal(sd_master_chal_check('q', "127.0.0.2:27960", c1), "unknown_challenge");
    assert_string_equal(sd_master_chal_check('q', "127.0.0.1:27961", c1), "unknown_challenge");
    assert_string_equal(sd_master_chal_check('r', "127.0.0.1:27960", c1), "unknown_challenge");
    /* one flipped digit anywhere, a short or non-hex one */
    for (int i = 0; i < 32; i++) {
        char bad[40];
        strcpy(bad, c1);
        bad[i] = bad[i] == '0' ? '1' : '0';
        const char *why = sd_master_chal_check('q', "127.0.0.1:27960", bad);
        assert_non_null(why);
    }
    assert_string_equal(sd_master_chal_check('q', "127.0.0.1:27960", "abc"), "unknown_challenge");
    assert_string_equal(sd_master_chal_check('q', "127.0.0.1:27960", "zz3456789abcdef0123456789abcdef0"),
                        "unknown_challenge");
    /* rotation: the previous secret still verifies, the one before that does not */
    assert_int_equal(sd_master_key_set(k2, k1), 0);
    assert_null(sd_master_chal_check('q', "127.0.0.1:27960", c1));
    assert_int_equal(sd_master_key_set(k3, k2), 0);
    assert_string_equal(sd_master_chal_check('q', "127.0.0.1:27960", c1), "unknown_challenge");
    assert_int_equal(sd_master_key_set("nothex", k2), -1);
    /* expiry by the issue time in the challenge */
    sd_master_cfg.challenge_ttl_ms = 100;
    assert_int_equal(sd_master_chal_make('r', "10.0.0.1", c1, sizeof c1), 0);
    assert_null(sd_master_chal_check('r', "10.0.0.1", c1));
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    assert_string_equal(sd_master_chal_check('r', "10.0.0.1", c1), "challenge_expired");
    /* GoldSrc's 32 bits: this bucket's and the last one's */
    sd_master_cfg.challenge_ttl_ms = 5000;
    uint32_t g;
    assert_int_equal(sd_master_chal_make_u32("127.0.0.1:27015", &g), 0);
    assert_int_not_equal(g, 0);
    assert_null(sd_master_chal_check_u32("127.0.0.1:27015", g));
    assert_string_equal(sd_master_chal_check_u32("127.0.0.1:27016", g), "unknown_challenge");
    assert_string_equal(sd_master_chal_check_u32("127.0.0.1:27015", g ^ 1), "unknown_challenge");
}

/* A record of the P s layout for key, with game, players and tags. */
static void put_server(const char *key, const char *game, int players, const char *tags, int64_t exp)
{
    sd_master_server_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.game, sizeof s.game, "%s", game);
    snprintf(s.map, sizeof s.map, "Map1");
    s.players = players;
    s.max_players = 8;
    s.protocol = 3;
    s.gametype = -1;
    s.source = "q3";
    int n = 0;
    for (const char *p = tags; *p && n < 16;) {
        size_t len = strcspn(p, ",");
        snprintf(s.tags[n++], sizeof s.tags[0], "%.*s", (int)len, p);
        p += len + (p[len] == ',');
    }
    s.ntags = n;
    char rec[2048];
    size_t len = sd_master_record(&s, "c", "g", 1, exp, rec, sizeof rec);
    assert_true(len > 0);
    assert_int_equal(sd_master_index_put(key, rec, len), 0);
}

static int snap_has(const sd_master_snap_t *sn, const char *key)
{
    for (size_t i = 0; i < sn->n; i++)
        if (!strcmp(sn->v[i]->buf, key))
            return 1;
    return 0;
}

/* The in-memory index: sorted snapshots merged from changes, later expiry wins, filters
 * as the Lua query had them, a held snapshot stays valid while the index moves on. */
static void index_and_filters(void **state)
{
    (void)state;
    int64_t far = INT64_C(1) << 50;
    put_server("10.0.0.2:27960", "Xonotic", 0, "ctf,Instagib", far);
    put_server("10.0.0.1:27960", "Quake3", 3, "", far);
    put_server("[2001:db8::1]:27960", "xonotic", 8, "ctf", far);
    sd_master_snap_t *a = sd_master_snap_get();
    assert_int_equal(a->n, 3);
    assert_string_equal(a->v[0]->buf, "10.0.0.1:27960");
    assert_string_equal(a->v[1]->buf, "10.0.0.2:27960");
    assert_string_equal(a->v[2]->buf, "[2001:db8::1]:27960");
    assert_int_equal(sd_master_snap_after(a, "10.0.0.1:27960"), 1);
    assert_int_equal(sd_master_snap_after(a, ""), 0);
    assert_int_equal(sd_master_snap_after(a, "9"), 2);

    /* filters */
    struct { const char *op, *a, *b; } terms[][3] = {
        {{"eq", "g", "xonotic"}}, {{"notempty", "", ""}}, {{"notfull", "", ""}},
        {{"tags", "", "instagib,ctf"}}, {{"eq", "f", "6"}}, {{"nor", "1", ""}, {"eq", "g", "quake3"}},
        {{"nand", "2", ""}, {"eq", "g", "xonotic"}, {"eq", "f", "6"}}, {{"eq", "ip", "10.0.0.1"}},
    };
    const int want[][3] = {{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {0, 1, 0}, {0, 0, 1}, {0, 1, 1},
                           {1, 1, 0}, {1, 0, 0}};
    for (size_t t = 0; t < sizeof terms / sizeof terms[0]; t++) {
        sd_master_filter_t f;
        memset(&f, 0, sizeof f);
        for (int k = 0; k < 3 && terms[t][k].op; k++)
            sd_master_filter_add(&f, terms[t][k].op, terms[t][k].a, terms[t][k].b);
        sd_master_cfilter_t cf;
        assert_int_equal(sd_master_filter_compile(&f, &cf), 0);
        for (int i = 0; i < 3; i++) {
            if (sd_master_match(&cf, a->v[i]) != want[t][i])
                fail_msg("filter %zu server %d", t, i);
        }
    }

    /* changes: a stale record (earlier expiry) is ignored, a removal and an insert merge
     * into the next snapshot; the held one is unchanged */
    put_server("10.0.0.1:27960", "Stale", 3, "", far - 1);
    sd_master_index_del("10.0.0.2:27960");
    put_server("10.0.0.15:1", "New", 1, "", far);
    sd_master_snap_t *b = sd_master_snap_get();
    assert_int_equal(b->n, 3);
    /* byte order of the keys: '5' sorts before ':' */
    assert_string_equal(b->v[0]->buf, "10.0.0.15:1");
    assert_string_equal(b->v[1]->buf, "10.0.0.1:27960");
    assert_string_equal(SD_MREC(b->v[1], SD_MREC_GAME), "Quake3");
    assert_false(snap_has(b, "10.0.0.2:27960"));
    assert_true(snap_has(a, "10.0.0.2:27960"));
    assert_string_equal(SD_MREC(a->v[1], SD_MREC_TAGS), "ctf,Instagib");
    /* several changes to one key between two snapshots merge as the last of them:
     * replaced twice, taken out and put back, put and taken out */
    put_server("10.0.0.1:27960", "Second", 3, "", far + 1);
    put_server("10.0.0.1:27960", "Third", 3, "", far + 2);
    sd_master_index_del("10.0.0.15:1");
    put_server("10.0.0.15:1", "Back", 1, "", far);
    put_server("10.0.0.99:1", "Brief", 1, "", far);
    sd_master_index_del("10.0.0.99:1");
    sd_master_index_del("[2001:db8::1]:27960");
    sd_master_snap_t *c = sd_master_snap_get();
    assert_int_equal(c->n, 2);
    assert_string_equal(c->v[0]->buf, "10.0.0.15:1");
    assert_string_equal(SD_MREC(c->v[0], SD_MREC_GAME), "Back");
    assert_string_equal(c->v[1]->buf, "10.0.0.1:27960");
    assert_string_equal(SD_MREC(c->v[1], SD_MREC_GAME), "Third");
    assert_false(snap_has(c, "10.0.0.99:1"));
    assert_false(snap_has(c, "[2001:db8::1]:27960"));
    /* the snapshot held before is unchanged, its records still readable */
    assert_int_equal(b->n, 3);
    assert_string_equal(SD_MREC(b->v[0], SD_MREC_GAME), "New");
    assert_string_equal(SD_MREC(b->v[2], SD_MREC_GAME), "xonotic");
    sd_master_snap_put(a);
    sd_master_snap_put(b);
    sd_master_snap_put(c);
    /* a malformed record is refused */
    assert_int_equal(sd_master_index_put("10.0.0.9:1", "too\x1f" "few", 7), -1);
    assert_int_equal(sd_master_index_put("nonsense", "", 0), -1);
    sd_master_stop();
}

/* The record as the format string made it before the builder (sd_master_record's
 * reference). */
static int record_ref(const sd_master_server_t *s, const char *chal, const char *group, int64_t now,
                      int64_t exp, char *out, size_t cap)
{
    char tags[16 * 34 + 2] = "";
    for (int i = 0; i < s->ntags; i++) {
        if (i)
            strcat(tags, ",");
        strcat(tags, s->tags[i]);
    }
    /* of a 32-digit challenge the record keeps its first 16 (the stamp) */
    return snprintf(out, cap,
                    "%.*s\x1f%s\x1f%s\x1f%lld\x1f%lld\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s"
                    "\x1f%d\x1f%d\x1f%d\x1f%d\x1f%d\x1f%d\x1f%s\x1f%d\x1f%d",
                    strlen(chal) == 32 ? 16 : (int)strlen(chal), chal, group, s->instance, (long long)exp, (long long)now, s->source, s->game,
                    s->map, s->name, s->version, s->region, tags, s->players, s->max_players,
                    s->bots, s->password, s->dedicated, s->secure, s->os, s->protocol, s->gametype);
}

/* sd_master_record writes what the format string did, byte for byte, and 0 when the
 * record does not fit. */
static void record_text(void **state)
{
    (void)state;
    sd_master_server_t s;
    for (int v = 0; v < 4; v++) {
        memset(&s, 0, sizeof s);
        s.source = v == 1 ? "rest" : "q3";
        snprintf(s.game, sizeof s.game, "%s", v == 2 ? "" : "DarkPlaces-Quake");
        snprintf(s.map, sizeof s.map, "e1m%d", v);
        memset(s.name, 'n', v == 3 ? 128 : 5);
        snprintf(s.version, sizeof s.version, "1.%d", v);
        snprintf(s.region, sizeof s.region, "%s", v ? "eu" : "");
        snprintf(s.instance, sizeof s.instance, "%s", v == 1 ? "c/i-1" : "");
        s.ntags = v;
        for (int t = 0; t < v; t++)
            snprintf(s.tags[t], sizeof s.tags[t], "tag%d", t);
        s.players = v * 7;
        s.max_players = 16;
        s.bots = v;
        s.password = v & 1;
        s.dedicated = 1;
        s.secure = v == 2;
        snprintf(s.os, sizeof s.os, "%s", v == 3 ? "" : "l");
        s.protocol = v == 2 ? -1 : 3;
        s.gametype = v == 3 ? -2147483647 - 1 : v - 1;
        int64_t now = v == 0 ? 0 : 1795872646632LL + v, exp = v == 3 ? -5 : now + 900000;
        char want[2048], got[2048];
        const char *chal = v == 2 ? "3735928559" : "0123456789abcdef0123456789abcdef";
        int wn = record_ref(&s, chal, v ? "127.0.0.0/24" : "", now, exp, want, sizeof want);
        size_t gn = sd_master_record(&s, chal, v ? "127.0.0.0/24" : "", now, exp, got, sizeof got);
        assert_int_equal(gn, (size_t)wn);
        assert_memory_equal(got, want, gn + 1);
        /* one byte short of the record and its terminator: does not fit */
        assert_int_equal(sd_master_record(&s, chal, v ? "127.0.0.0/24" : "", now, exp, got, gn), 0);
        assert_int_equal(sd_master_record(&s, chal, v ? "127.0.0.0/24" : "", now, exp, got, gn + 1), gn);
    }
}

/* A datagram's source makes the key and IP text sd_master_addr_key makes of the same
 * address (IPv4 written without a parse, IPv4-mapped IPv6 as the IPv4 it stands for). */
static void source_keys(void **state)
{
    (void)state;
    const char *v4[] = {"0.0.0.0", "1.2.3.4", "127.0.0.1", "10.200.3.99", "255.255.255.255"};
    const int ports[] = {1, 80, 27960, 65535};
    for (size_t i = 0; i < sizeof v4 / sizeof v4[0]; i++) {
        for (size_t k = 0; k < sizeof ports / sizeof ports[0]; k++) {
            char key[SD_MASTER_ADDR_MAX], ip[48], wkey[SD_MASTER_ADDR_MAX], wip[48];
            int port = 0;
            assert_int_equal(sd_master_addr_key(v4[i], ports[k], wkey, sizeof wkey, wip, sizeof wip, NULL), 0);
            struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[k])};
            inet_pton(AF_INET, v4[i], &in.sin_addr);
            assert_int_equal(sd_master_addr_from_sockaddr((struct sockaddr *)&in, key, sizeof key, ip,
                                                          sizeof ip, &port), 0);
            assert_string_equal(key, wkey);
            assert_string_equal(ip, wip);
            assert_int_equal(port, ports[k]);
            struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)ports[k])};
            char mapped[64];
            snprintf(mapped, sizeof mapped, "::ffff:%s", v4[i]);
            inet_pton(AF_INET6, mapped, &in6.sin6_addr);
            assert_int_equal(sd_master_addr_from_sockaddr((struct sockaddr *)&in6, key, sizeof key, ip,
                                                          sizeof ip, &port), 0);
            assert_string_equal(key, wkey);
            assert_string_equal(ip, wip);
        }
    }
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons(27960)};
    inet_pton(AF_INET6, "2001:db8::1", &in6.sin6_addr);
    char key[SD_MASTER_ADDR_MAX], ip[48];
    int port = 0;
    assert_int_equal(sd_master_addr_from_sockaddr((struct sockaddr *)&in6, key, sizeof key, ip, sizeof ip,
                                                  &port), 0);
    assert_string_equal(key, "[2001:db8::1]:27960");
    assert_string_equal(ip, "2001:db8::1");
    /* port 0 is no server's; a small key buffer is cut, not overrun */
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, "1.2.3.4", &in.sin_addr);
    assert_int_equal(sd_master_addr_from_sockaddr((struct sockaddr *)&in, key, sizeof key, ip, sizeof ip,
                                                  &port), -1);
    in.sin_port = htons(27960);
    char small[6];
    assert_int_equal(sd_master_addr_from_sockaddr((struct sockaddr *)&in, small, sizeof small, NULL, 0,
                                                  NULL), 0);
    assert_string_equal(small, "1.2.3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(q3_kinds),        cmocka_unit_test(q3_heartbeat),
        cmocka_unit_test(q3_getinfo),      cmocka_unit_test(q3_inforesponse),
        cmocka_unit_test(q3_getservers),   cmocka_unit_test(q3_response_one),
        cmocka_unit_test(q3_response_batches),
        cmocka_unit_test(q3_response_three_datagrams),
        cmocka_unit_test(address_groups), cmocka_unit_test(valve_query),
        cmocka_unit_test(valve_reply),     cmocka_unit_test(goldsrc),
        cmocka_unit_test(stateless_challenges), cmocka_unit_test(index_and_filters),
        cmocka_unit_test(record_text),     cmocka_unit_test(source_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
