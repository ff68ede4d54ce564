/* Liveness, readiness and metrics. */
#include "sd.h"
#include "sdversion.h"

SD_ROUTE(GET, "/healthz", SD_PUBLIC, SD_HTTP_THREAD, h_healthz);
SD_ROUTE(GET, "/readyz", SD_PUBLIC, 0, h_readyz);
SD_ROUTE(GET, "/metrics", SD_PUBLIC, SD_HTTP_THREAD, h_metrics);

void h_healthz(sd_req_t *req, sd_resp_t *resp)
{
    sd_resp_json(resp, 200, json_pack("{s:s, s:s}", "status", "ok", "version", SD_VERSION));
}

/* Ready when this worker's Redis connection answers PING. */
void h_readyz(sd_req_t *req, sd_resp_t *resp)
{
    int rc = sd_store_ping();
    if (rc) {
        sd_resp_store_error(resp, rc);
        return;
    }
    sd_resp_json(resp, 200, json_pack("{s:s, s:s}", "status", "ready", "redis", "ok"));
}

void h_metrics(sd_req_t *req, sd_resp_t *resp)
{
    sd_buf_t out;
    sd_buf_init(&out, 16 << 20);
    sd_metrics_render(&out);
    sd_resp_bytes(resp, 200, "text/plain; version=0.0.4", out.data ? out.data : "", out.len);
    sd_buf_free(&out);
}
