"""Copies of a hooked model: copy.deepcopy and torch.save / torch.load keep dropit's hooks, as
PyTorch keeps every module hook; the copy saves what a fresh to_dropit would, on its own modules."""
import copy
import gc
import io
import pickle

import pytest
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import dropit


class Net(nn.Module):
    """One layer of each hooked kind: convolution, ReLU, MaxPool2d, LeakyReLU, ReLU6, Linear and
    nn.MultiheadAttention (whose projections are routed by identity of its own weights)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.leaky = nn.LeakyReLU(0.2)
        self.relu6 = nn.ReLU6()
        self.attn = nn.MultiheadAttention(8, 2)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.relu6(self.leaky(self.pool(self.relu(self.conv(x)))))  # (N, 8, 4, 4)
        seq = h.flatten(2).permute(2, 0, 1)  # (16, N, 8)
        a, _ = self.attn(seq, seq, seq, need_weights=False)
        return self.head(a.mean(0))


def _step(model, x):
    """Output, live packed bytes after forward, and the parameters' and input's gradients."""
    x = x.detach().requires_grad_(True)
    y = model(x)
    held = dropit.live_saved_bytes()
    grads = torch.autograd.grad(y.square().sum(), [x, *model.parameters()])
    return y.detach(), held, grads


def _same_step(model, oracle, x):
    y, held, grads = _step(model, x)
    y0, held0, grads0 = _step(oracle, x)
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, rtol=0, atol=0)
    assert held == held0
    assert held.sparse > 0 and held.masks > 0
    return held


def _fresh(model, **kw):
    """The oracle: a plain copy of model's weights with a fresh to_dropit."""
    oracle = copy.deepcopy(model)
    dropit.remove_hooks(oracle)
    dropit.to_dropit(oracle, **kw)
    return oracle


def test_a_deepcopy_keeps_the_hooks_on_its_own_modules():
    # Before, the copy's hooks read the original's modules: with the original gone a LeakyReLU's
    # pack raised (a dead weak reference), and the copy's attention projections, no longer the
    # original's weights, were never routed (nothing packed).
    torch.manual_seed(0)
    model = Net()
    dropit.to_dropit(model, "mink", 0.9)
    twin = copy.deepcopy(model)
    del model
    gc.collect()
    x = torch.randn(2, 3, 8, 8)
    _same_step(twin, _fresh(twin, strategy="mink", gamma=0.9), x)


def test_torch_save_and_load_keep_the_hooks():
    torch.manual_seed(1)
    model = Net()
    dropit.to_dropit(model, "mink", 0.8, store="all")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    x = torch.randn(2, 3, 8, 8)
    _same_step(loaded, _fresh(loaded, strategy="mink", gamma=0.8, store="all"), x)
    # the original is unchanged and still hooked
    _same_step(model, _fresh(model, strategy="mink", gamma=0.8, store="all"), x)


def test_random_positions_continue_in_a_copy():
    # A copy carries each layer's step count: its next step draws what the original's would.
    torch.manual_seed(2)
    model = Net()
    dropit.to_dropit(model, "random", 0.9, seed=7)
    x = torch.randn(2, 3, 8, 8)
    _step(model, x)
    twin = pickle.loads(pickle.dumps(model))
    _, _, grads = _step(twin, x)
    _, _, grads0 = _step(model, x)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, rtol=0, atol=0)


def test_remove_hooks_takes_a_copys_hooks_off():
    model = Net()
    handle = dropit.to_dropit(model)
    twin = copy.deepcopy(model)
    with pytest.raises(dropit.Error, match="remove_hooks"):
        dropit.to_dropit(twin)
    hooked = len(handle)
    assert dropit.remove_hooks(twin) == hooked
    assert dropit.remove_hooks(twin) == 0
    x = torch.randn(2, 3, 8, 8)
    _, held, _ = _step(twin, x)
    assert held.total == 0
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in twin.modules())
    dropit.to_dropit(twin)  # now allowed
    _same_step(twin, model, x)
    handle.remove()
    with pytest.raises(TypeError, match="nn.Module"):
        dropit.remove_hooks("model")


def test_hooks_loaded_in_a_fresh_process_keep_their_numbers():
    # PyTorch files hooks under numbers from a process-wide counter: in a process that loads a
    # hooked model (simulated by resetting the counter), a hook registered afterwards must not
    # take a loaded hook's number and replace it.
    saved_next = RemovableHandle.next_id
    try:
        RemovableHandle.next_id = 0  # the model is hooked first thing in its process
        model = Net()
        dropit.to_dropit(model)
        data = pickle.dumps(model)
        RemovableHandle.next_id = 0  # and loaded first thing in another
        loaded = pickle.loads(data)
        ids = 2 * sum(1 for _ in loaded.modules())  # every number the loaded hooks may have
        for m in loaded.modules():
            for _ in range(ids):
                m.register_forward_hook(lambda *args: None)
            for _ in range(ids):
                m.register_forward_pre_hook(lambda *args: None)
    finally:
        RemovableHandle.next_id = max(saved_next, RemovableHandle.next_id)

    def dropit_hooks(net):
        return [type(h).__name__ for m in net.modules()
                for h in (*m._forward_pre_hooks.values(), *m._forward_hooks.values())
                if type(h).__module__ == "dropit._hooks"]

    assert sorted(dropit_hooks(loaded)) == sorted(dropit_hooks(model))
    assert len(dropit_hooks(model)) == 2 * sum(1 for m in model.modules() if m._forward_hooks)


@pytest.mark.parametrize("policy", [dropit.MinK(0.9, codec="int8"), dropit.Random(0.5, seed=3),
                                    dropit.Identity(codec="fp8"), dropit.Policy("none"),
                                    dropit.MinK(0.7).with_seed(11),
                                    dropit.Policy("random", 0.25, 9, "exact", "no_elias_fano")],
                         ids=["mink", "random", "identity", "none", "with_seed", "policy"])
def test_policies_pickle_and_copy(policy):
    for twin in (pickle.loads(pickle.dumps(policy)), copy.deepcopy(policy)):
        assert twin == policy
        assert type(twin) is type(policy)
        assert repr(twin) == repr(policy)


def test_a_policy_pickle_is_checked_on_load():
    # the constructor's arguments, validated again: a bad gamma raises dropit's error
    data = pickle.dumps(dropit.Policy("mink", 0.5, 0, "exact", "smallest"), protocol=0)
    bad = data.replace(b"F0.5", b"F1.5")
    assert bad != data
    with pytest.raises(dropit.Error, match="gamma"):
        pickle.loads(bad)
