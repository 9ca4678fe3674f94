/**
 * @file plan.hpp
 * @brief Host-side sizing of a device pack: sample size, guessed sample ranks, candidate and
 * resolve-buffer capacity, and the carving of one workspace buffer into the pack's temporaries.
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
  std::size_t sample = 0;        ///< sampled keys, at most max_samples; 0: default_samples
  std::size_t capacity = 0;      ///< candidate slots; 0: automatic
  double margin = 4.0;           ///< half-width of the guessed range, in standard deviations
  bool force_fallback = false;   ///< ignore the guess: exact radix select over x
  void* ctl_copy = nullptr;      ///< tests: device memory that receives the final control block
  unsigned* launches = nullptr;  ///< tests, benchmarks: receives the launches of the pack
  staging_mode staging = staging_mode::automatic;
  std::size_t stage_capacity = 0;  ///< staged values; 0: automatic
};

/// Keys the sample step sorts: 8192 (4096 of 8-byte keys), what one block's shared memory holds
/// on the fast path.
template <class Key>
inline constexpr std::size_t max_samples = sizeof(Key) <= 4 ? 8192 : 4096;

/**
 * Keys the sample step takes by default: every key up to max_samples, else n / 512 within
 * [2048, max_samples]. The one-CTA sample step costs about its key count (at n = 2^20 on an H200,
 * 8192 keys took half of a 100 us pack); fewer keys widen the guessed range, which costs the
 * count step little while x is small.
 */
template <class Key>
[[nodiscard]] constexpr std::size_t default_samples(std::size_t n) noexcept {
  if (n <= max_samples<Key>) return n;
  return std::clamp<std::size_t>(n / 512, std::min<std::size_t>(2048, max_samples<Key>),
                                 max_samples<Key>);
}

/// What the host decides before any work: all of it follows from n, k and the tuning.
struct select_plan {
  std::size_t samples = 0;
  long long hi_rank = 0;  ///< rank of hi in the descending sample (< 0: the largest key)
  long long lo_rank = 0;  ///< rank of lo (>= samples: key 0)
  unsigned parts = 1;
  std::size_t part_cap = 1;
  std::size_t capacity = 1;   ///< parts * part_cap candidate slots
  std::size_t small_cap = 1;  ///< slots of the resolve buffer (one bucket's keys)
  std::size_t stage_cap = 0;  ///< staged values; 0: none
};

template <class Key>
[[nodiscard]] select_plan plan_select(std::size_t n, std::size_t k, std::size_t blocks,
                                      const select_tuning& t) {
  select_plan p;
  p.samples = t.sample != 0 ? std::min({n, t.sample, max_samples<Key>}) : default_samples<Key>(n);
  std::size_t capacity = 0;
  const guessed_ranks g = guess_ranks(n, k, p.samples, t.margin);
  p.hi_rank = g.hi_rank;
  p.lo_rank = g.lo_rank;
  if (p.samples != n)
    capacity =
        std::min(n, static_cast<std::size_t>(2 * expected_candidates(n, p.samples, g)) + 4096);
  if (t.capacity != 0) capacity = std::min(n, t.capacity);
  p.parts =
      static_cast<unsigned>(std::min<std::size_t>(max_parts, std::max<std::size_t>(1, blocks)));
  p.part_cap = std::max<std::size_t>(1, (capacity + p.parts - 1) / p.parts);
  p.capacity = p.parts * p.part_cap;
  p.small_cap = std::min(p.capacity, max_samples<Key>);
  // The stage: every key at or above lo, about k + the candidates.
  const bool exact = p.samples == n;
  const double staged = static_cast<double>(k) + (exact ? 0.0 : static_cast<double>(capacity) / 2);
  const bool stage =
      t.staging == staging_mode::always || (t.staging == staging_mode::automatic &&
                                            staged <= max_staged_fraction * static_cast<double>(n));
  if (stage) {
    p.stage_cap = t.stage_capacity != 0
                      ? std::min(n, t.stage_capacity)
                      : std::min(n, static_cast<std::size_t>(1.1 * staged) + 4096);
  }
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
template <class Key, class T>
struct pack_temps {
  select_ctl<Key>* ctl;
  unsigned long long* hist;  ///< the candidate buckets, then the radix bins
  lookback_cell* cells;
  Key* sample;
  Key* cand_key;
  std::uint32_t* cand_index;
  Key* small;
  T* stage;                 ///< null when the plan stages nothing
  std::uint32_t* stage_at;  ///< per block: its first staged value, or not_staged
  std::uint32_t* ge_words;  ///< per word: which elements have a key >= lo (were staged)

  static pack_temps carve(carver& c, std::size_t n, std::size_t blocks, const select_plan& p) {
    pack_temps t;
    t.ctl = c.take<select_ctl<Key>>(1);
    t.hist = c.take<unsigned long long>(histogram_bins);
    t.cells = c.take<lookback_cell>(blocks);
    t.sample = c.take<Key>(p.samples);
    t.cand_key = c.take<Key>(p.capacity);
    t.cand_index = c.take<std::uint32_t>(p.capacity);
    t.small = c.take<Key>(p.small_cap);
    const bool stage = p.stage_cap != 0;
    t.stage = stage ? c.take<T>(p.stage_cap) : nullptr;
    t.stage_at = stage ? c.take<std::uint32_t>(blocks) : nullptr;
    t.ge_words = stage ? c.take<std::uint32_t>((n + word_elements - 1) / word_elements) : nullptr;
    return t;
  }
};

}  // namespace dropit::detail::dev
