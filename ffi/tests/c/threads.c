/* Many pthreads drive one engine at once while a warm runs the state machine's callbacks on
 * the engine's pool: appends, reads and deferred work touch pending entities concurrently.
 * Each entity's state is used by one thread at a time, every record is folded exactly once,
 * and entities only the warm touches are restored on pool threads. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "counter.h"

enum { SHARED = 16, WARM_ONLY = 8, THREADS = 6, OPS = 24, FIRST_RECORDS = 3 };

static _Thread_local int client_thread; /* set on main and on the threads below */
static atomic_long pool_applies;
static atomic_long expected[SHARED];
static pc_engine *engine;
static pthread_barrier_t start;

static uint32_t apply_counting_threads(void *user_data, void *state, const pc_apply_context *ctx,
                                       const uint8_t *record, size_t len) {
    if (!client_thread) {
        atomic_fetch_add(&pool_applies, 1);
    }
    return counter_apply(user_data, state, ctx, record, len);
}

static void entity_name(char *buf, size_t size, int i) {
    snprintf(buf, size, "e%02d", i);
}

static void *client(void *arg) {
    int t = (int)(intptr_t)arg;
    char id[16];
    client_thread = 1;
    pthread_barrier_wait(&start);
    for (int j = 0; j < OPS; j++) {
        int i = (t * 5 + j * 3) % SHARED;
        entity_name(id, sizeof id, i);
        uint64_t v = 1;
        switch (j % 3) {
        case 0:
            append_value(engine, "load", id, v);
            atomic_fetch_add(&expected[i], 1);
            break;
        case 1: {
            pc_deferred d;
            CHECK(pc_engine_defer(engine, "load", S(id), NULL, 0, (const uint8_t *)&v, 8, &d, NULL));
            ASSERT(d.kind == PC_DEFERRED_QUEUED || d.kind == PC_DEFERRED_APPLIED);
            atomic_fetch_add(&expected[i], 1);
            break;
        }
        default: {
            counter c = read_counter(engine, "load", id);
            ASSERT(c.sum >= FIRST_RECORDS);
            break;
        }
        }
    }
    return NULL;
}

static pc_engine *open_engine(const char *dir, machine_data *data) {
    pc_machine m = counter_machine(data);
    m.apply = apply_counting_threads;
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_sync_policy(o, PC_SYNC_NEVER_MAY_LOSE_RECENT, 0, NULL));
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    CHECK(pc_engine_options_number(o, PC_WARM_PARALLELISM, 2, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    return e;
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    static machine_data data;
    client_thread = 1;
    char id[16];

    engine = open_engine(argv[1], &data);
    for (int i = 0; i < SHARED + WARM_ONLY; i++) {
        entity_name(id, sizeof id, i);
        for (int r = 0; r < FIRST_RECORDS; r++) {
            append_value(engine, "load", id, 1);
        }
    }
    CHECK(pc_engine_close(engine, NULL));
    pc_engine_free(engine);

    /* Restart: everything pending; a warm and the clients race for the entities. */
    engine = open_engine(argv[1], &data);
    pc_warm *warm = NULL;
    CHECK(pc_engine_warm(engine, &warm, NULL));
    pthread_t threads[THREADS];
    ASSERT(pthread_barrier_init(&start, NULL, THREADS) == 0);
    for (int t = 0; t < THREADS; t++) {
        ASSERT(pthread_create(&threads[t], NULL, client, (void *)(intptr_t)t) == 0);
    }
    for (int t = 0; t < THREADS; t++) {
        ASSERT(pthread_join(threads[t], NULL) == 0);
    }
    pthread_barrier_destroy(&start);
    bool finished = false;
    CHECK(pc_warm_wait(warm, 120000, &finished, NULL));
    ASSERT(finished);
    pc_warm_progress p = {.struct_size = sizeof(pc_warm_progress)};
    CHECK(pc_warm_get_progress(warm, &p, NULL));
    ASSERT(p.refused == 0 && p.done == p.total);
    pc_warm_free(warm);

    for (int i = 0; i < SHARED + WARM_ONLY; i++) {
        entity_name(id, sizeof id, i);
        counter c = read_counter(engine, "load", id);
        uint64_t want = FIRST_RECORDS + (uint64_t)(i < SHARED ? atomic_load(&expected[i]) : 0);
        if (c.sum != want || c.records != want) {
            fprintf(stderr, "%s: sum %llu records %llu, expected %llu\n", id,
                    (unsigned long long)c.sum, (unsigned long long)c.records,
                    (unsigned long long)want);
            return 1;
        }
    }
    pc_engine_stats s = {.struct_size = sizeof(pc_engine_stats)};
    CHECK(pc_engine_get_stats(engine, &s, NULL));
    ASSERT(s.restored == SHARED + WARM_ONLY && s.units_run == SHARED + WARM_ONLY);
    ASSERT(atomic_load(&data.violations) == 0);
    ASSERT(atomic_load(&pool_applies) >= WARM_ONLY * FIRST_RECORDS);
    CHECK(pc_engine_close(engine, NULL));
    pc_engine_free(engine);
    ASSERT(atomic_load(&data.destroyed) == 2 && atomic_load(&data.live_states) == 0);
    printf("threads: ok\n");
    return 0;
}
