/**
 * @file selection.hpp
 * @brief The device selection: its control block, which lives in device memory and advances on
 * the device (no count travels to the host, no host decision between launches), and the
 * decoupled look-back that turns per-block counts into offsets inside the compact launch.
 *
 * A pack that keeps the k largest keys of x (0 < k < n) is a fixed sequence of launches; each
 * reads the control block and returns at once when its step is not due:
 * 1. sample: S sampled keys, sorted; a key range [lo, hi] that holds the k-th largest key with
 *    high probability (exact when the sample is all of x: lo == hi == the k-th key);
 * 2. count (a read of x): per block of 1024, the keys in [lo, hi] are copied to a candidate buffer
 *    and counted into a histogram of 8192 buckets over [lo, hi]; when few keys are expected at or
 *    above lo, the block's values of those keys are staged with a mask of where they were; the
 *    last block to finish decides:
 *    - lo == hi holds the k-th key: the threshold is lo (`final`);
 *    - the range holds it and the bucket with the k-th key fits the resolve buffer: `resolve`;
 *    - otherwise (a miss, an overflow, or a forced fallback): `fallback`;
 * 3. fallback only: radix-select the exact key over x (one launch per digit), then `final`;
 * 4. resolve only: the bucket's keys go to a small buffer; the last block sorts it: `final`;
 * 5. compact: with the threshold t and the number of keys equal to t that are kept (the
 *    lowest-indexed ones), each block's kept count comes from a decoupled look-back over the
 *    blocks before it, and the block writes its values and positions at that offset. A staged
 *    block is read from the stage (t >= lo on a hit: every kept key was staged), any other from x.
 * On a hit the working launches are sample, count, resolve (or none when lo == hi), compact, and
 * x is read once when the stage held every block.
 */
#pragma once

#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

namespace dropit::detail::dev {

/// Counter partitions of the candidate buffer (spreads the atomics that reserve slots).
inline constexpr unsigned max_parts = 64;
/// Bins of one radix pass.
inline constexpr unsigned radix_bins = 1u << radix_bits;
/// Buckets of the candidate histogram: at n = 2^28 and gamma 0.9 the k-th key's bucket holds
/// about 1-2 thousand of the 7 million candidates, well within one CTA's sort.
inline constexpr int bucket_bits = 13;
inline constexpr unsigned candidate_buckets = 1u << bucket_bits;
/// The histograms of a pack: the candidate buckets, then the radix bins.
inline constexpr unsigned histogram_bins = candidate_buckets + radix_bins;

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
/// Device-scope acquire load and release store (the look-back's flags).
template <class U>
DROPIT_HD U load_acquire(U* p) noexcept {
  return ::cuda::atomic_ref<U, ::cuda::thread_scope_device>(*p).load(
      ::cuda::std::memory_order_acquire);
}
template <class U>
DROPIT_HD void store_release(U* p, U v) noexcept {
  ::cuda::atomic_ref<U, ::cuda::thread_scope_device>(*p).store(v,
                                                               ::cuda::std::memory_order_release);
}
/// Whether this item is the last of `total` to finish a launch (after a device-scope fence, so
/// that it sees every other item's writes). The counter must start at 0; the last item resets
/// it for the next launch.
DROPIT_HD inline bool last_to_finish(unsigned* done, unsigned total) noexcept {
  ::cuda::atomic_thread_fence(::cuda::std::memory_order_acq_rel, ::cuda::thread_scope_device);
  const unsigned before =
      ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device>(*done).fetch_add(
          1u, ::cuda::std::memory_order_acq_rel);
  if (before + 1 != total) return false;
  *done = 0;
  ::cuda::atomic_thread_fence(::cuda::std::memory_order_acq_rel, ::cuda::thread_scope_device);
  return true;
}

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
  path_candidates,  ///< sorted among the candidates of one bucket
  path_single_key,  ///< the guessed range was one key: it is the threshold
  path_fallback     ///< exact radix select over x
};

/// Bits of `select_ctl::worked`: the steps whose launch did work (a skipped launch returns at
/// once), and `x_passes` counts the launches that read all of x.
enum select_step : unsigned {
  step_sample = 1u << 0,
  step_count = 1u << 1,
  step_radix = 1u << 2,
  step_resolve = 1u << 3,
  step_compact = 1u << 4
};

/// The selection's state, in device memory; built by the sample step.
template <class Key>
struct select_ctl {
  std::size_t n;
  std::size_t k;
  Key lo;
  Key hi;
  int shift;    ///< candidate bucket of key: (key - lo) >> shift, < candidate_buckets
  bool forced;  ///< tests: skip the guess, take the fallback
  int mode;
  int path;
  unsigned parts;
  std::size_t part_cap;
  std::size_t small_cap;            ///< slots of the resolve buffer
  std::size_t stage_cap;            ///< slots of the stage; 0: the count pass stages nothing
  unsigned long long above_total;   ///< keys > hi
  unsigned long long within_total;  ///< keys in [lo, hi]
  unsigned long long part_count[max_parts];
  unsigned long long small_count;  ///< keys in the resolve buffer
  unsigned long long stage_used;   ///< staged values
  unsigned bucket;                 ///< resolve: the bucket with the k-th key
  std::size_t bucket_rank;    ///< resolve: its rank among the bucket's keys, 1-based, from the top
  radix_state<Key> state;     ///< fallback over x
  Key t;                      ///< the threshold key
  std::size_t ties_kept;      ///< keys equal to t that are kept, lowest index first
  unsigned done;              ///< items (or CTAs) finished in the current launch
  unsigned long long ticket;  ///< compact: blocks handed out, in index order
  unsigned worked;            ///< select_step bits
  unsigned x_passes;          ///< launches that read all of x
  unsigned read_x;            ///< compact: a block was read from x (not from the stage)

