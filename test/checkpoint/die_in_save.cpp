// SPDX-License-Identifier: Apache-2.0
// A job with a rank killed (SIGKILL) in the middle of writing a file of step 2, and the job that
// resumes after it. Run by test/checkpoint/kill.sh:
//
//   die_in_save save DIR HOW   # saves step 1, then dies in step 2 (the job ends with an error)
//   die_in_save resume DIR     # resumes step 1, says so, and checks the state is step 1's
//
// HOW: `rank`, the last rank in its first file; `async`, the same on its writer thread while
// the ranks go on (`async` saves); `manifest`, rank 0 in the manifest, once every rank has
// written its files and reported them; `throw`, not killed: the last rank's trainer throws while
// an async save of step 2 is in flight, and the exception unwinds its checkpointer (which then
// leaves step 2 without its manifest) and its communicator, while the others complete the save.
#include <cohort/checkpoint.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

struct state {
  std::vector<float> w = std::vector<float>(100000, 0.0f);
  std::vector<float> g = std::vector<float>(100000);
  std::vector<param> params{{"w", &w, &g}};
  cohort::data_position position;
  void set(float value) {
    std::fill(w.begin(), w.end(), value);
    position = {0, static_cast<std::uint64_t>(value)};
  }
};

int run(std::string_view mode, std::string_view how, const char* directory);

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  const std::string_view mode = argc > 1 ? argv[1] : "";
  const std::string_view how = argc > 3 ? argv[3] : "";
  if (!((mode == "save" && argc == 4 &&
         (how == "rank" || how == "async" || how == "manifest" || how == "throw")) ||
        (mode == "resume" && argc == 3))) {
    std::fprintf(stderr, "usage: die_in_save save DIR rank|async|manifest|throw, or resume DIR\n");
    return 2;
  }
  try {
    return run(mode, how, argv[2]);
  } catch (const std::exception& e) {
    // Caught here, after every destructor of run's has run: the process ends as a trainer's
    // would that reports its error and returns.
    std::fprintf(stderr, "die_in_save: %s\n", e.what());
    return 1;
  }
}

namespace {

int run(std::string_view mode, std::string_view how, const char* directory) {
  auto comm = cohort::make_communicator<cohort::flat>();
  std::atomic<bool> armed = false; // once step 1 is complete (read on the writer thread)
  cohort::checkpoint_options options;
  options.async = how == "async" || how == "throw";
  const int rank = comm.rank();
  const int victim = how == "manifest" ? 0 : comm.size() - 1;
  const std::string_view manifest_start = "cohort checkpoint ";
  // The victim writes half of its first file of step 2 (or of the manifest), then is killed.
  options.write = [&](int fd, const void* data, std::size_t bytes) -> ::ssize_t {
    const std::string_view text(static_cast<const char*>(data),
                                std::min(bytes, manifest_start.size()));
    if (armed && rank == victim && how != "throw" &&
        (how != "manifest" || text == manifest_start)) {
      (void)::write(fd, data, bytes / 2);
      std::raise(SIGKILL);
    }
    return ::write(fd, data, bytes);
  };
  cohort::checkpointer ckpt{comm, directory, options};
  state s;
  if (mode == "save") {
    s.set(1);
    ckpt.save(1, s.params, s.position);
    ckpt.finish(); // (an async save completes here)
    armed = true;
    s.set(2);
    ckpt.save(2, s.params, s.position);
    if (how == "throw" && rank == victim) {
      throw std::runtime_error("rank " + std::to_string(rank) +
                               ": a failure of the trainer's while a save is in flight");
    }
    ckpt.finish();
    std::printf("saved step 2: the rank was not killed\n");
    return 0;
  }
  const auto resumed = ckpt.resume(s.params, s.position);
  const bool intact = resumed == 1u && s.position.step == 1u &&
                      std::all_of(s.w.begin(), s.w.end(), [](float x) { return x == 1.0f; });
  if (comm.rank() == 0) {
    for (const std::string& why : ckpt.skipped()) {
      std::printf("skipped: %s\n", why.c_str());
    }
    std::printf("resumed step %llu\n", static_cast<unsigned long long>(resumed.value_or(0)));
  }
  const bool all_intact =
      comm.allreduce_obj(intact ? 1 : 0, [](int a, int b) { return a < b ? a : b; }) == 1;
  if (comm.rank() == 0) {
    std::printf(all_intact ? "state of step 1 intact on every rank\n" : "STATE WRONG\n");
  }
  return all_intact ? 0 : 1;
}

} // namespace
