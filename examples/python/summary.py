#!/usr/bin/env python3
"""Summarises the CSV of examples/python/fashion_mnist.py runs: one row per (model, configuration)
with the mean over seeds (each seed's value in parentheses) and the change against plain PyTorch;
writes the Markdown table and a data file for plot.gp.

    summary.py RUNS.csv OUT.md OUT.dat "COMMAND"
"""
import csv
import statistics
import sys
from collections import defaultdict

LABELS = {
    ("none", "-"): "plain PyTorch",
    ("dropit", "excl"): "dropit, first layer and head dense",
    ("dropit", "all"): "dropit, every layer",
    ("reference", "excl"): "DropIT's method in PyTorch, first layer and head dense",
    ("reference", "all"): "DropIT's method in PyTorch, every layer",
}
ORDER = list(LABELS)


def key(row):
    if row["impl"] == "none":
        return ("none", "-")
    return (row["impl"], "all" if row["exclude"] == "-" else "excl")


def main(path, md_path, dat_path, command):
    groups = defaultdict(list)
    for row in csv.DictReader(open(path)):
        groups[(row["model"], key(row), row["policy"], row["gamma"])].append(row)
    lines = [
        f"Means over seeds (each seed in parentheses), {command}; memory from dropit's counting "
        "CPU allocator, the largest over all steps after the first; step time is the median step "
        "of the run (the training runs share the machine: bench/python_step_bench.py measures "
        "time in one interleaved run).",
        "",
        "| model | configuration | gamma | seeds | test accuracy % | vs plain | activation MiB | "
        "saved after forward MiB | vs plain | dropit packs MiB (sparse + masks) | median step ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    dat = ["# model config accuracy_mean accuracy_min accuracy_max saved_mib"]
    for model in ("cnn", "vit"):
        rows = sorted((k for k in groups if k[0] == model), key=lambda k: ORDER.index(k[1]))
        base = next((groups[k] for k in rows if k[1] == ("none", "-")), None)
        base_acc = statistics.mean(float(r["test_acc"]) for r in base) if base else None
        base_saved = statistics.mean(float(r["saved_after_forward_bytes"]) for r in base) if base else None
        for i, k in enumerate(rows):
            runs = sorted(groups[k], key=lambda r: int(r["seed"]))
            accs = [float(r["test_acc"]) for r in runs]
            acc = statistics.mean(accs)
            saved = statistics.mean(float(r["saved_after_forward_bytes"]) for r in runs)
            act = statistics.mean(float(r["activation_bytes"]) for r in runs)
            sparse = statistics.mean(float(r["dropit_sparse_bytes"]) for r in runs)
            masks = statistics.mean(float(r["dropit_mask_bytes"]) for r in runs)
            ms = statistics.mean(float(r["step_ms_median"]) for r in runs)
            d_acc = "" if k[1] == ("none", "-") or base_acc is None else f"{acc - base_acc:+.2f}"
            d_saved = "" if k[1] == ("none", "-") or not base_saved else f"{saved / base_saved:.3f}x"
            each = " / ".join(f"{a:.2f}" for a in accs)
            gamma = "-" if k[1] == ("none", "-") else f"{k[2]} {k[3]}"
            lines.append(
                f"| {model} | {LABELS[k[1]]} | {gamma} | {len(runs)} | {acc:.2f} ({each}) | {d_acc} | "
                f"{act / 2**20:.2f} | {saved / 2**20:.2f} | {d_saved} | "
                f"{sparse / 2**20:.2f} + {masks / 2**20:.2f} | {ms:.1f} |")
            dat.append(f'{model} "{LABELS[k[1]]}" {acc:.3f} {min(accs):.3f} {max(accs):.3f} '
                       f"{saved / 2**20:.3f} {i}")
        dat.append("")
        dat.append("")
    open(md_path, "w").write("\n".join(lines) + "\n")
    open(dat_path, "w").write("\n".join(dat) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
