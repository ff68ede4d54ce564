/* bigbrother against hostile local clients on its agent socket: 200 connections that
 * never say HELLO, held open while a supervised instance restarts, do not keep the
 * instance from registering: it is ready again within its normal start time, with no
 * start timeout, and the refusals are logged at most five a second. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "harness_bigbrother.h"

#define HOSTILE 200
/* Connects to the agent socket at path and says nothing; -1 when refused at once. */
static int idle_client(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        close(fd);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

#define REFILLS 600 /* connections the client opens while the instance restarts */

/* The hostile client while the instance restarts: opens another idle connection every few
 * ms, taking any slot bigbrother frees, until g slot 0 is ready past generation gen (1),
 * REFILLS connections were opened, or timeout_ms passed (0). fds[] gets them. */
static int refill_until_ready(const bbt_t *b, long long gen, int *fds, int timeout_ms)
{
    int64_t end = h_now_ms() + timeout_ms;
    for (int i = 0; h_now_ms() < end; i++) {
        if (i < REFILLS)
            fds[i] = idle_client(b->agent);
        if (i % 20 == 0) {
            json_t *in = bbt_inst(b, "g", 0);
            int ready = in && !strcmp(bbt_str(in, "state"), "ready") &&
                        bbt_int(in, "generation") > gen;
            json_decref(in);
            if (ready)
                return 1;
        }
        h_sleep_ms(2);
    }
    return 0;
}

/* Counts the lines of the file at path that contain needle. */
static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

static void idle_clients_do_not_lock_out_an_instance(void **state)
{
    bbt_t b = {0};
    bbt_dirs(&b);
    char svc[1024];
    snprintf(svc, sizeof svc,
             "[{\"name\": \"g\", \"command\": \"%s\", \"args\": [\"--tick-hz\", \"50\"],"
             " \"count\": 1, \"health\": {\"type\": \"agent\", \"start_timeout_ms\": 3000,"
             " \"liveness_timeout_ms\": 1000}, \"restart\": {\"policy\": \"always\","
             " \"backoff_min_ms\": 50, \"backoff_max_ms\": 200}, \"stop\": {\"grace_ms\": 1000},"
             " \"cwd\": \"%s\", \"rlimits\": {\"core\": 0}}]",
             GAMEPROC, h_tmpdir());
    bbt_config(&b, svc, NULL);
    assert_true(bbt_start(&b) > 0);
    print_message("bigbrother log: %s\n", b.log);
    json_t *in = bbt_wait(&b, "g", 0, "ready", 1, h_valgrind() ? 30000 : 10000);
    assert_non_null(in);
    pid_t pid = (pid_t)bbt_int(in, "pid");
    long long gen = bbt_int(in, "generation");
    json_decref(in);

    static int fds[HOSTILE + REFILLS];
    memset(fds, -1, sizeof fds);
    for (int i = 0; i < HOSTILE; i++)
        fds[i] = idle_client(b.agent);
    /* The instance dies and is restarted while every idle connection stays open and the
     * client takes every slot that frees up. */
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_true(refill_until_ready(&b, gen, fds + HOSTILE, h_valgrind() ? 15000 : 3000));
    in = bbt_inst(&b, "g", 0);
    assert_non_null(in);
    assert_int_equal(bbt_int(in, "generation"), gen + 1); /* no start timeout on the way */
    assert_string_equal(bbt_str(in, "reason"), "killed");
    json_decref(in);
    for (int i = 0; i < HOSTILE + REFILLS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    /* Hundreds of refusals, logged at most five a second. */
    int lines = count_lines(b.log, "msg=\"agent connection refused\"") +
                count_lines(b.log, "msg=\"agent connection evicted\"");
    assert_true(lines >= 1);
    assert_true(lines <= 30);
    bbt_stop(&b, 3000);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(idle_clients_do_not_lock_out_an_instance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
