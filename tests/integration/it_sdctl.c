/* The built sdctl against a live serverdir: `machines`, `ps`, `events` and `describe` print tables
 * that hold the rows, `-o json` parses, and the exit codes mean what sdctl --help says
 * (0 ok, 2 usage, 3 unreachable, 4 not found, 6 not authorized). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>

#include "harness.h"
#include "harness_stack.h"
#include "harness_bigbrother.h"
#include "harness_sdctl.h"
#include "sdclient.h"

static h_redis_t redis;
static h_serverdir_t sd;
static char bb_logs_url[64]; /* the logs port of the bigbrother of the crash report test */

static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd, NULL))
        return -1;
    const char *events =
        "{\"events\":["
        "{\"id\":\"e1\",\"type\":\"started\",\"instance\":\"zone-m1-1\",\"machine\":\"m1\","
        "\"service\":\"zone\",\"pid\":4242,\"generation\":1,\"restarts\":0,"
        "\"ports\":{\"game\":27960}},"
        "{\"id\":\"e2\",\"type\":\"ready\",\"instance\":\"zone-m1-1\",\"machine\":\"m1\","
        "\"service\":\"zone\"},"
        "{\"id\":\"e3\",\"type\":\"started\",\"instance\":\"lobby-m2-1\",\"machine\":\"m2\","
        "\"service\":\"lobby\",\"pid\":5151},"
        "{\"id\":\"e4\",\"type\":\"stopped\",\"instance\":\"zone-m2-9\",\"machine\":\"m2\","
        "\"service\":\"zone\",\"reason\":\"killed\",\"signal\":9}]}";
    h_resp_t r;
    if (h_http_json("POST", sd.url, H_TOK_BB, events, &r, "/v1/clusters/prod/events") ||
        r.status != 200)
        return -1;
    h_resp_free(&r);
    if (h_http_json("PUT", sd.url, H_TOK_BB,
                    "{\"address\":\"10.1.2.3\",\"capacity\":64,\"labels\":{\"zone\":\"eu\"},"
                    "\"ttl_ms\":300000}", &r, /* live for the whole test: a lost m1 stops zone-m1-1 */
                    "/v1/clusters/prod/machines/m1") ||
        r.status != 200)
        return -1;
    h_resp_free(&r);
    return 0;
}

/* Runs sdctl with args (NULL-terminated) against url with token; returns its exit code
 * and fills out with what it printed (stdout then stderr, NUL-terminated). */
static int sdctl(const char *url, const char *token, char *out, size_t cap, ...)
{
    char env_url[256], env_tok[128];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", url);
    snprintf(env_tok, sizeof env_tok, "SERVERDIR_TOKEN=%s", token ? token : "");
    const char *env[] = {env_url, env_tok, "SERVERDIR_CLUSTER=prod", "NO_COLOR=1", NULL};
    va_list ap;
    va_start(ap, cap);
    int rc = h_sdctl_vrun(env, 15000, out, cap, ap);
    va_end(ap);
    return rc;
}

static void machines_table_and_json(void **state)
{
    char out[8192], line[512];
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "machines", NULL), 0);
    assert_non_null(strstr(out, "MACHINE"));
    assert_non_null(h_line_with(out, "m1", line, sizeof line));
    assert_non_null(strstr(line, "live"));
    assert_non_null(strstr(line, "10.1.2.3"));
    assert_non_null(strstr(line, "64"));
    assert_non_null(strstr(line, "zone=eu"));

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "-o", "json", "machines", NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    json_t *m = json_array_get(json_object_get(j, "machines"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "machine")), "m1");
    assert_string_equal(json_string_value(json_object_get(m, "state")), "live");
    json_decref(j);

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "machines", "m9", NULL), 4);
    assert_non_null(strstr(out, "404 not_found"));

    /* a lost machine says since when: "lost 1s ago" */
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_BB, "{\"ttl_ms\":1000}", &r,
                                 "/v1/clusters/prod/machines/m-gone"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    h_sleep_ms(2100);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "machines", NULL), 0);
    assert_non_null(h_line_with(out, "m-gone", line, sizeof line));
    assert_non_null(strstr(line, "lost "));
    assert_non_null(strstr(line, "s ago")); /* lost 1s ago, a few under load */
}

static void ps_table_filters_and_json(void **state)
{
    char out[8192], line[512];
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", NULL), 0);
    assert_non_null(strstr(out, "RESTARTS"));
    assert_non_null(h_line_with(out, "zone-m1-1", line, sizeof line));
    assert_non_null(strstr(line, "ready"));
    assert_non_null(strstr(line, "4242"));
    assert_non_null(strstr(line, "game=27960"));
    assert_non_null(h_line_with(out, "lobby-m2-1", line, sizeof line));
    assert_non_null(strstr(line, "starting"));
    assert_null(strstr(out, "zone-m2-9"));

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--machine", "m2", NULL), 0);
    assert_non_null(strstr(out, "lobby-m2-1"));
    assert_null(strstr(out, "zone-m1-1"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--service", "zone", NULL), 0);
    assert_non_null(strstr(out, "zone-m1-1"));
    assert_null(strstr(out, "lobby-m2-1"));

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--state", "stopped", NULL), 0);
    assert_non_null(h_line_with(out, "zone-m2-9", line, sizeof line));
    assert_non_null(strstr(line, "killed(signal 9)"));

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "-o", "json", "ps", NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_array_size(json_object_get(j, "processes")), 2);
    json_decref(j);

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "-o", "json", "ps", "zone-m1-1", NULL), 0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "pid")), 4242);
    json_decref(j);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "nobody", NULL), 4);
}

static void events_table_since_and_json(void **state)
{
    char out[8192], line[512];
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "events", NULL), 0);
    assert_non_null(h_line_with(out, "zone-m2-9", line, sizeof line));
    assert_non_null(strstr(line, "stopped"));
    assert_non_null(strstr(line, "killed(signal 9)"));
    assert_non_null(h_line_with(out, "lobby-m2-1", line, sizeof line));
    assert_non_null(strstr(line, "pid 5151"));
    /* Newest last. */
    assert_true(strstr(out, "zone-m2-9") > strstr(out, "lobby-m2-1"));

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "-o", "json", "events",
                           "--limit", "2", NULL),
                     0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    json_t *evs = json_object_get(j, "events");
    assert_int_equal(json_array_size(evs), 2);
    char first[64];
    snprintf(first, sizeof first, "%s", json_string_value(json_object_get(json_array_get(evs, 0), "seq")));
    json_decref(j);

    /* After the third-newest's successor: exactly the last one. */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "-o", "json", "events",
                           "--since", first, NULL),
                     0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    evs = json_object_get(j, "events");
    assert_int_equal(json_array_size(evs), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(evs, 0), "id")), "e4");
    json_decref(j);
}

