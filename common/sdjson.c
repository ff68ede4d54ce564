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

/* ---- the writer ---- */

void sd_jw_init(sd_jw_t *w, sd_buf_t *b)
{
    w->b = b;
    w->depth = 0;
    w->first[0] = 1;
    w->err = 0;
}

static void jw_put(sd_jw_t *w, const char *p, size_t n)
{
    if (!w->err && sd_buf_append(w->b, p, n))
        w->err = 1;
}

/* A string, quoted and escaped as jansson's dump escapes it. */
static void jw_quoted(sd_jw_t *w, const char *s)
{
    static const char hex[] = "0123456789ABCDEF"; /* jansson writes \u001F */
    jw_put(w, "\"", 1);
    const char *run = s;
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        jw_put(w, run, (size_t)(p - run));
        run = p + 1;
        char esc[6] = {'\\', 0};
        size_t n = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        }
        jw_put(w, esc, n);
    }
    jw_put(w, run, strlen(run));
    jw_put(w, "\"", 1);
}

/* The comma before a member or element, and the member's key. */
static void jw_key(sd_jw_t *w, const char *key)
{
    if (!w->first[w->depth])
        jw_put(w, ",", 1);
    w->first[w->depth] = 0;
    if (key) {
        jw_quoted(w, key);
        jw_put(w, ":", 1);
    }
}

static void jw_open(sd_jw_t *w, const char *key, const char *bracket, char closer)
{
    jw_key(w, key);
    jw_put(w, bracket, 1);
    if (w->depth + 1 >= SD_JW_DEPTH) {
        w->err = 1;
        return;
    }
    w->depth++;
    w->first[w->depth] = 1;
    w->closer[w->depth] = closer;
}

void sd_jw_obj(sd_jw_t *w, const char *key) { jw_open(w, key, "{", '}'); }

void sd_jw_arr(sd_jw_t *w, const char *key) { jw_open(w, key, "[", ']'); }

void sd_jw_end(sd_jw_t *w)
{
    if (w->depth <= 0) {
        w->err = 1;
        return;
    }
    jw_put(w, &w->closer[w->depth], 1);
    w->depth--;
}

void sd_jw_str(sd_jw_t *w, const char *key, const char *v)
{
    if (!v) {
        sd_jw_null(w, key);
        return;
    }
    jw_key(w, key);
    jw_quoted(w, v);
}

void sd_jw_int(sd_jw_t *w, const char *key, int64_t v)
{
    char buf[SD_I64_DIGITS], *p = sd_fmt_i64(buf, v);
    jw_key(w, key);
    jw_put(w, p, (size_t)(buf + sizeof buf - p));
}

void sd_jw_bool(sd_jw_t *w, const char *key, int v)
{
    jw_key(w, key);
    jw_put(w, v ? "true" : "false", v ? 4 : 5);
}

void sd_jw_null(sd_jw_t *w, const char *key)
{
    jw_key(w, key);
    jw_put(w, "null", 4);
}

int sd_jw_done(const sd_jw_t *w) { return w->err || w->depth != 0 ? -1 : 0; }
