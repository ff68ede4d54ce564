/* gameproc on the master list (README, "gameproc with ServerDir"), real processes: it
 * announces itself over REST (challenge + heartbeat) with its fields and is removed at
 * once when it exits; it lists itself through serverdir's UDP master front with the DarkPlaces
 * dance (heartbeat -> getinfo <challenge> -> infoResponse) and shows up in the REST list
 * and in a getservers answer; and its own UDP port answers getinfo with the challenge
 * echoed as the protocol requires. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_gameproc.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;
static const char *dir;
static char udp_front[64];     /* serverdir's --master-udp listener */
static int udp_front_port;

typedef struct {
    pid_t pid;
    char log[300];
    int port;                  /* its UDP query port */
} gp_run_t;

static int log_has(const char *path, const char *needle)
{
    static char buf[1 << 18];
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

typedef struct {
    const char *path, *needle;
} log_wait_t;

static int log_cond(void *arg)
{
    const log_wait_t *w = arg;
    return log_has(w->path, w->needle);
}

static int log_wait(const gp_run_t *g, const char *needle, int ms)
{
    log_wait_t w = { g->log, needle };
    return h_wait_until(log_cond, &w, ms);
}

/* Starts gameproc on an ephemeral UDP port and reads the port from its start line. */
static void gp_start(gp_run_t *g, const char *name, const char *const *extra)
{
    const char *argv[40] = { GAMEPROC, "--name", name, "--udp-port", "0", "--no-agent",
                             "--map", "q3dm17", "--max-players", "12" };
    int n = 10;
    for (const char *const *a = extra; a && *a && n < 38; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    snprintf(g->log, sizeof g->log, "%s/%s.log", dir, name);
    g->pid = h_spawn(argv, g->log, NULL);
    assert_true(g->pid > 0);
    assert_true(log_wait(g, "msg=started", 5000));
    FILE *f = fopen(g->log, "r");
    char line[512];
    g->port = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "msg=started") && strstr(line, "udp_port="))
            g->port = atoi(strstr(line, "udp_port=") + 9);
    if (f)
        fclose(f);
    assert_true(g->port > 0);
}

/* The master-list entry for 127.0.0.1:port (caller decrefs), or NULL. */
static json_t *listed(int port)
{
    h_resp_t r;
    if (h_http_json("GET", sd.url, NULL, NULL, &r, "/v1/master/servers?game=gameproc&limit=100"))
        return NULL;
    json_t *j = h_resp_json(&r);
    h_resp_free(&r);
    json_t *found = NULL;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(j, "servers"), i, s) {
        if (json_integer_value(json_object_get(s, "port")) == port)
            found = json_incref(s);
    }
    json_decref(j);
    return found;
}

typedef struct {
    int port;
    int players;               /* -1: any */
    int gone;                  /* wait for the entry to disappear instead */
    int64_t newer_than;        /* and its last heartbeat after this (ms), 0: any */
} listed_wait_t;

/* The condition wait_listed polls: see listed_wait_t. */
static int listed_cond(void *arg)
{
    const listed_wait_t *w = arg;
    json_t *s = listed(w->port);
    int ok = w->gone ? s == NULL
                     : s && (w->players < 0 ||
                             json_integer_value(json_object_get(s, "players")) == w->players) &&
                           json_integer_value(json_object_get(s, "last_heartbeat_ms")) >
                               w->newer_than;
    json_decref(s);
    return ok;
}

/* Polls every 100 ms: the master list limits requests per address. */
static int wait_listed(int port, int players, int gone, int64_t newer_than, int ms)
{
    listed_wait_t w = { port, players, gone, newer_than };
    return h_wait_every(listed_cond, &w, ms, 100);
}

static int udp_socket(void)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    return fd;
}

/* Sends q to 127.0.0.1:port and returns the reply length (0 when none within ms). */
static size_t udp_ask(int fd, int port, const void *q, size_t qlen, uint8_t *out, size_t cap,
                      int ms)
{
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(sendto(fd, q, qlen, 0, (struct sockaddr *)&to, sizeof to), (ssize_t)qlen);
    /* Only the asked port's answer counts: a datagram from elsewhere (another test probing
     * loopback ports) is skipped. */
    int64_t end = h_now_ms() + ms;
    for (int64_t left = ms; left > 0; left = end - h_now_ms()) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, (int)left) != 1)
            return 0;
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(fd, out, cap, 0, (struct sockaddr *)&from, &fl);
        if (n > 0 && from.sin_port == to.sin_port && from.sin_addr.s_addr == to.sin_addr.s_addr)
            return (size_t)n;
    }
    return 0;
}

