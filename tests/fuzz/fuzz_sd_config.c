/* libFuzzer target: serverdir's --config file as serverdir reads it: the top level
 * (sd_config_apply: known keys, bounds, then the Redis URL it names through
 * sd_store_init) and the sections "directory" (sd_dir_config_load), "locks"
 * (sd_locks_config_load) and "master" (sd_master_config_load).
 * Properties: an accepted top level or locks section holds values within the documented
 * bounds, a refused one changes nothing, loading a master section twice gives the same
 * lists, a refusal always says why. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "directory.h"
#include "locks.h"
#include "master.h"
#include "sd.h"
#include "sdjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[SD_ERRMSG_MAX];
    json_t *root = sd_json_parse((const char *)data, size, SD_JSON_MAX_DEPTH, err, sizeof err);
    if (!root)
        return 0;
    sd_config_t c, before;
    memcpy(&c, &sd_cfg, sizeof c);
    memcpy(&before, &sd_cfg, sizeof before);
    int level = -2;
    err[0] = '\0';
    if (sd_config_apply(root, &c, &level, err, sizeof err)) {
        if (!err[0] || memcmp(&c, &before, sizeof c) || level != -2)
            __builtin_trap();
    } else {
        if (c.threads < 1 || c.threads > 1024 || c.http_threads < 0 || c.http_threads > 1024 ||
            c.body_max < 1024 || c.body_max > 64 << 20 ||
            c.blob_max < 1024 || c.blob_max > 64 << 20 || c.conn_timeout_s < 1 ||
            c.conn_timeout_s > 3600 || level < -1 || level > 3 || c.file != root ||
            strnlen(c.listen, sizeof c.listen) == sizeof c.listen ||
            strnlen(c.redis, sizeof c.redis) == sizeof c.redis ||
            strnlen(c.tokens, sizeof c.tokens) == sizeof c.tokens ||
            strnlen(c.key_prefix, sizeof c.key_prefix) == sizeof c.key_prefix)
            __builtin_trap();
        int rc = sd_store_init(c.redis, c.key_prefix);
        if (rc != 0 && rc != -EINVAL)
            __builtin_trap();
    }
    err[0] = '\0';
    if (sd_dir_config_load(json_object_get(root, "directory"), err, sizeof err) && !err[0])
        __builtin_trap();
    err[0] = '\0';
    if (sd_locks_config_load(json_object_get(root, "locks"), err, sizeof err) == 0) {
        const sd_locks_cfg_t lc = sd_locks_cfg;
        if (lc.lock_delay_ms < 0 || lc.lock_delay_ms > 600000 || lc.wait_replicas < 0 ||
            lc.wait_replicas > 16 || lc.max_waiters < 1 || lc.max_waiters > 4096 ||
            lc.max_wait_ms < 0 || lc.max_wait_ms > SD_LOCKS_WAIT_CAP_MS)
            __builtin_trap();
    } else if (!err[0]) {
        __builtin_trap();
    }
    /* loading the same section twice gives the same lists (they are set, not appended
     * to: an appending loader overflowed udp[] across loads, the regression input) */
    for (int pass = 0; pass < 2; pass++) {
        int ntrusted = sd_master_cfg.ntrusted, nudp = sd_master_cfg.nudp;
        err[0] = '\0';
        int rc = sd_master_config_load(json_object_get(root, "master"), err, sizeof err);
        if (rc && !err[0])
            __builtin_trap();
        if (sd_master_cfg.ntrusted < 0 || sd_master_cfg.ntrusted > 16 || sd_master_cfg.nudp < 0 ||
            sd_master_cfg.nudp > SD_MASTER_MAX_UDP)
            __builtin_trap();
        if (pass == 1 && rc == 0 &&
            (sd_master_cfg.ntrusted != ntrusted || sd_master_cfg.nudp != nudp))
            __builtin_trap();
    }
    json_decref(root);
    return 0;
}
