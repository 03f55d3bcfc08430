// SPDX-License-Identifier: Apache-2.0
#pragma once

// PowerSGD's state (see reducer/powersgd.hpp): per parameter set (layout), a step count, and per
// compressed gradient its warm-started Q (the same on every rank) and its error feedback (this
// rank's own); per layout, the scratch its exchanges travel in. The algorithm that uses them is
// detail/powersgd_compress.hpp, which only the definitions (impl/powersgd_state.ipp) include.

#include <cohort/config.hpp>
#include <cohort/reducer/hook.hpp>
#include <cohort/reducer/powersgd_options.hpp>
#include <cohort/tensor/dtype.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

struct powersgd_layout;
struct powersgd_slot;

class powersgd_state {
public:
  explicit powersgd_state(powersgd_options options);

  powersgd_state(const powersgd_state&) = delete;
  powersgd_state& operator=(const powersgd_state&) = delete;

  const powersgd_options& options() const noexcept { return options_; }

  // ---- the gradient_hook state ---------------------------------------------------------------

  bool handles(dtype type) const noexcept {
    return type == dtype::float32 || type == dtype::float64;
  }

  void prepare(const hook_layout& l);

  void sign(std::uint64_t key, hook_signature& s) const;

  void reduce(const hook_bucket& b);

  void step_ended(std::uint64_t key);

  // ---- for the handle and checkpoints --------------------------------------------------------

  powersgd_stats stats() const;

  std::vector<double> error_of(std::string_view name) const;

  //! Every layout's state, its errors included or not (a checkpoint's two parts).
  std::vector<powersgd_layout_record> records(bool errors) const;

  //! Adopts a checkpoint's part: the replicated one (step counts and Q) replaces every layout;
  //! the per-rank one (errors) joins the layouts of the same keys. Either may come first. Each
  //! gradient's state is checked against the parameter set when its layout is next prepared (a
  //! state that does not fit is then an error, on every rank).
  void restore(std::vector<powersgd_layout_record> records, bool errors);

private:
  // A trainer alternates between a handful of parameter sets at most (see bucketed_reduction);
  // the least recently used one beyond this is forgotten, its errors with it.
  static constexpr std::size_t max_layouts = 8;

  void prepare_slot(powersgd_layout& state, powersgd_slot& s, const hook_tensor& t) const;

  void count(std::uint64_t before, std::uint64_t sent, std::uint64_t compressed,
             std::chrono::steady_clock::duration orthogonalizing);

  std::shared_ptr<powersgd_layout> find(std::uint64_t key, bool create) const;

  // Under mutex_. (A layout forgotten while a step uses it lives on until that step is done.)
  // Only `create` (prepare, on the caller's thread, in the order of the steps: the same on every
  // rank) counts as a use, so that every rank forgets the same layout.
  std::shared_ptr<powersgd_layout> find_locked(std::uint64_t key, bool create) const;

  const powersgd_options options_;
  mutable std::mutex mutex_; // the layouts' list (the worker and the callers of several lanes)
  mutable std::vector<std::shared_ptr<powersgd_layout>> layouts_;
  mutable std::uint64_t clock_ = 0;
  mutable std::mutex stats_mutex_;
  powersgd_stats stats_;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/reducer/detail/impl/powersgd_state.ipp>
#endif