  DROPIT_HD select_ctl(std::size_t n_, std::size_t k_, unsigned parts_, std::size_t part_cap_,
                       std::size_t small_cap_, std::size_t stage_cap_) noexcept
      : n(n_),
        k(k_),
        lo{},
        hi{},
        shift(0),
        forced(false),
        mode(mode_count),
        path(path_none),
        parts(parts_),
        part_cap(part_cap_),
        small_cap(small_cap_),
        stage_cap(stage_cap_),
        above_total(0),
        within_total(0),
        part_count{},
        small_count(0),
        stage_used(0),
        bucket(0),
        bucket_rank(0),
        state(k_),
        t{},
        ties_kept(0),
        done(0),
        ticket(0),
        worked(0),
        x_passes(0),
        read_x(0) {}

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
   * After the count pass: `above` keys > hi, `within` in [lo, hi], `fits` that no candidate
   * partition overflowed; `pick` the candidate bucket that holds rank `rank_below_hi(above)`.
   * Picks the next step.
   */
  DROPIT_HD void decide(unsigned long long above, unsigned long long within, bool fits,
                        bucket_pick pick) noexcept {
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
    }
    mode = mode_fallback;
    state = radix_state<Key>(k);
  }

  /// The threshold is known: t, and how many keys equal to t are kept.
  DROPIT_HD void finish(Key key, std::size_t ties, int how) noexcept {
    t = key;
    ties_kept = ties;
    path = how;
    mode = mode_final;
  }
};

/// Status of one block in the compact step's look-back: its kept count without the keys equal
/// to t (`above`) and its keys equal to t (`ties`), as the block's own counts (`flag_aggregate`)
/// or summed over every block up to it (`flag_inclusive`).
struct lookback_cell {
  static constexpr unsigned flag_none = 0, flag_aggregate = 1, flag_inclusive = 2;
  unsigned flag;
  std::uint32_t agg_above;
  std::uint32_t agg_ties;
  std::uint32_t inc_above;
  std::uint32_t inc_ties;
};

/// Publishes block b's counts; block 0's are already inclusive.
DROPIT_HD inline void lookback_publish(lookback_cell* cells, std::size_t b, std::uint32_t above,
                                       std::uint32_t ties) noexcept {
  lookback_cell& c = cells[b];
  if (b == 0) {
    c.inc_above = above;
    c.inc_ties = ties;
    store_release(&c.flag, lookback_cell::flag_inclusive);
    return;
  }
  c.agg_above = above;
  c.agg_ties = ties;
  store_release(&c.flag, lookback_cell::flag_aggregate);
}

/// Sums of the counts of the blocks before b.
struct block_prefix {
  std::uint32_t above = 0;
  std::uint32_t ties = 0;
};

/**
 * Block b's exclusive prefix: walks back over the blocks before it, adding each one's own counts
 * until a block with an inclusive sum is found (spinning on a block not yet published: blocks
 * are handed out in index order, so it is being worked on), then publishes b's inclusive sum.
 */
DROPIT_HD inline block_prefix lookback_resolve(lookback_cell* cells, std::size_t b,
                                               std::uint32_t above, std::uint32_t ties) noexcept {
  block_prefix p;
  if (b == 0) return p;
  for (std::size_t j = b; j-- > 0;) {
    unsigned f;
    while ((f = load_acquire(&cells[j].flag)) == lookback_cell::flag_none) {
    }
    if (f == lookback_cell::flag_inclusive) {
      p.above += cells[j].inc_above;
      p.ties += cells[j].inc_ties;
      break;
    }
    p.above += cells[j].agg_above;
    p.ties += cells[j].agg_ties;
  }
  lookback_cell& c = cells[b];
  c.inc_above = p.above + above;
  c.inc_ties = p.ties + ties;
  store_release(&c.flag, lookback_cell::flag_inclusive);
  return p;
}

/// A block the stage had no room for.
inline constexpr std::uint32_t not_staged = 0xffffffffu;

/// Keys equal to t that block b keeps, given the ties before it.
[[nodiscard]] DROPIT_HD inline std::uint32_t ties_in_block(std::size_t ties_kept,
                                                           std::uint32_t before,
                                                           std::uint32_t ties) noexcept {
  if (ties_kept <= before) return 0;
  const std::size_t left = ties_kept - before;
  return left < ties ? static_cast<std::uint32_t>(left) : ties;
}

}  // namespace dropit::detail::dev
