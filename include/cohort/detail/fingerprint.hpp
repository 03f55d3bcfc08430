// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/config.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace detail {

//! A fingerprint that is the same on every rank for the same input, whatever the standard library
//! (std::hash promises that only within one program). A word at a time (FNV-1a's step on words,
//! then a shift that carries the high bits down): each word is one multiply, where FNV-1a's byte
//! at a time took eight in a chain, which cost a small step half a microsecond; and each step is a
//! bijection of the state for a given word and of the word for a given state, so two inputs that
//! differ in one word never collide.
class fingerprint {
public:
  constexpr fingerprint& add(std::uint64_t value) noexcept {
    state_ = (state_ ^ value) * 0x9e3779b97f4a7c15ull; // (odd: a bijection)
    state_ ^= state_ >> 32;
    return *this;
  }
  constexpr fingerprint& add(std::string_view text) noexcept {
    add(text.size());
    for (std::size_t at = 0; at < text.size(); at += 8) {
      std::uint64_t word = 0; // little-endian, whatever the machine's order
      for (std::size_t i = at; i < at + 8 && i < text.size(); ++i) {
        word |= std::uint64_t{static_cast<unsigned char>(text[i])} << (8 * (i - at));
      }
      add(word);
    }
    return *this;
  }
  constexpr std::uint64_t value() const noexcept { return state_; }

private:
  std::uint64_t state_ = 0xcbf29ce484222325ull;
};

} // namespace detail
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
