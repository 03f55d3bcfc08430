// SPDX-License-Identifier: Apache-2.0
#pragma once

// What parameter_broadcast.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/parameter_broadcast.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/kernels/host.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL void agree_on_parameters(const checks& c, const parameter_layout& layout, int root,
                                     const std::string& problem) {
  c.settle(
      "broadcast_parameters", layout.fingerprint_for(root), [&] { return layout.describe(); },
      problem);
}

COHORT_DECL void broadcast_host_values(const checks& c, MPI_Comm comm,
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

COHORT_DECL std::uint64_t parameter_layout::fingerprint_for(int root) const {
  detail::fingerprint f;
  f.add(static_cast<std::uint64_t>(root)).add(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    f.add(names[i]).add(values[i].count).add(static_cast<std::uint64_t>(values[i].type));
    f.add(static_cast<std::uint64_t>(values[i].location));
  }
  return f.value();
}

COHORT_DECL std::vector<engine::signature_entry> parameter_layout::describe() const {
  std::vector<engine::signature_entry> described;
  for (std::size_t i = 0; i < values.size(); ++i) {
    // Host memory goes unsaid: it is the usual, and the messages keep their shape.
    const bool host = values[i].location == memory_location::host;
    described.push_back(
        {"parameter '" + names[i] + "'",
         "a value of " + engine::describe_tensor(values[i].count, values[i].type) +
             (host ? "" : " in " + std::string(to_string(values[i].location)) + " memory")});
  }
  return described;
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
