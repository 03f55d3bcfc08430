// SPDX-License-Identifier: Apache-2.0
#pragma once

// Batched pack and unpack on the device: every gradient tensor of a step (any sizes, any dtypes)
// into one fusion buffer and back, casting and scaling on the way, in one kernel launch each
// (ChainerMN's batched_copy). The per-element logic is kernels/batch.hpp's.

#if !defined(__CUDACC__)
#error                                                                                             \
    "cohort/kernels/pack.cuh is CUDA: compile this translation unit with nvcc (host code packs with <cohort/kernels/host.hpp>)"
#endif

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/kernels/batch.hpp>
#include <cohort/kernels/launch.cuh>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::device {

// Each block copies tiles of `tile` buffer elements, one thread a lane (batch.hpp's pack_range):
// the tensor a tile starts in is found once per tile, not once per element, and each tensor's
// part is a plain loop of its dtype. Grid-stride over the tiles.
template <class Wire>
COHORT_KERNEL void pack_kernel(const batch_entry* entries, std::size_t count, std::uint64_t total,
                               std::uint64_t tile, Wire* buffer, batch_factor factor) {
  for (std::uint64_t first = blockIdx.x * tile; first < total; first += gridDim.x * tile) {
    pack_range(entries, count, first, total - first > tile ? first + tile : total, buffer, factor,
               threadIdx.x, blockDim.x);
  }
}

template <class Wire>
COHORT_KERNEL void unpack_kernel(const batch_entry* entries, std::size_t count, std::uint64_t total,
                                 std::uint64_t tile, const Wire* buffer, batch_factor factor) {
  for (std::uint64_t first = blockIdx.x * tile; first < total; first += gridDim.x * tile) {
    unpack_range(entries, count, first, total - first > tile ? first + tile : total, buffer, factor,
                 threadIdx.x, blockDim.x);
  }
}

namespace detail {
// A tile of at most 8192 elements (each of 256 threads copies 32, four at a time), fewer for a
// small batch so that it still spreads over about 1024 blocks: a 1 MiB bucket in tiles of 8192
// would be 32 blocks on a GPU of 132 multiprocessors.
inline std::uint64_t tile_for(std::uint64_t total) {
  constexpr std::uint64_t smallest = 4 * block_size;
  constexpr std::uint64_t largest = 8192;
  constexpr std::uint64_t blocks = 1024;
  const std::uint64_t even = (total + blocks - 1) / blocks;
  return std::clamp((even + smallest - 1) / smallest * smallest, smallest, largest);
}
inline unsigned grid_for(std::uint64_t total, std::uint64_t tile) {
  return static_cast<unsigned>(std::min<std::uint64_t>((total + tile - 1) / tile, 65536));
}
} // namespace detail

//! The batch table of the last pack or unpack, in pinned host memory and on the device, reused
//! from step to step. The event keeps the next step from rewriting the host copy while the last
//! one's transfer may still read it. A workspace serves one stream (the engine's own: one per
//! bucket and direction); another stream gets a fresh upload.
class batch_workspace {
public:
  //! Copies the table of `tensors` (packed one after the other from buffer element 0) to the
  //! device on `stream`; returns the device copy and the total number of elements. The table of
  //! the call before, on the same stream, is not copied again: every step of a training loop
  //! packs the same tensors, and two uploads a bucket were a third of a bucket's host time.
  template <class View>
  std::pair<const batch_entry*, std::uint64_t> upload(std::span<const View> tensors,
                                                      cudaStream_t stream) {
    if (const auto total = unchanged(tensors, stream)) {
      return {static_cast<const batch_entry*>(device_.data()), *total};
    }
    const std::size_t bytes = tensors.size() * sizeof(batch_entry);
    entries_ = 0; // (no table is reused until this one is wholly uploaded)
    if (copied_) {
      copied_->synchronize();
    } else {
      copied_.emplace();
    }
    auto* host = static_cast<batch_entry*>(host_.reserve(bytes));
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      host[i] = {const_cast<void*>(static_cast<const void*>(tensors[i].data)), total,
                 tensors[i].type};
      total += tensors[i].count;
    }
    void* device = device_.reserve(bytes);
    cuda::check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync (batch table)");
    copied_->record(stream);
    entries_ = tensors.size();
    stream_ = stream;
    return {static_cast<const batch_entry*>(device), total};
  }

