/* Harness addition for the tests that run against "a redis-server and a serverdir on
 * it": start both with the options a test file needs, and the cmocka setup/teardown
 * pair that starts them before a group (or a test) and stops them after. */
#ifndef SD_HARNESS_STACK_H
#define SD_HARNESS_STACK_H

#include "harness.h"

/* What differs between the serverdirs the tests start. A zeroed struct (or NULL) is the
 * common case: the test token file (h_tokens_file), no config file, no extra flags. */
typedef struct {
    int open;                 /* 1: no token file at all (open mode) */
    const char *config;       /* config JSON text, written to a file passed as --config */
    const char *const *extra; /* more flags, NULL-terminated, or NULL */
    int master_udp;           /* 1: --master-udp on 127.0.0.1:<free port> (s->udp_port) */
    int master_udp6;          /* 1: and another on [::1]:<free port> (s->udp6_port) */
} h_sd_opts_t;

/* Starts serverdir s against r with the options o (NULL: defaults) and waits for
 * /healthz. Returns 0, or -1 when it does not start. */
int h_sd_start(h_serverdir_t *s, const h_redis_t *r, const h_sd_opts_t *o);

/* Starts redis-server r, then serverdir s on it (h_sd_start with o). Returns 0, or -1
 * when either does not start. */
int h_stack_start(h_redis_t *r, h_serverdir_t *s, const h_sd_opts_t *o);

/* Stops serverdir s, then redis-server r. */
void h_stack_stop(h_redis_t *r, h_serverdir_t *s);

/* A cmocka setup body: h_stack_start, remembering the pair for h_stack_teardown (one
 * setup at a time). Returns what a cmocka setup returns (0, or -1 when either did not
 * start). */
int h_stack_setup(void **state, h_redis_t *r, h_serverdir_t *s, const h_sd_opts_t *o);

/* cmocka teardown of h_stack_setup: stops the pair it started. */
int h_stack_teardown(void **state);

#endif
