/* serverdir's settings with their defaults, and the one place the --config file is
 * applied: the top level here, each module's section through its X_config_load (same
 * signature, same contract: 0, or -1 with err and nothing changed). main.c reads the
 * file, applies it here, then the flags. */
#include "sd.h"

#include <string.h>

#include "cred.h"
#include "directory.h"
#include "locks.h"
#include "master.h"
#include "quota.h"
#include "sdlog.h"
#include "sdutil.h"
#include "sdvalid.h"

sd_config_t sd_cfg = {
    .listen = "127.0.0.1:7700",
    .redis = "redis://127.0.0.1:6379/0",
    .key_prefix = "sd:",
    .threads = 8,
    .body_max = SD_BODY_MAX_DEFAULT,
    .blob_max = SD_BLOB_MAX_DEFAULT,
    .conn_timeout_s = 30,
    .max_connections = 4096,
    /* connection limits and deadlines (http/conn.h) */
    .max_connections_per_source = 256,
    .header_timeout_ms = 10000,
    .body_timeout_ms = 60000,
};

/* The connection limits and deadlines (http/conn.h): 0, or -1 with err and c unchanged. */
static int conn_limits_load(sd_jv_t *v, const json_t *root, sd_config_t *c)
{
    int64_t per = c->max_connections_per_source, head = c->header_timeout_ms,
            body = c->body_timeout_ms;
    if (sd_jv_int(v, root, "max_connections_per_source", 0, 0, 65536, &per) < 0 ||
        sd_jv_int(v, root, "header_timeout_ms", 0, 100, 3600000, &head) < 0 ||
        sd_jv_int(v, root, "body_timeout_ms", 0, 100, 3600000, &body) < 0)
        return -1;
    c->max_connections_per_source = (int)per;
    c->header_timeout_ms = (int)head;
    c->body_timeout_ms = (int)body;
    return 0;
}

/* The modules' sections, loaded in this order. */
static const struct {
    const char *name;
    int (*load)(const json_t *section, char *err, size_t errcap);
} sections[] = {
    {"directory", sd_dir_config_load},
    {"locks", sd_locks_config_load},
    {"master", sd_master_config_load},
    {"credentials", sd_cred_config_load},
    {"quotas", sd_quota_config_load}, /* what one scope may hold (http/quota.h) */
};

/* Loads every section of root; on a refusal puts back what the earlier ones loaded. */
static int sections_load(const json_t *root, char *err, size_t errcap)
{
    sd_dir_config_t dir = sd_dir_cfg;
    sd_locks_cfg_t locks = sd_locks_cfg;
    sd_master_cfg_t master = sd_master_cfg;
    sd_cred_cfg_t cred = sd_cred_cfg;
    int64_t quota[SD_QUOTA_COUNT];
    memcpy(quota, sd_quota_limit, sizeof quota);
    for (size_t i = 0; i < SD_ARRAY_LEN(sections); i++) {
        char e[SD_ERRMSG_MAX] = "";
        if (sections[i].load(json_object_get(root, sections[i].name), e, sizeof e)) {
            snprintf(err, errcap, "section %s: %s", sections[i].name, e);
            sd_dir_cfg = dir;
            sd_locks_cfg = locks;
            sd_master_cfg = master;
            sd_cred_cfg = cred;
            memcpy(sd_quota_limit, quota, sizeof quota);
            return -1;
        }
    }
    return 0;
}

int sd_config_apply(json_t *root, sd_config_t *cfg, int *log_level, char *err, size_t errcap)
{
    static const char *const known[] = {
        "listen", "redis", "tokens", "key_prefix", "threads", "http_threads", "body_max_bytes",
        "blob_max_bytes", "conn_timeout_s", "max_connections", "log_level", "master", "locks", "directory",
        "max_connections_per_source", "header_timeout_ms", "body_timeout_ms", "credentials",
        "quotas", NULL};
    if (!json_is_object(root)) {
        snprintf(err, errcap, "the top level must be a JSON object");
        return -1;
    }
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (sd_jv_only_keys(&v, root, known))
        return -1;
    sd_config_t c = *cfg; /* all or nothing */
    const struct {
        const char *key;
        char *dst;
        size_t cap;
    } strs[] = {
        {"listen", c.listen, sizeof c.listen},
        {"redis", c.redis, sizeof c.redis},
        {"tokens", c.tokens, sizeof c.tokens},
        {"key_prefix", c.key_prefix, sizeof c.key_prefix},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(strs); i++) {
        const char *s = NULL;
        int rc = sd_jv_str(&v, root, strs[i].key, 0, strs[i].cap - 1, &s);
        if (rc < 0)
            return -1;
        if (rc == 0)
            sd_strlcpy(strs[i].dst, s, strs[i].cap);
    }
    int64_t threads = c.threads, http_threads = c.http_threads, body = (int64_t)c.body_max,
            blob = (int64_t)c.blob_max, conn = c.conn_timeout_s, maxconn = c.max_connections;
    const char *level = NULL;
    if (sd_jv_int(&v, root, "threads", 0, 1, 1024, &threads) < 0 ||
        sd_jv_int(&v, root, "http_threads", 0, 1, 1024, &http_threads) < 0 ||
        sd_jv_int(&v, root, "body_max_bytes", 0, 1024, 64 << 20, &body) < 0 ||
        sd_jv_int(&v, root, "blob_max_bytes", 0, 1024, 64 << 20, &blob) < 0 ||
        sd_jv_int(&v, root, "conn_timeout_s", 0, 1, 3600, &conn) < 0 ||
        sd_jv_int(&v, root, "max_connections", 0, 16, 65536, &maxconn) < 0 ||
        sd_jv_str(&v, root, "log_level", 0, 15, &level) < 0 || conn_limits_load(&v, root, &c))
        return -1;
    int l = -1;
    if (level && level[0] && (l = sd_log_parse_level(level)) < 0)
        return sd_jv_fail(&v, "log_level", "must be debug, info, warn or error");
    if (sections_load(root, err, errcap))
        return -1;
    c.threads = (int)threads;
    c.http_threads = (int)http_threads;
    c.body_max = (size_t)body;
    c.blob_max = (size_t)blob;
    c.conn_timeout_s = (int)conn;
    c.max_connections = (int)maxconn;
    c.file = root;
    *cfg = c;
    *log_level = l;
    return 0;
}
