// The two models of the Fashion-MNIST example: a small CNN built from torch::nn layers and
// converted with dropit::torch::to_dropit, and a small ViT written with dropit's layer types.
#pragma once

#include <dropit/torch.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>

namespace fmnist {

namespace dt = dropit::torch;

/**
 * CNN: conv(1->c1, 3x3) maxpool2 ReLU conv(c1->c2, 3x3) maxpool2 ReLU flatten linear(->hidden) ReLU
 * linear(->10). Plain torch::nn layers in a Sequential: `to_dropit` swaps them.
 *
 * Pooling before ReLU computes the same function and gradient as ReLU before pooling (max
 * commutes with the monotone ReLU) on 4x fewer elements, so no full-resolution ReLU output or
 * ReLU gradient is ever allocated.
 */
inline torch::nn::Sequential make_cnn(std::int64_t c1 = 16, std::int64_t c2 = 32,
                                      std::int64_t hidden = 128) {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, c1, 3).padding(1)),
                        nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(c1, c2, 3).padding(1)),
                        nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::ReLU(), nn::Flatten(),
                        nn::Linear(c2 * 7 * 7, hidden), nn::ReLU(), nn::Linear(hidden, 10));
}

/// Pre-norm transformer block; its four Linear layers are dropit layers. With `relu_mlp` the MLP
/// uses a dropit ReLU (a 1-bit mask instead of LibTorch's dense saved output); `inplace_relu`
/// lets it overwrite fc1's output. LibTorch's own relu_ on that output costs more than its
/// out-of-place relu (autograd's in-place-on-view machinery), so the baseline runs out of place.
/// Its LayerNorms, GELU and softmax(q k^T) v are dropit's store modules: LibTorch's ops until
/// `to_dropit`'s `store` options switch their classes on.
struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t dim, std::int64_t heads, std::int64_t mlp, bool relu_mlp,
            bool inplace_relu)
      : heads(heads), relu_mlp(relu_mlp) {
    ln1 = register_module("ln1", dt::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv = register_module("qkv", dt::Linear(dim, 3 * dim));
    attn = register_module("attn", dt::SoftmaxAttention());
    proj = register_module("proj", dt::Linear(dim, dim));
    ln2 = register_module("ln2", dt::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1 = register_module("fc1", dt::Linear(dim, mlp));
    act = register_module("act", dt::ReLU(torch::nn::ReLUOptions().inplace(inplace_relu)));
    gelu = register_module("gelu", dt::GELU());
    fc2 = register_module("fc2", dt::Linear(mlp, dim));
  }

  // Each sub-block is its own function so that its temporaries (the qkv output, the scores, the
  // MLP's hidden activation) are freed as soon as it returns, not at the end of the block.
  torch::Tensor attention(const torch::Tensor& h) {
    const std::int64_t b = h.size(0), t = h.size(1), d = h.size(2), dh = d / heads;
    const auto q_k_v = qkv(h).view({b, t, 3, heads, dh}).permute({2, 0, 3, 1, 4});
    // Scaling q (a contiguous copy matmul can use as is) costs less than scaling the scores.
    return attn(q_k_v[0] * (1.0 / std::sqrt(double(dh))), q_k_v[1], q_k_v[2])
        .transpose(1, 2)
        .reshape({b, t, d});
  }

  torch::Tensor mlp(const torch::Tensor& h) {
    auto hidden = fc1(h);
    hidden = relu_mlp ? act(hidden) : gelu(hidden);
    return fc2(hidden);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + proj(attention(ln1(x)));
    return x + mlp(ln2(x));
  }

  std::int64_t heads;
  bool relu_mlp;
  dt::LayerNorm ln1{nullptr}, ln2{nullptr};
  dt::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  dt::SoftmaxAttention attn{nullptr};
  dt::ReLU act{nullptr};
  dt::GELU gelu{nullptr};
};
TORCH_MODULE(Block);

/// ViT: 7x7 patches (16 tokens) -> dim, learned position embedding, `depth` blocks, LayerNorm,
/// mean over tokens, linear head.
struct ViTImpl : torch::nn::Module {
  ViTImpl(std::int64_t dim = 64, std::int64_t depth = 4, std::int64_t heads = 4,
          std::int64_t mlp = 256, bool relu_mlp = true, bool inplace_relu = false) {
    patch = register_module("patch", dt::Conv2d(torch::nn::Conv2dOptions(1, dim, 7).stride(7)));
    pos = register_parameter("pos", torch::randn({1, 16, dim}) * 0.02);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < depth; ++i) {
      blocks->push_back(Block(dim, heads, mlp, relu_mlp, inplace_relu));
    }
    ln = register_module("ln", dt::LayerNorm(torch::nn::LayerNormOptions({dim})));
    head = register_module("head", dt::Linear(dim, 10));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = patch(x).flatten(2).transpose(1, 2) + pos;  // [B, 16, dim]
    for (const auto& block : *blocks)
      x = block->as<BlockImpl>()->forward(x);
    return head(ln(x).mean(1));
  }

  dt::Conv2d patch{nullptr};
  torch::Tensor pos;
  torch::nn::ModuleList blocks{nullptr};
  dt::LayerNorm ln{nullptr};
  dt::Linear head{nullptr};
};
TORCH_MODULE(ViT);

}  // namespace fmnist