struct file_has {
    const char *path, *needle;
};

static int file_has(void *arg)
{
    struct file_has *w = arg;
    char buf[8192];
    FILE *f = fopen(w->path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, w->needle) != NULL;
}

/* sdctl events -f prints the history, then new events as they arrive, until stopped. */
static void events_follow_prints_new_events(void **state)
{
    char env_url[256], logpath[300];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    snprintf(logpath, sizeof logpath, "%s/follow.out", h_tmpdir());
    const char *env[] = {env_url, "SERVERDIR_TOKEN=" H_TOK_VIEWER, "SERVERDIR_CLUSTER=prod", NULL};
    const char *argv[] = {SD_BIN_DIR "/sdctl", "events", "-f", NULL};
    pid_t pid = h_spawn(argv, logpath, env);
    struct file_has w = {logpath, "zone-m2-9"};
    assert_true(h_wait_until(file_has, &w, 5000));

    h_resp_t r;
    assert_int_equal(h_http_json("POST", sd.url, H_TOK_BB,
                                 "{\"events\":[{\"id\":\"f1\",\"type\":\"started\","
                                 "\"instance\":\"late-arrival\",\"machine\":\"m3\","
                                 "\"service\":\"zone\",\"pid\":6161}]}",
                                 &r, "/v1/clusters/prod/events"),
                     0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    w.needle = "late-arrival";
    assert_true(h_wait_until(file_has, &w, 5000));
    assert_false(h_exited(pid, NULL));
    h_stop(pid, 1000);
}

/* h_wait_until condition: `sdctl describe zone-m1-1` shows its master-list entry (the
 * copy's index follows Redis within a second). */
static int describe_shows_master(void *arg)
{
    char *out = arg;
    return sdctl(sd.url, H_TOK_VIEWER, out, 8192, "describe", "zone-m1-1", NULL) == 0 &&
           strstr(out, "Master list:  127.0.0.1:27960 \"EU 1\"");
}

/* sdctl describe: an instance with its record, timeline, locks and
 * master-list entry; a stopped one with its reason; a static service and a machine with
 * their instances; not found, usage and the global options after the command. */
static void describe_instance_service_machine(void **state)
{
    char out[8192], line[512];
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_GAME, "{\"holder\":\"zone-m1-1\"}", &r,
                                 "/v1/locks/describe-p1"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    /* naming its instance links the entry only with that instance's credential or an ops
     * token (docs/master.md, "Supervised servers") */
    sdc_t *c = sdc_new(sd.url, H_TOK_OPS, h_ms(5000));
    sdc_master_server_t srv = {.port = 27960, .game = "DescribeGame", .name = "EU 1", .map = "dm1",
                               .players = 3, .max_players = 16, .protocol = -1, .gametype = -1,
                               .cluster = "prod", .instance = "zone-m1-1"};
    sdc_err_t err = {0};
    assert_int_equal(sdc_master_announce(c, &srv, NULL, &err), SDC_OK);
    sdc_free(c);
    assert_true(h_wait_until(describe_shows_master, out, 5000));
    assert_non_null(strstr(out, "3/16 players"));
    assert_non_null(h_line_with(out, "State:", line, sizeof line));
    assert_non_null(strstr(line, "ready (for "));
    assert_non_null(h_line_with(out, "PID:", line, sizeof line));
    assert_non_null(strstr(line, "4242"));
    assert_non_null(h_line_with(out, "Ports:", line, sizeof line));
    assert_non_null(strstr(line, "game=27960"));
    assert_non_null(h_line_with(out, "Restarts:", line, sizeof line));
    assert_string_equal(line, "Restarts:     0");
    assert_non_null(h_line_with(out, "Generation:", line, sizeof line));
    assert_string_equal(line, "Generation:   1");
    const char *tl = strstr(out, "\n  ready       "); /* the timeline's line */
    assert_non_null(tl);
    assert_non_null(h_line_with(tl + 1, "ready", line, sizeof line));
    assert_non_null(strstr(line, " ago)"));
    assert_non_null(strstr(out, "Locks held:   1"));
    assert_non_null(h_line_with(out, "describe-p1", line, sizeof line));
    assert_non_null(strstr(line, "never"));

    /* GET /v1/master/servers/{addr}: the one entry; unlisted 404; not an address 400 */
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/v1/master/servers/127.0.0.1:27960"), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"name\":\"EU 1\""));
    h_resp_free(&r);
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/v1/master/servers/127.0.0.1:27961"), 0);
    assert_int_equal(r.status, 404);
    assert_string_equal(h_err_code(&r), "not_listed");
    h_resp_free(&r);
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/v1/master/servers/nowhere"), 0);
    assert_int_equal(r.status, 400);
    assert_string_equal(h_err_code(&r), "bad_address");
    h_resp_free(&r);

    /* -o json after the command: the raw answers */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "instance",
                           "zone-m1-1", "-o", "json", NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "kind")), "instance");
    assert_int_equal(json_array_size(json_object_get(j, "locks")), 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "master"), "address")),
                        "127.0.0.1:27960");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "process"),
                                                          "master_address")),
                        "127.0.0.1:27960");
    json_decref(j);

    /* a stopped instance: its reason, nothing held, not listed */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "zone-m2-9", NULL), 0);
    assert_non_null(h_line_with(out, "Reason:", line, sizeof line));
    assert_non_null(strstr(line, "killed(signal 9)"));
    assert_non_null(strstr(out, "Locks held:   0"));
    assert_non_null(strstr(out, "Master list:  not listed"));

    /* a service that is no desired service but runs instances: a static one */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "zone", NULL), 0);
    assert_non_null(strstr(out, "a static service"));
    assert_non_null(h_line_with(out, "zone-m1-1", line, sizeof line));
    assert_non_null(strstr(line, "ready"));
    assert_non_null(h_line_with(out, "zone-m2-9", line, sizeof line));
    assert_non_null(strstr(line, "killed(signal 9)"));
    assert_null(strstr(out, "lobby-m2-1"));

    /* a machine: its lease and its instances; --no-headers anywhere */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "m1", NULL), 0);
    assert_non_null(h_line_with(out, "Address:", line, sizeof line));
    assert_non_null(strstr(line, "10.1.2.3"));
    assert_non_null(strstr(out, "zone=eu"));
    assert_non_null(strstr(out, "INSTANCE"));
    assert_non_null(h_line_with(out, "zone-m1-1", line, sizeof line));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "machine", "m1",
                           "--no-headers", NULL), 0);
    assert_null(strstr(out, "INSTANCE"));
    assert_non_null(strstr(out, "zone-m1-1"));

    /* not found: 4, naming what was looked for; a wrong kind or no name: 2 */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "nothing", NULL), 4);
    assert_non_null(strstr(out, "no instance, service or machine 'nothing' in cluster 'prod'"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "machine", "m9", NULL), 4);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "pod", "x", NULL), 2);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", NULL), 2);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "a b", NULL), 2);
    /* sdctl locks: every held lock with its holder and human durations; --limit */
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_GAME,
                                 "{\"holder\":\"lobby-m2-1\",\"ttl_ms\":600000}", &r,
                                 "/v1/locks/describe-p2"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "locks", NULL), 0);
    assert_non_null(strstr(out, "HOLDER"));
    assert_non_null(h_line_with(out, "describe-p1", line, sizeof line));
    assert_non_null(strstr(line, "zone-m1-1"));
    assert_non_null(strstr(line, "never"));
    assert_non_null(h_line_with(out, "describe-p2", line, sizeof line));
    assert_non_null(strstr(line, "lobby-m2-1"));
    assert_non_null(strstr(line, "9m")); /* 10 min lease, a moment ago: 9m59s */
    assert_null(strstr(out, "SINCE_MS")); /* no raw epoch ms: HELD_FOR */
    assert_non_null(strstr(out, "HELD_FOR"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "locks", "list", "--limit", "1",
                           NULL), 0);
    assert_non_null(strstr(out, "describe-p"));
    assert_non_null(strstr(out, "the first 1 locks"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "locks", "--limit", "x", NULL), 2);

    /* --cluster after the command: the other cluster has none of it */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "m1", "--cluster",
                           "other", NULL), 4);

    /* bash completion of names (ctl/completion/sdctl.bash, sdctl __complete names):
     * `sdctl --url U --token T --cluster prod describe zo<TAB>` offers the instance */
    char script[2048], path_env[4200], cpath[300];
    snprintf(script, sizeof script,
             "source %s/ctl/completion/sdctl.bash; "
             "COMP_WORDS=(sdctl --url %s --token %s --cluster prod describe zo); "
             "COMP_CWORD=8; _sdctl; printf '%%s\\n' \"${COMPREPLY[@]}\"",
             SD_SOURCE_DIR, sd.url, H_TOK_VIEWER);
    snprintf(path_env, sizeof path_env, "PATH=%s:%s", SD_BIN_DIR, getenv("PATH"));
    snprintf(cpath, sizeof cpath, "%s/complete.out", h_tmpdir());
    const char *bash[] = {"/bin/bash", "-c", script, NULL};
    const char *benv[] = {path_env, NULL};
    int cst = h_wait_exit(h_spawn(bash, cpath, benv), 15000);
    assert_true(WIFEXITED(cst));
    struct file_has fh = {cpath, "zone-m1-1"};
    assert_true(file_has(&fh));
    fh.needle = "lobby";
    assert_false(file_has(&fh)); /* only what starts with zo */

    /* -o yaml: the same answers as -o json, in YAML (js-yaml reads them back equal),
     * for a list, a describe with nested objects, a crash-free record; -o wide: more
     * columns */
    static const char *const yq[][4] = {{"ps", NULL, NULL, NULL},
                                        {"describe", "zone-m1-1", NULL, NULL},
                                        {"clusters", NULL, NULL, NULL},
                                        {"services", NULL, NULL, NULL}};
    const char *td = h_tmpdir(); /* a new directory each call */
    for (size_t k = 0; k < sizeof yq / sizeof yq[0]; k++) {
        char yf[300], jf[300], out2[16384], cmd[1200];
        snprintf(yf, sizeof yf, "%s/out.yaml", td);
        snprintf(jf, sizeof jf, "%s/out.json", td);
        assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, yq[k][0], "-o", "yaml",
                               yq[k][1], NULL), 0);
        assert_int_equal(strncmp(out, "---\n", 4), 0);
        h_write_file(td, "out.yaml", out, 0644);
        assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out2, sizeof out2, yq[k][0], "-o", "json",
                               yq[k][1], NULL), 0);
        h_write_file(td, "out.json", out2, 0644);
        snprintf(cmd, sizeof cmd,
                 "NODE_PATH='%s/.npm-tools/node_modules' node '%s/tests/tools/yaml_equals_json.js' "
                 "'%s' '%s' 2>&1",
                 SD_SOURCE_DIR, SD_SOURCE_DIR, yf, jf);
        FILE *pp = popen(cmd, "r");
        assert_non_null(pp);
        char res[4200];
        res[fread(res, 1, sizeof res - 1, pp)] = '\0';
        int pst = pclose(pp);
        if (pst == -1 || !WIFEXITED(pst) || WEXITSTATUS(pst) != 0)
            fail_msg("sdctl %s -o yaml is not the JSON answer:\n%s\n%s", yq[k][0], res, out);
    }
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "-o", "wide", NULL), 0);
    assert_non_null(strstr(out, "TO_READY"));
    assert_non_null(h_line_with(out, "zone-m1-1", line, sizeof line));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "-o", "xml", NULL), 2);

    /* an unknown cluster (a typo) says so instead of printing an empty table */
    static const char *const lists[] = {"ps", "machines", "services", "status", NULL};
    for (const char *const *l = lists; *l; l++) {
        assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, *l, "--cluster", "prdo",
                               NULL), 4);
        assert_non_null(strstr(out, "cluster 'prdo' is unknown to ServerDir"));
        assert_non_null(strstr(out, "known: prod"));
    }
    /* static services (no desired spec, instances running) in services and status */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "services", NULL), 0);
    assert_non_null(h_line_with(out, "lobby", line, sizeof line));
    assert_non_null(strstr(line, "static (bigbrother config)"));
    assert_non_null(strstr(line, "1 running"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "status", NULL), 0);
    assert_non_null(h_line_with(out, "\nzone ", line, sizeof line));
    assert_non_null(strstr(line, "static"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "clusters", NULL), 0);
    assert_non_null(h_line_with(out, "prod", line, sizeof line));
    assert_non_null(strstr(line, "*"));
}

