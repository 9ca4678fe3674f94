/**
 * @file selection.hpp
 * @brief The selection of the k largest keys (0 < k < n), ties lowest index first, written once
 * for every executor: the step sequence (`run_selection`), the state it advances
 * (`select_state`: every decision between steps) and the serial parts of the steps.
 *
 * A pack is a fixed sequence of steps; a step that is not due does nothing:
 * 1. sample: S keys at fixed positions; two of their order statistics, lo <= hi, bracket the
 *    k-th largest key with high probability (`guess_ranks`; exact when S = n: lo == hi);
 * 2. count, one read of x: keys above hi and in [lo, hi]; keys in the range are collected as
 *    candidates and counted into a bucket histogram over [lo, hi]; `select_state::decide` then
 *    picks the next step:
 *    - lo == hi holds the k-th key: the threshold is lo (`path_single_key`); so does a bucket
 *      of one key value (16-bit keys, many ties) too full for the resolve buffer;
 *    - the range holds it and its bucket fits the resolve buffer: `mode_resolve`;
 *    - otherwise (a miss, a candidate overflow, a forced fallback): `mode_fallback`;
 * 3. fallback only: one radix pass over x per key digit (`select_state::advance_radix`);
 * 4. resolve only: the k-th key among the bucket's candidates (`select_state::resolve_bucket`);
 * 5. compact: with the threshold t and `ties_kept` (keys equal to t that are kept, the
 *    lowest-indexed ones), write the kept values and their positions.
 * An executor is a backend of `run_selection`: the host runs each step on its worker pool with
 * SIMD kernels (detail/host/select.hpp), the device enqueues one launch per step whose kernel
 * reads the state in device memory (detail/cuda/), so that no host round trip decides.
 */
#pragma once

#include <dropit/detail/config.hpp>
#include <dropit/detail/steps.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace dropit::detail {

/// The step that is due.
enum select_mode : int {
  mode_count = 0,  ///< the count pass is due
  mode_resolve,    ///< the k-th key is in the candidate bucket `bucket`
  mode_fallback,   ///< exact radix select over x
  mode_final       ///< t and ties_kept are known: compact
};

/// How the threshold was found (tests and benchmarks read it).
enum select_path : int {
  path_none = 0,
  path_candidates,  ///< selected among the candidates of one bucket
  path_single_key,  ///< the k-th key is known after the count: the range or its bucket is one key
  path_fallback     ///< exact radix select over x
};

/// Bits of `select_state::worked`: the steps that did work.
enum select_step : unsigned {
  step_sample = 1u << 0,
  step_count = 1u << 1,
  step_radix = 1u << 2,
  step_resolve = 1u << 3,
  step_compact = 1u << 4
};

/// Whether the count pass stages the values of keys at or above lo, so that the compact step
/// need not read x again (bitmask encoding only).
enum class staging_mode : std::uint8_t {
  automatic,  ///< when at most `max_staged_fraction` of x is expected at or above lo (the host
              ///< also asks that x be larger than half its last-level cache)
  never,      ///< the compact step reads x again
  always      ///< whenever the count pass collects candidates
};

/// Staging pays while the staged values are a small part of x: at gamma = 0.5, writing and
/// reading half of x moves as many bytes as reading x again (a count of bytes, not a measurement).
inline constexpr double max_staged_fraction = 0.3;

/// Radix passes over keys of type K.
template <class K>
inline constexpr int radix_passes = (static_cast<int>(sizeof(K)) * 8 + radix_bits - 1) / radix_bits;

/// The bucket of a histogram that holds a rank (1-based, from the top): `higher` keys lie in the
/// buckets above d, `count` in d.
struct bucket_pick {
  unsigned d = 0;
  std::size_t higher = 0;
  std::size_t count = 0;
};

/// The bucket of `bins` that holds rank r, one bucket at a time (radix_state::advance's walk).
template <class Count>
[[nodiscard]] DROPIT_HD bucket_pick pick_bucket(const Count* hist, unsigned bins,
                                                std::size_t r) noexcept {
  bucket_pick p;
  p.d = bins - 1;
  while (p.d > 0 && p.higher + static_cast<std::size_t>(hist[p.d]) < r)
    p.higher += static_cast<std::size_t>(hist[p.d--]);
  p.count = static_cast<std::size_t>(hist[p.d]);
  return p;
}

/**
 * Moves the r-th largest of a[0, count) (0-based) to a[r], larger keys before it, smaller after
 * (Hoare quickselect; equal keys stop both scans, so heavy ties stay linear).
 */
