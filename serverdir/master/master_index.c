/* The master list as each serverdir copy holds it in memory, kept current from Redis, and
 * the writer that batches UDP registrations into Redis (docs/master.md, "How a copy
 * answers").
 *
 * Redis stays the shared truth: every change to the list is a script that also appends
 * the changed addresses to the stream P log. Each copy
 *   - loads the whole list once (HSCAN of P s, in pages of 1000: Redis is never held for
 *     more than a page), then follows P log with a blocking XREAD and reads the records
 *     it names (HMGET), so a heartbeat taken by any copy is seen by all within a few
 *     milliseconds; when it falls too far behind (the stream is trimmed past it) or the
 *     stream is gone (Redis flushed or replaced) it loads the whole list again;
 *   - applies its own writes at once after Redis accepted them;
 *   - answers every query (UDP and REST) from an immutable sorted snapshot of the index:
 *     a query never waits on Redis. The first query after a change builds the next
 *     snapshot by merging the sorted changed keys into the previous one (O(changes log n
 *     + n) pointer copies, ~0.1 ms at 100,000 servers), so a copy's own writes are in its
 *     next answer and a stream of heartbeats with no query costs no snapshot; the index
 *     thread also builds one every cycle (at most 200 ms), which frees replaced records.
 *
 * Memory: records are immutable; a replaced or removed one is freed when every snapshot
 * that may point at it has been released (snapshots are released in age order).
 *
 * Locks: idx_mu guards the hash table, the pending changes and the snapshot list (held
 * for short, bounded work only). apply_mu is held by the index thread from before it
 * reads records from Redis until it has applied them, and by a local writer while it
 * applies what Redis accepted (never across its own Redis call): a local apply then
 * comes either before the read (which sees the write) or after the apply, so a read of
 * an older state can never overwrite a newer write (a removal read just before a local
 * heartbeat was written would otherwise delete it). Upserts also keep the later expiry. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

#include "master.h"
#include "master_q3.h"
#include "sd.h"

#define SCAN_PAGE 1000
#define HMGET_CHUNK 500
#define WRITE_BATCH 512
#define QUEUE_CAP 65536
#define GATHER_US 3000 /* a busy writer waits this long at most for a fuller batch */
#define BUSY_US 5000   /* ... when its last batch ended less than this ago */
#define WRITE_RETRY_MS 10000 /* a batch is tried again this long while Redis is down */
#define SWEEP_EVERY_MS 200 /* a share of the list is walked for expiry this often */
#define KEY_EVERY_MS 10000
#define SWEEP_BATCH 1000

/* ---------- records ---------- */

uint32_t sd_master_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

#define hash_key sd_master_hash

/* The interned game names: an open-addressing table of 2^17 slots, at most 2^16 names,
 * never shrunk (bounded memory whatever servers announce). */
#define GAMES_MAX 65536
static pthread_mutex_t games_mu = PTHREAD_MUTEX_INITIALIZER;
static char *games[GAMES_MAX * 2];
static uint32_t game_ids[GAMES_MAX * 2];
static uint32_t ngames;

static uint32_t game_find(const char *lower, int add)
{
    uint32_t h = sd_master_hash(lower) & (GAMES_MAX * 2 - 1), id = 0;
    pthread_mutex_lock(&games_mu);
    while (games[h] && strcmp(games[h], lower) != 0)
        h = (h + 1) & (GAMES_MAX * 2 - 1);
    if (games[h]) {
        id = game_ids[h];
    } else if (add && ngames < GAMES_MAX && (games[h] = strdup(lower)) != NULL) {
        game_ids[h] = id = ++ngames;
    }
    pthread_mutex_unlock(&games_mu);
    return id;
}

uint32_t sd_master_game_id(const char *lower)
{
    return game_find(lower, 1);
}

uint32_t sd_master_game_lookup(const char *lower)
{
    return game_find(lower, 0);
}

/* Bytes of the records the index holds (allocated, not yet freed: those a held snapshot
 * may still point at included), for serverdir_master_index_bytes. */
static _Atomic size_t rec_bytes;

static void srv_free(sd_msrv_t *s)
{
    atomic_fetch_sub(&rec_bytes, malloc_usable_size(s));
    free(s);
}

/* The record fields the index does not keep: the challenge (a hash of it is kept, for
 * the replay check), the quota group and the instance (Redis has them), the expiry and
 * the heartbeat's time (kept as numbers). They read as "". */
static int field_dropped(int f)
{
    return f == SD_MREC_CHAL || f == SD_MREC_GROUP || f == SD_MREC_INST || f == SD_MREC_EXP || f == SD_MREC_LAST;
}

/* Parses "key" + record into one allocation of exactly what it keeps (no slack for
 * the allocator to split off: a list of 100,000 servers is 100,000 of these). NULL when
 * the record is malformed. buf: key \0, the kept fields \0 each, ",tags," lowercased \0. */
