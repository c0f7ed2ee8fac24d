"""What a run directory holds (its records and its stores), and where one may be: never inside
another run's store, which would take it for a damaged checkpoint or show its curves as its own."""

from __future__ import annotations

import errno
import fnmatch
import os
import tempfile
from collections.abc import Sequence

from metalearn.config import GLOB_CHARACTERS
from metalearn.config.compose import quoted_override
from metalearn.data.sources import file_in_the_way

# What a run directory holds. Its records, by name (never replaced by a tool's output):
RUN_RECORDS = (
    "config.yaml",
    "eval.json",
    "eval_*.json",
    "metrics.jsonl",
    "metrics.jsonl.unreadable",
    "summary.json",
    "summary.json.unreadable",
    "status.json",
    "train.log",
    "error.txt",
)
CHECKPOINT_STORES = ("checkpoints", "best")  # a run's checkpoint stores, under its directory
# What a run keeps in its other subdirectories, which another run written inside would mix with.
OTHER_PARTS_OF_A_RUN = {
    "tensorboard": "its TensorBoard logs would show this run's curves as its own",
    ".hydra": "that run's record of its command line is kept there",
}
RUN_STORES = (*CHECKPOINT_STORES, *OTHER_PARTS_OF_A_RUN)  # every subdirectory a run writes
RUN_MARKS = ("config.yaml", ".hydra", "checkpoints", "metrics.jsonl", "eval.json")
RECORD = "config.json"  # under checkpoints/: the record of the run's config


class RunDirectoryError(ValueError):
    """The run directory holds a run this config must not continue, or lies where none may be."""


def check_writable(directory: str) -> None:
    """Fail early, with the path in the message, if outputs cannot be written there."""
    if any(c in directory for c in GLOB_CHARACTERS):
        raise ValueError(
            f"output directory {directory!r} contains one of {GLOB_CHARACTERS}: checkpoints "
            "saved under it cannot be restored (orbax finds their pieces with glob); choose "
            "another hydra.run.dir or hydra.sweep.dir"
        )
    try:
        os.makedirs(directory, exist_ok=True)
        # A name of its own: the processes of a distributed run check the same directory at once.
        descriptor, probe = tempfile.mkstemp(prefix=".write_test.", dir=directory)
        os.close(descriptor)
        os.remove(probe)
    except OSError as err:
        existing = file_in_the_way(directory)
        if existing is not None:  # "File exists" / "Not a directory" said less
            raise ValueError(
                f"output directory {directory!r}: {existing} is a file, not a directory; choose "
                "another hydra.run.dir or hydra.sweep.dir"
            ) from None
        raise ValueError(
            f"output directory {directory!r} cannot be written ({err.strerror}); choose another "
            "hydra.run.dir or hydra.sweep.dir, in a place you can write to"
        ) from None


def holds_a_run(directory: str) -> bool:
    """Whether ``directory`` holds a run (its config, Hydra files, checkpoints or records)."""
    return any(os.path.exists(os.path.join(directory, mark)) for mark in RUN_MARKS)


