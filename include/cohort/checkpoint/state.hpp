// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a checkpoint holds: a list of things, each through the customization point
// `checkpoint_traits<T>`, which says whose the thing is (`state_scope`: the same on every rank
// and written once, split across the ranks; rank 0's, written by rank 0; or each rank's own),
// what kind of thing it is (named in errors), and how it is written and read back. Given here:
// parameter sets (their values), the standard random engines (per rank), `data_position` (the
// epoch and the step within it), and any value Boost.Serialization can write, through
// `serialized(value)` (replicated) or `serialized_per_rank(value)`.

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/config.hpp>
#include <cohort/error.hpp>
#include <cohort/tensor/dtype.hpp>
#include <cohort/tensor/parameter.hpp>
#include <cohort/tensor/tensor_view.hpp>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/iostreams/device/array.hpp>
#include <boost/iostreams/device/back_inserter.hpp>
#include <boost/iostreams/stream.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

//! Whose a thing is, and so who writes it.
enum class state_scope {
  //! The same on every rank, byte for byte (parameters): written once, split in one part per
  //! rank, each rank writing its part; the ranks' bytes are compared by checksum at every save.
  replicated,
  //! The same on every rank in meaning but not in bytes (LibTorch's optimizer state, keyed by
  //! tensor addresses): rank 0's is written, by rank 0 alone, and every rank reads it.
  root,
  //! Each rank's own (random engines): written by each rank, read by the same rank.
  per_rank,
  //! Each rank's part of a whole, by name (a sharded optimizer's state): written by each rank
  //! beside its own things, and read by every rank from every part saved, so that a rank takes
  //! what it owns now, at any number of ranks.
  sharded
};

//! What a loader knows of the checkpoint it reads from.
struct load_context {
  int saved_ranks = 1; //!< the number of ranks that wrote it
  int ranks = 1;       //!< the number of ranks reading it
  int rank = 0;        //!< this rank
};

//! The customization point: a specialization for T has
//! - `static constexpr state_scope scope`;
//! - `static constexpr std::string_view kind` (named in errors: "parameters", "random engine");
//! - `static void save(checkpoint::byte_writer&, const T&)`;
//! - `static void load(checkpoint::byte_reader&, T&, const load_context&)`, which throws
//!   `checkpoint_error` (through the reader) naming what does not fit; for a `sharded` thing,
//!   `static void load(std::span<checkpoint::byte_reader> parts, T&, const load_context&)`
//!   instead: `parts[r]` holds what saved rank r wrote, and each is to be read to its end.
//! Per-rank things are loaded only when the number of ranks is the one that saved them;
//! otherwise they keep their value (see checkpointer::resume).
template <class T>
struct checkpoint_traits;

namespace checkpoint::detail {
template <class T>
concept loads_one = requires(byte_reader& in, T& thing, const load_context& context) {
  checkpoint_traits<T>::load(in, thing, context);
};
template <class T>
concept loads_parts = requires(std::span<byte_reader> parts, T& thing,
                               const load_context& context) {
  checkpoint_traits<T>::load(parts, thing, context);
};
} // namespace checkpoint::detail

namespace checkpoint::detail {
// Tensors are checkpointed from host memory; `what` names the tensor in the error.
inline void require_host(const const_tensor_view& v, const std::string& what) {
  if (v.location != memory_location::host) {
    throw invalid_argument("cohort checkpoint: " + what +
                           " is in device memory; checkpoint a host copy of it");
  }
}
// The value of the parameter `p` (named `what`), to be written into: a host tensor.
template <class P>
tensor_view host_value(P& p, const std::string& what) {
  const tensor_view v = make_view(parameter_traits<std::remove_cvref_t<P>>::value(p), what);
  require_host(v, what);
  return v;
}
} // namespace checkpoint::detail

//! A thing with a `checkpoint_traits` specialization.
template <class T>
concept checkpointable = requires(checkpoint::byte_writer& out, const T& thing) {
  { checkpoint_traits<T>::scope } -> std::convertible_to<state_scope>;
  { checkpoint_traits<T>::kind } -> std::convertible_to<std::string_view>;
  checkpoint_traits<T>::save(out, thing);
}
&&(checkpoint_traits<T>::scope == state_scope::sharded ? checkpoint::detail::loads_parts<T>
                                                       : checkpoint::detail::loads_one<T>);

//! A parameter set's values (not its gradients): each parameter by name, dtype and size, all
//! checked on load against the set given, in host memory.
template <parameter_set Params>
struct checkpoint_traits<Params> {
  static constexpr state_scope scope = state_scope::replicated;
  static constexpr std::string_view kind = "parameters";

  static void save(checkpoint::byte_writer& out, const Params& params) {
    out.put<std::uint64_t>(static_cast<std::uint64_t>(std::ranges::distance(params)));
    for (const auto& p : params) {
      const std::string name(parameter_name(p));
      const const_tensor_view v = host_view(p, name);
      out.put_string(name, "a parameter's name");
      out.put<std::uint8_t>(static_cast<std::uint8_t>(v.type));
      out.put_block_borrowed({static_cast<const std::byte*>(v.data), v.size_bytes()});
    }
  }

