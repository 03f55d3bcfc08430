// SPDX-License-Identifier: Apache-2.0
#pragma once

// PowerSGD's state in a checkpoint, in its two parts:
//
//   ckpt.save(step, params, cohort::bucket_orders(comm), cohort::powersgd_replicated(psgd),
//             cohort::powersgd_errors(psgd), ...);
//   ckpt.resume(params, cohort::bucket_orders(comm), cohort::powersgd_replicated(psgd),
//               cohort::powersgd_errors(psgd), ...);
//
// The replicated part (the options, each parameter set's step count and each compressed
// gradient's Q) is the same on every rank, and a save compares it; the per-rank part is each
// rank's error feedback, loaded only at the same number of ranks (elsewhere the errors start
// again from zero: what they held is dropped once). Restored with the bucket orders, a resumed
// run continues bit for bit. Each gradient is checked against the parameter set at the next
// step: one that does not fit is an error on every rank, naming it and both shapes.

#include <cohort/checkpoint/bytes.hpp>
#include <cohort/checkpoint/state.hpp>
#include <cohort/config.hpp>
#include <cohort/reducer/powersgd.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {

struct powersgd_replicated_ref {
  powersgd hook;
};
struct powersgd_errors_ref {
  powersgd hook;
};

//! `hook`'s replicated state (options, step counts, Q), for a checkpoint.
inline powersgd_replicated_ref powersgd_replicated(const powersgd& hook) {
  return {hook};
}
//! This rank's error feedback of `hook`, for a checkpoint.
inline powersgd_errors_ref powersgd_errors(const powersgd& hook) {
  return {hook};
}

