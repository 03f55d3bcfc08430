// SPDX-License-Identifier: Apache-2.0
#pragma once

// Where a checkpoint's files are: the directory `step-<20 digits>` of each step under the
// checkpointer's directory, and in it one part of the replicated state per rank, one file per
// rank for its own state, rank 0's file, and the manifest. Listing and pruning never throw for a
// name that is not a step's: a directory may hold anything else a person put there.

#include <cohort/checkpoint/files.hpp>
#include <cohort/checkpoint/manifest.hpp>
#include <cohort/config.hpp>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! The directory of the checkpoint of `step`: zero-padded, so that names sort as steps do.
inline std::string step_name(std::uint64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%020" PRIu64, step);
  return name;
}

//! The step whose directory `name` is, or nothing for any other name.
inline std::optional<std::uint64_t> step_of(const std::string& name) {
  std::uint64_t step = 0;
  if (name.size() != 25 || name.compare(0, 5, "step-") != 0) {
    return std::nullopt;
  }
  const auto [end, error] = std::from_chars(name.data() + 5, name.data() + name.size(), step);
  if (error != std::errc{} || end != name.data() + name.size()) {
    return std::nullopt; // not digits, or past 2^64 - 1: not a step's directory
  }
  return step;
}

//! Rank 0's file of a checkpoint saved by `ranks` ranks.
inline std::string root_name(int ranks) {
  return "root-of-" + std::to_string(ranks);
}

//! Part `index` of `ranks` of `role` ("replicated": the shared state; "rank": a rank's own).
inline std::string part_name(std::string_view role, int index, int ranks) {
  return std::string(role) + "-" + std::to_string(index) + "-of-" + std::to_string(ranks);
}

//! Throws `checkpoint_io_error` for a failed call of the system's on `path` (`doing` it), unless
//! it failed because the path is not there (`missing` says which errors mean that).
inline void require_no_fault(const std::error_code& code, const std::filesystem::path& path,
                             std::string_view doing, std::initializer_list<std::errc> missing) {
  if (code && std::none_of(missing.begin(), missing.end(),
                           [&](std::errc absent) { return code == absent; })) {
    throw checkpoint_io_error("cohort checkpoint: " + std::string(doing) + " " + path.string() +
                              " failed: " + code.message());
  }
}

//! Whether `path` is a regular file (false when it, or a directory on its way, is not there);
//! `checkpoint_io_error` when the machine cannot tell (EACCES, EIO...): a checkpoint whose
//! manifest cannot be read is not one without a manifest.
inline bool is_file(const std::filesystem::path& path) {
  std::error_code code;
  const bool file = std::filesystem::is_regular_file(path, code);
  require_no_fault(code, path, "looking at",
                   {std::errc::no_such_file_or_directory, std::errc::not_a_directory});
  return file;
}

//! Calls `visit(name)` for every entry of `directory` (none if it is not there); a listing that
//! fails (EMFILE, EIO, EACCES, a file where the directory should be) throws
//! `checkpoint_io_error`: read as "nothing there", it would silently restart training from
//! scratch.
template <class Visit>
void list_directory(const std::filesystem::path& directory, Visit&& visit) {
  std::error_code code;
  for (std::filesystem::directory_iterator entry(directory, code), end; !code && entry != end;
       entry.increment(code)) {
    visit(entry->path().filename().string());
  }
  require_no_fault(code, directory, "listing", {std::errc::no_such_file_or_directory});
}

//! The steps under `directory` whose checkpoint is complete (it has a manifest), or, with
//! `complete` false, the ones that are not; newest first. Throws `checkpoint_io_error` when the
//! directory cannot be listed (rank 0 lists the steps for every rank: it sends them the failure).
inline std::vector<std::uint64_t> steps_where(const std::filesystem::path& directory,
                                              bool complete) {
  std::vector<std::uint64_t> steps;
  list_directory(directory, [&](const std::string& name) {
    const std::optional<std::uint64_t> step = step_of(name);
    if (step && is_file(directory / name / manifest_name) == complete) {
      steps.push_back(*step);
    }
  });
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

//! The names of the step directories under `directory` later than `step` (all of them, without
//! one). Throws as steps_where.
inline std::vector<std::string> names_later_than(const std::filesystem::path& directory,
                                                 std::optional<std::uint64_t> step) {
  std::vector<std::string> later;
  list_directory(directory, [&](const std::string& name) {
    if (const std::optional<std::uint64_t> s = step_of(name); s && (!step || *s > *step)) {
      later.push_back(name);
    }
  });
  return later;
}

//! What a directory set aside by a resume is named: this, then its step directory's name.
inline constexpr std::string_view set_aside_prefix = "set-aside-";

//! The step of a directory `set_aside_later_than` renamed ("set-aside-step-<20 digits>", then
//! perhaps
//! ".<n>"), or nothing for any other name.
inline std::optional<std::uint64_t> set_aside_step_of(const std::string& name) {
  constexpr std::string_view prefix = set_aside_prefix;
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() < prefix.size() + 25) {
    return std::nullopt;
  }
  const std::string rest = name.substr(prefix.size() + 25);
  if (!rest.empty() &&
      (rest.size() < 2 || rest.front() != '.' ||
       !std::all_of(rest.begin() + 1, rest.end(), [](char c) { return c >= '0' && c <= '9'; }))) {
    return std::nullopt;
  }
  return step_of(name.substr(prefix.size(), 25));
}

