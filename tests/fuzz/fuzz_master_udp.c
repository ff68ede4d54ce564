/* libFuzzer target for every parser of the UDP master front (master_q3.c, master_valve.c)
 * and the reply writers: a datagram goes through each parser; whatever they accept is
 * re-encoded (tests/fuzz/CMakeLists.txt says how it is built and run).
 *
 *   build-fuzz/fuzz/fuzz_master_udp tests/fuzz/corpus/master_udp -max_total_time=60 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "master_q3.h"
#include "master_valve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char tag[64], chal[SD_MASTER_CHAL_MAX];
    sd_master_server_t s;
    sd_q3_query_t q;
    sd_valve_query_t vq;
    uint32_t c;

    sd_q3_kind(data, size);
    sd_q3_parse_heartbeat(data, size, tag, sizeof tag);
    if (!sd_q3_parse_inforesponse(data, size, &s, chal, sizeof chal)) {
        uint8_t out[128];
        sd_q3_encode_getinfo(chal, out, sizeof out);
    }
    if (!sd_q3_parse_getservers(data, size, &q)) {
        sd_master_filter_t f;
        memset(&f, 0, sizeof f);
        sd_q3_query_filter(&q, &f);
        sd_q3_writer_t w;
        sd_q3_resp_begin(&w, q.ext);
        for (size_t i = 0; i + 6 <= size && i < 600; i += 6)
            if (sd_q3_resp_add(&w, 4, data + i, (uint16_t)(data[i + 4] << 8 | data[i + 5])))
                sd_q3_resp_begin(&w, q.ext);
        sd_q3_resp_end(&w);
    }
    sd_valve_parse_query(data, size, &vq);
    sd_gs_kind(data, size);
    sd_gs_parse_info(data, size, &s, &c);
    char key[80];
    size_t kl = size < sizeof key - 1 ? size : sizeof key - 1;
    memcpy(key, data, kl);
    key[kl] = '\0';
    uint8_t ip[16];
    uint16_t port;
    sd_master_key_bytes(key, ip, &port);
    return 0;
}
