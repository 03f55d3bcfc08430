// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the gradient-sync engine asks of a strategy, found at compile time: whether it reduces
// device memory, the hooks it defines (as a `strategy_ref` of function pointers, so that the
// engine is compiled once whatever the strategy) and how it groups gradients into buckets. A
// strategy keeps its hooks private, open to `strategy_access` alone.

#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/strategy_ref.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/communicator/options.hpp>
#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! Whether `Strategy` reduces device memory (it says so with `static constexpr bool
//! reduces_gpu_memory = true`): such a strategy reduces all gradients in one call of its own; a
//! host strategy exchanges buckets, and can overlap them with backward. A function, not a
//! concept: nvcc caches a concept's answer, and it would ask while the strategy is incomplete.
template <class Strategy>
constexpr bool is_device_strategy() {
  return requires {
    requires Strategy::reduces_gpu_memory;
  };
}

} // namespace detail

//! How the engine reaches a strategy's hooks, which the strategy keeps private and opens to this
//! class alone (`friend cohort::strategy_access;`, as Boost.Iterator's `iterator_core_access`):
//! they are not for its users to call. Public hooks need no friend.
class strategy_access {
public:
  //! `strategy` as the engine sees it: its `reduce_gradients` (and `prepare_gradients`, if
  //! any) for a device strategy, its `exchange` (and `prepare_exchange`, `exchange_scatter`, if
  //! any) for a host one; for either, its `void check_gradient_memory(const grad_slot&)`, if any,
  //! which throws `invalid_argument` for a gradient in memory it cannot reduce (by default all
  //! memory of the right location is fine).
  template <class Strategy>
  static engine::strategy_ref ref(Strategy& strategy) noexcept;

  //! The number of buckets a device strategy reduces per step (it counts its own with
  //! `device_bucket_count()`), or nothing for a host strategy.
  template <class Strategy>
  static std::optional<std::size_t> device_bucket_count(const Strategy& strategy) noexcept {
    if constexpr (requires { strategy.device_bucket_count(); }) {
      return strategy.device_bucket_count();
    } else {
      return std::nullopt;
    }
  }

  //! How gradients are grouped into buckets under `options` for `Strategy`, which may say
  //! otherwise with a static `bucket_limits_for(options)` (naive does: no buckets).
  template <class Strategy>
  static engine::bucket_limits bucketing(const communicator_options& options) {
    if constexpr (requires { Strategy::bucket_limits_for(options); }) {
      return Strategy::bucket_limits_for(options);
    } else {
      return {options.bucket_bytes, options.first_bucket_bytes,
              std::min(options.fusion_threshold_bytes, options.bucket_bytes)};
    }
  }
};

// Not inline: a program built with COHORT_SEPARATE_COMPILATION instantiates it once for each
// shipped host strategy with its default links (flat, naive, dummy, hierarchical<>,
// two_dimensional<>, shared_memory<>), in <cohort/src.hpp>
// (communicator/impl/shipped_strategies.ipp), and its lambdas, which call the strategy's
// exchange, are not compiled again in every translation unit. (An inline one would be: g++
// instantiates an inline function at -O2 to inline it, extern template or not.)
template <class Strategy>
engine::strategy_ref strategy_access::ref(Strategy& strategy) noexcept {
  engine::strategy_ref s;
  s.self = &strategy;
  if constexpr (detail::is_device_strategy<Strategy>()) {
    s.reduce_all = [](void* p, std::span<const grad_slot> slots, const reduction_table& t) {
      static_cast<Strategy*>(p)->reduce_gradients(slots, t);
    };
    if constexpr (requires(const Strategy& st) { st.device_bucket_count(); }) {
      s.device_buckets = [](const void* p) -> std::size_t {
        return static_cast<const Strategy*>(p)->device_bucket_count();
      };
    }
    if constexpr (requires(Strategy & st, std::span<const grad_slot> g, const reduction_table& t) {
                    st.prepare_gradients(g, t);
                  }) {
      s.prepare_all = [](void* p, std::span<const grad_slot> slots, const reduction_table& t) {
        static_cast<Strategy*>(p)->prepare_gradients(slots, t);
      };
    }
  } else {
    s.exchange = [](void* p, tensor_view bucket, reduce_op op) {
      static_cast<Strategy*>(p)->exchange(bucket, op);
    };
    if constexpr (requires(Strategy & st, tensor_view b, std::span<const int> blocks,
                           reduce_op op) { st.exchange_scatter(b, blocks, op); }) {
      s.exchange_scatter = [](void* p, tensor_view bucket, std::span<const int> blocks,
                              reduce_op op) {
        static_cast<Strategy*>(p)->exchange_scatter(bucket, blocks, op);
      };
    } else { // (basic_communicator's: MPI_Reduce_scatter, or MPI_Ireduce, over every rank)
      s.exchange_scatter = [](void* p, tensor_view bucket, std::span<const int> blocks,
                              reduce_op op) {
        static_cast<Strategy*>(p)->reduce_scatter_bucket(bucket, blocks, op);
      };
      // Across nodes only: over shared memory Open MPI's non-blocking reduce is 1.2-1.8x
      // slower than its blocking one, across 1 Gbit/s links two in flight are faster
      // (bench/results/owners-one-host.txt, multihost-owners-*.txt).
      if (strategy.inter_size() > 1) {
        s.start_reduce = [](void* p, tensor_view bucket, int root, reduce_op op) {
          return static_cast<Strategy*>(p)->start_reduce_to(bucket, root, op);
        };
      }
    }
    if constexpr (requires { requires Strategy::exchange_is_allreduce; }) {
      s.exchange_is_allreduce = true;
    }
    if constexpr (requires(Strategy & st, const engine::bucket& b) { st.prepare_exchange(b); }) {
      s.prepare = [](void* p, const engine::bucket& b) {
        static_cast<Strategy*>(p)->prepare_exchange(b);
      };
    }
  }
  if constexpr (requires(Strategy & st, const grad_slot& slot) {
                  st.check_gradient_memory(slot);
                }) {
    s.check_gradient_memory = [](void* p, const grad_slot& slot) {
      static_cast<Strategy*>(p)->check_gradient_memory(slot);
    };
  }
  return s;
}

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
