/* What survives a bigbrother restart: the process table in state_dir/state.json, written
 * atomically (temp file + rename) before the loop sleeps whenever it changed, the lock
 * file that keeps a second bigbrother off the same state dir, and bigbrother.id, the
 * identity every spawned process carries in its environment (procscan.c).
 *
 * On start, an instance of the table whose pid is alive with the same start time (field
 * 22 of /proc/<pid>/stat, so a recycled pid is never mistaken for it) is re-adopted with
 * a pidfd, keeps its instance id and state, and is given its start or liveness deadline
 * afresh; its agent reconnects by itself. It is never killed or restarted for the
 * restart of bigbrother. An instance whose process died meanwhile is reported stopped
 * (exit status unknown) and restarted by its policy.
 *
 * The table is cross-checked against a scan of /proc for processes carrying this
 * bigbrother's identity, so a missing, stale or damaged state.json never leaves a
 * process unsupervised nor starts a second one for its slot: a found process whose slot
 * has none running (the table names none, or one that is gone) is re-adopted with its
 * instance id and generation, as ready; one whose slot the config no longer has, or whose
 * slot another process holds, is stopped with reason `orphaned` (orphan.c). A damaged
 * state.json (unreadable JSON, no instances array, too large) is renamed aside to
 * state.json.damaged-<UTC time>, logged once at warn.
 *
 * A cluster slot (cluster mode) is saved with its spec, restart token and whether it was
 * assigned, and restored from them (converge.c) before the first assignment arrives;
 * that assignment then decides whether it keeps running. */
#include "bb_daemon.h"
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
#include <time.h>
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

/* Sets bb.ident from state_dir/bigbrother.id, creating the file (32 random hex
 * characters, mode 0600) when it is missing or damaged. The identity outlives any
 * damage to state.json: the running instances carry it (procscan.c). */
static void ident_load(void)
{
    char path[512], tmp[520], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/bigbrother.id", bb.cfg.state_dir);
    int rc = sd_read_file(path, 64, &text, &len);
    if (rc == 0 && len >= 32 && strspn(text, "0123456789abcdef") == 32 &&
        strspn(text + 32, "\n") == len - 32) {
        memcpy(bb.ident, text, 32);
        bb.ident[32] = 0;
        free(text);
        return;
    }
    free(text);
    if (rc != -ENOENT)
        log_warn("identity file damaged: a new identity is made; processes started under"
                 " the old one are not found by it", "path=%s", path);
    if (sd_random_hex(bb.ident, 16))
        sd_die(SD_EXIT_SYSTEM, "no randomness", "error=%s", strerror(errno));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0 && dprintf(fd, "%s\n", bb.ident) == 33 && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok || rename(tmp, path))
        sd_die(SD_EXIT_SYSTEM, "cannot write the identity file", "path=%s error=%s", path,
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
    ident_load();
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
                     in->restarts, "fail_streak", in->fail_streak, "reason", bb_inst_reason(in),
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

/* The found process of (service, slot) not yet given to a slot, newest first; NULL if none. */
static bb_found_t *found_for(bb_found_t *found, int nfound, const char *service, int slot)
{
    for (int i = 0; i < nfound; i++)
        if (!found[i].claimed && found[i].slot == slot && !strcmp(found[i].service, service))
            return &found[i];
    return NULL;
}

/* Marks the found process pid, if any, as taken care of. */
static void claim_pid(bb_found_t *found, int nfound, pid_t pid)
{
    for (int i = 0; i < nfound; i++)
        if (found[i].pid == pid)
            found[i].claimed = 1;
}

/* The uid the processes of svc run as. */
static uid_t service_uid(const bb_service_t *svc)
{
    return svc->user ? svc->uid : geteuid();
}

/* Supervises the found process f as the slot `in` (still stopped, holding what the state
 * file knew of the slot, if anything): its instance id, generation and pid, through
 * EV_ADOPT as a ready process (whether it had proven ready before is not known; agents
 * say READY again when they reconnect). If it died meanwhile, that is an exit of unknown
 * status. */
static void adopt_found(bb_inst_t *in, bb_found_t *f)
{
    int64_t now_boot_ms = f->start_ms;
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) == 0)
        now_boot_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    f->claimed = 1;
    sd_strlcpy(in->id, f->id, sizeof(in->id));
    in->generation = f->generation;
    in->pid = f->pid;
    in->start_ticks = f->start_ticks;
    in->spawned_wall = sd_wall_ms() - (now_boot_ms - f->start_ms);
    in->loaded = 1;
    log_info("instance found running by its environment", "instance=%s service=%s slot=%d pid=%d",
             f->id, f->service, f->slot, (int)f->pid);
    bb_inst_adopt(in, ST_READY, bb_adopt_pid(in, f->ppid) == 0);
}

