/**
 * @file runtime.hpp
 * @brief Picks the memory/stream layer: a CUDA device, or the emulated one.
 */
#pragma once

#include <dropit/detail/cuda/config.hpp>

#if DROPIT_CUDA_EMULATED
#include <dropit/detail/cuda/runtime_emulated.hpp>
#else
#include <dropit/detail/cuda/runtime_cuda.cuh>
#endif
