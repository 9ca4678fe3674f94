// Implementation of dropit::torch's modules (torch/modules.hpp).
#pragma once

#include <dropit/policy.hpp>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/functional/padding.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/utils.h>

#include <array>
#include <atomic>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace dropit::torch {

namespace detail {
/// A distinct salt per layer, in construction order (deterministic for a given program).
inline std::uint64_t next_layer_salt() noexcept {
  static std::atomic<std::uint64_t> next{0};
  return dropit::detail::mix64(next.fetch_add(1, std::memory_order_relaxed) + 1);
}

/// Copies each parameter of `from` into the same-named parameter of `to` (no grad).
inline void copy_parameters(const ::torch::nn::Module& from, ::torch::nn::Module& to,
                            const c10::optional<c10::Device>& device) {
  ::torch::NoGradGuard no_grad;
  auto dst = to.named_parameters(/*recurse=*/false);
  for (const auto& item : from.named_parameters(/*recurse=*/false)) {
    const at::Tensor& src = item.value();
    dst[item.key()].set_data(device && src.device() != *device ? src.to(*device) : src.clone());
  }
}

/**
 * A d-dimensional convolution module's input padded as LibTorch's module pads it, and the
 * symmetric padding left to the convolution: explicit, 'valid' or 'same' (the odd one out on the
 * far side, as LibTorch does); a padding mode other than zeros pads explicitly.
 */
template <std::size_t D>
[[nodiscard]] std::pair<at::Tensor, std::vector<std::int64_t>> conv_module_input(
    const at::Tensor& input, const ::torch::nn::detail::ConvNdOptions<D>& o) {
  std::array<std::int64_t, D> left{}, right{};
  if (const auto* pad = c10::get_if<::torch::ExpandingArray<D>>(&o.padding())) {
    for (std::size_t i = 0; i < D; ++i)
      left[i] = right[i] = (**pad)[i];
  } else if (c10::get_if<::torch::enumtype::kSame>(&o.padding()) != nullptr) {
    for (std::size_t i = 0; i < D; ++i) {
      const std::int64_t total = (*o.dilation())[i] * ((*o.kernel_size())[i] - 1);
      left[i] = total / 2;
      right[i] = total - left[i];
    }
  }
  if (c10::get_if<::torch::enumtype::kZeros>(&o.padding_mode()) == nullptr) {
    namespace F = ::torch::nn::functional;
    F::PadFuncOptions::mode_t mode = ::torch::kCircular;
    if (c10::get_if<::torch::enumtype::kReflect>(&o.padding_mode())) mode = ::torch::kReflect;
    if (c10::get_if<::torch::enumtype::kReplicate>(&o.padding_mode())) mode = ::torch::kReplicate;
    std::vector<std::int64_t> pads;  // the last dimension first
    for (std::size_t i = D; i-- > 0;) {
      pads.push_back(left[i]);
      pads.push_back(right[i]);
    }
    return {F::pad(input, F::PadFuncOptions(pads).mode(mode)), std::vector<std::int64_t>(D, 0)};
  }
  at::Tensor x = input;
  if (left != right) {
    std::vector<std::int64_t> extra;  // on the far side, the last dimension first
    for (std::size_t i = D; i-- > 0;) {
      extra.push_back(0);
      extra.push_back(right[i] - left[i]);
    }
    x = at::constant_pad_nd(x, extra, 0);
  }
  return {x, {left.begin(), left.end()}};
}

/// A module's bias as the functional ops take it.
[[nodiscard]] inline c10::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
}

/// A torch::nn module's printout without its "torch::nn::" prefix and closing parenthesis.
inline std::string base_text(std::string s) {
  if (s.starts_with("torch::nn::")) s.erase(0, 11);
  if (!s.empty() && s.back() == ')') s.pop_back();
  return s;
}
}  // namespace detail

// ---- layer ---------------------------------------------------------------------------------

inline layer::layer(const policy& p) : salt_(detail::next_layer_salt()) {
  set_policy(p);
}

inline void layer::set_policy(const policy& p) {
  p.validate();
  policy_ = p;
}

