/**
 * @file compact.hpp
 * @brief The host's compact step (the kept values from the count pass's stage, or from a second
 * read of x) and expand step (restore), per range of blocks, so that every worker writes a
 * disjoint part of the payload or the output.
 *
 * The bytes are the format's (format.hpp; steps.hpp's expand_word restores one word): bit j
 * of word w set when element 32 w + j is kept, the kept values in index order, block offsets =
 * kept count before each block. With AVX-512 a word is compacted (expanded) sixteen elements at a
 * time by the compress (expand) instructions; with AVX2 eight at a time by a table-driven
 * permute; otherwise one kept element at a time.
 */
#pragma once

#include <dropit/detail/host/classify.hpp>
#include <dropit/detail/host/compress.hpp>
#include <dropit/detail/host/isa.hpp>
#include <dropit/detail/host/select.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/detail/steps.hpp>
#include <dropit/format.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

DROPIT_AVX512_WARNINGS_OFF

namespace dropit::detail {

/// Bits of word w below the tie cut: elements 32 w + j < cut.
[[nodiscard]] inline std::uint32_t below_cut(std::size_t w, std::size_t cut) noexcept {
  const std::size_t base = w * word_elements;
  if (base + word_elements <= cut) return ~std::uint32_t{0};
  if (base >= cut) return 0;
  return low_bits(static_cast<unsigned>(cut - base));
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

/// For each 8-bit mask: for every position, how many set bits lie below it (expand), as bytes.
inline constexpr auto expand_table = [] {
  std::array<std::uint64_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    std::uint64_t v = 0;
    unsigned below = 0;
    for (unsigned b = 0; b < 8; ++b) {
      v |= std::uint64_t{below} << (8 * b);
      below += m >> b & 1u;
    }
    t[m] = v;
  }
  return t;
}();

/// The kept masks of words [w0, w1) (a block) under the exact threshold th; the classifier is
/// built with hi = lo = th.t.
template <class P, class T>
void mark_block(const word_classifier<P, T>& cls, std::size_t w0, std::size_t w1,
                threshold<key_type_t<P, T>> th, std::uint32_t* masks) noexcept {
  std::uint32_t ge[block_elements / word_elements];
  (void)cls.classify(w0, w1, masks, ge);
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t gt = masks[w - w0];
    masks[w - w0] = gt | (ge[w - w0] & ~gt & below_cut(w, th.cut));
  }
}

/**
 * Copies block b's kept values from the stage (its values of keys >= lo, in index order) to
 * [out, end): the stage less the candidates the threshold drops, compacted by a mask over the
 * stage's entries. `words` hold the kept set; a dropped candidate at element i is the stage's
 * entry number (kept before i in the block) + (dropped before i).
 */
template <class Key, class T>
void copy_staged_block(const host_selection<Key, T>& sel, std::size_t b, std::size_t n,
                       const std::uint32_t* words, T* out, const T* end, host_isa isa) noexcept {
  const T* src = sel.stage.values.get() + sel.stage.at[b];
  const std::size_t total = std::size_t{sel.above[b]} + sel.within[b];
  const std::size_t mask_words = (total + word_elements - 1) / word_elements;
  std::uint32_t keep[block_elements / word_elements];
  for (std::size_t j = 0; j < mask_words; ++j)
    keep[j] = ~std::uint32_t{0};
  if (mask_words != 0)
    keep[mask_words - 1] =
        low_bits(static_cast<unsigned>(total - (mask_words - 1) * word_elements));
  const std::size_t base = b * block_elements;
  const std::size_t first = sel.cand.at[b];
  std::size_t w = block_words(b, b + 1, n).w0;
  std::size_t kept_before_w = 0;  // kept elements of the block in words before w
  std::size_t dropped = 0;
  for (std::size_t s = first; s < first + sel.cand.count[b]; ++s) {
    const std::size_t i = base + sel.cand.offs[s];
    if (sel.th.keeps(sel.cand.keys[s], i)) continue;
    for (; w < i / word_elements; ++w)
      kept_before_w += static_cast<std::size_t>(popcount32(words[w]));
    const std::size_t entry = kept_before_w + dropped +
                              static_cast<std::size_t>(popcount32(
                                  words[w] & low_bits(static_cast<unsigned>(i % word_elements))));
    keep[entry / word_elements] &= ~(std::uint32_t{1} << (entry % word_elements));
    ++dropped;
  }
  (void)compact_words(src, total, keep, 0, mask_words, out, end, isa);
}

/**
 * Bitmask encoding, blocks [b0, b1): with `from_candidates` the words already hold the kept set;
 * else every block is classified against the threshold. Writes the block offsets and the values,
 * from the stage where the count pass staged the block, else from x.
 */
