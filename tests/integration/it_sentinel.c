/* serverdir on Redis Sentinel: a primary, two replicas and three sentinels on loopback,
 * serverdir with --redis sentinel://... and locks.wait_replicas = 1. Client threads run
 * lock traffic (acquire, hold a while, release) recording every acknowledged grant; the
 * primary is killed with SIGKILL; the test measures how long serverdir grants nothing,
 * then checks that no acknowledged grant was lost: on every key the lock_seq of later
 * grants only grows, and every lock whose grant was acknowledged and not released is
 * still held by its holder with the same lock_seq on the new primary.
 *
 * Two replicas, not one: with WAIT 1 a grant needs a replica to be acknowledged, so the
 * promoted primary needs one too.
 *
 * Last, the master list (issue 31): a copy with a UDP front takes registrations while the
 * primary is killed again; its answer equals the new primary's list within 1 s of the
 * last write, and the registrations made during the failover are listed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NSENTINELS 3
#define NREPLICAS 2
#define NTHREADS 3
#define NKEYS 4 /* per thread */
#define MAX_GRANTS 20000

static h_redis_t primary; /* started by the harness; killed by the test */
static struct node {
    pid_t pid;
    int port;
} replicas[NREPLICAS], sentinels[NSENTINELS];
static h_serverdir_t sd;

/* ---- cluster set-up ---- */

static pid_t spawn_redis(const char *name, const char *const *args)
{
    char log[512];
    snprintf(log, sizeof log, "%s/%s.log", h_tmpdir(), name);
    return h_spawn(args, log, NULL);
}

static redisReply *node_cmd(int port, const char *cmd)
{
    struct timeval tv = {0, 300000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, cmd);
    redisFree(c);
    return r;
}

/* The value of an INFO field ("master_link_status") of the node at port into out. */
static int info_field(int port, const char *section, const char *field, char *out, size_t cap)
{
    char cmd[64];
    snprintf(cmd, sizeof cmd, "INFO %s", section);
    redisReply *r = node_cmd(port, cmd);
    int rc = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        char pat[80];
        snprintf(pat, sizeof pat, "\n%s:", field);
        const char *p = strstr(r->str, pat);
        if (p) {
            p += strlen(pat);
            size_t n = strcspn(p, "\r\n");
            snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
            rc = 0;
        }
    }
    if (r)
        freeReplyObject(r);
    return rc;
}

static int replicas_linked(void *arg)
{
    (void)arg;
    char v[32];
    for (int i = 0; i < NREPLICAS; i++)
        if (info_field(replicas[i].port, "replication", "master_link_status", v, sizeof v) ||
            strcmp(v, "up") != 0)
            return 0;
    return 1;
}

/* Every sentinel knows both replicas and the two other sentinels. */
static int sentinels_ready(void *arg)
{
    (void)arg;
    for (int i = 0; i < NSENTINELS; i++) {
        redisReply *a = node_cmd(sentinels[i].port, "SENTINEL replicas mymaster");
        redisReply *b = node_cmd(sentinels[i].port, "SENTINEL sentinels mymaster");
        int ok = a && b && a->type == REDIS_REPLY_ARRAY && a->elements == NREPLICAS &&
                 b->type == REDIS_REPLY_ARRAY && b->elements == NSENTINELS - 1;
        if (a)
            freeReplyObject(a);
        if (b)
            freeReplyObject(b);
        if (!ok)
            return 0;
    }
    return 1;
}

/* The port of the primary sentinel 0 names, or 0. */
static int sentinel_master_port(void)
{
    redisReply *r = node_cmd(sentinels[0].port, "SENTINEL get-master-addr-by-name mymaster");
    int port = 0;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        port = atoi(r->element[1]->str);
    if (r)
        freeReplyObject(r);
    return port;
}

