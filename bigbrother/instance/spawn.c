/* Starting processes: fork + exec in their own process group, stdout/stderr appended to
 * the instance's own log, the environment that tells the process where bigbrother is,
 * and the pidfd that reports its exit.
 *
 * Instance logs: STATE_DIR/logs/<service>-<slot>/<instance>.log, one file per run, its
 * first line a header naming the instance ("=== bigbrother <time>: starting instance
 * <id> (generation <n>)"). STATE_DIR/logs/<service>-<slot>.log is a symlink to the
 * slot's current one (tail -F follows the slot across restarts). A file past
 * log_max_bytes is copied to .1 (.1 -> .2 ... up to log_keep) and truncated while the
 * process writes on; at each spawn a slot keeps its newest log_runs files. Readers
 * (crash reports here, logsrv.c, bbctl) take a whole file as the run. */
#include "instance/bb_instance.h"
#include "sdlog.h"
#include "sdtime.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOG_ROTATE_EVERY_MS 2000

static bb_timer_t rotate_timer;

extern char **environ;

void bb_signal_group(bb_inst_t *in, int sig)
{
    if (in->pid <= 0)
        return;
    if (kill(-in->pid, sig) && errno == ESRCH)
        kill(in->pid, sig);
}

void bb_log_path(const bb_inst_t *in, char *out, size_t cap)
{
    snprintf(out, cap, "%s/logs/%s-%d/%s.log", bb.cfg.state_dir, in->svc->name, in->slot,
             in->id);
}

void bb_log_path_current(const bb_inst_t *in, char *out, size_t cap)
{
    struct stat st;
    bb_log_path(in, out, cap);
    if (stat(out, &st) == 0)
        return;
    char legacy[512];
    snprintf(legacy, sizeof legacy, "%s/logs/%s-%d.log", bb.cfg.state_dir, in->svc->name,
             in->slot);
    if (lstat(legacy, &st) == 0 && S_ISREG(st.st_mode))
        sd_strlcpy(out, legacy, cap);
}

/* Calls match(dir, entry name, id, out, cap) for each entry of dir until one answers 1
 * (it has written the path into out). Returns 0 then, -1 when none did. */
typedef int log_match_fn(const char *dir, const char *name, const char *id, char *out,
                         size_t cap);

static int log_scan(const char *dir, log_match_fn *match, const char *id, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL)
        found = match(dir, e->d_name, id, out, cap);
    closedir(d);
    return found ? 0 : -1;
}

/* A slot log of the layout before one file per instance (a regular file
 * STATE_DIR/logs/<service>-<slot>.log, not yet moved aside by a spawn) that holds the
 * spawn header of id: a run adopted across the upgrade goes on writing there. */
static int legacy_match(const char *dir, const char *name, const char *id, char *out,
                        size_t cap)
{
    size_t n = strlen(name);
    struct stat st;
    if (n < 5 || strcmp(name + n - 4, ".log") != 0 || name[0] == '.')
        return 0;
    snprintf(out, cap, "%s/%s", dir, name);
    if (lstat(out, &st) || !S_ISREG(st.st_mode))
        return 0;
    FILE *f = fopen(out, "r");
    char line[1024];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = bb_log_header(line, id) == 1;
    if (f)
        fclose(f);
    return found;
}

/* The run's own file in a slot directory <service>-<slot> of the id's service (whose name
 * an id too long for SD_NAME_MAX holds cut to 64 bytes: bb_spawn). */
static int slot_match(const char *dir, const char *name, const char *id, char *out, size_t cap)
{
    const char *dash = strrchr(name, '-');
    size_t svc = dash ? (size_t)(dash - name) : 0, k = svc > 64 ? 64 : svc;
    if (!svc || !dash[1] || strspn(dash + 1, "0123456789") != strlen(dash + 1) ||
        strncmp(id, name, k) != 0 || id[k] != '-')
        return 0;
    struct stat st;
    snprintf(out, cap, "%s/%s/%s.log", dir, name, id);
    return stat(out, &st) == 0 && S_ISREG(st.st_mode);
}

