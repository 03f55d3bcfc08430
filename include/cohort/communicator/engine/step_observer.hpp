// SPDX-License-Identifier: Apache-2.0
#pragma once

// What watches a gradient-sync step from outside it: the step tells its observer what happens
// (it began, a bucket left, the reducer waited, it ended) and the observer keeps the statistics
// (grad_sync_stats) and writes the trace (COHORT_TRACE), so that the step's code says what it
// does and not how it is counted. Only the trace's clock is read when the trace is off.

#include <cohort/communicator/engine/bucketed_reduction.hpp>
#include <cohort/communicator/engine/strategy_ref.hpp>
#include <cohort/communicator/grad_sync_stats.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/trace/recorder.hpp>
#include <cohort/trace/span.hpp>
#include <cohort/trace/ticks.hpp>
#include <cohort/transport/mpi.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

// The host packer, each call a span of the trace when it is on (one branch when off).
struct traced_host_packer {
  static constexpr memory_location where = memory_location::host;
  trace_recorder* trace = nullptr;
  trace_thread thread = trace_thread::trainer;
  std::int64_t bucket = -1;

  void scale(tensor_view data, double factor) const {
    const trace_span span(trace, "scale", thread, data.size_bytes(), bucket);
    bucketed_reduction::host_packer{}.scale(data, factor);
  }
  void pack(std::span<const const_tensor_view> sources, tensor_view buffer, double factor) const {
    const trace_span span(trace, "pack", thread, buffer.size_bytes(), bucket);
    bucketed_reduction::host_packer{}.pack(sources, buffer, factor);
  }
  void unpack(const_tensor_view buffer, std::span<const tensor_view> targets, double factor) const {
    const trace_span span(trace, "unpack", thread, buffer.size_bytes(), bucket);
    bucketed_reduction::host_packer{}.unpack(buffer, targets, factor);
  }
};

class step_observer {
public:
  using clock = std::chrono::steady_clock;

  // ---- the caller's thread --------------------------------------------------------------------

  //! A step begins, traced if `trace` (read once: a step is traced whole or not at all).
  void step_began(trace_recorder* trace) noexcept {
    trace_ = trace;
    began_ = trace_ != nullptr ? trace_ticks::now() : 0;
    started_ = clock::now();
  }
  trace_recorder* trace() const noexcept { return trace_; }

  //! The packers and the exchange of bucket `bucket` on `thread`, traced as this step is.
  traced_host_packer packer(trace_thread thread, std::int64_t bucket) const noexcept {
    return {trace_, thread, bucket};
  }
  traced_host_packer untraced_packer() const noexcept {
    return {nullptr, trace_thread::trainer, 0};
  }
  //! A bucket's exchange, traced: an all-reduce, or a reduce-scatter in blocks of `blocks`.
  struct traced_exchange {
    step_observer& self;
    const strategy_ref& s;
    trace_thread thread;
    std::size_t bucket;

    void operator()(tensor_view packed, reduce_op op) const {
      const trace_span span(self.trace_, "reduce", thread, packed.size_bytes(),
                            static_cast<std::int64_t>(bucket));
      s.exchange(s.self, packed, op);
      self.stats_.wire_bytes += packed.size_bytes();
    }
    void operator()(tensor_view packed, std::span<const int> blocks, reduce_op op) const {
      const trace_span span(self.trace_, "reduce_scatter", thread, packed.size_bytes(),
                            static_cast<std::int64_t>(bucket));
      s.exchange_scatter(s.self, packed, blocks, op);
      self.stats_.wire_bytes += packed.size_bytes();
    }
    //! Whether the strategy can start a reduce to one owner (`start`), to `wait` for it later.
    bool starts() const noexcept { return s.start_reduce != nullptr; }
    mpi::request start(tensor_view grad, int owner, reduce_op op) const {
      const trace_span span(self.trace_, "reduce (started)", thread, grad.size_bytes(),
                            static_cast<std::int64_t>(bucket));
      mpi::request started = s.start_reduce(s.self, grad, owner, op);
      self.stats_.wire_bytes += grad.size_bytes();
      return started;
    }
    //! Waits for bucket `started`'s reduce (of `bytes`), begun by `start`.
    void wait(mpi::request& request, std::size_t started, std::size_t bytes) const {
      const trace_span span(self.trace_, "reduce (completed)", thread, bytes,
                            static_cast<std::int64_t>(started));
      request.wait();
    }
  };
  traced_exchange exchange(const strategy_ref& s, trace_thread thread, std::size_t bucket) {
    return {*this, s, thread, bucket};
  }

  //! A gradient hook spent `took` on its own compute (outside its exchanges) in one bucket.
  void hook_computed(clock::duration took) noexcept { stats_.hook += took; }

  //! A blocking step's one small bucket is about to be packed to travel in the agreement.
  void carried_packing() noexcept { carried_phases_[0] = now(); }

  //! The agreement begins; the returned span traces it unless a packed bucket travels in it
  //! (then the whole step is one event).
  trace_span agreement(bool carrying) noexcept {
    if (carrying) {
      carried_phases_[1] = now();
    }
    return trace_span(carrying ? nullptr : trace_, "agreement", trace_thread::trainer, 0, -1,
                      "allreduce_grad");
  }

