// SPDX-License-Identifier: Apache-2.0
#pragma once

// A checkpoint's state as bytes, one scope at a time (the replicated things, rank 0's, or this
// rank's own): a header (what it is, the step, how many things), then each thing as its kind and a
// block its `checkpoint_traits` writes. Reading checks the header, each kind against the thing
// given and each block's length, and that nothing is left over, so that a checkpoint of another
// model or another order of things is an error naming the thing and both sides.

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/config.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! The file a thing of `scope` is written to: a rank's sharded things go into its own file.
constexpr state_scope file_of(state_scope scope) {
  return scope == state_scope::sharded ? state_scope::per_rank : scope;
}

//! How many of `State` are of `Scope`.
template <state_scope Scope, class... State>
constexpr std::uint64_t count_of() {
  return ((checkpoint_traits<std::remove_cvref_t<State>>::scope == Scope ? 1 : 0) + ... + 0);
}

//! How many of `State` go into the file of `Scope`.
template <state_scope Scope, class... State>
constexpr std::uint64_t count_in_file() {
  return ((file_of(checkpoint_traits<std::remove_cvref_t<State>>::scope) == Scope ? 1 : 0) + ... +
          0);
}

//! The header that opens the bytes of `scope`.
constexpr std::string_view magic_of(state_scope scope) {
  return scope == state_scope::replicated ? "cohort replicated state"
         : scope == state_scope::root     ? "cohort root state"
                                          : "cohort per-rank state";
}

//! The things of `state` that go into the file of `Scope`, as bytes (large blocks borrowed from
//! the state: see byte_writer).
template <state_scope Scope, class... State>
byte_writer serialize(std::uint64_t step, const State&... state) {
  byte_writer out;
  out.put_string(magic_of(Scope));
  out.put<std::uint64_t>(step);
  out.put<std::uint64_t>(count_in_file<Scope, State...>());
  (
      [&] {
        using traits = checkpoint_traits<std::remove_cvref_t<State>>;
        if constexpr (file_of(traits::scope) == Scope) {
          out.mark(std::string(traits::kind));
          out.put_string(traits::kind);
          const byte_writer::block_start start = out.begin_block();
          traits::save(out, state);
          out.end_block(start);
        }
      }(),
      ...);
  return out;
}

namespace detail {
template <state_scope Scope, class... State>
void read_header(byte_reader& in, std::uint64_t step) {
  const std::string_view magic = magic_of(Scope);
  if (in.get_string("the header", 64) != magic) {
    in.fail("the header", "is not \"" + std::string(magic) + "\"");
  }
  if (const auto saved = in.get<std::uint64_t>("the step"); saved != step) {
    in.fail("the step", "is " + std::to_string(saved) + ", not " + std::to_string(step));
  }
  const auto saved = in.get<std::uint64_t>("the number of things");
  if (saved != count_in_file<Scope, State...>()) {
    in.fail("the state", "holds " + std::to_string(saved) + " things, resume was given " +
                             std::to_string(count_in_file<Scope, State...>()));
  }
}

// The block of thing `index`, after its kind, checked against the thing given.
inline byte_reader next_block(byte_reader& in, std::size_t index, std::string_view kind) {
  const std::string saved = in.get_string("the kind of thing " + std::to_string(index));
  if (saved != kind) {
    in.fail("thing " + std::to_string(index),
            "was saved as a " + saved + ", resume was given a " + std::string(kind));
  }
  return byte_reader(in.get_block("a " + saved), in.source() + ", " + saved);
}

inline void require_read(const byte_reader& block, std::string_view kind) {
  if (block.left() != 0) {
    block.fail("the " + std::string(kind),
               "left " + std::to_string(block.left()) + " bytes unread");
  }
}
} // namespace detail

