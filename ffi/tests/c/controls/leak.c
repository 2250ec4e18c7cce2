/* Negative control: leaks a buffer the library returned. Both lanes must fail it. */
#include "../check.h"

int main(int argc, char **argv) {
    ASSERT(argc == 2 && argv[1] != NULL);
    pc_store *store = NULL;
    pc_batch *batch = NULL;
    pc_outcome outcome;
    CHECK(pc_store_open_memory(NULL, &store, NULL));
    CHECK(pc_batch_new(&batch, NULL));
    CHECK(pc_batch_put(batch, S("k"), S("a value long enough to be a heap block"), NULL));
    CHECK(pc_store_apply(store, S("p"), batch, &outcome, NULL));
    pc_batch_free(batch);
    pc_bytes value = {0};
    bool found;
    CHECK(pc_store_get(store, S("p"), S("k"), &value, &found, NULL));
    value.data = NULL; /* the only pointer to the buffer is gone: never freed */
    pc_store_free(store);
    printf("leak: ok\n");
    return 0;
}
