"""Hooked models trained on several threads at once: each thread's scopes, saved-tensor hooks and
kernel mode are its own (thread-local in dropit and in PyTorch)."""
import copy
import threading

import torch

import dropit
from test_copies import Net, _step


def test_models_on_threads_train_as_they_do_one_after_another():
    torch.manual_seed(0)
    base = Net()
    batches = [torch.randn(4, 3, 8, 8) for _ in range(6)]
    models = [copy.deepcopy(base) for _ in range(4)]
    for model in models:
        dropit.to_dropit(model, "mink", 0.9)

    def run(model, out):
        for x in batches:
            out.append(_step(model, x)[2])

    alone = [[], []]
    for model, out in zip(models[:2], alone):
        run(model, out)
    together = [[], []]
    threads = [threading.Thread(target=run, args=(model, out))
               for model, out in zip(models[2:], together)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for grads, grads0 in zip(together, alone):
        assert len(grads) == len(grads0) == len(batches)
        for step, step0 in zip(grads, grads0):
            for g, g0 in zip(step, step0):
                torch.testing.assert_close(g, g0, rtol=0, atol=0)
    assert dropit.live_saved_bytes().total == 0
