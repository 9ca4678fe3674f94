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
 * |               | index list (k ascending indices; 32-bit, 64-bit if n>=2^32) | k * 4 (or 8)  |
 * | block offsets | bitmask only: kept count before each block of 1024 elements | ceil(n/1024)*4|
 *
 * Positions are stored as whichever of bitmask (+ block offsets) and index list is smaller; none
 * are stored when k = 0 or k = n (Identity, gamma = 0). The block offsets let restore expand every
 * block independently, in one parallel pass. Offsets are 64-bit, like indices, when n >= 2^32.
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
  none,     ///< no positions: k = 0 (nothing kept) or k = n (dense copy)
  bitmask,  ///< one bit per element plus a running count every `block_elements` elements
  index32,  ///< k ascending 32-bit indices
  index64   ///< k ascending 64-bit indices (n >= 2^32)
};

/// @brief Elements per block offset of the bitmask encoding (32 words of 32 bits).
inline constexpr std::size_t block_elements = 1024;
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
  std::size_t positions_offset = 0;      ///< start of the bitmask or index list
  std::size_t positions_bytes = 0;       ///< size of the bitmask or index list
  std::size_t block_offsets_offset = 0;  ///< start of the block offsets
  std::size_t block_offsets_bytes = 0;   ///< bitmask only, else 0
  std::size_t total_bytes = 0;           ///< bytes of the whole payload

  /// @brief Bitmask words: ceil(n / 32).
  [[nodiscard]] constexpr std::size_t words() const noexcept {
    return (n + word_elements - 1) / word_elements;
  }
  /// @brief Blocks of `block_elements`: ceil(n / 1024).
  [[nodiscard]] constexpr std::size_t blocks() const noexcept {
    return (n + block_elements - 1) / block_elements;
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

/**
 * @brief The layout of a payload that keeps k of n elements of `value_size` bytes each, stored
 * with `codec` (a quantized codec stores 1 byte per value whatever `value_size`, plus its scales).
 *
 * The bitmask is chosen when it is no larger than the index list.
 * @pre k <= n
 */
[[nodiscard]] constexpr packed_layout make_layout(std::size_t n, std::size_t k,
                                                  std::size_t value_size,
                                                  value_codec codec = value_codec::exact) noexcept {
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
