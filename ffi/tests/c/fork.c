/* Fork: a child never writes on behalf of the store or engine its parent opened. Every call
 * on an inherited handle answers PC_CLOSED (freeing one only forgets it), so a child that
 * closes what it inherited cannot write a snapshot or trim the journal to its own stale view,
 * and the parent's acknowledged writes survive. The child may open stores of its own. */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "counter.h"

static int child(const char *dir, pc_engine *e, pc_store *store) {
    char own[4096];
    snprintf(own, sizeof own, "%s/child-store", dir);
    bool created;
    EXPECT_CODE(pc_engine_register(e, "acct", S("c"), &created, NULL), PC_CLOSED);
    ASSERT(strstr(last_error(), "fork") != NULL);
    uint64_t v = 7;
    pc_slice record = {(const uint8_t *)&v, sizeof v};
    uint64_t first, last;
    EXPECT_CODE(pc_engine_append(e, "acct", S("a"), &record, 1, &first, &last, NULL), PC_CLOSED);
    EXPECT_CODE(pc_engine_close(e, NULL), PC_CLOSED);
    EXPECT_CODE(pc_store_close(store, NULL), PC_CLOSED);
    pc_engine_free(e);  /* forgets it: no close, no write */
    pc_store_free(store);
    /* A store of its own works. */
    pc_store *mine = NULL;
    CHECK(pc_store_open_file(own, PC_SYNC_EVERY_COMMIT, 0, NULL, &mine, NULL));
    CHECK(pc_store_close(mine, NULL));
    pc_store_free(mine);
    return 0;
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    char engine_dir[4096], store_dir[4096];
    snprintf(engine_dir, sizeof engine_dir, "%s/engine", argv[1]);
    snprintf(store_dir, sizeof store_dir, "%s/store", argv[1]);
    static machine_data data;
    pc_machine m = counter_machine(&data);
    pc_engine_options *o = small_options(engine_dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_store *store = NULL;
    CHECK(pc_store_open_file(store_dir, PC_SYNC_EVERY_COMMIT, 0, NULL, &store, NULL));
    append_value(e, "acct", "a", 1);

    /* The child reports through a pipe: its exit status under valgrind counts the engine it
     * forgot (by design) as lost memory. */
    int report[2];
    ASSERT(pipe(report) == 0);
    fflush(stdout);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(report[0]);
        if (child(argv[1], e, store) == 0) {
            ASSERT(write(report[1], "k", 1) == 1);
        }
        _exit(0);
    }
    close(report[1]);
    char said = 0;
    ASSERT(read(report[0], &said, 1) == 1 && said == 'k');
    close(report[0]);
    int status = 0;
    ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status));

    /* The parent goes on: its writes after the fork, and before, all survive a reopen. */
    append_value(e, "acct", "a", 2);
    pc_batch *batch = NULL;
    CHECK(pc_batch_new(&batch, NULL));
    CHECK(pc_batch_put(batch, S("k"), S("v"), NULL));
    pc_outcome outcome;
    CHECK(pc_store_apply(store, S("p"), batch, &outcome, NULL));
    pc_batch_free(batch);
    CHECK(pc_store_close(store, NULL));
    pc_store_free(store);
    pc_engine_free(e);

    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    counter c = read_counter(e, "acct", "a");
    ASSERT(c.sum == 3 && c.records == 2);
    pc_engine_free(e);
    ASSERT(atomic_load(&data.destroyed) == 2 && atomic_load(&data.live_states) == 0);
    printf("fork: ok\n");
    return 0;
}
