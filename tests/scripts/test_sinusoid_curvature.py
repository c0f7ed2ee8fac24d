"""scripts/sinusoid_curvature.py: its eigenvalues against a full Hessian; the plot script."""

import importlib.util
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from omegaconf import OmegaConf

from metalearn import hessian
from metalearn.config import to_objects
from metalearn.runner.evaluation import evaluation_keys
from metalearn.runner.loop import train_and_evaluate
from metalearn.runner.steps import sample_tasks_from_keys
from tests.conftest import compose_config, experiment_of

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_curvature_at_step_zero_equals_the_full_hessian_and_the_plot_draws(tmp_path):
    overrides = ["+experiment=sinusoid_maml", "+debug=tiny", "algorithm.inner_lr=0.01"]
    composed = compose_config(overrides)
    cfg = to_objects(composed)
    train_and_evaluate(cfg, str(tmp_path))
    OmegaConf.save(composed, tmp_path / "config.yaml")
    out = tmp_path / "curv.json"
    args = [str(tmp_path), "--every", "2", "--tasks", "1", "--inner-steps", "2", "--out", str(out)]
    assert load("sinusoid_curvature").main([*args, "--from-checkpoints"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == [0, 2, 4]
    # Independent: the largest eigenvalue of the full 1761 x 1761 Hessian of the support loss
    # of the one validation task, at the initial parameters.
    exp = experiment_of(cfg)
    task = sample_tasks_from_keys(
        exp.tasks, exp.tasks.splits["val"], evaluation_keys(cfg.eval.seed, "val", 5, 1), 5
    )
    task = jax.tree_util.tree_map(lambda x: x[0], task)
    params = exp.initial_state.meta_params
    flat, unravel = ravel_pytree(params)
    state = exp.initial_state.model_state
    inputs, targets = task.support

    def support_mse(v):  # written out here, not the objective's loss
        outputs, _ = exp.model.apply(unravel(v), state, jax.random.key(0), inputs, True)
        return jax.numpy.mean((outputs - targets) ** 2)

    full = hessian(support_mse)(flat)
    top = float(np.linalg.eigvalsh(np.asarray(full, np.float64))[-1])
    assert rows[0]["lam0_median"] == pytest.approx(top, rel=1e-3)
    assert rows[0]["two_over_alpha"] == pytest.approx(200.0)
    assert rows[0]["lam0_above"] == float(top > 200.0)
    png = tmp_path / "curv.png"
    assert load("plot_curvature").main([str(out), "--labels", "tiny", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
