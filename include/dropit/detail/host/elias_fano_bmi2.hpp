/**
 * @file elias_fano_bmi2.hpp
 * @brief The host's Elias-Fano coder with BMI2: an encoder for 2 to 4 low bits (gamma about 0.75 to
 * 0.97), a bitmask word at a time with bit deposit and extract instead of a kept element at a time,
 * and a decoder for 1 to 8 low bits that restores straight into the output. The same bytes as
 * `ef_encode_block` and the restore through `ef_decode_block` (detail/elias_fano.hpp), which the
 * tests check on every instruction set.
 *
 * With L <= 4 a 32-bit bitmask word holds G = 32 >> L whole buckets of 2^L elements, so its part of
 * the high array is, bucket by bucket, as many ones as the bucket keeps and a zero: depositing the
 * word's bits between separator slots and extracting them with the separators gives it in two
 * instructions. Its part of the low array is the kept elements' positions in their bucket: the
 * positions of a half word's set bits as 4-bit nibbles (extract from 0xFEDCBA9876543210), then
 * their low L bits. With AVX-512 VBMI2 the low array's part is a byte compress instead
 * (`ef_encode_block_vbmi2`).
 */
#pragma once

#include <dropit/detail/elias_fano.hpp>
#include <dropit/detail/host/isa.hpp>
#include <dropit/detail/steps.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if DROPIT_HOST_X86
#include <immintrin.h>
#endif

namespace dropit::detail {

#if DROPIT_HOST_X86

/// Appends bit strings to an array of 64-bit words, storing only the words in [first, end). The
/// word being filled is stored after every append (a store instead of a branch the data decides).
struct ef_packer {
  std::uint64_t* words;
  std::size_t first;
  std::size_t end;
  std::size_t w;         ///< the word being filled
  unsigned fill;         ///< its bits below fill are written
  std::uint64_t* spill;  ///< where the stores to words this packer does not own go
  std::uint64_t acc = 0;

  /// Appends the len (<= 64) low bits of v.
  void append(std::uint64_t v, unsigned len) noexcept {
    acc |= v << fill;
    *(w - first < end - first ? words + w : spill) = acc;
    const unsigned next = fill + len;
    const bool wrap = next >= 64;
    // The bits of v past this word: v >> (64 - fill), 0 when v ended exactly at its end.
    const std::uint64_t rest = (v >> 1) >> (63 - fill);
    w += wrap ? 1 : 0;
    acc = wrap ? rest : acc;
    fill = next & 63;
  }
  /// Writes the last owned words: the one being filled, then zeros.
  void finish() noexcept {
    for (; w < end; ++w, acc = 0)
      if (w >= first) words[w] = acc;
  }
};

/// Appends the high array's part of a block of 1024 that keeps nothing: 1024 >> L zeros (one
/// bucket separator per bucket), or as many as the packer still owns.
inline void ef_append_empty_block(ef_packer& hp, unsigned l) noexcept {
  const std::size_t bits = block_elements >> l;
  for (std::size_t z = 0; z < bits && hp.w < hp.end; z += 64)
    hp.append(0, static_cast<unsigned>(bits - z < 64 ? bits - z : 64));
}

/// A bitmask word's part of the high array (see the file's comment): `slots` are the element slots
/// of its buckets, `separators` the slot after each bucket.
DROPIT_TARGET_AVX2 inline std::uint64_t ef_high_part(std::uint32_t m, std::uint64_t slots,
                                                     std::uint64_t separators) noexcept {
  const std::uint64_t spread = _pdep_u64(m, slots);
  return _pext_u64(spread, spread | separators);
}

/// Appends two bitmask words' part of the high array (`buckets` per word; one append when both
/// fit in 64 bits, which halves the chain of dependent appends).
DROPIT_TARGET_AVX2 inline void ef_append_high(ef_packer& hp, std::uint32_t ma, std::uint32_t mb,
                                              unsigned buckets, std::uint64_t slots,
                                              std::uint64_t separators) noexcept {
  const std::uint64_t ha = ef_high_part(ma, slots, separators);
  const std::uint64_t hb = ef_high_part(mb, slots, separators);
  const unsigned la = static_cast<unsigned>(__builtin_popcount(ma)) + buckets;  // <= 40
  const unsigned lb = static_cast<unsigned>(__builtin_popcount(mb)) + buckets;
  if (la + lb <= 64) {
    hp.append(ha | (hb << la), la + lb);
  } else {
    hp.append(ha, la);
    hp.append(hb, lb);
  }
}

/// A half word's part of the low array: its kept elements' positions in their bucket (l < 4: the
/// low l bits of each, `low_of_nibble` selecting them), popcount(half) x l bits.
DROPIT_TARGET_AVX2 inline std::uint64_t ef_low_part(std::uint32_t half, unsigned l,
                                                    std::uint64_t low_of_nibble) noexcept {
  constexpr std::uint64_t nibble_index = 0xFEDCBA9876543210ull;
  const std::uint64_t v = _pext_u64(nibble_index, _pdep_u64(half, 0x1111111111111111ull) * 0xF);
  return l < 4 ? _pext_u64(v, low_of_nibble) : v;
}

/// What both word-at-a-time encoders set up for block b (2 <= L <= 4): its span, the packers of
/// its high and low arrays (stores to words they do not own go to `spill`), and the high array's
/// deposit pattern: a 32-bit word's G = 32 >> L buckets of 2^L element slots, each followed by a
/// separator slot.
struct ef_word_coder {
  ef_block_span span;
  ef_packer hp, lp;
  unsigned buckets;
  std::uint64_t separators, slots;
  std::size_t sub_blocks, total_words;

