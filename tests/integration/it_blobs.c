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
#include "harness_sdctl.h"
#include "harness_stack.h"
#include "sdclient.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* cmocka group setup: redis-server, and serverdir on it with blobs of at most 4 KiB. */
static int setup(void **state)
{
    return h_stack_setup(state, &redis, &sd, &(h_sd_opts_t){.config = "{\"blob_max_bytes\": 4096}"});
}

static sdc_lock_t lock(sdc_t *c, const char *key, const char *holder)
{
    sdc_lock_t l;
    sdc_err_t err;
    assert_int_equal(sdc_lock_acquire(c, key, holder, NULL, &l, &err), SDC_OK);
    return l;
}

/* "Lock-Token: <the grant's token>" into buf. */
static const char *token_header(char *buf, size_t cap, const sdc_lock_t *l)
{
    snprintf(buf, cap, "Lock-Token: %s", l->lock_token);
    return buf;
}

/* The Lock-Token header every raw PUT of this file sends (set by each test). */
static char cur_tok[64];

/* A raw PUT with the given headers (NULL entries end the list early) and cur_tok. */
static long put_raw(const char *key, const char *h1, const char *h2, const void *data, size_t len,
                    const char *token, h_resp_t *r)
{
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/%s", sd.url, key);
    const char *hdrs[] = {cur_tok, h1, h2, NULL};
    if (!cur_tok[0])
        hdrs[0] = h1, hdrs[1] = h2, hdrs[2] = NULL;
    assert_int_equal(h_http("PUT", url, token, "application/octet-stream", data, len, hdrs, r), 0);
    return r->status;
}

static void put_refused(const char *key, const char *h1, const char *h2, const void *data,
                        size_t len, const char *token, long status, const char *code)
{
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    h_resp_t r;
    long got = put_raw(key, h1, h2, data, len, token, &r);
    if (got != status || strcmp(h_err_code(&r), code))
        fprintf(stderr, "PUT %s -> %ld %s\n", key, got, r.body ? r.body : "");
    assert_int_equal(got, status);
    assert_string_equal(h_err_code(&r), code);
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);
}

static void save_and_read_bytes(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_lock_t s = lock(c, "b-rw", "A");
    sdc_err_t err;
    void *data;
    size_t len;
    int64_t bseq = 0;
    /* Nothing saved yet: 404 no_blob. */
    assert_int_equal(sdc_blob_get(c, "b-rw", &s, &data, &len, &bseq, &err), SDC_E_HTTP);
    assert_int_equal(err.status, 404);
    assert_string_equal(err.code, "no_blob");
    sdc_err_clear(&err);

    const unsigned char bin[] = {0, 1, 2, 255, 0, 'x', '\n', 0};
    assert_int_equal(sdc_blob_put(c, &s, 1, bin, sizeof bin, &err), SDC_OK);
    assert_int_equal(sdc_blob_get(c, "b-rw", &s, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(len, sizeof bin);
    assert_memory_equal(data, bin, sizeof bin);
    assert_int_equal(bseq, 1);
    free(data);

    /* Blob-Seq may jump; it only has to grow. */
    assert_int_equal(sdc_blob_put(c, &s, 10, "ten", 3, &err), SDC_OK);
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
    snprintf(want, sizeof want, "%lld", (long long)s.lock_seq);
    assert_string_equal(v, want);
    h_resp_free(&r);
    /* An empty blob is a valid save. */
    assert_int_equal(sdc_blob_put(c, &s, 11, NULL, 0, &err), SDC_OK);
    assert_int_equal(sdc_blob_get(c, "b-rw", NULL, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(len, 0);
    assert_int_equal(bseq, 11);
    free(data);
    assert_int_equal(sdc_lock_release(c, &s, "A", &err), SDC_OK);
    sdc_free(c);
}

static void stale_and_fenced_saves_change_nothing(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_lock_t s = lock(c, "b-fence", "A");
    token_header(cur_tok, sizeof cur_tok, &s);
    sdc_err_t err;
    assert_int_equal(sdc_blob_put(c, &s, 5, "five", 4, &err), SDC_OK);
    char ls[48];
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s.lock_seq);
    put_refused("b-fence", ls, "Blob-Seq: 5", "again", 5, H_TOK_GAME, 409, "stale_seq");
    put_refused("b-fence", ls, "Blob-Seq: 4", "older", 5, H_TOK_GAME, 409, "stale_seq");
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s.lock_seq - 1);
    put_refused("b-fence", ls, "Blob-Seq: 6", "fenced", 6, H_TOK_GAME, 409, "fenced");
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s.lock_seq + 1);
    put_refused("b-fence", ls, "Blob-Seq: 6", "fenced", 6, H_TOK_GAME, 409, "fenced");

    /* A reader naming a wrong lock_seq is fenced too, and stamps nothing. */
    char url[256];
    snprintf(url, sizeof url, "%s/v1/blobs/b-fence", sd.url);
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    h_resp_t r;
    const char *hdr[] = {ls, cur_tok, NULL};
    assert_int_equal(h_http("GET", url, H_TOK_GAME, NULL, NULL, 0, hdr, &r), 0);
    assert_int_equal(r.status, 409);
    assert_string_equal(h_err_code(&r), "fenced");
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);

    /* Released: nobody holds the lock, every save is fenced. */
    assert_int_equal(sdc_lock_release(c, &s, "A", &err), SDC_OK);
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s.lock_seq);
    put_refused("b-fence", ls, "Blob-Seq: 6", "late", 4, H_TOK_GAME, 409, "fenced");
    cur_tok[0] = '\0';
    void *data;
    size_t len;
    int64_t bseq;
    assert_int_equal(sdc_blob_get(c, "b-fence", NULL, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 5);
    assert_memory_equal(data, "five", 4);
    free(data);
    sdc_free(c);
}

