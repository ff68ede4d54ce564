/* sdctl polish: every command of the generated table (read from the hidden
 * `sdctl __complete`) answers --help with its usage and exit 0 without contacting
 * ServerDir (the URL points nowhere), also after a subcommand; unknown commands are
 * usage errors (exit 2) that suggest the closest name in two lines, and an option
 * without its value says which value it needs; colour escapes appear on a terminal (a
 * pty) only, and never with NO_COLOR; `sdctl completion bash` prints the completion
 * script the package installs, which completes commands, subcommands and options from
 * the real binary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "harness_stack.h"

#define SDCTL SD_BIN_DIR "/sdctl"
#define NOWHERE "SERVERDIR_URL=http://127.0.0.1:1"
#ifndef SD_SOURCE_DIR
#define SD_SOURCE_DIR SD_BIN_DIR "/../.."
#endif

static const char *tmp(void)
{
    static const char *dir;
    if (!dir)
        dir = h_tmpdir();
    return dir;
}

/* Runs argv to completion (<= 10 s) with stdout+stderr captured into *out (malloc'd).
 * Returns the exit code, -1 on timeout. */
static int run(const char *const *argv, const char *const *env, char **out)
{
    static int seq;
    char log[400];
    snprintf(log, sizeof log, "%s/run-%d.log", tmp(), ++seq);
    pid_t pid = h_spawn(argv, log, env);
    int st = h_wait_exit(pid, 10000), code = -1;
    if (st != -1)
        code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    else
        h_stop(pid, 100);
    FILE *f = fopen(log, "r");
    *out = calloc(1, 65537);
    if (f) {
        size_t n = fread(*out, 1, 65536, f);
        (*out)[n] = '\0';
        fclose(f);
    }
    return code;
}

/* The command names from `sdctl __complete`, as a NULL-terminated array (static). */
static char **commands(int *n)
{
    static char *names[64];
    static char *text;
    static int count;
    if (!text) {
        const char *argv[] = {SDCTL, "__complete", NULL};
        assert_int_equal(run(argv, NULL, &text), 0);
        for (char *save, *tok = strtok_r(text, "\n", &save); tok && count < 63;
             tok = strtok_r(NULL, "\n", &save))
            names[count++] = tok;
    }
    *n = count;
    return names;
}

static void every_command_has_help(void **state)
{
    int n;
    char **cmds = commands(&n);
    assert_true(n >= 6);
    const char *env[] = {NOWHERE, NULL};
    char *top;
    const char *targv[] = {SDCTL, "--help", NULL};
    assert_int_equal(run(targv, env, &top), 0);
    assert_non_null(strstr(top, "usage: sdctl"));
    assert_non_null(strstr(top, "exit codes: 0 ok"));
    for (int i = 0; i < n; i++) {
        char *out, line[64];
        /* listed in the top-level help, with its summary */
        snprintf(line, sizeof line, "\n  %s ", cmds[i]);
        assert_non_null(strstr(top, line));
        const char *h1[] = {SDCTL, cmds[i], "--help", NULL};
        int rc = run(h1, env, &out);
        print_message("sdctl %s --help -> %d: %.60s\n", cmds[i], rc, out);
        assert_int_equal(rc, 0);
        assert_non_null(strstr(out, "usage"));
        free(out);
        const char *h2[] = {SDCTL, cmds[i], "-h", NULL};
        assert_int_equal(run(h2, env, &out), 0);
        assert_non_null(strstr(out, "usage"));
        free(out);
        /* after a subcommand or an argument too */
        const char *h3[] = {SDCTL, cmds[i], "get", "x", "--help", NULL};
        assert_int_equal(run(h3, env, &out), 0);
        assert_non_null(strstr(out, "usage"));
        free(out);
    }
    free(top);

    char *out;
    const char *bad[] = {SDCTL, "no-such-command", NULL};
    assert_int_equal(run(bad, env, &out), 2);
    assert_non_null(strstr(out, "unknown command \"no-such-command\""));
    assert_null(strstr(out, "did you mean"));
    free(out);
    /* without --help a command does contact ServerDir: unreachable is exit 3 */
    const char *down[] = {SDCTL, "machines", NULL};
    assert_int_equal(run(down, env, &out), 3);
    free(out);
}

/* The number of lines of text. */
static int lines_of(const char *text)
{
    int n = 0;
    for (const char *p = text; *p; p++)
        n += *p == '\n';
    return n;
}

/* Mistakes get a short answer, exit 2, before any request (the URL points nowhere): the
 * closest command or option ("did you mean"), the value an option needs. */
