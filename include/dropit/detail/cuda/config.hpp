/**
 * @file config.hpp
 * @brief Which device the CUDA executor runs on: a real CUDA device (nvcc, Thrust's CUDA system),
 * or the emulated device (any C++20 compiler, Thrust's OpenMP or C++ system).
 *
 * The algorithm layer is the same source for both; only the memory/stream layer
 * (`runtime_cuda.cuh` or `runtime_emulated.hpp`) and the nvcc-only fast kernels differ.
 */
#pragma once

#include <dropit/detail/config.hpp>

#include <thrust/detail/config.h>

#include <cuda_runtime_api.h>  // cudaStream_t, cudaError_t (types only in the emulated build)

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#if !defined(__CUDACC__)
#error \
    "dropit/exec/cuda.cuh: compile with nvcc, or define THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (with -fopenmp) to run the CUDA executor on the emulated device"
#endif
/// 0: work runs on a CUDA device. 1: Thrust's host device system runs it (no CUDA calls are made).
#define DROPIT_CUDA_EMULATED 0
#else
#define DROPIT_CUDA_EMULATED 1
#endif
