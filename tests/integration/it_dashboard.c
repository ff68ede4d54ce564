/* The dashboard page in a real headless Chromium: Redis, serverdir with a token file, a
 * bigbrother supervising two gameprocs and reporting to serverdir, a held lock and a
 * server on the master list. Chromium opens http://.../?cluster=c1#token=<viewer token>
 * (the fragment never reaches the server), runs the page's scripts and dumps the DOM;
 * the test checks it shows what the API answers: the machine, every process instance,
 * the lock key and holder, the master server's address, and no error box. Then a
 * screenshot is saved as a test artifact (build/dashboard.png). /usr/bin/chromium is a
 * dependency (scripts/deps.sh): without it the test fails. A cluster of its own shows a
 * warm pool and the Allocations section. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_bigbrother.h"
#include "harness.h"
#include "harness_stack.h"

#define CHROMIUM "/usr/bin/chromium"

static h_redis_t redis;
static h_serverdir_t sd;
static bbt_t bbt;
static int logs_port; /* bigbrother's logs port: the instance page's health and live log */

static int setup(void **state)
{
    /* a ready-vs-desired sample every second, so the home page's chart has a line */
    h_sd_opts_t o = {.config = "{\"directory\":{\"series_interval_ms\":1000}}"};
    if (h_stack_setup(state, &redis, &sd, &o))
        return -1;
    char svc[2048], extra[512];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"zone\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"20\"],"
             " \"count\": 2, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 5000,"
             " \"liveness_timeout_ms\": 3000},"
             " \"stop\": {\"signal\": \"TERM\", \"grace_ms\": 500}, \"cwd\": \"%s\","
             " \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, h_tmpdir());
    logs_port = h_free_port();
    snprintf(extra, sizeof extra,
             ", \"address\": \"127.0.0.1\", \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"},"
             " \"logs_listen\": \"127.0.0.1:%d\"",
             sd.url, H_TOK_BB, logs_port);
    bbt_config(&bbt, svc, extra);
    return bbt_start(&bbt) > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    bbt_stop(&bbt, 5000);
    return h_stack_teardown(state);
}

/* GET path as the viewer; the parsed body of a 200 (asserted). */
static json_t *api(const char *path)
{
    h_resp_t r;
    assert_int_equal(h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r, "%s", path), 0);
    assert_int_equal(r.status, 200);
    json_t *j = h_resp_json(&r);
    assert_non_null(j);
    h_resp_free(&r);
    return j;
}

static int processes_ready(void *arg)
{
    (void)arg;
    h_resp_t r;
    int ok = h_http_json("GET", sd.url, H_TOK_VIEWER, NULL, &r,
                         "/v1/clusters/c1/processes?state=ready") == 0 &&
             r.status == 200;
    json_t *j = ok ? h_resp_json(&r) : NULL;
    ok = ok && json_array_size(json_object_get(j, "processes")) == 2;
    json_decref(j);
    h_resp_free(&r);
    return ok;
}

/* Runs chromium headless on url with the extra flag (--dump-dom or --screenshot=...),
 * stdout to out_path, stderr to a log. Returns the exit status (-1 on timeout). */
