// The header compiles as C++ (C++17, -Wall -Wextra -Werror -pedantic) and links: a small state
// machine written in C++ opens an engine over an in-memory store, writes, reads, closes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "portcullis.h"

namespace {

struct Sum {
    std::uint64_t total = 0;
};

extern "C" std::uint32_t fresh(void *, const pc_entity_view *, void **out) {
    *out = new Sum();
    return 0;
}

extern "C" std::uint32_t apply(void *, void *state, const pc_apply_context *, const std::uint8_t *rec,
                               std::size_t len) {
    if (len != 8) return 1;
    std::uint64_t v;
    std::memcpy(&v, rec, 8);
    static_cast<Sum *>(state)->total += v;
    return 0;
}

extern "C" std::uint32_t encode(void *, const void *state, pc_sink *out) {
    return pc_sink_write(out, reinterpret_cast<const std::uint8_t *>(&static_cast<const Sum *>(state)->total), 8,
                         nullptr);
}

extern "C" std::uint32_t decode(void *, const pc_entity_view *, const std::uint8_t *b, std::size_t len,
                                void **out) {
    if (len != 8) return 1;
    auto *s = new Sum();
    std::memcpy(&s->total, b, 8);
    *out = s;
    return 0;
}

extern "C" void free_state(void *, void *state) { delete static_cast<Sum *>(state); }

int fail(const char *what, pc_error *err) {
    std::fprintf(stderr, "%s: %s %s\n", what, pc_error_name(pc_error_code(err)), pc_error_message(err));
    return 1;
}

}  // namespace

int main() {
    if (pc_abi_version() != PC_ABI_VERSION) return 1;
    pc_error *err = nullptr;
    if (pc_error_new(&err) != PC_OK) return 1;
    pc_machine m{};
    m.struct_size = sizeof m;
    m.fresh = fresh;
    m.apply = apply;
    m.encode = encode;
    m.decode = decode;
    m.free_state = free_state;
    pc_store *store = nullptr;
    pc_engine_options *options = nullptr;
    pc_engine *engine = nullptr;
    if (pc_store_open_memory(nullptr, &store, err) != PC_OK) return fail("store", err);
    if (pc_engine_options_new(&options, err) != PC_OK) return fail("options", err);
    if (pc_engine_options_store(options, store, err) != PC_OK) return fail("options", err);
    if (pc_engine_options_flag(options, PC_REGISTER_ON_FIRST_WRITE, true, err) != PC_OK) return fail("flag", err);
    if (pc_engine_options_flag(options, PC_SWEEP_EXPIRED_LEASES, false, err) != PC_OK) return fail("flag", err);
    if (pc_engine_open(options, &m, &engine, err) != PC_OK) return fail("open", err);
    std::uint64_t value = 42, first = 0, last = 0;
    pc_slice record{reinterpret_cast<const std::uint8_t *>(&value), 8};
    const std::string id = "answer";
    const auto *idp = reinterpret_cast<const std::uint8_t *>(id.data());
    if (pc_engine_append(engine, "cpp", idp, id.size(), &record, 1, &first, &last, err) != PC_OK)
        return fail("append", err);
    pc_bytes state{};
    if (pc_engine_read(engine, "cpp", idp, id.size(), &state, err) != PC_OK) return fail("read", err);
    std::uint64_t total = 0;
    std::memcpy(&total, state.data, 8);
    pc_bytes_free(&state);
    pc_engine_stats stats{};
    stats.struct_size = sizeof stats;
    if (pc_engine_get_stats(engine, &stats, err) != PC_OK) return fail("stats", err);
    if (pc_engine_close(engine, err) != PC_OK) return fail("close", err);
    pc_engine_free(engine);
    pc_engine_options_free(options);
    pc_store_free(store);
    pc_error_free(err);
    if (total != 42 || stats.entities != 1) return 1;
    std::printf("header: ok\n");
    return 0;
}
