// Codec storage of the tensors DropIT leaves dense (torch/store.hpp, store_modules.hpp), against
// LibTorch: with the exact codec, outputs and gradients equal LibTorch's plain ops bit for bit;
// with int8 / e4m3, the gradients equal LibTorch's own backward kernels run on the saved tensor as
// codec_oracle.hpp encodes and decodes it; bytes held, module conversion and errors.
#include <dropit/torch/convert.hpp>
#include <dropit/torch/store_modules.hpp>

#include "codec_oracle.hpp"
#include "torch_test_support.hpp"
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace dropit_torch_test;
namespace dt = dropit::torch;

const torch_threads two_threads;

dt::policy store_policy(dropit::value_codec c) {
  return dt::store_options{c}.policy_for(true);
}

/// t as a codec stores it: row-major elements (t is made contiguous first), chunks of 1024,
/// encoded and decoded by the oracle.
torch::Tensor oracle_codec(const torch::Tensor& t, dropit::value_codec c) {
  const auto flat = t.detach().contiguous().to(torch::kFloat).reshape({-1});
  std::vector<float> v(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  const bool fp8 = c == dropit::value_codec::fp8_e4m3;
  const std::vector<float> back =
      dropit_test::oracle_decode<float>(dropit_test::oracle_encode(v, fp8), fp8);
  return torch::tensor(back).view(t.sizes()).to(t.scalar_type());
}

/// Every stored byte count: n one-byte codes, padded to the format's 16-byte section alignment,
/// and a float scale per 1024.
std::size_t coded_bytes(std::int64_t n) {
  return static_cast<std::size_t>((n + 15) / 16 * 16 + (n + 1023) / 1024 * 4);
}

const dropit::value_codec quantized_codecs[] = {dropit::value_codec::int8,
                                                dropit::value_codec::fp8_e4m3};

TEST_CASE("torch store: layer_norm keeps its input through the codec; exact gives LibTorch's") {
  for (const bool affine : {true, false}) {
    CAPTURE(affine);
    torch::manual_seed(1);
    const auto x0 = torch::randn({6, 9, 40}) * 3 + 1;
    const auto w0 = torch::randn({40}), b0 = torch::randn({40});
    const auto g = torch::randn({6, 9, 40});
    auto run = [&](const dt::policy& p, torch::Tensor& gx, torch::Tensor& gw, torch::Tensor& gb) {
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
           b = b0.clone().requires_grad_(true);
      auto y = dt::layer_norm(x, {40}, affine ? c10::optional<at::Tensor>(w) : c10::nullopt,
                              affine ? c10::optional<at::Tensor>(b) : c10::nullopt, 1e-5, p);
      y.backward(g);
      gx = x.grad();
      gw = w.grad();
      gb = b.grad();
      return y;
    };
    torch::Tensor gx0, gw0, gb0, gx, gw, gb;
    const auto y0 = run(dt::policy{}, gx0, gw0, gb0);  // LibTorch's op
    const auto y = run(store_policy(dropit::value_codec::exact), gx, gw, gb);
    CHECK(torch::equal(y, y0));
    CHECK(torch::equal(gx, gx0));
    if (affine) {
      CHECK(torch::equal(gw, gw0));
      CHECK(torch::equal(gb, gb0));
    }
    for (const auto c : quantized_codecs) {
      CAPTURE(c);
      const auto yq = run(store_policy(c), gx, gw, gb);
      CHECK(torch::equal(yq, y0));  // forward untouched
      auto [unused, mean, rstd] = at::native_layer_norm(x0, {40}, w0, b0, 1e-5);
      auto [ox, ow, ob] = at::native_layer_norm_backward(
          g, oracle_codec(x0, c), {40}, mean, rstd,
          affine ? c10::optional<at::Tensor>(w0) : c10::nullopt,
          affine ? c10::optional<at::Tensor>(b0) : c10::nullopt, {true, affine, affine});
      CHECK(torch::equal(gx, ox));
      if (affine) {
        CHECK(torch::equal(gw, ow));
        CHECK(torch::equal(gb, ob));
      }
    }
  }
}

TEST_CASE("torch store: batch_norm keeps its input through the codec; exact gives LibTorch's") {
  for (const bool running : {true, false}) {
    CAPTURE(running);
    torch::manual_seed(2);
    const auto x0 = torch::randn({6, 5, 7, 7}) * 3 + 1;
    const auto w0 = torch::randn({5}), b0 = torch::randn({5});
    const auto g = torch::randn({6, 5, 7, 7});
    struct result {
      torch::Tensor y, gx, gw, gb, mean, var;
    };
    auto run = [&](const dt::policy& p) {
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
           b = b0.clone().requires_grad_(true);
      result r{{}, {}, {}, {}, torch::zeros({5}), torch::ones({5})};
      auto opt = [&](const torch::Tensor& t) {
        return running ? c10::optional<at::Tensor>(t) : c10::nullopt;
      };
      r.y = dt::batch_norm(x, w, b, opt(r.mean), opt(r.var), true, 0.1, 1e-5, p);
      r.y.backward(g);
      r.gx = x.grad();
      r.gw = w.grad();
      r.gb = b.grad();
      return r;
    };
    const result plain = run(dt::policy{});  // LibTorch's op
    const result exact = run(store_policy(dropit::value_codec::exact));
    CHECK(torch::equal(exact.y, plain.y));
    CHECK(torch::equal(exact.gx, plain.gx));
    CHECK(torch::equal(exact.gw, plain.gw));
    CHECK(torch::equal(exact.gb, plain.gb));
    CHECK(torch::equal(exact.mean, plain.mean));  // running statistics updated alike
    CHECK(torch::equal(exact.var, plain.var));
    if (running) CHECK_FALSE(torch::equal(plain.mean, torch::zeros({5})));
    for (const auto c : quantized_codecs) {
      CAPTURE(c);
      const result q = run(store_policy(c));
      CHECK(torch::equal(q.y, plain.y));  // forward untouched
      auto [unused, mean, invstd] =
          at::native_batch_norm(x0, w0, b0, c10::nullopt, c10::nullopt, true, 0.1, 1e-5);
      auto [ox, ow, ob] =
          at::native_batch_norm_backward(g, oracle_codec(x0, c), w0, c10::nullopt, c10::nullopt,
                                         mean, invstd, true, 1e-5, {true, true, true});
      CHECK(torch::equal(q.gx, ox));
      CHECK(torch::equal(q.gw, ow));
      CHECK(torch::equal(q.gb, ob));
    }
  }
}

TEST_CASE("torch store: a BatchNorm2d module keeps LibTorch's statistics and gradients") {
  namespace nn = torch::nn;
  for (const bool momentum : {true, false}) {
    CAPTURE(momentum);
    auto make = [&] {
      torch::manual_seed(9);
      nn::BatchNormOptions bn(8);
      if (!momentum) bn.momentum(c10::nullopt);  // a cumulative average
      return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 8, 3)), nn::BatchNorm2d(bn), nn::ReLU(),
                            nn::Flatten(), nn::Linear(8 * 6 * 6, 4));
    };
    auto plain = make(), exact = make(), stored = make();
    dt::convert_options bn_only;
    bn_only.store = dt::store_options::parse("batchnorm", dropit::value_codec::exact);
    const auto report = dt::to_dropit(*exact, dt::policy{}, bn_only);
    CHECK(report.replaced == 1);
    REQUIRE(exact->ptr(1)->as<dt::BatchNorm2dImpl>() != nullptr);
    torch::manual_seed(10);
    for (int step = 0; step < 3; ++step) {
      const auto x = torch::randn({5, 3, 8, 8});
      for (auto* m : {&plain, &exact}) {
        (*m)->zero_grad();
        (*m)->forward(x).pow(2).sum().backward();
      }
      for (std::size_t i = 0; i < plain->parameters().size(); ++i)
        CHECK(torch::equal(exact->parameters()[i].grad(), plain->parameters()[i].grad()));
      for (std::size_t i = 0; i < plain->buffers().size(); ++i)
        CHECK(torch::equal(exact->buffers()[i], plain->buffers()[i]));
    }
    plain->eval();
    exact->eval();
    const auto xe = torch::randn({2, 3, 8, 8});
    CHECK(torch::equal(exact->forward(xe), plain->forward(xe)));  // the running statistics
    // int8: the input held as one byte per element and a scale per 1024
    bn_only.store.codec = dropit::value_codec::int8;
    (void)dt::to_dropit(*stored, dt::policy{}, bn_only);
    const auto before = dt::live_saved_bytes();
    const auto y = stored->forward(torch::randn({5, 3, 8, 8}));
    CHECK(dt::live_saved_bytes().sparse - before.sparse == coded_bytes(5 * 8 * 6 * 6));
    // clone: parameters and buffers copied, not shared
    auto* bn = stored->ptr(1)->as<dt::BatchNorm2dImpl>();
    auto copy = std::dynamic_pointer_cast<dt::BatchNorm2dImpl>(bn->clone());
    REQUIRE(copy);
    CHECK(torch::equal(copy->running_mean, bn->running_mean));
    CHECK_FALSE(copy->running_mean.is_same(bn->running_mean));
    CHECK(copy->num_batches_tracked.item<std::int64_t>() == 1);
    std::ostringstream text;
    text << *bn;
    CHECK(text.str() == "dropit::torch::BatchNorm2d(8, eps=1e-05, store=int8)");
    // a frozen BatchNorm stays frozen when replaced
    auto frozen = make();
    frozen->ptr(1)->as<nn::BatchNorm2dImpl>()->weight.requires_grad_(false);
    (void)dt::to_dropit(*frozen, dt::policy{}, bn_only);
    CHECK_FALSE(frozen->ptr(1)->as<dt::BatchNorm2dImpl>()->weight.requires_grad());
    CHECK(frozen->ptr(1)->as<dt::BatchNorm2dImpl>()->bias.requires_grad());
  }
}

