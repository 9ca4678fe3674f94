// Implementation of dropit::torch's codec-storage modules (torch/store_modules.hpp).
#pragma once

#include <dropit/torch/modules.hpp>  // detail::copy_parameters

#include <string>

namespace dropit::torch {

inline void store_layer::print_store(std::ostream& out, bool on) const {
  out << "store=" << (on ? to_string(store_.codec) : std::string("off"));
}

// ---- LayerNorm -----------------------------------------------------------------------------

inline LayerNormImpl::LayerNormImpl(const ::torch::nn::LayerNormOptions& options,
                                    const store_options& s)
    : ::torch::nn::LayerNormImpl(options), store_layer(s) {
}

inline LayerNormImpl::LayerNormImpl(const ::torch::nn::LayerNormImpl& other, const store_options& s)
    // Module is a virtual base: copy it here too, or the parameters would not come along.
    : ::torch::nn::Module(other), ::torch::nn::LayerNormImpl(other), store_layer(s) {
}

inline at::Tensor LayerNormImpl::forward(const at::Tensor& input) {
  const policy p = is_training() ? store_.policy_for(store_.layernorm) : policy{};
  return dropit::torch::layer_norm(
      input, options.normalized_shape(),
      weight.defined() ? c10::optional<at::Tensor>(weight) : c10::nullopt,
      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, options.eps(), p);
}

inline std::shared_ptr<::torch::nn::Module> LayerNormImpl::clone(
    const c10::optional<c10::Device>& device) const {
  auto copy = std::make_shared<LayerNormImpl>(options, store_);
  detail::copy_parameters(*this, *copy, device);
  copy->train(is_training());
  return copy;
}

inline void LayerNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::LayerNorm(normalized_shape="
         << at::IntArrayRef(options.normalized_shape()) << ", eps=" << options.eps() << ", ";
  print_store(stream, store_.layernorm);
  stream << ")";
}

// ---- BatchNorm1d / 2d / 3d -------------------------------------------------------------------

template <int D>
BatchNormImpl<D>::BatchNormImpl(const ::torch::nn::BatchNormOptions& options,
                                const store_options& s)
    : store_layer(s), options(options) {
  reset();
}

template <int D>
BatchNormImpl<D>::BatchNormImpl(const standard_type& other, const store_options& s)
    : store_layer(s), options(other.options) {
  // The same tensors under the same names: the standard module's parameters (frozen ones stay
  // frozen) and statistics.
  weight = this->register_parameter("weight", other.weight,
                                    other.weight.defined() && other.weight.requires_grad());
  bias = this->register_parameter("bias", other.bias,
                                  other.bias.defined() && other.bias.requires_grad());
  running_mean = this->register_buffer("running_mean", other.running_mean);
  running_var = this->register_buffer("running_var", other.running_var);
  num_batches_tracked = this->register_buffer("num_batches_tracked", other.num_batches_tracked);
  this->train(other.is_training());
}

template <int D>
void BatchNormImpl<D>::reset() {
  const std::int64_t c = options.num_features();
  const bool affine = options.affine(), stats = options.track_running_stats();
  weight = this->register_parameter("weight", affine ? ::torch::ones({c}) : at::Tensor(), affine);
  bias = this->register_parameter("bias", affine ? ::torch::zeros({c}) : at::Tensor(), affine);
  running_mean = this->register_buffer("running_mean", stats ? ::torch::zeros({c}) : at::Tensor());
  running_var = this->register_buffer("running_var", stats ? ::torch::ones({c}) : at::Tensor());
  num_batches_tracked = this->register_buffer(
      "num_batches_tracked", stats ? ::torch::tensor(0, ::torch::kLong) : at::Tensor());
}

template <int D>
at::Tensor BatchNormImpl<D>::forward(const at::Tensor& input) {
  // LibTorch's ranks: 1d takes [N, C] or [N, C, L], 2d and 3d only their own.
  DROPIT_EXPECTS(input.dim() == D + 2 || (D == 1 && input.dim() == 2), "torch::BatchNorm", D,
                 "d: expected a ", D == 1 ? "2-d or 3-d" : (D == 2 ? "4-d" : "5-d"), " input, got ",
                 input.dim(), "-d");
  // LibTorch's module: the average factor is momentum, or with none a cumulative average; batch
  // statistics in training or without running ones.
  double factor = options.momentum().value_or(0.0);
  const bool training = this->is_training();
  if (training && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  using detail::optional_of;
  const policy p = training ? store_.policy_for(store_.batchnorm) : policy{};
  return dropit::torch::batch_norm(input, optional_of(weight), optional_of(bias),
                                   optional_of(running_mean), optional_of(running_var),
                                   training || !options.track_running_stats(), factor,
                                   options.eps(), p);
}

template <int D>
void BatchNormImpl<D>::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::BatchNorm" << D << "d(" << options.num_features()
         << ", eps=" << options.eps() << ", ";
  print_store(stream, store_.batchnorm);
  stream << ")";
}

// ---- SiLU, Mish, ELU, CELU, Softplus, Tanh, Sigmoid -------------------------------------------

template <class Standard>
at::Tensor ActivationImpl<Standard>::forward(const at::Tensor& input) {
  using of = detail::activation_of<Standard>;
  const policy p = this->is_training() ? store_.policy_for(store_.activation) : policy{};
  if (!p.active()) return Standard::forward(input);
  if constexpr (requires { this->options.inplace(); }) {  // ELU, CELU
    if (this->options.inplace()) {
      at::Tensor x = input;
      return dropit::torch::activation_(x, of::kind, p, of::params(*this));
    }
  }
  return dropit::torch::activation(input, of::kind, p, of::params(*this));
}

template <class Standard>
std::shared_ptr<::torch::nn::Module> ActivationImpl<Standard>::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<ActivationImpl>(static_cast<const Standard&>(*this), store_);
  copy->train(this->is_training());
  return copy;
}

template <class Standard>
void ActivationImpl<Standard>::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::" << detail::activation_of<Standard>::name << "(";
  detail::activation_of<Standard>::print(stream, *this);
  print_store(stream, store_.activation);
  stream << ")";
}

// ---- GELU ----------------------------------------------------------------------------------

inline GELUImpl::GELUImpl(const ::torch::nn::GELUOptions& options, const store_options& s)
    : ::torch::nn::GELUImpl(options), store_layer(s) {
}

inline GELUImpl::GELUImpl(const ::torch::nn::GELUImpl& other, const store_options& s)
    : ::torch::nn::Module(other), ::torch::nn::GELUImpl(other), store_layer(s) {
}

inline at::Tensor GELUImpl::forward(const at::Tensor& input) {
  const policy p = is_training() ? store_.policy_for(store_.gelu) : policy{};
  return dropit::torch::gelu(input, p, options.approximate());
}

inline std::shared_ptr<::torch::nn::Module> GELUImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<GELUImpl>(options, store_);
  copy->train(is_training());
  return copy;
}

