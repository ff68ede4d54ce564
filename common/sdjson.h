/* JSON parsing over jansson for outside input: a depth cap and duplicate keys refused, and
 * compact dumping. Field checks are common/sdvalid.h's. */
#ifndef SD_JSON_H
#define SD_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sdutil.h"

#define SD_JSON_MAX_DEPTH 32

/* Parses len bytes as one JSON value no deeper than maxdepth. Returns a new reference,
 * or NULL with a message in err ("invalid JSON at line 1 column 5: ..."). */
json_t *sd_json_parse(const char *buf, size_t len, int maxdepth, char *err, size_t errcap);

/* Dumps v compactly into a malloc'd string (caller frees). */
char *sd_json_dump(const json_t *v);

/* ---- writing JSON straight into a buffer ----
 * For the answers on the hottest paths (a lock grant, a release, a renewal): building
 * jansson values and dumping them took about a tenth of serverdir's CPU per lock pair
 * (bench/README.md, "jemalloc and the JSON writer"). The output is what jansson's compact
 * dump of the same values writes: no spaces, members in the order written, strings
 * escaped as jansson escapes them (", \ and control characters; other bytes as they are,
 * so a string must be UTF-8, as every name is). A call with a key writes an object's
 * member, without one an array's element or the top value. */
#define SD_JW_DEPTH 8
typedef struct {
    sd_buf_t *b;
    int depth;
    unsigned char first[SD_JW_DEPTH]; /* at each open level: nothing written in it yet */
    char closer[SD_JW_DEPTH];         /* ... and what closes it, '}' or ']' */
    int err; /* an append failed, or nesting went past SD_JW_DEPTH or below the top */
} sd_jw_t;

void sd_jw_init(sd_jw_t *w, sd_buf_t *b);
void sd_jw_obj(sd_jw_t *w, const char *key); /* opens an object */
void sd_jw_arr(sd_jw_t *w, const char *key); /* opens an array */
void sd_jw_end(sd_jw_t *w);                  /* closes the innermost */
void sd_jw_str(sd_jw_t *w, const char *key, const char *v); /* v NULL: null */
void sd_jw_int(sd_jw_t *w, const char *key, int64_t v);
void sd_jw_bool(sd_jw_t *w, const char *key, int v);
void sd_jw_null(sd_jw_t *w, const char *key);
/* 0 when everything was written and every level closed, else -1. */
int sd_jw_done(const sd_jw_t *w);

#endif
