// dropit::torch::checkpointed_graph: a planned run gives LibTorch's own gradients (the plain run is
// the oracle), keeps only the checkpoints between forward and backward (measured by the counting
// allocator), and rejects bad graphs and checkpoint sets. Planner v2: budget plans that keep and
// recompute give the plain run's gradients; a compressed Linear input gives the weight gradient of
// a brute-force top-k oracle and the exact input gradient; the bytes held after forward match the
// plan's model; bad sparse declarations throw.
#include <dropit/torch/checkpoint.hpp>
#include <dropit/torch/counting_allocator.hpp>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace {

namespace dt = dropit::torch;
using vertex = dt::checkpointed_graph::vertex;

/// max |a - b| / max(1, max |b|).
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.defined());
  REQUIRE(b.defined());
  REQUIRE(a.sizes() == b.sizes());
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() / scale;
}

/// A small ResNet-like DAG: a stem, two residual blocks (conv-bn-relu-conv-bn + skip, relu), a
/// block with two parallel branches concatenated, and a head that also reads the stem (a long
/// skip).
struct residual_net : torch::nn::Module {
  residual_net() {
    stem = register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    for (int b = 0; b < 2; ++b) {
      const std::string s = std::to_string(b);
      conv_a.push_back(register_module(
          "conv_a" + s, torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1))));
      bn_a.push_back(register_module("bn_a" + s, torch::nn::BatchNorm2d(8)));
      conv_b.push_back(register_module(
          "conv_b" + s, torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1))));
      bn_b.push_back(register_module("bn_b" + s, torch::nn::BatchNorm2d(8)));
    }
    left = register_module("left", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 4, 1)));
    right =
        register_module("right", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(8 * 8 * 8, 10));
  }

  /// The model as a checkpointed graph (its operations call this module's layers).
  dt::checkpointed_graph graph() {
    dt::checkpointed_graph g;
    vertex h = g.add("stem", {g.input()}, [this](auto& in) { return stem->forward(in[0]); });
    const vertex stem_out = h =
        g.add("stem_relu", {h}, [](auto& in) { return torch::relu(in[0]); });
    for (std::size_t b = 0; b < conv_a.size(); ++b) {
      const std::string s = std::to_string(b);
      const vertex skip = h;
      h = g.add("conv_a" + s, {h}, [this, b](auto& in) { return conv_a[b]->forward(in[0]); });
      h = g.add("bn_a" + s, {h}, [this, b](auto& in) { return bn_a[b]->forward(in[0]); });
      h = g.add("relu_a" + s, {h}, [](auto& in) { return torch::relu(in[0]); });
      h = g.add("conv_b" + s, {h}, [this, b](auto& in) { return conv_b[b]->forward(in[0]); });
      h = g.add("bn_b" + s, {h}, [this, b](auto& in) { return bn_b[b]->forward(in[0]); });
      h = g.add("add" + s, {h, skip}, [](auto& in) { return in[0] + in[1]; });
      h = g.add("relu" + s, {h}, [](auto& in) { return torch::relu(in[0]); });
    }
    const vertex l = g.add("left", {h}, [this](auto& in) { return left->forward(in[0]); });
    const vertex r =
        g.add("right", {h}, [this](auto& in) { return torch::tanh(right->forward(in[0])); });
    h = g.add("cat", {l, r}, [](auto& in) { return torch::cat({in[0], in[1]}, 1); });
    h = g.add("long_skip", {h, stem_out}, [](auto& in) { return in[0] * in[1].sigmoid(); });
    h = g.add("pool", {h}, [](auto& in) { return torch::avg_pool2d(in[0], 2).flatten(1); });
    g.add("fc", {h}, [this](auto& in) { return fc->forward(in[0]); });
    return g;
  }

  torch::nn::Conv2d stem{nullptr}, left{nullptr}, right{nullptr};
  std::vector<torch::nn::Conv2d> conv_a, conv_b;
  std::vector<torch::nn::BatchNorm2d> bn_a, bn_b;
  torch::nn::Linear fc{nullptr};
};

/// Loss, input gradient and every parameter's gradient of one forward + backward.
struct step_result {
  torch::Tensor loss, input_grad;
  std::map<std::string, torch::Tensor> grads;
};

step_result run_step(residual_net& net, const dt::checkpointed_graph& g, const torch::Tensor& x,
                     const torch::Tensor& y, bool plain, bool input_grad = true) {
  net.zero_grad();
  auto xi = x.clone().requires_grad_(input_grad);
  auto out = plain ? g.forward_plain(xi) : g.forward(xi);
  auto loss = torch::nn::functional::cross_entropy(out, y);
  loss.backward();
  step_result r{loss.detach(), input_grad ? xi.grad().clone() : torch::zeros_like(x), {}};
  for (const auto& p : net.named_parameters())
    r.grads[p.key()] = p.value().grad().clone();
  return r;
}

