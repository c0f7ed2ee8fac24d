"""The checkpoint store's check of a restore template against the saved arrays' metadata."""

from __future__ import annotations

import os
from typing import NamedTuple

import jax.numpy as jnp

from metalearn.runner.checkpoints import CheckpointStore, stored_mismatch


class State(NamedTuple):
    step: jnp.ndarray
    params: dict


def saved(tmp_path) -> str:
    store = CheckpointStore(str(tmp_path / "checkpoints"), 2)
    state = State(jnp.array(3), {"dense": {"kernel": jnp.zeros((4, 2)), "bias": jnp.zeros(2)}})
    store.save(3, state, {"note": "x"})
    return os.path.join(store.step_dir(3), "state")


def test_a_fitting_template_passes(tmp_path):
    state_dir = saved(tmp_path)
    same = State(jnp.array(0), {"dense": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones(2)}})
    assert stored_mismatch(state_dir, same) is None


def test_a_different_shape_is_named_with_both_shapes(tmp_path):
    state_dir = saved(tmp_path)
    wider = State(jnp.array(0), {"dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(2)}})
    assert stored_mismatch(state_dir, wider) == (
        "params/dense/kernel has shape (4, 2) stored, (4, 3) in this config"
    )


def test_arrays_only_one_side_has_are_named(tmp_path):
    state_dir = saved(tmp_path)
    deeper = State(
        jnp.array(0),
        {"dense": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones(2)}, "head": {"b": jnp.ones(1)}},
    )
    assert stored_mismatch(state_dir, deeper) == (
        "params/head/b is in this config only (3 arrays stored, 4 in this config)"
    )
    no_bias = State(jnp.array(0), {"dense": {"kernel": jnp.ones((4, 2))}})
    assert stored_mismatch(state_dir, no_bias) == (
        "params/dense/bias is in the checkpoint, not in this config (3 arrays stored, 2 in this "
        "config)"
    )


def test_unreadable_metadata_leaves_the_verdict_to_the_restore(tmp_path):
    assert stored_mismatch(str(tmp_path / "nothing_here"), State(jnp.array(0), {})) is None
