// The LibTorch adapter's layers: gradients against LibTorch's own (Identity) and against the
// brute-force sparsified input (MinK), the kept set against torch::topk, Random's fresh positions,
// pieces (chunking), plain paths, to_dropit, errors.
#include <dropit/torch.hpp>

#include "codec_oracle.hpp"
#include "test_support.hpp"
#include "torch_test_support.hpp"
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace dropit_torch_test;
namespace dt = dropit::torch;
namespace nn = torch::nn;

const torch_threads two_threads;

/// Restores every piece size to the default when a test ends.
struct chunk_guard {
  std::size_t saved = dt::chunk_bytes();
  ~chunk_guard() { dt::set_chunk_bytes(saved); }
};

/// Gradients of sum(op(x, w, b) * r) w.r.t. x, w, b, for a fixed random r.
struct grads {
  torch::Tensor y, gx, gw, gb;
};

template <class Op>
grads run(const Op& op, const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0) {
  auto x = x0.detach().clone().requires_grad_(true);
  auto w = w0.detach().clone().requires_grad_(true);
  auto b = b0.defined() ? b0.detach().clone().requires_grad_(true) : torch::Tensor();
  auto y = op(x, w, b);
  torch::manual_seed(99);
  auto r = torch::randn(y.sizes(), y.options());
  (y * r).sum().backward();
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : torch::Tensor()};
}

c10::optional<torch::Tensor> opt(const torch::Tensor& b) {
  return b.defined() ? c10::optional<torch::Tensor>(b) : c10::nullopt;
}

void check_close(const grads& a, const grads& ref, double tol, bool check_gw = true) {
  CHECK(rel_diff(a.y, ref.y) <= tol);
  CHECK(rel_diff(a.gx, ref.gx) <= tol);
  if (check_gw) CHECK(rel_diff(a.gw, ref.gw) <= tol);
  if (ref.gb.defined()) CHECK(rel_diff(a.gb, ref.gb) <= tol);
  if (!ref.gb.defined()) CHECK_FALSE(a.gb.defined());
}

// ---- Identity: LibTorch's own gradients ------------------------------------------------------

TEST_CASE(
    "torch: Identity Linear gradients equal LibTorch's (2-d and 3-d input, bias, fp32/fp64)") {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (bool bias : {true, false}) {
      for (bool three_d : {false, true}) {
        CAPTURE(dtype);
        CAPTURE(bias);
        CAPTURE(three_d);
        torch::manual_seed(3);
        auto x = three_d ? torch::randn({4, 5, 7}, dtype) : torch::randn({9, 7}, dtype);
        auto w = torch::randn({6, 7}, dtype);
        auto b = bias ? torch::randn({6}, dtype) : torch::Tensor();
        const auto p = make_policy(dt::policy_kind::identity);
        auto got = run([&](auto& x_, auto& w_, auto& b_) { return dt::linear(x_, w_, opt(b_), p); },
                       x, w, b);
        auto ref =
            run([&](auto& x_, auto& w_, auto& b_) { return torch::linear(x_, w_, b_); }, x, w, b);
        check_close(got, ref, 1e-6);
      }
    }
  }
}

TEST_CASE("torch: Identity Conv2d gradients equal LibTorch's (stride, padding, groups, dilation)") {
  struct conv_case {
    std::int64_t cin, cout, k, stride, pad, dil, groups;
  };
  const std::vector<conv_case> cases = {{3, 4, 3, 1, 1, 1, 1}, {4, 6, 3, 2, 0, 1, 2},
                                        {4, 4, 3, 1, 2, 2, 4}, {2, 5, 1, 1, 0, 1, 1},
                                        {6, 6, 5, 3, 2, 1, 3}, {3, 8, 2, 2, 1, 3, 1}};
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (bool bias : {true, false}) {
      for (const auto& c : cases) {
        CAPTURE(dtype);
        CAPTURE(bias);
        CAPTURE(c.k);
        CAPTURE(c.stride);
        CAPTURE(c.groups);
        CAPTURE(c.dil);
        torch::manual_seed(5);
        auto x = torch::randn({3, c.cin, 11, 9}, dtype);
        auto w = torch::randn({c.cout, c.cin / c.groups, c.k, c.k}, dtype);
        auto b = bias ? torch::randn({c.cout}, dtype) : torch::Tensor();
        dt::conv2d_params params;
        params.stride = {c.stride, c.stride};
        params.padding = {c.pad, c.pad};
        params.dilation = {c.dil, c.dil};
        params.groups = c.groups;
        const auto p = make_policy(dt::policy_kind::identity);
        auto got = run(
            [&](auto& x_, auto& w_, auto& b_) { return dt::conv2d(x_, w_, opt(b_), params, p); }, x,
            w, b);
        auto ref = run(
            [&](auto& x_, auto& w_, auto& b_) {
              return torch::conv2d(x_, w_, b_, c.stride, c.pad, c.dil, c.groups);
            },
            x, w, b);
        check_close(got, ref, 1e-6);
      }
    }
  }
}

TEST_CASE("torch: Identity Conv1D (GPT-2 addmm) gradients equal LibTorch's addmm") {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (bool bias : {true, false}) {
      CAPTURE(dtype);
      CAPTURE(bias);
      torch::manual_seed(7);
      auto x = torch::randn({2, 5, 8}, dtype);
      auto w = torch::randn({8, 12}, dtype);  // [nx, nf]
      auto b = bias ? torch::randn({12}, dtype) : torch::Tensor();
      const auto p = make_policy(dt::policy_kind::identity);
      auto got =
          run([&](auto& x_, auto& w_, auto& b_) { return dt::gpt2_conv1d(x_, w_, opt(b_), p); }, x,
              w, b);
      auto ref = run(
          [&](auto& x_, auto& w_, auto& b_) {
            auto x2 = x_.reshape({-1, 8});
            auto y = b_.defined() ? torch::addmm(b_, x2, w_) : x2.mm(w_);
            return y.view({2, 5, 12});
          },
          x, w, b);
      check_close(got, ref, 1e-6);
    }
  }
}

TEST_CASE("torch: Identity layers in bfloat16 match LibTorch's bfloat16 ops") {
  if (!DROPIT_HAS_HALF) {
    MESSAGE("skipped: bfloat16 caches need the CUDA toolkit's cuda_bf16.h");
    return;
  }
  torch::manual_seed(11);
  auto x = torch::randn({6, 16}).to(torch::kBFloat16);
  auto w = torch::randn({8, 16}).to(torch::kBFloat16);
  auto b = torch::randn({8}).to(torch::kBFloat16);
  const auto p = make_policy(dt::policy_kind::identity);
  auto got =
      run([&](auto& x_, auto& w_, auto& b_) { return dt::linear(x_, w_, opt(b_), p); }, x, w, b);
  auto ref = run([&](auto& x_, auto& w_, auto& b_) { return torch::linear(x_, w_, b_); }, x, w, b);
  check_close(got, ref, 1e-2);  // bf16 rounding of differently ordered sums
  auto xc = torch::randn({2, 3, 8, 8}).to(torch::kBFloat16);
  auto wc = torch::randn({4, 3, 3, 3}).to(torch::kBFloat16);
  auto gotc = run([&](auto& x_, auto& w_, auto& b_) { return dt::conv2d(x_, w_, opt(b_), {}, p); },
                  xc, wc, torch::Tensor());
  auto refc = run([&](auto& x_, auto& w_, auto&) { return torch::conv2d(x_, w_); }, xc, wc,
                  torch::Tensor());
  check_close(gotc, refc, 0.0);  // the very same LibTorch calls
  MESSAGE("half (fp16): LibTorch 1.13's CPU addmm and conv2d do not support it; not tested");
}

// ---- MinK: the brute-force sparsified input -------------------------------------------------

