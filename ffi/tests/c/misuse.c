/* Errors and misuse through C: null handles and pointers, bad lengths and names, double close,
 * calls after close, oversize input, a machine without a required callback (destroy still runs
 * once), a refusing validate, a refusing apply that contains its entity until released, a
 * callback that calls back into its own entity, and the last-error message. */
#include "counter.h"

static void messages(void) {
    ASSERT(strcmp(pc_error_name(PC_FENCED), "PC_FENCED") == 0);
    ASSERT(strcmp(pc_error_name(999), "PC_UNKNOWN") == 0);
    EXPECT_CODE(pc_engine_close(NULL, NULL), PC_INVALID_ARGUMENT);
    size_t full = 0;
    CHECK(pc_last_error_message(NULL, 0, &full));
    ASSERT(full > 0);
    char small[8];
    size_t written = 0;
    CHECK(pc_last_error_message(small, sizeof small, &written));
    ASSERT(written == full && small[7] == '\0' && strlen(small) == 7);
    EXPECT_CODE(pc_last_error_message(NULL, 5, &written), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_last_error_message(small, sizeof small, NULL), PC_INVALID_ARGUMENT);
}

static void null_arguments(void) {
    pc_bytes value = {0};
    bool found;
    pc_store *store = NULL;
    CHECK(pc_store_open_memory(NULL, &store, NULL));
    EXPECT_CODE(pc_store_get(NULL, S("p"), S("k"), &value, &found, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_get(store, S("p"), S("k"), NULL, &found, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_get(store, S("p"), NULL, 3, &value, &found, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_get(store, NULL, 0, S("k"), &value, &found, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_open_memory(NULL, NULL, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_open_file(NULL, PC_SYNC_EVERY_COMMIT, 0, NULL, &store, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_batch_put(NULL, S("k"), S("v"), NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_apply(store, S("p"), NULL, NULL, NULL), PC_INVALID_ARGUMENT);
    pc_scan_page *page = NULL;
    CHECK(pc_store_scan(store, S("p"), NULL, 0, NULL, 0, NULL, 0, 10, &page, NULL));
    const uint8_t *k, *v;
    size_t kl, vl;
    EXPECT_CODE(pc_scan_page_entry(page, 0, &k, &kl, &v, &vl, NULL), PC_INVALID_ARGUMENT);
    ASSERT(pc_scan_page_len(NULL) == 0);
    EXPECT_CODE(pc_store_scan(store, S("p"), NULL, 0, NULL, 0, NULL, 0, 0, &page, NULL), PC_INVALID_ARGUMENT);
    pc_scan_page_free(page);
    /* Every free accepts NULL. */
    pc_bytes_free(NULL);
    pc_store_free(NULL);
    pc_batch_free(NULL);
    pc_scan_page_free(NULL);
    pc_engine_free(NULL);
    pc_engine_options_free(NULL);
    pc_warm_free(NULL);
    pc_clock_free(NULL);
    pc_store_free(store);
}

static void oversize(const pc_engine *e) {
    pc_store *store = NULL;
    pc_batch *batch = NULL;
    pc_outcome outcome;
    CHECK(pc_store_open_memory(NULL, &store, NULL));
    static uint8_t big_key[1025];
    memset(big_key, 'k', sizeof big_key);
    CHECK(pc_batch_new(&batch, NULL));
    CHECK(pc_batch_put(batch, big_key, sizeof big_key, S("v"), NULL));
    EXPECT_CODE(pc_store_apply(store, S("p"), batch, &outcome, NULL), PC_TOO_LARGE);
    pc_batch_free(batch);
    CHECK(pc_store_close(store, NULL));
    pc_store_free(store);

    size_t len = 16u << 20; /* above the record limit (16 MiB less 16 bytes) */
    uint8_t *huge = calloc(1, len);
    ASSERT(huge != NULL);
    pc_slice record = {huge, len};
    uint64_t first, last;
    EXPECT_CODE(pc_engine_append(e, "acct", S("x"), &record, 1, &first, &last, NULL), PC_TOO_LARGE);
    free(huge);
    EXPECT_CODE(pc_engine_append(e, "acct", S("x"), NULL, 1, &first, &last, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_append(e, "acct", S("x"), &record, 0, &first, &last, NULL), PC_INVALID_ARGUMENT);
    static uint8_t long_id[129];
    memset(long_id, 'i', sizeof long_id);
    bool created;
    ASSERT(pc_engine_register(e, "acct", long_id, sizeof long_id, &created, NULL) != PC_OK);
    EXPECT_CODE(pc_engine_register(e, "Not A Namespace", S("x"), &created, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_register(e, "\xff\xfe", S("x"), &created, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_register(e, NULL, S("x"), &created, NULL), PC_INVALID_ARGUMENT);
    pc_bytes state = {0};
    EXPECT_CODE(pc_engine_read(e, "acct", S("never-registered"), &state, NULL), PC_UNKNOWN_ENTITY);
}

static void bad_machines(const char *dir) {
    static machine_data data;
    pc_engine_options *o = small_options(dir, NULL);
    pc_engine *e = NULL;
    /* A machine without apply: refused, and destroy still runs once. */
    pc_machine m = counter_machine(&data);
    m.apply = NULL;
    EXPECT_CODE(pc_engine_open(o, &m, &e, NULL), PC_INVALID_ARGUMENT);
    ASSERT(e == NULL && atomic_load(&data.destroyed) == 1);
    /* Null options: refused, destroy runs once more. */
    m = counter_machine(&data);
    EXPECT_CODE(pc_engine_open(NULL, &m, &e, NULL), PC_INVALID_ARGUMENT);
    ASSERT(atomic_load(&data.destroyed) == 2);
    /* Neither a directory nor a store: the library refuses, destroy runs. */
    pc_engine_options *empty = NULL;
    CHECK(pc_engine_options_new(&empty, NULL));
    ASSERT(pc_engine_open(empty, &m, &e, NULL) != PC_OK && e == NULL);
    ASSERT(atomic_load(&data.destroyed) == 3);
    EXPECT_CODE(pc_engine_options_flag(empty, 77, true, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_options_number(empty, 77, 1, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_options_fence(empty, 1000, 0, 1, 1, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_options_own(empty, "BAD", false, NULL), PC_INVALID_ARGUMENT);
    pc_engine_options_free(empty);
    /* A null machine: nothing to destroy. */
    EXPECT_CODE(pc_engine_open(o, NULL, &e, NULL), PC_INVALID_ARGUMENT);
    ASSERT(atomic_load(&data.destroyed) == 3 && atomic_load(&data.live_states) == 0);
    pc_engine_options_free(o);
}

struct reentry {
    const pc_engine *engine;
    uint32_t answer;
};

/* A decision that calls back into the engine for the entity it is deciding for. */
static uint32_t decide_reenter(void *ctx, const void *state, pc_records *out) {
    struct reentry *r = ctx;
    (void)state;
    (void)out;
    pc_bytes bytes = {0};
    r->answer = pc_engine_read(r->engine, "acct", S("a"), &bytes, NULL);
    pc_bytes_free(&bytes);
    return 0;
}

static pc_engine *open_engine(const char *dir, machine_data *data) {
    pc_machine m = counter_machine(data);
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    return e;
}

static void refusals(const char *dir) {
    static machine_data data;
    pc_engine *e = open_engine(dir, &data);
    oversize(e);
    append_value(e, "acct", "a", 1);

    /* validate refuses 13 with code 7: the write answers PC_INVALID_ARGUMENT, writes nothing. */
    atomic_store(&data.refuse_valid_of, 13);
    uint64_t v = 13;
    pc_slice record = {(const uint8_t *)&v, 8};
    uint64_t first, last;
    EXPECT_CODE(pc_engine_append(e, "acct", S("a"), &record, 1, &first, &last, NULL), PC_INVALID_ARGUMENT);
    ASSERT(strstr(last_error(), "code 7") != NULL);
    ASSERT(read_counter(e, "acct", "a").sum == 1);
    atomic_store(&data.refuse_valid_of, 0);

    /* Calling back into the entity being decided for is refused, not a deadlock. */
    struct reentry r = {e, PC_OK};
    pc_written w;
    CHECK(pc_engine_write(e, "acct", S("a"), decide_reenter, &r, &w, NULL));
    ASSERT(r.answer == PC_WOULD_DEADLOCK && !w.wrote);
    EXPECT_CODE(pc_engine_write(e, "acct", S("a"), NULL, NULL, &w, NULL), PC_INVALID_ARGUMENT);

    /* 666 is accepted now; after a restart, apply refuses to replay it with code 42. */
    append_value(e, "acct", "a", 666);
    append_value(e, "acct", "b", 2);
    CHECK(pc_engine_close(e, NULL));
    CHECK(pc_engine_close(e, NULL)); /* closing twice is harmless */
    bool created;
    EXPECT_CODE(pc_engine_register(e, "acct", S("a"), &created, NULL), PC_CLOSED);
    pc_bytes state = {0};
    EXPECT_CODE(pc_engine_read(e, "acct", S("a"), &state, NULL), PC_CLOSED);
    pc_engine_free(e);

    atomic_store(&data.refuse_replay_of, 666);
    e = open_engine(dir, &data);
    EXPECT_CODE(pc_engine_read(e, "acct", S("a"), &state, NULL), PC_CONTAINED);
    ASSERT(strstr(last_error(), "code 42") != NULL);
    /* Every later touch gets the same refusal at once; other entities are unharmed. */
    EXPECT_CODE(pc_engine_append(e, "acct", S("a"), &record, 1, &first, &last, NULL), PC_CONTAINED);
    ASSERT(read_counter(e, "acct", "b").sum == 2);
    pc_engine_stats s = {.struct_size = sizeof(pc_engine_stats)};
    CHECK(pc_engine_get_stats(e, &s, NULL));
    ASSERT(s.contained == 1);
    /* Fixed: release, and the next touch restores it. */
    atomic_store(&data.refuse_replay_of, 0);
    bool released = false;
    CHECK(pc_engine_release(e, "acct", S("a"), &released, NULL));
    ASSERT(released);
    ASSERT(read_counter(e, "acct", "a").sum == 667);
    CHECK(pc_engine_release(e, "acct", S("a"), &released, NULL));
    ASSERT(!released);
    pc_engine_free(e); /* free without close: it closes first */
    ASSERT(atomic_load(&data.destroyed) == 2 && atomic_load(&data.live_states) == 0);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    messages();
    null_arguments();
    bad_machines(argv[1]);
    refusals(argv[1]);
    printf("misuse: ok\n");
    return 0;
}
