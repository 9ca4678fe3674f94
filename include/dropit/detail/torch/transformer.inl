// Implementation of dropit::torch::TransformerEncoderLayer / TransformerEncoder and
// TransformerDecoderLayer / TransformerDecoder (torch/transformer.hpp).
#pragma once

#include <dropit/error.hpp>
#include <dropit/torch/functional.hpp>
#include <dropit/torch/store.hpp>

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>

namespace dropit::torch {
namespace detail {

/// Registers module under name in parent (replacing a child of that name) and returns its holder.
template <class Holder, class Impl>
Holder put_child(::torch::nn::Module& parent, const std::string& name, std::shared_ptr<Impl> m) {
  const bool present = parent.named_children().contains(name);
  return Holder(present ? parent.replace_module(name, std::move(m))
                        : parent.register_module(name, std::move(m)));
}

/// The feed-forward activation of LibTorch's transformer layers on dropit's ops: ReLU as a 1-bit
/// mask when `relu_mask`, GELU through `gelu_store` (the `gelu` store class), a callable as is.
inline at::Tensor feed_forward_activation(const ::torch::nn::activation_t& a, const at::Tensor& x,
                                          bool relu_mask, const policy& gelu_store,
                                          const char* who) {
  if (c10::get_if<::torch::enumtype::kGELU>(&a) != nullptr) {
    return dropit::torch::gelu(x, gelu_store);
  }
  if (c10::get_if<::torch::enumtype::kReLU>(&a) != nullptr) {
    return relu_mask ? dropit::torch::relu(x) : at::relu(x);
  }
  const auto* f = c10::get_if<std::function<at::Tensor(const at::Tensor&)>>(&a);
  DROPIT_EXPECTS(f != nullptr && *f, "torch::", who,
                 ": activation must be kGELU, kReLU or a callable");
  return (*f)(x);
}

/// Fills `layers` and `norm` of self (an encoder or decoder) from a standard one's: each
/// standard layer taken over as `Ours` with p (dropit's layers kept), a LayerNorm norm as dropit's.
template <class Ours, class Standard>
void take_over_layers(::torch::nn::Module& self, ::torch::nn::ModuleList& layers,
                      ::torch::nn::AnyModule& norm, const ::torch::nn::ModuleList& other_layers,
                      const ::torch::nn::AnyModule& other_norm, const policy& p, const char* who) {
  namespace nn = ::torch::nn;
  layers = self.register_module("layers", nn::ModuleList());
  for (std::size_t i = 0; i < other_layers->size(); ++i) {
    const auto m = other_layers->ptr(i);
    if (const auto standard = std::dynamic_pointer_cast<Standard>(m)) {
      layers->push_back(std::make_shared<Ours>(*standard, p));
    } else if (const auto ours = std::dynamic_pointer_cast<Ours>(m)) {
      layers->push_back(ours);
    } else {
      DROPIT_EXPECTS(false, "torch::", who, ": layer ", i, " is not a ", who, "Layer");
    }
  }
  if (!other_norm.is_empty()) {
    const auto ptr = other_norm.ptr();
    if (const auto ln = std::dynamic_pointer_cast<nn::LayerNormImpl>(ptr)) {
      auto d = std::make_shared<LayerNormImpl>(*ln);
      norm = nn::AnyModule(d);
      self.register_module("norm", d);
    } else {
      norm = other_norm;  // another norm module: kept (shared)
      self.register_module("norm", ptr);
    }
  }
}

/// A deep copy of `layers` and `norm` into copy (an encoder or decoder).
inline void clone_layers(::torch::nn::Module& copy, ::torch::nn::ModuleList& copy_layers,
                         ::torch::nn::AnyModule& copy_norm, const ::torch::nn::ModuleList& layers,
                         const ::torch::nn::AnyModule& norm,
                         const c10::optional<c10::Device>& device) {
  copy_layers = copy.register_module("layers", ::torch::nn::ModuleList());
  for (const auto& m : *layers)
    copy_layers->push_back(m->clone(device));
  if (!norm.is_empty()) {
    copy_norm = norm.clone(device);
    copy.register_module("norm", copy_norm.ptr());
  }
}

/// holder's module cloned (its parameters, policy, opt-out and store options), put into copy
/// under name.
template <class Holder>
Holder clone_child(::torch::nn::Module& copy, const std::string& name, const Holder& holder,
                   const c10::optional<c10::Device>& device) {
  using impl = typename Holder::ContainedType;
  return put_child<Holder>(copy, name, std::dynamic_pointer_cast<impl>(holder->clone(device)));
}

}  // namespace detail

// ---- TransformerEncoderLayer -------------------------------------------------------------------

inline TransformerEncoderLayerImpl::TransformerEncoderLayerImpl(
    const ::torch::nn::TransformerEncoderLayerOptions& options_, const policy& p,
    const store_options& s)
    : layer(p), store_layer(s), options(options_) {
  reset();
}

inline TransformerEncoderLayerImpl::TransformerEncoderLayerImpl(const standard_type& other,
                                                                const policy& p)
    : layer(p), store_layer({}), options(other.options) {
  using detail::put_child;
  // LibTorch's order and names; the parameter tensors are other's.
  self_attn = put_child<MultiheadAttention>(
      *this, "self_attn", std::make_shared<MultiheadAttentionImpl>(*other.self_attn, p));
  linear1 = put_child<Linear>(*this, "linear1", std::make_shared<LinearImpl>(*other.linear1, p));
  dropout = put_child<Dropout>(*this, "dropout", std::make_shared<DropoutImpl>(*other.dropout));
  linear2 = put_child<Linear>(*this, "linear2", std::make_shared<LinearImpl>(*other.linear2, p));
  norm1 = put_child<LayerNorm>(*this, "norm1", std::make_shared<LayerNormImpl>(*other.norm1));
  norm2 = put_child<LayerNorm>(*this, "norm2", std::make_shared<LayerNormImpl>(*other.norm2));
  dropout1 = put_child<Dropout>(*this, "dropout1", std::make_shared<DropoutImpl>(*other.dropout1));
  dropout2 = put_child<Dropout>(*this, "dropout2", std::make_shared<DropoutImpl>(*other.dropout2));
  train(other.is_training());
}

inline void TransformerEncoderLayerImpl::reset() {
  namespace nn = ::torch::nn;
  using detail::put_child;
  const std::int64_t d = options.d_model(), ff = options.dim_feedforward();
  const double p_drop = options.dropout();
  const policy& p = get_policy();
  // As LibTorch's reset: the same modules in the same order (so the same draws of the generator).
  self_attn = put_child<MultiheadAttention>(
      *this, "self_attn",
      std::make_shared<MultiheadAttentionImpl>(
          nn::MultiheadAttentionOptions(d, options.nhead()).dropout(p_drop), p));
  self_attn->set_store(store_);
  linear1 = put_child<Linear>(*this, "linear1",
                              std::make_shared<LinearImpl>(nn::LinearOptions(d, ff), p));
  dropout = put_child<Dropout>(*this, "dropout",
                               std::make_shared<DropoutImpl>(nn::DropoutOptions(p_drop), store_));
  linear2 = put_child<Linear>(*this, "linear2",
                              std::make_shared<LinearImpl>(nn::LinearOptions(ff, d), p));
  norm1 = put_child<LayerNorm>(*this, "norm1",
                               std::make_shared<LayerNormImpl>(nn::LayerNormOptions({d}), store_));
  norm2 = put_child<LayerNorm>(*this, "norm2",
                               std::make_shared<LayerNormImpl>(nn::LayerNormOptions({d}), store_));
  dropout1 = put_child<Dropout>(*this, "dropout1",
                                std::make_shared<DropoutImpl>(nn::DropoutOptions(p_drop), store_));
  dropout2 = put_child<Dropout>(*this, "dropout2",
                                std::make_shared<DropoutImpl>(nn::DropoutOptions(p_drop), store_));
}

inline at::Tensor TransformerEncoderLayerImpl::forward(const at::Tensor& src,
                                                       const at::Tensor& src_mask,
                                                       const at::Tensor& src_key_padding_mask) {
  // LibTorch 1.13's TransformerEncoderLayerImpl::forward, on dropit's modules (the attention
  // weights are not needed: the output is the same without them).
  const at::Tensor attended =
      std::get<0>(self_attn->forward(src, src, src, src_key_padding_mask, false, src_mask));
  const at::Tensor x = norm1->forward(src + dropout1->forward(attended));
  const at::Tensor hidden = detail::feed_forward_activation(
      options.activation(), linear1->forward(x), step_policy(is_training()).active(),
      is_training() ? store_.policy_for(store_.gelu) : policy{}, "TransformerEncoderLayer");
  const at::Tensor ff = linear2->forward(dropout->forward(hidden));
  return norm2->forward(x + dropout2->forward(ff));
}

inline std::shared_ptr<::torch::nn::Module> TransformerEncoderLayerImpl::clone(
    const c10::optional<c10::Device>& device) const {
  using detail::clone_child;
  auto copy = std::make_shared<TransformerEncoderLayerImpl>(options, get_policy(), store_);
  copy->exclude(excluded());
  copy->self_attn = clone_child(*copy, "self_attn", self_attn, device);
  copy->linear1 = clone_child(*copy, "linear1", linear1, device);
  copy->dropout = clone_child(*copy, "dropout", dropout, device);
  copy->linear2 = clone_child(*copy, "linear2", linear2, device);
  copy->norm1 = clone_child(*copy, "norm1", norm1, device);
  copy->norm2 = clone_child(*copy, "norm2", norm2, device);
  copy->dropout1 = clone_child(*copy, "dropout1", dropout1, device);
  copy->dropout2 = clone_child(*copy, "dropout2", dropout2, device);
  copy->train(is_training());
  return copy;
}

inline void TransformerEncoderLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::TransformerEncoderLayer(d_model=" << options.d_model()
         << ", nhead=" << options.nhead() << ", ";
  print_policy(stream);
  stream << ")";
}

// ---- TransformerEncoder ------------------------------------------------------------------------

inline TransformerEncoderImpl::TransformerEncoderImpl(
    const ::torch::nn::TransformerEncoderOptions& options, const policy& p)
    : TransformerEncoderImpl(standard_type(options), p) {
}

inline TransformerEncoderImpl::TransformerEncoderImpl(const standard_type& other, const policy& p) {
  detail::take_over_layers<TransformerEncoderLayerImpl, ::torch::nn::TransformerEncoderLayerImpl>(
      *this, layers, norm, other.layers, other.norm, p, "TransformerEncoder");
  train(other.is_training());
}

inline at::Tensor TransformerEncoderImpl::forward(const at::Tensor& src, const at::Tensor& src_mask,
                                                  const at::Tensor& src_key_padding_mask) {
  at::Tensor out = src;
  for (std::size_t i = 0; i < layers->size(); ++i) {
    out = layers->at<TransformerEncoderLayerImpl>(i).forward(out, src_mask, src_key_padding_mask);
  }
  if (!norm.is_empty()) out = norm.forward<at::Tensor>(out);
  return out;
}

inline std::shared_ptr<::torch::nn::Module> TransformerEncoderImpl::clone(
    const c10::optional<c10::Device>& device) const {
  std::shared_ptr<TransformerEncoderImpl> copy(new TransformerEncoderImpl());
  detail::clone_layers(*copy, copy->layers, copy->norm, layers, norm, device);
  copy->train(is_training());
  return copy;
}

inline void TransformerEncoderImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::TransformerEncoder(num_layers=" << layers->size() << ")";
}

