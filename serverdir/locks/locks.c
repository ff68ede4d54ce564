/* The lock table's logic (docs/locks.md), under the handlers of api_locks.c: the "locks"
 * configuration, key names, the request body parsers, one function per Lua script call
 * (locks/lua/lock_*.lua) and the bounded wait of a refused acquire.
 *
 * Redis keys (prefix configurable, no cluster hash tag: locks are global):
 *   <prefix>lock:<key>      hash   holder, seq (the lock_seq), since, expires, ttl,
 *                                  delay_until, released, stolen_from, steal_reason,
 *                                  wait_until (an acquire refused may wait until then)
 *   <prefix>lock:<key>#q    list   release notifications that wake one waiter (BLPOP),
 *                                  pushed while wait_until has not passed
 *   <prefix>lock:<holder>#h set    the keys a holder holds (for GET /v1/locks?holder=)
 * '#' is not allowed in names, so these can never collide. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cred.h"
#include "locks.h"
#include "rcluster.h"
#include "sdvalid.h"
#include "park.h"
#include "quota.h"
#include "sd.h"

/* A parked acquire retries at least this often; also the BLPOP's timeout. */
#define WAIT_SLICE_MS 2000
/* A BLPOP unanswered this long after its timeout: the connection is dropped. */
#define BLPOP_STUCK_MS 3000
/* On a Redis Cluster, how often a parked acquire retries (no release listener there). */
#define CLUSTER_POLL_MS 50
/* Reconnect attempts of the release listener. */
#define RECONNECT_MS 500

sd_locks_cfg_t sd_locks_cfg = {
    .lock_delay_ms = 0,
    .wait_replicas = 0,
    .wait_timeout_ms = 500,
    .max_wait_ms = SD_LOCKS_WAIT_CAP_MS,
    .max_waiters = 256,
    .retain_s = 7 * 24 * 3600,
    .release_on_stop = 1,
    .stop_lock_delay_ms = 5000,
};

/* ---------- configuration and shared checks ---------- */

int sd_locks_config_load(const json_t *section, char *err, size_t errcap)
{
    static const char *const known[] = {"lock_delay_ms", "wait_replicas", "wait_timeout_ms",
                                        "max_wait_ms", "max_waiters", "retain_s",
                                        "release_on_stop", "stop_lock_delay_ms", NULL};
    if (!section)
        return 0;
    if (!json_is_object(section)) {
        snprintf(err, errcap, "section 'locks' must be an object");
        return -1;
    }
    sd_locks_cfg_t c = sd_locks_cfg; /* all or nothing */
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, errcap);
    if (sd_jv_only_keys(&jv, section, known) ||
        sd_jv_int(&jv, section, "lock_delay_ms", 0, 0, 600000, &c.lock_delay_ms) < 0 ||
        sd_jv_int(&jv, section, "wait_replicas", 0, 0, 16, &c.wait_replicas) < 0 ||
        sd_jv_int(&jv, section, "wait_timeout_ms", 0, 1, 2500, &c.wait_timeout_ms) < 0 ||
        sd_jv_int(&jv, section, "max_wait_ms", 0, 0, SD_LOCKS_WAIT_CAP_MS, &c.max_wait_ms) < 0 ||
        sd_jv_int(&jv, section, "max_waiters", 0, 1, 4096, &c.max_waiters) < 0 ||
        sd_jv_int(&jv, section, "retain_s", 0, 60, 365LL * 24 * 3600, &c.retain_s) < 0 ||
        sd_jv_bool(&jv, section, "release_on_stop", 0, &c.release_on_stop) < 0 ||
        sd_jv_int(&jv, section, "stop_lock_delay_ms", 0, 0, 600000, &c.stop_lock_delay_ms) < 0)
        return -1;
    sd_locks_cfg = c;
    return 0;
}

void sd_locks_log_config(void)
{
    log_info("lock table configured",
             "lock_delay_ms=%lld wait_replicas=%lld max_wait_ms=%lld max_waiters=%lld retain_s=%lld",
             (long long)sd_locks_cfg.lock_delay_ms, (long long)sd_locks_cfg.wait_replicas,
             (long long)sd_locks_cfg.max_wait_ms, (long long)sd_locks_cfg.max_waiters,
             (long long)sd_locks_cfg.retain_s);
}

void sd_lock_fenced(sd_resp_t *resp, const char *op, const char *name)
{
#define BLOB_HELP "Blob reads and saves refused by the fence"
#define LOCK_HELP "Renewals and releases refused by the fence (not the current lock_token)"
    if (!strcmp(op, "save"))
        SD_COUNT("serverdir_blob_fenced_total{op=\"save\"}", BLOB_HELP, 1);
    else if (!strcmp(op, "read"))
        SD_COUNT("serverdir_blob_fenced_total{op=\"read\"}", BLOB_HELP, 1);
    else if (!strcmp(op, "renew"))
        SD_COUNT("serverdir_lock_fenced_total{op=\"renew\"}", LOCK_HELP, 1);
    else
        SD_COUNT("serverdir_lock_fenced_total{op=\"release\"}", LOCK_HELP, 1);
#undef BLOB_HELP
#undef LOCK_HELP
    sd_resp_error_extra(resp, 409, "fenced", json_pack("{s:s}", "key", name),
                        "the grant presented for lock '%s' is not its current one (released, "
                        "expired, taken over, or a wrong lock_seq or lock_token)",
                        name);
}

int sd_lock_holder_stopped_reply(const redisReply *r, const char *holder, sd_resp_t *resp)
{
    if (!sd_reply_status_is(r, "holder_stopped"))
        return 0;
    const char *reason = sd_reply_str(r, 1);
    int64_t at = sd_reply_num(r, 2);
    SD_COUNT("serverdir_lock_refusals_total{reason=\"holder_stopped\"}",
             "Lock acquires, renewals and blob saves refused: the directory records the "
             "holder stopped",
             1);
    static _Atomic int64_t last_log; /* a stopped process may retry in a loop: once a second */
    int64_t now = sd_mono_ms(), prev = atomic_load(&last_log);
    if (now - prev >= 1000 && atomic_compare_exchange_strong(&last_log, &prev, now))
        log_info("lock refused",
                 "holder=%s reason=holder_stopped stop_reason=%s stopped_at_ms=%lld", holder,
                 reason, (long long)at);
    sd_resp_error_extra(resp, 409, "holder_stopped",
                        json_pack("{s:s, s:s, s:I}", "holder", holder, "stop_reason", reason,
                                  "stopped_at_ms", (json_int_t)at),
                        "the directory records instance '%s' stopped (%s) at %lld: it may not "
                        "take or keep locks",
                        holder, reason, (long long)at);
    return 1;
}

int sd_lock_token_header(const sd_req_t *req, sd_resp_t *resp, const char **token)
{
    *token = sd_req_header(req, "Lock-Token");
    if (!*token) {
        sd_resp_error(resp, 400, "missing_lock_token",
                      "header Lock-Token (the lock_token of your grant) is required");
        return -1;
    }
    if (!sd_lock_token_valid(*token)) {
        sd_resp_error(resp, 400, "bad_lock_token",
                      "header Lock-Token must be the lock_token of a grant (%d hex characters)",
                      SD_LOCK_TOKEN_LEN);
        return -1;
    }
    return 0;
}

int sd_seq_parse(const char *s, int64_t *out)
{
    if (!s || !*s || strlen(s) > 16)
        return -1;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    if (s[0] == '0')
        return -1;
    return sd_parse_i64(s, 1, SD_SEQ_MAX, out) ? -1 : 0;
}

int sd_req_lock_name(const sd_req_t *req, sd_resp_t *resp, const char *what, const char **out)
{
    const char *s = req->nparams > 0 ? req->params[0] : NULL;
    if (!sd_lock_name_valid(s)) {
        sd_resp_error(resp, 400, "bad_name",
                      "%s name must be 1-%d characters of " SD_NAME_CHARSET_TEXT " "
                      "(not starting with '.' or '-', no '..') with at most one "
                      "{hash tag}",
                      what, SD_NAME_MAX);
        return -1;
    }
    *out = s;
    return 0;
}

/* <prefix><ns><name>. On a Redis Cluster a name without a hash tag is wrapped as
 * "{=name}" so the lock record, its blob and its release list share one slot ('=' is
 * not allowed in names: no lock name can collide with a wrapped one). */
