/* The docs' examples, run: every ```console doctest block of README.md and of the .md
 * files in docs/ against a local cluster started by scripts/cluster.sh (this build's
 * binaries, free ports, a temp dir holding .cluster/), each command's output compared
 * with the text the block shows under it. The marking syntax and the comparison rules
 * are in docs/doctest.md; this file is their implementation.
 *
 * The blocks of one file run in document order in one bash session (variables carry
 * from one command to the next), started in the directory holding .cluster/ with
 * `. .cluster/env` sourced. Each command runs with stdin /dev/null and stderr merged
 * into stdout, within CMD_TIMEOUT_MS; a nonzero exit status is shown as a last line
 * `[exit N]`. The documented ports 7700 (serverdir), 7379 (redis), 7702 and 7703 (the logs
 * ports of local-1 and local-2) are rewritten to this run's in the commands and in the expected output.
 *
 * comparison_rules checks the comparison itself, a drift of each kind included, without
 * a cluster. Every example runs even after a failure; each failure prints its file:line,
 * the command, the expected and the actual output and where they part. DOCTEST_FILES
 * (a comma-separated list of names such as README.md,locks.md) limits the run;
 * DOCTEST_DIR and DOCTEST_PORTS run it against a cluster already running. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define CMD_TIMEOUT_MS 20000
#define OUT_MAX (1 << 20) /* a command's output beyond this is an error, not a hang */
#define END_MARK "__sd_doctest_end_7f3e__"

/* ---- the examples of one file ---- */

typedef struct {
    int line;     /* of the `$ ` line, 1-based */
    char *cmd;    /* the command, continuation lines and here-documents included */
    char **want;  /* the expected output, one string a line */
    int *want_at; /* each expected line's line number in the file */
    int nwant;
} example_t;

typedef struct {
    char name[64]; /* README.md, docs/locks.md */
    example_t *ex;
    int nex, nblocks;
} doc_t;

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    assert_non_null(d);
    return d;
}

/* Copies s with every 7700, 7379, 7702 and 7703 that is a whole number (no digit beside
 * it) replaced by this run's port (malloc'd). */
#define NPORTS 4
static int ports[NPORTS];
static const char *const doc_ports[NPORTS] = {"7700", "7379", "7702", "7703"};

static char *rewrite_ports(const char *s)
{
    size_t cap = strlen(s) * 2 + 16, n = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (const char *p = s; *p;) {
        int done = 0;
        for (int k = 0; k < NPORTS && !done; k++) {
            int before = p > s && p[-1] >= '0' && p[-1] <= '9';
            if (!before && !strncmp(p, doc_ports[k], 4) && !(p[4] >= '0' && p[4] <= '9')) {
                n += (size_t)sprintf(out + n, "%d", ports[k]);
                p += 4;
                done = 1;
            }
        }
        if (!done)
            out[n++] = *p++;
    }
    out[n] = '\0';
    return out;
}

static void add_line(example_t *e, const char *text, int at)
{
    e->want = realloc(e->want, sizeof *e->want * (size_t)(e->nwant + 1));
    e->want_at = realloc(e->want_at, sizeof *e->want_at * (size_t)(e->nwant + 1));
    assert_true(e->want && e->want_at);
    e->want[e->nwant] = rewrite_ports(text);
    e->want_at[e->nwant++] = at;
}

/* The word that ends a here-document the command line opens (<<WORD, <<'WORD',
 * <<"WORD", <<-WORD), into word; 0 when it opens none. */
static int heredoc_word(const char *line, char *word, size_t cap)
{
    const char *p = strstr(line, "<<");
    if (!p || p[2] == '<')
        return 0;
    p += 2;
    if (*p == '-')
        p++;
    while (*p == ' ')
        p++;
    if (*p == '\'' || *p == '"')
        p++;
    size_t n = 0;
    while ((p[n] == '_' || (p[n] >= 'A' && p[n] <= 'Z') || (p[n] >= 'a' && p[n] <= 'z') ||
            (p[n] >= '0' && p[n] <= '9')) && n + 1 < cap) {
        word[n] = p[n];
        n++;
    }
    word[n] = '\0';
    return n > 0;
}