static sd_msrv_t *srv_parse(const char *key, const char *rec, size_t len)
{
    size_t klen = strlen(key);
    if (klen >= SD_MASTER_ADDR_MAX || len > 4096)
        return NULL;
    /* pass 1: the fields' bounds, the size kept, the numbers */
    size_t start[SD_MREC_N], flen[SD_MREC_N];
    int nf = 0;
    size_t kept = 0, from = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && rec[i] == '\0')
            return NULL;
        if (i == len || rec[i] == '\x1f') {
            if (nf >= SD_MREC_N)
                return NULL;
            start[nf] = from;
            flen[nf] = i - from;
            if (!field_dropped(nf))
                kept += flen[nf] + 1;
            nf++;
            from = i + 1;
        }
    }
    if (nf != SD_MREC_N || flen[SD_MREC_EXP] > 20 || flen[SD_MREC_LAST] > 20)
        return NULL;
    size_t size = klen + 1 + kept + flen[SD_MREC_TAGS] + 3;
    sd_msrv_t *s = malloc(sizeof(sd_msrv_t) + size);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    s->hash = hash_key(key);
    char *b = s->buf;
    memcpy(b, key, klen + 1);
    size_t at = klen + 1;
    for (int f = 0; f < SD_MREC_N; f++) {
        if (field_dropped(f)) {
            s->roff[f] = (uint16_t)klen; /* the key's terminator: "" */
            continue;
        }
        s->roff[f] = (uint16_t)at;
        memcpy(b + at, rec + start[f], flen[f]);
        at += flen[f];
        b[at++] = '\0';
    }
    s->chal_hash = sd_master_chal_hash(rec + start[SD_MREC_CHAL], flen[SD_MREC_CHAL]);
    char num[24];
    memcpy(num, rec + start[SD_MREC_EXP], flen[SD_MREC_EXP]);
    num[flen[SD_MREC_EXP]] = '\0';
    s->exp = strtoll(num, NULL, 10);
    memcpy(num, rec + start[SD_MREC_LAST], flen[SD_MREC_LAST]);
    num[flen[SD_MREC_LAST]] = '\0';
    s->last_ms = strtoll(num, NULL, 10);
    int fam = sd_master_key_bytes(key, s->ip, &s->port);
    if (fam < 0)
        goto bad;
    s->fam = (uint8_t)fam;
    s->players = atoi(SD_MREC(s, SD_MREC_PLAYERS));
    s->max_players = atoi(SD_MREC(s, SD_MREC_MAX));
    s->protocol = atoi(SD_MREC(s, SD_MREC_PROTO));
    s->gametype = atoi(SD_MREC(s, SD_MREC_GT));
    /* the game's id: its lowercased name interned (a name too long for it has none, and
     * the filters compare its text) */
    char low[256];
    const char *g = SD_MREC(s, SD_MREC_GAME);
    size_t gl = strlen(g);
    if (gl < sizeof low) {
        for (size_t i = 0; i <= gl; i++)
            low[i] = (char)((g[i] >= 'A' && g[i] <= 'Z') ? g[i] + 32 : g[i]);
        s->gid = sd_master_game_id(low);
    }
    s->foff[SD_MX_TAGS] = (uint16_t)at;
    b[at++] = ',';
    for (const char *p = SD_MREC(s, SD_MREC_TAGS); *p; p++)
        b[at++] = (char)((*p >= 'A' && *p <= 'Z') ? *p + 32 : *p);
    if (b[at - 1] != ',')
        b[at++] = ',';
    b[at++] = '\0';
    atomic_fetch_add(&rec_bytes, malloc_usable_size(s));
    return s;
bad:
    free(s);
    return NULL;
}

/* ---------- the index ---------- */

static pthread_mutex_t idx_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t apply_mu = PTHREAD_MUTEX_INITIALIZER;
static sd_msrv_t **buckets;
static size_t nbuckets, nservers;
static uint32_t mark_gen;
/* The records put or taken out of the table since the current snapshot (a record taken
 * out is on the retired list, so still allocated, until that snapshot is released). */
static sd_msrv_t **pending;
static size_t npending, cappending;
static sd_msrv_t *retired;         /* records out of the table since the current snapshot */
static sd_master_snap_t *snap_oldest, *snap_current;

static sd_msrv_t **find_slot(const char *key)
{
    uint32_t h = hash_key(key);
    sd_msrv_t **pp = &buckets[h & (nbuckets - 1)];
    while (*pp && ((*pp)->hash != h || strcmp((*pp)->buf, key) != 0))
        pp = &(*pp)->hnext;
    return pp;
}

static int grow(void)
{
    size_t nb = nbuckets ? nbuckets * 2 : 1024;
    sd_msrv_t **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return -1;
    for (size_t i = 0; i < nbuckets; i++) {
        sd_msrv_t *s = buckets[i];
        while (s) {
            sd_msrv_t *next = s->hnext;
            size_t h = s->hash & (nb - 1);
            s->hnext = nbk[h];
            nbk[h] = s;
            s = next;
        }
    }
    free(buckets);
    buckets = nbk;
    nbuckets = nb;
    return 0;
}

static void note_pending(sd_msrv_t *s)
{
    if (npending == cappending) {
        size_t nc = cappending ? cappending * 2 : 256;
        sd_msrv_t **np = realloc(pending, nc * sizeof *np);
        if (!np)
            return; /* the change is in the table; the next full build catches it */
        pending = np;
        cappending = nc;
    }
    pending[npending++] = s;
}

static void retire(sd_msrv_t *s)
{
    s->gone = 1;
    s->hnext = retired;
    retired = s;
}

/* Under idx_mu. Takes s (replacing an older record of its key) unless the table holds a
 * newer one (later expiry): then s is freed. */
static void put_locked(sd_msrv_t *s)
{
    if (!buckets || nservers >= nbuckets)
        grow();
    sd_msrv_t **pp = find_slot(s->buf);
    sd_msrv_t *old = *pp;
    if (old && (old->exp > s->exp ||
                (old->exp == s->exp && old->last_ms == s->last_ms &&
                 old->chal_hash == s->chal_hash))) {
        /* older, or the same heartbeat again (a copy's own write read back from the
         * stream): keep what is there */
        old->mark = mark_gen;
        srv_free(s);
        return;
    }
    s->mark = mark_gen;
    if (old) {
        s->hnext = old->hnext;
        *pp = s;
        retire(old);
    } else {
        s->hnext = NULL;
        *pp = s;
        nservers++;
    }
    note_pending(s);
}

static void del_locked(const char *key)
{
    if (!buckets)
        return;
    sd_msrv_t **pp = find_slot(key);
    sd_msrv_t *old = *pp;
    if (!old)
        return;
    *pp = old->hnext;
    nservers--;
    retire(old);
    note_pending(old);
}

