// SPDX-License-Identifier: Apache-2.0
#pragma once

//! The version of cohort, as a number (`major * 10000 + minor * 100 + patch`) and as parts.
#define COHORT_VERSION_MAJOR 0
#define COHORT_VERSION_MINOR 1
#define COHORT_VERSION_PATCH 0
#define COHORT_VERSION                                                                             \
  (COHORT_VERSION_MAJOR * 10000 + COHORT_VERSION_MINOR * 100 + COHORT_VERSION_PATCH)
