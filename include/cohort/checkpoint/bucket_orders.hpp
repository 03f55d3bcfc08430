// SPDX-License-Identifier: Apache-2.0
#pragma once

// A communicator's learned bucket orders in a checkpoint (see communicator/bucket_order.hpp):
//
//   ckpt.save(step, params, cohort::bucket_orders(comm), ...);
//   ckpt.resume(params, cohort::bucket_orders(comm), ...);
//
// With overlap, the buckets are built in the order the gradients became ready in the first
// step; a resumed run that learned them anew could group the gradients otherwise, and at 3 ranks
// and more MPI would then sum some elements in another order. Restored, the resumed run's
// buckets are the saved run's, and its parameters equal bit for bit those of a run never
// stopped. Replicated: the ranks learned the same orders, and a save compares them.

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/communicator/bucket_order.hpp>
#include <cohort/config.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A communicator that learns bucket orders (any of cohort's).
template <class C>
concept learns_bucket_orders = requires(C& c, const C& k, std::vector<bucket_order> orders) {
  { k.learned_bucket_orders() } -> std::same_as<std::vector<bucket_order>>;
  c.restore_bucket_orders(std::move(orders));
};

template <learns_bucket_orders Communicator>
struct bucket_orders_ref {
  Communicator* communicator;
};

//! `comm`'s learned bucket orders, for a checkpoint.
template <learns_bucket_orders Communicator>
bucket_orders_ref<Communicator> bucket_orders(Communicator& comm) {
  return {&comm};
}

template <class Communicator>
struct checkpoint_traits<bucket_orders_ref<Communicator>> {
  static constexpr state_scope scope = state_scope::replicated;
  static constexpr std::string_view kind = "bucket orders";

  static void save(checkpoint::byte_writer& out, const bucket_orders_ref<Communicator>& ref) {
    const std::vector<bucket_order> orders = ref.communicator->learned_bucket_orders();
    out.put<std::uint64_t>(orders.size());
    for (const bucket_order& o : orders) {
      out.put<std::uint64_t>(o.layout);
      out.put<std::uint64_t>(o.order.size());
      for (const std::size_t i : o.order) {
        out.put<std::uint64_t>(i);
      }
    }
  }

  static void load(checkpoint::byte_reader& in, bucket_orders_ref<Communicator>& ref,
                   const load_context&) {
    // Every count is checked against the bytes left before anything is allocated for it.
    const auto layouts = in.get<std::uint64_t>("the number of layouts");
    if (layouts > in.left() / (2 * sizeof(std::uint64_t))) {
      in.fail("the number of layouts", std::to_string(layouts) + " does not fit in the " +
                                           std::to_string(in.left()) + " bytes left");
    }
    std::vector<bucket_order> orders(static_cast<std::size_t>(layouts));
    for (bucket_order& o : orders) {
      o.layout = in.get<std::uint64_t>("a layout");
      const auto n = in.get<std::uint64_t>("the number of gradients of a layout");
      if (n > in.left() / sizeof(std::uint64_t)) {
        in.fail("an order", "of " + std::to_string(n) + " gradients does not fit in the " +
                                std::to_string(in.left()) + " bytes left");
      }
      o.order.resize(static_cast<std::size_t>(n));
      for (std::size_t& i : o.order) {
        i = static_cast<std::size_t>(in.get<std::uint64_t>("a gradient's index"));
      }
    }
    // (which refuses an order that is not each of 0 .. n-1 once)
    ref.communicator->restore_bucket_orders(std::move(orders));
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
