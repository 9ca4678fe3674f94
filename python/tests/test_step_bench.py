"""bench/python_step_bench.py runs (a few rounds of the CNN) and writes its JSON; with
--steady-heap no configuration pays page faults after the warm-up (without the flag, plain
PyTorch's CNN step takes thousands a step on this benchmark)."""
import json
import os
import pathlib
import subprocess
import sys

import dropit

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "python_step_bench.py"


def test_steady_heap_leaves_no_page_faults(tmp_path):
    out = tmp_path / "steps.json"
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(dropit.__file__).resolve().parents[1]),
               OMP_WAIT_POLICY="passive")
    subprocess.run([sys.executable, str(BENCH), "--models", "cnn", "--rounds", "5", "--warmup", "3",
                    "--steady-heap", "--json", str(out)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    assert result["steady_heap"] is True
    rows = {r["impl"]: r for r in result["rows"]}
    assert {"none", "dropit", "reference", "floor"} <= set(rows)
    assert rows["dropit"]["held_ratio"] < 0.1  # the CNN's saved bytes, as in the README's table
    for impl, r in rows.items():
        assert r["rounds"] == 5
        assert r["page_faults_median"] == 0, impl
