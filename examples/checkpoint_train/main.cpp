// Trains a small ResNet on Fashion-MNIST twice from the same initial weights: once plainly, once
// with the optimal checkpoint plan (dropit::checkpoint::solve on the model's tensor graph, run by
// dropit::torch::checkpointed_graph), and prints what each run measured: the counting allocator's
// peak during a training step, the bytes held between forward and backward, the step time, and the
// test accuracy.
//
//   checkpoint_train [--epochs E] [--limit N] [--batch-size B] [--width C] [--lr LR] [--seed S]
//                    [--threads T] [--data DIR] [--csv FILE] [--min-accuracy P]
//                    [--budget MiB[,MiB...]] [--recompute-only] [--fuse]
//
// Exits 1 if the planned run does not hold less memory than the plain one, if the two runs'
// test accuracies differ by a point or more, or if either is below --min-accuracy (percent).
//
// With --budget (planner v2, repeatable or a comma-separated list): prints the model's
// (memory, extra time) frontier, then trains the plain run and one run per budget with
// `checkpointed_graph::plan_budget`, every conv/linear input declared storable sparse (MinK 0.9;
// not with --recompute-only), and prints per run the planned memory, the measured step peak and
// bytes held after forward, the planned extra time, the step time and the test accuracy. Exits 1
// if a run is below --min-accuracy, if a run holds more after forward than its plan stores (1% +
// 0.05 MiB of slack for the output and the loss; with --fuse, also if it holds less), or if a run
// that compresses nothing differs from the plain run's test accuracy by a point or more (its
// gradients are the plain run's).
//
// Every run also prints its step peak modelled by `checkpoint::simulate_step` (from what
// `measure` found each operation's backward keeps, allocates, frees early and passes through) and
// exits 1 if the measured peak is more than 3% off it.
//
// --fuse: each batch norm and the ReLU after it (with the residual addition between them) are one
// vertex of the graph, so that the graph's tensors are those autograd keeps.
//
// --step-budget: the budgets bound the modelled step peak (`plan_step_budget`), not the planner's
// memory (`plan_budget`); exits 1 if a run's modelled peak is over its budget.
#include <dropit/torch/checkpoint.hpp>
#include <dropit/torch/counting_allocator.hpp>

#include "../fashion_mnist/data.hpp"
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

/// Today's date (UTC) as YYYY-MM-DD, for the CSV files.
std::string today() {
  const std::time_t now = std::time(nullptr);
  char date[16];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  return date;
}

namespace dt = dropit::torch;
using vertex = dt::checkpointed_graph::vertex;

/// A ResNet for 28x28 images: stem, two residual blocks at width c (28x28), a stride-2
/// transition to 2c, two residual blocks at 14x14, a 2x2 average pool to 7x7 and a linear
/// classifier on the 2c x 7 x 7 features. Each tensor of the forward pass is one vertex of the
/// graph, so the planner sees the real DAG.
///
/// The head keeps the 7x7 layout: a global average pool over the 2c channels learns far more
/// slowly at this width (measured at the smoke test's size, 12 steps of 64 samples at width 8:
/// 17-30% test accuracy over three seeds, against 65-68% with this head).
struct resnet : torch::nn::Module {
  explicit resnet(std::int64_t c) {
    using namespace torch::nn;
    auto conv = [&](const std::string& name, std::int64_t in, std::int64_t out,
                    std::int64_t stride) {
      return register_module(
          name, Conv2d(Conv2dOptions(in, out, 3).padding(1).stride(stride).bias(false)));
    };
    auto bn = [&](const std::string& name, std::int64_t ch) {
      return register_module(name, BatchNorm2d(ch));
    };
    convs.push_back(conv("stem", 1, c, 1));
    bns.push_back(bn("stem_bn", c));
    const std::int64_t widths[] = {c, c, 2 * c, 2 * c, 2 * c};
    for (int i = 0; i < 5; ++i) {
      const std::string s = std::to_string(i);
      const std::int64_t in = i == 0 ? c : widths[i - 1];
      convs.push_back(conv("conv_a" + s, in, widths[i], i == 2 ? 2 : 1));
      bns.push_back(bn("bn_a" + s, widths[i]));
      if (i == 2) continue;  // the transition: conv, bn, relu
      convs.push_back(conv("conv_b" + s, widths[i], widths[i], 1));
      bns.push_back(bn("bn_b" + s, widths[i]));
    }
    fc = register_module("fc", Linear(2 * c * 7 * 7, 10));
  }

