// SPDX-License-Identifier: Apache-2.0
#pragma once

// Copying every parameter's value from a root to every rank: the ranks agree on the layout
// first, then small values travel packed a bucket's worth of bytes at a time and large ones in
// place, so that no copy of the model is made. The layout (names and type-erased values) is read
// by the templated front door; what follows is compiled once.

#include <cohort/communicator/agreement.hpp>
#include <cohort/communicator/detail/checks.hpp>
#include <cohort/config.hpp>
#include <cohort/kernels/host.hpp>
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
namespace detail {

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
  std::uint64_t fingerprint_for(int root) const {
    fingerprint f;
    f.add(static_cast<std::uint64_t>(root)).add(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      f.add(names[i]).add(values[i].count).add(static_cast<std::uint64_t>(values[i].type));
      f.add(static_cast<std::uint64_t>(values[i].location));
    }
    return f.value();
  }

  std::vector<signature_entry> describe() const {
    std::vector<signature_entry> described;
    for (std::size_t i = 0; i < values.size(); ++i) {
      // Host memory goes unsaid: it is the usual, and the messages keep their shape.
      const bool host = values[i].location == memory_location::host;
      described.push_back(
          {"parameter '" + names[i] + "'",
           "a value of " + describe_tensor(values[i].count, values[i].type) +
               (host ? "" : " in " + std::string(to_string(values[i].location)) + " memory")});
    }
    return described;
  }
};

//! Whether any parameter's value is in device or managed memory, by its type's (or its
//! pointer's) say only: never throws for a bad tensor, so that every rank can take this decision
//! before the front door's checks. A device strategy broadcasts such parameters on the device.
template <parameter_set Params>
bool any_parameter_on_device(Params& params) {
  for (auto&& p : params) {
    if (on_device(parameter_traits<std::remove_cvref_t<decltype(p)>>::value(p))) {
      return true;
    }
  }
  return false;
}

//! The agreement every strategy's broadcast_parameters begins with (collective): the layouts
//! and the root are the same on every rank, or every rank throws.
inline void agree_on_parameters(const checks& c, const parameter_layout& layout, int root,
                                const std::string& problem) {
  c.settle(
      "broadcast_parameters", layout.fingerprint_for(root), [&] { return layout.describe(); },
      problem);
}

//! Broadcasts host-memory values from `root` over `comm`, packing those under `threshold` bytes
//! into at most `capacity` bytes at a time. After the ranks agreed: a failure (a buffer that
//! cannot grow) ends the job.
inline void broadcast_host_values(const checks& c, MPI_Comm comm,
                                  std::span<const tensor_view> values, int root) {
  const std::size_t capacity = c.options().bucket_bytes;
  const std::size_t threshold = std::min(c.options().fusion_threshold_bytes, capacity);
  const bool is_root = c.rank() == root;
  const auto watch = c.watch_transfer("broadcast_parameters", 0);
  std::vector<std::byte> buffer;
  std::vector<tensor_view> pending;
  std::size_t filled = 0;
  const auto flush = [&] {
    if (pending.empty()) {
      return;
    }
    buffer.resize(std::max(buffer.size(), filled));
    const tensor_view packed{buffer.data(), filled, dtype::uint8, memory_location::host};
    const std::vector<const_tensor_view> sources(pending.begin(), pending.end());
    if (is_root) {
      kernels::host::pack(sources, packed);
    }
    mpi::broadcast(comm, packed, root);
    if (!is_root) {
      kernels::host::unpack(packed, pending);
    }
    pending.clear();
    filled = 0;
  };
  c.fatal_on_failure("broadcast_parameters", [&] {
    for (const tensor_view& v : values) {
      if (v.size_bytes() >= threshold) {
        mpi::broadcast(comm, v, root);
        continue;
      }
      if (filled + v.size_bytes() > capacity) {
        flush();
      }
      pending.push_back({v.data, v.size_bytes(), dtype::uint8, v.location});
      filled += v.size_bytes();
    }
    flush();
  });
}

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
