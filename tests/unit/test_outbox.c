/* The outbox (bigbrother/report/outbox.c) and the standalone reporter: order, acknowledgement
 * and recovery across reopen, torn and garbled tails, segment rotation and deletion, the
 * size cap, a concurrent producer and reader, and event ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "report/bb_report.h"

static outbox_t *open_ob(const char *dir, uint64_t max, uint64_t seg)
{
    outbox_opts_t o = {.max_bytes = max, .segment_bytes = seg};
    outbox_t *ob = NULL;
    assert_int_equal(outbox_open(dir, &o, &ob), 0);
    return ob;
}

/* Appends the record {"n":i}. */
static void append_n(outbox_t *ob, int i)
{
    char rec[32];
    int n = snprintf(rec, sizeof rec, "{\"n\":%d}", i);
    assert_int_equal(outbox_append(ob, rec, (size_t)n), 0);
}

/* Reads everything pending (acking as it goes when ack is set) and checks that record k
 * reads {"n":first+k}. Returns how many were read. */
static int drain(outbox_t *ob, int first, int ack)
{
    outbox_batch_t b = {0};
    int got = 0;
    for (int rounds = 0; rounds < 100000; rounds++) {
        assert_int_equal(outbox_read(ob, 7, 4096, &b), 0);
        if (b.n == 0)
            break;
        for (int i = 0; i < b.n; i++) {
            char want[64];
            int n = snprintf(want, sizeof want, "{\"n\":%d}", first + got + i);
            assert_int_equal(b.len[i], (size_t)n);
            assert_memory_equal(b.rec[i], want, (size_t)n);
        }
        got += b.n;
        if (!ack)
            break;
        assert_int_equal(outbox_sync(ob, &b), 0);
        assert_int_equal(outbox_ack(ob, &b, b.n), 0);
    }
    outbox_batch_free(&b);
    return got;
}

static int count_segments(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".seg") != NULL;
    closedir(d);
    return n;
}

static void append_and_read_in_order(void **state)
{
    const char *dir = h_tmpdir();
    outbox_t *ob = open_ob(dir, 0, 0);
    for (int i = 0; i < 100; i++)
        append_n(ob, i);
    assert_int_equal(outbox_pending(ob), 100);

    outbox_batch_t b = {0};
    assert_int_equal(outbox_read(ob, 40, 1 << 20, &b), 0);
    assert_int_equal(b.n, 40);
    assert_int_equal(outbox_ack(ob, &b, 40), 0);
    assert_int_equal(outbox_pending(ob), 60);
    /* A partial ack of a batch: the rest is read again. */
    assert_int_equal(outbox_read(ob, 10, 1 << 20, &b), 0);
    assert_int_equal(outbox_ack(ob, &b, 3), 0);
    outbox_batch_free(&b);
    assert_int_equal(drain(ob, 43, 1), 57);
    assert_int_equal(outbox_pending(ob), 0);

    /* Records with a newline, empty or too big are refused and change nothing. */
    uint64_t bytes = outbox_bytes(ob);
    assert_int_equal(outbox_append(ob, "a\nb", 3), -EINVAL);
    assert_int_equal(outbox_append(ob, "", 0), -EINVAL);
    char *big = malloc(OUTBOX_RECORD_MAX + 1);
    memset(big, 'x', OUTBOX_RECORD_MAX + 1);
    assert_int_equal(outbox_append(ob, big, OUTBOX_RECORD_MAX + 1), -E2BIG);
    assert_int_equal(outbox_append(ob, big, OUTBOX_RECORD_MAX), 0);
    free(big);
    assert_int_equal(outbox_bytes(ob), bytes + OUTBOX_RECORD_MAX + 19);
    outbox_close(ob);
}

