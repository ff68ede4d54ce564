/* A redis-server and a serverdir on it, with the options the test files differ in. */
#include "harness_stack.h"

#include <stdio.h>
#include <stdlib.h>

/* The pair h_stack_setup started, for h_stack_teardown (one setup at a time). */
static struct {
    h_redis_t *redis;
    h_serverdir_t *sd;
} stacked;

int h_sd_start(h_serverdir_t *s, const h_redis_t *r, const h_sd_opts_t *o)
{
    static const h_sd_opts_t defaults;
    if (!o)
        o = &defaults;
    const char *argv[40];
    int argc = 0;
    char udp[64], udp6[64];
    int port = 0, port6 = 0;
    if (o->config) {
        /* the series sampler off unless the test's config sets it (h_sd_default_config) */
        json_t *cfg = json_loads(o->config, 0, NULL);
        json_t *dir = json_object_get(cfg, "directory");
        if (json_is_object(cfg) && !dir)
            json_object_set_new(cfg, "directory", dir = json_object());
        if (json_is_object(dir) && !json_object_get(dir, "series_interval_ms"))
            json_object_set_new(dir, "series_interval_ms", json_integer(0));
        char *text = json_is_object(cfg) ? json_dumps(cfg, JSON_COMPACT) : NULL;
        argv[argc++] = "--config";
        argv[argc++] = h_write_file(h_tmpdir(), "sd.json", text ? text : o->config, 0644);
        free(text);
        json_decref(cfg);
    }
    if (o->master_udp) {
        port = h_free_port();
        snprintf(udp, sizeof udp, "127.0.0.1:%d", port);
        argv[argc++] = "--master-udp";
        argv[argc++] = udp;
    }
    if (o->master_udp6) {
        port6 = h_free_port();
        snprintf(udp6, sizeof udp6, "[::1]:%d", port6);
        argv[argc++] = "--master-udp";
        argv[argc++] = udp6;
    }
    for (const char *const *e = o->extra; e && *e && argc < 39; e++)
        argv[argc++] = *e;
    argv[argc] = NULL;
    if (h_serverdir_start(s, r->url, o->open ? NULL : h_tokens_file(), argv))
        return -1;
    s->udp_port = port;
    s->udp6_port = port6;
    return 0;
}

int h_stack_start(h_redis_t *r, h_serverdir_t *s, const h_sd_opts_t *o)
{
    if (h_redis_start(r) || h_sd_start(s, r, o))
        return -1;
    return 0;
}

void h_stack_stop(h_redis_t *r, h_serverdir_t *s)
{
    h_serverdir_stop(s);
    h_redis_stop(r);
}

int h_stack_setup(void **state, h_redis_t *r, h_serverdir_t *s, const h_sd_opts_t *o)
{
    (void)state;
    stacked.redis = r;
    stacked.sd = s;
    return h_stack_start(r, s, o);
}

int h_stack_teardown(void **state)
{
    (void)state;
    h_stack_stop(stacked.redis, stacked.sd);
    return 0;
}