int bb_log_find(const char *id, char *out, size_t cap)
{
    char dir[300];
    if (!sd_name_valid(id, SD_NAME_MAX))
        return -1;
    snprintf(dir, sizeof dir, "%s/logs", bb.cfg.state_dir);
    return log_scan(dir, slot_match, id, out, cap) == 0 ? 0
                                                         : log_scan(dir, legacy_match, id, out, cap);
}

int bb_log_header(const char *line, const char *id)
{
    static const char what[] = ": starting instance ";
    if (strncmp(line, "=== bigbrother ", 15) != 0)
        return 0;
    size_t len = strcspn(line, "\n"), idlen = strlen(id);
    const char *m = memmem(line, len, what, sizeof what - 1);
    if (!m)
        return 0;
    m += sizeof what - 1;
    return (size_t)(line + len - m) > idlen && !strncmp(m, id, idlen) && m[idlen] == ' ' ? 1 : 2;
}

/* Lines of id's run from f's position into ring (the newest BB_LOG_LINES_MAX kept, *n
 * counting all), its own header left out. Returns 1 when another run's header ended it
 * (that line read), else 0 at the end of the file. In a slot log of the layout before
 * one file per instance (bb_log_path_current), what comes before id's header is other
 * runs' output: dropped when the header comes. */
static int ring_read(FILE *f, const char *id, char **ring, long *n)
{
    char *line = NULL;
    size_t cap = 0;
    int ended = 0, own = 0;
    long n0 = *n;
    while (getline(&line, &cap, f) > 0) {
        int h = bb_log_header(line, id);
        if (h == 2 && own) {
            ended = 1;
            break;
        }
        if (h) { /* id's header, or an earlier run's before it: what came before is not id's */
            own = own || h == 1;
            *n = n0;
            continue;
        }
        free(ring[*n % BB_LOG_LINES_MAX]);
        ring[*n % BB_LOG_LINES_MAX] = line;
        (*n)++;
        line = NULL;
        cap = 0;
    }
    free(line);
    return ended;
}

/* The number of lines in f from its position to its end; f is left where it was. */
static long count_lines(FILE *f)
{
    char chunk[16384];
    long at = ftell(f), lines = 0;
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        for (const char *p = chunk; (p = memchr(p, '\n', got - (size_t)(p - chunk))); p++)
            lines++;
    clearerr(f);
    fseek(f, at, SEEK_SET);
    return lines;
}

int bb_log_read_run(FILE *f, const char *path, const char *id, long tail, sd_buf_t *out)
{
    char **ring = calloc(BB_LOG_LINES_MAX, sizeof *ring);
    if (!ring)
        return 0;
    long n = 0;
    if (tail == 0 || count_lines(f) <= tail) { /* short after a rotation: .1 first */
        char rot[600];
        snprintf(rot, sizeof rot, "%s.1", path);
        FILE *f1 = fopen(rot, "r");
        if (f1) {
            ring_read(f1, id, ring, &n);
            fclose(f1);
        }
    }
    int ended = ring_read(f, id, ring, &n);
    long shown = tail > 0 && tail < n ? tail : n, first;
    if (shown > BB_LOG_LINES_MAX)
        shown = BB_LOG_LINES_MAX;
    size_t room = out->max - out->len, bytes = 0;
    for (first = n; first > n - shown; first--) { /* the newest lines that fit in out */
        size_t len = strlen(ring[(first - 1) % BB_LOG_LINES_MAX]);
        if (bytes + len > room)
            break;
        bytes += len;
    }
    for (long i = first; i < n; i++)
        sd_buf_append(out, ring[i % BB_LOG_LINES_MAX], strlen(ring[i % BB_LOG_LINES_MAX]));
    for (long i = 0; i < BB_LOG_LINES_MAX; i++)
        free(ring[i]);
    free(ring);
    return ended;
}

