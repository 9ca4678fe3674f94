/**
 * @file codec.hpp
 * @brief How a `SparseCache` stores the values it keeps: exactly (`codec::exact`, the default), or
 * quantized to 8 bits with one scale per `codec_chunk` values (`codec::int8`, `codec::fp8_e4m3`).
 *
 * A codec is orthogonal to the policy: `Identity` + a codec is dense quantized storage (what
 * ActNN/GACT store activations as), `MinK` + a codec is DropIT with quantized kept values.
 *
 * The quantized codecs split the k kept values, in index order, into chunks of `codec_chunk`
 * (1024) values; each chunk stores one float scale and one byte per value:
 *
 * | codec | scale s of a chunk | code of value v | restored value |
 * | --- | --- | --- | --- |
 * | `int8` | a / 127 | round(v * (127 / a)) to nearest, ties to even (or stochastically) | code * s
 * | | `fp8_e4m3` | a / 448 | e4m3(v * (448 / a)), nearest, ties to even | e4m3 value * s |
 *
 * where a is the largest finite |v| of the chunk (all arithmetic in float; a = 0 gives s = 0 and
 * every finite value restores as 0). A NaN or infinite value does not enter a; it is stored as the
 * codec's not-a-number code (int8: -128; e4m3: 0x7f or 0xff) and restores as NaN. int8's stochastic
 * rounding (`codec::int8{.stochastic = true, .seed = s}`) rounds q = v * (127 / a) up with
 * probability q - floor(q), from a counter-based hash of (seed, value index), so the restored value
 * is unbiased in expectation over seeds and the same seed gives the same bytes on any executor.
 *
 * e4m3 is the OCP 8-bit float with 4 exponent bits (bias 7) and 3 mantissa bits, no infinities,
 * largest finite 448 (NVIDIA's `__nv_fp8_e4m3`).
 */
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dropit {

/// @brief How a payload stores its kept values.
enum class value_codec : std::uint8_t {
  exact,    ///< as the element type T
  int8,     ///< int8 codes, one float scale per chunk
  fp8_e4m3  ///< e4m3 codes, one float scale per chunk
};

/// @brief Kept values per scale of the quantized codecs.
inline constexpr std::size_t codec_chunk = 1024;

namespace codec {

/// @brief Kept values stored as they are (the default codec).
struct exact {
  static constexpr value_codec kind = value_codec::exact;  ///< the payload's codec
};

/// @brief int8 codes with a per-chunk absmax scale; optionally stochastic rounding.
struct int8 {
  static constexpr value_codec kind = value_codec::int8;  ///< the payload's codec
  bool stochastic = false;  ///< round up with probability q - floor(q) instead of to nearest
  std::uint64_t seed =
      0;  ///< the stochastic rounding's draws derive from it (give each step its own)
};

/// @brief e4m3 8-bit float codes with a per-chunk absmax scale.
struct fp8_e4m3 {
  static constexpr value_codec kind = value_codec::fp8_e4m3;  ///< the payload's codec
};

}  // namespace codec

/**
 * @brief A value codec: a small trivially copyable type that names its `value_codec` (`C::kind`).
 * `codec::int8` also carries its rounding mode and seed.
 */
template <class C>
concept value_codec_type = std::is_trivially_copyable_v<C> && requires {
  { C::kind } -> std::convertible_to<value_codec>;
};

}  // namespace dropit
