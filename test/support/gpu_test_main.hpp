// SPDX-License-Identifier: Apache-2.0
#pragma once

// The main() of a single-process GPU test: where no CUDA device is visible it says so and exits
// 77, which ctest reports as skipped (SKIP_RETURN_CODE); otherwise Boost.Test runs on device 0.

#if !defined(BOOST_TEST_DYN_LINK) || !defined(BOOST_TEST_NO_MAIN)
#error "GPU tests are built with BOOST_TEST_DYN_LINK and BOOST_TEST_NO_MAIN defined"
#endif

#include <cohort/transport/cuda.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  if (cohort::cuda::device_count() == 0) {
    std::printf("no CUDA device visible: skipped\n");
    return 77;
  }
  cohort::cuda::check(cudaSetDevice(0), "cudaSetDevice");
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
