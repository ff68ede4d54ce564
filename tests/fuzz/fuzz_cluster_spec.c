/* libFuzzer target: service spec validation, canonical form and diff (cluster_spec.c).
 * Properties checked: a valid spec stays valid through its canonical text, the canonical
 * text is a fixed point, and a spec compared with itself has no changes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[SD_ERRMSG_MAX];
    json_t *spec = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!spec)
        return 0;
    json_t *base = json_pack("{s:s, s:i}", "command", "/bin/g", "count", 3);
    json_t *changes = json_array();
    sd_spec_diff(base, spec, changes);
    sd_spec_diff(spec, base, changes);
    if (sd_spec_validate(spec, err, sizeof err) == 0) {
        char *text = sd_json_canonical(spec);
        json_t *again = text ? json_loads(text, 0, NULL) : NULL;
        char *text2 = again ? sd_json_canonical(again) : NULL;
        if (!again || sd_spec_validate(again, err, sizeof err) != 0 || !text2 ||
            strcmp(text, text2) != 0)
            __builtin_trap();
        json_t *none = json_array();
        sd_spec_diff(spec, again, none);
        if (json_array_size(none) != 0)
            __builtin_trap();
        json_decref(none);
        json_decref(again);
        free(text);
        free(text2);
    }
    json_decref(changes);
    json_decref(base);
    json_decref(spec);
    return 0;
}
