# SPDX-License-Identifier: Apache-2.0
# The LibTorch programs of this build (tests, examples, benchmarks) parse <torch/torch.h> and
# cohort's LibTorch adapter once per family of compile flags instead of once per translation
# unit: a fifth to a quarter of each one's time (docs/ci.md). A family is a set of targets whose
# flags and definitions agree (the examples and benchmarks; the LibTorch test program); its first
# target compiles the header, the others reuse it. GCC checks the precompiled header at each use
# and refuses it where a definition differs (-Winvalid-pch: an error where warnings are).
function(cohort_precompile_torch target family)
  get_property(owner GLOBAL PROPERTY cohort_torch_pch_${family})
  if(owner)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${target} PRIVATE <torch/torch.h> <cohort/adapters/torch.hpp>)
    set_property(GLOBAL PROPERTY cohort_torch_pch_${family} ${target})
  endif()
endfunction()
