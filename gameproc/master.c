/* Master-list heartbeats (docs/master.md): gameproc lists itself so game clients find it.
 *
 * REST (--master-rest): every --master-interval-s, a challenge then a heartbeat through
 * libsdclient (sdc_master_announce_addr) with game, map, players, max_players, region
 * and tags; on the way out one DELETE of the address the master listed, so the entry
 * goes at once. The calls run on this module's worker thread, never on the tick.
 *
 * UDP (--master-udp HOST:PORT), the DarkPlaces / Quake III master protocol: every
 * interval, FF FF FF FF "heartbeat DarkPlaces\n" from the game's query socket; the master
 * answers with "getinfo <challenge>" to that socket and query.c sends the infoResponse
 * carrying the challenge. On the way out, as the engines do, one last heartbeat and no
 * more getinfo answers (query.c stops them while stopping): the master's check finds
 * the server gone. A datagram send never blocks (MSG_DONTWAIT), so it stays on the loop.
 *
 * Nothing is announced before the server is ready (a loading server answers no query). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "gameproc.h"
#include "sdclient.h"
#include "sdproto.h"
#include "sdlog.h"
#include "sdutil.h"

#define SD_TIMEOUT_MS 3000
#define TAGS_MAX 8
#define ADDR_CAP 72

static const char Q3_HEARTBEAT[] = "\xff\xff\xff\xffheartbeat DarkPlaces\n";

typedef enum { M_ANNOUNCE, M_TERMINATE } mjob_kind_t;

static struct {
    gp_job_t job;              /* the one job in flight (busy) */
    int busy;
    mjob_kind_t kind;
    sdc_master_server_t srv;   /* a copy made on the loop thread at submit */
    const char *tags[TAGS_MAX]; /* --tags split at start */
    int ntags;
    char tagbuf[256];
    int udp_logged;
    int rc;
    char msg[200];
    char addr[ADDR_CAP];       /* as listed by the master ("" until the first success) */
    char got_addr[ADDR_CAP];
    int64_t expires_ms;
    int failing;               /* a failure was logged; the next success says so */
    int terminate;             /* stopping: the DELETE is owed */
    int done_stopping;
    int64_t next_rest_ms, next_udp_ms;
    struct sockaddr_storage udp_to;
    socklen_t udp_tolen;
} m;

static gp_worker_t *worker;
static sdc_t *client;          /* used by the worker thread only */
static uint64_t token_seen;    /* worker thread: the credential.c token version in client */

static void job_run(gp_job_t *j)
{
    (void)j;
    sdc_err_t err = { 0 };
    gp_cred_apply(client, &token_seen);
    if (m.kind == M_ANNOUNCE)
        m.rc = sdc_master_announce_addr(client, &m.srv, m.got_addr, sizeof m.got_addr,
                                        &m.expires_ms, &err);
    else
        m.rc = sdc_master_terminate(client, m.addr, &err);
    sdc_strerror(m.rc, &err, m.msg, sizeof m.msg);
    sdc_err_clear(&err);
}

static void job_done(gp_t *gp, gp_job_t *j)
{
    (void)j;
    m.busy = 0;
    if (m.kind == M_TERMINATE) {
        if (m.rc)
            log_warn("master list termination failed", "addr=%s err=%s", m.addr, m.msg);
        else
            log_info("removed from master list", "addr=%s", m.addr);
        gp->stop_pending--;
        return;
    }
    if (m.rc) {
        if (!m.failing)
            log_warn("master list heartbeat failed, retrying", "err=%s", m.msg);
        m.failing = 1;
        return;
    }
    if (!m.addr[0] || m.failing)
        log_info("listed on master", "addr=%s expires_in_ms=%lld players=%d", m.got_addr,
                 (long long)m.expires_ms, m.srv.players);
    memcpy(m.addr, m.got_addr, sizeof m.addr);
    m.failing = 0;
}

