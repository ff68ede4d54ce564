/* bbctl: the local control tool of bigbrother, over its control socket.
 *
 *   bbctl [--socket PATH | --machine NAME] [-o json] status
 *   bbctl [--socket PATH | --machine NAME] start|stop|restart TARGET
 *                                             (instance id, service name or all)
 *   bbctl [--socket PATH | --machine NAME] logs INSTANCE [--tail N] [-f]
 *                                             (one run's output: its log file,
 *                                              STATE_DIR/logs/SERVICE-SLOT/ID.log)
 *   bbctl --version | version
 *
 * PATH defaults to $BBCTL_SOCKET (or $BB_CONTROL_SOCKET, its older name), else to the
 * control socket of the one bigbrother running on the machine (its --config, read from
 * /proc; of machine NAME with --machine), else of the one control socket of the packaged
 * layout (/var/lib/bigbrother/<cluster>/control.sock). Several found: exit 2 with the
 * list. Exit codes, the same table as sdctl's: 0 done, 1 refused, 2 usage (or which
 * bigbrother is ambiguous), 3 bigbrother unreachable (or none found), 4 no such target. */
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
    fprintf(f, "usage: bbctl [--socket PATH | --machine NAME] [-o json] status\n"
               "       bbctl [--socket PATH | --machine NAME] start|stop|restart TARGET\n"
               "       bbctl [--socket PATH | --machine NAME] logs INSTANCE [--tail N] [-f]\n"
               "       bbctl --version | version\n"
               "TARGET: an instance id, a service name, or all. PATH defaults to\n"
               "$BBCTL_SOCKET, else to the control socket of the one bigbrother running on\n"
               "this machine (its config's control_socket, by default\n"
               "STATE_DIR/control.sock; --machine NAME: the one whose config says machine\n"
               "NAME), else to the one /var/lib/bigbrother/*/control.sock. With several,\n"
               "bbctl lists them (exit 2) for --socket, --machine or BBCTL_SOCKET to choose.\n"
               "logs: the output of one run, from its own log file\n"
               "(STATE_DIR/logs/SERVICE-SLOT/INSTANCE.log: the current run of a slot, or one\n"
               "of the log_runs earlier runs a slot keeps): the last N lines (default 100; 0:\n"
               "none, -f then shows only new lines; -1: all, as sdctl logs), those of the\n"
               "file's rotation .1 first when the file holds fewer (just rotated); -f follows\n"
               "it until it ends (or Ctrl-C).\n"
               "exit codes (as sdctl's): 0 ok, 1 refused, 2 usage (or several bigbrothers\n"
               "to choose from), 3 bigbrother unreachable or none found, 4 no such instance\n"
               "or service\n");
}

/* The bigbrothers bbctl can find on this machine. */
#define FOUND_MAX 16
typedef struct {
    char sock[BB_SOCK_PATH_MAX];
    char machine[SD_NAME_MAX + 1]; /* "" when not known (a socket found on disk) */
    long pid;                      /* 0 when not known */
} found_t;

/* The path of the --config of the bigbrother process pid, from its command line (args,
 * len bytes, NUL-separated), relative paths against its working directory, into out; 0
 * when pid does not run bigbrother with a --config. */
static int proc_config(long pid, const char *exe, const char *args, size_t len, char *out,
                       size_t cap)
{
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
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
    if (!is_bb || !config)
        return 0;
    if (config[0] == '/') {
        snprintf(out, cap, "%s", config);
        return 1;
    }
    char path[64], cwd[4096];
    snprintf(path, sizeof path, "/proc/%ld/cwd", pid);
    ssize_t m = readlink(path, cwd, sizeof cwd - 1);
    if (m <= 0)
        return 0;
    cwd[m] = '\0';
    snprintf(out, cap, "%s/%s", cwd, config);
    return 1;
}

/* Every bigbrother process of this machine (an executable named bigbrother, or one run
 * by another program), its control socket and machine read from its --config as
 * bigbrother reads it, into found. Returns how many (at most FOUND_MAX kept), -1 when
 * /proc cannot be listed. */
static int find_running(found_t *found)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    int n = 0;
    sd_log_set_level(SD_LOG_ERROR); /* the configs' own warnings are bigbrother's to say */
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64], exe[4096], args[8192], cfgpath[4352];
        snprintf(path, sizeof path, "/proc/%ld/exe", pid);
        ssize_t len = readlink(path, exe, sizeof exe - 1);
        if (len <= 0)
            continue;
        exe[len] = '\0';
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t alen = fread(args, 1, sizeof args - 1, f);
        fclose(f);
        args[alen] = '\0';
        if (!proc_config(pid, exe, args, alen, cfgpath, sizeof cfgpath))
            continue;
        bb_config_t cfg;
        char err[512];
        if (bb_config_load(cfgpath, &cfg, err, sizeof err)) {
            fprintf(stderr, "bbctl: bigbrother (pid %ld): %s\n", pid, err);
            continue;
        }
        if (n < FOUND_MAX) {
            sd_strlcpy(found[n].sock, cfg.control_socket, sizeof found[n].sock);
            sd_strlcpy(found[n].machine, cfg.machine, sizeof found[n].machine);
            found[n].pid = pid;
            n++;
        }
        bb_config_free(&cfg);
    }
    closedir(d);
    return n;
}