// ---- TransformerDecoderLayer -------------------------------------------------------------------

inline TransformerDecoderLayerImpl::TransformerDecoderLayerImpl(
    const ::torch::nn::TransformerDecoderLayerOptions& options_, const policy& p,
    const store_options& s)
    : layer(p), store_layer(s), options(options_) {
  reset();
}

inline TransformerDecoderLayerImpl::TransformerDecoderLayerImpl(const standard_type& other,
                                                                const policy& p)
    : layer(p), store_layer({}), options(other.options) {
  using detail::put_child;
  // LibTorch's order and names; the parameter tensors are other's.
  self_attn = put_child<MultiheadAttention>(
      *this, "self_attn", std::make_shared<MultiheadAttentionImpl>(*other.self_attn, p));
  dropout1 = put_child<Dropout>(*this, "dropout1", std::make_shared<DropoutImpl>(*other.dropout1));
  norm1 = put_child<LayerNorm>(*this, "norm1", std::make_shared<LayerNormImpl>(*other.norm1));
  multihead_attn = put_child<MultiheadAttention>(
      *this, "multihead_attn", std::make_shared<MultiheadAttentionImpl>(*other.multihead_attn, p));
  dropout2 = put_child<Dropout>(*this, "dropout2", std::make_shared<DropoutImpl>(*other.dropout2));
  norm2 = put_child<LayerNorm>(*this, "norm2", std::make_shared<LayerNormImpl>(*other.norm2));
  linear1 = put_child<Linear>(*this, "linear1", std::make_shared<LinearImpl>(*other.linear1, p));
  dropout = put_child<Dropout>(*this, "dropout", std::make_shared<DropoutImpl>(*other.dropout));
  linear2 = put_child<Linear>(*this, "linear2", std::make_shared<LinearImpl>(*other.linear2, p));
  dropout3 = put_child<Dropout>(*this, "dropout3", std::make_shared<DropoutImpl>(*other.dropout3));
  norm3 = put_child<LayerNorm>(*this, "norm3", std::make_shared<LayerNormImpl>(*other.norm3));
  train(other.is_training());
}

