/* Harness additions for the sdctl tests (harness_sdctl.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>

#include "harness.h"
#include "harness_sdctl.h"

#define SDCTL_ARGS_MAX 30

int h_sdctl_run(const char *const *args, const char *const *env, int timeout_ms, char *out,
                size_t cap)
{
    const char *argv[SDCTL_ARGS_MAX + 2] = {SD_BIN_DIR "/sdctl"};
    int n = 1;
    for (; *args && n <= SDCTL_ARGS_MAX; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    char logpath[300];
    static const char *dir; /* one directory for every run (h_tmpdir makes a new one) */
    if (!dir)
        dir = h_tmpdir();
    snprintf(logpath, sizeof logpath, "%s/sdctl.out", dir);
    unlink(logpath); /* h_spawn appends: this run's output only */
    pid_t pid = h_spawn(argv, logpath, env);
    int st = -1;
    int64_t until = h_now_ms() + timeout_ms;
    int done = 0;
    while (!(done = h_exited(pid, &st)) && h_now_ms() < until)
        h_sleep_ms(5);
    if (!done) { /* killed and reaped: a late one cannot run on beside the next run */
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        st = -1;
    }
    FILE *f = fopen(logpath, "r");
    if (!f) { /* say so: an empty answer would look like sdctl's own */
        snprintf(out, cap, "h_sdctl_run: %s: %s\n", logpath, strerror(errno));
        return -1;
    }
    size_t got = fread(out, 1, cap - 1, f);
    out[got] = '\0';
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int h_sdctl_vrun(const char *const *env, int timeout_ms, char *out, size_t cap, va_list ap)
{
    const char *args[SDCTL_ARGS_MAX + 1];
    int n = 0;
    for (const char *a; n < SDCTL_ARGS_MAX && (a = va_arg(ap, const char *));)
        args[n++] = a;
    args[n] = NULL;
    return h_sdctl_run(args, env, timeout_ms, out, cap);
}

const char *h_line_with(const char *text, const char *needle, char *line, size_t cap)
{
    const char *p = strstr(text, needle);
    if (!p)
        return NULL;
    if (needle[0] == '\n')
        p++;
    const char *b = p;
    while (b > text && b[-1] != '\n')
        b--;
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - b) : strlen(b);
    if (n >= cap)
        n = cap - 1;
    memcpy(line, b, n);
    line[n] = '\0';
    return line;
}
