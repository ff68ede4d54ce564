/* The wire contract's tables and the stop reason formatter (sdproto.h). */
#include "sdproto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define SD__PROTO_NAME(id, name) name,
static const char *const event_types[SD_EV_COUNT] = {SD_EVENT_TYPES(SD__PROTO_NAME)};
static const char *const stop_reasons[SD_STOP_COUNT] = {SD_STOP_REASONS(SD__PROTO_NAME)};
#undef SD__PROTO_NAME

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

int sd_name_valid(const char *s, size_t max)
{
    if (!s)
        return 0;
    size_t n = strlen(s);
    if (n == 0 || n > max || s[0] == '.' || s[0] == '-')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-' || c == ':' || c == '@';
        if (!ok)
            return 0;
    }
    return strstr(s, "..") == NULL;
}

/* Each reason shows at most one value: the one that explains it. */
size_t sd_reason_format(char *buf, size_t cap, const char *reason, int64_t code,
                        int64_t signal, int64_t silent_ms)
{
    const char *label = NULL, *unit = "";
    int64_t v = SD_REASON_NONE;
    if (!reason || !*reason)
        reason = "-";
    switch (sd_stop_reason_parse(reason)) {
    case SD_STOP_EXITED:
        label = "code";
        v = code;
        break;
    case SD_STOP_KILLED:
        label = "signal";
        v = signal;
        break;
    case SD_STOP_HUNG:
    case SD_STOP_START_TIMEOUT:
        label = "silent";
        unit = "ms";
        v = silent_ms;
        break;
    default:
        break;
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
