/* sdctl's allocation commands against a live serverdir (docs/allocation.md): a pooled
 * service with two ready instances reported through events; `sdctl allocate` with a
 * selector, payload and idempotency key (table, -o wide, -o json, the replay, the
 * conflict), a selector nothing matches (exit 5, the message names it, --wait), an
 * unknown service (exit 4), usage errors (exit 2), a viewer token (exit 6); the pool
 * figures in `sdctl services` and `sdctl status`; `sdctl allocations` paged, walked
 * (--all) and filtered, `allocations get`, `allocations release` (state released, reason
 * api; again: unchanged). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_api.h"
#include "harness_sdctl.h"
#include "harness_stack.h"

static h_redis_t redis;
static h_serverdir_t sd;

/* redis-server and serverdir; machines m1 (zone=eu) and m2 (zone=us) leased; the pooled
 * service match and the plain service lobby; two ready instances of match, the one on m1
 * with the status line "map=q3dm17". */
static int setup(void **state)
{
    if (h_stack_setup(state, &redis, &sd, NULL))
        return -1;
    static const struct {
        const char *token, *method, *body, *path;
    } calls[] = {
        {H_TOK_BB, "PUT", "{\"address\":\"10.0.0.11\",\"labels\":{\"zone\":\"eu\"},\"ttl_ms\":300000}",
         "/v1/clusters/a1/machines/m1"},
        {H_TOK_BB, "PUT", "{\"address\":\"10.0.0.12\",\"labels\":{\"zone\":\"us\"},\"ttl_ms\":300000}",
         "/v1/clusters/a1/machines/m2"},
        {H_TOK_OPS, "PUT",
         "{\"command\":\"/usr/bin/gameproc\",\"pool\":{\"buffer\":2,\"max\":10},"
         "\"on_release\":\"restart\",\"confirm_timeout_ms\":600000}",
         "/v1/clusters/a1/services/match"},
        {H_TOK_OPS, "PUT", "{\"command\":\"/usr/bin/lobby\",\"count\":1}",
         "/v1/clusters/a1/services/lobby"},
        {H_TOK_BB, "POST",
         "{\"events\":["
         "{\"id\":\"s0\",\"type\":\"started\",\"instance\":\"match-m1-0\",\"machine\":\"m1\","
         "\"service\":\"match\",\"pid\":100,\"slot\":0,\"ports\":{\"game\":27960}},"
         "{\"id\":\"r0\",\"type\":\"ready\",\"instance\":\"match-m1-0\",\"machine\":\"m1\","
         "\"service\":\"match\"},"
         "{\"id\":\"t0\",\"type\":\"status\",\"instance\":\"match-m1-0\",\"machine\":\"m1\","
         "\"service\":\"match\",\"status\":\"map=q3dm17 mode=ctf\"},"
         "{\"id\":\"s1\",\"type\":\"started\",\"instance\":\"match-m2-1\",\"machine\":\"m2\","
         "\"service\":\"match\",\"pid\":101,\"slot\":1,\"ports\":{\"game\":27961}},"
         "{\"id\":\"r1\",\"type\":\"ready\",\"instance\":\"match-m2-1\",\"machine\":\"m2\","
         "\"service\":\"match\"}]}",
         "/v1/clusters/a1/events"},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        char code[64];
        long st = ct_call(sd.url, calls[i].token, calls[i].method, calls[i].body, NULL, code,
                          "%s", calls[i].path);
        if (st != 200) {
            fprintf(stderr, "setup: %s %s -> %ld %s\n", calls[i].method, calls[i].path, st, code);
            return -1;
        }
    }
    return 0;
}

/* Runs sdctl (args NULL-terminated) in cluster a1 with token; returns its exit code and
 * what it printed (stdout then stderr) in out. */
static int sdctl(const char *token, char *out, size_t cap, ...)
{
    char env_url[256], env_tok[128];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    snprintf(env_tok, sizeof env_tok, "SERVERDIR_TOKEN=%s", token);
    const char *env[] = {env_url, env_tok, "SERVERDIR_CLUSTER=a1", "NO_COLOR=1", NULL};
    va_list ap;
    va_start(ap, cap);
    int rc = h_sdctl_vrun(env, 20000, out, cap, ap);
    va_end(ap);
    return rc;
}

