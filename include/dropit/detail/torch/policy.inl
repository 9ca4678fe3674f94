// Implementation of dropit::torch::policy (torch/policy.hpp).
#pragma once

#include <dropit/error.hpp>
#include <dropit/policy.hpp>

#include <atomic>

namespace dropit::torch {

inline void policy::validate() const {
  if (kind == policy_kind::mink || kind == policy_kind::random) {
    dropit::detail::check_gamma(kind == policy_kind::mink ? "MinK" : "Random", gamma);
  }
}

inline policy policy::parse(std::string_view kind, double gamma, std::uint64_t seed) {
  policy p;
  p.gamma = gamma;
  p.seed = seed;
  if (kind == "none") {
    p.kind = policy_kind::none;
  } else if (kind == "identity") {
    p.kind = policy_kind::identity;
  } else if (kind == "mink") {
    p.kind = policy_kind::mink;
  } else if (kind == "random") {
    p.kind = policy_kind::random;
  } else {
    dropit::detail::throw_error("policy: unknown kind '", kind,
                                "' (expected none, identity, mink or random)");
  }
  p.validate();
  return p;
}

inline std::string to_string(policy_kind kind) {
  switch (kind) {
    case policy_kind::none:
      return "none";
    case policy_kind::identity:
      return "identity";
    case policy_kind::mink:
      return "mink";
    case policy_kind::random:
      return "random";
  }
  return "?";
}

inline value_codec parse_codec(std::string_view name) {
  if (name == "exact") return value_codec::exact;
  if (name == "int8") return value_codec::int8;
  if (name == "fp8") return value_codec::fp8_e4m3;
  dropit::detail::throw_error("policy: unknown codec '", name, "' (expected exact, int8 or fp8)");
}

inline std::string to_string(value_codec codec) {
  switch (codec) {
    case value_codec::exact:
      return "exact";
    case value_codec::int8:
      return "int8";
    case value_codec::fp8_e4m3:
      return "fp8";
  }
  return "?";
}

inline position_choice parse_positions(std::string_view name) {
  if (name == "smallest") return position_choice::smallest;
  if (name == "no_elias_fano") return position_choice::no_elias_fano;
  dropit::detail::throw_error("policy: unknown position choice '", name,
                              "' (expected smallest or no_elias_fano)");
}

inline std::string to_string(position_choice positions) {
  return positions == position_choice::smallest ? "smallest" : "no_elias_fano";
}

namespace detail {

/// Live bytes of dropit's saved tensors, by kind.
struct saved_counters {
  std::atomic<std::size_t> sparse{0};
  std::atomic<std::size_t> masks{0};
  std::atomic<std::size_t> chunk{std::size_t{1} << 20};
};

inline saved_counters& counters() noexcept {
  static saved_counters c;
  return c;
}

}  // namespace detail

inline saved_bytes live_saved_bytes() noexcept {
  return {detail::counters().sparse.load(std::memory_order_relaxed),
          detail::counters().masks.load(std::memory_order_relaxed)};
}

inline void set_chunk_bytes(std::size_t bytes) noexcept {
  detail::counters().chunk.store(bytes, std::memory_order_relaxed);
}

inline std::size_t chunk_bytes() noexcept {
  return detail::counters().chunk.load(std::memory_order_relaxed);
}

}  // namespace dropit::torch