TEST_CASE(
    "torch: MinK Linear/Conv1D/Conv2d weight gradient comes from the top-k sparsified input") {
  for (double gamma : {0.5, 0.9, 0.99}) {
    CAPTURE(gamma);
    const auto p = make_policy(dt::policy_kind::mink, gamma);
    {  // Linear, 3-d input: the whole input is one selection
      auto x = tie_free({3, 7, 16}, torch::kDouble);
      auto w = torch::randn({5, 16}, torch::kDouble);
      auto b = torch::randn({5}, torch::kDouble);
      auto got = run([&](auto& x_, auto& w_, auto& b_) { return dt::linear(x_, w_, opt(b_), p); },
                     x, w, b);
      auto exact =
          run([&](auto& x_, auto& w_, auto& b_) { return torch::linear(x_, w_, b_); }, x, w, b);
      auto sparse = run([&](auto&, auto& w_,
                            auto& b_) { return torch::linear(topk_sparsified(x, gamma), w_, b_); },
                        x, w, b);
      CHECK(rel_diff(got.y, exact.y) <= 1e-12);     // forward is exact
      CHECK(rel_diff(got.gx, exact.gx) <= 1e-12);   // input gradient is exact
      CHECK(rel_diff(got.gb, exact.gb) <= 1e-12);   // bias gradient is exact
      CHECK(rel_diff(got.gw, sparse.gw) <= 1e-12);  // weight gradient from the sparsified input
      if (gamma > 0) CHECK(rel_diff(got.gw, exact.gw) > 1e-6);
    }
    {  // Conv1D
      auto x = tie_free({4, 10}, torch::kDouble, 2);
      auto w = torch::randn({10, 3}, torch::kDouble);
      auto got =
          run([&](auto& x_, auto& w_, auto& b_) { return dt::gpt2_conv1d(x_, w_, opt(b_), p); }, x,
              w, torch::Tensor());
      auto sparse = run([&](auto&, auto& w_, auto&) { return topk_sparsified(x, gamma).mm(w_); }, x,
                        w, torch::Tensor());
      CHECK(rel_diff(got.gw, sparse.gw) <= 1e-12);
    }
    {  // Conv2d, stride 2, padding 1
      auto x = tie_free({2, 3, 9, 9}, torch::kDouble, 3);
      auto w = torch::randn({4, 3, 3, 3}, torch::kDouble);
      dt::conv2d_params params;
      params.stride = {2, 2};
      params.padding = {1, 1};
      auto got =
          run([&](auto& x_, auto& w_, auto& b_) { return dt::conv2d(x_, w_, opt(b_), params, p); },
              x, w, torch::Tensor());
      auto exact = run([&](auto& x_, auto& w_, auto&) { return torch::conv2d(x_, w_, {}, 2, 1); },
                       x, w, torch::Tensor());
      auto sparse =
          run([&](auto&, auto& w_,
                  auto&) { return torch::conv2d(topk_sparsified(x, gamma), w_, {}, 2, 1); },
              x, w, torch::Tensor());
      CHECK(rel_diff(got.gx, exact.gx) <= 1e-12);
      CHECK(rel_diff(got.gw, sparse.gw) <= 1e-12);
    }
  }
}

TEST_CASE(
    "torch: a Linear's weight gradient from the kept elements alone equals the topk oracle's, "
    "for every position encoding, fp32 and fp64, on one worker and on two") {
  // kept_product.hpp: x^T g from the payload without rebuilding x, where the cost model says it
  // pays (here gamma 0.8 on; 0.5 rebuilds). 613 x 53 elements: four Elias-Fano blocks and a
  // partial one; 37 outputs: the AVX-512 kernel's 16-lane steps and a tail. With the fork meter
  // at 0 the product forks at gamma 0.9 (checked); fewer kept elements do not pay for a second
  // worker's sum matrix however cheap the fork. Each payload's weight gradient is also forced
  // down each path (matmul_weight_grad), against the same oracle.
  using dropit::position_choice;
  using dropit::position_encoding;
  using dropit::detail::fork_meter;
  struct encoding_case {
    double gamma;
    position_choice choice;
    position_encoding encoding;
  };
  const std::vector<encoding_case> cases = {
      {0.9, position_choice::no_elias_fano, position_encoding::bitmask},
      {0.9, position_choice::smallest, position_encoding::elias_fano},
      {0.99, position_choice::smallest, position_encoding::elias_fano},
      {0.9999, position_choice::smallest, position_encoding::index32},
      {0.8, position_choice::no_elias_fano, position_encoding::bitmask},
      {0.5, position_choice::smallest, position_encoding::bitmask}};
  const int threads_before = at::get_num_threads();
  at::set_num_threads(2);
  const std::int64_t rows = 613, in = 53, out = 37;
  const auto n = static_cast<std::size_t>(rows * in);
  for (auto dtype : {torch::kFloat, torch::kDouble})
    for (bool fork : {false, true})
      for (const auto& c : cases) {
        CAPTURE(dtype);
        CAPTURE(fork);
        CAPTURE(c.gamma);
        const std::size_t size = dtype == torch::kFloat ? 4 : 8;
        CHECK(dropit::make_layout(n, dropit::MinK<>{c.gamma}.kept(n), size,
                                  dropit::value_codec::exact, c.choice)
                  .positions == c.encoding);
        auto policy = make_policy(dt::policy_kind::mink, c.gamma);
        policy.positions = c.choice;
        auto x = tie_free({rows, in}, dtype, 41);
        auto w = torch::randn({out, in}, dtype);
        auto b = torch::randn({out}, dtype);
        fork_meter::set(fork ? 0 : std::uint64_t{1} << 40, true);
        const auto forks = fork_meter::samples();
        auto got =
            run([&](auto& x_, auto& w_, auto& b_) { return dt::linear(x_, w_, opt(b_), policy); },
                x, w, b);
        if (fork && c.gamma == 0.9) CHECK(fork_meter::samples() > forks);
        auto sparse =
            run([&](auto&, auto& w_,
                    auto& b_) { return torch::linear(topk_sparsified(x, c.gamma), w_, b_); },
                x, w, b);
        const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
        CHECK(rel_diff(got.gw, sparse.gw) <= tol);
        CHECK(rel_diff(got.gb, sparse.gb) <= tol);
        const auto g = torch::randn({rows, out}, dtype);
        const auto want = g.t().mm(topk_sparsified(x, c.gamma));
        const auto packed = dt::detail::save_packed(x, policy);
        for (auto path :
             {dt::detail::weight_grad_path::kept, dt::detail::weight_grad_path::rebuild}) {
          CAPTURE(static_cast<int>(path));
          CHECK(rel_diff(dt::detail::matmul_weight_grad(packed, false, g, in, false, w, path),
                         want) <= tol);
          CHECK(rel_diff(dt::detail::matmul_weight_grad(packed, false, g, in, true, w, path),
                         want.t()) <= tol);
        }
      }
  fork_meter::set(0, true);
  at::set_num_threads(threads_before);
}

TEST_CASE(
    "torch: with int8 or fp8 kept values, a Linear's weight gradient from the kept elements "
    "equals the product with the brute-force quantized topk input, on one worker and on two") {
  // kept_product.hpp decodes a chunk's 8-bit values next to its positions. Oracle: topk's kept
  // set, its values in index order quantized by codec_oracle.hpp, times the output gradient.
  // 613 x 53 elements keep 3249 at gamma 0.9: four codec chunks, the last partial. gamma 0.5 is
  // the rebuild path, same oracle.
  using dropit::detail::fork_meter;
  const int threads_before = at::get_num_threads();
  at::set_num_threads(2);
  const std::int64_t rows = 613, in = 53, out = 37;
  for (auto codec : {dropit::value_codec::int8, dropit::value_codec::fp8_e4m3})
    for (auto positions :
         {dropit::position_choice::smallest, dropit::position_choice::no_elias_fano})
      for (double gamma : {0.9, 0.99, 0.5})
        for (bool fork : {false, true}) {
          CAPTURE(codec);
          CAPTURE(positions);
          CAPTURE(gamma);
          CAPTURE(fork);
          auto policy = make_policy(dt::policy_kind::mink, gamma);
          policy.codec = codec;
          policy.positions = positions;
          auto x = tie_free({rows, in}, torch::kFloat, 43);
          auto w = torch::randn({out, in});
          auto b = torch::randn({out});
          fork_meter::set(fork ? 0 : std::uint64_t{1} << 40, true);
          const auto forks = fork_meter::samples();
          auto got =
              run([&](auto& x_, auto& w_, auto& b_) { return dt::linear(x_, w_, opt(b_), policy); },
                  x, w, b);
          if (fork && gamma == 0.9) CHECK(fork_meter::samples() > forks);
          // The oracle's input: topk's positions in index order, their values coded.
          const auto flat = x.reshape({-1});
          const auto k = static_cast<std::int64_t>(
              dropit_test::expected_k(static_cast<std::size_t>(rows * in), gamma));
          const auto kept_idx = std::get<0>(std::get<1>(torch::topk(flat.abs(), k)).sort());
          std::vector<std::size_t> kept(static_cast<std::size_t>(kept_idx.numel()));
          for (std::size_t j = 0; j < kept.size(); ++j)
            kept[j] = static_cast<std::size_t>(
                kept_idx[static_cast<std::int64_t>(j)].item<std::int64_t>());
          const auto dense = dropit_test::oracle_coded_dense<float>(
              std::span<const float>(flat.data_ptr<float>(),
                                     static_cast<std::size_t>(flat.numel())),
              kept, codec == dropit::value_codec::fp8_e4m3);
          const auto x_hat = torch::from_blob(const_cast<float*>(dense.data()), {rows, in}).clone();
          auto want =
              run([&](auto&, auto& w_, auto& b_) { return torch::linear(x_hat, w_, b_); }, x, w, b);
          CHECK(rel_diff(got.gw, want.gw) <= 1e-5);
          CHECK(rel_diff(got.gb, want.gb) <= 1e-5);
        }
  fork_meter::set(0, true);
  at::set_num_threads(threads_before);
}

