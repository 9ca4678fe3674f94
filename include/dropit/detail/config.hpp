/**
 * @file config.hpp
 * @brief Compiler and toolkit detection shared by every dropit header.
 */
#pragma once

/// Marks the per-element step bodies so that nvcc compiles them for host and device alike.
#if defined(__CUDACC__)
#define DROPIT_HD __host__ __device__
#else
#define DROPIT_HD
#endif

/// 1 when the CUDA toolkit's half-precision headers are reachable: `__half` and `__nv_bfloat16`
/// are then supported element types (in host code too; g++ compiles them).
#if defined(DROPIT_DISABLE_HALF)
#define DROPIT_HAS_HALF 0
#elif __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>)
#define DROPIT_HAS_HALF 1
#else
#define DROPIT_HAS_HALF 0
#endif

#if DROPIT_HAS_HALF
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
