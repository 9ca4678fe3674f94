// Implementation of dropit::torch's codec storage (torch/store.hpp): autograd functions that run
// LibTorch's kernels and keep their saved tensors packed.
#pragma once

#include <dropit/detail/torch/saved.hpp>
#include <dropit/torch/packed.hpp>

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <array>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dropit::torch {

inline store_options store_options::all(value_codec c) {
  store_options s;
  s.codec = c;
  s.layernorm = s.gelu = s.softmax = s.matmul = s.dropout = s.batchnorm = s.activation = true;
  return s;
}

inline store_options store_options::parse(std::string_view classes, value_codec c) {
  store_options s;
  s.codec = c;
  while (!classes.empty()) {
    const std::size_t comma = classes.find(',');
    const std::string_view name = classes.substr(0, comma);
    if (name == "all") {
      s = all(c);
    } else if (name == "layernorm") {
      s.layernorm = true;
    } else if (name == "gelu") {
      s.gelu = true;
    } else if (name == "softmax") {
      s.softmax = true;
    } else if (name == "matmul") {
      s.matmul = true;
    } else if (name == "dropout") {
      s.dropout = true;
    } else if (name == "batchnorm") {
      s.batchnorm = true;
    } else if (name == "activation") {
      s.activation = true;
    } else {
      DROPIT_EXPECTS(false, "torch::store_options: unknown class '", std::string(name),
                     "' (layernorm, gelu, softmax, matmul, dropout, batchnorm, activation, all)");
    }
    classes = comma == std::string_view::npos ? std::string_view{} : classes.substr(comma + 1);
  }
  return s;
}

inline std::string to_string(const store_options& s) {
  std::string out;
  const std::array<std::pair<bool, const char*>, 7> classes{{{s.layernorm, "layernorm"},
                                                             {s.gelu, "gelu"},
                                                             {s.softmax, "softmax"},
                                                             {s.matmul, "matmul"},
                                                             {s.dropout, "dropout"},
                                                             {s.batchnorm, "batchnorm"},
                                                             {s.activation, "activation"}}};
  for (const auto& [on, name] : classes) {
    if (!on) continue;
    if (!out.empty()) out += ',';
    out += name;
  }
  return out;
}

namespace detail {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

/// Throws unless p is a pack a dense saved tensor can take (none or identity).
inline void check_store(const policy& p, const char* who) {
  p.validate();
  DROPIT_EXPECTS(p.kind == policy_kind::none || p.kind == policy_kind::identity, "torch::", who,
                 ": a stored tensor is read whole by backward: use an identity policy with a "
                 "codec (store_options::policy_for), got ",
                 to_string(p.kind));
}

/// Whether a store function packs: a policy, grad mode on, and some input needing a gradient.
template <class... T>
[[nodiscard]] bool wants_store(const policy& p, const T&... inputs) {
  return p.active() && ::torch::autograd::GradMode::is_enabled() &&
         (... || (inputs.defined() && inputs.requires_grad()));
}

/// Throws from a backward under create_graph: its saved tensors come back without autograd
/// history, so a gradient built from them would silently lack their part of the second
/// derivative.
inline void refuse_create_graph(const char* who) {
  DROPIT_EXPECTS(!::torch::autograd::GradMode::is_enabled(), "torch::", who,
                 ": double backward (create_graph) is not supported (its saved tensors are "
                 "rebuilt without autograd history); use LibTorch's op for a gradient penalty");
}

/// A tensor to save: packed with p when p is active, else as it is.
[[nodiscard]] inline at::Tensor keep(const at::Tensor& t, const policy& p) {
  return p.active() ? save_packed(t, p) : t;
}

/// What `keep` saved, back as a tensor of `sizes` (contiguous when it was packed).
[[nodiscard]] inline at::Tensor unkeep(const at::Tensor& saved, bool packed,
                                       at::IntArrayRef sizes) {
  return packed ? restore_packed(saved, sizes) : saved;
}

[[nodiscard]] inline c10::optional<at::Tensor> optional_of(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

struct layer_norm_fn : ::torch::autograd::Function<layer_norm_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& w, const c10::optional<at::Tensor>& b,
                            std::vector<std::int64_t> shape, double eps, const policy& p) {
    auto [y, mean, rstd] = at::native_layer_norm(x, shape, w, b, eps);
    ctx->save_for_backward(
        {save_packed(x, p), mean, rstd, w.value_or(at::Tensor()), b.value_or(at::Tensor())});
    ctx->saved_data["x_sizes"] = x.sizes();
    ctx->saved_data["shape"] = shape;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_create_graph("layer_norm");
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor x = restore_packed(s[0], ctx->saved_data["x_sizes"].toIntVector());
    const std::array<bool, 3> mask{ctx->needs_input_grad(0),
                                   s[3].defined() && ctx->needs_input_grad(1),
                                   s[4].defined() && ctx->needs_input_grad(2)};
    auto [gx, gw, gb] =
        at::native_layer_norm_backward(grads[0], x, ctx->saved_data["shape"].toIntVector(), s[1],
                                       s[2], optional_of(s[3]), optional_of(s[4]), mask);
    return {gx, gw, gb, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct batch_norm_fn : ::torch::autograd::Function<batch_norm_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& w, const c10::optional<at::Tensor>& b,
                            const c10::optional<at::Tensor>& running_mean,
                            const c10::optional<at::Tensor>& running_var, double momentum,
                            double eps, const policy& p) {
    // Batch statistics; the running ones (if any) are updated in place, as LibTorch's op does.
    auto [y, mean, invstd] =
        at::native_batch_norm(x, w, b, running_mean, running_var, /*training=*/true, momentum, eps);
    ctx->save_for_backward({save_packed(x, p), mean, invstd, w.value_or(at::Tensor())});
    ctx->saved_data["x_sizes"] = x.sizes();
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["has_bias"] = b.has_value() && b->defined();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_create_graph("batch_norm");
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor x = restore_packed(s[0], ctx->saved_data["x_sizes"].toIntVector());
    const std::array<bool, 3> mask{
        ctx->needs_input_grad(0), s[3].defined() && ctx->needs_input_grad(1),
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)};
    auto [gx, gw, gb] = at::native_batch_norm_backward(grads[0], x, optional_of(s[3]), c10::nullopt,
                                                       c10::nullopt, s[1], s[2], /*train=*/true,
                                                       ctx->saved_data["eps"].toDouble(), mask);
    return {gx, gw, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct gelu_fn : ::torch::autograd::Function<gelu_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const policy& p,
                            const std::string& approximate) {
    at::Tensor y = at::gelu(x, approximate);
    ctx->save_for_backward({save_packed(x, p)});
    ctx->saved_data["x_sizes"] = x.sizes();
    ctx->saved_data["approximate"] = approximate;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_create_graph("gelu");
    const at::Tensor x =
        restore_packed(ctx->get_saved_variables()[0], ctx->saved_data["x_sizes"].toIntVector());
    return {at::gelu_backward(grads[0], x, ctx->saved_data["approximate"].toStringRef()),
            at::Tensor(), at::Tensor()};
  }
};

/// Whether LibTorch's backward of `kind` reads the output (tanh, sigmoid) rather than the input.
[[nodiscard]] constexpr bool reads_output(activation_kind kind) noexcept {
  return kind == activation_kind::tanh || kind == activation_kind::sigmoid;
}

/// The activation's forward, as LibTorch's op (CELU: ELU with input scale 1 / alpha).
[[nodiscard]] inline at::Tensor activation_forward(const at::Tensor& x, activation_kind kind,
                                                   const activation_params& a) {
  switch (kind) {
    case activation_kind::silu:
      return at::silu(x);
    case activation_kind::mish:
      return at::mish(x);
    case activation_kind::hardswish:
      return at::hardswish(x);
    case activation_kind::hardsigmoid:
      return at::hardsigmoid(x);
    case activation_kind::elu:
      return at::elu(x, a.alpha);
    case activation_kind::celu:
      return at::celu(x, a.alpha);
    case activation_kind::softplus:
      return at::softplus(x, a.beta, a.threshold);
    case activation_kind::tanh:
      return at::tanh(x);
    case activation_kind::sigmoid:
      return at::sigmoid(x);
  }
  DROPIT_EXPECTS(false, "torch::activation: unknown kind ", static_cast<int>(kind));
  return {};
}

/// CELU's input scale in its backward, as LibTorch's derivative formula computes it (1 / alpha
/// after a round trip through float).
[[nodiscard]] inline double celu_input_scale(double alpha) noexcept {
  return 1.0 / static_cast<double>(static_cast<float>(alpha));
}

/// LibTorch's backward of the activation from its saved tensor t: the input, or the output (tanh,
/// sigmoid, and an in-place ELU / CELU: `is_result`).
[[nodiscard]] inline at::Tensor activation_backward(const at::Tensor& g, const at::Tensor& t,
                                                    activation_kind kind,
                                                    const activation_params& a, bool is_result) {
  switch (kind) {
    case activation_kind::silu:
      return at::silu_backward(g, t);
    case activation_kind::mish:
      return at::mish_backward(g, t);
    case activation_kind::hardswish:
      return at::hardswish_backward(g, t);
    case activation_kind::hardsigmoid:
      return at::hardsigmoid_backward(g, t);
    case activation_kind::elu:
      return at::elu_backward(g, a.alpha, 1.0, 1.0, is_result, t);
    case activation_kind::celu:
      return at::elu_backward(g, a.alpha, 1.0, celu_input_scale(a.alpha), is_result, t);
    case activation_kind::softplus:
      return at::softplus_backward(g, t, a.beta, a.threshold);
    case activation_kind::tanh:
      return at::tanh_backward(g, t);
    case activation_kind::sigmoid:
      return at::sigmoid_backward(g, t);
  }
  return {};
}

struct activation_fn : ::torch::autograd::Function<activation_fn> {
  // in_place (ELU, CELU): x is overwritten and the output saved, as LibTorch's elu_ / celu_ do.
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, activation_kind kind,
                            const policy& p, const activation_params& a, bool in_place) {
    at::Tensor y;
    if (in_place) {
      y = kind == activation_kind::elu ? at::elu_(x, a.alpha) : at::celu_(x, a.alpha);
      ctx->mark_dirty({x});
    } else {
      y = activation_forward(x, kind, a);
    }
    const at::Tensor& saved = in_place || reads_output(kind) ? y : x;
    ctx->save_for_backward({save_packed(saved, p)});
    ctx->saved_data["in_place"] = in_place;
    ctx->saved_data["sizes"] = saved.sizes();
    ctx->saved_data["kind"] = static_cast<std::int64_t>(kind);
    ctx->saved_data["alpha"] = a.alpha;
    ctx->saved_data["beta"] = a.beta;
    ctx->saved_data["threshold"] = a.threshold;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto kind = static_cast<activation_kind>(ctx->saved_data["kind"].toInt());
    refuse_create_graph(to_string(kind));
    const at::Tensor t =
        restore_packed(ctx->get_saved_variables()[0], ctx->saved_data["sizes"].toIntVector());
    const activation_params a{ctx->saved_data["alpha"].toDouble(),
                              ctx->saved_data["beta"].toDouble(),
                              ctx->saved_data["threshold"].toDouble()};
    return {activation_backward(grads[0], t, kind, a, ctx->saved_data["in_place"].toBool()),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct softmax_fn : ::torch::autograd::Function<softmax_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t dim,
                            const policy& p) {
    at::Tensor y = at::_softmax(x, dim, false);
    ctx->save_for_backward({save_packed(y, p)});
    ctx->saved_data["y_sizes"] = y.sizes();
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["dtype"] = x.scalar_type();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_create_graph("softmax");
    const at::Tensor y =
        restore_packed(ctx->get_saved_variables()[0], ctx->saved_data["y_sizes"].toIntVector());
    return {at::_softmax_backward_data(grads[0], y, ctx->saved_data["dim"].toInt(),
                                       ctx->saved_data["dtype"].toScalarType()),
            at::Tensor(), at::Tensor()};
  }
};

/// Dropout's noise for x as LibTorch's CPU dropout draws it: bernoulli(1 - p) / (1 - p), from the
/// default generator of x's device (named here: copying an empty optional generator inline makes
/// g++ -O2 with ASan warn -Wmaybe-uninitialized).
[[nodiscard]] inline at::Tensor dropout_noise(const at::Tensor& x, double p) {
  at::Tensor noise = at::empty_like(x, at::MemoryFormat::Contiguous);
  noise.bernoulli_(1 - p, at::globalContext().defaultGenerator(x.device()));
  noise.div_(1 - p);
  return noise;
}

/// Saves a dropout's noise in ctx: 1 bit per element and its one nonzero value with `bits`, else
/// the dense tensor as LibTorch saves it. Returns the tensor to pass to save_for_backward.
[[nodiscard]] inline at::Tensor save_noise(AutogradContext* ctx, const at::Tensor& noise,
                                           bool bits) {
  ctx->saved_data["noise_sizes"] = noise.sizes();
  ctx->saved_data["noise_strides"] = noise.strides();
  ctx->saved_data["noise_value"] = bits ? two_valued_scale(noise) : 1.0;
  return bits ? positive_bits(noise) : noise;
}

/// The noise `save_noise` saved as `saved`, in dtype.
[[nodiscard]] inline at::Tensor restore_noise(AutogradContext* ctx, const at::Tensor& saved,
                                              bool bits, at::ScalarType dtype) {
  if (!bits) return saved;
  return expand_bits(saved, ctx->saved_data["noise_sizes"].toIntVector(),
                     ctx->saved_data["noise_strides"].toIntVector(), dtype,
                     ctx->saved_data["noise_value"].toDouble());
}

/// x * (LibTorch's dropout with probability p of 0 or 1: x itself, or zeros without a draw).
[[nodiscard]] inline at::Tensor apply_noise(const at::Tensor& x, double p,
                                            const at::Tensor& noise) {
  if (p == 0) return x;
  return x * (p == 1 ? at::zeros({}, x.options()) : noise);
}

/// q k^T's shape [..., t, s] (q's leading dimensions): where the masks broadcast.
[[nodiscard]] inline std::vector<std::int64_t> scores_sizes(at::IntArrayRef q_sizes,
                                                            std::int64_t s) {
  std::vector<std::int64_t> sizes = q_sizes.vec();
  sizes.back() = s;
  return sizes;
}

/// What `attention_fn` takes besides q, k, v and the additive mask (a tensor argument, so that it
/// gets a gradient; LibTorch 1.13's Function refuses an undefined one, so a 0-element tensor with
/// `has_mask` false stands for none).
struct attention_extras {
  at::Tensor masked;  ///< bool, -inf where set; undefined: none
  bool has_mask = false;
  double dropout = 0;
  bool bits = false;  ///< the noise as bits
};

/// softmax(q k^T + mask, -inf where masked) v with dropout of the weights, as at::matmul and
/// LibTorch's MultiheadAttention compute it: operands reshaped (copied when they are views) to
/// [batch, rows, cols], then bmm; backward as LibTorch's BmmBackward0, MulBackward0 (dropout),
/// SoftmaxBackward0, MaskedFillBackward0 and AddBackward0. Returns the output and the attention
/// weights (after dropout); the second matmul's backward rebuilds them from the softmax output
/// and the noise instead of saving them.
struct attention_fn : ::torch::autograd::Function<attention_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& mask, const policy& ps,
                               const policy& pm, const attention_extras& x) {
    const at::Tensor& masked = x.masked;
    const double p = x.dropout;
    ctx->set_materialize_grads(false);  // the weights are usually not used: no zeros for them
    const std::int64_t t = q.size(-2), d = q.size(-1), s = k.size(-2), e = v.size(-1);
    const at::Tensor q3 = q.reshape({-1, t, d});
    const at::Tensor kt3 = k.transpose(-2, -1).reshape({-1, d, s});
    const at::Tensor v3 = v.reshape({-1, s, e});
    const std::int64_t bh = q3.size(0);
    const std::vector<std::int64_t> full = scores_sizes(q.sizes(), s);
    at::Tensor scores = at::bmm(q3, kt3);
    if (x.has_mask) scores.view(full).add_(mask);  // in place: scores keep their dtype
    if (masked.defined()) {
      scores = scores.view(full)
                   .masked_fill(masked, -std::numeric_limits<double>::infinity())
                   .view({bh, t, s});
    }
    const at::Tensor att = at::_softmax(scores, -1, false);
    // Dropout as LibTorch's CPU dropout: none at p = 0, zeros without a draw at p = 1.
    const bool draws = p > 0 && p < 1;
    const at::Tensor noise = draws ? dropout_noise(att, p) : at::Tensor();
    const at::Tensor weights = apply_noise(att, p, noise);
    std::vector<std::int64_t> out_sizes = q.sizes().vec();
    out_sizes.back() = e;
    at::Tensor out = at::bmm(weights, v3).view(out_sizes);
    const bool bits = x.bits && draws;
    ctx->save_for_backward({keep(q3, pm), keep(kt3, pm), keep(v3, pm), keep(att, ps),
                            draws ? save_noise(ctx, noise, bits) : at::Tensor(), masked});
    ctx->saved_data["sizes"] = std::vector<std::int64_t>{bh, t, d, s, e};
    ctx->saved_data["packed"] = std::vector<bool>{pm.active(), ps.active(), bits};
    ctx->saved_data["dropout"] = p;
    ctx->saved_data["q_sizes"] = q.sizes();
    ctx->saved_data["k_sizes"] = k.sizes();
    ctx->saved_data["v_sizes"] = v.sizes();
    if (x.has_mask) {
      ctx->saved_data["mask_sizes"] = mask.sizes();
      ctx->saved_data["mask_dtype"] = mask.scalar_type();
    }
    ctx->saved_data["dtype"] = q.scalar_type();
    return {out, weights.view(full)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_create_graph("attention");
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<std::int64_t> n = ctx->saved_data["sizes"].toIntVector();
    const std::int64_t bh = n[0], t = n[1], d = n[2], s = n[3], e = n[4];
    const c10::List<bool> packed = ctx->saved_data["packed"].toBoolList();
    const double p = ctx->saved_data["dropout"].toDouble();
    variable_list out(7);
    // The second matmul, weights [bh, t, s] x v3 [bh, s, e]; the weights' own gradient added.
    const at::Tensor att = unkeep(saved[3], packed[1], {bh, t, s});
    const at::Tensor noise = saved[4].defined()
                                 ? restore_noise(ctx, saved[4], packed[2], att.scalar_type())
                                 : at::Tensor();
    at::Tensor gw = grads[1].defined() ? grads[1].reshape({bh, t, s}) : grads[1];
    if (grads[0].defined()) {
      const at::Tensor g = grads[0].reshape({bh, t, e});
      if (ctx->needs_input_grad(2)) {
        out[2] = apply_noise(att, p, noise)
                     .transpose(1, 2)
                     .bmm(g)
                     .view(ctx->saved_data["v_sizes"].toIntVector());
      }
      const at::Tensor v3 = unkeep(saved[2], packed[0], {bh, s, e});
      const at::Tensor gv3 = g.bmm(v3.transpose(1, 2));
      gw = gw.defined() ? gv3 + gw : gv3;
    }
    if (!gw.defined()) return out;
    at::Tensor gs = at::_softmax_backward_data(apply_noise(gw, p, noise), att, -1,
                                               ctx->saved_data["dtype"].toScalarType());
    const std::vector<std::int64_t> full =
        scores_sizes(ctx->saved_data["q_sizes"].toIntVector(), s);
    if (saved[5].defined()) gs = gs.view(full).masked_fill(saved[5], 0).view({bh, t, s});
    if (ctx->needs_input_grad(3)) {
      out[3] = gs.view(full)
                   .sum_to_size(ctx->saved_data["mask_sizes"].toIntVector())
                   .to(ctx->saved_data["mask_dtype"].toScalarType());
    }
    // The first matmul, q3 [bh, t, d] x kt3 [bh, d, s].
    if (ctx->needs_input_grad(0)) {
      const at::Tensor kt3 = unkeep(saved[1], packed[0], {bh, d, s});
      out[0] = gs.bmm(kt3.transpose(1, 2)).view(ctx->saved_data["q_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      const at::Tensor q3 = unkeep(saved[0], packed[0], {bh, t, d});
      std::vector<std::int64_t> kt_sizes = ctx->saved_data["k_sizes"].toIntVector();
      std::swap(kt_sizes[kt_sizes.size() - 1], kt_sizes[kt_sizes.size() - 2]);
      out[1] = q3.transpose(1, 2).bmm(gs).view(kt_sizes).transpose(-2, -1);
    }
    return out;
  }
};

/// LibTorch's ops for `attention` with masks and dropout: what `attention_fn` computes, no pack.
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> plain_attention(const at::Tensor& q,
                                                                       const at::Tensor& k,
                                                                       const at::Tensor& v,
                                                                       const attention_options& o) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (o.mask.defined()) scores = scores + o.mask.to(scores.scalar_type());
  if (o.masked.defined()) {
    scores = scores.masked_fill(o.masked, -std::numeric_limits<double>::infinity());
  }
  const at::Tensor weights = at::dropout(at::softmax(scores, -1), o.dropout, o.dropout > 0);
  return {at::matmul(weights, v), weights};
}

struct dropout_fn : ::torch::autograd::Function<dropout_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double p) {
    // LibTorch's CPU dropout, draw for draw, then x * noise.
    const at::Tensor noise = dropout_noise(x, p);
    at::Tensor y = x * noise;
    ctx->save_for_backward({save_noise(ctx, noise, true)});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor noise =
        restore_noise(ctx, ctx->get_saved_variables()[0], true, grads[0].scalar_type());
    return {grads[0] * noise, at::Tensor()};
  }
};

}  // namespace detail

