"""to_dropit on single layers: what backward receives (read through autograd) and the gradients,
against plain PyTorch and the pure-PyTorch oracles of reference.py."""
import copy
import functools
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit
import reference
from conftest import gated, saved


class Conv1D(nn.Module):
    """GPT-2's Conv1D (transformers.pytorch_utils.Conv1D): y = x W + b, W stored [nx, nf]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class MyConv1D(Conv1D):
    pass


class MyLinear(nn.Linear):
    pass


def run(layer, x, g=None):
    """Forward and backward of one layer on a fresh leaf copy of x; returns (y, x.grad, grads)."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    y = layer(x)
    if g is None:
        g = torch.randn_like(y)
    y.backward(g)
    grads = {n: p.grad.detach().clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    return y, (x.grad if x.requires_grad else None), grads, g


def saved_input(y):
    for name in ("mat1", "self", "input"):
        try:
            return saved(y, name)
        except LookupError:
            continue
    raise LookupError("no saved layer input")


# The autograd nodes of dropit's C++ Linear and Conv1D (the kernel path).
KERNEL_NODES = {f"torch::autograd::CppNode<dropit::torch::detail::{fn}>"
                for fn in ("linear_fn", "gpt2_conv1d_fn")}


@pytest.fixture(params=["kernel", "hooks"])
def path(request, monkeypatch):
    """The two ways a Linear / Conv2d / Conv1D layer runs: its op through dropit's C++ function
    (the default for a lossy policy), or PyTorch's op with the pack hook packing its input."""
    monkeypatch.setattr(dropit._hooks, "_ROUTE_WEIGHT_LAYERS", request.param == "kernel")
    return request.param


def layer_node(y):
    """The node of the layer that made y (past the views GPT-2's Conv1D takes of its output)."""
    node = y.grad_fn
    while node.name() in ("ViewBackward0", "UnsafeViewBackward0"):
        node = node.next_functions[0][0]
    return node


def input_seen(layer, y):
    """The input a Linear's or Conv1D's weight gradient reads, exactly: with the output gradient
    one-hot at row r0 + c, column c, the weight gradient's row (Linear) or column (Conv1D) c is
    input row r0 + c (one product; the rest are sums of zeros)."""
    out = y.shape[-1]
    rows = y.numel() // out
    parts = []
    for r0 in range(0, rows, out):
        n = min(out, rows - r0)
        g = torch.zeros(rows, out, dtype=y.dtype)
        g[r0:r0 + n, :n] = torch.eye(n).to(y.dtype)
        (gw,) = torch.autograd.grad(y, layer.weight, g.view(y.shape), retain_graph=True)
        parts.append((gw if isinstance(layer, nn.Linear) else gw.t())[:n])
    return torch.cat(parts)


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


# ---- Linear, Conv1D ---------------------------------------------------------------------------

LINEAR_CASES = [
    ("linear-2d", lambda: nn.Linear(24, 10), (32, 24)),
    ("linear-2d-nobias", lambda: nn.Linear(24, 10, bias=False), (32, 24)),
    ("linear-3d", lambda: nn.Linear(24, 10), (4, 8, 24)),
    ("linear-3d-nobias", lambda: nn.Linear(24, 10, bias=False), (4, 8, 24)),
    ("linear-subclass", lambda: MyLinear(24, 10), (32, 24)),
    ("conv1d-gpt2", lambda: Conv1D(10, 24), (4, 8, 24)),
    ("conv1d-subclass", lambda: MyConv1D(10, 24), (32, 24)),
]
DTYPES = [torch.float32, torch.float64] + ([torch.bfloat16] if dropit._C.has_half else [])


@pytest.mark.parametrize("name,make,shape", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_matmul_layers(name, make, shape, dtype, gamma, path):
    layer = make().to(dtype)
    plain = copy.deepcopy(layer)
    x = torch.randn(shape).to(dtype).requires_grad_(True)
    y0, gx0, grads0, g = run(plain, x)
    handle = dropit.to_dropit(layer, "mink", gamma)
    assert handle.layers == [("", "weight")]
    x1 = x.detach().clone().requires_grad_(True)
    y = layer(x1)
    assert torch.equal(y, y0)  # the forward is PyTorch's own
    assert (layer_node(y).name() in KERNEL_NODES) == (path == "kernel")
    # Backward reads the sparsified input; the weight is saved as it is.
    x2 = x1.detach().reshape(-1, x1.shape[-1])
    assert torch.equal(input_seen(layer, y), reference.mink(x2, gamma))
    if path == "hooks":
        assert torch.equal(saved_input(y), reference.mink(x2, gamma))
        assert saved(y, "mat2").data_ptr() == layer.weight.data_ptr()
    y.backward(g)
    # Input and bias gradients exact; the weight gradient from the sparsified input.
    assert torch.equal(x1.grad, gx0)
    if getattr(layer, "bias", None) is not None:
        assert torch.equal(layer.bias.grad, grads0["bias"])
    g2 = g.reshape(-1, g.shape[-1])
    xs = reference.mink(x2, gamma)
    want = g2.t().mm(xs) if isinstance(layer, nn.Linear) else xs.t().mm(g2)
    torch.testing.assert_close(layer.weight.grad, want, **TOL[dtype])
    handle.remove()


@pytest.mark.parametrize("codec", ["int8", "fp8"])
@pytest.mark.parametrize("name,make,shape", LINEAR_CASES[:4] + LINEAR_CASES[5:6],
                         ids=[c[0] for c in LINEAR_CASES[:4] + LINEAR_CASES[5:6]])
def test_matmul_layers_with_a_value_codec(name, make, shape, codec, path):
    layer = make()
    plain = copy.deepcopy(layer)
    x = torch.randn(shape).requires_grad_(True)
    y0, gx0, grads0, g = run(plain, x)
    handle = dropit.to_dropit(layer, "mink", 0.9, codec=codec)
    x1 = x.detach().clone().requires_grad_(True)
    y = layer(x1)
    assert torch.equal(y, y0)
    # Backward reads the sparsified input with its kept values through the codec.
    x2 = x1.detach().reshape(-1, x1.shape[-1])
    sparse = reference.mink(x2, 0.9)
    positions = torch.nonzero(sparse.reshape(-1) != 0).reshape(-1)
    want_input = reference.quantize_kept(sparse, positions, codec)
    assert (layer_node(y).name() in KERNEL_NODES) == (path == "kernel")
    assert torch.equal(input_seen(layer, y), want_input)
    assert not torch.equal(want_input, sparse)  # the codec changed values: not vacuous
    y.backward(g)
    assert torch.equal(x1.grad, gx0)  # input and bias gradients stay exact
    if getattr(layer, "bias", None) is not None:
        assert torch.equal(layer.bias.grad, grads0["bias"])
    g2 = g.reshape(-1, g.shape[-1])
    want = g2.t().mm(want_input) if isinstance(layer, nn.Linear) else want_input.t().mm(g2)
    torch.testing.assert_close(layer.weight.grad, want, **TOL[torch.float32])
    handle.remove()


def test_a_value_codec_saves_fewer_bytes():
    import fmnist

    x = torch.randn(64, 1, 28, 28)
    held = {}
    for codec in ("exact", "int8", "fp8"):
        torch.manual_seed(0)
        net = fmnist.make_cnn()
        dropit.to_dropit(net, "mink", 0.9, codec=codec)
        y = net(x)
        held[codec] = dropit.live_saved_bytes().sparse
        y.sum().backward()
    assert held["int8"] == held["fp8"]
    assert held["int8"] < 0.6 * held["exact"]


@pytest.mark.parametrize("name,make,shape", LINEAR_CASES[:4], ids=[c[0] for c in LINEAR_CASES[:4]])
def test_matmul_layers_input_without_grad(name, make, shape, path):
    layer = make()
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(shape)
    y = layer(x)
    assert (layer_node(y).name() in KERNEL_NODES) == (path == "kernel")
    assert torch.equal(input_seen(layer, y), reference.mink(x.reshape(-1, shape[-1]), 0.9))


# ---- the kernel path: dropit's C++ Linear / Conv1D ----------------------------------------------


@pytest.mark.parametrize("name,make,shape", [LINEAR_CASES[2], LINEAR_CASES[5]],
                         ids=[LINEAR_CASES[2][0], LINEAR_CASES[5][0]])
def test_kernel_path_rebuilds_the_input_in_pieces(name, make, shape):
    # Pieces of 2 rows of 24 floats: 16 pieces; the weight gradient is their sum, as the oracle's
    # one product over the whole sparsified input.
    layer = make().double()
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    old = dropit._C._chunk_bytes()
    dropit._C._set_chunk_bytes(2 * 24 * 8)
    try:
        y = layer(x)
        assert layer_node(y).name() in KERNEL_NODES
        g = torch.randn_like(y)
        y.backward(g)
    finally:
        dropit._C._set_chunk_bytes(old)
    xs = reference.mink(x.detach().reshape(-1, 24), 0.9)
    g2 = g.reshape(-1, 10)
    want = g2.t().mm(xs) if isinstance(layer, nn.Linear) else xs.t().mm(g2)
    torch.testing.assert_close(layer.weight.grad, want, **TOL[torch.float64])


def test_kernel_path_backward_never_holds_the_whole_input(monkeypatch):
    # 8 MiB of input: the hook path's backward restores it whole, the kernel path in 1 MiB pieces
    # (the counting allocator sees every CPU allocation, so this is a count, not a timing).
    peaks = {}
    for route in (True, False):
        monkeypatch.setattr(dropit._hooks, "_ROUTE_WEIGHT_LAYERS", route)
        torch.manual_seed(0)
        lin = nn.Linear(256, 256)
        dropit.to_dropit(lin, "mink", 0.9)
        x = torch.randn(8192, 256, requires_grad=True)
        y = lin(x)
        g = torch.randn_like(y)
        with dropit.memory_counter() as counter:
            start = counter.current_bytes
            y.backward(g)
            peaks[route] = counter.peak_bytes - start
    x_bytes = 8192 * 256 * 4
    assert peaks[True] + 0.75 * x_bytes <= peaks[False]


def test_kernel_path_double_backward_matches_the_hook_path(monkeypatch):
    # A gradient penalty through a Linear: create_graph makes both paths differentiate through
    # the rebuilt input (its kept values stand for x).
    outs = {}
    for route in (True, False):
        monkeypatch.setattr(dropit._hooks, "_ROUTE_WEIGHT_LAYERS", route)
        torch.manual_seed(0)
        lin = nn.Linear(12, 6).double()
        dropit.to_dropit(lin, "mink", 0.5)
        x = torch.randn(10, 12, dtype=torch.float64, requires_grad=True)
        y = lin(x * 1.5)
        assert (y.grad_fn.name() in KERNEL_NODES) == route
        (gw,) = torch.autograd.grad((y * y).sum(), lin.weight, create_graph=True)
        (gx,) = torch.autograd.grad((gw * gw).sum(), x)
        # The restored input stands for x: d <G^T x_restored, V> / dx = G V, at every element
        # of x, dropped ones included.
        lin2 = nn.Linear(12, 6).double()
        dropit.to_dropit(lin2, "mink", 0.9)
        G, V = torch.randn(10, 6, dtype=torch.float64), torch.randn(6, 12, dtype=torch.float64)
        (gw2,) = torch.autograd.grad(lin2(x), lin2.weight, G, create_graph=True)
        (gx2,) = torch.autograd.grad((gw2 * V).sum(), x)
        torch.testing.assert_close(gx2, G.mm(V), rtol=1e-12, atol=1e-12)
        outs[route] = (gw.detach(), gx)
    torch.testing.assert_close(outs[True][0], outs[False][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs[True][1], outs[False][1], rtol=1e-12, atol=1e-12)


def test_kernel_path_takes_only_the_layers_own_call():
    # What the C++ function does not take runs in PyTorch, its input packed by the hook: a
    # tensor subclass, autocast, an input computed in the forward, a weight that is no
    # parameter, a frozen weight (nothing to pack: the weight gradient is not wanted).
    class Scaled(nn.Linear):
        def forward(self, x):
            return F.linear(x * 2.0, self.weight, self.bias)

    class Transposed(nn.Linear):
        def forward(self, x):
            return F.linear(x, self.weight.t().t(), self.bias)

    x = torch.randn(6, 8, requires_grad=True)
    scaled = Scaled(8, 4)
    dropit.to_dropit(scaled, "mink", 0.5)
    y = scaled(x)
    assert y.grad_fn.name() == "AddmmBackward0"
    assert torch.equal(saved(y, "mat1"), reference.mink(x.detach() * 2.0, 0.5))
    transposed = Transposed(8, 4)
    dropit.to_dropit(transposed, "mink", 0.5)
    assert transposed(x).grad_fn.name() == "AddmmBackward0"
    lin = nn.Linear(8, 4)
    dropit.to_dropit(lin, "mink", 0.5)
    y = lin(x.detach().clone().as_subclass(_Subclass).requires_grad_(True))
    assert y.grad_fn.name() == "AliasBackward0"  # the subclass's wrap of PyTorch's Linear
    assert y.grad_fn.next_functions[0][0].name() == "AddmmBackward0"
    assert torch.equal(saved(y, "mat1"), reference.mink(x.detach(), 0.5))
    lin.weight.requires_grad_(False)
    y = lin(x)
    assert y.grad_fn.name() in KERNEL_NODES and dropit.live_saved_bytes().sparse == 0
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(6, 4).mm(lin.weight))


def test_a_routed_linear_opens_the_hooks_only_around_a_pytorch_op(monkeypatch):
    # nn.Linear's forward is its F.linear call alone: on the kernel path no saved tensor passes
    # the Python pack hook (the C++ Linear's weight and payload need nothing from it), unless
    # PyTorch runs the op (a tensor subclass: the hook packs its input) or the forward is not
    # nn.Linear's (a subclass's or an instance's own: the hooks around all of it, as before).
    calls = []
    pack = dropit._hooks._Scope.pack
    monkeypatch.setattr(dropit._hooks._Scope, "pack", lambda self, t: calls.append(t) or pack(
        self, t))

    class Own(nn.Linear):
        def forward(self, x):
            return super().forward(x)

    x = torch.randn(6, 8, requires_grad=True)
    lin, own, patched = nn.Linear(8, 4), Own(8, 4), nn.Linear(8, 4)
    patched.forward = lambda x: F.linear(x, patched.weight, patched.bias)
    for layer in (lin, own, patched):
        dropit.to_dropit(layer, "mink", 0.5)
    y = lin(x)
    assert y.grad_fn.name() in KERNEL_NODES and not calls
    y.sum().backward()
    y = lin(x.detach().clone().as_subclass(_Subclass).requires_grad_(True))
    assert torch.equal(saved(y, "mat1"), reference.mink(x.detach(), 0.5)) and calls
    for layer in (own, patched):
        calls.clear()
        y = layer(x)
        assert y.grad_fn.name() in KERNEL_NODES and len(calls) == 2  # the weight, the payload
        assert torch.equal(y, F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("act", [F.relu, torch.tanh])
def test_what_a_linear_subclass_computes_after_its_matmul_stays_exact(path, act):
    # A Linear subclass that applies an activation to its output: the activation's saved tensor
    # derives from the input too, but through the matmul, so it is saved as PyTorch saves it. The
    # input and bias gradients stay exact, the weight gradient reads the sparsified input.
    class Activated(nn.Linear):
        def forward(self, x):
            return act(super().forward(x))

    layer = Activated(16, 24)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(10, 16, requires_grad=True)
    g = torch.randn(10, 24)
    y, gx, grads, _ = run(layer, x * 1, g)
    x0 = (x * 1).detach().requires_grad_(True)
    out0 = F.linear(x0, plain.weight, plain.bias)
    out0.retain_grad()
    act(out0).backward(g)
    assert torch.equal(y, act(out0).detach())
    assert torch.equal(gx, x0.grad)
    assert torch.equal(grads["bias"], out0.grad.sum(0))
    torch.testing.assert_close(grads["weight"], out0.grad.t().mm(reference.mink(x0.detach(), 0.9)))


@pytest.mark.parametrize("base", [nn.Linear, nn.Conv2d])
def test_dropout_after_a_first_layers_op_stays_exact(path, base):
    # A first layer (its input needs no gradient) whose subclass applies dropout to its output:
    # the noise has no autograd history, like a copy of the input would, but is saved after the
    # layer's op, so it is kept as it is. Bias gradient PyTorch's, weight gradient from the
    # sparsified input.
    class Dropped(base):
        def forward(self, x):
            return F.dropout(super().forward(x), 0.5, self.training)

    layer = Dropped(16, 16) if base is nn.Linear else Dropped(3, 4, 3)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(*((10, 16) if base is nn.Linear else (2, 3, 8, 8)))
    torch.manual_seed(3)
    y = layer(x)
    torch.manual_seed(3)
    out0 = F.linear(x, plain.weight, plain.bias) if base is nn.Linear else plain._conv_forward(
        x, plain.weight, plain.bias)
    out0.retain_grad()
    y0 = F.dropout(out0, 0.5, True)
    assert torch.equal(y, y0)
    g = torch.randn_like(y0)
    y.backward(g)
    y0.backward(g)
    assert torch.equal(layer.bias.grad, plain.bias.grad)
    if base is nn.Linear:
        torch.testing.assert_close(layer.weight.grad,
                                   out0.grad.t().mm(reference.mink(x, 0.9)))


@pytest.mark.parametrize("base", [nn.Linear, nn.Conv2d])
def test_an_activation_after_a_frozen_layers_op_stays_exact(path, base):
    # Weight and bias frozen (no parameter in the graph): the activation a subclass applies after
    # the matmul or convolution is still no input of it; the input gradient stays PyTorch's.
    class Activated(base):
        def forward(self, x):
            return torch.tanh(super().forward(x))

    layer = Activated(16, 24) if base is nn.Linear else Activated(3, 4, 3)
    layer.requires_grad_(False)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(*((10, 16) if base is nn.Linear else (2, 3, 8, 8)), requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x * 1), x, torch.ones(()).expand(layer(x).shape))
    (gx0,) = torch.autograd.grad(plain(x * 1), x, torch.ones(()).expand(plain(x).shape))
    assert torch.equal(gx, gx0)


def _squared_before(base):
    class Squared(base):  # the op reads x^2; pow saves x for the input gradient
        def forward(self, x):
            return super().forward(x.pow(2))

    return Squared


def _squared_beside(base):
    class Beside(base):  # the op reads x; pow saves x too, beside the op
        def forward(self, x):
            return super().forward(x) + x.pow(2).mean()

    return Beside


def _squared_conv_forward(base):
    class Squared(base):  # nn.Conv2d's forward, through a _conv_forward of its own
        def _conv_forward(self, input, weight, bias):
            return super()._conv_forward(input.pow(2), weight, bias)

    return Squared


@pytest.mark.parametrize("base,wrap", [
    (nn.Linear, _squared_before), (nn.Linear, _squared_beside), (nn.Conv2d, _squared_before),
    (nn.Conv2d, _squared_beside), (nn.Conv2d, _squared_conv_forward)],
    ids=["linear-before", "linear-beside", "conv-before", "conv-beside", "conv-conv_forward"])
def test_a_subclass_forward_that_uses_its_input_elsewhere_keeps_it_exact(path, base, wrap):
    # A subclass's own forward feeds its input to other ops than the matmul or convolution:
    # only what that op saves as its input is packed. The input gradient, which flows through
    # the other ops too, is PyTorch's bit for bit; the weight gradient reads the sparsified input
    # of the op (reference.mink, through PyTorch's own backward).
    layer = wrap(base)(16, 24) if base is nn.Linear else wrap(base)(3, 4, 3, padding=1)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(*((10, 16) if base is nn.Linear else (2, 3, 8, 8)), requires_grad=True)
    y, gx, grads, g = run(layer, x)
    y0, gx0, _, _ = run(plain, x, g)
    _same(y, y0)
    _same(gx, gx0)
    h = x.detach() if wrap is _squared_beside else x.detach().pow(2)
    w = plain.weight.detach().clone().requires_grad_(True)
    op = F.linear if base is nn.Linear else functools.partial(F.conv2d, padding=1)
    op(reference.mink(h, 0.9), w).backward(g)
    torch.testing.assert_close(grads["weight"], w.grad, **TOL[torch.float32])


def test_an_op_whose_weight_is_no_parameter_keeps_its_operands():
    # F.linear(x, x) inside a Linear subclass: both operands derive from the input and feed the
    # input gradient, so neither is packed; the layer's own F.linear(x, W) input is.
    class Gram(nn.Linear):
        def forward(self, x):
            return F.linear(x, self.weight, self.bias) + F.linear(x, x).sum(-1, keepdim=True)

    layer = Gram(16, 16)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(10, 16, requires_grad=True)
    y, gx, grads, g = run(layer, x)
    y0, gx0, grads0, _ = run(plain, x, g)
    _same(gx, gx0)
    torch.testing.assert_close(grads["weight"], g.t().mm(reference.mink(x.detach(), 0.9)),
                               **TOL[torch.float32])
    assert not torch.allclose(grads["weight"], grads0["weight"])  # the policy did apply


def test_a_subclass_forward_under_autocast_packs_the_ops_copy(path):
    # Under autocast the op saves its bf16 copy of x^2, made inside the call: that copy is
    # packed, the x that pow saves is not (input gradient as PyTorch's).
    if not dropit._C.has_half:
        pytest.skip("this build has no 16-bit types")
    layer = _squared_before(nn.Linear)(16, 24)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(10, 16, requires_grad=True)
    with torch.autocast("cpu"):
        y = layer(x)
        y0 = plain(x)
        assert dropit.live_saved_bytes().sparse > 0
    g = torch.randn_like(y)
    _same(y, y0)
    (gx,) = torch.autograd.grad(y, x, g)
    (gx0,) = torch.autograd.grad(y0, x, g)
    _same(gx, gx0)


# One layer of each kind to_dropit hooks (a mask, the pooling codes, a 1-bit LeakyReLU, a packed
# convolution input, dropit's C++ Linear), built for a (2, 3, 8, 8) input.
_ON_EACH_HOOKED_KIND = pytest.mark.parametrize(
    "make", [nn.ReLU, lambda: nn.MaxPool2d(2), lambda: nn.LeakyReLU(0.1),
             lambda: nn.Conv2d(3, 3, 3, padding=1), lambda: nn.Linear(8, 8)],
    ids=["relu", "maxpool", "leaky", "conv2d", "linear"])


@_ON_EACH_HOOKED_KIND
def test_user_forward_hooks_run_outside_the_layers_scope(make):
    # A forward hook registered before to_dropit that computes with the layer's input and output:
    # PyTorch runs a module's forward hooks in order, and dropit's, which closes the layer's
    # scope, is put first, so what the hook's product saves stays exact (before, a ReLU's input
    # became a mask there). The layer still packs what its own op saves.
    layer = make()
    plain = copy.deepcopy(layer)

    def hook(module, inputs, out):
        return out * inputs[0].mean() + inputs[0].pow(2).sum()

    layer.register_forward_hook(hook)
    plain.register_forward_hook(hook)
    dropit.to_dropit(layer, "mink", 0.9)
    _check_input_gradient_as_plain(layer, plain)


def _check_input_gradient_as_plain(layer, plain):
    """One call of layer and of plain (the same module without dropit) on a (2, 3, 8, 8) input:
    the same output and input gradient (a Linear's / Conv2d's too: only its weight gradient reads
    the sparsified x), and the layer packed something."""
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y, y0 = layer(x), plain(x)
    held = dropit.live_saved_bytes().total
    g = torch.randn_like(y0)
    (gx,) = torch.autograd.grad(y, x, g)
    (gx0,) = torch.autograd.grad(y0, x, g)
    _same(y, y0)
    _same(gx, gx0)
    assert held > 0


@_ON_EACH_HOOKED_KIND
@pytest.mark.parametrize("before", [True, False], ids=["hook-first", "dropit-first"])
def test_global_forward_hooks_run_outside_the_layers_scope(make, before):
    # PyTorch runs its global forward hooks (register_module_forward_hook) before a module's own,
    # so before dropit's closes the layer's scope: dropit then registers a global closer of its
    # own, first, and removes it once no other global hook is left. Before, what this hook's
    # product saved became a ReLU mask or was packed (input gradients off by about 100).
    # Oracle: the same layer and hook, plain.
    layer = make()
    plain = copy.deepcopy(layer)

    def hook(module, inputs, out):
        return out * inputs[0].mean() + inputs[0].pow(2).sum() if module in (layer, plain) else None

    handles = []
    if before:
        handles.append(torch.nn.modules.module.register_module_forward_hook(hook))
    dropit.to_dropit(layer, "mink", 0.9)
    if not before:
        handles.append(torch.nn.modules.module.register_module_forward_hook(hook))
    try:
        for _ in range(2):
            _check_input_gradient_as_plain(layer, plain)
    finally:
        for h in handles:
            h.remove()
    layer(torch.randn(2, 3, 8, 8, requires_grad=True))
    assert not torch.nn.modules.module._global_forward_hooks


def test_a_pre_hook_registered_after_to_dropit_runs_outside_the_scope():
    # A pre-hook registered after to_dropit runs after dropit's, which would open the layer's
    # scope before it: dropit's then moves last, and that first call runs as PyTorch runs it.
    # From the next call on the scope opens after the user's pre-hook, whose product (a learned
    # input scale) keeps its saved input exact. Oracle: the same layer and hook, plain.
    conv = nn.Conv2d(3, 4, 3, padding=1)
    plain = copy.deepcopy(conv)
    dropit.to_dropit(conv, "mink", 0.9)
    scale = nn.Parameter(torch.tensor(1.5))
    for layer in (conv, plain):
        layer.register_forward_pre_hook(lambda module, args: (args[0] * scale,))
    for call in range(3):
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        y = conv(x)
        packed = dropit.live_saved_bytes().sparse
        g = torch.randn_like(y)
        gx, gs = torch.autograd.grad(y, (x, scale), g)
        gx0, gs0 = torch.autograd.grad(plain(x), (x, scale), g)
        _same(gx, gx0)
        _same(gs, gs0)
        assert (packed > 0) == (call > 0)


def test_a_linear_forward_that_raises_routes_nothing_after_it():
    # The Linear layer's mode stays entered after its forward raised (the next hooked forward
    # closes it); meanwhile the same call outside any dropit layer is PyTorch's own.
    class Failing(nn.Linear):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("boom")

    lin = Failing(8, 4)
    dropit.to_dropit(lin, "mink", 0.9)
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="boom"):
        lin(x)
    assert torch.overrides._len_torch_function_stack() == 1  # left by the failed forward
    assert F.linear(x, lin.weight, lin.bias).grad_fn.name() == "AddmmBackward0"
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        lin(torch.randn(3, 5, requires_grad=True))  # PyTorch's own error through the C++ layer
    plain = nn.Linear(8, 4)
    dropit.to_dropit(plain, "mink", 0.9)
    assert plain(x).grad_fn.name() in KERNEL_NODES  # the next hooked forward closes the mode
    assert torch.overrides._len_torch_function_stack() == 0


# ---- Conv2d ----------------------------------------------------------------------------------

CONV_CASES = [
    ("plain", dict(kernel_size=3)),
    ("stride", dict(kernel_size=3, stride=2)),
    ("padding", dict(kernel_size=3, padding=1)),
    ("padding-2x1", dict(kernel_size=(3, 5), padding=(1, 2))),
    ("same-odd", dict(kernel_size=3, padding="same")),
    ("same-even", dict(kernel_size=4, padding="same")),
    ("same-dilated", dict(kernel_size=(2, 3), padding="same", dilation=(3, 1))),
    ("reflect", dict(kernel_size=3, padding=1, padding_mode="reflect")),
    ("replicate", dict(kernel_size=3, padding=2, padding_mode="replicate")),
    ("circular", dict(kernel_size=3, padding=1, padding_mode="circular")),
    ("dilation", dict(kernel_size=3, dilation=2, padding=2)),
    ("groups", dict(kernel_size=3, groups=2, padding=1)),
    ("depthwise", dict(kernel_size=3, groups=4, padding=1, bias=False)),
]


CONV_NODE = "torch::autograd::CppNode<dropit::torch::detail::conv_fn>"


def conv_routes(conv):
    """Whether a low_memory Conv2d runs dropit's C++ convolution: its own input, padded with
    zeros on both sides alike (an odd padding="same" pads one side more: PyTorch's conv runs)."""
    if conv.padding_mode != "zeros":
        return False
    if conv.padding == "same":
        return all(d * (k - 1) % 2 == 0 for d, k in zip(conv.dilation, conv.kernel_size))
    return True


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # PyTorch's own
@pytest.mark.parametrize("name,kw", CONV_CASES, ids=[c[0] for c in CONV_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("x_grad", [True, False])
@pytest.mark.parametrize("low_memory", [False, True])
def test_conv2d(name, kw, dtype, x_grad, low_memory):
    conv = nn.Conv2d(4, 8, **kw).to(dtype)
    plain = copy.deepcopy(conv)
    x = torch.randn(3, 4, 11, 13, dtype=dtype).requires_grad_(x_grad)
    y0, gx0, grads0, g = run(plain, x)
    dropit.to_dropit(conv, "mink", 0.9, low_memory=low_memory)
    x1 = x.detach().clone().requires_grad_(x_grad)
    y = conv(x1)
    assert torch.equal(y, y0)
    x_saved, padding = reference.conv_input(conv, x1.detach())
    kernel = low_memory and conv_routes(conv)
    assert (y.grad_fn.name() == CONV_NODE) == kernel
    if not kernel:
        assert torch.equal(saved(y, "input"), reference.mink(x_saved, 0.9))
        assert saved(y, "weight").data_ptr() == conv.weight.data_ptr()
    if conv.padding_mode in ("reflect", "replicate") and x_grad:
        # The padding op's backward reads x's shape only: x is saved as a shape.
        assert saved(y, "self").stride() == (0, 0, 0, 0)
    y.backward(g)
    if x_grad:
        torch.testing.assert_close(x1.grad, gx0, rtol=0, atol=0)
    if conv.bias is not None:  # the C++ convolution sums the output gradient itself
        torch.testing.assert_close(conv.bias.grad, grads0["bias"],
                                   **(TOL[dtype] if kernel else dict(rtol=0, atol=0)))
    want = reference.conv_weight_grad(conv, reference.mink(x_saved, 0.9), padding, g)
    torch.testing.assert_close(conv.weight.grad, want, **TOL[dtype])


# ---- the other convolutions (hook path) ----------------------------------------------------

OTHER_CONV_CASES = [
    ("conv1d", lambda: nn.Conv1d(3, 5, 3, padding=1), (4, 3, 20)),
    ("conv1d-reflect-dilated", lambda: nn.Conv1d(3, 5, 3, padding=2, dilation=2,
                                                 padding_mode="reflect"), (4, 3, 20)),
    ("conv1d-unbatched-stride", lambda: nn.Conv1d(3, 5, 3, stride=2), (3, 20)),
    ("conv3d-groups", lambda: nn.Conv3d(2, 4, 3, padding=1, groups=2), (2, 2, 6, 5, 6)),
    ("conv-transpose1d", lambda: nn.ConvTranspose1d(3, 4, 3, stride=2, output_padding=1),
     (4, 3, 10)),
    ("conv-transpose2d", lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, dilation=2),
     (2, 3, 7, 8)),
    ("conv-transpose3d-nobias", lambda: nn.ConvTranspose3d(2, 2, 2, stride=2, bias=False),
     (2, 2, 3, 4, 3)),
]


@pytest.mark.parametrize("name,make,shape", OTHER_CONV_CASES, ids=[c[0] for c in OTHER_CONV_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("x_grad", [True, False])
def test_other_convolutions_save_the_sparsified_input(name, make, shape, dtype, x_grad):
    # Conv1d/3d and the transposed convolutions save their input for the weight gradient only:
    # packed through the hooks; the oracle is PyTorch's weight gradient of the same layer on
    # reference.mink of the tensor the convolution reads (the padded copy for a padding mode).
    torch.manual_seed(2)
    conv = make().to(dtype)
    plain = copy.deepcopy(conv)
    x = torch.randn(shape, dtype=dtype).requires_grad_(x_grad)
    y0, gx0, grads0, g = run(plain, x)
    handle = dropit.to_dropit(conv, "mink", 0.9)
    assert handle.layers == [("", "weight")]
    x1 = x.detach().clone().requires_grad_(x_grad)
    y = conv(x1)
    assert torch.equal(y, y0)
    assert dropit.live_saved_bytes().sparse > 0
    y.backward(g)
    if x_grad:
        assert torch.equal(x1.grad, gx0)
    if conv.bias is not None:
        assert torch.equal(conv.bias.grad, grads0["bias"])
    oracle = copy.deepcopy(plain)
    if conv.padding_mode != "zeros":
        xp = F.pad(x.detach(), oracle._reversed_padding_repeated_twice, mode=conv.padding_mode)
        ys = F.conv1d(reference.mink(xp, 0.9), oracle.weight, oracle.bias, oracle.stride, 0,
                      oracle.dilation, oracle.groups)
    else:
        ys = oracle(reference.mink(x.detach(), 0.9))
    (want,) = torch.autograd.grad(ys, oracle.weight, g)
    torch.testing.assert_close(conv.weight.grad, want, **TOL[dtype])
    # gamma 0: PyTorch's gradients bit for bit
    handle.remove()
    conv.zero_grad(set_to_none=True)
    with dropit.to_dropit(conv, "mink", 0.0):
        _, gx, grads, _ = run(conv, x, g)
    assert all(torch.equal(grads[k], grads0[k]) for k in grads0)


def test_low_memory_conv2d_runs_in_pieces():
    # Forward and backward a few samples at a time: each piece rebuilds its part of the input.
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, dilation=1, groups=1).double()
    plain = copy.deepcopy(conv)
    x = torch.randn(9, 3, 12, 10, dtype=torch.float64)
    y0, gx0, grads0, g = run(plain, x.requires_grad_(True))
    dropit.to_dropit(conv, "mink", 0.9, low_memory=True)
    x1 = x.detach().clone().requires_grad_(True)
    old = dropit._C._chunk_bytes()
    dropit._C._set_chunk_bytes(2 * 3 * 12 * 10 * 8)  # two samples of input per piece
    try:
        y = conv(x1)
        assert y.grad_fn.name() == CONV_NODE
        y.backward(g)
    finally:
        dropit._C._set_chunk_bytes(old)
    tol = TOL[torch.float64]
    torch.testing.assert_close(y, y0, **tol)
    torch.testing.assert_close(x1.grad, gx0, **tol)
    torch.testing.assert_close(conv.bias.grad, grads0["bias"], **tol)
    x_saved, padding = reference.conv_input(conv, x.detach())
    want = reference.conv_weight_grad(conv, reference.mink(x_saved, 0.9), padding, g)
    torch.testing.assert_close(conv.weight.grad, want, **tol)


def test_low_memory_conv2d_backward_never_holds_the_whole_input():
    # 8 MiB of input: the hook path's backward restores it whole (and LibTorch's convolution
    # backward takes its workspace for the whole batch), the C++ convolution goes in 1 MiB pieces.
    peaks = {}
    for low_memory in (True, False):
        torch.manual_seed(0)
        conv = nn.Conv2d(8, 8, 3, padding=1)
        dropit.to_dropit(conv, "mink", 0.9, low_memory=low_memory)
        x = torch.randn(128, 8, 32, 64, requires_grad=True)
        y = conv(x)
        assert (y.grad_fn.name() == CONV_NODE) == low_memory
        g = torch.randn_like(y)
        with dropit.memory_counter() as counter:
            start = counter.current_bytes
            y.backward(g)
            peaks[low_memory] = counter.peak_bytes - start
    x_bytes = 128 * 8 * 32 * 64 * 4
    assert peaks[True] + 0.75 * x_bytes <= peaks[False]


@pytest.mark.parametrize("kw", [dict(codec="int8"), dict(strategy="random", seed=3),
                                dict(codec="fp8", positions="no_elias_fano"),
                                dict(layer_gamma={"": 0.5})], ids=["int8", "random", "fp8", "gamma"])
def test_low_memory_conv2d_reads_what_the_hook_path_reads(kw):
    # Codecs, Random's per-step seeds and per-layer gamma reach the C++ convolution: the weight
    # gradient equals the hook path's (one piece: the same convolution backward on the same bytes).
    conv = nn.Conv2d(4, 8, 3, padding=1).double()
    hooks, pieces = copy.deepcopy(conv), copy.deepcopy(conv)
    dropit.to_dropit(hooks, **kw)
    dropit.to_dropit(pieces, low_memory=True, **kw)
    x = torch.randn(6, 4, 9, 9, dtype=torch.float64)
    for _ in range(2):  # Random: a second step draws new positions on both paths alike
        y0, y = hooks(x), pieces(x)
        assert y.grad_fn.name() == CONV_NODE and y0.grad_fn.name() != CONV_NODE
        g = torch.randn_like(y)
        y0.backward(g)
        y.backward(g)
        assert torch.equal(pieces.weight.grad, hooks.weight.grad)
        hooks.zero_grad(set_to_none=True)
        pieces.zero_grad(set_to_none=True)


def test_low_memory_conv2d_takes_channels_last_and_unbatched_inputs():
    conv = nn.Conv2d(4, 8, 3, padding=1).double()
    hooks, pieces = copy.deepcopy(conv), copy.deepcopy(conv)
    dropit.to_dropit(hooks, "mink", 0.8)
    dropit.to_dropit(pieces, "mink", 0.8, low_memory=True)
    nhwc = torch.randn(2, 4, 9, 9, dtype=torch.float64).to(memory_format=torch.channels_last)
    for x in (nhwc, torch.randn(4, 9, 9, dtype=torch.float64)):
        x0, x1 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y0, y = hooks(x0), pieces(x1)
        node = y.grad_fn
        if x.dim() == 3:  # unbatched: a squeeze of the batched call
            node = node.next_functions[0][0]
        assert node.name() == CONV_NODE
        assert torch.equal(y, y0)
        g = torch.randn_like(y)
        y0.backward(g)
        y.backward(g)
        assert torch.equal(pieces.weight.grad, hooks.weight.grad)  # packed in the same order
        assert torch.equal(x1.grad, x0.grad)
        hooks.zero_grad(set_to_none=True)
        pieces.zero_grad(set_to_none=True)


def test_low_memory_leaves_what_the_kernel_does_not_take_to_pytorch():
    conv = nn.Conv2d(4, 8, 3, padding=1)
    dropit.to_dropit(conv, "mink", 0.9, low_memory=True)
    with torch.no_grad():
        assert conv(torch.randn(2, 4, 9, 9)).grad_fn is None
    y = conv(torch.randn(2, 4, 9, 9, requires_grad=True))
    assert y.grad_fn.name() == CONV_NODE
    with pytest.raises(RuntimeError):  # PyTorch's own error for a 5-d input
        conv(torch.randn(1, 2, 4, 9, 9, requires_grad=True))
    lossless = nn.Conv2d(4, 8, 3)
    dropit.to_dropit(lossless, "mink", 0.0, low_memory=True)  # gamma 0: PyTorch's backward
    assert lossless(torch.randn(2, 4, 9, 9, requires_grad=True)).grad_fn.name() != CONV_NODE
    assert torch.overrides._len_torch_function_stack() == 0


def test_conv2d_channels_last_and_unbatched():
    conv = nn.Conv2d(4, 8, 3, padding=1)
    dropit.to_dropit(conv, "mink", 0.8)
    x = torch.randn(2, 4, 9, 9).to(memory_format=torch.channels_last)
    y = conv(x)
    s = saved(y, "input")
    # Packed in memory order, restored with x's strides.
    assert s.stride() == x.stride()
    nhwc = x.permute(0, 2, 3, 1)
    assert torch.equal(s.permute(0, 2, 3, 1), reference.mink(nhwc.contiguous(), 0.8))
    x3 = torch.randn(4, 9, 9)
    y3 = conv(x3)
    assert y3.shape == (8, 9, 9)
    assert torch.equal(saved(y3, "input").reshape(x3.shape), reference.mink(x3, 0.8))


# ---- bf16 models and autocast ------------------------------------------------------------------

needs_half = pytest.mark.skipif(not dropit._C.has_half,
                                reason="bfloat16 packs need the CUDA toolkit's cuda_bf16.h")


@needs_half
@pytest.mark.parametrize("make,shape", [(lambda: nn.Linear(24, 10), (16, 24)),
                                        (lambda: nn.Linear(24, 10), (2, 8, 24)),
                                        (lambda: nn.Conv2d(3, 6, 3, padding=1), (2, 3, 9, 9)),
                                        (lambda: Conv1D(10, 24), (2, 8, 24))])
@pytest.mark.parametrize("x_grad", [True, False])
def test_autocast_cpu(make, shape, x_grad):
    layer = make()
    plain = copy.deepcopy(layer)
    x = torch.randn(shape).requires_grad_(x_grad)
    with torch.autocast("cpu"):
        y0 = plain(x)
    g = torch.randn_like(y0)
    y0.backward(g)
    dropit.to_dropit(layer, "mink", 0.9)
    x1 = x.detach().clone().requires_grad_(x_grad)
    with torch.autocast("cpu"):
        y = layer(x1)
    assert y.dtype == torch.bfloat16 and torch.equal(y, y0)
    xb = x1.detach().to(torch.bfloat16)
    s = saved_input(y)
    if isinstance(layer, nn.Conv2d):
        assert torch.equal(s, reference.mink(xb, 0.9))
        w_saved = saved(y, "weight")
    else:
        assert torch.equal(s, reference.mink(xb.reshape(-1, shape[-1]), 0.9))
        w_saved = saved(y, "mat2")
    # The weight's autocast copy is saved as it is (exact input gradient), when it is saved.
    wb = layer.weight.detach().to(torch.bfloat16)
    if x_grad:
        assert torch.equal(w_saved, wb.t() if isinstance(layer, nn.Linear) else wb)
    y.backward(g)
    if x_grad:
        assert torch.equal(x1.grad, x.grad)
    assert torch.equal(layer.bias.grad, plain.bias.grad)
    assert not torch.equal(layer.weight.grad, plain.weight.grad)


@needs_half
def test_autocast_frozen_weight_stays_exact():
    layer = nn.Linear(16, 8)
    layer.weight.requires_grad_(False)
    plain = copy.deepcopy(layer)
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(8, 16, requires_grad=True)
    x1 = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu"):
        plain(x).float().sum().backward()
        layer(x1).float().sum().backward()
    assert torch.equal(x1.grad, x.grad)
    assert dropit.live_saved_bytes().sparse == 0


# ---- whole models: gamma 0 is plain PyTorch, bit for bit -----------------------------------------


@pytest.mark.parametrize("model", ["cnn", "vit"])
@pytest.mark.parametrize("inplace", [False, True])
def test_gamma_zero_is_bit_identical(model, inplace):
    import fmnist

    net = fmnist.make_model(model)
    if inplace:
        for m in net.modules():
            if isinstance(m, nn.ReLU):
                m.inplace = True
    plain = copy.deepcopy(net)
    x, labels = torch.randn(16, 1, 28, 28, requires_grad=True), torch.randint(0, 10, (16,))
    x1 = x.detach().clone().requires_grad_(True)
    F.cross_entropy(plain(x), labels).backward()
    handle = dropit.to_dropit(net, "mink", 0.0)
    assert {k for _, k in handle.layers} == {"weight", "relu"} | ({"pool"} if model == "cnn" else set())
    loss = F.cross_entropy(net(x1), labels)
    assert dropit.live_saved_bytes().total > 0
    loss.backward()
    assert dropit.live_saved_bytes().total == 0
    assert torch.equal(x1.grad, x.grad)
    for (n, a), b in zip(net.named_parameters(), plain.parameters()):
        assert torch.equal(a.grad, b.grad), n


# ---- Random --------------------------------------------------------------------------------


def test_random_is_reproducible_per_seed_and_fresh_per_step(path):
    def two_steps(seed):
        torch.manual_seed(1)
        lin = nn.Linear(32, 16)
        dropit.to_dropit(lin, "random", 0.75, seed=seed)
        x = torch.randn(8, 32) + 3.0  # no zeros: the kept positions are the non-zeros
        kept, grads = [], []
        for _ in range(2):
            y = lin(x)
            kept.append(input_seen(lin, y) != 0)
            y.sum().backward()
            grads.append(lin.weight.grad.clone())
            lin.zero_grad()
        return kept, grads

    (a1, a2), ga = two_steps(5)
    (b1, b2), gb = two_steps(5)
    (c1, _), _ = two_steps(6)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert all(torch.equal(p, q) for p, q in zip(ga, gb))
    assert a1.sum() == reference.kept_count(8 * 32, 0.75)
    assert not torch.equal(a1, a2)  # fresh positions at every step
    assert not torch.equal(a1, c1)  # another seed, other positions


def test_random_positions_follow_the_documented_seed(path):
    net = nn.Sequential(nn.Linear(40, 8), nn.Linear(8, 8), nn.Linear(8, 3))
    dropit.to_dropit(net, "random", 0.9, seed=11)
    x = torch.randn(10, 40) + 4.0
    for step in (1, 2, 3):
        h = net[0](x)
        want = reference.random_select(x, 0.9, reference.layer_seed(11, 0, step))
        assert torch.equal(input_seen(net[0], h), want)
        h2 = net[1](h.detach() + 5.0)
        want2 = reference.random_select(h.detach() + 5.0, 0.9, reference.layer_seed(11, 1, step))
        assert torch.equal(input_seen(net[1], h2), want2)


# ---- masks: ReLU and MaxPool2d ---------------------------------------------------------------

POOL_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=2, stride=1),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(2, 1), dilation=(2, 1)),
    dict(kernel_size=2, ceil_mode=True),
]


