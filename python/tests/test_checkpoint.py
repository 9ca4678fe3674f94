"""dropit inside torch.utils.checkpoint, both forms: the gradients are dropit's without
checkpointing (MinK: the weight gradients of the sparsified inputs, not plain PyTorch's), and
what the graph keeps after forward is what each form promises: the reentrant form runs the
segment without grad (nothing of it packed; dropit packs during the recompute), the non-reentrant
form keeps dropit's packs of the segment (its own hook never sees the tensors dropit packs)."""
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import dropit


def make():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 10))


def step(segment_mode, convert=True):
    """One forward and backward; the first five modules in a checkpoint (segment_mode: None for
    no checkpoint, else use_reentrant). Returns (gradients, dropit's saved bytes after forward)."""
    model = make()
    if convert:
        dropit.to_dropit(model, "mink", 0.9)
    torch.manual_seed(2)
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    before = dropit.live_saved_bytes().total
    if segment_mode is None:
        y = model(x)
    else:
        y = model[5:](checkpoint(model[:5], x, use_reentrant=segment_mode))
    held = dropit.live_saved_bytes().total - before
    y.square().sum().backward()
    assert dropit.live_saved_bytes().total == before
    return [p.grad for p in model.parameters()] + [x.grad], held


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_segment_gives_dropits_gradients(use_reentrant):
    want, held_plain = step(None)
    got, held = step(use_reentrant)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    exact, _ = step(None, convert=False)
    assert not torch.allclose(got[0], exact[0])  # conv weight: from the sparsified input
    assert torch.allclose(got[-1], exact[-1], atol=1e-6)  # input gradient: exact
    if use_reentrant:
        assert 0 < held < held_plain  # the segment packed nothing in forward
    else:
        assert held == held_plain  # dropit's packs of the segment kept, not recomputed
