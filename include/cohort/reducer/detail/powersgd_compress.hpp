// SPDX-License-Identifier: Apache-2.0
#pragma once

// PowerSGD's algorithm (see reducer/powersgd.hpp), apart from its bookkeeping
// (detail/powersgd_state.hpp): one parameter set's state, and one bucket's compressed exchange.

#include <cohort/config.hpp>
#include <cohort/kernels/lowrank.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/reducer/powersgd_options.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

struct powersgd_slot {
  bool known = false; // prepared
  std::string name;
  dtype type = dtype::float32;
  std::size_t count = 0;
  std::size_t n = 0, m = 0, r = 0;
  bool compressed = false;
  bool q_ready = false;
  std::vector<std::byte> q; // Qᵀ: r x m
  std::vector<std::byte> e; // n x m, with error feedback
};

struct powersgd_layout {
  std::uint64_t key = 0;
  std::atomic<std::uint64_t> steps{0}; // (written under mutex)
  std::uint64_t used = 0;
  std::vector<powersgd_slot> slots; // by index in the parameter set
  // Restored from a checkpoint, adopted by their gradients at the next prepare.
  std::vector<powersgd_slot_record> pending;
  std::vector<std::byte> a; // a bucket's uncompressed values, then its P
  std::vector<std::byte> b; // a bucket's Q
  std::mutex mutex;         // one bucket at a time (and prepare, sign, saves) per layout
};

// Draws afresh each column of Qᵀ (r rows of m) that is all zeros; returns whether any was.
template <class T>
bool reseed_zero_columns(const powersgd_options& options, T* qt, std::size_t r, std::size_t m,
                         std::size_t slot, std::uint64_t step) {
  bool any = false;
  for (std::size_t k = 0; k < r; ++k) {
    T* column = qt + k * m;
    if (std::all_of(column, column + m, [](T x) { return x == T{0}; })) {
      kernels::lowrank::fill_uniform(column, m, options.seed,
                                     kernels::lowrank::splitmix64((slot << 20) ^ k) ^ step);
      any = true;
    }
  }
  return any;
}