template <class Key>
DROPIT_HD void select_descending(Key* a, std::size_t count, std::size_t r) noexcept {
  long long lo = 0, hi = static_cast<long long>(count) - 1;
  const auto want = static_cast<long long>(r);
  while (lo < hi) {
    const Key pivot = a[lo + (hi - lo) / 2];
    long long i = lo, j = hi;
    while (i <= j) {  // [lo, j] holds keys >= pivot, [i, hi] keys <= pivot
      while (a[i] > pivot)
        ++i;
      while (a[j] < pivot)
        --j;
      if (i <= j) {
        const Key tmp = a[i];
        a[i] = a[j];
        a[j] = tmp;
        ++i;
        --j;
      }
    }
    if (want <= j) {
      hi = j;
    } else if (want >= i) {
      lo = i;
    } else {
      return;  // between j and i every key equals the pivot
    }
  }
}

/// Ranks (0-based, in the descending sample) of the order statistics that bound the guessed
/// range: hi_rank < 0 means the largest key, lo_rank >= samples key 0.
struct guessed_ranks {
  long long hi_rank = 0;
  long long lo_rank = 0;
  std::size_t margin = 0;  ///< half-width in sample ranks (0 when the sample is all of x)
};

/// The k-th key's expected rank in a sample of S of n keys, +- `margin_sd` standard deviations
/// of the sample rank (a binomial count); the k-th key itself when S = n.
[[nodiscard]] inline guessed_ranks guess_ranks(std::size_t n, std::size_t k, std::size_t samples,
                                               double margin_sd) noexcept {
  guessed_ranks g;
  if (samples == n) {
    g.hi_rank = g.lo_rank = static_cast<long long>(k) - 1;
    return g;
  }
  const double s = static_cast<double>(samples);
  const double q = static_cast<double>(k) / static_cast<double>(n);
  const auto margin = static_cast<long long>(std::ceil(margin_sd * std::sqrt(s * q * (1 - q)))) + 1;
  const auto rank = static_cast<long long>(std::ceil(q * s)) - 1;
  g.hi_rank = rank - margin;
  g.lo_rank = rank + margin;
  g.margin = static_cast<std::size_t>(margin);
  return g;
}

/// Candidates expected in the guessed range (the sample's share of x per sample rank).
[[nodiscard]] inline double expected_candidates(std::size_t n, std::size_t samples,
                                                const guessed_ranks& g) noexcept {
  return static_cast<double>(n) * static_cast<double>(2 * g.margin + 1) /
         static_cast<double>(samples);
}

/**
 * Everything a selection decides between its steps. Each step reads it and returns at once when
 * it is not due; the serial end of a step (run by the item that finishes last on the device)
 * calls `decide`, `advance_radix` or `resolve_bucket`, which move it on.
 */
template <class Key>
struct select_state {
  std::size_t n;
  std::size_t k;
  Key lo;
  Key hi;
  int shift;    ///< candidate bucket of key: (key - lo) >> shift
  bool forced;  ///< tests: skip the guess, take the fallback
  int mode;
  int path;
  std::size_t small_cap;    ///< most keys of one bucket the resolve step takes
  unsigned bucket;          ///< resolve: the bucket with the k-th key
  std::size_t bucket_rank;  ///< resolve: its rank among the bucket's keys, 1-based, from the top
  radix_state<Key> state;   ///< fallback over x
  Key t;                    ///< the threshold key
  std::size_t ties_kept;    ///< keys equal to t that are kept, lowest index first
  unsigned worked;          ///< select_step bits
  unsigned x_passes;        ///< steps that read all of x

  DROPIT_HD select_state(std::size_t n_, std::size_t k_, std::size_t small_cap_) noexcept
      : n(n_),
        k(k_),
        lo{},
        hi{},
        shift(0),
        forced(false),
        mode(mode_count),
        path(path_none),
        small_cap(small_cap_),
        bucket(0),
        bucket_rank(0),
        state(k_),
        t{},
        ties_kept(0),
        worked(0),
        x_passes(0) {}

  /// After the sample: the guessed range [lo_, hi_] and `bucket_bits` bits of bucket in it.
  DROPIT_HD void set_range(Key lo_, Key hi_, int bucket_bits) noexcept {
    lo = lo_;
    hi = hi_;
    const auto range = static_cast<unsigned long long>(hi) - static_cast<unsigned long long>(lo);
    int bits = 0;
    while (bits < 64 && (range >> bits) != 0)
      ++bits;
    shift = bits > bucket_bits ? bits - bucket_bits : 0;
    worked |= step_sample;
  }

