// SPDX-License-Identifier: Apache-2.0
#pragma once

// A minimal owning device array for GPU tests: filled from and read back into std::vector.

#include <cohort/tensor/device_span.hpp>
#include <cohort/tensor/tensor_view.hpp>
#include <cohort/transport/cuda.hpp>

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

namespace cohort::test {

template <class T>
class device_array {
public:
  explicit device_array(const std::vector<T>& values)
      : count_(values.size()) {
    cuda::check(cudaMalloc(&data_, bytes() == 0 ? 1 : bytes()), "cudaMalloc");
    cuda::check(cudaMemcpy(data_, values.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    // A copy from pageable memory may return before the transfer is done; kernels on other
    // streams must not read the buffer before it is.
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { (void)cudaFree(data_); }

  std::vector<T> read() const {
    std::vector<T> values(count_);
    cuda::check(cudaMemcpy(values.data(), data_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return values;
  }
  device_span<T> span() const { return {data_, count_}; }
  tensor_view view() const {
    auto s = span();
    return make_view(s);
  }

private:
  std::size_t bytes() const { return count_ * sizeof(T); }
  T* data_ = nullptr;
  std::size_t count_;
};

} // namespace cohort::test
