/* The agent socket: one persistent SOCK_SEQPACKET connection per game process
 * (libbbagent). The first message must be HELLO with the instance id; the claim is
 * checked against the kernel's SO_PEERCRED pid, which must be the instance's process or
 * a member of its process group. A connection that fails the check is logged and
 * closed. After WELCOME, every message proves the game loop runs; a closed connection
 * means the process is going away (its pidfd tells when it is gone). Allocations go to
 * the agent and their acknowledgements and releases come back through the handlers
 * alloc.c registers (bb_agent_handle): after the status fields, each message runs the
 * table of handlers, one dispatch line per field. */
#include "agent/bb_agent.h"
#include "bbproto.h"
#include "sdlog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSGS_PER_WAKEUP 16
#define HELLO_TIMEOUT_MS 2000 /* a connection that does not say HELLO by then is closed */
#define CONN_SLACK 64 /* connections allowed beyond one per instance (reconnects) */
#define PENDING_PER_PEER 4 /* connections of one process that have not said HELLO yet */

typedef struct bb_conn {
    bb_watch_t w;
    bb_inst_t *in; /* NULL until HELLO is accepted */
    pid_t peer;
    bb_timer_t hello_timer;
    struct bb_conn *prev, *next;
} bb_conn_t;

static bb_watch_t listen_w = {-1, NULL};
static int nconns;
static bb_conn_t *conns; /* every open connection, newest first */
static int ports_json(const char *v, size_t n, char *out, size_t cap);
static bb_ratelimit_t reject_log; /* rejected, refused, evicted, bad messages */

#define HANDLERS_MAX 8
static const bb_agent_handler_t *handlers[HANDLERS_MAX]; /* in registration order */
static int nhandlers;
static void (*listeners[BB_AGENT__COUNT][HANDLERS_MAX])(bb_inst_t *in);
static int nlisteners[BB_AGENT__COUNT];

int bb_agent_handle(const bb_agent_handler_t *h)
{
    for (int i = 0; i < nhandlers; i++)
        if (handlers[i] == h)
            return 0;
    if (nhandlers == HANDLERS_MAX)
        return -ENOSPC;
    handlers[nhandlers++] = h;
    return 0;
}

int bb_agent_on(enum bb_agent_event ev, void (*fn)(bb_inst_t *in))
{
    for (int i = 0; i < nlisteners[ev]; i++)
        if (listeners[ev][i] == fn)
            return 0;
    if (nlisteners[ev] == HANDLERS_MAX)
        return -ENOSPC;
    listeners[ev][nlisteners[ev]++] = fn;
    return 0;
}

/* Tells the listeners of ev about in. */
static void agent_event(enum bb_agent_event ev, bb_inst_t *in)
{
    for (int i = 0; i < nlisteners[ev]; i++)
        listeners[ev][i](in);
}

int bb__log_ok(bb_ratelimit_t *rl)
{
    int64_t now = sd_mono_ms();
    if (!rl->last_ms || now - rl->last_ms >= 1000) {
        rl->last_ms = now;
        rl->burst = 0;
    }
    if (rl->burst >= BB_LOG_BURST) {
        rl->held++;
        return 0;
    }
    rl->burst++;
    return 1;
}

/* The held-back count for the line about to be written (then reset). */
static long long held(bb_ratelimit_t *rl)
{
    long long n = rl->held;
    rl->held = 0;
    return n;
}

void bb__copy_printable(char *dst, size_t cap, const char *src, size_t len)
{
    size_t n = len < cap - 1 ? len : cap - 1;
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    dst[n] = 0;
}

static void conn_close(bb_conn_t *c, const char *why)
{
    if (c->in && c->in->conn == c) {
        log_info("agent disconnected", "instance=%s pid=%d why=%s", c->in->id, (int)c->peer,
                 why);
        c->in->conn = NULL;
    }
    bb_timer_cancel(&c->hello_timer);
    bb_watch_close(&c->w);
    if (c->prev)
        c->prev->next = c->next;
    else
        conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    bb_defer_free(c);
    nconns--;
}

void bb_agent_detach(bb_inst_t *in)
{
    if (in->conn)
        conn_close(in->conn, "process exited");
}

