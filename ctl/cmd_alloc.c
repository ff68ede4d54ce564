/* sdctl allocate, allocations: take a ready instance of a warm pool for a match, list,
 * read and end allocations (docs/allocation.md). ServerDir picks the instance in one
 * script; the game learns it through its shim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "sdproto.h"
#include "sdutil.h"

SDCTL_CMD("allocate", cmd_allocate, "allocate a ready instance of a service (warm pools)");
SDCTL_CMD("allocations", cmd_allocations, "list allocations, get one, release one");

#define PAYLOAD_SHOWN 60 /* bytes of the payload in -o wide */

static const char allocate_usage[] =
    "usage: sdctl allocate SERVICE [--join] [--players N] [--strategy packed|distributed]\n"
    "                      [--label K=V]... [--meta K=V]... [--payload JSON] [--key KEY]\n"
    "                      [--wait DURATION]\n"
    "  Takes a ready, unallocated instance of SERVICE for a match (docs/allocation.md) and\n"
    "  prints where it runs: the ALLOCATION id, its STATE (pending until the game\n"
    "  acknowledges it, then active), INSTANCE, MACHINE, ADDRESS and PORTS. -o wide adds\n"
    "  MODE, PLAYERS, KEY and PAYLOAD; -o json the allocation as ServerDir answers it.\n"
    "  --join            a running instance, allocated or not, with --players free player\n"
    "                    slots (default 1), which are reserved (how a realm fills zones)\n"
    "  --players N       free player slots the instance must report (default 0; --join 1)\n"
    "  --strategy S      packed (default: fill machines before opening others) or\n"
    "                    distributed (the machine with the fewest allocated first)\n"
    "  --label K=V       the machine must carry label K=V (repeatable)\n"
    "  --meta K=V        the instance's status line must carry K=V (repeatable)\n"
    "  --payload JSON    any JSON value, at most " SD_STR(SD_ALLOC_PAYLOAD_MAX)
    " bytes compact, handed to the game\n"
    "  --key KEY         idempotency key: the same KEY within 24 h answers the same\n"
    "                    allocation again (\"replayed\" on stderr)\n"
    "  --wait DURATION   when nothing matches, wait up to DURATION for an instance to\n"
    "                    become ready (milliseconds, or 500ms, 2s, 1m; at most 60s)\n"
    "  Exit codes: 5 when nothing matches (no_capacity; the message names the selector)\n"
    "  or KEY was used for a different request (idempotency_conflict), 4 when SERVICE\n"
    "  does not exist, 1 for a request ServerDir refuses (bad_field).\n";

static const char allocations_usage[] =
    "usage: sdctl allocations [list] [--service S] [--limit N] [--after ID] [--all]\n"
    "       sdctl allocations get ID\n"
    "       sdctl allocations release ID\n"
    "  list (the default): the open allocations and the ones that ended in the last hour,\n"
    "  oldest first: ALLOCATION, STATE (pending, active, released, expired,\n"
    "  allocation_lost), SERVICE, INSTANCE, MACHINE, AGE (since it was made) and REASON\n"
    "  (why it ended). One page of N (default 100, at most 1000) and the command for the\n"
    "  next; --after ID continues after allocation ID, --all walks every page. -o wide\n"
    "  adds MODE, PLAYERS, ADDRESS, PORTS, KEY and PAYLOAD.\n"
    "  get ID       one allocation (exit code 4 when unknown or ended over an hour ago)\n"
    "  release ID   ends it (state released, reason api): the game is told and its\n"
    "               instance goes back to the pool; one that had ended is left as it is.\n";

/* ---------- rows ---------- */

/* The payload as compact JSON, cut to PAYLOAD_SHOWN bytes ("..." then); NULL for none. */
static const char *payload_text(const json_t *a, char *buf, size_t cap)
{
    const json_t *p = json_object_get(a, "payload");
    if (!p || json_is_null(p))
        return NULL;
    char *s = json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return NULL;
    if (strlen(s) > PAYLOAD_SHOWN)
        snprintf(buf, cap, "%.*s...", PAYLOAD_SHOWN - 3, s);
    else
        snprintf(buf, cap, "%s", s);
    free(s);
    return buf;
}

/* Which columns a table of allocations has. */
enum alloc_view {
    VIEW_ALLOCATE, /* where it runs: ... ADDRESS PORTS */
    VIEW_LIST,     /* how it goes: ... AGE REASON */
};

