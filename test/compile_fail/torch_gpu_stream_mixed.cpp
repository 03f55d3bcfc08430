// SPDX-License-Identifier: Apache-2.0
// torch_gpu_stream.cpp's second case: a run-time mix of host and GPU strategies.
#define COHORT_MIXED
#include "torch_gpu_stream.cpp"
