/**
 * @file models.hpp
 * @brief Graph builders for well-known CNNs: shape arithmetic only, one vertex per stored tensor,
 * in the way the reference implementation's torch.jit parser records a forward pass (every module
 * or aten op output is a vertex; an in-place ReLU is merged into the tensor it overwrites).
 * Vertex names follow torchvision's module paths; edges carry a FLOP estimate as compute cost.
 */
#pragma once

#include <dropit/error.hpp>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace dropit::checkpoint::detail::models {

using models_input = ::dropit::checkpoint::models::input_shape;

/// A tensor of the forward pass: its vertex and its per-sample shape.
struct tensor {
  vertex_index v;
  std::int64_t c, h, w;
};

/// Adds tensors to a graph; costs are batch x elements x bytes per element.
class net {
 public:
  net(std::string_view model, models_input in, std::int64_t bytes)
      : model_(model), batch_(in.batch), bytes_(bytes) {
    DROPIT_EXPECTS(in.batch > 0 && in.channels > 0 && in.height > 0 && in.width > 0 && bytes > 0,
                   "checkpoint: models: ", model, ": bad input shape (", in.batch, ", ",
                   in.channels, ", ", in.height, ", ", in.width, ") or bytes per element ", bytes);
    input_ = add("input", {}, in.channels, in.height, in.width, 0.0);
  }

  [[nodiscard]] const tensor& input() const noexcept { return input_; }

  /// A new tensor computed from `inputs`; `flops` goes on the first input edge.
  tensor add(std::string name, std::initializer_list<const tensor*> inputs, std::int64_t c,
             std::int64_t h, std::int64_t w, double flops) {
    DROPIT_EXPECTS(c > 0 && h > 0 && w > 0, "checkpoint: models: ", model_,
                   ": the input is too small, ", name, " would have shape (", c, ", ", h, ", ", w,
                   ")");
    const std::int64_t cost = checked(checked(checked(checked(batch_, c), h), w), bytes_);
    const vertex_index v = g_.add_vertex(std::move(name), cost);
    conv_input_.push_back(0);
    exact_input_.push_back(0);
    bool first = true;
    for (const tensor* in : inputs) {
      g_.add_edge(in->v, v, first ? flops : 0.0);
      first = false;
    }
    return {v, c, h, w};
  }

  /// Convolution, floor((in + 2p - k) / s) + 1 per side.
  tensor conv(const tensor& x, std::string name, std::int64_t out, std::array<std::int64_t, 2> k,
              std::array<std::int64_t, 2> stride = {1, 1},
              std::array<std::int64_t, 2> pad = {0, 0}) {
    const std::int64_t h = side(x.h, k[0], stride[0], pad[0]);
    const std::int64_t w = side(x.w, k[1], stride[1], pad[1]);
    const double flops = 2.0 * static_cast<double>(batch_) * static_cast<double>(out * h * w) *
                         static_cast<double>(x.c * k[0] * k[1]);
    conv_input_[x.v] = 1;
    return add(std::move(name), {&x}, out, h, w, flops);
  }
  tensor conv(const tensor& x, std::string name, std::int64_t out, std::int64_t k,
              std::int64_t stride = 1, std::int64_t pad = 0) {
    return conv(x, std::move(name), out, {k, k}, {stride, stride}, {pad, pad});
  }
  /// An op that keeps the shape (batch norm, dropout), priced per element.
  tensor same(const tensor& x, std::string name) {
    exact_input_[x.v] = 1;
    return add(std::move(name), {&x}, x.c, x.h, x.w, elements(x));
  }
  /// Max or average pooling, floor mode.
  tensor pool(const tensor& x, std::string name, std::int64_t k, std::int64_t stride,
              std::int64_t pad = 0) {
    const std::int64_t h = side(x.h, k, stride, pad);
    const std::int64_t w = side(x.w, k, stride, pad);
    exact_input_[x.v] = 1;
    return add(std::move(name), {&x}, x.c, h, w, elements(x));
  }
  tensor adaptive_pool(const tensor& x, std::string name, std::int64_t h, std::int64_t w) {
    exact_input_[x.v] = 1;
    return add(std::move(name), {&x}, x.c, h, w, elements(x));
  }
  tensor flatten(const tensor& x, std::string name) {
    return add(std::move(name), {&x}, x.c * x.h * x.w, 1, 1, 0.0);
  }
  tensor linear(const tensor& x, std::string name, std::int64_t out) {
    const double flops = 2.0 * static_cast<double>(batch_) * static_cast<double>(x.c * x.h * x.w) *
                         static_cast<double>(out);
    conv_input_[x.v] = 1;
    return add(std::move(name), {&x}, out, 1, 1, flops);
  }
  /// Element-wise sum (ResNet's residual add; the ReLU after it is in place).
  tensor sum(const tensor& a, const tensor& b, std::string name) {
    return add(std::move(name), {&a, &b}, a.c, a.h, a.w, elements(a));
  }
  /// Concatenation along the channels.
  tensor cat(const std::vector<tensor>& xs, std::string name) {
    std::int64_t c = 0;
    for (const tensor& x : xs)
      c += x.c;
    const tensor out = add(std::move(name), {}, c, xs.front().h, xs.front().w, 0.0);
    for (std::size_t i = 0; i < xs.size(); ++i)
      g_.add_edge(xs[i].v, out.v, i == 0 ? elements(out) : 0.0);
    return out;
  }

