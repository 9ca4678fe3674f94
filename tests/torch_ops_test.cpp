// The LibTorch adapter's mask-saving ops (ReLU, LeakyReLU, Hardtanh, MaxPool2d) and shape-saving
// average poolings against LibTorch's own, the counting allocator on known allocation patterns,
// and the payload memory resource.
#include <dropit/torch.hpp>

#include "torch_test_support.hpp"
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace dropit_torch_test;
namespace dt = dropit::torch;

const torch_threads two_threads;

/// Output and input gradient of f(x) against a fixed random output gradient.
template <class F>
std::pair<torch::Tensor, torch::Tensor> forward_backward(const F& f, const torch::Tensor& x0) {
  auto x = x0.detach().clone().requires_grad_(true);
  auto y = f(x);
  torch::manual_seed(77);
  auto g = torch::randn(y.sizes(), torch::kFloat).to(y.scalar_type());
  y.backward(g);
  return {y.detach(), x.grad()};
}

/// Exact equality, NaNs in the same places counting as equal.
bool same(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const auto nan_a = a.isnan(), nan_b = b.isnan();
  return torch::equal(nan_a, nan_b) &&
         torch::equal(a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0));
}

/// A gradient penalty through y = op(h), h = x * 1.5: the gradient gx of sum(y^2 w) (w fixed)
/// with its graph kept, and the gradient of sum(gx^2) + sum(gx x), whose backward runs through
/// the first one's.
template <class Op>
std::pair<torch::Tensor, torch::Tensor> gradient_penalty(const torch::Tensor& x, const Op& op) {
  const auto xi = x.clone().requires_grad_(true);
  auto h = xi * 1.5;
  const torch::Tensor y = op(h);
  const auto w = torch::linspace(-1.0, 2.0, y.numel()).view(y.sizes());
  const auto gx = torch::autograd::grad({(y * y * w).sum()}, {xi}, {}, true, true)[0];
  const auto ggx = torch::autograd::grad({(gx * gx).sum() + (gx * xi).sum()}, {xi})[0];
  return {gx.detach(), ggx};
}

// ---- fork-joins -------------------------------------------------------------------------------

TEST_CASE("the adapter's kernels fork only when dropit's fork_meter says it pays") {
  using dropit::detail::fork_meter;
  using dropit::torch::detail::parallel_pieces;
  for (std::uint64_t overhead : {std::uint64_t{0}, std::uint64_t{1} << 40}) {
    CAPTURE(overhead);
    fork_meter::set(overhead);
    const auto forks = fork_meter::samples();
    std::vector<int> hits(100003, 0);
    std::atomic<int> calls{0};
    parallel_pieces(3, 100003, 1000, 1.0, [&](std::int64_t b, std::int64_t e) {
      ++calls;
      CHECK(((b - 3) % 1000 == 0 || b == 3));  // pieces start on the grain
      for (std::int64_t i = b; i < e; ++i)
        ++hits[static_cast<std::size_t>(i)];
    });
    CHECK(std::count(hits.begin() + 3, hits.end(), 1) == 100000);
    CHECK(std::count(hits.begin(), hits.begin() + 3, 0) == 3);
    if (overhead == 0) {
      CHECK(calls.load() > 1);  // two threads: pieces
      CHECK(fork_meter::samples() == forks + 1);
    } else {
      CHECK(calls.load() == 1);  // one call on the caller, nothing forked
      CHECK(fork_meter::samples() == forks);
    }
  }
  fork_meter::set(0);
}

// ---- ReLU ------------------------------------------------------------------------------------

TEST_CASE("torch: mask ReLU output and gradient equal LibTorch's, zeros and NaN included") {
  for_each_isa([] {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
      CAPTURE(dtype);
      torch::manual_seed(1);
      // Integer-valued data: many exact zeros (relu's gradient at 0 is 0), -0.0, and a NaN.
      auto x = torch::randint(-3, 4, {5, 7, 33}, torch::kFloat);
      x.view({-1})[0] = -0.0f;
      x.view({-1})[1] = std::numeric_limits<float>::quiet_NaN();
      x.view({-1})[2] = -std::numeric_limits<float>::infinity();
      x = x.to(dtype);
      REQUIRE(x.eq(0).sum().item<std::int64_t>() > 100);
      auto [y, gx] = forward_backward([](const torch::Tensor& t) { return dt::relu(t); }, x);
      auto [ry, rgx] = forward_backward([](const torch::Tensor& t) { return torch::relu(t); }, x);
      CHECK(same(y, ry));
      CHECK(same(gx, rgx));
      CHECK(gx.masked_select(x.eq(0)).abs().sum().item<double>() == 0.0);
    }
  });
}

/**
 * An in-place mask op on views that are not dense (every row's first 5 of 9 columns; a transposed
 * one), against LibTorch's in-place op `theirs_in_place`: the view's base sees the result, and
 * the gradient through the base and through the op's output is LibTorch's. (Until 2026-12-07
 * such a view was processed out of place and the base kept its old values.)
 */
template <class InPlace, class TheirsInPlace>
void check_in_place_on_strided_views(const InPlace& in_place,
                                     const TheirsInPlace& theirs_in_place) {
  torch::manual_seed(5);
  const auto src = torch::randn({6, 9});
  const auto run = [&](const auto& op, bool transposed) {
    return forward_backward(
        [&](const torch::Tensor& t) {
          auto base = t * 1.0;
          auto view = transposed ? base.t().narrow(0, 2, 5) : base.narrow(1, 0, 5);
          REQUIRE_FALSE(view.is_non_overlapping_and_dense());
          auto out = op(view);
          return base * 3.0 + out.sum();  // reads the base after the op
        },
        src);
  };
  for (const bool transposed : {false, true}) {
    CAPTURE(transposed);
    auto [y, gx] = run(in_place, transposed);
    auto [ry, rgx] = run(theirs_in_place, transposed);
    CHECK(same(y, ry));
    CHECK(same(gx, rgx));
  }
}

TEST_CASE("torch: mask ReLU keeps strides (channels-last, transposed views) and works in place") {
  torch::manual_seed(2);
  auto base = torch::randn({2, 3, 5, 4});
  auto cl = base.contiguous(torch::MemoryFormat::ChannelsLast);
  auto [y, gx] = forward_backward([](const torch::Tensor& t) { return dt::relu(t); }, cl);
  auto [ry, rgx] = forward_backward([](const torch::Tensor& t) { return torch::relu(t); }, cl);
  CHECK(y.is_contiguous(torch::MemoryFormat::ChannelsLast));
  CHECK(same(y, ry));
  CHECK(same(gx, rgx));
  auto tr = torch::randn({6, 9}).t();  // not dense in memory order: goes through a copy
  auto [ty, tgx] = forward_backward([](const torch::Tensor& t) { return dt::relu(t); }, tr);
  auto [rty, rtgx] = forward_backward([](const torch::Tensor& t) { return torch::relu(t); }, tr);
  CHECK(same(ty, rty));
  CHECK(same(tgx, rtgx));

  // In place: on a non-leaf, the input's memory is reused and the mask is all that is saved.
  auto x = torch::randn({1000}).requires_grad_(true);
  auto h = x * 1.0;
  const void* storage = h.data_ptr();
  const auto masks_before = dt::live_saved_bytes().masks;
  auto out = dt::relu_(h);
  CHECK(out.data_ptr() == storage);
  CHECK(dt::live_saved_bytes().masks - masks_before == (1000 + 31) / 32 * 4);
  out.sum().backward();
  CHECK(torch::equal(x.grad(), x.detach().gt(0).to(torch::kFloat)));
  CHECK(dt::live_saved_bytes().masks == masks_before);
  check_in_place_on_strided_views([](torch::Tensor& t) { return dt::relu_(t); },
                                  [](torch::Tensor& t) { return torch::relu_(t); });
  // The module honours inplace in training and in eval mode.
  dt::ReLU inplace(torch::nn::ReLUOptions().inplace(true), make_policy(dt::policy_kind::mink));
  auto h2 = x * 1.0;
  CHECK(inplace(h2).data_ptr() == h2.data_ptr());
}

