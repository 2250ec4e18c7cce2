/* A boundary that can evolve: the version functions; a pc_machine compiled against an older
 * header (ending before `check`, in a buffer of exactly that size) and one from a newer header
 * (bytes this library does not know must be zero); output structs written only up to the
 * caller's struct_size; constant families that refuse each other's values; error objects the
 * caller owns, filled in one thread and read in another; the log callback. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stddef.h>

#include "counter.h"

static void versions(void) {
    ASSERT(pc_abi_version() == PC_ABI_VERSION);
    const char *v = pc_version();
    ASSERT(v != NULL && strchr(v, '.') != NULL);
}

static pc_engine_options *options_over(const char *dir) {
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    return o;
}

/* A caller compiled before `check` existed: its struct ends before the field, and the library
 * reads no byte past it (AddressSanitizer and valgrind watch the buffer's end). */
static void an_older_machine(const char *dir) {
    static machine_data data;
    atomic_store(&data.refuse_check_of, 5); /* would refuse, if check were read */
    pc_machine full = counter_machine(&data);
    size_t old_size = offsetof(pc_machine, check);
    pc_machine *old = malloc(old_size);
    ASSERT(old != NULL);
    memcpy(old, &full, old_size);
    old->struct_size = old_size;
    pc_engine_options *o = options_over(dir);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, old, &e, NULL));
    free(old);
    append_value(e, "acct", "old", 5); /* no check: written */
    ASSERT(read_counter(e, "acct", "old").sum == 5);
    pc_engine_free(e);
    ASSERT(atomic_load(&data.destroyed) == 1);

    /* A newer caller's struct: unknown trailing bytes that are zero are fine ... */
    size_t new_size = sizeof(pc_machine) + 16;
    unsigned char *newer = calloc(1, new_size);
    ASSERT(newer != NULL);
    memcpy(newer, &full, sizeof full);
    ((pc_machine *)newer)->struct_size = new_size;
    CHECK(pc_engine_open(o, (pc_machine *)newer, &e, NULL));
    pc_engine_free(e);
    ASSERT(atomic_load(&data.destroyed) == 2);
    /* ... a callback this library does not know is refused, never ignored (destroy runs). */
    newer[new_size - 1] = 1;
    pc_error *err = NULL;
    CHECK(pc_error_new(&err));
    EXPECT_CODE(pc_engine_open(o, (pc_machine *)newer, &e, err), PC_INVALID_ARGUMENT);
    ASSERT(strstr(pc_error_message(err), "newer library") != NULL);
    ASSERT(atomic_load(&data.destroyed) == 3);
    /* struct_size unset (zero): refused, destroy is not read from a struct not understood. */
    pc_machine zero = counter_machine(&data);
    zero.struct_size = 0;
    EXPECT_CODE(pc_engine_open(o, &zero, &e, err), PC_INVALID_ARGUMENT);
    ASSERT(strstr(pc_error_message(err), "struct_size") != NULL);
    free(newer);
    pc_error_free(err);
    pc_engine_options_free(o);
}

/* Output structs are written only up to the caller's struct_size. */
static void smaller_outputs(const char *dir) {
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = options_over(dir);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    size_t old_stats = offsetof(pc_engine_stats, store_partitions);
    pc_engine_stats *s = malloc(old_stats);
    ASSERT(s != NULL);
    s->struct_size = old_stats;
    CHECK(pc_engine_get_stats(e, s, NULL));
    ASSERT(s->struct_size == old_stats && s->entities >= 1 && s->incarnation >= 1);
    free(s);
    pc_engine_stats unset = {0};
    EXPECT_CODE(pc_engine_get_stats(e, &unset, NULL), PC_INVALID_ARGUMENT);
    pc_warm *warm = NULL;
    CHECK(pc_engine_warm(e, &warm, NULL));
    size_t old_progress = offsetof(pc_warm_progress, finished);
    pc_warm_progress *p = malloc(old_progress);
    ASSERT(p != NULL);
    p->struct_size = old_progress;
    CHECK(pc_warm_get_progress(warm, p, NULL));
    free(p);
    pc_warm_free(warm);
    pc_engine_free(e);
}

