#include "harness.h"
#include "harness_rcluster.h"

#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *tmpdirs[256];
static int ntmpdirs;
static char *files[256];
static int nfiles;
static pid_t owner_pid;

char *h_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
        size_t got = fread(buf, 1, (size_t)n, f);
        buf[got] = '\0';
    }
    fclose(f);
    return buf;
}

int64_t h_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void h_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

/* Kills and reaps every child (and, as subreaper, every orphaned descendant). */
static void kill_descendants(void)
{
    for (int round = 0; round < 50; round++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", getpid(), getpid());
        FILE *f = fopen(path, "r");
        int any = 0;
        if (f) {
            int pid;
            while (fscanf(f, "%d", &pid) == 1) {
                any = 1;
                kill(-pid, SIGKILL);
                kill(pid, SIGKILL);
            }
            fclose(f);
        }
        while (waitpid(-1, NULL, WNOHANG) > 0)
            any = 1;
        if (!any)
            break;
        h_sleep_ms(20);
    }
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) < 0 ? 0 : 0;
}

static int sanitizer_reports;

/* Prints any sanitizer report found in a .log file under the test's temp dirs: a report
 * in a spawned daemon's log fails the test even though the daemon's exit was not seen. */
static int scan_log(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    size_t n = strlen(p);
    if (flag != FTW_F || sb->st_size <= 0)
        return 0;
    /* valgrind -q writes nothing unless it found an error or a definite leak. */
    int vg = n > 6 && strcmp(p + n - 6, ".vglog") == 0;
    if (!vg && (n < 4 || strcmp(p + n - 4, ".log")))
        return 0;
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    char line[1024];
    int printing = 0, printed = 0;
    while (fgets(line, sizeof line, f)) {
        if (vg || strstr(line, "ERROR: AddressSanitizer") || strstr(line, "ERROR: LeakSanitizer") ||
            strstr(line, "runtime error:") || strstr(line, "WARNING: ThreadSanitizer")) {
            if (!printing)
                fprintf(stderr, "harness: sanitizer report in %s:\n", p);
            printing = 1;
            sanitizer_reports++;
        }
        if (printing && printed++ < 60)
            fputs(line, stderr);
    }
    fclose(f);
    return 0;
}

static void cleanup(void)
{
    if (getpid() != owner_pid)
        return;
    kill_descendants();
    for (int i = 0; i < ntmpdirs; i++)
        nftw(tmpdirs[i], scan_log, 16, FTW_PHYS);
    if (getenv("H_KEEP_TMP") == NULL)
        for (int i = 0; i < ntmpdirs; i++)
            nftw(tmpdirs[i], rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    for (int i = 0; i < ntmpdirs; i++)
        free(tmpdirs[i]);
    for (int i = 0; i < nfiles; i++)
        free(files[i]);
    ntmpdirs = nfiles = 0;
    if (sanitizer_reports)
        _exit(1);
}

static void on_fatal_signal(int sig)
{
    static const char msg[] = "harness: watchdog or signal: killing test processes\n";
    if (sig == SIGALRM) {
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
    }
    cleanup();
    _exit(sig == SIGALRM ? 124 : 128 + sig);
}

void h_init(int timeout_s)
{
    owner_pid = getpid();
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    atexit(cleanup);
    struct sigaction sa = {0};
    sa.sa_handler = on_fatal_signal;
    sigaction(SIGALRM, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Under valgrind every daemon runs several times slower, and on a busy machine (a
     * CPU hog per core beside the suite) slower again: the watchdog then gives a test
     * all it can have, just under ctest's 300 s, so the harness still kills and cleans
     * up first (a test's own budget when that is longer). A fresh clone under load
     * (load average 8) saw it.bbctl, whose valgrind run takes 46-49 s, killed at 70 s. */
    if (h_valgrind() && timeout_s < H_VALGRIND_TIMEOUT_S)
        timeout_s = H_VALGRIND_TIMEOUT_S;
    alarm((unsigned)timeout_s);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    setvbuf(stdout, NULL, _IOLBF, 0);
}

const char *h_tmpdir(void)
{
    char tmpl[] = "/tmp/sdtest.XXXXXX";
    char *d = mkdtemp(tmpl);
    if (!d || ntmpdirs == 256) {
        perror("mkdtemp");
        exit(1);
    }
    tmpdirs[ntmpdirs] = strdup(d);
    return tmpdirs[ntmpdirs++];
}

/* 1 if port is free for TCP and UDP on 127.0.0.1 right now. */
static int port_free(int port)
{
    static const int types[] = {SOCK_STREAM, SOCK_DGRAM};
    for (int t = 0; t < 2; t++) {
        int fd = socket(AF_INET, types[t] | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0)
            close(fd);
        if (!ok)
            return 0;
    }
    return 1;
}

/* Ports come from 20000-31999, below Linux's ephemeral range (32768-60999): a daemon a
 * test restarts on the same port (an outage test) cannot lose it meanwhile to an
 * outgoing connection's source port or to a bind to port 0 elsewhere. */
int h_free_port(void)
{
    /* The ports handed out before: a port is free until its process binds it, so two
     * picks before the first bind (a cluster's node ports and bus ports) could collide. */
    static int given[1024];
    static int ngiven, next;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static unsigned seed;
    pthread_mutex_lock(&mu);
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)h_now_ms();
    for (int attempt = 0; attempt < 1000; attempt++) {
        int port = 20000 + (int)(rand_r(&seed) % 12000), seen = 0;
        for (int i = 0; i < ngiven && !seen; i++)
            seen = given[i] == port;
        if (!seen && port_free(port)) {
            given[next++ % 1024] = port;
            if (ngiven < 1024)
                ngiven++;
            pthread_mutex_unlock(&mu);
            return port;
        }
    }
    pthread_mutex_unlock(&mu);
    fprintf(stderr, "harness: no free port in 20000-31999\n");
    exit(1);
}

const char *h_write_file(const char *dir, const char *name, const char *text, int mode)
{
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, name) < 0)
        exit(1);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        perror(p);
        exit(1);
    }
    close(fd);
    if (nfiles < 256)
        files[nfiles++] = p;
    return p;
}