static int setup(void **state)
{
    (void)state;
    if (h_redis_start(&primary))
        return -1;
    char pport[16];
    snprintf(pport, sizeof pport, "%d", primary.port);
    for (int i = 0; i < NREPLICAS; i++) {
        replicas[i].port = h_free_port();
        char port[16], dir[512], name[32];
        snprintf(port, sizeof port, "%d", replicas[i].port);
        snprintf(name, sizeof name, "replica%d", i);
        snprintf(dir, sizeof dir, "%s", h_tmpdir());
        const char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", dir,
                              "--replicaof", "127.0.0.1", pport, NULL};
        replicas[i].pid = spawn_redis(name, argv);
    }
    if (!h_wait_until(replicas_linked, NULL, 15000)) {
        fprintf(stderr, "replicas did not link to the primary\n");
        return -1;
    }
    for (int i = 0; i < NSENTINELS; i++) {
        sentinels[i].port = h_free_port();
        char conf[1024], name[32];
        snprintf(conf, sizeof conf,
                 "port %d\nbind 127.0.0.1\ndir %s\n"
                 "sentinel monitor mymaster 127.0.0.1 %d 2\n"
                 "sentinel down-after-milliseconds mymaster 1000\n"
                 "sentinel failover-timeout mymaster 4000\n"
                 "sentinel parallel-syncs mymaster 2\n",
                 sentinels[i].port, h_tmpdir(), primary.port);
        snprintf(name, sizeof name, "sentinel%d.conf", i);
        const char *path = h_write_file(h_tmpdir(), name, conf, 0644);
        snprintf(name, sizeof name, "sentinel%d", i);
        const char *argv[] = {"redis-server", path, "--sentinel", NULL};
        sentinels[i].pid = spawn_redis(name, argv);
    }
    if (!h_wait_until(sentinels_ready, NULL, 30000)) {
        fprintf(stderr, "sentinels did not discover each other and the replicas\n");
        return -1;
    }
    char url[256];
    snprintf(url, sizeof url, "sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/mymaster",
             sentinels[0].port, sentinels[1].port, sentinels[2].port);
    const char *cfg = h_write_file(h_tmpdir(), "sd.json",
                                   "{\"locks\": {\"wait_replicas\": 1, \"wait_timeout_ms\": 500}}",
                                   0644);
    const char *extra[] = {"--config", cfg, NULL};
    return h_serverdir_start(&sd, url, h_tokens_file(), extra);
}

static int teardown(void **state)
{
    (void)state;
    h_serverdir_stop(&sd);
    for (int i = 0; i < NSENTINELS; i++)
        h_stop(sentinels[i].pid, 2000);
    for (int i = 0; i < NREPLICAS; i++)
        h_stop(replicas[i].pid, 2000);
    if (primary.pid)
        h_redis_stop(&primary);
    return 0;
}

/* ---- lock traffic ---- */

typedef struct {
    char key[32];
    char holder[32];
    long long seq;
    int reacquired;
    int64_t at_ms;
} grant_t;

static grant_t grants[MAX_GRANTS];
static atomic_int ngrants;
static atomic_int stop_traffic;
static _Atomic int64_t kill_ms;      /* when the primary was killed, 0 before */
static _Atomic int64_t first_after;  /* first acknowledged grant after the kill */
/* Per key: 1 while the last acknowledged operation on it was a grant. */
static int held[NTHREADS][NKEYS];
static long long held_seq[NTHREADS][NKEYS];

static void record_grant(const char *key, const char *holder, const h_resp_t *r)
{
    json_t *j = h_resp_json(r);
    int i = atomic_fetch_add(&ngrants, 1);
    if (i >= MAX_GRANTS || !j) {
        json_decref(j);
        return;
    }
    grant_t *g = &grants[i];
    snprintf(g->key, sizeof g->key, "%s", key);
    snprintf(g->holder, sizeof g->holder, "%s", holder);
    g->seq = json_integer_value(json_object_get(j, "lock_seq"));
    g->reacquired = json_is_true(json_object_get(j, "reacquired"));
    g->at_ms = h_now_ms();
    json_decref(j);
    int64_t k = atomic_load(&kill_ms);
    int64_t zero = 0;
    if (k && g->at_ms >= k)
        atomic_compare_exchange_strong(&first_after, &zero, g->at_ms);
}