TEST_CASE("torch: MinK's kept set equals torch::topk(x.abs(), k) on tie-free input") {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (std::int64_t n : {1000, 4096, 100000}) {
      for (double gamma : {0.5, 0.9}) {
        CAPTURE(n);
        CAPTURE(gamma);
        auto x = tie_free({n}, dtype, static_cast<std::uint64_t>(n));
        auto saved = dt::detail::save_packed(x, make_policy(dt::policy_kind::mink, gamma));
        auto rebuilt = dt::detail::restore_packed(saved, x.sizes());
        const auto k =
            static_cast<std::int64_t>(dropit_test::expected_k(static_cast<std::size_t>(n), gamma));
        auto topk_idx = std::get<0>(std::get<1>(torch::topk(x.abs(), k)).sort());
        auto kept_idx = rebuilt.nonzero().reshape({-1});
        REQUIRE(kept_idx.numel() == k);
        CHECK(torch::equal(kept_idx, topk_idx));
        CHECK(torch::equal(rebuilt.index({kept_idx}), x.index({kept_idx})));
      }
    }
  }
}

TEST_CASE("torch: MinK with ties keeps the lowest indices first (test_support's oracle)") {
  // Values rounded to a few levels: many exact ties at the threshold.
  torch::manual_seed(21);
  auto x = torch::randint(-4, 5, {5000}, torch::kFloat);
  auto saved = dt::detail::save_packed(x, make_policy(dt::policy_kind::mink, 0.7));
  auto rebuilt = dt::detail::restore_packed(saved, x.sizes());
  std::vector<float> xs(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
  const auto kept = dropit_test::oracle_mink<float>(std::span<const float>(xs),
                                                    dropit_test::expected_k(xs.size(), 0.7));
  const auto want = dropit_test::dense_from<float>(std::span<const float>(xs), kept);
  CHECK(torch::equal(rebuilt, torch::from_blob(const_cast<float*>(want.data()), {5000}).clone()));
}

TEST_CASE("torch: Random draws new positions at every training step, MinK does not") {
  for (auto kind : {dt::policy_kind::random, dt::policy_kind::mink}) {
    CAPTURE(dt::to_string(kind));
    torch::manual_seed(4);
    dt::Linear layer(32, 4, make_policy(kind, 0.9, 123));
    auto x = torch::randn({16, 32});
    std::vector<torch::Tensor> gws;
    for (int step = 0; step < 3; ++step) {
      layer->zero_grad();
      layer(x).sum().backward();
      gws.push_back(layer->weight.grad().clone());
    }
    CHECK(layer->steps() == 3);
    if (kind == dt::policy_kind::random) {
      CHECK_FALSE(torch::equal(gws[0], gws[1]));
      CHECK_FALSE(torch::equal(gws[1], gws[2]));
    } else {
      CHECK(torch::equal(gws[0], gws[1]));
      CHECK(torch::equal(gws[1], gws[2]));
    }
  }
  // Random keeps exactly k positions, as the policy says.
  auto x = tie_free({10000});
  auto rebuilt = dt::detail::restore_packed(
      dt::detail::save_packed(x, make_policy(dt::policy_kind::random, 0.9, 5)), x.sizes());
  CHECK(rebuilt.ne(0).sum().item<std::int64_t>() == 1000);
}

// ---- pieces (chunking) -----------------------------------------------------------------------

TEST_CASE("torch: gradients computed in pieces equal the gradients computed whole") {
  chunk_guard restore_default;
  for (auto kind : {dt::policy_kind::identity, dt::policy_kind::mink}) {
    CAPTURE(dt::to_string(kind));
    const auto p = make_policy(kind, 0.8);
    auto x = tie_free({6, 10, 24}, torch::kDouble, 8);
    auto w = torch::randn({7, 24}, torch::kDouble);
    auto b = torch::randn({7}, torch::kDouble);
    auto xc = tie_free({7, 3, 10, 10}, torch::kDouble, 9);
    auto wc = torch::randn({5, 3, 3, 3}, torch::kDouble);
    auto bc = torch::randn({5}, torch::kDouble);
    dt::conv2d_params params;
    params.padding = {1, 1};
    auto lin = [&](auto& x_, auto& w_, auto& b_) { return dt::linear(x_, w_, opt(b_), p); };
    auto c1d = [&](auto& x_, auto& w_, auto&) { return dt::gpt2_conv1d(x_, w_.t(), {}, p); };
    auto conv = [&](auto& x_, auto& w_, auto& b_) {
      return dt::conv2d(x_, w_, opt(b_), params, p);
    };
    dt::set_chunk_bytes(0);
    const auto whole_lin = run(lin, x, w, b);
    const auto whole_c1d = run(c1d, x, w, torch::Tensor());
    const auto whole_conv = run(conv, xc, wc, bc);
    for (std::size_t piece : {std::size_t{1}, std::size_t{700}, std::size_t{4000}}) {
      CAPTURE(piece);
      dt::set_chunk_bytes(piece);  // 1 byte: one row / one sample per piece
      check_close(run(lin, x, w, b), whole_lin, 1e-12);
      check_close(run(c1d, x, w, torch::Tensor()), whole_c1d, 1e-12);
      check_close(run(conv, xc, wc, bc), whole_conv, 1e-12);
    }
  }
}

TEST_CASE("torch: a range restore equals the slice of a whole restore, for every encoding") {
  // gamma 0.5: bitmask; 0.9 and 0.99: Elias-Fano; 0.9999: index list; 0 and 1: no positions
  // (dense copy, nothing kept); each with exact, int8 and e4m3 values (a coded range decodes only
  // the chunks it needs).
  using dropit::position_encoding;
  const std::map<double, position_encoding> encodings = {
      {0.0, position_encoding::none},       {0.5, position_encoding::bitmask},
      {0.9, position_encoding::elias_fano}, {0.99, position_encoding::elias_fano},
      {0.9999, position_encoding::index32}, {1.0, position_encoding::none}};
  for (auto codec :
       {dropit::value_codec::exact, dropit::value_codec::int8, dropit::value_codec::fp8_e4m3})
    for (const auto& [gamma, encoding] : encodings) {
      CAPTURE(gamma);
      CAPTURE(dt::to_string(codec));
      CHECK(dropit::make_layout(70001, dropit::MinK<>{gamma}.kept(70001), 4, codec).positions ==
            encoding);
      auto x = tie_free({70001}, torch::kFloat, 31);
      auto policy = make_policy(dt::policy_kind::mink, gamma);
      policy.codec = codec;
      auto saved = dt::detail::save_packed(x, policy);
      const auto whole = dt::detail::restore_packed(saved, x.sizes());
      const std::vector<std::pair<std::int64_t, std::int64_t>> ranges = {
          {0, 70001},   {0, 1},         {5, 37},  {31, 33},     {1000, 3071},
          {1024, 2048}, {69999, 70001}, {33, 33}, {8191, 8193}, {16000, 40000}};
      for (auto [b, e] : ranges) {
        CAPTURE(b);
        CAPTURE(e);
        auto part = torch::full({e - b}, 7.0f);
        dt::detail::box_of<dt::detail::cache_box>(saved).cache.restore_range(
            static_cast<std::size_t>(b), static_cast<std::size_t>(e), part.data_ptr());
        CHECK(torch::equal(part, whole.slice(0, b, e)));
      }
      if (codec != dropit::value_codec::exact && gamma > 0.0 && gamma < 1.0) {  // through the codec
        auto exact_policy = make_policy(dt::policy_kind::mink, gamma);
        auto exact = dt::detail::save_packed(x, exact_policy);
        const auto plain = dt::detail::restore_packed(exact, x.sizes());
        CHECK_FALSE(torch::equal(whole, plain));
        CHECK(torch::equal(whole.ne(0), plain.ne(0)));  // the same positions
        CHECK((whole - plain).abs().max().item<double>() <= plain.abs().max().item<double>() / 16);
      }
    }
}

// ---- plain paths, lifetime -------------------------------------------------------------------

TEST_CASE("torch: eval mode, no-grad and policy none run the plain op and save nothing") {
  torch::manual_seed(12);
  auto x = torch::randn({4, 8});
  dt::Linear layer(8, 3, make_policy(dt::policy_kind::mink));
  nn::Linear plain(8, 3);
  {
    torch::NoGradGuard no_grad;
    plain->weight.copy_(layer->weight);
    plain->bias.copy_(layer->bias);
  }
  const auto before = dt::live_saved_bytes().total();
  auto check_plain = [&](const torch::Tensor& y) {
    CHECK(dt::live_saved_bytes().total() == before);
    CHECK(torch::equal(y, plain(x)));
  };
  layer->eval();
  check_plain(layer(x));
  layer->train();
  {
    torch::NoGradGuard no_grad;
    check_plain(layer(x));
  }
  // Opted out: the input itself is kept (nothing packed, no copy) and backward still runs
  // dropit's (in pieces); the output is LibTorch's, the gradients equal LibTorch's.
  layer->exclude();
  {
    auto xg = x.clone().requires_grad_(true);
    const auto y = layer(xg);
    CHECK(torch::equal(y, plain(x)));
    CHECK(dt::live_saved_bytes().total() == before);
    CHECK(y.grad_fn()->name().find("linear_fn") != std::string::npos);  // dropit's backward
    y.sum().backward();
    auto xp = x.clone().requires_grad_(true);
    plain->zero_grad();
    plain(xp).sum().backward();
    CHECK(rel_diff(layer->weight.grad(), plain->weight.grad()) < 1e-6);
    CHECK(torch::equal(xg.grad(), xp.grad()));
    layer->zero_grad();
  }
  CHECK(layer->steps() == 0);
  CHECK(dt::live_saved_bytes().total() == before);
  layer->exclude(false);
  layer->set_policy({});
  check_plain(layer(x));
  layer->set_policy(make_policy(dt::policy_kind::mink));
  auto y = layer(x);
  CHECK(dt::live_saved_bytes().sparse > 0);
  y.sum().backward();
  CHECK(dt::live_saved_bytes().total() == before);  // freed right after its backward
}

TEST_CASE(
    "torch: retain_graph keeps the cache for a second backward; without it LibTorch refuses") {
  torch::manual_seed(13);
  dt::Linear layer(8, 3, make_policy(dt::policy_kind::mink, 0.5));
  auto x = torch::randn({4, 8});
  auto loss = layer(x).pow(2).sum();
  loss.backward({}, /*retain_graph=*/true);
  auto once = layer->weight.grad().clone();
  loss.backward();
  CHECK(rel_diff(layer->weight.grad(), 2 * once) <= 1e-6);
  CHECK_THROWS(loss.backward());
}

// ---- modules and to_dropit -------------------------------------------------------------------

struct NetImpl : nn::Module {
  NetImpl() {
    features = register_module("features",
                               nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)),
                                              nn::MaxPool2d(2), nn::ReLU(), nn::Flatten()));
    heads = register_module("heads", nn::ModuleList(nn::Linear(4 * 4 * 4, 8), nn::Linear(8, 3)));
    member = register_module("member", nn::Linear(3, 2));  // called by forward: not replaceable
    own = register_module("own", dt::Linear(2, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = features->forward(x);
    for (const auto& h : *heads)
      x = h->as<dt::LinearImpl>() ? h->as<dt::LinearImpl>()->forward(x)
                                  : h->as<nn::LinearImpl>()->forward(x);
    return own(member(x));
  }
  nn::Sequential features{nullptr};
  nn::ModuleList heads{nullptr};
  nn::Linear member{nullptr};
  dt::Linear own{nullptr};
};
TORCH_MODULE(Net);

