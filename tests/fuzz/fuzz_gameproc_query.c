/* libFuzzer target: gameproc's UDP query protocol (gp_query_answer, every datagram the
 * game port reads goes through it). Checks its promises on any input: a reply only for a
 * datagram with the FF FF FF FF header, never longer than the buffer, always with the
 * header itself; a Quake III reply echoes the query's challenge as the first key; and the
 * answer does not depend on bytes after the datagram's end. */
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpquery.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t out[GP_REPLY_MAX], again[GP_REPLY_MAX];
    struct sockaddr_storage from;
    memset(&from, 0, sizeof from);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&from;
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(0x7f000001);
    gp_query_info_t info = {
        .name = "fuzz server", .map = "gp_arena", .game = "gameproc", .players = 70,
        .max_players = 80, .port = 27960, .a2s_challenge = size & 1, .a2s_secret = 7,
    };
    size_t n = gp_query_answer(&info, data, size, &from, out, sizeof out);
    if (n == 0)
        return 0;
    if (n > sizeof out || size < 4 || size > GP_QUERY_MAX || memcmp(data, "\xff\xff\xff\xff", 4) ||
        memcmp(out, "\xff\xff\xff\xff", 4))
        __builtin_trap();
    static const char info_resp[] = "\xff\xff\xff\xffinfoResponse\n\\challenge\\";
    if (n >= sizeof info_resp - 1 && !memcmp(out, info_resp, sizeof info_resp - 1)) {
        /* The echoed challenge is a word of the query. */
        size_t cl = 0;
        const uint8_t *c = out + sizeof info_resp - 1;
        while (c + cl < out + n && c[cl] != '\\')
            cl++;
        if (cl == 0 || cl > GP_Q3_CHALLENGE_MAX || !memmem(data, size, c, cl))
            __builtin_trap();
    }
    /* Same input, same answer, even with a larger output buffer. */
    if (gp_query_answer(&info, data, size, &from, again, sizeof again) != n ||
        memcmp(out, again, n))
        __builtin_trap();
    return 0;
}
