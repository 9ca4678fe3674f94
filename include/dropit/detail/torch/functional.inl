// Implementation of dropit::torch's functional API (torch/functional.hpp): the autograd functions.
#pragma once

#include <dropit/detail/torch/kernels.hpp>
#include <dropit/detail/torch/kernels_pool_relu.hpp>
#include <dropit/detail/torch/packed_kernels.hpp>
#include <dropit/detail/torch/saved.hpp>

#include <ATen/Dispatch.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace dropit::torch {
namespace detail {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

/// Whether to run dropit's function: a policy, grad mode on, and a gradient to compute.
[[nodiscard]] inline bool wants_cache(const policy& p, const at::Tensor& x, const at::Tensor& w) {
  return p.active() && ::torch::autograd::GradMode::is_enabled() &&
         (w.requires_grad() || x.requires_grad());
}

/// Whether a layer keeps x itself: `identity` with the exact codec (exact values need no copy;
/// an excluded layer's policy, the gamma = 0 case).
[[nodiscard]] inline bool keeps_reference(const policy& p) noexcept {
  return p.kind == policy_kind::identity && p.codec == value_codec::exact;
}

/// x's place in the autograd graph (its gradient edge), for a backward under `create_graph`; a
/// capsule, since `saved_data` holds IValues only. The layer's node already holds the same edge.
struct input_edge final : ::torch::CustomClassHolder {
  explicit input_edge(::torch::autograd::Edge e) : edge(std::move(e)) {}
  ::torch::autograd::Edge edge;
};

/// Saves the weight and, when the weight needs a gradient, x packed, or x itself (dense in its
/// packing order) for `keeps_reference` (else an undefined tensor: the input gradient of these
/// layers does not read x). A packed x that requires a gradient also leaves its gradient edge
/// (`differentiable_input`).
inline void save_input(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                       const policy& p) {
  p.validate();
  const bool by_reference = keeps_reference(p);
  at::Tensor saved;
  if (w.requires_grad()) {
    check_packable(x, "save");
    saved = by_reference ? x.contiguous(packing_format(x)) : save_packed(x, p);
    if (!by_reference && x.requires_grad()) {
      ctx->saved_data["x_edge"] = c10::IValue::make_capsule(
          c10::make_intrusive<input_edge>(::torch::autograd::impl::gradient_edge(x)));
    }
  }
  ctx->save_for_backward({w, saved});
  ctx->saved_data["x_sizes"] = x.sizes();
  ctx->saved_data["by_reference"] = by_reference;
}

/**
 * Elements [offset, offset + prod(sizes)) of a saved input in packing order, whole
 * leading-dimension slices (rows, samples): rebuilt from its pack, or, kept by reference, a view
 * of the input itself.
 */
[[nodiscard]] inline at::Tensor saved_part(const at::Tensor& saved, bool by_reference,
                                           at::IntArrayRef sizes, std::size_t offset) {
  if (!by_reference) return restore_packed(saved, sizes, offset);
  const auto start = static_cast<std::int64_t>(offset);
  if (saved.is_contiguous()) {
    return saved.view({-1}).narrow(0, start, c10::multiply_integers(sizes)).view(sizes);
  }
  const std::int64_t per_slice = saved.numel() / saved.size(0);  // channels-last: samples
  return saved.narrow(0, start / per_slice, sizes[0]);
}

/**
 * Under `create_graph` (grad mode on in backward), for a packed x that requires a gradient: the
 * whole rebuilt input as a variable on x's gradient edge, so that the weight gradient computed
 * from it is differentiable in x, as PyTorch's saved-tensor hooks make a restored tensor (the
 * kept values stand for x; a second derivative reaches every element of x through them). Else an
 * undefined tensor: the backward then works in pieces without a graph.
 */
[[nodiscard]] inline at::Tensor differentiable_input(AutogradContext* ctx, const at::Tensor& saved,
                                                     at::IntArrayRef sizes) {
  if (!::torch::autograd::GradMode::is_enabled()) return {};
  const auto it = ctx->saved_data.find("x_edge");
  if (it == ctx->saved_data.end()) return {};
  const auto holder = c10::static_intrusive_pointer_cast<input_edge>(it->second.toCapsule());
  return ::torch::autograd::make_variable(restore_packed(saved, sizes), holder->edge);
}

/// How many of `count` slices of `slice_bytes` each go in one piece: at least 1, at most what fits
/// in `chunk_bytes()`, and balanced (128 slices of which 55 fit make pieces of 43, 43 and 42, not
/// 55, 55 and 18: LibTorch's kernels run slower on small pieces).
[[nodiscard]] inline std::int64_t slices_per_piece(std::int64_t count, std::size_t slice_bytes) {
  const std::size_t piece = chunk_bytes();
  count = std::max<std::int64_t>(count, 1);
  if (piece == 0 || slice_bytes == 0) return count;
  const std::int64_t fit =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(piece / slice_bytes), 1, count);
  const std::int64_t pieces = (count + fit - 1) / fit;
  return (count + pieces - 1) / pieces;
}