TEST_CASE("torch: the in-place mask ops refuse the views LibTorch's in-place ops refuse") {
  // Before, an autograd Function's mark_dirty on such a view failed LibTorch's internal assertion
  // (a full backward hook's input to nn.ReLU(inplace=True) in Python, say).
  check_refuses_forbidden_views([](torch::Tensor& t) { return dt::relu_(t); },
                                [](torch::Tensor& t) { return torch::relu_(t); });
  check_refuses_forbidden_views([](torch::Tensor& t) { return dt::leaky_relu_(t, 0.1); },
                                [](torch::Tensor& t) { return torch::leaky_relu_(t, 0.1); });
  check_refuses_forbidden_views([](torch::Tensor& t) { return dt::hardtanh_(t, -1.0, 1.0); },
                                [](torch::Tensor& t) { return torch::hardtanh_(t, -1.0, 1.0); });
}

/// Bytes that stay allocated while the graph of op(x * 1) is alive and every tensor handle but the
/// graph's output sum is dropped: what the op saved for backward (plus the 4-byte sum).
template <class Op>
std::size_t graph_bytes(dt::counting_allocator& counter, const torch::Tensor& x, const Op& op) {
  const auto base = counter.current_bytes();
  torch::Tensor z;
  {
    auto h = x * 1.0;
    z = op(h).sum();
  }
  return counter.current_bytes() - base - static_cast<std::size_t>(z.nbytes());
}

TEST_CASE("torch: mask ReLU saves 1 bit per element; LibTorch's saves its dense output") {
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  auto x = torch::randn({1 << 16}).requires_grad_(true);
  const auto ours = graph_bytes(counter, x, [](const torch::Tensor& h) { return dt::relu(h); });
  const auto theirs =
      graph_bytes(counter, x, [](const torch::Tensor& h) { return torch::relu(h); });
  CHECK(ours == (1u << 16) / 8);
  CHECK(theirs == (1u << 16) * 4);
  MESSAGE("ReLU saved bytes for 65536 floats: dropit " << ours << ", LibTorch " << theirs);
}

TEST_CASE("torch: mask ReLU's backward reuses a gradient only the engine holds, never a held one") {
  CHECK(dt::detail::engine_owned_use_count() > 0);
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  auto x = torch::randn({4096}).requires_grad_(true);
  auto allocations_in_backward = [&](auto relu) {
    auto y = (relu(x * 1.0) * 2.0).sum();
    const auto before = counter.allocations();
    y.backward();
    return counter.allocations() - before;
  };
  const auto ours = allocations_in_backward([](const torch::Tensor& h) { return dt::relu(h); });
  const auto ours_grad = x.grad().clone();
  x.grad().zero_();
  const auto theirs =
      allocations_in_backward([](const torch::Tensor& h) { return torch::relu(h); });
  CHECK(ours + 1 == theirs);  // LibTorch's threshold_backward allocates; ours overwrites
  CHECK(torch::equal(ours_grad, x.grad()));

  // retain_grad holds the incoming gradient: it must come out unmasked, and the result correct.
  x.grad().zero_();
  auto r = dt::relu(x * 1.0);
  r.retain_grad();
  (r * 2.0).sum().backward();
  CHECK(torch::equal(r.grad(), torch::full({4096}, 2.0f)));
  CHECK(torch::equal(x.grad(), ours_grad));
}

TEST_CASE("torch: the half-precision mask ReLU matches float ReLU") {
  torch::manual_seed(3);
  auto x = torch::randn({300}).to(torch::kHalf);
  auto [y, gx] = forward_backward([](const torch::Tensor& t) { return dt::relu(t); }, x);
  auto xf = x.to(torch::kFloat);
  CHECK(torch::equal(y.to(torch::kFloat), torch::relu(xf)));
  CHECK(torch::equal(gx.ne(0), xf.gt(0)));
}

// ---- LeakyReLU ------------------------------------------------------------------------------

TEST_CASE("torch: mask LeakyReLU output and gradient equal LibTorch's, zeros and NaN included") {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const double slope : {0.01, 0.2, 0.0, -0.5, 1.5}) {
      CAPTURE(dtype);
      CAPTURE(slope);
      torch::manual_seed(1);
      // Integer-valued data with fractions: exact zeros (scaled there), -0.0, NaN, -inf; 5 x 7 x
      // 33 elements: whole mask words and a partial last word.
      auto x = torch::randint(-3, 4, {5, 7, 33}, torch::kFloat) * 1.25;
      x.view({-1})[0] = -0.0f;
      x.view({-1})[1] = std::numeric_limits<float>::quiet_NaN();
      x.view({-1})[2] = -std::numeric_limits<float>::infinity();
      x = x.to(dtype);
      auto [y, gx] =
          forward_backward([slope](const torch::Tensor& t) { return dt::leaky_relu(t, slope); }, x);
      auto [ry, rgx] = forward_backward(
          [slope](const torch::Tensor& t) { return torch::leaky_relu(t, slope); }, x);
      CHECK(same(y, ry));
      CHECK(same(gx, rgx));
      // In place on a non-leaf: any slope (LibTorch's in-place op refuses a negative one in
      // backward), the same values and gradient as LibTorch's out-of-place op.
      auto [iy, igx] = forward_backward(
          [slope](const torch::Tensor& t) {
            auto h = t * 1.0;
            return dt::leaky_relu_(h, slope);
          },
          x);
      CHECK(same(iy, ry));
      CHECK(same(igx, rgx));
    }
  }
}

/**
 * What every elementwise mask op does with layouts and memory, checked against LibTorch's op
 * `theirs` (in place: `theirs_in_place`): channels-last and transposed inputs give LibTorch's
 * values, strides and gradient; in place on a strided view too; 1 bit per element is held where
 * LibTorch holds the whole tensor; in place the input's memory is reused and the gradient of a
 * sum is `sum_grad(x)`.
 */
template <class Ours, class Theirs, class InPlace, class TheirsInPlace, class SumGrad>
void check_mask_op_layouts(const Ours& ours, const Theirs& theirs, const InPlace& in_place,
                           const TheirsInPlace& theirs_in_place, const SumGrad& sum_grad) {
  torch::manual_seed(2);
  const auto cl = torch::randn({2, 3, 5, 4}).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto tr = torch::randn({6, 9}).t();  // not dense in memory order: goes through a copy
  for (const auto& x : {cl, tr}) {
    auto [y, gx] = forward_backward(ours, x);
    auto [ry, rgx] = forward_backward(theirs, x);
    CHECK(y.strides() == ry.strides());
    CHECK(same(y, ry));
    CHECK(same(gx, rgx));
  }
  check_in_place_on_strided_views(in_place, theirs_in_place);

  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  auto x = torch::randn({1 << 16}).requires_grad_(true);
  CHECK(graph_bytes(counter, x, ours) == (1u << 16) / 8);
  CHECK(graph_bytes(counter, x, theirs) == (1u << 16) * 4);
  auto h = x * 1.0;  // in place: the input's memory is reused, the mask is all that is saved
  const void* storage = h.data_ptr();
  const auto masks_before = dt::live_saved_bytes().masks;
  auto out = in_place(h);
  CHECK(out.data_ptr() == storage);
  CHECK(dt::live_saved_bytes().masks - masks_before == (1 << 16) / 8);
  out.sum().backward();
  CHECK(torch::equal(x.grad(), sum_grad(x.detach())));
  CHECK(dt::live_saved_bytes().masks == masks_before);
}