int sd_master_index_put(const char *key, const char *rec, size_t len)
{
    sd_msrv_t *s = srv_parse(key, rec, len);
    if (!s) {
        SD_COUNT("serverdir_master_bad_records_total",
                 "master-list records in Redis that could not be read (skipped)", 1);
        return -1;
    }
    pthread_mutex_lock(&idx_mu);
    put_locked(s);
    pthread_mutex_unlock(&idx_mu);
    return 0;
}

void sd_master_index_del(const char *key)
{
    pthread_mutex_lock(&idx_mu);
    del_locked(key);
    pthread_mutex_unlock(&idx_mu);
}

void sd_master_apply_lock(void)
{
    pthread_mutex_lock(&apply_mu);
}

void sd_master_apply_unlock(void)
{
    pthread_mutex_unlock(&apply_mu);
}

uint32_t sd_master_chal_hash(const char *chal, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)chal[i]) * 16777619u;
    return h;
}

int sd_master_index_lookup(const char *key, uint32_t *chal_hash, int64_t *exp)
{
    int found = 0;
    pthread_mutex_lock(&idx_mu);
    if (buckets) {
        sd_msrv_t *s = *find_slot(key);
        if (s) {
            found = 1;
            if (chal_hash)
                *chal_hash = s->chal_hash;
            if (exp)
                *exp = s->exp;
        }
    }
    pthread_mutex_unlock(&idx_mu);
    return found;
}

int sd_master_index_listed_by(const char *key, const char *source)
{
    int yes = 0;
    pthread_mutex_lock(&idx_mu);
    if (buckets) {
        sd_msrv_t *s = *find_slot(key);
        if (s) {
            const char *src = SD_MREC(s, SD_MREC_SOURCE);
            yes = !src[0] || strcmp(src, source) == 0;
        }
    }
    pthread_mutex_unlock(&idx_mu);
    return yes;
}

/* ---------- snapshots ---------- */

/* A snapshot's sorted vector: a large one (800 KB at 100,000 servers, one made per
 * change) is mapped on its own and given back whole when freed, so the heap keeps no
 * holes of old vectors (glibc would otherwise raise its mmap threshold past this size
 * after the first free and carve them from the heap: 2-3 MB of holes at 100,000). */
#define SNAP_VEC_MMAP (64 * 1024)

static void *snap_vec_alloc(size_t bytes)
{
    if (bytes < SNAP_VEC_MMAP)
        return malloc(bytes);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void snap_vec_free(void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes < SNAP_VEC_MMAP)
        free(p);
    else
        munmap(p, bytes);
}

static void snap_free_old_locked(void)
{
    while (snap_oldest && snap_oldest->refs == 0) {
        sd_master_snap_t *s = snap_oldest;
        snap_oldest = s->newer;
        sd_msrv_t *r = s->retired;
        while (r) {
            sd_msrv_t *next = r->hnext;
            srv_free(r);
            r = next;
        }
        snap_vec_free(s->v, s->vbytes);
        free(s);
    }
}

static void publish_locked(void);

sd_master_snap_t *sd_master_snap_get(void)
{
    pthread_mutex_lock(&idx_mu);
    publish_locked(); /* only when something changed since the last one */
    sd_master_snap_t *s = snap_current;
    if (s)
        s->refs++;
    pthread_mutex_unlock(&idx_mu);
    return s;
}

void sd_master_snap_put(sd_master_snap_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&idx_mu);
    s->refs--;
    snap_free_old_locked();
    pthread_mutex_unlock(&idx_mu);
}

static int cmp_srv(const void *a, const void *b)
{
    return strcmp((*(sd_msrv_t *const *)a)->buf, (*(sd_msrv_t *const *)b)->buf);
}