/* Thread t cycles over its keys: acquire key i, release key i-2 (so two are held at any
 * time). Answers other than 200 (503 during the failover, transport errors) are retried
 * on the next round; only 200s count as acknowledged. */
static void *traffic(void *arg)
{
    int t = (int)(intptr_t)arg;
    char holder[32];
    snprintf(holder, sizeof holder, "holder-%d", t);
    /* the holder's own lock_token, presented on every acquire: a key it still holds (its
     * release was refused or lost) is acquired again, not refused */
    char body[128];
    snprintf(body, sizeof body, "{\"holder\": \"%s\", \"lock_token\": \"%032x\"}", holder,
             t + 1);
    int64_t deadline = h_now_ms() + 60000;
    for (int round = 0; !atomic_load(&stop_traffic) && h_now_ms() < deadline; round++) {
        int i = round % NKEYS, j = (round + NKEYS - 2) % NKEYS;
        char key[32];
        h_resp_t r;
        snprintf(key, sizeof key, "sent-%d-%d", t, i);
        if (h_http_json("PUT", sd.url, H_TOK_GAME, body, &r, "/v1/locks/%s", key) == 0 &&
            r.status == 200) {
            record_grant(key, holder, &r);
            json_t *jj = h_resp_json(&r);
            held_seq[t][i] = json_integer_value(json_object_get(jj, "lock_seq"));
            json_decref(jj);
            held[t][i] = 1;
        }
        h_resp_free(&r);
        snprintf(key, sizeof key, "sent-%d-%d", t, j);
        if (h_http_json("DELETE", sd.url, H_TOK_GAME, NULL, &r, "/v1/locks/%s?holder=%s", key,
                        holder) == 0 &&
            (r.status == 200 || r.status == 204))
            held[t][j] = 0;
        h_resp_free(&r);
        h_sleep_ms(5);
    }
    return NULL;
}

static int grants_after_kill(void *arg)
{
    (void)arg;
    return atomic_load(&first_after) != 0;
}

static int count_grants(void)
{
    int n = atomic_load(&ngrants);
    return n < MAX_GRANTS ? n : MAX_GRANTS;
}

/* h_wait_until condition: at least *arg (an int) grants were counted. */
static int grants_reach(void *arg)
{
    return count_grants() >= *(const int *)arg;
}

