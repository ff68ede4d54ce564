/* docs/openapi.yaml passes a maintained OpenAPI 3 validator (@apidevtools/swagger-parser,
 * from npm, installed by the README test command into .npm-tools/) and every operation
 * has its own operationId (an inline mapping with unquoted commas makes bogus keys that
 * only a validator notices); and the linter (@redocly/cli lint, the same .npm-tools/,
 * with redocly.yaml) finds neither an error nor a warning in it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <jansson.h>

#include "harness.h"

static void openapi_document_is_valid(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "NODE_PATH='%s/.npm-tools/node_modules' node '%s/tests/tools/openapi_validate.js' "
             "'%s/docs/openapi.yaml' 2>&1",
             SD_SOURCE_DIR, SD_SOURCE_DIR, SD_SOURCE_DIR);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the validator refused docs/openapi.yaml (status %d):\n%s", st, out);
    assert_non_null(strstr(out, "valid "));
    print_message("%s", out);
}

/* redocly lint's JSON report: its totals must be 0 errors and 0 warnings. */
static void openapi_lint_is_clean(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s/.npm-tools/node_modules/.bin/redocly' lint --config '%s/redocly.yaml' "
             "--format=json '%s/docs/openapi.yaml' 2>/dev/null",
             SD_SOURCE_DIR, SD_SOURCE_DIR, SD_SOURCE_DIR);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char out[1 << 20];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    json_error_t jerr;
    json_t *report = json_loads(out, 0, &jerr);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !report)
        fail_msg("redocly lint did not run or failed (status %d):\n%.4000s", st, out);
    json_t *totals = json_object_get(report, "totals");
    long long errors = json_integer_value(json_object_get(totals, "errors"));
    long long warnings = json_integer_value(json_object_get(totals, "warnings"));
    if (!json_is_object(totals) || errors || warnings)
        fail_msg("redocly lint: %lld errors, %lld warnings in docs/openapi.yaml:\n%.6000s", errors,
                 warnings, out);
    print_message("redocly %s: 0 errors, 0 warnings\n",
                  json_string_value(json_object_get(report, "version")));
    json_decref(report);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(openapi_document_is_valid),
        cmocka_unit_test(openapi_lint_is_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
