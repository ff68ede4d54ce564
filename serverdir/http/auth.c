/* Bearer tokens mapped to roles, read from a token file of `ROLE TOKEN` lines ('#'
 * comments). Reloaded on SIGHUP: a file that fails to parse leaves the old table in
 * place. Without a token file every request is treated as `ops` (open mode). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sd.h"

#define TOKEN_FILE_MAX (1 << 20)
#define TOKEN_MAX 256
#define TOKEN_MIN 16

struct token {
    unsigned role;
    size_t len;
    char tok[TOKEN_MAX + 1];
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

/* Parses the token file text into a new array (caller frees). Returns the count, or -1
 * with the offending line number in *bad_line. */
static long parse_tokens(char *text, struct token **out, int *bad_line, const char **why)
{
    struct token *arr = NULL;
    size_t n = 0, cap = 0;
    int line = 0;
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        while (*l == ' ' || *l == '\t')
            l++;
        size_t len = strlen(l);
        while (len && (l[len - 1] == '\r' || l[len - 1] == ' ' || l[len - 1] == '\t'))
            l[--len] = '\0';
        if (!*l || *l == '#')
            continue;
        char role[32], tok[TOKEN_MAX + 2], extra[2];
        int k = sscanf(l, "%31s %257s %1s", role, tok, extra);
        unsigned r = 0;
        for (size_t i = 0; k >= 1 && i < SD_ARRAY_LEN(role_names); i++)
            if (strcmp(role, role_names[i].name) == 0)
                r = role_names[i].role;
        *why = k != 2 ? "expected `ROLE TOKEN`" : !r ? "unknown role (ops, bigbrother, game, viewer)"
               : strlen(tok) > TOKEN_MAX ? "token longer than 256 characters"
               : strlen(tok) < TOKEN_MIN ? "token shorter than 16 characters" : NULL;
        if (*why) {
            free(arr);
            *bad_line = line;
            return -1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            struct token *na = realloc(arr, cap * sizeof *na);
            if (!na) {
                free(arr);
                *why = "out of memory";
                *bad_line = line;
                return -1;
            }
            arr = na;
        }
        arr[n].role = r;
        arr[n].len = strlen(tok);
        memcpy(arr[n].tok, tok, arr[n].len + 1);
        n++;
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

/* Compares in time independent of where the strings differ. */
static int ct_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    unsigned char d = alen != blen;
    size_t n = alen < blen ? alen : blen;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

unsigned sd_auth_role(const char *token)
{
    size_t len = strnlen(token, TOKEN_MAX + 1);
    if (len > TOKEN_MAX)
        return 0;
    unsigned role = 0;
    pthread_rwlock_rdlock(&mu);
    for (size_t i = 0; i < ntokens; i++)
        if (ct_equal(token, len, tokens[i].tok, tokens[i].len))
            role = tokens[i].role;
    pthread_rwlock_unlock(&mu);
    return role;
}
