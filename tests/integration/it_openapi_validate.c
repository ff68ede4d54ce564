/* docs/openapi.yaml passes a maintained OpenAPI 3 validator (@apidevtools/swagger-parser,
 * from npm, installed by the README test command into .npm-tools/) and every operation
 * has its own operationId (an inline mapping with unquoted commas makes bogus keys that
 * only a validator notices). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(openapi_document_is_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
