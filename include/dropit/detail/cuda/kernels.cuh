/**
 * @file kernels.cuh
 * @brief The fast path: kernels only nvcc compiles, for every pack step (sample, count, the
 * fallback's radix passes, resolve, compact, the Elias-Fano encode) and for restore. One warp takes
 * a block of 1024 (lane j reads element 32 i + j of word i, so loads and stores coalesce; a ballot
 * is a word), a block's serial step runs on the last CTA with CUB block scans. Each kernel takes
 * the portable body's fields (portable.hpp) as its parameters and leaves the control block and the
 * payload as that body does: the same bytes. The Elias-Fano encode and decode have theirs (the
 * encode ORs bits into words the compact kernel zeroed).
 */
#pragma once

#include <dropit/detail/cuda/config.hpp>

#if !DROPIT_CUDA_EMULATED

#include <dropit/detail/cuda/plan.hpp>
#include <dropit/detail/cuda/portable.hpp>
#include <dropit/detail/cuda/runtime.hpp>
#include <dropit/detail/cuda/selection.hpp>
#include <dropit/detail/steps.hpp>

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace dropit::detail::dev {

inline constexpr int fast_threads = 256;
inline constexpr int fast_warps = fast_threads / 32;
inline constexpr unsigned full_warp = 0xffffffffu;

__device__ __forceinline__ unsigned lane_id() {
  return threadIdx.x & 31u;
}
__device__ __forceinline__ std::uint32_t lanes_below() {
  return (1u << lane_id()) - 1u;
}

/// Inclusive sum over the warp's lanes.
__device__ __forceinline__ std::uint32_t warp_inclusive_sum(std::uint32_t v) {
#pragma unroll
  for (unsigned d = 1; d < 32; d <<= 1) {
    const std::uint32_t t = __shfl_up_sync(full_warp, v, d);
    if (lane_id() >= d) v += t;
  }
  return v;
}

/// The first warp-sized block of work of this warp, and the stride between its blocks.
__device__ __forceinline__ std::size_t first_warp_block() {
  return static_cast<std::size_t>(blockIdx.x) * fast_warps + threadIdx.x / 32;
}
__device__ __forceinline__ std::size_t warp_block_stride() {
  return static_cast<std::size_t>(gridDim.x) * fast_warps;
}

/// Grid of the warp-per-block kernels: enough warps to cover the device, at most one per block.
[[nodiscard]] inline unsigned warp_grid(std::size_t blocks) {
  const std::size_t wanted = (blocks + fast_warps - 1) / fast_warps;
  return static_cast<unsigned>(
      std::max<std::size_t>(1, std::min<std::size_t>(wanted, std::size_t{rt::sm_count()} * 8)));
}
/// Grid of the grid-stride item kernels.
[[nodiscard]] inline unsigned item_grid(std::size_t items) {
  const std::size_t wanted = (items + fast_threads * 4 - 1) / (fast_threads * 4);
  return static_cast<unsigned>(
      std::max<std::size_t>(1, std::min<std::size_t>(wanted, std::size_t{rt::sm_count()} * 4)));
}

/// Sum over the warp's lanes, in every lane.
__device__ __forceinline__ std::uint32_t warp_sum(std::uint32_t v) {
  return __shfl_sync(full_warp, warp_inclusive_sum(v), 31);
}

/// Adds each valid lane's digit to the shared histogram: one atomic per distinct digit of the
/// warp, by its lowest lane. Every lane of the warp calls it (invalid ones pass an unused digit).
__device__ __forceinline__ void warp_aggregated_add(unsigned* bins, unsigned digit, bool valid) {
  const unsigned same = __match_any_sync(full_warp, digit);
  if (valid && (same & lanes_below()) == 0) atomicAdd(&bins[digit], __popc(same));
}

/// True in every thread of the CTA that finished last among the grid's CTAs (after a fence, so
/// it sees every other CTA's writes); that CTA resets the counter for the next launch.
__device__ __forceinline__ bool last_cta(unsigned* done) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1u) == gridDim.x - 1;
    if (last) *done = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

/**
 * The r-th largest (0-based) of keys[0, m) in shared memory, found by the CTA: an MSD radix
 * select, one byte a pass (a shared histogram of the keys that match the digits chosen so far,
 * one atomic per distinct digit of a warp; warp 0 finds the digit that holds rank r).
 * @pre r < m; every thread of the CTA calls it
 */
template <class Key>
__device__ Key block_select_descending(const Key* keys, std::size_t m, std::size_t r) {
  __shared__ unsigned bins[256];
  __shared__ Key chosen;
  __shared__ unsigned long long chosen_rank;
  Key prefix = 0, mask = 0;
  for (int shift = static_cast<int>(sizeof(Key)) * 8 - 8; shift >= 0; shift -= 8) {
    for (unsigned d = threadIdx.x; d < 256; d += blockDim.x)
      bins[d] = 0;
    __syncthreads();
    for (std::size_t i0 = 0; i0 < m; i0 += blockDim.x) {  // uniform trip count: whole warps
      const std::size_t i = i0 + threadIdx.x;
      const Key key = i < m ? keys[i] : Key{0};
      const bool in = i < m && (key & mask) == prefix;
      const unsigned digit = in ? static_cast<unsigned>(key >> shift) & 255u : 256u;
      warp_aggregated_add(bins, digit, in);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane L holds digits 255 - 8 L - j, j < 8 (the top ones in lane 0)
      const unsigned lane = threadIdx.x;
      unsigned h[8];
      unsigned sum = 0;
#pragma unroll
      for (unsigned j = 0; j < 8; ++j) {
        h[j] = bins[255 - 8 * lane - j];
        sum += h[j];
      }
      unsigned long long above = warp_inclusive_sum(sum) - sum;
      if (above <= r && r < above + sum) {
        for (unsigned j = 0; j < 8; ++j) {
          if (r < above + h[j]) {
            chosen = static_cast<Key>(
                prefix | static_cast<Key>(static_cast<Key>(255 - 8 * lane - j) << shift));
            chosen_rank = r - above;
            break;
          }
          above += h[j];
        }
      }
    }
    __syncthreads();
    prefix = chosen;
    r = static_cast<std::size_t>(chosen_rank);
    mask = static_cast<Key>(mask | static_cast<Key>(static_cast<Key>(255) << shift));
    __syncthreads();  // every thread has read `chosen` before the next pass may write it
  }
  return prefix;
}

