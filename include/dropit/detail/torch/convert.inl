// Implementation of dropit::torch::to_dropit (torch/convert.hpp).
#pragma once

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>

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

/// The dropit layer replacing m, if m is a standard layer dropit has a counterpart for.
inline bool make_replacement(const std::shared_ptr<::torch::nn::Module>& m, const policy& p,
                             const convert_options& o, replacement& out) {
  if (dynamic_cast<const layer*>(m.get()) != nullptr ||
      dynamic_cast<const store_layer*>(m.get()) != nullptr) {
    return false;
  }
  const store_options& s = o.store;
  return (p.active() &&
          (replace_as<LinearImpl, ::torch::nn::LinearImpl>(m, p, out) ||
           replace_as<Conv2dImpl, ::torch::nn::Conv2dImpl>(m, p, out) ||
           (o.masks && (replace_as<ReLUImpl, ::torch::nn::ReLUImpl>(m, p, out) ||
                        replace_as<MaxPool2dImpl, ::torch::nn::MaxPool2dImpl>(m, p, out))))) ||
         (s.layernorm && replace_as<LayerNormImpl, ::torch::nn::LayerNormImpl>(m, s, out)) ||
         (s.gelu && replace_as<GELUImpl, ::torch::nn::GELUImpl>(m, s, out)) ||
         (s.softmax && replace_as<SoftmaxImpl, ::torch::nn::SoftmaxImpl>(m, s, out)) ||
         (s.dropout && replace_as<DropoutImpl, ::torch::nn::DropoutImpl>(m, s, out));
}

inline std::string child_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
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
        if (excluded(child_path(path, name), *it->ptr()) ||
            !make_replacement(it->ptr(), p, o, rep)) {
          continue;
        }
        *it = std::move(rep.any);
        seq->replace_module(name, rep.module);
        ++r.replaced;
      }
    } else if (auto* list = dynamic_cast<::torch::nn::ModuleListImpl*>(&m)) {
      const auto names = list->named_children();
      std::size_t i = 0;
      for (auto it = list->begin(); it != list->end(); ++it, ++i) {
        const std::string& name = names[i].key();
        replacement rep;
        if (excluded(child_path(path, name), **it) || !make_replacement(*it, p, o, rep)) {
          continue;
        }
        *it = rep.module;
        list->replace_module(name, rep.module);
        ++r.replaced;
      }
    }
  }
  if (auto* l = dynamic_cast<layer*>(&m)) {
    if (l->excluded() || excluded(path, m)) {
      ++r.excluded;
    } else {
      l->set_policy(p);
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
  convert_report report;
  detail::convert(root, "", p, options, report);
  return report;
}

}  // namespace dropit::torch
