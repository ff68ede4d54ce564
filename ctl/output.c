/* Output helpers for sdctl: error mapping, JSON printing, aligned tables. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

int ctl_fail(int rc, const sdc_err_t *err)
{
    if (rc == SDC_OK)
        return CTL_EXIT_OK;
    char buf[512];
    fprintf(stderr, "sdctl: %s\n", sdc_strerror(rc, err, buf, sizeof buf));
    if (rc == SDC_E_TRANSPORT)
        return CTL_EXIT_UNAVAILABLE;
    if (rc != SDC_E_HTTP)
        return CTL_EXIT_FAILED;
    switch (err->status) {
    case 401:
    case 403: return CTL_EXIT_AUTH;
    case 404: return CTL_EXIT_NOT_FOUND;
    case 409: return CTL_EXIT_CONFLICT;
    default: return err->status >= 500 ? CTL_EXIT_UNAVAILABLE : CTL_EXIT_FAILED;
    }
}

int ctl_fail_clear(int rc, sdc_err_t *err)
{
    int ex = ctl_fail(rc, err);
    sdc_err_clear(err);
    return ex;
}

int ctl_wants_help(int argc, char **argv, const char *text)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(text, stdout);
            return 1;
        }
    return 0;
}

int ctl_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sdctl %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see sdctl %s --help)\n", cmd);
    va_end(ap);
    return CTL_EXIT_USAGE;
}

int ctl_no_args(int argc, char **argv, const char *cmd, const char *usage)
{
    if (argc < 2)
        return -1;
    if (ctl_wants_help(argc, argv, usage))
        return CTL_EXIT_OK;
    return ctl_usage(cmd, "unexpected argument '%s'", argv[1]);
}

int ctl_one_arg(int argc, char **argv, const char *cmd, const char *usage, const char *what)
{
    if (ctl_wants_help(argc, argv, usage))
        return CTL_EXIT_OK;
    if (argc != 2 || argv[1][0] == '-')
        return ctl_usage(cmd, "expected %s", what);
    return -1;
}

int ctl_answer(const ctl_t *ctl, int rc, sdc_err_t *err, json_t *ans, ctl_human_fn human,
               const void *arg)
{
    if (rc != SDC_OK) {
        json_decref(ans);
        return ctl_fail_clear(rc, err);
    }
    if (ctl->json)
        ctl_print_json(ans);
    else
        human(ctl, ans, arg);
    json_decref(ans);
    return CTL_EXIT_OK;
}

struct switch_words {
    const char *what, *word;
};

static void switch_print(const ctl_t *ctl, const json_t *ans, const void *arg)
{
    const struct switch_words *w = arg;
    printf("%s: %s%s\n", w->what, w->word,
           json_is_true(json_object_get(ans, "changed")) ? "" : " (already)");
}

int ctl_switch_answer(const ctl_t *ctl, int rc, sdc_err_t *err, json_t *ans, const char *what,
                      const char *word)
{
    struct switch_words w = {what, word};
    return ctl_answer(ctl, rc, err, ans, switch_print, &w);
}

int ctl_switch_cmd(ctl_t *ctl, int argc, char **argv, const ctl_switch_t *sw)
{
    int early = ctl_one_arg(argc, argv, argv[0], sw->usage, sw->operand);
    if (early >= 0)
        return early;
    int on = strcmp(argv[0], sw->off_cmd) != 0;
    json_t *ans = NULL;
    sdc_err_t err;
    int rc = sw->set(ctl->client, ctl->cluster, argv[1], on, &ans, &err);
    return ctl_switch_answer(ctl, rc, &err, ans, argv[1], on ? sw->on_word : sw->off_word);
}

static int yaml_out;  /* -o yaml: ctl_print_json prints YAML */
static int names_out; /* -o name: ctl_print_json prints KIND/NAME lines */

void ctl_output_yaml(int on) { yaml_out = on; }
void ctl_output_names(int on) { names_out = on; }

/* A scalar: numbers, booleans and null as themselves, strings as JSON strings (a JSON
 * string is a valid YAML double-quoted scalar, so any text round-trips); an empty object
 * or array as {} / [] (YAML's flow style). */
static void yaml_scalar(FILE *f, const json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY);
    fputs(s ? s : "null", f);
    free(s);
}

