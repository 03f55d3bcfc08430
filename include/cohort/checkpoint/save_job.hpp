// SPDX-License-Identifier: Apache-2.0
#pragma once

// One save of a checkpointer, the part of it that is not collective: the state's bytes, this
// rank's files once written (or what failed), the thread that writes them when asynchronous, and
// the outcome each rank reports, which the ranks exchange as text (checkpointer.hpp's complete).

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/checksum.hpp>
#include <cohort/checkpoint/files.hpp>
#include <cohort/checkpoint/layout.hpp>
#include <cohort/checkpoint/manifest.hpp>
#include <cohort/config.hpp>

#include <array>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

inline constexpr std::string_view error_prefix = "cohort checkpoint: ";

//! What went wrong, without the prefix the whole message will carry once.
inline std::string reason(const std::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with(error_prefix)) {
    what.remove_prefix(error_prefix.size());
  }
  return std::string(what);
}

//! What a rank wrote: its part of the replicated state, its own state, rank 0's root state, and
//! the whole replicated state's size and checksum, which the ranks compare.
struct saved_files {
  file_record part;
  file_record own;
  std::uint64_t replicated_size = 0;
  std::uint64_t replicated_checksum = 0;
  file_record root;

  //! The outcome a rank reports when its files are written: "ok" and the numbers.
  std::string outcome() const {
    return "ok " + std::to_string(part.size) + " " + std::to_string(part.checksum) + " " +
           std::to_string(own.size) + " " + std::to_string(own.checksum) + " " +
           std::to_string(replicated_size) + " " + std::to_string(replicated_checksum) + " " +
           std::to_string(root.size) + " " + std::to_string(root.checksum);
  }
};

inline bool succeeded(const std::string& outcome) {
  return outcome.compare(0, 3, "ok ") == 0;
}

//! Reads every rank's outcome. An outcome that does not read, or a replicated state that differs
//! from rank 0's, becomes that rank's failure in `outcomes`: the replicas are not identical.
inline std::vector<saved_files> read_outcomes(std::vector<std::string>& outcomes) {
  std::vector<saved_files> files(outcomes.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    saved_files& f = files[i];
    if (succeeded(outcomes[i]) &&
        std::sscanf(outcomes[i].c_str(),
                    "ok %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                    " %" SCNu64 " %" SCNu64,
                    &f.part.size, &f.part.checksum, &f.own.size, &f.own.checksum,
                    &f.replicated_size, &f.replicated_checksum, &f.root.size,
                    &f.root.checksum) != 8) {
      outcomes[i] = "rank " + std::to_string(i) + ": an outcome that does not read";
    }
  }
  for (std::size_t i = 1; i < outcomes.size(); ++i) {
    const saved_files& f = files[i];
    const saved_files& first = files[0];
    if (succeeded(outcomes[0]) && succeeded(outcomes[i]) &&
        (f.replicated_size != first.replicated_size ||
         f.replicated_checksum != first.replicated_checksum)) {
      outcomes[i] = "rank " + std::to_string(i) + ": its replicated state (" +
                    std::to_string(f.replicated_size) + " bytes, XXH3 " +
                    to_hex(f.replicated_checksum) + ") differs from rank 0's (" +
                    std::to_string(first.replicated_size) + " bytes, XXH3 " +
                    to_hex(first.replicated_checksum) + "): the replicas are not identical";
    }
  }
  return files;
}

//! Whether some rank's replicated state differs from rank 0's (read_outcomes said so): the same
//! answer on every rank, which then compare their parts (`part_checksums`).
inline bool replicas_differ(const std::vector<std::string>& outcomes,
                            const std::vector<saved_files>& files) {
  for (std::size_t i = 1; i < files.size(); ++i) {
    if (succeeded(outcomes[0]) && !succeeded(outcomes[i]) &&
        files[i].replicated_checksum != files[0].replicated_checksum &&
        files[i].replicated_size != 0) {
      return true;
    }
  }
  return false;
}

