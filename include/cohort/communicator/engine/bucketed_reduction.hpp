// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/communicator/bucket_order.hpp>
#include <cohort/communicator/engine/agreement.hpp>
#include <cohort/communicator/engine/bucket_plan.hpp>
#include <cohort/communicator/engine/slots.hpp>
#include <cohort/communicator/gradients.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/host.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! Reduces host gradients bucket by bucket (see bucket_plan): packs a bucket into a buffer of the
//! reducer's wire dtype (casting and pre-scaling on the way), hands the buffer to `exchange`, and
//! unpacks it (post-scaling); a gradient alone in an in-place bucket is scaled and exchanged where
//! it lies. One bucket at a time (blocking), every bucket goes through one shared buffer, which
//! stays warm in cache; with overlap, several are in flight at once, so each bucket gets a buffer
//! of its own (made at the first overlapped step of a layout). The plans and buffers of the last
//! few layouts are kept, keyed by the layout and the reducer, so that after the first step of
//! each nothing is allocated.
class bucketed_reduction {
public:
  //! `host_buffers` false: the plans only, for a packer with buffers of its own (the device's).
  explicit bucketed_reduction(bucket_limits limits, bool host_buffers = true)
      : limits_(limits)
      , host_buffers_(host_buffers) {
    entries_.reserve(max_layouts);
    in_flight_.reserve(max_in_flight);
    limits_.first_bucket_bytes = std::min(limits_.first_bucket_bytes, limits_.bucket_bytes);
  }

  //! The plan for this layout and reducer, built (buffers included) the first time it is seen.
  const bucket_plan& prepare(std::span<const grad_slot> slots, const reduction_table& reduction);

  //! Rebuilds the current plan in `order` (the order the gradients became ready in a step), once
  //! per layout; later calls change nothing. Returns whether the plan changed.
  bool learn_order(std::span<const grad_slot> slots, std::span<const std::size_t> order,
                   const reduction_table& reduction);

  //! An order seen in a step of the current layout (rank 0's, so the same on every rank): the
  //! plan is rebuilt in it at the next `prepare` of this layout, before that step's agreement (a
  //! rebuild allocates, and may fail).
  void remember_order(std::span<const std::int64_t> order);

  //! The orders learned so far (a plan built in one, or one remembered for the next step), by
  //! layout: what a checkpoint keeps.
  std::vector<bucket_order> learned_orders() const;

  //! Orders a checkpoint kept: each is adopted, as if learned, when its layout is next prepared
  //! without an order learned. Throws `invalid_argument` for an order that is not each of
  //! 0 .. n-1 once.
  void restore_orders(std::vector<bucket_order> orders);

  //! The plan of the last layout prepared.
  const bucket_plan& plan() const noexcept { return current_->plan; }

  //! The key (layout and reducer) of the current plan.
  std::uint64_t current_key() const noexcept { return current_ != nullptr ? current_->key : 0; }

  //! Whether the current layout's plan still has its order to learn.
  bool learning() const noexcept { return current_ != nullptr && !current_->learned; }

  //! Gives every packed bucket of the current plan a buffer of its own, for overlap.
  void own_buffers();

  //! The host's packer (kernels::host), for `reduce_bucket_with`; the device's is in
  //! gpu/bucketed_reduction.hpp.
  struct host_packer {
    static constexpr memory_location where = memory_location::host;
    void scale(tensor_view data, double factor) const { kernels::host::scale(data, factor); }
    void pack(std::span<const const_tensor_view> sources, tensor_view buffer, double factor) const {
      kernels::host::pack(sources, buffer, factor);
    }
    void unpack(const_tensor_view buffer, std::span<const tensor_view> targets,
                double factor) const {
      kernels::host::unpack(buffer, targets, factor);
    }
  };

  //! Reduces bucket `b` of the current plan, in its own buffer (`own_buffers` first) or the
  //! shared one, with `packer` (a host one: host_packer, or one that wraps it). Not thread-safe:
  //! one bucket at a time.
  template <class Exchange, class Packer = host_packer>
  void reduce_bucket(std::size_t b, std::span<const grad_slot> slots, Exchange&& exchange,
                     bool own_buffer = false, const Packer& packer = {}) {
    static_assert(Packer::where == memory_location::host);
    reduce_bucket_with(packer, own_buffer ? current_->owned[b].data() : current_->shared.data(), b,
                       slots, exchange);
  }

