/* libFuzzer target: the JSON body parser, the field getters (sdjson.h) and the validator
 * with field paths (sdvalid.h) every handler and config reader uses. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "sdjson.h"
#include "sdvalid.h"

static const char *const keys[] = {"id", "type", "instance", "pid", "events", NULL};

/* Runs every validator getter on v and recurses into its members and entries, with the
 * path following along (keys, map members and indexes alternate to cover each push). */
static void walk(sd_jv_t *jv, json_t *v)
{
    static const char *const types[] = {"started", "ready", "stopped", NULL};
    const char *s;
    int64_t i;
    int n;
    json_t *o;
    for (const char *const *k = keys; *k; k++) {
        sd_jv_str(jv, v, *k, SD_JV_OPTIONAL, 128, &s);
        sd_jv_name(jv, v, *k, SD_JV_REQUIRED, &s);
        sd_jv_int(jv, v, *k, SD_JV_NONNULL, 0, 1 << 22, &i);
        sd_jv_i32(jv, v, *k, SD_JV_OPTIONAL, -5, 5, &n);
        sd_jv_bool(jv, v, *k, SD_JV_OPTIONAL, &n);
        sd_jv_object(jv, v, *k, SD_JV_OPTIONAL, &o);
        sd_jv_array(jv, v, *k, SD_JV_OPTIONAL, 3, &o);
        sd_jv_enum(jv, v, *k, SD_JV_OPTIONAL, types, &n);
    }
    sd_jv_only_keys(jv, v, keys);
    const char *key;
    json_t *child;
    size_t idx;
    json_object_foreach(v, key, child) {
        size_t mark = json_object_size(v) % 2 ? sd_jv_key(jv, key) : sd_jv_member(jv, key);
        walk(jv, child);
        sd_jv_pop(jv, mark);
    }
    json_array_foreach(v, idx, child) {
        size_t mark = sd_jv_index(jv, idx);
        walk(jv, child);
        sd_jv_pop(jv, mark);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    json_t *v = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!v)
        return 0;
    sd_jv_t jv, fv;
    sd_jv_init(&jv, "", err, sizeof err);
    walk(&jv, v);
    sd_jv_init_file(&fv, "f.json", err, sizeof err);
    walk(&fv, v);
    free(sd_json_dump(v));
    json_decref(v);
    return 0;
}
