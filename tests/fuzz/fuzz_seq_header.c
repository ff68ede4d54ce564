/* libFuzzer target: the Lock-Seq / Blob-Seq header parser (sd_seq_parse in api_locks.c,
 * used by api_blobs.c and api_locks.c). Properties: an accepted value is 1..2^53, is all
 * decimal digits, and prints back to a value that parses the same. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "locks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char v[256];
    if (size >= sizeof v)
        return 0;
    memcpy(v, data, size);
    v[size] = '\0';
    int64_t seq = 0;
    if (sd_seq_parse(v, &seq) != 0)
        return 0;
    if (seq < 1 || seq > ((int64_t)1 << 53) || strlen(v) == 0)
        __builtin_trap();
    for (const char *p = v; *p; p++)
        if (*p < '0' || *p > '9')
            __builtin_trap();
    char back[32];
    snprintf(back, sizeof back, "%lld", (long long)seq);
    int64_t again = 0;
    if (sd_seq_parse(back, &again) != 0 || again != seq)
        __builtin_trap();
    return 0;
}