inline policy layer::step_policy(bool training) {
  if (excluded_ || !policy_.active() || !training || !::torch::autograd::GradMode::is_enabled()) {
    return policy{};
  }
  policy p = policy_;
  p.seed = policy_.seed + step_ + salt_;
  ++step_;
  return p;
}

inline policy layer::weight_policy(bool training) {
  if (excluded_ && policy_.active() && training && ::torch::autograd::GradMode::is_enabled()) {
    return policy{policy_kind::identity, 0.0, 0, value_codec::exact};
  }
  return step_policy(training);
}

inline void layer::print_policy(std::ostream& out) const {
  if (excluded_) {
    out << "excluded";
    return;
  }
  out << "policy=" << to_string(policy_.kind);
  if (policy_.kind == policy_kind::mink || policy_.kind == policy_kind::random) {
    out << "(" << policy_.gamma << ")";
  }
}

// ---- Linear --------------------------------------------------------------------------------

inline LinearImpl::LinearImpl(std::int64_t in_features, std::int64_t out_features, const policy& p)
    : LinearImpl(::torch::nn::LinearOptions(in_features, out_features), p) {
}

inline LinearImpl::LinearImpl(const ::torch::nn::LinearOptions& options, const policy& p)
    : ::torch::nn::LinearImpl(options), layer(p) {
}

inline LinearImpl::LinearImpl(const ::torch::nn::LinearImpl& other, const policy& p)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), ::torch::nn::LinearImpl(other), layer(p) {
}

inline at::Tensor LinearImpl::forward(const at::Tensor& input) {
  const policy p = weight_policy(is_training());
  return dropit::torch::linear(input, weight,
                               bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, p);
}

inline std::shared_ptr<::torch::nn::Module> LinearImpl::clone(
    const c10::optional<c10::Device>& device) const {
  auto copy = std::make_shared<LinearImpl>(options, get_policy());
  copy->exclude(excluded());
  detail::copy_parameters(*this, *copy, device);
  copy->train(is_training());
  return copy;
}

inline void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ", ";
  print_policy(stream);
  stream << ")";
}

// ---- Conv1d / Conv2d / Conv3d -----------------------------------------------------------

template <std::size_t D>
ConvImpl<D>::ConvImpl(const ::torch::nn::ConvOptions<D>& options, const policy& p)
    : standard_type(options), layer(p) {
}

template <std::size_t D>
ConvImpl<D>::ConvImpl(const standard_type& other, const policy& p)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), standard_type(other), layer(p) {
}

template <std::size_t D>
at::Tensor ConvImpl<D>::forward(const at::Tensor& input) {
  const auto& o = this->options;
  const at::Tensor& w = this->weight;
  const policy p = weight_policy(this->is_training());
  if (!detail::wants_cache(p, input, w)) return standard_type::forward(input);
  constexpr auto rank = static_cast<std::int64_t>(D);
  DROPIT_EXPECTS(input.dim() == rank + 1 || input.dim() == rank + 2, "torch::Conv", D,
                 "d: input must be ", rank + 1, "-d or ", rank + 2, "-d, got ", input.dim(), "-d");
  const bool batched = input.dim() == rank + 2;
  const auto [x, padding] = detail::conv_module_input<D>(batched ? input : input.unsqueeze(0), o);
  const detail::conv_geometry c{{o.stride()->begin(), o.stride()->end()},
                                padding,
                                {o.dilation()->begin(), o.dilation()->end()},
                                o.groups(),
                                false,
                                {}};
  at::Tensor y = detail::conv_fn::apply(x, w, detail::optional_bias(this->bias), c, p);
  return batched ? y : y.squeeze(0);
}

template <std::size_t D>
std::shared_ptr<::torch::nn::Module> ConvImpl<D>::clone(
    const c10::optional<c10::Device>& device) const {
  const auto& o = this->options;
  auto copy = std::make_shared<ConvImpl>(
      ::torch::nn::ConvOptions<D>(o.in_channels(), o.out_channels(), o.kernel_size())
          .stride(o.stride())
          .padding(o.padding())
          .dilation(o.dilation())
          .groups(o.groups())
          .bias(o.bias())
          .padding_mode(o.padding_mode()),
      get_policy());
  copy->exclude(excluded());
  detail::copy_parameters(*this, *copy, device);
  copy->train(this->is_training());
  return copy;
}