inline at::Tensor layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                             const c10::optional<at::Tensor>& weight,
                             const c10::optional<at::Tensor>& bias, double eps,
                             const policy& store) {
  detail::check_store(store, "layer_norm");
  const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
  if (!detail::wants_store(store, x, w, b)) {
    return at::layer_norm(x, normalized_shape, weight, bias, eps);
  }
  detail::check_packable(x, "layer_norm");
  return detail::layer_norm_fn::apply(x, weight, bias, normalized_shape.vec(), eps, store);
}

inline at::Tensor batch_norm(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                             const c10::optional<at::Tensor>& bias,
                             const c10::optional<at::Tensor>& running_mean,
                             const c10::optional<at::Tensor>& running_var, bool training,
                             double momentum, double eps, const policy& store) {
  detail::check_store(store, "batch_norm");
  const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
  if (!training || !detail::wants_store(store, x, w, b)) {
    return at::batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps,
                          at::globalContext().userEnabledCuDNN());
  }
  DROPIT_EXPECTS(x.dim() >= 2, "torch::batch_norm: input must be [N, C, ...], got ", x.dim(), "-d");
  detail::check_packable(x, "batch_norm");
  return detail::batch_norm_fn::apply(x, weight, bias, running_mean, running_var, momentum, eps,
                                      store);
}