//! The replicated state's marked parts (see byte_writer::mark), each as its label and checksum.
inline std::vector<std::string> part_checksums(const byte_writer& writer,
                                               const byte_pieces& bytes) {
  std::vector<std::string> parts;
  const auto& marks = writer.marks();
  for (std::size_t i = 0; i < marks.size(); ++i) {
    const std::size_t end = i + 1 < marks.size() ? marks[i + 1].position : writer.size();
    parts.push_back(marks[i].label + " " +
                    to_hex(checksum::of(slice(bytes, marks[i].position, end))));
  }
  return parts;
}

//! Adds to each rank's "differs" outcome the first part whose bytes differ from rank 0's, from
//! every rank's `part_checksums`.
inline void name_differing_parts(const std::vector<std::vector<std::string>>& parts,
                                 std::vector<std::string>& outcomes) {
  for (std::size_t r = 1; r < parts.size() && r < outcomes.size(); ++r) {
    for (std::size_t i = 0; i < parts[r].size() && i < parts[0].size(); ++i) {
      if (parts[r][i] != parts[0][i]) {
        const std::string& part = parts[0][i];
        outcomes[r] += " (the first part that differs: " + part.substr(0, part.rfind(' ')) + ")";
        break;
      }
    }
  }
}

//! The manifest of the checkpoint of `step` whose ranks wrote `files` (rank 0's first).
inline manifest manifest_of(std::uint64_t step, const std::vector<saved_files>& files) {
  const int n = static_cast<int>(files.size());
  manifest m;
  m.step = step;
  m.ranks = n;
  m.replicated_size = files[0].replicated_size;
  m.replicated_checksum = files[0].replicated_checksum;
  for (int i = 0; i < n; ++i) {
    const saved_files& f = files[static_cast<std::size_t>(i)];
    m.replicated.push_back({part_name("replicated", i, n), f.part.size, f.part.checksum});
    m.per_rank.push_back({part_name("rank", i, n), f.own.size, f.own.checksum});
  }
  m.root.push_back({root_name(n), files[0].root.size, files[0].root.checksum});
  return m;
}

//! One save on one rank: the state's bytes, its files once written (or what failed), and the
//! thread that writes them when asynchronous.
struct save_job {
  std::uint64_t step = 0;
  int rank = 0; // read on the trainer's thread: the writer thread touches no communicator
  int ranks = 1;
  byte_writer replicated; // large blocks borrowed from the state
  byte_writer root;       // rank 0's only
  byte_writer own;
  std::array<byte_pieces, 3> pieces; // what is written: the writers' bytes, or
  std::array<kept_buffer, 3> copies; // with async, their copies here
  std::string outcome;               // saved_files::outcome() once written, else what failed
  std::thread writer;

  //! This rank's part of the replicated state and its own state, each to its file in the step's
  //! directory under `directory`. Reports in `outcome`, never throws: it may run on the writer
  //! thread.
  void write_files(const std::filesystem::path& directory, const write_function& write) noexcept {
    const int n = ranks;
    const int r = rank;
    try {
      const std::filesystem::path where = directory / step_name(step);
      if (std::filesystem::create_directories(where)) {
        sync_directory(directory); // the step's directory is there after a crash
      }
      const std::size_t total = replicated.size();
      const std::size_t page = page_size();
      const std::size_t begin = part_boundary(total, r, n, page);
      const std::size_t end = part_boundary(total, r + 1, n, page);
      saved_files files;
      files.part = write_atomically(where, part_name("replicated", r, n),
                                    slice(pieces[0], begin, end), write);
      files.own = write_atomically(where, part_name("rank", r, n), pieces[2], write);
      if (r == 0) {
        files.root = write_atomically(where, root_name(n), pieces[1], write);
      }
      // The whole replicated state's checksum, which the ranks compare: a replica that differs
      // is caught here, at every save.
      // (On one rank its part is the whole: its checksum is not computed twice.)
      files.replicated_size = total;
      files.replicated_checksum = n == 1 ? files.part.checksum : checksum::of(pieces[0]);
      outcome = files.outcome();
    } catch (const std::exception& e) {
      outcome = "rank " + std::to_string(r) + ": " + reason(e);
    }
  }
};

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
