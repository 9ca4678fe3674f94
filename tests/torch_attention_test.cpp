// dropit::torch::MultiheadAttention: LibTorch's module with its projections through dropit.
// Oracles: LibTorch's own nn::MultiheadAttention (identity policy: every output and gradient, for
// each option and forward argument), and an attention written here from PyTorch's formula whose
// projections take their weight gradient from DropIT's top-k input (MinK).
#include <dropit/torch.hpp>

#include "torch_test_support.hpp"
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace dropit_torch_test;
namespace dt = dropit::torch;
namespace nn = torch::nn;

const torch_threads two_threads;

/// Which tensors a forward gets as query, key and value.
enum class inputs { self, key_is_value, distinct };

struct attention_case {
  const char* name;
  nn::MultiheadAttentionOptions options;
  inputs in;
  std::int64_t kdim, vdim;  // features of key and value
  bool padding_mask, float_mask, need_weights, average;
};

/// Query [5, 3, E] and key/value [S, 3, *] as `in` says, each requiring a gradient.
struct attention_inputs {
  torch::Tensor query, key, value;
};

attention_inputs make_inputs(const attention_case& c, torch::ScalarType dtype) {
  const std::int64_t e = c.options.embed_dim();
  torch::manual_seed(3);
  attention_inputs in;
  in.query = torch::randn({5, 3, e}, dtype).requires_grad_(true);
  if (c.in == inputs::self) {
    in.key = in.value = in.query;
  } else if (c.in == inputs::key_is_value) {
    in.key = in.value = torch::randn({7, 3, c.kdim}, dtype).requires_grad_(true);
  } else {
    in.key = torch::randn({7, 3, c.kdim}, dtype).requires_grad_(true);
    in.value = torch::randn({7, 3, c.vdim}, dtype).requires_grad_(true);
  }
  return in;
}

struct attention_run {
  torch::Tensor out, weights;
  std::map<std::string, torch::Tensor> grads;  // parameters and inputs
};

/// Runs forward(query, key, value, masks..) and a backward of a fixed random projection of the
/// outputs (weights included), collecting every gradient.
template <class Module>
attention_run run_module(Module& m, const attention_case& c, torch::ScalarType dtype) {
  const attention_inputs in = make_inputs(c, dtype);
  const std::int64_t src = in.key.size(0);  // the module pads the masks for add_bias_kv
  torch::Tensor padding, mask;
  if (c.padding_mask) {
    padding = torch::zeros({3, src}, torch::kBool);
    padding.index_put_({1, 2}, true);
    padding.index_put_({2, 0}, true);
  }
  if (c.float_mask) {
    torch::manual_seed(4);
    mask = torch::randn({5, src}, dtype);
  }
  auto [out, weights] =
      m->forward(in.query, in.key, in.value, padding, c.need_weights, mask, c.average);
  torch::manual_seed(5);
  auto loss = (out * torch::randn(out.sizes(), dtype)).sum();
  if (c.need_weights) loss = loss + (weights * torch::randn(weights.sizes(), dtype)).sum();
  loss.backward();
  attention_run r{out.detach(), c.need_weights ? weights.detach() : torch::Tensor(), {}};
  for (const auto& p : m->named_parameters())
    r.grads[p.key()] = p.value().grad();
  r.grads["query"] = in.query.grad();
  if (c.in != inputs::self) r.grads["key"] = in.key.grad();
  if (c.in == inputs::distinct) r.grads["value"] = in.value.grad();
  return r;
}

std::vector<attention_case> option_cases() {
  using O = nn::MultiheadAttentionOptions;
  return {
      {"self-attention", O(8, 2), inputs::self, 8, 8, false, false, true, true},
      {"self-attention, no bias, weights per head", O(8, 4).bias(false), inputs::self, 8, 8, false,
       false, true, false},
      {"encoder-decoder (key = value)", O(8, 2), inputs::key_is_value, 8, 8, true, false, true,
       true},
      {"distinct query, key, value", O(8, 2), inputs::distinct, 8, 8, false, true, false, true},
      // LibTorch's dropout draws after the same seed in both modules: the same noise.
      {"dropout 0.3", O(8, 2).dropout(0.3), inputs::self, 8, 8, false, false, true, true},
      // LibTorch's module asserts key.sizes() == value.sizes(): kdim = vdim.
      {"kdim / vdim", O(8, 2).kdim(6).vdim(6), inputs::distinct, 6, 6, true, true, true, true},
      {"add_bias_kv, add_zero_attn, both masks", O(8, 2).add_bias_kv(true).add_zero_attn(true),
       inputs::key_is_value, 8, 8, true, true, true, false},
  };
}

}  // namespace