static ctl_table_t *alloc_table(enum alloc_view v, int wide)
{
    if (v == VIEW_ALLOCATE)
        return wide ? ctl_table_new(11, "ALLOCATION", "STATE", "SERVICE", "INSTANCE", "MACHINE",
                                    "ADDRESS", "PORTS", "MODE", "PLAYERS", "KEY", "PAYLOAD")
                    : ctl_table_new(7, "ALLOCATION", "STATE", "SERVICE", "INSTANCE", "MACHINE",
                                    "ADDRESS", "PORTS");
    return wide ? ctl_table_new(13, "ALLOCATION", "STATE", "SERVICE", "INSTANCE", "MACHINE", "AGE",
                                "REASON", "MODE", "PLAYERS", "ADDRESS", "PORTS", "KEY", "PAYLOAD")
                : ctl_table_new(7, "ALLOCATION", "STATE", "SERVICE", "INSTANCE", "MACHINE", "AGE",
                                "REASON");
}

/* One allocation as a row of alloc_table(v, wide). */
static void alloc_row(ctl_table_t *t, const json_t *a, enum alloc_view v, int wide, int64_t now)
{
    char id[160], state[32], svc[160], inst[160], mach[160], addr[300], ports[256], age[32];
    char reason[300], mode[16], players[24], key[160], payload[PAYLOAD_SHOWN + 1];
    const json_t *created = json_object_get(a, "created_at_ms");
    const char *c_id = ctl_jstr(json_object_get(a, "allocation"), id, sizeof id),
               *c_state = ctl_jstr(json_object_get(a, "state"), state, sizeof state),
               *c_svc = ctl_jstr(json_object_get(a, "service"), svc, sizeof svc),
               *c_inst = ctl_jstr(json_object_get(a, "instance"), inst, sizeof inst),
               *c_mach = ctl_jstr(json_object_get(a, "machine"), mach, sizeof mach),
               *c_addr = ctl_jstr(json_object_get(a, "address"), addr, sizeof addr),
               *c_ports = ctl_kv_text(json_object_get(a, "ports"), ports, sizeof ports),
               *c_age = json_is_integer(created)
                            ? ctl_fmt_ms(now - json_integer_value(created), age, sizeof age)
                            : NULL,
               *c_reason = ctl_jstr(json_object_get(a, "reason"), reason, sizeof reason),
               *c_mode = ctl_jstr(json_object_get(a, "mode"), mode, sizeof mode),
               *c_players = ctl_jstr(json_object_get(a, "players"), players, sizeof players),
               *c_key = ctl_jstr(json_object_get(a, "idempotency_key"), key, sizeof key),
               *c_payload = payload_text(a, payload, sizeof payload);
    if (v == VIEW_ALLOCATE && wide)
        ctl_table_row(t, c_id, c_state, c_svc, c_inst, c_mach, c_addr, c_ports, c_mode,
                      c_players, c_key, c_payload);
    else if (v == VIEW_ALLOCATE)
        ctl_table_row(t, c_id, c_state, c_svc, c_inst, c_mach, c_addr, c_ports);
    else if (wide)
        ctl_table_row(t, c_id, c_state, c_svc, c_inst, c_mach, c_age, c_reason, c_mode,
                      c_players, c_addr, c_ports, c_key, c_payload);
    else
        ctl_table_row(t, c_id, c_state, c_svc, c_inst, c_mach, c_age, c_reason);
}

/* One allocation as a table of one row; arg is its view (VIEW_ALLOCATE or VIEW_LIST). */
static void alloc_print(const ctl_t *ctl, const json_t *a, const void *arg)
{
    enum alloc_view v = *(const enum alloc_view *)arg;
    ctl_table_t *t = alloc_table(v, ctl->wide);
    alloc_row(t, a, v, ctl->wide, sd_wall_ms());
    ctl_table_print(t, stdout, ctl->color);
}

/* ---------- allocate ---------- */

/* Adds "K=V" to obj (created on first use) for the option opt. 0, or a usage error. */
static int add_pair(json_t **obj, const char *opt, const char *kv)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return ctl_usage("allocate", "%s takes K=V, not '%s'", opt, kv);
    char k[SD_NAME_MAX + 1];
    if ((size_t)(eq - kv) > SD_NAME_MAX)
        return ctl_usage("allocate", "%s: the name '%.*s...' is too long", opt, 32, kv);
    snprintf(k, sizeof k, "%.*s", (int)(eq - kv), kv);
    if (!*obj)
        *obj = json_object();
    if (json_object_get(*obj, k))
        return ctl_usage("allocate", "%s %s given twice", opt, k);
    json_object_set_new(*obj, k, json_string(eq + 1));
    return 0;
}

/* The end of a refused allocation: the error (the whole no_capacity message, which names
 * the selector, with how many instances were looked at) and its exit code. */