// One bucket of a compressed step; returns the values its exchanges carried.
template <class T>
std::uint64_t powersgd_compress(const powersgd_options& options, const hook_bucket& b,
                                powersgd_layout& state,
                                std::chrono::steady_clock::duration& orthogonalizing) {
  using clock = std::chrono::steady_clock;
  const auto orthogonalize = [&](T* v, std::size_t r, std::size_t len) {
    const auto start = clock::now();
    kernels::lowrank::orthogonalize(v, r, len, options.orthogonalization_epsilon, r > 2 ? 2 : 1);
    orthogonalizing += clock::now() - start;
  };
  T* const a = reinterpret_cast<T*>(state.a.data());
  T* const q_sum = reinterpret_cast<T*>(state.b.data());
  const T inverse = static_cast<T>(1.0 / static_cast<double>(b.ranks()));
  // The uncompressed gradients first, then each compressed one's P = (M + E) Q.
  std::size_t at = 0;
  for (const hook_tensor& t : b.tensors()) {
    if (!state.slots[t.slot].compressed) {
      const T* g = static_cast<const T*>(t.grad.data);
      std::copy(g, g + t.grad.count, a + at);
      at += t.grad.count;
    }
  }
  const std::size_t uncompressed = at;
  for (const hook_tensor& t : b.tensors()) {
    powersgd_slot& s = state.slots[t.slot];
    if (!s.compressed) {
      continue;
    }
    T* const m = static_cast<T*>(t.grad.data);
    if (!s.e.empty()) {
      const T* e = reinterpret_cast<const T*>(s.e.data());
      for (std::size_t i = 0; i < s.n * s.m; ++i) {
        m[i] += e[i];
      }
    }
    T* const q = reinterpret_cast<T*>(s.q.data());
    if (!s.q_ready || !options.warm_start) {
      kernels::lowrank::fill_uniform(q, s.r * s.m, options.seed,
                                     (t.slot << 20) ^
                                         (options.warm_start ? 0 : state.steps.load()));
      s.q_ready = true;
    }
    orthogonalize(q, s.r, s.m);
    // A column of Q that is zero (the last step's gradient had nothing in its direction: a
    // zero gradient, a frozen layer) would stay zero with a warm start, and the parameter would
    // never train again: it is drawn afresh, from what every rank shares (the seed, the
    // parameter, the step), so Q stays the same on every rank.
    if (reseed_zero_columns(options, q, s.r, s.m, t.slot, state.steps.load())) {
      orthogonalize(q, s.r, s.m);
    }
    kernels::lowrank::project(m, s.n, s.m, q, s.r, a + at);
    at += s.n * s.r;
  }
  b.allreduce(tensor_view{a, at, b.type(), memory_location::host}, reduce_op::sum);
  std::uint64_t sent = at;
  // A gradient that was not finite on some rank (a loss scaler's overflow): the sum is the
  // same on every rank, so every rank sees it, writes NaN over the compressed gradients (the
  // uncompressed ones get their mean, inf or NaN as it is) for the scaler to skip the step, and
  // leaves the errors and Q as they were, so that the steps after are not poisoned.
  const bool finite = std::all_of(a, a + at, [](T x) { return std::isfinite(x); });
  at = 0;
  for (const hook_tensor& t : b.tensors()) {
    if (!state.slots[t.slot].compressed) {
      T* g = static_cast<T*>(t.grad.data);
      for (std::size_t i = 0; i < t.grad.count; ++i) {
        g[i] = a[at + i] * inverse;
      }
      at += t.grad.count;
    }
  }
  if (!finite) {
    for (const hook_tensor& t : b.tensors()) {
      if (state.slots[t.slot].compressed) {
        T* g = static_cast<T*>(t.grad.data);
        std::fill(g, g + t.grad.count, std::numeric_limits<T>::quiet_NaN());
      }
    }
    return sent;
  }
  // P̂ = orth(Σ P); this rank's Q = Mᵀ P̂; its error (I − P̂P̂ᵀ) M = M − P̂ Qᵀ.
  at = uncompressed;
  std::size_t q_at = 0;
  for (const hook_tensor& t : b.tensors()) {
    powersgd_slot& s = state.slots[t.slot];
    if (!s.compressed) {
      continue;
    }
    T* const p = a + at;
    const T* m = static_cast<const T*>(t.grad.data);
    orthogonalize(p, s.r, s.n);
    kernels::lowrank::back_project(m, s.n, s.m, p, s.r, q_sum + q_at);
    if (!s.e.empty()) {
      kernels::lowrank::outer(m, s.n, s.m, p, q_sum + q_at, s.r, reinterpret_cast<T*>(s.e.data()));
    }
    at += s.n * s.r;
    q_at += s.m * s.r;
  }
  if (q_at == 0) {
    return sent;
  }
  b.allreduce(tensor_view{q_sum, q_at, b.type(), memory_location::host}, reduce_op::sum);
  sent += q_at;
  // Q̂ = Σ Q / N, kept for the next step; M = P̂ Q̂ᵀ.
  at = uncompressed;
  q_at = 0;
  for (const hook_tensor& t : b.tensors()) {
    powersgd_slot& s = state.slots[t.slot];
    if (!s.compressed) {
      continue;
    }
    T* const q = reinterpret_cast<T*>(s.q.data());
    for (std::size_t i = 0; i < s.r * s.m; ++i) {
      q[i] = q_sum[q_at + i] * inverse;
    }
    kernels::lowrank::outer<T>(nullptr, s.n, s.m, a + at, q, s.r, static_cast<T*>(t.grad.data));
    at += s.n * s.r;
    q_at += s.m * s.r;
  }
  return sent;
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
