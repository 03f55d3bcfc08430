// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reading a checkpoint's files back, trusting nothing: the manifest is parsed within its bound,
// every size it gives is checked against its bound and against the file before anything is
// allocated, and every file against its checksum before any of its bytes is used. Damage (the
// checkpoint's fault) is a `checkpoint_error` naming the file and both sides; a file the system
// cannot read (the machine's fault) is a `checkpoint_io_error` (files.hpp).

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/checksum.hpp>
#include <cohort/checkpoint/files.hpp>
#include <cohort/checkpoint/layout.hpp>
#include <cohort/checkpoint/manifest.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! Throws unless the file `record` names under `where` has the size the manifest gives it, and
//! that size is at most `max_bytes`.
inline void require_size(const std::filesystem::path& where, const file_record& record,
                         std::uint64_t max_bytes) {
  const std::filesystem::path path = where / record.name;
  if (record.size > max_bytes) {
    throw checkpoint_error("cohort checkpoint: the manifest gives " + path.string() + " " +
                           std::to_string(record.size) + " bytes, more than max_file_bytes (" +
                           std::to_string(max_bytes) + ")");
  }
  std::error_code code;
  const std::uintmax_t size = std::filesystem::file_size(path, code);
  if (code == std::errc::no_such_file_or_directory) {
    throw checkpoint_error("cohort checkpoint: " + path.string() + " is missing (" +
                           code.message() + ")");
  }
  if (code) {
    throw checkpoint_io_error("cohort checkpoint: the size of " + path.string() +
                              " cannot be read (" + code.message() + ")");
  }
  if (size != record.size) {
    throw checkpoint_error("cohort checkpoint: " + path.string() + " holds " +
                           std::to_string(size) + " bytes, the manifest says " +
                           std::to_string(record.size) + " (truncated or replaced)");
  }
}

//! Throws unless `sum`, the checksum of `path` as read, is the `expected` one of the manifest.
inline void require_sum(const std::filesystem::path& path, std::uint64_t sum,
                        std::uint64_t expected) {
  if (sum != expected) {
    throw checkpoint_error("cohort checkpoint: " + path.string() + " has checksum " + to_hex(sum) +
                           ", the manifest says " + to_hex(expected) + " (damaged or replaced)");
  }
}

//! The file `record` names under `where`, if its size and checksum are the manifest's.
inline std::vector<std::byte> read_checked(const std::filesystem::path& where,
                                           const file_record& record, std::uint64_t max_bytes) {
  require_size(where, record, max_bytes);
  std::vector<std::byte> bytes = read_whole(where / record.name, record.size);
  require_sum(where / record.name, checksum::of(bytes), record.checksum);
  return bytes;
}

//! The bytes of a verified checkpoint that one rank reads.
struct verified_step {
  int saved_ranks = 0;                   //!< how many ranks saved it
  std::optional<mapped_files> mapping;   //!< the replicated parts, when they map as one span
  std::span<const std::byte> replicated; //!< in `mapping`, or else in the caller's buffer
  std::vector<std::byte> root;
  //! The per-rank files read, mapped from the page cache (so that a rank resuming a sharded
  //! state does not hold every rank's in its own memory): every saved rank's (`first_rank` 0)
  //! when asked for; else this rank's alone when it was saved by as many ranks as now; else
  //! one saved rank's, `rank % saved ranks` (`first_rank`), whose things are checked against the
  //! state given though none of them is loaded (a sharded thing left out is an error).
  std::vector<mapped_files> rank_files;
  int first_rank = 0;
};

