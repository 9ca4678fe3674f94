// dropit::torch::TransformerEncoder(Layer) and TransformerDecoder(Layer): LibTorch's modules on
// dropit's. Oracles: LibTorch's own nn::TransformerEncoder / Decoder / Transformer (identity policy
// with every store class on and the exact codec: every output and gradient), and, with MinK, what
// DropIT leaves exact: the output, the input gradients and every gradient but the Linear /
// projection weights'.
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

/// got's output and gradients equal want's within tol, except the sparsified weights' (which
/// must differ by more than 1e-3) when `sparsified` is true; returns how many those were.
int check_against(const run_result& got, const run_result& want, bool sparsified, double tol) {
  CHECK(rel_diff(got.out, want.out) <= tol);
  REQUIRE(got.grads.size() == want.grads.size());
  int n = 0;
  for (const auto& [key, g] : want.grads) {
    CAPTURE(key);
    REQUIRE(got.grads.count(key) == 1);
    REQUIRE(g.defined());
    if (sparsified && sparsified_weight(key)) {
      ++n;
      CHECK(rel_diff(got.grads.at(key), g) > 1e-3);
    } else {
      CHECK(rel_diff(got.grads.at(key), g) <= tol);
    }
  }
  return n;
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
      check_against(got, want, false, 1e-12);
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
  // Input, biases, LayerNorms exact; 2 layers x (in_proj, out_proj, linear1, linear2) differ.
  CHECK(check_against(got, want, true, 1e-10) == 8);
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

// ---- decoder -----------------------------------------------------------------------------------

namespace {

nn::TransformerDecoderLayerOptions decoder_layer_options(bool gelu, double dropout) {
  auto o = nn::TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).dropout(dropout);
  if (gelu) o.activation(torch::kGELU);
  return o;
}

/// Two decoder layers and a final LayerNorm, fp64.
nn::TransformerDecoder make_plain_decoder(bool gelu, double dropout) {
  torch::manual_seed(31);
  nn::TransformerDecoder d(nn::TransformerDecoderOptions(
                               nn::TransformerDecoderLayer(decoder_layer_options(gelu, dropout)), 2)
                               .norm(nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({8})))));
  d->to(torch::kDouble);
  return d;
}

/// forward(tgt [5, 3, 8], memory [6, 3, 8], both float masks, both padding masks) after seed 33
/// and a backward of a fixed random projection of the output; gradients of the parameters, "tgt"
/// and "memory".
template <class Module>
run_result run_decoder(Module& m) {
  torch::manual_seed(32);
  const auto tgt = torch::randn({5, 3, 8}, torch::kDouble).requires_grad_(true);
  const auto memory = torch::randn({6, 3, 8}, torch::kDouble).requires_grad_(true);
  const auto tgt_mask = torch::randn({5, 5}, torch::kDouble);
  const auto memory_mask = torch::randn({5, 6}, torch::kDouble);
  auto tgt_padding = torch::zeros({3, 5}, torch::kBool);
  tgt_padding.index_put_({2, 3}, true);
  auto memory_padding = torch::zeros({3, 6}, torch::kBool);
  memory_padding.index_put_({0, 5}, true);
  torch::manual_seed(33);
  const auto out = m.forward(tgt, memory, tgt_mask, memory_mask, tgt_padding, memory_padding);
  torch::manual_seed(34);
  (out * torch::randn(out.sizes(), torch::kDouble)).sum().backward();
  run_result r{out.detach(), {}};
  for (const auto& p : m.named_parameters())
    r.grads[p.key()] = p.value().grad();
  r.grads["tgt"] = tgt.grad();
  r.grads["memory"] = memory.grad();
  return r;
}

}  // namespace