template <std::size_t D>
void ConvImpl<D>::pretty_print(std::ostream& stream) const {
  std::ostringstream base;
  standard_type::pretty_print(base);
  stream << "dropit::torch::" << detail::base_text(base.str()) << ", ";
  print_policy(stream);
  stream << ")";
}

// ---- ConvTranspose1d / 2d / 3d ----------------------------------------------------------

namespace detail {
/// The output padding that makes a transposed convolution of the batched input x produce
/// `output_size` (D spatial sizes, or D + 2 with batch and channels), as PyTorch's
/// `_ConvTransposeNd._output_padding` (dilation included); the options' own without one.
template <std::size_t D>
[[nodiscard]] std::vector<std::int64_t> transposed_output_padding(
    const at::Tensor& x, const c10::optional<at::IntArrayRef>& output_size,
    const ::torch::nn::detail::ConvNdOptions<D>& o, const std::vector<std::int64_t>& padding) {
  if (!output_size.has_value()) {
    return {o.output_padding()->begin(), o.output_padding()->end()};
  }
  at::IntArrayRef size = *output_size;
  DROPIT_EXPECTS(size.size() == D || size.size() == D + 2, "torch::ConvTranspose", D,
                 "d: output_size must have ", D, " or ", D + 2, " entries, got ", size.size());
  if (size.size() == D + 2) size = size.slice(2);
  std::vector<std::int64_t> out(D);
  for (std::size_t i = 0; i < D; ++i) {
    const std::int64_t low =
        conv_transpose_output_size(x.size(static_cast<std::int64_t>(i) + 2), (*o.kernel_size())[i],
                                   padding[i], (*o.stride())[i], (*o.dilation())[i], 0);
    const std::int64_t high = low + (*o.stride())[i] - 1;
    DROPIT_EXPECTS(size[i] >= low && size[i] <= high, "torch::ConvTranspose", D, "d: output size ",
                   size[i], " of spatial dimension ", i, " is out of reach: valid sizes are ", low,
                   " to ", high);
    out[i] = size[i] - low;
  }
  return out;
}
}  // namespace detail

template <std::size_t D>
ConvTransposeImpl<D>::ConvTransposeImpl(const ::torch::nn::ConvTransposeOptions<D>& options,
                                        const policy& p)
    : standard_type(options), layer(p) {
}

template <std::size_t D>
ConvTransposeImpl<D>::ConvTransposeImpl(const standard_type& other, const policy& p)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), standard_type(other), layer(p) {
}

template <std::size_t D>
at::Tensor ConvTransposeImpl<D>::forward(const at::Tensor& input,
                                         const c10::optional<at::IntArrayRef>& output_size) {
  const auto& o = this->options;
  const at::Tensor& w = this->weight;
  const policy p = weight_policy(this->is_training());
  if (!detail::wants_cache(p, input, w)) return standard_type::forward(input, output_size);
  DROPIT_EXPECTS(c10::get_if<::torch::enumtype::kZeros>(&o.padding_mode()) != nullptr,
                 "torch::ConvTranspose", D, "d: only the zeros padding mode is supported");
  constexpr auto rank = static_cast<std::int64_t>(D);
  DROPIT_EXPECTS(input.dim() == rank + 1 || input.dim() == rank + 2, "torch::ConvTranspose", D,
                 "d: input must be ", rank + 1, "-d or ", rank + 2, "-d, got ", input.dim(), "-d");
  const bool batched = input.dim() == rank + 2;
  const at::Tensor x = batched ? input : input.unsqueeze(0);
  const auto& pad = c10::get<::torch::ExpandingArray<D>>(o.padding());
  detail::conv_geometry c{{o.stride()->begin(), o.stride()->end()},
                          {pad->begin(), pad->end()},
                          {o.dilation()->begin(), o.dilation()->end()},
                          o.groups(),
                          true,
                          {}};
  c.output_padding = detail::transposed_output_padding<D>(x, output_size, o, c.padding);
  at::Tensor y = detail::conv_fn::apply(x, w, detail::optional_bias(this->bias), c, p);
  return batched ? y : y.squeeze(0);
}

