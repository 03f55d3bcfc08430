// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checksum of a checkpoint's files: XXH3-64 from the xxHash library (Debian's libxxhash-dev,
// Conan's and vcpkg's xxhash), inlined into this translation unit (XXH_INLINE_ALL), so that
// there is no library to link and its names cannot collide with another copy's. XXH3 runs at
// memory speed: checking a file costs little more than reading it.

#include <cohort/config.hpp>

#define XXH_INLINE_ALL
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>
#include <xxhash.h>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! XXH3-64 over bytes given in pieces.
class checksum {
public:
  checksum() { XXH3_64bits_reset(&state_); }
  void update(std::span<const std::byte> bytes) {
    XXH3_64bits_update(&state_, bytes.data(), bytes.size());
  }
  std::uint64_t value() const { return XXH3_64bits_digest(&state_); }

  //! The checksum of `bytes` in one piece.
  static std::uint64_t of(std::span<const std::byte> bytes) {
    return XXH3_64bits(bytes.data(), bytes.size());
  }
  //! The checksum of bytes in pieces, as if they were one.
  static std::uint64_t of(const std::vector<std::span<const std::byte>>& pieces) {
    checksum sum;
    for (const std::span<const std::byte> piece : pieces) {
      sum.update(piece);
    }
    return sum.value();
  }

private:
  XXH3_state_t state_;
};

//! 16 hexadecimal digits, as the manifest writes a checksum.
inline std::string to_hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
