// SPDX-License-Identifier: Apache-2.0
// Replaces the global operator new to count allocations, so that a test can check that the steady
// state of a step allocates nothing. In a translation unit of its own: inlined into the caller,
// GCC would pair the malloc inside with the free of the matching delete and warn.
#include "support/allocation_counter.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<long> count{0};
}

long cohort::test::allocations() noexcept {
  return count.load();
}

void* operator new(std::size_t size) {
  count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) {
    return p;
  }
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
// The nothrow forms too (std::stable_sort's temporary buffer uses them): a nothrow new left to
// the runtime and freed by the delete above is a mismatch AddressSanitizer reports.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  count.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