/// The weight gradient of a matmul layer, g2 [rows, out] against the packed input [rows, in]:
/// from the kept elements alone where few are kept (kept_product.hpp), else accumulated over
/// pieces of rows so the rebuilt input never exists whole.
/// `transposed` false gives g2^T x ([out, in], Linear), true gives x^T g2 ([in, out], Conv1D);
/// `path` forces one of the two ways (benchmarks, tests).
[[nodiscard]] inline at::Tensor matmul_weight_grad(
    const at::Tensor& packed, bool by_reference, const at::Tensor& g2, std::int64_t in,
    bool transposed, const at::Tensor& w, weight_grad_path path = weight_grad_path::cheaper) {
  const std::int64_t rows = g2.size(0);
  if (rows == 0) return at::zeros_like(w);
  at::Tensor gw;  // from the kept elements alone, where that pays
  if (!by_reference &&
      box_of<cache_box>(packed).cache.kept_product(g2, static_cast<std::size_t>(in), gw, path)) {
    return transposed ? gw : gw.t().contiguous();  // x^T g2 is [in, out]; a Linear's is [out, in]
  }
  const std::int64_t step =
      slices_per_piece(rows, static_cast<std::size_t>(in) * g2.element_size());
  for (std::int64_t r0 = 0; r0 < rows; r0 += step) {
    const std::int64_t len = std::min(step, rows - r0);
    const at::Tensor x =
        saved_part(packed, by_reference, {len, in}, static_cast<std::size_t>(r0 * in));
    const at::Tensor g = g2.narrow(0, r0, len);
    const at::Tensor a = transposed ? x.t() : g.t();
    const at::Tensor b = transposed ? g : x;
    if (gw.defined()) {
      gw.addmm_(a, b);
    } else {
      gw = a.mm(b);
    }
  }
  return gw;
}

/// x2 [rows, in] times w (or w^T) plus b, written into a new tensor of `out_sizes` that is not a
/// view (so later in-place ops on it, e.g. relu_, are fine with autograd).
[[nodiscard]] inline at::Tensor matmul_into_new(const at::Tensor& x2, const at::Tensor& w2,
                                                const c10::optional<at::Tensor>& b,
                                                const std::vector<std::int64_t>& out_sizes) {
  at::Tensor y = at::empty(out_sizes, x2.options());
  at::Tensor y2 = y.view({x2.size(0), w2.size(1)});
  if (b.has_value()) {
    at::addmm_out(y2, *b, x2, w2);
  } else {
    at::mm_out(y2, x2, w2);
  }
  return y;
}

struct linear_fn : ::torch::autograd::Function<linear_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& b, const policy& p) {
    std::vector<std::int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = w.size(0);
    at::Tensor y = x.dim() == 2 ? at::linear(x, w, b)
                                : matmul_into_new(x.reshape({-1, w.size(1)}), w.t(), b, out_sizes);
    save_input(ctx, x, w, p);
    ctx->saved_data["has_bias"] = b.has_value();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[0];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::int64_t out = w.size(0), in = w.size(1);
    const at::Tensor g2 = grads[0].reshape({-1, out});
    at::Tensor gx, gw, gb;
    // Weight first: its rebuilt input pieces are freed before the input gradient is allocated.
    if (ctx->needs_input_grad(1)) {
      const at::Tensor xv =
          differentiable_input(ctx, saved[1], ctx->saved_data["x_sizes"].toIntVector());
      gw = xv.defined() ? g2.t().mm(xv.reshape({-1, in}))
                        : matmul_weight_grad(saved[1], ctx->saved_data["by_reference"].toBool(), g2,
                                             in, false, w);
    }
    if (has_bias && ctx->needs_input_grad(2)) gb = g2.sum(0);
    if (ctx->needs_input_grad(0)) gx = grads[0].matmul(w);
    return {gx, gw, gb, at::Tensor()};
  }
};

struct gpt2_conv1d_fn : ::torch::autograd::Function<gpt2_conv1d_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& b, const policy& p) {
    const std::int64_t nx = w.size(0), nf = w.size(1);
    std::vector<std::int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = nf;
    at::Tensor y = matmul_into_new(x.reshape({-1, nx}), w, b, out_sizes);
    save_input(ctx, x, w, p);
    ctx->saved_data["has_bias"] = b.has_value();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[0];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::int64_t nx = w.size(0), nf = w.size(1);
    const at::Tensor g2 = grads[0].reshape({-1, nf});
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(1)) {
      const at::Tensor xv =
          differentiable_input(ctx, saved[1], ctx->saved_data["x_sizes"].toIntVector());
      gw = xv.defined() ? xv.reshape({-1, nx}).t().mm(g2)
                        : matmul_weight_grad(saved[1], ctx->saved_data["by_reference"].toBool(), g2,
                                             nx, true, w);
    }
    if (has_bias && ctx->needs_input_grad(2)) gb = g2.sum(0);
    if (ctx->needs_input_grad(0)) {
      gx = g2.mm(w.t()).view(ctx->saved_data["x_sizes"].toIntVector());
    }
    return {gx, gw, gb, at::Tensor()};
  }
};