static int conn_send(bb_conn_t *c, const char *key, const char *val, const char *key2,
                     const char *val2)
{
    char msg[256];
    int n = bbproto_put(msg, sizeof(msg), 0, key, val);
    if (n >= 0 && key2)
        n = bbproto_put(msg, sizeof(msg), (size_t)n, key2, val2);
    if (n < 0)
        return n;
    if (send(c->w.fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) != n)
        return -errno;
    return 0;
}

int bb_agent_send_msg(bb_inst_t *in, const char *msg, size_t len)
{
    if (!in->conn)
        return -ENOTCONN;
    if (send(in->conn->w.fd, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)len)
        return -errno;
    return 0;
}

void bb_agent_send(bb_inst_t *in, const char *key, const char *val, const char *key2,
                   const char *val2)
{
    if (!in->conn)
        return;
    int rc = conn_send(in->conn, key, val, key2, val2);
    if (rc)
        log_warn("agent message not sent", "instance=%s key=%s error=%s", in->id, key,
                 strerror(-rc));
}

/* HELLO: find the instance and check the kernel's view of the sender. 0 or -1 (closed). */
static int hello(bb_conn_t *c, const bbproto_field_t *f, int n)
{
    char id[SD_NAME_MAX + 1];
    size_t len = 0;
    const char *v = bbproto_get(f, n, "INSTANCE", &len);
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    if (getsockopt(c->w.fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen)) {
        conn_close(c, "no peer credentials");
        return -1;
    }
    c->peer = cr.pid;
    if (!bbproto_get(f, n, "HELLO", NULL) || !v || len == 0 || len > SD_NAME_MAX) {
        if (bb__log_ok(&reject_log))
            log_warn("agent rejected", "pid=%d why=%s held_back=%lld", (int)cr.pid,
                     "first message must be HELLO=1 with INSTANCE=<id>", held(&reject_log));
        conn_close(c, "bad hello");
        return -1;
    }
    memcpy(id, v, len);
    id[len] = 0;
    bb_inst_t *in = bb_inst_by_id(id);
    if (!in) {
        if (bb__log_ok(&reject_log))
            log_warn("agent rejected", "pid=%d instance=%s why=%s held_back=%lld", (int)cr.pid,
                     id, "no such running instance", held(&reject_log));
        conn_close(c, "unknown instance");
        return -1;
    }
    if (cr.pid != in->pid && getpgid(cr.pid) != in->pid) {
        if (bb__log_ok(&reject_log))
            log_warn("agent rejected", "pid=%d instance=%s instance_pid=%d why=%s held_back=%lld",
                     (int)cr.pid, id, (int)in->pid,
                     "peer is not the instance's process or in its group", held(&reject_log));
        conn_close(c, "wrong process");
        return -1;
    }
    if (in->conn)
        conn_close(in->conn, "replaced by a new connection");
    bb_timer_cancel(&c->hello_timer);
    in->conn = c;
    c->in = in;
    char hb[16];
    int liveness = in->svc->health.liveness_timeout_ms;
    snprintf(hb, sizeof(hb), "%d", liveness / 4 > 50 ? liveness / 4 : 50);
    if (conn_send(c, "WELCOME", "1", "HEARTBEAT_MS", hb)) {
        conn_close(c, "welcome not sent");
        return -1;
    }
    log_info("agent connected", "instance=%s pid=%d heartbeat_ms=%s", id, (int)cr.pid, hb);
    agent_event(BB_AGENT_CONNECTED, in);
    return 0;
}

