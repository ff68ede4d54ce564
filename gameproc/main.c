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
#include "sdproto.h"
#include "sdutil.h"

/* The modules called every tick, in order (stopped in reverse order: the master link
 * still has the query socket for its last heartbeat). */
static const gp_hook_t gp_hooks[] = {
    { "credential", gp_cred_start, gp_cred_tick, NULL }, /* first: the others' token */
    { "query", gp_query_start, NULL, gp_query_stop },
    { "players", gp_players_start, gp_players_tick, gp_players_stop },
    { "master", gp_master_start, gp_master_tick, gp_master_stop },
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
            "  --meta TEXT          key=value pairs appended to the status line (what\n"
            "                       allocation selectors match), e.g. \"mode=ctf tier=2\"\n"
            "ServerDir (URLs and token also from $SERVERDIR_URL and $SERVERDIR_TOKEN):\n"
            "  --serverdir URLS     ServerDir base URLs, comma-separated\n"
            "  --token TOKEN        shared bearer token (role game), the weaker option\n"
            "  --credential MODE    the instance credential Big Brother hands over (agent,\n"
            "                       else $SERVERDIR_CREDENTIAL_FILE) as the bearer token:\n"
            "                       prefer (default: it when there, else --token), required\n"
            "                       (never --token), off (always --token)\n"
            "  --credential-wait-ms N  wait this long for the first credential before the\n"
            "                       first lock or heartbeat (default 10000; prefer then uses\n"
            "                       --token, required goes on waiting)\n"
            "  with --serverdir, --players N simulates N players: each locks its key (holder:\n"
            "  $BB_INSTANCE, else --name), loads its blob, plays, saves, releases on leave\n"
            "  --player-keys A-B    player keys player:A..player:B (default 1-N)\n"
            "  --save-every-ms N    save every player this often (default 5000)\n"
            "  --session-s S        a player leaves after about S (0.5-1.5 S) and another\n"
            "                       arrives (default: stays)\n"
            "  --master-rest        announce to ServerDir's master list (needs --udp-port)\n"
            "  --master-udp H:P     DarkPlaces heartbeats to the UDP master at H:P (needs --udp-port)\n"
            "  --master-interval-s S  heartbeat interval (default 300)\n"
            "  --region R           region announced to the master list\n"
            "  --tags A,B           tags announced to the master list\n"
            "  --log-level LEVEL    debug, info, warn or error (default info)\n"
            "fault injection (S: seconds, decimals allowed):\n"
            "  --slow-start S       wait S before saying READY\n"
            "  --hang-after S       stop ticking and heartbeating forever after S\n"
            "  --crash-after S      abort() (SIGABRT) after S, or exit with --exit-code\n"
            "  --exit-code N        with --crash-after: exit(N) instead of abort()\n"
            "  --ignore-term        ignore SIGTERM and SHUTDOWN requests\n"
            "  --release-after-ms N end each allocated session N ms after it was handed\n"
            "                       over (bbagent_release)\n");
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

/* "A-B" with 1 <= A <= B. */
static int parse_range(const char *s, int64_t *a, int64_t *b)
{
    char buf[32];
    const char *dash = strchr(s, '-');
    if (!dash || (size_t)(dash - s) >= sizeof buf)
        return -EINVAL;
    memcpy(buf, s, (size_t)(dash - s));
    buf[dash - s] = '\0';
    if (sd_parse_i64(buf, 1, 999999999, a) || sd_parse_i64(dash + 1, 1, 999999999, b) ||
        *a > *b)
        return -EINVAL;
    return 0;
}

/* --meta: printable ASCII, the status line is shown and matched as text. */
static int meta_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > GP_META_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

static int tags_ok(const char *s)
{
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return 0;
    sd_strlcpy(buf, s, sizeof buf);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), n++)
        if (!sd_name_valid(t, 32) || n >= 8)
            return 0;
    return n > 0;
}

/* The ServerDir side of the options: the environment fills what the flags left out,
 * the player simulation takes over --players, and the combinations are checked. */
static void serverdir_opts(gp_t *gp)
{
    const char *e;
    if (!gp->sd_urls && (e = getenv("SERVERDIR_URL")) && *e)
        gp->sd_urls = e;
    if (!gp->sd_token && (e = getenv("SERVERDIR_TOKEN")) && *e)
        gp->sd_token = e;
    e = getenv("BB_INSTANCE");
    sd_strlcpy(gp->instance, e && *e ? e : gp->name, sizeof gp->instance);
    if ((gp->master_rest || gp->master_udp) && !gp->udp_listen)
        sd_die(SD_EXIT_USAGE, "bad option", "option=%s want=%s",
               gp->master_rest ? "master-rest" : "master-udp", "--udp-port with it");
    if (gp->master_rest && !gp->sd_urls)
        sd_die(SD_EXIT_USAGE, "bad option", "option=master-rest want=%s",
               "--serverdir or $SERVERDIR_URL");
    if (!gp->sd_urls || gp->players == 0)
        return;
    if (!sd_name_valid(gp->instance, GP_NAME_MAX))
        sd_die(SD_EXIT_USAGE, "bad option", "option=name value=%s want=%s", gp->instance,
               "a lock holder name (letters, digits, _ . - : @) for the player simulation");
    if (gp->key_first == 0) {
        gp->key_first = 1;
        gp->key_last = gp->players;
    }
    if (gp->key_last - gp->key_first + 1 < gp->players)
        sd_die(SD_EXIT_USAGE, "bad option", "option=player-keys want=%s",
               "at least --players keys");
    gp->sim_players = gp->players;
    gp->players = 0; /* counted as they arrive */
}