/* Parses the doctest blocks of text (the file's content; modified in place) into d. A
 * block opens with a line ```console doctest and closes with ``` (both indented alike,
 * the block's lines by as much or less); in it a line starting
 * with "$ " is a command (continued by a trailing backslash or a here-document), the
 * lines after it up to the next command are its output. */
static void parse_doc(doc_t *d, char *text)
{
    int in_block = 0, lineno = 0;
    size_t indent = 0;
    char heredoc[64] = "";
    int continued = 0;
    example_t *cur = NULL;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        if (!in_block) {
            indent = strspn(line, " ");
            in_block = !strncmp(line + indent, "```console doctest", 18);
            d->nblocks += in_block;
            cur = NULL;
            continue;
        }
        for (size_t k = 0; k < indent && *line == ' '; k++)
            line++; /* a block in a list item is indented like its fence */
        if ((continued || heredoc[0]) && cur) {
            size_t n = strlen(cur->cmd);
            cur->cmd = realloc(cur->cmd, n + strlen(line) + 2);
            assert_non_null(cur->cmd);
            sprintf(cur->cmd + n, "\n%s", line);
            if (heredoc[0] && !strcmp(line, heredoc))
                heredoc[0] = '\0';
            else if (!heredoc[0])
                continued = line[0] && line[strlen(line) - 1] == '\\';
            if (!continued && !heredoc[0]) {
                char *r = rewrite_ports(cur->cmd);
                free(cur->cmd);
                cur->cmd = r;
            }
            continue;
        }
        if (!strcmp(line, "```")) {
            in_block = 0;
            continue;
        }
        if (!strncmp(line, "$ ", 2)) {
            d->ex = realloc(d->ex, sizeof *d->ex * (size_t)(d->nex + 1));
            assert_non_null(d->ex);
            cur = &d->ex[d->nex++];
            *cur = (example_t){.line = lineno, .cmd = xstrdup(line + 2)};
            continued = line[strlen(line) - 1] == '\\';
            heredoc_word(line, heredoc, sizeof heredoc);
            if (!continued && !heredoc[0]) {
                char *r = rewrite_ports(cur->cmd);
                free(cur->cmd);
                cur->cmd = r;
            }
            continue;
        }
        if (!cur)
            fail_msg("%s:%d: a doctest block must start with a `$ ` command line", d->name,
                     lineno);
        add_line(cur, line, lineno);
    }
    if (in_block)
        fail_msg("%s: a doctest block is not closed by ```", d->name);
}

/* ---- comparing ---- */

/* Whether text a matches pattern p: "..." in p matches any run of characters, a run of
 * blanks in p any run of one or more blanks in a (tables keep matching when a column
 * grows). */
static int glob_match(const char *p, const char *a)
{
    while (*p) {
        if (!strncmp(p, "...", 3)) {
            p += 3;
            for (const char *t = a;; t++) {
                if (glob_match(p, t))
                    return 1;
                if (!*t)
                    return 0;
            }
        }
        if (*p == ' ' || *p == '\t') {
            if (*a != ' ' && *a != '\t')
                return 0;
            while (*p == ' ' || *p == '\t')
                p++;
            while (*a == ' ' || *a == '\t')
                a++;
            continue;
        }
        if (*p++ != *a++)
            return 0;
    }
    return *a == '\0';
}

static int json_match(json_t *want, json_t *got);

/* Arrays: element by element, an element "..." matching any number of elements. */
static int json_array_match(json_t *want, size_t i, json_t *got, size_t j)
{
    if (i == json_array_size(want))
        return j == json_array_size(got);
    json_t *w = json_array_get(want, i);
    if (json_is_string(w) && !strcmp(json_string_value(w), "...")) {
        for (size_t k = j; k <= json_array_size(got); k++)
            if (json_array_match(want, i + 1, got, k))
                return 1;
        return 0;
    }
    return j < json_array_size(got) && json_match(w, json_array_get(got, j)) &&
           json_array_match(want, i + 1, got, j + 1);
}

