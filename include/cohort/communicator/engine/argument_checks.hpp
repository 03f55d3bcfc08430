// SPDX-License-Identifier: Apache-2.0
#pragma once

// This rank's own checks of a call's arguments, before the ranks agree: a root or a peer that is
// not a rank, blocks whose sizes do not add up, memory the strategy cannot reduce. Each throws
// `invalid_argument` naming the call, this rank and both sizes; the front doors run them inside
// `local_checks` (checks.hpp), so that the problem becomes one the ranks agree on instead of an
// exception that would leave the others waiting.

#include <cohort/config.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! The argument checks of one rank of a `size`-rank communicator.
class argument_checks {
public:
  argument_checks(int rank, int size) noexcept
      : rank_(rank)
      , size_(size) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  void check_root(int root, std::string_view operation) const {
    check_rank(root, "root", operation);
  }
  void check_peer(int peer, std::string_view operation) const {
    check_rank(peer, "peer", operation);
  }
  //! `r` is a rank of this communicator; `role` names it in the message ("root", "peer").
  void check_rank(int r, std::string_view role, std::string_view operation) const;

  //! `block` holds n elements and `whole` size() * n, of the same dtype.
  void check_blocks(const_tensor_view block, const_tensor_view whole,
                    std::string_view operation) const;

  //! `counts` has one count per rank, `block` counts[rank()] elements and `whole` their sum, of
  //! the same dtype. Returns the offsets: where each rank's block begins in `whole`.
  std::vector<std::size_t> check_counted_blocks(const_tensor_view block, const_tensor_view whole,
                                                std::span<const std::size_t> counts,
                                                std::string_view operation) const;
  //! `check_counted_blocks`, within what one MPI call takes (int counts and offsets). Returns the
  //! counts and the offsets as MPI takes them.
  std::pair<std::vector<int>, std::vector<int>>
  check_variable_blocks(const_tensor_view block, const_tensor_view whole,
                        std::span<const std::size_t> counts, std::string_view operation) const;

  //! Throws unless `in` and `out` have one dtype and one count, a multiple of the ranks (alltoall).
  void check_exchange(const_tensor_view in, const_tensor_view out,
                      std::string_view operation) const;

  //! Refuses device memory (`device == false`) or host memory (`device == true`), naming the
  //! strategies that take it.
  void require_location(memory_location location, bool device, std::string_view operation) const;

private:
  // "cohort: <operation> on rank <rank>: ", the start of every message.
  std::string where(std::string_view operation) const;
  // Throws unless `block` and `whole` have one dtype.
  void require_one_dtype(const_tensor_view block, const_tensor_view whole,
                         const std::string& where) const;

  int rank_;
  int size_;
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/argument_checks.ipp>
#endif
