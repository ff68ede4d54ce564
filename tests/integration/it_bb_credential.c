/* Instance credentials end to end (docs/operations.md, "Credential delivery"): a real
 * bigbrother with a machine-bound token supervises a gameproc that has no shared game
 * token (--credential required). bigbrother obtains the instance's credential once the
 * directory has its `started` event and hands it over twice: the agent frame
 * (bbagent_credential) and STATE_DIR/credentials/<instance>.jwt (0600, directory 0700),
 * named by SERVERDIR_CREDENTIAL_FILE; the game locks its player as its own instance with
 * it; the credential cannot lock as another holder; bigbrother renews it before it
 * expires (credentials.ttl_s 60, credential_renew_percent 90: after about 6 s) and the
 * game takes the renewal from both; when the instance stops the file is deleted and the
 * credential refused (401 credential_revoked). A renewal that fails while serverdir is
 * down is retried with backoff until it lands. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness_bigbrother.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* Reads the whole file at path into buf (NUL-terminated); its length, or -1. */
static int file_get(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (int)n;
}

static int file_exists(void *path)
{
    return access(path, F_OK) == 0;
}

static int file_gone(void *path)
{
    return access(path, F_OK) != 0;
}

typedef struct {
    const char *path;
    const char *old;
} changed_t;

static int file_changed(void *arg)
{
    const changed_t *c = arg;
    char buf[8192];
    return file_get(c->path, buf, sizeof buf) > 0 && strcmp(buf, c->old) != 0;
}

/* PUT /v1/locks/{key} {"holder": holder} with bearer token; the answer's status and
 * error code into code (cap 64). */
static long lock_put(const char *token, const char *key, const char *holder, char *code)
{
    char body[256];
    snprintf(body, sizeof body, "{\"holder\": \"%s\"}", holder);
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, token, body, &r, "/v1/locks/%s", key), 0);
    long st = r.status;
    const char *c = h_err_code(&r);
    snprintf(code, 64, "%s", c ? c : "");
    h_resp_free(&r);
    return st;
}

typedef struct {
    const char *key, *holder;
} held_t;

/* The lock key is held by holder (viewer token). */
static int lock_held_by(void *arg)
{
    const held_t *w = arg;
    h_resp_t r;
    if (h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/locks/%s", w->key))
        return 0;
    json_t *j = r.status == 200 ? h_resp_json(&r) : NULL;
    const char *h = json_string_value(json_object_get(j, "holder"));
    int ok = h && !strcmp(h, w->holder);
    json_decref(j);
    h_resp_free(&r);
    return ok;
}

typedef struct {
    const char *jwt, *holder;
    long status;
    char code[64];
} revoked_t;

/* The credential is refused as revoked for a lock as its own instance. */
static int refused_revoked(void *arg)
{
    revoked_t *w = arg;
    w->status = lock_put(w->jwt, "cred-after-stop", w->holder, w->code);
    return w->status == 401 && !strcmp(w->code, "credential_revoked");
}

typedef struct {
    const char *path, *needle;
    int count;
} lines_t;

static int log_lines(void *arg)
{
    const lines_t *w = arg;
    return bbt_lines_with(w->path, w->needle) >= w->count;
}

static void credential_obtained_used_renewed_revoked(void **state)
{
    (void)state;
    const h_sd_opts_t so = {.config = "{\"credentials\": {\"ttl_s\": 60}}"};
    assert_int_equal(h_stack_start(&redis, &sd, &so), 0);
    bbt_t b = {0};
    bbt_dirs(&b);
    int mport = h_free_port();
    char extra[768], svc[1024], glog[400];
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\","
             " \"credential_renew_percent\": 90}, \"metrics_listen\": \"127.0.0.1:%d\"",
             sd.url, H_TOK_BB_C1(1), mport);
    snprintf(glog, sizeof glog, "%s/logs/zone-0.log", b.state); /* the run's output */
    snprintf(svc, sizeof svc,
             "[{\"name\": \"zone\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\","
             " \"--serverdir\", \"%s\", \"--players\", \"1\", \"--player-keys\", \"7-7\","
             " \"--save-every-ms\", \"300\", \"--credential\", \"required\"],"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000,"
             " \"liveness_timeout_ms\": 3000}, \"stop\": {\"grace_ms\": 2000}}]",
             GAMEPROC, sd.url);
    bbt_config(&b, svc, extra);
    assert_true(bbt_start(&b) > 0);
    json_t *in = bbt_wait(&b, "zone", 0, "ready", 1, h_ms(10000));
    assert_non_null(in);
    char id[160];
    snprintf(id, sizeof id, "%s", bbt_str(in, "instance"));
    json_decref(in);

    /* The file: 0600 in a 0700 directory, named by SERVERDIR_CREDENTIAL_FILE. */
    char path[600], dir[400];
    snprintf(dir, sizeof dir, "%s/credentials", b.state);
    snprintf(path, sizeof path, "%s/%s.jwt", dir, id);
    assert_true(h_wait_until(file_exists, path, h_ms(10000)));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    char jwt[8192];
    int n = file_get(path, jwt, sizeof jwt);
    assert_true(n > 100 && n <= 4096);

    /* The game got it from both, and locks its player as its own instance with it. */
    lines_t got_agent = {glog, "credential received\" source=agent", 1};
    lines_t got_file = {glog, "credential received\" source=file", 1};
    assert_true(h_wait_until(log_lines, &got_agent, h_ms(10000)));
    assert_true(h_wait_until(log_lines, &got_file, h_ms(10000)));
    char want[64];
    snprintf(want, sizeof want, "source=file bytes=%d", n);
    assert_true(bbt_file_has(glog, want));
    held_t h = {"player:7", id};
    assert_true(h_wait_until(lock_held_by, &h, h_ms(10000)));

    /* The credential locks as its instance only. */
    char code[64];
    assert_int_equal(lock_put(jwt, "cred-own", id, code), 200);
    assert_int_equal(lock_put(jwt, "cred-other", "zone-m1-someone-else", code), 403);
    assert_string_equal(code, "forbidden");

    /* Renewed before it expires: a new file, sent to the agent too, used by the game. */
    changed_t ch = {path, jwt};
    assert_true(h_wait_until(file_changed, &ch, h_ms(20000)));
    char jwt2[8192];
    assert_true(file_get(path, jwt2, sizeof jwt2) > 100);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    lines_t ren_agent = {glog, "credential renewed\" source=agent", 1};
    lines_t ren_file = {glog, "credential renewed\" source=file", 1};
    assert_true(h_wait_until(log_lines, &ren_agent, h_ms(10000)));
    assert_true(h_wait_until(log_lines, &ren_file, h_ms(10000)));
    assert_int_equal(lock_put(jwt2, "cred-own2", id, code), 200);
    char murl[64];
    snprintf(murl, sizeof murl, "http://127.0.0.1:%d", mport);
    assert_true(h_metric(murl, "bigbrother_credentials_total{result=\"obtained\"}") >= 1);
    assert_true(h_metric(murl, "bigbrother_credentials_total{result=\"renewed\"}") >= 1);
    assert_true(bbt_lines_with(b.log, "msg=\"credential renewed\"") >= 1);

    /* Stopped: the file goes, and the credential is refused at once. */
    json_decref(bbt_ctl(&b, "stop zone"));
    json_decref(bbt_wait(&b, "zone", 0, "stopped", 0, h_ms(10000)));
    assert_true(h_wait_until(file_gone, path, h_ms(5000)));
    revoked_t rv = {jwt2, id, 0, ""};
    if (!h_wait_until(refused_revoked, &rv, h_ms(10000)))
        fail_msg("after the stop the credential got %ld %s, not 401 credential_revoked",
                 rv.status, rv.code);
    /* as another holder too: revoked comes before the holder rule */
    assert_int_equal(lock_put(jwt2, "cred-other", "zone-m1-someone-else", code), 401);
    assert_string_equal(code, "credential_revoked");

    bbt_stop(&b, 3000);
    h_stack_stop(&redis, &sd);
}

