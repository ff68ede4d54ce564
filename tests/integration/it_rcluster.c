/* The Redis Cluster routing layer (serverdir/store/rcluster.c) against a real local
 * cluster of 3 primaries with a replica each: slots equal Redis's CLUSTER KEYSLOT (hash
 * tags included), commands reach the owning primary, MOVED after a slot changes owner,
 * ASK while a slot migrates, scripts loaded on each node after NOSCRIPT (through the
 * store), and a kill -9 of a primary: no answer (503) while the slot has no primary,
 * then the promoted replica serves it; a WAIT for a write on the killed primary fails
 * rather than asking another node. Last, on a standalone primary with a replica: a WAIT
 * whose write's connection was closed fails rather than run on a new connection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "harness_rcluster.h"
#include "rcluster.h"
#include "store.h"

static h_rcluster_t rc;

static int setup(void **state)
{
    (void)state;
    if (h_rcluster_start(&rc, 3, 1))
        return -1;
    return sd__rc_init(rc.url + strlen("cluster://"), "");
}

static int teardown(void **state)
{
    (void)state;
    sd__rc_thread_close();
    h_rcluster_stop(&rc);
    return 0;
}

static redisReply *cmd(enum sd_rc_fail *why, const char *a0, const char *a1, const char *a2)
{
    const char *argv[3] = {a0, a1, a2};
    size_t argl[3] = {strlen(a0), a1 ? strlen(a1) : 0, a2 ? strlen(a2) : 0};
    int argc = a2 ? 3 : a1 ? 2 : 1;
    int slot = a1 && strcmp(a0, "WAIT") ? (int)sd__rc_slot(a1, argl[1]) : -1; /* WAIT: no key */
    return sd__rc_command(slot, argc, argv, argl, why);
}

static void slots_match_redis(void **state)
{
    (void)state;
    static const char *const keys[] = {"foo", "bar", "sd:{c1}:machines", "{user1000}.following",
                                       "{user1000}.followers", "foo{}{bar}", "foo{{bar}}zap",
                                       "foo{bar}{zap}", "{}", "}{", "a{b", "", "123456789", NULL};
    for (const char *const *k = keys; *k; k++) {
        redisReply *r = h_rc_node(&rc, 0, "CLUSTER KEYSLOT %b", *k, strlen(*k));
        assert_non_null(r);
        assert_int_equal(sd__rc_slot(*k, strlen(*k)), r->integer);
        freeReplyObject(r);
    }
    for (int i = 0; i < 500; i++) {
        char k[32];
        snprintf(k, sizeof k, "key:%d", i * 7919);
        redisReply *r = h_rc_node(&rc, i % rc.n, "CLUSTER KEYSLOT %s", k);
        assert_int_equal(sd__rc_slot(k, strlen(k)), r->integer);
        freeReplyObject(r);
    }
    assert_int_equal(sd__rc_slot("123456789", 9), 0x31C3 & 16383); /* the spec's check value */
}

static void commands_reach_the_owner(void **state)
{
    (void)state;
    enum sd_rc_fail why;
    for (int i = 0; i < 300; i++) {
        char k[32], v[32];
        snprintf(k, sizeof k, "route:%d", i);
        snprintf(v, sizeof v, "v%d", i);
        redisReply *r = cmd(&why, "SET", k, v);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_STATUS);
        freeReplyObject(r);
    }
    assert_int_equal(sd__rc_primaries(), 3);
    int per_node[H_RC_MAX] = {0};
    for (int i = 0; i < 300; i++) {
        char k[32];
        snprintf(k, sizeof k, "route:%d", i);
        int owner = h_rc_primary_of(&rc, (int)sd__rc_slot(k, strlen(k)));
        assert_true(owner >= 0);
        redisReply *r = h_rc_node(&rc, owner, "GET %s", k); /* stored on the owner itself */
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_int_equal(atoi(r->str + 1), i);
        freeReplyObject(r);
        per_node[owner]++;
        r = cmd(&why, "GET", k, NULL);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
    int used = 0;
    for (int i = 0; i < rc.n; i++)
        used += per_node[i] > 0;
    assert_int_equal(used, 3);
}

/* The node id of node i. */
static void node_id(int i, char *out, size_t cap)
{
    redisReply *r = h_rc_node(&rc, i, "CLUSTER MYID");
    assert_non_null(r);
    snprintf(out, cap, "%s", r->str);
    freeReplyObject(r);
}

/* A primary other than p. */
static int other_primary(int p)
{
    for (int s = 0; s < 16384; s += 1000) {
        int o = h_rc_primary_of(&rc, s);
        if (o >= 0 && o != p)
            return o;
    }
    fail_msg("no other primary");
    return -1;
}

