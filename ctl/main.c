/* sdctl: the operators' command-line tool for ServerDir. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "sdversion.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sdctl [global options] COMMAND [args]\n\n"
               "global options:\n"
               "  --url URLS        ServerDir base URLs, comma-separated (env SERVERDIR_URL,\n"
               "                    default http://127.0.0.1:7700)\n"
               "  --token TOKEN     bearer token (env SERVERDIR_TOKEN)\n"
               "  --cluster NAME    cluster (env SERVERDIR_CLUSTER, default \"default\")\n"
               "  -o FORMAT         table (default), wide (tables with more columns), json or\n"
               "                    yaml\n"
               "  --no-headers      tables without their header row\n"
               "  -w, --watch[=S]   run the command again every S seconds (default 2) until\n"
               "                    Ctrl-C: ps, status, machines, locks, services, servers,\n"
               "                    describe, primary, allocations (not release)\n"
               "  --version, --help\n"
               "The global options may also follow the command and its arguments\n"
               "(`sdctl ps -o json`, `sdctl machines --cluster eu --no-headers`).\n\n"
               "commands:\n");
    for (size_t i = 0; i < ctl_ncmds; i++)
        fprintf(f, "  %-12s %s\n", ctl_cmds[i].name, ctl_cmds[i].summary);
    fprintf(f, "\n'sdctl COMMAND --help' describes a command. Colour only on a terminal\n"
               "(NO_COLOR turns it off).\n"
               "exit codes: 0 ok, 1 refused by ServerDir, 2 usage, 3 ServerDir unreachable or\n"
               "failing, 4 not found, 5 conflict (held, fenced, stale, no capacity to\n"
               "allocate), 6 not authorized\n");
}

static int watch_s; /* --watch[=SECONDS]: the command again every watch_s seconds */

/* One global option at argv[i] (with its value at argv[i + 1]) into ctl: the number of
 * arguments it took (1 or 2), 0 when argv[i] is not one, -1 after a usage error. */
static int global_option(ctl_t *ctl, int argc, char **argv, int i)
{
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-headers")) {
        ctl_table_no_headers(1);
        return 1;
    }
    if (!strcmp(a, "--watch") || !strcmp(a, "-w") || !strncmp(a, "--watch=", 8)) {
        char *end;
        long v = a[7] == '=' ? strtol(a + 8, &end, 10) : 2;
        if (a[7] == '=' && (*end || end == a + 8 || v < 1 || v > 3600)) {
            fprintf(stderr, "sdctl: --watch=SECONDS takes 1 to 3600\n");
            return -1;
        }
        watch_s = (int)v;
        return 1;
    }
    const char **dst = !strcmp(a, "--url") ? &ctl->url
                     : !strcmp(a, "--token") ? &ctl->token
                     : !strcmp(a, "--cluster") ? &ctl->cluster : NULL;
    if (dst && val) {
        *dst = val;
        return 2;
    }
    if (!strcmp(a, "-o") && val) {
        if (strcmp(val, "json") && strcmp(val, "yaml") && strcmp(val, "table") &&
            strcmp(val, "wide")) {
            fprintf(stderr, "sdctl: -o takes json, yaml, table or wide\n");
            return -1;
        }
        ctl->json = !strcmp(val, "json") || !strcmp(val, "yaml");
        ctl->wide = !strcmp(val, "wide");
        ctl_output_yaml(!strcmp(val, "yaml"));
        return 2;
    }
    return 0;
}

/* `sdctl __complete names`: the instance, service and machine names of the cluster for
 * the shell completion (the first page of each: at most 500 instances and machines);
 * `sdctl __complete allocations` (allocs set): the ids of its allocations (the first
 * 1000). One a line; nothing on any error. */
static int complete_names(ctl_t *ctl, int allocs)
{
    ctl->client = sdc_new(ctl->url, ctl->token, 3000);
    if (!ctl->client)
        return CTL_EXIT_OK;
    json_t *names = json_object(), *ans = NULL;
    sdc_err_t err;
    static const struct {
        const char *path, *list, *key;
    } from[] = {{"/processes?limit=500", "processes", "instance"},
                {"/services", "services", "service"},
                {"/machines?limit=500", "machines", "machine"},
                {"/allocations?limit=1000", "allocations", "allocation"}};
    size_t first = allocs ? 3 : 0, end = allocs ? 4 : 3;
    for (size_t k = first; k < end; k++) {
        char esc[400], path[512];
        snprintf(path, sizeof path, "/v1/clusters/%s%s", sdc_escape(ctl->cluster, esc, sizeof esc),
                 from[k].path);
        if (sdc_request(ctl->client, "GET", path, NULL, &ans, &err) != SDC_OK) {
            sdc_err_clear(&err);
            continue;
        }
        size_t n;
        json_t *o;
        json_array_foreach(json_object_get(ans, from[k].list), n, o) {
            const char *name = json_string_value(json_object_get(o, from[k].key));
            if (name)
                json_object_set_new(names, name, json_true());
        }
        json_decref(ans);
        ans = NULL;
    }
    const char *name;
    json_t *v;
    json_object_foreach(names, name, v)
        printf("%s\n", name);
    json_decref(names);
    sdc_free(ctl->client);
    return CTL_EXIT_OK;
}

