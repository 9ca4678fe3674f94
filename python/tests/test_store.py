"""to_dropit(store=...): the tensors DropIT leaves dense kept through a value codec, one class at a
time. The oracle is PyTorch itself: the same model run plainly, every tensor its graph saves read
back through autograd and compared with what the hooked run's backward receives (the codec of
reference.py applied to it, or the tensor unchanged), and its gradients."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit
import reference
from conftest import gated


class Holder(nn.Module):
    """An activation module that holds its function and calls it (Hugging Face's GELUActivation
    holds F.gelu)."""

    def __init__(self, fn):
        super().__init__()
        self.act = fn

    def forward(self, x):
        return self.act(x)


class Mixer(nn.Module):
    """A block with every module store= knows outside attention."""

    def __init__(self, dim=48):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim, bias=False)  # a BatchNorm follows: no bias to learn
        self.bn = nn.BatchNorm1d(2 * dim)  # over (batch, channels, tokens)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.25)
        self.ln = nn.LayerNorm(2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.act2 = nn.SiLU()
        self.soft = nn.Softmax(dim=-1)

    def forward(self, x):
        h = self.bn(self.fc1(x).transpose(1, 2)).transpose(1, 2)
        return self.soft(self.act2(self.fc2(self.ln(self.drop(self.act(h))))))


class Net(nn.Module):
    """Mixer, a LayerNorm and the example ViT's attention (Linear modules around functional
    matmuls and softmax)."""

    def __init__(self, dim=48):
        super().__init__()
        import fmnist

        self.mix = Mixer(dim)
        self.ln = nn.LayerNorm(dim)
        self.attn = fmnist.Attention(dim, 4)

    def forward(self, x):
        return self.attn(self.ln(self.mix(x)))


class MHA(nn.Module):
    """nn.MultiheadAttention: every step functional, its projections included."""

    def __init__(self, dim=48):
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, 3, batch_first=True)

    def forward(self, h):
        return self.mha(h, h, h, need_weights=False)[0]


def graph(y):
    """The nodes of y's autograd graph, breadth first from y (deterministic for one structure)."""
    out, seen, frontier = [], set(), [y.grad_fn]
    while frontier:
        node = frontier.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        frontier.extend(n for n, _ in node.next_functions)
    return out


def saved_tensors(node):
    """(name, tensor) of what node saved, read through autograd (unpack hooks run)."""
    out = []
    for attr in dir(node):
        if attr.startswith("_saved_"):
            v = getattr(node, attr)
            if isinstance(v, torch.Tensor):
                out.append((attr, v))
    return out


def from_softmax(node):
    """node is a softmax, or reshapes one's output."""
    for _ in range(5):
        if node is None:
            return False
        name = type(node).__name__
        if name == "SoftmaxBackward0":
            return True
        if not name.startswith(("View", "ReshapeAlias", "UnsafeView", "Expand", "Clone")):
            return False
        node = node.next_functions[0][0]
    return False


def stored_class(node, attr, t, params):
    """The store= class of a saved tensor t, from the plain graph alone (None: kept as it is)."""
    name = type(node).__name__
    if name == "NativeLayerNormBackward0" and attr == "_saved_input":
        return "layernorm"
    if name == "NativeBatchNormBackward0" and attr == "_saved_input":
        return "batchnorm"
    if name in ACTIVATION_NODES and attr in ("_saved_self", "_saved_result"):
        return "activation"
    if name == "GeluBackward0" and attr == "_saved_self":
        return "gelu"
    if name == "SoftmaxBackward0" and attr == "_saved_result":
        return "softmax"
    if name == "BmmBackward0":  # the attention's matmuls (both modules)
        operand = node.next_functions[0 if attr == "_saved_self" else 1][0]
        return "softmax" if from_softmax(operand) else "matmul"
    return None


ACTIVATION_NODES = {"SiluBackward0", "MishBackward0", "HardswishBackward0",
                    "HardsigmoidBackward0", "EluBackward0", "EluBackward1", "CeluBackward0",
                    "SoftplusBackward0", "TanhBackward0", "SigmoidBackward0"}


