/* The bigbrother config file: parsing and validation. Every error names the file, the
 * field as a path (services[0].restart.policy) and why; the daemon exits 100 on it. */
#include "bb.h"
#include "sdjson.h"
#include "sdlog.h"

#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_MAX_BYTES (1 << 20)

typedef struct {
    const char *file;
    char *err;
    size_t cap;
} ctx_t;

static int fail(ctx_t *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(ctx_t *c, const char *path, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(c->err, c->cap, "%s: %s: %s", c->file, path, why);
    return -1;
}

/* The path of key inside the object at path `at` ("" for the top level). */
static const char *sub(char *buf, size_t cap, const char *at, const char *key)
{
    if (snprintf(buf, cap, "%s%s%s", at, at[0] ? "." : "", key) >= (int)cap)
        memcpy(buf + cap - 4, "...", 4);
    return buf;
}

static int only_keys(ctx_t *c, const json_t *obj, const char *at, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = !strcmp(k, allowed[i]);
        if (!ok) {
            char p[160];
            return fail(c, sub(p, sizeof(p), at, k), "unknown field");
        }
    }
    return 0;
}

/* Reads an object member: 0 and *out, 1 if absent and optional, -1 with the error. */
static int get_obj(ctx_t *c, const json_t *obj, const char *at, const char *key,
                   int required, json_t **out)
{
    char p[160];
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return fail(c, sub(p, sizeof(p), at, key), "is required");
        return 1;
    }
    if (!json_is_object(v))
        return fail(c, sub(p, sizeof(p), at, key), "must be an object");
    *out = v;
    return 0;
}

static int get_str(ctx_t *c, const json_t *obj, const char *at, const char *key,
                   int required, size_t maxlen, const char **out)
{
    char p[160];
    json_t *v = json_object_get(obj, key);
    sub(p, sizeof(p), at, key);
    if (!v || json_is_null(v))
        return required ? fail(c, p, "is required") : 1;
    if (!json_is_string(v))
        return fail(c, p, "must be a string");
    if (json_string_length(v) > maxlen)
        return fail(c, p, "is longer than %zu bytes", maxlen);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(c, p, "contains a NUL character");
    *out = json_string_value(v);
    return 0;
}

static int get_name(ctx_t *c, const json_t *obj, const char *at, const char *key,
                    int required, const char **out)
{
    int rc = get_str(c, obj, at, key, required, SD_NAME_MAX, out);
    if (rc)
        return rc;
    if (!sd_name_valid(*out, SD_NAME_MAX)) {
        char p[160];
        return fail(c, sub(p, sizeof(p), at, key),
                    "must be 1-128 characters of [A-Za-z0-9_.:@-], not starting with '.' or '-'");
    }
    return 0;
}

static int get_int(ctx_t *c, const json_t *obj, const char *at, const char *key,
                   int64_t min, int64_t max, int64_t def, int64_t *out)
{
    char p[160];
    json_t *v = json_object_get(obj, key);
    sub(p, sizeof(p), at, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return fail(c, p, "must be an integer");
    int64_t n = json_integer_value(v);
    if (n < min || n > max)
        return fail(c, p, "must be between %lld and %lld", (long long)min, (long long)max);
    *out = n;
    return 0;
}

#define GET_INT(c, obj, at, key, min, max, def, dst)                                   \
    do {                                                                               \
        int64_t v_;                                                                    \
        if (get_int(c, obj, at, key, min, max, def, &v_))                              \
            return -1;                                                                 \
        dst = v_;                                                                      \
    } while (0)

static const struct {
    const char *name;
    int sig;
} signals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ABRT", SIGABRT},
    {"KILL", SIGKILL}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},
    {"SEGV", SIGSEGV}, {"BUS", SIGBUS},   {"TRAP", SIGTRAP}, {"CONT", SIGCONT},
};

int bb_signal_parse(const char *s)
{
    int64_t n;
    if (sd_parse_i64(s, 1, 64, &n) == 0)
        return (int)n;
    if (!strncmp(s, "SIG", 3))
        s += 3;
    for (size_t i = 0; i < SD_ARRAY_LEN(signals); i++)
        if (!strcmp(s, signals[i].name))
            return signals[i].sig;
    return -1;
}

