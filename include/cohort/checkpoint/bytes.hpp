// SPDX-License-Identifier: Apache-2.0
#pragma once

// The bytes of a checkpoint's state: written in order by `byte_writer`, read back by
// `byte_reader`, which checks every length against what is left before it reads or allocates,
// so that a file that verified but lies (hostile, or from another program) is an error naming
// what was being read, never a crash or a huge allocation. Numbers are in the machine's byte
// order; the state's header records it, and a checkpoint of the other order is refused.

#include <cohort/checkpoint/files.hpp>
#include <cohort/config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! Bytes in pieces: what a writer holds, what is written to a file, what is checksummed.
using byte_pieces = std::vector<std::span<const std::byte>>;

//! The bytes [begin, end) of `pieces`, as pieces (no copy).
inline byte_pieces slice(const byte_pieces& pieces, std::size_t begin, std::size_t end) {
  byte_pieces out;
  std::size_t at = 0;
  for (const std::span<const std::byte> piece : pieces) {
    const std::size_t from = std::max(begin, at);
    const std::size_t to = std::min(end, at + piece.size());
    if (from < to) {
      out.push_back(piece.subspan(from - at, to - from));
    }
    at += piece.size();
  }
  return out;
}

//! The longest string (a name, a kind) a checkpoint holds unless told otherwise.
inline constexpr std::uint64_t max_string_bytes = 4096;

//! Appends numbers, strings and blocks. Small things are copied into the writer; a large block
//! put with `put_block_borrowed` stays where it is (a parameter's values: a save writes them to
//! the file from the parameter's own memory), so that a save costs no copy of the state.
class byte_writer {
public:
  //! Blocks at least this large are borrowed by put_block_borrowed; smaller ones are copied.
  static constexpr std::size_t borrow_threshold = 64 * 1024;

  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) { put_bytes(std::as_bytes(std::span(&value, 1))); }
  void put_bytes(std::span<const std::byte> bytes) {
    if (segments_.empty() || segments_.back().borrowed != nullptr) {
      segments_.push_back({nullptr, own_.size(), 0});
    }
    own_.insert(own_.end(), bytes.begin(), bytes.end());
    segments_.back().size += bytes.size();
    size_ += bytes.size();
  }
  //! A length, then the characters; refused past `limit`, which reading applies too (a save
  //! must not write what no resume can read back).
  void put_string(std::string_view text, std::string_view what = "a name",
                  std::uint64_t limit = max_string_bytes) {
    if (text.size() > limit) {
      throw checkpoint_error("cohort checkpoint: " + std::string(what) + " is " +
                             std::to_string(text.size()) + " characters long, more than the " +
                             std::to_string(limit) + " a checkpoint holds");
    }
    put<std::uint64_t>(text.size());
    put_bytes(std::as_bytes(std::span(text.data(), text.size())));
  }
  //! A length, then the bytes (copied).
  void put_block(std::span<const std::byte> bytes) {
    put<std::uint64_t>(bytes.size());
    put_bytes(bytes);
  }
  //! A length, then the bytes, not copied if large: they must stay as they are until the
  //! writer's pieces have been written (a checkpoint's save copies them first when asynchronous).
  void put_block_borrowed(std::span<const std::byte> bytes) {
    put<std::uint64_t>(bytes.size());
    if (bytes.size() < borrow_threshold) {
      put_bytes(bytes);
      return;
    }
    segments_.push_back({bytes.data(), 0, bytes.size()});
    size_ += bytes.size();
  }
  //! Starts a block whose length is known only at its end.
  struct block_start {
    std::size_t patch;    // where the length is, in the writer's own bytes
    std::size_t position; // where the block begins, among all bytes
  };
  block_start begin_block() {
    put<std::uint64_t>(0);
    return {own_.size() - sizeof(std::uint64_t), size_};
  }
  //! Ends the block `begin_block` started.
  void end_block(block_start start) {
    const std::uint64_t length = size_ - start.position;
    std::memcpy(own_.data() + start.patch, &length, sizeof length);
  }

  //! Names the bytes from here on (until the next mark): when the ranks' replicated states differ,
  //! the first mark whose bytes differ says what ("tensor 'bn.num_batches_tracked'").
  void mark(std::string label) { marks_.push_back({size_, std::move(label)}); }
  struct marked_at {
    std::size_t position;
    std::string label;
  };
  const std::vector<marked_at>& marks() const noexcept { return marks_; }

  //! Every byte, in order, as pieces (valid until the writer changes).
  byte_pieces pieces() const {
    byte_pieces out;
    out.reserve(segments_.size());
    for (const segment& s : segments_) {
      out.push_back(s.borrowed != nullptr ? std::span(s.borrowed, s.size)
                                          : std::span(own_.data() + s.offset, s.size));
    }
    return out;
  }
  //! Every byte, copied into one buffer.
  std::vector<std::byte> contiguous() const {
    std::vector<std::byte> out;
    out.reserve(size_);
    for (const std::span<const std::byte> piece : pieces()) {
      out.insert(out.end(), piece.begin(), piece.end());
    }
    return out;
  }
  std::size_t size() const noexcept { return size_; }

private:
  struct segment {
    const std::byte* borrowed; // null: the writer's own bytes, from `offset`
    std::size_t offset;
    std::size_t size;
  };
  std::vector<std::byte> own_;
  std::vector<segment> segments_;
  std::vector<marked_at> marks_;
  std::size_t size_ = 0;
};

//! Memory kept from one use to the next (a checkpointer's async copies, its resume's read):
//! allocated, without zeroing, only when a use needs more than it has.
class kept_buffer {
public:
  kept_buffer() = default;
  kept_buffer(kept_buffer&& other) noexcept
      : data_(std::move(other.data_))
      , capacity_(std::exchange(other.capacity_, 0)) {}
  kept_buffer& operator=(kept_buffer&& other) noexcept {
    data_ = std::move(other.data_);
    capacity_ = std::exchange(other.capacity_, 0);
    return *this;
  }

  //! `size` bytes of it (their values are whatever was there).
  std::span<std::byte> take(std::size_t size) {
    if (size > capacity_) {
      data_ = std::make_unique_for_overwrite<std::byte[]>(size);
      capacity_ = size;
    }
    return {data_.get(), size};
  }
  //! `from` copied into it, as one piece.
  byte_pieces copy(const byte_pieces& from) {
    std::size_t size = 0;
    for (const std::span<const std::byte> piece : from) {
      size += piece.size();
    }
    const std::span<std::byte> into = take(size);
    std::size_t at = 0;
    for (const std::span<const std::byte> piece : from) {
      if (!piece.empty()) {
        std::memcpy(into.data() + at, piece.data(), piece.size());
      }
      at += piece.size();
    }
    return {std::span<const std::byte>(into)};
  }

private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t capacity_ = 0;
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
  std::string get_string(std::string_view what, std::uint64_t limit = max_string_bytes) {
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
