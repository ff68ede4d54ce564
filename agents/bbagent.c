/* libbbagent: one non-blocking SOCK_SEQPACKET connection to Big Brother, kept by the
 * game's own calls (no thread, no signal handler, no allocation after bbagent_open).
 *
 * Connection states, driven only by the API calls:
 *
 *   state \ event   call, 500 ms since last try   send/recv error, EOF   call otherwise
 *   disabled        no-op                         -                      no-op
 *   down            connect: up (+HELLO, resend)  -                      -ENOTCONN
 *                   or stay down
 *   up              -                             close: down            send owed msgs
 *
 * "Owed" messages are tracked in `dirty`: on every (re)connection HELLO, then READY and
 * the last status if the game already said them; a send that finds the socket full
 * leaves its bit set and the next call retries it. Allocation acknowledgements and a
 * release are owed until sent once, on whatever connection: they survive a reconnect.
 *
 * Allocations: an ALLOCATED or DEALLOCATED message read from Big Brother waits in one
 * pending slot (the reading stops while it is full, the rest stays in the socket) until
 * bbagent_poll returns it; then it is copied into the event buffers the returned event
 * points into, and an ALLOCATED one is remembered in a small ring of recent allocations
 * with its acknowledgement owed. An ALLOCATED for an id in the ring (Big Brother sends
 * it again on a new connection until it sees the acknowledgement) is acknowledged
 * again, not returned again. */
#include "bbagent.h"
#include "bbproto.h"
#include "sdname.h" /* the name rule, header-only: the shim links nothing of libsdcommon */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

#define RECONNECT_MS 500          /* at most one connection attempt per this period */
#define BEAT_MIN_MS 50            /* never more than one heartbeat packet per 50 ms */
#define BEAT_DEFAULT_HB_MS 250    /* HEARTBEAT_MS until a WELCOME says otherwise */
#define PAYLOAD_MAX BBPROTO_MAX_VALUE /* the payload, compact JSON */
#define RECENT_MAX 8              /* allocations remembered to spot a resent one */
#define PLAYERS_MAX 1000000
#define PORTS_MAX 8               /* named ports a game reports (bbagent_port) */
#define PORT_NAME_MAX 32          /* the shim's room per name (events allow SD_PORT_NAME_MAX) */
#define POLL_BUDGET 16            /* packets read per bbagent_poll call */
#define NEVER (INT64_MIN / 2)

enum { OWE_HELLO = 1, OWE_READY = 2, OWE_STATUS = 4, OWE_ACK = 8, OWE_RELEASE = 16 };
#define OWE_UNTIL_SENT (OWE_ACK | OWE_RELEASE) /* kept across a reconnect */

/* An allocation message read from Big Brother, or the one returned by the last poll. */
typedef struct {
    int type;                   /* BBAGENT_EVENT_ALLOCATED / _DEALLOCATED, 0: none */
    int players, join;
    char id[SD_NAME_MAX + 1]; /* an allocation id: a name */
    char payload[PAYLOAD_MAX + 1];
} alloc_msg_t;

struct bbagent {
    /* What every bbagent_heartbeat call reads comes first, in one cache line: a game
     * calls it once per tick, when the line is usually cold. */
    int fd;                     /* the connection, or -1 */
    int enabled;                /* a socket path was given */
    unsigned dirty;             /* OWE_* still to send on this connection */
    int64_t last_beat_ms;       /* last heartbeat packet sent on this connection */
    int64_t beat_every_ms;      /* max(BEAT_MIN_MS, HEARTBEAT_MS / 4) */
    int64_t last_connect_ms;    /* last connection attempt */
    int64_t clock_step_ms;      /* resolution of the coarse clock, rounded up */
    struct sockaddr_un addr;
    socklen_t addrlen;
    int ready;                  /* the game called bbagent_ready */
    int has_status;             /* the game called bbagent_status */
    int players, max_players;   /* -1: not given */
    int shutdown_pending;
    int shutdown_grace_ms;      /* -1: none given */
    int drain_pending;
    char instance[SD_NAME_MAX + 1];
    char status[BBPROTO_MAX_VALUE + 1];
    struct {
        char name[PORT_NAME_MAX + 1];
        int port;
    } ports[PORTS_MAX];         /* bbagent_port, sent with the status as PORTS= */
    int nports;
    char buf[BBPROTO_MAX_MSG];  /* scratch for one message out */
    char in[BBPROTO_MAX_FRAME]; /* one packet read from Big Brother */
    char cred[BBPROTO_CREDENTIAL_MAX + 1]; /* the newest CREDENTIAL, NUL-terminated */
    size_t cred_len;            /* 0: none received yet */
    alloc_msg_t pending;        /* read, not yet returned by bbagent_poll */
    alloc_msg_t returned;       /* what the last returned event points into */
    int returned_valid;         /* the last event bbagent_poll returned was `returned` */
    struct {
        char id[SD_NAME_MAX + 1]; /* an allocation id: a name */
        int owe_ack;            /* ALLOCATION_ACK not sent yet */
    } recent[RECENT_MAX];       /* the last allocations returned, a ring */
    int recent_next;
};

