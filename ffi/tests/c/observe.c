/* Observability through C (SPEC E8): an engine's listener hears a refusal and calls back into
 * the engine from the callback (no lock is held there); the engine's and the store's stats
 * and degraded reasons; a store's listener hears the torn tail its open truncated. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <pthread.h>

#include "counter.h"

typedef struct heard {
    pthread_mutex_t lock;
    const pc_engine *engine; /* called back from the listener, when set */
    int events;
    uint32_t kinds[16];
    char subject[64];
    uint64_t entities_seen_from_callback;
} heard;

static void on_event(void *user_data, const pc_event *event) {
    heard *h = user_data;
    ASSERT(event->struct_size >= offsetof(pc_event, epoch) + sizeof event->epoch);
    ASSERT(event->name != NULL && event->subject != NULL && event->message != NULL);
    ASSERT(strlen(event->message) > 0);
    if (h->engine != NULL) {
        /* No lock of the library is held: calling back into the engine is fine. */
        pc_engine_stats s = {.struct_size = sizeof s};
        CHECK(pc_engine_get_stats(h->engine, &s, NULL));
        pthread_mutex_lock(&h->lock);
        h->entities_seen_from_callback = s.entities;
        pthread_mutex_unlock(&h->lock);
    }
    pthread_mutex_lock(&h->lock);
    if (h->events < 16) {
        h->kinds[h->events] = event->kind;
    }
    h->events++;
    snprintf(h->subject, sizeof h->subject, "%s", event->subject);
    pthread_mutex_unlock(&h->lock);
}

static void engine_events_and_stats(const char *dir) {
    static machine_data data;
    static heard h = {.lock = PTHREAD_MUTEX_INITIALIZER};
    atomic_store(&data.refuse_check_of, 5); /* a record 5 is refused until the sum reaches 5 */
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    CHECK(pc_engine_options_listener(o, on_event, &h, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    h.engine = e;

    append_value(e, "acct", "a", 1);
    ASSERT(read_counter(e, "acct", "a").sum == 1);
    ASSERT(h.events == 0); /* a healthy engine says nothing */
    uint64_t five = 5;
    pc_slice record = {(const uint8_t *)&five, sizeof five};
    uint64_t first = 0, last = 0;
    EXPECT_CODE(pc_engine_append(e, "acct", S("a"), &record, 1, &first, &last, NULL), PC_REFUSED);
    /* Told before the call returned, and the callback read the stats. */
    pthread_mutex_lock(&h.lock);
    ASSERT(h.events == 1 && h.kinds[0] == PC_EVENT_REFUSED);
    ASSERT(strcmp(h.subject, "acct/a") == 0);
    ASSERT(h.entities_seen_from_callback == 1);
    pthread_mutex_unlock(&h.lock);

    pc_engine_stats s = {.struct_size = sizeof s};
    CHECK(pc_engine_get_stats(e, &s, NULL));
    ASSERT(s.degraded == 0);
    ASSERT(s.namespaces == 1);
    ASSERT(s.store_sync_count >= 1 && s.store_sync_max_us * s.store_sync_count >= s.store_sync_total_us);
    pc_degraded_cause cause = 99;
    pc_bytes reason = {0};
    CHECK(pc_engine_degraded(e, &cause, &reason, NULL));
    ASSERT(cause == 0 && reason.len == 0);
    pc_bytes_free(&reason);
    EXPECT_CODE(pc_engine_degraded(e, &cause, (pc_bytes *)&cause, NULL), PC_INVALID_ARGUMENT);

    CHECK(pc_engine_close(e, NULL));
    pc_engine_free(e);
}

/* Appends garbage after the last record of the newest journal segment: a torn write. */
static void tear_the_tail(const char *dir) {
    char journal[4200];
    snprintf(journal, sizeof journal, "%s/journal", dir);
    DIR *d = opendir(journal);
    ASSERT(d != NULL);
    char newest[256] = "";
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (strstr(entry->d_name, ".seg") != NULL && strcmp(entry->d_name, newest) > 0) {
            snprintf(newest, sizeof newest, "%s", entry->d_name);
        }
    }
    closedir(d);
    ASSERT(newest[0] != '\0');
    char path[4500];
    snprintf(path, sizeof path, "%s/%s", journal, newest);
    FILE *f = fopen(path, "ab");
    ASSERT(f != NULL);
    unsigned char garbage[40];
    memset(garbage, 0xAB, sizeof garbage);
    ASSERT(fwrite(garbage, 1, sizeof garbage, f) == sizeof garbage);
    fclose(f);
}

static void store_events_and_stats(const char *dir) {
    pc_store *store = NULL;
    CHECK(pc_store_open_file(dir, PC_SYNC_EVERY_COMMIT, 0, NULL, &store, NULL));
    pc_batch *batch = NULL;
    pc_outcome outcome;
    CHECK(pc_batch_new(&batch, NULL));
    CHECK(pc_batch_put(batch, S("k"), S("v"), NULL));
    CHECK(pc_store_apply(store, S("p"), batch, &outcome, NULL));
    pc_batch_free(batch);
    pc_store_stats s = {.struct_size = sizeof s};
    CHECK(pc_store_get_stats(store, &s, NULL));
    ASSERT(s.batches == 1 && s.degraded == 0 && s.sync_count >= 1);
    CHECK(pc_store_close(store, NULL));
    pc_store_free(store);

    tear_the_tail(dir);
    static heard h = {.lock = PTHREAD_MUTEX_INITIALIZER};
    CHECK(pc_store_open_file_listened(dir, PC_SYNC_EVERY_COMMIT, 0, NULL, on_event, &h, &store,
                                      NULL));
    pthread_mutex_lock(&h.lock);
    ASSERT(h.events == 1 && h.kinds[0] == PC_EVENT_TORN_TAIL);
    pthread_mutex_unlock(&h.lock);
    pc_degraded_cause cause = 99;
    pc_bytes reason = {0};
    CHECK(pc_store_degraded(store, &cause, &reason, NULL));
    ASSERT(cause == 0 && reason.len == 0);
    CHECK(pc_store_close(store, NULL));
    pc_store_free(store);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    char engine_dir[4096], store_dir[4096];
    snprintf(engine_dir, sizeof engine_dir, "%s/engine", argv[1]);
    snprintf(store_dir, sizeof store_dir, "%s/store", argv[1]);
    engine_events_and_stats(engine_dir);
    store_events_and_stats(store_dir);
    printf("observe: ok\n");
    return 0;
}
