#!/usr/bin/env python3
"""Trains the Fashion-MNIST CNN or ViT of the C++ example in PyTorch from Python, plainly, with
dropit (one call: ``dropit.to_dropit``), or with DropIT's method written in plain PyTorch, and
reports MEASURED memory (dropit's counting CPU allocator), accuracy and step time.

    fashion_mnist.py --model cnn|vit --impl none|dropit|reference --policy mink|random --gamma G
                     --epochs E --batch-size B --limit N --seed S --csv FILE [--masks on|off]
                     [--store layernorm|gelu|softmax|matmul|dropout|batchnorm|activation|all ... --store-codec int8|fp8]
                     [--layer-gamma NAME=G ...] [--low-memory]
                     [--threads T] [--exclude NAME]... [--reference-exclude] [--data DIR]

Exit codes: 0 done (and the training loss fell), 1 the loss did not fall, 2 bad arguments,
77 the data set is missing.
"""
import argparse
import datetime
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402

try:
    import dropit
except ImportError as e:  # pragma: no cover - a message for people running it by hand
    raise SystemExit(
        f"fashion_mnist.py: cannot import dropit ({e}); build it with scripts/test or\n"
        "  pip install --no-build-isolation ./python  (in a venv made with --system-site-packages)"
    ) from e

CSV_HEADER = (
    "date,model,impl,policy,gamma,masks,exclude,seed,epochs,batch,samples,threads,test_acc,"
    "activation_bytes,saved_after_forward_bytes,dropit_sparse_bytes,dropit_mask_bytes,"
    "step_ms_median,epoch_s,first_loss,last_loss\n"
)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["cnn", "vit"], default="cnn")
    p.add_argument("--impl", choices=["none", "dropit", "reference"], default="dropit",
                   help="none: plain PyTorch; dropit: dropit.to_dropit; reference: DropIT's "
                        "method in plain PyTorch (topk, int32 indices)")
    p.add_argument("--policy", choices=["mink", "random"], default="mink")
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="training samples (0: all 60000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", default="")
    p.add_argument("--masks", choices=["on", "off"], default="on")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--exclude", action="append", default=[],
                   help="a module left as PyTorch runs it, by name (e.g. 0, patch, head)")
    p.add_argument("--reference-exclude", action="store_true",
                   help="DropIT's own exclusions: the first layer and the classifier head dense")
    p.add_argument("--layer-gamma", action="append", default=[], metavar="NAME=G",
                   help="a layer's own gamma (the longest matching module name wins); repeat")
    p.add_argument("--low-memory", action="store_true",
                   help="Conv2d layers in dropit's C++ convolution too (in pieces: lower peak)")
    p.add_argument("--store", action="append", default=[],
                   choices=list(dropit.STORE_CLASSES) + ["all"],
                   help="a class of the tensors DropIT leaves dense to keep through --store-codec "
                        "(dropout: as bits); repeat for more")
    p.add_argument("--store-codec", choices=["int8", "fp8", "exact"], default="int8")
    p.add_argument("--data", default=fmnist.DATA_DIR)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        a.layer_gamma = {k: float(v) for k, v in (item.rsplit("=", 1) for item in a.layer_gamma)}
    except ValueError:
        p.error("--layer-gamma takes NAME=GAMMA")
    if a.reference_exclude:
        a.exclude = sorted(set(a.exclude) | set(fmnist.REFERENCE_EXCLUDE[a.model]))
    if a.impl == "reference" and a.policy != "mink":
        p.error("--impl reference implements DropIT's min-k only")
    return a


def store_suffix(a):
    """' + gamma:NAME=G' per --layer-gamma, ' + store:CLASSES:CODEC' for --store and
    ' + low_memory' (dropit only), else ''."""
    if a.impl != "dropit":
        return ""
    out = "".join(f" + gamma:{k}={v:g}" for k, v in sorted(a.layer_gamma.items()))
    if a.low_memory:
        out += " + low_memory"
    if a.store:
        classes = "all" if "all" in a.store else ";".join(a.store)
        out += f" + store:{classes}:{a.store_codec}"
    return out


def mib(b):
    return f"{b / 2**20:.2f}"


def evaluate(net, images, labels, batch=1000):
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(images), batch):
            correct += (net(images[i:i + batch]).argmax(1) == labels[i:i + batch]).sum().item()
    net.train()
    return 100.0 * correct / len(images)