/* A running process of the table whose slot is not restored (the config no longer has
 * it, or a cluster slot's saved spec is refused): stopped as an orphan. */
static void stop_unconfigured(json_t *e, const char *service, int slot, const char *id,
                              pid_t pid, int64_t ticks, bb_found_t *found, int nfound,
                              const char *detail)
{
    bb_found_t f = {.pid = pid, .start_ticks = ticks, .slot = slot};
    if (pid <= 0 || bb_proc_stat(pid, &f.start_ticks, &f.ppid) || f.start_ticks != ticks)
        return;
    claim_pid(found, nfound, pid);
    f.generation = (int)json_integer_value(json_object_get(e, "generation"));
    sd_strlcpy(f.id, id, sizeof(f.id));
    sd_strlcpy(f.service, service, sizeof(f.service));
    bb_orphan_stop(&f, NULL, detail);
}

/* Restores one entry of the state file; a live process of the scan for the same slot
 * takes the place of one the entry names but that is gone (or of none). */
static void load_one(json_t *e, bb_found_t *found, int nfound)
{
    const char *service = json_string_value(json_object_get(e, "service"));
    const char *id = json_string_value(json_object_get(e, "id"));
    const char *st = json_string_value(json_object_get(e, "state"));
    pid_t pid = (pid_t)json_integer_value(json_object_get(e, "pid"));
    int64_t ticks = json_integer_value(json_object_get(e, "start_ticks"));
    int state = st ? parse_state(st) : -1;
    if (!service || !id || state < 0 || !sd_name_valid(service, SD_NAME_MAX) ||
        !sd_name_valid(id, SD_NAME_MAX))
        return;
    int slot = (int)json_integer_value(json_object_get(e, "slot"));
    json_t *cl = json_object_get(e, "cluster");
    bb_inst_t *in = NULL;
    if (json_is_object(cl) && slot >= 0)
        in = bb_converge_restore(service, slot, json_object_get(cl, "spec"),
                                 json_integer_value(json_object_get(cl, "restart_token")),
                                 json_is_true(json_object_get(cl, "assigned")));
    else if (!cl)
        in = find_slot(service, slot);
    if (!in) {
        stop_unconfigured(e, service, slot, id, pid, ticks, found, nfound,
                          cl ? "cluster slot not restored" : "slot no longer in the config");
        return;
    }
    if (in->loaded || in->pid > 0)
        return; /* a second entry for the slot: the first one counts */
    sd_strlcpy(in->id, id, sizeof(in->id));
    in->generation = (int)json_integer_value(json_object_get(e, "generation"));
    in->restarts = (int)json_integer_value(json_object_get(e, "restarts"));
    in->fail_streak = (int)json_integer_value(json_object_get(e, "fail_streak"));
    in->code = (int)json_integer_value(json_object_get(e, "code"));
    in->sig = (int)json_integer_value(json_object_get(e, "signal"));
    in->spawned_wall = json_integer_value(json_object_get(e, "started_wall_ms"));
    int reason = sd_stop_reason_parse(json_string_value(json_object_get(e, "reason")));
    in->reason = reason < 0 ? BB_NO_REASON : (sd_stop_reason_t)reason;
    sd_strlcpy(in->detail, json_string_value(json_object_get(e, "detail")) ?: "",
               sizeof(in->detail));
    int running = state == ST_STARTING || state == ST_READY || state == ST_STOPPING;
    int64_t now_ticks = -1;
    pid_t ppid = 0;
    int alive = running && pid > 0 && bb_proc_stat(pid, &now_ticks, &ppid) == 0 &&
                now_ticks == ticks;
    bb_found_t *f = found_for(found, nfound, service, slot);
    if (!alive && f && f->uid == service_uid(in->svc)) {
        adopt_found(in, f); /* the table is older than what runs */
        return;
    }
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
    claim_pid(found, nfound, pid);
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
                          : why == WHY_RESTART || why == WHY_LOST ? EV_RESTART
                                               : EV_DEADLINE);
}