/// One side of a convolution's output size.
[[nodiscard]] inline std::int64_t conv_output_size(std::int64_t in, std::int64_t k,
                                                   std::int64_t pad, std::int64_t stride,
                                                   std::int64_t dilation) noexcept {
  return (in + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
}

/// The window of a d-dimensional convolution (d = 1, 2, 3): one entry per spatial dimension. A
/// transposed convolution (the gradient of a convolution with respect to its input) also has an
/// output padding (empty: zeros).
struct conv_geometry {
  std::vector<std::int64_t> stride, padding, dilation;
  std::int64_t groups = 1;
  bool transposed = false;
  std::vector<std::int64_t> output_padding;

  /// The output padding, zeros when none was given.
  [[nodiscard]] std::vector<std::int64_t> output_padding_or_zeros() const {
    return output_padding.empty() ? std::vector<std::int64_t>(stride.size(), 0) : output_padding;
  }
};

/// Size of one spatial dimension of a transposed convolution's output.
[[nodiscard]] inline std::int64_t conv_transpose_output_size(std::int64_t in, std::int64_t k,
                                                             std::int64_t pad, std::int64_t stride,
                                                             std::int64_t dilation,
                                                             std::int64_t output_padding) {
  return (in - 1) * stride - 2 * pad + dilation * (k - 1) + output_padding + 1;
}

/// A convolution on a batched input ([N, C, *spatial]), in pieces of samples when its output is
/// larger than a piece (LibTorch's oneDNN path computes into a scratch buffer and copies it out:
/// pieces bound that buffer).
[[nodiscard]] inline at::Tensor conv_in_pieces(const at::Tensor& x, const at::Tensor& w,
                                               const c10::optional<at::Tensor>& b,
                                               const conv_geometry& c) {
  const std::int64_t n = x.size(0);
  const std::vector<std::int64_t> output_padding = c.output_padding_or_zeros();
  // A transposed convolution's weight is [C_in, C_out / groups, *kernel].
  std::int64_t out_per_sample = c.transposed ? w.size(1) * c.groups : w.size(0);
  for (std::size_t i = 0; i < c.stride.size(); ++i) {
    const auto d = static_cast<std::int64_t>(i) + 2;
    out_per_sample *= std::max<std::int64_t>(
        c.transposed
            ? conv_transpose_output_size(x.size(d), w.size(d), c.padding[i], c.stride[i],
                                         c.dilation[i], output_padding[i])
            : conv_output_size(x.size(d), w.size(d), c.padding[i], c.stride[i], c.dilation[i]),
        0);
  }
  const auto conv = [&](const at::Tensor& part) {
    return at::convolution(part, w, b, c.stride, c.padding, c.dilation, c.transposed,
                           output_padding, c.groups);
  };
  const std::int64_t step =
      slices_per_piece(n, static_cast<std::size_t>(out_per_sample) * x.element_size());
  if (step >= n) return conv(x);
  at::Tensor y;
  for (std::int64_t s0 = 0; s0 < n; s0 += step) {
    const std::int64_t len = std::min(step, n - s0);
    const at::Tensor part = conv(x.narrow(0, s0, len));
    if (!y.defined()) {
      std::vector<std::int64_t> sizes = part.sizes().vec();
      sizes[0] = n;
      y = at::empty(sizes, part.options().memory_format(part.suggest_memory_format()));
    }
    y.narrow(0, s0, len).copy_(part);
  }
  return y;
}

/// A convolution of any rank, plain or transposed, whose input is saved through dropit.
struct conv_fn : ::torch::autograd::Function<conv_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& b, const conv_geometry& c,
                            const policy& p) {
    at::Tensor y = conv_in_pieces(x, w, b, c);
    save_input(ctx, x, w, p);
    ctx->saved_data["has_bias"] = b.has_value();
    ctx->saved_data["stride"] = at::IntArrayRef(c.stride);
    ctx->saved_data["padding"] = at::IntArrayRef(c.padding);
    ctx->saved_data["dilation"] = at::IntArrayRef(c.dilation);
    ctx->saved_data["groups"] = c.groups;
    ctx->saved_data["transposed"] = c.transposed;
    ctx->saved_data["output_padding"] = at::IntArrayRef(c.output_padding_or_zeros());
    return y;
  }

  // Both gradients in pieces of samples: each piece rebuilds its part of the input, LibTorch's
  // convolution_backward computes that piece's weight gradient (accumulated) and input gradient.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[0];
    const at::Tensor& packed = saved[1];
    const at::Tensor& g = grads[0];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_w = ctx->needs_input_grad(1);
    const bool by_reference = ctx->saved_data["by_reference"].toBool();
    const std::vector<std::int64_t> x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const std::vector<std::int64_t> stride = ctx->saved_data["stride"].toIntVector();
    const std::vector<std::int64_t> padding = ctx->saved_data["padding"].toIntVector();
    const std::vector<std::int64_t> dilation = ctx->saved_data["dilation"].toIntVector();
    const std::int64_t groups = ctx->saved_data["groups"].toInt();
    const bool transposed = ctx->saved_data["transposed"].toBool();
    const std::vector<std::int64_t> output_padding =
        ctx->saved_data["output_padding"].toIntVector();
    const std::int64_t n = x_sizes[0];
    const std::int64_t per_sample =
        std::accumulate(x_sizes.begin() + 1, x_sizes.end(), std::int64_t{1}, std::multiplies<>());
    at::Tensor gx, gw, gb;
    if (has_bias && ctx->needs_input_grad(2)) {
      std::vector<std::int64_t> dims{0};  // every dimension but the channels
      for (std::int64_t d = 2; d < static_cast<std::int64_t>(x_sizes.size()); ++d)
        dims.push_back(d);
      gb = g.sum(dims);
    }
    if (!need_x && !need_w) return {gx, gw, gb, at::Tensor(), at::Tensor()};
    if (const at::Tensor xv = need_w ? differentiable_input(ctx, packed, x_sizes) : at::Tensor();
        xv.defined()) {
      // create_graph: one piece, through LibTorch's differentiable convolution_backward.
      std::tie(gx, gw, std::ignore) =
          at::convolution_backward(g, xv, w, c10::nullopt, stride, padding, dilation, transposed,
                                   output_padding, groups, {need_x, need_w, false});
      return {gx, gw, gb, at::Tensor(), at::Tensor()};
    }
    // A piece holds its rebuilt input, its output gradient copy and its input gradient.
    const std::size_t sample_bytes =
        static_cast<std::size_t>(per_sample) * g.element_size() +
        static_cast<std::size_t>(g.numel() / std::max<std::int64_t>(n, 1)) * g.element_size();
    const std::int64_t step = slices_per_piece(n, sample_bytes);
    for (std::int64_t s0 = 0; s0 < n; s0 += step) {
      const std::int64_t len = std::min(step, n - s0);
      std::vector<std::int64_t> sizes = x_sizes;
      sizes[0] = len;
      // The input gradient does not read x: without a weight gradient, zeros stand in for it.
      const at::Tensor x = need_w ? saved_part(packed, by_reference, sizes,
                                               static_cast<std::size_t>(s0 * per_sample))
                                  : at::zeros(sizes, g.options());
      auto [px, pw, pb] = at::convolution_backward(
          len == n ? g : g.narrow(0, s0, len), x, w, c10::nullopt, stride, padding, dilation,
          transposed, output_padding, groups, {need_x, need_w, false});
      if (need_w) {
        if (gw.defined()) {
          gw.add_(pw);
        } else {
          gw = pw;
        }
      }
      if (need_x) {
        if (len == n) {
          gx = px;
        } else {
          if (!gx.defined()) {
            gx = at::empty(x_sizes, px.options().memory_format(px.suggest_memory_format()));
          }
          gx.narrow(0, s0, len).copy_(px);
        }
      }
    }
    if (n == 0) {
      if (need_w) gw = at::zeros_like(w);
      if (need_x) gx = at::zeros(x_sizes, g.options());
    }
    return {gx, gw, gb, at::Tensor(), at::Tensor()};
  }
};

