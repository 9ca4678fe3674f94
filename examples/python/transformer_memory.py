"""What a PyTorch nn.TransformerEncoder holds for backward, plain and with dropit.

    PYTHONPATH=build/release/python python3 examples/python/transformer_memory.py [--layers 4]
        [--dim 256] [--heads 8] [--ff 1024] [--batch 32] [--seq 64] [--gamma 0.9]

Runs one forward of the same model (random weights and input) per configuration inside
dropit.memory_counter() and prints the bytes held after it (saved activations and the output),
then checks that a backward through each one runs. The configurations: plain PyTorch;
to_dropit (MinK on the inputs of every Linear and of nn.MultiheadAttention's projections, ReLU
masks); and to_dropit with store="all" (LayerNorm inputs, the attention's q/k/v and softmax, dropout
noise through an 8-bit codec or as bits).
"""
import argparse
import sys

import torch
from torch import nn

import dropit


def held_after_forward(net, x, setup):
    """MiB held after net(x) (what autograd keeps, and the output), and the handle's layer count."""
    handle = setup(net)
    torch.manual_seed(1)  # the same dropout noise in every configuration
    with dropit.memory_counter() as counter:
        before = counter.current_bytes
        y = net(x)
        held = counter.current_bytes - before
    y.float().pow(2).mean().backward()
    layers = len(handle.layers) if handle is not None else 0
    if handle is not None:
        handle.remove()
    net.zero_grad(set_to_none=True)
    return held / 2**20, layers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.9)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(a.dim, a.heads, a.ff, dropout=0.1, batch_first=True)
    net = nn.TransformerEncoder(layer, a.layers).train()
    x = torch.randn(a.batch, a.seq, a.dim)
    configs = [
        ("plain PyTorch", lambda m: None),
        (f"to_dropit(gamma={a.gamma})", lambda m: dropit.to_dropit(m, gamma=a.gamma)),
        (f"to_dropit(gamma={a.gamma}, store='all')",
         lambda m: dropit.to_dropit(m, gamma=a.gamma, store="all")),
    ]
    print(f"nn.TransformerEncoder: {a.layers} layers, d={a.dim}, {a.heads} heads, ff={a.ff}; "
          f"input ({a.batch}, {a.seq}, {a.dim}) fp32")
    print(f"{'configuration':<40} {'held after forward':>19} {'vs plain':>9} {'hooked':>7}")
    base = None
    for name, setup in configs:
        mib, layers = held_after_forward(net, x, setup)
        base = base or mib
        print(f"{name:<40} {mib:>15.2f} MiB {mib / base:>8.3f}x {layers:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