static void parse_args(gp_t *gp, int argc, char **argv)
{
    enum { O_NAME = 256, O_MAP, O_TICK, O_PLAYERS, O_MAXP, O_UDP, O_A2SCH, O_NOTIFY,
           O_NOAGENT, O_SAVE, O_LOGLVL, O_SLOW, O_HANG, O_CRASH, O_EXIT, O_IGNTERM, O_SD,
           O_TOKEN, O_KEYS, O_SAVE_EVERY, O_SESSION, O_MREST, O_MUDP, O_MINT, O_REGION,
           O_TAGS, O_META, O_RELEASE, O_CRED, O_CRED_WAIT, O_HELP };
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
        { "serverdir", required_argument, NULL, O_SD },
        { "token", required_argument, NULL, O_TOKEN },
        { "player-keys", required_argument, NULL, O_KEYS },
        { "save-every-ms", required_argument, NULL, O_SAVE_EVERY },
        { "session-s", required_argument, NULL, O_SESSION },
        { "master-rest", no_argument, NULL, O_MREST },
        { "master-udp", required_argument, NULL, O_MUDP },
        { "master-interval-s", required_argument, NULL, O_MINT },
        { "region", required_argument, NULL, O_REGION },
        { "tags", required_argument, NULL, O_TAGS },
        { "meta", required_argument, NULL, O_META },
        { "release-after-ms", required_argument, NULL, O_RELEASE },
        { "credential", required_argument, NULL, O_CRED },
        { "credential-wait-ms", required_argument, NULL, O_CRED_WAIT },
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
        case O_SD:
            gp->sd_urls = optarg;
            break;
        case O_TOKEN:
            gp->sd_token = optarg;
            break;
        case O_CRED:
            if (!strcmp(optarg, "prefer"))
                gp->cred_mode = GP_CRED_PREFER;
            else if (!strcmp(optarg, "off"))
                gp->cred_mode = GP_CRED_OFF;
            else if (!strcmp(optarg, "required"))
                gp->cred_mode = GP_CRED_REQUIRED;
            else
                bad = "off, prefer or required";
            break;
        case O_CRED_WAIT:
            if (sd_parse_i64(optarg, 0, 3600000, &v))
                bad = "an integer in 0..3600000";
            gp->cred_wait_ms = v;
            break;
        case O_KEYS:
            if (parse_range(optarg, &gp->key_first, &gp->key_last))
                bad = "A-B with 1 <= A <= B <= 999999999";
            break;
        case O_SAVE_EVERY:
            if (sd_parse_i64(optarg, 100, 3600000, &v))
                bad = "an integer in 100..3600000";
            gp->save_every_ms = v;
            break;
        case O_SESSION:
            if (parse_seconds(optarg, &gp->session_ms))
                bad = "seconds >= 0";
            break;
        case O_MREST:
            gp->master_rest = 1;
            break;
        case O_MUDP:
            gp->master_udp = optarg;
            break;
        case O_MINT:
            if (parse_seconds(optarg, &gp->master_every_ms) || gp->master_every_ms < 100)
                bad = "seconds >= 0.1";
            break;
        case O_REGION:
            if (!sd_name_valid(optarg, 64))
                bad = "a name of 1-64 letters, digits, _ . - : @";
            gp->region = optarg;
            break;
        case O_TAGS:
            if (!tags_ok(optarg))
                bad = "comma-separated names";
            gp->tags = optarg;
            break;
        case O_META:
            if (!meta_ok(optarg))
                bad = "1-" SD_STR(GP_META_MAX) " printable characters";
            gp->meta = optarg;
            break;
        case O_RELEASE:
            if (sd_parse_i64(optarg, 0, 86400000, &v))
                bad = "an integer in 0..86400000";
            gp->release_after_ms = v;
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
    serverdir_opts(gp);
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
    /* Real saves (players.c) may take longer than the simulated time: wait for them,
     * but leave the supervisor's grace for the rest of the way out. */
    int64_t bound = grace_ms >= 0 ? grace_ms / 2 : GP_STOP_WAIT_MS;
    gp->stop_deadline_ms = sd_mono_ms() + (bound > save ? bound : save);
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
    if (gp->stopping && now >= gp->stop_at_ms) {
        if (gp->stop_pending == 0)
            gp_exit(gp, 0, "shutdown");
        if (now >= gp->stop_deadline_ms) {
            log_warn("stop deadline reached with work pending", "pending=%d",
                     gp->stop_pending);
            gp_exit(gp, 0, "shutdown");
        }
    }
}

int main(int argc, char **argv)
{
    static gp_t gp = {
        .name = "gameproc", .map = "gp_arena", .tick_hz = 20, .max_players = 16,
        .hang_after_ms = -1, .crash_after_ms = -1, .release_after_ms = -1, .release_at_ms = -1, .exit_code = -1, .udp_fd = -1,
        .save_every_ms = 5000, .master_every_ms = 300000, .cred_wait_ms = 10000,
    };
    parse_args(&gp, argc, argv);
    gp.started_ms = sd_mono_ms();

    int sigfd = signals_open();
    if (sigfd < 0)
        sd_die(SD_EXIT_SYSTEM, "signalfd failed", "err=%s", strerror(-sigfd));
    if (gp_sup_open(&gp) < 0)
        sd_die(SD_EXIT_SYSTEM, "supervisor link failed", "err=%s", strerror(errno));
    for (size_t i = 0; i < GP_NHOOKS; i++) {
        gp_bad_option_t bad = {0};
        int r = gp_hooks[i].start ? gp_hooks[i].start(&gp, &bad) : 0;
        if (r < 0 && bad.option)
            sd_die(SD_EXIT_USAGE, "bad option", "option=%s value=%s want=%s", bad.option,
                   bad.value, bad.want);
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
