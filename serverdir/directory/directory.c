/* Validation and conversion for the process directory and machine leases: what the
 * handlers check before any script runs, and how stored strings become typed JSON again.
 * See directory.h for the Redis layout. */
#include "directory.h"
#include "sdvalid.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sd_dir_config_t sd_dir_cfg = {
    .history_max = 10000,
    .stopped_keep = 10000,
    .stopped_ttl_ms = 24LL * 3600 * 1000,
    .event_id_ttl_ms = 24LL * 3600 * 1000,
    .machine_keep_ms = 24LL * 3600 * 1000,
};

int sd_dir_config_load(const json_t *section, char *err, size_t errcap)
{
    if (!section)
        return 0;
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (!json_is_object(section))
        return sd_jv_fail(&v, "directory", "must be an object");
    static const char *const keys[] = {"history_max", "stopped_keep", "stopped_ttl_s",
                                       "event_id_ttl_s", "machine_keep_s", NULL};
    if (sd_jv_only_keys(&v, section, keys))
        return -1;
    int64_t hist = sd_dir_cfg.history_max, keep = sd_dir_cfg.stopped_keep;
    int64_t sttl = sd_dir_cfg.stopped_ttl_ms / 1000, idttl = sd_dir_cfg.event_id_ttl_ms / 1000;
    int64_t mkeep = sd_dir_cfg.machine_keep_ms / 1000;
    if (sd_jv_int(&v, section, "history_max", 0, 10, 10000000, &hist) < 0 ||
        sd_jv_int(&v, section, "stopped_keep", 0, 10, 10000000, &keep) < 0 ||
        sd_jv_int(&v, section, "stopped_ttl_s", 0, 1, 30LL * 86400, &sttl) < 0 ||
        sd_jv_int(&v, section, "event_id_ttl_s", 0, 86400, 30LL * 86400, &idttl) < 0 ||
        sd_jv_int(&v, section, "machine_keep_s", 0, 1, 30LL * 86400, &mkeep) < 0)
        return -1;
    sd_dir_cfg.history_max = hist;
    sd_dir_cfg.stopped_keep = keep;
    sd_dir_cfg.stopped_ttl_ms = sttl * 1000;
    sd_dir_cfg.event_id_ttl_ms = idttl * 1000;
    sd_dir_cfg.machine_keep_ms = mkeep * 1000;
    return 0;
}

/* ---------- events ---------- */

static const char *const event_types[] = {"started", "ready", "stopped", NULL};
static const char *const stop_reasons[] = {
    "exited", "killed", "hung", "start_timeout", "crash_loop", "stopped_by_operator",
    "machine_lost", "drained", "replaced", "orphaned", NULL};

static int in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

/* The field validators below write "events[i].key ..." messages. Each returns 0 when
 * the field is present and valid, 1 when absent (or null where null is allowed), -1 on
 * a bad value. */
static int ev_str(const json_t *ev, int i, const char *key, int required, size_t maxlen,
                  const char **out, char *err, size_t cap)
{
    json_t *v = json_object_get(ev, key);
    if (!v || json_is_null(v)) {
        if (!required)
            return 1;
        snprintf(err, cap, "events[%d].%s is required", i, key);
        return -1;
    }
    if (!json_is_string(v)) {
        snprintf(err, cap, "events[%d].%s must be a string", i, key);
        return -1;
    }
    const char *s = json_string_value(v);
    if (json_string_length(v) > maxlen || strlen(s) != json_string_length(v)) {
        snprintf(err, cap, "events[%d].%s must be at most %zu bytes without NUL", i, key, maxlen);
        return -1;
    }
    *out = s;
    return 0;
}

