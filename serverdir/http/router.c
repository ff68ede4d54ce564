#include "router.h"

#include <string.h>

/* Compares one pattern against the split path segments. Returns 1 on a match and fills
 * params with the segments that stand where the pattern has {name}. */
static int pattern_match(const char *pat, char **segs, int nsegs, const char **params,
                         int *nparams)
{
    int i = 0, np = 0;
    const char *p = pat;
    if (strcmp(pat, "/") == 0) { /* the root (the dashboard): no segment at all */
        if (nsegs)
            return 0;
        *nparams = 0;
        return 1;
    }
    while (*p) {
        if (*p != '/')
            return 0;
        p++;
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (i >= nsegs)
            return 0;
        if (len >= 2 && p[0] == '{' && p[len - 1] == '}') {
            if (np >= SD_MAX_PARAMS)
                return 0;
            params[np++] = segs[i];
        } else if (strlen(segs[i]) != len || memcmp(segs[i], p, len) != 0) {
            return 0;
        }
        i++;
        p += len;
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
    int nsegs = 0;
    if (plen > 1) {
        char *s = scratch + 1;
        for (;;) {
            if (nsegs == (int)(sizeof segs / sizeof segs[0]))
                return SD_ROUTE_NOT_FOUND;
            segs[nsegs++] = s;
            char *slash = strchr(s, '/');
            if (!slash)
                break;
            *slash = '\0';
            s = slash + 1;
        }
        for (int i = 0; i < nsegs; i++)
            if (segs[i][0] == '\0')
                return SD_ROUTE_NOT_FOUND; /* "//" or a trailing '/' */
    }

    const char *m = strcmp(method, "HEAD") == 0 ? "GET" : method;
    int path_seen = 0, best = -1, best_np = SD_MAX_PARAMS + 1;
    if (allow && allowcap)
        allow[0] = '\0';
    for (size_t r = 0; r < n; r++) {
        const char *pp[SD_MAX_PARAMS];
        int np = 0;
        if (!pattern_match(table[r].pattern, segs, nsegs, pp, &np))
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