/* sdctl ps --watch=1 redraws: an instance started after it began shows up in a later
 * round; --watch on a command that changes things is a usage error. */
/* The number of times needle occurs in the file at path (0 when unreadable). */
static int count_in_file(const char *path, const char *needle)
{
    static char text[1 << 20];
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* --watch follows the cluster's events: with a 30 s ceiling, a new process shows within
 * a few seconds (the event history is read 4 times a second), under a header holding
 * the whole command line; a quiet cluster is not redrawn more than the ceiling asks. */
static void ps_watch_redraws(void **state)
{
    char env_url[256], logpath[300], out[4096];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    snprintf(logpath, sizeof logpath, "%s/watch.out", h_tmpdir());
    const char *env[] = {env_url, "SERVERDIR_TOKEN=" H_TOK_VIEWER, "SERVERDIR_CLUSTER=prod", NULL};
    const char *argv[] = {SD_BIN_DIR "/sdctl", "ps", "--service", "zone", "--watch=30", NULL};
    pid_t pid = h_spawn(argv, logpath, env);
    struct file_has w = {logpath, "zone-m1-1"};
    assert_true(h_wait_until(file_has, &w, h_ms(5000)));
    h_sleep_ms(1000); /* quiet: still the one draw */
    assert_int_equal(count_in_file(logpath, "On change, at least every 30s: sdctl ps --service zone  "), 1);
    int64_t posted = h_now_ms();
    h_resp_t r;
    assert_int_equal(h_http_json("POST", sd.url, H_TOK_BB,
                                 "{\"events\":[{\"id\":\"w1\",\"type\":\"started\","
                                 "\"instance\":\"watch-arrival\",\"machine\":\"m3\","
                                 "\"service\":\"zone\",\"pid\":7171}]}",
                                 &r, "/v1/clusters/prod/events"),
                     0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    w.needle = "watch-arrival";
    assert_true(h_wait_until(file_has, &w, h_ms(5000)));
    print_message("drawn again %lld ms after the event\n", (long long)(h_now_ms() - posted));
    assert_true(h_now_ms() - posted < h_ms(5000)); /* not the 30 s ceiling */
    assert_int_equal(count_in_file(logpath, "sdctl ps --service zone  "), 2);
    assert_false(h_exited(pid, NULL));
    h_stop(pid, 1000);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "scale", "zone", "3",
                           "--watch", NULL), 2);
    assert_non_null(strstr(out, "--watch does not apply to scale"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--watch=0", NULL), 2);
}

/* ps --state stopped: the latest stop first, whatever the names; -o name: KIND/NAME a
 * line for the lists and for one record. */
static void ps_stopped_order_and_names(void **state)
{
    char out[8192];
    h_resp_t r;
    static const char *const stops[] = {"aa-stop-first", "zz-stop-second", "mm-stop-third"};
    for (int i = 0; i < 3; i++) {
        char body[300];
        snprintf(body, sizeof body,
                 "{\"events\":[{\"id\":\"order-%d\",\"type\":\"stopped\",\"instance\":\"%s\","
                 "\"machine\":\"m2\",\"service\":\"order\",\"reason\":\"exited\",\"code\":0}]}",
                 i, stops[i]);
        assert_int_equal(h_http_json("POST", sd.url, H_TOK_BB, body, &r,
                                     "/v1/clusters/prod/events"),
                         0);
        assert_int_equal(r.status, 200);
        h_resp_free(&r);
        h_sleep_ms(20); /* stopped_at_ms apart */
    }
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--state", "stopped",
                           "--service", "order", "--no-headers", NULL), 0);
    const char *third = strstr(out, "mm-stop-third"), *second = strstr(out, "zz-stop-second"),
               *first = strstr(out, "aa-stop-first");
    assert_true(third && second && first && third < second && second < first);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--state", "stopped",
                           "--service", "order", "-o", "name", NULL), 0);
    assert_string_equal(out, "instance/mm-stop-third\ninstance/zz-stop-second\n"
                             "instance/aa-stop-first\n");

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "-o", "name", NULL), 0);
    assert_non_null(strstr(out, "instance/zone-m1-1\n"));
    assert_non_null(strstr(out, "instance/lobby-m2-1\n"));
    assert_null(strstr(out, "INSTANCE"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "zone-m1-1", "-o", "name",
                           NULL), 0);
    assert_string_equal(out, "instance/zone-m1-1\n");
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "machines", "-o", "name", NULL), 0);
    assert_non_null(strstr(out, "machine/m1\n"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "services", "-o", "name", NULL), 0);
    assert_non_null(strstr(out, "service/zone\n"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "clusters", "-o", "name", NULL), 0);
    assert_non_null(strstr(out, "cluster/prod\n"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "events", "--limit", "2", "-o",
                           "name", NULL), 0);
    assert_int_equal(strncmp(out, "event/", 6), 0);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", "m1", "-o", "name",
                           NULL), 2);
    assert_non_null(strstr(out, "-o name applies to the list commands"));
}

