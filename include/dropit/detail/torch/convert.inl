// Implementation of dropit::torch::to_dropit (torch/convert.hpp).
#pragma once

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/transformer.h>

#include <memory>
#include <tuple>
#include <utility>

namespace dropit::torch {
namespace detail {

/// A dropit layer standing in for a standard one, typed for a Sequential's AnyModule.
struct replacement {
  std::shared_ptr<::torch::nn::Module> module;
  ::torch::nn::AnyModule any;
};

template <class Dropit, class Standard, class Settings>
bool replace_as(const std::shared_ptr<::torch::nn::Module>& m, const Settings& p,
                replacement& out) {
  auto standard = std::dynamic_pointer_cast<Standard>(m);
  if (!standard) return false;
  auto d = std::make_shared<Dropit>(*standard, p);
  out.module = d;
  out.any = ::torch::nn::AnyModule(d);
  return true;
}

/// The dropit layer replacing m, if m is a standard layer dropit has a counterpart for. At an
/// excluded path only Linear and the convolutions are replaced (to keep their input exact, in
/// pieces).
inline bool make_replacement(const std::shared_ptr<::torch::nn::Module>& m, const policy& p,
                             const convert_options& o, bool excluded, replacement& out) {
  if (dynamic_cast<const layer*>(m.get()) != nullptr ||
      dynamic_cast<const store_layer*>(m.get()) != nullptr) {
    return false;
  }
  // LibTorch's encoder and decoder modules call their members through holder types: replaced
  // whole, their dropit submodules then get the policy and the store options below.
  if ((p.active() || o.store.any()) && !excluded &&
      (replace_as<TransformerEncoderImpl, ::torch::nn::TransformerEncoderImpl>(m, p, out) ||
       replace_as<TransformerEncoderLayerImpl, ::torch::nn::TransformerEncoderLayerImpl>(m, p,
                                                                                         out) ||
       replace_as<TransformerDecoderImpl, ::torch::nn::TransformerDecoderImpl>(m, p, out) ||
       replace_as<TransformerDecoderLayerImpl, ::torch::nn::TransformerDecoderLayerImpl>(m, p,
                                                                                         out))) {
    return true;
  }
  const bool weights =
      p.active() &&
      (replace_as<LinearImpl, ::torch::nn::LinearImpl>(m, p, out) ||
       replace_as<Conv2dImpl, ::torch::nn::Conv2dImpl>(m, p, out) ||
       replace_as<Conv1dImpl, ::torch::nn::Conv1dImpl>(m, p, out) ||
       replace_as<Conv3dImpl, ::torch::nn::Conv3dImpl>(m, p, out) ||
       replace_as<ConvTranspose1dImpl, ::torch::nn::ConvTranspose1dImpl>(m, p, out) ||
       replace_as<ConvTranspose2dImpl, ::torch::nn::ConvTranspose2dImpl>(m, p, out) ||
       replace_as<ConvTranspose3dImpl, ::torch::nn::ConvTranspose3dImpl>(m, p, out) ||
       replace_as<MultiheadAttentionImpl, ::torch::nn::MultiheadAttentionImpl>(m, p, out));
  if (weights || excluded) return weights;
  const store_options& s = o.store;
  return (p.active() && o.masks &&
          (replace_as<ReLUImpl, ::torch::nn::ReLUImpl>(m, p, out) ||
           replace_as<LeakyReLUImpl, ::torch::nn::LeakyReLUImpl>(m, p, out) ||
           replace_as<HardtanhImpl, ::torch::nn::HardtanhImpl>(m, p, out) ||
           replace_as<ReLU6Impl, ::torch::nn::ReLU6Impl>(m, p, out) ||
           replace_as<AvgPool2dImpl, ::torch::nn::AvgPool2dImpl>(m, p, out) ||
           replace_as<AdaptiveAvgPool2dImpl, ::torch::nn::AdaptiveAvgPool2dImpl>(m, p, out) ||
           replace_as<MaxPool2dImpl, ::torch::nn::MaxPool2dImpl>(m, p, out))) ||
         (s.layernorm && replace_as<LayerNormImpl, ::torch::nn::LayerNormImpl>(m, s, out)) ||
         (s.batchnorm && (replace_as<BatchNorm1dImpl, ::torch::nn::BatchNorm1dImpl>(m, s, out) ||
                          replace_as<BatchNorm2dImpl, ::torch::nn::BatchNorm2dImpl>(m, s, out) ||
                          replace_as<BatchNorm3dImpl, ::torch::nn::BatchNorm3dImpl>(m, s, out))) ||
         (s.gelu && replace_as<GELUImpl, ::torch::nn::GELUImpl>(m, s, out)) ||
         (s.activation && (replace_as<SiLUImpl, ::torch::nn::SiLUImpl>(m, s, out) ||
                           replace_as<MishImpl, ::torch::nn::MishImpl>(m, s, out) ||
                           replace_as<ELUImpl, ::torch::nn::ELUImpl>(m, s, out) ||
                           replace_as<CELUImpl, ::torch::nn::CELUImpl>(m, s, out) ||
                           replace_as<SoftplusImpl, ::torch::nn::SoftplusImpl>(m, s, out) ||
                           replace_as<TanhImpl, ::torch::nn::TanhImpl>(m, s, out) ||
                           replace_as<SigmoidImpl, ::torch::nn::SigmoidImpl>(m, s, out))) ||
         (s.softmax && replace_as<SoftmaxImpl, ::torch::nn::SoftmaxImpl>(m, s, out)) ||
         // LibTorch's attention with policy none: its own saved tensors through the store.
         ((s.softmax || s.matmul || s.dropout) &&
          replace_as<MultiheadAttentionImpl, ::torch::nn::MultiheadAttentionImpl>(m, p, out)) ||
         (s.dropout && replace_as<DropoutImpl, ::torch::nn::DropoutImpl>(m, s, out));
}

/// A Linear, a convolution, a Conv1D or a MultiheadAttention (the layers with a gamma).
[[nodiscard]] inline bool is_weight_layer(const ::torch::nn::Module& m) {
  return dynamic_cast<const LinearImpl*>(&m) != nullptr ||
         dynamic_cast<const Conv2dImpl*>(&m) != nullptr ||
         dynamic_cast<const Conv1dImpl*>(&m) != nullptr ||
         dynamic_cast<const Conv3dImpl*>(&m) != nullptr ||
         dynamic_cast<const ConvTranspose1dImpl*>(&m) != nullptr ||
         dynamic_cast<const ConvTranspose2dImpl*>(&m) != nullptr ||
         dynamic_cast<const ConvTranspose3dImpl*>(&m) != nullptr ||
         dynamic_cast<const Conv1DImpl*>(&m) != nullptr ||
         dynamic_cast<const MultiheadAttentionImpl*>(&m) != nullptr;
}

/// p with the gamma of the longest `layer_gamma` key that is `path` or a dotted prefix of it.
[[nodiscard]] inline policy with_layer_gamma(policy p, const std::map<std::string, double>& gammas,
                                             const std::string& path) {
  std::size_t best = 0;
  bool found = false;
  for (const auto& [key, gamma] : gammas) {
    const bool match =
        key.empty() || path == key ||
        (path.size() > key.size() && path.starts_with(key) && path[key.size()] == '.');
    if (match && (!found || key.size() >= best)) {
      best = key.size();
      found = true;
      p.gamma = gamma;
    }
  }
  return p;
}

/// Throws unless every `layer_gamma` key names a module under root and every gamma is in [0, 1].
inline void check_layer_gamma(::torch::nn::Module& root,
                              const std::map<std::string, double>& gammas) {
  if (gammas.empty()) return;
  const auto modules = root.named_modules();
  for (const auto& [key, gamma] : gammas) {
    DROPIT_EXPECTS(gamma >= 0.0 && gamma <= 1.0, "torch::to_dropit: layer_gamma['", key,
                   "'] must be in [0, 1], got ", gamma);
    DROPIT_EXPECTS(key.empty() || modules.contains(key), "torch::to_dropit: layer_gamma names '",
                   key, "', no module of the model (paths look like 0, features.3, blocks.0.qkv)");
  }
}

inline std::string child_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

/// Lets each MaxPool2d of seq that a ReLU follows apply that ReLU (neither excluded).
template <class Excluded>
void fuse_pool_relu(::torch::nn::SequentialImpl& seq, const std::string& path,
                    const Excluded& excluded, convert_report& r) {
  const auto names = seq.named_children();
  for (std::size_t i = 0; i + 1 < seq.size(); ++i) {
    auto* pool = dynamic_cast<MaxPool2dImpl*>(seq.ptr(i).get());
    auto* relu = dynamic_cast<ReLUImpl*>(seq.ptr(i + 1).get());
    if (pool == nullptr || relu == nullptr || pool->applies_relu() || relu->absorbed() ||
        pool->excluded() || relu->excluded() || excluded(child_path(path, names[i].key()), *pool) ||
        excluded(child_path(path, names[i + 1].key()), *relu)) {
      continue;
    }
    pool->apply_relu();
    relu->absorb();
    ++r.fused;
  }
}

inline void convert(::torch::nn::Module& m, const std::string& path, const policy& p,
                    const convert_options& o, convert_report& r) {
  auto excluded = [&](const std::string& at, const ::torch::nn::Module& module) {
    return o.exclude && o.exclude(at, module);
  };
  if (o.replace && (p.active() || o.store.any())) {
    if (auto* seq = dynamic_cast<::torch::nn::SequentialImpl*>(&m)) {
      const auto names = seq->named_children();
      std::size_t i = 0;
      for (auto it = seq->begin(); it != seq->end(); ++it, ++i) {
        const std::string& name = names[i].key();
        replacement rep;
        if (!make_replacement(it->ptr(), p, o, excluded(child_path(path, name), *it->ptr()), rep)) {
          continue;
        }
        *it = std::move(rep.any);
        seq->replace_module(name, rep.module);
        ++r.replaced;
      }
      if (p.active() && o.masks && o.fuse_pool_relu) fuse_pool_relu(*seq, path, excluded, r);
    } else if (auto* t = dynamic_cast<::torch::nn::TransformerImpl*>(&m)) {
      // nn::Transformer calls its encoder and decoder through AnyModules: replaced in place, and
      // named as its custom encoder / decoder too, which its reset (run by Cloneable::clone on
      // the copy) clones instead of building standard modules that ours cannot be cloned into.
      for (auto [name, any, custom] :
           {std::tuple{"encoder", &t->encoder, &t->options.custom_encoder()},
            std::tuple{"decoder", &t->decoder, &t->options.custom_decoder()}}) {
        replacement rep;
        if (any->is_empty() ||
            !make_replacement(any->ptr(), p, o, excluded(child_path(path, name), *any->ptr()),
                              rep)) {
          continue;
        }
        *any = std::move(rep.any);
        *custom = *any;
        t->replace_module(name, rep.module);
        ++r.replaced;
      }
    } else if (auto* list = dynamic_cast<::torch::nn::ModuleListImpl*>(&m)) {
      const auto names = list->named_children();
      std::size_t i = 0;
      for (auto it = list->begin(); it != list->end(); ++it, ++i) {
        const std::string& name = names[i].key();
        replacement rep;
        if (!make_replacement(*it, p, o, excluded(child_path(path, name), **it), rep)) continue;
        *it = rep.module;
        list->replace_module(name, rep.module);
        ++r.replaced;
      }
    }
  }
  if (auto* l = dynamic_cast<layer*>(&m)) {
    if (l->excluded()) {
      ++r.excluded;  // opted out before: keeps its policy
    } else if (excluded(path, m)) {
      if (is_weight_layer(m)) {
        l->set_policy(p);
        l->exclude();
      }
      ++r.excluded;
    } else {
      l->set_policy(is_weight_layer(m) ? with_layer_gamma(p, o.layer_gamma, path) : p);
      ++r.switched;
    }
  }
  if (auto* st = dynamic_cast<store_layer*>(&m)) {
    if (!excluded(path, m)) {
      st->set_store(o.store);
      ++r.stored;
    }
  }
  for (const auto& child : m.named_children()) {
    convert(*child.value(), child_path(path, child.key()), p, o, r);
  }
}

}  // namespace detail

inline convert_report to_dropit(::torch::nn::Module& root, const policy& p,
                                const convert_options& options) {
  p.validate();
  detail::check_layer_gamma(root, options.layer_gamma);
  convert_report report;
  detail::convert(root, "", p, options, report);
  return report;
}

}  // namespace dropit::torch
