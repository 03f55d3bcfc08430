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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace checkpoint {

//! How many of `State` are of `Scope`.
template <state_scope Scope, class... State>
constexpr std::uint64_t count_of() {
  return ((checkpoint_traits<std::remove_cvref_t<State>>::scope == Scope ? 1 : 0) + ... + 0);
}

//! The header that opens the bytes of `scope`.
constexpr std::string_view magic_of(state_scope scope) {
  return scope == state_scope::replicated ? "cohort replicated state"
         : scope == state_scope::root     ? "cohort root state"
                                          : "cohort per-rank state";
}

//! The things of `state` that are of `Scope`, as bytes (large blocks borrowed from the state:
//! see byte_writer).
template <state_scope Scope, class... State>
byte_writer serialize(std::uint64_t step, const State&... state) {
  byte_writer out;
  out.put_string(magic_of(Scope));
  out.put<std::uint64_t>(step);
  out.put<std::uint64_t>(count_of<Scope, State...>());
  (
      [&] {
        using traits = checkpoint_traits<std::remove_cvref_t<State>>;
        if constexpr (traits::scope == Scope) {
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
  if (saved != count_of<Scope, State...>()) {
    in.fail("the state", "holds " + std::to_string(saved) + " things, resume was given " +
                             std::to_string(count_of<Scope, State...>()));
  }
}
} // namespace detail

//! Loads `state` from the bytes `serialize` wrote: the replicated things from `replicated`,
//! rank 0's from `root`, this rank's own from `own` (if there is none, as when the number of
//! ranks changed, they keep their values). `source` names the bytes in errors. Throws
//! `checkpoint_error`.
template <class... State>
void deserialize(std::span<const std::byte> replicated, std::span<const std::byte> root,
                 std::optional<std::span<const std::byte>> own, const std::string& source,
                 std::uint64_t step, const load_context& context, State&... state) {
  byte_reader shared(replicated, source + " (replicated state)");
  byte_reader roots(root, source + " (rank 0's state)");
  std::optional<byte_reader> mine;
  if (own) {
    mine.emplace(*own, source + " (state of rank " + std::to_string(context.rank) + ")");
  }
  detail::read_header<state_scope::replicated, State...>(shared, step);
  detail::read_header<state_scope::root, State...>(roots, step);
  if (mine) {
    detail::read_header<state_scope::per_rank, State...>(*mine, step);
  }
  std::size_t index = 0;
  (
      [&] {
        using traits = checkpoint_traits<std::remove_cvref_t<State>>;
        ++index;
        byte_reader* in = traits::scope == state_scope::replicated ? &shared
                          : traits::scope == state_scope::root     ? &roots
                          : mine                                   ? &*mine
                                                                   : nullptr;
        if (in == nullptr) {
          return;
        }
        const std::string kind = in->get_string("the kind of thing " + std::to_string(index));
        if (kind != traits::kind) {
          in->fail("thing " + std::to_string(index),
                   "was saved as a " + kind + ", resume was given a " + std::string(traits::kind));
        }
        byte_reader block(in->get_block("a " + kind), in->source() + ", " + kind);
        traits::load(block, state, context);
        if (block.left() != 0) {
          block.fail("the " + kind, "left " + std::to_string(block.left()) + " bytes unread");
        }
      }(),
      ...);
  // (count_of in the headers: nothing is left over after the last thing of each scope)
  if (shared.left() != 0) {
    shared.fail("the replicated state", "has bytes after its last thing");
  }
  if (roots.left() != 0) {
    roots.fail("rank 0's state", "has bytes after its last thing");
  }
  if (mine && mine->left() != 0) {
    mine->fail("the per-rank state", "has bytes after its last thing");
  }
}

} // namespace checkpoint
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