TEST_CASE("torch: to_dropit replaces Sequential/ModuleList children, shares their parameters") {
  torch::manual_seed(14);
  Net net;
  auto x = torch::randn({2, 1, 8, 8});
  net->eval();
  const auto y_before = net(x);
  const auto params_before = net->parameters();
  torch::optim::SGD sgd(params_before, 0.1);  // built before the conversion

  const auto report = dt::to_dropit(*net, make_policy(dt::policy_kind::mink));
  CHECK(report.replaced == 5);  // conv, pool, relu, two heads
  CHECK(report.switched == 6);  // those five plus `own`
  CHECK(report.excluded == 0);
  CHECK(report.fused == 1);  // the pool applies the ReLU after it
  CHECK(net->features[1]->as<dt::MaxPool2dImpl>()->applies_relu());
  CHECK(net->features[2]->as<dt::ReLUImpl>()->absorbed());
  CHECK(net->features[0]->as<dt::Conv2dImpl>() != nullptr);
  CHECK(net->features[1]->as<dt::MaxPool2dImpl>() != nullptr);
  CHECK(net->features[2]->as<dt::ReLUImpl>() != nullptr);
  CHECK(net->features[3]->as<nn::FlattenImpl>() != nullptr);
  CHECK(net->heads[0]->as<dt::LinearImpl>() != nullptr);
  CHECK(net->heads->ptr<dt::LinearImpl>(1) != nullptr);
  CHECK(dynamic_cast<dt::layer*>(net->member.ptr().get()) == nullptr);  // a named member: kept
  CHECK(net->own->get_policy().kind == dt::policy_kind::mink);

  // The same parameter tensors, in the same order; the same function in eval mode.
  const auto params_after = net->parameters();
  REQUIRE(params_after.size() == params_before.size());
  for (std::size_t i = 0; i < params_after.size(); ++i) {
    CHECK(params_after[i].unsafeGetTensorImpl() == params_before[i].unsafeGetTensorImpl());
  }
  CHECK(torch::equal(net(x), y_before));

  // Training goes through dropit (the Sequential calls the new layers) and the old optimizer
  // updates the shared parameters.
  net->train();
  const auto w0 = net->features[0]->as<dt::Conv2dImpl>()->weight.clone();
  auto loss = net(x).sum();
  CHECK(dt::live_saved_bytes().total() > 0);
  sgd.zero_grad();
  loss.backward();
  sgd.step();
  CHECK_FALSE(torch::equal(net->features[0]->as<dt::Conv2dImpl>()->weight, w0));
  CHECK(net->features[0]->as<dt::Conv2dImpl>()->steps() == 1);

  // Switching back to none: every dropit layer runs the plain op; nothing is replaced back.
  const auto off = dt::to_dropit(*net, {});
  CHECK(off.replaced == 0);
  CHECK(off.switched == 6);
  CHECK(off.fused == 0);
  net->eval();
  auto fresh = Net();
  fresh->eval();
  torch::NoGradGuard no_grad;
  // Still the model's function: the fused pool applies the ReLU on the plain path too.
  auto dict = fresh->named_parameters();
  for (const auto& p : net->named_parameters())
    dict[p.key()].copy_(p.value());
  CHECK(torch::equal(net(x), fresh(x)));
}