static const char *ns_key(char *buf, size_t cap, const char *ns, const char *name)
{
    if (sd_store_is_cluster() && !strchr(name, '{'))
        snprintf(buf, cap, "%s%s{=%s}", sd_store_prefix(), ns, name);
    else
        snprintf(buf, cap, "%s%s%s", sd_store_prefix(), ns, name);
    return buf;
}

const char *sd_lock_key(char *buf, size_t cap, const char *name)
{
    return ns_key(buf, cap, "lock:", name);
}

const char *sd_blob_key(char *buf, size_t cap, const char *name)
{
    return ns_key(buf, cap, "blob:", name);
}

const char *sd_lock_name_of(char *buf, size_t cap, const char *key, size_t nslen)
{
    const char *n = key + nslen;
    size_t len = strlen(n);
    if (len > 3 && n[0] == '{' && n[1] == '=' && n[len - 1] == '}') {
        n += 2;
        len -= 3;
    }
    if (len >= cap)
        len = cap - 1;
    memcpy(buf, n, len);
    buf[len] = '\0';
    return buf;
}

static const char *holder_key(char *buf, size_t cap, const char *holder)
{
    snprintf(buf, cap, "%slock:%s#h", sd_store_prefix(), holder);
    return buf;
}

/* Durability knob: WAIT for the configured replicas after a grant or a blob save. 0 when reached, else
 * -1 with the 503 (or store error) answer in resp. */
int sd_locks_wait_acked(sd_resp_t *resp)
{
    if (sd_locks_cfg.wait_replicas <= 0)
        return 0;
    long long got;
    int rc = sd_store_wait(sd_locks_cfg.wait_replicas, sd_locks_cfg.wait_timeout_ms, &got);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return -1;
    }
    if (got < sd_locks_cfg.wait_replicas) {
        SD_COUNT("serverdir_lock_replication_timeouts_total",
                 "Grants and saves answered 503 because too few replicas confirmed them", 1);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error_extra(resp, 503, "replication_timeout",
                            json_pack("{s:I, s:I}", "replicas", (json_int_t)got, "wanted",
                                      (json_int_t)sd_locks_cfg.wait_replicas),
                            "the write reached %lld of %lld replicas within %lld ms; retry "
                            "(re-acquire and re-save are idempotent)",
                            got, (long long)sd_locks_cfg.wait_replicas,
                            (long long)sd_locks_cfg.wait_timeout_ms);
        return -1;
    }
    return 0;
}

int sd_cluster_stop_locks(const char *cluster, int *release, int64_t *delay_ms)
{
    *release = sd_locks_cfg.release_on_stop;
    *delay_ms = sd_locks_cfg.stop_lock_delay_ms;
    char key[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "HMGET");
    sd_argv_add(&a, sd_key(key, sizeof key, cluster, "%s", "settings"));
    sd_argv_add(&a, "locks_release_on_stop");
    sd_argv_add(&a, "locks_stop_lock_delay_ms");
    redisReply *r = NULL;
    int rc = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (rc != SD_STORE_OK)
        return rc;
    int64_t v;
    if (*sd_reply_str(r, 0))
        *release = strcmp(sd_reply_str(r, 0), "1") == 0;
    if (*sd_reply_str(r, 1) && sd_parse_i64(sd_reply_str(r, 1), 0, 600000, &v) == 0)
        *delay_ms = v;
    freeReplyObject(r);
    return SD_STORE_OK;
}

/* ---------- request bodies ---------- */

/* Reads body.keys: 1..SD_LOCKS_MAX_KEYS distinct names into names/n. */
static int keys_parse(const json_t *body, const char **names, int *n, const char **code,
                      char *err, size_t errcap)
{
    const json_t *keys = json_object_get(body, "keys");
    *code = "bad_field";
    if (!json_is_array(keys) || json_array_size(keys) < 1 ||
        json_array_size(keys) > SD_LOCKS_MAX_KEYS) {
        snprintf(err, errcap, "field 'keys' must be an array of 1 to %d lock keys",
                 SD_LOCKS_MAX_KEYS);
        return -1;
    }
    *n = 0;
    size_t i;
    const json_t *k;
    json_array_foreach(keys, i, k) {
        const char *s = json_string_value(k);
        if (!s || !sd_lock_name_valid(s)) {
            *code = "bad_name";
            snprintf(err, errcap,
                     "keys[%zu] must be a lock key name (1-%d characters of "
                     SD_NAME_CHARSET_TEXT ", and at most one {hash tag})",
                     i, SD_NAME_MAX);
            return -1;
        }
        for (int j = 0; j < *n; j++)
            if (strcmp(names[j], s) == 0) {
                snprintf(err, errcap, "keys[%zu] repeats '%s'", i, s);
                return -1;
            }
        names[(*n)++] = s;
    }
    if (!sd_lock_names_one_slot(names, *n)) {
        *code = "cross_slot";
        snprintf(err, errcap, "the keys are in different Redis Cluster slots; give a "
                              "player's keys one hash tag: {player42}:bank, {player42}:inv");
        return -1;
    }
    return 0;
}

/* The lock_token(s) an acquire presents: body.lock_token (one key) or body.lock_tokens
 * {key: token} (several; any subset of the keys), each a well-formed token. */
static int tokens_parse(const json_t *body, int many, sd_lock_req_t *a, const char **code,
                        char *err, size_t errcap)
{
    *code = "bad_lock_token";
    if (!many) {
        const json_t *t = json_object_get(body, "lock_token");
        if (t && !sd_lock_token_valid(json_string_value(t))) {
            snprintf(err, errcap, "field 'lock_token' must be a lock_token (%d hex characters)",
                     SD_LOCK_TOKEN_LEN);
            return -1;
        }
        a->tokens[0] = t ? json_string_value(t) : NULL;
        return 0;
    }
    const json_t *lt = json_object_get(body, "lock_tokens");
    if (!lt)
        return 0;
    if (!json_is_object(lt)) {
        snprintf(err, errcap, "field 'lock_tokens' must be an object {key: lock_token}");
        return -1;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)lt, k, v) {
        int i = 0;
        while (i < a->n && strcmp(a->names[i], k) != 0)
            i++;
        if (i == a->n) {
            snprintf(err, errcap, "lock_tokens names '%.128s', which is not one of the keys", k);
            return -1;
        }
        if (!sd_lock_token_valid(json_string_value(v))) {
            snprintf(err, errcap, "lock_tokens['%.128s'] must be a lock_token (%d hex characters)",
                     k, SD_LOCK_TOKEN_LEN);
            return -1;
        }
        a->tokens[i] = json_string_value(v);
    }
    return 0;
}

int sd_lock_req_parse(const json_t *body, int many, sd_lock_req_t *a, const char **code,
                      char *err, size_t errcap)
{
    static const char *const one[] = {"holder", "ttl_ms", "wait_ms", "steal_if_holder_stopped",
                                      "steal_if_older_than_ms", "lock_token", NULL};
    static const char *const several[] = {"keys", "holder", "ttl_ms", "wait_ms",
                                          "steal_if_holder_stopped", "steal_if_older_than_ms",
                                          "lock_tokens", NULL};
    *code = "bad_field";
    a->steal_cluster = a->steal_within = "";
    a->ttl_ms = a->wait_ms = a->steal_older_ms = 0;
    memset(a->tokens, 0, sizeof a->tokens);
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, errcap);
    if (sd_jv_only_keys(&jv, body, many ? several : one))
        return -1;
    if (many && keys_parse(body, a->names, &a->n, code, err, errcap))
        return -1;
    if (sd_jv_name(&jv, body, "holder", 1, &a->holder) < 0 ||
        sd_jv_int(&jv, body, "ttl_ms", 0, 1, SD_LOCKS_TTL_MAX_MS, &a->ttl_ms) < 0 ||
        sd_jv_int(&jv, body, "wait_ms", 0, 0, sd_locks_cfg.max_wait_ms, &a->wait_ms) < 0 ||
        sd_jv_name(&jv, body, "steal_if_holder_stopped", 0, &a->steal_cluster) < 0 ||
        sd_jv_int(&jv, body, "steal_if_older_than_ms", 0, 1, SD_LOCKS_TTL_MAX_MS * 365,
                  &a->steal_older_ms) < 0)
        return -1;
    return tokens_parse(body, many, a, code, err, errcap);
}

