/* serverdir: the stateless HTTP/JSON directory service. See docs/design.md.
 *
 * Start-up order: defaults, then --config FILE, then flags; Redis connections are made
 * lazily per worker thread, so serverdir starts (and /healthz answers) while Redis is
 * down. The main thread only waits for signals: SIGHUP reloads the token file, SIGTERM
 * and SIGINT stop accepting and let in-flight requests finish. Under systemd (Type=notify)
 * it also reports READY=1 once listening, STOPPING=1 on the way out, and, when the unit
 * sets WatchdogSec, feeds the watchdog while the HTTP workers are not stuck (watchdog.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef SD_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "cluster.h"
#include "directory.h"
#include "http.h"
#include "locks.h"
#include "master.h"
#include "sd.h"
#include "sdnotify.h"
#include "sdversion.h"
#include "watchdog.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: serverdir [options]\n"
            "  --listen HOST:PORT   address to serve HTTP on (default 127.0.0.1:7700)\n"
            "  --redis URL          redis://[:pw@]host:port/db, unix:///path[?db=N] or\n"
            "                       sentinel://[:pw@]h1:p1,h2:p2/mastername[?db=N]\n"
            "                       (default redis://127.0.0.1:6379/0)\n"
            "  --tokens FILE        token file, `ROLE TOKEN` per line (default: open access)\n"
            "  --config FILE        JSON config file; flags override it\n"
            "  --threads N          handler threads: the requests that wait on Redis run there,\n"
            "                       one Redis connection each (default 8)\n"
            "  --http-threads N     HTTP threads, which never wait on Redis (default: one per\n"
            "                       online CPU, at most 16)\n"
            "  --master-udp HOST:PORT  serve the UDP master protocols there (repeatable)\n"
            "  --log-level LEVEL    debug, info, warn or error (default info)\n"
            "  --version, --help\n");
}

static void load_config_file(const char *path)
{
    char *text;
    size_t len;
    int rc = sd_read_file(path, 1 << 20, &text, &len);
    if (rc)
        sd_die(SD_EXIT_USAGE, "cannot read config", "file=%s err=%s", path,
               rc == -E2BIG ? "larger than 1 MiB" : strerror(-rc));
    char err[SD_ERRMSG_MAX];
    json_t *root = sd_json_parse(text, len, SD_JSON_MAX_DEPTH, err, sizeof err);
    free(text);
    int level;
    if (root && sd_config_apply(root, &sd_cfg, &level, err, sizeof err)) {
        json_decref(root);
        root = NULL;
    }
    if (!root)
        sd_die(SD_EXIT_USAGE, "bad config", "file=%s err=%s", path, err);
    if (level >= 0)
        sd_log_set_level((enum sd_log_level)level);
}

/* The connection limits of the config; the master list's trusted proxies are exempt
 * from the per-source limit (behind them every client has their address). */
static void conn_limits(sd_conn_limits_t *lim)
{
    memset(lim, 0, sizeof *lim);
    lim->max_total = sd_cfg.max_connections;
    lim->max_per_source = sd_cfg.max_connections_per_source;
    lim->header_timeout_ms = sd_cfg.header_timeout_ms;
    lim->body_timeout_ms = sd_cfg.body_timeout_ms;
    for (int i = 0; i < sd_master_cfg.ntrusted && lim->nexempt < SD_CONN_MAX_EXEMPT; i++) {
        struct sockaddr_storage *ss = &lim->exempt[lim->nexempt];
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET, sd_master_cfg.trusted[i], &in->sin_addr) == 1)
            in->sin_family = AF_INET;
        else if (inet_pton(AF_INET6, sd_master_cfg.trusted[i], &in6->sin6_addr) == 1)
            in6->sin6_family = AF_INET6;
        else
            continue;
        lim->nexempt++;
    }
}

/* Which malloc serverdir is built on, for its start line: "jemalloc-5.3.0" when linked
 * with it (SD_JEMALLOC, the default build), else "libc". (Under valgrind, valgrind's
 * own replaces either.) */
