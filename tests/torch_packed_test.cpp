// The saved-tensor packs (torch/packed.hpp) against LibTorch: sparse packs against DropIT's topk
// reference, ReLU masks against the sign pattern LibTorch's backward reads, pooling codes against
// LibTorch's own indices; layouts, byte counts and errors.
#include <dropit/torch/packed.hpp>

#include "torch_test_support.hpp"
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using namespace dropit_torch_test;
namespace dt = dropit::torch;

const torch_threads two_threads;

TEST_CASE("torch packed_tensor: restores DropIT's topk selection, shape and dtype") {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (double gamma : {0.0, 0.5, 0.9, 0.99, 1.0}) {
      CAPTURE(dtype);
      CAPTURE(gamma);
      const auto x = tie_free({6, 5, 40, 33}, dtype);
      const auto p = dt::packed_tensor::pack(x, make_policy(dt::policy_kind::mink, gamma));
      const auto r = p.restore();
      CHECK(r.sizes() == x.sizes());
      CHECK((r.scalar_type() == dtype));
      CHECK(torch::equal(r, topk_sparsified(x, gamma)));
      CHECK(p.numel() == static_cast<std::size_t>(x.numel()));
      CHECK(p.kept() == static_cast<std::size_t>(r.ne(0).sum().item<std::int64_t>()));
    }
  }
}

