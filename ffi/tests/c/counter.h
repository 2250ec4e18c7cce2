/* A state machine in C shared by the test programs: an entity's state sums 8-byte records
 * (host byte order) and counts one-byte repair markers "R". The machine's user_data counts
 * live states, destroy calls and callbacks, and holds switches for refusals (each with a
 * reason given through pc_refuse). */
#ifndef PORTCULLIS_TEST_COUNTER_H
#define PORTCULLIS_TEST_COUNTER_H

#include <stdatomic.h>

#include "check.h"

typedef struct counter {
    uint64_t sum;
    uint64_t records;
    uint64_t repairs;
    atomic_int busy; /* set while a callback uses the state: two at once is a violation */
} counter;

typedef struct machine_data {
    atomic_long live_states;
    atomic_int destroyed;
    atomic_long applies;
    atomic_long violations;
    /* apply refuses a replayed record with this value, with code 42 (0: none) */
    atomic_ullong refuse_replay_of;
    /* validate refuses a record with this value, with code 7 (0: none) */
    atomic_ullong refuse_valid_of;
    /* check refuses a record with this value while the sum is below it, with code 11 */
    atomic_ullong refuse_check_of;
    /* encode refuses a state with this sum, with code 9 (0: none) */
    atomic_ullong refuse_encode_of;
    /* fresh refuses an entity whose id starts with this byte, with code 12 (0: none) */
    atomic_int refuse_fresh_of;
} machine_data;

static uint32_t counter_fresh(void *user_data, const pc_entity_view *entity, void **state_out) {
    machine_data *d = user_data;
    ASSERT(entity->ns_len > 0 && entity->id_len > 0);
    int refused = atomic_load(&d->refuse_fresh_of);
    if (refused != 0 && entity->id[0] == refused) {
        CHECK(pc_refuse("no fresh state for this id", NULL));
        return 12;
    }
    counter *c = calloc(1, sizeof *c);
    ASSERT(c != NULL);
    atomic_fetch_add(&d->live_states, 1);
    *state_out = c;
    return 0;
}

static uint32_t counter_apply(void *user_data, void *state, const pc_apply_context *ctx,
                              const uint8_t *record, size_t len) {
    machine_data *d = user_data;
    counter *c = state;
    uint32_t code = 0;
    if (atomic_exchange(&c->busy, 1) != 0) {
        atomic_fetch_add(&d->violations, 1);
    }
    atomic_fetch_add(&d->applies, 1);
    ASSERT(ctx->seq >= 1);
    if (len == 1 && record[0] == 'R') {
        c->repairs++;
    } else if (len == 8) {
        uint64_t v;
        memcpy(&v, record, 8);
        uint64_t refused = atomic_load(&d->refuse_replay_of);
        if (refused != 0 && v == refused && ctx->origin == PC_ORIGIN_REPLAY) {
            CHECK(pc_refuse("the code and the history disagree", NULL));
            code = 42;
        } else {
            c->sum += v;
            c->records++;
        }
    } else {
        code = 3;
    }
    atomic_store(&c->busy, 0);
    return code;
}

static uint32_t counter_encode(void *user_data, const void *state, pc_sink *out) {
    machine_data *d = user_data;
    const counter *c = state;
    uint64_t words[3] = {c->sum, c->records, c->repairs};
    CHECK(pc_sink_write(out, (const uint8_t *)words, sizeof words, NULL));
    uint64_t refused = atomic_load(&d->refuse_encode_of);
    if (refused != 0 && c->sum == refused) {
        CHECK(pc_refuse("this sum does not encode", NULL));
        return 9; /* the bytes written above are dropped */
    }
    return 0;
}

static uint32_t counter_decode(void *user_data, const pc_entity_view *entity,
                               const uint8_t *bytes, size_t len, void **state_out) {
    machine_data *d = user_data;
    (void)entity;
    if (len != 3 * sizeof(uint64_t)) {
        return 5;
    }
    counter *c = calloc(1, sizeof *c);
    ASSERT(c != NULL);
    uint64_t words[3];
    memcpy(words, bytes, sizeof words);
    c->sum = words[0];
    c->records = words[1];
    c->repairs = words[2];
    atomic_fetch_add(&d->live_states, 1);
    *state_out = c;
    return 0;
}