TEST_CASE("torch: to_dropit fuses MaxPool2d + ReLU: LibTorch's gradients, fewer saved bytes") {
  auto make = [] {
    torch::manual_seed(15);
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(2, 8, 3).padding(1)), nn::MaxPool2d(2),
                          nn::ReLU(nn::ReLUOptions().inplace(true)),
                          nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)), nn::MaxPool2d(2),
                          nn::ReLU(), nn::Flatten(), nn::Linear(8 * 4 * 4, 3));
  };
  torch::manual_seed(16);
  const auto x = torch::randn({6, 2, 16, 16});
  const auto target = torch::randint(0, 3, {6});
  auto plain = make();
  torch::nn::functional::cross_entropy(plain->forward(x), target).backward();

  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  std::size_t saved_fused = 0, saved_apart = 0;
  for (bool fuse : {true, false}) {
    CAPTURE(fuse);
    auto net = make();
    dt::convert_options options;
    options.fuse_pool_relu = fuse;
    // Identity keeps the conv/linear inputs exact, so every gradient must equal LibTorch's.
    const auto report = dt::to_dropit(*net, make_policy(dt::policy_kind::identity), options);
    CHECK(report.fused == (fuse ? 2 : 0));
    CHECK(net[1]->as<dt::MaxPool2dImpl>()->applies_relu() == fuse);
    CHECK(net[5]->as<dt::ReLUImpl>()->absorbed() == fuse);
    const auto masks_before = dt::live_saved_bytes().masks;
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), target);
    (fuse ? saved_fused : saved_apart) = dt::live_saved_bytes().masks - masks_before;
    loss.backward();
    const auto got = net->named_parameters(), want = plain->named_parameters();
    for (const auto& p : want) {
      CAPTURE(p.key());
      CHECK(rel_diff(got[p.key()].grad(), p.value().grad()) <= 1e-6);
    }
    CHECK(dt::live_saved_bytes().masks == masks_before);
  }
  CHECK(saved_fused < saved_apart);
  MESSAGE("pool/ReLU saved bytes: fused " << saved_fused << ", apart " << saved_apart);

  // An excluded ReLU or pool is not fused (dropit layers: standard ones there are not replaced).
  nn::Sequential own(dt::MaxPool2d(nn::MaxPool2dOptions(2)), dt::ReLU(),
                     dt::MaxPool2d(nn::MaxPool2dOptions(2)), dt::ReLU(),
                     dt::MaxPool2d(nn::MaxPool2dOptions(2)), dt::ReLU());
  dt::convert_options options;
  options.exclude = [](const std::string& path, const nn::Module&) {
    return path == "3" || path == "4";
  };
  CHECK(dt::to_dropit(*own, make_policy(dt::policy_kind::mink), options).fused == 1);
  CHECK(own[0]->as<dt::MaxPool2dImpl>()->applies_relu());
  CHECK(own[1]->as<dt::ReLUImpl>()->absorbed());
  CHECK_FALSE(own[2]->as<dt::MaxPool2dImpl>()->applies_relu());
  CHECK_FALSE(own[3]->as<dt::ReLUImpl>()->absorbed());
  CHECK_FALSE(own[4]->as<dt::MaxPool2dImpl>()->applies_relu());
}

TEST_CASE("torch: to_dropit honours exclusions and the masks option") {
  nn::Sequential seq(nn::Linear(4, 4), nn::ReLU(), nn::Linear(4, 2));
  dt::convert_options options;
  options.masks = false;
  options.exclude = [](const std::string& path, const nn::Module&) { return path == "2"; };
  const auto report = dt::to_dropit(*seq, make_policy(dt::policy_kind::mink), options);
  // The excluded Linear is replaced too, marked excluded: exact input, dropit's backward.
  CHECK(report.replaced == 2);
  CHECK(report.excluded == 1);
  CHECK(seq[0]->as<dt::LinearImpl>() != nullptr);
  CHECK(seq[1]->as<dt::ReLUImpl>() == nullptr);
  REQUIRE(seq[2]->as<dt::LinearImpl>() != nullptr);
  CHECK(seq[2]->as<dt::LinearImpl>()->excluded());
  CHECK(seq[2]->as<dt::LinearImpl>()->get_policy().kind == dt::policy_kind::mink);
  // An opted-out dropit layer keeps its policy.
  seq[0]->as<dt::LinearImpl>()->exclude();
  const auto again = dt::to_dropit(*seq, make_policy(dt::policy_kind::random, 0.5));
  CHECK(again.excluded == 2);
  CHECK(seq[0]->as<dt::LinearImpl>()->get_policy().kind == dt::policy_kind::mink);
}

TEST_CASE("torch: to_dropit's layer_gamma sets gamma per layer, the longest matching path wins") {
  nn::ModuleList inner(nn::Linear(6, 6), nn::ReLU(), nn::Linear(6, 6));
  nn::ModuleList seq(nn::Linear(6, 6), inner, nn::Linear(6, 2));
  dt::convert_options options;
  options.layer_gamma = {{"", 0.8}, {"1", 0.5}, {"1.2", 0.0}};
  dt::to_dropit(*seq, make_policy(dt::policy_kind::mink, 0.9), options);
  auto gamma = [&](const std::string& path) {
    return seq->named_modules()[path]->as<dt::LinearImpl>()->get_policy().gamma;
  };
  CHECK(gamma("0") == 0.8);
  CHECK(gamma("1.0") == 0.5);
  CHECK(gamma("1.2") == 0.0);
  CHECK(gamma("2") == 0.8);
  // Bad keys and gammas change nothing.
  nn::ModuleList fresh(nn::Linear(6, 6));
  for (const auto& [bad, message] :
       {std::pair{std::map<std::string, double>{{"3", 0.5}}, "no module of the model"},
        std::pair{std::map<std::string, double>{{"0", 1.5}}, "must be in [0, 1]"}}) {
    dt::convert_options o;
    o.layer_gamma = bad;
    CHECK_THROWS_WITH_AS((void)dt::to_dropit(*fresh, make_policy(dt::policy_kind::mink), o),
                         doctest::Contains(message), dropit::error);
    CHECK(fresh[0]->as<dt::LinearImpl>() == nullptr);
  }
}

TEST_CASE(
    "torch: dropit modules match their torch::nn counterparts (options, init, clone, print)") {
  torch::manual_seed(15);
  nn::Linear plain(5, 3);
  torch::manual_seed(15);
  dt::Linear ours(5, 3);
  CHECK(torch::equal(plain->weight, ours->weight));  // the same initialisation
  CHECK(torch::equal(plain->bias, ours->bias));
  ours->set_policy(make_policy(dt::policy_kind::mink, 0.75));
  auto copy = std::dynamic_pointer_cast<dt::LinearImpl>(ours->clone());
  REQUIRE(copy);
  CHECK(copy->get_policy().gamma == 0.75);
  CHECK(torch::equal(copy->weight, ours->weight));
  CHECK(copy->weight.data_ptr() != ours->weight.data_ptr());
  std::ostringstream s;
  s << *ours;
  CHECK(s.str() ==
        "dropit::torch::Linear(in_features=5, out_features=3, bias=true, policy=mink(0.75))");

  dt::Conv2d conv(nn::Conv2dOptions(2, 3, 3).padding(1).bias(false));
  std::ostringstream sc;
  sc << *conv;
  CHECK(sc.str().rfind("dropit::torch::Conv2d(2, 3, kernel_size=[3, 3]", 0) == 0);
  CHECK(!conv->bias.defined());

  dt::Conv1D c1d(12, 8);
  CHECK(c1d->weight.sizes() == torch::IntArrayRef({8, 12}));
  CHECK(torch::equal(c1d->bias, torch::zeros({12})));
  CHECK(std::abs(c1d->weight.std().item<double>() - 0.02) < 0.01);
  CHECK(c1d(torch::randn({3, 8})).sizes() == torch::IntArrayRef({3, 12}));

  // A Sequential of dropit layers trains.
  nn::Sequential seq(dt::Conv2d(nn::Conv2dOptions(1, 2, 3), make_policy(dt::policy_kind::mink)),
                     dt::ReLU(make_policy(dt::policy_kind::mink)), nn::Flatten(),
                     dt::Linear(2 * 4 * 4, 2, make_policy(dt::policy_kind::mink)));
  auto out = seq->forward(torch::randn({3, 1, 6, 6}));
  out.sum().backward();
  for (const auto& p : seq->parameters())
    CHECK(p.grad().defined());
}

