// SPDX-License-Identifier: Apache-2.0
#pragma once

// The bytes of a checkpoint's state: written in order by `byte_writer`, read back by
// `byte_reader`, which checks every length against what is left before it reads or allocates,
// so that a file that verified but lies (hostile, or from another program) is an error naming
// what was being read, never a crash or a huge allocation. Numbers are in the machine's byte
// order; the state's header records it, and a checkpoint of the other order is refused.

#include <cohort/checkpoint/files.hpp>
#include <cohort/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! Appends numbers, strings and raw bytes to a buffer.
class byte_writer {
public:
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) { put_bytes(std::as_bytes(std::span(&value, 1))); }
  void put_bytes(std::span<const std::byte> bytes) {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
  }
  //! A length, then the characters.
  void put_string(std::string_view text) {
    put<std::uint64_t>(text.size());
    put_bytes(std::as_bytes(std::span(text.data(), text.size())));
  }
  //! A length, then the bytes.
  void put_block(std::span<const std::byte> bytes) {
    put<std::uint64_t>(bytes.size());
    put_bytes(bytes);
  }
  //! Starts a block whose length is known only at its end: returns where to patch it.
  std::size_t begin_block() {
    put<std::uint64_t>(0);
    return bytes_.size();
  }
  //! Ends the block `begin_block` started.
  void end_block(std::size_t start) {
    const std::uint64_t length = bytes_.size() - start;
    std::memcpy(bytes_.data() + start - sizeof length, &length, sizeof length);
  }
  std::vector<std::byte>& bytes() noexcept { return bytes_; }
  std::size_t size() const noexcept { return bytes_.size(); }

private:
  std::vector<std::byte> bytes_;
};

//! Reads what a byte_writer wrote, checking every length against the bytes left. `source` names
//! the bytes in errors (the checkpoint's step and part).
class byte_reader {
public:
  byte_reader(std::span<const std::byte> bytes, std::string source)
      : bytes_(bytes)
      , source_(std::move(source)) {}

  template <class T>
  requires std::is_trivially_copyable_v<T> T get(std::string_view what) {
    T value;
    const std::span<const std::byte> raw = get_bytes(sizeof(T), what);
    std::memcpy(&value, raw.data(), sizeof(T));
    return value;
  }
  //! `count` bytes, without a copy.
  std::span<const std::byte> get_bytes(std::uint64_t count, std::string_view what) {
    if (count > left()) {
      fail(what,
           "needs " + std::to_string(count) + " bytes but " + std::to_string(left()) + " are left");
    }
    const std::span<const std::byte> raw =
        bytes_.subspan(position_, static_cast<std::size_t>(count));
    position_ += static_cast<std::size_t>(count);
    return raw;
  }
  //! A string of at most `limit` characters.
  std::string get_string(std::string_view what, std::uint64_t limit = 4096) {
    const auto length = get<std::uint64_t>(what);
    if (length > limit) {
      fail(what,
           "is " + std::to_string(length) + " characters long, more than " + std::to_string(limit));
    }
    const std::span<const std::byte> raw = get_bytes(length, what);
    return {reinterpret_cast<const char*>(raw.data()), raw.size()};
  }
  //! A block written by put_block.
  std::span<const std::byte> get_block(std::string_view what) {
    return get_bytes(get<std::uint64_t>(what), what);
  }
  std::uint64_t left() const noexcept { return bytes_.size() - position_; }
  const std::string& source() const noexcept { return source_; }

  //! Throws `checkpoint_error`: `what` of this source `why`.
  [[noreturn]] void fail(std::string_view what, const std::string& why) const {
    throw checkpoint_error("cohort checkpoint: " + source_ + ": " + std::string(what) + " " + why +
                           " (at byte " + std::to_string(position_) + " of " +
                           std::to_string(bytes_.size()) + ")");
  }

private:
  std::span<const std::byte> bytes_;
  std::size_t position_ = 0;
  std::string source_;
};

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
