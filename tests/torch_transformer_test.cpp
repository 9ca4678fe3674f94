// dropit::torch::TransformerEncoder and TransformerEncoderLayer: LibTorch's modules on dropit's.
// Oracles: LibTorch's own nn::TransformerEncoder (identity policy with every store class on and
// the exact codec: every output and gradient), and, with MinK, what DropIT leaves exact: the
// output, the input gradient and every gradient but the Linear / projection weights'.
#include <dropit/torch.hpp>

#include "torch_test_support.hpp"
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

namespace {

using namespace dropit_torch_test;
namespace dt = dropit::torch;
namespace nn = torch::nn;

const torch_threads two_threads;

nn::TransformerEncoderLayerOptions layer_options(bool gelu, double dropout) {
  auto o = nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(dropout);
  if (gelu) o.activation(torch::kGELU);
  return o;
}

/// Two layers and a final LayerNorm, fp64.
nn::TransformerEncoder make_plain(bool gelu, double dropout) {
  torch::manual_seed(21);
  nn::TransformerEncoder e(
      nn::TransformerEncoderOptions(nn::TransformerEncoderLayer(layer_options(gelu, dropout)), 2)
          .norm(nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({8})))));
  e->to(torch::kDouble);
  return e;
}

struct run_result {
  torch::Tensor out;
  std::map<std::string, torch::Tensor> grads;  // parameters and "src"
};

/// forward(src [6, 3, 8], a float mask, a padding mask) after seed 23 (the dropout draws) and a
/// backward of a fixed random projection of the output.
template <class Module>
run_result run(Module& m) {
  torch::manual_seed(22);
  const auto src = torch::randn({6, 3, 8}, torch::kDouble).requires_grad_(true);
  const auto mask = torch::randn({6, 6}, torch::kDouble);
  auto padding = torch::zeros({3, 6}, torch::kBool);
  padding.index_put_({1, 4}, true);
  torch::manual_seed(23);
  const auto out = m.forward(src, mask, padding);
  torch::manual_seed(24);
  (out * torch::randn(out.sizes(), torch::kDouble)).sum().backward();
  run_result r{out.detach(), {}};
  for (const auto& p : m.named_parameters())
    r.grads[p.key()] = p.value().grad();
  r.grads["src"] = src.grad();
  return r;
}

/// The weights whose gradient DropIT computes from a rebuilt input.
bool sparsified_weight(const std::string& name) {
  for (const char* w : {"linear1.weight", "linear2.weight", "in_proj_weight", "out_proj.weight"}) {
    const std::string suffix = w;
    if (name.size() >= suffix.size() && name.ends_with(suffix)) return true;
  }
  return false;
}

std::set<std::string> names_of(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  std::set<std::string> s;
  for (const auto& item : d)
    s.insert(item.key());
  return s;
}

}  // namespace

