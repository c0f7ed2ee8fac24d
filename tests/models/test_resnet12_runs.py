"""ResNet-12 through the runner: tiny MAML, ANIL and ProtoNets runs on mock miniImageNet, and
its batch-norm running statistics through ``meta_train_step`` and evaluation.

How running statistics meet MAML's inner loop (the rule the tests pin down): in training, every
forward pass normalises with the batch's statistics; the inner loop's updates of the running
statistics are discarded (``inner_loss`` keeps the loss only), the query pass's are returned,
averaged over the meta-batch and stored in ``TrainState.model_state`` by the outer step. In
evaluation mode (adaptation and query) the stored running statistics are used when
``model.eval_running_stats`` is true (the default) and the batch's statistics otherwise.

The mock records are 32x32 RGB (``fake_data_source``): with 84x84 images the second-order inner
loop through twelve convolutions takes minutes to compile on a 2-core CPU; the model and the
task code are the same at any size.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.algorithms.base import context
from metalearn.config import to_objects
from metalearn.runner.loop import train_and_evaluate
from metalearn.runner.steps import sample_tasks
from tests.conftest import compose_config, experiment_of
from tests.data.test_task_registry import fake_data_source

MOCK_SHAPE = (32, 32, 3)
NARROW = "model.filters=[4,4,8,8]"


def overrides(algorithm: str, data_dir: str, *extra: str) -> list[str]:
    if algorithm == "protonet":  # no inner loop: the ProtoNet experiment, on miniImageNet
        out = ["+experiment=omniglot_5w1s_protonet", "data=miniimagenet"]
    else:
        out = ["+experiment=miniimagenet_5w1s", f"algorithm={algorithm}"]
    out += [
        "+debug=tiny",
        "model=resnet12",
        NARROW,
        "trainer.meta_batch_size=1",
        f"data.data_dir={data_dir}",
        "data.num_queries=2",
        *extra,
    ]
    if algorithm != "protonet":
        out.append("algorithm.inner_steps=1")
    return out


def config(algorithm: str, data_dir: str, *extra: str):
    return to_objects(compose_config(overrides(algorithm, data_dir, *extra)))


def mock_miniimagenet():
    return tfds.testing.mock_data(as_data_source_fn=fake_data_source(MOCK_SHAPE))


@pytest.mark.parametrize("algorithm", ["maml", "anil", "protonet"])
def test_tiny_run_on_mock_miniimagenet(algorithm, tmp_path):
    cfg = config(algorithm, str(tmp_path / "tfds"))
    assert cfg.model.name == "resnet12" and cfg.data.name == "miniimagenet"
    with mock_miniimagenet():
        summary = train_and_evaluate(cfg, str(tmp_path / "run"))
    assert summary["step"] == cfg.trainer.meta_steps and not summary["interrupted"]
    records = json.loads((tmp_path / "run" / "eval.json").read_text())
    accuracy = [r for r in records if r["metric"] == "accuracy"]
    assert accuracy and all(0.0 <= r["mean"] <= 1.0 and r["nonfinite"] == 0 for r in accuracy)
    assert all(r["tasks"] == cfg.eval.num_tasks for r in records)


def build(algorithm: str, data_dir: str, *extra: str):
    with mock_miniimagenet():
        return experiment_of(config(algorithm, data_dir, *extra))


def stats_leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state["batch_stats"])]


@pytest.mark.parametrize("algorithm", ["maml", "protonet"])
def test_a_meta_step_updates_the_running_statistics_from_the_query_pass(algorithm, tmp_path):
    exp = build(algorithm, str(tmp_path))
    state = exp.initial_state
    tasks = sample_tasks(exp.tasks, exp.tasks.splits["train"], jax.random.key(5), 2, 1)
    new_state, metrics = jax.jit(exp.meta_train_step(meta_steps=4))(state, tasks)
    assert int(new_state.step) == 1 and np.isfinite(float(metrics["accuracy"]))
    before, after = stats_leaves(state.model_state), stats_leaves(new_state.model_state)
    assert len(after) == 32  # mean and var of 16 batch norms
    assert all(not np.allclose(a, b) for a, b in zip(before, after, strict=True))
    # Independent check on the first norm of the mean over tasks of momentum 0.1 updates from the
    # zero / one initial statistics: a ProtoNet query pass sees the query images through the
    # meta-parameters' first convolution (MAML's sees the adapted one, checked only as changed).
    if algorithm == "protonet":
        kernel = np.asarray(state.meta_params["block1_conv1"]["kernel"], np.float64)
        means, variances = [], []
        for t in range(2):
            x = np.asarray(tasks.query[0][t], np.float64)
            y = jax.lax.conv_general_dilated(
                x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            y = np.asarray(y)
            means.append(y.mean((0, 1, 2)))
            variances.append(y.var((0, 1, 2)))
        stats = new_state.model_state["batch_stats"]["block1_norm1"]
        np.testing.assert_allclose(stats["mean"], 0.1 * np.mean(means, 0), rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(
            stats["var"], 0.9 + 0.1 * np.mean(variances, 0), rtol=1e-3, atol=1e-6
        )


def shifted(model_state, factor: float):
    """The running statistics with every mean moved by 0.5 and every variance scaled."""
    stats = {
        name: {"mean": entry["mean"] + 0.5, "var": entry["var"] * factor}
        for name, entry in model_state["batch_stats"].items()
    }
    return {**model_state, "batch_stats": stats}


@pytest.mark.parametrize("running", [True, False])
def test_evaluation_uses_the_stored_statistics_when_the_config_says(running, tmp_path):
    exp = build("maml", str(tmp_path), f"model.eval_running_stats={running}")
    state = exp.initial_state
    task = exp.tasks.sample(exp.tasks.splits["test"], jax.random.key(7), 1)
    evaluate = jax.jit(lambda p, s: exp.learner.evaluate(p, task, context(s), (0, 1)))
    stored = evaluate(state.meta_params, state.model_state)
    changed = evaluate(state.meta_params, shifted(state.model_state, 4.0))
    differs = not np.allclose(stored["loss"], changed["loss"], rtol=1e-6)
    assert differs == running
    # Evaluation mode reads the statistics and never writes them.
    _, out = exp.model.apply(
        state.meta_params, state.model_state, None, jnp.asarray(task.query[0]), False
    )
    assert all(
        np.array_equal(a, b)
        for a, b in zip(stats_leaves(out), stats_leaves(state.model_state), strict=True)
    )