/* ---- a slot's logs at spawn */

/* Points STATE_DIR/logs/<service>-<slot>.log at in's log by a relative symlink, replaced
 * atomically (made under a temporary name, renamed over it): tail -F on it follows the
 * slot from run to run. A regular file there, the one log per slot that earlier versions
 * wrote, moves into the slot directory as before-upgrade.log (with its rotations), to be
 * kept and pruned like a run's log. */
static void link_slot_log(const bb_inst_t *in, const char *slotdir)
{
    char link[512], tmp[520], target[300], from[540], to[560];
    snprintf(link, sizeof link, "%s.log", slotdir);
    struct stat st;
    if (lstat(link, &st) == 0 && S_ISREG(st.st_mode)) {
        snprintf(to, sizeof to, "%s/before-upgrade.log", slotdir);
        if (rename(link, to)) { /* kept where it is, not replaced by the link */
            log_warn("slot log link not updated", "path=%s error=%s", link, strerror(errno));
            return;
        }
        log_info("slot log moved", "from=%s to=%s", link, to);
        for (int i = 1; i <= 100; i++) { /* log_keep is at most 100 */
            snprintf(from, sizeof from, "%s.%d", link, i);
            snprintf(to, sizeof to, "%s/before-upgrade.log.%d", slotdir, i);
            rename(from, to);
        }
    }
    snprintf(tmp, sizeof tmp, "%s/logs/.%s-%d.log.tmp", bb.cfg.state_dir, in->svc->name,
             in->slot);
    snprintf(target, sizeof target, "%s-%d/%s.log", in->svc->name, in->slot, in->id);
    unlink(tmp);
    if (symlink(target, tmp) || rename(tmp, link)) {
        log_warn("slot log link not updated", "path=%s error=%s", link, strerror(errno));
        unlink(tmp);
    }
}

/* 1 when name is the log base (a name ending .log) or one of its rotations (base.N). */
static int is_log_of(const char *name, const char *base)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0)
        return 0;
    return !name[n] || (name[n] == '.' && name[n + 1] &&
                        strspn(name + n + 1, "0123456789") == strlen(name + n + 1));
}

typedef struct {
    char name[SD_NAME_MAX + 8];
    struct timespec mtime;
} run_log_t;

static int newest_first(const void *a, const void *b)
{
    const struct timespec *x = &((const run_log_t *)a)->mtime, *y = &((const run_log_t *)b)->mtime;
    if (x->tv_sec != y->tv_sec)
        return x->tv_sec < y->tv_sec ? 1 : -1;
    return x->tv_nsec < y->tv_nsec ? 1 : x->tv_nsec > y->tv_nsec ? -1 : 0;
}

/* Keeps the newest log_runs logs (*.log files, by mtime) of the slot directory slotdir,
 * current (the log just created, always kept) among them, and deletes the older ones with
 * their rotations. Returns how many runs' logs it deleted. */
static int prune_runs(const char *slotdir, const char *current)
{
    DIR *d = opendir(slotdir);
    if (!d)
        return 0;
    run_log_t *runs = NULL;
    size_t n = 0, cap = 0, keep = (size_t)bb.cfg.log_runs - 1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        struct stat st;
        if (len <= 4 || len >= sizeof runs->name || strcmp(e->d_name + len - 4, ".log") ||
            !strcmp(e->d_name, current) ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            run_log_t *more = realloc(runs, (cap = cap ? 2 * cap : 16) * sizeof *runs);
            if (!more)
                break;
            runs = more;
        }
        memcpy(runs[n].name, e->d_name, len + 1);
        runs[n++].mtime = st.st_mtim;
    }
    int removed = 0;
    if (n > keep) {
        qsort(runs, n, sizeof *runs, newest_first);
        rewinddir(d);
        while ((e = readdir(d)) != NULL)
            for (size_t i = keep; i < n; i++)
                if (is_log_of(e->d_name, runs[i].name)) {
                    unlinkat(dirfd(d), e->d_name, 0);
                    break;
                }
        removed = (int)(n - keep);
    }
    free(runs);
    closedir(d);
    return removed;
}

