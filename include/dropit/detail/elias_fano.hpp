/**
 * @file elias_fano.hpp
 * @brief The Elias-Fano position code of format.hpp, block by block: encode a block of
 * `ef_block_elements` from a bitmask with per-1024 running counts, decode a block into (index,
 * rank) pairs or back into a bitmask. Plain functions that compile for host and device: the host
 * executor runs them over its workers' ranges of blocks, the CUDA executor as Thrust bodies, so
 * both write the same bytes.
 *
 * Every block writes whole 64-bit words: the words whose first bit lies in its part of an array
 * (its entries' bits). The last of them may also hold the first bits of the next blocks' entries,
 * which the block then reads from their bitmask words, so no word is written twice and nothing
 * has to be zeroed or combined first.
 */
#pragma once

#include <dropit/detail/config.hpp>
#include <dropit/detail/numeric.hpp>
#include <dropit/format.hpp>

#include <cstddef>
#include <cstdint>

namespace dropit::detail {

/// Blocks of 1024 elements (bitmask block offsets) per Elias-Fano block.
inline constexpr std::size_t ef_sub_blocks = ef_block_elements / block_elements;
/// Bitmask words per Elias-Fano block.
inline constexpr std::size_t ef_block_words = ef_block_elements / word_elements;

/// The sizes an Elias-Fano code is read and written with (from a `packed_layout`).
struct ef_shape {
  std::size_t n;           ///< elements
  std::size_t k;           ///< kept elements
  unsigned l;              ///< low bits per kept index
  std::size_t low_words;   ///< 64-bit words of the low array
  std::size_t high_words;  ///< 64-bit words of the high array

  [[nodiscard]] static constexpr ef_shape of(const packed_layout& layout) noexcept {
    return {layout.n, layout.k, layout.low_bits, layout.low_words(), layout.high_words()};
  }
  /// Elias-Fano blocks.
  [[nodiscard]] DROPIT_HD std::size_t blocks() const noexcept {
    return (n + ef_block_elements - 1) / ef_block_elements;
  }
};

/// What Elias-Fano block b covers: its first element, its kept elements' ranks [kb, kb1), and
/// the words of each array it writes, [h_first, h_end) and [l_first, l_end): those that start in
/// its part of the array (its entries begin at high bit `h_bit` and low bit kb * l).
struct ef_block_span {
  std::size_t start, kb, kb1, h_bit, h_first, h_end, l_first, l_end;

