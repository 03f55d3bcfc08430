// SPDX-License-Identifier: Apache-2.0
#pragma once

// The cross-rank agreement check: before a collective, the ranks compare a 64-bit fingerprint of
// what each passes (counts, sizes, dtypes) in one tiny all-reduce, at the liveness rendezvous.
// Only when the fingerprints differ do they exchange the full descriptions, so that every rank
// throws the same mismatch_error naming the first difference, the ranks and both sides, instead
// of hanging or reducing misaligned buffers.

#include <cohort/communicator/engine/liveness.hpp>
#include <cohort/communicator/engine/signature.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/detail/watchdog.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! Every rank's description, in rank order (collective over `comm`). Sent as flat text, a
//! length before each string, in two MPI calls: Boost.Serialization would do it too, but would be
//! compiled into every translation unit that reduces a gradient (a third of its build time).
COHORT_DECL std::vector<std::vector<signature_entry>>
gather_descriptions(MPI_Comm comm, const std::vector<signature_entry>& mine);

//! Checks that every rank of the communicator behind `live` passed the same things, at the
//! rendezvous of thread `who` (see liveness.hpp: a peer that left or stalled ends the job instead
//! of hanging it). Each pair is a fingerprint of this rank's and the full description it stands
//! for, asked for only when the fingerprints differ. Throws `mismatch_error` on every rank when
//! they do, naming the first item that differs (in the first pair that differs), both values and
//! both ranks. Several pairs cost one rendezvous, and keep each description's item numbers.
template <class... Describe>
bool require_agreement_carrying_of(liveness& live, waiter who, const char* operation,
                                   std::uint64_t sequence, tensor_view data, reduce_op op,
                                   std::pair<std::uint64_t, Describe>... checks);

template <class... Describe>
void require_agreement_of(liveness& live, waiter who, const char* operation, std::uint64_t sequence,
                          std::pair<std::uint64_t, Describe>... checks) {
  // The carrying rendezvous with nothing to carry (one mechanism, one mismatch path).
  (void)require_agreement_carrying_of(live, who, operation, sequence, tensor_view{}, reduce_op::sum,
                                      checks...);
}

//! `require_agreement_of` with one fingerprint.
template <class Describe>
void require_agreement(liveness& live, waiter who, const char* operation, std::uint64_t sequence,
                       std::uint64_t hash, Describe&& describe) {
  require_agreement_of(live, who, operation, sequence,
                       std::pair<std::uint64_t, Describe&>(hash, describe));
}

//! `require_agreement_of` for a small all-reduce, whose data the rendezvous carries and reduces
//! (liveness::allreduce_max_carrying): when the ranks agree and every one carried its data,
//! `data` is overwritten with the reduction over every rank and the result is true, the
//! collective done in the agreement's round trip; false when the data was not carried (too
//! large), and `data` is untouched. A mismatch throws as `require_agreement_of` does, `data`
//! untouched.
template <class... Describe>
bool require_agreement_carrying_of(liveness& live, waiter who, const char* operation,
                                   std::uint64_t sequence, tensor_view data, reduce_op op,
                                   std::pair<std::uint64_t, Describe>... checks) {
  if (live.size() == 1) {
    return data.count > 0; // its own data is the reduction (and nothing carried is none)
  }
  constexpr std::size_t n = sizeof...(Describe);
  std::array<std::uint64_t, 2 * n> bounds{};
  std::size_t i = 0;
  ((bounds[i] = checks.first, bounds[i + n] = ~checks.first, ++i), ...);
  const std::byte* reduced = live.allreduce_max_carrying(
      who, bounds, operation, sequence,
      const_tensor_view{data.data, data.count, data.type, data.location}, op);
  std::size_t differing = 0;
  while (differing < n && bounds[differing] == ~bounds[differing + n]) {
    ++differing;
  }
  if (differing == n) {
    if (reduced != nullptr) { // (only when every rank carried its bytes: never an empty view)
      std::memcpy(data.data, reduced, data.size_bytes());
    }
    return reduced != nullptr;
  }
  // Every rank has arrived (each contributed to the bounds): the exchange below cannot wait for
  // a rank that never comes, only for one that dies now, which the watchdog covers.
  std::vector<signature_entry> mine;
  i = 0;
  ((i++ == differing ? (mine = checks.second(), 0) : 0), ...);
  std::vector<std::vector<signature_entry>> all;
  {
    const detail::watch_scope watch(live.slot(who), operation, sequence, 0, true);
    all = gather_descriptions(live.channel(who), mine);
  }
  throw mismatch_error(describe_mismatch(operation, all));
}

//! `require_agreement_carrying_of` with one fingerprint.
template <class Describe>
bool require_agreement_carrying(liveness& live, waiter who, const char* operation,
                                std::uint64_t sequence, std::uint64_t hash, Describe&& describe,
                                tensor_view data, reduce_op op) {
  return require_agreement_carrying_of(live, who, operation, sequence, data, op,
                                       std::pair<std::uint64_t, Describe&>(hash, describe));
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/agreement.ipp>
#endif
