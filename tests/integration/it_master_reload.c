/* The master list after Redis loses it (issue 31, part 3): a serverdir copy under
 * registration load (DarkPlaces heartbeat -> getinfo -> infoResponse from fake game
 * servers on 127.77.0.1) while its Redis is emptied (FLUSHALL, as a Redis restarted
 * without persistence or promoted from an empty replica does):
 *   - the dances in flight across the loss (getinfo received before, infoResponse sent
 *     after) are listed: the challenge secret went with the list, and the copy gives Redis
 *     back the one it was signing with rather than drawing a new one (the old code drew a
 *     new one and refused every answer to a challenge made before);
 *   - registrations made while the copy reloads are not lost, and the servers listed
 *     before the loss are gone: within 1 s of the last write (4 s under valgrind) the
 *     copy's answer (REST, every page) has exactly the servers Redis has, and Redis
 *     exactly the ones registered since the loss;
 *   - an older copy of the list takes over (a Sentinel failover to a replica that had not
 *     received the last writes, made here with DUMP / RESTORE), registrations going on at
 *     once: the copy's answer again equals Redis within 1 s of the last write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "harness_stack.h"

#define SRC "127.77.0.1"
#define BATCH 32 /* dances in flight at once */

static h_redis_t redis;
static h_serverdir_t sd;
static struct sockaddr_in master;

static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd,
                      &(h_sd_opts_t){.master_udp = 1,
                                     .config = "{\"master\": {\"servers_per_address\": 100000,"
                                               " \"challenges_per_address\": 100000,"
                                               " \"rate_per_s\": 1000000,"
                                               " \"udp_reply_bytes_per_s\": 100000000}}"}))
        return -1;
    memset(&master, 0, sizeof master);
    master.sin_family = AF_INET;
    master.sin_port = htons((uint16_t)sd.udp_port);
    master.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return 0;
}

static int teardown(void **state)
{
    return h_stack_teardown(state);
}

/* One batch of dances in flight: the sockets and the challenges they were given. */
typedef struct {
    int fd[BATCH];
    char chal[BATCH][64];
    int n;
} batch_t;

static void heartbeat(int fd)
{
    static const char hb[] = "\xff\xff\xff\xffheartbeat DarkPlaces\n";
    assert_int_equal(sendto(fd, hb, sizeof hb - 1, 0, (struct sockaddr *)&master, sizeof master),
                     (ssize_t)(sizeof hb - 1));
}

/* Opens n sockets on SRC, the next ports from 20000 (each a new server address: an
 * ephemeral port may come again), sends each a heartbeat and reads its getinfo. The
 * sockets still without one get a heartbeat again every second, all together, as game
 * servers do: a copy that has not read the challenge secret yet (just started) drops
 * heartbeats, and a challenge read early must not age past challenge_ttl_ms while the
 * others wait. */
static void batch_open(batch_t *b, int n)
{
    static int next_port = 20000;
    b->n = 0;
    int got_it[BATCH] = {0}, missing = n;
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        assert_true(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)next_port++)};
        assert_int_equal(inet_pton(AF_INET, SRC, &a.sin_addr), 1);
        assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
        heartbeat(fd);
        b->fd[b->n++] = fd;
    }
    for (int round = 0; missing > 0 && round < (h_valgrind() ? 30 : 10); round++) {
        int64_t until = h_now_ms() + 1000;
        while (missing > 0 && h_now_ms() < until) {
            struct pollfd p[BATCH];
            for (int i = 0; i < n; i++)
                p[i] = (struct pollfd){.fd = got_it[i] ? -1 : b->fd[i], .events = POLLIN};
            if (poll(p, (nfds_t)n, (int)(until - h_now_ms())) <= 0)
                break;
            for (int i = 0; i < n; i++) {
                if (got_it[i] || !(p[i].revents & POLLIN))
                    continue;
                uint8_t buf[256];
                ssize_t got = recv(b->fd[i], buf, sizeof buf - 1, 0);
                if (got <= 12 || got - 12 >= 64 || memcmp(buf, "\xff\xff\xff\xffgetinfo ", 12))
                    continue;
                memcpy(b->chal[i], buf + 12, (size_t)got - 12);
                b->chal[i][got - 12] = '\0';
                got_it[i] = 1;
                missing--;
            }
        }
        for (int i = 0; i < n; i++)
            if (!got_it[i])
                heartbeat(b->fd[i]);
    }
    assert_int_equal(missing, 0);
}

/* Answers every getinfo of b with an infoResponse, and closes the sockets. */
static void batch_answer(batch_t *b)
{
    for (int i = 0; i < b->n; i++) {
        char resp[512];
        int len = snprintf(resp, sizeof resp,
                           "\xff\xff\xff\xffinfoResponse\n\\sv_maxclients\\8\\clients\\1"
                           "\\challenge\\%s\\protocol\\3\\gamename\\Xonotic\\mapname\\dance"
                           "\\gametype\\1\\hostname\\reload %d",
                           b->chal[i], i);
        assert_int_equal(sendto(b->fd[i], resp, (size_t)len, 0, (struct sockaddr *)&master,
                                sizeof master), len);
        close(b->fd[i]);
    }
    b->n = 0;
}

/* Registers n servers, BATCH at a time. */
static void register_n(int n)
{
    batch_t b;
    for (int done = 0; done < n; done += BATCH) {
        batch_open(&b, n - done < BATCH ? n - done : BATCH);
        batch_answer(&b);
    }
}

