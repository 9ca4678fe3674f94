"""DistributedDataParallel on Gloo, 2 processes, dropit on every rank (examples/python/
ddp_fashion_mnist.py), against one process computing the same steps.

MinK selects per saved tensor, so a rank keeps the top (1 - gamma) of ITS share of the batch. The
single-process run that equals DDP therefore runs the two shares one after the other and averages
their gradients (what DDP's all-reduce computes); a single process on the concatenated batch
equals it only when nothing is dropped (gamma = 0), which is checked too.
"""

import pytest
import torch
import torch.nn.functional as F

import ddp_fashion_mnist as ddp
import dropit
import fmnist

STEPS, BATCH, WORLD = 3, 32, 2
# DDP averages the ranks' gradients in a different order than one process adds them: the
# parameters agree to float32 rounding after a few SGD steps.
TOL = dict(rtol=1e-5, atol=1e-6)


def run_ddp(tmp_path, impl, gamma):
    out = tmp_path / f"{impl}-{gamma}"
    out.mkdir()
    a = ddp.parse(["--world-size", str(WORLD), "--model", "cnn", "--impl", impl, "--gamma",
                   str(gamma), "--steps", str(STEPS), "--batch-size", str(BATCH), "--limit",
                   str(STEPS * BATCH), "--seed", "3", "--optimizer", "sgd", "--lr", "0.05",
                   "--out", str(out)])
    ddp.launch(a)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def one_process(impl, gamma, concatenated):
    """The same steps in this process: the global batch at once, or share by share."""
    torch.manual_seed(3)
    net = fmnist.make_model("cnn")
    handle = dropit.to_dropit(net, "mink", gamma, seed=3) if impl == "dropit" else None
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x_all, y_all = fmnist.load("train", limit=STEPS * BATCH)
    generator = torch.Generator().manual_seed(4)
    order = torch.randperm(len(x_all), generator=generator)
    shares_saved = []
    for step in range(STEPS):
        idx = order[step * BATCH:(step + 1) * BATCH]
        opt.zero_grad()
        if concatenated:
            F.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
        else:
            for r in range(WORLD):
                share = ddp.shard(idx, r, WORLD)
                loss = F.cross_entropy(net(x_all[share]), y_all[share]) / WORLD
                shares_saved.append(dropit.live_saved_bytes())
                loss.backward()
        opt.step()
    if handle is not None:
        handle.remove()
    return net.state_dict(), shares_saved


@pytest.fixture(autouse=True)
def _loopback(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")


def test_ddp_with_dropit_matches_one_process(tmp_path):
    ranks = run_ddp(tmp_path, "dropit", 0.9)
    # The ranks stay identical, bit for bit.
    for key, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][key]), key
    # They equal one process that runs each rank's share with dropit and averages.
    params, shares_saved = one_process("dropit", 0.9, concatenated=False)
    for key, value in params.items():
        torch.testing.assert_close(ranks[0]["params"][key], value, **TOL)
    # Each rank's packs are those of one process on the same share: the saving holds per rank.
    for r in range(WORLD):
        for step in range(STEPS):
            want = shares_saved[step * WORLD + r]
            assert ranks[r]["sparse"][step] == want.sparse
            assert ranks[r]["masks"][step] == want.masks
    # And the concatenated batch selects differently: the equality above is not a tautology.
    params_cat, _ = one_process("dropit", 0.9, concatenated=True)
    assert not all(torch.allclose(params[k], params_cat[k], **TOL) for k in params)


def test_ddp_saves_less_on_every_rank(tmp_path):
    plain = run_ddp(tmp_path, "none", 0.9)
    converted = run_ddp(tmp_path, "dropit", 0.9)
    for r in range(WORLD):
        assert max(plain[r]["sparse"] + plain[r]["masks"]) == 0
        # What the graph holds after forward (the counting allocator, last step): at most 15% of
        # the plain rank's, as on one process (tests/test_memory.py).
        assert converted[r]["held"][-1] <= 0.15 * plain[r]["held"][-1]


def test_ddp_lossless_dropit_equals_the_concatenated_batch(tmp_path):
    ranks = run_ddp(tmp_path, "dropit", 0.0)
    params, _ = one_process("none", 0.0, concatenated=True)
    for key, value in params.items():
        torch.testing.assert_close(ranks[0]["params"][key], value, **TOL)
        assert torch.equal(ranks[0]["params"][key], ranks[1]["params"][key])