inline void TransformerDecoderLayerImpl::reset() {
  namespace nn = ::torch::nn;
  using detail::put_child;
  const std::int64_t d = options.d_model(), ff = options.dim_feedforward();
  const double p_drop = options.dropout();
  const policy& p = get_policy();
  const auto attention = [&] {
    auto m = std::make_shared<MultiheadAttentionImpl>(
        nn::MultiheadAttentionOptions(d, options.nhead()).dropout(p_drop), p);
    m->set_store(store_);
    return m;
  };
  const auto drop = [&] {
    return std::make_shared<DropoutImpl>(nn::DropoutOptions(p_drop), store_);
  };
  const auto norm = [&] {
    return std::make_shared<LayerNormImpl>(nn::LayerNormOptions({d}), store_);
  };
  // As LibTorch's reset: the same modules in the same order (so the same draws of the generator).
  self_attn = put_child<MultiheadAttention>(*this, "self_attn", attention());
  dropout1 = put_child<Dropout>(*this, "dropout1", drop());
  norm1 = put_child<LayerNorm>(*this, "norm1", norm());
  multihead_attn = put_child<MultiheadAttention>(*this, "multihead_attn", attention());
  dropout2 = put_child<Dropout>(*this, "dropout2", drop());
  norm2 = put_child<LayerNorm>(*this, "norm2", norm());
  linear1 = put_child<Linear>(*this, "linear1",
                              std::make_shared<LinearImpl>(nn::LinearOptions(d, ff), p));
  dropout = put_child<Dropout>(*this, "dropout", drop());
  linear2 = put_child<Linear>(*this, "linear2",
                              std::make_shared<LinearImpl>(nn::LinearOptions(ff, d), p));
  dropout3 = put_child<Dropout>(*this, "dropout3", drop());
  norm3 = put_child<LayerNorm>(*this, "norm3", norm());
}