int sd_lock_release_parse(const json_t *body, sd_lock_rel_t *rel, const char **code, char *err,
                          size_t errcap)
{
    static const char *const allowed[] = {"keys", "holder", "lock_seqs", "lock_tokens", NULL};
    *code = "bad_field";
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, errcap);
    if (sd_jv_only_keys(&jv, body, allowed) ||
        sd_jv_name(&jv, body, "holder", 1, &rel->holder) < 0 ||
        keys_parse(body, rel->names, &rel->n, code, err, errcap))
        return -1;
    const json_t *ls = json_object_get(body, "lock_seqs");
    const json_t *lt = json_object_get(body, "lock_tokens");
    if (!json_is_object(ls) || json_object_size(ls) != (size_t)rel->n) {
        snprintf(err, errcap,
                 "field 'lock_seqs' must be an object with the lock_seq of each key");
        return -1;
    }
    for (int i = 0; i < rel->n; i++) {
        const json_t *v = json_object_get(ls, rel->names[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > SD_SEQ_MAX) {
            snprintf(err, errcap, "lock_seqs['%s'] must be a lock_seq (1-2^53)", rel->names[i]);
            return -1;
        }
        rel->seqs[i] = json_integer_value(v);
    }
    if (!json_is_object(lt) || json_object_size(lt) != (size_t)rel->n) {
        *code = lt ? "bad_lock_token" : "missing_lock_token";
        snprintf(err, errcap,
                 "field 'lock_tokens' must be an object with the lock_token of each key's grant");
        return -1;
    }
    for (int i = 0; i < rel->n; i++) {
        rel->tokens[i] = json_string_value(json_object_get(lt, rel->names[i]));
        if (!sd_lock_token_valid(rel->tokens[i])) {
            *code = "bad_lock_token";
            snprintf(err, errcap,
                     "lock_tokens['%s'] must be the lock_token of the grant (%d hex characters)",
                     rel->names[i], SD_LOCK_TOKEN_LEN);
            return -1;
        }
    }
    return 0;
}
/* ---------- script calls ---------- */

int sd_lock_names_one_slot(const char *const *names, int n)
{
    if (!sd_store_is_cluster() || n < 2)
        return 1;
    char key[SD_NAME_MAX + 96];
    sd_lock_key(key, sizeof key, names[0]);
    unsigned slot = sd__rc_slot(key, strlen(key));
    for (int i = 1; i < n; i++) {
        sd_lock_key(key, sizeof key, names[i]);
        if (sd__rc_slot(key, strlen(key)) != slot)
            return 0;
    }
    return 1;
}

/* `op <holder's index set> names...` (SADD, SREM, SMISMEMBER: a cluster keeps the index
 * outside the lock scripts); *out (may be NULL) gets the reply. A SD_STORE_* code; an
 * error reply is SD_STORE_ERROR. */
static int index_cmd(const char *op, const char *holder, const char *const *names, int n,
                     redisReply **out)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, op);
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, holder));
    for (int i = 0; i < n; i++)
        sd_argv_add(&av, names[i]);
    redisReply *r;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK)
        return rc;
    rc = r->type == REDIS_REPLY_ERROR ? SD_STORE_ERROR : SD_STORE_OK;
    if (out && rc == SD_STORE_OK)
        *out = r;
    else
        freeReplyObject(r);
    return rc;
}

/* One SADD or SREM of names to or from holder's index set. */
static int index_update(const char *op, const char *holder, const char *const *names, int n)
{
    return index_cmd(op, holder, names, n, NULL);
}

/* Cluster only, before an acquire: which of names the holder's index lacks (added[i] = 1),
 * then SADD them all (write-ahead: the index may name a lock not granted, never miss one
 * that is). */
static int index_add_new(const char *holder, const char *const *names, int n,
                         unsigned char *added)
{
    redisReply *r;
    int rc = index_cmd("SMISMEMBER", holder, names, n, &r);
    if (rc != SD_STORE_OK)
        return rc;
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == (size_t)n;
    for (int i = 0; ok && i < n; i++)
        added[i] = r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer == 0;
    freeReplyObject(r);
    if (!ok)
        return SD_STORE_ERROR;
    return index_update("SADD", holder, names, n);
}

/* Cluster only, after a refused acquire: the index entries it wrote ahead go again, so
 * a refusal changes nothing and a long-lived holder's index does not grow with every
 * lock it was refused. An entry is put back when the lock turns out to be the holder's
 * after all (another acquire of the same holder granted it meanwhile). */
static void index_undo(const char *holder, const char *const *names, int n,
                       const unsigned char *added)
{
    const char *gone[SD_LOCKS_MAX_KEYS];
    int ngone = 0;
    for (int i = 0; i < n; i++)
        if (added[i])
            gone[ngone++] = names[i];
    if (!ngone || index_update("SREM", holder, gone, ngone) != SD_STORE_OK)
        return;
    for (int i = 0; i < ngone; i++) {
        char key[SD_NAME_MAX + 96];
        sd_argv_t q;
        sd_argv_init(&q);
        sd_argv_add(&q, "HGET");
        sd_argv_addf(&q, "%s", sd_lock_key(key, sizeof key, gone[i]));
        sd_argv_add(&q, "holder");
        redisReply *r;
        int rc = sd_store_command(&q, &r);
        sd_argv_free(&q);
        if (rc != SD_STORE_OK)
            continue;
        if (r->type == REDIS_REPLY_STRING && strcmp(r->str, holder) == 0)
            index_update("SADD", holder, &gone[i], 1);
        freeReplyObject(r);
    }
}

/* One field of holder's process record in cluster's directory into *out (a reply the
 * caller frees). A SD_STORE_* code. */
static int proc_field(const char *cluster, const char *holder, const char *field,
                      redisReply **out)
{
    char key[2 * SD_NAME_MAX + 96];
    sd_argv_t q;
    sd_argv_init(&q);
    sd_argv_add(&q, "HGET");
    sd_argv_add(&q, sd_key(key, sizeof key, cluster, "proc:%s", holder));
    sd_argv_add(&q, field);
    int rc = sd_store_command(&q, out);
    sd_argv_free(&q);
    return rc;
}

/* Cluster only: of the current holders of a's keys (other than a's holder), appended to
 * av those the directory of a->steal_cluster records as stopped, and, with
 * a->steal_within, "+<holder>" for those that are processes of that cluster. The script
 * steals only from holders so named; a holder that changed since is simply not stolen
 * from. */
static int stopped_holders(const sd_lock_req_t *a, sd_argv_t *av)
{
    char seen[SD_LOCKS_MAX_KEYS][SD_NAME_MAX + 1];
    int nseen = 0;
    for (int i = 0; i < a->n; i++) {
        char key[SD_NAME_MAX + 96];
        sd_argv_t q;
        sd_argv_init(&q);
        sd_argv_add(&q, "HGET");
        sd_argv_addf(&q, "%s", sd_lock_key(key, sizeof key, a->names[i]));
        sd_argv_add(&q, "holder");
        redisReply *r;
        int rc = sd_store_command(&q, &r);
        sd_argv_free(&q);
        if (rc != SD_STORE_OK)
            return rc;
        int skip = r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > SD_NAME_MAX ||
                   strcmp(r->str, a->holder) == 0;
        for (int k = 0; !skip && k < nseen; k++)
            skip = strcmp(seen[k], r->str) == 0;
        if (!skip)
            sd_strlcpy(seen[nseen++], r->str, sizeof seen[0]);
        freeReplyObject(r);
    }
    for (int k = 0; k < nseen; k++) {
        redisReply *r;
        int rc;
        if (a->steal_cluster[0]) {
            if ((rc = proc_field(a->steal_cluster, seen[k], "state", &r)) != SD_STORE_OK)
                return rc;
            if (r->type == REDIS_REPLY_STRING && strcmp(r->str, "stopped") == 0)
                sd_argv_addf(av, "%s", seen[k]);
            freeReplyObject(r);
        }
        if (a->steal_within[0]) {
            if ((rc = proc_field(a->steal_within, seen[k], "state", &r)) != SD_STORE_OK)
                return rc;
            if (r->type == REDIS_REPLY_STRING)
                sd_argv_addf(av, "+%s", seen[k]);
            freeReplyObject(r);
        }
    }
    return SD_STORE_OK;
}

