/* Unit tests of the Redis URL forms serverdir accepts (store.c, sentinel.c): redis://,
 * unix:// and sentinel://, and the ones it must refuse; and, for redis://, that the
 * connection goes to the host, port and database (and with the password) the URL names:
 * a fake Redis on a loopback port records what the store sends it. Also the argument
 * list every command and script call is built in (sd_argv_t), past its inline room. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "command.h"
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

/* A fake Redis: one listening socket; its thread accepts one connection, answers +OK to
 * every command and records them as "ARG ARG|" in cmds until the client closes. */
typedef struct {
    int lfd;
    int port;
    char cmds[512];
    pthread_t th;
} fake_t;

/* The length of the first complete RESP command in buf[0..len) (0 while incomplete),
 * its arguments appended to out as "A B|". */
static size_t resp_command(const char *buf, size_t len, char *out, size_t cap)
{
    const char *p = buf, *end = buf + len, *nl;
    if (len < 1 || *p != '*' || !(nl = memchr(p, '\n', len)))
        return 0;
    int argc = atoi(p + 1);
    p = nl + 1;
    char line[256] = "";
    for (int i = 0; i < argc; i++) {
        if (p >= end || *p != '$' || !(nl = memchr(p, '\n', (size_t)(end - p))))
            return 0;
        size_t n = (size_t)atoi(p + 1);
        p = nl + 1;
        if ((size_t)(end - p) < n + 2)
            return 0;
        snprintf(line + strlen(line), sizeof line - strlen(line), "%s%.*s", i ? " " : "",
                 (int)n, p);
        p += n + 2;
    }
    snprintf(out + strlen(out), cap - strlen(out), "%s|", line);
    return (size_t)(p - buf);
}

/* The fake's thread: see fake_t. */
static void *fake_main(void *arg)
{
    fake_t *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    char buf[2048];
    size_t len = 0, used;
    ssize_t n;
    while (fd >= 0 && len < sizeof buf && (n = read(fd, buf + len, sizeof buf - len)) > 0) {
        len += (size_t)n;
        while ((used = resp_command(buf, len, f->cmds, sizeof f->cmds)) > 0) {
            memmove(buf, buf + used, len - used);
            len -= used;
            if (write(fd, "+OK\r\n", 5) != 5)
                break;
        }
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* Starts a fake on 127.0.0.1 (v6 0) or [::1] (v6 1), port chosen by the kernel. */
static void fake_tcp(fake_t *f, int v6)
{
    memset(f, 0, sizeof *f);
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sl = sizeof *a;
    }
    f->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->lfd >= 0);
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&ss, sl), 0);
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&ss, &sl), 0);
    f->port = ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                       : ((struct sockaddr_in *)&ss)->sin_port);
    assert_int_equal(listen(f->lfd, 1), 0);
    assert_int_equal(pthread_create(&f->th, NULL, fake_main, f), 0);
}

/* Parses url, connects through the store and closes again; returns what the fake f got
 * (the connection reached f: the URL's host and port were the ones used). */
static const char *connect_through(fake_t *f, const char *url)
{
    assert_int_equal(sd_store_init(url, "sd:"), 0);
    redisContext *c = sd_store_connect();
    if (!c || c->err)
        fail_msg("%s: no connection to the fake", url);
    redisFree(c);
    pthread_join(f->th, NULL);
    close(f->lfd);
    return f->cmds;
}

/* The parsed host, port, database (and password) are the ones the connection uses:
 * SELECT only for a database other than 0, AUTH only with a password. */