inline void GELUImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::GELU(approximate=" << options.approximate() << ", ";
  print_store(stream, store_.gelu);
  stream << ")";
}

// ---- Softmax -------------------------------------------------------------------------------

inline SoftmaxImpl::SoftmaxImpl(const ::torch::nn::SoftmaxOptions& options, const store_options& s)
    : ::torch::nn::SoftmaxImpl(options), store_layer(s) {
}

inline SoftmaxImpl::SoftmaxImpl(const ::torch::nn::SoftmaxImpl& other, const store_options& s)
    : ::torch::nn::Module(other), ::torch::nn::SoftmaxImpl(other), store_layer(s) {
}

inline at::Tensor SoftmaxImpl::forward(const at::Tensor& input) {
  const policy p = is_training() ? store_.policy_for(store_.softmax) : policy{};
  return dropit::torch::softmax(input, options.dim(), p);
}

inline std::shared_ptr<::torch::nn::Module> SoftmaxImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<SoftmaxImpl>(options, store_);
  copy->train(is_training());
  return copy;
}

inline void SoftmaxImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::Softmax(dim=" << options.dim() << ", ";
  print_store(stream, store_.softmax);
  stream << ")";
}

// ---- Dropout -------------------------------------------------------------------------------

inline DropoutImpl::DropoutImpl(const ::torch::nn::DropoutOptions& options, const store_options& s)
    : ::torch::nn::DropoutImpl(options), store_layer(s) {
}

inline DropoutImpl::DropoutImpl(const ::torch::nn::DropoutImpl& other, const store_options& s)
    : ::torch::nn::Module(other), ::torch::nn::DropoutImpl(other), store_layer(s) {
}

inline at::Tensor DropoutImpl::forward(at::Tensor input) {
  if (!store_.dropout) return ::torch::nn::DropoutImpl::forward(std::move(input));
  return dropit::torch::dropout(input, options.p(), is_training(), true);
}

inline std::shared_ptr<::torch::nn::Module> DropoutImpl::clone(
    const c10::optional<c10::Device>&) const {
  auto copy = std::make_shared<DropoutImpl>(options, store_);
  copy->train(is_training());
  return copy;
}

inline void DropoutImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::Dropout(p=" << options.p()
         << (options.inplace() ? ", inplace=true" : "")
         << ", store=" << (store_.dropout ? "bits" : "off") << ")";
}

// ---- SoftmaxAttention ----------------------------------------------------------------------

inline SoftmaxAttentionImpl::SoftmaxAttentionImpl(double dropout_, const store_options& s)
    : store_layer(s), dropout(dropout_) {
  DROPIT_EXPECTS(dropout >= 0 && dropout <= 1,
                 "torch::SoftmaxAttention: dropout must be in [0, 1], got ", dropout);
}

inline at::Tensor SoftmaxAttentionImpl::forward(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& mask,
                                                const at::Tensor& masked) {
  const bool on = is_training();
  attention_options o;
  o.mask = mask;
  o.masked = masked;
  o.dropout = on ? dropout : 0.0;
  o.dropout_bits = on && store_.dropout;
  return dropit::torch::attention(q, k, v, on ? store_.policy_for(store_.softmax) : policy{},
                                  on ? store_.policy_for(store_.matmul) : policy{}, o);
}

inline void SoftmaxAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "dropit::torch::SoftmaxAttention(";
  if (dropout > 0) stream << "dropout=" << dropout << ", ";
  stream << "softmax ";
  print_store(stream, store_.softmax);
  stream << ", matmul ";
  print_store(stream, store_.matmul);
  if (dropout > 0) stream << ", dropout store=" << (store_.dropout ? "bits" : "off");
  stream << ")";
}

}  // namespace dropit::torch