// ---- pack -------------------------------------------------------------------------------------

inline constexpr int sample_threads = 1024;

/// Step 1 on one CTA: the sampled keys in shared memory, their lo_rank-th and hi_rank-th largest
/// by radix select; thread 0 builds the control block.
template <class P, class T, class Key>
__global__ void __launch_bounds__(sample_threads) sample_kernel(sample_fn<P, T, Key> f) {
  __shared__ Key keys[max_samples<Key>];
  const std::size_t s = f.setup.samples;
  // Every load in flight at once (a gather: one DRAM round trip instead of one per key).
  constexpr unsigned per = (max_samples<Key> + sample_threads - 1) / sample_threads;
  T v[per];
  std::size_t at[per];
#pragma unroll
  for (unsigned u = 0; u < per; ++u) {
    const std::size_t j = threadIdx.x + std::size_t{u} * sample_threads;
    at[u] = j < s ? sample_position(j, f.setup.n, s) : 0;
    if (j < s) v[u] = f.x[at[u]];
  }
#pragma unroll
  for (unsigned u = 0; u < per; ++u) {
    const std::size_t j = threadIdx.x + std::size_t{u} * sample_threads;
    if (j < s) keys[j] = f.policy.key(v[u], at[u]);
  }
  for (unsigned d = threadIdx.x; d < histogram_bins; d += blockDim.x)
    f.hist[d] = 0;
  __syncthreads();
  // Only the lo_rank-th and hi_rank-th largest are needed: two radix selects, then those two
  // keys go to their places in the (otherwise unordered) sample for setup_ctl.
  const long long lo = f.setup.lo_rank, hi = f.setup.hi_rank;
  const bool has_lo = lo < static_cast<long long>(s), has_hi = hi >= 0;
  const Key lo_key =
      has_lo ? block_select_descending(keys, s, static_cast<std::size_t>(lo)) : Key{0};
  const Key hi_key =
      has_hi ? block_select_descending(keys, s, static_cast<std::size_t>(hi)) : Key{0};
  __syncthreads();
  if (threadIdx.x == 0) {
    if (has_lo) keys[lo] = lo_key;
    if (has_hi) keys[hi] = hi_key;
    setup_ctl(f.ctl, f.setup, keys);
  }
}

/// The bucket of the candidate histogram that holds rank r (from the top), found by the CTA:
/// suffix sums by one block scan, then `radix_picks` in every thread.
__device__ inline bucket_pick block_pick(const unsigned long long* hist, std::size_t r) {
  using scan = cub::BlockScan<unsigned long long, fast_threads>;
  constexpr unsigned per = candidate_buckets / fast_threads;
  __shared__ typename scan::TempStorage temp;
  __shared__ unsigned pick_d;
  __shared__ unsigned long long pick_higher, pick_count;
  // Thread t holds digits [d0, d0 + per) with thread 0 on the top ones, so an exclusive sum in
  // thread order counts the keys in higher buckets.
  const unsigned d0 = (fast_threads - 1 - threadIdx.x) * per;
  unsigned long long h[per];
  unsigned long long mine = 0;
#pragma unroll
  for (unsigned j = 0; j < per; ++j) {
    h[j] = atomic_load(const_cast<unsigned long long*>(&hist[d0 + j]));
    mine += h[j];
  }
  unsigned long long above_d = 0;
  scan(temp).ExclusiveSum(mine, above_d);
#pragma unroll
  for (int j = per - 1; j >= 0; --j) {
    const unsigned long long from_d = above_d + h[j];
    if (radix_picks(from_d, above_d, r, d0 + j)) {
      pick_d = d0 + j;
      pick_higher = above_d;
      pick_count = h[j];
    }
    above_d = from_d;
  }
  __syncthreads();
  bucket_pick p;
  p.d = pick_d;
  p.higher = pick_higher;
  p.count = pick_count;
  return p;
}

/// Sum over the warp's lanes, in every lane (one instruction from sm_80 on).
__device__ __forceinline__ std::uint32_t warp_total(std::uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(full_warp, v);
#else
  return warp_sum(v);
#endif
}

/// CTAs of the count kernel resident on one SM: it holds at most 64 registers a thread, so the
/// SM keeps enough loads of x in flight (at 128 registers, 2 CTAs of 8 warps read x at 0.8 TB/s on
/// an H200).
inline constexpr int count_min_ctas = 4;

/**
 * A tile's look-back status in one 16-byte word: x = flag | above << 32, y = ties (the tile's own
 * counts while the flag says aggregate, the sums up to and including it once inclusive). It is
 * stored and loaded whole by one relaxed 16-byte access, so a reader sees a flag with its counts
 * and no fence orders them (CUB's tile descriptors work the same way); the acquire loads of a
 * per-field cell invalidated L1 on every spin. The fast path's tiles use the front of the
 * workspace's `lookback_cell` array (16 bytes a tile of 8 blocks, under its 20 bytes a block).
 */
using tile_cell = ulonglong2;