static void parsed_fields_are_used(void **state)
{
    (void)state;
    static const struct {
        int v6;
        const char *head, *tail; /* the URL: head, the fake's port, tail */
        const char *want;        /* what the fake got */
    } cases[] = {
        {0, "redis://127.0.0.1:", "/0", ""},
        {0, "redis://127.0.0.1:", "/7", "SELECT 7|"},
        {0, "redis://:secret@127.0.0.1:", "", "AUTH secret|"},
        {1, "redis://[::1]:", "/2", "SELECT 2|"},
        {1, "redis://pw@[::1]:", "/1000", "AUTH pw|SELECT 1000|"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_t f;
        char url[160];
        fake_tcp(&f, cases[i].v6);
        snprintf(url, sizeof url, "%s%d%s", cases[i].head, f.port, cases[i].tail);
        assert_string_equal(connect_through(&f, url), cases[i].want);
    }
}

/* sd_argv_t keeps every argument in order past its SD_ARGV_INLINE inline slots, up to
 * SD_STORE_ARGV_MAX; one more sets overflow, and sd_store_run refuses an overflowed list
 * (and frees it) before it reaches Redis. */
static void argv_grows_past_its_inline_room(void **state)
{
    (void)state;
    static const char digits[] = "0123456789";
    sd_argv_t a;
    sd_argv_init(&a);
    for (int i = 0; i < SD_STORE_ARGV_MAX; i++)
        sd_argv_addn(&a, digits + i % 10, 1 + (size_t)(i % 3));
    sd_argv_addf(&a, "%d", 7);
    assert_int_equal(a.argc, SD_STORE_ARGV_MAX);
    assert_int_equal(a.overflow, 1);
    for (int i = 0; i < SD_STORE_ARGV_MAX; i++) {
        if (a.argv[i] != digits + i % 10 || a.argl[i] != 1 + (size_t)(i % 3))
            fail_msg("argument %d moved", i);
    }
    redisReply dummy, *r = &dummy; /* the call must clear it */
    assert_int_equal(sd_store_run("machine_put", 1, &a, &r), SD_STORE_ERROR);
    assert_null(r);
    assert_int_equal(a.argc, 0);
    assert_true(a.argv == a.inline_argv);

    /* formatted copies: in the arena while it has room, then SD_ARGV_INLINE allocated
     * ones, then overflow */
    char big[201];
    memset(big, 'k', 200);
    big[200] = '\0';
    int in_arena = SD_ARGV_ARENA / 201;
    sd_argv_init(&a);
    for (int i = 0; i < 3 * SD_ARGV_INLINE; i++) {
        big[0] = (char)('a' + i % 26);
        sd_argv_addf(&a, i % 2 ? "%s" : "%.200s", big);
    }
    assert_int_equal(a.overflow, 1);
    assert_int_equal(a.argc, in_arena + SD_ARGV_INLINE);
    assert_int_equal(a.nowned, SD_ARGV_INLINE);
    for (int i = 0; i < a.argc; i++) {
        big[0] = (char)('a' + i % 26);
        assert_int_equal(a.argl[i], 200);
        assert_memory_equal(a.argv[i], big, 201);
    }
    sd_argv_free(&a);
    assert_int_equal(a.argc, 0);
    assert_int_equal(a.nowned, 0);
}

/* sd_argv_addf writes what snprintf writes for every format, the ones it formats
 * without printf (%s, %lld, %d) at their edges included; and the store's own RESP
 * formatting of a command is hiredis's byte for byte. */
static void argv_formats_and_resp(void **state)
{
    (void)state;
    sd_argv_t a;
    sd_argv_init(&a);
    static const long long lls[] = {0, 1, -1, 9, 10, -10, 1234567890123LL, LLONG_MAX, LLONG_MIN};
    static const int ints[] = {0, 7, -7, INT_MAX, INT_MIN};
    char want[64][64];
    int n = 0;
    for (size_t i = 0; i < SD_ARRAY_LEN(lls); i++) {
        sd_argv_addf(&a, "%lld", lls[i]);
        snprintf(want[n++], sizeof want[0], "%lld", lls[i]);
    }
    for (size_t i = 0; i < SD_ARRAY_LEN(ints); i++) {
        sd_argv_addf(&a, "%d", ints[i]);
        snprintf(want[n++], sizeof want[0], "%d", ints[i]);
    }
    sd_argv_addf(&a, "%s", "");
    snprintf(want[n++], sizeof want[0], "%s", "");
    sd_argv_addf(&a, "%s", "sd:lock:{p1}");
    snprintf(want[n++], sizeof want[0], "%s", "sd:lock:{p1}");
    sd_argv_addf(&a, "%s#q", "sd:lock:{p1}");
    snprintf(want[n++], sizeof want[0], "%s#q", "sd:lock:{p1}");
    sd_argv_addf(&a, "%u:%05d", 42u, -3);
    snprintf(want[n++], sizeof want[0], "%u:%05d", 42u, -3);
    assert_int_equal(a.argc, n);
    assert_int_equal(a.overflow, 0);
    assert_int_equal(a.nowned, 0); /* all in the arena */
    for (int i = 0; i < n; i++) {
        assert_int_equal(a.argl[i], strlen(want[i]));
        assert_string_equal(a.argv[i], want[i]);
    }

    /* the command these make, with an empty, a binary and a 10 KB argument */
    static char blob[10000];
    for (size_t i = 0; i < sizeof blob; i++)
        blob[i] = (char)(i * 7);
    sd_argv_addn(&a, blob, sizeof blob);
    sd_argv_addn(&a, "a\r\nb\0c", 6);
    char *hi = NULL;
    int hilen = redisFormatCommandArgv(&hi, a.argc, a.argv, a.argl);
    assert_true(hilen > 10000);
    size_t len = sd__command_len(a.argc, a.argl);
    assert_int_equal(len, (size_t)hilen);
    char *mine = malloc(len);
    assert_non_null(mine);
    sd__command_format(mine, a.argc, a.argv, a.argl);
    assert_memory_equal(mine, hi, len);
    free(mine);
    redisFreeCommand(hi);
    sd_argv_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_urls),
        cmocka_unit_test(bad_urls),
        cmocka_unit_test(parsed_fields_are_used),
        cmocka_unit_test(argv_grows_past_its_inline_room),
        cmocka_unit_test(argv_formats_and_resp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