/* The packaged layout's control sockets (STATE_DIR/control.sock for a state dir
 * BB_STATE_ROOT/<cluster>, packaging/bigbrother.json), for a bigbrother whose process
 * cannot be read (another user's /proc entry). Returns how many, into found. */
#define BB_STATE_ROOT "/var/lib/bigbrother"
static int find_on_disk(found_t *found)
{
    DIR *d = opendir(BB_STATE_ROOT);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < FOUND_MAX) {
        struct stat st;
        char *path = NULL;
        if (e->d_name[0] != '.' &&
            asprintf(&path, "%s/%s/control.sock", BB_STATE_ROOT, e->d_name) > 0 &&
            strlen(path) < BB_SOCK_PATH_MAX && stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
            found[n] = (found_t){.pid = 0};
            sd_strlcpy(found[n].sock, path, sizeof found[n].sock);
            n++;
        }
        free(path);
    }
    if (d)
        closedir(d);
    return n;
}

/* The control socket to use when no --socket and no BBCTL_SOCKET / BB_CONTROL_SOCKET
 * named one: the one bigbrother found on this machine (among those of machine, when not
 * NULL), into out. CTL_EXIT_OK; CTL_EXIT_USAGE when several are found (listed, with how
 * to choose); CTL_EXIT_UNAVAILABLE when none is (saying where bbctl looked). */
static int find_socket(const char *machine, char *out, size_t cap)
{
    found_t all[FOUND_MAX], *pick[FOUND_MAX];
    int n = find_running(all), from_proc = n > 0;
    if (n <= 0)
        n = find_on_disk(all);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!machine || !strcmp(all[i].machine, machine))
            pick[k++] = &all[i];
    if (k == 1) {
        sd_strlcpy(out, pick[0]->sock, cap);
        return CTL_EXIT_OK;
    }
    if (k == 0) {
        if (machine && n)
            fprintf(stderr, "bbctl: no bigbrother of machine '%s' runs here (%d other%s)\n",
                    machine, n, n == 1 ? "" : "s");
        else
            fprintf(stderr, "bbctl: no bigbrother found: no process named bigbrother with a "
                            "--config in /proc, no control socket in %s/*/control.sock; "
                            "name one with --socket PATH or BBCTL_SOCKET\n", BB_STATE_ROOT);
        return CTL_EXIT_UNAVAILABLE;
    }
    fprintf(stderr, "bbctl: %d bigbrothers %s; choose one with --socket PATH, --machine NAME "
                    "or BBCTL_SOCKET=PATH:\n",
            k, from_proc ? "run here" : "have a control socket here");
    for (int i = 0; i < k; i++) {
        if (pick[i]->pid)
            fprintf(stderr, "  machine %s (pid %ld): --socket %s\n", pick[i]->machine,
                    pick[i]->pid, pick[i]->sock);
        else
            fprintf(stderr, "  --socket %s\n", pick[i]->sock);
    }
    return CTL_EXIT_USAGE;
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

/* Prints the last `tail` lines (0: none, -1: all, as sdctl logs) of instance id's run from its log at path (the
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
    /* the run is read to its end either way: a follower goes on from there */
    int ended = bb_log_read_run(f, path, id, tail == -1 ? 0 : tail == 0 ? 1 : tail, &head);
    if (head.len && tail != 0)
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
                                         {"machine", required_argument, NULL, 'm'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    const char *path = getenv("BBCTL_SOCKET"), *machine = NULL;
    if (!path || !path[0])
        path = getenv("BB_CONTROL_SOCKET"); /* the name before BBCTL_SOCKET */
    int as_json = 0, o;
    while ((o = getopt_long(argc, argv, "+s:m:o:hV", opts, NULL)) != -1) {
        switch (o) {
        case 's': path = optarg; break;
        case 'm': machine = optarg; break;
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
                if (*end || end == argv[i] || tail < -1) {
                    fprintf(stderr, "bbctl: --tail takes a number of lines (0: none, -1: "
                                    "all)\n");
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
        if (machine || !path || !path[0]) {
            int rc = find_socket(machine, found, sizeof found);
            if (rc != CTL_EXIT_OK)
                return rc;
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
    if (machine || !path || !path[0]) {
        int frc = find_socket(machine, found, sizeof found);
        if (frc != CTL_EXIT_OK)
            return frc;
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
