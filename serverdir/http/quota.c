/* Quotas: the limits, the refusal and the tallies (quota.h). */
#include "quota.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdvalid.h"

/* Generous defaults (docs/operations.md, "Quotas"): none bites normal use; each bounds
 * what one caller can take from everyone else. */
int64_t sd_quota_limit[SD_QUOTA_COUNT] = {
    [SD_QUOTA_BLOB_BYTES] = 1LL << 30,
    [SD_QUOTA_LOCKS_PER_HOLDER] = 10000,
    [SD_QUOTA_ALLOC_WAITING] = 10000,
    [SD_QUOTA_ALLOC_WAITING_PER_CLUSTER] = 5000,
    [SD_QUOTA_ALLOC_WAITING_PER_TOKEN] = 2500,
};

static const struct {
    const char *name;
    int status;
} quotas[SD_QUOTA_COUNT] = {
#define SD_QUOTA_ROW(e, n, s) [SD_QUOTA_##e] = {n, s},
    SD_QUOTAS(SD_QUOTA_ROW)
#undef SD_QUOTA_ROW
};

int sd_quota_config_load(const json_t *section, char *err, size_t errcap)
{
    static const char *known[SD_QUOTA_COUNT + 1];
    for (int q = 0; q < SD_QUOTA_COUNT; q++)
        known[q] = quotas[q].name;
    if (!section)
        return 0;
    if (!json_is_object(section)) {
        snprintf(err, errcap, "section 'quotas' must be an object");
        return -1;
    }
    int64_t lim[SD_QUOTA_COUNT]; /* all or nothing */
    memcpy(lim, sd_quota_limit, sizeof lim);
    sd_jv_t jv;
    sd_jv_init(&jv, "", err, errcap);
    if (sd_jv_only_keys(&jv, section, known))
        return -1;
    for (int q = 0; q < SD_QUOTA_COUNT; q++)
        if (sd_jv_int(&jv, section, quotas[q].name, 0, 0, INT64_MAX / 2, &lim[q]) < 0)
            return -1;
    memcpy(sd_quota_limit, lim, sizeof lim);
    return 0;
}

/* serverdir_quota_refusals_total{quota="<name>"} of q, created on first use. */
static _Atomic int64_t *refusals(sd_quota_t q)
{
    static _Atomic(_Atomic int64_t *) c[SD_QUOTA_COUNT];
    _Atomic int64_t *p = atomic_load(&c[q]);
    if (!p) {
        char series[128];
        snprintf(series, sizeof series, "serverdir_quota_refusals_total{quota=\"%s\"}",
                 quotas[q].name);
        p = sd_metric_counter(series, "requests refused by a quota (docs/operations.md)");
        atomic_store(&c[q], p);
    }
    return p;
}

void sd_quota_refuse(sd_resp_t *resp, sd_quota_t q, int64_t used, const char *scope)
{
    static _Atomic int64_t logged_ms[SD_QUOTA_COUNT];
    int64_t limit = sd_quota_limit[q], now = sd_mono_ms();
    atomic_fetch_add(refusals(q), 1);
    int64_t last = atomic_load(&logged_ms[q]);
    if (now - last >= 1000 && atomic_compare_exchange_strong(&logged_ms[q], &last, now))
        log_warn("quota exceeded", "quota=%s scope=%s limit=%lld used=%lld", quotas[q].name,
                 scope, (long long)limit, (long long)used);
    if (quotas[q].status == 429)
        sd_resp_header(resp, "Retry-After", "1");
    sd_resp_error_extra(resp, quotas[q].status, "quota_exceeded",
                        json_pack("{s:s, s:I, s:I, s:s}", "quota", quotas[q].name, "limit",
                                  (json_int_t)limit, "used", (json_int_t)used, "scope", scope),
                        "quota %s of %s: %lld used, the limit is %lld", quotas[q].name, scope,
                        (long long)used, (long long)limit);
}

const char *sd_quota_scope(const sd_req_t *req, char *buf, size_t cap)
{
    if (req->auth.cluster[0])
        snprintf(buf, cap, "cluster:%s", req->auth.cluster);
    else
        snprintf(buf, cap, "%s", req->auth.principal[0] ? req->auth.principal : "open");
    return buf;
}

/* ---------- tallies ---------- */

struct sd_quota_ent {
    sd_quota_ent_t *next;
    int64_t n;
    char name[];
};

static sd_quota_ent_t **slot_of(sd_quota_tally_t *t, const char *name)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    sd_quota_ent_t **pp = &t->bucket[h % SD_QUOTA_BUCKETS];
    while (*pp && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    return pp;
}

int sd_quota_take(sd_quota_tally_t *t, const char *name, int64_t limit, int64_t *used)
{
    pthread_mutex_lock(&t->mu);
    sd_quota_ent_t **pp = slot_of(t, name);
    int64_t n = *pp ? (*pp)->n : 0;
    int rc = -1;
    *used = n;
    if (limit == 0 || n < limit) {
        if (!*pp) {
            size_t len = strlen(name) + 1;
            sd_quota_ent_t *e = calloc(1, sizeof *e + len);
            if (e)
                memcpy(e->name, name, len);
            *pp = e;
        }
        if (*pp) {
            (*pp)->n++;
            rc = 0;
        } else {
            *used = -1;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void sd_quota_give(sd_quota_tally_t *t, const char *name)
{
    pthread_mutex_lock(&t->mu);
    sd_quota_ent_t **pp = slot_of(t, name);
    sd_quota_ent_t *e = *pp;
    if (e && --e->n <= 0) {
        *pp = e->next;
        free(e);
    }
    pthread_mutex_unlock(&t->mu);
}
