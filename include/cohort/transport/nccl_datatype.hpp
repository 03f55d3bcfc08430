// SPDX-License-Identifier: Apache-2.0
#pragma once

// cohort's dtypes and reductions as NCCL's.

#include <cohort/config.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/dtype.hpp>

#include <nccl.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace nccl {

//! The NCCL datatype of a dtype: every dtype has one.
constexpr ncclDataType_t datatype(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
    return ncclFloat32;
  case dtype::float64:
    return ncclFloat64;
  case dtype::float16:
    return ncclFloat16;
  case dtype::bfloat16:
    return ncclBfloat16;
  case dtype::int32:
    return ncclInt32;
  case dtype::int64:
    return ncclInt64;
  case dtype::uint8:
    break;
  }
  return ncclUint8;
}

//! The NCCL reduction of a reduce_op.
constexpr ncclRedOp_t op(reduce_op operation) noexcept {
  switch (operation) {
  case reduce_op::prod:
    return ncclProd;
  case reduce_op::min:
    return ncclMin;
  case reduce_op::max:
    return ncclMax;
  case reduce_op::sum:
    break;
  }
  return ncclSum;
}

} // namespace nccl
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