void check_same(const step_result& got, const step_result& want) {
  CHECK(rel_diff(got.loss, want.loss) <= 1e-6);
  CHECK(rel_diff(got.input_grad, want.input_grad) <= 1e-6);
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, grad] : want.grads) {
    CAPTURE(name);
    CHECK(rel_diff(got.grads.at(name), grad) <= 1e-6);
  }
}

/// Appends `depth` Linear(width, width) layers after h, named fc0, fc1, ..., each followed by a
/// tanh (tanh0, ...) when `tanh`; the modules are kept in `layers`. Returns the fc vertices.
std::vector<vertex> add_linear_chain(dt::checkpointed_graph& g, vertex h,
                                     std::vector<torch::nn::Linear>& layers, int depth, int width,
                                     bool tanh) {
  std::vector<vertex> fcs;
  for (int i = 0; i < depth; ++i) {
    layers.emplace_back(torch::nn::Linear(width, width));
    auto& layer = layers.back();
    h = g.add("fc" + std::to_string(i), {h},
              [layer](auto& in) mutable { return layer->forward(in[0]); });
    fcs.push_back(h);
    if (tanh)
      h = g.add("tanh" + std::to_string(i), {h}, [](auto& in) { return torch::tanh(in[0]); });
  }
  return fcs;
}

/// The residual net in training mode as a graph, a batch, and its plain step (the reference the
/// planned runs are compared with).
struct residual_case {
  residual_net net;
  dt::checkpointed_graph g;
  torch::Tensor x, y;
  step_result want;
  explicit residual_case(std::uint64_t seed) {
    torch::manual_seed(seed);
    net.train();
    g = net.graph();
    x = torch::randn({6, 1, 16, 16});
    y = torch::randint(0, 10, {6});
    want = run_step(net, g, x, y, /*plain=*/true);
  }
};

}  // namespace

TEST_CASE("checkpointed_graph: planned runs give the plain run's loss and gradients") {
  residual_case c(3);
  auto& [net, g, x, y, want] = c;

  SUBCASE("the optimal plan") {
    const auto& plan = g.plan(x);
    CHECK(plan.cost < plan.regular_cost);
    CHECK_FALSE(plan.checkpoints.empty());
    check_same(run_step(net, g, x, y, false), want);
  }
  SUBCASE("the optimal plan, input without grad (parameters still get theirs)") {
    g.plan(x);
    check_same(run_step(net, g, x, y, false, false), run_step(net, g, x, y, true, false));
  }
  SUBCASE("no checkpoint: everything is recomputed from the input") {
    g.use_checkpoints(x, {});
    check_same(run_step(net, g, x, y, false), want);
  }
  SUBCASE("every vertex a checkpoint: nothing is recomputed") {
    std::vector<vertex> all;
    for (vertex v = 1; v + 1 < g.size(); ++v)
      all.push_back(v);
    g.use_checkpoints(x, all);
    check_same(run_step(net, g, x, y, false), want);
  }
  SUBCASE("each block output a checkpoint (a hand-made plan)") {
    const auto measured = g.measure(x);
    std::vector<vertex> cps;
    for (const char* id : {"stem_relu", "relu0", "relu1", "cat", "long_skip"})
      cps.push_back(*measured.find(id));
    g.use_checkpoints(x, cps);
    check_same(run_step(net, g, x, y, false), want);
  }
  SUBCASE("grad mode off runs the plain path") {
    g.plan(x);
    const torch::NoGradGuard no_grad;
    net.eval();
    CHECK(rel_diff(g.forward(x), g.forward_plain(x)) == 0.0);
    CHECK_FALSE(g.forward(x).requires_grad());
  }
}

TEST_CASE("checkpointed_graph: the planner's graph has one vertex per tensor, costed in bytes") {
  residual_net net;
  auto g = net.graph();
  const auto x = torch::randn({2, 1, 16, 16});
  const auto measured = g.measure(x);
  CHECK(measured.vertex_count() == g.size());
  CHECK(measured.cost(*measured.find("stem")) == 2 * 8 * 16 * 16 * 4);
  CHECK(measured.cost(*measured.find("cat")) == 2 * 8 * 16 * 16 * 4);
  CHECK(measured.cost(*measured.find("fc")) == 2 * 10 * 4);
  CHECK(measured.source() == 0);
  CHECK(measured.target() == g.size() - 1);
}

TEST_CASE("checkpointed_graph: between forward and backward only the checkpoints stay alive") {
  // A deep chain of same-sized activations: the plain run keeps every one of them (each tanh saves
  // its output), a planned run keeps about sqrt(depth) of them.
  torch::manual_seed(5);
  constexpr int depth = 24;
  std::vector<torch::nn::Linear> layers;
  dt::checkpointed_graph g;
  add_linear_chain(g, g.input(), layers, depth, 256, true);
  const auto x = torch::randn({512, 256});  // 512 KiB per activation
  const std::size_t activation = 512 * 256 * 4;

  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  auto held_after_forward = [&](bool planned) {
    const std::size_t before = counter.current_bytes();
    auto out = planned ? g.forward(x) : g.forward_plain(x);
    const std::size_t held = counter.current_bytes() - before;
    counter.reset_peak();
    out.sum().backward();
    const std::size_t peak = counter.peak_bytes() - before;
    return std::pair{held, peak};
  };
  auto [plain_held, plain_peak] = held_after_forward(false);
  const auto& plan = g.plan(x);
  auto [planned_held, planned_peak] = held_after_forward(true);
  INFO("plain held " << plain_held << " B, planned held " << planned_held << " B, "
                     << plan.checkpoints.size() << " checkpoints");
  // Plain: each tanh saves its output, which the next fc saves as its input: at least one
  // activation per layer.
  CHECK(plain_held >= depth * activation);
  // Planned: the checkpoints and the output, nothing else of activation size.
  CHECK(planned_held <= (plan.checkpoints.size() + 1) * activation + activation / 2);
  CHECK(plan.checkpoints.size() < depth / 2);
  CHECK(planned_peak < plain_peak);
}