static int plain_key(const char *k)
{
    if (!*k || !(isalpha((unsigned char)*k) || *k == '_'))
        return 0;
    for (const char *p = k; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return 0;
    return strcmp(k, "true") && strcmp(k, "false") && strcmp(k, "null") && strcmp(k, "yes") &&
           strcmp(k, "no") && strcmp(k, "on") && strcmp(k, "off");
}

static int is_container(const json_t *v)
{
    return (json_is_object(v) && json_object_size(v)) || (json_is_array(v) && json_array_size(v));
}

/* Block-style YAML of v at indent; `inline_first`: the first line continues a "- ". */
static void yaml_value(FILE *f, const json_t *v, int indent, int inline_first)
{
    if (json_is_object(v) && json_object_size(v)) {
        const char *k;
        const json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!(first && inline_first))
                fprintf(f, "%*s", indent, "");
            first = 0;
            if (plain_key(k)) {
                fputs(k, f);
            } else {
                json_t *ks = json_string(k); /* quoted, JSON's escapes */
                yaml_scalar(f, ks ? ks : json_null());
                json_decref(ks);
            }
            fputc(':', f);
            if (is_container(x)) {
                fputc('\n', f);
                yaml_value(f, x, indent + 2, 0);
            } else { /* a scalar, or an empty {} / [] in flow style */
                fputc(' ', f);
                yaml_scalar(f, x);
                fputc('\n', f);
            }
        }
    } else if (json_is_array(v) && json_array_size(v)) {
        size_t i;
        const json_t *x;
        json_array_foreach(v, i, x) {
            if (!(i == 0 && inline_first))
                fprintf(f, "%*s", indent, "");
            fputs("- ", f);
            if (is_container(x)) {
                yaml_value(f, x, indent + 2, 1);
            } else {
                yaml_scalar(f, x);
                fputc('\n', f);
            }
        }
    } else {
        if (inline_first == 0)
            fprintf(f, "%*s", indent, "");
        yaml_scalar(f, v);
        fputc('\n', f);
    }
}

void ctl_print_yaml(FILE *f, const json_t *v)
{
    fputs("---\n", f);
    yaml_value(f, v, 0, 0);
}

void ctl_print_json(const json_t *v)
{
    if (names_out) {
        ctl_print_names(v);
        return;
    }
    if (yaml_out) {
        ctl_print_yaml(stdout, v);
        return;
    }
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY);
    if (s) {
        puts(s);
        free(s);
    }
}

struct ctl_table {
    int ncols;
    int nrows, cap;
    char **cells; /* row-major, row 0 is the header */
};

#define TABLE_MAX_COLS 32 /* of the variadic ctl_table_new / ctl_table_row */

ctl_table_t *ctl_table_newv(int ncols, const char *const *headers)
{
    ctl_table_t *t = calloc(1, sizeof *t);
    t->ncols = ncols;
    t->cap = 16;
    t->cells = calloc((size_t)(t->cap * ncols), sizeof(char *));
    for (int i = 0; i < ncols; i++)
        t->cells[i] = strdup(headers[i]);
    t->nrows = 1;
    return t;
}

ctl_table_t *ctl_table_new(int ncols, ...)
{
    const char *h[TABLE_MAX_COLS];
    va_list ap;
    va_start(ap, ncols);
    for (int i = 0; i < ncols && i < TABLE_MAX_COLS; i++)
        h[i] = va_arg(ap, const char *);
    va_end(ap);
    return ctl_table_newv(ncols < TABLE_MAX_COLS ? ncols : TABLE_MAX_COLS, h);
}

void ctl_table_rowv(ctl_table_t *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        t->cap *= 2;
        t->cells = realloc(t->cells, (size_t)(t->cap * t->ncols) * sizeof(char *));
    }
    for (int i = 0; i < t->ncols; i++)
        t->cells[t->nrows * t->ncols + i] = strdup(cells[i] && *cells[i] ? cells[i] : "-");
    t->nrows++;
}

void ctl_table_row(ctl_table_t *t, ...)
{
    const char *c[TABLE_MAX_COLS];
    va_list ap;
    va_start(ap, t);
    for (int i = 0; i < t->ncols; i++)
        c[i] = va_arg(ap, const char *);
    va_end(ap);
    ctl_table_rowv(t, c);
}

static int no_headers; /* --no-headers: tables print their rows only */

/* The ANSI colour of a state word: green when well, yellow on the way, red when down. */
static const char *state_color(const char *s)
{
    static const char *const good[] = {"ready", "live", "held", "running", "active", NULL};
    static const char *const mid[] = {"starting", "draining", "delayed", "stopping", "backoff",
                                      "pending", NULL};
    static const char *const bad[] = {"stopped", "lost", "failed", "exited", "expired",
                                      "allocation_lost", NULL};
    for (int i = 0; good[i]; i++)
        if (!strncmp(s, good[i], strlen(good[i])))
            return "32";
    for (int i = 0; mid[i]; i++)
        if (!strncmp(s, mid[i], strlen(mid[i])))
            return "33";
    for (int i = 0; bad[i]; i++)
        if (!strncmp(s, bad[i], strlen(bad[i])))
            return "31";
    return NULL;
}