# The autograd node of dropit's C++ max pooling (include/dropit/detail/torch/functional.inl).
POOL_NODE = "torch::autograd::CppNode<dropit::torch::detail::max_pool2d_fn>"


def _code_bytes(y, kernel):
    """Bytes of the window codes dropit's pooling keeps for output y: one code per output of
    the fewest bits that hold kh * kw positions, rounded up to a power of two, in 32-bit words."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    bits = 1
    while (1 << bits) < kh * kw:
        bits += 1
    while bits & (bits - 1):
        bits += 1
    return (y.numel() * bits + 31) // 32 * 4


def _pool_input(layout, dtype=torch.float32):
    x = torch.randn(2, 3, 13, 15).to(dtype)
    x[0, 0, :4, :4] = 1.0  # ties: the first maximum in scan order wins, as in PyTorch
    x[1, 2, 5, 5] = float("nan")  # a NaN is the maximum of every window it is in
    x[1, 1, 7, :] = float("-inf")
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    if layout == "unbatched":
        x = x[0]
    return x


def _same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kw", POOL_CASES, ids=[str(c) for c in POOL_CASES])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "unbatched"])
def test_max_pool_is_exact_and_saves_codes(kw, layout):
    # A contiguous input runs through dropit's kernel: no dense input, no int64 indices, only
    # the window codes. A channels_last one runs in PyTorch, its indices packed as codes.
    pool = nn.MaxPool2d(**kw)
    dropit.to_dropit(pool, "mink", 0.9)
    x = _pool_input(layout).requires_grad_(True)
    plain_x = x.detach().clone().requires_grad_(True)
    y0, i0 = F.max_pool2d(plain_x, return_indices=True, **kw)
    y = pool(x)
    _same(y, y0)
    if layout == "channels_last":
        assert y.grad_fn.name() == "MaxPool2DWithIndicesBackward0"
        assert torch.equal(saved(y, "result1"), i0)
    else:
        assert y.grad_fn.name() == POOL_NODE
    assert dropit.live_saved_bytes().masks == _code_bytes(y, kw["kernel_size"])
    g = torch.randn_like(y0)
    y0.backward(g)
    y.backward(g)
    _same(x.grad, plain_x.grad)
    assert dropit.live_saved_bytes().masks == 0


@pytest.mark.parametrize("dtype", DTYPES + ([torch.float16] if dropit._C.has_half else []))
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1)],
                         ids=["2x2", "3x3s1p1"])
def test_max_pool_kernel_matches_pytorch_in_every_dtype(dtype, kw):
    pool = nn.MaxPool2d(**kw)
    dropit.to_dropit(pool)
    x = _pool_input("nchw", dtype).requires_grad_(True)
    # PyTorch 1.13 has no float16 max pooling on the CPU: the oracle pools the same values in
    # float32 (a maximum is exact in any precision, and so is a 2x2 pooling's gradient; an
    # overlapping window's sums round once per addition in float16).
    wide = dtype == torch.float16
    x0 = x.detach().clone().to(torch.float32 if wide else dtype).requires_grad_(True)
    y, y0 = pool(x), F.max_pool2d(x0, **kw)
    assert y.grad_fn.name() == POOL_NODE
    assert y.dtype == dtype
    _same(y, y0.to(dtype))
    g = torch.randn(y0.shape).to(dtype)
    y.backward(g)
    y0.backward(g.to(y0.dtype))
    if wide and kw["kernel_size"] != 2:
        torch.testing.assert_close(x.grad, x0.grad.to(dtype), rtol=0, atol=1e-2, equal_nan=True)
    else:
        _same(x.grad, x0.grad.to(dtype))


def test_max_pool_double_backward_matches_pytorch():
    # create_graph=True: the kernel's backward is then PyTorch's differentiable one, fed with
    # the indices the codes decode to (a gradient penalty through a pooled network).
    pool = nn.MaxPool2d(3, stride=2, padding=1)
    dropit.to_dropit(pool)
    x = _pool_input("nchw").requires_grad_(True)
    with torch.no_grad():
        x.nan_to_num_(0.0)
    w = torch.randn(2, 3, 7, 8)
    outs = []
    for run in (lambda t: pool(t), lambda t: F.max_pool2d(t, 3, stride=2, padding=1)):
        xi = x.detach().clone().requires_grad_(True)
        y = run(xi * 1.5)
        # The incoming gradient 2 y w depends on x: the second backward runs through the first.
        (gx,) = torch.autograd.grad((y * y * w).sum(), xi, create_graph=True)
        (ggx,) = torch.autograd.grad((gx * gx).sum() + (gx * xi).sum(), xi)
        outs.append((y.grad_fn.name(), gx.detach(), ggx))
    assert outs[0][0] == POOL_NODE and outs[1][0] != POOL_NODE
    _same(outs[0][1], outs[1][1])
    _same(outs[0][2], outs[1][2])


def test_max_pool_leaves_what_the_kernel_does_not_take_to_pytorch():
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    # return_indices: PyTorch's pooling, the indices packed as codes.
    pool = nn.MaxPool2d(2, return_indices=True)
    dropit.to_dropit(pool)
    y, idx = pool(x)
    y0, idx0 = F.max_pool2d(x, 2, return_indices=True)
    assert y.grad_fn.name() == "MaxPool2DWithIndicesBackward0"
    _same(y, y0)
    assert torch.equal(idx, idx0)
    del y, idx
    # Eval mode, no_grad and an input that needs no gradient: plain PyTorch, nothing saved.
    pool = nn.MaxPool2d(2)
    dropit.to_dropit(pool)
    with torch.no_grad():
        _same(pool(x), F.max_pool2d(x, 2))
    _same(pool(x.detach()), F.max_pool2d(x.detach(), 2))
    pool.eval()
    y = pool(x)
    assert y.grad_fn.name() == "MaxPool2DWithIndicesBackward0"
    assert dropit.live_saved_bytes().masks == 0


def test_max_pool_subclass_and_other_ops_in_its_forward():
    # The mode routes only max_pool2d; the other ops of a forward run as they are.
    class ScaledPool(nn.MaxPool2d):
        def forward(self, x):
            return F.max_pool2d(x * 2.0, self.kernel_size, self.stride, self.padding) - 1.0

    pool = ScaledPool(3, stride=2, padding=1)
    dropit.to_dropit(pool)
    x = torch.randn(2, 4, 11, 9, requires_grad=True)
    x0 = x.detach().clone().requires_grad_(True)
    y, y0 = pool(x), F.max_pool2d(x0 * 2.0, 3, 2, 1) - 1.0
    _same(y, y0)
    assert y.grad_fn.next_functions[0][0].name() == POOL_NODE
    y.sum().backward()
    y0.sum().backward()
    _same(x.grad, x0.grad)
    assert torch.overrides._len_torch_function_stack() == 0  # the mode is left


class _ReLUSquared(nn.ReLU):
    def forward(self, x):
        y = super().forward(x)  # PyTorch's relu saves y; so does the product
        return y * y


class _Swish(nn.ReLU):
    def forward(self, x):
        return x * torch.sigmoid(x)  # no relu at all: x and sigmoid(x) of x's shape saved


class _PoolOfSquare(nn.MaxPool2d):
    def forward(self, x):
        return super().forward(x * x)  # the product saves x, of the pooling's input shape


class _AvgOfSquare(nn.AvgPool2d):
    def forward(self, x):
        return super().forward(x * x)


@pytest.mark.parametrize("cls", [_ReLUSquared, _Swish, gated(nn.LeakyReLU), gated(nn.ReLU6),
                                 _PoolOfSquare, _AvgOfSquare], ids=lambda c: c.__name__)
def test_a_mask_layer_subclass_with_its_own_forward_stays_exact(cls):
    # A ReLU / LeakyReLU / ReLU6 / pooling subclass whose own forward saves tensors of its
    # input's shape for other ops: none becomes a mask or a shape (those stand for what the
    # layer's own op reads). Its F.relu / F.max_pool2d calls still go to dropit's kernels, whose
    # backward is their own, so output and input gradient are PyTorch's bit for bit.
    pooling = issubclass(cls, (nn.MaxPool2d, nn.AvgPool2d))
    layer, plain = (cls(2), cls(2)) if pooling else (cls(), cls())
    dropit.to_dropit(layer)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y, gx, _, g = run(layer, x)
    y0, gx0, _, _ = run(plain, x, g)
    _same(y, y0)
    _same(gx, gx0)
    if cls in (_ReLUSquared, _PoolOfSquare):  # the layer's own op ran in dropit's kernel
        x1 = x.detach().clone().requires_grad_(True)
        node = layer(x1).grad_fn  # the pooling's; the product's, whose first input is the ReLU's
        node = node if cls is _PoolOfSquare else node.next_functions[0][0]
        assert node.name() == (POOL_NODE if cls is _PoolOfSquare else RELU_NODE[False])


def test_max_pool_indices_of_another_window_are_kept_as_they_are():
    # A forward that pools with other arguments than the module's, asking for the indices (so
    # PyTorch pools): they are not positions in the module's window and are saved as they are.
    class OtherWindow(nn.MaxPool2d):
        def forward(self, x):
            return F.max_pool2d(x, 3, 1, 1, return_indices=True)[0]

    pool = OtherWindow(2)
    dropit.to_dropit(pool)
    x = torch.randn(2, 3, 8, 9, requires_grad=True)
    x0 = x.detach().clone().requires_grad_(True)
    y, y0 = pool(x), F.max_pool2d(x0, 3, 1, 1)
    _same(y, y0)
    assert torch.equal(saved(y, "result1"), F.max_pool2d(x0, 3, 1, 1, return_indices=True)[1])
    y.sum().backward()
    y0.sum().backward()
    _same(x.grad, x0.grad)


def test_max_pool_error_is_pytorchs_and_leaves_no_mode_behind():
    pool = nn.MaxPool2d(4)
    dropit.to_dropit(pool)
    with pytest.raises(RuntimeError, match="too small"):
        pool(torch.randn(1, 1, 2, 2, requires_grad=True))
    # The forward raised before its hook ran; the next hooked forward closes what it left.
    x = torch.randn(1, 2, 8, 8, requires_grad=True)
    _same(pool(x), F.max_pool2d(x, 4))
    assert torch.overrides._len_torch_function_stack() == 0


def test_remove_after_a_forward_that_raised_leaves_nothing_open():
    # No hooked forward follows: remove() closes what the failed forward left (the pooling mode,
    # the saved-tensor hooks), so the program goes on as plain PyTorch.
    pool = nn.MaxPool2d(4)
    handle = dropit.to_dropit(pool)
    with pytest.raises(RuntimeError, match="too small"):
        pool(torch.randn(1, 1, 2, 2, requires_grad=True))
    assert torch.overrides._len_torch_function_stack() == 1  # left open by the failed forward
    handle.remove()
    assert torch.overrides._len_torch_function_stack() == 0
    assert not dropit._hooks._stack()
    x = torch.randn(1, 2, 8, 8, requires_grad=True)
    y = pool(x)
    assert y.grad_fn.name() == "MaxPool2DWithIndicesBackward0"  # PyTorch's own pooling
    assert torch.equal(saved(y, "self"), x)  # and its input saved as PyTorch saves it


# dropit's mask ReLU, in place or not (the in-place one marks its input dirty)
RELU_NODE = dict.fromkeys(
    (False, True), "torch::autograd::CppNode<dropit::torch::detail::clamp_mask_fn>")


class _Subclass(torch.Tensor):
    """A tensor subclass: dropit's ReLU kernel leaves it to PyTorch (the saved-tensor path)."""


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_is_exact_and_saves_a_mask(inplace, dtype):
    lin = nn.Linear(16, 64).to(dtype)
    relu = nn.ReLU(inplace=inplace)
    dropit.to_dropit(relu, "mink", 0.9)
    x = torch.randn(33, 16, dtype=dtype, requires_grad=True)
    h = lin(x)
    h.data[0, :5] = 0.0  # relu's gradient at 0 is 0
    h.data[1, 0] = float("nan")  # NaN passes the gradient
    x0 = x.detach().clone().requires_grad_(True)
    h0 = lin(x0)
    h0.data.copy_(h.data)
    y0 = F.relu(h0)
    y = relu(h)
    assert torch.equal(y.nan_to_num(), y0.nan_to_num())
    assert y.grad_fn.name() == RELU_NODE[inplace]  # dropit's kernel: no dense tensor saved
    assert dropit.live_saved_bytes().masks == ((33 * 64 + 31) // 32) * 4
    g = torch.randn_like(y0)
    y0.backward(g)
    y.backward(g)
    assert torch.equal(x.grad, x0.grad)
    assert dropit.live_saved_bytes().masks == 0


def _plain_error(fn):
    try:
        fn()
    except RuntimeError as e:
        return str(e).split("\n")[0]
    raise AssertionError("plain PyTorch accepted it")


@pytest.mark.parametrize("transposed", [False, True])
def test_inplace_relu_on_a_strided_view_changes_its_base(transposed):
    # A view that is not dense (every row's first 5 of 9 columns; of the transpose): dropit's
    # kernel computes it out of place and copies it back, so the base sees the result, as with
    # PyTorch's relu_, and a mask is all that is saved. Until 2026-12-07 the base kept its old
    # values (the output and the gradient through the base differed from PyTorch's).
    def run(relu):
        torch.manual_seed(0)
        x = torch.randn(6, 9, requires_grad=True)
        base = x * 1
        view = base.t()[2:7] if transposed else base[:, :5]
        assert not view.is_contiguous()
        out = relu(view)
        masks = dropit.live_saved_bytes().masks
        y = base * 3 + out.sum()
        (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
        return y, gx, out is view, masks

    relu = nn.ReLU(inplace=True)
    dropit.to_dropit(relu, "mink", 0.9)
    y, gx, same_object, masks = run(relu)
    y0, gx0, same_object0, _ = run(nn.ReLU(inplace=True))
    _same(y, y0)
    _same(gx, gx0)
    assert same_object and same_object0
    assert masks == ((30 + 31) // 32) * 4


@pytest.mark.parametrize("view", ["chunk", "no_grad", "full_backward_hook", "leaf"])
def test_inplace_relu_refuses_what_pytorch_refuses(view):
    # What autograd forbids writing in place: an output of chunk, a view made in no_grad mode,
    # the input a full backward hook wraps, a leaf. dropit's in-place kernel refuses it and
    # PyTorch's relu_ raises its own error (before: an internal assertion of LibTorch, and for a
    # leaf another wording).
    def run(relu):
        x = torch.randn(8, 6, requires_grad=True)
        if view == "leaf":
            return relu(x)
        if view == "full_backward_hook":
            relu.register_full_backward_hook(lambda module, gin, gout: None)
            return relu(x * 1)
        if view == "chunk":
            return relu((x * 1).chunk(2)[0])
        y = x * 1
        with torch.no_grad():
            v = y[:4]
        return relu(v)

    expected = _plain_error(lambda: run(nn.ReLU(inplace=True)))
    relu = nn.ReLU(inplace=True)
    dropit.to_dropit(relu, "mink", 0.9)
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        run(relu)


@_ON_EACH_HOOKED_KIND
def test_full_backward_hooks_see_pytorchs_gradients(make):
    # A full backward hook wraps the layer's input in a custom Function's view before its forward
    # runs: the layer still packs what its op saves, and the hook sees the gradients PyTorch's
    # layer gives. Oracle: the same layer and hook, plain.
    layer = make()
    plain = copy.deepcopy(layer)
    seen = {layer: [], plain: []}
    for m in (layer, plain):
        m.register_full_backward_hook(lambda module, gin, gout: seen[module].append(gin[0]))
    dropit.to_dropit(layer, "mink", 0.9)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y, y0 = layer(x * 1), plain(x * 1)
    assert dropit.live_saved_bytes().total > 0
    g = torch.randn_like(y0)
    (gx,) = torch.autograd.grad(y, x, g)
    (gx0,) = torch.autograd.grad(y0, x, g)
    _same(gx, gx0)
    _same(seen[layer][0], seen[plain][0])


@needs_half
@pytest.mark.parametrize("inplace", [False, True])
def test_relu_kernel_runs_float16_on_the_cpu(inplace):
    # PyTorch 1.13 has no float16 relu on the CPU ("clamp_min_cpu" not implemented for 'Half');
    # dropit's kernel has one. The oracle computes in float32 (max(x, 0) and its gradient are
    # exact in any precision): the output where x > 0 or NaN, the gradient there, 0 elsewhere.
    relu = nn.ReLU(inplace=inplace)
    dropit.to_dropit(relu)
    x = torch.randn(33, 40).to(torch.float16)
    x[0, :5] = 0.0
    x[1, 0] = float("nan")
    x.requires_grad_(True)
    y = relu(x * 1)
    assert y.grad_fn.name() == RELU_NODE[inplace]
    assert dropit.live_saved_bytes().masks == (33 * 40 + 31) // 32 * 4
    x32 = x.detach().float()
    passes = ~(x32 <= 0)
    _same(y.detach(), torch.where(passes, x32, torch.zeros(())).half())
    g = torch.randn(33, 40).to(torch.float16)
    y.backward(g)
    assert torch.equal(x.grad, torch.where(passes, g.float(), torch.zeros(())).half())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("subclass", [False, True])
def test_relu_mask_restores_as_dtype_and_double_backward_matches(dtype, subclass):
    # A plain tensor runs dropit's kernel (its node saves the bits); a tensor subclass runs
    # PyTorch's relu, whose saved output the pack hook makes a mask that comes back as a 0/1
    # tensor of y's dtype with grad mode on and off (a bool tensor would make threshold_backward
    # convert it first). Either way backward and double backward (create_graph=True) give plain
    # PyTorch's gradients.
    relu = nn.ReLU()
    dropit.to_dropit(relu, "mink", 0.9)
    x = torch.randn(7, 45, dtype=dtype, requires_grad=True)  # 315 elements: a partial word
    with torch.no_grad():
        x[0, :3] = 0.0
        x[1, 0] = float("nan")
    xin = (lambda: (x * 1).as_subclass(_Subclass)) if subclass else (lambda: x * 1)
    y = relu(xin())
    assert dropit.live_saved_bytes().masks == 10 * 4
    if subclass:
        with torch.no_grad():
            mask = saved(y, "result")
        assert mask.dtype == dtype
        assert torch.equal(mask, (~(x.detach() <= 0)).to(dtype))  # NaN passes the gradient
        assert saved(y, "result").dtype == dtype
    else:
        assert y.grad_fn.name() == RELU_NODE[False]
    g = torch.randn(7, 45, dtype=dtype)
    (gx,) = torch.autograd.grad(y, x, g)
    (gx0,) = torch.autograd.grad(F.relu(x * 1), x, g)
    assert torch.equal(gx.nan_to_num(), gx0.nan_to_num())
    # Double backward: the gradient of <gx, v> w.r.t. g is v where the mask is set, as plain
    # PyTorch's.
    gg = torch.randn(7, 45, dtype=dtype, requires_grad=True)
    (gx,) = torch.autograd.grad(relu(xin()), x, gg, create_graph=True)
    (gx0,) = torch.autograd.grad(F.relu(x * 1), x, gg, create_graph=True)
    v = torch.randn(7, 45, dtype=dtype)
    (a,) = torch.autograd.grad((gx * v).nansum(), gg)
    (b,) = torch.autograd.grad((gx0 * v).nansum(), gg)
    assert torch.equal(a, b)


MASK_ACTIVATIONS = [
    ("relu6", lambda: nn.ReLU6()),
    ("relu6-inplace", lambda: nn.ReLU6(inplace=True)),
    ("hardtanh-positive", lambda: nn.Hardtanh(0.5, 2.0)),
    ("hardtanh-default", lambda: nn.Hardtanh()),
    ("hardtanh-negative-inplace", lambda: nn.Hardtanh(-2.0, -0.5, inplace=True)),
    ("leaky", lambda: nn.LeakyReLU(0.1)),
    ("leaky-inplace", lambda: nn.LeakyReLU(0.2, inplace=True)),
]


# PyTorch 1.13 has no bfloat16 hardtanh_backward on the CPU: bfloat16 for LeakyReLU only.
MASK_CASES = [(n, m, d) for n, m in MASK_ACTIVATIONS for d in (torch.float32, torch.float64)] + [
    (n, m, torch.bfloat16) for n, m in MASK_ACTIVATIONS if n.startswith("leaky")]


@pytest.mark.parametrize("name,make,dtype", MASK_CASES,
                         ids=[f"{c[0]}-{str(c[2])[6:]}" for c in MASK_CASES])
def test_leaky_relu_and_hardtanh_save_one_bit_and_stay_exact(name, make, dtype):
    net = nn.Sequential(nn.Linear(8, 64), make(), nn.Linear(64, 3)).to(dtype)
    plain = copy.deepcopy(net)
    x = (torch.randn(32, 8) * 4).to(dtype)
    x[0, :4] = torch.tensor([0.0, 0.5, 2.0, 6.0])  # at the bounds: blocked, as PyTorch's
    x.requires_grad_(True)
    with dropit.to_dropit(net, "none") as h:
        assert dict(h.layers)["1"] == "mask"
        y = net(x)
        # the activation's saved tensor as bits: one int32 word per 32 elements
        assert dropit.live_saved_bytes().masks == 32 * 64 // 8
        g = torch.randn_like(y)
        (gx, *grads) = torch.autograd.grad(y, [x] + list(net.parameters()), g)
    y0 = plain(x)
    (gx0, *grads0) = torch.autograd.grad(y0, [x] + list(plain.parameters()), g)
    assert torch.equal(y, y0)
    assert torch.equal(gx, gx0)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads0))


def test_mask_activations_and_nan():
    x = torch.tensor([float("nan"), -1.0, 1.0, 7.0] * 8, requires_grad=True)
    act = nn.LeakyReLU(0.1)
    with dropit.to_dropit(act):
        (gx,) = torch.autograd.grad(act(x), x, torch.ones(32))
    (gx0,) = torch.autograd.grad(nn.LeakyReLU(0.1)(x), x, torch.ones(32))
    assert torch.equal(gx, gx0)  # NaN takes the slope, as in PyTorch
    # Hardtanh: PyTorch's vectorized kernel blocks a NaN (its scalar tail passes it); the mask
    # blocks it everywhere
    act = nn.ReLU6()
    for n in (32, 33):
        xn = torch.cat([x.detach(), torch.ones(n - 32)]).requires_grad_(True)
        with dropit.to_dropit(act):
            (gx,) = torch.autograd.grad(act(xn), xn, torch.ones(n))
        want = ((xn > 0) & (xn < 6)).float()
        assert torch.equal(gx, want)


def test_hardtanh_masks_take_any_bounds():
    # Around 0 and below it: the bits restore to lo outside and a value inside the bounds inside
    # (an element of the tensor where no midpoint fits: 3e38 + 3.4e38 overflows float32).
    for lo, hi in ((-1.0, 1.0), (-2.0, -0.5), (3.0e38, 3.4e38)):
        x = torch.tensor([lo, hi, (lo + hi) / 2, 3.2e38, -0.0, float("nan"), -4.0, 4.0] * 5)
        x.requires_grad_(True)
        act = nn.Hardtanh(lo, hi)
        with dropit.to_dropit(act) as h:
            assert h.layers == [("", "mask")]
            y = act(x)
            assert dropit.live_saved_bytes().masks == 8
            (gx,) = torch.autograd.grad(y, x, torch.arange(40.0))
        want = torch.where((x > lo) & (x < hi), torch.arange(40.0), torch.zeros(40))
        assert torch.equal(y.nan_to_num(), nn.Hardtanh(lo, hi)(x).nan_to_num())
        assert torch.equal(gx, want)


AVG_POOLS = [
    ("avg2d", lambda: nn.AvgPool2d(2), (2, 3, 8, 8)),
    ("avg2d-pad-exclusive", lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), (2, 3, 9, 9)),
    ("avg2d-ceil-divisor", lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, divisor_override=5),
     (2, 3, 9, 9)),
    ("avg2d-unbatched", lambda: nn.AvgPool2d(2), (3, 8, 8)),
    ("adaptive2d", lambda: nn.AdaptiveAvgPool2d((3, 2)), (2, 3, 7, 5)),
    ("avg3d", lambda: nn.AvgPool3d(2), (2, 3, 4, 4, 4)),
    ("adaptive3d", lambda: nn.AdaptiveAvgPool3d(2), (2, 3, 5, 5, 5)),
]