static int chromium_w(const char *url, const char *flag, const char *out_path, int timeout_ms,
                      int width)
{
    char winsize[64];
    snprintf(winsize, sizeof winsize, "--window-size=%d,1000", width);
    char profile[512], log[512];
    snprintf(profile, sizeof profile, "%s/chromium-profile", h_tmpdir());
    snprintf(log, sizeof log, "%s/chromium.log", h_tmpdir());
    mkdir(profile, 0700);
    char udd[600];
    snprintf(udd, sizeof udd, "--user-data-dir=%s", profile);
    const char *argv[] = {CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-quic", "--no-first-run", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync",
                          "--disable-dev-shm-usage", "--hide-scrollbars",
                          winsize, "--virtual-time-budget=3000", udd, flag,
                          url, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setpgid(0, 0);
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int err = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (out < 0 || err < 0 || null < 0)
            _exit(127);
        dup2(null, 0);
        dup2(out, 1);
        dup2(err, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    assert_true(pid > 0);
    int st = h_wait_exit(pid, timeout_ms);
    if (st == -1) {
        kill(-pid, SIGKILL);
        h_stop(pid, 100);
        fprintf(stderr, "chromium timed out (log: %s)\n", log);
        return -1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        fprintf(stderr, "chromium failed (log: %s)\n", log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int chromium(const char *url, const char *flag, const char *out_path, int timeout_ms)
{
    return chromium_w(url, flag, out_path, timeout_ms, 1400);
}

/* 1 if the DOM has a table cell whose text is exactly `text` (or a link with that text,
 * as the instance, service and machine names are). */
static int has_cell(const char *dom, const char *text)
{
    char want[512], linked[512];
    snprintf(want, sizeof want, ">%s</td>", text);
    snprintf(linked, sizeof linked, ">%s</a></td>", text);
    return strstr(dom, want) != NULL || strstr(dom, linked) != NULL;
}

static void dashboard_shows_the_cluster(void **state)
{
    (void)state;
    struct stat sb;
    assert_int_equal(stat(CHROMIUM, &sb), 0); /* missing chromium: run scripts/deps.sh */

    /* The cluster: processes ready and reported, a lock, a listed server. */
    assert_true(h_wait_until(processes_ready, NULL, h_valgrind() ? 60000 : 20000));
    h_resp_t r;
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_GAME, "{\"holder\": \"zone-holder\"}", &r,
                                 "/v1/locks/player-dash-42"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    char url[512], body[512];
    snprintf(url, sizeof url, "%s/v1/master/challenge", sd.url);
    assert_int_equal(h_http("POST", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    json_t *j = h_resp_json(&r);
    snprintf(body, sizeof body,
             "{\"challenge\":\"%s\",\"port\":27961,\"game\":\"DashGame\",\"map\":\"dm6\","
             "\"players\":3,\"max_players\":12}",
             json_string_value(json_object_get(j, "challenge")));
    json_decref(j);
    h_resp_free(&r);
    snprintf(url, sizeof url, "%s/v1/master/heartbeat", sd.url);
    assert_int_equal(h_http("POST", url, NULL, NULL, body, strlen(body), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    /* What the API says. */
    json_t *machines = api("/v1/clusters/c1/machines");
    json_t *procs = api("/v1/clusters/c1/processes");
    json_t *lock = api("/v1/locks/player-dash-42");
    json_t *servers = api("/v1/master/servers");
    assert_int_equal(json_array_size(json_object_get(machines, "machines")), 1);
    assert_int_equal(json_array_size(json_object_get(procs, "processes")), 2);
    assert_int_equal(json_array_size(json_object_get(servers, "servers")), 1);

    /* Desired state and the primary: a declared service no machine runs yet, and this
     * machine holding the primary lease. */
    const char *mname =
        json_string_value(json_object_get(json_array_get(json_object_get(machines, "machines"), 0), "machine"));
    assert_int_equal(h_http_json("PUT", sd.url, H_TOK_OPS, "{\"command\": \"/bin/true\", \"count\": 3}",
                                 &r, "/v1/clusters/c1/services/lobby"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);
    snprintf(body, sizeof body, "{\"machine\": \"%s\", \"ttl_ms\": 60000}", mname);
    assert_int_equal(h_http_json("POST", sd.url, H_TOK_BB, body, &r, "/v1/clusters/c1/primary"), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    /* What the page shows. */
    char page[512], dom_path[512];
    snprintf(page, sizeof page, "%s/?cluster=c1#token=%s", sd.url, H_TOK_VIEWER);
    snprintf(dom_path, sizeof dom_path, "%s/dom.html", h_tmpdir());
    int64_t t0 = h_now_ms();
    assert_int_equal(chromium(page, "--dump-dom", dom_path, 20000), 0);
    char *dom = h_slurp(dom_path);
    assert_non_null(dom);
    char *script = strstr(dom, "<script");
    assert_non_null(script);
    *script = 0; /* check the rendered elements only, not the page's own code */
    printf("dashboard: chromium dumped %zu bytes of DOM in %lld ms\n", strlen(dom),
           (long long)(h_now_ms() - t0));

    assert_non_null(strstr(dom, "updated "));        /* a refresh completed */
    const char *err = strstr(dom, "class=\"err\"");
    if (err)
        fprintf(stderr, "the page shows an error: %.200s\n", err);
    assert_null(err); /* no API call failed */
    assert_null(strstr(dom, "unauthorized"));
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(machines, "machines"), i, o) {
        assert_true(has_cell(dom, json_string_value(json_object_get(o, "machine"))));
        assert_true(has_cell(dom, json_string_value(json_object_get(o, "state"))));
    }
    json_array_foreach(json_object_get(procs, "processes"), i, o) {
        assert_true(has_cell(dom, json_string_value(json_object_get(o, "instance"))));
        char pid[32];
        snprintf(pid, sizeof pid, "%lld", (long long)json_integer_value(json_object_get(o, "pid")));
        assert_true(has_cell(dom, pid));
    }
    assert_true(has_cell(dom, "player-dash-42"));
    assert_true(has_cell(dom, json_string_value(json_object_get(lock, "holder"))));
    char seq[32];
    snprintf(seq, sizeof seq, "%lld", (long long)json_integer_value(json_object_get(lock, "lock_seq")));
    assert_true(has_cell(dom, seq));
    json_array_foreach(json_object_get(servers, "servers"), i, o)
        assert_true(has_cell(dom, json_string_value(json_object_get(o, "address"))));
    assert_true(has_cell(dom, "DashGame"));
    /* The services summary: zone with both instances ready. */
    assert_true(has_cell(dom, "zone"));
    assert_non_null(strstr(dom, "<td class=\"ok\">2 / 2</td>"));
    assert_true(has_cell(dom, "static")); /* zone comes from bigbrother's own config */
    assert_true(has_cell(dom, "lobby"));  /* declared through the API, not running */
    assert_non_null(strstr(dom, "<td class=\"warn\">3</td>"));
    assert_true(has_cell(dom, "primary (epoch 1)"));
    /* The started events of both processes are in the history. */
    assert_true(has_cell(dom, "started"));
    free(dom);
    json_decref(machines);
    json_decref(procs);
    json_decref(lock);
    json_decref(servers);

    /* The screenshot, kept in the build dir as the test artifact. */
    char png[600], flag[640], out[512];
    snprintf(png, sizeof png, "%s/../dashboard.png", SD_BIN_DIR);
    snprintf(flag, sizeof flag, "--screenshot=%s", png);
    snprintf(out, sizeof out, "%s/screenshot.out", h_tmpdir());
    unlink(png);
    assert_int_equal(chromium(page, flag, out, 20000), 0);
    assert_int_equal(stat(png, &sb), 0);
    assert_true(sb.st_size > 10000);
    char *real = realpath(png, NULL);
    printf("dashboard: screenshot saved to %s (%lld bytes)\n", real ? real : png,
           (long long)sb.st_size);
    free(real);
}

/* Dumps the DOM of the page at `query` (after ?), rendered elements only (the page's own
 * script cut off); caller frees. */
static char *dom_of(const char *query)
{
    char page[700], dom_path[512];
    snprintf(page, sizeof page, "%s/?%s#token=%s", sd.url, query, H_TOK_OPS);
    snprintf(dom_path, sizeof dom_path, "%s/dom-detail.html", h_tmpdir());
    assert_int_equal(chromium(page, "--dump-dom", dom_path, 20000), 0);
    char *dom = h_slurp(dom_path);
    assert_non_null(dom);
    char *script = strstr(dom, "<script");
    assert_non_null(script);
    *script = 0;
    return dom;
}

static void screenshot(const char *query, const char *name, int width)
{
    char page[700], png[600], flag[640], out[512];
    struct stat sb;
    snprintf(page, sizeof page, "%s/?%s#token=%s", sd.url, query, H_TOK_OPS);
    snprintf(png, sizeof png, "%s/../%s", SD_BIN_DIR, name);
    snprintf(flag, sizeof flag, "--screenshot=%s", png);
    snprintf(out, sizeof out, "%s/screenshot.out", h_tmpdir());
    unlink(png);
    assert_int_equal(chromium_w(page, flag, out, 20000, width), 0);
    assert_int_equal(stat(png, &sb), 0);
    assert_true(sb.st_size > 5000);
    printf("dashboard: screenshot %s (%d px wide, %lld bytes)\n", name, width, (long long)sb.st_size);
}

/* The pages an operator works from. An instance killed with SIGABRT:
 * its page shows the record, the timeline, the crash report (its last output), the locks
 * it held (none now) and a restart button; the service and machine pages list their
 * instances with links; the home page at 500 px wide. Screenshots in build/. */
static void instance_service_machine_pages(void **state)
{
    (void)state;
    assert_true(h_wait_until(processes_ready, NULL, h_valgrind() ? 60000 : 20000));
    json_t *procs = api("/v1/clusters/c1/processes?service=zone");
    json_t *victim = json_array_get(json_object_get(procs, "processes"), 0);
    char id[160], machine[160];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(victim, "instance")));
    snprintf(machine, sizeof machine, "%s", json_string_value(json_object_get(victim, "machine")));
    pid_t pid = (pid_t)json_integer_value(json_object_get(victim, "pid"));
    long long slot = json_integer_value(json_object_get(victim, "slot"));
    json_decref(procs);
    assert_int_equal(kill(pid, SIGABRT), 0);
    char path[300];
    snprintf(path, sizeof path, "/v1/clusters/c1/processes/%s", id);
    for (int i = 0;; i++) { /* the stopped event with its crash report */
        json_t *p = api(path);
        int done = json_is_string(json_object_get(p, "log_tail"));
        json_decref(p);
        if (done)
            break;
        assert_true(i < (h_valgrind() ? 1200 : 200));
        h_sleep_ms(50);
    }

    char q[400];
    /* a live instance: its health (heartbeat age, deadline, agent) and live log, read
     * from its machine's bigbrother by the page itself (CORS) */
    json_t *ready = api("/v1/clusters/c1/processes?service=zone&state=ready");
    char live[160];
    snprintf(live, sizeof live, "%s",
             json_string_value(json_object_get(
                 json_array_get(json_object_get(ready, "processes"), 0), "instance")));
    json_decref(ready);
    snprintf(q, sizeof q, "cluster=c1&instance=%s", live);
    char *dom = dom_of(q);
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "last heartbeat"));
    assert_non_null(strstr(dom, " ago</span>"));
    assert_non_null(strstr(dom, "3.0s without one: hung, killed and restarted"));
    assert_non_null(strstr(dom, ">connected</span>"));
    assert_non_null(strstr(dom, "id=\"live-log\">")); /* shown (not hidden) */
    assert_non_null(strstr(dom, "msg=ready"));        /* the game's own output */
    assert_non_null(strstr(dom, "last 200 lines, every 2 s"));
    free(dom);
    screenshot(q, "dashboard-instance-live.png", 1400);

    /* the victim slot's next run: restarts 1 (the kill), generation 2, as the record and
     * bigbrother's health view say, each shown as it is */
    char next[160] = "";
    for (int i = 0; !next[0]; i++) {
        assert_true(i < (h_valgrind() ? 1200 : 200));
        ready = api("/v1/clusters/c1/processes?service=zone&state=ready");
        size_t k;
        json_t *x;
        json_array_foreach(json_object_get(ready, "processes"), k, x)
            if (json_integer_value(json_object_get(x, "slot")) == slot &&
                json_integer_value(json_object_get(x, "generation")) == 2)
                snprintf(next, sizeof next, "%s", json_string_value(json_object_get(x, "instance")));
        json_decref(ready);
        if (!next[0])
            h_sleep_ms(50);
    }
    snprintf(q, sizeof q, "cluster=c1&instance=%s", next);
    dom = dom_of(q);
    assert_non_null(strstr(dom, "<dt>restarts</dt><dd>1</dd><dt>generation</dt><dd>2</dd>"));
    free(dom);

    snprintf(q, sizeof q, "cluster=c1&instance=%s", id);
    dom = dom_of(q);
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, id));
    assert_non_null(strstr(dom, "killed(signal 6)"));
    assert_non_null(strstr(dom, "Crash report"));
    assert_non_null(strstr(dom, "id=\"crash-log\""));
    assert_non_null(strstr(dom, "msg=ready")); /* gameproc's own line, in the crash report */
    assert_non_null(strstr(dom, "Timeline"));
    assert_true(has_cell(dom, "started"));
    assert_true(has_cell(dom, "stopped"));
    assert_non_null(strstr(dom, "Locks held"));
    /* zone is static (the bigbrother's config): no restart here, bbctl is named */
    assert_null(strstr(dom, "id=\"b-restart\""));
    assert_non_null(strstr(dom, "an instance of a static service"));
    char mlink[400];
    snprintf(mlink, sizeof mlink, "machine=%s\">%s</a>", machine, machine);
    assert_non_null(strstr(dom, mlink)); /* click-through to the machine */
    assert_non_null(strstr(dom, "<main id=\"home\" hidden=\"\">")); /* the cluster's tables are not shown */
    assert_non_null(strstr(dom, "not running: no check"));
    assert_non_null(strstr(dom, "the run's last 200 lines")); /* the stopped run's log */
    free(dom);
    screenshot(q, "dashboard-instance.png", 1400);

    dom = dom_of("cluster=c1&service=zone");
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "a static service"));
    assert_true(has_cell(dom, id)); /* in Recently stopped */
    assert_null(strstr(dom, "id=\"b-restart\""));
    assert_null(strstr(dom, "id=\"b-stop\""));
    assert_non_null(strstr(dom, "restart or stop it with <code>bbctl</code> on that machine"));
    free(dom);
    /* a desired service: scale, rolling restart, stop; no allocate (no pool) */
    dom = dom_of("cluster=c1&service=lobby");
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "id=\"b-scale\""));
    assert_non_null(strstr(dom, "id=\"b-restart\""));
    assert_non_null(strstr(dom, "id=\"b-stop\""));
    assert_null(strstr(dom, "id=\"b-start\""));
    assert_null(strstr(dom, "id=\"b-allocate\""));
    free(dom);
    screenshot("cluster=c1&service=zone", "dashboard-service.png", 1400);

    snprintf(q, sizeof q, "cluster=c1&machine=%s", machine);
    dom = dom_of(q);
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "127.0.0.1"));
    assert_non_null(strstr(dom, "id=\"b-drain\""));
    assert_null(strstr(dom, "id=\"b-undrain\"")); /* it is not draining */
    assert_true(has_cell(dom, "ready"));
    assert_non_null(strstr(dom, ">heartbeat</th>")); /* from the machine's /v1/health */
    assert_non_null(strstr(dom, "s ago</td>"));
    assert_null(strstr(dom, "(health: "));            /* no error reading it */
    free(dom);
    screenshot(q, "dashboard-machine.png", 1400);

    /* home: the activity picture, the ready-vs-desired chart (its two lines and legend:
     * zone's 2 static processes ready, lobby's 3 desired plus zone's 2), links, sortable headers; and
     * usable at 500 px */
    json_t *series = api("/v1/clusters/c1/series");
    assert_true(json_array_size(json_object_get(series, "samples")) >= 1);
    json_decref(series);
    dom = dom_of("cluster=c1");
    assert_non_null(strstr(dom, "<svg class=\"spark\""));
    assert_non_null(strstr(dom, "failed in the last hour"));
    assert_non_null(strstr(dom, "<svg class=\"chart\""));
    assert_non_null(strstr(dom, "<path class=\"desired\" d=\"M"));
    assert_non_null(strstr(dom, "<path class=\"ready\" d=\"M"));
    /* desired: lobby's 3 plus zone's 2 static instances, which are never over */
    assert_non_null(strstr(dom, "desired <b>5</b> <span class=\"dim\">(3 declared + 2 static)"));
    assert_null(strstr(dom, " over</span>"));
    assert_non_null(strstr(dom, "checked every 1.0s, the last change"));
    assert_non_null(strstr(dom, "th class=\"sort\""));
    char ilink[400];
    snprintf(ilink, sizeof ilink, "instance=%s\">", id);
    assert_non_null(strstr(dom, ilink));
    free(dom);
    screenshot("cluster=c1", "dashboard-500px.png", 500);
    dom = dom_of("cluster=c9"); /* a cluster serverdir has not sampled */
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "no samples yet: serverdir takes one every 1.0s"));
    assert_null(strstr(dom, "<svg class=\"chart\""));
    free(dom);

    /* the processes table is paged along the API's cursor: one a page here */
    dom = dom_of("cluster=c1&page_size=1");
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "page 1 of about 2"));
    assert_non_null(strstr(dom, "<button id=\"p-next\">"));          /* enabled */
    assert_non_null(strstr(dom, "<button id=\"p-prev\" disabled=\"\">")); /* first page */
    free(dom);
}

