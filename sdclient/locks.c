/* libsdclient: the lock table and the fenced blob store (docs/locks.md). Thin typed
 * wrappers over sdc_request / sdc_request_raw; every function validates its names first
 * so a bad argument never reaches the network. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdc_internal.h"
#include "sdproto.h"
#include "sdutil.h"

#define MANY_MAX 16

static int64_t jint(const json_t *o, const char *k, int64_t dflt)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

static void jcopy(const json_t *o, const char *k, char *buf, size_t cap)
{
    const char *s = json_string_value(json_object_get(o, k));
    snprintf(buf, cap, "%s", s ? s : "");
}

/* Adds the acquire options to body. */
static void opts_add(json_t *body, const char *holder, const sdc_lock_opts_t *o)
{
    json_object_set_new(body, "holder", json_string(holder));
    if (!o)
        return;
    if (o->ttl_ms > 0)
        json_object_set_new(body, "ttl_ms", json_integer(o->ttl_ms));
    if (o->wait_ms > 0)
        json_object_set_new(body, "wait_ms", json_integer(o->wait_ms));
    if (o->steal_if_holder_stopped)
        json_object_set_new(body, "steal_if_holder_stopped",
                            json_string(o->steal_if_holder_stopped));
    if (o->steal_if_older_than_ms > 0)
        json_object_set_new(body, "steal_if_older_than_ms",
                            json_integer(o->steal_if_older_than_ms));
}

/* One grant object of an answer into out; -1 when it lacks a lock_seq or lock_token. */
static int grant_parse(const json_t *g, sdc_lock_t *out)
{
    memset(out, 0, sizeof *out);
    jcopy(g, "key", out->key, sizeof out->key);
    out->lock_seq = jint(g, "lock_seq", 0);
    jcopy(g, "lock_token", out->lock_token, sizeof out->lock_token);
    if (!sd_lock_token_valid(out->lock_token))
        return -1;
    out->since_ms = jint(g, "since_ms", 0);
    out->expires_in_ms = jint(g, "expires_in_ms", -1);
    out->reacquired = json_is_true(json_object_get(g, "reacquired"));
    jcopy(g, "stolen_from", out->stolen_from, sizeof out->stolen_from);
    return out->lock_seq > 0 && out->key[0] ? 0 : -1;
}

/* The token an acquire presents: the grant's (opts->lock_token) or a fresh one of its own
 * (a retry of the same request then gets its grant back). -1 with err set. */
static int token_for(const sdc_lock_opts_t *o, char tok[SD_LOCK_TOKEN_LEN + 1], sdc_err_t *err)
{
    if (o && o->lock_token) {
        if (!sd_lock_token_valid(o->lock_token))
            return sdc__inval(err, "opts->lock_token must be a grant's lock_token");
        snprintf(tok, SD_LOCK_TOKEN_LEN + 1, "%s", o->lock_token);
        return 0;
    }
    if (sd_random_hex(tok, SD_LOCK_TOKEN_BYTES))
        return sdc__inval(err, "no randomness for a lock_token");
    return 0;
}

int sdc_lock_acquire(sdc_t *c, const char *key, const char *holder, const sdc_lock_opts_t *opts,
                     sdc_lock_t *out, sdc_err_t *err)
{
    if (!sd_lock_name_valid(key) || !sd_name_valid(holder, SD_NAME_MAX))
        return sdc__inval(err, "key and holder must be names");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 32], tok[SD_LOCK_TOKEN_LEN + 1];
    int rc = token_for(opts, tok, err);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "/v1/locks/%s", sdc_escape(key, esc, sizeof esc));
    json_t *body = json_object();
    opts_add(body, holder, opts);
    json_object_set_new(body, "lock_token", json_string(tok));
    json_t *ans = NULL;
    rc = sdc_request(c, "PUT", path, body, &ans, err);
    json_decref(body);
    if (rc == SDC_OK && (grant_parse(ans, out) || strcmp(out->lock_token, tok) != 0))
        rc = sdc__proto(err, "the grant has no lock_seq or not the lock_token presented");
    json_decref(ans);
    return rc;
}

int sdc_lock_acquire_many(sdc_t *c, const char *const *keys, int n, const char *holder,
                          const sdc_lock_opts_t *opts, sdc_lock_t *out, sdc_err_t *err)
{
    if (n < 1 || n > MANY_MAX || !sd_name_valid(holder, SD_NAME_MAX))
        return sdc__inval(err, "1 to 16 keys and a holder name are needed");
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        if (!sd_lock_name_valid(keys[i])) {
            json_decref(arr);
            return sdc__inval(err, "every key must be a name");
        }
        json_array_append_new(arr, json_string(keys[i]));
    }
    char tok[SD_LOCK_TOKEN_LEN + 1];
    if (token_for(opts, tok, err)) {
        json_decref(arr);
        return SDC_E_INVAL;
    }
    json_t *toks = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(toks, keys[i], json_string(tok));
    json_t *body = json_pack("{s:o, s:o}", "keys", arr, "lock_tokens", toks);
    opts_add(body, holder, opts);
    json_t *ans = NULL;
    int rc = sdc_request(c, "POST", "/v1/locks/acquire", body, &ans, err);
    json_decref(body);
    if (rc == SDC_OK) {
        const json_t *locks = json_object_get(ans, "locks");
        if (json_array_size(locks) != (size_t)n)
            rc = sdc__proto(err, "the answer does not list every key");
        for (int i = 0; rc == SDC_OK && i < n; i++)
            if (grant_parse(json_array_get(locks, (size_t)i), &out[i]) ||
                strcmp(out[i].key, keys[i]) != 0 || strcmp(out[i].lock_token, tok) != 0)
                rc = sdc__proto(err, "a grant has no lock_seq or names another key");
    }
    json_decref(ans);
    return rc;
}

