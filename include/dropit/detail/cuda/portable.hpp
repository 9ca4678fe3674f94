/**
 * @file portable.hpp
 * @brief The portable path's per-item bodies: Thrust runs them with `for_each` on any device
 * system (CUDA, or OpenMP in the emulated build). Each is a thin loop around the shared steps
 * (steps.hpp, selection.hpp); one item is an element, a candidate slot, or a block of 1024.
 */
#pragma once

#include <dropit/detail/cuda/selection.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <new>

namespace dropit::detail::dev {

/// Sample j: the key of a position drawn in the j-th of S equal strata of [0, n).
template <class P, class T, class Key>
struct sample_fn {
  P policy;
  const T* x;
  std::size_t n;
  std::size_t samples;
  Key* out;
  DROPIT_HD void operator()(std::size_t j) const {
    const std::size_t begin = j * n / samples;
    const std::size_t width = (j + 1) * n / samples - begin;
    const std::size_t i = begin + static_cast<std::size_t>(mix64(j) % width);
    out[j] = policy.key(x[i], i);
  }
};

/// Builds the control block and reads the guessed range off the sorted (descending) sample.
template <class Key>
struct guess_fn {
  select_ctl<Key>* ctl;
  const Key* sorted;
  std::size_t samples;
  long long hi_rank;  ///< sample rank of hi; < 0: the largest key
  long long lo_rank;  ///< sample rank of lo; >= samples: key 0
  std::size_t n;
  std::size_t k;
  unsigned parts;
  std::size_t part_cap;
  bool forced;
  DROPIT_HD void operator()(std::size_t) const {
    auto* c = ::new (static_cast<void*>(ctl)) select_ctl<Key>(n, k, parts, part_cap);
    c->hi = hi_rank < 0 ? static_cast<Key>(~Key{0}) : sorted[hi_rank];
    c->lo = lo_rank >= static_cast<long long>(samples) ? Key{0} : sorted[lo_rank];
    c->forced = forced;
  }
};

/// Count pass over block b: keys above hi, keys in [lo, hi], candidates into partition b % parts.
template <class P, class T, class Key>
struct count_fn {
  P policy;
  const T* x;
  std::size_t n;
  select_ctl<Key>* ctl;
  std::uint32_t* above;
  std::uint32_t* within;
  Key* cand_key;
  std::uint32_t* cand_index;
  DROPIT_HD void operator()(std::size_t b) const {
    select_ctl<Key>& c = *ctl;
    if (!c.counting()) return;
    const Key lo = c.lo, hi = c.hi;
    const std::size_t begin = b * block_elements, end = block_end(b, n);
    std::uint32_t a = 0, w = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const Key key = policy.key(x[i], i);
      a += static_cast<std::uint32_t>(key > hi);
      w += static_cast<std::uint32_t>(key <= hi && key >= lo);
    }
    above[b] = a;
    within[b] = w;
    atomic_add(&c.above_total, static_cast<unsigned long long>(a));
    atomic_add(&c.within_total, static_cast<unsigned long long>(w));
    if (w == 0 || !c.collecting()) return;
    const std::size_t p = b % c.parts;
    auto slot =
        static_cast<std::size_t>(atomic_add(&c.part_count[p], static_cast<unsigned long long>(w)));
    Key* keys = cand_key + p * c.part_cap;
    std::uint32_t* index = cand_index + p * c.part_cap;
    for (std::size_t i = begin; i < end && slot < c.part_cap; ++i) {
      const Key key = policy.key(x[i], i);
      if (key <= hi && key >= lo) {
        keys[slot] = key;
        index[slot] = static_cast<std::uint32_t>(i);
        ++slot;
      }
    }
  }
};

/// After a count pass: picks cand, ties or fallback.
template <class Key>
struct decide_fn {
  select_ctl<Key>* ctl;
  DROPIT_HD void operator()(std::size_t) const {
    select_ctl<Key>& c = *ctl;
    if (!c.counting()) return;
    bool fits = true;
    for (unsigned p = 0; p < c.parts; ++p)
      fits = fits && c.part_count[p] <= c.part_cap;
    c.decide(c.above_total, c.within_total, fits);
  }
};

