// SPDX-License-Identifier: Apache-2.0
#pragma once

// How a communicator reads a parameter set: each parameter's gradient becomes a type-erased
// slot, missing gradients are zero-filled or reported, and the ranks agree on the layout before
// any buffer is reduced.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reducer/concepts.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/mpi/communicator.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! What to do with a parameter that has no gradient this step (an unused layer, say).
enum class missing_grad {
  report,   //!< throw `invalid_argument` naming the parameter, on every rank
  zero_fill //!< give it a zero gradient (resizing the gradient tensor), then reduce as usual
};

//! Options of one gradient synchronisation.
struct grad_sync_options {
  missing_grad missing = missing_grad::report;
  //! Empty: every rank gets every reduced gradient (an all-reduce). Otherwise one rank per
  //! parameter, in the set's order (a sharded optimizer's `shard_plan::owner`): the gradients are
  //! reduce-scattered, and parameter i's reduced gradient reaches rank `owners[i]` alone; the
  //! others keep their own, unreduced (times the reducer's pre-scale, for a gradient reduced in
  //! place by a reducer that has one: not mean's nor compressed's). Same bytes on the wire as half
  //! an all-reduce. Host strategies only; not with a gradient hook. The span must outlive the
  //! reduction.
  std::span<const int> owners = {};
};

//! What becomes of an overlapped reduction's gradients once it is waited for: the ranks compare it
//! at the end of the step, so that a rank that drops them while another updates with them (and
//! the replicas part) is an error on every rank.
enum class step_end : unsigned char {
  update,  //!< an optimizer steps with them (step, synchronize)
  discard, //!< they are dropped (skip_step, zero_grad before a step)
  keep     //!< they stay reduced, for a later step: a second backward accumulates onto them, or
           //!< another optimizer's step came first (a GAN's discriminator during the
           //!< generator's backward)
};

//! What `end` does with the reduced gradients, as the ranks' agreement names it.
constexpr const char* describe(step_end end) noexcept {
  switch (end) {
  case step_end::update:
    return "update the parameters (step, synchronize)";
  case step_end::discard:
    return "are dropped (skip_step, or zero_grad before a step)";
  case step_end::keep:
    break;
  }
  return "are kept, reduced, for a later step (a second backward, or another optimizer's step)";
}

//! Where a parameter's gradient stands when it is read for a reduction.
enum class slot_state : unsigned char { ok, missing, wrong_size, not_contiguous };

//! One parameter's gradient, type-erased: what the gradient-sync engine reduces, and what a
//! wrapper that reduces copies of the gradients (double buffering) hands to the communicator.
struct grad_slot {
  std::string_view name;
  tensor_view grad;
  std::size_t value_count = 0;
  slot_state state = slot_state::ok;
  //! The gradient as a matrix of `rows` rows stored row after row (0: not a matrix), for hooks
  //! that compress matrices. From the parameter's traits, else the gradient tensor's.
  std::size_t rows = 0;
};

namespace detail {

template <parameter P>
grad_slot collect_one(P& p, missing_grad missing) {
  using traits = parameter_traits<std::remove_cvref_t<P>>;
  grad_slot slot;
  slot.value_count = tensor_size(traits::value(p));
  auto* g = traits::grad(p);
  const bool absent = g == nullptr || (tensor_size(*g) == 0 && slot.value_count != 0);
  if (absent && g != nullptr && missing == missing_grad::zero_fill) {
    using grad_type = std::remove_pointer_t<decltype(g)>;
    if constexpr (resizable_tensor<grad_type>) {
      traits_of<grad_type>::resize(*g, slot.value_count);
    }
  }
  if (g == nullptr || (tensor_size(*g) == 0 && slot.value_count != 0)) {
    slot.state = slot_state::missing;
  } else if (tensor_is_contiguous(*g)) {
    slot.grad = make_view(*g);
    if constexpr (requires { traits::rows(p); }) {
      slot.rows = static_cast<std::size_t>(traits::rows(p));
    }
    if (slot.rows == 0) {
      slot.rows = tensor_rows(*g);
    }
    if (slot.grad.count != slot.value_count) {
      slot.state = slot_state::wrong_size;
    }
  } else {
    slot.state = slot_state::not_contiguous;
  }
  return slot;
}

} // namespace detail

//! Reads a parameter set into `slots`, and the parameters' names into `names` (owned: a name may
//! be a temporary). The capacities of both are reused from step to step.
template <parameter_set Params>
void collect_gradients(Params& params, missing_grad missing, std::vector<grad_slot>& slots,
                       std::vector<std::string>& names) {
  slots.clear();
  std::size_t count = 0;
  for (auto&& p : params) {
    using traits = parameter_traits<std::remove_cvref_t<decltype(p)>>;
    if (names.size() <= count) {
      names.emplace_back();
    }
    names[count++].assign(std::string_view(traits::name(p)));
    slots.push_back(detail::collect_one(p, missing));
  }
  // Only now that `names` has stopped growing may the slots point into it.
  for (std::size_t i = 0; i < count; ++i) {
    slots[i].name = names[i];
  }
}