//! The per-rank files a rank reads at resume, from saved rank `first_rank` on: every saved
//! rank's where the state holds sharded things (`first_rank` 0), else its own where as many
//! ranks saved it as now, else one other's, whose things are checked against the state given
//! and read past (so that a sharded thing left out of it is an error at any number of ranks).
struct rank_files {
  std::span<const std::span<const std::byte>> files;
  int first_rank = 0;
};

//! Loads `state` from the bytes `serialize` wrote: the replicated things from `replicated`,
//! rank 0's from `root`, this rank's own from its file in `ranks_files` (when the number of
//! ranks changed they keep their values), and the sharded things from every saved rank's file.
//! `source` names the bytes in errors. Throws `checkpoint_error`.
template <class... State>
void deserialize(std::span<const std::byte> replicated, std::span<const std::byte> root,
                 rank_files ranks_files, const std::string& source, std::uint64_t step,
                 const load_context& context, State&... state) {
  byte_reader shared(replicated, source + " (replicated state)");
  byte_reader roots(root, source + " (rank 0's state)");
  std::vector<byte_reader> parts;
  parts.reserve(ranks_files.files.size());
  for (std::size_t i = 0; i < ranks_files.files.size(); ++i) {
    parts.emplace_back(ranks_files.files[i],
                       source + " (state of rank " +
                           std::to_string(ranks_files.first_rank + static_cast<int>(i)) + ")");
  }
  byte_reader* mine = nullptr;
  if (context.saved_ranks == context.ranks) {
    const auto at = static_cast<std::size_t>(context.rank - ranks_files.first_rank);
    if (context.rank >= ranks_files.first_rank && at < parts.size()) {
      mine = &parts[at];
    }
  }
  constexpr bool has_sharded = count_of<state_scope::sharded, State...>() > 0;
  if (has_sharded && (ranks_files.first_rank != 0 ||
                      parts.size() != static_cast<std::size_t>(context.saved_ranks))) {
    throw checkpoint_error("cohort checkpoint: " + source +
                           ": sharded state is read from every "
                           "saved rank's file, and " +
                           std::to_string(parts.size()) + " of " +
                           std::to_string(context.saved_ranks) + " were given");
  }
  detail::read_header<state_scope::replicated, State...>(shared, step);
  detail::read_header<state_scope::root, State...>(roots, step);
  for (byte_reader& part : parts) {
    detail::read_header<state_scope::per_rank, State...>(part, step);
  }
  std::size_t index = 0;
  (
      [&] {
        using traits = checkpoint_traits<std::remove_cvref_t<State>>;
        ++index;
        if constexpr (traits::scope == state_scope::sharded) {
          std::vector<byte_reader> blocks;
          blocks.reserve(parts.size());
          for (byte_reader& part : parts) {
            blocks.push_back(detail::next_block(part, index, traits::kind));
          }
          traits::load(std::span<byte_reader>(blocks), state, context);
          for (const byte_reader& block : blocks) {
            detail::require_read(block, traits::kind);
          }
        } else if constexpr (traits::scope == state_scope::per_rank) {
          // Each file's block is read (and its kind checked); this rank's own alone is loaded.
          for (byte_reader& part : parts) {
            byte_reader block = detail::next_block(part, index, traits::kind);
            if (&part == mine) {
              traits::load(block, state, context);
              detail::require_read(block, traits::kind);
            }
          }
        } else {
          byte_reader& in = traits::scope == state_scope::replicated ? shared : roots;
          byte_reader block = detail::next_block(in, index, traits::kind);
          traits::load(block, state, context);
          detail::require_read(block, traits::kind);
        }
      }(),
      ...);
  // (count_in_file in the headers: nothing is left over after the last thing of each file)
  if (shared.left() != 0) {
    shared.fail("the replicated state", "has bytes after its last thing");
  }
  if (roots.left() != 0) {
    roots.fail("rank 0's state", "has bytes after its last thing");
  }
  for (const byte_reader& part : parts) {
    if (part.left() != 0) {
      part.fail("the per-rank state", "has bytes after its last thing");
    }
  }
}

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