  static void load(checkpoint::byte_reader& in, Params& params, const load_context&) {
    const auto saved = in.get<std::uint64_t>("the number of parameters");
    const auto given = static_cast<std::uint64_t>(std::ranges::distance(params));
    if (saved != given) {
      in.fail("the parameter set", "has " + std::to_string(saved) + " parameters, the one given " +
                                       std::to_string(given));
    }
    for (auto& p : params) {
      const std::string name(parameter_name(p));
      const std::string saved_name = in.get_string("a parameter's name");
      if (saved_name != name) {
        in.fail("parameter '" + saved_name + "'", "stands where the set given has '" + name + "'");
      }
      const tensor_view v = checkpoint::detail::host_value(p, "parameter '" + name + "'");
      const auto type = in.get<std::uint8_t>("the dtype of '" + name + "'");
      if (type != static_cast<std::uint8_t>(v.type)) {
        in.fail("parameter '" + name + "'", "was saved as dtype " + std::to_string(type) +
                                                ", the one given is " +
                                                std::string(to_string(v.type)));
      }
      const std::span<const std::byte> bytes = in.get_block("the values of '" + name + "'");
      if (bytes.size() != v.size_bytes()) {
        in.fail("parameter '" + name + "'", "was saved with " + std::to_string(bytes.size()) +
                                                " bytes, the one given has " +
                                                std::to_string(v.size_bytes()));
      }
      if (!bytes.empty()) {
        std::memcpy(v.data, bytes.data(), bytes.size());
      }
    }
  }

private:
  template <class P>
  static std::string_view parameter_name(const P& p) {
    return parameter_traits<std::remove_cvref_t<P>>::name(p);
  }
  template <class P>
  static const_tensor_view host_view(const P& p, const std::string& name) {
    const const_tensor_view v = make_const_view(parameter_traits<std::remove_cvref_t<P>>::value(p),
                                                "parameter '" + name + "'");
    checkpoint::detail::require_host(v, "parameter '" + name + "'");
    return v;
  }
};

//! A standard random engine (anything with the standard's text form: `os << e`, `is >> e`),
//! each rank's own.
template <class Engine>
requires std::uniform_random_bit_generator<Engine> &&
    requires(std::ostream& os, std::istream& is, Engine& e) {
  os << e;
  is >> e;
}
struct checkpoint_traits<Engine> {
  // mt19937_64's state is 6.6 KB of text; a megabyte is far more than any engine's.
  static constexpr std::uint64_t random_engine_state_bytes = 1 << 20;
  static constexpr state_scope scope = state_scope::per_rank;
  static constexpr std::string_view kind = "random engine";
  static void save(checkpoint::byte_writer& out, const Engine& engine) {
    std::ostringstream text;
    text << engine;
    out.put_string(text.str(), "a random engine's state", random_engine_state_bytes);
  }
  static void load(checkpoint::byte_reader& in, Engine& engine, const load_context&) {
    std::istringstream text(in.get_string("a random engine's state", random_engine_state_bytes));
    Engine read;
    text >> read;
    if (text.fail()) {
      in.fail("a random engine's state", "is not the text of this engine's type");
    }
    engine = read;
  }
};

//! Where a trainer is in its data: the epoch and the steps done in it, the same on every rank.
//! Resumed on another number of ranks the shards differ, so the epoch restarts (step 0) and the
//! trainer re-scatters the data with the same seed.
struct data_position {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0; //!< steps done in this epoch
  friend bool operator==(const data_position&, const data_position&) = default;
};

template <>
struct checkpoint_traits<data_position> {
  static constexpr state_scope scope = state_scope::replicated;
  static constexpr std::string_view kind = "data position";
  static void save(checkpoint::byte_writer& out, const data_position& p) {
    out.put(p.epoch);
    out.put(p.step);
  }
  static void load(checkpoint::byte_reader& in, data_position& p, const load_context& context) {
    p.epoch = in.get<std::uint64_t>("the epoch");
    p.step = in.get<std::uint64_t>("the step in the epoch");
    if (context.saved_ranks != context.ranks) {
      p.step = 0;
    }
  }
};

//! A value Boost.Serialization writes, by reference; see `serialized`.
template <class T, state_scope Scope>
struct serialized_ref {
  T* value;
};

//! `value` written with Boost.Serialization's binary archive, the same on every rank.
template <class T>
serialized_ref<T, state_scope::replicated> serialized(T& value) {
  return {&value};
}
//! `value` written with Boost.Serialization's binary archive, each rank's own.
template <class T>
serialized_ref<T, state_scope::per_rank> serialized_per_rank(T& value) {
  return {&value};
}

template <class T, state_scope Scope>
struct checkpoint_traits<serialized_ref<T, Scope>> {
  static constexpr state_scope scope = Scope;
  static constexpr std::string_view kind = "serialized value";
  static void save(checkpoint::byte_writer& out, const serialized_ref<T, Scope>& ref) {
    std::vector<char> archive;
    {
      boost::iostreams::stream<boost::iostreams::back_insert_device<std::vector<char>>> stream(
          archive);
      boost::archive::binary_oarchive oa(stream, boost::archive::no_header);
      oa << *ref.value;
    }
    out.put_block(std::as_bytes(std::span(archive)));
  }
  static void load(checkpoint::byte_reader& in, serialized_ref<T, Scope>& ref,
                   const load_context&) {
    const std::span<const std::byte> bytes = in.get_block("a serialized value");
    try {
      boost::iostreams::stream<boost::iostreams::array_source> stream(
          reinterpret_cast<const char*>(bytes.data()), bytes.size());
      boost::archive::binary_iarchive ia(stream, boost::archive::no_header);
      T read;
      ia >> read;
      *ref.value = std::move(read);
    } catch (const std::exception& e) {
      in.fail("a serialized value", std::string("does not read back: ") + e.what());
    }
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
