// SPDX-License-Identifier: Apache-2.0
#pragma once

// The gradient-sync engine's member functions (see grad_sync.hpp): inline in every translation
// unit by default, compiled once in the one that includes <cohort/src.hpp> when
// COHORT_SEPARATE_COMPILATION is defined.

#include <cohort/communicator/engine/grad_sync.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL void grad_sync::reduce_blocking(const checks& c, const strategy_ref& s,
                                            const reduction_table& table, missing_grad missing,
                                            std::string problem) {
  const profiler_range step("allreduce_grad (blocking)");
  observer_.step_began(c.trace()); // (a pause or resume takes effect at the next step)
  const bool carried = validate(c, s, table, missing, reduction_mode::blocking, std::move(problem));
  const auto watch = c.watch_transfer("allreduce_grad", c.live().bytes(waiter::caller));
  observer_.reducing_began();
  c.fatal_on_failure("allreduce_grad", [&] {
    const std::span<const grad_slot> slots(slots_);
    if (carried) { // its one bucket was reduced in the agreement (traced as one event)
      reduction_.unpack_shared(0, slots, observer_.untraced_packer());
      observer_.buckets_reduced(1, /*carried=*/true);
      return;
    }
    if (s.device()) {
      const trace_span span(observer_.trace(), "reduce (enqueued on the device)",
                            trace_thread::trainer, step_bytes_);
      s.reduce_all(s.self, slots, table);
      observer_.buckets_reduced(s.device_buckets != nullptr ? s.device_buckets(s.self) : 0);
      return;
    }
    const std::size_t buckets = reduction_.plan().buckets().size();
    checks_ = &c; // (no overlapped step is pending: the front door checked)
    strategy_ = s;
    for (std::size_t b = 0; b < buckets; ++b) {
      reduce_one(b, trace_thread::trainer, /*own_buffer=*/false);
    }
    complete_in_flight(trace_thread::trainer);
    observer_.buckets_reduced(buckets);
  });
  hook_step_ended();
  observer_.blocking_step_ended(step_bytes_, carried);
}

COHORT_DECL void grad_sync::begin(const checks& c, const strategy_ref& s,
                                  const reduction_table& table, missing_grad missing,
                                  const void* owner, std::string problem, worker_type& worker,
                                  std::uint64_t generation) {
  step_range_.open("allreduce_grad (overlapped)");
  observer_.step_began(c.trace()); // (a pause or resume takes effect at the next step)
  try {
    validate(c, s, table, missing, reduction_mode::overlapped, std::move(problem));
  } catch (...) {
    step_range_.close(); // no step began
    throw;
  }
  observer_.overlapped_step_began();
  checks_ = &c;
  strategy_ = s;
  owner_ = owner;
  missing_ = missing;
  readiness_.begin(reduction_.plan(), slots_.size());
  generation_ = generation;
  abandoned_from_.store(none);
  caller_marked_ = false;
  kept_.store(false);
  problem_.clear();
  problem_flag_.store(false);
  worker_ = &worker;
  worker.start(*this, reduction_.plan().buckets().size());
  pending_ = true;
}

COHORT_DECL void grad_sync::require_pending(const checks& c, std::string_view operation) const {
  if (!pending_) {
    throw invalid_argument("cohort: " + std::string(operation) + " on rank " +
                           std::to_string(c.rank()) +
                           ": no overlapped allreduce_grad is pending (begin_allreduce_grad "
                           "starts one)");
  }
}

COHORT_DECL void grad_sync::mark_reread(std::size_t index, const grad_slot& now) {
  grad_slot& then = slots_[index];
  if (now.state != slot_state::ok || now.grad.count != then.grad.count ||
      now.grad.type != then.grad.type || now.grad.location != then.grad.location ||
      now.rows != then.rows) {
    grad_slot changed = now;
    changed.name = then.name;
    report("cohort: grad_ready on rank " + std::to_string(checks_->rank()) + ": " +
           engine::slot_label(then) + " had " + engine::slot_description(then) +
           " when the reduction began, and now has " + engine::slot_description(changed));
    return;
  }
  then.grad = now.grad;
  mark(index);
}