TEST_CASE("torch store: BatchNorm1d and BatchNorm3d are replaced and match LibTorch's") {
  namespace nn = torch::nn;
  dt::convert_options bn_only;
  bn_only.store = dt::store_options::parse("batchnorm", dropit::value_codec::exact);
  // (input shape, the model): BatchNorm1d on [N, C] and [N, C, L], BatchNorm3d on [N, C, D, H, W]
  const auto bn1d = [] { return nn::Sequential(nn::Linear(6, 5), nn::BatchNorm1d(5), nn::Tanh()); };
  const auto bn1d_seq = [] {
    return nn::Sequential(nn::Conv1d(nn::Conv1dOptions(3, 5, 3)), nn::BatchNorm1d(5), nn::Tanh());
  };
  const auto bn3d = [] {
    return nn::Sequential(nn::Conv3d(nn::Conv3dOptions(3, 5, 3)), nn::BatchNorm3d(5), nn::Tanh());
  };
  struct model_case {
    std::vector<std::int64_t> shape;
    std::function<nn::Sequential()> make;
    const char* name;
  };
  for (const auto& [shape, make, name] :
       {model_case{{7, 6}, bn1d, "dropit::torch::BatchNorm1d(5, eps=1e-05, store=exact)"},
        model_case{{4, 3, 9}, bn1d_seq, "dropit::torch::BatchNorm1d(5, eps=1e-05, store=exact)"},
        model_case{
            {2, 3, 5, 6, 4}, bn3d, "dropit::torch::BatchNorm3d(5, eps=1e-05, store=exact)"}}) {
    CAPTURE(shape.size());
    torch::manual_seed(4);
    auto plain = make();
    torch::manual_seed(4);
    auto stored = make();
    CHECK(dt::to_dropit(*stored, dt::policy{}, bn_only).replaced == 1);
    std::ostringstream text;
    text << *stored->ptr(1);
    CHECK(text.str() == name);
    torch::manual_seed(5);
    for (int step = 0; step < 2; ++step) {
      const auto x = torch::randn(shape);
      for (auto* m : {&plain, &stored}) {
        (*m)->zero_grad();
        (*m)->forward(x).pow(2).sum().backward();
      }
      for (std::size_t i = 0; i < plain->parameters().size(); ++i)
        CHECK(torch::equal(stored->parameters()[i].grad(), plain->parameters()[i].grad()));
      for (std::size_t i = 0; i < plain->buffers().size(); ++i)
        CHECK(torch::equal(stored->buffers()[i], plain->buffers()[i]));
    }
    plain->eval();
    stored->eval();
    const auto xe = torch::randn(shape);
    CHECK(torch::equal(stored->forward(xe), plain->forward(xe)));
  }
  // the ranks LibTorch's modules refuse, refused with the expected ones named
  dt::BatchNorm1d one(5);
  dt::BatchNorm3d three(5);
  CHECK_THROWS_WITH_AS(one(torch::randn({2, 5, 3, 3})),
                       doctest::Contains("BatchNorm1d: expected a 2-d or 3-d input, got 4-d"),
                       dropit::error);
  CHECK_THROWS_WITH_AS(three(torch::randn({2, 5, 3, 3})),
                       doctest::Contains("BatchNorm3d: expected a 5-d input, got 4-d"),
                       dropit::error);
  CHECK_THROWS_AS(dt::BatchNorm2d(5)(torch::randn({2, 5, 3})), dropit::error);
}