static int ev_name(const json_t *ev, int i, const char *key, const char **out, char *err,
                   size_t cap)
{
    int rc = ev_str(ev, i, key, 1, SD_NAME_MAX, out, err, cap);
    if (rc)
        return rc;
    if (!sd_name_valid(*out, SD_NAME_MAX)) {
        snprintf(err, cap,
                 "events[%d].%s must be 1-%d characters of A-Z a-z 0-9 _ . : @ - "
                 "(not starting with '.' or '-', no '..')",
                 i, key, SD_NAME_MAX);
        return -1;
    }
    return 0;
}

static int ev_int(const json_t *ev, int i, const char *key, int required, int64_t min,
                  int64_t max, int64_t *out, char *err, size_t cap)
{
    json_t *v = json_object_get(ev, key);
    if (!v || json_is_null(v)) {
        if (!required)
            return 1;
        snprintf(err, cap, "events[%d].%s is required", i, key);
        return -1;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        snprintf(err, cap, "events[%d].%s must be an integer from %lld to %lld", i, key,
                 (long long)min, (long long)max);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

static void add_pair(json_t *flat, const char *k, const char *v)
{
    json_array_append_new(flat, json_string(k));
    json_array_append_new(flat, json_string(v));
}

static void add_int(json_t *flat, const char *k, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    add_pair(flat, k, buf);
}

/* Validates `ports` (object of name -> 1..65535) and adds it as compact JSON. */
static int ev_ports(const json_t *ev, int i, json_t *flat, char *err, size_t cap)
{
    json_t *p = json_object_get(ev, "ports");
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_object(p) || json_object_size(p) > SD_PORTS_MAX) {
        snprintf(err, cap, "events[%d].ports must be an object of at most %d name: port entries",
                 i, SD_PORTS_MAX);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach(p, k, v) {
        if (!sd_name_valid(k, 64)) {
            snprintf(err, cap, "events[%d].ports has a bad port name (1-64 characters of "
                               "A-Z a-z 0-9 _ . : @ -)", i);
            return -1;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535) {
            snprintf(err, cap, "events[%d].ports.%s must be an integer from 1 to 65535", i, k);
            return -1;
        }
    }
    char *s = json_dumps(p, JSON_COMPACT | JSON_SORT_KEYS);
    if (!s) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    add_pair(flat, "ports", s);
    free(s);
    return 0;
}

/* Validates events[i] and appends its flat string form to out. */
static int event_normalize(const json_t *ev, int i, json_t *out, char *err, size_t cap)
{
    static const char *const allowed[] = {"id", "type", "instance", "machine", "service",
                                          "pid", "ts_ms", "slot", "generation", "ports",
                                          "reason", "code", "signal", "silent_ms", "detail",
                                          NULL};
    if (!json_is_object(ev)) {
        snprintf(err, cap, "events[%d] must be an object", i);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)ev, k, v) {
        if (!in_list(k, allowed)) {
            snprintf(err, cap, "events[%d] has an unknown field '%.64s'", i, k);
            return -1;
        }
    }
    const char *id, *type, *inst, *machine, *service;
    if (ev_name(ev, i, "id", &id, err, cap) || ev_str(ev, i, "type", 1, 16, &type, err, cap))
        return -1;
    if (!in_list(type, event_types)) {
        snprintf(err, cap, "events[%d].type must be started, ready or stopped", i);
        return -1;
    }
    if (ev_name(ev, i, "instance", &inst, err, cap) ||
        ev_name(ev, i, "machine", &machine, err, cap) ||
        ev_name(ev, i, "service", &service, err, cap))
        return -1;
    int stopped = strcmp(type, "stopped") == 0;
    json_t *flat = json_array();
    add_pair(flat, "id", id);
    add_pair(flat, "type", type);
    add_pair(flat, "instance", inst);
    add_pair(flat, "machine", machine);
    add_pair(flat, "service", service);

    static const struct {
        const char *key;
        int64_t min, max;
    } ints[] = {
        {"pid", 1, SD_PID_MAX},
        {"ts_ms", 0, 1LL << 53},
        {"slot", 0, 1000000},
        {"generation", 0, 1LL << 40},
    };
    for (size_t n = 0; n < SD_ARRAY_LEN(ints); n++) {
        int64_t x;
        int required = n == 0 && strcmp(type, "started") == 0;
        int rc = ev_int(ev, i, ints[n].key, required, ints[n].min, ints[n].max, &x, err, cap);
        if (rc < 0)
            goto bad;
        if (rc == 0)
            add_int(flat, ints[n].key, x);
    }
    if (ev_ports(ev, i, flat, err, cap))
        goto bad;

    static const char *const stop_only[] = {"reason", "code", "signal", "silent_ms", "detail"};
    if (!stopped) {
        for (size_t n = 0; n < SD_ARRAY_LEN(stop_only); n++) {
            json_t *x = json_object_get(ev, stop_only[n]);
            if (x && !json_is_null(x)) {
                snprintf(err, cap, "events[%d].%s is only allowed in a stopped event", i,
                         stop_only[n]);
                goto bad;
            }
        }
    } else {
        const char *reason, *detail;
        if (ev_str(ev, i, "reason", 1, 32, &reason, err, cap) < 0)
            goto bad;
        if (!in_list(reason, stop_reasons)) {
            snprintf(err, cap, "events[%d].reason must be one of exited, killed, hung, "
                               "start_timeout, crash_loop, stopped_by_operator, machine_lost, "
                               "drained, replaced, orphaned", i);
            goto bad;
        }
        add_pair(flat, "reason", reason);
        int64_t x;
        int rc;
        if ((rc = ev_int(ev, i, "code", 0, -255, 255, &x, err, cap)) < 0)
            goto bad;
        if (rc == 0)
            add_int(flat, "code", x);
        if ((rc = ev_int(ev, i, "signal", 0, 1, 64, &x, err, cap)) < 0)
            goto bad;
        if (rc == 0)
            add_int(flat, "signal", x);
        if ((rc = ev_int(ev, i, "silent_ms", 0, 0, 1LL << 40, &x, err, cap)) < 0)
            goto bad;
        if (rc == 0)
            add_int(flat, "silent_ms", x);
        if ((rc = ev_str(ev, i, "detail", 0, SD_DETAIL_MAX, &detail, err, cap)) < 0)
            goto bad;
        if (rc == 0)
            add_pair(flat, "detail", detail);
    }
    json_array_append_new(out, flat);
    return 0;
bad:
    json_decref(flat);
    return -1;
}

int sd_dir_events_normalize(const json_t *body, char **out, size_t *nevents, char *err,
                            size_t errcap)
{
    *out = NULL;
    static const char *const top[] = {"events", NULL};
    if (sd_json_only_keys(body, top, err, errcap))
        return -1;
    json_t *evs = json_object_get(body, "events");
    if (!evs) {
        snprintf(err, errcap, "field 'events' is required");
        return -1;
    }
    if (!json_is_array(evs) || json_array_size(evs) == 0 ||
        json_array_size(evs) > SD_EVENTS_MAX) {
        snprintf(err, errcap, "field 'events' must be an array of 1 to %d events", SD_EVENTS_MAX);
        return -1;
    }
    json_t *norm = json_array();
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        if (event_normalize(ev, (int)i, norm, err, errcap)) {
            json_decref(norm);
            return -1;
        }
    }
    *out = json_dumps(norm, JSON_COMPACT);
    *nevents = json_array_size(norm);
    json_decref(norm);
    if (!*out) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    return 0;
}