/* h_wait_until condition: cluster c1 records a stopped instance of service crashy; its
 * id into arg (160 bytes). */
static int crashy_stopped(void *arg)
{
    h_resp_t r;
    if (h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                    "/v1/clusters/c1/processes?state=stopped&service=crashy") || r.status != 200) {
        h_resp_free(&r);
        return 0;
    }
    json_t *j = h_resp_json(&r);
    h_resp_free(&r);
    json_t *p = json_array_get(json_object_get(j, "processes"), 0);
    int ok = p != NULL;
    if (ok)
        snprintf(arg, 160, "%s", json_string_value(json_object_get(p, "instance")));
    json_decref(j);
    return ok;
}

/* The whole file at path (malloc'd, "" when unreadable). */
static char *read_all(const char *path)
{
    char *text = calloc(1, 1 << 20);
    FILE *f = fopen(path, "r");
    if (f) {
        text[fread(text, 1, (1 << 20) - 1, f)] = '\0';
        fclose(f);
    }
    return text;
}

static int64_t sd_wall_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 1 when text has lines and each starts with a UTC ISO 8601 time in ms and a space
 * ("2026-11-28T07:20:01.250Z "), none later than now_ms nor over a minute before it. */
static int all_stamped(const char *text, int64_t now_ms)
{
    int lines = 0;
    for (const char *p = text; *p; lines++) {
        struct tm tm = {0};
        int ms = -1, used = 0;
        if (sscanf(p, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms, &used) != 7 || used != 25 ||
            p[10] != 'T' || p[23] != 'Z') {
            print_message("not stamped: %.60s\n", p);
            return 0;
        }
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        int64_t at = (int64_t)timegm(&tm) * 1000 + ms;
        if (at > now_ms || at < now_ms - 60000) {
            print_message("stamp %lld not within the last minute of %lld\n", (long long)at,
                          (long long)now_ms);
            return 0;
        }
        const char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : p + strlen(p);
    }
    return lines > 0;
}

