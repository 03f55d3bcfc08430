// SPDX-License-Identifier: Apache-2.0
#pragma once

// Host kernels of low-rank gradient compression (powersgd): a matrix M (n x m, row after row)
// times a thin factor, its transpose times another, their outer product, and the
// orthogonalization of a factor's columns. Each factor is kept transposed (r rows of length n or
// m), so that every loop runs along contiguous memory. The order of every sum is fixed (no
// threaded BLAS, no run-time ISA dispatch): the same inputs give the same bits on every rank,
// which is what keeps replicas identical when each rank computes from the same reduced factor.

#include <cohort/config.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels::lowrank {

//! Σ a[i] b[i] in a fixed order: a few independent partial sums (which the compiler turns into
//! one vector register) added pairwise at the end.
template <class T>
T dot(const T* a, const T* b, std::size_t n) noexcept {
  constexpr std::size_t lanes = 32 / sizeof(T);
  T partial[lanes] = {};
  const std::size_t whole = n - n % lanes;
  for (std::size_t i = 0; i < whole; i += lanes) {
    for (std::size_t l = 0; l < lanes; ++l) {
      partial[l] += a[i + l] * b[i + l];
    }
  }
  for (std::size_t width = lanes / 2; width > 0; width /= 2) {
    for (std::size_t l = 0; l < width; ++l) {
      partial[l] += partial[l + width];
    }
  }
  T sum = partial[0];
  for (std::size_t i = whole; i < n; ++i) {
    sum += a[i] * b[i];
  }
  return sum;
}

//! y[i] += alpha x[i].
template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    y[i] += alpha * x[i];
  }
}

//! P = M Q, with Pᵀ (r x n) and Qᵀ (r x m): Pᵀ[k][i] = M[i,:] · Qᵀ[k,:].
template <class T>
void project(const T* m_rows, std::size_t n, std::size_t m, const T* qt, std::size_t r,
             T* pt) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const T* row = m_rows + i * m;
    for (std::size_t k = 0; k < r; ++k) {
      pt[k * n + i] = dot(row, qt + k * m, m);
    }
  }
}

//! Q = Mᵀ P, with Pᵀ (r x n) and Qᵀ (r x m): Qᵀ[k,:] = Σ_i Pᵀ[k][i] M[i,:], row by row of M.
template <class T>
void back_project(const T* m_rows, std::size_t n, std::size_t m, const T* pt, std::size_t r,
                  T* qt) noexcept {
  std::fill(qt, qt + r * m, T{0});
  for (std::size_t i = 0; i < n; ++i) {
    const T* row = m_rows + i * m;
    for (std::size_t k = 0; k < r; ++k) {
      axpy(pt[k * n + i], row, qt + k * m, m);
    }
  }
}

//! out = base − P Qᵀ (base may be null: out = P Qᵀ); out may be base.
template <class T>
void outer(const T* base, std::size_t n, std::size_t m, const T* pt, const T* qt, std::size_t r,
           T* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    T* row = out + i * m;
    if (base == nullptr) {
      std::fill(row, row + m, T{0});
      for (std::size_t k = 0; k < r; ++k) {
        axpy(pt[k * n + i], qt + k * m, row, m);
      }
    } else {
      if (base != out) {
        std::copy(base + i * m, base + (i + 1) * m, row);
      }
      for (std::size_t k = 0; k < r; ++k) {
        axpy(-pt[k * n + i], qt + k * m, row, m);
      }
    }
  }
}

//! Makes the r rows of `v` (each of length `len`: a factor's columns) orthonormal, by modified
//! Gram-Schmidt, with norms and projections summed in double. A column of norm 0 (+ `epsilon`)
//! becomes zeros, not NaN (PyTorch's hook divides by zero there). `passes` 2 orthogonalizes
//! again, which brings rank > 2 to QR's accuracy.
template <class T>
void orthogonalize(T* v, std::size_t r, std::size_t len, double epsilon, int passes = 1) noexcept {
  const auto dot_wide = [len](const T* a, const T* b) {
    double sum = 0;
    for (std::size_t i = 0; i < len; ++i) {
      sum += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    }
    return sum;
  };
  for (int pass = 0; pass < passes; ++pass) {
    for (std::size_t k = 0; k < r; ++k) {
      T* col = v + k * len;
      const double norm = std::sqrt(dot_wide(col, col)) + epsilon;
      if (norm == 0) { // (a NaN stays one: the gradients that made it should be seen)
        std::fill(col, col + len, T{0});
        continue;
      }
      const double inverse = 1.0 / norm;
      for (std::size_t i = 0; i < len; ++i) {
        col[i] = static_cast<T>(static_cast<double>(col[i]) * inverse);
      }
      for (std::size_t j = k + 1; j < r; ++j) {
        T* rest = v + j * len;
        const double projection = dot_wide(col, rest);
        for (std::size_t i = 0; i < len; ++i) {
          rest[i] = static_cast<T>(static_cast<double>(rest[i]) -
                                   projection * static_cast<double>(col[i]));
        }
      }
    }
  }
}

//! A counter-based generator: the same (seed, stream, index) give the same value on every host,
//! whatever its C library (integer arithmetic only, no libm).
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! out[i] uniform in [-1, 1), from (seed, stream).
template <class T>
void fill_uniform(T* out, std::size_t count, std::uint64_t seed, std::uint64_t stream) noexcept {
  const std::uint64_t base = splitmix64(seed ^ splitmix64(stream));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t bits = splitmix64(base + i) >> 11; // 53 bits
    out[i] = static_cast<T>(static_cast<double>(bits) * 0x1p-52 - 1.0);
  }
}

} // namespace kernels::lowrank
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
