// One training step (forward, loss, backward, AdamW) of the Fashion-MNIST example's CNN and ViT,
// without dropit and with MinK / Random gamma = 0.9 (MinK also with int8 kept values, and with the
// dense saved tensors stored in int8): what dropit adds to the time of a step.
//
//   build/release/bench/train_step_bench --benchmark_repetitions=10
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// Random interleaving runs the repetitions of all cases in a shuffled order, so a slower stretch
// of a shared machine falls on every case alike; quote the ratio of medians (bench/README.md).
// The batch is synthetic (no data set needed): 128 images of 28x28 in [0, 1), half of the pixels
// zero as in Fashion-MNIST's backgrounds, and random labels.
#include <dropit/torch.hpp>

#include "../examples/fashion_mnist/models.hpp"
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace {

namespace dt = dropit::torch;

enum class model_kind : std::int64_t { cnn = 0, vit = 1 };

/// The policy of case `i`: 0 none, 1 MinK 0.9, 2 Random 0.9, 3 MinK 0.9 with int8 kept values,
/// 4 MinK 0.9 with the dense saved tensors stored in int8 (convert_options::store, all classes).
dt::policy policy_of(std::int64_t i) {
  if (i == 1 || i == 4) return dt::policy::parse("mink", 0.9, 1);
  if (i == 2) return dt::policy::parse("random", 0.9, 1);
  if (i == 3) {
    dt::policy p = dt::policy::parse("mink", 0.9, 1);
    p.codec = dropit::value_codec::int8;
    return p;
  }
  return {};
}

const char* label_of(std::int64_t i) {
  static const char* const labels[] = {"none", "mink 0.9", "random 0.9", "mink 0.9 + int8 values",
                                       "mink 0.9 + store all int8"};
  return labels[i];
}

void train_step(benchmark::State& state) {
  const auto model = static_cast<model_kind>(state.range(0));
  const dt::policy policy = policy_of(state.range(1));
  dt::convert_options options;
  if (state.range(1) == 4) options.store = dt::store_options::all();
  torch::manual_seed(1);
  torch::set_num_threads(2);

  // The example's models, converted as the example converts them (masks on with a policy).
  std::shared_ptr<torch::nn::Module> net;
  std::function<torch::Tensor(const torch::Tensor&)> fwd;
  if (model == model_kind::cnn) {
    auto cnn = fmnist::make_cnn();
    dt::to_dropit(*cnn, policy, options);
    net = cnn.ptr();
    fwd = [cnn](const torch::Tensor& x) mutable { return cnn->forward(x); };
  } else {
    fmnist::ViT vit(64, 4, 4, 256, true, policy.active());
    dt::to_dropit(*vit, policy, options);
    net = vit.ptr();
    fwd = [vit](const torch::Tensor& x) mutable { return vit->forward(x); };
  }
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));

  const std::int64_t batch = 128;
  torch::Tensor x = torch::rand({batch, 1, 28, 28});
  x.masked_fill_(x < 0.5, 0.0);
  const torch::Tensor y = torch::randint(10, {batch}, torch::kLong);

  for (auto _ : state) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(fwd(x), y);
    loss.backward();
    optimizer.step();
    benchmark::DoNotOptimize(loss.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetLabel(label_of(state.range(1)));
}

}  // namespace

// Args: {model (0 CNN, 1 ViT), policy (policy_of)}.
BENCHMARK(train_step)
    ->ArgNames({"model", "policy"})
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3, 4}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();

BENCHMARK_MAIN();
