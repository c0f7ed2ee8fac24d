"""scripts/rl_nav2d.py end to end on a tiny configuration, and its refusal of bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rl_nav2d.py"


def _script():
    spec = importlib.util.spec_from_file_location("rl_nav2d", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_results_and_plot(tmp_path):
    tiny = ["--meta-iters", "2", "--tasks", "2", "--rollouts", "2", "--hidden", "8"]
    evaluation = ["--eval-goals", "3", "--eval-rollouts", "2", "--out", str(tmp_path)]
    assert _script().main(tiny + evaluation) == 0
    results = json.loads((tmp_path / "nav2d_results.json").read_text())
    table = results["returns_after_steps"]
    assert set(table) == {"MAML", "pretrained", "random"}
    assert all(len(rows) == 4 for rows in table.values())  # after 0, 1, 2, 3 inner steps
    assert len(results["maml_history"]) == 2 and len(results["pretrained_history"]) == 2
    assert results["timing"]["env_steps_per_meta_iteration"] == 2 * 2 * 2 * 100
    assert (tmp_path / "nav2d_returns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [(["--tasks", "0"], "--tasks must be at least 1"), (["--eval-goals", "1"], "--eval-goals")],
)
def test_bad_input_is_one_error_line_and_exit_2(argv, message, capsys):
    assert _script().main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