//! Reads and checks the files of the checkpoint of `step` under `directory` that rank `rank` of
//! `ranks` needs: with `every_rank_file` (a state that holds sharded things), every saved
//! rank's per-rank file. `buffer` holds what is read through (given by the caller, to keep or
//! free).
inline verified_step verify_step(const std::filesystem::path& directory, std::uint64_t step,
                                 int rank, int ranks, std::uint64_t max_bytes, kept_buffer& buffer,
                                 bool every_rank_file = false) {
  const std::filesystem::path where = directory / step_name(step);
  const std::filesystem::path manifest_path = where / manifest_name;
  const std::vector<std::byte> text = read_whole(manifest_path, manifest::max_bytes);
  const manifest m = manifest::parse({reinterpret_cast<const char*>(text.data()), text.size()},
                                     manifest_path.string());
  if (m.step != step) {
    throw checkpoint_error("cohort checkpoint: " + manifest_path.string() + " is of step " +
                           std::to_string(m.step) + " (moved from another checkpoint?)");
  }
  // The files are the ones cohort names for that many ranks, each once: a manifest that lists
  // one part many times over (a state it does not hold, read again and again) is damage.
  const auto require_name = [&](const file_record& record, const std::string& name) {
    if (record.name != name) {
      throw checkpoint_error("cohort checkpoint: " + manifest_path.string() + " lists '" +
                             record.name + "' where a checkpoint of " + std::to_string(m.ranks) +
                             " ranks has '" + name + "' (damaged or edited)");
    }
  };
  for (int i = 0; i < m.ranks; ++i) {
    require_name(m.replicated[static_cast<std::size_t>(i)], part_name("replicated", i, m.ranks));
    require_name(m.per_rank[static_cast<std::size_t>(i)], part_name("rank", i, m.ranks));
  }
  require_name(m.root.front(), root_name(m.ranks));
  verified_step v;
  v.saved_ranks = m.ranks;
  // Each part is checked against its own checksum as it is read, each rank starting with a
  // different part, so that the ranks of a node start the disk on different files at once and
  // then find the others' in the page cache. Parts that begin at pages (as cohort writes them)
  // are then mapped from the page cache as one span: no buffer, no copy; others are read into
  // a buffer.
  std::uint64_t total = 0;
  std::vector<std::uint64_t> sizes;
  std::vector<std::filesystem::path> paths;
  for (const file_record& part : m.replicated) {
    require_size(where, part, max_bytes);
    sizes.push_back(part.size);
    paths.push_back(where / part.name);
    total += part.size;
  }
  if (total != m.replicated_size || total > max_bytes) {
    throw checkpoint_error("cohort checkpoint: the replicated parts of " + where.string() +
                           " hold " + std::to_string(total) + " bytes, the manifest says " +
                           std::to_string(m.replicated_size) + " (at most max_file_bytes, " +
                           std::to_string(max_bytes) + ")");
  }
  const bool mapped = mapped_files::fits(sizes);
  const std::span<std::byte> joined =
      mapped ? std::span<std::byte>{} : buffer.take(static_cast<std::size_t>(total));
  const std::span<std::byte> window =
      mapped ? buffer.take(std::size_t{1} << 20) : std::span<std::byte>{};
  const std::size_t parts = m.replicated.size();
  std::vector<std::size_t> offsets(parts, 0);
  for (std::size_t k = 1; k < parts; ++k) {
    offsets[k] = offsets[k - 1] + static_cast<std::size_t>(sizes[k - 1]);
  }
  for (std::size_t i = 0; i < parts; ++i) {
    const std::size_t k = (i + static_cast<std::size_t>(rank)) % parts;
    std::uint64_t sum = 0;
    if (mapped) {
      sum = checksum_of_file(paths[k], sizes[k], window);
    } else {
      checksum s;
      read_into(paths[k], joined.subspan(offsets[k], static_cast<std::size_t>(sizes[k])), s);
      sum = s.value();
    }
    require_sum(paths[k], sum, m.replicated[k].checksum);
  }
  if (mapped) {
    v.mapping.emplace(paths, sizes);
    v.replicated = v.mapping->bytes();
  } else {
    v.replicated = joined;
  }
  v.root = read_checked(where, m.root.front(), max_bytes);
  std::size_t first = 0;
  std::size_t count = m.per_rank.size();
  if (!every_rank_file) {
    first = static_cast<std::size_t>(m.ranks == ranks ? rank : rank % m.ranks);
    count = 1;
  }
  const auto path_of = [&](std::size_t k) { return where / m.per_rank[first + k].name; };
  for (std::size_t k = 0; k < count; ++k) {
    const file_record& record = m.per_rank[first + k];
    require_size(where, record, max_bytes);
    const std::filesystem::path path = path_of(k);
    v.rank_files.emplace_back(std::span(&path, 1), std::span(&record.size, 1));
  }
  // Checked as they are read, each rank starting with a different file, as the replicated parts.
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t k = (i + static_cast<std::size_t>(rank)) % count;
    require_sum(path_of(k), checksum::of(v.rank_files[k].bytes()), m.per_rank[first + k].checksum);
  }
  v.first_rank = static_cast<int>(first);
  return v;
}

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