@pytest.mark.parametrize("name,make,shape", AVG_POOLS, ids=[c[0] for c in AVG_POOLS])
@pytest.mark.parametrize("channels_last", [False, True])
def test_average_poolings_save_only_the_input_shape(name, make, shape, channels_last):
    pool, plain = make(), make()
    x = torch.randn(shape)
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    with dropit.to_dropit(pool) as h:
        assert h.layers == [("", "avgpool")]
        y = pool(x)
        node = y.grad_fn
        shaped = [getattr(node, a) for a in dir(node) if a == "_saved_self"]
        g = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, x, g)
    (gx0,) = torch.autograd.grad(plain(x), x, g)
    assert torch.equal(gx, gx0) and gx.stride() == gx0.stride()
    if shaped:  # a contiguous input is saved as its shape (a zero-stride tensor), else as it is
        want_shape = x.is_contiguous()
        assert (shaped[0].stride() == (0,) * x.dim()) == want_shape


def test_masks_off_leaves_relu_and_pool_alone():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 13 * 13, 2))
    handle = dropit.to_dropit(net, "mink", 0.9, masks=False)
    assert handle.layers == [("0", "weight"), ("4", "weight")]
    net(torch.randn(2, 1, 28, 28)).sum()
    assert dropit.live_saved_bytes().masks == 0