int h_valgrind(void)
{
    const char *v = getenv("H_VALGRIND");
    return v && *v && strcmp(v, "0") != 0;
}

int h_ms(int ms)
{
    const char *v = getenv("H_TIME_SCALE");
    long scale = v && *v ? strtol(v, NULL, 10) : 1;
    if (scale < 1 || scale > 100)
        scale = 1;
    return (int)(ms * scale * (h_valgrind() ? 10 : h_sanitized() ? 3 : 1));
}

int h_sanitized(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return 1;
#else
    return 0;
#endif
#else
    return 0;
#endif
}

void h_child_init(void)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    alarm(0);
}

int h_proc_text(int pid, const char *file, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t len = fread(buf, 1, cap - 1, f);
    fclose(f);
    for (size_t i = 0; i < len; i++)
        if (!buf[i])
            buf[i] = ' ';
    buf[len] = '\0';
    return (int)len;
}

int h_leftovers(const char *url, const char *dir, const int *ports, int nports)
{
    char want_env[300];
    snprintf(want_env, sizeof want_env, "SERVERDIR_URL=%s", url);
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        char env[8192], cmd[8192], st[512];
        if (pid <= 0 || pid == getpid() || h_proc_text(pid, "stat", st, sizeof st) < 0 ||
            strstr(st, ") Z ")) /* a zombie the subreaper (the test) has not reaped yet */
            continue;
        if (h_proc_text(pid, "environ", env, sizeof env) < 0)
            env[0] = '\0';
        if (h_proc_text(pid, "cmdline", cmd, sizeof cmd) < 0)
            cmd[0] = '\0';
        int hit = strstr(env, want_env) || strstr(env, dir) || strstr(cmd, dir);
        for (int k = 0; k < nports && !hit; k++) {
            char addr[32];
            snprintf(addr, sizeof addr, "127.0.0.1:%d", ports[k]);
            hit = strstr(cmd, addr) != NULL;
        }
        if (hit) {
            print_message("left over: pid %d %s\n", pid, cmd);
            n++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* Under H_VALGRIND=1 the project's daemons run under memcheck; the report goes to a
 * .vglog file beside the daemon's log, which the exit scan turns into a failure. */
static int is_daemon(const char *path)
{
    static const char *const daemons[] = {SD_BIN_DIR "/serverdir", SD_BIN_DIR "/bigbrother"};
    for (size_t i = 0; i < sizeof daemons / sizeof daemons[0]; i++)
        if (strcmp(path, daemons[i]) == 0)
            return 1;
    return 0;
}

pid_t h_spawn(const char *const *argv, const char *logpath, const char *const *envp_extra)
{
    const char *vg_argv[64];
    char vg_log[600];
    if (h_valgrind() && is_daemon(argv[0])) {
        snprintf(vg_log, sizeof vg_log, "--log-file=%s.%%p.vglog", logpath ? logpath : "/tmp/sd");
        static const char *const pre[] = {"valgrind", "-q", "--leak-check=full",
                                          "--errors-for-leak-kinds=definite",
                                          "--show-leak-kinds=definite", "--error-exitcode=99",
                                          "--trace-children=no",
                                          /* a forked child's few steps before its exec
                                           * are not the daemon's: one signalled before
                                           * it exec'd (a stop racing a slow spawn under
                                           * valgrind) "leaked" the environment it was
                                           * about to pass */
                                          "--child-silent-after-fork=yes"};
        int k = 0;
        for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
            vg_argv[k++] = pre[i];
        vg_argv[k++] = vg_log;
        for (const char *const *a = argv; *a && k < 63; a++)
            vg_argv[k++] = *a;
        vg_argv[k] = NULL;
        argv = vg_argv;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        h_child_init();
        int fd = open(logpath ? logpath : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0) { /* run on, it would print into the test's own output, unseen by the
                         test that reads logpath */
            fprintf(stderr, "h_spawn: %s: %s (%s not run)\n", logpath ? logpath : "/dev/null",
                    strerror(errno), argv[0]);
            _exit(127);
        }
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            close(nul);
        }
        for (const char *const *e = envp_extra; e && *e; e++)
            putenv((char *)*e);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

int h_exited(pid_t pid, int *status)
{
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
        if (status)
            *status = st;
        return 1;
    }
    return r < 0 && errno == ECHILD;
}

int h_wait_exit(pid_t pid, int timeout_ms)
{
    int64_t end = h_now_ms() + timeout_ms;
    int st = -1;
    do {
        if (h_exited(pid, &st))
            return st;
        h_sleep_ms(10);
    } while (h_now_ms() < end);
    return -1;
}

int h_stop(pid_t pid, int grace_ms)
{
    if (pid <= 0)
        return -1;
    int st;
    kill(pid, SIGTERM);
    int64_t until = h_now_ms() + grace_ms;
    while (h_now_ms() < until) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (r < 0)
            return -1;
        h_sleep_ms(10);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    return waitpid(pid, &st, 0) == pid ? st : -1;
}

/* ---------- redis ---------- */

const char *h_redis_mode(void)
{
    const char *mode = getenv("H_REDIS");
    if (mode && (strcmp(mode, "cluster") == 0 || strcmp(mode, "sentinel") == 0))
        return mode;
    return "standalone";
}

static int ping_ok(int port, int wait_ms, redisContext **keep)
{
    int64_t until = h_now_ms() + wait_ms;
    do {
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        if (c && !c->err) {
            redisReply *rep = redisCommand(c, "PING");
            int ok = rep && rep->type == REDIS_REPLY_STATUS;
            if (rep)
                freeReplyObject(rep);
            if (ok) {
                if (keep)
                    *keep = c;
                else
                    redisFree(c);
                return 1;
            }
        }
        if (c)
            redisFree(c);
        h_sleep_ms(20);
    } while (h_now_ms() < until);
    return 0;
}

/* A standalone redis-server on r->port (no persistence). */
static pid_t spawn_standalone(h_redis_t *r)
{
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    const char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--dir", r->dir,
                          "--daemonize", "no", "--enable-debug-command", "local", NULL};
    return h_spawn(argv, r->log, NULL);
}

/* H_REDIS=sentinel: one sentinel (quorum 1) monitoring the primary r->pid; serverdir
 * finds the primary through it (sentinel://). No replica: failover has it.sentinel. */
static int start_sentinel(h_redis_t *r)
{
    char conf[4096], path[300], log[300];
    for (int attempt = 0; attempt < 5; attempt++) {
        r->sentinel_port = h_free_port();
        snprintf(conf, sizeof conf,
                 "port %d\nbind 127.0.0.1\ndir %s\n"
                 "sentinel monitor mymaster 127.0.0.1 %d 1\n"
                 "sentinel down-after-milliseconds mymaster 5000\n",
                 r->sentinel_port, r->dir, r->port);
        snprintf(path, sizeof path, "%s", h_write_file(r->dir, "sentinel.conf", conf, 0644));
        snprintf(log, sizeof log, "%s/sentinel.log", r->dir);
        const char *argv[] = {"redis-server", path, "--sentinel", NULL};
        r->sentinel_pid = h_spawn(argv, log, NULL);
        int64_t until = h_now_ms() + 5000;
        while (h_now_ms() < until && !h_exited(r->sentinel_pid, NULL)) {
            struct timeval tv = {0, 200000};
            redisContext *c = redisConnectWithTimeout("127.0.0.1", r->sentinel_port, tv);
            redisReply *rep = c && !c->err
                                  ? redisCommand(c, "SENTINEL get-master-addr-by-name mymaster")
                                  : NULL;
            int ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                     atoi(rep->element[1]->str) == r->port;
            if (rep)
                freeReplyObject(rep);
            if (c)
                redisFree(c);
            if (ok) {
                snprintf(r->url, sizeof r->url, "sentinel://127.0.0.1:%d/mymaster",
                         r->sentinel_port);
                return 0;
            }
            h_sleep_ms(20);
        }
        h_stop(r->sentinel_pid, 100);
        r->sentinel_pid = 0;
    }
    fprintf(stderr, "harness: redis sentinel did not start (see %s)\n", log);
    return -1;
}

int h_redis_start(h_redis_t *r)
{
    memset(r, 0, sizeof *r);
    if (strcmp(h_redis_mode(), "cluster") == 0) {
        h_rcluster_t *rc = calloc(1, sizeof *rc);
        if (!rc || h_rcluster_start(rc, 3, 0)) {
            if (rc)
                h_rcluster_stop(rc);
            free(rc);
            return -1;
        }
        r->cluster = rc;
        r->port = rc->port[0];
        snprintf(r->dir, sizeof r->dir, "%s", rc->dir);
        if (strlen(rc->url) >= sizeof r->url)
            return -1;
        memcpy(r->url, rc->url, strlen(rc->url) + 1);
        snprintf(r->log, sizeof r->log, "%s/node0/redis.log", rc->dir);
        struct timeval tv = {1, 0};
        r->ctl = redisConnectWithTimeout("127.0.0.1", r->port, tv);
        return 0;
    }
    snprintf(r->dir, sizeof r->dir, "%s", h_tmpdir());
    snprintf(r->log, sizeof r->log, "%s/redis.log", r->dir);
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = h_free_port();
        r->pid = spawn_standalone(r);
        if (ping_ok(r->port, 5000, &r->ctl)) {
            snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d/0", r->port);
            if (strcmp(h_redis_mode(), "sentinel") == 0 && start_sentinel(r)) {
                h_redis_stop(r);
                return -1;
            }
            return 0;
        }
        h_stop(r->pid, 100);
    }
    fprintf(stderr, "harness: redis-server did not start (see %s)\n", r->log);
    return -1;
}

