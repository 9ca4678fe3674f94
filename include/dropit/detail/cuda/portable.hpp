/**
 * @file portable.hpp
 * @brief The portable path's per-item bodies: Thrust runs them with `for_each` on any device
 * system (CUDA, or OpenMP in the emulated build), one launch per step of selection.hpp; one item
 * is an element, a candidate slot, or a block of 1024. A step's serial part (deciding, advancing
 * a radix digit, selecting in the small buffer) runs in the item that finishes last.
 */
#pragma once

#include <dropit/detail/cuda/selection.hpp>
#include <dropit/detail/elias_fano.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <new>

namespace dropit::detail::dev {

/// The sampled positions: sample j lies in the j-th of S equal strata of [0, n).
[[nodiscard]] DROPIT_HD inline std::size_t sample_position(std::size_t j, std::size_t n,
                                                           std::size_t samples) noexcept {
  if (samples == n) return j;
  const std::size_t begin = j * n / samples;
  const std::size_t width = (j + 1) * n / samples - begin;
  return begin + static_cast<std::size_t>(mix64(j) % width);
}

/// What the sample step needs to build the control block.
template <class Key>
struct sample_setup {
  std::size_t n;
  std::size_t k;
  std::size_t samples;
  long long hi_rank;  ///< rank of hi in the descending sample; < 0: the largest key
  long long lo_rank;  ///< rank of lo; >= samples: key 0
  unsigned parts;
  std::size_t part_cap;
  std::size_t small_cap;
  std::size_t stage_cap;
  bool forced;
};

/// Builds the control block from the sampled keys once they are ordered so that their
/// lo_rank-th and hi_rank-th largest are in place.
template <class Key>
DROPIT_HD void setup_ctl(select_ctl<Key>* ctl, const sample_setup<Key>& s,
                         const Key* sample) noexcept {
  auto* c = ::new (static_cast<void*>(ctl))
      select_ctl<Key>(s.n, s.k, s.parts, s.part_cap, s.small_cap, s.stage_cap);
  c->set_range(s.lo_rank >= static_cast<long long>(s.samples) ? Key{0} : sample[s.lo_rank],
               s.hi_rank < 0 ? static_cast<Key>(~Key{0}) : sample[s.hi_rank], bucket_bits);
  c->forced = s.forced;
}

/// Step 1 (one item): samples the keys, finds lo and hi, builds the control block and clears
/// the histograms.
template <class P, class T, class Key>
struct sample_fn {
  P policy;
  const T* x;
  sample_setup<Key> setup;
  Key* sample;
  select_ctl<Key>* ctl;
  unsigned long long* hist;  ///< histogram_bins: the candidate buckets, then the radix bins
  DROPIT_HD void operator()(std::size_t) const {
    const std::size_t s = setup.samples;
    for (std::size_t j = 0; j < s; ++j) {
      const std::size_t i = sample_position(j, setup.n, s);
      sample[j] = policy.key(x[i], i);
    }
    if (setup.lo_rank < static_cast<long long>(s))
      select_descending(sample, s, static_cast<std::size_t>(setup.lo_rank));
    if (setup.hi_rank >= 0 && setup.hi_rank < setup.lo_rank)
      select_descending(sample, static_cast<std::size_t>(setup.lo_rank),
                        static_cast<std::size_t>(setup.hi_rank));
    setup_ctl(ctl, setup, sample);
    for (unsigned d = 0; d < histogram_bins; ++d)
      hist[d] = 0;
  }
};

/// Step 2, block b: keys above hi and in [lo, hi]; candidates into partition b % parts and the
/// bucket histogram; the values of keys >= lo into the stage (when the plan stages); clears the
/// block's look-back cell. The last block decides.
template <class P, class T, class Key>
struct count_fn {
  P policy;
  const T* x;
  std::size_t n;
  std::size_t blocks;
  select_ctl<Key>* ctl;
  unsigned long long* hist;
  Key* cand_key;
  std::uint32_t* cand_index;
  lookback_cell* cells;
  T* stage;
  std::uint32_t* stage_at;
  std::uint32_t* ge_words;
  DROPIT_HD void operator()(std::size_t b) const {
    select_ctl<Key>& c = *ctl;
    if (c.mode != mode_count) return;
    cells[b].flag = lookback_cell::flag_none;
    const Key lo = c.lo, hi = c.hi;
    const std::size_t begin = b * block_elements, end = block_end(b, n);
    std::uint32_t a = 0, w = 0, ge = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const Key key = policy.key(x[i], i);
      a += static_cast<std::uint32_t>(key > hi);
      w += static_cast<std::uint32_t>(key <= hi && key >= lo);
      if (stage != nullptr) {
        ge |= static_cast<std::uint32_t>(key >= lo) << (i % word_elements);
        if (i % word_elements == word_elements - 1 || i + 1 == end) {
          ge_words[i / word_elements] = ge;
          ge = 0;
        }
      }
    }
    if (a != 0) atomic_add(&c.above_total, static_cast<unsigned long long>(a));
    if (w != 0) atomic_add(&c.within_total, static_cast<unsigned long long>(w));
    const bool collect = w != 0 && c.collecting();
    std::size_t slot = 0, part_end = 0;
    Key* keys = nullptr;
    std::uint32_t* index = nullptr;
    if (collect) {
      const std::size_t p = b % c.parts;
      slot = static_cast<std::size_t>(
          atomic_add(&c.part_count[p], static_cast<unsigned long long>(w)));
      part_end = c.part_cap;
      keys = cand_key + p * c.part_cap;
      index = cand_index + p * c.part_cap;
    }
    std::size_t staged = not_staged;
    if (stage != nullptr) {
      const auto at = static_cast<std::size_t>(
          atomic_add(&c.stage_used, static_cast<unsigned long long>(a + w)));
      if (at + a + w <= c.stage_cap) staged = at;
      stage_at[b] = static_cast<std::uint32_t>(staged);
    }
    if (collect || staged != not_staged) {
      std::size_t to = staged;
      for (std::size_t i = begin; i < end; ++i) {
        const Key key = policy.key(x[i], i);
        if (key < lo) continue;
        if (staged != not_staged) stage[to++] = x[i];
        if (collect && key <= hi && slot < part_end) {
          keys[slot] = key;
          index[slot] = static_cast<std::uint32_t>(i);
          atomic_add(&hist[c.bucket_of(key)], 1ull);
          ++slot;
        }
      }
    }
    if (!last_to_finish(&c.done, static_cast<unsigned>(blocks))) return;
    bool fits = true;
    for (unsigned p = 0; p < c.parts; ++p)
      fits = fits && c.part_count[p] <= c.part_cap;
    c.decide(c.above_total, c.within_total, fits,
             pick_bucket(hist, candidate_buckets, c.rank_below_hi(c.above_total)));
  }
};

