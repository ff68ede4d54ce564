/* Valve's master protocols (Valve Developer Wiki, "Master Server Query Protocol", and the
 * GoldSrc/Source server-to-master heartbeat): pure parsers and encoders, no I/O.
 *
 * Query (client -> master):  0x31 <region byte> "<seed ip:port>\0" "<filter>\0"
 *   seed 0.0.0.0:0 starts a walk; the next query's seed is the last address received.
 * Reply (master -> client):  FF FF FF FF 66 0A then 6-byte entries (4-byte IP, 2-byte
 *   port, big-endian), one datagram per query; the last batch ends with 0.0.0.0:0.
 * Heartbeat (server -> master):
 *   "q"                      challenge request
 *   FF FF FF FF 73 0A <u32>  challenge reply ('s', little-endian challenge)
 *   "0\n\protocol\7\challenge\<n>\players\..\max\..\bots\..\gamedir\..\map\..
 *    \password\0\os\l\lan\0\region\255\type\d\secure\1\version\..\product\..\n"
 *   "b\n"                    the server shuts down
 *
 * Parsers return NULL on success or a short reason that the caller counts. */
#ifndef SD_MASTER_VALVE_H
#define SD_MASTER_VALVE_H

#include <stddef.h>
#include <stdint.h>

#include "master.h"

#define SD_VALVE_DGRAM_MAX 1400
#define SD_VALVE_HDR_LEN 6
/* Entries per reply datagram, keeping room for the 0.0.0.0:0 terminator. */
#define SD_VALVE_BATCH ((SD_VALVE_DGRAM_MAX - SD_VALVE_HDR_LEN - 6) / 6)

typedef struct {
    int region;                          /* 0..7, 255 = world */
    char seed[SD_MASTER_ADDR_MAX];       /* "" for 0.0.0.0:0 */
    int seed_garbage;                    /* bytes after the seed's address were ignored */
    sd_master_filter_t filter;
} sd_valve_query_t;

/* Parses a 0x31 query; the filter keys become master-list filter terms (see docs/master.md
 * for the keys understood; other keys count as conditions that always hold). */
const char *sd_valve_parse_query(const uint8_t *p, size_t n, sd_valve_query_t *q);

/* The region name stored for a Valve region byte ("" for 255 / unknown). */
const char *sd_valve_region_name(int region);

/* Writes the reply header + n IPv4 entries (+ the terminator when last) into out (at least
 * SD_VALVE_DGRAM_MAX bytes); n <= SD_VALVE_BATCH. Returns the length. */
size_t sd_valve_encode_reply(const uint8_t (*ips)[4], const uint16_t *ports, int n, int last,
                             uint8_t *out);

typedef enum {
    SD_GS_NONE = 0,
    SD_GS_CHALLENGE_REQ, /* "q" */
    SD_GS_INFO,          /* "0\n\..." */
    SD_GS_QUIT,          /* "b\n" */
} sd_gs_kind_t;

sd_gs_kind_t sd_gs_kind(const uint8_t *p, size_t n);
/* Writes FF FF FF FF 's' '\n' + challenge (little-endian); returns 10. */
size_t sd_gs_encode_challenge(uint32_t challenge, uint8_t *out);
/* The "0\n" info string into s and the challenge number. */
const char *sd_gs_parse_info(const uint8_t *p, size_t n, sd_master_server_t *s,
                             uint32_t *challenge);

#endif