  /// The span of block b, from the bitmask's running counts per block of 1024.
  template <class Offset>
  [[nodiscard]] DROPIT_HD static ef_block_span of(const ef_shape& s, const Offset* counts,
                                                  std::size_t b) noexcept {
    const bool last = b + 1 == s.blocks();
    const unsigned l = s.l;
    ef_block_span r{};
    r.start = b * ef_block_elements;
    r.kb = static_cast<std::size_t>(counts[b * ef_sub_blocks]);
    r.kb1 = last ? s.k : static_cast<std::size_t>(counts[(b + 1) * ef_sub_blocks]);
    r.h_bit = (r.start >> l) + r.kb;
    r.h_first = (r.h_bit + 63) / 64;
    r.h_end = last ? s.high_words : ((((r.start + ef_block_elements) >> l) + r.kb1) + 63) / 64;
    r.l_first = (r.kb * l + 63) / 64;
    r.l_end = last ? s.low_words : (r.kb1 * l + 63) / 64;
    return r;
  }
};

/**
 * Encodes Elias-Fano block b from the bitmask (`words`, 32-bit) and its running counts per block
 * of 1024 (`counts`): writes the block's words of the low and high arrays and its block offset.
 *
 * The block owns the words that start inside its part of each array; it writes them in ascending
 * order from two bit packers held in registers, reading on into the next blocks' bitmask until its
 * last words are full.
 */
template <class Offset>
DROPIT_HD void ef_encode_block(const ef_shape& s, const std::uint32_t* words, const Offset* counts,
                               std::size_t b, std::uint64_t* low, std::uint64_t* high,
                               Offset* ef_offsets) noexcept {
  const std::size_t sub_blocks = (s.n + block_elements - 1) / block_elements;
  const std::size_t total_words = (s.n + word_elements - 1) / word_elements;
  const ef_block_span span = ef_block_span::of(s, counts, b);
  const std::size_t kb = span.kb;
  ef_offsets[b] = static_cast<Offset>(kb);
  const unsigned l = s.l;
  const std::size_t h_first = span.h_first, h_end = span.h_end;
  const std::size_t l_first = span.l_first, l_end = span.l_end;
  const std::uint64_t low_mask = (std::uint64_t{1} << l) - 1;
  // High packer: word hw being filled (hacc); low packer: word lw, its bits below `fill` set.
  std::size_t hw = span.h_bit / 64;
  std::uint64_t hacc = 0;
  std::size_t lw = kb * l / 64;
  unsigned fill = static_cast<unsigned>(kb * l % 64);
  std::uint64_t lacc = 0;
  std::size_t j = kb;
  bool more = true;
  for (std::size_t c = b * ef_sub_blocks; more && c < sub_blocks; ++c) {
    const std::size_t base = c * block_elements;
    // Past here an entry lands at high bit >= (base >> l) + j and low bit >= j l.
    if (((base >> l) + j) / 64 >= h_end && lw >= l_end) break;
    const std::size_t next = c + 1 < sub_blocks ? static_cast<std::size_t>(counts[c + 1]) : s.k;
    if (next == static_cast<std::size_t>(counts[c])) continue;  // nothing kept in this block
    const std::size_t w0 = base / word_elements;
    const std::size_t w1 = w0 + block_elements / word_elements < total_words
                               ? w0 + block_elements / word_elements
                               : total_words;
    for (std::size_t w = w0; more && w < w1; ++w) {
      for (std::uint32_t m = words[w]; m != 0; m &= m - 1) {
        const std::size_t i = w * word_elements + static_cast<std::size_t>(lowest_bit32(m));
        const std::size_t u = (i >> l) + j;
        if (u / 64 >= h_end && lw >= l_end) {
          more = false;
          break;
        }
        if (u / 64 != hw) {  // the high word is complete: store it if owned, zeros up to u's
          if (hw >= h_first && hw < h_end) high[hw] = hacc;
          hacc = 0;
          for (++hw; hw < u / 64; ++hw)
            if (hw >= h_first && hw < h_end) high[hw] = 0;
        }
        hacc |= std::uint64_t{1} << (u % 64);
        if (l != 0) {
          const std::uint64_t v = i & low_mask;
          lacc |= v << fill;
          fill += l;
          if (fill >= 64) {  // the low word is complete
            if (lw >= l_first && lw < l_end) low[lw] = lacc;
            ++lw;
            fill -= 64;
            lacc = v >> (l - fill);
          }
        }
        ++j;
      }
    }
  }
  // The last words: partly filled, then zeros.
  for (; hw < h_end; ++hw, hacc = 0)
    if (hw >= h_first) high[hw] = hacc;
  for (; lw < l_end; ++lw, lacc = 0)
    if (lw >= l_first) low[lw] = lacc;
}

/// Reads the kept elements of Elias-Fano block b in ascending order: `rank()` is the index of the
/// next one's value, `next()` returns its index and moves on, until `done()`.
class ef_cursor {
 public:
  template <class Offset>
  DROPIT_HD ef_cursor(const ef_shape& s, const std::uint64_t* low, const std::uint64_t* high,
                      const Offset* ef_offsets, std::size_t b) noexcept
      : low_(low),
        high_(high),
        l_(s.l),
        j_(static_cast<std::size_t>(ef_offsets[b])),
        end_(b + 1 < s.blocks() ? static_cast<std::size_t>(ef_offsets[b + 1]) : s.k) {
    if (j_ == end_) return;
    const std::size_t bit = ((b * ef_block_elements) >> s.l) + j_;
    hw_ = bit / 64;
    hbits_ = high[hw_] & (~std::uint64_t{0} << (bit % 64));
    if (l_ != 0) {
      lw_ = j_ * l_ / 64;
      const unsigned off = static_cast<unsigned>(j_ * l_ % 64);
      lbits_ = low[lw_] >> off;
      avail_ = 64 - off;
    }
  }
  [[nodiscard]] DROPIT_HD bool done() const noexcept { return j_ == end_; }
  [[nodiscard]] DROPIT_HD std::size_t rank() const noexcept { return j_; }
  /// The index of the next kept element. @pre !done()
  DROPIT_HD std::size_t next() noexcept {
    while (hbits_ == 0)
      hbits_ = high_[++hw_];
    const std::size_t p = hw_ * 64 + static_cast<std::size_t>(lowest_bit64(hbits_));
    hbits_ &= hbits_ - 1;
    std::uint64_t v = 0;
    if (l_ != 0) {  // the low bits, read on from the last ones
      if (avail_ >= l_) {
        v = lbits_;
        lbits_ >>= l_;
        avail_ -= l_;
      } else {
        const std::uint64_t w = low_[++lw_];
        v = lbits_ | (w << avail_);
        lbits_ = w >> (l_ - avail_);
        avail_ += 64 - l_;
      }
      v &= (std::uint64_t{1} << l_) - 1;
    }
    return ((p - j_++) << l_) | static_cast<std::size_t>(v);
  }