static void test_failover_keeps_acknowledged_grants(void **state)
{
    (void)state;
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, traffic, (void *)(intptr_t)t), 0);

    /* Traffic before the failover. */
    int want = 60;
    h_wait_until(grants_reach, &want, 15000);
    int before = count_grants();
    assert_true(before >= 60);

    int old_port = primary.port;
    atomic_store(&kill_ms, h_now_ms());
    assert_int_equal(kill(primary.pid, SIGKILL), 0);
    h_stop(primary.pid, 100);
    primary.pid = 0;
    if (primary.ctl) {
        redisFree(primary.ctl);
        primary.ctl = NULL;
    }

    int served = h_wait_until(grants_after_kill, NULL, 30000);
    int64_t outage = served ? atomic_load(&first_after) - atomic_load(&kill_ms) : -1;
    printf("sentinel failover: serverdir granted locks again %lld ms after the primary was "
           "killed (%d grants before)\n", (long long)outage, before);
    assert_true(served);
    assert_true(outage < 15000);

    /* Some traffic on the new primary, then stop. */
    int after_first = count_grants();
    want = after_first + 30;
    h_wait_until(grants_reach, &want, 10000);
    atomic_store(&stop_traffic, 1);
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);

    int new_port = sentinel_master_port();
    assert_true(new_port != 0 && new_port != old_port);

    /* On each key, grants are acknowledged with growing lock_seq (an equal one only for an
     * idempotent re-acquire after a release that did not get through). */
    int n = count_grants();
    assert_true(n > after_first);
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++) {
            if (strcmp(grants[i].key, grants[k].key) != 0)
                continue;
            if (grants[k].reacquired)
                assert_true(grants[k].seq >= grants[i].seq);
            else
                assert_true(grants[k].seq > grants[i].seq);
            break;
        }

    /* Every lock last acknowledged as granted is still held, by its holder, same seq. */
    int checked = 0;
    for (int t = 0; t < NTHREADS; t++)
        for (int i = 0; i < NKEYS; i++) {
            if (!held[t][i])
                continue;
            h_resp_t r;
            assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                                         "/v1/locks/sent-%d-%d", t, i), 0);
            assert_int_equal(r.status, 200);
            json_t *j = h_resp_json(&r);
            char holder[32];
            snprintf(holder, sizeof holder, "holder-%d", t);
            assert_string_equal(json_string_value(json_object_get(j, "state")), "held");
            assert_string_equal(json_string_value(json_object_get(j, "holder")), holder);
            assert_int_equal(json_integer_value(json_object_get(j, "lock_seq")), held_seq[t][i]);
            json_decref(j);
            h_resp_free(&r);
            checked++;
        }
    assert_true(checked > 0);

    /* And the grants acknowledged before the kill are on the new primary's history: a fresh
     * grant on each key has a higher lock_seq than any grant acknowledged before. */
    for (int t = 0; t < NTHREADS; t++)
        for (int i = 0; i < NKEYS; i++) {
            char key[32];
            snprintf(key, sizeof key, "sent-%d-%d", t, i);
            long long max_seq = 0;
            for (int g = 0; g < n; g++)
                if (strcmp(grants[g].key, key) == 0 && grants[g].seq > max_seq)
                    max_seq = grants[g].seq;
            h_resp_t r;
            assert_int_equal(h_http_json("DELETE", sd.url, H_TOK_OPS, NULL, &r,
                                         "/v1/locks/%s?force=true", key), 0);
            h_resp_free(&r);
            assert_int_equal(h_http_json("PUT", sd.url, H_TOK_GAME,
                                         "{\"holder\": \"checker\"}", &r, "/v1/locks/%s", key), 0);
            assert_int_equal(r.status, 200);
            json_t *j = h_resp_json(&r);
            assert_true(json_integer_value(json_object_get(j, "lock_seq")) > max_seq);
            json_decref(j);
            h_resp_free(&r);
        }
}

/* h_wait_every condition: a SENTINEL FAILOVER was accepted; arg (128 bytes) gets the
 * last refusal. */
static int failover_accepted(void *arg)
{
    redisReply *f = node_cmd(sentinels[0].port, "SENTINEL FAILOVER mymaster");
    int accepted = f && f->type == REDIS_REPLY_STATUS;
    if (f && f->type == REDIS_REPLY_ERROR)
        snprintf(arg, 128, "%s", f->str);
    if (f)
        freeReplyObject(f);
    return accepted;
}

static int primary_moved(void *arg)
{
    int p = sentinel_master_port();
    return p != 0 && p != *(int *)arg;
}

/* A planned failover (SENTINEL FAILOVER): the old primary is not dead but demoted to a
 * replica, so serverdir learns it from READONLY replies (or ROLE on reconnect) instead of
 * connection errors, and follows to the new primary. Runs after the kill test (the
 * cluster then has a primary and one replica). */
