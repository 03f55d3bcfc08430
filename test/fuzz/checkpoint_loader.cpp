// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for what cohort reads from a checkpoint: the manifest's text, and the state's
// bytes loaded into parameters, a random engine, a data position, bucket orders, PowerSGD's
// state (its replicated part and this rank's errors) and sharded tensors (every saved rank's
// part read by each rank, as a sharded optimizer's state is resumed). Whatever the
// bytes, the loader must end in a `checkpoint_error` or in success: never a crash, a leak, a
// sanitizer report, or an allocation the bytes did not pay for. (Boost.Serialization values are
// Boost's format and are left out: see docs/checkpoints.md.) Built and run by tools/fuzz.sh.
//
// Input: the first byte picks what is read; the rest is the manifest's text, or the replicated
// state's bytes, or both scopes (a 4-byte length of the replicated part first), or two saved
// ranks' files of sharded tensors (a 4-byte length of the first first).
#include <cohort/checkpoint/bucket_orders.hpp>
#include <cohort/checkpoint/manifest.hpp>
#include <cohort/checkpoint/powersgd.hpp>
#include <cohort/checkpoint/sharded.hpp>
#include <cohort/checkpoint/state_io.hpp>
#include <cohort/tensor/std.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

// Keeps bucket orders as a communicator would (without MPI: the loader is what is fuzzed).
struct order_keeper {
  std::vector<cohort::bucket_order> orders{{42, {2, 0, 1}}};
  std::vector<cohort::bucket_order> learned_bucket_orders() const { return orders; }
  void restore_bucket_orders(std::vector<cohort::bucket_order> o) { orders = std::move(o); }
};

struct state {
  std::vector<float> w = std::vector<float>(6, 0.5f);
  std::vector<float> gw = std::vector<float>(6);
  std::vector<double> b = std::vector<double>(2, 1.0);
  std::vector<double> gb = std::vector<double>(2);
  std::vector<param> ws{{"w", &w, &gw}};
  std::vector<cohort::parameter_ref<std::vector<double>>> bs{{"b", &b, &gb}};
  std::mt19937 engine{7};
  cohort::data_position position;
  order_keeper keeper;
  cohort::powersgd psgd{{.rank = 2}};

  state() {
    // One parameter set with one compressed 4 x 3 gradient: the loader's every field is seeded.
    cohort::powersgd_slot_record slot{.slot = 0,
                                      .name = "w",
                                      .type = cohort::dtype::float32,
                                      .n = 4,
                                      .m = 3,
                                      .r = 2,
                                      .compressed = true,
                                      .q_ready = true,
                                      .q = std::vector<std::byte>(2 * 3 * 4),
                                      .e = {}};
    psgd.state()->restore({{42, 7, {slot}}}, false);
    slot.e.assign(4 * 3 * 4, std::byte{1});
    psgd.state()->restore({{42, 7, {slot}}}, true);
  }
};

// An empty state of rank 0's: the fuzzer's bytes go to the other scopes.
const std::vector<std::byte> no_root =
    cohort::checkpoint::serialize<cohort::state_scope::root>(3).contiguous();

void load(std::span<const std::byte> replicated, std::optional<std::span<const std::byte>> own) {
  state s;
  auto orders = cohort::bucket_orders(s.keeper);
  auto psgd = cohort::powersgd_replicated(s.psgd);
  auto errors = cohort::powersgd_errors(s.psgd);
  try {
    std::vector<std::span<const std::byte>> files;
    if (own) {
      files.push_back(*own);
    }
    cohort::checkpoint::deserialize(replicated, no_root, {files, 1}, "fuzz", 3, {2, 2, 1}, s.ws,
                                    s.engine, s.position, s.bs, orders, psgd, errors);
  } catch (const cohort::checkpoint_error&) {
  }
}

// Two saved ranks' files, each a random engine (this rank's, rank 1's) and sharded tensors
// ("w/m" saved by rank 0, "b/m" by rank 1).
struct sharded_state {
  std::vector<float> wm = std::vector<float>(6, 0.25f);
  std::vector<float> bm = std::vector<float>(2, 0.75f);
  std::vector<param> moments{{"w/m", &wm, nullptr}, {"b/m", &bm, nullptr}};
  std::mt19937 engine{9};
};

void load_sharded(std::span<const std::byte> first, std::span<const std::byte> second) {
  sharded_state s;
  auto moments = cohort::sharded_tensors(s.moments);
  const std::vector<std::byte> none =
      cohort::checkpoint::serialize<cohort::state_scope::replicated>(3).contiguous();
  const std::vector<std::byte> no_root =
      cohort::checkpoint::serialize<cohort::state_scope::root>(3).contiguous();
  const std::vector<std::span<const std::byte>> files{first, second};
  // Resumed by 3 ranks (the engine read past), and by 2 (rank 1's engine loaded).
  for (const int ranks : {3, 2}) {
    try {
      cohort::checkpoint::deserialize(none, no_root, {files, 0}, "fuzz", 3, {2, ranks, 1}, s.engine,
                                      moments);
    } catch (const cohort::checkpoint_error&) {
    }
  }
}

