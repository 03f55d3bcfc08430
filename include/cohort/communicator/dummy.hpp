// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <cstring>
#include <numeric>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Does everything `flat` does to gradients (collect, check, pack, scale, unpack) except the
//! reduction itself (the agreement check, if on, still costs its one small all-reduce): what is
//! left of a step's cost without the network. Gradients come out scaled as the reducer says but not
//! summed, so training with it is not data-parallel training. Every other collective (tensors,
//! objects, parameter broadcast) does communicate, so data scattering and metrics still work.
class dummy : public basic_communicator<dummy> {
public:
  static constexpr std::string_view name = "dummy";

  using basic_communicator<dummy>::basic_communicator;

private:
  friend strategy_access;

  void exchange(tensor_view, reduce_op) {}

  // Nothing is summed; this rank's block goes where a reduce-scatter leaves it (the front).
  void exchange_scatter(tensor_view bucket, std::span<const int> blocks, reduce_op) {
    const auto before = std::accumulate(blocks.begin(), blocks.begin() + rank(), std::size_t{0});
    auto* bytes = static_cast<std::byte*>(bucket.data);
    std::memmove(bytes, bytes + before * size_of(bucket.type),
                 static_cast<std::size_t>(blocks[static_cast<std::size_t>(rank())]) *
                     size_of(bucket.type));
  }
};

#if defined(COHORT_SEPARATE_COMPILATION)
// Instantiated once, in <cohort/src.hpp> (see strategy_access::ref).
extern template engine::strategy_ref strategy_access::ref<dummy>(dummy&) noexcept;
#endif

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
