// SPDX-License-Identifier: Apache-2.0
// A checkpoint that does not fit on its file system (a small tmpfs, mounted by full_disk.sh):
// the save is an error on every rank naming what failed, what it wrote is removed, and the
// checkpoint before resumes intact.
//
//   full_disk DIR   # DIR holds room for one checkpoint of this state, not two
#include <cohort/checkpoint.hpp>
#include <cohort/cohort.hpp>

#include <boost/mpi/environment.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using param = cohort::parameter_ref<std::vector<float>>;

struct state {
  std::vector<float> w = std::vector<float>(256 * 1024, 0.0f); // 1 MiB
  std::vector<float> g = std::vector<float>(256 * 1024);
  std::vector<param> params{{"w", &w, &g}};
  void set(float value) { std::fill(w.begin(), w.end(), value); }
};

} // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: full_disk DIR\n");
    return 2;
  }
  auto comm = cohort::make_communicator<cohort::flat>();
  const auto every_rank = [&](bool mine) {
    return comm.allreduce_obj(mine ? 1 : 0, [](int a, int b) { return std::min(a, b); }) == 1;
  };
  cohort::checkpointer ckpt{comm, argv[1], {.keep = 1}};
  state s;
  s.set(1);
  ckpt.save(1, s.params);
  s.set(2);
  std::string error;
  try {
    ckpt.save(2, s.params);
  } catch (const cohort::checkpoint_error& e) {
    error = e.what();
  }
  if (comm.rank() == 0) {
    std::printf("save of step 2: %s\n", error.empty() ? "succeeded" : error.c_str());
  }
  const bool named = error.find("No space left on device") != std::string::npos &&
                     error.find("saving step 2") != std::string::npos;
  const bool removed = !std::filesystem::exists(std::filesystem::path(argv[1]) / ckpt.step_name(2));
  const bool kept = ckpt.complete_steps() == std::vector<std::uint64_t>{1};
  s.set(3);
  const bool resumed = ckpt.resume(s.params) == 1u &&
                       std::all_of(s.w.begin(), s.w.end(), [](float x) { return x == 1.0f; });
  const bool all_named = every_rank(named);
  const bool all_removed = every_rank(removed);
  const bool all_kept = every_rank(kept);
  const bool all_resumed = every_rank(resumed);
  const auto yes = [](bool b) { return b ? "yes" : "no"; };
  if (comm.rank() == 0) {
    std::printf("error on every rank naming ENOSPC: %s; step 2 removed: %s; step 1 kept: %s; "
                "step 1 resumed intact: %s\n",
                yes(all_named), yes(all_removed), yes(all_kept), yes(all_resumed));
  }
  return all_named && all_removed && all_kept && all_resumed ? 0 : 1;
}