/// Records the use count of the gradient its backward receives.
struct probe_sink_fn : ::torch::autograd::Function<probe_sink_fn> {
  static std::size_t& seen() {
    static std::size_t count = 0;
    return count;
  }
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list grads) {
    seen() = grads[0].use_count();
    return {grads[0]};
  }
};

/// Hands the next node a gradient nobody else holds.
struct probe_source_fn : ::torch::autograd::Function<probe_source_fn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0].clone()};
  }
};

/**
 * The use count a gradient has inside a custom Function's backward when only the autograd
 * engine holds it, measured once on a two-node probe graph (LibTorch's engine and CppNode keep a
 * fixed number of references). A gradient with exactly this count, no view and an unshared
 * storage can be overwritten in place, as LibTorch's own AccumulateGrad does with the gradients it
 * steals; any extra holder (a hook, retain_grad, a view) raises the count and turns this off.
 */
[[nodiscard]] inline std::size_t engine_owned_use_count() {
  static const std::size_t count = [] {
    ::torch::autograd::AutoGradMode enable(true);
    const at::Tensor x = at::zeros({4}).requires_grad_(true);
    probe_source_fn::apply(probe_sink_fn::apply(x)).sum().backward();
    return probe_sink_fn::seen();
  }();
  return count;
}

/// Whether backward may overwrite the incoming gradient g (read straight from the by-value
/// gradient list) instead of allocating its result.
[[nodiscard]] inline bool engine_owns(const at::Tensor& g) {
  return g.defined() && !g.requires_grad() && !g.is_view() &&
         g.use_count() == engine_owned_use_count() && g.storage().use_count() == 1;
}

/// An elementwise mask op's 1-bit mask as a 0/1 tensor with the op's input sizes and strides
/// (the bits follow that memory order): what a differentiable LibTorch backward reads under
/// create_graph.
[[nodiscard]] inline at::Tensor mask_as_tensor(AutogradContext* ctx, const at::Tensor& mask,
                                               const at::TensorOptions& options) {
  at::Tensor passes = at::empty_strided(ctx->saved_data["sizes"].toIntVector(),
                                        ctx->saved_data["strides"].toIntVector(), options);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, passes.scalar_type(), "dropit_mask_as_tensor", [&] {
        expand_mask(reinterpret_cast<const std::uint32_t*>(mask.data_ptr()),
                    passes.data_ptr<scalar_t>(), passes.numel());
      });
  return passes;
}

/// The input gradient of an elementwise mask op: `kernel(g, gx)` with g laid out in the op's
/// saved strides (the mask's memory order). It overwrites the incoming gradient when the engine
/// alone holds it (see engine_owns): no second tensor of x's size at the peak of backward.
template <class Kernel>
[[nodiscard]] at::Tensor mask_op_grad(AutogradContext* ctx, const at::Tensor& incoming,
                                      const Kernel& kernel) {
  const std::vector<std::int64_t> strides = ctx->saved_data["strides"].toIntVector();
  const bool laid_out = incoming.strides() == at::IntArrayRef(strides);
  if (laid_out && engine_owns(incoming)) {  // nobody else sees it: overwrite it
    at::Tensor g = incoming;
    kernel(g, g);
    return g;
  }
  const at::Tensor g = laid_out ? incoming
                                : at::empty_strided(ctx->saved_data["sizes"].toIntVector(), strides,
                                                    incoming.options())
                                      .copy_(incoming);
  at::Tensor gx = at::empty_like(g);
  kernel(g, gx);
  return gx;
}

/// The bounds of a mask Hardtanh; none for a mask ReLU.
using clamp_bounds = c10::optional<std::array<double, 2>>;

/**
 * A mask ReLU (no bounds: y = x > 0 ? x : +0, the gradient passes where !(x <= 0), NaN included)
 * or Hardtanh (y = min(max(x, lo), hi), the gradient passes where lo < x < hi), out of place or
 * in place on a dense x. Both backwards are "g where the mask is set, +0 elsewhere". Works on the
 * elements in memory order (any dense layout, channels-last included); the mask follows that
 * order, and the output and gradient keep x's strides.
 */
struct clamp_mask_fn : ::torch::autograd::Function<clamp_mask_fn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, bool in_place,
                            const clamp_bounds& bounds) {
    const at::Tensor xc = in_place || x.is_non_overlapping_and_dense() ? x : x.contiguous();
    at::Tensor y = in_place ? x : at::empty_like(xc);
    const std::int64_t n = xc.numel();
    at::Tensor mask = make_mask((n + 31) / 32);
    auto* words = reinterpret_cast<std::uint32_t*>(mask.data_ptr());
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, xc.scalar_type(), "dropit_clamp", [&] {
          if (bounds) {
            hardtanh_mask_forward(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                  from_double<scalar_t>((*bounds)[0]),
                                  from_double<scalar_t>((*bounds)[1]), words, n);
          } else {
            relu_mask_forward(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), words, n);
          }
        });
    if (in_place) ctx->mark_dirty({x});
    ctx->save_for_backward({mask});
    ctx->saved_data["sizes"] = xc.sizes();
    ctx->saved_data["strides"] = xc.strides();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    if (::torch::autograd::GradMode::is_enabled()) {
      // create_graph: LibTorch's differentiable threshold_backward on the mask as a 0/1 tensor
      // (what its threshold_backward and hardtanh_backward compute from their saved tensor).
      return {at::threshold_backward(grads[0], mask_as_tensor(ctx, mask, grads[0].options()), 0),
              {},
              {}};
    }
    return {mask_op_grad(ctx, grads[0],
                         [&](const at::Tensor& g, at::Tensor& gx) {
                           AT_DISPATCH_FLOATING_TYPES_AND2(
                               at::kBFloat16, at::kHalf, g.scalar_type(), "dropit_clamp_bw", [&] {
                                 select_by_mask(
                                     g.data_ptr<scalar_t>(),
                                     reinterpret_cast<const std::uint32_t*>(mask.data_ptr()),
                                     gx.data_ptr<scalar_t>(), g.numel());
                               });
                         }),
            {},
            {}};
  }
};

