/**
 * @file plan.hpp
 * @brief Host-side sizing of a device pack: sample size, guessed sample ranks, candidate
 * capacity, and the carving of one workspace buffer into the pack's temporaries.
 */
#pragma once

#include <dropit/detail/cuda/selection.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace dropit::detail::dev {

/// Knobs of the device selection; the defaults are what the executor uses. Tests turn them to
/// reach every way the selection resolves.
struct select_tuning {
  std::size_t sample = 0;       ///< sampled keys; 0: automatic (all of x up to 2^16)
  std::size_t capacity = 0;     ///< candidate slots; 0: automatic
  double margin = 4.0;          ///< half-width of the guessed range, in standard deviations
  bool force_fallback = false;  ///< ignore the guess: exact radix select over x
  void* ctl_copy = nullptr;     ///< tests: device memory that receives the final control block
};

/// What the host decides before any work: all of it follows from n, k and the tuning.
struct select_plan {
  std::size_t samples = 0;
  long long hi_rank = 0;  ///< rank of hi in the descending sample (< 0: the largest key)
  long long lo_rank = 0;  ///< rank of lo (>= samples: key 0)
  unsigned parts = 1;
  std::size_t part_cap = 1;
  std::size_t capacity = 1;  ///< parts * part_cap candidate slots
};

[[nodiscard]] inline select_plan plan_select(std::size_t n, std::size_t k, std::size_t blocks,
                                             const select_tuning& t) {
  select_plan p;
  const std::size_t automatic = n <= (std::size_t{1} << 16)  ? n
                                : n < (std::size_t{1} << 22) ? std::size_t{1} << 16
                                                             : std::size_t{1} << 18;
  p.samples = std::min(n, t.sample != 0 ? t.sample : automatic);
  std::size_t capacity = 0;
  if (p.samples == n) {
    p.hi_rank = p.lo_rank = static_cast<long long>(k) - 1;  // exact: lo == hi == the k-th key
  } else {
    const double s = static_cast<double>(p.samples);
    const double q = static_cast<double>(k) / static_cast<double>(n);
    const auto margin =
        static_cast<long long>(std::ceil(t.margin * std::sqrt(s * q * (1 - q)))) + 1;
    const auto rank = static_cast<long long>(std::ceil(q * s)) - 1;
    p.hi_rank = rank - margin;
    p.lo_rank = rank + margin;
    const double expected = static_cast<double>(n) * static_cast<double>(2 * margin + 1) / s;
    capacity = std::min(n, static_cast<std::size_t>(2 * expected) + 4096);
  }
  if (t.capacity != 0) capacity = std::min(n, t.capacity);
  p.parts =
      static_cast<unsigned>(std::min<std::size_t>(max_parts, std::max<std::size_t>(1, blocks)));
  p.part_cap = std::max<std::size_t>(1, (capacity + p.parts - 1) / p.parts);
  p.capacity = p.parts * p.part_cap;
  return p;
}

/// Hands out 256-byte aligned pieces of one buffer; with a null base it only measures.
class carver {
 public:
  explicit carver(std::byte* base) noexcept : base_(base) {}
  template <class U>
  [[nodiscard]] U* take(std::size_t count) noexcept {
    used_ = (used_ + 255) / 256 * 256;
    U* p = base_ == nullptr ? nullptr : reinterpret_cast<U*>(base_ + used_);
    used_ += count * sizeof(U);
    return p;
  }
  [[nodiscard]] std::size_t used() const noexcept { return used_; }

 private:
  std::byte* base_;
  std::size_t used_ = 0;
};

/// The temporaries of one pack.
template <class Key>
struct pack_temps {
  select_ctl<Key>* ctl;
  unsigned long long* hist;
  std::uint32_t* above;
  std::uint32_t* within;
  std::uint32_t* within_prefix;
  std::uint32_t* kept;
  std::uint32_t* block_start;  ///< index-list encoding only (the bitmask's go to the payload)
  Key* sample;
  Key* cand_key;
  std::uint32_t* cand_index;

  static pack_temps carve(carver& c, std::size_t blocks, const select_plan& p, bool index_list) {
    pack_temps t;
    t.ctl = c.take<select_ctl<Key>>(1);
    t.hist = c.take<unsigned long long>(radix_bins);
    t.above = c.take<std::uint32_t>(blocks);
    t.within = c.take<std::uint32_t>(blocks);
    t.within_prefix = c.take<std::uint32_t>(blocks);
    t.kept = c.take<std::uint32_t>(blocks);
    t.block_start = index_list ? c.take<std::uint32_t>(blocks) : nullptr;
    t.sample = c.take<Key>(p.samples);
    t.cand_key = c.take<Key>(p.capacity);
    t.cand_index = c.take<std::uint32_t>(p.capacity);
    return t;
  }
};

}  // namespace dropit::detail::dev