  template <class Offset>
  static ef_word_coder of(const ef_shape& s, const Offset* counts, std::size_t b,
                          std::uint64_t* low, std::uint64_t* high, std::uint64_t* spill) noexcept {
    const unsigned l = s.l;
    const ef_block_span span = ef_block_span::of(s, counts, b);
    ef_word_coder c{span,
                    {high, span.h_first, span.h_end, span.h_bit / 64,
                     static_cast<unsigned>(span.h_bit % 64), spill},
                    {low, span.l_first, span.l_end, span.kb * l / 64,
                     static_cast<unsigned>(span.kb * l % 64), spill + 1},
                    32u >> l,
                    0,
                    0,
                    (s.n + block_elements - 1) / block_elements,
                    (s.n + word_elements - 1) / word_elements};
    const unsigned width = (1u << l) + 1;
    for (unsigned g = 0; g < c.buckets; ++g)
      c.separators |= std::uint64_t{1} << ((g + 1) * width - 1);
    c.slots = ((std::uint64_t{1} << (c.buckets * width)) - 1) & ~c.separators;
    return c;
  }

  /// Whether bitmask word w starts a block of 1024 that keeps nothing (its words then give the
  /// high array zeros and the low array nothing).
  template <class Offset>
  [[nodiscard]] bool empty_block(const ef_shape& s, const Offset* counts,
                                 std::size_t w) const noexcept {
    constexpr std::size_t per_block = block_elements / word_elements;
    if (w % per_block != 0 || w + per_block > total_words) return false;
    const std::size_t c = w / per_block;
    const std::size_t next = c + 1 < sub_blocks ? static_cast<std::size_t>(counts[c + 1]) : s.k;
    return next == static_cast<std::size_t>(counts[c]);
  }
};

/// `ef_encode_block` for 2 <= s.l <= 4 with BMI2.
template <class Offset>
DROPIT_TARGET_AVX2 void ef_encode_block_bmi2(const ef_shape& s, const std::uint32_t* words,
                                             const Offset* counts, std::size_t b,
                                             std::uint64_t* low, std::uint64_t* high,
                                             Offset* ef_offsets) noexcept {
  const unsigned l = s.l;
  std::uint64_t spill[2];  // (a local apart from the packers, which stay in registers)
  const ef_word_coder coder = ef_word_coder::of(s, counts, b, low, high, spill);
  ef_offsets[b] = static_cast<Offset>(coder.span.kb);
  ef_packer hp = coder.hp;
  ef_packer lp = coder.lp;
  const std::size_t start = coder.span.start;
  const std::size_t total_words = coder.total_words;
  const unsigned buckets = coder.buckets;
  const std::uint64_t separators = coder.separators;
  const std::uint64_t slots = coder.slots;
  std::uint64_t low_of_nibble = 0;  // the low L bits of every nibble
  for (unsigned q = 0; q < 16; ++q)
    low_of_nibble |= ((std::uint64_t{1} << l) - 1) << (4 * q);
  constexpr std::size_t per_block = block_elements / word_elements;
  auto empty_block = [&](std::size_t w) { return coder.empty_block(s, counts, w); };
  // Each array in a loop of its own (fewer live registers), two words (a 64-bit word of the
  // bitmask) per step: `start` is a multiple of a block of 1024, so w stays even. The two words'
  // parts are joined into one append whenever they fit in 64 bits (the low array's, at gamma 0.9,
  // unless 22 of the 64 elements are kept), which halves the chain of dependent appends.
  const std::size_t first_word = start / word_elements;
  const std::size_t pairs_end = first_word + (total_words - first_word) / 2 * 2;
  std::size_t w = first_word;
  for (; w < pairs_end && hp.w < hp.end; w += 2) {
    if (empty_block(w)) {
      ef_append_empty_block(hp, l);
      w += per_block - 2;
      continue;
    }
    ef_append_high(hp, words[w], words[w + 1], buckets, slots, separators);
  }
  if (w == pairs_end && w < total_words && hp.w < hp.end) {  // an odd count's last word
    const std::uint32_t m = words[w];
    hp.append(ef_high_part(m, slots, separators),
              static_cast<unsigned>(__builtin_popcount(m)) + buckets);
  }
  // v << at for 0 <= at <= 64 (a part shifted by 64 is empty).
  auto shl = [](std::uint64_t v, unsigned at) { return at < 64 ? v << at : std::uint64_t{0}; };
  for (w = first_word; w < pairs_end && lp.w < lp.end; w += 2) {
    if (empty_block(w)) {
      w += per_block - 2;
      continue;
    }
    const std::uint32_t ma = words[w];
    const std::uint32_t mb = words[w + 1];
    const std::uint32_t halves[4] = {ma & 0xFFFFu, ma >> 16, mb & 0xFFFFu, mb >> 16};
    const auto c = static_cast<unsigned>(__builtin_popcountll(std::uint64_t{mb} << 32 | ma));
    if (c * l <= 64) {
      std::uint64_t v = 0;
      unsigned at = 0;
      for (const std::uint32_t h : halves) {
        v |= shl(ef_low_part(h, l, low_of_nibble), at);
        at += static_cast<unsigned>(__builtin_popcount(h)) * l;
      }
      lp.append(v, at);
    } else {
      for (const std::uint32_t h : halves)
        lp.append(ef_low_part(h, l, low_of_nibble),
                  static_cast<unsigned>(__builtin_popcount(h)) * l);
    }
  }
  if (w == pairs_end && w < total_words && lp.w < lp.end) {
    const std::uint32_t m = words[w];
    for (const std::uint32_t h : {m & 0xFFFFu, m >> 16})
      lp.append(ef_low_part(h, l, low_of_nibble), static_cast<unsigned>(__builtin_popcount(h)) * l);
  }
  hp.finish();
  lp.finish();
}

DROPIT_AVX512_WARNINGS_OFF
/**
 * `ef_encode_block` for 2 <= s.l <= 4 with AVX-512 VBMI2: one loop, 128 elements a step. The
 * high array's part comes from bit deposit and extract as in `ef_encode_block_bmi2`; the low
 * array's from one byte compress of the indices 0..63 under the word's mask (the kept elements'
 * positions in the word, in order; their low L bits are their positions in their bucket, as 2^L
 * divides 64), then one bit extract of the low L bits of each byte per 8 kept elements: about
 * half the instructions of the four half-word extracts. Four words' parts of each array are
 * joined into one append where they fit, which halves the chain of dependent appends of a step of
 * two words (one Zen 4 core, gamma 0.9: 2^24 elements 2.18 -> 1.32 ms, 2^20 79 -> 67 us; the
 * BMI2 encoder takes 3.9 ms at 2^24).
 */
template <class Offset>
DROPIT_TARGET_AVX512_VBMI2 void ef_encode_block_vbmi2(const ef_shape& s, const std::uint32_t* words,
                                                      const Offset* counts, std::size_t b,
                                                      std::uint64_t* low, std::uint64_t* high,
                                                      Offset* ef_offsets) noexcept {
  const unsigned l = s.l;
  std::uint64_t spill[2];
  const ef_word_coder coder = ef_word_coder::of(s, counts, b, low, high, spill);
  ef_offsets[b] = static_cast<Offset>(coder.span.kb);
  ef_packer hp = coder.hp;
  ef_packer lp = coder.lp;
  const std::size_t total_words = coder.total_words;
  const unsigned buckets = coder.buckets;
  const std::uint64_t separators = coder.separators;
  const std::uint64_t slots = coder.slots;
  const std::uint64_t byte_low = 0x0101010101010101ull * ((std::uint64_t{1} << l) - 1);
  alignas(64) std::uint8_t index[64];
  for (unsigned i = 0; i < 64; ++i)
    index[i] = static_cast<std::uint8_t>(i);
  const __m512i iota = _mm512_load_si512(index);
  constexpr std::size_t per_block = block_elements / word_elements;
  auto empty_block = [&](std::size_t w) { return coder.empty_block(s, counts, w); };
  // The low part of `count` kept elements whose positions `comp` holds: 8 l bits per 8 bytes.
  auto low_lanes = [&](__m512i comp, unsigned count) DROPIT_TARGET_AVX512_VBMI2 {
    alignas(64) std::uint64_t lanes[8];
    _mm512_store_si512(lanes, comp);
    for (unsigned q = 0; 8 * q < count; ++q)
      lp.append(_pext_u64(lanes[q], byte_low), (count - 8 * q < 8 ? count - 8 * q : 8) * l);
  };
  // The low L bits of the first 16 positions `comp` holds (zeros past the kept ones), 16 L bits.
  auto low16 = [&](__m512i comp) DROPIT_TARGET_AVX512_VBMI2 {
    const __m128i lanes01 = _mm512_castsi512_si128(comp);
    const auto lane0 = static_cast<std::uint64_t>(_mm_cvtsi128_si64(lanes01));
    const auto lane1 = static_cast<std::uint64_t>(_mm_extract_epi64(lanes01, 1));
    return _pext_u64(lane0, byte_low) | _pext_u64(lane1, byte_low) << (8 * l);
  };
  const std::size_t first_word = coder.span.start / word_elements;
  const std::size_t quads_end = first_word + (total_words - first_word) / 4 * 4;
  const std::size_t pairs_end = first_word + (total_words - first_word) / 2 * 2;
  std::size_t w = first_word;
  // Four bitmask words (128 elements) per step; `start` is a multiple of a block of 1024, so w
  // stays a multiple of 4. One append to each array in the common case (both parts fit in 64
  // bits: at gamma 0.9 unless 22 or more of the 128 elements are kept), with no branch on the
  // count below that. A step appends to a packer that is done, if the other is not, harmlessly
  // (its stores go to `spill`).
  for (; w < quads_end && (hp.w < hp.end || lp.w < lp.end); w += 4) {
    if (empty_block(w)) {
      ef_append_empty_block(hp, l);
      w += per_block - 4;
      continue;
    }
    std::uint64_t m0, m1;
    std::memcpy(&m0, words + w, sizeof m0);
    std::memcpy(&m1, words + w + 2, sizeof m1);
    const auto c0 = static_cast<unsigned>(__builtin_popcountll(m0));
    const auto c1 = static_cast<unsigned>(__builtin_popcountll(m1));
    if (c0 + c1 + 4 * buckets <= 64) {
      const auto m00 = static_cast<std::uint32_t>(m0), m01 = static_cast<std::uint32_t>(m0 >> 32);
      const auto m10 = static_cast<std::uint32_t>(m1), m11 = static_cast<std::uint32_t>(m1 >> 32);
      const unsigned la = static_cast<unsigned>(__builtin_popcount(m00)) + buckets;
      const unsigned lb = c0 + 2 * buckets;  // la + the second word's length
      const unsigned lc = lb + static_cast<unsigned>(__builtin_popcount(m10)) + buckets;
      // Every shift is below the total length, so below 64.
      hp.append(ef_high_part(m00, slots, separators) | ef_high_part(m01, slots, separators) << la |
                    ef_high_part(m10, slots, separators) << lb |
                    ef_high_part(m11, slots, separators) << lc,
                c0 + c1 + 4 * buckets);
    } else {
      ef_append_high(hp, static_cast<std::uint32_t>(m0), static_cast<std::uint32_t>(m0 >> 32),
                     buckets, slots, separators);
      ef_append_high(hp, static_cast<std::uint32_t>(m1), static_cast<std::uint32_t>(m1 >> 32),
                     buckets, slots, separators);
    }
    const __m512i comp0 = _mm512_maskz_compress_epi8(m0, iota);
    const __m512i comp1 = _mm512_maskz_compress_epi8(m1, iota);
    if ((c0 + c1) * l <= 64 && c0 <= 16 && c1 <= 16) {
      // c0 l < 64 unless c1 = 0: then the second part is empty and shifted out.
      const std::uint64_t second = c0 * l < 64 ? low16(comp1) << (c0 * l) : 0;
      lp.append(low16(comp0) | second, (c0 + c1) * l);
    } else {
      low_lanes(comp0, c0);
      low_lanes(comp1, c1);
    }
  }
  // The last words of the bitmask (fewer than four), two at a time.
  for (; w < pairs_end && (hp.w < hp.end || lp.w < lp.end); w += 2) {
    if (empty_block(w)) {
      ef_append_empty_block(hp, l);
      w += per_block - 2;
      continue;
    }
    std::uint64_t m;
    std::memcpy(&m, words + w, sizeof m);
    ef_append_high(hp, static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(m >> 32), buckets,
                   slots, separators);
    const auto c = static_cast<unsigned>(__builtin_popcountll(m));
    const __m512i comp = _mm512_maskz_compress_epi8(m, iota);
    const __m128i lanes01 = _mm512_castsi512_si128(comp);
    if (c <= 8) {  // the common case at gamma >= 0.9: one lane, from a register
      const auto lane = static_cast<std::uint64_t>(_mm_cvtsi128_si64(lanes01));
      lp.append(_pext_u64(lane, byte_low), c * l);
    } else if (c <= 16 && c * l <= 64) {  // two lanes, one append
      const auto lane0 = static_cast<std::uint64_t>(_mm_cvtsi128_si64(lanes01));
      const auto lane1 = static_cast<std::uint64_t>(_mm_extract_epi64(lanes01, 1));
      lp.append(_pext_u64(lane0, byte_low) | (_pext_u64(lane1, byte_low) << (8 * l)), c * l);
    } else {
      low_lanes(comp, c);
    }
  }
  if (w == pairs_end && w < total_words) {  // an odd count's last word
    const std::uint32_t m = words[w];
    const auto c = static_cast<unsigned>(__builtin_popcount(m));
    if (hp.w < hp.end) hp.append(ef_high_part(m, slots, separators), c + buckets);
    if (lp.w < lp.end) low_lanes(_mm512_maskz_compress_epi8(m, iota), c);
  }
  hp.finish();
  lp.finish();
}
DROPIT_AVX512_WARNINGS_ON

/// Whether `ef_visit_block_bmi2` decodes a code of `low_bits` low bits per kept element on this
/// instruction set (1 to 8: one byte per element; BMI2 comes with AVX2 here).
[[nodiscard]] inline bool ef_bmi2_decodes(unsigned low_bits, host_isa isa) noexcept {
  return isa >= host_isa::avx2 && low_bits >= 1 && low_bits <= 8;
}

/**
 * Calls `visit(local, j)` for the kept elements of Elias-Fano block b in ascending order: `local`
 * is the element's index less the block's first, `j` its rank in the block (0, 1, ...); returns
 * the block's first rank. 1 <= s.l <= 8, BMI2.
 *
 * Two passes: the low bits of eight elements at a time become eight bytes (one bit deposit), then
 * each element's high part is the next one of the high array less its rank. The loop has no branch
 * the data decides but the refill of the high bits, and every shift by a register is one
 * instruction (BMI2's shlx/shrx): about a third of the portable decoder's instructions per
 * element (g++ 12, counted in the loops' assembly).
 */
template <class Offset, class Visit>
DROPIT_TARGET_AVX2 inline std::size_t ef_visit_block_bmi2(const ef_shape& s,
                                                          const std::uint64_t* low,
                                                          const std::uint64_t* high,
                                                          const Offset* ef_offsets, std::size_t b,
                                                          Visit&& visit) noexcept {
  const std::size_t start = b * ef_block_elements;
  const std::size_t kb = static_cast<std::size_t>(ef_offsets[b]);
  const std::size_t kb1 = b + 1 < s.blocks() ? static_cast<std::size_t>(ef_offsets[b + 1]) : s.k;
  const unsigned l = s.l;
  if (kb == kb1) return kb;
  // The low bits, eight elements at a time: 8 l bits from the two words they may span (the high
  // array follows the low one, so a read past the low array stays in the code; clamped to it).
  alignas(64) std::uint8_t lows[ef_block_elements + 8];
  const std::size_t count = kb1 - kb;
  const std::size_t code_words = s.low_words + s.high_words;
  const std::uint64_t byte_mask = 0x0101010101010101ull * ((std::uint64_t{1} << l) - 1);
  std::size_t bit = kb * l;
  for (std::size_t i = 0; i < count; i += 8, bit += 8 * std::size_t{l}) {
    const std::size_t w = bit / 64;
    const unsigned off = static_cast<unsigned>(bit % 64);
    const std::size_t w1 = w + 1 < code_words ? w + 1 : w;
    const std::uint64_t v = (low[w] >> off) | ((low[w1] << 1) << (63 - off));
    const std::uint64_t bytes = _pdep_u64(v, byte_mask);
    std::memcpy(lows + i, &bytes, sizeof bytes);
  }
  // local = ((hw 64 + t - (kb + i) - (start >> l)) << l) | low: `base` is all of it but t.
  const std::size_t first_bit = (start >> l) + kb;
  std::size_t hw = first_bit / 64;
  std::uint64_t hbits = high[hw] & (~std::uint64_t{0} << (first_bit % 64));
  std::size_t base = hw * 64 - first_bit;  // wraps below zero; t brings it back
  for (std::size_t i = 0; i < count; ++i) {
    while (hbits == 0) {
      hbits = high[++hw];
      base += 64;
    }
    visit(((base + static_cast<std::size_t>(_tzcnt_u64(hbits))) << l) | lows[i], i);
    hbits = _blsr_u64(hbits);
    --base;
  }
  return kb;
}

/**
 * Restores Elias-Fano block b straight into `out` (the block's first output) with BMI2, without a
 * bitmask: zeros over the block (unless `zeroed`: the caller's stage is zero already), then each
 * kept value (from `values`, the payload's first) at its index (`out` may be a stage in cache
 * that the caller streams out).
 */
template <class T, class Offset>
DROPIT_TARGET_AVX2 void ef_scatter_block_bmi2(const ef_shape& s, const std::uint64_t* low,
                                              const std::uint64_t* high, const Offset* ef_offsets,
                                              std::size_t b, const T* values, T* out,
                                              restore_value<T> op, bool zeroed = false) noexcept {
  const std::size_t start = b * ef_block_elements;
  const std::size_t len = s.n - start < ef_block_elements ? s.n - start : ef_block_elements;
  if (!zeroed) std::fill(out, out + len, T{});
  const std::size_t kb = static_cast<std::size_t>(ef_offsets[b]);
  const T* v = values + kb;
  if (op.apply) {
    ef_visit_block_bmi2(s, low, high, ef_offsets, b,
                        [&](std::size_t local, std::size_t j) { out[local] = op(v[j]); });
  } else {
    ef_visit_block_bmi2(s, low, high, ef_offsets, b,
                        [&](std::size_t local, std::size_t j) { out[local] = v[j]; });
  }
}

#endif  // DROPIT_HOST_X86

}  // namespace dropit::detail
