/* gameproc: a sample game server for bigbrother. The loop, top to bottom:
 *
 *   poll(signalfd, supervisor connection, module fds; timeout = time to next tick)
 *   -> signals (SIGTERM/SIGINT: graceful stop)
 *   -> supervisor requests (SHUTDOWN: graceful stop, DRAIN)
 *   -> module fds (the UDP query port)
 *   -> when due, one tick: fault injection, READY after the slow start, the hooks,
 *      heartbeat and status to the supervisor, the end of a graceful stop.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "gameproc.h"
#include "sdlog.h"
#include "sdutil.h"

/* The modules called every tick, in order. Player simulation and master-list
 * heartbeats plug in here as one line each. */
static const gp_hook_t gp_hooks[] = {
    { "query", gp_query_start, NULL, gp_query_stop },
};
#define GP_NHOOKS (sizeof gp_hooks / sizeof gp_hooks[0])

static struct {
    int fd;
    gp_fd_cb cb;
    void *arg;
} watches[GP_MAX_WATCH];
static int nwatches;

int gp_watch(gp_t *gp, int fd, gp_fd_cb cb, void *arg)
{
    if (nwatches >= GP_MAX_WATCH)
        return -ENOSPC;
    watches[nwatches].fd = fd;
    watches[nwatches].cb = cb;
    watches[nwatches].arg = arg;
    nwatches++;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: gameproc [options]\n"
            "  --name NAME          server name (default gameproc)\n"
            "  --map NAME           map name (default gp_arena)\n"
            "  --tick-hz N          ticks per second, 1..1000 (default 20)\n"
            "  --players N          players on the server (default 0)\n"
            "  --max-players M      player slots (default 16)\n"
            "  --udp-port [HOST:]P  answer Quake III getstatus/getinfo and Valve A2S_INFO\n"
            "                       queries on HOST (default 127.0.0.1) port P\n"
            "  --a2s-challenge      answer A2S_INFO only after the challenge round trip\n"
            "  --notify             speak sd_notify on $NOTIFY_SOCKET instead of libbbagent\n"
            "  --no-agent           talk to no supervisor at all\n"
            "  --save-ms N          time \"saving players\" takes on a graceful stop (default 0)\n"
            "  --log-level LEVEL    debug, info, warn or error (default info)\n"
            "fault injection (S: seconds, decimals allowed):\n"
            "  --slow-start S       wait S before saying READY\n"
            "  --hang-after S       stop ticking and heartbeating forever after S\n"
            "  --crash-after S      abort() (SIGABRT) after S, or exit with --exit-code\n"
            "  --exit-code N        with --crash-after: exit(N) instead of abort()\n"
            "  --ignore-term        ignore SIGTERM and SHUTDOWN requests\n");
}

static int parse_seconds(const char *s, int64_t *ms)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0 || v > 31536000.0)
        return -EINVAL;
    *ms = (int64_t)llround(v * 1000.0);
    return 0;
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > GP_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        /* Quake III info strings cannot carry '\\', '"' or ';'. */
        if (c < 0x20 || c > 0x7e || c == '\\' || c == '"' || c == ';')
            return 0;
    }
    return 1;
}

