/* sdctl: the operators' command-line tool for ServerDir. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "sdtime.h"
#include "sdutil.h"
#include "sdversion.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sdctl [global options] COMMAND [args]\n\n"
               "global options:\n"
               "  --url URLS        ServerDir base URLs, comma-separated (env SERVERDIR_URL,\n"
               "                    default http://127.0.0.1:7700)\n"
               "  --token TOKEN     bearer token (env SERVERDIR_TOKEN)\n"
               "  --cluster NAME    cluster (env SERVERDIR_CLUSTER, default \"default\")\n"
               "  -o FORMAT         table (default), wide (tables with more columns), json,\n"
               "                    yaml, or name (list commands: KIND/NAME a line, e.g.\n"
               "                    instance/zone-local-1-ab12-1)\n"
               "  --no-headers      tables without their header row\n"
               "  -w, --watch[=S]   draw the command again when the cluster changes (a new\n"
               "                    event, followed by long-poll; at most 4 draws a second)\n"
               "                    and at least every S seconds (default 10), until Ctrl-C:\n"
               "                    ps, status, machines, locks, services, servers,\n"
               "                    describe, primary, allocations (not release)\n"
               "  --version, --help\n"
               "The global options may also follow the command and its arguments\n"
               "(`sdctl ps -o json`, `sdctl machines --cluster eu --no-headers`).\n\n"
               "commands:\n");
    for (size_t i = 0; i < ctl_ncmds; i++)
        fprintf(f, "  %-12s %s\n", ctl_cmds[i].name, ctl_cmds[i].summary);
    fprintf(f, "\n'sdctl COMMAND --help' describes a command. Colour only on a terminal\n"
               "(NO_COLOR turns it off). Shell completion: source <(sdctl completion bash).\n"
               "exit codes: 0 ok, 1 refused by ServerDir, 2 usage, 3 ServerDir unreachable or\n"
               "failing, 4 not found, 5 conflict (held, fenced, stale, no capacity to\n"
               "allocate), 6 not authorized\n");
}

/* The global options, for "did you mean" (a value-taking one with its value's words). */
static const char *const global_names[] = {"--url", "--token", "--cluster", "-o",
                                           "--no-headers", "--watch", "--version", "--help"};
#define OUTPUT_FORMATS "json, yaml, table, wide, name"