/// Items of a step over `count` things, a block of 1024 of them each.
[[nodiscard]] DROPIT_HD inline std::size_t chunks_of(std::size_t count) noexcept {
  return (count + block_elements - 1) / block_elements;
}

/// Step 3 (fallback only), block b of x: one radix pass's histogram; the last block advances the
/// state (after the last digit, the threshold is set) and clears the histogram.
template <class P, class T, class Key>
struct radix_fn {
  P policy;
  const T* x;
  std::size_t n;
  select_ctl<Key>* ctl;
  unsigned long long* hist;
  DROPIT_HD void operator()(std::size_t b) const {
    select_ctl<Key>& c = *ctl;
    if (c.mode != mode_fallback) return;
    const radix_state<Key> s = c.state;
    for (std::size_t i = b * block_elements, end = block_end(b, n); i < end; ++i) {
      const Key key = policy.key(x[i], i);
      if (s.matches(key)) atomic_add(&hist[s.digit(key)], 1ull);
    }
    if (!last_to_finish(&c.done, static_cast<unsigned>(chunks_of(n)))) return;
    c.advance_radix(hist);
    for (unsigned d = 0; d < radix_bins; ++d)
      hist[d] = 0;
  }
};

/// Step 4 (resolve only), slots [1024 j, 1024 (j + 1)) of the candidate buffer: the keys of the
/// chosen bucket into the small buffer; the last item selects the bucket_rank-th largest, the
/// threshold.
template <class Key>
struct resolve_fn {
  select_ctl<Key>* ctl;
  const Key* cand_key;
  std::size_t slots;
  Key* small;
  DROPIT_HD void operator()(std::size_t chunk) const {
    select_ctl<Key>& c = *ctl;
    if (c.mode != mode_resolve) return;
    const std::size_t end =
        (chunk + 1) * block_elements < slots ? (chunk + 1) * block_elements : slots;
    for (std::size_t j = chunk * block_elements; j < end; ++j) {
      const std::size_t p = j / c.part_cap;
      if (j - p * c.part_cap < c.part_count[p] && c.bucket_of(cand_key[j]) == c.bucket)
        small[atomic_add(&c.small_count, 1ull)] = cand_key[j];
    }
    if (!last_to_finish(&c.done, static_cast<unsigned>(chunks_of(slots)))) return;
    c.resolve_bucket(small, static_cast<std::size_t>(c.small_count));
  }
};