namespace detail {

//! Whether a set's elements are kept by address when an overlapped reduction begins, so that
//! `grad_ready(i)` reads parameter i again in O(1): a set not reached by index whose elements live
//! at stable addresses (a std::list, a std::deque's iterators...). A random-access set is read by
//! index; one that makes its elements on the fly (a view) is walked.
template <class Params>
inline constexpr bool remembers_elements =
    !std::ranges::random_access_range<Params> &&
    std::is_lvalue_reference_v<std::ranges::range_reference_t<Params>>;

//! Keeps where each element of `params` lives in `elements`, if the set needs it (its capacity is
//! reused: nothing is allocated after the first step).
template <parameter_set Params>
void remember_elements(Params& params, std::vector<void*>& elements) {
  if constexpr (remembers_elements<Params>) {
    elements.clear();
    for (auto& p : params) {
      elements.push_back(const_cast<void*>(static_cast<const void*>(std::addressof(p))));
    }
  }
}

//! Parameter `index` of `params` read again (see `remembers_elements`).
template <parameter_set Params>
grad_slot reread_parameter(Params& params, std::size_t index, std::span<void* const> elements,
                           missing_grad missing) {
  if constexpr (std::ranges::random_access_range<Params>) {
    // (A set may make its elements on the fly: a temporary is read as one.)
    auto&& element = std::ranges::begin(params)[index];
    return collect_one(element, missing);
  } else if constexpr (remembers_elements<Params>) {
    using element = std::remove_reference_t<std::ranges::range_reference_t<Params>>;
    return collect_one(*static_cast<element*>(elements[index]), missing);
  } else {
    auto it = std::ranges::begin(params);
    std::ranges::advance(it, static_cast<std::ranges::range_difference_t<Params>>(index));
    auto&& element = *it;
    return collect_one(element, missing);
  }
}

//! Every parameter's value as a writable view, and its name. The capacities of both are reused
//! from step to step (a sharded optimizer reads them at every step).
template <parameter_set Params>
void collect_values(Params& params, std::vector<tensor_view>& values,
                    std::vector<std::string>& names) {
  values.clear();
  std::size_t count = 0;
  for (auto&& p : params) {
    using traits = parameter_traits<std::remove_cvref_t<decltype(p)>>;
    if (names.size() <= count) {
      names.emplace_back();
    }
    names[count].assign(std::string_view(traits::name(p)));
    auto& value = traits::value(p);
    if (!tensor_is_contiguous(value)) {
      throw invalid_argument("cohort: the value of parameter '" + names[count] +
                             "' is not contiguous; cohort moves contiguous tensors only");
    }
    values.push_back(make_view(value));
    ++count;
  }
  names.resize(count);
}

} // namespace detail

//! A parameter set whose type is erased, once: what the communicator reads from a set (every
//! gradient into slots; one parameter again; where its elements live), through one table of
//! functions per set type. For a holder that cannot name the set's type (the optimizer wrapper);
//! the communicator's own members that take a set read it through one too, so that there is one
//! erasure, not one per layer. Refers to the set, which must outlive it.
class parameter_source {
public:
  template <parameter_set Params>
  explicit parameter_source(Params& params) noexcept
      : set_(const_cast<void*>(static_cast<const void*>(std::addressof(params))))
      , operations_(&operations_of<Params>) {}
  //! Refers to the set: a temporary would be gone before it is read.
  template <class Params>
  parameter_source(const Params&&) = delete;

  //! Reads every parameter's gradient into `slots`, their names into `names` (collect_gradients).
  void collect(missing_grad missing, std::vector<grad_slot>& slots,
               std::vector<std::string>& names) const {
    operations_->collect(set_, missing, slots, names);
  }
  //! Whether `grad_ready(i)` reads parameter i through the addresses kept by `remember`.
  bool remembers_elements() const noexcept { return operations_->remembers_elements; }
  void remember(std::vector<void*>& elements) const { operations_->remember(set_, elements); }
  //! Parameter `index` read again.
  grad_slot reread(std::size_t index, std::span<void* const> elements, missing_grad missing) const {
    return operations_->reread(set_, index, elements, missing);
  }
  //! The set's address: which set this is.
  const void* address() const noexcept { return set_; }
  //! Reads every parameter's value into `values` (a writable view each) and its name into
  //! `names`. Throws `invalid_argument` naming a value that is not contiguous.
  void values(std::vector<tensor_view>& values, std::vector<std::string>& names) const {
    operations_->values(set_, values, names);
  }

private:
  struct operations {
    void (*collect)(void*, missing_grad, std::vector<grad_slot>&, std::vector<std::string>&);
    void (*remember)(void*, std::vector<void*>&);
    grad_slot (*reread)(void*, std::size_t, std::span<void* const>, missing_grad);
    void (*values)(void*, std::vector<tensor_view>&, std::vector<std::string>&);
    bool remembers_elements;
  };
  template <class Params>
  static constexpr operations operations_of{
      [](void* set, missing_grad missing, std::vector<grad_slot>& slots,
         std::vector<std::string>& names) {
        collect_gradients(*static_cast<Params*>(set), missing, slots, names);
      },
      [](void* set, std::vector<void*>& elements) {
        detail::remember_elements(*static_cast<Params*>(set), elements);
      },
      [](void* set, std::size_t index, std::span<void* const> elements, missing_grad missing) {
        return detail::reread_parameter(*static_cast<Params*>(set), index, elements, missing);
      },
      [](void* set, std::vector<tensor_view>& values, std::vector<std::string>& names) {
        detail::collect_values(*static_cast<Params*>(set), values, names);
      },
      detail::remembers_elements<Params>};

  void* set_;
  const operations* operations_;
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