/* The JSON sdctl printed first (stdout; stderr may follow it). Caller decrefs. */
static json_t *printed_json(const char *out)
{
    json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, NULL);
    if (!j)
        fprintf(stderr, "not JSON: %.500s\n", out);
    assert_non_null(j);
    return j;
}

/* The first word of the line of out holding needle (an allocation id), into id. */
static void first_word(const char *out, const char *needle, char *id, size_t cap)
{
    char line[512];
    assert_non_null(h_line_with(out, needle, line, sizeof line));
    size_t n = strcspn(line, " ");
    assert_true(n > 0 && n < cap);
    snprintf(id, cap, "%.*s", (int)n, line);
}

static void allocate_then_list_get_release(void **state)
{
    (void)state;
    char out[16384], line[512], id[64], id2[64];

    /* the pool before: both instances free */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "services", NULL), 0);
    assert_non_null(h_line_with(out, "SERVICE", line, sizeof line));
    assert_non_null(strstr(line, "POOL"));
    assert_non_null(h_line_with(out, "\nmatch ", line, sizeof line));
    assert_non_null(strstr(line, "2 free / 0 alloc"));
    assert_non_null(strstr(line, " pool ")); /* COUNT: the primary sizes it */
    assert_non_null(h_line_with(out, "\nlobby ", line, sizeof line));
    assert_non_null(strstr(line, " 1 "));

    /* a selector on the machine's labels and the status line, a payload, a key */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--label", "zone=eu",
                           "--meta", "map=q3dm17", "--payload", "{\"match\":\"m-1\"}", "--key",
                           "m-1", NULL), 0);
    assert_non_null(h_line_with(out, "ALLOCATION", line, sizeof line));
    for (const char *const *c = (const char *const[]){"STATE", "SERVICE", "INSTANCE", "MACHINE",
                                                      "ADDRESS", "PORTS", NULL}; *c; c++)
        assert_non_null(strstr(line, *c));
    assert_non_null(h_line_with(out, "match-m1-0", line, sizeof line));
    assert_non_null(strstr(line, "pending"));
    assert_non_null(strstr(line, " m1 "));
    assert_non_null(strstr(line, "10.0.0.11"));
    assert_non_null(strstr(line, "game=27960"));
    first_word(out, "match-m1-0", id, sizeof id);
    assert_true(id[0] == 'a');

    /* the same key and request again: the same allocation, replayed */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "-o", "json", "allocate", "match",
                           "--label", "zone=eu", "--meta", "map=q3dm17", "--payload",
                           "{\"match\":\"m-1\"}", "--key", "m-1", NULL), 0);
    json_t *j = printed_json(out);
    assert_string_equal(ct_str(j, "allocation"), id);
    assert_true(json_is_true(json_object_get(j, "replayed")));
    assert_string_equal(ct_str(json_object_get(j, "payload"), "match"), "m-1");
    json_decref(j);
    assert_non_null(strstr(out, "sdctl: replayed: key m-1"));
    /* the same key with another request: exit 5, and which allocation holds the key */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--key", "m-1", NULL),
                     5);
    assert_non_null(strstr(out, "409 idempotency_conflict"));
    assert_non_null(strstr(out, id));

    /* nothing matches: exit 5, the selector named, the hint */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--label",
                           "zone=mars", NULL), 5);
    assert_non_null(h_line_with(out, "no_capacity", line, sizeof line));
    assert_non_null(strstr(line, "'match'"));
    assert_non_null(strstr(line, "\"zone\":\"mars\""));
    assert_non_null(strstr(out, "--wait DURATION"));
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--meta",
                           "map=dm6", "--wait", "300ms", NULL), 5);
    assert_non_null(strstr(out, "\"map\":\"dm6\""));
    assert_non_null(strstr(out, "none became ready in 300 ms"));
    /* an unknown service, a viewer token, bad command lines */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "nosuch", NULL), 4);
    assert_non_null(strstr(out, "nosuch"));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocate", "match", NULL), 6);
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", NULL), 2);
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--strategy", "wild",
                           NULL), 2);
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--payload", "{bad",
                           NULL), 2);
    assert_non_null(strstr(out, "--payload is not JSON"));
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--label", "zone",
                           NULL), 2);
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--wait", "2h",
                           NULL), 2);
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", "--players", NULL),
                     2);

    /* the pool figures follow */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "services", NULL), 0);
    assert_non_null(h_line_with(out, "\nmatch ", line, sizeof line));
    assert_non_null(strstr(line, "1 free / 1 alloc"));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "-o", "wide", "services", NULL), 0);
    assert_non_null(h_line_with(out, "SERVICE", line, sizeof line));
    assert_non_null(strstr(line, "BUFFER"));
    assert_non_null(strstr(line, "LAST_DEMAND"));
    assert_non_null(h_line_with(out, "\nmatch ", line, sizeof line));
    assert_non_null(strstr(line, " restart "));
    assert_non_null(strstr(line, " 10 "));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "status", NULL), 0);
    assert_non_null(h_line_with(out, "\nmatch ", line, sizeof line));
    assert_non_null(strstr(line, "pool"));
    assert_non_null(strstr(line, "1 free / 1 alloc"));
    assert_non_null(strstr(line, " ok "));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "-o", "json", "status", NULL), 0);
    j = printed_json(out);
    size_t i;
    json_t *s;
    int seen = 0;
    json_array_foreach(json_object_get(j, "services"), i, s) {
        if (strcmp(ct_str(s, "service"), "match"))
            continue;
        seen = 1;
        assert_true(json_is_null(json_object_get(s, "desired")));
        assert_int_equal(ct_int(json_object_get(s, "pool"), "allocated"), 1);
        assert_int_equal(ct_int(json_object_get(s, "pool"), "ready_free"), 1);
    }
    assert_true(seen);
    json_decref(j);

    /* the game acknowledges it: active */
    char ev[600];
    snprintf(ev, sizeof ev,
             "{\"events\":[{\"id\":\"c0\",\"type\":\"confirmed\",\"instance\":\"match-m1-0\","
             "\"machine\":\"m1\",\"service\":\"match\",\"allocation\":\"%s\"}]}", id);
    assert_int_equal(ct_call(sd.url, H_TOK_BB, "POST", ev, NULL, NULL, "/v1/clusters/a1/events"),
                     200);

    /* a second one, distributed: the other machine */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "-o", "wide", "allocate", "match",
                           "--strategy", "distributed", "--payload", "[1,2]", NULL), 0);
    assert_non_null(h_line_with(out, "ALLOCATION", line, sizeof line));
    assert_non_null(strstr(line, "PAYLOAD"));
    assert_non_null(h_line_with(out, "match-m2-1", line, sizeof line));
    assert_non_null(strstr(line, "10.0.0.12"));
    assert_non_null(strstr(line, " ready "));
    assert_non_null(strstr(line, "[1,2]"));
    first_word(out, "match-m2-1", id2, sizeof id2);
    /* the pool is empty now */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocate", "match", NULL), 5);
    assert_non_null(strstr(out, "no_capacity"));

    /* the list: both, oldest first */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", NULL), 0);
    assert_non_null(h_line_with(out, "ALLOCATION", line, sizeof line));
    for (const char *const *c = (const char *const[]){"STATE", "SERVICE", "INSTANCE", "MACHINE",
                                                      "AGE", "REASON", NULL}; *c; c++)
        assert_non_null(strstr(line, *c));
    assert_non_null(h_line_with(out, id, line, sizeof line));
    assert_non_null(strstr(line, "active"));
    assert_non_null(strstr(line, "match-m1-0"));
    assert_non_null(h_line_with(out, id2, line, sizeof line));
    assert_non_null(strstr(line, "pending"));
    assert_true(strstr(out, id) < strstr(out, id2));
    assert_null(strstr(out, "more:"));
    /* one a page: the command for the next; --after goes on; --all walks them all */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "--limit", "1", NULL), 0);
    assert_non_null(strstr(out, id));
    assert_null(strstr(out, id2));
    char more[200];
    snprintf(more, sizeof more, "more: sdctl allocations --after %s", id);
    assert_non_null(strstr(out, more));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "list", "--after", id,
                           NULL), 0);
    assert_null(strstr(out, id));
    assert_non_null(strstr(out, id2));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "-o", "json", "allocations", "--all",
                           NULL), 0);
    j = printed_json(out);
    assert_int_equal(json_array_size(json_object_get(j, "allocations")), 2);
    assert_true(json_is_null(json_object_get(j, "next")));
    json_decref(j);
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "--service", "lobby",
                           NULL), 0);
    assert_null(strstr(out, id));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "--all", "--limit", "5",
                           NULL), 2);
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "--limit", "0", NULL), 2);

    /* one */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "get", id, NULL), 0);
    assert_non_null(h_line_with(out, id, line, sizeof line));
    assert_non_null(strstr(line, "active"));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "-o", "yaml", "allocations", "get", id,
                           NULL), 0);
    assert_non_null(strstr(out, "state: \"active\""));
    assert_non_null(strstr(out, "idempotency_key: \"m-1\""));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "get", "a999999", NULL),
                     4);
    assert_non_null(strstr(out, "no_such_allocation"));
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "get", NULL), 2);

    /* release: ended, the instance back to the pool; again: unchanged */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "release", id, NULL), 6);
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocations", "release", id, NULL), 0);
    snprintf(more, sizeof more, "%s: released (reason api, instance match-m1-0)", id);
    assert_non_null(strstr(out, more));
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocations", "release", id, NULL), 0);
    snprintf(more, sizeof more, "%s: ended already (released, reason api)", id);
    assert_non_null(strstr(out, more));
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocations", "release", "a999999",
                           NULL), 4);
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "allocations", "get", id, NULL), 0);
    assert_non_null(h_line_with(out, id, line, sizeof line));
    assert_non_null(strstr(line, "released"));
    assert_non_null(strstr(line, " api"));
    /* on_release restart: the instance is not free until its next run is ready */
    assert_int_equal(sdctl(H_TOK_VIEWER, out, sizeof out, "services", NULL), 0);
    assert_non_null(h_line_with(out, "\nmatch ", line, sizeof line));
    if (!strstr(line, "0 free / 1 alloc"))
        fprintf(stderr, "services after the release: %s\n", line);
    assert_non_null(strstr(line, "0 free / 1 alloc"));
    /* --watch shows, never changes */
    assert_int_equal(sdctl(H_TOK_OPS, out, sizeof out, "allocations", "release", id2, "--watch",
                           NULL), 2);
    assert_non_null(strstr(out, "--watch does not apply to allocations release"));
}