COHORT_DECL void grad_sync::mark_rest_ready() {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!readiness_.is_ready(i)) {
      mark_ready(i);
    }
  }
  // Buckets whose members are all empty gradients have nothing to wait for.
  if (!readiness_.all_launched()) {
    worker_->launch(*this, readiness_.launch_all());
  }
}

COHORT_DECL void grad_sync::verify_unmoved(std::span<const grad_slot> now) {
  if (!pending_ || problem_flag_.load()) {
    return; // (the first problem is the one every rank hears of)
  }
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const grad_slot& then = slots_[i];
    const bool same = i < now.size() && now[i].state == then.state &&
                      now[i].grad.data == then.grad.data && now[i].grad.count == then.grad.count &&
                      now[i].grad.type == then.grad.type;
    if (!same) {
      report("cohort: step on rank " + std::to_string(checks_->rank()) + ": " +
             engine::slot_label(then) + " (#" + std::to_string(i) +
             "): its gradient was replaced after " +
             (readiness_.is_ready(i) ? "backward marked it ready" : "the reduction began") + " (" +
             engine::slot_description(then) + " then, " +
             (i < now.size() ? engine::slot_description(now[i]) : std::string("no gradient")) +
             " now): its reduced value would never reach it. Change a gradient in place "
             "(grad.copy_(...)) or after step(), and zero_grad() before backward, not between "
             "backward and step()");
      return;
    }
  }
}

COHORT_DECL void grad_sync::finish(step_end end) {
  detail::operation_scope scope("allreduce_grad");
  observer_.step_ending();
  struct done_on_exit {
    grad_sync& g;
    ~done_on_exit() {
      // Whatever threw, cohort's thread is done with this step before the next may start.
      g.worker_->wait(g, /*rethrow=*/false);
      const std::lock_guard lock(g.mutex_);
      g.pending_ = false; // first: a query under the mutex never finds it pending and closed
      g.worker_->close(g);
      g.step_range_.close();
      g.hook_alive_.reset();
    }
  } done{*this};
  const checks& c = *checks_;
  const profiler_range waiting("wait");
  observer_.waiting_began();
  // A bucket's agreement that failed failed on every rank alike: rethrown here everywhere.
  worker_->wait(*this);
  // A problem found after the last bucket left (a gradient marked twice, say): an error on
  // every rank, the failing rank's own.
  const std::string problem = problem_flag_.load() ? problem_ : std::string();
  if (c.options().check_agreement) {
    c.settle_on(waiter::caller, "allreduce_grad (end of the step)", static_cast<std::uint64_t>(end),
                problem, [end] {
                  return std::vector<signature_entry>{{"the reduced gradients", describe(end)}};
                });
  } else if (!problem.empty()) {
    throw invalid_argument(problem);
  }
  hook_step_ended();
  if (reduction_.learning() && abandoned_from_.load() == none) {
    learn_order(c);
  }
  kept_.store(end == step_end::keep);
  observer_.overlapped_step_ended(step_bytes_);
}

COHORT_DECL void grad_sync::abandon(std::string_view why) noexcept {
  if (!pending_) {
    return;
  }
  try {
    {
      const std::lock_guard lock(mutex_);
      if (!pending_) {
        return;
      }
      abandoned_from_.store(readiness_.launched());
      report("cohort: rank " + std::to_string(checks_->rank()) +
             " abandoned its overlapped gradient reduction (" + std::string(why) +
             "): the gradients it had not marked ready were never sent");
      worker_->launch(*this, readiness_.launch_all());
    }
    finish();
  } catch (...) {
    // Every rank is told through the agreement; this rank has nothing more to say.
  }
}

COHORT_DECL bool grad_sync::complete() {
  if (!pending_) {
    return true;
  }
  const std::lock_guard lock(mutex_);
  return readiness_.all_launched() && worker_->idle(*this) &&
         worker_->waiting_before(*this) == nullptr;
}

