"""The Python examples run: examples/python/fashion_mnist.py for every --impl (a few steps), its CSV
and the summary script, and its exit codes."""
import csv

import pytest

import fashion_mnist
import summary


def run(tmp_path, *args):
    out = tmp_path / "runs.csv"
    code = fashion_mnist.main(["--limit", "512", "--batch-size", "64", "--epochs", "1", "--seed", "1",
                               "--no-progress", "--csv", str(out), *args])
    return code, list(csv.DictReader(open(out))) if out.exists() else []


@pytest.mark.parametrize("model", ["cnn", "vit"])
def test_every_impl_trains_and_writes_its_row(tmp_path, model, capsys):
    rows = []
    for impl in ("none", "dropit", "reference"):
        code, rows = run(tmp_path, "--model", model, "--impl", impl, "--reference-exclude")
        assert code == 0  # the training loss fell
    out = capsys.readouterr().out
    assert "test accuracy" in out and "loss fell: yes" in out
    by_impl = {r["impl"]: r for r in rows}
    assert set(by_impl) == {"none", "dropit", "reference"}
    assert by_impl["dropit"]["exclude"] == ";".join(sorted(fashion_mnist.fmnist.REFERENCE_EXCLUDE[model]))
    saved = {k: int(r["saved_after_forward_bytes"]) for k, r in by_impl.items()}
    assert saved["dropit"] < 0.7 * saved["none"]
    assert int(by_impl["dropit"]["dropit_sparse_bytes"]) > 0
    assert int(by_impl["none"]["dropit_sparse_bytes"]) == 0
    # The summary reads the CSV and writes the table and the plot's data.
    summary.main(str(tmp_path / "runs.csv"), str(tmp_path / "t.md"), str(tmp_path / "t.dat"), "test")
    table = (tmp_path / "t.md").read_text()
    assert "dropit, first layer and head dense" in table and "plain PyTorch" in table


def test_bad_arguments_and_missing_data(tmp_path, capsys):
    assert run(tmp_path, "--impl", "dropit", "--exclude", "nope")[0] == 2
    assert "exclude names no module of the model: 'nope'" in capsys.readouterr().err
    assert run(tmp_path, "--data", str(tmp_path / "nowhere"))[0] == 77
    with pytest.raises(SystemExit):
        run(tmp_path, "--impl", "reference", "--policy", "random")


def test_store_and_layer_gamma_reach_to_dropit(tmp_path):
    # The ViT with every class stored in int8 holds less after forward than with MinK alone, and
    # the CSV's policy field says what ran.
    code, rows = run(tmp_path, "--model", "vit", "--impl", "dropit")
    assert code == 0
    code, rows = run(tmp_path, "--model", "vit", "--impl", "dropit", "--store", "all",
                     "--layer-gamma", "head=0.5")
    assert code == 0
    plain, stored = rows
    assert stored["policy"] == "mink+gamma:head=0.5+store:all:int8"
    assert int(stored["saved_after_forward_bytes"]) < 0.6 * int(plain["saved_after_forward_bytes"])
    with pytest.raises(SystemExit):
        run(tmp_path, "--impl", "dropit", "--layer-gamma", "0")
    assert run(tmp_path, "--impl", "dropit", "--layer-gamma", "nope=0.5")[0] == 2


def test_low_memory_lowers_the_cnn_activation_peak(tmp_path):
    # --low-memory runs the CNN's convolutions in dropit's C++ layer, in pieces: the example's
    # measured activation peak falls (a count of allocated bytes, not a timing).
    code, rows = run(tmp_path, "--model", "cnn", "--impl", "dropit")
    assert code == 0
    code, rows = run(tmp_path, "--model", "cnn", "--impl", "dropit", "--low-memory")
    assert code == 0
    hooks, pieces = rows
    assert pieces["policy"] == "mink+low_memory"
    assert int(pieces["activation_bytes"]) < 0.9 * int(hooks["activation_bytes"])


@pytest.mark.parametrize("model", ["transformer", "resnet", "tutorial"])
def test_held_memory_example(model, capsys):
    import held_memory

    small = ["--layers", "2", "--dim", "64", "--heads", "4", "--ff", "128", "--seq", "16"]
    assert held_memory.main(["--model", model, "--batch", "8"] + small) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " MiB " in line]
    held = [float(r.split("MiB")[0].split()[-1]) for r in rows]
    hooked = [int(r.split()[-1]) for r in rows]
    assert len(held) == 3
    if model == "tutorial":
        # its F.relu calls keep masks, its pooling window codes, its Linear/conv inputs MinK
        # (without the F.relu calls: 0.64x); nothing for store="all" to add
        assert held[1] < 0.15 * held[0] and held[2] == held[1]
        assert hooked == [0, 7, 7]  # 2 convolutions, 3 Linear, the pooling, the model itself
        return
    # MinK on every Linear/convolution input and both attention projections holds less;
    # store="all" less again
    assert held[1] < 0.9 * held[0] and held[2] < 0.6 * held[1]
    if model == "transformer":
        # per layer: the attention, linear1, linear2, the layer itself (its activation, F.relu,
        # through the mask kernel) and with store: 2 LayerNorms, 3 Dropouts
        assert hooked == [0, 2 * 4, 2 * 9]
    else:
        # 20 convolutions, the Linear head, 17 ReLUs, the average pooling (and with store:
        # 20 BatchNorms)
        assert hooked == [0, 39, 59]
