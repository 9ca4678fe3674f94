/**
 * @file codec.hpp
 * @brief The value codecs' arithmetic (codec.hpp states the rules), written once for every
 * executor: the e4m3 conversions, and the encoding and decoding of one chunk of kept values, which
 * the host runs per chunk on its workers and the CUDA executor per chunk as a Thrust body.
 *
 * Every rounding is explicit (a float product rounded once, then rounded to an integer or to
 * e4m3 on its bits), so no compiler contraction or device intrinsic changes a byte: payloads are
 * the same on every executor.
 */
#pragma once

#include <dropit/codec.hpp>
#include <dropit/detail/config.hpp>
#include <dropit/policy.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__) && !defined(__CUDACC__)
#include <xmmintrin.h>
#endif

namespace dropit::detail {

/// A chunk whose largest finite |v| is below this stores scale 0 (its values restore as 0): the
/// inverse scale 127 / a or 448 / a must stay finite.
inline constexpr float codec_min_absmax = 0x1p-100f;

/// The not-a-number codes: int8 -128, e4m3 0x7f (sign clear).
inline constexpr std::int8_t int8_nan_code = -128;
inline constexpr std::uint8_t e4m3_nan_code = 0x7f;

/// The largest code magnitude of each quantized codec (what the chunk's absmax maps to).
[[nodiscard]] DROPIT_HD constexpr float codec_range(value_codec c) noexcept {
  return c == value_codec::int8 ? 127.0f : 448.0f;
}

DROPIT_HD inline std::uint32_t float_to_bits(float f) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

DROPIT_HD inline float bits_to_float(std::uint32_t b) noexcept {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// a * b rounded once to float (never fused with a neighbouring add).
DROPIT_HD inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a / b rounded once to float.
DROPIT_HD inline float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// Whether f is neither NaN nor infinite.
DROPIT_HD inline bool finite_float(float f) noexcept {
  return (float_to_bits(f) & 0x7f800000u) != 0x7f800000u;
}

/**
 * The e4m3 code nearest to f, ties to the even code; |f| beyond 448 saturates to +-448; NaN and
 * infinities give the NaN code (with f's sign).
 */
DROPIT_HD inline std::uint8_t e4m3_encode(float f) noexcept {
  const std::uint32_t b = float_to_bits(f);
  const auto sign = static_cast<std::uint8_t>((b >> 24) & 0x80u);
  const std::uint32_t a = b & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<std::uint8_t>(sign | e4m3_nan_code);
  int e = static_cast<int>(a >> 23) - 127;  // -127: zero or a float subnormal
  std::uint32_t m = a & 0x7fffffu;
  if (e == -127) {
    e = -126;
  } else {
    m |= 0x800000u;  // the 24-bit significand, 1.f x 2^e
  }
  // e4m3 normals have exponents -6..8 and 3 fraction bits; below 2^-6 the code counts 2^-9 steps.
  const int shift = 20 + (e < -6 ? -6 - e : 0);  // significand bits the code drops
  std::uint32_t q = 0;
  if (shift < 32) {
    q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
  }
  int ee = e < -6 ? -6 : e;
  if (q == 16) {  // the rounding carried into the exponent
    q = 8;
    ++ee;
  }
  if (ee > 8 || (ee == 8 && q > 14)) return static_cast<std::uint8_t>(sign | 0x7eu);  // 448
  if (q < 8) return static_cast<std::uint8_t>(sign | q);                              // subnormal
  return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(ee + 7) << 3 | (q - 8));
}

/// The value of an e4m3 code (NaN for the NaN codes).
DROPIT_HD inline float e4m3_decode(std::uint8_t c) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t ef = (c >> 3) & 0xfu, mf = c & 7u;
  if (ef == 15 && mf == 7) return bits_to_float(sign | 0x7fc00000u);
  if (ef == 0) {  // mf x 2^-9, exact in float
    return bits_to_float(sign | float_to_bits(static_cast<float>(mf) * 0x1p-9f));
  }
  return bits_to_float(sign | (ef - 7 + 127) << 23 | mf << 20);
}

/// q rounded to the nearest integer, ties to even (|q| <= 127 here; the default rounding mode).
DROPIT_HD inline int round_even(float q) noexcept {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(q);
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__) && !defined(__CUDACC__)
  return _mm_cvtss_si32(_mm_set_ss(q));  // one instruction; std::nearbyint is a libm call here
#else
  return static_cast<int>(std::nearbyint(q));
#endif
}

