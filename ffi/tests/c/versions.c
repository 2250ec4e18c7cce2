/* Versioned records and checkpoints (SPEC E7): a machine with a `version` stores every record
 * and checkpoint behind the version envelope (the bytes the Rust typed module and the Python
 * package write), its callbacks see only bytes of its version, older ones come up through
 * upcast_record / upcast_checkpoint (records stored without an envelope are version 1), newer
 * ones and older ones without an upcast are refused naming both versions, a checkpoint it
 * cannot read falls back to the history; version 0, and a pc_machine compiled before versions
 * (in a buffer of exactly its size), store bytes unchanged. */
#include <stdatomic.h>
#include <stddef.h>

#include "check.h"

/* The state: a sum of amounts, how many, how many flagged. Version 1 of the records is a
 * 4-byte amount and of the checkpoint two 4-byte words (sum, count); version 2 of the records
 * is an 8-byte amount and a flag byte, of the checkpoint three 8-byte words. Host byte order. */
typedef struct tally {
    uint64_t sum;
    uint64_t count;
    uint64_t flagged;
} tally;

typedef struct tally_data {
    uint32_t format;                  /* 1 or 2: the bytes the callbacks read and write; 0: raw */
    atomic_int upcast_records[4];     /* by the version brought up */
    atomic_int upcast_checkpoints[4]; /* by the version brought up */
    atomic_int decodes;
    atomic_int checks;
    atomic_int refuse_upcast;         /* upcast_record refuses with code 9 */
    atomic_long live;
    uint8_t raw_checkpoint[64];       /* format 0: the last checkpoint decode saw */
    size_t raw_checkpoint_len;
} tally_data;

static void *new_tally(tally_data *d, uint64_t sum, uint64_t count, uint64_t flagged) {
    tally *t = calloc(1, sizeof *t);
    ASSERT(t != NULL);
    t->sum = sum;
    t->count = count;
    t->flagged = flagged;
    atomic_fetch_add(&d->live, 1);
    return t;
}

static uint32_t t_fresh(void *user_data, const pc_entity_view *entity, void **state_out) {
    (void)entity;
    *state_out = new_tally(user_data, 0, 0, 0);
    return 0;
}

/* Whether `record` is a record of the machine's format (format 0 takes anything). */
static int well_formed(const tally_data *d, size_t len) {
    return d->format == 0 || (d->format == 1 && len == 4) || (d->format == 2 && len == 9);
}

static uint32_t t_apply(void *user_data, void *state, const pc_apply_context *ctx,
                        const uint8_t *record, size_t len) {
    tally_data *d = user_data;
    tally *t = state;
    (void)ctx;
    if (!well_formed(d, len)) {
        CHECK(pc_refuse("not a record of this machine's version", NULL));
        return 3;
    }
    if (d->format == 1) {
        uint32_t amount;
        memcpy(&amount, record, 4);
        t->sum += amount;
    } else if (d->format == 2) {
        uint64_t amount;
        memcpy(&amount, record, 8);
        t->sum += amount;
        t->flagged += record[8];
    }
    t->count++;
    return 0;
}

static uint32_t t_check(void *user_data, const void *state, const pc_apply_context *ctx,
                        const uint8_t *record, size_t len) {
    tally_data *d = user_data;
    (void)state;
    (void)ctx;
    (void)record;
    atomic_fetch_add(&d->checks, 1);
    return well_formed(d, len) ? 0 : 3;
}

static uint32_t t_validate(void *user_data, const uint8_t *record, size_t len) {
    (void)record;
    return well_formed(user_data, len) ? 0 : 3;
}

static uint32_t t_encode(void *user_data, const void *state, pc_sink *out) {
    const tally_data *d = user_data;
    const tally *t = state;
    if (d->format == 1) {
        uint32_t words[2] = {(uint32_t)t->sum, (uint32_t)t->count};
        return pc_sink_write(out, (const uint8_t *)words, sizeof words, NULL);
    }
    uint64_t words[3] = {t->sum, t->count, t->flagged};
    return pc_sink_write(out, (const uint8_t *)words, sizeof words, NULL);
}

