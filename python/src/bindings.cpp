// dropit._C: the Python bindings of dropit's LibTorch adapter (policies, saved-tensor packs, live
// byte counts, the counting CPU allocator). The hooks that decide what to pack live in
// dropit/_hooks.py; every selection, packing and format step runs here, in the C++ library.
#include <dropit/torch/counting_allocator.hpp>
#include <dropit/torch/functional.hpp>
#include <dropit/torch/packed.hpp>
#include <dropit/torch/policy.hpp>

#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/extension.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace py = pybind11;
namespace dt = dropit::torch;

namespace {

/// The Python dtype object of a scalar type (torch.float32, ...).
py::object dtype_object(at::ScalarType type) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(type)));
}

py::tuple shape_tuple(const std::vector<std::int64_t>& sizes) {
  py::tuple out(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    out[i] = sizes[i];
  return out;
}

std::string policy_repr(const dt::policy& p) {
  std::string codec =
      p.codec == dropit::value_codec::exact ? "" : "codec='" + dt::to_string(p.codec) + "'";
  if (p.positions != dropit::position_choice::smallest)
    codec +=
        (codec.empty() ? "" : ", ") + std::string("positions='") + dt::to_string(p.positions) + "'";
  switch (p.kind) {
    case dt::policy_kind::mink:
      return "dropit.MinK(gamma=" + py::repr(py::float_(p.gamma)).cast<std::string>() +
             (codec.empty() ? "" : ", " + codec) + ")";
    case dt::policy_kind::random:
      return "dropit.Random(gamma=" + py::repr(py::float_(p.gamma)).cast<std::string>() +
             ", seed=" + std::to_string(p.seed) + (codec.empty() ? "" : ", " + codec) + ")";
    case dt::policy_kind::identity:
      return "dropit.Identity(" + codec + ")";
    case dt::policy_kind::none:
      break;
  }
  return "dropit.Policy('none')";
}

/// `with dropit.memory_counter() as counter:` -- a counting_allocator installed as LibTorch's CPU
/// allocator for the block. One at a time: nesting would hide the outer counter's allocations.
class memory_counter {
 public:
  memory_counter() : counter_(std::make_unique<dt::counting_allocator>()) {}

  memory_counter& enter() {
    DROPIT_EXPECTS(!guard_, "memory_counter: this counter is already active");
    bool expected = false;
    DROPIT_EXPECTS(active().compare_exchange_strong(expected, true),
                   "memory_counter: another memory_counter is active (they do not nest)");
    try {
      guard_.emplace(*counter_);
    } catch (...) {
      active().store(false);
      throw;
    }
    counter_->reset_peak();
    return *this;
  }

  void exit() {
    if (!guard_) return;
    guard_.reset();
    active().store(false);
  }

  [[nodiscard]] std::size_t current() const noexcept { return counter_->current_bytes(); }
  [[nodiscard]] std::size_t peak() const noexcept { return counter_->peak_bytes(); }
  [[nodiscard]] std::uint64_t allocations() const noexcept { return counter_->allocations(); }
  std::size_t reset_peak() noexcept { return counter_->reset_peak(); }
  [[nodiscard]] bool is_active() const noexcept { return guard_.has_value(); }

 private:
  static std::atomic<bool>& active() {
    static std::atomic<bool> flag{false};
    return flag;
  }

  // The allocator may be referenced by blocks that outlive the counter: it shares its
  // bookkeeping with them, so destroying it first is safe.
  std::unique_ptr<dt::counting_allocator> counter_;
  std::optional<dt::cpu_allocator_guard> guard_;
};

using pair2 = std::array<std::int64_t, 2>;

/// Binds a pooling op of the adapter (x and max_pool2d_params) under `name`, with the window
/// arguments as F.max_pool2d names them; the GIL is released while it runs.
template <class Op>
void def_pool(py::module_& m, const char* name, Op op, const char* doc) {
  m.def(
      name,
      [op](const at::Tensor& x, pair2 kernel, pair2 stride, pair2 padding, pair2 dilation,
           bool ceil_mode) {
        return op(x, dt::max_pool2d_params{kernel, stride, padding, dilation, ceil_mode});
      },
      py::arg("input"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("ceil_mode"), py::call_guard<py::gil_scoped_release>(), doc);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dropit's C++ library: policies, saved-tensor packs, byte counts, memory counter";
  py::register_exception<dropit::error>(m, "Error", PyExc_ValueError);

  py::class_<dt::policy>(m, "Policy", R"doc(
A selection policy: which elements of a saved tensor to keep.

Use the subclasses: ``dropit.MinK(gamma)``, ``dropit.Random(gamma, seed)``, ``dropit.Identity()``.
gamma is the fraction dropped, in [0, 1]; ``codec`` ("exact", "int8", "fp8") how kept values are
stored; ``positions`` ("smallest", "no_elias_fano") which position encodings a pack chooses from.)doc")
      .def(py::init([](const std::string& kind, double gamma, std::uint64_t seed,
                       const std::string& codec, const std::string& positions) {
             dt::policy p = dt::policy::parse(kind, gamma, seed);
             p.codec = dt::parse_codec(codec);
             p.positions = dt::parse_positions(positions);
             return p;
           }),
           py::arg("kind"), py::arg("gamma") = 0.0, py::arg("seed") = 0, py::arg("codec") = "exact",
           py::arg("positions") = "smallest")
      .def_property_readonly("kind", [](const dt::policy& p) { return dt::to_string(p.kind); })
      .def_property_readonly("gamma", [](const dt::policy& p) { return p.gamma; })
      .def_property_readonly("seed", [](const dt::policy& p) { return p.seed; })
      .def_property_readonly("codec", [](const dt::policy& p) { return dt::to_string(p.codec); })
      .def_property_readonly("positions",
                             [](const dt::policy& p) { return dt::to_string(p.positions); })
      .def(
          "with_seed",
          [](const dt::policy& p, std::uint64_t seed) {
            dt::policy q = p;
            q.seed = seed;
            return q;
          },
          py::arg("seed"), "The same policy with another seed (Random's positions).")
      .def("__repr__", &policy_repr)
      .def("__eq__",
           [](const dt::policy& a, const dt::policy& b) {
             return a.kind == b.kind && a.gamma == b.gamma && a.seed == b.seed &&
                    a.codec == b.codec && a.positions == b.positions;
           })
      .def(
          "__reduce__",
          [](const py::object& self) {
            // pickle and copy.deepcopy (a hooked model's saved policies): the constructor's
            // arguments, which it validates again. MinK, Random and Identity define their own.
            const auto& p = self.cast<const dt::policy&>();
            return py::make_tuple(
                py::type::of<dt::policy>(),
                py::make_tuple(dt::to_string(p.kind), p.gamma, p.seed, dt::to_string(p.codec),
                               dt::to_string(p.positions)));
          },
          "Pickles as the constructor's arguments.");

  py::class_<dt::packed_tensor>(m, "Packed", R"doc(
A tensor packed by a policy: the kept values and their positions.

``restore()`` rebuilds a dense tensor (kept values in place, zeros elsewhere); ``nbytes`` is the
payload size, ``kept`` and ``numel`` count elements.)doc")
      .def("restore", &dt::packed_tensor::restore, py::call_guard<py::gil_scoped_release>(),
           "A new dense tensor: kept values in place, zeros elsewhere.")
      .def_property_readonly("nbytes", &dt::packed_tensor::bytes)
      .def_property_readonly("kept", &dt::packed_tensor::kept)
      .def_property_readonly("numel", &dt::packed_tensor::numel)
      .def_property_readonly("shape",
                             [](const dt::packed_tensor& p) { return shape_tuple(p.sizes()); })
      .def_property_readonly("dtype",
                             [](const dt::packed_tensor& p) { return dtype_object(p.dtype()); })
      .def(
          "__reduce__",
          [](const dt::packed_tensor& p) {
            // pickle, copy and torch.save: what packed_tensor::load takes, which checks it all
            // again (a corrupt or forged pickle is refused, never restored out of bounds).
            const auto bytes = p.payload();
            return py::make_tuple(
                py::module_::import("dropit").attr("_load_packed"),
                py::make_tuple(
                    dtype_object(p.dtype()), shape_tuple(p.sizes()), shape_tuple(p.strides()),
                    p.packed_with(), p.kept(), dropit::detail::encoding_name(p.positions()),
                    py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
          },
          "Pickles as its dtype, shape, strides, policy, kept count, position encoding and "
          "payload bytes.")
      .def("__repr__", [](const dt::packed_tensor& p) {
        return "dropit.Packed(kept=" + std::to_string(p.kept()) +
               ", numel=" + std::to_string(p.numel()) + ", nbytes=" + std::to_string(p.bytes()) +
               ")";
      });

  m.def("pack", &dt::packed_tensor::pack, py::arg("tensor"), py::arg("policy"),
        py::call_guard<py::gil_scoped_release>(), R"doc(
Packs a contiguous CPU tensor (float32, float64, bfloat16, float16) with a policy.

Raises dropit.Error for a non-contiguous, non-CPU or unsupported tensor.)doc");
  m.def(
      "_load_packed",
      [](const py::object& dtype, std::vector<std::int64_t> sizes,
         std::vector<std::int64_t> strides, const dt::policy& policy, std::size_t kept,
         const std::string& positions, const py::bytes& payload) {
        DROPIT_EXPECTS(THPDtype_Check(dtype.ptr()),
                       "Packed: not a torch.dtype: ", py::repr(dtype).cast<std::string>());
        const at::ScalarType type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
        std::optional<dropit::position_encoding> encoding;
        for (const auto e : {dropit::position_encoding::none, dropit::position_encoding::bitmask,
                             dropit::position_encoding::index32, dropit::position_encoding::index64,
                             dropit::position_encoding::elias_fano}) {
          if (positions == dropit::detail::encoding_name(e)) encoding = e;
        }
        DROPIT_EXPECTS(encoding.has_value(), "Packed: unknown position encoding '", positions, "'");
        char* data = nullptr;
        Py_ssize_t length = 0;
        if (PyBytes_AsStringAndSize(payload.ptr(), &data, &length) != 0)
          throw py::error_already_set();
        const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                               static_cast<std::size_t>(length));
        py::gil_scoped_release unlocked;  // payload stays alive: the caller holds it
        return dt::packed_tensor::load(type, std::move(sizes), std::move(strides), policy, kept,
                                       *encoding, bytes);
      },
      "A Packed from what its __reduce__ gives (every part checked).");
  m.def("_pack_saved", &dt::packed_tensor::pack_saved, py::arg("tensor"), py::arg("policy"),
        py::call_guard<py::gil_scoped_release>(),
        "Packs any CPU strided tensor (dense ones in memory order, others through a copy).");

  py::class_<dt::packed_mask>(
      m, "Mask",
      "A ReLU's, LeakyReLU's or Hardtanh's mask or a dropout's noise, 1 bit per element.")
      .def("restore", &dt::packed_mask::restore, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("nbytes", &dt::packed_mask::bytes)
      .def_property_readonly("numel", &dt::packed_mask::numel);
  m.def("_pack_relu", &dt::packed_mask::relu, py::arg("output"),
        py::call_guard<py::gil_scoped_release>());
  m.def("_pack_dropout", &dt::packed_mask::dropout, py::arg("noise"),
        py::call_guard<py::gil_scoped_release>(),
        "A dropout's saved noise (every element 0 or one positive value) as bits and the value.");
  m.def("_pack_leaky_relu", &dt::packed_mask::leaky_relu, py::arg("saved"),
        py::call_guard<py::gil_scoped_release>(),
        "A LeakyReLU's saved tensor as the bits t > 0, restored as 1 / 0.");
  m.def("_pack_hardtanh", &dt::packed_mask::hardtanh, py::arg("saved"), py::arg("min_val"),
        py::arg("max_val"), py::call_guard<py::gil_scoped_release>(),
        "A Hardtanh's saved tensor as the bits min_val < t < max_val, restored as a value inside "
        "the bounds / min_val.");

  py::class_<dt::packed_pool_indices>(m, "PoolIndices",
                                      "A max pooling's argmax indices as window positions.")
      .def("restore", &dt::packed_pool_indices::restore, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("nbytes", &dt::packed_pool_indices::bytes)
      .def_property_readonly("bits", &dt::packed_pool_indices::bits);
  m.def(
      "_pack_pool_indices",
      [](const at::Tensor& indices, std::int64_t in_h, std::int64_t in_w, pair2 kernel,
         pair2 stride, pair2 padding, pair2 dilation, bool ceil_mode) {
        const dt::max_pool2d_params params{kernel, stride, padding, dilation, ceil_mode};
        return dt::packed_pool_indices::pack(indices, in_h, in_w, params);
      },
      py::arg("indices"), py::arg("in_h"), py::arg("in_w"), py::arg("kernel"), py::arg("stride"),
      py::arg("padding"), py::arg("dilation"), py::arg("ceil_mode"),
      py::call_guard<py::gil_scoped_release>());

  def_pool(
      m, "_max_pool2d",
      [](const at::Tensor& x, const dt::max_pool2d_params& p) { return dt::max_pool2d(x, p); },
      R"doc(
2-d max pooling of a CPU tensor that saves, per output, the window position of its maximum
(2 bits for a 2x2 window) instead of the input and int64 indices; output and gradient equal
PyTorch's (ties and NaNs included). Without a gradient to compute, PyTorch's max_pool2d.)doc");
  def_pool(
      m, "_max_pool2d_relu",
      [](const at::Tensor& x, const dt::max_pool2d_params& p) { return dt::max_pool2d_relu(x, p); },
      R"doc(
relu(_max_pool2d(x)) as one op that saves the ReLU's 1-bit mask of the outputs and the window
positions of only the outputs the ReLU passes; output and gradient equal PyTorch's
relu(max_pool2d(x)) (ties and NaNs included). Its backward is not differentiable (create_graph
raises). Without a gradient to compute, PyTorch's ops.)doc");

  m.def(
      "_relu", [](const at::Tensor& x) { return dt::relu(x); }, py::arg("input"),
      py::call_guard<py::gil_scoped_release>(),
      R"doc(
max(x, 0) of a CPU tensor that saves one bit per element (x > 0) and computes its gradient from
the bits, without a dense tensor in backward; output and gradient equal PyTorch's relu. Without a
gradient to compute, PyTorch's relu.)doc");
  m.def(
      "_relu_", [](at::Tensor x) { return dt::relu_(x); }, py::arg("input"),
      py::call_guard<py::gil_scoped_release>(),
      R"doc(
In-place _relu (as torch.relu_): returns the result, x itself unless x is a strided view, which is
processed out of place.)doc");

  m.def(
      "_linear",
      [](const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
         const dt::policy& p) { return dt::linear(x, weight, bias, p); },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("policy"),
      py::call_guard<py::gil_scoped_release>(),
      R"doc(
F.linear that saves its input through the policy and computes the weight gradient from it in
pieces of rows (the rebuilt input never exists whole); input and bias gradients exact.)doc");
  m.def(
      "_conv1d",
      [](const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
         const dt::policy& p) { return dt::gpt2_conv1d(x, weight, bias, p); },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("policy"),
      py::call_guard<py::gil_scoped_release>(), "GPT-2's Conv1D (x W + b, W [nx, nf]) as _linear.");
  m.def(
      "_conv2d",
      [](const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
         std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> padding,
         std::array<std::int64_t, 2> dilation, std::int64_t groups, const dt::policy& p) {
        return dt::conv2d(x, weight, bias, {stride, padding, dilation, groups}, p);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("groups"), py::arg("policy"),
      py::call_guard<py::gil_scoped_release>(),
      R"doc(
F.conv2d (symmetric padding given as two ints) that saves its input through the policy; forward
and backward run in pieces of samples (backward rebuilds one piece of the input at a time); input
and bias gradients as PyTorch's up to rounding, the weight gradient from the sparsified input.)doc");
  m.def("_set_chunk_bytes", &dt::set_chunk_bytes, py::arg("bytes"),
        "Size of the pieces in which the C++ layers rebuild a saved input (0: never split).");
  m.def("_chunk_bytes", &dt::chunk_bytes);
  m.def(
      "_live_saved_bytes",
      [] {
        const dt::saved_bytes b = dt::live_saved_bytes();
        return py::make_tuple(b.sparse, b.masks);
      },
      "(sparse, masks): bytes held now by dropit's packs, process-wide.");

  py::class_<memory_counter>(m, "MemoryCounter", R"doc(
Counts every CPU allocation LibTorch makes (tensors, oneDNN buffers, dropit's payloads) while
active: ``with dropit.memory_counter() as counter: ...``. ``peak_bytes`` is the largest
``current_bytes`` since the block began or ``reset_peak()`` was called.)doc")
      .def(py::init<>())
      .def("__enter__", &memory_counter::enter, py::return_value_policy::reference)
      .def("__exit__",
           [](memory_counter& c, const py::args&) {
             c.exit();
             return false;
           })
      .def_property_readonly("current_bytes", &memory_counter::current)
      .def_property_readonly("peak_bytes", &memory_counter::peak)
      .def_property_readonly("allocations", &memory_counter::allocations)
      .def_property_readonly("active", &memory_counter::is_active)
      .def("reset_peak", &memory_counter::reset_peak,
           "Starts a new peak window (peak := current); returns the current bytes.");

  m.attr("has_half") = py::bool_(DROPIT_HAS_HALF != 0);
}
