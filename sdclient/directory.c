/* libsdclient: machines, processes and events (the directory). Names are checked here
 * so a bad one fails with SDC_E_INVAL before any request is sent. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdc_internal.h"
#include "sdproto.h"
#include "sdutil.h"

int sdc_machine_put(sdc_t *c, const char *cluster, const char *machine,
                    const sdc_machine_lease_t *lease, int64_t *expires_in_ms,
                    int64_t *registered_at_ms, sdc_err_t *err)
{
    int rc = sdc__names(err, 2, "cluster", cluster, "machine", machine);
    if (rc)
        return rc;
    json_t *body = json_object();
    if (lease) {
        if (lease->address)
            json_object_set_new(body, "address", json_string(lease->address));
        if (lease->labels)
            json_object_set(body, "labels", (json_t *)lease->labels);
        if (lease->capacity >= 0)
            json_object_set_new(body, "capacity", json_integer(lease->capacity));
        if (lease->version)
            json_object_set_new(body, "version", json_string(lease->version));
        if (lease->logs_port > 0)
            json_object_set_new(body, "logs_port", json_integer(lease->logs_port));
        if (lease->ttl_ms > 0)
            json_object_set_new(body, "ttl_ms", json_integer(lease->ttl_ms));
    }
    char path[SDC__PATH_MAX];
    sdc__cpath(path, sizeof path, cluster, "/machines/%s", machine);
    json_t *out = NULL;
    rc = sdc_request(c, "PUT", path, body, &out, err);
    json_decref(body);
    if (rc == SDC_OK) {
        json_t *e = json_object_get(out, "expires_in_ms");
        json_t *reg = json_object_get(out, "registered_at_ms");
        if (!json_is_integer(e))
            rc = sdc__proto(err, "no expires_in_ms in the answer");
        if (!rc && expires_in_ms)
            *expires_in_ms = json_integer_value(e);
        if (!rc && registered_at_ms)
            *registered_at_ms = json_integer_value(reg); /* 0 when not given */
    }
    json_decref(out);
    return rc;
}

int sdc_machines_list(sdc_t *c, const char *cluster, json_t **out, sdc_err_t *err)
{
    return sdc__cluster_walk(c, cluster, "/machines?limit=1000", "machines", 1000000, out, err);
}

int sdc_machine_get(sdc_t *c, const char *cluster, const char *machine, json_t **out,
                    sdc_err_t *err)
{
    return sdc__cluster_call(c, "GET", cluster, "machine", machine, NULL, out, err, "/machines/%s",
                             machine);
}

int sdc_machine_delete(sdc_t *c, const char *cluster, const char *machine, sdc_err_t *err)
{
    return sdc__cluster_call(c, "DELETE", cluster, "machine", machine, NULL, NULL, err,
                             "/machines/%s", machine);
}

int sdc_events_post(sdc_t *c, const char *cluster, const json_t *events, int *accepted,
                    int *duplicates, sdc_err_t *err)
{
    int rc = sdc__names(err, 1, "cluster", cluster);
    if (rc)
        return rc;
    if (!json_is_array(events) || json_array_size(events) == 0 ||
        json_array_size(events) > SD_EVENTS_MAX)
        return sdc__inval(err, "events must be an array of 1 to " SD_STR(SD_EVENTS_MAX) " events");
    char path[SDC__PATH_MAX];
    sdc__cpath(path, sizeof path, cluster, "/events");
    json_t *body = json_pack("{s:O}", "events", (json_t *)events);
    json_t *out = NULL;
    rc = sdc_request(c, "POST", path, body, &out, err);
    json_decref(body);
    if (rc == SDC_OK) {
        json_t *a = json_object_get(out, "accepted"), *d = json_object_get(out, "duplicates");
        if (!json_is_integer(a) || !json_is_integer(d)) {
            rc = sdc__proto(err, "no accepted/duplicates in the answer");
        } else {
            if (accepted)
                *accepted = (int)json_integer_value(a);
            if (duplicates)
                *duplicates = (int)json_integer_value(d);
        }
    }
    json_decref(out);
    return rc;
}

int sdc_processes_page(sdc_t *c, const char *cluster, const sdc_proc_filter_t *filter,
                       const char *after, int limit, json_t **out, sdc_err_t *err)
{
    *out = NULL;
    int rc = sdc__names(err, 1, "cluster", cluster);
    if (rc)
        return rc;
    char path[1400], esc[400];
    int n = snprintf(path, sizeof path, "/v1/clusters/%s/processes", cluster);
    char sep = '?';
    const char *keys[] = {"machine", "service", "state", "after"};
    const char *vals[] = {filter ? filter->machine : NULL, filter ? filter->service : NULL,
                          filter ? filter->state : NULL, after && *after ? after : NULL};
    for (int i = 0; i < 4; i++) {
        if (!vals[i])
            continue;
        if (strlen(vals[i]) > SD_NAME_MAX)
            return sdc__inval(err, "filter value too long");
        n += snprintf(path + n, sizeof path - (size_t)n, "%c%s=%s", sep, keys[i],
                      sdc_escape(vals[i], esc, sizeof esc));
        sep = '&';
    }
    if (limit > 0)
        snprintf(path + n, sizeof path - (size_t)n, "%climit=%d", sep, limit);
    return sdc_request(c, "GET", path, NULL, out, err);
}