  /// Sets the source and the target, and offers MinK 0.9 storage on every inner tensor that a
  /// conv or linear op reads and no op reads exactly in backward (batch norm, pooling: their
  /// backward needs the exact input; add and concat read none).
  graph finish(const tensor& out) {
    g_.set_source(input_.v);
    g_.set_target(out.v);
    for (vertex_index v = 0; v < g_.vertex_count(); ++v)
      if (conv_input_[v] && !exact_input_[v] && v != input_.v && v != out.v)
        g_.add_storage(v, ::dropit::checkpoint::models::mink_option(g_.cost(v) / bytes_, bytes_));
    return std::move(g_);
  }

 private:
  [[nodiscard]] std::int64_t side(std::int64_t in, std::int64_t k, std::int64_t s,
                                  std::int64_t p) const {
    return in + 2 * p < k ? 0 : (in + 2 * p - k) / s + 1;
  }
  [[nodiscard]] double elements(const tensor& x) const {
    return static_cast<double>(batch_) * static_cast<double>(x.c * x.h * x.w);
  }
  [[nodiscard]] std::int64_t checked(std::int64_t a, std::int64_t b) const {
    DROPIT_EXPECTS(b == 0 || a <= std::numeric_limits<std::int64_t>::max() / b,
                   "checkpoint: models: ", model_, ": a tensor's size overflows 64 bits");
    return a * b;
  }

  std::string model_;
  std::int64_t batch_, bytes_;
  graph g_;
  std::vector<char> conv_input_, exact_input_;  // per vertex: read by conv/linear; read exactly
  tensor input_{};
};

[[nodiscard]] inline std::string at(std::string_view prefix, std::string_view name) {
  return dropit::detail::concat(prefix, '.', name);
}

/// conv + batch norm (+ in-place ReLU): torchvision's Inception BasicConv2d.
inline tensor basic_conv(net& n, const tensor& x, std::string_view name, std::int64_t out,
                         std::array<std::int64_t, 2> k, std::array<std::int64_t, 2> stride = {1, 1},
                         std::array<std::int64_t, 2> pad = {0, 0}) {
  const tensor c = n.conv(x, at(name, "conv"), out, k, stride, pad);
  return n.same(c, at(name, "bn"));
}
inline tensor basic_conv(net& n, const tensor& x, std::string_view name, std::int64_t out,
                         std::int64_t k, std::int64_t stride = 1, std::int64_t pad = 0) {
  return basic_conv(n, x, name, out, {k, k}, {stride, stride}, {pad, pad});
}