TEST_CASE("torch: mask LeakyReLU keeps strides, saves 1 bit per element and works in place") {
  check_mask_op_layouts([](const torch::Tensor& t) { return dt::leaky_relu(t, 0.1); },
                        [](const torch::Tensor& t) { return torch::leaky_relu(t, 0.1); },
                        [](torch::Tensor& t) { return dt::leaky_relu_(t, 0.1); },
                        [](torch::Tensor& t) { return torch::leaky_relu_(t, 0.1); },
                        [](const torch::Tensor& x) { return torch::where(x > 0, 1.0f, 0.1f); });
}

TEST_CASE(
    "torch: leaky_relu and leaky_relu_ under create_graph: double backward equals LibTorch's") {
  torch::manual_seed(6);
  const auto x = torch::randint(-3, 4, {2, 3, 5, 6}, torch::kFloat);
  for (bool in_place : {false, true}) {
    CAPTURE(in_place);
    const auto [gx, ggx] = gradient_penalty(x, [&](torch::Tensor& h) {
      return in_place ? dt::leaky_relu_(h, 0.2) : dt::leaky_relu(h, 0.2);
    });
    // LibTorch's in-place op is the same function of x
    const auto [rgx, rggx] =
        gradient_penalty(x, [](torch::Tensor& h) { return torch::leaky_relu(h, 0.2); });
    CHECK(same(gx, rgx));
    CHECK(same(ggx, rggx));
  }
}

/**
 * A Sequential(Linear(6, 8), act, Linear(8, 8), act, Linear(8, 3)) from `make` (the same model
 * at each call) through to_dropit: every child replaced, a step's parameter gradients equal to
 * the plain model's, the two masks held in training and nothing more in eval (LibTorch's op, the
 * plain model's output). Returns the converted model and one converted with `masks = false`.
 */
template <class Make>
std::pair<torch::nn::Sequential, torch::nn::Sequential> check_mask_modules(const Make& make) {
  auto plain = make(), ours = make();
  CHECK(dt::to_dropit(*ours, make_policy(dt::policy_kind::identity)).replaced == 5);
  const auto x = torch::randn({10, 6}) * 4;
  for (auto* m : {&plain, &ours})
    (*m)->forward(x).pow(2).sum().backward();
  for (std::size_t i = 0; i < plain->parameters().size(); ++i)
    CHECK(torch::equal(ours->parameters()[i].grad(), plain->parameters()[i].grad()));
  const std::size_t two_masks = 2 * ((10 * 8 + 31) / 32) * 4;
  const auto before = dt::live_saved_bytes().masks;
  auto y = ours->forward(x);
  CHECK(dt::live_saved_bytes().masks - before == two_masks);
  ours->eval();
  auto ye = ours->forward(x);
  CHECK(dt::live_saved_bytes().masks - before == two_masks);
  plain->eval();
  CHECK(torch::equal(ye, plain->forward(x)));
  auto off = make();
  dt::convert_options no_masks;
  no_masks.masks = false;
  (void)dt::to_dropit(*off, make_policy(dt::policy_kind::mink), no_masks);
  return {ours, off};
}

TEST_CASE(
    "torch: the LeakyReLU module: mask in training, LibTorch's op in eval, replaced by to_dropit") {
  namespace nn = torch::nn;
  const auto make = [] {
    torch::manual_seed(3);
    return nn::Sequential(
        nn::Linear(6, 8), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
        nn::Linear(8, 8), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.05).inplace(true)),
        nn::Linear(8, 3));
  };
  auto [ours, off] = check_mask_modules(make);
  REQUIRE(ours[1]->as<dt::LeakyReLUImpl>() != nullptr);
  REQUIRE(ours[3]->as<dt::LeakyReLUImpl>() != nullptr);
  std::ostringstream text;
  text << *ours[3];
  CHECK(text.str().starts_with("dropit::torch::LeakyReLU(negative_slope=0.05, inplace=true, "));
  CHECK(off[1]->as<dt::LeakyReLUImpl>() == nullptr);
  // an excluded path: left as LibTorch's
  auto excluded = make();
  dt::convert_options skip;
  skip.exclude = [](const std::string& path, const nn::Module&) { return path == "3"; };
  (void)dt::to_dropit(*excluded, make_policy(dt::policy_kind::mink), skip);
  CHECK(excluded[1]->as<dt::LeakyReLUImpl>() != nullptr);
  CHECK(excluded[3]->as<dt::LeakyReLUImpl>() == nullptr);
  auto copy =
      std::dynamic_pointer_cast<dt::LeakyReLUImpl>(ours[1]->as<dt::LeakyReLUImpl>()->clone());
  REQUIRE(copy);
  CHECK(copy->options.negative_slope() == 0.2);
  CHECK(copy->get_policy().kind == dt::policy_kind::identity);
}

TEST_CASE("torch: the half-precision mask LeakyReLU equals LeakyReLU in float, rounded") {
  // LibTorch 1.13's CPU LeakyReLU has no half kernels: the oracle computes in float.
  torch::manual_seed(4);
  const auto x = (torch::randint(-40, 41, {5, 67}, torch::kFloat) * 0.125).to(torch::kHalf);
  const auto xf = x.to(torch::kFloat);
  for (const double slope : {0.01, -0.5}) {
    CAPTURE(slope);
    for (const bool in_place : {false, true}) {
      CAPTURE(in_place);
      auto [y, gx] = forward_backward(
          [&](const torch::Tensor& t) {
            auto h = t * 1.0;
            return in_place ? dt::leaky_relu_(h, slope) : dt::leaky_relu(h, slope);
          },
          x);
      torch::manual_seed(77);  // forward_backward's output gradient
      const auto g = torch::randn(x.sizes(), torch::kFloat).to(torch::kHalf);
      CHECK(same(y, torch::where(xf > 0, xf, xf * slope).to(torch::kHalf)));
      CHECK(same(gx, torch::where(xf > 0, g, (g.to(torch::kFloat) * slope).to(torch::kHalf))));
    }
  }
}

// ---- Hardtanh, ReLU6 --------------------------------------------------------------------------

/// Values on a 0.25 grid in [-8, 8] with -0.0, NaN, -inf, +inf and the bounds themselves.
torch::Tensor hardtanh_input(double lo, double hi) {
  torch::manual_seed(5);
  auto x = torch::randint(-32, 33, {3, 7, 33}, torch::kFloat) * 0.25;
  const float specials[] = {-0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(),
                            static_cast<float>(lo),
                            static_cast<float>(hi)};
  for (int i = 0; i < 6; ++i)
    x.view({-1})[i * 37] = specials[i];
  return x;
}

TEST_CASE("torch: mask Hardtanh output and gradient equal LibTorch's, at the bounds and NaN too") {
  const std::array<std::array<double, 2>, 5> bounds{
      {{-1.0, 1.0}, {0.0, 6.0}, {-0.3, 0.7}, {0.5, 0.5}, {-2.0, -1.5}}};
  for (const auto [lo, hi] : bounds) {
    CAPTURE(lo);
    CAPTURE(hi);
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      CAPTURE(dtype);
      const auto x = hardtanh_input(lo, hi).to(dtype);
      auto [ry, rgx] =
          forward_backward([&](const torch::Tensor& t) { return torch::hardtanh(t, lo, hi); }, x);
      for (const bool in_place : {false, true}) {
        CAPTURE(in_place);
        auto [y, gx] = forward_backward(
            [&](const torch::Tensor& t) {
              if (!in_place) return dt::hardtanh(t, lo, hi);
              auto h = t * 1.0;
              return dt::hardtanh_(h, lo, hi);
            },
            x);
        CHECK(same(y, ry));
        CHECK(same(gx, rgx));
      }
    }
    // bfloat16 (LibTorch has no CPU backward) and half (no CPU op): the definition in float,
    // the bounds rounded to the dtype as LibTorch rounds them.
    for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
      CAPTURE(dtype);
      const auto x = hardtanh_input(lo, hi).to(dtype);
      const auto xf = x.to(torch::kFloat);
      const double a = torch::scalar_tensor(lo).to(dtype).item<double>();
      const double b = torch::scalar_tensor(hi).to(dtype).item<double>();
      auto [y, gx] =
          forward_backward([&](const torch::Tensor& t) { return dt::hardtanh(t, lo, hi); }, x);
      torch::manual_seed(77);
      const auto g = torch::randn(x.sizes(), torch::kFloat).to(dtype);
      CHECK(same(y, torch::hardtanh(xf, a, b).to(dtype)));
      CHECK(same(gx, torch::where((xf > a).logical_and(xf < b), g, torch::zeros_like(g))));
    }
  }
}

