/* The wire contract's tables, the event check and the stop reason formatter (sdproto.h). */
#include "sdproto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define SD__PROTO_NAME(id, name) name,
#define SD__PROTO_NAME3(id, name, flags) name,
#define SD__PROTO_FLAGS3(id, name, flags) flags,
static const char *const event_types[SD_EV_COUNT] = {SD_EVENT_TYPES(SD__PROTO_NAME)};
static const char *const stop_reasons[SD_STOP_COUNT] = {SD_STOP_REASONS(SD__PROTO_NAME3)};
static const unsigned stop_flags[SD_STOP_COUNT] = {SD_STOP_REASONS(SD__PROTO_FLAGS3)};
#undef SD__PROTO_NAME
#undef SD__PROTO_NAME3
#undef SD__PROTO_FLAGS3

const char *sd_event_type_name(sd_event_type_t t)
{
    return (unsigned)t < SD_EV_COUNT ? event_types[t] : NULL;
}

const char *sd_stop_reason_name(sd_stop_reason_t r)
{
    return (unsigned)r < SD_STOP_COUNT ? stop_reasons[r] : NULL;
}

/* The index of s in names[0..n), or -1. */
static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int sd_event_type_parse(const char *s) { return name_index(s, event_types, SD_EV_COUNT); }

int sd_stop_reason_parse(const char *s) { return name_index(s, stop_reasons, SD_STOP_COUNT); }

unsigned sd_stop_reason_flags(sd_stop_reason_t r)
{
    return (unsigned)r < SD_STOP_COUNT ? stop_flags[r] : 0;
}

