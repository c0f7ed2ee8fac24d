"""One run per directory: a rerun may resume it, never silently mix another config into it.

The resolved config of a run is stored with its checkpoints (``checkpoints/config.json``: the
flattened config, its sha256 fingerprint and the history of allowed changes), with a copy of
Hydra's ``.hydra/`` files. Before a rerun in the same directory writes anything, its config is
compared with the stored one: a difference is refused in one line naming the keys, unless each
differing key is listed in ``trainer.allow_changes`` (e.g. ``[trainer.meta_steps]`` to train
longer). ``trainer.resume=false`` in a directory that holds a run is refused too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from metalearn.config import Config, to_objects
from metalearn.config_errors import quoted_override
from metalearn.data.sources import one_line
from metalearn.tools import (
    CHECKPOINT_STORES,
    OTHER_PARTS_OF_A_RUN,
    RUN_MARKS,
    RUN_RECORDS,
    RUN_STORES,
    holds_a_run,
)

RECORD = "config.json"  # under checkpoints/
HYDRA_COPY = "hydra"  # under checkpoints/: the .hydra/ files of the run the record describes
# Keys that change how a run is shown or kept, never what it computes.
IGNORED = (
    "name",
    "run_name",
    "trainer.resume",
    "trainer.compilation_cache",
    "trainer.progress_bar",
    "trainer.allow_changes",
    "trainer.keep_checkpoints",
    "distributed",
)


class RunDirectoryError(ValueError):
    """The run directory holds a run that this config must not continue or replace."""


LOCK = ".lock"  # held (flock) by the process that trains in the directory
_held_locks: dict[str, int] = {}  # real path of a run directory -> descriptor, in this process


@contextlib.contextmanager
def run_directory_held(workdir: str) -> Iterator[None]:
    """Hold ``workdir/.lock`` while this process trains there: a second process that starts in
    the same directory meanwhile (another seed, or the same command twice) is refused with
    RunDirectoryError, before it writes anything. The two had trained side by side,
    deleting each other's checkpoints, and the last to finish wrote the directory's records.

    The lock is the kernel's (``flock``): released when the process ends, however it ends
    (``kill -9``, the OOM killer), so a stale lock never blocks a resume. Re-entrant within a
    process. Where the filesystem has no locks, the run goes on unprotected, with a warning.
    """
    key = os.path.realpath(workdir)
    if key in _held_locks:
        yield
        return
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(os.path.join(workdir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        message = _in_use_message(workdir, fd)
        os.close(fd)
        restore_hydra_files(workdir)  # Hydra rewrote .hydra/ with this command line
        raise RunDirectoryError(message) from None
    except OSError as err:  # no locks on this filesystem
        os.close(fd)
        logging.getLogger("metalearn").warning(
            "cannot lock %s (%s): nothing stops a second process training there meanwhile",
            workdir,
            err.strerror,
        )
        yield
        return
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()} (since {started})".encode())
    _held_locks[key] = fd
    try:
        yield
    finally:
        del _held_locks[key]
        os.close(fd)  # releases the lock; the file stays (removing it races with a next taker)


def flat_config(cfg: Config) -> dict[str, Any]:
    """The config as ``{"dotted.key": value}``, JSON values, without the IGNORED keys.

    >>> from metalearn.config import OptimizerConfig
    >>> flat = flat_config(Config(algorithm={}, model={}, data={}))
    >>> flat["trainer.meta_steps"], "trainer.resume" in flat, "run_name" in flat
    (70000, False, False)
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif not _matches(prefix, IGNORED):
            flat[prefix] = value

    walk("", json.loads(json.dumps(dataclasses.asdict(cfg))))
    return flat