static void ask_while_migrating_then_moved(void **state)
{
    (void)state;
    const char *k1 = "{mig}:a", *k2 = "{mig}:b";
    int slot = (int)sd__rc_slot(k1, strlen(k1));
    enum sd_rc_fail why;
    redisReply *r = cmd(&why, "SET", k1, "one");
    freeReplyObject(r);
    r = cmd(&why, "SET", k2, "two");
    freeReplyObject(r);
    int src = h_rc_primary_of(&rc, slot), dst = other_primary(src);
    char src_id[64], dst_id[64];
    node_id(src, src_id, sizeof src_id);
    node_id(dst, dst_id, sizeof dst_id);
    sd_rc_stats_t before, after;
    sd__rc_stats(&before);

    /* the slot migrates: k1 moved to dst already, k2 still on src */
    freeReplyObject(h_rc_node(&rc, dst, "CLUSTER SETSLOT %d IMPORTING %s", slot, src_id));
    freeReplyObject(h_rc_node(&rc, src, "CLUSTER SETSLOT %d MIGRATING %s", slot, dst_id));
    r = h_rc_node(&rc, src, "MIGRATE 127.0.0.1 %d %s 0 5000", rc.port[dst], k1);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = cmd(&why, "GET", k1, NULL); /* src answers ASK: asked at dst with ASKING */
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_string_equal(r->str, "one");
    freeReplyObject(r);
    r = cmd(&why, "GET", k2, NULL); /* still on src */
    assert_string_equal(r->str, "two");
    freeReplyObject(r);
    sd__rc_stats(&after);
    assert_true(after.asked > before.asked);

    /* the migration ends: the slot belongs to dst everywhere; the map learns it by MOVED */
    r = h_rc_node(&rc, src, "MIGRATE 127.0.0.1 %d %s 0 5000", rc.port[dst], k2);
    freeReplyObject(r);
    for (int i = 0; i < rc.n; i++)
        freeReplyObject(h_rc_node(&rc, i, "CLUSTER SETSLOT %d NODE %s", slot, dst_id));
    sd__rc_stats(&before);
    r = cmd(&why, "GET", k2, NULL);
    assert_non_null(r);
    assert_string_equal(r->str, "two");
    freeReplyObject(r);
    sd__rc_stats(&after);
    assert_true(after.moved > before.moved);
    r = cmd(&why, "SET", k1, "uno"); /* now straight to dst */
    freeReplyObject(r);
    r = h_rc_node(&rc, dst, "GET %s", k1);
    assert_string_equal(r->str, "uno");
    freeReplyObject(r);
}

/* machine_put.lua through the store: machine m (address addr) in cluster c, a write on
 * the slot of c's key base; the reply in *r when r is given. A SD_STORE_* code. */
static int put_machine(const char *c, const char *m, const char *addr, redisReply **r)
{
    char base[96];
    sd_key(base, sizeof base, c, "%s", "");
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, base);
    sd_argv_add(&a, m);
    sd_argv_add(&a, "60000");
    sd_argv_add(&a, "15000");
    sd_argv_add(&a, "address");
    sd_argv_add(&a, addr);
    redisReply *x = NULL;
    int st = sd_store_run("machine_put", 1, &a, &x);
    if (r)
        *r = x;
    else if (x)
        freeReplyObject(x);
    return st;
}

/* Scripts through the store: EVALSHA on every node, each loading the script after its
 * own NOSCRIPT; the per-cluster key base keeps a script's keys in one slot. */
static void store_scripts_on_every_node(void **state)
{
    (void)state;
    assert_int_equal(sd_store_init(rc.url, "sd:"), 0);
    assert_true(sd_store_is_cluster());
    int nodes_hit[H_RC_MAX] = {0};
    for (int i = 0; i < 40; i++) {
        char cl[32], base[96];
        snprintf(cl, sizeof cl, "realm%d", i);
        sd_key(base, sizeof base, cl, "%s", "");
        redisReply *r = NULL;
        assert_int_equal(put_machine(cl, "m1", "10.0.0.1", &r), SD_STORE_OK);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        freeReplyObject(r);
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, base);
        sd_argv_add(&a, "");
        sd_argv_add(&a, "");
        sd_argv_add(&a, "10");
        assert_int_equal(sd_store_run("machine_list", 1, &a, &r), SD_STORE_OK);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        assert_int_equal(r->elements, 3); /* now, next, the one machine */
        freeReplyObject(r);
        nodes_hit[h_rc_primary_of(&rc, (int)sd__rc_slot(base, strlen(base)))]++;
    }
    int used = 0;
    for (int i = 0; i < rc.n; i++)
        used += nodes_hit[i] > 0;
    assert_int_equal(used, 3);
    sd_store_thread_close();
}