/* A renewal that fails while serverdir is down is retried with backoff: the failure is
 * logged and counted, the file keeps the credential held meanwhile, and the renewal lands
 * once serverdir is back. */
static void renewal_retried_while_serverdir_is_down(void **state)
{
    (void)state;
    const h_sd_opts_t so = {.config = "{\"credentials\": {\"ttl_s\": 60}}"};
    assert_int_equal(h_stack_start(&redis, &sd, &so), 0);
    bbt_t b = {0};
    bbt_dirs(&b);
    int mport = h_free_port();
    char extra[768];
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\","
             " \"credential_renew_percent\": 90}, \"metrics_listen\": \"127.0.0.1:%d\"",
             sd.url, H_TOK_BB_C1(1), mport);
    bbt_config(&b, "[{\"name\": \"zone\", \"command\": \"/bin/sleep\", \"args\": [\"100000\"],"
                   " \"health\": {\"type\": \"none\"}}]", extra);
    assert_true(bbt_start(&b) > 0);
    json_t *in = bbt_wait(&b, "zone", 0, "ready", 1, h_ms(10000));
    assert_non_null(in);
    char path[600];
    snprintf(path, sizeof path, "%s/credentials/%s.jwt", b.state, bbt_str(in, "instance"));
    json_decref(in);
    assert_true(h_wait_until(file_exists, path, h_ms(10000)));
    char jwt[8192], now[8192];
    assert_true(file_get(path, jwt, sizeof jwt) > 100);

    h_serverdir_stop(&sd); /* before the renewal, due about 6 s after the first */
    lines_t failed = {b.log, "msg=\"credential request failed\"", 1};
    assert_true(h_wait_until(log_lines, &failed, h_ms(20000)));
    assert_true(bbt_file_has(b.log, "retry_in_ms="));
    char murl[64];
    snprintf(murl, sizeof murl, "http://127.0.0.1:%d", mport);
    assert_true(h_metric(murl, "bigbrother_credentials_total{result=\"failed\"}") >= 1);
    assert_int_equal(h_metric(murl, "bigbrother_credentials_total{result=\"renewed\"}"), 0);
    assert_true(file_get(path, now, sizeof now) > 0);
    assert_string_equal(now, jwt); /* the one held stays handed over */

    assert_int_equal(h_serverdir_restart(&sd, redis.url), 0);
    changed_t ch = {path, jwt};
    assert_true(h_wait_until(file_changed, &ch, h_ms(20000)));
    assert_true(h_metric(murl, "bigbrother_credentials_total{result=\"renewed\"}") >= 1);
    assert_true(bbt_lines_with(b.log, "msg=\"credential renewed\"") >= 1);

    bbt_stop(&b, 3000);
    h_stack_stop(&redis, &sd);
}

int main(void)
{
    h_init(240);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(credential_obtained_used_renewed_revoked),
        cmocka_unit_test(renewal_retried_while_serverdir_is_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
