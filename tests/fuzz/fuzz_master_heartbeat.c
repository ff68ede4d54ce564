/* libFuzzer target: the REST master heartbeat body (api_master.c,
 * sd_master_heartbeat_parse). Properties: an accepted heartbeat has a challenge, a port
 * 1..65535, a non-empty game, players <= max_players, bots <= players, at most 16 tags,
 * and every announced string is free of control bytes and backslashes (they separate
 * fields in the UDP protocols that relay these values). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "master.h"
#include "sd.h"
#include "sdjson.h"

static void clean(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f || *p == '\\')
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[SD_ERRMSG_MAX];
    json_t *body = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!body)
        return 0;
    if (json_is_object(body)) {
        sd_master_server_t s;
        memset(&s, 0, sizeof s);
        const char *chal = NULL;
        err[0] = '\0';
        if (sd_master_heartbeat_parse(body, &s, &chal, err, sizeof err) == 0) {
            if (!chal || s.port < 1 || s.port > 65535 || !s.game[0] || s.players > s.max_players ||
                s.bots > s.players || s.ntags < 0 || s.ntags > 16)
                __builtin_trap();
            clean(s.game);
            clean(s.map);
            clean(s.name);
            clean(s.version);
            clean(s.region);
            for (int i = 0; i < s.ntags; i++)
                clean(s.tags[i]);
        } else if (!err[0]) {
            __builtin_trap();
        }
    }
    json_decref(body);
    return 0;
}