COHORT_DECL void grad_sync::reduce_bucket(std::size_t b) {
  const checks& c = *checks_;
  const bucket& k = reduction_.plan().buckets()[b];
  const bool last = b + 1 == reduction_.plan().buckets().size();
  const auto busy = observer_.bucket_taken(b, k.count * size_of(k.plan.wire));
  if (c.options().check_agreement) {
    std::string problem = problem_flag_.load(std::memory_order_acquire) ? problem_ : std::string();
    detail::fingerprint f;
    f.add(b).add(k.count).add(static_cast<std::uint64_t>(k.plan.wire));
    try {
      c.settle_on(
          waiter::reducer, "allreduce_grad (a bucket)", f.value(), problem,
          [&] { return reduction_.describe_bucket(b, slots_); }, k.count * size_of(k.plan.wire));
    } catch (...) {
      // It failed alike on every rank, which all skip the rest of the step: each completes the
      // reduces that the buckets before this one started everywhere.
      complete_in_flight_watched(c);
      throw;
    }
  }
  if (b >= abandoned_from_.load()) {
    if (last) {
      complete_in_flight_watched(c);
    }
    return;
  }
  const auto watch = c.watch_transfer("allreduce_grad (a bucket)", k.count * size_of(k.plan.wire),
                                      waiter::reducer);
  const auto start = std::chrono::steady_clock::now();
  c.fatal_on_failure("allreduce_grad (a bucket on cohort's thread)", [&] {
    reduce_one(b, trace_thread::reducer, /*own_buffer=*/true);
    if (last) { // (the worker counts the step's buckets done: their gradients must be reduced)
      complete_in_flight(trace_thread::reducer);
    }
  });
  observer_.bucket_reduced(std::chrono::steady_clock::now() - start);
}

COHORT_DECL void grad_sync::complete_in_flight(trace_thread thread) {
  if (!reduction_.reducing_in_flight()) {
    return;
  }
  const std::size_t last = reduction_.plan().buckets().size() - 1; // (where the trace shows it)
  reduction_.complete_in_flight(observer_.packer(thread, static_cast<std::int64_t>(last)),
                                observer_.exchange(strategy_, thread, last));
}

COHORT_DECL void grad_sync::complete_in_flight_watched(const checks& c) {
  if (!reduction_.reducing_in_flight()) {
    return;
  }
  const auto watch = c.watch_transfer("allreduce_grad (the reduces in flight)", 0, waiter::reducer);
  c.fatal_on_failure("allreduce_grad (the reduces in flight on cohort's thread)",
                     [&] { complete_in_flight(trace_thread::reducer); });
}

COHORT_DECL void grad_sync::reduce_one(std::size_t b, trace_thread thread, bool own_buffer) {
  const bucket& k = reduction_.plan().buckets()[b];
  const auto traced_bucket = static_cast<std::int64_t>(b);
  if (!k.hooked) {
    reduction_.reduce_bucket(b, std::span<const grad_slot>(slots_),
                             observer_.exchange(strategy_, thread, b), own_buffer,
                             observer_.packer(thread, traced_bucket));
    return;
  }
  // The views as they are now: a gradient marked ready may have been read again since prepare.
  const std::size_t first = hook_offsets_[b];
  const std::size_t last = hook_offsets_[b + 1];
  for (std::size_t i = first; i < last; ++i) {
    hook_tensors_[i].grad = slots_[hook_tensors_[i].slot].grad;
  }
  using clock = std::chrono::steady_clock;
  struct context {
    grad_sync& self;
    std::size_t b;
    trace_thread thread;
    bool own_buffer;
    clock::duration exchanging{};
  } x{*this, b, thread, own_buffer};
  static constexpr hook_bucket::engine_calls calls{
      [](void* p, tensor_view data, reduce_op op) {
        auto& x = *static_cast<context*>(p);
        const auto start = clock::now();
        x.self.observer_.exchange(x.self.strategy_, x.thread, x.b)(data, op);
        x.exchanging += clock::now() - start;
      },
      [](void* p) {
        auto& x = *static_cast<context*>(p);
        const auto start = clock::now();
        x.self.reduction_.reduce_bucket(
            x.b, std::span<const grad_slot>(x.self.slots_),
            x.self.observer_.exchange(x.self.strategy_, x.thread, x.b), x.own_buffer,
            x.self.observer_.packer(x.thread, static_cast<std::int64_t>(x.b)));
        x.self.complete_in_flight(x.thread); // (the hook reads the reduced bucket next)
        x.exchanging += clock::now() - start;
      }};
  const hook_bucket view(hook_key_, b, checks_->rank(), checks_->size(),
                         std::span<const hook_tensor>(hook_tensors_).subspan(first, last - first),
                         k.count * size_of(k.plan.wire), calls, &x);
  const auto start = clock::now();
  {
    const trace_span span(observer_.trace(), "hook", thread, k.count * size_of(k.plan.wire),
                          traced_bucket);
    hook_.reduce(view);
  }
  observer_.hook_computed(clock::now() - start - x.exchanging);
}

