/* The ready vs desired series of a cluster: the samples serverdir's sweeper takes every
 * directory.series_interval_ms and keeps when a figure changed (directory.c,
 * lua/series_sample.lua), for the dashboard's chart. See directory.h for the Redis
 * layout. */
#include <stdio.h>

#include "directory.h"
#include "sd.h"

SD_ROUTE(GET, "/v1/clusters/{c}/series", SD_R_BB | SD_R_VIEWER, 0, h_series_get);

/* GET .../series -> {interval_ms, samples: [{ts_ms, ready, starting, desired, static},
 * ...]}, oldest first, at most SD_SERIES_MAX, each holding until the next (the last until
 * now); an unknown cluster has none. A sample of the release before `static` has 0 there.
 * One LRANGE. */
void h_series_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    if (sd_req_name(req, resp, 0, "cluster", &cluster))
        return;
    char key[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "LRANGE");
    sd_argv_add(&a, sd_key(key, sizeof key, cluster, "series"));
    sd_argv_addf(&a, "%d", -SD_SERIES_MAX);
    sd_argv_add(&a, "-1");
    redisReply *r = NULL;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        sd_resp_bad_reply(resp, "LRANGE series", r);
        freeReplyObject(r);
        return;
    }
    json_t *samples = json_array();
    for (size_t i = 0; i < r->elements; i++) {
        long long ts, ready, starting, desired, fixed = 0;
        if (r->element[i]->type != REDIS_REPLY_STRING ||
            sscanf(r->element[i]->str, "%lld %lld %lld %lld %lld", &ts, &ready, &starting,
                   &desired, &fixed) < 4)
            continue;
        json_array_append_new(samples,
                              json_pack("{s:I, s:I, s:I, s:I, s:I}", "ts_ms", (json_int_t)ts,
                                        "ready", (json_int_t)ready, "starting",
                                        (json_int_t)starting, "desired", (json_int_t)desired,
                                        "static", (json_int_t)fixed));
    }
    freeReplyObject(r);
    sd_resp_json(resp, 200, json_pack("{s:I, s:o}", "interval_ms",
                                      (json_int_t)sd_dir_cfg.series_interval_ms, "samples",
                                      samples));
}
