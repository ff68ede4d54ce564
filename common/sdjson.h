/* JSON helpers over jansson for validating outside input: every getter checks presence,
 * type and range, and on failure writes a message that names the field into err. */
#ifndef SD_JSON_H
#define SD_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SD_JSON_MAX_DEPTH 32

/* Parses len bytes as one JSON value no deeper than maxdepth. Returns a new reference,
 * or NULL with a message in err ("invalid JSON at line 1 column 5: ..."). */
json_t *sd_json_parse(const char *buf, size_t len, int maxdepth, char *err, size_t errcap);

/* Each getter returns 0 and sets *out, 1 if the field is absent and optional (out is left
 * as it was), or -1 with a message in err. */
int sd_json_str(const json_t *obj, const char *key, int required, size_t maxlen,
                const char **out, char *err, size_t errcap);
int sd_json_name(const json_t *obj, const char *key, int required, const char **out,
                 char *err, size_t errcap);
int sd_json_int(const json_t *obj, const char *key, int required, int64_t min, int64_t max,
                int64_t *out, char *err, size_t errcap);
int sd_json_bool(const json_t *obj, const char *key, int required, int *out, char *err,
                 size_t errcap);

/* Fails when obj holds a key not in the NULL-terminated list `allowed`. */
int sd_json_only_keys(const json_t *obj, const char *const *allowed, char *err, size_t errcap);

/* Dumps v compactly into a malloc'd string (caller frees). */
char *sd_json_dump(const json_t *v);

#endif
