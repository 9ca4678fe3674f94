/**
 * @file multihead_attention.hpp
 * @brief `MultiheadAttention`: LibTorch's `torch::nn::MultiheadAttention` whose in and out
 * projections save their inputs through dropit.
 *
 * LibTorch's module applies its projections inside `multi_head_attention_forward` with
 * `F::linear` on `in_proj_weight` (or `q_proj_weight` / `k_proj_weight` / `v_proj_weight`) and
 * `out_proj->weight`: no `Linear` module runs, so replacing Linear layers never reaches them.
 * This module runs the same computation with each projection in dropit's `linear` (the weight
 * gradients come from the rebuilt inputs; input and bias gradients are exact); the attention
 * itself (scaled `q k^T`, masks, softmax, dropout, `attn v`) is LibTorch's ops, as in its module.
 * Its own saved tensors follow `store_options` (store.hpp) as `SoftmaxAttention`'s do: the
 * softmax output (`softmax`) and q, k, v (`matmul`) through a value codec, the dropout's noise as
 * bits (`dropout`); the weights after dropout are then rebuilt from the softmax output and the
 * noise instead of being saved.
 *
 * @code
 * namespace dt = dropit::torch;
 * dt::MultiheadAttention attention(torch::nn::MultiheadAttentionOptions(256, 8),
 *                                  {dt::policy_kind::mink, 0.9});
 * auto [out, weights] = attention(x, x, x);  // x: [L, N, E], as LibTorch's module
 * @endcode
 */
#pragma once

#include <dropit/torch/modules.hpp>
#include <dropit/torch/policy.hpp>
#include <dropit/torch/store_modules.hpp>

#include <torch/nn/modules/activation.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>
#include <tuple>

namespace dropit::torch {

/**
 * @brief `torch::nn::MultiheadAttention` whose four projections (q, k, v in, out) save their
 * inputs through dropit, with one policy for all of them (the layer's; `exclude()` keeps the
 * inputs exact, `to_dropit`'s `layer_gamma` names the module). Self-attention (query, key and
 * value equal, as LibTorch decides it: by value) packs the query once; key = value packs the key
 * once. Every option of LibTorch's module (bias, `add_bias_kv`, `add_zero_attn`, `kdim` / `vdim`,
 * dropout) and every argument of its forward (masks, `need_weights`, `average_attn_weights`)
 * behaves as there; eval mode, no-grad and policy `none` with no attention store class on run
 * LibTorch's module itself. `set_store` (or `to_dropit`'s `convert_options::store`) switches the
 * classes `softmax`, `matmul` and `dropout` on for the attention's own saved tensors; with the
 * exact codec its gradients stay LibTorch's.
 */
class MultiheadAttentionImpl : public ::torch::nn::MultiheadAttentionImpl,
                               public layer,
                               public store_layer {
 public:
  /// LibTorch's module this one derives from and stands in for.
  using standard_type = ::torch::nn::MultiheadAttentionImpl;

  /// @brief `embed_dim` split over `num_heads` heads.
  MultiheadAttentionImpl(std::int64_t embed_dim, std::int64_t num_heads, const policy& p = {});
  /// @brief As `torch::nn::MultiheadAttention(options)`.
  explicit MultiheadAttentionImpl(const ::torch::nn::MultiheadAttentionOptions& options,
                                  const policy& p = {});
  /// @brief Takes over a standard module: the SAME parameter tensors (out_proj included),
  /// options and training mode.
  explicit MultiheadAttentionImpl(const standard_type& other, const policy& p = {});

  /**
   * @brief Attention of query [L, N, E] over key [S, N, kdim] and value [S, N, vdim], as
   * LibTorch's module: the output [L, N, E] and, with `need_weights`, the attention weights
   * ([N, L, S] averaged over heads, or [N, heads, L, S]).
   * @throw dropit::error for inputs that are not 3-d or whose sizes disagree with the options.
   */
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value,
                                             const at::Tensor& key_padding_mask = {},
                                             bool need_weights = true,
                                             const at::Tensor& attn_mask = {},
                                             bool average_attn_weights = true);
  /// @brief A deep copy (new parameter tensors, out_proj's included), policy, opt-out and store
  /// options included.
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::MultiheadAttention(embed_dim=.., num_heads=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;
};

/// @brief Module holder of `MultiheadAttentionImpl`.
class MultiheadAttention : public ::torch::nn::ModuleHolder<MultiheadAttentionImpl> {
 public:
  using ::torch::nn::ModuleHolder<MultiheadAttentionImpl>::ModuleHolder;
  using Impl = MultiheadAttentionImpl;  ///< the module type
};

}  // namespace dropit::torch

#include <dropit/detail/torch/multihead_attention.inl>