int main(int argc, char **argv)
{
    ctl_t ctl = {0};
    ctl.url = getenv("SERVERDIR_URL");
    ctl.token = getenv("SERVERDIR_TOKEN");
    ctl.cluster = getenv("SERVERDIR_CLUSTER");
    if (!ctl.url || !*ctl.url)
        ctl.url = "http://127.0.0.1:7700";
    if (!ctl.cluster || !*ctl.cluster)
        ctl.cluster = "default";
    /* Colour only for a person at a terminal: never into a pipe or file, never when
     * NO_COLOR is set to anything non-empty (no-color.org), never on TERM=dumb. */
    const char *no_color = getenv("NO_COLOR"), *term = getenv("TERM");
    ctl.color = isatty(1) && !(no_color && *no_color) && !(term && !strcmp(term, "dumb"));

    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        int took = global_option(&ctl, argc, argv, i);
        if (took < 0)
            return CTL_EXIT_USAGE;
        if (took > 0) {
            i += took - 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("sdctl %s\n", SD_VERSION);
            return 0;
        } else {
            fprintf(stderr, "sdctl: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return CTL_EXIT_USAGE;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return CTL_EXIT_USAGE;
    }
    /* Hidden helper for the shell completion (packaging/bash-completion/sdctl): the
     * command names, one a line, straight from the generated table. */
    if (!strcmp(argv[i], "__complete")) {
        if (i + 1 < argc && (!strcmp(argv[i + 1], "names") || !strcmp(argv[i + 1], "allocations")))
            return complete_names(&ctl, !strcmp(argv[i + 1], "allocations"));
        for (size_t k = 0; k < ctl_ncmds; k++)
            printf("%s\n", ctl_cmds[k].name);
        return CTL_EXIT_OK;
    }
    const ctl_cmd_t *cmd = NULL;
    for (size_t k = 0; k < ctl_ncmds; k++)
        if (!strcmp(ctl_cmds[k].name, argv[i]))
            cmd = &ctl_cmds[k];
    if (!cmd) {
        fprintf(stderr, "sdctl: unknown command '%s'\n", argv[i]);
        usage(stderr);
        return CTL_EXIT_USAGE;
    }
    /* Global options after the command are taken out of its arguments (blobs keeps its
     * own -o FILE). */
    int n = i + 1;
    for (int k = i + 1; k < argc; k++) {
        int took = !strcmp(cmd->name, "blobs") && !strcmp(argv[k], "-o")
                       ? 0 : global_option(&ctl, argc, argv, k);
        if (took < 0)
            return CTL_EXIT_USAGE;
        if (took > 0)
            k += took - 1;
        else
            argv[n++] = argv[k];
    }
    argc = n;
    argv[argc] = NULL;
    /* --help anywhere after the command (`sdctl locks get --help`) is that command's
     * help, printed without contacting ServerDir (the client is not even created). */
    for (int k = i + 1; k < argc; k++)
        if (!strcmp(argv[k], "--help") || (k == i + 1 && !strcmp(argv[k], "-h"))) {
            char *help_argv[] = {argv[i], "--help", NULL};
            return cmd->fn(&ctl, 2, help_argv);
        }
    ctl.client = sdc_new(ctl.url, ctl.token, 10000);
    if (!ctl.client) {
        fprintf(stderr, "sdctl: bad ServerDir URL list '%s' (want http://host:port[,...])\n", ctl.url);
        return CTL_EXIT_USAGE;
    }
    int rc;
    if (!watch_s) {
        rc = cmd->fn(&ctl, argc - i, argv + i);
    } else {
        static const char *const watchable[] = {"ps", "status", "machines", "locks", "services",
                                                "servers", "describe", "primary",
                                                "allocations", NULL};
        int ok = 0;
        for (const char *const *w = watchable; *w && !ok; w++)
            ok = !strcmp(*w, cmd->name);
        if (ok && !strcmp(cmd->name, "allocations") && argc > i + 1 &&
            !strcmp(argv[i + 1], "release"))
            ok = 0; /* a change, not a view */
        if (!ok) {
            sdc_free(ctl.client);
            fprintf(stderr, "sdctl: --watch does not apply to %s%s\n", cmd->name,
                    strcmp(cmd->name, "allocations") ? "" : " release");
            return CTL_EXIT_USAGE;
        }
        /* like watch(1): the screen redrawn on a terminal, one header per round
         * otherwise; Ctrl-C ends it */
        for (;;) {
            char when[32];
            time_t t = time(NULL);
            struct tm tm;
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
            if (isatty(1))
                fputs("\033[H\033[2J", stdout);
            printf("Every %ds: sdctl %s  %s\n\n", watch_s, cmd->name, when);
            fflush(stdout);
            rc = cmd->fn(&ctl, argc - i, argv + i);
            fflush(stdout);
            fflush(stderr);
            sleep((unsigned)watch_s);
        }
    }
    sdc_free(ctl.client);
    return rc;
}