static void test_planned_failover_followed(void **state)
{
    (void)state;
    int old = sentinel_master_port();
    assert_true(old != 0);
    /* A grant on the current primary first: the worker connections point at it. */
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_GAME, "{\"holder\": \"planned\"}", &r,
                                 "/v1/locks/planned-0"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    /* Refused (NOGOODSLAVE, INPROG) until the sentinels see the replica synced to the
     * primary of the last failover: retry, bounded. */
    char last[128] = "";
    int accepted = h_wait_every(failover_accepted, last, 30000, 200);
    if (!accepted)
        fprintf(stderr, "SENTINEL FAILOVER refused: %s\n", last);
    assert_true(accepted);
    int64_t t0 = h_now_ms();
    assert_true(h_wait_until(primary_moved, &old, 30000));
    int64_t moved = h_now_ms();

    /* serverdir writes to the new primary within a bounded time: first the grant lands
     * there but WAIT 1 may time out (503 replication_timeout: Sentinel converts the
     * demoted primary into a replica on its next INFO round, up to ~10 s later), then it
     * is confirmed (200). 503 store_unavailable only while no primary is known. */
    int64_t until = h_now_ms() + 40000, landed = 0, served = 0;
    for (int i = 1; h_now_ms() < until && !served; i++) {
        assert_int_equal(h_http_json("PUT", sd.url, H_TOK_GAME, "{\"holder\": \"planned\"}", &r,
                                     "/v1/locks/planned-%d", i), 0);
        if (r.status == 200)
            served = h_now_ms();
        else
            assert_int_equal(r.status, 503);
        if (!landed && (r.status == 200 || !strcmp(h_err_code(&r), "replication_timeout")))
            landed = h_now_ms();
        h_resp_free(&r);
        if (!served)
            h_sleep_ms(50);
    }
    assert_true(landed > 0 && served > 0);
    assert_true(landed - moved < 10000);
    printf("sentinel planned failover: the sentinels named the new primary after %lld ms; "
           "serverdir's grants landed on it after %lld ms and were confirmed by a replica "
           "after %lld ms\n",
           (long long)(moved - t0), (long long)(landed - t0), (long long)(served - t0));
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "/v1/locks/planned-0"), 0);
    json_t *j = h_resp_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "holder")), "planned");
    json_decref(j);
    h_resp_free(&r);

    /* serverdir heard the announcement (+switch-master) and logged it. */
    FILE *lf = fopen(sd.log, "r");
    assert_non_null(lf);
    char line[2048];
    int announced = 0;
    while (fgets(line, sizeof line, lf))
        announced |= strstr(line, "sentinel announced a failover") != NULL;
    fclose(lf);
    assert_true(announced);

    /* The moves are counted: the first discovery, the kill, the planned failover. */
    char url[256];
    snprintf(url, sizeof url, "%s/metrics", sd.url);
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    const char *m = strstr(r.body, "\nserverdir_redis_primary_changes_total ");
    assert_non_null(m);
    assert_true(atoi(m + strlen("\nserverdir_redis_primary_changes_total ")) >= 3);
    h_resp_free(&r);
}

/* ---- the master list across a failover (issue 31, part 3) ---- */

static h_serverdir_t msd; /* a copy with a UDP master front */
static struct sockaddr_in msd_udp;
static atomic_int stop_reg, reg_done, reg_port; /* reg_port: the next dance's port */
#define REG_PORT0 30000
#define REG_PORTS 30000
static unsigned char answered[REG_PORTS]; /* port - REG_PORT0: its infoResponse went out */

/* One DarkPlaces dance from 127.78.0.1:port: heartbeat (again every 300 ms, 3 times at
 * most), getinfo, infoResponse. 1 when the infoResponse went out. */
static int dance(int port)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.78.0.1", &a.sin_addr);
    int sent = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        static const char hb[] = "\xff\xff\xff\xffheartbeat DarkPlaces\n";
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ready = 0;
        for (int t = 0; t < 3 && !ready; t++) {
            sendto(fd, hb, sizeof hb - 1, 0, (struct sockaddr *)&msd_udp, sizeof msd_udp);
            ready = poll(&p, 1, 300) == 1;
        }
        char buf[256];
        ssize_t got = ready ? recv(fd, buf, sizeof buf - 1, 0) : -1;
        if (got > 12 && !memcmp(buf, "\xff\xff\xff\xffgetinfo ", 12)) {
            buf[got] = '\0';
            char resp[512];
            int len = snprintf(resp, sizeof resp,
                               "\xff\xff\xff\xffinfoResponse\n\\sv_maxclients\\8\\clients\\1"
                               "\\challenge\\%s\\protocol\\3\\gamename\\Xonotic\\mapname\\m"
                               "\\hostname\\failover %d",
                               buf + 12, port);
            sent = sendto(fd, resp, (size_t)len, 0, (struct sockaddr *)&msd_udp,
                          sizeof msd_udp) == len;
        }
    }
    close(fd);
    return sent;
}