static uint32_t t_decode(void *user_data, const pc_entity_view *entity, const uint8_t *bytes,
                         size_t len, void **state_out) {
    tally_data *d = user_data;
    (void)entity;
    atomic_fetch_add(&d->decodes, 1);
    if (d->format == 0) {
        ASSERT(len <= sizeof d->raw_checkpoint);
        memcpy(d->raw_checkpoint, bytes, len);
        d->raw_checkpoint_len = len;
        *state_out = new_tally(d, 0, 0, 0);
        return 0;
    }
    if (d->format == 1 && len == 8) {
        uint32_t words[2];
        memcpy(words, bytes, sizeof words);
        *state_out = new_tally(d, words[0], words[1], 0);
        return 0;
    }
    if (d->format == 2 && len == 24) {
        uint64_t words[3];
        memcpy(words, bytes, sizeof words);
        *state_out = new_tally(d, words[0], words[1], words[2]);
        return 0;
    }
    CHECK(pc_refuse("not a checkpoint of this machine's version", NULL));
    return 5;
}

/* Version 2's upcast of a version 1 record: the amount widened, not flagged. */
static uint32_t t_upcast_record(void *user_data, uint32_t version, const uint8_t *record,
                                size_t len, pc_sink *out) {
    tally_data *d = user_data;
    ASSERT(d->format == 2 && version >= 1 && version < 4);
    atomic_fetch_add(&d->upcast_records[version], 1);
    if (atomic_load(&d->refuse_upcast)) {
        CHECK(pc_refuse("cannot bring it up", NULL));
        return 9;
    }
    if (version != 1 || len != 4) {
        return 4;
    }
    uint32_t amount;
    memcpy(&amount, record, 4);
    uint8_t v2[9] = {0};
    uint64_t wide = amount;
    memcpy(v2, &wide, 8);
    return pc_sink_write(out, v2, sizeof v2, NULL);
}

static uint32_t t_upcast_checkpoint(void *user_data, const pc_entity_view *entity,
                                    uint32_t version, const uint8_t *bytes, size_t len,
                                    void **state_out) {
    tally_data *d = user_data;
    ASSERT(entity->ns_len > 0 && d->format == 2 && version >= 1 && version < 4);
    atomic_fetch_add(&d->upcast_checkpoints[version], 1);
    if (version != 1 || len != 8) {
        return 4;
    }
    uint32_t words[2];
    memcpy(words, bytes, sizeof words);
    *state_out = new_tally(d, words[0], words[1], 0);
    return 0;
}

static void t_free(void *user_data, void *state) {
    tally_data *d = user_data;
    free(state);
    atomic_fetch_sub(&d->live, 1);
}

/* A machine of `version` reading and writing `format` (upcasts for version 2). */
static pc_machine tally_machine(tally_data *d, uint32_t version, uint32_t format) {
    d->format = format;
    pc_machine m = {
        .struct_size = sizeof(pc_machine),
        .user_data = d,
        .fresh = t_fresh,
        .apply = t_apply,
        .encode = t_encode,
        .decode = t_decode,
        .validate = t_validate,
        .free_state = t_free,
        .check = t_check,
        .version = version,
        .upcast_record = format == 2 ? t_upcast_record : NULL,
        .upcast_checkpoint = format == 2 ? t_upcast_checkpoint : NULL,
    };
    return m;
}

static pc_engine *open_with(const char *dir, const pc_machine *m, bool truncate) {
    pc_engine_options *o = NULL;
    CHECK(pc_engine_options_new(&o, NULL));
    CHECK(pc_engine_options_directory(o, dir, NULL));
    CHECK(pc_engine_options_number(o, PC_POOL_THREADS, 2, NULL));
    CHECK(pc_engine_options_flag(o, PC_SWEEP_EXPIRED_LEASES, false, NULL));
    CHECK(pc_engine_options_flag(o, PC_REGISTER_ON_FIRST_WRITE, true, NULL));
    CHECK(pc_engine_options_flag(o, PC_TRUNCATE_AFTER_CHECKPOINT, truncate, NULL));
    /* The callbacks' counts come from the test's own touches only. */
    CHECK(pc_engine_options_flag(o, PC_BACKGROUND_WARM, false, NULL));
    pc_engine *e = NULL;
    CHECK(pc_engine_open(o, m, &e, NULL));
    pc_engine_options_free(o);
    return e;
}