void h_redis_down(h_redis_t *r)
{
    if (r->ctl) {
        redisFree(r->ctl);
        r->ctl = NULL;
    }
    if (r->cluster) {
        h_rcluster_t *rc = r->cluster;
        for (int i = 0; i < rc->n; i++)
            if (rc->pid[i]) {
                h_stop(rc->pid[i], 2000);
                rc->pid[i] = 0;
            }
        return;
    }
    h_stop(r->pid, 2000);
    r->pid = 0;
}

int h_redis_up(h_redis_t *r)
{
    if (r->cluster) {
        h_rcluster_t *rc = r->cluster;
        for (int i = 0; i < rc->n; i++)
            if (!rc->pid[i] && h_rc_restart(rc, i))
                return -1;
        return h_rc_wait_ok(rc, 20000);
    }
    if (r->pid)
        return -1;
    r->pid = spawn_standalone(r);
    return ping_ok(r->port, 5000, NULL) ? 0 : -1;
}

int h_redis_route(h_redis_t *r, const char *key)
{
    if (!r->cluster)
        return 0;
    redisReply *rep = h_redis(r, "CLUSTER KEYSLOT %s", key);
    int slot = rep && rep->type == REDIS_REPLY_INTEGER ? (int)rep->integer : -1;
    if (rep)
        freeReplyObject(rep);
    h_rcluster_t *rc = r->cluster;
    int node = slot < 0 ? -1 : h_rc_primary_of(rc, slot);
    if (node < 0)
        return -1;
    if (r->ctl)
        redisFree(r->ctl);
    r->port = rc->port[node];
    struct timeval tv = {1, 0};
    r->ctl = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    return r->ctl && !r->ctl->err ? 0 : -1;
}

