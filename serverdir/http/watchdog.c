/* The watchdog self-check; see watchdog.h. Runs on the main thread (which otherwise only
 * waits for signals), so it never takes a worker away from real traffic except for the
 * one /healthz request it sends. */
#include "watchdog.h"
#include "sdlog.h"
#include "sdnotify.h"
#include "sdutil.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int failing;

/* Maps a wildcard listen host to the loopback address of the same family. */
static const char *connect_host(const char *host)
{
    if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "*"))
        return "127.0.0.1";
    if (!strcmp(host, "::"))
        return "::1";
    return host;
}

/* One GET /healthz; returns 0 when the status line says 200, else a short reason. */
static const char *selfcheck(const char *listen, int timeout_ms)
{
    char host[128], portstr[8];
    int port;
    if (sd_parse_hostport(listen, host, sizeof host, &port))
        return "bad listen address";
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    if (getaddrinfo(connect_host(host), portstr, &hints, &ai))
        return "cannot resolve the listen host";
    const char *why = "connect failed";
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    if (fd >= 0) {
        /* SO_SNDTIMEO also bounds connect() on Linux */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        static const char req[] = "GET /healthz HTTP/1.0\r\nUser-Agent: serverdir-watchdog\r\n\r\n";
        char buf[64];
        size_t len = 0;
        ssize_t n = send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
        why = n == (ssize_t)(sizeof req - 1) ? "no answer in time" : "send failed";
        while (n > 0 && len < sizeof buf - 1 &&
               (n = recv(fd, buf + len, sizeof buf - 1 - len, 0)) > 0)
            len += (size_t)n;
        buf[len] = '\0';
        if (len >= 12)
            why = !strncmp(buf, "HTTP/1.", 7) && !strncmp(buf + 8, " 200", 4) ? NULL
                                                                            : "status not 200";
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return why;
}

void sd_watchdog_tick(const char *listen, int timeout_ms)
{
    const char *why = selfcheck(listen, timeout_ms);
    if (!why) {
        if (failing)
            log_info("watchdog self-check recovered", "listen=%s", listen);
        failing = 0;
        sd_notify_send("WATCHDOG=1");
        return;
    }
    if (!failing)
        log_warn("watchdog self-check failed, not feeding the systemd watchdog",
                 "listen=%s reason=%s", listen, why);
    failing = 1;
}