TEST_CASE("checkpointed_graph: bad graphs and checkpoint sets throw dropit::error") {
  dt::checkpointed_graph g;
  auto id = [](auto& in) { return in[0] * 2; };
  CHECK_THROWS_WITH_AS(g.forward(torch::ones({2})), doctest::Contains("no operation"),
                       dropit::error);
  CHECK_THROWS_WITH_AS(g.add("a", {}, id), doctest::Contains("has no input"), dropit::error);
  CHECK_THROWS_WITH_AS(g.add("a", {1}, id), doctest::Contains("not an earlier vertex"),
                       dropit::error);
  CHECK_THROWS_WITH_AS(g.add("a", {0}, nullptr), doctest::Contains("no operation"), dropit::error);
  const vertex a = g.add("a", {0}, id);
  CHECK_THROWS_WITH_AS(g.add("a", {a}, id), doctest::Contains("'a' is taken"), dropit::error);
  const vertex b = g.add("b", {a}, id);
  g.add("c", {b}, id);
  const auto x = torch::ones({4});
  const vertex input_as_checkpoint[] = {0};
  CHECK_THROWS_AS(g.use_checkpoints(x, input_as_checkpoint), dropit::error);
  const vertex twice[] = {a, a};
  CHECK_THROWS_AS(g.use_checkpoints(x, twice), dropit::error);
  CHECK_FALSE(g.current_plan().has_value());
  // A vertex that does not lead to the output is rejected by the planner's checks, by name.
  dt::checkpointed_graph dangling;
  const vertex d = dangling.add("dead_end", {0}, id);
  dangling.add("out", {0}, id);
  (void)d;
  CHECK_THROWS_WITH_AS(dangling.plan(x), doctest::Contains("dead_end"), dropit::error);
}

TEST_CASE("checkpointed_graph::replaying() is true only while measuring or recomputing") {
  torch::manual_seed(7);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 4, 3).padding(1));
  torch::nn::BatchNorm2d bn_plain(4), bn_planned(4);
  std::vector<bool> seen;
  // A batch norm that updates its running statistics in forward only (as the example's does).
  auto make = [&](torch::nn::BatchNorm2d bn) {
    dt::checkpointed_graph g;
    vertex h = g.add("conv", {g.input()}, [&](auto& in) { return conv->forward(in[0]); });
    h = g.add("bn", {h}, [bn, &seen](auto& in) {
      seen.push_back(dt::checkpointed_graph::replaying());
      const bool update = !dt::checkpointed_graph::replaying();
      const torch::Tensor none;
      return torch::batch_norm(in[0], bn->weight, bn->bias, update ? bn->running_mean : none,
                               update ? bn->running_var : none, true, 0.1, 1e-5, false);
    });
    h = g.add("relu", {h}, [](auto& in) { return torch::relu(in[0]); });
    g.add("sum", {h}, [](auto& in) { return in[0].sum(); });
    return g;
  };
  const auto x = torch::randn({3, 1, 8, 8});
  auto plain = make(bn_plain);
  plain.forward(x).backward();
  CHECK(seen == std::vector<bool>{false});
  seen.clear();
  auto planned = make(bn_planned);
  planned.use_checkpoints(x, {});  // everything is recomputed in backward
  // measuring: the op runs once to time it, once with autograd to size its backward and once
  // without, to see which tensors its backward keeps
  CHECK(seen == std::vector<bool>{true, true, true});
  seen.clear();
  CHECK_FALSE(dt::checkpointed_graph::replaying());
  planned.forward(x).backward();
  CHECK_FALSE(dt::checkpointed_graph::replaying());
  CHECK(seen == std::vector<bool>{false, true});  // forward, recompute
  CHECK(rel_diff(bn_planned->running_mean, bn_plain->running_mean) == 0.0);
  CHECK(rel_diff(bn_planned->running_var, bn_plain->running_var) == 0.0);
}

// ---- planner v2: budget plans, sparse storage ------------------------------------------------