/* JSON compared by value: the same keys (unless the expected object has a key "...":
 * then it may have others), equal values; a string "..." matches any value, a string
 * holding "..." any string it globs; numbers by value. */
static int json_match(json_t *want, json_t *got)
{
    if (json_is_string(want)) {
        const char *w = json_string_value(want);
        if (!strcmp(w, "..."))
            return 1;
        if (strstr(w, "...") && json_is_string(got))
            return glob_match(w, json_string_value(got));
        return json_equal(want, got);
    }
    if (json_is_number(want))
        return json_is_number(got) && json_number_value(want) == json_number_value(got);
    if (json_is_array(want))
        return json_is_array(got) && json_array_match(want, 0, got, 0);
    if (json_is_object(want)) {
        if (!json_is_object(got))
            return 0;
        int open = json_object_get(want, "...") != NULL;
        size_t nwant = json_object_size(want) - (size_t)open;
        if (!open && nwant != json_object_size(got))
            return 0;
        const char *k;
        json_t *v;
        json_object_foreach(want, k, v) {
            if (strcmp(k, "...") && !json_match(v, json_object_get(got, k)))
                return 0;
        }
        return 1;
    }
    return json_equal(want, got);
}

/* Where want and got part, as a path and what differs, into out ("" when they match).
 * Arrays with a "..." element are reported whole. */
static void json_explain(json_t *want, json_t *got, const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    if (json_match(want, got))
        return;
    if (json_is_object(want) && json_is_object(got)) {
        const char *k;
        json_t *v;
        char sub[512];
        json_object_foreach(want, k, v) {
            if (!strcmp(k, "..."))
                continue;
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (!json_object_get(got, k)) {
                snprintf(out, cap, "%s is missing", sub);
                return;
            }
            json_explain(v, json_object_get(got, k), sub, out, cap);
            if (out[0])
                return;
        }
        json_object_foreach(got, k, v) {
            if (!json_object_get(want, k)) {
                snprintf(out, cap, "%s.%s is not in the example (add it, or \"...\": \"...\")",
                         path, k);
                return;
            }
        }
    }
    if (json_is_array(want) && json_is_array(got) &&
        json_array_size(want) == json_array_size(got)) {
        char sub[512];
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            json_explain(json_array_get(want, i), json_array_get(got, i), sub, out, cap);
            if (out[0])
                return;
        }
    }
    char *w = json_dumps(want, JSON_ENCODE_ANY | JSON_COMPACT);
    char *g = json_dumps(got, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(out, cap, "%s: expected %.200s, got %.200s", path[0] ? path : "(the document)",
             w ? w : "?", g ? g : "?");
    free(w);
    free(g);
}

static json_t *json_of(const char *s)
{
    while (*s == ' ')
        s++;
    if (*s != '{' && *s != '[')
        return NULL;
    return json_loads(s, JSON_DECODE_ANY, NULL);
}

/* One expected line against one actual line: as JSON when both are JSON, else glob. */
static int line_match(const char *want, const char *got)
{
    json_t *w = json_of(want), *g = w ? json_of(got) : NULL;
    int ok = w && g ? json_match(w, g) : glob_match(want, got);
    json_decref(w);
    json_decref(g);
    return ok;
}

static int is_any_lines(const char *s)
{
    while (*s == ' ')
        s++;
    return !strcmp(s, "...");
}

/* reach[i][j]: the first i expected lines match the first j actual ones (a line "..."
 * matches any number of lines). Returns whether all match all; *pi, *pj: where the
 * longest matching prefix ends (for the report). */
