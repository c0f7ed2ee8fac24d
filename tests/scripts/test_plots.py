"""The plot scripts produce PNGs from a real (tiny) run directory."""

import json
import subprocess
import sys

from omegaconf import OmegaConf

from metalearn.config import to_objects
from metalearn.runner.loop import train_and_evaluate
from tests.cli import REPO, checkout_env, run_script
from tests.conftest import compose_config


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
            cwd=REPO,
            env=checkout_env(),  # the scripts import this checkout's metalearn
        )
        assert result.returncode == 0, result.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = subprocess.run(
        [sys.executable, "scripts/plot_learning_curves.py", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=checkout_env(),
    )
    assert missing.returncode == 2 and "not found" in missing.stderr


def _rl_run(directory, name, means):
    """A run directory as `python -m metalearn.train` leaves it: eval.json and config.yaml."""
    directory.mkdir()
    records = [
        {"metric": "return", "shots": 1, "steps": s, "mean": m, "ci95": 1.0, "tasks": 100}
        for s, m in enumerate(means)
    ]
    (directory / "eval.json").write_text(json.dumps(records))
    (directory / "config.yaml").write_text(f"name: {name}\n")
    return directory


def test_rl_returns_figure_and_table_from_run_directories(tmp_path):
    maml = _rl_run(tmp_path / "a", "rl_nav2d_maml", [-40.0, -12.0, -8.0, -7.5])
    random = _rl_run(tmp_path / "b", "rl_nav2d_random", [-70.0, -68.0, -66.0, -65.0])
    out = tmp_path / "returns.png"
    result = run_script("plot_rl_returns.py", str(maml), str(random), "--out", str(out), "--table")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rl_nav2d_maml | -40.00 ± 1.00 | -12.00 ± 1.00 | -8.00 ± 1.00 | -7.50 ± 1.00 |" in (
        result.stdout
    )
    bad = run_script("plot_rl_returns.py", str(maml), str(tmp_path / "missing"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "eval.json" in bad.stderr


def test_rl_returns_from_an_evaluation_file(tmp_path):
    """A checkpoint re-evaluated by `metalearn.evaluate --out FILE` stands for its run."""
    maml = _rl_run(tmp_path / "a", "rl_cheetah_dir_maml", [-40.0, -12.0, -8.0, -7.5])
    later = maml / "eval_latest_100_tasks.json"
    records = json.loads((maml / "eval.json").read_text())
    later.write_text(json.dumps([{**r, "mean": r["mean"] + 1.0} for r in records]))
    result = run_script(
        "plot_rl_returns.py", str(maml), str(later), "--out", str(tmp_path / "r.png"), "--table"
    )
    assert result.returncode == 0, result.stderr
    assert "| rl_cheetah_dir_maml | -40.00 ± 1.00 |" in result.stdout
    assert "| rl_cheetah_dir_maml (eval_latest_100_tasks) | -39.00 ± 1.00 |" in result.stdout


def test_rl_training_curves_on_a_linear_axis_and_a_named_metric(tmp_path):
    run = tmp_path / "rl"
    run.mkdir()
    lines = [
        {"split": "train", "step": s, "train/pre_return": -40.0 + s, "train/post_return": -30.0}
        for s in (1, 2, 3)
    ]
    lines.append(
        {
            "split": "val",
            "step": 3,
            "eval": [{"metric": "return", "shots": 1, "steps": 1, "mean": -20.0, "ci95": 2.0}],
        }
    )
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "curves.png"
    args = ["--metrics", "pre_return,post_return", "--out", str(out)]
    result = run_script("plot_learning_curves.py", str(run), *args)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_script("plot_learning_curves.py", str(run), "--metrics", "reward")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")
    assert "no training metric reward" in bad.stderr and "post_return" in bad.stderr
