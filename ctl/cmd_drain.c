/* sdctl drain, undrain: take a machine out of placement (its instances move off
 * gracefully) and put it back. */
#include <string.h>

#include "ctl.h"

SDCTL_CMD("drain", cmd_drain, "move every instance off a machine and keep it empty");
SDCTL_CMD("undrain", cmd_drain, "let the primary place instances on a drained machine again");

static const char usage_text[] =
    "usage: sdctl drain MACHINE\n"
    "       sdctl undrain MACHINE\n"
    "  drain marks the machine draining (sdctl status and sdctl machines -o json show it):\n"
    "  the primary moves its instances to other machines, which stop gracefully there\n"
    "  (reason drained), and places nothing new on it. undrain makes it eligible again.\n"
    "  Exit code 4 when the machine is not registered.\n";

/* drain and undrain: the name the command was called by says which. */
int cmd_drain(ctl_t *ctl, int argc, char **argv)
{
    int on = strcmp(argv[0], "undrain") != 0;
    return ctl_switch_cmd(ctl, argc, argv, usage_text, "MACHINE", sdc_machine_drain, on,
                          on ? "draining" : "undrained");
}