  //! Reduces bucket `b` of the current plan with `packer` (where the gradients live): a gradient
  //! alone in an in-place bucket is scaled, exchanged and scaled back where it lies; the others
  //! are packed into `buffer` (cast to the wire dtype, pre-scaled), exchanged, and unpacked
  //! (post-scaled). A gradient alone that one rank owns (a scattered reduction), with an exchange
  //! that can `start` a reduce to it, is left in flight: at most `max_in_flight` are, the oldest
  //! completed as the next one starts; `complete_in_flight` completes the rest, and must before
  //! the step's gradients are read.
  template <class Packer, class Exchange>
  void reduce_bucket_with(const Packer& packer, void* buffer, std::size_t b,
                          std::span<const grad_slot> slots, Exchange&& exchange) {
    const bucket_plan& plan = current_->plan;
    const bucket& k = plan.buckets()[b];
    const auto members = plan.members(k);
    // A scattered bucket's exchange leaves this rank's block, reduced, at the front of the data.
    const auto scatter = [&](tensor_view data) {
      if constexpr (requires { exchange(data, plan.blocks(k), k.plan.op); }) {
        exchange(data, plan.blocks(k), k.plan.op);
      } else {
        throw invalid_argument("cohort: this exchange cannot reduce-scatter a bucket");
      }
    };
    if (k.in_place) {
      const tensor_view grad = slots[members.front()].grad;
      packer.scale(grad, k.plan.pre_scale);
      if (!k.scattered) {
        exchange(grad, k.plan.op);
      } else if (const int owner = single_owner(plan.blocks(k)); owner >= 0 && starts(exchange)) {
        // Started now; the one before, if any, completed while this one is on its way.
        if constexpr (requires { exchange.start(grad, owner, k.plan.op); }) {
          in_flight_.push_back({exchange.start(grad, owner, k.plan.op), grad, k.plan.post_scale,
                                k.own_members != 0, b});
          complete_in_flight(packer, exchange, max_in_flight - 1);
        }
        return;
      } else {
        scatter(grad);
        if (k.own_members == 0) {
          return; // another rank's: reduced there
        }
      }
      packer.scale(grad, k.plan.post_scale);
      return;
    }
    collect_members(b, slots);
    const tensor_view packed{buffer, k.count, k.plan.wire, Packer::where};
    packer.pack(sources_, packed, k.plan.pre_scale);
    if (!k.scattered) {
      exchange(packed, k.plan.op);
      packer.unpack(packed, targets_, k.plan.post_scale);
      return;
    }
    scatter(packed);
    const tensor_view own{buffer, k.own_count, k.plan.wire, Packer::where};
    packer.unpack(own, std::span<const tensor_view>(targets_).subspan(k.own_first, k.own_members),
                  k.plan.post_scale);
  }

  //! Completes the reduces in flight, oldest first, until `keep` are left, waiting for each
  //! through `exchange.wait` and post-scaling this rank's own with `packer`.
  template <class Packer, class Exchange>
  void complete_in_flight(const Packer& packer, Exchange&& exchange, std::size_t keep = 0) {
    while (in_flight_.size() > keep) {
      reduce_in_flight& oldest = in_flight_.front();
      exchange.wait(oldest.request, oldest.bucket, oldest.grad.size_bytes());
      if (oldest.own) {
        packer.scale(oldest.grad, oldest.post_scale);
      }
      in_flight_.erase(in_flight_.begin());
    }
  }

  //! Whether a reduce is still in flight (`complete_in_flight` waits for it).
  bool reducing_in_flight() const noexcept { return !in_flight_.empty(); }

  //! At most this many reduces to single owners are in flight at once: the older one progresses
  //! inside MPI while the newer one starts, and reduces to different owners fill both directions
  //! of a link (at 2 x 2 ranks, stage 2's step went from 1.77x to 1.31x the unsharded one:
  //! bench/results/multihost-sharding-2x2-gather-over-every-rank.txt). Few, so that the older
  //! gradients are done early and a wait is short.
  static constexpr std::size_t max_in_flight = 2;

  //! Packs bucket `b` of the current plan (one that is not in place) into the shared buffer,
  //! cast to its wire dtype and pre-scaled: what its exchange is handed. The gradients are only
  //! read. (A small step's one bucket travels in the step's agreement: grad_sync::validate.)
  template <class Packer = host_packer>
  tensor_view pack_shared(std::size_t b, std::span<const grad_slot> slots,
                          const Packer& packer = {}) {
    const bucket& k = current_->plan.buckets()[b];
    collect_members(b, slots);
    const tensor_view packed{current_->shared.data(), k.count, k.plan.wire, Packer::where};
    packer.pack(sources_, packed, k.plan.pre_scale);
    return packed;
  }