TEST_CASE("torch: mask Hardtanh keeps strides, saves 1 bit per element, refuses bad bounds") {
  check_mask_op_layouts(
      [](const torch::Tensor& t) { return dt::hardtanh(t, -0.5, 0.75); },
      [](const torch::Tensor& t) { return torch::hardtanh(t, -0.5, 0.75); },
      [](torch::Tensor& t) { return dt::hardtanh_(t, -0.5, 0.75); },
      [](torch::Tensor& t) { return torch::hardtanh_(t, -0.5, 0.75); },
      [](const torch::Tensor& x) { return (x > -0.5).logical_and(x < 0.75).to(torch::kFloat); });

  // min_val > max_val, or a NaN bound: a dropit::error, with or without a gradient
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  auto z = torch::randn({4}, torch::requires_grad());
  CHECK_THROWS_WITH_AS((void)dt::hardtanh(z, 1.0, 0.0),
                       doctest::Contains("min_val (1) must not exceed max_val (0)"), dropit::error);
  CHECK_THROWS_AS((void)dt::hardtanh(z.detach(), nan, 1.0), dropit::error);
  auto w = z * 1.0;
  CHECK_THROWS_AS((void)dt::hardtanh_(w, 0.0, nan), dropit::error);
}

TEST_CASE("torch: hardtanh and hardtanh_ under create_graph: double backward equals LibTorch's") {
  torch::manual_seed(6);
  const auto x = torch::randint(-3, 4, {2, 3, 5, 6}, torch::kFloat) * 0.5;
  for (bool in_place : {false, true}) {
    CAPTURE(in_place);
    const auto [gx, ggx] = gradient_penalty(x, [&](torch::Tensor& h) {
      return in_place ? dt::hardtanh_(h, -1.0, 1.5) : dt::hardtanh(h, -1.0, 1.5);
    });
    const auto [rgx, rggx] =
        gradient_penalty(x, [](torch::Tensor& h) { return torch::hardtanh(h, -1.0, 1.5); });
    CHECK(same(gx, rgx));
    CHECK(same(ggx, rggx));
  }
}

TEST_CASE("torch: the Hardtanh and ReLU6 modules: masks in training, replaced by to_dropit") {
  namespace nn = torch::nn;
  const auto make = [] {
    torch::manual_seed(3);
    return nn::Sequential(
        nn::Linear(6, 8), nn::Hardtanh(nn::HardtanhOptions().min_val(-0.25).max_val(0.5)),
        nn::Linear(8, 8), nn::ReLU6(nn::ReLU6Options().inplace(true)), nn::Linear(8, 3));
  };
  auto [ours, off] = check_mask_modules(make);
  REQUIRE(ours[1]->as<dt::HardtanhImpl>() != nullptr);
  REQUIRE(ours[3]->as<dt::ReLU6Impl>() != nullptr);
  std::ostringstream text;
  text << *ours[1] << "\n" << *ours[3];
  CHECK(text.str().starts_with("dropit::torch::Hardtanh(min_val=-0.25, max_val=0.5, policy="));
  CHECK(text.str().find("\ndropit::torch::ReLU6(inplace=true, policy=") != std::string::npos);
  CHECK(off[1]->as<dt::HardtanhImpl>() == nullptr);
  CHECK(off[3]->as<dt::ReLU6Impl>() == nullptr);
  auto copy = std::dynamic_pointer_cast<dt::HardtanhImpl>(ours[1]->as<dt::HardtanhImpl>()->clone());
  REQUIRE(copy);
  CHECK(copy->options.max_val() == 0.5);
  CHECK(copy->get_policy().kind == dt::policy_kind::identity);
  CHECK(std::dynamic_pointer_cast<dt::ReLU6Impl>(ours[3]->as<dt::ReLU6Impl>()->clone()));
}

// ---- MaxPool2d -------------------------------------------------------------------------------

TEST_CASE("torch: mask max-pool output and gradient equal LibTorch's, ties and NaN included") {
  struct pool_case {
    std::int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    bool ceil;
  };
  const std::vector<pool_case> cases = {
      {2, 2, 2, 2, 0, 0, 1, 1, false},  // the fast path
      {2, 2, 2, 2, 0, 0, 1, 1, true},   // ceil mode: last windows stick out of the odd sizes
      {3, 3, 2, 2, 1, 1, 1, 1, false},  // overlapping windows, padding
      {3, 3, 2, 2, 1, 1, 1, 1, true},   // ceil mode
      {2, 3, 1, 2, 1, 1, 2, 1, false},  // dilation, rectangular
      {4, 4, 4, 4, 0, 2, 1, 1, true},   // 16-cell windows: 4-bit codes
      {1, 1, 1, 1, 0, 0, 1, 1, false},  // a 1-cell window
      {5, 5, 1, 1, 2, 2, 1, 1, false},  // 25 cells: 8-bit codes
  };
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const auto& c : cases) {
      for (bool three_d : {false, true}) {
        CAPTURE(dtype);
        CAPTURE(c.kh);
        CAPTURE(c.kw);
        CAPTURE(c.sh);
        CAPTURE(c.ph);
        CAPTURE(c.dh);
        CAPTURE(c.ceil);
        CAPTURE(three_d);
        torch::manual_seed(4);
        // Few distinct values: many ties inside windows; plus a NaN and -inf cells.
        auto x = torch::randint(-2, 3,
                                three_d ? std::vector<std::int64_t>{3, 13, 11}
                                        : std::vector<std::int64_t>{2, 3, 13, 11},
                                torch::kFloat);
        x.view({-1})[5] = std::numeric_limits<float>::quiet_NaN();
        x.view({-1})[40] = -std::numeric_limits<float>::infinity();
        x = x.to(dtype);
        dt::max_pool2d_params params;
        params.kernel = {c.kh, c.kw};
        params.stride = {c.sh, c.sw};
        params.padding = {c.ph, c.pw};
        params.dilation = {c.dh, c.dw};
        params.ceil_mode = c.ceil;
        auto [y, gx] =
            forward_backward([&](const torch::Tensor& t) { return dt::max_pool2d(t, params); }, x);
        auto [ry, rgx] = forward_backward(
            [&](const torch::Tensor& t) {
              return torch::max_pool2d(t, {c.kh, c.kw}, {c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw},
                                       c.ceil);
            },
            x);
        CHECK(same(y, ry));
        CHECK(same(gx, rgx));
      }
    }
  }
}