//! Renames the step directories under `directory` later than `step` (all of them, without one)
//! to "set-aside-<name>" (then ".<n>" if that is taken), kept for a person to look at; returns
//! what it did to each, a line each (a rename that failed says so). Throws as steps_where when
//! the directory cannot be listed.
inline std::vector<std::string> set_aside_later_than(const std::filesystem::path& directory,
                                                     std::optional<std::uint64_t> step) {
  std::vector<std::string> notes;
  std::error_code code;
  for (const std::string& name : names_later_than(directory, step)) {
    const std::string base = std::string(set_aside_prefix) + name;
    std::filesystem::path aside = directory / base;
    for (int i = 1; std::filesystem::exists(aside, code); ++i) {
      aside = directory / (base + "." + std::to_string(i));
    }
    std::filesystem::rename(directory / name, aside, code);
    notes.push_back(
        code ? "could not set " + name + " aside: " + code.message()
             : name + " set aside as " + aside.filename().string() +
                   (step ? " (a later step than the one resumed)" : " (nothing could be resumed)"));
  }
  return notes;
}

//! Keeps the newest `keep` complete checkpoints under `directory`, and always the one of step
//! `saved` (just written: a directory may hold later ones, from a run that saved without resuming
//! first, and keep N must not remove the run's own save); removes older ones, directories
//! without a manifest older than the newest complete one (saves that failed), and directories
//! set aside by a resume once `keep` complete checkpoints are newer than they are (kept for a
//! person to look at until then, not forever: each may be as large as the state). A manifest
//! goes first, so that a removal cut short leaves no checkpoint that looks complete. Never
//! throws: what cannot be listed or removed is reported on stderr (the checkpoint just saved is
//! complete whatever happens here).
inline void prune(const std::filesystem::path& directory, std::size_t keep,
                  std::uint64_t saved) noexcept {
  try {
    std::vector<std::uint64_t> complete = steps_where(directory, true);
    if (complete.empty()) {
      return;
    }
    const auto own = std::find(complete.begin(), complete.end(), saved);
    if (own != complete.end()) {
      std::rotate(complete.begin(), own, own + 1);
    }
    // The oldest of the `keep` newest complete checkpoints: what is set aside before it is old.
    std::vector<std::uint64_t> newest = complete;
    std::sort(newest.rbegin(), newest.rend());
    const bool full = keep > 0 && newest.size() >= keep;
    const std::uint64_t horizon = full ? newest[keep - 1] : 0;
    std::vector<std::filesystem::path> doomed;
    std::error_code code;
    for (std::filesystem::directory_iterator entry(directory, code), end; !code && entry != end;
         entry.increment(code)) {
      const std::string name = entry->path().filename().string();
      if (const std::optional<std::uint64_t> aside = set_aside_step_of(name)) {
        if (full && *aside < horizon) {
          doomed.push_back(entry->path());
        }
        continue;
      }
      const std::optional<std::uint64_t> step = step_of(name);
      if (!step) {
        continue;
      }
      const auto rank_of = std::find(complete.begin(), complete.end(), *step);
      const bool is_complete = rank_of != complete.end();
      if ((is_complete && static_cast<std::size_t>(rank_of - complete.begin()) >= keep) ||
          (!is_complete && *step < complete.front())) {
        doomed.push_back(entry->path());
      }
    }
    if (code) {
      std::fprintf(stderr, "cohort checkpoint: could not list %s: %s\n", directory.c_str(),
                   code.message().c_str());
    }
    for (const std::filesystem::path& path : doomed) {
      std::filesystem::remove(path / manifest_name, code);
      if (!code) {
        std::filesystem::remove_all(path, code);
      }
      if (code) {
        std::fprintf(stderr, "cohort checkpoint: could not remove %s: %s\n", path.c_str(),
                     code.message().c_str());
      }
    }
    if (!doomed.empty()) {
      sync_directory(directory);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort checkpoint: keeping the newest %zu in %s: %s\n", keep,
                 directory.c_str(), e.what());
  }
}

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
