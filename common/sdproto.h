/* The wire contract shared by bigbrother, libsdclient, serverdir and sdctl: names (the
 * rule itself is in sdname.h, which libbbagent shares), the limits of a request, the
 * process event types and stop reasons, and the one text form of a stop reason
 * ("killed(signal 9)"), and the check of a process event.
 *
 * serverdir's Lua scripts get the same values from the build: cmake/lua_prelude.cmake
 * reads every "#define SD_NAME <decimal>" line below (and in sdname.h) and the rows
 * X(SD_EV_..., "name") and X(SD_STOP_..., "name", flags) of the SD_EVENT_TYPES /
 * SD_STOP_REASONS tables into the prelude in front of each script (SD.NAME,
 * SD.EVENT_TYPES[name], SD.STOP_REASONS[name]). Keep those lines in that shape. */
#ifndef SD_PROTO_H
#define SD_PROTO_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sdname.h" /* the name rule: SD_NAME_MAX, sd_name_valid */
#include "sdvalid.h"

/* POST /v1/clusters/{c}/events */
#define SD_EVENTS_MAX 1000      /* events in one POST */
#define SD_DETAIL_MAX 256       /* stopped.detail, bytes */
#define SD_LOG_TAIL_MAX 4096    /* stopped.log_tail: the crash report's last output, bytes */
#define SD_LOG_TAIL_LINES 20    /* ... and lines */
#define SD_CORE_PATH_MAX 256    /* stopped.core: where the core file went */
#define SD_PORTS_MAX 32         /* entries of `ports` */
#define SD_PORT_NAME_MAX 64     /* a key of `ports` (a name) */
#define SD_PID_MAX 4194304      /* 1 << 22, Linux's pid_max ceiling */

#define SD_STATUS_MAX 1024      /* status.status: the game's status line, bytes */
#define SD_PLAYERS_MAX 1000000  /* status.players / max_players */

/* POST /v1/clusters/{c}/allocations (docs/allocation.md) */
#define SD_ALLOC_PAYLOAD_MAX 1024 /* the payload, compact JSON bytes */
#define SD_ALLOC_WAIT_MAX_MS 60000
#define SD_ALLOC_SELECTOR_MAX 16  /* entries of selector.machine_labels / metadata */

/* GET /v1/clusters/{c}/events */
#define SD_HISTORY_LIMIT_MAX 1000 /* events in one page of the history */
#define SD_DISCONNECT_MAX_MS 86400000 /* a service spec's disconnect delays: a day at most */

/* PUT /v1/clusters/{c}/machines/{m} */
#define SD_LABELS_MAX 32        /* entries of machine `labels` */

/* Request bodies: serverdir's defaults of body_max_bytes and blob_max_bytes. */
#define SD_BODY_MAX_DEFAULT 1048576 /* 1 MiB, a JSON body */
#define SD_BLOB_MAX_DEFAULT 262144  /* 256 KiB, a blob */

/* The lock table (docs/locks.md). A grant's lock_token: SD_LOCK_TOKEN_BYTES random bytes
 * as lowercase hex, the secret its holder presents to save, renew and release. A save's
 * Blob-Seq may exceed the stored one by at most SD_BLOB_SEQ_STEP_MAX (2^32). */
#define SD_LOCK_TOKEN_BYTES 16
#define SD_LOCK_TOKEN_LEN 32
#define SD_BLOB_SEQ_STEP_MAX 4294967296

/* A limit as a string literal, for messages: "at most " SD_STR(SD_EVENTS_MAX) " events". */
#define SD_STR(x) SD__STR(x)
#define SD__STR(x) #x

/* X(enum constant, wire name) */
#define SD_EVENT_TYPES(X)                                                                      \
    X(SD_EV_STARTED, "started")                                                                \
    X(SD_EV_READY, "ready")                                                                    \
    X(SD_EV_STOPPED, "stopped")                                                                \
    X(SD_EV_STATUS, "status")                                                                  \
    X(SD_EV_CONFIRMED, "confirmed")                                                            \
    X(SD_EV_RELEASED, "released")

/* What is true of a stop reason, the third column of SD_STOP_REASONS. */
enum {
    SD_STOP_F_FAILURE = 1, /* the process failed or was lost: serverdir's `failure` field
                            * on stopped records and events, which sdctl status and the
                            * dashboard show (docs/design.md, "Figures") */
    SD_STOP_F_CRASH = 2,   /* the process's own end: its stopped event carries the crash
                            * report (log tail, core); for exited only with a code not 0 */
    SD_STOP_F_SILENT = 4,  /* a missed deadline: the event and the text carry silent_ms */
    SD_STOP_F_COUNTED = 8, /* a label of bigbrother's exit and restart counters (it
                            * counts an exit of another reason as exited) */
};

/* Why a process stopped (the `reason` of a stopped event): X(enum constant, wire name,
 * SD_STOP_F_* flags). Every list of reasons (metric labels, sdctl's failures, what a
 * stopped event carries) is read from this table. */
