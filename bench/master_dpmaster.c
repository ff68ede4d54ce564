/* Load generator of the side-by-side master benchmark (bench/master_dpmaster.sh): drives
 * ONE master over loopback UDP with the DarkPlaces protocol, exactly the same way whether
 * it is serverdir's UDP front or dpmaster, and prints one line of figures:
 *
 *   registrations  N game servers, each its own socket on its own source address
 *                  (127.A.B.C:27960), do the dance heartbeat -> getinfo -> infoResponse,
 *                  in waves of 1,000 sockets (a heartbeat without getinfo is retried
 *                  after 500 ms, 5 times at most); servers still missing from the list
 *                  afterwards (an infoResponse lost in a full receive buffer) dance
 *                  again, as a real server's next heartbeat would, 5 rounds at most.
 *                  reg_per_s counts a registration when the master lists it: the clock
 *                  runs from the first heartbeat until a full getservers lists all N
 *                  (serverdir writes Redis behind the dance; visible is what counts).
 *                  dance_per_s: infoResponses sent per second of the dance alone.
 *                  hb_retries / hb_gave_up: heartbeats sent again (no getinfo in
 *                  --retry-ms) / given up after 5: a master that drops heartbeats is
 *                  overdriven by the generator, and its figure is the generator's
 *                  (the script warns when retries pass 0.5% of the servers).
 *   queries        `getservers DarkPlaces-Quake 3 empty full` from 1 and then 8 sockets,
 *                  each with one query in flight, for --ms each: answers per second
 *                  and the p50 / p99 time from the query to the datagram with the EOT;
 *                  every answer must list all N servers (else it counts as short).
 *   heartbeats under queries: while the 8 query sockets run, one more server heartbeats
 *                  every 5 ms; p50 / p99 of heartbeat -> getinfo (a master whose
 *                  heartbeats wait behind queries shows it here).
 *   memory         (RSS of --pid after - before) [+ Redis used_memory after - before]
 *                  divided by N.
 *   CPU            what the master (--pid), its Redis (--redis-port) and this generator
 *                  spent (user + system, /proc) from the first heartbeat until all N are
 *                  listed, per registration: cpu_master_us, cpu_redis_us, cpu_side_us
 *                  (the two together), cpu_gen_us. On a machine whose cores are all busy
 *                  what one side spends the other cannot.
 *
 * Usage: bench_master_dpmaster --master 127.0.0.1:PORT --servers N --pid PID
 *        [--redis-port P] [--label L] [--ms 3000] [--base A] [--window 32]
 *        [--retry-ms 500] (A: first source address octet, default 100: servers come
 *        from 127.A.x.y). Not part of ctest. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAVE 1000
/* Heartbeats awaiting their getinfo, per thread (--window). 64 (the old value) overran
 * dpmaster's default receive buffer: heartbeats were dropped and each cost a 500 ms
 * retry, so dpmaster ran at 5,300-17,800 registrations/s at 10,000 servers; at 16 or 32
 * it runs at 52,000-60,000 with no retry, and serverdir the same at 16, 32 or 64
 * (bench/README.md, "master list side by side with dpmaster"). */
static int window = 32;
static int64_t retry_us = 500000; /* a heartbeat without getinfo is sent again (--retry-ms) */
#define GAME "DarkPlaces-Quake"
static const char QUERY[] = "\xff\xff\xff\xffgetservers " GAME " 3 empty full";

static struct sockaddr_in master;
static int nservers = 1000, run_ms = 3000, base_octet = 100, redis_port;
static long pid;
static const char *label = "master";

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static long rss_kb(void)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* CPU time (user + system) a process has used, in microseconds; -1 when unreadable. */
static long long cpu_us(long of)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", of);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long long)(ut + st) * 1000000 / sysconf(_SC_CLK_TCK);
}

static long long redis_info_field(const char *section, const char *field);

static long long redis_used(void)
{
    return redis_info_field("memory", "used_memory");
}

/* A whole-number field of Redis's INFO section (0 without Redis). */
static long long redis_info_field(const char *section, const char *field)
{
    if (!redis_port)
        return 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "redis-cli -p %d info %s 2>/dev/null", redis_port, section);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    char line[256];
    long long v = 0;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, p))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':' && sscanf(line + fl + 1, "%lld", &v) == 1)
            break;
    pclose(p);
    return v;
}