static void typos_and_missing_values(void **state)
{
    const char *env[] = {NOWHERE, NULL};
    static const struct {
        const char *argv[6];
        const char *says, *also;
    } cases[] = {
        {{"pss"}, "sdctl: unknown command \"pss\"", "did you mean \"ps\"?"},
        {{"machnes"}, "unknown command \"machnes\"", "did you mean \"machines\"?"},
        {{"--clustr", "x", "ps"}, "unknown option \"--clustr\"", "did you mean \"--cluster\"?"},
        {{"ps", "--servce", "zone"}, "sdctl ps: unknown option \"--servce\"",
         "did you mean \"--service\"?"},
        {{"ps", "-o"}, "sdctl: -o needs a value (json, yaml, table, wide, name)", NULL},
        {{"-o"}, "sdctl: -o needs a value (json, yaml, table, wide, name)", NULL},
        {{"ps", "--url"}, "sdctl: --url needs a value (URLS)", NULL},
        {{"machines", "--token"}, "sdctl: --token needs a value (TOKEN)", NULL},
        {{"--cluster"}, "sdctl: --cluster needs a value (NAME)", NULL},
        {{"ps", "--state"}, "sdctl ps: --state needs a value (starting|ready|stopped)", NULL},
        {{"logs", "zone-1", "--tail"}, "sdctl logs: --tail needs a value (N)", NULL},
        {{"logs", "zone-1", "--since"}, "sdctl logs: --since needs a value (DURATION)", NULL},
        {{"events", "--since"}, "sdctl events: --since needs a value (SEQ)", NULL},
        {{"servers", "--game"}, "sdctl servers: --game needs a value (G)", NULL},
        {{"status", "-o", "name"}, "-o name applies to the list commands", NULL},
        {{"logs", "zone-1", "--since", "5x"}, "--since takes a duration such as 5s", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[8] = {SDCTL};
        for (int k = 0; k < 6 && cases[i].argv[k]; k++)
            argv[k + 1] = cases[i].argv[k];
        char *out;
        int rc = run(argv, env, &out);
        print_message("sdctl %s ... -> %d: %s", cases[i].argv[0], rc, out);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, cases[i].says));
        if (cases[i].also)
            assert_non_null(strstr(out, cases[i].also));
        assert_true(lines_of(out) <= 3); /* not the whole help */
        assert_null(strstr(out, "unexpected argument"));
        free(out);
    }
}

/* `sdctl completion bash` is the file the package installs, byte for byte; zsh's is the
 * same behind bashcompinit; another shell is a usage error. */
