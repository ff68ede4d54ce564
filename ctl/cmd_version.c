/* sdctl version: this sdctl's version and that of the serverdir it talks to. */
#include <stdio.h>

#include "ctl.h"
#include "sdversion.h"

SDCTL_CMD("version", cmd_version, "print sdctl's version and the serverdir's it reaches");

static const char usage_text[] =
    "usage: sdctl version\n"
    "  Prints sdctl's version, then the version of the serverdir that answers at the\n"
    "  configured URL (GET /healthz; exit code 3 when none answers). sdctl --version\n"
    "  prints sdctl's alone without contacting anything.\n";

int cmd_version(ctl_t *ctl, int argc, char **argv)
{
    int early = ctl_no_args(argc, argv, "version", usage_text);
    if (early >= 0)
        return early;
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_request(ctl->client, "GET", "/healthz", NULL, &ans, &err);
    const char *v = rc == SDC_OK ? json_string_value(json_object_get(ans, "version")) : NULL;
    if (ctl->json) {
        json_t *o = json_pack("{s:s, s:s?}", "sdctl", SD_VERSION, "serverdir", v);
        ctl_print_json(o);
        json_decref(o);
    } else {
        printf("sdctl %s\n", SD_VERSION);
        if (rc == SDC_OK)
            printf("serverdir %s\n", v ? v : "(did not say)");
    }
    json_decref(ans);
    return rc == SDC_OK ? CTL_EXIT_OK : ctl_fail_clear(rc, &err);
}