/* A cluster with no pool keeps the services table it had; a cluster ServerDir does not
 * know is exit 4 for allocations as for ps. */
static void no_pool_no_pool_column(void **state)
{
    (void)state;
    char out[8192], line[512];
    assert_int_equal(ct_call(sd.url, H_TOK_OPS, "PUT", "{\"command\":\"/bin/z\",\"count\":2}",
                             NULL, NULL, "/v1/clusters/a2/services/zone"), 200);
    char env_url[256];
    snprintf(env_url, sizeof env_url, "SERVERDIR_URL=%s", sd.url);
    const char *env[] = {env_url, "SERVERDIR_TOKEN=" H_TOK_VIEWER, "SERVERDIR_CLUSTER=a2",
                         "NO_COLOR=1", NULL};
    const char *args[] = {"services", NULL};
    assert_int_equal(h_sdctl_run(args, env, 20000, out, sizeof out), 0);
    assert_non_null(h_line_with(out, "SERVICE", line, sizeof line));
    assert_null(strstr(line, "POOL"));
    assert_non_null(strstr(line, "COUNT"));
    const char *args2[] = {"--cluster", "no-such-cluster", "allocations", NULL};
    assert_int_equal(h_sdctl_run(args2, env, 20000, out, sizeof out), 4);
}

int main(void)
{
    h_init(180);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allocate_then_list_get_release),
        cmocka_unit_test(no_pool_no_pool_column),
    };
    return cmocka_run_group_tests(tests, setup, h_stack_teardown);
}