static void ack_survives_reopen(void **state)
{
    const char *dir = h_tmpdir();
    outbox_t *ob = open_ob(dir, 0, 0);
    for (int i = 0; i < 10; i++)
        append_n(ob, i);
    outbox_batch_t b = {0};
    assert_int_equal(outbox_read(ob, 4, 1 << 20, &b), 0);
    assert_int_equal(outbox_ack(ob, &b, 4), 0);
    outbox_batch_free(&b);
    outbox_close(ob);

    ob = open_ob(dir, 0, 0);
    assert_int_equal(outbox_pending(ob), 6);
    for (int i = 10; i < 15; i++)
        append_n(ob, i);
    assert_int_equal(outbox_pending(ob), 11);
    /* Unacked records are read again after a reopen: read without ack, reopen, read. */
    assert_int_equal(drain(ob, 4, 0), 7);
    outbox_close(ob);
    ob = open_ob(dir, 0, 0);
    assert_int_equal(drain(ob, 4, 1), 11);
    outbox_close(ob);
    ob = open_ob(dir, 0, 0);
    assert_int_equal(outbox_pending(ob), 0);
    assert_int_equal(drain(ob, 15, 1), 0);
    outbox_close(ob);
}

static char *segment_path(const char *dir, int seg)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%016x.seg", dir, seg);
    return p;
}

static void torn_and_garbled_tails_are_dropped(void **state)
{
    const char *dir = h_tmpdir();
    outbox_t *ob = open_ob(dir, 0, 0);
    for (int i = 0; i < 5; i++)
        append_n(ob, i);
    outbox_close(ob);
    struct stat st;
    assert_int_equal(stat(segment_path(dir, 0), &st), 0);
    off_t whole = st.st_size;

    /* A record cut in the middle (power loss): header and part of the payload. */
    int fd = open(segment_path(dir, 0), O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "0000000a 12345678 {\"n\":", 23), 23);
    close(fd);
    ob = open_ob(dir, 0, 0);
    assert_int_equal(outbox_pending(ob), 5);
    assert_int_equal(stat(segment_path(dir, 0), &st), 0);
    assert_int_equal(st.st_size, whole);
    append_n(ob, 5);
    assert_int_equal(drain(ob, 0, 0), 6);
    outbox_close(ob);

    /* A whole-length record whose payload was garbled: the CRC catches it. */
    assert_int_equal(stat(segment_path(dir, 0), &st), 0);
    fd = open(segment_path(dir, 0), O_WRONLY);
    assert_int_equal(pwrite(fd, "9", 1, st.st_size - 3), 1);
    close(fd);
    ob = open_ob(dir, 0, 0);
    assert_int_equal(outbox_pending(ob), 5);
    assert_int_equal(drain(ob, 0, 1), 5);
    outbox_close(ob);

    /* Zeros at the end (a file extended but never written) are not records either. */
    fd = open(segment_path(dir, 0), O_WRONLY | O_APPEND);
    char zeros[64] = {0};
    assert_int_equal(write(fd, zeros, sizeof zeros), (ssize_t)sizeof zeros);
    close(fd);
    ob = open_ob(dir, 0, 0);
    assert_int_equal(outbox_pending(ob), 0);
    append_n(ob, 5);
    assert_int_equal(drain(ob, 5, 1), 1);
    outbox_close(ob);
}

/* Reads every pending record (acking as it goes) into ns[] as the n of {"n":n}; returns
 * how many were read. */
static int read_ns(outbox_t *ob, int *ns, int max)
{
    outbox_batch_t b = {0};
    int got = 0;
    for (int rounds = 0; rounds < 1000; rounds++) {
        assert_int_equal(outbox_read(ob, 7, 4096, &b), 0);
        if (b.n == 0)
            break;
        for (int i = 0; i < b.n; i++) {
            assert_true(got < max);
            assert_int_equal(sscanf(b.rec[i], "{\"n\":%d}", &ns[got]), 1);
            got++;
        }
        assert_int_equal(outbox_sync(ob, &b), 0);
        assert_int_equal(outbox_ack(ob, &b, b.n), 0);
    }
    outbox_batch_free(&b);
    return got;
}

/* The file offset where record k (0-based, counted by line) of segment 0 starts. */
static off_t record_offset(const char *dir, int k)
{
    FILE *f = fopen(segment_path(dir, 0), "r");
    assert_non_null(f);
    off_t off = 0;
    int c, line = 0;
    while (line < k && (c = fgetc(f)) != EOF) {
        off++;
        if (c == '\n')
            line++;
    }
    fclose(f);
    return off;
}

