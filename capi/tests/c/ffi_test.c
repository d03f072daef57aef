/*
 * A C test of every function of sfu_redis.h, including its error paths and NULL arguments,
 * driven by tests/ffi_c.rs (under valgrind memcheck in CI).
 *
 *   ffi_test                 memory-only mode only
 *   ffi_test redis://...     also against that Redis (a private test server)
 *
 * Prints each failed check on stderr and "N passed, M failed" on stdout; exits 1 on any
 * failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sfu_redis.h"

static int checks = 0;
static int failures = 0;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        checks++;                                                                            \
        if (!(cond)) {                                                                       \
            failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last: %s \"%s\")\n", __FILE__, __LINE__, \
                    #cond, sfu_status_name(sfu_last_error_status()), sfu_last_error_message()); \
        }                                                                                    \
    } while (0)

/* `call` returns `status`, and the thread's last error says the same. */
#define EXPECT(call, status)                                                                 \
    do {                                                                                     \
        SfuStatus got_ = (call);                                                             \
        checks++;                                                                            \
        if (got_ != (status)) {                                                              \
            failures++;                                                                      \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (\"%s\")\n", __FILE__, __LINE__, \
                    #call, sfu_status_name(got_), sfu_status_name(status),                   \
                    sfu_last_error_message());                                               \
        } else {                                                                             \
            CHECK(sfu_last_error_status() == (status));                                      \
            CHECK(((status) == SFU_OK) == (sfu_last_error_message()[0] == '\0'));            \
        }                                                                                    \
    } while (0)

#define MESSAGE_HAS(text) CHECK(strstr(sfu_last_error_message(), (text)) != NULL)

/* Sentinels: an out-parameter must keep them after a failed call. */
#define BAD_PTR ((void *)0x1)
#define BAD_GEN ((uint64_t)0xdeadbeef)

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ misc */

static void test_misc(void) {
    CHECK(strcmp(sfu_version(), "") != 0);
    CHECK(strcmp(sfu_status_name(SFU_OK), "SFU_OK") == 0);
    CHECK(strcmp(sfu_status_name(SFU_ERR_NULL), "SFU_ERR_NULL") == 0);
    CHECK(strcmp(sfu_status_name(SFU_ERR_PANIC), "SFU_ERR_PANIC") == 0);
    CHECK(strcmp(sfu_status_name(9999), "SFU_ERR_UNKNOWN") == 0);
    /* Stable numbers (never renumbered). */
    CHECK(SFU_OK == 0 && SFU_ERR_NULL == 1 && SFU_ERR_UTF8 == 2 && SFU_ERR_INVALID_ID == 3);
    CHECK(SFU_ERR_INVALID_CONFIG == 4 && SFU_ERR_INVALID_ARGUMENT == 5 && SFU_ERR_REDIS == 6);
    CHECK(SFU_ERR_BAD_DATA == 7 && SFU_ERR_NOT_OWNER == 8 && SFU_ERR_NOT_LEADER == 9);
    CHECK(SFU_ERR_STOPPED == 10 && SFU_ERR_IO == 11 && SFU_ERR_TIMEOUT == 12);
    CHECK(SFU_ERR_CLOSED == 13 && SFU_ERR_CALLBACK_REGISTERED == 14);
    CHECK(SFU_ERR_IN_CALLBACK == 15 && SFU_ERR_PANIC == 16 && SFU_ERR_SCHEMA == 17);
    CHECK(strcmp(sfu_status_name(SFU_ERR_SCHEMA), "SFU_ERR_SCHEMA") == 0);
    /* NULL frees and clears are no-ops. */
    sfu_string_free(NULL);
    sfu_event_clear(NULL);
    sfu_stats_clear(NULL);
    sfu_config_free(NULL);
    EXPECT(sfu_node_free(NULL), SFU_OK);
    /* A zeroed event and stats clear fine, twice. */
    SfuEvent ev;
    memset(&ev, 0, sizeof ev);
    sfu_event_clear(&ev);
    sfu_event_clear(&ev);
    CHECK(ev.kind == SFU_EVENT_NONE);
    SfuStats st;
    memset(&st, 0, sizeof st);
    sfu_stats_clear(&st);
    CHECK(st.instance_id == NULL);
}

/* ---------------------------------------------------------------- config */

static const char *TIMING_KEYS[] = {
    "heartbeat_interval_ms", "heartbeat_ttl_ms", "stale_threshold_ms",
    "pin_ttl_ms", "lease_ttl_ms", "lease_refresh_ms",
    "two_phase_delay_ms", "reap_interval_ms", "command_timeout_ms",
};
/* A valid set, slow enough for valgrind: 500 ms heartbeats, 3 s TTL. */
static const uint64_t SLOW_TIMINGS[] = {500, 3000, 4500, 9000, 9000, 3000, 6000, 1500, 2000};

static void set_slow_timings(SfuConfig *cfg) {
    for (size_t i = 0; i < sizeof TIMING_KEYS / sizeof *TIMING_KEYS; i++) {
        EXPECT(sfu_config_set_ms(cfg, TIMING_KEYS[i], SLOW_TIMINGS[i]), SFU_OK);
    }
}