/* Servers in Redis (P s) and in the copy's answer (GET /v1/master/servers, every page). */
static long long redis_count(void)
{
    redisReply *r = h_redis(&redis, "HLEN sd:master:s");
    long long n = r->integer;
    freeReplyObject(r);
    return n;
}

static long long answer_count(void)
{
    long long n = h_master_listed(sd.url, "");
    assert_true(n >= 0);
    return n;
}

static int redis_has(void *want)
{
    return redis_count() == *(long long *)want;
}

static int key_back(void *arg)
{
    (void)arg;
    redisReply *r = h_redis(&redis, "HEXISTS sd:master:key k");
    int back = r->integer == 1;
    freeReplyObject(r);
    return back;
}

/* Polls until the copy's answer has as many servers as Redis, at most bound ms after
 * last (the last write); prints and checks the figures. */
static void answer_equals_redis(const char *what, int64_t last, long long want)
{
    int64_t bound = h_valgrind() ? 4000 : 1000;
    long long a = -1, n = -1;
    int64_t took = -1;
    do {
        n = redis_count();
        a = answer_count();
        if (a == n) {
            took = h_now_ms() - last;
            break;
        }
        h_sleep_ms(20);
    } while (h_now_ms() - last <= bound);
    print_message("%s: redis %lld servers, the copy's answer %lld, equal %lld ms after the "
                  "last write (bound %lld ms)\n",
                  what, n, a, (long long)took, (long long)bound);
    assert_int_equal(n, want);
    assert_int_equal(a, n);
    assert_true(took >= 0 && took <= bound);
    /* and stays so */
    h_sleep_ms(h_valgrind() ? 3000 : 1500);
    assert_int_equal(answer_count(), redis_count());
}

static void flush_under_registration_load(void **state)
{
    (void)state;
    const int before = 600, after = 600;
    register_n(before);
    long long want = before;
    int all = h_wait_until(redis_has, &want, h_valgrind() ? 20000 : 5000);
    print_message("registered: %lld, in redis: %lld\n", want, redis_count());
    assert_true(all);
    /* a batch in flight across the loss: getinfo before, infoResponse after */
    batch_t across;
    batch_open(&across, BATCH);
    redisReply *r = h_redis(&redis, "FLUSHALL");
    freeReplyObject(r);
    /* the copy notices the loss and writes the challenge key back (the old code drew a new
     * one at its next refresh, up to 10 s later, and refused these answers) */
    assert_true(h_wait_until(key_back, NULL, 15000));
    batch_answer(&across);
    register_n(after); /* while the copy notices the loss and reloads */
    int64_t last = h_now_ms();
    want = BATCH + after;
    all = h_wait_until(redis_has, &want, h_valgrind() ? 20000 : 5000);
    print_message("registered since the loss: %lld, in redis: %lld\n", want, redis_count());
    assert_true(all);
    answer_equals_redis("after the loss", last, BATCH + after);
}

/* A copy of the list that is behind takes over (as a replica that had not received the
 * last writes does when Sentinel promotes it): the state of Redis saved, more servers
 * registered, then Redis put back to the saved state and registrations go on at once.
 * The copy's index held the servers Redis no longer has (its stream followed the newer
 * entries as if nothing happened); it notices its last read entry is gone and reloads. */
static void older_copy_takes_over(void **state)
{
    (void)state;
    long long base = redis_count() + 200; /* the first test left its list */
    register_n(200);
    assert_true(h_wait_until(redis_has, &base, h_valgrind() ? 20000 : 5000));
    /* the saved state: every key of the list */
    redisReply *keys = h_redis(&redis, "KEYS sd:master:*");
    assert_true(keys->type == REDIS_REPLY_ARRAY && keys->elements > 0);
    size_t nk = keys->elements;
    redisReply **dumps = calloc(nk, sizeof *dumps);
    assert_non_null(dumps);
    for (size_t i = 0; i < nk; i++)
        dumps[i] = h_redis(&redis, "DUMP %s", keys->element[i]->str);
    register_n(300); /* the writes the promoted copy will not have */
    long long more = base + 300;
    assert_true(h_wait_until(redis_has, &more, h_valgrind() ? 20000 : 5000));
    assert_int_equal(answer_count(), more);
    /* in one transaction, so the copy never sees the list empty in between (it would
     * reload, write its key and life token, and a RESTORE would find them) */
    redisReply *r = h_redis(&redis, "MULTI");
    freeReplyObject(r);
    r = h_redis(&redis, "FLUSHALL");
    freeReplyObject(r);
    for (size_t i = 0; i < nk; i++) {
        r = h_redis(&redis, "RESTORE %s 0 %b", keys->element[i]->str, dumps[i]->str,
                    (size_t)dumps[i]->len);
        freeReplyObject(r);
        freeReplyObject(dumps[i]);
    }
    r = h_redis(&redis, "EXEC");
    assert_true(r->type == REDIS_REPLY_ARRAY && r->elements == nk + 1);
    for (size_t i = 0; i < r->elements; i++)
        assert_true(r->element[i]->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    free(dumps);
    freeReplyObject(keys);
    register_n(100); /* at once: newer stream entries than the copy read */
    int64_t last = h_now_ms();
    long long want = base + 100;
    assert_true(h_wait_until(redis_has, &want, h_valgrind() ? 20000 : 5000));
    answer_equals_redis("an older copy took over", last, base + 100);
}

int main(void)
{
    h_init(90);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flush_under_registration_load),
        cmocka_unit_test(older_copy_takes_over),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
