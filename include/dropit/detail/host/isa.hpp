/**
 * @file isa.hpp
 * @brief Which vector instructions the host kernels use, chosen once at run time: the x86-64
 * baseline (SSE2), AVX2, or AVX-512 (F, BW, DQ, VL). Nothing is assumed at compile time: the
 * wider kernels are functions with GCC/Clang `target` attributes, called only on CPUs that have
 * the instructions. Off x86 (or under nvcc) everything runs the portable code.
 */
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
#define DROPIT_HOST_X86 1
#include <immintrin.h>
/// Functions that may use AVX2 (with POPCNT and BMI1/2, which every AVX2 CPU has).
#define DROPIT_TARGET_AVX2 __attribute__((target("avx2,popcnt,bmi,bmi2")))
/// Functions that may use AVX-512 F, BW, DQ, VL.
#define DROPIT_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,popcnt,bmi,bmi2")))
/// Functions that may also use AVX-512 VBMI2 (byte compress: Ice Lake, Zen 4 and later).
#define DROPIT_TARGET_AVX512_VBMI2 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi2,avx2,popcnt,bmi,bmi2")))
#else
#define DROPIT_HOST_X86 0
#endif

#if DROPIT_HOST_X86 && defined(__SSE2__)
#define DROPIT_HOST_SSE2 1
#else
#define DROPIT_HOST_SSE2 0
#endif

/// GCC 12's AVX-512 intrinsics start from an undefined vector, which -Wmaybe-uninitialized
/// reports (GCC PR105593, fixed in GCC 13): files with AVX-512 kernels turn it off around them.
#if defined(__GNUC__) && !defined(__clang__)
#define DROPIT_AVX512_WARNINGS_OFF \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DROPIT_AVX512_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define DROPIT_AVX512_WARNINGS_OFF
#define DROPIT_AVX512_WARNINGS_ON
#endif

namespace dropit::detail {

/// Instruction sets the host kernels choose from.
enum class host_isa : int {
  baseline = 0,  ///< SSE2 on x86-64, plain C++ elsewhere
  avx2 = 1,
  avx512 = 2
};

/// What this CPU (and its OS) supports.
[[nodiscard]] inline host_isa detect_host_isa() noexcept {
#if DROPIT_HOST_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi2")) {
    return host_isa::avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt") &&
      __builtin_cpu_supports("bmi2")) {
    return host_isa::avx2;
  }
#endif
  return host_isa::baseline;
}

/// Whether the CPU has AVX-512 VBMI2 besides `host_isa::avx512` (a kernel uses it only where the
/// active instruction set is `avx512`, so the tests' cap turns it off with the rest).
[[nodiscard]] inline bool host_has_vbmi2() noexcept {
#if DROPIT_HOST_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return detect_host_isa() == host_isa::avx512 && __builtin_cpu_supports("avx512vbmi2");
  }();
  return has;
#else
  return false;
#endif
}

/// The last-level cache's size as the OS reports it (`sysconf`), 32 MiB where it does not: what
/// decides whether x stays in the cache between two passes, and whether an output is written
/// with non-temporal stores.
[[nodiscard]] inline std::size_t host_llc_bytes() noexcept {
  static const std::size_t bytes = [] {
    long l3 = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return l3 > 0 ? static_cast<std::size_t>(l3) : std::size_t{32} << 20;
  }();
  return bytes;
}

/// The highest instruction set the kernels may use; tests lower it to run every variant.
[[nodiscard]] inline std::atomic<int>& host_isa_cap() noexcept {
  static std::atomic<int> cap{static_cast<int>(host_isa::avx512)};
  return cap;
}

/// The instruction set the kernels use now: what the CPU has, at most the cap.
[[nodiscard]] inline host_isa active_host_isa() noexcept {
  static const host_isa detected = detect_host_isa();
  return static_cast<host_isa>(
      std::min(static_cast<int>(detected), host_isa_cap().load(std::memory_order_relaxed)));
}

}  // namespace dropit::detail
