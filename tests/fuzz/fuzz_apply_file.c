/* libFuzzer target: sdctl apply's file parser (ctl/cmd_apply.c, ctl_apply_parse).
 * Properties: an accepted file gives an object of service specs (objects, none of them
 * still carrying "name" when it came from the array form); a refusal says why. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ctl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    err[0] = '\0';
    json_t *out = ctl_apply_parse((const char *)data, size, err, sizeof err);
    if (!out) {
        if (!err[0])
            __builtin_trap();
        return 0;
    }
    if (!json_is_object(out))
        __builtin_trap();
    json_t *doc = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (json_is_array(doc)) {
        const char *name;
        json_t *spec;
        json_object_foreach(out, name, spec)
            if (!json_is_object(spec) || json_object_get(spec, "name"))
                __builtin_trap();
    }
    json_decref(doc);
    json_decref(out);
    return 0;
}
