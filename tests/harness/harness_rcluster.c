#include "harness_rcluster.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

redisReply *h_rc_node(h_rcluster_t *rc, int i, const char *fmt, ...)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", rc->port[i], tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, (struct timeval){5, 0});
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

static int node_up(h_rcluster_t *rc, int i)
{
    redisReply *r = h_rc_node(rc, i, "PING");
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    return ok;
}

int h_rc_primary_of(h_rcluster_t *rc, int slot)
{
    for (int i = 0; i < rc->n; i++) {
        if (!rc->pid[i])
            continue;
        redisReply *r = h_rc_node(rc, i, "CLUSTER SLOTS");
        int found = -1;
        for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
            redisReply *e = r->element[k];
            if (e->element[0]->integer <= slot && slot <= e->element[1]->integer) {
                int port = (int)e->element[2]->element[1]->integer;
                for (int j = 0; j < rc->n; j++)
                    if (rc->port[j] == port)
                        found = j;
            }
        }
        if (r)
            freeReplyObject(r);
        if (found >= 0)
            return found;
    }
    return -1;
}

int h_rc_wait_ok(h_rcluster_t *rc, int timeout_ms)
{
    int64_t until = h_now_ms() + timeout_ms;
    while (h_now_ms() < until) {
        int ok = 1;
        for (int i = 0; i < rc->n && ok; i++) {
            if (!rc->pid[i])
                continue;
            redisReply *r = h_rc_node(rc, i, "CLUSTER INFO");
            ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
            if (r)
                freeReplyObject(r);
        }
        if (ok)
            return 0;
        h_sleep_ms(50);
    }
    return -1;
}

static pid_t spawn_node(h_rcluster_t *rc, int i)
{
    char dir[300], port[16], bus[16], log[340];
    snprintf(port, sizeof port, "%d", rc->port[i]);
    snprintf(bus, sizeof bus, "%d", rc->bus[i]);
    snprintf(dir, sizeof dir, "%s/node%d", rc->dir, i);
    snprintf(log, sizeof log, "%s/redis.log", dir);
    const char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                          "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-port", bus,
                          "--cluster-node-timeout", "1500", "--save", "",
                          "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                          "--dir", dir, "--daemonize", "no",
                          "--enable-debug-command", "local", NULL};
    return h_spawn(argv, log, NULL);
}

int h_rc_restart(h_rcluster_t *rc, int i)
{
    if (i < 0 || i >= rc->n || rc->pid[i])
        return -1;
    rc->pid[i] = spawn_node(rc, i);
    int64_t until = h_now_ms() + 5000;
    while (!node_up(rc, i) && h_now_ms() < until)
        h_sleep_ms(20);
    return node_up(rc, i) ? 0 : -1;
}

int h_rcluster_start(h_rcluster_t *rc, int primaries, int replicas)
{
    memset(rc, 0, sizeof *rc);
    int total = primaries * (1 + replicas);
    if (total > H_RC_MAX)
        return -1;
    snprintf(rc->dir, sizeof rc->dir, "%s", h_tmpdir());
    int n = snprintf(rc->url, sizeof rc->url, "cluster://");
    for (int i = 0; i < total; i++) {
        rc->port[i] = h_free_port();
        do /* the bus port is set, not port + 10000 (which may be another test's port) */
            rc->bus[i] = h_free_port();
        while (rc->bus[i] == rc->port[i]);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "mkdir -p %s/node%d", rc->dir, i);
        if (system(cmd) != 0)
            return -1;
        rc->pid[i] = spawn_node(rc, i);
        rc->n = i + 1;
        n += snprintf(rc->url + n, sizeof rc->url - (size_t)n, "%s127.0.0.1:%d", i ? "," : "",
                      rc->port[i]);
    }
    for (int i = 0; i < total; i++) {
        int64_t until = h_now_ms() + 5000;
        while (!node_up(rc, i) && h_now_ms() < until)
            h_sleep_ms(20);
        if (!node_up(rc, i)) {
            fprintf(stderr, "harness: cluster node %d did not start\n", i);
            return -1;
        }
    }
    char create[2048], log[300];
    int m = snprintf(create, sizeof create, "redis-cli --cluster create");
    for (int i = 0; i < total; i++)
        m += snprintf(create + m, sizeof create - (size_t)m, " 127.0.0.1:%d", rc->port[i]);
    snprintf(log, sizeof log, "%s/create.log", rc->dir);
    snprintf(create + m, sizeof create - (size_t)m,
             " --cluster-replicas %d --cluster-yes > %s 2>&1", replicas, log);
    if (system(create) != 0) {
        fprintf(stderr, "harness: redis-cli --cluster create failed (see %s)\n", log);
        return -1;
    }
    if (h_rc_wait_ok(rc, 20000)) {
        fprintf(stderr, "harness: the cluster did not reach cluster_state:ok\n");
        return -1;
    }
    /* every replica through its first sync: a replica that never synced cannot be
     * promoted */
    int64_t until = h_now_ms() + 20000;
    for (int i = 0; i < total; i++) {
        for (;;) {
            redisReply *r = h_rc_node(rc, i, "INFO replication");
            int ok = r && r->type == REDIS_REPLY_STRING &&
                     (strstr(r->str, "role:master") || strstr(r->str, "master_link_status:up"));
            if (r)
                freeReplyObject(r);
            if (ok)
                break;
            if (h_now_ms() > until) {
                fprintf(stderr, "harness: cluster replica %d did not sync\n", i);
                return -1;
            }
            h_sleep_ms(50);
        }
    }
    return 0;
}

void h_rcluster_stop(h_rcluster_t *rc)
{
    for (int i = 0; i < rc->n; i++)
        if (rc->pid[i]) {
            h_stop(rc->pid[i], 2000);
            rc->pid[i] = 0;
        }
}
