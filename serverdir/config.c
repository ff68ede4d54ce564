/* serverdir's settings with their defaults, and the top level of the --config file;
 * main.c reads the file, applies it here, then the flags. */
#include "sd.h"

#include <string.h>

#include "directory.h"
#include "sdjson.h"
#include "sdlog.h"
#include "sdutil.h"

sd_config_t sd_cfg = {
    .listen = "127.0.0.1:7700",
    .redis = "redis://127.0.0.1:6379/0",
    .key_prefix = "sd:",
    .threads = 8,
    .body_max = SD_BODY_MAX_DEFAULT,
    .blob_max = SD_BLOB_MAX_DEFAULT,
    .conn_timeout_s = 30,
};

static int cfg_str(const json_t *root, const char *key, char *dst, size_t cap, char *err,
                   size_t errcap)
{
    const char *s = NULL;
    int rc = sd_json_str(root, key, 0, cap - 1, &s, err, errcap);
    if (rc < 0)
        return -1;
    if (rc == 0)
        sd_strlcpy(dst, s, cap);
    return 0;
}

static int cfg_int(const json_t *root, const char *key, int64_t min, int64_t max,
                   int64_t *v, char *err, size_t errcap)
{
    return sd_json_int(root, key, 0, min, max, v, err, errcap) < 0 ? -1 : 0;
}

int sd_config_apply(json_t *root, sd_config_t *cfg, int *log_level, char *err, size_t errcap)
{
    static const char *const known[] = {
        "listen", "redis", "tokens", "key_prefix", "threads", "body_max_bytes",
        "blob_max_bytes", "conn_timeout_s", "log_level", "master", "locks", "directory", NULL};
    if (!json_is_object(root)) {
        snprintf(err, errcap, "the top level must be a JSON object");
        return -1;
    }
    if (sd_json_only_keys(root, known, err, errcap))
        return -1;
    sd_config_t c = *cfg; /* all or nothing */
    int64_t threads = c.threads, body = (int64_t)c.body_max, blob = (int64_t)c.blob_max,
            conn = c.conn_timeout_s;
    char level[16] = "";
    if (cfg_str(root, "listen", c.listen, sizeof c.listen, err, errcap) ||
        cfg_str(root, "redis", c.redis, sizeof c.redis, err, errcap) ||
        cfg_str(root, "tokens", c.tokens, sizeof c.tokens, err, errcap) ||
        cfg_str(root, "key_prefix", c.key_prefix, sizeof c.key_prefix, err, errcap) ||
        cfg_int(root, "threads", 1, 1024, &threads, err, errcap) ||
        cfg_int(root, "body_max_bytes", 1024, 64 << 20, &body, err, errcap) ||
        cfg_int(root, "blob_max_bytes", 1024, 64 << 20, &blob, err, errcap) ||
        cfg_int(root, "conn_timeout_s", 1, 3600, &conn, err, errcap) ||
        cfg_str(root, "log_level", level, sizeof level, err, errcap))
        return -1;
    int l = -1;
    if (level[0] && (l = sd_log_parse_level(level)) < 0) {
        snprintf(err, errcap, "field 'log_level' must be debug, info, warn or error");
        return -1;
    }
    char derr[SD_ERRMSG_MAX];
    if (sd_dir_config_load(json_object_get(root, "directory"), derr, sizeof derr)) {
        snprintf(err, errcap, "section directory: %s", derr);
        return -1;
    }
    c.threads = (int)threads;
    c.body_max = (size_t)body;
    c.blob_max = (size_t)blob;
    c.conn_timeout_s = (int)conn;
    c.file = root;
    *cfg = c;
    *log_level = l;
    return 0;
}