TEST_CASE("torch store: the activations keep their saved tensor through the codec") {
  using K = dt::activation_kind;
  struct activation_case {
    K kind;
    dt::activation_params params;
    std::function<torch::Tensor(const torch::Tensor&)> libtorch;  // LibTorch's own op
  };
  const activation_case cases[] = {
      {K::silu, {}, [](const torch::Tensor& t) { return torch::silu(t); }},
      {K::mish, {}, [](const torch::Tensor& t) { return torch::mish(t); }},
      {K::hardswish, {}, [](const torch::Tensor& t) { return torch::hardswish(t); }},
      {K::hardsigmoid, {}, [](const torch::Tensor& t) { return torch::hardsigmoid(t); }},
      {K::elu, {.alpha = 0.7}, [](const torch::Tensor& t) { return torch::elu(t, 0.7); }},
      {K::celu, {.alpha = 1.6}, [](const torch::Tensor& t) { return torch::celu(t, 1.6); }},
      {K::softplus,
       {.beta = 2.0, .threshold = 3.0},
       [](const torch::Tensor& t) { return torch::softplus(t, 2.0, 3.0); }},
      {K::tanh, {}, [](const torch::Tensor& t) { return torch::tanh(t); }},
      {K::sigmoid, {}, [](const torch::Tensor& t) { return torch::sigmoid(t); }},
  };
  torch::manual_seed(12);
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    // 5 x 7 x 300: several codec blocks, values across every piece of each function (hardswish
    // and hardsigmoid bend at -3 and 3, softplus(beta 2) turns linear past 1.5)
    const auto x0 = (torch::randn({5, 7, 300}) * 3).to(dtype);
    const auto g = torch::randn({5, 7, 300}).to(dtype);
    for (const auto& [kind, params, libtorch] : cases) {
      const std::string name = dt::to_string(kind);
      CAPTURE(name);
      CAPTURE(dtype);
      auto xr = x0.clone().requires_grad_(true);
      const auto yr = libtorch(xr);
      yr.backward(g);
      auto x = x0.clone().requires_grad_(true);
      const auto y = dt::activation(x, kind, store_policy(dropit::value_codec::exact), params);
      y.backward(g);
      CHECK(torch::equal(y, yr));
      CHECK(torch::equal(x.grad(), xr.grad()));
      const bool output_saved = kind == K::tanh || kind == K::sigmoid;
      for (const auto c : quantized_codecs) {
        CAPTURE(c);
        auto xq = x0.clone().requires_grad_(true);
        const auto before = dt::live_saved_bytes();
        auto yq = dt::activation(xq, kind, store_policy(c), params);
        CHECK(dt::live_saved_bytes().sparse - before.sparse == coded_bytes(x0.numel()));
        CHECK(torch::equal(yq, yr));  // forward untouched
        yq.backward(g);
        // the oracle: LibTorch's gradient at the decoded input, or its backward op on the
        // decoded output
        torch::Tensor want;
        if (output_saved) {
          const auto yd = oracle_codec(yr.detach(), c);
          want = kind == K::tanh ? at::tanh_backward(g, yd) : at::sigmoid_backward(g, yd);
        } else {
          auto xd = oracle_codec(x0, c).requires_grad_(true);
          libtorch(xd).backward(g);
          want = xd.grad();
        }
        CHECK(torch::equal(xq.grad(), want));
      }
    }
  }
  // In place (ELU, CELU): the output saved, LibTorch's in-place gradient (from the output)
  for (const auto kind : {K::elu, K::celu}) {
    const std::string name = dt::to_string(kind);
    CAPTURE(name);
    const auto x0 = torch::randn({4, 1000}) * 3;
    const auto g = torch::randn({4, 1000});
    const auto libtorch = [&](torch::Tensor& h) {
      return kind == K::elu ? torch::elu_(h, 0.7) : torch::celu_(h, 0.7);
    };
    auto xr = x0.clone().requires_grad_(true);
    auto hr = xr * 1.0;
    const auto yr = libtorch(hr);
    yr.backward(g);
    for (const auto c : {dropit::value_codec::exact, dropit::value_codec::int8}) {
      CAPTURE(c);
      auto x = x0.clone().requires_grad_(true);
      auto h = x * 1.0;
      const void* storage = h.data_ptr();
      const auto y = dt::activation_(h, kind, store_policy(c), {.alpha = 0.7});
      CHECK(y.data_ptr() == storage);
      CHECK(torch::equal(y, yr));
      y.backward(g);
      if (c == dropit::value_codec::exact) {
        CHECK(torch::equal(x.grad(), xr.grad()));
      } else {  // LibTorch's in-place backward on the decoded output
        const double scale = kind == K::elu ? 1.0 : 1.0 / static_cast<double>(0.7f);
        CHECK(torch::equal(
            x.grad(), at::elu_backward(g, 0.7, 1.0, scale, true, oracle_codec(yr.detach(), c))));
      }
    }
  }
  // no policy, grad mode off or no gradient wanted: LibTorch's op, nothing saved
  const auto before = dt::live_saved_bytes().sparse;
  const auto x = torch::randn({64});
  CHECK(torch::equal(dt::activation(x, K::mish, store_policy(dropit::value_codec::int8)),
                     torch::mish(x)));
  CHECK(dt::live_saved_bytes().sparse == before);
  // a mink policy, double backward and an unknown kind are refused
  CHECK_THROWS_WITH_AS((void)dt::activation(x, K::silu, make_policy(dt::policy_kind::mink)),
                       doctest::Contains("silu: a stored tensor is read whole"), dropit::error);
  const auto xg = torch::randn({64}, torch::requires_grad());
  const auto yg = dt::activation(xg, K::elu, store_policy(dropit::value_codec::exact));
  CHECK_THROWS_WITH_AS((void)torch::autograd::grad({yg.sum()}, {xg}, {}, true, true),
                       doctest::Contains("elu"), std::exception);
  CHECK_THROWS_WITH_AS((void)dt::activation(x, static_cast<K>(42), dt::policy{}),
                       doctest::Contains("unknown kind 42"), dropit::error);
  auto h = torch::randn({64}, torch::requires_grad()) * 1.0;
  CHECK_THROWS_WITH_AS((void)dt::activation_(h, K::silu, dt::policy{}),
                       doctest::Contains("in place only for elu and celu, got silu"),
                       dropit::error);
  CHECK_THROWS_WITH_AS(
      (void)dt::activation_(h, K::elu, store_policy(dropit::value_codec::int8), {.alpha = -1.0}),
      doctest::Contains("in place needs alpha >= 0"), dropit::error);
  // The views LibTorch's elu_ refuses (an output of chunk, a view made in no_grad mode).
  check_refuses_forbidden_views(
      [](torch::Tensor& t) {
        return dt::activation_(t, K::elu, store_policy(dropit::value_codec::int8), {.alpha = 0.7});
      },
      [](torch::Tensor& t) { return torch::elu_(t, 0.7); });
}

