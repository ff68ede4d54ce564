/* Harness additions for the gameproc tests (it_gameproc, it_gameproc_master,
 * it_gameproc_players): waiting for a process to exit, and a supervisor's end of the
 * agent socket. */
#ifndef SD_HARNESS_GAMEPROC_H
#define SD_HARNESS_GAMEPROC_H

#include <sys/types.h>

#include "harness.h"

/* Waits up to ms for pid to exit (polling every 10 ms); returns its wait status, or -1
 * when it is still running. */
int gp_wait_exit(pid_t pid, int ms);

/* A listening SOCK_SEQPACKET socket at path: Big Brother's end of the agent protocol.
 * Fails the test when it cannot be made. */
int gp_agent_listen(const char *path);

#endif
