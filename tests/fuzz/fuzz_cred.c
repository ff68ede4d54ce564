/* libFuzzer target: an instance credential as serverdir parses it before any key is
 * used (sd_cred_parse: the JWT shape, base64url, the header's alg and kid, the claims).
 * Properties: an accepted one has a 16-character kid, names that are names, a
 * generation >= 0 and an expiry after now; a refusal always says why; the shape test
 * agrees with the parser. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cred.h"
#include "sdname.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *tok = (const char *)data;
    char kid[32] = "";
    sd_cred_id_t id;
    int64_t exp_s = 0, now_s = 1700000000;
    memset(&id, 0, sizeof id);
    const char *why = sd_cred_parse(tok, size, now_s, kid, sizeof kid, &id, &exp_s);
    if (why) {
        if (!*why)
            __builtin_trap();
        return 0;
    }
    if (!sd_cred_shaped(tok, size) || strlen(kid) != 16 || exp_s <= now_s ||
        id.generation < 0 || !sd_name_valid(id.cluster, SD_NAME_MAX) ||
        !sd_name_valid(id.machine, SD_NAME_MAX) || !sd_name_valid(id.service, SD_NAME_MAX) ||
        !sd_name_valid(id.instance, SD_NAME_MAX))
        __builtin_trap();
    return 0;
}
