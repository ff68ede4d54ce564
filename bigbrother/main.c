/* bigbrother: the per-machine supervisor. Parses the command line and the config, takes
 * the state dir's lock, starts the reporter thread (report/), opens the agent / notify /
 * control sockets, re-adopts what the previous run left running, then runs the one
 * supervision loop (core/loop.c) until SIGTERM, SIGINT or SIGHUP.
 *
 * SIGTERM / SIGINT: bigbrother exits and LEAVES THE GAME PROCESSES RUNNING; the next
 * bigbrother on the same state dir re-adopts them (`bbctl stop all` stops them first).
 * SIGHUP: the same, then bigbrother re-executes itself with the same arguments, which
 * re-reads the config and re-adopts every process (they stay its children). */
#include "bb_daemon.h"
#include "sdlog.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bigbrother --config FILE [--log-level debug|info|warn|error]\n"
            "       bigbrother --version | --help\n"
            "\n"
            "Supervises the services of FILE (JSON) on this machine: spawns them, watches\n"
            "their health, kills and restarts hung ones, reports to ServerDir. SIGTERM\n"
            "leaves the processes running for the next bigbrother to re-adopt; SIGHUP\n"
            "re-reads the config the same way. Control: bbctl --socket CONTROL_SOCKET.\n"
            "Exit codes: 0 stopped by a signal, 100 usage or config error, 111 system error\n"
            "(including: another bigbrother holds the state dir's lock).\n");
}

/* The credential thread, when there is a ServerDir to ask and credentials are on. */
static void start_credentials(void)
{
    const bb_config_t *c = &bb.cfg;
    if (!c->urls || !c->credentials)
        return;
    bb_cred_opts_t o = {.urls = c->urls, .token = c->token, .cluster = c->cluster,
                        .machine = c->machine, .renew_percent = c->credential_renew_percent};
    int rc = bb_cred_start(&o, &bb.cred);
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot start the credential thread", "error=%s", strerror(-rc));
}

static void start_reporter(void)
{
    const bb_config_t *c = &bb.cfg;
    bb_report_opts_t o = {
        .accepted = bb.cred ? bb_cred_on_accepted : NULL, .accepted_ctx = bb.cred,
        .state_dir = c->state_dir, .cluster = c->cluster, .machine = c->machine,
        .urls = c->urls, .token = c->token, .address = c->address, .labels = c->labels,
        .capacity = c->capacity, .version = SD_VERSION, .lease_ttl_ms = c->lease_ttl_ms,
        .logs_port = c->logs_port};
    int rc = bb_report_start(&o, &bb.report);
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot start the reporter", "error=%s", strerror(-rc));
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"log-level", required_argument, NULL, 'l'},
                                         {"version", no_argument, NULL, 'V'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *config = NULL;
    char err[512], self[4096];
    /* for the SIGHUP re-exec; read now (under valgrind this is the program, not the tool) */
    ssize_t selflen = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[selflen > 0 ? selflen : 0] = 0;
    int o;
    while ((o = getopt_long(argc, argv, "c:l:Vh", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config = optarg; break;
        case 'l':
            if (sd_log_parse_level(optarg) < 0) {
                fprintf(stderr, "bigbrother: --log-level must be debug, info, warn or error\n");
                return SD_EXIT_USAGE;
            }
            sd_log_set_level((enum sd_log_level)sd_log_parse_level(optarg));
            break;
        case 'V': printf("bigbrother %s\n", SD_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return SD_EXIT_USAGE;
        }
    }
    if (!config || optind != argc) {
        usage(stderr);
        return SD_EXIT_USAGE;
    }
    if (bb_config_load(config, &bb.cfg, err, sizeof(err)))
        sd_die(SD_EXIT_USAGE, "config error", "error=%s", err);
    bb_state_lock();
    if (sd_random_hex(bb.run_id, 3))
        sd_die(SD_EXIT_SYSTEM, "no randomness", "error=%s", strerror(errno));
    int rc = bb_loop_init();
    /* before each sleep of the loop: republish the gauges, then persist the table */
    if (!rc)
        rc = bb_loop_before_sleep(bb_metrics_publish);
    if (!rc)
        rc = bb_loop_before_sleep(bb_state_save);
    if (!rc)
        rc = bb_supervisor_init();
    if (rc)
        sd_die(SD_EXIT_SYSTEM, "cannot set up the event loop", "error=%s", strerror(-rc));
    bb_logs_start();
    bb_health_start();
    start_credentials();
    start_reporter();
    if ((rc = bb_metrics_start()))
        sd_die(SD_EXIT_SYSTEM, "cannot serve metrics", "listen=%s port=%d error=%s",
               bb.cfg.metrics_host, bb.cfg.metrics_port, strerror(-rc));
    bb_metrics_restore();
    if ((rc = bb_logsrv_start()))
        sd_die(SD_EXIT_SYSTEM, "cannot serve logs", "listen=%s port=%d error=%s",
               bb.cfg.logs_host, bb.cfg.logs_port, strerror(-rc));
    if ((rc = bb_agentsrv_init()) || (rc = bb_alloc_init()) || (rc = bb_notify_init()) ||
        (rc = bb_ctl_init()) || (rc = bb_handover_init()) || (rc = bb_relive_init()))
        sd_die(SD_EXIT_SYSTEM, "cannot open the sockets", "agent=%s notify=%s control=%s error=%s",
               bb.cfg.agent_socket, bb.cfg.notify_socket, bb.cfg.control_socket,
               strerror(-rc));
    log_info("bigbrother started",
             "version=%s machine=%s cluster=%s state_dir=%s services=%d instances=%d serverdir=%s",
             SD_VERSION, bb.cfg.machine, bb.cfg.cluster, bb.cfg.state_dir, bb.cfg.nservices,
             bb.ninst, bb.cfg.urls ? bb.cfg.urls : "none (standalone)");
    bb_state_load();
    bb_handover_adopted();
    bb_supervisor_start_all();
    if ((rc = bb_cluster_start()))
        sd_die(SD_EXIT_SYSTEM, "cannot start cluster mode", "error=%s", strerror(-rc));
    bb_systemd_start();
    int sig = bb_loop_run();
    bb_state_save();

    int running = 0;
    for (int i = 0; i < bb.ninst; i++)
        running += bb.inst[i].pid > 0;
    bb_systemd_stopping(sig, running);
    bb_ctl_close();
    bb_agentsrv_close();
    bb_notify_close();
    bb_cluster_stop();
    if (sig == SIGHUP)
        bb_metrics_save();
    bb_metrics_stop();
    bb_logsrv_stop();
    bb_health_stop();
    bb_report_stop(bb.report);
    bb_cred_stop(bb.cred);
    log_info("bigbrother exiting", "signal=%d processes_left_running=%d then=%s", sig, running,
             sig == SIGHUP ? "re-exec" : "exit");
    if (sig == SIGHUP) {
        execv(self[0] ? self : argv[0], argv);
        sd_die(SD_EXIT_SYSTEM, "re-exec failed", "error=%s", strerror(errno));
    }
    bb_converge_free();
    bb_alloc_free();
    bb_probe_free();
    bb_config_free(&bb.cfg);
    free(bb.inst);
    return 0;
}
