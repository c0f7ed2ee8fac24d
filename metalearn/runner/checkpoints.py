"""Orbax checkpoints of the training state, written atomically, each with a checksum manifest
verified when loaded: a damaged checkpoint is moved aside to ``damaged/`` and the next older
intact one used; an intact one that does not fit the config is refused."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_leaves_with_path

from metalearn.runner.rundir import write_atomically

PyTree = Any
MANIFEST = "checksums.sha256"
# In a store from its first save: a step without a manifest is then a save that did not finish.
CHECKSUMMED = "checksummed"
DAMAGED = "damaged"
DRAIN_SECONDS = 30.0  # how long a failed restore's other reads may take to end
log = logging.getLogger("metalearn")


def _orbax() -> Any:
    """``orbax.checkpoint``, imported where a checkpoint is first touched: every process that
    imports the runner would pay its 0.2 s, a refused command line among them."""
    import orbax.checkpoint as ocp

    return ocp


def file_digests(directory: str) -> dict[str, str]:
    """sha256 of every file under ``directory`` (the manifest itself excluded), by relative path.

    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp(); _ = (pathlib.Path(d) / "a").write_text("x")
    >>> file_digests(d)
    {'a': '2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881'}
    """
    digests = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel != MANIFEST:
                with open(path, "rb") as f:
                    digests[rel] = hashlib.file_digest(f, "sha256").hexdigest()
    return dict(sorted(digests.items()))


def write_manifest(directory: str) -> None:
    """Write ``directory/checksums.sha256`` atomically."""
    lines = "".join(f"{digest}  {rel}\n" for rel, digest in file_digests(directory).items())
    write_atomically(os.path.join(directory, MANIFEST), lines)


class CheckpointMismatchError(ValueError):
    """An intact checkpoint whose parameters do not fit the config's (shape or structure)."""


# Orbax's (and stored_mismatch's) words for a template that does not fit the saved tree.
MISMATCH_MARKERS = (
    "tree structures do not match",
    "not compatible with the stored shape",
    "in this config",
)


def _names(path: tuple) -> tuple[str, ...]:
    """A pytree path as names, whatever node held each entry (orbax stores NamedTuples as dicts)."""
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def stored_mismatch(state_dir: str, template: PyTree) -> str | None:
    """How the arrays saved in ``state_dir`` differ from ``template``'s (None if they fit), from
    the metadata alone: no read starts for a template that cannot fit."""
    from etils import epath

    try:
        metadata = _orbax().StandardCheckpointHandler().metadata(epath.Path(state_dir))
    except Exception:  # noqa: BLE001 - unreadable metadata: the restore reports the damage
        return None
    tree = getattr(metadata, "item_metadata", metadata)
    stored = {_names(p): tuple(getattr(m, "shape", ())) for p, m in tree_leaves_with_path(tree)}
    wanted = {_names(p): tuple(np.shape(x)) for p, x in tree_leaves_with_path(template)}
    only_stored, only_wanted = sorted(stored.keys() - wanted), sorted(wanted.keys() - stored)
    if only_stored or only_wanted:
        name = "/".join(only_stored[0] if only_stored else only_wanted[0])
        where = "in the checkpoint, not in this config" if only_stored else "in this config only"
        return f"{name} is {where} ({len(stored)} arrays stored, {len(wanted)} in this config)"
    for path, shape in wanted.items():
        if stored[path] != shape:
            return f"{'/'.join(path)} has shape {stored[path]} stored, {shape} in this config"
    return None


def verify(directory: str, required: bool = True) -> str | None:
    """What is wrong with the files the manifest lists (or its absence if ``required``), or None."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return f"no {MANIFEST}: its save did not finish" if required else None
    try:
        with open(path, encoding="utf-8") as f:
            pairs = [line.rstrip("\n").split("  ", 1) for line in f]
        expected = {rel: digest for digest, rel in pairs}  # a ValueError unless two fields each
        if any(len(digest) != 64 for digest, _ in pairs):
            raise ValueError("not a sha256 digest")
    except ValueError:  # UnicodeDecodeError included
        return f"{MANIFEST} is unreadable"
    actual = file_digests(directory)
    for rel, digest in expected.items():
        if actual.get(rel) != digest:
            return f"{rel} fails its checksum" if rel in actual else f"{rel} is missing"
    return None


def _sync_hosts(tag: str) -> None:
    """Wait for every host of a multi-host run (no-op on one host); ``tag`` names the point."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(tag)


class _DrainingLoop(asyncio.SelectorEventLoop):
    """An event loop that, when closed, first lets its pending tasks end: orbax closes a
    restore's loop at its first failed read, and each other read still calls it as it ends."""

    def call_exception_handler(self, context: dict) -> None:
        if not str(context.get("message", "")).startswith("Task exception was never retrieved"):
            super().call_exception_handler(context)

    def close(self) -> None:
        if not self.is_closed() and not self.is_running():
            pending = [task for task in asyncio.all_tasks(self) if not task.done()]
            if pending:
                _, late = self.run_until_complete(asyncio.wait(pending, timeout=DRAIN_SECONDS))
                for task in late:
                    task.cancel()
                self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        super().close()