TEST_CASE("torch store: to_dropit replaces the activation modules; exact gives LibTorch's") {
  namespace nn = torch::nn;
  const auto make = [] {
    torch::manual_seed(13);
    return nn::Sequential(
        nn::Linear(8, 8), nn::SiLU(), nn::Linear(8, 8), nn::Mish(), nn::Linear(8, 8),
        nn::ELU(nn::ELUOptions().alpha(0.5).inplace(true)), nn::Linear(8, 8),
        nn::CELU(nn::CELUOptions().alpha(2.0)), nn::Linear(8, 8),
        nn::Softplus(nn::SoftplusOptions().beta(3.0).threshold(2.0)), nn::Linear(8, 8), nn::Tanh(),
        nn::Linear(8, 8), nn::Sigmoid(), nn::Linear(8, 2));
  };
  auto plain = make(), exact = make(), coded = make();
  dt::convert_options act;
  act.store = dt::store_options::parse("activation", dropit::value_codec::exact);
  const auto report = dt::to_dropit(*exact, dt::policy{}, act);
  CHECK(report.replaced == 7);
  CHECK(report.stored == 7);
  const char* printed[] = {"SiLU(",
                           "Mish(",
                           "ELU(alpha=0.5, inplace=true, ",
                           "CELU(alpha=2, ",
                           "Softplus(beta=3, threshold=2, ",
                           "Tanh(",
                           "Sigmoid("};
  for (std::size_t i = 0; i < 7; ++i) {
    std::ostringstream text;
    text << *exact->ptr(2 * i + 1);
    CHECK(text.str() == std::string("dropit::torch::") + printed[i] + "store=exact)");
  }
  const auto x = torch::randn({16, 8}) * 2;
  for (auto* m : {&plain, &exact})
    (*m)->forward(x).pow(2).sum().backward();
  for (std::size_t i = 0; i < plain->parameters().size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(exact->parameters()[i].grad(), plain->parameters()[i].grad()));
  }
  // int8: each of the 7 saved tensors of 16 x 8 as codes and one scale
  act.store.codec = dropit::value_codec::int8;
  (void)dt::to_dropit(*coded, dt::policy{}, act);
  const auto before = dt::live_saved_bytes().sparse;
  const auto y = coded->forward(x);
  CHECK(dt::live_saved_bytes().sparse - before == 7 * coded_bytes(16 * 8));
  // eval mode: LibTorch's ops (an in-place ELU in place again); clone keeps the options
  coded->eval();
  plain->eval();
  CHECK(torch::equal(coded->forward(x), plain->forward(x)));
  CHECK(dt::live_saved_bytes().sparse - before == 7 * coded_bytes(16 * 8));
  auto copy = std::dynamic_pointer_cast<dt::SoftplusImpl>(coded->ptr(9)->clone());
  REQUIRE(copy);
  CHECK(copy->options.beta() == 3.0);
  CHECK(copy->get_store().activation);
  CHECK_FALSE(copy->is_training());
}

