"""One run per directory: a rerun may resume it, never silently mix another config into it.

A :class:`RunDirectory` is opened once per process, before anything is written in it: it takes
the directory's lock, refuses a path inside another run, files or directories of the wrong kind
where the run writes, and a config that differs from the one the directory's run was trained
with (unless each differing key is listed in ``trainer.allow_changes``, e.g.
``[trainer.meta_steps]`` to train longer). The run's record (``config.yaml``, the ``.hydra/``
files the command line gave, and ``checkpoints/config.json``: the flattened config, its sha256
fingerprint and the history of allowed changes) describes the checkpoints: a new directory gets
it once the run's parts are built; a rerun's replaces it only as its first checkpoint is saved
(or, with nothing left to train, as it ends), so a rerun refused or interrupted before then
leaves the directory as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

from metalearn.config import Config
from metalearn.errors import one_line
from metalearn.runner.layout import (
    RECORD,
    RunDirectoryError,
    check_layout,
    check_outside_stores,
    check_writable,
    resume_hint,
    saved_steps,
)

log = logging.getLogger("metalearn")

HYDRA_COPY = "hydra"  # under checkpoints/: a copy of the .hydra/ files, read if the others fail
LOCK = ".lock"  # held (flock) by the process that trains in the directory
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


class RunDirectory:
    """The directory of one run: ``open()`` it (once per process, before anything is written),
    then :meth:`record` the run when the record is due (:attr:`new`: at once; otherwise as the
    first checkpoint is saved, or the run ends).

    ``files``: the run's record files other than ``checkpoints/config.json``, by path relative
    to the directory (``config.yaml``, ``.hydra/overrides.yaml``, ...; the command line's
    composed config and Hydra's record of it); default, ``config.yaml`` written from ``config``.
    ``sweep_dir``: the directory of the sweep this run is a job of, for the resume hint.
    ``primary``: whether this process writes (the first of a multi-host run).
    """

    def __init__(
        self,
        path: str,
        config: Config,
        files: Mapping[str, str] | None = None,
        sweep_dir: str | None = None,
        primary: bool = True,
    ):
        self.path, self.config, self.sweep_dir, self.primary = path, config, sweep_dir, primary
        self.files = dict(files) if files is not None else {"config.yaml": config_yaml(config)}
        self.changes: dict[str, tuple[Any, Any]] = {}
        self.new = True  # nothing saved yet: the record is due at once
        self._recorded = False

    @contextlib.contextmanager
    def open(self) -> Iterator[RunDirectory]:
        """Hold the directory (:func:`run_directory_held`, on the primary host) and check it
        (:func:`check_rerun`): RunDirectoryError, one line, before anything is written."""
        check_writable(self.path)
        fresh = _outputs(self.path)[0] is None
        if fresh:  # no run to race on: a bad config is refused before the lock file is written
            self.changes = check_rerun(self.config, self.path)
        with run_directory_held(self.path) if self.primary else contextlib.nullcontext():
            self.new = _outputs(self.path)[0] is None
            if not (fresh and self.new):  # a run here, or one saved in the meantime
                self.changes = check_rerun(self.config, self.path)
            if self.changes:
                log.warning(
                    "resuming with changed settings (allowed by trainer.allow_changes): %s",
                    ", ".join(f"{k} {a} -> {b}" for k, (a, b) in self.changes.items()),
                )
            yield self

    def record(self) -> None:
        """Write the run's record (once per process; the primary host only)."""
        if self._recorded or not self.primary:
            return
        self._recorded = True
        for relative, text in self.files.items():
            write_atomically(os.path.join(self.path, relative), text)
            if relative.startswith(".hydra/"):  # a second copy, kept with the checkpoints
                copy = os.path.join(self.path, "checkpoints", HYDRA_COPY, relative[7:])
                write_atomically(copy, text)
        write_record(self.config, self.path, self.changes)

    def resume_hint(self) -> str:
        return resume_hint(self.path, self.sweep_dir)


def config_yaml(config: Config) -> str:
    """``config`` as the YAML of a ``config.yaml`` (what ``metalearn.evaluate`` reads back)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (one temporary file per process)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


@contextlib.contextmanager
def run_directory_held(workdir: str) -> Iterator[None]:
    """Hold ``workdir/.lock`` while this process trains there: a second process that starts in
    the same directory meanwhile (another seed, or the same command twice) is refused with
    RunDirectoryError, before it writes anything. The two had trained side by side,
    deleting each other's checkpoints, and the last to finish wrote the directory's records.

    The lock is the kernel's (``flock``): released when the process ends, however it ends
    (``kill -9``, the OOM killer), so a stale lock never blocks a resume. Where the filesystem
    has no locks, the run goes on unprotected, with a warning.
    """
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(os.path.join(workdir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirectoryError(
            f"{workdir} is in use: {holder} is training there. Nothing was changed. Wait for it "
            "to finish (then rerun to resume or extend it), or choose another hydra.run.dir"
        ) from None
    except OSError as err:  # no locks on this filesystem
        os.close(fd)
        log.warning(
            "cannot lock %s (%s): nothing stops a second process training there meanwhile",
            workdir,
            err.strerror,
        )
        yield
        return
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()} (since {started})".encode())
    try:
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it races with a next taker)


def flat_config(cfg: Config) -> dict[str, Any]:
    """The config as ``{"dotted.key": value}``, JSON values, without the IGNORED keys.

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


def _outputs(workdir: str) -> tuple[str | None, bool]:
    """What ``workdir`` holds of a run's outputs, in words (None when nothing: a fresh start
    cannot mix anything), and whether that is a checkpoint or an evaluation."""
    steps = saved_steps(workdir)
    if steps:
        return f"checkpoints up to step {max(steps)}", True
    if os.path.exists(os.path.join(workdir, "eval.json")):
        return "a finished evaluation", True
    evaluations = sorted(fnmatch.filter(os.listdir(workdir), "eval_*.json"))
    if evaluations:  # metalearn.evaluate's, of a run whose other files are gone
        return evaluations[0], True
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        return "metrics.jsonl, stopped before its first checkpoint", False
    return None, False


def _read_record(path: str) -> dict[str, Any]:
    """The ``checkpoints/config.json`` record at ``path``; ValueError if it is not one."""
    with open(path) as f:
        record = json.load(f)  # json.JSONDecodeError is a ValueError
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)):
        raise ValueError("not a config record")
    return record


