/* The lock table's logic (docs/locks.md), under the handlers of api_locks.c: the "locks"
 * configuration, key names, the request body parsers, one function per Lua script call
 * (locks/lua/lock_*.lua) and the bounded wait of a refused acquire.
 *
 * Redis keys (prefix configurable, no cluster hash tag: locks are global):
 *   <prefix>lock:<key>      hash   holder, seq (the lock_seq), since, expires, ttl,
 *                                  delay_until, released, stolen_from, steal_reason
 *   <prefix>lock:<key>#q    list   release notifications that wake one waiter (BLPOP)
 *   <prefix>lock:<holder>#h set    the keys a holder holds (for GET /v1/locks?holder=)
 * '#' is not allowed in names, so these can never collide. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "locks.h"
#include "sdvalid.h"
#include "park.h"
#include "sd.h"

/* A parked acquire retries at least this often; also the BLPOP's timeout. */
#define WAIT_SLICE_MS 2000
/* A BLPOP unanswered this long after its timeout: the connection is dropped. */
#define BLPOP_STUCK_MS 3000
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

const char *sd_lock_key(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%slock:%s", sd_store_prefix(), name);
    return buf;
}

const char *sd_blob_key(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%sblob:%s", sd_store_prefix(), name);
    return buf;
}

static const char *holder_key(char *buf, size_t cap, const char *holder)
{
    snprintf(buf, cap, "%slock:%s#h", sd_store_prefix(), holder);
    return buf;
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
        if (!s || !sd_name_valid(s, SD_NAME_MAX)) {
            *code = "bad_name";
            snprintf(err, errcap,
                     "keys[%zu] must be a lock key name (1-%d characters of A-Z a-z 0-9 "
                     "_ . : @ -)",
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
    return 0;
}

int sd_lock_req_parse(const json_t *body, int many, sd_lock_req_t *a, const char **code,
                      char *err, size_t errcap)
{
    static const char *const one[] = {"holder", "ttl_ms", "wait_ms", "steal_if_holder_stopped",
                                      "steal_if_older_than_ms", NULL};
    static const char *const several[] = {"keys", "holder", "ttl_ms", "wait_ms",
                                          "steal_if_holder_stopped", "steal_if_older_than_ms",
                                          NULL};
    *code = "bad_field";
    a->steal_cluster = "";
    a->ttl_ms = a->wait_ms = a->steal_older_ms = 0;
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
    return 0;
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

int sd_lock_acquire(const sd_lock_req_t *a, redisReply **out)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    for (int i = 0; i < a->n; i++)
        sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, a->names[i]));
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, a->holder));
    sd_argv_add(&av, a->holder);
    sd_argv_addf(&av, "%lld", (long long)a->ttl_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_add(&av, a->steal_cluster);
    sd_argv_addf(&av, "%lld", (long long)a->steal_older_ms);
    sd_argv_add(&av, sd_store_prefix());
    for (int i = 0; i < a->n; i++) {
        char token[SD_LOCK_TOKEN_LEN + 1];
        if (sd_random_hex(token, SD_LOCK_TOKEN_BYTES)) {
            sd_argv_free(&av);
            return SD_STORE_ERROR;
        }
        sd_argv_addf(&av, "%s", token);
    }
    return sd_store_run("lock_acquire", a->n + 1, &av, out);
}

/* Durability knob: WAIT for sd_locks_cfg.wait_replicas replicas, at most
 * wait_timeout_ms. *got: how many confirmed (-1 on an odd reply). A SD_STORE_* code. */
int sd_lock_wait_replicas(long long *got)
{
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_add(&av, "WAIT");
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.wait_replicas);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.wait_timeout_ms);
    redisReply *r;
    int rc = sd_store_command(&av, &r);
    sd_argv_free(&av);
    if (rc != SD_STORE_OK)
        return rc;
    *got = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return SD_STORE_OK;
}

int sd_lock_release(const sd_lock_rel_t *rel, redisReply **out)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    for (int i = 0; i < rel->n; i++)
        sd_argv_addf(&av, "%s", sd_lock_key(key, sizeof key, rel->names[i]));
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, rel->holder));
    sd_argv_add(&av, rel->holder);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    for (int i = 0; i < rel->n; i++)
        sd_argv_addf(&av, "%lld", (long long)rel->seqs[i]);
    for (int i = 0; i < rel->n; i++)
        sd_argv_add(&av, rel->tokens[i]);
    return sd_store_run("lock_release", rel->n + 1, &av, out);
}

/* Starts av for a script on one lock: KEYS[1] is the lock record of name. */
static void lock_argv(sd_argv_t *av, const char *name)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_init(av);
    sd_argv_addf(av, "%s", sd_lock_key(key, sizeof key, name));
}

int sd_lock_release_holder(const char *holder, int64_t stopped_ms, long long *released)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, holder));
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.stop_lock_delay_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_addf(&av, "%slock:", sd_store_prefix());
    sd_argv_addf(&av, "%lld", (long long)stopped_ms);
    redisReply *r;
    int rc = sd_store_run("lock_release_holder", 1, &av, &r);
    if (rc != SD_STORE_OK)
        return rc;
    *released = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    return SD_STORE_OK;
}

int sd_lock_force(const char *name, redisReply **out)
{
    sd_argv_t av;
    lock_argv(&av, name);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_addf(&av, "%slock:", sd_store_prefix());
    return sd_store_run("lock_force", 1, &av, out);
}