  //! The shared buffer, reduced, into bucket `b`'s gradients, post-scaled (after pack_shared).
  template <class Packer = host_packer>
  void unpack_shared(std::size_t b, std::span<const grad_slot> slots, const Packer& packer = {}) {
    const bucket& k = current_->plan.buckets()[b];
    collect_members(b, slots);
    const const_tensor_view packed{current_->shared.data(), k.count, k.plan.wire, Packer::where};
    packer.unpack(packed, targets_, k.plan.post_scale);
  }

  //! Reduces every bucket, in plan order.
  template <class Exchange>
  void run(std::span<const grad_slot> slots, const reduction_table& reduction,
           Exchange&& exchange) {
    const bucket_plan& plan = prepare(slots, reduction);
    for (std::size_t b = 0; b < plan.buckets().size(); ++b) {
      reduce_bucket(b, slots, exchange);
    }
  }

  //! Bucket `b` of the current plan, for a mismatch message: its size, its wire dtype and its
  //! members.
  std::vector<engine::signature_entry> describe_bucket(std::size_t b,
                                                       std::span<const grad_slot> slots) const;

  //! Bytes held by the current layout's bucket buffers (for tests and memory accounting).
  std::size_t buffer_bytes() const noexcept;

  //! Buckets of the current layout.
  std::size_t bucket_count() const noexcept {
    return current_ != nullptr ? current_->plan.buckets().size() : 0;
  }

  const bucket_limits& limits() const noexcept { return limits_; }

private:
  // A trainer alternates between a handful of layouts at most (a model, an evaluation head, a
  // second optimizer): keeping that many plans avoids rebuilding them step after step.
  static constexpr std::size_t max_layouts = 4;

  struct entry {
    std::uint64_t key = 0;
    std::uint64_t used = 0;
    bool learned = false;
    bucket_plan plan;
    std::vector<std::byte> shared;             // the largest packed bucket
    std::vector<std::vector<std::byte>> owned; // one per bucket, once overlap is used
  };

  void build(entry& e, std::span<const grad_slot> slots, std::span<const std::size_t> order,
             const reduction_table& reduction);

  // The gradients of bucket `b` of the current plan, as sources to pack and targets to unpack.
  void collect_members(std::size_t b, std::span<const grad_slot> slots) {
    const bucket_plan& plan = current_->plan;
    sources_.clear();
    targets_.clear();
    for (const std::size_t s : plan.members(plan.buckets()[b])) {
      sources_.push_back(slots[s].grad);
      targets_.push_back(slots[s].grad);
    }
  }

  static void own_buffers_of(entry& e);

  // Whether `exchange` can start a reduce to one owner (and wait for it later).
  template <class Exchange>
  static bool starts(const Exchange& exchange) noexcept {
    if constexpr (requires(mpi::request & r, tensor_view t, reduce_op op) {
                    exchange.starts();
                    { exchange.start(t, 0, op) } -> std::same_as<mpi::request>;
                    exchange.wait(r, std::size_t{0}, std::size_t{0});
                  }) {
      return exchange.starts();
    } else {
      return false;
    }
  }

  // A reduce to one owner, started and not yet waited for.
  struct reduce_in_flight {
    mpi::request request;
    tensor_view grad;      // reduced in place, where it lies
    double post_scale = 1; // for its owner, once reduced
    bool own = false;      // this rank is its owner
    std::size_t bucket = 0;
  };

  bucket_limits limits_;
  bool host_buffers_ = true;
  std::vector<entry> entries_;
  entry* current_ = nullptr;
  std::uint64_t clock_ = 0;
  std::vector<std::size_t> order_;
  // Orders to rebuild a layout's plan in at its next prepare: seen at a step (rank 0's), or
  // restored from a checkpoint. One mechanism for both; a restore replaces what was pending.
  std::vector<bucket_order> pending_;
  std::vector<const_tensor_view> sources_;
  std::vector<tensor_view> targets_;
  std::vector<reduce_in_flight> in_flight_; // oldest first; the capacity stays
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/bucketed_reduction.ipp>
#endif
