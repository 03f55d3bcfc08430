// SPDX-License-Identifier: Apache-2.0
#pragma once

// What powersgd_state.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/error.hpp>
#include <cohort/reducer/detail/powersgd_compress.hpp>
#include <cohort/reducer/detail/powersgd_state.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

COHORT_DECL powersgd_state::powersgd_state(powersgd_options options)
    : options_(options) {
  const auto bad = [](const char* what, const std::string& value, const char* range) {
    throw invalid_argument(std::string("cohort: powersgd: ") + what + " is " + value +
                           ", and must be " + range);
  };
  if (options.rank < 1) {
    bad("rank", std::to_string(options.rank), "1 or more");
  }
  if (!(options.min_compression_rate >= 0) || !std::isfinite(options.min_compression_rate)) {
    bad("min_compression_rate", std::to_string(options.min_compression_rate),
        "finite and 0 or more");
  }
  if (!(options.orthogonalization_epsilon >= 0) ||
      !std::isfinite(options.orthogonalization_epsilon)) {
    bad("orthogonalization_epsilon", std::to_string(options.orthogonalization_epsilon),
        "finite and 0 or more");
  }
}

COHORT_DECL void powersgd_state::prepare(const hook_layout& l) {
  const std::shared_ptr<powersgd_layout> state = find(l.key(), /*create=*/true);
  const std::lock_guard lock(state->mutex);
  std::size_t slots = state->slots.size();
  for (const hook_tensor& t : l.tensors()) {
    slots = std::max(slots, static_cast<std::size_t>(t.slot) + 1);
  }
  state->slots.resize(slots);
  std::size_t a = 0;
  std::size_t b = 0;
  for (std::size_t k = 0; k < l.buckets(); ++k) {
    std::size_t a_values = 0;
    std::size_t b_values = 0;
    for (const hook_tensor& t : l.bucket(k)) {
      powersgd_slot& s = state->slots[t.slot];
      prepare_slot(*state, s, t);
      a_values += s.compressed ? s.n * s.r : t.grad.count;
      b_values += s.compressed ? s.m * s.r : 0;
      a = std::max(a, a_values * size_of(t.grad.type));
      b = std::max(b, b_values * size_of(t.grad.type));
    }
  }
  // (Sized once: a layout's buckets change only with the order learned at its first step.)
  if (state->a.size() < a) {
    state->a.resize(a);
  }
  if (state->b.size() < b) {
    state->b.resize(b);
  }
}

COHORT_DECL void powersgd_state::sign(std::uint64_t key, hook_signature& s) const {
  const std::shared_ptr<powersgd_layout> state = find(key, /*create=*/false);
  // (Without the layout's lock, which a bucket's exchanges may hold on cohort's thread.)
  const std::uint64_t steps = state != nullptr ? state->steps.load() : 0;
  s.add("PowerSGD rank", static_cast<std::uint64_t>(options_.rank))
      .add("PowerSGD start_step", options_.start_step)
      .add("PowerSGD min_compression_rate", options_.min_compression_rate)
      .add("PowerSGD error_feedback", options_.error_feedback)
      .add("PowerSGD warm_start", options_.warm_start)
      .add("PowerSGD orthogonalization_epsilon", options_.orthogonalization_epsilon)
      .add("PowerSGD seed", options_.seed)
      .add("PowerSGD steps of this parameter set (a rank resumed from another checkpoint?)", steps);
}

COHORT_DECL void powersgd_state::reduce(const hook_bucket& b) {
  const std::shared_ptr<powersgd_layout> state = find(b.layout(), /*create=*/false);
  if (state == nullptr) {
    throw invalid_argument("cohort: powersgd on rank " + std::to_string(b.rank()) +
                           ": a bucket of a parameter set it was not prepared for");
  }
  const std::lock_guard lock(state->mutex);
  std::uint64_t before = 0;
  for (const hook_tensor& t : b.tensors()) {
    before += t.grad.count;
    if (t.slot >= state->slots.size() || !state->slots[t.slot].known) {
      throw invalid_argument("cohort: powersgd on rank " + std::to_string(b.rank()) +
                             ": its state was restored while a step was reducing parameter '" +
                             std::string(t.name) +
                             "' (finish() the step before resuming a checkpoint)");
    }
  }
  if (state->steps < options_.start_step) {
    b.reduce_plain();
    count(before, before, 0, {});
    return;
  }
  std::chrono::steady_clock::duration orthogonalizing{};
  const std::uint64_t sent = b.type() == dtype::float64
                                 ? powersgd_compress<double>(options_, b, *state, orthogonalizing)
                                 : powersgd_compress<float>(options_, b, *state, orthogonalizing);
  std::uint64_t compressed = 0;
  for (const hook_tensor& t : b.tensors()) {
    compressed += state->slots[t.slot].compressed ? 1 : 0;
  }
  count(before, sent, compressed, orthogonalizing);
}