TEST_CASE(
    "checkpointed_graph v2: a budget plan that only keeps and recomputes gives the plain "
    "run's gradients") {
  residual_case c(11);
  auto& [net, g, x, y, want] = c;
  const auto measured = g.measure(x);
  for (vertex v = 1; v < g.size(); ++v) {
    CAPTURE(v);
    CHECK(measured.has_time(v));
    CHECK(measured.time(v) >= 0.0);
    CHECK(measured.storage(v).empty());  // nothing declared sparse
  }
  const auto least = dropit::checkpoint::solve(measured).cost;
  const auto total = measured.total_cost();
  // The least budget, a middle one and everything: each plan is run and checked.
  for (const auto budget : {least, (least + total) / 2, total}) {
    CAPTURE(budget);
    const auto& plan = g.plan_budget(x, budget);
    CHECK(plan.cost <= budget);
    CHECK(plan.compressed.empty());
    if (budget == least) CHECK_FALSE(plan.segments.empty());  // something is recomputed
    check_same(run_step(net, g, x, y, false), want);
  }
  // The old planner's plan is unchanged by the measured times (solve ignores them).
  const auto& old = g.plan(x);
  CHECK(old.cost == least);
  check_same(run_step(net, g, x, y, false), want);
  // The frontier's first point is the least memory, its last needs no extra time.
  const auto f = g.frontier(x);
  REQUIRE_FALSE(f.points.empty());
  CHECK(f.points.front().memory == least);
  CHECK(f.points.back().extra_time == 0.0);
  CHECK_THROWS_WITH_AS(g.plan_budget(x, least - 1), doctest::Contains("least"), dropit::error);
}

namespace {

/// x -> fc1 (a) -> tanh of a's first half (h, declared sparse) -> fc2 -> out: h is read only as
/// fc2's input. a is twice h's size, so holding a and holding h differ.
struct sparse_mlp {
  sparse_mlp() : fc1(32, 48), fc2(24, 8) {}
  static torch::Tensor half_tanh(const torch::Tensor& a) { return torch::tanh(a.slice(1, 0, 24)); }
  dt::checkpointed_graph graph(bool declare_sparse) {
    dt::checkpointed_graph g;
    a = g.add("fc1", {g.input()}, [this](auto& in) { return fc1->forward(in[0]); });
    h = g.add("tanh", {a}, [](auto& in) { return half_tanh(in[0]); });
    g.add("fc2", {h}, [this](auto& in) { return fc2->forward(in[0]); });
    if (declare_sparse) g.allow_sparse(h, {dt::policy_kind::mink, 0.9});
    return g;
  }
  torch::nn::Linear fc1, fc2;
  vertex a = 0, h = 0;
};

/// x with all but its k largest magnitudes set to zero (torch::topk over the flattened tensor).
torch::Tensor brute_force_topk(const torch::Tensor& x, std::int64_t k) {
  const auto flat = x.flatten();
  const auto idx = std::get<1>(torch::topk(flat.abs(), k));
  return torch::zeros_like(flat).index_put_({idx}, flat.index({idx})).view_as(x);
}

}  // namespace