size_t sd_master_snap_after(const sd_master_snap_t *s, const char *after)
{
    if (!after || !after[0])
        return 0;
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->v[mid]->buf, after) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static size_t lower_bound(sd_msrv_t *const *v, size_t n, const char *key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(v[mid]->buf, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Under idx_mu: the next snapshot, merging the pending keys into the current one. */
static void publish_locked(void)
{
    if (snap_current && npending == 0)
        return;
    if (npending > 1)
        qsort(pending, npending, sizeof *pending, cmp_srv);
    size_t oldn = snap_current ? snap_current->n : 0;
    sd_msrv_t *const *oldv = snap_current ? snap_current->v : NULL;
    sd_master_snap_t *ns = calloc(1, sizeof *ns);
    size_t vbytes = (oldn + npending + 1) * sizeof(sd_msrv_t *);
    sd_msrv_t **v = snap_vec_alloc(vbytes);
    if (!ns || !v) {
        free(ns);
        snap_vec_free(v, vbytes);
        return; /* try again with the next change */
    }
    size_t i = 0, n = 0;
    for (size_t k = 0; k < npending;) {
        /* the run of changes to one key: its record now is the one not taken out (at
         * most one: a put takes out the one it replaces), none when the key went */
        const char *key = pending[k]->buf;
        sd_msrv_t *cur = NULL;
        for (; k < npending && strcmp(pending[k]->buf, key) == 0; k++)
            if (!pending[k]->gone)
                cur = pending[k];
        size_t pos = oldv ? i + lower_bound(oldv + i, oldn - i, key) : 0;
        if (pos > i)
            memcpy(v + n, oldv + i, (pos - i) * sizeof *v);
        n += pos - i;
        i = pos;
        if (i < oldn && strcmp(oldv[i]->buf, key) == 0)
            i++;
        if (cur)
            v[n++] = cur;
    }
    if (oldn > i)
        memcpy(v + n, oldv + i, (oldn - i) * sizeof *v);
    n += oldn - i;
    npending = 0;
    ns->v = v;
    ns->vbytes = vbytes;
    ns->n = n;
    ns->refs = 1; /* the index's own */
    sd_master_snap_t *old = snap_current;
    if (old) {
        old->retired = retired; /* records the old snapshot may still point at */
        retired = NULL;
        old->newer = ns;
    } else {
        snap_oldest = ns;
    }
    snap_current = ns;
    if (old) {
        old->refs--;
        snap_free_old_locked();
    }
}

void sd_master_index_publish(void)
{
    pthread_mutex_lock(&idx_mu);
    publish_locked();
    pthread_mutex_unlock(&idx_mu);
}

/* ---------- following Redis ---------- */

static void key_of(char *buf, size_t cap, const char *suffix)
{
    snprintf(buf, cap, "%s%s", sd_master_base(), suffix);
}

static char last_id[64] = "0-0";
/* The index must be loaded again: at start, after the list was lost, and after a batch
 * of this copy's heartbeats got no answer (Redis may have stored them: the stream entry
 * that names them is skipped, as this copy's own, so only a load would show them). */
static _Atomic int need_load = 1;
/* This copy's id in the change stream (field c): the entries of its own heartbeats, which
 * it applied to its index when Redis accepted them, are not read back. */
static char copy_id[17];

const char *sd_master_copy_id(void)
{
    return copy_id;
}

void sd_master_index_request_load(void)
{
    atomic_store(&need_load, 1);
}
static char life[40]; /* P life when the index was last loaded (master_watch.lua) */

/* The newest entry id of P log into id ("0-0" when there is none); 1 when the stream
 * exists, 0 when not, -1 on error. */
static int stream_last(char *id, size_t cap)
{
    char key[128];
    key_of(key, sizeof key, "log");
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "XREVRANGE");
    sd_argv_add(&a, key);
    sd_argv_add(&a, "+");
    sd_argv_add(&a, "-");
    sd_argv_add(&a, "COUNT");
    sd_argv_add(&a, "1");
    redisReply *r;
    int failed = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (failed)
        return -1;
    int rc = -1;
    if (r->type == REDIS_REPLY_ARRAY) {
        if (r->elements == 0) {
            sd_strlcpy(id, "0-0", cap);
            rc = 0;
        } else if (r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements >= 1 &&
                   r->element[0]->element[0]->type == REDIS_REPLY_STRING) {
            sd_strlcpy(id, r->element[0]->element[0]->str, cap);
            rc = 1;
        }
    }
    freeReplyObject(r);
    return rc;
}

static int id_cmp(const char *a, const char *b)
{
    unsigned long long a1 = 0, a2 = 0, b1 = 0, b2 = 0;
    sscanf(a, "%llu-%llu", &a1, &a2);
    sscanf(b, "%llu-%llu", &b1, &b2);
    if (a1 != b1)
        return a1 < b1 ? -1 : 1;
    return a2 < b2 ? -1 : a2 > b2;
}

/* Reads the records of addrs (HMGET P s) and applies them: present ones replace, absent
 * ones are removed. */
static int fetch_apply(char **addrs, size_t n)
{
    char key[128];
    key_of(key, sizeof key, "s");
    for (size_t at = 0; at < n; at += HMGET_CHUNK) {
        size_t m = n - at < HMGET_CHUNK ? n - at : HMGET_CHUNK;
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, "HMGET");
        sd_argv_add(&a, key);
        for (size_t i = 0; i < m; i++)
            sd_argv_add(&a, addrs[at + i]);
        pthread_mutex_lock(&apply_mu);
        redisReply *r;
        int rc = sd_store_command(&a, &r);
        sd_argv_free(&a);
        if (rc) {
            pthread_mutex_unlock(&apply_mu);
            return -1;
        }
        if (r->type == REDIS_REPLY_ARRAY && r->elements == m) {
            for (size_t i = 0; i < m; i++) {
                redisReply *e = r->element[i];
                if (e->type == REDIS_REPLY_STRING)
                    sd_master_index_put(addrs[at + i], e->str, e->len);
                else
                    sd_master_index_del(addrs[at + i]);
            }
        }
        freeReplyObject(r);
        pthread_mutex_unlock(&apply_mu);
    }
    return 0;
}

/* The whole list again: every record of P s (HSCAN pages), then whatever the table
 * still holds that was not seen is gone. last_id is set first, so nothing written during
 * the scan is missed (it is read again from the stream). */
/* P life: the token the list carries (drawn now when it has none) into out. */
static int life_get(char *out, size_t cap)
{
    char key[128], fresh[33];
    key_of(key, sizeof key, "life");
    if (sd_random_hex(fresh, 16))
        return -1;
    const char *set[] = {"SET", key, fresh, "NX"}, *get[] = {"GET", key};
    for (int step = 0; step < 2; step++) {
        sd_argv_t a;
        sd_argv_init(&a);
        for (size_t i = 0; i < (step ? SD_ARRAY_LEN(get) : SD_ARRAY_LEN(set)); i++)
            sd_argv_add(&a, step ? get[i] : set[i]);
        redisReply *r;
        int failed = sd_store_command(&a, &r);
        sd_argv_free(&a);
        if (failed)
            return -1;
        int ok = !step || (r->type == REDIS_REPLY_STRING && r->len < cap);
        if (step && ok)
            sd_strlcpy(out, r->str, cap);
        freeReplyObject(r);
        if (!ok)
            return -1;
    }
    return 0;
}

