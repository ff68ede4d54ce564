/* bigbrother config parsing (defaults, every health type, error messages naming the
 * field), escapes of udp probe bytes and signal names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "agent/bb_agent.h"

#define HEAD "{\"machine\": \"m1\", \"cluster\": \"c1\", \"state_dir\": \"/var/lib/bb\", "

static void full_config_and_defaults(void **state)
{
    const char *text =
        HEAD "\"serverdir\": {\"urls\": [\"http://127.0.0.1:7700\", \"http://[::1]:7701\"],"
             " \"token\": \"t\"}, \"log_max_bytes\": 65536, \"log_keep\": 2,"
             " \"log_runs\": 1000,"
             " \"control_socket\": \"/run/bb.sock\","
             " \"services\": ["
             " {\"name\": \"zone\", \"command\": \"/bin/sh\", \"args\": [\"--tick-hz\", \"20\"],"
             "  \"count\": 3, \"env\": {\"MAP\": \"q3dm17\"}, \"cwd\": \"/tmp\","
             "  \"rlimits\": {\"nofile\": 4096, \"core\": \"unlimited\"},"
             "  \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 10000, \"liveness_timeout_ms\": 3000},"
             "  \"restart\": {\"policy\": \"on-failure\", \"backoff_min_ms\": 0, \"backoff_max_ms\": 30000,"
             "   \"max_restarts\": 5, \"window_s\": 60, \"healthy_reset_ms\": 5000},"
             "  \"stop\": {\"signal\": \"INT\", \"grace_ms\": 5000, \"hang_signal\": \"SIGQUIT\"}},"
             " {\"name\": \"q3\", \"command\": \"/bin/true\","
             "  \"health\": {\"type\": \"udp\", \"port\": 27960, \"query\": \"\\\\xff\\\\xff\\\\xff\\\\xffgetstatus\","
             "   \"expect\": \"\\\\xff\\\\xff\\\\xff\\\\xffstatusResponse\"}},"
             " {\"name\": \"web\", \"command\": \"/bin/true\","
             "  \"health\": {\"type\": \"http\", \"port\": 8080, \"path\": \"/healthz?deep=1\"}}]}";
    bb_config_t c;
    char err[512] = "";
    if (bb_config_parse(text, "t.json", &c, err, sizeof(err)))
        fail_msg("%s", err);
    assert_string_equal(c.urls, "http://127.0.0.1:7700,http://[::1]:7701");
    assert_string_equal(c.agent_socket, "/var/lib/bb/agent.sock");
    assert_string_equal(c.notify_socket, "/var/lib/bb/notify.sock");
    assert_string_equal(c.control_socket, "/run/bb.sock");
    assert_int_equal(c.log_max_bytes, 65536);
    assert_int_equal(c.log_keep, 2);
    assert_int_equal(c.log_runs, 1000);
    assert_int_equal(c.nservices, 3);
    bb_service_t *z = &c.services[0];
    assert_string_equal(z->argv[0], "/bin/sh");
    assert_string_equal(z->argv[2], "20");
    assert_null(z->argv[3]);
    assert_string_equal(z->env[0], "MAP=q3dm17");
    assert_int_equal(z->count, 3);
    assert_int_equal(z->nrlimits, 2);
    assert_int_equal(z->health.type, BB_H_AGENT);
    assert_int_equal(z->restart.policy, BB_P_ON_FAILURE);
    assert_int_equal(z->restart.backoff_min_ms, 0);
    assert_int_equal(z->stop.signal, SIGINT);
    assert_int_equal(z->stop.hang_signal, SIGQUIT);
    bb_service_t *q = &c.services[1];
    assert_int_equal(q->count, 1);
    assert_int_equal(q->health.type, BB_H_UDP);
    assert_int_equal(q->health.query_len, 13);
    assert_memory_equal(q->health.query, "\xff\xff\xff\xffgetstatus", 13);
    assert_int_equal(q->health.expect_len, 18);
    /* defaults */
    assert_int_equal(q->restart.policy, BB_P_ALWAYS);
    assert_int_equal(q->restart.backoff_min_ms, 100);
    assert_int_equal(q->stop.signal, SIGTERM);
    assert_int_equal(q->stop.hang_signal, SIGABRT);
    assert_int_equal(q->stop.grace_ms, 5000);
    assert_int_equal(q->health.period_ms, 1000);
    assert_int_equal(q->health.failure_threshold, 3);
    bb_service_t *w = &c.services[2];
    assert_int_equal(w->health.type, BB_H_HTTP);
    const char *req = "GET /healthz?deep=1 HTTP/1.0\r\nHost: 127.0.0.1:8080\r\n"
                      "User-Agent: bigbrother\r\nConnection: close\r\n\r\n";
    assert_int_equal(w->health.query_len, strlen(req));
    assert_memory_equal(w->health.query, req, strlen(req));
    bb_config_free(&c);

    /* standalone: no serverdir, no services */
    assert_int_equal(bb_config_parse(HEAD "\"services\": []}", "t.json", &c, err, sizeof(err)), 0);
    assert_null(c.urls);
    assert_int_equal(c.nservices, 0);
    assert_int_equal(c.log_keep, 3);
    assert_int_equal(c.log_runs, 5);
    bb_config_free(&c);
}

