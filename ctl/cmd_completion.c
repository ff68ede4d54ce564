/* sdctl completion: the shell completion script, embedded at build time from
 * ctl/completion/sdctl.bash (the file the package installs), so it cannot drift from
 * the binary it ships with. The script itself asks the binary for the command names
 * and each command's options. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

SDCTL_CMD("completion", cmd_completion, "print the shell completion script (bash or zsh)");

extern const char ctl_completion_bash[]; /* completion_gen.c */

static const char usage_text[] =
    "usage: sdctl completion bash|zsh\n"
    "  Prints the completion script for the shell. Load it in the running shell with\n"
    "    source <(sdctl completion bash)      (or zsh)\n"
    "  or for every new one:\n"
    "    sdctl completion bash > ~/.local/share/bash-completion/completions/sdctl\n"
    "    echo 'source <(sdctl completion zsh)' >> ~/.zshrc\n"
    "  The sdctl package installs the bash one (/usr/share/bash-completion/completions).\n"
    "  Commands, their options and subcommands, and the cluster's instance, service,\n"
    "  machine and allocation names complete.\n";

int cmd_completion(ctl_t *ctl, int argc, char **argv)
{
    (void)ctl;
    if (ctl_wants_help(argc, argv, usage_text))
        return CTL_EXIT_OK;
    if (argc != 2 || (strcmp(argv[1], "bash") && strcmp(argv[1], "zsh")))
        return ctl_usage("completion", "expected bash or zsh");
    if (!strcmp(argv[1], "zsh")) /* zsh runs bash completion functions through bashcompinit */
        fputs("#compdef sdctl\nautoload -U +X compinit && compinit\n"
              "autoload -U +X bashcompinit && bashcompinit\n",
              stdout);
    fputs(ctl_completion_bash, stdout);
    return CTL_EXIT_OK;
}
