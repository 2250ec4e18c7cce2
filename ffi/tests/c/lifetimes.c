/* Lifetimes and holes at the boundary: a warm handle outliving its engine (pc_engine_free
 * still frees every state and runs destroy before it returns, and the warm handle answers
 * without calling the machine), waiting for a warm or closing the engine from a write's
 * decision (PC_WOULD_DEADLOCK at once), a null buffer with a length, one pointer passed for
 * two outputs, and a failing call during thread teardown. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "counter.h"

enum { ENTITIES = 40 };

static void history(const char *dir) {
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    char id[16];
    for (int i = 0; i < ENTITIES; i++) {
        snprintf(id, sizeof id, "e%02d", i);
        append_value(e, "acct", id, (uint64_t)i + 1);
    }
    ASSERT(read_counter(e, "acct", "e07").sum == 8);
    pc_engine_free(e);
}

/* pc_engine_free runs destroy and frees every state before it returns, even while a warm
 * handle is alive; the warm handle then answers from what it knew, and calls nothing. */
static void warm_outlives_engine(const char *dir) {
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(dir, NULL);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    pc_warm *warm = NULL;
    CHECK(pc_engine_warm(e, &warm, NULL));
    pc_engine_free(e);
    ASSERT(atomic_load(&data.destroyed) == 1);
    ASSERT(atomic_load(&data.live_states) == 0);
    long applies = atomic_load(&data.applies);
    bool finished = false;
    CHECK(pc_warm_wait(warm, 60000, &finished, NULL));
    ASSERT(finished);
    pc_warm_progress p = {.struct_size = sizeof(pc_warm_progress)};
    CHECK(pc_warm_get_progress(warm, &p, NULL));
    ASSERT(p.finished && p.total == ENTITIES && p.done <= p.total);
    CHECK(pc_warm_stop(warm, NULL));
    pc_warm_free(warm);
    ASSERT(atomic_load(&data.applies) == applies && atomic_load(&data.destroyed) == 1);
}

struct inside {
    const pc_engine *engine;
    const pc_warm *warm;
    uint32_t wait_answer;
    uint32_t close_answer;
};

/* A decision that waits for the warm and closes the engine: both would wait for itself. */
static uint32_t decide_wait_and_close(void *ctx, const void *state, pc_records *out) {
    struct inside *in = ctx;
    (void)state;
    (void)out;
    bool finished = false;
    in->wait_answer = pc_warm_wait(in->warm, 600000, &finished, NULL);
    in->close_answer = pc_engine_close(in->engine, NULL);
    return 0;
}

static void waits_from_a_callback(const char *dir) {
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(dir, NULL);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    pc_warm *warm = NULL;
    CHECK(pc_engine_warm(e, &warm, NULL));
    struct inside in = {e, warm, PC_OK, PC_OK};
    pc_written w;
    CHECK(pc_engine_write(e, "acct", S("e00"), decide_wait_and_close, &in, &w, NULL));
    EXPECT_CODE(in.wait_answer, PC_WOULD_DEADLOCK);
    EXPECT_CODE(in.close_answer, PC_WOULD_DEADLOCK);
    bool finished = false;
    CHECK(pc_warm_wait(warm, 60000, &finished, NULL));
    ASSERT(finished);
    pc_warm_free(warm);
    CHECK(pc_engine_close(e, NULL));
    pc_engine_free(e);
    ASSERT(atomic_load(&data.destroyed) == 1 && atomic_load(&data.live_states) == 0);
}

/* A null buffer with a non-zero length is refused, never read as "absent". */
static void null_with_a_length(const char *dir) {
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(dir, NULL);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    uint64_t v = 5;
    pc_deferred d;
    EXPECT_CODE(pc_engine_defer(e, "acct", S("e01"), NULL, 4, (const uint8_t *)&v, 8, &d, NULL),
                PC_INVALID_ARGUMENT);
    pc_engine_free(e);

    pc_store *store = NULL;
    CHECK(pc_store_open_memory(NULL, &store, NULL));
    pc_scan_page *page = NULL;
    EXPECT_CODE(pc_store_scan(store, S("p"), NULL, 3, NULL, 0, NULL, 0, 10, &page, NULL),
                PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_scan(store, S("p"), NULL, 0, NULL, 3, NULL, 0, 10, &page, NULL),
                PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_store_scan(store, S("p"), NULL, 0, NULL, 0, NULL, 3, 10, &page, NULL),
                PC_INVALID_ARGUMENT);
    ASSERT(page == NULL);
    pc_store_free(store);
}

/* One pointer passed for two outputs is refused (it would be two mutable references). */
static void one_pointer_for_two_outputs(const char *dir) {
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(dir, NULL);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    uint64_t v = 5, seq = 0;
    pc_slice record = {(const uint8_t *)&v, sizeof v};
    EXPECT_CODE(pc_engine_append(e, "acct", S("e01"), &record, 1, &seq, &seq, NULL),
                PC_INVALID_ARGUMENT);
    pc_engine_free(e);
}

static pthread_key_t teardown_key;
static atomic_int teardown_answer;

/* Runs while the thread ends, after the library's thread-locals were destroyed. */
static void at_thread_end(void *value) {
    (void)value;
    atomic_store(&teardown_answer, (int)pc_engine_close(NULL, NULL));
}

static void *ending_thread(void *arg) {
    (void)arg;
    EXPECT_CODE(pc_engine_close(NULL, NULL), PC_INVALID_ARGUMENT); /* makes its last error */
    pthread_setspecific(teardown_key, &teardown_key);
    return NULL;
}

/* A failing call during thread teardown answers its code instead of aborting. */
static void a_call_during_thread_teardown(void) {
    ASSERT(pthread_key_create(&teardown_key, at_thread_end) == 0);
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, ending_thread, NULL) == 0);
    ASSERT(pthread_join(t, NULL) == 0);
    ASSERT(atomic_load(&teardown_answer) == PC_INVALID_ARGUMENT);
    pthread_key_delete(teardown_key);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    history(argv[1]);
    a_call_during_thread_teardown();
    null_with_a_length(argv[1]);
    one_pointer_for_two_outputs(argv[1]);
    waits_from_a_callback(argv[1]);
    warm_outlives_engine(argv[1]);
    printf("lifetimes: ok\n");
    return 0;
}