TEST_CASE(
    "checkpointed_graph v2: a compressed Linear input gives DropIT's weight gradient and the "
    "exact input gradient") {
  torch::manual_seed(13);
  sparse_mlp net;
  auto g = net.graph(true);
  const auto x = torch::randn({16, 32});
  const auto target = torch::randn({16, 8});
  const auto measured = g.measure(x);
  REQUIRE(measured.storage(net.h).size() == 1);
  CHECK(measured.storage(net.h)[0].name == "mink 0.9");
  CHECK(measured.storage(net.h)[0].bytes < measured.cost(net.h) / 2);

  // The oracle, written with LibTorch alone: fc2's weight sees the top 10% of h (k = n -
  // floor(0.9 n)), its input gradient is exact.
  auto oracle = [&] {
    for (auto& p : net.fc1->parameters())
      p.mutable_grad() = torch::Tensor();
    for (auto& p : net.fc2->parameters())
      p.mutable_grad() = torch::Tensor();
    auto xi = x.clone().requires_grad_(true);
    const auto h = sparse_mlp::half_tanh(net.fc1->forward(xi));
    const std::int64_t n = h.numel(), k = n - static_cast<std::int64_t>(
                                                  std::floor(0.9 * static_cast<double>(n) + 1e-6));
    const auto hs = brute_force_topk(h.detach(), k);
    const auto w = net.fc2->weight, b = net.fc2->bias;
    const auto out =
        torch::linear(h, w.detach(), b) + torch::linear(hs, w) - torch::linear(hs, w.detach());
    (out - target).square().sum().backward();
    return std::vector<torch::Tensor>{xi.grad().clone(), net.fc1->weight.grad().clone(),
                                      net.fc1->bias.grad().clone(), net.fc2->weight.grad().clone(),
                                      net.fc2->bias.grad().clone()};
  };
  auto planned = [&] {
    for (auto& p : net.fc1->parameters())
      p.mutable_grad() = torch::Tensor();
    for (auto& p : net.fc2->parameters())
      p.mutable_grad() = torch::Tensor();
    auto xi = x.clone().requires_grad_(true);
    (g.forward(xi) - target).square().sum().backward();
    return std::vector<torch::Tensor>{xi.grad().clone(), net.fc1->weight.grad().clone(),
                                      net.fc1->bias.grad().clone(), net.fc2->weight.grad().clone(),
                                      net.fc2->bias.grad().clone()};
  };
  const auto want = oracle();
  // Sanity: the sparse weight gradient differs from the dense one (the test can tell them apart).
  {
    for (auto& p : net.fc2->parameters())
      p.mutable_grad() = torch::Tensor();
    (g.forward_plain(x) - target).square().sum().backward();
    CHECK(rel_diff(net.fc2->weight.grad(), want[3]) > 1e-2);
  }
  const char* names[] = {"input", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  auto check_all = [&](const std::vector<torch::Tensor>& got) {
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(names[i]);
      CHECK(rel_diff(got[i], want[i]) <= 1e-5);
    }
  };

  SUBCASE("a hand-made plan: h compressed, fc1 recomputed from the input") {
    const dropit::checkpoint::compression c[] = {{net.h, 0}};
    const auto& plan = g.use_plan(x, {}, c);
    REQUIRE(plan.compressed.size() == 1);
    CHECK(plan.decisions[net.h] == dropit::checkpoint::decision::compress);
    check_all(planned());
    // The output's node frees h's pack in its backward: a second backward is refused.
    auto loss = (g.forward(x.clone().requires_grad_(true)) - target).square().sum();
    loss.backward({}, /*retain_graph=*/true);
    CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("backward ran twice"), dropit::error);
  }
  SUBCASE("a budget plan that compresses h") {
    // No plan that stores h exactly fits (it holds h and a, or recomputes a segment of a's size
    // next to h, or a segment of both); the fastest that fits keeps a and compresses h.
    const auto& plan = g.plan_budget(x, measured.cost(net.a) + measured.storage(net.h)[0].bytes);
    REQUIRE(plan.compressed.size() == 1);
    CHECK(plan.compressed[0].vertex == net.h);
    CHECK(plan.decisions[net.a] == dropit::checkpoint::decision::keep);
    check_all(planned());
    // Between forward and backward: the kept tensors, h's pack and the output, not h itself
    // (tanh's backward would read its dense output if tanh ran with autograd in forward).
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    const std::size_t before = counter.current_bytes();
    auto out = g.forward(x);
    const std::size_t held = counter.current_bytes() - before;
    const auto model =
        static_cast<std::size_t>(plan.checkpoint_cost + plan.compressed_cost) + out.nbytes();
    INFO("held " << held << " B, model " << model << " B, kept " << plan.checkpoints.size()
                 << ", segments " << plan.segments.size());
    CHECK(held <= model + 512);
    CHECK(held + 512 >= model);
  }
}

TEST_CASE("checkpointed_graph v2: between forward and backward a plan holds what its model says") {
  // A chain of Linear layers, each output but the last storable sparse (its reader is a Linear):
  // packing one costs far less time than recomputing it, so the least-memory plan compresses.
  torch::manual_seed(17);
  constexpr int depth = 8;
  std::vector<torch::nn::Linear> layers;
  dt::checkpointed_graph g;
  const auto fcs = add_linear_chain(g, g.input(), layers, depth, 1024, false);
  for (int i = 0; i + 1 < depth; ++i)
    g.allow_sparse(fcs[static_cast<std::size_t>(i)], {dt::policy_kind::mink, 0.9});
  const auto x = torch::randn({64, 1024});
  auto held_after_forward = [&](const dropit::checkpoint::plan& plan) {
    INFO(plan.checkpoints.size() << " kept, " << plan.compressed.size() << " compressed, "
                                 << plan.segments.size() << " segments");
    REQUIRE_FALSE(plan.compressed.empty());
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    const std::size_t before = counter.current_bytes();
    const auto sparse_before = dt::live_saved_bytes().sparse;
    auto out = g.forward(x);
    const std::size_t held = counter.current_bytes() - before;
    const std::size_t packs = dt::live_saved_bytes().sparse - sparse_before;
    // The model: kept + compressed; the output is counted apart (the planner does not count it).
    const auto model =
        static_cast<std::size_t>(plan.checkpoint_cost + plan.compressed_cost) + out.nbytes();
    INFO("held " << held << " B, model " << model << " B");
    CHECK(packs == static_cast<std::size_t>(plan.compressed_cost));
    CHECK(static_cast<double>(held) >= 0.99 * static_cast<double>(model));
    CHECK(static_cast<double>(held) <= 1.01 * static_cast<double>(model) + 4096);
    out.sum().backward();
    CHECK(dt::live_saved_bytes().sparse == sparse_before);  // every pack freed after backward
  };
  SUBCASE("the least-memory plan (it compresses)") {
    const auto f = g.frontier(x);
    REQUIRE(f.points.size() >= 2);
    held_after_forward(g.plan_budget(x, f.points.front().memory));
  }
  SUBCASE("a hand-made plan: kept, compressed and recomputed tensors") {
    const auto measured = g.measure(x);
    std::vector<vertex> kept;
    for (const char* id : {"fc1", "fc5"})
      kept.push_back(*measured.find(id));
    const dropit::checkpoint::compression compressed[] = {{*measured.find("fc0"), 0},
                                                          {*measured.find("fc4"), 0}};
    held_after_forward(g.use_plan(x, kept, compressed));
  }
}

