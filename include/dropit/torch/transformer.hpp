/**
 * @file transformer.hpp
 * @brief `TransformerEncoderLayer`, `TransformerEncoder`, `TransformerDecoderLayer` and
 * `TransformerDecoder`: LibTorch's modules with every part through dropit.
 *
 * LibTorch's `TransformerEncoderLayerImpl::forward` (and the decoder layer's) calls its members
 * through their holder types (`MultiheadAttention`, `Linear`, ...) and `TransformerEncoderImpl::
 * forward` calls `layers->at<TransformerEncoderLayerImpl>(i).forward(...)`; neither is virtual, so
 * replacing the members never reaches them. These modules run the same computation (post-norm:
 * attention, dropout, add, LayerNorm; in the decoder then the attention over the encoder's output,
 * dropout, add, LayerNorm; then Linear, activation, dropout, Linear, dropout, add, LayerNorm) on
 * dropit's modules: `MultiheadAttention` and `Linear` (their inputs through the layer's policy),
 * `LayerNorm` and `Dropout` (through `store_options`), the activation as a 1-bit ReLU mask (policy
 * active) or GELU through the `gelu` store class. The submodules keep LibTorch's names, so
 * `named_parameters()` and `to_dropit`'s `exclude` / `layer_gamma` paths read as LibTorch's.
 * `torch::nn::Transformer` calls its encoder and decoder through `AnyModule`s: `to_dropit` puts
 * these modules there and names them its `custom_encoder` / `custom_decoder` too (what its reset,
 * and so its `clone`, copies).
 *
 * @code
 * namespace dt = dropit::torch;
 * torch::nn::TransformerEncoder plain(torch::nn::TransformerEncoderOptions(
 *     torch::nn::TransformerEncoderLayerOptions(256, 8), 4));
 * dt::TransformerEncoder encoder(*plain, {dt::policy_kind::mink, 0.9});  // the same parameters
 * @endcode
 */
#pragma once

#include <dropit/torch/modules.hpp>
#include <dropit/torch/multihead_attention.hpp>
#include <dropit/torch/policy.hpp>
#include <dropit/torch/store_modules.hpp>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/transformercoder.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/nn/options/transformerlayer.h>

#include <memory>
#include <ostream>
#include <utility>
#include <vector>