static int allocate_fail(int rc, sdc_err_t *err, int64_t wait_ms)
{
    const json_t *e = json_object_get(err->body, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (rc == SDC_E_HTTP && err->status == 409 && !strcmp(err->code, "no_capacity")) {
        fprintf(stderr, "sdctl: 409 no_capacity: %s\n", msg ? msg : err->message);
        if (wait_ms > 0)
            fprintf(stderr, "sdctl: none became ready in %lld ms\n", (long long)wait_ms);
        else
            fprintf(stderr, "sdctl: %lld candidate(s) looked at; --wait DURATION waits for "
                            "an instance to become ready\n",
                    (long long)json_integer_value(json_object_get(e, "looked_at")));
        sdc_err_clear(err);
        return CTL_EXIT_CONFLICT;
    }
    const char *prev = json_string_value(json_object_get(e, "allocation"));
    int is_conflict = rc == SDC_E_HTTP && !strcmp(err->code, "idempotency_conflict") && prev;
    char hint[200];
    if (is_conflict)
        snprintf(hint, sizeof hint, "sdctl: `sdctl allocations get %s` shows it; another --key "
                 "makes a new allocation\n", prev);
    int ex = ctl_fail_clear(rc, err);
    if (is_conflict)
        fputs(hint, stderr);
    return ex;
}

int cmd_allocate(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, allocate_usage))
        return CTL_EXIT_OK;
    sdc_alloc_req_t req = {.players = -1};
    json_t *labels = NULL, *meta = NULL, *payload = NULL;
    int ex = CTL_EXIT_OK;
    for (int i = 1; i < argc && ex == CTL_EXIT_OK; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--players") || !strcmp(a, "--strategy") || !strcmp(a, "--label") ||
                    !strcmp(a, "--meta") || !strcmp(a, "--payload") || !strcmp(a, "--key") ||
                    !strcmp(a, "--wait");
        if (takes && !v) {
            ex = ctl_usage("allocate", "%s needs a value", a);
            break;
        }
        if (takes)
            i++;
        if (!strcmp(a, "--join")) {
            req.join = 1;
        } else if (!strcmp(a, "--players")) {
            if (sd_parse_i64(v, 0, SD_PLAYERS_MAX, &req.players))
                ex = ctl_usage("allocate", "--players takes a number 0-" SD_STR(SD_PLAYERS_MAX));
        } else if (!strcmp(a, "--strategy")) {
            req.strategy = v;
            if (strcmp(v, "packed") && strcmp(v, "distributed"))
                ex = ctl_usage("allocate", "--strategy takes packed or distributed");
        } else if (!strcmp(a, "--label")) {
            ex = add_pair(&labels, a, v);
        } else if (!strcmp(a, "--meta")) {
            ex = add_pair(&meta, a, v);
        } else if (!strcmp(a, "--payload")) {
            json_error_t je;
            json_decref(payload);
            payload = json_loads(v, JSON_DECODE_ANY, &je);
            if (!payload)
                ex = ctl_usage("allocate", "--payload is not JSON: %s", je.text);
        } else if (!strcmp(a, "--key")) {
            req.idempotency_key = v;
        } else if (!strcmp(a, "--wait")) {
            if (ctl_parse_ms(v, SD_ALLOC_WAIT_MAX_MS, &req.wait_ms))
                ex = ctl_usage("allocate", "--wait takes milliseconds or 500ms, 2s, 1m (at most "
                                           "60s), not '%s'", v);
        } else if (a[0] == '-' || req.service) {
            ex = ctl_usage("allocate", "unexpected argument '%s'", a);
        } else {
            req.service = a;
        }
    }
    if (ex == CTL_EXIT_OK && !req.service)
        ex = ctl_usage("allocate", "expected SERVICE");
    if (ex != CTL_EXIT_OK) {
        json_decref(labels);
        json_decref(meta);
        json_decref(payload);
        return ex;
    }
    req.machine_labels = labels;
    req.metadata = meta;
    req.payload = payload;
    /* a parked request is answered after up to wait_ms: the client must outwait it */
    sdc_t *client = req.wait_ms > 0 ? sdc_new(ctl->url, ctl->token, (int)req.wait_ms + 10000)
                                    : ctl->client;
    json_t *ans = NULL;
    sdc_err_t err = {0};
    int rc = client ? sdc_allocation_create(client, ctl->cluster, &req, &ans, &err) : SDC_E_NOMEM;
    if (client != ctl->client)
        sdc_free(client);
    json_decref(labels);
    json_decref(meta);
    json_decref(payload);
    if (rc != SDC_OK)
        return allocate_fail(rc, &err, req.wait_ms);
    int replayed = json_is_true(json_object_get(ans, "replayed"));
    static const enum alloc_view view = VIEW_ALLOCATE;
    ex = ctl_answer(ctl, rc, &err, ans, alloc_print, &view);
    if (replayed) { /* after the answer, which is what scripts read */
        fflush(stdout);
        fprintf(stderr, "sdctl: replayed: key %s was used before; this is its allocation\n",
                req.idempotency_key);
    }
    return ex;
}

