/* The bigbrother config file: parsing and validation. Every error names the file, the
 * field as a path (services[0].restart.policy) and why; the daemon exits 100 on it. */
#include "core/bb.h"
#include "sdjson.h"
#include "sdlog.h"
#include "sdvalid.h"

#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_MAX_BYTES (1 << 20)

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

/* Reads the health object h (the context's path is at it) into s->health. */
static int parse_health(sd_jv_t *v, const json_t *h, bb_service_t *s)
{
    static const char *const keys[] = {"type", "start_timeout_ms", "liveness_timeout_ms",
                                       "period_ms", "failure_threshold", "timeout_ms", "port",
                                       "query", "expect", "command", "path", NULL};
    /* as listed in messages; types_enum[] maps each to its enum bb_health */
    static const char *const types[] = {"agent", "notify", "tcp", "udp", "http", "exec", "none",
                                        NULL};
    static const enum bb_health types_enum[] = {BB_H_AGENT, BB_H_NOTIFY, BB_H_TCP, BB_H_UDP,
                                                BB_H_HTTP,  BB_H_EXEC,   BB_H_NONE};
    int t = 0;
    if (sd_jv_only_keys(v, h, keys) || sd_jv_enum(v, h, "type", 1, types, &t))
        return -1;
    const char *type = types[t];
    s->health.type = types_enum[t];
    s->health.start_timeout_ms = 10000;
    s->health.liveness_timeout_ms = 3000;
    s->health.period_ms = 1000;
    s->health.failure_threshold = 3;
    if (sd_jv_i32(v, h, "start_timeout_ms", 0, 100, 3600000, &s->health.start_timeout_ms) < 0 ||
        sd_jv_i32(v, h, "liveness_timeout_ms", 0, 100, 3600000,
                  &s->health.liveness_timeout_ms) < 0 ||
        sd_jv_i32(v, h, "period_ms", 0, 50, 3600000, &s->health.period_ms) < 0 ||
        sd_jv_i32(v, h, "failure_threshold", 0, 1, 100, &s->health.failure_threshold) < 0)
        return -1;
    s->health.timeout_ms = s->health.period_ms;
    if (sd_jv_i32(v, h, "timeout_ms", 0, 10, 3600000, &s->health.timeout_ms) < 0)
        return -1;
    int needs_port = s->health.type == BB_H_TCP || s->health.type == BB_H_UDP ||
                     s->health.type == BB_H_HTTP;
    if (needs_port && !json_object_get(h, "port"))
        return sd_jv_fail(v, "port", "is required for type %s", type);
    if (sd_jv_i32(v, h, "port", 0, 1, 65535, &s->health.port) < 0)
        return -1;
    if (s->health.type == BB_H_UDP) {
        const char *q = NULL, *e = "";
        if (sd_jv_str(v, h, "query", 1, 4 * BB_PROBE_BYTES_MAX, &q) ||
            sd_jv_str(v, h, "expect", 0, 4 * BB_PROBE_BYTES_MAX, &e) < 0)
            return -1;
        int n = bb_unescape(q, s->health.query, sizeof(s->health.query));
        if (n <= 0)
            return sd_jv_fail(v, "query",
                              "must be 1-%d bytes; escapes allowed: \\xHH \\n \\r \\t \\0 \\\\",
                              BB_PROBE_BYTES_MAX);
        s->health.query_len = (size_t)n;
        n = bb_unescape(e, s->health.expect, sizeof(s->health.expect));
        if (n < 0)
            return sd_jv_fail(v, "expect",
                              "must be at most %d bytes; escapes allowed: \\xHH \\n \\r \\t \\0 "
                              "\\\\",
                              BB_PROBE_BYTES_MAX);
        s->health.expect_len = (size_t)n;
    }
    if (s->health.type == BB_H_HTTP) {
        const char *path = "/";
        if (sd_jv_str(v, h, "path", 0, BB_HTTP_PATH_MAX, &path) < 0)
            return -1;
        int okpath = path[0] == '/';
        for (const char *q = path; *q && okpath; q++)
            okpath = *q > 0x20 && *q < 0x7f;
        if (!okpath)
            return sd_jv_fail(v, "path",
                              "must start with '/' and be at most %d printable characters"
                              " without spaces (percent-encode others)",
                              BB_HTTP_PATH_MAX);
        int n = snprintf((char *)s->health.query, sizeof(s->health.query),
                         "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nUser-Agent: bigbrother\r\n"
                         "Connection: close\r\n\r\n",
                         path, s->health.port);
        s->health.query_len = (size_t)n; /* fits: path <= BB_HTTP_PATH_MAX */
    }
    if (s->health.type == BB_H_EXEC && sd_jv_str(v, h, "command", 1, 4096, &s->health.command))
        return -1;
    return 0;
}