static void test_config(void) {
    SfuConfig *cfg = BAD_PTR;
    EXPECT(sfu_config_new(NULL), SFU_ERR_NULL);
    MESSAGE_HAS("out_config");
    EXPECT(sfu_config_from_env(NULL), SFU_ERR_NULL);

    EXPECT(sfu_config_new(&cfg), SFU_OK);
    CHECK(cfg != NULL && cfg != BAD_PTR);
    EXPECT(sfu_config_validate(cfg), SFU_OK);
    EXPECT(sfu_config_validate(NULL), SFU_ERR_NULL);

    /* NULL arguments. */
    EXPECT(sfu_config_set(NULL, "stage", "x"), SFU_ERR_NULL);
    EXPECT(sfu_config_set(cfg, NULL, "x"), SFU_ERR_NULL);
    MESSAGE_HAS("key");
    EXPECT(sfu_config_set(cfg, "stage", NULL), SFU_ERR_NULL);
    MESSAGE_HAS("value");
    EXPECT(sfu_config_set_ms(NULL, "pin_ttl_ms", 1), SFU_ERR_NULL);
    EXPECT(sfu_config_set_ms(cfg, NULL, 1), SFU_ERR_NULL);

    /* Bad keys and values. */
    EXPECT(sfu_config_set(cfg, "no_such_key", "1"), SFU_ERR_INVALID_ARGUMENT);
    MESSAGE_HAS("no_such_key");
    EXPECT(sfu_config_set_ms(cfg, "stage", 5), SFU_ERR_INVALID_ARGUMENT);
    EXPECT(sfu_config_set(cfg, "heartbeat_ttl_ms", "soon"), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("heartbeat_ttl");
    EXPECT(sfu_config_set(cfg, "timings", "turbo"), SFU_ERR_INVALID_CONFIG);
    EXPECT(sfu_config_set(cfg, "stage", "bad\xff utf8"), SFU_ERR_UTF8);
    EXPECT(sfu_config_validate(cfg), SFU_OK); /* all refused: unchanged */

    /* Every string key. */
    EXPECT(sfu_config_set(cfg, "redis_url", ""), SFU_OK);
    EXPECT(sfu_config_set(cfg, "namespace", "ctest"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "stage", "ffi"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "branch", "feature/c"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "instance_id", "c-config"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "timings", "fast"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "timings", "default"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "timings", "from_heartbeat:1000,3000"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "timings", "from_heartbeat:3000,1000"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG); /* interval >= ttl */
    MESSAGE_HAS("heartbeat_interval");
    EXPECT(sfu_config_set(cfg, "timings", "from_heartbeat:1000"), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("from_heartbeat");
    EXPECT(sfu_config_set(cfg, "timings", "default"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "reap_batch", "many"), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("reap_batch");
    EXPECT(sfu_config_set(cfg, "reap_batch", "0"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("reap_batch");
    EXPECT(sfu_config_set(cfg, "reap_batch", "250"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "reap_pace", "gentle"), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("reap_pace");
    EXPECT(sfu_config_set(cfg, "reap_pace", "101"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("reap_pace");
    EXPECT(sfu_config_set(cfg, "reap_pace", "nan"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("reap_pace");
    EXPECT(sfu_config_set(cfg, "reap_pace", "-1"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    EXPECT(sfu_config_set(cfg, "reap_pace", "0.5"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_OK);

    /* Every timing key, through both setters. */
    set_slow_timings(cfg);
    EXPECT(sfu_config_validate(cfg), SFU_OK);
    char buf[32];
    for (size_t i = 0; i < sizeof TIMING_KEYS / sizeof *TIMING_KEYS; i++) {
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)SLOW_TIMINGS[i]);
        EXPECT(sfu_config_set(cfg, TIMING_KEYS[i], buf), SFU_OK);
    }
    EXPECT(sfu_config_validate(cfg), SFU_OK);

    /* Broken rules are refused at validation, naming the field. */
    EXPECT(sfu_config_set_ms(cfg, "heartbeat_interval_ms", 0), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("heartbeat_interval");
    EXPECT(sfu_config_set_ms(cfg, "heartbeat_interval_ms", 5000), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG); /* >= heartbeat_ttl */
    MESSAGE_HAS("heartbeat_interval");
    EXPECT(sfu_config_set_ms(cfg, "heartbeat_interval_ms", 500), SFU_OK);
    EXPECT(sfu_config_set(cfg, "lease_refresh_ms", "5000"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("lease_refresh");
    EXPECT(sfu_config_set(cfg, "lease_refresh_ms", "3000"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_OK);

    EXPECT(sfu_config_set(cfg, "redis_url", "http://nope"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("redis_url");
    /* The password never shows. */
    EXPECT(sfu_config_set(cfg, "redis_url", "redis+sentinel://user:hunter2@localhost:1"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG); /* no master name */
    MESSAGE_HAS("master name");
    CHECK(strstr(sfu_last_error_message(), "hunter2") == NULL);
    /* TLS files apply to TLS URLs only; a missing file is named. */
    EXPECT(sfu_config_set(cfg, "redis_url", "redis://localhost:1"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "tls_ca_file", "/nonexistent/ca.pem"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("tls_ca_file");
    EXPECT(sfu_config_set(cfg, "redis_url", "rediss://localhost:1"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("/nonexistent/ca.pem");
    EXPECT(sfu_config_set(cfg, "tls_insecure", "maybe"), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("tls_insecure");
    EXPECT(sfu_config_set(cfg, "sentinel_password", "s3cret-sentinel"), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    CHECK(strstr(sfu_last_error_message(), "s3cret-sentinel") == NULL);
    /* An empty value unsets a TLS file or a sentinel credential. */
    EXPECT(sfu_config_set(cfg, "tls_ca_file", ""), SFU_OK);
    EXPECT(sfu_config_set(cfg, "sentinel_password", ""), SFU_OK);
    EXPECT(sfu_config_set(cfg, "redis_url", ""), SFU_OK);
    EXPECT(sfu_config_set(cfg, "instance_id", ""), SFU_OK);
    EXPECT(sfu_config_validate(cfg), SFU_ERR_INVALID_CONFIG);
    MESSAGE_HAS("instance_id");

    /* A refused start leaves the out-parameter alone. */
    SfuNode *node = BAD_PTR;
    EXPECT(sfu_node_start(cfg, &node), SFU_ERR_INVALID_CONFIG);
    CHECK(node == BAD_PTR);
    sfu_config_free(cfg);

    SfuConfig *env = NULL;
    EXPECT(sfu_config_from_env(&env), SFU_OK);
    CHECK(env != NULL);
    sfu_config_free(env);
}

/* ---------------------------------------------------------- callbacks */

typedef struct {
    pthread_mutex_t lock;
    int events;
    int ready;
    int stopped;
    int finalized;
    int in_callback_refusals; /* calls refused with SFU_ERR_IN_CALLBACK */
    int stats_ok;
    int probe;                /* probe the refused calls on the next event */
    pthread_t thread;
    int thread_set;
    int other_thread; /* a callback ran on a thread other than the registering one */
    SfuNode *node;
} Seen;

static void seen_init(Seen *s, SfuNode *node) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    s->node = node;
    s->thread = pthread_self();
}

static int seen_get(Seen *s, const int *field) {
    pthread_mutex_lock(&s->lock);
    int v = *field;
    pthread_mutex_unlock(&s->lock);
    return v;
}

static int wait_for(Seen *s, const int *field, int at_least) {
    for (int i = 0; i < 1000; i++) {
        if (seen_get(s, field) >= at_least) {
            return 1;
        }
        sleep_ms(10);
    }
    return 0;
}

static void on_event(void *user_data, const SfuEvent *ev) {
    Seen *s = user_data;
    int probe;
    pthread_mutex_lock(&s->lock);
    s->events++;
    if (ev->kind == SFU_EVENT_READY) s->ready++;
    if (ev->kind == SFU_EVENT_STOPPED) s->stopped++;
    if (!pthread_equal(pthread_self(), s->thread)) s->other_thread = 1;
    probe = s->probe;
    s->probe = 0;
    pthread_mutex_unlock(&s->lock);
    if (!ev->json || !strstr(ev->json, "\"event\"")) {
        return; /* counted as missing refusals below */
    }
    if (probe) {
        int refused = 0;
        SfuEvent e2;
        memset(&e2, 0, sizeof e2);
        refused += sfu_node_free(s->node) == SFU_ERR_IN_CALLBACK;
        refused += sfu_node_stop(s->node) == SFU_ERR_IN_CALLBACK;
        refused += sfu_node_leave(s->node) == SFU_ERR_IN_CALLBACK;
        refused += sfu_node_set_event_callback(s->node, NULL, NULL, NULL) == SFU_ERR_IN_CALLBACK;
        refused += sfu_node_next_event(s->node, 0, &e2) == SFU_ERR_IN_CALLBACK;
        SfuStats st;
        memset(&st, 0, sizeof st);
        int stats_ok = sfu_node_stats(s->node, &st) == SFU_OK && st.instance_id != NULL;
        sfu_stats_clear(&st);
        pthread_mutex_lock(&s->lock);
        s->in_callback_refusals += refused;
        s->stats_ok += stats_ok;
        pthread_mutex_unlock(&s->lock);
    }
}

static void on_finalize(void *user_data) {
    Seen *s = user_data;
    pthread_mutex_lock(&s->lock);
    s->finalized++;
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ node */

static SfuNode *start_memory(const char *instance) {
    SfuConfig *cfg = NULL;
    SfuNode *node = NULL;
    EXPECT(sfu_config_new(&cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "instance_id", instance), SFU_OK);
    EXPECT(sfu_node_start(cfg, &node), SFU_OK);
    sfu_config_free(cfg); /* the node keeps its own copy */
    return node;
}

/* Pins, peers, owners, stats and events, the same in both modes. `other` is a second node of
 * the same prefix with Redis (NULL in memory-only mode). */
static void exercise_node(SfuNode *node, SfuNode *other, const char *me, int redis) {
    char *s = BAD_PTR;
    SfuPinOutcome outcome = (SfuPinOutcome)99;
    uint64_t gen = BAD_GEN;
    bool flag = true;

    /* instance id */
    EXPECT(sfu_node_instance_id(NULL, &s), SFU_ERR_NULL);
    EXPECT(sfu_node_instance_id(node, NULL), SFU_ERR_NULL);
    CHECK(s == BAD_PTR);
    EXPECT(sfu_node_instance_id(node, &s), SFU_OK);
    CHECK(s && strcmp(s, me) == 0);
    sfu_string_free(s);

    /* pin */
    s = BAD_PTR;
    EXPECT(sfu_node_pin_room(NULL, "c-r1", &outcome, &s), SFU_ERR_NULL);
    EXPECT(sfu_node_pin_room(node, NULL, &outcome, &s), SFU_ERR_NULL);
    MESSAGE_HAS("room");
    EXPECT(sfu_node_pin_room(node, "c-r1", NULL, &s), SFU_ERR_NULL);
    EXPECT(sfu_node_pin_room(node, "", &outcome, &s), SFU_ERR_INVALID_ID);
    EXPECT(sfu_node_pin_room(node, "bad\x01id", &outcome, &s), SFU_ERR_INVALID_ID);
    EXPECT(sfu_node_pin_room(node, "bad\xffutf8", &outcome, &s), SFU_ERR_UTF8);
    CHECK(outcome == (SfuPinOutcome)99 && s == BAD_PTR);
    EXPECT(sfu_node_pin_room(node, "c-r1", &outcome, &s), SFU_OK);
    CHECK(outcome == SFU_PIN_PINNED && s == NULL);
    EXPECT(sfu_node_pin_room(node, "c-r1", &outcome, NULL), SFU_OK);
    CHECK(outcome == SFU_PIN_ALREADY_OURS);
    EXPECT(sfu_node_pin_room(node, "c-r2", &outcome, NULL), SFU_OK);
    CHECK(outcome == SFU_PIN_PINNED);
    EXPECT(sfu_node_pin_room(node, "방 1", &outcome, NULL), SFU_OK); /* ids are data */
    CHECK(outcome == SFU_PIN_PINNED);

    /* room owner */
    s = BAD_PTR;
    EXPECT(sfu_node_room_owner(NULL, "c-r1", &s), SFU_ERR_NULL);
    EXPECT(sfu_node_room_owner(node, NULL, &s), SFU_ERR_NULL);
    EXPECT(sfu_node_room_owner(node, "c-r1", NULL), SFU_ERR_NULL);
    EXPECT(sfu_node_room_owner(node, "", &s), SFU_ERR_INVALID_ID);
    CHECK(s == BAD_PTR);
    EXPECT(sfu_node_room_owner(node, "c-r1", &s), SFU_OK);
    CHECK(s && strcmp(s, me) == 0);
    sfu_string_free(s);
    s = BAD_PTR;
    EXPECT(sfu_node_room_owner(node, "c-unpinned", &s), SFU_OK);
    CHECK(s == NULL);

    /* upsert */
    SfuField fields[2] = {{"name", "Ada"}, {"role", "speaker"}};
    char *replaced = BAD_PTR;
    EXPECT(sfu_node_upsert_peer(NULL, "c-r1", "p1", "g1", fields, 2, &gen, &replaced), SFU_ERR_NULL);
    EXPECT(sfu_node_upsert_peer(node, NULL, "p1", "g1", fields, 2, &gen, &replaced), SFU_ERR_NULL);
    EXPECT(sfu_node_upsert_peer(node, "c-r1", NULL, "g1", fields, 2, &gen, &replaced), SFU_ERR_NULL);
    MESSAGE_HAS("peer");
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", NULL, 2, &gen, &replaced), SFU_ERR_NULL);
    MESSAGE_HAS("fields");
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", fields, 2, NULL, &replaced), SFU_ERR_NULL);
    SfuField null_name[1] = {{NULL, "x"}};
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", null_name, 1, &gen, &replaced), SFU_ERR_NULL);
    MESSAGE_HAS("fields[0].name");
    SfuField null_value[1] = {{"x", NULL}};
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", null_value, 1, &gen, &replaced), SFU_ERR_NULL);
    SfuField reserved[1] = {{"generation", "7"}};
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", reserved, 1, &gen, &replaced),
           SFU_ERR_INVALID_ARGUMENT);
    MESSAGE_HAS("reserved");
    SfuField many[65];
    char names[65][8];
    for (int i = 0; i < 65; i++) {
        snprintf(names[i], sizeof names[i], "f%d", i);
        many[i].name = names[i];
        many[i].value = "v";
    }
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", many, 65, &gen, &replaced),
           SFU_ERR_INVALID_ARGUMENT);
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "", "g1", fields, 2, &gen, &replaced), SFU_ERR_INVALID_ID);
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "", fields, 2, &gen, &replaced), SFU_ERR_INVALID_ID);
    EXPECT(sfu_node_upsert_peer(node, "c-not-mine", "p1", "g1", fields, 2, &gen, &replaced),
           SFU_ERR_NOT_OWNER);
    CHECK(gen == BAD_GEN && replaced == BAD_PTR);

    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1", "g1", fields, 2, &gen, &replaced), SFU_OK);
    CHECK(gen != BAD_GEN && gen > 0 && replaced == NULL);
    uint64_t gen1 = gen;
    /* No fields, no guest, no out_replaced. */
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p2", NULL, NULL, 0, &gen, NULL), SFU_OK);
    CHECK(gen != gen1);
    uint64_t gen2 = gen;
    /* 64 fields are allowed. */
    EXPECT(sfu_node_upsert_peer(node, "c-r2", "p-many", NULL, many, 64, &gen, NULL), SFU_OK);
    /* Guest g1 reconnects with a new peer id: p1 is replaced. */
    replaced = BAD_PTR;
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p1b", "g1", fields, 1, &gen, &replaced), SFU_OK);
    CHECK(replaced && strcmp(replaced, "p1") == 0);
    sfu_string_free(replaced);
    uint64_t gen1b = gen;

    /* remove */
    EXPECT(sfu_node_remove_peer(NULL, "c-r1", "p1b", gen1b, &flag), SFU_ERR_NULL);
    EXPECT(sfu_node_remove_peer(node, NULL, "p1b", gen1b, &flag), SFU_ERR_NULL);
    EXPECT(sfu_node_remove_peer(node, "c-r1", NULL, gen1b, &flag), SFU_ERR_NULL);
    EXPECT(sfu_node_remove_peer(node, "c-r1", "", gen1b, &flag), SFU_ERR_INVALID_ID);
    CHECK(flag == true);
    EXPECT(sfu_node_remove_peer(node, "c-r1", "p1b", gen1b + 1000, &flag), SFU_OK);
    CHECK(flag == false); /* a stale generation is a no-op */
    EXPECT(sfu_node_remove_peer(node, "c-r1", "p1", gen1, &flag), SFU_OK);
    CHECK(flag == false); /* replaced already */
    flag = false;
    EXPECT(sfu_node_remove_peer(node, "c-r1", "p1b", gen1b, &flag), SFU_OK);
    CHECK(flag == true);
    EXPECT(sfu_node_remove_peer(node, "c-r1", "p1b", gen1b, NULL), SFU_OK); /* out may be NULL */

    /* another instance's room and peers */
    (void)gen2;
    if (other) {
        s = BAD_PTR;
        EXPECT(sfu_node_pin_room(other, "c-r1", &outcome, &s), SFU_OK);
        CHECK(outcome == SFU_PIN_HELD && s && strcmp(s, me) == 0);
        sfu_string_free(s);
        EXPECT(sfu_node_pin_room(other, "c-r1", &outcome, NULL), SFU_OK);
        CHECK(outcome == SFU_PIN_HELD);
        EXPECT(sfu_node_upsert_peer(other, "c-r1", "intruder", NULL, NULL, 0, &gen, NULL),
               SFU_ERR_NOT_OWNER);
        EXPECT(sfu_node_close_room(other, "c-r1"), SFU_ERR_NOT_OWNER);
        MESSAGE_HAS(me);
        /* Only the instance hosting a peer removes it. */
        EXPECT(sfu_node_remove_peer(other, "c-r1", "p2", gen2, &flag), SFU_ERR_NOT_OWNER);
        MESSAGE_HAS(me);
        s = BAD_PTR;
        EXPECT(sfu_node_room_owner(other, "c-r1", &s), SFU_OK);
        CHECK(s && strcmp(s, me) == 0);
        sfu_string_free(s);
    }

    /* close */
    EXPECT(sfu_node_close_room(NULL, "c-r2"), SFU_ERR_NULL);
    EXPECT(sfu_node_close_room(node, NULL), SFU_ERR_NULL);
    EXPECT(sfu_node_close_room(node, ""), SFU_ERR_INVALID_ID);
    EXPECT(sfu_node_close_room(node, "c-never-pinned"), SFU_ERR_NOT_OWNER);
    EXPECT(sfu_node_close_room(node, "c-r2"), SFU_OK);
    s = BAD_PTR;
    EXPECT(sfu_node_room_owner(node, "c-r2", &s), SFU_OK);
    CHECK(s == NULL);

    /* leader */
    flag = true;
    EXPECT(sfu_node_is_leader(NULL, &flag), SFU_ERR_NULL);
    EXPECT(sfu_node_is_leader(node, NULL), SFU_ERR_NULL);
    CHECK(flag == true);
    EXPECT(sfu_node_is_leader(node, &flag), SFU_OK);
    if (!redis) CHECK(flag == false);

    /* stats: rooms c-r1 and 방 1; peer p2 */
    SfuStats st;
    memset(&st, 0, sizeof st);
    st.rooms = 4242;
    EXPECT(sfu_node_stats(NULL, &st), SFU_ERR_NULL);
    EXPECT(sfu_node_stats(node, NULL), SFU_ERR_NULL);
    CHECK(st.rooms == 4242);
    EXPECT(sfu_node_stats(node, &st), SFU_OK);
    CHECK(st.instance_id && strcmp(st.instance_id, me) == 0);
    CHECK(st.redis == (redis != 0));
    CHECK(st.rooms == 2);
    CHECK(st.peers == 1);
    if (!redis) {
        CHECK(st.last_heartbeat_age_ms == -1 && st.heartbeats == 0 && st.last_error == NULL);
    } else {
        CHECK(st.heartbeats >= 1 && st.last_heartbeat_age_ms >= 0);
    }
    CHECK(st.events_dropped == 0);
    sfu_stats_clear(&st);
    CHECK(st.instance_id == NULL && st.rooms == 0);
    sfu_stats_clear(&st);

    /* metrics: the Prometheus text format, owned by the caller */
    s = BAD_PTR;
    EXPECT(sfu_node_metrics(NULL, &s), SFU_ERR_NULL);
    EXPECT(sfu_node_metrics(node, NULL), SFU_ERR_NULL);
    MESSAGE_HAS("out_text");
    CHECK(s == BAD_PTR);
    EXPECT(sfu_node_metrics(node, &s), SFU_OK);
    CHECK(s && strstr(s, "# TYPE sfu_redis_rooms gauge\nsfu_redis_rooms 2\n") != NULL);
    CHECK(s && strstr(s, "\nsfu_redis_peers 1\n") != NULL);
    CHECK(s && strstr(s, redis ? "mode=\"redis\"" : "mode=\"memory\"") != NULL);
    CHECK(s && strstr(s, "\nsfu_redis_healthy 1\n") != NULL);
    if (redis) {
        /* the registration counts as a heartbeat */
        CHECK(s && strstr(s, "\nsfu_redis_heartbeats_total ") != NULL);
        CHECK(s && strstr(s, "\nsfu_redis_heartbeats_total 0\n") == NULL);
    }
    sfu_string_free(s);

    /* health */
    s = BAD_PTR;
    flag = false;
    EXPECT(sfu_node_health(NULL, &flag, &s), SFU_ERR_NULL);
    EXPECT(sfu_node_health(node, NULL, &s), SFU_ERR_NULL);
    CHECK(s == BAD_PTR && flag == false);
    EXPECT(sfu_node_health(node, &flag, NULL), SFU_OK);
    CHECK(flag == true);
    flag = false;
    EXPECT(sfu_node_health(node, &flag, &s), SFU_OK);
    CHECK(flag == true);
    CHECK(s && s != BAD_PTR && strstr(s, redis ? "last heartbeat" : "memory-only") != NULL);
    sfu_string_free(s);

    /* events by polling */
    SfuEvent ev;
    memset(&ev, 0, sizeof ev);
    ev.epoch = 77;
    EXPECT(sfu_node_next_event(NULL, 0, &ev), SFU_ERR_NULL);
    EXPECT(sfu_node_next_event(node, 0, NULL), SFU_ERR_NULL);
    EXPECT(sfu_node_ready(NULL), SFU_ERR_NULL);
    EXPECT(sfu_node_ready(node), SFU_OK);
    /* With Redis a leader_acquired may come first: skip other events. */
    int got_ready = 0;
    for (int i = 0; i < 50 && !got_ready; i++) {
        SfuStatus rc = sfu_node_next_event(node, 200, &ev);
        if (rc == SFU_OK && ev.kind == SFU_EVENT_READY) {
            got_ready = 1;
            CHECK(ev.rooms == 2 && ev.peers == 1);
            CHECK(ev.json && strstr(ev.json, "\"event\":\"ready\"") && strstr(ev.json, me));
            CHECK(ev.instance == NULL && ev.room == NULL && ev.ids == NULL && ev.ids_len == 0);
        }
        sfu_event_clear(&ev);
    }
    CHECK(got_ready);
    CHECK(ev.kind == SFU_EVENT_NONE && ev.json == NULL);
    if (!redis) {
        ev.epoch = 77;
        EXPECT(sfu_node_next_event(node, 0, &ev), SFU_ERR_TIMEOUT);
        EXPECT(sfu_node_next_event(node, 20, &ev), SFU_ERR_TIMEOUT);
        CHECK(ev.epoch == 77 && ev.kind == SFU_EVENT_NONE);
    }
}

/* Callbacks: delivery on another thread, refusals inside, finalizers, the poll rule. */
static void exercise_callbacks(SfuNode *node) {
    Seen seen;
    seen_init(&seen, node);
    SfuEvent ev;
    memset(&ev, 0, sizeof ev);

    EXPECT(sfu_node_set_event_callback(NULL, on_event, &seen, on_finalize), SFU_ERR_NULL);
    EXPECT(sfu_node_set_event_callback(node, on_event, &seen, on_finalize), SFU_OK);
    EXPECT(sfu_node_next_event(node, 0, &ev), SFU_ERR_CALLBACK_REGISTERED);
    CHECK(ev.kind == SFU_EVENT_NONE);

    pthread_mutex_lock(&seen.lock);
    seen.probe = 1;
    pthread_mutex_unlock(&seen.lock);
    EXPECT(sfu_node_ready(node), SFU_OK);
    CHECK(wait_for(&seen, &seen.ready, 1));
    CHECK(wait_for(&seen, &seen.in_callback_refusals, 5));
    CHECK(seen_get(&seen, &seen.stats_ok) == 1);
    CHECK(seen_get(&seen, &seen.other_thread) == 1);
    CHECK(seen_get(&seen, &seen.finalized) == 0);

    /* Replacing runs the old finalizer once; removing runs the new one. */
    Seen second;
    seen_init(&second, node);
    EXPECT(sfu_node_set_event_callback(node, on_event, &second, on_finalize), SFU_OK);
    CHECK(seen_get(&seen, &seen.finalized) == 1);
    EXPECT(sfu_node_ready(node), SFU_OK);
    CHECK(wait_for(&second, &second.ready, 1));
    EXPECT(sfu_node_set_event_callback(node, NULL, NULL, NULL), SFU_OK);
    CHECK(seen_get(&second, &second.finalized) == 1);
    CHECK(seen_get(&seen, &seen.finalized) == 1);
    CHECK(seen_get(&seen, &seen.ready) == 1);
    /* Removing twice is fine; no finalizer runs again. */
    EXPECT(sfu_node_set_event_callback(node, NULL, &seen, on_finalize), SFU_OK);
    CHECK(seen_get(&seen, &seen.finalized) == 1);

    /* Polling works again; a callback without a finalizer. */
    EXPECT(sfu_node_ready(node), SFU_OK);
    int polled = 0;
    for (int i = 0; i < 50 && !polled; i++) {
        if (sfu_node_next_event(node, 200, &ev) == SFU_OK && ev.kind == SFU_EVENT_READY) polled = 1;
        sfu_event_clear(&ev);
    }
    CHECK(polled);
    Seen third;
    seen_init(&third, node);
    EXPECT(sfu_node_set_event_callback(node, on_event, &third, NULL), SFU_OK);
    EXPECT(sfu_node_ready(node), SFU_OK);
    CHECK(wait_for(&third, &third.ready, 1));
    EXPECT(sfu_node_set_event_callback(node, NULL, NULL, NULL), SFU_OK);
    CHECK(seen_get(&third, &third.finalized) == 0);
    pthread_mutex_destroy(&seen.lock);
    pthread_mutex_destroy(&second.lock);
    pthread_mutex_destroy(&third.lock);
}

/* Stop: STOPPED is the last event, then the stream is closed; calls fail with STOPPED. */
static void exercise_stop(SfuNode *node) {
    SfuEvent ev;
    memset(&ev, 0, sizeof ev);
    SfuPinOutcome outcome = (SfuPinOutcome)99;
    EXPECT(sfu_node_stop(NULL), SFU_ERR_NULL);
    EXPECT(sfu_node_stop(node), SFU_OK);
    EXPECT(sfu_node_stop(node), SFU_OK); /* idempotent */
    EXPECT(sfu_node_leave(node), SFU_OK); /* only the first acts */
    EXPECT(sfu_node_pin_room(node, "c-r9", &outcome, NULL), SFU_ERR_STOPPED);
    CHECK(outcome == (SfuPinOutcome)99);
    EXPECT(sfu_node_close_room(node, "c-r1"), SFU_ERR_STOPPED);
    EXPECT(sfu_node_upsert_peer(node, "c-r1", "p9", NULL, NULL, 0, &(uint64_t){0}, NULL), SFU_ERR_STOPPED);
    EXPECT(sfu_node_remove_peer(node, "c-r1", "p2", 1, NULL), SFU_ERR_STOPPED);
    char *s = BAD_PTR;
    EXPECT(sfu_node_room_owner(node, "c-r1", &s), SFU_ERR_STOPPED);
    CHECK(s == BAD_PTR);
    bool leader = true;
    EXPECT(sfu_node_is_leader(node, &leader), SFU_OK);
    CHECK(leader == false);
    EXPECT(sfu_node_ready(node), SFU_OK); /* a no-op */
    SfuStats st;
    memset(&st, 0, sizeof st);
    EXPECT(sfu_node_stats(node, &st), SFU_OK);
    sfu_stats_clear(&st);
    /* a stopped node: unhealthy, its metrics still rendered */
    leader = true;
    s = NULL;
    EXPECT(sfu_node_health(node, &leader, &s), SFU_OK);
    CHECK(leader == false && s && strcmp(s, "stopped") == 0);
    sfu_string_free(s);
    s = NULL;
    EXPECT(sfu_node_metrics(node, &s), SFU_OK);
    CHECK(s && strstr(s, "\nsfu_redis_healthy 0\n") != NULL);
    sfu_string_free(s);
    int stopped = 0;
    SfuStatus rc = SFU_OK;
    for (int i = 0; i < 100 && rc == SFU_OK && !stopped; i++) {
        rc = sfu_node_next_event(node, 200, &ev);
        if (rc == SFU_OK && ev.kind == SFU_EVENT_STOPPED) stopped = 1;
        sfu_event_clear(&ev);
    }
    CHECK(stopped);
    EXPECT(sfu_node_next_event(node, 0, &ev), SFU_ERR_CLOSED);
    EXPECT(sfu_node_next_event(node, 50, &ev), SFU_ERR_CLOSED);
    CHECK(ev.kind == SFU_EVENT_NONE);
    EXPECT(sfu_node_leave(node), SFU_OK);
}

static void test_memory(void) {
    SfuNode *node = BAD_PTR;
    SfuConfig *cfg = NULL;
    EXPECT(sfu_config_new(&cfg), SFU_OK);
    EXPECT(sfu_node_start(NULL, &node), SFU_ERR_NULL);
    EXPECT(sfu_node_start(cfg, NULL), SFU_ERR_NULL);
    CHECK(node == BAD_PTR);
    sfu_config_free(cfg);

    node = start_memory("c-mem");
    exercise_node(node, NULL, "c-mem", 0);
    exercise_callbacks(node);
    exercise_stop(node);
    EXPECT(sfu_node_free(node), SFU_OK);

    /* Free with a callback registered and events queued: the callback receives them all
     * (ending with STOPPED) and its finalizer runs before free returns. */
    node = start_memory("c-mem-2");
    Seen seen;
    seen_init(&seen, node);
    EXPECT(sfu_node_set_event_callback(node, on_event, &seen, on_finalize), SFU_OK);
    for (int i = 0; i < 3; i++) EXPECT(sfu_node_ready(node), SFU_OK);
    EXPECT(sfu_node_free(node), SFU_OK);
    CHECK(seen.ready == 3 && seen.stopped == 1 && seen.finalized == 1);
    pthread_mutex_destroy(&seen.lock);

    /* Stop with a callback: the stream ends, the finalizer runs, polling is still refused
     * until the callback is removed, then the stream reads as closed. */
    node = start_memory("c-mem-3");
    seen_init(&seen, node);
    EXPECT(sfu_node_set_event_callback(node, on_event, &seen, on_finalize), SFU_OK);
    EXPECT(sfu_node_stop(node), SFU_OK);
    CHECK(wait_for(&seen, &seen.finalized, 1));
    CHECK(seen_get(&seen, &seen.stopped) == 1);
    SfuEvent ev;
    memset(&ev, 0, sizeof ev);
    EXPECT(sfu_node_next_event(node, 0, &ev), SFU_ERR_CALLBACK_REGISTERED);
    EXPECT(sfu_node_set_event_callback(node, NULL, NULL, NULL), SFU_OK);
    EXPECT(sfu_node_next_event(node, 0, &ev), SFU_ERR_CLOSED);
    CHECK(seen_get(&seen, &seen.finalized) == 1);
    EXPECT(sfu_node_free(node), SFU_OK);
    pthread_mutex_destroy(&seen.lock);

    /* Leave in memory-only mode. */
    node = start_memory("c-mem-4");
    SfuPinOutcome outcome;
    EXPECT(sfu_node_pin_room(node, "c-r1", &outcome, NULL), SFU_OK);
    EXPECT(sfu_node_leave(node), SFU_OK);
    EXPECT(sfu_node_pin_room(node, "c-r1", &outcome, NULL), SFU_ERR_STOPPED);
    EXPECT(sfu_node_free(node), SFU_OK);

    /* Free without stop, with events never read. */
    node = start_memory("c-mem-5");
    EXPECT(sfu_node_ready(node), SFU_OK);
    EXPECT(sfu_node_free(node), SFU_OK);
}

static SfuNode *start_redis(const char *url, const char *instance) {
    SfuConfig *cfg = NULL;
    SfuNode *node = NULL;
    EXPECT(sfu_config_new(&cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "redis_url", url), SFU_OK);
    EXPECT(sfu_config_set(cfg, "stage", "ffi-c"), SFU_OK);
    EXPECT(sfu_config_set(cfg, "instance_id", instance), SFU_OK);
    set_slow_timings(cfg);
    EXPECT(sfu_node_start(cfg, &node), SFU_OK);
    sfu_config_free(cfg);
    return node;
}

static void test_redis(const char *url) {
    /* Unreachable Redis: refused at start, out-parameter untouched, no password shown. */
    SfuConfig *cfg = NULL;
    SfuNode *node = BAD_PTR;
    EXPECT(sfu_config_new(&cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "redis_url", "redis://user:s3cret@127.0.0.1:1"), SFU_OK);
    set_slow_timings(cfg);
    EXPECT(sfu_node_start(cfg, &node), SFU_ERR_REDIS);
    CHECK(node == BAD_PTR);
    CHECK(strstr(sfu_last_error_message(), "s3cret") == NULL);
    sfu_config_free(cfg);

    /* A prefix in another key schema version (stamped "99" by the Rust runner): refused at
     * start, out-parameter untouched, the message names both versions. */
    EXPECT(sfu_config_new(&cfg), SFU_OK);
    EXPECT(sfu_config_set(cfg, "redis_url", url), SFU_OK);
    EXPECT(sfu_config_set(cfg, "stage", "ffi-c-schema"), SFU_OK);
    set_slow_timings(cfg);
    EXPECT(sfu_node_start(cfg, &node), SFU_ERR_SCHEMA);
    CHECK(node == BAD_PTR);
    CHECK(strstr(sfu_last_error_message(), "schema version \"99\"") != NULL);
    CHECK(strstr(sfu_last_error_message(), "speaks version 2") != NULL);
    sfu_config_free(cfg);

    SfuNode *a = start_redis(url, "c-redis-a");
    SfuNode *b = start_redis(url, "c-redis-b");
    if (!a || !b) {
        sfu_node_free(a);
        sfu_node_free(b);
        return;
    }
    /* Wait for a first heartbeat tick to be counted. */
    for (int i = 0; i < 100; i++) {
        SfuStats st;
        memset(&st, 0, sizeof st);
        sfu_node_stats(a, &st);
        int beat = st.heartbeats >= 1;
        sfu_stats_clear(&st);
        if (beat) break;
        sleep_ms(50);
    }
    exercise_node(a, b, "c-redis-a", 1);
    exercise_callbacks(a);

    /* B leaves for good: its room is free at once. */
    SfuPinOutcome outcome;
    EXPECT(sfu_node_pin_room(b, "c-b-room", &outcome, NULL), SFU_OK);
    CHECK(outcome == SFU_PIN_PINNED);
    EXPECT(sfu_node_upsert_peer(b, "c-b-room", "bp", NULL, NULL, 0, &(uint64_t){0}, NULL), SFU_OK);
    EXPECT(sfu_node_leave(b), SFU_OK);
    char *s = BAD_PTR;
    EXPECT(sfu_node_room_owner(a, "c-b-room", &s), SFU_OK);
    CHECK(s == NULL);
    EXPECT(sfu_node_free(b), SFU_OK);

    exercise_stop(a);
    EXPECT(sfu_node_free(a), SFU_OK);
}

int main(int argc, char **argv) {
    test_misc();
    test_config();
    test_memory();
    if (argc > 1) {
        test_redis(argv[1]);
    }
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures == 0 ? 0 : 1;
}
