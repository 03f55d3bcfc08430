// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace cohort::test {

//! How many times the global operator new has run in this process. Link
//! support/allocation_counter.cpp, which replaces it, into the test that uses this.
long allocations() noexcept;

} // namespace cohort::test