/* Reads the restart object r (NULL: all defaults; the path is at it) into s->restart. */
static int parse_restart(sd_jv_t *v, const json_t *r, bb_service_t *s)
{
    static const char *const keys[] = {"policy", "backoff_min_ms", "backoff_max_ms",
                                       "max_restarts", "window_s", "healthy_reset_ms", NULL};
    /* in the order of enum bb_policy */
    static const char *const policies[] = {"always", "on-failure", "never", NULL};
    int pol = BB_P_ALWAYS;
    if (r && (sd_jv_only_keys(v, r, keys) || sd_jv_enum(v, r, "policy", 0, policies, &pol) < 0))
        return -1;
    s->restart.policy = (enum bb_policy)pol;
    s->restart.backoff_min_ms = 100;
    s->restart.backoff_max_ms = 30000;
    if (sd_jv_i32(v, r, "backoff_min_ms", 0, 0, 3600000, &s->restart.backoff_min_ms) < 0 ||
        sd_jv_i32(v, r, "backoff_max_ms", 0, 0, 3600000, &s->restart.backoff_max_ms) < 0)
        return -1;
    if (s->restart.backoff_max_ms < s->restart.backoff_min_ms)
        return sd_jv_fail(v, "backoff_max_ms", "must be >= backoff_min_ms (%d)",
                          s->restart.backoff_min_ms);
    s->restart.max_restarts = 5;
    s->restart.window_s = 60;
    s->restart.healthy_reset_ms = 10000;
    if (sd_jv_i32(v, r, "max_restarts", 0, 1, BB_WINDOW_MAX, &s->restart.max_restarts) < 0 ||
        sd_jv_i32(v, r, "window_s", 0, 1, 86400, &s->restart.window_s) < 0 ||
        sd_jv_i32(v, r, "healthy_reset_ms", 0, 0, 86400000, &s->restart.healthy_reset_ms) < 0)
        return -1;
    return 0;
}

/* Reads the stop object st (NULL: all defaults; the path is at it) into s->stop. */
static int parse_stop(sd_jv_t *v, const json_t *st, bb_service_t *s)
{
    static const char *const keys[] = {"signal", "grace_ms", "hang_signal", NULL};
    static const char *const sigkeys[] = {"signal", "hang_signal"};
    int *sigs[] = {&s->stop.signal, &s->stop.hang_signal};
    if (st && sd_jv_only_keys(v, st, keys))
        return -1;
    s->stop.signal = SIGTERM;
    s->stop.hang_signal = SIGABRT;
    for (size_t i = 0; i < SD_ARRAY_LEN(sigkeys); i++) {
        const char *name = NULL;
        if (sd_jv_str(v, st, sigkeys[i], 0, 16, &name) < 0)
            return -1;
        if (name && (*sigs[i] = bb_signal_parse(name)) < 0)
            return sd_jv_fail(v, sigkeys[i],
                              "'%s' is not a signal (use a name like TERM, ABRT, KILL or a "
                              "number)",
                              name);
    }
    s->stop.grace_ms = 5000;
    return sd_jv_i32(v, st, "grace_ms", 0, 0, 3600000, &s->stop.grace_ms) < 0 ? -1 : 0;
}