  /// Whether the count pass copies candidates (lo == hi needs none).
  [[nodiscard]] DROPIT_HD bool collecting() const noexcept { return lo != hi; }
  /// The candidate bucket of a key in [lo, hi].
  [[nodiscard]] DROPIT_HD unsigned bucket_of(Key key) const noexcept {
    return static_cast<unsigned>(static_cast<Key>(key - lo) >> shift);
  }

  /// The rank of the k-th key among the keys at or below hi (1 when it is above hi: a miss).
  [[nodiscard]] DROPIT_HD std::size_t rank_below_hi(unsigned long long above) const noexcept {
    return above < k ? static_cast<std::size_t>(k - above) : 1;
  }

  /**
   * After the count pass: `above` keys > hi, `within` in [lo, hi], `fits` that every candidate
   * was collected; `pick` the candidate bucket that holds rank `rank_below_hi(above)`. Picks
   * the next step.
   */
  DROPIT_HD void decide(unsigned long long above, unsigned long long within, bool fits,
                        bucket_pick pick) noexcept {
    worked |= step_count;
    ++x_passes;
    if (!forced && above < k && k <= above + within) {
      const std::size_t r = static_cast<std::size_t>(k - above);
      if (lo == hi) {
        finish(lo, r, path_single_key);
        return;
      }
      if (fits && pick.count <= small_cap) {
        mode = mode_resolve;
        bucket = pick.d;
        bucket_rank = r - pick.higher;
        return;
      }
      if (fits && shift == 0) {  // too many for the resolve buffer, but its bucket is one key
        finish(static_cast<Key>(lo + pick.d), r - pick.higher, path_single_key);
        return;
      }
    }
    mode = mode_fallback;
    state = radix_state<Key>(k);
  }

  /// The end of a fallback radix pass: `hist` counts the matching keys per digit; after the
  /// last digit the threshold is the k-th key, with the rank left among its ties.
  template <class Count>
  DROPIT_HD void advance_radix(const Count* hist) noexcept {
    state.advance(hist);
    if (state.done()) finish(state.prefix, state.rank, path_fallback);
    worked |= step_radix;
    ++x_passes;
  }

  /// The end of the resolve step: a[0, m) are the chosen bucket's keys (reordered here).
  DROPIT_HD void resolve_bucket(Key* a, std::size_t m) noexcept {
    select_descending(a, m, bucket_rank - 1);
    const Key key = a[bucket_rank - 1];
    std::size_t greater = 0;
    for (std::size_t i = 0; i + 1 < bucket_rank; ++i)
      greater += static_cast<std::size_t>(a[i] > key);
    finish(key, bucket_rank - greater, path_candidates);
    worked |= step_resolve;
  }

  /// The threshold is known: t, and how many keys equal to t are kept.
  DROPIT_HD void finish(Key key, std::size_t ties, int how) noexcept {
    t = key;
    ties_kept = ties;
    path = how;
    mode = mode_final;
  }
};

/// Keys equal to t that a block keeps, given the ties before it and its own.
[[nodiscard]] DROPIT_HD inline std::uint32_t ties_in_block(std::size_t ties_kept,
                                                           std::uint32_t before,
                                                           std::uint32_t ties) noexcept {
  if (ties_kept <= before) return 0;
  const std::size_t left = ties_kept - before;
  return left < ties ? static_cast<std::uint32_t>(left) : ties;
}

/**
 * The selection and compaction of one pack, the same sequence on every executor. A backend
 * supplies the steps (each returns at once, or enqueues work that does, when its step is not
 * due) and `key_type`:
 * @code
 * struct backend {
 *   using key_type = ...;
 *   void sample();          // sets the guessed range (select_state::set_range)
 *   void count();           // ends in select_state::decide
 *   void radix_pass(int);   // fallback only: ends in select_state::advance_radix
 *   void resolve();         // resolve only: ends in select_state::resolve_bucket
 *   void compact();         // writes the payload from (t, ties_kept)
 * };
 * @endcode
 */
template <class Backend>
void run_selection(Backend& be) {
  be.sample();
  be.count();
  for (int pass = 0; pass < radix_passes<typename Backend::key_type>; ++pass)
    be.radix_pass(pass);
  be.resolve();
  be.compact();
}

}  // namespace dropit::detail
