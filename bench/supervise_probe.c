/* The supervised program of bench/supervise_bench.sh, and its clock.
 *
 *   supervise_probe run FILE
 *       appends "start PID NS" (CLOCK_MONOTONIC) to FILE, then sleeps until killed:
 *       an idle process, and the replacement whose start ends a restart measurement.
 *   supervise_probe notify FILE EVERY_MS MIN_MS MAX_MS
 *       appends "start PID NS", sends READY=1 and then WATCHDOG=1 every EVERY_MS to
 *       $NOTIFY_SOCKET for a random MIN_MS..MAX_MS, appends "hang PID NS" with the time of
 *       its last WATCHDOG=1, and stops sending (a hung game loop) until killed.
 *   supervise_probe kill PID FILE
 *       appends "kill PID NS" to FILE and sends SIGKILL to PID right after reading the
 *       clock: the start of a crash -> replacement measurement.
 *
 * Each line is one write(2) on an O_APPEND descriptor, so lines from many processes
 * never mix. CLOCK_MONOTONIC is the same clock in every process of the machine. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void record(const char *file, const char *what, long pid, long long ns)
{
    char line[96];
    int n = snprintf(line, sizeof line, "%s %ld %lld\n", what, pid, ns);
    int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n) {
        perror(file);
        exit(1);
    }
    close(fd);
}

static void sleep_forever(void)
{
    for (;;)
        pause();
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int notify_loop(const char *file, long every_ms, long min_ms, long max_ms)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (!path || !*path || strlen(path) >= sizeof sun.sun_path) {
        fprintf(stderr, "supervise_probe: NOTIFY_SOCKET is not set\n");
        return 1;
    }
    memcpy(sun.sun_path, path, strlen(path));
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
    if (path[0] == '@') {
        sun.sun_path[0] = '\0';
        len--;
    }
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || sendto(fd, "READY=1", 7, 0, (struct sockaddr *)&sun, len) < 0) {
        perror("supervise_probe: notify");
        return 1;
    }
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r)
        r = (unsigned)getpid();
    long long until = now_ns() + (min_ms + (long)(r % (unsigned)(max_ms - min_ms + 1))) * 1000000LL;
    long long last = now_ns();
    while (now_ns() < until) {
        last = now_ns();
        if (sendto(fd, "WATCHDOG=1", 10, 0, (struct sockaddr *)&sun, len) < 0) {
            perror("supervise_probe: notify");
            return 1;
        }
        sleep_ms(every_ms);
    }
    record(file, "hang", (long)getpid(), last);
    sleep_forever();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "run") == 0) {
        record(argv[2], "start", (long)getpid(), now_ns());
        sleep_forever();
    }
    if (argc == 6 && strcmp(argv[1], "notify") == 0) {
        long every = atol(argv[3]), lo = atol(argv[4]), hi = atol(argv[5]);
        if (every < 1 || lo < 0 || hi < lo)
            return 2;
        record(argv[2], "start", (long)getpid(), now_ns());
        return notify_loop(argv[2], every, lo, hi);
    }
    if (argc == 4 && strcmp(argv[1], "kill") == 0) {
        long pid = atol(argv[2]);
        if (pid <= 1)
            return 2;
        long long t = now_ns();
        if (kill((pid_t)pid, SIGKILL) < 0) {
            perror("supervise_probe: kill");
            return 1;
        }
        record(argv[3], "kill", pid, t);
        return 0;
    }
    fprintf(stderr, "usage: supervise_probe run FILE\n"
                    "       supervise_probe notify FILE EVERY_MS MIN_MS MAX_MS\n"
                    "       supervise_probe kill PID FILE\n");
    return 2;
}