static int lines_match(char **want, int nw, char **got, int ng, int *pi, int *pj)
{
    char *reach = calloc((size_t)(nw + 1) * (size_t)(ng + 1), 1);
    assert_non_null(reach);
#define R(i, j) reach[(size_t)(i) * (size_t)(ng + 1) + (size_t)(j)]
    R(0, 0) = 1;
    *pi = *pj = 0;
    for (int i = 0; i <= nw; i++)
        for (int j = 0; j <= ng; j++) {
            if (!R(i, j))
                continue;
            if (i > *pi || (i == *pi && j > *pj)) {
                *pi = i;
                *pj = j;
            }
            if (i == nw)
                continue;
            if (is_any_lines(want[i])) {
                R(i + 1, j) = 1;
                if (j < ng)
                    R(i, j + 1) = 1;
            } else if (j < ng && line_match(want[i], got[j])) {
                R(i + 1, j + 1) = 1;
            }
        }
    int ok = R(nw, ng);
#undef R
    free(reach);
    return ok;
}

/* Splits text into lines (in place; trailing blanks and empty last lines dropped). */
static int split_lines(char *text, char ***lines)
{
    int n = 0;
    *lines = NULL;
    for (char *l = text, *next; l; l = next) {
        next = strchr(l, '\n');
        if (next)
            *next++ = '\0';
        if (!next && !*l)
            break;
        size_t len = strlen(l);
        while (len && (l[len - 1] == ' ' || l[len - 1] == '\r' || l[len - 1] == '\t'))
            l[--len] = '\0';
        *lines = realloc(*lines, sizeof **lines * (size_t)(n + 1));
        assert_non_null(*lines);
        (*lines)[n++] = l;
    }
    while (n && !(*lines)[n - 1][0])
        n--;
    return n;
}

/* Whether the whole expected output is one JSON document spread over several lines: it
 * is then compared as JSON with the whole actual output (an [exit N] line aside). */
static int json_block_match(const example_t *e, char **got, int ng, int *used, char *why,
                            size_t cap)
{
    *used = 0;
    why[0] = '\0';
    int nw = e->nwant;
    if (nw < 2)
        return -1;
    int exit_line = !strncmp(e->want[nw - 1], "[exit ", 6);
    size_t len = 0;
    for (int i = 0; i < nw - exit_line; i++)
        len += strlen(e->want[i]) + 1;
    char *w = calloc(1, len + 1), *g;
    assert_non_null(w);
    for (int i = 0; i < nw - exit_line; i++)
        strcat(strcat(w, e->want[i]), "\n");
    json_t *jw = json_of(w);
    free(w);
    if (!jw)
        return -1;
    int gl = ng - (ng && !strncmp(got[ng - 1], "[exit ", 6));
    len = 0;
    for (int i = 0; i < gl; i++)
        len += strlen(got[i]) + 1;
    g = calloc(1, len + 1);
    assert_non_null(g);
    for (int i = 0; i < gl; i++)
        strcat(strcat(g, got[i]), "\n");
    json_t *jg = json_of(g);
    free(g);
    int ok = jg && json_match(jw, jg) &&
             (exit_line ? gl == ng - 1 && !strcmp(e->want[nw - 1], got[ng - 1]) : gl == ng);
    *used = 1;
    if (!jg)
        snprintf(why, cap, "the output is not one JSON document");
    else if (!json_match(jw, jg))
        json_explain(jw, jg, "", why, cap);
    else
        snprintf(why, cap, "the exit status differs");
    json_decref(jw);
    json_decref(jg);
    return ok;
}

/* ---- running ---- */

typedef struct {
    pid_t pid;
    int in, out; /* bash's stdin (we write), its stdout+stderr (we read) */
} session_t;

static char workdir[400];
static int failures, commands_run;

