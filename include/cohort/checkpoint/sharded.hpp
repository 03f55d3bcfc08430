// SPDX-License-Identifier: Apache-2.0
#pragma once

// State spread over the ranks, in a checkpoint that resumes at any number of ranks: what a
// sharded optimizer holds for the parameters a rank owns (momentum, Adam's moments).
//
//   std::vector<cohort::parameter_ref<std::vector<float>>> moments; // "fc1.weight/m" -> m[0]...
//   ckpt.save(step, params, cohort::sharded_tensors(moments), cohort::serialized(adam.t));
//   ckpt.resume(params, cohort::sharded_tensors(moments), cohort::serialized(adam.t));
//
// Each rank writes the tensors it holds, by name, into its own file. At resume every rank reads
// every saved rank's file and fills the tensors it holds now (under the shard plan of the ranks
// there are now) from whichever rank saved them: 2 ranks' checkpoint resumes at 3, and 3's at 2.
// A tensor no rank saved, or two ranks saved, or saved with another dtype or size, is an error
// naming it.

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A rank's share of a sharded state: a parameter set (names and values) of host tensors.
template <parameter_set Tensors>
struct sharded_tensors_ref {
  Tensors* tensors;
};

//! `tensors` (this rank's, each with a name unique across the ranks) as a sharded thing of a
//! checkpoint. Their gradients are not read.
template <parameter_set Tensors>
sharded_tensors_ref<Tensors> sharded_tensors(Tensors& tensors) {
  return {&tensors};
}

template <class Tensors>
struct checkpoint_traits<sharded_tensors_ref<Tensors>> {
  static constexpr state_scope scope = state_scope::sharded;
  static constexpr std::string_view kind = "sharded tensors";

  // A part is written as a parameter set's values are (its names, dtypes and bytes): what
  // differs is how it is read back.
  static void save(checkpoint::byte_writer& out, const sharded_tensors_ref<Tensors>& ref) {
    checkpoint_traits<Tensors>::save(out, *ref.tensors);
  }

  static void load(std::span<checkpoint::byte_reader> parts, sharded_tensors_ref<Tensors>& ref,
                   const load_context&) {
    struct wanted {
      tensor_view view;
      int found_in = -1; // the saved rank whose part held it
    };
    std::map<std::string, wanted, std::less<>> held;
    for (auto& t : *ref.tensors) {
      std::string name(parameter_traits<std::remove_cvref_t<decltype(t)>>::name(t));
      const tensor_view v = checkpoint::detail::host_value(t, "sharded tensor '" + name + "'");
      if (!held.emplace(name, wanted{v}).second) {
        throw invalid_argument("cohort checkpoint: sharded tensor '" + name +
                               "' is named twice in the set given");
      }
    }
    for (std::size_t r = 0; r < parts.size(); ++r) {
      checkpoint::byte_reader& in = parts[r];
      const auto count = in.get<std::uint64_t>("the number of sharded tensors");
      for (std::uint64_t i = 0; i < count; ++i) {
        const std::string name = in.get_string("a sharded tensor's name");
        const auto type = in.get<std::uint8_t>("the dtype of '" + name + "'");
        const std::span<const std::byte> bytes = in.get_block("the values of '" + name + "'");
        const auto found = held.find(name);
        if (found == held.end()) {
          continue; // another rank's now
        }
        wanted& w = found->second;
        if (w.found_in >= 0) {
          in.fail("sharded tensor '" + name + "'",
                  "was saved by rank " + std::to_string(w.found_in) + " too");
        }
        if (type != static_cast<std::uint8_t>(w.view.type)) {
          in.fail("sharded tensor '" + name + "'", "was saved as dtype " + std::to_string(type) +
                                                       ", the one given is " +
                                                       std::string(to_string(w.view.type)));
        }
        if (bytes.size() != w.view.size_bytes()) {
          in.fail("sharded tensor '" + name + "'",
                  "was saved with " + std::to_string(bytes.size()) + " bytes, the one given has " +
                      std::to_string(w.view.size_bytes()));
        }
        if (!bytes.empty()) {
          std::memcpy(w.view.data, bytes.data(), bytes.size());
        }
        w.found_in = static_cast<int>(r);
      }
    }
    for (const auto& [name, w] : held) {
      if (w.found_in < 0) {
        throw checkpoint_error("cohort checkpoint: sharded tensor '" + name + "' is in none of " +
                               "the " + std::to_string(parts.size()) +
                               " saved ranks' parts (another model, or names that differ)");
      }
    }
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
