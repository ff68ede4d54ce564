/* sdctl cluster stop|start: the realm stop-and-restore switch. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

SDCTL_CMD("cluster", cmd_cluster, "stop the whole realm (players saved) or start it again");

static const char usage_text[] =
    "usage: sdctl cluster stop\n"
    "       sdctl cluster start\n"
    "  stop: every Big Brother sends SHUTDOWN to all its game processes (they save their\n"
    "  players), waits their grace and stops them; the services stay declared. start:\n"
    "  the desired state is brought back. sdctl status shows the realm as STOPPED.\n";

int cmd_cluster(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, usage_text))
        return CTL_EXIT_OK;
    if (argc != 2 || (strcmp(argv[1], "stop") && strcmp(argv[1], "start")))
        return ctl_usage("cluster", "expected stop or start");
    int stop = !strcmp(argv[1], "stop");
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_cluster_stop(ctl->client, ctl->cluster, stop, &ans, &err);
    char what[160];
    snprintf(what, sizeof what, "cluster %s", ctl->cluster);
    return ctl_switch_answer(ctl, rc, &err, ans, what, stop ? "stopping" : "starting");
}