TEST_CASE("torch packed_tensor: a dense permutation keeps its strides, a view is copied") {
  const auto x = tie_free({4, 6, 9, 9}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto p = dt::packed_tensor::pack_saved(x, make_policy(dt::policy_kind::mink, 0.8));
  const auto r = p.restore();
  CHECK(r.strides() == x.strides());
  // Selected in memory order: the NHWC tensor's own.
  const auto nhwc = x.permute({0, 2, 3, 1});
  CHECK(torch::equal(r.permute({0, 2, 3, 1}), topk_sparsified(nhwc.contiguous(), 0.8)));

  const auto view = tie_free({20, 30}).t();  // not dense in row-major order
  CHECK_THROWS_WITH_AS((void)dt::packed_tensor::pack(view, make_policy(dt::policy_kind::mink)),
                       doctest::Contains("must be contiguous"), dropit::error);
  const auto q = dt::packed_tensor::pack_saved(view, make_policy(dt::policy_kind::mink, 0.5));
  CHECK(torch::equal(q.restore(), topk_sparsified(view.contiguous(), 0.5)));
}

TEST_CASE("torch packed_tensor: payload bytes are counted while the pack lives") {
  const auto before = dt::live_saved_bytes();
  std::size_t bytes = 0;
  {
    const auto p = dt::packed_tensor::pack(tie_free({1 << 16}), make_policy(dt::policy_kind::mink));
    bytes = p.bytes();
    CHECK(bytes > 0);
    CHECK(dt::live_saved_bytes().sparse == before.sparse + bytes);
    // A copy shares the payload.
    const auto copy = p;  // NOLINT(performance-unnecessary-copy-initialization)
    CHECK(dt::live_saved_bytes().sparse == before.sparse + bytes);
  }
  CHECK(dt::live_saved_bytes().sparse == before.sparse);
  // 0.4 B of values + 1 bit of positions + block offsets per element.
  CHECK(static_cast<double>(bytes) <= 0.53 * (1 << 16));
}

TEST_CASE("torch packed_tensor: bad tensors throw before anything is allocated") {
  const auto before = dt::live_saved_bytes();
  CHECK_THROWS_WITH_AS(
      (void)dt::packed_tensor::pack(at::Tensor(), make_policy(dt::policy_kind::mink)),
      doctest::Contains("undefined"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::packed_tensor::pack(torch::empty({8}, torch::Device(torch::kMeta)),
                                                     make_policy(dt::policy_kind::mink)),
                       doctest::Contains("tensors on meta are not supported"), dropit::error);
  CHECK_THROWS_WITH_AS(
      (void)dt::packed_tensor::pack(torch::arange(8), make_policy(dt::policy_kind::mink)),
      doctest::Contains("no dropit element type"), dropit::error);
  CHECK_THROWS_WITH_AS(
      (void)dt::packed_tensor::pack(torch::randn({8}), make_policy(dt::policy_kind::mink, 1.5)),
      doctest::Contains("gamma must be in [0, 1], got 1.5"), dropit::error);
  CHECK(dt::live_saved_bytes().sparse == before.sparse);
  CHECK_THROWS_AS((void)dt::packed_tensor{}.restore(), dropit::error);
}

TEST_CASE("torch packed_tensor: load rebuilds a pack from its accessors, and checks them") {
  const auto x = tie_free({3, 4, 9, 10}, torch::kFloat).contiguous(at::MemoryFormat::ChannelsLast);
  dt::policy random = make_policy(dt::policy_kind::random, 0.75, 5);
  random.codec = dropit::value_codec::int8;
  for (const dt::policy& p : {make_policy(dt::policy_kind::mink, 0.9), random}) {
    const auto a = dt::packed_tensor::pack_saved(x, p);
    const std::vector<std::byte> bytes(a.payload().begin(), a.payload().end());
    const auto before = dt::live_saved_bytes().sparse;
    const auto b = dt::packed_tensor::load(a.dtype(), a.sizes(), a.strides(), a.packed_with(),
                                           a.kept(), a.positions(), bytes);
    CHECK(dt::live_saved_bytes().sparse == before + b.bytes());
    CHECK(b.packed_with().kind == p.kind);
    CHECK(b.packed_with().seed == p.seed);
    CHECK(b.packed_with().codec == p.codec);
    const auto ra = a.restore(), rb = b.restore();
    CHECK(rb.strides() == ra.strides());
    CHECK(torch::equal(ra, rb));
  }
  const auto a = dt::packed_tensor::pack(torch::randn({6, 7}), make_policy(dt::policy_kind::mink));
  const std::vector<std::byte> bytes(a.payload().begin(), a.payload().end());
  auto refused = [&](std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
                     at::ScalarType dtype, std::size_t kept, const char* message) {
    CHECK_THROWS_WITH_AS((void)dt::packed_tensor::load(dtype, std::move(sizes), std::move(strides),
                                                       a.packed_with(), kept, a.positions(), bytes),
                         doctest::Contains(message), dropit::error);
  };
  refused({6, 7}, {1, 1}, at::kFloat, a.kept(), "strides [1, 1] are not a dense layout");
  refused({6, 7}, {7, 2}, at::kFloat, a.kept(), "are not a dense layout");
  refused({6, -7}, {7, 1}, at::kFloat, a.kept(), "size -7 and stride 1 of dimension 1");
  refused({6, 7}, {7}, at::kFloat, a.kept(), "2 sizes and 1 strides");
  refused({6, 7}, {7, 1}, at::kLong, a.kept(), "no dropit element type");
  refused({6, 7}, {7, 1}, at::kDouble, a.kept(), "load: the payload has");
  refused({6, 7}, {7, 1}, at::kFloat, 43, "load: k = 43 kept elements of n = 42");
  refused({1 << 30, 1 << 30, 1 << 30}, {1, 1, 1}, at::kFloat, 1, "too many elements");
}

namespace {
/// A channels-last ReLU output whose element count is no multiple of 32.
at::Tensor cl_source() {
  torch::manual_seed(4);
  return torch::relu(torch::randn({2, 5, 6, 7})).contiguous(at::MemoryFormat::ChannelsLast);
}
}  // namespace

TEST_CASE("torch packed_mask: 1 where ReLU's backward passes the gradient, NaN included") {
  for_each_isa([] {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
      CAPTURE(dtype);
      torch::manual_seed(2);
      auto y = torch::relu(torch::randint(-3, 4, {7, 33, 5}, torch::kFloat));
      y.view({-1})[3] = std::numeric_limits<float>::quiet_NaN();
      y = y.to(dtype);
      const auto before = dt::live_saved_bytes();
      const auto m = dt::packed_mask::relu(y);
      CHECK(m.bytes() == static_cast<std::size_t>((y.numel() + 31) / 32 * 4));
      CHECK(dt::live_saved_bytes().masks == before.masks + m.bytes());
      const auto r = m.restore();
      CHECK((r.scalar_type() == dtype));
      CHECK(torch::equal(r, y.le(0).logical_not().to(dtype)));
      // LibTorch's ReLU backward gives the same gradient from the mask as from the output.
      const auto g = torch::randn(y.sizes()).to(dtype);
      CHECK(torch::equal(at::threshold_backward(g, r, 0), at::threshold_backward(g, y, 0)));
      // As bool (1 byte per element): the same tensor of flags, the same gradient.
      const auto b = m.restore_bool();
      CHECK((b.scalar_type() == torch::kBool));
      CHECK(torch::equal(b, y.le(0).logical_not()));
      CHECK(torch::equal(at::threshold_backward(g, b, 0), at::threshold_backward(g, y, 0)));
    }
  });
  CHECK(torch::equal(dt::packed_mask::relu(cl_source()).restore_bool(), cl_source().gt(0)));
  {  // a dropout's noise restores only with its value
    const auto noise = torch::tensor({0.0f, 2.0f, 2.0f, 0.0f});
    CHECK_THROWS_WITH_AS((void)dt::packed_mask::dropout(noise).restore_bool(),
                         doctest::Contains("(not 1 and 0); use restore()"), dropit::error);
    CHECK_THROWS_AS((void)dt::packed_mask{}.restore_bool(), dropit::error);
  }
  const auto cl =
      torch::relu(torch::randn({2, 5, 6, 7})).contiguous(at::MemoryFormat::ChannelsLast);
  const auto r = dt::packed_mask::relu(cl).restore();
  CHECK(r.strides() == cl.strides());
  CHECK(torch::equal(r, cl.gt(0).to(torch::kFloat)));
  CHECK_THROWS_WITH_AS((void)dt::packed_mask::relu(torch::arange(4)),
                       doctest::Contains("floating-point"), dropit::error);
}

TEST_CASE("torch packed_mask::dropout: a dropout's noise (0 or 1 / (1 - p)) back exactly") {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const double p : {0.1, 0.5, 0.9}) {
      CAPTURE(dtype);
      CAPTURE(p);
      torch::manual_seed(3);
      // What LibTorch's CPU dropout saves for backward: bernoulli(1 - p) / (1 - p). (The
      // generator named: an empty optional one copied inline makes g++ -O2 with ASan warn.)
      const auto noise = torch::empty({5, 37, 11}, dtype)
                             .bernoulli_(1 - p, at::globalContext().defaultGenerator(at::kCPU))
                             .div_(1 - p)
                             .transpose(0, 2);
      const auto before = dt::live_saved_bytes();
      const auto m = dt::packed_mask::dropout(noise);
      CHECK(m.bytes() == static_cast<std::size_t>((noise.numel() + 31) / 32 * 4));
      CHECK(dt::live_saved_bytes().masks == before.masks + m.bytes());
      const auto r = m.restore();
      CHECK((r.scalar_type() == dtype));
      CHECK(r.strides() == noise.strides());  // a permutation of a dense tensor keeps its layout
      CHECK(torch::equal(r, noise));
    }
  }
  CHECK(
      torch::equal(dt::packed_mask::dropout(torch::zeros({3, 4})).restore(), torch::zeros({3, 4})));
  CHECK_THROWS_WITH_AS((void)dt::packed_mask::dropout(torch::tensor({0.f, 2.f, 0.f, 3.f})),
                       doctest::Contains("0 or 2"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::packed_mask::dropout(torch::tensor({0.f, -2.f})),
                       doctest::Contains("positive finite"), dropit::error);
  CHECK_THROWS_WITH_AS(
      (void)dt::packed_mask::dropout(torch::tensor({0.f, std::numeric_limits<float>::quiet_NaN()})),
      doctest::Contains("positive finite"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::packed_mask::dropout(torch::arange(4)),
                       doctest::Contains("floating-point"), dropit::error);
}

TEST_CASE(
    "torch packed_mask: LeakyReLU and Hardtanh masks back as tensors their backward reads "
    "alike") {
  const auto source = [](at::ScalarType dtype) {
    torch::manual_seed(6);
    auto t = torch::randint(-16, 17, {5, 7, 33}, torch::kFloat) * 0.25;
    const float specials[] = {-0.0f,
                              std::numeric_limits<float>::quiet_NaN(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::infinity(),
                              -1.0f,
                              1.0f,
                              6.0f,
                              3.2e38f};
    for (int i = 0; i < 8; ++i)
      t.view({-1})[i * 41] = specials[i];
    return t.to(dtype).transpose(0, 2).contiguous().transpose(0, 2);  // dense, permuted
  };
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    CAPTURE(dtype);
    const auto t = source(dtype);
    const auto g = torch::randn(t.sizes()).to(dtype);
    const auto m = dt::packed_mask::leaky_relu(t);
    CHECK(m.bytes() == static_cast<std::size_t>((t.numel() + 31) / 32 * 4));
    const auto r = m.restore();
    CHECK(r.strides() == t.strides());
    CHECK(torch::equal(r, t.gt(0).to(dtype)));  // NaN: 0 (the gradient is scaled)
    for (const double slope : {0.01, 0.2})
      CHECK(torch::equal(at::leaky_relu_backward(g, r, slope, false),
                         at::leaky_relu_backward(g, t, slope, false)));
  }
  // Hardtanh: LibTorch has no bfloat16 backward on the CPU; the last bounds have no float
  // midpoint (their sum overflows), so an element inside stands for all.
  const std::array<std::array<double, 2>, 5> bounds{
      {{-1.0, 1.0}, {0.0, 6.0}, {-2.0, -0.5}, {-0.3, 0.7}, {3.0e38, 3.4e38}}};
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (const auto [lo, hi] : bounds) {
      CAPTURE(dtype);
      CAPTURE(lo);
      const auto t = source(dtype);
      const auto g = torch::randn(t.sizes()).to(dtype);
      const auto m = dt::packed_mask::hardtanh(t, lo, hi);
      const auto r = m.restore();
      const auto inside = t.gt(lo).logical_and(t.lt(hi));
      CHECK(torch::equal(r.gt(lo).logical_and(r.lt(hi)), inside));
      CHECK(torch::equal(r.masked_select(inside.logical_not()),
                         torch::full({(~inside).sum().item<std::int64_t>()}, lo, dtype)));
      // LibTorch's kernel blocks a NaN in its vector loop and passes it in its scalar tail (here,
      // with g and t in different layouts, the NaN falls in a tail): compared apart.
      const auto nan = t.isnan();
      const auto ours = at::hardtanh_backward(g, r, lo, hi);
      CHECK(torch::equal(ours.masked_fill(nan, 0),
                         at::hardtanh_backward(g, t, lo, hi).masked_fill(nan, 0)));
      CHECK(torch::equal(ours.masked_select(nan), torch::zeros({1}, dtype)));
      // the bool view is only for 0/1 masks
      if (lo != 0) CHECK_THROWS_AS((void)m.restore_bool(), dropit::error);
    }
  }
  const auto t = source(torch::kFloat);
  CHECK_THROWS_WITH_AS((void)dt::packed_mask::hardtanh(t, 1.0, -1.0),
                       doctest::Contains("min_val (1) must not exceed max_val (-1)"),
                       dropit::error);
  CHECK_THROWS_AS((void)dt::packed_mask::leaky_relu(torch::ones({3}, torch::kLong)), dropit::error);
}