static int load_all(void)
{
    char id[64];
    if (life_get(life, sizeof life) || stream_last(id, sizeof id) < 0)
        return -1;
    char key[128];
    key_of(key, sizeof key, "s");
    pthread_mutex_lock(&idx_mu);
    uint32_t gen = ++mark_gen;
    pthread_mutex_unlock(&idx_mu);
    char cursor[32] = "0";
    size_t total = 0;
    int64_t t0 = sd_mono_ms();
    do {
        sd_argv_t a;
        sd_argv_init(&a);
        sd_argv_add(&a, "HSCAN");
        sd_argv_add(&a, key);
        sd_argv_add(&a, cursor);
        sd_argv_add(&a, "COUNT");
        sd_argv_add(&a, "1000");
        pthread_mutex_lock(&apply_mu);
        redisReply *r;
        int failed = sd_store_command(&a, &r);
        sd_argv_free(&a);
        if (failed) {
            pthread_mutex_unlock(&apply_mu);
            return -1;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            pthread_mutex_unlock(&apply_mu);
            return -1;
        }
        sd_strlcpy(cursor, r->element[0]->str, sizeof cursor);
        redisReply *kv = r->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            if (kv->element[i]->type == REDIS_REPLY_STRING &&
                kv->element[i + 1]->type == REDIS_REPLY_STRING) {
                sd_master_index_put(kv->element[i]->str, kv->element[i + 1]->str,
                                    kv->element[i + 1]->len);
                total++;
            }
        }
        freeReplyObject(r);
        pthread_mutex_unlock(&apply_mu);
    } while (strcmp(cursor, "0") != 0);
    /* What the scan did not see is no longer listed (records written meanwhile by this
     * copy carry the new mark too). */
    pthread_mutex_lock(&idx_mu);
    for (size_t b = 0; b < nbuckets; b++) {
        sd_msrv_t **pp = &buckets[b];
        while (*pp) {
            sd_msrv_t *s = *pp;
            if (s->mark != gen) {
                *pp = s->hnext;
                nservers--;
                retire(s);
                note_pending(s);
            } else {
                pp = &s->hnext;
            }
        }
    }
    publish_locked();
    pthread_mutex_unlock(&idx_mu);
    sd_strlcpy(last_id, id, sizeof last_id);
    log_info("master list loaded", "servers=%zu ms=%lld", total, (long long)(sd_mono_ms() - t0));
    return 0;
}

/* One XREAD of P log after last_id (blocking up to block_ms) and the records it names:
 * 0, -1 when Redis failed, 1 when an entry's p (the entry before it) is not the last one
 * read: entries were lost under this copy (a replica behind took over), the list must be
 * loaded again (what came before that entry is applied). */
static int follow(int block_ms)
{
    char key[128];
    key_of(key, sizeof key, "log");
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "XREAD");
    sd_argv_add(&a, "COUNT");
    sd_argv_add(&a, "200");
    sd_argv_add(&a, "BLOCK");
    sd_argv_addf(&a, "%d", block_ms);
    sd_argv_add(&a, "STREAMS");
    sd_argv_add(&a, key);
    sd_argv_add(&a, last_id);
    redisReply *r;
    int failed = sd_store_command(&a, &r);
    sd_argv_free(&a);
    if (failed)
        return -1;
    if (r->type == REDIS_REPLY_NIL) {
        freeReplyObject(r);
        return 0;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->elements != 2 || r->element[0]->element[1]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return -1;
    }
    redisReply *entries = r->element[0]->element[1];
    char **addrs = NULL;
    size_t n = 0, cap = 0;
    int went_back = 0;
    for (size_t i = 0; i < entries->elements && !went_back; i++) {
        redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING ||
            e->element[1]->type != REDIS_REPLY_ARRAY)
            continue;
        redisReply *fv = e->element[1];
        /* p: the entry before this one; not the last one read: entries were lost */
        for (size_t j = 0; j + 1 < fv->elements; j += 2)
            if (fv->element[j]->type == REDIS_REPLY_STRING && !strcmp(fv->element[j]->str, "p") &&
                fv->element[j + 1]->type == REDIS_REPLY_STRING &&
                strcmp(fv->element[j + 1]->str, last_id) != 0)
                went_back = 1;
        if (went_back)
            break;
        sd_strlcpy(last_id, e->element[0]->str, sizeof last_id);
        int own = 0; /* this copy's heartbeats: in the index since Redis accepted them */
        for (size_t j = 0; j + 1 < fv->elements; j += 2)
            if (fv->element[j]->type == REDIS_REPLY_STRING && !strcmp(fv->element[j]->str, "c") &&
                fv->element[j + 1]->type == REDIS_REPLY_STRING && !strcmp(fv->element[j + 1]->str, copy_id))
                own = 1;
        for (size_t j = 0; j + 1 < fv->elements && !own; j += 2) {
            if (fv->element[j]->type != REDIS_REPLY_STRING || strcmp(fv->element[j]->str, "a") ||
                fv->element[j + 1]->type != REDIS_REPLY_STRING)
                continue;
            char *p = fv->element[j + 1]->str;
            while (*p) {
                char *nl = strchr(p, '\n');
                size_t len = nl ? (size_t)(nl - p) : strlen(p);
                if (len > 0 && len < SD_MASTER_ADDR_MAX) {
                    if (n == cap) {
                        size_t nc = cap ? cap * 2 : 512;
                        char **na = realloc(addrs, nc * sizeof *na);
                        if (!na)
                            break;
                        addrs = na;
                        cap = nc;
                    }
                    addrs[n] = strndup(p, len);
                    if (addrs[n])
                        n++;
                }
                p += len;
                if (*p == '\n')
                    p++;
            }
        }
    }
    freeReplyObject(r);
    int rc = fetch_apply(addrs, n);
    for (size_t i = 0; i < n; i++)
        free(addrs[i]);
    free(addrs);
    return rc ? rc : went_back;
}

static int run_sweep(void)
{
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_master_base());
    sd_argv_addf(&a, "%lld", (long long)sd_wall_ms());
    sd_argv_addf(&a, "%d", SWEEP_BATCH);
    sd_argv_addf(&a, "%d", SD_MASTER_LOG_MAXLEN);
    sd_argv_addf(&a, "%d", SWEEP_EVERY_MS);
    redisReply *r;
    int rc = sd_store_run("master_sweep", 1, &a, &r);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
        pthread_mutex_lock(&apply_mu);
        for (size_t i = 0; i < r->elements; i++)
            if (r->element[i]->type == REDIS_REPLY_STRING)
                sd_master_index_del(r->element[i]->str);
        pthread_mutex_unlock(&apply_mu);
        SD_COUNT("serverdir_master_servers_expired_total",
                 "servers removed by the sweep (listing ran out or getinfo unanswered)",
                 (int64_t)r->elements);
    }
    freeReplyObject(r);
    return 0;
}