static void bad_headers_keys_and_sizes(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_lock_t s = lock(c, "b-bad", "A");
    sdc_err_t err;
    assert_int_equal(sdc_blob_put(c, &s, 1, "one", 3, &err), SDC_OK);
    char ls[48];
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)s.lock_seq);

    /* The grant's Lock-Token is required, whole and well formed. */
    put_refused("b-bad", ls, "Blob-Seq: 2", "x", 1, H_TOK_GAME, 400, "missing_lock_token");
    const char *bad_tokens[] = {"Lock-Token: 0123", "Lock-Token: 0123456789ABCDEF0123456789abcdef",
                                "Lock-Token: 0123456789abcdef0123456789abcdef0", NULL};
    for (const char *const *b = bad_tokens; *b; b++) {
        snprintf(cur_tok, sizeof cur_tok, "%s", *b);
        put_refused("b-bad", ls, "Blob-Seq: 2", "x", 1, H_TOK_GAME, 400, "bad_lock_token");
    }
    token_header(cur_tok, sizeof cur_tok, &s);

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
    /* A read naming its lock_seq presents the grant's token too. */
    hdr[0] = ls;
    assert_int_equal(h_http("GET", url, H_TOK_GAME, NULL, NULL, 0, hdr, &r), 0);
    assert_int_equal(r.status, 400);
    assert_string_equal(h_err_code(&r), "missing_lock_token");
    h_resp_free(&r);
    cur_tok[0] = '\0';

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
    assert_int_equal(sdc_lock_release(c, &s, "A", &err), SDC_OK);
    sdc_free(c);
}

