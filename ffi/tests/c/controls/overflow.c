/* Negative control: reads one byte past a buffer the library returned. Both lanes must fail. */
#include "../check.h"

int main(int argc, char **argv) {
    ASSERT(argc == 2 && argv[1] != NULL);
    pc_store *store = NULL;
    pc_batch *batch = NULL;
    pc_outcome outcome;
    CHECK(pc_store_open_memory(NULL, &store, NULL));
    CHECK(pc_batch_new(&batch, NULL));
    CHECK(pc_batch_put(batch, S("k"), S("0123456789abcdef"), NULL));
    CHECK(pc_store_apply(store, S("p"), batch, &outcome, NULL));
    pc_batch_free(batch);
    pc_bytes value = {0};
    bool found;
    CHECK(pc_store_get(store, S("p"), S("k"), &value, &found, NULL));
    volatile uint8_t past = value.data[value.len]; /* out of bounds */
    if (past == 0x5a) {
        printf("(byte past the end)\n");
    }
    pc_bytes_free(&value);
    pc_store_free(store);
    printf("overflow: ok\n");
    return 0;
}