static void parse_args(gp_t *gp, int argc, char **argv)
{
    enum { O_NAME = 256, O_MAP, O_TICK, O_PLAYERS, O_MAXP, O_UDP, O_A2SCH, O_NOTIFY,
           O_NOAGENT, O_SAVE, O_LOGLVL, O_SLOW, O_HANG, O_CRASH, O_EXIT, O_IGNTERM, O_HELP };
    /* In the same order as the enum: "bad option" names opts[c - O_NAME]. */
    static const struct option opts[] = {
        { "name", required_argument, NULL, O_NAME },
        { "map", required_argument, NULL, O_MAP },
        { "tick-hz", required_argument, NULL, O_TICK },
        { "players", required_argument, NULL, O_PLAYERS },
        { "max-players", required_argument, NULL, O_MAXP },
        { "udp-port", required_argument, NULL, O_UDP },
        { "a2s-challenge", no_argument, NULL, O_A2SCH },
        { "notify", no_argument, NULL, O_NOTIFY },
        { "no-agent", no_argument, NULL, O_NOAGENT },
        { "save-ms", required_argument, NULL, O_SAVE },
        { "log-level", required_argument, NULL, O_LOGLVL },
        { "slow-start", required_argument, NULL, O_SLOW },
        { "hang-after", required_argument, NULL, O_HANG },
        { "crash-after", required_argument, NULL, O_CRASH },
        { "exit-code", required_argument, NULL, O_EXIT },
        { "ignore-term", no_argument, NULL, O_IGNTERM },
        { "help", no_argument, NULL, O_HELP },
        { NULL, 0, NULL, 0 },
    };
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case O_NAME:
            if (!name_ok(optarg))
                bad = "1-63 printable characters without \\ \" ;";
            else
                sd_strlcpy(gp->name, optarg, sizeof gp->name);
            break;
        case O_MAP:
            if (!name_ok(optarg))
                bad = "1-63 printable characters without \\ \" ;";
            gp->map = optarg;
            break;
        case O_TICK:
            if (sd_parse_i64(optarg, 1, 1000, &v))
                bad = "an integer in 1..1000";
            gp->tick_hz = (int)v;
            break;
        case O_PLAYERS:
            if (sd_parse_i64(optarg, 0, 100000, &v))
                bad = "an integer in 0..100000";
            gp->players = (int)v;
            break;
        case O_MAXP:
            if (sd_parse_i64(optarg, 0, 100000, &v))
                bad = "an integer in 0..100000";
            gp->max_players = (int)v;
            break;
        case O_UDP:
            gp->udp_listen = optarg;
            break;
        case O_A2SCH:
            gp->a2s_challenge = 1;
            break;
        case O_NOTIFY:
            gp->use_notify = 1;
            break;
        case O_NOAGENT:
            gp->no_agent = 1;
            break;
        case O_SAVE:
            if (sd_parse_i64(optarg, 0, 3600000, &v))
                bad = "an integer in 0..3600000";
            gp->save_ms = v;
            break;
        case O_LOGLVL: {
            int lvl = sd_log_parse_level(optarg);
            if (lvl < 0)
                bad = "debug, info, warn or error";
            else
                sd_log_set_level((enum sd_log_level)lvl);
            break;
        }
        case O_SLOW:
            if (parse_seconds(optarg, &gp->slow_start_ms))
                bad = "seconds >= 0";
            break;
        case O_HANG:
            if (parse_seconds(optarg, &gp->hang_after_ms))
                bad = "seconds >= 0";
            break;
        case O_CRASH:
            if (parse_seconds(optarg, &gp->crash_after_ms))
                bad = "seconds >= 0";
            break;
        case O_EXIT:
            if (sd_parse_i64(optarg, 0, 255, &v))
                bad = "an integer in 0..255";
            gp->exit_code = (int)v;
            break;
        case O_IGNTERM:
            gp->ignore_term = 1;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(SD_EXIT_USAGE);
        }
        if (bad)
            sd_die(SD_EXIT_USAGE, "bad option", "option=%s value=%s want=%s",
                   opts[c - O_NAME].name, optarg, bad);
    }
    if (optind < argc)
        sd_die(SD_EXIT_USAGE, "unexpected argument", "arg=%s", argv[optind]);
    if (gp->players > gp->max_players)
        sd_die(SD_EXIT_USAGE, "bad option", "option=players value=%d want=%s", gp->players,
               "at most --max-players");
    if (gp->exit_code >= 0 && gp->crash_after_ms < 0)
        sd_die(SD_EXIT_USAGE, "bad option", "option=exit-code want=%s",
               "--crash-after with it");
    if (gp->use_notify && gp->no_agent)
        sd_die(SD_EXIT_USAGE, "bad option", "option=notify want=%s", "not with --no-agent");
}

/* Blocks the stop signals (they arrive through the signalfd) after putting back their
 * default dispositions: a parent may have left SIGTERM ignored, and an ignored signal is
 * discarded instead of queued. Everything else, SIGABRT included, is unblocked. */
static int signals_open(void)
{
    static const int sigs[] = { SIGTERM, SIGINT, SIGHUP };
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        signal(sigs[i], SIG_DFL);
        sigaddset(&set, sigs[i]);
    }
    signal(SIGPIPE, SIG_IGN);
    if (sigprocmask(SIG_SETMASK, &set, NULL) < 0)
        return -errno;
    int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

static void signals_read(gp_t *gp, int fd)
{
    struct signalfd_siginfo si;
    for (int i = 0; i < 16 && read(fd, &si, sizeof si) == (ssize_t)sizeof si; i++) {
        const char *name = si.ssi_signo == SIGTERM ? "SIGTERM"
                           : si.ssi_signo == SIGINT ? "SIGINT" : "SIGHUP";
        if (si.ssi_signo == SIGHUP) {
            log_info("signal ignored", "signal=%s", name);
            continue;
        }
        if (gp->ignore_term) {
            log_warn("ignoring stop signal", "signal=%s sender_pid=%u", name, si.ssi_pid);
            continue;
        }
        gp_begin_stop(gp, name, -1);
    }
}

void gp_begin_stop(gp_t *gp, const char *why, int grace_ms)
{
    if (gp->ignore_term) {
        log_warn("ignoring stop request", "from=%s", why);
        return;
    }
    if (gp->stopping)
        return;
    int64_t save = gp->save_ms;
    if (grace_ms >= 0 && save > grace_ms / 2)
        save = grace_ms / 2;
    gp->stopping = 1;
    gp->stop_at_ms = sd_mono_ms() + save;
    log_info("saving players", "players=%d reason=%s grace_ms=%d save_ms=%lld", gp->players,
             why, grace_ms, (long long)save);
    gp_sup_stopping(gp);
}

