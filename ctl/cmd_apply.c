/* sdctl apply: declare services from a file, showing what changes per service. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "sdjson.h"
#include "sdutil.h"
#include "sdvalid.h"

SDCTL_CMD("apply", cmd_apply, "create or update services from a JSON file, showing the changes");

#define FILE_MAX (8 << 20)

static const char usage_text[] =
    "usage: sdctl apply -f FILE [--dry-run]\n"
    "  FILE (or - for stdin) holds {\"services\": {\"NAME\": SPEC, ...}} or an array of\n"
    "  specs that each carry a \"name\". Every service is first checked with a dry run\n"
    "  that prints what would change (\"count: 3 -> 5\"); when all are valid, the changed\n"
    "  ones are stored. Services not in the file are left alone (sdctl delete removes).\n"
    "  --dry-run   only show the changes.\n"
    "  Exit codes: 0 applied (or nothing to change), 1 a spec was refused (nothing was\n"
    "  stored), 2 usage or an unreadable file, 3 ServerDir unreachable.\n";

/* Reads FILE into {name: spec}; NULL with a message on stderr. */
static json_t *load_services(const char *path)
{
    char *text = NULL, err[256];
    size_t len = 0;
    int rc = strcmp(path, "-") ? sd_read_file(path, FILE_MAX, &text, &len)
                               : sd_read_fd(STDIN_FILENO, FILE_MAX, &text, &len);
    if (rc) {
        fprintf(stderr, "sdctl apply: cannot read %s\n", path);
        return NULL;
    }
    json_t *out = ctl_apply_parse(text, len, err, sizeof err);
    free(text);
    if (!out)
        fprintf(stderr, "sdctl apply: %s: %s\n", path, err);
    return out;
}

json_t *ctl_apply_parse(const char *text, size_t len, char *err, size_t errcap)
{
    static const char *const top[] = {"services", NULL};
    json_t *doc = sd_json_parse(text, len, SD_JSON_MAX_DEPTH, err, errcap);
    if (!doc)
        return NULL;
    json_t *out = json_object(), *services = NULL;
    sd_jv_t v;
    sd_jv_init(&v, "", err, errcap);
    if (json_is_object(doc)) {
        if (sd_jv_only_keys(&v, doc, top) || sd_jv_object(&v, doc, "services", 1, &services))
            goto bad;
        json_object_update(out, services);
    } else if (json_is_array(doc)) {
        size_t i;
        json_t *s;
        json_array_foreach(doc, i, s) {
            const char *name = NULL;
            size_t mark = sd_jv_index(&v, i);
            if (!json_is_object(s)) {
                sd_jv_fail(&v, NULL, "must be a spec object");
                goto bad;
            }
            if (sd_jv_str(&v, s, "name", 1, FILE_MAX, &name))
                goto bad;
            sd_jv_pop(&v, mark);
            json_t *spec = json_deep_copy(s);
            json_object_del(spec, "name");
            json_object_set_new(out, name, spec);
        }
    } else {
        sd_jv_fail(&v, NULL, "must be {\"services\": {...}} or an array of specs");
        goto bad;
    }
    json_decref(doc);
    return out;
bad:
    json_decref(doc);
    json_decref(out);
    return NULL;
}

/* "NAME: unchanged (version V)" or "NAME: N change(s)" and one line per change. */
static void print_plan(const char *name, const json_t *plan)
{
    const json_t *changes = json_object_get(plan, "changes");
    size_t n = json_array_size(changes);
    if (n == 0) {
        printf("%s: unchanged (version %lld)\n", name,
               (long long)json_integer_value(json_object_get(plan, "version")));
        return;
    }
    printf("%s: %zu change%s\n", name, n, n == 1 ? "" : "s");
    size_t i;
    const json_t *c;
    json_array_foreach(changes, i, c) printf("  %s\n", json_string_value(c));
}

int cmd_apply(ctl_t *ctl, int argc, char **argv)
{
    const char *file = NULL;
    int dry = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return CTL_EXIT_OK;
        }
        if (!strcmp(argv[i], "--dry-run"))
            dry = 1;
        else if ((!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) && i + 1 < argc)
            file = argv[++i];
        else
            return ctl_usage("apply", "unexpected argument '%s'", argv[i]);
    }
    if (!file)
        return ctl_usage("apply", "-f FILE is required");
    json_t *services = load_services(file);
    if (!services)
        return CTL_EXIT_USAGE;
    json_t *report = json_object(), *plans = json_object();
    int rc = CTL_EXIT_OK;
    const char *name;
    json_t *spec;
    /* Every service is checked first, so a bad one stops the whole apply. */
    json_object_foreach(services, name, spec) {
        json_t *ans = NULL;
        sdc_err_t err;
        int r = sdc_service_put(ctl->client, ctl->cluster, name, spec, 1, &ans, &err);
        if (r != SDC_OK) {
            fprintf(stderr, "sdctl apply: service %s: ", name);
            rc = ctl_fail_clear(r, &err);
            goto out;
        }
        json_object_set_new(plans, name, ans);
    }
    int changed = 0, unchanged = 0;
    json_object_foreach(services, name, spec) {
        json_t *plan = json_object_get(plans, name);
        if (json_array_size(json_object_get(plan, "changes")) == 0 || dry) {
            unchanged += json_array_size(json_object_get(plan, "changes")) == 0;
            json_object_set(report, name, plan);
            if (!ctl->json)
                print_plan(name, plan);
            continue;
        }
        json_t *ans = NULL;
        sdc_err_t err;
        int r = sdc_service_put(ctl->client, ctl->cluster, name, spec, 0, &ans, &err);
        if (r != SDC_OK) {
            fprintf(stderr, "sdctl apply: service %s: ", name);
            rc = ctl_fail_clear(r, &err);
            goto out;
        }
        changed++;
        if (!ctl->json) {
            print_plan(name, plan);
            printf("  -> stored as version %lld\n",
                   (long long)json_integer_value(json_object_get(ans, "version")));
        }
        json_object_set_new(report, name, ans);
    }
    if (ctl->json)
        ctl_print_json(report);
    else if (dry)
        printf("dry run: %zu service(s), %d unchanged; nothing stored\n",
               json_object_size(services), unchanged);
    else
        printf("applied %d service(s), %d unchanged\n", changed, unchanged);
out:
    json_decref(plans);
    json_decref(report);
    json_decref(services);
    return rc;
}