static void completion_command_prints_the_script(void **state)
{
    char path[600], *file = calloc(1, 65537), *out;
    snprintf(path, sizeof path, "%s/ctl/completion/sdctl.bash", SD_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    file[fread(file, 1, 65536, f)] = '\0';
    fclose(f);
    const char *bash[] = {SDCTL, "completion", "bash", NULL};
    assert_int_equal(run(bash, NULL, &out), 0);
    assert_string_equal(out, file);
    free(out);
    const char *zsh[] = {SDCTL, "completion", "zsh", NULL};
    assert_int_equal(run(zsh, NULL, &out), 0);
    assert_int_equal(strncmp(out, "#compdef sdctl\n", 15), 0);
    assert_non_null(strstr(out, "bashcompinit"));
    assert_non_null(strstr(out, file));
    free(out);
    const char *fish[] = {SDCTL, "completion", "fish", NULL};
    assert_int_equal(run(fish, NULL, &out), 2);
    assert_non_null(strstr(out, "expected bash or zsh"));
    free(out);
    free(file);
}

/* Runs sdctl machines with stdout on a pty (like a terminal); returns its output. */
static char *run_on_pty(const char *url, const char *no_color)
{
    int master, slave;
    assert_int_equal(openpty(&master, &slave, NULL, NULL, NULL), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setsid();
        dup2(slave, 1);
        dup2(slave, 2);
        close(master);
        setenv("SERVERDIR_URL", url, 1);
        setenv("TERM", "xterm", 1);
        if (no_color)
            setenv("NO_COLOR", no_color, 1);
        else
            unsetenv("NO_COLOR");
        execl(SDCTL, SDCTL, "--cluster", "c1", "machines", (char *)NULL);
        _exit(127);
    }
    close(slave);
    size_t cap = 65536, len = 0;
    char *buf = calloc(1, cap + 1);
    int64_t end = h_now_ms() + 10000;
    while (len < cap && h_now_ms() < end) {
        struct pollfd p = {master, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(master, buf + len, cap - len);
        if (r <= 0)
            break; /* EIO once the child closed the pty */
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(master);
    int st = h_wait_exit(pid, 5000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    return buf;
}

static void colour_only_on_a_terminal(void **state)
{
    h_redis_t redis;
    h_serverdir_t sd;
    assert_int_equal(h_stack_start(&redis, &sd, &(h_sd_opts_t){.open = 1}), 0);
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, NULL, "{\"address\":\"10.0.0.5\",\"ttl_ms\":15000}",
                                 &r, "/v1/clusters/c1/machines/m1"),
                     0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    char *tty = run_on_pty(sd.url, NULL);
    assert_non_null(strstr(tty, "m1"));
    assert_non_null(strstr(tty, "\033["));
    free(tty);
    tty = run_on_pty(sd.url, "1");
    assert_non_null(strstr(tty, "m1"));
    assert_null(strstr(tty, "\033["));
    free(tty);
    /* NO_COLOR set but empty does not count (no-color.org) */
    tty = run_on_pty(sd.url, "");
    assert_non_null(strstr(tty, "\033["));
    free(tty);

    char env_url[200], *out;
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    const char *env[] = {env_url, NULL};
    const char *argv[] = {SDCTL, "--cluster", "c1", "machines", NULL};
    assert_int_equal(run(argv, env, &out), 0);
    assert_non_null(strstr(out, "m1"));
    assert_null(strstr(out, "\033["));
    free(out);
    h_stack_stop(&redis, &sd);
}

/* Runs the completion function for the given words (the last is the one completed). */
static char *complete(const char *words)
{
    char script[2000], *out;
    snprintf(script, sizeof script,
             "PATH=%s:$PATH; source <(sdctl completion bash); "
             "COMP_WORDS=(%s); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _sdctl; "
             "echo \"${COMPREPLY[*]}\"",
             SD_BIN_DIR, words);
    const char *argv[] = {"bash", "--norc", "--noprofile", "-c", script, NULL};
    assert_int_equal(run(argv, NULL, &out), 0);
    return out;
}

static void bash_completion_uses_the_binary(void **state)
{
    char *out = complete("sdctl ''");
    int n;
    char **cmds = commands(&n);
    for (int i = 0; i < n; i++)
        assert_non_null(strstr(out, cmds[i]));
    free(out);
    out = complete("sdctl --cluster c1 lo");
    assert_string_equal(out, "locks logs\n");
    free(out);
    out = complete("sdctl locks ''");
    assert_non_null(strstr(out, "get"));
    assert_non_null(strstr(out, "force-unlock"));
    free(out);
    out = complete("sdctl ps --s");
    assert_non_null(strstr(out, "--service"));
    assert_non_null(strstr(out, "--state"));
    free(out);
    out = complete("sdctl -o j");
    assert_string_equal(out, "json\n");
    free(out);
}

/* zsh runs the same completion function through bashcompinit, which fills COMP_WORDS
 * 1-based and COMP_CWORD = CURRENT - 1 (the function reads them 0-based, ksharrays) and
 * leaves the filtering by prefix to zsh (compadd): the lists are whole here. */
static char *zsh_complete(const char *words, int cword)
{
    char script[2000], *out;
    snprintf(script, sizeof script,
             "PATH=%s:$PATH; source <(sdctl completion zsh); COMP_WORDS=(%s); COMP_CWORD=%d; "
             "_sdctl; print -r -- \"${COMPREPLY[*]}\"",
             SD_BIN_DIR, words, cword);
    const char *argv[] = {"/usr/bin/zsh", "-f", "-c", script, NULL};
    const char *env[] = {NOWHERE, NULL};
    assert_int_equal(run(argv, env, &out), 0);
    return out;
}

static void zsh_completion_through_bashcompinit(void **state)
{
    char *out = zsh_complete("sdctl ps --s", 2);
    assert_non_null(strstr(out, "--service"));
    assert_non_null(strstr(out, "--state"));
    assert_null(strstr(out, "json"));
    free(out);
    out = zsh_complete("sdctl --cluster c1 -o j", 4);
    assert_string_equal(out, "table wide json yaml name\n");
    free(out);
    out = zsh_complete("sdctl locks ''", 2);
    assert_non_null(strstr(out, "force-unlock"));
    assert_null(strstr(out, "machines"));
    free(out);
    out = zsh_complete("sdctl ''", 1);
    assert_non_null(strstr(out, "completion"));
    assert_non_null(strstr(out, "machines"));
    free(out);
}

int main(void)
{
    h_init(90);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_command_has_help),
        cmocka_unit_test(typos_and_missing_values),
        cmocka_unit_test(completion_command_prints_the_script),
        cmocka_unit_test(colour_only_on_a_terminal),
        cmocka_unit_test(bash_completion_uses_the_binary),
        cmocka_unit_test(zsh_completion_through_bashcompinit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