/* sdctl logs of a stopped instance (its log in b's state dir): --tail 0 prints none,
 * --timestamps puts a time before each line, --since leaves out a log last written
 * before it and keeps one written within it. */
static void logs_tail_since_timestamps(const bbt_t *b, const char *inst)
{
    char out[16384];
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--tail", "0",
                           "--cluster", "c1", NULL), 0);
    assert_string_equal(out, "");
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--tail", "-1",
                           "--cluster", "c1", NULL), 0);
    assert_non_null(strstr(out, "msg=crashing"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--tail", "2",
                           "--timestamps", "--cluster", "c1", NULL), 0);
    assert_true(all_stamped(out, sd_wall_ms_now()));
    assert_non_null(strstr(out, "msg=crashing"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--since", "1h",
                           "--cluster", "c1", NULL), 0);
    assert_non_null(strstr(out, "msg=crashing"));
    /* the log last written two hours ago: all of it older than 1h, not than 3h */
    char pattern[600];
    glob_t g;
    snprintf(pattern, sizeof pattern, "%s/logs/crashy-*/%s.log", b->state, inst);
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    struct timeval old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    assert_int_equal(utimes(g.gl_pathv[0], old), 0);
    globfree(&g);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--since", "1h",
                           "--cluster", "c1", NULL), 0);
    assert_string_equal(out, "");
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--since", "3h",
                           "--timestamps", "--cluster", "c1", NULL), 0);
    assert_non_null(strstr(out, "msg=crashing"));
    assert_false(all_stamped(out, sd_wall_ms_now())); /* stamped two hours back */
    assert_non_null(strstr(out, "msg=crashing"));
    /* the logs port checks its new parameters */
    h_resp_t lr;
    char u[300];
    static const char *const bad[] = {"since_ms=0", "since_ms=x", "since_ms=2592000001",
                                      "timestamps=2", "tail=-1", "tail=every"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(u, sizeof u, "%s/v1/logs/%s?%s", bb_logs_url, inst, bad[i]);
        assert_int_equal(h_http("GET", u, H_TOK_VIEWER, NULL, NULL, 0, NULL, &lr), 0);
        assert_int_equal(lr.status, 400);
        h_resp_free(&lr);
    }
}

/* A crashed instance's stopped event carries its crash report (the
 * last lines it wrote, from bigbrother's log of its run), the process record keeps it,
 * the event history does not (4 KiB each), and sdctl describe shows it. */