/* The i-th server's source address: 127.base+i/62500 . (i/250)%250+1 . i%250+1 */
static void server_ip(int i, struct in_addr *a)
{
    unsigned o2 = (unsigned)(base_octet + i / 62500), o3 = (unsigned)((i / 250) % 250 + 1),
             o4 = (unsigned)(i % 250 + 1);
    a->s_addr = htonl(127u << 24 | o2 << 16 | o3 << 8 | o4);
}

static int server_index(const uint8_t ip[4])
{
    if (ip[0] != 127 || ip[1] < base_octet || ip[2] < 1 || ip[2] > 250 || ip[3] < 1 || ip[3] > 250)
        return -1;
    return (ip[1] - base_octet) * 62500 + (ip[2] - 1) * 250 + (ip[3] - 1);
}

static int udp_at_port(struct in_addr ip, int port)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr = ip, .sin_port = htons((uint16_t)port)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int udp_at(struct in_addr ip)
{
    return udp_at_port(ip, 0);
}

static const char HB[] = "\xff\xff\xff\xffheartbeat DarkPlaces\n";

/* Counts the entries of one getservers answer; returns -1 on timeout, else the number
 * of servers listed (datagrams until the one with the EOT). */
static long answer_bytes; /* of the last answer read */

static int read_answer(int fd, int timeout_ms, uint8_t *seen)
{
    int n = 0;
    answer_bytes = 0;
    uint8_t buf[2048];
    int64_t end = now_us() + (int64_t)timeout_ms * 1000;
    for (;;) {
        int left = (int)((end - now_us()) / 1000);
        if (left < 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) != 1)
            return -1;
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got < 0)
            continue;
        answer_bytes += got;
        static const char word[] = "\xff\xff\xff\xffgetserversResponse";
        size_t o = sizeof word - 1;
        if ((size_t)got < o || memcmp(buf, word, o) != 0)
            continue;
        while (o < (size_t)got) {
            if (o + 7 <= (size_t)got && !memcmp(buf + o, "\\EOT\0\0\0", 7))
                return n;
            if (buf[o] == '\\' && o + 7 <= (size_t)got) {
                if (seen) {
                    int i = server_index(buf + o + 1);
                    if (i >= 0 && i < nservers)
                        seen[i] = 1;
                }
                n++;
                o += 7;
            } else {
                break;
            }
        }
    }
}

static int count_listed(uint8_t *seen)
{
    struct in_addr lo = {htonl(INADDR_LOOPBACK)};
    int fd = udp_at(lo);
    if (fd < 0)
        return -1;
    int rcv = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    sendto(fd, QUERY, sizeof QUERY - 1, 0, (struct sockaddr *)&master, sizeof master);
    int n = read_answer(fd, 3000, seen);
    close(fd);
    return n;
}

/* ---------- registrations ---------- */

static atomic_long info_sent, hb_retries, hb_gave_up;

/* One wave of servers [from, to): heartbeats, getinfo answers, retries. Returns how many
 * got their getinfo answered. */
static int *todo; /* the server indices still to register */
static int ntodo;