/* The holder liveness argument of lock_acquire.lua and lock_renew.lua (the prelude's
 * holder_stop), appended to av. The directory asked is the caller's cluster: the one its
 * token is bound to, or its credential's. A caller bound to no cluster (ops, an unbound
 * game token, open mode) names no directory (holder names are unique within a cluster
 * only) and gets "": nothing checked. On standalone Redis / Sentinel the argument is the
 * holder's process hash, which the script reads; on a Redis Cluster (the hash is in
 * another slot) it is read here with one HMGET and, when stopped, passed as "=<reason>
 * <stopped_at_ms>" (the refusal counted in the hash here, lock_refusal_count.lua). A
 * SD_STORE_* code. */
static int holder_stop_arg(const sd_auth_t *auth, const char *holder, sd_argv_t *av)
{
    char key[2 * SD_NAME_MAX + 96];
    if (!auth || !auth->cluster[0]) {
        sd_argv_add(av, "");
        return SD_STORE_OK;
    }
    sd_key(key, sizeof key, auth->cluster, "proc:%s", holder);
    if (!sd_store_is_cluster()) {
        sd_argv_addf(av, "%s", key);
        return SD_STORE_OK;
    }
    sd_argv_t q;
    sd_argv_init(&q);
    sd_argv_add(&q, "HMGET");
    sd_argv_add(&q, key);
    sd_argv_add(&q, "state");
    sd_argv_add(&q, "reason");
    sd_argv_add(&q, "stopped_at_ms");
    redisReply *r;
    int rc = sd_store_command(&q, &r);
    sd_argv_free(&q);
    if (rc != SD_STORE_OK)
        return rc;
    int stopped = strcmp(sd_reply_str(r, 0), "stopped") == 0;
    if (stopped)
        sd_argv_addf(av, "=%s %lld", sd_reply_str(r, 1), (long long)sd_reply_num(r, 2));
    else
        sd_argv_add(av, "");
    freeReplyObject(r);
    if (stopped) { /* counted best effort: a failure changes nothing for the caller */
        sd_argv_t c;
        sd_argv_init(&c);
        sd_argv_addf(&c, "%s", key);
        sd_argv_addf(&c, "%lld", (long long)sd_wall_ms());
        if (sd_store_run("lock_refusal_count", 1, &c, &r) == SD_STORE_OK)
            freeReplyObject(r);
    }
    return SD_STORE_OK;
}

/* The quota arguments of lock_acquire.lua, appended to av: the holder's quota of locks
 * and, on a cluster, the size of its index (after index_add_new) and how many of a's
 * names that added; on standalone Redis the script counts them itself. */
static int quota_args(const sd_lock_req_t *a, int cluster, const unsigned char *added,
                      sd_argv_t *av)
{
    sd_argv_addf(av, "%lld", (long long)sd_quota_limit[SD_QUOTA_LOCKS_PER_HOLDER]);
    if (!cluster || sd_quota_limit[SD_QUOTA_LOCKS_PER_HOLDER] == 0) {
        sd_argv_add(av, "");
        sd_argv_add(av, "");
        return SD_STORE_OK;
    }
    char key[SD_NAME_MAX + 96];
    sd_argv_t q;
    sd_argv_init(&q);
    sd_argv_add(&q, "SCARD");
    sd_argv_addf(&q, "%s", holder_key(key, sizeof key, a->holder));
    redisReply *r;
    int rc = sd_store_command(&q, &r);
    sd_argv_free(&q);
    if (rc != SD_STORE_OK)
        return rc;
    int n = 0;
    for (int i = 0; i < a->n; i++)
        n += added[i];
    rc = r->type == REDIS_REPLY_INTEGER ? SD_STORE_OK : SD_STORE_ERROR;
    sd_argv_addf(av, "%lld", r->type == REDIS_REPLY_INTEGER ? r->integer : 0LL);
    sd_argv_addf(av, "%d", n);
    freeReplyObject(r);
    return rc;
}

/* A new lock_token: SD_LOCK_TOKEN_BYTES of the kernel's randomness in lowercase hex. A
 * thread takes them 512 bytes (32 tokens) at a time: a getrandom call per grant was one
 * syscall in twenty on the lock path, and OpenSSL's generator cost more CPU than the call.
 * The bytes are used once each and are as secret as the tokens they become. 0, or -1
 * when the kernel gives none. */
static int token_new(char out[SD_LOCK_TOKEN_LEN + 1])
{
    static _Thread_local unsigned char pool[512];
    static _Thread_local size_t used = sizeof pool;
    if (used + SD_LOCK_TOKEN_BYTES > sizeof pool) {
        size_t got = 0;
        while (got < sizeof pool) {
            ssize_t r = getrandom(pool + got, sizeof pool - got, 0);
            if (r < 0 && errno != EINTR)
                return -1;
            if (r > 0)
                got += (size_t)r;
        }
        used = 0;
    }
    sd_hex_encode(out, pool + used, SD_LOCK_TOKEN_BYTES);
    memset(pool + used, 0, SD_LOCK_TOKEN_BYTES); /* not kept once handed out */
    used += SD_LOCK_TOKEN_BYTES;
    return 0;
}

