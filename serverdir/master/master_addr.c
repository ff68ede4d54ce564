/* Pure helpers of the master list, shared by the REST handlers, the UDP front and the
 * protocol modules: canonical address keys and the filter program builder. No Redis, no
 * configuration, so the protocol unit tests and fuzz targets link them alone. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "master.h"
#include "sdutil.h"

/* ---------- addresses ---------- */

const char *sd_master_addr_group(const char *ip, int v4bits, char *out, size_t cap)
{
    unsigned char b[16];
    char txt[INET6_ADDRSTRLEN];
    /* (IPv6 text always has a ':': an IPv4 address is not parsed as one first) */
    if (strchr(ip, ':') && inet_pton(AF_INET6, ip, b) == 1 &&
        !IN6_IS_ADDR_V4MAPPED((struct in6_addr *)b)) {
        memset(b + 8, 0, 8); /* the /64: one site, one host's whole range */
        inet_ntop(AF_INET6, b, txt, sizeof txt);
        snprintf(out, cap, "%s/64", txt);
    } else if (v4bits == 24 && inet_pton(AF_INET, ip, b) == 1) {
        snprintf(out, cap, "%u.%u.%u.0/24", b[0], b[1], b[2]);
    } else {
        sd_strlcpy(out, ip, cap);
    }
    return out;
}

int sd_master_addr_key(const char *ip, int port, char *key, size_t keycap, char *ipout,
                       size_t ipcap, int *family)
{
    unsigned char buf[16];
    char txt[INET6_ADDRSTRLEN];
    int fam;
    if (inet_pton(AF_INET, ip, buf) == 1) {
        fam = 4;
        inet_ntop(AF_INET, buf, txt, sizeof txt);
    } else if (inet_pton(AF_INET6, ip, buf) == 1) {
        /* An IPv4-mapped IPv6 address is the IPv4 server it stands for. */
        if (IN6_IS_ADDR_V4MAPPED((struct in6_addr *)buf)) {
            fam = 4;
            inet_ntop(AF_INET, buf + 12, txt, sizeof txt);
        } else {
            fam = 6;
            inet_ntop(AF_INET6, buf, txt, sizeof txt);
        }
    } else {
        return -1;
    }
    if (port < 1 || port > 65535)
        return -1;
    if (key)
        snprintf(key, keycap, fam == 4 ? "%s:%d" : "[%s]:%d", txt, port);
    if (ipout)
        sd_strlcpy(ipout, txt, ipcap);
    if (family)
        *family = fam;
    return 0;
}

/* Writes the decimal digits of v (< 100000) at out; their count. */
static size_t put_dec(char *out, unsigned v)
{
    char t[8];
    size_t n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = t[n - 1 - i];
    return n;
}

/* The key and IP text of an IPv4 source without a parse and a print (every UDP datagram
 * comes through here): what sd_master_addr_key makes of the same address. */
static int v4_key(const uint8_t b[4], int p, char *key, size_t keycap, char *ip, size_t ipcap)
{
    char txt[24];
    size_t n = 0;
    for (int i = 0; i < 4; i++) {
        n += put_dec(txt + n, b[i]);
        txt[n++] = i < 3 ? '.' : '\0';
    }
    n--; /* the IP's length */
    if (p < 1 || p > 65535)
        return -1;
    if (key) {
        char k[24];
        memcpy(k, txt, n);
        k[n] = ':';
        size_t kn = n + 1 + put_dec(k + n + 1, (unsigned)p);
        k[kn] = '\0';
        sd_strlcpy(key, k, keycap);
    }
    if (ip)
        sd_strlcpy(ip, txt, ipcap);
    return 0;
}

int sd_master_addr_from_sockaddr(const struct sockaddr *sa, char *key, size_t keycap,
                                 char *ip, size_t ipcap, int *port)
{
    char txt[INET6_ADDRSTRLEN];
    int p;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        p = ntohs(in->sin_port);
        if (port)
            *port = p;
        return v4_key((const uint8_t *)&in->sin_addr, p, key, keycap, ip, ipcap);
    }
    if (sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_V4MAPPED(&((const struct sockaddr_in6 *)sa)->sin6_addr)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        p = ntohs(in6->sin6_port);
        if (port)
            *port = p;
        return v4_key((const uint8_t *)&in6->sin6_addr + 12, p, key, keycap, ip, ipcap);
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, txt, sizeof txt);
        p = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, txt, sizeof txt);
        p = ntohs(in6->sin6_port);
    } else {
        return -1;
    }
    if (port)
        *port = p;
    return sd_master_addr_key(txt, p, key, keycap, ip, ipcap, NULL);
}

int sd_master_parse_addr(const char *s, char *key, size_t keycap, char *ip, size_t ipcap,
                         int *port, int *family)
{
    char host[64];
    int p;
    if (strlen(s) >= SD_MASTER_ADDR_MAX || sd_parse_hostport(s, host, sizeof host, &p))
        return -1;
    if (port)
        *port = p;
    return sd_master_addr_key(host, p, key, keycap, ip, ipcap, family);
}

const char *sd_master_ip_of(const sd_msrv_t *s, char *out, size_t cap)
{
    const char *key = s->buf;
    const char *ip0 = key[0] == '[' ? key + 1 : key;
    const char *ip1 = key[0] == '[' ? strchr(key, ']') : strrchr(key, ':');
    size_t n = ip1 && ip1 >= ip0 ? (size_t)(ip1 - ip0) : 0;
    if (n >= cap)
        n = cap ? cap - 1 : 0;
    if (cap) {
        memcpy(out, ip0, n);
        out[n] = '\0';
    }
    return out;
}

/* ---------- filter ---------- */

void sd_master_filter_add(sd_master_filter_t *f, const char *op, const char *a, const char *b)
{
    if (f->n >= SD_MASTER_MAX_TERMS) {
        f->overflow = 1;
        return;
    }
    sd_master_term_t *t = &f->t[f->n++];
    sd_strlcpy(t->op, op, sizeof t->op);
    sd_strlcpy(t->a, a ? a : "", sizeof t->a);
    sd_strlcpy(t->b, b ? b : "", sizeof t->b);
}