def mha_class(node, attr, t, params):
    """Inside nn.MultiheadAttention every saved activation is a matmul input or a softmax output;
    the parameters (and views of them) are saved as they are."""
    if not t.is_floating_point() or t.dim() == 0 or t.data_ptr() in params:
        return None
    if type(node).__name__ == "SoftmaxBackward0" or from_softmax(t.grad_fn):
        return "softmax"
    return "matmul"


def quantized(t, codec):
    """The codec over t's elements in memory order when t is dense (a permutation of a
    contiguous tensor, as a transposed k is), else in row-major order (a copy is packed)."""
    t = t.detach()
    perm = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    mem = t.permute(perm)
    if not mem.is_contiguous():
        perm, mem = list(range(t.dim())), t.contiguous()
    flat = mem.reshape(-1)
    q = reference.quantize_kept(flat, torch.arange(flat.numel()), codec).view(mem.shape)
    return q.permute([perm.index(d) for d in range(t.dim())])


def run(net, x, seed=5):
    torch.manual_seed(seed)  # the same dropout noise in both runs
    y = net(x)
    return y


def check_saved(net, store, codec, x, classify=stored_class):
    """Hooks net with store=`store` (strategy none), runs it next to an unhooked copy, and
    checks every saved tensor and the gradients. Returns the dense bytes the codec replaced."""
    plain = copy.deepcopy(net)
    handle = dropit.to_dropit(net, "none", masks=False, store=store, store_codec=codec)
    y, y0 = run(net, x), run(plain, x)
    assert torch.equal(y, y0)  # forward untouched
    nodes, nodes0 = graph(y), graph(y0)
    assert [type(n).__name__ for n in nodes] == [type(n).__name__ for n in nodes0]
    seen_classes, stored = set(), {}
    params = {p.data_ptr() for p in plain.parameters()}
    for node, node0 in zip(nodes, nodes0):
        got, want = saved_tensors(node), saved_tensors(node0)
        assert [a for a, _ in got] == [a for a, _ in want]
        for (attr, g), (_, w) in zip(got, want):
            cls = classify(node0, attr, w, params)
            if cls in store and cls != "dropout" and codec != "exact":
                seen_classes.add(cls)
                stored[w.data_ptr()] = w.numel()
                assert torch.equal(g, quantized(w, codec)), (type(node0).__name__, attr)
            else:
                assert torch.equal(g, w), (type(node0).__name__, attr)
            assert g.shape == w.shape and g.dtype == w.dtype
    if codec != "exact":
        assert seen_classes == set(store) - {"dropout"}
    # Gradients: exact codec -> PyTorch's, bit for bit.
    g = torch.randn_like(y0)
    y.backward(g)
    y0.backward(g)
    for (name, p), p0 in zip(net.named_parameters(), plain.parameters()):
        if codec == "exact":
            assert torch.equal(p.grad, p0.grad), name
        else:
            assert torch.allclose(p.grad, p0.grad, rtol=0.2, atol=0.05 * p0.grad.abs().max()), name
    handle.remove()
    return stored


@pytest.mark.parametrize("store", [("layernorm",), ("gelu",), ("softmax",), ("matmul",),
                                   ("batchnorm",), ("activation",), ("softmax", "matmul"),
                                   dropit.STORE_CLASSES])
@pytest.mark.parametrize("codec", ["int8", "fp8"])
def test_each_class_stores_what_backward_reads_through_the_codec(store, codec):
    check_saved(Net(), store, codec, torch.randn(3, 10, 48))


@pytest.mark.parametrize("store", [("gelu",), ("activation",), ("gelu", "activation")])
@pytest.mark.parametrize("codec", ["int8", "fp8", "exact"])
def test_activation_modules_that_hold_their_function_are_stored(store, codec):
    # Hugging Face's activation modules (GELUActivation holds F.gelu) are no nn.GELU / nn.Tanh:
    # a module holding the function is stored as the module of that class would be.
    net = nn.Sequential(nn.Linear(48, 48), Holder(F.gelu), nn.Linear(48, 48), Holder(torch.tanh))
    check_saved(net, store, codec, torch.randn(3, 10, 48, requires_grad=True))
    kinds = [k for _, k in dropit.to_dropit(copy.deepcopy(net), "none", store=store).layers]
    assert kinds == [c for c in ("gelu", "activation") if c in store]


