"""Shared set-up of dropit's Python tests: 2 threads, the examples' folder importable, and a way to
read what autograd will hand a layer's backward."""
import pathlib
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
EXAMPLES = HERE.parent.parent / "examples" / "python"
sys.path.insert(0, str(EXAMPLES))

torch.set_num_threads(2)


def saved(y, name):
    """The tensor saved as `name` (e.g. "mat1", "input", "result") by the first node of y's graph
    that has one, read through autograd: the unpack hook runs, so this is what backward sees."""
    frontier, seen = [y.grad_fn], set()
    while frontier:
        node = frontier.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if hasattr(node, "_saved_" + name):
            return getattr(node, "_saved_" + name)
        frontier.extend(n for n, _ in node.next_functions)
    raise LookupError(f"no node of the graph saves {name!r}")


def gated(base):
    """A subclass of module class `base` whose own forward multiplies the layer's output by its
    input: the product saves both, for an op that is not the layer's own."""

    class Gated(base):
        def forward(self, x):
            return super().forward(x) * x

    Gated.__name__ = Gated.__qualname__ = f"Gated{base.__name__}"
    return Gated


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