TEST_CASE("torch: Conv2d padding modes and 'same' go through dropit like LibTorch's module") {
  for (int mode = 0; mode < 4; ++mode) {
    CAPTURE(mode);
    auto options = nn::Conv2dOptions(2, 3, {3, 4}).padding(1);
    if (mode == 1) options.padding_mode(torch::kReflect);
    if (mode == 2) options.padding_mode(torch::kCircular);
    if (mode == 3) options.padding(torch::kSame);  // asymmetric for the even kernel width
    torch::manual_seed(16);
    nn::Conv2d plain(options);
    dt::Conv2d ours(options, make_policy(dt::policy_kind::identity));
    {
      torch::NoGradGuard no_grad;
      ours->weight.copy_(plain->weight);
      ours->bias.copy_(plain->bias);
    }
    auto x = torch::randn({2, 2, 7, 7});
    auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    auto ya = ours(xa), yb = plain(xb);
    CHECK(rel_diff(ya, yb) <= 1e-6);
    ya.pow(2).sum().backward();
    yb.pow(2).sum().backward();
    CHECK(rel_diff(xa.grad(), xb.grad()) <= 1e-6);
    CHECK(rel_diff(ours->weight.grad(), plain->weight.grad()) <= 1e-6);
    CHECK(ours->steps() == 1);
  }
}

/**
 * A dropit convolution module `Ours` against LibTorch's `Plain` with the same options and
 * parameters (identity policy), batched ([2, C, *spatial]) and unbatched: output, input and
 * parameter gradients. Unbatched, LibTorch's module runs on a batch of one (its own unbatched
 * circular padding throws in 1.13).
 */
template <class Plain, class Ours, class Options>
void check_conv_module(const std::vector<Options>& cases, std::vector<std::int64_t> spatial) {
  for (std::size_t i = 0; i < cases.size(); ++i) {
    for (const bool batched : {true, false}) {
      CAPTURE(i);
      CAPTURE(batched);
      torch::manual_seed(17);
      Plain plain(cases[i]);
      Ours ours(cases[i], make_policy(dt::policy_kind::identity));
      {
        torch::NoGradGuard no_grad;
        for (std::size_t j = 0; j < plain->parameters().size(); ++j)
          ours->parameters()[j].copy_(plain->parameters()[j]);
      }
      std::vector<std::int64_t> sizes{cases[i].in_channels()};
      if (batched) sizes.insert(sizes.begin(), 2);
      sizes.insert(sizes.end(), spatial.begin(), spatial.end());
      const auto x = torch::randn(sizes);
      auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
      auto ya = ours(xa), yb = batched ? plain(xb) : plain(xb.unsqueeze(0)).squeeze(0);
      REQUIRE(ya.sizes() == yb.sizes());
      CHECK(rel_diff(ya, yb) <= 1e-6);
      ya.pow(2).sum().backward();
      yb.pow(2).sum().backward();
      CHECK(rel_diff(xa.grad(), xb.grad()) <= 1e-6);
      for (std::size_t j = 0; j < plain->parameters().size(); ++j)
        CHECK(rel_diff(ours->parameters()[j].grad(), plain->parameters()[j].grad()) <= 1e-6);
      CHECK(ours->steps() == 1);
    }
  }
}

/**
 * A dropit convolution module with MinK 0.9 (double) on a tie-free x: the output, input and bias
 * gradients exact, the weight gradient that of the top-k-sparsified input (and not the exact
 * one). `conv(x, w, b)` is LibTorch's functional op with the module's options.
 */
template <class Module, class Conv>
void check_conv_module_mink(Module& ours, const torch::Tensor& x, const Conv& conv) {
  const double gamma = 0.9;
  ours->set_policy(make_policy(dt::policy_kind::mink, gamma));
  ours->to(torch::kDouble);
  auto xa = x.clone().requires_grad_(true);
  const auto y = ours(xa);
  torch::manual_seed(99);
  const auto r = torch::randn(y.sizes(), y.options());
  (y * r).sum().backward();
  const auto w = ours->weight.detach(), b = ours->bias.detach();
  auto xb = x.clone().requires_grad_(true);
  auto we = w.clone().requires_grad_(true), ws = w.clone().requires_grad_(true);
  const auto yb = conv(xb, we, b);
  (yb * r).sum().backward();
  (conv(topk_sparsified(x, gamma), ws, b) * r).sum().backward();
  CHECK(rel_diff(y, yb) <= 1e-12);
  CHECK(rel_diff(xa.grad(), xb.grad()) <= 1e-12);
  CHECK(rel_diff(ours->weight.grad(), ws.grad()) <= 1e-12);
  CHECK(rel_diff(ours->weight.grad(), we.grad()) > 1e-6);  // the selection did drop elements
  std::vector<std::int64_t> dims{0};                       // every dimension but the channels
  for (std::int64_t d = 2; d < r.dim(); ++d)
    dims.push_back(d);
  CHECK(rel_diff(ours->bias.grad(), r.sum(dims)) <= 1e-12);
}

/// to_dropit replaces a `Std` convolution by a dropit `Impl` that takes its layer gamma, prints
/// as `printed...` and clones with its options (a reflect padding mode) and weight.
template <class Impl, class Std, class Options>
void check_conv_replacement(const Options& reflect_options, const std::string& printed) {
  auto seq = nn::Sequential(Std(reflect_options), nn::ReLU());
  dt::convert_options gammas;
  gammas.layer_gamma = {{"0", 0.5}};
  CHECK(dt::to_dropit(*seq, make_policy(dt::policy_kind::mink), gammas).replaced == 2);
  const auto* ours = seq[0]->template as<Impl>();
  REQUIRE(ours != nullptr);
  CHECK(ours->get_policy().gamma == 0.5);
  std::ostringstream text;
  text << *seq[0];
  CHECK(text.str().starts_with(printed));
  auto copy = std::dynamic_pointer_cast<Impl>(ours->clone());
  REQUIRE(copy);
  CHECK(c10::get_if<torch::enumtype::kReflect>(&copy->options.padding_mode()) != nullptr);
  CHECK(torch::equal(copy->weight, ours->weight));
}

TEST_CASE(
    "torch: Conv1d through dropit: LibTorch's gradients (padding modes, 'same', unbatched); "
    "MinK's from the top-k input") {
  using opts = nn::Conv1dOptions;
  const std::vector<opts> cases = {
      opts(4, 6, 3).stride(2).padding(1).dilation(2).groups(2),
      opts(2, 3, 4).padding(torch::kSame),  // asymmetric for the even kernel
      opts(2, 3, 3).padding(2).padding_mode(torch::kReflect),
      opts(2, 3, 3).padding(1).padding_mode(torch::kCircular),
      opts(2, 3, 3).padding(1).padding_mode(torch::kReplicate).bias(false),
      opts(2, 3, 5).padding(torch::kValid)};
  check_conv_module<nn::Conv1d, dt::Conv1d>(cases, {13});
  dt::Conv1d ours(cases[0]);
  check_conv_module_mink(ours, tie_free({2, 4, 13}, torch::kDouble, 4),
                         [](const auto& x, const auto& w, const auto& b) {
                           return torch::conv1d(x, w, b, 2, 1, 2, 2);
                         });
  check_conv_replacement<dt::Conv1dImpl, nn::Conv1d>(cases[2],
                                                     "dropit::torch::Conv1d(2, 3, kernel_size=3");
  CHECK_THROWS_WITH_AS((void)ours(torch::randn({1, 2, 4, 13}, torch::kDouble)),
                       doctest::Contains("Conv1d: input must be 2-d or 3-d, got 4-d"),
                       dropit::error);
}