def fingerprint(flat: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()


def _matches(key: str, patterns) -> bool:
    return any(key == p or key.startswith(p + ".") for p in patterns)


def _names(*flats: dict[str, Any]) -> list[str]:
    """Every key of the flat configs ``flats`` and each section above it, and the IGNORED keys.

    >>> {"trainer", "trainer.meta_steps"} <= set(_names({"trainer.meta_steps": 4}))
    True
    """
    names = set(IGNORED)
    for key in (k for flat in flats for k in flat):
        parts = key.split(".")
        names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(names)


def check_allowed_changes(allowed: list[str], *flats: dict[str, Any]) -> None:
    """RunDirectoryError unless each entry of ``trainer.allow_changes`` names a setting or
    section of one of the flat configs ``flats`` (the new one, and the stored one of a rerun):
    a misspelt entry allowed nothing, silently."""
    names = _names(*flats)
    for entry in allowed:
        if entry not in names:
            close = difflib.get_close_matches(str(entry), names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise RunDirectoryError(
                f"trainer.allow_changes: {entry!r} is not a setting or section of the config; "
                f"name each as a refusal to resume names them (e.g. [trainer.meta_steps,eval])"
                f"{hint}"
            )


def saved_steps(workdir: str) -> list[int]:
    """Steps of the checkpoints (``checkpoints/`` and ``best/``) in a run directory."""
    steps = []
    for store in ("checkpoints", "best"):
        path = os.path.join(workdir, store)
        if os.path.isdir(path):
            steps += [int(n) for n in os.listdir(path) if n.isdigit()]
    return sorted(steps)


def _read_record(path: str) -> dict[str, Any]:
    """The ``checkpoints/config.json`` record at ``path``; ValueError if it is not one."""
    with open(path) as f:
        record = json.load(f)  # json.JSONDecodeError is a ValueError
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)):
        raise ValueError("not a config record")
    return record


def _stored_config(workdir: str) -> dict[str, Any] | None:
    """The flattened config of the run in ``workdir``: from its record, else from the copy of
    Hydra's config kept with the checkpoints, else from ``config.yaml`` (a run saved before
    records existed). None when the directory holds none of them; RunDirectoryError when it
    holds some and none can be read, since a run whose config is unknown must not be resumed
    by another config."""
    record = os.path.join(workdir, "checkpoints", RECORD)
    copies = [
        os.path.join(workdir, "checkpoints", HYDRA_COPY, "config.yaml"),
        os.path.join(workdir, "config.yaml"),
    ]
    problems = []
    if os.path.exists(record):
        try:
            return _read_record(record)["config"]
        except (OSError, ValueError) as err:
            problems.append(f"{record} ({one_line(err)})")
    for path in copies:
        if not os.path.exists(path):
            continue
        try:
            return flat_config(to_objects(OmegaConf.load(path)))
        except Exception as err:  # unreadable or not a config: try the next copy
            problems.append(f"{path} ({one_line(err)})")
    if not problems:
        return None
    raise RunDirectoryError(
        f"{workdir} holds a run but its config cannot be read: {'; '.join(problems)}. Nothing "
        "was changed. Restore one of these files from a copy to resume it, or choose a new "
        "hydra.run.dir"
    )