/* bash in its own process group, in workdir, with .cluster/env sourced. */
static void session_start(session_t *s)
{
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        h_child_init();
        dup2(to[0], 0);
        dup2(from[1], 1);
        dup2(from[1], 2);
        close(to[0]);
        close(to[1]);
        close(from[0]);
        close(from[1]);
        if (chdir(workdir) != 0)
            _exit(126);
        unsetenv("SERVERDIR_URL");
        unsetenv("SERVERDIR_TOKEN");
        unsetenv("SERVERDIR_CLUSTER");
        unsetenv("BB_CONTROL_SOCKET");
        setenv("LC_ALL", "C", 1);
        setenv("TZ", "UTC", 1);
        setenv("NO_COLOR", "1", 1);
        setenv("COLUMNS", "200", 1);
        execl("/bin/bash", "bash", "--noprofile", "--norc", (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    close(to[0]);
    close(from[1]);
    s->pid = pid;
    s->in = to[1];
    s->out = from[0];
    const char *init = ". .cluster/env || exit 1\n";
    assert_int_equal(write(s->in, init, strlen(init)), (ssize_t)strlen(init));
}

static void session_end(session_t *s)
{
    if (s->pid <= 0)
        return;
    close(s->in);
    if (h_wait_exit(s->pid, 2000) == -1) {
        kill(-s->pid, SIGKILL);
        h_wait_exit(s->pid, 2000);
    }
    kill(-s->pid, SIGKILL); /* anything a command left in the background */
    close(s->out);
    s->pid = 0;
}

/* Runs one command in the session; *out (malloc'd) gets what it printed, its exit
 * status appended as "[exit N]" when not 0. Returns 0, or -1 when it did not finish
 * within CMD_TIMEOUT_MS or the session ended (*out says which). */
static int session_run(session_t *s, const char *cmd, char **out)
{
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap), *script;
    assert_non_null(buf);
    /* A brace group runs in the session's shell (assignments stay); the marker line
     * comes after a newline so that it starts a line even when the output does not
     * end with one; ":;" keeps a command that is only a comment a valid group. */
    assert_true(asprintf(&script, "{ :; %s\n} </dev/null 2>&1; printf '\\n%s %%d\\n' $?\n", cmd,
                         END_MARK) > 0);
    size_t len = strlen(script);
    int rc = write(s->in, script, len) == (ssize_t)len ? 0 : -1;
    free(script);
    int64_t end = h_now_ms() + h_ms(CMD_TIMEOUT_MS);
    char *mark = NULL;
    const char *why = "";
    while (rc == 0) {
        buf[n] = '\0';
        if ((mark = strstr(buf, "\n" END_MARK " ")) && strchr(mark + 1, '\n'))
            break;
        int left = (int)(end - h_now_ms());
        struct pollfd p = {.fd = s->out, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            why = "it did not finish in time";
            rc = -1;
            break;
        }
        if (n + 4096 + 1 > cap) {
            if (cap >= OUT_MAX) {
                why = "it printed more than the runner takes";
                rc = -1;
                break;
            }
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t got = read(s->out, buf + n, cap - n - 1);
        if (got <= 0) {
            why = "the shell ended (a syntax error, or exit)";
            rc = -1;
            break;
        }
        n += (size_t)got;
    }
    if (rc != 0) {
        char *msg;
        assert_true(asprintf(&msg, "%s\n[no end: %s (bound: %d ms, %d bytes)]", buf, why,
                             h_ms(CMD_TIMEOUT_MS), OUT_MAX) > 0);
        free(buf);
        *out = msg;
        return -1;
    }
    int status = atoi(mark + 1 + strlen(END_MARK) + 1);
    *mark = '\0';
    if (status != 0) {
        char *withexit;
        assert_true(asprintf(&withexit, "%s%s[exit %d]", buf,
                             mark == buf || mark[-1] == '\n' ? "" : "\n", status) > 0);
        free(buf);
        buf = withexit;
    }
    *out = buf;
    return 0;
}

static void print_indented(const char *tag, char **lines, int n, const int *at)
{
    print_message("  %s\n", tag);
    for (int i = 0; i < n; i++)
        if (at)
            print_message("    %4d| %s\n", at[i], lines[i]);
        else
            print_message("    %4d| %s\n", i + 1, lines[i]);
}

/* Checks one example's output; prints a report and counts a failure when it differs. */
static void check_output(const doc_t *d, const example_t *e, char *out, int ran)
{
    char **got;
    int ng = split_lines(out, &got), used = 0, pi = 0, pj = 0;
    char why[1024] = "";
    int ok = ran == 0 ? json_block_match(e, got, ng, &used, why, sizeof why) : 0;
    if (ran == 0 && !used)
        ok = lines_match(e->want, e->nwant, got, ng, &pi, &pj);
    if (!ok) {
        failures++;
        print_message("\n%s:%d: the example's output differs\n  $ %s\n", d->name, e->line, e->cmd);
        print_indented("expected (file line| text):", e->want, e->nwant, e->want_at);
        print_indented("actual (output line| text):", got, ng, NULL);
        if (ran != 0)
            print_message("  the command did not complete\n");
        else if (used)
            print_message("  compared as one JSON document: %s\n", why);
        else if (pi < e->nwant) {
            print_message("  first difference: %s:%d `%s` against output line %d `%s`\n",
                          d->name, e->want_at[pi], e->want[pi], pj + 1,
                          pj < ng ? got[pj] : "(end of output)");
            json_t *jw = json_of(e->want[pi]), *jg = pj < ng ? json_of(got[pj]) : NULL;
            if (jw && jg) {
                json_explain(jw, jg, "", why, sizeof why);
                print_message("  as JSON: %s\n", why);
            }
            json_decref(jw);
            json_decref(jg);
        }
        else
            print_message("  first difference: output line %d `%s` is more than expected\n",
                          pj + 1, pj < ng ? got[pj] : "");
    }
    free(got);
}

static void run_doc(const doc_t *d)
{
    session_t s = {0};
    session_start(&s);
    int64_t t0 = h_now_ms();
    for (int i = 0; i < d->nex; i++) {
        const example_t *e = &d->ex[i];
        char *out;
        int rc = session_run(&s, e->cmd, &out);
        commands_run++;
        check_output(d, e, out, rc);
        free(out);
        if (rc != 0) {
            session_end(&s);
            print_message("%s: the session was ended after line %d; its later examples did "
                          "not run\n", d->name, e->line);
            failures++;
            break;
        }
    }
    session_end(&s);
    print_message("%s: %d block(s), %d command(s), %.1f s\n", d->name, d->nblocks, d->nex,
                  (double)(h_now_ms() - t0) / 1000.0);
}

/* Whether DOCTEST_FILES (comma-separated names) lets file name run. */
static int selected(const char *name)
{
    const char *sel = getenv("DOCTEST_FILES");
    if (!sel || !*sel)
        return 1;
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    char copy[512];
    snprintf(copy, sizeof copy, "%s", sel);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (!strcmp(t, name) || !strcmp(t, base))
            return 1;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of README.md, then of docs' .md files in name order, into docs. */
static int doc_files(doc_t *docs, int cap)
{
    int n = 0;
    snprintf(docs[n++].name, sizeof docs->name, "README.md");
    char *found[64];
    int nf = 0;
    DIR *dir = opendir(SD_SOURCE_DIR "/docs");
    assert_non_null(dir);
    struct dirent *de;
    while ((de = readdir(dir)) && nf < 64) {
        size_t len = strlen(de->d_name);
        if (len > 3 && !strcmp(de->d_name + len - 3, ".md"))
            found[nf++] = xstrdup(de->d_name);
    }
    closedir(dir);
    qsort(found, (size_t)nf, sizeof *found, by_name);
    for (int i = 0; i < nf; i++) {
        if (n < cap && strlen(found[i]) < sizeof docs->name - 6)
            snprintf(docs[n++].name, sizeof docs->name, "docs/%s", found[i]);
        free(found[i]);
    }
    return n;
}

/* ---- the cluster ---- */

static char state_dir[450], url[64];

/* Processes whose environment names this cluster's serverdir or whose command line names
 * its state dir or ports (as it.cluster_script checks). */
static int leftovers(void)
{
    return h_leftovers(url, workdir, ports, 2);
}

static int no_leftovers(void *arg)
{
    (void)arg;
    return leftovers() == 0;
}

typedef struct {
    pid_t pid;
    const char *log;
    int exited, status;
} banner_wait_t;

static int banner_or_exit(void *arg)
{
    banner_wait_t *w = arg;
    char *out = h_slurp(w->log);
    int up = out && strstr(out, "Press Ctrl-C to stop.");
    free(out);
    if (up)
        return 1;
    w->exited = h_exited(w->pid, &w->status);
    return w->exited;
}

/* Where the examples run. By default a fresh cluster in a temp dir on free ports; with
 * DOCTEST_DIR (the directory holding a running cluster's .cluster/) and DOCTEST_PORTS (its
 * serverdir, redis and two logs ports, comma-separated), that cluster: to work on a doc
 * without starting one each time. Returns whether it is an existing one. */
static int choose_cluster(void)
{
    const char *dir = getenv("DOCTEST_DIR"), *p = getenv("DOCTEST_PORTS");
    if (dir) {
        if (!p || sscanf(p, "%d,%d,%d,%d", &ports[0], &ports[1], &ports[2], &ports[3]) != 4)
            fail_msg("DOCTEST_DIR needs DOCTEST_PORTS=SERVERDIR,REDIS,LOGS,LOGS2");
        snprintf(workdir, sizeof workdir, "%s", dir);
    } else {
        snprintf(workdir, sizeof workdir, "%s/docs", h_tmpdir());
        assert_int_equal(mkdir(workdir, 0700), 0);
        for (int k = 0; k < NPORTS; k++)
            ports[k] = h_free_port();
    }
    snprintf(state_dir, sizeof state_dir, "%s/.cluster", workdir);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ports[0]);
    return dir != NULL;
}

/* scripts/cluster.sh started on this run's ports and state dir; returns its pid once it
 * printed its banner. */
static pid_t cluster_start(void)
{
    char log[500], e_port[32], e_rport[32], e_lport[32], e_lport2[32], e_dir[500], e_bin[600];
    snprintf(log, sizeof log, "%s/cluster.out", h_tmpdir());
    snprintf(e_port, sizeof e_port, "SD_PORT=%d", ports[0]);
    snprintf(e_rport, sizeof e_rport, "SD_REDIS_PORT=%d", ports[1]);
    snprintf(e_lport, sizeof e_lport, "SD_LOGS_PORT=%d", ports[2]);
    snprintf(e_lport2, sizeof e_lport2, "SD_LOGS_PORT2=%d", ports[3]);
    snprintf(e_dir, sizeof e_dir, "SD_CLUSTER_DIR=%s", state_dir);
    snprintf(e_bin, sizeof e_bin, "SD_BIN=%s", SD_BIN_DIR);
    const char *argv[] = {"/bin/bash", SD_SOURCE_DIR "/scripts/cluster.sh", NULL};
    const char *env[] = {e_port, e_rport, e_lport, e_lport2, e_dir, e_bin, "SD_REDIS=", NULL};
    pid_t pid = h_spawn(argv, log, env);
    assert_true(pid > 0);
    banner_wait_t w = {pid, log, 0, 0};
    if (!h_wait_until(banner_or_exit, &w, 60000) || w.exited) {
        char *out = h_slurp(log);
        fail_msg("cluster.sh did not print its banner within 60 s (exited: %d, status %d):\n%s",
                 w.exited, w.status, out ? out : "");
    }
    return pid;
}

/* A Ctrl-C to the script, as it.cluster_script sends it, and nothing may be left. */
static void cluster_stop(pid_t pid)
{
    kill(-pid, SIGINT);
    int status = h_wait_exit(pid, 45000);
    assert_true(status != -1 && WIFEXITED(status));
    if (!h_wait_until(no_leftovers, NULL, 5000))
        fail_msg("processes were left behind (listed above)");
}

static void docs_examples(void **state)
{
    (void)state;
    int existing = choose_cluster();
    static doc_t docs[64];
    int ndocs = doc_files(docs, 64), blocks = 0, cmds = 0;
    for (int i = 0; i < ndocs; i++) {
        char *path;
        assert_true(asprintf(&path, "%s/%s", SD_SOURCE_DIR, docs[i].name) > 0);
        char *text = h_slurp(path);
        free(path);
        assert_non_null(text);
        parse_doc(&docs[i], text);
        free(text);
        if (selected(docs[i].name)) {
            blocks += docs[i].nblocks;
            cmds += docs[i].nex;
        }
    }
    assert_true(cmds > 0);

    int64_t t0 = h_now_ms();
    pid_t pid = existing ? 0 : cluster_start();
    print_message("cluster up in %.1f s; %d block(s), %d command(s) to run\n",
                  (double)(h_now_ms() - t0) / 1000.0, blocks, cmds);
    for (int i = 0; i < ndocs; i++)
        if (docs[i].nex && selected(docs[i].name))
            run_doc(&docs[i]);
    if (!existing)
        cluster_stop(pid);
    print_message("%d command(s) run in %.1f s, %d failure(s)\n", commands_run,
                  (double)(h_now_ms() - t0) / 1000.0, failures);
    if (failures)
        fail_msg("%d doc example(s) differ from what the software prints (details above)",
                 failures);
}

/* Whether the expected lines (separated by \n) match the actual ones, as check_output
 * compares them. */
static int matches(const char *want, const char *got)
{
    char *w = xstrdup(want), *g = xstrdup(got), **wl, **gl;
    int nw = split_lines(w, &wl), ng = split_lines(g, &gl), pi, pj;
    int ok = lines_match(wl, nw, gl, ng, &pi, &pj);
    free(wl);
    free(gl);
    free(w);
    free(g);
    return ok;
}

/* The comparison rules of docs/doctest.md, each with a drift it must catch: a runner that
 * matched everything would pass every example. */
static void comparison_rules(void **state)
{
    (void)state;
    /* JSON: same keys, "..." values, an open object, arrays with "..." */
    assert_true(matches("{\"status\":\"ok\",\"version\":\"...\"}",
                        "{\"version\":\"0.1.0\",\"status\":\"ok\"}"));
    assert_false(matches("{\"status\":\"ok\"}", "{\"status\":\"ok\",\"version\":\"0.1.0\"}"));
    assert_false(matches("{\"status\":\"ok\",\"version\":\"...\"}", "{\"status\":\"ok\"}"));
    assert_true(matches("{\"a\":1,\"...\":\"...\"}", "{\"a\":1.0,\"b\":2}"));
    assert_false(matches("{\"a\":1,\"...\":\"...\"}", "{\"a\":2,\"b\":2}"));
    assert_true(matches("{\"l\":[\"...\",3]}", "{\"l\":[1,2,3]}"));
    assert_false(matches("{\"l\":[\"...\",3]}", "{\"l\":[1,3,2]}"));
    assert_true(matches("{\"m\":\"lock '...' is held\"}", "{\"m\":\"lock 'p:1' is held\"}"));
    /* text: "..." within a line, blanks, lines of "...", the exit status line */
    assert_true(matches("ID  STATE  PID\nzone-...  ready  ...", "ID           STATE  PID\nzone-1-a  ready  42"));
    assert_false(matches("ID  STATE  GEN", "ID  STATE  RESTARTS"));
    assert_false(matches("zone-...  ready", "zone-1  stopped"));
    assert_true(matches("HEAD\n...\nlast", "HEAD\na\nb\nlast"));
    assert_true(matches("HEAD\n...\nlast", "HEAD\nlast"));
    assert_false(matches("HEAD\n...\nlast", "HEAD\na"));
    assert_false(matches("one", "one\ntwo"));
    assert_false(matches("sdctl: 404 ...", "sdctl: 404 not_found: x\n[exit 4]"));
    assert_true(matches("sdctl: 404 ...\n[exit 4]", "sdctl: 404 not_found: x\n[exit 4]"));
}

int main(void)
{
    h_init(290);
    const struct CMUnitTest tests[] = {cmocka_unit_test(comparison_rules),
                                       cmocka_unit_test(docs_examples)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
