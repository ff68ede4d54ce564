/* bigbrother's allocation handling (alloc.c) in one process: the real supervision loop,
 * agent socket (agentsrv.c), converge entry point and outbox, with libbbagent in this
 * same process playing the game (the instance's pid is this test's, so the HELLO check
 * passes). An assignment document with an allocation makes the game see ALLOCATED once
 * with its payload; the shim's acknowledgement becomes a `confirmed` event, once, also
 * across a reconnect; an allocation that leaves the document reaches the game as
 * DEALLOCATED; RELEASE=1 becomes a `released` event and, with on_release "restart", a
 * graceful restart (SHUTDOWN); status changes become `status` events, at most one per
 * second with the latest values; allocations beyond 16 per instance are ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bb_daemon.h"
#include "bbagent.h"
#include "harness.h"
#include "harness_bigbrother.h"


/* The details of the allocation event bbagent_poll last returned (bbagent_allocation). */
static bbagent_allocation_t al_get(const bbagent_t *a)
{
    bbagent_allocation_t al;
    bbagent_allocation(a, &al);
    return al;
}
#define AL(h) al_get(h)

static bbt_t box;
static bb_service_t svc;
static bb_timer_t quit_timer;
static char inst_id[] = "g-m1-abc123-1";

static void on_quit(bb_timer_t *t)
{
    (void)t;
    bb_loop_quit(SIGTERM);
}

/* Runs the supervision loop for ms. */
static void spin(int ms)
{
    bb_loop_quit(0);
    bb_timer_set(&quit_timer, sd_mono_ms() + ms);
    bb_loop_run();
}

/* Runs the loop and polls the shim until it returns an event other than NONE (or ms). */
static bbagent_event_t next_event(bbagent_t *a, int ms)
{
    bbagent_event_t ev = {0};
    for (int waited = 0; waited < ms; waited += 10) {
        spin(10);
        assert_int_equal(bbagent_poll(a, &ev), 0);
        if (ev.type != BBAGENT_EVENT_NONE)
            break;
        bbagent_heartbeat(a);
    }
    return ev;
}

/* The events of type `type` in the outbox so far (new reference). */
static json_t *events_of_type(const char *type)
{
    json_t *all = bbt_events(&box), *out = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(all, i, e)
        if (!strcmp(bbt_str(e, "type"), type))
            json_array_append(out, e);
    json_decref(all);
    return out;
}

static void apply(const char *allocs)
{
    char text[8192];
    snprintf(text, sizeof(text), "{\"version\": 1, \"slots\": [], \"allocations\": %s}", allocs);
    json_t *doc = json_loads(text, 0, NULL);
    assert_non_null(doc);
    bb_converge_apply(doc, 0);
    json_decref(doc);
}

static int setup(void **state)
{
    (void)state;
    bbt_dirs(&box);
    mkdir(box.state, 0755);
    bb.cfg.machine = "m1";
    bb.cfg.cluster = "c1";
    bb.cfg.state_dir = box.state;
    bb.cfg.urls = (char *)"http://127.0.0.1:1"; /* status events are for a ServerDir */
    sd_strlcpy(bb.cfg.agent_socket, box.agent, sizeof(bb.cfg.agent_socket));
    assert_int_equal(bb_loop_init(), 0);
    assert_int_equal(bb_agentsrv_init(), 0);
    assert_int_equal(bb_alloc_init(), 0);
    bb_report_opts_t o = {.state_dir = box.state, .cluster = "c1", .machine = "m1",
                          .version = "test"};
    assert_int_equal(bb_report_start(&o, &bb.report), 0);
    svc.name = "g";
    svc.health.type = BB_H_NONE;
    svc.health.liveness_timeout_ms = 1000;
    svc.stop.grace_ms = 60000;
    svc.stop.signal = SIGTERM;
    svc.restart_on_release = 1;
    bb.inst = calloc(1, sizeof(bb_inst_t));
    bb.ninst = bb.inst_cap = 1;
    bb_inst_t *in = &bb.inst[0];
    bb_inst_init_entry(in);
    in->svc = &svc;
    in->pid = getpid();
    in->state = ST_READY;
    sd_strlcpy(in->id, inst_id, sizeof(in->id));
    quit_timer.fn = on_quit;
    return 0;
}

