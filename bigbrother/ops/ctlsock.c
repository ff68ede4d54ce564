/* The local control socket (SOCK_STREAM, mode 0600: only bigbrother's user, or root,
 * may connect). One request line per connection, one JSON answer, then close:
 *
 *   status                       -> {"machine", "cluster", "pending_events", "instances": [...]}
 *   start|stop|restart TARGET    -> {"matched": N}  or  {"error": "..."}
 *   logs INSTANCE                -> {"instance", "path", "running"}: the log file of that
 *                                   run (STATE_DIR/logs/<service>-<slot>/<id>.log, of
 *                                   the current run of a slot or of an earlier one the
 *                                   slot still keeps), for bbctl to read
 *
 * TARGET is an instance id, a service name or "all". Used by bbctl. */
#include "ops/bb_ops.h"
#include "sdlog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define REQ_MAX 512
#define CTL_CLIENTS_MAX 32
#define CTL_TIMEOUT_MS 5000

typedef struct ctl_client {
    bb_watch_t w;
    bb_timer_t timeout;
    char req[REQ_MAX + 1];
    size_t reqlen;
    char *out;
    size_t outlen, outoff;
    struct ctl_client *prev, *next;
} ctl_client_t;

static bb_watch_t ctl_w = {-1, NULL};
static int nclients;
static ctl_client_t *clients;

static void client_close(ctl_client_t *c)
{
    bb_timer_cancel(&c->timeout);
    bb_watch_close(&c->w);
    free(c->out);
    c->out = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    bb_defer_free(c);
    nclients--;
}

static json_t *status_json(void)
{
    json_t *arr = json_array();
    int64_t now = sd_wall_ms();
    for (int i = 0; i < bb.ninst; i++) {
        const bb_inst_t *in = &bb.inst[i];
        int running = in->pid > 0;
        char text[SD_REASON_TEXT_MAX];
        bb_inst_reason_text(in, text, sizeof text);
        json_t *o = json_pack(
            "{s:s, s:s, s:i, s:s, s:i, s:i, s:i, s:s, s:o, s:o, s:o, s:I, s:s, s:I, s:s, s:i, s:b}",
            "instance", in->id, "service", in->svc->name, "slot", in->slot, "state",
            bb_state_name(in->state), "pid", running ? (int)in->pid : 0, "restarts",
            in->restarts, "generation", in->generation, "reason", bb_inst_reason(in),
            "reason_text", in->reason != BB_NO_REASON ? json_string(text) : json_null(), "code",
            in->code >= 0 ? json_integer(in->code) : json_null(), "signal",
            in->sig > 0 ? json_integer(in->sig) : json_null(), "silent_ms",
            (json_int_t)(sd_stop_reason_flags(in->reason) & SD_STOP_F_SILENT ? in->why_silent_ms
                                                                              : 0),
            "detail", in->detail,
            "uptime_ms", (json_int_t)(running && in->spawned_wall ? now - in->spawned_wall : 0),
            "status", in->status, "players", in->players, "agent", in->conn != NULL);
        json_array_append_new(arr, o);
    }
    return json_pack("{s:s, s:s, s:I, s:o}", "machine", bb.cfg.machine, "cluster",
                     bb.cfg.cluster, "pending_events",
                     (json_int_t)(bb.report ? bb_report_pending(bb.report) : 0), "instances",
                     arr);
}

/* The logs request: the log path of instance id (running or not). */
static json_t *logs_json(const char *id)
{
    char path[600];
    for (int i = 0; i < bb.ninst; i++) /* the current run of a slot */
        if (!strcmp(bb.inst[i].id, id)) {
            bb_log_path_current(&bb.inst[i], path, sizeof path);
            return json_pack("{s:s, s:s, s:b}", "instance", id, "path", path, "running",
                             bb.inst[i].pid > 0);
        }
    if (bb_log_find(id, path, sizeof path) == 0) /* an earlier run a slot keeps */
        return json_pack("{s:s, s:s, s:b}", "instance", id, "path", path, "running", 0);
    return json_pack("{s:s, s:s}", "error", "no log of that instance here", "code", "not_found");
}

