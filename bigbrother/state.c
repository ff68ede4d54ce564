/* What survives a bigbrother restart: the process table in state_dir/state.json, written
 * atomically (temp file + rename) before the loop sleeps whenever it changed, and the
 * lock file that keeps a second bigbrother off the same state dir.
 *
 * On start, an instance of the table whose pid is alive with the same start time (field
 * 22 of /proc/<pid>/stat, so a recycled pid is never mistaken for it) is re-adopted with
 * a pidfd, keeps its instance id and state, and is given its start or liveness deadline
 * afresh; its agent reconnects by itself. It is never killed or restarted for the
 * restart of bigbrother. An instance whose process died meanwhile is reported stopped
 * (exit status unknown) and restarted by its policy.
 *
 * A cluster slot (cluster mode) is saved with its spec, restart token and whether it was
 * assigned, and restored from them (converge.c) before the first assignment arrives;
 * that assignment then decides whether it keeps running. */
#include "bb.h"
#include "sdjson.h"
#include "sdlog.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_MAX_BYTES (64 << 20)

static int lock_fd = -1;

static void mkdir_p(const char *dir)
{
    char p[512];
    sd_strlcpy(p, dir, sizeof(p));
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    if (mkdir(p, 0755) && errno != EEXIST)
        sd_die(SD_EXIT_SYSTEM, "cannot create the state dir", "path=%s error=%s", p,
               strerror(errno));
}

void bb_state_lock(void)
{
    char path[512], logs[512];
    mkdir_p(bb.cfg.state_dir);
    snprintf(logs, sizeof(logs), "%s/logs", bb.cfg.state_dir);
    mkdir_p(logs);
    snprintf(path, sizeof(path), "%s/bigbrother.lock", bb.cfg.state_dir);
    lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0)
        sd_die(SD_EXIT_SYSTEM, "cannot open the lock file", "path=%s error=%s", path,
               strerror(errno));
    if (flock(lock_fd, LOCK_EX | LOCK_NB)) {
        char holder[32] = "";
        ssize_t n = pread(lock_fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        sd_die(SD_EXIT_SYSTEM, "another bigbrother already runs on this state dir",
               "lock=%s holder_pid=%s", path, holder);
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(lock_fd, 0) || pwrite(lock_fd, pid, (size_t)n, 0) != n)
        log_warn("cannot write the lock file", "path=%s error=%s", path, strerror(errno));
}

static json_t *inst_json(const bb_inst_t *in)
{
    const json_t *spec = bb_converge_spec(in);
    json_t *o = json_pack("{s:s, s:i, s:s, s:s, s:i, s:I, s:I, s:i, s:i, s:i, s:s, s:i, s:i, s:s,"
                     " s:i}",
                     "service", in->svc->name, "slot", in->slot, "id", in->id, "state",
                     bb_state_name(in->state), "pid", (int)in->pid, "start_ticks",
                     (json_int_t)in->start_ticks, "started_wall_ms",
                     (json_int_t)in->spawned_wall, "generation", in->generation, "restarts",
                     in->restarts, "fail_streak", in->fail_streak, "reason", in->reason,
                     "code", in->code, "signal", in->sig, "detail", in->detail, "why",
                     (int)in->why);
    if (o && spec) /* a cluster slot: what it runs comes from the assignment */
        json_object_set_new(o, "cluster",
                            json_pack("{s:O, s:I, s:b}", "spec", spec, "restart_token",
                                      (json_int_t)in->restart_token, "assigned",
                                      in->assigned != 0));
    return o;
}

void bb_state_save(void)
{
    if (!bb.state_dirty)
        return;
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/state.json", bb.cfg.state_dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    json_t *arr = json_array();
    for (int i = 0; i < bb.ninst; i++)
        json_array_append_new(arr, inst_json(&bb.inst[i]));
    json_t *root = json_pack("{s:i, s:I, s:o}", "version", 1, "counter",
                             (json_int_t)bb.counter, "instances", arr);
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text) {
        log_error("state not saved", "error=%s", "out of memory");
        return;
    }
    size_t len = strlen(text);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, text, len) == (ssize_t)len;
    if (fd >= 0)
        close(fd);
    free(text);
    if (!ok || rename(tmp, path)) {
        log_error("state not saved", "path=%s error=%s", path, strerror(errno));
        return;
    }
    bb.state_dirty = 0;
}

static bb_inst_t *find_slot(const char *service, int slot)
{
    for (int i = 0; i < bb.ninst; i++)
        if (bb.inst[i].slot == slot && !strcmp(bb.inst[i].svc->name, service))
            return &bb.inst[i];
    return NULL;
}

static int parse_state(const char *s)
{
    for (int i = 0; i < ST__COUNT; i++)
        if (!strcmp(s, bb_state_name((enum bb_state)i)))
            return i;
    return -1;
}

