// Helpers shared by the LibTorch adapter's tests.
#pragma once

#include <dropit/torch.hpp>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dropit_torch_test {

namespace dt = dropit::torch;

/// max |a - b| / max(1, max |b|), in double (0 for two empty tensors).
inline double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.defined());
  REQUIRE(b.defined());
  REQUIRE(a.sizes() == b.sizes());
  if (a.numel() == 0) return 0.0;
  const auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  const double scale = std::max(1.0, bd.abs().max().item<double>());
  return (ad - bd).abs().max().item<double>() / scale;
}

/// Runs LibTorch with two threads, as the examples do.
struct torch_threads {
  torch_threads() { torch::set_num_threads(2); }
};

/// Runs f() once per instruction set the host kernels choose from (baseline, AVX2, AVX-512), as
/// far as this CPU has them (a missing one runs the widest it has, and says so).
template <class F>
void for_each_isa(const F& f) {
  auto& cap = dropit::detail::host_isa_cap();
  const int saved = cap.load();
  for (int isa = 0; isa <= 2; ++isa) {
    cap.store(isa);
    CAPTURE(isa);
    if (static_cast<int>(dropit::detail::active_host_isa()) < isa)
      MESSAGE("this CPU lacks instruction set ", isa, ": its widest one runs instead");
    f();
  }
  cap.store(saved);
}

/// The policy of the given kind with gamma 0.9.
inline dt::policy make_policy(dt::policy_kind kind, double gamma = 0.9, std::uint64_t seed = 0) {
  dt::policy p;
  p.kind = kind;
  p.gamma = gamma;
  p.seed = seed;
  return p;
}

/// x with every element distinct in magnitude (no ties for MinK): a random permutation of
/// 1..n scaled, with random signs.
inline torch::Tensor tie_free(at::IntArrayRef sizes, torch::ScalarType dtype = torch::kFloat,
                              std::uint64_t seed = 1) {
  torch::manual_seed(seed);
  std::int64_t n = 1;
  for (auto s : sizes)
    n *= s;
  auto mags = (torch::randperm(n, torch::kDouble) + 1.0) / static_cast<double>(n);
  auto signs = torch::randint(0, 2, {n}, torch::kDouble) * 2.0 - 1.0;
  return (mags * signs).reshape(sizes).to(dtype);
}

/// DropIT's reference sparsification of x (memory order = logical order for contiguous x):
/// keep the k largest |x| found by torch::topk, zeros elsewhere.
inline torch::Tensor topk_sparsified(const torch::Tensor& x, double gamma) {
  const auto flat = x.contiguous().reshape({-1});
  const auto n = flat.numel();
  const auto k = n - static_cast<std::int64_t>(std::floor(static_cast<double>(n) * gamma + 1e-6));
  auto out = torch::zeros_like(flat);
  if (k > 0) {
    const auto idx = std::get<1>(torch::topk(flat.abs(), k));
    out.index_put_({idx}, flat.index({idx}));
  }
  return out.reshape(x.sizes());
}

/**
 * Checks that `mine` refuses, as a dropit::error carrying LibTorch's message, what LibTorch's
 * in-place op `ref` refuses: a leaf that requires grad, a view of one, an output of an op with
 * several views (chunk) and a view made in no_grad mode. Each op gets a fresh tensor.
 */
template <class Mine, class Ref>
void check_refuses_forbidden_views(const Mine& mine, const Ref& ref) {
  const auto x = torch::randn({8, 6}, torch::requires_grad());
  const auto chunked = [&] { return (x * 1.0).chunk(2)[0]; };
  const auto no_grad_view = [&] {
    const auto y = x * 1.0;
    const torch::NoGradGuard no_grad;
    return y.narrow(0, 0, 4);
  };
  const auto check = [&](const auto& view, const char* which) {
    CAPTURE(which);
    std::string expected;
    try {
      auto a = view();
      (void)ref(a);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      expected = what.substr(0, what.find('\n'));
    }
    REQUIRE_FALSE(expected.empty());
    auto b = view();
    CHECK_THROWS_WITH_AS((void)mine(b), doctest::Contains(expected.c_str()), dropit::error);
  };
  check(chunked, "an output of chunk");
  check(no_grad_view, "a view made in no_grad mode");
  check([&] { return x; }, "a leaf");
  check([&] { return x.narrow(0, 0, 4); }, "a view of a leaf");
}

}  // namespace dropit_torch_test