TEST_CASE("torch store: gelu and softmax keep their saved tensor through the codec") {
  torch::manual_seed(2);
  const auto x0 = torch::randn({5, 7, 300}) * 2;
  const auto g = torch::randn({5, 7, 300});
  for (const std::string approximate : {"none", "tanh"}) {
    auto x = x0.clone().requires_grad_(true);
    auto y = dt::gelu(x, store_policy(dropit::value_codec::exact), approximate);
    y.backward(g);
    auto xr = x0.clone().requires_grad_(true);
    auto yr = at::gelu(xr, approximate);
    yr.backward(g);
    CHECK(torch::equal(y, yr));
    CHECK(torch::equal(x.grad(), xr.grad()));
    for (const auto c : quantized_codecs) {
      auto xq = x0.clone().requires_grad_(true);
      dt::gelu(xq, store_policy(c), approximate).backward(g);
      CHECK(torch::equal(xq.grad(), at::gelu_backward(g, oracle_codec(x0, c), approximate)));
    }
  }
  for (const std::int64_t dim : {-1, 1, 0}) {
    CAPTURE(dim);
    auto x = x0.clone().requires_grad_(true);
    auto y = dt::softmax(x, dim, store_policy(dropit::value_codec::exact));
    y.backward(g);
    auto xr = x0.clone().requires_grad_(true);
    auto yr = torch::softmax(xr, dim);
    yr.backward(g);
    CHECK(torch::equal(y, yr));
    CHECK(torch::equal(x.grad(), xr.grad()));
    for (const auto c : quantized_codecs) {
      auto xq = x0.clone().requires_grad_(true);
      dt::softmax(xq, dim, store_policy(c)).backward(g);
      const auto want = at::_softmax_backward_data(g, oracle_codec(yr.detach(), c),
                                                   dim < 0 ? dim + 3 : dim, torch::kFloat);
      CHECK(torch::equal(xq.grad(), want));
    }
  }
}

/// q, k, v as the examples' attention makes them: views of one qkv projection.
struct qkv_views {
  torch::Tensor qkv, q, k, v;
  explicit qkv_views(const torch::Tensor& base) : qkv(base.clone().requires_grad_(true)) {
    const auto parts = qkv.view({3, 16, 3, 4, 8}).permute({2, 0, 3, 1, 4});
    q = parts[0] * (1.0 / std::sqrt(8.0));
    k = parts[1];
    v = parts[2];
  }
};

/// Runs dt::attention on the qkv views of base through each quantized codec, for each class alone
/// and both, and checks the output against yr, the bytes kept, and the gradients of qkv and of the
/// mask against LibTorch's backward formulas (BmmBackward0, MulBackward0 of the dropout's noise,
/// SoftmaxBackward0, MaskedFillBackward0, AddBackward0) on the tensors as the oracle codec stores
/// them. mask0 and masked may be undefined; p = 0: no dropout (its noise drawn after seed 8).
void check_attention_codecs(const torch::Tensor& base, const torch::Tensor& g,
                            const torch::Tensor& yr, const torch::Tensor& mask0,
                            const torch::Tensor& masked, double p) {
  const qkv_views r(base);
  const auto q3 = r.q.detach().reshape({-1, 16, 8});
  const auto kt3 = r.k.detach().transpose(-2, -1).reshape({-1, 8, 16});
  const auto v3 = r.v.detach().reshape({-1, 16, 8});
  auto scores = torch::bmm(q3, kt3).view({3, 4, 16, 16});
  if (mask0.defined()) scores = scores + mask0;
  if (masked.defined())
    scores = scores.masked_fill(masked, -std::numeric_limits<float>::infinity());
  const auto att = torch::softmax(scores, -1).reshape({-1, 16, 16});
  torch::manual_seed(8);  // LibTorch's CPU dropout: bernoulli(1 - p) / (1 - p)
  const auto noise = p > 0 ? torch::empty_like(att).bernoulli_(1 - p).div_(1 - p) : torch::Tensor();
  auto drop = [&](const torch::Tensor& t) { return p > 0 ? t * noise : t; };
  const auto g3 = g.reshape({-1, 16, 8});
  for (const auto c : quantized_codecs) {
    for (const bool soft : {true, false}) {
      for (const bool mat : {true, false}) {
        if (!soft && !mat) continue;
        CAPTURE(c);
        CAPTURE(soft);
        CAPTURE(mat);
        auto dec = [&](const torch::Tensor& t, bool on) { return on ? oracle_codec(t, c) : t; };
        const auto a_ = dec(att, soft), q_ = dec(q3, mat), k_ = dec(kt3, mat), v_ = dec(v3, mat);
        const auto gv = drop(a_).transpose(1, 2).bmm(g3);
        auto gs =
            at::_softmax_backward_data(drop(g3.bmm(v_.transpose(1, 2))), a_, -1, torch::kFloat)
                .view({3, 4, 16, 16});
        if (masked.defined()) gs = gs.masked_fill(masked, 0);
        const auto gmask = gs.sum(std::vector<std::int64_t>{0, 1});
        gs = gs.view({-1, 16, 16});
        const auto gq = gs.bmm(k_.transpose(1, 2)) * (1.0 / std::sqrt(8.0));
        const auto gk = q_.transpose(1, 2).bmm(gs).view({3, 4, 8, 16}).transpose(-2, -1);
        // qkv's gradient from the three parts, as the views lay them out.
        const auto want = torch::stack({gq.view({3, 4, 16, 8}), gk, gv.view({3, 4, 16, 8})})
                              .permute({1, 3, 0, 2, 4})
                              .reshape({3, 16, 96});
        qkv_views a(base);
        const auto m = mask0.defined() ? mask0.clone().requires_grad_(true) : torch::Tensor();
        const auto before = dt::live_saved_bytes();
        torch::manual_seed(8);
        const auto y = dt::attention(a.q, a.k, a.v, soft ? store_policy(c) : dt::policy{},
                                     mat ? store_policy(c) : dt::policy{}, {m, masked, p, true});
        CHECK(torch::equal(y, yr));
        const auto after = dt::live_saved_bytes();
        CHECK(after.sparse - before.sparse ==
              (soft ? coded_bytes(att.numel()) : 0) + (mat ? 3 * coded_bytes(q3.numel()) : 0));
        CHECK(after.masks - before.masks ==
              (p > 0 ? static_cast<std::size_t>((att.numel() + 31) / 32 * 4) : 0));
        y.backward(g);
        CHECK(rel_diff(a.qkv.grad(), want) < 1e-6);
        if (m.defined()) CHECK(rel_diff(m.grad(), gmask) < 1e-6);
      }
    }
  }
}

