/* libFuzzer target: the token file parser (serverdir/http/auth.c, sd_auth_parse). Property:
 * the count never exceeds the number of lines; a refusal names a line within the text
 * and a reason. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    long lines = 1;
    for (size_t i = 0; i < size && text[i]; i++)
        lines += text[i] == '\n';
    int bad_line = 0;
    const char *why = NULL;
    long n = sd_auth_parse(text, &bad_line, &why);
    if (n > lines || (n < 0 && (bad_line < 1 || bad_line > lines || !why || !*why)))
        __builtin_trap();
    free(text);
    return 0;
}