def _stored_config(workdir: str) -> dict[str, Any] | None:
    """The flattened config of the run in ``workdir``: from its record, else from the copy of
    Hydra's config older versions kept with the checkpoints, else from ``config.yaml``. None
    when the directory holds none of them; RunDirectoryError when it holds some and none can be
    read, since a run whose config is unknown must not be resumed by another config."""
    from omegaconf import OmegaConf

    from metalearn.config import to_objects

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


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every key whose value differs (absent counts as None)."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def check_rerun(cfg: Config, workdir: str) -> dict[str, tuple[Any, Any]]:
    """Raise RunDirectoryError if ``cfg`` must not run in ``workdir``; return allowed changes."""
    check_outside_stores(workdir)
    check_layout(workdir)
    new = flat_config(cfg)
    held, saved = _outputs(workdir)
    if held is None:
        check_allowed_changes(cfg.trainer.allow_changes, new)
        return {}  # nothing saved yet: a fresh start cannot mix anything
    steps = saved_steps(workdir)
    if not cfg.trainer.resume and saved:
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
    # Keys of changes already allowed count too: the run goes on with the same command line,
    # whose allow_changes may name a removed key.
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


def write_record(cfg: Config, workdir: str, changed: dict[str, tuple[Any, Any]]) -> None:
    """Store ``cfg`` with the checkpoints (``checkpoints/config.json``), noting allowed
    changes in its history."""
    path = os.path.join(workdir, "checkpoints", RECORD)
    history = []
    if os.path.exists(path):
        with contextlib.suppress(OSError, ValueError):  # a damaged record: its history is lost
            history = list(_read_record(path).get("changes", []))
        if changed:
            steps = saved_steps(workdir)
            history.append({"from_step": max(steps) if steps else 0, "changed": changed})
    flat = flat_config(cfg)
    record = {"fingerprint": fingerprint(flat), "config": flat, "changes": history}
    write_atomically(path, json.dumps(record, indent=1))