TEST_CASE("torch store: attention is at::matmul's, with q, k, v and the softmax through codecs") {
  torch::manual_seed(3);
  const auto base = torch::randn({3, 16, 96});
  const auto g = torch::randn({3, 4, 16, 8});
  qkv_views r(base);
  const auto yr = torch::matmul(torch::softmax(torch::matmul(r.q, r.k.transpose(-2, -1)), -1), r.v);
  yr.backward(g);
  const auto exact = store_policy(dropit::value_codec::exact);
  for (const auto& [ps, pm] :
       {std::pair{exact, exact}, std::pair{exact, dt::policy{}}, std::pair{dt::policy{}, exact}}) {
    qkv_views a(base);
    const auto y = dt::attention(a.q, a.k, a.v, ps, pm);
    y.backward(g);
    CHECK(torch::equal(y, yr));
    CHECK(torch::equal(a.qkv.grad(), r.qkv.grad()));
  }
  // int8 / e4m3, each class alone and both: LibTorch's formulas on the decoded tensors.
  check_attention_codecs(base, g, yr, {}, {}, 0);
}

TEST_CASE("torch store: attention with masks and dropout is LibTorch's, through codecs too") {
  torch::manual_seed(6);
  const auto base = torch::randn({3, 16, 96});
  const auto g = torch::randn({3, 4, 16, 8});
  const auto mask0 = torch::randn({16, 16});                // additive, over (t, s)
  auto masked = torch::zeros({3, 1, 1, 16}, torch::kBool);  // key padding, per sample
  masked.index_put_({1, 0, 0, 5}, true);
  masked.index_put_({2, 0, 0, 0}, true);
  masked.index_put_({2, 0, 0, 15}, true);
  const double p = 0.3, inf = std::numeric_limits<double>::infinity();
  // LibTorch's ops; the dropout's noise drawn after seed 8.
  qkv_views r(base);
  const auto mr = mask0.clone().requires_grad_(true);
  torch::manual_seed(8);
  const auto scores_r = (torch::matmul(r.q, r.k.transpose(-2, -1)) + mr).masked_fill(masked, -inf);
  const auto yr = torch::matmul(torch::dropout(torch::softmax(scores_r, -1), p, true), r.v);
  yr.backward(g);
  const auto exact = store_policy(dropit::value_codec::exact);
  for (const bool bits : {false, true}) {
    for (const auto& [ps, pm] :
         {std::pair{exact, exact}, std::pair{exact, dt::policy{}}, std::pair{dt::policy{}, exact},
          std::pair{dt::policy{}, dt::policy{}}}) {
      CAPTURE(bits);
      CAPTURE(ps.active());
      CAPTURE(pm.active());
      qkv_views a(base);
      const auto m = mask0.clone().requires_grad_(true);
      torch::manual_seed(8);
      const auto y = dt::attention(a.q, a.k, a.v, ps, pm, {m, masked, p, bits});
      y.backward(g);
      CHECK(torch::equal(y, yr));
      CHECK(torch::equal(a.qkv.grad(), r.qkv.grad()));
      CHECK(torch::equal(m.grad(), mr.grad()));
    }
  }
  // The module: the same in training (noise as bits with the dropout class: 4 bytes per 32
  // weights, released after backward), no dropout and nothing saved in eval.
  for (const char* classes : {"softmax,matmul,dropout", "softmax,matmul", ""}) {
    CAPTURE(classes);
    dt::SoftmaxAttention module(p, dt::store_options::parse(classes, dropit::value_codec::exact));
    qkv_views a(base);
    const auto m = mask0.clone().requires_grad_(true);
    const auto before = dt::live_saved_bytes();
    torch::manual_seed(8);
    const auto y = module->forward(a.q, a.k, a.v, m, masked);
    const std::size_t noise_bytes = (3 * 4 * 16 * 16 + 31) / 32 * 4;  // the weights' noise
    CHECK(dt::live_saved_bytes().masks - before.masks ==
          (module->get_store().dropout ? noise_bytes : 0));
    y.backward(g);
    CHECK(dt::live_saved_bytes().total() == before.total());
    CHECK(torch::equal(y, yr));
    CHECK(torch::equal(a.qkv.grad(), r.qkv.grad()));
    CHECK(torch::equal(m.grad(), mr.grad()));
    module->eval();
    torch::NoGradGuard no_grad;
    const auto ye = module->forward(a.q, a.k, a.v, mask0, masked);
    CHECK(dt::live_saved_bytes().total() == before.total());
    CHECK(torch::equal(ye, torch::matmul(torch::softmax(scores_r.detach(), -1), r.v.detach())));
  }
  std::ostringstream printed;
  printed << *dt::SoftmaxAttention(0.25, dt::store_options::parse("softmax,dropout"));
  CHECK(printed.str() ==
        "dropit::torch::SoftmaxAttention(dropout=0.25, softmax store=int8, matmul store=off, "
        "dropout store=bits)");
  CHECK_THROWS_AS((void)dt::SoftmaxAttention(1.5), dropit::error);
  // int8 / e4m3, each class alone and both: LibTorch's formulas on the decoded tensors.
  check_attention_codecs(base, g, yr, mask0, masked, p);
}