/* ---------- allocations ---------- */

struct list_opts {
    const char *service, *after;
    int limit, all;
};

static void list_print(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    const struct list_opts *o = arg;
    ctl_table_t *t = alloc_table(VIEW_LIST, ctl->wide);
    int64_t now = sd_wall_ms();
    size_t i;
    const json_t *a;
    json_array_foreach(json_object_get(ans, "allocations"), i, a)
        alloc_row(t, a, VIEW_LIST, ctl->wide, now);
    ctl_table_print(t, stdout, ctl->color);
    const char *next = json_string_value(json_object_get(ans, "next"));
    if (next)
        printf("more: sdctl allocations%s%s --after %s (--all walks them all)\n",
               o->service ? " --service " : "", o->service ? o->service : "", next);
    else if (json_is_true(json_object_get(ans, "truncated")))
        fprintf(stderr, "sdctl: the first %zu allocations\n",
                json_array_size(json_object_get(ans, "allocations")));
}

static int allocations_list(ctl_t *ctl, const struct list_opts *o)
{
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = o->all ? sdc_allocations_list(ctl->client, ctl->cluster, o->service, &ans, &err)
                    : sdc_allocations_page(ctl->client, ctl->cluster, o->service, o->after,
                                           o->limit, &ans, &err);
    if (rc == SDC_OK && !json_array_size(json_object_get(ans, "allocations")) && !o->service &&
        !o->after && ctl_cluster_unknown(ctl)) {
        json_decref(ans);
        return CTL_EXIT_NOT_FOUND;
    }
    return ctl_answer(ctl, rc, &err, ans, list_print, o);
}

static void release_print(const ctl_t *ctl, const json_t *a, const void *arg)
{
    char id[160], state[32], reason[300];
    ctl_jstr(json_object_get(a, "allocation"), id, sizeof id);
    ctl_jstr(json_object_get(a, "state"), state, sizeof state);
    ctl_jstr(json_object_get(a, "reason"), reason, sizeof reason);
    if (json_is_true(json_object_get(a, "changed")))
        printf("%s: %s (reason %s, instance %s)\n", id, state, reason,
               json_string_value(json_object_get(a, "instance")) ?: "-");
    else
        printf("%s: ended already (%s, reason %s)\n", id, state, reason);
}

int cmd_allocations(ctl_t *ctl, int argc, char **argv)
{
    if (ctl_wants_help(argc, argv, allocations_usage))
        return CTL_EXIT_OK;
    json_t *ans = NULL;
    sdc_err_t err;
    if (argc >= 2 && (!strcmp(argv[1], "get") || !strcmp(argv[1], "release"))) {
        if (argc != 3 || argv[2][0] == '-')
            return ctl_usage("allocations", "%s takes one allocation ID", argv[1]);
        if (!strcmp(argv[1], "release")) {
            int rc = sdc_allocation_release(ctl->client, ctl->cluster, argv[2], &ans, &err);
            return ctl_answer(ctl, rc, &err, ans, release_print, NULL);
        }
        static const enum alloc_view view = VIEW_LIST;
        int rc = sdc_allocation_get(ctl->client, ctl->cluster, argv[2], &ans, &err);
        return ctl_answer(ctl, rc, &err, ans, alloc_print, &view);
    }
    struct list_opts o = {0};
    for (int i = argc >= 2 && !strcmp(argv[1], "list") ? 2 : 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(a, "--all")) {
            o.all = 1;
        } else if (!strcmp(a, "--service") && v) {
            o.service = argv[++i];
        } else if (!strcmp(a, "--after") && v) {
            o.after = argv[++i];
        } else if (!strcmp(a, "--limit") && v) {
            if (sd_parse_i64(argv[++i], 1, 1000, &n))
                return ctl_usage("allocations", "--limit takes a number 1-1000");
            o.limit = (int)n;
        } else {
            return ctl_usage("allocations", "unexpected or incomplete argument '%s'", a);
        }
    }
    if (o.all && (o.after || o.limit))
        return ctl_usage("allocations", "--all walks every page: no --after or --limit");
    return allocations_list(ctl, &o);
}