  /// The model's graph; with `sparse`, every inner tensor that only convolutions, the linear
  /// layer and additions read (a conv/linear input: its readers' input gradients do not depend
  /// on it, and an addition's backward reads nothing) may be stored sparse with that policy.
  ///
  /// With `fused`, a batch norm and the ReLU after it (and the block's addition between them)
  /// are one vertex: the batch norm's and the addition's outputs, which no backward reads, are
  /// then not tensors of the graph.
  dt::checkpointed_graph graph(std::optional<dt::policy> sparse = std::nullopt,
                               bool fused = false) {
    dt::checkpointed_graph g("image");
    std::size_t layer = 0;
    auto conv = [&](const std::string& name, vertex in) {
      const std::size_t l = layer++;
      return std::pair{g.add(name, {in}, [this, l](auto& x) { return convs[l]->forward(x[0]); }),
                       l};
    };
    auto conv_bn = [&](const std::string& name, vertex in) {
      const auto [cv, l] = conv(name, in);
      return g.add(name + "_bn", {cv}, [this, l](auto& x) { return batch_norm(l, x[0]); });
    };
    auto relu = [&](const std::string& name, vertex in) {
      return g.add(name, {in}, [](auto& x) { return torch::relu(x[0]); });
    };
    // conv, batch norm, ReLU
    auto conv_bn_relu = [&](const std::string& name, const std::string& relu_name, vertex in) {
      if (!fused) return relu(relu_name, conv_bn(name, in));
      const auto [cv, l] = conv(name, in);
      return g.add(relu_name, {cv},
                   [this, l](auto& x) { return torch::relu(batch_norm(l, x[0])); });
    };
    // conv, batch norm, + skip, ReLU
    auto conv_bn_add_relu = [&](const std::string& name, const std::string& s, vertex in,
                                vertex skip) {
      if (!fused) {
        const vertex b = conv_bn(name, in);
        return relu("relu" + s, g.add("add" + s, {b, skip}, [](auto& x) { return x[0] + x[1]; }));
      }
      const auto [cv, l] = conv(name, in);
      return g.add("relu" + s, {cv, skip},
                   [this, l](auto& x) { return torch::relu(batch_norm(l, x[0]) + x[1]); });
    };
    auto sparse_ok = [&](vertex v) {
      if (sparse) g.allow_sparse(v, *sparse);
    };
    vertex h = conv_bn_relu("stem", "stem_relu", g.input());
    for (int i = 0; i < 5; ++i) {
      const std::string s = std::to_string(i);
      sparse_ok(h);  // read by conv_a (and the block's addition)
      const vertex skip = h;
      h = conv_bn_relu("conv_a" + s, "relu_a" + s, h);
      if (i == 2) continue;
      sparse_ok(h);  // read by conv_b only
      h = conv_bn_add_relu("conv_b" + s, s, h, skip);
    }
    h = g.add("pool", {h}, [](auto& x) { return torch::avg_pool2d(x[0], 2).flatten(1); });
    sparse_ok(h);  // read by fc only
    g.add("fc", {h}, [this](auto& x) { return fc->forward(x[0]); });
    return g;
  }