static void overwrite(const char *dir, off_t off, const char *bytes)
{
    int fd = open(segment_path(dir, 0), O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, strlen(bytes), off), (ssize_t)strlen(bytes));
    close(fd);
}

/* A segment of 26 records {"n":0..25} in a new directory, closed; returns the directory. */
static const char *segment_of_26(void)
{
    const char *dir = h_tmpdir(); /* a fresh directory each time, removed at exit */
    outbox_t *ob = open_ob(dir, 0, 0);
    for (int i = 0; i < 26; i++)
        append_n(ob, i);
    outbox_close(ob);
    return dir;
}

/* After reopening dir (and appending {"n":26}), every record but the `nskip` ones in
 * skip[] is read, in order, and the appended one last. */
static void expect_all_but(const char *dir, const int *skip, int nskip)
{
    outbox_t *ob = open_ob(dir, 0, 0);
    assert_int_equal(outbox_pending(ob), 26 - nskip);
    append_n(ob, 26);
    int ns[64], want = 0;
    int got = read_ns(ob, ns, 64);
    assert_int_equal(got, 27 - nskip);
    for (int i = 0; i < got; i++) {
        for (int s = 0; s < nskip; s++)
            if (want == skip[s])
                want++;
        assert_int_equal(ns[i], want++);
    }
    outbox_close(ob);
}

/* Damage in the middle of a segment costs only the damaged records: later ones are kept. */
static void middle_damage_skips_only_damaged_records(void **state)
{
    /* Two bytes flipped inside record 10's payload: its CRC fails. */
    const char *dir = segment_of_26();
    overwrite(dir, record_offset(dir, 10) + 20, "XY");
    expect_all_but(dir, (int[]){10}, 1);

    /* The first record damaged. */
    dir = segment_of_26();
    overwrite(dir, record_offset(dir, 0) + 19, "Q");
    expect_all_but(dir, (int[]){0}, 1);

    /* Damage across a record boundary: record 5's newline and record 6's header. */
    dir = segment_of_26();
    overwrite(dir, record_offset(dir, 6) - 1, "zz");
    expect_all_but(dir, (int[]){5, 6}, 2);

    /* Only the newline that ends record 7: record 8 right behind it is intact and kept. */
    dir = segment_of_26();
    overwrite(dir, record_offset(dir, 8) - 1, "#");
    expect_all_but(dir, (int[]){7}, 1);

    /* A length field that points past the end of the file. */
    dir = segment_of_26();
    overwrite(dir, record_offset(dir, 12), "0000ffff");
    expect_all_but(dir, (int[]){12}, 1);
}

/* A record damaged on disk while the outbox is open is skipped by the reader, not a wall. */
static void damage_after_open_is_skipped_by_the_reader(void **state)
{
    const char *dir = segment_of_26();
    outbox_t *ob = open_ob(dir, 0, 0);
    overwrite(dir, record_offset(dir, 3) + 20, "!!");
    int ns[64];
    int got = read_ns(ob, ns, 64);
    assert_int_equal(got, 25);
    for (int i = 0; i < got; i++)
        assert_int_equal(ns[i], i < 3 ? i : i + 1);
    assert_int_equal(outbox_pending(ob), 0);
    outbox_close(ob);
}

