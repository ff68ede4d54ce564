/* Finding bigbrother's own processes in /proc, with or without its state file.
 *
 * bb_spawn puts, first in every child's environment (so a bounded read of it sees them):
 *   BB_SUPERVISOR  this bigbrother's identity: 32 random hex characters kept in
 *                  state_dir/bigbrother.id (mode 0600). Two bigbrothers of one machine
 *                  have different ones, and a process cannot learn it without being
 *                  allowed to read the environment of one of the instances;
 *   BB_INSTANCE, BB_SERVICE, BB_SLOT, BB_GENERATION: which slot, which spawn;
 *   BB_SPAWNED_MS  CLOCK_BOOTTIME in ms just before the fork.
 * /proc/<pid>/environ keeps the environment the process was executed with, whoever its
 * parent is now (after a crash of bigbrother: pid 1 or a subreaper), so a scan finds the
 * instances again. A process counts as one only when, besides the identity, it leads
 * its own process group (bb_spawn's setpgid; a descendant that inherited the
 * environment does not) and its start time (field 22 of stat, clock ticks since boot)
 * lies between one tick before BB_SPAWNED_MS and SPAWN_SLACK_MS after it. The stat is
 * read before and after the environment and must name the same start: a pid recycled
 * in between is skipped. */
#include "instance/bb_instance.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENVIRON_MAX (64 << 10) /* bytes of /proc/<pid>/environ looked at */
#define SPAWN_SLACK_MS 10000   /* fork to start time, on a loaded machine */

/* Reads at most cap - 1 bytes of path into buf and NUL-terminates them. Returns the
 * length, or -errno when the file cannot be opened or read. */
