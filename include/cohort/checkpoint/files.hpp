// SPDX-License-Identifier: Apache-2.0
#pragma once

// A checkpoint's files on disk, with POSIX calls because the standard library cannot fsync: a
// file is written under a temporary name, fsynced, renamed over its final name, and its directory
// fsynced, so that after a crash it is either whole or absent. Files are read whole, after their
// size is checked against a limit, so that a hostile or truncated file never makes cohort
// allocate more than the caller allows. Every failure names the file, the call and errno's text.

#include <cohort/checkpoint/checksum.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! A checkpoint that cannot be written or read: the message names the file and what failed.
class checkpoint_error : public error {
public:
  using error::error;
};

//! A call of the system's that failed for a reason other than the file's absence (EIO, EACCES,
//! EMFILE, ENOSPC...): a fault of the machine, not of the checkpoint. `resume` does not skip a
//! checkpoint for it (the next job may read it well): it throws on every rank.
class checkpoint_io_error : public checkpoint_error {
public:
  using checkpoint_error::checkpoint_error;
};

namespace checkpoint {

//! A file of a checkpoint as its manifest lists it.
struct file_record {
  std::string name;
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
  friend bool operator==(const file_record&, const file_record&) = default;
};

//! Where writes go: the default writes with ::write; tests put a failing one in its place (a full
//! file system) to check that a failed save loses nothing.
using write_function = std::function<::ssize_t(int fd, const void* data, std::size_t bytes)>;

namespace detail {

[[noreturn]] inline void fail(std::string_view call, const std::filesystem::path& path, int code) {
  std::string what = "cohort checkpoint: " + std::string(call) + " of " + path.string() +
                     " failed: " + std::strerror(code);
  if (code == ENOENT || code == ENOTDIR) {
    throw checkpoint_error(what); // the file is not there: a checkpoint without it is damaged
  }
  throw checkpoint_io_error(what);
}

// An open file descriptor, closed on every path.
class descriptor {
public:
  descriptor(const std::filesystem::path& path, int flags, ::mode_t mode = 0644)
      : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)) {
    if (fd_ < 0) {
      fail("open", path, errno);
    }
  }
  descriptor(const descriptor&) = delete;
  descriptor& operator=(const descriptor&) = delete;
  ~descriptor() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  int get() const noexcept { return fd_; }
  // Closes now, so that a failure of close (NFS reports late write errors there) is seen.
  void close(const std::filesystem::path& path) {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      fail("close", path, errno);
    }
  }

private:
  int fd_;
};

