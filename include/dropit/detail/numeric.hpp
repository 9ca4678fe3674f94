/**
 * @file numeric.hpp
 * @brief Bit-level facts about the supported element types, usable on host and device.
 */
#pragma once

#include <dropit/detail/config.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace dropit::detail {

/// The IEEE layout of a floating-point element type: its bit-pattern type and the +Inf pattern.
template <class T>
struct float_traits;

template <>
struct float_traits<float> {
  using bits = std::uint32_t;
  static constexpr bits magnitude_mask = 0x7fffffffu;
  static constexpr bits infinity = 0x7f800000u;
};

template <>
struct float_traits<double> {
  using bits = std::uint64_t;
  static constexpr bits magnitude_mask = 0x7fffffffffffffffull;
  static constexpr bits infinity = 0x7ff0000000000000ull;
};

#if DROPIT_HAS_HALF
template <>
struct float_traits<__half> {
  using bits = std::uint16_t;
  static constexpr bits magnitude_mask = 0x7fff;
  static constexpr bits infinity = 0x7c00;
};

template <>
struct float_traits<__nv_bfloat16> {
  using bits = std::uint16_t;
  static constexpr bits magnitude_mask = 0x7fff;
  static constexpr bits infinity = 0x7f80;
};
#endif

/// The element's bit pattern (memcpy: valid in device code and free after optimisation).
template <class T>
DROPIT_HD inline typename float_traits<T>::bits to_bits(T x) noexcept {
  typename float_traits<T>::bits b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/**
 * The magnitude key of MinK: the IEEE bits with the sign cleared compare like |x|; every NaN maps
 * to the one pattern just above +Inf, so NaNs rank above +Inf and tie among themselves.
 */
template <class T>
DROPIT_HD inline typename float_traits<T>::bits magnitude_key(T x) noexcept {
  using traits = float_traits<T>;
  const auto m = static_cast<typename traits::bits>(to_bits(x) & traits::magnitude_mask);
  return m > traits::infinity ? static_cast<typename traits::bits>(traits::infinity + 1) : m;
}

/// `v * scale` in T's precision (half types go through float).
template <class T>
DROPIT_HD inline T scaled(T v, double scale) noexcept {
  if constexpr (std::is_same_v<T, double>) {
    return v * scale;
  } else if constexpr (std::is_same_v<T, float>) {
    return v * static_cast<float>(scale);
  } else {
    return T(static_cast<float>(v) * static_cast<float>(scale));
  }
}

/// Population count of a 32-bit word on host and device. On x86 without the POPCNT instruction
/// enabled (the x86-64 baseline), std::popcount is a call into libgcc; the inline bit-parallel
/// count is several times faster there.
DROPIT_HD inline int popcount32(std::uint32_t w) noexcept {
#if defined(__CUDA_ARCH__)
  return __popc(w);
#elif (defined(__x86_64__) || defined(__i386__)) && !defined(__POPCNT__)
  w = w - ((w >> 1) & 0x55555555u);
  w = (w & 0x33333333u) + ((w >> 2) & 0x33333333u);
  w = (w + (w >> 4)) & 0x0f0f0f0fu;
  return static_cast<int>((w * 0x01010101u) >> 24);
#else
  return std::popcount(w);
#endif
}

/// Index of the lowest set bit of a non-zero 32-bit word.
DROPIT_HD inline int lowest_bit32(std::uint32_t w) noexcept {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(w)) - 1;
#else
  return std::countr_zero(w);
#endif
}

/// Index of the lowest set bit of a non-zero 64-bit word.
DROPIT_HD inline int lowest_bit64(std::uint64_t w) noexcept {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(w)) - 1;
#else
  return std::countr_zero(w);
#endif
}

}  // namespace dropit::detail
