/* sdctl drain/undrain and stop/start: the on/off switches of a machine (taken out of
 * placement, its instances moved off gracefully) and of a service (it keeps its count but
 * runs no instance). One table, one function: the name the command was called by picks
 * the switch and the direction. */
#include <string.h>

#include "ctl.h"

SDCTL_CMD("drain", cmd_switch, "move every instance off a machine and keep it empty");
SDCTL_CMD("undrain", cmd_switch, "let the primary place instances on a drained machine again");
SDCTL_CMD("stop", cmd_switch, "stop a service (it keeps its count, runs no instance)");
SDCTL_CMD("start", cmd_switch, "start a stopped service again");

static const ctl_switch_t switches[] = {
    {.on_cmd = "drain", .off_cmd = "undrain", .operand = "MACHINE", .set = sdc_machine_drain,
     .on_word = "draining", .off_word = "undrained",
     .usage = "usage: sdctl drain MACHINE\n"
              "       sdctl undrain MACHINE\n"
              "  drain marks the machine draining (sdctl status and sdctl machines -o json show\n"
              "  it): the primary moves its instances to other machines, which stop gracefully\n"
              "  there (reason drained), and places nothing new on it. undrain makes it eligible\n"
              "  again. Exit code 4 when the machine is not registered.\n"},
    {.on_cmd = "stop", .off_cmd = "start", .operand = "SERVICE", .set = sdc_service_stop,
     .on_word = "stopped", .off_word = "started",
     .usage = "usage: sdctl stop SERVICE\n"
              "       sdctl start SERVICE\n"
              "  stop: the service keeps its count but runs no instance (they are stopped\n"
              "  gracefully); start: it runs again. For the whole realm see sdctl cluster stop.\n"},
};

int cmd_switch(ctl_t *ctl, int argc, char **argv)
{
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++)
        if (!strcmp(argv[0], switches[i].on_cmd) || !strcmp(argv[0], switches[i].off_cmd))
            return ctl_switch_cmd(ctl, argc, argv, &switches[i]);
    return ctl_usage(argv[0], "not a switch command");
}
