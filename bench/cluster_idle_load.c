/* Load generator of bench/cluster_idle_bench.sh: N simulated machines against one
 * serverdir, each renewing its machine lease every LEASE_MS and either long-polling its
 * assignments (mode longpoll: ?version=V&wait=WAIT_MS, re-issued as soon as it answers)
 * or polling them (mode poll: a plain GET every POLL_MS, the anchor). One thread, one
 * curl multi handle, two connections per machine. After WARMUP s it counts answers for
 * DUR s and reads the CPU time of the given pids (serverdir, redis) over the same window.
 *
 * usage: cluster_idle_load URL TOKEN CLUSTER N MODE WARMUP DUR LEASE_MS WAIT_MS POLL_MS
 *                          PID_SD PID_REDIS
 * prints: leases_per_s longpolls_per_s polls_per_s errors cpu_sd_pct cpu_redis_pct */
#include <curl/curl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sdutil.h"

typedef struct {
    CURL *h;
    int busy;
    int64_t next_ms;
    char body[4096];
    size_t len;
} xfer_t;

typedef struct {
    xfer_t lease, poll;
    long long version;
} machine_t;

static size_t sink(char *p, size_t n, size_t m, void *u)
{
    xfer_t *x = u;
    size_t k = n * m;
    size_t room = sizeof x->body - 1 - x->len;
    size_t c = k < room ? k : room;
    memcpy(x->body + x->len, p, c);
    x->len += c;
    x->body[x->len] = '\0';
    return k;
}

/* utime + stime of pid in seconds. */
static double cpu_s(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (p)
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int main(int argc, char **argv)
{
    if (argc != 13) {
        fprintf(stderr, "usage: cluster_idle_load URL TOKEN CLUSTER N MODE WARMUP DUR LEASE_MS "
                        "WAIT_MS POLL_MS PID_SD PID_REDIS\n");
        return 2;
    }
    const char *url = argv[1], *cluster = argv[3];
    int n = atoi(argv[4]), longpoll = !strcmp(argv[5], "longpoll");
    int64_t warmup = atoi(argv[6]) * 1000LL, dur = atoi(argv[7]) * 1000LL;
    int lease_ms = atoi(argv[8]), wait_ms = atoi(argv[9]), poll_ms = atoi(argv[10]);
    int pid_sd = atoi(argv[11]), pid_redis = atoi(argv[12]);
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", argv[2]);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURLM *multi = curl_multi_init();
    struct curl_slist *hl = curl_slist_append(NULL, auth);
    hl = curl_slist_append(hl, "Content-Type: application/json");
    machine_t *ms = calloc((size_t)n, sizeof *ms);
    int64_t t0 = sd_mono_ms();
    srand(42);
    for (int i = 0; i < n; i++) {
        ms[i].lease.h = curl_easy_init();
        ms[i].poll.h = curl_easy_init();
        ms[i].lease.next_ms = t0 + rand() % lease_ms;
        ms[i].poll.next_ms = t0 + rand() % (longpoll ? 1000 : poll_ms);
        ms[i].version = -1;
    }
    int64_t w0 = t0 + warmup, w1 = w0 + dur;
    long long leases = 0, longpolls = 0, polls = 0, errors = 0;
    double sd0 = 0, rd0 = 0;
    int measuring = 0;
    for (;;) {
        int64_t now = sd_mono_ms();
        if (!measuring && now >= w0) {
            measuring = 1;
            sd0 = cpu_s(pid_sd);
            rd0 = cpu_s(pid_redis);
        }
        if (now >= w1)
            break;
        for (int i = 0; i < n; i++) {
            machine_t *m = &ms[i];
            char u[512];
            if (!m->lease.busy && now >= m->lease.next_ms) {
                snprintf(u, sizeof u, "%s/v1/clusters/%s/machines/bench-m%d", url, cluster, i);
                CURL *h = m->lease.h;
                curl_easy_setopt(h, CURLOPT_URL, u);
                curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
                curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{\"ttl_ms\":15000,\"capacity\":400}");
                curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
                curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
                curl_easy_setopt(h, CURLOPT_WRITEDATA, &m->lease);
                curl_easy_setopt(h, CURLOPT_PRIVATE, &m->lease);
                curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
                m->lease.len = 0;
                m->lease.busy = 1;
                m->lease.next_ms = now + lease_ms;
                curl_multi_add_handle(multi, h);
            }
            if (!m->poll.busy && now >= m->poll.next_ms) {
                /* The first long-poll of each machine waits a random part of WAIT_MS so
                 * the answers are spread over time as in a cluster that has run a while. */
                int w = m->version < 0 ? 1000 + rand() % wait_ms : wait_ms;
                if (longpoll && m->version >= 0)
                    snprintf(u, sizeof u,
                             "%s/v1/clusters/%s/machines/bench-m%d/assignments?version=%lld&wait=%d",
                             url, cluster, i, m->version, w);
                else if (longpoll)
                    snprintf(u, sizeof u,
                             "%s/v1/clusters/%s/machines/bench-m%d/assignments?version=0&wait=%d",
                             url, cluster, i, w);
                else
                    snprintf(u, sizeof u, "%s/v1/clusters/%s/machines/bench-m%d/assignments", url,
                             cluster, i);
                if (longpoll && m->version < 0)
                    m->version = 0;
                CURL *h = m->poll.h;
                curl_easy_setopt(h, CURLOPT_URL, u);
                curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
                curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
                curl_easy_setopt(h, CURLOPT_WRITEDATA, &m->poll);
                curl_easy_setopt(h, CURLOPT_PRIVATE, &m->poll);
                curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)wait_ms + 10000L);
                m->poll.len = 0;
                m->poll.busy = 1;
                m->poll.next_ms = longpoll ? now : now + poll_ms;
                curl_multi_add_handle(multi, h);
            }
        }
        int running;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            xfer_t *x;
            long st = 0;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &st);
            int ok = msg->data.result == CURLE_OK && st == 200;
            curl_multi_remove_handle(multi, msg->easy_handle);
            x->busy = 0;
            int64_t t = sd_mono_ms();
            int in_window = t >= w0 && t < w1;
            machine_t *m = NULL;
            for (int i = 0; i < n && !m; i++)
                if (&ms[i].lease == x || &ms[i].poll == x)
                    m = &ms[i];
            if (!ok) {
                errors += in_window;
                x->next_ms = t + 1000;
                continue;
            }
            if (x == &m->lease) {
                leases += in_window;
            } else {
                if (longpoll)
                    longpolls += in_window;
                else
                    polls += in_window;
                const char *v = strstr(x->body, "\"version\":");
                if (v)
                    m->version = strtoll(v + 10, NULL, 10);
            }
        }
        curl_multi_poll(multi, NULL, 0, 10, NULL);
    }
    double sd = cpu_s(pid_sd) - sd0, rd = cpu_s(pid_redis) - rd0, secs = (double)dur / 1000.0;
    printf("%.1f %.1f %.1f %lld %.2f %.2f\n", (double)leases / secs, (double)longpolls / secs,
           (double)polls / secs, errors, 100.0 * sd / secs, 100.0 * rd / secs);
    for (int i = 0; i < n; i++) {
        curl_multi_remove_handle(multi, ms[i].lease.h);
        curl_multi_remove_handle(multi, ms[i].poll.h);
        curl_easy_cleanup(ms[i].lease.h);
        curl_easy_cleanup(ms[i].poll.h);
    }
    free(ms);
    curl_slist_free_all(hl);
    curl_multi_cleanup(multi);
    curl_global_cleanup();
    return 0;
}