static json_t *handle(char *req)
{
    char *save = NULL, *cmd = strtok_r(req, " \t\r", &save);
    char *target = strtok_r(NULL, " \t\r", &save);
    if (cmd && !strcmp(cmd, "status") && !target)
        return status_json();
    if (cmd && !strcmp(cmd, "logs") && target && !strtok_r(NULL, " \t\r", &save))
        return logs_json(target);
    if (!cmd || (strcmp(cmd, "start") && strcmp(cmd, "stop") && strcmp(cmd, "restart")) ||
        !target || strtok_r(NULL, " \t\r", &save))
        return json_pack("{s:s}", "error",
                         "usage: status | start TARGET | stop TARGET | restart TARGET | "
                         "logs INSTANCE");
    int n = bb_operator(cmd, target);
    if (n == 0)
        return json_pack("{s:s, s:s}", "error", "no instance or service by that name", "code",
                         "not_found");
    return json_pack("{s:i}", "matched", n);
}

static void client_flush(ctl_client_t *c)
{
    while (c->outoff < c->outlen) {
        ssize_t n = send(c->w.fd, c->out + c->outoff, c->outlen - c->outoff,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno == EAGAIN) {
            bb_watch_mod(&c->w, EPOLLOUT);
            return;
        }
        if (n <= 0)
            break;
        c->outoff += (size_t)n;
    }
    client_close(c);
}

static void on_client(bb_watch_t *w, uint32_t events)
{
    ctl_client_t *c = container_of(w, ctl_client_t, w);
    if (c->out) {
        client_flush(c);
        return;
    }
    ssize_t n = recv(w->fd, c->req + c->reqlen, REQ_MAX - c->reqlen, MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN)
        return;
    if (n <= 0) {
        client_close(c);
        return;
    }
    c->reqlen += (size_t)n;
    c->req[c->reqlen] = 0;
    char *nl = strchr(c->req, '\n');
    json_t *ans;
    if (nl) {
        *nl = 0;
        ans = handle(c->req);
    } else if (c->reqlen == REQ_MAX) {
        ans = json_pack("{s:s}", "error", "request longer than 512 bytes");
    } else {
        return;
    }
    c->out = ans ? json_dumps(ans, JSON_COMPACT) : NULL;
    json_decref(ans);
    if (!c->out) {
        client_close(c);
        return;
    }
    c->outlen = strlen(c->out);
    c->out[c->outlen++] = '\n'; /* replaces the NUL: out is sent by length */
    client_flush(c);
}

static void on_client_timeout(bb_timer_t *t)
{
    client_close(container_of(t, ctl_client_t, timeout));
}

static void on_ctl_accept(bb_watch_t *w, uint32_t events)
{
    for (;;) {
        int fd = accept4(w->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        ctl_client_t *c = nclients < CTL_CLIENTS_MAX ? calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            close(fd);
            continue;
        }
        c->w.fd = fd;
        c->w.fn = on_client;
        c->timeout.fn = on_client_timeout;
        if (bb_watch_add(&c->w, EPOLLIN)) {
            close(fd);
            free(c);
            continue;
        }
        bb_timer_set(&c->timeout, sd_mono_ms() + CTL_TIMEOUT_MS);
        c->next = clients;
        if (clients)
            clients->prev = c;
        clients = c;
        nclients++;
    }
}

int bb_ctl_init(void)
{
    return bb__unix_listen_watch(&ctl_w, bb.cfg.control_socket, SOCK_STREAM, 0600,
                                 on_ctl_accept);
}

void bb_ctl_close(void)
{
    bb_watch_close(&ctl_w);
    while (clients)
        client_close(clients);
    bb_loop_free_deferred();
}
