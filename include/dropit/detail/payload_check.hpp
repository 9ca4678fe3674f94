/**
 * @file payload_check.hpp
 * @brief What `SparseCache::load` checks before it takes bytes from outside: that they are
 * exactly a payload a pack writes (format.hpp), so that restore, which trusts its payload, can
 * never read or write out of bounds.
 */
#pragma once

#include <dropit/error.hpp>
#include <dropit/format.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace dropit::detail {

/// The name of a position encoding, as error messages give it.
[[nodiscard]] constexpr const char* encoding_name(position_encoding e) noexcept {
  switch (e) {
    case position_encoding::none:
      return "none";
    case position_encoding::bitmask:
      return "bitmask";
    case position_encoding::index32:
      return "index32";
    case position_encoding::index64:
      return "index64";
    case position_encoding::elias_fano:
      return "elias_fano";
  }
  return "unknown";
}

/// The most elements a loaded payload may describe (keeps every size of its layout far from
/// overflowing).
inline constexpr std::size_t max_load_elements = std::size_t{1} << 56;

/**
 * The layout of a payload of k kept of n elements of `value_size` bytes, stored with `codec`,
 * whose positions are `positions`: the layout a pack writes with either position choice.
 * @throw dropit::error if k > n, n is too large, or no pack of n and k writes `positions`.
 */
[[nodiscard]] inline packed_layout load_layout(std::size_t n, std::size_t k, std::size_t value_size,
                                               value_codec codec, position_encoding positions) {
  DROPIT_EXPECTS(n <= max_load_elements, "load: n = ", n, " elements is more than the ",
                 max_load_elements, " a payload may describe");
  DROPIT_EXPECTS(k <= n, "load: k = ", k, " kept elements of n = ", n);
  const packed_layout smallest = make_layout(n, k, value_size, codec, position_choice::smallest);
  if (smallest.positions == positions) return smallest;
  const packed_layout plain = make_layout(n, k, value_size, codec, position_choice::no_elias_fano);
  if (plain.positions == positions) return plain;
  throw_error("load: a pack of k = ", k, " of n = ", n, " elements stores its positions as ",
              encoding_name(smallest.positions),
              plain.positions != smallest.positions ? " or " : "",
              plain.positions != smallest.positions ? encoding_name(plain.positions) : "",
              ", not as ", encoding_name(positions));
}

/// Reads a U at byte `at` of p (any alignment).
template <class U>
[[nodiscard]] U read_at(const std::byte* p, std::size_t at) noexcept {
  U v;
  std::memcpy(&v, p + at, sizeof(U));
  return v;
}

/// The block offsets check: offset b must be `count`.
template <class Offset>
void check_block_offset(const std::byte* p, const packed_layout& l, std::size_t b,
                        std::size_t count) {
  const auto got = read_at<Offset>(p, l.block_offsets_offset + b * sizeof(Offset));
  DROPIT_EXPECTS(got == count, "load: block offset ", b, " is ", got, ", the positions give ",
                 count);
}

/// Bitmask: no bit at or past n, k bits in all, each block offset the count before its block.
template <class Offset>
void check_bitmask(const std::byte* p, const packed_layout& l) {
  std::size_t count = 0;
  for (std::size_t w = 0; w < l.words(); ++w) {
    if (w % (block_elements / word_elements) == 0)
      check_block_offset<Offset>(p, l, w / (block_elements / word_elements), count);
    const auto word = read_at<std::uint32_t>(p, l.positions_offset + w * 4);
    const std::size_t first = w * word_elements;
    DROPIT_EXPECTS(l.n - first >= word_elements || (word >> (l.n - first)) == 0,
                   "load: the bitmask marks an element at or past n = ", l.n);
    count += static_cast<std::size_t>(std::popcount(word));
  }
  DROPIT_EXPECTS(count == l.k, "load: the bitmask marks ", count, " elements, not k = ", l.k);
}