TEST_CASE("torch: MultiheadAttention with identity equals LibTorch's module, every option") {
  // Identity projections; then the attention's own tensors stored too (exact codec, the noise as
  // bits), with identity projections and with policy none.
  const dt::store_options none, stored = dt::store_options::all(dropit::value_codec::exact);
  const std::pair<dt::policy, dt::store_options> configurations[] = {
      {make_policy(dt::policy_kind::identity), none},
      {make_policy(dt::policy_kind::identity), stored},
      {dt::policy{}, stored}};
  for (const auto& [policy, store] : configurations) {
    for (const attention_case& c : option_cases()) {
      const std::string name = c.name;
      CAPTURE(name);
      const std::string kind = dt::to_string(policy.kind);
      CAPTURE(kind);
      CAPTURE(store.any());
      torch::manual_seed(2);
      nn::MultiheadAttention plain(c.options);
      plain->to(torch::kDouble);
      torch::manual_seed(2);
      nn::MultiheadAttention base(c.options);
      base->to(torch::kDouble);
      dt::MultiheadAttention ours(*base, policy);
      ours->set_store(store);
      // Taking over shares the parameter tensors, out_proj's included.
      CHECK(ours->in_proj_bias.defined() == base->in_proj_bias.defined());
      CHECK(ours->out_proj->weight.data_ptr() == base->out_proj->weight.data_ptr());
      const auto before = dt::live_saved_bytes().sparse;
      const auto want = run_module(plain, c, torch::kDouble);
      const auto got = run_module(ours, c, torch::kDouble);
      CHECK(dt::live_saved_bytes().sparse == before);  // everything released after backward
      CHECK(rel_diff(got.out, want.out) <= 1e-12);
      CHECK(got.weights.defined() == want.weights.defined());
      if (want.weights.defined()) CHECK(rel_diff(got.weights, want.weights) <= 1e-12);
      REQUIRE(got.grads.size() == want.grads.size());
      for (const auto& [key, g] : want.grads) {
        CAPTURE(key);
        REQUIRE(got.grads.count(key) == 1);
        REQUIRE(g.defined());
        CHECK(rel_diff(got.grads.at(key), g) <= 1e-12);
      }
    }
  }
}

namespace {

/// y = x W^T + b whose weight gradient is DropIT's: from x's top (1 - gamma) magnitudes (value
/// and input gradient exact): x W^T + b + xs W^T - xs W.detach()^T, xs constant.
torch::Tensor topk_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          double gamma) {
  const auto xs = topk_sparsified(x.detach(), gamma);
  return torch::linear(x, w.detach(), b) + torch::linear(xs, w) - torch::linear(xs, w.detach());
}

/// PyTorch's multi-head attention (no masks, no dropout, weights averaged over heads) with each
/// projection through topk_linear: self-attention packs the query once (one projection), key =
/// value the key once.
std::pair<torch::Tensor, torch::Tensor> oracle_attention(nn::MultiheadAttention& m,
                                                         const torch::Tensor& query,
                                                         const torch::Tensor& key, bool self,
                                                         double gamma) {
  const std::int64_t e = m->options.embed_dim(), h = m->options.num_heads(), hd = e / h;
  const std::int64_t l = query.size(0), n = query.size(1);
  const auto& w = m->in_proj_weight;
  const auto& b = m->in_proj_bias;
  torch::Tensor q, k, v;
  if (self) {
    const auto qkv = topk_linear(query, w, b, gamma).chunk(3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = topk_linear(query, w.slice(0, 0, e), b.slice(0, 0, e), gamma);
    const auto kv = topk_linear(key, w.slice(0, e), b.slice(0, e), gamma).chunk(2, -1);
    k = kv[0], v = kv[1];
  }
  const auto heads = [&](const torch::Tensor& t) {
    return t.contiguous().view({t.size(0), n * h, hd}).transpose(0, 1);
  };
  const auto scores =
      torch::bmm(heads(q) / std::sqrt(static_cast<double>(hd)), heads(k).transpose(1, 2));
  const auto attn = torch::softmax(scores, -1);
  const auto mixed = torch::bmm(attn, heads(v)).transpose(0, 1).contiguous().view({l, n, e});
  const auto out = topk_linear(mixed, m->out_proj->weight, m->out_proj->bias, gamma);
  return {out, attn.view({n, h, l, key.size(0)}).mean(1)};
}

}  // namespace