const char *h_lock_key(const char *name)
{
    static _Thread_local char buf[512];
    if (strcmp(h_redis_mode(), "cluster") == 0 && !strchr(name, '{'))
        snprintf(buf, sizeof buf, "sd:lock:{=%s}", name);
    else
        snprintf(buf, sizeof buf, "sd:lock:%s", name);
    return buf;
}

const char *h_master_key(const char *prefix, const char *name)
{
    static _Thread_local char buf[256];
    snprintf(buf, sizeof buf, strcmp(h_redis_mode(), "cluster") == 0 ? "%s{master}:%s" : "%smaster:%s",
             prefix, name);
    return buf;
}

void h_redis_stop(h_redis_t *r)
{
    if (r->ctl) {
        redisFree(r->ctl);
        r->ctl = NULL;
    }
    if (r->cluster) {
        h_rcluster_stop(r->cluster);
        free(r->cluster);
        r->cluster = NULL;
        return;
    }
    if (r->sentinel_pid)
        h_stop(r->sentinel_pid, 2000);
    r->sentinel_pid = 0;
    h_stop(r->pid, 2000);
    r->pid = 0;
}

long long h_redis_blocked(h_redis_t *r)
{
    redisReply *rep = h_redis(r, "INFO clients");
    long long n = -1;
    const char *p;
    if (rep && rep->type == REDIS_REPLY_STRING &&
        (p = strstr(rep->str, "blocked_clients:")))
        n = strtoll(p + strlen("blocked_clients:"), NULL, 10);
    if (rep)
        freeReplyObject(rep);
    return n;
}

