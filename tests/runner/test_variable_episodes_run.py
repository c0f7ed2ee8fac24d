"""Tiny end-to-end runs on variable-way, variable-shot Omniglot episodes (TFDS mock data)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.config import to_objects
from metalearn.runner.loop import train_and_evaluate
from tests.conftest import compose_config
from tests.data.test_task_registry import fake_data_source

VARIABLE = ["data.ways_range=[2,4]", "data.shots_range=[1,3]", "data.num_queries=2"]


@pytest.mark.parametrize("experiment", ["omniglot_5w1s", "omniglot_5w1s_protonet"])
def test_tiny_variable_episode_run(experiment, tmp_path):
    cfg = to_objects(
        compose_config(
            [
                f"+experiment={experiment}",
                "+debug=tiny",
                *VARIABLE,
                "trainer.shots=3",
                "eval.shots=[3]",
                "model.filters=4",
                f"data.data_dir={tmp_path / 'tfds'}",
            ]
        )
    )
    with tfds.testing.mock_data(as_data_source_fn=fake_data_source((28, 28, 1))):
        summary = train_and_evaluate(cfg, str(tmp_path))
    assert not summary["interrupted"] and summary["step"] == 4
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if line["split"] == "train"]
    assert train and all(np.isfinite(line["train/loss"]) for line in train)
    assert all(0.0 <= line["train/accuracy"] <= 1.0 for line in train)
    records = json.loads((tmp_path / "eval.json").read_text())
    assert records and {(r["ways"], r["shots"]) for r in records} == {(4, 3)}
    for r in records:
        assert r["nonfinite"] == 0 and np.isfinite(r["mean"])
        if r["metric"] == "accuracy":
            assert 0.0 <= r["mean"] <= 1.0


def test_a_shots_argument_other_than_the_range_maximum_is_refused(tmp_path):
    cfg = to_objects(
        compose_config(
            [
                "+experiment=omniglot_5w1s_protonet",
                "+debug=tiny",
                *VARIABLE,
                "trainer.shots=2",
                "eval.shots=[2]",
                "model.filters=4",
                f"data.data_dir={tmp_path / 'tfds'}",
            ]
        )
    )
    refused = pytest.raises(ValueError, match=r"data.shots_range=\[1, 3\] pads every episode")
    with tfds.testing.mock_data(as_data_source_fn=fake_data_source((28, 28, 1))), refused:
        train_and_evaluate(cfg, str(tmp_path))
