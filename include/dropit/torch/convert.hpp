/**
 * @file convert.hpp
 * @brief `dropit::torch::to_dropit`: switches a module tree to a policy, replacing the standard
 * layers a `Sequential` or `ModuleList` holds by their dropit counterparts.
 *
 * LibTorch's C++ modules cannot have their `forward` patched at run time, so there are two ways in:
 * - build the model from dropit's layer types (`dropit::torch::Linear`, `Conv2d`, `Conv1D`,
 *   `Conv1d`, `Conv3d`, `ConvTranspose1d/2d/3d`, `ReLU`, `LeakyReLU`, `Hardtanh`, `ReLU6`,
 *   `MaxPool2d`, `AvgPool2d`, `AdaptiveAvgPool2d`; modules.hpp; `MultiheadAttention`,
 *   multihead_attention.hpp), which works for any module, or
 * - build it from `torch::nn` layers held in `Sequential`/`ModuleList` containers and call
 *   `to_dropit(model, policy)`, which swaps them in place.
 * A standard layer held as a named member of your own module is called through its own type by your
 * `forward`, so it cannot be swapped: use a dropit type for it.
 */
#pragma once

#include <dropit/torch/modules.hpp>
#include <dropit/torch/multihead_attention.hpp>
#include <dropit/torch/policy.hpp>
#include <dropit/torch/store_modules.hpp>
#include <dropit/torch/transformer.hpp>

#include <torch/nn/module.h>

#include <cstddef>
#include <functional>
#include <map>
#include <string>

namespace dropit::torch {

/// @brief Which layers `to_dropit` touches.
struct convert_options {
  /// Replace standard `Linear`, `Conv1d/2d/3d`, `ConvTranspose1d/2d/3d` (and, with `masks`, the
  /// ReLUs and poolings below) children of `Sequential`/`ModuleList` containers.
  bool replace = true;
  /// Replace `ReLU`, `LeakyReLU`, `Hardtanh`, `ReLU6` and `MaxPool2d` by their mask-saving
  /// versions too, and `AvgPool2d` and `AdaptiveAvgPool2d` by theirs that save the input's sizes
  /// only.
  bool masks = true;
  /// With `masks`: where a Sequential runs a MaxPool2d and then a ReLU (neither excluded), the
  /// pooling applies the ReLU and saves window codes only for the outputs the ReLU passes
  /// (`MaxPool2dImpl::apply_relu`; the ReLU is absorbed: `ReLUImpl::absorb`). The same outputs
  /// and gradients, fewer saved bytes; no double backward (`create_graph` throws): turn it off
  /// for gradient penalties.
  bool fuse_pool_relu = true;
  /// The dense saved tensors to keep through a codec (store.hpp): every dropit store module
  /// (`LayerNorm`, `BatchNorm1d/2d/3d`, `GELU`, the activations, `Softmax`, `Dropout`,
  /// `SoftmaxAttention`) gets these options, and with `replace` the standard `LayerNorm`,
  /// `BatchNorm1d/2d/3d`, `GELU`, `SiLU`, `Mish`, `ELU`, `CELU`, `Softplus`, `Tanh`, `Sigmoid`,
  /// `Softmax` and `Dropout` children of containers whose class is on are replaced. Off by
  /// default.
  store_options store{};
  /// Layers to leave out, by dotted path ("features.3") and module. A Linear or Conv2d there is
  /// still replaced (a dropit Linear, convolution, Conv1D there takes the policy) and marked
  /// `layer::exclude()`: it keeps its input exact (the gamma = 0 case) but runs dropit's backward
  /// in pieces. A ReLU or pooling there is not replaced (a dropit one keeps its policy), nor is a
  /// store module given `store`. A dropit layer opted out before keeps its
  /// policy.
  std::function<bool(const std::string& path, const ::torch::nn::Module&)> exclude;
  /// Per-layer gamma: a Linear, convolution (plain or transposed, any rank) or Conv1D takes the
  /// gamma of the longest key that is its path or a dotted prefix of it ("" matches every layer),
  /// else the policy's. Keys must name modules under the root, gammas be in [0, 1] (checked
  /// before anything changes).
  std::map<std::string, double> layer_gamma;
};

/// @brief What `to_dropit` did.
struct convert_report {
  std::size_t switched = 0;  ///< dropit layers now on the policy (replaced ones included)
  std::size_t replaced = 0;  ///< standard layers replaced by dropit layers
  std::size_t excluded = 0;  ///< dropit layers left alone (opted out, or by `exclude`)
  std::size_t stored = 0;    ///< store modules given `convert_options::store` (replaced included)
  std::size_t fused = 0;     ///< MaxPool2d + ReLU pairs fused (`convert_options::fuse_pool_relu`)
};

/**
 * @brief Sets every dropit layer under `root` (root included) to `p`, except excluded ones, and
 * first replaces standard layers in `Sequential`/`ModuleList` containers and the encoder and
 * decoder of a `torch::nn::Transformer` (sharing their parameter tensors, so an optimizer built
 * before keeps working; they also become its `custom_encoder` / `custom_decoder`, so
 * `Transformer::clone` deep-copies them and its `reset` gives copies of them, not fresh standard
 * modules). With `p.kind == none` no Linear, Conv2d,
 * ReLU or pooling is replaced; store modules follow `options.store` either way.
 * @throw dropit::error if p's gamma is outside [0, 1], or a `layer_gamma` key names no module or
 * its gamma is outside [0, 1]; nothing is changed then.
 */
convert_report to_dropit(::torch::nn::Module& root, const policy& p,
                         const convert_options& options = {});

}  // namespace dropit::torch

#include <dropit/detail/torch/convert.inl>
