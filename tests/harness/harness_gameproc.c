/* The gameproc tests' side of a gameproc: its exit, and the agent socket a supervisor
 * would offer it. */
#include "harness_gameproc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cmocka.h>

int gp_wait_exit(pid_t pid, int ms)
{
    int64_t end = h_now_ms() + ms;
    int st;
    do {
        if (h_exited(pid, &st))
            return st;
        h_sleep_ms(10);
    } while (h_now_ms() < end);
    return -1;
}

int gp_agent_listen(const char *path)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}
