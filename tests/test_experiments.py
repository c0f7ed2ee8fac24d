"""Every experiment config composes and its tiny version trains and evaluates end to end.

Image experiments run on ``tfds.testing.mock_data`` (random images in each dataset's shape), with
Conv4 narrowed to 8 filters, one task per meta-batch and one inner step. One experiment per task
distribution runs by default; the others (other shot counts, and miniImageNet's 84x84 images,
which take minutes to compile on a 2-core CPU) carry the ``slow`` marker (``--runslow``).
"""

import json

import pytest
import tensorflow_datasets as tfds

from metalearn.config import to_objects
from metalearn.rl.envs.locomotion import FAMILIES as LOCOMOTION
from metalearn.runner.loop import train_and_evaluate
from tests.cli import RL_TINY
from tests.conftest import EXPERIMENTS, compose_config
from tests.data.test_task_registry import (
    CLASSES_PER_SPLIT,
    IMAGE_SHAPES,
    PER_CLASS,
    fake_data_source,
)


def tiny_overrides(experiment: str, data_dir: str) -> list[str]:
    base = [f"+experiment={experiment}", "+debug=tiny"]
    composed = compose_config(base)
    overrides = list(base)
    if composed.model.name == "conv4":
        # Second-order inner loops through convolutions are what costs compile time on a CPU:
        # one inner step on one task per meta-step keeps every code path at a fraction of it.
        overrides += ["model.filters=8", "trainer.meta_batch_size=1"]
        if "inner_steps" in composed.algorithm:
            overrides.append("algorithm.inner_steps=1")
    if composed.model.name == "rrnet":  # R2D2's network, narrowed as Conv4 is
        overrides.append("model.filters=[8,8,8,8]")
    if composed.data.name in IMAGE_SHAPES:
        overrides.append(f"data.data_dir={data_dir}")
    if composed.data.get("train_ways"):  # more ways than tests, within the mock classes
        classes = CLASSES_PER_SPLIT * (4 if composed.data.name == "omniglot" else 1)
        overrides.append(f"data.train_ways={min(10, classes)}")
    shots = max(composed.trainer.shots, *composed.eval.get("shots", [1]))
    if composed.data.name in IMAGE_SHAPES:  # the mock's classes are small
        if shots + composed.data.num_queries > PER_CLASS:
            overrides.append(f"data.num_queries={PER_CLASS - shots}")
        train_queries = composed.data.get("train_queries")
        train_shots = max(composed.trainer.shots, *(composed.data.get("train_shots_range") or [1]))
        if train_queries and train_shots + train_queries > PER_CLASS:
            overrides.append(f"data.train_queries={PER_CLASS - train_shots}")
    if composed.algorithm.name == "maml_rl":
        overrides += RL_TINY[2:]  # few rollouts, a small policy
    return overrides


DEFAULT = {
    "sinusoid_maml",
    "sinusoid_maml_k5",
    "omniglot_5w1s",
    "omniglot_20w1s",
    "cifarfs_5w1s",
    "fc100_5w1s",
    "omniglot_5w1s_protonet",
    "miniimagenet_5w1s_baseline_pp",
    "sinusoid_cavia",  # 12 s: no second-order loop through 84x84 convolutions
    "cifarfs_5w1s_r2d2",  # 15 s: R2D2's own network (model=rrnet) end to end
}
PARAMS = [e if e in DEFAULT else pytest.param(e, marks=pytest.mark.slow) for e in EXPERIMENTS]


