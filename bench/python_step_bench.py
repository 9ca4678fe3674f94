#!/usr/bin/env python3
"""One training step of the Fashion-MNIST CNN and ViT in PyTorch from Python: plain, with dropit
(``dropit.to_dropit``, MinK; on the CNN also with ``fuse_pool_relu=False``; also with
``store="all"``: the LayerNorm inputs, softmax outputs
and attention matmul inputs in int8; and with ``low_memory=True``: Conv2d layers in dropit's C++
convolution, in pieces of samples), with DropIT's method in plain PyTorch (``--impl reference``
of the example), and a "hook floor", measured in ONE interleaved run so that the shared
machine's slow stretches fall on every configuration alike.

The hook floor is what any method that stores Linear/Conv2d inputs through PyTorch's
save-for-backward hooks must at least do: forward pre-hooks and hooks that open
``saved_tensors_hooks`` around each Linear/Conv2d (as ``to_dropit`` does), a pack hook that reads
each saved input once (``t.sum()``) and keeps only its shape, and an unpack hook that writes it
back as a dense tensor of zeros (PyTorch's backward reads a dense tensor). It trains nothing (its
weight gradients are wrong) and leaves ReLU and MaxPool2d as PyTorch runs them; it prices the
hooks, one read of every Linear/Conv input in forward and one dense write of it in backward.

``--models cnn-functional`` is the same CNN written as PyTorch's tutorials write one, its ReLUs and
poolings F.relu / F.max_pool2d calls in its forward: ``to_dropit`` then routes them to its kernels
through a ``TorchFunctionMode`` around that forward (every torch call of it passes through the
mode), which this prices against the CNN's nn.ReLU / nn.MaxPool2d modules.

For each model: the bytes the graph holds after forward and the peak of one step's forward and
backward above what was held before it (dropit's counting CPU allocator), the step time
(forward, cross-entropy, backward, AdamW) over real Fashion-MNIST batches, and the minor page
faults per step (``getrusage``: memory the kernel had to map and zero because glibc's heap gave
it back; a run of each configuration in a process of its own, as ``perf stat``, sees thousands
per step, this interleaved run almost none). Each round runs one step of every configuration in
a fresh random order; the figure is the median over rounds,
with the ratio against plain PyTorch and the interquartile range of the per-round ratios.

Which configuration pays page faults depends on how glibc's heap happens to grow and shrink
between them. ``--steady-heap`` first sets glibc's ``M_MMAP_THRESHOLD`` to 32 MiB and
``M_TRIM_THRESHOLD`` to 1 GiB (``mallopt``, as the ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` environment variables would): every allocation then comes from a heap
that is never handed back. It then grows that heap to 512 MiB and writes every page once (32
blocks of 16 MiB, written, freed): a step whose heap reaches a new high-water mark would
otherwise still map fresh pages after the warm-up (the CNN's run peaks near 180 MiB of heap).
No configuration then pays page faults after the warm-up and the ratios compare the work alone.

    bench/python_step_bench.py [--rounds 200] [--warmup 20] [--batch-size 128] [--threads 2]
                               [--gamma 0.9] [--models cnn vit [cnn-functional]]
                               [--steady-heap]
                               [--json FILE] [--markdown FILE]

Needs dropit importable (PYTHONPATH=build/release/python, or a pip-installed package).
"""
import argparse
import copy
import ctypes
import ctypes.util
import datetime
import json
import os
import platform
import random
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
import fmnist  # noqa: E402

import dropit  # noqa: E402


class _Floor:
    __slots__ = ("shape", "dtype")

    def __init__(self, t):
        t.detach().sum()  # one read of the activation, as any pack must do
        self.shape, self.dtype = t.shape, t.dtype

    def restore(self):
        return torch.zeros(self.shape, dtype=self.dtype)  # one dense write, as any restore must


def _floor_pack(t):
    if not t.is_floating_point() or isinstance(t, torch.nn.Parameter) or \
            isinstance(t._base, torch.nn.Parameter):
        return t  # parameters (and their views) are saved as they are, as dropit does
    return _Floor(t)


def _floor_unpack(obj):
    return obj if isinstance(obj, torch.Tensor) else obj.restore()