static void rotation_deletes_acknowledged_segments(void **state)
{
    const char *dir = h_tmpdir();
    outbox_t *ob = open_ob(dir, 0, 200); /* about 7 records of 28 bytes per segment */
    for (int i = 0; i < 60; i++)
        append_n(ob, i);
    int segs = count_segments(dir);
    assert_true(segs >= 7);
    uint64_t bytes = outbox_bytes(ob);

    /* Half acknowledged: the older segments are gone, the rest survives a reopen. */
    outbox_batch_t b = {0};
    int acked = 0;
    while (acked < 30) {
        assert_int_equal(outbox_read(ob, 30 - acked, 1 << 20, &b), 0);
        assert_true(b.n > 0);
        assert_int_equal(outbox_ack(ob, &b, b.n), 0);
        acked += b.n;
    }
    /* Reading on passes the end of the segment the head was in, which deletes it. */
    assert_int_equal(outbox_read(ob, 1, 1 << 20, &b), 0);
    outbox_batch_free(&b);
    assert_true(count_segments(dir) < segs);
    assert_true(outbox_bytes(ob) < bytes);
    outbox_close(ob);

    ob = open_ob(dir, 0, 200);
    assert_int_equal(outbox_pending(ob), 30);
    assert_int_equal(drain(ob, 30, 1), 30);
    assert_int_equal(count_segments(dir), 1); /* only the segment being written to */
    outbox_close(ob);
    ob = open_ob(dir, 0, 200);
    assert_int_equal(outbox_pending(ob), 0);
    append_n(ob, 60);
    assert_int_equal(drain(ob, 60, 1), 1);
    outbox_close(ob);
}

static void cap_refuses_and_recovers(void **state)
{
    const char *dir = h_tmpdir();
    outbox_t *ob = open_ob(dir, 1000, 200);
    int n = 0, rc;
    while ((rc = outbox_append(ob, "{\"n\":0000000}", 13)) == 0 && n < 1000)
        n++;
    assert_int_equal(rc, -ENOSPC);
    assert_int_equal(n, 1000 / 32);
    assert_true(outbox_bytes(ob) <= 1000);
    assert_int_equal(outbox_pending(ob), n);
    uint64_t bytes = outbox_bytes(ob);
    assert_int_equal(outbox_append(ob, "{\"n\":0000000}", 13), -ENOSPC);
    assert_int_equal(outbox_bytes(ob), bytes);

    /* Acknowledging (and deleting) the old segments makes room again. */
    outbox_batch_t b = {0};
    for (int i = 0; i < 100; i++) {
        assert_int_equal(outbox_read(ob, 100, 1 << 20, &b), 0);
        if (b.n == 0)
            break;
        assert_int_equal(outbox_ack(ob, &b, b.n), 0);
    }
    outbox_batch_free(&b);
    assert_int_equal(outbox_pending(ob), 0);
    assert_int_equal(outbox_append(ob, "{\"n\":0000000}", 13), 0);
    outbox_close(ob);
}

struct producer {
    outbox_t *ob;
    int count;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (int i = 0; i < p->count; i++) {
        char rec[32];
        int n = snprintf(rec, sizeof rec, "{\"n\":%d}", i);
        while (outbox_append(p->ob, rec, (size_t)n) == -ENOSPC)
            usleep(100);
    }
    return NULL;
}

/* One producer and one reader at once (the supervision and reporter threads): every
 * record arrives once, in order, across many rotations. */
static void concurrent_producer_and_reader(void **state)
{
    const char *dir = h_tmpdir();
    outbox_t *ob = open_ob(dir, 64 << 10, 4096);
    struct producer p = {ob, 20000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, produce, &p), 0);
    outbox_batch_t b = {0};
    int got = 0;
    int64_t until = h_now_ms() + 30000;
    while (got < p.count && h_now_ms() < until) {
        assert_int_equal(outbox_read(ob, 100, 1 << 20, &b), 0);
        for (int i = 0; i < b.n; i++) {
            char want[32];
            int n = snprintf(want, sizeof want, "{\"n\":%d}", got + i);
            assert_int_equal(b.len[i], (size_t)n);
            assert_memory_equal(b.rec[i], want, (size_t)n);
        }
        if (b.n)
            assert_int_equal(outbox_ack(ob, &b, b.n), 0);
        got += b.n;
    }
    pthread_join(t, NULL);
    outbox_batch_free(&b);
    assert_int_equal(got, p.count);
    assert_int_equal(outbox_pending(ob), 0);
    outbox_close(ob);
}