/* 1 when lock is a grant this library can present: a key name, a lock_seq, a token. */
static int grant_ok(const sdc_lock_t *lock)
{
    return lock && sd_lock_name_valid(lock->key) && lock->lock_seq > 0 &&
           sd_lock_token_valid(lock->lock_token);
}

int sdc_lock_release(sdc_t *c, const sdc_lock_t *lock, const char *holder, sdc_err_t *err)
{
    if (!grant_ok(lock) || !sd_name_valid(holder, SD_NAME_MAX))
        return sdc__inval(err, "a grant (key, lock_seq, lock_token) and a holder name are needed");
    char ek[3 * SD_NAME_MAX + 1], eh[3 * SD_NAME_MAX + 1], path[6 * SD_NAME_MAX + 64], tok[64];
    snprintf(path, sizeof path, "/v1/locks/%s?holder=%s&lock_seq=%" PRId64,
             sdc_escape(lock->key, ek, sizeof ek), sdc_escape(holder, eh, sizeof eh),
             lock->lock_seq);
    snprintf(tok, sizeof tok, "Lock-Token: %s", lock->lock_token);
    const char *headers[] = {tok, NULL};
    return sdc_request_raw(c, "DELETE", path, headers, NULL, 0, NULL, NULL, NULL, NULL, 0, err);
}

int sdc_lock_release_many(sdc_t *c, const sdc_lock_t *locks, int n, const char *holder,
                          sdc_err_t *err)
{
    if (n < 1 || n > MANY_MAX || !sd_name_valid(holder, SD_NAME_MAX))
        return sdc__inval(err, "1 to 16 locks and a holder name are needed");
    for (int i = 0; i < n; i++)
        if (!grant_ok(&locks[i]))
            return sdc__inval(err, "every lock must be a grant (key, lock_seq, lock_token)");
    json_t *keys = json_array(), *seqs = json_object(), *toks = json_object();
    for (int i = 0; i < n; i++) {
        json_array_append_new(keys, json_string(locks[i].key));
        json_object_set_new(seqs, locks[i].key, json_integer(locks[i].lock_seq));
        json_object_set_new(toks, locks[i].key, json_string(locks[i].lock_token));
    }
    json_t *body = json_pack("{s:s, s:o, s:o, s:o}", "holder", holder, "keys", keys,
                             "lock_seqs", seqs, "lock_tokens", toks);
    int rc = sdc_request(c, "POST", "/v1/locks/release", body, NULL, err);
    json_decref(body);
    return rc;
}

int sdc_lock_renew(sdc_t *c, const sdc_lock_t *lock, const char *holder, int64_t ttl_ms,
                   int64_t *expires_in_ms, sdc_err_t *err)
{
    if (!grant_ok(lock) || !sd_name_valid(holder, SD_NAME_MAX))
        return sdc__inval(err, "a grant (key, lock_seq, lock_token) and a holder name are needed");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 32];
    snprintf(path, sizeof path, "/v1/locks/%s/renew", sdc_escape(lock->key, esc, sizeof esc));
    json_t *body = json_pack("{s:s, s:I, s:s}", "holder", holder, "lock_seq",
                             (json_int_t)lock->lock_seq, "lock_token", lock->lock_token);
    if (ttl_ms > 0)
        json_object_set_new(body, "ttl_ms", json_integer(ttl_ms));
    json_t *ans = NULL;
    int rc = sdc_request(c, "POST", path, body, &ans, err);
    json_decref(body);
    if (rc == SDC_OK && expires_in_ms)
        *expires_in_ms = jint(ans, "expires_in_ms", -1);
    json_decref(ans);
    return rc;
}

