/* bbctl: the local control tool of bigbrother, over its control socket.
 *
 *   bbctl [--socket PATH] [-o json] status
 *   bbctl [--socket PATH] start|stop|restart TARGET     (instance id, service name or all)
 *   bbctl [--socket PATH] logs INSTANCE [--tail N] [-f] (one run's output: its log file,
 *                                                        STATE_DIR/logs/SERVICE-SLOT/ID.log)
 *   bbctl --version | version
 *
 * PATH defaults to $BB_CONTROL_SOCKET, else to the control socket of the one bigbrother
 * running on the machine (its --config, read from /proc). Exit codes, the same table as
 * sdctl's: 0 done, 1 refused, 2 usage, 3 bigbrother unreachable, 4 no such target. */
#include "instance/bb_instance.h"
#include "sdlog.h"
#include "sdutil.h"
#include "sdversion.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define ANSWER_MAX (32 << 20)

static void usage(FILE *f)
{
    fprintf(f, "usage: bbctl [--socket PATH] [-o json] status\n"
               "       bbctl [--socket PATH] start|stop|restart TARGET\n"
               "       bbctl [--socket PATH] logs INSTANCE [--tail N] [-f]\n"
               "       bbctl --version | version\n"
               "TARGET: an instance id, a service name, or all. PATH defaults to\n"
               "$BB_CONTROL_SOCKET, else to the control socket of the one bigbrother running\n"
               "on this machine (its config's control_socket, by default\n"
               "STATE_DIR/control.sock); with several, --socket picks one.\n"
               "logs: the output of one run, from its own log file\n"
               "(STATE_DIR/logs/SERVICE-SLOT/INSTANCE.log: the current run of a slot, or one\n"
               "of the log_runs earlier runs a slot keeps): the last N lines (default 100; 0:\n"
               "all), those of the file's rotation .1 first when the file holds fewer (just\n"
               "rotated); -f follows it until it ends (or Ctrl-C).\n"
               "exit codes (as sdctl's): 0 ok, 1 refused, 2 usage, 3 bigbrother unreachable,\n"
               "4 no such instance or service\n");
}

/* The control socket of the one bigbrother running on this machine: every process whose
 * executable is named bigbrother, its --config read as bigbrother reads it. 0 with the
 * path in out; -1 with why printed (none, several, unreadable config). */
