// Uses the installed CUDA component on the emulated device (Thrust's OpenMP system, host memory).
#include <dropit/dropit.hpp>
#include <dropit/exec/cuda.cuh>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i % 100);
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(dropit::cuda_executor{}, std::span<const float>(x));
  std::vector<float> out(x.size());
  cache.restore(dropit::cuda_executor{}, std::span<float>(out));
  std::size_t kept = 0;
  for (float v : out)
    kept += v != 0.0f;
  std::printf("consumer_cuda (emulated): kept %zu of %zu\n", kept, x.size());
  return kept == 100 && cache.space() == dropit::memory_space::device ? 0 : 1;
}