static void crash_report_in_the_record_and_describe(void **state)
{
    bbt_t b = {0};
    char extra[512], inst[160] = "", out[16384], line[512];
    int logs_port = h_free_port();
    snprintf(bb_logs_url, sizeof bb_logs_url, "http://127.0.0.1:%d", logs_port);
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"}, \"address\": "
             "\"127.0.0.1\", \"logs_listen\": \"127.0.0.1:%d\"",
             sd.url, H_TOK_BB, logs_port);
    char svc[2048];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"crashy\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\","
             " \"--crash-after\", \"0.3\", \"--exit-code\", \"3\"], \"count\": 1,"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000},"
             " \"restart\": {\"policy\": \"never\"}, \"cwd\": \"%s\"},"
             " {\"name\": \"steady\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\"],"
             " \"count\": 1, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000},"
             " \"stop\": {\"grace_ms\": 2000}, \"cwd\": \"%s\"},"
             /* bytes no JSON string may carry (an overlong UTF-8 sequence) in its output */
             " {\"name\": \"badbytes\", \"command\": \"/bin/sh\", \"args\": [\"-c\","
             " \"printf 'caf\\\\303\\\\251 \\\\300\\\\257 bad\\\\n'; exit 3\"], \"count\": 1,"
             " \"health\": {\"type\": \"none\"}, \"restart\": {\"policy\": \"never\"}}]",
             GAMEPROC, h_tmpdir(), GAMEPROC, h_tmpdir());
    bbt_config(&b, svc, extra);
    assert_true(bbt_start(&b) > 0);
    assert_true(h_wait_until(crashy_stopped, inst, h_valgrind() ? 30000 : 10000));

    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                                 "/v1/clusters/c1/processes/%s", inst), 0);
    json_t *p = h_resp_json(&r);
    h_resp_free(&r);
    assert_string_equal(json_string_value(json_object_get(p, "reason_text")), "exited(code 3)");
    const char *tail = json_string_value(json_object_get(p, "log_tail"));
    assert_non_null(tail);
    assert_non_null(strstr(tail, "msg=crashing how=exit code=3"));
    assert_null(strstr(tail, "=== bigbrother")); /* the run's output only */
    assert_true(strlen(tail) <= 4096);
    assert_true(json_is_null(json_object_get(p, "core"))); /* exit(3) dumps no core */
    json_decref(p);

    /* the history has the stop, without the tail */
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                                 "/v1/clusters/c1/events?limit=50"), 0);
    assert_non_null(strstr(r.body, "\"reason\":\"exited\""));
    assert_null(strstr(r.body, "log_tail"));
    h_resp_free(&r);

    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", inst, "--cluster",
                           "c1", NULL), 0);
    assert_non_null(h_line_with(out, "Reason:", line, sizeof line));
    assert_non_null(strstr(line, "exited(code 3)"));
    assert_non_null(strstr(out, "Last output:"));
    assert_non_null(h_line_with(out, "  | ", line, sizeof line));
    assert_non_null(strstr(out, "msg=crashing how=exit code=3"));

    /* output a JSON string cannot hold still gives a crash report, in ASCII */
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                                 "/v1/clusters/c1/processes?state=stopped&service=badbytes"), 0);
    json_t *bl = h_resp_json(&r);
    h_resp_free(&r);
    const char *bt = json_string_value(
        json_object_get(json_array_get(json_object_get(bl, "processes"), 0), "instance"));
    assert_non_null(bt);
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                                 "/v1/clusters/c1/processes/%s", bt), 0);
    json_decref(bl);
    json_t *bp = h_resp_json(&r);
    h_resp_free(&r);
    const char *btail = json_string_value(json_object_get(bp, "log_tail"));
    assert_non_null(btail);
    assert_non_null(strstr(btail, " bad"));
    for (const char *c = btail; *c; c++)
        assert_true((unsigned char)*c < 0x80);
    json_decref(bp);

    /* sdctl logs: the stopped instance's output from its machine's bigbrother
     * (logs_listen, registered as the lease's logs_port); -f on it just ends */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "--cluster",
                           "c1", NULL), 0);
    assert_non_null(strstr(out, "msg=crashing how=exit code=3"));
    assert_null(strstr(out, "=== bigbrother"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", inst, "-f",
                           "--tail", "1", "--cluster", "c1", NULL), 0);
    assert_non_null(strstr(out, "msg=crashing"));
    assert_null(strstr(out, "msg=ready")); /* --tail 1: the last line only */
    logs_tail_since_timestamps(&b, inst);

    /* a live one: -f prints its output as it comes and ends when it stops */
    json_t *st = bbt_wait(&b, "steady", 0, "ready", 1, h_valgrind() ? 30000 : 5000);
    assert_non_null(st);
    char live[160];
    snprintf(live, sizeof live, "%s", bbt_str(st, "instance"));
    json_decref(st);
    char env_url[256], fol[300];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    snprintf(fol, sizeof fol, "%s/logs-follow.out", h_tmpdir());
    const char *env[] = {env_url, "SERVERDIR_TOKEN=" H_TOK_VIEWER, "SERVERDIR_CLUSTER=c1", NULL};
    const char *argv[] = {SD_BIN_DIR "/sdctl", "logs", live, "-f", NULL};
    pid_t f = h_spawn(argv, fol, env);
    /* and one from now on only (--tail 0), each line after the time it was written */
    char fol0[300];
    snprintf(fol0, sizeof fol0, "%s/logs-follow-new.out", h_tmpdir());
    const char *argv0[] = {SD_BIN_DIR "/sdctl", "logs", live, "-f", "--tail", "0",
                           "--timestamps", NULL};
    pid_t f0 = h_spawn(argv0, fol0, env);
    struct file_has w = {fol, "msg=ready"};
    assert_true(h_wait_until(file_has, &w, h_valgrind() ? 30000 : 5000));
    /* f0 prints only what comes after it connected: give it time to connect before the
     * stop (under load it once came after the stop's lines) */
    h_sleep_ms(h_valgrind() ? 3000 : 1000);
    json_decref(bbt_ctl(&b, "stop steady"));
    int rc = h_wait_exit(f, h_valgrind() ? 60000 : 15000);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
    w.needle = "msg=stopped";
    assert_true(file_has(&w));
    rc = h_wait_exit(f0, h_valgrind() ? 60000 : 15000);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
    char *stamped = read_all(fol0);
    print_message("followed from now, stamped:\n%s", stamped);
    assert_non_null(strstr(stamped, "msg=stopped"));
    assert_true(all_stamped(stamped, sd_wall_ms_now()));
    free(stamped);

    /* the logs port asks ServerDir about the caller's token: none or a wrong one 401, a
     * game token 403, an instance of no machine here 404, a bad tail 400 */
    char u[256];
    snprintf(u, sizeof u, "http://127.0.0.1:%d/v1/logs/%s", logs_port, inst);
    h_resp_t lr;
    assert_int_equal(h_http("GET", u, NULL, NULL, NULL, 0, NULL, &lr), 0);
    assert_int_equal(lr.status, 401);
    h_resp_free(&lr);
    assert_int_equal(h_http("GET", u, "wrong-token-0000000000", NULL, NULL, 0, NULL, &lr), 0);
    assert_int_equal(lr.status, 401);
    h_resp_free(&lr);
    assert_int_equal(h_http("GET", u, H_TOK_GAME, NULL, NULL, 0, NULL, &lr), 0);
    assert_int_equal(lr.status, 403);
    h_resp_free(&lr);
    snprintf(u, sizeof u, "http://127.0.0.1:%d/v1/logs/zone-m1-1", logs_port); /* prod's */
    assert_int_equal(h_http("GET", u, H_TOK_VIEWER, NULL, NULL, 0, NULL, &lr), 0);
    assert_int_equal(lr.status, 404);
    h_resp_free(&lr);
    snprintf(u, sizeof u, "http://127.0.0.1:%d/v1/logs/%s?tail=x", logs_port, inst);
    assert_int_equal(h_http("GET", u, H_TOK_VIEWER, NULL, NULL, 0, NULL, &lr), 0);
    assert_int_equal(lr.status, 400);
    h_resp_free(&lr);
    /* sdctl logs of an instance whose machine serves no logs (prod's m1): 4, saying so */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "logs", "zone-m1-1", NULL), 4);
    assert_non_null(strstr(out, "does not serve logs"));
    bbt_stop(&b, 3000);
}

/* GET a bigbrother health URL with token: the status, and the JSON in *out on 200. */
static long health_get(const char *url, const char *token, json_t **out)
{
    h_resp_t r;
    assert_int_equal(h_http("GET", url, token, NULL, NULL, 0, NULL, &r), 0);
    long status = r.status;
    /* every answer, an error too, may be read by the dashboard's origin */
    assert_non_null(r.headers);
    assert_non_null(strstr(r.headers, "Access-Control-Allow-Origin: *"));
    if (out)
        *out = status == 200 ? h_resp_json(&r) : NULL;
    h_resp_free(&r);
    return status;
}

