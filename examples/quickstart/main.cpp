// quickstart: sparsify a synthetic saved activation the way a training engine would, and show
// what each policy keeps, what it costs in bytes, and how far the rebuilt tensor is from the input.
//
//   quickstart [--n N] [--gamma G] [--threads T]
#include <dropit/dropit.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

namespace {

struct options {
  std::size_t n = std::size_t{1} << 22;
  double gamma = 0.9;
  unsigned threads = 0;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "quickstart: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--n") {
      o.n = std::strtoull(value(), nullptr, 10);
    } else if (a == "--gamma") {
      o.gamma = std::strtod(value(), nullptr);
    } else if (a == "--threads") {
      o.threads = static_cast<unsigned>(std::strtoul(value(), nullptr, 10));
    } else {
      std::fprintf(stderr, "usage: quickstart [--n N] [--gamma G] [--threads T]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return o;
}

/// Relative L2 error of the rebuilt tensor, and the share of the input's energy it keeps.
void report(const char* name, const std::vector<float>& x, const std::vector<float>& r,
            std::size_t kept, std::size_t bytes, double seconds) {
  double err = 0, norm = 0, kept_energy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err += (double(x[i]) - r[i]) * (double(x[i]) - r[i]);
    norm += double(x[i]) * x[i];
    kept_energy += double(r[i]) * r[i];
  }
  std::printf("%-10s %12zu %10.1f %12.3f %12.3f %10.1f%% %9.2f\n", name, kept,
              double(bytes) / (1 << 20), double(bytes) / double(x.size()),
              std::sqrt(err / norm), 100.0 * kept_energy / norm, seconds * 1e3);
}

template <class Policy>
void run(const char* name, const Policy& policy, const std::vector<float>& x,
         const dropit::host_executor& exec) {
  dropit::SparseCache<float, Policy> cache{policy};
  const auto t0 = std::chrono::steady_clock::now();
  cache.pack(exec, x);  // forward: what the saved-tensor hook would store
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<float> rebuilt(x.size());
  cache.restore(exec, std::span<float>(rebuilt));  // backward: the dense tensor the layer needs
  report(name, x, rebuilt, cache.kept(), cache.bytes(),
         std::chrono::duration<double>(t1 - t0).count());
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  // A post-GELU-like activation: heavy-tailed, mostly small values.
  std::vector<float> x(o.n);
  std::mt19937 gen(42);
  std::normal_distribution<float> normal;
  for (auto& v : x) {
    const float z = normal(gen);
    v = z * 0.5f * (1.0f + std::erf(z / std::sqrt(2.0f)));
  }
  const dropit::host_executor exec{.threads = o.threads};
  std::printf("n = %zu floats (%.1f MiB dense), gamma = %.2f, %u threads\n\n", o.n,
              double(o.n * 4) / (1 << 20), o.gamma, exec.thread_count(o.n));
  std::printf("%-10s %12s %10s %12s %12s %11s %9s\n", "policy", "kept", "MiB", "bytes/elem",
              "rel. error", "energy", "pack ms");
  run("identity", dropit::Identity{}, x, exec);
  run("mink", dropit::MinK<>{o.gamma}, x, exec);
  run("random", dropit::Random<>{o.gamma, 1}, x, exec);
  return 0;
} catch (const dropit::error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
