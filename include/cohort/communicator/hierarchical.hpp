// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/basic_communicator.hpp>
#include <cohort/communicator/engine/two_level.hpp>
#include <cohort/communicator/links.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>

#include <string_view>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Two levels, for nodes with fast links inside and one network link out (ChainerMN's
//! hierarchical): each bucket is reduced to the node's first rank over `Intra`, all-reduced
//! among the nodes' first ranks over `Inter`, and broadcast back inside the node over `Intra`.
//! Only one rank per node uses the network. Nodes may differ in size. On one node, one
//! all-reduce over `Intra` is the whole exchange.
template <class Intra = mpi_links, class Inter = mpi_links>
class hierarchical : public basic_communicator<hierarchical<Intra, Inter>> {
  static_assert(
      !std::is_same_v<Intra, nccl_links>,
      "cohort: hierarchical<nccl_links, ...> reduces GPU memory: include <cohort/nccl.hpp> "
      "in a translation unit compiled by nvcc");
  static_assert(links<Intra> && links<Inter>, "cohort: Intra and Inter must model cohort::links");
  using base = basic_communicator<hierarchical<Intra, Inter>>;

public:
  static constexpr std::string_view name = "hierarchical";

  using base::base;

private:
  friend strategy_access;

  // A bucket's exchange is an all-reduce over every rank of the communicator: a small step's
  // one bucket may travel in the step's agreement instead (grad_sync::validate).
  static constexpr bool exchange_is_allreduce = true;

  void exchange(tensor_view bucket, reduce_op op) {
    const std::size_t segment = this->options().segment_bytes;
    if (this->inter_size() == 1) {
      // One node: the whole exchange is one all-reduce over it, which MPI does in one pass where
      // a reduce and then a broadcast take two (ChainerMN's hierarchical took them).
      engine::mpi_link<Intra>{this->grad_intra_comm(), segment}.allreduce(bucket, op);
      return;
    }
    // The inter communicator of intra rank 0 links exactly the nodes' first ranks.
    engine::hierarchical_exchange(engine::mpi_link<Intra>{this->grad_intra_comm(), segment},
                                  engine::mpi_link<Inter>{this->grad_inter_comm(), segment},
                                  this->intra_rank() == 0, bucket, op);
  }
};

#if defined(COHORT_SEPARATE_COMPILATION)
// Instantiated once, in <cohort/src.hpp> (see strategy_access::ref).
extern template engine::strategy_ref strategy_access::ref<hierarchical<>>(hierarchical<>&) noexcept;
#endif

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
