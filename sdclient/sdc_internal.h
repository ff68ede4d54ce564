/* libsdclient internals shared by its source files; not part of the public API. */
#ifndef SDC_INTERNAL_H
#define SDC_INTERNAL_H

#include "sdclient.h"

/* Fills err (when given; cleared first) with the message `what` and returns
 * SDC_E_INVAL: a bad argument, caught before any request is sent. */
int sdc__inval(sdc_err_t *err, const char *what);

/* Sets err's message (when err is given) to `what` and returns SDC_E_PROTO: the answer
 * does not have the shape the API documents. */
int sdc__proto(sdc_err_t *err, const char *what);

#endif
