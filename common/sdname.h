/* The name rule of the wire contract, header-only and libc-only: sdproto.h includes it,
 * and so does libbbagent, which links nothing of libsdcommon (docs/design.md) yet must
 * refuse exactly the names serverdir and bigbrother refuse.
 *
 * cmake/lua_prelude.cmake reads the "#define SD_NAME <decimal>" lines here as it does
 * those of sdproto.h. */
#ifndef SD_NAME_H
#define SD_NAME_H

#include <stddef.h>
#include <string.h>

/* A name (cluster, machine, service, instance, event id, allocation id, lock key part):
 * 1..SD_NAME_MAX bytes of [A-Za-z0-9_.:@-], not starting with '.' or '-', no "..". Safe
 * as a Redis key part, a file name and a URL path segment. */
#define SD_NAME_MAX 128
#define SD_NAME_CHARSET_TEXT "A-Z a-z 0-9 _ . : @ -"

/* 1 when the n bytes at s are a name (see SD_NAME_MAX) of at most max bytes, else 0 (s
 * NULL too). s need not be NUL-terminated. */
static inline int sd_name_validn(const char *s, size_t n, size_t max)
{
    if (!s || n == 0 || n > max || s[0] == '.' || s[0] == '-')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-' || c == ':' || c == '@';
        if (!ok || (c == '.' && i > 0 && s[i - 1] == '.'))
            return 0;
    }
    return 1;
}

/* The same for a NUL-terminated string. */
static inline int sd_name_valid(const char *s, size_t max)
{
    return s && sd_name_validn(s, strlen(s), max);
}

#endif