TEST_CASE(
    "torch: MultiheadAttention with MinK: weight gradients from the top-k projection inputs") {
  const double gamma = 0.9;
  for (bool self : {true, false}) {
    CAPTURE(self);
    torch::manual_seed(6);
    const auto query = torch::randn({6, 2, 16}, torch::kDouble);
    const auto key = self ? query : torch::randn({9, 2, 16}, torch::kDouble);
    const auto run = [&](bool ours) {
      torch::manual_seed(7);
      nn::MultiheadAttention base(nn::MultiheadAttentionOptions(16, 4));
      base->to(torch::kDouble);
      dt::MultiheadAttention converted(*base, make_policy(dt::policy_kind::mink, gamma));
      const auto q = query.clone().requires_grad_(true);
      const auto k = self ? q : key.clone().requires_grad_(true);
      auto [out, weights] =
          ours ? converted->forward(q, k, k) : oracle_attention(base, q, k, self, gamma);
      torch::manual_seed(8);
      ((out * torch::randn(out.sizes(), torch::kDouble)).sum() +
       (weights * torch::randn(weights.sizes(), torch::kDouble)).sum())
          .backward();
      std::map<std::string, torch::Tensor> g;
      for (const auto& p : base->named_parameters())
        g[p.key()] = p.value().grad();
      g["query"] = q.grad();
      if (!self) g["key"] = k.grad();
      g["out"] = out.detach();
      g["weights"] = weights.detach();
      return g;
    };
    const auto got = run(true), want = run(false);
    for (const auto& [key_name, t] : want) {
      CAPTURE(key_name);
      CHECK(rel_diff(got.at(key_name), t) <= 1e-10);
    }
    // The oracle's weight gradients are not the exact ones: the test sees the sparsification.
    torch::manual_seed(7);
    nn::MultiheadAttention exact(nn::MultiheadAttentionOptions(16, 4));
    exact->to(torch::kDouble);
    const auto q = query.clone().requires_grad_(true);
    const auto k = self ? q : key.clone().requires_grad_(true);
    auto [out, weights] = exact->forward(q, k, k);
    torch::manual_seed(8);
    ((out * torch::randn(out.sizes(), torch::kDouble)).sum() +
     (weights * torch::randn(weights.sizes(), torch::kDouble)).sum())
        .backward();
    CHECK(rel_diff(got.at("in_proj_weight"), exact->in_proj_weight.grad()) > 1e-3);
    CHECK(rel_diff(got.at("out_proj.weight"), exact->out_proj->weight.grad()) > 1e-3);
    CHECK(rel_diff(got.at("query"), q.grad()) <= 1e-10);  // input gradients stay exact
  }
}

TEST_CASE("torch: MultiheadAttention packs each distinct projection input once") {
  // MinK 0.9: self-attention packs the query and the out projection's input; distinct query, key
  // and value pack four inputs of the same size; equal values count as the same input, as
  // LibTorch's module decides self-attention.
  dt::MultiheadAttention m(nn::MultiheadAttentionOptions(32, 4),
                           make_policy(dt::policy_kind::mink, 0.9));
  const auto x = torch::randn({16, 4, 32}, torch::requires_grad());
  const auto held = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    const auto before = dt::live_saved_bytes().sparse;
    auto [out, weights] = m->forward(q, k, v);
    const auto bytes = dt::live_saved_bytes().sparse - before;
    out.sum().backward();
    CHECK(dt::live_saved_bytes().sparse == before);
    return bytes;
  };
  const auto self = held(x, x, x);
  const auto self_by_value = held(x, x.detach().clone(), x.detach().clone());
  const auto distinct = held(x, torch::randn_like(x), torch::randn_like(x));
  CHECK(self > 0);
  CHECK(self_by_value == self);
  CHECK(distinct == 2 * self);
  // Two dense fp32 copies would take 2 x 4 bytes per element; MinK 0.9 keeps about 0.53 each.
  CHECK(self < 2 * x.numel() * 4 / 5);
}

