#ifndef SD_VALID_H
#define SD_VALID_H

/* One JSON validator for outside input (HTTP bodies, config files, apply files). A
 * validation context carries the error buffer and the path of the field being read, so
 * every message names the field where it sits: "services[2].health.type must be ...".
 *
 * Messages read, for a path P and a reason R:
 *   plain context   "field 'P' R" when P is keys only ("field 'labels.zone' ..."), else
 *                   "P R" when P goes through an array or map entry ("events[0].pid ...");
 *                   an unknown key reads "unknown field 'P'"
 *   file context    "FILE: P: R" (an empty P reads "(top level)");
 *                   an unknown key reads "FILE: P: unknown field"
 *
 * Every getter reads obj[key] with the key pushed on the path, and returns 0 and sets
 * *out, 1 if the field is absent or null and optional (*out is left as it was, so the
 * caller sets the default first), or -1 with the message in the context's buffer. A
 * getter given a non-object obj sees every field as absent. `required` is one of: */
enum {
    SD_JV_OPTIONAL = 0, /* absent or null: 1 */
    SD_JV_REQUIRED = 1, /* absent or null: "is required" */
    SD_JV_NONNULL = 2,  /* absent: 1; null: refused as the wrong type */
};

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *err;
    size_t errcap;
    const char *file; /* NULL for a plain context */
    char path[256];
    size_t pathlen;
} sd_jv_t;

/* A plain context whose paths start at root ("" for the top level, or a prefix such as
 * "events" or "master"); messages go to err. */
void sd_jv_init(sd_jv_t *v, const char *root, char *err, size_t errcap);

/* A context for the config file `file` (not copied: it must outlive v); paths start at
 * the top level. */
void sd_jv_init_file(sd_jv_t *v, const char *file, char *err, size_t errcap);

/* Push ".key", "[i]" or "['member']" (an entry of a map whose keys are data, cut to 64
 * bytes) on the path; each returns the mark that sd_jv_pop takes to restore the path as
 * it was before the push. A path longer than the buffer ends in "...". */
size_t sd_jv_key(sd_jv_t *v, const char *key);
size_t sd_jv_index(sd_jv_t *v, size_t i);
size_t sd_jv_member(sd_jv_t *v, const char *member);
void sd_jv_pop(sd_jv_t *v, size_t mark);

/* Reports "<path>[.key] <why>" (key may be NULL for the current path); returns -1. */
int sd_jv_fail(sd_jv_t *v, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A string of at most maxlen bytes without NUL. */
int sd_jv_str(sd_jv_t *v, const json_t *obj, const char *key, int required, size_t maxlen,
              const char **out);
/* A name as sd_name_valid accepts it (1-SD_NAME_MAX characters). */
int sd_jv_name(sd_jv_t *v, const json_t *obj, const char *key, int required,
               const char **out);
/* An integer from min to max. */
int sd_jv_int(sd_jv_t *v, const json_t *obj, const char *key, int required, int64_t min,
              int64_t max, int64_t *out);
/* The same into an int (min and max are ints, so the value fits). */
int sd_jv_i32(sd_jv_t *v, const json_t *obj, const char *key, int required, int min, int max,
              int *out);
/* true or false, as 1 or 0. */
int sd_jv_bool(sd_jv_t *v, const json_t *obj, const char *key, int required, int *out);
/* An object; *out is borrowed from obj. */
int sd_jv_object(sd_jv_t *v, const json_t *obj, const char *key, int required,
                 json_t **out);
/* An array of at most maxitems entries; *out is borrowed from obj. */
int sd_jv_array(sd_jv_t *v, const json_t *obj, const char *key, int required,
                size_t maxitems, json_t **out);
/* A string equal to one of the NULL-terminated `names`; *out is its index. The message
 * lists the names ("must be one of a, b, c", or "must be a or b" for two); a file
 * context puts the value first ("'x' must be one of ..."). */
int sd_jv_enum(sd_jv_t *v, const json_t *obj, const char *key, int required,
               const char *const *names, int *out);

/* Fails, naming the key with its path, when obj holds a key not in the NULL-terminated
 * list `allowed`; returns 0 or -1. */
int sd_jv_only_keys(sd_jv_t *v, const json_t *obj, const char *const *allowed);

#endif