/// Index list: k strictly ascending indices below n.
template <class Index>
void check_index_list(const std::byte* p, const packed_layout& l) {
  for (std::size_t j = 0; j < l.k; ++j) {
    const auto i = read_at<Index>(p, l.positions_offset + j * sizeof(Index));
    DROPIT_EXPECTS(i < l.n, "load: index ", j, " is ", i, ", not below n = ", l.n);
    DROPIT_EXPECTS(j == 0 || i > read_at<Index>(p, l.positions_offset + (j - 1) * sizeof(Index)),
                   "load: index ", j, " (", i, ") does not ascend");
  }
}

/// Elias-Fano: exactly k entries in the high array, decoding to strictly ascending indices below
/// n; no low bit past the k entries'; each block offset the count before its block.
template <class Offset>
void check_elias_fano(const std::byte* p, const packed_layout& l) {
  const unsigned bits = l.low_bits;
  const auto low_bit = [&](std::size_t b) {
    return (read_at<std::uint64_t>(p, l.positions_offset + b / 64 * 8) >> (b % 64)) & 1u;
  };
  for (std::size_t b = l.k * bits; b < l.low_words() * 64; ++b)
    DROPIT_EXPECTS(low_bit(b) == 0, "load: a low bit past the last entry is set");
  std::size_t j = 0, block = 0;
  std::uint64_t previous = 0;
  for (std::size_t w = 0; w < l.high_words(); ++w) {
    for (auto word = read_at<std::uint64_t>(p, l.high_offset + w * 8); word != 0;
         word &= word - 1) {
      DROPIT_EXPECTS(j < l.k, "load: the high array holds more than k = ", l.k, " entries");
      const std::uint64_t high = w * 64 + static_cast<unsigned>(std::countr_zero(word)) - j;
      std::uint64_t low = 0;
      for (unsigned b = 0; b < bits; ++b)
        low |= static_cast<std::uint64_t>(low_bit(j * bits + b)) << b;
      DROPIT_EXPECTS(high < (std::uint64_t{1} << (63 - bits)), "load: entry ", j, " is too large");
      const std::uint64_t index = high << bits | low;
      DROPIT_EXPECTS(index < l.n, "load: entry ", j, " is ", index, ", not below n = ", l.n);
      DROPIT_EXPECTS(j == 0 || index > previous, "load: entry ", j, " (", index,
                     ") does not ascend");
      for (; block * ef_block_elements <= index; ++block)
        check_block_offset<Offset>(p, l, block, j);
      previous = index;
      ++j;
    }
  }
  DROPIT_EXPECTS(j == l.k, "load: the high array holds ", j, " entries, not k = ", l.k);
  for (; block < l.ef_blocks(); ++block)
    check_block_offset<Offset>(p, l, block, l.k);
}

/**
 * Throws `dropit::error` unless `bytes` is exactly a payload laid out as `l` that a pack could
 * have written: its size, zero padding between sections, and positions that decode to k strictly
 * ascending indices below n with the block offsets they imply. Values and scales may be any bits.
 */
inline void check_payload(const packed_layout& l, std::span<const std::byte> bytes) {
  DROPIT_EXPECTS(bytes.size() == l.total_bytes, "load: the payload has ", bytes.size(),
                 " bytes; a pack of k = ", l.k, " of n = ", l.n, " elements stored this way has ",
                 l.total_bytes);
  const std::byte* p = bytes.data();
  const padding_gaps gaps = padding_of(l);
  for (int g = 0; g < padding_gaps::count; ++g) {
    for (std::size_t b = gaps.begin[g]; b < gaps.end[g]; ++b)
      DROPIT_EXPECTS(p[b] == std::byte{0}, "load: padding byte ", b, " is not zero");
  }
  const bool wide = l.wide();
  switch (l.positions) {
    case position_encoding::bitmask:
      return wide ? check_bitmask<std::uint64_t>(p, l) : check_bitmask<std::uint32_t>(p, l);
    case position_encoding::index32:
      return check_index_list<std::uint32_t>(p, l);
    case position_encoding::index64:
      return check_index_list<std::uint64_t>(p, l);
    case position_encoding::elias_fano:
      return wide ? check_elias_fano<std::uint64_t>(p, l) : check_elias_fano<std::uint32_t>(p, l);
    case position_encoding::none:
      return;
  }
}

}  // namespace dropit::detail
