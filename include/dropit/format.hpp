/**
 * @file format.hpp
 * @brief The packed layout of a `SparseCache` payload and its size arithmetic.
 *
 * One allocation holds up to three sections, each starting on a 16-byte boundary:
 *
 * | section       | content                                                    | size          |
 * | ------------- | ---------------------------------------------------------- | ------------- |
 * | values        | the k kept values, in ascending index order, as T          | k * sizeof(T) |
 * | positions     | bitmask (bit i of 32-bit word i/32 set when i is kept), or  | ceil(n/32)*4  |
 * |               | Elias-Fano code (low bits, then high bits; see below), or   | ~k(2+log n/k)/8|
 * |               | index list (k ascending indices; 32-bit, 64-bit if n>=2^32) | k * 4 (or 8)  |
 * | block offsets | bitmask: kept count before each block of 1024 elements;     | ceil(n/1024)*4|
 * |               | Elias-Fano: kept count before each block of 8192 elements   | ceil(n/8192)*4|
 *
 * Positions are stored as whichever of bitmask, Elias-Fano (each with its block offsets) and index
 * list is smallest (on a tie: bitmask, then Elias-Fano); none are stored when k = 0 or k = n
 * (Identity, gamma = 0). The block offsets let restore expand every block independently, in one
 * parallel pass. Offsets are 64-bit, like indices, when n >= 2^32.
 *
 * Elias-Fano with `L = low_bits` (floor(log2(n / k)), at most 13): the j-th kept index p_j (in
 * ascending order) stores its L low bits at bits [j L, j L + L) of the low array and sets bit
 * (p_j >> L) + j of the high array; both arrays are 64-bit words, bit b of an array being bit
 * b % 64 of word b / 64, the low array first and the high array right after it. A block of 8192
 * elements that starts at element s with c kept elements before it begins at high bit (s >> L) + c,
 * so every block decodes on its own. At gamma 0.9 this is 0.53 bits per element against the
 * bitmask's 1.03 (the entropy bound is 0.47).
 *
 * With a quantized value codec (codec.hpp) the values section holds k one-byte codes, and a scales
 * section (one float per `codec_chunk` values) follows it, before the positions.
 */
#pragma once

#include <dropit/codec.hpp>

#include <cstddef>
#include <cstdint>

namespace dropit {

/// @brief How a payload records which elements were kept.
enum class position_encoding : std::uint8_t {
  none,       ///< no positions: k = 0 (nothing kept) or k = n (dense copy)
  bitmask,    ///< one bit per element plus a running count every `block_elements` elements
  index32,    ///< k ascending 32-bit indices
  index64,    ///< k ascending 64-bit indices (n >= 2^32)
  elias_fano  ///< low and high bit arrays plus a running count every `ef_block_elements` elements
};

/// @brief Elements per block offset of the bitmask encoding (32 words of 32 bits).
inline constexpr std::size_t block_elements = 1024;
/// @brief Elements per block offset of the Elias-Fano encoding.
inline constexpr std::size_t ef_block_elements = 8192;
/// @brief The most low bits per kept index in the Elias-Fano encoding (2^13 = `ef_block_elements`,
/// so that every block starts on a multiple of 2^L).
inline constexpr unsigned ef_max_low_bits = 13;
/// @brief Elements per bitmask word.
inline constexpr std::size_t word_elements = 32;
/// @brief Alignment of each section inside the payload, in bytes.
inline constexpr std::size_t section_alignment = 16;

/**
 * @brief Where each section of a payload lies and how big it is, all in bytes.
 *
 * Built by `make_layout(n, k, sizeof(T))`; a `SparseCache` exposes the layout of what it holds.
 */
struct packed_layout {
  std::size_t n = 0;                                      ///< elements of the dense tensor
  std::size_t k = 0;                                      ///< elements kept
  std::size_t value_size = 0;                             ///< bytes per stored value
  value_codec codec = value_codec::exact;                 ///< how values are stored
  position_encoding positions = position_encoding::none;  ///< how positions are stored
  std::size_t values_offset = 0;                          ///< start of the values section
  std::size_t values_bytes = 0;                           ///< k * value_size
  std::size_t scales_offset = 0;                          ///< start of the codec's scales
  std::size_t scales_bytes = 0;          ///< 4 per `codec_chunk` values; 0 for `value_codec::exact`
  std::size_t positions_offset = 0;      ///< start of the bitmask, Elias-Fano code or index list
  std::size_t positions_bytes = 0;       ///< size of the bitmask, Elias-Fano code or index list
  std::size_t block_offsets_offset = 0;  ///< start of the block offsets
  std::size_t block_offsets_bytes = 0;   ///< bitmask and Elias-Fano only, else 0
  std::size_t total_bytes = 0;           ///< bytes of the whole payload
  unsigned low_bits = 0;                 ///< Elias-Fano: low bits per kept index, else 0
  std::size_t high_offset = 0;           ///< Elias-Fano: start of the high bit array, else 0