int sd_lock_acquire_prepare(const sd_lock_req_t *a, sd_argv_t *av, int *nkeys,
                            unsigned char *added)
{
    char key[SD_NAME_MAX + 96];
    int cluster = sd_store_is_cluster();
    memset(added, 0, SD_LOCKS_MAX_KEYS);
    sd_argv_init(av);
    if (cluster) {
        /* the index first: it may name a lock not granted (listings skip those), never
         * miss one that is */
        int rc = index_add_new(a->holder, a->names, a->n, added);
        if (rc != SD_STORE_OK)
            return rc;
    }
    for (int i = 0; i < a->n; i++)
        sd_argv_addf(av, "%s", sd_lock_key(key, sizeof key, a->names[i]));
    for (int i = 0; i < a->n; i++)
        sd_argv_addf(av, "%s", sd_blob_key(key, sizeof key, a->names[i]));
    if (!cluster)
        sd_argv_addf(av, "%s", holder_key(key, sizeof key, a->holder));
    *nkeys = av->argc;
    sd_argv_add(av, a->holder);
    sd_argv_addf(av, "%lld", (long long)a->ttl_ms);
    sd_argv_addf(av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    sd_argv_addf(av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_add(av, a->steal_cluster);
    sd_argv_addf(av, "%lld", (long long)a->steal_older_ms);
    sd_argv_add(av, sd_store_prefix());
    sd_argv_addf(av, "%d", a->n);
    for (int i = 0; i < a->n; i++) {
        char token[SD_LOCK_TOKEN_LEN + 1];
        if (a->tokens[i]) {
            sd_argv_add(av, a->tokens[i]);
        } else if (token_new(token)) {
            index_undo(a->holder, a->names, a->n, added);
            sd_argv_free(av);
            return SD_STORE_ERROR;
        } else {
            sd_argv_addf(av, "%s", token);
        }
    }
    for (int i = 0; i < a->n; i++)
        sd_argv_add(av, a->tokens[i] ? "1" : "0");
    sd_argv_add(av, a->steal_within);
    sd_cred_live_args(a->auth, av);
    int rc = quota_args(a, cluster, added, av);
    if (rc == SD_STORE_OK)
        rc = holder_stop_arg(a->auth, a->holder, av);
    if (rc == SD_STORE_OK) /* a refusal it will wait through asks releases to wake it */
        sd_argv_addf(av, "%lld", (long long)a->wait_ms);
    if (rc == SD_STORE_OK && cluster &&
        (a->steal_cluster[0] || (a->steal_within[0] && a->steal_older_ms)))
        rc = stopped_holders(a, av);
    if (rc != SD_STORE_OK) {
        index_undo(a->holder, a->names, a->n, added);
        sd_argv_free(av);
    }
    return rc;
}

void sd_lock_acquire_after(const sd_lock_req_t *a, int rc, const redisReply *r,
                           const unsigned char *added)
{
    if (!sd_store_is_cluster())
        return;
    if (rc != SD_STORE_OK || !sd_reply_status_is(r, "ok")) {
        index_undo(a->holder, a->names, a->n, added);
        return;
    }
    /* a steal: the previous holder's index forgets the key (best effort) */
    for (size_t i = 2; i + 6 < r->elements; i += 7) {
        const char *from = sd_reply_str(r, i + 3), *name = sd_reply_str(r, i);
        if (*from)
            index_update("SREM", from, &name, 1);
    }
}

int sd_lock_acquire(const sd_lock_req_t *a, redisReply **out)
{
    sd_argv_t av;
    int nkeys;
    unsigned char added[SD_LOCKS_MAX_KEYS];
    *out = NULL;
    int rc = sd_lock_acquire_prepare(a, &av, &nkeys, added);
    if (rc != SD_STORE_OK)
        return rc;
    rc = sd_store_run("lock_acquire", nkeys, &av, out);
    sd_lock_acquire_after(a, rc, *out, added);
    return rc;
}

void sd_lock_release_prepare(const sd_lock_rel_t *rel, sd_argv_t *av, int *nkeys)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_init(av);
    for (int i = 0; i < rel->n; i++)
        sd_argv_addf(av, "%s", sd_lock_key(key, sizeof key, rel->names[i]));
    for (int i = 0; i < rel->n; i++)
        sd_argv_addf(av, "%s#q", sd_lock_key(key, sizeof key, rel->names[i]));
    if (!sd_store_is_cluster())
        sd_argv_addf(av, "%s", holder_key(key, sizeof key, rel->holder));
    *nkeys = av->argc;
    sd_argv_add(av, rel->holder);
    sd_argv_addf(av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    for (int i = 0; i < rel->n; i++)
        sd_argv_addf(av, "%lld", (long long)rel->seqs[i]);
    for (int i = 0; i < rel->n; i++)
        sd_argv_add(av, rel->tokens[i]);
    sd_argv_addf(av, "%slock:", sd_store_prefix());
    sd_cred_live_args(rel->auth, av);
}

void sd_lock_release_after(const sd_lock_rel_t *rel, int rc, const redisReply *r)
{
    if (rc == SD_STORE_OK && sd_store_is_cluster() && sd_reply_status_is(r, "ok"))
        index_update("SREM", rel->holder, rel->names, rel->n); /* best effort */
}

/* Starts av for a script on one lock: KEYS[1] is the lock record of name. */
static void lock_argv(sd_argv_t *av, const char *name)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_init(av);
    sd_argv_addf(av, "%s", sd_lock_key(key, sizeof key, name));
}

/* lock_argv, and KEYS[2] the record's release notification list <record>#q (declared:
 * on a Redis Cluster a slot being migrated must see every key a script touches). */
static void lock_q_argv(sd_argv_t *av, const char *name)
{
    char key[SD_NAME_MAX + 96];
    lock_argv(av, name);
    sd_argv_addf(av, "%s#q", sd_lock_key(key, sizeof key, name));
}

/* One SSCAN step over key from cursor: *out is the reply, an array of {next cursor,
 * names array} (checked here). A SD_STORE_* code. */
static int sscan_step(const char *key, const char *cursor, const char *count, redisReply **out)
{
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "SSCAN");
    sd_argv_add(&av, key);
    sd_argv_add(&av, cursor);
    sd_argv_add(&av, "COUNT");
    sd_argv_add(&av, count);
    int rc = sd_store_command(&av, out);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK)
        return rc;
    redisReply *r = *out;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        *out = NULL;
        return SD_STORE_ERROR;
    }
    return SD_STORE_OK;
}

/* Whether cluster's directory records no run of holder newer than the stopped run
 * generation (-1: unknown, then 0): its record is gone, or stopped in that generation
 * or an older one. Into *yes; a SD_STORE_* code. The Redis Cluster form of the check
 * lock_release_holder.lua makes itself. */
static int no_newer_run(const char *cluster, const char *holder, int64_t generation, int *yes)
{
    char key[2 * SD_NAME_MAX + 96];
    *yes = 0;
    if (generation < 0)
        return SD_STORE_OK;
    sd_argv_t q;
    sd_argv_init(&q);
    sd_argv_add(&q, "HMGET");
    sd_argv_add(&q, sd_key(key, sizeof key, cluster, "proc:%s", holder));
    sd_argv_add(&q, "state");
    sd_argv_add(&q, "generation");
    redisReply *r;
    int rc = sd_store_command(&q, &r);
    sd_argv_free(&q);
    if (rc != SD_STORE_OK)
        return rc;
    const char *st = sd_reply_str(r, 0);
    *yes = !*st || (!strcmp(st, "stopped") && sd_reply_num(r, 1) <= generation);
    freeReplyObject(r);
    return SD_STORE_OK;
}

/* release_holder on a Redis Cluster: the holder's index walked with SSCAN, one
 * lock_stop_release per key (its own slot), entries that no longer name the holder
 * dropped. Idempotent like the script it stands for. */