long long h_redis_script_calls(h_redis_t *r, long long *usec)
{
    redisReply *info = h_redis(r, "INFO commandstats");
    if (!info || info->type != REDIS_REPLY_STRING) {
        if (info)
            freeReplyObject(info);
        return -1;
    }
    long long calls = 0, us = 0;
    for (const char *p = info->str; (p = strstr(p, "cmdstat_eval")) != NULL; p++) {
        const char *c = strstr(p, "calls="), *u = strstr(p, "usec=");
        if (c)
            calls += atoll(c + 6);
        if (u)
            us += atoll(u + 5);
    }
    freeReplyObject(info);
    if (usec)
        *usec = us;
    return calls;
}

int h_redis_wait_blocked(h_redis_t *r, long long n, int timeout_ms)
{
    int64_t until = h_now_ms() + timeout_ms;
    for (;;) {
        if (h_redis_blocked(r) >= n)
            return 0;
        if (h_now_ms() >= until)
            return -1;
        h_sleep_ms(5);
    }
}

redisReply *h_redis(h_redis_t *r, const char *fmt, ...)
{
    if (!r->ctl || r->ctl->err) {
        if (r->ctl)
            redisFree(r->ctl);
        struct timeval tv = {1, 0};
        r->ctl = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    }
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(r->ctl, fmt, ap);
    va_end(ap);
    /* On a cluster, a key of another node's slot: asked again there (once). */
    int port;
    if (r->cluster && rep && rep->type == REDIS_REPLY_ERROR &&
        sscanf(rep->str, "MOVED %*d 127.0.0.1:%d", &port) == 1) {
        freeReplyObject(rep);
        struct timeval tv = {1, 0};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        va_start(ap, fmt);
        rep = c && !c->err ? redisvCommand(c, fmt, ap) : NULL;
        va_end(ap);
        if (c)
            redisFree(c);
    }
    return rep;
}

/* A command on node (-1: r->ctl, following a MOVED); the caller frees the reply. */
static redisReply *node_cmd(h_redis_t *r, int node, const char *fmt, const char *arg1,
                            const char *arg2)
{
    return node < 0 ? h_redis(r, fmt, arg1, arg2) : h_rc_node(r->cluster, node, fmt, arg1, arg2);
}

/* Records key with its value's digest and its time to live, both read on node (where the
 * key lives: DEBUG is not redirected on a cluster); a key gone since the scan is not. */
static void keys_add(h_redis_t *r, int node, h_keys_t *k, const char *key)
{
    /* the lost-machine sweep's lease, the master list's expiry walk (P sweep: its cursor,
     * every 200 ms) and the list's life token (P life, drawn by the first index load that
     * finds none, which a loaded machine can run late): written by serverdir's timers and
     * its index loader, never by a request */
    size_t len = strlen(key);
    if (len >= 9 && strcmp(key + len - 9, "lostsweep") == 0)
        return;
    if (len >= 6 && strstr(key, "master") &&
        (strcmp(key + len - 6, ":sweep") == 0 || strcmp(key + len - 5, ":life") == 0))
        return;
    redisReply *rep = node_cmd(r, node, "DEBUG DIGEST-VALUE %s", key, NULL);
    const char *sum = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
                              rep->element[0]->type == REDIS_REPLY_STATUS
                          ? rep->element[0]->str
                          : NULL;
    if (!sum) {
        fprintf(stderr, "h_keys_take: DEBUG DIGEST-VALUE %s failed: %s\n", key,
                rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
        abort();
    }
    if (strspn(sum, "0") == strlen(sum)) { /* gone (expired) since the scan */
        freeReplyObject(rep);
        return;
    }
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 64;
        k->key = realloc(k->key, k->cap * sizeof *k->key);
        k->sum = realloc(k->sum, k->cap * sizeof *k->sum);
        k->pttl = realloc(k->pttl, k->cap * sizeof *k->pttl);
        if (!k->key || !k->sum || !k->pttl)
            abort();
    }
    k->key[k->n] = strdup(key);
    snprintf(k->sum[k->n], sizeof k->sum[k->n], "%s", sum);
    freeReplyObject(rep);
    rep = node_cmd(r, node, "PTTL %s", key, NULL);
    k->pttl[k->n] = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0 ? rep->integer : -1;
    if (rep)
        freeReplyObject(rep);
    k->n++;
}