static int wave(int from, int to)
{
    int n = to - from;
    int *fds = calloc((size_t)n, sizeof *fds);
    int64_t *sent_at = calloc((size_t)n, sizeof *sent_at);
    int *tries = calloc((size_t)n, sizeof *tries), *done = calloc((size_t)n, sizeof *done);
    int ep = epoll_create1(EPOLL_CLOEXEC), ok = 0;
    for (int i = 0; i < n; i++) {
        struct in_addr ip;
        server_ip(todo[from + i], &ip);
        fds[i] = udp_at_port(ip, 27960);
        if (fds[i] < 0) {
            done[i] = 1;
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
    }
    /* Closed loop: at most WINDOW heartbeats wait for their getinfo at a time, so neither
     * master's receive buffer overflows on a burst the generator made up. */
    int next = 0, outstanding = 0;
    int left = n;
    for (int i = 0; i < n; i++)
        left -= done[i];
    int64_t give_up = now_us() + 30000000, next_scan = 0;
    while (left > 0 && now_us() < give_up) {
        while (outstanding < window && next < n) {
            if (!done[next]) {
                sendto(fds[next], HB, sizeof HB - 1, 0, (struct sockaddr *)&master, sizeof master);
                sent_at[next] = now_us();
                tries[next] = 1;
                outstanding++;
            }
            next++;
        }
        struct epoll_event evs[256];
        int k = epoll_wait(ep, evs, 256, 20);
        for (int e = 0; e < k; e++) {
            int i = (int)evs[e].data.u32;
            uint8_t buf[256];
            ssize_t got = recv(fds[i], buf, sizeof buf - 1, 0);
            if (got <= 12 || memcmp(buf, "\xff\xff\xff\xffgetinfo ", 12) != 0 || done[i])
                continue;
            buf[got] = '\0';
            char resp[512];
            int len = snprintf(resp, sizeof resp,
                               "\xff\xff\xff\xffinfoResponse\n\\challenge\\%s\\protocol\\3"
                               "\\sv_maxclients\\16\\clients\\2\\gamename\\" GAME
                               "\\mapname\\e1m1\\hostname\\bench %d",
                               (char *)buf + 12, todo[from + i]);
            sendto(fds[i], resp, (size_t)len, 0, (struct sockaddr *)&master, sizeof master);
            atomic_fetch_add(&info_sent, 1);
            done[i] = 1;
            ok++;
            left--;
            outstanding--;
        }
        int64_t t = now_us();
        if (t < next_scan)
            continue;
        next_scan = t + 100000; /* retries are looked for every 100 ms */
        for (int i = 0; i < next; i++) {
            if (done[i] || t - sent_at[i] < retry_us)
                continue;
            if (tries[i] >= 5) {
                done[i] = 1;
                left--;
                outstanding--;
                atomic_fetch_add(&hb_gave_up, 1);
                continue;
            }
            sendto(fds[i], HB, sizeof HB - 1, 0, (struct sockaddr *)&master, sizeof master);
            sent_at[i] = t;
            tries[i]++;
            atomic_fetch_add(&hb_retries, 1);
        }
    }
    /* Keep the sockets a moment so a late getinfo does not hit a closed port (ICMP). */
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    close(ep);
    free(fds);
    free(sent_at);
    free(tries);
    free(done);
    return ok;
}

struct reg_arg {
    int from, to, ok;
};

static atomic_int next_wave;

static void *reg_thread(void *arg)
{
    struct reg_arg *r = arg;
    for (;;) {
        int w = atomic_fetch_add(&next_wave, 1);
        int from = w * WAVE;
        if (from >= ntodo)
            break;
        int to = from + WAVE < ntodo ? from + WAVE : ntodo;
        r->ok += wave(from, to);
    }
    return NULL;
}

/* ---------- queries ---------- */

static atomic_int q_stop;

struct q_arg {
    int64_t *lat;
    int nlat, cap, short_answers, lost;
};

static void *query_thread(void *arg)
{
    struct q_arg *q = arg;
    struct in_addr lo = {htonl(INADDR_LOOPBACK)};
    int fd = udp_at(lo);
    int rcv = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    while (!atomic_load(&q_stop)) {
        int64_t t0 = now_us();
        sendto(fd, QUERY, sizeof QUERY - 1, 0, (struct sockaddr *)&master, sizeof master);
        int n = read_answer(fd, 2000, NULL);
        int64_t t1 = now_us();
        if (n < 0) {
            q->lost++;
            /* drain what a late answer left */
            uint8_t b[2048];
            while (recv(fd, b, sizeof b, MSG_DONTWAIT) > 0)
                ;
            continue;
        }
        if (n < nservers)
            q->short_answers++;
        if (q->nlat < q->cap)
            q->lat[q->nlat++] = t1 - t0;
    }
    close(fd);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static atomic_int hb_stop;
static int64_t hb_lat[100000];
static int hb_n;

/* One server heartbeating every 5 ms while queries run: heartbeat -> getinfo latency. */
static void *hb_probe_thread(void *arg)
{
    (void)arg;
    struct in_addr ip;
    server_ip(nservers + 1, &ip);
    int fd = udp_at(ip);
    while (!atomic_load(&hb_stop)) {
        int64_t t0 = now_us();
        sendto(fd, HB, sizeof HB - 1, 0, (struct sockaddr *)&master, sizeof master);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        uint8_t buf[256];
        if (poll(&p, 1, 1000) == 1 && recv(fd, buf, sizeof buf, 0) > 12 && hb_n < 100000)
            hb_lat[hb_n++] = now_us() - t0;
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    close(fd);
    return NULL;
}

static void run_queries(int inflight, double *qps, double *p50, double *p99, int *bad,
                        int with_hb, double *hb50, double *hb99)
{
    struct q_arg qa[8];
    pthread_t th[8], hbt;
    atomic_store(&q_stop, 0);
    atomic_store(&hb_stop, 0);
    hb_n = 0;
    for (int i = 0; i < inflight; i++) {
        qa[i] = (struct q_arg){.cap = 1000000};
        qa[i].lat = malloc(sizeof(int64_t) * (size_t)qa[i].cap);
        pthread_create(&th[i], NULL, query_thread, &qa[i]);
    }
    if (with_hb)
        pthread_create(&hbt, NULL, hb_probe_thread, NULL);
    int64_t t0 = now_us();
    struct timespec ts = {run_ms / 1000, (run_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    atomic_store(&q_stop, 1);
    atomic_store(&hb_stop, 1);
    int total = 0;
    *bad = 0;
    for (int i = 0; i < inflight; i++) {
        pthread_join(th[i], NULL);
        total += qa[i].nlat;
        *bad += qa[i].short_answers + qa[i].lost;
    }
    if (with_hb)
        pthread_join(hbt, NULL);
    double secs = (double)(now_us() - t0) / 1e6;
    int64_t *all = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    int k = 0;
    for (int i = 0; i < inflight; i++) {
        memcpy(all + k, qa[i].lat, sizeof(int64_t) * (size_t)qa[i].nlat);
        k += qa[i].nlat;
        free(qa[i].lat);
    }
    qsort(all, (size_t)total, sizeof *all, cmp64);
    *qps = total / secs;
    *p50 = total ? (double)all[total / 2] / 1000 : -1;
    *p99 = total ? (double)all[(int)(total * 0.99)] / 1000 : -1;
    free(all);
    if (with_hb) {
        qsort(hb_lat, (size_t)hb_n, sizeof hb_lat[0], cmp64);
        *hb50 = hb_n ? (double)hb_lat[hb_n / 2] / 1000 : -1;
        *hb99 = hb_n ? (double)hb_lat[(int)(hb_n * 0.99)] / 1000 : -1;
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--master")) {
            char host[64];
            int port;
            if (sscanf(argv[i + 1], "%63[^:]:%d", host, &port) != 2)
                return 2;
            master.sin_family = AF_INET;
            master.sin_port = htons((uint16_t)port);
            inet_pton(AF_INET, host, &master.sin_addr);
        } else if (!strcmp(argv[i], "--servers")) {
            nservers = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--pid")) {
            pid = atol(argv[i + 1]);
        } else if (!strcmp(argv[i], "--redis-port")) {
            redis_port = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--label")) {
            label = argv[i + 1];
        } else if (!strcmp(argv[i], "--ms")) {
            run_ms = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--base")) {
            base_octet = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--window")) {
            window = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--retry-ms")) {
            retry_us = atoll(argv[i + 1]) * 1000;
        } else {
            fprintf(stderr, "usage: %s --master 127.0.0.1:PORT --servers N --pid PID "
                            "[--redis-port P] [--label L] [--ms MS] [--base A] [--window W] "
                            "[--retry-ms MS]\n", argv[0]);
            return 2;
        }
    }
    if (!master.sin_port || nservers < 1 || nservers > 1000000) {
        fprintf(stderr, "bench_master_dpmaster: --master and --servers (1..1000000) are needed\n");
        return 2;
    }
    if (window < 1 || window > WAVE || retry_us < 10000) {
        fprintf(stderr, "bench_master_dpmaster: --window 1..%d, --retry-ms 10 or more\n", WAVE);
        return 2;
    }
    long rss0 = rss_kb();
    long long red0 = redis_used();

    /* registrations: 2 threads of waves */
    long redis_pid = (long)redis_info_field("server", "process_id");
    long long cpu_m0 = cpu_us(pid), cpu_r0 = redis_pid ? cpu_us(redis_pid) : 0, cpu_g0 = cpu_us(getpid());
    int64_t t0 = now_us(), t_dance = 0;
    todo = malloc(sizeof *todo * (size_t)nservers);
    uint8_t *seen = calloc((size_t)nservers, 1);
    for (int i = 0; i < nservers; i++)
        todo[i] = i;
    ntodo = nservers;
    int listed = 0, rounds = 0;
    for (; rounds < 6 && ntodo > 0; rounds++) {
        pthread_t th[2];
        struct reg_arg ra[2] = {{0}, {0}};
        atomic_store(&next_wave, 0);
        for (int i = 0; i < 2; i++)
            pthread_create(&th[i], NULL, reg_thread, &ra[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        if (!t_dance)
            t_dance = now_us();
        /* wait until the list stops growing (at most 30 s), then dance the missing again */
        int64_t t_wait = now_us();
        int last = -1, still = 0;
        while (now_us() - t_wait < 30000000) {
            memset(seen, 0, (size_t)nservers);
            listed = count_listed(seen);
            if (listed >= nservers)
                break;
            still = listed == last ? still + 1 : 0;
            if (still >= 100)
                break;
            last = listed;
            struct timespec ts = {0, 2 * 1000000L};
            nanosleep(&ts, NULL);
        }
        ntodo = 0;
        for (int i = 0; i < nservers; i++)
            if (!seen[i])
                todo[ntodo++] = i;
    }
    int64_t t_visible = now_us();
    /* CPU each side spent per registration (the master, its Redis, this generator): on a
     * machine whose cores are all busy, what one side spends the other cannot */
    long long cpu_m = cpu_us(pid) - cpu_m0, cpu_r = redis_pid ? cpu_us(redis_pid) - cpu_r0 : 0;
    long long cpu_g = cpu_us(getpid()) - cpu_g0;
    long amp_bytes = answer_bytes;
    double dance = (double)atomic_load(&info_sent) / ((double)(t_dance - t0) / 1e6);
    double reg = listed >= nservers ? nservers / ((double)(t_visible - t0) / 1e6) : 0;
    struct timespec settle = {0, 300 * 1000000L};
    nanosleep(&settle, NULL);
    long rss1 = rss_kb();
    long long red1 = redis_used();
    double mem_proc = (double)(rss1 - rss0) * 1024 / nservers;
    double mem_redis = (double)(red1 - red0) / nservers;
    double mem = mem_proc + mem_redis;

    double q1, q1p50, q1p99, q8, q8p50, q8p99, hb50 = -1, hb99 = -1, d0, d1;
    int bad1, bad8;
    run_queries(1, &q1, &q1p50, &q1p99, &bad1, 0, &d0, &d1);
    run_queries(8, &q8, &q8p50, &q8p99, &bad8, 1, &hb50, &hb99);
    printf("label=%s servers=%d listed=%d rounds=%d reg_per_s=%.0f dance_per_s=%.0f q1_per_s=%.0f "
           "q1_p50_ms=%.3f q1_p99_ms=%.3f q8_per_s=%.0f q8_p50_ms=%.3f q8_p99_ms=%.3f "
           "hb_p50_ms=%.3f hb_p99_ms=%.3f mem_per_server_b=%.0f mem_proc_b=%.0f mem_redis_b=%.0f "
           "bad_answers=%d query_bytes=%zu answer_bytes=%ld hb_retries=%ld hb_gave_up=%ld "
           "dance_ms=%.0f visible_ms=%.0f cpu_master_us=%.2f cpu_redis_us=%.2f cpu_side_us=%.2f "
           "cpu_gen_us=%.2f\n",
           label, nservers, listed, rounds, reg, dance, q1, q1p50, q1p99, q8, q8p50, q8p99, hb50, hb99,
           mem, mem_proc, mem_redis, bad1 + bad8, sizeof QUERY - 1, amp_bytes,
           atomic_load(&hb_retries), atomic_load(&hb_gave_up), (double)(t_dance - t0) / 1e3,
           (double)(t_visible - t0) / 1e3, (double)cpu_m / nservers, (double)cpu_r / nservers,
           (double)(cpu_m + cpu_r) / nservers, (double)cpu_g / nservers);
    free(seen);
    free(todo);
    return listed >= nservers ? 0 : 1;
}