inline graph build_resnet(int depth, models_input in, std::int64_t bytes) {
  std::array<int, 4> blocks{};
  bool bottleneck = true;
  switch (depth) {
    case 18:
      blocks = {2, 2, 2, 2};
      bottleneck = false;
      break;
    case 34:
      blocks = {3, 4, 6, 3};
      bottleneck = false;
      break;
    case 50:
      blocks = {3, 4, 6, 3};
      break;
    case 101:
      blocks = {3, 4, 23, 3};
      break;
    case 152:
      blocks = {3, 8, 36, 3};
      break;
    default:
      dropit::detail::throw_error("checkpoint: models: no ResNet-", depth,
                                  " (18, 34, 50, 101, 152)");
  }
  const std::string model = dropit::detail::concat("resnet", depth);
  net n(model, in, bytes);
  tensor x = n.conv(n.input(), "conv1", 64, 7, 2, 3);
  x = n.same(x, "bn1");
  x = n.pool(x, "maxpool", 3, 2, 1);
  const std::int64_t expansion = bottleneck ? 4 : 1;
  std::int64_t inplanes = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const std::int64_t planes = std::int64_t{64} << layer;
    for (int b = 0; b < blocks[static_cast<std::size_t>(layer)]; ++b) {
      const std::int64_t stride = (layer > 0 && b == 0) ? 2 : 1;
      const std::string p = dropit::detail::concat("layer", layer + 1, '.', b);
      tensor out{};
      if (bottleneck) {
        out = n.conv(x, at(p, "conv1"), planes, 1);
        out = n.same(out, at(p, "bn1"));
        out = n.conv(out, at(p, "conv2"), planes, 3, stride, 1);
        out = n.same(out, at(p, "bn2"));
        out = n.conv(out, at(p, "conv3"), planes * expansion, 1);
        out = n.same(out, at(p, "bn3"));
      } else {
        out = n.conv(x, at(p, "conv1"), planes, 3, stride, 1);
        out = n.same(out, at(p, "bn1"));
        out = n.conv(out, at(p, "conv2"), planes, 3, 1, 1);
        out = n.same(out, at(p, "bn2"));
      }
      tensor identity = x;
      if (stride != 1 || inplanes != planes * expansion) {
        identity = n.conv(x, at(p, "downsample.0"), planes * expansion, 1, stride);
        identity = n.same(identity, at(p, "downsample.1"));
      }
      x = n.sum(out, identity, at(p, "add"));
      inplanes = planes * expansion;
    }
  }
  x = n.adaptive_pool(x, "avgpool", 1, 1);
  x = n.flatten(x, "flatten");
  x = n.linear(x, "fc", 1000);
  return n.finish(x);
}

inline graph build_densenet(int depth, models_input in, std::int64_t bytes) {
  std::array<int, 4> blocks{};
  std::int64_t growth = 32, features = 64;
  switch (depth) {
    case 121:
      blocks = {6, 12, 24, 16};
      break;
    case 161:
      blocks = {6, 12, 36, 24};
      growth = 48;
      features = 96;
      break;
    case 169:
      blocks = {6, 12, 32, 32};
      break;
    case 201:
      blocks = {6, 12, 48, 32};
      break;
    default:
      dropit::detail::throw_error("checkpoint: models: no DenseNet-", depth,
                                  " (121, 161, 169, 201)");
  }
  net n(dropit::detail::concat("densenet", depth), in, bytes);
  tensor x = n.conv(n.input(), "features.conv0", features, 7, 2, 3);
  x = n.same(x, "features.norm0");
  x = n.pool(x, "features.pool0", 3, 2, 1);
  for (int b = 0; b < 4; ++b) {
    for (int l = 0; l < blocks[static_cast<std::size_t>(b)]; ++l) {
      const std::string p =
          dropit::detail::concat("features.denseblock", b + 1, ".denselayer", l + 1);
      tensor y = n.same(x, at(p, "norm1"));
      y = n.conv(y, at(p, "conv1"), 4 * growth, 1);
      y = n.same(y, at(p, "norm2"));
      y = n.conv(y, at(p, "conv2"), growth, 3, 1, 1);
      x = n.cat({x, y}, at(p, "cat"));
    }
    if (b < 3) {
      const std::string p = dropit::detail::concat("features.transition", b + 1);
      x = n.same(x, at(p, "norm"));
      x = n.conv(x, at(p, "conv"), x.c / 2, 1);
      x = n.pool(x, at(p, "pool"), 2, 2);
    }
  }
  x = n.same(x, "features.norm5");
  x = n.pool(x, "avg_pool2d", 7, 1);
  x = n.flatten(x, "view");
  x = n.linear(x, "classifier", 1000);
  return n.finish(x);
}

