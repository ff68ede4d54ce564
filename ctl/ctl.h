/* sdctl internals. A command is declared beside its body with one line at file scope:
 *
 *     SDCTL_CMD("machines", cmd_machines, "list machines and their leases");
 *
 * and the build generates the command table from the ctl/cmd_*.c files. sdctl talks to
 * ServerDir only through libsdclient's public API. */
#ifndef SDCTL_CTL_H
#define SDCTL_CTL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "sdclient.h"
#include "sdlog.h" /* the exit codes, CTL_EXIT_* */

typedef struct ctl {
    sdc_t *client;
    const char *url;
    const char *token;
    const char *cluster;
    int json;   /* -o json or -o yaml (the same answers, printed by ctl_print_json) */
    int wide;   /* -o wide: tables with their extra columns */
    int names;  /* -o name: list commands print KIND/NAME, one a line (json is set too:
                   the answers go through ctl_print_json, which prints the names) */
    int color;  /* stdout is a terminal and NO_COLOR is unset */
} ctl_t;

typedef int (*ctl_cmd_fn)(ctl_t *ctl, int argc, char **argv);

typedef struct {
    const char *name;
    ctl_cmd_fn fn;
    const char *summary;
} ctl_cmd_t;

#define SDCTL_CMD(name, fn, summary) int fn(ctl_t *ctl, int argc, char **argv)

extern const ctl_cmd_t ctl_cmds[];
extern const size_t ctl_ncmds;

/* Maps a libsdclient result to an exit code, printing the error to stderr
 * ("sdctl: 409 lock_held: ..."). Returns CTL_EXIT_OK for SDC_OK. */
int ctl_fail(int rc, const sdc_err_t *err);
/* ctl_fail, then frees what err holds (sdc_err_clear): the end of a failed call. */
int ctl_fail_clear(int rc, sdc_err_t *err);
/* The URL of path on the logs port of machine's bigbrother (its lease's address and
 * logs_port) into url: SDC_OK, 1 when the machine serves no logs port, or the sdc error
 * of reading the machine (err set). */
int ctl_bb_url(ctl_t *ctl, const char *machine, const char *path, char *url, size_t cap,
               sdc_err_t *err);
/* When any of argv[1..argc-1] is --help or -h: prints text on stdout and returns 1. */
int ctl_wants_help(int argc, char **argv, const char *text);
/* Prints a usage error for cmd and returns CTL_EXIT_USAGE. */
int ctl_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* For a command that takes no argument: --help or -h prints usage on stdout and returns
 * CTL_EXIT_OK, any other argument is a usage error (CTL_EXIT_USAGE); -1 when argv holds
 * nothing else and the command goes on. */
int ctl_no_args(int argc, char **argv, const char *cmd, const char *usage);

/* For a command that takes one operand (e.g. MACHINE): --help or -h prints usage and
 * returns CTL_EXIT_OK; anything but one operand is a usage error naming `what`
 * ("expected MACHINE"); -1 when argv[1] is the operand and the command goes on. */
int ctl_one_arg(int argc, char **argv, const char *cmd, const char *usage, const char *what);

/* After an empty listing: 1 with a message on stderr (naming the known clusters) when
 * ServerDir does not know ctl->cluster, so a typo in --cluster is not an empty table; 0
 * when it is known or that cannot be told. */
int ctl_cluster_unknown(const ctl_t *ctl);

/* Prints the answer `ans` for people (ctl_answer calls it without -o json). */
typedef void (*ctl_human_fn)(const ctl_t *ctl, const json_t *ans, const void *arg);
/* The end of a command that prints one answer: on failure (rc != SDC_OK) the error and
 * its exit code (ctl_fail_clear); with -o json the answer as JSON; otherwise
 * human(ctl, ans, arg). Frees ans in every case. */
int ctl_answer(const ctl_t *ctl, int rc, sdc_err_t *err, json_t *ans, ctl_human_fn human,
               const void *arg);
/* An on/off switch command pair (drain/undrain, stop/start): one function serves both
 * names. set is the libsdclient setter (sdc_machine_drain, sdc_service_stop). */
typedef struct {
    const char *usage;           /* the --help text of both names */
    const char *operand;         /* "MACHINE", "SERVICE" */
    const char *on_cmd, *off_cmd; /* "drain" / "undrain" */
    int (*set)(sdc_t *c, const char *cluster, const char *name, int on, json_t **out,
               sdc_err_t *err);
    const char *on_word, *off_word; /* "draining" / "undrained" */
} ctl_switch_t;
/* The whole switch command: checks the command line (ctl_one_arg), calls sw->set for
 * OPERAND (on unless argv[0] is sw->off_cmd) and prints the answer with
 * ctl_switch_answer. Returns the exit code. */
int ctl_switch_cmd(ctl_t *ctl, int argc, char **argv, const ctl_switch_t *sw);
/* ctl_answer for an on/off switch (drain, stop/start, cluster stop): prints
 * "<what>: <word>", with " (already)" when the answer says nothing changed. */