template <std::size_t D>
std::shared_ptr<::torch::nn::Module> ConvTransposeImpl<D>::clone(
    const c10::optional<c10::Device>& device) const {
  const auto& o = this->options;
  auto copy = std::make_shared<ConvTransposeImpl>(
      ::torch::nn::ConvTransposeOptions<D>(o.in_channels(), o.out_channels(), o.kernel_size())
          .stride(o.stride())
          .padding(c10::get<::torch::ExpandingArray<D>>(o.padding()))
          .output_padding(o.output_padding())
          .groups(o.groups())
          .bias(o.bias())
          .dilation(o.dilation())
          .padding_mode(o.padding_mode()),
      get_policy());
  copy->exclude(excluded());
  detail::copy_parameters(*this, *copy, device);
  copy->train(this->is_training());
  return copy;
}

template <std::size_t D>
void ConvTransposeImpl<D>::pretty_print(std::ostream& stream) const {
  std::ostringstream base;
  standard_type::pretty_print(base);
  stream << "dropit::torch::" << detail::base_text(base.str()) << ", ";
  print_policy(stream);
  stream << ")";
}

// ---- Conv1D --------------------------------------------------------------------------------

inline Conv1DImpl::Conv1DImpl(std::int64_t nf, std::int64_t nx, const policy& p)
    : Conv1DImpl(Conv1DOptions(nf, nx), p) {
}

inline Conv1DImpl::Conv1DImpl(const Conv1DOptions& options_, const policy& p)
    : layer(p), options(options_) {
  reset();
}

inline void Conv1DImpl::reset() {
  DROPIT_EXPECTS(options.nf() > 0 && options.nx() > 0,
                 "torch::Conv1D: nf and nx must be positive, "
                 "got nf = ",
                 options.nf(), ", nx = ", options.nx());
  weight = register_parameter("weight", ::torch::empty({options.nx(), options.nf()}));
  // GPT-2's init, N(0, 0.02), from the default generator. (LibTorch's compiled init rather than
  // the inline Tensor::normal_: copying its empty optional generator inline makes g++ -O2 with
  // ASan warn -Wmaybe-uninitialized inside c10.)
  ::torch::nn::init::normal_(weight, 0.0, 0.02);
  if (options.bias()) {
    bias = register_parameter("bias", ::torch::zeros({options.nf()}));
  } else {
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
}

inline at::Tensor Conv1DImpl::forward(const at::Tensor& input) {
  const policy p = weight_policy(is_training());
  return gpt2_conv1d(input, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                     p);
}

inline void Conv1DImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::Conv1D(nf=" << options.nf() << ", nx=" << options.nx()
         << ", bias=" << std::boolalpha << options.bias() << ", ";
  print_policy(stream);
  stream << ")";
}

// ---- ReLU ----------------------------------------------------------------------------------

inline ReLUImpl::ReLUImpl(const ::torch::nn::ReLUOptions& options, const policy& p)
    : ::torch::nn::ReLUImpl(options), layer(p) {
}

inline ReLUImpl::ReLUImpl(const ::torch::nn::ReLUImpl& other, const policy& p)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), ::torch::nn::ReLUImpl(other), layer(p) {
}

inline at::Tensor ReLUImpl::forward(const at::Tensor& input) {
  if (absorbed_) return input;
  if (!step_policy(is_training()).active()) return ::torch::nn::ReLUImpl::forward(input);
  if (options.inplace()) {
    at::Tensor x = input;
    return dropit::torch::relu_(x);
  }
  return dropit::torch::relu(input);
}

inline std::shared_ptr<::torch::nn::Module> ReLUImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<ReLUImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->absorb(absorbed_);
  copy->train(is_training());
  return copy;
}

inline void ReLUImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::ReLU(" << (options.inplace() ? "inplace=true, " : "");
  if (absorbed_) stream << "absorbed by the MaxPool2d before, ";
  print_policy(stream);
  stream << ")";
}

// ---- LeakyReLU -----------------------------------------------------------------------------

