// SPDX-License-Identifier: Apache-2.0
#pragma once

// Names and settings every rank must hold alike (of metrics, an optimizer's options), compared as
// the engine compares what ranks pass to a collective (engine/agreement.hpp): a fingerprint
// first, the descriptions only when the fingerprints differ.

#include <cohort/communicator/engine/signature.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/std.hpp>

#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

// Whether every rank of `comm` has the same `f` (collective: one 16-byte all-reduce). max(h) and
// max(~h) = ~min(h) (~ reverses the order of signed values too): equal on every rank exactly when
// every rank has the same h.
template <class Communicator>
bool same_on_every_rank(Communicator& comm, const fingerprint& f) {
  const auto hash = static_cast<std::int64_t>(f.value());
  std::array<std::int64_t, 2> bounds = {hash, ~hash};
  comm.allreduce(bounds, reduce_op::max);
  return bounds[0] == ~bounds[1];
}

} // namespace detail

//! A number as a setting's value: every bit of it (%.17g), so that ranks whose values differ in
//! the last bit differ here too.
inline std::string exact_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

//! The names (of metrics, say) that every rank holds, in the same order, compared through the
//! front door of `comm` (watched, like any collective). A rank with no names at all takes the
//! others' (a rank whose evaluation shard is empty). Ranks that differ otherwise throw, every one,
//! the same `mismatch_error` naming `operation`, the first rank and the first `what` that differ.
//! Collective; one 16-byte all-reduce when the names agree.
template <class Communicator>
std::vector<std::string> agree_on_names(Communicator& comm, std::vector<std::string> names,
                                        const char* operation, std::string_view what) {
  detail::fingerprint f;
  f.add(names.size());
  for (const auto& name : names) {
    f.add(name);
  }
  if (detail::same_on_every_rank(comm, f)) {
    return names;
  }
  const auto all = comm.allgather_obj(names);
  std::size_t reference = all.size();
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) {
      continue;
    }
    if (reference == all.size()) {
      reference = r;
    } else if (all[r] != all[reference]) {
      std::vector<std::vector<engine::signature_entry>> described(all.size());
      for (std::size_t q = 0; q < all.size(); ++q) {
        for (const auto& name : all[q].empty() ? all[reference] : all[q]) {
          described[q].push_back({std::string(what), "'" + name + "'"});
        }
      }
      throw mismatch_error(engine::describe_mismatch(operation, described, reference));
    }
  }
  return reference == all.size() ? std::move(names) : all[reference];
}

//! One setting every rank must hold alike: its name ("option 'patience'") and its value here.
using setting = engine::signature_entry;

//! Compares `settings` (an object's options, say) across the ranks of `comm`, as the engine
//! compares what ranks pass to a collective: one 16-byte all-reduce of a fingerprint when they
//! agree; otherwise every rank throws the same `mismatch_error` naming `operation`, the first
//! setting that differs, both values and both ranks. Collective.
template <class Communicator>
void agree_on_settings(Communicator& comm, const std::vector<setting>& settings,
                       const char* operation) {
  detail::fingerprint f;
  f.add(settings.size());
  for (const setting& s : settings) {
    f.add(s.label).add(s.description);
  }
  if (detail::same_on_every_rank(comm, f)) {
    return;
  }
  std::vector<std::string> flat;
  flat.reserve(2 * settings.size());
  for (const setting& s : settings) {
    flat.push_back(s.label);
    flat.push_back(s.description);
  }
  const auto all = comm.allgather_obj(flat);
  std::vector<std::vector<setting>> described(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    for (std::size_t i = 0; i + 1 < all[r].size(); i += 2) {
      described[r].push_back({all[r][i], all[r][i + 1]});
    }
  }
  throw mismatch_error(engine::describe_mismatch(operation, described));
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