TEST_CASE("torch: the 2x2 mask max-pool and the mask ReLU match LibTorch on wide planes") {
  // Planes wide enough for the vectorised groups of four windows and whole mask words, odd sizes
  // for the tails and the uncovered last row and column, NaNs in every lane position; every
  // instruction set of the mask kernels.
  for_each_isa([] {
    for (auto sizes :
         {std::vector<std::int64_t>{2, 3, 28, 28}, std::vector<std::int64_t>{1, 2, 29, 31},
          std::vector<std::int64_t>{3, 1, 17, 70}}) {
      for (auto dtype : {torch::kFloat, torch::kDouble}) {
        CAPTURE(sizes);
        CAPTURE(dtype);
        torch::manual_seed(11);
        auto x = torch::randint(-3, 4, sizes, torch::kFloat);
        auto flat = x.view({-1});
        for (std::int64_t i = 3; i < flat.numel(); i += 37)
          flat[i] = std::numeric_limits<float>::quiet_NaN();
        for (std::int64_t i = 5; i < flat.numel(); i += 41)
          flat[i] = -std::numeric_limits<float>::infinity();
        flat[1] = -0.0f;
        x = x.to(dtype);
        auto [y, gx] = forward_backward(
            [](const torch::Tensor& t) { return dt::max_pool2d(t, dt::max_pool2d_params{}); }, x);
        auto [ry, rgx] = forward_backward(
            [](const torch::Tensor& t) {
              return torch::max_pool2d(t, {2, 2});
            },
            x);
        CHECK(same(y, ry));
        CHECK(same(gx, rgx));
        auto [ly, lgx] = forward_backward([](const torch::Tensor& t) { return dt::relu(t); }, x);
        auto [rly, rlgx] =
            forward_backward([](const torch::Tensor& t) { return torch::relu(t); }, x);
        CHECK(same(ly, rly));
        CHECK(same(lgx, rlgx));
        // In place: the input's memory is the output.
        auto ix = x.clone().requires_grad_(true);
        auto h = ix * 1.0;
        auto out = dt::relu_(h);
        CHECK(same(out.detach(), rly));
        out.backward(torch::ones_like(out));
        auto rx = x.clone().requires_grad_(true);
        torch::relu(rx).backward(torch::ones_like(rx));
        CHECK(same(ix.grad(), rx.grad()));
      }
    }
  });
}

TEST_CASE("torch: max-pool codes run on across planes; pieces split mid-word planes on threads") {
  // Plane sizes whose codes end mid-word (7x7 outputs at 2 bits: 98 bits, a word boundary every
  // 16 planes; 5x5 at 4 bits: 100 bits, every 8; 3x3 at 2 bits: 18, every 16), enough planes for
  // several pieces, forking forced: the output, the gradient and the packed indices must equal
  // LibTorch's, and the saved codes take ceil(planes x outputs x bits / 32) words.
  using dropit::detail::fork_meter;
  const auto overhead = fork_meter::overhead_ns();
  fork_meter::set(0);
  struct pool_case {
    std::vector<std::int64_t> sizes;
    std::int64_t k, s, p, bits;
  };
  for (const pool_case& c :
       {pool_case{{6, 37, 14, 14}, 2, 2, 0, 2}, pool_case{{3, 45, 10, 10}, 3, 2, 1, 4},
        pool_case{{2, 61, 7, 6}, 2, 2, 0, 2}}) {
    CAPTURE(c.sizes);
    torch::manual_seed(21);
    const auto x = torch::randint(-3, 4, c.sizes, torch::kFloat);  // ties
    dt::max_pool2d_params params;
    params.kernel = {c.k, c.k};
    params.stride = {c.s, c.s};
    params.padding = {c.p, c.p};
    auto [y, gx] =
        forward_backward([&](const torch::Tensor& t) { return dt::max_pool2d(t, params); }, x);
    auto [ry, rgx] = forward_backward(
        [&](const torch::Tensor& t) { return torch::max_pool2d(t, c.k, c.s, c.p); }, x);
    CHECK(same(y, ry));
    CHECK(same(gx, rgx));
    const auto [py, idx] = at::max_pool2d_with_indices(x, {c.k, c.k}, {c.s, c.s}, {c.p, c.p});
    const auto packed = dt::packed_pool_indices::pack(idx, x.size(-2), x.size(-1), params);
    CHECK(torch::equal(packed.restore(), idx));
    CHECK(packed.bits() == c.bits);
    CHECK(packed.bytes() == static_cast<std::size_t>((idx.numel() * c.bits + 31) / 32 * 4));
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    const auto xg = x.clone().requires_grad_(true);
    CHECK(graph_bytes(counter, xg, [&](const torch::Tensor& h) {
            return dt::max_pool2d(h, params);
          }) == static_cast<std::size_t>((idx.numel() * c.bits + 31) / 32 * 4));
  }
  fork_meter::set(overhead);
}

TEST_CASE("torch: max_pool2d under create_graph: double backward equals LibTorch's") {
  // With create_graph the backward runs LibTorch's differentiable pooling backward from the
  // decoded codes: a gradient penalty through the pooling (the gradient of a function of the
  // input gradient) must equal LibTorch's, and so must the input gradient itself.
  struct pool_case {
    std::int64_t k0, k1, s, p, d;
    bool ceil;
  };
  for (const pool_case& c : {pool_case{2, 2, 2, 0, 1, false}, pool_case{3, 3, 2, 1, 1, true},
                             pool_case{2, 3, 1, 1, 2, false}}) {
    CAPTURE(c.k0);
    CAPTURE(c.k1);
    CAPTURE(c.ceil);
    torch::manual_seed(5);
    const auto x = torch::randint(-3, 4, {2, 3, 11, 10}, torch::kFloat);  // ties
    const dt::max_pool2d_params params{{c.k0, c.k1}, {c.s, c.s}, {c.p, c.p}, {c.d, c.d}, c.ceil};
    const auto penalty = [&](const auto& pool) {
      const auto xi = x.clone().requires_grad_(true);
      const auto y = pool(xi * 1.5);
      const auto w = torch::linspace(-1.0, 2.0, y.numel()).view(y.sizes());
      // The incoming gradient 2 y w depends on x: the second backward runs through the first.
      const auto gx = torch::autograd::grad({(y * y * w).sum()}, {xi}, {}, true, true)[0];
      const auto ggx = torch::autograd::grad({(gx * gx).sum() + (gx * xi).sum()}, {xi})[0];
      return std::pair{gx.detach(), ggx};
    };
    const auto [gx, ggx] =
        penalty([&](const torch::Tensor& t) { return dt::max_pool2d(t, params); });
    const auto [rgx, rggx] = penalty([&](const torch::Tensor& t) {
      return torch::max_pool2d(t, {c.k0, c.k1}, {c.s, c.s}, {c.p, c.p}, {c.d, c.d}, c.ceil);
    });
    CHECK(same(gx, rgx));
    CHECK(same(ggx, rggx));
  }
}

TEST_CASE("torch: relu and relu_ under create_graph: double backward equals LibTorch's") {
  // A gradient penalty through the mask ReLU, out of place and in place, contiguous and
  // channels-last, zeros in the input; the incoming gradient 2 y w depends on x, so the second
  // backward runs through the first. max_pool2d_relu refuses create_graph.
  torch::manual_seed(6);
  const auto base = torch::randint(-3, 4, {2, 3, 5, 6}, torch::kFloat);
  for (bool channels_last : {false, true}) {
    for (bool in_place : {false, true}) {
      CAPTURE(channels_last);
      CAPTURE(in_place);
      const auto x = channels_last ? base.contiguous(at::MemoryFormat::ChannelsLast) : base;
      const auto [gx, ggx] = gradient_penalty(
          x, [&](torch::Tensor& h) { return in_place ? dt::relu_(h) : dt::relu(h); });
      const auto [rgx, rggx] = gradient_penalty(
          x, [&](torch::Tensor& h) { return in_place ? torch::relu_(h) : torch::relu(h); });
      CHECK(same(gx, rgx));
      CHECK(same(ggx, rggx));
    }
  }
  const auto xp = torch::randn({1, 2, 6, 6}, torch::requires_grad());
  const auto yp = dt::max_pool2d_relu(xp * 1.0, {});
  CHECK_THROWS_WITH_AS(
      (void)torch::autograd::grad({yp.sum()}, {xp}, {}, true, true),
      doctest::Contains("max_pool2d_relu: double backward (create_graph) is not supported"),
      std::exception);
}