def convert(net, a):
    """Applies --impl to the model; returns a line saying what was done."""
    if a.impl == "dropit":
        store = dropit.STORE_CLASSES if "all" in a.store else tuple(a.store)
        handle = dropit.to_dropit(net, a.policy, a.gamma, exclude=a.exclude, masks=a.masks == "on",
                                  seed=a.seed, store=store, store_codec=a.store_codec,
                                  layer_gamma=a.layer_gamma, low_memory=a.low_memory)
        kinds = [k for _, k in handle.layers]
        stored = (f"; {', '.join(store)} stored as {a.store_codec} "
                  f"({len(kinds) - sum(map(kinds.count, ('weight', 'relu', 'pool')))} modules)"
                  if store else "")
        return (f"dropit: {kinds.count('weight')} Linear/Conv layers, {kinds.count('relu')} ReLU "
                f"and {kinds.count('pool')} MaxPool2d hooked{stored}")
    if a.impl == "reference":
        names = {n for n, _ in net.named_modules()}
        unknown = [e for e in a.exclude if e not in names]
        if unknown:
            raise dropit.Error(f"--exclude: no module named {', '.join(unknown)}")
        return f"reference: {fmnist.reference_to_dropit(net, a.gamma, a.exclude)} layers swapped"
    return "plain PyTorch"


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    try:
        train_x, train_y = fmnist.load("train", a.data, a.limit)
        test_x, test_y = fmnist.load("t10k", a.data)
    except SystemExit as e:
        print(f"fashion_mnist.py: {e}", file=sys.stderr)
        return 77
    net = fmnist.make_model(a.model)
    try:
        what = convert(net, a)
    except dropit.Error as e:
        print(f"fashion_mnist.py: {e}", file=sys.stderr)
        return 2
    optimizer = torch.optim.AdamW(net.parameters(), lr=a.lr,
                                  weight_decay=0.05 if a.model == "vit" else 0.0)
    n = len(train_x)
    steps_per_epoch = math.ceil(n / a.batch_size)
    total_steps = steps_per_epoch * a.epochs
    policy = "-" if a.impl == "none" else f"{a.policy} {a.gamma}{store_suffix(a)}"
    print(f"fashion_mnist.py: model {a.model}, {a.impl} ({policy}), masks {a.masks}, {n} training "
          f"samples, batch {a.batch_size}, {a.epochs} epochs, {a.threads} threads; {what}")
    if a.exclude:
        print(f"  excluded (dense saved input): {', '.join(a.exclude)}")

    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety (Debian: python3-tqdm)
        tqdm = None
    generator = torch.Generator().manual_seed(a.seed + 1)
    max_activation = max_saved = max_sparse = max_masks = 0
    losses, step_ms, accuracy, epoch_s = [], [], 0.0, 0.0
    step = 0
    with dropit.memory_counter() as counter:
        for epoch in range(1, a.epochs + 1):
            order = torch.randperm(n, generator=generator)
            bar = None
            if tqdm is not None and not a.no_progress:
                bar = tqdm(total=n, desc=f"epoch {epoch}/{a.epochs}", unit="img", leave=False,
                           file=sys.stderr)
            start, loss_sum, seen = time.perf_counter(), 0.0, 0
            for b in range(0, n, a.batch_size):
                lr = a.lr * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
                for group in optimizer.param_groups:
                    group["lr"] = lr
                t0 = time.perf_counter()
                idx = order[b:b + a.batch_size]
                x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
                optimizer.zero_grad(set_to_none=False)
                # The step's memory: allocated from here to the end of backward, over what was
                # held before (parameters, gradients, optimiser state, data, this batch).
                held = counter.reset_peak()
                loss = F.cross_entropy(net(x), y)
                after_forward = counter.current_bytes
                live = dropit.live_saved_bytes()
                loss.backward()
                peak = counter.peak_bytes
                optimizer.step()
                step_ms.append(1e3 * (time.perf_counter() - t0))
                if step > 0:  # the first step also allocates gradients and optimiser state
                    max_activation = max(max_activation, peak - held)
                    max_saved = max(max_saved, after_forward - held)
                    if live.total > max_sparse + max_masks:
                        max_sparse, max_masks = live.sparse, live.masks
                value = loss.item()
                losses.append(value)
                loss_sum += value * len(idx)
                seen += len(idx)
                step += 1
                if bar is not None:
                    bar.set_postfix(loss=f"{loss_sum / seen:.4f}", refresh=False)
                    bar.update(len(idx))
            if bar is not None:
                bar.close()
            epoch_s = time.perf_counter() - start
            accuracy = evaluate(net, test_x, test_y)
            print(f"epoch {epoch}: train loss {loss_sum / seen:.4f}, test accuracy {accuracy:.2f}%, "
                  f"{epoch_s:.1f} s", flush=True)

    fifth = max(1, len(losses) // 5)
    first_loss, last_loss = statistics.mean(losses[:fifth]), statistics.mean(losses[-fifth:])
    median_ms = statistics.median(step_ms)
    print("\n| model | impl | policy | test acc % | activation MiB | saved after forward MiB | "
          "dropit cache MiB (sparse + masks) | median step ms | epoch s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {a.model} | {a.impl} | {policy} | {accuracy:.2f} | {mib(max_activation)} | "
          f"{mib(max_saved)} | {mib(max_sparse)} + {mib(max_masks)} | {median_ms:.1f} | "
          f"{epoch_s:.1f} |")
    print(f"loss fell: {'yes' if last_loss < first_loss else 'no'} (first fifth {first_loss:.4f}, "
          f"last fifth {last_loss:.4f})")
    if a.csv:
        fresh = not os.path.exists(a.csv)
        with open(a.csv, "a") as f:
            if fresh:
                f.write(CSV_HEADER)
            f.write(",".join(str(v) for v in [
                datetime.date.today().isoformat(), a.model, a.impl,
                "-" if a.impl == "none" else a.policy + store_suffix(a).replace(" ", ""),
                0 if a.impl == "none" else a.gamma,
                a.masks if a.impl == "dropit" else "off", ";".join(a.exclude) or "-", a.seed,
                a.epochs, a.batch_size, n, a.threads, f"{accuracy:.2f}", max_activation, max_saved,
                max_sparse, max_masks, f"{median_ms:.3f}", f"{epoch_s:.2f}", f"{first_loss:.5f}",
                f"{last_loss:.5f}"]) + "\n")
    return 0 if last_loss < first_loss else 1


if __name__ == "__main__":
    sys.exit(main())