/* cmocka group setup: the test's temp dir, redis-server, and serverdir on it with a UDP
 * master listener (a listed server that leaves a getinfo unanswered for 1.5 s is dropped). */
static int setup(void **state)
{
    dir = h_tmpdir();
    if (h_stack_setup(state, &redis, &sd,
                      &(h_sd_opts_t){.master_udp = 1,
                                     .config = "{\"master\": {\"getinfo_timeout_ms\": 1500}}"}))
        return -1;
    udp_front_port = sd.udp_port;
    snprintf(udp_front, sizeof udp_front, "127.0.0.1:%d", udp_front_port);
    return 0;
}

/* REST: listed with its fields (the player count the simulation keeps), kept listed by
 * each interval's heartbeat, removed at once on SIGTERM. */
static void rest_announce_and_terminate(void **state)
{
    (void)state;
    const char *extra[] = { "--serverdir", sd.url, "--token", H_TOK_GAME, "--master-rest",
                            "--master-interval-s", "0.5", "--region", "eu-west", "--tags",
                            "ctf,pro", "--players", "2", "--player-keys", "100-101",
                            "--save-every-ms", "60000", NULL };
    gp_run_t g;
    gp_start(&g, "gp-rest", extra);
    assert_true(log_wait(&g, "msg=\"listed on master\" addr=127.0.0.1:", 5000));
    /* Both players joined by a later heartbeat. */
    assert_true(wait_listed(g.port, 2, 0, 0, 5000));
    json_t *s = listed(g.port);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "name")), "gp-rest");
    assert_string_equal(json_string_value(json_object_get(s, "map")), "q3dm17");
    assert_string_equal(json_string_value(json_object_get(s, "region")), "eu-west");
    assert_string_equal(json_string_value(json_object_get(s, "source")), "rest");
    assert_string_equal(json_string_value(json_object_get(s, "ip")), "127.0.0.1");
    assert_int_equal(json_integer_value(json_object_get(s, "max_players")), 12);
    json_t *tags = json_object_get(s, "tags");
    assert_int_equal(json_array_size(tags), 2);
    assert_string_equal(json_string_value(json_array_get(tags, 0)), "ctf");
    assert_string_equal(json_string_value(json_array_get(tags, 1)), "pro");
    int64_t hb1 = json_integer_value(json_object_get(s, "last_heartbeat_ms"));
    json_decref(s);

    /* The next interval's heartbeat refreshes the entry. */
    assert_true(wait_listed(g.port, -1, 0, hb1, h_valgrind() ? 10000 : 5000));
    s = listed(g.port);
    assert_non_null(s);
    assert_true(json_integer_value(json_object_get(s, "last_heartbeat_ms")) > hb1);
    json_decref(s);

    assert_int_equal(kill(g.pid, SIGTERM), 0);
    int st = h_wait_exit(g.pid, 8000);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(log_has(g.log, "msg=\"removed from master list\""));
    /* Gone at once, not after the 3-interval expiry. */
    s = listed(g.port);
    assert_null(s);
}

/* UDP: heartbeat DarkPlaces -> the front's getinfo -> gameproc's infoResponse; listed
 * (source q3) in the REST list and in a getservers answer. */