TEST_CASE("torch store: MultiheadAttention keeps its attention through the codec") {
  namespace nn = torch::nn;
  // Self-attention with dropout and policy none: only the attention's own tensors are stored.
  torch::manual_seed(12);
  nn::MultiheadAttention plain(nn::MultiheadAttentionOptions(8, 2).dropout(0.3));
  const auto x0 = torch::randn({5, 3, 8});
  const auto g = torch::randn({5, 3, 8});
  struct result {
    torch::Tensor out, gx;
    dt::saved_bytes saved;
  };
  auto run = [&](auto& module) {
    const auto x = x0.clone().requires_grad_(true);
    torch::manual_seed(13);  // the same dropout draws in every run
    const auto before = dt::live_saved_bytes();
    const auto out = std::get<0>(module.forward(x, x, x, {}, false));
    const auto after = dt::live_saved_bytes();
    out.backward(g);
    return result{
        out.detach(), x.grad(), {after.sparse - before.sparse, after.masks - before.masks}};
  };
  const result want = run(*plain);
  for (const auto c : {dropit::value_codec::exact, dropit::value_codec::int8}) {
    CAPTURE(c);
    nn::ModuleList list(plain->clone());
    dt::convert_options o;
    o.store = dt::store_options::parse("softmax,matmul,dropout", c);
    const auto report = dt::to_dropit(*list, dt::policy{}, o);
    CHECK(report.replaced == 1);
    auto* m = list[0]->as<dt::MultiheadAttentionImpl>();
    REQUIRE(m != nullptr);
    std::ostringstream printed;
    m->pretty_print(printed);
    const std::string codec = dt::to_string(c);
    CHECK(printed.str() ==
          "dropit::torch::MultiheadAttention(embed_dim=8, num_heads=2, "
          "policy=none, softmax store=" +
              codec + ", matmul store=" + codec + ", dropout store=bits)");
    const result got = run(*m);
    CHECK(rel_diff(got.out, want.out) < 1e-6);  // forward does not depend on the codec
    // Softmax output [N heads, L, S] and q, k, v [N heads, L or S, 4] coded; the noise as bits.
    const std::int64_t att = 3 * 2 * 5 * 5, qkv = 3 * 2 * 5 * 4;
    CHECK(got.saved.sparse == (c == dropit::value_codec::exact
                                   ? static_cast<std::size_t>(4 * (att + 3 * qkv))  // a copy
                                   : coded_bytes(att) + 3 * coded_bytes(qkv)));
    CHECK(got.saved.masks == static_cast<std::size_t>((att + 31) / 32 * 4));
    if (c == dropit::value_codec::exact) {
      CHECK(rel_diff(got.gx, want.gx) < 1e-6);
    } else {
      // The exact formulas on decoded tensors are checked on dt::attention above; here the
      // gradient is near LibTorch's and not equal to it.
      CHECK(rel_diff(got.gx, want.gx) < 0.05);
      CHECK(rel_diff(got.gx, want.gx) > 1e-5);
    }
    // Eval: LibTorch's module, nothing saved.
    m->eval();
    const auto before = dt::live_saved_bytes();
    const auto x = x0.clone().requires_grad_(true);
    const auto out = std::get<0>(m->forward(x, x, x));
    CHECK(dt::live_saved_bytes().sparse == before.sparse);
    CHECK(dt::live_saved_bytes().masks == before.masks);
  }
}

TEST_CASE("torch store: dropout saves 1 bit per element and gives LibTorch's draws and gradient") {
  for (const double p : {0.1, 0.5}) {
    CAPTURE(p);
    const auto x0 = torch::randn({7, 33, 9});
    const auto g = torch::randn({7, 33, 9});
    torch::manual_seed(4);
    auto xr = x0.clone().requires_grad_(true);
    const auto yr = torch::dropout(xr, p, true);
    yr.backward(g);
    torch::manual_seed(4);
    auto x = x0.clone().requires_grad_(true);
    const auto before = dt::live_saved_bytes().masks;
    const auto y = dt::dropout(x, p, true, true);
    CHECK(dt::live_saved_bytes().masks - before ==
          static_cast<std::size_t>((x0.numel() + 31) / 32 * 4));
    CHECK(torch::equal(y, yr));
    y.backward(g);
    CHECK(torch::equal(x.grad(), xr.grad()));
  }
  const auto x = torch::randn({4, 4}, torch::requires_grad());
  CHECK(torch::equal(dt::dropout(x, 0.5, false, true), x));  // eval: identity
  CHECK_THROWS_WITH_AS((void)dt::dropout(x, 1.5, true, true), doctest::Contains("p must be in"),
                       dropit::error);
}

