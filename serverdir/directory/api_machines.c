/* Machine leases: a Big Brother registers its machine and renews the lease; readers see
 * each machine as live or lost (lease ran out), judged by the Redis clock inside the
 * scripts so every serverdir copy agrees. See directory.h for the Redis layout. */
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "sd.h"

SD_ROUTE(PUT, "/v1/clusters/{c}/machines/{m}", SD_R_BB, 0, h_machine_put);
SD_ROUTE(GET, "/v1/clusters/{c}/machines", SD_R_BB | SD_R_VIEWER, 0, h_machines_list);
SD_ROUTE(GET, "/v1/clusters/{c}/machines/{m}", SD_R_BB | SD_R_VIEWER, 0, h_machine_get);
SD_ROUTE(DELETE, "/v1/clusters/{c}/machines/{m}", SD_R_OPS, 0, h_machine_delete);
SD_ROUTE(GET, "/v1/clusters", SD_R_BB | SD_R_VIEWER, 0, h_clusters_list);

#define CLUSTERS_MAX 10000 /* names returned at most (SSCAN steps of 500) */

static int cmp_json_str(const void *a, const void *b)
{
    return strcmp(json_string_value(*(json_t *const *)a), json_string_value(*(json_t *const *)b));
}

/* Sorts arr's strings and drops repeats (SSCAN may return a member twice). */
static void sort_strings(json_t *arr)
{
    size_t n = json_array_size(arr);
    json_t **v = n > 1 ? malloc(n * sizeof *v) : NULL;
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(arr, i));
    qsort(v, n, sizeof *v, cmp_json_str);
    json_array_clear(arr);
    for (size_t i = 0; i < n; i++) {
        if (i && cmp_json_str(&v[i - 1], &v[i]) == 0)
            json_decref(v[i]);
        else
            json_array_append_new(arr, v[i]);
    }
    free(v);
}

/* The clusters that have had a machine lease (Pclusters, the lost-machine sweep's list),
 * sorted; a token bound to a cluster sees that one only. sdctl tells an unknown cluster
 * from an empty one with it. */
void h_clusters_list(sd_req_t *req, sd_resp_t *resp)
{
    char cursor[32] = "0";
    json_t *names = json_array();
    int truncated = 0;
    do {
        redisReply *r;
        int rc = sd_dir_clusters_step(cursor, sizeof cursor, 500, &r);
        if (rc) {
            json_decref(names);
            sd_resp_store_error(resp, rc);
            return;
        }
        redisReply *v = r->element[1];
        for (size_t i = 0; v->type == REDIS_REPLY_ARRAY && i < v->elements; i++) {
            const char *n = v->element[i]->str;
            if (req->auth.cluster[0] && strcmp(n, req->auth.cluster) != 0)
                continue;
            if (json_array_size(names) >= CLUSTERS_MAX)
                truncated = 1;
            else
                json_array_append_new(names, json_string(n));
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0 && !truncated);
    sort_strings(names);
    sd_resp_json(resp, 200, json_pack("{s:o, s:b}", "clusters", names, "truncated", truncated));
}

/* Registers or renews; the body is optional (an empty renewal keeps the stored fields). */
void h_machine_put(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *machine;
    if (sd_req_cluster_and(req, resp, &cluster, "machine", &machine) ||
        sd_req_may_machine(req, resp, cluster, machine))
        return;
    json_t *body = NULL;
    if (req->body.len && !(body = sd_req_json(req, resp)))
        return;
    char base[256], err[SD_ERRMSG_MAX];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_add(&a, machine);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.machine_keep_ms);
    int rc = sd_dir_machine_args(body, &a, err, sizeof err);
    if (rc) {
        sd_argv_free(&a);
        json_decref(body);
        sd_resp_error(resp, 400, "bad_field", "%s", err);
        return;
    }
    redisReply *r = NULL;
    rc = sd_store_run("machine_put", 1, &a, &r); /* a points into body until here */
    json_decref(body);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        sd_resp_store_error(resp, SD_STORE_ERROR);
        return;
    }
    int64_t registered = 0;
    sd_parse_i64(r->element[0]->str, 0, INT64_MAX, &registered);
    long long ttl = r->element[1]->integer;
    int fresh = r->element[2]->integer == 1;
    freeReplyObject(r);
    sd_dir_cluster_seen(cluster); /* the lost-machine sweep's list of clusters */
    if (fresh) {
        log_info("machine registered", "cluster=%s machine=%s ttl_ms=%lld", cluster, machine, ttl);
        SD_COUNT("serverdir_machine_registrations_total", "machine leases started (new or after expiry)", 1);
    }
    sd_resp_json(resp, 200, json_pack("{s:s, s:s, s:I, s:I}", "cluster", cluster,
                                      "machine", machine, "expires_in_ms", ttl,
                                      "registered_at_ms", (json_int_t)registered));
}

