/* libFuzzer target: the primary's placement function (bigbrother/cluster/placement.c) on any
 * GET /state document. It either refuses the document or answers lists whose promises
 * hold: an object of machine -> array, every entry names a service and a slot, and no
 * (service, slot) is given to two machines. The document's member "ready" (an object
 * "machine|service|slot" -> instance), if any, is the ready map. Seeds: tests/fuzz/corpus/placement/. Build
 * (clang): clang -g -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Ibigbrother \
 *   tests/fuzz/fuzz_placement.c bigbrother/cluster/placement.c -ljansson -o fuzz_placement */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cluster/bb_cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    json_t *state = json_loadb((const char *)data, size, 0, NULL);
    if (!state)
        return 0;
    /* the ready map from the document's own "ready" member, if any (give-backs) */
    json_t *ready = json_object_get(state, "ready");
    ready = json_is_object(ready) ? json_incref(ready) : json_object();
    json_t *inflight = json_object(), *out = NULL, *seen = json_object();
    bb_place_stats_t st;
    if (bb_place(state, ready, inflight, &out, &st) == 0) {
        if (!json_is_object(out))
            __builtin_trap();
        const char *m;
        json_t *list;
        json_object_foreach(out, m, list) {
            if (!json_is_array(list))
                __builtin_trap();
            size_t i;
            json_t *e;
            json_array_foreach(list, i, e) {
                const char *svc = json_string_value(json_object_get(e, "service"));
                json_t *slot = json_object_get(e, "slot");
                if (!svc || !json_is_integer(slot) || json_integer_value(slot) < 0)
                    __builtin_trap();
                char key[600];
                snprintf(key, sizeof(key), "%s#%lld", svc, (long long)json_integer_value(slot));
                if (json_object_get(seen, key))
                    __builtin_trap();
                json_object_set_new(seen, key, json_true());
            }
        }
    } else if (out) {
        __builtin_trap();
    }
    json_decref(out);
    json_decref(seen);
    json_decref(ready);
    json_decref(inflight);
    json_decref(state);
    return 0;
}