  /// BatchNorm2d's forward (running statistics and `num_batches_tracked` included), except that a
  /// replay (recomputation in backward, measuring) does not update the running statistics: the
  /// output is the same, since training mode normalises with the batch's own statistics.
  torch::Tensor batch_norm(std::size_t l, const torch::Tensor& x) {
    auto& bn = bns[l];
    const bool replay = is_training() && dt::checkpointed_graph::replaying();
    double factor = bn->options.momentum().value_or(0.0);
    if (is_training() && !replay) {
      bn->num_batches_tracked += 1;
      if (!bn->options.momentum())  // no momentum: the cumulative average
        factor = 1.0 / bn->num_batches_tracked.item<double>();
    }
    const torch::Tensor none;
    return torch::batch_norm(x, bn->weight, bn->bias, replay ? none : bn->running_mean,
                             replay ? none : bn->running_var, is_training(), factor,
                             bn->options.eps(), false);
  }

  /// Recomputes every batch norm's running statistics for the current weights: their average
  /// over the given training batches (forward passes in training mode, without autograd).
  /// The running averages kept during training mix in the statistics of earlier weights, and
  /// after a short run they still hold part of their initial values (0.9^12 = 28% after 12
  /// steps): the README's run of the former version of this example measured 50.5% test
  /// accuracy with them and 74.2% with recomputed ones (the weights were the same).
  void recalibrate_batch_norm(const dt::checkpointed_graph& g,
                              const std::vector<torch::Tensor>& batches) {
    const torch::NoGradGuard no_grad;
    train();
    std::vector<c10::optional<double>> momenta;
    for (auto& bn : bns) {
      momenta.push_back(bn->options.momentum());
      bn->options.momentum(c10::nullopt);
      bn->reset_running_stats();
    }
    for (const torch::Tensor& x : batches)
      (void)g.forward(x);
    for (std::size_t l = 0; l < bns.size(); ++l)
      bns[l]->options.momentum(momenta[l]);
  }

  std::vector<torch::nn::Conv2d> convs;
  std::vector<torch::nn::BatchNorm2d> bns;
  torch::nn::Linear fc{nullptr};
};

struct options {
  std::vector<double> budgets_mib;  // --budget: one run per budget (planner v2)
  bool recompute_only = false;      // --recompute-only: no tensor declared sparse
  bool fused = false;               // --fuse: batch norm + ReLU vertices (resnet::graph)
  bool step_budget = false;         // --step-budget: budgets bound the modelled step peak
  int epochs = 1;
  std::int64_t limit = 12000, batch = 128, width = 16, threads = 2;
  double lr = 0.01, min_accuracy = 0.0;
  std::uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist", csv, command;
};

/// Training samples over which the batch norms' statistics are recomputed before evaluation.
constexpr std::int64_t recalibration_samples = 4096;

struct run_result {
  std::string mode;
  double accuracy = 0, step_ms = 0, predicted_mib = 0, regular_mib = 0;
  std::size_t step_peak = 0, held = 0, checkpoints = 0, steps = 0;
  // Planner v2 runs (--budget): the budget, what the plan stores between forward and backward
  // (kept + compressed) and its largest segment, its tensors by decision, its extra time.
  double budget_mib = 0, stored_mib = 0, segment_mib = 0, extra_ms = 0;
  // The step peak `checkpoint::simulate_step` models for the run's plan (all kept when plain).
  double model_peak_mib = 0;
  std::size_t compressed = 0, dropped = 0;
};

double mib(std::size_t b) {
  return static_cast<double>(b) / (1 << 20);
}

/// The MinK 0.9 policy of the tensors a v2 plan may store sparse (none with --recompute-only).
std::optional<dt::policy> sparse_policy(const options& o) {
  if (o.recompute_only) return std::nullopt;
  return dt::policy{dt::policy_kind::mink, 0.9};
}

