"""The plot scripts produce PNGs from a real (tiny) run directory."""

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from metalearn.config import to_objects
from metalearn.runner.loop import train_and_evaluate
from tests.conftest import compose_config

# The scripts import this checkout's metalearn, whatever else is installed.
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def test_learning_curves_and_figure2_from_a_run(tmp_path):
    composed = compose_config(["+experiment=sinusoid_maml", "+debug=tiny"])
    train_and_evaluate(to_objects(composed), str(tmp_path))
    OmegaConf.save(composed, tmp_path / "config.yaml")
    for script, extra in [
        ("scripts/plot_learning_curves.py", []),
        ("scripts/plot_sinusoid.py", ["--shots", "5"]),
    ]:
        out = tmp_path / (script.split("/")[-1] + ".png")
        result = subprocess.run(
            [sys.executable, script, str(tmp_path), *extra, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env=ENV,
        )
        assert result.returncode == 0, result.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = subprocess.run(
        [sys.executable, "scripts/plot_learning_curves.py", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert missing.returncode == 2 and "not found" in missing.stderr