static const char HEARTBEAT_MSG[] = "HEARTBEAT=1\n";

/* The coarse monotonic clock is read from the vDSO without a syscall (a few ns). It
 * moves in steps of a few ms (clock_step_ms), so two readings 50 apart may be only
 * 50 - step ms apart in real time: every period below is lengthened by one step so the
 * documented limits hold in real time. */
static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The time between two heartbeat packets for a Big Brother asking for HEARTBEAT_MS. */
static int64_t beat_period(const bbagent_t *a, int64_t heartbeat_ms)
{
    int64_t p = heartbeat_ms / 4 > BEAT_MIN_MS ? heartbeat_ms / 4 : BEAT_MIN_MS;
    return p + a->clock_step_ms;
}

static void link_drop(bbagent_t *a)
{
    if (a->fd >= 0) {
        close(a->fd);
        a->fd = -1;
    }
}

/* Sends one packet without blocking. A full socket is -EAGAIN and keeps the
 * connection; any other failure (EPIPE, ECONNRESET...) drops it: -ENOTCONN. */
static int link_send(bbagent_t *a, const char *msg, size_t len)
{
    if (send(a->fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0)
        return 0;
    int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == EINTR)
        return -EAGAIN;
    link_drop(a);
    return -ENOTCONN;
}

static int put_int(char *buf, size_t cap, int len, const char *key, long long v)
{
    char num[24];
    char *p = num + sizeof num;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    *--p = '\0';
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return bbproto_put(buf, cap, (size_t)len, key, p);
}

/* Builds the message for one OWE_* bit into a->buf; returns its length or -errno. */
static int build_owed(bbagent_t *a, unsigned bit)
{
    char *b = a->buf;
    size_t cap = sizeof a->buf;
    int n = 0;
    switch (bit) {
    case OWE_HELLO:
        n = bbproto_put(b, cap, 0, "HELLO", "1");
        if (n >= 0)
            n = bbproto_put(b, cap, (size_t)n, "INSTANCE", a->instance);
        if (n >= 0)
            n = put_int(b, cap, n, "PROTO", BBPROTO_VERSION);
        return n;
    case OWE_READY:
        return bbproto_put(b, cap, 0, "READY", "1");
    default:
        if (a->players >= 0)
            n = put_int(b, cap, n, "PLAYERS", a->players);
        if (n >= 0 && a->max_players >= 0)
            n = put_int(b, cap, n, "MAX_PLAYERS", a->max_players);
        if (n >= 0)
            n = bbproto_put(b, cap, (size_t)n, "STATUS", a->status);
        if (n >= 0 && a->nports > 0) {
            char v[PORTS_MAX * (PORT_NAME_MAX + 8)]; /* "name:65535 " each */
            size_t len = 0;
            for (int i = 0; i < a->nports; i++) {
                if (i)
                    v[len++] = ' ';
                size_t nl = strlen(a->ports[i].name);
                memcpy(v + len, a->ports[i].name, nl);
                len += nl;
                v[len++] = ':';
                char num[8], *p = num + sizeof num;
                for (int x = a->ports[i].port; x > 0; x /= 10)
                    *--p = (char)('0' + x % 10);
                memcpy(v + len, p, (size_t)(num + sizeof num - p));
                len += (size_t)(num + sizeof num - p);
            }
            v[len] = '\0';
            n = bbproto_put(b, cap, (size_t)n, "PORTS", v);
        }
        return n;
    }
}