TEST_CASE(
    "torch: linear, gpt2_conv1d, conv1d/2d/3d and conv_transpose2d under create_graph: the "
    "weight gradient is differentiable in x") {
  // A gradient penalty on the weight gradient reaches x through the rebuilt input, as PyTorch's
  // saved-tensor hooks make it: the kept values stand for x (straight through). Oracle: LibTorch's
  // own ops, y = op(x, W) + op(xs - x, W) + op(x - xs, W) with the last two inputs and the last
  // weight detached (xs: x's largest 1 - gamma magnitudes, chosen here by sorting): y's value is
  // op(x, W), its input gradient g W, its weight gradient op's with xs, differentiable in x. At
  // gamma = 0 that is LibTorch's plain op. fp64, x a leaf and not.
  struct layer_case {
    const char* name;
    std::vector<std::int64_t> x_sizes, w_sizes;
  };
  const dt::conv2d_params conv{{1, 2}, {1, 0}, {1, 1}, 1};
  const dt::conv1d_params conv1{{2}, {1}, {2}, 1};
  const dt::conv3d_params conv3{{1, 2, 1}, {0, 1, 1}, {1, 1, 1}, 1};
  // Transposed: weight [C_in, C_out / groups, kH, kW]; groups 2, output padding below the stride.
  const dt::conv_transpose_params<2> transposed{{2, 3}, {1, 0}, {1, 2}, {1, 1}, 2};
  const std::vector<layer_case> cases{
      {"linear 2-d", {12, 8}, {5, 8}},
      {"linear 3-d", {2, 6, 8}, {5, 8}},
      {"gpt2_conv1d", {2, 6, 8}, {8, 5}},
      {"conv1d", {2, 3, 9}, {4, 3, 3}},
      {"conv2d", {2, 3, 6, 8}, {4, 3, 3, 2}},
      {"conv2d channels-last", {2, 3, 6, 8}, {4, 3, 3, 2}},
      {"conv3d", {2, 2, 4, 5, 4}, {3, 2, 2, 3, 2}},
      {"conv_transpose2d", {2, 4, 5, 4}, {4, 3, 3, 2}},
  };
  for (double gamma : {0.0, 0.75}) {
    for (const layer_case& c : cases) {
      for (bool leaf : {true, false}) {
        const std::string name = c.name;
        CAPTURE(gamma);
        CAPTURE(name);
        CAPTURE(leaf);
        const auto ours_op = [&](const torch::Tensor& x, const torch::Tensor& w) {
          const dt::policy p = make_policy(dt::policy_kind::mink, gamma);
          if (name.rfind("linear", 0) == 0) return dt::linear(x, w, c10::nullopt, p);
          if (name == "gpt2_conv1d") return dt::gpt2_conv1d(x, w, c10::nullopt, p);
          if (name == "conv1d") return dt::conv1d(x, w, c10::nullopt, conv1, p);
          if (name == "conv3d") return dt::conv3d(x, w, c10::nullopt, conv3, p);
          if (name == "conv_transpose2d") {
            return dt::conv_transpose<2>(x, w, c10::nullopt, transposed, p);
          }
          return dt::conv2d(x, w, c10::nullopt, conv, p);
        };
        const auto plain_op = [&](const torch::Tensor& x, const torch::Tensor& w) {
          if (name.rfind("linear", 0) == 0) return torch::linear(x, w);
          if (name == "gpt2_conv1d") return torch::matmul(x, w);
          if (name == "conv1d") return torch::conv1d(x, w, {}, 2, 1, 2);
          if (name == "conv3d") return torch::conv3d(x, w, {}, {1, 2, 1}, {0, 1, 1});
          if (name == "conv_transpose2d") {
            return torch::conv_transpose2d(x, w, {}, {2, 3}, {1, 0}, {1, 2}, 2);
          }
          return torch::conv2d(x, w, {}, {1, 2}, {1, 0});
        };
        torch::manual_seed(11);
        auto x0 = torch::randn(c.x_sizes, torch::kDouble);
        if (name == "conv2d channels-last") x0 = x0.contiguous(at::MemoryFormat::ChannelsLast);
        const auto w0 = torch::randn(c.w_sizes, torch::kDouble);
        // xs: the largest (1 - gamma) n magnitudes of x (distinct: randn), zeros elsewhere.
        const auto mag = x0.abs().flatten();
        const auto kept = static_cast<std::int64_t>(
            std::llround((1.0 - gamma) * static_cast<double>(mag.numel())));
        const auto cut = std::get<0>(mag.sort(0, true))[kept - 1].item<double>();
        const auto xs = torch::where(x0.abs() >= cut, x0, torch::zeros_like(x0));
        const auto penalty = [&](bool ours) {
          const auto xl = x0.clone().requires_grad_(true);
          const auto w = w0.clone().requires_grad_(true);
          const auto x = leaf ? xl : xl * 1.0;
          torch::Tensor y;
          if (ours) {
            y = ours_op(x, w);
          } else {
            y = plain_op(x, w) + plain_op((xs - x0), w) + plain_op((x0 - xs), w.detach());
          }
          const auto cw = torch::linspace(-1.0, 2.0, y.numel(), torch::kDouble).view(y.sizes());
          // The incoming gradient 2 y cw depends on x and w: the second backward runs through
          // the first.
          const auto g = torch::autograd::grad({(y * y * cw).sum()}, {xl, w}, {}, true, true);
          const auto pen = (g[0] * g[0]).sum() + (g[1] * g[1]).sum() + (g[1] * w).sum();
          const auto gg = torch::autograd::grad({pen}, {xl, w});
          return std::vector<torch::Tensor>{g[0].detach(), g[1].detach(), gg[0], gg[1]};
        };
        const auto ours = penalty(true);
        const auto ref = penalty(false);
        for (std::size_t i = 0; i < ours.size(); ++i) {
          CAPTURE(i);
          CHECK(torch::allclose(ours[i], ref[i], 1e-10, 1e-10));
        }
      }
    }
  }
}

TEST_CASE("torch: max_pool2d_relu equals LibTorch's relu(max_pool2d), ties, zeros and NaN too") {
  // Every window kind, several chunks of planes (forking forced, so chunks run on both threads),
  // outputs of every sign: each output and gradient as LibTorch's two ops give them.
  using dropit::detail::fork_meter;
  const auto overhead = fork_meter::overhead_ns();
  fork_meter::set(0);
  struct pool_case {
    std::int64_t k, s, p, d;
    bool ceil;
  };
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const pool_case& c :
         {pool_case{2, 2, 0, 1, false}, pool_case{2, 2, 0, 1, true}, pool_case{3, 2, 1, 1, false},
          pool_case{3, 1, 1, 1, true}, pool_case{2, 1, 1, 2, false}, pool_case{4, 4, 2, 1, true}}) {
      for (auto sizes :
           {std::vector<std::int64_t>{4, 150, 14, 14}, std::vector<std::int64_t>{37, 13, 11},
            std::vector<std::int64_t>{3, 40, 30}}) {
        CAPTURE(dtype);
        CAPTURE(c.k);
        CAPTURE(c.s);
        CAPTURE(c.p);
        CAPTURE(c.d);
        CAPTURE(c.ceil);
        CAPTURE(sizes);
        torch::manual_seed(9);
        auto x = torch::randint(-3, 3, sizes, torch::kFloat);  // ties; zero outputs
        auto flat = x.view({-1});
        for (std::int64_t i = 7; i < flat.numel(); i += 997)
          flat[i] = std::numeric_limits<float>::quiet_NaN();
        flat[3] = -std::numeric_limits<float>::infinity();
        x = x.to(dtype);
        dt::max_pool2d_params params;
        params.kernel = {c.k, c.k};
        params.stride = {c.s, c.s};
        params.padding = {c.p, c.p};
        params.dilation = {c.d, c.d};
        params.ceil_mode = c.ceil;
        auto [y, gx] = forward_backward(
            [&](const torch::Tensor& t) { return dt::max_pool2d_relu(t, params); }, x);
        auto [ry, rgx] = forward_backward(
            [&](const torch::Tensor& t) {
              return torch::relu(torch::max_pool2d(t, c.k, c.s, c.p, c.d, c.ceil));
            },
            x);
        CHECK(same(y, ry));
        CHECK(same(gx, rgx));
      }
    }
  }
  fork_meter::set(overhead);
}