static void allocation_round_trip(void **state)
{
    (void)state;
    bb_inst_t *in = &bb.inst[0];
    bbagent_opts_t o = {.socket_path = box.agent, .instance = inst_id};
    bbagent_t *a = bbagent_open(&o);
    assert_non_null(a);
    spin(50);
    assert_non_null(in->conn);

    /* An allocation for another machine's instance is not ours; ours arrives once. */
    apply("[{\"allocation\": \"a000000000001\", \"instance\": \"g-m1-abc123-1\","
          " \"mode\": \"ready\", \"players\": 8, \"payload\": {\"match\": \"m1\"}},"
          " {\"allocation\": \"a000000000002\", \"instance\": \"g-m2-other-1\","
          " \"mode\": \"ready\", \"players\": 0, \"payload\": null}]");
    bbagent_event_t ev = next_event(a, 1000);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED);
    assert_string_equal(AL(a).allocation, "a000000000001");
    assert_string_equal(AL(a).payload, "{\"match\":\"m1\"}");
    assert_int_equal(AL(a).players, 8);
    assert_int_equal(AL(a).join, 0);
    ev = next_event(a, 200);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    json_t *conf = events_of_type("confirmed");
    assert_int_equal(json_array_size(conf), 1);
    assert_string_equal(bbt_str(json_array_get(conf, 0), "allocation"), "a000000000001");
    assert_string_equal(bbt_str(json_array_get(conf, 0), "instance"), inst_id);
    json_decref(conf);

    /* The same document again, and a reconnect: acknowledged already, nothing new. */
    apply("[{\"allocation\": \"a000000000001\", \"instance\": \"g-m1-abc123-1\","
          " \"mode\": \"ready\", \"players\": 8, \"payload\": {\"match\": \"m1\"}}]");
    bbagent_close(a, "reconnect");
    a = bbagent_open(&o);
    ev = next_event(a, 200);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    conf = events_of_type("confirmed");
    assert_int_equal(json_array_size(conf), 1);
    json_decref(conf);

    /* Status: the first change goes out at once, the next ones within a second, the
     * latest values. */
    bbagent_status(a, 3, 16, "map=q3dm17 mode=ctf");
    spin(50);
    bbagent_status(a, 4, 16, "map=q3dm17 mode=ctf");
    spin(20);
    bbagent_status(a, 5, 16, "map=q3dm17 mode=ctf");
    spin(50);
    json_t *st = events_of_type("status");
    assert_int_equal(json_array_size(st), 1);
    assert_int_equal(bbt_int(json_array_get(st, 0), "players"), 3);
    assert_string_equal(bbt_str(json_array_get(st, 0), "status"), "map=q3dm17 mode=ctf");
    json_decref(st);
    spin(1100);
    st = events_of_type("status");
    assert_int_equal(json_array_size(st), 2);
    assert_int_equal(bbt_int(json_array_get(st, 1), "players"), 5);
    assert_int_equal(bbt_int(json_array_get(st, 1), "max_players"), 16);
    json_decref(st);

    /* Ended from outside: DEALLOCATED, then a graceful restart (on_release restart). */
    apply("[]");
    ev = next_event(a, 1000);
    assert_int_equal(ev.type, BBAGENT_EVENT_DEALLOCATED);
    assert_string_equal(AL(a).allocation, "a000000000001");
    ev = next_event(a, 1000);
    assert_int_equal(ev.type, BBAGENT_EVENT_SHUTDOWN);
    assert_int_equal(in->state, ST_STOPPING);
    bb_timer_cancel(&in->deadline); /* this test's own pid: never signalled */
    in->state = ST_READY;

    /* A second allocation; the game releases it: `released`, and a restart again. */
    apply("[{\"allocation\": \"a000000000003\", \"instance\": \"g-m1-abc123-1\","
          " \"mode\": \"join\", \"players\": 2, \"payload\": [1, \"x\"]}]");
    ev = next_event(a, 1000);
    assert_int_equal(ev.type, BBAGENT_EVENT_ALLOCATED);
    assert_int_equal(AL(a).join, 1);
    assert_string_equal(AL(a).payload, "[1,\"x\"]");
    bbagent_release(a);
    ev = next_event(a, 1000);
    assert_int_equal(ev.type, BBAGENT_EVENT_SHUTDOWN);
    bb_timer_cancel(&in->deadline);
    in->state = ST_READY;
    json_t *rel = events_of_type("released");
    assert_int_equal(json_array_size(rel), 1);
    assert_null(json_object_get(json_array_get(rel, 0), "allocation"));
    json_decref(rel);
    /* Released by the game: its leaving the document is no DEALLOCATED, no restart. */
    apply("[]");
    ev = next_event(a, 200);
    assert_int_equal(ev.type, BBAGENT_EVENT_NONE);
    assert_int_equal(in->state, ST_READY);

    /* At most 16 allocations tracked per instance. */
    char many[6000] = "[";
    for (int i = 0; i < 20; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many),
                 "%s{\"allocation\": \"b%d\", \"instance\": \"g-m1-abc123-1\"}", i ? "," : "", i);
    strcat(many, "]");
    apply(many);
    assert_int_equal(in->nallocs, BB_ALLOCS_MAX);
    int got = 0;
    while ((ev = next_event(a, 200)).type == BBAGENT_EVENT_ALLOCATED)
        got++;
    assert_int_equal(got, BB_ALLOCS_MAX);
    spin(50);
    conf = events_of_type("confirmed");
    assert_int_equal(json_array_size(conf), 1 + 1 + BB_ALLOCS_MAX);
    json_decref(conf);

    /* A gone process forgets its allocations. */
    bb_alloc_reset(in);
    assert_int_equal(in->nallocs, 0);
    bbagent_close(a, NULL);
    spin(20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(allocation_round_trip, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