def _recorded_changes(workdir: str) -> dict[str, None]:
    """The keys of the changes ``checkpoints/config.json`` records as allowed (none when it is
    missing or unreadable)."""
    try:
        history = _read_record(os.path.join(workdir, "checkpoints", RECORD)).get("changes", [])
        return {key: None for entry in history for key in entry["changed"]}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def resume_hint(workdir: str) -> str:
    """What to rerun to resume the run in ``workdir``: the same command with its directory, or,
    for a job of a Hydra sweep (``-m``), the same sweep command with the sweep's directory
    (each job resumes from its last checkpoint; a finished job is not trained again)."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep_dir = os.path.abspath(str(HydraConfig.get().sweep.dir))
        return (
            f"rerun the same sweep command with {quoted_override('hydra.sweep.dir', sweep_dir)} "
            "to resume its jobs"
        )
    return f"rerun the same command with {quoted_override('hydra.run.dir', workdir)} to resume"


def no_space_message(err: BaseException, workdir: str) -> str | None:
    """One line when ``err`` (or an exception it was raised from or while handling) is a full
    disk, ENOSPC; else None. Orbax and TensorBoard report it from their own threads, wrapped.

    >>> no_space_message(RuntimeError("save failed: [Errno 28] No space left on device"), "R")
    'no space left on the device that holds R (save failed: [Errno 28] No space left on device); free space there, then rerun the same command with hydra.run.dir=R to resume (from the last checkpoint: checkpoints are saved whole or not at all)'
    >>> no_space_message(ValueError("shapes do not match"), "R") is None
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
                f"there, then {resume_hint(workdir)} (from the last checkpoint: checkpoints "
                "are saved whole or not at all)"
            )
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every key whose value differs (absent counts as None)."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def enclosing_store(workdir: str) -> str | None:
    """The checkpoint store (``checkpoints/`` or ``best/``), ``tensorboard/`` or ``.hydra/`` of
    another run that ``workdir`` is or lies inside, or None. That run would take ``workdir``
    for a damaged checkpoint of its own and move it away, or mix it into its own records.

    >>> import tempfile
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
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return None
        name = os.path.basename(path)
        record = os.path.join(parent, "checkpoints", RECORD)
        if name in CHECKPOINT_STORES and os.path.isfile(record):
            return path
        if name in OTHER_PARTS_OF_A_RUN and holds_a_run(parent):
            return path
        path = parent


def check_outside_stores(directory: str, key: str = "hydra.run.dir") -> None:
    """Raise RunDirectoryError if ``directory`` (set by ``key``) is or lies inside another
    run's checkpoint store, ``tensorboard/`` or ``.hydra/`` (:func:`enclosing_store`)."""
    store = enclosing_store(directory)
    if store is not None:
        name = os.path.basename(store)
        why = OTHER_PARTS_OF_A_RUN.get(
            name, "that run would take this one for a damaged checkpoint and move it away"
        )
        parts = "/, ".join(RUN_STORES)
        raise RunDirectoryError(
            f"{key}={directory} lies inside {store}, part of the run in "
            f"{os.path.dirname(store)}: {why}. Nothing was written. Choose a {key} outside "
            f"its {parts}/"
        )
    # A run in a sweep's directory was tabulated by collect_sweep as one of its jobs; a sweep
    # in a run's directory put its jobs inside the run.
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
    """RunDirectoryError if a file the run writes in ``workdir`` (``eval.json``,
    ``metrics.jsonl``, ...) is a directory there, or a directory it writes (``checkpoints/``,
    ``best/``, ``tensorboard/``) is a file: the run failed with a traceback where it first
    wrote there (for ``eval.json``, after the whole evaluation)."""
    files = [name for name in RUN_RECORDS if "*" not in name]
    directories = [name for name in RUN_STORES if name != ".hydra"]  # Hydra's own, written first
    wrong_kinds = [(n, os.path.isdir, "a directory", f"its {n} file") for n in files]
    wrong_kinds += [(n, os.path.isfile, "a file", f"its {n}/ directory") for n in directories]
    for name, is_wrong_kind, what, where in wrong_kinds:
        path = os.path.join(workdir, name)
        if is_wrong_kind(path):
            raise RunDirectoryError(
                f"{path} is {what}, where the run keeps {where}. Nothing was changed. Move it "
                "away, or choose another hydra.run.dir"
            )