static void gp_exit(gp_t *gp, int code, const char *reason)
{
    for (size_t i = GP_NHOOKS; i-- > 0;)
        if (gp_hooks[i].stop)
            gp_hooks[i].stop(gp);
    gp_sup_close(gp, reason);
    log_info("stopped", "reason=%s code=%d ticks=%llu", reason, code,
             (unsigned long long)gp->ticks);
    exit(code);
}

/* A hang as the supervisor sees one: no more ticks, no heartbeats, no answers, stop
 * signals left pending. Only an unblocked signal (SIGABRT, SIGKILL) ends it. */
static void __attribute__((noreturn)) hang_forever(void)
{
    for (;;)
        pause();
}

static void faults_check(gp_t *gp, int64_t up_ms)
{
    if (gp->crash_after_ms >= 0 && up_ms >= gp->crash_after_ms) {
        if (gp->exit_code >= 0) {
            log_error("crashing", "how=exit code=%d up_ms=%lld", gp->exit_code,
                      (long long)up_ms);
            exit(gp->exit_code);
        }
        log_error("crashing", "how=abort up_ms=%lld", (long long)up_ms);
        abort();
    }
    if (gp->hang_after_ms >= 0 && up_ms >= gp->hang_after_ms) {
        log_error("hanging", "up_ms=%lld ticks=%llu", (long long)up_ms,
                  (unsigned long long)gp->ticks);
        hang_forever();
    }
}

static void tick(gp_t *gp, int64_t now)
{
    int64_t up = now - gp->started_ms;
    gp->ticks++;
    faults_check(gp, up);
    if (!gp->ready && up >= gp->slow_start_ms) {
        gp->ready = 1;
        gp_sup_ready(gp);
        log_info("ready", "name=%s map=%s players=%d max_players=%d startup_ms=%lld",
                 gp->name, gp->map, gp->players, gp->max_players, (long long)up);
    }
    for (size_t i = 0; i < GP_NHOOKS; i++)
        if (gp_hooks[i].tick)
            gp_hooks[i].tick(gp, now);
    gp_sup_tick(gp, now);
    if (gp->stopping && now >= gp->stop_at_ms)
        gp_exit(gp, 0, "shutdown");
}

int main(int argc, char **argv)
{
    static gp_t gp = {
        .name = "gameproc", .map = "gp_arena", .tick_hz = 20, .max_players = 16,
        .hang_after_ms = -1, .crash_after_ms = -1, .exit_code = -1, .udp_fd = -1,
    };
    parse_args(&gp, argc, argv);
    gp.started_ms = sd_mono_ms();

    int sigfd = signals_open();
    if (sigfd < 0)
        sd_die(SD_EXIT_SYSTEM, "signalfd failed", "err=%s", strerror(-sigfd));
    if (gp_sup_open(&gp) < 0)
        sd_die(SD_EXIT_SYSTEM, "supervisor link failed", "err=%s", strerror(errno));
    for (size_t i = 0; i < GP_NHOOKS; i++) {
        int r = gp_hooks[i].start ? gp_hooks[i].start(&gp) : 0;
        if (r < 0)
            sd_die(SD_EXIT_SYSTEM, "start-up failed", "module=%s err=%s", gp_hooks[i].name,
                   strerror(-r));
    }
    log_info("started", "pid=%d name=%s tick_hz=%d supervisor=%s udp_port=%d", (int)getpid(),
             gp.name, gp.tick_hz,
             gp_sup_kind(&gp),
             gp.udp_port);

    const int64_t period_us = 1000000 / gp.tick_hz;
    int64_t next_us = sd_mono_us();
    for (;;) {
        struct pollfd p[2 + GP_MAX_WATCH];
        int n = 0;
        p[n++] = (struct pollfd){ .fd = sigfd, .events = POLLIN };
        int supfd = gp_sup_fd(&gp);
        p[n++] = (struct pollfd){ .fd = supfd, .events = POLLIN }; /* fd < 0: skipped */
        for (int i = 0; i < nwatches; i++)
            p[n++] = (struct pollfd){ .fd = watches[i].fd, .events = POLLIN };

        int64_t now_us = sd_mono_us();
        int timeout = next_us > now_us ? (int)((next_us - now_us + 999) / 1000) : 0;
        if (poll(p, (nfds_t)n, timeout) < 0 && errno != EINTR)
            sd_die(SD_EXIT_SYSTEM, "poll failed", "err=%s", strerror(errno));

        if (p[0].revents)
            signals_read(&gp, sigfd);
        if (p[1].revents)
            gp_sup_events(&gp);
        for (int i = 0; i < nwatches; i++)
            if (p[2 + i].revents)
                watches[i].cb(&gp, watches[i].arg);

        now_us = sd_mono_us();
        if (now_us >= next_us) {
            gp_sup_events(&gp);
            tick(&gp, now_us / 1000);
            next_us += period_us;
            /* Late by more than a few ticks (the machine was busy): do not try to
             * catch up with a burst, start counting again from now. */
            if (now_us - next_us > 4 * period_us)
                next_us = now_us + period_us;
        }
    }
}