inline LeakyReLUImpl::LeakyReLUImpl(const ::torch::nn::LeakyReLUOptions& options, const policy& p)
    : ::torch::nn::LeakyReLUImpl(options), layer(p) {
}

inline LeakyReLUImpl::LeakyReLUImpl(const ::torch::nn::LeakyReLUImpl& other, const policy& p)
    : ::torch::nn::Module(other), ::torch::nn::LeakyReLUImpl(other), layer(p) {
}

inline at::Tensor LeakyReLUImpl::forward(const at::Tensor& input) {
  if (!step_policy(is_training()).active()) return ::torch::nn::LeakyReLUImpl::forward(input);
  if (options.inplace()) {
    at::Tensor x = input;
    return dropit::torch::leaky_relu_(x, options.negative_slope());
  }
  return dropit::torch::leaky_relu(input, options.negative_slope());
}

inline std::shared_ptr<::torch::nn::Module> LeakyReLUImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<LeakyReLUImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->train(is_training());
  return copy;
}

inline void LeakyReLUImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::LeakyReLU(negative_slope=" << options.negative_slope() << ", "
         << (options.inplace() ? "inplace=true, " : "");
  print_policy(stream);
  stream << ")";
}

// ---- Hardtanh, ReLU6 -----------------------------------------------------------------------

inline HardtanhImpl::HardtanhImpl(const ::torch::nn::HardtanhOptions& options, const policy& p)
    : ::torch::nn::HardtanhImpl(options), layer(p) {
}

inline HardtanhImpl::HardtanhImpl(const ::torch::nn::HardtanhImpl& other, const policy& p)
    : ::torch::nn::Module(other), ::torch::nn::HardtanhImpl(other), layer(p) {
}

inline at::Tensor HardtanhImpl::forward(const at::Tensor& input) {
  if (!step_policy(is_training()).active()) return ::torch::nn::HardtanhImpl::forward(input);
  if (options.inplace()) {
    at::Tensor x = input;
    return dropit::torch::hardtanh_(x, options.min_val(), options.max_val());
  }
  return dropit::torch::hardtanh(input, options.min_val(), options.max_val());
}

inline std::shared_ptr<::torch::nn::Module> HardtanhImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<HardtanhImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->train(is_training());
  return copy;
}

inline void HardtanhImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::Hardtanh(min_val=" << options.min_val()
         << ", max_val=" << options.max_val() << ", "
         << (options.inplace() ? "inplace=true, " : "");
  print_policy(stream);
  stream << ")";
}

inline ReLU6Impl::ReLU6Impl(const ::torch::nn::ReLU6Options& options, const policy& p)
    : ::torch::nn::ReLU6Impl(options), layer(p) {
}

inline ReLU6Impl::ReLU6Impl(const ::torch::nn::ReLU6Impl& other, const policy& p)
    : ::torch::nn::Module(other), ::torch::nn::ReLU6Impl(other), layer(p) {
}

inline at::Tensor ReLU6Impl::forward(const at::Tensor& input) {
  if (!step_policy(is_training()).active()) return ::torch::nn::ReLU6Impl::forward(input);
  if (options.inplace()) {
    at::Tensor x = input;
    return dropit::torch::hardtanh_(x, 0.0, 6.0);
  }
  return dropit::torch::hardtanh(input, 0.0, 6.0);
}

inline std::shared_ptr<::torch::nn::Module> ReLU6Impl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<ReLU6Impl>(options, get_policy());
  copy->exclude(excluded());
  copy->train(is_training());
  return copy;
}

inline void ReLU6Impl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::ReLU6(" << (options.inplace() ? "inplace=true, " : "");
  print_policy(stream);
  stream << ")";
}

// ---- MaxPool2d -----------------------------------------------------------------------------

inline MaxPool2dImpl::MaxPool2dImpl(const ::torch::nn::MaxPool2dOptions& options, const policy& p)
    : ::torch::nn::MaxPool2dImpl(options), layer(p) {
}

inline MaxPool2dImpl::MaxPool2dImpl(const ::torch::nn::MaxPool2dImpl& other, const policy& p)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), ::torch::nn::MaxPool2dImpl(other), layer(p) {
}