/* A value of one family passed where another is expected is refused. */
static void families(void) {
    pc_engine_options *o = NULL;
    CHECK(pc_engine_options_new(&o, NULL));
    EXPECT_CODE(pc_engine_options_flag(o, PC_POOL_THREADS, true, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_options_number(o, PC_WARM_ON_OPEN, 1, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_options_sync_policy(o, PC_LOG_WARN, 0, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_options_number(o, PC_SYNC_EVERY_COMMIT, 1, NULL), PC_INVALID_ARGUMENT);
    CHECK(pc_engine_options_flag(o, PC_WARM_ON_OPEN, false, NULL));
    CHECK(pc_engine_options_number(o, PC_POOL_STACK_SIZE, 8u << 20, NULL));
    CHECK(pc_engine_options_number(o, PC_MAX_RESIDENT_ENTITIES, 100, NULL));
    pc_store *store = NULL;
    EXPECT_CODE(pc_store_open_file("/nonexistent", PC_OUTCOME_COMMITTED, 0, NULL, &store, NULL),
                PC_INVALID_ARGUMENT);
    ASSERT(strstr(last_error(), "PC_OUTCOME_") != NULL);
    pc_engine_options_free(o);
}

struct handoff {
    pc_error *err;
    uint32_t code;
    char message[256];
};

/* Reads an error object another thread filled. */
static void *read_elsewhere(void *arg) {
    struct handoff *h = arg;
    h->code = pc_error_code(h->err);
    snprintf(h->message, sizeof h->message, "%s", pc_error_message(h->err));
    return NULL;
}

static void error_objects(const char *dir) {
    pc_error *err = NULL;
    CHECK(pc_error_new(&err));
    ASSERT(pc_error_code(err) == PC_OK && strcmp(pc_error_message(err), "") == 0);
    EXPECT_CODE(pc_engine_close(NULL, err), PC_INVALID_ARGUMENT);
    ASSERT(pc_error_code(err) == PC_INVALID_ARGUMENT);
    ASSERT(strstr(pc_error_message(err), "engine") != NULL);
    /* Read on another thread: the object, not the thread, carries the error. */
    struct handoff h = {err, 0, ""};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, read_elsewhere, &h) == 0);
    ASSERT(pthread_join(t, NULL) == 0);
    ASSERT(h.code == PC_INVALID_ARGUMENT && strstr(h.message, "engine") != NULL);

    /* The refusing callback's code, and its reason in the message. */
    static machine_data data;
    atomic_store(&data.refuse_check_of, 50);
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = options_over(dir);
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, err));
    ASSERT(pc_error_code(err) == PC_OK); /* a success resets it */
    pc_engine_options_free(o);
    uint64_t v = 50, first, last;
    pc_slice record = {(const uint8_t *)&v, 8};
    EXPECT_CODE(pc_engine_append(e, "acct", S("x"), &record, 1, &first, &last, err), PC_REFUSED);
    ASSERT(pc_error_callback_code(err) == 11);
    ASSERT(strstr(pc_error_message(err), "not before the sum reaches it") != NULL);
    ASSERT(pc_error_retry_after_ms(err) == 0);
    /* The thread's last error holds the same failure. */
    pc_error *last_one = NULL;
    CHECK(pc_error_new(&last_one));
    CHECK(pc_error_last(last_one));
    ASSERT(pc_error_code(last_one) == PC_REFUSED && pc_error_callback_code(last_one) == 11);
    pc_error_free(last_one);
    pc_engine_free(e);
    pc_error_free(err);
    pc_error_free(NULL);
    ASSERT(pc_error_code(NULL) == PC_OK);
}

static atomic_int warnings;
static atomic_int encode_said;

static void on_log(void *user_data, pc_log_level level, const char *target, const char *message) {
    ASSERT(user_data == &warnings && target != NULL);
    if (level == PC_LOG_WARN) {
        atomic_fetch_add(&warnings, 1);
        if (strstr(message, "this sum does not encode") != NULL) {
            atomic_fetch_add(&encode_said, 1);
        }
    }
}

/* A background failure (a checkpoint owed after a write that encode refused) reaches the log
 * callback, and the write stays committed. */
static void log_callback(const char *dir) {
    EXPECT_CODE(pc_log_callback(on_log, &warnings, PC_SYNC_EVERY_COMMIT, NULL),
                PC_INVALID_ARGUMENT);
    CHECK(pc_log_callback(on_log, &warnings, PC_LOG_WARN, NULL));
    static machine_data data;
    atomic_store(&data.refuse_encode_of, 3);
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = options_over(dir);
    CHECK(pc_engine_options_number(o, PC_CHECKPOINT_EVERY, 1, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    append_value(e, "acct", "logged", 1);
    ASSERT(append_value(e, "acct", "logged", 2) == 2); /* sum 3: the owed checkpoint is refused */
    ASSERT(atomic_load(&encode_said) == 1);
    atomic_store(&data.refuse_encode_of, 0);
    ASSERT(read_counter(e, "acct", "logged").sum == 3);
    pc_engine_free(e);
    CHECK(pc_log_callback(NULL, NULL, PC_LOG_WARN, NULL));
    int seen = atomic_load(&warnings);
    EXPECT_CODE(pc_engine_close(NULL, NULL), PC_INVALID_ARGUMENT);
    ASSERT(atomic_load(&warnings) == seen); /* off: never called again */
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    versions();
    an_older_machine(argv[1]);
    smaller_outputs(argv[1]);
    families();
    error_objects(argv[1]);
    log_callback(argv[1]);
    printf("evolve: ok\n");
    return 0;
}