int sd_lock_renew(const char *name, const char *holder, int64_t seq, const char *token,
                  int64_t ttl_ms, redisReply **out)
{
    sd_argv_t av;
    lock_argv(&av, name);
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%lld", (long long)seq);
    sd_argv_addf(&av, "%lld", (long long)ttl_ms);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.retain_s * 1000);
    sd_argv_add(&av, token);
    return sd_store_run("lock_renew", 1, &av, out);
}

int sd_lock_get(const char *name, redisReply **out)
{
    sd_argv_t av;
    lock_argv(&av, name);
    sd_argv_addf(&av, "%lld", (long long)sd_locks_cfg.lock_delay_ms);
    return sd_store_run("lock_get", 1, &av, out);
}

int sd_lock_list(const char *holder, int max, redisReply **out)
{
    char key[SD_NAME_MAX + 96];
    sd_argv_t av;
    sd_argv_init(&av);
    sd_argv_addf(&av, "%s", holder_key(key, sizeof key, holder));
    sd_argv_add(&av, holder);
    sd_argv_addf(&av, "%d", max);
    return sd_store_run("lock_list", 1, &av, out);
}

/* The held locks of one SCAN step's keys (lock records only: index keys hold a '#')
 * appended to locks, at most `room`. Returns 0 or a store error. */
static int scan_collect(const redisReply *keys, size_t plen, int64_t now, json_t *locks,
                        size_t room)
{
    for (size_t i = 0; i < keys->elements && json_array_size(locks) < room; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= plen || memchr(k->str, '#', k->len))
            continue;
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "HMGET");
        sd_argv_addn(&av, k->str, k->len);
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
            json_t *o = json_pack("{s:s%, s:s, s:I, s:I}", "key", k->str + plen, k->len - plen,
                                  "holder", sd_reply_str(h, 0), "lock_seq", (json_int_t)sd_reply_num(h, 1),
                                  "since_ms", (json_int_t)sd_reply_num(h, 2));
            json_object_set_new(o, "expires_in_ms",
                                expires > 0 ? json_integer(expires - now) : json_null());
            json_array_append_new(locks, o);
        }
        freeReplyObject(h);
    }
    return SD_STORE_OK;
}

#define SCAN_ROUNDS 8
#define SCAN_COUNT 500

int sd_lock_scan(int64_t *cursor, size_t limit, json_t *locks)
{
    char prefix[128];
    sd_lock_key(prefix, sizeof prefix, "");
    size_t plen = strlen(prefix);
    int64_t now = sd_wall_ms();
    int rc = SD_STORE_OK;
    for (int round = 0; round < SCAN_ROUNDS && json_array_size(locks) < limit; round++) {
        sd_argv_t av;
        sd_argv_init(&av);
        sd_argv_add(&av, "SCAN");
        sd_argv_addf(&av, "%lld", (long long)*cursor);
        sd_argv_add(&av, "MATCH");
        sd_argv_addf(&av, "%s*", prefix);
        sd_argv_add(&av, "COUNT");
        sd_argv_addf(&av, "%d", SCAN_COUNT);
        sd_argv_add(&av, "TYPE");
        sd_argv_add(&av, "hash");
        redisReply *r;
        rc = sd_store_command(&av, &r);
        sd_argv_free(&av);
        if (rc != SD_STORE_OK)
            break;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            rc = SD_STORE_ERROR;
            break;
        }
        *cursor = strtoll(sd_reply_str(r, 0), NULL, 10);
        rc = scan_collect(r->element[1], plen, now, locks, limit);
        freeReplyObject(r);
        if (rc != SD_STORE_OK || *cursor == 0)
            break;
    }
    return rc;
}
/* ---------- waiting ----------
 * A refused acquire with wait_ms is parked (http/park.h). Its wake-up source is the one
 * it always had, the refused key's release-notification list <record>#q (lock_release
 * and lock_force push a token there): the park thread keeps one connection of its own
 * blocked in a BLPOP over the lists of every key a parked acquire waits for, plus this
 * process's own wake list, which it pushes to when a waiter's key is not yet in the
 * BLPOP in flight. A popped token wakes the waiters of that key; each retries the
 * acquire. Waiters also retry when the refusal's lease or lock-delay ends or a slice
 * passes, so a lost connection only slows them down. */

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
    char holder[SD_NAME_MAX + 1], cluster[SD_NAME_MAX + 1];
    char names[SD_LOCKS_MAX_KEYS][SD_NAME_MAX + 1];
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
    int rc = sd_lock_acquire(&w->a, &r);
    if (rc != SD_STORE_OK) {
        sd_resp_store_error(resp, rc);
        return 1;
    }
    int64_t now = sd_mono_ms(), left = w->start_ms + w->a.wait_ms - now;
    const char *st = sd_reply_str(r, 0);
    if (!due && left > 0 && sd_reply_has_status(r) &&
        (!strcmp(st, "lock_held") || !strcmp(st, "lock_delayed"))) {
        *retry_at_ms = now + wait_slice(r, left);
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
    for (int i = 0; i < a->n; i++) {
        sd_strlcpy(w->names[i], a->names[i], sizeof w->names[i]);
        w->a.names[i] = w->names[i];
    }
    if (sd_park(&waiter_kind, req, resp, w, start_ms + a->wait_ms)) {
        free(w);
        atomic_fetch_sub(&waiters, 1);
        sd_resp_error(resp, 503, "too_many_waiters", "cannot start the lock waiter");
    }
}
