/* Harness addition for the gameproc tests (it_gameproc, it_gameproc_master,
 * it_gameproc_players): a supervisor's end of the agent socket. */
#ifndef SD_HARNESS_GAMEPROC_H
#define SD_HARNESS_GAMEPROC_H

#include <sys/types.h>

#include "harness.h"

/* A listening SOCK_SEQPACKET socket at path: Big Brother's end of the agent protocol.
 * Fails the test when it cannot be made. */
int gp_agent_listen(const char *path);

#endif