[[nodiscard]] __device__ __forceinline__ tile_cell* tile_cells(lookback_cell* cells) {
  return reinterpret_cast<tile_cell*>(cells);
}
__device__ __forceinline__ tile_cell load_cell(const tile_cell* p) {
  tile_cell c;
  asm volatile("ld.relaxed.gpu.v2.u64 {%0, %1}, [%2];" : "=l"(c.x), "=l"(c.y) : "l"(p) : "memory");
  return c;
}
__device__ __forceinline__ void store_cell(tile_cell* p, unsigned flag, std::uint32_t above,
                                           std::uint32_t ties) {
  const unsigned long long x = flag | static_cast<unsigned long long>(above) << 32;
  const unsigned long long y = ties;
  asm volatile("st.relaxed.gpu.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(x), "l"(y) : "memory");
}

/**
 * Tile t's exclusive prefix, by a whole warp: publishes t's own counts, then walks back over the
 * tiles before it, 32 at a time (lane i reads tile top - 1 - i, spinning while it has published
 * nothing: tiles are handed out in index order, so it is being worked on), adding counts up to
 * the nearest inclusive one; then publishes t's inclusive sums. Every lane returns the prefix.
 */
__device__ inline block_prefix tile_lookback(tile_cell* cells, std::size_t t, std::uint32_t above,
                                             std::uint32_t ties) {
  const unsigned lane = lane_id();
  block_prefix p;
  if (t == 0) {
    if (lane == 0) store_cell(cells, lookback_cell::flag_inclusive, above, ties);
    return p;
  }
  if (lane == 0) store_cell(cells + t, lookback_cell::flag_aggregate, above, ties);
  for (std::size_t top = t; top > 0; top = top > 32 ? top - 32 : 0) {
    // Lanes past tile 0 read nothing (tile 0 is inclusive, so the walk ends before them).
    const bool real = lane < top;
    tile_cell c{lookback_cell::flag_inclusive, 0};
    if (real) {
      do {
        c = load_cell(cells + (top - 1 - lane));
      } while (static_cast<unsigned>(c.x) == lookback_cell::flag_none);
    }
    const auto flag = static_cast<unsigned>(c.x);
    const unsigned inclusive =
        __ballot_sync(full_warp, real && flag == lookback_cell::flag_inclusive);
    const unsigned stop =
        inclusive != 0 ? static_cast<unsigned>(__ffs(static_cast<int>(inclusive)) - 1) : 32u;
    const bool counts = real && lane <= stop;
    p.above += warp_total(counts ? static_cast<std::uint32_t>(c.x >> 32) : 0u);
    p.ties += warp_total(counts ? static_cast<std::uint32_t>(c.y) : 0u);
    if (inclusive != 0) break;
  }
  if (lane == 0)
    store_cell(cells + t, lookback_cell::flag_inclusive, p.above + above, p.ties + ties);
  return p;
}

/**
 * Classifies the warp's block of 1024 keys, 32 at a time: lane i returns which elements of word
 * i (elements base + 32 i + j) are above hi and which are in [lo, hi]. `Full`: the block lies
 * inside x (no bound checks).
 */
template <bool Full, class P, class T, class Key>
__device__ __forceinline__ void classify_range(const count_fn<P, T, Key>& f, std::size_t base,
                                               Key lo, Key hi, std::uint32_t& my_above,
                                               std::uint32_t& my_within) {
  const unsigned lane = lane_id();
#pragma unroll 1
  for (unsigned i0 = 0; i0 < 32; i0 += 8) {
    T v[8];
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) {
      const std::size_t e = base + (i0 + u) * 32 + lane;
      v[u] = Full || e < f.n ? f.x[e] : T{};
    }
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) {
      const std::size_t e = base + (i0 + u) * 32 + lane;
      const Key key = f.policy.key(v[u], e);
      const bool in = Full || e < f.n;
      const std::uint32_t ma = __ballot_sync(full_warp, in && key > hi);
      const std::uint32_t mw = __ballot_sync(full_warp, in && key <= hi && key >= lo);
      if (lane == i0 + u) {
        my_above = ma;
        my_within = mw;
      }
    }
  }
}