static ssize_t read_bounded(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t len = 0;
    ssize_t n = 0;
    while (len < cap - 1 && (n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    int err = errno;
    close(fd);
    if (n < 0)
        return -err;
    buf[len] = 0;
    return (ssize_t)len;
}

int bb__proc_stat_at(const char *proc_root, pid_t pid, bb_pstat_t *st)
{
    char path[512], buf[1024];
    snprintf(path, sizeof(path), "%s/%d/stat", proc_root, (int)pid);
    if (read_bounded(path, buf, sizeof(buf)) <= 0)
        return -1;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return -1;
    p += 2; /* field 3: state */
    if (*p == 'Z' || *p == 'X' || *p == 'x')
        return -1;
    char *save = NULL, *tok = strtok_r(p, " ", &save);
    for (int field = 3; tok; field++, tok = strtok_r(NULL, " ", &save)) {
        if (field == 4)
            st->ppid = (pid_t)atoi(tok);
        else if (field == 5)
            st->pgrp = (pid_t)atoi(tok);
        else if (field == 22) {
            st->start_ticks = strtoll(tok, NULL, 10);
            return 0;
        }
    }
    return -1;
}

int bb_proc_stat(pid_t pid, int64_t *start_ticks, pid_t *ppid)
{
    bb_pstat_t st;
    if (bb__proc_stat_at("/proc", pid, &st))
        return -1;
    *start_ticks = st.start_ticks;
    if (ppid)
        *ppid = st.ppid;
    return 0;
}

/* The value of NAME in a NUL-separated environment block of len bytes, or NULL. */
static const char *env_get(const char *env, size_t len, const char *name)
{
    size_t nlen = strlen(name);
    for (size_t i = 0; i < len; i += strlen(env + i) + 1)
        if (!strncmp(env + i, name, nlen) && env[i + nlen] == '=')
            return env + i + nlen + 1;
    return NULL;
}

/* The real uid of pid (the "Uid:" line of its status). Returns 0, or -1 when the process
 * is gone or its status has no readable Uid line. */
static int proc_uid(const char *proc_root, pid_t pid, uid_t *uid)
{
    char path[512], buf[4096];
    snprintf(path, sizeof(path), "%s/%d/status", proc_root, (int)pid);
    if (read_bounded(path, buf, sizeof(buf)) <= 0)
        return -1;
    const char *p = strstr(buf, "\nUid:");
    long long v;
    if (!p || sscanf(p + 5, "%lld", &v) != 1 || v < 0)
        return -1;
    *uid = (uid_t)v;
    return 0;
}

/* Fills f from the process pid when it is one of ident's instances (see the top of the
 * file); env is a scratch buffer of ENVIRON_MAX bytes. Returns 1 if it is, else 0. */
static int inspect(const char *proc_root, pid_t pid, const char *ident, char *env,
                   bb_found_t *f)
{
    char path[512];
    bb_pstat_t before, after;
    if (bb__proc_stat_at(proc_root, pid, &before) || before.pgrp != pid)
        return 0;
    snprintf(path, sizeof(path), "%s/%d/environ", proc_root, (int)pid);
    ssize_t n = read_bounded(path, env, ENVIRON_MAX);
    if (n <= 0)
        return 0; /* gone, a kernel thread, or not ours to read */
    const char *sup = env_get(env, (size_t)n, "BB_SUPERVISOR");
    if (!sup || strcmp(sup, ident))
        return 0;
    const char *id = env_get(env, (size_t)n, "BB_INSTANCE");
    const char *service = env_get(env, (size_t)n, "BB_SERVICE");
    const char *slot = env_get(env, (size_t)n, "BB_SLOT");
    const char *gen = env_get(env, (size_t)n, "BB_GENERATION");
    const char *spawned = env_get(env, (size_t)n, "BB_SPAWNED_MS");
    int64_t vslot, vgen, vspawned;
    if (!id || !service || !slot || !gen || !spawned || !sd_name_valid(id, SD_NAME_MAX) ||
        !sd_name_valid(service, SD_NAME_MAX) || sd_parse_i64(slot, 0, 1000000, &vslot) ||
        sd_parse_i64(gen, 1, INT32_MAX, &vgen) ||
        sd_parse_i64(spawned, 0, INT64_MAX / 2, &vspawned))
        return 0;
    if (bb__proc_stat_at(proc_root, pid, &after) || after.start_ticks != before.start_ticks ||
        proc_uid(proc_root, pid, &f->uid))
        return 0;
    long tck = sysconf(_SC_CLK_TCK);
    if (tck <= 0)
        tck = 100;
    int64_t start_ms = before.start_ticks * 1000 / tck;
    if (start_ms < vspawned - 1000 / tck - 1 || start_ms > vspawned + SPAWN_SLACK_MS)
        return 0;
    f->pid = pid;
    f->ppid = before.ppid;
    f->start_ticks = before.start_ticks;
    f->start_ms = start_ms;
    f->slot = (int)vslot;
    f->generation = (int)vgen;
    f->claimed = 0;
    sd_strlcpy(f->id, id, sizeof(f->id));
    sd_strlcpy(f->service, service, sizeof(f->service));
    return 1;
}

/* Newest first: the order in which state.c gives the found processes their slots. */
static int newest_first(const void *a, const void *b)
{
    const bb_found_t *x = a, *y = b;
    return x->start_ticks != y->start_ticks ? (x->start_ticks < y->start_ticks ? 1 : -1)
                                            : (x->pid < y->pid ? 1 : -1);
}

int bb__proc_scan(const char *proc_root, const char *ident, bb_found_t **out)
{
    *out = NULL;
    DIR *d = opendir(proc_root);
    if (!d)
        return -errno;
    char *env = malloc(ENVIRON_MAX);
    bb_found_t *found = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *e;
    while (env && (e = readdir(d))) {
        int64_t pid;
        if (sd_parse_i64(e->d_name, 1, INT32_MAX, &pid))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            bb_found_t *grown = realloc(found, (size_t)cap * sizeof(*found));
            if (!grown) {
                rc = -ENOMEM;
                goto out;
            }
            found = grown;
        }
        if (!inspect(proc_root, (pid_t)pid, ident, env, &found[n]))
            continue;
        /* one process per instance id: the one started first (its parent) */
        int dup = -1;
        for (int i = 0; i < n && dup < 0; i++)
            if (!strcmp(found[i].id, found[n].id))
                dup = i;
        if (dup < 0)
            n++;
        else if (found[n].start_ticks < found[dup].start_ticks)
            found[dup] = found[n];
    }
    if (!env)
        rc = -ENOMEM;
out:
    closedir(d);
    free(env);
    if (rc) {
        free(found);
        return rc;
    }
    if (n)
        qsort(found, (size_t)n, sizeof(*found), newest_first);
    *out = found;
    return n;
}
