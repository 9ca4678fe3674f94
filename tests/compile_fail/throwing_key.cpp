// Must NOT compile: a policy whose key(x, i) may throw. Keys are computed on worker threads and in
// device kernels, where an exception cannot reach the caller, so policy_for requires noexcept.
#include <dropit/dropit.hpp>

#include <cstdint>
#include <vector>

struct throwing_key {
  [[nodiscard]] std::size_t kept(std::size_t n) const noexcept { return n / 2; }
  [[nodiscard]] std::uint32_t key(float x, std::size_t) const {  // not noexcept
    if (x != x) throw 1;
    return 0;
  }
};

int main() {
  std::vector<float> x(8, 1.0f);
  dropit::SparseCache<float, throwing_key> cache{throwing_key{}};
  cache.pack(dropit::host, x);
}