static void done(pc_engine *e, tally_data *d) {
    pc_engine_free(e);
    ASSERT(atomic_load(&d->live) == 0);
}

static void add1(const pc_engine *e, const char *id, uint32_t amount) {
    pc_slice r = {(const uint8_t *)&amount, 4};
    uint64_t first, last;
    CHECK(pc_engine_append(e, "t", S(id), &r, 1, &first, &last, NULL));
}

static void add2(const pc_engine *e, const char *id, uint64_t amount, uint8_t flag) {
    uint8_t v2[9];
    memcpy(v2, &amount, 8);
    v2[8] = flag;
    pc_slice r = {v2, 9};
    uint64_t first, last;
    CHECK(pc_engine_append(e, "t", S(id), &r, 1, &first, &last, NULL));
}

static uint32_t copy_state(void *ctx, const void *state) {
    memcpy(ctx, state, sizeof(tally));
    return 0;
}

static tally state_of(const pc_engine *e, const char *id) {
    tally t;
    uint32_t result;
    CHECK(pc_engine_visit(e, "t", S(id), copy_state, &t, &result, NULL));
    return t;
}

static void checkpoint(const pc_engine *e, const char *id) {
    uint64_t seq;
    CHECK(pc_engine_checkpoint(e, "t", S(id), &seq, NULL));
}

/* Record `index` of the entity's history as `pc_engine_history` answers it. */
static size_t history_record(const pc_engine *e, const char *id, size_t index, uint8_t *out) {
    pc_history_page *page = NULL;
    CHECK(pc_engine_history(e, "t", S(id), 1, 100, &page, NULL));
    uint64_t seq;
    const uint8_t *data;
    size_t len;
    CHECK(pc_history_page_record(page, index, &seq, &data, &len, NULL));
    ASSERT(seq == index + 1 && len <= 64);
    memcpy(out, data, len);
    pc_history_page_free(page);
    return len;
}

/* The error of touching an entity whose restore refuses, with the callback code. */
static void expect_contained(const pc_engine *e, const char *id, const char *says,
                             uint32_t callback_code) {
    pc_error *err = NULL;
    CHECK(pc_error_new(&err));
    pc_bytes state = {0};
    EXPECT_CODE(pc_engine_read(e, "t", S(id), &state, err), PC_CONTAINED);
    if (strstr(pc_error_message(err), says) == NULL) {
        fprintf(stderr, "the message does not say \"%s\": %s\n", says, pc_error_message(err));
        exit(1);
    }
    ASSERT(pc_error_callback_code(err) == callback_code);
    pc_error_free(err);
}