static int release_holder_cluster(const char *cluster, const char *holder, int64_t stopped_ms,
                                  int64_t generation, int64_t delay_ms, long long *released)
{
    char hkey[SD_NAME_MAX + 96], cursor[32] = "0";
    holder_key(hkey, sizeof hkey, holder);
    *released = 0;
    int any_time = 0;
    int rc = no_newer_run(cluster, holder, generation, &any_time);
    if (rc != SD_STORE_OK)
        return rc;
    for (int step = 0; step < 100000; step++) {
        redisReply *r;
        rc = sscan_step(hkey, cursor, "200", &r);
        if (rc != SD_STORE_OK)
            return rc;
        sd_strlcpy(cursor, sd_reply_str(r, 0), sizeof cursor);
        const redisReply *names = r->element[1];
        const char *gone[256];
        int ngone = 0;
        for (size_t i = 0; i < names->elements && rc == SD_STORE_OK; i++) {
            const char *name = names->element[i]->str;
            if (names->element[i]->type != REDIS_REPLY_STRING || !sd_lock_name_valid(name))
                continue;
            sd_argv_t q;
            lock_q_argv(&q, name);
            sd_argv_add(&q, holder);
            sd_argv_addf(&q, "%lld", (long long)delay_ms);
            sd_argv_addf(&q, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
            sd_argv_addf(&q, "%lld", (long long)stopped_ms);
            sd_argv_add(&q, any_time ? "1" : "0");
            redisReply *x;
            rc = sd_store_run("lock_stop_release", 2, &q, &x);
            if (rc != SD_STORE_OK)
                break;
            long long v = x->type == REDIS_REPLY_INTEGER ? x->integer : 0;
            freeReplyObject(x);
            *released += v == 1;
            if (v != 0 && ngone < (int)SD_ARRAY_LEN(gone))
                gone[ngone++] = name;
        }
        if (rc == SD_STORE_OK && ngone)
            rc = index_update("SREM", holder, gone, ngone);
        freeReplyObject(r);
        if (rc != SD_STORE_OK)
            return rc;
        if (strcmp(cursor, "0") == 0)
            return SD_STORE_OK;
    }
    return SD_STORE_OK;
}

/* lock_release_holder.lua's call for holder into av (initialized here). */
static void release_holder_argv(sd_argv_t *av, const char *cluster, const char *holder,
                                int64_t stopped_ms, int64_t generation, int64_t delay_ms)
{
    char key[2 * SD_NAME_MAX + 96];
    sd_argv_init(av);
    sd_argv_addf(av, "%s", holder_key(key, sizeof key, holder));
    sd_argv_add(av, holder);
    sd_argv_addf(av, "%lld", (long long)delay_ms);
    sd_argv_addf(av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_addf(av, "%slock:", sd_store_prefix());
    sd_argv_addf(av, "%lld", (long long)stopped_ms);
    sd_argv_addf(av, "%s", sd_key(key, sizeof key, cluster, "proc:%s", holder));
    if (generation >= 0)
        sd_argv_addf(av, "%lld", (long long)generation);
    else
        sd_argv_add(av, "");
}

int sd_lock_release_holders(const char *cluster, int n, const sd_lock_stop_t *stops,
                            int64_t delay_ms, long long *released)
{
    if (n > SD_LOCK_STOPS_MAX)
        return SD_STORE_ERROR;
    for (int i = 0; i < n; i++)
        released[i] = -1;
    if (n <= 0)
        return SD_STORE_OK;
    if (sd_store_is_cluster()) {
        /* a Redis Cluster: each holder's keys in their own slots, one holder at a time */
        for (int i = 0; i < n; i++) {
            long long got = 0;
            int rc = release_holder_cluster(cluster, stops[i].holder, stops[i].stopped_ms,
                                            stops[i].generation, delay_ms, &got);
            if (rc != SD_STORE_OK)
                return rc;
            released[i] = got;
        }
        return SD_STORE_OK;
    }
    sd_argv_t *avs = malloc((size_t)n * sizeof *avs), *items[SD_LOCK_STOPS_MAX]; /* 3.6 KB each */
    if (!avs)
        return SD_STORE_ERROR;
    int nkeys[SD_LOCK_STOPS_MAX], rcs[SD_LOCK_STOPS_MAX];
    redisReply *outs[SD_LOCK_STOPS_MAX];
    for (int i = 0; i < n; i++) {
        release_holder_argv(&avs[i], cluster, stops[i].holder, stops[i].stopped_ms,
                            stops[i].generation, delay_ms);
        items[i] = &avs[i];
        nkeys[i] = 1;
    }
    int rc = sd_store_run_many("lock_release_holder", n, items, nkeys, rcs, outs);
    for (int i = 0; i < n; i++) {
        sd_argv_free(&avs[i]);
        if (rc != SD_STORE_OK)
            continue;
        if (rcs[i] == SD_STORE_OK && outs[i]->type == REDIS_REPLY_INTEGER)
            released[i] = outs[i]->integer;
        else if (rcs[i] == SD_STORE_OK)
            log_error("lock release failed", "cluster=%s instance=%s error=\"%s\"", cluster,
                      stops[i].holder, outs[i]->type == REDIS_REPLY_ERROR ? outs[i]->str : "?");
        if (outs[i])
            freeReplyObject(outs[i]);
    }
    free(avs);
    return rc;
}

int sd_lock_force(const char *name, redisReply **out)
{
    sd_argv_t av;
    lock_q_argv(&av, name);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_addf(&av, "%slock:", sd_store_prefix());
    sd_argv_add(&av, sd_store_is_cluster() ? "1" : "0");
    int rc = sd_store_run("lock_force", 2, &av, out);
    if (rc == SD_STORE_OK && sd_store_is_cluster() && sd_reply_status_is(*out, "ok"))
        index_update("SREM", sd_reply_str(*out, 1), &name, 1); /* best effort */
    return rc;
}

int sd_lock_renew_prepare(const char *name, const char *holder, int64_t seq,
                          const char *token, int64_t ttl_ms, const sd_auth_t *auth,
                          sd_argv_t *av)
{
    lock_argv(av, name);
    sd_argv_add(av, holder);
    sd_argv_addf(av, "%lld", (long long)seq);
    sd_argv_addf(av, "%lld", (long long)ttl_ms);
    sd_argv_addf(av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_add(av, token);
    sd_cred_live_args(auth, av);
    int rc = holder_stop_arg(auth, holder, av);
    if (rc != SD_STORE_OK)
        sd_argv_free(av);
    return rc;
}

int sd_lock_get(const char *name, redisReply **out)
{
    sd_argv_t av;
    lock_argv(&av, name);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    return sd_store_run("lock_get", 1, &av, out);
}

int sd_lock_list(const char *holder, int max, const char *cursor, redisReply **out)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, holder));
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%d", max);
    sd_argv_add(&av, cursor);
    return sd_store_run("lock_list", 1, &av, out);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int sd_lock_list_cluster(const char *holder, int max, char *cursor, size_t cap, json_t *locks)
{
    char hkey[SD_NAME_MAX + 96], after[SD_NAME_MAX + 1] = "", scan[24];
    holder_key(hkey, sizeof hkey, holder);
    const char *dash = strchr(cursor, '-');
    if (dash)
        sd_strlcpy(after, dash + 1, sizeof after);
    snprintf(scan, sizeof scan, "%lld", strtoll(cursor, NULL, 10));
    int64_t now = sd_wall_ms();
    for (int step = 0; step < 8; step++) {
        redisReply *r;
        int rc = sscan_step(hkey, scan, "128", &r);
        if (rc != SD_STORE_OK)
            return rc;
        size_t n = r->element[1]->elements;
        const char **names = malloc((n ? n : 1) * sizeof *names);
        if (!names) {
            freeReplyObject(r);
            return SD_STORE_ERROR;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            const redisReply *e = r->element[1]->element[i];
            if (e->type == REDIS_REPLY_STRING && (!after[0] || strcmp(e->str, after) > 0))
                names[k++] = e->str;
        }
        qsort(names, k, sizeof *names, cmp_name);
        size_t i = 0;
        int cut = 0;
        for (; i < k; i++) {
            if ((int)json_array_size(locks) >= max) {
                cut = 1; /* resumed after names[i - 1] (i >= 1: a step starts below max) */
                snprintf(cursor, cap, "%s-%s", scan, names[i - 1]);
                break;
            }
            char key[SD_NAME_MAX + 96];
            sd_argv_t q;
            sd_argv_init(&q);
            sd_argv_add(&q, "HMGET");
            sd_argv_addf(&q, "%s", sd_lock_key(key, sizeof key, names[i]));
            sd_argv_add(&q, "holder");
            sd_argv_add(&q, "seq");
            sd_argv_add(&q, "since");
            sd_argv_add(&q, "expires");
            redisReply *h;
            rc = sd_store_command(&q, &h);
            sd_argv_free(&q);
            if (rc != SD_STORE_OK)
                break;
            int64_t expires = sd_reply_num(h, 3);
            if (strcmp(sd_reply_str(h, 0), holder) == 0 && (expires <= 0 || expires > now)) {
                json_t *o = json_pack("{s:s, s:I, s:I}", "key", names[i], "lock_seq",
                                      (json_int_t)sd_reply_num(h, 1), "since_ms",
                                      (json_int_t)sd_reply_num(h, 2));
                json_object_set_new(o, "expires_in_ms",
                                    expires > 0 ? json_integer(expires - now) : json_null());
                json_array_append_new(locks, o);
            } else {
                index_update("SREM", holder, &names[i], 1); /* a stale entry */
            }
            freeReplyObject(h);
        }
        free(names);
        if (!cut)
            sd_strlcpy(scan, sd_reply_str(r, 0), sizeof scan);
        freeReplyObject(r);
        if (rc != SD_STORE_OK || cut)
            return rc;
        after[0] = '\0';
        if (strcmp(scan, "0") == 0 || (int)json_array_size(locks) >= max)
            break;
    }
    snprintf(cursor, cap, "%s", scan);
    return SD_STORE_OK;
}

/* The lock names of one SCAN step's keys (lock records only: index keys hold a '#'),
 * after the nslen-byte "<prefix>lock:" and without a cluster's "{=...}" wrapping, greater
 * than `after` (when not ""), sorted: a step cut short by the page size is resumed from
 * the same SCAN cursor after its last name. The names are written in place over the
 * keys (r is the caller's). Returns how many, in names. */
static size_t step_names(redisReply *keys, size_t nslen, const char *after, const char **names,
                         size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < keys->elements && n < cap; i++) {
        redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= nslen || memchr(k->str, '#', k->len))
            continue;
        char name[SD_NAME_MAX + 1];
        sd_lock_name_of(name, sizeof name, k->str, nslen);
        memcpy(k->str, name, strlen(name) + 1);
        if (*after && strcmp(k->str, after) <= 0)
            continue;
        names[n++] = k->str;
    }
    qsort(names, n, sizeof *names, cmp_name);
    return n;
}

