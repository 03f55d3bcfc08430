// SPDX-License-Identifier: Apache-2.0
#pragma once

// Checkpoint and resume for a data-parallel trainer: one object, two calls.
//
//   cohort::checkpointer ckpt{comm, "ckpt", {.keep = 3}};
//   if (auto step = ckpt.resume(params, optimizer_state, rng, position)) { ... }
//   ckpt.save(step, params, optimizer_state, rng, position);
//
// A checkpoint is the directory `step-<step>` under `dir`. The replicated state (the same on every
// rank) is serialized on every rank and split in as many parts as there are ranks, rank r writing
// part r, so that the ranks write it once, in parallel; each rank writes its own state to a file
// of its own. Every file goes to disk atomically (temporary name, fsync, rename, fsync of the
// directory), and only after every rank has said that its files are there does rank 0 write the
// manifest (step, ranks, each file's size and XXH3-64), atomically too: a checkpoint without a
// manifest does not exist. Older checkpoints are removed after a newer one is complete.
//
// `resume` tries the complete checkpoints newest first. Every rank verifies the files it needs
// (sizes, then checksums, every length bounded before anything is allocated) and the ranks agree
// on the result: one bad file anywhere skips that checkpoint on every rank, with a message naming
// the file and both checksums, and the ranks go on to the next older one together. The directory
// must be one file system every rank sees (a shared one across nodes).

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/checksum.hpp>
#include <cohort/checkpoint/collective.hpp>
#include <cohort/checkpoint/files.hpp>
#include <cohort/checkpoint/layout.hpp>
#include <cohort/checkpoint/manifest.hpp>
#include <cohort/checkpoint/save_job.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/checkpoint/state_io.hpp>
#include <cohort/checkpoint/verify.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>

#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

struct checkpoint_options {
  //! How many complete checkpoints to keep (the newest); at least 1.
  std::size_t keep = 3;
  //! The largest file a checkpoint may hold: a manifest that says more is refused before
  //! anything is read.
  std::uint64_t max_file_bytes = std::uint64_t{1} << 40;
  //! Write the files on a thread of each rank while training goes on (see checkpointer::save).
  bool async = false;
  //! Where file writes go (::write when empty): tests inject a failing one. With `async` it is
  //! called on the writer thread.
  checkpoint::write_function write = {};
};

template <class Communicator>
class checkpointer {
public:
  //! Creates `directory` if needed. Not collective.
  checkpointer(Communicator& comm, std::filesystem::path directory, checkpoint_options options = {})
      : comm_(comm)
      , directory_(std::move(directory))
      , options_(std::move(options)) {
    if (options_.keep == 0) {
      throw invalid_argument("cohort::checkpointer: keep must be at least 1");
    }
    std::error_code ignored;
    std::filesystem::create_directories(directory_, ignored);
  }

  //! Writes `state` as the checkpoint of `step`. Collective. Throws `checkpoint_error` on every
  //! rank if any rank failed, naming the ranks and what failed, and removes what was written of
  //! this step; the checkpoints before stay as they were. A step that has a complete checkpoint
  //! already is not written again if this checkpointer saved it or resumed from it; one it did
  //! not (another run's, in a directory not resumed from) is an error on every rank. The ranks'
  //! replicated state must be identical: if it is not, that is the error (naming two ranks that
  //! differ), not a checkpoint.
  //!
  //! With `async`, `save` returns once the state is copied into memory, and a thread of this
  //! rank writes its files while training goes on; the next `save`, `resume` or `finish`
  //! completes that checkpoint (the ranks agree, rank 0 writes the manifest) and throws what went
  //! wrong with it.
  template <class... State>
  requires(checkpointable<std::remove_cvref_t<State>>&&...) void save(std::uint64_t step,
                                                                      const State&... state) {
    checkpoint::agree_on_call(comm_, "save", std::to_string(step), options_);
    finish();
    const std::filesystem::path where = directory_ / step_name(step);
    if (checkpoint::on_rank_0(comm_, directory_, [&] {
          return checkpoint::is_file(where / checkpoint::manifest_name);
        })) {
      if (step == resumed_ || step == last_saved_) {
        return; // the same state, checkpointed already by this run
      }
      throw checkpoint_error("cohort checkpoint: step " + std::to_string(step) +
                             " already has a complete checkpoint in " + directory_.string() +
                             " that this run neither saved nor resumed from (another run's? "
                             "call resume first, or save into another directory)");
    }
    auto job = std::make_unique<checkpoint::save_job>();
    job->step = step;
    job->rank = comm_.rank();
    job->ranks = comm_.size();
    try {
      job->replicated = checkpoint::serialize<state_scope::replicated>(step, state...);
      if (job->rank == 0) {
        job->root = checkpoint::serialize<state_scope::root>(step, state...);
      }
      job->own = checkpoint::serialize<state_scope::per_rank>(step, state...);
      job->pieces = {job->replicated.pieces(), job->root.pieces(), job->own.pieces()};
      if (options_.async) {
        // The state may change once save returns: its bytes are copied now, into buffers kept
        // from one save to the next (no allocation, no page faults, once they are large enough).
        job->copies = std::move(spare_);
        for (std::size_t i = 0; i < job->pieces.size(); ++i) {
          job->pieces[i] = job->copies[i].copy(job->pieces[i]);
        }
      }
    } catch (const std::exception& e) {
      job->outcome = "rank " + std::to_string(comm_.rank()) + ": " + checkpoint::reason(e);
    }
    if (options_.async) {
      // Every rank returns here, even one whose state did not serialize: the ranks complete the
      // save together at the next call, where that failure is every rank's error.
      if (job->outcome.empty()) {
        try {
          job->writer = std::thread(
              [this, job = job.get()] { job->write_files(directory_, options_.write); });
        } catch (const std::exception& e) { // std::system_error: no thread to be had
          job->outcome = "rank " + std::to_string(job->rank) + ": no writer thread: " + e.what();
        }
      }
      pending_ = std::move(job);
      return;
    }
    if (job->outcome.empty()) {
      job->write_files(directory_, options_.write);
    }
    complete(*job);
  }

