// SPDX-License-Identifier: Apache-2.0
#pragma once

// A checkpoint's manifest: the last file written, by one rank, once every rank has written its
// files; a checkpoint without one does not exist. Text, one fact a line, so that a person can
// read it:
//
//   cohort checkpoint 1
//   byte-order 1
//   step 1200
//   ranks 2
//   replicated-state 8388608 5a0e...c2
//   replicated 0 4194304 9f3c...e1 replicated-0-of-2
//   root 0 36112 77a0...03 root-of-2
//   per-rank 1 6672 0b1d...7a rank-1-of-2
//   end
//   checksum 3c81...9d
//
// (the replicated state whole: its size, which its parts must add up to, and XXH3-64, which the
// ranks compared when they saved; a file line: role, index, size in bytes, XXH3-64, name; last,
// the XXH3-64 of every line before it, so that a damaged manifest is found as damage, by its
// checksum, before any of its numbers is believed). Parsing is strict and bounded: any line out
// of place, number out of range or name with a path in it is an error naming the line. Format 1
// (no checksum line) is still read.

#include <cohort/checkpoint/files.hpp>
#include <cohort/config.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

inline constexpr int format_version = 2;
//! The manifest's name in a checkpoint's directory.
inline constexpr std::string_view manifest_name = "MANIFEST";
//! Most files a manifest lists: two per rank, and rank 0's.
inline constexpr std::size_t max_files = 2 * 65536 + 1;

struct manifest {
  //! The largest manifest read: the header and max_files lines of at most 320 characters.
  static constexpr std::uint64_t max_bytes = 1024 + max_files * 320;

  std::uint64_t step = 0;
  int ranks = 0;
  std::uint64_t replicated_size = 0;     //!< the replicated state's parts joined
  std::uint64_t replicated_checksum = 0; //!< and their XXH3-64
  std::vector<file_record> replicated;   //!< the parts of the replicated state, in order
  std::vector<file_record> root;         //!< rank 0's state: one file
  std::vector<file_record> per_rank;     //!< each rank's own state, by rank

  //! The text written to the manifest's file.
  std::string text() const {
    std::string out = "cohort checkpoint " + std::to_string(format_version) + "\n";
    out +=
        "byte-order " + std::string(std::endian::native == std::endian::little ? "1" : "2") + "\n";
    out += "step " + std::to_string(step) + "\n";
    out += "ranks " + std::to_string(ranks) + "\n";
    out += "replicated-state " + std::to_string(replicated_size) + " " +
           to_hex(replicated_checksum) + "\n";
    auto lines = [&](std::string_view role, const std::vector<file_record>& files) {
      for (std::size_t i = 0; i < files.size(); ++i) {
        out += std::string(role) + " " + std::to_string(i) + " " + std::to_string(files[i].size) +
               " " + to_hex(files[i].checksum) + " " + files[i].name + "\n";
      }
    };
    lines("replicated", replicated);
    lines("root", root);
    lines("per-rank", per_rank);
    out += "end\n";
    out +=
        "checksum " + to_hex(checksum::of(std::as_bytes(std::span(out.data(), out.size())))) + "\n";
    return out;
  }