/// LeakyReLU saving the 1-bit mask x > 0 (out of place, or in place on a dense x).
struct leaky_relu_fn : ::torch::autograd::Function<leaky_relu_fn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, double slope, bool in_place) {
    const at::Tensor xc = in_place || x.is_non_overlapping_and_dense() ? x : x.contiguous();
    at::Tensor y = in_place ? x : at::empty_like(xc);
    const std::int64_t n = xc.numel();
    at::Tensor mask = make_mask((n + 31) / 32);
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, xc.scalar_type(), "dropit_leaky_relu", [&] {
          leaky_relu_mask_forward(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                  static_cast<acc_t<scalar_t>>(slope),
                                  reinterpret_cast<std::uint32_t*>(mask.data_ptr()), n);
        });
    if (in_place) ctx->mark_dirty({x});
    ctx->save_for_backward({mask});
    ctx->saved_data["sizes"] = xc.sizes();
    ctx->saved_data["strides"] = xc.strides();
    ctx->saved_data["slope"] = slope;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    const double slope = ctx->saved_data["slope"].toDouble();
    if (::torch::autograd::GradMode::is_enabled()) {
      // create_graph: LibTorch's differentiable leaky_relu_backward on the mask as 0/1 (1 > 0
      // where the gradient passes, 0 where it is scaled).
      const at::Tensor passes = mask_as_tensor(ctx, mask, grads[0].options());
      return {at::leaky_relu_backward(grads[0], passes, slope, false), {}, {}};
    }
    return {mask_op_grad(ctx, grads[0],
                         [&](const at::Tensor& g, at::Tensor& gx) {
                           AT_DISPATCH_FLOATING_TYPES_AND2(
                               at::kBFloat16, at::kHalf, g.scalar_type(), "dropit_leaky_relu_bw",
                               [&] {
                                 leaky_relu_mask_backward(
                                     g.data_ptr<scalar_t>(),
                                     reinterpret_cast<const std::uint32_t*>(mask.data_ptr()),
                                     static_cast<acc_t<scalar_t>>(slope), gx.data_ptr<scalar_t>(),
                                     g.numel());
                               });
                         }),
            {},
            {}};
  }
};

/// An average pooling (`avg_pool2d` or, with an empty kernel, `adaptive_avg_pool2d`) whose
/// backward gets a zero-stride stand-in of its input: the sizes are all LibTorch's backward
/// reads of it.
struct avg_pool_fn : ::torch::autograd::Function<avg_pool_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                            std::vector<std::int64_t> padding, bool ceil_mode,
                            bool count_include_pad, c10::optional<std::int64_t> divisor_override,
                            std::vector<std::int64_t> output_size) {
    const bool adaptive = kernel.empty();
    ctx->saved_data["sizes"] = x.sizes();
    ctx->saved_data["adaptive"] = adaptive;
    if (adaptive) return at::adaptive_avg_pool2d(x, output_size);
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["ceil_mode"] = ceil_mode;
    ctx->saved_data["count_include_pad"] = count_include_pad;
    ctx->saved_data["divisor_override"] = divisor_override;
    return at::avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad,
                          divisor_override);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const at::Tensor x_like =
        at::zeros({}, g.options()).expand(ctx->saved_data["sizes"].toIntVector());
    const auto& d = ctx->saved_data;
    at::Tensor gx = d.at("adaptive").toBool()
                        ? at::_adaptive_avg_pool2d_backward(g, x_like)
                        : at::avg_pool2d_backward(
                              g, x_like, d.at("kernel").toIntVector(), d.at("stride").toIntVector(),
                              d.at("padding").toIntVector(), d.at("ceil_mode").toBool(),
                              d.at("count_include_pad").toBool(),
                              d.at("divisor_override").toOptional<std::int64_t>());
    return {gx, {}, {}, {}, {}, {}, {}, {}};
  }
};

/// Whether an average pooling of x saves its sizes only (else LibTorch's op runs).
[[nodiscard]] inline bool pools_by_shape(const at::Tensor& x) {
  return ::torch::autograd::GradMode::is_enabled() && x.requires_grad() && x.is_contiguous() &&
         x.layout() == at::kStrided && !x.is_quantized();
}