/* A warm pool in the services table (ready free / allocated) and the
 * Allocations section (paged along the cursor), in a cluster of its own (c2: no
 * bigbrother acts on it) with two ready instances reported through events, one allocated
 * and one released, and a third run stopped as `replaced` (not a failure). */
static void pools_and_allocations(void **state)
{
    (void)state;
    h_resp_t r;
    static const struct {
        const char *token, *method, *body, *path;
    } calls[] = {
        {H_TOK_BB, "PUT", "{\"address\":\"10.0.0.21\",\"ttl_ms\":300000}", "/v1/clusters/c2/machines/m9"},
        {H_TOK_OPS, "PUT", "{\"command\":\"/bin/true\",\"pool\":{\"buffer\":2},"
                    "\"confirm_timeout_ms\":600000}", "/v1/clusters/c2/services/match"},
        {H_TOK_BB, "POST",
         "{\"events\":["
         "{\"id\":\"s0\",\"type\":\"started\",\"instance\":\"match-m9-0\",\"machine\":\"m9\",\"service\":\"match\",\"pid\":70,\"slot\":0},"
         "{\"id\":\"r0\",\"type\":\"ready\",\"instance\":\"match-m9-0\",\"machine\":\"m9\",\"service\":\"match\"},"
         "{\"id\":\"s1\",\"type\":\"started\",\"instance\":\"match-m9-1\",\"machine\":\"m9\",\"service\":\"match\",\"pid\":71,\"slot\":1},"
         "{\"id\":\"r1\",\"type\":\"ready\",\"instance\":\"match-m9-1\",\"machine\":\"m9\",\"service\":\"match\"},"
         /* a third run the pool shrank away: a normal end, no failure */
         "{\"id\":\"s2\",\"type\":\"started\",\"instance\":\"match-m9-2\",\"machine\":\"m9\",\"service\":\"match\",\"pid\":72,\"slot\":2},"
         "{\"id\":\"x2\",\"type\":\"stopped\",\"instance\":\"match-m9-2\",\"machine\":\"m9\",\"service\":\"match\",\"reason\":\"replaced\"}]}",
         "/v1/clusters/c2/events"},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        assert_int_equal(h_http_json(calls[i].method, sd.url, calls[i].token, calls[i].body, &r,
                                     "%s", calls[i].path), 0);
        assert_int_equal(r.status, 200);
        h_resp_free(&r);
    }
    char id[2][64], inst0[64] = "";
    for (int i = 0; i < 2; i++) {
        assert_int_equal(h_http_json("POST", sd.url, H_TOK_OPS, "{\"service\":\"match\"}", &r,
                                     "/v1/clusters/c2/allocations"), 0);
        assert_int_equal(r.status, 201);
        json_t *j = h_resp_json(&r);
        snprintf(id[i], sizeof id[i], "%s", json_string_value(json_object_get(j, "allocation")));
        if (i == 0)
            snprintf(inst0, sizeof inst0, "%s", json_string_value(json_object_get(j, "instance")));
        json_decref(j);
        h_resp_free(&r);
    }
    assert_int_equal(h_http_json("DELETE", sd.url, H_TOK_OPS, NULL, &r,
                                 "/v1/clusters/c2/allocations/%s", id[1]), 0);
    assert_int_equal(r.status, 200);
    h_resp_free(&r);

    char *dom = dom_of("cluster=c2");
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, "<td class=\"ok\">1 free / 1 alloc</td>")); /* the pool */
    assert_non_null(strstr(dom, "<td class=\"ok\">pool</td>"));            /* desired */
    assert_non_null(strstr(dom, "Allocations"));
    assert_non_null(strstr(dom, "1 open, 1 ended"));
    assert_true(has_cell(dom, id[0]));
    assert_true(has_cell(dom, id[1]));
    assert_non_null(strstr(dom, "<td class=\"warn\">pending</td>"));
    assert_non_null(strstr(dom, "<td class=\"dim\">released</td>"));
    assert_non_null(strstr(dom, "<td class=\"dim\">api</td>")); /* the reason */
    /* the pool's shrink is no failure: dim, and not counted (serverdir's `failure`) */
    assert_non_null(strstr(dom, "<td class=\"dim\">replaced</td>"));
    assert_non_null(strstr(dom, "<b>0</b><small>recent failures</small>"));
    free(dom);
    screenshot("cluster=c2", "dashboard-allocations.png", 1400);

    /* one a page: the allocations pager */
    dom = dom_of("cluster=c2&alloc_page_size=1");
    assert_null(strstr(dom, "class=\"err\""));
    assert_true(has_cell(dom, id[0]));
    assert_false(has_cell(dom, id[1]));
    assert_non_null(strstr(dom, "<button id=\"a-next\">"));
    assert_non_null(strstr(dom, "<button id=\"a-prev\" disabled=\"\">"));
    free(dom);

    /* the service's page says how its pool stands */
    dom = dom_of("cluster=c2&service=match");
    assert_null(strstr(dom, "class=\"err\""));
    const char *wp = strstr(dom, "a warm pool");
    if (!strstr(dom, "a warm pool (the primary sizes it): 1 free / 1 alloc, buffer 2"))
        fail_msg("the service page says: %.120s", wp ? wp : "(no warm pool line)");
    /* a pool: allocate (no scale: the primary sizes it), rolling restart, stop; its
     * instances with the allocation each serves */
    assert_non_null(strstr(dom, "id=\"b-allocate\""));
    assert_null(strstr(dom, "id=\"b-scale\""));
    assert_non_null(strstr(dom, "id=\"b-restart\""));
    assert_non_null(strstr(dom, ">allocation</th>"));
    char cell[120];
    snprintf(cell, sizeof cell, "%s (pending)", id[0]);
    assert_true(has_cell(dom, cell));
    free(dom);
    /* the allocated instance's page: the allocation it serves, and a restart */
    char q[200];
    snprintf(q, sizeof q, "cluster=c2&instance=%s", inst0);
    dom = dom_of(q);
    assert_null(strstr(dom, "class=\"err\""));
    assert_non_null(strstr(dom, id[0]));
    assert_non_null(strstr(dom, "id=\"b-restart\""));
    free(dom);
}

/* The page is served without a token, with a strict CSP; the API it reads needs one. */
static void page_public_api_guarded(void **state)
{
    (void)state;
    h_resp_t r;
    char url[256];
    snprintf(url, sizeof url, "%s/", sd.url);
    assert_int_equal(h_http("GET", url, NULL, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    char csp[512];
    assert_int_equal(h_resp_header(&r, "Content-Security-Policy", csp, sizeof csp), 0);
    assert_non_null(strstr(csp, "default-src 'self'"));
    assert_non_null(strstr(csp, "connect-src 'self' http: https:")); /* bigbrothers' logs ports */
    assert_non_null(strstr(r.body, "location.hash")); /* reads #token= */
    h_resp_free(&r);
    assert_int_equal(h_http_json("GET", sd.url, NULL, NULL, &r, "/v1/clusters/c1/processes"), 0);
    assert_int_equal(r.status, 401);
    h_resp_free(&r);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(page_public_api_guarded),
        cmocka_unit_test(dashboard_shows_the_cluster),
        cmocka_unit_test(instance_service_machine_pages),
        cmocka_unit_test(pools_and_allocations),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
