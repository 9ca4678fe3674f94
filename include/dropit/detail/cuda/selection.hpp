/**
 * @file selection.hpp
 * @brief The device selection: its control block (which lives in device memory and advances on
 * the device, so no count travels to the host) and the per-item bodies of every step, shared by
 * the portable Thrust path and the nvcc fast kernels.
 *
 * The plan for keeping the k largest keys of x, 0 < k < n:
 * 1. guess: sort a sample of keys, take a key range [lo, hi] that holds the k-th largest key with
 *    high probability (exact when the sample is all of x: lo == hi == the k-th key);
 * 2. count (one read of x): per block of 1024, the keys above hi and the keys in [lo, hi]; keys in
 *    the range are copied to a candidate buffer (key, index), split in partitions;
 * 3. decide: if the range holds the k-th key, resolve it from the candidates (`cand`: radix select
 *    over the candidate keys, then over the tie indices) or, when lo == hi, from the per-block
 *    counts alone (`ties`); otherwise (`fallback`) radix-select the exact key over all of x and
 *    count again with lo == hi == that key;
 * 4. kept count per block, exclusive scan, then mark + compact (the second read of x).
 */
#pragma once

#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>

#include <cuda/atomic>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>

namespace dropit::detail::dev {

/// Counter partitions of the candidate buffer (spreads the atomics that reserve slots).
inline constexpr unsigned max_parts = 64;
/// Bins of one radix pass.
inline constexpr unsigned radix_bins = 1u << radix_bits;

/// Relaxed device-scope atomic add; returns the old value.
template <class U>
DROPIT_HD U atomic_add(U* p, U v) noexcept {
  return ::cuda::atomic_ref<U, ::cuda::thread_scope_device>(*p).fetch_add(
      v, ::cuda::std::memory_order_relaxed);
}
/// Relaxed device-scope load (not served from a stale L1 line).
template <class U>
DROPIT_HD U atomic_load(U* p) noexcept {
  return ::cuda::atomic_ref<U, ::cuda::thread_scope_device>(*p).load(
      ::cuda::std::memory_order_relaxed);
}

/// Radix passes over keys of type K.
template <class K>
inline constexpr int radix_passes = (static_cast<int>(sizeof(K)) * 8 + radix_bits - 1) / radix_bits;

enum select_mode : int {
  mode_count = 0,  ///< the count pass is due
  mode_cand,       ///< resolve from the candidate buffer
  mode_ties,       ///< lo == hi: resolve from the per-block counts
  mode_fallback,   ///< exact radix select over x
  mode_recount     ///< count again with the exact key
};

/// The selection's state, in device memory.
template <class Key>
struct select_ctl {
  std::size_t n;
  std::size_t k;
  Key lo;
  Key hi;
  bool forced;     ///< tests: skip the guess, take the fallback
  bool fell_back;  ///< the guess missed and the fallback ran
  int mode;
  unsigned parts;
  std::size_t part_cap;
  unsigned long long above_total;   ///< keys > hi
  unsigned long long within_total;  ///< keys in [lo, hi]
  unsigned long long part_count[max_parts];
  radix_state<Key> state;                ///< fallback over x, or cand over the candidates
  radix_state<std::uint32_t> tie_state;  ///< cand: select over ~index among the ties
  bool tie_cut;
  threshold<Key> th;           ///< the result
  std::size_t ties_kept;       ///< ties: keys equal to th.t that are kept
  std::size_t cut_block;       ///< ties: the block of the last kept tie
  std::size_t cut_block_ties;  ///< ties: kept ties in that block
  unsigned done;               ///< fast kernels: CTAs finished (last-CTA pattern)

  DROPIT_HD select_ctl(std::size_t n_, std::size_t k_, unsigned parts_,
                       std::size_t part_cap_) noexcept
      : n(n_),
        k(k_),
        lo{},
        hi{},
        forced(false),
        fell_back(false),
        mode(mode_count),
        parts(parts_),
        part_cap(part_cap_),
        above_total(0),
        within_total(0),
        part_count{},
        state(k_),
        tie_state(1),
        tie_cut(false),
        th{},
        ties_kept(0),
        cut_block(0),
        cut_block_ties(0),
        done(0) {}

  [[nodiscard]] DROPIT_HD bool counting() const noexcept {
    return mode == mode_count || mode == mode_recount;
  }
  /// Whether the count pass copies candidates (lo == hi needs none).
  [[nodiscard]] DROPIT_HD bool collecting() const noexcept { return lo != hi; }

