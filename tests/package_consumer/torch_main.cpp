// Uses the installed LibTorch adapter: a Linear layer whose saved input is sparsified.
#include <dropit/torch.hpp>

#include <torch/torch.h>

#include <cstdio>

int main() {
  namespace dt = dropit::torch;
  namespace nn = torch::nn;
  torch::manual_seed(0);
  nn::Sequential net(nn::Linear(64, 32), nn::ReLU(), nn::Linear(32, 4));
  const dt::convert_report swapped = dt::to_dropit(*net, dt::policy{dt::policy_kind::mink, 0.9});
  const torch::Tensor loss = net->forward(torch::randn({16, 64})).sum();
  const dt::saved_bytes saved = dt::live_saved_bytes();
  loss.backward();
  std::printf("consumer_torch: %zu layers swapped, %zu sparse bytes saved\n", swapped.replaced,
              saved.sparse);
  return swapped.replaced == 3 && saved.sparse > 0 ? 0 : 1;
}