@pytest.mark.parametrize("experiment", PARAMS)
def test_tiny_version_of_every_experiment_runs(experiment, tmp_path):
    cfg = to_objects(compose_config(tiny_overrides(experiment, str(tmp_path / "tfds"))))
    if getattr(cfg.data, "env", None) in LOCOMOTION:
        pytest.importorskip("brax", reason="locomotion needs: pip install '.[locomotion]'")
    workdir = tmp_path / "run"
    if cfg.data.name in IMAGE_SHAPES:
        with tfds.testing.mock_data(
            as_data_source_fn=fake_data_source(IMAGE_SHAPES[cfg.data.name])
        ):
            summary = train_and_evaluate(cfg, str(workdir))
    else:
        summary = train_and_evaluate(cfg, str(workdir))
    assert summary["step"] == cfg.trainer.meta_steps and not summary["interrupted"]
    assert summary["wall_seconds"] > summary["train_seconds"] > 0  # data and evaluation too
    records = json.loads((workdir / "eval.json").read_text())
    assert records and all(r["tasks"] == cfg.eval.num_tasks for r in records)
    if cfg.data.name in IMAGE_SHAPES:
        accuracy = [r for r in records if r["metric"] == "accuracy"]
        assert accuracy and all(r["ways"] == cfg.data.ways for r in accuracy)
        assert all(0.0 <= r["mean"] <= 1.0 for r in accuracy)


ALGORITHMS = ["maml", "fomaml", "reptile", "anil", "meta_sgd", "mamlpp", "imaml", "boil"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tiny_run_of_every_algorithm_on_sinusoid(algorithm, tmp_path):
    cfg = to_objects(
        compose_config(["+experiment=sinusoid_maml", "+debug=tiny", f"algorithm={algorithm}"])
    )
    summary = train_and_evaluate(cfg, str(tmp_path))
    assert summary["step"] == cfg.trainer.meta_steps
    records = json.loads((tmp_path / "eval.json").read_text())
    assert {r["metric"] for r in records} == {"mse"}
    assert all(r["mean"] is not None and r["nonfinite"] == 0 for r in records)


FEWSHOT_ALGORITHMS = [
    ("r2d2", "conv4"),
    ("boil", "conv4"),
    ("r2d2", "resnet12"),  # 19 s on a 2-core CPU
    pytest.param("boil", "resnet12", marks=pytest.mark.slow),  # 26 s: second-order inner loop
    ("metaoptnet_svm", "conv4"),
    pytest.param("metaoptnet_svm", "resnet12", marks=pytest.mark.slow),  # 22 s
    ("cavia", "conv4"),
    ("baseline", "conv4"),
    ("baseline_pp", "conv4"),
    pytest.param("baseline_pp", "resnet12", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("algorithm, model", FEWSHOT_ALGORITHMS)
def test_tiny_run_of_the_classification_algorithms_on_mock_omniglot(algorithm, model, tmp_path):
    """R2D2, MetaOptNet-SVM, Baseline, Baseline++ (classification only) and BOIL on
    Omniglot-shaped mock episodes, end to end."""
    overrides = [
        "+experiment=omniglot_5w1s_protonet",
        "+debug=tiny",
        f"algorithm={algorithm}",
        f"model={model}",
        f"data.data_dir={tmp_path / 'tfds'}",
        "trainer.meta_batch_size=1",
        "model.filters=8" if model == "conv4" else "model.filters=[4,4,4,4]",
    ]
    if algorithm in ("boil", "cavia"):
        overrides += ["algorithm.inner_steps=1", "eval.steps=[0,1]"]
    if algorithm == "metaoptnet_svm":  # its dual grows with the classes: 10-way training
        overrides += ["data.train_ways=10"]
    if algorithm.startswith("baseline"):  # a classifier over every training class
        overrides += ["data.train_labels=class", "data.train_ways=10", "eval.steps=[0,5]"]
    cfg = to_objects(compose_config(overrides))
    assert (cfg.algorithm.name, cfg.model.name) == (algorithm, model)
    with tfds.testing.mock_data(as_data_source_fn=fake_data_source(IMAGE_SHAPES["omniglot"])):
        summary = train_and_evaluate(cfg, str(tmp_path / "run"))
    assert summary["step"] == cfg.trainer.meta_steps and not summary["interrupted"]
    records = json.loads((tmp_path / "run" / "eval.json").read_text())
    accuracy = [r for r in records if r["metric"] == "accuracy"]
    assert accuracy and all(r["ways"] == cfg.data.ways for r in accuracy)
    assert all(0.0 <= r["mean"] <= 1.0 and r["nonfinite"] == 0 for r in accuracy)
