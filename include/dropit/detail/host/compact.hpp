/**
 * @file compact.hpp
 * @brief The host's compact step (the second read of x) and expand step (restore), per range of
 * blocks, so that every worker writes a disjoint part of the payload or the output.
 *
 * The bytes are those of the shared steps (steps.hpp: mark_word, compact_word, expand_word): bit j
 * of word w set when element 32 w + j is kept, the kept values in index order, block offsets =
 * kept count before each block.
 */
#pragma once

#include <dropit/detail/host/classify.hpp>
#include <dropit/detail/host/select.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dropit::detail {

/// Copies the elements of src whose bit is set in m to out, in order; returns the end.
template <class T>
inline T* host_compact_word(const T* src, std::uint32_t m, T* out) noexcept {
  for (; m != 0; m &= m - 1)
    *out++ = src[std::countr_zero(m)];
  return out;
}

/// Bits of word w below the tie cut: elements 32 w + j < cut.
[[nodiscard]] inline std::uint32_t below_cut(std::size_t w, std::size_t cut) noexcept {
  const std::size_t base = w * word_elements;
  if (base + word_elements <= cut) return ~std::uint32_t{0};
  if (base >= cut) return 0;
  return low_bits(static_cast<unsigned>(cut - base));
}

/// The mask of word w under the exact threshold th (classifier built with hi = lo = th.t).
template <class P, class T>
[[nodiscard]] inline std::uint32_t host_mark_word(const word_classifier<P, T>& cls, std::size_t w,
                                                  threshold<key_type_t<P, T>> th) noexcept {
  const word_masks m = cls.masks(w);
  return m.gt | (m.ge & ~m.gt & below_cut(w, th.cut));
}

/// Words of blocks [b0, b1) of an n-element tensor.
struct word_span {
  std::size_t w0;
  std::size_t w1;
};
[[nodiscard]] inline word_span block_words(std::size_t b0, std::size_t b1, std::size_t n) noexcept {
  constexpr std::size_t words_per_block = block_elements / word_elements;
  const std::size_t total = (n + word_elements - 1) / word_elements;
  return {std::min(total, b0 * words_per_block), std::min(total, b1 * words_per_block)};
}

/**
 * Bitmask encoding, blocks [b0, b1): with `from_candidates` the words already hold the kept set;
 * else every word is classified against the threshold. Writes the block offsets and the values.
 */
template <class P, class T, class Offset>
void host_compact_bitmask(const word_classifier<P, T>& cls,
                          const host_selection<key_type_t<P, T>>& sel, const T* x, std::size_t n,
                          std::size_t b0, std::size_t b1, std::uint32_t* words, Offset* offsets,
                          T* values) {
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t at = sel.block_start[b];
    offsets[b] = static_cast<Offset>(at);
    T* out = values + at;
    const word_span ws = block_words(b, b + 1, n);
    if (sel.from_candidates) {
      for (std::size_t w = ws.w0; w < ws.w1; ++w)
        out = host_compact_word(x + w * word_elements, words[w], out);
    } else {
      for (std::size_t w = ws.w0; w < ws.w1; ++w) {
        const std::uint32_t m = host_mark_word(cls, w, sel.th);
        words[w] = m;
        out = host_compact_word(x + w * word_elements, m, out);
      }
    }
  }
}

/// Index-list encoding, blocks [b0, b1): kept values and their indices.
template <class P, class T, class Index>
void host_compact_index(const word_classifier<P, T>& cls,
                        const host_selection<key_type_t<P, T>>& sel, const T* x, std::size_t n,
                        std::size_t b0, std::size_t b1, T* values, Index* index) {
  for (std::size_t b = b0; b < b1; ++b) {
    std::size_t at = sel.block_start[b];
    if (sel.from_candidates) {
      // The entries of the block (keys >= lo, in index order) that the threshold keeps.
      const std::size_t first = sel.cand.at[b];
      const std::size_t last = first + sel.cand.count[b];
      const std::size_t base = b * block_elements;
      for (std::size_t s = first; s < last; ++s) {
        const std::size_t i = base + sel.cand.offs[s];
        if (sel.th.keeps(sel.cand.keys[s], i)) {
          values[at] = x[i];
          index[at] = static_cast<Index>(i);
          ++at;
        }
      }
    } else {
      const word_span ws = block_words(b, b + 1, n);
      for (std::size_t w = ws.w0; w < ws.w1; ++w) {
        std::uint32_t m = host_mark_word(cls, w, sel.th);
        const std::size_t base = w * word_elements;
        for (; m != 0; m &= m - 1) {
          const std::size_t i = base + static_cast<std::size_t>(std::countr_zero(m));
          values[at] = x[i];
          index[at] = static_cast<Index>(i);
          ++at;
        }
      }
    }
  }
}

/// Restores blocks [b0, b1) from the bitmask encoding.
template <class T, class Offset>
void host_expand_bitmask(const T* values, const std::uint32_t* words, const Offset* offsets,
                         std::size_t n, std::size_t b0, std::size_t b1, T* out,
                         restore_value<T> op) {
  for (std::size_t b = b0; b < b1; ++b) {
    const T* v = values + static_cast<std::size_t>(offsets[b]);
    const word_span ws = block_words(b, b + 1, n);
    for (std::size_t w = ws.w0; w < ws.w1; ++w) {
      const std::size_t base = w * word_elements;
      T* o = out + base;
      const std::size_t count = std::min(word_elements, n - base);
      std::uint32_t m = words[w];
      if (count == word_elements) {
        for (std::size_t j = 0; j < word_elements; ++j)
          o[j] = T{};
      } else {
        for (std::size_t j = 0; j < count; ++j)
          o[j] = T{};
      }
      if (op.apply) {
        for (; m != 0; m &= m - 1)
          o[std::countr_zero(m)] = op(*v++);
      } else {
        for (; m != 0; m &= m - 1)
          o[std::countr_zero(m)] = *v++;
      }
    }
  }
}

/// Restores elements [begin, end) from an index list.
template <class T, class Index>
void host_expand_index(const T* values, const Index* index, std::size_t k, std::size_t begin,
                       std::size_t end, T* out, restore_value<T> op) {
  const std::size_t first =
      static_cast<std::size_t>(std::lower_bound(index, index + k, begin) - index);
  expand_index_range(values, index, k, first, begin, end, out, op);
}

}  // namespace dropit::detail