TEST_CASE(
    "torch: Conv3d through dropit: LibTorch's gradients (padding modes, 'same', unbatched); "
    "MinK's from the top-k input") {
  using opts = nn::Conv3dOptions;
  const std::vector<opts> cases = {
      opts(4, 6, 3).stride({1, 2, 2}).padding({1, 0, 2}).dilation({1, 1, 2}).groups(2),
      opts(2, 3, {2, 3, 4}).padding(torch::kSame),  // asymmetric for the even kernel sizes
      opts(2, 3, 3).padding(1).padding_mode(torch::kReflect),
      opts(2, 3, 3).padding(1).padding_mode(torch::kCircular).bias(false),
      opts(2, 3, 2).padding(1).padding_mode(torch::kReplicate)};
  check_conv_module<nn::Conv3d, dt::Conv3d>(cases, {5, 6, 7});
  dt::Conv3d ours(cases[0]);
  check_conv_module_mink(ours, tie_free({2, 4, 5, 6, 7}, torch::kDouble, 5),
                         [](const auto& x, const auto& w, const auto& b) {
                           return torch::conv3d(x, w, b, {1, 2, 2}, {1, 0, 2}, {1, 1, 2}, 2);
                         });
  check_conv_replacement<dt::Conv3dImpl, nn::Conv3d>(
      cases[2], "dropit::torch::Conv3d(2, 3, kernel_size=[3, 3, 3]");
  CHECK_THROWS_WITH_AS((void)ours(torch::randn({2, 4, 5, 6, 7, 1}, torch::kDouble)),
                       doctest::Contains("Conv3d: input must be 4-d or 5-d, got 6-d"),
                       dropit::error);
}

/**
 * A dropit transposed convolution in a Sequential after to_dropit: the same output as LibTorch's
 * module it replaced (whose parameters it shares), the layer gamma taken, printed as
 * `printed...`, cloned with its options and weight; bad padding mode and rank refused.
 */
template <class Impl, class Std, class Options>
void check_conv_transpose_replacement(const Options& options, const torch::Tensor& x,
                                      const std::string& printed) {
  auto seq = nn::Sequential(Std(options), nn::ReLU());
  const auto before = seq->forward(x);
  dt::convert_options gammas;
  gammas.layer_gamma = {{"0", 0.5}};
  CHECK(dt::to_dropit(*seq, make_policy(dt::policy_kind::mink), gammas).replaced == 2);
  auto* ours = seq[0]->template as<Impl>();
  REQUIRE(ours != nullptr);
  CHECK(ours->get_policy().gamma == 0.5);
  CHECK(torch::equal(seq->forward(x.clone().requires_grad_(true)), before));
  CHECK(ours->steps() == 1);
  std::ostringstream text;
  text << *seq[0];
  CHECK(text.str().starts_with(printed));
  auto copy = std::dynamic_pointer_cast<Impl>(ours->clone());
  REQUIRE(copy);
  CHECK(*copy->options.output_padding() == *options.output_padding());
  CHECK(torch::equal(copy->weight, ours->weight));
  auto bad = options;
  Impl reflect(bad.padding_mode(torch::kReflect), make_policy(dt::policy_kind::mink));
  CHECK_THROWS_WITH_AS((void)reflect.forward(x.clone().requires_grad_(true)),
                       doctest::Contains("only the zeros padding mode"), dropit::error);
  CHECK_THROWS_WITH_AS((void)ours->forward(x.unsqueeze(0).requires_grad_(true)),
                       doctest::Contains("d: input must be"), dropit::error);
}

TEST_CASE(
    "torch: ConvTranspose1d/2d/3d through dropit: LibTorch's gradients (stride, output padding, "
    "dilation, groups, unbatched); MinK's from the top-k input; output_size") {
  {
    using opts = nn::ConvTranspose1dOptions;
    const std::vector<opts> cases = {
        opts(4, 6, 3).stride(2).padding(1).output_padding(1).dilation(2).groups(2),
        opts(2, 3, 4).stride(3).bias(false), opts(2, 3, 1).padding(0)};
    check_conv_module<nn::ConvTranspose1d, dt::ConvTranspose1d>(cases, {13});
    dt::ConvTranspose1d ours(cases[0]);
    check_conv_module_mink(ours, tie_free({2, 4, 13}, torch::kDouble, 4),
                           [](const auto& x, const auto& w, const auto& b) {
                             return torch::conv_transpose1d(x, w, b, 2, 1, 1, 2, 2);
                           });
    check_conv_transpose_replacement<dt::ConvTranspose1dImpl, nn::ConvTranspose1d>(
        cases[0], torch::randn({2, 4, 13}), "dropit::torch::ConvTranspose1d(4, 6, kernel_size=3");
  }
  {
    using opts = nn::ConvTranspose2dOptions;
    const std::vector<opts> cases = {
        opts(4, 6, 3).stride({2, 3}).padding({1, 0}).output_padding({1, 2}).groups(2),
        opts(2, 3, {2, 3}).dilation({2, 1}).padding(1).bias(false)};
    check_conv_module<nn::ConvTranspose2d, dt::ConvTranspose2d>(cases, {5, 6});
    dt::ConvTranspose2d ours(cases[0]);
    check_conv_module_mink(ours, tie_free({2, 4, 5, 6}, torch::kDouble, 4),
                           [](const auto& x, const auto& w, const auto& b) {
                             return torch::conv_transpose2d(x, w, b, {2, 3}, {1, 0}, {1, 2}, 2);
                           });
    check_conv_transpose_replacement<dt::ConvTranspose2dImpl, nn::ConvTranspose2d>(
        cases[1], torch::randn({2, 2, 5, 6}),
        "dropit::torch::ConvTranspose2d(2, 3, kernel_size=[2, 3]");
  }
  {
    using opts = nn::ConvTranspose3dOptions;
    const std::vector<opts> cases = {
        opts(4, 2, 3).stride({1, 2, 2}).padding({1, 0, 1}).output_padding({0, 1, 0}).groups(2),
        opts(2, 3, 2).dilation(2).bias(false)};
    check_conv_module<nn::ConvTranspose3d, dt::ConvTranspose3d>(cases, {3, 4, 5});
    dt::ConvTranspose3d ours(cases[0]);
    check_conv_module_mink(
        ours, tie_free({2, 4, 3, 4, 5}, torch::kDouble, 5),
        [](const auto& x, const auto& w, const auto& b) {
          return torch::conv_transpose3d(x, w, b, {1, 2, 2}, {1, 0, 1}, {0, 1, 0}, 2);
        });
  }
  // output_size picks the output padding: against LibTorch's module (no dilation: its C++
  // module leaves dilation out of the sizes) and, with dilation, against the functional op with
  // the output padding worked out by hand: (5 - 1) * 3 + 2 * (3 - 1) + 1 = 17, so 19 takes 2.
  const auto x = torch::randn({2, 2, 5});
  nn::ConvTranspose1d plain(nn::ConvTranspose1dOptions(2, 3, 3).stride(3).padding(1));
  dt::ConvTranspose1d ours(*plain, make_policy(dt::policy_kind::identity));
  for (const std::vector<std::int64_t>& size :
       {std::vector<std::int64_t>{13}, {14}, {15}, {2, 3, 15}}) {
    CAPTURE(size);
    auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    const auto ya = ours(xa, at::IntArrayRef(size)), yb = plain(xb, at::IntArrayRef(size));
    REQUIRE(ya.size(-1) == size.back());
    CHECK(torch::equal(ya, yb));
    ya.sum().backward();
    yb.sum().backward();
    CHECK(rel_diff(xa.grad(), xb.grad()) <= 1e-6);
  }
  for (const std::int64_t bad : {12, 16}) {
    CHECK_THROWS_WITH_AS((void)ours(x.clone().requires_grad_(true), at::IntArrayRef{bad}),
                         doctest::Contains("out of reach: valid sizes are 13 to 15"),
                         dropit::error);
  }
  dt::ConvTranspose1d dilated(nn::ConvTranspose1dOptions(2, 3, 3).stride(3).dilation(2),
                              make_policy(dt::policy_kind::identity));
  const auto y = dilated(x.clone().requires_grad_(true), at::IntArrayRef{19});
  CHECK(torch::equal(y, torch::conv_transpose1d(x, dilated->weight, dilated->bias, 3, 0, 2, 1, 2)));
}

/**
 * A dropit convolution function `ours(x, w, b, policy)` against LibTorch's `plain(x, w, b)` in
 * double: identity gives LibTorch's output and gradients, batched and unbatched (x[0]); without
 * grad mode the same output; MinK 0.9 the input and bias gradients of LibTorch and the weight
 * gradient of LibTorch's op on the top-k input.
 */
