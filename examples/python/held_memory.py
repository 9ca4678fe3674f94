"""What a standard PyTorch model holds for backward, plain and with dropit.

    PYTHONPATH=build/release/python python3 examples/python/held_memory.py
        [--model transformer|resnet|tutorial] [--layers 4] [--dim 256] [--heads 8] [--ff 1024]
        [--batch 32] [--seq 64] [--gamma 0.9]

Runs one forward of the same model (random weights and input) per configuration inside
dropit.memory_counter() and prints the bytes held after it (saved activations and the output),
then checks that a backward through each one runs. The models: an nn.TransformerEncoder
(--layers, --dim, --heads, --ff; input (--batch, --seq, --dim)), or a ResNet-18 for 32 x 32
images (BasicBlocks with BatchNorm, widths 64-512, input (--batch, 3, 32, 32)), or PyTorch's
CIFAR-10 tutorial CNN (F.relu calls in its forward; input (--batch, 3, 32, 32)). The
configurations: plain PyTorch; to_dropit (MinK on the inputs of every Linear, convolution and
nn.MultiheadAttention projection, ReLU masks, F.relu calls included); and to_dropit with
store="all" (LayerNorm and BatchNorm inputs, the attention's q/k/v and softmax through an 8-bit
codec, dropout noise as bits).
"""
import argparse
import sys

import torch
import torch.nn.functional as F
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


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu1, self.relu2 = nn.ReLU(inplace=True), nn.ReLU(inplace=True)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + self.short(x))


def resnet18(classes=10):
    """ResNet-18 for 32 x 32 inputs (a 3 x 3 stem, no max pooling)."""
    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


class TutorialNet(nn.Module):
    """The CNN of PyTorch's CIFAR-10 tutorial ("Training a classifier"): its ReLUs are F.relu
    calls in its forward."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["transformer", "resnet", "tutorial"], default="transformer")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.9)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    if a.model == "transformer":
        layer = nn.TransformerEncoderLayer(a.dim, a.heads, a.ff, dropout=0.1, batch_first=True)
        net = nn.TransformerEncoder(layer, a.layers).train()
        x = torch.randn(a.batch, a.seq, a.dim)
        title = (f"nn.TransformerEncoder: {a.layers} layers, d={a.dim}, {a.heads} heads, "
                 f"ff={a.ff}; input ({a.batch}, {a.seq}, {a.dim}) fp32")
    elif a.model == "resnet":
        net = resnet18().train()
        x = torch.randn(a.batch, 3, 32, 32)
        title = f"ResNet-18 (32 x 32 images); input ({a.batch}, 3, 32, 32) fp32"
    else:
        net = TutorialNet().train()
        x = torch.randn(a.batch, 3, 32, 32)
        title = f"PyTorch's CIFAR-10 tutorial CNN; input ({a.batch}, 3, 32, 32) fp32"
    configs = [
        ("plain PyTorch", lambda m: None),
        (f"to_dropit(gamma={a.gamma})", lambda m: dropit.to_dropit(m, gamma=a.gamma)),
        (f"to_dropit(gamma={a.gamma}, store='all')",
         lambda m: dropit.to_dropit(m, gamma=a.gamma, store="all")),
    ]
    print(title)
    print(f"{'configuration':<40} {'held after forward':>19} {'vs plain':>9} {'hooked':>7}")
    base = None
    for name, setup in configs:
        mib, layers = held_after_forward(net, x, setup)
        base = base or mib
        print(f"{name:<40} {mib:>15.2f} MiB {mib / base:>8.3f}x {layers:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