  /// @brief Bitmask words: ceil(n / 32).
  [[nodiscard]] constexpr std::size_t words() const noexcept {
    return (n + word_elements - 1) / word_elements;
  }
  /// @brief Blocks of `block_elements`: ceil(n / 1024).
  [[nodiscard]] constexpr std::size_t blocks() const noexcept {
    return (n + block_elements - 1) / block_elements;
  }
  /// @brief Blocks of `ef_block_elements`: ceil(n / 8192).
  [[nodiscard]] constexpr std::size_t ef_blocks() const noexcept {
    return (n + ef_block_elements - 1) / ef_block_elements;
  }
  /// @brief Elias-Fano: 64-bit words of the low array, k * low_bits bits.
  [[nodiscard]] constexpr std::size_t low_words() const noexcept {
    return (k * low_bits + 63) / 64;
  }
  /// @brief Elias-Fano: 64-bit words of the high array, ((n - 1) >> low_bits) + k bits.
  [[nodiscard]] constexpr std::size_t high_words() const noexcept {
    return n == 0 ? 0 : (((n - 1) >> low_bits) + k + 63) / 64;
  }
  /// @brief Whether indices and block offsets are 64-bit (n >= 2^32).
  [[nodiscard]] constexpr bool wide() const noexcept { return wide_indices(n); }

  /// @brief Whether n elements need 64-bit indices and offsets.
  [[nodiscard]] static constexpr bool wide_indices(std::size_t n) noexcept {
    return static_cast<std::uint64_t>(n) >= (std::uint64_t{1} << 32);
  }