/// Checks the window and computes the geometry of pooling x.
[[nodiscard]] inline pool_geometry pool_geometry_of(const at::Tensor& x,
                                                    const max_pool2d_params& p) {
  DROPIT_EXPECTS(x.dim() == 3 || x.dim() == 4, "torch::max_pool2d: input must be 3-d or 4-d, got ",
                 x.dim(), "-d");
  pool_geometry g{};
  g.kh = p.kernel[0];
  g.kw = p.kernel[1];
  g.sh = p.stride[0] == 0 ? g.kh : p.stride[0];
  g.sw = p.stride[1] == 0 ? g.kw : p.stride[1];
  g.ph = p.padding[0];
  g.pw = p.padding[1];
  g.dh = p.dilation[0];
  g.dw = p.dilation[1];
  DROPIT_EXPECTS(g.kh > 0 && g.kw > 0, "torch::max_pool2d: kernel must be positive, got ", g.kh,
                 "x", g.kw);
  DROPIT_EXPECTS(g.sh > 0 && g.sw > 0, "torch::max_pool2d: stride must be positive, got ", g.sh,
                 "x", g.sw);
  DROPIT_EXPECTS(g.dh > 0 && g.dw > 0, "torch::max_pool2d: dilation must be positive, got ", g.dh,
                 "x", g.dw);
  DROPIT_EXPECTS(g.ph >= 0 && g.pw >= 0 && g.ph <= g.kh / 2 && g.pw <= g.kw / 2,
                 "torch::max_pool2d: padding must be in [0, kernel / 2], got ", g.ph, "x", g.pw);
  g.h = x.size(-2);
  g.w = x.size(-1);
  g.planes = g.h * g.w == 0 ? 0 : x.numel() / (g.h * g.w);
  g.oh = pool_output_size(g.h, g.kh, g.ph, g.sh, g.dh, p.ceil_mode);
  g.ow = pool_output_size(g.w, g.kw, g.pw, g.sw, g.dw, p.ceil_mode);
  DROPIT_EXPECTS(g.oh >= 1 && g.ow >= 1, "torch::max_pool2d: output size ", g.oh, "x", g.ow,
                 " is too small (input ", g.h, "x", g.w, ")");
  g.bits = code_bits(g.kh * g.kw);
  return g;
}

/// The sizes of pooling x: its own with the last two replaced by the output's.
[[nodiscard]] inline std::vector<std::int64_t> pooled_sizes(const at::Tensor& x,
                                                            const pool_geometry& g) {
  std::vector<std::int64_t> sizes = x.sizes().vec();
  sizes[sizes.size() - 2] = g.oh;
  sizes.back() = g.ow;
  return sizes;
}

/// Keeps x's sizes and the pooling's geometry for backward (`saved_pool_geometry`).
inline void save_pool_geometry(AutogradContext* ctx, const at::Tensor& x, const pool_geometry& g) {
  ctx->saved_data["x_sizes"] = x.sizes();
  ctx->saved_data["geometry"] = std::vector<std::int64_t>{
      g.planes, g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.bits};
}

/// The geometry `save_pool_geometry` kept.
[[nodiscard]] inline pool_geometry saved_pool_geometry(AutogradContext* ctx) {
  const std::vector<std::int64_t> v = ctx->saved_data["geometry"].toIntVector();
  return {v[0], v[1], v[2], v[3],  v[4],  v[5],  v[6],
          v[7], v[8], v[9], v[10], v[11], v[12], static_cast<int>(v[13])};
}

struct max_pool2d_fn : ::torch::autograd::Function<max_pool2d_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const max_pool2d_params& p) {
    const pool_geometry g = pool_geometry_of(x, p);
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty(pooled_sizes(x, g), xc.options());
    at::Tensor codes = make_mask(g.code_words());
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, xc.scalar_type(), "dropit_max_pool2d", [&] {
          max_pool_mask_forward(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                reinterpret_cast<std::uint32_t*>(codes.data_ptr()), g);
        });
    ctx->save_for_backward({codes});
    save_pool_geometry(ctx, x, g);
    ctx->saved_data["ceil_mode"] = p.ceil_mode;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor codes = ctx->get_saved_variables()[0];
    const pool_geometry g = saved_pool_geometry(ctx);
    const at::Tensor gy = grads[0].contiguous();
    if (::torch::autograd::GradMode::is_enabled()) {
      // create_graph: LibTorch's differentiable backward, from the int64 indices the codes
      // encode (it reads its `self` argument for the sizes only).
      at::Tensor indices = at::empty(gy.sizes(), gy.options().dtype(at::kLong));
      decode_pool_indices(reinterpret_cast<const std::uint32_t*>(codes.data_ptr()),
                          indices.data_ptr<std::int64_t>(), g);
      const at::Tensor shape =
          at::zeros({}, gy.options()).expand(ctx->saved_data["x_sizes"].toIntVector());
      const at::Tensor gx = at::max_pool2d_with_indices_backward(
          gy, shape, {g.kh, g.kw}, {g.sh, g.sw}, {g.ph, g.pw}, {g.dh, g.dw},
          ctx->saved_data["ceil_mode"].toBool(), indices);
      return {gx, at::Tensor()};
    }
    at::Tensor gx = at::empty(ctx->saved_data["x_sizes"].toIntVector(), gy.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, gy.scalar_type(), "dropit_max_pool2d_bw", [&] {
          max_pool_mask_backward(gy.data_ptr<scalar_t>(),
                                 reinterpret_cast<const std::uint32_t*>(codes.data_ptr()),
                                 gx.data_ptr<scalar_t>(), g);
        });
    return {gx, at::Tensor()};
  }
};

