/* sdctl logs: an instance's output, from the bigbrother of its machine (its logs port,
 * registered with the machine lease), on any machine, without SSH. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "sdproto.h"

#define LOGS_SINCE_MAX_MS (720LL * 3600 * 1000) /* the logs port's since_ms bound: 30 days */

SDCTL_CMD("logs", cmd_logs, "an instance's output, live or after it stopped (-f follows)");

static const char usage_text[] =
    "usage: sdctl logs INSTANCE [--tail N] [--since DURATION] [--timestamps] [-f]\n"
    "  Prints the output (stdout and stderr) of one run of an instance: the last N lines\n"
    "  (default 100, or all with --since; 0: none, -f then shows only new lines; -1: all,\n"
    "  up to 10000), read from the bigbrother of its machine, which serves them on its\n"
    "  logs port (bigbrother's logs_listen; the machine registers it as logs_port). -f goes\n"
    "  on printing what the instance writes until it stops.\n"
    "  --timestamps prefixes each line with its time, UTC ISO 8601 in ms\n"
    "  (2026-11-28T07:20:01.250Z): the time it was written for the lines that come while\n"
    "  following; the process writes straight into its log, so the lines already there\n"
    "  carry the log's last write, the latest they can be from. --since DURATION (5s, 2m,\n"
    "  1h; at most 720h) leaves those out when the log was last written longer ago (they\n"
    "  are all older) and shows them otherwise (which are older cannot be told). A stopped\n"
    "  instance shows its last output while its machine's log still holds it. The token\n"
    "  is checked by ServerDir (a viewer token of the cluster is enough). Exit code 4 when\n"
    "  the instance or its log is unknown, 3 when its machine cannot be reached.\n";

static size_t to_stdout(const char *data, size_t len, void *arg)
{
    (void)arg;
    size_t n = fwrite(data, 1, len, stdout);
    fflush(stdout);
    return n;
}

int ctl_bb_url(ctl_t *ctl, const char *machine, const char *path, char *url, size_t cap,
               sdc_err_t *err)
{
    json_t *mach = NULL;
    int rc = sdc_machine_get(ctl->client, ctl->cluster, machine ? machine : "?", &mach, err);
    if (rc != SDC_OK)
        return rc;
    const char *addr = json_string_value(json_object_get(mach, "address"));
    const json_t *port = json_object_get(mach, "logs_port");
    if (!addr || !json_is_integer(port)) {
        json_decref(mach);
        return 1;
    }
    int v6 = strchr(addr, ':') != NULL;
    snprintf(url, cap, "http://%s%s%s:%lld%s", v6 ? "[" : "", addr, v6 ? "]" : "",
             (long long)json_integer_value(port), path);
    json_decref(mach);
    return SDC_OK;
}

int cmd_logs(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, usage_text))
        return CTL_EXIT_OK;
    const char *inst = NULL;
    long tail = -2; /* not given: 100, or all with --since */
    int follow = 0, stamps = 0;
    int64_t since = 0;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
            follow = 1;
        } else if (!strcmp(argv[i], "--timestamps")) {
            stamps = 1;
        } else if (!strcmp(argv[i], "--tail") && i + 1 < argc) {
            tail = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || tail < -1 || tail > 10000)
                return ctl_usage("logs", "--tail takes 0 to 10000 lines, or -1 for all");
        } else if (!strcmp(argv[i], "--since") && i + 1 < argc) {
            if (ctl_parse_ms(argv[++i], LOGS_SINCE_MAX_MS, &since) || since == 0)
                return ctl_usage("logs", "--since takes a duration such as 5s, 2m or 1h "
                                         "(at most 720h)");
        } else if (argv[i][0] != '-' && !inst) {
            inst = argv[i];
        } else {
            return ctl_usage("logs", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!inst)
        return ctl_usage("logs", "expected INSTANCE");
    if (!sd_name_valid(inst, SD_NAME_MAX))
        return ctl_usage("logs", "'%s' is not a valid instance name", inst);

    json_t *proc = NULL;
    sdc_err_t err;
    int rc = sdc_process_get(ctl->client, ctl->cluster, inst, &proc, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    char path[256], url[512];
    char tail_arg[24], since_arg[48];
    if (tail == -1 || (tail == -2 && since))
        snprintf(tail_arg, sizeof tail_arg, "all");
    else
        snprintf(tail_arg, sizeof tail_arg, "%ld", tail == -2 ? 100L : tail);
    snprintf(since_arg, sizeof since_arg, "&since_ms=%lld", (long long)since);
    snprintf(path, sizeof path, "/v1/logs/%s?tail=%s%s%s%s", inst, tail_arg,
             follow ? "&follow=1" : "", since ? since_arg : "", stamps ? "&timestamps=1" : "");
    const char *machine = json_string_value(json_object_get(proc, "machine"));
    rc = ctl_bb_url(ctl, machine, path, url, sizeof url, &err);
    if (rc == 1)
        fprintf(stderr, "sdctl: machine '%s' does not serve logs (set logs_listen in its "
                        "bigbrother config; then bbctl logs %s on it)\n", machine, inst);
    json_decref(proc);
    if (rc == 1)
        return CTL_EXIT_NOT_FOUND;
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    rc = sdc_stream(ctl->client, url, follow ? 0 : 30000, to_stdout, NULL, &err);
    if (rc == SDC_E_TRANSPORT) {
        fprintf(stderr, "sdctl: cannot reach the machine's bigbrother: %s\n", err.message);
        return CTL_EXIT_UNAVAILABLE;
    }
    if (rc == SDC_E_HTTP) {
        fprintf(stderr, "sdctl: %ld from the machine's bigbrother: %s\n", err.status, err.message);
        return err.status == 404                            ? CTL_EXIT_NOT_FOUND
               : err.status == 401 || err.status == 403     ? CTL_EXIT_AUTH
               : err.status >= 500                          ? CTL_EXIT_UNAVAILABLE
                                                            : CTL_EXIT_FAILED;
    }
    return rc == SDC_OK ? CTL_EXIT_OK : ctl_fail_clear(rc, &err);
}