// Reads exactly `into.size()` bytes of `file` (a megabyte at a time), adding each piece to `sum`
// if given, while it is still in the cache; a file that ends early is named as truncated.
inline void read_exactly(const descriptor& file, const std::filesystem::path& path,
                         std::span<std::byte> into, checksum* sum) {
  constexpr std::size_t chunk = std::size_t{1} << 20;
  std::size_t done = 0;
  while (done < into.size()) {
    const ::ssize_t n = ::read(file.get(), into.data() + done, std::min(chunk, into.size() - done));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      fail("read", path, errno);
    }
    if (n == 0) {
      throw checkpoint_error("cohort checkpoint: " + path.string() + " ended after " +
                             std::to_string(done) + " of its " + std::to_string(into.size()) +
                             " bytes (truncated while read)");
    }
    if (sum != nullptr) {
      sum->update(into.subspan(done, static_cast<std::size_t>(n)));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void fsync_or_fail(int fd, const std::filesystem::path& path) {
  if (::fsync(fd) != 0) {
    fail("fsync", path, errno);
  }
}

} // namespace detail

//! Makes the entries of `directory` (created, renamed or removed files) durable.
inline void sync_directory(const std::filesystem::path& directory) {
  detail::descriptor dir(directory, O_RDONLY | O_DIRECTORY);
  detail::fsync_or_fail(dir.get(), directory);
}

//! Writes `pieces` one after the other into `directory/name` atomically: a temporary file, fsync,
//! rename, fsync of the directory. Returns the file's record (size and checksum of what was
//! written). On failure the temporary file is removed and the final name is untouched.
inline file_record write_atomically(const std::filesystem::path& directory, const std::string& name,
                                    std::span<const std::span<const std::byte>> pieces,
                                    const write_function& write = {}) {
  const std::filesystem::path final_path = directory / name;
  const std::filesystem::path temporary = directory / ("." + name + ".tmp");
  file_record record{name, 0, 0};
  try {
    detail::descriptor file(temporary, O_WRONLY | O_CREAT | O_TRUNC);
    checksum sum;
    // A megabyte at a time: checksummed, then written while it is still in the cache, so that
    // the checksum costs no pass over memory of its own.
    constexpr std::size_t chunk = std::size_t{1} << 20;
    for (const std::span<const std::byte> piece : pieces) {
      for (std::size_t at = 0; at < piece.size(); at += chunk) {
        const std::span<const std::byte> part =
            piece.subspan(at, std::min(chunk, piece.size() - at));
        sum.update(part);
        std::size_t done = 0;
        while (done < part.size()) {
          const ::ssize_t n = write ? write(file.get(), part.data() + done, part.size() - done)
                                    : ::write(file.get(), part.data() + done, part.size() - done);
          if (n < 0 && errno == EINTR) {
            continue;
          }
          if (n <= 0) {
            detail::fail("write", temporary, n < 0 ? errno : ENOSPC);
          }
          done += static_cast<std::size_t>(n);
        }
      }
      record.size += piece.size();
    }
    record.checksum = sum.value();
    detail::fsync_or_fail(file.get(), temporary);
    file.close(temporary);
    if (::rename(temporary.c_str(), final_path.c_str()) != 0) {
      detail::fail("rename", temporary, errno);
    }
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  sync_directory(directory);
  return record;
}

//! The whole of `path`, refused with a `checkpoint_error` naming it if it is larger than
//! `limit` bytes (before anything is allocated for it) or changes size while read.
inline std::vector<std::byte> read_whole(const std::filesystem::path& path, std::uint64_t limit) {
  detail::descriptor file(path, O_RDONLY);
  struct ::stat info {};
  if (::fstat(file.get(), &info) != 0) {
    detail::fail("fstat", path, errno);
  }
  const auto size = static_cast<std::uint64_t>(info.st_size);
  if (!S_ISREG(info.st_mode)) {
    throw checkpoint_io_error("cohort checkpoint: " + path.string() +
                              " is not a regular file (a directory, a device or a pipe)");
  }
  if (size > limit) {
    throw checkpoint_error("cohort checkpoint: " + path.string() + " holds " +
                           std::to_string(size) + " bytes, more than the " + std::to_string(limit) +
                           " a file of this checkpoint may hold");
  }
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  detail::read_exactly(file, path, bytes, nullptr);
  return bytes;
}

//! Reads `path`, which must hold exactly `into.size()` bytes, into `into`, and adds them to
//! `sum` as they come: a megabyte at a time, checksummed while it is still in the cache, so that
//! checking costs no pass over memory of its own.
inline void read_into(const std::filesystem::path& path, std::span<std::byte> into, checksum& sum) {
  detail::descriptor file(path, O_RDONLY);
  // The kernel reads the whole file ahead while each megabyte is copied and checksummed.
  (void)::posix_fadvise(file.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  (void)::posix_fadvise(file.get(), 0, 0, POSIX_FADV_WILLNEED);
  detail::read_exactly(file, path, into, &sum);
}

//! The checksum of `path`, which must hold `size` bytes, read through `window` (a megabyte or so,
//! which stays in cache): what `mapped_files` then maps is in the page cache, checked.
inline std::uint64_t checksum_of_file(const std::filesystem::path& path, std::uint64_t size,
                                      std::span<std::byte> window) {
  detail::descriptor file(path, O_RDONLY);
  (void)::posix_fadvise(file.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  (void)::posix_fadvise(file.get(), 0, 0, POSIX_FADV_WILLNEED);
  checksum sum;
  for (std::uint64_t at = 0; at < size; at += window.size()) {
    detail::read_exactly(
        file, path,
        window.first(static_cast<std::size_t>(std::min<std::uint64_t>(window.size(), size - at))),
        &sum);
  }
  return sum.value();
}

inline std::size_t page_size() noexcept {
  static const auto size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

//! Where part `r` of `n` of `total` bytes begins (`r` = `n`: where the last ends, `total`): at a
//! multiple of `page`, so that the parts map as one span (`mapped_files`); a state smaller than
//! a page a part is all in the first parts.
inline std::size_t part_boundary(std::size_t total, int r, int n, std::size_t page) {
  if (r >= n) {
    return total;
  }
  const std::size_t even = total / static_cast<std::size_t>(n) * static_cast<std::size_t>(r);
  return std::min(total, (even + page - 1) / page * page);
}

//! Files mapped read-only one after the other into one range of memory, so that a state split
//! into parts is read as one span without a copy, from the page cache. Each file but the last
//! must hold a whole number of pages (`fits`). The files must not be truncated while mapped (a
//! checkpoint's files are replaced by rename and removed by unlink, which leave a mapping whole).
class mapped_files {
public:
  //! Whether files of these sizes, in this order, can be mapped as one range.
  static bool fits(std::span<const std::uint64_t> sizes) {
    std::uint64_t at = 0;
    for (const std::uint64_t size : sizes) {
      if (size != 0 && at % page_size() != 0) {
        return false;
      }
      at += size;
    }
    return true;
  }

  mapped_files(std::span<const std::filesystem::path> paths, std::span<const std::uint64_t> sizes) {
    for (const std::uint64_t size : sizes) {
      size_ += static_cast<std::size_t>(size);
    }
    if (size_ == 0) {
      return;
    }
    reserved_ = (size_ + page_size() - 1) / page_size() * page_size();
    void* base = ::mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      detail::fail("mmap (reserving the range) for", paths.front(), errno);
    }
    base_ = static_cast<std::byte*>(base);
    try {
      std::size_t at = 0;
      for (std::size_t i = 0; i < paths.size(); ++i) {
        const auto size = static_cast<std::size_t>(sizes[i]);
        if (size == 0) {
          continue;
        }
        detail::descriptor file(paths[i], O_RDONLY);
        if (::mmap(base_ + at, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, file.get(), 0) ==
            MAP_FAILED) {
          detail::fail("mmap", paths[i], errno);
        }
        at += size;
      }
    } catch (...) {
      ::munmap(base_, reserved_);
      throw;
    }
  }
  mapped_files(mapped_files&& other) noexcept
      : base_(std::exchange(other.base_, nullptr))
      , size_(std::exchange(other.size_, 0))
      , reserved_(std::exchange(other.reserved_, 0)) {}
  mapped_files& operator=(mapped_files&& other) noexcept {
    std::swap(base_, other.base_);
    std::swap(size_, other.size_);
    std::swap(reserved_, other.reserved_);
    return *this;
  }
  ~mapped_files() {
    if (base_ != nullptr) {
      ::munmap(base_, reserved_);
    }
  }

  std::span<const std::byte> bytes() const noexcept { return {base_, size_}; }

private:
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t reserved_ = 0;
};

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
