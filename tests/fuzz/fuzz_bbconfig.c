/* libFuzzer target: the bigbrother config parser (bigbrother/core/config.c). On any input it
 * either fails with a message naming the file, or yields a config whose promises hold:
 * socket paths fit sun_path, argv starts with the absolute command and is
 * NULL-terminated, every env entry is KEY=VALUE, timings and limits are in range.
 * Seeds: tests/fuzz/corpus/bbconfig/. Build (clang):
 *   clang -g -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Icommon -Ibigbrother \
 *     tests/fuzz/fuzz_bbconfig.c bigbrother/core/config.c common/sdjson.c common/sdutil.c \
 *     common/sdlog.c -ljansson -o fuzz_bbconfig
 *   ./fuzz_bbconfig tests/fuzz/corpus/bbconfig */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    bb_config_t c;
    char err[512];
    err[0] = 0;
    if (bb_config_parse(text, "fuzz.json", &c, err, sizeof(err))) {
        if (strncmp(err, "fuzz.json: ", 11))
            __builtin_trap();
        free(text);
        return 0;
    }
    if (strlen(c.agent_socket) >= BB_SOCK_PATH_MAX || strlen(c.notify_socket) >= BB_SOCK_PATH_MAX ||
        strlen(c.control_socket) >= BB_SOCK_PATH_MAX || c.state_dir[0] != '/')
        __builtin_trap();
    for (int i = 0; i < c.nservices; i++) {
        const bb_service_t *s = &c.services[i];
        if (strcmp(s->argv[0], s->command) || s->command[0] != '/')
            __builtin_trap();
        int n = 0;
        while (s->argv[n])
            n++;
        if (n > 257)
            __builtin_trap();
        for (char **e = s->env; *e; e++)
            if (!strchr(*e, '=') || **e == '=')
                __builtin_trap();
        if (s->restart.backoff_min_ms > s->restart.backoff_max_ms ||
            s->restart.max_restarts < 1 || s->restart.max_restarts > BB_WINDOW_MAX ||
            s->nrlimits > BB_MAX_RLIMITS || s->health.query_len > BB_PROBE_BYTES_MAX ||
            s->health.expect_len > BB_PROBE_BYTES_MAX || s->count < 0)
            __builtin_trap();
        if ((s->health.type == BB_H_TCP || s->health.type == BB_H_UDP ||
             s->health.type == BB_H_HTTP) &&
            (s->health.port < 1 || s->health.port > 65535))
            __builtin_trap();
        if (s->health.type == BB_H_UDP && s->health.query_len == 0)
            __builtin_trap();
        if (s->health.type == BB_H_HTTP &&
            (s->health.query_len < 16 || s->health.query_len >= sizeof(s->health.query) ||
             memcmp(s->health.query, "GET /", 5)))
            __builtin_trap();
        if (s->health.type == BB_H_EXEC && !s->health.command)
            __builtin_trap();
    }
    bb_config_free(&c);
    free(text);
    return 0;
}