static void *registrations(void *arg)
{
    (void)arg;
    for (int port = REG_PORT0; port < REG_PORT0 + REG_PORTS && !atomic_load(&stop_reg); port++) {
        atomic_store(&reg_port, port);
        answered[port - REG_PORT0] = (unsigned char)dance(port);
        atomic_fetch_add(&reg_done, answered[port - REG_PORT0]);
        /* at most ~500 a second (100 under valgrind, which the copy then keeps up with):
         * the range lasts a minute */
        h_sleep_ms(h_valgrind() ? 10 : 2);
    }
    return NULL;
}

/* Servers in the current primary's P s, -1 when it does not answer. */
static long long master_in_redis(void)
{
    redisReply *r = node_cmd(sentinel_master_port(), "HLEN sd:master:s");
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return n;
}

/* Servers in msd's answer (REST, every page). */
static long long master_answer(void)
{
    return h_master_listed(msd.url, "");
}

static int redis_reaches(void *arg)
{
    return master_in_redis() >= *(long long *)arg;
}

/* The primary killed while a copy takes registrations: Sentinel promotes the replica,
 * which may lack the last writes the copy applied to its index. Within 1 s of the last
 * write (4 s under valgrind) the copy's answer has exactly the servers the new primary
 * has, and the registrations answered after the kill, during and after the failover, are
 * listed (95% at least: what the killed primary had not replicated may be lost). Runs
 * last (it leaves one Redis). */