/* Reads every pending record's "id" (in order) into ids; returns how many. */
static int read_ids(const char *state_dir, char ids[][160], int cap)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/outbox", state_dir);
    outbox_t *ob = open_ob(dir, 0, 0);
    outbox_batch_t b = {0};
    assert_int_equal(outbox_read(ob, cap, 1 << 20, &b), 0);
    for (int i = 0; i < b.n; i++) {
        json_t *e = json_loadb(b.rec[i], b.len[i], 0, NULL);
        assert_non_null(e);
        snprintf(ids[i], 160, "%s", json_string_value(json_object_get(e, "id")));
        assert_string_equal(json_string_value(json_object_get(e, "machine")), "m1");
        assert_true(json_is_integer(json_object_get(e, "ts_ms")));
        json_decref(e);
    }
    int n = b.n;
    outbox_batch_free(&b);
    outbox_close(ob);
    return n;
}

static void report_event(bb_report_t *r, const char *type, int i)
{
    char inst[32];
    snprintf(inst, sizeof inst, "zone-m1-%d", i);
    json_t *e = json_pack("{s:s, s:s, s:s, s:i}", "type", type, "instance", inst, "service",
                          "zone", "pid", 100 + i);
    if (!strcmp(type, "stopped")) /* the contract allows a reason in a stopped event only */
        json_object_set_new(e, "reason", json_string("exited"));
    assert_int_equal(bb_report_event(r, e), 0);
    json_decref(e);
}

/* Standalone reporter: events stay on disk and pending counts them; ids are written at
 * append time, so they stay the same across a restart, and never repeat. */
static void ids_unique_and_stable_across_restart(void **state)
{
    const char *sdir = h_tmpdir();
    bb_report_opts_t o = {.state_dir = sdir, .cluster = "c1", .machine = "m1"};
    bb_report_t *r;
    assert_int_equal(bb_report_start(&o, &r), 0);
    for (int i = 0; i < 5; i++)
        report_event(r, "started", i);
    assert_int_equal(bb_report_pending(r), 5);
    assert_int_equal(bb_report_send_failures(r), 0);

    /* Invalid events are refused before they reach the outbox. */
    json_t *bad[] = {
        json_pack("{s:s, s:s, s:s}", "type", "exploded", "instance", "i1", "service", "zone"),
        json_pack("{s:s, s:s, s:s}", "type", "started", "instance", "i1", "service", "zone"),
        json_pack("{s:s, s:s, s:s}", "type", "ready", "instance", "bad/name", "service", "zone"),
        json_pack("{s:s, s:s}", "type", "ready", "instance", "i1"),
        json_pack("{s:s, s:s, s:s}", "type", "stopped", "instance", "i1", "service", "zone"),
        json_pack("{s:s, s:s, s:s, s:s}", "type", "ready", "instance", "i1", "service", "zone", "id", "a b"),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(bb_report_event(r, bad[i]), -EINVAL);
        json_decref(bad[i]);
    }
    assert_int_equal(bb_report_pending(r), 5);
    bb_report_stop(r);

    char first[5][160], all[10][160];
    assert_int_equal(read_ids(sdir, first, 10), 5);
    assert_int_equal(bb_report_start(&o, &r), 0);
    assert_int_equal(bb_report_pending(r), 5);
    for (int i = 5; i < 10; i++)
        report_event(r, "stopped", i);
    assert_int_equal(bb_report_pending(r), 10);
    bb_report_stop(r);

    assert_int_equal(read_ids(sdir, all, 10), 10);
    for (int i = 0; i < 5; i++)
        assert_string_equal(first[i], all[i]);
    for (int i = 0; i < 10; i++) {
        assert_true(strlen(all[i]) <= 128);
        assert_true(strncmp(all[i], "m1-", 3) == 0);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(all[i], all[j]);
    }
}

int main(void)
{
    h_init(60);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(append_and_read_in_order),
        cmocka_unit_test(ack_survives_reopen),
        cmocka_unit_test(torn_and_garbled_tails_are_dropped),
        cmocka_unit_test(middle_damage_skips_only_damaged_records),
        cmocka_unit_test(damage_after_open_is_skipped_by_the_reader),
        cmocka_unit_test(rotation_deletes_acknowledged_segments),
        cmocka_unit_test(cap_refuses_and_recovers),
        cmocka_unit_test(concurrent_producer_and_reader),
        cmocka_unit_test(ids_unique_and_stable_across_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