/* Creates in's log (its slot directory as needed), writes its header, points the slot
 * link at it and prunes the slot's old logs. Returns the fd to write to, or -errno. */
static int open_run_log(const bb_inst_t *in)
{
    char slotdir[400], path[512], stamp[SD_TIME_ISO_LEN];
    snprintf(slotdir, sizeof slotdir, "%s/logs/%s-%d", bb.cfg.state_dir, in->svc->name,
             in->slot);
    if (mkdir(slotdir, 0750) && errno != EEXIST)
        return -errno;
    bb_log_path(in, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return -errno;
    dprintf(fd, "=== bigbrother %s: starting instance %s (generation %d)\n",
            sd_time_iso(sd_wall_ms(), stamp, sizeof stamp), in->id, in->generation + 1);
    link_slot_log(in, slotdir);
    int removed = prune_runs(slotdir, strrchr(path, '/') + 1);
    if (removed)
        log_info("old logs removed", "slot=%s-%d removed=%d kept=%d", in->svc->name, in->slot,
                 removed, bb.cfg.log_runs);
    return fd;
}

/* ---- size rotation of the running instances' logs */

/* log.N -> log.N+1 ... log.1 -> log.2, dropping what goes past log_keep. */
static void shift_rotated(const char *path)
{
    char from[540], to[540];
    for (int i = bb.cfg.log_keep - 1; i >= 1; i--) {
        snprintf(from, sizeof(from), "%s.%d", path, i);
        snprintf(to, sizeof(to), "%s.%d", path, i + 1);
        rename(from, to);
    }
}

/* Rotates a log a running process appends to: copy to .1 in the kernel, then truncate
 * (the process opened it O_APPEND, so it goes on writing at the new end). */
static void rotate_by_copy(const char *path)
{
    struct stat st;
    if (stat(path, &st) || st.st_size < bb.cfg.log_max_bytes)
        return;
    int src = open(path, O_RDWR | O_CLOEXEC);
    if (src < 0)
        return;
    if (fstat(src, &st) || st.st_size < bb.cfg.log_max_bytes)
        goto out;
    if (bb.cfg.log_keep > 0) {
        char to[540];
        shift_rotated(path);
        snprintf(to, sizeof(to), "%s.1", path);
        int dst = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
        if (dst < 0)
            goto out;
        loff_t left = st.st_size;
        while (left > 0) {
            ssize_t n = copy_file_range(src, NULL, dst, NULL, (size_t)left, 0);
            if (n <= 0)
                break;
            left -= n;
        }
        close(dst);
    }
    if (ftruncate(src, 0) == 0)
        log_info("log rotated", "path=%s bytes=%lld", path, (long long)st.st_size);
out:
    close(src);
}

/* The rotation timer: rotates the logs of the running instances, then re-arms. */
static void on_rotate(bb_timer_t *t)
{
    char path[512];
    for (int i = 0; i < bb.ninst; i++)
        if (bb.inst[i].pid > 0) {
            bb_log_path_current(&bb.inst[i], path, sizeof(path));
            rotate_by_copy(path);
        }
    bb_timer_set(t, sd_mono_ms() + LOG_ROTATE_EVERY_MS);
}

/* ---- crash reports */

#define TAIL_READ_MAX (64 << 10) /* bytes of a log's end read for a crash report */

/* Copies at most cap - 1 bytes of src (len) into dst, keeping valid UTF-8 sequences, tab
 * and newline, and writing '?' for any other control byte or broken sequence (the tail
 * goes into JSON). Returns the bytes written. */
static size_t clean_text(char *dst, size_t cap, const char *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < cap;) {
        unsigned char c = (unsigned char)src[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++)
            ok = ((unsigned char)src[i + k] >> 6) == 2;
        if (ok && n == 1 && c < 0x20 && c != '\n' && c != '\t')
            ok = 0;
        if (!ok || o + n >= cap) {
            dst[o++] = '?';
            i += ok ? n : 1;
            continue;
        }
        memcpy(dst + o, src + i, n);
        o += n;
        i += n;
    }
    dst[o] = '\0';
    return o;
}

