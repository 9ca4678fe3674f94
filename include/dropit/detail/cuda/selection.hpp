/**
 * @file selection.hpp
 * @brief The device's side of the shared selection (detail/selection.hpp): its state in device
 * memory (`select_ctl`, which advances on the device: no count travels to the host, no host
 * decision between launches), the device-scope atomics its steps use, and the decoupled
 * look-back that turns per-block counts into offsets inside the compact launch.
 *
 * Each step of `run_selection` is one launch that reads `select_ctl` and returns at once when its
 * step is not due; the item (or CTA) that finishes a launch last runs the step's serial end. The
 * count pass collects candidates into `max_parts` partitions and, when few keys are expected at
 * or above lo, stages the values of those keys with a mask of where they were; the compact step
 * gives each block (by ticket, in index order) its offset AND its share of the ties from the
 * look-back, and reads a staged block from the stage (t >= lo on a hit: every kept key was
 * staged). On a hit the working launches are sample, count, resolve (none when lo == hi) and
 * compact, and x is read once when the stage held every block.
 */
#pragma once

#include <dropit/detail/numeric.hpp>
#include <dropit/detail/selection.hpp>
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

/// The device's selection state, in device memory (built by the sample step): the shared
/// `select_state` and what the device's steps add (candidate partitions, counters, the
/// compact step's tickets).
template <class Key>
struct select_ctl : select_state<Key> {
  unsigned parts;
  std::size_t part_cap;
  std::size_t stage_cap;            ///< slots of the stage; 0: the count pass stages nothing
  unsigned long long above_total;   ///< keys > hi
  unsigned long long within_total;  ///< keys in [lo, hi]
  unsigned long long part_count[max_parts];
  unsigned long long small_count;  ///< keys in the resolve buffer
  unsigned long long stage_used;   ///< staged values
  unsigned done;                   ///< items (or CTAs) finished in the current launch
  unsigned long long ticket;       ///< compact: blocks handed out, in index order
  unsigned read_x;                 ///< compact: a block was read from x (not from the stage)

  DROPIT_HD select_ctl(std::size_t n_, std::size_t k_, unsigned parts_, std::size_t part_cap_,
                       std::size_t small_cap_, std::size_t stage_cap_) noexcept
      : select_state<Key>(n_, k_, small_cap_),
        parts(parts_),
        part_cap(part_cap_),
        stage_cap(stage_cap_),
        above_total(0),
        within_total(0),
        part_count{},
        small_count(0),
        stage_used(0),
        done(0),
        ticket(0),
        read_x(0) {}
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

/// Publishes block b's inclusive sums: the blocks before it (`before`) plus its own counts.
DROPIT_HD inline void lookback_finish(lookback_cell* cells, std::size_t b, block_prefix before,
                                      std::uint32_t above, std::uint32_t ties) noexcept {
  lookback_cell& c = cells[b];
  c.inc_above = before.above + above;
  c.inc_ties = before.ties + ties;
  store_release(&c.flag, lookback_cell::flag_inclusive);
}

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
  lookback_finish(cells, b, p, above, ties);
  return p;
}

/// A block the stage had no room for.
inline constexpr std::uint32_t not_staged = 0xffffffffu;

}  // namespace dropit::detail::dev
