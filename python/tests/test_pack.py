"""dropit.pack and the policies, against the oracles in reference.py."""
import pickle

import pytest
import torch

import dropit
import reference

HALF_TYPES = [torch.bfloat16, torch.float16] if dropit._C.has_half else []
DTYPES = [torch.float32, torch.float64] + HALF_TYPES


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 10, 31, 1000, 300_000])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9, 0.99, 1.0])
def test_mink_matches_oracle(dtype, n, gamma):
    x = torch.randn(n).to(dtype)
    p = dropit.pack(x, dropit.MinK(gamma))
    assert p.numel == n and p.shape == (n,) and p.dtype == dtype
    assert p.kept == reference.kept_count(n, gamma)
    assert torch.equal(p.restore(), reference.mink(x, gamma))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mink_ties_nan_inf_signed_zero(dtype):
    # Few distinct magnitudes: most of the cut falls on ties, which keep the lowest positions.
    x = torch.randint(-3, 4, (5000,)).to(dtype)
    for gamma in (0.3, 0.5, 0.9):
        assert torch.equal(dropit.pack(x, dropit.MinK(gamma)).restore(), reference.mink(x, gamma))
    special = torch.tensor([0.0, -0.0, float("inf"), 1.0, float("nan"), -float("inf"), -2.0, 0.5])
    special = special.to(dtype)
    for gamma in (0.25, 0.5, 0.75):
        got = dropit.pack(special, dropit.MinK(gamma)).restore()
        want = reference.mink(special, gamma)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("codec", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9, 0.99])
def test_codecs_match_oracle(codec, dtype, gamma):
    x = torch.randn(5000).to(dtype)
    x[3], x[7] = float("nan"), float("inf")
    exact = dropit.pack(x, dropit.MinK(gamma))
    p = dropit.pack(x, dropit.MinK(gamma, codec=codec))
    assert p.kept == exact.kept
    kept = exact.restore()
    positions = torch.nonzero((kept != 0) | kept.isnan()).reshape(-1)
    want = reference.quantize_kept(reference.mink(x, gamma), positions, codec)
    got = p.restore()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    if 0 < p.kept:
        assert p.nbytes < exact.nbytes or dtype not in (torch.float32, torch.float64)


def test_codec_bytes_and_policies():
    x = torch.randn(1 << 16)
    assert dropit.pack(x, dropit.Identity(codec="int8")).nbytes == (1 << 16) + (1 << 16) // 1024 * 4
    assert dropit.pack(x, dropit.MinK(0.9, codec="fp8")).nbytes < 0.25 * dropit.pack(
        x, dropit.MinK(0.9)).nbytes * 1.01 + 0.13 * (1 << 16)
    assert dropit.MinK(0.9, codec="int8").codec == "int8"
    assert repr(dropit.MinK(0.9, codec="int8")) == "dropit.MinK(gamma=0.9, codec='int8')"
    assert dropit.MinK(0.9, codec="int8") != dropit.MinK(0.9)
    assert pickle.loads(pickle.dumps(dropit.Random(0.5, 3, codec="fp8"))) == dropit.Random(
        0.5, 3, codec="fp8")
    with pytest.raises(dropit.Error, match="unknown codec 'int4'"):
        dropit.MinK(0.9, codec="int4")


def test_public_names_are_the_documented_ones():
    # what `from dropit import *` gives is every public name, and nothing the package uses itself
    public = {n for n in dir(dropit) if not n.startswith("_")}
    assert public == set(dropit.__all__)
    assert isinstance(dropit.memory_counter(), dropit.MemoryCounter)


def test_docstring_example():
    p = dropit.pack(torch.tensor([0.1, -3.0, 0.2, 2.5]), dropit.MinK(0.5))
    assert torch.equal(p.restore(), torch.tensor([0.0, -3.0, 0.0, 2.5]))
    assert (p.kept, p.numel) == (2, 4) and p.nbytes > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_is_kept(dtype):
    x = torch.randn(4, 3, 5, 7).to(dtype)
    restored = dropit.pack(x, dropit.MinK(0.8)).restore()
    assert restored.shape == x.shape and restored.dtype == dtype and restored.is_contiguous()
    assert torch.equal(restored, reference.mink(x, 0.8))


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**64 - 1])
def test_random_matches_hash_oracle(seed):
    x = torch.randn(2000) + 10.0  # no zeros: the kept positions are where the result is non-zero
    p = dropit.pack(x, dropit.Random(0.9, seed))
    assert torch.equal(p.restore(), reference.random_select(x, 0.9, seed))