/* ---------- machines ---------- */

/* An address: a host name or IP literal, [A-Za-z0-9.:-] and brackets, 1..255 bytes. */
static int address_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 255)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == ':' || c == '-' || c == '[' || c == ']' || c == '_'))
            return 0;
    }
    return 1;
}

int sd_dir_machine_args(const json_t *body, sd_argv_t *a, char *err, size_t errcap)
{
    static const char *const keys[] = {"address", "labels", "capacity", "version", "ttl_ms", NULL};
    int64_t ttl = 15000, capacity = 0;
    const char *address = NULL, *version = NULL;
    json_t *labels = NULL;
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (body && sd_jv_only_keys(&v, body, keys))
        return -1;
    if (sd_jv_int(&v, body, "ttl_ms", 0, 1000, 300000, &ttl) < 0)
        return -1;
    sd_argv_addf(a, "%lld", (long long)ttl);
    int rc = sd_jv_str(&v, body, "address", 0, 255, &address);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        if (!address_valid(address))
            return sd_jv_fail(&v, "address", "must be a host name or IP address");
        sd_argv_add(a, "address");
        sd_argv_add(a, address);
    }
    if ((rc = sd_jv_int(&v, body, "capacity", 0, 0, 1000000, &capacity)) < 0)
        return -1;
    if (rc == 0) {
        sd_argv_add(a, "capacity");
        sd_argv_addf(a, "%lld", (long long)capacity);
    }
    if ((rc = sd_jv_str(&v, body, "version", 0, 64, &version)) < 0)
        return -1;
    if (rc == 0) {
        sd_argv_add(a, "version");
        sd_argv_add(a, version);
    }
    if ((rc = sd_jv_object(&v, body, "labels", 0, &labels)) < 0)
        return -1;
    if (rc == 0) {
        if (json_object_size(labels) > SD_LABELS_MAX)
            return sd_jv_fail(&v, "labels", "must be an object of at most %d entries",
                              SD_LABELS_MAX);
        sd_jv_key(&v, "labels");
        const char *k;
        json_t *j;
        json_object_foreach(labels, k, j) {
            if (!sd_name_valid(k, 64))
                return sd_jv_fail(&v, NULL, "has a bad key (1-64 characters of "
                                            "A-Z a-z 0-9 _ . : @ -)");
            if (!json_is_string(j) || json_string_length(j) > 128 ||
                strlen(json_string_value(j)) != json_string_length(j))
                return sd_jv_fail(&v, k, "must be a string of at most 128 bytes");
        }
        char *s = json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS);
        if (!s) {
            snprintf(err, errcap, "out of memory");
            return -1;
        }
        sd_argv_add(a, "labels");
        sd_argv_addf(a, "%s", s);
        free(s);
    }
    return 0;
}

