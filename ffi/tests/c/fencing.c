/* Fencing hand-over through C: two owners share one store. Owner B takes the namespace from
 * owner A (bump, revoke slices until complete, adopt); A's next write is refused PC_FENCED and A stops
 * serving the namespace; B sees every write A made and repairs each account once (A did not
 * release). B then releases cleanly, so owner C repairs nothing; C's declared lease-table
 * recovery holds revocation off until a lease and its margin pass on the manual clock. */
#include "counter.h"

static pc_engine *open_owner(const pc_store *store, const char *owner, machine_data *data) {
    pc_machine m = counter_machine(data);
    pc_engine_options *o = small_options(NULL, store);
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
    static machine_data data_a, data_b;
    pc_clock *clock = NULL;
    pc_store *store = NULL;
    CHECK(pc_clock_new_manual(1000000, &clock, NULL));
    CHECK(pc_store_open_memory(clock, &store, NULL));

    pc_engine *a = open_owner(store, "owner-a", &data_a);
    pc_engine *b = open_owner(store, "owner-b", &data_b);
    uint64_t grant = 0;
    CHECK(pc_engine_own(a, "bank", &grant, NULL));
    char id[32];
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "acct-%d", i);
        append_value(a, "bank", id, 10);
    }
    /* B does not serve the namespace until it adopts it. */
    pc_bytes state = {0};
    EXPECT_CODE(pc_engine_read(b, "bank", S("acct-0"), &state, NULL), PC_NOT_SERVED);

    /* B takes over: bump, revoke until complete, adopt. */
    uint64_t epoch = 0, slices = 0;
    CHECK(pc_engine_current_epoch(b, "bank", &epoch, NULL));
    EXPECT_CODE(pc_engine_bump_epoch(b, "bank", epoch + 2000, NULL), PC_INVALID_ARGUMENT);
    CHECK(pc_engine_bump_epoch(b, "bank", epoch + 1, NULL));
    /* Slice by slice on this thread (revoke.c runs the background revocation). */
    pc_revoke_progress progress = {0};
    for (slices = 0; slices < 1000 && !progress.complete; slices++) {
        CHECK(pc_engine_revoke_step(b, "bank", 50, &progress, NULL));
    }
    ASSERT(progress.complete && slices >= 1);
    CHECK(pc_engine_own(b, "bank", &grant, NULL));
    ASSERT(grant == epoch + 1);

    /* A is fenced and stops serving; B sees what A wrote. */
    uint64_t v = 5;
    pc_slice record = {(const uint8_t *)&v, 8};
    uint64_t first, last;
    EXPECT_CODE(pc_engine_append(a, "bank", S("acct-0"), &record, 1, &first, &last, NULL), PC_FENCED);
    uint32_t again = pc_engine_append(a, "bank", S("acct-1"), &record, 1, &first, &last, NULL);
    ASSERT(again == PC_FENCED || again == PC_NOT_SERVED);
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "acct-%d", i);
        counter c = read_counter(b, "bank", id);
        /* B cannot tell a deposed owner from a dead one: it repairs each account once. */
        ASSERT(c.sum == 10 && c.records == 1 && c.repairs == 1);
    }
    append_value(b, "bank", "acct-0", 1);
    ASSERT(read_counter(b, "bank", "acct-0").sum == 11);

    /* A clean hand-back. */
    CHECK(pc_engine_release_namespace(b, "bank", NULL));
    EXPECT_CODE(pc_engine_read(b, "bank", S("acct-0"), &state, NULL), PC_NOT_SERVED);

    /* A declared recovery holds revocation off until a lease and its margin pass. */
    pc_engine *c = open_owner(store, "owner-c", &data_a);
    CHECK(pc_engine_current_epoch(c, "bank", &epoch, NULL));
    CHECK(pc_engine_mark_recovered(c, "bank", NULL));
    CHECK(pc_engine_bump_epoch(c, "bank", epoch + 1, NULL));
    CHECK(pc_engine_revoke_step(c, "bank", 50, &progress, NULL));
    ASSERT(!progress.complete && progress.remaining >= 1);
    CHECK(pc_clock_advance(clock, 30000 + 5000, NULL));
    for (int i = 0; i < 100 && !progress.complete; i++) {
        CHECK(pc_engine_revoke_step(c, "bank", 50, &progress, NULL));
    }
    ASSERT(progress.complete);
    CHECK(pc_engine_own(c, "bank", &grant, NULL));
    counter after = read_counter(c, "bank", "acct-0");
    /* B's clean release owes no repair: the one repair is B's, from taking over from A. */
    ASSERT(after.sum == 11 && after.repairs == 1);

    CHECK(pc_engine_close(c, NULL));
    CHECK(pc_engine_close(b, NULL));
    CHECK(pc_engine_close(a, NULL));
    pc_engine_free(c);
    pc_engine_free(b);
    pc_engine_free(a);
    ASSERT(atomic_load(&data_a.destroyed) == 2 && atomic_load(&data_b.destroyed) == 1);
    ASSERT(atomic_load(&data_a.live_states) == 0 && atomic_load(&data_b.live_states) == 0);
    CHECK(pc_store_close(store, NULL));
    pc_store_free(store);
    pc_clock_free(clock);
    printf("fencing: ok\n");
    return 0;
}
