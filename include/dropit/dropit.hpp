/**
 * @file dropit.hpp
 * @brief The core of dropit (CMake target `dropit::dropit`): policies, value codecs, the packed
 * format, `SparseCache` and the host executor. It needs only the C++ standard library (and, for the
 * half-precision element types, the CUDA toolkit's headers).
 *
 * The other components have umbrella headers and targets of their own: the checkpoint planner
 * (`<dropit/checkpoint.hpp>`, `dropit::checkpoint`), the CUDA executor (`<dropit/exec/cuda.cuh>`,
 * `dropit::cuda`) and the LibTorch adapter (`<dropit/torch.hpp>`, `dropit::torch`).
 */
#pragma once

#include <dropit/codec.hpp>
#include <dropit/error.hpp>
#include <dropit/exec/host.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>
#include <dropit/sparse_cache.hpp>