class _SquaredSoftmax(nn.Softmax):
    def forward(self, x):
        s = super().forward(x)
        return s * s  # the product saves the softmax output twice


class Subclassed(nn.Module):
    """Subclasses of the store= modules whose own forward saves their input or output for
    another op too (a product)."""

    def __init__(self, dim=48):
        super().__init__()
        self.fc = nn.Linear(dim, dim, bias=False)  # as Mixer's
        self.bn = gated(nn.BatchNorm1d)(dim)
        self.ln = gated(nn.LayerNorm)(dim)
        self.act = gated(nn.GELU)()
        self.act2 = gated(nn.SiLU)()
        self.soft = _SquaredSoftmax(dim=-1)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.bn(self.fc(x).transpose(1, 2)).transpose(1, 2)
        return self.out(self.act2(self.act(self.soft(self.ln(h)))))


@pytest.mark.parametrize("store", [("layernorm",), ("batchnorm",), ("gelu",), ("activation",),
                                   ("softmax",),
                                   ("layernorm", "batchnorm", "gelu", "activation", "softmax")])
def test_subclasses_with_their_own_forward_store_only_their_ops_tensors(store):
    # check_saved's oracle classes a saved tensor by the node that saved it: the products'
    # operands (the input, the output) must come back as they are, the LayerNorm's (...) own
    # saved tensor through the codec. Until 2026-12-07 every tensor of the input's data (or
    # every softmax output) the forward saved went through the codec.
    check_saved(Subclassed(), store, "int8", torch.randn(3, 10, 48, requires_grad=True))


def test_exact_codec_gives_pytorchs_gradients_bit_for_bit():
    check_saved(Net(), dropit.STORE_CLASSES, "exact", torch.randn(3, 10, 48, requires_grad=True))
    check_saved(MHA(), dropit.STORE_CLASSES, "exact", torch.randn(3, 10, 48, requires_grad=True))


@pytest.mark.parametrize("store", [("softmax",), ("matmul",), ("softmax", "matmul")])
def test_multihead_attention_stores_its_matmul_inputs_and_softmax(store):
    net = MHA()
    check_saved(net, store, "int8", torch.randn(3, 10, 48), mha_class)