int ctl_switch_answer(const ctl_t *ctl, int rc, sdc_err_t *err, json_t *ans, const char *what,
                      const char *word);
/* Prints v as indented JSON on stdout (for -o json), or as YAML after
 * ctl_output_yaml(1) (-o yaml). Does not steal v. */
void ctl_print_json(const json_t *v);
void ctl_output_yaml(int on);
/* v as block-style YAML ("---" first; strings double-quoted, JSON's escapes). */
void ctl_print_yaml(FILE *f, const json_t *v);

/* Column-aligned tables for people (at most 32 columns): add the header, then rows;
 * print frees. */
typedef struct ctl_table ctl_table_t;
ctl_table_t *ctl_table_new(int ncols, ...);
void ctl_table_row(ctl_table_t *t, ...); /* ncols const char* cells (NULL prints "-") */
void ctl_table_rowv(ctl_table_t *t, const char *const *cells); /* the same from an array */
/* The column headers from an array (ncols of them). */
ctl_table_t *ctl_table_newv(int ncols, const char *const *headers);
void ctl_table_print(ctl_table_t *t, FILE *out, int color);
/* --no-headers: every table after this prints without its header row. */
void ctl_table_no_headers(int on);

/* A process record's restarts as text (its `restarts` field, the count bigbrother keeps
 * and reports: docs/design.md, "Figures"), "-" without one. Every sdctl column of
 * restarts shows this, never a figure of its own. */
const char *ctl_restarts(const json_t *proc, char *buf, size_t cap);
/* Sorts an array of objects by the string member key, digit runs by value ("zone-2"
 * before "zone-10"). */
void ctl_sort_natural(json_t *array, const char *key);
/* strcmp with digit runs compared by value. */
int ctl_natural_cmp(const char *a, const char *b);

/* Formats a millisecond duration or age as "850ms", "12s", "3m4s", "2h5m", "3d4h". */
const char *ctl_fmt_ms(long long ms, char *buf, size_t cap);
/* A JSON scalar as text (strings as is, numbers, true/false), or "-" for null/absent. */
const char *ctl_jstr(const json_t *v, char *buf, size_t cap);
/* An object of strings or integers as "k=v,k=v" ("zone=eu,rack=3", "game=27960"; "?" for
 * another value), cut where the next pair would not fit in cap. */
const char *ctl_kv_text(const json_t *obj, char *buf, size_t cap);

/* A duration for a --wait or --since option: a number of milliseconds, or a number with
 * the unit ms, s, m or h ("500", "500ms", "2s", "1m", "1h"), from 0 to max_ms. 0, or -1
 * when s is not one. */
int ctl_parse_ms(const char *s, int64_t max_ms, int64_t *out);
/* The warm pool of a service record (GET .../services): "4 free / 2 alloc" (its ready
 * unallocated and its allocated instances) when its spec has a pool, else NULL. */
const char *ctl_pool_text(const json_t *service, char *buf, size_t cap);

/* sdctl apply's file format: {"services": {NAME: SPEC, ...}} or [{"name": NAME, ...}, ...]
 * into a new {NAME: SPEC} object (specs are checked by ServerDir, not here), or NULL with
 * why in err. Pure, for tests and fuzzing. */
json_t *ctl_apply_parse(const char *text, size_t len, char *err, size_t errcap);

/* ---- mistakes on the command line */

#define CTL_SUGGEST_MAX 64 /* longest word ctl_edit_distance compares */
/* The edit distance of a and b (insertions, deletions, substitutions, and swaps of two
 * neighbours: "lgos" is 1 from "logs"), or (size_t)-1 when either is longer than
 * CTL_SUGGEST_MAX. Pure. */
size_t ctl_edit_distance(const char *a, const char *b);
/* The name of names[0..n) closest to word within a third of its length (1 to 3 edits),
 * the first of equals; NULL when none is that close. Pure; points into names. */
const char *ctl_suggest(const char *word, const char *const *names, size_t n);
/* "sdctl CMD: OPT needs a value (WHAT)" on stderr (cmd NULL: a global option); returns
 * CTL_EXIT_USAGE. */
int ctl_missing_value(const char *cmd, const char *opt, const char *what);
/* -o name: "KIND/NAME" on stdout, NAME the string (or number) at item[key] (key NULL:
 * item itself). */
void ctl_print_name(const char *kind, const json_t *item, const char *key);
/* -o name of a whole answer: a line per item of each list it holds (processes ->
 * instance/NAME, machines, services and static_services, locks -> lock/KEY, allocations,
 * clusters, servers -> server/ADDRESS, events -> event/SEQ), or one line for a single
 * record (an allocation, process, machine, service or lock). */
void ctl_print_names(const json_t *ans);
/* -o name: ctl_print_json prints ctl_print_names instead. */
void ctl_output_names(int on);
/* Sorts an array of objects by the integer member key, the largest first (the newest
 * first for a time); items without it last. */
void ctl_sort_newest(json_t *array, const char *key);

#endif
