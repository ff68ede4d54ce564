/* The fenced blob store against a real redis-server and serverdir: save and read raw
 * bytes with Blob-Seq, stale and fenced saves refused with nothing changed, header and
 * size validation, reader stamping, and the fencing story end to end with two client
 * "servers": A holds a player, ops force-unlocks, B takes it and saves, A's late save is
 * refused and B's data is intact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "harness_stack.h"
#include "sdclient.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with blobs of at most 4 KiB. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, &(h_sd_opts_t){.config = "{\"blob_max_bytes\": 4096}"});
}

static int64_t lock(sdc_t *c, const char *key, const char *holder)
{
    sdc_lock_t l;
    sdc_err_t err;
    assert_int_equal(sdc_lock_acquire(c, key, holder, NULL, &l, &err), SDC_OK);
    return l.lock_seq;
}

/* A raw PUT with the given headers (NULL entries end the list early). */
static long put_raw(const char *key, const char *h1, const char *h2, const void *data, size_t len,
                    const char *token, h_resp_t *r)
{
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/%s", sd.url, key);
    const char *hdrs[] = {h1, h2, NULL};
    assert_int_equal(h_http("PUT", url, token, "application/octet-stream", data, len, hdrs, r), 0);
    return r->status;
}

static void put_refused(const char *key, const char *h1, const char *h2, const void *data,
                        size_t len, const char *token, long status, const char *code)
{
    char before[64], after[64];
    h_redis_digest(&redis, before);
    h_resp_t r;
    long got = put_raw(key, h1, h2, data, len, token, &r);
    if (got != status || strcmp(h_err_code(&r), code))
        fprintf(stderr, "PUT %s -> %ld %s\n", key, got, r.body ? r.body : "");
    assert_int_equal(got, status);
    assert_string_equal(h_err_code(&r), code);
    h_resp_free(&r);
    h_redis_digest(&redis, after);
    assert_string_equal(before, after);
}

static void save_and_read_bytes(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, 5000);
    int64_t s = lock(c, "b-rw", "A");
    sdc_err_t err;
    void *data;
    size_t len;
    int64_t bseq = 0;
    /* Nothing saved yet: 404 no_blob. */
    assert_int_equal(sdc_blob_get(c, "b-rw", s, &data, &len, &bseq, &err), SDC_E_HTTP);
    assert_int_equal(err.status, 404);
    assert_string_equal(err.code, "no_blob");
    sdc_err_clear(&err);

    const unsigned char bin[] = {0, 1, 2, 255, 0, 'x', '\n', 0};
    assert_int_equal(sdc_blob_put(c, "b-rw", s, 1, bin, sizeof bin, &err), SDC_OK);
    assert_int_equal(sdc_blob_get(c, "b-rw", s, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(len, sizeof bin);
    assert_memory_equal(data, bin, sizeof bin);
    assert_int_equal(bseq, 1);
    free(data);

    /* Blob-Seq may jump; it only has to grow. */
    assert_int_equal(sdc_blob_put(c, "b-rw", s, 10, "ten", 3, &err), SDC_OK);
    /* A viewer reads too (no Lock-Seq), and sees the current lock_seq. */
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/blobs/b-rw"), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 3);
    assert_memory_equal(r.body, "ten", 3);
    char v[32], want[32];
    assert_int_equal(h_resp_header(&r, "Blob-Seq", v, sizeof v), 0);
    assert_string_equal(v, "10");
    assert_int_equal(h_resp_header(&r, "Lock-Seq", v, sizeof v), 0);
    snprintf(want, sizeof want, "%lld", (long long)s);
    assert_string_equal(v, want);
    h_resp_free(&r);
    /* An empty blob is a valid save. */
    assert_int_equal(sdc_blob_put(c, "b-rw", s, 11, NULL, 0, &err), SDC_OK);
    assert_int_equal(sdc_blob_get(c, "b-rw", 0, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(len, 0);
    assert_int_equal(bseq, 11);
    free(data);
    assert_int_equal(sdc_lock_release(c, "b-rw", "A", s, &err), SDC_OK);
    sdc_free(c);
}

static void stale_and_fenced_saves_change_nothing(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, 5000);
    int64_t s = lock(c, "b-fence", "A");
    sdc_err_t err;
    assert_int_equal(sdc_blob_put(c, "b-fence", s, 5, "five", 4, &err), SDC_OK);
    char ls[48];
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s);
    put_refused("b-fence", ls, "Blob-Seq: 5", "again", 5, H_TOK_GAME, 409, "stale_seq");
    put_refused("b-fence", ls, "Blob-Seq: 4", "older", 5, H_TOK_GAME, 409, "stale_seq");
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s - 1);
    put_refused("b-fence", ls, "Blob-Seq: 6", "fenced", 6, H_TOK_GAME, 409, "fenced");
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s + 1);
    put_refused("b-fence", ls, "Blob-Seq: 6", "fenced", 6, H_TOK_GAME, 409, "fenced");

    /* A reader naming a wrong lock_seq is fenced too, and stamps nothing. */
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/b-fence", sd.url);
    char before[64], after[64];
    h_redis_digest(&redis, before);
    h_resp_t r;
    const char *hdr[] = {ls, NULL};
    assert_int_equal(h_http("GET", url, H_TOK_GAME, NULL, NULL, 0, hdr, &r), 0);
    assert_int_equal(r.status, 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    h_redis_digest(&redis, after);
    assert_string_equal(before, after);

    /* Released: nobody holds the lock, every save is fenced. */
    assert_int_equal(sdc_lock_release(c, "b-fence", "A", s, &err), SDC_OK);
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s);
    put_refused("b-fence", ls, "Blob-Seq: 6", "late", 4, H_TOK_GAME, 409, "fenced");
    void *data;
    size_t len;
    int64_t bseq;
    assert_int_equal(sdc_blob_get(c, "b-fence", 0, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 5);
    assert_memory_equal(data, "five", 4);
    free(data);
    sdc_free(c);
}