static const char *allocator(void)
{
#ifdef SD_JEMALLOC
    static char name[64];
    const char *v = NULL;
    size_t len = sizeof v;
    if (mallctl("version", &v, &len, NULL, 0) == 0 && v) {
        /* "5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c": the release */
        snprintf(name, sizeof name, "jemalloc-%.*s", (int)strcspn(v, "-"), v);
        return name;
    }
#endif
    return "libc";
}

int main(int argc, char **argv)
{
    enum { O_LISTEN = 1, O_REDIS, O_TOKENS, O_CONFIG, O_THREADS, O_HTTP_THREADS, O_LOG, O_MASTER_UDP, O_VERSION, O_HELP };
    static const struct option opts[] = {
        {"listen", required_argument, 0, O_LISTEN}, {"redis", required_argument, 0, O_REDIS},
        {"tokens", required_argument, 0, O_TOKENS}, {"config", required_argument, 0, O_CONFIG},
        {"threads", required_argument, 0, O_THREADS}, {"log-level", required_argument, 0, O_LOG},
        {"http-threads", required_argument, 0, O_HTTP_THREADS},
        {"master-udp", required_argument, 0, O_MASTER_UDP},
        {"version", no_argument, 0, O_VERSION},     {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};

    /* The config file goes first so that flags override it, wherever they stand. */
    for (int i = 1; i < argc - 1; i++)
        if (strcmp(argv[i], "--config") == 0)
            load_config_file(argv[i + 1]);

    /* --master-udp flags replace the config file's master.udp list. */
    const char *udp_flags[SD_MASTER_MAX_UDP];
    int nudp_flags = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int64_t v;
        switch (c) {
        case O_LISTEN: sd_strlcpy(sd_cfg.listen, optarg, sizeof sd_cfg.listen); break;
        case O_REDIS: sd_strlcpy(sd_cfg.redis, optarg, sizeof sd_cfg.redis); break;
        case O_TOKENS: sd_strlcpy(sd_cfg.tokens, optarg, sizeof sd_cfg.tokens); break;
        case O_CONFIG: break;
        case O_THREADS:
            if (sd_parse_i64(optarg, 1, 1024, &v))
                sd_die(SD_EXIT_USAGE, "bad flag", "flag=--threads err=%s", "must be 1-1024");
            sd_cfg.threads = (int)v;
            break;
        case O_HTTP_THREADS:
            if (sd_parse_i64(optarg, 1, 1024, &v))
                sd_die(SD_EXIT_USAGE, "bad flag", "flag=--http-threads err=%s", "must be 1-1024");
            sd_cfg.http_threads = (int)v;
            break;
        case O_LOG: {
            int l = sd_log_parse_level(optarg);
            if (l < 0)
                sd_die(SD_EXIT_USAGE, "bad flag", "flag=--log-level err=%s",
                       "must be debug, info, warn or error");
            sd_log_set_level((enum sd_log_level)l);
            break;
        }
        case O_MASTER_UDP: {
            char host[128];
            int port;
            if (sd_parse_hostport(optarg, host, sizeof host, &port))
                sd_die(SD_EXIT_USAGE, "bad flag", "flag=--master-udp err=%s", "must be HOST:PORT");
            if (nudp_flags == SD_MASTER_MAX_UDP)
                sd_die(SD_EXIT_USAGE, "bad flag", "flag=--master-udp err=%s", "at most 8 listeners");
            udp_flags[nudp_flags++] = optarg;
            break;
        }
        case O_VERSION: printf("serverdir %s\n", SD_VERSION); return 0;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return SD_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return SD_EXIT_USAGE;
    }

    if (sd_store_init(sd_cfg.redis, sd_cfg.key_prefix))
        sd_die(SD_EXIT_USAGE, "bad redis url", "url=%s want=%s", sd_cfg.redis,
               "redis://[:password@]host:port[/db], unix:///path[?db=N] or "
               "sentinel://[:password@]h1:p1,h2:p2/mastername[?db=N]");
    if (sd_auth_load(sd_cfg.tokens[0] ? sd_cfg.tokens : NULL))
        sd_die(SD_EXIT_USAGE, "cannot load tokens", "path=%s", sd_cfg.tokens);
    int nrc = sd_notify_init();
    if (nrc)
        log_warn("cannot talk to the service manager", "NOTIFY_SOCKET=%s err=%s",
                 getenv("NOTIFY_SOCKET"), strerror(-nrc));
    sd_metrics_init(sd_nroutes);
    sd_master_metrics_init();
    sd_alloc_metrics_init();
    sd_locks_log_config();

    /* Block the signals before any thread starts so only sigwait below sees them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = sd_store_start();
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot start the store", "err=%s", strerror(-rc));
    rc = sd_master_start();
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot start the master list", "err=%s", strerror(-rc));
    rc = sd_sweeper_start();
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot start the lost-machine sweep", "err=%s", strerror(-rc));
    sd_conn_limits_t lim;
    conn_limits(&lim);
    if (!sd_cfg.http_threads) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        sd_cfg.http_threads = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
    }
    rc = sd_http_start(sd_cfg.listen, sd_cfg.http_threads, sd_cfg.conn_timeout_s, &lim);
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot listen", "addr=%s err=%s", sd_cfg.listen, strerror(-rc));
    int nudp = nudp_flags ? nudp_flags : sd_master_cfg.nudp;
    for (int i = 0; i < nudp; i++) {
        const char *addr = nudp_flags ? udp_flags[i] : sd_master_cfg.udp[i];
        rc = sd_master_udp_start(addr);
        if (rc)
            sd_die(SD_EXIT_SYSTEM, "cannot listen", "addr=%s proto=%s err=%s", addr, "udp",
                   strerror(-rc));
    }
    log_info("serverdir started",
             "version=%s listen=%s port=%d redis=%s threads=%d http_threads=%d routes=%zu "
             "allocator=%s",
             SD_VERSION, sd_cfg.listen, sd_http_port(), sd_cfg.redis, sd_cfg.threads,
             sd_cfg.http_threads, sd_nroutes, allocator());

    sd_notify_send("READY=1\nSTATUS=serving on %s, %d threads, redis %s", sd_cfg.listen,
                   sd_cfg.threads, sd_cfg.redis);

    /* Wait for signals; with a watchdog, wake every half period to run the self-check. */
    int64_t wd_ms = sd_notify_watchdog_ms(), wd_next = sd_mono_ms() + wd_ms;
    for (;;) {
        int sig;
        if (wd_ms) {
            int64_t left = wd_next - sd_mono_ms();
            if (left <= 0) {
                /* stuck: half the ping period, at most 5 s; one slow request skips one
                 * ping, systemd acts only after two in a row */
                sd_watchdog_tick(wd_ms / 2 < 5000 ? wd_ms / 2 + 1 : 5000);
                wd_next += wd_ms;
                if (wd_next < sd_mono_ms())
                    wd_next = sd_mono_ms() + wd_ms;
                continue;
            }
            struct timespec ts = {left / 1000, (left % 1000) * 1000000};
            sig = sigtimedwait(&set, NULL, &ts);
            if (sig < 0)
                continue;
        } else if (sigwait(&set, &sig)) {
            continue;
        }
        if (sig == SIGHUP) {
            sd_notify_send("RELOADING=1\nSTATUS=reloading tokens");
            sd_log_msg(SD_LOG_INFO, "reloading tokens");
            sd_auth_reload();
            sd_notify_send("READY=1\nSTATUS=serving on %s, %d threads, redis %s", sd_cfg.listen,
                           sd_cfg.threads, sd_cfg.redis);
            continue;
        }
        log_info("stopping", "signal=%s", sig == SIGTERM ? "TERM" : "INT");
        sd_notify_send("STOPPING=1\nSTATUS=stopping on SIG%s, finishing in-flight requests",
                       sig == SIGTERM ? "TERM" : "INT");
        break;
    }
    sd_master_udp_stop();
    sd_http_stop(10000);
    sd_sweeper_stop();
    sd_master_stop();
    sd_store_stop();
    json_decref(sd_cfg.file);
    sd_log_msg(SD_LOG_INFO, "serverdir stopped");
    return 0;
}
