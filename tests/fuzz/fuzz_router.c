/* libFuzzer target: path routing against the real generated route table. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const methods[] = {"GET", "PUT", "POST", "DELETE", "HEAD", "PATCH"};
    if (size < 1 || size > 2048)
        return 0;
    char path[2049];
    memcpy(path, data + 1, size - 1);
    path[size - 1] = '\0';
    char scratch[SD_PATH_MAX];
    const char *params[SD_MAX_PARAMS];
    int np = 0;
    char allow[64];
    int r = sd_route_match(sd_routes, sd_nroutes, methods[data[0] % 6], path, scratch,
                           sizeof scratch, params, &np, allow, sizeof allow);
    if (r >= 0)
        for (int i = 0; i < np; i++)
            if (strlen(params[i]) == 0)
                __builtin_trap(); /* a parameter is never empty */
    return 0;
}
