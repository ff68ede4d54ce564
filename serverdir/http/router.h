/* Matches "METHOD /path" against the generated route table. Pure, no I/O, unit-tested. */
#ifndef SD_ROUTER_H
#define SD_ROUTER_H

#include <stddef.h>

#include "sd.h"

#define SD_ROUTE_NOT_FOUND (-1)
#define SD_ROUTE_BAD_METHOD (-2)
#define SD_PATH_MAX 1024

/* Splits path into scratch (at least strlen(path)+1 bytes) and matches it against the
 * first n routes of table. On a match returns the route index and points params[] into
 * scratch. Returns SD_ROUTE_BAD_METHOD when the path matches only other methods (their
 * names are appended comma-separated to allow, if given), else SD_ROUTE_NOT_FOUND.
 * HEAD matches GET routes. */
int sd_route_match(const sd_route_t *table, size_t n, const char *method, const char *path,
                   char *scratch, size_t scratchcap, const char **params, int *nparams,
                   char *allow, size_t allowcap);

#endif