namespace detail {

inline void save_powersgd(checkpoint::byte_writer& out, const powersgd& hook, bool errors) {
  if (!errors) {
    const powersgd_options& o = hook.options();
    out.put<std::int64_t>(o.rank);
    out.put<std::uint64_t>(o.start_step);
    out.put<double>(o.min_compression_rate);
    out.put<std::uint8_t>(o.error_feedback ? 1 : 0);
    out.put<std::uint8_t>(o.warm_start ? 1 : 0);
    out.put<double>(o.orthogonalization_epsilon);
    out.put<std::uint64_t>(o.seed);
  }
  const std::vector<powersgd_layout_record> layouts = hook.state()->records(errors);
  out.put<std::uint64_t>(layouts.size());
  for (const powersgd_layout_record& l : layouts) {
    out.put<std::uint64_t>(l.key);
    out.put<std::uint64_t>(l.steps);
    out.put<std::uint64_t>(l.slots.size());
    for (const powersgd_slot_record& s : l.slots) {
      out.put<std::uint64_t>(s.slot);
      out.put_string(s.name, "a parameter's name");
      out.put<std::uint8_t>(static_cast<std::uint8_t>(s.type));
      out.put<std::uint64_t>(s.n);
      out.put<std::uint64_t>(s.m);
      out.put<std::uint64_t>(s.r);
      out.put<std::uint8_t>(s.q_ready ? 1 : 0);
      out.put_block(errors ? s.e : s.q);
    }
  }
}

inline void load_powersgd(checkpoint::byte_reader& in, const powersgd& hook, bool errors) {
  if (!errors) {
    const powersgd_options& o = hook.options();
    const auto require = [&](std::string_view what, bool same, const std::string& saved,
                             const std::string& given) {
      if (!same) {
        in.fail(what, "was " + saved + " when saved, and is " + given + " now");
      }
    };
    const auto rank = in.get<std::int64_t>("PowerSGD's rank");
    require("PowerSGD's rank", rank == o.rank, std::to_string(rank), std::to_string(o.rank));
    const auto start = in.get<std::uint64_t>("PowerSGD's start_step");
    require("PowerSGD's start_step", start == o.start_step, std::to_string(start),
            std::to_string(o.start_step));
    const auto rate = in.get<double>("PowerSGD's min_compression_rate");
    require("PowerSGD's min_compression_rate",
            std::bit_cast<std::uint64_t>(rate) ==
                std::bit_cast<std::uint64_t>(o.min_compression_rate),
            std::to_string(rate), std::to_string(o.min_compression_rate));
    const auto feedback = in.get<std::uint8_t>("PowerSGD's error_feedback");
    require("PowerSGD's error_feedback", (feedback != 0) == o.error_feedback,
            std::to_string(feedback), std::to_string(o.error_feedback));
    const auto warm = in.get<std::uint8_t>("PowerSGD's warm_start");
    require("PowerSGD's warm_start", (warm != 0) == o.warm_start, std::to_string(warm),
            std::to_string(o.warm_start));
    const auto epsilon = in.get<double>("PowerSGD's orthogonalization_epsilon");
    require("PowerSGD's orthogonalization_epsilon",
            std::bit_cast<std::uint64_t>(epsilon) ==
                std::bit_cast<std::uint64_t>(o.orthogonalization_epsilon),
            std::to_string(epsilon), std::to_string(o.orthogonalization_epsilon));
    const auto seed = in.get<std::uint64_t>("PowerSGD's seed");
    require("PowerSGD's seed", seed == o.seed, std::to_string(seed), std::to_string(o.seed));
  }
  // Every count is checked against the bytes left before anything is allocated for it.
  const auto fits = [&](std::string_view what, std::uint64_t count, std::uint64_t each) {
    if (count > in.left() / each) {
      in.fail(what, std::to_string(count) + " does not fit in the " + std::to_string(in.left()) +
                        " bytes left");
    }
  };
  const auto layouts = in.get<std::uint64_t>("the number of parameter sets");
  fits("the number of parameter sets", layouts, 3 * sizeof(std::uint64_t));
  std::vector<powersgd_layout_record> records(static_cast<std::size_t>(layouts));
  for (powersgd_layout_record& l : records) {
    l.key = in.get<std::uint64_t>("a parameter set's key");
    l.steps = in.get<std::uint64_t>("a parameter set's step count");
    const auto slots = in.get<std::uint64_t>("the number of compressed gradients");
    fits("the number of compressed gradients", slots, 6 * sizeof(std::uint64_t));
    l.slots.resize(static_cast<std::size_t>(slots));
    for (powersgd_slot_record& s : l.slots) {
      s.slot = in.get<std::uint64_t>("a gradient's index");
      s.name = in.get_string("a parameter's name");
      const auto type = in.get<std::uint8_t>("a gradient's dtype");
      if (type != static_cast<std::uint8_t>(dtype::float32) &&
          type != static_cast<std::uint8_t>(dtype::float64)) {
        in.fail("a gradient's dtype", "is " + std::to_string(type) + ", not float32 or float64");
      }
      s.type = static_cast<dtype>(type);
      s.n = in.get<std::uint64_t>("a gradient's rows");
      s.m = in.get<std::uint64_t>("a gradient's columns");
      s.r = in.get<std::uint64_t>("a gradient's rank");
      s.compressed = true;
      s.q_ready = in.get<std::uint8_t>("whether Q is set") != 0;
      const std::span<const std::byte> block = in.get_block(errors ? "an error" : "a Q");
      const std::uint64_t width = size_of(s.type);
      // (Empty: none kept, as without error feedback; the gradient starts that part afresh.)
      const bool fits =
          errors
              ? s.m != 0 && s.n <= block.size() / width / s.m && block.size() == s.n * s.m * width
              : s.m != 0 && s.r <= block.size() / width / s.m && block.size() == s.r * s.m * width;
      const bool sized = block.empty() || (s.r <= s.n && s.r <= s.m && fits);
      if (!sized) {
        in.fail(errors ? "an error" : "a Q",
                "of parameter '" + s.name + "' holds " + std::to_string(block.size()) +
                    " bytes, which do not fit its " + std::to_string(s.n) + " x " +
                    std::to_string(s.m) + " at rank " + std::to_string(s.r));
      }
      (errors ? s.e : s.q).assign(block.begin(), block.end());
    }
  }
  hook.state()->restore(std::move(records), errors);
}

} // namespace detail

template <>
struct checkpoint_traits<powersgd_replicated_ref> {
  static constexpr state_scope scope = state_scope::replicated;
  static constexpr std::string_view kind = "PowerSGD state";
  static void save(checkpoint::byte_writer& out, const powersgd_replicated_ref& ref) {
    detail::save_powersgd(out, ref.hook, /*errors=*/false);
  }
  static void load(checkpoint::byte_reader& in, powersgd_replicated_ref& ref, const load_context&) {
    detail::load_powersgd(in, ref.hook, /*errors=*/false);
  }
};

template <>
struct checkpoint_traits<powersgd_errors_ref> {
  static constexpr state_scope scope = state_scope::per_rank;
  static constexpr std::string_view kind = "PowerSGD error feedback";
  static void save(checkpoint::byte_writer& out, const powersgd_errors_ref& ref) {
    detail::save_powersgd(out, ref.hook, /*errors=*/true);
  }
  static void load(checkpoint::byte_reader& in, powersgd_errors_ref& ref, const load_context&) {
    detail::load_powersgd(in, ref.hook, /*errors=*/true);
  }
};

} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
