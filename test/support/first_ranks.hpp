// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cohort/cohort.hpp>

namespace cohort::test {

// The first `ranks` ranks of `comm` as a job of their own, running `f` on it, while the others
// wait: a job of fewer ranks within a test, to save at one number of ranks and resume at another.
template <class F>
void on_first(cohort::flat& comm, int ranks, F&& f) {
  if (comm.rank() < ranks) {
    cohort::flat job = comm.split(0, comm.rank());
    f(job);
  } else {
    (void)comm.split(1, comm.rank());
  }
  comm.barrier();
}

} // namespace cohort::test
