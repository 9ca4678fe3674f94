"""Independent oracles for the tests, in plain PyTorch and Python: DropIT's selection rule as the
C++ library documents it, and the counter-based hash of Random, written from the spec (no dropit
code is called here)."""
import math

import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def kept_count(n, gamma):
    """k = n - floor(n * gamma + 1e-6), clamped to [0, n]."""
    dropped = n * gamma + 1e-6
    return 0 if dropped >= n else n - int(math.floor(dropped))


def _keep_largest(keys, k):
    """Positions of the k largest keys, ties lowest position first (a stable descending sort)."""
    order = torch.sort(keys, descending=True, stable=True).indices
    return order[:k]


def mink(t, gamma):
    """DropIT's min-k on t's elements in row-major order: the k largest magnitudes kept (NaN above
    +inf, -0 equal to +0, ties lowest position first), zeros elsewhere; same dtype and shape."""
    flat = t.reshape(-1)
    k = kept_count(flat.numel(), gamma)
    nan = torch.isnan(flat)
    keys = torch.where(nan, torch.full_like(flat, math.inf), flat.abs()).double()
    # Lexicographic (NaN first, then magnitude), each sort stable: ties keep position order.
    order = torch.sort(keys, descending=True, stable=True).indices
    order = order[torch.sort(nan[order].to(torch.uint8), descending=True, stable=True).indices]
    keep = order[:k]
    out = torch.zeros_like(flat)
    out[keep] = flat[keep]
    return out.view(t.shape)


def mix64(z):
    """splitmix64's finaliser."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def random_keep(n, gamma, seed):
    """The positions Random keeps: key(i) = mix64(mix64(seed) + i * golden) >> 32, the k largest
    keys, ties lowest position first."""
    salt = mix64(seed & MASK64)
    keys = torch.tensor([mix64((salt + i * GOLDEN) & MASK64) >> 32 for i in range(n)],
                        dtype=torch.int64)
    return _keep_largest(keys, kept_count(n, gamma))


def random_select(t, gamma, seed):
    flat = t.reshape(-1)
    keep = random_keep(flat.numel(), gamma, seed)
    out = torch.zeros_like(flat)
    out[keep] = flat[keep]
    return out.view(t.shape)


def layer_seed(base, index, step):
    """The seed to_dropit documents for layer `index` (0-based, in named_modules order among the
    hooked layers) at its `step`-th training forward (1-based)."""
    return (base + (index + 1) * GOLDEN + step) & MASK64


def conv_input(conv, x):
    """The tensor nn.Conv2d's convolution saves for its weight gradient and the padding it then
    applies: x itself, x padded first by the padding mode, or, for 'same' padding that is not
    symmetric, x padded on the right by the difference (as ATen's conv2d_padding_same does)."""
    if conv.padding_mode != "zeros":
        return F.pad(x, conv._reversed_padding_repeated_twice, mode=conv.padding_mode), (0, 0)
    if conv.padding != "same":
        return x, conv.padding
    left, extra = [], []
    for d, k in zip(conv.dilation, conv.kernel_size):
        total = d * (k - 1)
        left.append(total // 2)
        extra.append(total - 2 * (total // 2))
    if not any(extra):
        return x, tuple(left)
    return F.pad(x, [0, extra[1], 0, extra[0]]), tuple(left)


def conv_weight_grad(conv, x_saved, padding, g):
    """The weight gradient of `conv` computed from the (sparsified) saved input."""
    w = conv.weight.detach().clone().requires_grad_(True)
    y = F.conv2d(x_saved.detach(), w, None, conv.stride, padding, conv.dilation, conv.groups)
    y.backward(g)
    return w.grad