def hook_floor(net):
    """Registers the hook floor (see the module doc) on net's Linear and Conv2d layers."""
    kinds = (torch.nn.Linear, torch.nn.Conv2d)
    for module in net.modules():
        if isinstance(module, kinds):
            scope = {}

            def pre(mod, args, scope=scope):
                if mod.training and torch.is_grad_enabled():
                    scope["hooks"] = torch.autograd.graph.saved_tensors_hooks(_floor_pack,
                                                                               _floor_unpack)
                    scope["hooks"].__enter__()

            def post(mod, args, out, scope=scope):
                if "hooks" in scope:
                    scope.pop("hooks").__exit__(None, None, None)

            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)


class FunctionalCNN(nn.Module):
    """The CNN with its poolings and ReLUs as F.max_pool2d / F.relu calls in its own forward, as
    PyTorch's tutorials write one (to_dropit routes them through its kernel mode): the same
    Conv2d and Linear modules, the same function."""

    def __init__(self, cnn):
        super().__init__()
        self.conv1, self.conv2, self.fc1, self.fc2 = cnn[0], cnn[3], cnn[7], cnn[9]

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODELS = ("cnn", "vit", "cnn-functional")
# DropIT's exclusions (first layer and head dense) by module name.
EXCLUDE = dict(fmnist.REFERENCE_EXCLUDE, **{"cnn-functional": ("conv1", "fc2")})


def make_model(model):
    if model == "cnn-functional":
        return FunctionalCNN(fmnist.make_model("cnn"))
    return fmnist.make_model(model)


def configurations(model, gamma):
    """(name, model) for every configuration, all from the same initial weights."""
    torch.manual_seed(0)
    base = make_model(model)
    plain = copy.deepcopy(base)
    converted = copy.deepcopy(base)
    dropit.to_dropit(converted, "mink", gamma)
    bitmask = copy.deepcopy(base)
    dropit.to_dropit(bitmask, "mink", gamma, positions="no_elias_fano")
    stored = copy.deepcopy(base)
    dropit.to_dropit(stored, "mink", gamma, store="all", store_codec="int8")
    low_memory = copy.deepcopy(base)
    dropit.to_dropit(low_memory, "mink", gamma, low_memory=True)
    excluded = copy.deepcopy(base)
    dropit.to_dropit(excluded, "mink", gamma, exclude=EXCLUDE[model])
    reference = copy.deepcopy(base)
    fmnist.reference_to_dropit(reference, gamma)
    floor = copy.deepcopy(base)
    hook_floor(floor)
    configs = [("none", plain), ("dropit", converted), ("dropit-no-ef", bitmask),
               ("dropit-store", stored), ("dropit-low-memory", low_memory),
               ("dropit-excl", excluded), ("reference", reference), ("floor", floor)]
    if model == "cnn":  # the model whose Sequential runs MaxPool2d then ReLU
        unfused = copy.deepcopy(base)
        dropit.to_dropit(unfused, "mink", gamma, fuse_pool_relu=False)
        configs.insert(2, ("dropit-unfused", unfused))
    return configs


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def held_after_forward(net, x, y):
    with dropit.memory_counter() as counter:
        before = counter.current_bytes
        loss = F.cross_entropy(net(x), y)
        held = counter.current_bytes - before
        loss.backward()
    net.zero_grad(set_to_none=True)
    return held


def step_peak(net, x, y):
    """Peak CPU bytes of one training step (forward and backward) above what was held before."""
    with dropit.memory_counter() as counter:
        base = counter.reset_peak()
        F.cross_entropy(net(x), y).backward()
        peak = counter.peak_bytes - base
    net.zero_grad(set_to_none=True)
    return peak


def quartiles(values):
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def bench_model(model, a, images, labels):
    configs = configurations(model, a.gamma)
    optimizers = {name: torch.optim.AdamW(net.parameters(), lr=1e-4) for name, net in configs}
    batches = [(images[i:i + a.batch_size], labels[i:i + a.batch_size])
               for i in range(0, len(images) - a.batch_size + 1, a.batch_size)]
    held = {name: held_after_forward(net, *batches[0]) for name, net in configs}
    peak = {name: step_peak(net, *batches[0]) for name, net in configs}
    times = {name: [] for name, _ in configs}
    faults = {name: [] for name, _ in configs}
    order = [c for c in configs]
    rng = random.Random(1)
    for r in range(a.warmup + a.rounds):
        rng.shuffle(order)
        x, y = batches[r % len(batches)]
        for name, net in order:
            opt = optimizers[name]
            f0 = minor_faults()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(net(x), y).backward()
            opt.step()
            if r >= a.warmup:
                times[name].append(time.perf_counter() - t0)
                faults[name].append(minor_faults() - f0)
    rows = []
    for name, _ in configs:
        ratios = [t / p for t, p in zip(times[name], times["none"])]
        q1, q3 = quartiles(ratios)
        rows.append({
            "model": model, "impl": name,
            "held_after_forward_bytes": held[name],
            "held_ratio": held[name] / held["none"],
            "step_peak_bytes": peak[name],
            "step_ms_median": 1e3 * statistics.median(times[name]),
            "step_ratio_median": statistics.median(ratios),
            "step_ratio_q1": q1, "step_ratio_q3": q3,
            "page_faults_median": statistics.median(faults[name]),
            "rounds": len(times[name]),
        })
    return rows