TEST_CASE("torch packed_pool_indices: LibTorch's indices back, for every window shape") {
  struct window {
    std::int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    bool ceil;
  };
  const std::vector<window> windows = {
      {2, 2, 2, 2, 0, 0, 1, 1, false}, {2, 2, 2, 2, 0, 0, 1, 1, true},
      {2, 2, 1, 1, 0, 0, 1, 1, false}, {3, 3, 2, 2, 1, 1, 1, 1, false},
      {3, 3, 2, 2, 1, 1, 1, 1, true},  {2, 3, 2, 1, 0, 1, 2, 1, false},
      {5, 5, 3, 3, 2, 2, 1, 1, true},  {1, 1, 1, 1, 0, 0, 1, 1, false}};
  for (const window& w : windows) {
    for (auto sizes :
         {std::vector<std::int64_t>{3, 4, 28, 28}, std::vector<std::int64_t>{2, 3, 13, 67},
          std::vector<std::int64_t>{5, 17, 19}}) {
      CAPTURE(w.kh);
      CAPTURE(w.sh);
      CAPTURE(w.ph);
      CAPTURE(w.dh);
      CAPTURE(w.ceil);
      CAPTURE(sizes[sizes.size() - 1]);
      torch::manual_seed(5);
      const auto x = torch::randint(0, 3, sizes, torch::kFloat);  // ties: first maximum wins
      const auto [y, idx] = at::max_pool2d_with_indices(x, {w.kh, w.kw}, {w.sh, w.sw}, {w.ph, w.pw},
                                                        {w.dh, w.dw}, w.ceil);
      const dt::max_pool2d_params params{
          {w.kh, w.kw}, {w.sh, w.sw}, {w.ph, w.pw}, {w.dh, w.dw}, w.ceil};
      const auto p = dt::packed_pool_indices::pack(idx, x.size(-2), x.size(-1), params);
      CHECK(torch::equal(p.restore(), idx));
      // One stream of codes over all planes, rounded up to a 32-bit word.
      CHECK(p.bytes() == static_cast<std::size_t>((idx.numel() * p.bits() + 31) / 32 * 4));
    }
  }
}

