// SPDX-License-Identifier: Apache-2.0
#pragma once

// The checkpointer's two collective habits: the ranks agree on the call before anything is
// written or read, and what rank 0 alone looks at on disk reaches every rank, a fault included.

#include <cohort/checkpoint/files.hpp>
#include <cohort/communicator/agreement.hpp>
#include <cohort/config.hpp>

#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <exception>
#include <filesystem>
#include <string>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! The ranks must make the same call (a save of one step, or a resume) with the same options: a
//! rank that saves while another resumes, or saves another step, is a `mismatch_error` on every
//! rank naming the two, before anything is written or read. Collective.
template <class Communicator, class Options>
void agree_on_call(Communicator& comm, const char* call, const std::string& step,
                   const Options& options) {
  agree_on_settings(comm,
                    {{"the call", call},
                     {"the step", step},
                     {"option 'async'", options.async ? "true" : "false"},
                     {"option 'keep'", std::to_string(options.keep)},
                     {"option 'max_file_bytes'", std::to_string(options.max_file_bytes)}},
                    "checkpointer");
}

//! What `look()` returns on rank 0, on every rank (collective). A fault of the machine there (a
//! directory that does not list, a manifest that cannot be looked at) is `checkpoint_io_error` on
//! every rank, never a silent "nothing there".
template <class Communicator, class Look>
auto on_rank_0(Communicator& comm, const std::filesystem::path& directory, Look&& look) {
  decltype(look()) seen{};
  std::string fault;
  if (comm.rank() == 0) {
    try {
      seen = look();
    } catch (const std::exception& e) {
      fault = e.what();
    }
  }
  fault = comm.bcast_obj(fault);
  if (!fault.empty()) {
    throw checkpoint_io_error("cohort checkpoint: looking at the checkpoints in " +
                              directory.string() + " failed on rank 0: " + fault);
  }
  return comm.bcast_obj(seen);
}

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
