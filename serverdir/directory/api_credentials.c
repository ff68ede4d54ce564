/* Instance credentials (docs/operations.md, "Workload identity"): bigbrother asks for
 * the credential of an instance the directory records on its machine; anyone may read
 * the public keys that verify them. Signing and verification are http/cred.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cred.h"
#include "sd.h"
#include "sdvalid.h"

SD_ROUTE(POST, "/v1/clusters/{c}/machines/{m}/instances/{i}/credential", SD_R_OPS | SD_R_BB, 0, h_cred_issue);
SD_ROUTE(GET, "/.well-known/jwks.json", SD_PUBLIC, 0, h_jwks);

/* The optional body {"generation": N} into *gen (-1: not given). 0, or -1 with 400. */
static int issue_body(sd_req_t *req, sd_resp_t *resp, int64_t *gen)
{
    static const char *const known[] = {"generation", NULL};
    char err[SD_ERRMSG_MAX];
    *gen = -1;
    if (req->body.len == 0)
        return 0;
    json_t *body = sd_req_json(req, resp);
    if (!body)
        return -1;
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, sizeof err);
    int bad = sd_jv_only_keys(&jv, body, known) ||
              sd_jv_int(&jv, body, "generation", 0, 0, INT64_MAX, gen) < 0;
    json_decref(body);
    if (bad)
        sd_resp_error(resp, 400, "bad_field", "%s", err);
    return bad ? -1 : 0;
}

/* POST /v1/clusters/{c}/machines/{m}/instances/{i}/credential {generation?} ->
 * 200 {credential, kid, generation, service, expires_at_ms, expires_in_ms};
 * 404 no_such_instance, 403 forbidden (another machine's), 409 instance_stopped /
 * generation_mismatch. A machine-bound bigbrother token asks for its own machine only. */
void h_cred_issue(sd_req_t *req, sd_resp_t *resp)
{
    const char *c, *m, *i;
    int64_t want_gen;
    sd_cred_id_t id = {0};
    char state[16];
    if (sd_req_cluster_and(req, resp, &c, "machine", &m) || sd_req_name(req, resp, 2, "instance", &i) ||
        sd_req_may_machine(req, resp, c, m) || issue_body(req, resp, &want_gen))
        return;
    int rc = sd_cred_record_read(c, i, &id, state, sizeof state);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (!state[0]) {
        sd_resp_error(resp, 404, "no_such_instance",
                      "the directory of cluster '%s' has no instance '%s'", c, i);
        return;
    }
    if (strcmp(id.machine, m)) {
        SD_COUNT("serverdir_credentials_refused_total{reason=\"other_machine\"}",
                 "credential requests refused", 1);
        sd_resp_error(resp, 403, "forbidden",
                      "instance '%s' of cluster '%s' runs on machine '%s', not '%s'", i, c,
                      id.machine, m);
        return;
    }
    if (!strcmp(state, "stopped")) {
        SD_COUNT("serverdir_credentials_refused_total{reason=\"instance_stopped\"}",
                 "credential requests refused", 1);
        sd_resp_error(resp, 409, "instance_stopped",
                      "the directory records instance '%s' of cluster '%s' as stopped", i, c);
        return;
    }
    if (want_gen >= 0 && want_gen != id.generation) {
        SD_COUNT("serverdir_credentials_refused_total{reason=\"generation_mismatch\"}",
                 "credential requests refused", 1);
        sd_resp_error_extra(resp, 409, "generation_mismatch",
                            json_pack("{s:I}", "generation", (json_int_t)id.generation),
                            "instance '%s' runs generation %lld, not %lld", i,
                            (long long)id.generation, (long long)want_gen);
        return;
    }
    sd_strlcpy(id.cluster, c, sizeof id.cluster);
    sd_strlcpy(id.instance, i, sizeof id.instance);
    char *jwt = NULL, kid[32];
    int64_t exp_ms;
    rc = sd_cred_issue(&id, &jwt, kid, sizeof kid, &exp_ms);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    SD_COUNT("serverdir_credentials_issued_total", "instance credentials signed", 1);
    sd_resp_json(resp, 200,
                 json_pack("{s:s, s:s, s:I, s:s, s:I, s:I}", "credential", jwt, "kid", kid,
                           "generation", (json_int_t)id.generation, "service", id.service,
                           "expires_at_ms", (json_int_t)exp_ms, "expires_in_ms",
                           (json_int_t)(exp_ms - sd_wall_ms())));
    free(jwt);
}

/* GET /.well-known/jwks.json -> {keys: [...]}: every key a valid credential may be signed
 * with (RFC 7517), for game backends that verify credentials themselves. */
void h_jwks(sd_req_t *req, sd_resp_t *resp)
{
    json_t *doc;
    int rc = sd_cred_jwks(&doc);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    /* a verifier refetches on an unknown kid; a new key signs only after a rotation */
    sd_resp_header(resp, "Cache-Control", "max-age=60");
    sd_resp_json(resp, 200, doc);
}
