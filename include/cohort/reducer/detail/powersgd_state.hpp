// SPDX-License-Identifier: Apache-2.0
#pragma once

// PowerSGD's state and algorithm (see reducer/powersgd.hpp): per parameter set (layout), a step
// count, and per compressed gradient its warm-started Q (the same on every rank) and its error
// feedback (this rank's own); per layout, the scratch its exchanges travel in.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/lowrank.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! PowerSGD's options, as PyTorch's `PowerSGDState` names them. Every rank must give the same:
//! the ranks agree on them (and on each layout's step count) at every step.
struct powersgd_options {
  //! r, the rank of the approximation (`matrix_approximation_rank`): per gradient,
  //! min(n, m, rank).
  int rank = 1;
  //! Steps of each parameter set reduced uncompressed first (`start_powerSGD_iter`). PyTorch
  //! defaults to 1000 and needs 2 or more; any value works here, 0 included.
  std::uint64_t start_step = 1000;
  //! A gradient is compressed only if (n + m) r · this < n m (`min_compression_rate`); 0
  //! compresses every matrix.
  double min_compression_rate = 2;
  bool error_feedback = true;
  //! Q starts each step from the last one's (one power iteration per step); false: a fresh
  //! random Q at every step.
  bool warm_start = true;
  //! Added to each norm before dividing by it (`orthogonalization_epsilon`).
  double orthogonalization_epsilon = 0;
  std::uint64_t seed = 0;
};

//! What PowerSGD sent, in values (elements), since its handle was made (this rank's).
struct powersgd_stats {
  std::uint64_t steps = 0;              //!< steps reduced (warm-up ones included)
  std::uint64_t compressed_steps = 0;   //!< of which compressed
  std::uint64_t values_before = 0;      //!< gradient elements the hook reduced
  std::uint64_t values_sent = 0;        //!< elements its exchanges carried
  std::uint64_t compressed_tensors = 0; //!< gradients compressed, counted at each step
  //! Of its compute (grad_sync_stats::hook), the time orthogonalizing P and Q; the rest is the
  //! matrix products, the error feedback and the copies.
  std::chrono::nanoseconds orthogonalizing{0};
};

//! One gradient's state, as a checkpoint keeps it.
struct powersgd_slot_record {
  std::uint64_t slot = 0;
  std::string name;
  dtype type = dtype::float32;
  std::uint64_t n = 0, m = 0, r = 0;
  bool compressed = false;
  bool q_ready = false;
  std::vector<std::byte> q; //!< Qᵀ, r x m (replicated)
  std::vector<std::byte> e; //!< the error, n x m (this rank's)
};

//! One parameter set's state, as a checkpoint keeps it.
struct powersgd_layout_record {
  std::uint64_t key = 0;
  std::uint64_t steps = 0;
  std::vector<powersgd_slot_record> slots;
};

namespace detail {

class powersgd_state {
public:
  explicit powersgd_state(powersgd_options options)
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

  powersgd_state(const powersgd_state&) = delete;
  powersgd_state& operator=(const powersgd_state&) = delete;

  const powersgd_options& options() const noexcept { return options_; }

  // ---- the gradient_hook state ---------------------------------------------------------------

  bool handles(dtype type) const noexcept {
    return type == dtype::float32 || type == dtype::float64;
  }