/* Sends the owed acknowledgements, oldest first; 0 or the first failure. */
static int flush_acks(bbagent_t *a)
{
    for (int k = 0; k < RECENT_MAX; k++) {
        int i = (a->recent_next + k) % RECENT_MAX;
        if (!a->recent[i].owe_ack)
            continue;
        int n = bbproto_put(a->buf, sizeof a->buf, 0, "ALLOCATION_ACK", a->recent[i].id);
        int r = n < 0 ? 0 : link_send(a, a->buf, (size_t)n);
        if (r < 0)
            return r;
        a->recent[i].owe_ack = 0;
    }
    return 0;
}

/* Sends the owed messages in order (HELLO first, a release last); stops at the first
 * failure. */
static int link_flush(bbagent_t *a)
{
    static const unsigned order[] = { OWE_HELLO, OWE_READY, OWE_STATUS, OWE_ACK, OWE_RELEASE };
    for (size_t i = 0; i < sizeof order / sizeof order[0] && a->fd >= 0; i++) {
        if (!(a->dirty & order[i]))
            continue;
        int r;
        if (order[i] == OWE_ACK) {
            r = flush_acks(a);
        } else {
            int n = order[i] == OWE_RELEASE ? bbproto_put(a->buf, sizeof a->buf, 0, "RELEASE", "1")
                                            : build_owed(a, order[i]);
            if (n < 0)
                return n;
            r = link_send(a, a->buf, (size_t)n);
        }
        if (r < 0)
            return r;
        a->dirty &= ~order[i];
    }
    return a->fd >= 0 ? 0 : -ENOTCONN;
}

/* One connection attempt. A unix-socket connect never waits: it succeeds, or fails at
 * once (ENOENT, ECONNREFUSED, or EAGAIN when the listener's backlog is full). */
static int link_connect(bbagent_t *a, int64_t now)
{
    a->last_connect_ms = now;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (const struct sockaddr *)&a->addr, a->addrlen) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    a->fd = fd;
    a->dirty = (a->dirty & OWE_UNTIL_SENT) | OWE_HELLO | (a->ready ? OWE_READY : 0u) |
               (a->has_status ? OWE_STATUS : 0u);
    a->beat_every_ms = beat_period(a, BEAT_DEFAULT_HB_MS);
    a->last_beat_ms = NEVER;
    return 0;
}

/* Makes sure the connection is up (reconnecting if the 500 ms pacing allows) and owes
 * nothing. Returns 0, -ENOTCONN or -EAGAIN. */
static int link_up(bbagent_t *a, int64_t now)
{
    if (a->fd < 0) {
        if (now - a->last_connect_ms < RECONNECT_MS + a->clock_step_ms ||
            link_connect(a, now) < 0)
            return -ENOTCONN;
    }
    return a->dirty ? link_flush(a) : 0;
}

static int set_addr(bbagent_t *a, const char *path)
{
    size_t n = strlen(path);
    a->addr.sun_family = AF_UNIX;
    if (path[0] == '@') {
        /* Abstract namespace: a leading NUL, and the length says where it ends. */
        if (n > sizeof a->addr.sun_path)
            return -EINVAL;
        memcpy(a->addr.sun_path + 1, path + 1, n - 1);
        a->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    } else {
        if (n >= sizeof a->addr.sun_path)
            return -EINVAL;
        memcpy(a->addr.sun_path, path, n + 1);
        a->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    }
    return 0;
}

