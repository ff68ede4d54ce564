/* The UDP query port (the protocol itself is in query_proto.c, see gpquery.h): so an
 * unmodified-game-style probe can check gameproc, and a master server can list it.
 *
 * A datagram is read into a fixed buffer; anything longer than GP_QUERY_MAX is dropped
 * without a reply, and so is everything before the server is ready (still loading). At
 * most QUERY_BUDGET datagrams are served per wake-up so a flood cannot starve the tick.
 * A master's "getinfo <challenge>" (master.c's UDP heartbeat asked for it) is answered
 * here like any other getinfo, from the game port the master knows. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gameproc.h"
#include "sdlog.h"
#include "sdutil.h"

#define QUERY_BUDGET 64

static uint32_t a2s_secret;

static void query_readable(gp_t *gp, void *arg)
{
    (void)arg;
    uint8_t in[GP_QUERY_MAX + 1];
    uint8_t out[GP_REPLY_MAX];
    gp_query_info_t info = {
        .name = gp->name, .map = gp->map, .game = "gameproc", .players = gp->players,
        .max_players = gp->max_players, .draining = gp->draining, .port = gp->udp_port,
        .a2s_challenge = gp->a2s_challenge, .a2s_secret = a2s_secret,
        .no_info = gp->stopping,
    };
    for (int i = 0; i < QUERY_BUDGET; i++) {
        struct sockaddr_storage from;
        socklen_t fromlen = sizeof from;
        ssize_t n = recvfrom(gp->udp_fd, in, sizeof in, MSG_DONTWAIT | MSG_TRUNC,
                             (struct sockaddr *)&from, &fromlen);
        if (n < 0)
            return;
        if (n > GP_QUERY_MAX || !gp->ready)
            continue;
        size_t len = gp_query_answer(&info, in, (size_t)n, &from, out, sizeof out);
        if (len > 0)
            sendto(gp->udp_fd, out, len, MSG_DONTWAIT, (struct sockaddr *)&from, fromlen);
    }
}

/* "--udp-port P" binds 127.0.0.1:P; "HOST:P" and "[v6]:P" bind that numeric address. */
int gp_parse_sockaddr(const char *s, const char *default_host, struct sockaddr_storage *ss,
                      socklen_t *len)
{
    char host[64];
    int port;
    int64_t p;
    if (default_host && sd_parse_i64(s, 0, 65535, &p) == 0) {
        sd_strlcpy(host, default_host, sizeof host);
        port = (int)p;
    } else if (sd_parse_hostport(s, host, sizeof host, &port) < 0 || port < 0 ||
               port > 65535) {
        return -EINVAL;
    }
    if (!*host)
        sd_strlcpy(host, "127.0.0.1", sizeof host);
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
    } else {
        return -EINVAL;
    }
    return 0;
}

/* Binds the UDP query port of --udp-port and watches it. 0, -EINVAL filling *bad for a
 * bad --udp-port, or a negative errno. */
int gp_query_start(gp_t *gp, gp_bad_option_t *bad)
{
    if (!gp->udp_listen)
        return 0;
    struct sockaddr_storage ss;
    socklen_t len;
    if (gp_parse_sockaddr(gp->udp_listen, "127.0.0.1", &ss, &len) < 0) {
        *bad = (gp_bad_option_t){
            .option = "udp-port", .value = gp->udp_listen,
            .want = "PORT, HOST:PORT or [V6]:PORT with a numeric host"};
        return -EINVAL;
    }
    char rnd[9];
    if (sd_random_hex(rnd, 4) == 0)
        a2s_secret = (uint32_t)strtoul(rnd, NULL, 16);
    int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    if (ss.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
        int e = errno;
        log_error("udp bind failed", "listen=%s err=%s", gp->udp_listen, strerror(e));
        close(fd);
        return -e;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &blen);
    gp->udp_port = ntohs(bound.ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&bound)->sin6_port
                             : ((struct sockaddr_in *)&bound)->sin_port);
    gp->udp_fd = fd;
    return gp_watch(gp, fd, query_readable, NULL);
}

void gp_query_stop(gp_t *gp)
{
    if (gp->udp_fd >= 0)
        close(gp->udp_fd);
    gp->udp_fd = -1;
}
