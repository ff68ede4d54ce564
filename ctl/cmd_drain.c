/* sdctl drain, undrain: take a machine out of placement (its instances move off
 * gracefully) and put it back. */
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

int cmd_drain(ctl_t *ctl, int argc, char **argv)
{
    static const ctl_switch_t sw = {.usage = usage_text, .operand = "MACHINE",
                                    .off_cmd = "undrain", .set = sdc_machine_drain,
                                    .on_word = "draining", .off_word = "undrained"};
    return ctl_switch_cmd(ctl, argc, argv, &sw);
}