def check_rerun(cfg: Config, workdir: str) -> dict[str, tuple[Any, Any]]:
    """Raise RunDirectoryError if ``cfg`` must not run in ``workdir``; return allowed changes."""
    check_outside_stores(workdir)
    check_layout(workdir)
    new = flat_config(cfg)
    steps = saved_steps(workdir)
    evaluated = os.path.exists(os.path.join(workdir, "eval.json"))
    metrics = os.path.join(workdir, "metrics.jsonl")
    logged = os.path.exists(metrics) and os.path.getsize(metrics) > 0
    if not (steps or evaluated or logged):
        check_allowed_changes(cfg.trainer.allow_changes, new)
        return {}  # nothing saved yet: a fresh start cannot mix anything
    if steps:
        held = f"checkpoints up to step {max(steps)}"
    elif evaluated:
        held = "a finished evaluation"
    else:
        held = "metrics.jsonl, stopped before its first checkpoint"
    if not cfg.trainer.resume and (steps or evaluated):
        raise RunDirectoryError(
            f"{workdir} already holds a run ({held}) and trainer.resume=false would mix a new "
            f"run into it: choose a new hydra.run.dir, or drop trainer.resume=false to resume"
        )
    if steps and cfg.trainer.meta_steps < max(steps):
        raise RunDirectoryError(
            f"{workdir} holds checkpoints up to step {max(steps)}, beyond "
            f"trainer.meta_steps={cfg.trainer.meta_steps}: a run cannot be shortened. Nothing "
            f"was changed. Evaluate an earlier point of it from its metrics, or choose a new "
            f"hydra.run.dir"
        )
    stored = _stored_config(workdir)
    if stored is None:
        raise RunDirectoryError(
            f"{workdir} holds run outputs ({held}) but no record of their config (config.yaml, "
            f"checkpoints/{RECORD}): a run here would mix with them. Nothing was changed. "
            "Choose a new hydra.run.dir, or move those files away"
        )
    # Keys of changes already allowed count too: the run (and this check, again when training
    # starts) goes on with the same command line, whose allow_changes may name a removed key.
    check_allowed_changes(cfg.trainer.allow_changes, new, stored, _recorded_changes(workdir))
    changed = differences(stored, new)
    refused = {k: v for k, v in changed.items() if not _matches(k, cfg.trainer.allow_changes)}
    other_kind = [k for k in ("data.name", "model.name") if k in refused]
    if other_kind:  # other data or model: allowing every other key would not make it resume
        shown = ", ".join(
            f"{k} {_show(refused[k][0])} -> {_show(refused[k][1])}" for k in other_kind
        )
        raise RunDirectoryError(
            f"{workdir} holds a run of another experiment ({held}; {shown}). Nothing was "
            "changed. Choose a new hydra.run.dir"
        )
    if refused:
        items = list(refused.items())[:5]
        shown = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in items)
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        keys = ",".join(refused)
        raise RunDirectoryError(
            f"{workdir} holds a run ({held}) with a different config: {shown}{more}. Nothing "
            f"was changed. Rerun with its settings to resume, choose a new hydra.run.dir, or "
            f"accept the change with 'trainer.allow_changes=[{keys}]'"
        )
    return changed


def _show(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)


def record_config(cfg: Config, workdir: str, changed: dict[str, tuple[Any, Any]]) -> None:
    """Store ``cfg`` (and Hydra's files) with the checkpoints, noting allowed changes."""
    directory = os.path.join(workdir, "checkpoints")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, RECORD)
    history = []
    if os.path.exists(path):
        with contextlib.suppress(OSError, ValueError):  # a damaged record: its history is lost
            history = list(_read_record(path).get("changes", []))
        if changed:
            steps = saved_steps(workdir)
            history.append({"from_step": max(steps) if steps else 0, "changed": changed})
    flat = flat_config(cfg)
    record = {"fingerprint": fingerprint(flat), "config": flat, "changes": history}
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    hydra_dir = os.path.join(workdir, ".hydra")
    if os.path.isdir(hydra_dir):
        shutil.copytree(hydra_dir, os.path.join(directory, HYDRA_COPY), dirs_exist_ok=True)


@dataclasses.dataclass
class RunEnding:
    """How the code inside :func:`record_kept_unless_trained` ended, beyond an exception."""

    interrupted: bool = False  # a signal stopped it (it returned, saying what was saved)


