/* bbctl: the local control tool of bigbrother, over its control socket.
 *
 *   bbctl [--socket PATH] [-o json] status
 *   bbctl [--socket PATH] start|stop|restart TARGET     (instance id, service name or all)
 *
 * PATH defaults to $BB_CONTROL_SOCKET. Exit codes: 0 done, 1 bigbrother refused (no such
 * target), 100 usage, 111 cannot reach bigbrother. */
#include "sdlog.h"
#include "sdutil.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define ANSWER_MAX (32 << 20)

static void usage(FILE *f)
{
    fprintf(f, "usage: bbctl [--socket PATH] [-o json] status\n"
               "       bbctl [--socket PATH] start|stop|restart TARGET\n"
               "TARGET: an instance id, a service name, or all. PATH defaults to\n"
               "$BB_CONTROL_SOCKET (bigbrother's control_socket, by default\n"
               "STATE_DIR/control.sock).\n");
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
    printf("%-40s %-16s %-9s %-8s %-8s %-24s %s\n", "INSTANCE", "SERVICE", "STATE", "PID",
           "RESTARTS", "LAST EXIT", "UPTIME");
    json_array_foreach(json_object_get(st, "instances"), i, in) {
        char up[32], pid[16] = "-";
        const char *last = json_string_value(json_object_get(in, "reason_text"));
        if (!last)
            last = "-";
        if (json_integer_value(json_object_get(in, "pid")) > 0)
            snprintf(pid, sizeof(pid), "%lld", json_integer_value(json_object_get(in, "pid")));
        fmt_uptime(json_integer_value(json_object_get(in, "uptime_ms")), up, sizeof(up));
        printf("%-40s %-16s %-9s %-8s %-8lld %-24s %s\n",
               json_string_value(json_object_get(in, "instance")),
               json_string_value(json_object_get(in, "service")),
               json_string_value(json_object_get(in, "state")), pid,
               json_integer_value(json_object_get(in, "restarts")), last, up);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *path = getenv("BB_CONTROL_SOCKET");
    int as_json = 0, o;
    while ((o = getopt_long(argc, argv, "s:o:h", opts, NULL)) != -1) {
        switch (o) {
        case 's': path = optarg; break;
        case 'o':
            if (strcmp(optarg, "json")) {
                fprintf(stderr, "bbctl: -o takes json\n");
                return 100;
            }
            as_json = 1;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 100;
        }
    }
    int nargs = argc - optind;
    const char *cmd = nargs > 0 ? argv[optind] : "";
    int is_status = !strcmp(cmd, "status") && nargs == 1;
    int is_op = (!strcmp(cmd, "start") || !strcmp(cmd, "stop") || !strcmp(cmd, "restart")) &&
                nargs == 2;
    if (!is_status && !is_op) {
        usage(stderr);
        return 100;
    }
    if (!path || !path[0]) {
        fprintf(stderr, "bbctl: no control socket: use --socket PATH or BB_CONTROL_SOCKET\n");
        return 100;
    }
    char req[600];
    if (snprintf(req, sizeof(req), "%s%s%s\n", cmd, is_op ? " " : "",
                 is_op ? argv[optind + 1] : "") >= (int)sizeof(req) ||
        strpbrk(is_op ? argv[optind + 1] : "", " \t\r\n")) {
        fprintf(stderr, "bbctl: bad TARGET\n");
        return 100;
    }
    json_t *ans = call(path, req);
    if (!ans)
        return 111;
    int rc = 0;
    const char *err = json_string_value(json_object_get(ans, "error"));
    if (err) {
        fprintf(stderr, "bbctl: %s\n", err);
        rc = 1;
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