/// One of the runs: its model (same initial weights in all), graph, optimizer and numbers.
struct run {
  /// budget_mib < 0: the plain run (planned false) or the optimal plan (planned true); else the
  /// v2 plan with the least extra time within the budget.
  run(bool planned, const options& o, const torch::Tensor& example, double budget_mib = -1.0)
      : net((torch::manual_seed(o.seed), std::make_shared<resnet>(o.width))),
        g(net->graph(budget_mib >= 0 ? sparse_policy(o) : std::nullopt, o.fused)),
        opt(net->parameters(), torch::optim::SGDOptions(o.lr).momentum(0.9)) {
    r.mode = planned ? "planned" : "plain";
    const auto measured = g.measure(example);
    r.regular_mib = mib(measured.total_cost());
    r.predicted_mib = r.regular_mib;
    {
      // The plain run in the step model: every vertex kept, every node a plain autograd op.
      std::vector<vertex> all;
      for (vertex v = 1; v + 1 < g.size(); ++v)
        all.push_back(v);
      r.model_peak_mib = mib(
          dropit::checkpoint::simulate_step(measured, dropit::checkpoint::evaluate(measured, all))
              .peak);
    }
    if (budget_mib >= 0) {
      char name[48];
      std::snprintf(name, sizeof name, "budget %.1f MiB", budget_mib);
      r.mode = name;
      r.budget_mib = budget_mib;
      const auto bytes = static_cast<dropit::checkpoint::cost_t>(budget_mib * 1024.0 * 1024.0);
      const auto& plan =
          o.step_budget ? g.plan_step_budget(example, bytes) : g.plan_budget(example, bytes);
      r.predicted_mib = mib(plan.cost);
      r.model_peak_mib = mib(dropit::checkpoint::simulate_step(measured, plan).peak);
      r.stored_mib = mib(plan.checkpoint_cost + plan.compressed_cost);
      r.segment_mib = mib(plan.max_segment_cost);
      r.checkpoints = plan.checkpoints.size();
      r.compressed = plan.compressed.size();
      r.dropped = static_cast<std::size_t>(std::count(plan.decisions.begin(), plan.decisions.end(),
                                                      dropit::checkpoint::decision::drop));
      r.extra_ms = plan.extra_time * 1e3;
      std::printf(
          "plan for %.1f MiB: %zu kept, %zu compressed, %zu recomputed of %zu tensors; planned "
          "%.1f MiB (stored %.1f + largest segment %.1f), modelled step peak %.1f MiB, extra "
          "time %.1f ms\n",
          budget_mib, r.checkpoints, r.compressed, r.dropped, g.size(), r.predicted_mib,
          r.stored_mib, r.segment_mib, r.model_peak_mib, r.extra_ms);
      return;
    }
    if (!planned) return;
    const auto& plan = g.plan(example);
    r.predicted_mib = mib(plan.cost);
    r.checkpoints = plan.checkpoints.size();
    std::printf(
        "plan: %zu checkpoints of %zu tensors, predicted %.1f MiB vs %.1f MiB regular "
        "(solved in %.2f ms)\n",
        plan.checkpoints.size(), g.size(), r.predicted_mib, r.regular_mib,
        plan.solve_seconds * 1e3);
  }

  /// One SGD step on (x, y), measured; returns the loss.
  double step(const torch::Tensor& x, const torch::Tensor& y, dt::counting_allocator& counter,
              bool timed) {
    net->train();
    opt.zero_grad();
    const std::size_t before = counter.reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = torch::nn::functional::cross_entropy(g.forward(x), y);
    r.held = std::max(r.held, counter.current_bytes() - before);
    loss.backward();
    opt.step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.step_peak = std::max(r.step_peak, counter.peak_bytes() - before);
    if (timed) {
      seconds += s;
      ++r.steps;
    }
    return loss.item<double>();
  }

  /// Test accuracy in evaluation mode, after recomputing the batch norms' statistics on
  /// `recalibration` (training batches).
  void evaluate(const fmnist::split& te, const std::vector<torch::Tensor>& recalibration) {
    net->recalibrate_batch_norm(g, recalibration);
    net->eval();
    const torch::NoGradGuard no_grad;
    std::int64_t correct = 0;
    for (std::int64_t b = 0; b < te.images.size(0); b += 500) {
      const auto x = te.images.slice(0, b, b + 500), y = te.labels.slice(0, b, b + 500);
      correct += g.forward(x).argmax(1).eq(y).sum().item<std::int64_t>();
    }
    r.accuracy = 100.0 * static_cast<double>(correct) / static_cast<double>(te.images.size(0));
    r.step_ms = r.steps ? 1e3 * seconds / static_cast<double>(r.steps) : 0.0;
  }