@contextlib.contextmanager
def record_kept_unless_trained(workdir: str) -> Iterator[RunEnding]:
    """Put the run's recorded config back if the code inside raises, or is interrupted
    (``ending.interrupted = True``), before saving a checkpoint.

    Hydra rewrites ``.hydra/`` with the command line before the task can check it, and the
    config of a rerun is recorded (``config.yaml``, ``checkpoints/config.json``, the Hydra
    files) before the checkpoint is restored and the experiment is built. If anything then
    refuses it before a new checkpoint is saved (an invalid value, another config,
    :class:`RunDirectoryError`; the restore finds other shapes,
    :class:`~metalearn.runner.checkpoints.CheckpointMismatchError`; a value an algorithm
    refuses, ``algorithm.inner_lr=-0.01`` allowed by ``trainer.allow_changes``), the record is
    put back as it was: it describes the checkpoints in the directory, and a rerun with the
    run's own settings resumes without ``trainer.allow_changes``. Once a checkpoint of the new
    config is saved, the new record stays.
    """
    files = [os.path.join(workdir, "config.yaml"), os.path.join(workdir, "checkpoints", RECORD)]
    saved = {}
    for path in files:
        if os.path.exists(path):
            with open(path, "rb") as f:
                saved[path] = f.read()
    steps_before = set(saved_steps(workdir))
    hydra_copy = os.path.join(workdir, "checkpoints", HYDRA_COPY)
    backup = tempfile.mkdtemp(prefix="metalearn-hydra-")
    if os.path.isdir(hydra_copy):
        shutil.copytree(hydra_copy, backup, dirs_exist_ok=True)

    def put_back_unless_trained() -> None:
        if set(saved_steps(workdir)) - steps_before:
            return
        for path, content in saved.items():
            with open(path + ".tmp", "wb") as f:
                f.write(content)
            os.replace(path + ".tmp", path)
        if os.path.isdir(hydra_copy):
            shutil.rmtree(hydra_copy)
            shutil.copytree(backup, hydra_copy)
            restore_hydra_files(workdir)

    ending = RunEnding()
    try:
        yield ending
        if ending.interrupted:  # e.g. while compiling, before the first new checkpoint
            put_back_unless_trained()
    except Exception:
        put_back_unless_trained()
        raise
    finally:
        shutil.rmtree(backup, ignore_errors=True)


def restore_hydra_files(workdir: str) -> None:
    """Put back the ``.hydra/`` files of the stored run (after Hydra overwrote them)."""
    saved = os.path.join(workdir, "checkpoints", HYDRA_COPY)
    if os.path.isdir(saved):
        shutil.copytree(saved, os.path.join(workdir, ".hydra"), dirs_exist_ok=True)


def _in_use_message(workdir: str, fd: int) -> str:
    holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
    return (
        f"{workdir} is in use: {holder} is training there. Nothing was changed. Wait for it "
        "to finish (then rerun to resume or extend it), or choose another hydra.run.dir"
    )


def check_not_in_use(workdir: str) -> None:
    """RunDirectoryError if a process holds ``workdir``'s lock (:func:`run_directory_held`);
    takes nothing."""
    try:
        fd = os.open(os.path.join(workdir, LOCK), os.O_RDONLY)
    except OSError:  # no lock file: never trained in, or not readable (the task will say)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunDirectoryError(_in_use_message(workdir, fd)) from None
    except OSError:
        pass
    finally:
        os.close(fd)


class RefuseInsideStores(Callback):
    """Hydra callback (the first): refuse a run or sweep directory inside another run's
    checkpoint store before anything creates it."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_refusal(check_outside_stores, str(config.hydra.sweep.dir), "hydra.sweep.dir")

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_refusal(check_outside_stores, str(config.hydra.run.dir))


class GuardRunDirectory(Callback):
    """Hydra callback: refuse a conflicting rerun before Hydra writes into the run directory.

    (Sweep jobs are checked by the task itself, which puts ``.hydra/`` back when it refuses.)
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        workdir = os.path.abspath(str(config.hydra.run.dir))
        if not os.path.isdir(workdir):
            return
        _exit_on_refusal(check_not_in_use, workdir)  # before Hydra rewrites its .hydra/
        job_keys = [key for key in config if key != "hydra"]  # to_objects refuses other keys
        try:
            cfg = to_objects(OmegaConf.masked_copy(config, job_keys))
        except Exception:  # an invalid config: the task reports it in its own words
            return
        _exit_on_refusal(check_rerun, cfg, workdir)


def _exit_on_refusal(check: Any, *args: Any) -> None:
    """Run ``check``; a RunDirectoryError ends the process in one ``error:`` line, exit 2."""
    try:
        check(*args)
    except RunDirectoryError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