/* Reads the rlimits object rl (the path is at it) into s->rlimits. */
static int parse_rlimits(sd_jv_t *v, const json_t *rl, bb_service_t *s)
{
    static const struct {
        const char *name;
        int res;
    } names[] = {{"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE},   {"nproc", RLIMIT_NPROC},
                 {"as", RLIMIT_AS},         {"stack", RLIMIT_STACK}, {"cpu", RLIMIT_CPU},
                 {"fsize", RLIMIT_FSIZE},   {"memlock", RLIMIT_MEMLOCK}};
    const char *k;
    json_t *j;
    json_object_foreach((json_t *)rl, k, j) {
        size_t i = 0;
        while (i < SD_ARRAY_LEN(names) && strcmp(k, names[i].name))
            i++;
        if (i == SD_ARRAY_LEN(names))
            return sd_jv_fail(v, k,
                              "unknown limit (nofile, core, nproc, as, stack, cpu, fsize, "
                              "memlock)");
        rlim_t val;
        if (json_is_string(j) && !strcmp(json_string_value(j), "unlimited"))
            val = RLIM_INFINITY;
        else if (json_is_integer(j) && json_integer_value(j) >= 0)
            val = (rlim_t)json_integer_value(j);
        else
            return sd_jv_fail(v, k, "must be an integer >= 0 or \"unlimited\"");
        bb_rlimit_t *r = &s->rlimits[s->nrlimits++];
        r->resource = names[i].res;
        r->lim.rlim_cur = r->lim.rlim_max = val;
    }
    return 0;
}

/* Reads the env object o (the path is at it) into s->env, a new NULL-terminated array of
 * "NAME=value" strings that bb_config_free frees. */
static int parse_env(sd_jv_t *v, const json_t *o, bb_service_t *s)
{
    s->env = calloc((o ? json_object_size(o) : 0) + 1, sizeof(char *));
    if (!s->env)
        return sd_jv_fail(v, NULL, "out of memory");
    const char *k;
    json_t *j;
    size_t n = 0;
    json_object_foreach((json_t *)o, k, j) {
        if (!k[0] || strchr(k, '=') || !json_is_string(j))
            return sd_jv_fail(v, k, "must be a string, with a name without '='");
        if (!strncmp(k, "BB_", 3) || !strcmp(k, "NOTIFY_SOCKET") || !strcmp(k, "WATCHDOG_USEC"))
            return sd_jv_fail(v, k, "is set by bigbrother and cannot be overridden");
        if (asprintf(&s->env[n], "%s=%s", k, json_string_value(j)) < 0)
            return sd_jv_fail(v, k, "out of memory");
        n++;
    }
    return 0;
}

/* Reads services[i] (the path is at it) into s; strings point into the parsed config. */
static int parse_service(sd_jv_t *v, const json_t *js, bb_service_t *s)
{
    static const char *const keys[] = {"name", "command", "args", "env", "count", "user",
                                       "cwd", "rlimits", "health", "restart", "stop", "pool",
                                       "on_release", "confirm_timeout_ms", NULL};
    static const char *const on_release[] = {"recycle", "restart", NULL};
    json_t *o = NULL;
    if (!json_is_object(js))
        return sd_jv_fail(v, NULL, "must be an object");
    if (sd_jv_only_keys(v, js, keys) || sd_jv_name(v, js, "name", 1, &s->name) ||
        sd_jv_str(v, js, "command", 1, 4096, &s->command))
        return -1;
    if (s->command[0] != '/')
        return sd_jv_fail(v, "command", "must be an absolute path");
    if (access(s->command, X_OK))
        return sd_jv_fail(v, "command", "'%s' is not executable: %s", s->command,
                          strerror(errno));
    json_t *args = NULL;
    if (sd_jv_array(v, js, "args", SD_JV_NONNULL, 256, &args) < 0)
        return -1;
    size_t nargs = args ? json_array_size(args) : 0;
    s->argv = calloc(nargs + 2, sizeof(char *));
    if (!s->argv)
        return sd_jv_fail(v, NULL, "out of memory");
    s->argv[0] = (char *)s->command;
    for (size_t i = 0; i < nargs; i++) {
        json_t *a = json_array_get(args, i);
        if (!json_is_string(a)) {
            sd_jv_key(v, "args");
            sd_jv_index(v, i);
            return sd_jv_fail(v, NULL, "must be a string");
        }
        s->argv[i + 1] = (char *)json_string_value(a);
    }
    int rc = sd_jv_object(v, js, "env", 0, &o);
    size_t mark = sd_jv_key(v, "env");
    if (rc < 0 || parse_env(v, rc == 0 ? o : NULL, s))
        return -1;
    sd_jv_pop(v, mark);
    s->count = 1;
    if (sd_jv_i32(v, js, "count", 0, 0, 10000, &s->count) < 0 ||
        sd_jv_str(v, js, "user", 0, 64, &s->user) < 0 ||
        sd_jv_str(v, js, "cwd", 0, 4096, &s->cwd) < 0)
        return -1;
    if (s->user) {
        struct passwd *pw = getpwnam(s->user);
        if (!pw)
            return sd_jv_fail(v, "user", "no such user '%s'", s->user);
        s->uid = pw->pw_uid;
        s->gid = pw->pw_gid;
        if (geteuid() != 0 && s->uid != geteuid())
            return sd_jv_fail(v, "user", "running as user '%s' needs bigbrother to run as root",
                              s->user);
    }
    if (s->cwd && s->cwd[0] != '/')
        return sd_jv_fail(v, "cwd", "must be an absolute path");
    /* pool and confirm_timeout_ms are ServerDir's and the primary's (docs/allocation.md):
     * only their shape is checked here */
    int release = 0, confirm_ms = 0;
    if (sd_jv_enum(v, js, "on_release", 0, on_release, &release) < 0 ||
        sd_jv_object(v, js, "pool", 0, &o) < 0 ||
        sd_jv_i32(v, js, "confirm_timeout_ms", 0, 100, 600000, &confirm_ms) < 0)
        return -1;
    s->restart_on_release = release == 1;
    /* The sub-objects; each parser but rlimits' also sets the defaults of an absent one. */
    static const struct {
        const char *key;
        int required, when_absent;
        int (*parse)(sd_jv_t *v, const json_t *o, bb_service_t *s);
    } parts[] = {
        {"rlimits", 0, 0, parse_rlimits},
        {"health", 1, 1, parse_health},
        {"restart", 0, 1, parse_restart},
        {"stop", 0, 1, parse_stop},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(parts); i++) {
        o = NULL;
        if ((rc = sd_jv_object(v, js, parts[i].key, parts[i].required, &o)) < 0)
            return -1;
        mark = sd_jv_key(v, parts[i].key);
        if ((rc == 0 || parts[i].when_absent) && parts[i].parse(v, o, s))
            return -1;
        sd_jv_pop(v, mark);
    }
    return 0;
}

/* Sets out to root[key], or to state_dir/def when absent; fails when it does not fit. */
static int sock_path(sd_jv_t *v, const json_t *root, const char *key, const char *state_dir,
                     const char *def, char *out)
{
    const char *val = NULL;
    int rc = sd_jv_str(v, root, key, 0, 4096, &val);
    if (rc < 0)
        return -1;
    int n = rc == 1 ? snprintf(out, BB_SOCK_PATH_MAX, "%s/%s", state_dir, def)
                    : snprintf(out, BB_SOCK_PATH_MAX, "%s", val);
    if (n >= BB_SOCK_PATH_MAX)
        return sd_jv_fail(v, key, "socket path '%s%s%s' is longer than %d bytes",
                          rc == 1 ? state_dir : val, rc == 1 ? "/" : "", rc == 1 ? def : "",
                          BB_SOCK_PATH_MAX - 1);
    return 0;
}

/* Reads the serverdir object o (the path is at it): the token, the instance credentials'
 * switch and renewal point, and the urls joined with ',' into cfg->urls (malloc'd, freed
 * by bb_config_free). */
static int parse_serverdir(sd_jv_t *v, const json_t *o, bb_config_t *cfg)
{
    static const char *const keys[] = {"urls", "token", "credentials", "credential_renew_percent",
                                       NULL};
    cfg->credentials = 1;
    cfg->credential_renew_percent = 33;
    if (sd_jv_only_keys(v, o, keys) || sd_jv_str(v, o, "token", 0, 256, &cfg->token) < 0 ||
        sd_jv_bool(v, o, "credentials", 0, &cfg->credentials) < 0 ||
        sd_jv_i32(v, o, "credential_renew_percent", 0, 10, 90, &cfg->credential_renew_percent) < 0)
        return -1;
    json_t *urls = json_object_get(o, "urls");
    if (!json_is_array(urls) || json_array_size(urls) < 1 || json_array_size(urls) > 16)
        return sd_jv_fail(v, "urls", "must be an array of 1 to 16 URLs");
    sd_buf_t b;
    sd_buf_init(&b, 8192);
    for (size_t i = 0; i < json_array_size(urls); i++) {
        json_t *u = json_array_get(urls, i);
        const char *s = json_is_string(u) ? json_string_value(u) : "";
        if (strncmp(s, "http://", 7) && strncmp(s, "https://", 8)) {
            sd_buf_free(&b);
            sd_jv_key(v, "urls");
            sd_jv_index(v, i);
            return sd_jv_fail(v, NULL, "must be a string starting with http:// or https://");
        }
        if (strchr(s, ',') || sd_buf_printf(&b, "%s%s", i ? "," : "", s)) {
            sd_buf_free(&b);
            return sd_jv_fail(v, "urls", "URLs must not contain ',' and fit in 8 KB");
        }
    }
    cfg->urls = b.data;
    return 0;
}

/* Reads the whole config cfg->root into cfg. */
static int parse_root(sd_jv_t *v, bb_config_t *cfg)
{
    static const char *const keys[] = {
        "machine", "cluster", "serverdir", "state_dir", "agent_socket", "notify_socket",
        "control_socket", "log_max_bytes", "log_keep", "log_runs", "services", "address",
        "labels", "capacity", "lease_ttl_ms", "metrics_listen", "logs_listen", "mode",
        "primary_ttl_ms", "placement_interval_ms", "assignment_wait_ms", NULL};
    static const char *const modes[] = {"standalone", "cluster", NULL};
    json_t *root = cfg->root, *o = NULL;
    if (!json_is_object(root))
        return sd_jv_fail(v, NULL, "must be a JSON object");
    if (sd_jv_only_keys(v, root, keys) || sd_jv_name(v, root, "machine", 1, &cfg->machine) ||
        sd_jv_name(v, root, "cluster", 1, &cfg->cluster) ||
        sd_jv_str(v, root, "state_dir", 1, 200, &cfg->state_dir) ||
        sd_jv_str(v, root, "address", 0, 256, &cfg->address) < 0)
        return -1;
    if (cfg->state_dir[0] != '/')
        return sd_jv_fail(v, "state_dir", "must be an absolute path");
    const char *ml = NULL;
    if (sd_jv_str(v, root, "metrics_listen", 0, 127, &ml) < 0)
        return -1;
    if (ml && (sd_parse_hostport(ml, cfg->metrics_host, sizeof(cfg->metrics_host),
                                 &cfg->metrics_port) ||
               !cfg->metrics_host[0] || cfg->metrics_port <= 0))
        return sd_jv_fail(v, "metrics_listen", "must be HOST:PORT (an IP address and a port)");
    const char *ll = NULL;
    if (sd_jv_str(v, root, "logs_listen", 0, 127, &ll) < 0)
        return -1;
    if (ll && (sd_parse_hostport(ll, cfg->logs_host, sizeof(cfg->logs_host), &cfg->logs_port) ||
               !cfg->logs_host[0] || cfg->logs_port <= 0))
        return sd_jv_fail(v, "logs_listen", "must be HOST:PORT (an IP address and a port)");
    int rc = sd_jv_object(v, root, "serverdir", 0, &o);
    if (rc < 0)
        return -1;
    size_t mark = sd_jv_key(v, "serverdir");
    if (rc == 0 && parse_serverdir(v, o, cfg))
        return -1;
    sd_jv_pop(v, mark);
    rc = sd_jv_object(v, root, "labels", 0, &cfg->labels);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        const char *k;
        json_t *j;
        json_object_foreach(cfg->labels, k, j) {
            if (!json_is_string(j)) {
                sd_jv_key(v, "labels");
                return sd_jv_fail(v, k, "must be a string");
            }
        }
    }
    int mode = 0;
    if (sd_jv_enum(v, root, "mode", 0, modes, &mode) < 0)
        return -1;
    cfg->cluster_mode = mode == 1;
    if (cfg->cluster_mode && !cfg->urls)
        return sd_jv_fail(v, "mode", "cluster mode needs serverdir.urls");
    /* in cluster mode the capacity also sizes the slot table: default 1000 */
    cfg->capacity = cfg->cluster_mode ? 1000 : 0;
    if (sd_jv_i32(v, root, "capacity", 0, 0, 1000000, &cfg->capacity) < 0)
        return -1;
    if (cfg->cluster_mode && cfg->capacity == 0)
        return sd_jv_fail(v, "capacity", "must be at least 1 in cluster mode");
    cfg->lease_ttl_ms = 15000;
    cfg->primary_ttl_ms = 10000;
    cfg->placement_interval_ms = 1000;
    cfg->assignment_wait_ms = 10000;
    cfg->log_max_bytes = 10 << 20;
    cfg->log_keep = 3;
    cfg->log_runs = 5;
    if (sd_jv_i32(v, root, "lease_ttl_ms", 0, 1000, 300000, &cfg->lease_ttl_ms) < 0 ||
        sd_jv_i32(v, root, "primary_ttl_ms", 0, 1000, 300000, &cfg->primary_ttl_ms) < 0 ||
        sd_jv_i32(v, root, "placement_interval_ms", 0, 100, 60000,
                  &cfg->placement_interval_ms) < 0 ||
        sd_jv_i32(v, root, "assignment_wait_ms", 0, 500, 60000, &cfg->assignment_wait_ms) < 0 ||
        sd_jv_int(v, root, "log_max_bytes", 0, 4096, (int64_t)1 << 40, &cfg->log_max_bytes) < 0 ||
        sd_jv_i32(v, root, "log_keep", 0, 0, 100, &cfg->log_keep) < 0 ||
        sd_jv_i32(v, root, "log_runs", 0, 1, 1000, &cfg->log_runs) < 0)
        return -1;
    if (sock_path(v, root, "agent_socket", cfg->state_dir, "agent.sock", cfg->agent_socket) ||
        sock_path(v, root, "notify_socket", cfg->state_dir, "notify.sock",
                  cfg->notify_socket) ||
        sock_path(v, root, "control_socket", cfg->state_dir, "control.sock",
                  cfg->control_socket))
        return -1;
    json_t *svcs = NULL;
    if (sd_jv_array(v, root, "services", SD_JV_NONNULL, 1000, &svcs) < 0)
        return -1;
    size_t n = svcs ? json_array_size(svcs) : 0;
    cfg->services = calloc(n ? n : 1, sizeof(bb_service_t));
    if (!cfg->services)
        return sd_jv_fail(v, "services", "out of memory");
    sd_jv_key(v, "services");
    for (size_t i = 0; i < n; i++) {
        cfg->nservices = (int)i + 1;
        mark = sd_jv_index(v, i);
        if (parse_service(v, json_array_get(svcs, i), &cfg->services[i]))
            return -1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(cfg->services[j].name, cfg->services[i].name))
                return sd_jv_fail(v, "name", "'%s' is already the name of services[%zu]",
                                  cfg->services[i].name, j);
        sd_jv_pop(v, mark);
    }
    return 0;
}

int bb_config_parse(const char *text, const char *name, bb_config_t *cfg, char *err,
                    size_t errcap)
{
    sd_jv_t v;
    char why[256];
    memset(cfg, 0, sizeof(*cfg));
    cfg->path = name;
    cfg->root = sd_json_parse(text, strlen(text), SD_JSON_MAX_DEPTH, why, sizeof(why));
    if (!cfg->root) {
        snprintf(err, errcap, "%s: %s", name, why);
        return -1;
    }
    sd_jv_init_file(&v, name, err, errcap);
    if (parse_root(&v, cfg)) {
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