private:
  // The total, if `tensors` make the table uploaded last on `stream` (queued there before any
  // kernel this call launches on it, so it is on the device when they read it).
  template <class View>
  std::optional<std::uint64_t> unchanged(std::span<const View> tensors, cudaStream_t stream) const {
    if (!copied_ || stream != stream_ || tensors.size() != entries_) {
      return std::nullopt;
    }
    const auto* last = static_cast<const batch_entry*>(host_.data());
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (last[i].data != tensors[i].data || last[i].begin != total ||
          last[i].type != tensors[i].type) {
        return std::nullopt;
      }
      total += tensors[i].count;
    }
    return total;
  }

  cuda::pinned_buffer host_;
  cuda::device_buffer device_;
  std::optional<cuda::event> copied_; // created at the first upload: constructing costs nothing
  std::size_t entries_ = 0;
  cudaStream_t stream_ = nullptr;
};

namespace detail {
inline batch_factor factor_of(double factor) {
  return {static_cast<float>(factor), factor};
}

inline void require_device(memory_location location, const char* operation) {
  if (location == memory_location::host) {
    throw invalid_argument(std::string("cohort: ") + operation +
                           " on the device was given a tensor in host memory");
  }
}

// What pack and unpack do before their launch: every tensor on the device, the table uploaded,
// a buffer large enough for the batch.
template <class View>
std::pair<const batch_entry*, std::uint64_t>
prepare(std::span<const View> tensors, memory_location buffer_location, std::size_t buffer_count,
        cudaStream_t stream, batch_workspace& workspace, const char* operation) {
  require_device(buffer_location, operation);
  for (const auto& t : tensors) {
    require_device(t.location, operation);
  }
  const auto uploaded = workspace.upload(tensors, stream);
  if (uploaded.second > buffer_count) {
    throw invalid_argument(std::string("cohort: ") + operation + " needs a buffer of " +
                           std::to_string(uploaded.second) + " elements but has " +
                           std::to_string(buffer_count));
  }
  return uploaded;
}
} // namespace detail

//! Packs `sources` one after the other into `buffer` (cast to its dtype, times `factor`), in one
//! launch on `stream`.
inline void pack(std::span<const const_tensor_view> sources, tensor_view buffer, double factor,
                 cudaStream_t stream, batch_workspace& workspace) {
  const auto [entries, total] =
      detail::prepare(sources, buffer.location, buffer.count, stream, workspace, "pack");
  if (total == 0) {
    return;
  }
  visit(buffer.type, [&]<class Wire>(std::type_identity<Wire>) {
    const std::uint64_t tile = detail::tile_for(total);
    pack_kernel<Wire><<<detail::grid_for(total, tile), block_size, 0, stream>>>(
        entries, sources.size(), total, tile, static_cast<Wire*>(buffer.data),
        detail::factor_of(factor));
  });
  check_launch("pack_kernel");
}

//! The inverse of `pack`, in one launch on `stream`.
inline void unpack(const_tensor_view buffer, std::span<const tensor_view> targets, double factor,
                   cudaStream_t stream, batch_workspace& workspace) {
  const auto [entries, total] =
      detail::prepare(targets, buffer.location, buffer.count, stream, workspace, "unpack");
  if (total == 0) {
    return;
  }
  visit(buffer.type, [&]<class Wire>(std::type_identity<Wire>) {
    const std::uint64_t tile = detail::tile_for(total);
    unpack_kernel<Wire><<<detail::grid_for(total, tile), block_size, 0, stream>>>(
        entries, targets.size(), total, tile, static_cast<const Wire*>(buffer.data),
        detail::factor_of(factor));
  });
  check_launch("unpack_kernel");
}

} // namespace kernels::device
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
