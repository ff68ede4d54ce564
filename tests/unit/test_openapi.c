/* Every route serverdir serves is documented in docs/openapi.yaml with the same path
 * pattern and method, and every documented path is served: the docs cannot drift. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd.h"

#define MAXP 256
static char paths[MAXP][160];
static char methods[MAXP][96]; /* " get put " */
static int npaths;

/* Reads the `paths:` section: two-space-indented "/path:" keys and their
 * four-space-indented method keys. */
static void load_spec(void)
{
    FILE *f = fopen(SD_SOURCE_DIR "/docs/openapi.yaml", "r");
    assert_non_null(f);
    char line[8192]; /* longer than any line of the file: a cut line would end `paths:` */
    int in_paths = 0, cur = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!strncmp(line, "paths:", 6)) {
            in_paths = 1;
            continue;
        }
        if (in_paths && line[0] && line[0] != ' ' && line[0] != '#')
            in_paths = 0;
        if (!in_paths)
            continue;
        if (!strncmp(line, "  /", 3) && line[strlen(line) - 1] == ':') {
            assert_true(npaths < MAXP);
            cur = npaths++;
            snprintf(paths[cur], sizeof paths[cur], "%.*s", (int)strlen(line) - 3, line + 2);
            strcpy(methods[cur], " ");
        } else if (cur >= 0 && !strncmp(line, "    ", 4) && islower((unsigned char)line[4])) {
            char m[16];
            if (sscanf(line + 4, "%15[a-z]:", m) == 1 &&
                (!strcmp(m, "get") || !strcmp(m, "put") || !strcmp(m, "post") ||
                 !strcmp(m, "delete") || !strcmp(m, "patch") || !strcmp(m, "head"))) {
                strncat(methods[cur], m, sizeof methods[cur] - strlen(methods[cur]) - 2);
                strcat(methods[cur], " ");
            }
        }
    }
    fclose(f);
    assert_true(npaths > 0);
}

static void every_route_is_documented(void **state)
{
    load_spec();
    int missing = 0;
    for (size_t r = 0; r < sd_nroutes; r++) {
        char want[16];
        snprintf(want, sizeof want, " %s ", sd_routes[r].method);
        for (char *p = want; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        int found = 0;
        for (int i = 0; i < npaths; i++)
            if (!strcmp(paths[i], sd_routes[r].pattern) && strstr(methods[i], want))
                found = 1;
        if (!found) {
            fprintf(stderr, "undocumented: %s %s\n", sd_routes[r].method, sd_routes[r].pattern);
            missing++;
        }
    }
    assert_int_equal(missing, 0);
}

static void every_documented_path_is_served(void **state)
{
    int extra = 0;
    for (int i = 0; i < npaths; i++) {
        int found = 0;
        for (size_t r = 0; r < sd_nroutes; r++)
            if (!strcmp(paths[i], sd_routes[r].pattern))
                found = 1;
        if (!found) {
            fprintf(stderr, "documented but not served: %s\n", paths[i]);
            extra++;
        }
    }
    assert_int_equal(extra, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_route_is_documented),
        cmocka_unit_test(every_documented_path_is_served),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
