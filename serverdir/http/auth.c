/* Bearer tokens mapped to roles and bindings, read from a token file of
 * `ROLE TOKEN [cluster=C] [machine=M] [holder_prefix=P]` lines ('#' comments). Reloaded on
 * SIGHUP: a file that fails to parse leaves the old table in place. Without a token file
 * every request is treated as `ops` (open mode). The handlers enforce the bindings through
 * sd_req_may_cluster / sd_req_may_machine / sd_req_may_hold (docs/operations.md, "Tokens"). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/sha.h>

#include "cred.h"
#include "sd.h"

#define TOKEN_FILE_MAX (1 << 20)
#define TOKEN_MAX 256
#define TOKEN_MIN 16

#define TOKEN_WORDS (TOKEN_MAX / 8)

struct token {
    size_t len;
    uint64_t w[TOKEN_WORDS]; /* the token zero-padded: a comparison reads every word */
    sd_auth_t auth;
};

static pthread_rwlock_t mu = PTHREAD_RWLOCK_INITIALIZER;
static struct token *tokens;
static size_t ntokens;
static char *token_path;

static const struct {
    const char *name;
    unsigned role;
} role_names[] = {
    {"ops", SD_R_OPS}, {"bigbrother", SD_R_BB}, {"game", SD_R_GAME}, {"viewer", SD_R_VIEWER},
};

const char *sd_role_name(unsigned role)
{
    for (size_t i = 0; i < SD_ARRAY_LEN(role_names); i++)
        if (role_names[i].role == role)
            return role_names[i].name;
    return "none";
}

/* One `key=value` binding of a token line into a; NULL, or why it is refused. */
static const char *parse_binding(const char *kv, sd_auth_t *a)
{
    static const struct {
        const char *key;
        size_t off;
        unsigned roles; /* the roles that may carry it */
    } keys[] = {
        {"cluster", offsetof(sd_auth_t, cluster), SD_R_BB | SD_R_GAME | SD_R_VIEWER},
        {"machine", offsetof(sd_auth_t, machine), SD_R_BB},
        {"holder_prefix", offsetof(sd_auth_t, holder_prefix), SD_R_GAME},
    };
    const char *eq = strchr(kv, '=');
    for (size_t i = 0; eq && i < SD_ARRAY_LEN(keys); i++) {
        if (strlen(keys[i].key) != (size_t)(eq - kv) || strncmp(kv, keys[i].key, (size_t)(eq - kv)))
            continue;
        char *dst = (char *)a + keys[i].off;
        if (!(keys[i].roles & a->role))
            return i == 0 ? "cluster= binds bigbrother, game and viewer tokens only"
                   : i == 1 ? "machine= binds bigbrother tokens only"
                            : "holder_prefix= binds game tokens only";
        if (*dst)
            return "a binding is given twice";
        if (!sd_name_valid(eq + 1, SD_NAME_MAX))
            return "a binding's value must be a name (1-" SD_STR(SD_NAME_MAX) " of "
                   SD_NAME_CHARSET_TEXT ")";
        snprintf(dst, SD_NAME_MAX + 1, "%s", eq + 1);
        return NULL;
    }
    return "unknown binding (cluster=, machine=, holder_prefix=)";
}

/* One non-comment line into t; NULL, or why it is refused. */
static const char *parse_line(char *l, struct token *t)
{
    memset(t, 0, sizeof *t);
    char *save = NULL, *role = strtok_r(l, " \t", &save), *tok = strtok_r(NULL, " \t", &save);
    for (size_t i = 0; role && i < SD_ARRAY_LEN(role_names); i++)
        if (strcmp(role, role_names[i].name) == 0)
            t->auth.role = role_names[i].role;
    if (!tok)
        return "expected `ROLE TOKEN [cluster=C] [machine=M] [holder_prefix=P]`";
    if (!t->auth.role)
        return "unknown role (ops, bigbrother, game, viewer)";
    size_t len = strlen(tok);
    if (len > TOKEN_MAX)
        return "token longer than 256 characters";
    if (len < TOKEN_MIN)
        return "token shorter than 16 characters";
    for (char *kv; (kv = strtok_r(NULL, " \t", &save));) {
        const char *why = parse_binding(kv, &t->auth);
        if (why)
            return why;
    }
    if (t->auth.machine[0] && !t->auth.cluster[0])
        return "machine= needs cluster= (a machine is named within its cluster)";
    t->len = len;
    memcpy(t->w, tok, len);
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)tok, len, md);
    snprintf(t->auth.principal, sizeof t->auth.principal, "token:%02x%02x%02x%02x%02x%02x",
             md[0], md[1], md[2], md[3], md[4], md[5]);
    return NULL;
}

/* Parses the token file text into a new array (caller frees). Returns the count, or -1
 * with the offending line number in *bad_line. */
static long parse_tokens(char *text, struct token **out, int *bad_line, const char **why)
{
    struct token *arr = NULL;
    size_t n = 0, cap = 0;
    int line = 0;
    *why = NULL;
    for (char *l = text, *next; l; l = next) {
        next = strchr(l, '\n');
        if (next)
            *next++ = '\0';
        line++;
        while (*l == ' ' || *l == '\t')
            l++;
        size_t len = strlen(l);
        while (len && (l[len - 1] == '\r' || l[len - 1] == ' ' || l[len - 1] == '\t'))
            l[--len] = '\0';
        if (!*l || *l == '#')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            struct token *na = realloc(arr, cap * sizeof *na);
            if (!na) {
                *why = "out of memory";
                break;
            }
            arr = na;
        }
        *why = parse_line(l, &arr[n]);
        if (*why)
            break;
        n++;
    }
    if (*why) {
        free(arr);
        *bad_line = line;
        return -1;
    }
    *out = arr;
    return (long)n;
}