TEST_CASE("torch store: modules and to_dropit switch each class separately") {
  namespace nn = torch::nn;
  torch::manual_seed(5);
  auto make = [] {
    torch::manual_seed(6);
    return nn::Sequential(nn::Linear(32, 64), nn::GELU(), nn::Dropout(0.2),
                          nn::LayerNorm(nn::LayerNormOptions({64})), nn::Linear(64, 10),
                          nn::Softmax(-1));
  };
  const auto x = torch::randn({12, 32});
  auto plain = make(), exact = make(), stored = make();
  dt::convert_options all;
  all.store = dt::store_options::all(dropit::value_codec::exact);
  const auto report = dt::to_dropit(*exact, dt::policy{}, all);
  CHECK(report.replaced == 4);
  CHECK(report.stored == 4);
  CHECK(exact->ptr(1)->as<dt::GELUImpl>() != nullptr);
  CHECK(exact->ptr(3)->as<dt::LayerNormImpl>() != nullptr);
  CHECK(exact->ptr(3)->as<dt::LayerNormImpl>()->weight.is_same(
            plain->ptr(3)->as<nn::LayerNormImpl>()->weight) == false);  // another model's parameter
  // With the exact codec the gradients are LibTorch's, dropout draws included.
  torch::manual_seed(7);
  plain->forward(x).pow(2).sum().backward();
  torch::manual_seed(7);
  exact->forward(x).pow(2).sum().backward();
  for (std::size_t i = 0; i < plain->parameters().size(); ++i)
    CHECK(torch::equal(exact->parameters()[i].grad(), plain->parameters()[i].grad()));

  // One class: only LayerNorm is replaced; an excluded path is left standard.
  dt::convert_options ln;
  ln.store = dt::store_options::parse("layernorm");
  ln.exclude = [](const std::string& path, const nn::Module&) { return path == "1"; };
  const auto r2 = dt::to_dropit(*stored, dt::policy{}, ln);
  CHECK(r2.replaced == 1);
  CHECK(stored->ptr(1)->as<dt::GELUImpl>() == nullptr);
  CHECK(stored->ptr(2)->as<dt::DropoutImpl>() == nullptr);
  const auto before = dt::live_saved_bytes();
  const auto y = stored->forward(x);
  CHECK(dt::live_saved_bytes().sparse - before.sparse == coded_bytes(12 * 64));
  CHECK(dt::live_saved_bytes().masks == before.masks);
  stored->eval();
  const auto ye = stored->forward(x);  // eval: nothing packed
  CHECK(dt::live_saved_bytes().sparse - before.sparse == coded_bytes(12 * 64));

  std::ostringstream text;
  text << *stored;
  CHECK(text.str().find("dropit::torch::LayerNorm(normalized_shape=[64], eps=1e-05, store=int8)") !=
        std::string::npos);
  // A module made directly, cloned.
  dt::SoftmaxAttention sa(
      dt::store_options::parse("softmax,matmul", dropit::value_codec::fp8_e4m3));
  auto copy = std::dynamic_pointer_cast<dt::SoftmaxAttentionImpl>(sa->clone());
  REQUIRE(copy);
  CHECK(copy->get_store().matmul);
  CHECK(dt::to_string(copy->get_store()) == "softmax,matmul");
}

TEST_CASE("torch store: double backward (create_graph) is a dropit::error, not a partial one") {
  // The saved tensors come back without autograd history: a second derivative built from them
  // would lack their part. Each op refuses create_graph; a plain backward still works.
  torch::manual_seed(8);
  const auto x0 = torch::randn({2, 16, 32});
  const auto exact = store_policy(dropit::value_codec::exact);
  const std::vector<std::pair<std::string, std::function<torch::Tensor(const torch::Tensor&)>>> ops{
      {"layer_norm",
       [&](const torch::Tensor& x) {
         return dt::layer_norm(x, {32}, c10::nullopt, c10::nullopt, 1e-5, exact);
       }},
      {"gelu", [&](const torch::Tensor& x) { return dt::gelu(x, exact); }},
      {"softmax", [&](const torch::Tensor& x) { return dt::softmax(x, -1, exact); }},
      {"attention", [&](const torch::Tensor& x) {
         const auto q = x.view({2, 2, 8, 32});
         return dt::attention(q, q, q, exact, exact);
       }}};
  for (const auto& [name, op] : ops) {
    CAPTURE(name);
    const auto x = x0.clone().requires_grad_(true);
    const auto y = op(x * 1.0);
    const std::string refusal = name + ": double backward (create_graph) is not supported";
    CHECK_THROWS_WITH_AS((void)torch::autograd::grad({(y * y).sum()}, {x}, {}, true, true),
                         doctest::Contains(refusal.c_str()), std::exception);
    CHECK(torch::autograd::grad({(y * y).sum()}, {x})[0].defined());
  }
}

TEST_CASE("torch store: bad input is a dropit::error") {
  const auto x = torch::randn({4, 8}, torch::requires_grad());
  CHECK_THROWS_WITH_AS((void)dt::layer_norm(x, {8}, c10::nullopt, c10::nullopt, 1e-5,
                                            make_policy(dt::policy_kind::mink)),
                       doctest::Contains("identity policy with a codec"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::attention(torch::randn({2, 3, 4}), torch::randn({2, 5, 4}),
                                           torch::randn({2, 6, 4}), dt::policy{}, dt::policy{}),
                       doctest::Contains("shapes do not match"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::store_options::parse("layernorm,attention"),
                       doctest::Contains("unknown class 'attention'"), dropit::error);
  CHECK(dt::to_string(dt::store_options::parse("all")) ==
        "layernorm,gelu,softmax,matmul,dropout,batchnorm,activation");
  CHECK(dt::store_options::parse("activation").activation);
  CHECK(dt::store_options::parse("activation").any());
  CHECK_THROWS_WITH_AS(
      (void)dt::batch_norm(x, c10::nullopt, c10::nullopt, c10::nullopt, c10::nullopt, true, 0.1,
                           1e-5, make_policy(dt::policy_kind::mink)),
      doctest::Contains("identity policy with a codec"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::batch_norm(torch::randn({8}, torch::requires_grad()), c10::nullopt,
                                            c10::nullopt, c10::nullopt, c10::nullopt, true, 0.1,
                                            1e-5, store_policy(dropit::value_codec::int8)),
                       doctest::Contains("input must be [N, C, ...]"), dropit::error);
  CHECK_FALSE(dt::store_options::parse("").any());
}

}  // namespace