def test_payload_bytes_are_the_codecs():
    # Each distinct dense tensor is packed once (the softmax output the second matmul saves as a
    # view shares its payload): numel bytes + a float scale per 1024.
    import fmnist

    net = fmnist.make_model("vit")
    x = torch.randn(8, 1, 28, 28)
    stored = check_saved(copy.deepcopy(net), ("layernorm", "softmax", "matmul"), "int8", x)
    handle = dropit.to_dropit(net, "none", masks=False, store="all")
    y = net(x)
    want = sum(n + -(-n // 1024) * 4 for n in stored.values())
    assert dropit.live_saved_bytes().sparse == want
    # 4 blocks: 2 LayerNorm inputs, q, k, v and the softmax output each; and the final LayerNorm.
    assert len(stored) == 4 * 6 + 1
    del y
    assert dropit.live_saved_bytes().total == 0
    handle.remove()


def test_dropout_noise_is_one_bit_per_element_and_exact():
    net = nn.Sequential(nn.Linear(40, 300), nn.Dropout(0.3), nn.Linear(300, 5))
    plain = copy.deepcopy(net)
    dropit.to_dropit(net, "none", store=("dropout",))
    x = torch.randn(7, 40)
    y, y0 = run(net, x), run(plain, x)
    assert dropit.live_saved_bytes().masks == -(-7 * 300 // 32) * 4
    y.sum().backward()
    y0.sum().backward()
    for p, p0 in zip(net.parameters(), plain.parameters()):
        assert torch.equal(p.grad, p0.grad)


def test_layers_left_dense_inside_attention_save_as_pytorch():
    # An excluded Linear inside an attention module whose matmuls are stored: its input is
    # saved as it is; a MinK layer beside it still packs its own.
    import fmnist

    att = fmnist.Attention(32, 4)
    handle = dropit.to_dropit(att, "mink", 0.9, exclude=["qkv"], store=("matmul",))
    assert dict(handle.layers) == {"": "attention", "qkv": "pass", "proj": "weight"}
    h = torch.randn(2, 6, 32)
    y = att(h)
    # proj runs dropit's C++ Linear (the kernel path); qkv PyTorch's, its input saved as it is.
    (qkv,) = [n for n in graph(y) if type(n).__name__ == "AddmmBackward0"]
    assert torch.equal(qkv._saved_mat1, h.view(-1, 32))
    (proj,) = [n for n in graph(y) if n.name().endswith("linear_fn>")]
    # proj's weight gradient reads its input sparsified: with a one-hot output gradient, the
    # weight gradient's rows are the input's rows.
    rows = y.numel() // 32
    (gw,) = torch.autograd.grad(y, att.proj.weight, torch.eye(rows, 32).view(y.shape))
    assert torch.count_nonzero(gw) == reference.kept_count(12 * 32, 0.9)
    handle.remove()
    # strategy "none": Linear layers inside attention keep their inputs too
    handle = dropit.to_dropit(att, "none", store=("matmul",))
    assert dict(handle.layers) == {"": "attention", "qkv": "pass", "proj": "pass"}
    handle.remove()


def test_without_store_nothing_changes_and_classes_are_separate():
    import fmnist

    net = fmnist.make_model("vit")
    kinds = lambda h: sorted({k for _, k in h.layers})  # noqa: E731
    with dropit.to_dropit(net) as h:
        assert kinds(h) == ["relu", "weight"]
    with dropit.to_dropit(net, store=("layernorm",)) as h:
        assert kinds(h) == ["layernorm", "relu", "weight"]
    with dropit.to_dropit(net, store=("softmax",)) as h:
        assert kinds(h) == ["attention", "relu", "weight"]
    with dropit.to_dropit(net, store="all") as h:
        assert kinds(h) == ["attention", "layernorm", "relu", "weight"]
    with dropit.to_dropit(net, store=("all",)) as h:  # "all" inside a sequence means the same
        assert kinds(h) == ["attention", "layernorm", "relu", "weight"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(store=("layernorm", "attention")), "store names no class of tensors: 'attention'"),
    (dict(store="everything"), "store names no class of tensors: 'everything'"),
    (dict(store=("all", "everything")), "store names no class of tensors: 'everything'"),
    (dict(store_codec="int4"), "unknown codec 'int4'"),
])
def test_bad_store_arguments_register_nothing(kwargs, message):
    import fmnist

    net = fmnist.make_model("vit")
    with pytest.raises(dropit.Error, match=message):
        dropit.to_dropit(net, **kwargs)
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in net.modules()) == 0


ACTIVATIONS = [nn.SiLU(), nn.SiLU(inplace=True), nn.Mish(), nn.Hardswish(), nn.Hardsigmoid(),
               nn.ELU(), nn.ELU(inplace=True), nn.CELU(), nn.Softplus(), nn.Tanh(), nn.Sigmoid()]


@pytest.mark.parametrize("act", ACTIVATIONS, ids=[repr(a) for a in ACTIVATIONS])
@pytest.mark.parametrize("codec", ["int8", "exact"])
def test_activation_class_stores_what_each_activation_saves(act, codec):
    net = nn.Sequential(nn.Linear(20, 40), copy.deepcopy(act), nn.Linear(40, 6))
    with dropit.to_dropit(nn.Sequential(copy.deepcopy(act)), store="activation") as h:
        assert h.layers == [("0", "activation")]
    # 2-d: in place on a 3-d Linear's output (a view) hides the node inside a CopySlices, whose
    # saved tensors the graph walk cannot read (it is packed all the same)
    x = torch.randn(35, 20, requires_grad=True)
    stored = check_saved(net, ("activation",), codec, x)
    if codec != "exact":
        assert list(stored.values()) == [35 * 40]


def test_selu_is_not_in_the_activation_class():
    # its derivative jumps at 0 (scale vs scale * alpha): a codec's rounding of small values to 0
    # would change the branch for many of them
    with dropit.to_dropit(nn.Sequential(nn.SELU()), store="activation") as h:
        assert h.layers == []