/* Reads the last bytes of the file at path, at most cap, into buf: how many (0 when there
 * is no file); *cut when the file holds more before them. */
static size_t read_end(const char *path, char *buf, size_t cap, int *cut)
{
    struct stat st;
    ssize_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *cut = 0;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) == 0) {
        off_t from = st.st_size > (off_t)cap ? st.st_size - (off_t)cap : 0;
        n = pread(fd, buf, (size_t)(st.st_size - from), from);
        *cut = from > 0;
    }
    close(fd);
    return n > 0 ? (size_t)n : 0;
}

/* The last output of in's run: the end of its log (and, when that holds less than
 * TAIL_READ_MAX, after a rotation, the end of its .1 before it), less the header line
 * bigbrother wrote when it spawned in, at most SD_LOG_TAIL_LINES lines and
 * SD_LOG_TAIL_MAX bytes. 0 with the text in out (cap > SD_LOG_TAIL_MAX), -1 when there is
 * no log. */
static int log_tail(const bb_inst_t *in, char *out, size_t cap)
{
    char path[512], rot[520];
    bb_log_path_current(in, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    char *buf = malloc(TAIL_READ_MAX + 1);
    ssize_t n = -1;
    size_t n1 = 0;
    int cut = 0; /* buf starts inside a line */
    if (buf && fstat(fd, &st) == 0) {
        off_t len = st.st_size > TAIL_READ_MAX ? TAIL_READ_MAX : st.st_size;
        snprintf(rot, sizeof rot, "%s.1", path);
        if (len < TAIL_READ_MAX)
            n1 = read_end(rot, buf, (size_t)(TAIL_READ_MAX - len), &cut);
        else
            cut = st.st_size > TAIL_READ_MAX;
        n = pread(fd, buf + n1, (size_t)len, st.st_size - len);
    }
    close(fd);
    if (n < 0) {
        free(buf);
        return -1;
    }
    const char *p = buf, *start = buf, *end = NULL, *stop = buf + n1 + n;
    buf[n1 + n] = '\0';
    if (cut) { /* start at the next line */
        const char *nl = memchr(buf, '\n', (size_t)(stop - buf));
        p = start = nl ? nl + 1 : stop;
    }
    while (p < stop) { /* after in's header; up to another run's (none is expected) */
        const char *nl = memchr(p, '\n', (size_t)(stop - p)), *next = nl ? nl + 1 : stop;
        int h = bb_log_header(p, in->id);
        if (h == 1) {
            start = next;
            end = NULL;
        } else if (h == 2 && !end) {
            end = p;
        }
        p = next;
    }
    if (!end)
        end = stop;
    while (end > start && end[-1] == '\n')
        end--;
    const char *t = end;
    for (int lines = 0; t > start; t--) /* back SD_LOG_TAIL_LINES line starts */
        if (t[-1] == '\n' && ++lines == SD_LOG_TAIL_LINES)
            break;
    if (end - t > SD_LOG_TAIL_MAX - 64) { /* keep the newest bytes, from a line start */
        t = end - (SD_LOG_TAIL_MAX - 64);
        const char *nl = memchr(t, '\n', (size_t)(end - t));
        if (nl)
            t = nl + 1;
    }
    clean_text(out, cap, t, (size_t)(end - t));
    free(buf);
    return 0;
}

/* Where the kernel put in's core file, from /proc/sys/kernel/core_pattern: the file for
 * the plain patterns (core, core.%p, /var/crash/%e.%p ...) or "piped to PROGRAM" for a
 * pipe (systemd-coredump, apport); out is empty when it cannot be told. */
static void core_path(const bb_inst_t *in, char *out, size_t cap)
{
    char pat[256] = "";
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/core_pattern", "r");
    if (!f)
        return;
    if (!fgets(pat, sizeof pat, f))
        pat[0] = '\0';
    fclose(f);
    pat[strcspn(pat, "\n")] = '\0';
    if (!pat[0])
        return;
    if (pat[0] == '|') {
        size_t prog = strcspn(pat + 1, " ");
        snprintf(out, cap, "piped to %.*s", (int)prog, pat + 1);
        return;
    }
    char file[512] = "", comm[17] = "";
    const char *exe = strrchr(in->svc->command, '/');
    snprintf(comm, sizeof comm, "%s", exe ? exe + 1 : in->svc->command);
    size_t o = 0;
    for (const char *p = pat; *p && o + 32 < sizeof file; p++) {
        if (*p != '%') {
            file[o++] = *p;
            continue;
        }
        p++;
        if (*p == 'p' || *p == 'P')
            o += (size_t)snprintf(file + o, sizeof file - o, "%d", (int)in->pid);
        else if (*p == 'e')
            o += (size_t)snprintf(file + o, sizeof file - o, "%s", comm);
        else if (*p == '%')
            file[o++] = '%';
        else /* a time, host or uid specifier: the pattern says where */
            return (void)snprintf(out, cap, "core_pattern %s", pat);
        if (!*p)
            break;
    }
    file[o] = '\0';
    int uses_pid = 0;
    f = fopen("/proc/sys/kernel/core_uses_pid", "r");
    if (f) {
        uses_pid = fgetc(f) == '1';
        fclose(f);
    }
    if (uses_pid && !strstr(pat, "%p"))
        snprintf(file + strlen(file), sizeof file - strlen(file), ".%d", (int)in->pid);
    char cwd[4096];
    int n = 0;
    if (file[0] == '/')
        n = snprintf(out, cap, "%s", file);
    else if (in->svc->cwd)
        n = snprintf(out, cap, "%s/%s", in->svc->cwd, file);
    else if (getcwd(cwd, sizeof cwd))
        n = snprintf(out, cap, "%s/%s", cwd, file);
    if (n < 0 || (size_t)n >= cap) /* a path that does not fit: the pattern instead */
        snprintf(out, cap, "core_pattern %.200s", pat);
}

void bb_crash_report(const bb_inst_t *in, json_t *ev)
{
    int failed = (sd_stop_reason_flags(in->reason) & SD_STOP_F_CRASH) &&
                 !(in->reason == SD_STOP_EXITED && in->code == 0);
    if (!failed)
        return;
    char *tail = malloc(SD_LOG_TAIL_MAX + 1);
    if (tail && log_tail(in, tail, SD_LOG_TAIL_MAX + 1) == 0 && tail[0]) {
        json_t *t = json_string(tail);
        if (!t) { /* UTF-8 that jansson refuses (overlong, surrogates): ASCII then */
            for (char *c = tail; *c; c++)
                if ((unsigned char)*c >= 0x80)
                    *c = '?';
            t = json_string(tail);
        }
        if (t)
            json_object_set_new(ev, "log_tail", t);
    }
    free(tail);
    if (in->dumped) {
        char core[SD_CORE_PATH_MAX + 1];
        core_path(in, core, sizeof core);
        json_object_set_new(ev, "core", json_string(core[0] ? core : "dumped"));
    }
}

void bb_logs_start(void)
{
    rotate_timer.fn = on_rotate;
    bb_timer_set(&rotate_timer, sd_mono_ms() + LOG_ROTATE_EVERY_MS);
}

void bb_credential_path(const char *id, char *out, size_t cap)
{
    snprintf(out, cap, "%s/credentials/%s.jwt", bb.cfg.state_dir, id);
}

/* CLOCK_BOOTTIME in ms: the clock of /proc/<pid>/stat's start time. */
static int64_t boot_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The child's environment: first the variables that point the process at bigbrother and
 * name it (procscan.c finds it again by them, reading only the start of its environ),
 * then bigbrother's own and the service's env, each minus what bigbrother sets. Caller
 * frees with free_env. */
static char **build_env(const bb_inst_t *in)
{
    const bb_service_t *s = in->svc;
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    for (char **e = s->env; *e; e++)
        n++;
    char **env = calloc(n + 14, sizeof(char *));
    if (!env)
        return NULL;
    int ok = asprintf(&env[k++], "BB_SUPERVISOR=%s", bb.ident) > 0 &&
             asprintf(&env[k++], "BB_INSTANCE=%s", in->id) > 0 &&
             asprintf(&env[k++], "BB_SERVICE=%s", s->name) > 0 &&
             asprintf(&env[k++], "BB_SLOT=%d", in->slot) > 0 &&
             asprintf(&env[k++], "BB_GENERATION=%d", in->generation + 1) > 0 &&
             asprintf(&env[k++], "BB_SPAWNED_MS=%lld", (long long)boot_ms()) > 0 &&
             asprintf(&env[k++], "BB_SOCKET=%s", bb.cfg.agent_socket) > 0 &&
             asprintf(&env[k++], "BB_MACHINE=%s", bb.cfg.machine) > 0 &&
             asprintf(&env[k++], "BB_CLUSTER=%s", bb.cfg.cluster) > 0 &&
             asprintf(&env[k++], "NOTIFY_SOCKET=%s", bb.cfg.notify_socket) > 0;
    if (ok && s->health.type == BB_H_NOTIFY)
        ok = asprintf(&env[k++], "WATCHDOG_USEC=%lld",
                      (long long)s->health.liveness_timeout_ms * 1000) > 0;
    if (ok && bb.cred) {
        char path[PATH_MAX];
        bb_credential_path(in->id, path, sizeof path);
        ok = asprintf(&env[k++], "SERVERDIR_CREDENTIAL_FILE=%s", path) > 0;
    }
    if (!ok)
        goto fail;
    for (char **e = environ; *e; e++) {
        int skip = !strncmp(*e, "BB_", 3) || !strncmp(*e, "NOTIFY_SOCKET=", 14) ||
                   !strncmp(*e, "WATCHDOG_USEC=", 14) || !strncmp(*e, "WATCHDOG_PID=", 13) ||
                   !strncmp(*e, "SERVERDIR_CREDENTIAL_FILE=", 26);
        for (char **se = s->env; *se && !skip; se++) {
            size_t klen = strcspn(*se, "=");
            skip = !strncmp(*e, *se, klen + 1);
        }
        if (!skip && !(env[k++] = strdup(*e)))
            goto fail;
    }
    size_t nours = k;
    for (char **e = s->env; *e; e++) {
        size_t klen = strcspn(*e, "=");
        int skip = 0; /* what bigbrother sets is bigbrother's: no second, shadowed copy */
        for (size_t i = 0; i < nours && !skip; i++)
            skip = !strncmp(env[i], *e, klen + 1);
        if (!skip && !(env[k++] = strdup(*e)))
            goto fail;
    }
    return env;
fail:
    for (size_t i = 0; i < n + 14; i++)
        free(env[i]);
    free(env);
    return NULL;
}

static void free_env(char **env)
{
    for (char **e = env; *e; e++)
        free(*e);
    free(env);
}

/* In the forked child: only async-signal-safe calls (the reporter thread may hold locks). */
static void __attribute__((noreturn)) child_exec(const bb_service_t *s, int logfd, char **env)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    int nul = open("/dev/null", O_RDONLY);
    if (nul < 0 || dup2(nul, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
        _exit(127);
    syscall(SYS_close_range, 3, ~0U, 0);
    for (int i = 0; i < s->nrlimits; i++)
        if (setrlimit(s->rlimits[i].resource, &s->rlimits[i].lim)) {
            dprintf(2, "bigbrother: setrlimit(%d) failed: %s\n", s->rlimits[i].resource,
                    strerror(errno));
            _exit(127);
        }
    if (s->cwd && chdir(s->cwd)) {
        dprintf(2, "bigbrother: chdir %s failed: %s\n", s->cwd, strerror(errno));
        _exit(127);
    }
    if (s->user && (setgroups(1, &s->gid) || setgid(s->gid) || setuid(s->uid))) {
        dprintf(2, "bigbrother: cannot become user %s: %s\n", s->user, strerror(errno));
        _exit(127);
    }
    execve(s->command, s->argv, env);
    dprintf(2, "bigbrother: exec %s failed: %s\n", s->command, strerror(errno));
    _exit(127);
}

static void on_pidfd(bb_watch_t *w, uint32_t events)
{
    bb_inst_t *in = container_of(w, bb_inst_t, pidw);
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    int code = -1, sig = -1;
    if (in->is_child) {
        if (bb_pidfd_wait(w->fd, &si))
            return;
        if (si.si_pid == 0)
            return; /* not exited yet (a stale wake-up) */
        if (si.si_code == CLD_EXITED)
            code = si.si_status;
        else
            sig = si.si_status;
    }
    in->dumped = si.si_code == CLD_DUMPED;
    bb_inst_exited(in, code, sig);
}

int bb_spawn(bb_inst_t *in)
{
    const bb_service_t *s = in->svc;
    int rc = 0;
    snprintf(in->id, sizeof(in->id), "%s-%s-%s-%llu", s->name, bb.cfg.machine, bb.run_id,
             (unsigned long long)++bb.counter);
    if (strlen(in->id) > SD_NAME_MAX)
        snprintf(in->id, sizeof(in->id), "%.*s-%s-%llu", 64, s->name, bb.run_id,
                 (unsigned long long)bb.counter);
    bb.state_dirty = 1;
    int logfd = open_run_log(in);
    if (logfd < 0)
        return logfd;
    char **env = build_env(in);
    if (!env) {
        close(logfd);
        return -ENOMEM;
    }
    pid_t pid = fork();
    if (pid == 0)
        child_exec(s, logfd, env);
    int err = errno;
    free_env(env);
    close(logfd);
    if (pid < 0)
        return -err;
    setpgid(pid, pid); /* also done by the child: whichever runs first wins the race */
    in->pid = pid;
    in->is_child = 1;
    in->start_ticks = 0;
    bb_proc_stat(pid, &in->start_ticks, NULL);
    int fd = bb_pidfd_open(pid);
    in->pidw.fd = fd < 0 ? -1 : fd;
    in->pidw.fn = on_pidfd;
    if (fd < 0 || (rc = bb_watch_add(&in->pidw, EPOLLIN))) {
        rc = fd < 0 ? fd : rc;
        log_error("pidfd failed", "pid=%d error=%s", (int)pid, strerror(-rc));
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        bb_pidfd_close(&in->pidw);
        in->pid = 0;
        return rc;
    }
    return 0;
}

/* Watches a re-adopted process: pidfd for its exit (no status unless it is our child). */
int bb_adopt_pid(bb_inst_t *in, pid_t ppid)
{
    int fd = bb_pidfd_open(in->pid);
    in->pidw.fd = fd < 0 ? -1 : fd;
    in->pidw.fn = on_pidfd;
    in->is_child = ppid == getpid();
    if (fd < 0)
        return fd;
    return bb_watch_add(&in->pidw, EPOLLIN);
}