TEST_CASE("torch: TransformerDecoder with identity and the exact store equals LibTorch's") {
  for (const bool gelu : {false, true}) {
    for (const double dropout : {0.0, 0.2}) {
      CAPTURE(gelu);
      CAPTURE(dropout);
      auto plain = make_plain_decoder(gelu, dropout);
      nn::ModuleList list(plain->clone());
      dt::convert_options o;
      o.store = dt::store_options::all(dropit::value_codec::exact);
      const auto report = dt::to_dropit(*list, make_policy(dt::policy_kind::identity), o);
      CHECK(report.replaced == 1);
      auto* ours = list[0]->as<dt::TransformerDecoderImpl>();
      REQUIRE(ours != nullptr);
      CHECK(names_of(ours->named_parameters()) == names_of(plain->named_parameters()));
      auto& layer1 = ours->layers->at<dt::TransformerDecoderLayerImpl>(1);
      CHECK(layer1.multihead_attn->get_store().softmax);
      CHECK(layer1.dropout3->get_store().dropout);
      const auto before = dt::live_saved_bytes();
      const run_result want = run_decoder(*plain);
      const run_result got = run_decoder(*ours);
      CHECK(dt::live_saved_bytes().total() == before.total());  // released after backward
      check_against(got, want, false, 1e-12);
    }
  }
}

TEST_CASE("torch: TransformerDecoder with MinK changes only the sparsified weight gradients") {
  auto plain = make_plain_decoder(false, 0.1);
  dt::TransformerDecoder ours(*plain->clone()->as<nn::TransformerDecoderImpl>(),
                              make_policy(dt::policy_kind::mink, 0.9));
  const run_result want = run_decoder(*plain);
  const run_result got = run_decoder(*ours);
  // 2 layers x (self-attention in/out, memory attention in/out, linear1, linear2).
  CHECK(check_against(got, want, true, 1e-10) == 12);
}

TEST_CASE("torch: to_dropit on nn::Transformer replaces its encoder and decoder in place") {
  torch::manual_seed(41);
  nn::Transformer plain(nn::TransformerOptions(8, 2, 2, 1).dim_feedforward(16).dropout(0.1));
  plain->to(torch::kDouble);
  nn::Transformer ours(nn::TransformerOptions(8, 2, 2, 1).dim_feedforward(16).dropout(0.1));
  ours->to(torch::kDouble);
  for (const auto& p : plain->named_parameters()) {
    torch::NoGradGuard no_grad;
    ours->named_parameters()[p.key()].copy_(p.value());
  }
  const auto report = dt::to_dropit(*ours, make_policy(dt::policy_kind::mink, 0.9));
  CHECK(report.replaced == 2);
  REQUIRE(ours->encoder.ptr()->as<dt::TransformerEncoderImpl>() != nullptr);
  REQUIRE(ours->decoder.ptr()->as<dt::TransformerDecoderImpl>() != nullptr);
  CHECK(names_of(ours->named_parameters()) == names_of(plain->named_parameters()));
  const auto run_transformer = [](nn::Transformer& t) {
    torch::manual_seed(42);
    const auto src = torch::randn({6, 3, 8}, torch::kDouble).requires_grad_(true);
    const auto tgt = torch::randn({5, 3, 8}, torch::kDouble).requires_grad_(true);
    const auto tgt_mask =
        nn::TransformerImpl::generate_square_subsequent_mask(5).to(torch::kDouble);
    torch::manual_seed(43);
    const auto out = t->forward(src, tgt, {}, tgt_mask);
    torch::manual_seed(44);
    (out * torch::randn(out.sizes(), torch::kDouble)).sum().backward();
    run_result r{out.detach(), {}};
    for (const auto& p : t->named_parameters())
      r.grads[p.key()] = p.value().grad();
    r.grads["src"] = src.grad();
    r.grads["tgt"] = tgt.grad();
    return r;
  };
  const auto before = dt::live_saved_bytes();
  const run_result want = run_transformer(plain);
  const run_result got = run_transformer(ours);
  CHECK(dt::live_saved_bytes().total() == before.total());
  // Encoder: 2 layers x 4 sparsified weights; decoder: 1 layer x 6.
  CHECK(check_against(got, want, true, 1e-10) == 14);
  // LibTorch's Transformer::clone (its reset clones the custom encoder and decoder to_dropit
  // named) is deep and keeps the policies: the copy runs as the original did, MinK's weight
  // gradients included, on parameter tensors of its own.
  nn::Transformer copy(std::dynamic_pointer_cast<nn::TransformerImpl>(ours->clone()));
  REQUIRE(copy->encoder.ptr()->as<dt::TransformerEncoderImpl>() != nullptr);
  REQUIRE(copy->decoder.ptr()->as<dt::TransformerDecoderImpl>() != nullptr);
  const auto mine = ours->named_parameters();
  for (const auto& p : copy->named_parameters()) {
    CAPTURE(p.key());
    REQUIRE(mine.contains(p.key()));
    CHECK(p.value().data_ptr() != mine[p.key()].data_ptr());
    CHECK(torch::equal(p.value(), mine[p.key()]));
  }
  CHECK(copy->named_parameters().size() == mine.size());
  copy->zero_grad();
  CHECK(check_against(run_transformer(copy), got, false, 1e-12) == 0);
}