static int watch_s; /* --watch[=SECONDS]: the command again at least every watch_s s */

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
        long v = a[7] == '=' ? strtol(a + 8, &end, 10) : 10;
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
    int is_o = !strcmp(a, "-o");
    if ((dst || is_o) && !val) {
        ctl_missing_value(NULL, a, is_o ? OUTPUT_FORMATS : !strcmp(a, "--url") ? "URLS"
                                     : !strcmp(a, "--token")                  ? "TOKEN"
                                                                              : "NAME");
        return -1;
    }
    if (dst) {
        *dst = val;
        return 2;
    }
    if (is_o) {
        if (strcmp(val, "json") && strcmp(val, "yaml") && strcmp(val, "table") &&
            strcmp(val, "wide") && strcmp(val, "name")) {
            fprintf(stderr, "sdctl: -o takes " OUTPUT_FORMATS "\n");
            return -1;
        }
        ctl->names = !strcmp(val, "name");
        ctl->json = !strcmp(val, "json") || !strcmp(val, "yaml") || ctl->names;
        ctl->wide = !strcmp(val, "wide");
        ctl_output_yaml(!strcmp(val, "yaml"));
        ctl_output_names(ctl->names);
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

/* "unknown command" / "unknown option", with the closest known name when one is close,
 * and no help dump: a typo gets two lines. Returns CTL_EXIT_USAGE. */
static int unknown(const char *what, const char *word, const char *const *names, size_t n)
{
    const char *near = ctl_suggest(word, names, n);
    fprintf(stderr, "sdctl: unknown %s \"%s\"\n", what, word);
    if (near)
        fprintf(stderr, "did you mean \"%s\"?\n", near);
    fprintf(stderr, "(see sdctl --help)\n");
    return CTL_EXIT_USAGE;
}

/* The command of the generated table named name, or NULL. */
static const ctl_cmd_t *command_find(const char *name)
{
    for (size_t k = 0; k < ctl_ncmds; k++)
        if (!strcmp(ctl_cmds[k].name, name))
            return &ctl_cmds[k];
    return NULL;
}

static int unknown_command(const char *word)
{
    const char *names[128];
    size_t n = 0;
    for (size_t k = 0; k < ctl_ncmds && n < 128; k++)
        names[n++] = ctl_cmds[k].name;
    return unknown("command", word, names, n);
}

/* Whether cmd (with its first argument sub) is one of those -o name applies to: the
 * lists (and their one-item forms). */
static int lists_names(const char *cmd, const char *sub)
{
    static const char *const lists[] = {"ps", "machines", "services", "locks", "allocations",
                                        "clusters", "servers", "events", NULL};
    for (const char *const *l = lists; *l; l++)
        if (!strcmp(*l, cmd))
            return !(sub && (!strcmp(sub, "release") || !strcmp(sub, "force-unlock")));
    return 0;
}

/* cmd's --help text (malloc'd; NULL when it cannot be read), printed into a temporary
 * file by the command itself: the one place its options are listed. */
static char *command_help(ctl_t *ctl, const ctl_cmd_t *cmd)
{
    FILE *tmp = tmpfile();
    int saved = dup(1);
    if (!tmp || saved < 0) {
        if (tmp)
            fclose(tmp);
        if (saved >= 0)
            close(saved);
        return NULL;
    }
    fflush(stdout);
    dup2(fileno(tmp), 1);
    char *help_argv[] = {(char *)cmd->name, "--help", NULL};
    cmd->fn(ctl, 2, help_argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    long len = ftell(tmp);
    char *text = len >= 0 ? calloc(1, (size_t)len + 1) : NULL;
    rewind(tmp);
    if (text && fread(text, 1, (size_t)len, tmp) != (size_t)len)
        text[0] = '\0';
    fclose(tmp);
    return text;
}

/* The placeholder after opt in a help text ("--tail N" -> "N", "--state a|b" -> "a|b"),
 * into out; 0 when the help shows opt without a value. */
static int help_value(const char *help, const char *opt, char *out, size_t cap)
{
    size_t len = strlen(opt);
    for (const char *p = help; (p = strstr(p, opt)) != NULL; p += len) {
        const char *v = p + len;
        if ((p > help && (isalnum((unsigned char)p[-1]) || p[-1] == '-')) ||
            (*v != ' ' && *v != '='))
            continue;
        size_t n = strcspn(v + 1, " ]\n,");
        if (!isupper((unsigned char)v[1]) && !memchr(v + 1, '|', n)) /* N, or a|b|c */
            continue;
        snprintf(out, cap, "%.*s", (int)n, v + 1);
        return 1;
    }
    return 0;
}

/* The mistakes a command's own help can tell, before the command runs: its last
 * argument an option that takes a value ("--tail needs a value (N)"), or a --flag its
 * help does not show but one close to it ("did you mean"). CTL_EXIT_USAGE printed, or 0
 * when none is found (the command then checks its arguments itself). */
static int check_flags(ctl_t *ctl, const ctl_cmd_t *cmd, int argc, char **argv)
{
    char *help = command_help(ctl, cmd);
    if (!help)
        return 0;
    char value[64];
    int rc = 0;
    if (argc > 1 && argv[argc - 1][0] == '-' && help_value(help, argv[argc - 1], value, sizeof value))
        rc = ctl_missing_value(cmd->name, argv[argc - 1], value);
    const char *flags[64]; /* the --flags of the help, cut out of a copy of it */
    size_t n = 0;
    char *words = strdup(help);
    for (char *p = words; p && (p = strstr(p, "--")) && n < 64;) {
        char *e = p + 2 + strspn(p + 2, "abcdefghijklmnopqrstuvwxyz-");
        if (e > p + 2 && *e)
            *e++ = '\0';
        flags[n++] = p;
        p = e;
    }
    for (int k = 1; k < argc && !rc; k++) {
        const char *a = argv[k];
        if (strncmp(a, "--", 2) != 0 || !a[2] || strstr(help, a))
            continue;
        const char *near = ctl_suggest(a, flags, n);
        if (near) {
            fprintf(stderr, "sdctl %s: unknown option \"%s\"\ndid you mean \"%s\"?\n"
                            "(see sdctl %s --help)\n", cmd->name, a, near, cmd->name);
            rc = CTL_EXIT_USAGE;
        }
    }
    free(words);
    free(help);
    return rc;
}

/* ---- --watch */

#define WATCH_GAP_MS 250     /* at least this long between two draws: at most 4 a second */
#define WATCH_WAIT_MS 25000   /* one events long-poll waits at most this long */
#define WATCH_RETRY_MS 1000   /* serverdir unreachable: the next long-poll after this */

/* The cluster's newest event seq into last (cap bytes; "0-0" when the history is
 * empty); -1 when it could not be read. */
static int events_newest(ctl_t *ctl, char *last, size_t cap)
{
    json_t *ans = NULL;
    sdc_err_t err;
    if (sdc_events_list(ctl->client, ctl->cluster, NULL, 1, &ans, &err) != SDC_OK) {
        sdc_err_clear(&err);
        return -1;
    }
    const char *seq = json_string_value(json_object_get(ans, "last"));
    sd_strlcpy(last, seq ? seq : "0-0", cap);
    json_decref(ans);
    return 0;
}

/* Waits for an event after last with serverdir's long-poll (follow: a client whose
 * timeout outlasts WATCH_WAIT_MS), at most wait_ms: 1 (last moved to it), 0 (none
 * came), -1 (serverdir could not be asked). */
static int events_wait(ctl_t *ctl, sdc_t *follow, char *last, size_t cap, int64_t wait_ms)
{
    if (!last[0] && events_newest(ctl, last, cap) < 0)
        return -1;
    json_t *ans = NULL;
    sdc_err_t err;
    int w = (int)(wait_ms < WATCH_WAIT_MS ? wait_ms : WATCH_WAIT_MS);
    if (sdc_events_wait(follow, ctl->cluster, last, SD_HISTORY_LIMIT_MAX, w > 0 ? w : 1, &ans,
                        &err) != SDC_OK) {
        sdc_err_clear(&err);
        return -1;
    }
    const char *seq = json_string_value(json_object_get(ans, "last"));
    int moved = seq && strcmp(seq, last) != 0;
    if (moved)
        sd_strlcpy(last, seq, cap);
    json_decref(ans);
    return moved;
}

/* Waits until the cluster has a new event (serverdir answers the long-poll as it is
 * recorded) or watch_s seconds passed since drawn_ms (sd_mono_ms), whichever comes
 * first, and at least WATCH_GAP_MS after drawn_ms. */
static void watch_wait(ctl_t *ctl, sdc_t *follow, int64_t drawn_ms, char *last, size_t cap)
{
    for (;;) {
        int64_t left = drawn_ms + (int64_t)watch_s * 1000 - sd_mono_ms();
        if (left <= 0)
            return;
        int r = events_wait(ctl, follow, last, cap, left);
        if (r == 1)
            break;
        if (r < 0) {
            left = drawn_ms + (int64_t)watch_s * 1000 - sd_mono_ms();
            if (left > 0)
                usleep((useconds_t)(left < WATCH_RETRY_MS ? left : WATCH_RETRY_MS) * 1000);
        }
    }
    int64_t gap = drawn_ms + WATCH_GAP_MS - sd_mono_ms();
    if (gap > 0)
        usleep((useconds_t)gap * 1000);
}

/* The command line as typed, less the --watch option: the header of each draw. */
static void watch_title(int argc, char **argv, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "sdctl");
    for (int k = 1; k < argc && o < cap; k++) {
        const char *a = argv[k];
        if (!strcmp(a, "-w") || !strcmp(a, "--watch") || !strncmp(a, "--watch=", 8))
            continue;
        int quote = strpbrk(a, " \t'\"") != NULL || !*a;
        o += (size_t)snprintf(out + o, cap - o, quote ? " '%s'" : " %s", a);
    }
}

/* `sdctl --watch CMD ...`: like watch(1), the screen redrawn on a terminal (one header
 * per draw otherwise), drawn again when the cluster's event history moves (serverdir's
 * events long-poll; at most every WATCH_GAP_MS) and at least every watch_s seconds, so
 * ages stay true on a quiet cluster. Ctrl-C ends it. */
__attribute__((noreturn)) static void watch(ctl_t *ctl, const ctl_cmd_t *cmd, int argc,
                                            char **argv, const char *title)
{
    char last[64] = "";
    sdc_t *follow = sdc_new(ctl->url, ctl->token, WATCH_WAIT_MS + 10000);
    if (!follow) {
        fprintf(stderr, "sdctl: out of memory\n");
        exit(CTL_EXIT_UNAVAILABLE);
    }
    events_newest(ctl, last, sizeof last);
    for (;;) {
        char when[SD_TIME_ISO_LEN];
        sd_time_iso(sd_wall_ms(), when, sizeof when);
        if (isatty(1))
            fputs("\033[H\033[2J", stdout);
        printf("On change, at least every %ds: %s  %s\n\n", watch_s, title, when);
        fflush(stdout);
        int64_t drawn = sd_mono_ms();
        cmd->fn(ctl, argc, argv);
        fflush(stdout);
        fflush(stderr);
        watch_wait(ctl, follow, drawn, last, sizeof last);
    }
}

/* Whether --watch applies to cmd (a view, not a change); a usage error printed if not. */
static int watchable(const ctl_cmd_t *cmd, int argc, char **argv)
{
    static const char *const views[] = {"ps", "status", "machines", "locks", "services",
                                        "servers", "describe", "primary", "allocations", NULL};
    int ok = 0;
    for (const char *const *w = views; *w && !ok; w++)
        ok = !strcmp(*w, cmd->name);
    if (ok && !strcmp(cmd->name, "allocations") && argc > 1 && !strcmp(argv[1], "release"))
        ok = 0; /* a change, not a view */
    if (!ok)
        fprintf(stderr, "sdctl: --watch does not apply to %s%s\n", cmd->name,
                strcmp(cmd->name, "allocations") ? "" : " release");
    return ok;
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
    char title[1024];
    watch_title(argc, argv, title, sizeof title);

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
            return unknown("option", a, global_names, SD_ARRAY_LEN(global_names));
        }
    }
    if (i >= argc) {
        usage(stderr);
        return CTL_EXIT_USAGE;
    }
    /* Hidden helper for the shell completion (sdctl completion bash): the command names,
     * one a line, straight from the generated table. */
    if (!strcmp(argv[i], "__complete")) {
        if (i + 1 < argc && (!strcmp(argv[i + 1], "names") || !strcmp(argv[i + 1], "allocations")))
            return complete_names(&ctl, !strcmp(argv[i + 1], "allocations"));
        for (size_t k = 0; k < ctl_ncmds; k++)
            printf("%s\n", ctl_cmds[k].name);
        return CTL_EXIT_OK;
    }
    const ctl_cmd_t *cmd = command_find(argv[i]);
    if (!cmd)
        return unknown_command(argv[i]);
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
    if (ctl.names && !lists_names(cmd->name, i + 1 < argc ? argv[i + 1] : NULL)) {
        fprintf(stderr, "sdctl: -o name applies to the list commands (ps, machines, services, "
                        "locks, allocations, clusters, servers, events), not %s\n", cmd->name);
        return CTL_EXIT_USAGE;
    }
    if (watch_s && !watchable(cmd, argc - i, argv + i))
        return CTL_EXIT_USAGE;
    if (check_flags(&ctl, cmd, argc - i, argv + i))
        return CTL_EXIT_USAGE;
    ctl.client = sdc_new(ctl.url, ctl.token, 10000);
    if (!ctl.client) {
        fprintf(stderr, "sdctl: bad ServerDir URL list '%s' (want http://host:port[,...])\n", ctl.url);
        return CTL_EXIT_USAGE;
    }
    if (watch_s)
        watch(&ctl, cmd, argc - i, argv + i, title);
    int rc = cmd->fn(&ctl, argc - i, argv + i);
    sdc_free(ctl.client);
    return rc;
}
