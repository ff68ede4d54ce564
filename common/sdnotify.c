/* sd_notify sender; see sdnotify.h. One SOCK_DGRAM socket opened at init, one sendto
 * per message: no connection state, so a restarted manager is never a problem. */
#include "sdnotify.h"
#include "sdutil.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define NOTIFY_MSG_MAX 1024

static int notify_fd = -1;
static struct sockaddr_un notify_addr;
static socklen_t notify_addrlen;
static int64_t watchdog_ms;

int sd_notify_init(void)
{
    const char *wd = getenv("WATCHDOG_USEC"), *wpid = getenv("WATCHDOG_PID");
    int64_t usec, pid;
    /* WATCHDOG_PID, when set, must name us: a child that inherited the variables of its
     * parent's unit must not feed the parent's watchdog. */
    if (wd && !sd_parse_i64(wd, 1, INT64_MAX, &usec) &&
        (!wpid || (!sd_parse_i64(wpid, 1, INT64_MAX, &pid) && pid == (int64_t)getpid())))
        watchdog_ms = usec / 2000 > 0 ? usec / 2000 : 1;

    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0]) {
        watchdog_ms = 0;
        return 0;
    }
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof notify_addr.sun_path) {
        watchdog_ms = 0;
        return -EINVAL;
    }
    memset(&notify_addr, 0, sizeof notify_addr);
    notify_addr.sun_family = AF_UNIX;
    memcpy(notify_addr.sun_path, path, len);
    if (path[0] == '@')
        notify_addr.sun_path[0] = '\0'; /* abstract namespace: the name is not NUL-ended */
    notify_addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                                 (path[0] == '/' ? 1 : 0));
    notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (notify_fd < 0) {
        watchdog_ms = 0;
        return -errno;
    }
    return 0;
}

int sd_notify_send(const char *fmt, ...)
{
    if (notify_fd < 0)
        return 0;
    char msg[NOTIFY_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    size_t len = (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    ssize_t w;
    do
        w = sendto(notify_fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT,
                   (struct sockaddr *)&notify_addr, notify_addrlen);
    while (w < 0 && errno == EINTR);
    return w < 0 ? -errno : 0;
}

int64_t sd_notify_watchdog_ms(void)
{
    return watchdog_ms;
}

int sd_notify_enabled(void)
{
    return notify_fd >= 0;
}
