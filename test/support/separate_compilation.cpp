// SPDX-License-Identifier: Apache-2.0
// The one translation unit of a COHORT_SEPARATE_COMPILATION program that compiles cohort's
// non-template engine.
#include <cohort/src.hpp>
