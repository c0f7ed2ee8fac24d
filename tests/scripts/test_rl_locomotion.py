"""scripts/rl_locomotion.py and scripts/bench_locomotion.py: a tiny end-to-end run (slow: it
compiles Brax rollouts) and their refusal of bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_tiny_run_writes_results_and_resumes_from_its_params(tmp_path):
    script = _script("rl_locomotion")
    tiny = ["--horizon", "5", "--tasks", "2", "--rollouts", "2", "--meta-iters", "2"]
    tiny += ["--eval-tasks", "2", "--eval-rollouts", "2"]
    assert script.main([*tiny, "--out", str(tmp_path / "a")]) == 0
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    table = results["returns_after_steps"]
    assert list(table) == ["initialisation", "MAML after 2 meta-iterations"]
    assert all(len(rows) == 4 for rows in table.values())  # after 0, 1, 2, 3 inner steps
    assert results["timing"]["env_steps_per_meta_iteration"] == 2 * 2 * 2 * 5
    params_in = ["--params-in", str(tmp_path / "a" / "params.npz")]
    assert script.main([*tiny, *params_in, "--meta-iters", "1", "--out", str(tmp_path / "b")]) == 0
    resumed = json.loads((tmp_path / "b" / "results.json").read_text())["returns_after_steps"]
    # The same evaluation tasks and keys: the resumed run starts where the first one ended.
    np.testing.assert_allclose(
        resumed["initialisation"], table["MAML after 2 meta-iterations"], rtol=1e-5
    )


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("rl_locomotion", ["--tasks", "0"], "--tasks must be at least 1"),
        ("rl_locomotion", ["--eval-tasks", "1"], "--eval-tasks"),
        ("rl_locomotion", ["--params-in", "/nonexistent.npz"], "is not a file"),
        ("bench_locomotion", ["--backends", "bullet"], "unknown backends ['bullet']"),
        ("bench_locomotion", ["--horizon", "0"], "must be at least 1"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(name, argv, message, capsys):
    assert _script(name).main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