static void bad_headers_keys_and_sizes(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, 5000);
    int64_t s = lock(c, "b-bad", "A");
    sdc_err_t err;
    assert_int_equal(sdc_blob_put(c, "b-bad", s, 1, "one", 3, &err), SDC_OK);
    char ls[48];
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s);

    put_refused("b-bad", NULL, NULL, "x", 1, H_TOK_GAME, 400, "missing_lock_seq");
    put_refused("b-bad", "Blob-Seq: 2", NULL, "x", 1, H_TOK_GAME, 400, "missing_lock_seq");
    put_refused("b-bad", ls, NULL, "x", 1, H_TOK_GAME, 400, "missing_blob_seq");
    const char *garbled[] = {"12a", "-1", "0", "+5", "7 7", "1e3", "0x10", "007",
                             "99999999999999999999", "9007199254740993", NULL};
    for (const char *const *g = garbled; *g; g++) {
        char h[64];
        snprintf(h, sizeof h, "Lock-Seq: %s", *g);
        put_refused("b-bad", h, "Blob-Seq: 2", "x", 1, H_TOK_GAME, 400, "bad_lock_seq");
        snprintf(h, sizeof h, "Blob-Seq: %s", *g);
        put_refused("b-bad", ls, h, "x", 1, H_TOK_GAME, 400, "bad_blob_seq");
    }
    put_refused("b-bad", ls, "Blob-Seq;", "x", 1, H_TOK_GAME, 400, "bad_blob_seq");
    put_refused("bad%20key", ls, "Blob-Seq: 2", "x", 1, H_TOK_GAME, 400, "bad_name");
    put_refused("-dash", ls, "Blob-Seq: 2", "x", 1, H_TOK_GAME, 400, "bad_name");

    /* Over blob_max_bytes (4096 here): 413 too_large. */
    char *big = malloc(4097);
    memset(big, 'z', 4097);
    put_refused("b-bad", ls, "Blob-Seq: 2", big, 4097, H_TOK_GAME, 413, "too_large");
    h_resp_t r;
    assert_int_equal(put_raw("b-bad", ls, "Blob-Seq: 2", big, 4096, H_TOK_GAME, &r), 200);
    h_resp_free(&r);
    free(big);

    /* Roles: a viewer may read but not save; no token: 401. */
    put_refused("b-bad", ls, "Blob-Seq: 3", "x", 1, H_TOK_VIEWER, 403, "forbidden");
    put_refused("b-bad", ls, "Blob-Seq: 3", "x", 1, NULL, 401, "unauthorized");
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/b-bad", sd.url);
    const char *hdr[] = {"Lock-Seq: x1", NULL};
    assert_int_equal(h_http("GET", url, H_TOK_GAME, NULL, NULL, 0, hdr, &r), 0);
    assert_int_equal(r.status, 400);
    assert_string_equal(h_err_code(&r), "bad_lock_seq");
    h_resp_free(&r);

    /* sdctl blobs get -o FILE writes the bytes. */
    const char *dir = h_tmpdir();
    char out[300], log[300];
    snprintf(out, sizeof out, "%s/blob.bin", dir);
    snprintf(log, sizeof log, "%s/sdctl.log", dir);
    const char *argv[] = {SD_BIN_DIR "/sdctl", "--url", sd.url, "--token", H_TOK_VIEWER,
                          "blobs", "get", "b-bad", "-o", out, NULL};
    pid_t pid = h_spawn(argv, log, NULL);
    int st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    FILE *f = fopen(out, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    assert_int_equal(ftell(f), 4096);
    fclose(f);
    assert_int_equal(sdc_lock_release(c, "b-bad", "A", s, &err), SDC_OK);
    sdc_free(c);
}