TEST_CASE("torch: max_pool2d_relu saves the mask and codes of the passing outputs only") {
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  torch::manual_seed(10);
  for (double shift : {0.0, 1.0, -1.0}) {  // about 94%, all but a few, and half pass
    CAPTURE(shift);
    auto x = (torch::randn({8, 64, 14, 14}) + shift).requires_grad_(true);
    const auto pooled = torch::max_pool2d(x.detach(), 2);
    const auto n = static_cast<std::size_t>(pooled.numel());
    const auto passing = static_cast<std::size_t>((~(pooled <= 0)).sum().item<std::int64_t>());
    const std::size_t mask = (n + 31) / 32 * 4, codes = (2 * passing + 31) / 32 * 4;
    const auto fused =
        graph_bytes(counter, x, [](const torch::Tensor& h) { return dt::max_pool2d_relu(h, {}); });
    const auto apart = graph_bytes(
        counter, x, [](const torch::Tensor& h) { return dt::relu(dt::max_pool2d(h, {})); });
    // The chunks' offsets and word padding: at most 12 bytes per chunk of >= 8192 outputs.
    CHECK(fused >= mask + codes);
    CHECK(fused <= mask + codes + 12 * (n / 8192 + 2));
    CHECK(apart == mask + 2 * n / 8);  // mask + 2 bits per output
    MESSAGE("pool+relu saved bytes, passing " << passing << " of " << n << ": fused " << fused
                                              << ", apart " << apart);
  }
}

TEST_CASE("torch: mask max-pool saves 2 bits per 2x2 window instead of input + int64 indices") {
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  auto x = torch::randn({4, 8, 32, 32}).requires_grad_(true);
  const auto ours =
      graph_bytes(counter, x, [](const torch::Tensor& h) { return dt::max_pool2d(h, {}); });
  const auto theirs =
      graph_bytes(counter, x, [](const torch::Tensor& h) { return torch::max_pool2d(h, 2); });
  CHECK(ours == 32 * 16 * 4);  // 32 planes of 16x16 outputs at 2 bits: 16 words per plane
  CHECK(theirs == 4 * 8 * 32 * 32 * 4 + 4 * 8 * 16 * 16 * 8);  // dense input + int64 indices
  MESSAGE("2x2 max-pool saved bytes: dropit " << ours << ", LibTorch " << theirs);
}

// ---- average poolings -------------------------------------------------------------------------

TEST_CASE(
    "torch: average poolings save their input's sizes only; LibTorch's outputs and gradients") {
  using dt::detail::pools_by_shape;
  struct pool_case {
    const char* name;
    std::function<torch::Tensor(const torch::Tensor&, bool)> run;  // (x, dropit's?)
  };
  const pool_case cases[] = {
      {"avg 2x2",
       [](const torch::Tensor& t, bool ours) {
         return ours ? dt::avg_pool2d(t, {2, 2}) : torch::avg_pool2d(t, {2, 2});
       }},
      {"avg 3x3 s2 p1 ceil, pad excluded",
       [](const torch::Tensor& t, bool ours) {
         return ours ? dt::avg_pool2d(t, {3, 3}, {2, 2}, {1, 1}, true, false)
                     : torch::avg_pool2d(t, {3, 3}, {2, 2}, {1, 1}, true, false);
       }},
      {"avg 2x3 divisor 5",
       [](const torch::Tensor& t, bool ours) {
         return ours ? dt::avg_pool2d(t, {2, 3}, {1, 2}, {0, 1}, false, true, 5)
                     : torch::avg_pool2d(t, {2, 3}, {1, 2}, {0, 1}, false, true, 5);
       }},
      {"adaptive 1",
       [](const torch::Tensor& t, bool ours) {
         return ours ? dt::adaptive_avg_pool2d(t, {1, 1}) : torch::adaptive_avg_pool2d(t, {1, 1});
       }},
      {"adaptive 3x2",
       [](const torch::Tensor& t, bool ours) {
         return ours ? dt::adaptive_avg_pool2d(t, {3, 2}) : torch::adaptive_avg_pool2d(t, {3, 2});
       }},
  };
  torch::manual_seed(8);
  for (const auto& c : cases) {
    for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
      for (const bool batched : {true, false}) {
        CAPTURE(c.name);
        CAPTURE(dtype);
        CAPTURE(batched);
        const auto x = batched ? torch::randn({2, 3, 7, 8}).to(dtype) : torch::randn({3, 7, 8});
        auto [y, gx] = forward_backward([&](const torch::Tensor& t) { return c.run(t, true); }, x);
        auto [ry, rgx] =
            forward_backward([&](const torch::Tensor& t) { return c.run(t, false); }, x);
        CHECK(same(y, ry));
        CHECK(same(gx, rgx));
        CHECK(gx.strides() == rgx.strides());
      }
    }
    // what the graph holds: the output alone, against LibTorch's input + output
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    const auto x = torch::randn({4, 8, 32, 32}).requires_grad_(true);
    const auto ours =
        graph_bytes(counter, x, [&](const torch::Tensor& h) { return c.run(h, true); });
    const auto theirs =
        graph_bytes(counter, x, [&](const torch::Tensor& h) { return c.run(h, false); });
    CHECK(ours == 0);
    CHECK(theirs == 4 * 8 * 32 * 32 * 4);
    // double backward equals LibTorch's (the gradient is linear in the incoming one)
    const auto penalty = [&](bool dropit) {
      const auto xi = torch::randn({2, 3, 7, 8}, torch::TensorOptions().dtype(torch::kDouble))
                          .requires_grad_(true);
      torch::manual_seed(9);
      auto y = c.run(xi * 1.5, dropit);
      const auto w = torch::linspace(-1.0, 2.0, y.numel(), torch::kDouble).view(y.sizes());
      const auto gx = torch::autograd::grad({(y * y * w).sum()}, {xi}, {}, true, true)[0];
      return torch::autograd::grad({(gx * gx).sum()}, {xi})[0];
    };
    const std::string name = c.name;
    CAPTURE(name);
    torch::manual_seed(10);
    const auto ggx = penalty(true);
    torch::manual_seed(10);
    const auto want = penalty(false);
    if (name == "adaptive 1") {
      // LibTorch pools to 1 x 1 with a mean, whose second derivative rounds differently from
      // adaptive pooling's: equal to rounding
      CHECK(torch::allclose(ggx, want, 1e-12, 1e-14));
      CHECK_FALSE(torch::equal(ggx, torch::zeros_like(ggx)));
    } else {
      CHECK(torch::equal(ggx, want));
    }
  }
  // channels-last (the gradient keeps the input's memory format): LibTorch's op, input saved
  const auto cl =
      torch::randn({2, 3, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
  CHECK_FALSE(pools_by_shape(cl));
  auto [y, gx] = forward_backward(
      [](const torch::Tensor& t) {
        return dt::avg_pool2d(t, {2, 2});
      },
      cl.detach());
  auto [ry, rgx] = forward_backward(
      [](const torch::Tensor& t) {
        return torch::avg_pool2d(t, {2, 2});
      },
      cl.detach());
  CHECK(same(gx, rgx));
  CHECK(gx.is_contiguous(torch::MemoryFormat::ChannelsLast));
  // LibTorch's errors for bad windows
  CHECK_THROWS((void)dt::avg_pool2d(torch::randn({1, 1, 4, 4}, torch::requires_grad()), {5, 5}));
}

TEST_CASE("torch: the average pooling modules: LibTorch's gradients; to_dropit replaces them") {
  namespace nn = torch::nn;
  // the same model with LibTorch's poolings and with dropit's (the rest LibTorch's modules)
  const auto make = [](bool ours) {
    torch::manual_seed(11);
    nn::Sequential seq;
    const auto p = make_policy(dt::policy_kind::identity);
    const nn::AvgPool2dOptions avg(2);
    const nn::AdaptiveAvgPool2dOptions adaptive({2, c10::nullopt});
    seq->push_back(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1)));
    if (ours) {
      seq->push_back(dt::AvgPool2d(avg, p));
    } else {
      seq->push_back(nn::AvgPool2d(avg));
    }
    seq->push_back(nn::Conv2d(nn::Conv2dOptions(4, 4, 3).padding(1)));
    if (ours) {
      seq->push_back(dt::AdaptiveAvgPool2d(adaptive, p));
    } else {
      seq->push_back(nn::AdaptiveAvgPool2d(adaptive));
    }
    seq->push_back(nn::Flatten());
    seq->push_back(nn::Linear(4 * 2 * 4, 3));
    return seq;
  };
  auto plain = make(false), ours = make(true);
  std::ostringstream text;
  text << *ours[1];
  CHECK(text.str().starts_with("dropit::torch::AvgPool2d(kernel_size=[2, 2], stride=[2, 2]"));
  const auto x = torch::randn({5, 3, 8, 8});
  for (auto* m : {&plain, &ours})
    (*m)->forward(x).pow(2).sum().backward();
  for (std::size_t i = 0; i < plain->parameters().size(); ++i)
    CHECK(torch::equal(ours->parameters()[i].grad(), plain->parameters()[i].grad()));
  ours->eval();
  plain->eval();
  CHECK(torch::equal(ours->forward(x), plain->forward(x)));
  auto copy = std::dynamic_pointer_cast<dt::AdaptiveAvgPool2dImpl>(ours[3]->clone());
  REQUIRE(copy);
  CHECK_FALSE(copy->is_training());
  // to_dropit swaps LibTorch's for dropit's, with masks only
  auto swapped = make(false), off = make(false);
  CHECK(dt::to_dropit(*swapped, make_policy(dt::policy_kind::mink)).replaced == 5);
  CHECK(swapped[1]->as<dt::AvgPool2dImpl>() != nullptr);
  CHECK(swapped[3]->as<dt::AdaptiveAvgPool2dImpl>() != nullptr);
  dt::convert_options no_masks;
  no_masks.masks = false;
  (void)dt::to_dropit(*off, make_policy(dt::policy_kind::mink), no_masks);
  CHECK(off[1]->as<dt::AvgPool2dImpl>() == nullptr);
  CHECK(off[3]->as<dt::AdaptiveAvgPool2dImpl>() == nullptr);
}

