// SPDX-License-Identifier: Apache-2.0
#pragma once

// The engine's view of each shipped strategy of a fixed type (strategy_access::ref), instantiated
// once for a program built with COHORT_SEPARATE_COMPILATION: their headers declare it extern.

#include <cohort/communicator/dummy.hpp>
#include <cohort/communicator/flat.hpp>
#include <cohort/communicator/hierarchical.hpp>
#include <cohort/communicator/naive.hpp>
#include <cohort/communicator/shared_memory.hpp>
#include <cohort/communicator/strategy_access.hpp>
#include <cohort/communicator/two_dimensional.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

template engine::strategy_ref strategy_access::ref<dummy>(dummy&) noexcept;
template engine::strategy_ref strategy_access::ref<flat>(flat&) noexcept;
template engine::strategy_ref strategy_access::ref<hierarchical<>>(hierarchical<>&) noexcept;
template engine::strategy_ref strategy_access::ref<naive>(naive&) noexcept;
template engine::strategy_ref strategy_access::ref<shared_memory<>>(shared_memory<>&) noexcept;
template engine::strategy_ref strategy_access::ref<two_dimensional<>>(two_dimensional<>&) noexcept;

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