def markdown(rows, a, command):
    lines = [
        f"Measured {datetime.date.today().isoformat()} by `{command}` "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, PyTorch "
        f"{torch.__version__}, {a.threads} threads, batch {a.batch_size}, gamma {a.gamma}, "
        f"{a.rounds} rounds).",
        "",
        "| model | configuration | held after forward MiB | vs plain | step peak MiB "
        "| median step ms | vs plain (median of per-round ratios) "
        "| interquartile range of the ratio | page faults per step |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = {"none": "plain PyTorch", "dropit": "dropit (every layer)",
             "dropit-unfused": "dropit (every layer), fuse_pool_relu=False",
             "dropit-no-ef": "dropit (every layer), positions without Elias-Fano",
             "dropit-store": "dropit (every layer) + store=\"all\", int8 (LayerNorm, softmax, "
                             "attention matmul inputs)",
             "dropit-low-memory": "dropit (every layer), low_memory=True (Conv2d in dropit's C++ "
                                  "convolution, in pieces)",
             "dropit-excl": "dropit (first layer and head dense)",
             "reference": "DropIT's method in PyTorch (topk, int32)",
             "floor": "hook floor: Linear/Conv inputs read once, restored as zeros (trains nothing)"}
    for r in rows:
        lines.append(
            f"| {r['model']} | {names[r['impl']]} | {r['held_after_forward_bytes'] / 2**20:.2f} | "
            f"{r['held_ratio']:.3f}x | {r['step_peak_bytes'] / 2**20:.2f} | "
            f"{r['step_ms_median']:.1f} | {r['step_ratio_median']:.3f}x | "
            f"{r['step_ratio_q1']:.3f}-{r['step_ratio_q3']:.3f} | {r['page_faults_median']:.0f} |")
    return "\n".join(lines) + "\n"


def steady_heap():
    """glibc serves every allocation under 32 MiB from its heap and never trims it, and that
    heap's first 512 MiB are mapped and written before the benchmark (see the module doc)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    if libc.mallopt(m_mmap_threshold, 32 << 20) != 1 or \
            libc.mallopt(m_trim_threshold, 1 << 30) != 1:
        raise SystemExit("python_step_bench: mallopt refused --steady-heap's settings")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 16 << 20  # under the mmap threshold: from the heap, and kept there once freed
    blocks = [libc.malloc(block) for _ in range(32)]
    if not all(blocks):
        raise SystemExit("python_step_bench: --steady-heap could not grow the heap to 512 MiB")
    for b in blocks:
        ctypes.memset(b, 1, block)
    for b in reversed(blocks):
        libc.free(b)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--models", nargs="+", default=["cnn", "vit"], choices=MODELS,
                   help="cnn-functional: the CNN calling F.relu / F.max_pool2d in its forward")
    p.add_argument("--steady-heap", action="store_true",
                   help="glibc keeps its heap, 512 MiB of it written first: no page faults after "
                   "the warm-up (module doc)")
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args()
    if a.steady_heap:
        steady_heap()
    torch.set_num_threads(a.threads)
    images, labels = fmnist.load("train", limit=a.batch_size * 16)
    rows = []
    for model in a.models:
        rows += bench_model(model, a, images, labels)
    command = "bench/python_step_bench.py " + " ".join(sys.argv[1:])
    text = markdown(rows, a, command.strip())
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "command": command.strip(),
                       "threads": a.threads, "batch": a.batch_size, "gamma": a.gamma,
                       "steady_heap": a.steady_heap,
                       "rows": rows}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