/* The envelope helpers make and read the bytes of docs/SCHEMA.md. */
static void envelope_helpers(void) {
    pc_bytes b = {0};
    CHECK(pc_envelope_write(1, S("x"), &b, NULL));
    ASSERT(b.len == 3 && memcmp(b.data, "\x81\x00x", 3) == 0);
    pc_bytes_free(&b);
    CHECK(pc_envelope_write(300, NULL, 0, &b, NULL));
    ASSERT(b.len == 3 && memcmp(b.data, "\xac\x82\x00", 3) == 0);
    pc_bytes_free(&b);
    EXPECT_CODE(pc_envelope_write(0, S("x"), &b, NULL), PC_INVALID_ARGUMENT);

    uint32_t version;
    size_t offset;
    bool enveloped;
    CHECK(pc_envelope_split((const uint8_t *)"\xac\x82\x00x", 4, &version, &offset, &enveloped,
                            NULL));
    ASSERT(version == 300 && offset == 3 && enveloped);
    CHECK(pc_envelope_split(S("{\"plain\": 1}"), &version, &offset, &enveloped, NULL));
    ASSERT(version == 1 && offset == 0 && !enveloped);
    CHECK(pc_envelope_split(NULL, 0, &version, &offset, &enveloped, NULL));
    ASSERT(version == 1 && offset == 0 && !enveloped);
    CHECK(pc_envelope_split((const uint8_t *)"\xff\xff\xff\xff\x8f\x00", 6, &version, &offset,
                            &enveloped, NULL));
    ASSERT(version == UINT32_MAX && offset == 6 && enveloped);
    /* Version 0 and versions beyond 32 bits are never written. */
    EXPECT_CODE(pc_envelope_split((const uint8_t *)"\x80\x00", 2, &version, &offset, &enveloped,
                                  NULL),
                PC_INVALID_ARGUMENT);
    ASSERT(strstr(last_error(), "version 0") != NULL);
    EXPECT_CODE(pc_envelope_split((const uint8_t *)"\xff\xff\xff\xff\xff\x00", 6, &version,
                                  &offset, &enveloped, NULL),
                PC_INVALID_ARGUMENT);
    EXPECT_CODE(pc_envelope_split(S("x"), &version, (size_t *)&version, &enveloped, NULL),
                PC_INVALID_ARGUMENT);
}

/* Version 0 stores the machine's bytes unchanged, and so does a pc_machine compiled before
 * versions existed (its struct ends before `version`; the library reads no byte past it). */
static void version_0_stores_bytes_unchanged(const char *dir) {
    static tally_data d, raw;
    pc_machine full = tally_machine(&d, 2, 1); /* version 2 if the fields were read */
    size_t old_size = offsetof(pc_machine, version);
    pc_machine *old = malloc(old_size);
    ASSERT(old != NULL);
    memcpy(old, &full, old_size);
    old->struct_size = old_size;
    pc_engine *e = open_with(dir, old, false);
    free(old);
    add1(e, "zero", 5);
    checkpoint(e, "zero");
    add1(e, "zero", 6);
    ASSERT(state_of(e, "zero").sum == 11);
    done(e, &d);

    pc_machine plain = tally_machine(&d, 0, 1);
    e = open_with(dir, &plain, false);
    add1(e, "zero", 7);
    ASSERT(state_of(e, "zero").sum == 18);
    ASSERT(atomic_load(&d.upcast_records[1]) == 0);
    done(e, &d);

    /* Read raw: records and the checkpoint are the machine's bytes, no envelope. */
    pc_machine m = tally_machine(&raw, 0, 0);
    e = open_with(dir, &m, false);
    uint8_t got[64];
    uint32_t six = 6;
    ASSERT(history_record(e, "zero", 1, got) == 4 && memcmp(got, &six, 4) == 0);
    ASSERT(state_of(e, "zero").count == 2); /* the two records after the checkpoint */
    uint32_t words[2] = {5, 1};
    ASSERT(raw.raw_checkpoint_len == 8 && memcmp(raw.raw_checkpoint, words, 8) == 0);
    done(e, &raw);
}

/* Version 1 puts the envelope on every record (append, write, defer) and checkpoint; its
 * callbacks, pc_engine_read and pc_engine_history see the bytes without it. */
static uint32_t decide_three(void *ctx, const void *state, pc_records *out) {
    (void)ctx;
    (void)state;
    uint32_t amount = 3;
    return pc_records_push(out, (const uint8_t *)&amount, 4, NULL);
}

