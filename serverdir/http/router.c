#include "router.h"

#include <string.h>

/* Compares one pattern against the split path segments (seglen: their lengths). Returns 1
 * on a match and fills params with the segments that stand where the pattern has {name}.
 * A literal segment is compared as it is scanned, so most patterns are left at their
 * first differing byte. */
static int pattern_match(const char *pat, char **segs, const size_t *seglen, int nsegs,
                         const char **params, int *nparams)
{
    int i = 0, np = 0;
    const char *p = pat;
    if (p[0] == '/' && p[1] == '\0') { /* the root (the dashboard): no segment at all */
        if (nsegs)
            return 0;
        *nparams = 0;
        return 1;
    }
    while (*p) {
        if (*p != '/')
            return 0;
        p++;
        if (i >= nsegs)
            return 0;
        if (p[0] == '{') {
            const char *end = strchr(p, '/');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len >= 2 && p[len - 1] == '}') {
                if (np >= SD_MAX_PARAMS)
                    return 0;
                params[np++] = segs[i++];
                p += len;
                continue;
            }
        }
        const char *s = segs[i];
        size_t k = 0, n = seglen[i];
        while (k < n && p[k] == s[k]) /* a '/' or the end in p never equals a path byte */
            k++;
        if (k != n || (p[k] != '/' && p[k] != '\0'))
            return 0;
        i++;
        p += k;
    }
    if (i != nsegs)
        return 0;
    *nparams = np;
    return 1;
}

int sd_route_match(const sd_route_t *table, size_t n, const char *method, const char *path,
                   char *scratch, size_t scratchcap, const char **params, int *nparams,
                   char *allow, size_t allowcap)
{
    size_t plen = strlen(path);
    if (path[0] != '/' || plen + 1 > scratchcap)
        return SD_ROUTE_NOT_FOUND;
    memcpy(scratch, path, plen + 1);

    char *segs[32];
    size_t seglen[32];
    int nsegs = 0;
    if (plen > 1) {
        char *s = scratch + 1;
        for (;;) {
            if (nsegs == (int)(sizeof segs / sizeof segs[0]))
                return SD_ROUTE_NOT_FOUND;
            char *slash = strchr(s, '/');
            segs[nsegs] = s;
            seglen[nsegs++] = slash ? (size_t)(slash - s) : strlen(s);
            if (!slash)
                break;
            *slash = '\0';
            s = slash + 1;
        }
        for (int i = 0; i < nsegs; i++)
            if (seglen[i] == 0)
                return SD_ROUTE_NOT_FOUND; /* "//" or a trailing '/' */
    }

    const char *m = strcmp(method, "HEAD") == 0 ? "GET" : method;
    int path_seen = 0, best = -1, best_np = SD_MAX_PARAMS + 1;
    if (allow && allowcap)
        allow[0] = '\0';
    for (size_t r = 0; r < n; r++) {
        const char *pp[SD_MAX_PARAMS];
        int np = 0;
        if (!pattern_match(table[r].pattern, segs, seglen, nsegs, pp, &np))
            continue;
        if (strcmp(table[r].method, m) == 0) {
            /* The route with the most literal segments wins: /v1/locks/acquire
             * before /v1/locks/{key}. */
            if (np < best_np) {
                best = (int)r;
                best_np = np;
                memcpy(params, pp, sizeof pp);
                *nparams = np;
            }
            continue;
        }
        if (allow && allowcap && !strstr(allow, table[r].method)) {
            size_t al = strlen(allow);
            if (al + strlen(table[r].method) + 3 < allowcap)
                strcat(strcat(allow, al ? ", " : ""), table[r].method);
        }
        path_seen = 1;
    }
    if (best >= 0)
        return best;
    return path_seen ? SD_ROUTE_BAD_METHOD : SD_ROUTE_NOT_FOUND;
}