struct health_wait {
    char url[300];
    const char *field;
    long long at_least;
    const char *state; /* and, when set, this state */
};

static int health_reaches(void *arg)
{
    struct health_wait *w = arg;
    json_t *h = NULL;
    if (health_get(w->url, H_TOK_VIEWER, &h) != 200)
        return 0;
    const json_t *v = json_object_get(h, w->field);
    int ok = json_is_integer(v) && json_integer_value(v) >= w->at_least;
    if (w->state)
        ok = ok && !strcmp(json_string_value(json_object_get(h, "state")) ?: "", w->state);
    json_decref(h);
    return ok;
}

/* The health view (heartbeat age / probe failures per instance, what Consul shows per
 * check): bigbrother's logs port serves its health view, GET /v1/health[/{instance}],
 * checked by ServerDir like the logs and readable from the dashboard's origin (CORS);
 * sdctl describe prints it. */
static void health_view_and_cors(void **state)
{
    (void)state;
    bbt_t b = {0};
    char extra[512], svc[2048], out[16384], line[512];
    const char *dir = h_tmpdir();
    int logs_port = h_free_port();
    snprintf(extra, sizeof extra,
             ", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"}, \"address\": "
             "\"127.0.0.1\", \"logs_listen\": \"127.0.0.1:%d\"",
             sd.url, H_TOK_BB, logs_port);
    /* an agent-checked gameproc, and a shell checked by an exec probe that passes while
     * its file exists (a high threshold: the failures are counted, nothing is killed) */
    snprintf(svc, sizeof svc,
             "[{\"name\": \"beating\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\"],"
             " \"count\": 1, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000,"
             " \"liveness_timeout_ms\": 20000}, \"stop\": {\"grace_ms\": 2000}, \"cwd\": \"%s\"},"
             " {\"name\": \"probed\", \"command\": \"/bin/sh\", \"args\": [\"-c\", \"exec sleep 600\"],"
             " \"count\": 1, \"health\": {\"type\": \"exec\", \"command\": \"test -f %s/up\","
             " \"period_ms\": 100, \"timeout_ms\": 2000, \"failure_threshold\": 100}}]",
             GAMEPROC, dir, dir);
    h_write_file(dir, "up", "", 0644);
    bbt_config(&b, svc, extra);
    assert_true(bbt_start(&b) > 0);
    int slow = h_valgrind() ? 6 : 1;
    json_t *in = bbt_wait(&b, "beating", 0, "ready", 1, 5000 * slow);
    assert_non_null(in);
    char beating[160], probed[160];
    snprintf(beating, sizeof beating, "%s", bbt_str(in, "instance"));
    pid_t beating_pid = (pid_t)bbt_int(in, "pid");
    json_decref(in);
    in = bbt_wait(&b, "probed", 0, "ready", 1, 5000 * slow);
    assert_non_null(in);
    snprintf(probed, sizeof probed, "%s", bbt_str(in, "instance"));
    json_decref(in);

    /* one instance: its check, a fresh heartbeat, the deadline, the agent connected */
    /* the snapshot is rebuilt each second (later on a loaded machine): one taken after the
     * first heartbeat can still say "starting" */
    struct health_wait w = {.field = "heartbeat_age_ms", .at_least = 0, .state = "ready"};
    snprintf(w.url, sizeof w.url, "http://127.0.0.1:%d/v1/health/%s", logs_port, beating);
    assert_true(h_wait_until(health_reaches, &w, 5000 * slow)); /* ready in the snapshot */
    w.state = NULL;
    json_t *h = NULL;
    assert_int_equal(health_get(w.url, H_TOK_VIEWER, &h), 200);
    assert_string_equal(json_string_value(json_object_get(h, "instance")), beating);
    assert_string_equal(json_string_value(json_object_get(h, "machine")), "m1");
    assert_string_equal(json_string_value(json_object_get(h, "check")), "agent");
    assert_string_equal(json_string_value(json_object_get(h, "state")), "ready");
    assert_true(json_is_true(json_object_get(h, "agent_connected")));
    assert_int_equal(json_integer_value(json_object_get(h, "liveness_timeout_ms")), 20000);
    assert_true(json_integer_value(json_object_get(h, "heartbeat_age_ms")) < 3000 * slow);
    assert_true(json_integer_value(json_object_get(h, "as_of_ms")) > 0);
    json_decref(h);

    /* a frozen game: the age grows past a second (its deadline is 20 s away) */
    assert_int_equal(kill(beating_pid, SIGSTOP), 0);
    w.at_least = 1500;
    assert_true(h_wait_until(health_reaches, &w, 6000 * slow));
    assert_int_equal(kill(beating_pid, SIGCONT), 0);
    w.at_least = 0;

    /* the probed one: failures counted with the probe's reason once its file is gone */
    char upf[300];
    snprintf(upf, sizeof upf, "%s/up", dir);
    assert_int_equal(unlink(upf), 0);
    struct health_wait pw = {.field = "probe_failures_total", .at_least = 3};
    snprintf(pw.url, sizeof pw.url, "http://127.0.0.1:%d/v1/health/%s", logs_port, probed);
    assert_true(h_wait_until(health_reaches, &pw, 10000 * slow));
    assert_int_equal(health_get(pw.url, H_TOK_VIEWER, &h), 200);
    assert_string_equal(json_string_value(json_object_get(h, "check")), "exec");
    assert_true(json_integer_value(json_object_get(h, "probe_failures")) >= 3);
    assert_int_equal(json_integer_value(json_object_get(h, "failure_threshold")), 100);
    assert_int_equal(json_integer_value(json_object_get(h, "period_ms")), 100);
    assert_true(json_is_string(json_object_get(h, "last_probe_error")));
    assert_null(json_object_get(h, "agent_connected"));
    json_decref(h);
    /* passing again before the threshold (100 x 100 ms) kills it: the streak resets, the
     * run's total stays */
    h_write_file(dir, "up", "", 0644);

    /* the whole machine */
    char mu[200];
    snprintf(mu, sizeof mu, "http://127.0.0.1:%d/v1/health", logs_port);
    assert_int_equal(health_get(mu, H_TOK_VIEWER, &h), 200);
    assert_string_equal(json_string_value(json_object_get(h, "machine")), "m1");
    assert_int_equal(json_array_size(json_object_get(h, "instances")), 2);
    json_decref(h);

    /* sdctl describe of the live instance prints it (the game frozen above beats again
     * within its heartbeat period; under load the view may still say silent: asked
     * again until it beats, bounded) */
    int64_t until = h_now_ms() + 6000 * slow;
    do {
        assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", beating,
                               "--cluster", "c1", NULL), 0);
        assert_non_null(h_line_with(out, "Health:", line, sizeof line));
    } while (!strstr(line, "agent heartbeat ") && h_now_ms() < until && (h_sleep_ms(100), 1));
    assert_non_null(strstr(line, "agent heartbeat "));
    assert_non_null(strstr(line, "agent connected"));
    assert_non_null(h_line_with(out, "Status:", line, sizeof line)); /* gameproc's STATUS= */
    assert_non_null(strstr(line, "map=gp_arena"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", probed,
                           "--cluster", "c1", NULL), 0);
    assert_non_null(h_line_with(out, "Health:", line, sizeof line));
    assert_non_null(strstr(line, "exec probe ok "));
    assert_non_null(strstr(line, "last: "));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "describe", beating,
                           "--cluster", "c1", "-o", "json", NULL), 0);
    json_t *dj = json_loads(out, 0, NULL);
    assert_non_null(dj);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(dj, "health"), "check")), "agent");
    json_decref(dj);

    /* tokens: none 401, unknown 401, a game token 403, another machine's instance 404,
     * not a name 404 */
    assert_int_equal(health_get(w.url, NULL, NULL), 401);
    assert_int_equal(health_get(w.url, "wrong-token-0000000000", NULL), 401);
    assert_int_equal(health_get(w.url, H_TOK_GAME, NULL), 403);
    assert_int_equal(health_get(mu, "wrong-token-0000000000", NULL), 401);
    char u[300];
    snprintf(u, sizeof u, "http://127.0.0.1:%d/v1/health/zone-m1-1", logs_port); /* prod's */
    assert_int_equal(health_get(u, H_TOK_VIEWER, NULL), 404);
    snprintf(u, sizeof u, "http://127.0.0.1:%d/v1/health/a%%2Fb", logs_port);
    assert_int_equal(health_get(u, H_TOK_VIEWER, NULL), 404);

    /* a browser's preflight for a GET with the Authorization header */
    h_resp_t pr;
    const char *pre[] = {"Origin: http://127.0.0.1:1", "Access-Control-Request-Method: GET",
                         "Access-Control-Request-Headers: authorization", NULL};
    assert_int_equal(h_http("OPTIONS", w.url, NULL, NULL, NULL, 0, pre, &pr), 0);
    assert_int_equal(pr.status, 204);
    assert_non_null(strstr(pr.headers, "Access-Control-Allow-Origin: *"));
    assert_non_null(strstr(pr.headers, "Access-Control-Allow-Headers: Authorization"));
    assert_non_null(strstr(pr.headers, "Access-Control-Allow-Methods: GET"));
    h_resp_free(&pr);
    /* and a log, read the same way */
    snprintf(u, sizeof u, "http://127.0.0.1:%d/v1/logs/%s?tail=5", logs_port, beating);
    assert_int_equal(h_http("GET", u, H_TOK_VIEWER, NULL, NULL, 0, NULL, &pr), 0);
    assert_int_equal(pr.status, 200);
    assert_non_null(strstr(pr.headers, "Access-Control-Allow-Origin: *"));
    h_resp_free(&pr);
    bbt_stop(&b, 3000);
}