// The bytes after a 4-byte length, split at that length.
std::pair<std::span<const std::byte>, std::span<const std::byte>>
split_at_length(std::span<const std::byte> bytes) {
  std::uint32_t split = 0;
  if (bytes.size() >= sizeof split) {
    std::memcpy(&split, bytes.data(), sizeof split);
  }
  const auto rest = bytes.subspan(std::min(bytes.size(), sizeof split));
  const std::size_t at = std::min<std::size_t>(split, rest.size());
  return {rest.first(at), rest.subspan(at)};
}

void parse(const std::string& text) {
  try {
    (void)cohort::checkpoint::manifest::parse(text, "fuzz");
  } catch (const cohort::checkpoint_error&) {
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  switch (data[0] % 5) {
  case 0:
    parse(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    break;
  case 3: {
    // A manifest's lines with their checksum line made right: what is below the checksum.
    std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    text += "checksum " +
            cohort::checkpoint::to_hex(cohort::checkpoint::checksum::of(
                std::as_bytes(std::span(text.data(), text.size())))) +
            "\n";
    parse(text);
    break;
  }
  case 1:
    load(bytes, std::nullopt);
    break;
  case 4: {
    const auto [first, second] = split_at_length(bytes);
    load_sharded(first, second);
    break;
  }
  default: {
    const auto [first, second] = split_at_length(bytes);
    load(first, second);
  }
  }
  return 0;
}

#if defined(COHORT_FUZZ_SEEDS)
// Writes a valid input of each kind into the directory argv[1]: the corpus the fuzzer starts
// from, so that it mutates real manifests and states rather than finding their shape alone.
int main(int argc, char** argv) {
  if (argc != 2) {
    return 2;
  }
  auto write = [&](const char* name, std::uint8_t kind, std::span<const std::byte> a,
                   std::optional<std::span<const std::byte>> b) {
    std::FILE* f = std::fopen((std::string(argv[1]) + "/" + name).c_str(), "wb");
    std::fputc(kind, f);
    if (b) {
      const auto split = static_cast<std::uint32_t>(a.size());
      std::fwrite(&split, sizeof split, 1, f);
    }
    std::fwrite(a.data(), 1, a.size(), f);
    if (b) {
      std::fwrite(b->data(), 1, b->size(), f);
    }
    std::fclose(f);
  };
  cohort::checkpoint::manifest m;
  m.step = 3;
  m.ranks = 2;
  m.replicated = {{"replicated-0-of-2", 10, 0x1234}, {"replicated-1-of-2", 11, 0xabcd}};
  m.root = {{"root-of-2", 12, 0x4321}};
  m.per_rank = {{"rank-0-of-2", 5, 0x99}, {"rank-1-of-2", 6, 0x77}};
  const std::string text = m.text();
  write("manifest", 0, std::as_bytes(std::span(text.data(), text.size())), std::nullopt);
  // Its lines without the checksum line (kind 3 sums them), and the same in format 1.
  const std::string lines = text.substr(0, text.rfind("checksum "));
  write("manifest-lines", 3, std::as_bytes(std::span(lines.data(), lines.size())), std::nullopt);
  const std::string first = "cohort checkpoint 1" + lines.substr(lines.find('\n'));
  write("manifest-1", 0, std::as_bytes(std::span(first.data(), first.size())), std::nullopt);
  state s;
  using cohort::state_scope;
  const auto shared = cohort::checkpoint::serialize<state_scope::replicated>(
                          3, s.ws, s.engine, s.position, s.bs, cohort::bucket_orders(s.keeper),
                          cohort::powersgd_replicated(s.psgd), cohort::powersgd_errors(s.psgd))
                          .contiguous();
  const auto own = cohort::checkpoint::serialize<state_scope::per_rank>(
                       3, s.ws, s.engine, s.position, s.bs, cohort::bucket_orders(s.keeper),
                       cohort::powersgd_replicated(s.psgd), cohort::powersgd_errors(s.psgd))
                       .contiguous();
  write("replicated", 1, shared, std::nullopt);
  write("both", 2, shared, std::span<const std::byte>(own));
  // Two ranks' sharded files, each holding one of the tensors.
  sharded_state a, b;
  std::vector<param> of_rank_0{a.moments[0]}, of_rank_1{b.moments[1]};
  const auto part = [&](std::vector<param>& mine) {
    return cohort::checkpoint::serialize<state_scope::per_rank>(3, a.engine,
                                                                cohort::sharded_tensors(mine))
        .contiguous();
  };
  write("sharded", 4, part(of_rank_0), std::span<const std::byte>(part(of_rank_1)));
  return 0;
}
#endif
