"""dropit for PyTorch: DropIT's sparse saved tensors through PyTorch's save-for-backward hook.

    import dropit
    handle = dropit.to_dropit(model, strategy="mink", gamma=0.9)   # one call; no module replaced
    ...train as usual...
    handle.remove()

Linear, Conv2d and GPT-2's Conv1D keep the (1 - gamma) largest magnitudes of the input they save
for their weight gradient (input and bias gradients stay exact); ReLU keeps a 1-bit mask and
MaxPool2d its window positions (both exact). Selection, packing and formats run in dropit's C++
library (``dropit._C``); this package only decides which saved tensors to hand it.
"""
from collections import namedtuple as _namedtuple

from . import _C
from ._C import Error, MemoryCounter, Packed
from ._hooks import STORE_CLASSES, Handle, remove_hooks, saved_tensors, to_dropit

__all__ = [
    "Error",
    "Handle",
    "Identity",
    "MemoryCounter",
    "MinK",
    "Packed",
    "Policy",
    "Random",
    "STORE_CLASSES",
    "SavedBytes",
    "live_saved_bytes",
    "memory_counter",
    "pack",
    "remove_hooks",
    "saved_tensors",
    "to_dropit",
]

__version__ = "0.1.0"

Policy = _C.Policy


class MinK(_C.Policy):
    """Keeps the (1 - gamma) fraction of elements with the largest magnitude (DropIT's min-k).

    Of n elements, k = n - floor(n * gamma + 1e-6) are kept; among equal magnitudes the lowest
    positions first; NaN ranks above +inf.
    """

    def __init__(self, gamma=0.9, codec="exact", positions="smallest"):
        super().__init__("mink", float(gamma), 0, str(codec), str(positions))

    def __reduce__(self):
        return (MinK, (self.gamma, self.codec, self.positions))


class Random(_C.Policy):
    """Keeps (1 - gamma) of the positions, drawn by a counter-based hash of (seed, position):
    the same seed gives the same positions; ``to_dropit`` gives every layer and step its own."""

    def __init__(self, gamma=0.9, seed=0, codec="exact", positions="smallest"):
        super().__init__("random", float(gamma), int(seed), str(codec), str(positions))

    def __reduce__(self):
        return (Random, (self.gamma, self.seed, self.codec, self.positions))


class Identity(_C.Policy):
    """Keeps everything (a dense copy): the baseline of the machinery."""

    def __init__(self, codec="exact"):
        super().__init__("identity", 0.0, 0, str(codec))

    def __reduce__(self):
        return (Identity, (self.codec,))


def pack(tensor, policy):
    """Packs a contiguous CPU tensor with a policy; ``.restore()`` rebuilds it densely.

        p = dropit.pack(torch.tensor([0.1, -3.0, 0.2, 2.5]), dropit.MinK(0.5))
        p.restore()  # tensor([0., -3., 0., 2.5]): the 2 largest magnitudes, zeros elsewhere
        p.kept, p.numel, p.nbytes  # 2, 4, and the payload's size in bytes

    Raises dropit.Error for a non-contiguous or non-CPU tensor or an unsupported dtype.
    """
    return _C.pack(tensor, policy)


SavedBytes = _namedtuple("SavedBytes", ["sparse", "masks", "total"])
SavedBytes.__doc__ = "Bytes held now by dropit's packs: sparse caches, masks (ReLU, MaxPool2d)."


def live_saved_bytes():
    """Bytes held right now by what dropit packed for backward, process-wide (freed as backward
    consumes them, or with the graph)."""
    sparse, masks = _C._live_saved_bytes()
    return SavedBytes(sparse, masks, sparse + masks)


def memory_counter():
    """A counting CPU allocator for a ``with`` block: every CPU allocation LibTorch makes
    (tensors, oneDNN's buffers, dropit's payloads) is counted while the block runs.

        with dropit.memory_counter() as counter:
            base = counter.reset_peak()
            loss = model(x).sum(); loss.backward()
        print(counter.peak_bytes - base)
    """
    return MemoryCounter()


def _load_packed(dtype, shape, strides, policy, kept, positions, payload):
    """Rebuilds a pickled ``Packed`` (what its ``__reduce__`` gives). The C++ load checks every
    part again, so a corrupt or forged pickle raises ``dropit.Error``."""
    return _C._load_packed(dtype, shape, strides, policy, kept, positions, payload)