static int find_socket(char *out, size_t cap)
{
    DIR *d = opendir("/proc");
    if (!d) {
        fprintf(stderr, "bbctl: cannot list /proc: %s\n", strerror(errno));
        return -1;
    }
    enum { SHOWN_MAX = 16 };
    char socks[SHOWN_MAX][BB_SOCK_PATH_MAX];
    long pids[SHOWN_MAX];
    int found = 0;
    sd_log_set_level(SD_LOG_ERROR); /* the configs' own warnings are bigbrother's to say */
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64], exe[4096], args[8192];
        snprintf(path, sizeof path, "/proc/%ld/exe", pid);
        ssize_t n = readlink(path, exe, sizeof exe - 1);
        if (n <= 0)
            continue;
        exe[n] = '\0';
        const char *base = strrchr(exe, '/');
        base = base ? base + 1 : exe;
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(args, 1, sizeof args - 1, f);
        fclose(f);
        args[len] = '\0';
        /* the program is bigbrother, or runs it (valgrind bigbrother --config ...): its
         * options follow the argument named bigbrother */
        int is_bb = strcmp(base, "bigbrother") == 0;
        const char *config = NULL; /* "--config" PATH or "--config=PATH" or "-c" PATH */
        for (size_t i = 0; i < len; i += strlen(args + i) + 1) {
            const char *a = args + i, *ab = strrchr(a, '/');
            size_t next = i + strlen(a) + 1;
            if (!strcmp(ab ? ab + 1 : a, "bigbrother"))
                is_bb = 1;
            else if (!is_bb)
                continue;
            else if ((!strcmp(a, "--config") || !strcmp(a, "-c")) && next < len)
                config = args + next;
            else if (!strncmp(a, "--config=", 9))
                config = a + 9;
        }
        if (!is_bb)
            continue;
        if (!config)
            continue;
        char cfgpath[4352];
        if (config[0] == '/') {
            snprintf(cfgpath, sizeof cfgpath, "%s", config);
        } else { /* relative to that process's working directory */
            char cwd[4096];
            snprintf(path, sizeof path, "/proc/%ld/cwd", pid);
            ssize_t m = readlink(path, cwd, sizeof cwd - 1);
            if (m <= 0)
                continue;
            cwd[m] = '\0';
            snprintf(cfgpath, sizeof cfgpath, "%s/%s", cwd, config);
        }
        bb_config_t cfg;
        char err[512];
        if (bb_config_load(cfgpath, &cfg, err, sizeof err)) {
            fprintf(stderr, "bbctl: bigbrother (pid %ld): %s\n", pid, err);
            continue;
        }
        if (found < SHOWN_MAX) {
            sd_strlcpy(socks[found], cfg.control_socket, sizeof socks[found]);
            pids[found] = pid;
        }
        found++;
        bb_config_free(&cfg);
    }
    closedir(d);
    if (found == 1) {
        sd_strlcpy(out, socks[0], cap);
        return 0;
    }
    if (found == 0) {
        fprintf(stderr, "bbctl: no bigbrother runs on this machine (or --socket PATH, "
                        "BB_CONTROL_SOCKET)\n");
        return -1;
    }
    fprintf(stderr, "bbctl: %d bigbrothers run here; pick one:\n", found);
    for (int i = 0; i < found && i < SHOWN_MAX; i++)
        fprintf(stderr, "  pid %ld: --socket %s\n", pids[i], socks[i]);
    return -1;
}

/* Sends one request line and reads the whole answer. Returns the parsed JSON or NULL
 * with a message printed. */
static json_t *call(const char *path, const char *req)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "bbctl: socket path too long: %s\n", path);
        return NULL;
    }
    sd_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {10, 0};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
        fprintf(stderr, "bbctl: cannot reach bigbrother at %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t len = strlen(req);
    sd_buf_t b;
    sd_buf_init(&b, ANSWER_MAX);
    if (send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
        fprintf(stderr, "bbctl: send failed: %s\n", strerror(errno));
        close(fd);
        return NULL;
    }
    char chunk[65536];
    ssize_t n;
    while ((n = recv(fd, chunk, sizeof(chunk), 0)) > 0)
        if (sd_buf_append(&b, chunk, (size_t)n)) {
            n = -1;
            errno = E2BIG;
            break;
        }
    close(fd);
    json_t *ans = NULL;
    if (n < 0)
        fprintf(stderr, "bbctl: reading the answer failed: %s\n", strerror(errno));
    else if (!(ans = json_loadb(b.data ? b.data : "", b.len, 0, NULL)))
        fprintf(stderr, "bbctl: bigbrother sent an unreadable answer\n");
    sd_buf_free(&b);
    return ans;
}