/// Max pooling then ReLU in one op: saves the ReLU's mask and the window codes of the outputs
/// that pass it (kernels_pool_relu.hpp).
struct max_pool2d_relu_fn : ::torch::autograd::Function<max_pool2d_relu_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const max_pool2d_params& p) {
    const pool_geometry g = pool_geometry_of(x, p);
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty(pooled_sizes(x, g), xc.options());
    const std::int64_t n = y.numel();
    // Every output's code, only until the passing ones are kept.
    at::Tensor dense = at::empty({g.code_words()}, xc.options().dtype(at::kInt));
    at::Tensor mask = make_mask((n + 31) / 32);
    auto* const dense_words = reinterpret_cast<std::uint32_t*>(dense.data_ptr());
    auto* const mask_words = reinterpret_cast<std::uint32_t*>(mask.data_ptr());
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, xc.scalar_type(), "dropit_max_pool2d_relu", [&] {
          max_pool_mask_forward(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), dense_words, g);
          relu_mask_forward(y.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), mask_words, n);
        });
    const pool_relu_chunks chunks = pool_relu_chunking(g);
    const std::vector<std::uint64_t> offsets = passing_code_offsets(mask_words, g, chunks);
    at::Tensor codes = make_mask(chunks.header_words() + static_cast<std::int64_t>(offsets.back()));
    compact_pool_relu_codes(dense_words, mask_words, offsets, g, chunks,
                            reinterpret_cast<std::uint32_t*>(codes.data_ptr()));
    ctx->save_for_backward({mask, codes});
    save_pool_geometry(ctx, x, g);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    DROPIT_EXPECTS(!::torch::autograd::GradMode::is_enabled(),
                   "torch::max_pool2d_relu: double backward (create_graph) is not supported; use "
                   "max_pool2d then relu (convert_options::fuse_pool_relu = false; from Python, "
                   "to_dropit(..., fuse_pool_relu=False))");
    const variable_list saved = ctx->get_saved_variables();
    const pool_geometry g = saved_pool_geometry(ctx);
    const at::Tensor gy = grads[0].contiguous();
    at::Tensor gx = at::empty(ctx->saved_data["x_sizes"].toIntVector(), gy.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, gy.scalar_type(), "dropit_max_pool2d_relu_bw", [&] {
          max_pool_relu_backward(gy.data_ptr<scalar_t>(),
                                 reinterpret_cast<const std::uint32_t*>(saved[0].data_ptr()),
                                 reinterpret_cast<const std::uint32_t*>(saved[1].data_ptr()),
                                 gx.data_ptr<scalar_t>(), g, pool_relu_chunking(g));
        });
    return {gx, at::Tensor()};
  }
};

/// LibTorch's max pooling with these parameters (stride 0: the kernel).
[[nodiscard]] inline at::Tensor plain_max_pool2d(const at::Tensor& x, const max_pool2d_params& p) {
  const auto& k = p.kernel;
  const std::array<std::int64_t, 2> s{p.stride[0] == 0 ? k[0] : p.stride[0],
                                      p.stride[1] == 0 ? k[1] : p.stride[1]};
  return at::max_pool2d(x, k, s, p.padding, p.dilation, p.ceil_mode);
}

/// Throws unless x is a CPU strided tensor (the mask kernels' precondition).
inline void check_mask_op(const at::Tensor& x, const char* who) {
  check_packable(x, who);
}

/// An in-place mask op on a non-dense x (a strided view): y, computed out of place, copied into x.
/// LibTorch's copy_ records the write for autograd, so x's base changes and its gradient flows as
/// with LibTorch's in-place op; only the mask stays saved.
inline at::Tensor write_back(at::Tensor& x, const at::Tensor& y) {
  return x.copy_(y);
}

}  // namespace detail

inline at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias, const policy& p) {
  if (!detail::wants_cache(p, x, weight)) return at::linear(x, weight, bias);
  return detail::linear_fn::apply(x, weight, bias, p);
}

namespace detail {
/// LibTorch's op, or dropit's convolution function, on x batched or unbatched (D + 1 dimensions:
/// run on a batch of one). `what` names the caller in errors.
template <std::size_t D>
[[nodiscard]] at::Tensor run_conv(const at::Tensor& x, const at::Tensor& weight,
                                  const c10::optional<at::Tensor>& bias, const conv_geometry& c,
                                  const policy& p, const char* what) {
  constexpr auto rank = static_cast<std::int64_t>(D);
  const bool cache = wants_cache(p, x, weight);
  DROPIT_EXPECTS(!cache || x.dim() == rank + 1 || x.dim() == rank + 2, "torch::", what, D,
                 "d: input must be ", rank + 1, "-d or ", rank + 2, "-d, got ", x.dim(), "-d");
  if (!cache) {
    const std::vector<std::int64_t> output_padding = c.output_padding_or_zeros();
    // at::convolution wants a batch; LibTorch's own ops take [C, *spatial] as a batch of one too.
    const bool unbatched = x.dim() == rank + 1;
    const at::Tensor y =
        at::convolution(unbatched ? x.unsqueeze(0) : x, weight, bias, c.stride, c.padding,
                        c.dilation, c.transposed, output_padding, c.groups);
    return unbatched ? y.squeeze(0) : y;
  }
  if (x.dim() == rank + 1) return conv_fn::apply(x.unsqueeze(0), weight, bias, c, p).squeeze(0);
  return conv_fn::apply(x, weight, bias, c, p);
}
}  // namespace detail

template <std::size_t D>
at::Tensor conv(const at::Tensor& x, const at::Tensor& weight,
                const c10::optional<at::Tensor>& bias, const conv_params<D>& params,
                const policy& p) {
  const detail::conv_geometry c{{params.stride.begin(), params.stride.end()},
                                {params.padding.begin(), params.padding.end()},
                                {params.dilation.begin(), params.dilation.end()},
                                params.groups,
                                false,
                                {}};
  return detail::run_conv<D>(x, weight, bias, c, p, "conv");
}

inline at::Tensor conv1d(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias, const conv1d_params& params,
                         const policy& p) {
  return conv<1>(x, weight, bias, params, p);
}

inline at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias, const conv2d_params& params,
                         const policy& p) {
  return conv<2>(x, weight, bias, params, p);
}

inline at::Tensor conv3d(const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias, const conv3d_params& params,
                         const policy& p) {
  return conv<3>(x, weight, bias, params, p);
}

template <std::size_t D>
at::Tensor conv_transpose(const at::Tensor& x, const at::Tensor& weight,
                          const c10::optional<at::Tensor>& bias,
                          const conv_transpose_params<D>& params, const policy& p) {
  const detail::conv_geometry c{{params.stride.begin(), params.stride.end()},
                                {params.padding.begin(), params.padding.end()},
                                {params.dilation.begin(), params.dilation.end()},
                                params.groups,
                                true,
                                {params.output_padding.begin(), params.output_padding.end()}};
  return detail::run_conv<D>(x, weight, bias, c, p, "conv_transpose");
}

