/* The calls beside the basics, and every callback's refusal: list the entities, read an
 * entity's history a page at a time, ask whether an entity is contained and why, visit a state
 * without encoding it, bound the resident entities; `check` refusing a write, `encode`
 * refusing a checkpoint (nothing published: the entity restores from its history) and a read,
 * `fresh` refusing (the entity is contained with the reason). */
#include "counter.h"

static pc_engine *open_with(const char *dir, machine_data *data, uint64_t max_resident) {
    pc_machine m = counter_machine(data);
    pc_engine_options *o = small_options(dir, NULL);
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    if (max_resident != 0) {
        CHECK(pc_engine_options_number(o, PC_MAX_RESIDENT_ENTITIES, max_resident, NULL));
    }
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, &m, &e, NULL));
    pc_engine_options_free(o);
    return e;
}

static uint32_t visit_sum(void *ctx, const void *state) {
    *(uint64_t *)ctx = ((const counter *)state)->sum;
    return 7;
}

static void listing_history_and_visits(const char *dir) {
    static machine_data data;
    pc_engine *e = open_with(dir, &data, 2);
    for (uint64_t i = 1; i <= 5; i++) {
        append_value(e, "acct", "h", i);
    }
    append_value(e, "acct", "a", 1);
    append_value(e, "other", "z", 1);

    pc_entity_list *list = NULL;
    CHECK(pc_engine_entities(e, &list, NULL));
    ASSERT(pc_entity_list_len(list) == 3);
    pc_entity_view v;
    CHECK(pc_entity_list_get(list, 0, &v, NULL));
    ASSERT(v.ns_len == 4 && memcmp(v.ns, "acct", 4) == 0 && v.ns[4] == 0);
    ASSERT(v.id_len == 1 && v.id[0] == 'a');
    CHECK(pc_entity_list_get(list, 2, &v, NULL));
    ASSERT(strcmp((const char *)v.ns, "other") == 0); /* NUL-terminated: usable as ns */
    bool contained = true;
    pc_bytes reason = {0};
    CHECK(pc_engine_containment(e, (const char *)v.ns, v.id, v.id_len, &contained, &reason,
                                NULL));
    ASSERT(!contained && reason.len == 0);
    EXPECT_CODE(pc_entity_list_get(list, 3, &v, NULL), PC_INVALID_ARGUMENT);
    pc_entity_list_free(list);
    pc_entity_list_free(NULL);

    /* History in pages of two, from seq 2. */
    uint64_t next = 2, seen = 0, total = 0;
    bool more = true;
    while (more) {
        pc_history_page *page = NULL;
        CHECK(pc_engine_history(e, "acct", S("h"), next, 2, &page, NULL));
        for (size_t i = 0; i < pc_history_page_len(page); i++) {
            uint64_t seq;
            const uint8_t *data_ptr;
            size_t len;
            CHECK(pc_history_page_record(page, i, &seq, &data_ptr, &len, NULL));
            ASSERT(seq == next + i && len == 8);
            uint64_t value;
            memcpy(&value, data_ptr, 8);
            ASSERT(value == seq);
            seen++;
            total += value;
        }
        CHECK(pc_history_page_next(page, &more, &next, NULL));
        pc_history_page_free(page);
    }
    ASSERT(seen == 4 && total == 2 + 3 + 4 + 5);
    pc_history_page *page = NULL;
    EXPECT_CODE(pc_engine_history(e, "acct", S("h"), 1, 0, &page, NULL), PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_engine_history(e, "acct", S("nobody"), 1, 5, &page, NULL),
                PC_UNKNOWN_ENTITY);

    /* A visit reads the state in place; its code comes back. */
    uint64_t sum = 0;
    uint32_t result = 0;
    CHECK(pc_engine_visit(e, "acct", S("h"), visit_sum, &sum, &result, NULL));
    ASSERT(sum == 15 && result == 7);
    EXPECT_CODE(pc_engine_visit(e, "acct", S("h"), NULL, &sum, &result, NULL),
                PC_INVALID_ARGUMENT);

    /* At most two entities stay resident. */
    pc_engine_stats s = {.struct_size = sizeof s};
    CHECK(pc_engine_get_stats(e, &s, NULL));
    ASSERT(s.resident <= 2 && s.passivated >= 1);
    pc_engine_free(e);
    ASSERT(atomic_load(&data.live_states) == 0);
}