/* The key the copy last read (k, p, t), offered back when Redis has lost it. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static char held_k[65], held_p[65], held_t[24];

int sd_master_key_refresh(void)
{
    char fresh[65];
    if (sd_random_hex(fresh, 32))
        return -1;
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_master_base());
    sd_argv_addf(&a, "%lld", (long long)sd_wall_ms());
    sd_argv_addf(&a, "%lld", (long long)sd_master_cfg.challenge_key_rotate_s * 1000);
    sd_argv_add(&a, fresh);
    pthread_mutex_lock(&held_mu);
    if (held_k[0]) {
        sd_argv_add(&a, held_k);
        sd_argv_add(&a, held_p);
        sd_argv_add(&a, held_t);
    }
    pthread_mutex_unlock(&held_mu);
    redisReply *r;
    int rc = sd_store_run("master_key", 1, &a, &r);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING && r->element[2]->type == REDIS_REPLY_STRING &&
        r->element[2]->len < sizeof held_t) {
        rc = sd_master_key_set(r->element[0]->str, r->element[1]->str) ? SD_STORE_ERROR : 0;
        if (!rc) { /* both 64 hex digits: sd_master_key_set checked them */
            pthread_mutex_lock(&held_mu);
            sd_strlcpy(held_k, r->element[0]->str, sizeof held_k);
            sd_strlcpy(held_p, r->element[1]->str, sizeof held_p);
            sd_strlcpy(held_t, r->element[2]->str, sizeof held_t);
            pthread_mutex_unlock(&held_mu);
        }
    } else {
        rc = SD_STORE_ERROR;
    }
    freeReplyObject(r);
    return rc;
}

/* Whether the list under the index is the one it loaded, and the stream still has what
 * it read (master_watch.lua): 0 yes, 1 no (*why says how), -1 Redis did not answer. */
