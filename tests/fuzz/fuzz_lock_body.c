/* libFuzzer target: lock request bodies (api_locks.c): PUT /v1/locks/{key} and
 * POST /v1/locks/acquire (sd_lock_req_parse) and POST /v1/locks/release
 * (sd_lock_release_parse). Properties: an accepted request has a holder and 1 to
 * SD_LOCKS_MAX_KEYS valid (sd_lock_name_valid: one {hash tag} allowed), distinct names
 * (acquire many / release) with release seqs
 * 1..2^53 and a well-formed lock_token per key; a refusal gives an error code and a
 * message. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "locks.h"
#include "sd.h"
#include "sdjson.h"
#include "sdutil.h"

static void check_names(const char *const *names, int n)
{
    if (n < 1 || n > SD_LOCKS_MAX_KEYS)
        __builtin_trap();
    for (int i = 0; i < n; i++) {
        if (!names[i] || !sd_lock_name_valid(names[i]))
            __builtin_trap();
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[SD_ERRMSG_MAX];
    json_t *body = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!body)
        return 0;
    for (int many = 0; many < 2; many++) {
        sd_lock_req_t a;
        memset(&a, 0, sizeof a);
        const char *code = NULL;
        err[0] = '\0';
        if (sd_lock_req_parse(body, many, &a, &code, err, sizeof err) == 0) {
            if (!a.holder || !*a.holder || a.ttl_ms < 0 || a.wait_ms < 0)
                __builtin_trap();
            if (many)
                check_names(a.names, a.n);
        } else if (!code || !err[0]) {
            __builtin_trap();
        }
    }
    sd_lock_rel_t rel;
    memset(&rel, 0, sizeof rel);
    const char *code = NULL;
    err[0] = '\0';
    if (sd_lock_release_parse(body, &rel, &code, err, sizeof err) == 0) {
        if (!rel.holder || !*rel.holder)
            __builtin_trap();
        check_names(rel.names, rel.n);
        for (int i = 0; i < rel.n; i++)
            if (rel.seqs[i] < 1 || rel.seqs[i] > SD_SEQ_MAX || !sd_lock_token_valid(rel.tokens[i]))
                __builtin_trap();
    } else if (!code || !err[0]) {
        __builtin_trap();
    }
    json_decref(body);
    return 0;
}
