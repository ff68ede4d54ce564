/* Harness additions for the tests that run bigbrother (it_bigbrother, it_bbctl,
 * it_outbox, ...): start a real bigbrother on a generated config in a temp state dir,
 * talk to its control socket, wait for an instance to reach a state, read the events it
 * put in its outbox. */
#ifndef SD_HARNESS_BIGBROTHER_H
#define SD_HARNESS_BIGBROTHER_H

#include <jansson.h>
#include <sys/types.h>

#include "harness.h"

typedef struct {
    pid_t pid;
    char dir[256];     /* temp dir: config, logs of the test */
    char state[300];   /* state_dir */
    char cfg[300];
    char log[300];
    char sock[320];    /* control socket */
    char agent[320];
    int runs;
} bbt_t;

/* Gives b a fresh directory (h_tmpdir) and, below it, its state dir and its control
 * and agent socket paths. */
void bbt_dirs(bbt_t *b);

/* Writes the config: machine m1, cluster c1, the given services JSON array, plus extra
 * top-level members (a JSON fragment starting with ',' or ""). */
void bbt_config(bbt_t *b, const char *services, const char *extra);

/* One control-socket request; the parsed answer (caller decrefs) or NULL (not running /
 * bad answer). */
json_t *bbt_ctl(const bbt_t *b, const char *req);

/* Starts bigbrother on b->cfg (log: dir/bb-N.log) and waits for its control socket.
 * Returns its pid, or -1 when it did not answer in time. */
pid_t bbt_start(bbt_t *b);

/* The status entry of service slot, as a new reference (NULL if not found / no answer). */
json_t *bbt_inst(const bbt_t *b, const char *service, int slot);

/* String member key of in ("" when absent); integer member key of in (0 when absent). */
const char *bbt_str(json_t *in, const char *key);
long long bbt_int(json_t *in, const char *key);

/* Polls until service slot is in `state` and (when min_generation > 0) has at least that
 * generation; returns the status entry (new reference) or NULL after timeout_ms. */
json_t *bbt_wait(const bbt_t *b, const char *service, int slot, const char *state,
                 int min_generation, int timeout_ms);

/* Stops every process b supervises (bbctl stop all), then b itself: SIGTERM, SIGKILL
 * after grace_ms. */
void bbt_stop(const bbt_t *b, int grace_ms);

/* 1 if pid runs (exists and is not a zombie). */
int bbt_alive(pid_t pid);

/* 1 if the file contains needle. */
int bbt_file_has(const char *path, const char *needle);

/* The lines of the file at path that contain needle (0 when it cannot be read). */
int bbt_lines_with(const char *path, const char *needle);

/* Polls until the file at path contains needle: 1 when it does, 0 after timeout_ms. */
int bbt_wait_file_has(const char *path, const char *needle, int timeout_ms);

/* Runs a program to completion (<= 20 s), output to logpath; returns its exit code. */
int bbt_run(const char *const *argv, const char *logpath);

/* Every event bigbrother put in its outbox (the .seg files of state_dir/outbox/, the
 * record format of bigbrother/report/bb_report.h: "<len hex> <crc hex> <json>\n"), in order, as a
 * new JSON array. */
json_t *bbt_events(const bbt_t *b);

/* The events of one instance id, in order (new reference). */
json_t *bbt_events_of(const bbt_t *b, const char *instance);

#endif
