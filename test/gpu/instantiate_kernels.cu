// SPDX-License-Identifier: Apache-2.0
// Instantiates every kernel launcher of cohort/kernels for every dtype (and every pair of dtypes
// for cast), so that the build compiles each kernel for every architecture and links it: the
// calls below are compiled whether or not they run. Where a device is visible they run once on a
// few elements; elsewhere the program exits 77 (skipped).
#include <cohort/cuda.hpp>

#include <cstdio>
#include <vector>

int main() {
  using namespace cohort;
  if (cuda::device_count() == 0) {
    std::printf("every kernel compiled and linked; no CUDA device visible: not run (skipped)\n");
    return 77;
  }
  std::vector<void*> allocations;
  const auto device_view = [&](dtype type, std::size_t count) {
    void* p = nullptr;
    cuda::check(cudaMalloc(&p, count * size_of(type)), "cudaMalloc");
    cuda::check(cudaMemset(p, 0, count * size_of(type)), "cudaMemset");
    allocations.push_back(p);
    return tensor_view{p, count, type, memory_location::device};
  };
  cudaStream_t stream = nullptr; // the legacy default stream: nothing to create
  kernels::device::batch_workspace workspace;
  for (const dtype wire : all_dtypes) {
    const tensor_view buffer = device_view(wire, 16);
    std::vector<const_tensor_view> sources;
    std::vector<tensor_view> targets;
    for (const dtype type : all_dtypes) {
      const tensor_view t = device_view(type, 2);
      sources.push_back(t);
      targets.push_back(t);
      kernels::device::cast(t, device_view(wire, 2), stream);
    }
    kernels::device::pack(sources, buffer, 0.5, stream, workspace);
    kernels::device::unpack(buffer, targets, 2.0, stream, workspace);
    kernels::device::scale(buffer, 0.25, stream);
    for (const reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max}) {
      kernels::device::reduce(buffer, buffer, op, stream);
    }
  }
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (void* p : allocations) {
    cuda::check(cudaFree(p), "cudaFree");
  }
  std::printf("every kernel compiled, linked and ran\n");
  return 0;
}
