"""Fashion-MNIST data, the CNN and ViT of the C++ example (examples/fashion_mnist/models.hpp), and
DropIT's method written in plain PyTorch (``reference_to_dropit``), as its users run it today.

Shared by fashion_mnist.py, ddp_fashion_mnist.py and bench/python_step_bench.py.
"""
import gzip
import math
import os
import struct

import torch
import torch.nn.functional as F
from torch import nn

DATA_DIR = "/usr/share/datasets/fashion-mnist"


# ---- data ------------------------------------------------------------------------------------


def _read_idx(path):
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise SystemExit(
            f"cannot read {path}: {e}\n  install the data set with: sudo apt-get install "
            "dataset-fashion-mnist\n  (or point --data at a folder holding the four *-ubyte.gz files)"
        ) from e
    magic, n = struct.unpack(">II", raw[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", raw[8:16])
        data = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8)
        return data.view(n, 1, rows, cols)
    if magic == 0x801:
        return torch.frombuffer(bytearray(raw[8:]), dtype=torch.uint8)
    raise SystemExit(f"{path}: not an IDX file")


def load(split, data_dir=DATA_DIR, limit=0):
    """Images [N, 1, 28, 28] normalised to mean 0, std 1 (float32), labels [N] (int64), as the
    C++ example loads them; ``split`` is "train" or "t10k"."""
    images = _read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = _read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    images = images.float().div_(255.0).sub_(0.2860).div_(0.3530)
    return images, labels.long()


# ---- models ----------------------------------------------------------------------------------


def make_cnn(c1=16, c2=32, hidden=128):
    """conv(1->c1, 3x3) maxpool2 ReLU conv(c1->c2, 3x3) maxpool2 ReLU flatten linear(->hidden) ReLU
    linear(->10): the C++ example's CNN (pooling before ReLU: the same function on 4x fewer
    elements)."""
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c2 * 7 * 7, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


class Attention(nn.Module):
    """Multi-head self-attention: qkv Linear, softmax(q k^T / sqrt(dh)) v, proj Linear. A module
    of its own (named like timm's and Hugging Face's) so that to_dropit(store=...) finds it."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, h):
        b, t, d = h.shape
        dh = d // self.heads
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        att = torch.softmax((q * (1.0 / math.sqrt(dh))) @ k.transpose(-2, -1), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: attention (qkv and proj Linear) and a ReLU MLP."""

    def __init__(self, dim, heads, mlp):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    """7x7 patches (16 tokens) -> dim, learned position embedding, `depth` blocks, LayerNorm, mean
    over tokens, linear head: the C++ example's ViT."""

    def __init__(self, dim=64, depth=4, heads=4, mlp=256):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 7, stride=7)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x).mean(1))


def make_model(name):
    if name == "cnn":
        return make_cnn()
    if name == "vit":
        return ViT()
    raise SystemExit(f"unknown model {name!r} (cnn, vit)")


# DropIT's own exclusions: the first layer and the classifier head stay dense (its DeiT configs).
REFERENCE_EXCLUDE = {"cnn": ("0", "9"), "vit": ("patch", "head")}


# ---- DropIT's method in plain PyTorch (the reference) ------------------------------------------
# The way DropIT's reference implementation works: each Linear/Conv2d's forward is swapped for an
# autograd Function that saves the top-k magnitudes of its input (torch.topk, int32 indices) and
# scatters them into zeros in backward. ReLU and max-pool keep their dense saved tensors.


def _select(x, gamma):
    flat = x.reshape(-1)
    k = flat.numel() - int(math.floor(flat.numel() * gamma + 1e-6))
    idx = flat.abs().topk(k, sorted=False)[1]
    return flat[idx], idx.to(torch.int32)


def _pad(values, idx, shape):
    return torch.zeros(math.prod(shape), dtype=values.dtype).scatter_(0, idx.long(), values).view(shape)


class _ReferenceLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, gamma):
        values, idx = _select(x, gamma)
        ctx.save_for_backward(values, idx, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        values, idx, weight = ctx.saved_tensors
        x = _pad(values, idx, ctx.x_shape)
        g2 = g.reshape(-1, g.shape[-1])
        grad_w = g2.t().mm(x.reshape(-1, x.shape[-1]))
        grad_b = g2.sum(0) if ctx.has_bias else None
        return g.matmul(weight), grad_w, grad_b, None


class _ReferenceConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, gamma):
        values, idx = _select(x, gamma)
        ctx.save_for_backward(values, idx, weight)
        ctx.conf = (x.shape, stride, padding, dilation, groups, bias is not None)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        values, idx, weight = ctx.saved_tensors
        shape, stride, padding, dilation, groups, has_bias = ctx.conf
        x = _pad(values, idx, shape)
        gx, gw, _ = torch.ops.aten.convolution_backward(
            g, x, weight, None, stride, padding, dilation, False, [0, 0], groups,
            (ctx.needs_input_grad[0], True, False))
        return gx, gw, g.sum((0, 2, 3)) if has_bias else None, None, None, None, None, None


def reference_to_dropit(model, gamma=0.9, exclude=()):
    """Swaps the forward of every nn.Linear and nn.Conv2d (zero padding) not under an excluded
    name for DropIT's min-k Function; returns the number of layers swapped."""
    count = 0
    for name, m in model.named_modules():
        if any(name == e or name.startswith(e + ".") for e in exclude):
            continue
        if type(m) is nn.Linear:
            m.forward = (lambda m: lambda x: _ReferenceLinear.apply(x, m.weight, m.bias, gamma)
                         if m.training and torch.is_grad_enabled() else F.linear(x, m.weight, m.bias))(m)
            count += 1
        elif type(m) is nn.Conv2d and m.padding_mode == "zeros" and not isinstance(m.padding, str):
            m.forward = (lambda m: lambda x: _ReferenceConv2d.apply(
                x, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups, gamma)
                if m.training and torch.is_grad_enabled() else m._conv_forward(x, m.weight, m.bias))(m)
            count += 1
    return count