/// Step 2, one warp per block of 1024: ballots classify 32 keys at a time; the warp's candidates
/// take one atomic per block (spread over the partitions), the staged values of the CTA's blocks
/// one atomic per round of the CTA; the bucket histogram is per CTA in shared memory. The last
/// CTA decides.
template <class P, class T, class Key>
__global__ void __launch_bounds__(fast_threads, count_min_ctas)
    count_kernel(count_fn<P, T, Key> f) {
  __shared__ unsigned long long cta_above[fast_warps], cta_within[fast_warps];
  __shared__ std::uint32_t stage_need[fast_warps];
  __shared__ unsigned long long stage_base;
  __shared__ unsigned bins[candidate_buckets];
  select_ctl<Key>* ctl = f.ctl;
  if (ctl->mode != mode_count) return;  // the same in every CTA: only the last CTA changes it
  const Key lo = ctl->lo, hi = ctl->hi;
  const bool collect = ctl->collecting();
  const unsigned parts = ctl->parts;
  const std::size_t part_cap = ctl->part_cap;
  const std::size_t stage_cap = ctl->stage_cap;
  const std::size_t n = f.n;
  const std::size_t total_words = (n + word_elements - 1) / word_elements;
  for (unsigned d = threadIdx.x; d < candidate_buckets; d += blockDim.x)
    bins[d] = 0;
  __syncthreads();
  const unsigned lane = lane_id();
  const unsigned warp = threadIdx.x / 32;
  unsigned long long warp_above = 0, warp_within = 0;
  // Every warp of the CTA takes the same number of rounds (a warp past the last block idles), so
  // the CTA reserves its staged values with one atomic a round.
  for (std::size_t b0 = static_cast<std::size_t>(blockIdx.x) * fast_warps; b0 < f.blocks;
       b0 += warp_block_stride()) {
    const std::size_t b = b0 + warp;
    const bool active = b < f.blocks;
    const std::size_t base = b * block_elements;
    std::uint32_t my_above = 0, my_within = 0;
    if (active) {
      if (base + block_elements <= n)
        classify_range<true>(f, base, lo, hi, my_above, my_within);
      else
        classify_range<false>(f, base, lo, hi, my_above, my_within);
    }
    const std::uint32_t my_ge = my_above | my_within;
    const std::uint32_t a = warp_total(static_cast<std::uint32_t>(__popc(my_above)));
    const std::uint32_t w = warp_total(static_cast<std::uint32_t>(__popc(my_within)));
    const std::size_t my_word = b * 32 + lane;
    // The compact kernel's tile of 8 blocks is this round's (b0 is a multiple of 8).
    if (warp == 0 && lane == 0) tile_cells(f.cells)[b0 / fast_warps] = tile_cell{0, 0};
    if (active && f.stage != nullptr && my_word < total_words) f.ge_words[my_word] = my_ge;
    warp_above += a;
    warp_within += w;
    const std::size_t e0 = base + lane * 32;
    if (collect && w != 0) {
      const std::size_t p = b % parts;
      const auto c = static_cast<std::uint32_t>(__popc(my_within));
      const std::uint32_t before = warp_inclusive_sum(c) - c;
      unsigned long long start = 0;
      if (lane == 0) start = atomicAdd(&ctl->part_count[p], static_cast<unsigned long long>(w));
      start = __shfl_sync(full_warp, start, 0);
      std::size_t slot = static_cast<std::size_t>(start) + before;
      Key* keys = f.cand_key + p * part_cap;
      std::uint32_t* index = f.cand_index + p * part_cap;
      for (std::uint32_t m = my_within; m != 0 && slot < part_cap; m &= m - 1, ++slot) {
        const std::size_t e = e0 + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1);
        const Key key = f.policy.key(f.x[e], e);
        keys[slot] = key;
        index[slot] = static_cast<std::uint32_t>(e);
        atomicAdd(&bins[ctl->bucket_of(key)], 1u);
      }
    }
    if (f.stage != nullptr) {
      const std::uint32_t s = a + w;
      if (lane == 0) stage_need[warp] = s;
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long total = 0;
        for (int q = 0; q < fast_warps; ++q)
          total += stage_need[q];
        stage_base = total != 0 ? atomicAdd(&ctl->stage_used, total) : 0;
      }
      __syncthreads();
      unsigned long long at = stage_base;
      for (unsigned q = 0; q < warp; ++q)
        at += stage_need[q];
      const bool fits = at + s <= stage_cap;
      if (active && lane == 0) f.stage_at[b] = fits ? static_cast<std::uint32_t>(at) : not_staged;
      if (active && fits) {
        const auto c = static_cast<std::uint32_t>(__popc(my_ge));
        std::size_t to = static_cast<std::size_t>(at) + warp_inclusive_sum(c) - c;
        // Four loads in flight before their stores (one at a time, each store waited on its
        // load: 15% of the kernel's stalls at n = 2^28).
        for (std::uint32_t m = my_ge; m != 0;) {
          T v[4];
          unsigned got = 0;
#pragma unroll
          for (unsigned u = 0; u < 4; ++u) {
            if (m != 0) {
              v[u] = f.x[e0 + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1)];
              m &= m - 1;
              got = u + 1;
            }
          }
#pragma unroll
          for (unsigned u = 0; u < 4; ++u)
            if (u < got) f.stage[to + u] = v[u];
          to += got;
        }
      }
      __syncthreads();  // stage_need and stage_base are rewritten by the next round
    }
  }
  if (lane == 0) {
    cta_above[threadIdx.x / 32] = warp_above;
    cta_within[threadIdx.x / 32] = warp_within;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long ta = 0, tw = 0;
    for (int i = 0; i < fast_warps; ++i) {
      ta += cta_above[i];
      tw += cta_within[i];
    }
    if (ta != 0) atomicAdd(&ctl->above_total, ta);
    if (tw != 0) atomicAdd(&ctl->within_total, tw);
  }
  for (unsigned d = threadIdx.x; d < candidate_buckets; d += blockDim.x) {
    if (bins[d] != 0) atomicAdd(&f.hist[d], static_cast<unsigned long long>(bins[d]));
  }
  if (!last_cta(&ctl->done)) return;
  bool fits = true;
  for (unsigned p = threadIdx.x; p < parts; p += blockDim.x)
    fits = fits && atomic_load(&ctl->part_count[p]) <= part_cap;
  fits = __syncthreads_and(fits) != 0;
  const unsigned long long above = atomic_load(&ctl->above_total);
  const unsigned long long within = atomic_load(&ctl->within_total);
  const bucket_pick pick = block_pick(f.hist, ctl->rank_below_hi(above));
  if (threadIdx.x == 0) {
    ctl->decide(above, within, fits, pick);
  }
}

/// Step 3 (fallback only), grid-stride over x: one radix pass's histogram per CTA in shared
/// memory (one atomic per distinct digit of a warp), added to the global one; the last CTA
/// advances the state and clears the histogram.
template <class P, class T, class Key>
__global__ void __launch_bounds__(fast_threads) radix_kernel(radix_fn<P, T, Key> f) {
  __shared__ unsigned bins[radix_bins];
  select_ctl<Key>* ctl = f.ctl;
  if (ctl->mode != mode_fallback) return;
  const radix_state<Key> s = ctl->state;
  for (unsigned d = threadIdx.x; d < radix_bins; d += blockDim.x)
    bins[d] = 0;
  __syncthreads();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i0 = static_cast<std::size_t>(blockIdx.x) * blockDim.x; i0 < f.n;
       i0 += stride) {  // whole warps in every round
    const std::size_t i = i0 + threadIdx.x;
    unsigned digit = radix_bins;
    if (i < f.n) {
      const Key key = f.policy.key(f.x[i], i);
      if (s.matches(key)) digit = static_cast<unsigned>(s.digit(key));
    }
    warp_aggregated_add(bins, digit, digit < radix_bins);
  }
  __syncthreads();
  for (unsigned d = threadIdx.x; d < radix_bins; d += blockDim.x)
    if (bins[d] != 0) atomicAdd(&f.hist[d], static_cast<unsigned long long>(bins[d]));
  if (!last_cta(&ctl->done)) return;
  if (threadIdx.x == 0) ctl->advance_radix(f.hist);
  __syncthreads();
  for (unsigned d = threadIdx.x; d < radix_bins; d += blockDim.x)
    f.hist[d] = 0;
}