/* Pages of the largest size until next is null, at most SDC_PROCS_MAX records. */
#define SDC_PROCS_PAGE 5000
#define SDC_PROCS_MAX 1000000

int sdc_processes_list(sdc_t *c, const char *cluster, const sdc_proc_filter_t *filter,
                       json_t **out, sdc_err_t *err)
{
    *out = NULL;
    json_t *all = json_array();
    char after[SD_NAME_MAX + 1] = "";
    json_int_t total = 0;
    int truncated = 0;
    for (;;) {
        json_t *page = NULL;
        int rc = sdc_processes_page(c, cluster, filter, after, SDC_PROCS_PAGE, &page, err);
        if (rc) {
            json_decref(all);
            return rc;
        }
        json_t *procs = json_object_get(page, "processes");
        if (json_is_array(procs))
            json_array_extend(all, procs);
        total = json_integer_value(json_object_get(page, "total"));
        const char *next = json_string_value(json_object_get(page, "next"));
        int more = next && *next && strlen(next) < sizeof after;
        if (more)
            snprintf(after, sizeof after, "%s", next);
        json_decref(page);
        if (!more)
            break;
        if (json_array_size(all) >= SDC_PROCS_MAX) {
            truncated = 1;
            break;
        }
    }
    *out = json_pack("{s:o, s:I, s:b}", "processes", all, "total", total, "truncated", truncated);
    return *out ? SDC_OK : sdc__inval(err, "out of memory");
}

int sdc_process_get(sdc_t *c, const char *cluster, const char *instance, json_t **out,
                    sdc_err_t *err)
{
    return sdc__cluster_call(c, "GET", cluster, "instance", instance, NULL, out, err,
                             "/processes/%s", instance);
}

/* GET .../events with since (NULL: the newest), limit (0: the default) and wait (0:
 * none, else since is required). */
static int events_get(sdc_t *c, const char *cluster, const char *since, int limit, int wait_ms,
                      json_t **out, sdc_err_t *err)
{
    *out = NULL;
    int rc = sdc__names(err, 1, "cluster", cluster);
    if (rc)
        return rc;
    char path[512], esc[200];
    int n = snprintf(path, sizeof path, "/v1/clusters/%s/events", cluster);
    char sep = '?';
    if (since) {
        if (strlen(since) > 64)
            return sdc__inval(err, "since is too long");
        n += snprintf(path + n, sizeof path - (size_t)n, "?since=%s",
                      sdc_escape(since, esc, sizeof esc));
        sep = '&';
    }
    if (limit > 0) {
        n += snprintf(path + n, sizeof path - (size_t)n, "%climit=%d", sep, limit);
        sep = '&';
    }
    if (wait_ms > 0)
        snprintf(path + n, sizeof path - (size_t)n, "%cwait=%d", sep, wait_ms);
    return sdc_request(c, "GET", path, NULL, out, err);
}

int sdc_events_list(sdc_t *c, const char *cluster, const char *since, int limit,
                    json_t **out, sdc_err_t *err)
{
    return events_get(c, cluster, since, limit, 0, out, err);
}

int sdc_events_wait(sdc_t *c, const char *cluster, const char *since, int limit, int wait_ms,
                    json_t **out, sdc_err_t *err)
{
    *out = NULL;
    if (!since || wait_ms < 1 || wait_ms > 30000)
        return sdc__inval(err, "an events wait needs since and wait_ms 1..30000");
    return events_get(c, cluster, since, limit, wait_ms, out, err);
}

int sdc_instance_credential(sdc_t *c, const char *cluster, const char *machine,
                            const char *instance, int64_t generation, char **jwt,
                            int64_t *expires_in_ms, sdc_err_t *err)
{
    *jwt = NULL;
    int rc = sdc__names(err, 3, "cluster", cluster, "machine", machine, "instance", instance);
    if (rc)
        return rc;
    json_t *body = json_object();
    if (generation >= 0)
        json_object_set_new(body, "generation", json_integer(generation));
    json_t *out = NULL;
    rc = sdc__cluster_call(c, "POST", cluster, NULL, NULL, body, &out, err,
                           "/machines/%s/instances/%s/credential", machine, instance);
    json_decref(body);
    if (rc)
        return rc;
    const char *cred = json_string_value(json_object_get(out, "credential"));
    json_t *left = json_object_get(out, "expires_in_ms");
    if (!cred || !*cred || strlen(cred) > SDC_CREDENTIAL_MAX || !json_is_integer(left))
        rc = sdc__proto(err, "the credential answer lacks credential/expires_in_ms");
    else if (!(*jwt = strdup(cred)))
        rc = SDC_E_NOMEM;
    else if (expires_in_ms)
        *expires_in_ms = json_integer_value(left);
    json_decref(out);
    return rc;
}