/// The int8 code of v given the chunk's inverse scale: round(v * inv) to nearest even, clamped to
/// +-127 (the product may pass 127 by its rounding); the NaN code when v is not finite.
DROPIT_HD inline std::uint8_t int8_code(float v, float inv) noexcept {
  if (!finite_float(v)) return static_cast<std::uint8_t>(int8_nan_code);
  int r = round_even(mul_rn(v, inv));
  r = r > 127 ? 127 : (r < -127 ? -127 : r);
  return static_cast<std::uint8_t>(static_cast<std::int8_t>(r));
}

/// A chunk's scale and inverse scale.
struct chunk_scale {
  float scale;
  float inv;
};

/// The scale (a / range) and inverse scale (range / a) of a chunk whose largest finite |v| is a;
/// both 0 below `codec_min_absmax`.
DROPIT_HD inline chunk_scale scale_of(float a, float range) noexcept {
  if (!(a >= codec_min_absmax)) return {0.0f, 0.0f};
  return {div_rn(a, range), div_rn(range, a)};
}

/// The stochastic draw of value index i: 24 random bits as a fraction in [0, 1).
DROPIT_HD inline double codec_draw(std::uint64_t salt, std::size_t i) noexcept {
  return static_cast<double>(mix64(salt + static_cast<std::uint64_t>(i) * random_golden) >> 40) *
         0x1p-24;
}

/// What encoding a chunk needs besides the values: the codec, and int8's rounding.
struct codec_params {
  value_codec kind = value_codec::exact;
  bool stochastic = false;
  std::uint64_t salt = 0;  ///< mix64(seed)
};

/// The parameters of a codec object.
template <class C>
[[nodiscard]] codec_params params_of(const C& c) noexcept {
  codec_params p;
  p.kind = C::kind;
  if constexpr (C::kind == value_codec::int8) {
    p.stochastic = c.stochastic;
    p.salt = mix64(c.seed);
  }
  return p;
}

/// Chunks of k values.
[[nodiscard]] DROPIT_HD constexpr std::size_t codec_chunks(std::size_t k) noexcept {
  return (k + codec_chunk - 1) / codec_chunk;
}

/**
 * Encodes chunk c of the k values (values[c * codec_chunk, ...)) into codes and scales[c]: the
 * largest finite |v|, the scale, then one code per value (codec.hpp's table).
 */
template <class T>
DROPIT_HD void encode_chunk(const T* values, std::size_t k, std::size_t c, const codec_params& p,
                            std::uint8_t* codes, float* scales) noexcept {
  const std::size_t begin = c * codec_chunk;
  const std::size_t end = k - begin < codec_chunk ? k : begin + codec_chunk;
  float a = 0.0f;
  for (std::size_t i = begin; i < end; ++i) {
    const float v = static_cast<float>(values[i]);
    const float m = v < 0.0f ? -v : v;
    if (finite_float(v) && m > a) a = m;
  }
  const chunk_scale cs = scale_of(a, codec_range(p.kind));
  scales[c] = cs.scale;
  for (std::size_t i = begin; i < end; ++i) {
    const float v = static_cast<float>(values[i]);
    if (p.kind == value_codec::fp8_e4m3) {
      codes[i] = e4m3_encode(finite_float(v) ? mul_rn(v, cs.inv) : v);  // NaN code, v's sign
    } else if (!p.stochastic || !finite_float(v)) {
      codes[i] = int8_code(v, cs.inv);
    } else {
      const double up = static_cast<double>(mul_rn(v, cs.inv)) + codec_draw(p.salt, i);
      int r = static_cast<int>(std::floor(up));
      r = r > 127 ? 127 : (r < -127 ? -127 : r);  // the product may pass +-127 by its rounding
      codes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(r));
    }
  }
}

/// Decodes chunk c of k values from codes and scales[c] into values.
template <class T>
DROPIT_HD void decode_chunk(const std::uint8_t* codes, const float* scales, std::size_t k,
                            std::size_t c, value_codec kind, T* values) noexcept {
  const std::size_t begin = c * codec_chunk;
  const std::size_t end = k - begin < codec_chunk ? k : begin + codec_chunk;
  const float s = scales[c];
  for (std::size_t i = begin; i < end; ++i) {
    float v;
    if (kind == value_codec::int8) {
      const auto code = static_cast<std::int8_t>(codes[i]);
      v = code == int8_nan_code ? bits_to_float(0x7fc00000u)  // NaN
                                : mul_rn(static_cast<float>(code), s);
    } else if ((codes[i] & 0x7fu) == e4m3_nan_code) {
      v = e4m3_decode(codes[i]);  // as it is: a GPU's product would give its canonical NaN
    } else {
      v = mul_rn(e4m3_decode(codes[i]), s);
    }
    values[i] = static_cast<T>(v);
  }
}

}  // namespace dropit::detail