TEST_CASE("checkpointed_graph v2: bad sparse declarations and plans throw dropit::error") {
  dt::checkpointed_graph g;
  auto id = [](auto& in) { return in[0] * 2; };
  const vertex a = g.add("a", {0}, id);
  const vertex b = g.add("b", {a}, id);
  const dt::policy mink{dt::policy_kind::mink, 0.9};
  CHECK_THROWS_WITH_AS(g.allow_sparse(0, mink), doctest::Contains("is the input"), dropit::error);
  CHECK_THROWS_WITH_AS(g.allow_sparse(7, mink), doctest::Contains("not a vertex"), dropit::error);
  CHECK_THROWS_WITH_AS(g.allow_sparse(a, dt::policy{}), doctest::Contains("'none'"), dropit::error);
  CHECK_THROWS_AS(g.allow_sparse(a, {dt::policy_kind::mink, 1.5}), dropit::error);
  CHECK_FALSE(g.sparse_policy(a).has_value());
  const auto x = torch::randn({4, 8});
  // The output may not be stored sparse.
  g.allow_sparse(b, mink);
  CHECK_THROWS_WITH_AS(g.plan_budget(x, 1 << 20), doctest::Contains("'b' is the output"),
                       dropit::error);
  CHECK_THROWS_WITH_AS(g.measure(x), doctest::Contains("is the output"), dropit::error);
  CHECK_THROWS_WITH_AS(g.measure(x, 0), doctest::Contains("runs"), dropit::error);
  const vertex c = g.add("c", {b}, id);
  (void)c;
  // A vertex without a storage option cannot be compressed.
  const dropit::checkpoint::compression bad[] = {{a, 0}};
  CHECK_THROWS_AS(g.use_plan(x, {}, bad), dropit::error);
  CHECK_FALSE(g.current_plan().has_value());
  // A compressed vertex that feeds a dropped one is not a plan.
  const dropit::checkpoint::compression feeds_dropped[] = {{b, 0}};
  CHECK_NOTHROW(g.use_plan(x, std::vector<vertex>{}, feeds_dropped));  // c is the output: fine
  g.allow_sparse(a, mink);
  const dropit::checkpoint::compression a_feeds_b[] = {{a, 0}};
  CHECK_THROWS_AS(g.use_plan(x, {}, a_feeds_b), dropit::error);  // b would be dropped
}

namespace {

/// Convolutions whose batch norm + ReLU (and residual addition) are one vertex each: the graph's
/// tensors are those autograd keeps, as `checkpoint::simulate_step` assumes.
struct fused_net : torch::nn::Module {
  explicit fused_net(int blocks) {
    for (int i = 0; i < 2 * blocks + 1; ++i) {
      const std::string s = std::to_string(i);
      convs.push_back(register_module(
          "conv" + s,
          torch::nn::Conv2d(torch::nn::Conv2dOptions(i == 0 ? 1 : 16, 16, 3).padding(1))));
      bns.push_back(register_module("bn" + s, torch::nn::BatchNorm2d(16)));
    }
    fc = register_module("fc", torch::nn::Linear(16 * 14 * 14, 10));
  }

  /// `sparse`: the ReLUs read by a convolution only may be stored sparse; `sparse_skips`: the
  /// residual blocks' inputs too (read by a convolution and the addition); `additions`: each
  /// block's last batch norm, residual addition and ReLU are three vertices.
  dt::checkpointed_graph graph(bool sparse, bool sparse_skips = false, bool additions = false) {
    dt::checkpointed_graph g;
    auto conv = [&](std::size_t l, vertex in) {
      return g.add("conv" + std::to_string(l), {in},
                   [this, l](auto& x) { return convs[l]->forward(x[0]); });
    };
    vertex h = conv(0, g.input());
    h = g.add("relu0", {h}, [this](auto& x) { return torch::relu(bns[0]->forward(x[0])); });
    for (std::size_t b = 0; 2 * b + 2 < convs.size(); ++b) {
      const std::size_t l = 2 * b + 1;
      const vertex skip = h;
      if (sparse_skips) g.allow_sparse(skip, {dt::policy_kind::mink, 0.9});
      h = conv(l, h);
      h = g.add("relu" + std::to_string(l), {h},
                [this, l](auto& x) { return torch::relu(bns[l]->forward(x[0])); });
      if (sparse) g.allow_sparse(h, {dt::policy_kind::mink, 0.9});  // read by a conv only
      h = conv(l + 1, h);
      if (additions) {
        h = g.add("bn" + std::to_string(l + 1), {h},
                  [this, l](auto& x) { return bns[l + 1]->forward(x[0]); });
        h = g.add("add" + std::to_string(b), {h, skip}, [](auto& x) { return x[0] + x[1]; });
        h = g.add("relu" + std::to_string(l + 1), {h}, [](auto& x) { return torch::relu(x[0]); });
        continue;
      }
      h = g.add("relu" + std::to_string(l + 1), {h, skip},
                [this, l](auto& x) { return torch::relu(bns[l + 1]->forward(x[0]) + x[1]); });
    }
    h = g.add("pool", {h}, [](auto& x) { return torch::avg_pool2d(x[0], 2).flatten(1); });
    g.add("fc", {h}, [this](auto& x) { return fc->forward(x[0]); });
    return g;
  }

