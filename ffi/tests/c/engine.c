/* The engine through C with a C state machine: open with options, register, append, write
 * with a decision, read the state as bytes, checkpoint, close; then a restart with lazy
 * restore: deferred work queued for pending entities, a warm with progress, stats. */
#include "counter.h"

struct decision {
    uint64_t seen_sum;
    uint32_t answer;
};

/* Refuses the command with a reason once a record is pushed: nothing is written. */
static uint32_t decide_refuse(void *ctx, const void *state, pc_records *out) {
    (void)ctx;
    char reason[64];
    snprintf(reason, sizeof reason, "the sum is %llu already",
             (unsigned long long)((const counter *)state)->sum);
    uint64_t v = 1;
    CHECK(pc_records_push(out, (const uint8_t *)&v, sizeof v, NULL));
    CHECK(pc_records_refuse(out, reason, NULL));
    EXPECT_CODE(pc_records_refuse(out, NULL, NULL), PC_INVALID_ARGUMENT);
    return 0;
}

/* Appends the current sum as a record, or refuses with `answer`. */
static uint32_t decide_double(void *ctx, const void *state, pc_records *out) {
    struct decision *d = ctx;
    const counter *c = state;
    d->seen_sum = c->sum;
    if (d->answer != 0) {
        return d->answer;
    }
    uint64_t v = c->sum;
    CHECK(pc_records_push(out, (const uint8_t *)&v, sizeof v, NULL));
    return 0;
}

static void first_run(const char *dir, machine_data *data) {
    pc_machine m = counter_machine(data);
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);

    bool created = false;
    CHECK(pc_engine_register(e, "acct", S("a1"), &created, NULL));
    ASSERT(created);
    CHECK(pc_engine_register(e, "acct", S("a1"), &created, NULL));
    ASSERT(!created);

    uint64_t values[3] = {1, 2, 3};
    pc_slice records[3];
    for (int i = 0; i < 3; i++) {
        records[i].data = (const uint8_t *)&values[i];
        records[i].len = 8;
    }
    uint64_t first = 0, last = 0;
    CHECK(pc_engine_append(e, "acct", S("a1"), records, 3, &first, &last, NULL));
    ASSERT(first == 1 && last == 3);
    counter c = read_counter(e, "acct", "a1");
    ASSERT(c.sum == 6 && c.records == 3);

    /* A write decided from the state; a refusing decision writes nothing. */
    struct decision d = {0, 0};
    pc_written w;
    CHECK(pc_engine_write(e, "acct", S("a1"), decide_double, &d, &w, NULL));
    ASSERT(d.seen_sum == 6 && w.wrote && w.first_seq == 4 && w.last_seq == 4 && w.decision == 0);
    d.answer = 9;
    CHECK(pc_engine_write(e, "acct", S("a1"), decide_double, &d, &w, NULL));
    ASSERT(!w.wrote && w.decision == 9);
    ASSERT(read_counter(e, "acct", "a1").sum == 12);
    /* A decision that refuses the command with a reason: PC_REFUSED, nothing written. */
    EXPECT_CODE(pc_engine_write(e, "acct", S("a1"), decide_refuse, NULL, &w, NULL), PC_REFUSED);
    ASSERT(strstr(last_error(), "the sum is 12 already") != NULL);
    ASSERT(strstr(last_error(), "nothing was written") != NULL);
    ASSERT(strcmp(pc_error_name(PC_REFUSED), "PC_REFUSED") == 0);
    c = read_counter(e, "acct", "a1");
    ASSERT(c.sum == 12 && c.records == 4);

    uint64_t seq = 0;
    CHECK(pc_engine_checkpoint(e, "acct", S("a1"), &seq, NULL));
    ASSERT(seq == 4);
    append_value(e, "acct", "a1", 100);

    /* More entities, registered by their first write. */
    char id[16];
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "b%d", i);
        append_value(e, "acct", id, (uint64_t)i + 1);
    }
    pc_engine_stats s = {.struct_size = sizeof(pc_engine_stats)};
    CHECK(pc_engine_get_stats(e, &s, NULL));
    ASSERT(s.incarnation >= 1 && s.entities == 7 && s.unclean_previous == 0);

    CHECK(pc_engine_close(e, NULL));
    EXPECT_CODE(pc_engine_register(e, "acct", S("a1"), &created, NULL), PC_CLOSED);
    pc_engine_free(e);
    ASSERT(atomic_load(&data->destroyed) == 1);
    ASSERT(atomic_load(&data->live_states) == 0);
}

static void restart(const char *dir, machine_data *data) {
    pc_machine m = counter_machine(data);
    pc_engine_options *o = small_options(dir, NULL);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);

    /* Open read no history: everything is pending. */
    pc_engine_stats s = {.struct_size = sizeof(pc_engine_stats)};
    CHECK(pc_engine_get_stats(e, &s, NULL));
    ASSERT(s.pending == 7 && s.restored == 0 && s.unclean_previous == 0);

    /* Deferred work for a pending entity is queued, once per id. */
    uint64_t v = 1000;
    pc_deferred def;
    CHECK(pc_engine_defer(e, "acct", S("b0"), NULL, 0, (const uint8_t *)&v, 8, &def, NULL));
    ASSERT(def.kind == PC_DEFERRED_QUEUED);
    CHECK(pc_engine_defer(e, "acct", S("b1"), S("once"), (const uint8_t *)&v, 8, &def, NULL));
    ASSERT(def.kind == PC_DEFERRED_QUEUED);
    CHECK(pc_engine_defer(e, "acct", S("b1"), S("once"), (const uint8_t *)&v, 8, &def, NULL));
    ASSERT(def.kind == PC_DEFERRED_ALREADY_ACCEPTED);

    /* The first touch restores: the checkpoint and the record after it. */
    counter c = read_counter(e, "acct", "a1");
    ASSERT(c.sum == 112 && c.records == 5);

    /* A warm restores the rest in the background. */
    pc_warm *warm = NULL;
    CHECK(pc_engine_warm(e, &warm, NULL));
    bool finished = false;
    CHECK(pc_warm_wait(warm, 60000, &finished, NULL));
    ASSERT(finished);
    pc_warm_progress p = {.struct_size = sizeof(pc_warm_progress)};
    CHECK(pc_warm_get_progress(warm, &p, NULL));
    ASSERT(p.finished && !p.stopped && p.done == p.total && p.refused == 0);
    CHECK(pc_warm_stop(warm, NULL));
    pc_warm_free(warm);

    ASSERT(read_counter(e, "acct", "b0").sum == 1001);
    ASSERT(read_counter(e, "acct", "b1").sum == 1002);
    ASSERT(read_counter(e, "acct", "b5").sum == 6);
    /* Deferred to a restored entity: appended at once. */
    CHECK(pc_engine_defer(e, "acct", S("b2"), NULL, 0, (const uint8_t *)&v, 8, &def, NULL));
    ASSERT(def.kind == PC_DEFERRED_APPLIED && def.seq == 2);

    CHECK(pc_engine_get_stats(e, &s, NULL));
    ASSERT(s.pending == 0 && s.restored == 7 && s.contained == 0 && s.units_run == 7);
    ASSERT(s.store_batches > 0);
    ASSERT(atomic_load(&data->violations) == 0);
    CHECK(pc_engine_close(e, NULL));
    pc_engine_free(e);
    ASSERT(atomic_load(&data->destroyed) == 2 && atomic_load(&data->live_states) == 0);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    static machine_data data;
    first_run(argv[1], &data);
    restart(argv[1], &data);
    printf("engine: ok\n");
    return 0;
}