int sd_lock_token_valid(const char *s)
{
    if (!s)
        return 0;
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= SD_LOCK_TOKEN_LEN || !((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
            return 0;
    return n == SD_LOCK_TOKEN_LEN;
}

int sd_lock_name_valid(const char *s)
{
    if (!s)
        return 0;
    size_t n = strlen(s);
    const char *open = strchr(s, '{'), *close = strchr(s, '}');
    if (!open && !close)
        return sd_name_valid(s, SD_NAME_MAX);
    /* one hash tag: "{tag}rest", "a{tag}b": the tag a non-empty name */
    if (!open || !close || close < open + 2 || strchr(open + 1, '{') || strchr(close + 1, '}') ||
        n > SD_NAME_MAX || s[0] == '.' || s[0] == '-' || strstr(s, ".."))
        return 0;
    char tmp[SD_NAME_MAX + 1];
    size_t k = 0;
    for (const char *p = s; *p; p++)
        if (*p != '{' && *p != '}')
            tmp[k++] = *p;
    tmp[k] = '\0';
    char tag[SD_NAME_MAX + 1];
    memcpy(tag, open + 1, (size_t)(close - open - 1));
    tag[close - open - 1] = '\0';
    return sd_name_valid(tmp, SD_NAME_MAX) && sd_name_valid(tag, SD_NAME_MAX);
}

/* `ports`: absent, null, or an object of at most SD_PORTS_MAX name: 1..65535 entries. */
static int ev_ports(sd_jv_t *v, const json_t *ev)
{
    json_t *p = NULL;
    int rc = sd_jv_object(v, ev, "ports", SD_JV_OPTIONAL, &p);
    if (rc)
        return rc < 0 ? -1 : 0;
    if (json_object_size(p) > SD_PORTS_MAX)
        return sd_jv_fail(v, "ports", "must be an object of at most %d name: port entries",
                          SD_PORTS_MAX);
    const char *k;
    json_t *x = NULL;
    size_t mark = sd_jv_key(v, "ports");
    json_object_foreach(p, k, x) {
        int64_t port;
        if (!sd_name_valid(k, SD_PORT_NAME_MAX)) {
            sd_jv_pop(v, mark);
            return sd_jv_fail(v, "ports", "has a bad port name (1-%d characters of "
                              SD_NAME_CHARSET_TEXT ")", SD_PORT_NAME_MAX);
        }
        if (sd_jv_int(v, p, k, SD_JV_REQUIRED, 1, 65535, &port) < 0)
            return -1;
    }
    sd_jv_pop(v, mark);
    return 0;
}

/* Writes "a, b or c" / "a, b, c" of the names into buf. */
static void name_list(char *buf, size_t cap, const char *const *names, int n, const char *last)
{
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k < n && len < cap; k++) {
        const char *sep = k == 0 ? "" : k == n - 1 ? last : ", ";
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", sep, names[k]);
    }
}

int sd_event_check(sd_jv_t *v, const json_t *ev)
{
    static const char *const known[] = {"id", "type", "instance", "machine", "service",
                                        "pid", "ts_ms", "slot", "generation", "restarts",
                                        "ports", "reason", "code", "signal", "silent_ms",
                                        "detail", "log_tail", "core", "players",
                                        "max_players", "status", "allocation"};
    static const char *const stop_only[] = {"reason", "code", "signal", "silent_ms", "detail",
                                            "log_tail", "core"};
    static const struct {
        const char *key;
        int64_t min, max;
    } ints[] = {
        {"pid", 1, SD_PID_MAX},
        {"ts_ms", 0, 1LL << 53},
        {"slot", 0, 1000000},
        {"generation", 0, 1LL << 40},
        {"restarts", 0, 1LL << 40},
    }, stop_ints[] = {
        {"code", -255, 255},
        {"signal", 1, 64},
        {"silent_ms", 0, 1LL << 40},
    };
    char names[160];
    if (!json_is_object(ev))
        return sd_jv_fail(v, NULL, "must be an object");
    const char *k, *type, *reason, *detail, *id;
    int64_t num;
    json_t *x = NULL;
    json_object_foreach((json_t *)ev, k, x) {
        if (name_index(k, known, (int)(sizeof known / sizeof *known)) < 0)
            return sd_jv_fail(v, NULL, "has an unknown field '%.64s'", k);
    }
    if (sd_jv_name(v, ev, "id", SD_JV_REQUIRED, &id) ||
        sd_jv_str(v, ev, "type", SD_JV_REQUIRED, 16, &type))
        return -1;
    int t = sd_event_type_parse(type);
    if (t < 0) {
        name_list(names, sizeof names, event_types, SD_EV_COUNT, " or ");
        return sd_jv_fail(v, "type", "must be %s", names);
    }
    if (sd_jv_name(v, ev, "instance", SD_JV_REQUIRED, &id) ||
        sd_jv_name(v, ev, "machine", SD_JV_REQUIRED, &id) ||
        sd_jv_name(v, ev, "service", SD_JV_REQUIRED, &id))
        return -1;
    for (size_t n = 0; n < sizeof ints / sizeof *ints; n++)
        if (sd_jv_int(v, ev, ints[n].key, n == 0 && t == SD_EV_STARTED, ints[n].min,
                      ints[n].max, &num) < 0)
            return -1;
    if (ev_ports(v, ev))
        return -1;
    static const char *const status_only[] = {"players", "max_players", "status"};
    for (size_t n = 0; t != SD_EV_STATUS && n < sizeof status_only / sizeof *status_only; n++) {
        json_t *y = json_object_get(ev, status_only[n]);
        if (y && !json_is_null(y))
            return sd_jv_fail(v, status_only[n], "is only allowed in a status event");
    }
    json_t *al = json_object_get(ev, "allocation");
    if (al && !json_is_null(al) && t != SD_EV_CONFIRMED && t != SD_EV_RELEASED)
        return sd_jv_fail(v, "allocation", "is only allowed in a confirmed or released event");
    if (t == SD_EV_STATUS) {
        const char *st;
        if (sd_jv_int(v, ev, "players", SD_JV_OPTIONAL, 0, SD_PLAYERS_MAX, &num) < 0 ||
            sd_jv_int(v, ev, "max_players", SD_JV_OPTIONAL, 0, SD_PLAYERS_MAX, &num) < 0 ||
            sd_jv_str(v, ev, "status", SD_JV_OPTIONAL, SD_STATUS_MAX, &st) < 0)
            return -1;
    }
    if ((t == SD_EV_CONFIRMED || t == SD_EV_RELEASED) &&
        sd_jv_name(v, ev, "allocation", t == SD_EV_CONFIRMED ? SD_JV_REQUIRED : SD_JV_OPTIONAL,
                   &id) < 0)
        return -1;
    if (t != SD_EV_STOPPED) {
        for (size_t n = 0; n < sizeof stop_only / sizeof *stop_only; n++) {
            json_t *y = json_object_get(ev, stop_only[n]);
            if (y && !json_is_null(y))
                return sd_jv_fail(v, stop_only[n], "is only allowed in a stopped event");
        }
        return 0;
    }
    if (sd_jv_str(v, ev, "reason", SD_JV_REQUIRED, 32, &reason) < 0)
        return -1;
    if (sd_stop_reason_parse(reason) < 0) {
        name_list(names, sizeof names, stop_reasons, SD_STOP_COUNT, ", ");
        return sd_jv_fail(v, "reason", "must be one of %s", names);
    }
    for (size_t n = 0; n < sizeof stop_ints / sizeof *stop_ints; n++)
        if (sd_jv_int(v, ev, stop_ints[n].key, SD_JV_OPTIONAL, stop_ints[n].min,
                      stop_ints[n].max, &num) < 0)
            return -1;
    const char *tail, *core;
    return sd_jv_str(v, ev, "detail", SD_JV_OPTIONAL, SD_DETAIL_MAX, &detail) < 0 ||
                   sd_jv_str(v, ev, "log_tail", SD_JV_OPTIONAL, SD_LOG_TAIL_MAX, &tail) < 0 ||
                   sd_jv_str(v, ev, "core", SD_JV_OPTIONAL, SD_CORE_PATH_MAX, &core) < 0
               ? -1
               : 0;
}

/* Each reason shows at most one value: the one that explains it. */
size_t sd_reason_format(char *buf, size_t cap, const char *reason, int64_t code,
                        int64_t signal, int64_t silent_ms)
{
    const char *label = NULL, *unit = "";
    int64_t v = SD_REASON_NONE;
    if (!reason || !*reason)
        reason = "-";
    int r = sd_stop_reason_parse(reason);
    if (r == SD_STOP_EXITED) {
        label = "code";
        v = code;
    } else if (r == SD_STOP_KILLED) {
        label = "signal";
        v = signal;
    } else if (sd_stop_reason_flags((sd_stop_reason_t)r) & SD_STOP_F_SILENT) {
        label = "silent";
        unit = "ms";
        v = silent_ms;
    }
    int n = v == SD_REASON_NONE
                ? snprintf(buf, cap, "%s", reason)
                : snprintf(buf, cap, "%s(%s %" PRId64 "%s)", reason, label, v, unit);
    return n < 0 ? 0 : (size_t)n;
}

/* An integer field of rec, or SD_REASON_NONE. */
static int64_t int_field(const json_t *rec, const char *key)
{
    const json_t *v = json_object_get(rec, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : SD_REASON_NONE;
}

size_t sd_reason_format_json(char *buf, size_t cap, const json_t *rec)
{
    return sd_reason_format(buf, cap, json_string_value(json_object_get(rec, "reason")),
                            int_field(rec, "code"), int_field(rec, "signal"),
                            int_field(rec, "silent_ms"));
}