namespace dropit::torch {

// What LibTorch's FORWARD_HAS_DEFAULT_ARGS gives its encoder and decoder modules (the macro names
// `torch::` unqualified, which means dropit::torch here): a Sequential (AnyModule) may call
// forward with the first `required` arguments alone, the masks up to `total` then undefined.
#define DROPIT_DETAIL_OPTIONAL_MASKS(required, total)                \
  template <typename ModuleType, typename... ArgumentTypes>          \
  friend struct ::torch::nn::AnyModuleHolder;                        \
  bool _forward_has_default_args() override {                        \
    return true;                                                     \
  }                                                                  \
  unsigned int _forward_num_required_args() override {               \
    return required;                                                 \
  }                                                                  \
  std::vector<::torch::nn::AnyValue> _forward_populate_default_args( \
      std::vector<::torch::nn::AnyValue>&& arguments) override {     \
    while (arguments.size() < (total))                               \
      arguments.emplace_back(at::Tensor());                          \
    return std::move(arguments);                                     \
  }

/**
 * @brief `torch::nn::TransformerEncoderLayer` on dropit's modules (see the file comment). The
 * layer's policy governs its ReLU mask; each submodule holds its own policy or store options,
 * which `to_dropit` sets as for any module.
 */
class TransformerEncoderLayerImpl : public ::torch::nn::Cloneable<TransformerEncoderLayerImpl>,
                                    public layer,
                                    public store_layer {
 public:
  /// LibTorch's module this one stands in for.
  using standard_type = ::torch::nn::TransformerEncoderLayerImpl;

  /// @brief New parameters, as LibTorch's module makes them; every submodule with p and s.
  explicit TransformerEncoderLayerImpl(const ::torch::nn::TransformerEncoderLayerOptions& options,
                                       const policy& p = {}, const store_options& s = {});
  /// @brief Takes over a standard layer: the SAME parameter tensors, options and training mode;
  /// attention and Linear layers with p.
  explicit TransformerEncoderLayerImpl(const standard_type& other, const policy& p = {});

  /// @brief Builds the submodules from `options` (new parameters).
  void reset() override;
  /**
   * @brief As LibTorch's forward: src [S, N, E], an additive `src_mask` [S, S] and a bool
   * `src_key_padding_mask` [N, S], both optional.
   */
  at::Tensor forward(const at::Tensor& src, const at::Tensor& src_mask = {},
                     const at::Tensor& src_key_padding_mask = {});
  /// @brief A deep copy (new parameter tensors), policies, opt-outs and store options included.
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::TransformerEncoderLayer(d_model=.., nhead=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;

  ::torch::nn::TransformerEncoderLayerOptions options;  ///< LibTorch's options
  MultiheadAttention self_attn = nullptr;               ///< the self-attention
  Linear linear1 = nullptr;    ///< feed-forward, d_model -> dim_feedforward
  Dropout dropout = nullptr;   ///< after the activation
  Linear linear2 = nullptr;    ///< feed-forward, back to d_model
  LayerNorm norm1 = nullptr;   ///< after the attention block
  LayerNorm norm2 = nullptr;   ///< after the feed-forward block
  Dropout dropout1 = nullptr;  ///< on the attention's output
  Dropout dropout2 = nullptr;  ///< on the feed-forward's output

 protected:
  DROPIT_DETAIL_OPTIONAL_MASKS(1, 3)
};

/// @brief Module holder of `TransformerEncoderLayerImpl`.
class TransformerEncoderLayer : public ::torch::nn::ModuleHolder<TransformerEncoderLayerImpl> {
 public:
  using ::torch::nn::ModuleHolder<TransformerEncoderLayerImpl>::ModuleHolder;
  using Impl = TransformerEncoderLayerImpl;  ///< the module type
};

/**
 * @brief `torch::nn::TransformerEncoder` whose layers are `TransformerEncoderLayer`s (and whose
 * final norm, a LibTorch LayerNorm, is dropit's `LayerNorm`; any other norm module is kept).
 */
class TransformerEncoderImpl : public ::torch::nn::Cloneable<TransformerEncoderImpl> {
 public:
  /// LibTorch's module this one stands in for.
  using standard_type = ::torch::nn::TransformerEncoderImpl;

  /// @brief As LibTorch's: `num_layers` copies of `encoder_layer`, attention and Linear with p.
  explicit TransformerEncoderImpl(const ::torch::nn::TransformerEncoderOptions& options,
                                  const policy& p = {});
  /// @brief Takes over a standard encoder: the SAME parameter tensors, options, training mode.
  explicit TransformerEncoderImpl(const standard_type& other, const policy& p = {});

  /// @brief Nothing to build: the layers come from the constructors.
  void reset() override {}
  /// @brief As LibTorch's forward: every layer in turn, then the norm if there is one.
  at::Tensor forward(const at::Tensor& src, const at::Tensor& src_mask = {},
                     const at::Tensor& src_key_padding_mask = {});
  /// @brief A deep copy of every layer and the norm.
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::TransformerEncoder(num_layers=..)".
  void pretty_print(std::ostream& stream) const override;

  ::torch::nn::ModuleList layers = nullptr;  ///< the `TransformerEncoderLayer`s
  ::torch::nn::AnyModule norm;               ///< the final norm, if any

 protected:
  DROPIT_DETAIL_OPTIONAL_MASKS(1, 3)

 private:
  TransformerEncoderImpl() = default;
};

/// @brief Module holder of `TransformerEncoderImpl`.
class TransformerEncoder : public ::torch::nn::ModuleHolder<TransformerEncoderImpl> {
 public:
  using ::torch::nn::ModuleHolder<TransformerEncoderImpl>::ModuleHolder;
  using Impl = TransformerEncoderImpl;  ///< the module type
};

/**
 * @brief `torch::nn::TransformerDecoderLayer` on dropit's modules: self-attention, attention over
 * the encoder's output (`memory`), feed-forward, each followed by dropout, add and LayerNorm (see
 * the file comment). The layer's policy governs its ReLU mask.
 */
class TransformerDecoderLayerImpl : public ::torch::nn::Cloneable<TransformerDecoderLayerImpl>,
                                    public layer,
                                    public store_layer {
 public:
  /// LibTorch's module this one stands in for.
  using standard_type = ::torch::nn::TransformerDecoderLayerImpl;

  /// @brief New parameters, as LibTorch's module makes them; every submodule with p and s.
  explicit TransformerDecoderLayerImpl(const ::torch::nn::TransformerDecoderLayerOptions& options,
                                       const policy& p = {}, const store_options& s = {});
  /// @brief Takes over a standard layer: the SAME parameter tensors, options and training mode;
  /// attention and Linear layers with p.
  explicit TransformerDecoderLayerImpl(const standard_type& other, const policy& p = {});

  /// @brief Builds the submodules from `options` (new parameters).
  void reset() override;
  /**
   * @brief As LibTorch's forward: tgt [T, N, E], memory [S, N, E], additive masks `tgt_mask`
   * [T, T] and `memory_mask` [T, S], bool padding masks [N, T] and [N, S], the masks optional.
   */
  at::Tensor forward(const at::Tensor& tgt, const at::Tensor& memory,
                     const at::Tensor& tgt_mask = {}, const at::Tensor& memory_mask = {},
                     const at::Tensor& tgt_key_padding_mask = {},
                     const at::Tensor& memory_key_padding_mask = {});
  /// @brief A deep copy (new parameter tensors), policies, opt-outs and store options included.
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::TransformerDecoderLayer(d_model=.., nhead=.., policy=..)".
  void pretty_print(std::ostream& stream) const override;

  ::torch::nn::TransformerDecoderLayerOptions options;  ///< LibTorch's options
  MultiheadAttention self_attn = nullptr;               ///< the self-attention
  Dropout dropout1 = nullptr;                           ///< on the self-attention's output
  LayerNorm norm1 = nullptr;                            ///< after the self-attention block
  MultiheadAttention multihead_attn = nullptr;          ///< the attention over memory
  Dropout dropout2 = nullptr;                           ///< on its output
  LayerNorm norm2 = nullptr;                            ///< after the memory attention block
  Linear linear1 = nullptr;    ///< feed-forward, d_model -> dim_feedforward
  Dropout dropout = nullptr;   ///< after the activation
  Linear linear2 = nullptr;    ///< feed-forward, back to d_model
  Dropout dropout3 = nullptr;  ///< on the feed-forward's output
  LayerNorm norm3 = nullptr;   ///< after the feed-forward block

 protected:
  DROPIT_DETAIL_OPTIONAL_MASKS(2, 6)
};

/// @brief Module holder of `TransformerDecoderLayerImpl`.
class TransformerDecoderLayer : public ::torch::nn::ModuleHolder<TransformerDecoderLayerImpl> {
 public:
  using ::torch::nn::ModuleHolder<TransformerDecoderLayerImpl>::ModuleHolder;
  using Impl = TransformerDecoderLayerImpl;  ///< the module type
};

/**
 * @brief `torch::nn::TransformerDecoder` whose layers are `TransformerDecoderLayer`s (the final
 * norm as in `TransformerEncoder`).
 */
class TransformerDecoderImpl : public ::torch::nn::Cloneable<TransformerDecoderImpl> {
 public:
  /// LibTorch's module this one stands in for.
  using standard_type = ::torch::nn::TransformerDecoderImpl;

  /// @brief As LibTorch's: `num_layers` copies of `decoder_layer`, attention and Linear with p.
  explicit TransformerDecoderImpl(const ::torch::nn::TransformerDecoderOptions& options,
                                  const policy& p = {});
  /// @brief Takes over a standard decoder: the SAME parameter tensors, options, training mode.
  explicit TransformerDecoderImpl(const standard_type& other, const policy& p = {});

  /// @brief Nothing to build: the layers come from the constructors.
  void reset() override {}
  /// @brief As LibTorch's forward: every layer in turn, then the norm if there is one.
  at::Tensor forward(const at::Tensor& tgt, const at::Tensor& memory,
                     const at::Tensor& tgt_mask = {}, const at::Tensor& memory_mask = {},
                     const at::Tensor& tgt_key_padding_mask = {},
                     const at::Tensor& memory_key_padding_mask = {});
  /// @brief A deep copy of every layer and the norm.
  [[nodiscard]] std::shared_ptr<::torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override;
  /// @brief "dropit::torch::TransformerDecoder(num_layers=..)".
  void pretty_print(std::ostream& stream) const override;

  ::torch::nn::ModuleList layers = nullptr;  ///< the `TransformerDecoderLayer`s
  ::torch::nn::AnyModule norm;               ///< the final norm, if any

 protected:
  DROPIT_DETAIL_OPTIONAL_MASKS(2, 6)

 private:
  TransformerDecoderImpl() = default;
};

/// @brief Module holder of `TransformerDecoderImpl`.
class TransformerDecoder : public ::torch::nn::ModuleHolder<TransformerDecoderImpl> {
 public:
  using ::torch::nn::ModuleHolder<TransformerDecoderImpl>::ModuleHolder;
  using Impl = TransformerDecoderImpl;  ///< the module type
};

#undef DROPIT_DETAIL_OPTIONAL_MASKS

}  // namespace dropit::torch

#include <dropit/detail/torch/transformer.inl>
