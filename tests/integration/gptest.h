/* Helpers shared by the gameproc tests (it_gameproc, it_gameproc_master,
 * it_gameproc_players): the binary, waiting for a process to exit, and a supervisor's
 * end of the agent socket. Include after cmocka.h. */
#ifndef SD_GPTEST_H
#define SD_GPTEST_H

#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "harness.h"

#define GAMEPROC SD_BIN_DIR "/gameproc"

/* Waits up to ms for pid to exit (polling every 10 ms); returns its wait status, or -1
 * when it is still running. */
static inline int gp_wait_exit(pid_t pid, int ms)
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

/* A listening SOCK_SEQPACKET socket at path: Big Brother's end of the agent protocol.
 * Fails the test when it cannot be made. */
static inline int gp_agent_listen(const char *path)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

#endif