int sdc_lock_get(sdc_t *c, const char *key, sdc_lock_info_t *out, json_t **raw,
                 sdc_err_t *err)
{
    if (raw)
        *raw = NULL;
    if (!sd_lock_name_valid(key))
        return sdc__inval(err, "key must be a name");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 32];
    snprintf(path, sizeof path, "/v1/locks/%s", sdc_escape(key, esc, sizeof esc));
    json_t *ans = NULL;
    int rc = sdc_request(c, "GET", path, NULL, &ans, err);
    if (rc != SDC_OK)
        return rc;
    if (out) {
        memset(out, 0, sizeof *out);
        jcopy(ans, "key", out->key, sizeof out->key);
        const char *state = json_string_value(json_object_get(ans, "state"));
        out->held = state && strcmp(state, "held") == 0;
        jcopy(ans, "holder", out->holder, sizeof out->holder);
        out->lock_seq = jint(ans, "lock_seq", 0);
        out->since_ms = jint(ans, "since_ms", 0);
        out->held_for_ms = jint(ans, "held_for_ms", 0);
        out->expires_in_ms = jint(ans, "expires_in_ms", -1);
        out->lock_delay_ms = jint(ans, "lock_delay_ms", 0);
        if (!state)
            rc = sdc__proto(err, "the answer has no state");
    }
    if (raw && rc == SDC_OK)
        *raw = ans;
    else
        json_decref(ans);
    return rc;
}

int sdc_lock_list_by_holder(sdc_t *c, const char *holder, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    if (!sd_name_valid(holder, SD_NAME_MAX))
        return sdc__inval(err, "holder must be a name");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 32];
    snprintf(path, sizeof path, "/v1/locks?holder=%s", sdc_escape(holder, esc, sizeof esc));
    return sdc__walk(c, path, "locks", "cursor", "cursor", 1000000, out, err);
}

int sdc_lock_list(sdc_t *c, size_t max, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    if (max < 1)
        return sdc__inval(err, "max must be at least 1");
    return sdc__walk(c, "/v1/locks?limit=500", "locks", "cursor", "cursor", max, out, err);
}

/* DELETE <base><key><tail> (an ops action on one key); *out (may be NULL) the answer. */
static int key_delete(sdc_t *c, const char *base, const char *key, const char *tail,
                      json_t **out, sdc_err_t *err)
{
    if (out)
        *out = NULL;
    if (!sd_lock_name_valid(key))
        return sdc__inval(err, "key must be a name");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 48];
    snprintf(path, sizeof path, "%s%s%s", base, sdc_escape(key, esc, sizeof esc), tail);
    return sdc_request(c, "DELETE", path, NULL, out, err);
}

int sdc_lock_force_unlock(sdc_t *c, const char *key, json_t **out, sdc_err_t *err)
{
    return key_delete(c, "/v1/locks/", key, "?force=true", out, err);
}

/* The Lock-Seq and Lock-Token headers of a grant into h1, h2. */
static void grant_headers(const sdc_lock_t *lock, char *h1, size_t cap1, char *h2, size_t cap2)
{
    snprintf(h1, cap1, "Lock-Seq: %" PRId64, lock->lock_seq);
    snprintf(h2, cap2, "Lock-Token: %s", lock->lock_token);
}

int sdc_blob_get(sdc_t *c, const char *key, const sdc_lock_t *lock, void **data, size_t *len,
                 int64_t *blob_seq, sdc_err_t *err)
{
    *data = NULL;
    *len = 0;
    if (!sd_lock_name_valid(key) || (lock && (!grant_ok(lock) || strcmp(lock->key, key))))
        return sdc__inval(err, "key must be a name, lock a grant of that key");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 32], h1[48], h2[64], seq[32];
    snprintf(path, sizeof path, "/v1/blobs/%s", sdc_escape(key, esc, sizeof esc));
    const char *headers[] = {h1, h2, NULL};
    if (lock)
        grant_headers(lock, h1, sizeof h1, h2, sizeof h2);
    else
        headers[0] = NULL;
    int rc = sdc_request_raw(c, "GET", path, headers, NULL, 0, data, len, "Blob-Seq", seq,
                             sizeof seq, err);
    if (rc != SDC_OK)
        return rc;
    int64_t bs;
    if (sd_parse_i64(seq, 1, INT64_MAX, &bs)) {
        free(*data);
        *data = NULL;
        *len = 0;
        return sdc__proto(err, "the answer has no Blob-Seq header");
    }
    if (blob_seq)
        *blob_seq = bs;
    return SDC_OK;
}

int sdc_blob_put(sdc_t *c, const sdc_lock_t *lock, int64_t blob_seq, const void *data,
                 size_t len, sdc_err_t *err)
{
    if (!grant_ok(lock) || blob_seq < 1 || (len && !data))
        return sdc__inval(err, "a grant (key, lock_seq, lock_token) and a positive blob_seq "
                               "are needed");
    char esc[3 * SD_NAME_MAX + 1], path[3 * SD_NAME_MAX + 32], h1[48], h2[64], h3[48];
    snprintf(path, sizeof path, "/v1/blobs/%s", sdc_escape(lock->key, esc, sizeof esc));
    grant_headers(lock, h1, sizeof h1, h2, sizeof h2);
    snprintf(h3, sizeof h3, "Blob-Seq: %" PRId64, blob_seq);
    const char *headers[] = {h1, h2, h3, NULL};
    return sdc_request_raw(c, "PUT", path, headers, len ? data : "", len, NULL, NULL, NULL, NULL,
                           0, err);
}

int sdc_blob_delete(sdc_t *c, const char *key, json_t **out, sdc_err_t *err)
{
    return key_delete(c, "/v1/blobs/", key, "", out, err);
}
