// SPDX-License-Identifier: Apache-2.0
#pragma once

// The per-element logic of the batched pack and unpack (ChainerMN's batched_copy): many tensors
// of different sizes and dtypes copied into one fusion buffer, and back, by one kernel launch.
// Element i of the buffer belongs to the tensor whose range [begin, begin + count) holds i; a
// binary search over the begins finds it, once per range of elements (a kernel's tile), and each
// tensor's part of the range is copied by a loop of its own dtype. Offsets are 64-bit, so a batch
// may hold more than 2^31 elements (ChainerMN's were int32). Everything here is __host__
// __device__: host tests run the very code the kernels in pack.cuh run.

#include <cohort/config.hpp>
#include <cohort/kernels/functors.hpp>
#include <cohort/tensor/bfloat16.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/float16.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace kernels {

//! One tensor of a batch: its elements, their dtype, and where the first lands in the buffer.
//! The entries of a batch are in buffer order; empty tensors may appear (they share a begin with
//! the next entry).
struct batch_entry {
  void* data = nullptr;
  std::uint64_t begin = 0;
  dtype type = dtype::float32;
};

//! The scaling factor of a batch, in both compute precisions, so that device code converts it
//! once per launch rather than once per element.
struct batch_factor {
  float single = 1.0f;
  double dual = 1.0;

  template <class Compute>
  COHORT_HOST_DEVICE constexpr Compute get() const noexcept {
    if constexpr (std::is_same_v<Compute, float>) {
      return single;
    } else {
      return dual;
    }
  }
};

