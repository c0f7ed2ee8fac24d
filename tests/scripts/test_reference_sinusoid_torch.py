"""scripts/reference_sinusoid_torch.py: the independent PyTorch MAML behind the sinusoid seed study.

Its runs are only evidence about metalearn's seeds if it is the same algorithm: its meta-gradient
must equal metalearn's ``maml_loss`` gradient on the same parameters and tasks (float64), and its
initialisation must be the reference code's truncated normal.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn import maml_loss

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is an optional extra: pip install torch==2.13.0 (CPU build)",
)
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def ref(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import reference_sinusoid_torch

    return reference_sinusoid_torch


def mlp(params, x):
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i < len(params) - 2:
            h = jax.nn.relu(h)
    return h


def test_meta_gradient_equals_metalearns(ref):
    import torch

    rng = np.random.default_rng(3)
    # Weights far from the 0.01 initialisation, so that every ReLU and both orders matter.
    sizes = (1, 40, 40, 1)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        params += [rng.normal(0, 0.5, (fan_in, fan_out)), rng.normal(0, 0.5, fan_out)]
    batch = [t.double() for t in ref.sample_tasks(rng, 4, 10, 10)]

    torch_params = [torch.tensor(p, requires_grad=True) for p in params]
    ref.meta_loss(torch_params, batch).backward()
    torch_grads = [p.grad.numpy() for p in torch_params]

    with jax.enable_x64(True):
        xs, ys, xq, yq = (jnp.asarray(t.numpy()) for t in batch)

        def task_loss(p, data):
            x, y = data
            return jnp.mean((mlp(p, x) - y) ** 2)

        def outer(p, first_order):
            per_task = jax.vmap(
                lambda s_x, s_y, q_x, q_y: maml_loss(
                    task_loss,
                    p,
                    (s_x, s_y),
                    (q_x, q_y),
                    inner_lr=ref.INNER_LR,
                    first_order=first_order,
                )
            )
            return per_task(xs, ys, xq, yq).mean()

        jax_params = [jnp.asarray(p) for p in params]
        jax_grads = jax.grad(outer)(jax_params, False)
        # first order differs: the second-order term must be visible at this tolerance
        fo_grads = jax.grad(outer)(jax_params, True)
    for mine, theirs in zip(torch_grads, jax_grads, strict=True):
        np.testing.assert_allclose(mine, np.asarray(theirs), rtol=1e-10, atol=1e-12)
    gap = max(
        float(np.abs(a - np.asarray(b)).max()) for a, b in zip(torch_grads, fo_grads, strict=True)
    )
    assert gap > 1e-6


def test_adapt_takes_each_tasks_own_step(ref):
    """Batched by hand, the inner step of task i must not see task j's loss."""
    import torch

    rng = np.random.default_rng(0)
    params = ref.init_params(torch.Generator().manual_seed(0))
    xs, ys, _, _ = ref.sample_tasks(rng, 3, 5, 5)
    together = ref.adapt(params, xs, ys, 2, create_graph=False)[-1]
    for i in range(3):
        alone = ref.adapt(params, xs[i : i + 1], ys[i : i + 1], 2, create_graph=False)[-1]
        for a, b in zip(together, alone, strict=True):
            torch.testing.assert_close(a[i : i + 1], b)


def test_truncated_normal_is_the_references(ref):
    import torch

    draws = ref.truncated_normal((200_000,), 0.01, torch.Generator().manual_seed(1)).numpy()
    assert np.abs(draws).max() <= 0.02
    # a standard normal cut at +-2 has standard deviation 0.8796
    assert draws.std() == pytest.approx(0.01 * 0.8796, rel=0.01)
    assert abs(draws.mean()) < 1e-4


def test_a_short_run_writes_its_record(ref, tmp_path):
    record = ref.main(["--steps", "20", "--log-every", "10", "--json", str(tmp_path / "r.json")])
    assert (tmp_path / "r.json").exists()
    assert [c["step"] for c in record["curve"]] == [10, 20]
    cell = record["test_queries_k"]["shots=5 steps=10"]
    assert np.isfinite(cell["mean"]) and cell["ci95"] > 0 and cell["nonfinite"] == 0
    assert cell["diverged"] == 0 and cell["median"] <= cell["max"]
    assert [np.shape(p) for p in record["params"]] == [
        (1, 40),
        (40,),
        (40, 40),
        (40,),
        (40, 1),
        (1,),
    ]


def test_blown_up_tasks_are_counted(ref, monkeypatch):
    """Past the stability limit a few tasks blow up (finite, here) and the record counts them."""
    import torch

    params = ref.init_params(torch.Generator().manual_seed(0))
    monkeypatch.setattr(ref, "INNER_LR", 0.5)
    cell = ref.evaluate(params, seed=0, queries=10)["shots=5 steps=10"]
    assert cell["nonfinite"] == 0 < cell["diverged"] < 60
    assert cell["max"] > 1e6 * cell["median"] > 0
    monkeypatch.setattr(ref, "INNER_LR", 1e-3)
    assert ref.evaluate(params, seed=0, queries=10)["shots=5 steps=10"]["diverged"] == 0
