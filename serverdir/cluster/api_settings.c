/* A cluster's settings (docs/locks.md, "Locks die with their holder"): per-cluster
 * overrides of the serverdir-wide `locks` configuration for what a recorded stop does to
 * the instance's locks. Stored in the hash <base>settings (field absent: the serverdir
 * default applies), read by the directory's unlock drain (directory.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "locks.h"
#include "sdvalid.h"

SD_ROUTE(GET, "/v1/clusters/{c}/settings", SD_R_BB | SD_R_VIEWER, 0, h_settings_get);
SD_ROUTE(PUT, "/v1/clusters/{c}/settings", SD_R_OPS, 0, h_settings_put);

/* {cluster, locks: {release_on_stop, stop_lock_delay_ms}} with the effective values and,
 * under "overrides", the fields this cluster sets. */
static void settings_answer(sd_resp_t *resp, const char *cluster)
{
    int release;
    int64_t delay;
    int rc = sd_cluster_stop_locks(cluster, &release, &delay);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    json_t *locks = json_pack("{s:b, s:I}", "release_on_stop", release, "stop_lock_delay_ms",
                              (json_int_t)delay);
    json_t *overrides = json_object();
    if (release != sd_locks_cfg.release_on_stop)
        json_object_set_new(overrides, "release_on_stop", json_boolean(release));
    if (delay != sd_locks_cfg.stop_lock_delay_ms)
        json_object_set_new(overrides, "stop_lock_delay_ms", json_integer(delay));
    sd_resp_json(resp, 200, json_pack("{s:s, s:o, s:{s:o}}", "cluster", cluster, "locks", locks,
                                      "overrides", "locks", overrides));
}

/* GET /v1/clusters/{c}/settings -> the settings in effect. */
void h_settings_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    settings_answer(resp, cluster);
}

/* PUT /v1/clusters/{c}/settings {"locks": {"release_on_stop"?, "stop_lock_delay_ms"?}}
 * (ops): replaces the cluster's overrides; a field left out (or null) falls back to the
 * serverdir default. Answers as GET. */
void h_settings_put(sd_req_t *req, sd_resp_t *resp)
{
    static const char *const top[] = {"locks", NULL};
    static const char *const lk[] = {"release_on_stop", "stop_lock_delay_ms", NULL};
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return;
    char err[SD_ERRMSG_MAX];
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, sizeof err);
    json_t *locks = NULL;
    int release = -1;
    int64_t delay = -1;
    int bad = sd_jv_only_keys(&jv, body, top) ||
              sd_jv_object(&jv, body, "locks", SD_JV_OPTIONAL, &locks) < 0;
    if (!bad && locks) {
        size_t m = sd_jv_key(&jv, "locks");
        bad = sd_jv_only_keys(&jv, locks, lk) ||
              sd_jv_bool(&jv, locks, "release_on_stop", SD_JV_OPTIONAL, &release) < 0 ||
              sd_jv_int(&jv, locks, "stop_lock_delay_ms", SD_JV_OPTIONAL, 0, 600000, &delay) < 0;
        sd_jv_pop(&jv, m);
    }
    json_decref(body);
    if (bad) {
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    /* each field goes straight from its old value to the new one (HSET) or to the
     * default (HDEL) */
    char key[256];
    sd_key(key, sizeof key, cluster, "%s", "settings");
    int rc = SD_STORE_OK;
    for (int pass = 0; pass < 2 && rc == SD_STORE_OK; pass++) {
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, pass ? "HDEL" : "HSET");
        sd_argv_add(&a, key);
        if ((release >= 0) == !pass) {
            sd_argv_add(&a, "locks_release_on_stop");
            if (!pass)
                sd_argv_add(&a, release ? "1" : "0");
        }
        if ((delay >= 0) == !pass) {
            sd_argv_add(&a, "locks_stop_lock_delay_ms");
            if (!pass)
                sd_argv_addf(&a, "%lld", (long long)delay);
        }
        if (a.argc > 2) {
            redisReply *r = NULL;
            rc = sd_store_command(&a, &r);
            if (r)
                freeReplyObject(r);
        }
        sd_argv_free(&a);
    }
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    log_info("cluster settings changed", "cluster=%s release_on_stop=%s stop_lock_delay_ms=%lld",
             cluster, release < 0 ? "default" : release ? "true" : "false", (long long)delay);
    settings_answer(resp, cluster);
}