/* The fencing story: two game servers and an operator. */
static void fencing_story_two_servers(void **state)
{
    sdc_t *a = sdc_new(sd.url, H_TOK_GAME, 5000);
    sdc_t *b = sdc_new(sd.url, H_TOK_GAME, 5000);
    sdc_t *ops = sdc_new(sd.url, H_TOK_OPS, 5000);
    sdc_err_t err;
    void *data;
    size_t len;
    int64_t bseq;

    /* A takes the player, loads (nothing yet) and saves twice. */
    int64_t sa = lock(a, "player-42", "server-A");
    assert_int_equal(sdc_blob_get(a, "player-42", sa, &data, &len, &bseq, &err), SDC_E_HTTP);
    sdc_err_clear(&err);
    assert_int_equal(sdc_blob_put(a, "player-42", sa, 1, "A:level1", 8, &err), SDC_OK);
    assert_int_equal(sdc_blob_put(a, "player-42", sa, 2, "A:level2", 8, &err), SDC_OK);

    /* A hangs. B cannot take the player while A holds it. */
    sdc_lock_t lb;
    assert_int_equal(sdc_lock_acquire(b, "player-42", "server-B", NULL, &lb, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "lock_held");
    assert_string_equal(json_string_value(json_object_get(json_object_get(err.body, "error"), "holder")),
                        "server-A");
    sdc_err_clear(&err);

    /* The operator force-unlocks; B takes it, loads A's last save and saves on. */
    json_t *ans = NULL;
    assert_int_equal(sdc_lock_force_unlock(ops, "player-42", &ans, &err), SDC_OK);
    assert_string_equal(json_string_value(json_object_get(ans, "previous_holder")), "server-A");
    json_decref(ans);
    int64_t sb = lock(b, "player-42", "server-B");
    assert_true(sb > sa);
    assert_int_equal(sdc_blob_get(b, "player-42", sb, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 2);
    assert_memory_equal(data, "A:level2", 8);
    free(data);
    assert_int_equal(sdc_blob_put(b, "player-42", sb, 3, "B:level3", 8, &err), SDC_OK);

    /* A wakes up with old data in memory: every save is refused, whatever Blob-Seq. */
    char before[64], after[64];
    h_redis_digest(&redis, before);
    assert_int_equal(sdc_blob_put(a, "player-42", sa, 3, "A:stale3", 8, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    assert_int_equal(sdc_blob_put(a, "player-42", sa, 1000, "A:stale", 7, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    assert_int_equal(sdc_lock_release(a, "player-42", "server-A", sa, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "not_holder");
    sdc_err_clear(&err);
    assert_int_equal(sdc_lock_renew(a, "player-42", "server-A", sa, 1000, NULL, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "not_holder");
    sdc_err_clear(&err);
    h_redis_digest(&redis, after);
    assert_string_equal(before, after);

    /* B's data is intact. */
    assert_int_equal(sdc_blob_get(ops, "player-42", 0, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 3);
    assert_int_equal(len, 8);
    assert_memory_equal(data, "B:level3", 8);
    free(data);
    assert_int_equal(sdc_lock_release(b, "player-42", "server-B", sb, &err), SDC_OK);
    sdc_free(a);
    sdc_free(b);
    sdc_free(ops);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(save_and_read_bytes),
        cmocka_unit_test(stale_and_fenced_saves_change_nothing),
        cmocka_unit_test(bad_headers_keys_and_sizes),
        cmocka_unit_test(fencing_story_two_servers),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
