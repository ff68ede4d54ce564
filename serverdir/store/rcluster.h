/* Redis Cluster routing for the store (rcluster.c): the slot map read from the nodes
 * (CLUSTER SLOTS), one connection per node per calling thread, and commands routed by
 * their key's slot, following MOVED (the map is refreshed) and ASK (ASKING, once).
 * hiredis has no cluster support in Debian 12; this is the focused layer the store
 * needs, not a general client. */
#ifndef SD_RCLUSTER_H
#define SD_RCLUSTER_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#define SD_RC_SLOTS 16384
#define SD_RC_NODES_MAX 64

/* The hash slot of a key (CRC16 of the key, or of its {hash tag}, mod 16384). */
unsigned sd__rc_slot(const char *key, size_t len);

/* seeds: "h1:p1,h2:p2,..." (IPv6 as [addr]:port); password may be "". Reads no node yet:
 * the map is loaded by the first command. 0 or -EINVAL. */
int sd__rc_init(const char *seeds, const char *password);
void sd__rc_fini(void);

/* Why the last sd__rc_command of this thread returned NULL. */
enum sd_rc_fail {
    SD_RC_OK,
    SD_RC_NO_NODE,  /* no node reachable, or the slot has no primary (CLUSTERDOWN, a
                       failover under way): the caller answers 503 + Retry-After */
    SD_RC_IO,       /* the command may have run (timeout): not retried */
};

/* Sends argv to the primary serving slot (slot < 0: the node this thread used last, so
 * SCRIPT LOAD reaches the node of the command before it), and returns its
 * reply (the caller frees it). A connection the peer closed is reopened and the command
 * sent again; MOVED and ASK are followed (at most 5 redirections); TRYAGAIN is retried
 * for up to 200 ms. NULL with *why set when no answer can be had. */
redisReply *sd__rc_command(int slot, int argc, const char **argv, const size_t *argl,
                           enum sd_rc_fail *why);

/* WAIT must count the replicas of the node that made the write it confirms, over the
 * connection that made it: sd__rc_mark_write marks this thread's last command (a script
 * that wrote) as that write, and sd__rc_command_on_write sends argv on its connection.
 * It never follows a redirection, reconnects or picks another node: when that
 * connection is gone (the node died, maybe before its replicas had the write), NULL with
 * *why set, and the caller answers 503 (the client's retry is idempotent). */
void sd__rc_mark_write(void);
redisReply *sd__rc_command_on_write(int argc, const char **argv, const size_t *argl,
                                    enum sd_rc_fail *why);

/* A new connection of the caller's own to the primary of slot (slot < 0: the first
 * primary that answers), AUTH done; when the map's node does not answer, the map is
 * reloaded and the new one tried (a failover). NULL when none is reachable. */
redisContext *sd__rc_connect(int slot);

/* The primaries known now: how many, and for SCAN-like walks that visit each node,
 * a command sent to the i-th (in address order). */
int sd__rc_primaries(void);
redisReply *sd__rc_command_primary(int i, int argc, const char **argv, const size_t *argl,
                                   enum sd_rc_fail *why);

/* Closes this thread's connections (a worker about to exit). */
void sd__rc_thread_close(void);

/* Called (when set) once per event worth a metric: "refresh" (a slot map loaded),
 * "moved", "ask", "tryagain". The store sets it to count them in /metrics. */
extern void (*sd__rc_event)(const char *what);

/* Counters for the metrics and the tests: map refreshes, MOVED and ASK followed. */
typedef struct {
    uint64_t refreshes, moved, asked, tryagain;
} sd_rc_stats_t;
void sd__rc_stats(sd_rc_stats_t *out);

#endif
