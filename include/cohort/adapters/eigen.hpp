// SPDX-License-Identifier: Apache-2.0
#pragma once

// tensor_traits for Eigen: `Eigen::Matrix` and `Eigen::Array` (always contiguous), `Eigen::Map`
// and `Eigen::Ref` (contiguous when their strides say so: no check where the stride type fixes
// them packed, Eigen's default; otherwise checked on every use, and a view with gaps refused
// with `invalid_argument` naming it), `Eigen::Tensor` and `Eigen::TensorMap` (always
// contiguous). All live in host memory. The dtype follows from the scalar type: cohort's elements
// (float, double, int32_t, int64_t, uint8_t, cohort::float16, cohort::bfloat16) and Eigen's own
// `Eigen::half` and `Eigen::bfloat16`, which have the same bits as cohort's 16-bit types. Any
// other scalar (complex numbers, int16_t...) is refused at compile time. Opt-in: not included by
// <cohort/cohort.hpp>; link the `cohort::eigen` CMake target.

#include <cohort/config.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/location.hpp>
#include <cohort/tensor/traits.hpp>

#include <Eigen/Core>
#include <cstddef>
#include <type_traits>
#include <unsupported/Eigen/CXX11/Tensor>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

// Eigen's 16-bit floats are cohort's float16 and bfloat16 bit for bit, but other types: they are
// passed as untyped memory with their dtype, never reinterpreted as cohort's types.
template <class Scalar>
struct eigen_scalar {
  static constexpr bool supported = element<Scalar>;
};
template <>
struct eigen_scalar<Eigen::half> {
  static constexpr bool supported = true;
  static constexpr dtype type = dtype::float16;
};
template <>
struct eigen_scalar<Eigen::bfloat16> {
  static constexpr bool supported = true;
  static constexpr dtype type = dtype::bfloat16;
};

template <class Scalar>
concept eigen_typed_scalar = element<std::remove_const_t<Scalar>>;
template <class Scalar>
concept eigen_untyped_scalar =
    !element<std::remove_const_t<Scalar>> && eigen_scalar<std::remove_const_t<Scalar>>::supported;

// What every Eigen tensor shares: host memory, `data()` and `size()`. `Scalar` carries the
// constness of the storage (a Map of const data is a read-only tensor).
template <class T, class Scalar>
struct eigen_storage {
  static_assert(eigen_scalar<std::remove_const_t<Scalar>>::supported,
                "cohort: this Eigen scalar type is not a cohort dtype (float, double, int32_t, "
                "int64_t, uint8_t, Eigen::half, Eigen::bfloat16, cohort::float16, "
                "cohort::bfloat16)");
};

template <class T, eigen_typed_scalar Scalar>
struct eigen_storage<T, Scalar> {
  static constexpr memory_location location = memory_location::host;
  static Scalar* data(T& t) noexcept { return t.data(); }
  static const Scalar* data(const T& t) noexcept { return t.data(); }
  static std::size_t size(const T& t) noexcept { return static_cast<std::size_t>(t.size()); }
};

template <class T, eigen_untyped_scalar Scalar>
struct eigen_storage<T, Scalar> {
  static constexpr memory_location location = memory_location::host;
  static std::conditional_t<std::is_const_v<Scalar>, const void*, void*> data(T& t) noexcept {
    return t.data();
  }
  static const void* data(const T& t) noexcept { return t.data(); }
  static dtype dtype_of(const T&) noexcept {
    return eigen_scalar<std::remove_const_t<Scalar>>::type;
  }
  static std::size_t size(const T& t) noexcept { return static_cast<std::size_t>(t.size()); }
};

// A view with strides (Map, Ref) is contiguous when its inner stride is 1 and its columns (or
// rows, row-major) follow each other without a gap.
template <class View>
bool eigen_strides_contiguous(const View& v) noexcept {
  return v.size() == 0 ||
         (v.innerStride() == 1 && (v.outerSize() <= 1 || v.outerStride() == v.innerSize()));
}

