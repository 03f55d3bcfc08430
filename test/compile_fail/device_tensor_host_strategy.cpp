// SPDX-License-Identifier: Apache-2.0
// A tensor whose type says it lives in GPU memory cannot be handed to a host-only strategy.
#include <cohort/communicator/flat.hpp>

#include <cstddef>

struct gpu_buffer {
  float* device_pointer = nullptr;
  std::size_t count = 0;
};

template <>
struct cohort::tensor_traits<gpu_buffer> {
#ifdef COHORT_COMPILE_FAIL
  static constexpr memory_location location = memory_location::device;
#else
  static constexpr memory_location location = memory_location::host;
#endif
  static float* data(const gpu_buffer& b) {
    return b.device_pointer;
  }
  static std::size_t size(const gpu_buffer& b) {
    return b.count;
  }
};

void reduce(cohort::flat& comm, gpu_buffer& buffer) {
  comm.allreduce(buffer);
}

int main() {}