/// Histogram of item i's digit when the source is active (global atomics).
template <class Src, class Key>
struct radix_histogram_fn {
  Src src;
  select_ctl<Key>* ctl;
  unsigned long long* hist;
  DROPIT_HD void operator()(std::size_t i) const {
    select_ctl<Key>& c = *ctl;
    if (!Src::active(c)) return;
    typename Src::key_type key;
    if (!src.get(c, i, key)) return;
    const auto& s = Src::state(c);
    if (s.matches(key)) atomic_add(&hist[s.digit(key)], 1ull);
  }
};

/// Consumes the histogram of a pass (the serial `radix_state::advance`) and clears it.
template <class Src, class Key>
struct radix_advance_fn {
  select_ctl<Key>* ctl;
  unsigned long long* hist;
  bool last;
  DROPIT_HD void operator()(std::size_t) const {
    select_ctl<Key>& c = *ctl;
    if (!Src::active(c)) return;
    Src::state(c).advance(hist);
    for (unsigned d = 0; d < radix_bins; ++d)
      hist[d] = 0;
    if (last) Src::finish(c);
  }
};

/// ties mode: finds the index after the last kept tie from the per-block tie counts.
template <class P, class T, class Key>
struct ties_fn {
  P policy;
  const T* x;
  std::size_t n;
  std::size_t blocks;
  select_ctl<Key>* ctl;
  const std::uint32_t* within_prefix;  ///< inclusive prefix of the per-block counts of key == t
  DROPIT_HD void operator()(std::size_t) const {
    select_ctl<Key>& c = *ctl;
    if (c.mode != mode_ties) return;
    const std::size_t b = block_reaching(within_prefix, blocks, c.ties_kept);
    const std::size_t need = c.ties_kept - (b == 0 ? 0 : within_prefix[b - 1]);
    const std::size_t end = block_end(b, n);
    std::size_t seen = 0, i = b * block_elements;
    for (; i < end; ++i) {
      seen += static_cast<std::size_t>(policy.key(x[i], i) == c.th.t);
      if (seen == need) break;
    }
    c.th.cut = i + 1;
    c.cut_block = b;
    c.cut_block_ties = need;
  }
};

/// Kept count of block b without the candidates: keys above hi, plus the kept ties (ties mode).
template <class Key>
struct kept_init_fn {
  const select_ctl<Key>* ctl;
  const std::uint32_t* above;
  const std::uint32_t* within;
  std::uint32_t* kept;
  DROPIT_HD void operator()(std::size_t b) const {
    const select_ctl<Key>& c = *ctl;
    std::uint32_t v = above[b];
    if (c.mode == mode_ties) {
      if (b < c.cut_block) {
        v += within[b];
      } else if (b == c.cut_block) {
        v += static_cast<std::uint32_t>(c.cut_block_ties);
      }
    }
    kept[b] = v;
  }
};

/// cand mode: adds kept candidate j to its block's count.
template <class Key>
struct kept_candidate_fn {
  const select_ctl<Key>* ctl;
  const Key* keys;
  const std::uint32_t* index;
  std::uint32_t* kept;
  DROPIT_HD void operator()(std::size_t j) const {
    const select_ctl<Key>& c = *ctl;
    if (c.mode != mode_cand || !c.valid(j) || !c.th.keeps(keys[j], index[j])) return;
    atomic_add(&kept[index[j] / block_elements], 1u);
  }
};

/// Mark + compact of block b (bitmask when `words` is set, else the index list).
template <class P, class T, class Key>
struct compact_fn {
  P policy;
  const T* x;
  std::size_t n;
  const select_ctl<Key>* ctl;
  const std::uint32_t* block_start;
  T* values;
  std::uint32_t* words;
  std::uint32_t* index;
  DROPIT_HD void operator()(std::size_t b) const {
    const threshold<Key> th = ctl->th;
    if (words != nullptr) {
      compact_block_bitmask(policy, x, n, b, th, block_start[b], values, words);
    } else {
      compact_block_index(policy, x, n, b, th, block_start[b], values, index);
    }
  }
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