/* One message from an agent. Returns -1 when the connection was closed. */
static int agent_message(bb_conn_t *c, const char *buf, size_t len)
{
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    int n = bbproto_parse(buf, len, f, BBPROTO_MAX_FIELDS);
    if (n < 0) {
        if (bb__log_ok(&reject_log))
            log_warn("bad agent message", "pid=%d instance=%s error=%s held_back=%lld",
                     (int)c->peer, c->in ? c->in->id : "", strerror(-n), held(&reject_log));
        conn_close(c, "bad message");
        return -1;
    }
    if (!c->in && hello(c, f, n))
        return -1;
    bb_inst_t *in = c->in;
    size_t vlen;
    const char *v;
    long long players, max_players;
    char status[sizeof(in->status)];
    int changed = 0;
    if ((v = bbproto_get(f, n, "STATUS", &vlen))) {
        bb__copy_printable(status, sizeof(status), v, vlen);
        changed = strcmp(status, in->status) != 0;
        memcpy(in->status, status, sizeof(status));
    }
    if (!bbproto_get_int(f, n, "PLAYERS", 0, SD_PLAYERS_MAX, &players)) {
        changed |= in->players != (int)players;
        in->players = (int)players;
    }
    if (!bbproto_get_int(f, n, "MAX_PLAYERS", 0, SD_PLAYERS_MAX, &max_players)) {
        changed |= in->max_players != (int)max_players;
        in->max_players = (int)max_players;
    }
    if ((v = bbproto_get(f, n, "PORTS", &vlen))) {
        char ports[sizeof(in->ports)];
        if (ports_json(v, vlen, ports, sizeof ports)) {
            if (bb__log_ok(&reject_log))
                log_warn("bad agent ports", "instance=%s ports=%.*s held_back=%lld", in->id,
                         (int)(vlen > 128 ? 128 : vlen), v, held(&reject_log));
        } else if (strcmp(ports, in->ports)) {
            memcpy(in->ports, ports, sizeof ports);
            changed = 1;
        }
    }
    if (changed)
        agent_event(BB_AGENT_STATUS, in);
    for (int i = 0; i < nhandlers; i++) {
        const bb_agent_handler_t *h = handlers[i];
        vlen = 0;
        if (!h->key || (v = bbproto_get(f, n, h->key, &vlen)))
            h->fn(in, h->key ? v : NULL, vlen);
    }
    if (bbproto_get(f, n, "STOPPING", NULL))
        log_info("instance stopping on its own", "instance=%s", in->id);
    /* readiness and liveness come from the configured health type only */
    if (in->svc->health.type == BB_H_AGENT)
        bb_inst_event(in, bbproto_get(f, n, "READY", NULL) ? EV_READY : EV_ALIVE);
    if ((v = bbproto_get(f, n, "BYE", &vlen))) {
        conn_close(c, "bye");
        return -1;
    }
    return 0;
}

/* PORTS=<name>:<port>[ <name>:<port>...] (at most SD_PORTS_MAX, names as events take
 * them) into compact JSON {"name":port,...}; 0, or -1 when malformed. */
static int ports_json(const char *v, size_t n, char *out, size_t cap)
{
    char text[BBPROTO_MAX_VALUE + 1];
    if (n >= sizeof text)
        return -1;
    memcpy(text, v, n);
    text[n] = '\0';
    json_t *o = json_object();
    char *save = NULL;
    int bad = 0;
    for (char *t = strtok_r(text, " ", &save); t && !bad; t = strtok_r(NULL, " ", &save)) {
        char *colon = strrchr(t, ':'), *end;
        if (!colon) {
            bad = 1;
            break;
        }
        *colon = '\0';
        long port = strtol(colon + 1, &end, 10);
        bad = !sd_name_valid(t, SD_PORT_NAME_MAX) || *end || end == colon + 1 || port < 1 ||
              port > 65535 || json_object_size(o) >= SD_PORTS_MAX;
        if (!bad)
            json_object_set_new(o, t, json_integer(port));
    }
    char *dump = NULL;
    if (!bad && json_object_size(o) > 0)
        dump = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!dump || strlen(dump) >= cap) {
        free(dump);
        return -1;
    }
    memcpy(out, dump, strlen(dump) + 1);
    free(dump);
    return 0;
}

