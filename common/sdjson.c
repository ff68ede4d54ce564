#include "sdjson.h"

#include "sdproto.h"
#include "sdutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks nesting depth without parsing: counts [ and { outside strings. */
static int depth_ok(const char *p, size_t n, int maxdepth)
{
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > maxdepth)
                return 0;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return 1;
}

json_t *sd_json_parse(const char *buf, size_t len, int maxdepth, char *err, size_t errcap)
{
    if (!depth_ok(buf, len, maxdepth)) {
        snprintf(err, errcap, "JSON nested deeper than %d levels", maxdepth);
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!v)
        snprintf(err, errcap, "invalid JSON at line %d column %d: %s", je.line, je.column,
                 je.text);
    return v;
}

char *sd_json_dump(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}