COHORT_DECL void powersgd_state::step_ended(std::uint64_t key) {
  const std::shared_ptr<powersgd_layout> state = find(key, /*create=*/false);
  if (state == nullptr) {
    return;
  }
  const std::lock_guard lock(state->mutex);
  const bool compressed = state->steps >= options_.start_step;
  ++state->steps;
  const std::lock_guard stats_lock(stats_mutex_);
  ++stats_.steps;
  stats_.compressed_steps += compressed ? 1 : 0;
}

COHORT_DECL powersgd_stats powersgd_state::stats() const {
  const std::lock_guard lock(stats_mutex_);
  return stats_;
}

COHORT_DECL std::vector<double> powersgd_state::error_of(std::string_view name) const {
  const std::lock_guard lock(mutex_);
  for (auto it = layouts_.rbegin(); it != layouts_.rend(); ++it) {
    const std::lock_guard layout_lock((*it)->mutex);
    for (const powersgd_slot& s : (*it)->slots) {
      if (s.known && s.name == name && !s.e.empty()) {
        std::vector<double> out(s.n * s.m);
        for (std::size_t i = 0; i < out.size(); ++i) {
          out[i] = s.type == dtype::float64 ? reinterpret_cast<const double*>(s.e.data())[i]
                                            : reinterpret_cast<const float*>(s.e.data())[i];
        }
        return out;
      }
    }
  }
  return {};
}

COHORT_DECL std::vector<powersgd_layout_record> powersgd_state::records(bool errors) const {
  const std::lock_guard lock(mutex_);
  std::vector<powersgd_layout_record> out;
  for (const auto& l : layouts_) {
    const std::lock_guard layout_lock(l->mutex);
    powersgd_layout_record& record = out.emplace_back();
    record.key = l->key;
    record.steps = l->steps;
    for (std::size_t i = 0; i < l->slots.size(); ++i) {
      const powersgd_slot& s = l->slots[i];
      if (!s.known || !s.compressed) {
        continue;
      }
      powersgd_slot_record& r = record.slots.emplace_back();
      r.slot = i;
      r.name = s.name;
      r.type = s.type;
      r.n = s.n;
      r.m = s.m;
      r.r = s.r;
      r.compressed = true;
      r.q_ready = s.q_ready;
      (errors ? r.e : r.q) = errors ? s.e : s.q;
    }
    for (const powersgd_slot_record& pending : l->pending) { // (restored, not yet prepared)
      powersgd_slot_record& r = record.slots.emplace_back(pending);
      (errors ? r.q : r.e).clear();
    }
  }
  return out;
}

COHORT_DECL void powersgd_state::restore(std::vector<powersgd_layout_record> records, bool errors) {
  const std::lock_guard lock(mutex_);
  if (!errors) {
    std::erase_if(layouts_, [&](const std::shared_ptr<powersgd_layout>& l) {
      return std::none_of(records.begin(), records.end(),
                          [&](const powersgd_layout_record& r) { return r.key == l->key; });
    });
  }
  for (powersgd_layout_record& record : records) {
    const std::shared_ptr<powersgd_layout> l = find_locked(record.key, /*create=*/true);
    const std::lock_guard layout_lock(l->mutex);
    l->slots.clear(); // (every gradient adopts its restored state, or starts afresh)
    if (!errors) {
      l->steps = record.steps;
    }
    for (powersgd_slot_record& r : record.slots) {
      const auto same = std::find_if(l->pending.begin(), l->pending.end(),
                                     [&](const auto& p) { return p.slot == r.slot; });
      if (same == l->pending.end()) {
        l->pending.push_back(std::move(r));
      } else if (errors) {
        same->e = std::move(r.e);
      } else {
        same->q = std::move(r.q);
        same->q_ready = r.q_ready;
      }
    }
  }
}