# ---- what is never packed -------------------------------------------------------------------


def test_parameters_are_never_packed():
    class FromParameter(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(6, 12))
            self.proj = nn.Linear(12, 4)

        def forward(self):
            return self.proj(self.table) + self.proj(self.table.t().t()[1:])[0]

    m = FromParameter()
    plain = copy.deepcopy(m)
    dropit.to_dropit(m, "mink", 0.9)
    m().sum().backward()
    plain().sum().backward()
    for a, b in zip(m.parameters(), plain.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert dropit.live_saved_bytes().sparse == 0


def test_eval_and_no_grad_pack_nothing():
    import fmnist

    net = fmnist.make_cnn()
    dropit.to_dropit(net, "mink", 0.9)
    x = torch.randn(4, 1, 28, 28)
    net.eval()
    y = net(x)
    assert y.requires_grad and dropit.live_saved_bytes().total == 0
    net.train()
    with torch.no_grad():
        net(x)
    assert dropit.live_saved_bytes().total == 0
    y = net(x)
    assert dropit.live_saved_bytes().total > 0
    del y


# ---- handles, exclusions, errors ----------------------------------------------------------------


def hook_count(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_exclude_and_remove():
    import fmnist

    net = fmnist.make_model("vit")
    handle = dropit.to_dropit(net, "mink", 0.9, exclude=["patch", "head", "blocks.1"])
    names = [n for n, _ in handle.layers]
    assert "patch" not in names and "head" not in names
    assert not any(n.startswith("blocks.1.") for n in names)
    assert "blocks.0.attn.qkv" in names and "blocks.2.act" in names
    assert hook_count(net) == 2 * len(handle)
    handle.remove()
    assert hook_count(net) == 0
    handle.remove()  # idempotent
    y = net(torch.randn(2, 1, 28, 28))
    assert dropit.live_saved_bytes().total == 0
    with dropit.to_dropit(net, "mink", 0.9) as again:
        assert len(again) > 0
    assert hook_count(net) == 0
    del y


@pytest.mark.parametrize("kwargs,message", [
    (dict(strategy="topk"), "unknown kind 'topk'"),
    (dict(gamma=1.5), r"gamma must be in \[0, 1\], got 1.5"),
    (dict(gamma=-0.5, strategy="random"), r"Random: gamma must be in \[0, 1\]"),
    (dict(exclude=["0", "nope", "features.3"]), "exclude names no module of the model: 'nope', 'features.3'"),
    (dict(codec="int4"), "unknown codec 'int4'"),
])
def test_bad_arguments_register_nothing(kwargs, message):
    import fmnist

    net = fmnist.make_cnn()
    with pytest.raises(dropit.Error, match=message):
        dropit.to_dropit(net, **kwargs)
    assert hook_count(net) == 0
    dropit.to_dropit(net).remove()  # and the model is still free to convert


def test_converting_twice_is_refused():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    handle = dropit.to_dropit(net)
    with pytest.raises(dropit.Error, match="already has dropit hooks"):
        dropit.to_dropit(net)
    assert hook_count(net) == 4
    handle.remove()
    dropit.to_dropit(net, "random", 0.5).remove()
    with pytest.raises(TypeError):
        dropit.to_dropit(lambda x: x)


def test_a_module_assigned_after_to_dropit_is_not_hooked_until_converted_again():
    # to_dropit hooks the modules the model has when it is called (docs/python.md, Limits).
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    handle = dropit.to_dropit(net)
    net[2] = nn.Linear(64, 8)
    assert hook_count(net[2]) == 0 and hook_count(net[0]) == 2
    x = torch.randn(16, 64)

    def saved_sparse():
        y = net(x)
        held = dropit.live_saved_bytes().sparse
        y.sum().backward()
        return held

    one_layer = saved_sparse()
    handle.remove()
    handle = dropit.to_dropit(net)
    assert [n for n, _ in handle.layers] == ["0", "1", "2"]
    assert 0 < one_layer < saved_sparse()
    handle.remove()


def test_a_forward_that_raises_leaves_no_hook_behind():
    class Failing(nn.ReLU):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("boom")

    net = nn.Sequential(nn.Linear(8, 8), Failing())
    dropit.to_dropit(net, "mink", 0.9)
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="boom"):
        net(x)
    # Outside any dropit layer, a ReLU of the same shape saves its dense output as usual.
    a = torch.randn(4, 8, requires_grad=True)
    y = torch.relu(a)
    assert torch.equal(saved(y, "result"), y)
    # And the layers work again.
    net[1] = nn.ReLU()
    dropit.to_dropit(net[1])
    h = net(x)
    assert h.grad_fn.name() == RELU_NODE[False]


def test_a_pooling_forward_that_raises_routes_nothing_after_it():
    # The MaxPool2d layer's mode stays entered after its forward raised (the next hooked forward
    # closes it); meanwhile a max_pool2d outside any dropit layer is PyTorch's own.
    class Failing(nn.MaxPool2d):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("boom")

    pool = Failing(2)
    dropit.to_dropit(pool)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="boom"):
        pool(x)
    assert F.max_pool2d(x, 2).grad_fn.name() == "MaxPool2DWithIndicesBackward0"
    assert torch.relu(x).grad_fn.name() == "ReluBackward0"
    plain = nn.MaxPool2d(2)
    dropit.to_dropit(plain)
    assert plain(x).grad_fn.name() == POOL_NODE