int sd_dir_events_apply(const char *cluster, const char *batch, long long counts[3])
{
    char base[256];
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_key(base, sizeof base, cluster, "%s", ""));
    sd_argv_add(&a, batch);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.event_id_ttl_ms);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.history_max);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.stopped_keep);
    sd_argv_addf(&a, "%lld", (long long)sd_dir_cfg.stopped_ttl_ms);
    redisReply *r = NULL;
    int rc = sd_store_script("events_apply", 1, &a, &r);
    sd_argv_free(&a);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3) {
        log_error("unexpected script reply", "script=%s type=%d", "events_apply", r->type);
        freeReplyObject(r);
        return SD_STORE_ERROR;
    }
    for (int i = 0; i < 3; i++)
        counts[i] = r->element[i]->integer;
    freeReplyObject(r);
    return SD_STORE_OK;
}

/* ---------- stored -> API JSON ---------- */

static const char *flat_get(const redisReply *flat, const char *key)
{
    for (size_t i = 0; i + 1 < flat->elements; i += 2)
        if (flat->element[i]->type == REDIS_REPLY_STRING &&
            strcmp(flat->element[i]->str, key) == 0 &&
            flat->element[i + 1]->type == REDIS_REPLY_STRING)
            return flat->element[i + 1]->str;
    return NULL;
}