 private:
  const std::uint64_t* low_;
  const std::uint64_t* high_;
  unsigned l_;
  std::size_t j_;
  std::size_t end_;
  std::size_t hw_ = 0;
  std::uint64_t hbits_ = 0;
  std::size_t lw_ = 0;
  std::uint64_t lbits_ = 0;
  unsigned avail_ = 0;
};

/**
 * Decodes Elias-Fano block b into the bitmask encoding: its words (`words[0]` is the block's first
 * word; room for an even count) and the running count before each of its blocks of 1024
 * (`counts[0]` is its first).
 */
template <class Offset>
DROPIT_HD void ef_decode_block(const ef_shape& s, const std::uint64_t* low,
                               const std::uint64_t* high, const Offset* ef_offsets, std::size_t b,
                               std::uint32_t* words, Offset* counts) {
  const std::size_t start = b * ef_block_elements;
  const std::size_t total_words = (s.n + word_elements - 1) / word_elements;
  const std::size_t w0 = start / word_elements;
  const std::size_t nw = total_words - w0 < ef_block_words ? total_words - w0 : ef_block_words;
  for (std::size_t w = 0; w < nw + (nw & 1); ++w)
    words[w] = 0;
  // Indices ascend: each 64-element word gathers in a register and is stored after every bit (a
  // store, no load: no read-modify-write chain through memory, no branch).
  std::size_t at = 0;
  std::uint64_t acc = 0;
  for (ef_cursor c(s, low, high, ef_offsets, b); !c.done();) {
    const std::size_t local = c.next() - start;
    const std::size_t w = local / 64;
    acc = (w == at ? acc : 0) | std::uint64_t{1} << (local % 64);
    at = w;
    const std::uint32_t pair[2] = {static_cast<std::uint32_t>(acc),
                                   static_cast<std::uint32_t>(acc >> 32)};
    words[2 * w] = pair[0];
    words[2 * w + 1] = pair[1];
  }
  std::size_t running = static_cast<std::size_t>(ef_offsets[b]);
  constexpr std::size_t per_sub = block_elements / word_elements;
  for (std::size_t c = 0; c * per_sub < nw; ++c) {
    counts[c] = static_cast<Offset>(running);
    for (std::size_t w = c * per_sub; w < nw && w < (c + 1) * per_sub; ++w)
      running += static_cast<std::size_t>(popcount32(words[w]));
  }
}

}  // namespace dropit::detail