/* Fills m.srv from the game's current state (loop thread, before submit). */
static void describe(const gp_t *gp)
{
    m.srv = (sdc_master_server_t){
        .port = gp->udp_port, .game = "gameproc", .map = gp->map, .name = gp->name,
        .region = gp->region, .version = SD_VERSION, .players = gp->players,
        .max_players = gp->max_players, .protocol = 68, .gametype = -1,
    };
    m.srv.tags = m.tags;
    m.srv.ntags = m.ntags;
    /* Under bigbrother: the instance's stop removes the entry at once. */
    const char *cluster = getenv("BB_CLUSTER"), *instance = getenv("BB_INSTANCE");
    if (cluster && instance && sd_name_valid(cluster, SD_NAME_MAX) &&
        sd_name_valid(instance, SD_NAME_MAX)) {
        m.srv.cluster = cluster;
        m.srv.instance = instance;
    }
}

static void submit(mjob_kind_t kind)
{
    m.kind = kind;
    m.busy = 1;
    gp_worker_submit(worker, &m.job);
}

/* Sets up the master-list heartbeats of --master-udp / --master-rest. 0, -EINVAL filling
 * *bad for a bad --master-udp or --serverdir, or a negative errno. */
int gp_master_start(gp_t *gp, gp_bad_option_t *bad)
{
    if (gp->master_udp &&
        (gp_parse_sockaddr(gp->master_udp, NULL, &m.udp_to, &m.udp_tolen) < 0)) {
        *bad = (gp_bad_option_t){.option = "master-udp", .value = gp->master_udp,
                                .want = "HOST:PORT or [V6]:PORT with a numeric host"};
        return -EINVAL;
    }
    if (!gp->master_rest)
        return 0;
    client = sdc_new(gp->sd_urls, gp->sd_token, SD_TIMEOUT_MS);
    if (!client) {
        *bad = (gp_bad_option_t){.option = "serverdir", .value = gp->sd_urls,
                                .want = "comma-separated http(s) base URLs"};
        return -EINVAL;
    }
    worker = gp_worker_new();
    if (!worker)
        return -ENOMEM;
    if (gp->tags) {
        sd_strlcpy(m.tagbuf, gp->tags, sizeof m.tagbuf);
        char *save = NULL;
        for (char *t = strtok_r(m.tagbuf, ",", &save); t && m.ntags < TAGS_MAX;
             t = strtok_r(NULL, ",", &save))
            m.tags[m.ntags++] = t;
    }
    m.job.run = job_run;
    m.job.done = job_done;
    return 0;
}

/* One DarkPlaces heartbeat; the first one and the last one are logged. */
static void udp_heartbeat(gp_t *gp, int last)
{
    if (sendto(gp->udp_fd, Q3_HEARTBEAT, sizeof Q3_HEARTBEAT - 1, MSG_DONTWAIT,
               (struct sockaddr *)&m.udp_to, m.udp_tolen) < 0) {
        log_warn("udp master heartbeat failed", "master=%s err=%s", gp->master_udp,
                 strerror(errno));
        return;
    }
    if (!m.udp_logged || last)
        log_info("udp master heartbeat", "master=%s last=%d", gp->master_udp, last);
    m.udp_logged = 1;
}

void gp_master_tick(gp_t *gp, int64_t now)
{
    if (worker)
        gp_worker_reap(worker, gp);
    if (gp->stopping) {
        if (!m.done_stopping) {
            m.done_stopping = 1;
            if (gp->master_udp && m.next_udp_ms)
                udp_heartbeat(gp, 1);
            if (worker) {
                m.terminate = 1;
                gp->stop_pending++;
            }
        }
        if (m.terminate && !m.busy) {
            m.terminate = 0;
            if (m.addr[0])
                submit(M_TERMINATE);
            else
                gp->stop_pending--; /* never listed: nothing to remove */
        }
        return;
    }
    if (!gp->ready)
        return;
    if (gp->master_udp && now >= m.next_udp_ms) {
        udp_heartbeat(gp, 0);
        m.next_udp_ms = now + gp->master_every_ms;
    }
    if (worker && !m.busy && now >= m.next_rest_ms && gp_cred_usable(gp)) {
        describe(gp);
        submit(M_ANNOUNCE);
        /* After a failure, try again sooner than a whole interval. */
        int64_t every = gp->master_every_ms;
        m.next_rest_ms = now + (m.failing && every > 5000 ? 5000 : every);
    }
}

void gp_master_stop(gp_t *gp)
{
    (void)gp;
    if (!worker)
        return;
    int busy = gp_worker_free(worker, SD_TIMEOUT_MS);
    worker = NULL;
    if (!busy)
        sdc_free(client);
    client = NULL;
}