long sd_auth_parse(char *text, int *bad_line, const char **why)
{
    struct token *arr = NULL;
    long n = parse_tokens(text, &arr, bad_line, why);
    free(arr);
    return n;
}

static int load(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 0004))
        log_warn("token file is readable by others", "path=%s mode=%o", path,
                 (unsigned)(st.st_mode & 0777));
    char *text;
    int rc = sd_read_file(path, TOKEN_FILE_MAX, &text, NULL);
    if (rc) {
        log_error("cannot read token file", "path=%s err=%s", path, strerror(-rc));
        return rc;
    }
    struct token *arr = NULL;
    int bad = 0;
    const char *why = NULL;
    long n = parse_tokens(text, &arr, &bad, &why);
    free(text);
    if (n < 0) {
        log_error("bad token file", "path=%s line=%d err=%s", path, bad, why);
        return -EINVAL;
    }
    pthread_rwlock_wrlock(&mu);
    free(tokens);
    tokens = arr;
    ntokens = (size_t)n;
    pthread_rwlock_unlock(&mu);
    log_info("tokens loaded", "path=%s count=%ld", path, n);
    return 0;
}

int sd_auth_load(const char *path)
{
    if (!path || !*path) {
        sd_log_msg(SD_LOG_WARN, "no token file: open access, every caller has the ops role");
        return 0;
    }
    token_path = strdup(path);
    return load(path);
}

int sd_auth_reload(void)
{
    return token_path ? load(token_path) : 0;
}

int sd_auth_open_mode(void) { return token_path == NULL; }

unsigned sd_auth_lookup(const char *token, size_t len, sd_auth_t *out)
{
    /* The presented token, zero-padded to TOKEN_MAX: each comparison below reads every
     * word of both and the lengths, so its time depends on neither the token's length
     * nor where it differs (32 words a token: a file of 1,000 tokens costs a few us). */
    uint64_t given[TOKEN_WORDS] = {0};
    uint64_t glen = len > TOKEN_MAX ? TOKEN_MAX + 1 : len;
    memcpy(given, token, len > TOKEN_MAX ? TOKEN_MAX : len);
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&mu);
    for (size_t i = 0; i < ntokens; i++) {
        uint64_t d = glen ^ tokens[i].len;
        for (size_t k = 0; k < TOKEN_WORDS; k++)
            d |= given[k] ^ tokens[i].w[k];
        if (d == 0)
            *out = tokens[i].auth;
    }
    pthread_rwlock_unlock(&mu);
    return out->role;
}

int sd_req_forbid(const sd_req_t *req, sd_resp_t *resp, const char *what)
{
    const sd_auth_t *a = &req->auth;
    if (a->cred)
        sd_resp_error(resp, 403, "forbidden",
                      "this credential names instance '%s' of cluster '%s'; it may not %s",
                      a->instance, a->cluster, what);
    else if (a->machine[0])
        sd_resp_error(resp, 403, "forbidden",
                      "this token is bound to machine '%s' of cluster '%s'; it may not %s",
                      a->machine, a->cluster, what);
    else if (a->holder_prefix[0] && !a->cluster[0])
        sd_resp_error(resp, 403, "forbidden",
                      "this token is bound to holders starting with '%s'; it may not %s",
                      a->holder_prefix, what);
    else
        sd_resp_error(resp, 403, "forbidden",
                      "this token is bound to cluster '%s'%s%s%s; it may not %s", a->cluster,
                      a->holder_prefix[0] ? " and holders starting with '" : "",
                      a->holder_prefix, a->holder_prefix[0] ? "'" : "", what);
    return -1;
}

int sd_req_may_cluster(const sd_req_t *req, sd_resp_t *resp, const char *cluster)
{
    const sd_auth_t *a = &req->auth;
    if (!a->cluster[0] || !strcmp(a->cluster, cluster))
        return 0;
    char what[SD_NAME_MAX + 32];
    snprintf(what, sizeof what, "act for cluster '%s'", cluster);
    return sd_req_forbid(req, resp, what);
}

int sd_req_may_machine(const sd_req_t *req, sd_resp_t *resp, const char *cluster,
                       const char *machine)
{
    if (sd_req_may_cluster(req, resp, cluster))
        return -1;
    const sd_auth_t *a = &req->auth;
    if (!a->machine[0] || !strcmp(a->machine, machine))
        return 0;
    char what[SD_NAME_MAX + 32];
    snprintf(what, sizeof what, "act for machine '%s'", machine);
    return sd_req_forbid(req, resp, what);
}

int sd_req_may_hold(sd_req_t *req, sd_resp_t *resp, const char *holder)
{
    const sd_auth_t *a = &req->auth;
    size_t n = strlen(a->holder_prefix);
    /* an instance credential holds as exactly its instance */
    if (a->cred ? !strcmp(holder, a->instance) : !n || !strncmp(holder, a->holder_prefix, n))
        return 0;
    /* A revoked credential is told so (401) whatever it asked, as on the other routes,
     * where the front checks before the handler runs. */
    if (a->cred && (sd_req_defer(req) || sd_cred_live(req, resp)))
        return -1;
    char what[SD_NAME_MAX + 32];
    snprintf(what, sizeof what, "act as holder '%s'", holder);
    return sd_req_forbid(req, resp, what);
}

const char *sd_req_holder_prefix(const sd_req_t *req) { return req->auth.holder_prefix; }
