/* bigbrother's base, under every subsystem: the config (config.c), the one event loop
 * with its watches and timer heap (loop.c), and the unix sockets the daemon listens on
 * (sock.c). Everything here runs on the ONE supervision thread. */
#ifndef BB_H
#define BB_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "sdproto.h"
#include "sdutil.h"
#include "sdversion.h"

#define BB_SOCK_PATH_MAX 108   /* sizeof(sun_path) */
#define BB_PROBE_BYTES_MAX 512 /* udp query / expect, http request */
#define BB_HTTP_PATH_MAX 400   /* http probe path: the request still fits the query buffer */
#define BB_MAX_RLIMITS 8
#define BB_WINDOW_MAX 64       /* max_restarts cap: restart times kept per instance */

#define container_of(p, type, member) ((type *)(void *)((char *)(p) - offsetof(type, member)))

/* ---------------------------------------------------------------- config (config.c) */

enum bb_health { BB_H_AGENT, BB_H_NOTIFY, BB_H_TCP, BB_H_UDP, BB_H_EXEC, BB_H_NONE, BB_H_HTTP };
enum bb_policy { BB_P_ALWAYS, BB_P_ON_FAILURE, BB_P_NEVER };

typedef struct {
    int resource;
    struct rlimit lim;
} bb_rlimit_t;

typedef struct {
    const char *name;
    const char *command;
    char **argv;  /* argv[0] is command; NULL-terminated; strings borrowed from the JSON */
    char **env;   /* "KEY=VALUE" strings (owned), NULL-terminated */
    int count;
    const char *user; /* NULL: run as bigbrother's user */
    uid_t uid;
    gid_t gid;
    const char *cwd;
    bb_rlimit_t rlimits[BB_MAX_RLIMITS];
    int nrlimits;
    struct {
        enum bb_health type;
        int start_timeout_ms, liveness_timeout_ms; /* agent, notify */
        int period_ms, failure_threshold, timeout_ms; /* tcp, udp, http, exec */
        int port;
        /* udp: the query datagram; http: the whole GET request, built from "path" */
        unsigned char query[BB_PROBE_BYTES_MAX], expect[BB_PROBE_BYTES_MAX];
        size_t query_len, expect_len;
        const char *command; /* exec: run with /bin/sh -c */
    } health;
    struct {
        enum bb_policy policy;
        int backoff_min_ms, backoff_max_ms, max_restarts, window_s, healthy_reset_ms;
    } restart;
    struct {
        int signal, grace_ms, hang_signal;
    } stop;
    /* on_release "restart": the instance is restarted when its session ends (a release
     * by the game, or an allocation ended from outside); 0: "recycle", kept as it is.
     * The spec's pool and confirm_timeout_ms are ServerDir's and the primary's. */
    int restart_on_release;
    int metrics_slot; /* metrics.c's row for this service name, plus one (0: not yet) */
} bb_service_t;

typedef struct {
    json_t *root;  /* the parsed file; the strings below point into it */
    const char *path;
    const char *machine, *cluster, *state_dir;
    char *urls;    /* comma-separated ServerDir URLs (owned) or NULL: standalone */
    const char *token, *address;
    int credentials;              /* serverdir.credentials: obtain instance credentials
                                     (default on with a ServerDir URL) */
    int credential_renew_percent; /* renew when this share of a credential's life is left */
    json_t *labels;
    int capacity, lease_ttl_ms;
    int cluster_mode;          /* "mode": "cluster": services also come from ServerDir */
    int primary_ttl_ms;        /* primary lease TTL (cluster mode) */
    int placement_interval_ms; /* how often the primary re-reads the state and places */
    int assignment_wait_ms;    /* long-poll wait of the assignments request */
    char agent_socket[BB_SOCK_PATH_MAX], notify_socket[BB_SOCK_PATH_MAX],
        control_socket[BB_SOCK_PATH_MAX];
    int64_t log_max_bytes;
    int log_keep;              /* rotations kept of an instance log (.1 ... .N) */
    int log_runs;              /* instance logs kept per slot (the newest) */
    char metrics_host[64];  /* metrics_listen: "" when /metrics is not served */
    int metrics_port;
    char logs_host[64];     /* logs_listen: "" when logs are not served (logsrv.c) */
    int logs_port;
    bb_service_t *services;
    int nservices;
} bb_config_t;

/* Loads and validates the config file. On error returns -1 with a message naming the
 * file, the field (services[0].restart.policy) and why. cfg is freed by bb_config_free. */
int bb_config_load(const char *path, bb_config_t *cfg, char *err, size_t errcap);
/* The same from a JSON text (unit tests); `name` stands for the file in messages. */
int bb_config_parse(const char *text, const char *name, bb_config_t *cfg, char *err,
                    size_t errcap);
void bb_config_free(bb_config_t *cfg);
/* "TERM", "SIGTERM" or "15" -> 15; -1 if unknown. */
int bb_signal_parse(const char *s);
/* Decodes C-style escapes (\xHH \n \r \t \0 \\) of s into out; returns the length or -1. */
int bb_unescape(const char *s, unsigned char *out, size_t cap);

/* ---------------------------------------------------------------- event loop (loop.c) */

/* An fd in the epoll set; fn runs on readiness with the epoll event mask. */
typedef struct bb_watch {
    int fd;
    void (*fn)(struct bb_watch *w, uint32_t events);
} bb_watch_t;

/* A deadline in the single timer heap; fn runs once when it passes. */
typedef struct bb_timer {
    int64_t at;   /* CLOCK_MONOTONIC ms */
    int idx;      /* heap position + 1, 0 when not armed */
    void (*fn)(struct bb_timer *t);
} bb_timer_t;

int bb_watch_add(bb_watch_t *w, uint32_t events);
int bb_watch_mod(bb_watch_t *w, uint32_t events);
/* Removes w from epoll and closes its fd (fd becomes -1). */
void bb_watch_close(bb_watch_t *w);
/* Frees p after the current batch of epoll events (a handler may close a watch whose
 * event is still pending in the batch). */
void bb_defer_free(void *p);
/* Frees what bb_defer_free collected (the loop does it after each batch). */
void bb_loop_free_deferred(void);
void bb_timer_set(bb_timer_t *t, int64_t at_ms);
void bb_timer_cancel(bb_timer_t *t);

/* Sets up epoll, the signalfd and the timerfd. Returns 0 or -errno. */
int bb_loop_init(void);
/* Registers fn to run before each sleep in epoll_wait (after the fd handlers and timers
 * of the previous turn), after the hooks registered before it. Returns 0, or -ENOSPC
 * when the loop's few hook slots are taken. */
int bb_loop_before_sleep(void (*fn)(void));
/* Runs until a stop signal; returns the signal that ended it (SIGTERM, SIGINT, SIGHUP). */
int bb_loop_run(void);
/* Asks the loop to return after the current iteration with `sig` (bbctl, tests). */
void bb_loop_quit(int sig);

/* ---------------------------------------------------------------- unix sockets (sock.c) */

/* Binds a non-blocking unix socket of `type` at path (replacing a stale file) with the
 * given mode; listens unless SOCK_DGRAM. Returns the fd or -errno. */
int bb__unix_listen(const char *path, int type, int mode);
/* bb__unix_listen, then watches the socket with w, calling fn when a client connects.
 * Returns 0 or a negative errno. */
int bb__unix_listen_watch(bb_watch_t *w, const char *path, int type, int mode,
                          void (*fn)(bb_watch_t *w, uint32_t events));

#endif