  //! The agreement that carried `carried` is over: if the ranks did not all carry it (`reduced`
  //! false), its pack and the agreement are traced as they went.
  void agreement_ended(tensor_view carried, bool reduced) {
    if (carried.count == 0) {
      return;
    }
    if (trace_ == nullptr) {
      stats_.wire_bytes += reduced ? carried.size_bytes() : 0;
      return;
    }
    stats_.wire_bytes += reduced ? carried.size_bytes() : 0;
    carried_phases_[2] = trace_ticks::now();
    if (!reduced) {
      trace_->span("pack", trace_thread::trainer, carried_phases_[0], carried_phases_[1],
                   carried.size_bytes(), 0);
      trace_->span("agreement", trace_thread::trainer, carried_phases_[1], carried_phases_[2], 0,
                   -1, "allreduce_grad");
    }
  }

  //! The step's buckets begin to move (after the agreement).
  void reducing_began() noexcept { reducing_ = clock::now(); }

  //! `count` buckets were reduced by the caller (`carried`: the one the agreement carried).
  void buckets_reduced(std::size_t count, bool carried = false) noexcept {
    stats_.buckets += count;
    stats_.carried += carried ? 1 : 0;
  }

  //! A blocking step of `bytes` ends (`carried`: its one bucket travelled in the agreement).
  void blocking_step_ended(std::uint64_t bytes, bool carried) {
    const auto end = clock::now();
    if (trace_ != nullptr && carried) {
      trace_->carried_step(began_, carried_phases_, trace_ticks::now(), bytes);
    } else if (trace_ != nullptr) {
      trace_->span("allreduce_grad", trace_thread::trainer, began_, trace_ticks::now(), bytes, -1,
                   "blocking");
    }
    stats_.reducing += end - reducing_;
    step_ended(end, bytes);
  }

  //! An overlapped step has been checked and begun: cohort's thread waits for its first bucket
  //! (from here on, until finish, that thread owns `reducer_idle_since_`).
  void overlapped_step_began() noexcept { reducer_idle(); }

  //! The caller is at the end of an overlapped step (finish): what it waits from here is the
  //! step's exposed time.
  void step_ending() noexcept { started_ = clock::now(); }
  //! The caller waits for the step's last buckets.
  void waiting_began() noexcept { waiting_since_ = now(); }

  //! An overlapped step of `bytes` ends: the wait and the whole step are traced.
  void overlapped_step_ended(std::uint64_t bytes) {
    step_ended(clock::now(), bytes);
    if (trace_ != nullptr) {
      const std::uint64_t at = trace_ticks::now();
      trace_->span("wait", trace_thread::trainer, waiting_since_, at, bytes, -1,
                   "allreduce_grad (end of the step)");
      trace_->span("allreduce_grad", trace_thread::trainer, began_, at, bytes, -1, "overlapped");
    }
  }

  // ---- cohort's thread ------------------------------------------------------------------------

  //! Bucket `bucket` (of `bytes` on the wire) is ready: cohort's thread waited for it since the
  //! last one. Until the returned guard goes, cohort's thread is busy with it.
  auto bucket_taken(std::size_t bucket, std::size_t bytes) {
    if (trace_ != nullptr) {
      trace_->span("wait for readiness", trace_thread::reducer, reducer_idle_since_,
                   trace_ticks::now(), bytes, static_cast<std::int64_t>(bucket));
    }
    struct idle_from_return {
      step_observer& observer;
      ~idle_from_return() { observer.reducer_idle(); }
    };
    return idle_from_return{*this};
  }

  //! Cohort's thread reduced one bucket in `took`.
  void bucket_reduced(clock::duration took) noexcept {
    stats_.reducing += took;
    ++stats_.buckets;
  }

  //! The statistics so far, reset. (The caller reads them only after finish has waited for
  //! cohort's thread.)
  grad_sync_stats take_stats() noexcept { return std::exchange(stats_, grad_sync_stats{}); }

private:
  void reducer_idle() noexcept {
    if (trace_ != nullptr) {
      reducer_idle_since_ = trace_ticks::now();
    }
  }

  std::uint64_t now() const noexcept { return trace_ != nullptr ? trace_ticks::now() : 0; }

  void step_ended(clock::time_point end, std::uint64_t bytes) noexcept {
    stats_.exposed += end - started_;
    stats_.bytes += bytes;
    ++stats_.steps;
  }

  // The caller's thread writes every field, but while an overlapped step is in flight cohort's
  // thread owns `reducer_idle_since_`, and writes `stats_.buckets`, `stats_.reducing`,
  // `stats_.wire_bytes` and `stats_.hook` (the
  // caller reads them only after finish has waited for that thread); `trace_` is only read then.
  trace_recorder* trace_ = nullptr; // the step in flight's, or null: not traced
  std::uint64_t began_ = 0;         // trace_ticks, when traced
  std::uint64_t reducer_idle_since_ = 0;
  std::uint64_t waiting_since_ = 0;
  // A carried blocking step's pack start, pack end and agreement end (trace_ticks, when traced).
  std::array<std::uint64_t, 3> carried_phases_{};
  clock::time_point started_{};  // what the caller waits: the step, or an overlapped step's end
  clock::time_point reducing_{}; // when a blocking step's buckets began to move
  // Counted by the caller's thread, and by cohort's in bucket_reduced while a step is in flight.
  grad_sync_stats stats_;
};

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
