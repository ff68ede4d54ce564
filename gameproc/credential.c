/* The bearer token of gameproc's ServerDir calls: its instance credential when Big
 * Brother hands it one (docs/game-server-guide.md, "The instance credential"), else, as
 * --credential says, the shared game token of --token.
 *
 * Sources, checked every tick on the loop thread: the agent connection
 * (bbagent_credential: the newest CREDENTIAL frame bbagent_poll read) and the file
 * $SERVERDIR_CREDENTIAL_FILE (re-read when its inode, size or mtime changes, at most once
 * a second). Big Brother renews both at once; whichever brings a new one first is
 * presented from then on. The worker threads of players.c and master.c take the current token before
 * each job (gp_cred_apply), so a renewal is used from the next request on.
 *
 *   mode      credential held        none yet, within the wait   none after the wait
 *   off       shared token           shared token                shared token
 *   prefer    credential             calls wait (if one is due)  shared token
 *   required  credential             calls wait                  calls wait (logged once)
 *
 * "If one is due": Big Brother named a credential file (it does so only when it obtains
 * credentials), so a prefer-mode process without one starts on the shared token at once. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gameproc.h"
#include "sdclient.h"
#include "sdlog.h"
#include "sdtime.h"
#include "sdutil.h"

#define FILE_CHECK_MS 1000

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char cur[SDC_CREDENTIAL_MAX + 1]; /* the token to present ("" none), under mu */
static uint64_t version;                 /* bumped on each change of cur, under mu */

/* loop thread only */
static char held[SDC_CREDENTIAL_MAX + 1]; /* the one presented: the newest from either
                                             source, "" none yet */
static const char *file;                  /* $SERVERDIR_CREDENTIAL_FILE or NULL */
static struct stat file_st;
static int64_t file_checked_ms, wait_until_ms;
static int usable, late_logged;

/* Publishes the token the workers present from now on. */
static void publish(const char *token)
{
    pthread_mutex_lock(&mu);
    if (strcmp(cur, token)) {
        sd_strlcpy(cur, token, sizeof cur);
        version++;
    }
    pthread_mutex_unlock(&mu);
}

/* Reads the credential file into buf when it changed since the last read. 1 when buf
 * holds a new one, 0 otherwise. */
static int file_read(char *buf, size_t cap, int64_t now)
{
    if (!file || now - file_checked_ms < FILE_CHECK_MS)
        return 0;
    file_checked_ms = now;
    struct stat st;
    if (stat(file, &st) < 0 || (st.st_ino == file_st.st_ino && st.st_size == file_st.st_size &&
                                st.st_mtim.tv_sec == file_st.st_mtim.tv_sec &&
                                st.st_mtim.tv_nsec == file_st.st_mtim.tv_nsec))
        return 0;
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (n <= 0 || (size_t)n >= cap - 1)
        return 0; /* empty, or longer than a credential may be: not taken */
    buf[n] = '\0';
    file_st = st;
    return 1;
}

int gp_cred_start(gp_t *gp, gp_bad_option_t *bad)
{
    (void)bad;
    const char *e = getenv("SERVERDIR_CREDENTIAL_FILE");
    file = e && *e && gp->cred_mode != GP_CRED_OFF ? e : NULL;
    wait_until_ms = sd_mono_ms() + gp->cred_wait_ms;
    usable = gp->cred_mode == GP_CRED_OFF || (gp->cred_mode == GP_CRED_PREFER && !file);
    publish(gp->cred_mode == GP_CRED_REQUIRED || !gp->sd_token ? "" : gp->sd_token);
    return 0;
}

/* A source's newest credential: logged when it changes, and then the one presented. */
static void source_seen(const char *from, const char *jwt, char *last)
{
    if (!strcmp(jwt, last))
        return;
    log_info(last[0] ? "credential renewed" : "credential received", "source=%s bytes=%zu",
             from, strlen(jwt));
    sd_strlcpy(last, jwt, SDC_CREDENTIAL_MAX + 1);
    if (strcmp(jwt, held)) {
        sd_strlcpy(held, jwt, sizeof held);
        publish(held);
    }
}

void gp_cred_tick(gp_t *gp, int64_t now)
{
    static char from_agent[SDC_CREDENTIAL_MAX + 1], from_file[SDC_CREDENTIAL_MAX + 1];
    if (gp->cred_mode == GP_CRED_OFF)
        return;
    char buf[SDC_CREDENTIAL_MAX + 1];
    if (gp->agent && bbagent_credential(gp->agent, buf, sizeof buf) > 0)
        source_seen("agent", buf, from_agent);
    if (file_read(buf, sizeof buf, now))
        source_seen("file", buf, from_file);
    if (held[0])
        usable = 1;
    if (usable || now < wait_until_ms)
        return;
    if (gp->cred_mode == GP_CRED_PREFER) {
        log_warn("no instance credential, using the shared game token",
                 "waited_ms=%lld token=%s", (long long)gp->cred_wait_ms,
                 gp->sd_token ? "set" : "none");
        usable = 1;
        return;
    }
    if (!late_logged) {
        log_error("no instance credential yet, ServerDir calls wait for it",
                  "waited_ms=%lld credential=required file=%s", (long long)gp->cred_wait_ms,
                  file ? file : "none");
        late_logged = 1;
    }
}

int gp_cred_usable(const gp_t *gp)
{
    (void)gp;
    return usable;
}

int gp_cred_apply(sdc_t *c, uint64_t *seen)
{
    int rc = SDC_OK;
    pthread_mutex_lock(&mu);
    if (version != *seen && (rc = sdc_set_token(c, cur)) == SDC_OK)
        *seen = version;
    pthread_mutex_unlock(&mu);
    return rc;
}