/* Every key matching pattern on one node (node < 0: r->ctl), SCAN to the end. */
static void keys_scan(h_redis_t *r, int node, const char *pattern, h_keys_t *k)
{
    char cursor[32] = "0";
    do {
        redisReply *rep = node_cmd(r, node, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
            fprintf(stderr, "h_keys_take: SCAN failed: %s\n",
                    rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no reply");
            abort();
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        for (size_t i = 0; i < rep->element[1]->elements; i++)
            keys_add(r, node, k, rep->element[1]->element[i]->str);
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
}

/* Whether cluster node i is a primary now (ROLE). */
static int node_is_primary(h_redis_t *r, int i)
{
    redisReply *rep = h_rc_node(r->cluster, i, "ROLE");
    int yes = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
              rep->element[0]->type == REDIS_REPLY_STRING && strcmp(rep->element[0]->str, "master") == 0;
    if (rep)
        freeReplyObject(rep);
    return yes;
}

static int cmp_key_at(const void *a, const void *b, void *arg)
{
    const h_keys_t *k = arg;
    return strcmp(k->key[*(const size_t *)a], k->key[*(const size_t *)b]);
}

size_t h_keys_take(h_redis_t *r, h_keys_t *k, ...)
{
    memset(k, 0, sizeof *k);
    k->t0 = h_now_ms();
    va_list ap;
    va_start(ap, k);
    for (const char *pat; (pat = va_arg(ap, const char *));) {
        if (!r->cluster) {
            keys_scan(r, -1, pat, k);
            continue;
        }
        h_rcluster_t *rc = r->cluster;
        for (int i = 0; i < rc->n; i++)
            if (rc->pid[i] && node_is_primary(r, i))
                keys_scan(r, i, pat, k);
    }
    va_end(ap);
    /* sorted by name, each once (two patterns may both match it) */
    size_t *ix = malloc((k->n ? k->n : 1) * sizeof *ix);
    char **key = malloc((k->n ? k->n : 1) * sizeof *key);
    char(*sum)[41] = malloc((k->n ? k->n : 1) * sizeof *sum);
    long long *pttl = malloc((k->n ? k->n : 1) * sizeof *pttl);
    if (!ix || !key || !sum || !pttl)
        abort();
    for (size_t i = 0; i < k->n; i++)
        ix[i] = i;
    qsort_r(ix, k->n, sizeof *ix, cmp_key_at, k);
    size_t w = 0;
    for (size_t i = 0; i < k->n; i++) {
        size_t j = ix[i];
        if (w && strcmp(key[w - 1], k->key[j]) == 0) {
            free(k->key[j]);
            continue;
        }
        key[w] = k->key[j];
        memcpy(sum[w], k->sum[j], sizeof sum[w]);
        pttl[w] = k->pttl[j];
        w++;
    }
    free(ix);
    free(k->key);
    free(k->sum);
    free(k->pttl);
    k->key = key, k->sum = sum, k->pttl = pttl;
    k->n = k->cap = w;
    k->t1 = h_now_ms();
    return k->n;
}

static const char *keys_diff(const h_keys_t *a, const h_keys_t *b, int names_only)
{
    static _Thread_local char buf[1024];
    size_t i = 0, j = 0, len = 0, shown = 0, more = 0;
    buf[0] = '\0';
    while (i < a->n || j < b->n) {
        int c = i == a->n ? 1 : j == b->n ? -1 : strcmp(a->key[i], b->key[j]);
        const char *what = NULL, *key = NULL;
        if (c < 0) {
            /* expired: its time to live, counted from when a began, had passed when b ended */
            if (a->pttl[i] < 0 || a->t0 + a->pttl[i] > b->t1)
                what = "removed", key = a->key[i];
            i++;
        } else if (c > 0) {
            what = "added", key = b->key[j++];
        } else {
            if (!names_only && strcmp(a->sum[i], b->sum[j]) != 0)
                what = "changed", key = a->key[i];
            i++, j++;
        }
        if (!what)
            continue;
        if (shown < 6 && len < sizeof buf - 200) {
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s %.150s", shown ? "; " : "",
                                    what, key);
            shown++;
        } else {
            more++;
        }
    }
    if (more)
        snprintf(buf + len, sizeof buf - len, "; and %zu more", more);
    return shown ? buf : NULL;
}

const char *h_keys_diff(const h_keys_t *a, const h_keys_t *b)
{
    return keys_diff(a, b, 0);
}

const char *h_keys_names_diff(const h_keys_t *a, const h_keys_t *b)
{
    return keys_diff(a, b, 1);
}

void h_keys_drop(h_keys_t *k, const char *name)
{
    for (size_t i = 0; i < k->n; i++)
        if (!strcmp(k->key[i], name)) {
            free(k->key[i]);
            size_t rest = k->n - i - 1;
            memmove(&k->key[i], &k->key[i + 1], rest * sizeof(k->key[0]));
            memmove(&k->sum[i], &k->sum[i + 1], rest * sizeof(k->sum[0]));
            memmove(&k->pttl[i], &k->pttl[i + 1], rest * sizeof(k->pttl[0]));
            k->n--;
            return;
        }
}

void h_keys_free(h_keys_t *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->key[i]);
    free(k->key);
    free(k->sum);
    free(k->pttl);
    memset(k, 0, sizeof *k);
}

static void keys_same(h_keys_t *before, h_keys_t *after, const char *what, int names_only)
{
    const char *d = keys_diff(before, after, names_only);
    char msg[1200];
    if (d)
        snprintf(msg, sizeof msg, "%s changed Redis: %s", what, d);
    h_keys_free(before);
    h_keys_free(after);
    if (d)
        fail_msg("%s", msg);
}

void h_keys_same(h_keys_t *before, h_keys_t *after, const char *what)
{
    keys_same(before, after, what, 0);
}

void h_keys_same_names(h_keys_t *before, h_keys_t *after, const char *what)
{
    keys_same(before, after, what, 1);
}

/* ---------- serverdir ---------- */

const char *h_tokens_file(void)
{
    static const char *path;
    if (!path)
        path = h_write_file(h_tmpdir(), "tokens",
                            "# test tokens\n"
                            "ops " H_TOK_OPS "\n"
                            "bigbrother " H_TOK_BB "\n"
                            "game " H_TOK_GAME "\n"
                            "game " H_TOK_GAME2 "\n"
                            "viewer " H_TOK_VIEWER "\n"
                            "bigbrother " H_TOK_BB_M1 " cluster=authz1 machine=m1\n"
                            "game " H_TOK_GAME_ZONE " holder_prefix=zone-\n"
                            "game " H_TOK_GAME_C1 " cluster=authz1\n"
                            "viewer " H_TOK_VIEWER_C1 " cluster=authz1\n"
                            "bigbrother " H_TOK_BB_C1(1) " cluster=c1 machine=m1\n"
                            "bigbrother " H_TOK_BB_C1(2) " cluster=c1 machine=m2\n"
                            "bigbrother " H_TOK_BB_C1(3) " cluster=c1 machine=m3\n"
                            "game " H_TOK_GAME_OF_C1 " cluster=c1\n",
                            0600);
    return path;
}

const char *h_sd_default_config(void)
{
    static const char *path;
    if (!path)
        path = h_write_file(h_tmpdir(), "sd-default.json",
                            "{\"directory\": {\"series_interval_ms\": 0}}", 0644);
    return path;
}

int h_serverdir_start(h_serverdir_t *s, const char *redis_url, const char *tokens,
                      const char *const *extra)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", h_tmpdir());
    snprintf(s->log, sizeof s->log, "%s/serverdir.log", s->dir);
    snprintf(s->tokens, sizeof s->tokens, "%s", tokens ? tokens : "");
    for (int attempt = 0; attempt < 5; attempt++) {
        s->port = h_free_port();
        char listen[64];
        snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
        const char *argv[48] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis_url,
                                "--threads", "4"};
        int argc = 7;
        if (tokens) {
            argv[argc++] = "--tokens";
            argv[argc++] = tokens;
        }
        int config = 0;
        for (const char *const *e = extra; e && *e && argc < 44; e++) {
            config |= !strcmp(*e, "--config");
            argv[argc++] = *e;
        }
        if (!config) {
            argv[argc++] = "--config";
            argv[argc++] = h_sd_default_config();
        }
        argv[argc] = NULL;
        s->pid = h_spawn(argv, s->log, NULL);
        snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
        int64_t until = h_now_ms() + (h_valgrind() ? 30000 : 5000);
        while (h_now_ms() < until) {
            if (h_exited(s->pid, NULL))
                break;
            h_resp_t r;
            char u[160];
            snprintf(u, sizeof u, "%s/healthz", s->url);
            int rc = h_http("GET", u, NULL, NULL, NULL, 0, NULL, &r);
            long st = r.status;
            h_resp_free(&r);
            if (rc == 0 && st == 200)
                return 0;
            h_sleep_ms(20);
        }
        h_stop(s->pid, 100);
    }
    fprintf(stderr, "harness: serverdir did not start (see %s)\n", s->log);
    return -1;
}

