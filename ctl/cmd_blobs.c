/* sdctl blobs: read a player's saved blob, or delete one to repair it (docs/locks.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

SDCTL_CMD("blobs", cmd_blobs, "read a saved blob (get KEY [-o FILE]) or delete one (delete KEY)");

static const char usage_text[] =
    "usage: sdctl blobs get KEY [-o FILE]\n"
    "  writes the blob's bytes to FILE (or stdout) and its Blob-Seq to stderr;\n"
    "  with the global -o json, prints {key, blob_seq, bytes} instead of the bytes.\n"
    "       sdctl blobs delete KEY\n"
    "  deletes the blob (ops token), e.g. one whose Blob-Seq a buggy client drove up:\n"
    "  the holder's next save may start again from Blob-Seq 1.\n";

static void deleted_print(const ctl_t *ctl, const json_t *ans, const void *key)
{
    char seq[32], bytes[32];
    (void)ctl;
    printf("deleted blob %s (Blob-Seq %s, %s bytes)\n", (const char *)key,
           ctl_jstr(json_object_get(ans, "blob_seq"), seq, sizeof seq),
           ctl_jstr(json_object_get(ans, "bytes"), bytes, sizeof bytes));
}

static int blobs_delete(ctl_t *ctl, const char *key)
{
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_blob_delete(ctl->client, key, &ans, &err);
    return ctl_answer(ctl, rc, &err, ans, deleted_print, key);
}

int cmd_blobs(ctl_t *ctl, int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage_text, stdout);
        return CTL_EXIT_OK;
    }
    if (argc == 3 && !strcmp(argv[1], "delete"))
        return blobs_delete(ctl, argv[2]);
    const char *file = NULL;
    if (argc == 5 && !strcmp(argv[3], "-o"))
        file = argv[4];
    else if (argc != 3)
        return ctl_usage("blobs", "expected get KEY [-o FILE] or delete KEY");
    if (strcmp(argv[1], "get"))
        return ctl_usage("blobs", "unknown subcommand '%s'", argv[1]);
    const char *key = argv[2];

    void *data = NULL;
    size_t len = 0;
    int64_t seq = 0;
    sdc_err_t err;
    int rc = sdc_blob_get(ctl->client, key, NULL, &data, &len, &seq, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    rc = CTL_EXIT_OK;
    if (ctl->json && !file) {
        json_t *o = json_pack("{s:s, s:I, s:I}", "key", key, "blob_seq", (json_int_t)seq, "bytes",
                              (json_int_t)len);
        ctl_print_json(o);
        json_decref(o);
    } else {
        FILE *f = file ? fopen(file, "wb") : stdout;
        int ok = f && fwrite(data, 1, len, f) == len;
        if (file && f && fclose(f))
            ok = 0;
        if (!ok) {
            fprintf(stderr, "sdctl blobs: cannot write %s: %s\n", file ? file : "stdout",
                    strerror(errno));
            rc = CTL_EXIT_FAILED;
        } else {
            fprintf(stderr, "blob %s: %zu bytes, Blob-Seq %lld\n", key, len, (long long)seq);
        }
    }
    free(data);
    return rc;
}
