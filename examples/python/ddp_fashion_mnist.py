#!/usr/bin/env python3
"""Trains the Fashion-MNIST CNN or ViT with DistributedDataParallel on the Gloo backend, several
processes on one machine, with dropit on every rank: each rank calls ``dropit.to_dropit`` on its
replica, trains on its share of every global batch, and reports what its graph held after
forward.

    ddp_fashion_mnist.py --world-size 2 --model cnn --impl none|dropit --gamma 0.9 --epochs 1
                         --batch-size 128 --limit N --seed S --threads 1 [--exclude NAME]...

The global batch is split in equal consecutive shares (rank r takes rows [r B/W, (r+1) B/W)), so a
run is reproducible and comparable with one process. dropit's selection is per saved tensor: each
rank keeps the top (1 - gamma) of its own share's activations.
"""
import argparse
import math
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", choices=["cnn", "vit"], default="cnn")
    p.add_argument("--impl", choices=["none", "dropit"], default="dropit")
    p.add_argument("--strategy", choices=["mink", "random"], default="mink")
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: epochs)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch, split over ranks")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads per rank")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--exclude", action="append", default=[])
    p.add_argument("--data", default=fmnist.DATA_DIR)
    p.add_argument("--out", default="", help="each rank saves its parameters and figures here")
    a = p.parse_args(argv)
    if a.batch_size % a.world_size:
        p.error("--batch-size must be a multiple of --world-size")
    return a


def shard(batch, rank, world):
    """Rank r's share of a global batch: rows [r B/W, (r+1) B/W)."""
    per = len(batch) // world
    return batch[rank * per:(rank + 1) * per]


def make_optimizer(params, a):
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.lr)
    return torch.optim.AdamW(params, lr=a.lr, weight_decay=0.05 if a.model == "vit" else 0.0)


def run_rank(rank, a, port):
    """One rank: Gloo process group, the model with dropit, DDP, the training loop."""
    import dropit

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=a.world_size)
    try:
        torch.manual_seed(a.seed)  # the same initial weights on every rank
        net = fmnist.make_model(a.model)
        if a.impl == "dropit":
            dropit.to_dropit(net, a.strategy, a.gamma, exclude=a.exclude, seed=a.seed)
        model = DistributedDataParallel(net)
        optimizer = make_optimizer(model.parameters(), a)
        train_x, train_y = fmnist.load("train", a.data, a.limit)
        per_epoch = len(train_x) // a.batch_size  # whole global batches only
        steps = a.steps or a.epochs * per_epoch
        generator = torch.Generator().manual_seed(a.seed + 1)  # the same order on every rank
        held, sparse, masks, losses = [], [], [], []
        with dropit.memory_counter() as counter:
            for step in range(steps):
                if step % per_epoch == 0:
                    order = torch.randperm(len(train_x), generator=generator)
                b = (step % per_epoch) * a.batch_size
                idx = shard(order[b:b + a.batch_size], rank, a.world_size)
                x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
                optimizer.zero_grad()
                before = counter.current_bytes
                loss = F.cross_entropy(model(x), y)
                held.append(counter.current_bytes - before)
                live = dropit.live_saved_bytes()
                sparse.append(live.sparse)
                masks.append(live.masks)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        if rank == 0:
            print(f"ddp_fashion_mnist.py: {a.world_size} ranks, {a.model}, {a.impl}, {steps} steps "
                  f"of {a.batch_size} ({a.batch_size // a.world_size} per rank)")
            print(f"  rank 0: held after forward {held[-1] / 2**20:.2f} MiB (dropit packs "
                  f"{sparse[-1] / 2**20:.2f} + {masks[-1] / 2**20:.2f} MiB), loss {losses[0]:.4f} "
                  f"-> {losses[-1]:.4f}")
        if a.out:
            torch.save({"params": {k: v.detach().clone() for k, v in net.state_dict().items()},
                        "held": held, "sparse": sparse, "masks": masks, "losses": losses},
                       os.path.join(a.out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    """Runs every rank in its own process (spawned) and waits for them."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(run_rank, args=(a, free_port()), nprocs=a.world_size, join=True)


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    if not a.out:
        with tempfile.TemporaryDirectory() as out:
            a.out = out
            launch(a)
            results = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(a.world_size)]
    else:
        launch(a)
        results = [torch.load(os.path.join(a.out, f"rank{r}.pt")) for r in range(a.world_size)]
    same = all(torch.equal(results[0]["params"][k], r["params"][k])
               for r in results[1:] for k in results[0]["params"])
    print(f"  ranks' parameters identical: {'yes' if same else 'NO'}")
    for r, res in enumerate(results):
        print(f"  rank {r}: held after forward {max(res['held'][1:] or res['held']) / 2**20:.2f} MiB")
    return 0 if same and math.isfinite(results[0]["losses"][-1]) else 1


if __name__ == "__main__":
    sys.exit(main())