/* A process of the table that the config no longer has: stop it (TERM to its group). */
static void stop_unconfigured(const char *id, pid_t pid, int64_t ticks)
{
    int64_t now_ticks;
    if (pid > 0 && bb_proc_stat(pid, &now_ticks, NULL) == 0 && now_ticks == ticks) {
        log_warn("instance no longer configured: stopping it", "instance=%s pid=%d", id,
                 (int)pid);
        if (kill(-pid, SIGTERM))
            kill(pid, SIGTERM);
    }
}

static void load_one(json_t *e)
{
    const char *service = json_string_value(json_object_get(e, "service"));
    const char *id = json_string_value(json_object_get(e, "id"));
    const char *st = json_string_value(json_object_get(e, "state"));
    pid_t pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
    int64_t ticks = json_integer_value(json_object_get(e, "start_ticks"));
    int state = st ? parse_state(st) : -1;
    if (!service || !id || state < 0 || strlen(id) > SD_NAME_MAX)
        return;
    int slot = (int)json_integer_value(json_object_get(e, "slot"));
    json_t *cl = json_object_get(e, "cluster");
    bb_inst_t *in = NULL;
    if (json_is_object(cl) && sd_name_valid(service, SD_NAME_MAX) && slot >= 0)
        in = bb_converge_restore(service, slot, json_object_get(cl, "spec"),
                                 json_integer_value(json_object_get(cl, "restart_token")),
                                 json_is_true(json_object_get(cl, "assigned")));
    else if (!cl)
        in = find_slot(service, slot);
    if (!in) {
        stop_unconfigured(id, pid, ticks);
        return;
    }
    sd_strlcpy(in->id, id, sizeof(in->id));
    in->generation = (int)json_integer_value(json_object_get(e, "generation"));
    in->restarts = (int)json_integer_value(json_object_get(e, "restarts"));
    in->fail_streak = (int)json_integer_value(json_object_get(e, "fail_streak"));
    in->code = (int)json_integer_value(json_object_get(e, "code"));
    in->sig = (int)json_integer_value(json_object_get(e, "signal"));
    in->spawned_wall = json_integer_value(json_object_get(e, "started_wall_ms"));
    sd_strlcpy(in->reason, json_string_value(json_object_get(e, "reason")) ?: "",
               sizeof(in->reason));
    sd_strlcpy(in->detail, json_string_value(json_object_get(e, "detail")) ?: "",
               sizeof(in->detail));
    if (state == ST_EXITED || state == ST_FAILED || state == ST_STOPPED) {
        in->loaded = 1;
        bb_inst_adopt(in, (enum bb_state)state, 0);
        return;
    }
    if (state == ST_BACKOFF || pid <= 0)
        return; /* started afresh */
    in->pid = pid;
    in->start_ticks = ticks;
    in->loaded = 1;
    int64_t now_ticks = -1;
    pid_t ppid = 0;
    int alive = bb_proc_stat(pid, &now_ticks, &ppid) == 0 && now_ticks == ticks;
    if (!alive || bb_adopt_pid(in, ppid)) {
        log_warn("instance died while bigbrother was away", "instance=%s pid=%d", id,
                 (int)pid);
        bb_inst_adopt(in, (enum bb_state)state, 0);
        return;
    }
    enum bb_why why = (enum bb_why)json_integer_value(json_object_get(e, "why"));
    bb_inst_adopt(in, (enum bb_state)state, 1);
    if (state == ST_STOPPING) /* finish what the previous run began */
        bb_inst_event(in, why == WHY_OPERATOR  ? EV_STOP
                          : why == WHY_RESTART ? EV_RESTART
                                               : EV_DEADLINE);
}

void bb_state_load(void)
{
    char path[512], err[256];
    char *text = NULL;
    size_t len;
    snprintf(path, sizeof(path), "%s/state.json", bb.cfg.state_dir);
    int rc = sd_read_file(path, STATE_MAX_BYTES, &text, &len);
    if (rc == -ENOENT)
        return;
    if (rc) {
        log_error("state not loaded", "path=%s error=%s", path, strerror(-rc));
        return;
    }
    json_t *root = sd_json_parse(text, len, SD_JSON_MAX_DEPTH, err, sizeof(err));
    free(text);
    json_t *arr = json_object_get(root, "instances");
    if (!json_is_array(arr)) {
        log_error("state not loaded", "path=%s error=%s", path, root ? "no instances" : err);
        json_decref(root);
        return;
    }
    json_int_t counter = json_integer_value(json_object_get(root, "counter"));
    if (counter > 0)
        bb.counter = (uint64_t)counter;
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
        if (json_is_object(e))
            load_one(e);
    json_decref(root);
    bb.state_dirty = 1;
}