/* Appends name's record to locks when it is held. Returns 0 or a store error. */
static int scan_one(const char *name, int64_t now, json_t *locks)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "HMGET");
    sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, name));
    sd_argv_add(&av, "holder");
    sd_argv_add(&av, "seq");
    sd_argv_add(&av, "since");
    sd_argv_add(&av, "expires");
    redisReply *h;
    int rc = sd_store_command(&av, &h);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK)
        return rc;
    int64_t expires = sd_reply_num(h, 3);
    if (h->type == REDIS_REPLY_ARRAY && *sd_reply_str(h, 0) && (expires <= 0 || expires > now)) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:I}", "key", name, "holder", sd_reply_str(h, 0),
                              "lock_seq", (json_int_t)sd_reply_num(h, 1), "since_ms",
                              (json_int_t)sd_reply_num(h, 2));
        json_object_set_new(o, "expires_in_ms",
                            expires > 0 ? json_integer(expires - now) : json_null());
        json_array_append_new(locks, o);
    }
    freeReplyObject(h);
    return SD_STORE_OK;
}

#define SCAN_ROUNDS 8
#define SCAN_COUNT 500 /* fixed: a resumed step must be the same step */

/* The cursor: "<scan>[-<last name>]", on a Redis Cluster "<node>n<scan>[-<last name>]"
 * (the walk visits each primary in turn, node indexing them in address order). */
int sd_lock_scan(char *cursor, size_t cap, size_t limit, json_t *locks)
{
    char ns[128], after[SD_NAME_MAX + 1] = "";
    snprintf(ns, sizeof ns, "%slock:", sd_store_prefix());
    size_t nslen = strlen(ns);
    int64_t now = sd_wall_ms();
    int cluster = sd_store_is_cluster(), nodes = cluster ? sd_store_primaries() : 1;
    const char *p = cursor;
    long long node = 0, scan = strtoll(p, (char **)&p, 10);
    if (*p == 'n') {
        node = scan;
        scan = strtoll(p + 1, (char **)&p, 10);
    }
    if (*p == '-')
        sd_strlcpy(after, p + 1, sizeof after);
    int rc = SD_STORE_OK;
    for (int round = 0; round < SCAN_ROUNDS && node < nodes; round++) {
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "SCAN");
        sd_argv_addf(&av, "%lld", scan);
        sd_argv_add(&av, "MATCH");
        sd_argv_addf(&av, "%s*", ns);
        sd_argv_add(&av, "COUNT");
        sd_argv_addf(&av, "%d", SCAN_COUNT);
        sd_argv_add(&av, "TYPE");
        sd_argv_add(&av, "hash");
        redisReply *r;
        rc = cluster ? sd_store_command_primary((int)node, &av, &r) : sd_store_command(&av, &r);
        sd_argv_free(&av);
        if (rc != SD_STORE_OK)
            return rc;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            return SD_STORE_ERROR;
        }
        long long next = strtoll(sd_reply_str(r, 0), NULL, 10);
        size_t n = r->element[1]->elements;
        const char **names = malloc((n ? n : 1) * sizeof *names);
        if (!names) {
            freeReplyObject(r);
            return SD_STORE_ERROR;
        }
        n = step_names(r->element[1], nslen, after, names, n);
        size_t i = 0;
        for (; i < n && json_array_size(locks) < limit; i++)
            if ((rc = scan_one(names[i], now, locks)) != SD_STORE_OK)
                break;
        if (rc == SD_STORE_OK && i < n) { /* the page is full inside this step */
            if (cluster)
                snprintf(cursor, cap, "%lldn%lld-%s", node, scan, names[i - 1]);
            else
                snprintf(cursor, cap, "%lld-%s", scan, names[i - 1]);
        }
        free(names);
        freeReplyObject(r);
        if (rc != SD_STORE_OK || i < n)
            return rc;
        after[0] = '\0';
        scan = next;
        if (scan == 0) /* this node is done: the next one */
            node++;
        if (json_array_size(locks) >= limit)
            break;
    }
    if (node >= nodes)
        cursor[0] = '\0';
    else if (cluster)
        snprintf(cursor, cap, "%lldn%lld", node, scan);
    else
        snprintf(cursor, cap, "%lld", scan);
    return SD_STORE_OK;
}

/* ---------- waiting ----------
 * A refused acquire with wait_ms is parked (http/park.h). Its wake-up source is the one
 * it always had, the refused key's release-notification list <record>#q (lock_release
 * and lock_force push a token there): the park thread keeps one connection of its own
 * blocked in a BLPOP over the lists of every key a parked acquire waits for, plus this
 * process's own wake list, which it pushes to when a waiter's key is not yet in the
 * BLPOP in flight. A popped token wakes the waiters of that key; each retries the
 * acquire. Waiters also retry when the refusal's lease or lock-delay ends or a slice
 * passes, so a lost connection only slows them down. On a Redis Cluster (where one BLPOP
 * cannot span keys of several slots) there is no listener: waiters retry every
 * CLUSTER_POLL_MS. */

/* How long to wait before the next attempt, given a refusal: until the lease or the
 * lock-delay runs out, a release wakes us, the wait ends, or one slice passes. */
static int64_t wait_slice(const redisReply *r, int64_t left)
{
    int64_t ms = left < WAIT_SLICE_MS ? left : WAIT_SLICE_MS;
    int64_t hint = -1;
    if (strcmp(sd_reply_str(r, 0), "lock_delayed") == 0)
        hint = sd_reply_num(r, 2);
    else if (sd_reply_num(r, 4) > 0)
        hint = sd_reply_num(r, 4) - sd_reply_num(r, 5) + 1;
    if (hint >= 0 && hint < ms)
        ms = hint;
    return ms;
}

/* A parked acquire: its own copies of the request's strings (the JSON body is gone). */
typedef struct {
    sd_lock_req_t a;
    int many;
    sd_lock_finish_fn finish;
    int64_t start_ms;
    char name[SD_NAME_MAX + 1]; /* the key the last refusal named ("": not tried yet) */
    char holder[SD_NAME_MAX + 1], cluster[SD_NAME_MAX + 1], within[SD_NAME_MAX + 1];
    char names[SD_LOCKS_MAX_KEYS][SD_NAME_MAX + 1];
    char tokens[SD_LOCKS_MAX_KEYS][SD_LOCK_TOKEN_LEN + 1];
} waiter_t;

static atomic_int waiters;

/* The release source, owned by the park thread. */
static redisContext *blc;       /* the connection blocked in BLPOP, or NULL */
static int blc_pending;         /* a BLPOP is in flight */
static int blc_interrupted;     /* ... and the wake list was pushed to end it */
static int64_t blc_sent_ms;
static int64_t next_connect_ms;
static int keys_changed;        /* a waiter's key may be missing from the BLPOP in flight */
static char wake_list[128];     /* "<prefix>lock:#wake:<pid>.<ms>": ours alone */

static const sd_park_kind_t waiter_kind;

/* Retries the acquire: answers through w->finish unless it is refused again with time
 * left (then waits for a release of the refused key or the next slice). */
static int waiter_try(void *ctx, sd_resp_t *resp, int due, int64_t *retry_at_ms)
{
    waiter_t *w = ctx;
    redisReply *r;
    const char *revoked = NULL;
    /* on a Redis Cluster the script cannot read the process hash (another slot): each
     * retry checks the credential's liveness first, as the HTTP front did for the first */
    int rc = sd_store_is_cluster() ? sd_cred_check(w->a.auth, &revoked) : SD_STORE_OK;
    if (rc == SD_STORE_OK && revoked) {
        sd_cred_revoked(resp, revoked);
        return 1;
    }
    if (rc == SD_STORE_OK)
        rc = sd_lock_acquire(&w->a, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return 1;
    }
    int64_t now = sd_mono_ms(), left = w->start_ms + w->a.wait_ms - now;
    const char *st = sd_reply_str(r, 0);
    if (!due && left > 0 && sd_reply_has_status(r) &&
        (!strcmp(st, "lock_held") || !strcmp(st, "lock_delayed"))) {
        int64_t slice = wait_slice(r, left);
        if (sd_store_is_cluster() && slice > CLUSTER_POLL_MS)
            slice = CLUSTER_POLL_MS; /* no BLPOP across slots: the waiter polls */
        *retry_at_ms = now + slice;
        if (strcmp(w->name, sd_reply_str(r, 1)) != 0) {
            sd_strlcpy(w->name, sd_reply_str(r, 1), sizeof w->name);
            keys_changed = 1;
        }
        freeReplyObject(r);
        return 0;
    }
    w->finish(&w->a, w->many, r, now - w->start_ms, resp);
    return 1;
}

static void waiter_release(void *ctx)
{
    free(ctx);
    atomic_fetch_sub(&waiters, 1);
}

