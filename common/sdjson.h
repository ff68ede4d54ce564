/* JSON parsing over jansson for outside input: a depth cap and duplicate keys refused, and
 * compact dumping. Field checks are common/sdvalid.h's. */
#ifndef SD_JSON_H
#define SD_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SD_JSON_MAX_DEPTH 32

/* Parses len bytes as one JSON value no deeper than maxdepth. Returns a new reference,
 * or NULL with a message in err ("invalid JSON at line 1 column 5: ..."). */
json_t *sd_json_parse(const char *buf, size_t len, int maxdepth, char *err, size_t errcap);

/* Dumps v compactly into a malloc'd string (caller frees). */
char *sd_json_dump(const json_t *v);

#endif
