/* Unit tests of the Redis URL forms serverdir accepts (store.c, sentinel.c): redis://,
 * unix:// and sentinel://, and the ones it must refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>

#include "sd.h"

/* serverdir's main.c owns the config; the handlers linked here refer to it. */
sd_config_t sd_cfg;

static void good_urls(void **state)
{
    (void)state;
    static const char *const good[] = {
        "redis://127.0.0.1:6379/0", "redis://:secret@127.0.0.1:6380", "redis://[::1]:6379/2",
        "unix:///run/redis.sock", "unix:///run/redis.sock?db=3", "redis://[::1]",
        "redis://localhost", "redis://10.0.0.5/3",
        "sentinel://127.0.0.1:26379/mymaster",
        "sentinel://127.0.0.1:26379,127.0.0.1:26380,[::1]:26381/mymaster",
        "sentinel://:pw@127.0.0.1:26379/mymaster?db=2",
        "sentinel://sentinel-a:26379,sentinel-b:26379/zone-primary"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (sd_store_init(good[i], "sd:") != 0)
            fail_msg("refused a good URL: %s", good[i]);
    }
}

static void bad_urls(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "http://127.0.0.1:6379", "unix://relative.sock", "unix:///x?db=y",
        /* a lone or unclosed bracket (fuzz.sd_config found "redis://[/d5" writing
         * before the host buffer) */
        "redis://[", "redis://[/0", "redis://[]", "redis://[::1", "redis://[x",
        "sentinel://", "sentinel://127.0.0.1:26379", "sentinel://127.0.0.1:26379/",
        "sentinel:///mymaster", "sentinel://127.0.0.1/mymaster", "sentinel://127.0.0.1:0/m",
        "sentinel://127.0.0.1:26379,/m", "sentinel://127.0.0.1:26379/bad name",
        "sentinel://127.0.0.1:26379/m/x", "sentinel://127.0.0.1:26379/m?db=1001",
        "sentinel://127.0.0.1:26379/m?database=1",
        ("sentinel://1.1.1.1:1,1.1.1.1:2,1.1.1.1:3,1.1.1.1:4,1.1.1.1:5,1.1.1.1:6,1.1.1.1:7,"
         "1.1.1.1:8,1.1.1.1:9/too-many")};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (sd_store_init(bad[i], "sd:") != -EINVAL)
            fail_msg("accepted a bad URL: %s", bad[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_urls),
        cmocka_unit_test(bad_urls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
