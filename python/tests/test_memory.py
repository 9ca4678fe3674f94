"""Memory: the counting allocator, and what the Fashion-MNIST models hold after forward."""
import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit


def test_memory_counter_counts_cpu_allocations():
    with dropit.memory_counter() as counter:
        assert counter.active
        start = counter.current_bytes
        t = torch.empty(1 << 20)
        assert counter.current_bytes - start == 4 << 20
        assert counter.peak_bytes >= counter.current_bytes
        del t
        assert counter.current_bytes == start
        assert counter.reset_peak() == start and counter.peak_bytes == start
        p = dropit.pack(torch.randn(100_000), dropit.MinK(0.9))  # payloads are counted too
        assert counter.current_bytes - start >= p.nbytes
        with pytest.raises(dropit.Error, match="another memory_counter is active"):
            with dropit.memory_counter():
                pass
    assert not counter.active
    with dropit.memory_counter() as again:  # one after the other is fine
        assert again.active


def held_after_forward(net, x, labels):
    """Bytes the graph holds after forward (what backward will read), by the counting allocator."""
    with dropit.memory_counter() as counter:
        before = counter.current_bytes
        loss = F.cross_entropy(net(x), labels)
        held = counter.current_bytes - before
        live = dropit.live_saved_bytes()
        loss.backward()
        after = counter.current_bytes - before
    return held, live, after


@pytest.mark.parametrize("model,bound", [("cnn", 0.15), ("vit", 0.7)])
def test_models_hold_less_after_forward(model, bound):
    import fmnist

    net = fmnist.make_model(model)
    converted = copy.deepcopy(net)
    dropit.to_dropit(converted, "mink", 0.9)
    x, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    plain_held, plain_live, _ = held_after_forward(net, x, labels)
    held, live, after = held_after_forward(converted, x, labels)
    assert plain_live.total == 0
    assert 0 < live.total <= held
    assert held <= bound * plain_held, (held, plain_held)
    assert dropit.live_saved_bytes().total == 0  # backward freed every pack


def _graph_tensors():
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is torch.Tensor and o.grad_fn is not None)


@pytest.mark.parametrize("case", ["attention", "encoder", "saved_tensors"])
def test_a_forward_dropped_without_backward_frees_its_graph(case):
    # A pack hook that hands PyTorch 1.13 back a saved tensor with a grad_fn (the attention's
    # softmax output, q, k) keeps the whole graph alive when it is dropped without backward (an
    # evaluation in training mode, a skipped step): the hooks hand back detached aliases.
    x = torch.randn(10, 3, 64)
    if case == "encoder":
        net = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1), 2)
    else:
        net = nn.MultiheadAttention(64, 4)
    run = (lambda: net(x)) if case == "encoder" else (lambda: net(x, x, x)[0])
    handle = dropit.to_dropit(net) if case != "saved_tensors" else None
    start = _graph_tensors()
    for _ in range(3):
        if case == "saved_tensors":
            with dropit.saved_tensors(dropit.Identity()):
                y = run()
        else:
            y = run()
            assert dropit.live_saved_bytes().total > 0
        del y
        assert _graph_tensors() == start
        assert dropit.live_saved_bytes().total == 0
    if handle is not None:
        handle.remove()