static int get_signal(ctx_t *c, const json_t *obj, const char *at, const char *key, int def,
                      int *out)
{
    const char *s;
    int rc = get_str(c, obj, at, key, 0, 16, &s);
    if (rc < 0)
        return -1;
    if (rc == 1) {
        *out = def;
        return 0;
    }
    if ((*out = bb_signal_parse(s)) < 0) {
        char p[160];
        return fail(c, sub(p, sizeof(p), at, key),
                    "'%s' is not a signal (use a name like TERM, ABRT, KILL or a number)", s);
    }
    return 0;
}

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int bb_unescape(const char *s, unsigned char *out, size_t cap)
{
    size_t n = 0;
    while (*s) {
        int ch = (unsigned char)*s++;
        if (ch == '\\') {
            switch (*s++) {
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case '0': ch = 0; break;
            case '\\': ch = '\\'; break;
            case 'x': {
                int hi = hexval(s[0]), lo = hi < 0 ? -1 : hexval(s[1]);
                if (lo < 0)
                    return -1;
                ch = hi * 16 + lo;
                s += 2;
                break;
            }
            default: return -1;
            }
        }
        if (n >= cap)
            return -1;
        out[n++] = (unsigned char)ch;
    }
    return (int)n;
}

static int parse_health(ctx_t *c, const json_t *h, const char *at, bb_service_t *s)
{
    static const char *const keys[] = {"type", "start_timeout_ms", "liveness_timeout_ms",
                                       "period_ms", "failure_threshold", "timeout_ms", "port",
                                       "query", "expect", "command", "path", NULL};
    /* in the order of enum bb_health */
    static const char *const types[] = {"agent", "notify", "tcp", "udp", "exec", "none", "http"};
    char p[160];
    const char *type = "none";
    if (only_keys(c, h, at, keys) || get_str(c, h, at, "type", 1, 16, &type) < 0)
        return -1;
    size_t t = 0;
    while (t < SD_ARRAY_LEN(types) && strcmp(type, types[t]))
        t++;
    if (t == SD_ARRAY_LEN(types))
        return fail(c, sub(p, sizeof(p), at, "type"),
                    "'%s' must be one of agent, notify, tcp, udp, http, exec, none", type);
    s->health.type = (enum bb_health)t;
    GET_INT(c, h, at, "start_timeout_ms", 100, 3600000, 10000, s->health.start_timeout_ms);
    GET_INT(c, h, at, "liveness_timeout_ms", 100, 3600000, 3000,
            s->health.liveness_timeout_ms);
    GET_INT(c, h, at, "period_ms", 50, 3600000, 1000, s->health.period_ms);
    GET_INT(c, h, at, "failure_threshold", 1, 100, 3, s->health.failure_threshold);
    GET_INT(c, h, at, "timeout_ms", 10, 3600000, s->health.period_ms, s->health.timeout_ms);
    int needs_port = s->health.type == BB_H_TCP || s->health.type == BB_H_UDP ||
                     s->health.type == BB_H_HTTP;
    if (needs_port && !json_object_get(h, "port"))
        return fail(c, sub(p, sizeof(p), at, "port"), "is required for type %s", type);
    GET_INT(c, h, at, "port", 1, 65535, 0, s->health.port);
    if (s->health.type == BB_H_UDP) {
        const char *q = NULL, *e = "";
        if (get_str(c, h, at, "query", 1, 4 * BB_PROBE_BYTES_MAX, &q) ||
            get_str(c, h, at, "expect", 0, 4 * BB_PROBE_BYTES_MAX, &e) < 0)
            return -1;
        int n = bb_unescape(q, s->health.query, sizeof(s->health.query));
        if (n <= 0)
            return fail(c, sub(p, sizeof(p), at, "query"),
                        "must be 1-%d bytes; escapes allowed: \\xHH \\n \\r \\t \\0 \\\\",
                        BB_PROBE_BYTES_MAX);
        s->health.query_len = (size_t)n;
        n = bb_unescape(e, s->health.expect, sizeof(s->health.expect));
        if (n < 0)
            return fail(c, sub(p, sizeof(p), at, "expect"),
                        "must be at most %d bytes; escapes allowed: \\xHH \\n \\r \\t \\0 \\\\",
                        BB_PROBE_BYTES_MAX);
        s->health.expect_len = (size_t)n;
    }
    if (s->health.type == BB_H_HTTP) {
        const char *path = "/";
        if (get_str(c, h, at, "path", 0, BB_HTTP_PATH_MAX, &path) < 0)
            return -1;
        int okpath = path[0] == '/';
        for (const char *q = path; *q && okpath; q++)
            okpath = *q > 0x20 && *q < 0x7f;
        if (!okpath)
            return fail(c, sub(p, sizeof(p), at, "path"),
                        "must start with '/' and be at most %d printable characters without"
                        " spaces (percent-encode others)", BB_HTTP_PATH_MAX);
        int n = snprintf((char *)s->health.query, sizeof(s->health.query),
                         "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nUser-Agent: bigbrother\r\n"
                         "Connection: close\r\n\r\n",
                         path, s->health.port);
        s->health.query_len = (size_t)n; /* fits: path <= BB_HTTP_PATH_MAX */
    }
    if (s->health.type == BB_H_EXEC &&
        get_str(c, h, at, "command", 1, 4096, &s->health.command))
        return -1;
    return 0;
}

