/* What a cut-off machine's games did to the players' locks and saves, and which
 * processes run each slot (harness_partition.h). */
#include "harness_partition.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void hp_locks_init(hp_locks_t *l, h_redis_t *redis, int nkeys)
{
    memset(l, 0, sizeof *l);
    l->redis = redis;
    l->nkeys = nkeys > HP_MAXKEYS ? HP_MAXKEYS : nkeys;
}

/* The string element i of an array reply ("" when nil or absent). */
static const char *el(const redisReply *r, size_t i)
{
    return r && r->type == REDIS_REPLY_ARRAY && i < r->elements &&
                   r->element[i]->type == REDIS_REPLY_STRING
               ? r->element[i]->str
               : "";
}

/* 1 when holder's directory record (cluster c1) says stopped at or before at_ms (at_ms
 * < 0: at any time); *reason gets its reason. Holders that are no process of the
 * directory (the tests' own) are never stopped. */
static int holder_stopped(h_redis_t *redis, const char *holder, long long at_ms, char *reason,
                          size_t cap)
{
    redisReply *p = h_redis(redis, "HMGET sd:{c1}:proc:%s state updated_at_ms reason", holder);
    int stopped = !strcmp(el(p, 0), "stopped") &&
                  (at_ms < 0 || strtoll(el(p, 1), NULL, 10) <= at_ms);
    snprintf(reason, cap, "%s", el(p, 2));
    if (p)
        freeReplyObject(p);
    return stopped;
}

/* Key k's lock: a new grant is counted, and checked against its holder's record. */
static void sample_lock(hp_locks_t *l, int k, const redisReply *r)
{
    long long seq = strtoll(el(r, 1), NULL, 10);
    if (seq <= l->lock_seq[k])
        return;
    l->lock_seq[k] = seq;
    l->grants++;
    char reason[64];
    if (holder_stopped(l->redis, el(r, 0), strtoll(el(r, 2), NULL, 10), reason, sizeof reason)) {
        l->stopped_grants++;
        l->stopped_seq[k] = seq;
        snprintf(l->stopped_holder, sizeof l->stopped_holder, "%s", el(r, 0));
        print_message("VIOLATION player:%d lock_seq %lld granted to %s, recorded stopped (%s) "
                      "before the grant\n", k, seq, el(r, 0), reason);
    }
}

/* Key k's blob after its lock was read: saves since the last sample, and whose grant
 * they were accepted under. prev_lock: the lock_seq seen before this sample. */
static void sample_blob(hp_locks_t *l, int k, const redisReply *b, long long prev_lock)
{
    if (!*el(b, 0))
        return;
    long long seq = strtoll(el(b, 0), NULL, 10), lseq = strtoll(el(b, 1), NULL, 10);
    if (seq > l->blob_seq[k]) {
        l->saves++;
        if (lseq < prev_lock || lseq < l->blob_lock[k]) {
            l->stale_saves++;
            print_message("VIOLATION player:%d save accepted under lock_seq %lld after lock_seq "
                          "%lld was granted\n", k, lseq,
                          prev_lock > l->blob_lock[k] ? prev_lock : l->blob_lock[k]);
        }
        if (lseq && lseq == l->stopped_seq[k])
            l->stopped_saves++;
    }
    if (seq > l->blob_seq[k])
        l->blob_seq[k] = seq;
    if (lseq > l->blob_lock[k])
        l->blob_lock[k] = lseq;
}

void hp_locks_sample(hp_locks_t *l)
{
    for (int k = 1; k <= l->nkeys; k++) {
        char name[32];
        snprintf(name, sizeof name, "player:%d", k);
        long long prev_lock = l->lock_seq[k];
        redisReply *r = h_redis(l->redis, "HMGET %s holder seq since", h_lock_key(name));
        if (!r)
            return; /* redis restarting */
        if (*el(r, 0))
            sample_lock(l, k, r);
        freeReplyObject(r);
        redisReply *b = h_redis(l->redis, "HMGET sd:blob:%s seq lock_seq", name);
        if (!b)
            return;
        sample_blob(l, k, b, prev_lock);
        freeReplyObject(b);
    }
    l->samples++;
}

int hp_locks_stuck(hp_locks_t *l)
{
    int stuck = 0;
    for (int k = 1; k <= l->nkeys; k++) {
        char name[32], reason[64];
        snprintf(name, sizeof name, "player:%d", k);
        redisReply *r = h_redis(l->redis, "HMGET %s holder seq since", h_lock_key(name));
        if (!r)
            return -1;
        if (*el(r, 0) && holder_stopped(l->redis, el(r, 0), -1, reason, sizeof reason)) {
            stuck++;
            print_message("VIOLATION player:%d held by %s (lock_seq %s), recorded stopped (%s)\n",
                          k, el(r, 0), el(r, 1), reason);
        }
        freeReplyObject(r);
    }
    return stuck;
}

int hp_ident(const char *state, char *out)
{
    char path[400];
    snprintf(path, sizeof path, "%s/bigbrother.id", state);
    FILE *f = fopen(path, "r");
    out[0] = '\0';
    if (f && fgets(out, 40, f))
        out[strcspn(out, "\r\n")] = '\0';
    if (f)
        fclose(f);
    return strlen(out) == 32 ? 0 : -1;
}

/* Value of NAME= in the NUL-separated environment env of n bytes, or NULL. */
static const char *env_get(const char *env, ssize_t n, const char *name)
{
    size_t len = strlen(name);
    for (ssize_t off = 0; off < n; off += (ssize_t)strlen(env + off) + 1)
        if (!strncmp(env + off, name, len) && env[off + (ssize_t)len] == '=')
            return env + off + len + 1;
    return NULL;
}

int hp_procs(const char *svc, char ident[][40], int n, hp_proc_t *out, int cap)
{
    static char env[1 << 16];
    DIR *d = opendir("/proc");
    int found = 0;
    for (struct dirent *de; d && (de = readdir(d)) && found < cap;) {
        pid_t pid = (pid_t)atoi(de->d_name);
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        if (fd < 0)
            continue;
        ssize_t len = read(fd, env, sizeof env - 1);
        close(fd);
        if (len <= 0)
            continue;
        env[len] = '\0';
        const char *sup = env_get(env, len, "BB_SUPERVISOR"), *s = env_get(env, len, "BB_SERVICE"),
                   *slot = env_get(env, len, "BB_SLOT"), *inst = env_get(env, len, "BB_INSTANCE"),
                   *gen = env_get(env, len, "BB_GENERATION");
        if (!sup || !s || !slot || !inst || !gen || strcmp(s, svc))
            continue;
        for (int b = 0; b < n; b++) {
            if (strcmp(sup, ident[b]))
                continue;
            char st[64], line[512];
            snprintf(st, sizeof st, "/proc/%d/stat", (int)pid);
            FILE *f = fopen(st, "r");
            int ok = f && fgets(line, sizeof line, f);
            if (f)
                fclose(f);
            /* after "(comm)": state, ppid, pgrp. A game leads its process group
             * (bigbrother's spawn): a task with its environment that does not is a child
             * or clone of one (under ASan, LeakSanitizer's tracer at a game's exit) */
            const char *rp = ok ? strrchr(line, ')') : NULL;
            char state = 0;
            int ppid = 0, pgrp = 0;
            if (!rp || sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) != 3 ||
                state == 'Z' || pgrp != (int)pid)
                continue;
            out[found] = (hp_proc_t){pid, atoi(slot), atoi(gen), b, ""};
            snprintf(out[found++].instance, sizeof out->instance, "%s", inst);
        }
    }
    if (d)
        closedir(d);
    return found;
}