/// Step 4, grid-stride over the candidate slots: the chosen bucket's keys into the small buffer;
/// the last CTA selects the threshold among them in shared memory.
template <class Key>
__global__ void __launch_bounds__(fast_threads) resolve_kernel(resolve_fn<Key> f) {
  __shared__ Key keys[max_samples<Key>];
  __shared__ unsigned greater;
  select_ctl<Key>* ctl = f.ctl;
  if (ctl->mode != mode_resolve) return;
  const std::size_t part_cap = ctl->part_cap;
  const unsigned bucket = ctl->bucket;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < f.slots;
       j += stride) {
    const std::size_t p = j / part_cap;
    if (j - p * part_cap < ctl->part_count[p] && ctl->bucket_of(f.cand_key[j]) == bucket)
      f.small[atomicAdd(&ctl->small_count, 1ull)] = f.cand_key[j];
  }
  if (!last_cta(&ctl->done)) return;
  const auto m = static_cast<std::size_t>(atomic_load(&ctl->small_count));
  for (std::size_t i = threadIdx.x; i < m; i += blockDim.x)
    keys[i] = f.small[i];
  if (threadIdx.x == 0) greater = 0;
  __syncthreads();
  // t is the bucket_rank-th largest key; `greater` counts the keys above it.
  const std::size_t rank = ctl->bucket_rank;
  const Key t = block_select_descending(keys, m, rank - 1);
  unsigned mine = 0;
  for (std::size_t i = threadIdx.x; i < m; i += blockDim.x)
    mine += keys[i] > t ? 1u : 0u;
  if (mine != 0) atomicAdd(&greater, mine);
  __syncthreads();
  if (threadIdx.x == 0) {
    ctl->finish(t, rank - greater, path_candidates);
    ctl->worked |= step_resolve;
  }
}

/**
 * Step 5, one warp per block, a CTA's 8 blocks (a tile) taken by one ticket in index order: lane
 * i classifies word i (from the stage, or by ballots over x), warp 0 runs the tile's look-back
 * (one per 8 blocks: at n = 2^28, a look-back per block kept an H200 at 5% of its DRAM
 * bandwidth), each block adds the blocks before it in the tile, the ties the rank allows go to
 * the lowest-indexed tie bits, and each lane writes its word's kept values at its offset.
 */
template <class P, class T, class Key>
__global__ void __launch_bounds__(fast_threads) compact_kernel(compact_fn<P, T, Key> f) {
  __shared__ unsigned cta_read_x;
  __shared__ unsigned long long tile_ticket;
  __shared__ std::uint32_t warp_above[fast_warps], warp_ties[fast_warps];
  __shared__ std::uint32_t before_above, before_ties;  // the tile's look-back
  select_ctl<Key>* ctl = f.ctl;
  for (std::size_t w = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < f.clear_words; w += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    f.clear[w] = 0;  // for the Elias-Fano encode that follows
  if (ctl->mode != mode_final) return;
  if (threadIdx.x == 0) cta_read_x = 0;
  __syncthreads();
  const Key t = ctl->t;
  const std::size_t ties_kept = ctl->ties_kept;
  const bool from_guess = ctl->path != path_fallback;
  const std::size_t n = f.n;
  const std::size_t total_words = (n + word_elements - 1) / word_elements;
  const unsigned lane = lane_id();
  const unsigned warp = threadIdx.x / 32;
  const std::size_t tiles = (f.blocks + fast_warps - 1) / fast_warps;
  bool read_x = false;
  for (;;) {
    if (threadIdx.x == 0) tile_ticket = atomicAdd(&ctl->ticket, 1ull);
    __syncthreads();
    const auto tile = static_cast<std::size_t>(tile_ticket);
    if (tile >= tiles) break;  // the same in every thread of the CTA
    const std::size_t b = tile * fast_warps + warp;
    const bool active = b < f.blocks;
    const std::size_t base = b * block_elements;
    const std::size_t my_word = b * 32 + lane;
    const std::size_t e0 = base + lane * 32;
    const bool staged = active && f.stage != nullptr && from_guess && f.stage_at[b] != not_staged;
    std::uint32_t gt = 0, tie = 0, ge = 0;
    std::size_t from = 0;  // the lane's first staged value
    if (staged) {
      ge = my_word < total_words ? f.ge_words[my_word] : 0u;
      const auto c = static_cast<std::uint32_t>(__popc(ge));
      from = f.stage_at[b] + warp_inclusive_sum(c) - c;
      std::size_t s = from;
      for (std::uint32_t m = ge; m != 0; m &= m - 1) {
        const auto j = static_cast<unsigned>(__ffs(static_cast<int>(m)) - 1);
        const Key key = f.policy.key(f.stage[s++], e0 + j);
        gt |= static_cast<std::uint32_t>(key > t) << j;
        tie |= static_cast<std::uint32_t>(key == t) << j;
      }
    } else if (active) {
      read_x = true;
#pragma unroll 1
      for (unsigned i0 = 0; i0 < 32; i0 += 8) {
        T v[8];
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) {
          const std::size_t e = base + (i0 + u) * 32 + lane;
          v[u] = e < n ? f.x[e] : T{};
        }
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) {
          const std::size_t e = base + (i0 + u) * 32 + lane;
          const Key key = f.policy.key(v[u], e);
          const std::uint32_t mg = __ballot_sync(full_warp, e < n && key > t);
          const std::uint32_t mt = __ballot_sync(full_warp, e < n && key == t);
          if (lane == i0 + u) {
            gt = mg;
            tie = mt;
          }
        }
      }
    }
    const auto my_ties = static_cast<std::uint32_t>(__popc(tie));
    const std::uint32_t above = warp_sum(static_cast<std::uint32_t>(__popc(gt)));
    const std::uint32_t ties_upto_me = warp_inclusive_sum(my_ties);
    const std::uint32_t ties = __shfl_sync(full_warp, ties_upto_me, 31);
    if (lane == 0) {
      warp_above[warp] = above;
      warp_ties[warp] = ties;
    }
    __syncthreads();
    if (warp == 0) {
      const std::uint32_t a = lane < fast_warps ? warp_above[lane] : 0u;
      const std::uint32_t tt = lane < fast_warps ? warp_ties[lane] : 0u;
      const std::uint32_t tile_above = warp_total(a), tile_ties = warp_total(tt);
      const block_prefix p = tile_lookback(tile_cells(f.cells), tile, tile_above, tile_ties);
      if (lane == 0) {
        before_above = p.above;
        before_ties = p.ties;
      }
    }
    __syncthreads();
    block_prefix before;
    before.above = before_above;
    before.ties = before_ties;
    for (unsigned q = 0; q < warp; ++q) {
      before.above += warp_above[q];
      before.ties += warp_ties[q];
    }
    __syncthreads();  // the shared counts are rewritten by the next tile
    if (!active) continue;
    // The ties this block keeps are its first `allowed`: lane i keeps those of its word that
    // come before that count.
    const std::uint32_t allowed = ties_in_block(ties_kept, before.ties, ties);
    const std::uint32_t ties_before_me = ties_upto_me - my_ties;
    std::uint32_t keep = allowed > ties_before_me ? allowed - ties_before_me : 0u;
    std::uint32_t kept = gt;
    for (std::uint32_t m = tie; m != 0 && keep != 0; m &= m - 1, --keep)
      kept |= m & (~m + 1u);
    const auto count = static_cast<std::uint32_t>(__popc(kept));
    const std::size_t start =
        before.above +
        (before.ties < ties_kept ? before.ties : static_cast<std::uint32_t>(ties_kept));
    std::size_t at = start + warp_inclusive_sum(count) - count;
    if (f.words != nullptr) {
      if (my_word < total_words) f.words[my_word] = kept;
      if (lane == 0) f.offsets[b] = static_cast<std::uint32_t>(start);
    }
    if (staged) {
      std::size_t s = from;
      for (std::uint32_t m = ge; m != 0; m &= m - 1) {
        const auto j = static_cast<unsigned>(__ffs(static_cast<int>(m)) - 1);
        const T v = f.stage[s++];
        if ((kept >> j & 1u) == 0) continue;
        f.values[at] = v;
        if (f.index != nullptr) f.index[at] = static_cast<std::uint32_t>(e0 + j);
        ++at;
      }
    } else {
      for (std::uint32_t m = kept; m != 0; m &= m - 1) {
        const std::size_t e = e0 + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1);
        f.values[at] = f.x[e];
        if (f.index != nullptr) f.index[at] = static_cast<std::uint32_t>(e);
        ++at;
      }
    }
  }
  if (read_x) atomicOr(&cta_read_x, 1u);
  __syncthreads();
  if (threadIdx.x == 0 && cta_read_x != 0) atomicAdd(&ctl->read_x, 1u);
  if (!last_cta(&ctl->done)) return;
  if (threadIdx.x == 0) {
    zero_gaps(f.payload, f.gaps);
    ctl->worked |= step_compact;
    if (atomic_load(&ctl->read_x) != 0) ++ctl->x_passes;
  }
}