template <class P, class T, class Offset>
void host_compact_bitmask(const word_classifier<P, T>& cls,
                          const host_selection<key_type_t<P, T>, T>& sel, const T* x, std::size_t n,
                          std::size_t b0, std::size_t b1, std::uint32_t* words, Offset* offsets,
                          T* values, host_isa isa) {
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t at = sel.block_start[b];
    offsets[b] = static_cast<Offset>(at);
    if (sel.staged(b)) {
      copy_staged_block(sel, b, n, words, values + at, values + sel.block_start[b + 1], isa);
      continue;
    }
    const word_span ws = block_words(b, b + 1, n);
    if (!sel.from_candidates) mark_block(cls, ws.w0, ws.w1, sel.th, words + ws.w0);
    (void)compact_words(x, n, words + ws.w0, ws.w0, ws.w1, values + at,
                        values + sel.block_start[b + 1], isa);
  }
}

/// Index-list encoding, blocks [b0, b1): kept values and their indices.
template <class P, class T, class Index>
void host_compact_index(const word_classifier<P, T>& cls,
                        const host_selection<key_type_t<P, T>, T>& sel, const T* x, std::size_t n,
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
      std::uint32_t masks[block_elements / word_elements];
      mark_block(cls, ws.w0, ws.w1, sel.th, masks);
      for (std::size_t w = ws.w0; w < ws.w1; ++w) {
        const std::size_t base = w * word_elements;
        for (std::uint32_t m = masks[w - ws.w0]; m != 0; m &= m - 1) {
          const std::size_t i = base + static_cast<std::size_t>(std::countr_zero(m));
          values[at] = x[i];
          index[at] = static_cast<Index>(i);
          ++at;
        }
      }
    }
  }
}

/// Restores word w (mask m, count <= 32 elements) one kept value at a time; returns the values
/// not yet used.
template <class T>
inline const T* expand_word_scalar(const T* v, std::uint32_t m, T* o, std::size_t count,
                                   restore_value<T> op) noexcept {
  // All-zero bits are +0 in every element type (memset also vectorises for the half types,
  // whose assignment loops the compiler does not).
  if (count == word_elements) {
    std::memset(static_cast<void*>(o), 0, word_elements * sizeof(T));
  } else {
    std::memset(static_cast<void*>(o), 0, count * sizeof(T));
  }
  if (op.apply) {
    for (; m != 0; m &= m - 1)
      o[std::countr_zero(m)] = op(*v++);
  } else {
    for (; m != 0; m &= m - 1)
      o[std::countr_zero(m)] = *v++;
  }
  return v;
}

#if DROPIT_HOST_X86
/// Stores a vector: non-temporal (at must be 64-byte aligned) or ordinary.
template <bool Stream, class T>
DROPIT_TARGET_AVX512 inline void store_avx512(T* at, __m512i value) noexcept {
  if constexpr (Stream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(at), value);
  } else {
    _mm512_storeu_si512(at, value);
  }
}

/// Moves `count` elements from `stage` (64-byte aligned, in cache) to `out` (64-byte aligned) with
/// non-temporal stores, whole 64-byte lines (a last partial line with ordinary stores), and leaves
/// those elements of the stage zero: the stage is ready for the next block without a fill pass.
template <class T>
DROPIT_TARGET_AVX512 inline void stream_out_and_zero_avx512(T* out, T* stage,
                                                            std::size_t count) noexcept {
  const std::size_t bytes = count * sizeof(T);
  const std::size_t lines = bytes / 64;
  auto* in = reinterpret_cast<__m512i*>(stage);
  const __m512i zero = _mm512_setzero_si512();
  for (std::size_t i = 0; i < lines; ++i) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out) + i, _mm512_load_si512(in + i));
    _mm512_store_si512(in + i, zero);
  }
  const std::size_t tail = bytes - lines * 64;
  std::memcpy(reinterpret_cast<std::byte*>(out) + lines * 64,
              reinterpret_cast<const std::byte*>(stage) + lines * 64, tail);
  std::memset(reinterpret_cast<std::byte*>(stage) + lines * 64, 0, tail);
}