static void on_conn(bb_watch_t *w, uint32_t events)
{
    bb_conn_t *c = container_of(w, bb_conn_t, w);
    char buf[BBPROTO_MAX_MSG + 1];
    for (int i = 0; i < MSGS_PER_WAKEUP; i++) {
        ssize_t n = recv(w->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (n <= 0) {
            conn_close(c, n == 0 ? "closed by the process" : strerror(errno));
            return;
        }
        if (n > BBPROTO_MAX_MSG) {
            if (bb__log_ok(&reject_log))
                log_warn("bad agent message", "pid=%d error=%s held_back=%lld", (int)c->peer,
                         "over 4096 bytes", held(&reject_log));
            conn_close(c, "message too big");
            return;
        }
        if (agent_message(c, buf, (size_t)n))
            return;
    }
}

static void on_hello_timeout(bb_timer_t *t)
{
    bb_conn_t *c = container_of(t, bb_conn_t, hello_timer);
    if (bb__log_ok(&reject_log))
        log_warn("agent rejected", "pid=%d why=%s held_back=%lld", (int)c->peer,
                 "no HELLO within 2 s", held(&reject_log));
    conn_close(c, "no hello");
}

/* Makes room for a new connection from peer: refuses it (0) when peer already has
 * PENDING_PER_PEER connections that have not said HELLO; when the table is full, closes
 * the oldest connection that has not said HELLO, so a real instance, which says HELLO at
 * once, always gets in however many idle clients hold connections. Returns 1 when the
 * new connection may be accepted. */
static int make_room(pid_t peer)
{
    int pending = 0;
    bb_conn_t *oldest = NULL;
    for (bb_conn_t *c = conns; c; c = c->next)
        if (!c->in) {
            pending += c->peer == peer;
            oldest = c;
        }
    const char *why = pending >= PENDING_PER_PEER
                          ? "too many connections without HELLO from this process"
                      : nconns < bb.ninst + CONN_SLACK ? NULL
                      : oldest                         ? NULL
                                                       : "too many connections";
    if (why) {
        if (bb__log_ok(&reject_log))
            log_warn("agent connection refused", "pid=%d why=%s connections=%d held_back=%lld",
                     (int)peer, why, nconns, held(&reject_log));
        return 0;
    }
    if (nconns >= bb.ninst + CONN_SLACK) {
        if (bb__log_ok(&reject_log))
            log_warn("agent connection evicted", "pid=%d why=%s held_back=%lld", (int)oldest->peer,
                     "the oldest without HELLO, to make room", held(&reject_log));
        conn_close(oldest, "evicted");
    }
    return 1;
}

static void on_accept(bb_watch_t *w, uint32_t events)
{
    for (;;) {
        int fd = accept4(w->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR)
                log_warn("agent accept failed", "error=%s", strerror(errno));
            return;
        }
        struct ucred cr = {0};
        socklen_t crlen = sizeof(cr);
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen);
        bb_conn_t *c = make_room(cr.pid) ? calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            close(fd);
            continue;
        }
        c->peer = cr.pid;
        c->w.fd = fd;
        c->w.fn = on_conn;
        if (bb_watch_add(&c->w, EPOLLIN)) {
            close(fd);
            free(c);
            continue;
        }
        c->hello_timer.fn = on_hello_timeout;
        bb_timer_set(&c->hello_timer, sd_mono_ms() + HELLO_TIMEOUT_MS);
        c->next = conns;
        if (conns)
            conns->prev = c;
        conns = c;
        nconns++;
    }
}

/* The state machine's shutdown hook: the first step of a stop, over the connection. */
static void shutdown_hook(bb_inst_t *in, int grace_ms)
{
    char grace[24];
    snprintf(grace, sizeof(grace), "%d", grace_ms);
    bb_agent_send(in, "SHUTDOWN", "1", "GRACE_MS", grace);
}

int bb_agentsrv_init(void)
{
    bb_inst_hooks.shutdown = shutdown_hook;
    bb_inst_hooks.detach = bb_agent_detach;
    return bb__unix_listen_watch(&listen_w, bb.cfg.agent_socket, SOCK_SEQPACKET, 0666,
                                 on_accept);
}

/* Closes the listening socket and every connection (bigbrother is exiting: the agents
 * reconnect to the next one). */
void bb_agentsrv_close(void)
{
    bb_watch_close(&listen_w);
    while (conns) {
        bb_conn_t *c = conns;
        if (c->in)
            c->in->conn = NULL;
        c->in = NULL;
        conn_close(c, "bigbrother exiting");
    }
    bb_loop_free_deferred();
}