/// Zeroes the (at most 15-byte) padding gaps of a payload, so that payloads compare byte for byte.
DROPIT_HD inline void zero_gaps(std::byte* payload, const padding_gaps& g) noexcept {
  for (int s = 0; s < padding_gaps::count; ++s) {
    for (std::size_t i = g.begin[s]; i < g.end[s]; ++i)
      payload[i] = std::byte{0};
  }
}

/**
 * Calls `f(i, value)` for the elements of block b that may be kept, in index order: from the
 * stage (the elements with a key >= lo) when the block is staged and the threshold came from the
 * guess (then t >= lo), else every element of x. Returns whether x was read.
 */
template <class T, class Key, class F>
DROPIT_HD bool for_each_eligible(const select_ctl<Key>& c, const T* x, std::size_t n, std::size_t b,
                                 const T* stage, const std::uint32_t* stage_at,
                                 const std::uint32_t* ge_words, F&& f) {
  const std::size_t begin = b * block_elements, end = block_end(b, n);
  if (stage != nullptr && c.path != path_fallback && stage_at[b] != not_staged) {
    const T* v = stage + stage_at[b];
    for (std::size_t w = begin / word_elements; w * word_elements < end; ++w) {
      for (std::uint32_t m = ge_words[w]; m != 0; m &= m - 1)
        f(w * word_elements + static_cast<std::size_t>(lowest_bit32(m)), *v++);
    }
    return false;
  }
  for (std::size_t i = begin; i < end; ++i)
    f(i, x[i]);
  return true;
}

/**
 * Step 5: the block of the next ticket (tickets go out in index order). Counts its keys above t
 * and equal to t, takes its offset from the look-back, then writes its kept values (keys above
 * t, and the ties the rank still allows, lowest index first) and its positions: the bitmask words
 * and the block offset, or the index list.
 */