  std::vector<torch::nn::Conv2d> convs;
  std::vector<torch::nn::BatchNorm2d> bns;
  torch::nn::Linear fc{nullptr};
};

}  // namespace

TEST_CASE("checkpointed_graph: the modelled step peak is the counting allocator's, within 3%") {
  torch::manual_seed(5);
  fused_net net(3);
  net.train();
  dt::checkpointed_graph g = net.graph(true);
  const auto x = torch::randn({64, 1, 28, 28});
  const auto y = torch::randint(10, {64});
  auto measured = g.measure(x);
  // measure() runs every operation's backward to size its workspace, without touching the
  // parameters' gradients.
  for (const auto& p : net.parameters())
    CHECK_FALSE(p.grad().defined());
  CHECK(measured.workspace(*measured.find("conv1")) > 0);
  // What each backward keeps, as LibTorch's derivatives define it: a convolution keeps its input
  // (and weight), not its output; batch norm + ReLU keeps its input (batch norm's) and its output
  // (ReLU's); the residual addition keeps neither of its inputs, so the skip tensor is not kept
  // by the block's last vertex.
  const auto at = [&](const char* id) { return *measured.find(id); };
  CHECK(measured.saves(at("conv1"), at("relu0")));
  CHECK_FALSE(measured.saves(at("conv1"), at("conv1")));
  CHECK(measured.saves(at("relu1"), at("conv1")));
  CHECK(measured.saves(at("relu1"), at("relu1")));
  CHECK(measured.saves(at("relu2"), at("conv2")));
  CHECK_FALSE(measured.saves(at("relu2"), at("relu0")));
  // A ReLU's backward consumes its output's gradient first; a convolution's holds it to the end.
  CHECK(measured.frees_gradient_early(at("relu1")));
  CHECK_FALSE(measured.frees_gradient_early(at("conv1")));
  auto step_peak = [&](const dropit::checkpoint::plan& plan) {
    const auto model = dropit::checkpoint::simulate_step(measured, plan);
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    net.zero_grad();
    const std::size_t before = counter.reset_peak();
    auto loss = torch::nn::functional::cross_entropy(g.forward(x), y);
    const std::size_t held = counter.current_bytes() - before;
    loss.backward();
    const std::size_t peak = counter.peak_bytes() - before;
    INFO(plan.checkpoints.size() << " kept, " << plan.compressed.size() << " compressed; held "
                                 << held << " B (model " << model.stored << "), peak " << peak
                                 << " B (model " << model.peak << ")");
    CHECK(std::abs(static_cast<double>(held) / static_cast<double>(model.stored) - 1.0) <= 0.02);
    CHECK(std::abs(static_cast<double>(peak) / static_cast<double>(model.peak) - 1.0) <= 0.03);
  };
  SUBCASE("everything kept") {
    // Plain autograd ops: each batch norm + ReLU frees its output's gradient before its peak.
    std::vector<vertex> all;
    for (vertex v = 1; v + 1 < g.size(); ++v)
      all.push_back(v);
    step_peak(g.use_checkpoints(x, all));
  }
  SUBCASE("recomputed convolutions: freed after their reader's backward") {
    // Each residual block's second convolution is recomputed in its block's node; the
    // convolution does not keep its output, so the recomputed tensor goes with the batch norm's
    // backward, before the convolution's own (one activation less than keeping it to there).
    std::vector<vertex> kept;
    for (vertex v = 1; v + 1 < g.size(); ++v) {
      const std::string& name = measured.id(v);
      if (name != "conv2" && name != "conv4" && name != "conv6") kept.push_back(v);
    }
    const auto& plan = g.use_checkpoints(x, kept);
    REQUIRE(plan.segments.size() == 3);
    step_peak(plan);
  }
  SUBCASE("the residual additions read their skip entries from packs") {
    // A node that restores its entries hands their gradients over through sinks: an addition's
    // backward gives the skip entry and the batch norm one tensor, which the entry's
    // AccumulateGrad would have copied (one activation more than the model counts).
    g = net.graph(true, true);
    measured = g.measure(x);
    const auto& m = measured;
    std::vector<vertex> kept;
    std::vector<dropit::checkpoint::compression> packed;
    for (vertex v = 1; v + 1 < g.size(); ++v) {
      const std::string& name = m.id(v);
      if (name == "relu0" || name == "relu2" || name == "relu4") {
        packed.push_back({v, 0});
      } else {
        kept.push_back(v);
      }
    }
    step_peak(g.use_plan(x, kept, packed));
  }
  SUBCASE("additions of their own hand their output gradient to both inputs") {
    g = net.graph(true, false, true);
    measured = g.measure(x);
    // An addition's backward returns its output's gradient itself for both inputs: no new
    // memory. Batch norm, ReLU and convolution compute new gradients.
    CHECK(measured.passes_gradient(at("add0"), at("bn2")));
    CHECK(measured.passes_gradient(at("add0"), at("relu0")));
    CHECK(measured.passed_gradients(at("relu2")).empty());
    CHECK(measured.passed_gradients(at("bn2")).empty());
    CHECK(measured.passed_gradients(at("conv2")).empty());
    CHECK_FALSE(measured.saves(at("add0"), at("bn2")));
    // The plans whose backward peaks where an addition's gradients matter: there the model
    // without the passed gradients (each counted as new memory) is more than 5% over.
    auto without = measured;
    for (vertex v = 0; v < g.size(); ++v)
      without.set_passes_gradient(v, {});
    std::vector<dropit::checkpoint::plan> plans;
    for (const auto& point : dropit::checkpoint::solve_frontier(measured).points) {
      auto plan = dropit::checkpoint::solve_budget(measured, point.memory);
      const auto with_passes = dropit::checkpoint::simulate_step(measured, plan).peak;
      if (static_cast<double>(dropit::checkpoint::simulate_step(without, plan).peak) >
          1.05 * static_cast<double>(with_passes))
        plans.push_back(std::move(plan));
    }
    REQUIRE(plans.size() >= 2);
    for (const auto* plan : {&plans.front(), &plans.back()})
      step_peak(g.use_plan(x, plan->checkpoints, plan->compressed));
  }
  const auto f = g.frontier(x);
  REQUIRE(f.points.size() >= 3);
  SUBCASE("the least memory (recomputes and compresses)") {
    const auto& plan = g.plan_budget(x, f.points.front().memory);
    REQUIRE_FALSE(plan.segments.empty());
    step_peak(plan);
  }
  SUBCASE("the middle of the frontier") {
    step_peak(g.plan_budget(x, f.points[f.points.size() / 2].memory));
  }
  SUBCASE("a step budget: the fastest frontier plan whose modelled peak fits") {
    std::vector<vertex> all;
    for (vertex v = 1; v + 1 < g.size(); ++v)
      all.push_back(v);
    const auto plain = dropit::checkpoint::simulate_step(measured, g.use_checkpoints(x, all)).peak;
    const auto budget = plain * 3 / 4;
    const auto& plan = g.plan_step_budget(x, budget);
    CHECK(dropit::checkpoint::simulate_step(measured, plan).peak <= budget);
    step_peak(plan);
  }
}

