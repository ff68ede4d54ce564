/* The sd_notify protocol, written out: each message is one datagram of "KEY=VALUE"
 * lines sent to the unix socket named by $NOTIFY_SOCKET ("@name" is the abstract
 * namespace). The receiver learns our pid from the socket credentials. WATCHDOG=1 is
 * sent at most once per max(50 ms, WATCHDOG_USEC / 4). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gameproc.h"
#include "sdlog.h"
#include "sdutil.h"

#define WATCHDOG_MIN_MS 50
#define WATCHDOG_DEFAULT_MS 250

int gp_notify_open(gp_notify_t *n)
{
    n->fd = -1;
    n->warned = 0;
    n->last_watchdog_ms = INT64_MIN / 2;
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return -ENOENT;
    struct sockaddr_un *sun = (struct sockaddr_un *)&n->addr;
    size_t len = strlen(path);
    if (len >= sizeof sun->sun_path || (path[0] != '/' && path[0] != '@'))
        return -EINVAL;
    memset(&n->addr, 0, sizeof n->addr);
    sun->sun_family = AF_UNIX;
    memcpy(sun->sun_path, path, len);
    if (path[0] == '@') {
        sun->sun_path[0] = '\0';
        n->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    } else {
        n->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
    }

    int64_t wd_ms = WATCHDOG_DEFAULT_MS;
    const char *usec = getenv("WATCHDOG_USEC");
    int64_t v;
    if (usec && sd_parse_i64(usec, 1, INT64_MAX, &v) == 0)
        wd_ms = v / 1000;
    n->watchdog_every_ms = wd_ms / 4 > WATCHDOG_MIN_MS ? wd_ms / 4 : WATCHDOG_MIN_MS;

    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    return n->fd < 0 ? -errno : 0;
}

/* Sends one message; a failure is logged once (the supervisor may be restarting) and
 * otherwise ignored, like sd_notify does. */
int gp_notify_send(gp_notify_t *n, const char *msg)
{
    if (n->fd < 0)
        return -ENOTCONN;
    if (sendto(n->fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT,
               (const struct sockaddr *)&n->addr, n->addrlen) >= 0) {
        n->warned = 0;
        return 0;
    }
    int e = errno;
    if (!n->warned)
        log_warn("notify send failed", "err=%s", strerror(e));
    n->warned = 1;
    return -e;
}

void gp_notify_watchdog(gp_notify_t *n, int64_t now_ms)
{
    if (n->fd < 0 || now_ms - n->last_watchdog_ms < n->watchdog_every_ms)
        return;
    n->last_watchdog_ms = now_ms;
    gp_notify_send(n, "WATCHDOG=1");
}

void gp_notify_close(gp_notify_t *n)
{
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}