inline graph build_vgg(int depth, models_input in, std::int64_t bytes) {
  constexpr std::int64_t M = 0;  // max pool
  std::vector<std::int64_t> cfg;
  switch (depth) {
    case 11:
      cfg = {64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M};
      break;
    case 13:
      cfg = {64, 64, M, 128, 128, M, 256, 256, M, 512, 512, M, 512, 512, M};
      break;
    case 16:
      cfg = {64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M};
      break;
    case 19:
      cfg = {64,  64,  M,   128, 128, M,   256, 256, 256, 256, M,
             512, 512, 512, 512, M,   512, 512, 512, 512, M};
      break;
    default:
      dropit::detail::throw_error("checkpoint: models: no VGG-", depth, " (11, 13, 16, 19)");
  }
  net n(dropit::detail::concat("vgg", depth), in, bytes);
  tensor x = n.input();
  int idx = 0;
  for (std::int64_t c : cfg) {
    const std::string name = dropit::detail::concat("features.", idx);
    if (c == M) {
      x = n.pool(x, name, 2, 2);
      idx += 1;
    } else {
      x = n.conv(x, name, c, 3, 1, 1);  // + in-place ReLU
      idx += 2;
    }
  }
  x = n.adaptive_pool(x, "avgpool", 7, 7);
  x = n.flatten(x, "flatten");
  x = n.linear(x, "classifier.0", 4096);  // + in-place ReLU
  x = n.same(x, "classifier.2");          // dropout
  x = n.linear(x, "classifier.3", 4096);
  x = n.same(x, "classifier.5");
  x = n.linear(x, "classifier.6", 1000);
  return n.finish(x);
}

inline graph build_alexnet(models_input in, std::int64_t bytes) {
  net n("alexnet", in, bytes);
  tensor x = n.conv(n.input(), "features.0", 64, 11, 4, 2);
  x = n.pool(x, "features.2", 3, 2);
  x = n.conv(x, "features.3", 192, 5, 1, 2);
  x = n.pool(x, "features.5", 3, 2);
  x = n.conv(x, "features.6", 384, 3, 1, 1);
  x = n.conv(x, "features.8", 256, 3, 1, 1);
  x = n.conv(x, "features.10", 256, 3, 1, 1);
  x = n.pool(x, "features.12", 3, 2);
  x = n.adaptive_pool(x, "avgpool", 6, 6);
  x = n.flatten(x, "flatten");
  x = n.same(x, "classifier.0");  // dropout
  x = n.linear(x, "classifier.1", 4096);
  x = n.same(x, "classifier.3");
  x = n.linear(x, "classifier.4", 4096);
  x = n.linear(x, "classifier.6", 1000);
  return n.finish(x);
}

inline tensor inception_a(net& n, const tensor& x, std::string_view p, std::int64_t pool_features) {
  const tensor b1 = basic_conv(n, x, at(p, "branch1x1"), 64, 1);
  tensor b5 = basic_conv(n, x, at(p, "branch5x5_1"), 48, 1);
  b5 = basic_conv(n, b5, at(p, "branch5x5_2"), 64, 5, 1, 2);
  tensor b3 = basic_conv(n, x, at(p, "branch3x3dbl_1"), 64, 1);
  b3 = basic_conv(n, b3, at(p, "branch3x3dbl_2"), 96, 3, 1, 1);
  b3 = basic_conv(n, b3, at(p, "branch3x3dbl_3"), 96, 3, 1, 1);
  tensor bp = n.pool(x, at(p, "avg_pool2d"), 3, 1, 1);
  bp = basic_conv(n, bp, at(p, "branch_pool"), pool_features, 1);
  return n.cat({b1, b5, b3, bp}, at(p, "cat"));
}

inline tensor inception_b(net& n, const tensor& x, std::string_view p) {
  const tensor b3 = basic_conv(n, x, at(p, "branch3x3"), 384, 3, 2);
  tensor bd = basic_conv(n, x, at(p, "branch3x3dbl_1"), 64, 1);
  bd = basic_conv(n, bd, at(p, "branch3x3dbl_2"), 96, 3, 1, 1);
  bd = basic_conv(n, bd, at(p, "branch3x3dbl_3"), 96, 3, 2);
  const tensor bp = n.pool(x, at(p, "max_pool2d"), 3, 2);
  return n.cat({b3, bd, bp}, at(p, "cat"));
}

