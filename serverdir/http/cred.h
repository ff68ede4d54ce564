/* Instance credentials (docs/operations.md, "Workload identity"): short-lived ES256 JWTs
 * that name one instance (cluster, machine, service, instance, generation), signed with a
 * keyring the serverdir copies share in Redis and rotate.
 *
 * Keyring: one hash "<prefix>keyring", kid -> "created_ms retired_ms drop_ms\n<PEM of a
 * P-256 private key>" (Redis time; 0: not yet). The newest unretired key signs. A copy
 * that finds no key, or the newest older than credentials.rotate_s, runs
 * keyring_rotate.lua with a fresh key: the script (atomic) adds it only when a rotation
 * is still due, so copies racing agree on one key. A retired key stays for verification
 * until every credential it can have signed has expired (drop_ms), then the script
 * removes it. Each copy keeps the keyring in memory, reloads it every
 * SD_CRED_RELOAD_MS and on an unknown kid (at most every 100 ms).
 *
 * Signing is libjwt's (ES256); verification checks the signature with OpenSSL and the
 * key parsed once (ES256 only, kid from the keyring), then iss, aud, exp
 * and the claims' names, once per credential: a fixed-size cache keyed by the token's
 * SHA-256 keeps the claims until exp, so a repeat costs a hash and a lookup. Liveness
 * (the directory still records the instance, on that machine, in that generation, not
 * stopped) is never cached: sd_cred_live checks it on each request. */
#ifndef SD_CRED_H
#define SD_CRED_H

#include <stddef.h>
#include <stdint.h>

#include "sd.h"

#define SD_CRED_MAX 4096           /* longest credential accepted, bytes */
#define SD_CRED_RELOAD_MS 30000    /* keyring reload period */

/* The "credentials" section of serverdir's --config. Every copy on one Redis should
 * use the same values (a retired key is dropped after the ttl of the copy that retired
 * it). */
typedef struct {
    int64_t ttl_s;    /* a credential's lifetime */
    int64_t rotate_s; /* age of the signing key at which a new one replaces it */
} sd_cred_cfg_t;
extern sd_cred_cfg_t sd_cred_cfg;

/* Loads the "credentials" section (NULL: defaults kept), all or nothing: 0, or -1 with
 * err naming the field. Called by sd_config_apply. */
int sd_cred_config_load(const json_t *section, char *err, size_t errcap);

/* What a credential says (its claims). */
typedef struct {
    char cluster[SD_NAME_MAX + 1];
    char machine[SD_NAME_MAX + 1];
    char service[SD_NAME_MAX + 1];
    char instance[SD_NAME_MAX + 1];
    int64_t generation;
} sd_cred_id_t;

/* Signs a credential for id with the newest key (loading or creating the keyring when
 * needed). On SD_STORE_OK: *jwt (malloc'd, caller frees), kid (cap >= 32) and its
 * expiry *exp_ms (unix ms). Else a SD_STORE_* error (SD_STORE_ERROR also when signing
 * failed, logged). */
int sd_cred_issue(const sd_cred_id_t *id, char **jwt, char *kid, size_t kidcap,
                  int64_t *exp_ms);

/* The JWKS document of every key a valid credential may be signed with, into *out
 * (caller owns). A SD_STORE_* code. */
int sd_cred_jwks(json_t **out);

/* Whether a bearer value has a JWT's shape (three base64url parts): such a value is a
 * credential, never a token-file token. */
int sd_cred_shaped(const char *tok, size_t len);

/* Parses credential tok (len bytes) without checking its signature: the shape, the
 * header (alg ES256, a kid, copied to kid, cap >= 17) and the claims (iss, aud, exp after
 * now_s, names, sub) into id and *exp_s. NULL, or why it is refused (static text). The
 * first half of sd_cred_verify; for tests and fuzzing. */
const char *sd_cred_parse(const char *tok, size_t len, int64_t now_s, char *kid, size_t kidcap,
                          sd_cred_id_t *id, int64_t *exp_s);
/* Verifies credential tok (len bytes): on success fills *out as the contract says (role
 * SD_R_GAME, cred 1, bindings, principal "instance:<cluster>/<instance>") and returns
 * SD_R_GAME; else returns 0 with *why naming the reason ("expired", "bad signature",
 * ...: static text). */
unsigned sd_cred_verify(const char *tok, size_t len, sd_auth_t *out, const char **why);

/* The directory's record of instance i in cluster c (one HMGET of its process hash):
 * machine, service and generation into id, its state into state ("" when there is no
 * record; cap bytes, longer states cut). A SD_STORE_* code. */
int sd_cred_record_read(const char *c, const char *i, sd_cred_id_t *id, char *state,
                        size_t cap);

/* For a credential caller (req->auth.cred), the directory's word on its instance: 0 when
 * the record is on the credential's machine in its generation and not stopped, else -1
 * after answering 401 credential_revoked (or a store error). 0 for any other caller.
 * One HMGET of the process hash. The HTTP front calls it before every non-public route
 * but those flagged SD_CRED_LIVE_IN_SCRIPT (on standalone Redis / Sentinel); a public
 * route (SD_PUBLIC: the front checks nothing) that acts on a credential it was shown
 * calls it itself. */
int sd_cred_live(const sd_req_t *req, sd_resp_t *resp);
/* The check under sd_cred_live, for a caller a (NULL or not a credential: nothing to
 * check): a SD_STORE_* code, and *why NULL when the instance lives, else why not (static
 * text). For work that outlives the request's first check (a parked acquire's retries on
 * a Redis Cluster). */
int sd_cred_check(const sd_auth_t *a, const char **why);
/* Answers 401 credential_revoked, naming why (the record's state). */
void sd_cred_revoked(sd_resp_t *resp, const char *why);
/* The three script arguments of the prelude's cred_revoked (pk, machine, generation) for
 * caller a, appended to av: the process hash to check for an instance credential on
 * standalone Redis / Sentinel (one Redis holds it: the script reads it), else "" (no
 * credential, or a Redis Cluster, where the HTTP front checked with sd_cred_live). */
void sd_cred_live_args(const sd_auth_t *a, sd_argv_t *av);
/* Whether reply r is a script's {'credential_revoked', why}: then answers 401 and
 * returns 1. */
int sd_cred_revoked_reply(const redisReply *r, sd_resp_t *resp);

/* Verified credentials cached and the cache's capacity (tests, bench). */
void sd_cred_cache_stats(size_t *used, size_t *cap);

#endif