inline at::Tensor gpt2_conv1d(const at::Tensor& x, const at::Tensor& weight,
                              const c10::optional<at::Tensor>& bias, const policy& p) {
  DROPIT_EXPECTS(weight.dim() == 2, "torch::gpt2_conv1d: weight must be [nx, nf], got ",
                 weight.dim(), "-d");
  DROPIT_EXPECTS(x.dim() >= 1 && x.size(-1) == weight.size(0),
                 "torch::gpt2_conv1d: input's last "
                 "dimension must be nx = ",
                 weight.size(0));
  if (!detail::wants_cache(p, x, weight)) {
    std::vector<std::int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = weight.size(1);
    const at::Tensor x2 = x.reshape({-1, weight.size(0)});
    return (bias.has_value() ? at::addmm(*bias, x2, weight) : x2.mm(weight)).view(out_sizes);
  }
  return detail::gpt2_conv1d_fn::apply(x, weight, bias, p);
}

inline at::Tensor relu(const at::Tensor& x) {
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) return at::relu(x);
  detail::check_mask_op(x, "relu");
  (void)detail::engine_owned_use_count();
  return detail::clamp_mask_fn::apply(x, false, detail::clamp_bounds{});
}

inline at::Tensor leaky_relu(const at::Tensor& x, double negative_slope) {
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) {
    return at::leaky_relu(x, negative_slope);
  }
  detail::check_mask_op(x, "leaky_relu");
  (void)detail::engine_owned_use_count();
  return detail::leaky_relu_fn::apply(x, negative_slope, false);
}

inline at::Tensor leaky_relu_(at::Tensor& x, double negative_slope) {
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) {
    return at::leaky_relu_(x, negative_slope);
  }
  detail::check_mask_op(x, "leaky_relu_");
  detail::check_in_place(x, "leaky_relu_");
  if (!x.is_non_overlapping_and_dense()) {
    return detail::write_back(x, dropit::torch::leaky_relu(x, negative_slope));
  }
  (void)detail::engine_owned_use_count();
  return detail::leaky_relu_fn::apply(x, negative_slope, true);
}

inline at::Tensor hardtanh(const at::Tensor& x, double min_val, double max_val) {
  DROPIT_EXPECTS(min_val <= max_val, "torch::hardtanh: min_val (", min_val,
                 ") must not exceed max_val (", max_val, ")");
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) {
    return at::hardtanh(x, min_val, max_val);
  }
  detail::check_mask_op(x, "hardtanh");
  (void)detail::engine_owned_use_count();
  return detail::clamp_mask_fn::apply(x, false, detail::clamp_bounds{{min_val, max_val}});
}

inline at::Tensor hardtanh_(at::Tensor& x, double min_val, double max_val) {
  DROPIT_EXPECTS(min_val <= max_val, "torch::hardtanh_: min_val (", min_val,
                 ") must not exceed max_val (", max_val, ")");
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) {
    return at::hardtanh_(x, min_val, max_val);
  }
  detail::check_mask_op(x, "hardtanh_");
  detail::check_in_place(x, "hardtanh_");
  if (!x.is_non_overlapping_and_dense()) {
    return detail::write_back(x, dropit::torch::hardtanh(x, min_val, max_val));
  }
  (void)detail::engine_owned_use_count();
  return detail::clamp_mask_fn::apply(x, true, detail::clamp_bounds{{min_val, max_val}});
}

inline at::Tensor relu_(at::Tensor& x) {
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) return at::relu_(x);
  detail::check_mask_op(x, "relu_");
  detail::check_in_place(x, "relu_");
  if (!x.is_non_overlapping_and_dense()) return detail::write_back(x, dropit::torch::relu(x));
  (void)detail::engine_owned_use_count();
  return detail::clamp_mask_fn::apply(x, true, detail::clamp_bounds{});
}

inline at::Tensor max_pool2d(const at::Tensor& x, const max_pool2d_params& params) {
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) {
    return detail::plain_max_pool2d(x, params);
  }
  detail::check_mask_op(x, "max_pool2d");
  return detail::max_pool2d_fn::apply(x, params);
}

inline at::Tensor avg_pool2d(const at::Tensor& x, at::IntArrayRef kernel_size,
                             at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                             bool count_include_pad, c10::optional<std::int64_t> divisor_override) {
  if (!detail::pools_by_shape(x) || kernel_size.empty()) {  // LibTorch's (and its errors)
    return at::avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override);
  }
  return detail::avg_pool_fn::apply(x, kernel_size.vec(), stride.vec(), padding.vec(), ceil_mode,
                                    count_include_pad, divisor_override,
                                    std::vector<std::int64_t>{});
}

inline at::Tensor adaptive_avg_pool2d(const at::Tensor& x, at::IntArrayRef output_size) {
  if (!detail::pools_by_shape(x)) return at::adaptive_avg_pool2d(x, output_size);
  return detail::avg_pool_fn::apply(x, std::vector<std::int64_t>{}, std::vector<std::int64_t>{},
                                    std::vector<std::int64_t>{}, false, true, c10::nullopt,
                                    output_size.vec());
}

inline at::Tensor max_pool2d_relu(const at::Tensor& x, const max_pool2d_params& params) {
  if (!::torch::autograd::GradMode::is_enabled() || !x.requires_grad()) {
    at::Tensor y = detail::plain_max_pool2d(x, params);
    return at::relu_(y);
  }
  detail::check_mask_op(x, "max_pool2d_relu");
  return detail::max_pool2d_relu_fn::apply(x, params);
}

}  // namespace dropit::torch
