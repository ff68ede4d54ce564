/* The outbox: an append-only queue of records in segment files (see bb_report.h for the
 * on-disk format and the durability it gives).
 *
 * The producer owns the write side (wfd, appends, rotation); the reader owns the head
 * (the ack position), its read descriptor and the sync bookkeeping. The mutex guards
 * only the pair (wseg, wsize) that the reader needs to know where the written data ends;
 * it is never held across a system call that can block for long. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report/bb_report.h"
#include "sdlog.h"
#include "sdutil.h"

#define HDR_LEN 18 /* "%08x %08x " */
#define REC_OVERHEAD (HDR_LEN + 1)
#define DEFAULT_MAX_BYTES (256ull << 20)
#define DEFAULT_SEGMENT_BYTES (8ull << 20)

struct outbox {
    char dir[PATH_MAX];
    int dirfd;
    uint64_t max_bytes, seg_bytes;

    pthread_mutex_t mu;
    uint64_t wseg;  /* segment appended to (mu) */
    uint64_t wsize; /* its size in bytes (mu) */
    int wfd;        /* producer only; -1 until the segment is created */

    _Atomic int64_t pending;
    _Atomic uint64_t disk; /* bytes of all segment files */

    /* reader side */
    uint64_t hseg, hoff; /* the head: the ack position */
    int rfd;
    uint64_t rfd_seg;
    uint64_t synced_seg, synced_off; /* records before this are on stable storage */
    uint64_t dir_synced_seg;         /* highest segment whose directory entry was synced */
};

