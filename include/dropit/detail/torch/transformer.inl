// Implementation of dropit::torch::TransformerEncoderLayer / TransformerEncoder
// (torch/transformer.hpp).
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

inline at::Tensor TransformerEncoderLayerImpl::activation(const at::Tensor& x) {
  const auto& a = options.activation();
  if (c10::get_if<::torch::enumtype::kGELU>(&a) != nullptr) {
    return dropit::torch::gelu(x, is_training() ? store_.policy_for(store_.gelu) : policy{});
  }
  if (c10::get_if<::torch::enumtype::kReLU>(&a) != nullptr) {
    return step_policy(is_training()).active() ? dropit::torch::relu(x) : at::relu(x);
  }
  const auto* f = c10::get_if<std::function<at::Tensor(const at::Tensor&)>>(&a);
  DROPIT_EXPECTS(f != nullptr && *f,
                 "torch::TransformerEncoderLayer: activation must be kGELU, kReLU or a callable");
  return (*f)(x);
}

inline at::Tensor TransformerEncoderLayerImpl::forward(const at::Tensor& src,
                                                       const at::Tensor& src_mask,
                                                       const at::Tensor& src_key_padding_mask) {
  // LibTorch 1.13's TransformerEncoderLayerImpl::forward, on dropit's modules (the attention
  // weights are not needed: the output is the same without them).
  const at::Tensor attended =
      std::get<0>(self_attn->forward(src, src, src, src_key_padding_mask, false, src_mask));
  const at::Tensor x = norm1->forward(src + dropout1->forward(attended));
  const at::Tensor ff = linear2->forward(dropout->forward(activation(linear1->forward(x))));
  return norm2->forward(x + dropout2->forward(ff));
}

inline std::shared_ptr<::torch::nn::Module> TransformerEncoderLayerImpl::clone(
    const c10::optional<c10::Device>& device) const {
  using detail::put_child;
  auto copy = std::make_shared<TransformerEncoderLayerImpl>(options, get_policy(), store_);
  copy->exclude(excluded());
  // Each submodule's own clone: its parameters, policy, opt-out and store options.
  const auto take = [&](const auto& holder, const char* name) {
    using impl = typename std::decay_t<decltype(holder)>::ContainedType;
    using holder_type = std::decay_t<decltype(holder)>;
    return put_child<holder_type>(*copy, name,
                                  std::dynamic_pointer_cast<impl>(holder->clone(device)));
  };
  copy->self_attn = take(self_attn, "self_attn");
  copy->linear1 = take(linear1, "linear1");
  copy->dropout = take(dropout, "dropout");
  copy->linear2 = take(linear2, "linear2");
  copy->norm1 = take(norm1, "norm1");
  copy->norm2 = take(norm2, "norm2");
  copy->dropout1 = take(dropout1, "dropout1");
  copy->dropout2 = take(dropout2, "dropout2");
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
    const ::torch::nn::TransformerEncoderOptions& options, const policy& p) {
  take_over(standard_type(options), p);
}

inline TransformerEncoderImpl::TransformerEncoderImpl(const standard_type& other, const policy& p) {
  take_over(other, p);
}

inline void TransformerEncoderImpl::take_over(const standard_type& other, const policy& p) {
  namespace nn = ::torch::nn;
  layers = register_module("layers", nn::ModuleList());
  for (std::size_t i = 0; i < other.layers->size(); ++i) {
    const auto m = other.layers->ptr(i);
    if (const auto standard = std::dynamic_pointer_cast<nn::TransformerEncoderLayerImpl>(m)) {
      layers->push_back(std::make_shared<TransformerEncoderLayerImpl>(*standard, p));
    } else if (const auto ours = std::dynamic_pointer_cast<TransformerEncoderLayerImpl>(m)) {
      layers->push_back(ours);
    } else {
      DROPIT_EXPECTS(false, "torch::TransformerEncoder: layer ", i,
                     " is not a TransformerEncoderLayer");
    }
  }
  if (!other.norm.is_empty()) {
    const auto ptr = other.norm.ptr();
    if (const auto ln = std::dynamic_pointer_cast<nn::LayerNormImpl>(ptr)) {
      auto d = std::make_shared<LayerNormImpl>(*ln);
      norm = nn::AnyModule(d);
      register_module("norm", d);
    } else {
      norm = other.norm;  // another norm module: kept (shared)
      register_module("norm", ptr);
    }
  }
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
  copy->layers = copy->register_module("layers", ::torch::nn::ModuleList());
  for (const auto& m : *layers)
    copy->layers->push_back(m->clone(device));
  if (!norm.is_empty()) {
    copy->norm = norm.clone(device);
    copy->register_module("norm", copy->norm.ptr());
  }
  copy->train(is_training());
  return copy;
}

inline void TransformerEncoderImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::TransformerEncoder(num_layers=" << layers->size() << ")";
}

}  // namespace dropit::torch