  void prepare(const hook_layout& l) {
    const std::shared_ptr<layout> state = find(l.key(), /*create=*/true);
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
        slot& s = state->slots[t.slot];
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

  void sign(std::uint64_t key, hook_signature& s) const {
    const std::shared_ptr<layout> state = find(key, /*create=*/false);
    // (Without the layout's lock, which a bucket's exchanges may hold on cohort's thread.)
    const std::uint64_t steps = state != nullptr ? state->steps.load() : 0;
    s.add("PowerSGD rank", static_cast<std::uint64_t>(options_.rank))
        .add("PowerSGD start_step", options_.start_step)
        .add("PowerSGD min_compression_rate", options_.min_compression_rate)
        .add("PowerSGD error_feedback", options_.error_feedback)
        .add("PowerSGD warm_start", options_.warm_start)
        .add("PowerSGD orthogonalization_epsilon", options_.orthogonalization_epsilon)
        .add("PowerSGD seed", options_.seed)
        .add("PowerSGD steps of this parameter set (a rank resumed from another checkpoint?)",
             steps);
  }

  void reduce(const hook_bucket& b) {
    const std::shared_ptr<layout> state = find(b.layout(), /*create=*/false);
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
                                   ? compress<double>(b, *state, orthogonalizing)
                                   : compress<float>(b, *state, orthogonalizing);
    std::uint64_t compressed = 0;
    for (const hook_tensor& t : b.tensors()) {
      compressed += state->slots[t.slot].compressed ? 1 : 0;
    }
    count(before, sent, compressed, orthogonalizing);
  }

  void step_ended(std::uint64_t key) {
    const std::shared_ptr<layout> state = find(key, /*create=*/false);
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

  // ---- for the handle and checkpoints --------------------------------------------------------

  powersgd_stats stats() const {
    const std::lock_guard lock(stats_mutex_);
    return stats_;
  }

  std::vector<double> error_of(std::string_view name) const {
    const std::lock_guard lock(mutex_);
    for (auto it = layouts_.rbegin(); it != layouts_.rend(); ++it) {
      const std::lock_guard layout_lock((*it)->mutex);
      for (const slot& s : (*it)->slots) {
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

  //! Every layout's state, its errors included or not (a checkpoint's two parts).
  std::vector<powersgd_layout_record> records(bool errors) const {
    const std::lock_guard lock(mutex_);
    std::vector<powersgd_layout_record> out;
    for (const auto& l : layouts_) {
      const std::lock_guard layout_lock(l->mutex);
      powersgd_layout_record& record = out.emplace_back();
      record.key = l->key;
      record.steps = l->steps;
      for (std::size_t i = 0; i < l->slots.size(); ++i) {
        const slot& s = l->slots[i];
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

  //! Adopts a checkpoint's part: the replicated one (step counts and Q) replaces every layout;
  //! the per-rank one (errors) joins the layouts of the same keys. Either may come first. Each
  //! gradient's state is checked against the parameter set when its layout is next prepared (a
  //! state that does not fit is then an error, on every rank).
  void restore(std::vector<powersgd_layout_record> records, bool errors) {
    const std::lock_guard lock(mutex_);
    if (!errors) {
      std::erase_if(layouts_, [&](const std::shared_ptr<layout>& l) {
        return std::none_of(records.begin(), records.end(),
                            [&](const powersgd_layout_record& r) { return r.key == l->key; });
      });
    }
    for (powersgd_layout_record& record : records) {
      const std::shared_ptr<layout> l = find_locked(record.key, /*create=*/true);
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

private:
  // A trainer alternates between a handful of parameter sets at most (see bucketed_reduction);
  // the least recently used one beyond this is forgotten, its errors with it.
  static constexpr std::size_t max_layouts = 8;

  struct slot {
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

  struct layout {
    std::uint64_t key = 0;
    std::atomic<std::uint64_t> steps{0}; // (written under mutex)
    std::uint64_t used = 0;
    std::vector<slot> slots; // by index in the parameter set
    // Restored from a checkpoint, adopted by their gradients at the next prepare.
    std::vector<powersgd_slot_record> pending;
    std::vector<std::byte> a; // a bucket's uncompressed values, then its P
    std::vector<std::byte> b; // a bucket's Q
    std::mutex mutex;         // one bucket at a time (and prepare, sign, saves) per layout
  };

  void prepare_slot(layout& state, slot& s, const hook_tensor& t) const {
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
            "cohort: powersgd: the state restored for parameter #" + std::to_string(t.slot) +
            " ('" + p.name + "', " + std::to_string(p.n) + " x " + std::to_string(p.m) + " " +
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

  // One bucket of a compressed step; returns the values its exchanges carried.
  template <class T>
  std::uint64_t compress(const hook_bucket& b, layout& state,
                         std::chrono::steady_clock::duration& orthogonalizing) const {
    using clock = std::chrono::steady_clock;
    const auto orthogonalize = [&](T* v, std::size_t r, std::size_t len) {
      const auto start = clock::now();
      kernels::lowrank::orthogonalize(v, r, len, options_.orthogonalization_epsilon, r > 2 ? 2 : 1);
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
      slot& s = state.slots[t.slot];
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
      if (!s.q_ready || !options_.warm_start) {
        kernels::lowrank::fill_uniform(q, s.r * s.m, options_.seed,
                                       (t.slot << 20) ^
                                           (options_.warm_start ? 0 : state.steps.load()));
        s.q_ready = true;
      }
      orthogonalize(q, s.r, s.m);
      // A column of Q that is zero (the last step's gradient had nothing in its direction: a
      // zero gradient, a frozen layer) would stay zero with a warm start, and the parameter would
      // never train again: it is drawn afresh, from what every rank shares (the seed, the
      // parameter, the step), so Q stays the same on every rank.
      if (reseed_zero_columns(q, s.r, s.m, t.slot, state.steps.load())) {
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
      slot& s = state.slots[t.slot];
      if (!s.compressed) {
        continue;
      }
      T* const p = a + at;
      const T* m = static_cast<const T*>(t.grad.data);
      orthogonalize(p, s.r, s.n);
      kernels::lowrank::back_project(m, s.n, s.m, p, s.r, q_sum + q_at);
      if (!s.e.empty()) {
        kernels::lowrank::outer(m, s.n, s.m, p, q_sum + q_at, s.r,
                                reinterpret_cast<T*>(s.e.data()));
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
      slot& s = state.slots[t.slot];
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

  // Draws afresh each column of Qᵀ (r rows of m) that is all zeros; returns whether any was.
  template <class T>
  bool reseed_zero_columns(T* qt, std::size_t r, std::size_t m, std::size_t slot,
                           std::uint64_t step) const {
    bool any = false;
    for (std::size_t k = 0; k < r; ++k) {
      T* column = qt + k * m;
      if (std::all_of(column, column + m, [](T x) { return x == T{0}; })) {
        kernels::lowrank::fill_uniform(column, m, options_.seed,
                                       kernels::lowrank::splitmix64((slot << 20) ^ k) ^ step);
        any = true;
      }
    }
    return any;
  }

  void count(std::uint64_t before, std::uint64_t sent, std::uint64_t compressed,
             std::chrono::steady_clock::duration orthogonalizing) {
    const std::lock_guard lock(stats_mutex_);
    stats_.orthogonalizing += std::chrono::duration_cast<std::chrono::nanoseconds>(orthogonalizing);
    stats_.values_before += before;
    stats_.values_sent += sent;
    stats_.compressed_tensors += compressed;
  }

  std::shared_ptr<layout> find(std::uint64_t key, bool create) const {
    const std::lock_guard lock(mutex_);
    return find_locked(key, create);
  }

  // Under mutex_. (A layout forgotten while a step uses it lives on until that step is done.)
  // Only `create` (prepare, on the caller's thread, in the order of the steps: the same on every
  // rank) counts as a use, so that every rank forgets the same layout.
  std::shared_ptr<layout> find_locked(std::uint64_t key, bool create) const {
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
    auto l = std::make_shared<layout>();
    l->key = key;
    l->used = ++clock_;
    layouts_.push_back(l);
    return l;
  }

  const powersgd_options options_;
  mutable std::mutex mutex_; // the layouts' list (the worker and the callers of several lanes)
  mutable std::vector<std::shared_ptr<layout>> layouts_;
  mutable std::uint64_t clock_ = 0;
  mutable std::mutex stats_mutex_;
  powersgd_stats stats_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