// ---- restore ----------------------------------------------------------------------------------

/// Writes block `base`'s outputs from per-lane words (`m`, lane i holds word i) and their
/// offsets into the values: lane j writes element 32 i + j of word i, so stores coalesce.
template <class T>
__device__ __forceinline__ void expand_warp(const T* __restrict__ values, std::uint32_t m,
                                            std::uint32_t offset, std::size_t base, std::size_t n,
                                            T* __restrict__ out, restore_value<T> op) {
  const unsigned lane = lane_id();
#pragma unroll 8
  for (unsigned i = 0; i < 32; ++i) {
    const std::uint32_t mi = __shfl_sync(full_warp, m, i);
    const std::uint32_t oi = __shfl_sync(full_warp, offset, i);
    const std::size_t e = base + i * 32 + lane;
    if (e < n) {
      out[e] = (mi >> lane) & 1u
                   ? op(values[oi + static_cast<std::uint32_t>(__popc(mi & lanes_below()))])
                   : T{};
    }
  }
}

/// Restore from the bitmask encoding, one warp per block of 1024.
template <class T>
__global__ void __launch_bounds__(fast_threads)
    expand_bitmask_kernel(const T* __restrict__ values, const std::uint32_t* __restrict__ words,
                          const std::uint32_t* __restrict__ offsets, std::size_t n,
                          std::size_t blocks, T* __restrict__ out, restore_value<T> op) {
  const std::size_t total_words = (n + word_elements - 1) / word_elements;
  for (std::size_t b = first_warp_block(); b < blocks; b += warp_block_stride()) {
    const std::size_t w = b * 32 + lane_id();
    const std::uint32_t m = w < total_words ? words[w] : 0u;
    const auto c = static_cast<std::uint32_t>(__popc(m));
    const std::uint32_t offset = offsets[b] + warp_inclusive_sum(c) - c;
    expand_warp(values, m, offset, b * block_elements, n, out, op);
  }
}