#define MACHINES_LIMIT_DEFAULT 500
#define MACHINES_LIMIT_MAX 1000
#define MACHINES_STEP 100 /* records per machine_list call: well under 1 ms of Redis */

/* Runs machine_list for one machine (name) or a page of all ("", after, limit), and
 * builds the JSON list; *next gets the cursor of the next page ("" on the last). */
static int machines_read(sd_resp_t *resp, const char *cluster, const char *name,
                         const char *after, int64_t limit, json_t **list,
                         char *next, size_t nextcap)
{
    char base[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_add(&a, name);
    sd_argv_add(&a, after);
    sd_argv_addf(&a, "%lld", (long long)limit);
    redisReply *r = NULL;
    int rc = sd_store_run("machine_list", 1, &a, &r);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return -1;
    }
    int64_t now = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        sd_parse_i64(r->element[0]->str, 0, INT64_MAX, &now)) {
        freeReplyObject(r);
        sd_resp_store_error(resp, SD_STORE_ERROR);
        return -1;
    }
    sd_strlcpy(next, r->element[1]->str, nextcap);
    *list = json_array();
    for (size_t i = 2; i < r->elements; i++) {
        redisReply *m = r->element[i];
        if (m->type != REDIS_REPLY_ARRAY || m->elements < 1 ||
            m->element[0]->type != REDIS_REPLY_STRING)
            continue;
        /* The record's flat field list starts after the name. */
        redisReply flat = *m;
        flat.element = m->element + 1;
        flat.elements = m->elements - 1;
        json_array_append_new(*list, sd_dir_machine_json(m->element[0]->str, &flat, now));
    }
    freeReplyObject(r);
    return 0;
}

/* GET /machines[?after=NAME&limit=N] -> {machines:[...], next}: one page in name order;
 * pass next as after for the following page, null on the last. */
void h_machines_list(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster;
    int64_t limit;
    json_t *list;
    char next[SD_NAME_MAX + 1];
    const char *after;
    if (sd_req_page(req, resp, &cluster, MACHINES_LIMIT_MAX, MACHINES_LIMIT_DEFAULT, &limit,
                    &after))
        return;
    char cursor[SD_NAME_MAX + 1];
    sd_strlcpy(cursor, after, sizeof cursor);
    json_t *all = json_array();
    do {
        int64_t want = limit - (int64_t)json_array_size(all);
        if (machines_read(resp, cluster, "", cursor, want < MACHINES_STEP ? want : MACHINES_STEP,
                          &list, next, sizeof next)) {
            json_decref(all);
            return;
        }
        json_array_extend(all, list);
        json_decref(list);
        sd_strlcpy(cursor, next, sizeof cursor);
    } while (next[0] && (int64_t)json_array_size(all) < limit);
    list = all;
    sd_resp_json(resp, 200, json_pack("{s:o, s:o}", "machines", list, "next",
                                      next[0] ? json_string(next) : json_null()));
}

void h_machine_get(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *machine;
    json_t *list;
    char next[SD_NAME_MAX + 1];
    if (sd_req_cluster_and(req, resp, &cluster, "machine", &machine) ||
        machines_read(resp, cluster, machine, "", 1, &list, next, sizeof next))
        return;
    if (json_array_size(list) == 0) {
        json_decref(list);
        sd_resp_error(resp, 404, "not_found", "no machine '%s' in cluster '%s'", machine,
                      cluster);
        return;
    }
    json_t *m = json_incref(json_array_get(list, 0));
    json_decref(list);
    sd_resp_json(resp, 200, m);
}

void h_machine_delete(sd_req_t *req, sd_resp_t *resp)
{
    const char *cluster, *machine;
    if (sd_req_cluster_and(req, resp, &cluster, "machine", &machine))
        return;
    char base[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_add(&a, machine);
    redisReply *r = NULL;
    int rc = sd_store_run("machine_delete", 1, &a, &r);
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    long long known = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    if (known < 0) {
        sd_resp_store_error(resp, SD_STORE_ERROR);
        return;
    }
    if (!known) {
        sd_resp_error(resp, 404, "not_found", "no machine '%s' in cluster '%s'", machine,
                      cluster);
        return;
    }
    log_info("machine deleted", "cluster=%s machine=%s", cluster, machine);
    sd_resp_empty(resp, 204);
}