def run_record(path: str | os.PathLike, allowed: Sequence[str] = ()) -> str | None:
    """What ``path`` is when it is an existing file of a run or sweep not matching ``allowed``.

    >>> run_record("/nonexistent/eval.json") is None
    True
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        return None
    name, directory = os.path.basename(path), os.path.dirname(path)
    if name == "multirun.yaml":
        return "a sweep's record of its jobs (multirun.yaml)"
    if any(fnmatch.fnmatch(name, pattern) for pattern in allowed):
        return None
    if any(fnmatch.fnmatch(name, p) for p in RUN_RECORDS) and holds_a_run(directory):
        return f"a run's own record ({name})"
    parts = path.split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in RUN_STORES and holds_a_run(os.sep.join(parts[:i]) or os.sep):
            return f"inside the run {os.sep.join(parts[:i])}'s {part}/"
    return None


def saved_steps(workdir: str) -> list[int]:
    """Steps of the checkpoints (``checkpoints/`` and ``best/``) in a run directory."""
    stores = [os.path.join(workdir, store) for store in CHECKPOINT_STORES]
    return sorted(int(n) for s in stores if os.path.isdir(s) for n in os.listdir(s) if n.isdigit())


def resume_hint(workdir: str, sweep_dir: str | None = None) -> str:
    """What to rerun to resume the run in ``workdir``, or the sweep in ``sweep_dir``."""
    if sweep_dir is not None:
        override = quoted_override("hydra.sweep.dir", os.path.abspath(sweep_dir))
        return f"rerun the same sweep command with {override} to resume its jobs"
    return f"rerun the same command with {quoted_override('hydra.run.dir', workdir)} to resume"


def no_space_message(err: BaseException, workdir: str, hint: str) -> str | None:
    """One line when ``err``, or an exception in its chain, is a full disk (ENOSPC: orbax and
    TensorBoard wrap it from their own threads); else None. ``hint``: what to rerun.

    >>> no_space_message(RuntimeError("save failed: [Errno 28] No space left on device"), "R",
    ...                  resume_hint("R"))
    'no space left on the device that holds R (save failed: [Errno 28] No space left on device); free space there, then rerun the same command with hydra.run.dir=R to resume (from the last checkpoint: checkpoints are saved whole or not at all)'
    >>> no_space_message(ValueError("shapes do not match"), "R", "") is None
    True
    """  # noqa: E501
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e):
            reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            return (
                f"no space left on the device that holds {workdir} ({reason}); free space "
                f"there, then {hint} (from the last checkpoint: checkpoints are saved whole or "
                "not at all)"
            )
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


def enclosing_store(workdir: str) -> str | None:
    """The store of another run (one of RUN_STORES) that ``workdir`` is or lies inside, or None.

    >>> root = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(root, "checkpoints"))
    >>> open(os.path.join(root, "checkpoints", RECORD), "w").close()
    >>> store = os.path.join(root, "checkpoints")
    >>> enclosing_store(os.path.join(store, "30")) == store
    True
    >>> enclosing_store(os.path.join(root, "tensorboard", "b")) == os.path.join(root, "tensorboard")
    True
    >>> enclosing_store(os.path.join(root, "run2")) is None
    True
    """
    path = os.path.abspath(workdir)
    while (parent := os.path.dirname(path)) != path:
        name = os.path.basename(path)
        record = os.path.join(parent, "checkpoints", RECORD)
        if name in CHECKPOINT_STORES and os.path.isfile(record):
            return path
        if name in OTHER_PARTS_OF_A_RUN and holds_a_run(parent):
            return path
        path = parent
    return None


def check_outside_stores(directory: str, key: str = "hydra.run.dir") -> None:
    """RunDirectoryError if ``directory`` (set by ``key``) lies inside another run's store."""
    store = enclosing_store(directory)
    if store is not None:
        damaged = "that run would take this one for a damaged checkpoint and move it away"
        why = OTHER_PARTS_OF_A_RUN.get(os.path.basename(store), damaged)
        raise RunDirectoryError(
            f"{key}={directory} lies inside {store}, part of the run in "
            f"{os.path.dirname(store)}: {why}. Nothing was written. Choose a {key} outside "
            f"its {'/, '.join(RUN_STORES)}/"
        )
    if key == "hydra.run.dir" and os.path.isfile(os.path.join(directory, "multirun.yaml")):
        raise RunDirectoryError(
            f"{key}={directory} is a sweep's directory (multirun.yaml): a run there would be "
            f"taken for one of its jobs. Nothing was written. Choose another {key}"
        )
    held = [m for m in RUN_MARKS if os.path.exists(os.path.join(directory, m))]
    if key == "hydra.sweep.dir" and held:
        raise RunDirectoryError(
            f"{key}={directory} holds a run ({', '.join(held)}): the sweep's jobs would be "
            f"written inside it. Nothing was written. Choose another {key}"
        )


def check_layout(workdir: str) -> None:
    """RunDirectoryError if a record the run writes is a directory, or a store is a file."""
    files = [name for name in RUN_RECORDS if "*" not in name]
    wrong_kinds = [(n, os.path.isdir, "a directory", f"its {n} file") for n in files]
    wrong_kinds += [(n, os.path.isfile, "a file", f"its {n}/ directory") for n in RUN_STORES]
    for name, is_wrong_kind, what, where in wrong_kinds:
        path = os.path.join(workdir, name)
        if is_wrong_kind(path):
            raise RunDirectoryError(
                f"{path} is {what}, where the run keeps {where}. Nothing was changed. Move it "
                "away, or choose another hydra.run.dir"
            )
