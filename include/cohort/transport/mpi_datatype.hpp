// SPDX-License-Identifier: Apache-2.0
#pragma once

// cohort's dtypes and reductions as MPI datatypes and ops. MPI has none for 16-bit floats: they
// travel as committed 2-byte types, reduced by user ops of cohort's.

#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/reduce_op.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>
#include <cohort/transport/mpi_error.hpp>

#include <mpi.h>

#include <algorithm>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace mpi {

namespace detail {
// MPI has no 16-bit float types or ops: fp16 and bf16 travel as committed 2-byte types and are
// reduced by user ops that compute in float, one rounding per pairwise step as MPI's own do.
template <class Half, class Combine>
void half_op(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = Half(Combine{}(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}
struct plus {
  float operator()(float a, float b) const noexcept { return a + b; }
};
struct times {
  float operator()(float a, float b) const noexcept { return a * b; }
};
struct minimum {
  float operator()(float a, float b) const noexcept { return std::min(a, b); }
};
struct maximum {
  float operator()(float a, float b) const noexcept { return std::max(a, b); }
};

struct half_handles {
  MPI_Datatype float16_type = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16_type = MPI_DATATYPE_NULL;
  MPI_Op float16_ops[4] = {};
  MPI_Op bfloat16_ops[4] = {};

  half_handles() {
    check(MPI_Type_contiguous(2, MPI_BYTE, &float16_type), "MPI_Type_contiguous", MPI_COMM_WORLD);
    check(MPI_Type_commit(&float16_type), "MPI_Type_commit", MPI_COMM_WORLD);
    check(MPI_Type_contiguous(2, MPI_BYTE, &bfloat16_type), "MPI_Type_contiguous", MPI_COMM_WORLD);
    check(MPI_Type_commit(&bfloat16_type), "MPI_Type_commit", MPI_COMM_WORLD);
    create<float16>(float16_ops);
    create<bfloat16>(bfloat16_ops);
  }

  template <class Half>
  static void create(MPI_Op (&ops)[4]) {
    check(MPI_Op_create(&half_op<Half, plus>, 1, &ops[0]), "MPI_Op_create", MPI_COMM_WORLD);
    check(MPI_Op_create(&half_op<Half, times>, 1, &ops[1]), "MPI_Op_create", MPI_COMM_WORLD);
    check(MPI_Op_create(&half_op<Half, minimum>, 1, &ops[2]), "MPI_Op_create", MPI_COMM_WORLD);
    check(MPI_Op_create(&half_op<Half, maximum>, 1, &ops[3]), "MPI_Op_create", MPI_COMM_WORLD);
  }
};

// Created on first use, after MPI_Init; MPI releases them at MPI_Finalize.
COHORT_DECL const half_handles& halves();

constexpr int op_index(reduce_op op) noexcept {
  return static_cast<int>(op);
}
} // namespace detail

//! The MPI datatype of a dtype.
inline MPI_Datatype datatype(dtype type) {
  switch (type) {
  case dtype::float32:
    return MPI_FLOAT;
  case dtype::float64:
    return MPI_DOUBLE;
  case dtype::int32:
    return MPI_INT32_T;
  case dtype::int64:
    return MPI_INT64_T;
  case dtype::uint8:
    return MPI_UINT8_T;
  case dtype::float16:
    return detail::halves().float16_type;
  case dtype::bfloat16:
    return detail::halves().bfloat16_type;
  }
  throw invalid_argument("cohort: no MPI datatype for this dtype");
}

//! The MPI op of a reduction on a dtype (fp16 and bf16 have ops of their own).
inline MPI_Op op(reduce_op operation, dtype type) {
  if (type == dtype::float16) {
    return detail::halves().float16_ops[detail::op_index(operation)];
  }
  if (type == dtype::bfloat16) {
    return detail::halves().bfloat16_ops[detail::op_index(operation)];
  }
  switch (operation) {
  case reduce_op::sum:
    return MPI_SUM;
  case reduce_op::prod:
    return MPI_PROD;
  case reduce_op::min:
    return MPI_MIN;
  case reduce_op::max:
    return MPI_MAX;
  }
  throw invalid_argument("cohort: no MPI op for this reduction");
}

} // namespace mpi
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/transport/impl/mpi_datatype.ipp>
#endif