/* The fencing story: two game servers and an operator. */
static void fencing_story_two_servers(void **state)
{
    sdc_t *a = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_t *b = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_t *ops = sdc_new(sd.url, H_TOK_OPS, h_ms(5000));
    sdc_err_t err;
    void *data;
    size_t len;
    int64_t bseq;

    /* A takes the player, loads (nothing yet) and saves twice. */
    sdc_lock_t sa = lock(a, "player-42", "server-A");
    assert_int_equal(sdc_blob_get(a, "player-42", &sa, &data, &len, &bseq, &err), SDC_E_HTTP);
    sdc_err_clear(&err);
    assert_int_equal(sdc_blob_put(a, &sa, 1, "A:level1", 8, &err), SDC_OK);
    assert_int_equal(sdc_blob_put(a, &sa, 2, "A:level2", 8, &err), SDC_OK);

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
    sdc_lock_t sb = lock(b, "player-42", "server-B");
    assert_true(sb.lock_seq > sa.lock_seq);
    assert_int_equal(sdc_blob_get(b, "player-42", &sb, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 2);
    assert_memory_equal(data, "A:level2", 8);
    free(data);
    assert_int_equal(sdc_blob_put(b, &sb, 3, "B:level3", 8, &err), SDC_OK);

    /* A wakes up with old data in memory: every save is refused, whatever Blob-Seq. */
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    assert_int_equal(sdc_blob_put(a, &sa, 3, "A:stale3", 8, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    assert_int_equal(sdc_blob_put(a, &sa, 1000, "A:stale", 7, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    assert_int_equal(sdc_lock_release(a, &sa, "server-A", &err), SDC_E_HTTP);
    assert_string_equal(err.code, "not_holder");
    sdc_err_clear(&err);
    assert_int_equal(sdc_lock_renew(a, &sa, "server-A", 1000, NULL, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "not_holder");
    sdc_err_clear(&err);
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);

    /* B's data is intact. */
    assert_int_equal(sdc_blob_get(ops, "player-42", NULL, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 3);
    assert_int_equal(len, 8);
    assert_memory_equal(data, "B:level3", 8);
    free(data);
    assert_int_equal(sdc_lock_release(b, &sb, "server-B", &err), SDC_OK);
    sdc_free(a);
    sdc_free(b);
    sdc_free(ops);
}

/* 1 when the file at path contains needle. */
static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* The answer of a raw request carrying one extra header (may be NULL). */
static long raw(const char *method, const char *path, const char *token, const char *hdr,
                h_resp_t *r)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", sd.url, path);
    const char *hdrs[] = {hdr, NULL};
    assert_int_equal(h_http(method, url, token, NULL, NULL, 0, hdrs, r), 0);
    return r->status;
}

/* The story the lock token closes: a stale server whose save is refused retries with the
 * number the refusal gave it, then with the lock_seq anyone can read (GET /v1/locks, a
 * blob read's Lock-Seq header). The refusal names no lock_seq, and no number it can learn
 * makes its save pass: only the new holder's secret lock_token would. */
static void stale_holder_retrying_with_numbers_it_can_read_is_fenced(void **state)
{
    sdc_t *a = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_t *b = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_t *ops = sdc_new(sd.url, H_TOK_OPS, h_ms(5000));
    sdc_err_t err;
    sdc_lock_t la = lock(a, "p-retry", "server-A");
    assert_int_equal(sdc_blob_put(a, &la, 1, "A:1", 3, &err), SDC_OK);
    assert_int_equal(sdc_lock_force_unlock(ops, "p-retry", NULL, &err), SDC_OK);
    sdc_lock_t lb = lock(b, "p-retry", "server-B");
    assert_int_equal(sdc_blob_put(b, &lb, 2, "B:2", 3, &err), SDC_OK);
    assert_string_not_equal(la.lock_token, lb.lock_token);

    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    /* A's save: 409 fenced that says nothing of the current grant. */
    assert_int_equal(sdc_blob_put(a, &la, 3, "A:3", 3, &err), SDC_E_HTTP);
    assert_int_equal(err.status, 409);
    assert_string_equal(err.code, "fenced");
    json_t *e = json_object_get(err.body, "error");
    assert_null(json_object_get(e, "lock_seq"));
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)lb.lock_seq);
    char *dump = json_dumps(err.body, 0);
    assert_null(strstr(dump, num));
    assert_null(strstr(dump, lb.lock_token));
    free(dump);
    sdc_err_clear(&err);

    /* The naive loop: the current lock_seq is public, A retries with it and its own
     * token, with no token, and with B's lock_seq on every path; all refused. */
    sdc_lock_info_t li;
    assert_int_equal(sdc_lock_get(a, "p-retry", &li, NULL, &err), SDC_OK);
    assert_int_equal(li.lock_seq, lb.lock_seq);
    sdc_lock_t forged = la;
    forged.lock_seq = li.lock_seq;
    for (int64_t bs = 3; bs < 6; bs++) {
        assert_int_equal(sdc_blob_put(a, &forged, bs, "A:x", 3, &err), SDC_E_HTTP);
        assert_string_equal(err.code, "fenced");
        sdc_err_clear(&err);
    }
    assert_int_equal(sdc_lock_renew(a, &forged, "server-B", 0, NULL, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    assert_int_equal(sdc_lock_release(a, &forged, "server-B", &err), SDC_E_HTTP);
    assert_string_equal(err.code, "fenced");
    sdc_err_clear(&err);
    char ls[48];
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)li.lock_seq);
    cur_tok[0] = '\0';
    put_refused("p-retry", ls, "Blob-Seq: 9", "A:y", 3, H_TOK_GAME, 400, "missing_lock_token");
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);

    /* B's save and data stand. */
    void *data;
    size_t len;
    int64_t bseq;
    assert_int_equal(sdc_blob_get(b, "p-retry", &lb, &data, &len, &bseq, &err), SDC_OK);
    assert_int_equal(bseq, 2);
    assert_memory_equal(data, "B:2", 3);
    free(data);
    assert_int_equal(sdc_lock_release(b, &lb, "server-B", &err), SDC_OK);
    sdc_free(a);
    sdc_free(b);
    sdc_free(ops);
}

/* Another game server, with a game token of its own, reads the lock_seq of a lock it does
 * not hold and guesses tokens: it can neither save, renew, release nor read as holder. */
static void another_game_token_cannot_act_for_the_holder(void **state)
{
    sdc_t *owner = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_t *other = sdc_new(sd.url, H_TOK_GAME2, h_ms(5000));
    sdc_err_t err;
    sdc_lock_t l = lock(owner, "p-other", "zone-1");
    assert_int_equal(sdc_blob_put(owner, &l, 1, "mine", 4, &err), SDC_OK);

    /* What the other learns by reading: the lock_seq from the lock and the blob. */
    h_resp_t r;
    assert_int_equal(raw("GET", "/v1/blobs/p-other", H_TOK_GAME2, NULL, &r), 200);
    char seqv[32];
    assert_int_equal(h_resp_header(&r, "Lock-Seq", seqv, sizeof seqv), 0);
    h_resp_free(&r);
    sdc_lock_t guess = {.key = "p-other", .lock_seq = strtoll(seqv, NULL, 10)};
    assert_int_equal(guess.lock_seq, l.lock_seq);

    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    const char *tries[] = {"00000000000000000000000000000000", "ffffffffffffffffffffffffffffffff",
                           NULL};
    char flipped[33];
    memcpy(flipped, l.lock_token, sizeof flipped);
    flipped[31] = flipped[31] == '0' ? '1' : '0'; /* one hex digit off */
    for (int i = 0; i < 3; i++) {
        memcpy(guess.lock_token, i < 2 ? tries[i] : flipped, sizeof guess.lock_token);
        assert_int_equal(sdc_blob_put(other, &guess, 2, "theirs", 6, &err), SDC_E_HTTP);
        assert_string_equal(err.code, "fenced");
        sdc_err_clear(&err);
        assert_int_equal(sdc_lock_renew(other, &guess, "zone-1", 0, NULL, &err), SDC_E_HTTP);
        assert_string_equal(err.code, "fenced");
        sdc_err_clear(&err);
        assert_int_equal(sdc_lock_release(other, &guess, "zone-1", &err), SDC_E_HTTP);
        assert_string_equal(err.code, "fenced");
        sdc_err_clear(&err);
        assert_int_equal(sdc_lock_release_many(other, &guess, 1, "zone-1", &err), SDC_E_HTTP);
        assert_string_equal(err.code, "fenced");
        sdc_err_clear(&err);
        void *data;
        size_t len;
        assert_int_equal(sdc_blob_get(other, "p-other", &guess, &data, &len, NULL, &err),
                         SDC_E_HTTP);
        assert_string_equal(err.code, "fenced");
        sdc_err_clear(&err);
    }
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);
    /* The holder's grant still works. */
    assert_int_equal(sdc_lock_renew(owner, &l, "zone-1", 0, NULL, &err), SDC_OK);
    assert_int_equal(sdc_blob_put(owner, &l, 2, "mine2", 5, &err), SDC_OK);
    assert_int_equal(sdc_lock_release(owner, &l, "zone-1", &err), SDC_OK);
    sdc_free(owner);
    sdc_free(other);
}

/* A Blob-Seq more than 2^32 above the stored one is refused (a buggy or hostile client
 * cannot push it near 2^53 and lock the holder out); ops can delete a blob to repair it. */
static void blob_seq_jump_refused_and_ops_delete_repairs(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_t *ops = sdc_new(sd.url, H_TOK_OPS, h_ms(5000));
    sdc_err_t err;
    sdc_lock_t l = lock(c, "p-jump", "A");
    assert_int_equal(sdc_blob_put(c, &l, 5, "five", 4, &err), SDC_OK);
    char ls[48];
    snprintf(ls, sizeof ls, "Lock-Seq: %lld", (long long)l.lock_seq);
    token_header(cur_tok, sizeof cur_tok, &l);
    put_refused("p-jump", ls, "Blob-Seq: 4294967302", "far", 3, H_TOK_GAME, 400, "blob_seq_jump");
    put_refused("p-jump", ls, "Blob-Seq: 9007199254740992", "far", 3, H_TOK_GAME, 400,
                "blob_seq_jump");
    h_resp_t r;
    assert_int_equal(put_raw("p-jump", ls, "Blob-Seq: 4294967302", "far", 3, H_TOK_GAME, &r), 400);
    json_t *j = h_resp_json(&r);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "max_step")),
                     4294967296LL);
    json_decref(j);
    h_resp_free(&r);
    cur_tok[0] = '\0';
    /* Exactly 2^32 above is still a valid step. */
    assert_int_equal(sdc_blob_put(c, &l, 5 + 4294967296LL, "step", 4, &err), SDC_OK);

    /* Only ops may delete. */
    h_keys_t before, after;
    h_keys_take(&redis, &before, H_KEYS_LOCKS, NULL);
    assert_int_equal(raw("DELETE", "/v1/blobs/p-jump", H_TOK_GAME, NULL, &r), 403);
    h_resp_free(&r);
    assert_int_equal(raw("DELETE", "/v1/blobs/p-jump", H_TOK_VIEWER, NULL, &r), 403);
    h_resp_free(&r);
    assert_int_equal(raw("DELETE", "/v1/blobs/p-none", H_TOK_OPS, NULL, &r), 404);
    assert_string_equal(h_err_code(&r), "no_blob");
    h_resp_free(&r);
    h_keys_take(&redis, &after, H_KEYS_LOCKS, NULL);
    h_keys_same(&before, &after, __func__);
    json_t *ans = NULL;
    assert_int_equal(sdc_blob_delete(ops, "p-none", &ans, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "no_blob");
    sdc_err_clear(&err);
    /* The operator's way: sdctl blobs delete. */
    const char *args[] = {"--url", sd.url, "--token", H_TOK_OPS, "blobs", "delete", "p-jump", NULL};
    char out[1024];
    assert_int_equal(h_sdctl_run(args, NULL, 5000, out, sizeof out), 0);
    assert_non_null(strstr(out, "deleted blob p-jump (Blob-Seq 4294967301, 4 bytes)"));
    assert_true(file_has(sd.log, "msg=\"blob deleted\" key=p-jump"));
    assert_int_equal(raw("GET", "/metrics", NULL, NULL, &r), 200);
    assert_non_null(strstr(r.body, "serverdir_blob_deletes_total 1"));
    h_resp_free(&r);

    /* Repaired: the next save starts again from 1; a later grant is still higher. */
    void *data;
    size_t len;
    assert_int_equal(sdc_blob_get(c, "p-jump", NULL, &data, &len, NULL, &err), SDC_E_HTTP);
    assert_string_equal(err.code, "no_blob");
    sdc_err_clear(&err);
    assert_int_equal(sdc_blob_put(c, &l, 1, "one", 3, &err), SDC_OK);
    assert_int_equal(sdc_lock_release(c, &l, "A", &err), SDC_OK);
    sdc_lock_t l2 = lock(c, "p-jump", "B");
    assert_true(l2.lock_seq > l.lock_seq);
    assert_int_equal(sdc_lock_release(c, &l2, "B", &err), SDC_OK);
    sdc_free(c);
    sdc_free(ops);
}