  std::shared_ptr<resnet> net;
  dt::checkpointed_graph g;
  torch::optim::SGD opt;
  run_result r;
  double seconds = 0;
};

/// Trains all runs in lockstep (the same batches, one step of each in turn), so that a shared,
/// noisy machine slows them alike.
std::vector<run_result> train(const options& o, const fmnist::split& tr, const fmnist::split& te,
                              dt::counting_allocator& counter) {
  const auto example = tr.images.slice(0, 0, o.batch);
  std::vector<std::unique_ptr<run>> runs;
  runs.push_back(std::make_unique<run>(false, o, example));
  if (o.budgets_mib.empty()) {
    runs.push_back(std::make_unique<run>(true, o, example));
  } else {
    for (double b : o.budgets_mib)
      runs.push_back(std::make_unique<run>(true, o, example, b));
  }
  torch::manual_seed(o.seed + 1);
  const std::int64_t n = tr.images.size(0);
  const std::size_t k = runs.size();
  const auto started = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto perm = torch::randperm(n, torch::kLong);
    std::vector<double> loss_sum(k, 0.0);
    std::int64_t seen = 0;
    for (std::int64_t b = 0; b + o.batch <= n; b += o.batch) {
      const auto idx = perm.slice(0, b, b + o.batch);
      const auto x = tr.images.index_select(0, idx), y = tr.labels.index_select(0, idx);
      const bool timed = b > 0 || epoch > 0;  // the first step warms up allocators and oneDNN
      // Rotate which run goes first, so none always follows another's memory traffic.
      const auto step = static_cast<std::size_t>(b / o.batch);
      for (std::size_t j = 0; j < k; ++j) {
        const std::size_t i = (j + step) % k;
        loss_sum[i] += runs[i]->step(x, y, counter, timed);
      }
      seen += o.batch;
      const double batches = static_cast<double>(seen / o.batch);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::printf("\r  epoch %d  %6lld/%lld  loss", epoch + 1, static_cast<long long>(seen),
                  static_cast<long long>(n));
      for (std::size_t i = 0; i < k; ++i)
        std::printf(" %.4f", loss_sum[i] / batches);
      std::printf("  %.0f samples/s (all runs)   ",
                  static_cast<double>(k) * static_cast<double>(seen + epoch * n) / elapsed);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  // The first whole batches of the training set, in order: the same for all runs.
  std::vector<torch::Tensor> recalibration;
  for (std::int64_t b = 0; b + o.batch <= std::min(n, std::max(recalibration_samples, o.batch));
       b += o.batch)
    recalibration.push_back(tr.images.slice(0, b, b + o.batch));
  std::vector<run_result> out;
  for (auto& r : runs) {
    r->evaluate(te, recalibration);
    out.push_back(r->r);
  }
  return out;
}

/// Prints the frontier of the model's graph (as --budget runs measure it), thinned to at most
/// `rows` points evenly by index, the first and the last included.
void print_frontier(const options& o, const torch::Tensor& example, std::size_t rows = 24) {
  const auto net = (torch::manual_seed(o.seed), std::make_shared<resnet>(o.width));
  net->train();
  auto g = net->graph(sparse_policy(o), o.fused);
  const auto measured = g.measure(example, 3);
  const auto f = g.frontier(example);
  const auto least_recompute_only = dropit::checkpoint::solve(measured).cost;
  double forward_ms = 0;
  for (vertex v = 1; v < g.size(); ++v)
    forward_ms += measured.time(v) * 1e3;
  std::printf(
      "frontier (%s): %zu points, %s, solved in %.1f ms; memory of keeping everything %.1f MiB, "
      "least recompute-only %.1f MiB; measured forward (no autograd) %.1f ms\n",
      o.recompute_only ? "recompute-only" : "keep / MinK 0.9 / recompute", f.points.size(),
      f.exact ? "exact" : "inexact", f.solve_seconds * 1e3, mib(measured.total_cost()),
      mib(least_recompute_only), forward_ms);
  std::printf("  %12s %16s\n", "memory MiB", "extra time ms");
  const std::size_t n = f.points.size();
  const std::size_t shown = std::min(n, rows);
  for (std::size_t i = 0; i < shown; ++i) {
    const std::size_t j = shown > 1 ? i * (n - 1) / (shown - 1) : 0;
    std::printf("  %12.2f %16.3f\n", mib(f.points[j].memory), f.points[j].extra_time * 1e3);
  }
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "checkpoint_train: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--epochs")
      o.epochs = std::stoi(next());
    else if (a == "--limit")
      o.limit = std::stoll(next());
    else if (a == "--batch-size")
      o.batch = std::stoll(next());
    else if (a == "--width")
      o.width = std::stoll(next());
    else if (a == "--lr")
      o.lr = std::stod(next());
    else if (a == "--min-accuracy")
      o.min_accuracy = std::stod(next());
    else if (a == "--seed")
      o.seed = std::stoull(next());
    else if (a == "--threads")
      o.threads = std::stoll(next());
    else if (a == "--data")
      o.data = next();
    else if (a == "--csv")
      o.csv = next();
    else if (a == "--recompute-only")
      o.recompute_only = true;
    else if (a == "--fuse")
      o.fused = true;
    else if (a == "--step-budget")
      o.step_budget = true;
    else if (a == "--budget") {
      const std::string list = next();
      std::size_t at = 0;
      while (at <= list.size()) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, comma - at);
        char* end = nullptr;
        const double b = std::strtod(item.c_str(), &end);
        if (item.empty() || end != item.c_str() + item.size() || !(b > 0)) {
          std::fprintf(stderr, "checkpoint_train: --budget takes MiB > 0, got '%s'\n",
                       item.c_str());
          std::exit(2);
        }
        o.budgets_mib.push_back(b);
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: checkpoint_train [--epochs E] [--limit N] [--batch-size B] [--width C] "
                   "[--lr LR] [--seed S] [--threads T] [--data DIR] [--csv FILE] "
                   "[--min-accuracy P] [--budget MiB[,MiB...]] [--recompute-only] [--fuse] "
                   "[--step-budget]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.epochs < 1 || o.batch < 1 || o.width < 1 || o.threads < 1 || o.limit < 0 || !(o.lr > 0)) {
    std::fprintf(stderr,
                 "checkpoint_train: epochs, batch size, width and threads must be >= 1, lr > 0\n");
    std::exit(2);
  }
  for (int i = 0; i < argc; ++i)
    o.command += (i ? " " : "") + std::string(argv[i]);
  return o;
}