/* CRC-32C (Castagnoli), bitwise table built once. */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c(const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    while (len--)
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static int hex8(const char *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        char ch = p[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* Checks the record starting at p (avail bytes available). Returns 1 and sets the payload
 * length and the record's total size when it is whole and intact, 0 when the bytes end
 * inside it (torn, or not read yet), -1 when it is garbled. */
static int record_parse(const char *p, size_t avail, size_t *plen, size_t *total)
{
    if (avail < HDR_LEN)
        return memchr(p, '\n', avail) ? -1 : 0;
    uint32_t len, crc;
    if (hex8(p, &len) || p[8] != ' ' || hex8(p + 9, &crc) || p[17] != ' ' || len == 0 ||
        len > OUTBOX_RECORD_MAX)
        return -1;
    if (avail < (size_t)len + REC_OVERHEAD)
        return memchr(p + HDR_LEN, '\n', avail - HDR_LEN) ? -1 : 0;
    if (p[HDR_LEN + len] != '\n' || crc32c(p + HDR_LEN, len) != crc)
        return -1;
    *plen = len;
    *total = (size_t)len + REC_OVERHEAD;
    return 1;
}

static void seg_name(char *buf, size_t cap, uint64_t seg)
{
    snprintf(buf, cap, "%016" PRIx64 ".seg", seg);
}

static int seg_open(outbox_t *ob, uint64_t seg, int flags)
{
    char name[32];
    seg_name(name, sizeof name, seg);
    int fd = openat(ob->dirfd, name, flags | O_CLOEXEC, 0600);
    return fd < 0 ? -errno : fd;
}

static int seg_unlink(outbox_t *ob, uint64_t seg)
{
    char name[32];
    seg_name(name, sizeof name, seg);
    struct stat st;
    if (fstatat(ob->dirfd, name, &st, 0) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (unlinkat(ob->dirfd, name, 0) < 0)
        return -errno;
    atomic_fetch_sub(&ob->disk, (uint64_t)st.st_size);
    return 0;
}

/* Writes the ack position to "ack" through a synced temp file and a rename. */
static int ack_write(outbox_t *ob, uint64_t seg, uint64_t off)
{
    char line[64];
    int n = snprintf(line, sizeof line, "outbox-ack 1 %016" PRIx64 " %" PRIu64 "\n", seg, off);
    int fd = openat(ob->dirfd, "ack.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (write(fd, line, (size_t)n) != n || fdatasync(fd) < 0)
        rc = errno ? -errno : -EIO;
    close(fd);
    if (!rc && renameat(ob->dirfd, "ack.tmp", ob->dirfd, "ack") < 0)
        rc = -errno;
    return rc;
}

/* Reads the ack position; a missing file means "nothing acknowledged yet". A garbled one
 * is logged and treated the same way: every record still on disk is sent again and
 * ServerDir drops the ones it already has by event id. */
static void ack_read(outbox_t *ob, uint64_t *seg, uint64_t *off)
{
    *seg = 0;
    *off = 0;
    int fd = openat(ob->dirfd, "ack", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char line[96];
    ssize_t n = read(fd, line, sizeof line - 1);
    close(fd);
    line[n > 0 ? n : 0] = '\0';
    uint64_t s, o;
    if (sscanf(line, "outbox-ack 1 %" SCNx64 " %" SCNu64, &s, &o) == 2) {
        *seg = s;
        *off = o;
    } else {
        log_error("outbox ack file unreadable, resending from the oldest segment", "dir=%s",
                  ob->dir);
    }
}

/* The offset, at or after `from` in buf[0..len), of the next intact record (header,
 * length, CRC-32C and newline all check), or -1 when there is none: where reading
 * resumes after damage. Any offset is tried, not only line starts, so a record whose
 * preceding newline was hit is still found; a payload holds no newline, so a match
 * inside one would need a forged CRC ending exactly at its record's end. */
static int64_t resync(const char *buf, size_t len, size_t from)
{
    for (size_t i = from; i < len; i++) {
        size_t plen, total;
        if (record_parse(buf + i, len - i, &plen, &total) == 1)
            return (int64_t)i;
    }
    return -1;
}

/* Replaces segment seg with prefix bytes of the old file followed by the kept spans of buf
 * (buf holds the old file from offset `prefix` on), through a synced temp file and a
 * rename, so a crash leaves either the old or the new segment. */
static int seg_rewrite(outbox_t *ob, uint64_t seg, int oldfd, uint64_t prefix, const char *buf,
                       const uint64_t (*keep)[2], size_t nkeep)
{
    char name[32], tmp[40];
    seg_name(name, sizeof name, seg);
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    int fd = openat(ob->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int rc = 0;
    char chunk[8192];
    for (uint64_t off = 0; !rc && off < prefix;) {
        size_t n = prefix - off < sizeof chunk ? (size_t)(prefix - off) : sizeof chunk;
        ssize_t got = pread(oldfd, chunk, n, (off_t)off);
        if (got <= 0 || write(fd, chunk, (size_t)got) != got)
            rc = got < 0 || errno ? -errno : -EIO;
        off += got > 0 ? (uint64_t)got : 0;
    }
    for (size_t i = 0; !rc && i < nkeep; i++) {
        size_t n = (size_t)(keep[i][1] - keep[i][0]);
        if (write(fd, buf + keep[i][0], n) != (ssize_t)n)
            rc = errno ? -errno : -EIO;
    }
    if (!rc && fdatasync(fd) < 0)
        rc = -errno;
    close(fd);
    if (!rc && renameat(ob->dirfd, tmp, ob->dirfd, name) < 0)
        rc = -errno;
    if (!rc && fsync(ob->dirfd) < 0)
        rc = -errno;
    if (rc)
        unlinkat(ob->dirfd, tmp, 0);
    return rc;
}

/* Validates the records of one segment from `from` on and counts the intact ones. A
 * damaged record in the middle (a bad header, length, CRC or newline) is skipped: reading
 * resumes at the next intact record, and the segment is rewritten without the damaged
 * bytes (logged once with their count). Only bytes with no intact record after them are
 * cut off: the incomplete last record of a crash, or damage at the very end. Returns the
 * segment's size afterwards, or -errno. */
static int64_t seg_recover(outbox_t *ob, uint64_t seg, uint64_t from, int last, int64_t *count)
{
    int fd = seg_open(ob, seg, O_RDWR);
    if (fd < 0)
        return fd;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (from > size) {
        log_error("outbox ack position beyond the segment end, resuming at its end", "segment=%" PRIu64
                  " ack_offset=%" PRIu64 " size=%" PRIu64, seg, from, size);
        from = size;
    }
    size_t len = (size_t)(size - from);
    char *buf = malloc(len + 1);
    uint64_t(*keep)[2] = NULL;
    size_t nkeep = 0, keepcap = 0;
    int64_t rc = buf ? 0 : -ENOMEM;
    for (size_t done = 0; !rc && done < len;) {
        ssize_t got = pread(fd, buf + done, len - done, (off_t)(from + done));
        if (got <= 0)
            rc = got < 0 ? -errno : -EIO;
        done += got > 0 ? (size_t)got : 0;
    }
    size_t at = 0, skipped_bytes = 0, skipped_recs = 0, cut = len;
    while (!rc && at < len) {
        size_t plen, total;
        if (record_parse(buf + at, len - at, &plen, &total) == 1) {
            if (nkeep && keep[nkeep - 1][1] == at) {
                keep[nkeep - 1][1] = at + total;
            } else {
                if (nkeep == keepcap) {
                    keepcap = keepcap ? keepcap * 2 : 8;
                    void *nk = realloc(keep, keepcap * sizeof *keep);
                    if (!nk) {
                        rc = -ENOMEM;
                        break;
                    }
                    keep = nk;
                }
                keep[nkeep][0] = at;
                keep[nkeep][1] = at + total;
                nkeep++;
            }
            (*count)++;
            at += total;
            continue;
        }
        int64_t next = resync(buf, len, at + 1);
        if (next < 0) {
            cut = at;
            break;
        }
        skipped_bytes += (size_t)next - at;
        for (size_t i = at; i < (size_t)next; i++)
            skipped_recs += buf[i] == '\n';
        at = (size_t)next;
    }
    if (!rc && skipped_bytes) {
        log_error("outbox segment damaged, skipped the damaged records and kept the rest",
                  "segment=%" PRIu64 " bytes_skipped=%zu records_skipped=%zu records_kept=%" PRId64,
                  seg, skipped_bytes, skipped_recs ? skipped_recs : 1, *count);
        rc = seg_rewrite(ob, seg, fd, from, buf, (const uint64_t(*)[2])keep, nkeep);
        size = from;
        for (size_t i = 0; i < nkeep; i++)
            size += keep[i][1] - keep[i][0];
    } else if (!rc && cut < len) {
        if (last)
            log_warn("outbox dropped a torn record at the end", "segment=%" PRIu64
                     " offset=%" PRIu64 " bytes=%" PRIu64, seg, from + cut, (uint64_t)(len - cut));
        else
            log_error("outbox segment damaged at its end, the damaged bytes are dropped",
                      "segment=%" PRIu64 " offset=%" PRIu64 " bytes=%" PRIu64, seg, from + cut,
                      (uint64_t)(len - cut));
        if (ftruncate(fd, (off_t)(from + cut)) < 0)
            rc = -errno;
        size = from + cut;
    }
    free(keep);
    free(buf);
    close(fd);
    return rc ? rc : (int64_t)size;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Lists the segment numbers in the directory, sorted. *segs is malloc'd. */
static int seg_list(outbox_t *ob, uint64_t **segs, size_t *n)
{
    int fd = dup(ob->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -errno;
    }
    size_t cap = 16;
    *n = 0;
    *segs = malloc(cap * sizeof **segs);
    struct dirent *e;
    while (*segs && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        char *endp;
        if (l != 20 || strcmp(e->d_name + 16, ".seg") != 0)
            continue;
        uint64_t s = strtoull(e->d_name, &endp, 16);
        if (endp != e->d_name + 16)
            continue;
        if (*n == cap) {
            uint64_t *ns = realloc(*segs, cap * 2 * sizeof **segs);
            if (!ns) {
                free(*segs);
                *segs = NULL;
                break;
            }
            *segs = ns;
            cap *= 2;
        }
        (*segs)[(*n)++] = s;
    }
    closedir(d);
    if (!*segs)
        return -ENOMEM;
    qsort(*segs, *n, sizeof **segs, cmp_u64);
    return 0;
}

static int mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    if (sd_strlcpy(tmp, path, sizeof tmp) >= sizeof tmp)
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int outbox_open(const char *dir, const outbox_opts_t *opts, outbox_t **out)
{
    *out = NULL;
    outbox_t *ob = calloc(1, sizeof *ob);
    if (!ob)
        return -ENOMEM;
    ob->dirfd = ob->wfd = ob->rfd = -1;
    pthread_mutex_init(&ob->mu, NULL);
    ob->max_bytes = opts && opts->max_bytes ? opts->max_bytes : DEFAULT_MAX_BYTES;
    ob->seg_bytes = opts && opts->segment_bytes ? opts->segment_bytes : DEFAULT_SEGMENT_BYTES;
    uint64_t *segs = NULL;
    size_t nseg = 0;
    int rc;
    if (sd_strlcpy(ob->dir, dir, sizeof ob->dir) >= sizeof ob->dir) {
        rc = -ENAMETOOLONG;
        goto fail;
    }
    if ((rc = mkdir_p(dir)))
        goto fail;
    ob->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ob->dirfd < 0) {
        rc = -errno;
        goto fail;
    }
    ack_read(ob, &ob->hseg, &ob->hoff);
    if ((rc = seg_list(ob, &segs, &nseg)))
        goto fail;

    /* Segments before the ack position were acknowledged whole: a crash came between the
     * ack and their deletion. */
    size_t first = 0;
    while (first < nseg && segs[first] < ob->hseg) {
        if ((rc = seg_unlink(ob, segs[first])))
            goto fail;
        first++;
    }
    if (first < nseg && segs[first] != ob->hseg) {
        ob->hseg = segs[first]; /* the head segment is gone: start at the next one */
        ob->hoff = 0;
    }
    if (first == nseg)
        ob->hoff = 0;
    int64_t count = 0;
    uint64_t disk = 0;
    for (size_t i = first; i < nseg; i++) {
        uint64_t from = segs[i] == ob->hseg ? ob->hoff : 0;
        int64_t size = seg_recover(ob, segs[i], from, i + 1 == nseg, &count);
        if (size < 0) {
            rc = (int)size;
            goto fail;
        }
        if (segs[i] == ob->hseg && ob->hoff > (uint64_t)size)
            ob->hoff = (uint64_t)size;
        disk += (uint64_t)size;
    }
    atomic_store(&ob->pending, count);
    atomic_store(&ob->disk, disk);
    ob->wseg = first < nseg ? segs[nseg - 1] : ob->hseg;
    if (first < nseg) {
        ob->wfd = seg_open(ob, ob->wseg, O_WRONLY | O_APPEND);
        if (ob->wfd < 0) {
            rc = ob->wfd;
            goto fail;
        }
        struct stat st;
        if (fstat(ob->wfd, &st) < 0) {
            rc = -errno;
            goto fail;
        }
        ob->wsize = (uint64_t)st.st_size;
    }
    /* Records found on disk at open may predate a power loss; the first read syncs them. */
    ob->synced_seg = ob->hseg;
    ob->synced_off = ob->hoff;
    ob->dir_synced_seg = first < nseg ? segs[nseg - 1] : ob->hseg;
    if (fsync(ob->dirfd) < 0) {
        rc = -errno;
        goto fail;
    }
    free(segs);
    if (count)
        log_info("outbox recovered", "dir=%s pending=%" PRId64 " bytes=%" PRIu64, ob->dir, count, disk);
    *out = ob;
    return 0;
fail:
    free(segs);
    outbox_close(ob);
    return rc;
}

void outbox_close(outbox_t *ob)
{
    if (!ob)
        return;
    if (ob->wfd >= 0)
        close(ob->wfd);
    if (ob->rfd >= 0)
        close(ob->rfd);
    if (ob->dirfd >= 0)
        close(ob->dirfd);
    pthread_mutex_destroy(&ob->mu);
    free(ob);
}

int outbox_append(outbox_t *ob, const char *rec, size_t len)
{
    if (len == 0 || memchr(rec, '\n', len))
        return -EINVAL;
    if (len > OUTBOX_RECORD_MAX)
        return -E2BIG;
    size_t total = len + REC_OVERHEAD;
    if (atomic_load(&ob->disk) + total > ob->max_bytes)
        return -ENOSPC;
    if (ob->wfd < 0 || ob->wsize >= ob->seg_bytes) {
        uint64_t seg = ob->wfd < 0 ? ob->wseg : ob->wseg + 1;
        int fd = seg_open(ob, seg, O_WRONLY | O_APPEND | O_CREAT);
        if (fd < 0)
            return fd;
        if (ob->wfd >= 0)
            close(ob->wfd);
        ob->wfd = fd;
        pthread_mutex_lock(&ob->mu);
        ob->wseg = seg;
        ob->wsize = 0;
        pthread_mutex_unlock(&ob->mu);
    }
    /* One write(2) of header + payload + newline: a kill -9 leaves all of it or none. */
    char stackbuf[4096];
    char *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!buf)
        return -ENOMEM;
    snprintf(buf, HDR_LEN + 1, "%08x %08x ", (unsigned)len, (unsigned)crc32c(rec, len));
    memcpy(buf + HDR_LEN, rec, len);
    buf[HDR_LEN + len] = '\n';
    ssize_t n = write(ob->wfd, buf, total);
    int err = n < 0 ? errno : 0;
    if (buf != stackbuf)
        free(buf);
    if (n != (ssize_t)total) {
        /* A short write (disk full) leaves a torn record: cut it off so the next append
         * does not land behind garbage. */
        if (n > 0 && ftruncate(ob->wfd, (off_t)ob->wsize) < 0)
            log_error("outbox cannot cut a short write", "errno=%d", errno);
        return n < 0 ? -err : -ENOSPC;
    }
    pthread_mutex_lock(&ob->mu);
    ob->wsize += total;
    pthread_mutex_unlock(&ob->mu);
    atomic_fetch_add(&ob->disk, (uint64_t)total);
    atomic_fetch_add(&ob->pending, 1);
    return 0;
}

int64_t outbox_pending(const outbox_t *ob) { return atomic_load(&ob->pending); }
uint64_t outbox_bytes(const outbox_t *ob) { return atomic_load(&ob->disk); }

/* The head record (at the start of buf, got bytes read from the head) was damaged on disk
 * after it was written: moves the head past it to the next intact record, acknowledging
 * the damaged bytes, and logs it. With no intact record in buf, a closed segment is left
 * for the next one; the open one is retried later (the rest of the record may be coming).
 * Returns 0 (the caller reads on) or -errno; -EBADMSG when nothing could be skipped. */
static int head_skip_damage(outbox_t *ob, const char *buf, size_t got, int closed)
{
    int64_t next = got > 1 ? resync(buf, got, 1) : -1;
    if (next < 0 && !closed) {
        log_error("outbox record garbled after it was written", "segment=%" PRIu64
                  " offset=%" PRIu64, ob->hseg, ob->hoff);
        return -EBADMSG;
    }
    uint64_t to = next < 0 ? ob->hoff + got : ob->hoff + (uint64_t)next;
    log_error("outbox record garbled after it was written, skipped", "segment=%" PRIu64
              " offset=%" PRIu64 " bytes_skipped=%" PRIu64, ob->hseg, ob->hoff, to - ob->hoff);
    int rc = ack_write(ob, ob->hseg, to);
    if (rc)
        return rc;
    ob->hoff = to;
    if (atomic_load(&ob->pending) > 0)
        atomic_fetch_sub(&ob->pending, 1);
    return 0;
}

/* Moves the head to the start of the segment after hseg, records that as the ack
 * position, and deletes hseg (all of it was acknowledged). */
static int head_next_segment(outbox_t *ob)
{
    int rc = ack_write(ob, ob->hseg + 1, 0);
    if (rc)
        return rc;
    if (ob->rfd >= 0) {
        close(ob->rfd);
        ob->rfd = -1;
    }
    rc = seg_unlink(ob, ob->hseg);
    ob->hseg++;
    ob->hoff = 0;
    return rc;
}

static int batch_reserve(outbox_batch_t *b, size_t bytes, int records)
{
    if (b->bufcap < bytes) {
        char *nb = realloc(b->buf, bytes);
        if (!nb)
            return -ENOMEM;
        b->buf = nb;
        b->bufcap = bytes;
    }
    if (b->reccap < records) {
        const char **r = realloc(b->rec, (size_t)records * sizeof *r);
        if (r)
            b->rec = r;
        size_t *l = realloc(b->len, (size_t)records * sizeof *l);
        if (l)
            b->len = l;
        uint64_t *e = realloc(b->end, (size_t)records * sizeof *e);
        if (e)
            b->end = e;
        if (!r || !l || !e)
            return -ENOMEM;
        b->reccap = records;
    }
    return 0;
}

int outbox_read(outbox_t *ob, int max_records, size_t max_bytes, outbox_batch_t *b)
{
    b->n = 0;
    if (max_records < 1)
        max_records = 1;
    for (;;) {
        pthread_mutex_lock(&ob->mu);
        uint64_t wseg = ob->wseg, wsize = ob->wsize;
        pthread_mutex_unlock(&ob->mu);
        if (ob->hseg > wseg)
            return 0;
        if (ob->rfd < 0 || ob->rfd_seg != ob->hseg) {
            if (ob->rfd >= 0)
                close(ob->rfd);
            ob->rfd = seg_open(ob, ob->hseg, O_RDONLY);
            if (ob->rfd == -ENOENT && ob->hseg < wseg) {
                int rc = head_next_segment(ob); /* a missing older segment: skip it */
                if (rc)
                    return rc;
                continue;
            }
            if (ob->rfd < 0) {
                int rc = ob->rfd;
                ob->rfd = -1;
                return rc == -ENOENT ? 0 : rc; /* nothing appended yet */
            }
            ob->rfd_seg = ob->hseg;
        }
        uint64_t end = wsize;
        if (ob->hseg < wseg) {
            struct stat st;
            if (fstat(ob->rfd, &st) < 0)
                return -errno;
            end = (uint64_t)st.st_size; /* a closed segment does not change any more */
        }
        if (ob->hoff >= end) {
            if (ob->hseg == wseg)
                return 0;
            int rc = head_next_segment(ob);
            if (rc)
                return rc;
            continue;
        }
        size_t want = max_bytes + (size_t)max_records * REC_OVERHEAD;
        if (want < OUTBOX_RECORD_MAX + REC_OVERHEAD)
            want = OUTBOX_RECORD_MAX + REC_OVERHEAD;
        if (want > end - ob->hoff)
            want = (size_t)(end - ob->hoff);
        int rc = batch_reserve(b, want, max_records);
        if (rc)
            return rc;
        ssize_t got = pread(ob->rfd, b->buf, want, (off_t)ob->hoff);
        if (got < 0)
            return -errno;
        size_t at = 0, payload = 0;
        int damaged = 0;
        b->seg = ob->hseg;
        while (b->n < max_records && at < (size_t)got && (b->n == 0 || payload < max_bytes)) {
            size_t plen, total;
            int r = record_parse(b->buf + at, (size_t)got - at, &plen, &total);
            if (r == 0)
                break;
            if (r < 0) {
                damaged = at == 0; /* else hand out what came before it first */
                break;
            }
            b->rec[b->n] = b->buf + at + HDR_LEN;
            b->len[b->n] = plen;
            at += total;
            b->end[b->n] = ob->hoff + at;
            payload += plen;
            b->n++;
        }
        if (!damaged)
            return 0;
        rc = head_skip_damage(ob, b->buf, (size_t)got, ob->hseg < wseg);
        if (rc)
            return rc;
    }
}

int outbox_sync(outbox_t *ob, const outbox_batch_t *b)
{
    if (b->n == 0)
        return 0;
    uint64_t end = b->end[b->n - 1];
    if (b->seg > ob->dir_synced_seg) {
        if (fsync(ob->dirfd) < 0)
            return -errno;
        ob->dir_synced_seg = b->seg;
    }
    if (b->seg < ob->synced_seg || (b->seg == ob->synced_seg && end <= ob->synced_off))
        return 0;
    if (fdatasync(ob->rfd) < 0)
        return -errno;
    ob->synced_seg = b->seg;
    ob->synced_off = end;
    return 0;
}

int outbox_ack(outbox_t *ob, const outbox_batch_t *b, int k)
{
    if (k <= 0 || k > b->n || b->seg != ob->hseg)
        return -EINVAL;
    int rc = ack_write(ob, b->seg, b->end[k - 1]);
    if (rc)
        return rc;
    ob->hoff = b->end[k - 1];
    atomic_fetch_sub(&ob->pending, k);
    return 0;
}

void outbox_batch_free(outbox_batch_t *b)
{
    free(b->buf);
    free(b->rec);
    free(b->len);
    free(b->end);
    memset(b, 0, sizeof *b);
}
