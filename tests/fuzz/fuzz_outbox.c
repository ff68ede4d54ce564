/* libFuzzer target: bigbrother's outbox recovery (bigbrother/report/outbox.c) on any bytes left
 * on disk: an ack file and two segment files, as a power loss or a full disk could leave
 * them. Input layout: byte 0 = ack length A (0-127), byte 1 = where the rest splits into
 * segment 1 and segment 2 (as a fraction of 255), then A bytes of ack file, then the
 * segments. Properties: outbox_open either refuses with an errno or recovers; every
 * record read back is non-empty, holds no '\n' and is at most OUTBOX_RECORD_MAX; the
 * reads end (bounded); and a record appended after recovery is the last one read: no
 * damage on disk makes a new event unreadable or lost.
 * With byte 1 = 255, the rest is damage instead: bytes 2-3 an offset, then at most 64 bytes
 * written there over a segment of NREC valid records. Property: every record whose bytes
 * the damage did not touch is read back, in order, and nothing but written records is read
 * (damage in the middle costs only the damaged records). Seeds: tests/fuzz/corpus/outbox/. */
#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report/bb_report.h"
#include "sdlog.h"

static char dir[64];

static void put(const char *name, const uint8_t *p, size_t n)
{
    char path[sizeof dir + 300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!p) {
        unlink(path);
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n))
        __builtin_trap();
    close(fd);
}

/* Everything the previous input and its recovery left (segments, ack, temp files). */
static void clear_dir(void)
{
    DIR *d = opendir(dir);
    if (!d)
        __builtin_trap();
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            put(e->d_name, NULL, 0);
    closedir(d);
}

static void remove_dir(void)
{
    clear_dir();
    rmdir(dir);
}

#define NREC 24

/* The damage mode: NREC records "rec-NN-<padding>" of different lengths, then `len` bytes
 * of p written at `off` in their segment; checks the property above. */
static void damage_run(size_t off, const uint8_t *p, size_t len)
{
    outbox_opts_t o = {.max_bytes = 1 << 20, .segment_bytes = 64 << 10};
    outbox_t *ob = NULL;
    if (outbox_open(dir, &o, &ob) < 0)
        __builtin_trap();
    size_t start[NREC + 1] = {0};
    for (int i = 0; i < NREC; i++) {
        char rec[64];
        int n = snprintf(rec, sizeof rec, "rec-%02d-%.*s", i, i % 7 * 3, "xxxxxxxxxxxxxxxxxxxxxxxx");
        if (outbox_append(ob, rec, (size_t)n))
            __builtin_trap();
        start[i + 1] = start[i] + (size_t)n + 19; /* header (18) + payload + newline */
    }
    outbox_close(ob);
    off %= start[NREC];
    if (len > start[NREC] - off)
        len = start[NREC] - off;
    char path[sizeof dir + 32];
    snprintf(path, sizeof path, "%s/0000000000000000.seg", dir);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || pwrite(fd, p, len, (off_t)off) != (ssize_t)len)
        __builtin_trap();
    close(fd);
    if (outbox_open(dir, &o, &ob) < 0)
        __builtin_trap();
    outbox_batch_t b;
    memset(&b, 0, sizeof b);
    int want = 0; /* the next record that must still come if untouched */
    for (int reads = 0;; reads++) {
        if (outbox_read(ob, 64, 64 << 10, &b) || reads > 1000)
            __builtin_trap();
        if (b.n == 0)
            break;
        for (int i = 0; i < b.n; i++) {
            int id;
            if (b.len[i] < 7 || sscanf(b.rec[i], "rec-%2d-", &id) != 1 || id < want || id >= NREC)
                __builtin_trap(); /* not a written record, or out of order */
            for (; want < id; want++)
                if (start[want + 1] <= off || start[want] >= off + len)
                    __builtin_trap(); /* an untouched record was lost */
            want = id + 1;
        }
        if (outbox_ack(ob, &b, b.n))
            __builtin_trap();
    }
    for (; want < NREC; want++)
        if (start[want + 1] <= off || start[want] >= off + len)
            __builtin_trap();
    outbox_batch_free(&b);
    outbox_close(ob);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 65536)
        return 0;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/dev/shm/fuzz_outbox.XXXXXX");
        if (!mkdtemp(dir)) {
            snprintf(dir, sizeof dir, "/tmp/fuzz_outbox.XXXXXX");
            if (!mkdtemp(dir))
                __builtin_trap();
        }
        atexit(remove_dir);
        int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (nul >= 0)
            sd_log_set_fd(nul); /* recovery logs every repair it makes: keep the run quiet */
    }
    if (data[1] == 255) {
        clear_dir();
        if (size >= 4)
            damage_run((size_t)data[2] << 8 | data[3], data + 4, size - 4 < 64 ? size - 4 : 64);
        return 0;
    }
    size_t alen = data[0] & 127;
    const uint8_t *p = data + 2;
    size_t rest = size - 2;
    if (alen > rest)
        alen = rest;
    size_t segs = rest - alen;
    size_t s1 = segs * data[1] / 255;
    clear_dir();
    if (data[0] & 128)
        put("ack", p, alen);
    put("0000000000000001.seg", p + alen, s1);
    if (segs > s1)
        put("0000000000000002.seg", p + alen + s1, segs - s1);

    outbox_t *ob = NULL;
    outbox_opts_t o = {.max_bytes = 1 << 20, .segment_bytes = 64 << 10};
    if (outbox_open(dir, &o, &ob) < 0) {
        if (ob)
            __builtin_trap();
        return 0;
    }
    static const char probe[] = "fuzz-probe-record";
    if (outbox_append(ob, probe, sizeof probe - 1))
        __builtin_trap(); /* 1 MiB cap, at most 64 KiB of input: there is room */
    outbox_batch_t b;
    memset(&b, 0, sizeof b);
    int last_is_probe = 0, reads = 0;
    for (;;) {
        if (outbox_read(ob, 64, 64 << 10, &b))
            __builtin_trap();
        if (b.n == 0)
            break;
        for (int i = 0; i < b.n; i++) {
            if (b.len[i] == 0 || b.len[i] > OUTBOX_RECORD_MAX || memchr(b.rec[i], '\n', b.len[i]))
                __builtin_trap();
            last_is_probe =
                b.len[i] == sizeof probe - 1 && !memcmp(b.rec[i], probe, sizeof probe - 1);
        }
        if (outbox_ack(ob, &b, b.n))
            __builtin_trap();
        if (++reads > 100000)
            __builtin_trap(); /* more batches than the bytes could hold: a loop */
    }
    if (!last_is_probe)
        __builtin_trap();
    outbox_batch_free(&b);
    outbox_close(ob);
    return 0;
}
