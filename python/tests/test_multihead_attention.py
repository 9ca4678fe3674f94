"""to_dropit on nn.MultiheadAttention: its input and output projections (F.linear calls inside
its functional forward, no Linear modules) save their inputs through the policy as Linear layers
do; checked against an attention written by hand in plain PyTorch with the topk oracle."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit
import reference


class OracleLinear(torch.autograd.Function):
    """F.linear whose weight gradient reads reference.mink(x): DropIT's rule, in PyTorch."""

    @staticmethod
    def forward(ctx, x, w, b, gamma):
        ctx.save_for_backward(reference.mink(x.detach(), gamma), w)
        ctx.has_bias = b is not None
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        xs, w = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        gb = g2.sum(0) if ctx.has_bias else None
        return g.matmul(w), g2.t().mm(xs.reshape(-1, xs.shape[-1])), gb, None


def oracle_attention(m, q, k, v, gamma, self_attention):
    """nn.MultiheadAttention's forward (no masks, no dropout) with OracleLinear projections."""
    if m.batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    lin = lambda x, w, b: OracleLinear.apply(x, w, b, gamma)  # noqa: E731
    e, h = m.embed_dim, m.num_heads
    if m._qkv_same_embed_dim:
        w = m.in_proj_weight
        b = m.in_proj_bias if m.in_proj_bias is not None else None
        if self_attention:
            qp, kp, vp = lin(q, w, b).chunk(3, -1)
        else:
            wq, wkv = w.split([e, 2 * e])
            bq, bkv = b.split([e, 2 * e]) if b is not None else (None, None)
            qp = lin(q, wq, bq)
            kp, vp = lin(k, wkv, bkv).chunk(2, -1)
    else:
        bq, bk, bv = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else (None,) * 3
        qp = lin(q, m.q_proj_weight, bq)
        kp, vp = lin(k, m.k_proj_weight, bk), lin(v, m.v_proj_weight, bv)
    tgt, n = q.shape[0], q.shape[1]
    heads = lambda t: t.reshape(t.shape[0], n * h, e // h).transpose(0, 1)  # noqa: E731
    qp, kp, vp = heads(qp), heads(kp), heads(vp)
    attn = torch.softmax(qp.bmm(kp.transpose(1, 2)) / (e // h) ** 0.5, dim=-1)
    out = attn.bmm(vp).transpose(0, 1).reshape(tgt * n, e)
    out = lin(out, m.out_proj.weight, m.out_proj.bias).view(tgt, n, e)
    return out.transpose(0, 1) if m.batch_first else out


def kernel_nodes(y):
    """dropit's C++ Linear nodes in y's graph."""
    count, seen, held, todo = 0, set(), [], [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        held.append(node)  # an id stays unique while its node object lives
        count += node.name().endswith("linear_fn>")
        todo.extend(nx for nx, _ in node.next_functions)
    return count


CASES = {
    "self": dict(kw={}, self_attention=True),
    "self-seq-first": dict(kw=dict(batch_first=False), self_attention=True),
    "self-no-bias": dict(kw=dict(bias=False), self_attention=True),
    "cross-packed": dict(kw={}, self_attention=False),  # slices of in_proj_weight
    "cross-kdim": dict(kw=dict(kdim=12, vdim=10), self_attention=False),  # own q/k/v weights
}


def make(case, dtype=torch.float32):
    torch.manual_seed(3)
    kw = {"batch_first": True, **CASES[case]["kw"]}
    m = nn.MultiheadAttention(24, 3, **kw).to(dtype)
    shape = (4, 7, 24) if m.batch_first else (7, 4, 24)
    q = torch.randn(shape, dtype=dtype, requires_grad=True)
    if CASES[case]["self_attention"]:
        return m, q, q, q
    src = (4, 5) if m.batch_first else (5, 4)
    k = torch.randn(*src, m.kdim, dtype=dtype, requires_grad=True)
    v = torch.randn(*src, m.vdim, dtype=dtype, requires_grad=True)
    if m._qkv_same_embed_dim:
        v = k  # an encoder-decoder attention: keys and values from one memory
    return m, q, k, v


def grads(y, g, tensors):
    return torch.autograd.grad(y, tensors, g, allow_unused=True)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_projections_read_the_sparsified_inputs(case, gamma):
    m, q, k, v = make(case)
    oracle = copy.deepcopy(m)
    handle = dropit.to_dropit(m, "mink", gamma)
    assert handle.layers == [("", "attention")]  # out_proj is its parent's, never called itself
    y = m(q, k, v, need_weights=False)[0]
    y_want = oracle_attention(oracle, q, k, v, gamma, CASES[case]["self_attention"])
    torch.testing.assert_close(y, y_want, rtol=1e-5, atol=1e-5)  # the oracle is the module
    # the in projection (one call, or two for packed cross-attention, three with kdim) and out
    calls = {"self": 2, "self-seq-first": 2, "self-no-bias": 2, "cross-packed": 3,
             "cross-kdim": 4}[case]
    assert kernel_nodes(y) == calls
    g = torch.randn_like(y)
    inputs = list(dict.fromkeys([q, k, v]))
    got = grads(y, g, list(m.parameters()) + inputs)
    want = grads(y_want, g, list(oracle.parameters()) + inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    handle.remove()


@pytest.mark.parametrize("case", ["self", "cross-kdim"])
def test_gamma_zero_and_strategy_none_leave_pytorchs_attention(case):
    m, q, k, v = make(case)
    plain = copy.deepcopy(m)
    y0 = plain(q, k, v)[0]
    g = torch.randn_like(y0)
    want = grads(y0, g, list(plain.parameters()))
    with dropit.to_dropit(m, "mink", 0.0) as h:
        assert h.layers == [("", "attention")]
        y = m(q, k, v)[0]
        assert kernel_nodes(y) == 0
        for a, b in zip(grads(y, g, list(m.parameters())), want):
            assert torch.equal(a, b)
    with dropit.to_dropit(m, "none") as h:
        assert h.layers == []


def test_excluded_out_proj_and_its_own_gamma():
    m, q, k, v = make("self")
    oracle = copy.deepcopy(m)
    y_plain = copy.deepcopy(m)(q, k, v)[0]
    g = torch.randn_like(y_plain)
    with dropit.to_dropit(m, "mink", 0.9, exclude=["out_proj"]) as h:
        assert h.layers == [("", "attention")]
        y = m(q, k, v)[0]
        assert kernel_nodes(y) == 1  # the in projection only
        gw, gw_out = grads(y, g, [m.in_proj_weight, m.out_proj.weight])
    # the out projection's weight gradient is PyTorch's; the in projection's the oracle's
    want_in = grads(oracle_attention(oracle, q, k, v, 0.9, True), g, [oracle.in_proj_weight])[0]
    torch.testing.assert_close(gw, want_in, rtol=1e-5, atol=1e-5)
    plain = copy.deepcopy(oracle)
    torch.testing.assert_close(gw_out, grads(plain(q, k, v)[0], g, [plain.out_proj.weight])[0],
                               rtol=1e-6, atol=1e-6)
    # layer_gamma names out_proj: the out projection at 0.5, the in projection at 0.9
    with dropit.to_dropit(m, "mink", 0.9, layer_gamma={"out_proj": 0.5}):
        y = m(q, k, v)[0]
        got = grads(y, g, [m.in_proj_weight, m.out_proj.weight, m.out_proj.bias])
    o1 = copy.deepcopy(oracle)
    want_in = grads(oracle_attention(o1, q, k, v, 0.9, True), g, [o1.in_proj_weight])[0]
    torch.testing.assert_close(got[0], want_in, rtol=1e-5, atol=1e-5)
    # the out projection's input read at 0.5: check through its weight gradient
    o2 = copy.deepcopy(oracle)
    y2 = oracle_attention(o2, q, k, v, 0.5, True)
    torch.testing.assert_close(got[1], grads(y2, g, [o2.out_proj.weight])[0], rtol=1e-5,
                               atol=1e-5)


def test_transformer_layers_pack_the_projection_inputs():
    torch.manual_seed(0)
    net = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0,
                                                           batch_first=True), 2)
    x = torch.randn(6, 10, 32)
    with dropit.to_dropit(net) as h:
        kinds = dict(h.layers)
        assert kinds["layers.0.self_attn"] == "attention"
        assert "layers.0.self_attn.out_proj" not in kinds
        y = net(x)
        # per layer: in and out projection, linear1, linear2
        assert kernel_nodes(y) == 8
        # what the four Linear inputs of a layer save: MinK 0.9 packs, 6 x 10 x (32 + 32 + 32 + 64)
        assert dropit.live_saved_bytes().sparse < 0.2 * 4 * 2 * 6 * 10 * 160
        y.sum().backward()
        assert all(p.grad is not None for p in net.parameters())


def test_random_is_reproducible_per_seed():
    m, q, k, v = make("self")

    def weight_grads(seed, g=None):
        with dropit.to_dropit(m, "random", 0.9, seed=seed):
            y = m(q, k, v)[0]
            return grads(y, g if g is not None else torch.ones_like(y),
                         [m.in_proj_weight, m.out_proj.weight])

    a, b, c = weight_grads(4), weight_grads(4), weight_grads(5)
    assert all(torch.equal(u, w) for u, w in zip(a, b))
    assert not any(torch.equal(u, w) for u, w in zip(a, c))