inline at::Tensor TransformerDecoderLayerImpl::forward(const at::Tensor& tgt,
                                                       const at::Tensor& memory,
                                                       const at::Tensor& tgt_mask,
                                                       const at::Tensor& memory_mask,
                                                       const at::Tensor& tgt_key_padding_mask,
                                                       const at::Tensor& memory_key_padding_mask) {
  // LibTorch 1.13's TransformerDecoderLayerImpl::forward (post-norm), on dropit's modules.
  const at::Tensor self_attended =
      std::get<0>(self_attn->forward(tgt, tgt, tgt, tgt_key_padding_mask, false, tgt_mask));
  const at::Tensor x = norm1->forward(tgt + dropout1->forward(self_attended));
  const at::Tensor attended = std::get<0>(
      multihead_attn->forward(x, memory, memory, memory_key_padding_mask, false, memory_mask));
  const at::Tensor y = norm2->forward(x + dropout2->forward(attended));
  const at::Tensor hidden = detail::feed_forward_activation(
      options.activation(), linear1->forward(y), step_policy(is_training()).active(),
      is_training() ? store_.policy_for(store_.gelu) : policy{}, "TransformerDecoderLayer");
  const at::Tensor ff = linear2->forward(dropout->forward(hidden));
  return norm3->forward(y + dropout3->forward(ff));
}