static void version_1_writes_the_envelope(const char *dir) {
    static tally_data d, raw;
    pc_machine m = tally_machine(&d, 1, 1);
    pc_engine *e = open_with(dir, &m, false);
    add1(e, "one", 1);
    pc_written w;
    CHECK(pc_engine_write(e, "t", S("one"), decide_three, NULL, &w, NULL));
    ASSERT(w.wrote && w.first_seq == 2);
    uint32_t five = 5;
    pc_deferred def;
    CHECK(pc_engine_defer(e, "t", S("one"), NULL, 0, (const uint8_t *)&five, 4, &def, NULL));
    ASSERT(def.kind == PC_DEFERRED_APPLIED);
    checkpoint(e, "one");
    pc_bytes state = {0};
    CHECK(pc_engine_read(e, "t", S("one"), &state, NULL));
    uint32_t words[2] = {9, 3};
    ASSERT(state.len == 8 && memcmp(state.data, words, 8) == 0);
    pc_bytes_free(&state);
    uint8_t got[64];
    ASSERT(history_record(e, "one", 1, got) == 4 && memcmp(got, "\x03\x00\x00\x00", 4) == 0);
    ASSERT(atomic_load(&d.checks) == 3);
    done(e, &d);

    pc_machine r = tally_machine(&raw, 0, 0);
    e = open_with(dir, &r, false);
    const char *stored[3] = {"\x81\x00\x01\x00\x00\x00", "\x81\x00\x03\x00\x00\x00",
                             "\x81\x00\x05\x00\x00\x00"};
    for (size_t i = 0; i < 3; i++) {
        ASSERT(history_record(e, "one", i, got) == 6 && memcmp(got, stored[i], 6) == 0);
    }
    state_of(e, "one");
    ASSERT(raw.raw_checkpoint_len == 10 && memcmp(raw.raw_checkpoint, "\x81\x00", 2) == 0 &&
           memcmp(raw.raw_checkpoint + 2, words, 8) == 0);
    done(e, &raw);
}

/* Version 2 reads version 1's records and checkpoint, and records stored before versions,
 * through its upcasts; once it checkpoints, it decodes its own version directly. */
static void version_2_reads_version_1_through_upcasts(const char *dir) {
    static tally_data d0, d1, d2, again;
    pc_machine m = tally_machine(&d0, 0, 1);
    pc_engine *e = open_with(dir, &m, false);
    add1(e, "mixed", 1); /* before versions: no envelope */
    add1(e, "old", 10);
    done(e, &d0);

    m = tally_machine(&d1, 1, 1);
    e = open_with(dir, &m, false);
    add1(e, "mixed", 2);
    checkpoint(e, "mixed"); /* a version 1 checkpoint of records 1 and 2 */
    add1(e, "mixed", 4);
    pc_deferred def;
    uint32_t eight = 8;
    bool created;
    CHECK(pc_engine_register(e, "t", S("queued"), &created, NULL));
    CHECK(pc_engine_defer(e, "t", S("queued"), NULL, 0, (const uint8_t *)&eight, 4, &def, NULL));
    ASSERT(def.kind == PC_DEFERRED_QUEUED); /* a version 1 record waits for the restore */
    done(e, &d1);

    m = tally_machine(&d2, 2, 2);
    e = open_with(dir, &m, false);
    tally t = state_of(e, "mixed");
    ASSERT(t.sum == 7 && t.count == 3 && t.flagged == 0);
    ASSERT(atomic_load(&d2.upcast_checkpoints[1]) == 1 && atomic_load(&d2.decodes) == 0);
    ASSERT(atomic_load(&d2.upcast_records[1]) == 1); /* record 3; 1 and 2 are checkpointed */
    t = state_of(e, "old");
    ASSERT(t.sum == 10 && atomic_load(&d2.upcast_records[1]) == 2); /* no envelope: v1 */
    /* The deferred version 1 record: checked and applied as version 2 inside the restore. */
    int checks = atomic_load(&d2.checks);
    ASSERT(state_of(e, "queued").sum == 8 && atomic_load(&d2.checks) == checks + 1);
    /* The history as version 2 reads it. */
    uint8_t got[64];
    ASSERT(history_record(e, "mixed", 0, got) == 9 && got[0] == 1 && got[8] == 0);
    add2(e, "mixed", 8, 1);
    checkpoint(e, "mixed"); /* version 2 */
    done(e, &d2);

    m = tally_machine(&again, 2, 2);
    e = open_with(dir, &m, false);
    t = state_of(e, "mixed");
    ASSERT(t.sum == 15 && t.count == 4 && t.flagged == 1);
    ASSERT(atomic_load(&again.decodes) == 1 && atomic_load(&again.upcast_checkpoints[1]) == 0);
    ASSERT(atomic_load(&again.upcast_records[1]) == 0);
    done(e, &again);
}

