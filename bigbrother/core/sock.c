/* The unix sockets bigbrother listens on: the agent, notify and control sockets. */
#include "core/bb.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Binds a unix socket of `type` at path (replacing a stale one), mode 0666: any local
 * process may connect, the kernel credentials decide what it may claim. */
int bb__unix_listen(const char *path, int type, int mode)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    sd_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
    int fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || chmod(path, (mode_t)mode) ||
        (type != SOCK_DGRAM && listen(fd, SOMAXCONN))) {
        int err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

int bb__unix_listen_watch(bb_watch_t *w, const char *path, int type, int mode,
                          void (*fn)(bb_watch_t *w, uint32_t events))
{
    int fd = bb__unix_listen(path, type, mode);
    if (fd < 0)
        return fd;
    w->fd = fd;
    w->fn = fn;
    return bb_watch_add(w, EPOLLIN);
}