static void test_master_list_across_a_kill(void **state)
{
    (void)state;
    int uport = h_free_port();
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", uport);
    char url[256];
    snprintf(url, sizeof url, "sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/mymaster",
             sentinels[0].port, sentinels[1].port, sentinels[2].port);
    const char *cfg = h_write_file(h_tmpdir(), "msd.json",
                                   "{\"master\": {\"servers_per_address\": 100000,"
                                   " \"challenges_per_address\": 100000, \"rate_per_s\": 1000000,"
                                   " \"udp_reply_bytes_per_s\": 100000000}}", 0644);
    const char *extra[] = {"--config", cfg, "--master-udp", listen, NULL};
    assert_int_equal(h_serverdir_start(&msd, url, h_tokens_file(), extra), 0);
    memset(&msd_udp, 0, sizeof msd_udp);
    msd_udp.sin_family = AF_INET;
    msd_udp.sin_port = htons((uint16_t)uport);
    msd_udp.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, registrations, NULL), 0);
    long long some = 300;
    int filled = h_wait_until(redis_reaches, &some, 30000);
    int old = sentinel_master_port();
    pid_t victim = 0;
    for (int i = 0; i < NREPLICAS; i++)
        if (replicas[i].port == old) {
            victim = replicas[i].pid;
            replicas[i].pid = 0;
        }
    int kill_port = atomic_load(&reg_port);
    if (filled && victim)
        kill(victim, SIGKILL);
    int moved = filled && victim && h_wait_until(primary_moved, &old, 30000);
    /* registrations go on with the new primary: a hundred more land there */
    long long grown = master_in_redis() + 100;
    int landed = moved && h_wait_until(redis_reaches, &grown, 20000);
    atomic_store(&stop_reg, 1);
    pthread_join(t, NULL);
    /* the last write: when the list in Redis stopped growing (the copy's writer may still
     * hold a backlog when the dances stop); the first time after it that the copy's
     * answer had as many servers */
    int64_t last = h_now_ms(), equal_at = -1, bound = h_valgrind() ? 4000 : 1000;
    long long n = -1, a = -2;
    for (long long prev = -1;;) {
        int64_t now = h_now_ms();
        if ((n = master_in_redis()) != prev) {
            prev = n;
            last = now;
            equal_at = -1;
        }
        a = master_answer();
        if (a == n && equal_at < 0)
            equal_at = now;
        if (now - last >= (h_valgrind() ? 1500 : 500) && (equal_at >= 0 || now - last > bound))
            break;
        h_sleep_ms(20);
    }
    int64_t took = equal_at >= 0 ? equal_at - last : -1;
    if (victim)
        h_stop(victim, 100);
    assert_true(filled);
    assert_true(victim > 0);
    assert_true(moved);
    assert_true(landed);
    int reloads = 0;
    FILE *lf = fopen(msd.log, "r");
    char line[2048];
    while (lf && fgets(line, sizeof line, lf))
        reloads += strstr(line, "master list reloading") != NULL;
    if (lf)
        fclose(lf);
    printf("master list across a primary kill: %d dances answered, the new primary has %lld "
           "servers, the copy's answer %lld, equal %lld ms after the last write (bound %lld "
           "ms); reloads: %d\n",
           atomic_load(&reg_done), n, a, (long long)took, (long long)bound, reloads);
    /* The dances answered after the kill (past a margin of 64 for the batch the writer
     * had in flight then) are listed in the new primary: the copy's writer holds a batch
     * while Redis cannot be reached (the old one dropped it: 402 listed of 1,487
     * answered). What the killed primary had not passed to the replica may be missing:
     * replication is asynchronous, and under load it lagged by a few hundred. */
    int after = 0, after_listed = 0;
    redisReply *keys = node_cmd(sentinel_master_port(), "HKEYS sd:master:s");
    unsigned char *listed = calloc(REG_PORTS, 1);
    assert_non_null(listed);
    for (size_t i = 0; keys && keys->type == REDIS_REPLY_ARRAY && i < keys->elements; i++) {
        const char *colon = strrchr(keys->element[i]->str, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (port >= REG_PORT0 && port < REG_PORT0 + REG_PORTS)
            listed[port - REG_PORT0] = 1;
    }
    if (keys)
        freeReplyObject(keys);
    for (int p = kill_port + 64; p < REG_PORT0 + REG_PORTS; p++) {
        after += answered[p - REG_PORT0];
        after_listed += answered[p - REG_PORT0] && listed[p - REG_PORT0];
    }
    free(listed);
    printf("master list across a primary kill: of the %d dances answered after the kill, "
           "%d are listed\n", after, after_listed);
    h_serverdir_stop(&msd);
    assert_true(n > 0);
    assert_int_equal(a, n);
    assert_true(took >= 0 && took <= bound);
    assert_true(after > 0);
    assert_true(after_listed >= after * 95 / 100);
}

/* A bad sentinel URL is refused at start with a usage error. */
static void test_bad_sentinel_url(void **state)
{
    (void)state;
    const char *bad[] = {"sentinel://", "sentinel://127.0.0.1:1", "sentinel://127.0.0.1:1/",
                         "sentinel://127.0.0.1/m", "sentinel://127.0.0.1:1/m?db=x",
                         "sentinel://127.0.0.1:1/bad name"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char log[512];
        snprintf(log, sizeof log, "%s/badurl%zu.log", h_tmpdir(), i);
        const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", "127.0.0.1:0", "--redis",
                              bad[i], NULL};
        pid_t pid = h_spawn(argv, log, NULL);
        int st = h_wait_exit(pid, 10000);
        assert_true(WIFEXITED(st));
        assert_int_not_equal(WEXITSTATUS(st), 0);
    }
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_sentinel_url),
        cmocka_unit_test(test_failover_keeps_acknowledged_grants),
        cmocka_unit_test(test_planned_failover_followed),
        cmocka_unit_test(test_master_list_across_a_kill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