static void errors_name_the_field(void **state)
{
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"{\"machine\": \"m1\"", "t.json: invalid JSON"},
        {"[]", "t.json: (top level): must be a JSON object"},
        {"{\"cluster\": \"c1\", \"state_dir\": \"/x\"}", "t.json: machine: is required"},
        {HEAD "\"extra\": 1}", "t.json: extra: unknown field"},
        {"{\"machine\": \"a b\", \"cluster\": \"c1\", \"state_dir\": \"/x\"}",
         "t.json: machine: must be 1-128 characters"},
        {"{\"machine\": \"m\", \"cluster\": \"c1\", \"state_dir\": \"rel\"}",
         "t.json: state_dir: must be an absolute path"},
        {HEAD "\"serverdir\": {\"urls\": [\"ftp://x\"]}}",
         "t.json: serverdir.urls[0]: must be a string starting with http://"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"restart\": {\"policy\": \"sometimes\"}}]}",
         "t.json: services[0].restart.policy: 'sometimes' must be one of always, on-failure, never"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"bin/true\", \"health\": {\"type\": \"none\"}}]}",
         "t.json: services[0].command: must be an absolute path"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\"}]}",
         "t.json: services[0].health: is required"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"on_release\": \"reboot\"}]}",
         "t.json: services[0].on_release: 'reboot' must be recycle or restart"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"pool\": 4}]}",
         "t.json: services[0].pool: must be an object"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"confirm_timeout_ms\": 5}]}",
         "t.json: services[0].confirm_timeout_ms: must be between 100 and 600000"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/no/such/bin\", \"health\": {\"type\": \"none\"}}]}",
         "t.json: services[0].command: '/no/such/bin' is not executable: No such file or directory"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"grpc\"}}]}",
         "t.json: services[0].health.type: 'grpc' must be one of agent, notify, tcp, udp, http, exec, none"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"http\"}}]}",
         "t.json: services[0].health.port: is required for type http"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"http\", \"port\": 80,"
              " \"path\": \"healthz\"}}]}",
         "t.json: services[0].health.path: must start with '/' and be at most 400 printable characters"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"http\", \"port\": 80,"
              " \"path\": \"/a b\"}}]}",
         "t.json: services[0].health.path: must start with '/'"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"udp\", \"port\": 1}}]}",
         "t.json: services[0].health.query: is required"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"udp\", \"port\": 1,"
              " \"query\": \"\\\\xZZ\"}}]}",
         "t.json: services[0].health.query: must be 1-512 bytes"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"exec\"}}]}",
         "t.json: services[0].health.command: is required"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"tcp\", \"port\": 70000}}]}",
         "t.json: services[0].health.port: must be between 1 and 65535"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"restart\": {\"backoff_min_ms\": 500, \"backoff_max_ms\": 100}}]}",
         "t.json: services[0].restart.backoff_max_ms: must be >= backoff_min_ms (500)"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"stop\": {\"signal\": \"FOO\"}}]}",
         "t.json: services[0].stop.signal: 'FOO' is not a signal"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"env\": {\"BB_SOCKET\": \"x\"}}]}",
         "t.json: services[0].env.BB_SOCKET: is set by bigbrother"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"rlimits\": {\"files\": 3}}]}",
         "t.json: services[0].rlimits.files: unknown limit"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"},"
              " \"user\": \"no-such-user-here\"}]}",
         "t.json: services[0].user: no such user 'no-such-user-here'"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"}},"
              " {\"name\": \"g\", \"command\": \"/bin/true\", \"health\": {\"type\": \"none\"}}]}",
         "t.json: services[1].name: 'g' is already the name of services[0]"},
        {HEAD "\"services\": [{\"name\": \"g\", \"command\": \"/bin/true\", \"args\": [1], \"health\": {\"type\": \"none\"}}]}",
         "t.json: services[0].args[0]: must be a string"},
        {HEAD "\"mode\": \"swarm\"}", "t.json: mode: 'swarm' must be standalone or cluster"},
        {HEAD "\"mode\": \"cluster\"}", "t.json: mode: cluster mode needs serverdir.urls"},
        {HEAD "\"mode\": \"cluster\", \"serverdir\": {\"urls\": [\"http://a:1\"]},"
              " \"capacity\": 0}",
         "t.json: capacity: must be at least 1 in cluster mode"},
        {HEAD "\"primary_ttl_ms\": 10}", "t.json: primary_ttl_ms: must be between 1000 and 300000"},
        {HEAD "\"log_runs\": 0}", "t.json: log_runs: must be between 1 and 1000"},
        {HEAD "\"serverdir\": {\"urls\": [\"http://a:1\"], \"credential_renew_percent\": 95}}",
         "t.json: serverdir.credential_renew_percent: must be between 10 and 90"},
        {HEAD "\"serverdir\": {\"urls\": [\"http://a:1\"], \"credentials\": 1}}",
         "t.json: serverdir.credentials: must be"},
        {HEAD "\"log_runs\": 1001}", "t.json: log_runs: must be between 1 and 1000"},
        {HEAD "\"log_runs\": \"5\"}", "t.json: log_runs: must be"},
        {"{\"machine\": \"m\", \"cluster\": \"c\", \"state_dir\": "
         "\"/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
         "t.json: agent_socket: socket path"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bb_config_t c;
        char err[512] = "";
        assert_int_equal(bb_config_parse(cases[i].text, "t.json", &c, err, sizeof(err)), -1);
        if (strncmp(err, cases[i].msg, strlen(cases[i].msg))) {
            fprintf(stderr, "case %zu: got '%s'\n", i, err);
            fail();
        }
    }
}