/// The --budget mode: the frontier, then the plain run and one run per budget.
int budget_main(const options& o, const fmnist::split& tr, const fmnist::split& te,
                dt::counting_allocator& counter) {
  std::vector<run_result> runs;
  try {
    print_frontier(o, tr.images.slice(0, 0, o.batch));
    runs = train(o, tr, te, counter);
  } catch (const dropit::error& e) {
    std::fprintf(stderr, "checkpoint_train: %s\n", e.what());
    return 2;
  }
  const auto& base = runs[0];
  std::printf(
      "\n| run | kept / compressed / recomputed | planned MiB (stored + segment) | held fwd->bwd "
      "MiB | held vs stored | step peak MiB | peak vs planned | modelled peak MiB | peak vs "
      "modelled | planned extra ms | step ms | time vs plain | test acc (%%) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& r : runs) {
    const bool plain = r.budget_mib <= 0;
    std::printf("| %s | ", r.mode.c_str());
    if (plain)
      std::printf("all kept | %.1f (regular) | %.1f | | %.1f | %.2fx | %.1f | %.2fx | | ",
                  r.regular_mib, mib(r.held), mib(r.step_peak), mib(r.step_peak) / r.regular_mib,
                  r.model_peak_mib, mib(r.step_peak) / r.model_peak_mib);
    else
      std::printf(
          "%zu / %zu / %zu | %.1f (%.1f + %.1f) | %.1f | %.2fx | %.1f | %.2fx | %.1f | %.2fx | "
          "%.1f | ",
          r.checkpoints, r.compressed, r.dropped, r.predicted_mib, r.stored_mib, r.segment_mib,
          mib(r.held), mib(r.held) / r.stored_mib, mib(r.step_peak),
          mib(r.step_peak) / r.predicted_mib, r.model_peak_mib, mib(r.step_peak) / r.model_peak_mib,
          r.extra_ms);
    std::printf("%.1f | %+.0f%% | %.2f |\n", r.step_ms, 100.0 * (r.step_ms / base.step_ms - 1.0),
                r.accuracy);
  }
  if (!o.csv.empty()) {
    const std::string date = today();
    std::ofstream f(o.csv);
    f << "mode,budget_mib,kept,compressed,recomputed,planned_mib,stored_mib,segment_mib,held_mib,"
         "step_peak_mib,peak_vs_planned,model_peak_mib,peak_vs_model,planned_extra_ms,step_ms,"
         "test_accuracy,date,command\n";
    for (const auto& r : runs) {
      const bool plain = r.budget_mib <= 0;
      f << '"' << r.mode << "\"," << r.budget_mib << ',' << r.checkpoints << ',' << r.compressed
        << ',' << r.dropped << ',' << (plain ? r.regular_mib : r.predicted_mib) << ','
        << r.stored_mib << ',' << r.segment_mib << ',' << mib(r.held) << ',' << mib(r.step_peak)
        << ',' << mib(r.step_peak) / (plain ? r.regular_mib : r.predicted_mib) << ','
        << r.model_peak_mib << ',' << mib(r.step_peak) / r.model_peak_mib << ',' << r.extra_ms
        << ',' << r.step_ms << ',' << r.accuracy << ',' << date << ",\"" << o.command << "\"\n";
    }
  }
  bool ok = true;
  for (const auto& r : runs) {
    if (!(r.accuracy >= o.min_accuracy)) {
      std::fprintf(stderr, "checkpoint_train: the %s run did not learn: test accuracy %.2f%%\n",
                   r.mode.c_str(), r.accuracy);
      ok = false;
    }
    // What the plan stores is what stays between forward and backward (plus the output and the
    // loss, a few bytes): the planner's model of it, checked on every run.
    if (r.budget_mib > 0 && !(mib(r.held) <= r.stored_mib * 1.01 + 0.05)) {
      std::fprintf(stderr,
                   "checkpoint_train: the %s run held %.2f MiB after forward, more than the "
                   "%.2f MiB its plan stores\n",
                   r.mode.c_str(), mib(r.held), r.stored_mib);
      ok = false;
    }
    // With --fuse every tensor of the graph is one that some backward reads or that a
    // recomputation starts from, so the run holds all the plan stores, not less.
    if (o.fused && r.budget_mib > 0 && !(mib(r.held) >= r.stored_mib * 0.99 - 0.05)) {
      std::fprintf(stderr,
                   "checkpoint_train: the %s run (--fuse) held %.2f MiB after forward, less than "
                   "the %.2f MiB its plan stores\n",
                   r.mode.c_str(), mib(r.held), r.stored_mib);
      ok = false;
    }
    // The modelled step peak (the budget's meaning with --step-budget) against the counting
    // allocator's: measured within 0.5% on this model, fused or not.
    if (!(std::abs(mib(r.step_peak) / r.model_peak_mib - 1.0) <= 0.03)) {
      std::fprintf(stderr,
                   "checkpoint_train: the %s run peaked at %.2f MiB, more than 3%% off its "
                   "modelled step peak of %.2f MiB\n",
                   r.mode.c_str(), mib(r.step_peak), r.model_peak_mib);
      ok = false;
    }
    if (o.step_budget && r.budget_mib > 0 && !(r.model_peak_mib <= r.budget_mib)) {
      std::fprintf(
          stderr, "checkpoint_train: the %s run's modelled step peak %.2f MiB is over its budget\n",
          r.mode.c_str(), r.model_peak_mib);
      ok = false;
    }
    if (r.compressed == 0 && !(std::abs(r.accuracy - base.accuracy) < 1.0)) {
      std::fprintf(stderr,
                   "checkpoint_train: the %s run diverged: test accuracy %.2f%% vs %.2f%%\n",
                   r.mode.c_str(), r.accuracy, base.accuracy);
      ok = false;
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  torch::set_num_threads(static_cast<int>(o.threads));
  fmnist::split tr, te;
  try {
    tr = fmnist::load(o.data, "train", o.limit);
    te = fmnist::load(o.data, "t10k", 0);
  } catch (const fmnist::missing_data& e) {
    std::fprintf(stderr, "checkpoint_train: %s\n", e.what());
    return 77;
  }
  if (tr.images.size(0) < o.batch) {
    std::fprintf(stderr, "checkpoint_train: --limit is smaller than one batch\n");
    return 2;
  }
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);
  std::printf(
      "ResNet (width %lld) on Fashion-MNIST: %lld training samples, batch %lld, %d "
      "epoch(s), SGD lr %g momentum 0.9, %lld threads\n",
      static_cast<long long>(o.width), static_cast<long long>(tr.images.size(0)),
      static_cast<long long>(o.batch), o.epochs, o.lr, static_cast<long long>(o.threads));
  if (!o.budgets_mib.empty()) return budget_main(o, tr, te, counter);
  const std::vector<run_result> runs = train(o, tr, te, counter);

  const auto& base = runs[0];
  std::printf(
      "\n| run | checkpoints | model cost (MiB) | held fwd->bwd (MiB) | step peak (MiB) | "
      "step peak vs plain | step time (ms) | time vs plain | test acc (%%) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& r : runs) {
    std::printf("| %s | %zu | %.1f | %.1f | %.1f | %.2fx | %.1f | %+.0f%% | %.2f |\n",
                r.mode.c_str(), r.checkpoints, r.predicted_mib, mib(r.held), mib(r.step_peak),
                static_cast<double>(r.step_peak) / static_cast<double>(base.step_peak), r.step_ms,
                100.0 * (r.step_ms / base.step_ms - 1.0), r.accuracy);
  }
  if (!o.csv.empty()) {
    const std::string date = today();
    std::ofstream f(o.csv);
    f << "mode,checkpoints,model_cost_mib,held_mib,step_peak_mib,step_ms,test_accuracy,date,"
         "command\n";
    for (const auto& r : runs)
      f << r.mode << ',' << r.checkpoints << ',' << r.predicted_mib << ',' << mib(r.held) << ','
        << mib(r.step_peak) << ',' << r.step_ms << ',' << r.accuracy << ',' << date << ",\""
        << o.command << "\"\n";
  }
  // The planned run must hold less than the plain one and learn as well (same weights, same data,
  // same gradients), and both must learn: checks the smoke test relies on.
  bool ok = true;
  if (!(runs[1].held < base.held && runs[1].step_peak < base.step_peak)) {
    std::fprintf(stderr, "checkpoint_train: the planned run did not save memory\n");
    ok = false;
  }
  if (!(std::abs(runs[1].accuracy - base.accuracy) < 1.0)) {
    std::fprintf(stderr, "checkpoint_train: the runs diverged: test accuracy %.2f%% vs %.2f%%\n",
                 runs[1].accuracy, base.accuracy);
    ok = false;
  }
  for (const auto& r : runs) {
    if (!(r.accuracy >= o.min_accuracy)) {
      std::fprintf(stderr,
                   "checkpoint_train: the %s run did not learn: test accuracy %.2f%%, below "
                   "--min-accuracy %.2f%%\n",
                   r.mode.c_str(), r.accuracy, o.min_accuracy);
      ok = false;
    }
  }
  return ok ? 0 : 1;
}