TEST_CASE("torch: eval mode runs LibTorch's ReLU and max-pool") {
  dt::ReLU relu(make_policy(dt::policy_kind::mink));
  dt::MaxPool2d pool(torch::nn::MaxPool2dOptions(2), make_policy(dt::policy_kind::mink));
  relu->eval();
  pool->eval();
  auto x = torch::randn({1, 2, 4, 4}, torch::requires_grad());
  const auto before = dt::live_saved_bytes().masks;
  auto y = pool(relu(x));
  CHECK(dt::live_saved_bytes().masks == before);
  CHECK(torch::equal(y, torch::max_pool2d(torch::relu(x), 2)));
}

// ---- the counting allocator ------------------------------------------------------------------

TEST_CASE("counting_allocator: current, peak and allocation count on a known pattern") {
  dt::counting_allocator counter;
  CHECK(counter.current_bytes() == 0);
  CHECK(counter.peak_bytes() == 0);
  {
    auto a = counter.allocate(1000);
    auto b = counter.allocate(3000);
    CHECK(counter.current_bytes() == 4000);
    CHECK(counter.peak_bytes() == 4000);
    a.clear();
    CHECK(counter.current_bytes() == 3000);
    auto c = counter.allocate(500);
    CHECK(counter.current_bytes() == 3500);
    CHECK(counter.peak_bytes() == 4000);
    CHECK(counter.reset_peak() == 3500);
    CHECK(counter.peak_bytes() == 3500);
    auto d = counter.allocate(2000);
    CHECK(counter.peak_bytes() == 5500);
    auto zero = counter.allocate(0);  // not an allocation
    CHECK(zero.get() == nullptr);
    CHECK(counter.allocations() == 4);
  }
  CHECK(counter.current_bytes() == 0);
  CHECK(counter.peak_bytes() == 5500);

  // raw_allocate / raw_deallocate, as oneDNN uses them.
  void* p = counter.raw_allocate(4096);
  CHECK(counter.current_bytes() == 4096);
  counter.raw_deallocate(p);
  CHECK(counter.current_bytes() == 0);
}

TEST_CASE("counting_allocator: installed, it counts LibTorch's tensors, which may outlive it") {
  torch::Tensor survivor;
  {
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    CHECK(c10::GetCPUAllocator() == &counter);
    const auto before = counter.reset_peak();
    {
      auto a = torch::empty({1024}, torch::kFloat);  // 4 KiB
      auto b = torch::empty({256}, torch::kDouble);  // 2 KiB
      CHECK(counter.current_bytes() - before == 6144);
      survivor = torch::empty({100}, torch::kFloat);
    }
    CHECK(counter.current_bytes() - before == 400);
    CHECK(counter.peak_bytes() - before == 6544);
  }
  CHECK(c10::GetCPUAllocator() != nullptr);
  CHECK(dynamic_cast<dt::counting_allocator*>(c10::GetCPUAllocator()) == nullptr);
  survivor.fill_(1.0f);  // still valid; freed through the counting deleter below
  survivor = torch::Tensor();

  // A raw block from before the install is freed through LibTorch's default allocator.
  void* early = c10::GetCPUAllocator()->raw_allocate(128);
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  c10::GetCPUAllocator()->raw_deallocate(early);
  CHECK(counter.current_bytes() == 0);
  CHECK_THROWS_AS(dt::counting_allocator{&counter}, dropit::error);
  CHECK_THROWS_AS(dt::counting_allocator{nullptr}, dropit::error);
}

TEST_CASE("cpu_resource: dropit payloads come from LibTorch's allocator and are counted") {
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  auto& mr = dt::cpu_resource();
  void* p = mr.allocate(1000, 64);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  CHECK(counter.current_bytes() == 1000 + dt::cpu_memory_resource::max_alignment);
  mr.deallocate(p, 1000, 64);
  CHECK(counter.current_bytes() == 0);
  CHECK_THROWS_AS((void)mr.allocate(16, 128), dropit::error);

  // A packed layer input: its payload is inside the allocator's count.
  dt::Linear layer(256, 4, make_policy(dt::policy_kind::mink, 0.9));
  auto x = torch::randn({64, 256});
  const auto base = counter.current_bytes();
  auto y = layer(x);
  const auto sparse = dt::live_saved_bytes().sparse;
  CHECK(sparse > 0);
  CHECK(counter.current_bytes() - base >= sparse + static_cast<std::size_t>(y.nbytes()));
  // 16384 floats at gamma 0.9: 1639 values + 512 mask words + 16 block offsets (format.hpp).
  CHECK(sparse == dropit::make_layout(16384, 1639, sizeof(float)).total_bytes);
  y.sum().backward();
  CHECK(dt::live_saved_bytes().sparse == 0);
}

}  // namespace
