/* Harness additions for the tests that drive the built sdctl: run it to its end and
 * capture what it printed, and pick lines out of that output. */
#ifndef SD_HARNESS_SDCTL_H
#define SD_HARNESS_SDCTL_H

#include <stdarg.h>
#include <stddef.h>

/* Runs SD_BIN_DIR/sdctl with the arguments args (NULL-terminated, at most 30) and the
 * environment entries env (NULL-terminated, "K=V", or NULL: none) added to the test's.
 * Waits up to timeout_ms for it to exit. Fills out (cap bytes, NUL-terminated) with
 * what it printed, stdout then stderr, through <h_tmpdir()>/sdctl.out. Returns its exit
 * code, or -1 when it was killed by a signal or did not exit in time (then it is killed,
 * with its process group, and reaped: what it printed until then is in out). */
int h_sdctl_run(const char *const *args, const char *const *env, int timeout_ms, char *out,
                size_t cap);

/* h_sdctl_run with the arguments taken from ap (const char *, up to a NULL). */
int h_sdctl_vrun(const char *const *env, int timeout_ms, char *out, size_t cap, va_list ap);

/* Copies into line (cap bytes) the first line of text that holds needle and returns
 * line, or NULL when needle is absent. A needle starting with a newline matches at the
 * start of a line. */
const char *h_line_with(const char *text, const char *needle, char *line, size_t cap);

#endif
