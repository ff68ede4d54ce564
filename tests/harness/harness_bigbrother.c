/* Bigbrother for the integration tests: a real bigbrother on a generated config in a temp
 * state dir, its control socket, the instances it reports and the events it put in its
 * outbox. */
#include "harness_bigbrother.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

void bbt_dirs(bbt_t *b)
{
    snprintf(b->dir, sizeof(b->dir), "%s", h_tmpdir());
    snprintf(b->state, sizeof(b->state), "%s/st", b->dir);
    snprintf(b->sock, sizeof(b->sock), "%s/control.sock", b->state);
    snprintf(b->agent, sizeof(b->agent), "%s/agent.sock", b->state);
}

void bbt_config(bbt_t *b, const char *services, const char *extra)
{
    if (!b->dir[0])
        bbt_dirs(b);
    char *text = NULL;
    if (asprintf(&text,
                 "{\"machine\": \"m1\", \"cluster\": \"c1\", \"state_dir\": \"%s\","
                 " \"services\": %s %s}",
                 b->state, services, extra ? extra : "") < 0)
        abort();
    snprintf(b->cfg, sizeof(b->cfg), "%s", h_write_file(b->dir, "bb.json", text, 0644));
    free(text);
}

json_t *bbt_ctl(const bbt_t *b, const char *req)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(b->sock) >= sizeof(sa.sun_path))
        return NULL;
    memcpy(sa.sun_path, b->sock, strlen(b->sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char line[600];
    snprintf(line, sizeof(line), "%s\n", req);
    if (send(fd, line, strlen(line), MSG_NOSIGNAL) < 0) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    while (len < cap && (n = recv(fd, buf + len, cap - len, 0)) > 0)
        len += (size_t)n;
    close(fd);
    json_t *j = json_loadb(buf, len, 0, NULL);
    free(buf);
    return j;
}

/* h_wait_until condition: the control socket at arg (a bbt_t) answers "status". */
static int bbt_answers(void *arg)
{
    json_t *j = bbt_ctl(arg, "status");
    json_decref(j);
    return j != NULL;
}

pid_t bbt_start(bbt_t *b)
{
    const char *argv[] = {BIGBROTHER, "--config", b->cfg, NULL};
    snprintf(b->log, sizeof(b->log), "%s/bb-%d.log", b->dir, ++b->runs);
    unlink(b->sock);
    b->pid = h_spawn(argv, b->log, NULL);
    if (b->pid <= 0 || !h_wait_until(bbt_answers, b, h_valgrind() ? 30000 : 10000))
        return -1;
    return b->pid;
}

json_t *bbt_inst(const bbt_t *b, const char *service, int slot)
{
    json_t *st = bbt_ctl(b, "status"), *found = NULL, *in;
    size_t i;
    json_array_foreach(json_object_get(st, "instances"), i, in) {
        if (!strcmp(json_string_value(json_object_get(in, "service")), service) &&
            json_integer_value(json_object_get(in, "slot")) == slot) {
            found = json_incref(in);
            break;
        }
    }
    json_decref(st);
    return found;
}

const char *bbt_str(json_t *in, const char *key)
{
    const char *s = json_string_value(json_object_get(in, key));
    return s ? s : "";
}

long long bbt_int(json_t *in, const char *key)
{
    return json_integer_value(json_object_get(in, key));
}

json_t *bbt_wait(const bbt_t *b, const char *service, int slot, const char *state,
                 int min_generation, int timeout_ms)
{
    int64_t end = h_now_ms() + timeout_ms;
    while (h_now_ms() < end) {
        json_t *in = bbt_inst(b, service, slot);
        if (in && !strcmp(bbt_str(in, "state"), state) &&
            bbt_int(in, "generation") >= min_generation)
            return in;
        json_decref(in);
        h_sleep_ms(20);
    }
    return NULL;
}

void bbt_stop(const bbt_t *b, int grace_ms)
{
    json_decref(bbt_ctl(b, "stop all"));
    h_stop(b->pid, grace_ms);
}

int bbt_alive(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

int bbt_file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

int bbt_lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

int bbt_run(const char *const *argv, const char *logpath)
{
    pid_t pid = h_spawn(argv, logpath, NULL);
    int st = h_wait_exit(pid, 20000);
    if (st != -1)
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    kill(pid, SIGKILL);
    return -1;
}

/* What bbt_wait_file_has waits for. */
struct file_needle {
    const char *path, *needle;
};

/* h_wait_until condition: the file arg->path contains arg->needle. */
static int file_has_needle(void *arg)
{
    const struct file_needle *w = arg;
    return bbt_file_has(w->path, w->needle);
}

int bbt_wait_file_has(const char *path, const char *needle, int timeout_ms)
{
    struct file_needle w = {path, needle};
    return h_wait_until(file_has_needle, &w, timeout_ms);
}

/* qsort order of file names (char *). */
static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

json_t *bbt_events(const bbt_t *b)
{
    char dir[400], *names[256];
    int n = 0;
    snprintf(dir, sizeof(dir), "%s/outbox", b->state);
    json_t *all = json_array();
    DIR *d = opendir(dir);
    if (!d)
        return all;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (strstr(e->d_name, ".seg"))
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof(names[0]), name_cmp);
    for (int i = 0; i < n; i++) {
        char path[700], line[70000];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        free(names[i]);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof(line), f)) {
            json_t *ev = strlen(line) > 18 ? json_loads(line + 18, JSON_DISABLE_EOF_CHECK, NULL)
                                           : NULL;
            if (ev)
                json_array_append_new(all, ev);
        }
        if (f)
            fclose(f);
    }
    return all;
}

json_t *bbt_events_of(const bbt_t *b, const char *instance)
{
    json_t *all = bbt_events(b), *out = json_array(), *ev;
    size_t i;
    json_array_foreach(all, i, ev)
        if (!strcmp(bbt_str(ev, "instance"), instance))
            json_array_append(out, ev);
    json_decref(all);
    return out;
}