static int parse_restart(ctx_t *c, const json_t *r, const char *at, bb_service_t *s)
{
    static const char *const keys[] = {"policy", "backoff_min_ms", "backoff_max_ms",
                                       "max_restarts", "window_s", "healthy_reset_ms", NULL};
    const char *pol = "always";
    char p[160];
    if (r && (only_keys(c, r, at, keys) || get_str(c, r, at, "policy", 0, 16, &pol) < 0))
        return -1;
    if (!strcmp(pol, "always"))
        s->restart.policy = BB_P_ALWAYS;
    else if (!strcmp(pol, "on-failure"))
        s->restart.policy = BB_P_ON_FAILURE;
    else if (!strcmp(pol, "never"))
        s->restart.policy = BB_P_NEVER;
    else
        return fail(c, sub(p, sizeof(p), at, "policy"),
                    "'%s' must be one of always, on-failure, never", pol);
    GET_INT(c, r, at, "backoff_min_ms", 0, 3600000, 100, s->restart.backoff_min_ms);
    GET_INT(c, r, at, "backoff_max_ms", 0, 3600000, 30000, s->restart.backoff_max_ms);
    if (s->restart.backoff_max_ms < s->restart.backoff_min_ms)
        return fail(c, sub(p, sizeof(p), at, "backoff_max_ms"),
                    "must be >= backoff_min_ms (%d)", s->restart.backoff_min_ms);
    GET_INT(c, r, at, "max_restarts", 1, BB_WINDOW_MAX, 5, s->restart.max_restarts);
    GET_INT(c, r, at, "window_s", 1, 86400, 60, s->restart.window_s);
    GET_INT(c, r, at, "healthy_reset_ms", 0, 86400000, 10000, s->restart.healthy_reset_ms);
    return 0;
}

static int parse_stop(ctx_t *c, const json_t *st, const char *at, bb_service_t *s)
{
    static const char *const keys[] = {"signal", "grace_ms", "hang_signal", NULL};
    if (st && only_keys(c, st, at, keys))
        return -1;
    if (get_signal(c, st, at, "signal", SIGTERM, &s->stop.signal) ||
        get_signal(c, st, at, "hang_signal", SIGABRT, &s->stop.hang_signal))
        return -1;
    GET_INT(c, st, at, "grace_ms", 0, 3600000, 5000, s->stop.grace_ms);
    return 0;
}

