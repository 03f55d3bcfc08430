// SPDX-License-Identifier: Apache-2.0
#pragma once

// The GPU rows of bench/allreduce (pure_nccl, host_staged and raw ncclAllReduce), compiled by
// nvcc in gpu_rows.cu and linked in where CUDA and NCCL are found.

#include <boost/mpi/communicator.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "method.hpp"

namespace bench {

class gpu_rows {
public:
  //! The GPU rows, or null with the reason in `why_not` (no device, fewer GPUs than ranks).
  static std::unique_ptr<gpu_rows> create(const boost::mpi::communicator& world,
                                          std::string& why_not);
  virtual ~gpu_rows() = default;
  //! Allocates the device buffers of one size and returns its rows (valid until the next call).
  virtual std::vector<method> prepare(std::size_t elements, std::size_t per_tensor) = 0;
};

} // namespace bench
