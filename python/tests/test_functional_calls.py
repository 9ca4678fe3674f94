"""to_dropit on models that call F.relu (torch.relu, Tensor.relu, relu_) and F.max_pool2d in their
own forward, as PyTorch's tutorials and nn.TransformerEncoderLayer do: those calls keep a 1-bit
mask like an nn.ReLU layer and window codes like an nn.MaxPool2d, with plain PyTorch's outputs
and gradients as the oracle."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit
import reference


def mask_bytes(*shapes):
    """What dropit's ReLU keeps: 1 bit per element, in 32-bit words, per call."""
    return sum((torch.Size(s).numel() + 31) // 32 * 4 for s in shapes)


def code_bytes(*shapes):
    """What dropit's 2 x 2 max pooling keeps: a 2-bit window position per output, in 32-bit
    words, per call."""
    return sum((torch.Size(s).numel() * 2 + 31) // 32 * 4 for s in shapes)


class Block(nn.Module):
    """A submodule with an F.relu call of its own and an nn.ReLU."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(F.relu(self.fc(x)) + x)


class TutorialNet(nn.Module):
    """PyTorch's tutorial CNN: the activations are function calls in its forward, no ReLU modules
    (each spelling once: F.relu, in place or not, torch.relu, Tensor.relu / relu_)."""

    def __init__(self, inplace):
        super().__init__()
        self.inplace = inplace
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.block = Block()
        self.fc2 = nn.Linear(32, 10)
        self.modes = []  # torch-function modes active in each forward

    def forward(self, x):
        self.modes.append(torch.overrides._len_torch_function_stack())
        x = F.max_pool2d(F.relu(self.conv1(x), inplace=self.inplace), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.fc1(x.flatten(1))
        x = x.relu_() if self.inplace else x.relu()
        return self.fc2(self.block(x))


BATCH = 4
# What TutorialNet's own calls keep (three ReLUs, two poolings), then its block's two ReLUs.
ROOT = (mask_bytes((BATCH, 6, 24, 24), (BATCH, 16, 8, 8), (BATCH, 32))
        + code_bytes((BATCH, 6, 12, 12), (BATCH, 16, 4, 4)))
BLOCK = mask_bytes((BATCH, 32), (BATCH, 32))


def step(net, x, g):
    """Forward and backward; returns (y, the saved mask bytes after forward, x.grad, grads)."""
    x = x.detach().clone().requires_grad_(True)
    y = net(x)
    held = dropit.live_saved_bytes().masks
    y.backward(g)
    grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
    return y.detach(), held, x.grad, grads


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("strategy", ["none", "mink"])
def test_functional_relu_keeps_a_mask_and_plain_gradients(inplace, strategy):
    net = TutorialNet(inplace)
    plain = copy.deepcopy(net)
    handle = dropit.to_dropit(net, strategy, 0.9)
    kinds = dict(handle.layers)
    assert kinds[""] == "functional" and kinds["block"] == "functional"
    assert kinds["block.act"] == "relu"
    x = torch.randn(BATCH, 1, 28, 28)
    g = torch.randn(BATCH, 10)
    y0, held0, gx0, grads0 = step(plain, x, g)
    y, held, gx, grads = step(net, x, g)
    assert held0 == 0
    assert held == ROOT + BLOCK
    assert dropit.live_saved_bytes().total == 0  # all released by backward
    # One mode for the whole forward (entered by the outermost scope), none after it.
    assert net.modes == [1] and torch.overrides._len_torch_function_stack() == 0
    assert not dropit._hooks._stack()
    assert torch.equal(y, y0)
    assert torch.equal(gx, gx0)  # the input gradient is exact with any policy
    for name, g0 in grads0.items():
        if strategy == "none" or name.endswith("bias"):
            assert torch.equal(grads[name], g0), name
        else:  # DropIT: the weight gradient from the sparsified input
            assert not torch.allclose(grads[name], g0, rtol=1e-3, atol=1e-4), name


def test_an_excluded_module_keeps_pytorchs_relu_inside_a_functional_one():
    net = TutorialNet(False)
    plain = copy.deepcopy(net)
    handle = dropit.to_dropit(net, "none", exclude=["block"])
    kinds = dict(handle.layers)
    assert kinds[""] == "functional" and kinds["block"] == "dense"
    assert "block.act" not in kinds
    x = torch.randn(BATCH, 1, 28, 28)
    g = torch.randn(BATCH, 10)
    y0, _, gx0, grads0 = step(plain, x, g)
    y, held, gx, grads = step(net, x, g)
    assert held == ROOT  # the block's ReLUs save as PyTorch does
    assert torch.equal(y, y0) and torch.equal(gx, gx0)
    for name, g0 in grads0.items():
        assert torch.equal(grads[name], g0), name
    handle.remove()
    assert step(net, x, g)[1] == 0  # removed: nothing routed


def test_functional_relu_packs_nothing_in_eval_no_grad_or_without_masks():
    net = TutorialNet(False)
    x = torch.randn(BATCH, 1, 28, 28)
    with dropit.to_dropit(net, "none"):
        net.eval()
        y = net(x.requires_grad_(True))
        assert y.grad_fn is not None and dropit.live_saved_bytes().masks == 0
        del y
        net.train()
        with torch.no_grad():
            net(x)
        assert net.modes == [0, 0]  # no mode entered
    handle = dropit.to_dropit(net, "mink", 0.9, masks=False)
    assert "functional" not in dict(handle.layers).values()
    y = net(x)
    assert dropit.live_saved_bytes().masks == 0
    del y


@pytest.mark.parametrize("strategy", ["none", "mink"])
def test_transformer_encoder_layer_relu_activation_keeps_a_mask(strategy):
    # nn.TransformerEncoderLayer holds F.relu as its `activation` and calls it in _ff_block.
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0)
    plain = copy.deepcopy(layer)
    handle = dropit.to_dropit(layer, strategy, 0.9)
    assert dict(handle.layers)[""] == "functional"
    x = torch.randn(6, 3, 32)
    g = torch.randn(6, 3, 32)
    y0, _, gx0, grads0 = step(plain, x, g)
    y, held, gx, grads = step(layer, x, g)
    assert held == mask_bytes((6 * 3, 64))
    assert torch.allclose(y, y0, rtol=1e-6, atol=1e-6)
    if strategy == "none":  # the attention and the Linears as PyTorch runs them: bit for bit
        assert torch.equal(y, y0) and torch.equal(gx, gx0)
        for name, g0 in grads0.items():
            assert torch.equal(grads[name], g0), name
    else:  # the input gradient stays PyTorch's (within the C++ matmul's rounding)
        assert torch.allclose(gx, gx0, rtol=1e-4, atol=1e-5)


def test_a_forward_that_raised_routes_nothing_and_is_closed_by_the_next():
    net = TutorialNet(False)
    handle = dropit.to_dropit(net, "mink", 0.9)
    with pytest.raises(RuntimeError):
        net(torch.randn(BATCH, 3, 28, 28))  # conv1 takes 1 channel: raises inside the forward
    # The failed forward left its mode entered; its scope is stale, so F.relu outside any
    # forward runs PyTorch's own relu.
    assert torch.overrides._len_torch_function_stack() == 1
    t = torch.randn(5, requires_grad=True)
    assert F.relu(t * 1).grad_fn.name() == "ReluBackward0"
    # The next forward closes what was left, and runs as it should.
    x, g = torch.randn(BATCH, 1, 28, 28), torch.randn(BATCH, 10)
    _, held, _, _ = step(net, x, g)
    assert held == ROOT + BLOCK and net.modes[-1] == 1
    assert torch.overrides._len_torch_function_stack() == 0 and not dropit._hooks._stack()
    handle.remove()


class LinearReLU(nn.Linear):
    """A Linear subclass that applies F.relu after its matmul."""

    def forward(self, x):
        return F.relu(super().forward(x))


class ConvReLUPool(nn.Conv2d):
    """A Conv2d subclass that applies F.relu and F.max_pool2d after its convolution."""

    def forward(self, x):
        return F.max_pool2d(F.relu(super().forward(x)), 2)


class SubclassNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = ConvReLUPool(2, 4, 3, padding=1)
        self.fc = LinearReLU(4 * 6 * 6, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.fc(self.conv(x).flatten(1)))


@pytest.mark.parametrize("route", [True, False])
@pytest.mark.parametrize("strategy", ["none", "mink"])
def test_a_linear_or_conv_subclass_calling_relu_keeps_masks(monkeypatch, route, strategy):
    # The F.relu / F.max_pool2d a Linear or Conv2d subclass applies after its op run dropit's
    # kernels, as in a "functional" module; with strategy "none" the layer is one (its op stays
    # PyTorch's). Oracle: plain PyTorch, the weight gradients from its output gradients and the
    # topk oracle's sparsified inputs.
    monkeypatch.setattr(dropit._hooks, "_ROUTE_WEIGHT_LAYERS", route)
    net = SubclassNet()
    plain = copy.deepcopy(net)
    kinds = dict(dropit.to_dropit(net, strategy, 0.9).layers)
    expected = "functional" if strategy == "none" else "weight"
    assert kinds == ({"conv": expected, "fc": expected} if strategy == "none"
                     else {"conv": expected, "fc": expected, "head": expected})
    x = torch.randn(BATCH, 2, 12, 12)
    g = torch.randn(BATCH, 10)
    y, held, gx, grads = step(net, x, g)
    assert held == mask_bytes((BATCH, 4, 12, 12), (BATCH, 16)) + code_bytes((BATCH, 4, 6, 6))
    assert dropit.live_saved_bytes().total == 0
    x0 = x.clone().requires_grad_(True)
    conv0 = plain.conv._conv_forward(x0, plain.conv.weight, plain.conv.bias)
    flat0 = F.max_pool2d(F.relu(conv0), 2).flatten(1)
    fc0 = F.linear(flat0, plain.fc.weight, plain.fc.bias)
    head_in0 = F.relu(fc0)
    for t in (conv0, fc0, head_in0):
        t.retain_grad()
    y0 = plain.head(head_in0)
    y0.backward(g)
    assert torch.equal(y, y0.detach()) and torch.equal(gx, x0.grad)
    for name, p0 in plain.named_parameters():
        if strategy == "none" or name.endswith("bias"):
            assert torch.equal(grads[name], p0.grad), name
    if strategy == "mink":
        torch.testing.assert_close(grads["fc.weight"],
                                   fc0.grad.t().mm(reference.mink(flat0.detach(), 0.9)))
        torch.testing.assert_close(grads["head.weight"],
                                   g.t().mm(reference.mink(head_in0.detach(), 0.9)))
        torch.testing.assert_close(grads["conv.weight"], reference.conv_weight_grad(
            plain.conv, reference.mink(x, 0.9), (1, 1), conv0.grad))
