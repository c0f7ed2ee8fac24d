"""scripts/bench_locomotion.py refuses bad input with one error line. (Locomotion MAML-RL runs
go through the runner: tests/rl/test_locomotion.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _bench_locomotion():
    path = SCRIPTS / "bench_locomotion.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backends", "bullet"], "unknown backends ['bullet']"),
        (["--horizon", "0"], "must be at least 1"),
        (["--tasks", "3", "--devices", "2"], "must be a multiple of --devices"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(argv, message, capsys):
    assert _bench_locomotion().main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