static uint32_t counter_validate(void *user_data, const uint8_t *record, size_t len) {
    machine_data *d = user_data;
    if (len == 1 && record[0] == 'R') {
        return 0;
    }
    if (len != 8) {
        return 3;
    }
    uint64_t v;
    memcpy(&v, record, 8);
    uint64_t refused = atomic_load(&d->refuse_valid_of);
    return (refused != 0 && v == refused) ? 7 : 0;
}

static uint32_t counter_check(void *user_data, const void *state, const pc_apply_context *ctx,
                              const uint8_t *record, size_t len) {
    machine_data *d = user_data;
    const counter *c = state;
    ASSERT(ctx->origin == PC_ORIGIN_LIVE || ctx->origin == PC_ORIGIN_DEFERRED);
    uint64_t refused = atomic_load(&d->refuse_check_of);
    if (len == 8 && refused != 0) {
        uint64_t v;
        memcpy(&v, record, 8);
        if (v == refused && c->sum < refused) {
            CHECK(pc_refuse("not before the sum reaches it", NULL));
            return 11;
        }
    }
    return 0;
}

static uint32_t counter_repair(void *user_data, const pc_entity_view *entity, const void *state,
                               uint64_t unclean, pc_records *out) {
    (void)user_data;
    (void)entity;
    (void)state;
    ASSERT(unclean >= 1);
    return pc_records_push(out, (const uint8_t *)"R", 1, NULL);
}

static void counter_free(void *user_data, void *state) {
    machine_data *d = user_data;
    free(state);
    atomic_fetch_sub(&d->live_states, 1);
}

static void counter_destroy(void *user_data) {
    machine_data *d = user_data;
    atomic_fetch_add(&d->destroyed, 1);
}

static pc_machine counter_machine(machine_data *d) {
    pc_machine m = {
        .struct_size = sizeof(pc_machine),
        .user_data = d,
        .fresh = counter_fresh,
        .apply = counter_apply,
        .encode = counter_encode,
        .decode = counter_decode,
        .validate = counter_validate,
        .repair = counter_repair,
        .free_state = counter_free,
        .destroy = counter_destroy,
        .check = counter_check,
    };
    return m;
}

/* The entity's state, read through pc_engine_read. */
static counter read_counter(const pc_engine *engine, const char *ns, const char *id) {
    pc_bytes bytes = {0};
    CHECK(pc_engine_read(engine, ns, S(id), &bytes, NULL));
    ASSERT(bytes.len == 3 * sizeof(uint64_t));
    uint64_t words[3];
    memcpy(words, bytes.data, sizeof words);
    pc_bytes_free(&bytes);
    counter c = {.sum = words[0], .records = words[1], .repairs = words[2]};
    return c;
}

/* Appends one 8-byte record. */
static uint64_t append_value(const pc_engine *engine, const char *ns, const char *id, uint64_t v) {
    pc_slice record = {(const uint8_t *)&v, sizeof v};
    uint64_t first = 0, last = 0;
    CHECK(pc_engine_append(engine, ns, S(id), &record, 1, &first, &last, NULL));
    ASSERT(first == last);
    return last;
}

/* Options over `dir` (a file store) or `store`, with a small pool and no lease sweeper (fewer
 * threads); revoke.c runs with the sweeper. */
static pc_engine_options *small_options(const char *dir, const pc_store *store) {
    pc_engine_options *o = NULL;
    CHECK(pc_engine_options_new(&o, NULL));
    if (dir != NULL) {
        CHECK(pc_engine_options_directory(o, dir, NULL));
    }
    if (store != NULL) {
        CHECK(pc_engine_options_store(o, store, NULL));
    }
    CHECK(pc_engine_options_number(o, PC_POOL_THREADS, 2, NULL));
    CHECK(pc_engine_options_number(o, PC_CLOSE_TIMEOUT_MS, 20000, NULL));
    CHECK(pc_engine_options_flag(o, PC_SWEEP_EXPIRED_LEASES, false, NULL));
    /* Entities stay pending until the test touches them. */
    CHECK(pc_engine_options_flag(o, PC_BACKGROUND_WARM, false, NULL));
    return o;
}

#endif
