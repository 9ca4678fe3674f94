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


def _e4m3_table():
    """The values of the e4m3 codes 0x00..0x7e (bias 7, 3 mantissa bits, subnormals m * 2^-9)."""
    vals = []
    for c in range(0x7F):
        e, m = c >> 3, c & 7
        vals.append(m * 2.0 ** -9 if e == 0 else (8 + m) * 2.0 ** (e - 10))
    return torch.tensor(vals, dtype=torch.float64)


def _e4m3_round(q):
    """Nearest e4m3 value of each element of q (float32), ties to the even code, beyond 448 the
    largest: by search over the 127 non-negative codes."""
    table = _e4m3_table()
    a = q.double().abs().clamp(max=448.0)
    d = (a[:, None] - table[None, :]).abs()
    best = d.min(dim=1, keepdim=True).values
    ties = d == best
    codes = torch.arange(table.numel())
    # Among the nearest codes the even one (two at most, neighbours of opposite parity).
    even = ties & (codes[None, :] % 2 == 0)
    pick = torch.where(even.any(dim=1), even.float().argmax(dim=1), ties.float().argmax(dim=1))
    return (table[pick] * torch.where(q < 0, -1.0, 1.0).double()).float()


def quantize_kept(dense, kept_positions, codec):
    """What a codec stores of the kept values (in position order) of the flat tensor `dense`:
    chunks of 1024 values, scale = largest finite |v| / 127 (int8: round half to even) or / 448
    (fp8: e4m3), float32 arithmetic; non-finite values restore as NaN, chunks below 2^-100 as
    zeros. Returns dense with the kept values replaced by their decoded values."""
    out = dense.clone().reshape(-1)
    pos = kept_positions.sort().values
    vals = out[pos].float()
    rng = 127.0 if codec == "int8" else 448.0
    dec = torch.empty_like(vals)
    for b in range(0, vals.numel(), 1024):
        v = vals[b:b + 1024]
        finite = torch.isfinite(v)
        a = v[finite].abs().max() if finite.any() else torch.tensor(0.0)
        if a < 2.0 ** -100:
            s, inv = torch.tensor(0.0), torch.tensor(0.0)
        else:
            s, inv = a / rng, torch.tensor(rng, dtype=torch.float32) / a
        q = torch.where(finite, v, torch.zeros_like(v)) * inv
        r = torch.round(q).clamp(-127, 127) if codec == "int8" else _e4m3_round(q)
        dec[b:b + 1024] = torch.where(finite, r * s, torch.full_like(v, float("nan")))
    out[pos] = dec.to(out.dtype)
    return out.view(dense.shape)


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
