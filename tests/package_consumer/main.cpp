// Uses the installed headers: pack and restore, half types included when the toolkit is present.
#include <dropit/dropit.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 100);
  dropit::SparseCache<float, dropit::MinK<0.9>> cache;
  cache.pack(dropit::host, x);
  std::vector<float> out(x.size());
  cache.restore(dropit::host, std::span<float>(out));
  std::size_t kept = 0;
  for (float v : out) kept += v != 0.0f;
#if DROPIT_HAS_HALF
  dropit::SparseCache<__half, dropit::Identity> half_cache;
  std::vector<__half> h(10, __float2half(1.0f));
  half_cache.pack(dropit::host, h);
  if (half_cache.bytes() != 20) return 2;
#endif
  std::printf("consumer: kept %zu of %zu\n", kept, x.size());
  return kept == cache.kept() && kept == 100 ? 0 : 1;
}