static json_t *int_or_null(const char *s)
{
    int64_t v;
    if (!s || sd_parse_i64(s, INT64_MIN, INT64_MAX, &v))
        return json_null();
    return json_integer(v);
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *obj_or_null(const char *s)
{
    json_t *v = s ? json_loads(s, 0, NULL) : NULL;
    return v ? v : json_null();
}

json_t *sd_dir_proc_json(const redisReply *flat, const char *cluster)
{
    static const char *const ints[] = {"pid", "started_at_ms", "ready_at_ms", "stopped_at_ms",
                                       "generation", "slot", "code", "signal", "silent_ms",
                                       "updated_at_ms"};
    static const char *const strs[] = {"instance", "machine", "service", "state", "reason",
                                       "detail"};
    json_t *o = json_object();
    for (size_t i = 0; i < SD_ARRAY_LEN(strs); i++)
        json_object_set_new(o, strs[i], str_or_null(flat_get(flat, strs[i])));
    json_object_set_new(o, "cluster", json_string(cluster));
    for (size_t i = 0; i < SD_ARRAY_LEN(ints); i++)
        json_object_set_new(o, ints[i], int_or_null(flat_get(flat, ints[i])));
    json_object_set_new(o, "ports", obj_or_null(flat_get(flat, "ports")));
    return o;
}

json_t *sd_dir_machine_json(const char *name, const redisReply *flat, int64_t now_ms)
{
    int64_t expires = 0;
    const char *e = flat_get(flat, "expires_at_ms");
    if (e)
        sd_parse_i64(e, 0, INT64_MAX, &expires);
    int64_t left = expires - now_ms;
    json_t *o = json_object();
    json_object_set_new(o, "machine", json_string(name));
    json_object_set_new(o, "address", str_or_null(flat_get(flat, "address")));
    json_t *labels = obj_or_null(flat_get(flat, "labels"));
    json_object_set_new(o, "labels", json_is_null(labels) ? (json_decref(labels), json_object()) : labels);
    json_object_set_new(o, "capacity", int_or_null(flat_get(flat, "capacity")));
    json_object_set_new(o, "version", str_or_null(flat_get(flat, "version")));
    json_object_set_new(o, "state", json_string(left > 0 ? "live" : "lost"));
    json_object_set_new(o, "draining", json_boolean(flat_get(flat, "draining") != NULL));
    json_object_set_new(o, "expires_in_ms", json_integer(left > 0 ? left : 0));
    json_object_set_new(o, "ttl_ms", int_or_null(flat_get(flat, "ttl_ms")));
    json_object_set_new(o, "registered_at_ms", int_or_null(flat_get(flat, "registered_at_ms")));
    json_object_set_new(o, "renewed_at_ms", int_or_null(flat_get(flat, "renewed_at_ms")));
    return o;
}

json_t *sd_dir_event_json(const redisReply *entry)
{
    static const char *const ints[] = {"pid", "ts_ms", "slot", "generation", "code",
                                       "signal", "silent_ms"};
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING ||
        entry->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL;
    const redisReply *flat = entry->element[1];
    json_t *o = json_object();
    json_object_set_new(o, "seq", json_string(entry->element[0]->str));
    for (size_t i = 0; i + 1 < flat->elements; i += 2) {
        const redisReply *k = flat->element[i], *v = flat->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        int is_int = 0;
        for (size_t n = 0; n < SD_ARRAY_LEN(ints); n++)
            is_int |= strcmp(k->str, ints[n]) == 0;
        if (is_int)
            json_object_set_new(o, k->str, int_or_null(v->str));
        else if (strcmp(k->str, "ports") == 0)
            json_object_set_new(o, k->str, obj_or_null(v->str));
        else
            json_object_set_new(o, k->str, json_string(v->str));
    }
    return o;
}

int sd_dir_stream_id_valid(const char *s)
{
    const char *dash = strchr(s, '-');
    size_t n1 = dash ? (size_t)(dash - s) : strlen(s);
    if (n1 == 0 || n1 > 20 || strspn(s, "0123456789") != n1)
        return -1;
    if (!dash)
        return 0;
    size_t n2 = strlen(dash + 1);
    return n2 > 0 && n2 <= 20 && strspn(dash + 1, "0123456789") == n2 ? 0 : -1;
}