  friend constexpr bool operator==(const packed_layout&, const packed_layout&) = default;
};

/// @brief Rounds `bytes` up to `section_alignment`.
[[nodiscard]] constexpr std::size_t align_section(std::size_t bytes) noexcept {
  return (bytes + section_alignment - 1) / section_alignment * section_alignment;
}

/// @brief Which position encodings `make_layout` chooses from.
enum class position_choice : std::uint8_t {
  smallest,       ///< bitmask, Elias-Fano or index list, whichever is smallest (the default)
  no_elias_fano,  ///< bitmask or index list only: a faster pack and restore, more bytes
};

/// @brief Elias-Fano's low bits for k of n kept elements: floor(log2(n / k)), at most
/// `ef_max_low_bits`. @pre 0 < k <= n
[[nodiscard]] constexpr unsigned elias_fano_low_bits(std::size_t n, std::size_t k) noexcept {
  unsigned l = 0;
  while (l < ef_max_low_bits && (n >> (l + 1)) >= k)
    ++l;
  return l;
}

/**
 * @brief The layout of a payload that keeps k of n elements of `value_size` bytes each, stored
 * with `codec` (a quantized codec stores 1 byte per value whatever `value_size`, plus its scales).
 *
 * The smallest position encoding is chosen (on a tie: bitmask, then Elias-Fano, then index list);
 * `position_choice::no_elias_fano` leaves Elias-Fano out.
 * @pre k <= n
 */
[[nodiscard]] constexpr packed_layout make_layout(
    std::size_t n, std::size_t k, std::size_t value_size, value_codec codec = value_codec::exact,
    position_choice choice = position_choice::smallest) noexcept {
  packed_layout l;
  l.n = n;
  l.k = k;
  l.codec = codec;
  l.value_size = codec == value_codec::exact ? value_size : 1;
  l.values_bytes = k * l.value_size;
  l.scales_offset = l.values_bytes;
  std::size_t values_end = l.values_bytes;  // the values section and its scales
  if (codec != value_codec::exact && k > 0) {
    l.scales_offset = align_section(l.values_bytes);
    l.scales_bytes = (k + codec_chunk - 1) / codec_chunk * 4;
    values_end = l.scales_offset + l.scales_bytes;
  }
  if (k == 0 || k == n) {
    l.total_bytes = values_end;
    l.positions_offset = l.block_offsets_offset = l.total_bytes;
    return l;
  }
  const std::size_t index_size = packed_layout::wide_indices(n) ? 8 : 4;
  const std::size_t mask_bytes = l.words() * 4;
  const std::size_t offsets_bytes = l.blocks() * index_size;
  const std::size_t list_bytes = k * index_size;
  l.positions_offset = align_section(values_end);
  // Elias-Fano's size, sections aligned as they would be laid out.
  packed_layout ef = l;
  ef.low_bits = elias_fano_low_bits(n, k);
  const std::size_t ef_code = (ef.low_words() + ef.high_words()) * 8;
  const std::size_t ef_total =
      align_section(l.positions_offset + ef_code) + ef.ef_blocks() * index_size;
  const std::size_t mask_total = align_section(l.positions_offset + mask_bytes) + offsets_bytes;
  if (choice == position_choice::smallest && ef_total < mask_total &&
      ef_total < l.positions_offset + list_bytes) {
    ef.positions = position_encoding::elias_fano;
    ef.positions_bytes = ef_code;
    ef.high_offset = l.positions_offset + ef.low_words() * 8;
    ef.block_offsets_offset = align_section(l.positions_offset + ef_code);
    ef.block_offsets_bytes = ef.ef_blocks() * index_size;
    ef.total_bytes = ef_total;
    return ef;
  }
  if (mask_bytes + offsets_bytes <= list_bytes) {
    l.positions = position_encoding::bitmask;
    l.positions_bytes = mask_bytes;
    l.block_offsets_offset = align_section(l.positions_offset + mask_bytes);
    l.block_offsets_bytes = offsets_bytes;
    l.total_bytes = l.block_offsets_offset + offsets_bytes;
  } else {
    l.positions = index_size == 8 ? position_encoding::index64 : position_encoding::index32;
    l.positions_bytes = list_bytes;
    l.block_offsets_offset = l.positions_offset + list_bytes;
    l.total_bytes = l.block_offsets_offset;
  }
  return l;
}

/// @brief The padding bytes between sections: [begin, end) pairs, zeroed by every executor so that
/// payloads compare byte for byte.
struct padding_gaps {
  static constexpr int count = 3;  ///< gaps of a layout
  std::size_t begin[count];        ///< start of each gap
  std::size_t end[count];          ///< end of each gap (== begin when empty)
};

/// @brief The gaps of a layout: after the values, after the scales, after the positions.
[[nodiscard]] constexpr padding_gaps padding_of(const packed_layout& l) noexcept {
  const std::size_t scales_end = l.scales_offset + l.scales_bytes;
  return {{l.values_bytes, scales_end, l.positions_offset + l.positions_bytes},
          {l.scales_offset, l.positions_offset, l.block_offsets_offset}};
}

}  // namespace dropit
