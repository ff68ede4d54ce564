/* bigbrother without a trustworthy state file: the /proc scan (procscan.c) on a fake
 * proc tree (identity, process group, start time window, zombies, unreadable and
 * oversized environments, odd command names, newest first), and a damaged state.json
 * (garbage, cut in half, empty, no instances array) renamed aside while a good or
 * missing one is left alone (state.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bb_daemon.h"
#include "harness.h"

#define IDENT "0123456789abcdef0123456789abcdef"
#define SPAWNED_MS 500000 /* boot-time ms of the fake spawns */

static char proc_root[300];

/* Writes len bytes to dir/name. */
static void put(const char *dir, const char *name, const char *data, size_t len)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* One fake process: its stat (state, pgrp, start at start_ms), status (uid 0) and, unless
 * env is NULL, its environ from the '|'-separated env with `pad` bytes of other
 * variables in front. */
static void fake(int pid, const char *comm, char state, int pgrp, int64_t start_ms,
                 const char *env, size_t pad)
{
    char dir[400], stat[600];
    snprintf(dir, sizeof(dir), "%s/%d", proc_root, pid);
    mkdir(dir, 0755);
    long tck = sysconf(_SC_CLK_TCK);
    int n = snprintf(stat, sizeof(stat),
                     "%d (%s) %c 1 %d %d 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 %lld 1000 10\n",
                     pid, comm, state, pgrp, pgrp, (long long)(start_ms * tck / 1000));
    put(dir, "stat", stat, (size_t)n);
    static const char status[] = "Name:\tgameproc\nUmask:\t0022\nState:\tS\nUid:\t0\t0\t0\t0\n";
    put(dir, "status", status, sizeof(status) - 1);
    if (!env)
        return;
    size_t cap = pad + strlen(env) + 2;
    char *buf = calloc(1, cap);
    memset(buf, 'A', pad);
    if (pad) {
        memcpy(buf, "PAD=", 4);
        buf[pad - 1] = 0;
    }
    size_t len = pad;
    for (const char *p = env; *p; p++)
        buf[len++] = *p == '|' ? 0 : *p;
    buf[len++] = 0;
    put(dir, "environ", buf, len);
    free(buf);
}

/* The environment bigbrother gives slot `slot` of service zone. */
static const char *env_of(const char *ident, const char *id, const char *slot)
{
    static char env[600];
    snprintf(env, sizeof(env),
             "BB_SUPERVISOR=%s|BB_INSTANCE=%s|BB_SERVICE=zone|BB_SLOT=%s|BB_GENERATION=3|"
             "BB_SPAWNED_MS=%d|BB_SOCKET=/run/bb/agent.sock|PATH=/usr/bin",
             ident, id, slot, SPAWNED_MS);
    return env;
}