static int parse_rlimits(ctx_t *c, const json_t *rl, const char *at, bb_service_t *s)
{
    static const struct {
        const char *name;
        int res;
    } names[] = {{"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE},   {"nproc", RLIMIT_NPROC},
                 {"as", RLIMIT_AS},         {"stack", RLIMIT_STACK}, {"cpu", RLIMIT_CPU},
                 {"fsize", RLIMIT_FSIZE},   {"memlock", RLIMIT_MEMLOCK}};
    const char *k;
    json_t *v;
    char p[160];
    json_object_foreach((json_t *)rl, k, v) {
        size_t i = 0;
        while (i < SD_ARRAY_LEN(names) && strcmp(k, names[i].name))
            i++;
        sub(p, sizeof(p), at, k);
        if (i == SD_ARRAY_LEN(names))
            return fail(c, p, "unknown limit (nofile, core, nproc, as, stack, cpu, fsize, memlock)");
        rlim_t val;
        if (json_is_string(v) && !strcmp(json_string_value(v), "unlimited"))
            val = RLIM_INFINITY;
        else if (json_is_integer(v) && json_integer_value(v) >= 0)
            val = (rlim_t)json_integer_value(v);
        else
            return fail(c, p, "must be an integer >= 0 or \"unlimited\"");
        bb_rlimit_t *r = &s->rlimits[s->nrlimits++];
        r->resource = names[i].res;
        r->lim.rlim_cur = r->lim.rlim_max = val;
    }
    return 0;
}

static int parse_service(ctx_t *c, const json_t *js, int idx, bb_service_t *s)
{
    static const char *const keys[] = {"name", "command", "args", "env", "count", "user",
                                       "cwd", "rlimits", "health", "restart", "stop", NULL};
    char at[32], p[160];
    json_t *o = NULL;
    snprintf(at, sizeof(at), "services[%d]", idx);
    if (!json_is_object(js))
        return fail(c, at, "must be an object");
    if (only_keys(c, js, at, keys) || get_name(c, js, at, "name", 1, &s->name) ||
        get_str(c, js, at, "command", 1, 4096, &s->command))
        return -1;
    if (s->command[0] != '/')
        return fail(c, sub(p, sizeof(p), at, "command"), "must be an absolute path");
    if (access(s->command, X_OK))
        return fail(c, sub(p, sizeof(p), at, "command"), "'%s' is not executable: %s",
                    s->command, strerror(errno));
    json_t *args = json_object_get(js, "args");
    if (args && !json_is_array(args))
        return fail(c, sub(p, sizeof(p), at, "args"), "must be an array of strings");
    size_t nargs = args ? json_array_size(args) : 0;
    if (nargs > 256)
        return fail(c, sub(p, sizeof(p), at, "args"), "has more than 256 entries");
    s->argv = calloc(nargs + 2, sizeof(char *));
    if (!s->argv)
        return fail(c, at, "out of memory");
    s->argv[0] = (char *)s->command;
    for (size_t i = 0; i < nargs; i++) {
        json_t *a = json_array_get(args, i);
        if (!json_is_string(a)) {
            snprintf(p, sizeof(p), "%s.args[%zu]", at, i);
            return fail(c, p, "must be a string");
        }
        s->argv[i + 1] = (char *)json_string_value(a);
    }
    int rc = get_obj(c, js, at, "env", 0, &o);
    if (rc < 0)
        return -1;
    s->env = calloc((rc == 0 ? json_object_size(o) : 0) + 1, sizeof(char *));
    if (!s->env)
        return fail(c, at, "out of memory");
    if (rc == 0) {
        const char *k;
        json_t *v;
        size_t n = 0;
        json_object_foreach(o, k, v) {
            snprintf(p, sizeof(p), "%s.env.%s", at, k);
            if (!k[0] || strchr(k, '=') || !json_is_string(v))
                return fail(c, p, "must be a string, with a name without '='");
            if (!strncmp(k, "BB_", 3) || !strcmp(k, "NOTIFY_SOCKET") ||
                !strcmp(k, "WATCHDOG_USEC"))
                return fail(c, p, "is set by bigbrother and cannot be overridden");
            if (asprintf(&s->env[n], "%s=%s", k, json_string_value(v)) < 0)
                return fail(c, p, "out of memory");
            n++;
        }
    }
    GET_INT(c, js, at, "count", 0, 10000, 1, s->count);
    if (get_str(c, js, at, "user", 0, 64, &s->user) < 0 ||
        get_str(c, js, at, "cwd", 0, 4096, &s->cwd) < 0)
        return -1;
    if (s->user) {
        struct passwd *pw = getpwnam(s->user);
        if (!pw)
            return fail(c, sub(p, sizeof(p), at, "user"), "no such user '%s'", s->user);
        s->uid = pw->pw_uid;
        s->gid = pw->pw_gid;
        if (geteuid() != 0 && s->uid != geteuid())
            return fail(c, sub(p, sizeof(p), at, "user"),
                        "running as user '%s' needs bigbrother to run as root", s->user);
    }
    if (s->cwd && s->cwd[0] != '/')
        return fail(c, sub(p, sizeof(p), at, "cwd"), "must be an absolute path");
    if ((rc = get_obj(c, js, at, "rlimits", 0, &o)) < 0 ||
        (rc == 0 && parse_rlimits(c, o, sub(p, sizeof(p), at, "rlimits"), s)))
        return -1;
    char hp[64], rp[64], sp[64];
    json_t *h = NULL, *r = NULL, *st = NULL;
    if (get_obj(c, js, at, "health", 1, &h) < 0 ||
        parse_health(c, h, sub(hp, sizeof(hp), at, "health"), s))
        return -1;
    if (get_obj(c, js, at, "restart", 0, &r) < 0 ||
        parse_restart(c, r, sub(rp, sizeof(rp), at, "restart"), s))
        return -1;
    if (get_obj(c, js, at, "stop", 0, &st) < 0 ||
        parse_stop(c, st, sub(sp, sizeof(sp), at, "stop"), s))
        return -1;
    return 0;
}

static int sock_path(ctx_t *c, const json_t *root, const char *key, const char *state_dir,
                     const char *def, char *out)
{
    const char *v = NULL;
    int rc = get_str(c, root, "", key, 0, 4096, &v);
    if (rc < 0)
        return -1;
    int n = rc == 1 ? snprintf(out, BB_SOCK_PATH_MAX, "%s/%s", state_dir, def)
                    : snprintf(out, BB_SOCK_PATH_MAX, "%s", v);
    if (n >= BB_SOCK_PATH_MAX)
        return fail(c, key, "socket path '%s%s%s' is longer than %d bytes",
                    rc == 1 ? state_dir : v, rc == 1 ? "/" : "", rc == 1 ? def : "",
                    BB_SOCK_PATH_MAX - 1);
    return 0;
}

static int parse_root(ctx_t *c, bb_config_t *cfg)
{
    static const char *const keys[] = {
        "machine", "cluster", "serverdir", "state_dir", "agent_socket", "notify_socket",
        "control_socket", "log_max_bytes", "log_keep", "services", "address", "labels",
        "capacity", "lease_ttl_ms", "metrics_listen", "mode", "primary_ttl_ms",
        "placement_interval_ms", "assignment_wait_ms", NULL};
    json_t *root = cfg->root, *o = NULL;
    if (!json_is_object(root))
        return fail(c, "(top level)", "must be a JSON object");
    if (only_keys(c, root, "", keys) || get_name(c, root, "", "machine", 1, &cfg->machine) ||
        get_name(c, root, "", "cluster", 1, &cfg->cluster) ||
        get_str(c, root, "", "state_dir", 1, 200, &cfg->state_dir) ||
        get_str(c, root, "", "address", 0, 256, &cfg->address) < 0)
        return -1;
    if (cfg->state_dir[0] != '/')
        return fail(c, "state_dir", "must be an absolute path");
    const char *ml = NULL;
    if (get_str(c, root, "", "metrics_listen", 0, 127, &ml) < 0)
        return -1;
    if (ml && (sd_parse_hostport(ml, cfg->metrics_host, sizeof(cfg->metrics_host),
                                 &cfg->metrics_port) ||
               !cfg->metrics_host[0] || cfg->metrics_port <= 0))
        return fail(c, "metrics_listen", "must be HOST:PORT (an IP address and a port)");
    int rc = get_obj(c, root, "", "serverdir", 0, &o);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        static const char *const skeys[] = {"urls", "token", NULL};
        if (only_keys(c, o, "serverdir", skeys) ||
            get_str(c, o, "serverdir", "token", 0, 256, &cfg->token) < 0)
            return -1;
        json_t *urls = json_object_get(o, "urls");
        if (!json_is_array(urls) || json_array_size(urls) < 1 || json_array_size(urls) > 16)
            return fail(c, "serverdir.urls", "must be an array of 1 to 16 URLs");
        sd_buf_t b;
        sd_buf_init(&b, 8192);
        for (size_t i = 0; i < json_array_size(urls); i++) {
            json_t *u = json_array_get(urls, i);
            const char *s = json_is_string(u) ? json_string_value(u) : "";
            if (strncmp(s, "http://", 7) && strncmp(s, "https://", 8)) {
                char p[64];
                snprintf(p, sizeof(p), "serverdir.urls[%zu]", i);
                sd_buf_free(&b);
                return fail(c, p, "must be a string starting with http:// or https://");
            }
            if (strchr(s, ',') || sd_buf_printf(&b, "%s%s", i ? "," : "", s)) {
                sd_buf_free(&b);
                return fail(c, "serverdir.urls", "URLs must not contain ',' and fit in 8 KB");
            }
        }
        cfg->urls = b.data;
    }
    rc = get_obj(c, root, "", "labels", 0, &cfg->labels);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        const char *k;
        json_t *v;
        json_object_foreach(cfg->labels, k, v) {
            char p[160];
            if (!json_is_string(v))
                return fail(c, sub(p, sizeof(p), "labels", k), "must be a string");
        }
    }
    const char *mode = "standalone";
    if (get_str(c, root, "", "mode", 0, 16, &mode) < 0)
        return -1;
    if (strcmp(mode, "standalone") && strcmp(mode, "cluster"))
        return fail(c, "mode", "'%s' must be standalone or cluster", mode);
    cfg->cluster_mode = !strcmp(mode, "cluster");
    if (cfg->cluster_mode && !cfg->urls)
        return fail(c, "mode", "cluster mode needs serverdir.urls");
    /* in cluster mode the capacity also sizes the slot table: default 1000 */
    GET_INT(c, root, "", "capacity", 0, 1000000, cfg->cluster_mode ? 1000 : 0, cfg->capacity);
    if (cfg->cluster_mode && cfg->capacity == 0)
        return fail(c, "capacity", "must be at least 1 in cluster mode");
    GET_INT(c, root, "", "lease_ttl_ms", 1000, 300000, 15000, cfg->lease_ttl_ms);
    GET_INT(c, root, "", "primary_ttl_ms", 1000, 300000, 10000, cfg->primary_ttl_ms);
    GET_INT(c, root, "", "placement_interval_ms", 100, 60000, 1000, cfg->placement_interval_ms);
    GET_INT(c, root, "", "assignment_wait_ms", 500, 60000, 10000, cfg->assignment_wait_ms);
    GET_INT(c, root, "", "log_max_bytes", 4096, (int64_t)1 << 40, 10 << 20, cfg->log_max_bytes);
    GET_INT(c, root, "", "log_keep", 0, 100, 3, cfg->log_keep);
    if (sock_path(c, root, "agent_socket", cfg->state_dir, "agent.sock", cfg->agent_socket) ||
        sock_path(c, root, "notify_socket", cfg->state_dir, "notify.sock",
                  cfg->notify_socket) ||
        sock_path(c, root, "control_socket", cfg->state_dir, "control.sock",
                  cfg->control_socket))
        return -1;
    json_t *svcs = json_object_get(root, "services");
    if (svcs && !json_is_array(svcs))
        return fail(c, "services", "must be an array");
    size_t n = svcs ? json_array_size(svcs) : 0;
    if (n > 1000)
        return fail(c, "services", "has more than 1000 entries");
    cfg->services = calloc(n ? n : 1, sizeof(bb_service_t));
    if (!cfg->services)
        return fail(c, "services", "out of memory");
    for (size_t i = 0; i < n; i++) {
        cfg->nservices = (int)i + 1;
        if (parse_service(c, json_array_get(svcs, i), (int)i, &cfg->services[i]))
            return -1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(cfg->services[j].name, cfg->services[i].name)) {
                char p[64];
                snprintf(p, sizeof(p), "services[%zu].name", i);
                return fail(c, p, "'%s' is already the name of services[%zu]",
                            cfg->services[i].name, j);
            }
    }
    return 0;
}