inline std::shared_ptr<::torch::nn::Module> TransformerDecoderLayerImpl::clone(
    const c10::optional<c10::Device>& device) const {
  using detail::clone_child;
  auto copy = std::make_shared<TransformerDecoderLayerImpl>(options, get_policy(), store_);
  copy->exclude(excluded());
  copy->self_attn = clone_child(*copy, "self_attn", self_attn, device);
  copy->dropout1 = clone_child(*copy, "dropout1", dropout1, device);
  copy->norm1 = clone_child(*copy, "norm1", norm1, device);
  copy->multihead_attn = clone_child(*copy, "multihead_attn", multihead_attn, device);
  copy->dropout2 = clone_child(*copy, "dropout2", dropout2, device);
  copy->norm2 = clone_child(*copy, "norm2", norm2, device);
  copy->linear1 = clone_child(*copy, "linear1", linear1, device);
  copy->dropout = clone_child(*copy, "dropout", dropout, device);
  copy->linear2 = clone_child(*copy, "linear2", linear2, device);
  copy->dropout3 = clone_child(*copy, "dropout3", dropout3, device);
  copy->norm3 = clone_child(*copy, "norm3", norm3, device);
  copy->train(is_training());
  return copy;
}

inline void TransformerDecoderLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::TransformerDecoderLayer(d_model=" << options.d_model()
         << ", nhead=" << options.nhead() << ", ";
  print_policy(stream);
  stream << ")";
}

// ---- TransformerDecoder ------------------------------------------------------------------------

inline TransformerDecoderImpl::TransformerDecoderImpl(
    const ::torch::nn::TransformerDecoderOptions& options, const policy& p)
    : TransformerDecoderImpl(standard_type(options), p) {
}

inline TransformerDecoderImpl::TransformerDecoderImpl(const standard_type& other, const policy& p) {
  detail::take_over_layers<TransformerDecoderLayerImpl, ::torch::nn::TransformerDecoderLayerImpl>(
      *this, layers, norm, other.layers, other.norm, p, "TransformerDecoder");
  train(other.is_training());
}

inline at::Tensor TransformerDecoderImpl::forward(const at::Tensor& tgt, const at::Tensor& memory,
                                                  const at::Tensor& tgt_mask,
                                                  const at::Tensor& memory_mask,
                                                  const at::Tensor& tgt_key_padding_mask,
                                                  const at::Tensor& memory_key_padding_mask) {
  at::Tensor out = tgt;
  for (std::size_t i = 0; i < layers->size(); ++i) {
    out = layers->at<TransformerDecoderLayerImpl>(i).forward(
        out, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask);
  }
  if (!norm.is_empty()) out = norm.forward<at::Tensor>(out);
  return out;
}

inline std::shared_ptr<::torch::nn::Module> TransformerDecoderImpl::clone(
    const c10::optional<c10::Device>& device) const {
  std::shared_ptr<TransformerDecoderImpl> copy(new TransformerDecoderImpl());
  detail::clone_layers(*copy, copy->layers, copy->norm, layers, norm, device);
  copy->train(is_training());
  return copy;
}

inline void TransformerDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::TransformerDecoder(num_layers=" << layers->size() << ")";
}

}  // namespace dropit::torch