# ---- the saved_tensors block ----------------------------------------------------------------


def test_saved_tensors_block():
    lin = nn.Linear(20, 5)
    x = torch.randn(7, 20, requires_grad=True)
    with dropit.saved_tensors(dropit.MinK(0.9)):
        y = lin(x)
    assert torch.equal(saved(y, "mat1"), reference.mink(x.detach(), 0.9))
    assert saved(y, "mat2").data_ptr() == lin.weight.data_ptr()
    plain = copy.deepcopy(lin)
    x0 = x.detach().clone().requires_grad_(True)
    with dropit.saved_tensors(dropit.Identity()):
        y1 = lin(x0)
    y1.sum().backward()
    plain(x.detach().clone()).sum().backward()
    assert torch.equal(lin.weight.grad, plain.weight.grad)
    with pytest.raises(TypeError):
        dropit.saved_tensors(0.9)


def test_layer_gamma_sets_gamma_per_layer_longest_name_first(path):
    net = nn.Sequential(nn.Linear(20, 30), nn.ReLU(),
                        nn.Sequential(nn.Linear(30, 30), nn.Linear(30, 5)))
    handle = dropit.to_dropit(net, "mink", 0.9, layer_gamma={"2": 0.5, "2.1": 0.0})
    x = torch.randn(8, 20)
    a0 = net[0](x)
    h1 = torch.relu(a0).detach()
    a1 = net[2][0](h1)
    h2 = a1.detach()
    a2 = net[2][1](h2)
    assert torch.equal(input_seen(net[0], a0), reference.mink(x, 0.9))       # the default
    assert torch.equal(input_seen(net[2][0], a1), reference.mink(h1, 0.5))  # "2"
    assert torch.equal(input_seen(net[2][1], a2), h2)                       # gamma 0: all of it
    # gamma 0 is lossless: PyTorch's own Linear, whose backward gives its gradients bit for bit.
    assert (a0.grad_fn.name() in KERNEL_NODES) == (path == "kernel")
    assert a2.grad_fn.name() == "AddmmBackward0"
    handle.remove()
    for bad, message in (({"nope": 0.5}, "layer_gamma names no module of the model: 'nope'"),
                         ({"0": 1.5}, r"gamma must be in \[0, 1\]")):
        with pytest.raises(dropit.Error, match=message):
            dropit.to_dropit(net, "mink", 0.9, layer_gamma=bad)
        assert hook_count(net) == 0