@contextlib.contextmanager
def _draining_event_loops() -> Iterator[None]:
    """Event loops made meanwhile (by orbax, in any thread) drain their pending tasks on close
    (asyncio's policies are deprecated from Python 3.14, in effect up to 3.16)."""
    previous, policy = asyncio.get_event_loop_policy(), asyncio.DefaultEventLoopPolicy()
    policy.new_event_loop = _DrainingLoop
    asyncio.set_event_loop_policy(policy)
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


def checksummed(directory: str) -> bool:
    """Whether the store in ``directory`` writes manifests (so every step must have one)."""
    return os.path.exists(os.path.join(directory, CHECKSUMMED))


def intact_steps(directory: str) -> list[int]:
    """The steps of the store in ``directory`` whose checksums verify, newest first."""
    if not os.path.isdir(directory):
        return []
    required = checksummed(directory)
    steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True)
    return [s for s in steps if verify(os.path.join(directory, str(s)), required) is None]


def newest_intact_step(directory: str) -> int | None:
    """The newest step of the store in ``directory`` whose checksums verify, or None."""
    return next(iter(intact_steps(directory)), None)


class CheckpointStore:
    """Save and restore ``(state pytree, JSON metadata)`` pairs under one directory."""

    def __init__(self, directory: str, max_to_keep: int, primary: bool = True):
        ocp = _orbax()
        self.directory = os.path.abspath(directory)
        self.primary = primary
        if primary and os.path.isdir(self.directory):  # orbax removes them, says nothing
            count = len(ocp.path.step.all_temporary_paths(self.directory))
            if count:
                log.info("removing %d unfinished checkpoint save(s) in %s", count, self.directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=False,
            create=True,
            cleanup_tmp_directories=primary,  # in a thread of orbax's, awaited by the next save
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def save(self, step: int, state: PyTree, metadata: dict) -> None:
        if step in self._manager.all_steps():
            return
        if self.primary and not checksummed(self.directory):
            marker = "every checkpoint here has a checksums.sha256 manifest\n"
            write_atomically(os.path.join(self.directory, CHECKSUMMED), marker)
        ocp = _orbax()
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)
        )
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()
        if self.primary:
            write_manifest(self.step_dir(step))
        _sync_hosts(f"manifest {self.directory} {step}")  # no host reads a step before it

    def restore(self, template: PyTree, step: int | None = None) -> tuple[PyTree, dict]:
        """Restore into the structure of ``template`` (NamedTuples included), unverified."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        ocp = _orbax()
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), metadata=ocp.args.JsonRestore()
        )
        with _draining_event_loops():  # no read of a failed restore outlives it
            mismatch = stored_mismatch(os.path.join(self.step_dir(step), "state"), template)
            if mismatch is not None:
                raise RuntimeError(mismatch)
            try:
                restored = self._manager.restore(step, args=args)
            except Exception as err:  # orbax raises several types for unreadable files
                raise RuntimeError(
                    f"checkpoint {self.step_dir(step)} cannot be read ({type(err).__name__})"
                ) from err
        # Orbax returns NamedTuples as plain containers: re-impose the template's structure.
        treedef = jax.tree_util.tree_structure(template)
        state = jax.tree_util.tree_unflatten(treedef, jax.tree_util.tree_leaves(restored["state"]))
        return state, dict(restored["metadata"])

    def newest_intact_step(self) -> int | None:
        return newest_intact_step(self.directory)

    def restore_intact(self, template: PyTree) -> tuple[PyTree, dict] | None:
        """The newest checkpoint that verifies and loads, or None; damaged newer ones move aside."""
        damaged, result, used = [], None, None
        for step in sorted(self._manager.all_steps(), reverse=True):
            problem = verify(self.step_dir(step), checksummed(self.directory))
            if problem is None:
                try:
                    result = self.restore(template, step)
                except RuntimeError as err:
                    reason = str(err.__cause__ or err)
                    problem = reason.splitlines()[0][:200]
                    intact = os.path.exists(os.path.join(self.step_dir(step), MANIFEST))
                    if intact and any(m in reason for m in MISMATCH_MARKERS):
                        raise CheckpointMismatchError(
                            f"the checkpoint of step {step} in {self.directory} is intact but "
                            f"does not fit this config's parameters ({problem.rstrip(':')}): a "
                            "setting that shapes the model (model.*, data.*, algorithm) differs "
                            "from the run's; use the run's own values for those settings"
                        ) from None
            if result is not None:
                used = step
                break
            damaged.append((step, problem, self._move_aside(step)))
        if damaged:
            _sync_hosts(f"moved aside {self.directory} {used}")  # the primary host moved them
            self._manager.reload()
            instead = f"using step {used} instead" if result else "no intact one is left"
            plural = "s" if len(damaged) > 1 else ""
            moved = "; ".join(f"step {s} ({why}) moved to {where}" for s, why, where in damaged)
            log.warning(f"damaged checkpoint{plural} in {self.directory}: {moved}; {instead}")
        return result

    def _move_aside(self, step: int) -> str:
        base = os.path.join(self.directory, DAMAGED, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        names = itertools.chain([base], (f"{base}-{i}" for i in itertools.count(1)))
        target = next(name for name in names if not os.path.exists(name))
        if self.primary:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(self.step_dir(step), target)
        return target

    def close(self) -> None:
        self._manager.close()
