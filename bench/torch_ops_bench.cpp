// The LibTorch adapter's ops against LibTorch's own. Mask ops: one forward and one backward of
// ReLU, LeakyReLU(0.01), Hardtanh(-1, 1) and MaxPool2d(2) on an fp32 tensor, through LibTorch's
// autograd engine, with the bytes the graph holds after forward as a counter. What the 1-bit masks
// cost (or save) in time.
//
//   build/release/bench/torch_ops_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// Cases `<op>/<impl>/<n>`: impl 0 is LibTorch's op (at::relu, at::leaky_relu, at::hardtanh,
// at::max_pool2d), 1 dropit's (dropit::torch::relu, leaky_relu, hardtanh, max_pool2d); n input
// elements, [n / 784 / 16, 16, 28, 28] for the pooling (2^28 elements = 1 GiB: beyond the caches).
// Input N(0, 1), incoming gradient all ones; one iteration is forward + backward + freeing both.
//
// Cases `linear_wgrad/<impl>/[<gamma>/]<rows>x<in>x<out>`: a Linear's weight gradient g^T x
// ([out, in]) for x [rows, in] N(0, 1) and g [rows, out] N(0, 1). impl `torch`: LibTorch's mm on
// the dense x (what a plain Linear saves); for x packed with MinK gamma, dropit's backward
// `rebuild` (x rebuilt in pieces for a dense mm), `kept` (the kept elements alone,
// kept_product.hpp) and `dropit` (whichever `kept_product_pays` picks: what the layers run). The
// cost model's constants are fitted to the first two. Shapes: the Fashion-MNIST ViT's Linear
// layers (2048 token rows; 64 -> 64, 192, 256 and 256 -> 64), the CNN's 1568 -> 128 (128 rows),
// a GPT-2-small block's 768 -> 768 and 768 -> 3072 at 4096 rows.
#include <dropit/torch.hpp>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

namespace dt = dropit::torch;

enum class op_kind : std::int64_t { relu = 0, leaky_relu = 1, hardtanh = 2, max_pool2d = 3 };

const char* name_of(op_kind op) {
  static const char* const names[] = {"relu", "leaky_relu", "hardtanh", "max_pool2d"};
  return names[static_cast<std::int64_t>(op)];
}

at::Tensor run_op(op_kind op, bool dropit, const at::Tensor& x) {
  switch (op) {
    case op_kind::relu:
      return dropit ? dt::relu(x) : at::relu(x);
    case op_kind::leaky_relu:
      return dropit ? dt::leaky_relu(x, 0.01) : at::leaky_relu(x, 0.01);
    case op_kind::hardtanh:
      return dropit ? dt::hardtanh(x, -1.0, 1.0) : at::hardtanh(x, -1.0, 1.0);
    case op_kind::max_pool2d:
      return dropit ? dt::max_pool2d(x, {}) : at::max_pool2d(x, {2, 2});
  }
  return {};
}

void op_step(benchmark::State& state, op_kind op, bool dropit, std::int64_t n) {
  torch::set_num_threads(2);
  torch::manual_seed(1);
  const at::Tensor x = op == op_kind::max_pool2d
                           ? torch::randn({n / (16 * 28 * 28), 16, 28, 28}).requires_grad_(true)
                           : torch::randn({n}).requires_grad_(true);
  // What the graph holds between forward and backward, counted by LibTorch's allocator: the op's
  // output is summed and dropped (LibTorch's ReLU keeps it alive as its saved tensor, dropit's
  // does not); x, held by the caller anyway, is not counted.
  double held = 0;
  {
    dt::counting_allocator counter;
    dt::cpu_allocator_guard use(counter);
    const std::size_t before = counter.current_bytes();
    const at::Tensor loss = run_op(op, dropit, x).sum();
    held = static_cast<double>(counter.current_bytes()) - static_cast<double>(before) -
           static_cast<double>(loss.nbytes());
    loss.backward();
    x.mutable_grad().reset();
  }
  for (auto _ : state) {
    at::Tensor y = run_op(op, dropit, x);
    y.backward(at::ones_like(y));
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.mutable_grad().reset();
  }
  state.SetBytesProcessed(state.iterations() * x.numel() * 4);
  state.counters["held_B_per_elem"] = held / static_cast<double>(x.numel());
  state.SetLabel(std::string(name_of(op)) + (dropit ? " dropit" : " LibTorch"));
}

/// Which weight-gradient path `linear_wgrad` times.
enum class wgrad_kind { torch, rebuild, kept, dropit };

void linear_wgrad(benchmark::State& state, wgrad_kind impl, double gamma, std::int64_t rows,
                  std::int64_t in, std::int64_t out) {
  using dt::detail::weight_grad_path;
  torch::set_num_threads(2);
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({rows, in});
  const at::Tensor g = torch::randn({rows, out});
  const at::Tensor w = torch::empty({out, in});
  const at::Tensor packed =
      dt::detail::save_packed(x, dt::policy{.kind = dt::policy_kind::mink, .gamma = gamma});
  const weight_grad_path path = impl == wgrad_kind::kept      ? weight_grad_path::kept
                                : impl == wgrad_kind::rebuild ? weight_grad_path::rebuild
                                                              : weight_grad_path::cheaper;
  for (auto _ : state) {
    const at::Tensor gw = impl == wgrad_kind::torch ? g.t().mm(x)
                                                    : dt::detail::matmul_weight_grad(
                                                          packed, false, g, in, false, w, path);
    benchmark::DoNotOptimize(gw.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * rows * in * out);  // dense multiply-adds
  state.counters["kept"] = 1.0 - gamma;
}

void register_wgrad_cases() {
  struct shape {
    std::int64_t rows, in, out;
  };
  const shape shapes[] = {{2048, 64, 64},   {2048, 64, 192},  {2048, 64, 256},  {2048, 256, 64},
                          {128, 1568, 128}, {4096, 768, 768}, {4096, 768, 3072}};
  static const char* const impls[] = {"torch", "rebuild", "kept", "dropit"};
  auto add = [](const std::string& name, wgrad_kind impl, double gamma, const shape& s) {
    benchmark::RegisterBenchmark(
        name.c_str(),
        [=](benchmark::State& state) { linear_wgrad(state, impl, gamma, s.rows, s.in, s.out); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  };
  for (const shape& s : shapes) {
    const std::string dims =
        std::to_string(s.rows) + "x" + std::to_string(s.in) + "x" + std::to_string(s.out);
    add("linear_wgrad/torch/" + dims, wgrad_kind::torch, 0.0, s);
    for (const double gamma : {0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99}) {
      char g[16];
      std::snprintf(g, sizeof g, "%.2f", gamma);
      for (const wgrad_kind impl : {wgrad_kind::rebuild, wgrad_kind::kept, wgrad_kind::dropit})
        add(std::string("linear_wgrad/") + impls[static_cast<int>(impl)] + "/" + g + "/" + dims,
            impl, gamma, s);
    }
  }
}

void register_cases() {
  register_wgrad_cases();
  for (std::int64_t op = 0; op < 4; ++op) {
    for (const std::int64_t n :
         {std::int64_t{1} << 20, std::int64_t{1} << 24, std::int64_t{1} << 28}) {
      for (std::int64_t impl = 0; impl < 2; ++impl) {
        const std::string name = std::string(name_of(static_cast<op_kind>(op))) + "/" +
                                 (impl == 1 ? "dropit" : "torch") + "/" + std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& state) {
                                       op_step(state, static_cast<op_kind>(op), impl == 1, n);
                                     })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_cases();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