int bb_config_parse(const char *text, const char *name, bb_config_t *cfg, char *err,
                    size_t errcap)
{
    ctx_t c = {name, err, errcap};
    char why[256];
    memset(cfg, 0, sizeof(*cfg));
    cfg->path = name;
    cfg->root = sd_json_parse(text, strlen(text), SD_JSON_MAX_DEPTH, why, sizeof(why));
    if (!cfg->root) {
        snprintf(err, errcap, "%s: %s", name, why);
        return -1;
    }
    if (parse_root(&c, cfg)) {
        bb_config_free(cfg);
        return -1;
    }
    return 0;
}

int bb_config_load(const char *path, bb_config_t *cfg, char *err, size_t errcap)
{
    char *text = NULL;
    size_t len;
    int rc = sd_read_file(path, CONFIG_MAX_BYTES, &text, &len);
    if (rc) {
        snprintf(err, errcap, "%s: cannot read: %s", path,
                 rc == -E2BIG ? "larger than 1 MB" : strerror(-rc));
        return -1;
    }
    if (strlen(text) != len) {
        free(text);
        snprintf(err, errcap, "%s: contains a NUL byte", path);
        return -1;
    }
    rc = bb_config_parse(text, path, cfg, err, errcap);
    free(text);
    struct stat st;
    if (rc == 0 && cfg->token && stat(path, &st) == 0 && (st.st_mode & 0004))
        log_warn("config file holds a serverdir token and is readable by others",
                 "path=%s mode=%o", path, (unsigned)(st.st_mode & 0777));
    return rc;
}

void bb_config_free(bb_config_t *cfg)
{
    for (int i = 0; i < cfg->nservices; i++) {
        bb_service_t *s = &cfg->services[i];
        free(s->argv);
        for (char **e = s->env; e && *e; e++)
            free(*e);
        free(s->env);
    }
    free(cfg->services);
    free(cfg->urls);
    json_decref(cfg->root);
    memset(cfg, 0, sizeof(*cfg));
}
