/**
 * @file error.hpp
 * @brief `DROPIT_CUDA_TRY` and the message of `dropit::cuda_error`.
 */
#pragma once

#include <dropit/detail/cuda/config.hpp>
#include <dropit/error.hpp>

#include <string>

namespace dropit::detail {

/// "dropit: CUDA error at <file>:<line>: <call> failed: <name>: <text>". Pure formatting, so the
/// message is tested without a device.
[[nodiscard]] inline std::string cuda_error_message(const char* call, const char* file, int line,
                                                    const char* name, const char* text) {
  return concat("dropit: CUDA error at ", file, ":", line, ": ", call, " failed: ", name, ": ",
                text);
}

#if !DROPIT_CUDA_EMULATED
/// Clears the runtime's last (non-sticky) error and throws `dropit::cuda_error` for `code`.
[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file,
                                          int line) {
  (void)cudaGetLastError();
  throw cuda_error(
      cuda_error_message(call, file, line, cudaGetErrorName(code), cudaGetErrorString(code)));
}
#endif

}  // namespace dropit::detail

#if !DROPIT_CUDA_EMULATED
/**
 * @brief Runs a CUDA runtime call and throws `dropit::cuda_error` (file, line, the call, the
 * error's name and string) unless it returns `cudaSuccess`.
 *
 * `DROPIT_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, stream));`
 */
#define DROPIT_CUDA_TRY(call)                                                             \
  do {                                                                                    \
    const cudaError_t dropit_cuda_status_ = (call);                                       \
    if (dropit_cuda_status_ != cudaSuccess) [[unlikely]]                                  \
      ::dropit::detail::throw_cuda_error(dropit_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