API bbagent_t *bbagent_open(const bbagent_opts_t *opts)
{
    const char *path = opts && opts->socket_path ? opts->socket_path : getenv("BB_SOCKET");
    const char *inst = opts && opts->instance ? opts->instance : getenv("BB_INSTANCE");
    if (!inst)
        inst = "";
    size_t il = strlen(inst);
    if (il && !sd_name_validn(inst, il, SD_NAME_MAX)) {
        errno = EINVAL;
        return NULL;
    }
    bbagent_t *a = calloc(1, sizeof *a);
    if (!a) {
        errno = ENOMEM;
        return NULL;
    }
    a->fd = -1;
    a->players = a->max_players = -1;
    struct timespec res;
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 && res.tv_sec == 0)
        a->clock_step_ms = (res.tv_nsec + 999999) / 1000000;
    else
        a->clock_step_ms = 10;
    a->beat_every_ms = beat_period(a, BEAT_DEFAULT_HB_MS);
    a->last_beat_ms = NEVER;
    memcpy(a->instance, inst, il + 1);
    if (path && *path) {
        if (set_addr(a, path) < 0) {
            free(a);
            errno = EINVAL;
            return NULL;
        }
        a->enabled = 1;
        a->last_connect_ms = NEVER;
        link_up(a, now_ms());
    }
    return a;
}

/* Marks the message `what` (OWE_*) as owed to Big Brother and sends it now if the link
 * is up or can be brought up without waiting; otherwise a later call sends it. */
static int owe(bbagent_t *a, unsigned what)
{
    if (!a->enabled)
        return 0;
    a->dirty |= what;
    link_up(a, now_ms());
    return 0;
}

API int bbagent_ready(bbagent_t *a)
{
    if (!a)
        return -EINVAL;
    a->ready = 1;
    return owe(a, OWE_READY);
}

API int bbagent_heartbeat(bbagent_t *a)
{
    if (!a)
        return -EINVAL;
    if (!a->enabled)
        return 0;
    int64_t now = now_ms();
    /* The path taken on almost every tick: connected, nothing owed, too early. */
    if (a->fd >= 0 && !a->dirty && now - a->last_beat_ms < a->beat_every_ms)
        return 0;
    int r = link_up(a, now);
    if (r < 0)
        return r;
    if (now - a->last_beat_ms < a->beat_every_ms)
        return 0;
    a->last_beat_ms = now;
    return link_send(a, HEARTBEAT_MSG, sizeof HEARTBEAT_MSG - 1);
}

/* The status, sent when it changed; kv (n bytes, checked) may be a->status itself. */
static int set_status(bbagent_t *a, int players, int max_players, const char *kv, size_t n)
{
    if (players < 0)
        players = -1;
    if (max_players < 0)
        max_players = -1;
    if (a->has_status && players == a->players && max_players == a->max_players &&
        strcmp(kv, a->status) == 0)
        return 0;
    a->has_status = 1;
    a->players = players;
    a->max_players = max_players;
    memmove(a->status, kv, n + 1);
    return owe(a, OWE_STATUS);
}

API int bbagent_status(bbagent_t *a, int players, int max_players, const char *kv)
{
    if (!a)
        return -EINVAL;
    if (!kv)
        kv = "";
    size_t n = strlen(kv);
    if (n > BBPROTO_MAX_VALUE || memchr(kv, '\n', n))
        return -EINVAL;
    return set_status(a, players, max_players, kv, n);
}

API int bbagent_set_players(bbagent_t *a, int players, int max_players)
{
    if (!a)
        return -EINVAL;
    return set_status(a, players, max_players, a->status, strlen(a->status));
}

API int bbagent_port(bbagent_t *a, const char *name, int port)
{
    if (!a || !name || port < 1 || port > 65535)
        return -EINVAL;
    /* a name as bigbrother checks it, without ':' (PORTS= separates name:port with it) */
    size_t n = strlen(name);
    if (!sd_name_validn(name, n, PORT_NAME_MAX) || memchr(name, ':', n))
        return -EINVAL;
    int i = 0;
    while (i < a->nports && strcmp(a->ports[i].name, name))
        i++;
    if (i == PORTS_MAX)
        return -ENOSPC;
    if (i < a->nports && a->ports[i].port == port)
        return 0;
    memcpy(a->ports[i].name, name, n + 1);
    a->ports[i].port = port;
    if (i == a->nports)
        a->nports++;
    a->has_status = 1;
    return owe(a, OWE_STATUS);
}

