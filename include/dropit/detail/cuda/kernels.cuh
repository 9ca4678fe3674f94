/**
 * @file kernels.cuh
 * @brief The fast path: kernels only nvcc compiles (warp ballots for mark, shared-memory
 * histograms, block-level CUB scans, the last CTA of a pass doing the pass's serial step). They
 * compute what the portable path computes, from the same step bodies, and produce the same bytes.
 *
 * Data movement per element of x (T bytes each):
 * - count_kernel: reads x once (plus the candidates again, from cache), writes 8 bytes per block
 *   of 1024 and the candidates;
 * - compact_kernel: reads x once, writes the kept values, the bitmask (1 bit) or indices;
 * - expand_*_kernel: reads the payload once, writes every output element once.
 */
#pragma once

#include <dropit/detail/cuda/config.hpp>

#if !DROPIT_CUDA_EMULATED

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

/// True in every thread of the CTA that finished last among the grid's CTAs (after a fence, so
/// it sees every other CTA's atomics). Resets the counter for the next pass.
__device__ __forceinline__ bool last_cta(unsigned* done) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// ---- count ------------------------------------------------------------------------------------

/// Count pass, one warp per block of 1024: ballots classify 32 keys at a time; the warp's
/// candidates take one atomic per block. The last CTA decides.
template <class P, class T, class Key>
__global__ void __launch_bounds__(fast_threads)
    count_kernel(P policy, const T* __restrict__ x, std::size_t n, std::size_t blocks,
                 select_ctl<Key>* ctl, std::uint32_t* __restrict__ above,
                 std::uint32_t* __restrict__ within, Key* __restrict__ cand_key,
                 std::uint32_t* __restrict__ cand_index) {
  __shared__ unsigned long long cta_above[fast_warps], cta_within[fast_warps];
  if (!ctl->counting()) return;  // the same in every CTA: only the last CTA changes the mode
  const Key lo = ctl->lo, hi = ctl->hi;
  const bool collect = lo != hi;
  const unsigned parts = ctl->parts;
  const std::size_t part_cap = ctl->part_cap;
  const unsigned lane = lane_id();
  unsigned long long warp_above = 0, warp_within = 0;
  for (std::size_t b = first_warp_block(); b < blocks; b += warp_block_stride()) {
    const std::size_t base = b * block_elements;
    std::uint32_t my_mask = 0, a = 0, w = 0;
#pragma unroll 1
    for (unsigned i0 = 0; i0 < 32; i0 += 8) {
      T v[8];
#pragma unroll
      for (unsigned u = 0; u < 8; ++u) {
        const std::size_t e = base + (i0 + u) * 32 + lane;
        v[u] = e < n ? x[e] : T{};
      }
#pragma unroll
      for (unsigned u = 0; u < 8; ++u) {
        const std::size_t e = base + (i0 + u) * 32 + lane;
        bool is_above = false, is_within = false;
        if (e < n) {
          const Key key = policy.key(v[u], e);
          is_above = key > hi;
          is_within = !is_above && key >= lo;
        }
        const std::uint32_t ma = __ballot_sync(full_warp, is_above);
        const std::uint32_t mw = __ballot_sync(full_warp, is_within);
        a += static_cast<std::uint32_t>(__popc(ma));
        w += static_cast<std::uint32_t>(__popc(mw));
        if (lane == i0 + u) my_mask = mw;
      }
    }
    if (lane == 0) {
      above[b] = a;
      within[b] = w;
    }
    warp_above += a;
    warp_within += w;
    if (collect && w != 0) {
      const std::size_t p = b % parts;
      const auto c = static_cast<std::uint32_t>(__popc(my_mask));
      const std::uint32_t before = warp_inclusive_sum(c) - c;
      unsigned long long start = 0;
      if (lane == 0) start = atomicAdd(&ctl->part_count[p], static_cast<unsigned long long>(w));
      start = __shfl_sync(full_warp, start, 0);
      std::size_t slot = static_cast<std::size_t>(start) + before;
      Key* keys = cand_key + p * part_cap;
      std::uint32_t* index = cand_index + p * part_cap;
      const std::size_t e0 = base + lane * 32;
      for (std::uint32_t m = my_mask; m != 0 && slot < part_cap; m &= m - 1, ++slot) {
        const std::size_t e = e0 + static_cast<std::size_t>(__ffs(static_cast<int>(m)) - 1);
        keys[slot] = policy.key(x[e], e);
        index[slot] = static_cast<std::uint32_t>(e);
      }
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
  if (!last_cta(&ctl->done)) return;
  bool fits = true;
  for (unsigned p = threadIdx.x; p < parts; p += blockDim.x)
    fits = fits && atomic_load(&ctl->part_count[p]) <= part_cap;
  fits = __syncthreads_and(fits) != 0;
  if (threadIdx.x == 0) {
    ctl->decide(atomic_load(&ctl->above_total), atomic_load(&ctl->within_total), fits);
    ctl->done = 0;
  }
}

// ---- radix passes -------------------------------------------------------------------------

/**
 * The last CTA's step of a radix pass: suffix sums over the 2048 bins (one CUB block scan) find
 * the bucket `radix_state::advance` would pick; then the state advances and the histogram clears.
 */
template <class Src, class Key>
__device__ void block_advance(select_ctl<Key>* ctl, unsigned long long* hist, bool last) {
  using scan = cub::BlockScan<unsigned long long, fast_threads>;
  constexpr unsigned per = radix_bins / fast_threads;
  __shared__ typename scan::TempStorage temp;
  __shared__ unsigned pick;
  __shared__ unsigned long long pick_above, pick_bucket;
  auto& s = Src::state(*ctl);
  const std::size_t rank = s.rank;
  // Thread t holds digits [d0, d0 + per) with thread 0 on the top ones, so an exclusive sum in
  // thread order counts the keys with a larger digit.
  const unsigned d0 = (fast_threads - 1 - threadIdx.x) * per;
  unsigned long long h[per];
  unsigned long long mine = 0;
#pragma unroll
  for (unsigned j = 0; j < per; ++j) {
    h[j] = atomic_load(&hist[d0 + j]);
    mine += h[j];
  }
  unsigned long long above_d = 0;
  scan(temp).ExclusiveSum(mine, above_d);
#pragma unroll
  for (int j = per - 1; j >= 0; --j) {
    const unsigned long long from_d = above_d + h[j];
    if (radix_picks(from_d, above_d, rank, d0 + j)) {
      pick = d0 + j;
      pick_above = above_d;
      pick_bucket = h[j];
    }
    above_d = from_d;
  }
  __syncthreads();
  for (unsigned d = threadIdx.x; d < radix_bins; d += blockDim.x)
    hist[d] = 0;
  if (threadIdx.x == 0) {
    radix_advance_to(s, pick, pick_above, pick_bucket);
    if (last) Src::finish(*ctl);
    ctl->done = 0;
  }
}

/// One radix pass over a source: shared-memory histogram per CTA, merged into `hist`; the last
/// CTA advances the state.
template <class Src, class Key>
__global__ void __launch_bounds__(fast_threads)
    radix_pass_kernel(Src src, select_ctl<Key>* ctl, unsigned long long* hist, bool last) {
  __shared__ unsigned bins[radix_bins];
  if (!Src::active(*ctl)) return;
  const auto s = Src::state(*ctl);
  for (unsigned d = threadIdx.x; d < radix_bins; d += blockDim.x)
    bins[d] = 0;
  __syncthreads();
  const std::size_t items = src.items();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += stride) {
    typename Src::key_type key;
    if (src.get(*ctl, i, key) && s.matches(key)) atomicAdd(&bins[s.digit(key)], 1u);
  }
  __syncthreads();
  for (unsigned d = threadIdx.x; d < radix_bins; d += blockDim.x) {
    if (bins[d] != 0) atomicAdd(&hist[d], static_cast<unsigned long long>(bins[d]));
  }
  if (!last_cta(&ctl->done)) return;
  block_advance<Src>(ctl, hist, last);
}

// ---- ties -------------------------------------------------------------------------------------

/// ties mode: one CTA of 1024 threads scans the block that holds the last kept tie.
template <class P, class T, class Key>
__global__ void __launch_bounds__(1024)
    ties_kernel(P policy, const T* __restrict__ x, std::size_t n, std::size_t blocks,
                select_ctl<Key>* ctl, const std::uint32_t* __restrict__ within_prefix) {
  using scan = cub::BlockScan<unsigned, 1024>;
  __shared__ typename scan::TempStorage temp;
  __shared__ std::size_t block, need;
  if (ctl->mode != mode_ties) return;
  if (threadIdx.x == 0) {
    block = block_reaching(within_prefix, blocks, ctl->ties_kept);
    need = ctl->ties_kept - (block == 0 ? 0 : within_prefix[block - 1]);
  }
  __syncthreads();
  const std::size_t i = block * block_elements + threadIdx.x;
  const unsigned tie = i < n && policy.key(x[i], i) == ctl->th.t ? 1u : 0u;
  unsigned seen = 0;
  scan(temp).InclusiveSum(tie, seen);
  if (tie != 0 && seen == need) {
    ctl->th.cut = i + 1;
    ctl->cut_block = block;
    ctl->cut_block_ties = need;
  }
}

// ---- compact ----------------------------------------------------------------------------------

/// Mark + compact, one warp per block of 1024: lane j marks element 32 i + j of word i, the
/// ballot is the word, and each kept value goes to its rank among the word's kept lanes.
template <bool Bitmask, class P, class T, class Key>
__global__ void __launch_bounds__(fast_threads)
    compact_kernel(P policy, const T* __restrict__ x, std::size_t n, std::size_t blocks,
                   const select_ctl<Key>* ctl, const std::uint32_t* __restrict__ block_start,
                   T* __restrict__ values, std::uint32_t* __restrict__ positions) {
  const threshold<Key> th = ctl->th;
  const std::size_t words = (n + word_elements - 1) / word_elements;
  const unsigned lane = lane_id();
  for (std::size_t b = first_warp_block(); b < blocks; b += warp_block_stride()) {
    const std::size_t base = b * block_elements;
    std::uint32_t at = block_start[b];
    std::uint32_t my_word = 0;
#pragma unroll 1
    for (unsigned i0 = 0; i0 < 32; i0 += 8) {
      T v[8];
#pragma unroll
      for (unsigned u = 0; u < 8; ++u) {
        const std::size_t e = base + (i0 + u) * 32 + lane;
        v[u] = e < n ? x[e] : T{};
      }
#pragma unroll
      for (unsigned u = 0; u < 8; ++u) {
        const std::size_t e = base + (i0 + u) * 32 + lane;
        const bool keep = e < n && th.keeps(policy.key(v[u], e), e);
        const std::uint32_t m = __ballot_sync(full_warp, keep);
        if (lane == i0 + u) my_word = m;
        if (keep) {
          const std::uint32_t r = at + static_cast<std::uint32_t>(__popc(m & lanes_below()));
          values[r] = v[u];
          if constexpr (!Bitmask) positions[r] = static_cast<std::uint32_t>(e);
        }
        at += static_cast<std::uint32_t>(__popc(m));
      }
    }
    if constexpr (Bitmask) {
      const std::size_t w = b * 32 + lane;
      if (w < words) positions[w] = my_word;
    }
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

}  // namespace dropit::detail::dev

#endif  // !DROPIT_CUDA_EMULATED
