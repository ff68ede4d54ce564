/* A real local Redis Cluster for the tests: N primaries with R replicas each, on free
 * loopback ports, created with redis-cli --cluster create. */
#ifndef H_RCLUSTER_H
#define H_RCLUSTER_H

#include <hiredis/hiredis.h>
#include <sys/types.h>

#define H_RC_MAX 12

typedef struct {
    int n;                  /* nodes started */
    pid_t pid[H_RC_MAX];
    int port[H_RC_MAX];
    int bus[H_RC_MAX];      /* cluster bus port of each node */
    char dir[256];
    char url[1024];         /* cluster://127.0.0.1:p1,127.0.0.1:p2,... */
} h_rcluster_t;

/* Starts primaries * (1 + replicas) nodes (cluster-node-timeout 1500 ms), creates the
 * cluster and waits until every node reports cluster_state:ok. 0 or -1. */
int h_rcluster_start(h_rcluster_t *rc, int primaries, int replicas);
void h_rcluster_stop(h_rcluster_t *rc);
/* Starts node i again (after it was stopped) on its ports with its nodes.conf: it rejoins
 * the cluster with its slots, its data gone (no persistence). 0 or -1. */
int h_rc_restart(h_rcluster_t *rc, int i);
/* A command on node i (a fresh connection each call); the caller frees the reply. */
redisReply *h_rc_node(h_rcluster_t *rc, int i, const char *fmt, ...);
/* The index of the node that is primary for slot now, -1 when none answers. */
int h_rc_primary_of(h_rcluster_t *rc, int slot);
/* Waits until every live node reports cluster_state:ok and agrees on the primary of
 * slot; 0 or -1 after timeout_ms. */
int h_rc_wait_ok(h_rcluster_t *rc, int timeout_ms);

#endif
