"""Orbax checkpoints of the training state, written atomically.

Orbax writes each checkpoint into a temporary directory and renames it into place when it is
complete, so a process that dies mid-write leaves only a ``*.orbax-checkpoint-tmp-*`` directory,
which is never listed or loaded. Two managers live in a run directory: ``checkpoints/`` (the
latest states, for resuming) and ``best/`` (the parameters that did best on validation).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

PyTree = Any


class CheckpointStore:
    """Save and restore ``(state pytree, JSON metadata)`` pairs under one directory."""

    def __init__(self, directory: str, max_to_keep: int):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: PyTree, metadata: dict) -> None:
        if step in self._manager.all_steps():
            return
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)
        )
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def restore(self, template: PyTree, step: int | None = None) -> tuple[PyTree, dict]:
        """Restore into the structure of ``template`` (NamedTuples included)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), metadata=ocp.args.JsonRestore()
        )
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as err:  # orbax raises several types for unreadable files
            raise RuntimeError(
                f"checkpoint {os.path.join(self.directory, str(step))} cannot be read "
                f"({type(err).__name__}: {err}); delete it to fall back to an earlier one"
            ) from err
        # Orbax returns NamedTuples (optax states, TrainState) as plain containers: re-impose
        # the template's tree structure on the restored leaves.
        treedef = jax.tree_util.tree_structure(template)
        state = jax.tree_util.tree_unflatten(treedef, jax.tree_util.tree_leaves(restored["state"]))
        return state, dict(restored["metadata"])

    def close(self) -> None:
        self._manager.close()