void h_serverdir_stop(h_serverdir_t *s)
{
    h_stop(s->pid, 5000);
    s->pid = 0;
}

int h_serverdir_restart(h_serverdir_t *s, const char *redis_url)
{
    char listen[64], health[160];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
    snprintf(health, sizeof health, "%s/healthz", s->url);
    const char *argv[] = {SD_BIN_DIR "/serverdir", "--listen", listen, "--redis", redis_url,
                          "--threads", "4", "--config", h_sd_default_config(),
                          s->tokens[0] ? "--tokens" : NULL, s->tokens, NULL};
    s->pid = h_spawn(argv, s->log, NULL);
    return h_wait_until(h_http_ok, health, h_valgrind() ? 30000 : 8000) ? 0 : -1;
}

/* ---------- http ---------- */

struct sink {
    char *p;
    size_t len;
};

static size_t sink_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct sink *s = ud;
    size_t n = size * nmemb;
    char *np = realloc(s->p, s->len + n + 1);
    if (!np)
        return 0;
    memcpy(np + s->len, ptr, n);
    s->p = np;
    s->len += n;
    s->p[s->len] = '\0';
    return n;
}

int h_http(const char *method, const char *url, const char *token, const char *ctype,
           const void *body, size_t len, const char *const *extra_headers, h_resp_t *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    struct sink b = {0}, h = {0};
    struct curl_slist *hl = NULL;
    char line[512];
    if (token) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", token);
        hl = curl_slist_append(hl, line);
    }
    if (body) {
        snprintf(line, sizeof line, "Content-Type: %s", ctype ? ctype : "application/json");
        hl = curl_slist_append(hl, line);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    /* Large bodies go with "Expect: 100-continue" as real clients send them: a refusal
     * decided from the headers (413, 401, 415) then arrives before any body byte is sent,
     * instead of racing the server's close while the client is still writing. */
    hl = curl_slist_append(hl, body && len > 64 * 1024 ? "Expect: 100-continue" : "Expect:");
    for (const char *const *e = extra_headers; e && *e; e++)
        hl = curl_slist_append(hl, *e);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    out->body = b.p ? b.p : strdup("");
    out->len = b.len;
    out->headers = h.p ? h.p : strdup("");
    return rc == CURLE_OK ? 0 : -1;
}

