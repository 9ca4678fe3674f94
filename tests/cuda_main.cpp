// doctest's main for the device suites. On a machine without a CUDA device the real-CUDA binary
// says why, doctest lists every device case as skipped, and the exit code is 77, which ctest
// reports as "Skipped" (SKIP_RETURN_CODE): never a silent pass, never a failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#if defined(DROPIT_TEST_REAL_CUDA)
#include <cuda_runtime_api.h>

namespace {
std::string no_device_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  return count == 0 ? "cudaGetDeviceCount found no device" : "";
}
}  // namespace
#else
namespace {
std::string no_device_reason() {
  return {};
}
}  // namespace
#endif

int main(int argc, char** argv) {
  const std::string reason = no_device_reason();
  if (!reason.empty()) {
    std::printf("no CUDA device (%s): every case that needs one is skipped\n", reason.c_str());
  }
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit() || status != 0) return status;
  return reason.empty() ? 0 : 77;
}