/* The lock_token reaches its holder in the grant and nowhere else: not in the lock's
 * record, the listings, a blob read, an error, or serverdir's log. */
static void lock_token_is_shown_to_nobody_else(void **state)
{
    sdc_t *c = sdc_new(sd.url, H_TOK_GAME, h_ms(5000));
    sdc_err_t err;
    sdc_lock_t l = lock(c, "p-secret", "holder-S");
    assert_int_equal(strlen(l.lock_token), 32);
    assert_int_equal(sdc_blob_put(c, &l, 1, "s", 1, &err), SDC_OK);
    /* The same holder acquiring again with its grant's token gets the same grant; naming
     * the holder without the token learns nothing (409, no token in the answer). */
    sdc_lock_t again;
    sdc_lock_opts_t o = {.lock_token = l.lock_token};
    assert_int_equal(sdc_lock_acquire(c, "p-secret", "holder-S", &o, &again, &err), SDC_OK);
    assert_true(again.reacquired);
    assert_int_equal(again.lock_seq, l.lock_seq);
    assert_string_equal(again.lock_token, l.lock_token);
    {
        h_resp_t r;
        char url[256];
        snprintf(url, sizeof url, "%s/v1/locks/p-secret", sd.url);
        assert_int_equal(h_http("PUT", url, H_TOK_GAME, "application/json",
                                "{\"holder\":\"holder-S\"}", 21, NULL, &r),
                         0);
        assert_int_equal(r.status, 409);
        assert_null(strstr(r.body ? r.body : "", l.lock_token));
        h_resp_free(&r);
    }

    const char *reads[] = {"/v1/locks/p-secret", "/v1/locks?holder=holder-S", "/v1/locks",
                           "/v1/blobs/p-secret", NULL};
    for (const char *const *p = reads; *p; p++) {
        h_resp_t r;
        assert_int_equal(raw("GET", *p, H_TOK_VIEWER, NULL, &r), 200);
        assert_null(strstr(r.body ? r.body : "", l.lock_token));
        assert_null(strstr(r.headers ? r.headers : "", l.lock_token));
        h_resp_free(&r);
    }
    /* Errors: another holder's refused acquire, a stale release. */
    h_resp_t r;
    char url[256];
    snprintf(url, sizeof url, "%s/v1/locks/p-secret", sd.url);
    assert_int_equal(h_http("PUT", url, H_TOK_GAME, NULL, "{\"holder\":\"x\"}", 14, NULL, &r), 0);
    assert_int_equal(r.status, 409);
    assert_null(strstr(r.body, l.lock_token));
    h_resp_free(&r);
    assert_int_equal(sdc_lock_release(c, &l, "holder-S", &err), SDC_OK);
    assert_int_equal(sdc_lock_release(c, &l, "holder-S", &err), SDC_E_HTTP);
    char *dump = json_dumps(err.body, 0);
    assert_null(strstr(dump, l.lock_token));
    free(dump);
    sdc_err_clear(&err);
    assert_false(file_has(sd.log, l.lock_token));
    sdc_free(c);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(save_and_read_bytes),
        cmocka_unit_test(stale_and_fenced_saves_change_nothing),
        cmocka_unit_test(bad_headers_keys_and_sizes),
        cmocka_unit_test(fencing_story_two_servers),
        cmocka_unit_test(stale_holder_retrying_with_numbers_it_can_read_is_fenced),
        cmocka_unit_test(another_game_token_cannot_act_for_the_holder),
        cmocka_unit_test(blob_seq_jump_refused_and_ops_delete_repairs),
        cmocka_unit_test(lock_token_is_shown_to_nobody_else),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