COHORT_DECL void powersgd_state::prepare_slot(powersgd_layout& state, powersgd_slot& s,
                                              const hook_tensor& t) const {
  if (s.known) {
    return;
  }
  const std::size_t count = t.grad.count;
  if (t.rows != 0 && count % t.rows != 0) {
    throw invalid_argument("cohort: powersgd: parameter '" + std::string(t.name) + "' has " +
                           std::to_string(count) + " elements, which are not " +
                           std::to_string(t.rows) + " rows");
  }
  const std::size_t n = t.rows;
  const std::size_t m = n == 0 ? 0 : count / n;
  const std::size_t r = std::min({n, m, static_cast<std::size_t>(options_.rank)});
  const bool compressed =
      n != 0 && m != 0 &&
      static_cast<double>(n + m) * static_cast<double>(r) * options_.min_compression_rate <
          static_cast<double>(n) * static_cast<double>(m);
  const std::size_t width = size_of(t.grad.type);
  const auto restored = std::find_if(state.pending.begin(), state.pending.end(),
                                     [&](const auto& p) { return p.slot == t.slot; });
  if (restored != state.pending.end()) {
    const powersgd_slot_record& p = *restored;
    if (p.name != t.name || p.type != t.grad.type || p.n != n || p.m != m || p.r != r ||
        !compressed) {
      throw invalid_argument(
          "cohort: powersgd: the state restored for parameter #" + std::to_string(t.slot) + " ('" +
          p.name + "', " + std::to_string(p.n) + " x " + std::to_string(p.m) + " " +
          std::string(to_string(p.type)) + ", rank " + std::to_string(p.r) +
          ") does not fit parameter '" + std::string(t.name) + "' (" + std::to_string(n) + " x " +
          std::to_string(m) + " " + std::string(to_string(t.grad.type)) + ", rank " +
          std::to_string(r) + (compressed ? "" : ", not compressed") + ")");
    }
  }
  s.known = true;
  s.name = t.name;
  s.type = t.grad.type;
  s.count = count;
  s.n = n;
  s.m = m;
  s.r = r;
  s.compressed = compressed;
  s.q_ready = false;
  s.q.clear();
  s.e.clear();
  if (compressed) {
    s.q.assign(r * m * width, std::byte{0});
    if (options_.error_feedback) {
      s.e.assign(n * m * width, std::byte{0});
    }
  }
  if (restored != state.pending.end()) {
    if (restored->q.size() == s.q.size() && !s.q.empty()) {
      s.q = std::move(restored->q);
      s.q_ready = restored->q_ready;
    }
    if (restored->e.size() == s.e.size()) {
      s.e = std::move(restored->e);
    }
    state.pending.erase(restored);
  }
}

COHORT_DECL void powersgd_state::count(std::uint64_t before, std::uint64_t sent,
                                       std::uint64_t compressed,
                                       std::chrono::steady_clock::duration orthogonalizing) {
  const std::lock_guard lock(stats_mutex_);
  stats_.orthogonalizing += std::chrono::duration_cast<std::chrono::nanoseconds>(orthogonalizing);
  stats_.values_before += before;
  stats_.values_sent += sent;
  stats_.compressed_tensors += compressed;
}

COHORT_DECL std::shared_ptr<powersgd_layout> powersgd_state::find(std::uint64_t key,
                                                                  bool create) const {
  const std::lock_guard lock(mutex_);
  return find_locked(key, create);
}

COHORT_DECL std::shared_ptr<powersgd_layout> powersgd_state::find_locked(std::uint64_t key,
                                                                         bool create) const {
  for (const auto& l : layouts_) {
    if (l->key == key) {
      l->used = create ? ++clock_ : l->used;
      return l;
    }
  }
  if (!create) {
    return nullptr;
  }
  if (layouts_.size() >= max_layouts) {
    layouts_.erase(
        std::min_element(layouts_.begin(), layouts_.end(),
                         [](const auto& x, const auto& y) { return x->used < y->used; }));
  }
  auto l = std::make_shared<powersgd_layout>();
  l->key = key;
  l->used = ++clock_;
  layouts_.push_back(l);
  return l;
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