/// AVX-512, 4- and 8-byte elements: restores full words [w0, w1) (values unscaled); returns the
/// values not yet used. `Stream`: the output is 64-byte aligned and written with non-temporal
/// stores (no read for ownership of lines that will not stay in the cache anyway).
template <bool Stream, class T>
DROPIT_TARGET_AVX512 const T* expand_words_avx512(const T* v, const std::uint32_t* words,
                                                  std::size_t w0, std::size_t w1, T* out) noexcept {
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t m = words[w];
    T* o = out + w * word_elements;
    if constexpr (sizeof(T) == 4) {
      for (unsigned h = 0; h < 2; ++h) {
        const auto mh = static_cast<__mmask16>(m >> (16 * h));
        const int count = __builtin_popcount(mh);
        const __m512i src = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << count) - 1u), v);
        store_avx512<Stream>(o + 16 * h, _mm512_maskz_expand_epi32(mh, src));
        v += count;
      }
    } else {
      static_assert(sizeof(T) == 8);
      for (unsigned q = 0; q < 4; ++q) {
        const auto mq = static_cast<__mmask8>(m >> (8 * q));
        const int count = __builtin_popcount(mq);
        const __m512i src = _mm512_maskz_loadu_epi64(static_cast<__mmask8>((1u << count) - 1u), v);
        store_avx512<Stream>(o + 8 * q, _mm512_maskz_expand_epi64(mq, src));
        v += count;
      }
    }
  }
  return v;
}

/// AVX2, 4-byte elements: restores full words [w0, w1); `end` bounds the values that may be
/// read (a group whose eight-value load would pass it takes the scalar path).
template <class T>
DROPIT_TARGET_AVX2 const T* expand_words_avx2(const T* v, const T* end, const std::uint32_t* words,
                                              std::size_t w0, std::size_t w1, T* out) noexcept {
  static_assert(sizeof(T) == 4);
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (std::size_t w = w0; w < w1; ++w) {
    const std::uint32_t m = words[w];
    T* o = out + w * word_elements;
    for (unsigned g = 0; g < 4; ++g) {
      const unsigned mg = m >> (8 * g) & 0xffu;
      T* og = o + 8 * g;
      // No branch on mg == 0 (at gamma 0.9, 43% of the groups, in no predictable pattern): an
      // empty group's lanes are all masked off below, and v does not move.
      if (end - v < 8) {
        v = expand_word_scalar(v, mg, og, 8, restore_value<T>{});
        continue;
      }
      const __m256i idx =
          _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(expand_table[mg])));
      const __m256i src = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
      const __m256i lanes =
          _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(mg)), bit), bit);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(og),
                          _mm256_and_si256(_mm256_permutevar8x32_epi32(src, idx), lanes));
      v += __builtin_popcount(mg);
    }
  }
  return v;
}
#endif

/// Whether a restore into out (n elements) writes with non-temporal stores: with AVX-512, when
/// out is 64-byte aligned and at least half the last-level cache (it would not stay there, and
/// ordinary stores read every line first).
/// `any_size`: the size condition is waived (tests).
template <class T>
[[nodiscard]] bool host_stream_output(const T* out, std::size_t n, host_isa isa,
                                      bool any_size = false) noexcept {
  return isa == host_isa::avx512 && reinterpret_cast<std::uintptr_t>(out) % 64 == 0 &&
         (any_size || n * sizeof(T) >= host_llc_bytes() / 2);
}

/// Restores blocks [b0, b1) from the bitmask encoding; k values in all. `stream`: see
/// host_stream_output (the caller's fence is not needed: this call ends with one).
template <class T, class Offset>
void host_expand_bitmask(const T* values, std::size_t k, const std::uint32_t* words,
                         const Offset* offsets, std::size_t n, std::size_t b0, std::size_t b1,
                         T* out, restore_value<T> op, host_isa isa, bool stream = false) {
  for (std::size_t b = b0; b < b1; ++b) {
    const T* v = values + static_cast<std::size_t>(offsets[b]);
    const word_span ws = block_words(b, b + 1, n);
    const std::size_t full = std::min(ws.w1, n / word_elements);
    std::size_t w = ws.w0;
#if DROPIT_HOST_X86
    // 16-bit elements: zeroing a word and storing its few kept values one by one beats the
    // widen-expand-narrow sequence (measured: bench/README.md).
    if (!op.apply && w < full) {
      if (isa == host_isa::avx512 && (sizeof(T) == 4 || sizeof(T) == 8)) {
        if constexpr (sizeof(T) == 4 || sizeof(T) == 8) {
          if (stream) {
            v = expand_words_avx512<true>(v, words, w, full, out);
          } else {
            v = expand_words_avx512<false>(v, words, w, full, out);
          }
          w = full;
        }
      } else if (isa >= host_isa::avx2 && sizeof(T) == 4) {
        if constexpr (sizeof(T) == 4) {
          v = expand_words_avx2(v, values + k, words, w, full, out);
          w = full;
        }
      }
    }
#else
    (void)isa;
    (void)k;
#endif
    for (; w < ws.w1; ++w) {
      const std::size_t base = w * word_elements;
      v = expand_word_scalar(v, words[w], out + base, std::min(word_elements, n - base), op);
    }
  }
#if DROPIT_HOST_X86
  if (stream) _mm_sfence();  // the non-temporal stores are visible before the fork-join ends
#else
  (void)stream;
#endif
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

DROPIT_AVX512_WARNINGS_ON