static void scan_finds_only_own_group_leaders_started_in_time(void **state)
{
    (void)state;
    snprintf(proc_root, sizeof(proc_root), "%s/proc", h_tmpdir());
    mkdir(proc_root, 0755);
    fake(100, "gameproc", 'S', 100, SPAWNED_MS + 5, env_of(IDENT, "zone-m1-a-1", "0"), 0);
    /* a child of 100 that inherited its environment: not a group leader */
    fake(101, "gameproc", 'S', 100, SPAWNED_MS + 40, env_of(IDENT, "zone-m1-a-1", "0"), 0);
    /* another bigbrother's process */
    fake(102, "gameproc", 'S', 102, SPAWNED_MS, env_of("ffffffffffffffffffffffffffffffff",
                                                       "zone-m1-b-1", "0"), 0);
    /* started long after the spawn it claims: a copied environment */
    fake(103, "gameproc", 'S', 103, SPAWNED_MS + 60000, env_of(IDENT, "zone-m1-a-2", "1"), 0);
    /* and long before it */
    fake(104, "gameproc", 'S', 104, SPAWNED_MS - 5000, env_of(IDENT, "zone-m1-a-3", "1"), 0);
    fake(105, "gameproc", 'Z', 105, SPAWNED_MS, env_of(IDENT, "zone-m1-a-4", "1"), 0);
    fake(106, "gameproc", 'S', 106, SPAWNED_MS, NULL, 0); /* environ not readable */
    /* a command name with spaces and parentheses; started later than 100: listed first */
    fake(107, "x) (y", 'S', 107, SPAWNED_MS + 900, env_of(IDENT, "zone-m1-a-5", "2"), 0);
    fake(108, "gameproc", 'S', 108, SPAWNED_MS, env_of(IDENT, "zone-m1-a-6", "x"), 0);
    fake(109, "gameproc", 'S', 109, SPAWNED_MS, env_of(IDENT, "zone/../etc", "1"), 0);
    /* the identity behind 64 KiB of other variables is past the bounded read */
    fake(110, "gameproc", 'S', 110, SPAWNED_MS, env_of(IDENT, "zone-m1-a-7", "1"), 70000);
    char self[400];
    snprintf(self, sizeof(self), "%s/self", proc_root);
    mkdir(self, 0755);

    bb_found_t *found = NULL;
    int n = bb__proc_scan(proc_root, IDENT, &found);
    assert_int_equal(n, 2);
    assert_int_equal(found[0].pid, 107);
    assert_string_equal(found[0].id, "zone-m1-a-5");
    assert_int_equal(found[0].slot, 2);
    assert_int_equal(found[1].pid, 100);
    assert_string_equal(found[1].id, "zone-m1-a-1");
    assert_string_equal(found[1].service, "zone");
    assert_int_equal(found[1].slot, 0);
    assert_int_equal(found[1].generation, 3);
    assert_int_equal(found[1].ppid, 1);
    assert_int_equal(found[1].uid, 0);
    free(found);

    bb_pstat_t st;
    assert_int_equal(bb__proc_stat_at(proc_root, 107, &st), 0);
    assert_int_equal(st.pgrp, 107);
    assert_int_equal(bb__proc_stat_at(proc_root, 105, &st), -1);
    assert_int_equal(bb__proc_stat_at(proc_root, 999, &st), -1);

    assert_int_equal(bb__proc_scan("/nonexistent-proc", IDENT, &found), -ENOENT);
    assert_null(found);
}

/* The names in dir starting with prefix: how many, and the first one into out. */
static int names_with(const char *dir, const char *prefix, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && n++ == 0)
            snprintf(out, cap, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
    return n;
}

/* Writes text as dir/state.json, reads it back through bb__state_read, and checks it is
 * refused and kept aside unchanged. */
static void refused_and_kept(const char *text, size_t len)
{
    const char *dir = h_tmpdir();
    char aside[700], *kept = NULL, path[400];
    size_t klen = 0;
    put(dir, "state.json", text, len);
    assert_null(bb__state_read(dir));
    snprintf(path, sizeof(path), "%s/state.json", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(names_with(dir, "state.json.damaged-", aside, sizeof(aside)), 1);
    assert_int_equal(sd_read_file(aside, 1 << 20, &kept, &klen), 0);
    assert_int_equal(klen, len);
    assert_memory_equal(kept, text, len);
    free(kept);
}

static void damaged_state_file_is_kept_aside(void **state)
{
    (void)state;
    static const char good[] =
        "{\"version\":1,\"counter\":7,\"instances\":[{\"service\":\"zone\",\"slot\":0,"
        "\"id\":\"zone-m1-a-1\",\"state\":\"ready\",\"pid\":100,\"start_ticks\":5}]}";
    refused_and_kept("\x01garbage {{{", 12);
    refused_and_kept(good, sizeof(good) / 2);
    refused_and_kept("", 0);
    refused_and_kept("{\"version\":1,\"counter\":7}", 26);
    refused_and_kept("[1,2,3]", 7);

    const char *dir = h_tmpdir();
    char aside[700];
    put(dir, "state.json", good, sizeof(good) - 1);
    json_t *root = bb__state_read(dir);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(root, "counter")), 7);
    json_decref(root);
    assert_int_equal(names_with(dir, "state.json.damaged-", aside, sizeof(aside)), 0);
    assert_int_equal(names_with(dir, "state.json", aside, sizeof(aside)), 1);

    const char *empty = h_tmpdir(); /* no state file at all: a first start */
    assert_null(bb__state_read(empty));
    assert_int_equal(names_with(empty, "state.json", aside, sizeof(aside)), 0);
}

int main(void)
{
    h_init(60);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scan_finds_only_own_group_leaders_started_in_time),
        cmocka_unit_test(damaged_state_file_is_kept_aside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