#define SD_STOP_REASONS(X)                                                                     \
    X(SD_STOP_EXITED, "exited", SD_STOP_F_FAILURE | SD_STOP_F_CRASH | SD_STOP_F_COUNTED)      \
    X(SD_STOP_KILLED, "killed", SD_STOP_F_FAILURE | SD_STOP_F_CRASH | SD_STOP_F_COUNTED)      \
    X(SD_STOP_HUNG, "hung",                                                                    \
      SD_STOP_F_FAILURE | SD_STOP_F_CRASH | SD_STOP_F_SILENT | SD_STOP_F_COUNTED)              \
    X(SD_STOP_START_TIMEOUT, "start_timeout",                                                  \
      SD_STOP_F_FAILURE | SD_STOP_F_CRASH | SD_STOP_F_SILENT | SD_STOP_F_COUNTED)              \
    X(SD_STOP_CRASH_LOOP, "crash_loop", SD_STOP_F_FAILURE | SD_STOP_F_COUNTED)                 \
    X(SD_STOP_BY_OPERATOR, "stopped_by_operator", SD_STOP_F_COUNTED)                           \
    X(SD_STOP_MACHINE_LOST, "machine_lost", SD_STOP_F_FAILURE)                                 \
    X(SD_STOP_DRAINED, "drained", 0)                                                           \
    X(SD_STOP_REPLACED, "replaced", 0)                                                         \
    X(SD_STOP_ORPHANED, "orphaned", 0)                                                         \
    X(SD_STOP_DISCONNECTED, "disconnected", SD_STOP_F_FAILURE)

#define SD__PROTO_ENUM(id, name) id,
#define SD__PROTO_ENUM3(id, name, flags) id,
typedef enum { SD_EVENT_TYPES(SD__PROTO_ENUM) SD_EV_COUNT } sd_event_type_t;
typedef enum { SD_STOP_REASONS(SD__PROTO_ENUM3) SD_STOP_COUNT } sd_stop_reason_t;
#undef SD__PROTO_ENUM
#undef SD__PROTO_ENUM3

/* The wire name of an event type / stop reason (a static string), or NULL when out of
 * range. */
const char *sd_event_type_name(sd_event_type_t t);
const char *sd_stop_reason_name(sd_stop_reason_t r);

/* The event type / stop reason named s, or -1 when s is NULL or no such name. */
int sd_event_type_parse(const char *s);
int sd_stop_reason_parse(const char *s);
/* The SD_STOP_F_* flags of a stop reason; 0 when out of range. */
unsigned sd_stop_reason_flags(sd_stop_reason_t r);

/* A lock or blob key name: a name (sd_name_valid), or one with one Redis Cluster hash
 * tag, "{player42}:bank" (the tag itself a name): keys with one tag share a slot. */
int sd_lock_name_valid(const char *s);

/* 1 when s is a lock_token: exactly SD_LOCK_TOKEN_LEN lowercase hex characters. */
int sd_lock_token_valid(const char *s);

/* Checks one process event against the events contract, all of it that depends on the
 * event alone: the known fields only; id, type, instance, machine and service present;
 * names, integer ranges, ports; pid required in a started event; reason required in a
 * stopped event and reason, code, signal, silent_ms, detail allowed only there; players,
 * max_players and status only in a status event (the game's load figures and status
 * line); allocation required in a confirmed event, optional in a released one (absent:
 * every open allocation of the instance), allowed only there. Null
 * counts as absent. Returns 0, or -1 with the message in v, whose path names the event
 * ("events[3].reason must be one of ..."). The one place the contract is checked:
 * bigbrother before an event enters its outbox, serverdir before a batch is applied. */
int sd_event_check(sd_jv_t *v, const json_t *ev);

/* A value a stop record does not carry (no exit code, no signal, no silence). */
#define SD_REASON_NONE INT64_MIN

/* Room for any text sd_reason_format() writes for a known reason, NUL included. */
#define SD_REASON_TEXT_MAX 64

/* Writes the text form of a stop into buf (always NUL-terminated when cap > 0) and
 * returns the length it needed, like snprintf. One wording everywhere:
 *   exited(code 3)  killed(signal 9)  hung(silent 3012ms)  start_timeout(silent 10000ms)
 * and the bare reason for the others (stopped_by_operator, crash_loop, machine_lost,
 * drained, replaced), or when the value the reason goes with is SD_REASON_NONE.
 * NULL or "" reason: "-". An unknown reason is written as given. */
size_t sd_reason_format(char *buf, size_t cap, const char *reason, int64_t code,
                        int64_t signal, int64_t silent_ms);

/* sd_reason_format() over a record's "reason", "code", "signal" and "silent_ms" fields
 * (a process record, a history event, a bigbrother status row); a missing or non-integer
 * value counts as SD_REASON_NONE. */
size_t sd_reason_format_json(char *buf, size_t cap, const json_t *rec);

#endif