  //! Reads a manifest's text; `source` names it in errors (its path).
  static manifest parse(std::string_view text, const std::string& source) {
    manifest m;
    std::size_t line_number = 0;
    auto fail = [&](const std::string& why) -> void {
      throw checkpoint_error("cohort checkpoint: " + source + " line " +
                             std::to_string(line_number) + ": " + why);
    };
    auto next_line = [&]() -> std::string_view {
      ++line_number;
      const std::size_t end = text.find('\n');
      if (end == std::string_view::npos) {
        fail("the manifest ends without its last line (truncated)");
      }
      const std::string_view line = text.substr(0, end);
      text.remove_prefix(end + 1);
      return line;
    };
    auto words = [&](std::string_view line) {
      std::vector<std::string_view> out;
      while (!line.empty() && out.size() < 8) {
        const std::size_t space = line.find(' ');
        out.push_back(line.substr(0, space));
        line = space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
      }
      return out;
    };
    auto number = [&](std::string_view word, std::uint64_t limit) {
      std::uint64_t value = 0;
      const auto [end, code] = std::from_chars(word.data(), word.data() + word.size(), value);
      if (code != std::errc() || end != word.data() + word.size() || word.empty() ||
          value > limit) {
        fail("'" + std::string(word) + "' is not a number up to " + std::to_string(limit));
      }
      return value;
    };
    auto hex = [&](std::string_view word) {
      std::uint64_t value = 0;
      if (word.size() != 16 ||
          std::from_chars(word.data(), word.data() + 16, value, 16).ptr != word.data() + 16) {
        fail("'" + std::string(word) + "' is not a checksum of 16 hexadecimal digits");
      }
      return value;
    };
    auto expect = [&](std::string_view key, std::uint64_t limit) {
      const std::vector<std::string_view> w = words(next_line());
      if (w.size() != 2 || w[0] != key) {
        fail("expected '" + std::string(key) + " <number>'");
      }
      return number(w[1], limit);
    };

    const std::string_view whole = text;
    const std::string_view first = next_line();
    const bool summed = first == "cohort checkpoint " + std::to_string(format_version);
    if (!summed && first != "cohort checkpoint 1") {
      fail("not a cohort checkpoint manifest of format 1 or " + std::to_string(format_version));
    }
    if (summed) {
      // The last line: "checksum " and 16 hexadecimal digits, of all the text before it.
      constexpr std::size_t last = 9 + 16 + 1;
      const std::size_t body = whole.size() >= last ? whole.size() - last : 0;
      if (whole.size() < last || body < first.size() + 1 || whole.substr(body, 9) != "checksum " ||
          whole.back() != '\n') {
        line_number = static_cast<std::size_t>(std::count(whole.begin(), whole.end(), '\n'));
        fail("the manifest does not end with its checksum line (truncated or damaged)");
      }
      std::uint64_t said = 0;
      const char* digits = whole.data() + body + 9;
      if (std::from_chars(digits, digits + 16, said, 16).ptr != digits + 16) {
        line_number = static_cast<std::size_t>(std::count(whole.begin(), whole.end(), '\n'));
        fail("'" + std::string(whole.substr(body, last - 1)) +
             "' is not a checksum line of 16 hexadecimal digits (damaged)");
      }
      const std::uint64_t sum = checksum::of(std::as_bytes(std::span(whole.data(), body)));
      if (sum != said) {
        throw checkpoint_error("cohort checkpoint: " + source + " has checksum " + to_hex(sum) +
                               ", its last line says " + to_hex(said) + " (damaged or replaced)");
      }
      text = whole.substr(first.size() + 1, body - first.size() - 1);
    }
    if (expect("byte-order", 2) != (std::endian::native == std::endian::little ? 1u : 2u)) {
      fail("written on a machine of the other byte order");
    }
    m.step = expect("step", UINT64_MAX);
    m.ranks = static_cast<int>(expect("ranks", max_files / 2));
    if (m.ranks == 0) {
      fail("a checkpoint of 0 ranks");
    }
    {
      const std::vector<std::string_view> w = words(next_line());
      if (w.size() != 3 || w[0] != "replicated-state") {
        fail("expected 'replicated-state <size> <checksum>'");
      }
      m.replicated_size = number(w[1], UINT64_MAX);
      m.replicated_checksum = hex(w[2]);
    }
    for (;;) {
      const std::string_view line = next_line();
      if (line == "end") {
        break;
      }
      const std::vector<std::string_view> w = words(line);
      if (w.size() != 5 || (w[0] != "replicated" && w[0] != "root" && w[0] != "per-rank")) {
        fail("expected 'replicated|root|per-rank <index> <size> <checksum> <name>' or 'end'");
      }
      std::vector<file_record>& files = w[0] == "replicated" ? m.replicated
                                        : w[0] == "root"     ? m.root
                                                             : m.per_rank;
      if (m.replicated.size() + m.root.size() + m.per_rank.size() >= max_files) {
        fail("more than " + std::to_string(max_files) + " files");
      }
      if (number(w[1], max_files) != files.size()) {
        fail("file " + std::string(w[1]) + " out of order");
      }
      file_record record;
      record.size = number(w[2], UINT64_MAX);
      record.checksum = hex(w[3]);
      if (!valid_name(w[4])) {
        fail("'" + std::string(w[4]) + "' is not a file name of this checkpoint");
      }
      record.name = std::string(w[4]);
      files.push_back(std::move(record));
    }
    if (!text.empty()) {
      fail("text after 'end'");
    }
    if (m.per_rank.size() != static_cast<std::size_t>(m.ranks) ||
        m.replicated.size() != static_cast<std::size_t>(m.ranks) || m.root.size() != 1) {
      fail("lists " + std::to_string(m.replicated.size()) + " replicated parts, " +
           std::to_string(m.root.size()) + " root files and " + std::to_string(m.per_rank.size()) +
           " per-rank files for " + std::to_string(m.ranks) +
           " ranks (one of each per rank, one root file)");
    }
    return m;
  }

  //! A plain file name: letters, digits, '-', '_' and '.', not starting with '.'.
  static bool valid_name(std::string_view name) {
    return !name.empty() && name.size() <= 255 && name.front() != '.' &&
           std::all_of(name.begin(), name.end(), [](char c) {
             return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
           });
  }
};

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