inline tensor inception_c(net& n, const tensor& x, std::string_view p, std::int64_t c7) {
  const tensor b1 = basic_conv(n, x, at(p, "branch1x1"), 192, 1);
  tensor b7 = basic_conv(n, x, at(p, "branch7x7_1"), c7, 1);
  b7 = basic_conv(n, b7, at(p, "branch7x7_2"), c7, {1, 7}, {1, 1}, {0, 3});
  b7 = basic_conv(n, b7, at(p, "branch7x7_3"), 192, {7, 1}, {1, 1}, {3, 0});
  tensor bd = basic_conv(n, x, at(p, "branch7x7dbl_1"), c7, 1);
  bd = basic_conv(n, bd, at(p, "branch7x7dbl_2"), c7, {7, 1}, {1, 1}, {3, 0});
  bd = basic_conv(n, bd, at(p, "branch7x7dbl_3"), c7, {1, 7}, {1, 1}, {0, 3});
  bd = basic_conv(n, bd, at(p, "branch7x7dbl_4"), c7, {7, 1}, {1, 1}, {3, 0});
  bd = basic_conv(n, bd, at(p, "branch7x7dbl_5"), 192, {1, 7}, {1, 1}, {0, 3});
  tensor bp = n.pool(x, at(p, "avg_pool2d"), 3, 1, 1);
  bp = basic_conv(n, bp, at(p, "branch_pool"), 192, 1);
  return n.cat({b1, b7, bd, bp}, at(p, "cat"));
}

inline tensor inception_d(net& n, const tensor& x, std::string_view p) {
  tensor b3 = basic_conv(n, x, at(p, "branch3x3_1"), 192, 1);
  b3 = basic_conv(n, b3, at(p, "branch3x3_2"), 320, 3, 2);
  tensor b7 = basic_conv(n, x, at(p, "branch7x7x3_1"), 192, 1);
  b7 = basic_conv(n, b7, at(p, "branch7x7x3_2"), 192, {1, 7}, {1, 1}, {0, 3});
  b7 = basic_conv(n, b7, at(p, "branch7x7x3_3"), 192, {7, 1}, {1, 1}, {3, 0});
  b7 = basic_conv(n, b7, at(p, "branch7x7x3_4"), 192, 3, 2);
  const tensor bp = n.pool(x, at(p, "max_pool2d"), 3, 2);
  return n.cat({b3, b7, bp}, at(p, "cat"));
}

inline tensor inception_e(net& n, const tensor& x, std::string_view p) {
  const tensor b1 = basic_conv(n, x, at(p, "branch1x1"), 320, 1);
  const tensor b3 = basic_conv(n, x, at(p, "branch3x3_1"), 384, 1);
  const tensor b3a = basic_conv(n, b3, at(p, "branch3x3_2a"), 384, {1, 3}, {1, 1}, {0, 1});
  const tensor b3b = basic_conv(n, b3, at(p, "branch3x3_2b"), 384, {3, 1}, {1, 1}, {1, 0});
  const tensor b3c = n.cat({b3a, b3b}, at(p, "branch3x3.cat"));
  tensor bd = basic_conv(n, x, at(p, "branch3x3dbl_1"), 448, 1);
  bd = basic_conv(n, bd, at(p, "branch3x3dbl_2"), 384, 3, 1, 1);
  const tensor bda = basic_conv(n, bd, at(p, "branch3x3dbl_3a"), 384, {1, 3}, {1, 1}, {0, 1});
  const tensor bdb = basic_conv(n, bd, at(p, "branch3x3dbl_3b"), 384, {3, 1}, {1, 1}, {1, 0});
  const tensor bdc = n.cat({bda, bdb}, at(p, "branch3x3dbl.cat"));
  tensor bp = n.pool(x, at(p, "avg_pool2d"), 3, 1, 1);
  bp = basic_conv(n, bp, at(p, "branch_pool"), 192, 1);
  return n.cat({b1, b3c, bdc, bp}, at(p, "cat"));
}

inline graph build_inception_v3(models_input in, std::int64_t bytes) {
  net n("inception_v3", in, bytes);
  tensor x = basic_conv(n, n.input(), "Conv2d_1a_3x3", 32, 3, 2);
  x = basic_conv(n, x, "Conv2d_2a_3x3", 32, 3);
  x = basic_conv(n, x, "Conv2d_2b_3x3", 64, 3, 1, 1);
  x = n.pool(x, "maxpool1", 3, 2);
  x = basic_conv(n, x, "Conv2d_3b_1x1", 80, 1);
  x = basic_conv(n, x, "Conv2d_4a_3x3", 192, 3);
  x = n.pool(x, "maxpool2", 3, 2);
  x = inception_a(n, x, "Mixed_5b", 32);
  x = inception_a(n, x, "Mixed_5c", 64);
  x = inception_a(n, x, "Mixed_5d", 64);
  x = inception_b(n, x, "Mixed_6a");
  x = inception_c(n, x, "Mixed_6b", 128);
  x = inception_c(n, x, "Mixed_6c", 160);
  x = inception_c(n, x, "Mixed_6d", 160);
  x = inception_c(n, x, "Mixed_6e", 192);
  x = inception_d(n, x, "Mixed_7a");
  x = inception_e(n, x, "Mixed_7b");
  x = inception_e(n, x, "Mixed_7c");
  x = n.adaptive_pool(x, "avgpool", 1, 1);
  x = n.same(x, "dropout");
  x = n.flatten(x, "flatten");
  x = n.linear(x, "fc", 1000);
  return n.finish(x);
}