static void exit_codes(void **state)
{
    char out[4096];
    /* sdctl version: its own and the serverdir's (GET /healthz) */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "version", NULL), 0);
    assert_non_null(strstr(out, "sdctl "));
    assert_non_null(strstr(out, "serverdir "));
    assert_null(strstr(out, "did not say"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "version", "-o", "json", NULL), 0);
    json_t *v = json_loads(out, 0, NULL);
    assert_non_null(v);
    assert_string_equal(json_string_value(json_object_get(v, "sdctl")),
                        json_string_value(json_object_get(v, "serverdir")));
    json_decref(v);
    /* Usage errors: 2, before any request. */
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--state", "zombie", NULL), 2);
    assert_non_null(strstr(out, "--state takes"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "events", "--limit", "0", NULL), 2);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "machines", "--bogus", NULL), 2);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "ps", "--help", NULL), 0);
    assert_non_null(strstr(out, "usage: sdctl ps"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "events", "--help", NULL), 0);
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "machines", "--help", NULL), 0);

    /* Not authorized: 6. A bad name answered by serverdir: 1. */
    assert_int_equal(sdctl(sd.url, "wrong-token-0000000000", out, sizeof out, "ps", NULL), 6);
    assert_non_null(strstr(out, "401"));
    assert_int_equal(sdctl(sd.url, H_TOK_VIEWER, out, sizeof out, "events", "--since", "x", NULL), 1);
    assert_non_null(strstr(out, "bad_query"));

    /* Unreachable: 3. */
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d", h_free_port());
    assert_int_equal(sdctl(dead, H_TOK_VIEWER, out, sizeof out, "machines", NULL), 3);
    assert_non_null(strstr(out, "cannot reach serverdir"));

    /* A dead URL first in the list: sdctl fails over to the live one. */
    char both[300];
    snprintf(both, sizeof both, "%s,%s", dead, sd.url);
    assert_int_equal(sdctl(both, H_TOK_VIEWER, out, sizeof out, "ps", NULL), 0);
    assert_non_null(strstr(out, "zone-m1-1"));
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(machines_table_and_json),
        cmocka_unit_test(ps_table_filters_and_json),
        cmocka_unit_test(events_table_since_and_json),
        cmocka_unit_test(events_follow_prints_new_events),
        cmocka_unit_test(describe_instance_service_machine),
        cmocka_unit_test(ps_watch_redraws),
        cmocka_unit_test(ps_stopped_order_and_names),
        cmocka_unit_test(crash_report_in_the_record_and_describe),
        cmocka_unit_test(health_view_and_cors),
        cmocka_unit_test(exit_codes),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
