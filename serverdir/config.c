/* serverdir's settings with their defaults; main.c fills them from --config and flags. */
#include "sd.h"

sd_config_t sd_cfg = {
    .listen = "127.0.0.1:7700",
    .redis = "redis://127.0.0.1:6379/0",
    .key_prefix = "sd:",
    .threads = 8,
    .body_max = 1 << 20,
    .blob_max = 256 << 10,
    .conn_timeout_s = 30,
};