API int bbagent_release(bbagent_t *a)
{
    if (!a)
        return -EINVAL;
    return owe(a, OWE_RELEASE);
}

API int bbagent_fd(bbagent_t *a)
{
    if (!a)
        return -EINVAL;
    return a->fd >= 0 ? a->fd : -ENOTCONN;
}

/* The ring slot of a recently returned allocation, or -1. */
static int recent_find(const bbagent_t *a, const char *id, size_t n)
{
    for (int i = 0; i < RECENT_MAX; i++)
        if (strlen(a->recent[i].id) == n && memcmp(a->recent[i].id, id, n) == 0)
            return i;
    return -1;
}

/* ALLOCATED=<id> MODE=ready|join PLAYERS=<n> PAYLOAD=<json>, or DEALLOCATED=<id>, into
 * the pending slot (which is empty: the reading stops while it is full). A message with
 * a bad id, mode or player count is ignored; a resent allocation only owes its
 * acknowledgement again. */
static void handle_alloc(bbagent_t *a, const bbproto_field_t *f, int n)
{
    alloc_msg_t *p = &a->pending;
    size_t il = 0, ml = 0, pl = 0;
    const char *id = bbproto_get(f, n, "ALLOCATED", &il);
    if (!id) {
        id = bbproto_get(f, n, "DEALLOCATED", &il);
        if (!sd_name_validn(id, il, SD_NAME_MAX))
            return;
        p->type = BBAGENT_EVENT_DEALLOCATED;
        memcpy(p->id, id, il);
        p->id[il] = '\0';
        return;
    }
    if (!sd_name_validn(id, il, SD_NAME_MAX))
        return;
    const char *mode = bbproto_get(f, n, "MODE", &ml);
    int join = mode && ml == 4 && memcmp(mode, "join", 4) == 0;
    if (mode && !join && !(ml == 5 && memcmp(mode, "ready", 5) == 0))
        return;
    long long players = 0;
    if (bbproto_get_int(f, n, "PLAYERS", 0, PLAYERS_MAX, &players) == -EINVAL)
        return;
    const char *payload = bbproto_get(f, n, "PAYLOAD", &pl);
    if (!payload || pl == 0) {
        payload = "null";
        pl = 4;
    }
    int seen = recent_find(a, id, il);
    if (seen >= 0) {
        a->recent[seen].owe_ack = 1;
        a->dirty |= OWE_ACK;
        return;
    }
    p->type = BBAGENT_EVENT_ALLOCATED;
    p->join = join;
    p->players = (int)players;
    memcpy(p->id, id, il);
    p->id[il] = '\0';
    memcpy(p->payload, payload, pl); /* pl <= BBPROTO_MAX_VALUE: the parser's cap */
    p->payload[pl] = '\0';
}

/* Applies one message from Big Brother; unknown keys and malformed messages are
 * ignored (a newer Big Brother may say more). */
static void handle_msg(bbagent_t *a, size_t len)
{
    const char *jwt;
    size_t jlen;
    int rc = bbproto_credential_parse(a->in, len, &jwt, &jlen);
    if (rc == 0) {
        memcpy(a->cred, jwt, jlen);
        a->cred[jlen] = '\0';
        a->cred_len = jlen;
    }
    if (rc != -ENOENT)
        return; /* a CREDENTIAL frame, taken or (malformed) ignored */
    bbproto_field_t f[BBPROTO_MAX_FIELDS];
    int n = bbproto_parse(a->in, len, f, BBPROTO_MAX_FIELDS);
    if (n <= 0)
        return;
    if (bbproto_get(f, n, "ALLOCATED", NULL) || bbproto_get(f, n, "DEALLOCATED", NULL)) {
        handle_alloc(a, f, n);
        return;
    }
    long long v;
    if (bbproto_get(f, n, "WELCOME", NULL) &&
        bbproto_get_int(f, n, "HEARTBEAT_MS", 1, 3600000, &v) == 0)
        a->beat_every_ms = beat_period(a, v);
    if (bbproto_get_int(f, n, "SHUTDOWN", 1, 1, &v) == 0) {
        a->shutdown_pending = 1;
        a->shutdown_grace_ms = bbproto_get_int(f, n, "GRACE_MS", 0, 86400000, &v) == 0 ? (int)v : -1;
    }
    if (bbproto_get_int(f, n, "DRAIN", 1, 1, &v) == 0)
        a->drain_pending = 1;
}

