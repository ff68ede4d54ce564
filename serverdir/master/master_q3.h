/* The DarkPlaces / Quake III Arena master protocol (dpmaster's doc/techinfo.txt and
 * id's server.txt): pure parsers and encoders, no I/O, so they can be unit-tested
 * byte for byte and fuzzed.
 *
 *   server -> master   FF FF FF FF "heartbeat DarkPlaces\n"
 *   master -> server   FF FF FF FF "getinfo <challenge>"
 *   server -> master   FF FF FF FF "infoResponse\n\key\value\..." (challenge, protocol,
 *                      sv_maxclients, clients, gamename [not for Q3A], gametype...)
 *   client -> master   FF FF FF FF "getservers [gamename] <protocol> [empty] [full]
 *                      [gametype=N|ffa|tourney|team|ctf]"
 *                      FF FF FF FF "getserversExt <gamename> <protocol> [opts] [ipv4] [ipv6]"
 *   master -> client   FF FF FF FF "getserversResponse" ("\" + 4-byte IP + 2-byte port)*
 *                      FF FF FF FF "getserversExtResponse" ("\" v4 entry | "/" + 16-byte
 *                      IP + 2-byte port)*; datagrams of at most 1400 bytes, the last one
 *                      ending in "\EOT\0\0\0".
 *
 * Parsers return NULL on success or a short reason ("bad_header", "too_long", ...) that
 * the caller counts in /metrics; they never read outside [p, p+n). */
#ifndef SD_MASTER_Q3_H
#define SD_MASTER_Q3_H

#include <stddef.h>
#include <stdint.h>

#include "master.h"

#define SD_Q3_DGRAM_MAX 1400
#define SD_Q3_EOT "\\EOT\0\0\0"
#define SD_Q3_EOT_LEN 7

typedef enum {
    SD_Q3_NONE = 0,
    SD_Q3_HEARTBEAT,
    SD_Q3_INFORESPONSE,
    SD_Q3_GETSERVERS,
    SD_Q3_GETSERVERSEXT,
} sd_q3_kind_t;

/* The message type of a datagram that starts with FF FF FF FF, or SD_Q3_NONE. */
sd_q3_kind_t sd_q3_kind(const uint8_t *p, size_t n);

/* "heartbeat <protocol string>[\n]": copies the protocol string (1..63 printable). */
const char *sd_q3_parse_heartbeat(const uint8_t *p, size_t n, char *tag, size_t tagcap);

/* Writes FF FF FF FF "getinfo <challenge>" into out; returns its length or 0 when cap is
 * too small or the challenge has a character the protocol forbids. */
size_t sd_q3_encode_getinfo(const char *challenge, uint8_t *out, size_t cap);

/* Reads the next "\key\value" pair of an infostring at *pos (advanced past it). Returns
 * 1 with a pair, 0 at the end, or -1 on a malformed string (a key or value too long for
 * its buffer, a control byte, a key without a value). */
int sd_infostring_next(const uint8_t *p, size_t n, size_t *pos, char *key, size_t kcap,
                       char *val, size_t vcap);

/* The info keys both heartbeat dialects carry (Quake III infoResponse, GoldSrc info), each
 * under its dialect's own name and with its own error code for a bad value. */
enum { SD_INFO_PROTOCOL, SD_INFO_PLAYERS, SD_INFO_MAX, SD_INFO_BOTS, SD_INFO_GAME, SD_INFO_MAP };
typedef struct {
    const char *key; /* the dialect's name for the field */
    int field;       /* SD_INFO_* */
    const char *bad; /* the error code for a bad value */
} sd_info_key_t;

/* Stores val into s when key names one of the n fields of keys: 1 with the field's bit
 * (1 << SD_INFO_*) set in *have, 0 when key is none of them, -1 with *bad set to the
 * field's error code when val is out of range (protocol 0-2^30, players and bots 0-65535,
 * max 1-65535; a game is 1-64 characters without blanks; text is kept printable). */
int sd_info_field(const sd_info_key_t *keys, size_t n, const char *key, const char *val,
                  sd_master_server_t *s, unsigned *have, const char **bad);

/* Copies src into dst keeping printable ASCII only (others, and '\\', become '?'), so
 * text from a datagram is always valid JSON and log text. */
void sd_info_copy(char *dst, size_t cap, const char *src);

/* A whole decimal number in [min,max] into *out; 0 or -1. */
int sd_info_num(const char *s, int64_t min, int64_t max, int *out);

/* "infoResponse\n\..." into s (game, map, name, players, max_players, bots, password,
 * protocol, gametype) and the challenge. A Q3A server without gamename is
 * "Quake3Arena" (dpmaster's rule). */
const char *sd_q3_parse_inforesponse(const uint8_t *p, size_t n, sd_master_server_t *s,
                                     char *challenge, size_t chalcap);

typedef struct {
    int ext;            /* getserversExt */
    char game[65];
    int protocol;
    int empty, full;    /* include empty / full servers */
    int gametype;       /* -1: any */
    int ipv4, ipv6;     /* family options (Ext); neither means both */
} sd_q3_query_t;

const char *sd_q3_parse_getservers(const uint8_t *p, size_t n, sd_q3_query_t *q);

/* Turns a query into the master-list filter program. */
void sd_q3_query_filter(const sd_q3_query_t *q, sd_master_filter_t *f);

/* Builds the reply datagrams: begin, add entries until add says the datagram is full
 * (cut it, send it, begin again and re-add), then end appends the EOT mark (room for it
 * is always kept). Every entry is followed by a separator in its own datagram: the next
 * entry's, the EOT mark's, or the one cut appends, because ioquake3's client (and qstat)
 * read an entry only when a byte follows it. */
typedef struct {
    uint8_t buf[SD_Q3_DGRAM_MAX];
    size_t len;
    int ext;
    int count;
} sd_q3_writer_t;

void sd_q3_resp_begin(sd_q3_writer_t *w, int ext);
/* family 4: ip is 4 bytes; family 6 (Ext only): 16 bytes. port in host order.
 * Returns 0 when added, -1 when the datagram is full (or v6 in a non-Ext reply). */
int sd_q3_resp_add(sd_q3_writer_t *w, int family, const uint8_t *ip, uint16_t port);
void sd_q3_resp_end(sd_q3_writer_t *w);
/* Ends a full datagram that is not the last: appends the separator '\'. */
void sd_q3_resp_cut(sd_q3_writer_t *w);

/* Parses an address key ("1.2.3.4:27960" / "[v6]:port") into bytes; 4, 6 or -1. */
int sd_master_key_bytes(const char *key, uint8_t ip[16], uint16_t *port);

#endif