FUSED_NODE = "torch::autograd::CppNode<dropit::torch::detail::max_pool2d_relu_fn>"


def _node_names(y):
    """The names of the autograd nodes y's gradient runs through."""
    names, seen, todo = [], set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        todo.extend(n for n, _ in node.next_functions)
    return names


def _pool_relu_net(inplace):
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(inplace=inplace),
                         nn.Conv2d(4, 4, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


@pytest.mark.parametrize("inplace", [False, True])
def test_max_pool_then_relu_in_a_sequential_is_fused_and_exact(inplace):
    # fuse_pool_relu (default): the pooling applies the ReLU and keeps window positions only for
    # the outputs it passes; outputs and every gradient equal plain PyTorch's, bit for bit
    # (strategy "none": the convolutions and the Linear are PyTorch's own).
    plain = _pool_relu_net(inplace)
    x = torch.randn(3, 3, 14, 16)
    x[2] -= 3.0  # a sample where most outputs do not pass
    for fuse in (True, False):
        net = copy.deepcopy(plain)
        dropit.to_dropit(net, "none", fuse_pool_relu=fuse)
        y, y0 = net(x), plain(x)
        _same(y, y0)
        assert _node_names(y).count(FUSED_NODE) == (2 if fuse else 0)
        g = torch.randn_like(y0)
        for p0 in plain.parameters():
            p0.grad = None
        y.backward(g)
        y0.backward(g)
        for p, p0 in zip(net.parameters(), plain.parameters()):
            _same(p.grad, p0.grad)
        assert dropit.live_saved_bytes().masks == 0


def test_a_fused_pool_relu_pair_is_one_node_and_saves_fewer_bytes():
    net = nn.Sequential(nn.MaxPool2d(2), nn.ReLU())
    dropit.to_dropit(net)
    x = (torch.randn(4, 8, 32, 32) - 2.0).requires_grad_(True)  # about 1 output in 6 passes
    y = net(x)
    assert y.grad_fn.name() == FUSED_NODE
    fused = dropit.live_saved_bytes().masks
    del y
    y = net[1](net[0](x))  # the same modules, called one by one: no Sequential forward, no fusion
    assert FUSED_NODE not in _node_names(y) and POOL_NODE in _node_names(y)
    separate = dropit.live_saved_bytes().masks
    # one mask bit per output, and the window positions (2 bits) of the outputs that pass only,
    # against 1 + 2 bits per output
    assert fused < 0.65 * separate
    _same(y, F.relu(F.max_pool2d(x, 2)))


def test_a_pooling_called_alone_or_watched_by_a_hook_is_not_fused():
    # Only a Sequential's own forward hands the pooling's output to the ReLU and nothing else.
    net = nn.Sequential(nn.MaxPool2d(2), nn.ReLU())
    dropit.to_dropit(net)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    _same(net[0](x), F.max_pool2d(x, 2))  # negative outputs: no ReLU applied
    assert net[0](x).grad_fn.name() == POOL_NODE

    class Own(nn.Sequential):
        def forward(self, t):
            return self[1](self[0](t)) + 0.0

    own = Own(nn.MaxPool2d(2), nn.ReLU())
    dropit.to_dropit(own)
    assert own(x).grad_fn.next_functions[0][0].name() != FUSED_NODE
    seen = []
    h = net[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    y = net(x)
    h.remove()
    _same(seen[0], F.max_pool2d(x, 2))  # the user's hook sees the pooling's own output
    _same(y, F.relu(F.max_pool2d(x, 2)))
    assert y.grad_fn.name() != FUSED_NODE
    h = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert net(x).grad_fn.name() != FUSED_NODE
    finally:
        h.remove()
    assert net(x).grad_fn.name() == FUSED_NODE
    off = nn.Sequential(nn.MaxPool2d(2), nn.ReLU())
    dropit.to_dropit(off, fuse_pool_relu=False)
    assert off(x).grad_fn.name() != FUSED_NODE


def test_fused_pool_relu_refuses_double_backward_and_names_the_option():
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    for fuse in (True, False):
        net = nn.Sequential(nn.MaxPool2d(2), nn.ReLU())
        dropit.to_dropit(net, fuse_pool_relu=fuse)
        y = net(x)
        if fuse:
            with pytest.raises(RuntimeError, match=r"fuse_pool_relu=False"):
                torch.autograd.grad((y * y).sum(), x, create_graph=True)
        else:
            (gx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
            (ggx,) = torch.autograd.grad((gx * gx).sum(), x)
            x0 = x.detach().clone().requires_grad_(True)
            y0 = F.relu(F.max_pool2d(x0, 2))
            (gx0,) = torch.autograd.grad((y0 * y0).sum(), x0, create_graph=True)
            (ggx0,) = torch.autograd.grad((gx0 * gx0).sum(), x0)
            _same(ggx, ggx0)


def test_fusing_keeps_no_input_alive():
    # Deciding to fuse reads the calling Sequential's frame; that must not keep the pooling's
    # input (the convolution's output, 4x the pooled size) alive for the rest of the forward:
    # the forward's peak is the unfused one.
    x = torch.randn(16, 3, 32, 32)
    peaks = {}
    for fuse in (True, False):
        torch.manual_seed(0)
        # the convolution after the pair allocates more than the one before it
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
                            nn.Conv2d(8, 64, 3, padding=1))
        dropit.to_dropit(net, fuse_pool_relu=fuse)
        with dropit.memory_counter() as c:
            base = c.reset_peak()
            y = net(x)
            peaks[fuse] = c.peak_bytes - base
        assert (FUSED_NODE in _node_names(y)) == fuse
    assert peaks[True] <= peaks[False]