void ctl_table_no_headers(int on) { no_headers = on; }

void ctl_table_print(ctl_table_t *t, FILE *out, int color)
{
    int *w = calloc((size_t)t->ncols, sizeof(int));
    for (int r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols; c++) {
            int l = (int)strlen(t->cells[r * t->ncols + c]);
            if (l > w[c])
                w[c] = l;
        }
    for (int r = no_headers ? 1 : 0; r < t->nrows; r++) {
        if (r == 0 && color)
            fputs("\033[1m", out);
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            /* a STATE column's words in colour on a terminal (padding counts the word) */
            const char *col = r > 0 && color && !strcmp(t->cells[c], "STATE") ? state_color(s)
                                                                              : NULL;
            if (col)
                fprintf(out, "\033[%sm%s\033[0m", col, s);
            else
                fputs(s, out);
            if (c + 1 < t->ncols)
                fprintf(out, "%*s", w[c] - (int)strlen(s) + 2, "");
        }
        if (r == 0 && color)
            fputs("\033[0m", out);
        fputc('\n', out);
    }
    for (int i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(w);
    free(t);
}

const char *ctl_fmt_ms(long long ms, char *buf, size_t cap)
{
    if (ms < 0) {
        snprintf(buf, cap, "-");
    } else if (ms < 1000) {
        snprintf(buf, cap, "%lldms", ms);
    } else {
        long long s = ms / 1000;
        if (s < 60)
            snprintf(buf, cap, "%llds", s);
        else if (s < 3600)
            snprintf(buf, cap, "%lldm%llds", s / 60, s % 60);
        else if (s < 86400)
            snprintf(buf, cap, "%lldh%lldm", s / 3600, (s % 3600) / 60);
        else
            snprintf(buf, cap, "%lldd%lldh", s / 86400, (s % 86400) / 3600);
    }
    return buf;
}

const char *ctl_jstr(const json_t *v, char *buf, size_t cap)
{
    if (json_is_string(v))
        snprintf(buf, cap, "%s", json_string_value(v));
    else if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, cap, "%g", json_real_value(v));
    else if (json_is_boolean(v))
        snprintf(buf, cap, "%s", json_is_true(v) ? "true" : "false");
    else
        snprintf(buf, cap, "-");
    return buf;
}

const char *ctl_kv_text(const json_t *obj, char *buf, size_t cap)
{
    size_t o = 0;
    const char *k;
    const json_t *v;
    buf[0] = '\0';
    json_object_foreach((json_t *)obj, k, v) {
        char num[24];
        const char *val = json_is_string(v) ? json_string_value(v) : "?";
        if (json_is_integer(v)) {
            snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
            val = num;
        }
        int n = snprintf(buf + o, cap - o, "%s%s=%s", o ? "," : "", k, val);
        if (n < 0 || (size_t)n >= cap - o)
            break;
        o += (size_t)n;
    }
    return buf;
}

const char *ctl_restarts(const json_t *proc, char *buf, size_t cap)
{
    return ctl_jstr(json_object_get(proc, "restarts"), buf, cap);
}

int ctl_natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1]))
                a++;
            while (*b == '0' && isdigit((unsigned char)b[1]))
                b++;
            size_t la = 0, lb = 0;
            while (isdigit((unsigned char)a[la]))
                la++;
            while (isdigit((unsigned char)b[lb]))
                lb++;
            if (la != lb)
                return la < lb ? -1 : 1;
            int c = strncmp(a, b, la);
            if (c)
                return c;
            a += la;
            b += lb;
        } else {
            if (*a != *b)
                return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return (unsigned char)*a - (unsigned char)*b;
}

static const char *sort_key;

static int by_natural(const void *x, const void *y)
{
    const char *a = json_string_value(json_object_get(*(json_t *const *)x, sort_key));
    const char *b = json_string_value(json_object_get(*(json_t *const *)y, sort_key));
    return ctl_natural_cmp(a ? a : "", b ? b : "");
}

static void sort_by(json_t *array, const char *key, int (*cmp)(const void *, const void *));

void ctl_sort_natural(json_t *array, const char *key) { sort_by(array, key, by_natural); }

