/**
 * @file dropit.hpp
 * @brief Everything of dropit that needs only the C++ standard library (and, for the
 * half-precision element types, the CUDA toolkit's headers): policies, the packed format,
 * `SparseCache`, the host executor and the checkpoint planner.
 *
 * The CUDA executor (`<dropit/exec/cuda.cuh>`) and the LibTorch adapter (`<dropit/torch.hpp>`) are
 * included separately.
 */
#pragma once

#include <dropit/checkpoint.hpp>
#include <dropit/error.hpp>
#include <dropit/exec/host.hpp>
#include <dropit/format.hpp>
#include <dropit/policy.hpp>
#include <dropit/sparse_cache.hpp>