template <class Ours, class Plain>
void check_conv_function(const Ours& ours, const Plain& plain, const torch::Tensor& x,
                         const torch::Tensor& w, const torch::Tensor& b) {
  for (const bool batched : {true, false}) {
    CAPTURE(batched);
    const auto xin = batched ? x : x[0];
    auto xa = xin.clone().requires_grad_(true), xb = xin.clone().requires_grad_(true);
    auto wa = w.clone().requires_grad_(true), wb = w.clone().requires_grad_(true);
    auto ba = b.clone().requires_grad_(true), bb = b.clone().requires_grad_(true);
    const auto ya = ours(xa, wa, ba, make_policy(dt::policy_kind::identity));
    const auto yb = plain(xb, wb, bb);
    REQUIRE(ya.sizes() == yb.sizes());
    CHECK(rel_diff(ya, yb) <= 1e-12);
    torch::manual_seed(3);
    const auto r = torch::randn(yb.sizes(), yb.options());
    (ya * r).sum().backward();
    (yb * r).sum().backward();
    CHECK(rel_diff(xa.grad(), xb.grad()) <= 1e-12);
    CHECK(rel_diff(wa.grad(), wb.grad()) <= 1e-12);
    CHECK(rel_diff(ba.grad(), bb.grad()) <= 1e-12);
    {
      torch::NoGradGuard no_grad;
      CHECK(rel_diff(ours(xin, w, b, make_policy(dt::policy_kind::mink)), yb) <= 1e-12);
    }
  }
  auto xa = x.clone().requires_grad_(true), wa = w.clone().requires_grad_(true);
  auto ba = b.clone().requires_grad_(true);
  const auto y = ours(xa, wa, ba, make_policy(dt::policy_kind::mink, 0.9));
  const auto r = torch::randn(y.sizes(), y.options());
  (y * r).sum().backward();
  auto xb = x.clone().requires_grad_(true), ws = w.clone().requires_grad_(true);
  auto bb = b.clone().requires_grad_(true);
  (plain(xb, w, bb) * r).sum().backward();
  (plain(topk_sparsified(x, 0.9), ws, b) * r).sum().backward();
  CHECK(rel_diff(xa.grad(), xb.grad()) <= 1e-12);
  CHECK(rel_diff(ba.grad(), bb.grad()) <= 1e-12);
  CHECK(rel_diff(wa.grad(), ws.grad()) <= 1e-12);
}

TEST_CASE(
    "torch: conv1d, conv3d and conv_transpose<1/2/3> functions: LibTorch's ops (batched, "
    "unbatched, no grad); MinK's weight gradient from the top-k input") {
  torch::manual_seed(41);
  const auto opts = torch::kDouble;
  {
    dt::conv1d_params c;
    c.stride = {2};
    c.padding = {1};
    c.dilation = {2};
    c.groups = 2;
    check_conv_function([&](const auto& x, const auto& w, const auto& b,
                            const dt::policy& p) { return dt::conv1d(x, w, b, c, p); },
                        [](const auto& x, const auto& w, const auto& b) {
                          return torch::conv1d(x, w, b, 2, 1, 2, 2);
                        },
                        tie_free({2, 4, 13}, opts, 4), torch::randn({6, 2, 3}, opts),
                        torch::randn({6}, opts));
  }
  {
    dt::conv3d_params c;
    c.stride = {1, 2, 1};
    c.padding = {0, 1, 2};
    check_conv_function([&](const auto& x, const auto& w, const auto& b,
                            const dt::policy& p) { return dt::conv3d(x, w, b, c, p); },
                        [](const auto& x, const auto& w, const auto& b) {
                          return torch::conv3d(x, w, b, {1, 2, 1}, {0, 1, 2});
                        },
                        tie_free({2, 3, 4, 5, 6}, opts, 5), torch::randn({2, 3, 2, 3, 3}, opts),
                        torch::randn({2}, opts));
  }
  {
    dt::conv_transpose_params<1> c;
    c.stride = {3};
    c.padding = {1};
    c.output_padding = {2};
    c.dilation = {2};
    check_conv_function([&](const auto& x, const auto& w, const auto& b,
                            const dt::policy& p) { return dt::conv_transpose<1>(x, w, b, c, p); },
                        [](const auto& x, const auto& w, const auto& b) {
                          return torch::conv_transpose1d(x, w, b, 3, 1, 2, 1, 2);
                        },
                        tie_free({2, 4, 9}, opts, 4), torch::randn({4, 3, 3}, opts),
                        torch::randn({3}, opts));
  }
  {
    dt::conv_transpose_params<2> c;
    c.stride = {2, 1};
    c.output_padding = {1, 0};
    c.groups = 2;
    check_conv_function([&](const auto& x, const auto& w, const auto& b,
                            const dt::policy& p) { return dt::conv_transpose<2>(x, w, b, c, p); },
                        [](const auto& x, const auto& w, const auto& b) {
                          return torch::conv_transpose2d(x, w, b, {2, 1}, 0, {1, 0}, 2);
                        },
                        tie_free({2, 4, 5, 6}, opts, 4), torch::randn({4, 3, 3, 2}, opts),
                        torch::randn({6}, opts));
  }
  {
    dt::conv_transpose_params<3> c;
    c.padding = {1, 0, 0};
    check_conv_function([&](const auto& x, const auto& w, const auto& b,
                            const dt::policy& p) { return dt::conv_transpose<3>(x, w, b, c, p); },
                        [](const auto& x, const auto& w, const auto& b) {
                          return torch::conv_transpose3d(x, w, b, 1, {1, 0, 0});
                        },
                        tie_free({2, 2, 3, 4, 3}, opts, 5), torch::randn({2, 3, 3, 2, 2}, opts),
                        torch::randn({3}, opts));
  }
  CHECK_THROWS_WITH_AS(
      (void)dt::conv3d(torch::randn({3, 4, 5}).requires_grad_(true), torch::randn({2, 3, 2, 2, 2}),
                       torch::randn({2}), {}, make_policy(dt::policy_kind::mink)),
      doctest::Contains("torch::conv3d: input must be 4-d or 5-d, got 3-d"), dropit::error);
}

// ---- errors ----------------------------------------------------------------------------------

TEST_CASE("torch: bad input gives a dropit::error naming the problem") {
  CHECK_THROWS_WITH_AS((void)dt::policy::parse("topk"), doctest::Contains("unknown kind 'topk'"),
                       dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::policy::parse("mink", 1.5), doctest::Contains("got 1.5"),
                       dropit::error);
  CHECK_THROWS_AS(dt::Linear(4, 2, make_policy(dt::policy_kind::mink, -0.1)), dropit::error);
  // A dtype LibTorch's op supports but dropit does not pack.
  auto xz = torch::randn({3, 4}, torch::kComplexFloat);
  auto wz = torch::randn({2, 4}, torch::kComplexFloat).requires_grad_(true);
  CHECK_THROWS_WITH_AS(dt::linear(xz, wz, {}, make_policy(dt::policy_kind::mink)),
                       doctest::Contains("no dropit element type for dtype ComplexFloat"),
                       dropit::error);
  // A device without an executor (LibTorch's meta device stands in for CUDA here).
  auto xm = torch::empty({3, 4}, torch::TensorOptions().device(torch::kMeta));
  auto wm = torch::empty({2, 4}, torch::TensorOptions().device(torch::kMeta)).requires_grad_(true);
  CHECK_THROWS_WITH_AS(dt::linear(xm, wm, {}, make_policy(dt::policy_kind::mink)),
                       doctest::Contains("only the host executor"), dropit::error);
  CHECK_THROWS_WITH_AS(dt::max_pool2d(torch::randn({1, 1, 4, 4}, torch::requires_grad()),
                                      {.kernel = {2, 2}, .padding = {2, 0}}),
                       doctest::Contains("padding"), dropit::error);
  CHECK_THROWS_WITH_AS(dt::gpt2_conv1d(torch::randn({2, 5}), torch::randn({4, 3}), {}, {}),
                       doctest::Contains("nx = 4"), dropit::error);
  CHECK_THROWS_AS(dt::Conv1D(0, 3), dropit::error);
}

}  // namespace