def test_random_positions_depend_only_on_seed():
    x, z = torch.randn(3000) + 5, torch.randn(3000) - 5
    a = dropit.pack(x, dropit.Random(0.7, 3)).restore() != 0
    b = dropit.pack(z, dropit.Random(0.7, 3)).restore() != 0
    c = dropit.pack(x, dropit.Random(0.7, 4)).restore() != 0
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_identity_is_a_copy():
    x = torch.randn(3, 1000)
    p = dropit.pack(x, dropit.Identity())
    assert p.kept == x.numel() and torch.equal(p.restore(), x)
    assert p.nbytes >= x.numel() * 4


def test_payload_is_smaller_than_the_dense_tensor():
    x = torch.randn(1 << 20)
    p = dropit.pack(x, dropit.MinK(0.9))
    # 0.4 B of values + the Elias-Fano code of the positions (0.53 bit) + block offsets per element
    # (the C++ format's bound).
    assert p.nbytes <= 0.47 * x.numel()
    assert dropit.pack(x, dropit.MinK(0.99)).nbytes <= 0.0515 * x.numel()


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99])
def test_positions_without_elias_fano_restore_the_same_tensor_in_more_bytes(gamma):
    x = torch.randn(100_003)
    small = dropit.pack(x, dropit.MinK(gamma))
    plain = dropit.pack(x, dropit.MinK(gamma, positions="no_elias_fano"))
    assert torch.equal(small.restore(), plain.restore())
    assert torch.equal(small.restore(), reference.mink(x, gamma))
    # gamma 0.5: the bitmask either way; 0.9: Elias-Fano vs the bitmask; 0.99: vs the index list
    n, k = x.numel(), small.kept
    bitmask = -(-n // 32) * 4 + -(-n // 1024) * 4
    if gamma == 0.5:
        assert small.nbytes == plain.nbytes
    else:
        assert small.nbytes < plain.nbytes <= 4 * k + min(bitmask, 4 * k) + 32
    r = dropit.Random(gamma, 5, positions="no_elias_fano")
    assert r.positions == "no_elias_fano" and dropit.MinK(gamma).positions == "smallest"
    assert torch.equal(dropit.pack(x, r).restore(), dropit.pack(x, dropit.Random(gamma, 5)).restore())


def test_bad_positions_raise_and_policies_keep_their_positions():
    with pytest.raises(dropit.Error, match="unknown position choice 'dense'"):
        dropit.MinK(0.9, positions="dense")
    p = dropit.MinK(0.9, codec="int8", positions="no_elias_fano")
    assert repr(p) == "dropit.MinK(gamma=0.9, codec='int8', positions='no_elias_fano')"
    assert pickle.loads(pickle.dumps(p)) == p and p != dropit.MinK(0.9, codec="int8")


def test_live_saved_bytes_follow_the_pack():
    before = dropit.live_saved_bytes()
    p = dropit.pack(torch.randn(100_000), dropit.MinK(0.9))
    during = dropit.live_saved_bytes()
    assert during.sparse - before.sparse == p.nbytes
    assert during.total == during.sparse + during.masks
    del p
    assert dropit.live_saved_bytes().sparse == before.sparse


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_bad_gamma_raises_with_the_library_message(gamma):
    with pytest.raises(dropit.Error, match=r"MinK: gamma must be in \[0, 1\]"):
        dropit.MinK(gamma)
    with pytest.raises(dropit.Error, match=r"Random: gamma must be in \[0, 1\]"):
        dropit.Random(gamma, 1)
    with pytest.raises(ValueError):  # dropit.Error is a ValueError
        dropit.MinK(gamma)


def test_bad_tensors_raise():
    with pytest.raises(dropit.Error, match="must be contiguous"):
        dropit.pack(torch.randn(8, 8).t(), dropit.MinK(0.5))
    # A CPU-only PyTorch cannot make CUDA tensors; the meta device stands in for any device the
    # host executor cannot read, and gets the same check.
    with pytest.raises(dropit.Error, match="tensors on meta are not supported"):
        dropit.pack(torch.empty(8, device="meta"), dropit.MinK(0.5))
    with pytest.raises(dropit.Error, match="no dropit element type for dtype Int"):
        dropit.pack(torch.arange(8, dtype=torch.int32), dropit.MinK(0.5))
    with pytest.raises(dropit.Error, match="unknown kind 'topk'"):
        dropit.Policy("topk", 0.5)
    with pytest.raises(TypeError):
        dropit.pack(torch.randn(4), 0.9)


def test_policies_pickle_and_compare():
    for p in (dropit.MinK(0.9), dropit.Random(0.5, 7), dropit.Identity()):
        q = pickle.loads(pickle.dumps(p))
        assert type(q) is type(p) and q == p
    assert repr(dropit.Random(0.5, 7)) == "dropit.Random(gamma=0.5, seed=7)"
    assert dropit.MinK(0.9).kind == "mink" and dropit.MinK(0.9).gamma == 0.9


def test_to_dropit_passes_positions_to_every_pack():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x = torch.randn(256, 512)
    held = {}
    for positions in ("smallest", "no_elias_fano"):
        handle = dropit.to_dropit(model, gamma=0.9, positions=positions)
        assert handle.policy.positions == positions
        before = dropit.live_saved_bytes().sparse
        y = model(x)
        held[positions] = dropit.live_saved_bytes().sparse - before
        y.sum().backward()
        handle.remove()
    # The Linear inputs (131072 and 65536 elements) as Elias-Fano codes: smaller than bitmasks.
    assert 0 < held["smallest"] < held["no_elias_fano"]
    with pytest.raises(dropit.Error, match="unknown position choice"):
        dropit.to_dropit(model, positions="bits")
    handle = dropit.to_dropit(model, positions="smallest")
    assert len(handle) > 0
    handle.remove()


def _restores_alike(a, b):
    assert (b.shape, b.dtype, b.kept, b.numel, b.nbytes) == (a.shape, a.dtype, a.kept, a.numel, a.nbytes)
    ra, rb = a.restore(), b.restore()
    assert ra.stride() == rb.stride()
    assert torch.equal(ra, rb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", [
    dropit.MinK(0.9), dropit.MinK(0.5), dropit.MinK(0.999), dropit.MinK(0.9, positions="no_elias_fano"),
    dropit.MinK(0.9, codec="int8"), dropit.Random(0.75, seed=4), dropit.Identity(codec="fp8"),
    dropit.MinK(0.0), dropit.MinK(1.0)])
