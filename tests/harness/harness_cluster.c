/* The cluster-mode integration tests' cluster: one redis-server, one serverdir and N
 * bigbrothers in cluster mode on this host, the ServerDir API as the operator uses it,
 * and what the directory and the bigbrothers show. */
#include "harness_cluster.h"
#include "harness_stack.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int cl_placement_interval_ms, cl_primary_ttl_ms;

int cl_ms(int ms)
{
    return h_valgrind() ? ms * 4 : ms;
}

/* Writes machine i's config: cluster mode, short leases for the tests. */
static void cl_config(cl_t *c, int i)
{
    bbt_t *b = &c->bb[i];
    snprintf(c->name[i], sizeof(c->name[i]), "m%d", i + 1);
    bbt_dirs(b);
    char *text = NULL;
    if (asprintf(&text,
                 "{\"machine\": \"%s\", \"cluster\": \"c1\", \"state_dir\": \"%s\","
                 " \"mode\": \"cluster\", \"capacity\": 100, \"labels\": {\"zone\": \"eu\"},"
                 " \"serverdir\": {\"urls\": [\"%s\"], \"token\": \"%s\"},"
                 " \"lease_ttl_ms\": %d, \"primary_ttl_ms\": %d,"
                 " \"placement_interval_ms\": %d, \"assignment_wait_ms\": 2000,"
                 " \"services\": []}",
                 c->name[i], b->state, c->sd.url, H_TOK_BB, cl_ms(3000),
                 cl_primary_ttl_ms ? cl_primary_ttl_ms : cl_ms(3000),
                 cl_placement_interval_ms ? cl_placement_interval_ms : 300) < 0)
        abort();
    snprintf(b->cfg, sizeof(b->cfg), "%s", h_write_file(b->dir, "bb.json", text, 0644));
    free(text);
}

void cl_start(cl_t *c, int n)
{
    memset(c, 0, sizeof(*c));
    if (h_stack_start(&c->redis, &c->sd, NULL))
        fail_msg("cannot start redis / serverdir");
    c->n = n;
    for (int i = 0; i < n; i++) {
        cl_config(c, i);
        if (bbt_start(&c->bb[i]) <= 0)
            fail_msg("bigbrother %d did not start (log %s)", i + 1, c->bb[i].log);
    }
}

json_t *cl_api(const char *method, const char *path, const char *body, long *status)
{
    h_resp_t r = {0};
    json_t *j = NULL;
    if (h_http_json(method, "", H_TOK_OPS, body, &r, "%s", path) == 0)
        j = h_resp_json(&r);
    if (status)
        *status = r.status;
    h_resp_free(&r);
    return j;
}

long cl_op(const cl_t *c, const char *method, const char *path, const char *body)
{
    char url[512];
    long st = 0;
    snprintf(url, sizeof(url), "%s%s%s", c->sd.url, CL_BASE, path);
    json_decref(cl_api(method, url, body, &st));
    return st;
}

json_t *cl_get(const cl_t *c, const char *path)
{
    char url[512];
    long st = 0;
    snprintf(url, sizeof(url), "%s%s%s", c->sd.url, CL_BASE, path);
    json_t *j = cl_api("GET", url, NULL, &st);
    if (st != 200) {
        json_decref(j);
        return NULL;
    }
    return j;
}

const char *cl_machine_state(const cl_t *c, int i)
{
    static char st[16];
    char path[160];
    snprintf(path, sizeof path, "/machines/%s", c->name[i]);
    json_t *m = cl_get(c, path);
    snprintf(st, sizeof st, "%s", m ? bbt_str(m, "state") : "");
    json_decref(m);
    return st;
}

long cl_service(const cl_t *c, const char *name, int n, const char *args, const char *extra)
{
    char body[1024], path[128];
    snprintf(body, sizeof(body),
             "{\"command\": \"%s\", \"args\": %s, \"count\": %d,"
             " \"health\": {\"type\": \"agent\", \"start_timeout_ms\": %d,"
             " \"liveness_timeout_ms\": %d}, \"stop\": {\"signal\": \"TERM\", \"grace_ms\": 3000}"
             " %s}",
             GAMEPROC, args ? args : "[\"--tick-hz\", \"10\"]", n, cl_ms(15000), cl_ms(8000), extra ? extra : "");
    snprintf(path, sizeof(path), "/services/%s", name);
    return cl_op(c, "PUT", path, body);
}

long cl_scale(const cl_t *c, const char *name, int n)
{
    char body[64], path[128];
    snprintf(body, sizeof(body), "{\"count\": %d}", n);
    snprintf(path, sizeof(path), "/services/%s/scale", name);
    return cl_op(c, "POST", path, body);
}

int cl_dir_count(const cl_t *c, const char *service, const char *state, const char *machine)
{
    char path[256];
    snprintf(path, sizeof(path), "/processes?service=%s%s%s", service,
             state ? "&state=" : "", state ? state : "");
    json_t *j = cl_get(c, path);
    if (!j)
        return -1;
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "processes"), i, p)
        if (!machine || !strcmp(bbt_str(p, "machine"), machine))
            n++;
    json_decref(j);
    return n;
}

int cl_running(const cl_t *c, int i, const char *service)
{
    json_t *st = bbt_ctl(&c->bb[i], "status");
    int n = 0;
    size_t k;
    json_t *in;
    json_array_foreach(json_object_get(st, "instances"), k, in)
        if (!strcmp(bbt_str(in, "service"), service) && bbt_int(in, "pid") > 0 &&
            bbt_alive((pid_t)bbt_int(in, "pid")))
            n++;
    json_decref(st);
    return n;
}

const char *cl_primary(const cl_t *c, long long *epoch)
{
    static char holder[64];
    holder[0] = 0;
    json_t *j = cl_get(c, "/primary");
    const char *h = json_string_value(json_object_get(j, "holder"));
    if (h)
        snprintf(holder, sizeof(holder), "%s", h);
    if (epoch)
        *epoch = json_integer_value(json_object_get(j, "epoch"));
    json_decref(j);
    return holder;
}

int cl_index(const cl_t *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->name[i], name))
            return i;
    return -1;
}

int cl_wait(cl_t *c, int (*fn)(cl_t *, void *), void *arg, int timeout_ms)
{
    int64_t end = h_now_ms() + timeout_ms;
    while (h_now_ms() < end) {
        if (fn(c, arg))
            return 1;
        h_sleep_ms(100);
    }
    return fn(c, arg);
}

int cl_converged(cl_t *c, void *arg)
{
    cl_conv_t *w = arg;
    if (cl_dir_count(c, w->service, "ready", NULL) != w->want ||
        cl_dir_count(c, w->service, NULL, NULL) != w->want)
        return 0;
    int n = 0;
    for (int i = 0; i < c->n; i++)
        if (!(w->skip & (1u << i)))
            n += cl_running(c, i, w->service);
    return n == w->want;
}

void cl_stop(cl_t *c)
{
    for (int i = 0; i < c->n; i++) {
        if (c->bb[i].pid <= 0)
            continue;
        kill(c->bb[i].pid, SIGCONT);
        bbt_stop(&c->bb[i], cl_ms(10000));
    }
    h_stack_stop(&c->redis, &c->sd);
}