/* Reads what Big Brother sent, at most POLL_BUDGET packets, and none while an
 * allocation message waits to be returned. EOF or an error drops the connection
 * (requests already read stay pending). */
static void link_read(bbagent_t *a)
{
    for (int i = 0; i < POLL_BUDGET && a->fd >= 0 && !a->pending.type; i++) {
        ssize_t n = recv(a->fd, a->in, sizeof a->in, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                link_drop(a);
            return;
        }
        if (n == 0) {
            link_drop(a);
            return;
        }
        if ((size_t)n <= sizeof a->in)
            handle_msg(a, (size_t)n);
    }
}

/* Moves the pending allocation message into the returned event; an ALLOCATED one
 * enters the ring of recent allocations with its acknowledgement owed. */
static void return_alloc(bbagent_t *a, bbagent_event_t *ev)
{
    a->returned = a->pending;
    a->pending.type = 0;
    alloc_msg_t *r = &a->returned;
    ev->type = (bbagent_event_type_t)r->type;
    a->returned_valid = 1;
    if (r->type != BBAGENT_EVENT_ALLOCATED)
        return;
    int i = a->recent_next;
    a->recent_next = (i + 1) % RECENT_MAX;
    memcpy(a->recent[i].id, r->id, sizeof r->id);
    a->recent[i].owe_ack = 1;
    a->dirty |= OWE_ACK;
}

API int bbagent_allocation(const bbagent_t *a, bbagent_allocation_t *out)
{
    if (!out)
        return -EINVAL;
    *out = (bbagent_allocation_t){NULL, NULL, -1, 0};
    if (!a)
        return -EINVAL;
    if (!a->returned_valid)
        return -ENOENT;
    out->allocation = a->returned.id;
    if (a->returned.type == BBAGENT_EVENT_ALLOCATED) {
        out->payload = a->returned.payload;
        out->players = a->returned.players;
        out->join = a->returned.join;
    }
    return 0;
}

API int bbagent_poll(bbagent_t *a, bbagent_event_t *ev)
{
    if (!a || !ev)
        return -EINVAL;
    ev->type = BBAGENT_EVENT_NONE;
    ev->grace_ms = -1;
    a->returned_valid = 0;
    if (!a->enabled)
        return 0;
    int64_t now = now_ms();
    link_up(a, now);
    if (a->fd >= 0)
        link_read(a);
    if (a->shutdown_pending) {
        a->shutdown_pending = 0;
        ev->type = BBAGENT_EVENT_SHUTDOWN;
        ev->grace_ms = a->shutdown_grace_ms;
    } else if (a->drain_pending) {
        a->drain_pending = 0;
        ev->type = BBAGENT_EVENT_DRAIN;
    } else if (a->pending.type) {
        return_alloc(a, ev);
    }
    if (a->dirty)
        link_up(a, now); /* the acknowledgement, or one a resent allocation owes */
    return 0;
}

API int bbagent_credential(bbagent_t *a, char *buf, size_t cap)
{
    if (!a || (!buf && cap))
        return -1;
    if (a->cred_len == 0)
        return 0;
    if (cap <= a->cred_len)
        return -1;
    memcpy(buf, a->cred, a->cred_len + 1);
    return (int)a->cred_len;
}

API void bbagent_close(bbagent_t *a, const char *reason)
{
    if (!a)
        return;
    if (a->fd >= 0 && a->dirty)
        link_flush(a); /* a release or an acknowledgement said just before exiting */
    if (a->fd >= 0) {
        if (!reason || !*reason)
            reason = "exit";
        int n = bbproto_put(a->buf, sizeof a->buf, 0, "BYE", reason);
        if (n < 0)
            n = bbproto_put(a->buf, sizeof a->buf, 0, "BYE", "exit");
        link_send(a, a->buf, (size_t)n);
        link_drop(a);
    }
    free(a);
}
