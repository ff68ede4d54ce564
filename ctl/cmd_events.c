/* sdctl events: the cluster's process event history (bounded, newest last). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"
#include "sdproto.h"
#include "sdutil.h"

SDCTL_CMD("events", cmd_events, "show the process event history (newest last)");

static const char usage_text[] =
    "usage: sdctl events [-f] [--since SEQ] [--limit N]\n"
    "  Shows process events (started, ready, stopped) newest last: the newest N (default\n"
    "  100, at most " SD_STR(SD_HISTORY_LIMIT_MAX) "), or with --since the ones after event SEQ (the SEQ column; -o\n"
    "  json also gives `last`, the SEQ to continue from).\n"
    "  -f, --follow   then keep printing new events as they are recorded (long-poll) until\n"
    "                 interrupted; with -o json, one JSON object per line.\n";

/* What matters of one event: the pid when it started, the reason ("killed(signal 9)")
 * and its detail when it stopped. */
static const char *event_detail(const json_t *e, char *buf, size_t cap)
{
    const char *type = json_string_value(json_object_get(e, "type"));
    const char *detail = json_string_value(json_object_get(e, "detail"));
    const json_t *pid = json_object_get(e, "pid");
    if (type && !strcmp(type, "stopped")) {
        char reason[SD_REASON_TEXT_MAX];
        sd_reason_format_json(reason, sizeof reason, e);
        snprintf(buf, cap, "%s%s%s", reason, detail ? ": " : "", detail ? detail : "");
    }
    else if (json_is_integer(pid))
        snprintf(buf, cap, "pid %lld", (long long)json_integer_value(pid));
    else
        snprintf(buf, cap, "-");
    return buf;
}

/* One event as a fixed-width line for --follow, where rows arrive over time. */
static void follow_line(const json_t *e, int64_t now)
{
    char seq[48], age[32], type[16], inst[160], svc[160], mach[160], det[400];
    const json_t *ts = json_object_get(e, "ts_ms");
    printf("%-18s %-6s %-8s %-24s %-12s %-12s %s\n",
           ctl_jstr(json_object_get(e, "seq"), seq, sizeof seq),
           json_is_integer(ts) ? ctl_fmt_ms(now - json_integer_value(ts), age, sizeof age) : "-",
           ctl_jstr(json_object_get(e, "type"), type, sizeof type),
           ctl_jstr(json_object_get(e, "instance"), inst, sizeof inst),
           ctl_jstr(json_object_get(e, "service"), svc, sizeof svc),
           ctl_jstr(json_object_get(e, "machine"), mach, sizeof mach), event_detail(e, det, sizeof det));
}

static void print_table(ctl_t *ctl, const json_t *events)
{
    int64_t now = sd_wall_ms();
    ctl_table_t *t = ctl_table_new(7, "SEQ", "AGE", "TYPE", "INSTANCE", "SERVICE", "MACHINE",
                                   "DETAIL");
    size_t i;
    const json_t *e;
    json_array_foreach(events, i, e) {
        char seq[48], age[32], type[16], inst[160], svc[160], mach[160], det[400];
        const json_t *ts = json_object_get(e, "ts_ms");
        ctl_table_row(t, ctl_jstr(json_object_get(e, "seq"), seq, sizeof seq),
                      json_is_integer(ts) ? ctl_fmt_ms(now - json_integer_value(ts), age, sizeof age)
                                          : NULL,
                      ctl_jstr(json_object_get(e, "type"), type, sizeof type),
                      ctl_jstr(json_object_get(e, "instance"), inst, sizeof inst),
                      ctl_jstr(json_object_get(e, "service"), svc, sizeof svc),
                      ctl_jstr(json_object_get(e, "machine"), mach, sizeof mach),
                      event_detail(e, det, sizeof det));
    }
    ctl_table_print(t, stdout, ctl->color);
}

#define FOLLOW_WAIT_MS 25000 /* one events long-poll waits at most this long */

/* --follow: prints the newest events, then the ones after the last seen as serverdir
 * records them (its events long-poll answers as soon as one comes), until interrupted.
 * -o json prints one compact JSON object per line. ServerDir being unreachable or
 * failing is reported once and waited out (tried again each second); any other error
 * ends it. */
static int follow(ctl_t *ctl, const char *since, int limit)
{
    sdc_t *waiter = sdc_new(ctl->url, ctl->token, FOLLOW_WAIT_MS + 10000);
    if (!waiter) {
        fprintf(stderr, "sdctl: out of memory\n");
        return CTL_EXIT_UNAVAILABLE;
    }
    char last[64] = "";
    if (since)
        snprintf(last, sizeof last, "%s", since);
    int down = 0;
    if (!ctl->json)
        printf("%-18s %-6s %-8s %-24s %-12s %-12s %s\n", "SEQ", "AGE", "TYPE", "INSTANCE",
               "SERVICE", "MACHINE", "DETAIL");
    for (;;) {
        json_t *ans = NULL;
        sdc_err_t err;
        int rc = last[0] ? sdc_events_wait(waiter, ctl->cluster, last, SD_HISTORY_LIMIT_MAX,
                                           FOLLOW_WAIT_MS, &ans, &err)
                         : sdc_events_list(ctl->client, ctl->cluster, NULL, limit, &ans, &err);
        if (rc == SDC_E_TRANSPORT || (rc == SDC_E_HTTP && err.status >= 500)) {
            if (!down) {
                char buf[512];
                fprintf(stderr, "sdctl: %s (still following)\n", sdc_strerror(rc, &err, buf, sizeof buf));
            }
            down = 1;
        } else if (rc != SDC_OK) {
            sdc_free(waiter);
            return ctl_fail_clear(rc, &err);
        } else {
            down = 0;
            int64_t now = sd_wall_ms();
            size_t i;
            const json_t *e;
            json_array_foreach(json_object_get(ans, "events"), i, e) {
                if (ctl->names) {
                    ctl_print_name("event", e, "seq");
                } else if (ctl->json) {
                    char *line = json_dumps(e, JSON_COMPACT);
                    if (line)
                        puts(line);
                    free(line);
                } else {
                    follow_line(e, now);
                }
            }
            const char *l = json_string_value(json_object_get(ans, "last"));
            if (l)
                snprintf(last, sizeof last, "%s", l);
            else if (!last[0])
                snprintf(last, sizeof last, "0-0"); /* an empty history: wait past its start */
            fflush(stdout);
        }
        sdc_err_clear(&err);
        json_decref(ans);
        if (down) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
    }
}

int cmd_events(ctl_t *ctl, int argc, char **argv)
{
    const char *since = NULL;
    int64_t limit = 0;
    int follow_mode = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return CTL_EXIT_OK;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--follow")) {
            follow_mode = 1;
        } else if (!strcmp(a, "--since") && i + 1 < argc) {
            since = argv[++i];
        } else if (!strcmp(a, "--limit") && i + 1 < argc) {
            if (sd_parse_i64(argv[++i], 1, SD_HISTORY_LIMIT_MAX, &limit))
                return ctl_usage("events", "--limit takes a number from 1 to "
                                           SD_STR(SD_HISTORY_LIMIT_MAX));
        } else {
            return ctl_usage("events", "unexpected or incomplete argument '%s'", a);
        }
    }
    if (follow_mode)
        return follow(ctl, since, (int)limit);
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_events_list(ctl->client, ctl->cluster, since, (int)limit, &ans, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    if (ctl->json)
        ctl_print_json(ans);
    else
        print_table(ctl, json_object_get(ans, "events"));
    json_decref(ans);
    return CTL_EXIT_OK;
}