inline constexpr std::array<std::string_view, 15> model_names{
    "alexnet",     "vgg11",       "vgg13",       "vgg16",       "vgg19",
    "resnet18",    "resnet34",    "resnet50",    "resnet101",   "resnet152",
    "densenet121", "densenet161", "densenet169", "densenet201", "inception_v3"};

}  // namespace dropit::checkpoint::detail::models

namespace dropit::checkpoint::models {

inline graph alexnet(input_shape in, std::int64_t bytes_per_element) {
  return detail::models::build_alexnet(in, bytes_per_element);
}
inline graph vgg(int depth, input_shape in, std::int64_t bytes_per_element) {
  return detail::models::build_vgg(depth, in, bytes_per_element);
}
inline graph resnet(int depth, input_shape in, std::int64_t bytes_per_element) {
  return detail::models::build_resnet(depth, in, bytes_per_element);
}
inline graph densenet(int depth, input_shape in, std::int64_t bytes_per_element) {
  return detail::models::build_densenet(depth, in, bytes_per_element);
}
inline graph inception_v3(input_shape in, std::int64_t bytes_per_element) {
  return detail::models::build_inception_v3(in, bytes_per_element);
}

inline storage_option mink_option(std::int64_t elements, std::int64_t bytes_per_element) {
  DROPIT_EXPECTS(elements >= 0 && bytes_per_element > 0, "checkpoint: models: mink_option: bad ",
                 "size (", elements, " elements of ", bytes_per_element, " bytes)");
  const double per_element =
      0.1 * static_cast<double>(bytes_per_element) + mink_overhead_bytes_per_element;
  return {"MinK 0.9", static_cast<cost_t>(std::ceil(static_cast<double>(elements) * per_element)),
          mink_time_per_element * static_cast<double>(elements)};
}

inline storage_option int8_option(std::int64_t elements) {
  DROPIT_EXPECTS(elements >= 0, "checkpoint: models: int8_option: bad size (", elements,
                 " elements)");
  const std::int64_t chunks = elements / 1024 + (elements % 1024 != 0 ? 1 : 0);
  const double scale_bytes = int8_scale_bytes_per_element * 1024.0;
  return {"int8", elements + chunks * static_cast<cost_t>(scale_bytes),
          int8_time_per_element * static_cast<double>(elements)};
}

inline std::size_t offer_int8(graph& g, std::int64_t bytes_per_element) {
  DROPIT_EXPECTS(bytes_per_element >= 1, "checkpoint: models: offer_int8: bad element size ",
                 bytes_per_element);
  const vertex_index s = g.source(), t = g.target();
  std::size_t offered = 0;
  for (vertex_index v = 0; v < g.vertex_count(); ++v) {
    if (v == s || v == t || !g.storage(v).empty()) continue;
    g.add_storage(v, int8_option(g.cost(v) / bytes_per_element));
    ++offered;
  }
  return offered;
}

inline std::span<const std::string_view> names() noexcept {
  return detail::models::model_names;
}

inline graph make(std::string_view name, input_shape in, std::int64_t bytes_per_element) {
  auto number = [&](std::string_view prefix) {
    int d = 0;
    const auto digits = name.substr(prefix.size());
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    return r.ec == std::errc{} && r.ptr == digits.data() + digits.size() ? d : -1;
  };
  if (name == "alexnet") return alexnet(in, bytes_per_element);
  if (name == "inception_v3") return inception_v3(in, bytes_per_element);
  for (std::string_view m : names()) {
    if (m != name) continue;
    if (name.starts_with("vgg")) return vgg(number("vgg"), in, bytes_per_element);
    if (name.starts_with("resnet")) return resnet(number("resnet"), in, bytes_per_element);
    if (name.starts_with("densenet")) return densenet(number("densenet"), in, bytes_per_element);
  }
  dropit::detail::throw_error("checkpoint: models: unknown model \"", name, "\"");
}

}  // namespace dropit::checkpoint::models