static int list_changed(const char **why)
{
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, sd_master_base());
    sd_argv_add(&a, last_id);
    redisReply *r;
    if (sd_store_run("master_watch", 1, &a, &r))
        return -1;
    int rc = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[2]->type == REDIS_REPLY_INTEGER) {
        const char *cur = r->element[0]->str, *first = r->element[1]->str;
        int read = strcmp(last_id, "0-0") != 0;
        rc = 1;
        if (strcmp(cur, life) != 0)
            *why = "list lost"; /* flushed, restarted empty, or replaced */
        else if (read && !*first)
            *why = "change stream gone";
        else if (read && id_cmp(first, last_id) > 0)
            *why = "fell behind the change stream";
        else if (read && !r->element[2]->integer)
            *why = "change stream went back"; /* a replica behind the primary took over */
        else
            rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

static pthread_t sync_thread, writer_thread;
static _Atomic int stopping;
static int started;

static void *sync_main(void *arg)
{
    (void)arg;
    int64_t next_sweep = 0, next_key = 0;
    int logged_down = 0;
    while (!atomic_load(&stopping)) {
        int64_t now = sd_mono_ms();
        int rc = 0;
        if (now >= next_key) {
            if (sd_master_key_refresh() == 0)
                next_key = now + KEY_EVERY_MS;
            else
                next_key = now + 1000;
        }
        if (atomic_exchange(&need_load, 0)) { /* a request made during the load stays */
            rc = load_all();
            if (rc)
                atomic_store(&need_load, 1);
        }
        if (rc == 0 && now >= next_sweep) {
            rc = run_sweep();
            next_sweep = now + SWEEP_EVERY_MS;
        }
        /* The list lost (Redis flushed, restarted empty or replaced: its life token
         * changed), the stream without what was read (a replica behind took over) or
         * trimmed past it: load everything again, after the challenge key (put back from
         * what this copy holds when it went with the list). */
        const char *why = NULL;
        int changed = 0;
        if (rc == 0 && (changed = list_changed(&why)) < 0) {
            changed = 0;
            rc = -1;
        }
        if (rc == 0 && !changed && (rc = follow(200)) == 1) {
            changed = 1;
            why = "change stream went back";
            rc = 0;
        }
        if (changed) {
            log_warn("master list reloading", "reason=%s", why);
            SD_COUNT("serverdir_master_reloads_total",
                     "full reloads of the master list index (the list lost or the change "
                     "stream not followed)", 1);
            atomic_store(&need_load, 1);
            next_key = 0;
            continue;
        }
        sd_master_index_publish(); /* frees what the last snapshot no longer needs */
        if (rc) {
            if (!logged_down)
                log_warn("master list cannot follow redis", "retry_ms=%d", 500);
            logged_down = 1;
            for (int i = 0; i < 5 && !atomic_load(&stopping); i++)
                { struct timespec ts = {0, 100 * 1000000L}; nanosleep(&ts, NULL); }
        } else {
            logged_down = 0;
        }
    }
    sd_store_thread_close();
    return NULL;
}

/* ---------- the writer ---------- */

struct wop {
    char kind;        /* 'h' heartbeat, 'p' probe, 't' terminate */
    const char *proto;
    char *addr, *group, *inst, *rec;
    size_t reclen;
    int64_t at_ms;    /* probe deadline */
    char mem[];
};

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;      /* the queue is not empty */
static pthread_cond_t q_full_cv = PTHREAD_COND_INITIALIZER; /* it holds a whole batch */
static int64_t last_call_us = INT64_MIN / 2; /* when the writer's last batch ended */
static struct wop *queue[QUEUE_CAP];
static size_t q_head, q_len;

static int enqueue(struct wop *op)
{
    pthread_mutex_lock(&q_mu);
    if (q_len == QUEUE_CAP) {
        pthread_mutex_unlock(&q_mu);
        free(op);
        return -1;
    }
    queue[(q_head + q_len++) % QUEUE_CAP] = op;
    if (q_len == 1)
        pthread_cond_signal(&q_cv);
    else if (q_len == WRITE_BATCH)
        pthread_cond_signal(&q_full_cv);
    pthread_mutex_unlock(&q_mu);
    return 0;
}

static struct wop *op_new(char kind, const char *proto, const char *addr, const char *group,
                          const char *inst, const char *rec, size_t reclen)
{
    size_t la = strlen(addr) + 1, lg = strlen(group) + 1, li = strlen(inst) + 1;
    struct wop *op = malloc(sizeof *op + la + lg + li + reclen + 1);
    if (!op)
        return NULL;
    op->kind = kind;
    op->proto = proto;
    op->addr = op->mem;
    op->group = op->addr + la;
    op->inst = op->group + lg;
    op->rec = op->inst + li;
    memcpy(op->addr, addr, la);
    memcpy(op->group, group, lg);
    memcpy(op->inst, inst, li);
    memcpy(op->rec, rec, reclen);
    op->rec[reclen] = '\0';
    op->reclen = reclen;
    op->at_ms = 0;
    return op;
}

int sd_master_write_heartbeat(const char *proto, const char *addr, const char *group,
                              const char *inst, const char *rec, size_t reclen)
{
    struct wop *op = op_new('h', proto, addr, group, inst, rec, reclen);
    if (!op || enqueue(op)) {
        sd_master_count_drop(proto, "overload");
        return -1;
    }
    return 0;
}

int sd_master_write_probe(const char *addr, int64_t deadline_ms)
{
    struct wop *op = op_new('p', "q3", addr, "", "", "", 0);
    if (!op)
        return -1;
    op->at_ms = deadline_ms;
    return enqueue(op);
}

int sd_master_write_terminate(const char *proto, const char *addr)
{
    struct wop *op = op_new('t', proto, addr, "", "", "", 0);
    if (!op || enqueue(op)) {
        sd_master_count_drop(proto, "overload");
        return -1;
    }
    return 0;
}

/* The heartbeats of one batch: one master_heartbeat call, then the accepted ones go into
 * the index. */
/* sd_store_run for the writer: while Redis cannot be reached (a failover, a restart) the
 * batch is tried again, 100 ms apart, for up to WRITE_RETRY_MS, so the registrations it
 * holds are not lost to a short outage (what arrives meanwhile waits in the queue, up to
 * QUEUE_CAP). The script's own time argument is now at the call that lands. */
static int store_run_retrying(const char *script, void (*build)(sd_argv_t *, struct wop **, int),
                              struct wop **ops, int n, redisReply **r)
{
    int64_t t0 = sd_mono_ms();
    int rc;
    for (;;) {
        sd_argv_t a;
        sd_argv_init(&a);
        build(&a, ops, n);
        rc = sd_store_run(script, 1, &a, r); /* frees a */
        if (rc != SD_STORE_DOWN || sd_mono_ms() - t0 >= WRITE_RETRY_MS ||
            atomic_load(&stopping))
            break;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return rc;
}

/* master_heartbeat's arguments: KEYS[1] the key base; ARGV now, ttl, per-address and
 * total caps, the log's length, n, then 4 per heartbeat. */
static void heartbeats_argv(sd_argv_t *a, struct wop **ops, int n)
{
    sd_argv_add(a, sd_master_base());
    sd_argv_addf(a, "%lld", (long long)sd_wall_ms());
    sd_argv_addf(a, "%lld", (long long)sd_master_cfg.heartbeat_interval_s * 3000);
    sd_argv_addf(a, "%lld", (long long)sd_master_cfg.servers_per_address);
    sd_argv_addf(a, "%lld", (long long)sd_master_cfg.max_servers);
    sd_argv_addf(a, "%d", SD_MASTER_LOG_MAXLEN);
    sd_argv_add(a, copy_id);
    sd_argv_addf(a, "%d", n);
    for (int i = 0; i < n; i++) {
        sd_argv_add(a, ops[i]->addr);
        sd_argv_add(a, ops[i]->group);
        sd_argv_add(a, ops[i]->inst);
        sd_argv_addn(a, ops[i]->rec, ops[i]->reclen);
    }
}

static void write_heartbeats(struct wop **ops, int n)
{
    redisReply *r;
    int rc = store_run_retrying("master_heartbeat", heartbeats_argv, ops, n, &r);
    if (rc || r->type != REDIS_REPLY_ARRAY || (int)r->elements != n) {
        for (int i = 0; i < n; i++)
            sd_master_count_drop(ops[i]->proto, "store");
        if (!rc)
            freeReplyObject(r);
        /* Redis may have stored them (a reply lost with the connection) under an entry
         * this copy skips as its own: only a load shows them */
        atomic_store(&need_load, 1);
        return;
    }
    pthread_mutex_lock(&apply_mu);
    int64_t accepted = 0, fresh = 0;
    for (int i = 0; i < n; i++) {
        redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_INTEGER) {
            sd_master_index_put(ops[i]->addr, ops[i]->rec, ops[i]->reclen);
            accepted++;
            if (e->integer == 1) {
                fresh++;
                log_debug("master server listed", "addr=%s source=%s", ops[i]->addr, ops[i]->proto);
            }
        } else if (e->type == REDIS_REPLY_STRING) {
            char code[48];
            size_t m = strcspn(e->str, " ");
            if (m >= sizeof code)
                m = sizeof code - 1;
            memcpy(code, e->str, m);
            code[m] = '\0';
            sd_master_count_drop(ops[i]->proto, code);
        }
    }
    pthread_mutex_unlock(&apply_mu);
    freeReplyObject(r);
    SD_COUNT("serverdir_master_heartbeats_total", "master-list heartbeats accepted", accepted);
    if (fresh)
        SD_COUNT("serverdir_master_servers_new_total", "servers that joined the master list", fresh);
}

static void write_probes(struct wop **ops, int n)
{
    char (*dl)[24] = malloc((size_t)n * sizeof *dl); /* the deadlines, as text */
    char key[128];
    if (!dl)
        return;
    key_of(key, sizeof key, "probe");
    sd_argv_t a;
    sd_argv_init(&a);
    sd_argv_add(&a, "ZADD");
    sd_argv_add(&a, key);
    sd_argv_add(&a, "NX");
    for (int i = 0; i < n; i++) {
        snprintf(dl[i], sizeof dl[i], "%lld", (long long)ops[i]->at_ms);
        sd_argv_add(&a, dl[i]);
        sd_argv_add(&a, ops[i]->addr);
    }
    redisReply *r;
    if (sd_store_command(&a, &r) == 0)
        freeReplyObject(r);
    sd_argv_free(&a);
    free(dl);
}

static void write_terminate(struct wop *op)
{
    int removed = 0;
    sd_master_refusal_t why;
    int rc = sd_master_remove(op->addr, op->proto, &removed, &why);
    if (rc) {
        sd_master_count_drop(op->proto, rc == SD_MASTER_REFUSED ? why.code : "store");
        return;
    }
    SD_COUNT("serverdir_master_servers_terminated_total", "servers removed by termination", 1);
    log_debug("master server removed", "addr=%s reason=%s", op->addr, "terminated");
}

static void *writer_main(void *arg)
{
    (void)arg;
    struct wop *batch[WRITE_BATCH];
    for (;;) {
        pthread_mutex_lock(&q_mu);
        while (q_len == 0 && !atomic_load(&stopping))
            pthread_cond_wait(&q_cv, &q_mu);
        if (q_len == 0 && atomic_load(&stopping)) {
            pthread_mutex_unlock(&q_mu);
            break;
        }
        /* Busy (the last call ended a moment ago): wait up to GATHER_US for a fuller
         * batch. A script call has a fixed cost (its stream entry, the HMGETs and HSETs
         * of the batch, the follower's wake-up), so under load fewer, larger calls cost
         * less per registration (at 100,000 servers: ~240 a call instead of ~150 with
         * 1 ms, CPU per registration with Redis's 12.9 us instead of 14.1-14.7); a lone
         * heartbeat is written at once. */
        if (q_len < WRITE_BATCH && sd_mono_us() - last_call_us < BUSY_US) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += GATHER_US * 1000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            while (q_len < WRITE_BATCH && !atomic_load(&stopping) &&
                   pthread_cond_timedwait(&q_full_cv, &q_mu, &until) == 0)
                ;
        }
        int n = 0;
        while (q_len > 0 && n < WRITE_BATCH) {
            batch[n++] = queue[q_head];
            q_head = (q_head + 1) % QUEUE_CAP;
            q_len--;
        }
        pthread_mutex_unlock(&q_mu);
        /* In order, each run of one kind as one call. */
        for (int i = 0; i < n;) {
            int j = i;
            while (j < n && batch[j]->kind == batch[i]->kind)
                j++;
            if (batch[i]->kind == 'h')
                write_heartbeats(batch + i, j - i);
            else if (batch[i]->kind == 'p')
                write_probes(batch + i, j - i);
            else
                for (int k = i; k < j; k++)
                    write_terminate(batch[k]);
            i = j;
        }
        for (int i = 0; i < n; i++)
            free(batch[i]);
        last_call_us = sd_mono_us();
    }
    sd_store_thread_close();
    return NULL;
}