/* h_wait_every condition: SET arg v through the router succeeds. */
static int slot_settable(void *arg)
{
    enum sd_rc_fail why;
    redisReply *r = cmd(&why, "SET", (const char *)arg, "v");
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok) /* what the router said, for the log of a run where this takes long */
        fprintf(stderr, "SET %s: why=%d %s\n", (const char *)arg, (int)why,
                r && r->type == REDIS_REPLY_ERROR ? r->str : "");
    if (r)
        freeReplyObject(r);
    return ok;
}

static int slot_served(void *arg)
{
    enum sd_rc_fail why;
    redisReply *r = cmd(&why, "GET", (const char *)arg, NULL);
    int ok = r && r->type == REDIS_REPLY_STRING;
    if (r)
        freeReplyObject(r);
    return ok;
}

/* A write through the store (a script on the slot of cluster name c), then WAIT 1 for
 * it; SD_STORE_OK with the replicas that confirmed it in *got. */
static int store_write_wait(const char *c, long long *got)
{
    int st = put_machine(c, "m1", "10.0.0.1", NULL);
    return st ? st : sd_store_wait(1, 200, got);
}

static void failover_followed(void **state)
{
    (void)state;
    /* a key on a primary other than the router's first: the old store sent a WAIT whose
     * node had died to that first primary, which confirmed a write it never saw */
    const char *argv[2] = {"CLUSTER", "MYID"};
    size_t argl[2] = {7, 4};
    enum sd_rc_fail why;
    redisReply *first = sd__rc_command_primary(0, 2, argv, argl, &why);
    assert_non_null(first);
    char k[32], c[16], id[64];
    int victim = -1;
    for (int i = 0; i < 1000 && victim < 0; i++) {
        snprintf(c, sizeof c, "fo%d", i);
        snprintf(k, sizeof k, "{%s}:x", c);
        int p = h_rc_primary_of(&rc, (int)sd__rc_slot(k, strlen(k)));
        node_id(p, id, sizeof id);
        if (strcmp(id, first->str) != 0)
            victim = p;
    }
    freeReplyObject(first);
    assert_true(victim >= 0);
    /* WAIT goes to the node of the write before it; the replica may still be in its
     * first sync after the cluster was made */
    long long acked = 0;
    for (int i = 0; i < 50 && acked < 1; i++) {
        redisReply *r = cmd(&why, "SET", k, "kept");
        freeReplyObject(r);
        assert_int_equal(store_write_wait(c, &acked), SD_STORE_OK);
    }
    assert_int_equal(acked, 1);
    redisReply *r;
    kill(rc.pid[victim], SIGKILL);
    h_wait_exit(rc.pid[victim], 2000);
    rc.pid[victim] = 0;
    /* the write's node is gone: its WAIT fails (a 503), on no other node */
    acked = -2;
    assert_int_equal(sd_store_wait(1, 200, &acked), SD_STORE_DOWN);
    /* at once: no primary answers for the slot, the call fails fast (a 503) */
    int64_t t0 = h_now_ms();
    r = cmd(&why, "GET", k, NULL);
    assert_null(r);
    assert_int_equal(why, SD_RC_NO_NODE);
    assert_true(h_now_ms() - t0 < 2000);
    /* the replica is promoted (node timeout 1.5 s) and found through the slot map */
    if (!h_wait_every(slot_served, (void *)k, 20000, 100)) {
        for (int i = 0; i < rc.n; i++) {
            redisReply *x = rc.pid[i] ? h_rc_node(&rc, i, "CLUSTER NODES") : NULL;
            fprintf(stderr, "node %d (port %d): %s\n", i, rc.port[i], x ? x->str : "down");
            if (x)
                freeReplyObject(x);
        }
        fail_msg("the slot of %s was not served again within 20 s", k);
    }
    /* a write on the promoted replica: its WAIT runs there, which has no replica now */
    acked = -2;
    assert_int_equal(store_write_wait(c, &acked), SD_STORE_OK);
    assert_int_equal(acked, 0);
    r = cmd(&why, "GET", k, NULL);
    if (!r)
        fprintf(stderr, "GET after the failover: why=%d\n", (int)why);
    assert_non_null(r);
    assert_string_equal(r->str, "kept");
    freeReplyObject(r);
}

/* A new connection of the caller's own (the subscriber of assignment changes, the
 * blocking lock waits) after a failover that no command has seen yet: the map still
 * names the dead primary, so the connect reloads it and reaches the promoted replica
 * (the old code returned NULL until some command happened to reload the map). */
static int promoted(void *arg)
{
    int *v = arg;
    int p = h_rc_primary_of(&rc, v[0]);
    return p >= 0 && p != v[1] && rc.pid[p] != 0;
}