// Whether `Stride` fixes both strides to the packed layout at compile time (Eigen's default
// `Stride<0, 0>` means packed; `InnerStride<1>` too for a vector).
template <class Plain, class Stride>
constexpr bool eigen_packed_stride() {
  constexpr bool inner_packed =
      Stride::InnerStrideAtCompileTime == 0 || Stride::InnerStrideAtCompileTime == 1;
  constexpr bool outer_packed =
      Stride::OuterStrideAtCompileTime == 0 || Plain::IsVectorAtCompileTime;
  return inner_packed && outer_packed;
}

// Map and Ref: the storage of `Plain`'s scalar, contiguity from the strides.
template <class T, class Plain, class Stride, class Scalar>
struct eigen_strided : eigen_storage<T, Scalar> {
  static bool is_contiguous(const T& t) noexcept {
    if constexpr (eigen_packed_stride<Plain, Stride>()) {
      return true;
    } else {
      return eigen_strides_contiguous(t);
    }
  }
};

} // namespace detail

template <class S, int Rows, int Cols, int Options, int MaxRows, int MaxCols>
struct tensor_traits<Eigen::Matrix<S, Rows, Cols, Options, MaxRows, MaxCols>>
    : detail::eigen_storage<Eigen::Matrix<S, Rows, Cols, Options, MaxRows, MaxCols>, S> {
  //! Its memory read as a matrix stored row after row: a column-major matrix is its transpose
  //! there (the same rank, which is what a low-rank compression looks at).
  static std::size_t
  rows(const Eigen::Matrix<S, Rows, Cols, Options, MaxRows, MaxCols>& m) noexcept {
    return static_cast<std::size_t>(m.outerSize());
  }
  static void resize(Eigen::Matrix<S, Rows, Cols, Options, MaxRows, MaxCols>& m,
                     std::size_t n) requires(Rows == Eigen::Dynamic || Cols == Eigen::Dynamic) {
    // A missing gradient is given its parameter's element count as one column (or row) of
    // zeros: cohort reads the elements, not the shape.
    const auto count = static_cast<Eigen::Index>(n);
    if constexpr (Cols == Eigen::Dynamic && Rows != Eigen::Dynamic) {
      m.setZero(Rows, count / Rows);
    } else if constexpr (Rows == Eigen::Dynamic && Cols != Eigen::Dynamic) {
      m.setZero(count / Cols, Cols);
    } else {
      m.setZero(count, 1);
    }
  }
};

template <class S, int Rows, int Cols, int Options, int MaxRows, int MaxCols>
struct tensor_traits<Eigen::Array<S, Rows, Cols, Options, MaxRows, MaxCols>>
    : detail::eigen_storage<Eigen::Array<S, Rows, Cols, Options, MaxRows, MaxCols>, S> {};

template <class Plain, int MapOptions, class Stride>
struct tensor_traits<Eigen::Map<Plain, MapOptions, Stride>>
    : detail::eigen_strided<Eigen::Map<Plain, MapOptions, Stride>, std::remove_const_t<Plain>,
                            Stride,
                            std::conditional_t<std::is_const_v<Plain>, const typename Plain::Scalar,
                                               typename Plain::Scalar>> {};

template <class Plain, int Options, class Stride>
struct tensor_traits<Eigen::Ref<Plain, Options, Stride>>
    : detail::eigen_strided<Eigen::Ref<Plain, Options, Stride>, std::remove_const_t<Plain>, Stride,
                            std::conditional_t<std::is_const_v<Plain>, const typename Plain::Scalar,
                                               typename Plain::Scalar>> {};

template <class S, int Rank, int Options, class Index>
struct tensor_traits<Eigen::Tensor<S, Rank, Options, Index>>
    : detail::eigen_storage<Eigen::Tensor<S, Rank, Options, Index>, S> {};

template <class Plain, int MapOptions, template <class> class MakePointer>
struct tensor_traits<Eigen::TensorMap<Plain, MapOptions, MakePointer>>
    : detail::eigen_storage<Eigen::TensorMap<Plain, MapOptions, MakePointer>,
                            std::conditional_t<std::is_const_v<Plain>, const typename Plain::Scalar,
                                               typename Plain::Scalar>> {};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