/* ---------- start and stop ---------- */

size_t sd_master_index_bytes(void)
{
    pthread_mutex_lock(&idx_mu);
    size_t n = atomic_load(&rec_bytes) + nbuckets * sizeof *buckets;
    for (sd_master_snap_t *s = snap_oldest; s; s = s->newer)
        n += s->vbytes + sizeof *s;
    n += cappending * sizeof *pending;
    pthread_mutex_unlock(&idx_mu);
    return n;
}

size_t sd_master_index_count(void)
{
    pthread_mutex_lock(&idx_mu);
    size_t n = nservers;
    pthread_mutex_unlock(&idx_mu);
    return n;
}

int sd_master_start(void)
{
    if (started)
        return 0;
    if (sd_random_hex(copy_id, 8))
        return -EIO;
    pthread_mutex_lock(&idx_mu);
    publish_locked(); /* an empty first snapshot */
    pthread_mutex_unlock(&idx_mu);
    /* The challenge key before the first heartbeat if Redis is up; else the index thread
     * keeps trying. */
    sd_master_key_refresh();
    int rc = pthread_create(&sync_thread, NULL, sync_main, NULL);
    if (rc)
        return -rc;
    rc = pthread_create(&writer_thread, NULL, writer_main, NULL);
    if (rc) {
        atomic_store(&stopping, 1);
        pthread_join(sync_thread, NULL);
        return -rc;
    }
    started = 1;
    return 0;
}

void sd_master_stop(void)
{
    if (!started)
        return;
    atomic_store(&stopping, 1);
    pthread_mutex_lock(&q_mu);
    pthread_cond_broadcast(&q_cv);
    pthread_cond_broadcast(&q_full_cv);
    pthread_mutex_unlock(&q_mu);
    pthread_join(writer_thread, NULL);
    pthread_join(sync_thread, NULL);
    started = 0;
    /* free everything (valgrind-clean exit) */
    pthread_mutex_lock(&idx_mu);
    for (size_t b = 0; b < nbuckets; b++) {
        sd_msrv_t *s = buckets[b];
        while (s) {
            sd_msrv_t *next = s->hnext;
            srv_free(s);
            s = next;
        }
    }
    free(buckets);
    buckets = NULL;
    nbuckets = nservers = 0;
    sd_msrv_t *r = retired;
    while (r) {
        sd_msrv_t *next = r->hnext;
        srv_free(r);
        r = next;
    }
    retired = NULL;
    free(pending);
    pending = NULL;
    npending = cappending = 0;
    if (snap_current)
        snap_current->refs--;
    snap_current = NULL;
    snap_free_old_locked();
    pthread_mutex_unlock(&idx_mu);
}
