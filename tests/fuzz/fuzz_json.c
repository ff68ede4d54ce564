/* libFuzzer target: the JSON body parser and field getters every handler uses. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "sdjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    json_t *v = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!v)
        return 0;
    const char *s;
    int64_t i;
    int b;
    static const char *const keys[] = {"id", "type", "instance", "pid", "events", NULL};
    for (const char *const *k = keys; *k; k++) {
        sd_json_str(v, *k, 0, 128, &s, err, sizeof err);
        sd_json_name(v, *k, 0, &s, err, sizeof err);
        sd_json_int(v, *k, 0, 0, 1 << 22, &i, err, sizeof err);
        sd_json_bool(v, *k, 0, &b, err, sizeof err);
    }
    sd_json_only_keys(v, keys, err, sizeof err);
    free(sd_json_dump(v));
    json_decref(v);
    return 0;
}