static void connect_follows_failover(void **state)
{
    (void)state;
    /* a key whose primary still has its replica (failover_followed killed another) */
    char k[32];
    int slot = -1, victim = -1;
    for (int i = 0; i < 1000 && victim < 0; i++) {
        snprintf(k, sizeof k, "{cf%d}:x", i);
        slot = (int)sd__rc_slot(k, strlen(k));
        int p = h_rc_primary_of(&rc, slot);
        if (p >= 0 && rc.pid[p]) {
            redisReply *r = h_rc_node(&rc, p, "ROLE");
            /* a primary with a connected replica: ROLE's third element lists them */
            if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 3 &&
                r->element[2]->type == REDIS_REPLY_ARRAY && r->element[2]->elements > 0)
                victim = p;
            if (r)
                freeReplyObject(r);
        }
    }
    assert_true(victim >= 0);
    /* a command through the router first: its map as it is now (the cluster may still be
     * settling after failover_followed: a full run once saw this first SET fail) */
    assert_true(h_wait_every(slot_settable, k, 10000, 100));
    redisReply *r;
    kill(rc.pid[victim], SIGKILL);
    h_wait_exit(rc.pid[victim], 2000);
    rc.pid[victim] = 0;
    int arg[2] = {slot, victim};
    assert_true(h_wait_every(promoted, arg, 20000, 100));
    h_sleep_ms(200); /* past REFRESH_MIN_MS since the last map load */

    redisContext *c = sd__rc_connect(slot);
    assert_non_null(c);
    r = redisCommand(c, "ROLE");
    assert_non_null(r);
    assert_string_equal(r->element[0]->str, "master");
    freeReplyObject(r);
    redisFree(c);
    c = sd__rc_connect(-1); /* any primary: the dead one is skipped */
    assert_non_null(c);
    r = redisCommand(c, "PING");
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(c);
}

/* The same on standalone Redis: a write whose connection is lost before its WAIT. The old
 * store reconnected and sent the WAIT on the new connection, which had written nothing,
 * so every connected replica counted (here one stopped with SIGSTOP, which never got
 * the write): a confirmation of a write no replica had. */
static int linked(void *arg)
{
    redisReply *r = h_redis(arg, "INFO replication");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "connected_slaves:1");
    if (r)
        freeReplyObject(r);
    return ok;
}

static void standalone_wait_on_the_write_connection(void **state)
{
    (void)state;
    h_redis_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(h_redis_start(&p), 0);
    char port[16], primary[16], log[300];
    snprintf(port, sizeof port, "%d", h_free_port());
    snprintf(primary, sizeof primary, "%d", p.port);
    snprintf(log, sizeof log, "%s/replica.log", p.dir);
    const char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--dir", p.dir,
                          "--replicaof", "127.0.0.1", primary, NULL};
    pid_t replica = h_spawn(argv, log, NULL);
    assert_true(replica > 0);
    assert_true(h_wait_until(linked, &p, 10000));
    assert_int_equal(sd_store_init(p.url, "sd:"), 0);
    long long acked = 0;
    for (int i = 0; i < 50 && acked < 1; i++)
        assert_int_equal(store_write_wait("solo", &acked), SD_STORE_OK);
    assert_int_equal(acked, 1);
    /* the replica stops taking the stream; a write; its connection is closed */
    kill(replica, SIGSTOP);
    assert_int_equal(put_machine("solo", "m2", "10.0.0.2", NULL), SD_STORE_OK);
    redisReply *r = h_redis(&p, "CLIENT KILL TYPE normal SKIPME yes");
    assert_non_null(r);
    assert_true(r->type == REDIS_REPLY_INTEGER && r->integer >= 1);
    freeReplyObject(r);
    acked = -2;
    int st = sd_store_wait(1, 200, &acked);
    kill(replica, SIGCONT);
    assert_int_equal(st, SD_STORE_DOWN);
    /* the next write and its WAIT run on a new connection, confirmed again */
    acked = 0;
    for (int i = 0; i < 50 && acked < 1; i++)
        assert_int_equal(store_write_wait("solo", &acked), SD_STORE_OK);
    assert_int_equal(acked, 1);
    sd_store_thread_close();
    h_stop(replica, 2000);
    h_redis_stop(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slots_match_redis),
        cmocka_unit_test(commands_reach_the_owner),
        cmocka_unit_test(ask_while_migrating_then_moved),
        cmocka_unit_test(store_scripts_on_every_node),
        cmocka_unit_test(failover_followed),
        cmocka_unit_test(connect_follows_failover),
        cmocka_unit_test(standalone_wait_on_the_write_connection),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
