/* libFuzzer target: the directory's body validation (directory.c): the events batch of
 * POST /v1/clusters/{c}/events (sd_dir_events_normalize) and the machine lease body of
 * PUT .../machines/{m} (sd_dir_machine_args). Properties: an accepted batch normalizes
 * to a JSON array with one entry per event, the count it reports, and normalizing is
 * deterministic; a refusal says why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "sdjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[SD_ERRMSG_MAX];
    json_t *body = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!body)
        return 0;
    char *out = NULL, *out2 = NULL;
    size_t n = 0, n2 = 0;
    err[0] = '\0';
    if (sd_dir_events_normalize(body, &out, &n, err, sizeof err) == 0) {
        json_t *arr = json_loads(out, 0, NULL);
        if (!json_is_array(arr) || json_array_size(arr) != n ||
            sd_dir_events_normalize(body, &out2, &n2, err, sizeof err) != 0 || n2 != n ||
            strcmp(out, out2) != 0)
            __builtin_trap();
        json_decref(arr);
        free(out);
        free(out2);
    } else if (!err[0]) {
        __builtin_trap();
    }
    sd_argv_t av;
    sd_argv_init(&av);
    err[0] = '\0';
    if (sd_dir_machine_args(body, &av, err, sizeof err) != 0 && !err[0])
        __builtin_trap();
    sd_argv_free(&av);
    json_decref(body);
    return 0;
}
