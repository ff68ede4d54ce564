/* gameproc's UDP query protocol, the pure part (no I/O, no globals): given one datagram
 * and what the server looks like, the reply to send. Linked into gameproc and into the
 * fuzz target through the gameproc_core library.
 *
 *   Quake III  "\xff\xff\xff\xffgetstatus [challenge]" -> "statusResponse\n\\k\\v...\n"
 *                                                         + one line per player
 *              "\xff\xff\xff\xffgetinfo [challenge]"   -> "infoResponse\n\\k\\v..."
 *   Valve      "\xff\xff\xff\xffTSource Engine Query\0" [4-byte challenge]
 *                                                      -> A2S_INFO ('I') reply, or an
 *                                                         S2C_CHALLENGE ('A') when the
 *                                                         challenge is missing
 *                                                         (a2s_challenge) or wrong
 *
 * The Quake III challenge is the first word after the command (dpmaster's techinfo and
 * ioquake3's SVC_Info: Cmd_Argv(1)); trailing blanks, a line feed or NUL after it are
 * allowed. It is echoed as the first key of the reply's info string, which is what a
 * master checks before listing the server. A challenge that an info string cannot carry
 * (a '\\', '"', ';', '/' or '%', a control byte, longer than GP_Q3_CHALLENGE_MAX) makes
 * the whole query unanswered: a reply without it would be useless to the master. */
#ifndef GPQUERY_H
#define GPQUERY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "sdversion.h"

#define GP_QUERY_MAX 1400          /* longest datagram answered */
#define GP_REPLY_MAX 1600          /* room for the longest reply (a full statusResponse) */
#define GP_Q3_CHALLENGE_MAX 64
#define GP_STATUS_PLAYERS_MAX 64   /* player lines in a statusResponse */

typedef struct {
    const char *name, *map;        /* info-string safe (checked by the option parser) */
    const char *game;              /* gamename, one word */
    int players, max_players;
    int draining;
    int port;                      /* the game port, for A2S's extra data */
    int a2s_challenge;             /* A2S_INFO only after the challenge round trip */
    uint32_t a2s_secret;           /* keys the A2S challenge of a client address */
    int no_info;                   /* going away: getinfo is not answered (masters drop us) */
} gp_query_info_t;

/* Writes the reply to the datagram in[0..n) from `from` into out (cap bytes, GP_REPLY_MAX is
 * always enough) and returns its length, or 0 when the datagram gets no reply
 * (unknown, malformed, or a reply that would not fit). */
size_t gp_query_answer(const gp_query_info_t *info, const uint8_t *in, size_t n,
                       const struct sockaddr_storage *from, uint8_t *out, size_t cap);

/* The A2S challenge for a client address (never 0 or 0xffffffff). */
uint32_t gp_a2s_challenge(uint32_t secret, const struct sockaddr_storage *from);

#endif