  //! Completes an asynchronous save still in flight (collective); throws what went wrong with
  //! it. Nothing to do without one.
  void finish() {
    if (!pending_) {
      return;
    }
    const std::unique_ptr<checkpoint::save_job> job = std::move(pending_);
    if (job->writer.joinable()) {
      job->writer.join();
    }
    spare_ = std::move(job->copies);
    complete(*job);
  }

  //! Waits for an asynchronous save's files and completes its checkpoint (collective), unless
  //! an exception is unwinding (the other ranks may not be here): then that checkpoint is left
  //! without its manifest, and does not exist.
  ~checkpointer() {
    if (!pending_) {
      return;
    }
    if (pending_->writer.joinable()) {
      pending_->writer.join();
    }
    if (std::uncaught_exceptions() == 0) {
      try {
        complete(*pending_);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
    }
  }

  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;

  //! Loads the newest checkpoint that every rank verified into `state` and returns its step, or
  //! nothing if there is none (training starts afresh). Collective. Checkpoints skipped on the
  //! way are listed by `skipped()` (and printed by rank 0), and set aside (renamed
  //! `set-aside-step-...`), so that the run's next saves are the newest. Per-rank state is loaded
  //! only if the checkpoint has as many ranks as now; otherwise it keeps its value, and
  //! `data_position` restarts its epoch. Sharded state is read from every saved rank's file at
  //! any number of ranks (each rank takes what it holds now). Throws `checkpoint_error` on every
  //! rank if a verified checkpoint does not fit `state` (another model, another order of things);
  //! the things loaded before the one that did not fit keep what they loaded, so the state is then
  //! to be thrown away, not trained.
  template <class... State>
  requires(checkpointable<std::remove_cvref_t<State>>&&...) std::optional<std::uint64_t> resume(
      State&&... state) {
    checkpoint::agree_on_call(comm_, "resume", "none", options_);
    finish();
    skipped_.clear();
    resumed_.reset();
    // What a resume reads through (a 1 MiB window; the whole replicated state for a checkpoint
    // whose parts do not map as one span): freed when resume returns (a run resumes once).
    struct release_on_return {
      checkpoint::kept_buffer& buffer;
      ~release_on_return() { buffer = checkpoint::kept_buffer{}; }
    } release{read_buffer_};
    const std::vector<std::uint64_t> steps =
        checkpoint::on_rank_0(comm_, directory_, [&] { return complete_steps(); });
    // Saves that did not finish (killed, or failed) left directories without a manifest.
    const std::vector<std::uint64_t> unfinished =
        checkpoint::on_rank_0(comm_, directory_, [&] { return unfinished_steps(); });
    for (const std::uint64_t step : unfinished) {
      if (steps.empty() || step > steps.front()) {
        note_skipped("step " + std::to_string(step) +
                     " ignored: it has no manifest (a save that did not finish)");
      }
    }
    for (const std::uint64_t step : steps) {
      std::optional<checkpoint::verified_step> files;
      // "damage: ..." (the checkpoint's fault: skipped) or "fault: ..." (the machine's: an
      // error on every rank, the checkpoints left as they are, for a job that can read them).
      std::string problem;
      try {
        files = checkpoint::verify_step(
            directory_, step, comm_.rank(), comm_.size(), options_.max_file_bytes, read_buffer_,
            checkpoint::count_of<state_scope::sharded, std::remove_cvref_t<State>...>() > 0);
      } catch (const checkpoint_io_error& e) {
        problem = "fault: rank " + std::to_string(comm_.rank()) + ": " + checkpoint::reason(e);
      } catch (const checkpoint_error& e) {
        problem = "damage: " + std::string(e.what());
      } catch (const std::exception& e) {
        problem = "fault: rank " + std::to_string(comm_.rank()) + ": " + checkpoint::reason(e);
      }
      std::vector<std::string> problems = comm_.allgather_obj(problem);
      std::vector<std::string> faults;
      for (std::string& p : problems) {
        if (p.starts_with("fault: ")) {
          faults.push_back(p.substr(7));
        } else if (p.starts_with("damage: ")) {
          p.erase(0, 8);
        }
      }
      throw_failures(faults,
                     "reading step " + std::to_string(step) +
                         " (not damage: the checkpoints are left as they are)",
                     /*machine_fault=*/true);
      if (std::any_of(problems.begin(), problems.end(),
                      [](const std::string& p) { return !p.empty(); })) {
        // One message per problem, naming the ranks that found it (a shared file: all of them).
        for (std::size_t i = 0; i < problems.size(); ++i) {
          if (problems[i].empty() ||
              std::find(problems.begin(), problems.begin() + static_cast<std::ptrdiff_t>(i),
                        problems[i]) != problems.begin() + static_cast<std::ptrdiff_t>(i)) {
            continue;
          }
          std::string ranks;
          for (std::size_t j = i; j < problems.size(); ++j) {
            if (problems[j] == problems[i]) {
              ranks += (ranks.empty() ? "" : ", ") + std::to_string(j);
            }
          }
          std::string_view why = problems[i];
          if (why.starts_with(checkpoint::error_prefix)) {
            why.remove_prefix(checkpoint::error_prefix.size());
          }
          note_skipped("step " + std::to_string(step) + " skipped (rank" +
                       (ranks.find(',') == std::string::npos ? " " : "s ") + ranks +
                       "): " + std::string(why));
        }
        continue;
      }
      std::string failure;
      try {
        std::vector<std::span<const std::byte>> rank_files;
        for (const checkpoint::mapped_files& file : files->rank_files) {
          rank_files.push_back(file.bytes());
        }
        checkpoint::deserialize(files->replicated, files->root, {rank_files, files->first_rank},
                                (directory_ / step_name(step)).string(), step,
                                {files->saved_ranks, comm_.size(), comm_.rank()}, state...);
      } catch (const std::exception& e) {
        failure = "rank " + std::to_string(comm_.rank()) + ": " + checkpoint::reason(e);
      }
      throw_failures(comm_.allgather_obj(failure), "resuming from step " + std::to_string(step));
      set_aside_newer_than(step);
      resumed_ = step;
      return step;
    }
    set_aside_newer_than(std::nullopt);
    return std::nullopt;
  }

  //! What the last `resume` skipped, and why (each names the file and, for a damaged one, both
  //! checksums).
  const std::vector<std::string>& skipped() const noexcept { return skipped_; }

  //! The steps of the complete checkpoints (with a manifest), newest first. Not collective.
  //! Throws `checkpoint_io_error` if the directory cannot be listed (as `unfinished_steps`).
  std::vector<std::uint64_t> complete_steps() const {
    return checkpoint::steps_where(directory_, true);
  }

  //! The steps of the checkpoint directories without a manifest, newest first. Not collective.
  std::vector<std::uint64_t> unfinished_steps() const {
    return checkpoint::steps_where(directory_, false);
  }

  const std::filesystem::path& directory() const noexcept { return directory_; }

  //! The directory of the checkpoint of `step` under `directory`.
  static std::string step_name(std::uint64_t step) { return checkpoint::step_name(step); }

private:
  // The collective end of a save: the ranks learn each other's outcome; if every rank wrote
  // its files and their replicated states are one, rank 0 writes the manifest, then prunes.
  void complete(checkpoint::save_job& job) {
    const int r = comm_.rank();
    const std::filesystem::path where = directory_ / step_name(job.step);
    const std::string doing = "saving step " + std::to_string(job.step);
    std::vector<std::string> outcomes = comm_.allgather_obj(job.outcome);
    const std::vector<checkpoint::saved_files> files = checkpoint::read_outcomes(outcomes);
    if (checkpoint::replicas_differ(outcomes, files)) { // (the same on every rank)
      const bool mine = checkpoint::succeeded(job.outcome);
      checkpoint::name_differing_parts(
          comm_.allgather_obj(mine ? checkpoint::part_checksums(job.replicated, job.pieces[0])
                                   : std::vector<std::string>{}),
          outcomes);
    }
    try {
      throw_failures(outcomes, doing);
    } catch (const checkpoint_error&) {
      if (r == 0) { // every rank is done with the directory: no half checkpoint is left
        std::error_code ignored;
        std::filesystem::remove_all(where, ignored);
      }
      comm_.barrier(); // and when save throws, it is gone
      throw;
    }
    std::string written = "ok";
    if (r == 0) {
      try {
        const std::string text = checkpoint::manifest_of(job.step, files).text();
        write(where, std::string(checkpoint::manifest_name),
              {std::as_bytes(std::span(text.data(), text.size()))});
      } catch (const std::exception& e) {
        written = "rank 0: " + checkpoint::reason(e);
        std::error_code ignored; // every rank is done with the directory: nothing half is left
        std::filesystem::remove_all(where, ignored);
      }
      if (written == "ok") {
        // Before any rank returns: when save returns, the old ones are gone. (It never throws:
        // this checkpoint is complete whatever happens to the old ones.)
        checkpoint::prune(directory_, options_.keep, job.step);
      }
    }
    throw_failures({comm_.bcast_obj(written)}, doing);
    last_saved_ = job.step;
  }

  // After a resume from `step` (or from nothing), the checkpoint directories of later steps (the
  // ones skipped, and saves that did not finish) are renamed out of the way, kept for a person to
  // look at: the run now goes on from `step`, and its next saves must be the newest checkpoints
  // (or keep N would remove them in favour of a damaged one, and a damaged step would never be
  // written again). Collective: when resume returns, they are gone.
  void set_aside_newer_than(std::optional<std::uint64_t> step) {
    for (std::string& note : checkpoint::on_rank_0(comm_, directory_, [&] {
           return checkpoint::set_aside_later_than(directory_, step);
         })) {
      note_skipped(std::move(note)); // (on every rank alike, as every note of a resume)
    }
  }

  // Kept for skipped(), and printed once (by rank 0).
  void note_skipped(std::string message) {
    if (comm_.rank() == 0) {
      std::fprintf(stderr, "%s%s\n", checkpoint::error_prefix.data(), message.c_str());
    }
    skipped_.push_back(std::move(message));
  }

  checkpoint::file_record write(const std::filesystem::path& where, const std::string& name,
                                const checkpoint::byte_pieces& pieces) const {
    return checkpoint::write_atomically(where, name, pieces, options_.write);
  }

  // Throws on every rank if any outcome is not "ok...", naming each failure.
  // `machine_fault`: the failures are the machine's (`checkpoint_io_error`), not the state's.
  void throw_failures(const std::vector<std::string>& outcomes, const std::string& doing,
                      bool machine_fault = false) const {
    std::string failures;
    for (const std::string& o : outcomes) {
      if (o.compare(0, 2, "ok") != 0) {
        failures += (failures.empty() ? "" : "; ") + o;
      }
    }
    if (failures.empty()) {
      return;
    }
    const std::string message =
        "cohort checkpoint: " + doing + " in " + directory_.string() + " failed on " + failures;
    if (machine_fault) {
      throw checkpoint_io_error(message);
    }
    throw checkpoint_error(message);
  }

  Communicator& comm_;
  std::filesystem::path directory_;
  checkpoint_options options_;
  std::vector<std::string> skipped_;
  std::optional<std::uint64_t> resumed_;          // the step the last resume loaded
  std::optional<std::uint64_t> last_saved_;       // the step of the last save completed
  std::unique_ptr<checkpoint::save_job> pending_; // an asynchronous save in flight
  std::array<checkpoint::kept_buffer, 3>
      spare_;                           // the copies of the last asynchronous save, to reuse
  checkpoint::kept_buffer read_buffer_; // the joined replicated state, during a resume
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
