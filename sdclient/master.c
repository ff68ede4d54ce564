/* libsdclient: the master list (challenge, heartbeat, termination, batched query). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdclient.h"

int sdc_master_challenge(sdc_t *c, char *chal, size_t cap, int64_t *expires_in_ms,
                         sdc_err_t *err)
{
    json_t *out = NULL;
    int rc = sdc_request(c, "POST", "/v1/master/challenge", NULL, &out, err);
    if (rc)
        return rc;
    const char *s = json_string_value(json_object_get(out, "challenge"));
    json_t *exp = json_object_get(out, "expires_in_ms");
    if (!s || strlen(s) >= cap || !json_is_integer(exp)) {
        json_decref(out);
        return SDC_E_PROTO;
    }
    memcpy(chal, s, strlen(s) + 1);
    if (expires_in_ms)
        *expires_in_ms = json_integer_value(exp);
    json_decref(out);
    return SDC_OK;
}

/* Sets key to a string when s is given. */
static void set_str(json_t *o, const char *key, const char *s)
{
    if (s)
        json_object_set_new(o, key, json_string(s));
}

/* The heartbeat; addr (may be NULL) gets the address the master listed. */
static int heartbeat(sdc_t *c, const char *challenge, const sdc_master_server_t *s,
                     int64_t *expires_in_ms, char *addr, size_t addrcap, sdc_err_t *err)
{
    if (!challenge || !s || !s->game)
        return SDC_E_INVAL;
    json_t *body = json_pack("{s:s, s:i, s:s, s:i, s:i, s:i, s:b}", "challenge", challenge,
                             "port", s->port, "game", s->game, "players", s->players,
                             "max_players", s->max_players, "bots", s->bots, "password",
                             s->password);
    if (!body)
        return SDC_E_NOMEM;
    set_str(body, "map", s->map);
    set_str(body, "name", s->name);
    set_str(body, "region", s->region);
    set_str(body, "version", s->version);
    if (s->cluster && s->instance) {
        set_str(body, "cluster", s->cluster);
        set_str(body, "instance", s->instance);
    }
    if (s->ntags > 0) {
        json_t *tags = json_array();
        for (int i = 0; i < s->ntags; i++)
            json_array_append_new(tags, json_string(s->tags[i]));
        json_object_set_new(body, "tags", tags);
    }
    if (s->protocol >= 0)
        json_object_set_new(body, "protocol", json_integer(s->protocol));
    if (s->gametype >= 0)
        json_object_set_new(body, "gametype", json_integer(s->gametype));
    json_t *out = NULL;
    int rc = sdc_request(c, "POST", "/v1/master/heartbeat", body, &out, err);
    json_decref(body);
    if (rc)
        return rc;
    json_t *exp = json_object_get(out, "expires_in_ms");
    const char *listed = json_string_value(json_object_get(out, "address"));
    if (!json_is_integer(exp) || (addr && (!listed || strlen(listed) >= addrcap))) {
        json_decref(out);
        return SDC_E_PROTO;
    }
    if (expires_in_ms)
        *expires_in_ms = json_integer_value(exp);
    if (addr)
        memcpy(addr, listed, strlen(listed) + 1);
    json_decref(out);
    return SDC_OK;
}

int sdc_master_heartbeat(sdc_t *c, const char *challenge, const sdc_master_server_t *s,
                         int64_t *expires_in_ms, sdc_err_t *err)
{
    return heartbeat(c, challenge, s, expires_in_ms, NULL, 0, err);
}

int sdc_master_announce(sdc_t *c, const sdc_master_server_t *s, int64_t *expires_in_ms,
                        sdc_err_t *err)
{
    return sdc_master_announce_addr(c, s, NULL, 0, expires_in_ms, err);
}

int sdc_master_announce_addr(sdc_t *c, const sdc_master_server_t *s, char *addr,
                             size_t addrcap, int64_t *expires_in_ms, sdc_err_t *err)
{
    char chal[64];
    int rc = sdc_master_challenge(c, chal, sizeof chal, NULL, err);
    if (rc)
        return rc;
    return heartbeat(c, chal, s, expires_in_ms, addr, addrcap, err);
}

int sdc_master_terminate(sdc_t *c, const char *addr, sdc_err_t *err)
{
    char esc[200], path[256];
    if (!addr || strlen(addr) > 64)
        return SDC_E_INVAL;
    snprintf(path, sizeof path, "/v1/master/servers/%s", sdc_escape(addr, esc, sizeof esc));
    json_t *out = NULL;
    int rc = sdc_request(c, "DELETE", path, NULL, &out, err);
    json_decref(out);
    return rc;
}

/* Appends "&name=escaped(value)" to the query when value is set. */
static void add_param(char *q, size_t cap, const char *name, const char *value)
{
    if (!value || !*value)
        return;
    char esc[256];
    size_t n = strlen(q);
    snprintf(q + n, cap - n, "&%s=%s", name, sdc_escape(value, esc, sizeof esc));
}

int sdc_master_query(sdc_t *c, const sdc_master_filter_t *f, const char *after, int limit,
                     json_t **servers, char *next, size_t nextcap, sdc_err_t *err)
{
    char path[1024];
    *servers = NULL;
    snprintf(path, sizeof path, "/v1/master/servers?limit=%d", limit > 0 ? limit : 100);
    if (f) {
        add_param(path, sizeof path, "game", f->game);
        add_param(path, sizeof path, "map", f->map);
        add_param(path, sizeof path, "region", f->region);
        add_param(path, sizeof path, "tags", f->tags);
        add_param(path, sizeof path, "not_empty", f->not_empty ? "1" : NULL);
        add_param(path, sizeof path, "not_full", f->not_full ? "1" : NULL);
        add_param(path, sizeof path, "no_password", f->no_password ? "1" : NULL);
    }
    add_param(path, sizeof path, "after", after);
    json_t *out = NULL;
    int rc = sdc_request(c, "GET", path, NULL, &out, err);
    if (rc)
        return rc;
    json_t *arr = json_object_get(out, "servers");
    json_t *nx = json_object_get(out, "next");
    if (!json_is_array(arr) || !(json_is_null(nx) || json_is_string(nx)) ||
        (json_is_string(nx) && strlen(json_string_value(nx)) >= nextcap)) {
        json_decref(out);
        return SDC_E_PROTO;
    }
    snprintf(next, nextcap, "%s", json_is_string(nx) ? json_string_value(nx) : "");
    *servers = json_incref(arr);
    json_decref(out);
    return SDC_OK;
}