TEST_CASE("torch: MultiheadAttention in eval, no-grad, excluded; to_dropit, clone, printing") {
  torch::manual_seed(9);
  nn::ModuleList list(nn::MultiheadAttention(nn::MultiheadAttentionOptions(8, 2)),
                      nn::Linear(8, 8));
  const auto weight = list[0]->as<nn::MultiheadAttentionImpl>()->in_proj_weight;
  const auto report = dt::to_dropit(*list, make_policy(dt::policy_kind::mink, 0.9));
  CHECK(report.replaced == 2);
  auto* m = list[0]->as<dt::MultiheadAttentionImpl>();
  REQUIRE(m != nullptr);
  CHECK(m->in_proj_weight.is_same(weight));
  std::ostringstream printed;
  m->pretty_print(printed);
  CHECK(printed.str() ==
        "dropit::torch::MultiheadAttention(embed_dim=8, num_heads=2, "
        "policy=mink(0.9))");

  const auto x = torch::randn({4, 2, 8}, torch::requires_grad());
  nn::MultiheadAttention reference(nn::MultiheadAttentionOptions(8, 2));
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : reference->named_parameters()) {
      p.value().copy_(m->named_parameters()[p.key()]);
    }
  }
  const auto plain_out = std::get<0>(reference->forward(x, x, x)).detach();
  for (bool eval : {true, false}) {
    // Eval mode, and no-grad in training, run LibTorch's module: its output, nothing saved.
    CAPTURE(eval);
    const auto before = dt::live_saved_bytes().sparse;
    m->train(!eval);
    torch::AutoGradMode grad(eval);
    const auto out = std::get<0>(m->forward(x, x, x));
    CHECK(dt::live_saved_bytes().sparse == before);
    CHECK(rel_diff(out, plain_out) == 0.0);
    m->train();
  }
  {
    // Excluded: inputs kept exact, so the gradients are LibTorch's.
    m->exclude();
    auto [out, w] = m->forward(x, x, x);
    out.sum().backward();
    const auto gx = x.grad().clone();
    x.mutable_grad().reset();
    auto [ref_out, ref_w] = reference->forward(x, x, x);
    ref_out.sum().backward();
    CHECK(rel_diff(out, ref_out) <= 1e-6);
    CHECK(rel_diff(gx, x.grad()) <= 1e-6);
    CHECK(rel_diff(m->in_proj_weight.grad(), reference->in_proj_weight.grad()) <= 1e-6);
    CHECK(rel_diff(m->out_proj->weight.grad(), reference->out_proj->weight.grad()) <= 1e-6);
    m->exclude(false);
  }
  // A clone is deep (out_proj included) and keeps the policy.
  const auto copy = std::dynamic_pointer_cast<dt::MultiheadAttentionImpl>(m->clone());
  REQUIRE(copy != nullptr);
  CHECK_FALSE(copy->in_proj_weight.is_same(m->in_proj_weight));
  CHECK(torch::equal(copy->in_proj_weight, m->in_proj_weight));
  CHECK(copy->out_proj->weight.data_ptr() != m->out_proj->weight.data_ptr());
  CHECK(torch::equal(copy->out_proj->bias, m->out_proj->bias));
  CHECK(copy->get_policy().gamma == 0.9);
}

TEST_CASE("torch: MultiheadAttention refuses bad input with a dropit::error") {
  dt::MultiheadAttention m(8, 2, make_policy(dt::policy_kind::mink, 0.9));
  const auto x = torch::randn({4, 2, 8}, torch::requires_grad());
  CHECK_THROWS_WITH_AS(m->forward(x[0], x[0], x[0]),
                       doctest::Contains("query, key and value must be 3-d"), dropit::error);
  CHECK_THROWS_WITH_AS(m->forward(torch::randn({4, 2, 6}), x, x),
                       doctest::Contains("query has 6 features, the module's embed_dim is 8"),
                       dropit::error);
  CHECK_THROWS_WITH_AS(m->forward(x, x, torch::randn({5, 2, 8})),
                       doctest::Contains("key and value must have the same sizes"), dropit::error);
  CHECK_THROWS_WITH_AS(m->forward(x, x, x, torch::zeros({2, 3}, torch::kBool)),
                       doctest::Contains("key_padding_mask must be [N, S] = [2, 4]"),
                       dropit::error);
}
