/* Harness additions for the cluster-mode tests (it_cluster_*.c, it_chaos): one
 * redis-server, one serverdir and N bigbrothers in cluster mode (machines m1..mN, each
 * with its own state dir, sockets and log) on this host; the ServerDir API as the
 * operator uses it; what the directory and the bigbrothers show. */
#ifndef SD_HARNESS_CLUSTER_H
#define SD_HARNESS_CLUSTER_H

#include <jansson.h>

#include "harness.h"
#include "harness_bigbrother.h"

#define CL_MAX 6
#define CL_BASE "/v1/clusters/c1"

typedef struct {
    h_redis_t redis;
    h_serverdir_t sd;
    int n;
    bbt_t bb[CL_MAX];
    char name[CL_MAX][16];
} cl_t;

/* Target for cl_converged: the service has `want` ready in the directory and exactly that
 * many live processes across the bigbrothers not in `skip` (bit i: bigbrother i is
 * killed or paused). */
typedef struct {
    const char *service;
    int want;
    unsigned skip;
} cl_conv_t;

/* ms, multiplied on slow machines (valgrind). */
int cl_ms(int ms);

/* The bigbrothers' placement_interval_ms and primary_ttl_ms for the next cl_start (0:
 * the defaults, 300 ms and cl_ms(3000)); a test that sets them resets them to 0. */
extern int cl_placement_interval_ms, cl_primary_ttl_ms;

/* Starts redis, serverdir and n bigbrothers (cluster mode, short leases); fails the
 * test when one does not start. */
void cl_start(cl_t *c, int n);

/* Stops every bigbrother (their processes first: bbctl stop all), serverdir, redis. */
void cl_stop(cl_t *c);

/* An operator request to the full URL path; the parsed answer (caller decrefs, NULL if
 * none); *status gets the HTTP status. */
json_t *cl_api(const char *method, const char *path, const char *body, long *status);

/* An operator request on CL_BASE + path; the HTTP status. */
long cl_op(const cl_t *c, const char *method, const char *path, const char *body);

/* GET CL_BASE + path as the operator; the parsed body of a 200 (caller decrefs), else
 * NULL. */
json_t *cl_get(const cl_t *c, const char *path);
/* Machine i's state in the directory ("live", "lost"; "" when it cannot be read), in a
 * static buffer. */
const char *cl_machine_state(const cl_t *c, int i);

/* PUT a test service: gameproc (args: a JSON array text, NULL for a plain one) with the
 * agent health check, count n; extra: more members (",\"placement\": ..." or NULL).
 * Returns the HTTP status. */
long cl_service(const cl_t *c, const char *name, int n, const char *args, const char *extra);

/* POST .../services/name/scale to count n; the HTTP status. */
long cl_scale(const cl_t *c, const char *name, int n);

/* Live directory records of service (state "ready" or "starting", or NULL for both) on
 * machine (NULL: any); -1 when the directory does not answer. */
int cl_dir_count(const cl_t *c, const char *service, const char *state, const char *machine);

/* Processes of service that bigbrother i runs and that really exist (pid alive). */
int cl_running(const cl_t *c, int i, const char *service);

/* The primary holder's name ("" when none; a static buffer); *epoch (when given) its
 * epoch. */
const char *cl_primary(const cl_t *c, long long *epoch);

/* Index of machine name, -1 if none. */
int cl_index(const cl_t *c, const char *name);

/* Polls every 100 ms until fn(c, arg) is true; bounded by timeout_ms. Returns 1 when it
 * became true. */
int cl_wait(cl_t *c, int (*fn)(cl_t *, void *), void *arg, int timeout_ms);

/* cl_wait condition: the target arg (a cl_conv_t) is reached. */
int cl_converged(cl_t *c, void *arg);

#endif
