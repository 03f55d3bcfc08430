// SPDX-License-Identifier: Apache-2.0
#pragma once

// What engine/agreement.hpp declares and does not define inline: in every translation unit by
// default, compiled once where <cohort/src.hpp> is included with COHORT_SEPARATE_COMPILATION.

#include <cohort/communicator/engine/agreement.hpp>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

COHORT_DECL std::vector<std::vector<signature_entry>>
gather_descriptions(MPI_Comm comm, const std::vector<signature_entry>& mine) {
  int size = 0;
  mpi::check(MPI_Comm_size(comm, &size), "MPI_Comm_size", comm);
  // Every rank receives every text: each keeps to its share of what one int can count, in whole
  // entries (a description that long is cut; the first difference is almost always early).
  const std::size_t budget =
      static_cast<std::size_t>(std::numeric_limits<int>::max()) / static_cast<std::size_t>(size);
  std::string flat;
  for (const auto& entry : mine) {
    const std::uint64_t lengths[2] = {entry.label.size(), entry.description.size()};
    if (flat.size() + sizeof lengths + lengths[0] + lengths[1] > budget) {
      break;
    }
    for (int k = 0; k < 2; ++k) {
      flat.append(reinterpret_cast<const char*>(&lengths[k]), sizeof lengths[k]);
      flat += k == 0 ? entry.label : entry.description;
    }
  }
  std::vector<int> counts(static_cast<std::size_t>(size));
  std::vector<int> offsets(static_cast<std::size_t>(size));
  const int count = static_cast<int>(flat.size());
  mpi::check(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm),
             "MPI_Allgather (agreement check)", comm);
  std::size_t total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    offsets[r] = static_cast<int>(total);
    total += static_cast<std::size_t>(counts[r]);
  }
  std::string all(total, '\0');
  mpi::check(MPI_Allgatherv(flat.data(), count, MPI_BYTE, all.data(), counts.data(), offsets.data(),
                            MPI_BYTE, comm),
             "MPI_Allgatherv (agreement check)", comm);
  std::vector<std::vector<signature_entry>> described(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    std::string_view text(all.data() + offsets[r], static_cast<std::size_t>(counts[r]));
    // Reads one length-prefixed string off the front of `text`; false when it is not whole.
    const auto take = [&](std::string& out) {
      std::uint64_t length = 0;
      if (text.size() < sizeof length) {
        return false;
      }
      std::memcpy(&length, text.data(), sizeof length);
      text.remove_prefix(sizeof length);
      if (length > text.size()) {
        return false;
      }
      out.assign(text.substr(0, static_cast<std::size_t>(length)));
      text.remove_prefix(static_cast<std::size_t>(length));
      return true;
    };
    signature_entry entry;
    while (take(entry.label) && take(entry.description)) {
      described[r].push_back(entry);
    }
  }
  return described;
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