/* Newer bytes are refused, never guessed: a newer record contains the entity naming both
 * versions; a newer checkpoint falls back to the history while it is all stored (and the
 * entity checkpoints again in the older version), and with the history truncated contains
 * the entity naming both versions. */
static void newer_versions_are_refused(const char *dir) {
    static tally_data d1, d2, back, cut1, cut2, later;
    pc_machine m = tally_machine(&d1, 1, 1);
    pc_engine *e = open_with(dir, &m, false);
    add1(e, "ck", 3);
    done(e, &d1);

    m = tally_machine(&d2, 2, 2);
    e = open_with(dir, &m, false);
    add2(e, "new", 5, 0);
    ASSERT(state_of(e, "ck").sum == 3);
    checkpoint(e, "ck"); /* a version 2 checkpoint over a version 1 record */
    done(e, &d2);

    m = tally_machine(&back, 1, 1);
    e = open_with(dir, &m, false);
    expect_contained(e, "new", "record 1 was written by version 2, newer than this machine's "
                               "version 1", PC_VERSION_REFUSED);
    ASSERT(state_of(e, "ck").sum == 3 && atomic_load(&back.decodes) == 0);
    done(e, &back);
    m = tally_machine(&later, 2, 2);
    e = open_with(dir, &m, false);
    ASSERT(state_of(e, "ck").sum == 3 && atomic_load(&later.upcast_checkpoints[1]) == 1);
    done(e, &later);

    m = tally_machine(&cut2, 2, 2);
    e = open_with(dir, &m, true);
    add2(e, "cut", 4, 0);
    add2(e, "cut", 4, 0);
    checkpoint(e, "cut"); /* the records before it are truncated */
    done(e, &cut2);
    m = tally_machine(&cut1, 1, 1);
    e = open_with(dir, &m, false);
    expect_contained(e, "cut", "the checkpoint was written by version 2, newer than this "
                               "machine's version 1", PC_VERSION_REFUSED);
    done(e, &cut1);
}

/* Older bytes without an upcast are refused naming both versions; an upcast's refusal is the
 * refusal of the callback that was to read it, with its code and reason. */
static void older_versions_without_an_upcast(const char *dir) {
    static tally_data d1, bare, refusing, ck;
    pc_machine m = tally_machine(&d1, 1, 1);
    pc_engine *e = open_with(dir, &m, false);
    add1(e, "plain", 1);
    add1(e, "refused", 1);
    add1(e, "older-ck", 2);
    checkpoint(e, "older-ck");
    done(e, &d1);

    m = tally_machine(&bare, 2, 2);
    m.upcast_record = NULL;
    m.upcast_checkpoint = NULL;
    e = open_with(dir, &m, false);
    expect_contained(e, "plain", "record 1 was written by version 1 and this machine is version "
                                 "2: the machine has no upcast_record", PC_VERSION_REFUSED);
    done(e, &bare);

    m = tally_machine(&refusing, 2, 2);
    atomic_store(&refusing.refuse_upcast, 1);
    e = open_with(dir, &m, false);
    expect_contained(e, "refused", "upcast_record refused record 1 of version 1 (this machine is "
                                   "version 2) with code 9: cannot bring it up", 9);
    done(e, &refusing);

    /* A version 1 checkpoint without upcast_checkpoint: the history is replayed instead. */
    m = tally_machine(&ck, 2, 2);
    m.upcast_checkpoint = NULL;
    e = open_with(dir, &m, false);
    ASSERT(state_of(e, "older-ck").sum == 2 && atomic_load(&ck.upcast_records[1]) == 1);
    ASSERT(atomic_load(&ck.decodes) == 0);
    done(e, &ck);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    envelope_helpers();
    version_0_stores_bytes_unchanged(argv[1]);
    version_1_writes_the_envelope(argv[1]);
    version_2_reads_version_1_through_upcasts(argv[1]);
    newer_versions_are_refused(argv[1]);
    older_versions_without_an_upcast(argv[1]);
    printf("versions: ok\n");
    return 0;
}