static int by_newest(const void *x, const void *y)
{
    const json_t *a = json_object_get(*(json_t *const *)x, sort_key);
    const json_t *b = json_object_get(*(json_t *const *)y, sort_key);
    if (!json_is_integer(a) || !json_is_integer(b))
        return json_is_integer(b) - json_is_integer(a);
    json_int_t ia = json_integer_value(a), ib = json_integer_value(b);
    return ia < ib ? 1 : ia > ib ? -1 : 0;
}

/* Sorts array's objects with cmp (reading the member sort_key). */
static void sort_by(json_t *array, const char *key, int (*cmp)(const void *, const void *))
{
    size_t n = json_array_size(array);
    json_t **v = n > 1 ? malloc(n * sizeof *v) : NULL;
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(array, i));
    sort_key = key;
    qsort(v, n, sizeof *v, cmp);
    json_array_clear(array);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(array, v[i]);
    free(v);
}

void ctl_sort_newest(json_t *array, const char *key) { sort_by(array, key, by_newest); }

int ctl_parse_ms(const char *s, int64_t max_ms, int64_t *out)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    char *end;
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno || end - s > 9) /* no overflow below: at most 999999999 minutes */
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit) && n * units[i].ms <= max_ms) {
            *out = n * units[i].ms;
            return 0;
        }
    return -1;
}

const char *ctl_pool_text(const json_t *service, char *buf, size_t cap)
{
    const json_t *pool = json_object_get(service, "pool");
    if (!json_is_object(json_object_get(json_object_get(service, "spec"), "pool")))
        return NULL;
    snprintf(buf, cap, "%lld free / %lld alloc",
             (long long)json_integer_value(json_object_get(pool, "ready_free")),
             (long long)json_integer_value(json_object_get(pool, "allocated")));
    return buf;
}

/* ---- mistakes: suggestions, missing values, -o name */

size_t ctl_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > CTL_SUGGEST_MAX || lb > CTL_SUGGEST_MAX)
        return (size_t)-1;
    /* the whole table (optimal string alignment): 65 x 65 cells at most */
    size_t d[CTL_SUGGEST_MAX + 1][CTL_SUGGEST_MAX + 1];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1; /* two neighbours swapped */
            d[i][j] = best;
        }
    return d[la][lb];
}

const char *ctl_suggest(const char *word, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1, len = strlen(word);
    /* a third of the word's length, at least 1 and at most 3 edits: "pss" -> "ps",
     * not "x" -> "ps" */
    size_t limit = len / 3 < 1 ? 1 : len / 3 > 3 ? 3 : len / 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = ctl_edit_distance(word, names[i]);
        if (d <= limit && d < best_d) {
            best = names[i];
            best_d = d;
        }
    }
    return best;
}

int ctl_missing_value(const char *cmd, const char *opt, const char *what)
{
    fprintf(stderr, "sdctl%s%s: %s needs a value (%s)\n", cmd ? " " : "", cmd ? cmd : "", opt,
            what);
    return CTL_EXIT_USAGE;
}

/* -o name: which member of an answer lists what, and the member of an item that names
 * it. One item (a get) is named by the first of item_keys it has. */
static const struct {
    const char *list, *kind, *key; /* key NULL: the list holds the names themselves */
} name_lists[] = {{"processes", "instance", "instance"}, {"machines", "machine", "machine"},
                  {"services", "service", "service"}, {"static_services", "service", "service"},
                  {"locks", "lock", "key"}, {"allocations", "allocation", "allocation"},
                  {"clusters", "cluster", NULL}, {"servers", "server", "address"},
                  {"events", "event", "seq"}};
static const struct {
    const char *key, *kind;
} item_keys[] = {{"allocation", "allocation"}, {"instance", "instance"}, {"machine", "machine"},
                 {"service", "service"}, {"key", "lock"}};

void ctl_print_name(const char *kind, const json_t *item, const char *key)
{
    char buf[400];
    printf("%s/%s\n", kind, ctl_jstr(key ? json_object_get(item, key) : item, buf, sizeof buf));
}

void ctl_print_names(const json_t *ans)
{
    int lists = 0;
    for (size_t k = 0; k < sizeof name_lists / sizeof name_lists[0]; k++) {
        const json_t *items = json_object_get(ans, name_lists[k].list), *it;
        size_t i;
        lists |= json_is_array(items);
        json_array_foreach(items, i, it)
            ctl_print_name(name_lists[k].kind, it, name_lists[k].key);
    }
    for (size_t k = 0; !lists && k < sizeof item_keys / sizeof item_keys[0]; k++)
        if (json_object_get(ans, item_keys[k].key)) {
            ctl_print_name(item_keys[k].kind, ans, item_keys[k].key);
            return;
        }
}
