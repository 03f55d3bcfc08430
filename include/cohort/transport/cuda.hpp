// SPDX-License-Identifier: Apache-2.0
#pragma once

// Thin RAII bindings to the CUDA runtime: the current device, streams, events and buffers, and
// every CUDA error turned into an exception that names the call, the device and the rank. Only
// the runtime's C API is used here, so any host compiler can include this header; kernels are in
// cohort/kernels/*.cuh, for nvcc.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/transport/mpi.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace cuda {

//! The current device, or -1 if there is none.
inline int current_device() noexcept {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return -1;
  }
  return device;
}

//! Turns a CUDA error into an `engine_error` naming the call, the current device and the rank.
inline void check(cudaError_t code, std::string_view call) {
  if (code == cudaSuccess) {
    return;
  }
  throw engine_error("CUDA", std::string(call), mpi::world_rank(), static_cast<int>(code),
                     std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code) +
                         " (device " + std::to_string(current_device()) + ")");
}

//! The number of devices this process can see (0 where there is no driver or no GPU).
inline int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError(); // clear the sticky "no device" error
    return 0;
  }
  return count;
}

//! Makes `device` current for the lifetime of the guard, then restores the previous one.
class device_guard {
public:
  explicit device_guard(int device)
      : previous_(current_device()) {
    if (device != previous_) {
      check(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  ~device_guard() {
    if (previous_ >= 0 && previous_ != current_device()) {
      (void)cudaSetDevice(previous_);
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

private:
  int previous_;
};

//! Picks the device of a rank from its index on its node (`comm.intra_rank()`), as every
//! data-parallel trainer does: rank i of a node drives GPU i mod (GPUs on the node). Returns it.
//! Throws `invalid_argument` if the process sees no GPU.
inline int select_device(int intra_rank) {
  const int count = device_count();
  if (count == 0) {
    throw invalid_argument("cohort: select_device on rank " + std::to_string(mpi::world_rank()) +
                           ": this process sees no CUDA device");
  }
  const int device = intra_rank % count;
  check(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

//! An owned, non-blocking CUDA stream on the device current at construction.
class stream {
public:
  stream()
      : device_(current_device()) {
    check(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  stream(stream&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr))
      , device_(other.device_) {}
  stream& operator=(stream&& other) noexcept {
    std::swap(handle_, other.handle_);
    std::swap(device_, other.device_);
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() {
    if (handle_ != nullptr) {
      (void)cudaStreamDestroy(handle_);
    }
  }

  cudaStream_t get() const noexcept { return handle_; }
  int device() const noexcept { return device_; }
  void synchronize() const { check(cudaStreamSynchronize(handle_), "cudaStreamSynchronize"); }

private:
  cudaStream_t handle_ = nullptr;
  int device_ = -1;
};

//! An owned CUDA event without timing: orders one stream after another without a device-wide
//! synchronisation.
class event {
public:
  event() { check(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming), "cudaEventCreate"); }
  event(event&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  event& operator=(event&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() {
    if (handle_ != nullptr) {
      (void)cudaEventDestroy(handle_);
    }
  }

  cudaEvent_t get() const noexcept { return handle_; }
  //! Marks the point in `on` that `wait_on` and `done` refer to.
  void record(cudaStream_t on) { check(cudaEventRecord(handle_, on), "cudaEventRecord"); }
  //! Makes `waiting` wait for the recorded point (on the device; the host does not block).
  void make_wait(cudaStream_t waiting) const {
    check(cudaStreamWaitEvent(waiting, handle_, 0), "cudaStreamWaitEvent");
  }
  //! Whether the recorded work has finished; never blocks.
  bool done() const {
    const cudaError_t code = cudaEventQuery(handle_);
    if (code == cudaErrorNotReady) {
      return false;
    }
    check(code, "cudaEventQuery");
    return true;
  }
  void synchronize() const { check(cudaEventSynchronize(handle_), "cudaEventSynchronize"); }

private:
  cudaEvent_t handle_ = nullptr;
};

//! Where a pointer's memory lives, asked of the driver (host for ordinary pageable memory).
inline memory_location location_of(const void* pointer) {
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, pointer), "cudaPointerGetAttributes");
  switch (attributes.type) {
  case cudaMemoryTypeDevice:
    return memory_location::device;
  case cudaMemoryTypeManaged:
    return memory_location::managed;
  default:
    return memory_location::host;
  }
}

//! The device a device or managed pointer belongs to (-1 for host memory).
inline int device_of(const void* pointer) {
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, pointer), "cudaPointerGetAttributes");
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged
             ? attributes.device
             : -1;
}

namespace detail {
struct device_memory {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFree(p); }
};
struct pinned_memory {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFreeHost(p); }
};
} // namespace detail

//! A buffer that only grows (`reserve`), so that a step reuses the last step's memory.
template <class Memory>
class growing_buffer {
public:
  growing_buffer() = default;
  growing_buffer(growing_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr))
      , bytes_(std::exchange(other.bytes_, 0)) {}
  growing_buffer& operator=(growing_buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  growing_buffer(const growing_buffer&) = delete;
  growing_buffer& operator=(const growing_buffer&) = delete;
  ~growing_buffer() {
    if (data_ != nullptr) {
      Memory::release(data_);
    }
  }

  //! Makes room for `bytes` (contents are not kept when it grows).
  void* reserve(std::size_t bytes) {
    if (bytes > bytes_) {
      if (data_ != nullptr) {
        Memory::release(std::exchange(data_, nullptr));
        bytes_ = 0;
      }
      data_ = Memory::allocate(bytes);
      bytes_ = bytes;
    }
    return data_;
  }
  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

using device_buffer = growing_buffer<detail::device_memory>;
using pinned_buffer = growing_buffer<detail::pinned_memory>;

} // namespace cuda
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
