/**
 * @file select.hpp
 * @brief The host's exact selection: radix select of the k-th largest key over all cores, the
 * tie cut, and the kept count before every block (the compact step's output offsets).
 */
#pragma once

#include <dropit/detail/host/parallel.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dropit::detail {

/// The threshold of a pack and where each block's kept elements start in the values section.
template <class Key>
struct host_selection {
  threshold<Key> th;
  std::vector<std::size_t> block_start;  ///< kept before block b; block_start[blocks] == k
};

/**
 * Selects the k largest keys of x[0, n) (0 < k < n), ties lowest index first.
 * Passes over x: ceil(key bits / 11) histogram passes, then one counting pass per block.
 */
template <class P, class T>
[[nodiscard]] host_selection<key_type_t<P, T>> host_select(const P& policy, const T* x,
                                                           std::size_t n, std::size_t k,
                                                           unsigned threads) {
  using key = key_type_t<P, T>;
  constexpr std::size_t max_bins = std::size_t{1} << radix_bits;

  // 1. Radix select of the k-th largest key, one histogram per thread, merged.
  radix_state<key> state(k);
  std::vector<std::size_t> hist(threads * max_bins);
  while (!state.done()) {
    const unsigned bins = state.bins();
    std::fill(hist.begin(), hist.end(), 0);
    parallel_for(threads, n, [&](std::size_t begin, std::size_t end, unsigned t) {
      std::size_t* h = hist.data() + t * max_bins;
      const radix_state<key> s = state;
      for (std::size_t i = begin; i < end; ++i) {
        const key kv = policy.key(x[i], i);
        if (s.matches(kv)) ++h[s.digit(kv)];
      }
    });
    for (unsigned t = 1; t < threads; ++t) {
      for (unsigned d = 0; d < bins; ++d)
        hist[d] += hist[t * max_bins + d];
    }
    state.advance(hist.data());
  }
  const key t = state.prefix;
  const std::size_t ties_kept = state.rank;  // keys equal to t that are kept
  const std::size_t ties = state.in_bucket;  // keys equal to t

  // 2. Per block: keys above t, keys equal to t.
  const std::size_t blocks = (n + block_elements - 1) / block_elements;
  std::vector<std::uint32_t> above(blocks), equal(blocks);
  parallel_for(threads, blocks, [&](std::size_t b0, std::size_t b1, unsigned) {
    for (std::size_t b = b0; b < b1; ++b) {
      const std::size_t end = std::min(n, (b + 1) * block_elements);
      std::uint32_t gt = 0, eq = 0;
      for (std::size_t i = b * block_elements; i < end; ++i) {
        const key kv = policy.key(x[i], i);
        gt += kv > t;
        eq += kv == t;
      }
      above[b] = gt;
      equal[b] = eq;
    }
  });

  // 3. The tie cut: the index after the ties_kept-th tie (n when every tie is kept).
  host_selection<key> sel;
  sel.th.t = t;
  sel.th.cut = n;
  if (ties_kept < ties) {
    std::size_t seen = 0, b = 0;
    while (seen + equal[b] < ties_kept)
      seen += equal[b++];
    std::size_t i = b * block_elements;
    for (; seen < ties_kept; ++i)
      seen += policy.key(x[i], i) == t;
    sel.th.cut = i;
  }

  // 4. Kept count before each block.
  sel.block_start.resize(blocks + 1);
  std::size_t total = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    sel.block_start[b] = total;
    const std::size_t first = b * block_elements;
    const std::size_t last = std::min(n, first + block_elements);
    std::size_t kept_ties = 0;
    if (sel.th.cut >= last) {
      kept_ties = equal[b];
    } else if (sel.th.cut > first) {
      for (std::size_t i = first; i < sel.th.cut; ++i)
        kept_ties += policy.key(x[i], i) == t;
    }
    total += above[b] + kept_ties;
  }
  sel.block_start[blocks] = total;
  return sel;
}

}  // namespace dropit::detail