COHORT_DECL void grad_sync::prepare_hook(const checks& c, const reduction_table& table) {
  hook_tensors_.clear();
  hook_offsets_.assign(1, 0);
  hook_key_ = engine::slots_fingerprint(slots_);
  const bucket_plan& plan = reduction_.plan();
  for (const bucket& k : plan.buckets()) {
    if (k.hooked) {
      for (const std::size_t s : plan.members(k)) {
        hook_tensors_.push_back({slots_[s].grad, slots_[s].rows, s, slots_[s].name});
      }
    }
    hook_offsets_.push_back(hook_tensors_.size());
  }
  table.hook().prepare(hook_layout(hook_key_, c.rank(), c.size(), hook_tensors_, hook_offsets_));
  hook_prepared_ = true;
}

COHORT_DECL void grad_sync::hook_step_ended() noexcept {
  if (hook_prepared_) {
    hook_prepared_ = false;
    hook_.step_ended(hook_key_);
  }
  hook_alive_.reset();
}

COHORT_DECL void grad_sync::learn_order(const checks& c) {
  std::vector<std::int64_t>& order = order_message_; // reused: no allocation per step
  const std::span<const std::size_t> seen = readiness_.seen();
  order.assign(seen.size() + 1, caller_marked_ ? 1 : 0);
  std::copy(seen.begin(), seen.end(), order.begin() + 1);
  {
    // On the caller's channel, as the end of the step: cohort's thread may be reducing another
    // lane's buckets on its own.
    const auto watch = c.watch_transfer("allreduce_grad (learning the order)", 0, waiter::caller);
    mpi::broadcast(c.live().channel(waiter::caller),
                   tensor_view{order.data(), order.size(), dtype::int64, memory_location::host}, 0);
  }
  if (order[0] == 1) {
    reduction_.remember_order(std::span<const std::int64_t>(order).subspan(1));
  }
}

COHORT_DECL void grad_sync::report(std::string problem) {
  if (!checks_->options().check_agreement) {
    if (abandoned_from_.load() != none) {
      return; // abandoning: nothing to tell without the agreement
    }
    throw invalid_argument(problem);
  }
  if (!problem_flag_.load()) {
    problem_ = std::move(problem);
    problem_flag_.store(true, std::memory_order_release);
  }
}

COHORT_DECL void grad_sync::mark_ready(std::size_t index) {
  std::string problem;
  const auto launch = readiness_.mark(reduction_.plan(), index, problem);
  if (launch) {
    worker_->launch(*this, *launch);
  } else if (!problem.empty()) {
    report("cohort: grad_ready on rank " + std::to_string(checks_->rank()) + ": " +
           (index < slots_.size()
                ? engine::slot_label(slots_[index]) + " (#" + std::to_string(index) + ") "
                : std::string()) +
           problem);
  }
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