inline at::Tensor MaxPool2dImpl::forward(const at::Tensor& input) {
  if (!step_policy(is_training()).active()) {
    at::Tensor y = ::torch::nn::MaxPool2dImpl::forward(input);
    return relu_ ? at::relu_(y) : y;
  }
  max_pool2d_params m;
  m.kernel = {(*options.kernel_size())[0], (*options.kernel_size())[1]};
  m.stride = {(*options.stride())[0], (*options.stride())[1]};
  m.padding = {(*options.padding())[0], (*options.padding())[1]};
  m.dilation = {(*options.dilation())[0], (*options.dilation())[1]};
  m.ceil_mode = options.ceil_mode();
  return relu_ ? dropit::torch::max_pool2d_relu(input, m) : dropit::torch::max_pool2d(input, m);
}

inline std::shared_ptr<::torch::nn::Module> MaxPool2dImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<MaxPool2dImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->apply_relu(relu_);
  copy->train(is_training());
  return copy;
}

inline void MaxPool2dImpl::pretty_print(std::ostream& stream) const {
  std::ostringstream base;
  ::torch::nn::MaxPool2dImpl::pretty_print(base);
  stream << "dropit::torch::" << detail::base_text(base.str()) << ", ";
  if (relu_) stream << "relu=true, ";
  print_policy(stream);
  stream << ")";
}

// ---- AvgPool2d, AdaptiveAvgPool2d ------------------------------------------------------------

inline AvgPool2dImpl::AvgPool2dImpl(const ::torch::nn::AvgPool2dOptions& options, const policy& p)
    : ::torch::nn::AvgPool2dImpl(options), layer(p) {
}

inline AvgPool2dImpl::AvgPool2dImpl(const ::torch::nn::AvgPool2dImpl& other, const policy& p)
    : ::torch::nn::Module(other), ::torch::nn::AvgPool2dImpl(other), layer(p) {
}

inline at::Tensor AvgPool2dImpl::forward(const at::Tensor& input) {
  if (!step_policy(is_training()).active()) return ::torch::nn::AvgPool2dImpl::forward(input);
  return dropit::torch::avg_pool2d(input, options.kernel_size(), options.stride(),
                                   options.padding(), options.ceil_mode(),
                                   options.count_include_pad(), options.divisor_override());
}

inline std::shared_ptr<::torch::nn::Module> AvgPool2dImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<AvgPool2dImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->train(is_training());
  return copy;
}

inline void AvgPool2dImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::AvgPool2d(kernel_size=" << options.kernel_size()
         << ", stride=" << options.stride() << ", padding=" << options.padding() << ", ";
  print_policy(stream);
  stream << ")";
}

inline AdaptiveAvgPool2dImpl::AdaptiveAvgPool2dImpl(
    const ::torch::nn::AdaptiveAvgPool2dOptions& options, const policy& p)
    : ::torch::nn::AdaptiveAvgPool2dImpl(options), layer(p) {
}

inline AdaptiveAvgPool2dImpl::AdaptiveAvgPool2dImpl(const ::torch::nn::AdaptiveAvgPool2dImpl& other,
                                                    const policy& p)
    : ::torch::nn::Module(other), ::torch::nn::AdaptiveAvgPool2dImpl(other), layer(p) {
}

inline at::Tensor AdaptiveAvgPool2dImpl::forward(const at::Tensor& input) {
  if (!step_policy(is_training()).active()) {
    return ::torch::nn::AdaptiveAvgPool2dImpl::forward(input);
  }
  // An output size of None keeps the input's size in that dimension, as LibTorch's module.
  const auto size =
      ::torch::nn::modules::utils::_list_with_default(options.output_size(), input.sizes());
  return dropit::torch::adaptive_avg_pool2d(input, size);
}

inline std::shared_ptr<::torch::nn::Module> AdaptiveAvgPool2dImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<AdaptiveAvgPool2dImpl>(options, get_policy());
  copy->exclude(excluded());
  copy->train(is_training());
  return copy;
}

inline void AdaptiveAvgPool2dImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::AdaptiveAvgPool2d(output_size=" << options.output_size() << ", ";
  print_policy(stream);
  stream << ")";
}

}  // namespace dropit::torch
