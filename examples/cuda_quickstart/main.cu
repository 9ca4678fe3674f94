#include <dropit/dropit.hpp>
#include <dropit/exec/cuda.cuh>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_quickstart: no CUDA device here\n");
    return 0;
  }
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i)
    host[i] = std::sin(0.001f * static_cast<float>(i)) * static_cast<float>(i % 100);

  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  float* x = nullptr;
  float* rebuilt = nullptr;
  cudaMallocAsync(&x, n * sizeof(float), stream);
  cudaMallocAsync(&rebuilt, n * sizeof(float), stream);
  cudaMemcpyAsync(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream);

  // Forward: keep the 10% of x with the largest magnitude. The work is enqueued on `stream`; the
  // call returns at once (k is known up front, nothing is copied back to the host).
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(dropit::cuda_executor{stream}, std::span<const float>(x, n));

  // Backward: rebuild the dense tensor on the same stream, zeros where elements were dropped.
  cache.restore(dropit::cuda_executor{stream}, std::span<float>(rebuilt, n));

  std::vector<float> back(n);
  cudaMemcpyAsync(back.data(), rebuilt, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  std::size_t nonzero = 0;
  for (float v : back)
    nonzero += v != 0.0f;
  const std::size_t kept = cache.kept();  // k = n - floor(0.9 n): 104858 of 2^20
  std::printf("kept %zu of %zu (%zu non-zero after restore), %zu payload bytes in %s memory\n",
              cache.kept(), cache.size(), nonzero, cache.bytes(),
              cache.space() == dropit::memory_space::device ? "device" : "host");

  try {
    // host memory: rejected
    cache.pack(dropit::cuda_executor{stream}, std::span<const float>(host));
  } catch (const dropit::error& e) {
    std::printf("%s\n", e.what());
  }

  cache.clear();  // gives the payload back, stream-ordered on `stream`
  cudaFreeAsync(x, stream);
  cudaFreeAsync(rebuilt, stream);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  return cache.empty() && nonzero == kept ? 0 : 1;
}