inline at::Tensor gelu(const at::Tensor& x, const policy& store, const std::string& approximate) {
  detail::check_store(store, "gelu");
  if (!detail::wants_store(store, x)) return at::gelu(x, approximate);
  detail::check_packable(x, "gelu");
  return detail::gelu_fn::apply(x, store, approximate);
}

inline const char* to_string(activation_kind k) noexcept {
  switch (k) {
    case activation_kind::silu:
      return "silu";
    case activation_kind::mish:
      return "mish";
    case activation_kind::hardswish:
      return "hardswish";
    case activation_kind::hardsigmoid:
      return "hardsigmoid";
    case activation_kind::elu:
      return "elu";
    case activation_kind::celu:
      return "celu";
    case activation_kind::softplus:
      return "softplus";
    case activation_kind::tanh:
      return "tanh";
    case activation_kind::sigmoid:
      return "sigmoid";
  }
  return "unknown activation";
}

inline at::Tensor activation(const at::Tensor& x, activation_kind kind, const policy& store,
                             const activation_params& params) {
  DROPIT_EXPECTS(static_cast<int>(kind) >= 0 && kind <= activation_kind::sigmoid,
                 "torch::activation: unknown kind ", static_cast<int>(kind));
  detail::check_store(store, to_string(kind));
  if (!detail::wants_store(store, x)) return detail::activation_forward(x, kind, params);
  detail::check_packable(x, to_string(kind));
  return detail::activation_fn::apply(x, kind, store, params, false);
}

