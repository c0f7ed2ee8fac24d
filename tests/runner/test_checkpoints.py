"""The checkpoint store: its check of a restore template against the saved arrays' metadata,
the unfinished saves a killed process leaves, and failed restores."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from typing import NamedTuple

import jax.numpy as jnp

from metalearn.runner.checkpoints import CHECKSUMMED, CheckpointStore, stored_mismatch
from tests.cli import checkout_env, finished


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


def _unfinished_save(directory) -> str:
    """What a process killed mid-save leaves: orbax's temporary directory, here a complete copy
    of step 3 (loadable, were it taken for a step)."""
    tmp = os.path.join(directory, "5.orbax-checkpoint-tmp-1234")
    shutil.copytree(os.path.join(directory, "3"), tmp)
    return tmp


def test_an_unfinished_save_is_never_restored_and_is_removed_when_the_store_is_reopened(
    tmp_path, caplog
):
    saved(tmp_path)
    tmp = _unfinished_save(tmp_path / "checkpoints")
    with caplog.at_level(logging.INFO, logger="metalearn"):
        store = CheckpointStore(str(tmp_path / "checkpoints"), 2)
    assert "removing 1 unfinished checkpoint save(s)" in caplog.text
    assert store.latest_step() == 3 and store.newest_intact_step() == 3
    template = State(jnp.array(0), {"dense": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones(2)}})
    restored, metadata = store.restore_intact(template)
    assert int(restored.step) == 3 and metadata == {"note": "x"}
    limit_s = 300  # a safety limit only: orbax removes it in a thread of its own
    deadline = time.monotonic() + limit_s
    while os.path.exists(tmp):
        assert time.monotonic() < deadline, f"waited {limit_s} s for orbax to remove {tmp}"
        time.sleep(0.05)
    store.close()


def test_the_next_save_waits_for_the_removal_and_only_the_primary_host_removes(tmp_path):
    state_dir = saved(tmp_path)
    tmp = _unfinished_save(tmp_path / "checkpoints")
    other_host = CheckpointStore(str(tmp_path / "checkpoints"), 2, primary=False)
    time.sleep(0.5)
    assert os.path.exists(tmp) and other_host.latest_step() == 3
    other_host.close()
    store = CheckpointStore(str(tmp_path / "checkpoints"), 2)
    template = State(jnp.array(4), {"dense": {"kernel": jnp.ones((4, 2)), "bias": jnp.ones(2)}})
    store.save(4, template, {"note": "y"})
    assert not os.path.exists(tmp)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "4", CHECKSUMMED]
    assert stored_mismatch(state_dir, template) is None
    store.close()


# Twenty restores of a damaged checkpoint of an older layout (no manifests, so the restore is the
# test), in one process, as the command line would make them.
OLDER_LAYOUT_RESTORES = """
import pathlib, shutil, sys, time
import jax.numpy as jnp
from metalearn.runner.checkpoints import CHECKSUMMED, MANIFEST, CheckpointStore
root = pathlib.Path(sys.argv[1])
state = {f"a{i}": jnp.full((64,), float(i)) for i in range(20)}
store = CheckpointStore(str(root / "older"), 2)
store.save(1, state, {"step": 1})
store.save(2, state, {"step": 2})
store.close()
(root / "older" / CHECKSUMMED).unlink()
for manifest in root.rglob(MANIFEST):
    manifest.unlink()
for attempt in range(20):
    copy = root / str(attempt)
    shutil.copytree(root / "older", copy)
    for data in (copy / "2" / "state" / "d").iterdir():
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert CheckpointStore(str(copy), 2).restore_intact(state)[1] == {"step": 1}
time.sleep(0.5)  # for any read that outlived its restore to report
"""


def test_a_failed_restore_leaves_no_read_behind_to_print_tracebacks(tmp_path):
    # Orbax closed the event loop of a restore at the first read that failed, with the others
    # pending; as each ended, TensorStore's thread called the closed loop and Python printed a
    # "RuntimeError: Event loop is closed" traceback: 16-55 of them over these 20 restores, in
    # each of 5 processes (cancelling the pending reads instead of letting them end: 21-39).
    result = finished(
        [sys.executable, "-c", OLDER_LAYOUT_RESTORES, str(tmp_path)], 300, env=checkout_env()
    )
    assert result.returncode == 0, result.stderr
    for noise in ("Traceback", "Exception ignored", "Event loop is closed"):
        assert noise not in result.stderr, result.stderr
    assert result.stderr.count("damaged checkpoint in ") == 20, result.stderr
