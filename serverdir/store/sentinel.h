/* Redis Sentinel discovery for store.c (sentinel://h1:p1,h2:p2/mastername). Internal to
 * serverdir.
 *
 * The current primary is shared by every worker thread and tagged with a generation
 * number that changes whenever the primary changes or becomes unknown; a worker whose
 * connection was made under an older generation drops it and reconnects. Discovery asks
 * each sentinel in turn (SENTINEL get-master-addr-by-name) and verifies the answer with
 * ROLE on the primary itself; it runs on the worker that first needs it, at most once per
 * SD_SENTINEL_RETRY_MS, and never while another discovery is in flight (other workers
 * answer 503 meanwhile instead of waiting). A subscriber thread also listens for the
 * sentinels' +switch-master announcements. */
#ifndef SD_SENTINEL_H
#define SD_SENTINEL_H

#include <stddef.h>
#include <stdint.h>

#define SD_SENTINEL_RETRY_MS 100

/* Parses "h1:p1,h2:p2/mastername" (the part after sentinel:// and an optional password)
 * and remembers it with the primary's password ("" for none). 0 or -EINVAL. */
int sd__sentinel_init(const char *spec, const char *password);

/* The primary to connect to: host into host[cap], *port, and the generation it belongs
 * to. Runs a discovery first when the primary is unknown or was reported failing (rate
 * limited). Returns 0, or -1 while no primary is known. */
int sd__sentinel_master(char *host, size_t cap, int *port, uint64_t *gen);

/* The current generation (an atomic read, cheap on every command). */
uint64_t sd__sentinel_gen(void);

/* Reports that the primary of generation gen failed (I/O error, READONLY, not a master
 * on connect): the next sd__sentinel_master runs a discovery. lost: the address is known
 * to be no primary any more, so no worker should use it until a discovery confirms one. */
void sd__sentinel_failed(uint64_t gen, int lost);

/* Starts / stops the thread that subscribes to +switch-master on one sentinel at a time
 * and sends the workers back to the sentinels as soon as a failover is announced (a
 * demoted primary still answers reads; this moves them too). 0 or -errno. */
int sd__sentinel_start(void);
void sd__sentinel_stop(void);

#endif
