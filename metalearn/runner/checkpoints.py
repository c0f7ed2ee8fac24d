"""Orbax checkpoints of the training state: written atomically, verified when loaded.

Orbax writes each checkpoint into a temporary directory and renames it into place when complete;
a process that dies mid-write leaves only a ``*.orbax-checkpoint-tmp-*`` directory, which orbax
never lists as a step and removes when the store is next opened (on the primary host). Then a
``checksums.sha256`` manifest (one ``sha256  relative/path`` line per file) is written into the
step directory. Loading verifies it: a checkpoint whose files were truncated, altered or deleted
is moved aside to ``damaged/<step>-<time>/`` (never deleted) and the next older intact one is
used; one that verifies but does not fit the config's parameters is refused with
:class:`CheckpointMismatchError` and left in place. A run directory has two stores:
``checkpoints/`` (the latest states, for resuming) and ``best/`` (the best on validation).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.tree_util import tree_leaves_with_path

PyTree = Any
MANIFEST = "checksums.sha256"
# Written into a store before its first save: from then on a step without a manifest is a save
# that did not finish (killed between orbax's rename and the manifest), not an older version's.
CHECKSUMMED = "checksummed"
DAMAGED = "damaged"
DRAIN_SECONDS = 30.0  # how long a failed restore's other reads may take to end
log = logging.getLogger("metalearn")


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
    path = os.path.join(directory, MANIFEST)
    with open(path + ".tmp", "w") as f:
        f.write(lines)
    os.replace(path + ".tmp", path)


class CheckpointMismatchError(ValueError):
    """An intact checkpoint whose parameters do not fit the config's (shape or structure)."""


# Orbax's words for a restore template that does not fit the saved tree (not a damaged file),
# and those of stored_mismatch, which finds it first from the checkpoint's metadata.
MISMATCH_MARKERS = (
    "tree structures do not match",
    "not compatible with the stored shape",
    "in this config",
)


def _names(path: tuple) -> tuple[str, ...]:
    """A pytree path as names, whatever kind of node held each entry (orbax stores NamedTuple
    fields as dict keys)."""
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def stored_mismatch(state_dir: str, template: PyTree) -> str | None:
    """How the arrays saved in ``state_dir`` differ from ``template``'s (an array only one of
    them has, or the first shape that differs), from the checkpoint's metadata alone, so that no
    read starts for a template that cannot fit; None if they fit or the metadata cannot be read
    (the restore then tells)."""
    try:
        metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(state_dir))
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
    """None if every file listed in the manifest is there unchanged, else what is wrong.
    Without a manifest: wrong if ``required``, else (an older version's) loading is the test."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return f"no {MANIFEST}: its save did not finish" if required else None
    expected = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                digest, rel = line.rstrip("\n").split("  ", 1)
                if len(digest) != 64:
                    raise ValueError(digest)
                expected[rel] = digest
    except (ValueError, UnicodeDecodeError):
        return f"{MANIFEST} is unreadable"
    actual = file_digests(directory)
    for rel, digest in expected.items():
        if rel not in actual:
            return f"{rel} is missing"
        if actual[rel] != digest:
            return f"{rel} fails its checksum"
    return None


def _sync_hosts(tag: str) -> None:
    """Wait for every host of a multi-host run (no-op on one host); ``tag`` names the point."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(tag)


class _DrainingLoop(asyncio.SelectorEventLoop):
    """An event loop that, when closed, first lets the tasks still pending on it end.

    Orbax closes a restore's loop as soon as its first read fails, the others pending; each of
    those still calls the loop as it ends, even cancelled ("Event loop is closed" once closed).
    Those pending after DRAIN_SECONDS are cancelled. Their failures are the restore's, which the
    first reported: they are not printed as "Task exception was never retrieved".
    """

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


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _DrainingLoop()


@contextlib.contextmanager
def _draining_event_loops() -> Iterator[None]:
    """Event loops made meanwhile (by orbax, in any thread) drain their pending tasks on close
    (through asyncio's policy: deprecated from Python 3.14, in effect up to 3.16)."""
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_DrainingPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


def intact_steps(directory: str) -> list[int]:
    """The steps of the store in ``directory`` whose checksums verify, newest first (a store
    need not be open: nothing is moved; an unfinished save's directory is no step)."""
    if not os.path.isdir(directory):
        return []
    required = os.path.exists(os.path.join(directory, CHECKSUMMED))
    steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True)
    return [s for s in steps if verify(os.path.join(directory, str(s)), required) is None]


def newest_intact_step(directory: str) -> int | None:
    """The newest step of the store in ``directory`` whose checksums verify, or None."""
    return next(iter(intact_steps(directory)), None)


class CheckpointStore:
    """Save and restore ``(state pytree, JSON metadata)`` pairs under one directory."""

    def __init__(self, directory: str, max_to_keep: int, primary: bool = True):
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
        if self.primary and not self._checksummed():
            with open(os.path.join(self.directory, CHECKSUMMED), "w") as f:
                f.write("every checkpoint here has a checksums.sha256 manifest\n")
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
        # Orbax returns NamedTuples (optax states, TrainState) as plain containers: re-impose
        # the template's tree structure on the restored leaves.
        treedef = jax.tree_util.tree_structure(template)
        state = jax.tree_util.tree_unflatten(treedef, jax.tree_util.tree_leaves(restored["state"]))
        return state, dict(restored["metadata"])

    def _checksummed(self) -> bool:
        return os.path.exists(os.path.join(self.directory, CHECKSUMMED))

    def newest_intact_step(self) -> int | None:
        """The newest step whose checksums verify (nothing is moved)."""
        return newest_intact_step(self.directory)

    def restore_intact(self, template: PyTree) -> tuple[PyTree, dict] | None:
        """The newest checkpoint that verifies and loads (None if none does); damaged newer ones
        are moved aside, named in one warning line with where they went."""
        damaged, result, used = [], None, None
        for step in sorted(self._manager.all_steps(), reverse=True):
            problem = verify(self.step_dir(step), self._checksummed())
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
            log.warning(
                "damaged checkpoint%s in %s: %s; %s",
                "s" if len(damaged) > 1 else "",
                self.directory,
                "; ".join(f"step {s} ({why}) moved to {where}" for s, why, where in damaged),
                instead,
            )
        return result

    def _move_aside(self, step: int) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = os.path.join(self.directory, DAMAGED, f"{step}-{stamp}")
        suffix = 1
        while os.path.exists(target):
            target = os.path.join(self.directory, DAMAGED, f"{step}-{stamp}-{suffix}")
            suffix += 1
        if self.primary:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(self.step_dir(step), target)
        return target

    def close(self) -> None:
        self._manager.close()
