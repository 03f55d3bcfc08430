// SPDX-License-Identifier: Apache-2.0
#pragma once

// Copying every parameter's value from a root to every rank: the ranks agree on the layout
// first, then small values travel packed a bucket's worth of bytes at a time and large ones in
// place, so that no copy of the model is made. The layout (names and type-erased values) is read
// by the templated front door; what follows is compiled once.

#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/signature.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/concepts.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

//! The parameters of one broadcast, read for the agreement of the ranks before anything moves.
struct parameter_layout {
  std::vector<std::string> names;
  std::vector<tensor_view> values;

  //! Reads `params`; `view(value, what)` makes each value's view (and throws `invalid_argument`
  //! for memory the strategy cannot move).
  template <parameter_set Params, class View>
  void collect(Params& params, View&& view) {
    for (auto&& p : params) {
      using traits = parameter_traits<std::remove_cvref_t<decltype(p)>>;
      names.emplace_back(traits::name(p));
      values.push_back(view(traits::value(p), "parameter '" + names.back() + "'"));
    }
  }

  //! The root, every name, size, dtype and where each value lives: a rank whose values are in
  //! another memory takes another path, and must meet a mismatch_error, not another collective.
  std::uint64_t fingerprint_for(int root) const;

  std::vector<engine::signature_entry> describe() const;
};

//! Whether any parameter's value is in device or managed memory, by its type's (or its
//! pointer's) say only: never throws for a bad tensor, so that every rank can take this decision
//! before the front door's checks. A device strategy broadcasts such parameters on the device.
template <parameter_set Params>
bool any_parameter_on_device(Params& params) {
  for (auto&& p : params) {
    if (detail::on_device(parameter_traits<std::remove_cvref_t<decltype(p)>>::value(p))) {
      return true;
    }
  }
  return false;
}

//! The agreement every strategy's broadcast_parameters begins with (collective): the layouts
//! and the root are the same on every rank, or every rank throws.
COHORT_DECL void agree_on_parameters(const checks& c, const parameter_layout& layout, int root,
                                     const std::string& problem);

//! The start of every `broadcast_parameters`: reads `params`, each value through
//! `view(value, what)` (which throws `invalid_argument` for memory this path cannot move), and
//! agrees with the other ranks on the root and the layout (collective). A problem on any rank
//! throws on every rank, before anything moves.
template <parameter_set Params, class View>
parameter_layout agreed_parameters(const checks& c, Params& params, int root, View&& view) {
  parameter_layout layout;
  const std::string problem = local_checks([&] {
    c.check_root(root, "broadcast_parameters");
    layout.collect(params, view);
  });
  agree_on_parameters(c, layout, root, problem);
  return layout;
}

//! A device strategy's view of a parameter's value, on rank `rank`: in device memory (a value in
//! host memory among device ones is refused: one model, one kind of memory).
template <class T>
tensor_view device_value_view(int rank, T& value, const std::string& what) {
  const tensor_view v = make_view(value, what);
  if (v.location == memory_location::host) {
    throw invalid_argument("cohort: broadcast_parameters on rank " + std::to_string(rank) + ": " +
                           what +
                           " is in host memory but others are in device memory; keep a "
                           "model's parameters in one kind of memory");
  }
  return v;
}

//! Broadcasts host-memory values from `root` over `comm`, packing those under `threshold` bytes
//! into at most `capacity` bytes at a time. After the ranks agreed: a failure (a buffer that
//! cannot grow) ends the job.
COHORT_DECL void broadcast_host_values(const checks& c, MPI_Comm comm,
                                       std::span<const tensor_view> values, int root);

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/communicator/engine/impl/parameter_broadcast.ipp>
#endif
