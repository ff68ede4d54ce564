/* sdctl locks: inspect the lock table and force-unlock (docs/locks.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "sdutil.h"

SDCTL_CMD("locks", cmd_locks, "list and inspect locks (list, get KEY) and force-unlock KEY");

static const char usage_text[] =
    "usage: sdctl locks [list] [--limit N]  the held locks, by key (first N, default 500;\n"
    "                                       --limit 0: all of them, page after page)\n"
    "       sdctl locks get KEY             one lock: holder, lock_seq, age, lease\n"
    "       sdctl locks list --holder H     the locks holder H holds\n"
    "       sdctl locks force-unlock KEY    free KEY whoever holds it (ops token; the old\n"
    "                                       holder's saves are refused from then on)\n";

static int locks_get(ctl_t *ctl, const char *key)
{
    sdc_lock_info_t li;
    json_t *raw = NULL;
    sdc_err_t err;
    int rc = sdc_lock_get(ctl->client, key, &li, &raw, &err);
    if (rc != SDC_OK)
        return ctl_fail_clear(rc, &err);
    if (ctl->json) {
        ctl_print_json(raw);
    } else {
        char seq[32], age[32], exp[32], delay[32];
        snprintf(seq, sizeof seq, "%lld", (long long)li.lock_seq);
        ctl_table_t *t = ctl_table_new(6, "KEY", "STATE", "HOLDER", "LOCK_SEQ", "HELD_FOR", "EXPIRES_IN");
        ctl_table_row(t, li.key, li.held ? "held" : (li.lock_delay_ms > 0 ? "delayed" : "free"),
                      li.held ? li.holder : NULL, li.lock_seq ? seq : NULL,
                      li.held ? ctl_fmt_ms(li.held_for_ms, age, sizeof age) : NULL,
                      li.expires_in_ms >= 0 ? ctl_fmt_ms(li.expires_in_ms, exp, sizeof exp)
                                            : (li.lock_delay_ms > 0
                                                   ? ctl_fmt_ms(li.lock_delay_ms, delay, sizeof delay)
                                                   : NULL));
        ctl_table_print(t, stdout, ctl->color);
    }
    json_decref(raw);
    return CTL_EXIT_OK;
}

/* KEY HOLDER LOCK_SEQ HELD_FOR EXPIRES_IN (the HOLDER column when arg is non-NULL). */
static void locks_table(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    int with_holder = arg != NULL;
    ctl_table_t *t = with_holder
                         ? ctl_table_new(5, "KEY", "HOLDER", "LOCK_SEQ", "HELD_FOR", "EXPIRES_IN")
                         : ctl_table_new(4, "KEY", "LOCK_SEQ", "HELD_FOR", "EXPIRES_IN");
    int64_t now = sd_wall_ms();
    size_t i;
    const json_t *l;
    json_array_foreach(json_object_get(ans, "locks"), i, l) {
        char a[160], h[160], b[32], c[32], d[32];
        const json_t *exp = json_object_get(l, "expires_in_ms"),
                     *since = json_object_get(l, "since_ms");
        const char *key = ctl_jstr(json_object_get(l, "key"), a, sizeof a),
                   *seq = ctl_jstr(json_object_get(l, "lock_seq"), b, sizeof b),
                   *held = json_is_integer(since)
                               ? ctl_fmt_ms(now - json_integer_value(since), c, sizeof c) : NULL,
                   *left = json_is_integer(exp) && json_integer_value(exp) >= 0
                               ? ctl_fmt_ms(json_integer_value(exp), d, sizeof d) : "never";
        if (with_holder)
            ctl_table_row(t, key, ctl_jstr(json_object_get(l, "holder"), h, sizeof h), seq, held,
                          left);
        else
            ctl_table_row(t, key, seq, held, left);
    }
    ctl_table_print(t, stdout, ctl->color);
    if (json_is_true(json_object_get(ans, "truncated")))
        fprintf(stderr, "sdctl: the first %zu locks; more are held (--limit 0 lists all)\n",
                json_array_size(json_object_get(ans, "locks")));
}

static int by_key(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "key"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "key"));
    return strcmp(x ? x : "", y ? y : "");
}

/* The pages come in the server's scan order: shown (and printed as JSON) by key. */
static void sort_locks(json_t *ans)
{
    json_t *locks = json_object_get(ans, "locks");
    size_t n = json_array_size(locks);
    json_t **v = n ? malloc(n * sizeof *v) : NULL;
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(locks, i));
    qsort(v, n, sizeof *v, by_key);
    json_array_clear(locks);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(locks, v[i]);
    free(v);
}

static int locks_list(ctl_t *ctl, const char *holder)
{
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_lock_list_by_holder(ctl->client, holder, &ans, &err);
    if (rc == SDC_OK)
        sort_locks(ans);
    return ctl_answer(ctl, rc, &err, ans, locks_table, NULL);
}

static int locks_all(ctl_t *ctl, long long limit)
{
    json_t *ans = NULL;
    sdc_err_t err;
    size_t max = limit > 0 ? (size_t)limit : (size_t)-1;
    int rc = sdc_lock_list(ctl->client, max, &ans, &err);
    if (rc == SDC_OK) {
        json_t *locks = json_object_get(ans, "locks");
        if (limit > 0 && json_array_size(locks) > (size_t)limit) { /* pages overshoot */
            while (json_array_size(locks) > (size_t)limit)
                json_array_remove(locks, json_array_size(locks) - 1);
            json_object_set_new(ans, "truncated", json_true());
        }
        sort_locks(ans);
    }
    return ctl_answer(ctl, rc, &err, ans, locks_table, "holder");
}

static void force_print(const ctl_t *ctl, const json_t *ans, const void *key)
{
    char seq[32];
    printf("unlocked %s (was held by %s with lock_seq %s)\n", (const char *)key,
           json_string_value(json_object_get(ans, "previous_holder")),
           ctl_jstr(json_object_get(ans, "lock_seq"), seq, sizeof seq));
}

static int locks_force(ctl_t *ctl, const char *key)
{
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sdc_lock_force_unlock(ctl->client, key, &ans, &err);
    return ctl_answer(ctl, rc, &err, ans, force_print, key);
}

int cmd_locks(ctl_t *ctl, int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage_text, stdout);
        return CTL_EXIT_OK;
    }
    if (argc == 1 || (argc == 2 && !strcmp(argv[1], "list")))
        return locks_all(ctl, 500);
    if ((argc == 3 || argc == 4) && !strcmp(argv[argc - 2], "--limit") &&
        (argc == 3 || !strcmp(argv[1], "list"))) {
        char *end;
        long long n = strtoll(argv[argc - 1], &end, 10);
        if (*end || end == argv[argc - 1] || n < 0)
            return ctl_usage("locks", "--limit takes a number (0: all)");
        return locks_all(ctl, n);
    }
    if (argc == 3 && !strcmp(argv[1], "get"))
        return locks_get(ctl, argv[2]);
    if (argc == 4 && !strcmp(argv[1], "list") && !strcmp(argv[2], "--holder"))
        return locks_list(ctl, argv[3]);
    if (argc == 3 && !strcmp(argv[1], "force-unlock"))
        return locks_force(ctl, argv[2]);
    fputs(usage_text, stderr);
    return ctl_usage("locks", "expected list [--limit N], get KEY, list --holder H or "
                              "force-unlock KEY");
}