TEST_CASE("torch packed_pool_indices: 2 bits per 2x2 window; channels-last; bad indices throw") {
  const auto x = torch::randn({4, 8, 28, 28});
  const auto [y, idx] = at::max_pool2d_with_indices(x, {2, 2}, {2, 2});
  const dt::max_pool2d_params two{};
  const auto p = dt::packed_pool_indices::pack(idx, 28, 28, two);
  CHECK(p.bits() == 2);
  CHECK(p.bytes() == static_cast<std::size_t>(4 * 8 * 14 * 14 * 2 / 32 * 4));

  const auto xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const auto [yc, ic] = at::max_pool2d_with_indices(xc, {2, 2}, {2, 2});
  const auto rc = dt::packed_pool_indices::pack(ic, 28, 28, two).restore();
  CHECK(rc.strides() == ic.strides());
  CHECK(torch::equal(rc, ic));

  auto moved = idx.clone();
  moved.view({-1})[100] += 2;  // the cell two to the right: outside its 2x2 window
  CHECK_THROWS_WITH_AS((void)dt::packed_pool_indices::pack(moved, 28, 28, two),
                       doctest::Contains("outside its pooling window"), dropit::error);
  auto high = idx.clone();
  high.view({-1})[7] += std::int64_t{1} << 32;  // equal low 32 bits
  CHECK_THROWS_WITH_AS((void)dt::packed_pool_indices::pack(high, 28, 28, two),
                       doctest::Contains("outside its pooling window"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::packed_pool_indices::pack(idx, 30, 28, two),
                       doctest::Contains("do not match"), dropit::error);
  CHECK_THROWS_WITH_AS((void)dt::packed_pool_indices::pack(idx.to(torch::kInt), 28, 28, two),
                       doctest::Contains("int64 indices are needed"), dropit::error);
}

}  // namespace