TEST_CASE("torch: TransformerEncoder with identity and the exact store equals LibTorch's") {
  for (const bool gelu : {false, true}) {
    for (const double dropout : {0.0, 0.2}) {
      CAPTURE(gelu);
      CAPTURE(dropout);
      auto plain = make_plain(gelu, dropout);
      nn::ModuleList list(plain->clone());
      dt::convert_options o;
      o.store = dt::store_options::all(dropit::value_codec::exact);
      const auto report = dt::to_dropit(*list, make_policy(dt::policy_kind::identity), o);
      CHECK(report.replaced == 1);  // the encoder; its submodules are dropit's from then on
      auto* ours = list[0]->as<dt::TransformerEncoderImpl>();
      REQUIRE(ours != nullptr);
      // LibTorch's names, so a state dict carries over.
      CHECK(names_of(ours->named_parameters()) == names_of(plain->named_parameters()));
      CHECK(ours->layers->at<dt::TransformerEncoderLayerImpl>(1).self_attn->get_store().softmax);
      const auto before = dt::live_saved_bytes();
      const run_result want = run(*plain);
      const run_result got = run(*ours);
      CHECK(dt::live_saved_bytes().sparse == before.sparse);  // released after backward
      CHECK(dt::live_saved_bytes().masks == before.masks);
      CHECK(rel_diff(got.out, want.out) <= 1e-12);
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

TEST_CASE("torch: TransformerEncoder with MinK changes only the sparsified weight gradients") {
  auto plain = make_plain(false, 0.1);
  dt::TransformerEncoder ours(*plain->clone()->as<nn::TransformerEncoderImpl>(),
                              make_policy(dt::policy_kind::mink, 0.9));
  // Saved after forward: packed Linear inputs and ReLU masks, no dense copy of them.
  const auto before = dt::live_saved_bytes();
  {
    torch::manual_seed(22);
    const auto src = torch::randn({6, 3, 8}, torch::kDouble).requires_grad_(true);
    const auto out = ours->forward(src);
    const auto after = dt::live_saved_bytes();
    CHECK(after.sparse > before.sparse);
    CHECK(after.masks > before.masks);  // the ReLU's bits
  }
  const run_result want = run(*plain);
  const run_result got = run(*ours);
  CHECK(rel_diff(got.out, want.out) <= 1e-12);
  int sparsified = 0;
  for (const auto& [key, g] : want.grads) {
    CAPTURE(key);
    REQUIRE(got.grads.count(key) == 1);
    if (sparsified_weight(key)) {
      ++sparsified;
      CHECK(rel_diff(got.grads.at(key), g) > 1e-3);
    } else {
      CHECK(rel_diff(got.grads.at(key), g) <= 1e-10);  // input, biases, LayerNorms: exact
    }
  }
  CHECK(sparsified == 8);  // 2 layers x (in_proj, out_proj, linear1, linear2)
}

TEST_CASE("torch: TransformerEncoder in eval, no-grad; a fresh layer; clone and printing") {
  auto plain = make_plain(true, 0.1);
  dt::TransformerEncoder ours(*plain, make_policy(dt::policy_kind::mink, 0.9));
  torch::manual_seed(25);
  const auto src = torch::randn({5, 2, 8}, torch::kDouble).requires_grad_(true);
  for (const bool eval : {true, false}) {
    // Eval, and no-grad in training (dropout drawn after the same seed): LibTorch's output and
    // nothing saved.
    CAPTURE(eval);
    plain->train(!eval);
    ours->train(!eval);
    torch::AutoGradMode grad(eval);
    const auto before = dt::live_saved_bytes();
    torch::manual_seed(26);
    const auto want = plain->forward(src);
    torch::manual_seed(26);
    const auto got = ours->forward(src);
    CHECK(dt::live_saved_bytes().total() == before.total());
    CHECK(rel_diff(got, want) <= 1e-12);
  }
  ours->train();
  // The parameters are the standard module's.
  CHECK(ours->layers->at<dt::TransformerEncoderLayerImpl>(0).linear1->weight.is_same(
      plain->layers->at<nn::TransformerEncoderLayerImpl>(0).linear1->weight));
  // A fresh layer makes LibTorch's parameters after the same seed.
  torch::manual_seed(27);
  nn::TransformerEncoderLayer standard(layer_options(false, 0.1));
  torch::manual_seed(27);
  dt::TransformerEncoderLayer fresh(layer_options(false, 0.1),
                                    make_policy(dt::policy_kind::mink, 0.9));
  REQUIRE(names_of(fresh->named_parameters()) == names_of(standard->named_parameters()));
  for (const auto& p : standard->named_parameters()) {
    CAPTURE(p.key());
    CHECK(torch::equal(fresh->named_parameters()[p.key()], p.value()));
  }
  // A deep clone keeps every policy.
  const auto copy = std::dynamic_pointer_cast<dt::TransformerEncoderImpl>(ours->clone());
  REQUIRE(copy != nullptr);
  auto& layer0 = copy->layers->at<dt::TransformerEncoderLayerImpl>(0);
  CHECK_FALSE(layer0.linear1->weight.is_same(
      ours->layers->at<dt::TransformerEncoderLayerImpl>(0).linear1->weight));
  CHECK(torch::equal(layer0.linear1->weight,
                     ours->layers->at<dt::TransformerEncoderLayerImpl>(0).linear1->weight));
  CHECK(layer0.linear1->get_policy().gamma == 0.9);
  CHECK(layer0.self_attn->get_policy().gamma == 0.9);
  std::ostringstream printed;
  layer0.pretty_print(printed);
  CHECK(printed.str() ==
        "dropit::torch::TransformerEncoderLayer(d_model=8, nhead=2, policy=mink(0.9))");
}
