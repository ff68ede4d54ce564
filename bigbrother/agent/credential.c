/* Credential hand-over (supervision thread): the credentials report/credential.c obtains
 * reach the game two ways (docs/operations.md, "Credential delivery"):
 *   - a CREDENTIAL frame on the agent connection (bbagent_credential), sent when the
 *     agent connects if one is held, and on every renewal; one its full socket refused
 *     is owed and sent again after the agent's next message;
 *   - the file STATE_DIR/credentials/<instance>.jwt (mode 0600, owned by the service's
 *     user; replaced by rename, so a reader sees the old or the new one whole), named to
 *     the process by SERVERDIR_CREDENTIAL_FILE (spawn.c), for servers that do not link
 *     libbbagent.
 * When the run ends, the file is deleted and the credential thread forgets it; serverdir
 * refuses the credential itself once the directory has the `stopped` event. */
#include "agent/bb_agent.h"
#include "bbproto.h"
#include "sdclient.h"
#include "sdlog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

static bb_watch_t cred_w = {-1, NULL};

/* STATE_DIR/credentials, created 0700; 0711 when the service runs as another user, so
 * that it can open its own file (it cannot list the others). 0 or -errno. */
static int cred_dir(const bb_inst_t *in, char *dir, size_t cap)
{
    if (snprintf(dir, cap, "%s/credentials", bb.cfg.state_dir) >= (int)cap)
        return -ENAMETOOLONG;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    if (chmod(dir, in->svc->user ? 0711 : 0700) < 0)
        return -errno;
    return 0;
}

/* Writes jwt to in's credential file: a temporary file in the same directory, then
 * rename. 0 or -errno. */
static int file_write(const bb_inst_t *in, const char *jwt, size_t len)
{
    char dir[PATH_MAX], tmp[PATH_MAX + SD_NAME_MAX + 8], path[PATH_MAX];
    int rc = cred_dir(in, dir, sizeof dir);
    if (rc)
        return rc;
    bb_credential_path(in->id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, in->id);
    unlink(tmp); /* left by a crash between open and rename */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    if ((in->svc->user && fchown(fd, in->svc->uid, in->svc->gid) < 0) ||
        write(fd, jwt, len) != (ssize_t)len)
        rc = errno ? -errno : -EIO;
    if (close(fd) < 0 && !rc)
        rc = -errno;
    if (!rc && rename(tmp, path) < 0)
        rc = -errno;
    if (rc)
        unlink(tmp);
    return rc;
}

/* Sends in's credential over its agent connection, when it has one; a full socket
 * leaves it owed. */
static void frame_send(bb_inst_t *in, const char *jwt, size_t len)
{
    char msg[BBPROTO_MAX_FRAME];
    int n = bbproto_credential_put(msg, sizeof msg, jwt, len);
    int rc = n < 0 ? n : bb_agent_send_msg(in, msg, (size_t)n);
    int owed = rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -ENOBUFS;
    if (rc && rc != -ENOTCONN && !(owed && in->cred_owed))
        log_warn("credential not sent to the agent", "instance=%s error=%s then=%s", in->id,
                 strerror(-rc), owed ? "sent after its next message" : "dropped");
    in->cred_owed = owed;
}

/* The credential thread has new ones: each goes to its run's file and agent; one for a
 * run that is over is forgotten. */
static void on_fresh(bb_watch_t *w, uint32_t events)
{
    (void)w;
    (void)events;
    char id[SD_NAME_MAX + 1], jwt[SDC_CREDENTIAL_MAX + 1];
    int64_t gen;
    while (bb_cred_take(bb.cred, id, &gen, jwt, sizeof jwt)) {
        bb_inst_t *in = bb_inst_by_id(id);
        if (!in || in->generation != gen) {
            bb_cred_forget(bb.cred, id);
            continue;
        }
        size_t len = strlen(jwt);
        int rc = file_write(in, jwt, len);
        if (rc)
            log_error("credential file not written", "instance=%s error=%s", id, strerror(-rc));
        frame_send(in, jwt, len);
    }
}

/* An agent connected: it gets the credential held for its run, if any. */
static void on_connected(bb_inst_t *in)
{
    char jwt[SDC_CREDENTIAL_MAX + 1];
    in->cred_owed = 0;
    int n = bb_cred_get(bb.cred, in->id, in->generation, jwt, sizeof jwt);
    if (n > 0)
        frame_send(in, jwt, (size_t)n);
}

/* Every agent message: a credential owed since its socket was full goes now. */
static void on_message(bb_inst_t *in, const char *val, size_t len)
{
    (void)val;
    (void)len;
    if (in->cred_owed)
        on_connected(in);
}
static const bb_agent_handler_t resend = {NULL, on_message};

/* The state machine's hook: the run is over, its credential goes. */
static void on_gone(bb_inst_t *in)
{
    char path[PATH_MAX];
    in->cred_owed = 0;
    bb_cred_forget(bb.cred, in->id);
    bb_credential_path(in->id, path, sizeof path);
    if (unlink(path) < 0 && errno != ENOENT)
        log_warn("credential file not removed", "instance=%s error=%s", in->id, strerror(errno));
}

/* Removes the files of runs that are not running any more (an exit while no bigbrother
 * ran), and asks for the credentials of the running ones (re-adopted: their `started`
 * is in the directory or still in the outbox; a 404 meanwhile is retried). */
static void adopt_sweep(void)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/credentials", bb.cfg.state_dir);
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        char id[SD_NAME_MAX + 1];
        size_t n = strlen(de->d_name);
        int ours = n > 4 && n - 4 <= SD_NAME_MAX && !strcmp(de->d_name + n - 4, ".jwt");
        int tmp = de->d_name[0] == '.' && n > 4 && !strcmp(de->d_name + n - 4, ".tmp");
        if (ours) {
            memcpy(id, de->d_name, n - 4);
            id[n - 4] = '\0';
        }
        if ((ours && !bb_inst_by_id(id)) || tmp)
            unlinkat(dirfd(d), de->d_name, 0);
    }
    if (d)
        closedir(d);
    for (int i = 0; i < bb.ninst; i++)
        if (bb.inst[i].pid > 0)
            bb_cred_want(bb.cred, bb.inst[i].id, bb.inst[i].generation);
}

int bb_handover_init(void)
{
    if (!bb.cred)
        return 0;
    bb_inst_hooks.gone = on_gone;
    int rc = bb_agent_on(BB_AGENT_CONNECTED, on_connected);
    if (!rc)
        rc = bb_agent_handle(&resend);
    if (rc)
        return rc;
    cred_w.fd = bb_cred_fd(bb.cred);
    cred_w.fn = on_fresh;
    return bb_watch_add(&cred_w, EPOLLIN);
}

void bb_handover_adopted(void)
{
    if (bb.cred)
        adopt_sweep();
}
