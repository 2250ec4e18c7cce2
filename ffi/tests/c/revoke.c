/* Revocation to completion through C: the background revocation on the engine's pool completes
 * a take-over (the stale owner is then fenced), and a revocation held off by a declared
 * lease-table recovery under a frozen clock answers PC_UNAVAILABLE when its wait times out.
 * The lease sweeper is on (the default): closing the engine must leave no thread holding the
 * store, or valgrind finds its memory still held at exit. */
#include "counter.h"

static pc_engine *open_owner(const pc_store *store, const char *owner, machine_data *data) {
    pc_machine m = counter_machine(data);
    pc_engine_options *o = small_options(NULL, store);
    CHECK(pc_engine_options_flag(o, PC_SWEEP_EXPIRED_LEASES, true, NULL)); /* the default */
    CHECK(pc_engine_options_number(o, PC_SWEEP_INTERVAL_MS, 60000, NULL));
    CHECK(pc_engine_options_owner(o, owner, NULL));
    CHECK(pc_engine_options_flag(o, PC_ADOPT_ON_FIRST_USE, false, NULL));
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    return e;
}

int main(int argc, char **argv) {
    ASSERT(argc == 2 && argv[1] != NULL); /* a memory store: the directory is unused */
    static machine_data data;
    pc_clock *clock = NULL;
    pc_store *store = NULL;
    CHECK(pc_clock_new_manual(1000000, &clock, NULL));
    CHECK(pc_store_open_memory(clock, &store, NULL));
    pc_engine *a = open_owner(store, "owner-a", &data);
    pc_engine *b = open_owner(store, "owner-b", &data);
    uint64_t grant = 0, epoch = 0, slices = 0;
    CHECK(pc_engine_own(a, "bank", &grant, NULL));
    append_value(a, "bank", "acct", 7);

    CHECK(pc_engine_current_epoch(b, "bank", &epoch, NULL));
    CHECK(pc_engine_bump_epoch(b, "bank", epoch + 1, NULL));
    CHECK(pc_engine_revoke_to_completion(b, "bank", 60000, &slices, NULL));
    ASSERT(slices >= 1);
    CHECK(pc_engine_own(b, "bank", &grant, NULL));
    uint64_t v = 1;
    pc_slice record = {(const uint8_t *)&v, 8};
    uint64_t first, last;
    EXPECT_CODE(pc_engine_append(a, "bank", S("acct"), &record, 1, &first, &last, NULL), PC_FENCED);
    ASSERT(read_counter(b, "bank", "acct").sum == 7);

    /* A declared recovery on a frozen clock: revocation cannot complete; the wait gives up. */
    CHECK(pc_engine_mark_recovered(b, "bank", NULL));
    CHECK(pc_engine_bump_epoch(b, "bank", epoch + 2, NULL));
    EXPECT_CODE(pc_engine_revoke_to_completion(b, "bank", 50, &slices, NULL), PC_UNAVAILABLE);

    CHECK(pc_engine_close(a, NULL));
    CHECK(pc_engine_close(b, NULL));
    pc_engine_free(a);
    pc_engine_free(b);
    ASSERT(atomic_load(&data.destroyed) == 2 && atomic_load(&data.live_states) == 0);
    CHECK(pc_store_close(store, NULL));
    pc_store_free(store);
    pc_clock_free(clock);
    printf("revoke: ok\n");
    return 0;
}