inline at::Tensor activation_(at::Tensor& x, activation_kind kind, const policy& store,
                              const activation_params& params) {
  DROPIT_EXPECTS(kind == activation_kind::elu || kind == activation_kind::celu,
                 "torch::activation_: in place only for elu and celu, got ", to_string(kind));
  detail::check_store(store, to_string(kind));
  if (!detail::wants_store(store, x)) {
    return kind == activation_kind::elu ? at::elu_(x, params.alpha) : at::celu_(x, params.alpha);
  }
  // LibTorch's in-place backward reads the output, which loses the sign for a negative alpha.
  DROPIT_EXPECTS(params.alpha >= 0, "torch::activation_: in place needs alpha >= 0, got ",
                 params.alpha);
  detail::check_packable(x, to_string(kind));
  detail::check_in_place(x, "activation_");
  return detail::activation_fn::apply(x, kind, store, params, true);
}

inline at::Tensor softmax(const at::Tensor& x, std::int64_t dim, const policy& store) {
  detail::check_store(store, "softmax");
  dim = at::maybe_wrap_dim(dim, x.dim());
  if (!detail::wants_store(store, x)) return at::softmax(x, dim);
  detail::check_packable(x, "softmax");
  return detail::softmax_fn::apply(x, dim, store);
}

namespace detail {
inline std::pair<at::Tensor, at::Tensor> attention_with_weights(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const policy& softmax_store,
    const policy& matmul_store, const attention_options& o) {
  check_store(softmax_store, "attention");
  check_store(matmul_store, "attention");
  DROPIT_EXPECTS(q.dim() >= 2 && q.dim() == k.dim() && q.dim() == v.dim(),
                 "torch::attention: q, k and v must have the same number (>= 2) of dimensions, "
                 "got ",
                 q.dim(), ", ", k.dim(), ", ", v.dim());
  DROPIT_EXPECTS(q.sizes().slice(0, q.dim() - 2) == k.sizes().slice(0, k.dim() - 2) &&
                     q.sizes().slice(0, q.dim() - 2) == v.sizes().slice(0, v.dim() - 2) &&
                     q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2),
                 "torch::attention: shapes do not match: q ", q.sizes(), ", k ", k.sizes(), ", v ",
                 v.sizes(), " (q [..., t, d], k [..., s, d], v [..., s, e])");
  DROPIT_EXPECTS(o.dropout >= 0 && o.dropout <= 1,
                 "torch::attention: dropout must be in [0, 1], got ", o.dropout);
  const std::vector<std::int64_t> full = scores_sizes(q.sizes(), k.size(-2));
  DROPIT_EXPECTS(!o.mask.defined() || at::is_expandable_to(o.mask.sizes(), full),
                 "torch::attention: mask ", o.mask.sizes(), " does not broadcast to q k^T ",
                 at::IntArrayRef(full));
  DROPIT_EXPECTS(!o.masked.defined() || (o.masked.scalar_type() == at::kBool &&
                                         at::is_expandable_to(o.masked.sizes(), full)),
                 "torch::attention: masked must be a bool tensor that broadcasts to q k^T ",
                 at::IntArrayRef(full));
  const bool bits = o.dropout_bits && o.dropout > 0 && o.dropout < 1;
  if (!wants_store(softmax_store, q, k, v, o.mask) && !wants_store(matmul_store, q, k, v, o.mask) &&
      !(bits && ::torch::autograd::GradMode::is_enabled())) {
    return plain_attention(q, k, v, o);
  }
  for (const at::Tensor* t : {&q, &k, &v})
    check_packable(*t, "attention");
  const attention_extras x{o.masked, o.mask.defined(), o.dropout, bits};
  const variable_list r =
      attention_fn::apply(q, k, v, o.mask.defined() ? o.mask : at::empty({0}, q.options()),
                          softmax_store, matmul_store, x);
  return {r[0], r[1]};
}
}  // namespace detail

inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const policy& softmax_store, const policy& matmul_store,
                            const attention_options& options) {
  return detail::attention_with_weights(q, k, v, softmax_store, matmul_store, options).first;
}

inline at::Tensor dropout(const at::Tensor& x, double p, bool train, bool bits) {
  DROPIT_EXPECTS(p >= 0 && p <= 1, "torch::dropout: p must be in [0, 1], got ", p);
  if (!bits || !train || p == 0 || p == 1 || x.numel() == 0 ||
      !::torch::autograd::GradMode::is_enabled() || !x.requires_grad() ||
      !at::isFloatingType(x.scalar_type())) {
    return at::dropout(x, p, train);
  }
  detail::check_packable(x, "dropout");
  return detail::dropout_fn::apply(x, p);
}

}  // namespace dropit::torch