static void fmt_uptime(int64_t ms, char *out, size_t cap)
{
    int64_t s = ms / 1000;
    if (ms <= 0)
        snprintf(out, cap, "-");
    else if (s < 60)
        snprintf(out, cap, "%llds", (long long)s);
    else if (s < 3600)
        snprintf(out, cap, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
    else
        snprintf(out, cap, "%lldh%02lldm", (long long)(s / 3600), (long long)(s / 60 % 60));
}

static void print_status(json_t *st)
{
    size_t i;
    json_t *in;
    printf("%-40s %-16s %-9s %-8s %-8s %-24s %-8s %s\n", "INSTANCE", "SERVICE", "STATE", "PID",
           "RESTARTS", "LAST EXIT", "UPTIME", "STATUS");
    json_array_foreach(json_object_get(st, "instances"), i, in) {
        char up[32], pid[16] = "-";
        const char *last = json_string_value(json_object_get(in, "reason_text"));
        if (!last)
            last = "-";
        if (json_integer_value(json_object_get(in, "pid")) > 0)
            snprintf(pid, sizeof(pid), "%lld", json_integer_value(json_object_get(in, "pid")));
        fmt_uptime(json_integer_value(json_object_get(in, "uptime_ms")), up, sizeof(up));
        /* the game's own STATUS= (agent or sd_notify), one line, at most 60 bytes shown */
        const char *status = json_string_value(json_object_get(in, "status"));
        printf("%-40s %-16s %-9s %-8s %-8lld %-24s %-8s %.60s\n",
               json_string_value(json_object_get(in, "instance")),
               json_string_value(json_object_get(in, "service")),
               json_string_value(json_object_get(in, "state")), pid,
               json_integer_value(json_object_get(in, "restarts")), last, up,
               status && *status ? status : "-");
    }
}

/* Whether instance id still runs, asked of bigbrother at sock (0 when it cannot tell). */
static int still_running(const char *sock, const char *id)
{
    char req[SD_NAME_MAX + 16];
    snprintf(req, sizeof req, "logs %s\n", id);
    json_t *ans = call(sock, req);
    int r = ans && json_is_true(json_object_get(ans, "running"));
    json_decref(ans);
    return r;
}

/* Prints the last `tail` lines (0: all) of instance id's run from its log at path (the
 * whole file less its header line; the end of path.1 first when the file holds no more
 * than `tail` lines, as after a rotation); with follow, then what the run appends, until
 * bigbrother says it no longer runs, or Ctrl-C. A log rotated while followed (copied to
 * .1, truncated) is read on from its new start. */
static int print_run(const char *sock, const char *path, const char *id, long tail, int follow)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bbctl: cannot read %s: %s\n", path, strerror(errno));
        return CTL_EXIT_FAILED;
    }
    sd_buf_t head;
    sd_buf_init(&head, ANSWER_MAX);
    int ended = bb_log_read_run(f, path, id, tail, &head);
    if (head.len)
        fwrite(head.data, 1, head.len, stdout);
    sd_buf_free(&head);
    fflush(stdout);
    /* the rest as it comes, until the run's end: bigbrother saying it no longer runs
     * (asked after each idle second), then what is left */
    char *line = NULL;
    size_t cap = 0;
    for (int idle = 0, last = 0; follow && !ended && !last;) {
        struct stat st;
        clearerr(f);
        if (fstat(fileno(f), &st) == 0 && st.st_size < ftell(f)) /* rotated: truncated */
            fseek(f, 0, SEEK_SET);
        int got = 0;
        while (getline(&line, &cap, f) > 0) {
            if (bb_log_header(line, id) == 2) {
                ended = 1;
                break;
            }
            fputs(line, stdout);
            got = 1;
        }
        fflush(stdout);
        idle = got ? 0 : idle + 1;
        if (idle >= 5) {
            idle = 0;
            last = !still_running(sock, id); /* one more read above, then out */
            if (last) {
                clearerr(f);
                while (getline(&line, &cap, f) > 0 && bb_log_header(line, id) != 2)
                    fputs(line, stdout);
            }
        }
        if (!ended && !last)
            usleep(200000);
    }
    free(line);
    fclose(f);
    return CTL_EXIT_OK;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    const char *path = getenv("BB_CONTROL_SOCKET");
    int as_json = 0, o;
    while ((o = getopt_long(argc, argv, "+s:o:hV", opts, NULL)) != -1) {
        switch (o) {
        case 's': path = optarg; break;
        case 'o':
            if (strcmp(optarg, "json")) {
                fprintf(stderr, "bbctl: -o takes json\n");
                return CTL_EXIT_USAGE;
            }
            as_json = 1;
            break;
        case 'h': usage(stdout); return CTL_EXIT_OK;
        case 'V': printf("bbctl %s\n", SD_VERSION); return CTL_EXIT_OK;
        default: usage(stderr); return CTL_EXIT_USAGE;
        }
    }
    int nargs = argc - optind;
    const char *cmd = nargs > 0 ? argv[optind] : "";
    long tail = 100;
    int follow = 0;
    if (!strcmp(cmd, "logs")) { /* logs INSTANCE [--tail N] [-f], in any order */
        const char *id = NULL;
        for (int i = optind + 1; i < argc; i++) {
            char *end;
            if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
                follow = 1;
            } else if (!strcmp(argv[i], "--tail") && i + 1 < argc) {
                tail = strtol(argv[++i], &end, 10);
                if (*end || tail < 0) {
                    fprintf(stderr, "bbctl: --tail takes a number of lines (0: all)\n");
                    return CTL_EXIT_USAGE;
                }
            } else if (argv[i][0] != '-' && !id) {
                id = argv[i];
            } else {
                usage(stderr);
                return CTL_EXIT_USAGE;
            }
        }
        if (!id || strpbrk(id, " \t\r\n") || strlen(id) > SD_NAME_MAX) {
            usage(stderr);
            return CTL_EXIT_USAGE;
        }
        char found[BB_SOCK_PATH_MAX], req[SD_NAME_MAX + 16];
        if (!path || !path[0]) {
            if (find_socket(found, sizeof found))
                return CTL_EXIT_UNAVAILABLE;
            path = found;
        }
        snprintf(req, sizeof req, "logs %s\n", id);
        json_t *ans = call(path, req);
        if (!ans)
            return CTL_EXIT_UNAVAILABLE;
        const char *err = json_string_value(json_object_get(ans, "error"));
        int rc;
        if (err) {
            fprintf(stderr, "bbctl: %s\n", err);
            rc = CTL_EXIT_NOT_FOUND;
        } else {
            rc = print_run(path, json_string_value(json_object_get(ans, "path")), id, tail,
                           follow && json_is_true(json_object_get(ans, "running")));
        }
        json_decref(ans);
        return rc;
    }
    if (!strcmp(cmd, "version") && nargs == 1) {
        printf("bbctl %s\n", SD_VERSION);
        return CTL_EXIT_OK;
    }
    int is_status = !strcmp(cmd, "status") && nargs == 1;
    int is_op = (!strcmp(cmd, "start") || !strcmp(cmd, "stop") || !strcmp(cmd, "restart")) &&
                nargs == 2;
    if (!is_status && !is_op) {
        usage(stderr);
        return CTL_EXIT_USAGE;
    }
    char found[BB_SOCK_PATH_MAX];
    if (!path || !path[0]) {
        if (find_socket(found, sizeof found))
            return CTL_EXIT_UNAVAILABLE;
        path = found;
    }
    char req[600];
    if (snprintf(req, sizeof(req), "%s%s%s\n", cmd, is_op ? " " : "",
                 is_op ? argv[optind + 1] : "") >= (int)sizeof(req) ||
        strpbrk(is_op ? argv[optind + 1] : "", " \t\r\n")) {
        fprintf(stderr, "bbctl: bad TARGET\n");
        return CTL_EXIT_USAGE;
    }
    json_t *ans = call(path, req);
    if (!ans)
        return CTL_EXIT_UNAVAILABLE;
    int rc = CTL_EXIT_OK;
    const char *err = json_string_value(json_object_get(ans, "error"));
    if (err) {
        const char *code = json_string_value(json_object_get(ans, "code"));
        fprintf(stderr, "bbctl: %s\n", err);
        rc = code && !strcmp(code, "not_found") ? CTL_EXIT_NOT_FOUND : CTL_EXIT_FAILED;
    } else if (as_json) {
        char *s = json_dumps(ans, JSON_INDENT(2));
        printf("%s\n", s ? s : "null");
        free(s);
    } else if (is_status) {
        print_status(ans);
    } else {
        printf("%s %s: %lld instance(s)\n", cmd, argv[optind + 1],
               json_integer_value(json_object_get(ans, "matched")));
    }
    json_decref(ans);
    return rc;
}