def test_packed_tensors_pickle_copy_and_save(dtype, policy):
    import copy
    import io

    x = torch.randn(4, 3, 40, 50).to(dtype)
    for t in (x, x.contiguous(memory_format=torch.channels_last), torch.randn(()).to(dtype),
              torch.randn(0, 5).to(dtype)):
        p = dropit._C._pack_saved(t, policy)
        _restores_alike(p, pickle.loads(pickle.dumps(p)))
        _restores_alike(p, copy.deepcopy(p))
        f = io.BytesIO()
        torch.save({"saved": p}, f)
        f.seek(0)
        _restores_alike(p, torch.load(f)["saved"])
        # The pickle records the policy it was packed with.
        assert p.__reduce__()[1][3] == policy


def test_a_loaded_pack_counts_in_live_saved_bytes():
    p = dropit.pack(torch.randn(100_000), dropit.MinK(0.9))
    before = dropit.live_saved_bytes().sparse
    q = pickle.loads(pickle.dumps(p))
    assert dropit.live_saved_bytes().sparse == before + q.nbytes
    del q
    assert dropit.live_saved_bytes().sparse == before


def test_forged_or_corrupt_pickles_are_refused():
    # Every part of what Packed pickles as is checked again on load (SparseCache::load for the
    # payload: tests/load_test.cpp flips every bit of it).
    p = dropit.pack(torch.randn(50, 60), dropit.MinK(0.9))
    load, (dtype, shape, strides, policy, kept, positions, payload) = p.__reduce__()
    assert positions == "elias_fano"

    def refused(message, **change):
        args = dict(dtype=dtype, shape=shape, strides=strides, policy=policy, kept=kept,
                    positions=positions, payload=payload)
        args.update(change)
        with pytest.raises(dropit.Error, match=message):
            load(*args.values())

    refused("a pack of k = 301 of n = 3000 elements stores its positions as elias_fano or bitmask, "
            "not as index32", kept=301, positions="index32")
    refused("unknown position encoding 'rle'", positions="rle")
    refused("k = 3001 kept elements of n = 3000", kept=3001)
    refused("the payload has", payload=payload[:-1])
    refused("block offset 0 is 1, the positions give 0", payload=payload[:-4] + b"\x01\0\0\0")
    refused(r"strides \[1, 1\] are not a dense layout of sizes \[50, 60\]", strides=(1, 1))
    refused("size -50 and stride 60 of dimension 0", shape=(-50, 60))
    refused("2 sizes and 1 strides", strides=(1,))
    refused("no dropit element type for dtype Long", dtype=torch.int64)
    refused("not a torch.dtype", dtype="float32")
    # The same bytes under another element type: the sizes no longer match.
    refused("the payload has", dtype=torch.float64)
    assert torch.equal(load(dtype, shape, strides, policy, kept, positions, payload).restore(),
                       p.restore())