template <class P, class T, class Key>
struct compact_fn {
  P policy;
  const T* x;
  std::size_t n;
  std::size_t blocks;
  select_ctl<Key>* ctl;
  lookback_cell* cells;
  const T* stage;
  const std::uint32_t* stage_at;
  const std::uint32_t* ge_words;
  std::byte* payload;  ///< the last item zeroes its padding
  padding_gaps gaps;
  T* values;
  std::uint32_t* words;    ///< bitmask encoding, else null
  std::uint32_t* offsets;  ///< bitmask encoding: kept before each block
  std::uint32_t* index;    ///< index-list encoding, else null
  /// Words the fast kernel zeroes for the fast Elias-Fano encode (which ORs its bits in); null on
  /// the portable path, whose encode writes whole words.
  std::uint64_t* clear = nullptr;
  std::size_t clear_words = 0;
  DROPIT_HD void operator()(std::size_t) const {
    select_ctl<Key>& c = *ctl;
    if (c.mode != mode_final) return;
    const auto b = static_cast<std::size_t>(atomic_add(&c.ticket, 1ull));
    const Key t = c.t;
    std::uint32_t above = 0, ties = 0;
    const bool read_x =
        for_each_eligible(c, x, n, b, stage, stage_at, ge_words, [&](std::size_t i, T v) {
          const Key key = policy.key(v, i);
          above += static_cast<std::uint32_t>(key > t);
          ties += static_cast<std::uint32_t>(key == t);
        });
    if (read_x) atomic_add(&c.read_x, 1u);
    lookback_publish(cells, b, above, ties);
    const block_prefix before = lookback_resolve(cells, b, above, ties);
    std::uint32_t ties_left = ties_in_block(c.ties_kept, before.ties, ties);
    std::size_t at = before.above + (before.ties < c.ties_kept ? before.ties : c.ties_kept);
    if (words != nullptr) {
      offsets[b] = static_cast<std::uint32_t>(at);
      const std::size_t end = block_end(b, n);
      for (std::size_t w = b * block_elements / word_elements; w * word_elements < end; ++w)
        words[w] = 0;
    }
    (void)for_each_eligible(c, x, n, b, stage, stage_at, ge_words, [&](std::size_t i, T v) {
      const Key key = policy.key(v, i);
      bool keep = key > t;
      if (key == t && ties_left != 0) {
        keep = true;
        --ties_left;
      }
      if (!keep) return;
      values[at] = v;
      if (index != nullptr) index[at] = static_cast<std::uint32_t>(i);
      if (words != nullptr) words[i / word_elements] |= std::uint32_t{1} << (i % word_elements);
      ++at;
    });
    if (!last_to_finish(&c.done, static_cast<unsigned>(blocks))) return;
    zero_gaps(payload, gaps);
    c.worked |= step_compact;
    if (c.read_x != 0) ++c.x_passes;
  }
};

/// The body that encodes Elias-Fano block b from a bitmask and its block offsets.
struct ef_encode_fn {
  ef_shape s;
  const std::uint32_t* words;
  const std::uint32_t* counts;
  std::uint64_t* low;
  std::uint64_t* high;
  std::uint32_t* ef_offsets;
  DROPIT_HD void operator()(std::size_t b) const {
    ef_encode_block(s, words, counts, b, low, high, ef_offsets);
  }
};

/// The body that decodes Elias-Fano block b into a bitmask and its block offsets.
struct ef_decode_fn {
  ef_shape s;
  const std::uint64_t* low;
  const std::uint64_t* high;
  const std::uint32_t* ef_offsets;
  std::uint32_t* words;
  std::uint32_t* counts;
  DROPIT_HD void operator()(std::size_t b) const {
    ef_decode_block(s, low, high, ef_offsets, b, words + b * ef_block_words,
                    counts + b * ef_sub_blocks);
  }
};

/// The fast kernel of a step's body, where nvcc builds one (kernels.cuh specialises this with
/// `launch(body, stream)`); elsewhere the body runs through Thrust.
template <class Body>
struct fast_kernel {
  static constexpr bool exists = false;
};

/// Restore of block b from the bitmask encoding.
template <class T>
struct expand_bitmask_fn {
  const T* values;
  const std::uint32_t* words;
  const std::uint32_t* offsets;
  std::size_t n;
  T* out;
  restore_value<T> op;
  DROPIT_HD void operator()(std::size_t b) const {
    expand_block_bitmask(values, words, n, b, offsets[b], out, op);
  }
};

/// Restore of block b from the index list; `first[b]` is the first entry >= b * 1024.
template <class T>
struct expand_index_fn {
  const T* values;
  const std::uint32_t* index;
  const std::uint32_t* first;
  std::size_t n;
  std::size_t k;
  T* out;
  restore_value<T> op;
  DROPIT_HD void operator()(std::size_t b) const {
    expand_index_range(values, index, k, first[b], b * block_elements, block_end(b, n), out, op);
  }
};

/// b * 1024 (the first element of block b), for the vectorized lower_bound of restore.
struct block_begin_fn {
  DROPIT_HD std::uint32_t operator()(std::uint32_t b) const noexcept {
    return b * static_cast<std::uint32_t>(block_elements);
  }
};

/// Dense restore with a scale (k = n).
template <class T>
struct scale_fn {
  restore_value<T> op;
  DROPIT_HD T operator()(T v) const noexcept { return op(v); }
};

}  // namespace dropit::detail::dev