static void cluster_mode_defaults(void **state)
{
    (void)state;
    bb_config_t c;
    char err[512] = "";
    assert_int_equal(bb_config_parse(HEAD "\"mode\": \"cluster\","
                                     " \"serverdir\": {\"urls\": [\"http://a:1\"]}}",
                                     "t.json", &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.cluster_mode, 1);
    assert_int_equal(c.capacity, 1000);
    assert_int_equal(c.primary_ttl_ms, 10000);
    assert_int_equal(c.placement_interval_ms, 1000);
    assert_int_equal(c.assignment_wait_ms, 10000);
    assert_int_equal(c.credentials, 1); /* instance credentials: on by default */
    assert_int_equal(c.credential_renew_percent, 33);
    bb_config_free(&c);
    assert_int_equal(bb_config_parse(HEAD "\"serverdir\": {\"urls\": [\"http://a:1\"],"
                                     " \"credentials\": false, \"credential_renew_percent\": 90}}",
                                     "t.json", &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.credentials, 0);
    assert_int_equal(c.credential_renew_percent, 90);
    bb_config_free(&c);
    assert_int_equal(bb_config_parse(HEAD "\"capacity\": 0}", "t.json", &c, err, sizeof(err)), 0);
    assert_int_equal(c.cluster_mode, 0);
    assert_int_equal(c.capacity, 0);
    bb_config_free(&c);
}

/* The allocation fields of a service: on_release is bigbrother's (recycle by default),
 * pool and confirm_timeout_ms are ServerDir's and the primary's, accepted and ignored. */
static void allocation_fields(void **state)
{
    (void)state;
    bb_config_t c;
    char err[512] = "";
    assert_int_equal(bb_config_parse(HEAD "\"services\": [{\"name\": \"a\", \"command\": \"/bin/true\","
                                     " \"health\": {\"type\": \"none\"}, \"on_release\": \"restart\","
                                     " \"pool\": {\"buffer\": \"25%\", \"min\": 0}, \"confirm_timeout_ms\": 100},"
                                     " {\"name\": \"b\", \"command\": \"/bin/true\","
                                     " \"health\": {\"type\": \"none\"}}]}",
                                     "t.json", &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.services[0].restart_on_release, 1);
    assert_int_equal(c.services[1].restart_on_release, 0);
    bb_config_free(&c);
}

static void unescape_signals_and_text(void **state)
{
    unsigned char out[8];
    assert_int_equal(bb_unescape("a\\x00\\n\\\\", out, sizeof(out)), 4);
    assert_memory_equal(out, "a\0\n\\", 4);
    assert_int_equal(bb_unescape("\\q", out, sizeof(out)), -1);
    assert_int_equal(bb_unescape("\\x1", out, sizeof(out)), -1);
    assert_int_equal(bb_unescape("123456789", out, sizeof(out)), -1); /* over cap */
    assert_int_equal(bb_signal_parse("TERM"), SIGTERM);
    assert_int_equal(bb_signal_parse("SIGABRT"), SIGABRT);
    assert_int_equal(bb_signal_parse("9"), 9);
    assert_int_equal(bb_signal_parse("0"), -1);
    assert_int_equal(bb_signal_parse("SIGNOPE"), -1);

    /* outside text (agent STATUS=) is kept as printable ASCII, truncated */
    char st[16], small[8];
    bb__copy_printable(st, sizeof(st), "ok \xff\xc3\x28\x01z", 8);
    assert_string_equal(st, "ok ?" "?(?z"); /* split: no trigraph */
    bb__copy_printable(small, sizeof(small), "0123456789", 10);
    assert_string_equal(small, "0123456");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_config_and_defaults),
        cmocka_unit_test(errors_name_the_field),
        cmocka_unit_test(cluster_mode_defaults),
        cmocka_unit_test(allocation_fields),
        cmocka_unit_test(unescape_signals_and_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