/// Restore from the index list, one warp per block of 1024: the block's entries become 32 words
/// in shared memory, then the block is written as from a bitmask.
template <class T>
__global__ void __launch_bounds__(fast_threads)
    expand_index_kernel(const T* __restrict__ values, const std::uint32_t* __restrict__ index,
                        const std::uint32_t* __restrict__ first, std::size_t n, std::size_t k,
                        std::size_t blocks, T* __restrict__ out, restore_value<T> op) {
  __shared__ std::uint32_t masks[fast_warps][32];
  std::uint32_t* mine = masks[threadIdx.x / 32];
  const unsigned lane = lane_id();
  for (std::size_t b = first_warp_block(); b < blocks; b += warp_block_stride()) {
    const std::uint32_t f = first[b];
    const auto l = b + 1 < blocks ? first[b + 1] : static_cast<std::uint32_t>(k);
    const auto base = static_cast<std::uint32_t>(b * block_elements);
    mine[lane] = 0;
    __syncwarp();
    for (std::uint32_t j = f + lane; j < l; j += 32) {
      const std::uint32_t r = index[j] - base;
      atomicOr(&mine[r / 32], 1u << (r % 32));
    }
    __syncwarp();
    const std::uint32_t m = mine[lane];
    __syncwarp();
    const auto c = static_cast<std::uint32_t>(__popc(m));
    expand_warp(values, m, f + warp_inclusive_sum(c) - c, base, n, out, op);
  }
}

// ---- Elias-Fano ------------------------------------------------------------------------------

/// Bits [j l, j l + l) of the low array.
__device__ __forceinline__ std::uint64_t ef_low_of(const std::uint64_t* __restrict__ low,
                                                   std::size_t j, unsigned l) {
  const std::size_t bit = j * l;
  const auto off = static_cast<unsigned>(bit % 64);
  std::uint64_t v = low[bit / 64] >> off;
  if (off + l > 64) v |= low[bit / 64 + 1] << (64 - off);
  return v & ((std::uint64_t{1} << l) - 1);
}

/**
 * Encode, one warp per block of 1024: lane i takes bitmask word i, its first rank from the block
 * offset and a warp scan, and ORs each kept element's high bit and low bits into the code, which
 * the compact kernel zeroed (a lane gathers bits while they land in one word: one atomic per
 * word it touches). The same bits as `ef_encode_block`.
 */
__global__ void __launch_bounds__(fast_threads) ef_encode_kernel(ef_encode_fn f) {
  const ef_shape s = f.s;
  const std::size_t total_words = (s.n + word_elements - 1) / word_elements;
  const std::size_t blocks = (s.n + block_elements - 1) / block_elements;
  const unsigned l = s.l;
  const std::uint64_t low_mask = (std::uint64_t{1} << l) - 1;
  for (std::size_t c = first_warp_block(); c < blocks; c += warp_block_stride()) {
    const std::size_t w = c * 32 + lane_id();
    const std::uint32_t m = w < total_words ? f.words[w] : 0u;
    const auto cnt = static_cast<std::uint32_t>(__popc(m));
    std::size_t j = f.counts[c] + warp_inclusive_sum(cnt) - cnt;
    if (lane_id() == 0 && c % ef_sub_blocks == 0) f.ef_offsets[c / ef_sub_blocks] = f.counts[c];
    std::size_t hw = ~std::size_t{0}, lw = ~std::size_t{0};
    std::uint64_t hacc = 0, lacc = 0;
    for (std::uint32_t mm = m; mm != 0; mm &= mm - 1, ++j) {
      const std::size_t i = w * 32 + static_cast<std::size_t>(__ffs(static_cast<int>(mm)) - 1);
      const std::size_t u = (i >> l) + j;
      if (u / 64 != hw) {
        if (hacc != 0) atomicOr(reinterpret_cast<unsigned long long*>(f.high + hw), hacc);
        hw = u / 64;
        hacc = 0;
      }
      hacc |= std::uint64_t{1} << (u % 64);
      if (l != 0) {
        const std::uint64_t v = i & low_mask;
        const std::size_t bit = j * l;
        const auto off = static_cast<unsigned>(bit % 64);
        if (bit / 64 != lw) {
          if (lacc != 0) atomicOr(reinterpret_cast<unsigned long long*>(f.low + lw), lacc);
          lw = bit / 64;
          lacc = 0;
        }
        lacc |= v << off;
        if (off + l > 64 && (v >> (64 - off)) != 0)
          atomicOr(reinterpret_cast<unsigned long long*>(f.low + lw + 1), v >> (64 - off));
      }
    }
    if (hacc != 0) atomicOr(reinterpret_cast<unsigned long long*>(f.high + hw), hacc);
    if (lacc != 0) atomicOr(reinterpret_cast<unsigned long long*>(f.low + lw), lacc);
  }
}

/// Threads of the decode kernel: one per bitmask word of an Elias-Fano block.
inline constexpr int ef_threads = static_cast<int>(ef_block_words);

/**
 * Decode, one CTA per Elias-Fano block: each thread takes words of the block's part of the high
 * array (masked to its entries' bits), a block scan gives each set bit its rank, and the entries
 * are ORed into the block's bitmask in shared memory; then thread i writes bitmask word i and
 * each warp's lane 0 the running count of its block of 1024. The bytes of `ef_decode_block`.
 */