static void udp_master_dance(void **state)
{
    (void)state;
    const char *extra[] = { "--master-udp", udp_front, "--master-interval-s", "1", NULL };
    gp_run_t g;
    gp_start(&g, "gp-udp", extra);
    assert_true(wait_listed(g.port, -1, 0, 0, 5000));
    json_t *s = listed(g.port);
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "source")), "q3");
    assert_string_equal(json_string_value(json_object_get(s, "name")), "gp-udp");
    assert_string_equal(json_string_value(json_object_get(s, "map")), "q3dm17");
    assert_int_equal(json_integer_value(json_object_get(s, "max_players")), 12);
    assert_int_equal(json_integer_value(json_object_get(s, "protocol")), 68);
    json_decref(s);

    int fd = udp_socket();
    static const char q[] = "\xff\xff\xff\xffgetservers gameproc 68 empty full";
    uint8_t buf[1500];
    size_t n = udp_ask(fd, udp_front_port, q, sizeof q - 1, buf, sizeof buf, 2000);
    static const char hdr[] = "\xff\xff\xff\xffgetserversResponse";
    assert_true(n > sizeof hdr - 1);
    assert_memory_equal(buf, hdr, sizeof hdr - 1);
    uint8_t entry[7] = { '\\', 127, 0, 0, 1, (uint8_t)(g.port >> 8), (uint8_t)g.port };
    assert_non_null(memmem(buf, n, entry, sizeof entry));
    assert_memory_equal(buf + n - 7, "\\EOT\0\0\0", 7);
    close(fd);

    /* A live server answers each heartbeat's getinfo: listed without a gap (looked at
     * every 100 ms) for 3 s, twice the probe timeout. */
    for (int i = 0; i < 30; i++) {
        s = listed(g.port);
        assert_non_null(s);
        json_decref(s);
        h_sleep_ms(100); /* the time is what is tested */
    }

    assert_int_equal(kill(g.pid, SIGTERM), 0);
    int st = h_wait_exit(g.pid, 8000);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(log_has(g.log, "msg=\"udp master heartbeat\" master="));
    assert_true(log_has(g.log, "last=1"));
    /* Its last heartbeat gets a getinfo it no longer answers: the master drops it within
     * getinfo_timeout_ms (1.5 s here) plus a sweep, not at the end of its listing. */
    int64_t t0 = h_now_ms();
    assert_true(wait_listed(g.port, -1, 1, 0, 6000));
    print_message("udp shutdown: gone from the list %lld ms after the exit\n",
                  (long long)(h_now_ms() - t0));
}

/* gameproc's own port: getinfo <challenge> gets an infoResponse whose first key is the
 * challenge, also with a trailing line feed; a challenge an info string cannot carry
 * gets no answer at all. */
static void getinfo_echoes_the_challenge(void **state)
{
    (void)state;
    gp_run_t g;
    gp_start(&g, "gp-info", NULL);
    int fd = udp_socket();
    uint8_t buf[1600];
    static const char q1[] = "\xff\xff\xff\xffgetinfo Xy7-_abc";
    static const char want1[] = "\xff\xff\xff\xffinfoResponse\n\\challenge\\Xy7-_abc\\";
    size_t n = 0;
    for (int i = 0; i < 50 && n == 0; i++) /* until it is ready */
        n = udp_ask(fd, g.port, q1, sizeof q1 - 1, buf, sizeof buf, 100);
    assert_true(n > sizeof want1 - 1);
    assert_memory_equal(buf, want1, sizeof want1 - 1);
    buf[n] = '\0';
    const char *text = (const char *)buf;
    assert_non_null(strstr(text, "\\clients\\0"));
    assert_non_null(strstr(text, "\\sv_maxclients\\12"));
    assert_non_null(strstr(text, "\\protocol\\68"));
    assert_non_null(strstr(text, "\\gamename\\gameproc"));
    assert_non_null(strstr(text, "\\mapname\\q3dm17"));

    static const char q2[] = "\xff\xff\xff\xffgetinfo 42\n";
    static const char want2[] = "\xff\xff\xff\xffinfoResponse\n\\challenge\\42\\";
    n = udp_ask(fd, g.port, q2, sizeof q2 - 1, buf, sizeof buf, 2000);
    assert_true(n > sizeof want2 - 1);
    assert_memory_equal(buf, want2, sizeof want2 - 1);

    static const char bad[] = "\xff\xff\xff\xffgetinfo a\\b";
    assert_int_equal(udp_ask(fd, g.port, bad, sizeof bad - 1, buf, sizeof buf, 300), 0);
    /* Still answering after the bad one. */
    assert_true(udp_ask(fd, g.port, q1, sizeof q1 - 1, buf, sizeof buf, 2000) > 0);
    close(fd);
    int st = h_stop(g.pid, 5000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void)
{
    h_init(180);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rest_announce_and_terminate),
        cmocka_unit_test(udp_master_dance),
        cmocka_unit_test(getinfo_echoes_the_challenge),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