static void refusals(const char *dir) {
    static machine_data data;
    pc_error *err = NULL;
    CHECK(pc_error_new(&err));
    pc_engine *e = open_with(dir, &data, 0);
    append_value(e, "acct", "c", 4);

    /* check: refused before writing, nothing written, the entity keeps serving. */
    atomic_store(&data.refuse_check_of, 10);
    uint64_t v = 10, first, last;
    pc_slice record = {(const uint8_t *)&v, 8};
    EXPECT_CODE(pc_engine_append(e, "acct", S("c"), &record, 1, &first, &last, err),
                PC_REFUSED);
    ASSERT(pc_error_callback_code(err) == 11);
    ASSERT(strstr(pc_error_message(err), "check refused record 2") != NULL);
    pc_deferred d;
    EXPECT_CODE(pc_engine_defer(e, "acct", S("c"), NULL, 0, (const uint8_t *)&v, 8, &d, err),
                PC_REFUSED);
    atomic_store(&data.refuse_check_of, 0);
    ASSERT(read_counter(e, "acct", "c").sum == 4);

    /* encode: a refused checkpoint publishes nothing; a read through encode is refused too,
     * a visit still works. */
    uint64_t seq = 0;
    CHECK(pc_engine_checkpoint(e, "acct", S("c"), &seq, NULL));
    ASSERT(seq == 1);
    append_value(e, "acct", "c", 5); /* sum 9 */
    atomic_store(&data.refuse_encode_of, 9);
    EXPECT_CODE(pc_engine_checkpoint(e, "acct", S("c"), &seq, err), PC_REFUSED);
    ASSERT(pc_error_callback_code(err) == 9);
    ASSERT(strstr(pc_error_message(err), "this sum does not encode") != NULL);
    ASSERT(strstr(pc_error_message(err), "no checkpoint was published") != NULL);
    pc_bytes bytes = {0};
    EXPECT_CODE(pc_engine_read(e, "acct", S("c"), &bytes, err), PC_REFUSED);
    ASSERT(bytes.data == NULL);
    uint64_t sum = 0;
    uint32_t result;
    CHECK(pc_engine_visit(e, "acct", S("c"), visit_sum, &sum, &result, NULL));
    ASSERT(sum == 9);
    atomic_store(&data.refuse_encode_of, 0);

    /* fresh: the entity is contained with the callback's reason; others are served. */
    atomic_store(&data.refuse_fresh_of, 'f');
    EXPECT_CODE(pc_engine_append(e, "acct", S("fresh-less"), &record, 1, &first, &last, err),
                PC_CONTAINED);
    ASSERT(strstr(pc_error_message(err), "no fresh state for this id") != NULL);
    bool contained = false;
    pc_bytes reason = {0};
    CHECK(pc_engine_containment(e, "acct", S("fresh-less"), &contained, &reason, NULL));
    ASSERT(contained && reason.len > 0);
    char text[1024] = {0};
    memcpy(text, reason.data, reason.len < sizeof text - 1 ? reason.len : sizeof text - 1);
    ASSERT(strstr(text, "fresh refused") != NULL && strstr(text, "code 12") != NULL);
    pc_bytes_free(&reason);
    EXPECT_CODE(pc_engine_containment(e, "acct", S("c"), &contained, (pc_bytes *)&contained,
                                      NULL),
                PC_INVALID_ARGUMENT); /* two outputs in one place */
    atomic_store(&data.refuse_fresh_of, 0);
    append_value(e, "acct", "other", 1);
    CHECK(pc_engine_close(e, NULL));
    pc_engine_free(e);

    /* The refused checkpoint left the older one: the entity restores from it and its history. */
    e = open_with(dir, &data, 0);
    ASSERT(read_counter(e, "acct", "c").sum == 9);
    pc_engine_free(e);
    ASSERT(atomic_load(&data.live_states) == 0 && atomic_load(&data.destroyed) == 2);
    pc_error_free(err);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/listing", argv[1]);
    listing_history_and_visits(dir);
    snprintf(dir, sizeof dir, "%s/refusals", argv[1]);
    refusals(dir);
    printf("calls: ok\n");
    return 0;
}