int h_http_json(const char *method, const char *base, const char *token, const char *body,
                h_resp_t *out, const char *pathfmt, ...)
{
    char url[2048];
    size_t n = (size_t)snprintf(url, sizeof url, "%s", base);
    va_list ap;
    va_start(ap, pathfmt);
    vsnprintf(url + n, sizeof url - n, pathfmt, ap);
    va_end(ap);
    return h_http(method, url, token, NULL, body, body ? strlen(body) : 0, NULL, out);
}

void h_resp_free(h_resp_t *r)
{
    free(r->body);
    free(r->headers);
    r->body = r->headers = NULL;
}

long long h_metric(const char *base, const char *series)
{
    h_resp_t r;
    if (h_http_json("GET", base, NULL, NULL, &r, "/metrics") || r.status != 200 || !r.body) {
        h_resp_free(&r);
        return -1;
    }
    char line[256];
    snprintf(line, sizeof line, "\n%s ", series);
    const char *m = strstr(r.body, line);
    long long v = m ? strtoll(m + strlen(line), NULL, 10) : 0;
    h_resp_free(&r);
    return v;
}

json_t *h_resp_json(const h_resp_t *r)
{
    return r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
}

int h_resp_header(const h_resp_t *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *l = r->headers; l && *l;) {
        const char *eol = strchr(l, '\n');
        size_t ll = eol ? (size_t)(eol - l) : strlen(l);
        if (ll > nl && strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(l + ll - v);
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' '))
                vl--;
            snprintf(out, cap, "%.*s", (int)vl, v);
            return 0;
        }
        l = eol ? eol + 1 : NULL;
    }
    return -1;
}

long long h_master_listed(const char *base, const char *filter)
{
    long long total = 0;
    char after[80] = "";
    for (int page = 0; page < 100; page++) {
        h_resp_t r;
        if (h_http_json("GET", base, NULL, NULL, &r,
                        "/v1/master/servers?%slimit=1000&format=text%s%s", filter,
                        after[0] ? "&after=" : "", after)) {
            return -1;
        }
        if (r.status != 200) {
            h_resp_free(&r);
            return -1;
        }
        for (char *c = r.body; c && *c; c++)
            total += *c == '\n';
        char next[80];
        int more = h_resp_header(&r, "Master-Next", next, sizeof next) == 0;
        h_resp_free(&r);
        if (!more)
            break;
        snprintf(after, sizeof after, "%s", next);
    }
    return total;
}

const char *h_err_code(const h_resp_t *r)
{
    static char code[64];
    code[0] = '\0';
    json_t *j = h_resp_json(r);
    const char *c = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    snprintf(code, sizeof code, "%s", c ? c : "");
    json_decref(j);
    return code;
}

int h_http_ok(void *url)
{
    h_resp_t r;
    int ok = h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r) == 0 && r.status == 200;
    h_resp_free(&r);
    return ok;
}

int h_wait_every(int (*cond)(void *), void *arg, int timeout_ms, int every_ms)
{
    int64_t until = h_now_ms() + timeout_ms;
    do {
        if (cond(arg))
            return 1;
        h_sleep_ms(every_ms);
    } while (h_now_ms() < until);
    return cond(arg);
}

int h_wait_until(int (*cond)(void *), void *arg, int timeout_ms)
{
    return h_wait_every(cond, arg, timeout_ms, 10);
}

int h_tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

int h_send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

size_t h_read_until_close(int fd, char *buf, size_t cap, int timeout_ms, int *closed)
{
    size_t len = 0;
    int64_t end = h_now_ms() + timeout_ms;
    *closed = 0;
    while (h_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - h_now_ms());
        if (poll(&p, 1, left > 0 ? left : 0) <= 0)
            continue;
        char tmp[4096];
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k <= 0) {
            *closed = 1;
            break;
        }
        size_t take = (size_t)k < cap - 1 - len ? (size_t)k : cap - 1 - len;
        memcpy(buf + len, tmp, take);
        len += take;
    }
    buf[len] = '\0';
    return len;
}