static void blc_drop(const char *why)
{
    log_warn("lock release listener lost", "err=%s", why);
    redisFree(blc);
    blc = NULL;
    blc_pending = 0;
}

/* The notification lists of every parked acquire's key, for the BLPOP. */
typedef struct {
    const char **argv;
    size_t *argl;
    char (*keys)[SD_NAME_MAX + 96];
    int argc;
} blpop_args_t;

static void count_waiter(void *ctx, void *arg)
{
    (void)ctx;
    (*(int *)arg)++;
}

static void add_waiter_key(void *ctx, void *arg)
{
    const waiter_t *w = ctx;
    blpop_args_t *b = arg;
    if (!w->name[0])
        return;
    char *k = b->keys[b->argc];
    char rec[SD_NAME_MAX + 64];
    snprintf(k, sizeof b->keys[0], "%s#q", sd_lock_key(rec, sizeof rec, w->name));
    b->argv[b->argc] = k;
    b->argl[b->argc] = strlen(k);
    b->argc++;
}

/* Sends BLPOP <wake list> <key>#q ... <slice> on blc. 0 when sent (or nothing to wait
 * for), -1 when blc failed. */
static int blc_send(int64_t now)
{
    int n = 0;
    sd_park_each(&waiter_kind, count_waiter, &n);
    if (n == 0)
        return 0;
    blpop_args_t b = {.argv = calloc((size_t)n + 3, sizeof *b.argv),
                      .argl = calloc((size_t)n + 3, sizeof *b.argl),
                      .keys = calloc((size_t)n + 3, sizeof *b.keys)};
    int rc = 0;
    if (b.argv && b.argl && b.keys) {
        b.argv[0] = "BLPOP";
        b.argv[1] = wake_list;
        b.argc = 2;
        sd_park_each(&waiter_kind, add_waiter_key, &b);
        char *t = b.keys[b.argc];
        snprintf(t, sizeof b.keys[0], "%d", WAIT_SLICE_MS / 1000);
        b.argv[b.argc++] = t;
        for (int i = 0; i < b.argc; i++)
            if (i < 2 || i == b.argc - 1)
                b.argl[i] = strlen(b.argv[i]);
        int done = 0;
        if (redisAppendCommandArgv(blc, b.argc, b.argv, b.argl) != REDIS_OK)
            rc = -1;
        while (rc == 0 && !done)
            if (redisBufferWrite(blc, &done) != REDIS_OK)
                rc = -1;
        if (rc == 0) {
            blc_pending = 1;
            blc_interrupted = 0;
            keys_changed = 0;
            blc_sent_ms = now;
        }
    }
    free(b.argv);
    free(b.argl);
    free(b.keys);
    return rc;
}

/* Source: keeps blc connected and a BLPOP over the current keys in flight; pushes to the
 * wake list when a waiter's key changed under a BLPOP in flight. */
static void release_prepare(int64_t now)
{
    if (sd_store_is_cluster())
        return; /* a BLPOP over keys of many slots is refused: waiters poll instead */
    if (!wake_list[0])
        snprintf(wake_list, sizeof wake_list, "%slock:#wake:%d.%lld", sd_store_prefix(),
                 (int)getpid(), (long long)sd_wall_ms());
    if (blc && blc_pending && now - blc_sent_ms > WAIT_SLICE_MS + BLPOP_STUCK_MS)
        blc_drop("no answer to BLPOP");
    if (!blc) {
        if (atomic_load(&waiters) == 0 || now < next_connect_ms)
            return;
        next_connect_ms = now + RECONNECT_MS;
        if (!(blc = sd_store_connect()))
            return;
    }
    if (!blc_pending) {
        if (blc_send(now))
            blc_drop(blc->errstr);
        return;
    }
    if (keys_changed && !blc_interrupted) {
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "RPUSH");
        sd_argv_add(&av, wake_list);
        sd_argv_add(&av, "1");
        redisReply *r;
        if (sd_store_command(&av, &r) == SD_STORE_OK)
            freeReplyObject(r);
        sd_argv_free(&av);
        sd_argv_init(&av);
        sd_argv_add(&av, "PEXPIRE");
        sd_argv_add(&av, wake_list);
        sd_argv_add(&av, "60000");
        if (sd_store_command(&av, &r) == SD_STORE_OK)
            freeReplyObject(r);
        sd_argv_free(&av);
        blc_interrupted = 1;
    }
}

static int release_fd(void) { return blc ? blc->fd : -1; }

static int waits_on(void *ctx, void *arg)
{
    const waiter_t *w = ctx;
    return strcmp(w->name, arg) == 0;
}

/* Source: a BLPOP answered: a token popped from "<prefix>lock:<name>#q" wakes the waiters
 * of name; the wake list's token or a timeout only ends the BLPOP (the next is sent with
 * the current keys). */
static void release_ready(void)
{
    if (redisBufferRead(blc) != REDIS_OK) {
        blc_drop(blc->errstr);
        return;
    }
    char ns[128];
    sd_lock_key(ns, sizeof ns, "");
    size_t nslen = strlen(ns);
    void *rv = NULL;
    while (blc && redisGetReplyFromReader(blc, &rv) == REDIS_OK && rv) {
        redisReply *r = rv;
        blc_pending = 0;
        const char *k = sd_reply_str(r, 0);
        size_t klen = strlen(k);
        if (r->type == REDIS_REPLY_ERROR) {
            log_warn("lock release listener refused", "err=%s", r->str);
            redisFree(blc);
            blc = NULL;
        } else if (klen > nslen + 2 && strncmp(k, ns, nslen) == 0 &&
                   strcmp(k + klen - 2, "#q") == 0) {
            char name[SD_NAME_MAX + 1];
            size_t n = klen - nslen - 2 < sizeof name - 1 ? klen - nslen - 2 : sizeof name - 1;
            memcpy(name, k + nslen, n);
            name[n] = '\0';
            sd_park_wake(&waiter_kind, waits_on, name);
        }
        freeReplyObject(r);
        rv = NULL;
    }
}

static const sd_park_kind_t waiter_kind = {
    .try_answer = waiter_try,
    .release = waiter_release,
    .source_prepare = release_prepare,
    .source_fd = release_fd,
    .source_ready = release_ready,
};

void sd_lock_park(const sd_lock_req_t *a, int many, int64_t start_ms, sd_req_t *req,
                  sd_resp_t *resp, sd_lock_finish_fn finish)
{
    if (atomic_fetch_add(&waiters, 1) >= sd_locks_cfg.max_waiters) {
        atomic_fetch_sub(&waiters, 1);
        sd_resp_header(resp, "Retry-After", "1");
        sd_resp_error(resp, 429, "too_many_waiters",
                      "%lld acquires are waiting already; retry, or acquire without wait_ms",
                      (long long)sd_locks_cfg.max_waiters);
        return;
    }
    waiter_t *w = calloc(1, sizeof *w);
    if (!w) {
        atomic_fetch_sub(&waiters, 1);
        sd_resp_error(resp, 500, "internal", "out of memory");
        return;
    }
    w->a = *a;
    w->many = many;
    w->finish = finish;
    w->start_ms = start_ms;
    sd_strlcpy(w->holder, a->holder, sizeof w->holder);
    sd_strlcpy(w->cluster, a->steal_cluster, sizeof w->cluster);
    w->a.holder = w->holder;
    w->a.steal_cluster = w->cluster;
    sd_strlcpy(w->within, a->steal_within ? a->steal_within : "", sizeof w->within);
    w->a.steal_within = w->within;
    for (int i = 0; i < a->n; i++) {
        sd_strlcpy(w->names[i], a->names[i], sizeof w->names[i]);
        w->a.names[i] = w->names[i];
        if (a->tokens[i]) { /* the body goes away while it waits: its own copies */
            sd_strlcpy(w->tokens[i], a->tokens[i], sizeof w->tokens[i]);
            w->a.tokens[i] = w->tokens[i];
        }
    }
    if (sd_park(&waiter_kind, req, resp, w, start_ms + a->wait_ms)) {
        free(w);
        atomic_fetch_sub(&waiters, 1);
        sd_resp_error(resp, 503, "too_many_waiters", "cannot start the lock waiter");
    }
}
