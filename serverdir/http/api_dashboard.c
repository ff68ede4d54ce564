/* The dashboard: one static page (http/www/dashboard.html, embedded by the build)
 * that reads the REST API from the browser, with a viewer token if auth is on. Its
 * policy lets it connect to other http(s) origins as well: an instance's live log and
 * health come from the logs port of its machine's bigbrother (docs/operations.md). */
#include <string.h>

#include "sd.h"

SD_ROUTE(GET, "/", SD_PUBLIC, SD_HTTP_THREAD, h_dashboard);

void h_dashboard(sd_req_t *req, sd_resp_t *resp)
{
    for (size_t i = 0; i < sd_nwww; i++) {
        if (strcmp(sd_www_srcs[i].name, "dashboard") == 0) {
            sd_resp_header(resp, "Content-Security-Policy",
                           "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                           "connect-src 'self' http: https:; frame-ancestors 'none'");
            sd_resp_header(resp, "X-Content-Type-Options", "nosniff");
            sd_resp_bytes(resp, 200, "text/html; charset=utf-8", sd_www_srcs[i].body,
                          strlen(sd_www_srcs[i].body));
            return;
        }
    }
    sd_resp_error(resp, 404, "not_found", "no dashboard in this build");
}