TEST_CASE("checkpointed_graph: a tensor read by two operations gets its second gradient summed") {
  // h feeds two convolutions: the second backward computes a new gradient of h while h already
  // has one, and autograd adds it in after that backward: both live at its peak. The model
  // without that second gradient was 0.81x the counting allocator's peak here.
  torch::manual_seed(3);
  torch::nn::Conv2d c0(torch::nn::Conv2dOptions(1, 32, 3).padding(1));
  torch::nn::Conv2d c1(torch::nn::Conv2dOptions(32, 4, 3).padding(1));
  torch::nn::Conv2d c2(torch::nn::Conv2dOptions(32, 4, 3).padding(1));
  torch::nn::Linear fc(4 * 28 * 28, 10);
  dt::checkpointed_graph g;
  const vertex h = g.add("h", {g.input()}, [&](auto& x) { return c0->forward(x[0]); });
  const vertex a = g.add("a", {h}, [&](auto& x) { return c1->forward(x[0]); });
  const vertex b = g.add("b", {h}, [&](auto& x) { return c2->forward(x[0]); });
  const vertex m = g.add("m", {a, b}, [&](auto& x) { return torch::relu(x[0] * x[1]); });
  g.add("fc", {m}, [&](auto& x) { return fc->forward(x[0].flatten(1)); });
  const auto x = torch::randn({64, 1, 28, 28});
  const auto y = torch::randint(10, {64});
  const auto measured = g.measure(x);
  const auto check = [&](const dropit::checkpoint::plan& plan) {
    const auto model = dropit::checkpoint::simulate_step(measured, plan);
    dt::counting_allocator counter;
    dt::cpu_allocator_guard install(counter);
    const std::size_t before = counter.reset_peak();
    auto loss = torch::nn::functional::cross_entropy(g.forward(x), y);
    loss.backward();
    const std::size_t peak = counter.peak_bytes() - before;
    INFO("peak " << peak << " B, model " << model.peak << " B at "
                 << measured.id(model.peak_vertex));
    CHECK(std::abs(static_cast<double>(peak) / static_cast<double>(model.peak) - 1.0) <= 0.03);
  };
  std::vector<vertex> all;
  for (vertex v = 1; v + 1 < g.size(); ++v)
    all.push_back(v);
  check(g.use_checkpoints(x, all));  // measured: 1.004x the model
  const std::vector<vertex> without_a{h, b, m};
  check(g.use_checkpoints(x, without_a));  // a recomputed in m's node
}