TEST_CASE("torch: TransformerDecoderLayer: a fresh layer, eval, clone and printing") {
  // A fresh layer makes LibTorch's parameters after the same seed, under LibTorch's names.
  torch::manual_seed(51);
  nn::TransformerDecoderLayer standard(decoder_layer_options(true, 0.1));
  torch::manual_seed(51);
  dt::TransformerDecoderLayer fresh(decoder_layer_options(true, 0.1),
                                    make_policy(dt::policy_kind::mink, 0.9));
  REQUIRE(names_of(fresh->named_parameters()) == names_of(standard->named_parameters()));
  for (const auto& p : standard->named_parameters()) {
    CAPTURE(p.key());
    CHECK(torch::equal(fresh->named_parameters()[p.key()], p.value()));
  }
  // Eval: LibTorch's output, nothing saved.
  standard->eval();
  fresh->eval();
  torch::manual_seed(52);
  const auto tgt = torch::randn({4, 2, 8}).requires_grad_(true);
  const auto memory = torch::randn({3, 2, 8});
  const auto before = dt::live_saved_bytes();
  const auto got = fresh->forward(tgt, memory);
  CHECK(dt::live_saved_bytes().total() == before.total());
  CHECK(rel_diff(got, standard->forward(tgt, memory)) <= 1e-6);
  // A deep clone keeps every policy.
  const auto copy = std::dynamic_pointer_cast<dt::TransformerDecoderLayerImpl>(fresh->clone());
  REQUIRE(copy != nullptr);
  CHECK_FALSE(copy->multihead_attn->in_proj_weight.is_same(fresh->multihead_attn->in_proj_weight));
  CHECK(torch::equal(copy->multihead_attn->in_proj_weight, fresh->multihead_attn->in_proj_weight));
  CHECK(copy->multihead_attn->get_policy().gamma == 0.9);
  CHECK(copy->linear2->get_policy().gamma == 0.9);
  CHECK_FALSE(copy->is_training());
  std::ostringstream printed;
  copy->pretty_print(printed);
  CHECK(printed.str() ==
        "dropit::torch::TransformerDecoderLayer(d_model=8, nhead=2, policy=mink(0.9))");
  // A decoder whose layers are not decoder layers is refused.
  nn::TransformerDecoder wrong(nn::TransformerDecoderOptions(standard, 1));
  wrong->layers->push_back(nn::Linear(8, 8));
  CHECK_THROWS_AS((void)dt::TransformerDecoder(*wrong), dropit::error);
}

TEST_CASE("torch: a forward dropped without backward frees every pack (nn::Transformer)") {
  // No autograd function of the adapter may hold its own output or node (a reference cycle
  // would keep the graph and its packs alive when nothing runs backward: an evaluation in
  // training mode, a skipped step). MinK on the layers and every store class in int8.
  torch::manual_seed(51);
  nn::Transformer t(nn::TransformerOptions(8, 2, 2, 1).dim_feedforward(16).dropout(0.1));
  t->to(torch::kDouble);
  dt::convert_options o;
  o.store = dt::store_options::all(dropit::value_codec::int8);
  REQUIRE(dt::to_dropit(*t, make_policy(dt::policy_kind::mink, 0.9), o).replaced == 2);
  const auto src = torch::randn({6, 3, 8}, torch::kDouble).requires_grad_(true);
  const auto tgt = torch::randn({5, 3, 8}, torch::kDouble).requires_grad_(true);
  const auto mask = nn::TransformerImpl::generate_square_subsequent_mask(5).to(torch::kDouble);
  const auto before = dt::live_saved_bytes();
  for (int i = 0; i < 2; ++i) {
    {
      const auto out = t->forward(src, tgt, {}, mask);
      CHECK(dt::live_saved_bytes().total() > before.total());
    }
    CHECK(dt::live_saved_bytes().total() == before.total());
  }
}
