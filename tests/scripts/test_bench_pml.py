"""scripts/bench.py's parallel-metalearn peer (``--impl parallel_metalearn``).

parallel-metalearn installs a top-level ``metalearn`` of its own, so it lives in an environment
of its own: ``.venv-pml`` in the checkout, as the README's set-up makes it, or the one whose
interpreter ``$BENCH_PML_PYTHON`` names; without either these tests skip:

    python3 -m venv .venv-pml
    .venv-pml/bin/pip install torch==2.13.0 parallel-metalearn==0.5.6

Its meta-gradient (what lies in ``.grad`` when its ``MAML.step`` has run) must equal metalearn's
in float64 on the same weights and tasks, for the sinusoid MLP and Conv4, both orders.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.cli import finished
from tests.scripts import peer_checks

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# The README's set-up makes it in the checkout; $BENCH_PML_PYTHON names another.
PML_PYTHON = os.environ.get("BENCH_PML_PYTHON") or str(
    SCRIPTS.parent / ".venv-pml" / "bin" / "python"
)
HAVE_PML = bool(PML_PYTHON) and os.access(PML_PYTHON, os.X_OK)
NO_PML = (
    "parallel-metalearn runs in an environment of its own: .venv-pml in the checkout (the "
    "README's set-up), or set BENCH_PML_PYTHON to its Python (pip install torch==2.13.0 "
    "parallel-metalearn==0.5.6 there)"
)
needs_pml = pytest.mark.skipif(not HAVE_PML, reason=NO_PML)
RTOL = 1e-8  # float64 on both sides: rounding only


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench

    return bench


def pml_meta_gradient(spec, problem, tmp_path) -> list[np.ndarray]:
    """The gradient one parallel-metalearn ``MAML.step`` leaves in ``.grad`` (float64), computed
    by ``bench_pml.py --grad-check`` in its own environment."""
    weights, batch = problem
    source, target = tmp_path / "in.npz", tmp_path / "out.npz"
    arrays = {f"w{i}": w for i, w in enumerate(weights)}
    np.savez(source, spec=json.dumps(spec), **arrays, **batch)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [PML_PYTHON, str(SCRIPTS / "bench_pml.py"), "--grad-check", str(source), str(target)]
    proc = finished(cmd, 600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(target)
    return [out[f"arr_{i}"] for i in range(len(weights))]


CHECKS = peer_checks.CHECKS


@needs_pml
@pytest.mark.parametrize(("case", "order", "inner_steps"), CHECKS)
def test_meta_gradient_equals_metalearns(bench, tmp_path, case, order, inner_steps):
    spec = peer_checks.spec_for(bench, case, order, inner_steps, meta_batch=4)
    problem = peer_checks.random_problem(spec)
    reference = peer_checks.metalearn_meta_gradient(spec, problem)
    theirs = pml_meta_gradient(spec, problem, tmp_path)
    assert peer_checks.max_relative_difference(theirs, reference) < RTOL


@needs_pml
def test_sinusoid_row(bench, tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    argv = ["--case", "sinusoid", "--impl", "parallel_metalearn", "--steps", "2", "--warmup", "1"]
    bench.main([*argv, "--pml-python", PML_PYTHON, "--torch-threads", "1", "--json", str(out)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert "error" not in row, row.get("error")
    assert (row["case"], row["impl"], row["batching"]) == ("sinusoid", "parallel_metalearn", "vmap")
    assert (row["inner_steps"], row["order"], row["meta_batch"]) == (1, "second", 25)
    assert row["chunk_size"] == 25 and row["pml_version"] == "0.5.6"  # one chunk: the full batch
    assert row["ms_per_step"] > 0 and row["peak_mem_mb"] >= 0
    assert "parallel_metalearn" in capsys.readouterr().out  # the table


def test_a_missing_interpreter_is_one_line(bench, capsys, monkeypatch):
    monkeypatch.delenv("BENCH_PML_PYTHON", raising=False)
    argv = ["--case", "sinusoid", "--impl", "parallel_metalearn"]
    for extra, message in (
        ([], "--impl parallel_metalearn needs --pml-python PATH (or $BENCH_PML_PYTHON)"),
        (["--pml-python", "/nonexistent/python"], "--pml-python /nonexistent/python: no such"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            bench.parse_args([*argv, *extra])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and err.count("error:") == 1


def test_our_metalearn_is_refused_as_parallel_metalearn():
    """Run with this checkout's interpreter (our ``metalearn`` on its path), the peer's script
    stops with one line instead of timing the wrong package."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is an optional extra")
    proc = finished([os.sys.executable, str(SCRIPTS / "bench_pml.py"), "--row", "{}"], 300)
    assert proc.returncode == 1
    assert "has no parallel-metalearn" in proc.stderr.strip().splitlines()[-1]