  /// After a count pass with `above` keys > hi and `within` keys in [lo, hi]; `fits` says no
  /// candidate partition overflowed.
  DROPIT_HD void decide(unsigned long long above, unsigned long long within, bool fits) noexcept {
    if (!forced && above < k && k <= above + within) {
      if (lo == hi) {
        mode = mode_ties;
        th.t = lo;
        ties_kept = static_cast<std::size_t>(k - above);
        return;
      }
      if (fits) {
        mode = mode_cand;
        state = radix_state<Key>(static_cast<std::size_t>(k - above));
        return;
      }
    }
    mode = mode_fallback;
    state = radix_state<Key>(k);
  }

  /// After the fallback's last pass: count again, with the exact key as the range.
  DROPIT_HD void finish_fallback() noexcept {
    lo = hi = state.prefix;
    forced = false;
    fell_back = true;
    above_total = within_total = 0;
    for (unsigned p = 0; p < max_parts; ++p)
      part_count[p] = 0;
    mode = mode_recount;
  }

  /// After the candidates' last pass: the threshold key; whether the ties need an index cut.
  DROPIT_HD void finish_candidates() noexcept {
    th.t = state.prefix;
    th.cut = n;
    tie_cut = state.rank < state.in_bucket;
    if (tie_cut) tie_state = radix_state<std::uint32_t>(state.rank);
  }

  /// After the tie passes: tie_state.prefix is the complement of the last kept tie's index.
  DROPIT_HD void finish_tie_cut() noexcept {
    th.cut = static_cast<std::size_t>(static_cast<std::uint32_t>(~tie_state.prefix)) + 1;
  }

  /// Whether candidate slot j holds a candidate.
  [[nodiscard]] DROPIT_HD bool valid(std::size_t j) const noexcept {
    const std::size_t p = j / part_cap;
    return p < parts && j - p * part_cap < part_count[p];
  }
};

/// The first block whose inclusive prefix of ties reaches r (1 <= r <= prefix[blocks - 1]).
[[nodiscard]] DROPIT_HD inline std::size_t block_reaching(const std::uint32_t* prefix,
                                                          std::size_t blocks,
                                                          std::size_t r) noexcept {
  std::size_t lo = 0, hi = blocks - 1;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (prefix[mid] >= r) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// ---- sources of radix passes -------------------------------------------------------------

/// The keys of x: the fallback's exact select.
template <class P, class T, class Key>
struct x_keys {
  using key_type = Key;
  P policy;
  const T* x;
  std::size_t n;

  [[nodiscard]] DROPIT_HD static bool active(const select_ctl<Key>& c) noexcept {
    return c.mode == mode_fallback;
  }
  [[nodiscard]] DROPIT_HD static radix_state<Key>& state(select_ctl<Key>& c) noexcept {
    return c.state;
  }
  DROPIT_HD static void finish(select_ctl<Key>& c) noexcept { c.finish_fallback(); }
  [[nodiscard]] DROPIT_HD std::size_t items() const noexcept { return n; }
  DROPIT_HD bool get(const select_ctl<Key>&, std::size_t i, Key& key) const noexcept {
    key = policy.key(x[i], i);
    return true;
  }
};

/// The candidate keys.
template <class Key>
struct candidate_keys {
  using key_type = Key;
  const Key* keys;
  std::size_t slots;

  [[nodiscard]] DROPIT_HD static bool active(const select_ctl<Key>& c) noexcept {
    return c.mode == mode_cand;
  }
  [[nodiscard]] DROPIT_HD static radix_state<Key>& state(select_ctl<Key>& c) noexcept {
    return c.state;
  }
  DROPIT_HD static void finish(select_ctl<Key>& c) noexcept { c.finish_candidates(); }
  [[nodiscard]] DROPIT_HD std::size_t items() const noexcept { return slots; }
  DROPIT_HD bool get(const select_ctl<Key>& c, std::size_t j, Key& key) const noexcept {
    if (!c.valid(j)) return false;
    key = keys[j];
    return true;
  }
};

/// The complemented indices of the candidates equal to the threshold key: the largest is the
/// lowest index, so a radix select for rank r finds the r-th lowest-indexed tie.
template <class Key>
struct tie_indices {
  using key_type = std::uint32_t;
  const Key* keys;
  const std::uint32_t* index;
  std::size_t slots;

  [[nodiscard]] DROPIT_HD static bool active(const select_ctl<Key>& c) noexcept {
    return c.mode == mode_cand && c.tie_cut;
  }
  [[nodiscard]] DROPIT_HD static radix_state<std::uint32_t>& state(select_ctl<Key>& c) noexcept {
    return c.tie_state;
  }
  DROPIT_HD static void finish(select_ctl<Key>& c) noexcept { c.finish_tie_cut(); }
  [[nodiscard]] DROPIT_HD std::size_t items() const noexcept { return slots; }
  DROPIT_HD bool get(const select_ctl<Key>& c, std::size_t j, std::uint32_t& key) const noexcept {
    if (!c.valid(j) || keys[j] != c.th.t) return false;
    key = ~index[j];
    return true;
  }
};

}  // namespace dropit::detail::dev