/* Moves a damaged state file aside to path.damaged-<UTC time> and says so once. */
static void keep_aside(const char *path, const char *why)
{
    char aside[600], stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", gmtime_r(&now, &tm));
    snprintf(aside, sizeof(aside), "%s.damaged-%s", path, stamp);
    if (rename(path, aside)) {
        log_warn("state file damaged: not loaded, cannot keep it aside", "path=%s error=%s"
                 " rename_error=%s", path, why, strerror(errno));
        return;
    }
    log_warn("state file damaged: not loaded, kept aside; running instances are found by"
             " their environment", "path=%s error=%s kept_as=%s", path, why, aside);
}

json_t *bb__state_read(const char *state_dir)
{
    char path[512], err[256];
    char *text = NULL;
    size_t len;
    snprintf(path, sizeof(path), "%s/state.json", state_dir);
    int rc = sd_read_file(path, STATE_MAX_BYTES, &text, &len);
    if (rc == -ENOENT)
        return NULL;
    if (rc == -E2BIG) {
        keep_aside(path, "larger than 64 MiB");
        return NULL;
    }
    if (rc) {
        log_error("state not loaded", "path=%s error=%s", path, strerror(-rc));
        return NULL;
    }
    json_t *root = sd_json_parse(text, len, SD_JSON_MAX_DEPTH, err, sizeof(err));
    free(text);
    if (!json_is_array(json_object_get(root, "instances"))) {
        keep_aside(path, root ? "no instances array" : err);
        json_decref(root);
        return NULL;
    }
    return root;
}

void bb_state_load(void)
{
    bb_found_t *found = NULL;
    int nfound = bb__proc_scan("/proc", bb.ident, &found);
    if (nfound < 0) {
        log_error("cannot scan /proc for running instances", "error=%s", strerror(-nfound));
        nfound = 0;
    }
    json_t *root = bb__state_read(bb.cfg.state_dir);
    json_int_t counter = json_integer_value(json_object_get(root, "counter"));
    if (counter > 0)
        bb.counter = (uint64_t)counter;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(root, "instances"), i, e)
        if (json_is_object(e))
            load_one(e, found, nfound);
    json_decref(root);
    /* what runs and the table did not list: its slot, or stopped */
    for (int k = 0; k < nfound; k++) {
        bb_found_t *f = &found[k];
        if (f->claimed)
            continue;
        bb_inst_t *in = find_slot(f->service, f->slot);
        if (in && f->uid != service_uid(in->svc)) {
            log_warn("process claims a slot but runs as another user: left alone",
                     "instance=%s pid=%d uid=%d", f->id, (int)f->pid, (int)f->uid);
            continue;
        }
        if (in && in->pid <= 0 && in->state == ST_STOPPED && !in->loaded)
            adopt_found(in, f);
        else if (in)
            bb_orphan_stop(f, in->svc, "another process holds the slot");
        else
            bb_orphan_stop(f, NULL, bb.cfg.cluster_mode ? "slot in neither the config nor the"
                                                          " saved state"
                                                        : "slot no longer in the config");
    }
    free(found);
    bb.state_dirty = 1;
}
