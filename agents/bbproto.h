/* The Big Brother agent wire protocol, shared by libbbagent and bigbrother (internal:
 * not part of bbagent.h). libc only, no allocation.
 *
 * Transport: a SOCK_SEQPACKET unix socket at $BB_SOCKET, one persistent connection per
 * game process; one message per packet, at most BBPROTO_MAX_MSG bytes. The same parser
 * reads sd_notify datagrams on $NOTIFY_SOCKET (SOCK_DGRAM). The sender's pid always
 * comes from SO_PEERCRED / SCM_CREDENTIALS, never from a message.
 *
 * A message is sd_notify-style text: lines "KEY=VALUE" separated by '\n' (the last
 * newline optional). KEY: 1-32 of [A-Z0-9_]. VALUE: 0-1024 bytes, no NUL and no '\n'.
 * Unknown keys are ignored by both sides (forward compatibility).
 *
 * agent -> bigbrother
 *   HELLO=1 INSTANCE=<id> PROTO=1      first message on a (re)connection
 *   READY=1                            start-up done: the process serves players
 *   HEARTBEAT=1                        the game loop runs (WATCHDOG=1 is a synonym)
 *   STATUS=<text>                      free text shown by sdctl
 *   PLAYERS=<n> MAX_PLAYERS=<n>        optional load figures
 *   STOPPING=1                         shutting down on its own
 *   ALLOCATION_ACK=<id>                the game got the allocation (bbagent_poll)
 *   RELEASE=1                          the session is over (bbagent_release)
 *   BYE=<reason>                       clean close
 * bigbrother -> agent
 *   WELCOME=1 HEARTBEAT_MS=<n>         accepted; send a heartbeat at least this often
 *   SHUTDOWN=1 GRACE_MS=<n>            save players and exit within the grace
 *   DRAIN=1                            take no new players
 *   ALLOCATED=<id> MODE=ready|join PLAYERS=<n> PAYLOAD=<json>   a session for this process
 *   DEALLOCATED=<id>                   an allocation ended from outside
 *   CREDENTIAL=<jwt>                   the instance's credential, alone in its packet: the
 *                                      one value allowed past BBPROTO_MAX_VALUE (see
 *                                      bbproto_credential_parse)
 */
#ifndef BBPROTO_H
#define BBPROTO_H

#include <stddef.h>

#define BBPROTO_VERSION 1
#define BBPROTO_MAX_MSG 4096
#define BBPROTO_MAX_FIELDS 32
#define BBPROTO_MAX_KEY 32
#define BBPROTO_MAX_VALUE 1024
#define BBPROTO_CREDENTIAL_MAX 4096 /* longest JWT a CREDENTIAL frame carries */
/* The largest packet bigbrother sends: a CREDENTIAL frame with the longest JWT. */
#define BBPROTO_MAX_FRAME (sizeof "CREDENTIAL=" - 1 + BBPROTO_CREDENTIAL_MAX + 1)

typedef struct {
    const char *key;
    size_t klen;
    const char *val;
    size_t vlen;
} bbproto_field_t;

/* Parses one message of len bytes (not NUL-terminated) into at most max fields that
 * point into buf. Returns the field count, -EINVAL for a malformed line (no '=', bad key,
 * NUL byte, empty line in the middle) or -E2BIG (message, value or field count over the
 * limits). */
int bbproto_parse(const char *buf, size_t len, bbproto_field_t *out, int max);

/* The value of key in the parsed fields (last one wins), or NULL; *vlen gets its length. */
const char *bbproto_get(const bbproto_field_t *f, int n, const char *key, size_t *vlen);

/* Parses the value of key as a decimal integer in [min,max]; 0 on success, -ENOENT if
 * absent, -EINVAL if not such a number. */
int bbproto_get_int(const bbproto_field_t *f, int n, const char *key, long long min,
                    long long max, long long *out);

/* Appends "KEY=VALUE\n" to buf[0..len) within cap; returns the new length or -E2BIG
 * (-EINVAL for a bad key or a value with '\n' or NUL). */
int bbproto_put(char *buf, size_t cap, size_t len, const char *key, const char *val);

/* The CREDENTIAL frame: exactly one line "CREDENTIAL=<jwt>" (the newline optional) in a
 * packet of its own, so that a JWT up to BBPROTO_CREDENTIAL_MAX bytes fits although it is
 * longer than a value may be elsewhere. The JWT is a JWS in compact form: three non-empty
 * parts of base64url (A-Z a-z 0-9 - _) joined by two dots. Returns 0 and points *jwt,
 * *jlen into buf for a valid frame; -ENOENT when buf is not a CREDENTIAL frame (parse it
 * with bbproto_parse); -EINVAL or -E2BIG for a CREDENTIAL frame that breaks the rule (an
 * agent ignores it). */
int bbproto_credential_parse(const char *buf, size_t len, const char **jwt, size_t *jlen);

/* Writes the CREDENTIAL frame of jwt (jlen bytes) into buf; returns its length, or -EINVAL
 * for a jwt bbproto_credential_parse would refuse, -E2BIG when cap is too small. */
int bbproto_credential_put(char *buf, size_t cap, const char *jwt, size_t jlen);

#endif