//! The entry holding buffer element `index`: the last entry whose begin is at most `index`
//! (`index` must be below the batch's total). O(log entries), no allocation.
COHORT_HOST_DEVICE constexpr std::size_t locate(const batch_entry* entries, std::size_t count,
                                                std::uint64_t index) noexcept {
  std::size_t low = 0;
  std::size_t high = count; // the answer is in [low, high)
  while (high - low > 1) {
    const std::size_t middle = low + (high - low) / 2;
    if (entries[middle].begin <= index) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

//! Calls `f(T{})` with a value-initialised element of the run-time dtype: a switch that device
//! code can run (std::type_identity-based visit in tensor/dtype.hpp is host-only).
template <class F>
COHORT_HOST_DEVICE constexpr decltype(auto) dispatch(dtype type, F&& f) {
  switch (type) {
  case dtype::float64:
    return f(double{});
  case dtype::float16:
    return f(float16{});
  case dtype::bfloat16:
    return f(bfloat16{});
  case dtype::int32:
    return f(std::int32_t{});
  case dtype::int64:
    return f(std::int64_t{});
  case dtype::uint8:
    return f(std::uint8_t{});
  case dtype::float32:
    break;
  }
  return f(float{});
}

//! The value that buffer element `index` receives from its tensor: element `index - begin` of
//! `entry`, cast to `Wire` and multiplied by the factor.
template <class Wire>
COHORT_HOST_DEVICE Wire packed_value(const batch_entry& entry, std::uint64_t index,
                                     batch_factor factor) {
  return dispatch(entry.type, [&](auto tag) {
    using T = decltype(tag);
    using op = scale_cast<T, Wire>;
    const op f{factor.get<typename op::compute>()};
    return f(static_cast<const T*>(entry.data)[index - entry.begin]);
  });
}

//! Writes buffer element `index`, of value `value`, back into its tensor: cast to the tensor's
//! dtype and multiplied by the factor.
template <class Wire>
COHORT_HOST_DEVICE void unpack_value(const batch_entry& entry, std::uint64_t index, Wire value,
                                     batch_factor factor) {
  dispatch(entry.type, [&](auto tag) {
    using T = decltype(tag);
    using op = scale_cast<Wire, T>;
    const op f{factor.get<typename op::compute>()};
    static_cast<T*>(entry.data)[index - entry.begin] = f(value);
  });
}

//! Calls `part(entry, from, end)` for each tensor's share [from, end) of buffer elements
//! [first, last), in order: the tensor holding `first` found once, the next ones by walking on.
template <class Part>
COHORT_HOST_DEVICE void for_each_part(const batch_entry* entries, std::size_t count,
                                      std::uint64_t first, std::uint64_t last, Part&& part) {
  for (std::size_t e = locate(entries, count, first); first < last; ++e) {
    const std::uint64_t end =
        e + 1 < count && entries[e + 1].begin < last ? entries[e + 1].begin : last;
    // (A copy: through a pointer into the table, every store of the copy loop could alias it, and
    // the compiler would read the entry again after each.)
    const batch_entry entry = entries[e];
    part(entry, first, end);
    first = end;
  }
}

//! Buffer elements [first, last) of a batched pack, by one of `lanes` workers (lane `lane` takes
//! elements first + lane, first + lane + lanes, ...): a device block copies a tile so, a thread a
//! lane. The tensor holding `first` is found once, and each tensor's part of the range is copied
//! by a loop of its own dtype: consecutive lanes touch consecutive elements (coalesced), four
//! loads in flight per lane before their stores. What pack.cuh's kernel runs, and host tests too.
template <class Wire>
COHORT_HOST_DEVICE void pack_range(const batch_entry* entries, std::size_t count,
                                   std::uint64_t first, std::uint64_t last, Wire* buffer,
                                   batch_factor factor, std::uint64_t lane, std::uint64_t lanes) {
  for_each_part(entries, count, first, last,
                [&](const batch_entry& entry, std::uint64_t from, std::uint64_t end) {
                  dispatch(entry.type, [&](auto tag) {
                    using T = decltype(tag);
                    using op = scale_cast<T, Wire>;
                    const op f{factor.get<typename op::compute>()};
                    const T* source = static_cast<const T*>(entry.data);
                    std::uint64_t i = from + lane;
                    for (; i + 3 * lanes < end; i += 4 * lanes) {
                      const T a = source[i - entry.begin];
                      const T b = source[i + lanes - entry.begin];
                      const T c = source[i + 2 * lanes - entry.begin];
                      const T d = source[i + 3 * lanes - entry.begin];
                      buffer[i] = f(a);
                      buffer[i + lanes] = f(b);
                      buffer[i + 2 * lanes] = f(c);
                      buffer[i + 3 * lanes] = f(d);
                    }
                    for (; i < end; i += lanes) {
                      buffer[i] = f(source[i - entry.begin]);
                    }
                  });
                });
}

//! Buffer elements [first, last) of a batched unpack, by lane `lane` of `lanes`: the inverse of
//! `pack_range`, cast to each tensor's dtype and multiplied by the factor.
template <class Wire>
COHORT_HOST_DEVICE void unpack_range(const batch_entry* entries, std::size_t count,
                                     std::uint64_t first, std::uint64_t last, const Wire* buffer,
                                     batch_factor factor, std::uint64_t lane, std::uint64_t lanes) {
  for_each_part(entries, count, first, last,
                [&](const batch_entry& entry, std::uint64_t from, std::uint64_t end) {
                  dispatch(entry.type, [&](auto tag) {
                    using T = decltype(tag);
                    using op = scale_cast<Wire, T>;
                    const op f{factor.get<typename op::compute>()};
                    T* target = static_cast<T*>(entry.data);
                    std::uint64_t i = from + lane;
                    for (; i + 3 * lanes < end; i += 4 * lanes) {
                      const Wire a = buffer[i];
                      const Wire b = buffer[i + lanes];
                      const Wire c = buffer[i + 2 * lanes];
                      const Wire d = buffer[i + 3 * lanes];
                      target[i - entry.begin] = f(a);
                      target[i + lanes - entry.begin] = f(b);
                      target[i + 2 * lanes - entry.begin] = f(c);
                      target[i + 3 * lanes - entry.begin] = f(d);
                    }
                    for (; i < end; i += lanes) {
                      target[i - entry.begin] = f(buffer[i]);
                    }
                  });
                });
}

} // namespace kernels
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