__global__ void __launch_bounds__(ef_threads) ef_decode_kernel(ef_decode_fn f) {
  using scan = cub::BlockScan<unsigned, ef_threads>;
  __shared__ typename scan::TempStorage temp;
  __shared__ std::uint32_t bits[ef_block_words];
  __shared__ unsigned sub_count[ef_sub_blocks];
  const ef_shape s = f.s;
  const std::size_t blocks = s.blocks();
  const std::size_t total_words = (s.n + word_elements - 1) / word_elements;
  const unsigned l = s.l;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t start = b * ef_block_elements;
    const bool last = b + 1 == blocks;
    const std::size_t kb = f.ef_offsets[b];
    const std::size_t kb1 = last ? s.k : static_cast<std::size_t>(f.ef_offsets[b + 1]);
    bits[threadIdx.x] = 0;
    __syncthreads();
    if (kb1 > kb) {
      // The block's entries occupy high bits [hb, he): the next block's first entry sits at or
      // after ((start + ef_block_elements) >> l) + kb1.
      const std::size_t hb = (start >> l) + kb;
      const std::size_t he = last ? s.high_words * 64 : ((start + ef_block_elements) >> l) + kb1;
      const std::size_t w0 = hb / 64, w1 = (he + 63) / 64;
      std::size_t rank = kb;
      for (std::size_t c = w0; c < w1; c += ef_threads) {  // the same trip count in every thread
        const std::size_t w = c + threadIdx.x;
        std::uint64_t word = w < w1 ? f.high[w] : 0;
        if (w == w0) word &= ~std::uint64_t{0} << (hb % 64);
        if (w + 1 == w1 && he % 64 != 0) word &= (std::uint64_t{1} << (he % 64)) - 1;
        unsigned before = 0, total = 0;
        scan(temp).ExclusiveSum(static_cast<unsigned>(__popcll(word)), before, total);
        std::size_t j = rank + before;
        for (std::uint64_t m = word; m != 0; m &= m - 1, ++j) {
          const std::size_t u =
              w * 64 + static_cast<std::size_t>(__ffsll(static_cast<long long>(m)) - 1);
          std::size_t i = (u - j) << l;
          if (l != 0) i |= static_cast<std::size_t>(ef_low_of(f.low, j, l));
          const std::size_t local = i - start;
          atomicOr(&bits[local / 32], 1u << (local % 32));
        }
        rank += total;
        __syncthreads();  // the scan's storage is reused
      }
    }
    __syncthreads();
    const std::size_t w0 = start / word_elements;
    const std::size_t nw = total_words - w0 < ef_block_words ? total_words - w0 : ef_block_words;
    const std::uint32_t m = bits[threadIdx.x];
    if (threadIdx.x < nw + (nw & 1)) f.words[b * ef_block_words + threadIdx.x] = m;
    const std::uint32_t c = warp_sum(static_cast<std::uint32_t>(__popc(m)));
    if (lane_id() == 0) sub_count[threadIdx.x / 32] = c;
    __syncthreads();
    if (threadIdx.x < ef_sub_blocks && threadIdx.x * 32 < nw) {
      std::size_t run = kb;
      for (unsigned q = 0; q < threadIdx.x; ++q)
        run += sub_count[q];
      f.counts[b * ef_sub_blocks + threadIdx.x] = static_cast<std::uint32_t>(run);
    }
    __syncthreads();  // bits and sub_count are reused by the next block
  }
}

// ---- the steps that have a fast kernel ----------------------------------------------------

template <class P, class T, class Key>
struct fast_kernel<sample_fn<P, T, Key>> {
  static constexpr bool exists = true;
  static void launch(const sample_fn<P, T, Key>& f, cudaStream_t stream) {
    sample_kernel<<<1, sample_threads, 0, stream>>>(f);
  }
};
template <class P, class T, class Key>
struct fast_kernel<count_fn<P, T, Key>> {
  static constexpr bool exists = true;
  static void launch(const count_fn<P, T, Key>& f, cudaStream_t stream) {
    // One wave: each CTA clears and flushes its bucket histogram once.
    const std::size_t wanted = (f.blocks + fast_warps - 1) / fast_warps;
    const auto grid = static_cast<unsigned>(std::max<std::size_t>(
        1, std::min<std::size_t>(wanted, std::size_t{rt::sm_count()} * count_min_ctas)));
    count_kernel<<<grid, fast_threads, 0, stream>>>(f);
  }
};
template <class P, class T, class Key>
struct fast_kernel<radix_fn<P, T, Key>> {
  static constexpr bool exists = true;
  static void launch(const radix_fn<P, T, Key>& f, cudaStream_t stream) {
    radix_kernel<<<item_grid(f.n), fast_threads, 0, stream>>>(f);
  }
};
template <class Key>
struct fast_kernel<resolve_fn<Key>> {
  static constexpr bool exists = true;
  static void launch(const resolve_fn<Key>& f, cudaStream_t stream) {
    resolve_kernel<<<item_grid(f.slots), fast_threads, 0, stream>>>(f);
  }
};
template <class T>
struct fast_kernel<expand_bitmask_fn<T>> {
  static constexpr bool exists = true;
  static void launch(const expand_bitmask_fn<T>& f, cudaStream_t stream) {
    const std::size_t blocks = (f.n + block_elements - 1) / block_elements;
    expand_bitmask_kernel<<<warp_grid(blocks), fast_threads, 0, stream>>>(
        f.values, f.words, f.offsets, f.n, blocks, f.out, f.op);
  }
};
template <class T>
struct fast_kernel<expand_index_fn<T>> {
  static constexpr bool exists = true;
  static void launch(const expand_index_fn<T>& f, cudaStream_t stream) {
    const std::size_t blocks = (f.n + block_elements - 1) / block_elements;
    expand_index_kernel<<<warp_grid(blocks), fast_threads, 0, stream>>>(
        f.values, f.index, f.first, f.n, f.k, blocks, f.out, f.op);
  }
};
template <class P, class T, class Key>
struct fast_kernel<compact_fn<P, T, Key>> {
  static constexpr bool exists = true;
  static void launch(const compact_fn<P, T, Key>& f, cudaStream_t stream) {
    compact_kernel<<<warp_grid(f.blocks), fast_threads, 0, stream>>>(f);
  }
};

template <>
struct fast_kernel<ef_encode_fn> {
  static constexpr bool exists = true;
  static void launch(const ef_encode_fn& f, cudaStream_t stream) {
    ef_encode_kernel<<<warp_grid((f.s.n + block_elements - 1) / block_elements), fast_threads, 0,
                       stream>>>(f);
  }
};
template <>
struct fast_kernel<ef_decode_fn> {
  static constexpr bool exists = true;
  static void launch(const ef_decode_fn& f, cudaStream_t stream) {
    const std::size_t blocks = f.s.blocks();
    const auto grid = static_cast<unsigned>(
        std::max<std::size_t>(1, std::min<std::size_t>(blocks, std::size_t{rt::sm_count()} * 8)));
    ef_decode_kernel<<<grid, ef_threads, 0, stream>>>(f);
  }
};

}  // namespace dropit::detail::dev

#endif  // !DROPIT_CUDA_EMULATED
